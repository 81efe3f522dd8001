//! Trust under stress: the same inputs give the same bits (100 runs, two streams at once, several
//! host threads; every recurrence kernel, the layer, the decode step and verify), a non-finite input stays in its sequence, 100,000 sequences in one batch (past
//! a grid dimension's 65,535), and tensors past 2^31 elements with offsets past 2^32 bytes.
//! Sampled (sequence, head) pairs are held to the f64 reference as one-head problems.

use kda::columns::{ColumnMode, Columns};
use kda::layer::{GateInput, LayerKind, LayerOptions, LayerShape};
use kda::model::{Gates, ModelShape};
use kda::split::SplitMode;
use kda::{Kernel, Outputs, Plan, Problem, Strides, inputs, precision, reference};
use kda_cli::{DeviceLayer, DeviceProblem};
use kda_tests::{Gpu, run_guarded};
use std::sync::Arc;

/// Launches per variant in the determinism test.
const RUNS: usize = 100;

/// One way to run the recurrence: a kernel, a batch, a split and column mode.
struct Variant {
    name: &'static str,
    shape: ModelShape,
    lengths: Vec<usize>,
    kernel: Kernel,
    split: SplitMode,
    columns: ColumnMode,
}

fn variants() -> Vec<Variant> {
    let kda = |h| ModelShape::kda(h);
    let gdn = ModelShape { value_heads: 4, gates: Gates { g: true, gk: false }, ..ModelShape::kda(2) };
    let ragged = vec![3000, 65, 0, 700, 1];
    let v = |name, shape, lengths: &[usize], kernel, split, columns| Variant {
        name,
        shape,
        lengths: lengths.to_vec(),
        kernel,
        split,
        columns,
    };
    vec![
        v("hopper, wide blocks", kda(8), &ragged, Kernel::Auto, SplitMode::Off, ColumnMode::Force(Columns::Wide)),
        v("hopper, narrow blocks", kda(8), &ragged, Kernel::Auto, SplitMode::Off, ColumnMode::Force(Columns::Narrow)),
        v("hopper, split", kda(2), &[20000, 300], Kernel::Auto, SplitMode::Chunks(16), ColumnMode::Auto),
        v("hopper, gated deltanet", gdn, &ragged, Kernel::Auto, SplitMode::Off, ColumnMode::Auto),
        v("baseline", kda(4), &ragged, Kernel::Baseline, SplitMode::Off, ColumnMode::Auto),
        v("portable", kda(4), &ragged, Kernel::Portable, SplitMode::Off, ColumnMode::Auto),
    ]
}

impl Variant {
    fn problem(&self, seed: u64) -> kda::model::ModelProblem {
        inputs::try_random_model_problem(Plan::from_lengths(&self.lengths), self.shape, true, seed).unwrap()
    }

    fn upload(&self, p: &kda::model::ModelProblem, stream: &Arc<cudarc::driver::CudaStream>) -> DeviceProblem {
        let mut dev = DeviceProblem::upload_model(stream, &p.view(), Strides::PACKED).unwrap();
        dev.set_split(stream, self.split).unwrap();
        dev.set_columns(stream, self.columns).unwrap();
        dev
    }
}

/// Poisons, launches and downloads (synchronising the stream).
fn run_once(gpu: &Gpu, dev: &mut DeviceProblem, stream: &Arc<cudarc::driver::CudaStream>, kernel: Kernel) -> Outputs {
    dev.poison_outputs(stream).unwrap();
    dev.launch(&gpu.kda, stream, kernel).unwrap();
    dev.download(stream).unwrap()
}

