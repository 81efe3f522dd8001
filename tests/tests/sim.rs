//! The portable kernels' own source, run on the host by `kda_kernel::sim` (one host thread per
//! GPU thread) and checked against the f64 references: the kernels' logic (indexing, tails,
//! barriers, fragment layouts) is tested on every CI run, without a GPU.

use half::bf16;

use kda::inputs::random_problem;
use kda::layer::{InputDtype, LayerCodes, LayerKind, LayerOutputs, LayerProblem, chunk_table, layer_reference};
use kda::model::{ModelShape, ModelView, StateLayout};
use kda::pool::{
    CheckpointTables, DraftTables, PoolElement, PoolShape, SlotUse, StateDtype, checkpoint_tables, draft_tables,
};
use kda::reference::{model_reference, reference};
use kda::schedule::{Schedule, UColumns, Unit};
use kda::split::SplitPlan;
use kda::{Dims, Outputs, Plan, Problem, Strides, Tensor};
use kda_kernel::abi::PassCode;
use kda_kernel::layout::{baseline, layer, portable};
use kda_kernel::sim::{self, Launch, ptr, ptr_mut};
use kda_tests::{DECODE_O_BOUND, DECODE_STATE_BOUND, POISON_BF16, POISON_F32, assert_within_floor, layer_bounds};
use kda_tests::{SPLIT_BOUND, SplitErrors, VerifyCase, transposed};

/// Outputs of `p`'s sizes, every element poisoned.
fn poisoned_outputs(p: &Problem) -> Outputs {
    let d = p.dims();
    Outputs {
        h: vec![bf16::from_bits(POISON_BF16); d.h_len()],
        v_new: vec![bf16::from_bits(POISON_BF16); d.value_len()],
        ht: vec![f32::from_bits(POISON_F32); d.state_len()],
    }
}

/// Asserts no element of `out` still holds the poison.
fn assert_all_written(case: &str, out: &Outputs) {
    let h = out.h.iter().filter(|x| x.to_bits() == POISON_BF16).count();
    let v = out.v_new.iter().filter(|x| x.to_bits() == POISON_BF16).count();
    let ht = out.ht.iter().filter(|x| x.to_bits() == POISON_F32).count();
    assert_eq!([h, v, ht], [0; 3], "{case}: elements of h, v_new, ht never written");
}

/// A recurrence kernel with the baseline's parameter list (`abi::BASELINE_PARAMS`) and its launch
/// shape: one CTA of `threads` per (sequence, value head, block of `V / col_blocks` columns).
struct Recurrence {
    name: &'static str,
    entry: RecurrenceEntry,
    col_blocks: usize,
    threads: usize,
    shared_bytes: usize,
}

type RecurrenceEntry = unsafe fn(
    *const u16,
    *const u16,
    *const u16,
    *const f32,
    *const f32,
    *mut u16,
    *mut u16,
    *mut f32,
    *const i64,
    u32,
    u32,
);

const BASELINE: Recurrence = Recurrence {
    name: "baseline",
    entry: kda_kernel::baseline::kda_fwd_h_baseline,
    col_blocks: baseline::COL_BLOCKS,
    threads: baseline::THREADS,
    shared_bytes: baseline::SMEM_BYTES,
};

impl Recurrence {
    /// The kernel on `p`, its outputs poisoned first.
    fn run(&self, p: &Problem) -> Outputs {
        let d = p.dims();
        let seqs = p.plan.descriptors();
        let h0 = p.h0.as_deref().map_or(sim::Ptr::null(), ptr);
        let mut out = poisoned_outputs(p);
        let (k, w, u, gk) = (ptr(&p.k), ptr(&p.w), ptr(&p.u), ptr(&p.gk));
        let (h, v_new, ht) = (ptr_mut(&mut out.h), ptr_mut(&mut out.v_new), ptr_mut(&mut out.ht));
        let seqs_ptr = ptr(&seqs);
        let launch = Launch {
            grid: d.seqs * d.value_heads * self.col_blocks,
            block: self.threads,
            shared_bytes: self.shared_bytes,
        };
        let entry = self.entry;
        // SAFETY: every buffer has the contract's size for this plan and these heads.
        let run = unsafe {
            sim::launch(launch, || {
                entry(
                    k.ptr() as *const u16,
                    w.ptr() as *const u16,
                    u.ptr() as *const u16,
                    gk.ptr(),
                    h0.ptr(),
                    h.mut_ptr() as *mut u16,
                    v_new.mut_ptr() as *mut u16,
                    ht.mut_ptr(),
                    seqs_ptr.ptr(),
                    d.value_heads as u32,
                    d.heads as u32,
                )
            })
        };
        run.unwrap_or_else(|e| panic!("{}: {e}", self.name));
        out
    }

    /// The kernel on `p` against the f64 reference: every output written, within the contract's
    /// bound over the f32 rounding floor.
    fn check(&self, case: &str, p: &Problem) {
        let out = self.run(p);
        let case = format!("{} {case}", self.name);
        assert_all_written(&case, &out);
        let want = reference(p).unwrap();
        let floor = kda::reference::reference_f32(p).unwrap().errors(&want);
        let errs = out.errors(&want);
        println!("{case}: h {:.2e} v_new {:.2e} ht {:.2e}", errs[0], errs[1], errs[2]);
        assert_within_floor(&case, errs, floor);
    }
}

/// The baseline on lengths around the chunk (one token, a partial chunk, a whole one, one past,
/// two and a bit), with and without `h0`, one and two heads, grouped value heads.
#[test]
fn the_baseline_matches_the_reference_on_ragged_tails() {
    let lengths = Plan::from_lengths(&[1, 63, 64, 65, 130]);
    BASELINE.check("ragged h0 H=2", &random_problem(lengths.clone(), 2, true, 11));
    BASELINE.check("ragged H=1", &random_problem(lengths, 1, false, 12));
    let grouped = kda::inputs::try_random_grouped_problem(Plan::from_lengths(&[200, 7]), 1, 2, true, 13).unwrap();
    BASELINE.check("grouped H=1 HV=2", &grouped);
}

/// The portable tensor-core kernel's entry for key size `key_dim`.
type PortableEntry = unsafe fn(
    *const u16,
    *const u16,
    *const u16,
    *const f32,
    *const f32,
    *const f32,
    *mut u16,
    *mut u16,
    *mut f32,
    *const u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
);

fn portable_entry(key_dim: usize, groups: usize) -> PortableEntry {
    match (key_dim, groups) {
        (64, 1) => kda_kernel::portable::kda_fwd_h_portable_k64,
        (128, 1) => kda_kernel::portable::kda_fwd_h_portable,
        (256, 1) => kda_kernel::portable::kda_fwd_h_portable_k256,
        (64, 2) => kda_kernel::portable::kda_fwd_h_portable_k64_wide,
        (128, 2) => kda_kernel::portable::kda_fwd_h_portable_wide,
        _ => panic!("no portable entry for K = {key_dim}, {groups} groups"),
    }
}

/// The consumer groups per CTA the portable kernel can run `p` with: one, and two where that
/// variant exists and `V` is a multiple of its block.
fn portable_groups(p: &ModelView<'_>) -> Vec<usize> {
    let (k, v) = (p.shape.key_dim, p.shape.value_dim);
    let wide = portable::has_variant(k, 2) && v.is_multiple_of(portable::block_cols(2));
    if wide { vec![1, 2] } else { vec![1] }
}

/// CTAs of the simulated persistent grid: few, so that each walks several items and its ring
/// runs on from one item to the next (and from a long item into short ones).
const SIM_WORKERS: usize = 3;

/// One pass of the portable kernel: its work records (16-byte aligned, as the kernel reads them)
/// and its grid, scheduled longest first as the launcher schedules them.
struct PortablePass {
    records: Vec<[u32; 4]>,
    workers: usize,
}

impl PortablePass {
    /// The pass over `units` (sequences or segments), in blocks of `width` of the pass's
    /// `columns` per head, reading `u` at `u_columns`.
    fn of(units: &[Unit], d: &Dims, (columns, width): (usize, usize), u_columns: UColumns) -> Self {
        let schedule =
            Schedule::try_lpt_units(units, u_columns, d.value_heads, (columns / width, width), SIM_WORKERS).unwrap();
        let words = schedule.table_of(units, d.group(), u_columns).expect("32-bit records");
        let mut records = vec![[0u32; 4]; words.len().div_ceil(4).max(1)];
        for (i, w) in words.iter().enumerate() {
            records[i / 4][i % 4] = *w;
        }
        Self { records, workers: schedule.workers() }
    }
}

/// The token tensors of a problem laid out at its strides (the gaps filled with NaN), and the
/// strides as the kernel takes them.
struct LaidInputs {
    k: Vec<bf16>,
    w: Vec<bf16>,
    u: Vec<bf16>,
    g: Option<Vec<f32>>,
    gk: Option<Vec<f32>>,
    strides: [[u32; 2]; 6],
}

impl LaidInputs {
    fn of(p: &ModelView<'_>, strides: &Strides) -> Self {
        let d = Dims::model(p.plan, &p.shape);
        let laid_bf = |t: Tensor, v: &[bf16]| strides.scatter(&d, t, v, bf16::NAN);
        let laid_f = |t: Tensor, v: &[f32]| strides.scatter(&d, t, v, f32::NAN);
        let stride = |t: Tensor| {
            let s = strides.effective(&d, t);
            [s.token as u32, s.head as u32]
        };
        Self {
            k: laid_bf(Tensor::K, p.k),
            w: laid_bf(Tensor::W, p.w),
            u: laid_bf(Tensor::U, p.u),
            g: p.g.map(|g| laid_f(Tensor::G, g)),
            gk: p.gk.map(|gk| laid_f(Tensor::Gk, gk)),
            strides: [Tensor::K, Tensor::W, Tensor::U, Tensor::G, Tensor::Gk, Tensor::VNew].map(stride),
        }
    }
}

