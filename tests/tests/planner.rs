//! Planner invariants on ragged layouts (proptest): offsets are prefix sums, `cu_seqlens` round
//! trips, the device descriptor table matches, dense batches are equal-length ragged batches, and
//! every malformed boundary list is rejected with the offending index.

use kda::layout::{CHUNK, DESC_CHUNK_START, DESC_LEN, DESC_SEQ, DESC_TOKEN_START, SEQ_DESC_WORDS};
use kda::schedule::Schedule;
use kda::{KdaError, Plan};
use kda_tests::ragged_lengths;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn offsets_are_prefix_sums(lengths in ragged_lengths()) {
        let plan = Plan::from_lengths(&lengths);
        let (mut token, mut chunk) = (0, 0);
        prop_assert_eq!(plan.num_seqs(), lengths.len());
        for (s, &len) in plan.seqs().iter().zip(&lengths) {
            prop_assert_eq!((s.token_start, s.len, s.chunk_start), (token, len, chunk));
            prop_assert_eq!(s.chunks(), len.div_ceil(CHUNK));
            prop_assert!(s.chunks() * CHUNK >= len && s.chunks() * CHUNK < len + CHUNK);
            token += len;
            chunk += s.chunks();
        }
        prop_assert_eq!((plan.tokens(), plan.chunks()), (token, chunk));
        prop_assert_eq!(plan.lengths(), lengths);
    }

    #[test]
    fn cu_seqlens_round_trip_in_i32_and_i64(lengths in ragged_lengths()) {
        let plan = Plan::from_lengths(&lengths);
        let cu = plan.cu_seqlens();
        prop_assert_eq!(cu.len(), lengths.len() + 1);
        prop_assert_eq!(Plan::from_cu_seqlens(&cu).unwrap(), plan.clone());
        let cu32: Vec<i32> = cu.iter().map(|&c| c as i32).collect();
        prop_assert_eq!(Plan::from_cu_seqlens(&cu32).unwrap(), plan);
    }

    #[test]
    fn descriptors_are_the_device_view_of_the_plan(lengths in ragged_lengths()) {
        let plan = Plan::from_lengths(&lengths);
        let table = plan.descriptors();
        prop_assert_eq!(table.len(), plan.num_seqs() * SEQ_DESC_WORDS);
        let mut seen = vec![false; plan.num_seqs()];
        let mut previous_len = i64::MAX;
        for d in table.chunks_exact(SEQ_DESC_WORDS) {
            let s = &plan.seqs()[d[DESC_SEQ] as usize];
            prop_assert!(!std::mem::replace(&mut seen[d[DESC_SEQ] as usize], true), "sequence {} twice", d[DESC_SEQ]);
            prop_assert_eq!(d[DESC_TOKEN_START], s.token_start as i64);
            prop_assert_eq!(d[DESC_LEN], s.len as i64);
            prop_assert_eq!(d[DESC_CHUNK_START], s.chunk_start as i64);
            prop_assert!(d[DESC_LEN] <= previous_len, "longest first");
            previous_len = d[DESC_LEN];
        }
    }

    #[test]
    fn dense_is_equal_length_ragged(batch in 0usize..6, len in 0usize..300) {
        prop_assert_eq!(Plan::dense(batch, len), Plan::from_lengths(&vec![len; batch]));
    }

    #[test]
    fn a_decreasing_boundary_is_rejected_at_its_index(
        lengths in ragged_lengths(),
        at in any::<prop::sample::Index>(),
        by in 1i64..50,
    ) {
        let mut cu = Plan::from_lengths(&lengths).cu_seqlens();
        let i = 1 + at.index(cu.len() - 1);
        cu[i] = cu[i - 1] - by;
        let err = Plan::from_cu_seqlens(&cu).unwrap_err();
        prop_assert!(matches!(err, KdaError::CuSeqlens { index, .. } if index == i), "{}", err);
    }

    #[test]
    fn a_nonzero_start_is_rejected(lengths in ragged_lengths(), start in 1i64..1000) {
        let mut cu = Plan::from_lengths(&lengths).cu_seqlens();
        cu[0] = start;
        let err = Plan::from_cu_seqlens(&cu).unwrap_err();
        prop_assert!(matches!(err, KdaError::CuSeqlens { index: 0, .. }), "{}", err);
    }
}

#[test]
fn an_empty_boundary_list_is_rejected_and_a_lone_zero_is_an_empty_batch() {
    assert!(matches!(Plan::from_cu_seqlens::<i64>(&[]), Err(KdaError::CuSeqlens { index: 0, .. })));
    let empty = Plan::from_cu_seqlens(&[0i32]).unwrap();
    assert_eq!((empty.num_seqs(), empty.tokens(), empty.chunks()), (0, 0, 0));
}

