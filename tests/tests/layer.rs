//! The whole layer on the CPU (`kda::layer`, docs/CONTRACT.md#the-layer) against FLA's layer
//! fixtures (`tests/fixtures/layer/README.md`): the token-by-token definition reproduces the
//! fixtures' f64 reference, the chunked decomposition (WY representation, the recurrence, the
//! output) is the definition, and the same decomposition through this library's recurrence
//! contract (bf16 `k'`, `w`, `u`, `h`, `v_new`) lands within the layer's precision bound.

use kda::layer::{LayerOutputs, Rounding, layer_chunked, layer_reference, read_layer_fixture};
use kda_tests::{LAYER_BOUND_OVER_FLA, LAYER_FIXTURES};

fn fixture(name: &str) -> std::path::PathBuf {
    kda_tests::fixture(&format!("layer/{name}"))
}

#[test]
fn the_definition_reproduces_the_fixtures_reference() {
    for name in LAYER_FIXTURES {
        let (p, golden) = read_layer_fixture(&fixture(name)).unwrap();
        let out = layer_reference(&p).unwrap();
        let errs = out.errors(&golden.reference);
        let fla = golden.fla.errors(&out);
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
        let errs = layer_chunked(&p, Rounding::Exact).unwrap().errors(&want);
        println!("{name}: chunked (f64) vs token by token: o {:.2e} ht {:.2e}", errs[0], errs[1]);
        // Both f64, stored as f32: only the summation order and the final rounding differ.
        assert!(errs.iter().all(|&e| e < 1e-6), "{name}: {errs:?}");
    }
}

