//! The prepare kernel (`kda_layer_prepare`): the gate activated and summed, the norms, `beta`,
//! the strictly lower `L` and the inverses of its diagonal blocks, then the WY solve of `[w | u]`
//! block by block, and the recurrence's keys and gate.

use super::*;

/// `$body` once for each row `$r` of a diagonal sub-block, `$r` a literal: the forward
/// substitution's column, indexed by rows, stays in registers (every index a constant; a loop
/// over the rows would index it at run time, which puts it in local memory).
macro_rules! each_sub_row {
    ($r:ident => $body:block) => {
        each_sub_row!(@ $r $body 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15)
    };
    (@ $r:ident $body:block $($n:literal)*) => {
        $({
            let $r: usize = $n;
            $body
        })*
    };
}
/// `each_sub_row!` lists the rows of a sub-block.
const _: () = assert!(SUB == 16);
/// The forward substitution reads rows of `-L` 16 bytes at a time.
const _: () = assert!(MATRIX_ROW_WORDS.is_multiple_of(F32_VECTOR) && SUB.is_multiple_of(F32_VECTOR));

/// The inverse of diagonal sub-block `b` of `I + L` (unit lower triangular) into `inverse`
/// (`[CHUNK][INVERSE_ROW_WORDS]`), by forward substitution, a column per lane of lanes 0 to 15
/// of the calling warp: the column in registers (its entries above the diagonal are zeros, so
/// each row sums over every earlier row, with no per-lane bound), each row of `-L` read 16 bytes
/// at a time (the 16 lanes read the same words: a broadcast). Run by the warp that formed the
/// sub-block, right after it ([`gated_products`]' `diagonal_then`), so that it overlaps the
/// longer products of the other warps instead of following them.
///
/// # Safety
/// Sub-block `b` of `lower` (`-L`, `[CHUNK][MATRIX_ROW_WORDS]`) is written and visible to the
/// calling lanes.
#[inline(always)]
unsafe fn invert_diagonal_block(lower: Shared<f32>, inverse: Shared<f32>, b: usize) {
    let c = thread_idx_x() % LANES;
    if c >= SUB {
        return;
    }
    let base = b * SUB;
    let mut column = [0.0f32; SUB];
    // SAFETY (block): rows and columns of sub-block `b` (the function's contract).
    unsafe {
        each_sub_row!(r => {
            let mut acc = if r == c { 1.0 } else { 0.0 };
            for q in 0..r.div_ceil(F32_VECTOR) {
                let row = row_words(lower, MATRIX_ROW_WORDS, base + r, base + F32_VECTOR * q);
                for (j, &l_rs) in row.iter().enumerate() {
                    let s = F32_VECTOR * q + j;
                    if s < r {
                        acc = fma_f32(l_rs, column[s], acc);
                    }
                }
            }
            column[r] = acc;
            inverse.add((base + r) * INVERSE_ROW_WORDS + c).st(column[r]);
        });
    }
}

/// One warp's columns of the WY solve `(I + L) [w | u] = R`, in place over the right-hand side:
/// `w`'s columns in the key tile, `u`'s in the gate tile (`[CHUNK][ROW_WORDS]` f32 each), the
/// warp's from column `col0` of `[w | u]`.
#[derive(Clone, Copy)]
struct Solve {
    keys: Shared<f32>,
    values: Shared<f32>,
    /// `-L` (strictly lower), `[CHUNK][MATRIX_ROW_WORDS]`.
    lower: Shared<f32>,
    /// The inverses of `I + L`'s diagonal sub-blocks, `[CHUNK][INVERSE_ROW_WORDS]`.
    inverse: Shared<f32>,
    kd: usize,
    col0: usize,
    l: Lane,
}

/// A warp's `N` n8 tiles of `[w | u]`, each lane's addresses in them formed once for the
/// whole solve (a tile's first column chosen between `w`'s and `u`'s once, not per element and
/// block): the accumulator's element `(g, 2 t)` and B's `(0, g)` of each tile.
#[derive(Clone, Copy)]
struct SolveTiles<const N: usize> {
    acc: [Shared<f32>; N],
    b: [Shared<f32>; N],
}

