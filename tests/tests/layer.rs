//! The whole layer on the CPU (`kda::layer`, docs/CONTRACT.md#the-layer) against FLA's layer
//! fixtures (`tests/fixtures/layer/README.md`): the token-by-token definition reproduces the
//! fixtures' f64 reference, the chunked decomposition (WY representation, the recurrence, the
//! output) is the definition, and the same decomposition through this library's recurrence
//! contract (bf16 `k'`, `w`, `u`, `h`, `v_new`) lands within the layer's precision bound.

use kda::layer::{LayerOutputs, Rounding, layer_chunked, layer_reference, read_layer_fixture};
use kda::rel_error;

/// The layer fixtures.
const LAYER_FIXTURES: [&str; 5] = [
    "kda_layer_ragged",
    "kda_layer_gate_in_kernel",
    "kda_layer_dense_no_h0",
    "gdn_layer_gva_ragged",
    "gdn_layer_dense",
];

/// A correct layer's error against the f64 reference is at most this multiple of FLA's
/// (`../shared/LAYER.md`, "Precision").
const LAYER_BOUND_OVER_FLA: f64 = 1.25;

fn fixture(name: &str) -> std::path::PathBuf {
    kda_tests::fixture(&format!("layer/{name}"))
}

fn errors(out: &LayerOutputs, want: &LayerOutputs) -> [f64; 2] {
    let f = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<_>>();
    [rel_error(&f(&out.o), &f(&want.o)), rel_error(&f(&out.ht), &f(&want.ht))]
}

#[test]
fn the_definition_reproduces_the_fixtures_reference() {
    for name in LAYER_FIXTURES {
        let (p, golden) = read_layer_fixture(&fixture(name)).unwrap();
        let out = layer_reference(&p).unwrap();
        let errs = errors(&out, &golden.reference);
        let fla = errors(&golden.fla, &out);
        println!(
            "{name}: vs the fixture's reference o {:.2e} ht {:.2e}; FLA vs ours o {:.2e} ht {:.2e} (recorded {:.2e} {:.2e})",
            errs[0], errs[1], fla[0], fla[1], golden.fla_errors[0], golden.fla_errors[1]
        );
        // The fixture stores its f64 reference as f32.
        assert!(errs.iter().all(|&e| e < 1e-6), "{name}: {errs:?}");
        for (ours, recorded) in fla.iter().zip(golden.fla_errors) {
            assert!(
                (ours - recorded).abs() < 1e-3 * recorded,
                "{name}: FLA's error {ours} against ours, {recorded} recorded"
            );
        }
    }
}

#[test]
fn the_chunked_layer_is_the_definition() {
    for name in LAYER_FIXTURES {
        let (p, _) = read_layer_fixture(&fixture(name)).unwrap();
        let want = layer_reference(&p).unwrap();
        let errs = errors(&layer_chunked(&p, Rounding::Exact).unwrap(), &want);
        println!("{name}: chunked (f64) vs token by token: o {:.2e} ht {:.2e}", errs[0], errs[1]);
        // Both f64, stored as f32: only the summation order and the final rounding differ.
        assert!(errs.iter().all(|&e| e < 1e-6), "{name}: {errs:?}");
    }
}

#[test]
fn the_layer_on_the_recurrence_contract_is_within_the_layer_bound() {
    for name in LAYER_FIXTURES {
        let (p, golden) = read_layer_fixture(&fixture(name)).unwrap();
        let errs = errors(&layer_chunked(&p, Rounding::Kernels).unwrap(), &golden.reference);
        let [fo, fh] = golden.fla_errors;
        println!(
            "{name}: on the recurrence contract o {:.2e} ({:.2}x FLA's) ht {:.2e} ({:.2}x FLA's)",
            errs[0],
            errs[0] / fo,
            errs[1],
            errs[1] / fh
        );
        assert!(errs[0] <= LAYER_BOUND_OVER_FLA * fo && errs[1] <= LAYER_BOUND_OVER_FLA * fh, "{name}: {errs:?}");
    }
}

