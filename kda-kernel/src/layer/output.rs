//! The output kernels: `o = scale ((q Γ) h + P v_new)` from the recurrence's entry states and
//! corrected values, in bf16 `mma`. `kda_layer_output` first forms the causal attention `P` and
//! `q Γ` from the chunk's queries, keys and gate; `kda_layer_output_prepared` reads both as the
//! fused prepare kernel wrote them, so that the chunk's gated product is formed once per layer.

use super::*;

/// n8 tiles of `o` per warp at `V = MAX_V` (a warp's row block and column half), and at the
/// smallest `V` (64).
const OUTPUT_TILES: usize = MAX_V / 2 / TILE_N;
const OUTPUT_TILES_V64: usize = MIN_DIM / 2 / TILE_N;

/// The output kernel's shared tiles its last step reads (bf16, rows 16-byte aligned for
/// `ldmatrix`).
#[derive(Clone, Copy)]
struct Tiles {
    /// `q Γ`, `[CHUNK][KEY_ROW]`.
    qg: Shared<u16>,
    /// The causal attention, bf16 `[CHUNK][ATTENTION_ROW]`.
    attention: Shared<u16>,
    /// The entry state `h`, bf16 `[MAX_K][STAGED_ROW]` key-major, then `v_new`, bf16
    /// `[CHUNK][STAGED_ROW]` ([`staging_v`]).
    staged_h: Shared<u16>,
}

/// One warp's block of `o`: 16 rows from `r0`, the columns from `c0`, of a chunk of `rows` valid
/// rows.
#[derive(Clone, Copy)]
struct OutputBlock {
    r0: usize,
    c0: usize,
    rows: usize,
    l: Lane,
}

impl OutputBlock {
    /// `scale ((q Γ) h + P v_new)` over the block's `N` n8 tiles (bf16 `mma.m16n8k16`, every
    /// operand read with `ldmatrix`: the A fragment once per k-step for all tiles, the B
    /// fragments two tiles at a time) into the valid rows of `o` (rows at `o_rows`): each of a
    /// lane's two rows from one pointer formed once, a pair of adjacent elements (an
    /// accumulator's two halves of a row) per 4-byte store at a constant offset from it.
    ///
    /// # Safety
    /// The warp calls it together, the tiles written for the chunk; `o`'s valid rows hold `V`
    /// elements from `o_rows.at(r)`.
    #[inline(always)]
    unsafe fn run<const N: usize>(self, t: Tiles, kd: usize, (o, o_rows): (*mut u16, RowsAt), scale: f32) {
        let (r0, c0, l) = (self.r0, self.c0, self.l);
        let place = Place::of(thread_idx_x());
        let address = |tile: Shared<u16>, stride: usize, (r, c): (usize, usize)| tile.add(r * stride + c).addr();
        let mut acc = [[0.0f32; 4]; N];
        // `acc += A B` over `depth` for the A tile's rows `r0..r0 + 16` and the B tile's
        // columns from `c0`.
        let mut product = |a_tile: Shared<u16>, a_stride: usize, b_tile: Shared<u16>, depth: usize| {
            // SAFETY (block): every block inside its tile (`Dims::valid`; rows 16-byte aligned
            // by `layout::layer`); the warp is converged (the caller's contract).
            unsafe {
                for k0 in (0..depth).step_by(MMA_K) {
                    let a = ldmatrix_x4(address(a_tile, a_stride, place.ldmatrix_down_then_right(r0, k0)));
                    for pair in 0..N / 2 {
                        let at = place.ldmatrix_down_then_right(k0, c0 + 2 * TILE_N * pair);
                        let b = ldmatrix_x4_trans(address(b_tile, STAGED_ROW, at));
                        mma_m16n8k16_bf16(&mut acc[2 * pair], a, [b[0], b[1]]);
                        mma_m16n8k16_bf16(&mut acc[2 * pair + 1], a, [b[2], b[3]]);
                    }
                }
            }
        };
        // `q Γ` by `h` over the keys, then the attention by `v_new` over the rows up to the
        // block's own (the attention is zero past its diagonal).
        product(t.qg, KEY_ROW, t.staged_h, kd);
        product(t.attention, ATTENTION_ROW, staging_v(t.staged_h), r0 + SUB);
        for half in 0..2 {
            let (m, n) = l.acc_at(2 * half);
            if r0 + m < self.rows {
                // The pair at column `c0 + n` (even) of row `r0 + m`, then every n8 tile's.
                let row = o.wrapping_add(o_rows.at(r0 + m) + c0 + n).cast::<u32>();
                for (j, acc) in acc.iter().enumerate() {
                    let pair = pack_bf16x2(scale * acc[2 * half], scale * acc[2 * half + 1]);
                    // SAFETY: a valid row's element `c0 + 8 j + n < V` and the next (the
                    // function's contract; 4-byte aligned: `V`, `c0` and `n` even).
                    unsafe { *row.wrapping_add(TILE_N / 2 * j) = pair };
                }
            }
        }
    }
}