/// Where a pass reads and writes states, and what it runs.
struct PassStates {
    h0: sim::Ptr<f32>,
    ht: sim::Ptr<f32>,
    /// Columns of the pass's states (`V`, or `K + V` in the pre-scan).
    value_dim: usize,
    layout: StateLayout,
    pass: PassCode,
}

/// One launch of the portable kernel for key size `key_dim` and `groups` consumer groups on the
/// simulator.
fn launch_portable_pass(
    (key_dim, groups): (usize, usize),
    value_heads: usize,
    inputs: &LaidInputs,
    (h, v_new): (sim::Ptr<bf16>, sim::Ptr<bf16>),
    pass: &PortablePass,
    states: &PassStates,
) {
    let opt = |x: &Option<Vec<f32>>| x.as_deref().map_or(sim::Ptr::null(), ptr);
    let (k, w, u, g, gk) = (ptr(&inputs.k), ptr(&inputs.w), ptr(&inputs.u), opt(&inputs.g), opt(&inputs.gk));
    let records = ptr(&pass.records);
    let [ks, ws, us, gs, gks, vs] = inputs.strides;
    let entry = portable_entry(key_dim, groups);
    let launch = Launch {
        grid: pass.workers,
        block: portable::threads(groups),
        shared_bytes: portable::smem_bytes(key_dim, groups),
    };
    // SAFETY: every buffer holds the problem's rows at these strides and the state rows the
    // records name; the outputs are separate.
    unsafe {
        sim::launch(launch, || {
            entry(
                k.ptr() as *const u16,
                w.ptr() as *const u16,
                u.ptr() as *const u16,
                g.ptr(),
                gk.ptr(),
                states.h0.ptr(),
                h.mut_ptr() as *mut u16,
                v_new.mut_ptr() as *mut u16,
                states.ht.mut_ptr(),
                records.ptr() as *const u32,
                value_heads as u32,
                states.value_dim as u32,
                states.layout.code(),
                states.pass as u32,
                ks[0],
                ks[1],
                ws[0],
                ws[1],
                us[0],
                us[1],
                gs[0],
                gs[1],
                gks[0],
                gks[1],
                vs[0],
                vs[1],
            )
        })
    }
    .unwrap_or_else(|e| panic!("portable {:?}: {e}", states.pass));
}

/// The portable kernel of `groups` consumer groups on `p` with its token tensors laid out at
/// `strides`, as the launcher runs it: the persistent grid over the longest-first schedule of
/// (sequence, value head, block of `groups * BV` columns) items, or, with `split`, its three
/// passes (the pre-scan's maps, the merge's entry states, every segment from its entry state).
/// Every output is poisoned first and checked written; `v_new` is gathered back from its
/// strides.
fn run_portable(p: &ModelView<'_>, strides: &Strides, split: Option<&SplitPlan>, groups: usize) -> Outputs {
    let d = Dims::model(p.plan, &p.shape);
    let inputs = LaidInputs::of(p, strides);
    let [h_len, _, ht_len] = p.output_lens();
    let poison_bf = bf16::from_bits(POISON_BF16);
    let mut h = vec![poison_bf; h_len];
    let mut v_new = vec![poison_bf; strides.len_of(&d, Tensor::VNew).unwrap()];
    let mut ht = vec![f32::from_bits(POISON_F32); ht_len];
    let outputs = (ptr_mut(&mut h), ptr_mut(&mut v_new));
    let h0 = p.h0.map_or(sim::Ptr::null(), ptr);
    let (kd, vd, hv) = (d.key_dim, d.value_dim, d.value_heads);
    let (entry, width) = ((kd, groups), portable::block_cols(groups));
    let layout = p.shape.layout;
    let recurrence =
        |h0: sim::Ptr<f32>, ht: sim::Ptr<f32>| PassStates { h0, ht, value_dim: vd, layout, pass: PassCode::Recurrence };
    match split {
        None => {
            let pass = PortablePass::of(&Unit::sequences(p.plan), &d, (vd, width), UColumns::Values);
            launch_portable_pass(entry, hv, &inputs, outputs, &pass, &recurrence(h0, ptr_mut(&mut ht)));
        }
        Some(split) => {
            let wide = kd + vd;
            let mut maps = vec![f32::from_bits(POISON_F32); split.maps() * hv * kd * wide];
            let prescan =
                PortablePass::of(&split.prescan_units(), &d, (wide, width), UColumns::Prescan { key_dim: kd });
            // The first segments start from `h0`, in its layout (the maps are key-first).
            let states = PassStates { h0, ht: ptr_mut(&mut maps), value_dim: wide, layout, pass: PassCode::Prescan };
            launch_portable_pass(entry, hv, &inputs, outputs, &prescan, &states);
            let mut entries = vec![f32::from_bits(POISON_F32); split.segments().len() * hv * kd * vd];
            sim_merge(split, (&maps, h0), &mut entries, [hv, kd, vd], layout);
            let main = PortablePass::of(&split.main_units(), &d, (vd, width), UColumns::Values);
            launch_portable_pass(entry, hv, &inputs, outputs, &main, &recurrence(ptr(&entries), ptr_mut(&mut ht)));
        }
    }
    let out = Outputs { h, v_new: strides.gather(&d, Tensor::VNew, &v_new), ht };
    assert_all_written("portable", &out);
    out
}

/// The portable kernel's fused layer pass entry for key size `key_dim` and `groups` groups.
type PortableFusedEntry = unsafe fn(
    *const u16,
    *const u16,
    *const u16,
    *const f32,
    *const f32,
    *const f32,
    *mut u16,
    *mut u16,
    *mut f32,
    *const u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    *const u16,
    *const u16,
    u32,
);

fn portable_fused_entry(key_dim: usize, groups: usize) -> PortableFusedEntry {
    match (key_dim, groups) {
        (64, 1) => kda_kernel::portable::kda_layer_fused_portable_k64,
        (128, 1) => kda_kernel::portable::kda_layer_fused_portable,
        (64, 2) => kda_kernel::portable::kda_layer_fused_portable_k64_wide,
        (128, 2) => kda_kernel::portable::kda_layer_fused_portable_wide,
        _ => panic!("no fused portable entry for K = {key_dim}, {groups} groups"),
    }
}

/// The portable kernel's fused layer pass on `p` (the layer's recurrence view, packed) with the
/// fused prepare kernel's `qg` and `attention`, as the launcher runs it unsplit: `o` (`[T, HV,
/// V]`, poisoned first and checked written) and `ht` (in `p`'s layout).
fn run_portable_fused(
    p: &ModelView<'_>,
    (qg, attention): (&[bf16], &[bf16]),
    scale_bits: u32,
    groups: usize,
) -> (Vec<f32>, Vec<f32>) {
    let d = Dims::model(p.plan, &p.shape);
    let inputs = LaidInputs::of(p, &Strides::PACKED);
    let [_, v_new_len, ht_len] = p.output_lens();
    let mut o = vec![bf16::from_bits(POISON_BF16); v_new_len];
    let mut ht = vec![f32::from_bits(POISON_F32); ht_len];
    let (kd, vd, hv) = (d.key_dim, d.value_dim, d.value_heads);
    let pass = PortablePass::of(&Unit::sequences(p.plan), &d, (vd, portable::block_cols(groups)), UColumns::Values);
    let opt = |x: &Option<Vec<f32>>| x.as_deref().map_or(sim::Ptr::null(), ptr);
    let (k, w, u, g, gk) = (ptr(&inputs.k), ptr(&inputs.w), ptr(&inputs.u), opt(&inputs.g), opt(&inputs.gk));
    let (h0, qg, attention, records) =
        (p.h0.map_or(sim::Ptr::null(), ptr), ptr(qg), ptr(attention), ptr(&pass.records));
    let (o_out, ht_out) = (ptr_mut(&mut o), ptr_mut(&mut ht));
    let [ks, ws, us, gs, gks, os] = inputs.strides;
    let entry = portable_fused_entry(kd, groups);
    let launch = Launch {
        grid: pass.workers,
        block: portable::threads(groups),
        shared_bytes: portable::fused_smem_bytes(kd, groups),
    };
    // SAFETY: every buffer holds the layer's rows (packed) and the state rows the records name;
    // the outputs are separate; `h` is never written by the fused pass (null).
    unsafe {
        sim::launch(launch, || {
            entry(
                k.ptr() as *const u16,
                w.ptr() as *const u16,
                u.ptr() as *const u16,
                g.ptr(),
                gk.ptr(),
                h0.ptr(),
                core::ptr::null_mut(),
                o_out.mut_ptr() as *mut u16,
                ht_out.mut_ptr(),
                records.ptr() as *const u32,
                hv as u32,
                vd as u32,
                p.shape.layout.code(),
                PassCode::Recurrence as u32,
                ks[0],
                ks[1],
                ws[0],
                ws[1],
                us[0],
                us[1],
                gs[0],
                gs[1],
                gks[0],
                gks[1],
                os[0],
                os[1],
                qg.ptr() as *const u16,
                attention.ptr() as *const u16,
                scale_bits,
            )
        })
    }
    .unwrap_or_else(|e| panic!("portable fused pass, K = {kd}, {groups} groups: {e}"));
    assert!(o.iter().all(|x| x.to_bits() != POISON_BF16), "the fused pass left o unwritten");
    assert!(ht.iter().all(|x| x.to_bits() != POISON_F32), "the fused pass left ht unwritten");
    (o.iter().map(|x| x.to_f32()).collect(), ht)
}

