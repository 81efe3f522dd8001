//! The CPU f64 reference of the recurrence (docs/CONTRACT.md#the-recurrence).
//!
//! It is a direct transcription of the contract, in f64, parallel over (sequence, head):
//!
//! ```text
//! S = h0[n, h]  (zeros if absent)
//! for every chunk c of sequence n (rows r, L = len(r) <= 64):
//!     h[chunk_start + c, h] = bf16(S)
//!     Vn = u[r] - w[r] @ bf16(S)
//!     v_new[r] = bf16(Vn)
//!     S  = exp2(gk[last(r)])[:, None] * S + k[r]^T @ bf16(Vn)
//! ht[n, h] = S
//! ```
//!
//! `S` and `Vn` are rounded to bf16 before the two products, as the kernels do
//! (docs/CONTRACT.md#rounding-points), so the only difference between a correct kernel and this
//! reference is f32 against f64 accumulation; [`crate::precision`] says how large it may be.
//!
//! ```
//! use kda::{inputs, reference, Plan};
//! let p = inputs::random_problem(Plan::from_lengths(&[70, 0, 1]), 2, true, 1);
//! let out = reference::reference(&p).unwrap();
//! assert_eq!(out.h.len(), p.dims().h_len());
//! ```

use crate::{KdaError, Outputs, Problem, SeqDesc};
use half::bf16;
use kda_kernel::layout::{CHUNK, K_DIM, V_DIM};
use rayon::prelude::*;

/// Elements of one `[K, V]` state.
const STATE: usize = K_DIM * V_DIM;

/// The number type the recurrence accumulates in: f64 for the reference, f32 for the emulation
/// of a kernel's arithmetic ([`reference_f32`]).
trait Acc:
    Copy
    + Send
    + core::ops::AddAssign
    + core::ops::MulAssign
    + core::ops::Mul<Output = Self>
    + core::ops::Sub<Output = Self>
{
    const ZERO: Self;
    fn of_bf16(x: bf16) -> Self;
    fn of_f32(x: f32) -> Self;
    /// Rounds to the nearest bf16 the way the kernels do: to f32 first, then to bf16 with
    /// round-to-nearest-even (`cvt.rn.bf16.f32`).
    fn to_bf16(self) -> bf16;
    fn to_f32(self) -> f32;
    fn exp2(self) -> Self;
}

impl Acc for f64 {
    const ZERO: Self = 0.0;
    fn of_bf16(x: bf16) -> Self {
        x.to_f64()
    }
    fn of_f32(x: f32) -> Self {
        x.into()
    }
    fn to_bf16(self) -> bf16 {
        bf16::from_f32(self as f32)
    }
    fn to_f32(self) -> f32 {
        self as f32
    }
    fn exp2(self) -> Self {
        f64::exp2(self)
    }
}

impl Acc for f32 {
    const ZERO: Self = 0.0;
    fn of_bf16(x: bf16) -> Self {
        x.to_f32()
    }
    fn of_f32(x: f32) -> Self {
        x
    }
    fn to_bf16(self) -> bf16 {
        bf16::from_f32(self)
    }
    fn to_f32(self) -> f32 {
        self
    }
    fn exp2(self) -> Self {
        f32::exp2(self)
    }
}

/// The outputs of one (sequence, head) pair before they are scattered into the batch tensors.
struct ItemOut {
    /// `[NT_n, K, V]`: the state entering each chunk.
    h: Vec<bf16>,
    /// `[len_n, V]`: the corrected values.
    v_new: Vec<bf16>,
    /// `[K, V]`: the final state.
    ht: Vec<f32>,
}

/// Computes `h`, `v_new` and `ht` for `p` in f64.
///
/// Fails only when `p`'s tensors do not have the shapes its plan implies.
pub fn reference(p: &Problem) -> Result<Outputs, KdaError> {
    run::<f64>(p)
}

