//! The memory floor: the fewest bytes the recurrence must move, and the time they take at a
//! measured copy bandwidth (docs/CONTRACT.md#the-memory-floor).

use kda::model::ModelShape;
use kda::{Dims, Plan};

const BF16_BYTES: u64 = 2;
const F32_BYTES: u64 = 4;

/// Bytes read and written at the least: `k`, `w`, `u` and `v_new` once, `h` once, each chunk's last
/// gate row once, and `h0`, `ht` once (saturating at `u64::MAX`). The gate is KDA's per-key gate
/// `gk` (sizes `d` do not say which gates a problem has: [`model_floor_bytes`] takes them).
pub fn floor_bytes(d: &Dims) -> u64 {
    let shape = ModelShape {
        value_heads: d.value_heads,
        key_dim: d.key_dim,
        value_dim: d.value_dim,
        layout: d.layout,
        ..ModelShape::kda(d.heads)
    };
    model_floor_bytes(d.tokens, d.seqs, d.chunks, &shape)
}

/// [`floor_bytes`] of the generalized recurrence (docs/CONTRACT.md#the-generalized-recurrence), for
/// `tokens`, `seqs` and `chunks` of a batch of `shape`, with `h0` and `ht`: `k` (H heads), `w`, `u`,
/// `v_new`, `h`, `h0` and `ht` (HV heads) once, the scalar gate's every row and the per-key gate's
/// last row per chunk (saturating at `u64::MAX`).
pub fn model_floor_bytes(tokens: usize, seqs: usize, chunks: usize, shape: &ModelShape) -> u64 {
    let (t, n, nt) = (tokens as u64, seqs as u64, chunks as u64);
    let (h, hv) = (shape.heads as u64, shape.value_heads as u64);
    let (k, v) = (shape.key_dim as u64, shape.value_dim as u64);
    let product = |factors: &[u64]| factors.iter().fold(1u64, |p, &f| p.saturating_mul(f));
    [
        product(&[t, h, k, BF16_BYTES]),
        product(&[t, hv, k, BF16_BYTES]),
        product(&[2, t, hv, v, BF16_BYTES]),
        product(&[nt, hv, k, v, BF16_BYTES]),
        product(&[2, n, hv, k, v, F32_BYTES]),
        if shape.gates.g { product(&[t, hv, F32_BYTES]) } else { 0 },
        if shape.gates.gk { product(&[nt, hv, k, F32_BYTES]) } else { 0 },
    ]
    .into_iter()
    .fold(0, u64::saturating_add)
}

/// Floor time in microseconds at `copy_bw_bytes_per_s` (read plus write bytes per second).
pub fn floor_us(d: &Dims, copy_bw_bytes_per_s: f64) -> f64 {
    floor_bytes(d) as f64 / copy_bw_bytes_per_s * 1e6
}

/// [`model_floor_bytes`] of batch `plan` with `shape`, as microseconds at `copy_bw_bytes_per_s`.
pub fn model_floor_us(plan: &Plan, shape: &ModelShape, copy_bw_bytes_per_s: f64) -> f64 {
    model_floor_bytes(plan.tokens(), plan.num_seqs(), plan.chunks(), shape) as f64 / copy_bw_bytes_per_s * 1e6
}

#[cfg(test)]
mod tests {
    use super::*;
    use kda::Plan;

    #[test]
    fn fixed_8192_floor_matches_the_contract_formula() {
        let d = Dims::new(&Plan::from_lengths(&[8192]), 64);
        let expected =
            2 * 8192 * 64 * 128 * 2 * 2 + 128 * 64 * 128 * 128 * 2 + 128 * 64 * 128 * 4 + 2 * 64 * 128 * 128 * 4;
        assert_eq!(floor_bytes(&d), expected as u64);
        // At 4.27 TB/s the best Triton peer's 228 us is 0.84 of the floor.
        let ratio = floor_us(&d, 4.27e12) / 228.0;
        assert!((ratio - 0.84).abs() < 0.01, "{ratio}");
    }

    #[test]
    fn the_model_floor_counts_each_tensor_of_its_shape() {
        use kda::model::Gates;
        // qwen3_next_8192: 16 key heads, 32 value heads, scalar gate.
        let s = ModelShape { heads: 16, value_heads: 32, gates: Gates { g: true, gk: false }, ..ModelShape::kda(16) };
        let (t, nt) = (8192u64, 128u64);
        let expected = t * 16 * 128 * 2
            + t * 32 * 128 * 2
            + 2 * t * 32 * 128 * 2
            + nt * 32 * 128 * 128 * 2
            + 2 * 32 * 128 * 128 * 4
            + t * 32 * 4;
        assert_eq!(model_floor_bytes(8192, 1, 128, &s), expected);
    }

    #[test]
    fn the_floor_in_time_and_of_sizes_agree_with_the_bytes() {
        use kda::model::Gates;
        let plan = Plan::from_lengths(&[100, 28]);
        let s = ModelShape { key_dim: 64, value_dim: 256, ..ModelShape::kda(4) };
        let bytes = model_floor_bytes(128, 2, 3, &s);
        assert_eq!(model_floor_us(&plan, &s, bytes as f64 * 1e6), 1.0);
        // Sizes carry the head sizes (the gate is `gk`).
        assert_eq!(floor_bytes(&Dims::model(&plan, &s)), bytes);
        let g = ModelShape { gates: Gates { g: true, gk: false }, ..s };
        assert_ne!(model_floor_us(&plan, &g, 1.0), model_floor_us(&plan, &s, 1.0));
    }

    #[test]
    fn huge_sizes_saturate() {
        let kda = Dims::new(&Plan::from_lengths(&[]), 1);
        let d = Dims { tokens: usize::MAX, heads: usize::MAX, value_heads: usize::MAX, seqs: 1, chunks: 1, ..kda };
        assert_eq!(floor_bytes(&d), u64::MAX);
    }
}