#[test]
fn the_layer_on_the_recurrence_contract_is_within_the_layer_bound() {
    for name in LAYER_FIXTURES {
        let (p, golden) = read_layer_fixture(&fixture(name)).unwrap();
        let errs = layer_chunked(&p, Rounding::Kernels).unwrap().errors(&golden.reference);
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
    use kda_tests::random_layer_problem as problem;
    use proptest::prelude::*;

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
            let errs = layer_chunked(&p, Rounding::Exact).unwrap().errors(&want);
            prop_assert!(errs.iter().all(|&e| e < 1e-6), "{:?} {:?} {:?}: {:?}", lengths, shape, options, errs);
        }
    }

    /// A pool of `slots` random states for `shape`.
    fn pool_of(
        shape: &LayerShape,
        slots: usize,
        layout: kda::StateLayout,
        seed: u64,
    ) -> (kda::pool::PoolShape, Vec<f32>) {
        let pool = kda::pool::PoolShape::for_layer(shape, slots, layout, kda::pool::StateDtype::F32);
        let states =
            random_words(seed, 1).take(pool.len().unwrap()).map(|w| (2.0 * unit_uniform(w) - 1.0) as f32).collect();
        (pool, states)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]
        /// A prompt prefilled into a pool, then continued one token per step (a sequence with no
        /// token left is padding), equals the whole sequence prefilled at once.
        #[test]
        fn prefill_then_decode_is_the_whole_prefill(
            lengths in prop::collection::vec(1usize..90, 1..4),
            cuts in prop::collection::vec(0.0f64..1.0, 4),
            shape in shapes(),
            options in options(),
            seed: u64,
        ) {
            let whole = problem(&lengths, shape, options, false, seed);
            let want = layer_reference(&whole).unwrap();
            let hv = shape.value_heads;
            let prompt: Vec<usize> = lengths.iter().zip(&cuts).map(|(&l, &c)| ((l as f64 * c) as usize).max(1)).collect();
            let (pool, mut states) = pool_of(&shape, lengths.len() + 2, kda::StateLayout::KeyFirst, seed);
            // Sequence n lives in slot n + 1 (slot 0 and the last stay untouched).
            let slots: Vec<i64> = (0..lengths.len()).map(|n| n as i64 + 1).collect();
            let untouched = [states[..pool.offset(1, 0).unwrap()].to_vec(), states[pool.offset(lengths.len() + 1, 0).unwrap()..].to_vec()];
            // A batch of the rows `from[n]..to[n]` of every sequence (empty rows: padding).
            let batch = |spans: &[(usize, usize)]| -> (LayerProblem, Vec<i64>) {
                let p = whole.select(&spans.iter().enumerate().map(|(n, &(a, b))| (n, a..b)).collect::<Vec<_>>());
                let idx = spans.iter().zip(&slots).map(|(&(a, b), &s)| if b > a { s } else { -1 }).collect();
                (p, idx)
            };
            let mut o: Vec<Vec<f32>> = vec![Vec::new(); lengths.len()];
            // The prompts, fresh.
            let spans: Vec<(usize, usize)> = prompt.iter().map(|&p| (0, p)).collect();
            let (p, idx) = batch(&spans);
            let uses = kda::pool::slot_uses(&idx, &vec![true; idx.len()], &pool).unwrap();
            for (n, rows) in kda::pool::layer_reference_pooled(&p, &mut states, &pool, &uses).unwrap().into_iter().enumerate() {
                o[n].extend(rows.unwrap());
            }
            // Then one token per step.
            for step in 0..lengths.iter().max().copied().unwrap_or(0) {
                let spans: Vec<(usize, usize)> = lengths
                    .iter()
                    .zip(&prompt)
                    .map(|(&l, &p)| if p + step < l { (p + step, p + step + 1) } else { (0, 0) })
                    .collect();
                if spans.iter().all(|&(a, b)| a == b) {
                    break;
                }
                let (p, idx) = batch(&spans);
                let uses = kda::pool::slot_uses(&idx, &vec![false; idx.len()], &pool).unwrap();
                for (n, rows) in kda::pool::layer_reference_pooled(&p, &mut states, &pool, &uses).unwrap().into_iter().enumerate() {
                    match rows {
                        Some(r) => o[n].extend(r),
                        None => prop_assert!(spans[n].0 == spans[n].1, "sequence {} skipped", n),
                    }
                }
            }
            let got = LayerOutputs {
                o: o.concat(),
                ht: (0..lengths.len()).flat_map(|n| states[pool.offset(n + 1, 0).unwrap()..][..hv * pool.state_len()].to_vec()).collect(),
            };
            let errs = got.errors(&want);
            prop_assert!(errs.iter().all(|&e| e < 1e-6), "{:?} prompts {:?}: {:?}", lengths, prompt, errs);
            prop_assert!(states[..pool.offset(1, 0).unwrap()] == untouched[0][..], "slot 0 written");
            prop_assert!(states[pool.offset(lengths.len() + 1, 0).unwrap()..] == untouched[1][..], "the last slot written");
        }

        /// Pool indices (padding, fresh sequences, either layout, any slot order) against a
        /// reference that copies the states out of the pool, runs the layer and copies them back.
        #[test]
        fn pooled_calls_match_copying_states_out_and_back(
            lengths in prop::collection::vec(0usize..70, 1..5),
            order in Just(()).prop_perturb(|_, mut rng| { let mut v: Vec<usize> = (0..8).collect(); for i in (1..8).rev() { v.swap(i, (rng.next_u32() as usize) % (i + 1)); } v }),
            padding in prop::collection::vec(any::<bool>(), 5),
            fresh in prop::collection::vec(any::<bool>(), 5),
            value_first: bool,
            shape in shapes(),
            options in options(),
            seed: u64,
        ) {
            let n = lengths.len();
            let p = problem(&lengths, shape, options, false, seed);
            let layout = if value_first { kda::StateLayout::ValueFirst } else { kda::StateLayout::KeyFirst };
            let (pool, before) = pool_of(&shape, 8, layout, seed);
            let idx: Vec<i64> = (0..n).map(|m| if padding[m] { -1 } else { order[m] as i64 }).collect();
            let uses = kda::pool::slot_uses(&idx, &fresh[..n], &pool).unwrap();
            let mut states = before.clone();
            let got = kda::pool::layer_reference_pooled(&p, &mut states, &pool, &uses).unwrap();
            // The reference: every sequence run from its state copied out (key-first), then copied back.
            let (hv, kd, vd) = (shape.value_heads, shape.key_dim, shape.value_dim);
            let at = |a: usize, c: usize| if value_first { c * kd + a } else { a * vd + c };
            let mut h0 = vec![0f32; n * hv * kd * vd];
            for m in 0..n {
                if let kda::pool::SlotUse::Continue(slot) = uses[m] {
                    for i in 0..hv {
                        let base = pool.offset(slot, i).unwrap();
                        for a in 0..kd { for c in 0..vd { h0[((m * hv + i) * kd + a) * vd + c] = before[base + at(a, c)]; } }
                    }
                }
            }
            let want = layer_reference(&LayerProblem { h0: Some(h0), ..p.clone() }).unwrap();
            let mut expected = before.clone();
            for m in 0..n {
                let Some(slot) = uses[m].slot() else { continue };
                for i in 0..hv {
                    let base = pool.offset(slot, i).unwrap();
                    for a in 0..kd { for c in 0..vd { expected[base + at(a, c)] = want.ht[((m * hv + i) * kd + a) * vd + c]; } }
                }
                let d = &p.plan.seqs()[m];
                let rows = &want.o[d.token_start * hv * vd..(d.token_start + d.len) * hv * vd];
                prop_assert_eq!(got[m].as_deref(), Some(rows), "sequence {}", m);
            }
            for m in 0..n {
                if uses[m] == kda::pool::SlotUse::Padding { prop_assert!(got[m].is_none()); }
            }
            // Bitwise: the same f64 arithmetic, and slots no sequence names keep their bits.
            prop_assert!(states.iter().zip(&expected).all(|(a, b)| a.to_bits() == b.to_bits()), "pool differs");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 32, failure_persistence: None, ..ProptestConfig::default() })]
        /// Tree verification: every token's output and state equal those of its root-to-token
        /// path decoded one token at a time through a pool (bitwise: the same f64 steps, the
        /// states stored as f32 between them); a chain is ordinary decoding.
        #[test]
        fn a_draft_tree_verifies_as_its_paths_decoded_step_by_step(
            drafts in prop::collection::vec(1usize..9, 1..4),
            picks in prop::collection::vec(any::<u32>(), 8 * 3),
            shape in shapes(),
            options in options(),
            with_h0: bool,
            seed: u64,
        ) {
            let p = problem(&drafts, shape, options, with_h0, seed);
            // Token r's parent: an earlier token or the root (-1), drawn from `picks`.
            let parents: Vec<i64> = p.plan.seqs().iter().enumerate().flat_map(|(n, d)| {
                let picks = &picks;
                (0..d.len).map(move |r| (picks[n * 8 + r] as i64 % (r as i64 + 1)) - 1)
            }).collect();
            let got = kda::layer::verify_tree_reference(&p, &parents).unwrap();
            let (hv, kd, vd) = (shape.value_heads, shape.key_dim, shape.value_dim);
            let state = kd * vd;
            for (n, d) in p.plan.seqs().iter().enumerate() {
                for (r, (o, s)) in got[n].iter().enumerate() {
                    // The path root .. r.
                    let mut path = vec![r];
                    while let Ok(q) = usize::try_from(parents[d.token_start + *path.last().unwrap()]) { path.push(q); }
                    path.reverse();
                    // Decoded one token per call through a one-slot pool holding the initial state.
                    let pool = kda::pool::PoolShape::for_layer(&shape, 1, kda::StateLayout::KeyFirst, kda::pool::StateDtype::F32);
                    let mut states = match &p.h0 { Some(h0) => h0[n * hv * state..(n + 1) * hv * state].to_vec(), None => vec![0.0; hv * state] };
                    let mut last = Vec::new();
                    for &q in &path {
                        let one = p.select(&[(n, q..q + 1)]);
                        let uses = kda::pool::slot_uses(&[0], &[false], &pool).unwrap();
                        last = kda::pool::layer_reference_pooled(&one, &mut states, &pool, &uses).unwrap().remove(0).unwrap();
                    }
                    prop_assert!(o.iter().zip(&last).all(|(a, b)| a.to_bits() == b.to_bits()), "sequence {} token {}: o", n, r);
                    prop_assert!(s.iter().zip(&states).all(|(a, b)| a.to_bits() == b.to_bits()), "sequence {} token {}: state", n, r);
                }
            }
            // A parent that is not earlier is refused.
            let mut bad = parents.clone();
            bad[0] = 0;
            prop_assert!(kda::layer::verify_tree_reference(&p, &bad).is_err());
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 32, failure_persistence: None, ..ProptestConfig::default() })]
        /// A checkpoint at any position equals the final state of the prompt cut there.
        #[test]
        fn a_checkpoint_is_the_final_state_of_the_cut_prompt(
            lengths in prop::collection::vec(0usize..150, 1..4),
            cuts in prop::collection::vec(prop::collection::vec(0.0f64..=1.0, 0..4), 4),
            shape in shapes(),
            options in options(),
            with_h0: bool,
            seed: u64,
        ) {
            let p = problem(&lengths, shape, options, with_h0, seed);
            let positions: Vec<Vec<usize>> =
                lengths.iter().zip(&cuts).map(|(&l, c)| c.iter().map(|&x| (l as f64 * x) as usize).collect()).collect();
            let got = kda::layer::checkpoint_reference(&p, &positions).unwrap();
            let state = shape.value_heads * shape.key_dim * shape.value_dim;
            for (n, wanted) in positions.iter().enumerate() {
                for (w, &x) in wanted.iter().enumerate() {
                    // Sequence n alone, cut at x.
                    let cut = LayerProblem {
                        h0: p.h0.as_ref().map(|h0| h0[n * state..(n + 1) * state].to_vec()),
                        ..p.select(&[(n, 0..x)])
                    };
                    let want = layer_reference(&cut).unwrap();
                    prop_assert!(got[n][w] == want.ht, "sequence {} at {}", n, x);
                }
            }
            let mut past = positions.clone();
            past[0].push(lengths[0] + 1);
            prop_assert!(kda::layer::checkpoint_reference(&p, &past).is_err());
        }
    }
}

