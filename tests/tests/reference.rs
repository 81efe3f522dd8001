//! The f64 reference on the CPU: it reproduces the golden fixtures, agrees with an independent
//! element-by-element transcription of the recurrence (docs/CONTRACT.md#the-recurrence), and
//! handles ragged batches, tails and empty sequences the way the contract says
//! (docs/CONTRACT.md#ragged-batches-tails-and-empty-sequences; proptest).

use half::bf16;
use kda::layout::{CHUNK, K_DIM, V_DIM};
use kda::{Outputs, Plan, Problem, inputs, io, reference};
use kda_tests::{FIXTURES, assert_close, fixture, ragged_lengths};
use proptest::prelude::*;

#[test]
fn reproduces_the_golden_fixtures() {
    for name in FIXTURES {
        let (p, golden) = io::read_problem(&fixture(name)).unwrap();
        let golden = golden.expect("fixtures hold outputs");
        let errs = reference::reference(&p).unwrap().errors(&golden);
        println!("{name}: rel err h {:.2e}  v_new {:.2e}  ht {:.2e}", errs[0], errs[1], errs[2]);
        assert_close(name, errs);
    }
}

#[test]
fn fixtures_have_the_layouts_their_readme_lists() {
    let expect: [(&str, &[usize], usize, bool); 3] = [
        ("tail_h2", &[200], 2, true),
        ("ragged_h3", &[1, 64, 0, 130], 3, true),
        ("two_seq_no_h0", &[65, 127], 1, false),
    ];
    for (name, lengths, heads, h0) in expect {
        let (p, _) = io::read_problem(&fixture(name)).unwrap();
        assert_eq!((p.plan.lengths(), p.heads, p.h0.is_some()), (lengths.to_vec(), heads, h0), "{name}");
    }
}

/// The problem of sequence `n` of `p` alone.
fn sub_problem(p: &Problem, n: usize) -> Problem {
    let s = p.plan.seqs()[n];
    let rows = |x_row: usize| s.token_start * x_row..(s.token_start + s.len) * x_row;
    let (kr, vr) = (rows(p.heads * K_DIM), rows(p.heads * V_DIM));
    let state = p.heads * K_DIM * V_DIM;
    Problem {
        plan: Plan::from_lengths(&[s.len]),
        heads: p.heads,
        value_heads: p.value_heads,
        k: p.k[kr.clone()].to_vec(),
        w: p.w[kr.clone()].to_vec(),
        u: p.u[vr].to_vec(),
        gk: p.gk[kr].to_vec(),
        h0: p.h0.as_ref().map(|h0| h0[n * state..(n + 1) * state].to_vec()),
    }
}

/// The contract's recurrence (docs/CONTRACT.md#the-recurrence) written out element by element with
/// explicit index arithmetic, in f64, independently of `kda::reference` (which works on per-item
/// slices in parallel).
#[expect(clippy::needless_range_loop, reason = "the transcription indexes as the contract's formulas do")]
fn literal(p: &Problem) -> Outputs {
    let d = p.dims();
    let hh = p.heads;
    let at_k = |t: usize, h: usize, i: usize| (t * hh + h) * K_DIM + i;
    let at_v = |t: usize, h: usize, j: usize| (t * hh + h) * V_DIM + j;
    let at_s = |n: usize, h: usize, i: usize, j: usize| ((n * hh + h) * K_DIM + i) * V_DIM + j;
    let f = |x: bf16| f64::from(x);
    let round = |x: f64| f64::from(bf16::from_f32(x as f32));
    let mut out = Outputs {
        h: vec![bf16::ZERO; d.h_len()],
        v_new: vec![bf16::ZERO; d.value_len()],
        ht: vec![0.0; d.state_len()],
    };
    for (n, seq) in p.plan.seqs().iter().enumerate() {
        for h in 0..hh {
            let mut s = vec![vec![0.0f64; V_DIM]; K_DIM];
            if let Some(h0) = &p.h0 {
                for i in 0..K_DIM {
                    for j in 0..V_DIM {
                        s[i][j] = h0[at_s(n, h, i, j)] as f64;
                    }
                }
            }
            let mut c = 0;
            let mut t0 = seq.token_start;
            while t0 < seq.token_start + seq.len {
                let t1 = (t0 + CHUNK).min(seq.token_start + seq.len);
                let sb: Vec<Vec<f64>> = s.iter().map(|r| r.iter().map(|&x| round(x)).collect()).collect();
                for i in 0..K_DIM {
                    for j in 0..V_DIM {
                        out.h[at_s(seq.chunk_start + c, h, i, j)] = bf16::from_f64(sb[i][j]);
                    }
                }
                let mut vn = vec![vec![0.0f64; V_DIM]; t1 - t0];
                for t in t0..t1 {
                    for j in 0..V_DIM {
                        let ws: f64 = (0..K_DIM).map(|i| f(p.w[at_k(t, h, i)]) * sb[i][j]).sum();
                        let v = round(f(p.u[at_v(t, h, j)]) - ws);
                        vn[t - t0][j] = v;
                        out.v_new[at_v(t, h, j)] = bf16::from_f64(v);
                    }
                }
                for i in 0..K_DIM {
                    let decay = (p.gk[at_k(t1 - 1, h, i)] as f64).exp2();
                    for j in 0..V_DIM {
                        // k^T Vn accumulated onto the decayed state token by token, the order of
                        // the reference and of the kernels' accumulators (f64 addition is not
                        // associative: summing k^T Vn apart first differs in the last bit).
                        s[i][j] = (t0..t1).fold(decay * s[i][j], |acc, t| acc + f(p.k[at_k(t, h, i)]) * vn[t - t0][j]);
                    }
                }
                t0 = t1;
                c += 1;
            }
            for i in 0..K_DIM {
                for j in 0..V_DIM {
                    out.ht[at_s(n, h, i, j)] = s[i][j] as f32;
                }
            }
        }
    }
    out
}

