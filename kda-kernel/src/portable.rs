//! The portable tensor-core kernel (sm_80+): one CTA per sequence, value head and block of `BV`
//! value columns, the CTA walking the sequence's chunks in order, both products of a chunk on
//! `mma.sync.m16n8k16` in bf16 with f32 accumulation. It runs the whole generalized contract
//! (docs/CONTRACT.md#the-generalized-recurrence): the scalar gate `g`, the per-key gate `gk`,
//! both or neither; grouped value heads; `K` in 64, 128, 256 (one entry each) and any `V` that is
//! a multiple of `BV`; key-first or value-first states; a token and a head stride per tensor.
//!
//! Each of the four warps keeps `K / 4` rows of the `[K][BV]` state as accumulator fragments.
//! Per chunk (`layout::portable::Tiles` has the shared tiles):
//!
//! 1. `stage_chunk`: `bf16(S)` to `h` and, transposed, to shared memory; the chunk's `w` rows
//!    as they are and its `k` rows transposed (rows past the chunk's end zero-filled); the
//!    state's decay over the chunk per key row (`exp2` of the last valid gate rows) and, with the
//!    scalar gate, each token's `exp2(g[last] - g[t])`.
//! 2. `corrected_values`: `Vn = u - w @ bf16(S)`, each warp 16 token rows; `bf16(Vn)` to
//!    `v_new` (valid rows) and, scaled by the token's factor when there is a scalar gate,
//!    transposed to shared memory (zeros past the end).
//! 3. `update_state`: `S = decay * S + k^T @ bf16(Vn)`; the zero rows past the end add nothing.
//!
//! All offsets are 64-bit. Every fragment register is one 32-bit shared load.

use crate::abi::StateLayoutCode;
use crate::arch::sm80::{
    bf16_to_f32, block_idx_x, exp2_approx, ld_shared_f32, ld_shared_u32, mma_m16n8k16_bf16, pack_bf16x2,
    smem_base_shared, st_shared_f32, st_shared_u16, st_shared_u32, sync_threads, thread_idx_x, thread_idx_x_fresh,
};
use crate::layout::portable::{
    BV, KT_STRIDE, MMA_K, MMA_M, MMA_N, N_TILES, Place, STATE_K_STEPS, THREADS, Tiles, VECTOR, VN_ROWS_PER_WARP,
    VNT_STRIDE,
};
use crate::layout::{CHUNK, DESC_CHUNK_START, DESC_LEN, DESC_TOKEN_START, SEQ_DESC_WORDS};

/// The state fragments of one warp: `[m16 tile][n8 tile][4]` (`mma_m16n8k16_bf16`'s `acc`).
type State<const MT: usize> = [[[f32; 4]; N_TILES]; MT];

/// A token-major tensor's row addressing: element offset of (token, head) is
/// `token * token_stride + head * head_stride` (`kda::Strides`, packed or a slice of a wider row).
#[derive(Clone, Copy)]
struct Rows {
    token: usize,
    head: usize,
}

impl Rows {
    fn new(token: u32, head: u32) -> Self {
        Self { token: token as usize, head: head as usize }
    }

    /// The element offset of `head`'s row of `token`.
    fn at(self, token: usize, head: usize) -> usize {
        token * self.token + head * self.head
    }
}

/// A launch's arguments (`abi::PORTABLE_PARAMS`).
struct Args {
    k: *const u16,
    w: *const u16,
    u: *const u16,
    g: *const f32,
    gk: *const f32,
    h0: *const f32,
    h: *mut u16,
    v_new: *mut u16,
    ht: *mut f32,
    seqs: *const i64,
    heads: usize,
    key_heads: usize,
    value_dim: usize,
    value_first: bool,
    k_rows: Rows,
    w_rows: Rows,
    u_rows: Rows,
    g_rows: Rows,
    gk_rows: Rows,
    v_new_rows: Rows,
}

