//! Splitting long sequences, on the CPU (docs/CONTRACT.md#splitting-one-sequence): the affine
//! decomposition the split passes compute (pre-scan over the augmented state, merge, main pass),
//! against the unsplit recurrence, on every gate kind, head grouping, head size and layout.
//!
//! What it shows: with no cut, and with one cut and no `h0` (the merge's one step adds the first
//! segment's `B` to a zero entry: the second segment starts from the first one's final state),
//! the passes are the recurrence. Each merge step with a nonzero entry adds the bf16
//! rounding of the augmented state `[M | B]` in the pre-scan's products, rounding points the
//! unsplit recurrence does not have: about 1e-3 relative per step on these short sequences,
//! above the contract's 1e-3 floor (docs/DESIGN.md, "Splitting sequences"). The bound below
//! records that measured level so that a regression shows; the planner keeps such cuts out of
//! its plans where they drift past the contract (`split::PRECISE_SEGMENT_CHUNKS`), and only
//! forced lengths reach them.

use kda::split::{SplitMode, SplitPlan, Work, split_reference};
use kda::{Plan, inputs, reference};
use proptest::prelude::*;

/// The largest relative error measured with merge steps on these shapes (3.0e-3 with nine
/// steps), with headroom: a bug in the passes (a wrong entry state, a segment written at the
/// wrong place) is orders of magnitude above it.
const BF16_PRESCAN_BOUND: f64 = 5e-3;

/// One cut and no merge step: the state handed to the second segment is the f32 final state of
/// the first, where the f64 reference carries f64; measured up to 1.3e-5.
const HANDOVER_BOUND: f64 = 1e-4;