/// The layer kernels' shared-memory access patterns against the bank rule: a warp's access is
/// served in phases (4-byte words: the whole warp; 8 bytes: each half-warp; 16 bytes: each
/// quarter-warp), and a phase takes as many wavefronts as the most distinct words that fall on
/// one of the 32 banks. Every pattern the kernels issue in their loops takes one wavefront per
/// phase at the layout's strides (bench/history/2026-12-04-to-06-sessions.md, sixth session: 39% of
/// the prepare kernel's wavefronts were excess at rows 4 words apart mod 32).
mod banks {
    use kda::layout::layer::{INVERSE_ROW_WORDS, MATRIX_ROW_WORDS, ROW_WORDS, SHARED_BANKS, first_half};
    use std::collections::{BTreeMap, BTreeSet};

    /// Wavefronts of one warp access: lane `lane`'s first word `word(lane)`, `words` consecutive
    /// words per lane.
    fn wavefronts(words: usize, word: impl Fn(usize) -> usize) -> usize {
        let lanes_per_phase = 32 / words;
        (0..32 / lanes_per_phase)
            .map(|phase| {
                let mut banks: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
                for lane in phase * lanes_per_phase..(phase + 1) * lanes_per_phase {
                    for w in word(lane)..word(lane) + words {
                        banks.entry(w % SHARED_BANKS).or_default().insert(w);
                    }
                }
                banks.values().map(BTreeSet::len).max().unwrap()
            })
            .sum()
    }