/// Every recurrence variant and the layer give bitwise-identical outputs over 100 runs, and on
/// two streams running at the same time.
#[test]
fn every_kernel_is_deterministic_over_runs_and_streams() {
    let gpu = Gpu::open();
    let ctx = gpu.kda.context().clone();
    let (s1, s2) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    for v in variants() {
        let p = v.problem(11);
        let (mut a, mut b) = (v.upload(&p, &s1), v.upload(&p, &s2));
        let first = run_once(&gpu, &mut a, &s1, v.kernel);
        assert!(first.errors(&reference::model_reference(&p.view()).unwrap()).iter().all(|&e| e < 1e-2), "{}", v.name);
        for run in 1..RUNS {
            assert!(run_once(&gpu, &mut a, &s1, v.kernel) == first, "{}: run {run} gave other bits", v.name);
        }
        // Both streams launched before either is waited for.
        a.poison_outputs(&s1).unwrap();
        b.poison_outputs(&s2).unwrap();
        a.launch(&gpu.kda, &s1, v.kernel).unwrap();
        b.launch(&gpu.kda, &s2, v.kernel).unwrap();
        assert!(a.download(&s1).unwrap() == first, "{}: stream 1 beside stream 2", v.name);
        assert!(b.download(&s2).unwrap() == first, "{}: stream 2 beside stream 1", v.name);
        println!("{}: {RUNS} runs and two concurrent streams, bitwise identical", v.name);
    }
    let shape = LayerShape { kind: LayerKind::Kda, heads: 4, value_heads: 4, key_dim: 128, value_dim: 128 };
    let options = LayerOptions {
        scale: 128f64.powf(-0.5),
        l2norm_qk: true,
        beta_sigmoid: true,
        gate: GateInput::LowerBound(-5.0),
    };
    let layer = inputs::random_layer_problem(&[700, 64, 33, 0], shape, options, true, 12);
    let (mut a, mut b) =
        (DeviceLayer::upload(&gpu.kda, &s1, &layer).unwrap(), DeviceLayer::upload(&gpu.kda, &s2, &layer).unwrap());
    a.launch(&gpu.kda, &s1).unwrap();
    let first = a.download(&s1).unwrap();
    for run in 1..RUNS {
        a.launch(&gpu.kda, &s1).unwrap();
        assert!(a.download(&s1).unwrap() == first, "layer: run {run} gave other bits");
    }
    a.launch(&gpu.kda, &s1).unwrap();
    b.launch(&gpu.kda, &s2).unwrap();
    assert!(a.download(&s1).unwrap() == first && b.download(&s2).unwrap() == first, "layer on two streams");
    println!("layer: {RUNS} runs and two concurrent streams, bitwise identical");
}

/// A decode plan and its device buffers on one stream: the token rows, the pool (updated in
/// place by each call), `o`.
struct DecodeRun {
    plan: kda::DecodePlan,
    inputs: kda_cli::decode::DeviceDecodeInputs,
    pool: cudarc::driver::CudaSlice<f32>,
    o: cudarc::driver::CudaSlice<kda::bf16>,
}

impl DecodeRun {
    fn new(stream: &Arc<cudarc::driver::CudaStream>, c: &DecodeCall) -> Self {
        let p = &c.p;
        let plan = match (c.draft, &c.tree) {
            (1, None) => kda::DecodePlan::new(stream, p.shape, p.options, c.pool_shape, &c.indices, &c.fresh),
            (draft, tree) => kda::DecodePlan::verify(
                stream,
                p.shape,
                p.options,
                c.pool_shape,
                &c.indices,
                &c.fresh,
                draft,
                tree.as_ref().map(|(parents, _)| &parents[..]),
                tree.as_ref().map(|(_, slots)| &slots[..]),
            ),
        }
        .unwrap();
        let inputs = kda_cli::decode::DeviceDecodeInputs::upload(stream, p).unwrap();
        let pool = stream.clone_htod(&c.pool).unwrap();
        let rows = p.plan.tokens() * p.shape.value_heads * p.shape.value_dim;
        let o = stream.alloc_zeros(rows).unwrap();
        Self { plan, inputs, pool, o }
    }

