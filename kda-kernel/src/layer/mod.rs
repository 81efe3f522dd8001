//! The layer's token-parallel kernels (docs/CONTRACT.md, "The layer"): everything of a KDA or
//! Gated DeltaNet layer forward except the serial recurrence, one CTA of eight warps per (chunk,
//! value head).
//!
//! - `kda_layer_prepare`: the gate activated and summed inside the chunk (`G`, natural log),
//!   `k` normalised and `beta` through its sigmoid when asked, then the WY representation,
//!
//!   ```text
//!   (I + L) [w | u] = diag(beta) [k Γ | v],   L = strictly_lower(diag(beta) (k Γ) (k / Γ)^T)
//!   ```
//!
//!   solved block by block (`SUB` rows at a time: `Y = R_b - L_b,<b X_<b`, `X_b = (I + L_bb)^-1 Y`),
//!   and the recurrence's keys (KDA: `k Γ_last / Γ` per value head; GDN: the key head's `k`) and
//!   gate (`G / ln 2`, the contract's log2 cumulative form).
//! - `kda_layer_output`: `o = scale ((q Γ) h + P v_new)`, `P = causal((q Γ) (k / Γ)^T)`, from the
//!   recurrence's `h` (each chunk's entry state) and `v_new`.
//! - `kda_layer_prepare_fused` (9.x): the prepare kernel's work and the output kernel's `P` and
//!   `q Γ`, written for the fused recurrence (`abi::HOPPER_FUSED`), which forms `o` in its chunk
//!   loop instead of the output kernel.
//! - `kda_layer_prepare_fused_scalar`: the same for a per-head gate (Gated DeltaNet) without the
//!   gate tile, in shared memory for three CTAs per SM on 9.x.
//!
//! The products run on the tensor cores in TF32 (`mma.sync` m16n8k8, f32 accumulation). A gated
//! product `sum_a x[r][a] y[s][a] exp(G[r][a] - G[s][a])` between sub-blocks `bi > bj` is one
//! `mma` of `x[r] exp(G[r] - G[f])` by `y[s] exp(G[f] - G[s])` with `f` the first row of `bi`:
//! `G` falls down the chunk, so both factors are at most 1 whatever the decay; on the diagonal
//! sub-blocks each element takes `exp(G[r] - G[s])` itself. Rows past the chunk's valid rows hold
//! zero keys, queries and `beta` and the last valid row's `G`, so they add nothing and overflow
//! nothing; only valid rows are read from or written to global memory.

use crate::abi::StateLayoutCode;
use crate::decode::unpack4;
use crate::arch::sm80::{
    bf16_to_f32, block_idx_x, exp2_approx, exp2_approx_ftz, fma_f32, ld_global_v2, ld_global_v4, ldmatrix_x4, ldmatrix_x4_trans,
    ld_shared_v2_f32, ld_shared_v4, st_shared_v2_f32, log2_approx, mma_m16n8k8_tf32, mma_m16n8k16_bf16, pack_bf16x2, rcp_approx, rcp_approx_ftz, rsqrt_approx,
    shfl_xor, st_global_v4, st_shared_u32, st_shared_v4, sync_threads, sync_warp, thread_idx_x, vote_any,
};
use crate::layout::CHUNK;
use crate::shared::Shared;
use crate::layout::layer::{
    ATTENTION_ROW, CHUNK_WORDS, first_half, GATE_LOG, GATE_LOWER_BOUND, GATE_SOFTPLUS, INVERSE_ROW_WORDS, KEY_ROW, MATRIX_ROW_WORDS, MAX_K, MAX_V,
    OPT_BETA_BF16, OPT_BETA_SIGMOID, OPT_GATE_BF16, OPT_L2NORM, OUTPUT_ATTENTION_AT, OUTPUT_GATES_AT, OUTPUT_PREPARED_ATTENTION_AT, OUTPUT_PREPARED_STAGED_AT, OUTPUT_QUERIES_AT, OUTPUT_STAGED_AT, ROW_WORDS,
    SCALAR_GATE_COL, STAGED_ROW, SUB, SUBS, THREADS,
};
use crate::layout::portable::Place;

mod output;
mod prepare;

// The entries by their paths for the simulator's tests (on the GPU they are exported by name).
#[cfg(not(target_arch = "nvptx64"))]
pub use output::{kda_layer_output, kda_layer_output_prepared};
#[cfg(not(target_arch = "nvptx64"))]
pub use prepare::{kda_layer_prepare, kda_layer_prepare_fused, kda_layer_prepare_fused_scalar};

const LOG2_E: f32 = core::f32::consts::LOG2_E;
const LN_2: f32 = core::f32::consts::LN_2;
/// The L2 norm's epsilon inside the layer (FLA's `use_qk_l2norm_in_kernel`).
pub(crate) const L2NORM_EPS: f32 = 1e-6;
/// Lanes of a warp.
const LANES: usize = 32;
/// Columns of an `mma` tile (its `N`) and depth of one TF32 `mma` (its `K`).
const TILE_N: usize = 8;
const TILE_K: usize = 8;
/// Depth of one bf16 `mma` (`m16n8k16`), the output's products.
const MMA_K: usize = 16;

/// `2^x` on the SFU, a result below f32's smallest normal flushed to zero (it scales a product
/// or a sum where it would add nothing): one instruction.
#[inline(always)]
fn exp2(x: f32) -> f32 {
    exp2_approx_ftz(x)
}

/// Which forms of the SFU's `2^x` and `1 / x` a function runs on: the plain ones (the decode
/// step's), or the `.ftz` ones (the layer's, one instruction each where the plain forms add a
/// compare and multiplies around the SFU to keep subnormal results; a result below f32's smallest
/// normal is zero, which changes no decay, gate or `beta` the layer uses).
#[derive(Clone, Copy)]
pub(crate) enum Sfu {
    Plain,
    Ftz,
}

impl Sfu {
    #[inline(always)]
    fn exp2(self, x: f32) -> f32 {
        match self {
            Self::Plain => exp2_approx(x),
            Self::Ftz => exp2_approx_ftz(x),
        }
    }

    #[inline(always)]
    fn rcp(self, x: f32) -> f32 {
        match self {
            Self::Plain => rcp_approx(x),
            Self::Ftz => rcp_approx_ftz(x),
        }
    }
}

/// `e^x` through the SFU's `exp2`.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    exp_on(Sfu::Plain, x)
}

/// `e^x` on `sfu`.
#[inline(always)]
fn exp_on(sfu: Sfu, x: f32) -> f32 {
    sfu.exp2(x * LOG2_E)
}

/// `1 / (1 + e^-x)`.
#[inline(always)]
pub(crate) fn sigmoid(x: f32) -> f32 {
    sigmoid_on(Sfu::Plain, x)
}

/// `1 / (1 + e^-x)` on `sfu`.
#[inline(always)]
fn sigmoid_on(sfu: Sfu, x: f32) -> f32 {
    sfu.rcp(1.0 + exp_on(sfu, -x))
}

/// `ln(1 + e^x)` without overflow, on `sfu`.
#[inline(always)]
fn softplus(sfu: Sfu, x: f32) -> f32 {
    let (pos, abs) = if x > 0.0 { (x, x) } else { (0.0, -x) };
    pos + log2_approx(1.0 + exp_on(sfu, -abs)) * LN_2
}

/// The decay in natural log from the gate's `raw` value as `gate_mode` gives it
/// (`layout::layer::GATE_*`): itself, `-strength * softplus(raw + bias)` or
/// `lower_bound * sigmoid(strength * (raw + bias))`, `strength` being `exp(A_log)`.
#[inline(always)]
pub(crate) fn activate(raw: f32, gate_mode: u32, strength: f32, bias: f32, lower_bound: f32) -> f32 {
    activate_on(Sfu::Plain, raw, gate_mode, strength, bias, lower_bound)
}