/// The split merge on the simulator as the launcher runs it (one CTA per merge record, value
/// head and block of `COLS` columns): `entries` from the pre-scan's `maps` and `h0`, for
/// `heads` value heads of `K = key_dim`, `V = value_dim`.
fn sim_merge(
    split: &SplitPlan,
    (maps, h0): (&[f32], sim::Ptr<f32>),
    entries: &mut [f32],
    [heads, key_dim, value_dim]: [usize; 3],
    layout: StateLayout,
) {
    use kda_kernel::layout::merge;
    let table = split.merge_table().unwrap();
    let records = table.len() / kda_kernel::layout::MERGE_WORDS;
    let launch = Launch {
        grid: records * heads * (value_dim / merge::COLS),
        block: merge::THREADS,
        shared_bytes: merge::SMEM_BYTES,
    };
    let (maps_ptr, entries_ptr, table_ptr) = (ptr(maps), ptr_mut(entries), ptr(&table));
    // SAFETY: the maps and entries hold every row the table names; `h0` (or null) one state per
    // sequence and head.
    unsafe {
        sim::launch(launch, || {
            kda_kernel::merge::kda_split_merge(
                maps_ptr.ptr(),
                h0.ptr(),
                entries_ptr.mut_ptr(),
                table_ptr.ptr(),
                heads as u32,
                key_dim as u32,
                value_dim as u32,
                layout.code(),
            )
        })
    }
    .unwrap_or_else(|e| panic!("merge: {e}"));
}

/// The portable tensor-core kernel on every gate kind, state layout and key size, grouped heads,
/// partial chunks and strided rows (`kda_tests::portable_model_cases`), against the f64
/// reference within the contract's bound over the f32 rounding floor.
#[test]
fn the_portable_kernel_runs_the_generalized_recurrence() {
    let mut failures = Vec::new();
    for case in kda_tests::portable_model_cases() {
        let p = case.problem.view();
        let want = model_reference(&p).unwrap();
        let floor = kda::reference::model_reference_f32(&p).unwrap().errors(&want);
        let bounds = case.bounds(floor);
        for groups in portable_groups(&p) {
            let errs = run_portable(&p, &case.strides, None, groups).errors(&want);
            println!(
                "{} ({groups} groups): h {:.2e} v_new {:.2e} ht {:.2e} (bounds {:.1e} {:.1e} {:.1e})",
                case.name, errs[0], errs[1], errs[2], bounds[0], bounds[1], bounds[2]
            );
            if errs.iter().zip(&bounds).any(|(e, b)| e.is_nan() || e >= b) {
                failures.push((case.name.clone(), groups));
            }
        }
    }
    assert!(failures.is_empty(), "{} cases out of bounds: {failures:#?}", failures.len());
}

/// Work lists shorter than the ring (one chunk, or only an empty sequence) at every key size:
/// the producer takes back exactly the stages it handed out (the simulator reports a barrier
/// left waiting or half-arrived), and the results match the reference.
#[test]
fn the_portable_ring_drains_work_lists_shorter_than_itself() {
    for key_dim in portable::KEY_DIMS {
        let shape = ModelShape { key_dim, value_dim: 2 * portable::BV, ..ModelShape::kda(1) };
        let p = kda::inputs::try_random_model_problem(Plan::from_lengths(&[5, 0]), shape, true, 7).unwrap();
        let p = p.view();
        let want = model_reference(&p).unwrap();
        let floor = kda::reference::model_reference_f32(&p).unwrap().errors(&want);
        for groups in portable_groups(&p) {
            let errs = run_portable(&p, &Strides::PACKED, None, groups).errors(&want);
            assert_within_floor(&format!("K = {key_dim}, {groups} groups"), errs, floor);
        }
    }
}

/// The portable kernel's split passes (pre-scan into the maps, the merge, every segment from its
/// entry state) on the generalized cases, their sequences cut into one-chunk segments: every
/// output written, and the results those of the f64 model of the same split and of the unsplit
/// recurrence within `SPLIT_BOUND` (as the GPU's `split_sequences`). The cases take turns with
/// the widest variant each can run and one group.
#[test]
fn the_portable_kernel_runs_split_sequences() {
    let mut failures = Vec::new();
    for (i, case) in kda_tests::portable_model_cases().into_iter().enumerate() {
        let p = case.problem.view();
        let split = SplitPlan::cut(p.plan, 1);
        assert!(split.is_split(), "{}: not split", case.name);
        let variants = portable_groups(&p);
        let groups = variants[i % variants.len()];
        let out = run_portable(&p, &case.strides, Some(&split), groups);
        let SplitErrors { model, unsplit, bounds } = SplitErrors::of(&out, &p, &split);
        println!(
            "{}: vs split model {:.2e} {:.2e} {:.2e}, vs unsplit {:.2e} {:.2e} {:.2e} (bounds {:.1e} {:.1e} {:.1e})",
            case.name,
            model[0],
            model[1],
            model[2],
            unsplit[0],
            unsplit[1],
            unsplit[2],
            bounds[0],
            bounds[1],
            bounds[2]
        );
        let within = model.iter().all(|&e| e < SPLIT_BOUND) && unsplit.iter().zip(&bounds).all(|(e, b)| e < b);
        if !within {
            failures.push(case.name);
        }
    }
    assert!(failures.is_empty(), "{} cases out of bounds: {failures:#?}", failures.len());
}

/// The model fixtures (FLA's outputs on our H200) through the portable kernel: within the
/// contract's bound of the f64 reference, and as close to FLA as the reference is.
#[test]
fn the_portable_kernel_reproduces_the_model_fixtures() {
    for name in kda_tests::MODEL_FIXTURES {
        let (p, golden) = kda::io::read_model_problem(&kda_tests::model_fixture(name)).unwrap();
        let golden = golden.expect("fixture holds outputs");
        let want = model_reference(&p.view()).unwrap();
        let floor = kda::reference::model_reference_f32(&p.view()).unwrap().errors(&want);
        for groups in portable_groups(&p.view()) {
            let out = run_portable(&p.view(), &Strides::PACKED, None, groups);
            let (errs, fla) = (out.errors(&want), out.errors(&golden));
            println!("{name} ({groups} groups): vs reference {errs:?}, vs FLA {fla:?}");
            let s = p.shape;
            let bound = |f: f64| kda::precision::bound_for(s.gates.g || s.gates.gk, s.key_dim, f);
            assert!(errs.iter().zip(floor).all(|(&e, f)| e < bound(f)), "{name}: {errs:?} over the floor {floor:?}");
        }
    }
}

/// The option words the layer, decode and checkpoint kernels take for `p`: its options' and,
/// as the launcher adds them, its gate's and `beta`'s dtype bits.
fn kernel_codes(p: &LayerProblem) -> LayerCodes {
    let codes = p.options.codes();
    LayerCodes { options: codes.options | p.dtypes.option_bits(), ..codes }
}

/// The gate or `beta` as the kernels read it in `dtype`: f32, or bf16 packed two to a word
/// (the first in the low half), in 8-byte-aligned storage (a per-key bf16 gate is read 8 bytes
/// at a time).
fn float_words(x: &[f32], dtype: InputDtype) -> Vec<u64> {
    let bits: Vec<u64> = match dtype {
        InputDtype::F32 => x.iter().map(|v| u64::from(v.to_bits())).collect(),
        InputDtype::Bf16 => x.iter().map(|&v| u64::from(bf16::from_f32(v).to_bits())).collect(),
    };
    let per_word = 8 / dtype.bytes();
    bits.chunks(per_word).map(|c| c.iter().enumerate().fold(0, |w, (i, &b)| w | b << (64 / per_word * i))).collect()
}

/// [`float_words`]' storage as the kernels' `*const f32` parameter.
fn float_ptr(words: &[u64]) -> sim::Ptr<f32> {
    sim::Ptr(words.as_ptr() as *mut f32)
}

/// A launch of the layer kernels over `p`'s chunk table: one CTA per (chunk, value head).
fn layer_launch(p: &LayerProblem, shared_bytes: usize) -> Launch {
    Launch { grid: p.plan.chunks() * p.shape.value_heads, block: layer::THREADS, shared_bytes }
}

/// The fused prepare kernels' signature (`kda_layer_prepare_fused` and its scalar-gate variant).
type PrepareFused = unsafe fn(
    *const u16,
    *const u16,
    *const f32,
    *const f32,
    *const f32,
    *const f32,
    *const u32,
    *mut u16,
    *mut u16,
    *mut u16,
    *mut f32,
    *const u16,
    *mut u16,
    *mut u16,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
);

/// What runs the layer's recurrence on the simulator.
#[derive(Clone, Copy, Debug)]
enum LayerRecurrence {
    /// The f64 reference of the contract (checks the token-parallel kernels alone).
    Reference,
    /// The portable tensor-core kernel: the whole layer as every GPU but Hopper runs it.
    Portable,
    /// The portable kernel's fused layer pass (`kda_layer_fused_portable*`), forming `o` in its
    /// chunk loop from the fused prepare kernel's `q Γ` and `P` (with [`LayerOutput::Fused`]).
    PortableFused {
        /// Consumer groups per CTA.
        groups: usize,
    },
}

/// How the simulated layer forms `o`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LayerOutput {
    /// The output kernel, from the recurrence's `h` and `v_new` (the separate path).
    Kernel,
    /// The fused prepare kernel (`kda_layer_prepare_fused`: `q Γ` and `P` besides the prepare
    /// kernel's outputs), then `o` from them, `bf16(S)` and `bf16(Vn)` in f32 as the fused
    /// recurrence's two output products form it (the fused path's arithmetic; the Hopper kernel
    /// itself runs only on the GPU).
    Fused,
    /// The fused prepare kernel, the recurrence, then the output kernel on its `q Γ` and `P`
    /// (`kda_layer_output_prepared`: the separate path where the fused prepare kernel runs).
    Prepared,
}