/// Sequence `n`'s slice of each output of a batch.
fn seq_outputs(p: &Problem, out: &Outputs, n: usize) -> Outputs {
    let s = p.plan.seqs()[n];
    let state = p.heads * K_DIM * V_DIM;
    let vrow = p.heads * V_DIM;
    Outputs {
        h: out.h[s.chunk_start * state..(s.chunk_start + s.chunks()) * state].to_vec(),
        v_new: out.v_new[s.token_start * vrow..(s.token_start + s.len) * vrow].to_vec(),
        ht: out.ht[n * state..(n + 1) * state].to_vec(),
    }
}

/// `p` (one sequence) with its partial last chunk filled up to a whole chunk by tokens that cannot
/// change anything: zero `k` and `w`, arbitrary `u`, and the last valid row's cumulative gate.
fn pad_tail(p: &Problem) -> Problem {
    let len = p.plan.tokens();
    let pad = len.next_multiple_of(CHUNK) - len;
    let mut q = p.clone();
    q.plan = Plan::from_lengths(&[len + pad]);
    let krow = p.heads * K_DIM;
    let last_gk = p.gk[(len - 1) * krow..len * krow].to_vec();
    for t in 0..pad {
        q.k.extend(std::iter::repeat_n(bf16::ZERO, krow));
        q.w.extend(std::iter::repeat_n(bf16::ZERO, krow));
        q.u.extend((0..p.heads * V_DIM).map(|j| bf16::from_f32(((t * 7 + j) % 13) as f32 - 6.0)));
        q.gk.extend_from_slice(&last_gk);
    }
    q
}

#[test]
fn agrees_with_the_literal_transcription_on_fixed_layouts() {
    // The last case once differed in the last bit of an f64 sum (the two summed `k^T Vn` in
    // different orders).
    let cases = [
        (vec![200], 2, true, 31),
        (vec![1, 64, 0, 130], 3, true, 31),
        (vec![65, 63], 1, false, 31),
        (vec![76], 1, true, 13104506926376094667),
    ];
    for (lengths, heads, h0, seed) in cases {
        let p = inputs::random_problem(Plan::from_lengths(&lengths), heads, h0, seed);
        assert_eq!(reference::reference(&p).unwrap(), literal(&p), "{lengths:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    /// Each sequence's outputs depend on its own tokens only: the batch result is the
    /// concatenation of the single-sequence results, bit for bit.
    #[test]
    fn a_batch_is_its_sequences_side_by_side(
        lengths in ragged_lengths(),
        heads in 1usize..=2,
        with_h0: bool,
        seed: u64,
    ) {
        let p = inputs::random_problem(Plan::from_lengths(&lengths), heads, with_h0, seed);
        let out = reference::reference(&p).unwrap();
        for n in 0..p.plan.num_seqs() {
            let alone = reference::reference(&sub_problem(&p, n)).unwrap();
            prop_assert_eq!(seq_outputs(&p, &out, n), alone, "sequence {} of {:?}", n, lengths);
        }
    }

    /// A partial last chunk behaves exactly like a whole chunk whose extra rows carry no key, no
    /// weight and no extra decay.
    #[test]
    fn a_tail_equals_its_neutral_padding(len in 1usize..=260, heads in 1usize..=2, with_h0: bool, seed: u64) {
        prop_assume!(len % CHUNK != 0);
        let p = inputs::random_problem(Plan::from_lengths(&[len]), heads, with_h0, seed);
        let out = reference::reference(&p).unwrap();
        let padded = reference::reference(&pad_tail(&p)).unwrap();
        prop_assert_eq!(&out.h, &padded.h);
        prop_assert_eq!(&out.ht, &padded.ht);
        prop_assert_eq!(&out.v_new[..], &padded.v_new[..out.v_new.len()]);
    }

    /// Empty sequences pass their initial state through unchanged and own no chunk of `h`.
    #[test]
    fn empty_sequences_keep_h0(lengths in ragged_lengths(), seed: u64) {
        let p = inputs::random_problem(Plan::from_lengths(&lengths), 1, true, seed);
        let out = reference::reference(&p).unwrap();
        let h0 = p.h0.as_ref().unwrap();
        for (n, s) in p.plan.seqs().iter().enumerate() {
            let state = seq_outputs(&p, &out, n);
            if s.len == 0 {
                prop_assert!(state.h.is_empty());
                prop_assert_eq!(&state.ht[..], &h0[n * K_DIM * V_DIM..(n + 1) * K_DIM * V_DIM]);
            } else {
                let initial = &h0[n * K_DIM * V_DIM..(n + 1) * K_DIM * V_DIM];
                let first: Vec<bf16> = initial.iter().map(|&x| bf16::from_f32(x)).collect();
                prop_assert_eq!(&state.h[..K_DIM * V_DIM], &first[..], "h of the first chunk is bf16(h0)");
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, failure_persistence: None, ..ProptestConfig::default() })]

    /// The parallel reference and the literal transcription agree bit for bit on random layouts.
    #[test]
    fn agrees_with_the_literal_transcription(
        lengths in prop::collection::vec(0usize..=140, 1..4),
        heads in 1usize..=2,
        with_h0: bool,
        seed: u64,
    ) {
        let p = inputs::random_problem(Plan::from_lengths(&lengths), heads, with_h0, seed);
        prop_assert_eq!(reference::reference(&p).unwrap(), literal(&p));
    }
}
