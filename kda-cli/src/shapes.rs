//! The batch layouts `cargo xtask bench` runs (docs/CONTRACT.md#reference-shapes).

use kda::inputs::{random_words, reference_shapes, unit_uniform};
use kda::layout::CHUNK;
use kda::model::{Gates, ModelShape, StateLayout};

/// Seed of the benchmark's random ragged layouts (fixed, so every run measures the same batch).
const BENCH_LAYOUT_SEED: u64 = 0x4B44_4131;

/// The shapes `cargo xtask bench` runs, all with [`kda::inputs::REFERENCE_HEADS`] heads: the
/// reference shapes ([`kda::inputs::reference_shapes`]), then two ragged layouts of the
/// scheduling work:
/// * `random_ragged_32k`: 40 sequences with lengths drawn log-uniformly from 1 to 4096, then
///   scaled to 32768 tokens in all (rounded down, the remainder given to the longest);
/// * `decode_like`: 256 sequences of 1 to 64 tokens (uniform), the state load and store bound
///   case of many tiny prefills.
pub fn bench_shapes() -> Vec<(&'static str, Vec<usize>)> {
    const RAGGED_SEQS: usize = 40;
    const RAGGED_MAX: f64 = 4096.0;
    const RAGGED_TOKENS: usize = 32768;
    const DECODE_SEQS: usize = 256;
    let drawn: Vec<f64> =
        random_words(BENCH_LAYOUT_SEED, 0).take(RAGGED_SEQS).map(|x| RAGGED_MAX.powf(unit_uniform(x))).collect();
    let scale = RAGGED_TOKENS as f64 / drawn.iter().sum::<f64>();
    let mut ragged: Vec<usize> = drawn.iter().map(|&d| ((d * scale) as usize).max(1)).collect();
    if let Some(longest) = (0..RAGGED_SEQS).max_by_key(|&i| ragged[i]) {
        ragged[longest] += RAGGED_TOKENS - ragged.iter().sum::<usize>();
    }
    let decode =
        random_words(BENCH_LAYOUT_SEED, 1).take(DECODE_SEQS).map(|x| 1 + (x % CHUNK as u64) as usize).collect();
    let mut shapes = reference_shapes();
    shapes.push(("random_ragged_32k", ragged));
    shapes.push(("decode_like", decode));
    shapes
}

/// The shapes of the generalized recurrence `cargo xtask bench` runs after [`bench_shapes`]
/// (docs/CONTRACT.md#the-generalized-recurrence; one the launcher refuses is reported as
/// unsupported): name, sequence lengths, and heads, sizes, gates and layout.
/// * `qwen3_next_8192`, `qwen3_next_mixed6`: Qwen3-Next's Gated DeltaNet (16 key heads, 32 value
///   heads, K = V = 128, scalar gate) on one sequence of 8192 and on mixed_6's lengths;
/// * `tp_qwen3_next_h2`: its tensor-parallel shard of 2 key / 4 value heads on 65536 tokens;
/// * `gdn_k256_v512`: a Gated DeltaNet research model, 6 heads of K = 256, V = 512;
/// * `kda_k64_8192`: KDA with 64 heads of K = V = 64;
/// * `fixed_8192_vfirst`: fixed_8192 with the value-first state layout;
/// * `tp_long_h4`, `tp_mixed_h8`: KDA's tensor-parallel shards, 4 heads on one 131072-token
///   prompt and 8 heads on [65536, 8192, 300] (few chains: the split planner's shapes).
pub fn model_bench_shapes() -> Vec<(&'static str, Vec<usize>, ModelShape)> {
    let kda = ModelShape::kda;
    let scalar = Gates { g: true, gk: false };
    let qwen = |heads: usize| ModelShape { heads, value_heads: 2 * heads, gates: scalar, ..kda(heads) };
    let mixed = reference_shapes().into_iter().find(|s| s.0 == "mixed_6").map(|s| s.1).unwrap_or_default();
    vec![
        ("qwen3_next_8192", vec![8192], qwen(16)),
        ("qwen3_next_mixed6", mixed, qwen(16)),
        ("tp_qwen3_next_h2", vec![65536], qwen(2)),
        ("gdn_k256_v512", vec![8192], ModelShape { key_dim: 256, value_dim: 512, gates: scalar, ..kda(6) }),
        ("kda_k64_8192", vec![8192], ModelShape { key_dim: 64, value_dim: 64, ..kda(64) }),
        ("fixed_8192_vfirst", vec![8192], ModelShape { layout: StateLayout::ValueFirst, ..kda(64) }),
        ("tp_long_h4", vec![131072], kda(4)),
        ("tp_mixed_h8", vec![65536, 8192, 300], kda(8)),
    ]
}

/// How tables and summaries name `gates`: `g`, `gk`, `g and gk` or `none`.
pub fn gates_name(gates: Gates) -> &'static str {
    match (gates.g, gates.gk) {
        (true, true) => "g and gk",
        (true, false) => "g",
        (false, true) => "gk",
        (false, false) => "none",
    }
}

/// How tables and files name a state layout: `[K, V]` or `[V, K]` (the `state_layout` metadata of
/// a model file).
pub fn layout_name(layout: StateLayout) -> &'static str {
    match layout {
        StateLayout::KeyFirst => "[K, V]",
        StateLayout::ValueFirst => "[V, K]",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The drawn layouts are the ones docs/CONTRACT.md and the benchmark history record.
    #[test]
    fn the_drawn_layouts_are_the_recorded_ones() {
        let shapes = bench_shapes();
        let names: Vec<&str> = shapes.iter().map(|s| s.0).collect();
        let lengths = |name: &str| shapes.iter().find(|s| s.0 == name).map(|s| s.1.clone()).unwrap_or_default();
        assert_eq!(
            names,
            ["fixed_8192", "mixed_6", "fixed_32k", "many_short", "tiny", "random_ragged_32k", "decode_like"]
        );
        let (ragged, decode) = (lengths("random_ragged_32k"), lengths("decode_like"));
        assert_eq!((ragged.len(), ragged.iter().sum::<usize>()), (40, 32768));
        assert_eq!((ragged.iter().min(), ragged.iter().max()), (Some(&2), Some(&4727)));
        assert_eq!((decode.len(), decode.iter().sum::<usize>()), (256, 8401));
        assert!(decode.iter().all(|&l| (1..=CHUNK).contains(&l)));
    }

    #[test]
    fn the_model_shapes_are_valid_and_named_once() {
        let shapes = model_bench_shapes();
        for (name, lengths, shape) in &shapes {
            shape.validate().unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(!lengths.is_empty(), "{name}");
        }
        let mut names: Vec<&str> = shapes.iter().map(|s| s.0).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), shapes.len());
        assert_eq!(names.len(), 8);
    }

    #[test]
    fn gates_and_layouts_are_named() {
        let names: Vec<&str> = [(false, false), (true, false), (false, true), (true, true)]
            .map(|(g, gk)| gates_name(Gates { g, gk }))
            .into();
        assert_eq!(names, ["none", "g", "gk", "g and gk"]);
        assert_eq!((layout_name(StateLayout::KeyFirst), layout_name(StateLayout::ValueFirst)), ("[K, V]", "[V, K]"));
    }
}