impl Solve {
    /// The warp's `N` tiles: tile `j` from column `col0 + 8 j` of `[w | u]`, in `w`'s tile or
    /// `u`'s (a tile lies in one of them, `K` being a multiple of `TILE_N`; the choice in 32
    /// bits).
    #[inline(always)]
    fn tiles<const N: usize>(self) -> SolveTiles<N> {
        let (kd, l) = (self.kd as u32, self.l);
        let tile = |j: usize| {
            let first = (self.col0 + TILE_N * j) as u32;
            if first < kd { self.keys.add(first as usize) } else { self.values.add((first - kd) as usize) }
        };
        SolveTiles {
            acc: core::array::from_fn(|j| tile(j).add(l.g * ROW_WORDS + 2 * l.t)),
            b: core::array::from_fn(|j| tile(j).add(l.g)),
        }
    }

    /// Every sub-block in order, over the warp's `N` n8 tiles.
    ///
    /// # Safety
    /// As [`Solve::block`].
    #[inline(always)]
    unsafe fn run<const N: usize>(self) {
        let t = self.tiles::<N>();
        for b in 0..SUBS {
            // SAFETY: the caller's contract; blocks in order.
            unsafe { self.block(t, b) };
        }
    }

    /// Sub-block `b` of the warp's `N` n8 tiles: `Y = R_b - L_b,<b X_<b`, then
    /// `X_b = (I + L_bb)^-1 Y`, each product's A fragment read once per k-step for all tiles,
    /// the accumulators' rows read and written 8 bytes at a time.
    ///
    /// # Safety
    /// The warp calls it together, blocks in order, `L` and the inverses written.
    #[inline(always)]
    unsafe fn block<const N: usize>(self, t: SolveTiles<N>, b: usize) {
        let (r0, l) = (b * SUB, self.l);
        // SAFETY (block): every row below `CHUNK`, every column the warp's; the warp is
        // converged, and `sync_warp` orders its lanes' shared-memory accesses.
        unsafe {
            let mut acc: [[f32; 4]; N] = core::array::from_fn(|j| {
                let at = t.acc[j].add(r0 * ROW_WORDS);
                let (upper, lower) = (ld_shared_v2_f32(at.addr()), ld_shared_v2_f32(at.add(ACC_ROWS_APART).addr()));
                [upper[0], upper[1], lower[0], lower[1]]
            });
            // Every operand in the fragment's own depth order: `L`'s and the inverses' rows are
            // 4 words apart mod 32 banks, and B is read down its columns.
            let depths = Depths::Split;
            let apart = depths.apart();
            let b_pair = |s: usize, j: usize| {
                let at = t.b[j].add(s * ROW_WORDS);
                [at.ld(), at.add(apart * ROW_WORDS).ld()]
            };
            let a_pair = |tile: Shared<f32>, stride: usize, r: usize, s: usize| {
                [at(tile, stride, r, s), at(tile, stride, r, s + apart)]
            };
            mma_tiles(&mut acc, r0, (l, depths), |m, s| a_pair(self.lower, MATRIX_ROW_WORDS, r0 + m, s), b_pair);
            Self::store(t, r0, &acc);
            let mut out = [[0.0f32; 4]; N];
            mma_tiles(&mut out, SUB, (l, depths), |m, s| a_pair(self.inverse, INVERSE_ROW_WORDS, r0 + m, s), |s, j| {
                b_pair(r0 + s, j)
            });
            Self::store(t, r0, &out);
        }
    }

    /// The warp's `N` accumulator tiles into rows `r0..r0 + SUB` of its columns (a row's two
    /// elements in one 8-byte store), between two warp barriers (every lane has read what it
    /// overwrites, and reads what the others wrote).
    ///
    /// # Safety
    /// As [`Solve::block`].
    #[inline(always)]
    unsafe fn store<const N: usize>(t: SolveTiles<N>, r0: usize, acc: &[[f32; 4]; N]) {
        sync_warp();
        for (at, acc) in t.acc.iter().zip(acc) {
            let at = at.add(r0 * ROW_WORDS);
            // SAFETY: see the function's contract (`ROW_WORDS` even, the column `2 t`: 8-byte
            // aligned).
            unsafe {
                st_shared_v2_f32(at.addr(), [acc[0], acc[1]]);
                st_shared_v2_f32(at.add(ACC_ROWS_APART).addr(), [acc[2], acc[3]]);
            }
        }
        sync_warp();
    }
}