/// Declares the portable kernel's entry for one key size (`abi::PORTABLE_ENTRIES`).
macro_rules! portable_entry {
    ($(#[$doc:meta])* $name:ident, $key:literal, $tiles:literal) => {
        kernel_entry! {
            $(#[$doc])*
            ///
            /// Grid: `N * HV * V / BV` CTAs, sequence-major then value head; `THREADS` threads;
            /// `layout::portable::smem_bytes(K)` of dynamic shared memory.
            ///
            /// # Safety
            /// Every pointer addresses a buffer of the contract's size for the plan in `seqs`
            /// (`SEQ_DESC_WORDS` `i64` per sequence), `heads` value heads of `key_heads` key heads
            /// and `value_dim` value columns, rows at the given strides, 16-byte aligned rows of
            /// `k`, `w`, `u` and `v_new`; a gate pointer is null exactly when that gate is absent;
            /// the launch has the grid, block and shared memory above; the outputs overlap nothing.
            pub unsafe fn $name(
                k: *const u16,
                w: *const u16,
                u: *const u16,
                g: *const f32,
                gk: *const f32,
                h0: *const f32,
                h: *mut u16,
                v_new: *mut u16,
                ht: *mut f32,
                seqs: *const i64,
                heads: u32,
                key_heads: u32,
                value_dim: u32,
                state_layout: u32,
                k_token_stride: u32,
                k_head_stride: u32,
                w_token_stride: u32,
                w_head_stride: u32,
                u_token_stride: u32,
                u_head_stride: u32,
                g_token_stride: u32,
                g_head_stride: u32,
                gk_token_stride: u32,
                gk_head_stride: u32,
                v_new_token_stride: u32,
                v_new_head_stride: u32,
            ) {
                let args = Args {
                    k,
                    w,
                    u,
                    g,
                    gk,
                    h0,
                    h,
                    v_new,
                    ht,
                    seqs,
                    heads: heads as usize,
                    key_heads: key_heads as usize,
                    value_dim: value_dim as usize,
                    value_first: state_layout == StateLayoutCode::ValueFirst as u32,
                    k_rows: Rows::new(k_token_stride, k_head_stride),
                    w_rows: Rows::new(w_token_stride, w_head_stride),
                    u_rows: Rows::new(u_token_stride, u_head_stride),
                    g_rows: Rows::new(g_token_stride, g_head_stride),
                    gk_rows: Rows::new(gk_token_stride, gk_head_stride),
                    v_new_rows: Rows::new(v_new_token_stride, v_new_head_stride),
                };
                // SAFETY: the entry's contract is `recurrence`'s.
                unsafe { recurrence::<$key, $tiles>(&args) }
            }
        }
    };
}

portable_entry!(
    /// The portable tensor-core recurrence at `K = 64` (`abi::PORTABLE_K64`).
    kda_fwd_h_portable_k64,
    64,
    1
);
portable_entry!(
    /// The portable tensor-core recurrence at `K = 128` (`abi::PORTABLE`).
    kda_fwd_h_portable,
    128,
    2
);
portable_entry!(
    /// The portable tensor-core recurrence at `K = 256` (`abi::PORTABLE_K256`).
    kda_fwd_h_portable_k256,
    256,
    4
);

/// Shared addresses of the tiles (`layout::portable::Tiles`).
#[derive(Clone, Copy)]
struct Smem {
    w: u32,
    kt: u32,
    st: u32,
    vnt: u32,
    decay: u32,
    scale: u32,
}

impl Smem {
    fn carve<const K: usize, const MT: usize>() -> Self {
        let base = smem_base_shared();
        let at = |offset: usize| base + offset as u32;
        Self {
            w: at(Tiles::<K, MT>::W_OFFSET),
            kt: at(Tiles::<K, MT>::KT_OFFSET),
            st: at(Tiles::<K, MT>::ST_OFFSET),
            vnt: at(Tiles::<K, MT>::VNT_OFFSET),
            decay: at(Tiles::<K, MT>::DECAY_OFFSET),
            scale: at(Tiles::<K, MT>::SCALE_OFFSET),
        }
    }

    /// The shared address of bf16 element (`row`, `col`) of the tile at `base` with rows of
    /// `stride` elements.
    fn bf16_at(base: u32, stride: usize, row: usize, col: usize) -> u32 {
        base + ((row * stride + col) * 2) as u32
    }

    /// The shared address of f32 element `i` of the vector at `base`.
    fn f32_at(base: u32, i: usize) -> u32 {
        base + (i * 4) as u32
    }
}

/// This thread's place in its warp's fragments (`layout::portable::Place`) and its index.
#[derive(Clone, Copy)]
struct Frag {
    tid: usize,
    place: Place,
}

impl Frag {
    fn of(tid: usize) -> Self {
        Self { tid, place: Place::of(tid) }
    }

    /// This thread's place, from a fresh read of `%tid.x` (`thread_idx_x_fresh`): each step of a
    /// chunk derives its shared addresses from it, so they are recomputed per chunk instead of
    /// living in registers across the chunk loop (there are more of them than registers).
    fn fresh() -> Self {
        Self::of(thread_idx_x_fresh())
    }

    /// The warp.
    fn warp(self) -> usize {
        self.place.warp
    }
}

/// The item a CTA runs: the block of the state it holds.
struct Item {
    /// Value head, and the key head it reads.
    head: usize,
    key_head: usize,
    /// First value column of the block.
    col0: usize,
    /// Element offset of the item's state in `h0` and `ht`.
    state_base: usize,
}

impl Item {
    /// The element offset, inside one state, of (key row `row`, block column `col`).
    fn state_index<const K: usize>(&self, args: &Args, row: usize, col: usize) -> usize {
        if args.value_first { (self.col0 + col) * K + row } else { row * args.value_dim + self.col0 + col }
    }
}

/// The recurrence of one CTA's item (see the module).
///
/// # Safety
/// As the entries' contract.
#[inline(always)]
unsafe fn recurrence<const K: usize, const MT: usize>(args: &Args) {
    let col_blocks = args.value_dim / BV;
    let group = args.heads.checked_div(args.key_heads).unwrap_or(0);
    let per_seq = col_blocks * args.heads;
    if col_blocks == 0 || group == 0 || per_seq == 0 {
        return; // the launcher never launches so; this proves the divisions below safe
    }
    let block = block_idx_x();
    let (seq, in_seq) = (block / per_seq, block % per_seq);
    let (head, col_block) = (in_seq / col_blocks, in_seq % col_blocks);
    // SAFETY: `seq` is a sequence of the plan (one CTA per item), so its descriptor exists.
    let (token_start, len, chunk_start) = unsafe {
        let desc = args.seqs.add(seq * SEQ_DESC_WORDS);
        (*desc.add(DESC_TOKEN_START) as usize, *desc.add(DESC_LEN) as usize, *desc.add(DESC_CHUNK_START) as usize)
    };
    let state_len = K * args.value_dim;
    let item = Item {
        head,
        key_head: head / group,
        col0: col_block * BV,
        state_base: (seq * args.heads + head) * state_len,
    };
    let frag = Frag::of(thread_idx_x());
    let smem = Smem::carve::<K, MT>();
    let mut state: State<MT> = [[[0.0; 4]; N_TILES]; MT];
    if !args.h0.is_null() {
        for_each_state::<K, MT>(&mut state, frag, |row, col, s| {
            // SAFETY: `h0` holds a state per (sequence, value head); the element is this thread's.
            *s = unsafe { *args.h0.add(item.state_base + item.state_index::<K>(args, row, col)) };
        });
    }
    let chunks = len.div_ceil(CHUNK);
    for c in 0..chunks {
        let tok0 = token_start + c * CHUNK;
        let rows = if c + 1 == chunks { len - c * CHUNK } else { CHUNK };
        let h_item = ((chunk_start + c) * args.heads + head) * state_len;
        // SAFETY: the launcher validated every buffer against the plan, heads and strides; rows
        // beyond the chunk's valid length are never read from or written to global memory;
        // every thread of the CTA runs the same steps (the barriers inside are convergent).
        unsafe {
            stage_chunk::<K, MT>(smem, Frag::fresh(), args, &item, &state, args.h.add(h_item), tok0, rows);
            corrected_values::<K, MT>(smem, Frag::fresh(), args, &item, tok0, rows);
            update_state::<K, MT>(smem, Frag::fresh(), &mut state);
        }
    }
    if !args.ht.is_null() {
        for_each_state::<K, MT>(&mut state, frag, |row, col, s| {
            // SAFETY: `ht` holds a state per (sequence, value head); the element is this thread's.
            unsafe { *args.ht.add(item.state_base + item.state_index::<K>(args, row, col)) = *s };
        });
    }
}

/// Calls `f(row, block column, element)` for each state element this thread holds.
#[inline(always)]
fn for_each_state<const K: usize, const MT: usize>(
    state: &mut State<MT>,
    frag: Frag,
    mut f: impl FnMut(usize, usize, &mut f32),
) {
    for (mt, tiles) in state.iter_mut().enumerate() {
        for (nt, acc) in tiles.iter_mut().enumerate() {
            for (e, s) in acc.iter_mut().enumerate() {
                let (row, col) = frag.place.state_at(Tiles::<K, MT>::STATE_ROWS_PER_WARP, mt, nt, e);
                f(row, col, s);
            }
        }
    }
}

/// Step 1 of a chunk: `bf16(S)` to `h` (at `h_item`, this item's chunk state) and to the
/// transposed tile; the chunk's `w` and transposed `k` rows, the decay per key row and the scalar
/// gate's per-token factors to shared memory.
///
/// # Safety
/// Every thread of the CTA calls it; the chunk's `rows` tokens from `tok0` are the sequence's.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn stage_chunk<const K: usize, const MT: usize>(
    smem: Smem,
    frag: Frag,
    args: &Args,
    item: &Item,
    state: &State<MT>,
    h_item: *mut u16,
    tok0: usize,
    rows: usize,
) {
    let row_stride = Tiles::<K, MT>::ROW_STRIDE;
    // SAFETY: see the function's contract; every shared address is inside its tile.
    unsafe {
        for (mt, acc_row) in state.iter().enumerate() {
            for (nt, acc) in acc_row.iter().enumerate() {
                for half in 0..2 {
                    let (row, col) = frag.place.state_at(Tiles::<K, MT>::STATE_ROWS_PER_WARP, mt, nt, 2 * half);
                    let pair = pack_bf16x2(acc[2 * half], acc[2 * half + 1]);
                    if args.value_first {
                        *h_item.add(item.state_index::<K>(args, row, col)) = pair as u16;
                        *h_item.add(item.state_index::<K>(args, row, col + 1)) = (pair >> 16) as u16;
                    } else {
                        // Columns `col` and `col + 1` of row `row`: one aligned 32-bit store.
                        *(h_item.add(item.state_index::<K>(args, row, col)) as *mut u32) = pair;
                    }
                    st_shared_u16(Smem::bf16_at(smem.st, row_stride, col, row), pair as u16);
                    st_shared_u16(Smem::bf16_at(smem.st, row_stride, col + 1, row), (pair >> 16) as u16);
                }
            }
        }
        stage_w::<K>(smem.w, row_stride, args.w, args.w_rows, tok0, rows, item.head, frag.tid);
        stage_k_transposed::<K>(smem.kt, args.k, args.k_rows, tok0, rows, item.key_head, frag.tid);
        stage_gates::<K>(smem, args, item.head, tok0, rows, frag.tid);
        sync_threads();
    }
}

/// The decay of the state over the chunk per key row (`exp2` of the last valid row of `gk` and
/// of `g`, each where present) and, with the scalar gate, `exp2(g[last] - g[t])` per token (zero
/// past the chunk's end).
///
/// # Safety
/// As [`stage_chunk`].
#[inline(always)]
unsafe fn stage_gates<const K: usize>(smem: Smem, args: &Args, head: usize, tok0: usize, rows: usize, tid: usize) {
    let last = tok0 + rows - 1;
    // SAFETY: see the function's contract: tokens up to `last` are the sequence's.
    unsafe {
        let g_last = if args.g.is_null() { 0.0 } else { *args.g.add(args.g_rows.at(last, head)) };
        let mut a = tid;
        while a < K {
            let gk_last = if args.gk.is_null() { 0.0 } else { *args.gk.add(args.gk_rows.at(last, head) + a) };
            st_shared_f32(Smem::f32_at(smem.decay, a), exp2_approx(g_last + gk_last));
            a += THREADS;
        }
        if !args.g.is_null() && tid < CHUNK {
            let scale = if tid < rows { exp2_approx(g_last - *args.g.add(args.g_rows.at(tok0 + tid, head))) } else { 0.0 };
            st_shared_f32(Smem::f32_at(smem.scale, tid), scale);
        }
    }
}

/// 16 bytes, so that a copy moves eight bf16 with one vector load.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct Vector([u32; 4]);

/// The 16-byte vector `i` of row `t` of a chunk of a bf16 tensor with rows `at`, zeros past the
/// chunk's `rows` valid rows.
///
/// # Safety
/// Tokens `tok0 .. tok0 + rows` exist in `src`, whose rows are 16-byte aligned.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn row_vector(src: *const u16, at: Rows, tok0: usize, rows: usize, head: usize, t: usize, i: usize) -> Vector {
    if t >= rows {
        return Vector([0; 4]);
    }
    // SAFETY: see the function's contract.
    unsafe { *(src.add(at.at(tok0 + t, head) + i * VECTOR) as *const Vector) }
}

