//! The generalized recurrence on the CPU (docs/CONTRACT.md#the-generalized-recurrence): the f64
//! reference reproduces the model fixtures computed by FLA, agrees with an element-by-element
//! transcription on random gates, head groupings and sizes (proptest), and its layouts and head
//! groupings are the transformations they claim to be.

use half::bf16;
use kda::model::{Gates, ModelProblem, ModelShape, StateLayout};
use kda::precision::ERROR_BOUND;
use kda::{Outputs, Plan, inputs, io, reference};
use kda_tests::{MODEL_FIXTURES, model_fixture, ragged_lengths};
use proptest::prelude::*;

/// The fixtures' shapes, as `tests/fixtures/models/README.md` lists them: (H, HV, K, V, g, gk,
/// value-first, h0, lengths).
#[allow(clippy::type_complexity)]
const EXPECTED: [(usize, usize, usize, usize, bool, bool, bool, bool, &[usize]); 6] = [
    (2, 4, 128, 128, true, false, false, true, &[1, 64, 0, 130, 77]),
    (1, 2, 128, 128, false, true, true, true, &[200, 65]),
    (2, 2, 128, 128, true, true, false, false, &[150]),
    (2, 2, 64, 64, false, true, false, true, &[129, 3]),
    (1, 1, 256, 512, true, false, false, true, &[100]),
    (1, 1, 128, 256, false, false, false, true, &[90, 64]),
];

#[test]
fn the_reference_reproduces_the_model_fixtures() {
    for (name, (h, hv, kd, vd, g, gk, vfirst, h0, lengths)) in MODEL_FIXTURES.iter().zip(EXPECTED) {
        let (p, golden) = io::read_model_problem(&model_fixture(name)).unwrap();
        let s = p.shape;
        let layout = if vfirst { StateLayout::ValueFirst } else { StateLayout::KeyFirst };
        assert_eq!((s.heads, s.value_heads, s.key_dim, s.value_dim), (h, hv, kd, vd), "{name}");
        assert_eq!((s.gates, s.layout, p.h0.is_some()), (Gates { g, gk }, layout, h0), "{name}");
        assert_eq!(p.plan.lengths(), lengths, "{name}");
        let errs = reference::model_reference(&p.view()).unwrap().errors(&golden.expect("fixtures hold outputs"));
        println!("{name}: rel err vs FLA h {:.2e}  v_new {:.2e}  ht {:.2e}", errs[0], errs[1], errs[2]);
        for (out, e) in ["h", "v_new", "ht"].iter().zip(errs) {
            assert!(e < ERROR_BOUND, "{name}: {out} relative error {e:.3e}");
        }
    }
}

