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
/// Value dimension `V` of the contract.
pub const V_DIM: usize = 128;

/// Words (`i64`) per sequence descriptor in the plan the host uploads:
/// `[first token, length in tokens, first chunk in h]`.
pub const SEQ_DESC_WORDS: usize = 3;
/// Index of the first-token word in a sequence descriptor.
pub const DESC_TOKEN_START: usize = 0;
/// Index of the length word in a sequence descriptor.
pub const DESC_LEN: usize = 1;
/// Index of the first-chunk word in a sequence descriptor.
pub const DESC_CHUNK_START: usize = 2;

/// Number of chunks of a sequence of `len` tokens (`ceil(len / CHUNK)`).
#[inline(always)]
pub const fn chunks_of(len: usize) -> usize {
    len.div_ceil(CHUNK)
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
    pub const SMEM_BYTES: usize =
        2 * CHUNK * K_DIM * 2 + K_DIM * BV * 2 + CHUNK * BV * 2 + K_DIM * 4;

    const _: () = assert!(V_DIM % BV == 0);
    const _: () = assert!(THREADS % BV == 0 && (K_DIM * BV) % THREADS == 0);
    const _: () = assert!((CHUNK * BV) % THREADS == 0);
    const _: () = assert!(SMEM_BYTES <= 48 * 1024, "baseline must fit the default smem limit");
}
