//! The layer's token-parallel kernels (docs/CONTRACT.md, "The layer"): everything of a KDA or
//! Gated DeltaNet layer forward except the serial recurrence, one CTA per (chunk, value head).
//!
//! - [`kda_layer_prepare`]: the gate activated and summed inside the chunk (`G`, natural log),
//!   `q`/`k` normalised and `beta` through its sigmoid when asked, then the WY representation by
//!   forward substitution,
//!
//!   ```text
//!   (I + strictly_lower(diag(beta) (k Γ) (k / Γ)^T)) [w | u] = diag(beta) [k Γ | v]
//!   ```
//!
//!   and the recurrence's keys (KDA: `k Γ_last / Γ` per value head; GDN: the key head's `k`) and
//!   gate (`G / ln 2`, the contract's log2 cumulative form).
//! - [`kda_layer_output`]: `o = scale ((q Γ) h + causal((q Γ) (k / Γ)^T) v_new)` from the
//!   recurrence's `h` (each chunk's entry state) and `v_new`.
//!
//! Every gated product is formed from differences of `G` (`exp(G[r] - G[s])`, never a ratio of
//! exponentials), which stay in range however strong the decay. Plain f32 arithmetic on every
//! target; only the chunk's valid rows are read or written.

use crate::arch::sm80::{
    bf16_to_f32, block_idx_x, exp2_approx, f32_to_bf16, fma_f32, log2_approx, rcp_approx, rsqrt_approx,
    smem_base_generic, sync_threads, thread_idx_x,
};
use crate::layout::CHUNK;
use crate::layout::layer::{
    CHUNK_WORDS, GATE_LOWER_BOUND, GATE_SOFTPLUS, MAX_K, MAX_V, OPT_BETA_SIGMOID, OPT_L2NORM, ROW_WORDS, THREADS,
};

const LOG2_E: f32 = core::f32::consts::LOG2_E;
const LN_2: f32 = core::f32::consts::LN_2;
/// The L2 norm's epsilon inside the layer (FLA's `use_qk_l2norm_in_kernel`).
const L2NORM_EPS: f32 = 1e-6;
/// Columns of the substitution's solution tile `[w | u]`.
const SOLUTION_COLS: usize = MAX_K + MAX_V;

/// `e^x` through the SFU's `exp2`.
#[inline(always)]
fn exp(x: f32) -> f32 {
    exp2_approx(x * LOG2_E)
}

/// `1 / (1 + e^-x)`.
#[inline(always)]
fn sigmoid(x: f32) -> f32 {
    rcp_approx(1.0 + exp(-x))
}

/// `ln(1 + e^x)` without overflow.
#[inline(always)]
fn softplus(x: f32) -> f32 {
    let (pos, abs) = if x > 0.0 { (x, x) } else { (0.0, -x) };
    pos + log2_approx(1.0 + exp(-abs)) * LN_2
}

/// A launch's head counts and sizes.
#[derive(Clone, Copy)]
struct Dims {
    heads: usize,
    value_heads: usize,
    key_dim: usize,
    value_dim: usize,
    /// Gate values per token and value head: `K` (KDA) or 1 (GDN).
    gate_width: usize,
}

impl Dims {
    fn new(heads: u32, value_heads: u32, key_dim: u32, value_dim: u32, gate_width: u32) -> Self {
        let u = |x: u32| x as usize;
        Self {
            heads: u(heads),
            value_heads: u(value_heads),
            key_dim: u(key_dim),
            value_dim: u(value_dim),
            gate_width: u(gate_width),
        }
    }

    /// What the launcher guarantees; checked again so the divisions and tiles below are safe.
    fn valid(&self) -> bool {
        self.heads > 0
            && self.value_heads > 0
            && self.value_heads.is_multiple_of(self.heads)
            && self.key_dim > 0
            && self.key_dim <= MAX_K
            && self.value_dim > 0
            && self.value_dim <= MAX_V
            && (self.gate_width == 1 || self.gate_width == self.key_dim)
    }