/// Calls `f(t, i, vector)` for this thread's share of the chunk's 16-byte vectors of a bf16
/// tensor with rows `at` and `K` elements per row: vector `i` of row `t`, zeros past `rows`.
///
/// # Safety
/// As [`row_vector`]; every thread of the CTA calls it with its own `tid`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn for_each_vector<const K: usize>(
    src: *const u16,
    at: Rows,
    tok0: usize,
    rows: usize,
    head: usize,
    tid: usize,
    mut f: impl FnMut(usize, usize, Vector),
) {
    let per_row = K / VECTOR;
    let mut idx = tid;
    while idx < CHUNK * per_row {
        let (t, i) = (idx / per_row, idx % per_row);
        // SAFETY: see the function's contract.
        f(t, i, unsafe { row_vector(src, at, tok0, rows, head, t, i) });
        idx += THREADS;
    }
}

/// The chunk's `w` rows into the token-major tile (rows of `stride`), zero past `rows`.
///
/// # Safety
/// As [`row_vector`]; every thread of the CTA calls it with its own `tid`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn stage_w<const K: usize>(
    tile: u32,
    stride: usize,
    w: *const u16,
    at: Rows,
    tok0: usize,
    rows: usize,
    head: usize,
    tid: usize,
) {
    // SAFETY: see the function's contract; the tile row is 16-byte aligned (`ROW_STRIDE`).
    unsafe {
        for_each_vector::<K>(w, at, tok0, rows, head, tid, |t, i, v| {
            let base = Smem::bf16_at(tile, stride, t, i * VECTOR);
            for (j, word) in v.0.iter().enumerate() {
                st_shared_u32(base + (4 * j) as u32, *word);
            }
        })
    }
}

