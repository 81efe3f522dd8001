//! Named input shapes for `profile`, `sanitize` and `ab`, written as safetensors files by Rust.

use crate::harness::bench_shapes;
use kda::{Problem, inputs, io};
use std::path::Path;

/// Seed of every generated input (the benchmark's, so `ab` and `bench` time the same data).
pub const INPUT_SEED: u64 = 20261202;

/// `ragged_many`: ragged lengths with tails and an empty sequence; at H = 32 that is 512 work
/// items (sequence, head, 64 value columns), so CTAs of the persistent grid run several items
/// back to back.
pub const RAGGED_MANY: &[usize] = &[0, 1, 63, 64, 65, 129, 200, 7];
pub const RAGGED_MANY_HEADS: usize = 32;

/// Every named shape: name, sequence lengths and heads. The benchmark's shapes (the reference
/// shapes, `random_ragged_32k` and `decode_like`) at H = 64, then `ragged_many`.
pub fn all() -> Vec<(&'static str, Vec<usize>, usize)> {
    let mut v: Vec<_> = bench_shapes().into_iter().map(|(n, l)| (n, l, inputs::REFERENCE_HEADS)).collect();
    v.push(("ragged_many", RAGGED_MANY.to_vec(), RAGGED_MANY_HEADS));
    v
}

/// The lengths and heads of shape `name`.
pub fn lookup(name: &str) -> Result<(Vec<usize>, usize), String> {
    let all = all();
    let names: Vec<&str> = all.iter().map(|s| s.0).collect();
    all.iter()
        .find(|s| s.0 == name)
        .map(|(_, l, h)| (l.clone(), *h))
        .ok_or_else(|| format!("unknown shape {name} (known: {})", names.join(", ")))
}

/// The random problem of shape `name` (with `h0`), as `kda::inputs::random_problem` draws it.
pub fn problem(name: &str) -> Result<Problem, String> {
    let (lengths, heads) = lookup(name)?;
    Ok(inputs::random_problem(kda::Plan::from_lengths(&lengths), heads, true, INPUT_SEED))
}

/// Writes the inputs of shape `name` to `path` and returns the problem.
pub fn write(name: &str, path: &Path) -> Result<Problem, String> {
    let p = problem(name)?;
    io::write_problem(path, &p, None).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_named_shapes() {
        assert_eq!(lookup("fixed_8192").unwrap(), (vec![8192], 64));
        assert_eq!(lookup("mixed_6").unwrap(), (vec![1300, 547, 2048, 963, 271, 3063], 64));
        assert_eq!(lookup("fixed_32k").unwrap(), (vec![32768], 64));
        assert_eq!(lookup("many_short").unwrap(), (vec![128; 64], 64));
        assert_eq!(lookup("tiny").unwrap(), (vec![256], 64));
        let (ragged, h) = lookup("random_ragged_32k").unwrap();
        assert_eq!((ragged.len(), ragged.iter().sum::<usize>(), h), (40, 32768, 64));
        let (decode, _) = lookup("decode_like").unwrap();
        assert_eq!(decode.len(), 256);
        assert!(decode.iter().all(|&n| (1..=64).contains(&n)));
        let (many, h) = lookup("ragged_many").unwrap();
        // 8 sequences x 32 heads x 2 blocks of 64 value columns.
        assert_eq!(many.len() * h * 2, 512);
        let e = lookup("huge").unwrap_err();
        assert!(e.contains("unknown shape huge") && e.contains("decode_like"), "{e}");
    }

    #[test]
    fn inputs_round_trip_through_a_file() {
        let dir = crate::proc::Scratch::new("test-shapes").unwrap();
        let path = dir.join("ragged_many.safetensors");
        let p = write("ragged_many", &path).unwrap();
        let (back, expected) = io::read_problem(&path).unwrap();
        assert_eq!((back.plan.lengths(), back.heads), (RAGGED_MANY.to_vec(), RAGGED_MANY_HEADS));
        assert_eq!((&back.k, &back.gk, &back.h0), (&p.k, &p.gk, &p.h0));
        assert!(expected.is_none());
    }
}