    /// A lane's place in an `mma` fragment: `g = lane / 4`, `t = lane % 4`.
    fn gt(lane: usize) -> (usize, usize) {
        (lane / 4, lane % 4)
    }

    #[test]
    fn the_layer_kernels_shared_accesses_are_conflict_free() {
        // The gated products' fragments and the solve's accumulators: a lane's two adjacent
        // depths (columns 2t, 2t + 1) of row g, one 8-byte load, at every k-step.
        for k0 in (0..128).step_by(8) {
            assert_eq!(wavefronts(2, |l| gt(l).0 * ROW_WORDS + k0 + 2 * gt(l).1), 2, "pairs at k0 {k0}");
        }
        // The solve in the fragment's own depth order: A (`L`, the inverses) at columns t and
        // t + 4 of row g; B (`[w | u]`) down column g at rows t and t + 4.
        for stride in [MATRIX_ROW_WORDS, INVERSE_ROW_WORDS] {
            for apart in [0, 4] {
                assert_eq!(wavefronts(1, |l| gt(l).0 * stride + gt(l).1 + apart), 1, "A at stride {stride}");
            }
        }
        for apart in [0, 4] {
            assert_eq!(wavefronts(1, |l| (gt(l).1 + apart) * ROW_WORDS + gt(l).0), 1, "B down a column");
        }
        // A row's 8-column groups, a lane each (16 lanes a row at K = 128, 8 at K = 64), each
        // group's two 16-byte halves in `first_half`'s order; and what it avoids.
        for per_row in [8, 16] {
            for second in [false, true] {
                let word = |l: usize| {
                    let (r, c) = (l / per_row, 8 * (l % per_row));
                    let half = if second { first_half(c) ^ 4 } else { first_half(c) };
                    r * ROW_WORDS + c + half
                };
                assert_eq!(wavefronts(4, word), 4, "8-column groups, {per_row} a row");
            }
            assert_eq!(wavefronts(4, |l| l / per_row * ROW_WORDS + 8 * (l % per_row)), 8, "both first halves");
        }
        // Rows 4 words apart mod 32 took two wavefronts per half-warp for the adjacent pairs.
        assert_eq!(wavefronts(2, |l| gt(l).0 * (ROW_WORDS - 4) + 2 * gt(l).1), 4);
    }
}