/// The generalized recurrence written out element by element with explicit index arithmetic, in
/// f64, independently of `kda::reference` (which works on per-item slices in parallel).
fn literal(p: &ModelProblem) -> Outputs {
    let s = p.shape;
    let (hh, hv, kd, vd) = (s.heads, s.value_heads, s.key_dim, s.value_dim);
    let group = hv / hh;
    let at_k = |t: usize, j: usize, i: usize| (t * hh + j) * kd + i;
    let at_w = |t: usize, h: usize, i: usize| (t * hv + h) * kd + i;
    let at_v = |t: usize, h: usize, c: usize| (t * hv + h) * vd + c;
    let at_s = |n: usize, h: usize, a: usize, b: usize| {
        let inner = match s.layout {
            StateLayout::KeyFirst => a * vd + b,
            StateLayout::ValueFirst => b * kd + a,
        };
        (n * hv + h) * kd * vd + inner
    };
    let f = |x: bf16| f64::from(x);
    let round = |x: f64| f64::from(bf16::from_f32(x as f32));
    let mut out = Outputs {
        h: vec![bf16::ZERO; p.plan.chunks() * hv * kd * vd],
        v_new: vec![bf16::ZERO; p.plan.tokens() * hv * vd],
        ht: vec![0.0; p.plan.num_seqs() * hv * kd * vd],
    };
    for (n, seq) in p.plan.seqs().iter().enumerate() {
        for h in 0..hv {
            let j = h / group;
            let mut st = vec![vec![0.0f64; vd]; kd];
            if let Some(h0) = &p.h0 {
                for (a, row) in st.iter_mut().enumerate() {
                    for (b, x) in row.iter_mut().enumerate() {
                        *x = h0[at_s(n, h, a, b)] as f64;
                    }
                }
            }
            let (mut c, mut t0) = (0, seq.token_start);
            while t0 < seq.token_start + seq.len {
                let t1 = (t0 + 64).min(seq.token_start + seq.len);
                let sb: Vec<Vec<f64>> = st.iter().map(|r| r.iter().map(|&x| round(x)).collect()).collect();
                // `h` has one state per (chunk, value head): index it as a state of "sequence"
                // `chunk_start + c`.
                for (a, row) in sb.iter().enumerate() {
                    for (b, &x) in row.iter().enumerate() {
                        out.h[at_s(seq.chunk_start + c, h, a, b)] = bf16::from_f64(x);
                    }
                }
                let gl = p.g.as_ref().map(|g| g[(t1 - 1) * hv + h] as f64);
                let mut vn = vec![vec![0.0f64; vd]; t1 - t0];
                for t in t0..t1 {
                    let scale = gl.map(|gl| (gl - p.g.as_ref().unwrap()[t * hv + h] as f64).exp2());
                    for b in 0..vd {
                        let ws: f64 = (0..kd).map(|a| f(p.w[at_w(t, h, a)]) * sb[a][b]).sum();
                        let v = f(p.u[at_v(t, h, b)]) - ws;
                        out.v_new[at_v(t, h, b)] = bf16::from_f32(v as f32);
                        vn[t - t0][b] = round(scale.map_or(v, |sc| v * sc));
                    }
                }
                for (a, row) in st.iter_mut().enumerate() {
                    let mut decay = gl.map_or(1.0, f64::exp2);
                    if let Some(gk) = &p.gk {
                        decay *= (gk[at_w(t1 - 1, h, a)] as f64).exp2();
                    }
                    for (b, x) in row.iter_mut().enumerate() {
                        let kv: f64 = (t0..t1).map(|t| f(p.k[at_k(t, j, a)]) * vn[t - t0][b]).sum();
                        *x = decay * *x + kv;
                    }
                }
                t0 = t1;
                c += 1;
            }
            for (a, row) in st.iter().enumerate() {
                for (b, &x) in row.iter().enumerate() {
                    out.ht[at_s(n, h, a, b)] = x as f32;
                }
            }
        }
    }
    out
}

/// The most units in the last place between paired floats, each given as its place on the
/// ordered line of its type's values (`bf16_line`, `f32_line`).
fn ulps_apart(pairs: impl Iterator<Item = (i64, i64)>) -> u64 {
    pairs.map(|(a, b)| a.abs_diff(b)).max().unwrap_or(0)
}

/// A bf16's place among bf16 values in order: adjacent values are adjacent integers, both zeros 0.
fn bf16_line(x: bf16) -> i64 {
    let (bits, magnitude) = (x.to_bits(), i64::from(x.to_bits() & 0x7fff));
    if bits & 0x8000 != 0 { -magnitude } else { magnitude }
}

/// An f32's place among f32 values in order (as [`bf16_line`]).
fn f32_line(x: f32) -> i64 {
    let (bits, magnitude) = (x.to_bits(), i64::from(x.to_bits() & 0x7fff_ffff));
    if bits >> 31 != 0 { -magnitude } else { magnitude }
}