mod random {
    //! The chunked layer against the definition on random layers: both kinds, grouped value
    //! heads, every gate form and option, ragged lengths with partial chunks and empty sequences.

    use super::*;
    use kda::inputs::{random_words, unit_uniform};
    use kda::layer::{GateInput, LayerKind, LayerOptions, LayerProblem, LayerShape};
    use kda::{Plan, bf16};
    use proptest::prelude::*;

    /// A random layer problem of `shape` (values in the ranges models see: unit-scale `q`, `k`,
    /// `v`, `beta` in (0, 1) or its logits, decays down to -5 per token).
    fn problem(lengths: &[usize], shape: LayerShape, options: LayerOptions, with_h0: bool, seed: u64) -> LayerProblem {
        let plan = Plan::from_lengths(lengths);
        let (t, n) = (plan.tokens(), plan.num_seqs());
        let mut words = random_words(seed, 0).map(unit_uniform);
        let mut draw = |len: usize, lo: f64, hi: f64| -> Vec<f64> {
            (0..len).map(|_| lo + (hi - lo) * words.next().unwrap()).collect()
        };
        let bf = |v: Vec<f64>| v.into_iter().map(bf16::from_f64).collect::<Vec<_>>();
        let f = |v: Vec<f64>| v.into_iter().map(|x| x as f32).collect::<Vec<_>>();
        let (h, hv, kd, vd, gw) = (shape.heads, shape.value_heads, shape.key_dim, shape.value_dim, shape.gate_width());
        let key_scale = 1.0 / (kd as f64).sqrt();
        let raw = !matches!(options.gate, GateInput::Log);
        LayerProblem {
            q: bf(draw(t * h * kd, -key_scale, key_scale)),
            k: bf(draw(t * h * kd, -key_scale, key_scale)),
            v: bf(draw(t * hv * vd, -1.0, 1.0)),
            g: f(if raw { draw(t * hv * gw, -3.0, 3.0) } else { draw(t * hv * gw, -0.5, 0.0) }),
            beta: f(if options.beta_sigmoid { draw(t * hv, -3.0, 3.0) } else { draw(t * hv, 0.0, 1.0) }),
            a_log: raw.then(|| f(draw(hv, -1.0, 1.0))),
            dt_bias: raw.then(|| f(draw(hv * gw, -1.0, 1.0))),
            h0: with_h0.then(|| f(draw(n * hv * kd * vd, -1.0, 1.0))),
            plan,
            shape,
            options,
        }
    }

    fn shapes() -> impl Strategy<Value = LayerShape> {
        (
            prop_oneof![Just(LayerKind::Kda), Just(LayerKind::Gdn)],
            1usize..=2,
            1usize..=2,
            prop_oneof![Just(16usize), Just(32)],
            prop_oneof![Just(16usize), Just(32)],
        )
            .prop_map(|(kind, heads, group, key_dim, value_dim)| LayerShape {
                kind,
                heads,
                value_heads: heads * group,
                key_dim,
                value_dim,
            })
    }

    fn options() -> impl Strategy<Value = LayerOptions> {
        let gate = prop_oneof![Just(GateInput::Log), Just(GateInput::Softplus), Just(GateInput::LowerBound(-5.0))];
        (gate, any::<bool>(), any::<bool>()).prop_map(|(gate, l2norm_qk, beta_sigmoid)| LayerOptions {
            scale: 0.25,
            l2norm_qk,
            beta_sigmoid,
            gate,
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]
        #[test]
        fn the_chunked_layer_is_the_definition_on_random_layers(
            lengths in prop::collection::vec(prop_oneof![Just(0usize), 1usize..200], 1..4),
            shape in shapes(),
            options in options(),
            with_h0: bool,
            seed: u64,
        ) {
            let p = problem(&lengths, shape, options, with_h0, seed);
            let want = layer_reference(&p).unwrap();
            let errs = errors(&layer_chunked(&p, Rounding::Exact).unwrap(), &want);
            prop_assert!(errs.iter().all(|&e| e < 1e-6), "{:?} {:?} {:?}: {:?}", lengths, shape, options, errs);
        }
    }
}
