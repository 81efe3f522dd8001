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

use crate::model::{ModelShape, ModelView};
use crate::{KdaError, Outputs, Problem};
use half::bf16;
use kda_kernel::layout::CHUNK;
use rayon::prelude::*;

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

/// The outputs of one (sequence, value head) pair before they are scattered into the batch
/// tensors.
struct ItemOut {
    /// `[NT_n, state]`: the state entering each chunk, in the problem's layout.
    h: Vec<bf16>,
    /// `[len_n, V]`: the corrected values.
    v_new: Vec<bf16>,
    /// `[state]`: the final state, in the problem's layout.
    ht: Vec<f32>,
}

/// Computes `h`, `v_new` and `ht` for `p` in f64.
///
/// Fails only when `p`'s tensors do not have the shapes its plan implies.
///
/// ```
/// use kda::{Plan, inputs, reference, rel_error};
/// // Two sequences (a partial chunk, a single token), 2 heads, from random initial states.
/// let p = inputs::try_random_problem(Plan::from_lengths(&[70, 1]), 2, true, 7)?;
/// let exact = reference::reference(&p)?;
/// assert_eq!(exact.ht.len(), 2 * 2 * 128 * 128); // [N, H, K, V]
/// // The same arithmetic in f32, as a GPU runs it, drifts from f64 only by rounding.
/// let f32_run = reference::reference_f32(&p)?;
/// assert!(rel_error(&f32_run.ht, &exact.ht) < 1e-5);
/// # Ok::<(), kda::KdaError>(())
/// ```
pub fn reference(p: &Problem) -> Result<Outputs, KdaError> {
    p.validate()?;
    run::<f64>(&p.model_view())
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
    p.validate()?;
    run::<f32>(&p.model_view())
}

/// The generalized recurrence (scalar and per-key gates, grouped value heads, any head sizes,
/// either state layout; docs/CONTRACT.md#the-generalized-recurrence) in f64. On a
/// [`Problem::model_view`] it computes exactly what [`reference()`] does.
pub fn model_reference(p: &ModelView<'_>) -> Result<Outputs, KdaError> {
    run::<f64>(p)
}

/// [`model_reference`] in f32 arithmetic: the rounding floor of an f32 kernel, as
/// [`reference_f32`].
pub fn model_reference_f32(p: &ModelView<'_>) -> Result<Outputs, KdaError> {
    run::<f32>(p)
}

fn run<F: Acc>(p: &ModelView<'_>) -> Result<Outputs, KdaError> {
    p.validate()?;
    let (s, plan) = (p.shape, p.plan);
    let hv = s.value_heads;
    let items: Vec<(usize, usize)> = (0..plan.num_seqs()).flat_map(|n| (0..hv).map(move |i| (n, i))).collect();
    let results: Vec<ItemOut> = items.par_iter().map(|&(n, i)| item::<F>(p, n, i)).collect();

    let [h_len, v_len, ht_len] = p.output_lens();
    let mut out = Outputs { h: vec![bf16::ZERO; h_len], v_new: vec![bf16::ZERO; v_len], ht: vec![0.0; ht_len] };
    let (state, vd) = (s.state_len(), s.value_dim);
    for (&(n, i), r) in items.iter().zip(results) {
        let seq = &plan.seqs()[n];
        for (c, chunk_state) in r.h.chunks_exact(state).enumerate() {
            let at = ((seq.chunk_start + c) * hv + i) * state;
            out.h[at..at + state].copy_from_slice(chunk_state);
        }
        for (t, row) in r.v_new.chunks_exact(vd).enumerate() {
            let at = ((seq.token_start + t) * hv + i) * vd;
            out.v_new[at..at + vd].copy_from_slice(row);
        }
        let at = (n * hv + i) * state;
        out.ht[at..at + state].copy_from_slice(&r.ht);
    }
    Ok(out)
}

/// Where one (sequence, value head)'s rows sit in the token tensors.
struct Rows {
    token_start: usize,
    shape: ModelShape,
    /// The value head.
    head: usize,
}

impl Rows {
    /// Element offset of token `t`'s row (counted from the sequence's start) of `k` (`[T, H, K]`,
    /// this value head's key head).
    fn key(&self, t: usize) -> usize {
        let s = &self.shape;
        ((self.token_start + t) * s.heads + s.key_head(self.head)) * s.key_dim
    }

    /// The same for `w` and `gk` (`[T, HV, K]`).
    fn weight(&self, t: usize) -> usize {
        ((self.token_start + t) * self.shape.value_heads + self.head) * self.shape.key_dim
    }

    /// The same for `u` and `v_new` (`[T, HV, V]`).
    fn value(&self, t: usize) -> usize {
        ((self.token_start + t) * self.shape.value_heads + self.head) * self.shape.value_dim
    }

    /// The same for `g` (`[T, HV]`).
    fn gate(&self, t: usize) -> usize {
        (self.token_start + t) * self.shape.value_heads + self.head
    }
}