    /// Enqueues one call from the initial pool (copied in first: the call updates the pool in
    /// place) with `o` poisoned.
    fn launch(&mut self, gpu: &Gpu, stream: &Arc<cudarc::driver::CudaStream>, c: &DecodeCall) {
        stream.memcpy_htod(&c.pool, &mut self.pool).unwrap();
        stream.memcpy_htod(&vec![kda::bf16::from_bits(kda_tests::POISON_BF16); self.o.len()], &mut self.o).unwrap();
        let inputs = self.inputs.inputs();
        gpu.kda
            .launch_decode(stream, &self.plan, &inputs, &mut self.pool.slice_mut(..), &mut self.o.slice_mut(..))
            .unwrap();
    }

    /// The pool and `o` after the last call, as bits (synchronising the stream).
    fn download(&self, stream: &Arc<cudarc::driver::CudaStream>) -> (Vec<u32>, Vec<u16>) {
        let pool = stream.clone_dtoh(&self.pool).unwrap().iter().map(|x| x.to_bits()).collect();
        (pool, stream.clone_dtoh(&self.o).unwrap().iter().map(|x| x.to_bits()).collect())
    }
}

/// One decode or verify call: the tokens, the pool before it, the slots, and for verify the
/// draft length with each token's parent and slot.
struct DecodeCall {
    name: String,
    p: kda::layer::LayerProblem,
    pool_shape: kda::pool::PoolShape,
    pool: Vec<f32>,
    indices: Vec<i64>,
    fresh: Vec<bool>,
    draft: usize,
    tree: Option<(Vec<i64>, Vec<i64>)>,
}

/// The decode step (six sequences, a padding one and a fresh one, an f32 pool) and speculative
/// verify (a chain of four draft tokens per sequence, each token's state into a slot of its
/// own) give bitwise-identical pools and outputs over 100 calls, each from the same initial pool,
/// and on two streams running at the same time.
#[test]
fn decode_and_verify_are_deterministic_over_runs_and_streams() {
    let gpu = Gpu::open();
    let ctx = gpu.kda.context().clone();
    let (s1, s2) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let d = kda_tests::decode_cases().swap_remove(0);
    let v = kda_tests::verify_cases().swap_remove(0);
    assert_eq!(v.draft, 4, "the verify case drafts four tokens");
    let calls = [
        DecodeCall {
            name: format!("decode {}", d.name),
            p: d.p,
            pool_shape: d.pool_shape,
            pool: d.pool,
            indices: d.indices,
            fresh: d.fresh,
            draft: 1,
            tree: None,
        },
        DecodeCall {
            name: format!("verify {}", v.name),
            p: v.p,
            pool_shape: v.pool_shape,
            pool: v.pool,
            indices: v.indices,
            fresh: v.fresh,
            draft: v.draft,
            tree: Some((v.parents, v.token_slots)),
        },
    ];
    for c in &calls {
        let (mut a, mut b) = (DecodeRun::new(&s1, c), DecodeRun::new(&s2, c));
        a.launch(&gpu, &s1, c);
        let first = a.download(&s1);
        assert!(first.1.iter().any(|&x| x != kda_tests::POISON_BF16), "{}: no output written", c.name);
        assert!(first.0.iter().zip(&c.pool).any(|(x, p)| *x != p.to_bits()), "{}: the pool is unchanged", c.name);
        for run in 1..RUNS {
            a.launch(&gpu, &s1, c);
            assert!(a.download(&s1) == first, "{}: run {run} gave other bits", c.name);
        }
        // Both streams launched before either is waited for.
        a.launch(&gpu, &s1, c);
        b.launch(&gpu, &s2, c);
        assert!(a.download(&s1) == first, "{}: stream 1 beside stream 2", c.name);
        assert!(b.download(&s2) == first, "{}: stream 2 beside stream 1", c.name);
        println!("{}: {RUNS} calls and two concurrent streams, bitwise identical", c.name);
    }
}

