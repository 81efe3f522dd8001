//! Named input shapes for `profile`, `sanitize` and `ab`, written as safetensors files by Rust.

use crate::harness::bench_shapes;
use kda::model::{ModelProblem, ModelShape};
use kda::{inputs, io};
use std::path::Path;

/// Seed of every generated input (the benchmark's, so `ab` and `bench` time the same data).
pub const INPUT_SEED: u64 = 20261202;

/// `ragged_many`: ragged lengths with tails and an empty sequence; at H = 32 that is 512 work
/// items (sequence, head, 64 value columns), so CTAs of the persistent grid run several items
/// back to back.
pub const RAGGED_MANY: &[usize] = &[0, 1, 63, 64, 65, 129, 200, 7];
pub const RAGGED_MANY_HEADS: usize = 32;

/// `split_tails`: sequences of several hundred tokens, each with a partial last chunk (60, 13 and
/// 1 tokens), a single token and an empty sequence, and no initial states: forced into segments
/// of a few chunks (`kda run --split N`) they exercise the pre-scan, segments ending in tails and
/// the merge, and the recurrence starting from zeros.
pub const SPLIT_TAILS: &[usize] = &[700, 0, 333, 1, 513];
/// Few heads: the sanitizers' runs stay short.
pub const SPLIT_TAILS_HEADS: usize = 2;

/// One named shape: its sequence lengths and its heads, sizes, gates and layout.
#[derive(Clone, Debug, PartialEq)]
pub struct Named {
    pub name: &'static str,
    pub lengths: Vec<usize>,
    pub shape: ModelShape,
    /// Whether the inputs have initial states.
    pub h0: bool,
}

/// Every named shape. The benchmark's KDA shapes (the reference shapes, `random_ragged_32k` and
/// `decode_like`) at H = 64, then `ragged_many` and `split_tails`, then the model bench shapes
/// (`kda_cli::model_bench_shapes`: Qwen3-Next, K = 64, value-first, ...).
pub fn all() -> Vec<Named> {
    let kda = |name, lengths, heads| Named { name, lengths, shape: ModelShape::kda(heads), h0: true };
    let mut v: Vec<_> = bench_shapes().into_iter().map(|(n, l)| kda(n, l, inputs::REFERENCE_HEADS)).collect();
    v.push(kda("ragged_many", RAGGED_MANY.to_vec(), RAGGED_MANY_HEADS));
    v.push(Named { h0: false, ..kda("split_tails", SPLIT_TAILS.to_vec(), SPLIT_TAILS_HEADS) });
    v.extend(kda_cli::model_bench_shapes().into_iter().map(|(name, lengths, shape)| Named {
        name,
        lengths,
        shape,
        h0: true,
    }));
    v
}

/// The shape named `name`.
pub fn lookup(name: &str) -> Result<Named, String> {
    let all = all();
    let names: Vec<&str> = all.iter().map(|s| s.name).collect();
    all.iter()
        .find(|s| s.name == name)
        .cloned()
        .ok_or_else(|| format!("unknown shape {name} (known: {})", names.join(", ")))
}

/// The random problem of shape `name` (with `h0` where the shape has it): KDA shapes as `kda::inputs::random_problem`
/// draws them (the benchmark's inputs), the others as `try_random_model_problem` does.
pub fn problem(name: &str) -> Result<ModelProblem, String> {
    let s = lookup(name)?;
    let plan = kda::Plan::from_lengths(&s.lengths);
    if s.shape == ModelShape::kda(s.shape.heads) {
        return Ok(inputs::random_problem(plan, s.shape.heads, s.h0, INPUT_SEED).into());
    }
    inputs::try_random_model_problem(plan, s.shape, s.h0, INPUT_SEED).map_err(|e| format!("{name}: {e}"))
}

/// Writes the inputs of shape `name` to `path` and returns the problem.
pub fn write(name: &str, path: &Path) -> Result<ModelProblem, String> {
    let p = problem(name)?;
    io::write_model_problem(path, &p.view(), None).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_named_shapes() {
        let kda = |name: &str| {
            let s = lookup(name).unwrap();
            assert_eq!(s.shape, ModelShape::kda(s.shape.heads), "{name}");
            (s.lengths, s.shape.heads)
        };
        assert_eq!(kda("fixed_8192"), (vec![8192], 64));
        assert_eq!(kda("mixed_6"), (vec![1300, 547, 2048, 963, 271, 3063], 64));
        assert_eq!(kda("fixed_32k"), (vec![32768], 64));
        assert_eq!(kda("many_short"), (vec![128; 64], 64));
        assert_eq!(kda("tiny"), (vec![256], 64));
        let (ragged, h) = kda("random_ragged_32k");
        assert_eq!((ragged.len(), ragged.iter().sum::<usize>(), h), (40, 32768, 64));
        let (decode, _) = kda("decode_like");
        assert_eq!(decode.len(), 256);
        assert!(decode.iter().all(|&n| (1..=64).contains(&n)));
        let qwen = lookup("qwen3_next_8192").unwrap();
        assert_eq!(
            (qwen.lengths, qwen.shape.heads, qwen.shape.value_heads, qwen.shape.gates.g),
            (vec![8192], 16, 32, true)
        );
        let (many, h) = kda("ragged_many");
        // 8 sequences x 32 heads x 2 blocks of 64 value columns.
        assert_eq!(many.len() * h * 2, 512);
        let split = lookup("split_tails").unwrap();
        assert_eq!((split.lengths, split.shape.heads, split.h0), (SPLIT_TAILS.to_vec(), SPLIT_TAILS_HEADS, false));
        // Every long sequence ends in a partial chunk.
        assert!(SPLIT_TAILS.iter().filter(|&&n| n > kda::layout::CHUNK).all(|n| n % kda::layout::CHUNK != 0));
        assert!(problem("split_tails").unwrap().h0.is_none());
        let e = lookup("huge").unwrap_err();
        assert!(e.contains("unknown shape huge") && e.contains("decode_like"), "{e}");
    }

    #[test]
    fn inputs_round_trip_through_a_file() {
        let dir = crate::proc::Scratch::new("test-shapes").unwrap();
        let path = dir.join("ragged_many.safetensors");
        let p = write("ragged_many", &path).unwrap();
        // A KDA shape's file is a KDA file.
        let (back, expected) = io::read_problem(&path).unwrap();
        assert_eq!((back.plan.lengths(), back.heads), (RAGGED_MANY.to_vec(), RAGGED_MANY_HEADS));
        assert_eq!((&back.k, Some(&back.gk), &back.h0), (&p.k, p.gk.as_ref(), &p.h0));
        assert!(expected.is_none());
    }
}