/// The solve `(I + L) X = R` over the first `cols` columns of `tile` (`[CHUNK][ROW_WORDS]`, `R`
/// in place), each warp its own `cols / 8` columns (`cols` 64 or 128: one or two n8 tiles); the
/// scalar entry's `w`, then its `u`. Ends with the CTA synchronised.
///
/// # Safety
/// The CTA calls it together; `R`, `L` and the inverses are written and visible.
#[inline(always)]
unsafe fn solve_tile(tile: Shared<f32>, cols: usize, lower: Shared<f32>, inverse: Shared<f32>, warp: usize, l: Lane) {
    let cols_per_warp = cols / (THREADS / LANES);
    let solve = Solve { keys: tile, values: tile, lower, inverse, kd: cols, col0: warp * cols_per_warp, l };
    // SAFETY: the caller's contract; every column of the warp's below `cols <= MAX_K`.
    unsafe {
        if cols_per_warp / TILE_N == 1 {
            solve.run::<1>();
        } else {
            solve.run::<2>();
        }
        sync_threads();
    }
}
const _: () = assert!(MAX_K / (THREADS / LANES) == 2 * TILE_N && MAX_V <= MAX_K);

/// Words between an accumulator's two rows (`g` and `g + 8`) in a `ROW_WORDS` tile.
const ACC_ROWS_APART: usize = TILE_N * ROW_WORDS;

/// The prepare kernel's parameters past its tensors, as both entries take them.
#[derive(Clone, Copy)]
struct PrepareWords {
    heads: u32,
    value_heads: u32,
    key_dim: u32,
    value_dim: u32,
    gate_width: u32,
    options: u32,
    gate_mode: u32,
    lower_bound_bits: u32,
}

/// The prepare kernel's tensors (`kda_layer_prepare`'s parameters).
#[derive(Clone, Copy)]
struct PrepareTensors {
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
}

/// The fused layer's extra tensors (`kda_layer_prepare_fused`): `q` `[T, H, K]` in, `q Γ`
/// `[T, HV, K]` and the causal attention `[T, HV, CHUNK]` out (bf16).
#[derive(Clone, Copy)]
struct AttentionTensors {
    q: *const u16,
    qg_out: *mut u16,
    attention_out: *mut u16,
}