/// The chunk's `k` rows into the key-major tile (`KT_STRIDE`): element (`t`, `a`) of the chunk at
/// row `a`, column `t`; zero past `rows`.
///
/// # Safety
/// As [`row_vector`]; every thread of the CTA calls it with its own `tid`.
#[inline(always)]
unsafe fn stage_k_transposed<const K: usize>(
    tile: u32,
    k: *const u16,
    at: Rows,
    tok0: usize,
    rows: usize,
    head: usize,
    tid: usize,
) {
    // SAFETY: see the function's contract; `a` stays below K and `t` below CHUNK.
    unsafe {
        for_each_vector::<K>(k, at, tok0, rows, head, tid, |t, i, v| {
            for (j, word) in v.0.iter().enumerate() {
                let a = i * VECTOR + 2 * j;
                st_shared_u16(Smem::bf16_at(tile, KT_STRIDE, a, t), *word as u16);
                st_shared_u16(Smem::bf16_at(tile, KT_STRIDE, a + 1, t), (*word >> 16) as u16);
            }
        })
    }
}

/// An A fragment of `mma_m16n8k16_bf16` from a row-major bf16 tile: the 16 x 16 block whose top
/// left element is (`row0`, `col0`).
///
/// # Safety
/// The block lies inside the tile; the address is shared.
#[inline(always)]
unsafe fn a_fragment(tile: u32, stride: usize, frag: Frag, row0: usize, col0: usize) -> [u32; 4] {
    // SAFETY: see the function's contract; each pair is 4-byte aligned (even column, even stride).
    frag.place.a_pairs(row0, col0).map(|(r, c)| unsafe { ld_shared_u32(Smem::bf16_at(tile, stride, r, c)) })
}