/// The layer on the simulator as the launcher runs it, its states (`h`, and `h0`, `ht` at the
/// recurrence) in `layout`: the prepare kernel, the recurrence (here the f64 reference of the
/// contract, on the prepare kernel's bf16 outputs), the output kernel. Returns key-first `ht`.
fn run_layer(p: &LayerProblem, layout: StateLayout, recurrence: LayerRecurrence) -> LayerOutputs {
    run_layer_keeping_h(p, layout, recurrence, LayerOutput::Kernel).0
}

/// [`run_layer`], and the chunk entry states `h` its recurrence left (`[NT, HV, K, V]` bf16 in
/// `layout`), as the workspace keeps them, `o` formed as `output` says.
fn run_layer_keeping_h(
    p: &LayerProblem,
    layout: StateLayout,
    recurrence: LayerRecurrence,
    output: LayerOutput,
) -> (LayerOutputs, Vec<bf16>) {
    let s = p.shape;
    let (t, hv, kd, vd, gw) = (p.plan.tokens(), s.value_heads, s.key_dim, s.value_dim, s.gate_width());
    let rec = s.recurrence_shape(layout);
    let value_first = layout == StateLayout::ValueFirst;
    let codes = kernel_codes(p);
    let dims = [s.heads, hv, kd, vd, gw].map(|x| x as u32);
    let table = chunk_table(&p.plan).unwrap();
    let poison_bf = bf16::from_bits(POISON_BF16);
    let (mut k_rec, mut w, mut u) =
        (vec![poison_bf; t * rec.heads * kd], vec![poison_bf; t * hv * kd], vec![poison_bf; t * hv * vd]);
    let mut gate = vec![f32::from_bits(POISON_F32); t * hv * gw];
    let opt = |x: &Option<Vec<f32>>| x.as_deref().map_or(sim::Ptr::null(), ptr);
    let (g_words, beta_words) = (float_words(&p.g, p.dtypes.g), float_words(&p.beta, p.dtypes.beta));
    let (q_in, k_in, v_in, g_in, beta) = (ptr(&p.q), ptr(&p.k), ptr(&p.v), float_ptr(&g_words), float_ptr(&beta_words));
    let (a_log, dt_bias, chunks) = (opt(&p.a_log), opt(&p.dt_bias), ptr(&table));
    let (k_out, w_out, u_out, gate_out) = (ptr_mut(&mut k_rec), ptr_mut(&mut w), ptr_mut(&mut u), ptr_mut(&mut gate));
    // Both the fused output and the prepared output kernel read the fused prepare kernel's
    // outputs.
    let fused = output != LayerOutput::Kernel;
    let chunk = kda_kernel::layout::CHUNK;
    let (mut qg, mut attention) =
        if fused { (vec![poison_bf; t * hv * kd], vec![poison_bf; t * hv * chunk]) } else { (Vec::new(), Vec::new()) };
    let (qg_out, attention_out) = (ptr_mut(&mut qg), ptr_mut(&mut attention));
    // SAFETY: every buffer holds the layer's rows for this plan and shape; the table was built
    // from the same plan.
    if fused {
        // The launcher's choice: the variant without the gate tile for a per-head gate.
        let (prepare_fused, smem) = if gw == 1 {
            (kda_kernel::layer::kda_layer_prepare_fused_scalar as PrepareFused, layer::PREPARE_SCALAR_FUSED_SMEM_BYTES)
        } else {
            (kda_kernel::layer::kda_layer_prepare_fused as PrepareFused, layer::PREPARE_FUSED_SMEM_BYTES)
        };
        unsafe {
            sim::launch(layer_launch(p, smem), || {
                prepare_fused(
                    k_in.ptr() as *const u16,
                    v_in.ptr() as *const u16,
                    g_in.ptr(),
                    beta.ptr(),
                    a_log.ptr(),
                    dt_bias.ptr(),
                    chunks.ptr(),
                    k_out.mut_ptr() as *mut u16,
                    w_out.mut_ptr() as *mut u16,
                    u_out.mut_ptr() as *mut u16,
                    gate_out.mut_ptr(),
                    q_in.ptr() as *const u16,
                    qg_out.mut_ptr() as *mut u16,
                    attention_out.mut_ptr() as *mut u16,
                    dims[0],
                    dims[1],
                    dims[2],
                    dims[3],
                    dims[4],
                    codes.options,
                    codes.gate_mode,
                    codes.lower_bound_bits,
                )
            })
        }
        .unwrap_or_else(|e| panic!("fused prepare: {e}"));
    } else {
        unsafe {
            sim::launch(layer_launch(p, layer::PREPARE_SMEM_BYTES), || {
                kda_kernel::layer::kda_layer_prepare(
                    k_in.ptr() as *const u16,
                    v_in.ptr() as *const u16,
                    g_in.ptr(),
                    beta.ptr(),
                    a_log.ptr(),
                    dt_bias.ptr(),
                    chunks.ptr(),
                    k_out.mut_ptr() as *mut u16,
                    w_out.mut_ptr() as *mut u16,
                    u_out.mut_ptr() as *mut u16,
                    gate_out.mut_ptr(),
                    dims[0],
                    dims[1],
                    dims[2],
                    dims[3],
                    dims[4],
                    codes.options,
                    codes.gate_mode,
                    codes.lower_bound_bits,
                )
            })
        }
        .unwrap_or_else(|e| panic!("prepare: {e}"));
    }
    // Gated DeltaNet's keys without the L2 norm inside are `k` itself, which the launcher hands
    // the recurrence: the prepare kernel leaves `k_rec` as it was.
    let keys_given = s.kind == LayerKind::Gdn && !p.options.l2norm_qk;
    if keys_given {
        assert!(k_rec.iter().all(|x| x.to_bits() == POISON_BF16), "prepare wrote k_rec, which is k");
    }
    let k_rec = if keys_given { p.k.clone() } else { k_rec };
    for (name, written) in [("k_rec", &k_rec), ("w", &w), ("u", &u), ("qg", &qg), ("attention", &attention)] {
        assert!(written.iter().all(|x| x.to_bits() != POISON_BF16), "prepare left {name} unwritten");
    }
    // The fused prepare kernel writes a per-key gate's last row of each chunk only (all the
    // recurrence reads of it): the rows it leaves keep their poison, which the recurrence below
    // would turn into NaN if it read them.
    let gate_rows_written = |row: usize| !(fused && s.kind == LayerKind::Kda) || table_last_rows(&table).contains(&row);
    for (e, x) in gate.iter().enumerate() {
        let row = e / (hv * gw);
        assert_eq!(x.to_bits() != POISON_F32, gate_rows_written(row), "prepare's gate row {row}");
    }
    let is_kda = s.kind == LayerKind::Kda;
    let h0 = p.h0.as_ref().map(|h0| if value_first { transposed(h0, kd, vd) } else { h0.clone() });
    let view = ModelView {
        plan: &p.plan,
        shape: rec,
        k: &k_rec,
        w: &w,
        u: &u,
        g: (!is_kda).then_some(&gate[..]),
        gk: is_kda.then_some(&gate[..]),
        h0: h0.as_deref(),
    };
    if let LayerRecurrence::PortableFused { groups } = recurrence {
        assert!(fused, "the portable fused pass runs on the fused prepare kernel's outputs");
        let (o, ht) = run_portable_fused(&view, (&qg, &attention), codes.scale_bits, groups);
        let ht = if value_first { transposed(&ht, vd, kd) } else { ht };
        return (LayerOutputs { o, ht }, Vec::new());
    }
    let recurrence = match recurrence {
        LayerRecurrence::Reference => model_reference(&view).unwrap(),
        LayerRecurrence::PortableFused { .. } => unreachable!("returned above"),
        LayerRecurrence::Portable => {
            // The widest variant the shape runs, as the launcher picks on a GPU that has room.
            let groups = *portable_groups(&view).last().expect("one group always runs");
            run_portable(&view, &Strides::PACKED, None, groups)
        }
    };
    let mut o = vec![poison_bf; t * hv * vd];
    let (h, v_new, o_out) = (ptr(&recurrence.h), ptr(&recurrence.v_new), ptr_mut(&mut o));
    let gate_in = ptr(&gate);
    let ht = if value_first { transposed(&recurrence.ht, vd, kd) } else { recurrence.ht };
    if output == LayerOutput::Fused {
        let o = fused_output(p, (&qg, &attention), &recurrence.h, &recurrence.v_new, layout);
        return (LayerOutputs { o, ht }, recurrence.h);
    }
    let (qg_in, attention_in) = (ptr(&qg), ptr(&attention));
    // SAFETY: as above; `h` holds a state per (chunk, value head) in the table's order, `qg` and
    // `attention` the fused prepare kernel's rows.
    if output == LayerOutput::Prepared {
        unsafe {
            sim::launch(layer_launch(p, layer::OUTPUT_PREPARED_SMEM_BYTES), || {
                kda_kernel::layer::kda_layer_output_prepared(
                    qg_in.ptr() as *const u16,
                    attention_in.ptr() as *const u16,
                    h.ptr() as *const u16,
                    v_new.ptr() as *const u16,
                    o_out.mut_ptr() as *mut u16,
                    chunks.ptr(),
                    dims[0],
                    dims[1],
                    dims[2],
                    dims[3],
                    dims[4],
                    codes.options,
                    codes.scale_bits,
                    layout.code(),
                )
            })
        }
        .unwrap_or_else(|e| panic!("prepared output: {e}"));
    } else {
        // SAFETY: as above.
        unsafe {
            sim::launch(layer_launch(p, layer::OUTPUT_SMEM_BYTES), || {
                kda_kernel::layer::kda_layer_output(
                    q_in.ptr() as *const u16,
                    k_in.ptr() as *const u16,
                    gate_in.ptr(),
                    h.ptr() as *const u16,
                    v_new.ptr() as *const u16,
                    o_out.mut_ptr() as *mut u16,
                    chunks.ptr(),
                    dims[0],
                    dims[1],
                    dims[2],
                    dims[3],
                    dims[4],
                    codes.options,
                    codes.scale_bits,
                    layout.code(),
                )
            })
        }
        .unwrap_or_else(|e| panic!("output: {e}"));
    }
    assert!(o.iter().all(|x| x.to_bits() != POISON_BF16), "the output kernel left o unwritten");
    (LayerOutputs { o: o.iter().map(|x| x.to_f32()).collect(), ht }, recurrence.h)
}

