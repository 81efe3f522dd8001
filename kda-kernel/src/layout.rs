//! The contract's sizes and the kernels' tile shapes, shared by the device code and the host
//! launcher so that every constant lives once.
//!
//! This module compiles for every target (it has no device code), which lets the stable host crate
//! depend on `kda-kernel` for these numbers while the kernels themselves are built for
//! `nvptx64-nvidia-cuda` only.

/// Tokens per chunk: the recurrence's step (the `BT` of the contract).
pub const CHUNK: usize = 64;
/// Key dimension `K` of the contract.
pub const K_DIM: usize = 128;
/// Value dimension `V` of KDA models, and the only one the baseline kernel runs.
pub const V_DIM: usize = 128;
/// The largest value dimension `V` of the contract (the Hopper kernel runs every multiple of its
/// column block `hopper::BV` up to this).
pub const MAX_V_DIM: usize = 512;

/// Dynamic shared memory a CTA may have on every GPU of compute capability 8.0 and newer: sm_86,
/// sm_89 and sm_120 allow 99 KB per block (sm_80 163 KB, 9.x 227 KB). Every kernel of the
/// portable module fits it (`every_portable_kernel_fits_every_sm80_gpu`).
pub const SM80_SMEM_PER_CTA: usize = 99 * 1024;

/// Words (`i64`) per sequence descriptor in the plan the host uploads:
/// `[first token, length in tokens, first chunk in h, index in the batch]`. The table is in
/// launch order, longest sequence first (`kda::Plan::descriptors`): the kernels with one CTA per
/// item take their sequence from the CTA's index in that order, so the longest chains start
/// first and the short ones fill in behind them, and find the sequence's states (`h0`, `ht`) at
/// its index in the batch.
pub const SEQ_DESC_WORDS: usize = 4;
/// Index of the first-token word in a sequence descriptor.
pub const DESC_TOKEN_START: usize = 0;
/// Index of the length word in a sequence descriptor.
pub const DESC_LEN: usize = 1;
/// Index of the first-chunk word in a sequence descriptor.
pub const DESC_CHUNK_START: usize = 2;
/// Index of the word holding the sequence's index in the batch (its row of `h0` and `ht`).
pub const DESC_SEQ: usize = 3;

/// Words (`u32`) per work-item record of the Hopper kernel's schedule table: everything a CTA
/// needs to start an item, in three 16-byte reads (no second read of the sequence's descriptor
/// on the path to the item's first loads). Worker `b`'s first item is record `b`; each record
/// names the worker's next one (or [`ITEM_LAST`]). Words past [`ITEM_NEXT`] are zero.
pub const ITEM_WORDS: usize = 12;
/// Index of the item's row of `h0` (`[rows][K][V]` view, the initial states it reads) in a
/// record: `seq * HV + head` for a whole sequence, the segment's entry-state row when split, the
/// sequence's row for a first segment's pre-scan (its value columns from `h0`), or
/// [`ITEM_NO_ROW`] for an item that starts from no state (the pre-scan's maps start from
/// `[I | 0]`).
pub const ITEM_H0_ROW: usize = 0;
/// Index of the item's row of `ht` in a record (the final state it writes), or [`ITEM_NO_ROW`]
/// for a segment whose final state is not wanted.
pub const ITEM_HT_ROW: usize = 1;
/// Index of the (value) head word in a record.
pub const ITEM_HEAD: usize = 2;
/// Index of the key head word (`head / (HV / H)`: the head of `k` a grouped value head reads) in
/// a record.
pub const ITEM_KEY_HEAD: usize = 3;
/// Index of the first-value-column word (the column block times its width) in a record: the
/// columns of the state (and of `h`, `v_new`, `ht`) the item runs.
pub const ITEM_VCOL0: usize = 4;
/// Index of the first column of `u` the item reads in a record: its first value column, except in
/// the pre-scan, whose value columns are `[0 | u]`: the map's key columns read no `u`
/// ([`ITEM_NO_U`]).
pub const ITEM_U_COL: usize = 5;
/// Index of the sequence's (or segment's) first-token word in a record.
pub const ITEM_TOKEN_START: usize = 6;
/// Index of the length word (tokens) in a record.
pub const ITEM_LEN: usize = 7;
/// Index of the first-chunk word (in `h`) in a record.
pub const ITEM_CHUNK_START: usize = 8;
/// Index of the word naming the worker's next record in a record.
pub const ITEM_NEXT: usize = 9;
/// A row word naming no row.
pub const ITEM_NO_ROW: u32 = u32::MAX;
/// The `u`-column word of an item whose values are zero (no `u` is loaded).
pub const ITEM_NO_U: u32 = u32::MAX;
/// The next-record word of a worker's last item.
pub const ITEM_LAST: u32 = u32::MAX;

/// Words (`u32`) per sequence of the split merge's table.
pub const MERGE_WORDS: usize = 5;
/// Index of the sequence's index (its row of `h0` is `seq * HV + head`) in a merge record.
pub const MERGE_SEQ: usize = 0;
/// Index of the sequence's first entry-state row (`(first + s) * HV + head` for segment `s`).
pub const MERGE_FIRST_ENTRY: usize = 1;
/// Index of the sequence's segment count.
pub const MERGE_SEGMENTS: usize = 2;
/// Index of the sequence's first map row (`(first + s) * HV + head` for segment `s`, every
/// segment but the last).
pub const MERGE_FIRST_MAP: usize = 3;
/// Index of the word that is 1 when the sequence's first map holds, in its `B` columns, the
/// first segment's exit state itself (the pre-scan ran that segment's value columns from `h0`;
/// the map's key columns are not written), so `entry(1)` is those columns; 0 when it is a whole
/// map `[M | B]` like the others.
pub const MERGE_FIRST_EXIT: usize = 4;

/// Number of chunks of a sequence of `len` tokens (`ceil(len / CHUNK)`).
#[inline(always)]
pub const fn chunks_of(len: usize) -> usize {
    len.div_ceil(CHUNK)
}

/// Tile shapes of the split merge (`kda_split_merge`).
pub mod merge {
    use super::hopper::KEY_DIMS;

    /// Value columns one CTA chains: narrow, so the merge of a few heads still spreads over many
    /// SMs (its steps are serial within a sequence) and each CTA's step is short.
    pub const COLS: usize = 8;
    /// Threads per CTA: two per key row (one 4-column quad each) for 64 rows at a time.
    pub const THREADS: usize = 128;
    /// Key rows computed at once by the CTA (`THREADS` over the quads of a row).
    pub const ROWS_PER_PASS: usize = THREADS / (COLS / 4);
    /// The largest key size the merge holds.
    pub const MAX_K: usize = 256;
    /// f32 words of one buffer of the entry block (`MAX_K x COLS`); two of them from word 0 on
    /// (read one, write the next).
    pub const ENTRY_WORDS: usize = MAX_K * COLS;
    /// Key columns of `M_s` one stage of the ring holds: a unit of work is one pass's rows
    /// against this many keys of the entry block, so a stage's size does not grow with `K`.
    pub const KEY_BLOCK: usize = 64;
    /// f32 words of a staged row of `M_s`: `KEY_BLOCK` and one 16-byte vector of padding, so that
    /// the rows a warp reads together (16 of them, a lane per quad; 4 to each 128-byte wavefront)
    /// start in different banks.
    pub const STAGE_ROW_WORDS: usize = KEY_BLOCK + 4;
    /// f32 words of one stage: `ROWS_PER_PASS` rows of `M_s` (`STAGE_ROW_WORDS` each), then the
    /// same rows' `COLS` columns of `B_s` (`[ROWS_PER_PASS][COLS]`, used by a pass's first unit).
    pub const STAGE_WORDS: usize = ROWS_PER_PASS * (STAGE_ROW_WORDS + COLS);
    /// Stages of the ring: two units' copies in flight while a third is computed (the copies of
    /// a unit take about one L2 round trip, its products about as long).
    pub const STAGES: usize = 3;
    /// Word offset of the ring, after the two entry buffers.
    pub const STAGES_AT: usize = 2 * ENTRY_WORDS;
    /// Shared memory: the entry buffers and the ring, f32: under the 99 KB a CTA gets on sm_86,
    /// sm_89 and sm_120, so every sm_80+ GPU runs it.
    pub const SMEM_BYTES: usize = (STAGES_AT + STAGES * STAGE_WORDS) * 4;

    const _: () = {
        assert!(COLS.is_multiple_of(4) && super::hopper::BV.is_multiple_of(COLS));
        assert!(KEY_BLOCK.is_multiple_of(4) && STAGE_ROW_WORDS.is_multiple_of(4));
        assert!(SMEM_BYTES <= 99 * 1024, "the merge fits the smallest opt-in shared memory of sm_80+");
        let mut i = 0;
        while i < KEY_DIMS.len() {
            assert!(KEY_DIMS[i] <= MAX_K && KEY_DIMS[i].is_multiple_of(ROWS_PER_PASS));
            assert!(KEY_DIMS[i].is_multiple_of(KEY_BLOCK), "a stage spans key columns only");
            i += 1;
        }
    };
}

/// Sizes of the layer's token-parallel kernels (`kda_layer_prepare`, `kda_layer_output`): one CTA
/// per (chunk, value head), plain f32 arithmetic (every sm_80+ target has it).
pub mod layer {
    use super::CHUNK;