/// A B fragment of `mma_m16n8k16_bf16` from a transposed (column-major) bf16 tile, whose row `n`
/// holds column `n` of B: the 16 x 8 block of B whose top left element is (`k0`, `n0`).
///
/// # Safety
/// The block lies inside the tile; the address is shared.
#[inline(always)]
unsafe fn b_fragment(tile_t: u32, stride: usize, frag: Frag, k0: usize, n0: usize) -> [u32; 2] {
    // SAFETY: see the function's contract.
    frag.place.b_pairs(k0, n0).map(|(n, kk)| unsafe { ld_shared_u32(Smem::bf16_at(tile_t, stride, n, kk)) })
}

/// Step 2: `Vn = u - w @ bf16(S)` for this warp's 16 token rows; `bf16(Vn)` to `v_new` for the
/// valid rows, and to the transposed tile (scaled by the scalar gate's factor where there is one;
/// zeros past the chunk's end).
///
/// # Safety
/// Every thread of the CTA calls it after [`stage_chunk`].
#[inline(always)]
unsafe fn corrected_values<const K: usize, const MT: usize>(
    smem: Smem,
    frag: Frag,
    args: &Args,
    item: &Item,
    tok0: usize,
    rows: usize,
) {
    let row0 = frag.warp() * VN_ROWS_PER_WARP;
    let mut acc = [[0.0f32; 4]; N_TILES];
    // SAFETY: see the function's contract; rows past `rows` touch shared memory only.
    unsafe {
        for ks in 0..Tiles::<K, MT>::VN_K_STEPS {
            let a = a_fragment(smem.w, Tiles::<K, MT>::ROW_STRIDE, frag, row0, ks * MMA_K);
            for (nt, acc) in acc.iter_mut().enumerate() {
                let b = b_fragment(smem.st, Tiles::<K, MT>::ROW_STRIDE, frag, ks * MMA_K, nt * MMA_N);
                mma_m16n8k16_bf16(acc, a, b);
            }
        }
        for (nt, acc) in acc.iter().enumerate() {
            let col = item.col0 + nt * MMA_N + 2 * frag.place.t;
            for half in 0..2 {
                let t = row0 + frag.place.g + 8 * half;
                let pair = if t < rows {
                    let given = *(args.u.add(args.u_rows.at(tok0 + t, item.head) + col) as *const u32);
                    let lo = bf16_to_f32(given as u16) - acc[2 * half];
                    let hi = bf16_to_f32((given >> 16) as u16) - acc[2 * half + 1];
                    let rounded = pack_bf16x2(lo, hi);
                    *(args.v_new.add(args.v_new_rows.at(tok0 + t, item.head) + col) as *mut u32) = rounded;
                    if args.g.is_null() {
                        rounded
                    } else {
                        let scale = ld_shared_f32(Smem::f32_at(smem.scale, t));
                        pack_bf16x2(lo * scale, hi * scale)
                    }
                } else {
                    0
                };
                let c = col - item.col0;
                st_shared_u16(Smem::bf16_at(smem.vnt, VNT_STRIDE, c, t), pair as u16);
                st_shared_u16(Smem::bf16_at(smem.vnt, VNT_STRIDE, c + 1, t), (pair >> 16) as u16);
            }
        }
        sync_threads();
    }
}