/// The last row (token) of each chunk of `table` (the chunk table's words: first token, rows).
fn table_last_rows(table: &[u32]) -> Vec<usize> {
    table.chunks(2).map(|w| (w[0] + w[1] - 1) as usize).collect()
}

/// `o` as the fused recurrence forms it from the fused prepare kernel's `qg` and `attention`:
/// `scale (qg bf16(S) + P bf16(Vn))` in f32 per chunk, `bf16(S)` the chunk's entry state `h` and
/// `bf16(Vn)` its `v_new` (both as the recurrence rounds them), rounded to bf16. Checks that
/// each row of `P` is zero past its diagonal.
fn fused_output(
    p: &LayerProblem,
    (qg, attention): (&[bf16], &[bf16]),
    h: &[bf16],
    v_new: &[bf16],
    layout: StateLayout,
) -> Vec<f32> {
    let s = p.shape;
    let (t, hv, kd, vd) = (p.plan.tokens(), s.value_heads, s.key_dim, s.value_dim);
    let chunk = kda_kernel::layout::CHUNK;
    let scale = f32::from_bits(p.options.codes().scale_bits);
    let value_first = layout == StateLayout::ValueFirst;
    let mut o = vec![0.0f32; t * hv * vd];
    for (c, (t0, rows)) in chunk_table(&p.plan).unwrap().chunks(2).map(|w| (w[0] as usize, w[1] as usize)).enumerate() {
        for i in 0..hv {
            let state = &h[(c * hv + i) * kd * vd..][..kd * vd];
            let s_at = |a: usize, v: usize| state[if value_first { v * kd + a } else { a * vd + v }].to_f32();
            for r in 0..rows {
                let row = (t0 + r) * hv + i;
                let p_row = &attention[row * chunk..][..chunk];
                for (j, x) in p_row.iter().enumerate().skip(r + 1) {
                    assert_eq!(x.to_f32(), 0.0, "P[{r}][{j}] of chunk {c}, head {i}: past the diagonal");
                }
                for v in 0..vd {
                    let inter: f32 = (0..kd).map(|a| qg[row * kd + a].to_f32() * s_at(a, v)).sum();
                    let intra: f32 =
                        (0..=r).map(|j| p_row[j].to_f32() * v_new[((t0 + j) * hv + i) * vd + v].to_f32()).sum();
                    o[row * vd + v] = bf16::from_f32(scale * (inter + intra)).to_f32();
                }
            }
        }
    }
    o
}

/// The layer's token-parallel kernels on the GPU suite's random layers (both kinds, grouped
/// heads, every gate form and option, partial chunks, empty sequences) against the f64
/// definition, within the bounds the GPU suite holds the whole layer to, `o` formed by the
/// output kernel and as the fused pass forms it; every third case with value-first states.
#[test]
fn the_layer_kernels_match_the_definition() {
    for (i, (name, p)) in kda_tests::random_layer_cases().into_iter().enumerate() {
        let layout = if i % 3 == 2 { StateLayout::ValueFirst } else { StateLayout::KeyFirst };
        let want = layer_reference(&p).unwrap();
        let bounds = layer_bounds(&p, &want);
        for output in [LayerOutput::Kernel, LayerOutput::Fused, LayerOutput::Prepared] {
            let errs = run_layer_keeping_h(&p, layout, LayerRecurrence::Reference, output).0.errors(&want);
            println!("{name} {layout:?} {output:?}: o {:.2e} ht {:.2e}, bounds {bounds:?}", errs[0], errs[1]);
            let within = errs.iter().zip(&bounds).all(|(e, b)| e <= b);
            assert!(within, "{name} {layout:?} {output:?}: {errs:?} over {bounds:?}");
        }
    }
}

/// The gate and `beta` read in bf16 give bit for bit what the same values give read in f32 (a
/// bf16 value widens exactly): the layer's prepare kernels (both fused entries and the plain
/// one) and the decode step, on a KDA and a Gated DeltaNet case with a raw gate.
#[test]
fn bf16_gates_and_betas_read_as_the_same_values_in_f32() {
    use kda::layer::TokenDtypes;
    let cases = kda_tests::random_layer_cases();
    let kinds = [LayerKind::Kda, LayerKind::Gdn];
    for kind in kinds {
        let (name, p) = cases
            .iter()
            .find(|(_, p)| p.shape.kind == kind && p.dtypes == TokenDtypes::BF16 && p.a_log.is_some())
            .expect("a bf16 case of each kind with a raw gate");
        // The same values, given in f32.
        let f32s = p.clone().with_dtypes(TokenDtypes::default());
        assert_eq!((&f32s.g, &f32s.beta), (&p.g, &p.beta));
        for output in [LayerOutput::Kernel, LayerOutput::Fused] {
            let run =
                |p: &LayerProblem| run_layer_keeping_h(p, StateLayout::KeyFirst, LayerRecurrence::Reference, output);
            let (bf, f) = (run(p), run(&f32s));
            assert!(bf.0 == f.0 && bf.1 == f.1, "{name} {output:?}: bf16 inputs differ from the same values in f32");
        }
    }
    for case in kda_tests::decode_cases().into_iter().filter(|c| c.p.dtypes == TokenDtypes::BF16) {
        let (slots, fresh) = SlotUse::decode_tables(&case.uses);
        let tables = draft_tables(&case.uses, 1, None, None, &case.pool_shape).unwrap();
        let f32s = case.p.clone().with_dtypes(TokenDtypes::default());
        let (mut bf_pool, mut f_pool) = (case.pool.clone(), case.pool.clone());
        let bf_o = sim_decode(&case.p, &slots, &fresh, &tables, &mut bf_pool);
        let f_o = sim_decode(&f32s, &slots, &fresh, &tables, &mut f_pool);
        // Bits, not values: a padding sequence's rows of `o` stay poisoned (NaN).
        let same = bf_o.iter().zip(&f_o).all(|(a, b)| a.to_bits() == b.to_bits())
            && bf_pool.iter().zip(&f_pool).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{}: bf16 inputs differ from the same values in f32", case.name);
    }
}

/// FLA's layer fixtures through the simulated layer kernels, within the GPU suite's bound over
/// FLA's own error.
#[test]
fn the_layer_kernels_reproduce_the_layer_fixtures() {
    for name in kda_tests::LAYER_FIXTURES {
        let (p, golden) = kda::layer::read_layer_fixture(&kda_tests::fixture(&format!("layer/{name}"))).unwrap();
        let errs = run_layer(&p, StateLayout::KeyFirst, LayerRecurrence::Reference).errors(&golden.reference);
        let [fo, fh] = golden.fla_errors;
        println!(
            "{name}: o {:.2e} ({:.2}x FLA's) ht {:.2e} ({:.2}x FLA's)",
            errs[0],
            errs[0] / fo,
            errs[1],
            errs[1] / fh
        );
        let bound = kda_tests::LAYER_BOUND_OVER_FLA;
        assert!(
            errs[0] <= bound * fo && errs[1] <= bound * fh,
            "{name}: {errs:?} against FLA's {:?}",
            golden.fla_errors
        );
    }
}

/// The decode kernel on the simulator as the launcher runs it (one CTA per sequence, value head
/// and block of `COLS` columns): `p` holds `N * draft` token rows, `slots` and `fresh` one entry
/// per sequence (plus the launcher's padding entry, see `SlotUse::decode_tables`), `parents` and
/// `token_slots` one per token or empty. Returns `o`, poisoned first; `pool` is updated in place.
fn sim_decode<P: PoolElement>(
    p: &LayerProblem,
    slots: &[i64],
    fresh: &[u32],
    tables: &DraftTables,
    pool: &mut [P],
) -> Vec<bf16> {
    sim_decode_in(StateLayout::KeyFirst, p, slots, fresh, tables, pool)
}