    /// Threads per CTA: one per column of `[w | u]` at `K = V = 128` in the forward substitution.
    pub const THREADS: usize = 256;
    /// The largest key size the layer kernels hold (their shared-memory tiles are sized for it).
    pub const MAX_K: usize = 128;
    /// The largest value size the layer kernels hold.
    pub const MAX_V: usize = 128;
    /// Words per chunk of the chunk table: the chunk's first token and its valid rows.
    pub const CHUNK_WORDS: usize = 2;
    /// Option bit: `q` and `k` rows L2-normalised inside the layer.
    pub const OPT_L2NORM: u32 = 1;
    /// Option bit: `beta` given as logits (the sigmoid inside the layer).
    pub const OPT_BETA_SIGMOID: u32 = 2;
    /// Option bit: the gate `g` given in bf16 (else f32), as model code projects it.
    pub const OPT_GATE_BF16: u32 = 4;
    /// Option bit: `beta` given in bf16 (else f32).
    pub const OPT_BETA_BF16: u32 = 8;
    /// Option field (bits 16 to 23) of the decode step: a start offset between its CTAs that
    /// share an SM in its first wave, in units of [`STAGGER_UNIT_NS`]; 0 starts them together.
    /// Bits 24 to 31 carry the SM count it divides the grid's first wave by.
    pub const OPT_STAGGER_SHIFT: u32 = 16;
    /// The launch's SM count in the options word (bits 24 to 31).
    pub const OPT_SMS_SHIFT: u32 = 24;
    /// An 8-bit field's mask.
    pub const OPT_FIELD_MASK: u32 = 0xff;
    /// Nanoseconds per unit of the stagger field: 255 units cover 65 us, four times the longest
    /// CTA of the decode step measured (verify's, about 15 us).
    pub const STAGGER_UNIT_NS: u32 = 256;
    /// Gate mode: the gate is the decay in natural log.
    pub const GATE_LOG: u32 = 0;
    /// Gate mode: `-exp(A_log) * softplus(g + dt_bias)`.
    pub const GATE_SOFTPLUS: u32 = 1;
    /// Gate mode: `lower_bound * sigmoid(exp(A_log) * (g + dt_bias))`.
    pub const GATE_LOWER_BOUND: u32 = 2;

    /// Rows of a sub-block: the `M` of the `mma` tiles. The chunk's matrices are handled in
    /// `SUB x SUB` blocks: off the diagonal as products of gated tiles, on it element by element.
    pub const SUB: usize = 16;
    /// Sub-blocks per chunk.
    pub const SUBS: usize = CHUNK / SUB;
    /// f32 words between the rows of a `[CHUNK][MAX_K]` tile: `MAX_K + 8`, 8 words apart mod 32
    /// banks, so the 8-byte pairs a half-warp's `mma` fragment reads along its rows (4 rows, a
    /// lane's two adjacent depths at 4 columns) fall on 32 different banks, and so do the words a
    /// warp reads down its columns at depths `t` and `t + 4` (8 columns, 4 rows: the solve's
    /// right-hand operand). At `MAX_K + 4` each such 8-byte load took 4 wavefronts, not 2.
    pub const ROW_WORDS: usize = MAX_K + 8;
    /// f32 words between the rows of the strictly lower `[CHUNK][CHUNK]` matrix `L`: 4 words
    /// apart mod 32 banks, so the solve's A fragment, read one word at a time at depths `t` and
    /// `t + 4` (8 rows, 4 columns), falls on 32 different banks.
    pub const MATRIX_ROW_WORDS: usize = CHUNK + 4;
    /// f32 words between the rows of a sub-block's inverse (`[SUB][SUB]`): 20, an odd multiple
    /// of 4 words, for the same reason.
    pub const INVERSE_ROW_WORDS: usize = SUB + 4;
    /// bf16 elements between the rows of the output kernel's staged `h` and `v_new`: `MAX_V + 8`
    /// (rows 16-byte aligned for `ldmatrix`, and 4 words apart mod 32 banks, so the 8 rows of
    /// one 8 x 8 matrix fall on different banks).
    pub const STAGED_ROW: usize = MAX_V + 8;
    /// bf16 elements between the rows of the output kernel's key tile: `MAX_K + 8`, 4 words
    /// apart mod 32 banks (a fragment reads a lane's two adjacent depths as one 4-byte word, 8
    /// rows by 4 words).
    pub const KEY_ROW: usize = MAX_K + 8;
    /// bf16 elements between the rows of the output kernel's causal attention (`[CHUNK][CHUNK]`,
    /// bf16 as FLA rounds it before the product with `v_new`): `CHUNK + 8`, a 4-words-mod-32
    /// stride.
    pub const ATTENTION_ROW: usize = CHUNK + 8;

    /// Shared-memory banks (4 bytes each): f32 words `SHARED_BANKS` apart share a bank.
    pub const SHARED_BANKS: usize = 32;

    /// Which half (the word offset, 0 or 4) of the 8 f32 columns from `c` (a multiple of 8) an
    /// access of 8 f32 takes first, in two 16-byte accesses: the second half where `c / 32` is
    /// odd. The 8 lanes of a quarter-warp take 8 consecutive such groups of a row; if every lane
    /// took its first half first, the groups 32 columns apart would meet on the same 4 banks (16
    /// of the 32 banks used, two wavefronts per 16-byte access); so the lanes of odd 32-column
    /// spans start with their second half.
    #[inline(always)]
    pub const fn first_half(c: usize) -> usize {
        (c / SHARED_BANKS) % 2 * 4
    }

    /// f32 words of the prepare kernel's shared memory: the chunk's keys and cumulative gate
    /// (`[CHUNK][ROW_WORDS]` each; then the solution `[w | u]`, `w` over the keys and `u` over the
    /// gate), `beta` (`[CHUNK]`), the strictly lower matrix `L` and the inverses of its diagonal
    /// sub-blocks plus identity: about 92 KB, two CTAs per SM.
    pub const PREPARE_WORDS: usize =
        2 * CHUNK * ROW_WORDS + CHUNK + CHUNK * MATRIX_ROW_WORDS + SUBS * SUB * INVERSE_ROW_WORDS;
    /// Bytes of the prepare kernel's shared memory.
    pub const PREPARE_SMEM_BYTES: usize = PREPARE_WORDS * 4;
    /// Bytes of the fused layer's prepare kernel's shared memory: the prepare kernel's and the
    /// chunk's queries (bf16 `[CHUNK][KEY_ROW]`; the causal attention, formed in the same pass as
    /// `L`, goes from its accumulators to global memory). About 110 KB: two CTAs per SM on 9.x,
    /// the only GPUs it runs on.
    pub const PREPARE_FUSED_SMEM_BYTES: usize = PREPARE_SMEM_BYTES + CHUNK * KEY_ROW * 2;
    /// Shared memory one CTA may use with two per SM on 9.x (228 KB per SM, 1 KB of it reserved
    /// per CTA).
    pub const SM90_TWO_CTA_SMEM: usize = 228 * 1024 / 2 - 1024;
    /// Shared memory one CTA may use with three per SM on 9.x.
    pub const SM90_THREE_CTA_SMEM: usize = 228 * 1024 / 3 - 1024;
    /// Bytes of the fused prepare kernel's shared memory for a per-head gate (or none,
    /// `kda_layer_prepare_fused_scalar`): [`PREPARE_FUSED_SMEM_BYTES`] without the gate tile,
    /// whose one word per row lies in the key tile's padding ([`SCALAR_GATE_COL`]); the solve
    /// then runs `w` and `u` in turn over the key tile. 73 KB: three CTAs per SM on 9.x (the
    /// prepare kernel is paced by its warps in flight: 1.10x faster than at two, H100).
    pub const PREPARE_SCALAR_FUSED_SMEM_BYTES: usize = PREPARE_FUSED_SMEM_BYTES - CHUNK * ROW_WORDS * 4;
    /// The column of the key tile (`[CHUNK][ROW_WORDS]`, keys in columns below `MAX_K`) that
    /// holds a per-head gate in the scalar prepare kernel: the first padding word of each row.
    pub const SCALAR_GATE_COL: usize = MAX_K;
    /// f32 words of the output kernel's shared memory: the chunk's keys (`[CHUNK][KEY_ROW]` bf16),
    /// queries (`[CHUNK][ROW_WORDS]` f32), cumulative gate (`[CHUNK][ROW_WORDS]` f32) and causal
    /// attention (`[CHUNK][ATTENTION_ROW]` bf16). Once the attention is formed, `q Γ` (bf16, the
    /// keys' shape) replaces the keys, and `h` (`[MAX_K][STAGED_ROW]`) and `v_new`
    /// (`[CHUNK][STAGED_ROW]`, bf16) are staged over the queries and the gate. 96 KB: every
    /// sm_80+ GPU holds it, two CTAs per SM on 9.x.
    pub const OUTPUT_WORDS: usize = OUTPUT_ATTENTION_AT / 4 + CHUNK * ATTENTION_ROW / 2;
    /// Byte offsets in the output kernel's shared memory (see [`OUTPUT_WORDS`]); the keys (then
    /// `q Γ`) at 0.
    pub const OUTPUT_QUERIES_AT: usize = CHUNK * KEY_ROW * 2;
    pub const OUTPUT_GATES_AT: usize = OUTPUT_QUERIES_AT + CHUNK * ROW_WORDS * 4;
    pub const OUTPUT_ATTENTION_AT: usize = OUTPUT_GATES_AT + CHUNK * ROW_WORDS * 4;
    /// Where the staged `h` starts; `v_new` follows it.
    pub const OUTPUT_STAGED_AT: usize = OUTPUT_QUERIES_AT;
    /// Bytes of the output kernel's shared memory.
    pub const OUTPUT_SMEM_BYTES: usize = OUTPUT_WORDS * 4;
    /// Byte offsets in the shared memory of the output kernel on prepared attention
    /// (`kda_layer_output_prepared`), whose tiles are all loaded at once: `q Γ` at 0 (bf16
    /// `[CHUNK][KEY_ROW]`), the causal attention (`[CHUNK][ATTENTION_ROW]`), then the staged `h`
    /// (`[MAX_K][STAGED_ROW]`) and `v_new` (`[CHUNK][STAGED_ROW]`).
    pub const OUTPUT_PREPARED_ATTENTION_AT: usize = CHUNK * KEY_ROW * 2;
    pub const OUTPUT_PREPARED_STAGED_AT: usize = OUTPUT_PREPARED_ATTENTION_AT + CHUNK * ATTENTION_ROW * 2;
    /// Bytes of its shared memory: 77 KB, two CTAs per SM on the A100 and 9.x classes (the
    /// output kernel that forms the attention itself takes 96 KB, one on the A100).
    pub const OUTPUT_PREPARED_SMEM_BYTES: usize = OUTPUT_PREPARED_STAGED_AT + (MAX_K + CHUNK) * STAGED_ROW * 2;