/// Four host threads share one `Kda`, each launching its own problems on its own stream at the
/// same time; each result equals the same problem run alone.
#[test]
fn launches_from_several_threads_at_once() {
    const THREADS: u64 = 4;
    const LAUNCHES: usize = 10;
    let gpu = Gpu::open();
    let variants = variants();
    let alone: Vec<Outputs> = (0..THREADS)
        .map(|t| {
            let v = &variants[t as usize % variants.len()];
            let p = v.problem(100 + t);
            run_once(&gpu, &mut v.upload(&p, &gpu.stream), &gpu.stream, v.kernel)
        })
        .collect();
    std::thread::scope(|scope| {
        for (t, want) in alone.iter().enumerate() {
            let (gpu, v) = (&gpu, &variants[t % variants.len()]);
            scope.spawn(move || {
                let stream = gpu.kda.context().new_stream().unwrap();
                let p = v.problem(100 + t as u64);
                let mut dev = v.upload(&p, &stream);
                for launch in 0..LAUNCHES {
                    let got = run_once(gpu, &mut dev, &stream, v.kernel);
                    assert!(got == *want, "thread {t} ({}), launch {launch}: other bits than alone", v.name);
                }
            });
        }
    });
    println!("{THREADS} threads x {LAUNCHES} launches, each equal to its problem run alone");
}

/// A NaN or an infinity in one sequence's inputs (keys, values, gates, initial state) stays in
/// that sequence: every other sequence's outputs are bitwise those of the clean batch, and finite.
#[test]
fn non_finite_input_stays_in_its_sequence() {
    let gpu = Gpu::open();
    let heads = 4;
    let plan = Plan::from_lengths(&[200, 130, 64, 1, 77]);
    let clean = inputs::try_random_problem(plan.clone(), heads, true, 21).unwrap();
    let want = run_guarded(&gpu, &clean, Kernel::Auto);
    let row = |n: usize, token: usize, head: usize, width: usize| {
        let t = plan.seqs()[n].token_start + token;
        (t * heads + head) * width
    };
    type Corruption<'a> = Box<dyn Fn(&mut Problem) + 'a>;
    let cases: Vec<(&str, usize, Corruption<'_>)> = vec![
        ("NaN in k", 1, Box::new(|p: &mut Problem| p.k[row(1, 5, 2, 128) + 3] = kda::bf16::NAN)),
        ("inf in u", 0, Box::new(|p: &mut Problem| p.u[row(0, 199, 0, 128)] = kda::bf16::INFINITY)),
        ("-inf in gk", 2, Box::new(|p: &mut Problem| p.gk[row(2, 63, 3, 128) + 7] = f32::NEG_INFINITY)),
        ("NaN in h0", 3, Box::new(|p: &mut Problem| p.h0.as_mut().unwrap()[(3 * heads + 1) * 128 * 128] = f32::NAN)),
        ("inf in w", 4, Box::new(|p: &mut Problem| p.w[row(4, 0, 1, 128) + 100] = kda::bf16::INFINITY)),
    ];
    for (what, bad, corrupt) in cases {
        let mut p = clean.clone();
        corrupt(&mut p);
        let got = run_guarded(&gpu, &p, Kernel::Auto);
        for n in (0..plan.num_seqs()).filter(|&n| n != bad) {
            let (g, w) = (sequence_part(&got, &clean, n), sequence_part(&want, &clean, n));
            assert!(g == w, "{what} in sequence {bad}: sequence {n} changed");
            assert!(g.ht.iter().all(|x| x.is_finite()), "{what} in sequence {bad}: sequence {n} not finite");
        }
        let poisoned = sequence_part(&got, &clean, bad).ht.iter().any(|x| !x.is_finite());
        println!(
            "{what} in sequence {bad}: the other sequences unchanged (its own final state non-finite: {poisoned})"
        );
    }
}

/// The parts of `out` (of `p`) that sequence `n` owns, every head of it ([`select_outputs`]).
fn sequence_part(out: &Outputs, p: &Problem, n: usize) -> Outputs {
    select_outputs(out, p, &(0..p.heads).map(|i| (n, i)).collect::<Vec<_>>())
}