/// [`sim_decode`] over a pool of `layout`.
fn sim_decode_in<P: PoolElement>(
    layout: StateLayout,
    p: &LayerProblem,
    slots: &[i64],
    fresh: &[u32],
    tables: &DraftTables,
    pool: &mut [P],
) -> Vec<bf16> {
    use kda_kernel::layout::decode;
    let s = p.shape;
    let codes = kernel_codes(p);
    let words = [s.heads, s.value_heads, s.key_dim, s.value_dim, s.gate_width()].map(|x| x as u32);
    let seqs = slots.len() - 1;
    let mut o = vec![bf16::from_bits(POISON_BF16); p.plan.tokens() * s.value_heads * s.value_dim];
    let opt = |x: &Option<Vec<f32>>| x.as_deref().map_or(sim::Ptr::null(), ptr);
    let table = |t: &Vec<i64>| if t.is_empty() { sim::Ptr::null() } else { ptr(t) };
    let (g_words, beta_words) = (float_words(&p.g, p.dtypes.g), float_words(&p.beta, p.dtypes.beta));
    let (q, k, v, g, beta) = (ptr(&p.q), ptr(&p.k), ptr(&p.v), float_ptr(&g_words), float_ptr(&beta_words));
    let (a_log, dt_bias, slots_ptr, fresh_ptr) = (opt(&p.a_log), opt(&p.dt_bias), ptr(slots), ptr(fresh));
    let (parents, token_slots) = (table(&tables.parents), table(&tables.token_slots));
    let (pool_ptr, o_ptr) = (ptr_mut(pool), ptr_mut(&mut o));
    let launch = Launch {
        grid: seqs * s.value_heads * (s.value_dim / decode::COLS),
        block: decode::THREADS,
        shared_bytes: decode::SMEM_BYTES,
    };
    // SAFETY: `draft` token rows per sequence in every tensor; the slots were checked against the
    // pool (`slot_uses`, `draft_tables`).
    unsafe {
        sim::launch(launch, || {
            kda_kernel::decode::kda_decode_step(
                q.ptr() as *const u16,
                k.ptr() as *const u16,
                v.ptr() as *const u16,
                g.ptr(),
                beta.ptr(),
                a_log.ptr(),
                dt_bias.ptr(),
                slots_ptr.ptr(),
                fresh_ptr.ptr(),
                parents.ptr(),
                token_slots.ptr(),
                pool_ptr.mut_ptr() as *mut f32,
                o_ptr.mut_ptr() as *mut u16,
                P::DTYPE.code(),
                layout.code(),
                tables.draft as u32,
                words[0],
                words[1],
                words[2],
                words[3],
                words[4],
                codes.options,
                codes.gate_mode,
                codes.lower_bound_bits,
                codes.scale_bits,
            )
        })
    }
    .unwrap_or_else(|e| panic!("decode: {e}"));
    o
}

/// The decode step on the simulator over the GPU suite's cases (`kda_tests::decode_cases`): both
/// kinds, grouped heads, the gate forms and options, padding and fresh sequences.
#[test]
fn the_decode_step_matches_the_pooled_reference() {
    for case in kda_tests::decode_cases() {
        let (slots, fresh) = SlotUse::decode_tables(&case.uses);
        let tables = draft_tables(&case.uses, 1, None, None, &case.pool_shape).unwrap();
        let mut pool = case.pool.clone();
        let o = sim_decode(&case.p, &slots, &fresh, &tables, &mut pool);
        case.check(&pool, &o);
        // The same step over the pool's states value-first.
        let (kd, vd) = (case.p.shape.key_dim, case.p.shape.value_dim);
        let mut pool = transposed(&case.pool, kd, vd);
        let o = sim_decode_in(StateLayout::ValueFirst, &case.p, &slots, &fresh, &tables, &mut pool);
        case.check(&transposed(&pool, vd, kd), &o);
    }
}

/// Speculative verify on the simulator: each case's tokens as a chain and as a tree, each
/// token's state into a slot of its own, against the definition (`verify_tree_reference`), and
/// bit for bit against one-token calls along each token's path (what `DecodePlan::verify`
/// promises).
#[test]
fn verify_steps_match_the_definition_and_one_token_calls_bit_for_bit() {
    for case in kda_tests::verify_cases() {
        let pool = case.pool.clone();
        check_verify(&case, pool, |x| x, DECODE_STATE_BOUND * case.draft as f64);
    }
}

/// The same with bf16 pools: every written state rounded, a chain's state rounded after each
/// token as if written and read back, so that verify stays bit for bit the one-token calls; within
/// bf16's rounding of the definition.
#[test]
fn bf16_pools_round_every_write_and_verify_stays_bit_exact() {
    for mut case in kda_tests::verify_cases() {
        case.pool_shape.dtype = StateDtype::Bf16;
        case.pool = case.pool.iter().map(|&x| StateDtype::Bf16.stored(x)).collect();
        let pool: Vec<bf16> = case.pool.iter().map(|&x| bf16::from_f32(x)).collect();
        check_verify(&case, pool, bf16::to_f32, BF16_STATE_BOUND);
    }
}

/// How far a bf16 pool's states land from the f64 definition after a few tokens: bf16's rounding
/// (2^-9 relative per element) on every write, with headroom.
const BF16_STATE_BOUND: f64 = 1e-2;

/// One verify case on the simulator with its pool of `P` (`pool`, the case's pool in that element
/// type): each token's output and state against the definition (states within `state_bound`),
/// and bit for bit against one-token calls along the token's path.
fn check_verify<P: PoolElement + Copy>(case: &VerifyCase, pool: Vec<P>, as_f32: impl Fn(P) -> f32, state_bound: f64) {
    let s = case.p.shape;
    let (hv, kd, vd, draft) = (s.value_heads, s.key_dim, s.value_dim, case.draft);
    let state = hv * kd * vd;
    let (slots, fresh) = SlotUse::decode_tables(&case.uses);
    let tables =
        draft_tables(&case.uses, draft, Some(&case.parents), Some(&case.token_slots), &case.pool_shape).unwrap();
    let mut got_pool = pool.clone();
    let o = sim_decode(&case.p, &slots, &fresh, &tables, &mut got_pool);
    let want = case.reference();
    let row = hv * vd;
    let states = |pool: &[P], slot: usize| -> Vec<f32> {
        pool[slot * state..(slot + 1) * state].iter().map(|&x| as_f32(x)).collect()
    };
    for (n, use_) in case.uses.iter().enumerate() {
        let Some(slot) = use_.slot() else {
            let rows = &o[n * draft * row..(n + 1) * draft * row];
            assert!(rows.iter().all(|x| x.to_bits() == POISON_BF16), "{}: padding {n} wrote o", case.name);
            continue;
        };
        for (t, (want_o, want_s)) in want[n].iter().enumerate() {
            let r = n * draft + t;
            let got_o: Vec<f32> = o[r * row..(r + 1) * row].iter().map(|x| x.to_f32()).collect();
            let got_s = states(&got_pool, case.token_slots[r] as usize);
            let (eo, es) = (kda::rel_error(&got_o, want_o), kda::rel_error(&got_s, want_s));
            assert!(eo < DECODE_O_BOUND, "{}: sequence {n} token {t}: o {eo:.2e}", case.name);
            assert!(es < state_bound, "{}: sequence {n} token {t}: state {es:.2e}", case.name);

            // The same token by one-token calls along its path, on a copy of the pool.
            let mut path = vec![t];
            while let Ok(p) = usize::try_from(case.parents[n * draft + *path.last().unwrap()]) {
                path.push(p);
            }
            let mut scratch = pool.clone();
            let mut last_o = Vec::new();
            for (step, &u) in path.iter().rev().enumerate() {
                let single = case.p.select(&[(n, u..u + 1)]);
                let first = if step == 0 { case.uses[n] } else { SlotUse::Continue(slot) };
                let (slots1, fresh1) = SlotUse::decode_tables(&[first]);
                let tables1 = draft_tables(&[first], 1, None, None, &case.pool_shape).unwrap();
                last_o = sim_decode(&single, &slots1, &fresh1, &tables1, &mut scratch);
            }
            let bits = |x: &[bf16]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&last_o), bits(&o[r * row..(r + 1) * row]), "{}: {n}/{t}: o bits", case.name);
            let same = states(&scratch, slot).iter().zip(&got_s).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{}: {n}/{t}: state bits", case.name);
        }
    }
    println!(
        "{} ({:?} pool): {draft} tokens per sequence, every token within bounds and bit-exact",
        case.name,
        P::DTYPE
    );
}

/// The whole layer's separate path as every GPU but Hopper runs it (prepare, the portable
/// tensor-core recurrence, output; the fused prepare kernel and the output kernel on its
/// attention where a CTA gets 110 KB, every third case) on one case of each kind and both state
/// layouts, within the GPU suite's bounds.
#[test]
fn the_layer_runs_on_the_portable_kernels() {
    for (i, (name, p)) in kda_tests::random_layer_cases().into_iter().enumerate().filter(|(i, _)| i % 5 == 0) {
        let layout = if i % 2 == 0 { StateLayout::KeyFirst } else { StateLayout::ValueFirst };
        let output = if i % 3 == 0 { LayerOutput::Prepared } else { LayerOutput::Kernel };
        let want = layer_reference(&p).unwrap();
        let errs = run_layer_keeping_h(&p, layout, LayerRecurrence::Portable, output).0.errors(&want);
        let bounds = layer_bounds(&p, &want);
        println!("{name} {layout:?} {output:?}: o {:.2e} ht {:.2e}, bounds {bounds:?}", errs[0], errs[1]);
        let within = errs.iter().zip(&bounds).all(|(e, b)| e <= b);
        assert!(within, "{name} {layout:?} {output:?}: {errs:?} over {bounds:?}");
    }
}