/// [`activate`] on `sfu`.
#[inline(always)]
fn activate_on(sfu: Sfu, raw: f32, gate_mode: u32, strength: f32, bias: f32, lower_bound: f32) -> f32 {
    match gate_mode {
        GATE_SOFTPLUS => -strength * softplus(sfu, raw + bias),
        GATE_LOWER_BOUND => lower_bound * sigmoid_on(sfu, strength * (raw + bias)),
        _ => raw,
    }
}

/// The smallest `K` and `V` the layer takes (`Dims::valid`).
const MIN_DIM: usize = 64;

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
    /// The launch's dimensions, when [`Dims::valid`].
    fn checked(heads: u32, value_heads: u32, key_dim: u32, value_dim: u32, gate_width: u32) -> Option<Self> {
        let u = |x: u32| x as usize;
        let d = Self {
            heads: u(heads),
            value_heads: u(value_heads),
            key_dim: u(key_dim),
            value_dim: u(value_dim),
            gate_width: u(gate_width),
        };
        d.valid().then_some(d)
    }

    /// What the launcher guarantees; checked again so the tiles and index splits below are safe:
    /// `K` and `V` powers of two from 64 up to the tiles' sizes (each warp's share of `[w | u]`
    /// and of `o` is whole `mma` tiles; `split` shifts by them).
    fn valid(&self) -> bool {
        self.heads > 0
            && self.value_heads > 0
            && self.value_heads.is_multiple_of(self.heads)
            && self.key_dim.is_power_of_two()
            && (MIN_DIM..=MAX_K).contains(&self.key_dim)
            && self.value_dim.is_power_of_two()
            && (MIN_DIM..=MAX_V).contains(&self.value_dim)
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
#[derive(Clone, Copy)]
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
        Self { chunk, i, j, t0: t0 as usize, rows: (rows as usize).clamp(1, CHUNK) }
    }
}

/// `(row, column)` of flat index `e` over rows of `cols` columns, `cols` a power of two (every
/// width the kernels split by: `K`, `V`, the gate's 1 or `K`, `CHUNK`): a shift and a mask (a
/// 32-bit division per element was a sixth of the kernels' instructions).
#[inline(always)]
fn split(e: usize, cols: usize) -> (usize, usize) {
    let shift = cols.trailing_zeros();
    (e >> shift, e & (cols - 1))
}

/// Where a tensor's rows start, in elements: row `r` at `first + r * stride`. A copy loop steps
/// a pointer by whole strides rather than forming each row's 64-bit offset from its index.
#[derive(Clone, Copy)]
struct RowsAt {
    first: usize,
    stride: usize,
}

impl RowsAt {
    /// The chunk's rows of head `head` of a `[T, heads, width]` tensor.
    fn heads(w: &Work, heads: usize, head: usize, width: usize) -> Self {
        Self { first: (w.t0 * heads + head) * width, stride: heads * width }
    }

    /// Row `r`'s first element.
    fn at(self, r: usize) -> usize {
        self.first + r * self.stride
    }

    /// This thread's walk down rows of `cols` elements in vectors of `vector` (`cols / vector`
    /// a power of two dividing `THREADS`): it keeps one column and steps down the rows by
    /// `THREADS / (cols / vector)`, its element offset by as many strides.
    fn walk(self, cols: usize, vector: usize) -> RowWalk {
        let per_row = cols / vector;
        let (r0, v) = split(thread_idx_x(), per_row);
        let step = THREADS >> per_row.trailing_zeros();
        RowWalk { r0: r0 as u32, col: v * vector, step: step as u32, first: self.at(r0) + v * vector, jump: step * self.stride }
    }
}

/// A thread's walk down a tile's rows ([`RowsAt::walk`]): its first row, its column, the rows
/// between its passes, its first element's offset and the offset between its passes. 32-bit row
/// counters.
#[derive(Clone, Copy)]
struct RowWalk {
    r0: u32,
    col: usize,
    step: u32,
    first: usize,
    jump: usize,
}

/// Every gate width (1 or a power-of-two `K <= MAX_K`) divides `THREADS`: a thread striding over
/// a gate tile by `THREADS` (or its 4 columns by `4 THREADS`) keeps its columns; and a chunk's rows
/// of a per-head gate are a row per thread.
const _: () = assert!(THREADS.is_multiple_of(MAX_K) && CHUNK <= THREADS);

/// `start, start + THREADS, ..` below `n`, counted in 32 bits (every tile and row range is far
/// below 2^32): a 64-bit counter costs the registers the products after these loops need.
#[inline(always)]
fn strided(start: usize, n: usize) -> impl Iterator<Item = usize> {
    (start as u32..n as u32).step_by(THREADS).map(|e| e as usize)
}

/// bf16 elements of one 16-byte load.
const BF16_VECTOR: usize = 8;
/// f32 elements of one 16-byte load.
const F32_VECTOR: usize = 4;

/// A thread's share of a tile's rows in registers: one 16-byte vector (`vector` elements from
/// its column) of each of up to `N` rows, `step` rows apart ([`RowsAt::walk`]: `cols / vector` a
/// power of two dividing `THREADS`), zeros past the valid rows. The loads are issued when it is
/// made and stored later: a kernel that issues all of a chunk's tiles before storing any waits
/// for memory once for all of them, where a load-then-store loop per tile (and per batch of a
/// tile) waited once each.
#[derive(Clone, Copy)]
struct Fetched<const N: usize> {
    words: [[u32; 4]; N],
    walk: RowWalk,
    filled: u32,
}

impl<const N: usize> Fetched<N> {
    /// Rows `< filled` of `cols` elements, row `r` read from `rows.at(r)` of `src` when
    /// `r < valid` (zeros past it), 16 bytes a load.
    ///
    /// # Safety
    /// Each valid row's `cols` elements exist in `src` from a 16-byte-aligned `rows.at(r)`; `N`
    /// vectors cover the thread's rows (`filled * cols <= N * vector * THREADS`: the `*_VECTORS`
    /// constants, checked against the largest tiles).
    #[inline(always)]
    unsafe fn issue<T>(src: *const T, filled_valid: (usize, usize), cols_vector: (usize, usize), rows: RowsAt) -> Self {
        // SAFETY: the caller's contract (16-byte-aligned rows).
        unsafe { Self::issue_with(src, filled_valid, cols_vector, rows, |at| ld_global_v4(at)) }
    }

    /// [`Fetched::issue`] with 8-byte loads, into each vector's first two words (the last two
    /// zeros): 4 bf16 elements a load, in the walk of 4 f32 elements (`vector`).
    ///
    /// # Safety
    /// As [`Fetched::issue`], each row's elements 8-byte aligned.
    #[inline(always)]
    unsafe fn issue_half<T>(src: *const T, filled_valid: (usize, usize), cols_vector: (usize, usize), rows: RowsAt) -> Self {
        // SAFETY: the caller's contract (8-byte-aligned rows).
        unsafe {
            Self::issue_with(src, filled_valid, cols_vector, rows, |at| {
                let [a, b] = ld_global_v2(at);
                [a, b, 0, 0]
            })
        }
    }

    /// The rows of [`Fetched::issue`], each of the thread's vectors read by `load` from its
    /// address.
    ///
    /// # Safety
    /// As [`Fetched::issue`], at the alignment `load` needs.
    #[inline(always)]
    unsafe fn issue_with<T>(
        src: *const T,
        (filled, valid): (usize, usize),
        (cols, vector): (usize, usize),
        rows: RowsAt,
        load: impl Fn(*const u32) -> [u32; 4],
    ) -> Self {
        let walk = rows.walk(cols, vector);
        // The thread's element of its first row, then of each row it takes (formed, not read,
        // past the valid rows).
        let at = src.wrapping_add(walk.first);
        let valid = valid as u32;
        let words = core::array::from_fn(|j| {
            if walk.r0 + j as u32 * walk.step < valid {
                load(at.wrapping_add(j * walk.jump) as *const u32)
            } else {
                [0; 4]
            }
        });
        Self { words, walk, filled: filled as u32 }
    }

    /// No rows (nothing loaded; [`Fetched::store`] stores nothing).
    #[inline(always)]
    fn none() -> Self {
        Self { words: [[0; 4]; N], walk: RowWalk { r0: 0, col: 0, step: 1, first: 0, jump: 0 }, filled: 0 }
    }