/// Units in the last place between the parallel reference's outputs and the literal
/// transcription's (`h`, `v_new`, `ht`) on a random problem.
fn literal_ulps_apart(lengths: &[usize], shape: ModelShape, with_h0: bool, seed: u64) -> [u64; 3] {
    let p = inputs::try_random_model_problem(Plan::from_lengths(lengths), shape, with_h0, seed).unwrap();
    let (got, want) = (reference::model_reference(&p.view()).unwrap(), literal(&p));
    let bf16_apart = |a: &[bf16], b: &[bf16]| ulps_apart(a.iter().zip(b).map(|(&x, &y)| (bf16_line(x), bf16_line(y))));
    let f32_apart = |a: &[f32], b: &[f32]| ulps_apart(a.iter().zip(b).map(|(&x, &y)| (f32_line(x), f32_line(y))));
    [bf16_apart(&got.h, &want.h), bf16_apart(&got.v_new, &want.v_new), f32_apart(&got.ht, &want.ht)]
}

/// The draw on which a relative bound of 1e-12 on the whole of `ht` failed: one f32 of `ht`
/// rounded the other way (2.2e-10 relative), every other element equal.
#[test]
fn one_rounding_flip_is_f64_rounding_not_a_difference() {
    let shape = ModelShape {
        heads: 2,
        value_heads: 2,
        key_dim: 128,
        value_dim: 64,
        gates: Gates { g: true, gk: true },
        layout: StateLayout::ValueFirst,
    };
    let apart = literal_ulps_apart(&[95], shape, true, 11213686211818876596);
    assert!(apart.iter().all(|&u| u <= 1), "{apart:?}");
}

/// Model shapes the proptests draw: every gate kind, one to two key heads, groups of one to
/// three value heads, head sizes 64 or 128, either layout.
fn shapes() -> impl Strategy<Value = ModelShape> {
    kda_tests::model_shapes(vec![64, 128], vec![64, 128])
}

