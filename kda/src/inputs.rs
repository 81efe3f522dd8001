//! Realistic random inputs (docs/CONTRACT.md#realistic-inputs: never zeros) and the reference
//! shapes (docs/CONTRACT.md#reference-shapes).
//!
//! Every tensor is drawn from a small counter-based generator seeded per (tensor, token), so a
//! problem is a pure function of `(plan, heads, with_h0, seed)` whatever the thread count.

use crate::layer::{GateInput, LayerOptions, LayerProblem, LayerShape};
use crate::model::{ModelProblem, ModelShape, checked_product};
use crate::{Dims, KdaError, Plan, Problem};
use half::bf16;
use kda_kernel::layout::{CHUNK, K_DIM, V_DIM};
use rayon::prelude::*;

/// Heads of every reference shape.
pub const REFERENCE_HEADS: usize = 64;

/// Standard deviation of `w` (about N(0, 0.05^2)).
const W_STD: f64 = 0.05;
/// Standard deviation of `u` (about N(0, 0.5^2)).
const U_STD: f64 = 0.5;
/// Standard deviation of `h0` (about N(0, 0.1^2)).
const H0_STD: f64 = 0.1;
/// Per-token log2 gates are uniform in `(-GATE_MAX, 0)`.
const GATE_MAX: f64 = 0.2;

/// The reference shapes (docs/CONTRACT.md#reference-shapes): name and sequence lengths, all
/// with [`REFERENCE_HEADS`] heads.
pub fn reference_shapes() -> Vec<(&'static str, Vec<usize>)> {
    vec![
        ("fixed_8192", vec![8192]),
        ("mixed_6", vec![1300, 547, 2048, 963, 271, 3063]),
        ("fixed_32k", vec![32768]),
        ("many_short", vec![128; 64]),
        ("tiny", vec![256]),
    ]
}

/// The generator's stream `stream` under `seed`: an endless sequence of well-mixed 64-bit words
/// (SplitMix64), a pure function of its arguments.
///
/// [`random_problem`] draws every tensor row from its own stream of this generator (stream ids 1
/// to 5 with a row index); this is the same generator for other random draws, e.g. random batch
/// layouts (the `kda-cli` crate draws its ragged layouts from streams 0 and 1). [`unit_uniform`]
/// turns a word into a uniform number.
///
/// ```
/// let a: Vec<u64> = kda::inputs::random_words(7, 0).take(3).collect();
/// assert_eq!(a, kda::inputs::random_words(7, 0).take(3).collect::<Vec<_>>());
/// assert_ne!(a, kda::inputs::random_words(7, 1).take(3).collect::<Vec<_>>());
/// ```
pub fn random_words(seed: u64, stream: u64) -> impl Iterator<Item = u64> {
    let mut rng = Rng::for_row(seed, stream, 0);
    std::iter::repeat_with(move || rng.next_u64())
}

/// A word of [`random_words`] as a number uniform on `(0, 1]` (its top 53 bits).
pub fn unit_uniform(word: u64) -> f64 {
    ((word >> 11) as f64 + 1.0) * (1.0 / (1u64 << 53) as f64)
}

/// SplitMix64: a tiny, well-mixed generator; one stream per (tensor, row).
struct Rng(u64);

