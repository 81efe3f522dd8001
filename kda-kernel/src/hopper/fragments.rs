//! Where each consumer thread's values live: the wgmma accumulator fragment layout, the
//! 128-byte swizzle of the shared tiles, and the lane addresses of `ldmatrix` / `stmatrix` over
//! them. Pure index arithmetic, written once.

use crate::arch::sm80::{bf16_to_f32, pack_bf16x2};

/// Bytes of one 128-byte swizzle row (64 bf16).
pub const ROW_BYTES: u32 = 128;
/// Bytes of one 16-byte chunk of a row (the unit the swizzle permutes).
pub const CHUNK16: u32 = 16;
/// 16-byte chunks per 128-byte row.
pub const CHUNKS_PER_ROW: usize = 8;
/// Rows of one swizzle atom: the 128-byte swizzle permutes 16-byte chunks within 8-row groups.
const SWIZZLE_ROWS: usize = crate::layout::hopper::ATOM_ROWS;
/// Bytes between 8-row groups of a 128-byte-swizzled tile (the descriptors' stride offset).
pub const ATOM_BYTES: u32 = (SWIZZLE_ROWS as u32) * ROW_BYTES;
/// The K-major descriptor's leading offset is unused with swizzling; 16 bytes (one unit) is the
/// conventional value.
pub const UNUSED_LEADING: u32 = 16;
/// Accumulator elements per 8-column group of a wgmma fragment (`d[4j .. 4j + 4]`).
pub const ACC_PER_GROUP: usize = 4;
/// Threads per wgmma row quad: a row's 8 columns of a group are spread over 4 lanes, 2 each.
const QUAD: usize = 4;

/// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of 128-byte rows under the
/// 128-byte swizzle (the chunk index XOR the row's position in its 8-row group): the layout TMA
/// writes for the swizzled boxes, and the one the staging tiles use so that the 8 rows one
/// `stmatrix`/`ldmatrix` matrix touches fall in 8 different bank groups.
#[inline(always)]
pub fn swizzled(row: usize, chunk: usize) -> u32 {
    (row as u32) * ROW_BYTES + ((chunk ^ (row % SWIZZLE_ROWS)) as u32) * CHUNK16
}

/// Bytes of one 64-byte swizzle row (32 bf16: a narrow block's `u`, `Vn` and key-first `S` rows).
pub const ROW64_BYTES: u32 = 64;
/// 16-byte chunks per 64-byte row.
pub const CHUNKS_PER_ROW64: usize = 4;

/// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of 64-byte rows under the 64-byte
/// swizzle (address bits 4-5 XOR bits 7-8: the chunk index XOR the row's pair index within its
/// 8-row group), the layout TMA writes for 64-byte-swizzled boxes.
#[inline(always)]
pub fn swizzled64(row: usize, chunk: usize) -> u32 {
    (row as u32) * ROW64_BYTES + ((chunk ^ ((row / 2) % CHUNKS_PER_ROW64)) as u32) * CHUNK16
}

/// [`swizzled`] or [`swizzled64`] for a tile of `row_bytes`-byte rows (128 or 64: the TMA
/// swizzle span of a wide or a narrow block's `u` and `v_new` tiles).
#[inline(always)]
pub fn swizzled_rows(row_bytes: usize, row: usize, chunk: usize) -> u32 {
    if row_bytes == ROW_BYTES as usize { swizzled(row, chunk) } else { swizzled64(row, chunk) }
}

/// Row and 16-byte chunk this lane addresses in an `x4` `ldmatrix`/`stmatrix` over the
/// 16-column step `step` of a wgmma fragment, for a tile stored transposed (`[column][row]`):
/// matrix `m = lane / 8` is fragment row half `m % 2` and column group `m / 2`; its stored row
/// `lane % 8` is fragment column `16 * step + 8 * (m / 2) + lane % 8`, and its 8 fragment rows
/// (16 bytes) start at row `16 * warp + 8 * (m % 2)`, i.e. chunk `2 * warp + m % 2`.
#[inline(always)]
pub fn matrix_row(tid: usize, step: usize) -> (usize, usize) {
    let (warp, lane) = (tid / 32, tid % 32);
    let m = lane / 8;
    (16 * step + 8 * (m / 2) + lane % 8, 2 * warp + m % 2)
}

/// Row and 16-byte chunk (counted over the fragment's whole width) this lane addresses in an
/// `x4` `stmatrix` (untransposed) of the 16-column step `step` of a wgmma A fragment: matrix
/// `m = lane / 8` holds fragment rows `16 * warp + 8 * (m % 2) ..+ 8` and columns
/// `16 * step + 8 * (m / 2) ..+ 8` (register `m` of [`a_fragments`]), and lane `lane % 8` gives
/// its row.
#[inline(always)]
pub fn fragment_row(tid: usize, step: usize) -> (usize, usize) {
    let (warp, lane) = (tid / 32, tid % 32);
    let m = lane / 8;
    (16 * warp + 8 * (m % 2) + lane % 8, 2 * step + m / 2)
}

/// Row (value column inside the block) and key/token column of accumulator element `e` of a
/// wgmma `m64nN` f32 fragment for thread `tid` of the warpgroup: element `4j + q` is row
/// `16 * warp + lane / 4 + 8 * (q / 2)`, column `8j + 2 * (lane % 4) + q % 2`.
#[inline(always)]
pub fn acc_coords(tid: usize, e: usize) -> (usize, usize) {
    let (warp, lane) = (tid / 32, tid % 32);
    let (j, q) = (e / ACC_PER_GROUP, e % ACC_PER_GROUP);
    (16 * warp + lane / QUAD + 8 * (q / 2), 8 * j + 2 * (lane % QUAD) + q % 2)
}

/// A wgmma accumulator fragment rounded to bf16 as the A operand of the next product: the
/// accumulator layout of an `m64nN` product is the register-A layout of a k-step, 8 f32 (4 packed
/// pairs) per 16 columns.
#[inline(always)]
pub fn a_fragments<const STEPS: usize>(acc: &[f32]) -> [[u32; 4]; STEPS] {
    core::array::from_fn(|ks| core::array::from_fn(|p| pack_bf16x2(acc[8 * ks + 2 * p], acc[8 * ks + 2 * p + 1])))
}

/// Writes the four matrices `m` of an `x4` `ldmatrix` over the 16-column step `step` of an
/// accumulator fragment into `acc` as f32: matrix `half + 2 * group` holds the bf16 pair of
/// elements `8 * step + 4 * group + 2 * half` and `+ 1` ([`matrix_row`], [`fragment_row`]).
#[inline(always)]
pub fn unpack_matrices(m: [u32; 4], step: usize, acc: &mut [f32]) {
    for (i, &pair) in m.iter().enumerate() {
        let e = 8 * step + 4 * (i / 2) + 2 * (i % 2);
        acc[e] = bf16_to_f32(pair as u16);
        acc[e + 1] = bf16_to_f32((pair >> 16) as u16);
    }
}