    const _: () = {
        assert!(THREADS >= CHUNK, "one thread per row for the row loops");
        assert!(MAX_V <= MAX_K, "u's columns of the solution fit the gate tile");
        assert!(THREADS / 32 == 8 && SUBS == 4, "eight warps: the six lower sub-block pairs, then 4 x 2 output tiles");
        assert!(
            OUTPUT_STAGED_AT + (MAX_K + CHUNK) * STAGED_ROW * 2 <= OUTPUT_ATTENTION_AT,
            "h and v_new fit over the queries and the gate"
        );
        assert!(
            OUTPUT_STAGED_AT.is_multiple_of(16)
                && OUTPUT_ATTENTION_AT.is_multiple_of(16)
                && (STAGED_ROW * 2).is_multiple_of(16),
            "the tiles ldmatrix reads start and keep their rows 16-byte aligned"
        );
        assert!(KEY_ROW.is_multiple_of(2), "the gate tile after the keys stays 4-byte aligned");
        assert!(
            OUTPUT_PREPARED_ATTENTION_AT.is_multiple_of(16) && OUTPUT_PREPARED_STAGED_AT.is_multiple_of(16),
            "the prepared output kernel's tiles start 16-byte aligned for ldmatrix"
        );
        assert!(
            OUTPUT_PREPARED_SMEM_BYTES <= super::SM80_SMEM_PER_CTA && OUTPUT_PREPARED_SMEM_BYTES <= OUTPUT_SMEM_BYTES,
            "the prepared output kernel runs wherever the output kernel does"
        );
        assert!(
            PREPARE_SMEM_BYTES <= super::SM80_SMEM_PER_CTA && OUTPUT_SMEM_BYTES <= super::SM80_SMEM_PER_CTA,
            "the layer kernels run on every sm_80+ GPU"
        );
        assert!(PREPARE_FUSED_SMEM_BYTES <= SM90_TWO_CTA_SMEM, "the fused prepare kernel keeps two CTAs per SM");
        assert!(
            PREPARE_SCALAR_FUSED_SMEM_BYTES <= SM90_THREE_CTA_SMEM,
            "the scalar prepare kernel runs three CTAs per SM"
        );
        assert!(SCALAR_GATE_COL < ROW_WORDS, "the per-head gate lies in the key tile's padding");
        assert!((PREPARE_WORDS * 4).is_multiple_of(16), "the fused prepare kernel's queries start 16-byte aligned");
    };
}

/// Sizes of the decode step (`kda_decode_step`): one CTA per (sequence, value head, block of
/// `COLS` value columns); each warp holds every key of its own `WARP_COLS` columns, so that a
/// token's sums over the keys stay inside the warp (shuffles, no shared memory, no CTA barrier).
pub mod decode {
    /// State columns per thread: one 16-byte vector of f32 (8 bytes of a bf16 pool).
    pub const VEC: usize = 4;
    /// Lanes of a warp along a row of the state: 64 contiguous bytes of an f32 row each.
    pub const COL_LANES: usize = 4;
    /// Value columns per warp: its column lanes' vectors.
    pub const WARP_COLS: usize = COL_LANES * VEC;
    /// Lanes of a warp along the keys: a token's sums take `log2(KEY_LANES)` shuffles.
    pub const KEY_LANES: usize = 32 / COL_LANES;
    /// Warps per CTA: 128 threads, 64 state values each at K = 128, so that the registers of
    /// four CTAs per SM (`abi::DECODE_MAX_REGISTERS`) hold 128 KB of states in flight.
    pub const WARPS: usize = 4;
    /// Value columns per CTA: the warps' columns. Two CTAs per (sequence, head) at V = 128, so
    /// that 64 sequences of 32 heads give 4096 CTAs.
    pub const COLS: usize = WARPS * WARP_COLS;
    /// Threads per CTA.
    pub const THREADS: usize = 32 * WARPS;
    /// CTAs of the decode step resident per SM, as its register budget allows
    /// (`abi::DECODE_MAX_REGISTERS`).
    pub const CTAS_PER_SM: usize = 4;
    /// Keys per shared-memory vector read of the staged `q`, `k` and decay (16 bytes). Each
    /// thread holds `K / KEY_LANES` keys of its `VEC` columns, in vectors of `KEY_VECTOR`
    /// interleaved with the other key lanes' (a warp's lanes read `KEY_LANES` consecutive
    /// vectors of the staged `q`, `k` and decay at once).
    pub const KEY_VECTOR: usize = 4;
    /// The key sizes the kernel runs are multiples of this (32): each key lane holds the same
    /// number of keys, whole vectors of them.
    pub const K_MULTIPLE: usize = KEY_LANES * KEY_VECTOR;
    /// The largest key size the registers hold (`MAX_K / KEY_LANES` keys per thread).
    pub const MAX_K: usize = 128;
    /// Keys per thread at `MAX_K`.
    pub const MAX_KEYS_PER_THREAD: usize = MAX_K / KEY_LANES;
    /// f32 words of a token's staged inputs: `q`, `k` and the decay per key (`[MAX_K]` each).
    pub const STAGE_WORDS: usize = 3 * MAX_K;
    /// The most tokens per sequence one call runs (speculative decoding's draft tokens): a
    /// token's path from the initial state is a bit mask over the sequence's tokens in one
    /// register, and a path has at most this many steps.
    pub const MAX_DRAFT: usize = 8;
    /// Bytes of a 16-byte `cp.async` copy, the unit the decode step stages its tokens' rows in.
    pub const COPY_BYTES: usize = 16;
    /// Byte offsets inside one token's raw inputs in shared memory, as the decode step copies
    /// them there (`cp.async`, before any of its tokens runs): `q` and `k` (bf16 `[MAX_K]`), the
    /// gate (f32 `[MAX_K]`, or its first word for a gate per head), the CTA's columns of `v`
    /// (bf16 `[COLS]`) and `beta` (f32; padded to a whole copy, so every token starts 16-byte
    /// aligned).
    pub const RAW_Q: usize = 0;
    pub const RAW_K: usize = RAW_Q + 2 * MAX_K;
    pub const RAW_G: usize = RAW_K + 2 * MAX_K;
    pub const RAW_V: usize = RAW_G + 4 * MAX_K;
    pub const RAW_BETA: usize = RAW_V + 2 * COLS;
    /// Bytes of one token's raw inputs.
    pub const RAW_TOKEN_BYTES: usize = RAW_BETA + COPY_BYTES;
    /// Offsets in f32 words: every draft token's staged `q`, `k` and decay (converted once, at
    /// the start, so that a token then waits on nothing but its warp's shuffles), every draft
    /// token's raw inputs.
    pub const STAGES_AT: usize = 0;
    pub const RAW_AT: usize = STAGES_AT + MAX_DRAFT * STAGE_WORDS;
    /// f32 words of shared memory: 21 KB, four CTAs per SM on every sm_80+ GPU.
    pub const SMEM_WORDS: usize = RAW_AT + MAX_DRAFT * RAW_TOKEN_BYTES / 4;
    /// Bytes of shared memory.
    pub const SMEM_BYTES: usize = SMEM_WORDS * 4;

    /// Copies staging one token at the largest sizes: 16-byte copies of `q`, `k`, the gate and
    /// `v`, and one f32 of `beta`.
    const TOKEN_COPIES: usize = (RAW_BETA - RAW_Q) / COPY_BYTES + 1;

    const _: () = {
        assert!(RAW_TOKEN_BYTES.is_multiple_of(COPY_BYTES) && RAW_AT.is_multiple_of(4), "staged rows 16-byte aligned");
        assert!(TOKEN_COPIES <= THREADS, "one copy per thread per token stages a token's rows");
        assert!(CTAS_PER_SM * SMEM_BYTES <= super::SM80_SMEM_PER_CTA, "four CTAs per SM on sm_86 and sm_89");
    };
}

/// The copy of whole states between a pool and a packed buffer (`pool`'s kernel).
pub mod pool_copy {
    /// Threads per CTA.
    pub const THREADS: usize = 256;
    /// f32 per thread: one 16-byte vector.
    pub const PER_THREAD: usize = 4;
    /// f32 per CTA.
    pub const PER_CTA: usize = THREADS * PER_THREAD;
}

/// Tile shapes of the baseline (portable, sm_80+) kernel.
pub mod baseline {
    use super::{CHUNK, K_DIM, V_DIM};

    /// V columns per CTA. 32 columns give 4 CTAs per (sequence, head), enough CTAs to fill the
    /// GPU on a single long sequence with H = 64 (256 CTAs on 132 SMs), and keep the shared tiles
    /// small enough for two CTAs per SM.
    pub const BV: usize = 32;
    /// Threads per CTA: 8 warps; each thread owns `STATE_ROWS` rows of one state column.
    pub const THREADS: usize = 256;
    /// State rows (of K) held by each thread for its column.
    pub const STATE_ROWS: usize = K_DIM * BV / THREADS;
    /// Rows of `Vn` (tokens) each thread computes for its column.
    pub const VN_ROWS: usize = CHUNK * BV / THREADS;
    /// V-column blocks per (sequence, head).
    pub const COL_BLOCKS: usize = V_DIM / BV;