    /// [`Fetched::issue`] for bf16 rows, 8 elements (`BF16_VECTOR`) a load.
    ///
    /// # Safety
    /// As [`Fetched::issue`].
    #[inline(always)]
    unsafe fn bf16(src: *const u16, filled_valid: (usize, usize), cols: usize, rows: RowsAt) -> Self {
        // SAFETY: the caller's contract.
        unsafe { Self::issue(src, filled_valid, (cols, BF16_VECTOR), rows) }
    }

    /// `store(r, c, words)` for each of the thread's rows below `filled` (elements `c..c + vector`
    /// of row `r`).
    #[inline(always)]
    fn store(&self, mut store: impl FnMut(usize, usize, [u32; 4])) {
        for (j, &words) in self.words.iter().enumerate() {
            let r = self.walk.r0 + j as u32 * self.walk.step;
            if r < self.filled {
                store(r as usize, self.walk.col, words);
            }
        }
    }
}

/// Vectors a thread holds of a chunk's bf16 rows of `K` or `V` elements (`k`, `q`, `v`,
/// `v_new`), of its f32 rows of a per-key gate, and of a bf16 state (`K x V`), at the largest
/// sizes (smaller ones take fewer).
const ROW_VECTORS: usize = CHUNK * MAX_K / BF16_VECTOR / THREADS;
const GATE_VECTORS: usize = CHUNK * MAX_K / F32_VECTOR / THREADS;
const STATE_VECTORS: usize = MAX_K * MAX_V / BF16_VECTOR / THREADS;
const _: () = assert!(
    ROW_VECTORS * BF16_VECTOR * THREADS == CHUNK * MAX_K
        && MAX_V <= MAX_K
        && GATE_VECTORS * F32_VECTOR * THREADS == CHUNK * MAX_K
        && STATE_VECTORS * BF16_VECTOR * THREADS == MAX_K * MAX_V
);

/// The 8 f32 values of 8 bf16 packed in pairs (the first in the low half).
#[inline(always)]
fn unpack_bf16x8(words: [u32; 4]) -> [f32; BF16_VECTOR] {
    core::array::from_fn(|j| bf16_to_f32((words[j / 2] >> (16 * (j % 2))) as u16))
}

/// Two halves of 8 values swapped when [`first_half`] (`layout::layer`) says the second half
/// goes first: from value order into access order, and back.
#[inline(always)]
fn in_access_order<T>(first: usize, (lo, hi): (T, T)) -> (T, T) {
    if first == 0 { (lo, hi) } else { (hi, lo) }
}

/// `x` stored at elements `c..c + BF16_VECTOR` of row `r` of an f32 tile at `ROW_WORDS` words per
/// row, in two 16-byte stores ([`first_half`] first).
///
/// # Safety
/// As [`row4`], `c` a multiple of [`BF16_VECTOR`].
#[inline(always)]
unsafe fn set_row8(tile: Shared<f32>, r: usize, c: usize, x: [f32; BF16_VECTOR]) {
    let first = first_half(c);
    let halves = (core::array::from_fn(|j| x[j]), core::array::from_fn(|j| x[F32_VECTOR + j]));
    let (a, b) = in_access_order(first, halves);
    // SAFETY: see the function's contract.
    unsafe {
        set_row4(tile, r, c + first, a);
        set_row4(tile, r, c + (first ^ F32_VECTOR), b);
    }
}

/// Elements `c..c + F32_VECTOR` of row `r` of an f32 tile at `stride` words per row, in one
/// 16-byte load.
///
/// # Safety
/// The elements lie inside the tile; the tile, `stride` and `c` are 16-byte (4-word) aligned.
#[inline(always)]
unsafe fn row_words(tile: Shared<f32>, stride: usize, r: usize, c: usize) -> [f32; F32_VECTOR] {
    // SAFETY: see the function's contract.
    unsafe { ld_shared_v4(tile.add(r * stride + c).addr()) }.map(f32::from_bits)
}

/// Elements `c..c + F32_VECTOR` of row `r` of an f32 tile at `ROW_WORDS` words per row, in one
/// 16-byte load.
///
/// # Safety
/// The elements lie inside the tile, `c` a multiple of [`F32_VECTOR`] (rows are 16-byte aligned:
/// `ROW_WORDS` is a multiple of 4).
#[inline(always)]
unsafe fn row4(tile: Shared<f32>, r: usize, c: usize) -> [f32; F32_VECTOR] {
    // SAFETY: see the function's contract.
    unsafe { row_words(tile, ROW_WORDS, r, c) }
}

/// Elements `c..c + BF16_VECTOR` of row `r` of an f32 tile at `ROW_WORDS` words per row, in two
/// 16-byte loads ([`first_half`] first).
///
/// # Safety
/// As [`row4`], `c` a multiple of [`BF16_VECTOR`].
#[inline(always)]
unsafe fn row8(tile: Shared<f32>, r: usize, c: usize) -> [f32; BF16_VECTOR] {
    let first = first_half(c);
    // SAFETY: see the function's contract.
    let accessed = unsafe { (row4(tile, r, c + first), row4(tile, r, c + (first ^ F32_VECTOR))) };
    let (lo, hi) = in_access_order(first, accessed);
    core::array::from_fn(|j| if j < F32_VECTOR { lo[j] } else { hi[j - F32_VECTOR] })
}

/// `x` stored at elements `c..c + F32_VECTOR` of row `r` of an f32 tile at `ROW_WORDS` words per
/// row, in one 16-byte store.
///
/// # Safety
/// As [`row4`].
#[inline(always)]
unsafe fn set_row4(tile: Shared<f32>, r: usize, c: usize, x: [f32; F32_VECTOR]) {
    // SAFETY: see the function's contract.
    unsafe { st_shared_v4(tile.add(r * ROW_WORDS + c).addr(), x.map(f32::to_bits)) }
}

/// `x` rounded to bf16 and packed in pairs (the first in the low half).
#[inline(always)]
fn pack_bf16x8(x: [f32; BF16_VECTOR]) -> [u32; 4] {
    core::array::from_fn(|j| pack_bf16x2(x[2 * j], x[2 * j + 1]))
}

/// `words(r, c)` (elements `c..c + vector` of row `r`, 16 bytes) into the `rows` rows of `cols`
/// elements of `dst` (`T` the element), row `r` from element `at.at(r)`, one 16-byte store per
/// thread and pass; each thread keeps its column and steps down the rows, its pointer by whole
/// strides (a store per element, each with its own 64-bit address, was most of a copy loop's
/// instructions). 32-bit row counter.
///
/// # Safety
/// Each row's `cols` elements (`cols / vector` a power of two dividing `THREADS`) exist in `dst`
/// from a 16-byte-aligned `at.at(r)`; `words` reads only written shared memory.
#[inline(always)]
unsafe fn store_rows_v4<T>(
    dst: *mut T,
    rows: usize,
    (cols, vector): (usize, usize),
    at: RowsAt,
    words: impl Fn(usize, usize) -> [u32; 4],
) {
    let RowWalk { r0, col: c, step, first, jump } = at.walk(cols, vector);
    // Formed, not written, past the rows.
    let mut to = dst.wrapping_add(first);
    let mut r = r0;
    while r < rows as u32 {
        let x = words(r as usize, c);
        // SAFETY: see the function's contract (`r` is a row).
        unsafe { st_global_v4(to.cast::<u16>(), x) };
        r += step;
        to = to.wrapping_add(jump);
    }
}

/// `value(r, c)` (elements `c..c + BF16_VECTOR` of row `r`) rounded to bf16 into the `rows` rows
/// of `cols` elements of `dst`, row `r` from element `at.at(r)`: a thread's 8 elements packed
/// into one 16-byte store ([`store_rows_v4`]).
///
/// # Safety
/// As [`store_rows_v4`].
#[inline(always)]
unsafe fn store_bf16_rows(
    dst: *mut u16,
    rows: usize,
    cols: usize,
    at: RowsAt,
    value: impl Fn(usize, usize) -> [f32; BF16_VECTOR],
) {
    // SAFETY: the caller's contract.
    unsafe { store_rows_v4(dst, rows, (cols, BF16_VECTOR), at, |r, c| pack_bf16x8(value(r, c))) }
}