    /// Value heads per key head.
    fn group(&self) -> usize {
        self.value_heads.checked_div(self.heads).unwrap_or(1)
    }

    /// Whether the gate is per key (KDA).
    fn per_key_gate(&self) -> bool {
        self.gate_width != 1
    }
}

/// One CTA's work: its chunk (global index), value head `i`, key head `j`, the chunk's first
/// token and valid rows.
struct Work {
    chunk: usize,
    i: usize,
    j: usize,
    t0: usize,
    rows: usize,
}

impl Work {
    /// This CTA's work (grid: chunk-major, one CTA per value head).
    ///
    /// # Safety
    /// `chunks` holds `gridDim.x / value_heads` entries of `CHUNK_WORDS` words.
    #[inline(always)]
    unsafe fn of_this_cta(chunks: *const u32, d: &Dims) -> Self {
        // 32-bit index arithmetic: the grid is below 2^31 CTAs.
        let (b, hv) = (block_idx_x() as u32, d.value_heads as u32);
        let (chunk, i) = (b.checked_div(hv).unwrap_or(0) as usize, b.checked_rem(hv).unwrap_or(0) as usize);
        // SAFETY: see the function's contract.
        let (t0, rows) = unsafe { (*chunks.add(chunk * CHUNK_WORDS), *chunks.add(chunk * CHUNK_WORDS + 1)) };
        let j = i.checked_div(d.group()).unwrap_or(0);
        Self { chunk, i, j, t0: t0 as usize, rows: (rows as usize).min(CHUNK) }
    }
}

/// `(row, column)` of flat index `e` over rows of `cols` columns (32-bit division).
#[inline(always)]
fn split(e: usize, cols: usize) -> (usize, usize) {
    let (e, c) = (e as u32, cols as u32);
    // (Checked: callers pass positive sizes, which the compiler cannot see; no panic path.)
    (e.checked_div(c).unwrap_or(0) as usize, e.checked_rem(c).unwrap_or(0) as usize)
}

/// The chunk's rows of head `head` of a `[T, heads, kd]` bf16 tensor into `dst` (`[CHUNK][ROW_WORDS]`
/// f32), each row divided by its L2 norm when `l2norm`. Ends with the CTA synchronised.
///
/// # Safety
/// The CTA calls it together; the rows exist in `src`; `dst` is a free tile.
#[inline(always)]
unsafe fn load_rows(dst: *mut f32, src: *const u16, w: &Work, heads: usize, head: usize, kd: usize, l2norm: bool) {
    let tid = thread_idx_x();
    // SAFETY (block): rows `< w.rows` of the chunk, columns `< kd <= MAX_K`.
    unsafe {
        for e in (tid..w.rows * kd).step_by(THREADS) {
            let (r, a) = split(e, kd);
            *dst.add(r * ROW_WORDS + a) = bf16_to_f32(*src.add(((w.t0 + r) * heads + head) * kd + a));
        }
        sync_threads();
        if l2norm {
            if tid < w.rows {
                let row = dst.add(tid * ROW_WORDS);
                let mut sum = 0.0;
                for a in 0..kd {
                    sum = fma_f32(*row.add(a), *row.add(a), sum);
                }
                let inverse = rsqrt_approx(sum + L2NORM_EPS);
                for a in 0..kd {
                    *row.add(a) *= inverse;
                }
            }
            sync_threads();
        }
    }
}

/// `G` (`[CHUNK][ROW_WORDS]` f32, natural log) at row `r`, key `a` (column 0 for a per-head gate).
///
/// # Safety
/// Row `r` of the tile is written.
#[inline(always)]
unsafe fn gate_at(g: *const f32, d: &Dims, r: usize, a: usize) -> f32 {
    let col = if d.per_key_gate() { a } else { 0 };
    // SAFETY: see the function's contract.
    unsafe { *g.add(r * ROW_WORDS + col) }
}