    /// Shared memory: `k` and `w` chunk tiles (bf16 `[CHUNK][K]` each), `bf16(S)` (`[K][BV]`),
    /// `bf16(Vn)` (`[CHUNK][BV]`), and the chunk's decay row (f32 `[K]`).
    pub const SMEM_BYTES: usize = 2 * CHUNK * K_DIM * 2 + K_DIM * BV * 2 + CHUNK * BV * 2 + K_DIM * 4;

    const _: () = assert!(V_DIM.is_multiple_of(BV));
    const _: () = assert!(THREADS.is_multiple_of(BV) && (K_DIM * BV).is_multiple_of(THREADS));
    const _: () = assert!((CHUNK * BV).is_multiple_of(THREADS));
    const _: () = assert!(SMEM_BYTES <= 48 * 1024, "baseline must fit the default smem limit");
}

/// Tile shapes and shared-memory map of the portable tensor-core kernel (`kda-kernel/src/portable.rs`).
///
/// One CTA per (sequence, head, block of `G * BV` value columns), with both products of a chunk
/// on `mma.sync.m16n8k16` (bf16), in two warp roles: a **producer** warp copies each chunk's `w`,
/// `k` and `u` rows and gate values into a ring of `STAGES` shared-memory stages with
/// `cp.async`, while `G` **consumer groups** of `WARPS_PER_GROUP` warps run the chunk before it,
/// group `g` the block's columns `g * BV ..`: each of its warps holds `STATE_ROWS_PER_WARP` rows
/// of the group's `[K][BV]` state as accumulator fragments and computes `VN_ROWS_PER_WARP` token
/// rows of its `Vn` in all of the group's columns. The groups share the stage's `w` and `k` tiles, so a wide CTA (`G = 2`)
/// moves half the bytes per value column into the SM that a narrow one (`G = 1`) does. Every tile
/// is stored as the memory it comes from lays it out (token-major rows, or the state's key-major
/// rows) and read into fragments with `ldmatrix` (`.trans` where the product needs the
/// transpose), its rows padded by `PAD` elements so that the eight rows of each 8 x 8 matrix hit
/// different banks.
///
/// A stage is announced full by the hardware: each producer lane ends its share of a chunk's
/// copies with `cp.async.mbarrier.arrive` on the stage's `full` mbarrier, which counts once that
/// lane's copies have landed, and the consumers arrive on it and wait for its phase; so the
/// producer never waits for its own copies, only for free stages. The consumers hand a stage back
/// on a named barrier (`bar.arrive` by them, `bar.sync` by the producer, the whole CTA in all),
/// `empty_barrier(s)`, and each group meets on its `consumer_barrier(g)` between the products of
/// a chunk.
pub mod portable {
    use super::CHUNK;

    /// Value columns per consumer group: 32, so that one long sequence at H = 64 still gives
    /// 256 groups for 132 SMs.
    pub const BV: usize = 32;
    /// m16 tiles of a chunk's tokens: the row blocks of `Vn` among a group's warps.
    pub const VN_ROW_BLOCKS: usize = CHUNK / MMA_M;
    /// Consumer warps per group: four, each one m16 tile of `Vn` (16 tokens) in all 32 columns
    /// and `K / 4` state rows. Eight (each warp half a group's columns and 16 state rows, half of
    /// every warp's share of a chunk's chain) measured slower in one-group CTAs (fixed_8192 545.3
    /// against 378.0 us, mixed_6 568.3 against 399.1, H100, 2026-12-07) and did not launch in
    /// two-group ones (544 threads at 120 registers; bench/RESULTS.md, "Tried and rejected").
    pub const WARPS_PER_GROUP: usize = VN_ROW_BLOCKS;
    /// Consumer groups per CTA at most. A CTA of `G` groups runs a block of `G * BV` value
    /// columns: its groups share every chunk's `w` and `k` tiles (the bulk of the bytes), so two
    /// groups move half the `w`, `k` bytes per value column of one, where shared memory has room
    /// for their tiles and two stages (`WIDE_SMEM_LIMIT`).
    pub const MAX_GROUPS: usize = 2;
    /// The variants built, `(K, groups)`, one entry each: every key size with one group (for every
    /// sm_80+ GPU), and two groups where their tiles and a ring fit [`WIDE_SMEM_LIMIT`] (`K = 256`'s
    /// do not).
    pub const VARIANTS: [(usize, usize); 5] = [(64, 1), (128, 1), (256, 1), (64, 2), (128, 2)];

    /// Value columns of a CTA of `groups` groups: its block of the state.
    pub const fn block_cols(groups: usize) -> usize {
        groups * BV
    }

    /// The producer warp's index: the one after the consumers. One warp issues a chunk's copies
    /// (at most 146 16-byte or 4-byte `cp.async` per lane, at `K = 256`) in far less time than the
    /// consumers take over the chunk before.
    pub const fn producer_warp(groups: usize, warps: usize) -> usize {
        groups * warps
    }

    /// Threads per CTA of the entries of `groups` groups: the consumer groups
    /// ([`WARPS_PER_GROUP`] each) and the producer warp.
    pub const fn threads(groups: usize) -> usize {
        (groups * WARPS_PER_GROUP + 1) * 32
    }
    /// `mma.m16n8k16`'s shape.
    pub const MMA_M: usize = 16;
    pub const MMA_N: usize = 8;
    pub const MMA_K: usize = 16;
    /// Token rows of `Vn` per consumer warp (one m16 tile).
    pub const VN_ROWS_PER_WARP: usize = MMA_M;
    /// n8 tiles across the block's columns.
    pub const N_TILES: usize = BV / MMA_N;
    /// n8 tiles one `ldmatrix.x4` of a B operand covers (two 16 x 8 blocks side by side).
    pub const N_TILES_PER_LOAD: usize = 2;
    /// k16 steps of `k^T @ bf16(Vn)` (over the chunk's tokens).
    pub const STATE_K_STEPS: usize = CHUNK / MMA_K;
    /// Row padding of every bf16 tile, in elements: 8 bf16 = 16 bytes, so the eight 16-byte rows
    /// an `ldmatrix` matrix reads start 4 banks apart (rows of `K + PAD` or `BV + PAD` elements
    /// are an odd multiple of 16 bytes) and cover the 32 banks once; rows stay 16-byte aligned
    /// for `cp.async` and `ldmatrix`.
    pub const PAD: usize = 8;
    /// Row stride, in elements, of a group's tiles: `bf16(S)` `[K][BV_STRIDE]` and `bf16(Vn)`
    /// `[CHUNK][BV_STRIDE]`.
    pub const BV_STRIDE: usize = BV + PAD;
    /// bf16 elements per 16-byte vector of a copy.
    pub const VECTOR: usize = 8;
    /// The key sizes the kernel is built for, one entry each.
    pub const KEY_DIMS: [usize; 3] = [64, 128, 256];
    /// Shared memory one CTA may use on every sm_80+ GPU: the one-group entries' budget.
    pub const SMEM_LIMIT: usize = super::SM80_SMEM_PER_CTA;
    /// Shared memory one CTA may use on the A100 (163 KB, as on every data-center GPU after it,
    /// H100 / H200 and B200 allowing 227 KB): the two-group entries' budget. GPUs with less (the
    /// sm_86, sm_89 and sm_120 parts: 99 KB) run the one-group entries.
    pub const WIDE_SMEM_LIMIT: usize = 163 * 1024;

    /// Shared memory one CTA may use on the H100 / H200 and B200 (227 KB): the budget of the fused
    /// layer pass's two-group entries (`q Γ` and `P` tiles beside the ring leave a two-group
    /// ring no room in the A100's 163 KB at `K = 128`).
    pub const HOPPER_CLASS_SMEM_LIMIT: usize = 227 * 1024;

    /// The shared-memory budget of a CTA of `groups` groups.
    pub const fn smem_limit(groups: usize) -> usize {
        if groups > 1 { WIDE_SMEM_LIMIT } else { SMEM_LIMIT }
    }
    /// The deepest ring built: three stages cover a load's latency with two chunks of work.
    pub const MAX_STAGES: usize = 3;
    /// The named barrier among the consumer warps of group `group` (0 is `bar.sync 0`, the
    /// whole CTA's).
    pub const fn consumer_barrier(group: usize) -> u32 {
        1 + group as u32
    }

    /// The named barrier the consumers release stage `stage` on.
    pub const fn empty_barrier(stage: usize) -> u32 {
        consumer_barrier(MAX_GROUPS) + stage as u32
    }

    /// Arrivals that complete a phase of a stage's `full` mbarrier in a CTA of `threads`
    /// threads: the producer warp's 32 lanes (each once its copies have landed) and every
    /// consumer thread (which then waits on the phase with the token its arrival returned).
    pub const fn full_arrivals(threads: usize) -> u32 {
        threads as u32
    }

    /// Bytes of one mbarrier object in shared memory.
    pub const MBARRIER_BYTES: usize = 8;

    /// Bytes of the `full` mbarriers at the start of shared memory, one per stage, rounded up so
    /// that the tiles after them stay 16-byte aligned.
    pub const FULL_BARRIERS_BYTES: usize = (MAX_STAGES * MBARRIER_BYTES).next_multiple_of(16);

