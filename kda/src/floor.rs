//! The memory floor: the fewest bytes the recurrence must move, and the time they take at a
//! measured copy bandwidth (SPEC.md, "Work and the floor").

use crate::Dims;
use kda_kernel::layout::{K_DIM, V_DIM};

const BF16_BYTES: u64 = 2;
const F32_BYTES: u64 = 4;

/// Bytes read and written at the least: `k`, `w`, `u` and `v_new` once, `h` once, each chunk's last
/// gate row once, and `h0`, `ht` once.
pub fn floor_bytes(d: &Dims) -> u64 {
    let (t, h, n, nt) = (d.tokens as u64, d.heads as u64, d.seqs as u64, d.chunks as u64);
    let (k, v) = (K_DIM as u64, V_DIM as u64);
    2 * t * h * k * BF16_BYTES
        + 2 * t * h * v * BF16_BYTES
        + nt * h * k * v * BF16_BYTES
        + nt * h * k * F32_BYTES
        + 2 * n * h * k * v * F32_BYTES
}

/// Floor time in microseconds at `copy_bw_bytes_per_s` (read plus write bytes per second).
pub fn floor_us(d: &Dims, copy_bw_bytes_per_s: f64) -> f64 {
    floor_bytes(d) as f64 / copy_bw_bytes_per_s * 1e6
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Plan;

    #[test]
    fn fixed_8192_floor_matches_the_spec_formula() {
        let d = Dims::new(&Plan::from_lengths(&[8192]), 64);
        let expected =
            2 * 8192 * 64 * 128 * 2 * 2 + 128 * 64 * 128 * 128 * 2 + 128 * 64 * 128 * 4 + 2 * 64 * 128 * 128 * 4;
        assert_eq!(floor_bytes(&d), expected as u64);
        // At the SPEC's 4.27 TB/s the best peer's 228 us is 0.84 of the floor.
        let ratio = floor_us(&d, 4.27e12) / 228.0;
        assert!((ratio - 0.84).abs() < 0.01, "{ratio}");
    }
}