/// The prepare kernel's work for one CTA; with `FUSED` also the chunk's causal attention and
/// `q Γ` for the fused recurrence (from a bf16 query tile after the prepare kernel's tiles; the
/// attention in the same pass as `L`, written from its accumulators), and of a per-key gate only
/// each chunk's last row written (all the fused recurrence reads of it).
///
/// With `SCALAR` (a per-head gate or none: `kda_layer_prepare_fused_scalar`) the CTA has no gate
/// tile (`layout::layer::PREPARE_SCALAR_FUSED_SMEM_BYTES`, three CTAs per SM on 9.x): the gate is
/// one word per row, kept in the key tile's padding column `SCALAR_GATE_COL`, and the solve runs
/// twice over the key tile, `w` (stored) and then `u` (over `diag(beta) v`), where the generic
/// layout solves `[w | u]` at once over the key and gate tiles.
///
/// # Safety
/// The entries' contract; with `SCALAR` the gate is per head.
#[inline(always)]
unsafe fn prepare<const FUSED: bool, const SCALAR: bool>(t: PrepareTensors, fused: AttentionTensors, words: PrepareWords) {
    let PrepareTensors { k, v, g, beta, a_log, dt_bias, chunks, k_rec, w_out, u_out, gate_out } = t;
    let PrepareWords { heads, value_heads, key_dim, value_dim, gate_width, options, gate_mode, lower_bound_bits } = words;
    let Some(d) = Dims::checked(heads, value_heads, key_dim, value_dim, gate_width) else {
        return; // the launcher never launches so; this proves the tiles and divisions safe
    };
    if SCALAR && d.per_key_gate() {
        return; // the launcher never launches so: a per-key gate needs the gate tile
    }
    let (hv, kd, vd, gw) = (d.value_heads, d.key_dim, d.value_dim, d.gate_width);
    let (tid, warp, l) = Lane::this_thread();
    // SAFETY (block): the kernel's contract; every tile index is below its `CHUNK` rows and its
    // columns (`Dims::valid`), every tensor index inside the chunk's valid rows.
    unsafe {
        let wk = Work::of_this_cta(chunks, &d);
        let (i, t0, rows) = (wk.i, wk.t0, wk.rows);
        let per_key = !SCALAR && d.per_key_gate();
        let keys = Shared::<f32>::base();
        // The gate's tile after the keys, or (`SCALAR`) its one word per row in the keys'
        // padding; `beta` after them.
        let (gates, betas) = if SCALAR {
            (Gates { tile: keys.add(SCALAR_GATE_COL), per_key }, keys.add(CHUNK * ROW_WORDS))
        } else {
            let gates = Gates { tile: keys.add(CHUNK * ROW_WORDS), per_key };
            (gates, gates.tile.add(CHUNK * ROW_WORDS))
        };
        let lower = betas.add(CHUNK);
        let inverse = lower.add(CHUNK * MATRIX_ROW_WORDS);
        // Fused: the queries (bf16) after the inverses.
        let queries = inverse.add(SUBS * SUB * INVERSE_ROW_WORDS).cast::<u16>();

        // Every input of the chunk's first steps in flight at once (one wait for memory, not
        // one per tile): the keys, the gate (a per-key gate's rows in the layout its
        // activation takes, 4 columns per thread; a per-head gate a row per thread), `beta`
        // and the activation's scalars.
        let key_rows = fetch_rows(k, &wk, d.heads, wk.j, kd);
        let gate_bf16 = options & OPT_GATE_BF16 != 0;
        let gate_values = fetch_gate(g, &wk, &d, gate_bf16);
        let raw_beta = if tid < rows { load_float(beta, (t0 + tid) * hv + i, options & OPT_BETA_BF16 != 0) } else { 0.0 };
        let strength = if a_log.is_null() { 1.0 } else { exp(*a_log.add(i)) };
        // The thread's gate columns (the same in every row it takes: `4 THREADS` is a
        // multiple of `K`), so their biases are read once.
        let gate_walk = gate_values.0.walk;
        let bias_col = if per_key { gate_walk.col } else { 0 };
        let bias: [f32; F32_VECTOR] = core::array::from_fn(|j| {
            if dt_bias.is_null() || j >= gw { 0.0 } else { *dt_bias.add(i * gw + bias_col + j) }
        });

        put_rows(keys, &key_rows, &wk, kd, options & OPT_L2NORM != 0);
        // Fused: the queries' loads issued here (the keys' registers free), to arrive under
        // the gate's activation and sums.
        let query_rows =
            if FUSED { fetch_rows(fused.q, &wk, d.heads, wk.j, kd) } else { Fetched::<ROW_VECTORS>::none() };

        // The decay per row (log2), activated when raw, into the tile; `beta` (zero past the
        // valid rows). The mode is chosen once, outside the loop (one activation's code in
        // the kernel, not one per element of a vector).
        let lower_bound = f32::from_bits(lower_bound_bits);
        // The raw gate into the tile, then each thread activates its own elements in place
        // (`Gates::put`: no barrier between); the activation inside the store's loop would
        // index the fetched vectors at run time (a loop too long to unroll).
        gates.put(&gate_values, rows, gate_bf16);
        let activate_rows = |mode: u32| {
            let act = |raw: f32, bias: f32| activate_on(Sfu::Ftz, raw, mode, strength, bias, lower_bound) * LOG2_E;
            if per_key {
                let RowWalk { r0, col: a, step, .. } = gate_walk;
                let mut r = r0;
                while r < rows as u32 {
                    let raw = row4(gates.tile, r as usize, a);
                    set_row4(gates.tile, r as usize, a, core::array::from_fn(|j| act(raw[j], bias[j])));
                    r += step;
                }
            } else if tid < rows {
                let x = gates.tile.add(tid * ROW_WORDS);
                x.st(act(x.ld(), bias[0]));
            }
        };
        match gate_mode {
            GATE_SOFTPLUS => activate_rows(GATE_SOFTPLUS),
            GATE_LOWER_BOUND => activate_rows(GATE_LOWER_BOUND),
            _ => activate_rows(GATE_LOG),
        }
        if tid < CHUNK {
            betas.add(tid).st(if tid >= rows {
                0.0
            } else if options & OPT_BETA_SIGMOID != 0 {
                sigmoid(raw_beta)
            } else {
                raw_beta
            });
        }
        sync_threads();
        // G: the decay summed down each column.
        for a in strided(tid, gw) {
            let mut acc = 0.0;
            for r in 0..rows {
                let x = gates.tile.add(r * ROW_WORDS + a);
                acc += x.ld();
                x.st(acc);
            }
        }
        sync_threads();
        gates.pad(rows, gw);

        // -L = -strictly_lower(diag(beta) (k Γ) (k / Γ)^T), negated once here for the two
        // products that subtract it (the inverses' substitution and `R_b - L_b,<b X_<b`).
        // Each diagonal sub-block's warp then inverts it (I + L's diagonal blocks).
        let lower_product =
            Gated { x: F32Rows(keys), out: F32Matrix(lower), strict: true, row_scale: move |r: usize| -betas.add(r).ld() };
        let invert = move |b| invert_diagonal_block(lower, inverse, b);
        if FUSED {
            // With L, in the same pass over the keys' decays: P = causal((q Γ) (k / Γ)^T),
            // diagonal included, straight to `attention` (its sub-blocks above the diagonal
            // zeros, stored apart). q Γ goes out below, with the right-hand side.
            put_rows_bf16(queries, &query_rows, &wk, kd, options & OPT_L2NORM != 0);
            zero_attention_above_diagonal(fused.attention_out, &wk, hv);
            let attention = GlobalBf16Matrix { out: fused.attention_out, at: RowsAt::heads(&wk, hv, i, CHUNK), rows };
            let attention_product = Gated { x: Bf16Rows(queries), out: attention, strict: false, row_scale: |_| 1.0 };
            gated_products((lower_product, attention_product), F32Rows(keys), gates, kd, invert);
        } else {
            gated_products(lower_product, F32Rows(keys), gates, kd, invert);
        }

        // The values' loads issued here, to arrive while the keys and gate go out and the
        // right-hand side is formed.
        // (`SCALAR`: issued after the solve of `w`, not held through it.)
        let fetch_values = || Fetched::<ROW_VECTORS>::bf16(v, (CHUNK, rows), vd, RowsAt::heads(&wk, hv, i, vd));
        let value_rows = if SCALAR { Fetched::<ROW_VECTORS>::none() } else { fetch_values() };
        let last = rows - 1;
        let row_at = RowsAt::heads(&wk, hv, i, kd);
        // The recurrence's gate, while the gate tile still holds it.
        if per_key && FUSED {
            // The fused recurrence reads a per-key gate's last row of each chunk only.
            if tid < kd / F32_VECTOR {
                let a = tid * F32_VECTOR;
                st_global_v4(gate_out.add(row_at.at(last) + a).cast::<u16>(), row4(gates.tile, last, a).map(f32::to_bits));
            }
        } else if per_key {
            store_rows_v4(gate_out, rows, (kd, F32_VECTOR), row_at, |r, a| {
                row4(gates.tile, r, a).map(f32::to_bits)
            });
        } else if tid < rows {
            *gate_out.add((t0 + tid) * hv + i) = gates.at(tid, 0);
        }
        // One walk down the rows (the gate's kind chosen once, outside it) for what the keys
        // and the gate give: of the valid rows, the recurrence's keys (KDA: `k Γ_last / Γ`;
        // GDN: the key head's normalised `k`, written by the first value head of its group;
        // without the L2 norm they are `k` itself, which the recurrence reads) and, fused,
        // `q Γ`; of every row, the right-hand side `diag(beta) k Γ` in place over the keys. Each
        // row's decay `Γ` is formed once for `q Γ` and the right-hand side. Each thread takes
        // the same 8 columns of every row it takes, so no thread overwrites a key another still
        // reads. Rows past the valid ones come out zeros without a branch: their keys and
        // `beta` are zeros, their G the last valid row's.
        let key_at = if per_key { row_at } else { RowsAt::heads(&wk, d.heads, wk.j, kd) };
        let write_keys = per_key || (options & OPT_L2NORM != 0 && i.checked_rem(d.group()) == Some(0));
        let walk_rows = |per_key: bool| {
            let RowWalk { r0, col, step, first, jump } = row_at.walk(kd, BF16_VECTOR);
            let key_walk = key_at.walk(kd, BF16_VECTOR);
            // Formed, not written, past the valid rows.
            let (mut key_to, mut qg_to) = (k_rec.wrapping_add(key_walk.first), fused.qg_out.wrapping_add(first));
            let last_gate = if per_key { row8(gates.tile, last, col) } else { [0.0; BF16_VECTOR] };
            let mut r = r0;
            while r < CHUNK as u32 {
                let row = r as usize;
                let (b, key) = (betas.add(row).ld(), row8(keys, row, col));
                let gate = if per_key { row8(gates.tile, row, col) } else { [gates.at(row, 0); BF16_VECTOR] };
                let decay = if per_key { gate.map(exp2) } else { [exp2(gate[0]); BF16_VECTOR] };
                if row < rows {
                    if write_keys {
                        let out = if per_key { core::array::from_fn(|j| key[j] * exp2(last_gate[j] - gate[j])) } else { key };
                        st_global_v4(key_to, pack_bf16x8(out));
                    }
                    if FUSED {
                        let query = unpack_bf16x8(ld_shared_v4(queries.add(row * KEY_ROW + col).addr()));
                        st_global_v4(qg_to, pack_bf16x8(core::array::from_fn(|j| query[j] * decay[j])));
                    }
                }
                let x = if per_key {
                    core::array::from_fn(|j| b * key[j] * decay[j])
                } else {
                    let scale = b * decay[0];
                    key.map(|k| scale * k)
                };
                set_row8(keys, row, col, x);
                r += step;
                key_to = key_to.wrapping_add(key_walk.jump);
                qg_to = qg_to.wrapping_add(jump);
            }
        };
        if per_key {
            walk_rows(true);
        } else {
            walk_rows(false);
        }
        sync_threads();
        if SCALAR {
            // w in place over the right-hand side, out; then u over diag(beta) v, in the same
            // tile once every thread has read its w.
            solve_tile(keys, kd, lower, inverse, warp, l);
            let value_rows = fetch_values();
            store_bf16_rows(w_out, rows, kd, row_at, |r, col| row8(keys, r, col));
            sync_threads();
            value_rows.store(|r, col, words| {
                let b = betas.add(r).ld();
                set_row8(keys, r, col, unpack_bf16x8(words).map(|x| b * x));
            });
            sync_threads();
            solve_tile(keys, vd, lower, inverse, warp, l);
            store_bf16_rows(u_out, rows, vd, RowsAt::heads(&wk, hv, i, vd), |r, col| row8(keys, r, col));
            return;
        }
        // Then, once no thread reads G any more, diag(beta) v over the gate tile (zeros past the
        // valid rows). The solution [w | u] stays there: w's columns in the key tile, u's in the
        // gate tile.
        let values = gates.tile;
        value_rows.store(|r, col, words| {
            let b = betas.add(r).ld();
            set_row8(values, r, col, unpack_bf16x8(words).map(|x| b * x));
        });
        sync_threads();

        // Block by block, each warp its own columns of [w | u] (no other warp touches them):
        // Y = R_b - L_b,<b X_<b, then X_b = (I + L_bb)^-1 Y.
        let cols_per_warp = (kd + vd) / (THREADS / LANES);
        let solve = Solve { keys, values, lower, inverse, kd, col0: warp * cols_per_warp, l };
        // One instantiation per count of n8 tiles a warp holds (`K`, `V` of 64 or 128).
        match cols_per_warp / TILE_N {
            2 => solve.run::<2>(),
            3 => solve.run::<3>(),
            _ => solve.run::<4>(),
        }
        sync_threads();

        // w and u.
        store_bf16_rows(w_out, rows, kd, row_at, |r, col| row8(keys, r, col));
        store_bf16_rows(u_out, rows, vd, RowsAt::heads(&wk, hv, i, vd), |r, col| row8(values, r, col));
    }
}