/// The same recurrence with every sum and the state in f32, as a kernel computes it (bf16
/// products, f32 accumulation; only the summation order differs).
///
/// Its error against [`reference()`] is the rounding floor of f32 arithmetic on a problem: the
/// recurrence rounds `S` and `Vn` to bf16 every chunk, so a last-bit difference of an f32 sum
/// sometimes flips a bf16 rounding, and on long sequences these flips add up. On the realistic
/// inputs ([`crate::inputs`]) this floor grows with the sequence length (about 4e-4 at 2048
/// tokens, 9e-4 at 8192 and 1.7e-3 at 32768), so no f32 kernel can be held to less than it:
/// [`crate::precision::bound`] takes it into account (docs/CONTRACT.md#precision).
pub fn reference_f32(p: &Problem) -> Result<Outputs, KdaError> {
    run::<f32>(p)
}

fn run<F: Acc>(p: &Problem) -> Result<Outputs, KdaError> {
    p.validate()?;
    let d = p.dims();
    let heads = p.heads;
    let items: Vec<(usize, usize)> = (0..d.seqs).flat_map(|n| (0..heads).map(move |h| (n, h))).collect();
    let results: Vec<ItemOut> = items.par_iter().map(|&(n, h)| item::<F>(p, &p.plan.seqs()[n], n, h)).collect();

    let mut out = Outputs {
        h: vec![bf16::ZERO; d.h_len()],
        v_new: vec![bf16::ZERO; d.value_len()],
        ht: vec![0.0; d.state_len()],
    };
    for (&(n, h), r) in items.iter().zip(results) {
        let seq = &p.plan.seqs()[n];
        for (c, state) in r.h.chunks_exact(STATE).enumerate() {
            let at = ((seq.chunk_start + c) * heads + h) * STATE;
            out.h[at..at + STATE].copy_from_slice(state);
        }
        for (i, row) in r.v_new.chunks_exact(V_DIM).enumerate() {
            let at = ((seq.token_start + i) * heads + h) * V_DIM;
            out.v_new[at..at + V_DIM].copy_from_slice(row);
        }
        let at = (n * heads + h) * STATE;
        out.ht[at..at + STATE].copy_from_slice(&r.ht);
    }
    Ok(out)
}

/// Runs the recurrence of sequence `n` (described by `seq`), head `h`.
fn item<F: Acc>(p: &Problem, seq: &SeqDesc, n: usize, h: usize) -> ItemOut {
    let at = Rows { token_start: seq.token_start, heads: p.heads, head: h };
    let mut s: Vec<F> = match &p.h0 {
        Some(h0) => h0[(n * p.heads + h) * STATE..][..STATE].iter().map(|&x| F::of_f32(x)).collect(),
        None => vec![F::ZERO; STATE],
    };
    let mut out = ItemOut {
        h: Vec::with_capacity(seq.chunks() * STATE),
        v_new: Vec::with_capacity(seq.len * V_DIM),
        ht: Vec::new(),
    };
    // 192 KiB in f64: on the heap, not on a rayon worker's stack.
    let (mut s_bf, mut vn_bf) = (vec![F::ZERO; STATE], vec![F::ZERO; CHUNK * V_DIM]);
    for c in 0..seq.chunks() {
        // The chunk's rows, 1 to CHUNK of them.
        let rows = c * CHUNK..seq.len.min((c + 1) * CHUNK);
        // h = bf16(S); the products see the same rounded state.
        for (dst, &x) in s_bf.iter_mut().zip(&s) {
            let b = x.to_bf16();
            out.h.push(b);
            *dst = F::of_bf16(b);
        }
        corrected_values(p, &at, rows.clone(), &s_bf, &mut vn_bf, &mut out.v_new);
        update_state(p, &at, rows, &vn_bf, &mut s);
    }
    out.ht = s.iter().map(|&x| x.to_f32()).collect();
    out
}

/// Where one (sequence, head)'s rows sit in the token tensors.
struct Rows {
    token_start: usize,
    heads: usize,
    head: usize,
}

impl Rows {
    /// Element offset of token `t`'s row (counted from the sequence's start) of a `[T, H, K]`
    /// tensor.
    fn key(&self, t: usize) -> usize {
        ((self.token_start + t) * self.heads + self.head) * K_DIM
    }