/// `sum_a x[r][a] y[s][a] exp(G[r][a] - G[s][a])`: rows `r` of `x` and `s` of `y` (`[CHUNK][ROW_WORDS]`
/// tiles), gated from `s` to `r`.
///
/// # Safety
/// Rows `r` and `s` of the three tiles are written.
#[inline(always)]
unsafe fn gated_dot(x: *const f32, r: usize, y: *const f32, s: usize, g: *const f32, d: &Dims) -> f32 {
    let mut acc = 0.0;
    // SAFETY (block): see the function's contract.
    unsafe {
        if d.per_key_gate() {
            for a in 0..d.key_dim {
                let decay = exp(gate_at(g, d, r, a) - gate_at(g, d, s, a));
                acc = fma_f32(*x.add(r * ROW_WORDS + a) * *y.add(s * ROW_WORDS + a), decay, acc);
            }
        } else {
            for a in 0..d.key_dim {
                acc = fma_f32(*x.add(r * ROW_WORDS + a), *y.add(s * ROW_WORDS + a), acc);
            }
            acc *= exp(gate_at(g, d, r, 0) - gate_at(g, d, s, 0));
        }
    }
    acc
}

/// The layer's prepare kernel (`abi::LAYER_PREPARE`, parameters `abi::LAYER_PREPARE_PARAMS`).
/// Grid: one CTA per (chunk, value head), chunk-major; `layout::layer::THREADS` threads;
/// `layout::layer::PREPARE_SMEM_BYTES` of dynamic shared memory.
///
/// Reads `k` `[T, H, K]`, `v` `[T, HV, V]` (bf16), the gate `g` `[T, HV, gate_width]`, `beta`
/// `[T, HV]` (f32) and, for a raw gate, `a_log` `[HV]` and `dt_bias` `[HV, gate_width]` (either
/// may be null: 0 and 1 in their place); writes `w` `[T, HV, K]`, `u` `[T, HV, V]` (bf16), the
/// recurrence's keys `k_rec` (bf16; KDA `[T, HV, K]`, GDN `[T, H, K]`) and gate `gate_out`
/// (f32 `[T, HV, gate_width]`, log2, cumulative inside each chunk).
///
/// # Safety
/// `chunks` holds `gridDim.x / value_heads` entries (first token, valid rows `1..=CHUNK`), each
/// chunk's rows inside every tensor; the outputs overlap nothing.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "ptx-kernel" fn kda_layer_prepare(
    k: *const u16,
    v: *const u16,
    g: *const f32,
    beta: *const f32,
    a_log: *const f32,
    dt_bias: *const f32,
    chunks: *const u32,
    k_rec: *mut u16,
    w_out: *mut u16,
    u_out: *mut u16,
    gate_out: *mut f32,
    heads: u32,
    value_heads: u32,
    key_dim: u32,
    value_dim: u32,
    gate_width: u32,
    options: u32,
    gate_mode: u32,
    lower_bound_bits: u32,
) {
    let d = Dims::new(heads, value_heads, key_dim, value_dim, gate_width);
    if !d.valid() {
        return; // the launcher never launches so; this proves the tiles and divisions safe
    }
    let (hv, kd, vd, gw) = (d.value_heads, d.key_dim, d.value_dim, d.gate_width);
    let tid = thread_idx_x();
    // SAFETY (block): the kernel's contract; every tile index is below its `CHUNK` rows and
    // `MAX_K` / `SOLUTION_COLS` columns (`Dims::valid`), every tensor index inside the chunk's
    // valid rows.
    unsafe {
        let wk = Work::of_this_cta(chunks, &d);
        let (i, t0, rows) = (wk.i, wk.t0, wk.rows);
        let smem = smem_base_generic() as *mut f32;
        let keys = smem;
        let gates = keys.add(CHUNK * ROW_WORDS);
        let betas = gates.add(CHUNK * ROW_WORDS);
        let lower = betas.add(CHUNK);
        let solution = lower.add(CHUNK * CHUNK);

        load_rows(keys, k, &wk, d.heads, wk.j, kd, options & OPT_L2NORM != 0);

        // The decay per row (natural log), activated when raw; `beta`.
        let strength = if a_log.is_null() { 1.0 } else { exp(*a_log.add(i)) };
        for e in (tid..rows * gw).step_by(THREADS) {
            let (r, a) = split(e, gw);
            let raw = *g.add(((t0 + r) * hv + i) * gw + a);
            let bias = if dt_bias.is_null() { 0.0 } else { *dt_bias.add(i * gw + a) };
            *gates.add(r * ROW_WORDS + a) = match gate_mode {
                GATE_SOFTPLUS => -strength * softplus(raw + bias),
                GATE_LOWER_BOUND => f32::from_bits(lower_bound_bits) * sigmoid(strength * (raw + bias)),
                _ => raw,
            };
        }
        if tid < rows {
            let b = *beta.add((t0 + tid) * hv + i);
            *betas.add(tid) = if options & OPT_BETA_SIGMOID != 0 { sigmoid(b) } else { b };
        }
        sync_threads();
        // G: the decay summed down each column.
        for a in (tid..gw).step_by(THREADS) {
            let mut acc = 0.0;
            for r in 0..rows {
                acc += *gates.add(r * ROW_WORDS + a);
                *gates.add(r * ROW_WORDS + a) = acc;
            }
        }
        sync_threads();

        // The strictly lower matrix `beta[r] (k Γ)[r] . (k / Γ)[s]`, s < r.
        for e in (tid..rows * CHUNK).step_by(THREADS) {
            let (r, s) = split(e, CHUNK);
            if s < r {
                *lower.add(e) = *betas.add(r) * gated_dot(keys, r, keys, s, gates, &d);
            }
        }
        sync_threads();

        // Forward substitution, one column of `[w | u]` per thread, rows in order.
        for col in (tid..kd + vd).step_by(THREADS) {
            for r in 0..rows {
                let b = *betas.add(r);
                let mut acc = if col < kd {
                    b * *keys.add(r * ROW_WORDS + col) * exp(gate_at(gates, &d, r, col))
                } else {
                    b * bf16_to_f32(*v.add(((t0 + r) * hv + i) * vd + col - kd))
                };
                for s in 0..r {
                    acc = fma_f32(-*lower.add(r * CHUNK + s), *solution.add(s * SOLUTION_COLS + col), acc);
                }
                *solution.add(r * SOLUTION_COLS + col) = acc;
                if col < kd {
                    *w_out.add(((t0 + r) * hv + i) * kd + col) = f32_to_bf16(acc);
                } else {
                    *u_out.add(((t0 + r) * hv + i) * vd + col - kd) = f32_to_bf16(acc);
                }
            }
        }

        // The recurrence's keys and gate.
        let last = rows - 1;
        for e in (tid..rows * kd).step_by(THREADS) {
            let (r, a) = split(e, kd);
            let key = *keys.add(r * ROW_WORDS + a);
            if d.per_key_gate() {
                let to_end = exp(gate_at(gates, &d, last, a) - gate_at(gates, &d, r, a));
                *k_rec.add(((t0 + r) * hv + i) * kd + a) = f32_to_bf16(key * to_end);
            } else if i.checked_rem(d.group()) == Some(0) {
                // GDN's keys are the key head's, written by the first value head of its group.
                *k_rec.add(((t0 + r) * d.heads + wk.j) * kd + a) = f32_to_bf16(key);
            }
        }
        for e in (tid..rows * gw).step_by(THREADS) {
            let (r, a) = split(e, gw);
            *gate_out.add(((t0 + r) * hv + i) * gw + a) = *gates.add(r * ROW_WORDS + a) * LOG2_E;
        }
    }
}