/// Short ragged layouts (the literal transcription is slow).
fn short_lengths() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(prop_oneof![0usize..=140, Just(64usize), Just(1usize)], 1..4)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, failure_persistence: None, ..ProptestConfig::default() })]

    /// The parallel reference and the literal transcription agree to f64 rounding on random
    /// gates, head groupings, head sizes and layouts: every output element the same or one unit
    /// in the last place of its storage type apart (bf16 `h` and `v_new`, f32 `ht`), which is
    /// what two f64 summation orders can change once rounded (a value that lands on the other
    /// side of a rounding boundary; a relative bound on the whole tensor failed on such a flip).
    #[test]
    fn agrees_with_the_literal_transcription(lengths in short_lengths(), shape in shapes(), with_h0: bool, seed: u64) {
        let apart = literal_ulps_apart(&lengths, shape, with_h0, seed);
        prop_assert!(apart.iter().all(|&u| u <= 1), "{:?}: units in the last place apart (h, v_new, ht): {:?}", shape, apart);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    /// A value-first problem is its key-first twin with every state transposed: `h` and `ht`
    /// transposed, `v_new` identical, bit for bit.
    #[test]
    fn value_first_is_the_transpose(lengths in ragged_lengths(), shape in shapes(), seed: u64) {
        let key_first = ModelShape { layout: StateLayout::KeyFirst, ..shape };
        let p = inputs::try_random_model_problem(Plan::from_lengths(&lengths), key_first, true, seed).unwrap();
        let (kd, vd) = (shape.key_dim, shape.value_dim);
        let transpose = |x: &[f32]| -> Vec<f32> {
            x.chunks_exact(kd * vd).flat_map(|m| (0..vd * kd).map(move |i| m[(i % kd) * vd + i / kd])).collect()
        };
        let mut q = p.clone();
        q.shape.layout = StateLayout::ValueFirst;
        q.h0 = p.h0.as_deref().map(transpose);
        let (a, b) = (reference::model_reference(&p.view()).unwrap(), reference::model_reference(&q.view()).unwrap());
        prop_assert_eq!(&a.v_new, &b.v_new);
        prop_assert_eq!(transpose(&a.ht), b.ht);
        let h: Vec<f32> = a.h.iter().map(|x| x.to_f32()).collect();
        prop_assert!(transpose(&h).iter().zip(&b.h).all(|(x, y)| *x == y.to_f32()));
    }

    /// Grouped value heads read their group's key head: the same outputs as a problem with one
    /// key head per value head, each a copy of its group's.
    #[test]
    fn grouped_heads_share_their_key_head(lengths in ragged_lengths(), shape in shapes(), seed: u64) {
        let p = inputs::try_random_model_problem(Plan::from_lengths(&lengths), shape, true, seed).unwrap();
        let (hh, hv, kd) = (shape.heads, shape.value_heads, shape.key_dim);
        let mut q = p.clone();
        q.shape.heads = hv;
        q.k = p.k.chunks_exact(hh * kd).flat_map(|row| (0..hv).flat_map(move |i| {
            let j = i / (hv / hh);
            row[j * kd..(j + 1) * kd].iter().copied()
        })).collect();
        prop_assert_eq!(reference::model_reference(&p.view()).unwrap(), reference::model_reference(&q.view()).unwrap());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    /// Strided views, as the launcher checks them: every drawn layout (packed, padded rows,
    /// head-major) holds exactly its span, one element less is a shape error naming the tensor,
    /// output rows never overlap, the strides are ones TMA can express, and laying the packed
    /// tensor out at its strides and reading it back gives it unchanged with the gaps untouched.
    #[test]
    fn strided_views_round_trip_and_are_validated(
        lengths in ragged_lengths(),
        shape in kda_tests::model_shapes(vec![64, 128, 256], vec![64, 128, 512]),
        layouts in kda_tests::row_layouts(),
    ) {
        use kda::{KdaError, Tensor};
        let plan = Plan::from_lengths(&lengths);
        let d = kda::Dims::model(&plan, &shape);
        let strides = kda_tests::strides_of(layouts, &d);
        prop_assert!(strides.check_hopper(&d).is_ok(), "{:?}", strides);
        for tensor in [Tensor::K, Tensor::W, Tensor::U, Tensor::G, Tensor::Gk, Tensor::VNew] {
            let len = strides.len_of(&d, tensor).unwrap();
            prop_assert!(strides.check_len(&d, tensor, len).is_ok(), "{}", tensor);
            if len > 0 {
                let err = strides.check_len(&d, tensor, len - 1).unwrap_err();
                let named = matches!(err, KdaError::Shape { tensor: name, expected_len, .. } if name == tensor.name() && expected_len == len);
                prop_assert!(named, "{}: {}", tensor, err);
            }
            let packed: Vec<u32> = (0..d.len_of(tensor).unwrap() as u32).collect();
            let laid = strides.scatter(&d, tensor, &packed, u32::MAX);
            prop_assert_eq!(laid.len(), len);
            prop_assert_eq!(laid.iter().filter(|&&x| x == u32::MAX).count(), len - packed.len());
            prop_assert_eq!(strides.gather(&d, tensor, &laid), packed);
        }
    }
}

/// The KDA reader never reads a generalized file as a KDA one (dropping `g`, or taking a
/// value-first state for a key-first one): it names what it does not read.
#[test]
fn the_kda_reader_refuses_generalized_files() {
    use kda::KdaError;
    let err = io::read_problem(&model_fixture("g_and_gk")).unwrap_err();
    assert!(matches!(err, KdaError::Unsupported { argument: "g", .. }), "{err}");
    let err = io::read_problem(&model_fixture("kda_gva_vfirst")).unwrap_err();
    assert!(matches!(err, KdaError::Unsupported { argument: "state_layout", .. }), "{err}");
    for name in ["gdn_k256_v512", "kda_k64", "plain_delta_k128_v256", "gdn_gva_ragged"] {
        assert!(io::read_problem(&model_fixture(name)).is_err(), "{name} read as a KDA problem");
    }
}