/// A sample of key heads (with their value heads) is a problem of its own: its f64 reference is
/// the same heads of the whole batch's (what the bench compares its large shapes on).
#[test]
fn a_sample_of_key_heads_is_the_same_heads_of_the_whole_reference() {
    let mut checked = 0;
    for (name, p) in kda_tests::random_layer_cases().into_iter().filter(|(_, p)| p.shape.heads > 1) {
        let whole = layer_reference(&p).unwrap();
        for keep in [vec![p.shape.heads - 1], vec![p.shape.heads - 1, 0]] {
            let sample = p.key_heads(&keep);
            sample.validate().unwrap();
            let (got, want) = (layer_reference(&sample).unwrap(), whole.key_heads(&p, &keep));
            assert_eq!(got, want, "{name}: heads {keep:?}");
            assert_ne!(got.o, whole.o[..got.o.len()], "{name}: heads {keep:?} are not the first ones");
            checked += 1;
        }
    }
    assert!(checked >= 4, "{checked} samples");
}

/// The gate and `beta` in bf16: their values rounded once, the kernels told by one option bit
/// each, a file's dtype kept.
#[test]
fn bf16_gates_and_betas_are_rounded_once_and_flagged() {
    use kda::layer::{GateInput, InputDtype, LayerKind, LayerOptions, LayerShape, TokenDtypes};
    use kda::layout::layer::{OPT_BETA_BF16, OPT_GATE_BF16};
    assert_eq!(TokenDtypes::default().option_bits(), 0);
    assert_eq!(TokenDtypes::BF16.option_bits(), OPT_GATE_BF16 | OPT_BETA_BF16);
    assert_eq!(TokenDtypes { g: InputDtype::Bf16, beta: InputDtype::F32 }.option_bits(), OPT_GATE_BF16);
    let shape = LayerShape { kind: LayerKind::Kda, heads: 1, value_heads: 2, key_dim: 64, value_dim: 64 };
    let options = LayerOptions { scale: 0.125, l2norm_qk: true, beta_sigmoid: true, gate: GateInput::LowerBound(-5.0) };
    let p = kda::inputs::random_layer_problem(&[70, 3], shape, options, false, 5);
    let rounded = p.clone().with_dtypes(TokenDtypes::BF16);
    let exact = |x: &[f32]| x.iter().all(|&v| kda::bf16::from_f32(v).to_f32() == v);
    assert!(!exact(&p.g) && !exact(&p.beta), "random f32 inputs are not all bf16 values");
    assert!(exact(&rounded.g) && exact(&rounded.beta));
    assert!(rounded.g.iter().zip(&p.g).all(|(r, x)| (r - x).abs() <= x.abs() / 256.0));
    assert_eq!(rounded.clone().with_dtypes(TokenDtypes::BF16).g, rounded.g, "rounding twice changes nothing");
    // The reference runs on the rounded values, close to the f32 ones.
    let [o, ht] = layer_reference(&rounded).unwrap().errors(&layer_reference(&p).unwrap());
    assert!(o > 0.0 && o < 1e-2 && ht < 1e-2, "{o:e} {ht:e}");
    // A fixture's bf16 tensors go to the GPU in bf16.
    for name in LAYER_FIXTURES {
        let path = fixture(name);
        let (p, _) = read_layer_fixture(&path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let dtype = |t: &str| match file.tensor(t).unwrap().dtype() {
            safetensors::Dtype::BF16 => InputDtype::Bf16,
            _ => InputDtype::F32,
        };
        assert_eq!(p.dtypes, TokenDtypes { g: dtype("g"), beta: dtype("beta") }, "{name}");
    }
}