/// The whole layer on the portable kernel's fused pass (the fused prepare kernel, then the
/// recurrence forming `o` in its chunk loop), in one or two consumer groups, on the random
/// layers whose sizes the pass runs (both kinds, both state layouts), against the f64
/// definition within the GPU suite's bounds, and against `o` as [`fused_output`] forms it from
/// the portable recurrence's `h` and `v_new` (the same operands: within bf16 rounding).
#[test]
fn the_fused_pass_runs_on_the_portable_kernel() {
    let mut ran = 0;
    for (i, (name, p)) in kda_tests::random_layer_cases().into_iter().enumerate().filter(|(i, _)| i % 3 == 0) {
        let s = p.shape;
        if !portable::FUSED_VARIANTS.iter().any(|&(k, _)| k == s.key_dim) || !s.value_dim.is_multiple_of(64) {
            continue;
        }
        let layout = if i % 2 == 0 { StateLayout::KeyFirst } else { StateLayout::ValueFirst };
        let want = layer_reference(&p).unwrap();
        let bounds = layer_bounds(&p, &want);
        let (emulated, _) = run_layer_keeping_h(&p, layout, LayerRecurrence::Portable, LayerOutput::Fused);
        // One and two groups in turn (each case in both would double the test's minutes).
        {
            let groups = 1 + ran % 2;
            let recurrence = LayerRecurrence::PortableFused { groups };
            let (got, _) = run_layer_keeping_h(&p, layout, recurrence, LayerOutput::Fused);
            let errs = got.errors(&want);
            let from_emulation = [kda::rel_error(&got.o, &emulated.o), kda::rel_error(&got.ht, &emulated.ht)];
            println!(
                "{name} {layout:?} {groups} groups: o {:.2e} ht {:.2e}, bounds {bounds:?}; from the emulated pass {:.2e} {:.2e}",
                errs[0], errs[1], from_emulation[0], from_emulation[1]
            );
            assert!(
                errs.iter().zip(&bounds).all(|(e, b)| e <= b),
                "{name} {layout:?} {groups}: {errs:?} over {bounds:?}"
            );
            assert!(from_emulation[0] < FUSED_EMULATION_SLACK, "{name}: o {from_emulation:?} from the emulated pass");
            assert_eq!(from_emulation[1], 0.0, "{name}: ht is the recurrence's, bit for bit");
        }
        ran += 1;
    }
    assert!(ran >= 2, "the random layers hold cases of the fused pass's sizes");
}

/// How far the portable fused pass's `o` may lie from [`fused_output`]'s on the same operands:
/// both round `scale (q Γ S + P Vn)` to bf16 (2^-9 relative at most), from f32 sums in another
/// order.
const FUSED_EMULATION_SLACK: f64 = 4e-3;

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 24, failure_persistence: None, ..Default::default() })]
    /// Pool indices fuzzed on the simulated decode step (padding, fresh sequences, slots anywhere
    /// in pools of 1 to 11 slots, both kinds) against a reference that copies the live
    /// sequences' states out of the pool, runs the layer on them, and copies the final states
    /// back: every live sequence's `o` and slot match, every other slot keeps its bits, every
    /// padding sequence's `o` keeps its poison.
    #[test]
    fn decode_pool_indices_fuzzed_against_copy_out_and_back(
        slots in 1usize..12,
        picks in proptest::collection::vec((proptest::option::of(0usize..64), proptest::bool::ANY), 1..6),
        gdn in proptest::bool::ANY,
        seed in 0u64..1000,
    ) {
        use kda::layer::{GateInput, LayerKind, LayerOptions, LayerShape};
        use kda::pool::{PoolShape, slot_uses};
        // Distinct slots for the live sequences (a pick names a slot modulo the pool; taken ones
        // become padding).
        let mut taken = std::collections::HashSet::new();
        let (indices, fresh): (Vec<i64>, Vec<bool>) = picks
            .iter()
            .map(|&(pick, fresh)| match pick.map(|x| x % slots).filter(|&x| taken.insert(x)) {
                Some(slot) => (slot as i64, fresh),
                None => (-1, false),
            })
            .unzip();
        let kind = if gdn { LayerKind::Gdn } else { LayerKind::Kda };
        let shape = LayerShape { kind, heads: 1, value_heads: 2, key_dim: 64, value_dim: 64 };
        let options = LayerOptions { scale: 0.125, l2norm_qk: gdn, beta_sigmoid: !gdn, gate: GateInput::Softplus };
        let n = indices.len();
        let p = kda_tests::random_layer_problem(&vec![1; n], shape, options, false, seed);
        let pool_shape = PoolShape::for_layer(&shape, slots, StateLayout::KeyFirst, StateDtype::F32);
        let pool: Vec<f32> = kda::inputs::random_pool(&pool_shape, seed);
        let uses = slot_uses(&indices, &fresh, &pool_shape).unwrap();
        let (slot_table, fresh_table) = SlotUse::decode_tables(&uses);
        let tables = draft_tables(&uses, 1, None, None, &pool_shape).unwrap();
        let mut got_pool = pool.clone();
        let got_o = sim_decode(&p, &slot_table, &fresh_table, &tables, &mut got_pool);

        // The reference: the live sequences' states out, the layer on them, the final states back.
        let state = pool_shape.value_heads * pool_shape.state_len();
        let live: Vec<usize> = (0..n).filter(|&i| uses[i].slot().is_some()).collect();
        let mut want_pool = pool.clone();
        let row = shape.value_heads * shape.value_dim;
        if !live.is_empty() {
            let mut sub = p.select(&live.iter().map(|&i| (i, 0..1)).collect::<Vec<_>>());
            let h0: Vec<f32> = live
                .iter()
                .flat_map(|&i| match uses[i] {
                    SlotUse::Continue(s) => pool[s * state..(s + 1) * state].to_vec(),
                    _ => vec![0.0; state],
                })
                .collect();
            sub.h0 = Some(h0);
            let want = kda::layer::layer_reference(&sub).unwrap();
            for (j, &i) in live.iter().enumerate() {
                let slot = uses[i].slot().unwrap();
                want_pool[slot * state..(slot + 1) * state].copy_from_slice(&want.ht[j * state..(j + 1) * state]);
                let got: Vec<f32> = got_o[i * row..(i + 1) * row].iter().map(|x| x.to_f32()).collect();
                let e = kda::rel_error(&got, &want.o[j * row..(j + 1) * row]);
                proptest::prop_assert!(e < DECODE_O_BOUND, "sequence {}: o {:.2e}", i, e);
            }
        }
        for slot in 0..slots {
            let (got, want) = (&got_pool[slot * state..(slot + 1) * state], &want_pool[slot * state..(slot + 1) * state]);
            if uses.iter().any(|u| u.slot() == Some(slot)) {
                let e = kda::rel_error(got, want);
                proptest::prop_assert!(e < DECODE_STATE_BOUND, "slot {}: state {:.2e}", slot, e);
            } else {
                proptest::prop_assert!(got.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits()), "slot {} changed", slot);
            }
        }
        for i in (0..n).filter(|&i| uses[i].slot().is_none()) {
            proptest::prop_assert!(got_o[i * row..(i + 1) * row].iter().all(|x| x.to_bits() == POISON_BF16));
        }
    }
}

/// `kda_pool_copy` on the simulator, one direction, as the launcher runs it: one CTA per
/// (sequence, `PER_CTA` f32 of its state).
fn sim_pool_copy<P: PoolElement>(
    pool: &mut [P],
    packed: &mut [f32],
    slots: &[i64],
    fresh: &[u32],
    state_len: usize,
    gather: bool,
) {
    use kda_kernel::abi::PoolCopyCode;
    use kda_kernel::layout::pool_copy::{PER_CTA, THREADS};
    let seqs = slots.len() - 1;
    let launch = Launch { grid: seqs * state_len.div_ceil(PER_CTA), block: THREADS, shared_bytes: 0 };
    let (pool_ptr, packed_ptr, slots_ptr, fresh_ptr) = (ptr_mut(pool), ptr_mut(packed), ptr(slots), ptr(fresh));
    let direction = if gather { PoolCopyCode::Gather } else { PoolCopyCode::Scatter } as u32;
    // SAFETY: the pool holds every slot named, `packed` one state per sequence.
    unsafe {
        sim::launch(launch, || {
            kda_kernel::pool::kda_pool_copy(
                pool_ptr.mut_ptr() as *mut f32,
                packed_ptr.mut_ptr(),
                slots_ptr.ptr(),
                fresh_ptr.ptr(),
                state_len as u32,
                direction,
                P::DTYPE.code(),
            )
        })
    }
    .unwrap_or_else(|e| panic!("pool copy: {e}"));
}

/// The layer's prefill over a pool as `Kda::launch_layer_pooled` runs it (gather, the layer on
/// the portable path, scatter) on the simulator, against `layer_reference_pooled`: a sequence
/// continuing its slot, a padding one with no tokens, a fresh one, one ending on a chunk
/// boundary; every slot no live sequence names keeps its bits.
#[test]
fn the_pooled_prefill_matches_the_pooled_reference() {
    let case = kda_tests::PooledPrefillCase::new(kda::layer::LayerKind::Gdn, 128, 300);
    let (slots, fresh_table) = SlotUse::decode_tables(&case.uses);
    let state = case.pool_shape.value_heads * case.pool_shape.state_len();
    let mut got_pool = case.pool.clone();
    let mut packed = vec![f32::from_bits(POISON_F32); case.uses.len() * state];
    sim_pool_copy(&mut got_pool, &mut packed, &slots, &fresh_table, state, true);
    let with_h0 = LayerProblem { h0: Some(packed), ..case.p.clone() };
    let mut out = run_layer(&with_h0, StateLayout::KeyFirst, LayerRecurrence::Portable);
    sim_pool_copy(&mut got_pool, &mut out.ht, &slots, &fresh_table, state, false);
    case.check(&got_pool, &out.o);
}