/// The output kernel's first phase: the chunk's causal attention `P` and its `q Γ`, in the
/// kernel's shared tiles.
#[derive(Clone, Copy)]
struct Attention {
    wk: Work,
    /// bf16 `[CHUNK][KEY_ROW]`: the keys, then `q Γ`.
    qg: Shared<u16>,
    /// f32 `[CHUNK][ROW_WORDS]`: the queries (normalised when asked).
    queries: Shared<f32>,
    gates: Gates,
    /// bf16 `[CHUNK][ATTENTION_ROW]`: `P`, causal (zeros past the diagonal inside the diagonal
    /// sub-blocks; the sub-blocks above it unwritten).
    attention: Shared<u16>,
}

impl Attention {
    /// Loads the chunk's `k`, `q` and gate and forms `P = causal((q Γ) (k / Γ)^T)`, diagonal
    /// included.
    ///
    /// # Safety
    /// The CTA calls it together, with the kernels' contract on the tensors and the chunk table.
    #[inline(always)]
    unsafe fn form(q: *const u16, k: *const u16, gate: *const f32, chunks: *const u32, d: &Dims, l2norm: bool) -> Self {
        let (kd, gw) = (d.key_dim, d.gate_width);
        let tid = thread_idx_x();
        // SAFETY (block): as in `kda_layer_prepare`.
        unsafe {
            let wk = Work::of_this_cta(chunks, d);
            let rows = wk.rows;
            let base = Shared::<u8>::base();
            let keys = base.cast::<u16>();
            let queries = base.add(OUTPUT_QUERIES_AT).cast::<f32>();
            let gates = Gates { tile: base.add(OUTPUT_GATES_AT).cast::<f32>(), per_key: d.per_key_gate() };
            let attention = base.add(OUTPUT_ATTENTION_AT).cast::<u16>();

            // Every input of the attention in flight at once (one wait for memory, not one per
            // tile): the keys, the queries and the gate (a per-key gate's rows 4 columns per
            // thread, a per-head gate a row per thread).
            let key_rows = fetch_rows(k, &wk, d.heads, wk.j, kd);
            let query_rows = fetch_rows(q, &wk, d.heads, wk.j, kd);
            let gate_values = fetch_gate(gate, &wk, d, false);

            // The gate into its tile; the keys (normalised when asked) through the query tile into
            // their bf16 tile, then the queries.
            gates.put(&gate_values, rows, false);
            put_rows(queries, &key_rows, &wk, kd, l2norm);
            for e in strided(tid, CHUNK * kd / BF16_VECTOR) {
                let (r, a) = split(e * BF16_VECTOR, kd);
                st_shared_v4(keys.add(r * KEY_ROW + a).addr(), pack_bf16x8(row8(queries, r, a)));
            }
            sync_threads();
            put_rows(queries, &query_rows, &wk, kd, l2norm);
            gates.pad(rows, gw);

            // P = causal((q Γ) (k / Γ)^T), diagonal included.
            let attention_product = Gated { x: F32Rows(queries), out: Bf16Matrix(attention), strict: false, row_scale: |_| 1.0 };
            gated_products(attention_product, Bf16Rows(keys), gates, kd, |_| {});
            Self { wk, qg: keys, queries, gates, attention }
        }
    }