    /// The shapes and shared-memory map of the kernel for key size `K`, whose consumer warps each
    /// hold `MT` m16 tiles of state rows (a parameter of its own because an array length cannot
    /// be computed from `K`): `K / 64` with [`WARPS_PER_GROUP`] warps per group
    /// (`K / (16 MT)` warps in general). The column block's tiles, then the ring:
    ///
    /// | tile | layout |
    /// |---|---|
    /// | `full` | one mbarrier per stage ([`FULL_BARRIERS_BYTES`]) |
    /// | `st` | per group: `bf16(S)`, bf16 `[K][BV_STRIDE]` (key-major: the B operand of `w @ S`, read `.trans`) |
    /// | `vn` | per group: `bf16(Vn)` (scaled by the scalar gate), bf16 `[CHUNK][BV_STRIDE]` (token-major: the B operand of `k^T @ Vn`, read `.trans`) |
    /// | `STAGES` x stage | below |
    ///
    /// | stage tile | layout |
    /// |---|---|
    /// | `w` | the chunk's rows, bf16 `[CHUNK][K + PAD]` (the A operand, read as it is) |
    /// | `k` | the chunk's rows, bf16 `[CHUNK][K + PAD]` (`k^T` is the A operand, read `.trans`) |
    /// | `u` | the chunk's rows of the block's `G * BV` columns, bf16 `[CHUNK][G * BV + PAD]`, group `g`'s from column `g * BV`; each consumer warp overwrites its rows of its group's columns with `bf16(Vn)`, which the group then stores to `v_new` in 16-byte rows |
    /// | `gk_last` | `gk` of the chunk's last valid token, f32 `[K]` |
    /// | `g` | `g` per token, f32 `[CHUNK]` (zeros past the end) |
    /// | `q` | fused layer pass (`O`) only: the chunk's rows of `q Γ`, bf16 `[CHUNK][K + PAD]` (the A operand of `o = q Γ @ bf16(S)`) |
    /// | `p` | fused layer pass only: the chunk's rows of the causal attention `P`, bf16 `[CHUNK][CHUNK + PAD]` (the A operand of `o += P @ bf16(Vn)`) |
    ///
    /// Rows past a sequence's end are zero-filled by the copies, so a partial chunk needs no
    /// other handling in the products.
    pub struct Tiles<const K: usize, const MT: usize, const G: usize, const O: bool>;

    impl<const K: usize, const MT: usize, const G: usize, const O: bool> Tiles<K, MT, G, O> {
        /// Consumer warps per group: one m16 tile of state rows per `MT`, every row of `K` held.
        pub const WARPS: usize = K / (MMA_M * MT);
        /// Consumer threads per group: the count of its [`consumer_barrier`].
        pub const CONSUMERS: usize = Self::WARPS * 32;
        /// Threads of the CTA: the groups and the producer warp.
        pub const THREADS: usize = G * Self::CONSUMERS + 32;
        /// State rows (of K) per consumer warp.
        pub const STATE_ROWS_PER_WARP: usize = MT * MMA_M;
        /// k16 steps of `w @ bf16(S)` (over K).
        pub const VN_K_STEPS: usize = K / MMA_K;
        /// Row stride of the `w` and `k` tiles.
        pub const ROW_STRIDE: usize = K + PAD;
        /// Row stride of the `u` tile: the block's columns.
        pub const U_STRIDE: usize = G * BV + PAD;
        /// The `full` mbarriers, stage `s`'s at `s * MBARRIER_BYTES`.
        pub const FULL_OFFSET: usize = 0;
        /// Group 0's `st` and `vn` tiles; group `g`'s `g * GROUP_BYTES` after them.
        pub const ST_OFFSET: usize = Self::FULL_OFFSET + FULL_BARRIERS_BYTES;
        pub const VN_OFFSET: usize = Self::ST_OFFSET + K * BV_STRIDE * 2;
        pub const GROUP_BYTES: usize = (K + CHUNK) * BV_STRIDE * 2;
        pub const RING_OFFSET: usize = Self::ST_OFFSET + G * Self::GROUP_BYTES;
        /// Offsets inside a stage.
        pub const W_OFFSET: usize = 0;
        pub const K_OFFSET: usize = Self::W_OFFSET + CHUNK * Self::ROW_STRIDE * 2;
        pub const U_OFFSET: usize = Self::K_OFFSET + CHUNK * Self::ROW_STRIDE * 2;
        pub const GK_LAST_OFFSET: usize = Self::U_OFFSET + CHUNK * Self::U_STRIDE * 2;
        pub const G_OFFSET: usize = Self::GK_LAST_OFFSET + K * 4;
        /// Row stride of the fused pass's `P` tile.
        pub const P_STRIDE: usize = CHUNK + PAD;
        /// The fused pass's `q Γ` and `P` tiles (none outside it).
        pub const Q_OFFSET: usize = Self::G_OFFSET + CHUNK * 4;
        pub const P_OFFSET: usize = Self::Q_OFFSET + if O { CHUNK * Self::ROW_STRIDE * 2 } else { 0 };
        pub const STAGE_BYTES: usize = Self::P_OFFSET + if O { CHUNK * Self::P_STRIDE * 2 } else { 0 };
        /// The variant's shared-memory budget: [`smem_limit`]; for the fused pass the A100's
        /// with one group ([`WIDE_SMEM_LIMIT`]: its `q Γ` and `P` tiles leave no ring in 99 KB at
        /// `K = 128`), the H100's with two ([`HOPPER_CLASS_SMEM_LIMIT`]).
        pub const SMEM_BUDGET: usize = match (O, G) {
            (false, _) => smem_limit(G),
            (true, 1) => WIDE_SMEM_LIMIT,
            (true, _) => HOPPER_CLASS_SMEM_LIMIT,
        };
        /// Stages of the ring: as many as fit the variant's budget, at most [`MAX_STAGES`] (one
        /// group: 3 at `K = 64`, 2 at 128, 1 at 256, where the producer still copies the whole
        /// next chunk at once as soon as the consumers release the stage; two groups: 3 at
        /// `K = 64`, 2 at 128; the fused pass, one group: 3 at `K = 64`, 2 at 128).
        pub const STAGES: usize = {
            let fit = (Self::SMEM_BUDGET - Self::RING_OFFSET) / Self::STAGE_BYTES;
            if fit < MAX_STAGES { fit } else { MAX_STAGES }
        };
        pub const SMEM_BYTES: usize = Self::RING_OFFSET + Self::STAGES * Self::STAGE_BYTES;
        /// Holds when `MT` is `K`'s and every tile fits the kernel's loops (checked at each
        /// entry's instantiation).
        pub const VALID: () = {
            assert!(Self::WARPS * MMA_M * MT == K, "MT m16 tiles of state rows per warp");
            assert!(Self::WARPS == WARPS_PER_GROUP, "the variant's warps");
            assert!(N_TILES.is_multiple_of(N_TILES_PER_LOAD), "a warp's `Vn` tiles in whole loads");
            assert!(G >= 1 && G <= MAX_GROUPS && (Self::U_STRIDE * 2).is_multiple_of(16));
            assert!(K.is_multiple_of(VECTOR) && (Self::ROW_STRIDE * 2).is_multiple_of(16));
            assert!(Self::RING_OFFSET.is_multiple_of(16) && Self::STAGE_BYTES.is_multiple_of(16));
            assert!(Self::Q_OFFSET.is_multiple_of(16) && Self::P_OFFSET.is_multiple_of(16));
            assert!(Self::STAGES >= 1, "a stage must fit every sm_80+ GPU");
            assert!(!O || Self::STAGES >= 2, "the fused pass: a ring of two stages or more");
        };
    }

    /// The fused layer pass's variants, `(K, groups)`, one entry each: the key sizes the fused
    /// prepare kernel forms `q Γ` and `P` for, in one group (the A100 class) and two (the H100
    /// class, as many chains in flight as the recurrence's two-group entries).
    pub const FUSED_VARIANTS: [(usize, usize); 4] = [(64, 1), (128, 1), (64, 2), (128, 2)];

    /// Shared memory of the fused layer pass's entry for key size `key_dim` (64 or 128) and
    /// `groups` groups.
    pub const fn fused_smem_bytes(key_dim: usize, groups: usize) -> usize {
        match (key_dim, groups) {
            (64, 1) => Tiles::<64, 1, 1, true>::SMEM_BYTES,
            (128, 1) => Tiles::<128, 2, 1, true>::SMEM_BYTES,
            (64, _) => Tiles::<64, 1, 2, true>::SMEM_BYTES,
            _ => Tiles::<128, 2, 2, true>::SMEM_BYTES,
        }
    }

    /// Whether the fused variant `(key_dim, groups)` is built.
    pub const fn has_fused_variant(key_dim: usize, groups: usize) -> bool {
        lists(&FUSED_VARIANTS, key_dim, groups)
    }

    /// Shared memory of the entry for key size `key_dim` and `groups` groups: the fused layer
    /// pass's where `fused` says so, else the recurrence's.
    pub const fn entry_smem_bytes(key_dim: usize, groups: usize, fused: bool) -> usize {
        if fused { fused_smem_bytes(key_dim, groups) } else { smem_bytes(key_dim, groups) }
    }

    /// Whether the entry for `(key_dim, groups)` is built: the fused layer pass's where `fused`
    /// says so, else the recurrence's.
    pub const fn has_entry(key_dim: usize, groups: usize, fused: bool) -> bool {
        if fused { has_fused_variant(key_dim, groups) } else { has_variant(key_dim, groups) }
    }