/// Checks the schedule's contract for one batch layout of `heads` value heads, `group` of them per
/// key head, `COL_BLOCKS` column blocks per head (`V / BV`); returns the modelled makespan and its
/// lower bound `max(total / workers, longest item)`.
fn check_schedule<const COL_BLOCKS: usize>(
    lengths: &[usize],
    heads: usize,
    group: usize,
    workers: usize,
) -> Result<(u64, u64), TestCaseError> {
    use kda::schedule::item_cost;
    let plan = Plan::from_lengths(lengths);
    let s = Schedule::try_lpt(&plan, heads, COL_BLOCKS, workers).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let count = lengths.len() * heads * COL_BLOCKS;
    prop_assert_eq!(s.workers(), workers.min(count));
    let cost = |item: u32| item_cost(lengths[item as usize / (heads * COL_BLOCKS)]);
    // Every (sequence, head, block) item exactly once. An item is never split: its chunks run in
    // order on one CTA.
    let mut seen = vec![0u32; count];
    for w in 0..s.workers() {
        let list = s.items_of(w);
        prop_assert!(!list.is_empty(), "worker {} has no items", w);
        for &i in list {
            seen[i as usize] += 1;
        }
        // Each worker runs its items longest first.
        prop_assert!(list.windows(2).all(|p| cost(p[0]) >= cost(p[1])), "worker {}: {:?}", w, list);
    }
    prop_assert!(seen.iter().all(|&n| n == 1), "items not scheduled exactly once");
    // The table the kernel reads: walking the records from record `w` gives worker `w`'s items
    // in order, each with its sequence's offsets, and reaches every record exactly once.
    use kda::layout::{
        ITEM_CHUNK_START, ITEM_H0_ROW, ITEM_HEAD, ITEM_HT_ROW, ITEM_KEY_HEAD, ITEM_LAST, ITEM_LEN, ITEM_NEXT,
        ITEM_TOKEN_START, ITEM_U_COL, ITEM_VCOL0, ITEM_WORDS,
    };
    let table = s.table(&plan, group).expect("small offsets fit the records");
    prop_assert_eq!(table.len(), count * ITEM_WORDS);
    let mut visited = vec![0u32; count];
    for w in 0..s.workers() {
        let mut r = w as u32;
        for &item in s.items_of(w) {
            prop_assert!(r != ITEM_LAST, "worker {}'s records end early", w);
            visited[r as usize] += 1;
            let rec = &table[r as usize * ITEM_WORDS..][..ITEM_WORDS];
            let item = item as usize;
            let (seq, head, block) = (item / (heads * COL_BLOCKS), (item / COL_BLOCKS) % heads, item % COL_BLOCKS);
            let d = &plan.seqs()[seq];
            let col = block * kda::layout::hopper::BV;
            let want = [
                seq * heads + head,
                seq * heads + head,
                head,
                col,
                col,
                d.token_start,
                d.len,
                d.chunk_start,
                head / group,
            ];
            let got = [
                ITEM_H0_ROW,
                ITEM_HT_ROW,
                ITEM_HEAD,
                ITEM_VCOL0,
                ITEM_U_COL,
                ITEM_TOKEN_START,
                ITEM_LEN,
                ITEM_CHUNK_START,
                ITEM_KEY_HEAD,
            ]
            .map(|i| rec[i] as usize);
            prop_assert_eq!(got, want, "worker {}, item {}", w, item);
            r = rec[ITEM_NEXT];
        }
        prop_assert_eq!(r, ITEM_LAST, "worker {}'s records run past its items", w);
    }
    prop_assert!(visited.iter().all(|&n| n == 1), "records not reached exactly once: {:?}", visited);
    // Greedy list scheduling's bound: within one longest item of a perfect split.
    let total: u64 = (0..count as u32).map(cost).sum();
    let longest = (0..count as u32).map(cost).max().unwrap_or(0);
    let makespan = s.makespan(cost);
    let w = s.workers().max(1) as u64;
    prop_assert!(makespan <= total.div_ceil(w) + longest, "makespan {} > {} / {} + {}", makespan, total, w, longest);
    Ok((makespan, total.div_ceil(w).max(longest)))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn schedule_runs_every_item_once_within_the_list_scheduling_bound(
        lengths in ragged_lengths(),
        key_heads in 1usize..4,
        group in 1usize..4,
        workers in 1usize..140,
        value_blocks in 0usize..3,
    ) {
        // V = 64, 128 or 512.
        let check = [check_schedule::<1>, check_schedule::<2>, check_schedule::<8>][value_blocks];
        check(&lengths, key_heads * group, group, workers)?;
    }
}