/// The pool copy with a bf16 pool: gathering reads each live sequence's slot exactly (zeros for
/// fresh and padding ones), scattering rounds to bf16 and writes only the live sequences' slots.
#[test]
fn the_pool_copy_reads_bf16_exactly_and_rounds_what_it_writes() {
    let state = 2 * 64 * 32;
    let pool: Vec<bf16> = (0..6 * state).map(|i| bf16::from_f32((i % 97) as f32 / 7.0 - 3.0)).collect();
    let (slots, fresh) = ([4i64, -1, 1, 0, -1], [0u32, 0, 1, 0, 0]);
    let mut got = pool.clone();
    let mut packed = vec![f32::from_bits(POISON_F32); 4 * state];
    sim_pool_copy(&mut got, &mut packed, &slots, &fresh, state, true);
    for (n, (&slot, &f)) in slots[..4].iter().zip(&fresh).enumerate() {
        let row = &packed[n * state..(n + 1) * state];
        if slot < 0 || f != 0 {
            assert!(row.iter().all(|&x| x == 0.0), "sequence {n}: zeros");
        } else {
            let slot = slot as usize;
            assert!(row.iter().zip(&pool[slot * state..]).all(|(a, b)| *a == b.to_f32()), "sequence {n}: exact");
        }
    }
    let written: Vec<f32> = (0..4 * state).map(|i| i as f32 * 1.0001 + 0.3).collect();
    let mut back = written.clone();
    sim_pool_copy(&mut got, &mut back, &slots, &fresh, state, false);
    for slot in 0..6 {
        let here = &got[slot * state..(slot + 1) * state];
        match slots[..4].iter().position(|&s| s == slot as i64) {
            Some(n) => assert!(here.iter().zip(&written[n * state..]).all(|(a, b)| *a == bf16::from_f32(*b))),
            None => assert_eq!(here, &pool[slot * state..(slot + 1) * state], "slot {slot} untouched"),
        }
    }
}

/// The split merge on the simulator (`kda_split_merge`, as the launcher runs it: one CTA per
/// merge record, value head and block of `COLS` columns): random segment maps `[M | B]` and
/// initial states chained into every segment's entry state, `entry(0) = h0`, `entry(1)` the
/// first map's `B` columns (the first segment's exit state; its key columns NaN, as the
/// pre-scan leaves them unwritten), `entry(s + 1) = M_s entry(s) + B_s`, against the same chain
/// in f64, in both state layouts.
#[test]
fn the_split_merge_chains_segment_maps_into_entry_states() {
    let (heads, kd, vd) = (2usize, 64usize, 48usize);
    let plan = Plan::from_lengths(&[600, 70, 130]);
    let split = SplitPlan::cut(&plan, 2);
    let (segments, maps_rows) = (split.segments().len(), split.maps());
    let wide = kd + vd;
    let mut words = kda::inputs::random_words(5, 1).map(kda::inputs::unit_uniform);
    let mut draw =
        |n: usize, scale: f64| -> Vec<f32> { (0..n).map(|_| ((words.next().unwrap() - 0.5) * scale) as f32).collect() };
    let mut maps = draw(maps_rows * heads * kd * wide, 0.2);
    let h0 = draw(plan.num_seqs() * heads * kd * vd, 1.0);
    // The first maps' key columns are never written.
    let firsts = (0..plan.num_seqs()).scan(0, |map, n| {
        let first = *map;
        *map += split.segments_of(n).len() - 1;
        Some((split.segments_of(n).len() > 1).then_some(first))
    });
    for map in firsts.flatten().collect::<Vec<_>>() {
        for row in maps[map * heads * kd * wide..][..heads * kd * wide].chunks_exact_mut(wide) {
            row[..kd].fill(f32::NAN);
        }
    }
    for layout in [StateLayout::KeyFirst, StateLayout::ValueFirst] {
        let at = |a: usize, c: usize| if layout == StateLayout::KeyFirst { a * vd + c } else { c * kd + a };
        let mut entries = vec![f32::from_bits(POISON_F32); segments * heads * kd * vd];
        sim_merge(&split, (&maps, ptr(&h0)), &mut entries, [heads, kd, vd], layout);
        // The chain in f64, per sequence and head.
        let (mut first_map, mut first_entry) = (0, 0);
        for n in 0..plan.num_seqs() {
            let segs = split.segments_of(n);
            for i in 0..heads {
                // h0 is in the layout too.
                let mut entry: Vec<f64> =
                    (0..kd * vd).map(|e| h0[(n * heads + i) * kd * vd + at(e / vd, e % vd)] as f64).collect();
                for s in 0..segs.len() {
                    let row = ((first_entry + s) * heads + i) * kd * vd;
                    let got: Vec<f32> = (0..kd * vd).map(|e| entries[row + at(e / vd, e % vd)]).collect();
                    let want: Vec<f32> = entry.iter().map(|&x| x as f32).collect();
                    let err = kda::rel_error(&got, &want);
                    assert!(err < 1e-5, "{layout:?} sequence {n} head {i} segment {s}: {err:.2e}");
                    if s + 1 < segs.len() {
                        let m = &maps[((first_map + s) * heads + i) * kd * wide..][..kd * wide];
                        entry = (0..kd * vd)
                            .map(|e| {
                                let (a, c) = (e / vd, e % vd);
                                let product = || (0..kd).map(|b| m[a * wide + b] as f64 * entry[b * vd + c]).sum();
                                let me: f64 = if s == 0 { 0.0 } else { product() };
                                me + m[a * wide + kd + c] as f64
                            })
                            .collect();
                    }
                }
            }
            first_map += segs.len() - 1;
            first_entry += segs.len();
        }
    }
}

/// The checkpoint kernel on the simulator as the launcher runs it (one CTA per checkpoint, value
/// head and block of columns), from the layer's chunk entry states `h` into `pool`.
fn sim_advance<P: PoolElement>(
    p: &LayerProblem,
    (h, h_layout): (&[bf16], StateLayout),
    tables: &CheckpointTables,
    (pool, pool_layout): (&mut [P], StateLayout),
) {
    use kda_kernel::layout::decode;
    let s = p.shape;
    let codes = kernel_codes(p);
    let words = [s.heads, s.value_heads, s.key_dim, s.value_dim, s.gate_width()].map(|x| x as u32);
    let opt = |x: &Option<Vec<f32>>| x.as_deref().map_or(sim::Ptr::null(), ptr);
    let (g_words, beta_words) = (float_words(&p.g, p.dtypes.g), float_words(&p.beta, p.dtypes.beta));
    let (q, k, v, h) = (ptr(&p.q), ptr(&p.k), ptr(&p.v), ptr(h));
    let (g, beta) = (float_ptr(&g_words), float_ptr(&beta_words));
    let (a_log, dt_bias) = (opt(&p.a_log), opt(&p.dt_bias));
    let (sources, first_rows, counts, slots) =
        (ptr(&tables.sources), ptr(&tables.first_rows), ptr(&tables.counts), ptr(&tables.slots));
    let pool_ptr = ptr_mut(pool);
    let launch = Launch {
        grid: tables.slots.len() * s.value_heads * (s.value_dim / decode::COLS),
        block: decode::THREADS,
        shared_bytes: decode::SMEM_BYTES,
    };
    // SAFETY: the tables were checked against the batch and the pool (`checkpoint_tables`); `h`
    // holds every chunk's states.
    unsafe {
        sim::launch(launch, || {
            kda_kernel::decode::kda_advance_states(
                q.ptr() as *const u16,
                k.ptr() as *const u16,
                v.ptr() as *const u16,
                g.ptr(),
                beta.ptr(),
                a_log.ptr(),
                dt_bias.ptr(),
                h.ptr() as *const u16,
                sources.ptr(),
                first_rows.ptr(),
                counts.ptr(),
                slots.ptr(),
                pool_ptr.mut_ptr() as *mut f32,
                P::DTYPE.code(),
                pool_layout.code(),
                h_layout.code(),
                words[0],
                words[1],
                words[2],
                words[3],
                words[4],
                codes.options,
                codes.gate_mode,
                codes.lower_bound_bits,
            )
        })
    }
    .unwrap_or_else(|e| panic!("checkpoints: {e}"));
}

/// Checkpoints for prefix caching on the simulator (`kda_tests::checkpoint_cases`): the layer on
/// the portable kernels leaves its chunk entry states, and the checkpoint kernel advances them
/// into an f32 pool (and, for every other case, a bf16 one), each checkpoint against the state of
/// the prompt cut there; every slot not named keeps its poison.
#[test]
fn checkpoints_match_the_prompts_cut_there() {
    for (i, case) in kda_tests::checkpoint_cases().into_iter().enumerate() {
        let p = &case.p;
        let (kd, vd) = (p.shape.key_dim, p.shape.value_dim);
        let (_, h) = run_layer_keeping_h(p, StateLayout::KeyFirst, LayerRecurrence::Portable, LayerOutput::Kernel);
        let pool_shape = PoolShape::for_layer(&p.shape, case.slots, StateLayout::KeyFirst, StateDtype::F32);
        let tables = checkpoint_tables(&p.plan, &case.checkpoints, &pool_shape).unwrap();
        let mut pool = vec![f32::from_bits(POISON_F32); pool_shape.len().unwrap()];
        sim_advance(p, (&h, StateLayout::KeyFirst), &tables, (&mut pool, StateLayout::KeyFirst));
        case.check(StateDtype::F32, &pool);
        if i % 2 == 0 {
            let mut pool = vec![bf16::from_bits(POISON_BF16); pool_shape.len().unwrap()];
            sim_advance(p, (&h, StateLayout::KeyFirst), &tables, (&mut pool, StateLayout::KeyFirst));
            case.check(StateDtype::Bf16, &pool);
        } else {
            // A value-first layer's `h` into a value-first pool.
            let (_, h) =
                run_layer_keeping_h(p, StateLayout::ValueFirst, LayerRecurrence::Portable, LayerOutput::Kernel);
            let mut pool = vec![f32::from_bits(POISON_F32); pool_shape.len().unwrap()];
            sim_advance(p, (&h, StateLayout::ValueFirst), &tables, (&mut pool, StateLayout::ValueFirst));
            case.check(StateDtype::F32, &transposed(&pool, vd, kd));
        }
    }
}