/// Lanes of half a warp (the L2 norm's lanes per row), the rows a warp normalises per pass, and
/// the columns a half-warp's first 16-byte loads cover (its second ones start there).
const HALF_WARP: usize = LANES / 2;
const ROWS_PER_WARP_PASS: usize = LANES / HALF_WARP;
const HALF_WARP_COLUMNS: usize = HALF_WARP * F32_VECTOR;
const _: () = assert!(MAX_K <= 2 * HALF_WARP_COLUMNS && HALF_WARP_COLUMNS == MIN_DIM);

/// `x` summed over the lanes of each half of the warp (every lane gets its half's sum), by
/// butterfly shuffles.
///
/// # Safety
/// Every lane of the warp calls it together.
#[inline(always)]
unsafe fn half_warp_sum(mut x: f32) -> f32 {
    let mut mask = HALF_WARP as u32 / 2;
    while mask > 0 {
        // SAFETY: the warp is converged (the caller's contract); `mask` is below 16, so each
        // lane exchanges within its half.
        x += f32::from_bits(unsafe { shfl_xor(x.to_bits(), mask) });
        mask /= 2;
    }
    x
}

/// A lane's place in the `mma` fragments: `g = lane / 4`, `t = lane % 4`.
#[derive(Clone, Copy)]
struct Lane {
    g: usize,
    t: usize,
}

impl Lane {
    fn of(tid: usize) -> Self {
        let lane = tid % LANES;
        Self { g: lane / 4, t: lane % 4 }
    }

    /// This thread's index in the CTA, its warp and its place in the fragments.
    #[inline(always)]
    fn this_thread() -> (usize, usize, Self) {
        let tid = thread_idx_x();
        (tid, tid / LANES, Self::of(tid))
    }

    /// Row and column inside the 16 x 8 tile of accumulator element `e` (0..4).
    #[inline(always)]
    fn acc_at(self, e: usize) -> (usize, usize) {
        (self.g + 8 * (e / 2), 2 * self.t + e % 2)
    }
}

/// Half of TF32's unit in the last place, in the low bits of an f32: the tensor cores read the
/// 19 high bits of a TF32 operand and ignore the 13 below.
const TF32_HALF_ULP: u32 = 1 << 12;

/// `x` rounded to the nearest TF32 (ties away from zero) as `cvt.rna.tf32.f32` rounds a finite
/// value, in one integer add (the carry runs into the kept bits; the tensor cores ignore the low
/// ones): the conversion's check for infinities and NaNs costs two instructions per fragment
/// element on sm_90, and every operand here is finite and far below f32's largest value
/// (normalised keys and queries times decays of at most 1, `L`, the inverses and `[w | u]`).
#[inline(always)]
fn tf32(x: f32) -> u32 {
    x.to_bits().wrapping_add(TF32_HALF_ULP)
}

/// Which two depths of a k-step (`k0..k0 + 8`) a lane's two k slots (the fragment's `t` and
/// `t + 4`) hold. A product sums over its depth in any order so long as A and B agree, so each
/// product takes the order its tiles read without bank conflicts.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Depths {
    /// `k0 + 2 t` and `k0 + 2 t + 1`: one 8-byte load of a row, for tiles whose depth runs
    /// along their rows at `ROW_WORDS` (8 words apart mod 32 banks): A's rows, and the gated
    /// products' B, whose rows are their depth's columns.
    Adjacent,
    /// `k0 + t` and `k0 + t + 4`, the fragment's own order: two 4-byte loads, for tiles at a
    /// stride of 4 words mod 32 (the solve's `L` and inverses) and for a B read down its columns
    /// (the solve's right-hand side).
    Split,
}

impl Depths {
    /// The lane's first depth of the k-step at `k0`.
    #[inline(always)]
    fn first(self, k0: usize, l: Lane) -> usize {
        match self {
            Depths::Adjacent => k0 + 2 * l.t,
            Depths::Split => k0 + l.t,
        }
    }

    /// How far the lane's second depth lies past its first.
    #[inline(always)]
    fn apart(self) -> usize {
        match self {
            Depths::Adjacent => 1,
            Depths::Split => TILE_K / 2,
        }
    }
}

/// `acc[j] += A B_j` over depth `depth` (a multiple of `SUB`) for the warp's 16-row block and
/// its `N` n8 tiles (TF32), A's elements (m, k) and (m, k + apart) `a(m, k)` and B_j's (k, g)
/// and (k + apart, g) `b(k, j)` (`g` the lane's fragment column; `k` the lane's first depth of a
/// k-step and `apart` as `depths` says): A's fragment is read once per k-step for all of them.
/// `N` is a constant, so the accumulators stay in registers.
///
/// # Safety
/// The warp calls it together; the closures read only written shared memory.
#[inline(always)]
unsafe fn mma_tiles<const N: usize>(
    acc: &mut [[f32; 4]; N],
    depth: usize,
    lane: (Lane, Depths),
    a: impl Fn(usize, usize) -> [f32; 2],
    b: impl Fn(usize, usize) -> [f32; 2],
) {
    let mut sets = [*acc];
    // SAFETY: the caller's contract.
    unsafe { mma_sets(&mut sets, depth, lane, |m, k| [a(m, k)], b) };
    *acc = sets[0];
}

/// [`mma_tiles`] for `P` products that share their B: `acc[p][j] += A_p B_j`, `a(m, k)` giving
/// each product's A elements at once (so that what they share, a gated product's decays, is
/// formed once), each B fragment read once per k-step for all of them.
///
/// # Safety
/// As [`mma_tiles`].
#[inline(always)]
unsafe fn mma_sets<const P: usize, const N: usize>(
    acc: &mut [[[f32; 4]; N]; P],
    depth: usize,
    (l, depths): (Lane, Depths),
    a: impl Fn(usize, usize) -> [[f32; 2]; P],
    b: impl Fn(usize, usize) -> [f32; 2],
) {
    let g = l.g;
    let mut step = |k: usize| {
        let (upper, lower) = (a(g, k), a(g + 8, k));
        let af: [[u32; 4]; P] = core::array::from_fn(|p| [upper[p][0], lower[p][0], upper[p][1], lower[p][1]].map(tf32));
        for j in 0..N {
            let bf = b(k, j).map(tf32);
            for (acc, af) in acc.iter_mut().zip(&af) {
                // SAFETY: the warp is converged here (the caller's contract).
                unsafe { mma_m16n8k8_tf32(&mut acc[j], *af, bf) };
            }
        }
    };
    for k0 in (0..depth).step_by(MMA_UNROLL * TILE_K) {
        for u in 0..MMA_UNROLL {
            step(depths.first(k0 + u * TILE_K, l));
        }
    }
}

/// k-steps of [`mma_tiles`] per loop pass: every depth it takes is a multiple of `SUB` (the
/// solve's) or of 64 (a key dimension), so two passes of `TILE_K` halve the loop's counter,
/// branch and address steps.
const MMA_UNROLL: usize = SUB / TILE_K;

/// Every tile a product reads in pairs has an even row stride (and starts 8-byte aligned), so an
/// even column's pair is one aligned 8-byte (f32) or 4-byte (bf16) load.
const _: () = assert!(ROW_WORDS.is_multiple_of(2) && KEY_ROW.is_multiple_of(2));

/// f32 tile elements `(r, c)` and `(r, c + 1)` at `stride` words per row, in one 8-byte load.
///
/// # Safety
/// The elements lie inside the tile; `stride` and `c` are even.
#[inline(always)]
unsafe fn pair_at(tile: Shared<f32>, stride: usize, r: usize, c: usize) -> [f32; 2] {
    // SAFETY: see the function's contract (tiles start 8-byte aligned).
    unsafe { ld_shared_v2_f32(tile.add(r * stride + c).addr()) }
}