kernel_entry! {
    /// The layer's prepare kernel (`abi::LAYER_PREPARE`, parameters `abi::LAYER_PREPARE_PARAMS`).
    /// Grid: one CTA per (chunk, value head), chunk-major; `layout::layer::THREADS` threads;
    /// `layout::layer::PREPARE_SMEM_BYTES` of dynamic shared memory.
    ///
    /// Reads `k` `[T, H, K]`, `v` `[T, HV, V]` (bf16), the gate `g` `[T, HV, gate_width]`, `beta`
    /// `[T, HV]` (f32, or bf16 with `OPT_GATE_BF16` / `OPT_BETA_BF16` in `options`) and, for a raw
    /// gate, `a_log` `[HV]` and `dt_bias` `[HV, gate_width]` (either
    /// may be null: 0 and 1 in their place); writes `w` `[T, HV, K]`, `u` `[T, HV, V]` (bf16), the
    /// recurrence's keys `k_rec` (bf16; KDA `[T, HV, K]`; GDN `[T, H, K]`, only with `OPT_L2NORM`:
    /// without it they are `k`) and gate `gate_out` (f32 `[T, HV, gate_width]`, log2, cumulative
    /// inside each chunk).
    ///
    /// # Safety
    /// `chunks` holds `gridDim.x / value_heads` entries (first token, valid rows `1..=CHUNK`), each
    /// chunk's rows inside every tensor; the outputs overlap nothing.
    pub unsafe fn kda_layer_prepare(
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
        let t = PrepareTensors { k, v, g, beta, a_log, dt_bias, chunks, k_rec, w_out, u_out, gate_out };
        let none = AttentionTensors { q: core::ptr::null(), qg_out: core::ptr::null_mut(), attention_out: core::ptr::null_mut() };
        let words = PrepareWords { heads, value_heads, key_dim, value_dim, gate_width, options, gate_mode, lower_bound_bits };
        // SAFETY: this entry's contract.
        unsafe { prepare::<false, false>(t, none, words) }
    }
}