/// Runs the recurrence of sequence `n`, value head `i`. The state is kept key-first (`[K][V]`)
/// and stored in the problem's layout.
fn item<F: Acc>(p: &ModelView<'_>, n: usize, i: usize) -> ItemOut {
    let (s, seq) = (p.shape, p.plan.seqs()[n]);
    let at = Rows { token_start: seq.token_start, shape: s, head: i };
    let (state, kd, vd) = (s.state_len(), s.key_dim, s.value_dim);
    let mut st = vec![F::ZERO; state];
    if let Some(h0) = p.h0 {
        let h0 = &h0[(n * s.value_heads + i) * state..][..state];
        for kk in 0..kd {
            for v in 0..vd {
                st[kk * vd + v] = F::of_f32(h0[s.state_index(kk, v)]);
            }
        }
    }
    let mut out = ItemOut {
        h: vec![bf16::ZERO; seq.chunks() * state],
        v_new: Vec::with_capacity(seq.len * vd),
        ht: vec![0.0; state],
    };
    // The rounded state and values: on the heap, not on a rayon worker's stack.
    let (mut s_bf, mut vn_bf) = (vec![F::ZERO; state], vec![F::ZERO; CHUNK * vd]);
    for c in 0..seq.chunks() {
        // The chunk's rows, 1 to CHUNK of them.
        let rows = c * CHUNK..seq.len.min((c + 1) * CHUNK);
        // h = bf16(S); the products see the same rounded state.
        let h_chunk = &mut out.h[c * state..][..state];
        for kk in 0..kd {
            for v in 0..vd {
                let b = st[kk * vd + v].to_bf16();
                h_chunk[s.state_index(kk, v)] = b;
                s_bf[kk * vd + v] = F::of_bf16(b);
            }
        }
        corrected_values(p, &at, rows.clone(), &s_bf, &mut vn_bf, &mut out.v_new);
        update_state(p, &at, rows, &vn_bf, &mut st);
    }
    for kk in 0..kd {
        for v in 0..vd {
            out.ht[s.state_index(kk, v)] = st[kk * vd + v].to_f32();
        }
    }
    out
}

/// `Vn = u - w @ bf16(S)` over the chunk's `rows`: rounded to bf16 into `v_new`, then (with the
/// scalar gate) scaled by `exp2(g[last] - g[t])` and rounded again into `vn_bf` (`[CHUNK][V]`,
/// row `r` for the chunk's `r`-th token) for the state update.
fn corrected_values<F: Acc>(
    p: &ModelView<'_>,
    at: &Rows,
    rows: std::ops::Range<usize>,
    s_bf: &[F],
    vn_bf: &mut [F],
    v_new: &mut Vec<bf16>,
) {
    let (kd, vd) = (at.shape.key_dim, at.shape.value_dim);
    let g_last = p.g.map(|g| F::of_f32(g[at.gate(rows.end - 1)]));
    let mut acc = vec![F::ZERO; vd];
    for (r, t) in rows.enumerate() {
        acc.fill(F::ZERO);
        for (kk, &wk) in p.w[at.weight(t)..][..kd].iter().enumerate() {
            let wk = F::of_bf16(wk);
            for (a, &sv) in acc.iter_mut().zip(&s_bf[kk * vd..][..vd]) {
                *a += wk * sv;
            }
        }
        let scale = g_last.zip(p.g).map(|(gl, g)| (gl - F::of_f32(g[at.gate(t)])).exp2());
        for (v, (&uv, &a)) in p.u[at.value(t)..][..vd].iter().zip(&acc).enumerate() {
            let vn = F::of_bf16(uv) - a;
            let b = vn.to_bf16();
            v_new.push(b);
            vn_bf[r * vd + v] = match scale {
                Some(scale) => F::of_bf16((vn * scale).to_bf16()),
                None => F::of_bf16(b),
            };
        }
    }
}

/// `S = exp2(g[last]) * exp2(gk[last])[:, None] * S + k^T @ bf16(Vn)` over the chunk's `rows`
/// (each gate's factor only when the problem has it).
fn update_state<F: Acc>(p: &ModelView<'_>, at: &Rows, rows: std::ops::Range<usize>, vn_bf: &[F], s: &mut [F]) {
    let (kd, vd) = (at.shape.key_dim, at.shape.value_dim);
    let last = rows.end - 1;
    let g_decay = p.g.map(|g| F::of_f32(g[at.gate(last)]).exp2());
    for kk in 0..kd {
        let srow = &mut s[kk * vd..][..vd];
        if let Some(d) = g_decay {
            srow.iter_mut().for_each(|x| *x *= d);
        }
        if let Some(gk) = p.gk {
            let d = F::of_f32(gk[at.weight(last) + kk]).exp2();
            srow.iter_mut().for_each(|x| *x *= d);
        }
        for (r, t) in rows.clone().enumerate() {
            let kv = F::of_bf16(p.k[at.key(t) + kk]);
            for (x, &vn) in srow.iter_mut().zip(&vn_bf[r * vd..][..vd]) {
                *x += kv * vn;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kda_kernel::layout::{K_DIM, V_DIM};

    /// Elements of one `[K, V]` state.
    const STATE: usize = K_DIM * V_DIM;
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