/// The one-head problems of `p`'s `(sequence, head)` pairs, in order: each pair's tokens and
/// initial state as a sequence of its own.
fn select(p: &Problem, pairs: &[(usize, usize)]) -> Problem {
    let (heads, state) = (p.heads, 128 * 128);
    let seqs = p.plan.seqs();
    let rows = |data: &[kda::bf16], n: usize, i: usize| -> Vec<kda::bf16> {
        let s = seqs[n];
        (s.token_start..s.token_start + s.len).flat_map(|t| data[(t * heads + i) * 128..][..128].to_vec()).collect()
    };
    let mut out = Problem {
        plan: Plan::from_lengths(&pairs.iter().map(|&(n, _)| seqs[n].len).collect::<Vec<_>>()),
        heads: 1,
        value_heads: 1,
        k: Vec::new(),
        w: Vec::new(),
        u: Vec::new(),
        gk: Vec::new(),
        h0: p.h0.as_ref().map(|_| Vec::new()),
    };
    for &(n, i) in pairs {
        out.k.extend(rows(&p.k, n, i));
        out.w.extend(rows(&p.w, n, i));
        out.u.extend(rows(&p.u, n, i));
        let s = seqs[n];
        out.gk
            .extend((s.token_start..s.token_start + s.len).flat_map(|t| p.gk[(t * heads + i) * 128..][..128].to_vec()));
        if let (Some(all), Some(h0)) = (&p.h0, &mut out.h0) {
            h0.extend_from_slice(&all[(n * heads + i) * state..][..state]);
        }
    }
    out
}

/// The parts of `out` (of `p`) that the pairs own, laid out as [`select`]'s problem's outputs.
fn select_outputs(out: &Outputs, p: &Problem, pairs: &[(usize, usize)]) -> Outputs {
    let (heads, state) = (p.heads, 128 * 128);
    let mut got = Outputs { h: Vec::new(), v_new: Vec::new(), ht: Vec::new() };
    for &(n, i) in pairs {
        let s = p.plan.seqs()[n];
        for c in s.chunk_start..s.chunk_start + s.chunks() {
            got.h.extend_from_slice(&out.h[(c * heads + i) * state..][..state]);
        }
        for t in s.token_start..s.token_start + s.len {
            got.v_new.extend_from_slice(&out.v_new[(t * heads + i) * 128..][..128]);
        }
        got.ht.extend_from_slice(&out.ht[(n * heads + i) * state..][..state]);
    }
    got
}

/// `out`'s sampled pairs against the f64 reference of their one-head problems, each output
/// within its precision bound given the f32 drift of that problem.
fn check_sampled(case: &str, out: &Outputs, p: &Problem, pairs: &[(usize, usize)]) {
    let sub = select(p, pairs);
    let (exact, f32_run) = (reference::reference(&sub).unwrap(), reference::reference_f32(&sub).unwrap());
    let got = select_outputs(out, p, pairs);
    let errs = got.errors(&exact);
    let floor = f32_run.errors(&exact);
    println!(
        "{case}: {} sampled pairs: rel err h {:.2e} v_new {:.2e} ht {:.2e}",
        pairs.len(),
        errs[0],
        errs[1],
        errs[2]
    );
    for (k, name) in ["h", "v_new", "ht"].iter().enumerate() {
        assert!(errs[k] < precision::bound(floor[k]), "{case}: {name} error {:.3e} over its bound", errs[k]);
    }
}