/// On the benchmark's ragged shapes with the H200's 132 SMs, the modelled makespan is within 5%
/// of its lower bound (LPT leaves nearly no idle tail).
#[test]
fn schedule_of_the_bench_shapes_is_near_ideal() {
    const H200_SMS: usize = 132;
    for (name, lengths) in kda_cli::bench_shapes() {
        let (makespan, bound) = check_schedule::<{ kda::layout::V_DIM / kda::layout::hopper::BV }>(
            &lengths,
            kda::inputs::REFERENCE_HEADS,
            1,
            H200_SMS,
        )
        .unwrap();
        let ratio = makespan as f64 / bound as f64;
        println!("{name}: modelled makespan {makespan}, lower bound {bound} ({ratio:.3})");
        assert!(ratio <= 1.05, "{name}: makespan {makespan} is {ratio:.3} x its lower bound {bound}");
    }
}

/// 100,000 sequences of 1 to 8 tokens in one batch (more than a grid dimension's 65,535, a bug
/// class of other implementations): the plan, the schedule over the H200's workers and its
/// record table cover every item once, with every offset in range.
#[test]
fn a_hundred_thousand_short_sequences_are_planned_and_scheduled() {
    const SEQS: usize = 100_000;
    const H200_SMS: usize = 132;
    let lengths: Vec<usize> =
        kda::inputs::random_words(0x100_000, 0).take(SEQS).map(|x| 1 + (x % 8) as usize).collect();
    let (makespan, bound) = check_schedule::<2>(&lengths, 2, 1, H200_SMS).unwrap();
    println!("{SEQS} sequences x 2 heads x 2 blocks: modelled makespan {makespan}, lower bound {bound}");
    let plan = Plan::from_lengths(&lengths);
    assert_eq!((plan.num_seqs(), plan.chunks()), (SEQS, SEQS));
    assert!(makespan <= bound + kda::schedule::item_cost(8));
}

/// A batch whose `k` has more than 2^31 elements (T = 300,000 tokens, H = 64) and whose `h` passes
/// 2^32 bytes: the sizes are counted without overflow, and the schedule's 32-bit records hold
/// every item's offsets.
#[test]
fn a_batch_past_two_to_the_31_elements_is_sized_and_scheduled() {
    let lengths = [150_000, 100_000, 50_000];
    let plan = Plan::from_lengths(&lengths);
    let d = kda::Dims::new(&plan, 64);
    assert!(d.key_len() > 1 << 31 && d.h_len() * 2 > 1 << 32, "{} {}", d.key_len(), d.h_len());
    d.check().unwrap();
    let s = Schedule::try_lpt(&plan, 64, 2, 132).unwrap();
    let table = s.table(&plan, 1).expect("offsets fit the 32-bit records");
    assert_eq!(table.len(), 3 * 64 * 2 * kda::layout::ITEM_WORDS);
    check_schedule::<2>(&lengths, 64, 1, 132).unwrap();
}

/// The portable kernel's persistent grid: as many CTAs per SM as its shared memory and registers
/// allow on each GPU family it serves (one group: two on the H100 / H200's 228 KB per SM at
/// K <= 128 and on an A100's 164 KB at K = 64, one on an RTX's 100 KB, one at K = 256
/// everywhere; two groups: one per SM), never none.
#[test]
fn the_portable_grid_fills_each_gpu_it_serves() {
    use kda::layout::portable::{RESERVED_SMEM_PER_CTA, VARIANTS, smem_bytes, workers};
    let kb = 1024;
    for (sms, smem_per_sm, per_sm) in
        [(132, 228 * kb, [2, 2, 1, 1, 1]), (108, 164 * kb, [2, 1, 1, 1, 1]), (84, 100 * kb, [1, 1, 1, 1, 1])]
    {
        for ((key_dim, groups), want) in VARIANTS.into_iter().zip(per_sm) {
            let what = format!("K = {key_dim}, {groups} groups, {smem_per_sm} B per SM");
            assert_eq!(workers(key_dim, groups, sms, smem_per_sm), sms * want, "{what}");
            if groups == 1 || smem_per_sm >= 164 * kb {
                assert!(want * (smem_bytes(key_dim, groups) + RESERVED_SMEM_PER_CTA) <= smem_per_sm, "{what}");
            }
        }
    }
    // A GPU whose shared memory holds less than one CTA still gets one worker per SM: the launch
    // then fails with the driver's error, not an empty grid.
    assert_eq!(workers(128, 1, 10, 16 * kb), 10);
}