/// f32 tile element `(r, c)` at `stride` words per row.
///
/// # Safety
/// The element lies inside the tile.
#[inline(always)]
unsafe fn at(tile: Shared<f32>, stride: usize, r: usize, c: usize) -> f32 {
    // SAFETY: see the function's contract.
    unsafe { tile.add(r * stride + c).ld() }
}

/// A `[CHUNK][..]` tile of rows a gated product reads, element `(r, a)` as f32.
trait RowTile: Copy {
    /// Element `(r, a)`.
    ///
    /// # Safety
    /// The element lies inside the tile and is written.
    unsafe fn get(self, r: usize, a: usize) -> f32;

    /// Elements `(r, a)` and `(r, a + 1)`, `a` even, in one load.
    ///
    /// # Safety
    /// As [`RowTile::get`].
    unsafe fn pair(self, r: usize, a: usize) -> [f32; 2];
}

/// An f32 tile at `ROW_WORDS` words per row.
#[derive(Clone, Copy)]
struct F32Rows(Shared<f32>);

impl RowTile for F32Rows {
    #[inline(always)]
    unsafe fn get(self, r: usize, a: usize) -> f32 {
        // SAFETY: the caller's contract.
        unsafe { at(self.0, ROW_WORDS, r, a) }
    }

    #[inline(always)]
    unsafe fn pair(self, r: usize, a: usize) -> [f32; 2] {
        // SAFETY: the caller's contract (`ROW_WORDS` is even).
        unsafe { pair_at(self.0, ROW_WORDS, r, a) }
    }
}

/// A bf16 tile at `KEY_ROW` elements per row (the output kernel's keys: half the bytes, the
/// rounding FLA's own normalised keys have).
#[derive(Clone, Copy)]
struct Bf16Rows(Shared<u16>);

impl RowTile for Bf16Rows {
    #[inline(always)]
    unsafe fn get(self, r: usize, a: usize) -> f32 {
        // SAFETY: the caller's contract.
        unsafe { bf16_to_f32(self.0.add(r * KEY_ROW + a).ld()) }
    }

    #[inline(always)]
    unsafe fn pair(self, r: usize, a: usize) -> [f32; 2] {
        // SAFETY: the caller's contract (`KEY_ROW` and `a` even: 4-byte aligned).
        let both: u32 = unsafe { self.0.add(r * KEY_ROW + a).cast::<u32>().ld() };
        [bf16_to_f32(both as u16), bf16_to_f32((both >> 16) as u16)]
    }
}

/// A `[CHUNK][CHUNK]` matrix a gated product writes, element `(r, s)`.
trait MatrixTile: Copy {
    /// Stores `v` at `(r, s)` and `(r, s + 1)`, `s` even.
    ///
    /// # Safety
    /// The elements lie inside the tile.
    unsafe fn put_pair(self, r: usize, s: usize, v: [f32; 2]);
}

/// An f32 matrix at `MATRIX_ROW_WORDS` words per row (the prepare kernel's `L`, which the solve
/// reads in f32).
#[derive(Clone, Copy)]
struct F32Matrix(Shared<f32>);

impl MatrixTile for F32Matrix {
    #[inline(always)]
    unsafe fn put_pair(self, r: usize, s: usize, v: [f32; 2]) {
        // SAFETY: the caller's contract (`MATRIX_ROW_WORDS` and `s` even: 8-byte aligned).
        unsafe { st_shared_v2_f32(self.0.add(r * MATRIX_ROW_WORDS + s).addr(), v) }
    }
}

/// A bf16 matrix at `ATTENTION_ROW` elements per row (the output kernel's causal attention:
/// rounded to bf16 before its product with `v_new`, as FLA rounds it, in half the bytes).
#[derive(Clone, Copy)]
struct Bf16Matrix(Shared<u16>);

impl MatrixTile for Bf16Matrix {
    #[inline(always)]
    unsafe fn put_pair(self, r: usize, s: usize, v: [f32; 2]) {
        // SAFETY: the caller's contract (`ATTENTION_ROW` and `s` even: 4-byte aligned).
        unsafe { st_shared_u32(self.0.add(r * ATTENTION_ROW + s).addr(), pack_bf16x2(v[0], v[1])) }
    }
}

/// A chunk's rows of a `[T, HV, CHUNK]` bf16 tensor in global memory, written straight from the
/// product's accumulators (the fused prepare kernel's causal attention, which has no tile of its
/// own: `L`'s is formed in the same pass). Rows past `rows` are not written.
#[derive(Clone, Copy)]
struct GlobalBf16Matrix {
    out: *mut u16,
    at: RowsAt,
    rows: usize,
}

impl MatrixTile for GlobalBf16Matrix {
    #[inline(always)]
    unsafe fn put_pair(self, r: usize, s: usize, v: [f32; 2]) {
        if r < self.rows {
            // SAFETY: the caller's contract: row `r` is a valid row of the chunk, which the
            // tensor holds from `at.at(r)` (4-byte aligned: `CHUNK` and `s` even).
            unsafe { *self.out.add(self.at.at(r) + s).cast::<u32>() = pack_bf16x2(v[0], v[1]) };
        }
    }
}

/// One gated product of [`gated_products`]: its rows `x` (`x[r] exp(G[r])`), the tile it writes,
/// whether it stops below the diagonal (`strict`) and the scale of its rows.
#[derive(Clone, Copy)]
struct Gated<X, M, F> {
    x: X,
    out: M,
    strict: bool,
    row_scale: F,
}

/// `P` gated products formed in one pass over their shared `y` rows and gate ([`gated_products`]):
/// their A fragments' decays and their B fragments are formed once for all of them.
trait Products<const P: usize>: Copy {
    /// Elements `(r, a)` and `(r, a + 1)` of each product's `x`, `a` even.
    ///
    /// # Safety
    /// As [`RowTile::pair`].
    unsafe fn x_pairs(self, r: usize, a: usize) -> [[f32; 2]; P];

    /// Product `p`'s gated sum at `(r, s)` element by element ([`gated_dot`]).
    ///
    /// # Safety
    /// As [`gated_dot`].
    unsafe fn dot(self, p: usize, r: usize, y: impl RowTile, s: usize, g: Gates, kd: usize) -> f32;

    /// Whether product `p` stops below the diagonal.
    fn strict(self, p: usize) -> bool;

    /// Product `p`'s scale of row `r`.
    ///
    /// # Safety
    /// Whatever the product's scale reads is written.
    unsafe fn row_scale(self, p: usize, r: usize) -> f32;

    /// Product `p`'s `(r, s)` and `(r, s + 1)`: `v`.
    ///
    /// # Safety
    /// As [`MatrixTile::put_pair`].
    unsafe fn put_pair(self, p: usize, r: usize, s: usize, v: [f32; 2]);
}

impl<X: RowTile, M: MatrixTile, F: Fn(usize) -> f32 + Copy> Products<1> for Gated<X, M, F> {
    #[inline(always)]
    unsafe fn x_pairs(self, r: usize, a: usize) -> [[f32; 2]; 1] {
        // SAFETY: the caller's contract.
        [unsafe { self.x.pair(r, a) }]
    }

    #[inline(always)]
    unsafe fn dot(self, _: usize, r: usize, y: impl RowTile, s: usize, g: Gates, kd: usize) -> f32 {
        // SAFETY: the caller's contract.
        unsafe { gated_dot(self.x, r, y, s, g, kd) }
    }

    #[inline(always)]
    fn strict(self, _: usize) -> bool {
        self.strict
    }

    #[inline(always)]
    unsafe fn row_scale(self, _: usize, r: usize) -> f32 {
        (self.row_scale)(r)
    }

    #[inline(always)]
    unsafe fn put_pair(self, _: usize, r: usize, s: usize, v: [f32; 2]) {
        // SAFETY: the caller's contract.
        unsafe { self.out.put_pair(r, s, v) }
    }
}

/// Two products in one pass: each element's own [`Products<1>`], product `p` the `p`-th.
impl<A: Products<1>, B: Products<1>> Products<2> for (A, B) {
    #[inline(always)]
    unsafe fn x_pairs(self, r: usize, a: usize) -> [[f32; 2]; 2] {
        // SAFETY: the caller's contract.
        unsafe { [self.0.x_pairs(r, a)[0], self.1.x_pairs(r, a)[0]] }
    }