/// Step 3: `S = decay * S + k^T @ bf16(Vn)` over the chunk's tokens (the rows past its end are
/// zero in both tiles); then the CTA barrier before the next chunk overwrites the tiles.
///
/// # Safety
/// Every thread of the CTA calls it after [`corrected_values`].
#[inline(always)]
unsafe fn update_state<const K: usize, const MT: usize>(smem: Smem, frag: Frag, state: &mut State<MT>) {
    // SAFETY: see the function's contract; every index is inside its shared tile.
    unsafe {
        for_each_state::<K, MT>(state, frag, |row, _, s| *s *= ld_shared_f32(Smem::f32_at(smem.decay, row)));
        for ks in 0..STATE_K_STEPS {
            let mut a = [[0u32; 4]; MT];
            for (mt, a) in a.iter_mut().enumerate() {
                let row0 = frag.warp() * Tiles::<K, MT>::STATE_ROWS_PER_WARP + mt * MMA_M;
                *a = a_fragment(smem.kt, KT_STRIDE, frag, row0, ks * MMA_K);
            }
            let b: [[u32; 2]; N_TILES] =
                core::array::from_fn(|nt| b_fragment(smem.vnt, VNT_STRIDE, frag, ks * MMA_K, nt * MMA_N));
            for (row, a) in state.iter_mut().zip(&a) {
                for (acc, b) in row.iter_mut().zip(&b) {
                    mma_m16n8k16_bf16(acc, *a, *b);
                }
            }
        }
        sync_threads();
    }
}