    /// `q Γ` rounded to bf16 (as FLA rounds it before its product with `h`) over the keys'
    /// tile, eight elements at a time (the gate's kind chosen once, outside the loop); ends with
    /// the CTA synchronised.
    ///
    /// # Safety
    /// The CTA calls it together, after [`Attention::form`].
    #[inline(always)]
    unsafe fn scale_queries(self, kd: usize) {
        let (tid, qg, queries, gates) = (thread_idx_x(), self.qg, self.queries, self.gates);
        let scale = |per_key: bool| {
            for e in strided(tid, CHUNK * kd / BF16_VECTOR) {
                let (r, a) = split(e * BF16_VECTOR, kd);
                // SAFETY: inside the tiles (`Dims::valid`).
                unsafe {
                    let x = gates.decay8(per_key, r, a, row8(queries, r, a));
                    st_shared_v4(qg.add(r * KEY_ROW + a).addr(), pack_bf16x8(x));
                }
            }
        };
        if gates.per_key {
            scale(true);
        } else {
            scale(false);
        }
        // SAFETY: every thread reaches it.
        unsafe { sync_threads() };
    }
}

/// The chunk's entry state `h` and its `v_new` (zeros past the valid rows) in registers, their
/// loads issued ([`Staging::store`] stages them as bf16 `[MAX_K][STAGED_ROW]` key-major and
/// `[CHUNK][STAGED_ROW]`).
struct Staging {
    state_rows: Fetched<STATE_VECTORS>,
    new_rows: Fetched<ROW_VECTORS>,
    value_first: bool,
}

impl Staging {
    /// Issues the loads of the state of the CTA's (table chunk, value head) in `h` and of the
    /// chunk's rows of `v_new`.
    ///
    /// # Safety
    /// `h` holds a state per (chunk of the table, value head) in `state_layout`, `v_new` the
    /// chunk's valid rows (`[T, HV, V]`).
    #[inline(always)]
    unsafe fn issue(h: *const u16, v_new: *const u16, wk: &Work, d: &Dims, state_layout: u32) -> Self {
        let (hv, kd, vd, i) = (d.value_heads, d.key_dim, d.value_dim, wk.i);
        let value_first = state_layout == StateLayoutCode::ValueFirst as u32;
        // The block's rows: keys of `V` columns key-first, columns of `K` keys value-first.
        let (block_rows, block_cols) = if value_first { (vd, kd) } else { (kd, vd) };
        let block_at = RowsAt { first: 0, stride: block_cols };
        // SAFETY (block): the function's contract; `K`, `V <= MAX_K`, so the vectors cover
        // the rows.
        unsafe {
            let block = h.add((wk.chunk * hv + i) * kd * vd);
            Self {
                state_rows: Fetched::bf16(block, (block_rows, block_rows), block_cols, block_at),
                new_rows: Fetched::bf16(v_new, (CHUNK, wk.rows), vd, RowsAt::heads(wk, hv, i, vd)),
                value_first,
            }
        }
    }