    #[inline(always)]
    unsafe fn dot(self, p: usize, r: usize, y: impl RowTile, s: usize, g: Gates, kd: usize) -> f32 {
        // SAFETY: the caller's contract.
        unsafe { if p == 0 { self.0.dot(0, r, y, s, g, kd) } else { self.1.dot(0, r, y, s, g, kd) } }
    }

    #[inline(always)]
    fn strict(self, p: usize) -> bool {
        if p == 0 { self.0.strict(0) } else { self.1.strict(0) }
    }

    #[inline(always)]
    unsafe fn row_scale(self, p: usize, r: usize) -> f32 {
        // SAFETY: the caller's contract.
        unsafe { if p == 0 { self.0.row_scale(0, r) } else { self.1.row_scale(0, r) } }
    }

    #[inline(always)]
    unsafe fn put_pair(self, p: usize, r: usize, s: usize, v: [f32; 2]) {
        // SAFETY: the caller's contract.
        unsafe { if p == 0 { self.0.put_pair(0, r, s, v) } else { self.1.put_pair(0, r, s, v) } }
    }
}

/// The chunk's rows of head `head` of a `[T, heads, kd]` bf16 tensor (`k` or `q`), their loads
/// issued ([`put_rows`] stores them).
///
/// # Safety
/// The valid rows exist in `src`, 16-byte aligned.
#[inline(always)]
unsafe fn fetch_rows(src: *const u16, w: &Work, heads: usize, head: usize, kd: usize) -> Fetched<ROW_VECTORS> {
    // SAFETY: see the function's contract; `kd <= MAX_K`, so `ROW_VECTORS` cover the rows.
    unsafe { Fetched::bf16(src, (CHUNK, w.rows), kd, RowsAt::heads(w, heads, head, kd)) }
}

/// Element `i` of a token input given in f32, or in bf16 when `bf16` (`g` and `beta`: the
/// `OPT_GATE_BF16` and `OPT_BETA_BF16` options), as f32.
///
/// # Safety
/// Element `i` exists in `src` read as its dtype.
#[inline(always)]
pub(crate) unsafe fn load_float(src: *const f32, i: usize, bf16: bool) -> f32 {
    // SAFETY: see the function's contract.
    unsafe { if bf16 { bf16_to_f32(*src.cast::<u16>().add(i)) } else { *src.add(i) } }
}

/// The chunk's rows of value head `w.i` of a `[T, HV, gate_width]` gate (f32, or bf16 when
/// `bf16`), their loads issued: a per-key gate's rows 4 columns per thread (the layout its
/// activation takes; 16 bytes a row in f32, 8 in bf16, [`Gates::put`] converts them), a
/// per-head gate's row `tid` in one register (zero past the valid rows; no rows fetched).
///
/// # Safety
/// The valid rows exist in `g` read as its dtype, a per-key gate's 16-byte aligned in f32 and
/// 8-byte aligned in bf16.
#[inline(always)]
unsafe fn fetch_gate(g: *const f32, w: &Work, d: &Dims, bf16: bool) -> (Fetched<GATE_VECTORS>, f32) {
    let (gw, tid) = (d.gate_width, thread_idx_x());
    let at = RowsAt::heads(w, d.value_heads, w.i, gw);
    // SAFETY: see the function's contract; `gw <= MAX_K`, so `GATE_VECTORS` cover the rows.
    unsafe {
        if d.per_key_gate() {
            let rows = (w.rows, w.rows);
            let fetched = if bf16 {
                Fetched::issue_half(g.cast::<u16>(), rows, (gw, F32_VECTOR), at)
            } else {
                Fetched::issue(g, rows, (gw, F32_VECTOR), at)
            };
            (fetched, 0.0)
        } else {
            (Fetched::none(), if tid < w.rows { load_float(g, at.at(tid), bf16) } else { 0.0 })
        }
    }
}

/// The rows this lane's half-warp normalises: two rows per warp and pass (the first half-warp the
/// even one), up to `rows`, counted in 32 bits.
#[inline(always)]
fn half_warp_rows(rows: usize) -> impl Iterator<Item = usize> {
    let warp = thread_idx_x() / LANES;
    let first = ROWS_PER_WARP_PASS as u32 * warp as u32;
    (first..rows as u32).step_by(THREADS / LANES * ROWS_PER_WARP_PASS).map(|r| r as usize)
}

/// `1 / sqrt(sum + eps)` of a row's squares, `squares` being this lane's share of them and the
/// row its half-warp's ([`half_warp_rows`]).
///
/// # Safety
/// Every lane of the warp calls it together.
#[inline(always)]
unsafe fn inverse_norm(squares: f32) -> f32 {
    // SAFETY: the caller's contract.
    rsqrt_approx(unsafe { half_warp_sum(squares) } + L2NORM_EPS)
}

/// [`fetch_rows`]' rows into `dst` (`[CHUNK][ROW_WORDS]` f32), each row divided by its L2 norm
/// when `l2norm`; rows past the valid ones are zeros. Ends with the CTA synchronised.
///
/// # Safety
/// The CTA calls it together; `dst` is a free tile.
#[inline(always)]
unsafe fn put_rows(dst: Shared<f32>, rows: &Fetched<ROW_VECTORS>, w: &Work, kd: usize, l2norm: bool) {
    let tid = thread_idx_x();
    // SAFETY (block): rows `< CHUNK` of the tile, columns `< kd <= MAX_K`.
    unsafe {
        rows.store(|r, a, words| set_row8(dst, r, a, unpack_bf16x8(words)));
        sync_threads();
        if l2norm {
            // Half a warp per row, two rows per warp at a time: each lane its 4 columns from
            // `4 (lane % 16)` and, at `K = 128`, the 4 from `64` past them, one or two 16-byte
            // loads (a row is two loads per lane of its half: `MAX_K <= 2 * 64`; each
            // quarter-warp's 16-byte accesses contiguous), the squares summed across the half by
            // shuffles. The first 64 columns are always keys (`MIN_DIM`). Rows past the valid ones
            // are zeros and stay zeros. 32-bit row counter; the two widths' loops apart.
            let lane = tid % LANES;
            let first = dst.add(lane / HALF_WARP * ROW_WORDS + lane % HALF_WARP * F32_VECTOR);
            let normalise = |both: bool| {
                for r in half_warp_rows(w.rows) {
                    let (at, zero) = (first.add(r * ROW_WORDS), [0.0; F32_VECTOR]);
                    let x = ld_shared_v4(at.addr()).map(f32::from_bits);
                    let y = if both { ld_shared_v4(at.add(HALF_WARP_COLUMNS).addr()).map(f32::from_bits) } else { zero };
                    let sum = x.iter().chain(y.iter()).fold(0.0, |sum, &x| fma_f32(x, x, sum));
                    let inverse = inverse_norm(sum);
                    st_shared_v4(at.addr(), x.map(|x| (x * inverse).to_bits()));
                    if both {
                        st_shared_v4(at.add(HALF_WARP_COLUMNS).addr(), y.map(|x| (x * inverse).to_bits()));
                    }
                }
            };
            if kd > HALF_WARP_COLUMNS {
                normalise(true);
            } else {
                normalise(false);
            }
            sync_threads();
        }
    }
}