    /// The same for a `[T, H, V]` tensor.
    fn value(&self, t: usize) -> usize {
        ((self.token_start + t) * self.heads + self.head) * V_DIM
    }
}

/// `Vn = u - w @ bf16(S)` over the chunk's `rows`, rounded to bf16: appended to `v_new` and kept
/// in `vn_bf` (`[CHUNK][V]`, row `i` for the chunk's `i`-th token) for the state update.
fn corrected_values<F: Acc>(
    p: &Problem,
    at: &Rows,
    rows: std::ops::Range<usize>,
    s_bf: &[F],
    vn_bf: &mut [F],
    v_new: &mut Vec<bf16>,
) {
    for (i, t) in rows.enumerate() {
        let mut acc = [F::ZERO; V_DIM];
        for (kk, &wk) in p.w[at.key(t)..][..K_DIM].iter().enumerate() {
            let wk = F::of_bf16(wk);
            for (a, &sv) in acc.iter_mut().zip(&s_bf[kk * V_DIM..][..V_DIM]) {
                *a += wk * sv;
            }
        }
        for (v, (&uv, &a)) in p.u[at.value(t)..][..V_DIM].iter().zip(&acc).enumerate() {
            let b = (F::of_bf16(uv) - a).to_bf16();
            v_new.push(b);
            vn_bf[i * V_DIM + v] = F::of_bf16(b);
        }
    }
}

/// `S = exp2(gk[last]) * S + k^T @ bf16(Vn)` over the chunk's `rows` (`last` its last token).
fn update_state<F: Acc>(p: &Problem, at: &Rows, rows: std::ops::Range<usize>, vn_bf: &[F], s: &mut [F]) {
    let last = rows.end - 1;
    for (kk, &g) in p.gk[at.key(last)..][..K_DIM].iter().enumerate() {
        let decay = F::of_f32(g).exp2();
        let srow = &mut s[kk * V_DIM..][..V_DIM];
        for x in srow.iter_mut() {
            *x *= decay;
        }
        for (i, t) in rows.clone().enumerate() {
            let kv = F::of_bf16(p.k[at.key(t) + kk]);
            for (x, &vn) in srow.iter_mut().zip(&vn_bf[i * V_DIM..][..V_DIM]) {
                *x += kv * vn;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Plan, inputs};

    #[test]
    fn empty_sequences_pass_h0_through() {
        let p = inputs::random_problem(Plan::from_lengths(&[0, 3, 0]), 2, true, 3);
        let out = reference(&p).unwrap();
        let h0 = p.h0.as_ref().unwrap();
        for n in [0usize, 2] {
            let r = n * 2 * STATE..(n + 1) * 2 * STATE;
            assert_eq!(out.ht[r.clone()], h0[r]);
        }
        assert_ne!(out.ht[2 * STATE..4 * STATE], h0[2 * STATE..4 * STATE]);
    }

    #[test]
    fn without_h0_the_first_state_is_zero_and_v_new_is_u() {
        let p = inputs::random_problem(Plan::from_lengths(&[10]), 1, false, 4);
        let out = reference(&p).unwrap();
        assert!(out.h.iter().all(|x| x.to_f32() == 0.0));
        assert_eq!(out.v_new, p.u);
    }

    #[test]
    fn the_f32_emulation_is_close_but_not_equal_on_short_sequences() {
        let p = inputs::random_problem(Plan::from_lengths(&[200, 64]), 2, true, 6);
        let (exact, emulated) = (reference(&p).unwrap(), reference_f32(&p).unwrap());
        let e = crate::rel_error(&emulated.ht, &exact.ht);
        assert!(e > 0.0 && e < 3e-4, "f32 emulation error {e:e}");
    }

    #[test]
    fn bad_shapes_are_reported() {
        let mut p = inputs::random_problem(Plan::from_lengths(&[5]), 1, true, 5);
        p.u.pop();
        match reference(&p) {
            Err(KdaError::Shape { tensor: "u", .. }) => {}
            other => panic!("expected a shape error on u, got {other:?}"),
        }
    }
}