    /// Stores the state into `staged_h` and `v_new` after it ([`staging_v`]): key-first rows
    /// are the tile's rows, 16 bytes at a time; value-first ones are transposed element by
    /// element.
    ///
    /// # Safety
    /// The tiles are free (`layout::layer` places them).
    #[inline(always)]
    unsafe fn store(&self, staged_h: Shared<u16>) {
        let to_staged = |tile: Shared<u16>, r: usize, c: usize, words: [u32; 4]| {
            // SAFETY: row `r` and columns `c..c + 8` inside the tile (the function's contract).
            unsafe { st_shared_v4(tile.add(r * STAGED_ROW + c).addr(), words) };
        };
        // SAFETY (block): as above.
        unsafe {
            if self.value_first {
                self.state_rows.store(|col, a, words| {
                    for (j, word) in words.iter().enumerate() {
                        staged_h.add((a + 2 * j) * STAGED_ROW + col).st(*word as u16);
                        staged_h.add((a + 2 * j + 1) * STAGED_ROW + col).st((*word >> 16) as u16);
                    }
                });
            } else {
                self.state_rows.store(|a, col, words| to_staged(staged_h, a, col, words));
            }
        }
        self.new_rows.store(|r, col, words| to_staged(staging_v(staged_h), r, col, words));
    }
}

/// The staged `v_new` tile: right after the staged state.
#[inline(always)]
fn staging_v(staged_h: Shared<u16>) -> Shared<u16> {
    staged_h.add(MAX_K * STAGED_ROW)
}

/// `o = scale ((q Γ) h + P v_new)` from the staged tiles: warp (row block, column half) of the
/// CTA, `(o, warp, lane)`.
///
/// # Safety
/// The CTA calls it together, every tile written and the CTA synchronised since; `o` holds the
/// chunk's valid rows (`[T, HV, V]`).
#[inline(always)]
unsafe fn write_output(wk: &Work, d: &Dims, tiles: Tiles, (o, warp, l): (*mut u16, usize, Lane), scale_bits: u32) {
    let (hv, kd, vd) = (d.value_heads, d.key_dim, d.value_dim);
    let scale = f32::from_bits(scale_bits);
    let (rb, half) = (warp % SUBS, warp / SUBS);
    let block = OutputBlock { r0: rb * SUB, c0: half * (vd / 2), rows: wk.rows, l };
    let out = (o, RowsAt::heads(wk, hv, wk.i, vd));
    // SAFETY: the function's contract.
    unsafe {
        if vd == MAX_V {
            block.run::<OUTPUT_TILES>(tiles, kd, out, scale);
        } else {
            block.run::<OUTPUT_TILES_V64>(tiles, kd, out, scale);
        }
    }
}

/// Vectors a thread holds of a chunk's bf16 rows of the causal attention (`CHUNK` elements).
const ATTENTION_VECTORS: usize = CHUNK * CHUNK / BF16_VECTOR / THREADS;
const _: () = assert!(ATTENTION_VECTORS * BF16_VECTOR * THREADS == CHUNK * CHUNK);

kernel_entry! {
    /// The layer's output kernel (`abi::LAYER_OUTPUT`, parameters `abi::LAYER_OUTPUT_PARAMS`). Grid,
    /// threads as [`kda_layer_prepare`]; `layout::layer::OUTPUT_SMEM_BYTES` of dynamic shared memory.
    ///
    /// Reads `q`, `k` `[T, H, K]` (bf16), the prepare kernel's gate (`[T, HV, gate_width]` f32,
    /// log2, cumulative inside each chunk), the recurrence's `h` (`[NT, HV, K, V]` bf16, key-first;
    /// value-first `[NT, HV, V, K]` when `state_layout` is `StateLayoutCode::ValueFirst`; the chunk
    /// table's order is the recurrence's chunk order) and `v_new` (`[T, HV, V]` bf16); writes `o`
    /// (`[T, HV, V]` bf16) times `f32::from_bits(scale_bits)`.
    ///
    /// # Safety
    /// As for [`kda_layer_prepare`]; `h` holds a state per (chunk of the table, value head).
    pub unsafe fn kda_layer_output(
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
        state_layout: u32,
    ) {
        let Some(d) = Dims::checked(heads, value_heads, key_dim, value_dim, gate_width) else {
            return; // the launcher never launches so; this proves the tiles and divisions safe
        };
        let kd = d.key_dim;
        let (_, warp, l) = Lane::this_thread();
        // SAFETY (block): as in `kda_layer_prepare`; `h`'s block is the table chunk's.
        unsafe {
            let at = Attention::form(q, k, gate, chunks, &d, options & OPT_L2NORM != 0);
            let (wk, qg, attention) = (at.wk, at.qg, at.attention);
            // Once the attention is formed: `q Γ` over the keys, `h` and `v_new` over the queries
            // and the gate (bf16; `layout::layer::OUTPUT_WORDS`). Their loads are issued here, to
            // arrive while q Γ is formed; stored once it is (they are staged over the queries and
            // the gate it reads).
            let staged_h = Shared::<u8>::base().add(OUTPUT_STAGED_AT).cast::<u16>();
            let staging = Staging::issue(h, v_new, &wk, &d, state_layout);
            at.scale_queries(kd);
            staging.store(staged_h);
            sync_threads();
            let tiles = Tiles { qg, attention, staged_h };
            write_output(&wk, &d, tiles, (o, warp, l), scale_bits);
        }
    }
}