/// 100,000 sequences of 1 to 8 tokens in one batch: more than a grid dimension's 65,535, so any
/// per-sequence grid or 16-bit index breaks here. Sampled sequences (the first, the last, around
/// 65,536) against the reference; every output finite (the outputs start as NaN).
#[test]
fn a_hundred_thousand_short_sequences() {
    const SEQS: usize = 100_000;
    let gpu = Gpu::open();
    let mut words = inputs::random_words(31, 0);
    let lengths: Vec<usize> = (0..SEQS).map(|_| 1 + (words.next().unwrap() % 8) as usize).collect();
    let p = inputs::try_random_problem(Plan::from_lengths(&lengths), 1, true, 32).unwrap();
    let mut dev = DeviceProblem::upload(&gpu.stream, &p).unwrap();
    let out = run_once(&gpu, &mut dev, &gpu.stream, Kernel::Auto);
    assert!(out.ht.iter().all(|x| x.is_finite()) && out.v_new.iter().all(|x| x.is_finite()));
    let picks = [0, 1, 65_534, 65_535, 65_536, 65_537, 99_998, 99_999].into_iter().chain((0..SEQS).step_by(997));
    let pairs: Vec<(usize, usize)> = picks.map(|n| (n, 0)).collect();
    check_sampled("100,000 sequences", &out, &p, &pairs);
}

/// `k`, `w` and `u` past 2^31 elements (270,000 tokens x 64 heads x 128) and `h` past 2^32 bytes:
/// sampled (sequence, head) pairs, the last sequence's among them, against the reference.
#[test]
fn tensors_past_two_to_the_31_elements() {
    let gpu = Gpu::open();
    let heads = 64;
    let plan = Plan::from_lengths(&[131_072, 100_000, 38_928]);
    let elements = plan.tokens() * heads * 128;
    assert!(elements > 1 << 31, "{elements}");
    assert!(plan.chunks() * heads * 128 * 128 * 2 > 1 << 32, "h must pass 2^32 bytes");
    let p = inputs::try_random_problem(plan, heads, true, 41).unwrap();
    let mut dev = DeviceProblem::upload(&gpu.stream, &p).unwrap();
    let out = run_once(&gpu, &mut dev, &gpu.stream, Kernel::Auto);
    drop(dev);
    assert!(out.ht.iter().all(|x| x.is_finite()), "a final state not written or not finite");
    check_sampled("270,000 tokens x 64 heads", &out, &p, &[(0, 63), (1, 31), (2, 0), (2, 63)]);
    // The outputs start as NaN: finite means written, past 2^32 bytes of `h` too.
    assert!(out.h.iter().all(|x| x.is_finite()) && out.v_new.iter().all(|x| x.is_finite()));
    println!("k: {elements} elements; h: {} bytes, every element written", out.h.len() * 2);
}