/// [`fetch_rows`]' rows into `dst` (`[CHUNK][KEY_ROW]` bf16: exact, the rows being bf16), each
/// row then divided by its L2 norm when `l2norm` (rounded to bf16 once, as FLA's normalised
/// queries are); rows past the valid ones are zeros. Ends with the CTA synchronised.
///
/// # Safety
/// The CTA calls it together; `dst` is a free tile.
#[inline(always)]
unsafe fn put_rows_bf16(dst: Shared<u16>, rows: &Fetched<ROW_VECTORS>, w: &Work, kd: usize, l2norm: bool) {
    let tid = thread_idx_x();
    // SAFETY (block): rows `< CHUNK` of the tile (16-byte aligned: `KEY_ROW`), columns `< kd`.
    unsafe {
        rows.store(|r, a, words| st_shared_v4(dst.add(r * KEY_ROW + a).addr(), words));
        sync_threads();
        if l2norm {
            // Half a warp per row, two rows per warp at a time, as `put_rows`: each lane `kd / 16`
            // elements (8 at K = 128, one 16-byte access; 4 at K = 64, 8 bytes), the squares
            // summed across the half by shuffles. 32-bit row counter; the two widths apart.
            let lane = tid % LANES;
            let first = dst.add(lane / HALF_WARP * KEY_ROW + lane % HALF_WARP * (kd / HALF_WARP));
            let normalise = |wide: bool| {
                for r in half_warp_rows(w.rows) {
                    let at = first.add(r * KEY_ROW).addr();
                    let words = if wide {
                        ld_shared_v4(at)
                    } else {
                        let [x, y] = ld_shared_v2_f32(at);
                        [x.to_bits(), y.to_bits(), 0, 0]
                    };
                    let x = unpack_bf16x8(words);
                    let sum = x.iter().fold(0.0, |sum, &x| fma_f32(x, x, sum));
                    let inverse = inverse_norm(sum);
                    let y = pack_bf16x8(x.map(|x| x * inverse));
                    if wide {
                        st_shared_v4(at, y);
                    } else {
                        st_shared_v2_f32(at, [f32::from_bits(y[0]), f32::from_bits(y[1])]);
                    }
                }
            };
            if kd > HALF_WARP_COLUMNS {
                normalise(true);
            } else {
                normalise(false);
            }
            sync_threads();
        }
    }
}

/// Zeros into the sub-blocks above the diagonal of the chunk's valid rows of `out` (`[T, HV,
/// CHUNK]` bf16, value head `w.i` of `hv`): the causal attention's part that no product forms
/// (the diagonal sub-blocks' upper halves are formed as zeros), so that a product over every
/// column adds nothing past the diagonal.
///
/// # Safety
/// The chunk's valid rows exist in `out`, 16-byte aligned.
#[inline(always)]
unsafe fn zero_attention_above_diagonal(out: *mut u16, w: &Work, hv: usize) {
    let at = RowsAt::heads(w, hv, w.i, CHUNK);
    let RowWalk { r0, col: c, step, first, jump } = at.walk(CHUNK, BF16_VECTOR);
    let mut to = out.wrapping_add(first);
    let mut r = r0;
    while r < w.rows as u32 {
        if c >= (r as usize / SUB + 1) * SUB {
            // SAFETY: see the function's contract (`r` is a valid row).
            unsafe { st_global_v4(to, [0; 4]) };
        }
        r += step;
        to = to.wrapping_add(jump);
    }
}

/// The tile of `G` (`[CHUNK][ROW_WORDS]` f32, in log2: `exp2` of a difference is the decay,
/// without a multiply by `log2(e)` per element) and how to read it.
#[derive(Clone, Copy)]
struct Gates {
    tile: Shared<f32>,
    per_key: bool,
}

impl Gates {
    /// `G` at row `r`, key `a` (column 0 for a per-head gate).
    ///
    /// # Safety
    /// Row `r < CHUNK` of the tile is written.
    #[inline(always)]
    unsafe fn at(self, r: usize, a: usize) -> f32 {
        let col = if self.per_key { a } else { 0 };
        // SAFETY: see the function's contract.
        unsafe { self.tile.add(r * ROW_WORDS + col).ld() }
    }

    /// `G` at row `r`, keys `a` and `a + 1` (`a` even; a per-key gate's, in one 8-byte load).
    ///
    /// # Safety
    /// As [`Gates::at`]; the gate is per key.
    #[inline(always)]
    unsafe fn pair(self, r: usize, a: usize) -> [f32; 2] {
        // SAFETY: see the function's contract (`ROW_WORDS` is even).
        unsafe { pair_at(self.tile, ROW_WORDS, r, a) }
    }

    /// [`fetch_gate`]'s values into the tile as they were read: a per-key gate's rows (each
    /// thread its own 4 columns of its rows, converted from bf16 when `bf16`), or a per-head
    /// gate's row `tid` (threads below `rows`). Each thread stores the elements [`fetch_gate`]
    /// gave it, so it may read them back (to activate them) without a barrier.
    ///
    /// # Safety
    /// `fetched` and `head` are this thread's from [`fetch_gate`] (with the same `bf16`) on a
    /// chunk of `rows` valid rows.
    #[inline(always)]
    unsafe fn put(self, (fetched, head): &(Fetched<GATE_VECTORS>, f32), rows: usize, bf16: bool) {
        let tid = thread_idx_x();
        // SAFETY: see the function's contract; rows below `rows <= CHUNK`.
        unsafe {
            if bf16 {
                // Four bf16 in the first two words (`Fetched::issue_half`).
                fetched.store(|r, a, w| set_row4(self.tile, r, a, unpack4([w[0], w[1]])));
            } else {
                fetched.store(|r, a, words| set_row4(self.tile, r, a, words.map(f32::from_bits)));
            }
            if !self.per_key && tid < rows {
                self.tile.add(tid * ROW_WORDS).st(*head);
            }
        }
    }

    /// `x`, elements `a..a + 8` of row `r`, times their decay `exp2(G)`: each key's (`per_key`)
    /// or the row's. `per_key` is `self.per_key`, given by the caller as a constant of its loop
    /// (the gate's kind chosen once, outside the loop): the output kernel's `q Γ`.
    ///
    /// # Safety
    /// As [`Gates::at`].
    #[inline(always)]
    unsafe fn decay8(self, per_key: bool, r: usize, a: usize, x: [f32; BF16_VECTOR]) -> [f32; BF16_VECTOR] {
        // SAFETY: the caller's contract.
        unsafe {
            if per_key {
                let gate = row8(self.tile, r, a);
                core::array::from_fn(|j| x[j] * exp2(gate[j]))
            } else {
                let decay = exp2(self.at(r, 0));
                x.map(|x| x * decay)
            }
        }
    }

    /// Rows past the valid ones take the last valid row's `G` (no decay of their own). Ends
    /// with the CTA synchronised.
    ///
    /// # Safety
    /// The CTA calls it together; rows `< rows` are written.
    #[inline(always)]
    unsafe fn pad(self, rows: usize, gw: usize) {
        let tid = thread_idx_x();
        // SAFETY (block): rows `< CHUNK`, columns `< gw <= MAX_K`.
        unsafe {
            for e in strided(tid, (CHUNK - rows) * gw) {
                let (r, a) = split(e, gw);
                self.tile.add((rows + r) * ROW_WORDS + a).st(self.tile.add((rows - 1) * ROW_WORDS + a).ld());
            }
            sync_threads();
        }
    }
}

/// `sum_a x[r][a] y[s][a] exp(G[r][a] - G[s][a])` element by element (for the diagonal
/// sub-blocks).
///
/// # Safety
/// Rows `r` and `s` of the tiles are written.
#[inline(always)]
unsafe fn gated_dot(x: impl RowTile, r: usize, y: impl RowTile, s: usize, g: Gates, kd: usize) -> f32 {
    let mut acc = 0.0;
    // SAFETY (block): see the function's contract.
    unsafe {
        if g.per_key {
            for a in 0..kd {
                let decay = exp2(g.at(r, a) - g.at(s, a));
                acc = fma_f32(x.get(r, a) * y.get(s, a), decay, acc);
            }
        } else {
            for a in 0..kd {
                acc = fma_f32(x.get(r, a), y.get(s, a), acc);
            }
            acc *= exp2(g.at(r, 0) - g.at(s, 0));
        }
    }
    acc
}

/// The largest exponent (log2) a factor of a diagonal sub-block's product may take: `2^115`
/// stays far below f32's largest value (`2^128`), even summed over `MAX_K` (`2^7`) products.
const SAFE_EXPONENT: f32 = 115.0;