impl Rng {
    /// The stream of row `row` of tensor `tensor` under `seed`.
    fn for_row(seed: u64, tensor: u64, row: u64) -> Self {
        let mut r = Rng(seed ^ tensor.wrapping_mul(0xA076_1D64_78BD_642F));
        r.0 ^= r.next_u64().wrapping_add(row.wrapping_mul(0xE703_7ED1_A0B4_28DB));
        r
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `(0, 1]`.
    fn uniform(&mut self) -> f64 {
        unit_uniform(self.next_u64())
    }

    /// Standard normal (Box-Muller).
    fn normal(&mut self) -> f64 {
        let (a, b) = (self.uniform(), self.uniform());
        (-2.0 * a.ln()).sqrt() * (core::f64::consts::TAU * b).cos()
    }
}

/// Tensor ids of the generator streams.
const K_ID: u64 = 1;
const W_ID: u64 = 2;
const U_ID: u64 = 3;
const G_ID: u64 = 4;
const H0_ID: u64 = 5;

/// Fills `out` (rows of `width`) with `f(rng)`, one generator stream per row.
fn fill_rows<T: Send>(out: &mut [T], width: usize, seed: u64, id: u64, f: impl Fn(&mut Rng) -> T + Sync) {
    out.par_chunks_mut(width).enumerate().for_each(|(row, dst)| {
        let mut rng = Rng::for_row(seed, id, row as u64);
        for x in dst {
            *x = f(&mut rng);
        }
    });
}

/// A random problem in the realistic distribution (docs/CONTRACT.md#realistic-inputs) over `plan`
/// with `heads` heads.
///
/// `k` rows are L2-normalised over K; `w ~ N(0, 0.05^2)`, `u ~ N(0, 0.5^2)`; `gk` is the
/// cumulative sum, inside each 64-token chunk of each sequence, of per-token log2 gates uniform in
/// (-0.2, 0); `h0 ~ N(0, 0.1^2)` when `with_h0`.
///
/// # Panics
/// If `heads` is 0 or the problem's tensors are too large for memory's address range;
/// [`try_random_problem`] returns those as errors instead.
pub fn random_problem(plan: Plan, heads: usize, with_h0: bool, seed: u64) -> Problem {
    match try_random_problem(plan, heads, with_h0, seed) {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    }
}

/// [`random_problem`], or an error when `heads` is 0 or the problem's tensors (outputs included)
/// are too large for memory's address range.
pub fn try_random_problem(plan: Plan, heads: usize, with_h0: bool, seed: u64) -> Result<Problem, KdaError> {
    try_random_grouped_problem(plan, heads, heads, with_h0, seed)
}

/// [`try_random_problem`] with grouped value heads: `heads` key heads, `value_heads` value heads
/// (a multiple of `heads`). With `value_heads == heads` it is [`try_random_problem`]'s problem.
pub fn try_random_grouped_problem(
    plan: Plan,
    heads: usize,
    value_heads: usize,
    with_h0: bool,
    seed: u64,
) -> Result<Problem, KdaError> {
    // The head counts, and every count below is at most one of the checked sizes: none overflows.
    Dims::grouped(&plan, heads, value_heads).check()?;
    let (t, hv) = (plan.tokens(), value_heads);
    let k = unit_rows(t * heads, K_DIM, seed);
    let w = normal_rows(t, hv * K_DIM, seed, W_ID, W_STD);
    let u = normal_rows(t, hv * V_DIM, seed, U_ID, U_STD);
    let gk = chunk_gates(&plan, hv * K_DIM, seed, G_ID);
    let h0 = with_h0.then(|| initial_states(plan.num_seqs() * hv * K_DIM * V_DIM, V_DIM, seed));
    Ok(Problem { plan, heads, value_heads, k, w, u, gk, h0 })
}

/// `rows` rows of `width` bf16, each drawn from N(0, 1) and L2-normalised (the keys).
fn unit_rows(rows: usize, width: usize, seed: u64) -> Vec<bf16> {
    let mut k = vec![bf16::ZERO; rows * width];
    k.par_chunks_mut(width).enumerate().for_each(|(r, dst)| {
        let mut rng = Rng::for_row(seed, K_ID, r as u64);
        let x: Vec<f64> = (0..width).map(|_| rng.normal()).collect();
        let norm = x.iter().map(|v| v * v).sum::<f64>().sqrt();
        for (d, v) in dst.iter_mut().zip(x) {
            *d = bf16::from_f64(v / norm);
        }
    });
    k
}

/// `tokens` rows of `width` bf16 drawn from N(0, std^2), generator stream `id`.
fn normal_rows(tokens: usize, width: usize, seed: u64, id: u64, std: f64) -> Vec<bf16> {
    let mut out = vec![bf16::ZERO; tokens * width];
    fill_rows(&mut out, width, seed, id, |r| bf16::from_f64(std * r.normal()));
    out
}

/// Log2 gates for every token of `plan` (rows of `row` f32): per token uniform in
/// `(-GATE_MAX, 0)`, then summed cumulatively inside each chunk of each sequence.
fn chunk_gates(plan: &Plan, row: usize, seed: u64, id: u64) -> Vec<f32> {
    let mut gates = vec![0f32; plan.tokens() * row];
    fill_rows(&mut gates, row, seed, id, |r| (-GATE_MAX * r.uniform()) as f32);
    let mut chunks: Vec<&mut [f32]> = Vec::with_capacity(plan.chunks());
    let mut rest = gates.as_mut_slice();
    for s in plan.seqs() {
        let (mut seq, tail) = rest.split_at_mut(s.len * row);
        rest = tail;
        while !seq.is_empty() {
            let (c, tail) = seq.split_at_mut((CHUNK * row).min(seq.len()));
            chunks.push(c);
            seq = tail;
        }
    }
    chunks.into_par_iter().for_each(|c| {
        for r in 1..c.len() / row {
            let (prev, cur) = c[(r - 1) * row..(r + 1) * row].split_at_mut(row);
            for (x, p) in cur.iter_mut().zip(prev.iter()) {
                *x += *p;
            }
        }
    });
    gates
}

/// `len` initial-state elements drawn from N(0, H0_STD^2), in rows of `width`.
fn initial_states(len: usize, width: usize, seed: u64) -> Vec<f32> {
    let mut h0 = vec![0f32; len];
    fill_rows(&mut h0, width, seed, H0_ID, |r| (H0_STD * r.normal()) as f32);
    h0
}

/// Generator stream of the scalar gate `g`.
const G_SCALAR_ID: u64 = 6;

/// A random generalized problem in the same distributions ([`try_random_problem`]): keys of the
/// shape's `H` heads, weights, values and gates of its `HV` value heads, the gates the shape
/// names, initial states when `with_h0`.
pub fn try_random_model_problem(
    plan: Plan,
    shape: ModelShape,
    with_h0: bool,
    seed: u64,
) -> Result<ModelProblem, KdaError> {
    shape.validate()?;
    let (t, hv, kd, vd) = (plan.tokens(), shape.value_heads, shape.key_dim, shape.value_dim);
    // Every count below is a factor of one of these, so none overflows once they fit.
    let sizes = [[t, shape.heads, kd, 1], [t, hv, kd, 1], [t, hv, vd, 1], [plan.num_seqs(), hv, kd, vd]];
    if sizes.iter().any(|dims| checked_product(dims).is_none_or(|n| n > isize::MAX as usize / 8)) {
        let reason = "the problem's tensors do not fit in memory".into();
        return Err(KdaError::Argument { name: "plan", reason });
    }
    Ok(ModelProblem {
        k: unit_rows(t * shape.heads, kd, seed),
        w: normal_rows(t, hv * kd, seed, W_ID, W_STD),
        u: normal_rows(t, hv * vd, seed, U_ID, U_STD),
        g: shape.gates.g.then(|| chunk_gates(&plan, hv, seed, G_SCALAR_ID)),
        gk: shape.gates.gk.then(|| chunk_gates(&plan, hv * kd, seed, G_ID)),
        h0: with_h0.then(|| initial_states(plan.num_seqs() * hv * kd * vd, vd, seed)),
        shape,
        plan,
    })
}

/// A random state pool of `shape` (elements uniform in (-0.5, 0.5)), stream `seed`.
///
/// # Panics
/// If the pool's size overflows (`PoolShape::len`).
pub fn random_pool(shape: &crate::pool::PoolShape, seed: u64) -> Vec<f32> {
    let len = shape.len().unwrap_or_else(|e| panic!("{e}"));
    random_words(seed, POOL_STREAM).take(len).map(|w| (unit_uniform(w) - 0.5) as f32).collect()
}

/// The random stream [`random_pool`] draws from.
const POOL_STREAM: u64 = 9;

/// A random layer problem of `shape` (values in the ranges models see: unit-scale `q`, `k`,
/// `v`, `beta` in (0, 1) or its logits, decays down to -5 per token).
pub fn random_layer_problem(
    lengths: &[usize],
    shape: LayerShape,
    options: LayerOptions,
    with_h0: bool,
    seed: u64,
) -> LayerProblem {
    let plan = Plan::from_lengths(lengths);
    let (t, n) = (plan.tokens(), plan.num_seqs());
    let mut words = random_words(seed, 0).map(unit_uniform);
    let mut draw = |len: usize, lo: f64, hi: f64| -> Vec<f64> {
        (0..len).map(|_| lo + (hi - lo) * words.next().unwrap()).collect()
    };
    let bf = |v: Vec<f64>| v.into_iter().map(bf16::from_f64).collect::<Vec<_>>();
    let f = |v: Vec<f64>| v.into_iter().map(|x| x as f32).collect::<Vec<_>>();
    let (h, hv, kd, vd, gw) = (shape.heads, shape.value_heads, shape.key_dim, shape.value_dim, shape.gate_width());
    let key_scale = 1.0 / (kd as f64).sqrt();
    let raw = !matches!(options.gate, GateInput::Log);
    LayerProblem {
        q: bf(draw(t * h * kd, -key_scale, key_scale)),
        k: bf(draw(t * h * kd, -key_scale, key_scale)),
        v: bf(draw(t * hv * vd, -1.0, 1.0)),
        g: f(if raw { draw(t * hv * gw, -3.0, 3.0) } else { draw(t * hv * gw, -0.5, 0.0) }),
        beta: f(if options.beta_sigmoid { draw(t * hv, -3.0, 3.0) } else { draw(t * hv, 0.0, 1.0) }),
        a_log: raw.then(|| f(draw(hv, -1.0, 1.0))),
        dt_bias: raw.then(|| f(draw(hv * gw, -1.0, 1.0))),
        h0: with_h0.then(|| f(draw(n * hv * kd * vd, -1.0, 1.0))),
        dtypes: Default::default(),
        plan,
        shape,
        options,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_seed_dependent() {
        let a = random_problem(Plan::from_lengths(&[70, 3]), 2, true, 9);
        let b = random_problem(Plan::from_lengths(&[70, 3]), 2, true, 9);
        let c = random_problem(Plan::from_lengths(&[70, 3]), 2, true, 10);
        assert_eq!((&a.k, &a.gk, &a.h0), (&b.k, &b.gk, &b.h0));
        assert_ne!(a.u, c.u);
        a.validate().unwrap();
    }

    #[test]
    fn impossible_problems_are_errors() {
        let err = try_random_problem(Plan::from_lengths(&[3]), 0, true, 1).unwrap_err();
        assert!(matches!(err, KdaError::Argument { name: "heads", .. }), "{err}");
        let err = try_random_problem(Plan::from_lengths(&[3]), usize::MAX / 2, true, 1).unwrap_err();
        assert!(matches!(err, KdaError::TooLarge { .. }), "{err}");
    }

    #[test]
    fn distributions_match_the_contract() {
        let p = random_problem(Plan::from_lengths(&[130, 64, 1]), 3, true, 1);
        for row in p.k.chunks_exact(K_DIM) {
            let n: f64 = row.iter().map(|x| x.to_f64().powi(2)).sum::<f64>().sqrt();
            assert!((n - 1.0).abs() < 1e-2, "k row norm {n}");
        }
        let std = |x: &[f64]| (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64).sqrt();
        let w: Vec<f64> = p.w.iter().map(|x| x.to_f64()).collect();
        let u: Vec<f64> = p.u.iter().map(|x| x.to_f64()).collect();
        assert!((std(&w) / W_STD - 1.0).abs() < 0.05);
        assert!((std(&u) / U_STD - 1.0).abs() < 0.05);
        assert!(p.gk.iter().all(|&g| g < 0.0 && g > -(GATE_MAX * CHUNK as f64) as f32));
    }

    #[test]
    fn gates_restart_at_every_chunk_and_every_sequence() {
        let heads = 2;
        let row = heads * K_DIM;
        let p = random_problem(Plan::from_lengths(&[130, 5]), heads, false, 2);
        // The first row of each chunk is a single gate; later rows only decrease.
        for start in [0usize, 64, 128, 130] {
            assert!(p.gk[start * row..(start + 1) * row].iter().all(|&g| g > -GATE_MAX as f32));
        }
        for t in [1usize, 63, 65, 129, 131] {
            let (prev, cur) = (&p.gk[(t - 1) * row..t * row], &p.gk[t * row..(t + 1) * row]);
            assert!(cur.iter().zip(prev).all(|(c, p)| c < p), "token {t}");
        }
    }
}