kernel_entry! {
    /// The layer's output kernel on prepared attention (`abi::LAYER_OUTPUT_PREPARED`, parameters
    /// `abi::LAYER_OUTPUT_PREPARED_PARAMS`): [`kda_layer_output`]'s `o`, with `q Γ` and the causal
    /// attention read as `kda_layer_prepare_fused` wrote them instead of formed again from `q`,
    /// `k` and the gate. Grid and threads as [`kda_layer_output`];
    /// `layout::layer::OUTPUT_PREPARED_SMEM_BYTES` of dynamic shared memory.
    ///
    /// Reads `qg` (`bf16(q Γ)`, `[T, HV, K]`) and `attention` (`[T, HV, CHUNK]` bf16, each row
    /// zeros past its diagonal), the valid rows of each; `h`, `v_new` and `o` as
    /// [`kda_layer_output`].
    ///
    /// # Safety
    /// As for [`kda_layer_output`]; `qg` and `attention` hold the chunks' valid rows.
    pub unsafe fn kda_layer_output_prepared(
        qg: *const u16,
        attention: *const u16,
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
        state_layout: u32,
    ) {
        let _ = options; // the norms and gate are in `qg` and `attention` already
        let Some(d) = Dims::checked(heads, value_heads, key_dim, value_dim, gate_width) else {
            return; // the launcher never launches so; this proves the tiles and divisions safe
        };
        let (hv, kd) = (d.value_heads, d.key_dim);
        let (_, warp, l) = Lane::this_thread();
        // SAFETY (block): as in `kda_layer_output`; every tile inside `OUTPUT_PREPARED_SMEM_BYTES`.
        unsafe {
            let wk = Work::of_this_cta(chunks, &d);
            let base = Shared::<u8>::base();
            let tiles = Tiles {
                qg: base.cast::<u16>(),
                attention: base.add(OUTPUT_PREPARED_ATTENTION_AT).cast::<u16>(),
                staged_h: base.add(OUTPUT_PREPARED_STAGED_AT).cast::<u16>(),
            };
            // Every tile's loads in flight at once (one wait for memory), zeros past the valid
            // rows; then stored, and the products.
            let qg_rows = Fetched::<ROW_VECTORS>::bf16(qg, (CHUNK, wk.rows), kd, RowsAt::heads(&wk, hv, wk.i, kd));
            let attention_rows =
                Fetched::<ATTENTION_VECTORS>::bf16(attention, (CHUNK, wk.rows), CHUNK, RowsAt::heads(&wk, hv, wk.i, CHUNK));
            let staging = Staging::issue(h, v_new, &wk, &d, state_layout);
            qg_rows.store(|r, c, words| st_shared_v4(tiles.qg.add(r * KEY_ROW + c).addr(), words));
            attention_rows.store(|r, c, words| st_shared_v4(tiles.attention.add(r * ATTENTION_ROW + c).addr(), words));
            staging.store(tiles.staged_h);
            sync_threads();
            write_output(&wk, &d, tiles, (o, warp, l), scale_bits);
        }
    }
}