/// Units of work of [`gated_products`] below the diagonal, one warp each, as (row block, first
/// column, n8 tiles): the last row block's sub-blocks left of its diagonal in two halves of 3
/// tiles, then row blocks 2 and 1 whole (4 and 2 tiles); the four diagonal sub-blocks (2 tiles
/// each) follow. A unit's A fragment and its exponentials are formed once per k-step for all its
/// tiles, so the last row block in one unit saved one A pass but kept its warp on 6 tiles while
/// warp 7 idled; in halves no warp takes more than 4.
const LOWER_UNITS: usize = 4;
const PRODUCT_UNITS: usize = LOWER_UNITS + SUBS;
const _: () = assert!(PRODUCT_UNITS == THREADS / LANES && SUBS == 4);

/// Lower unit `unit`'s (row block, first column, n8 tiles); [`LOWER_UNITS`] says why.
#[inline(always)]
fn lower_unit(unit: usize) -> (usize, usize, usize) {
    match unit {
        0 => (3, 0, 3),
        1 => (3, 3 * TILE_N, 3),
        2 => (2, 0, 4),
        _ => (1, 0, 2),
    }
}

/// One factored unit of [`gated_products`]: rows `r0..r0 + SUB`, columns from `s0`, the factors
/// taken at row `f`; a diagonal sub-block keeps `s <= r` (`s < r` where a product is `strict`).
#[derive(Clone, Copy)]
struct UnitTiles {
    r0: usize,
    s0: usize,
    f: usize,
    diagonal: bool,
    l: Lane,
}

impl UnitTiles {
    /// The unit's `N` n8 tiles of each of the `P` gated products into its tile, each row times
    /// the product's `row_scale(r)`: the decays of A's rows and the B fragments formed once for
    /// all the products.
    ///
    /// # Safety
    /// As [`gated_products`]; the warp calls it together.
    #[inline(always)]
    unsafe fn product<const N: usize, const P: usize>(self, products: impl Products<P>, y: impl RowTile, g: Gates, kd: usize) {
        let Self { r0, s0, f, diagonal, l } = self;
        let mut acc = [[[0.0f32; 4]; N]; P];
        // SAFETY (block): every index below `CHUNK` rows and `kd` or `CHUNK` columns (the
        // caller's); the warp is converged.
        unsafe {
            if g.per_key {
                // A's rows and B's columns are rows of the tiles, two adjacent keys each.
                mma_sets(
                    &mut acc,
                    kd,
                    (l, Depths::Adjacent),
                    |m, a| {
                        let (gr, gf) = (g.pair(r0 + m, a), g.pair(f, a));
                        let decay = [exp2(gr[0] - gf[0]), exp2(gr[1] - gf[1])];
                        products.x_pairs(r0 + m, a).map(|v| [v[0] * decay[0], v[1] * decay[1]])
                    },
                    |a, j| {
                        let n = TILE_N * j + l.g;
                        let (v, gs, gf) = (y.pair(s0 + n, a), g.pair(s0 + n, a), g.pair(f, a));
                        [v[0] * exp2(gf[0] - gs[0]), v[1] * exp2(gf[1] - gs[1])]
                    },
                );
            } else {
                mma_sets(&mut acc, kd, (l, Depths::Adjacent), |m, a| products.x_pairs(r0 + m, a), |a, j| {
                    y.pair(s0 + TILE_N * j + l.g, a)
                });
            }
            for (p, acc) in acc.iter().enumerate() {
                let strict = products.strict(p);
                for (j, acc) in acc.iter().enumerate() {
                    // A lane's accumulator pairs: (row g, columns 2t and 2t + 1), then row g + 8.
                    for half in 0..2 {
                        let (m, n) = l.acc_at(2 * half);
                        let (r, s) = (r0 + m, s0 + TILE_N * j + n);
                        let scale = products.row_scale(p, r);
                        let value = core::array::from_fn(|e| {
                            let s = s + e;
                            let kept = !diagonal || if strict { s < r } else { s <= r };
                            if !kept {
                                0.0
                            } else {
                                let decay = if g.per_key { 1.0 } else { exp2(g.at(r, 0) - g.at(s, 0)) };
                                acc[2 * half + e] * decay * scale
                            }
                        });
                        products.put_pair(p, r, s, value);
                    }
                }
            }
        }
    }
}

/// The gated products `sum_a x[r][a] y[s][a] exp(G[r][a] - G[s][a])` of the chunk, `P` of them
/// over the same `y` rows and gate (each its own `x`, tile, diagonal and row scale:
/// [`Products`]), each element times its product's `row_scale(r)`, on the tensor cores: a
/// sub-block pair below the diagonal factored through the first row `f` of the lower block (both
/// factors at most 1), a diagonal sub-block through its middle row `m` when no key's gate moves
/// more than `SAFE_EXPONENT` between `m` and the block's ends (else element by element), keeping
/// `s <= r` (`s < r` when `strict`) and zeros above it inside the diagonal sub-blocks. The
/// sub-blocks above the diagonal are left unwritten: no product reads them (the solve's `L_b,<b`
/// and the output's attention by `v_new` stop at the row block's own diagonal sub-block; the
/// fused prepare kernel writes their zeros apart). Ends with the CTA synchronised.
///
/// # Safety
/// The CTA calls it together; the `x` tiles, `y` and the gate tile have all `CHUNK` rows written.
#[inline(always)]
unsafe fn gated_products<const P: usize>(
    products: impl Products<P>,
    y: impl RowTile,
    g: Gates,
    kd: usize,
    diagonal_then: impl Fn(usize),
) {
    let (_, warp, l) = Lane::this_thread();
    // SAFETY (block): every index below `CHUNK` rows and `kd` or `CHUNK` columns; each unit is
    // one warp's, converged.
    unsafe {
        if warp < PRODUCT_UNITS {
            let unit = warp;
            // The unit's rows, its first column, the row its factors are taken at and its n8
            // tiles: sub-blocks left of a row block's diagonal ([`lower_unit`]), or a diagonal
            // sub-block.
            let (r0, s0, f, diagonal, tiles) = if unit < LOWER_UNITS {
                let (rb, s0, tiles) = lower_unit(unit);
                (rb * SUB, s0, rb * SUB, false, tiles)
            } else {
                let b = unit - LOWER_UNITS;
                (b * SUB, b * SUB, b * SUB + SUB / 2, true, SUB / TILE_N)
            };
            let factored = !diagonal || !g.per_key || {
                // Whether any key's gate moves more than SAFE_EXPONENT from the middle row to
                // either end of the block (G falls down the block).
                let mut far = false;
                for a in (l.g * 4 + l.t..kd).step_by(LANES) {
                    far |=
                        g.at(r0, a) - g.at(f, a) > SAFE_EXPONENT || g.at(f, a) - g.at(r0 + SUB - 1, a) > SAFE_EXPONENT;
                }
                !vote_any(far)
            };
            if factored {
                // The unit's n8 tiles at once: the A fragments (and their exponentials) read
                // once per k-step for all of them.
                let unit_tiles = UnitTiles { r0, s0, f, diagonal, l };
                match tiles {
                    2 => unit_tiles.product::<2, P>(products, y, g, kd),
                    3 => unit_tiles.product::<3, P>(products, y, g, kd),
                    _ => unit_tiles.product::<4, P>(products, y, g, kd),
                }
            } else {
                for p in 0..P {
                    let strict = products.strict(p);
                    for e in (2 * (l.g * 4 + l.t)..SUB * SUB).step_by(2 * LANES) {
                        let (m, n) = split(e, SUB);
                        let (r, s) = (r0 + m, s0 + n);
                        let scale = products.row_scale(p, r);
                        let value = core::array::from_fn(|e| {
                            let s = s + e;
                            let kept = if strict { s < r } else { s <= r };
                            if kept { products.dot(p, r, y, s, g, kd) * scale } else { 0.0 }
                        });
                        products.put_pair(p, r, s, value);
                    }
                }
            }
            if diagonal {
                // The warp's own sub-block is complete once its lanes' stores are ordered.
                sync_warp();
                diagonal_then(unit - LOWER_UNITS);
            }
        }
        sync_threads();
    }
}