/// Every way to get a launch's arguments wrong that only a device shows (views of the wrong
/// length, misaligned, a gate against the plan's shape, a kernel that cannot run the problem)
/// returns its own typed error, launches nothing and leaves every output as it was: the outputs
/// hold a pattern before the bad launches and hold it after them, bit for bit.
#[test]
fn bad_launches_leave_every_output_untouched() {
    use kda::{DevicePlan, KdaError, KdaInputs, KdaOutputs, bf16};
    let gpu = Gpu::open();
    let s = &gpu.stream;
    let heads = 2;
    let p = inputs::try_random_problem(Plan::from_lengths(&[130, 0, 65]), heads, true, 51).unwrap();
    let plan = DevicePlan::new(s, p.plan.clone(), heads).unwrap();
    let d = plan.dims();
    // Each input one element longer than it must be, so a view may start one element in
    // (misaligned) or stop one short or long.
    let longer_bf = |v: &[bf16]| s.clone_htod(&[v, &[bf16::ZERO]].concat()).unwrap();
    let longer_f = |v: &[f32]| s.clone_htod(&[v, &[0.0]].concat()).unwrap();
    let (k, w, u) = (longer_bf(&p.k), longer_bf(&p.w), longer_bf(&p.u));
    let (gk, h0) = (longer_f(&p.gk), longer_f(p.h0.as_deref().unwrap()));
    let g = longer_f(&vec![0.0; d.tokens * d.value_heads]);
    let pattern_bf = bf16::from_bits(kda_tests::POISON_BF16);
    let pattern_f = f32::from_bits(kda_tests::POISON_F32);
    let mut h = s.clone_htod(&vec![pattern_bf; d.h_len() + 1]).unwrap();
    let mut v_new = s.clone_htod(&vec![pattern_bf; d.value_len() + 1]).unwrap();
    let mut ht = s.clone_htod(&vec![pattern_f; d.state_len() + 1]).unwrap();
    let (kl, vl, sl) = (d.key_len(), d.value_len(), d.state_len());

    type Case<'a> = (&'static str, KdaInputs<'a>, [usize; 3], Kernel, fn(&KdaError) -> bool);
    let exact = || KdaInputs {
        k: k.slice(..kl),
        w: w.slice(..kl),
        u: u.slice(..vl),
        g: None,
        gk: Some(gk.slice(..kl)),
        h0: Some(h0.slice(..sl)),
    };
    let lens = [d.h_len(), vl, sl];
    let cases: Vec<Case<'_>> = vec![
        ("k one short", KdaInputs { k: k.slice(..kl - 1), ..exact() }, lens, Kernel::Auto, |e| {
            matches!(e, KdaError::Shape { tensor: "k", .. })
        }),
        ("u one long", KdaInputs { u: u.slice(..vl + 1), ..exact() }, lens, Kernel::Auto, |e| {
            matches!(e, KdaError::Shape { tensor: "u", .. })
        }),
        ("w misaligned", KdaInputs { w: w.slice(1..kl + 1), ..exact() }, lens, Kernel::Auto, |e| {
            matches!(e, KdaError::Alignment { tensor: "w", .. })
        }),
        ("gk missing", KdaInputs { gk: None, ..exact() }, lens, Kernel::Auto, |e| {
            matches!(e, KdaError::Argument { name: "gk", .. })
        }),
        (
            "g not in the plan",
            KdaInputs { g: Some(g.slice(..d.tokens * d.value_heads)), ..exact() },
            lens,
            Kernel::Auto,
            |e| matches!(e, KdaError::Argument { name: "g", .. }),
        ),
        ("h0 one short", KdaInputs { h0: Some(h0.slice(..sl - 1)), ..exact() }, lens, Kernel::Baseline, |e| {
            matches!(e, KdaError::Shape { tensor: "h0", .. })
        }),
        ("h one short", exact(), [d.h_len() - 1, vl, sl], Kernel::Auto, |e| {
            matches!(e, KdaError::Shape { tensor: "h", .. })
        }),
        ("v_new one long", exact(), [d.h_len(), vl + 1, sl], Kernel::Auto, |e| {
            matches!(e, KdaError::Shape { tensor: "v_new", .. })
        }),
        ("ht one short", exact(), [d.h_len(), vl, sl - 1], Kernel::Baseline, |e| {
            matches!(e, KdaError::Shape { tensor: "ht", .. })
        }),
    ];
    let count = cases.len();
    for (what, inputs, [hl, vnl, htl], kernel, want) in cases {
        let mut outputs =
            KdaOutputs { h: h.slice_mut(..hl), v_new: v_new.slice_mut(..vnl), ht: Some(ht.slice_mut(..htl)) };
        match gpu.kda.launch(s, &plan, &inputs, &mut outputs, kernel) {
            Err(e) if want(&e) => println!("{what}: {e}"),
            other => panic!("{what}: got {other:?}"),
        }
    }
    s.synchronize().unwrap();
    let untouched_bf = |v: Vec<bf16>| v.iter().all(|x| x.to_bits() == kda_tests::POISON_BF16);
    assert!(untouched_bf(s.clone_dtoh(&h).unwrap()), "h was written");
    assert!(untouched_bf(s.clone_dtoh(&v_new).unwrap()), "v_new was written");
    assert!(s.clone_dtoh(&ht).unwrap().iter().all(|x| x.to_bits() == kda_tests::POISON_F32), "ht was written");
    println!("{count} bad launches, each its own typed error; no output touched");
}