    /// `(shared memory, stages)` of the entry for key size `key_dim` and `groups` groups (one of
    /// [`VARIANTS`]).
    const fn sizes(key_dim: usize, groups: usize) -> (usize, usize) {
        match (key_dim, groups) {
            (64, 1) => (Tiles::<64, 1, 1, false>::SMEM_BYTES, Tiles::<64, 1, 1, false>::STAGES),
            (128, 1) => (Tiles::<128, 2, 1, false>::SMEM_BYTES, Tiles::<128, 2, 1, false>::STAGES),
            (64, _) => (Tiles::<64, 1, 2, false>::SMEM_BYTES, Tiles::<64, 1, 2, false>::STAGES),
            (128, _) => (Tiles::<128, 2, 2, false>::SMEM_BYTES, Tiles::<128, 2, 2, false>::STAGES),
            _ => (Tiles::<256, 4, 1, false>::SMEM_BYTES, Tiles::<256, 4, 1, false>::STAGES),
        }
    }

    /// Shared memory of the entry for key size `key_dim` and `groups` groups.
    pub const fn smem_bytes(key_dim: usize, groups: usize) -> usize {
        sizes(key_dim, groups).0
    }

    /// Stages of the ring of the entry for key size `key_dim` and `groups` groups.
    pub const fn stages(key_dim: usize, groups: usize) -> usize {
        sizes(key_dim, groups).1
    }

    /// Whether the variant `(key_dim, groups)` is built.
    pub const fn has_variant(key_dim: usize, groups: usize) -> bool {
        lists(&VARIANTS, key_dim, groups)
    }

    /// Whether `variants` holds `(key_dim, groups)`.
    const fn lists(variants: &[(usize, usize)], key_dim: usize, groups: usize) -> bool {
        let mut i = 0;
        while i < variants.len() {
            if variants[i].0 == key_dim && variants[i].1 == groups {
                return true;
            }
            i += 1;
        }
        false
    }

    /// Shared memory the driver reserves per CTA beside its dynamic shared memory (sm_80+).
    pub const RESERVED_SMEM_PER_CTA: usize = 1024;

    /// CTAs of the entry for key size `key_dim` and `groups` groups one SM holds at most,
    /// whatever its shared memory: two of one group (their registers allow them:
    /// `portable_sass_runs_both_products_on_the_tensor_cores` checks it), one at `K = 256`, whose
    /// state and fragments take about 200 registers, and one of two groups (twice the threads).
    pub const fn max_ctas_per_sm(key_dim: usize, groups: usize) -> usize {
        if key_dim > 128 || groups > 1 { 1 } else { 2 }
    }

    /// CTAs of the persistent grid for key size `key_dim` and `groups` groups on a GPU of `sms`
    /// SMs with `smem_per_sm` bytes of shared memory each: as many as run at once (at least one
    /// per SM).
    pub const fn workers(key_dim: usize, groups: usize, sms: usize, smem_per_sm: usize) -> usize {
        workers_of(smem_bytes(key_dim, groups), key_dim, groups, sms, smem_per_sm)
    }

    /// [`workers`] for an entry of `smem` bytes of dynamic shared memory (the fused layer pass's:
    /// [`entry_smem_bytes`]).
    pub const fn workers_of(smem: usize, key_dim: usize, groups: usize, sms: usize, smem_per_sm: usize) -> usize {
        let by_smem = smem_per_sm / (smem + RESERVED_SMEM_PER_CTA);
        let most = max_ctas_per_sm(key_dim, groups);
        let per_sm = if by_smem < most { by_smem } else { most };
        sms * if per_sm == 0 { 1 } else { per_sm }
    }

    /// A thread's place in its warp's `mma.m16n8k16` fragments (PTX ISA, "Matrix fragments for
    /// mma.m16n8k16": `g = lane / 4` is `groupID`, `t = lane % 4` `threadID_in_group`), and the
    /// elements each of its fragment registers holds: the kernel loads exactly these.
    #[derive(Clone, Copy, Debug)]
    pub struct Place {
        pub warp: usize,
        pub g: usize,
        pub t: usize,
    }

    impl Place {
        pub const fn of(tid: usize) -> Self {
            let lane = tid % 32;
            Self { warp: tid / 32, g: lane / 4, t: lane % 4 }
        }

        /// The state row and block column of accumulator element `e` of tile (`mt`, `nt`), with
        /// `rows_per_warp` state rows per warp.
        pub const fn state_at(self, rows_per_warp: usize, mt: usize, nt: usize, e: usize) -> (usize, usize) {
            let row = self.warp * rows_per_warp + mt * MMA_M + self.g + 8 * (e / 2);
            (row, nt * MMA_N + 2 * self.t + e % 2)
        }

        /// The element (row, column) whose address this lane gives to an `ldmatrix.x4` that
        /// reads the 16 x 16 block at (`row0`, `col0`) of a row-major tile as four 8 x 8
        /// matrices in the order top left, bottom left, top right, bottom right: read as stored,
        /// the registers are an A fragment of that block; read `.trans` from a tile whose rows
        /// are B's rows (k), they are the B fragments of the two n8 tiles at columns `col0` and
        /// `col0 + 8`, registers 0-1 and 2-3.
        pub const fn ldmatrix_down_then_right(self, row0: usize, col0: usize) -> (usize, usize) {
            let lane = 4 * self.g + self.t;
            (row0 + lane % 8 + (lane / 8) % 2 * 8, col0 + lane / 16 * 8)
        }

        /// As [`Self::ldmatrix_down_then_right`] in the order top left, top right, bottom left,
        /// bottom right: read `.trans` from a tile that stores A transposed (rows are A's
        /// columns), the registers are the A fragment of the 16 x 16 block of A at
        /// (`col0`, `row0`).
        pub const fn ldmatrix_right_then_down(self, row0: usize, col0: usize) -> (usize, usize) {
            let lane = 4 * self.g + self.t;
            (row0 + lane % 8 + lane / 16 * 8, col0 + (lane / 8) % 2 * 8)
        }
    }

    const _: () = assert!(BV.is_multiple_of(MMA_N * N_TILES_PER_LOAD) && VN_ROW_BLOCKS * VN_ROWS_PER_WARP == CHUNK);
    const _: () = assert!(CHUNK.is_multiple_of(MMA_K) && (BV_STRIDE * 2).is_multiple_of(16));
    const _: () = assert!((empty_barrier(MAX_STAGES - 1) as usize) < 16, "16 named barriers per CTA");
    const _: [(); 9] = [
        Tiles::<64, 1, 1, true>::VALID,
        Tiles::<128, 2, 1, true>::VALID,
        Tiles::<64, 1, 2, true>::VALID,
        Tiles::<128, 2, 2, true>::VALID,
        Tiles::<64, 1, 1, false>::VALID,
        Tiles::<128, 2, 1, false>::VALID,
        Tiles::<256, 4, 1, false>::VALID,
        Tiles::<64, 1, 2, false>::VALID,
        Tiles::<128, 2, 2, false>::VALID,
    ];
}

/// Tile shapes and shared-memory map of the warp-specialized Hopper (sm_90a) kernel.
///
/// One CTA per (sequence, head, block of value columns), in one of two column-block widths
/// ([`hopper::Block`]): [`hopper::Wide`] blocks of 64 columns hold the transposed state `S^T`
/// (`[64][K]`) so both products take their left operand from registers; [`hopper::Narrow`]
/// blocks of 32 columns hold `S` (`[K][32]`, one m64 accumulator per 64 keys) and take both
/// operands of both products from shared memory, for twice the chains on shapes short of them:
///
/// ```text
/// wide:   Vn^T = u^T - bf16(S^T) @ w^T     m64 n64  k=K   (B = w tile, K-major)
///         S^T  = S^T * d + bf16(Vn^T) @ k  m64 n=K  k64   (B = k tile, MN-major)
/// narrow: Vn   = u - w @ bf16(S)           m64 n32  k=K   (A = w tile, B = staged S)
///         S    = d * S + k^T @ bf16(Vn)    K/64 x m64 n32 k64 (A = k tile read transposed, B = staged Vn)
/// ```
pub mod hopper {
    use super::{CHUNK, K_DIM, MAX_V_DIM, V_DIM};

    /// Value columns of a wide block (the wgmma M of both wide products: 64 is the only M a
    /// single warpgroup's wgmma has). Gives two CTAs per head, so `fixed_8192`'s 64 heads fill
    /// 128 of the H200's 132 SMs.
    pub const BV: usize = 64;
    /// Value columns of a narrow block: the `N` of both narrow products. Twice the chains of
    /// [`BV`], for shapes with fewer chains than SMs (SPEC.md, "Parallelism"); 32 is the
    /// narrowest a 64-byte-swizzled TMA box of bf16 rows is.
    pub const NARROW_BV: usize = 32;
    /// Threads of the consumer warpgroup (wgmma runs on four warps together).
    pub const CONSUMER_THREADS: usize = 128;
    /// Threads of the producer: one warp issues the TMA loads and copies tail chunks.
    pub const PRODUCER_THREADS: usize = 32;
    /// Threads per CTA: the consumer warpgroup (warps 0-3, warpgroup-aligned) and the producer warp.
    pub const THREADS: usize = CONSUMER_THREADS + PRODUCER_THREADS;
    /// Shared-memory ring depth. A CTA streams about 40 KB of tiles per chunk and the SM's share of
    /// DRAM bandwidth is about 32 GB/s, so covering a microsecond of load latency (Little's law)
    /// needs more than one chunk in flight (two stages gave 0.60 of the floor on fixed_8192).
    /// More is not better: with every SM keeping several stages of reads outstanding the memory
    /// system serves the output stores worse, and loading further ahead measured slower each
    /// time it was tried (bench/RESULTS.md, "Tried and rejected"). Three stages, with the 40 KB the
    /// fourth took spent on a second output staging buffer (`STAGING`), measured fastest:
    /// fixed_8192 211.0 -> 209.1 us, fixed_32k 824.6 -> 817.0 us against four stages and one
    /// buffer (two stages and two buffers: 223 and 874 us). Four stages beside two buffers (the
    /// initial state routed through the ring to make room) were slower again: 208.5 against
    /// 207.7 us, 819.5 against 815.9 us (run 14).
    pub const STAGES: usize = 3;
    /// Ring stages at `K = 256`, where a stage's `k` and `w` tiles take 64 KB: three would not
    /// fit beside the rest (narrow blocks only).
    pub const K256_STAGES: usize = 2;
    /// Ring stages of the fused layer pass ([`Fused`] blocks): a stage there also holds the
    /// chunk's `q Γ` and causal attention (64 KB in all at `K = 128`), so two fit beside the
    /// staging tiles and the `h0` slot, not three.
    pub const FUSED_STAGES: usize = 2;