/// The two fused prepare entries, one parameter list (`abi::LAYER_PREPARE_FUSED_PARAMS`):
/// `prepare::<true, $scalar>`.
macro_rules! fused_prepare_entry {
    ($(#[$attr:meta])* $name:ident, $scalar:literal) => {
        kernel_entry! {
            $(#[$attr])*
            pub unsafe fn $name(
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
                q: *const u16,
                qg_out: *mut u16,
                attention_out: *mut u16,
                heads: u32,
                value_heads: u32,
                key_dim: u32,
                value_dim: u32,
                gate_width: u32,
                options: u32,
                gate_mode: u32,
                lower_bound_bits: u32,
            ) {
                let t = PrepareTensors { k, v, g, beta, a_log, dt_bias, chunks, k_rec, w_out, u_out, gate_out };
                let fused = AttentionTensors { q, qg_out, attention_out };
                let words =
                    PrepareWords { heads, value_heads, key_dim, value_dim, gate_width, options, gate_mode, lower_bound_bits };
                // SAFETY: this entry's contract.
                unsafe { prepare::<true, $scalar>(t, fused, words) }
            }
        }
    };
}

fused_prepare_entry! {
    /// The fused layer's prepare kernel (`abi::LAYER_PREPARE_FUSED`, parameters
    /// `abi::LAYER_PREPARE_FUSED_PARAMS`): [`kda_layer_prepare`]'s work and the output's
    /// token-parallel part for the fused recurrence (`abi::HOPPER_FUSED`, or the portable
    /// kernel's `abi::PORTABLE_FUSED`), which forms `o` in its chunk loop. Grid and threads as
    /// [`kda_layer_prepare`]; `layout::layer::PREPARE_FUSED_SMEM_BYTES` of dynamic shared memory
    /// (two CTAs per SM on 9.x; more than the 99 KB a CTA gets on sm_86, sm_89 and sm_120, which
    /// run the separate path).
    ///
    /// Also reads `q` `[T, H, K]` (bf16) and writes the valid rows of `qg` (`bf16(q Γ)`,
    /// `[T, HV, K]`) and `attention` (`[T, HV, CHUNK]` bf16: token `r`'s row of its chunk's
    /// causal attention, zeros past column `r`); of a per-key gate writes each chunk's last row
    /// only.
    ///
    /// # Safety
    /// As for [`kda_layer_prepare`].
    kda_layer_prepare_fused, false
}

fused_prepare_entry! {
    /// The fused layer's prepare kernel for a per-head gate or none (Gated DeltaNet;
    /// `abi::LAYER_PREPARE_FUSED_SCALAR`, parameters `abi::LAYER_PREPARE_FUSED_PARAMS`):
    /// [`kda_layer_prepare_fused`]'s work and outputs in
    /// `layout::layer::PREPARE_SCALAR_FUSED_SMEM_BYTES` of dynamic shared memory (no gate tile:
    /// three CTAs per SM on 9.x, two on the A100, one on the 99 KB parts). Grid and threads as
    /// [`kda_layer_prepare`].
    ///
    /// # Safety
    /// As for [`kda_layer_prepare`]; `gate_width` is 1.
    kda_layer_prepare_fused_scalar, true
}