/// The layer's output kernel (`abi::LAYER_OUTPUT`, parameters `abi::LAYER_OUTPUT_PARAMS`). Grid,
/// threads as [`kda_layer_prepare`]; `layout::layer::OUTPUT_SMEM_BYTES` of dynamic shared memory.
///
/// Reads `q`, `k` `[T, H, K]` (bf16), the prepare kernel's gate (`[T, HV, gate_width]` f32,
/// log2, cumulative inside each chunk), the recurrence's `h` (`[NT, HV, K, V]` bf16, key-first;
/// the chunk table's order is the recurrence's chunk order) and `v_new` (`[T, HV, V]` bf16);
/// writes `o` (`[T, HV, V]` bf16) times `f32::from_bits(scale_bits)`.
///
/// # Safety
/// As for [`kda_layer_prepare`]; `h` holds a state per (chunk of the table, value head).
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "ptx-kernel" fn kda_layer_output(
    q: *const u16,
    k: *const u16,
    gate: *const f32,
    h: *const u16,
    v_new: *const u16,
    o: *mut u16,
    chunks: *const u32,
    heads: u32,
    value_heads: u32,
    key_dim: u32,
    value_dim: u32,
    gate_width: u32,
    options: u32,
    scale_bits: u32,
) {
    let d = Dims::new(heads, value_heads, key_dim, value_dim, gate_width);
    if !d.valid() {
        return; // the launcher never launches so; this proves the tiles and divisions safe
    }
    let (hv, kd, vd, gw) = (d.value_heads, d.key_dim, d.value_dim, d.gate_width);
    let tid = thread_idx_x();
    let l2norm = options & OPT_L2NORM != 0;
    // SAFETY (block): as in `kda_layer_prepare`; `h`'s block is the table chunk's.
    unsafe {
        let wk = Work::of_this_cta(chunks, &d);
        let (i, t0, rows) = (wk.i, wk.t0, wk.rows);
        let smem = smem_base_generic() as *mut f32;
        let queries = smem;
        let keys = queries.add(CHUNK * ROW_WORDS);
        let gates = keys.add(CHUNK * ROW_WORDS);
        let attention = gates.add(CHUNK * ROW_WORDS);
        let entry = attention.add(CHUNK * CHUNK) as *mut u16;

        load_rows(queries, q, &wk, d.heads, wk.j, kd, l2norm);
        load_rows(keys, k, &wk, d.heads, wk.j, kd, l2norm);
        for e in (tid..rows * gw).step_by(THREADS) {
            let (r, a) = split(e, gw);
            *gates.add(r * ROW_WORDS + a) = *gate.add(((t0 + r) * hv + i) * gw + a) * LN_2;
        }
        sync_threads();

        // The causal attention inside the chunk, diagonal included.
        for e in (tid..rows * CHUNK).step_by(THREADS) {
            let (r, s) = split(e, CHUNK);
            if s <= r {
                *attention.add(e) = gated_dot(queries, r, keys, s, gates, &d);
            }
        }
        sync_threads();
        // q Γ, for the entry state's part; the entry state, which every row reads.
        for e in (tid..rows * kd).step_by(THREADS) {
            let (r, a) = split(e, kd);
            *queries.add(r * ROW_WORDS + a) *= exp(gate_at(gates, &d, r, a));
        }
        let block = h.add((wk.chunk * hv + i) * kd * vd);
        for e in (tid..kd * vd).step_by(THREADS) {
            *entry.add(e) = *block.add(e);
        }
        sync_threads();

        let scale = f32::from_bits(scale_bits);
        let state = entry as *const u16;
        for e in (tid..rows * vd).step_by(THREADS) {
            let (r, col) = split(e, vd);
            let mut acc = 0.0;
            for a in 0..kd {
                acc = fma_f32(*queries.add(r * ROW_WORDS + a), bf16_to_f32(*state.add(a * vd + col)), acc);
            }
            for s in 0..=r {
                let vn = bf16_to_f32(*v_new.add(((t0 + s) * hv + i) * vd + col));
                acc = fma_f32(*attention.add(r * CHUNK + s), vn, acc);
            }
            *o.add(((t0 + r) * hv + i) * vd + col) = f32_to_bf16(scale * acc);
        }
    }
}