    /// Columns of one 128-byte-swizzled TMA box: 64 bf16 are one 128-byte row, the widest row
    /// the 128-byte swizzle allows.
    pub const BOX_COLS: usize = 64;
    /// Rows of one swizzle atom: the 128-byte swizzle repeats every 8 rows (1024 bytes), so a
    /// box of 8 rows loaded at a multiple of 8 rows lands exactly where the full box's rows
    /// would. A tail chunk's valid rows go in such boxes, then one-row boxes for the rest: at
    /// most 7 + 7 loads per tensor instead of one per row (one per row made the producer's
    /// serial TMA issue the pace of batches of short sequences).
    pub const ATOM_ROWS: usize = 8;
    /// Boxes a tail chunk's valid rows take at most: `ATOM_ROWS - 1` atoms and
    /// `ATOM_ROWS - 1` single rows (one producer lane each).
    pub const TAIL_BOXES: usize = 2 * (ATOM_ROWS - 1);

    /// Box `j` of a tail chunk of `rows` valid rows (`rows < CHUNK`) as (first row, rows): the
    /// whole atoms of rows first, then the rows past the last whole atom one at a time; `None`
    /// past the chunk's boxes. Together the boxes cover rows `0..rows` once each.
    pub const fn tail_box(j: usize, rows: usize) -> Option<(usize, usize)> {
        let atoms = rows / ATOM_ROWS;
        if j < atoms {
            Some((j * ATOM_ROWS, ATOM_ROWS))
        } else if j < atoms + rows % ATOM_ROWS {
            Some((atoms * ATOM_ROWS + (j - atoms), 1))
        } else {
            None
        }
    }
    /// Bytes of one `[CHUNK][BOX_COLS]` bf16 box.
    pub const BOX_BYTES: usize = CHUNK * BOX_COLS * 2;
    /// Key sizes `K` the Hopper kernel runs, one entry point each per block width
    /// (`abi::hopper_for`; `K = 256` in narrow blocks only, its wide state would not fit in
    /// registers): `K` sets the k-steps of product 1, the `N` (wide) or the m64 tiles (narrow) of
    /// product 2 and the state's registers.
    pub const KEY_DIMS: [usize; 3] = [64, K_DIM, 256];
    /// Staging buffers of `bf16(S)` and `bf16(Vn)` for the output stores, used round robin by
    /// chunk. With one, a chunk waits until the previous chunk's TMA stores have read theirs
    /// before it stages its own; with two the wait is for the stores of two chunks back, which
    /// have had a whole chunk's time (measured: three stages with two buffers beat three with
    /// one, 209.1 vs 210.3 us on fixed_8192, 817.0 vs 820.5 on fixed_32k).
    pub const STAGING: usize = 2;
    /// Staging buffers at `K = 256` (shared memory holds one beside two ring stages).
    pub const K256_STAGING: usize = 1;

    /// One 128-byte-swizzled bf16 box `[CHUNK][BOX_COLS]` as TMA writes it: 1024-byte aligned,
    /// as the swizzle pattern requires of a tile base.
    #[repr(C, align(1024))]
    pub struct TileBox(pub [u8; BOX_BYTES]);

    /// 4 KB of bf16, 1024-byte aligned: a narrow block's tiles. `[CHUNK][NARROW_BV]` with the
    /// 64-byte swizzle: its `bf16(Vn)` staging for the `v_new` store, and one 64-key box of its
    /// key-first `bf16(S)` staging; `[NARROW_BV][64]` with the 128-byte swizzle: one box of its
    /// value-first `bf16(S)` staging, and its wgmma operands `bf16(S)^T` and `bf16(Vn)^T`.
    #[repr(C, align(1024))]
    pub struct NarrowTile(pub [u8; CHUNK * NARROW_BV * 2]);

    /// One `[BV][BOX_COLS]` (or `[BOX_COLS][BV]`) bf16 box of a wide state staging tile,
    /// 128-byte swizzled.
    #[repr(C, align(1024))]
    pub struct StateBox(pub [u8; BV * BOX_COLS * 2]);

    /// A `bf16(Vn)` staging tile of a wide block (`[CHUNK][BV]`, 128-byte swizzled).
    #[repr(C, align(1024))]
    pub struct ValueTile(pub [u8; CHUNK * BV * 2]);

    /// `BOX_COLS` key rows of a wide item's initial state block (f32, unswizzled).
    #[repr(C, align(1024))]
    pub struct InitialStateBox(pub [u8; BOX_COLS * BV * 4]);

    /// `BOX_COLS` key rows of a narrow item's initial state block (f32, unswizzled).
    #[repr(C, align(1024))]
    pub struct NarrowInitialBox(pub [u8; BOX_COLS * NARROW_BV * 4]);

    /// A tile a block width does not have (the wide block's operand tiles: its products take
    /// their left operands from registers).
    #[repr(C)]
    pub struct NoTile;

    /// A column-block width and the shared tiles it sizes.
    pub trait Block {
        /// Value columns per block.
        const BV: usize;
        /// Whether the block runs the fused layer pass: its stages hold `q Γ` and the causal
        /// attention, and the consumer writes `o` instead of `h` and `v_new`.
        const OUTPUT: bool = false;
        /// Bytes of one row of the `v_new` staging tile (`BV` bf16): its TMA swizzle span.
        const ROW_BYTES: usize = Self::BV * 2;
        /// Bytes of a full chunk's `u` box (`[CHUNK][BV]`, in the stage's `u` tile).
        const U_BOX_BYTES: usize = CHUNK * Self::BV * 2;
        /// One 64-key box of the `bf16(S)` staging tile.
        type StateBox;
        /// A `bf16(Vn)` staging tile, `[CHUNK][BV]`.
        type ValueTile;
        /// A wgmma operand tile of the narrow products: one 64-key box of `bf16(S)^T`
        /// (`[BV][64]`), or `bf16(Vn)^T` (`[BV][CHUNK]`), K-major with the 128-byte swizzle.
        type OperandBox;
        /// 64 key rows of the initial-state slot.
        type InitialBox;
    }

    /// 64-column blocks, the state transposed in registers.
    pub struct Wide;
    /// 64-column blocks of the fused layer pass: a wide block whose chunk also gives the layer's
    /// output `o = scale ((q Γ) bf16(S) + P bf16(Vn))` (docs/DESIGN.md, "The layer on the GPU").
    pub struct Fused;
    /// 32-column blocks, the state key-major in registers.
    pub struct Narrow;
    /// 32-column blocks of the fused layer pass: a narrow block whose chunk also gives the
    /// layer's output, twice the chains of [`Fused`] for batches short of them.
    pub struct NarrowFused;

    impl Block for Wide {
        const BV: usize = BV;
        type StateBox = StateBox;
        type ValueTile = ValueTile;
        type OperandBox = NoTile;
        type InitialBox = InitialStateBox;
    }

    impl Block for Fused {
        const BV: usize = BV;
        const OUTPUT: bool = true;
        type StateBox = StateBox;
        type ValueTile = ValueTile;
        type OperandBox = NoTile;
        type InitialBox = InitialStateBox;
    }

    impl Block for Narrow {
        const BV: usize = NARROW_BV;
        type StateBox = NarrowTile;
        type ValueTile = NarrowTile;
        type OperandBox = NarrowTile;
        type InitialBox = NarrowInitialBox;
    }

    impl Block for NarrowFused {
        const BV: usize = NARROW_BV;
        const OUTPUT: bool = true;
        type StateBox = NarrowTile;
        type ValueTile = NarrowTile;
        type OperandBox = NarrowTile;
        type InitialBox = NarrowInitialBox;
    }

    /// One ring stage: a chunk's `k` and `w` tiles (`[CHUNK][K]`, `KB = K / BOX_COLS` boxes
    /// each) and the `u` tile: this CTA's value columns (`[CHUNK][BV]`, 128-byte swizzled for a
    /// wide block, 64-byte for a narrow one), except in a tail chunk, whose one-row boxes are
    /// always `BOX_COLS` wide (a narrow block's 32 columns and their neighbours', 128-byte
    /// swizzled: a 64-byte row's box would need a destination 128-byte aligned, which every
    /// other row is not).
    /// In the fused layer pass (`O = 1`) a stage also holds the chunk's `q Γ` (`[CHUNK][K]`, as
    /// `k`) and causal attention `P` (`[CHUNK][CHUNK]`, one box), both K-major operands of the
    /// output's products; `O = 0` gives them no bytes.
    #[repr(C, align(1024))]
    pub struct Stage<const KB: usize, const O: usize> {
        /// `k`, column boxes side by side.
        pub k: [TileBox; KB],
        /// `w`, column boxes side by side.
        pub w: [TileBox; KB],
        /// `u`, the box of this CTA's value columns.
        pub u: TileBox,
        /// Fused: `q Γ`, column boxes side by side.
        pub q: [[TileBox; KB]; O],
        /// Fused: the causal attention.
        pub p: [TileBox; O],
    }