/// Ragged layouts with at least one sequence several chunks long.
fn long_lengths() -> impl Strategy<Value = Vec<usize>> {
    (200usize..700, prop::collection::vec(0usize..300, 0..3))
        .prop_map(|(long, rest)| std::iter::once(long).chain(rest).collect())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn a_split_batch_matches_the_unsplit_recurrence(
        lengths in long_lengths(),
        shape in kda_tests::model_shapes(vec![64, 128], vec![64, 128]),
        segment_chunks in 1usize..4,
        with_h0: bool,
        seed: u64,
    ) {
        let plan = Plan::from_lengths(&lengths);
        let p = inputs::try_random_model_problem(plan.clone(), shape, with_h0, seed).unwrap();
        let (value_heads, key_dim, value_dim) = (shape.value_heads, shape.key_dim, shape.value_dim);
        let work = Work { value_heads, key_dim, value_dim, workers: 132, block_width: kda::layout::hopper::BV, gates: shape.gates };
        let want = reference::model_reference(&p.view()).unwrap();

        // Uncut, the passes are the recurrence itself.
        let uncut = split_reference(&p.view(), &SplitPlan::unsplit(&plan)).unwrap();
        prop_assert_eq!(&uncut, &want);

        let split = SplitPlan::decide(&plan, &work, SplitMode::Chunks(segment_chunks));
        prop_assert!(split.is_split());
        // Merge steps through a map: every step but the first (the first segment's exit state,
        // run from h0).
        let merges = (0..plan.num_seqs()).map(|n| split.segments_of(n).len().saturating_sub(2)).max().unwrap_or(0);
        let errs = split_reference(&p.view(), &split).unwrap().errors(&want);
        println!("{lengths:?} {shape:?} every {segment_chunks} chunks, {merges} merge steps: {:.2e} {:.2e} {:.2e}", errs[0], errs[1], errs[2]);
        if merges == 0 {
            // One cut: only the f32 rounding of the state handed over differs (the f64 reference
            // carries an f64 state), which flips a rare bf16 rounding.
            prop_assert!(errs.iter().all(|&e| e < HANDOVER_BOUND), "{:?}", errs);
        } else {
            prop_assert!(errs.iter().all(|&e| e < BF16_PRESCAN_BOUND), "{:?}", errs);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    /// The tables of the GPU passes for any batch and forced segment length: the main pass's
    /// units tile every sequence in order, only a sequence's last segment writes its final
    /// state, the pre-scan maps exactly the other segments (a first segment from its sequence's
    /// `h0`, over the map's `B` columns alone), the merge's records chain them, and every work
    /// record of both passes names rows and columns inside its buffers.
    #[test]
    fn the_split_tables_cover_every_token_once(
        lengths in prop::collection::vec(prop_oneof![Just(0usize), 1usize..3000], 1..6),
        segment_chunks in 1usize..40,
        value_heads in 1usize..4,
        key_dim in prop_oneof![Just(64usize), Just(128)],
        value_dim in prop_oneof![Just(64usize), Just(128), Just(512)],
    ) {
        use kda::layout::{hopper::BV, ITEM_H0_ROW, ITEM_HT_ROW, ITEM_NO_ROW, ITEM_NO_U, ITEM_U_COL, ITEM_VCOL0, ITEM_WORDS, MERGE_WORDS};
        use kda::schedule::{Schedule, UColumns};
        let plan = Plan::from_lengths(&lengths);
        let split = SplitPlan::cut(&plan, segment_chunks);
        let main = split.main_units();
        prop_assert_eq!(main.len(), split.segments().len());
        for (n, d) in plan.seqs().iter().enumerate() {
            let segs: Vec<_> = main.iter().zip(split.segments()).filter(|(_, s)| s.seq == n).map(|(u, _)| *u).collect();
            let mut token = d.token_start;
            for (i, u) in segs.iter().enumerate() {
                prop_assert_eq!(u.token_start, token);
                prop_assert_eq!(u.chunk_start, d.chunk_start + (token - d.token_start) / kda::layout::CHUNK);
                prop_assert_eq!(u.ht_state, if i + 1 == segs.len() { Some(n) } else { None });
                token += u.len;
            }
            prop_assert_eq!(token, d.token_start + d.len);
        }
        let prescan = split.prescan_units();
        prop_assert_eq!(prescan.len(), split.maps());
        prop_assert!(prescan.iter().enumerate().all(|(m, u)| u.ht_state == Some(m) && u.len % kda::layout::CHUNK == 0));
        for (u, s) in prescan.iter().zip(split.segments().iter().filter(|s| split.segments_of(s.seq).len() > s.index + 1)) {
            prop_assert_eq!(u.token_start, s.token_start);
            prop_assert_eq!(u.h0_state, (s.index == 0).then_some(s.seq));
        }
        let table = split.merge_table().unwrap();
        let (mut entry, mut map) = (0u32, 0u32);
        for (n, r) in table.chunks_exact(MERGE_WORDS).enumerate() {
            prop_assert_eq!(r, &[n as u32, entry, split.segments_of(n).len() as u32, map, 1][..]);
            entry += r[2];
            map += r[2] - 1;
        }
        prop_assert_eq!(map as usize, split.maps());
        // Work records of both passes.
        let passes = [
            (prescan, (key_dim + value_dim) / BV, UColumns::Prescan { key_dim }, split.maps(), plan.num_seqs()),
            (main, value_dim / BV, UColumns::Values, plan.num_seqs(), split.segments().len()),
        ];
        for (units, blocks, u_columns, ht_states, h0_states) in passes {
            let s = Schedule::try_lpt_units(&units, u_columns, value_heads, (blocks, BV), 132).unwrap();
            let t = s.table_of(&units, 1, u_columns).unwrap();
            let items: usize = units.iter().map(|u| value_heads * (blocks - u_columns.first_block(u, BV))).sum();
            prop_assert_eq!(t.len(), items * ITEM_WORDS);
            for r in t.chunks_exact(ITEM_WORDS) {
                prop_assert!(r[ITEM_HT_ROW] == ITEM_NO_ROW || (r[ITEM_HT_ROW] as usize) < ht_states * value_heads);
                let from_h0 = r[ITEM_H0_ROW] != ITEM_NO_ROW;
                prop_assert!(!from_h0 || (r[ITEM_H0_ROW] as usize) < h0_states * value_heads);
                let col = r[ITEM_VCOL0] as usize;
                match u_columns {
                    UColumns::Prescan { .. } => {
                        prop_assert!(col + BV <= key_dim + value_dim);
                        if col < key_dim {
                            // A map's key columns, from the identity's.
                            prop_assert!(!from_h0);
                            prop_assert_eq!(r[ITEM_U_COL], ITEM_NO_U);
                        } else {
                            prop_assert_eq!(r[ITEM_U_COL] as usize, col - key_dim);
                        }
                    }
                    UColumns::Values => prop_assert!(from_h0 && col + BV <= value_dim && r[ITEM_U_COL] as usize == col),
                }
            }
        }
    }
}

/// Why the planner's precision guard exists (`split::PRECISE_SEGMENT_CHUNKS`), on the f64 model
/// of the split passes, which reproduces the GPU's errors (an H100 measured `h` 2.54e-3 and
/// 2.16e-3 on 8192-token KDA sequences cut every 16 and 32 chunks, where this model gives 2.51e-3
/// and 2.05e-3): with a per-key gate the cuts the guard refuses leave the contract's bound, the
/// two halves it allows stay with the recurrence, and a scalar gate alone stays inside at any cut.
/// The drift grows with the number of segments (4: 2.05e-3, 8: 2.51e-3, 16: 2.71e-3, 32: 2.80e-3
/// at 8192 to 32768 tokens), while the bound grows with the sequence (1.29e-3 at 8192 tokens,
/// 2.65e-3 at 32768): segments of 256 chunks give three segments only from 49152 tokens on.
#[test]
fn short_cuts_of_a_per_key_gate_drift_past_the_bound() {
    use kda::model::{Gates, ModelShape};
    use kda::precision::bound_for;
    let plan = Plan::from_lengths(&[8192]);
    let kda_p: kda::model::ModelProblem = inputs::random_problem(plan.clone(), 1, true, 7).into();
    let gdn_shape = ModelShape { gates: Gates { g: true, gk: false }, ..kda_p.shape };
    let gdn_p = inputs::try_random_model_problem(plan.clone(), gdn_shape, true, 7).unwrap();
    for (p, drifts) in [(&kda_p, true), (&gdn_p, false)] {
        let want = reference::model_reference(&p.view()).unwrap();
        let floor = reference::model_reference_f32(&p.view()).unwrap().errors(&want);
        // The bound every check of the recurrence applies (as `xtask ab` and the GPU suite).
        let bound = |f: f64| bound_for(p.shape.gates.g || p.shape.gates.gk, p.shape.key_dim, f);
        let work =
            Work { value_heads: 1, key_dim: 128, value_dim: 128, workers: 132, block_width: 64, gates: p.shape.gates };
        for chunks in [16, 64] {
            let split = SplitPlan::decide(&plan, &work, SplitMode::Chunks(chunks));
            let errs = split_reference(&p.view(), &split).unwrap().errors(&want);
            let within = errs.iter().zip(&floor).all(|(e, f)| *e < bound(*f));
            println!(
                "{:?} every {chunks} chunks ({} segments): h {:.2e} against {:.2e}",
                p.shape.gates,
                split.segments().len(),
                errs[0],
                bound(floor[0])
            );
            assert_eq!(
                split.keeps_precision(&work),
                within,
                "{:?} every {chunks} chunks: {errs:?}, floor {floor:?}",
                p.shape.gates
            );
            if chunks == 16 {
                assert_eq!(within, !drifts, "{:?}", p.shape.gates);
            }
        }
    }
}