    /// The CTA's dynamic shared memory for key size `K` (`KB = K / BOX_COLS` boxes), block
    /// width `B`, `R` ring stages, `G` staging buffers and `O` output tile sets per stage (1 in
    /// the fused layer pass, else 0). Never constructed: the kernel takes the field offsets
    /// (`core::mem::offset_of!`) as shared-memory addresses, and the launcher allocates
    /// [`smem_bytes`].
    #[repr(C)]
    pub struct SharedStorage<const K: usize, const KB: usize, B: Block, const R: usize, const G: usize, const O: usize> {
        /// The ring of chunk tiles the producer loads and the consumer reads.
        pub stages: [Stage<KB, O>; R],
        /// Per stage, the state's decay per key row (f32 `[K]`: `exp2` of the chunk's last `gk`
        /// row plus its last `g`; ones without gates), written by the producer.
        pub decay: [[f32; K]; R],
        /// Per stage, the scalar gate's scale of each token's `Vn` row (f32 `[CHUNK]`:
        /// `exp2(g_last - g[r])`; rows past the chunk's valid ones are never read), written by
        /// the producer.
        pub row_scale: [[f32; CHUNK]; R],
        /// `bf16(S)` staging for the `h` stores (`KB` boxes: `[K][BV]` key-first, `[BV][K]` as
        /// boxes of 64 keys value-first).
        pub h_staging: [[B::StateBox; KB]; G],
        /// `bf16(Vn)` staging for the `v_new` stores (`bf16(o)` for the `o` stores in the fused
        /// pass).
        pub vn_staging: [B::ValueTile; G],
        /// Narrow blocks: `bf16(S)^T`, product 1's `B` (read within the chunk, so one buffer).
        pub s_operand: [B::OperandBox; KB],
        /// Narrow blocks: `bf16(Vn)^T` (scaled by the scalar gate when there is one), product
        /// 2's `B`.
        pub vn_operand: B::OperandBox,
        /// The slot the producer loads the next item's initial state into: the consumer starts
        /// an item from shared memory instead of waiting on a global load.
        pub h0: [B::InitialBox; KB],
        /// The ring's `full` mbarriers (the stage's tiles have landed).
        pub full: [u64; R],
        /// The ring's `empty` mbarriers (the consumer is done with the stage).
        pub empty: [u64; R],
        /// The `h0` slot's `full` mbarrier.
        pub h0_full: u64,
        /// The `h0` slot's `empty` mbarrier.
        pub h0_empty: u64,
    }

    /// Dynamic shared memory of one CTA of key size `K`, block width `B`, `R` ring stages, `G`
    /// staging buffers and `O` output tile sets: up to the end of the last barrier (the
    /// struct's size would round up to its 1024-byte alignment, which no field needs).
    pub const fn storage_bytes<
        const K: usize,
        const KB: usize,
        B: Block,
        const R: usize,
        const G: usize,
        const O: usize,
    >() -> usize {
        core::mem::offset_of!(SharedStorage<K, KB, B, R, G, O>, h0_empty) + 8
    }

    /// Dynamic shared memory of one CTA for key size `key_dim` (one of [`KEY_DIMS`]; 0 for any
    /// other) and block width `bv` ([`BV`] or [`NARROW_BV`]; 0 for any other, and for `K = 256`
    /// in wide blocks).
    pub const fn smem_bytes(key_dim: usize, bv: usize) -> usize {
        match (key_dim, bv) {
            (64, BV) => storage_bytes::<64, 1, Wide, STAGES, STAGING, 0>(),
            (K_DIM, BV) => storage_bytes::<K_DIM, { K_DIM / BOX_COLS }, Wide, STAGES, STAGING, 0>(),
            (64, NARROW_BV) => storage_bytes::<64, 1, Narrow, STAGES, STAGING, 0>(),
            (K_DIM, NARROW_BV) => storage_bytes::<K_DIM, { K_DIM / BOX_COLS }, Narrow, STAGES, STAGING, 0>(),
            (256, NARROW_BV) => storage_bytes::<256, 4, Narrow, K256_STAGES, K256_STAGING, 0>(),
            _ => 0,
        }
    }

    /// Dynamic shared memory of one CTA of the fused layer pass at key size `key_dim` (64 or
    /// [`K_DIM`]) in blocks of `bv` columns ([`BV`] or [`NARROW_BV`]); 0 for any other.
    pub const fn fused_smem_bytes(key_dim: usize, bv: usize) -> usize {
        match (key_dim, bv) {
            (64, BV) => storage_bytes::<64, 1, Fused, FUSED_STAGES, STAGING, 1>(),
            (K_DIM, BV) => storage_bytes::<K_DIM, { K_DIM / BOX_COLS }, Fused, FUSED_STAGES, STAGING, 1>(),
            (64, NARROW_BV) => storage_bytes::<64, 1, NarrowFused, FUSED_STAGES, STAGING, 1>(),
            (K_DIM, NARROW_BV) => storage_bytes::<K_DIM, { K_DIM / BOX_COLS }, NarrowFused, FUSED_STAGES, STAGING, 1>(),
            _ => 0,
        }
    }

    /// Dynamic shared memory of one CTA of the wide `K = 128` kernel.
    pub const SMEM_BYTES: usize = smem_bytes(K_DIM, BV);
    /// CTAs of the Hopper kernel per SM (its shared memory allows one at `K = 128`; at `K = 64`
    /// and in narrow blocks the grid keeps one per SM too, so all share one schedule): the
    /// persistent grid has this many workers per SM.
    pub const CTAS_PER_SM: usize = 1;

    /// Compile-time checks of one key size's layout.
    const fn check<const K: usize, const KB: usize, B: Block, const R: usize, const G: usize, const O: usize>() {
        let bytes = storage_bytes::<K, KB, B, R, G, O>();
        assert!(K == KB * BOX_COLS, "a k or w tile is KB boxes");
        assert!(
            core::mem::size_of::<Stage<KB, O>>() == (2 * KB + 1 + O * (KB + 1)) * BOX_BYTES,
            "a stage is exactly its boxes"
        );
        assert!(core::mem::size_of::<[B::StateBox; KB]>() == K * B::BV * 2);
        assert!(core::mem::size_of::<B::ValueTile>() == CHUNK * B::BV * 2);
        assert!(core::mem::size_of::<[B::InitialBox; KB]>() == K * B::BV * 4);
        assert!(bytes <= 227 * 1024, "one CTA may use at most 227 KB");
        assert!(core::mem::size_of::<SharedStorage<K, KB, B, R, G, O>>() - bytes < 1024);
    }
    const _: () = check::<64, 1, Wide, STAGES, STAGING, 0>();
    const _: () = check::<K_DIM, { K_DIM / BOX_COLS }, Wide, STAGES, STAGING, 0>();
    const _: () = check::<64, 1, Narrow, STAGES, STAGING, 0>();
    const _: () = check::<K_DIM, { K_DIM / BOX_COLS }, Narrow, STAGES, STAGING, 0>();
    const _: () = check::<256, 4, Narrow, K256_STAGES, K256_STAGING, 0>();
    const _: () = check::<64, 1, Fused, FUSED_STAGES, STAGING, 1>();
    const _: () = check::<K_DIM, { K_DIM / BOX_COLS }, Fused, FUSED_STAGES, STAGING, 1>();
    const _: () = check::<64, 1, NarrowFused, FUSED_STAGES, STAGING, 1>();
    const _: () = check::<K_DIM, { K_DIM / BOX_COLS }, NarrowFused, FUSED_STAGES, STAGING, 1>();
    const _: () = assert!(2 * SMEM_BYTES > 228 * 1024, "CTAS_PER_SM says shared memory allows one CTA");

    const _: () = assert!(V_DIM.is_multiple_of(BV) && MAX_V_DIM.is_multiple_of(BV) && K_DIM.is_multiple_of(BOX_COLS));
    const _: () = assert!(BV == BOX_COLS, "the u, v_new and h tiles of a wide CTA are one box wide");
    const _: () = assert!(BV.is_multiple_of(NARROW_BV), "a narrow plan's blocks tile every V a wide one does");
}

#[cfg(test)]
mod tests {
    use super::CHUNK;
    use super::hopper::{ATOM_ROWS, TAIL_BOXES, tail_box};

    /// Every tail length's boxes cover its valid rows once each, in at most `TAIL_BOXES` boxes,
    /// each atom at a multiple of `ATOM_ROWS` rows (where the 128-byte swizzle puts it).
    #[test]
    fn tail_boxes_cover_the_valid_rows_once() {
        for rows in 1..CHUNK {
            let mut hits = [0u8; CHUNK];
            let count = (0..CHUNK).map_while(|j| tail_box(j, rows)).count();
            assert!(count <= TAIL_BOXES, "{rows} rows: {count} boxes");
            assert_eq!(tail_box(count, rows), None);
            for (r, n) in (0..count).filter_map(|j| tail_box(j, rows)) {
                assert!(n == 1 || (n == ATOM_ROWS && r % ATOM_ROWS == 0), "{rows} rows: box ({r}, {n})");
                hits[r..r + n].iter_mut().for_each(|h| *h += 1);
            }
            assert!(hits[..rows].iter().all(|&h| h == 1) && hits[rows..].iter().all(|&h| h == 0), "{rows} rows");
        }
        // A chunk of 63 rows, the most boxes: 7 atoms and 7 single rows.
        assert_eq!((0..CHUNK).map_while(|j| tail_box(j, CHUNK - 1)).count(), TAIL_BOXES);
    }
}
