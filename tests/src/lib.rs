//! Shared helpers of the integration tests: a GPU runner that surrounds every input and output with
//! guard regions, poisons the outputs, and checks afterwards that each output element was written
//! and no guard byte changed.

use half::bf16;
use kda::columns::ColumnMode;
pub use kda::inputs::random_layer_problem;
use kda::layer::{LayerOutputs, LayerProblem};
use kda::model::{Gates, ModelShape, ModelView, StateLayout};
use kda::split::{SplitMode, SplitPlan};
use kda::{DevicePlan, KdaError, KdaInputs, KdaOutputs, RowStrides, Strides, Tensor};
use kda::{Kda, Kernel, Outputs, Plan, Problem, precision};
use proptest::prelude::*;
use std::path::PathBuf;
use std::sync::Arc;

use cudarc::driver::CudaSlice;
pub use cudarc::driver::CudaStream;

/// Elements of guard before and after every device tensor: a multiple of 16 bytes for every
/// element type, so the tensor between them keeps the launcher's alignment.
pub const GUARD: usize = 256;
/// Bits written before a run into every output element: a quiet NaN the kernels never produce
/// from finite inputs, so an element still holding it was not written.
pub const POISON_BF16: u16 = 0x7fc1;
/// f32 counterpart of [`POISON_BF16`].
pub const POISON_F32: u32 = 0x7fc0_0001;
/// Bits of the guard regions around outputs: a finite value, so a stray write of any result is
/// distinguishable only by comparing bits.
pub const SENTINEL_BF16: u16 = 0x3f9d;
/// f32 counterpart of [`SENTINEL_BF16`].
pub const SENTINEL_F32: u32 = 0x3f9d_70a4;

/// The device, or a loud failure: the GPU suite never passes without one.
pub struct Gpu {
    /// Loaded kernels.
    pub kda: Kda,
    /// Stream every launch runs on.
    pub stream: Arc<CudaStream>,
}

impl Gpu {
    /// Opens device 0, panicking with the typed reason when there is none (no driver, no device,
    /// a device older than sm_80): the GPU suite fails loudly without a GPU.
    pub fn open() -> Self {
        match Kda::open(0) {
            Ok((kda, stream)) => Self { kda, stream },
            Err(e) => panic!("GPU suite: {e}; this suite needs an NVIDIA GPU (sm_80 or newer)"),
        }
    }
}

fn guarded<T: Copy + cudarc::driver::DeviceRepr>(stream: &Arc<CudaStream>, data: &[T], guard: T) -> CudaSlice<T> {
    let mut host = vec![guard; data.len() + 2 * GUARD];
    host[GUARD..GUARD + data.len()].copy_from_slice(data);
    stream.clone_htod(&host).expect("upload")
}

fn check_guards<T: Copy + PartialEq + std::fmt::Debug>(name: &str, host: &[T], sentinel: T) {
    let n = host.len() - GUARD;
    for (i, v) in host[..GUARD].iter().chain(&host[n..]).enumerate() {
        assert_eq!(*v, sentinel, "{name}: guard element {i} overwritten (a write outside the tensor)");
    }
}

/// Runs `kernel` on `p` with guarded, poisoned buffers and returns the outputs after checking that
/// every output element was written and every guard is intact. Inputs are surrounded by NaN, so an
/// out-of-bounds read shows up as a NaN in the outputs.
pub fn run_guarded(gpu: &Gpu, p: &Problem, kernel: Kernel) -> Outputs {
    run_model_guarded(gpu, &p.model_view(), Strides::PACKED, kernel).expect("launch")
}

/// [`run_guarded`] for a problem of the generalized recurrence with its token-major tensors at
/// `strides`, every sequence whole (`SplitMode::Off`; see [`run_split_guarded`]): the elements
/// between input rows are NaN (a read of one shows in the outputs), those between `v_new`'s rows
/// hold the guard sentinel and must keep it. A launch the kernels refuse returns its error, with
/// nothing written.
pub fn run_model_guarded(gpu: &Gpu, p: &ModelView<'_>, strides: Strides, kernel: Kernel) -> Result<Outputs, KdaError> {
    run_split_guarded(gpu, p, strides, kernel, SplitMode::Off).map(|(out, _)| out)
}

/// [`run_model_guarded`] with long sequences split as `split` says; also returns the plan's
/// split.
pub fn run_split_guarded(
    gpu: &Gpu,
    p: &ModelView<'_>,
    strides: Strides,
    kernel: Kernel,
    split: SplitMode,
) -> Result<(Outputs, SplitPlan), KdaError> {
    run_columns_guarded(gpu, p, strides, kernel, split, ColumnMode::Auto)
}

/// [`run_split_guarded`] with the Hopper kernel's column blocks as `columns` says.
pub fn run_columns_guarded(
    gpu: &Gpu,
    p: &ModelView<'_>,
    strides: Strides,
    kernel: Kernel,
    split: SplitMode,
    columns: ColumnMode,
) -> Result<(Outputs, SplitPlan), KdaError> {
    let s = &gpu.stream;
    let plan = DevicePlan::model(s, p.plan.clone(), &p.shape)?
        .with_strides(strides)?
        .with_split(s, split)?
        .with_columns(s, columns)?;
    let d = plan.dims();
    let nan_bf = bf16::NAN;
    let laid_bf = |t: Tensor, v: &[bf16]| guarded(s, &strides.scatter(&d, t, v, nan_bf), nan_bf);
    let laid_f = |t: Tensor, v: &[f32]| guarded(s, &strides.scatter(&d, t, v, f32::NAN), f32::NAN);
    let (k, w, u) = (laid_bf(Tensor::K, p.k), laid_bf(Tensor::W, p.w), laid_bf(Tensor::U, p.u));
    let g = p.g.map(|g| laid_f(Tensor::G, g));
    let gk = p.gk.map(|gk| laid_f(Tensor::Gk, gk));
    let h0 = p.h0.map(|h0| guarded(s, h0, f32::NAN));
    let sent_bf = bf16::from_bits(SENTINEL_BF16);
    let sent_f = f32::from_bits(SENTINEL_F32);
    let poison_bf = bf16::from_bits(POISON_BF16);
    let v_new_rows = strides.scatter(&d, Tensor::VNew, &vec![poison_bf; d.value_len()], sent_bf);
    let mut h = guarded(s, &vec![poison_bf; d.h_len()], sent_bf);
    let mut v_new = guarded(s, &v_new_rows, sent_bf);
    let mut ht = guarded(s, &vec![f32::from_bits(POISON_F32); d.state_len()], sent_f);
    let len = |t: Tensor| strides.len_of(&d, t).expect("sizes fit");
    {
        let inputs = KdaInputs {
            k: k.slice(GUARD..GUARD + len(Tensor::K)),
            w: w.slice(GUARD..GUARD + len(Tensor::W)),
            u: u.slice(GUARD..GUARD + len(Tensor::U)),
            g: g.as_ref().map(|g| g.slice(GUARD..GUARD + len(Tensor::G))),
            gk: gk.as_ref().map(|gk| gk.slice(GUARD..GUARD + len(Tensor::Gk))),
            h0: h0.as_ref().map(|h0| h0.slice(GUARD..GUARD + d.state_len())),
        };
        let mut outputs = KdaOutputs {
            h: h.slice_mut(GUARD..GUARD + d.h_len()),
            v_new: v_new.slice_mut(GUARD..GUARD + len(Tensor::VNew)),
            ht: Some(ht.slice_mut(GUARD..GUARD + d.state_len())),
        };
        gpu.kda.launch(s, &plan, &inputs, &mut outputs, kernel)?;
    }
    s.synchronize().expect("kernel failed");
    let h = s.clone_dtoh(&h).expect("download");
    let v_new = s.clone_dtoh(&v_new).expect("download");
    let ht = s.clone_dtoh(&ht).expect("download");
    check_guards("h", &h, sent_bf);
    check_guards("v_new", &v_new, sent_bf);
    check_guards("ht", &ht, sent_f);
    let v_new = &v_new[GUARD..GUARD + len(Tensor::VNew)];
    // Between strided rows: untouched.
    let mut inside = vec![false; v_new.len()];
    for (_, at, width) in strides.rows(&d, Tensor::VNew) {
        inside[at..at + width].iter_mut().for_each(|x| *x = true);
    }
    let gaps = v_new.iter().zip(&inside).filter(|(x, i)| !**i && x.to_bits() != SENTINEL_BF16).count();
    assert_eq!(gaps, 0, "v_new: elements between the strided rows were written");
    let out = Outputs {
        h: h[GUARD..GUARD + d.h_len()].to_vec(),
        v_new: strides.gather(&d, Tensor::VNew, v_new),
        ht: ht[GUARD..GUARD + d.state_len()].to_vec(),
    };
    assert_all_written("h", out.h.iter().map(|x| x.to_bits() as u32), POISON_BF16 as u32);
    assert_all_written("v_new", out.v_new.iter().map(|x| x.to_bits() as u32), POISON_BF16 as u32);
    assert_all_written("ht", out.ht.iter().map(|x| x.to_bits()), POISON_F32);
    // The split of the kernel that ran: the portable kernel plans its own.
    Ok((out, plan.split_plan_of(gpu.kda.resolve(kernel))))
}

fn assert_all_written(name: &str, bits: impl Iterator<Item = u32>, poison: u32) {
    let unwritten = bits.enumerate().filter(|(_, b)| *b == poison).map(|(i, _)| i).collect::<Vec<_>>();
    assert!(
        unwritten.is_empty(),
        "{name}: {} elements never written (first at {:?})",
        unwritten.len(),
        unwritten.first()
    );
}

/// Asserts every error is under [`precision::ERROR_BOUND`], naming the case and the output (for
/// problems whose f32 rounding floor is below it: short sequences, the golden fixtures).
pub fn assert_close(case: &str, errs: [f64; 3]) {
    assert_within_floor(case, errs, [0.0; 3]);
}

/// Asserts every error is under its [`precision::bound`] given the f32 rounding floor of each
/// output (docs/CONTRACT.md#precision), naming the case and the output.
pub fn assert_within_floor(case: &str, errs: [f64; 3], floor: [f64; 3]) {
    for ((name, e), f) in Outputs::NAMES.iter().zip(errs).zip(floor) {
        let bound = precision::bound(f);
        assert!(e < bound, "{case}: {name} relative error {e:.3e} >= {bound:.3e} (f32 floor {f:.3e})");
    }
}

/// The golden fixtures (inputs and outputs of an independent implementation; see
/// `tests/fixtures/README.md`).
pub const FIXTURES: [&str; 3] = ["tail_h2", "ragged_h3", "two_seq_no_h0"];

/// The golden fixtures of the generalized recurrence (`tests/fixtures/models/README.md`).
pub const MODEL_FIXTURES: [&str; 6] =
    ["gdn_gva_ragged", "kda_gva_vfirst", "g_and_gk", "kda_k64", "gdn_k256_v512", "plain_delta_k128_v256"];

/// Path of model fixture `name` (see [`fixture`] for where fixtures are looked for).
pub fn model_fixture(name: &str) -> PathBuf {
    fixture(&format!("models/{name}"))
}

/// Path of fixture `name`: under `$KDA_FIXTURES` when set (a test binary run away from its source
/// tree), else this crate's `fixtures/` directory.
pub fn fixture(name: &str) -> PathBuf {
    let dir = std::env::var_os("KDA_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures")));
    dir.join(format!("{name}.safetensors"))
}

/// Ragged layouts the planner and the tails must survive: empty sequences, single tokens, exact
/// multiples of the chunk and one off either side, random lengths, and one long sequence among many
/// tiny ones.
pub fn ragged_lengths() -> impl Strategy<Value = Vec<usize>> {
    let len = prop_oneof![
        3 => 0usize..=200,
        1 => Just(0usize),
        1 => Just(1usize),
        1 => (1usize..=4).prop_map(|m| m * 64),
        1 => (1usize..=4).prop_map(|m| m * 64 + 1),
        1 => (1usize..=4).prop_map(|m| m * 64 - 1),
    ];
    prop_oneof![
        4 => prop::collection::vec(len, 1..8),
        1 => (300usize..700, prop::collection::vec(1usize..4, 1..24))
            .prop_map(|(big, tiny)| std::iter::once(big).chain(tiny).collect()),
    ]
}

/// Shapes of the generalized recurrence: 1 or 2 key heads, 1 to 3 value heads per key head, the
/// head sizes drawn from `key_dims` and `value_dims`, any gates, either state layout.
pub fn model_shapes(key_dims: Vec<usize>, value_dims: Vec<usize>) -> impl Strategy<Value = ModelShape> {
    let sizes = (1usize..=2, 1usize..=3, prop::sample::select(key_dims), prop::sample::select(value_dims));
    (sizes, any::<bool>(), any::<bool>(), any::<bool>()).prop_map(
        |((heads, group, key_dim, value_dim), g, gk, vfirst)| ModelShape {
            heads,
            value_heads: heads * group,
            key_dim,
            value_dim,
            gates: Gates { g, gk },
            layout: if vfirst { StateLayout::ValueFirst } else { StateLayout::KeyFirst },
        },
    )
}

/// How one token-major tensor is laid out in a drawn [`Strides`].
#[derive(Clone, Copy, Debug)]
pub enum RowLayout {
    /// The contract's packed layout.
    Packed,
    /// Each head's row padded by `pad` elements and each token's by `2 * pad` more (as a slice of
    /// a wider fused projection is).
    Padded { pad: usize },
    /// `[heads, T, width]`: heads outermost.
    HeadMajor,
}

impl RowLayout {
    /// The strides of a `[tokens, heads, width]` tensor in this layout (`None` when packed).
    pub fn strides(self, tokens: usize, heads: usize, width: usize) -> Option<RowStrides> {
        match self {
            RowLayout::Packed => None,
            RowLayout::Padded { pad } => Some(RowStrides { token: heads * (width + pad) + 2 * pad, head: width + pad }),
            RowLayout::HeadMajor => Some(RowStrides { token: width, head: tokens.max(1) * width }),
        }
    }
}

/// A layout per token-major tensor (`k`, `w`, `u`, `g`, `gk`, `v_new`); pads are multiples of 8
/// elements, so every bf16 stride stays a multiple of 16 bytes as TMA needs.
pub fn row_layouts() -> impl Strategy<Value = [RowLayout; 6]> {
    let one = prop_oneof![
        2 => Just(RowLayout::Packed),
        2 => prop::sample::select(vec![8usize, 64]).prop_map(|pad| RowLayout::Padded { pad }),
        1 => Just(RowLayout::HeadMajor),
    ];
    [one.clone(), one.clone(), one.clone(), one.clone(), one.clone(), one]
}

/// The [`Strides`] of `layouts` (in the order of [`row_layouts`]) for a batch of sizes `d`.
pub fn strides_of(layouts: [RowLayout; 6], d: &kda::Dims) -> Strides {
    let (t, h, hv, kd, vd) = (d.tokens, d.heads, d.value_heads, d.key_dim, d.value_dim);
    let [k, w, u, g, gk, v_new] = layouts;
    Strides {
        k: k.strides(t, h, kd),
        w: w.strides(t, hv, kd),
        u: u.strides(t, hv, vd),
        g: g.strides(t, hv, 1),
        gk: gk.strides(t, hv, kd),
        v_new: v_new.strides(t, hv, vd),
    }
}

/// The layer forward on the GPU (`Kda::launch_layer`) over `p`, with guard elements around every
/// buffer and the outputs poisoned first: panics when a guard is overwritten or an element of
/// `o` or `ht` is left unwritten. Returns `o` (as f32) and `ht`.
pub fn run_layer_guarded(gpu: &Gpu, p: &LayerProblem) -> Result<LayerOutputs, KdaError> {
    run_layer_guarded_in(gpu, p, StateLayout::KeyFirst)
}

/// The output paths this GPU runs the layer on: the fused one (9.x, when the plan's sizes have
/// it: the Hopper kernel's, or on the portable module the portable kernel's, whose CTAs the
/// H100 class gives their shared memory) and the separate one.
pub fn output_paths(gpu: &Gpu, p: &LayerProblem) -> Vec<kda::OutputPath> {
    let fused = gpu.kda.compute_capability().0 == 9 && kda::OutputPath::fused_runs(&p.shape);
    let mut paths = vec![kda::OutputPath::Separate];
    if fused {
        paths.insert(0, kda::OutputPath::Fused);
    }
    paths
}

/// Each `[K, V]` state of `states` (`[.., K, V]` f32) as `[V, K]`, or back with `inverse`.
pub fn transpose_states(states: &[f32], key_dim: usize, value_dim: usize, inverse: bool) -> Vec<f32> {
    let (rows, cols) = if inverse { (value_dim, key_dim) } else { (key_dim, value_dim) };
    let mut out = vec![0.0; states.len()];
    for (src, dst) in states.chunks_exact(rows * cols).zip(out.chunks_exact_mut(rows * cols)) {
        for r in 0..rows {
            for c in 0..cols {
                dst[c * rows + r] = src[r * cols + c];
            }
        }
    }
    out
}

/// [`run_layer_guarded`] with the plan's states in `layout`: `p.h0` (key-first) goes up in that
/// layout and the final states come back key-first.
pub fn run_layer_guarded_in(gpu: &Gpu, p: &LayerProblem, layout: StateLayout) -> Result<LayerOutputs, KdaError> {
    run_layer_guarded_on(gpu, p, layout, kda::OutputPath::Auto)
}

/// [`run_layer_guarded_in`] on output path `path`.
pub fn run_layer_guarded_on(
    gpu: &Gpu,
    p: &LayerProblem,
    layout: StateLayout,
    path: kda::OutputPath,
) -> Result<LayerOutputs, KdaError> {
    use kda::LayerPlan;
    let s = &gpu.stream;
    let path = if path == kda::OutputPath::Auto { gpu.kda.layer_output_path(&p.shape, &p.plan)? } else { path };
    let plan = LayerPlan::with_path(s, p.plan.clone(), p.shape, p.options, path)?.with_state_layout(s, layout)?;
    let mut workspace = plan.workspace(s)?;
    run_layer_guarded_with(gpu, p, &plan, &mut workspace)
}

/// [`run_layer_guarded`] through a given plan (of `p`'s batch, shape and options) and workspace
/// (one that holds the batch), in the plan's state layout.
pub fn run_layer_guarded_with(
    gpu: &Gpu,
    p: &LayerProblem,
    plan: &kda::LayerPlan,
    workspace: &mut kda::LayerWorkspace,
) -> Result<LayerOutputs, KdaError> {
    use kda::{LayerDeviceOutputs, LayerInputs};
    let s = &gpu.stream;
    let layout = plan.state_layout();
    let (kd_, vd_) = (p.shape.key_dim, p.shape.value_dim);
    let value_first = layout == StateLayout::ValueFirst;
    let h0_laid = p.h0.as_ref().map(|h0| if value_first { transpose_states(h0, kd_, vd_, false) } else { h0.clone() });
    let (t, n) = (p.plan.tokens(), p.plan.num_seqs());
    let (hv, vd) = (p.shape.value_heads, p.shape.value_dim);
    let state = n * hv * p.shape.key_dim * vd;
    let (nan_bf, nan_f) = (bf16::NAN, f32::NAN);
    let (q, k, v) = (guarded(s, &p.q, nan_bf), guarded(s, &p.k, nan_bf), guarded(s, &p.v, nan_bf));
    // The gate and `beta` in the problem's dtypes.
    let floats = |x: &[f32], dtype: kda::layer::InputDtype| match dtype {
        kda::layer::InputDtype::F32 => kda::FloatBuffer::F32(guarded(s, x, nan_f)),
        kda::layer::InputDtype::Bf16 => {
            kda::FloatBuffer::Bf16(guarded(s, &x.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>(), nan_bf))
        }
    };
    let (g, beta) = (floats(&p.g, p.dtypes.g), floats(&p.beta, p.dtypes.beta));
    let a_log = p.a_log.as_ref().map(|x| guarded(s, x, nan_f));
    let dt_bias = p.dt_bias.as_ref().map(|x| guarded(s, x, nan_f));
    let h0 = h0_laid.as_ref().map(|x| guarded(s, x, nan_f));
    let (sent_bf, sent_f) = (bf16::from_bits(SENTINEL_BF16), f32::from_bits(SENTINEL_F32));
    let mut o = guarded(s, &vec![bf16::from_bits(POISON_BF16); t * hv * vd], sent_bf);
    let mut ht = guarded(s, &vec![f32::from_bits(POISON_F32); state], sent_f);
    {
        let inputs = LayerInputs {
            q: q.slice(GUARD..GUARD + p.q.len()),
            k: k.slice(GUARD..GUARD + p.k.len()),
            v: v.slice(GUARD..GUARD + p.v.len()),
            g: g.slice(GUARD..GUARD + p.g.len()),
            beta: beta.slice(GUARD..GUARD + p.beta.len()),
            a_log: a_log.as_ref().map(|x| x.slice(GUARD..GUARD + hv)),
            dt_bias: dt_bias.as_ref().map(|x| x.slice(GUARD..GUARD + p.dt_bias.as_ref().map_or(0, Vec::len))),
            h0: h0.as_ref().map(|x| x.slice(GUARD..GUARD + state)),
        };
        let mut outputs = LayerDeviceOutputs {
            o: o.slice_mut(GUARD..GUARD + t * hv * vd),
            ht: Some(ht.slice_mut(GUARD..GUARD + state)),
        };
        gpu.kda.launch_layer(s, plan, &inputs, &mut outputs, workspace)?;
    }
    s.synchronize().expect("layer kernels failed");
    let o = s.clone_dtoh(&o).expect("download");
    let ht = s.clone_dtoh(&ht).expect("download");
    check_guards("o", &o, sent_bf);
    check_guards("ht", &ht, sent_f);
    let o = &o[GUARD..GUARD + t * hv * vd];
    let ht = &ht[GUARD..GUARD + state];
    assert_all_written("o", o.iter().map(|x| x.to_bits() as u32), POISON_BF16 as u32);
    assert_all_written("ht", ht.iter().map(|x| x.to_bits()), POISON_F32);
    let ht = if value_first { transpose_states(ht, kd_, vd_, true) } else { ht.to_vec() };
    Ok(LayerOutputs { o: o.iter().map(|x| x.to_f32()).collect(), ht })
}

/// The layer fixtures (FLA's outputs and the f64 reference; `tests/fixtures/layer/README.md`).
pub const LAYER_FIXTURES: [&str; 5] = [
    "kda_layer_ragged",
    "kda_layer_gate_in_kernel",
    "kda_layer_dense_no_h0",
    "gdn_layer_gva_ragged",
    "gdn_layer_dense",
];

/// How far FLA, FlashKDA and FlashQLA land from one another on `o` (`../shared/LAYER.md`,
/// "Precision"): the bound where no CPU model of the pipeline runs.
pub const LAYER_PEER_SPREAD: f64 = 5e-3;

/// Random layers of both kinds, grouped value heads, every gate form and option, ragged lengths
/// with partial chunks and empty sequences: the cases the GPU suite and the simulator run, each
/// with its name.
pub fn random_layer_cases() -> Vec<(String, LayerProblem)> {
    use kda::layer::{GateInput, InputDtype, LayerKind, LayerOptions, LayerShape, TokenDtypes};
    let gates = [GateInput::Log, GateInput::Softplus, GateInput::LowerBound(-5.0)];
    let shapes = [
        (LayerKind::Kda, (2, 2), (128, 128)),
        (LayerKind::Kda, (1, 1), (64, 64)),
        (LayerKind::Kda, (1, 3), (64, 128)),
        (LayerKind::Gdn, (1, 2), (128, 128)),
        (LayerKind::Gdn, (2, 2), (64, 128)),
    ];
    let mut cases = Vec::new();
    for (c, (kind, (heads, value_heads), (key_dim, value_dim))) in shapes.into_iter().enumerate() {
        let shape = LayerShape { kind, heads, value_heads, key_dim, value_dim };
        for (o, gate) in gates.into_iter().enumerate() {
            let flag = (c + o) % 2 == 1;
            let options =
                LayerOptions { scale: (key_dim as f64).powf(-0.5), l2norm_qk: flag, beta_sigmoid: !flag, gate };
            let lengths = [[300, 0, 64, 17], [1, 129, 64, 0]][(c + o) % 2];
            // The gate and `beta` in f32, both in bf16, or the gate alone in bf16.
            let dtypes =
                [TokenDtypes::default(), TokenDtypes::BF16, TokenDtypes { g: InputDtype::Bf16, ..Default::default() }]
                    [(c + o) % 3];
            let name = format!(
                "{kind:?} {heads}/{value_heads} K={key_dim} V={value_dim} {options:?} {lengths:?} g {:?} beta {:?}",
                dtypes.g, dtypes.beta
            );
            let p = random_layer_problem(&lengths, shape, options, flag, (10 * c + o) as u64).with_dtypes(dtypes);
            cases.push((name, p));
        }
    }
    cases
}

/// On random layers, how far above the f64 model of the same pipeline (`layer_chunked` with
/// `Rounding::Kernels`: bf16 `k'`, `w`, `u`, `h`, `v_new`, f64 everywhere else) a kernel's error
/// against the definition may land: its token-parallel kernels sum in f32, so its bf16 roundings
/// flip elsewhere, while an indexing or gating bug is orders of magnitude above either.
pub const LAYER_SLACK_OVER_MODEL: f64 = 1.5;

/// The errors of `o` and `ht` a correct layer stays under on `p` (whose f64 result is `want`):
/// the pipeline's own rounding level where the CPU model runs it (KDA's needs `H = HV`) with
/// [`LAYER_SLACK_OVER_MODEL`], otherwise the spread between FLA and the fast peers on `o`.
pub fn layer_bounds(p: &LayerProblem, want: &LayerOutputs) -> [f64; 2] {
    use kda::layer::{LayerKind, Rounding, layer_chunked};
    let s = p.shape;
    if s.kind == LayerKind::Gdn || s.heads == s.value_heads {
        let model = layer_chunked(p, Rounding::Kernels).unwrap().errors(want);
        model.map(|e| (LAYER_SLACK_OVER_MODEL * e).max(precision::ERROR_BOUND))
    } else {
        [LAYER_PEER_SPREAD; 2]
    }
}

/// One layer problem with checkpoints for prefix caching: inside a chunk, at a chunk's end and
/// at the sequence's end, into every other slot of a pool (backwards, so that slots and
/// checkpoints do not line up), with the states of the prompts cut there.
pub struct CheckpointCase {
    pub name: String,
    pub p: kda::layer::LayerProblem,
    pub checkpoints: Vec<kda::pool::Checkpoint>,
    /// Slots of the pool.
    pub slots: usize,
    /// `[N][checkpoints of the sequence][HV * K * V]`, key-first: `checkpoint_reference`.
    want: Vec<Vec<Vec<f32>>>,
    /// Each sequence's positions, in the order of `want`.
    positions: Vec<Vec<usize>>,
    /// The layer's bound on `ht` plus [`CHECKPOINT_ROUNDING`].
    pub bound: f64,
}

/// Every fourth random layer (each gate form, both kinds, both key sizes) with checkpoints.
pub fn checkpoint_cases() -> Vec<CheckpointCase> {
    use kda::layer::{checkpoint_reference, layer_reference};
    use kda::pool::Checkpoint;
    let mut out = Vec::new();
    for (name, p) in random_layer_cases().into_iter().step_by(4) {
        let mut positions = vec![Vec::new(); p.plan.num_seqs()];
        let mut chosen = Vec::new();
        for (n, seq) in p.plan.seqs().iter().enumerate() {
            let mut wanted: Vec<usize> =
                [1, seq.len / 2, 64, 65, seq.len].into_iter().filter(|&x| (1..=seq.len).contains(&x)).collect();
            wanted.dedup();
            for x in wanted {
                chosen.push((n, x));
                positions[n].push(x);
            }
        }
        let slots = 2 * chosen.len() + 1;
        let checkpoints = chosen
            .iter()
            .enumerate()
            .map(|(m, &(sequence, position))| Checkpoint { sequence, position, slot: slots - 1 - 2 * m })
            .collect();
        let want = checkpoint_reference(&p, &positions).unwrap();
        let bound = layer_bounds(&p, &layer_reference(&p).unwrap())[1] + CHECKPOINT_ROUNDING;
        out.push(CheckpointCase { name, p, checkpoints, slots, want, positions, bound });
    }
    out
}

impl CheckpointCase {
    /// Checks a pool the checkpoints were written into (every slot poisoned before): each
    /// checkpoint within the bound, every slot not named still poisoned. Prints the largest error.
    pub fn check<P: kda::pool::PoolElement + Copy + Into<PoolValue>>(&self, dtype: kda::pool::StateDtype, pool: &[P]) {
        let s = self.p.shape;
        let state = s.value_heads * s.key_dim * s.value_dim;
        let slot = |x: usize| &pool[x * state..][..state];
        let mut worst = 0f64;
        for (m, c) in self.checkpoints.iter().enumerate() {
            let at = self.positions[c.sequence].iter().position(|&x| x == c.position).unwrap();
            let got: Vec<f32> = slot(c.slot).iter().map(|&x| x.into().value).collect();
            let err = kda::rel_error(&got, &self.want[c.sequence][at]);
            assert!(
                err <= self.bound,
                "{} {dtype:?}: checkpoint {m} ({c:?}): {err:.2e} over {:.2e}",
                self.name,
                self.bound
            );
            worst = worst.max(err);
        }
        let named: std::collections::HashSet<usize> = self.checkpoints.iter().map(|c| c.slot).collect();
        for x in (0..self.slots).filter(|x| !named.contains(x)) {
            assert!(slot(x).iter().all(|&v| v.into().poisoned), "{} {dtype:?}: slot {x} was written", self.name);
        }
        println!(
            "{} {dtype:?}: {} checkpoints, largest error {worst:.2e} (bound {:.2e})",
            self.name,
            self.checkpoints.len(),
            self.bound
        );
    }
}

/// A pool element's value as f32, and whether it still holds the poison.
pub struct PoolValue {
    value: f32,
    poisoned: bool,
}

impl From<f32> for PoolValue {
    fn from(x: f32) -> Self {
        Self { value: x, poisoned: x.to_bits() == POISON_F32 }
    }
}

impl From<half::bf16> for PoolValue {
    fn from(x: half::bf16) -> Self {
        Self { value: x.to_f32(), poisoned: x.to_bits() == POISON_BF16 }
    }
}

/// Each `[rows][cols]` matrix of `states` (a whole number of them) transposed: a key-first pool
/// of states value-first, and back.
pub fn transposed<T: Copy + Default>(states: &[T], rows: usize, cols: usize) -> Vec<T> {
    let mut out = vec![T::default(); states.len()];
    for (src, dst) in states.chunks_exact(rows * cols).zip(out.chunks_exact_mut(rows * cols)) {
        for r in 0..rows {
            for c in 0..cols {
                dst[c * rows + r] = src[r * cols + c];
            }
        }
    }
    out
}

/// What a checkpoint's error may add to the layer's bound on `ht`: it starts from a chunk entry
/// state kept in bf16 (`h`), whose rounding is at most bf16's unit roundoff, 2^-8, relative; a
/// bf16 pool rounds the result once more, by as much.
pub const CHECKPOINT_ROUNDING: f64 = 2.0 * BF16_UNIT_ROUNDOFF;

/// bf16's unit roundoff: 8 significant bits.
pub const BF16_UNIT_ROUNDOFF: f64 = 1.0 / 256.0;

/// A correct layer's error against the f64 reference is at most this multiple of FLA's on the same
/// inputs (`../shared/LAYER.md`, "Precision").
pub const LAYER_BOUND_OVER_FLA: f64 = 1.25;

/// One problem of the generalized recurrence, its row strides and what it covers.
pub struct ModelCase {
    /// The gates, layout, sizes and strides, for messages.
    pub name: String,
    pub problem: kda::model::ModelProblem,
    pub strides: Strides,
}

impl ModelCase {
    /// The error bound of each output given the f32 rounding floor of the problem
    /// (`kda::precision::bound_for`).
    pub fn bounds(&self, floor: [f64; 3]) -> [f64; 3] {
        let s = self.problem.shape;
        floor.map(|f| precision::bound_for(s.gates.g || s.gates.gk, s.key_dim, f))
    }
}

/// The portable kernel's cases: every gate kind (`gk`, `g`, both, neither) x state layout x key
/// size (64, 128, 256, each with a value size of its own), grouped value heads (two per key
/// head), a partial chunk and short sequences, rows packed or padded as slices of a fused
/// projection (alternating).
pub fn portable_model_cases() -> Vec<ModelCase> {
    let gates = [(false, true), (true, false), (true, true), (false, false)];
    let sizes = [(128, 128), (64, 64), (256, 96)];
    let mut cases = Vec::new();
    for (i, (g, gk)) in gates.into_iter().enumerate() {
        for (j, layout) in [StateLayout::KeyFirst, StateLayout::ValueFirst].into_iter().enumerate() {
            for (l, (key_dim, value_dim)) in sizes.into_iter().enumerate() {
                let rows = if (i + j + l) % 2 == 0 { RowLayout::Packed } else { RowLayout::Padded { pad: 8 } };
                let gates = Gates { g, gk };
                let shape = ModelShape { value_heads: 2, key_dim, value_dim, gates, layout, ..ModelShape::kda(1) };
                let seed = (100 * i + 10 * j + l) as u64;
                let problem =
                    kda::inputs::try_random_model_problem(Plan::from_lengths(&[130, 3, 0, 1]), shape, true, seed)
                        .unwrap();
                let strides = strides_of([rows; 6], &kda::Dims::model(&problem.plan, &shape));
                let name = format!("g={g} gk={gk} {layout:?} K={key_dim} V={value_dim} {rows:?}");
                cases.push(ModelCase { name, problem, strides });
            }
        }
    }
    cases
}

/// One call of the decode kernel on the GPU (`Kda::launch_decode`) over `plan` with the token
/// rows of `p` and `pool` (f32 or bf16, as the plan's pool) uploaded, `o` poisoned first; returns
/// the pool after the call and `o`.
pub fn run_decode<P: kda::pool::PoolElement>(
    gpu: &Gpu,
    p: &LayerProblem,
    plan: &kda::DecodePlan,
    pool: &[P],
) -> (Vec<P>, Vec<bf16>) {
    let s = &gpu.stream;
    let dev = kda_cli::decode::DeviceDecodeInputs::upload(s, p).unwrap();
    let inputs = dev.inputs();
    let mut pool_dev = s.clone_htod(pool).unwrap();
    let rows = p.plan.tokens() * p.shape.value_heads * p.shape.value_dim;
    let mut o = s.clone_htod(&vec![bf16::from_bits(POISON_BF16); rows]).unwrap();
    gpu.kda.launch_decode(s, plan, &inputs, &mut pool_dev.slice_mut(..), &mut o.slice_mut(..)).unwrap();
    s.synchronize().expect("decode call failed");
    (s.clone_dtoh(&pool_dev).unwrap(), s.clone_dtoh(&o).unwrap())
}

/// A prefill over a state pool and what the f64 layer over the pool gives for it: a sequence
/// continuing its slot, a padding one with no tokens, a fresh one, one ending on a chunk boundary.
pub struct PooledPrefillCase {
    /// The batch (no initial states: the pool holds them).
    pub p: LayerProblem,
    pub pool_shape: kda::pool::PoolShape,
    /// The pool before the call.
    pub pool: Vec<f32>,
    pub indices: Vec<i64>,
    pub fresh: Vec<bool>,
    pub uses: Vec<kda::pool::SlotUse>,
    /// The pool after the call, and each live sequence's `o`, by the reference.
    pub want_pool: Vec<f32>,
    pub want_o: Vec<Option<Vec<f32>>>,
    /// The bound on each sequence's `o`: 1.5x the CPU model of the kernels' pipeline where it runs.
    pub o_bound: Vec<f64>,
}

impl PooledPrefillCase {
    /// The case for a layer of `kind` with `K = V = size`, two value heads of one key head, the
    /// first sequence `long` tokens.
    pub fn new(kind: kda::layer::LayerKind, size: usize, long: usize) -> Self {
        use kda::layer::{GateInput, LayerOptions, LayerShape};
        use kda::pool::layer_reference_pooled;
        use kda::pool::{PoolShape, StateDtype, slot_uses};
        let shape = LayerShape { kind, heads: 1, value_heads: 2, key_dim: size, value_dim: size };
        let options = LayerOptions { scale: 0.125, l2norm_qk: true, beta_sigmoid: true, gate: GateInput::Softplus };
        let p = random_layer_problem(&[long, 0, 5, 64], shape, options, false, 17);
        let pool_shape = PoolShape::for_layer(&shape, 8, StateLayout::KeyFirst, StateDtype::F32);
        let pool = kda::inputs::random_pool(&pool_shape, 4);
        let (indices, fresh) = (vec![3i64, -1, 0, 5], vec![false, false, true, false]);
        let uses = slot_uses(&indices, &fresh, &pool_shape).unwrap();
        let mut want_pool = pool.clone();
        let want_o = layer_reference_pooled(&p, &mut want_pool, &pool_shape, &uses).unwrap();
        let o_bound = Self::o_bounds(&p, &pool, &pool_shape, &uses, &want_o);
        Self { p, pool_shape, pool, indices, fresh, uses, want_pool, want_o, o_bound }
    }

    /// Each sequence's bound on `o`: where the CPU model of the kernels' pipeline runs
    /// (`layer_chunked` with `Rounding::Kernels`, from the states the pool gives), its own error
    /// on the sequence with [`LAYER_SLACK_OVER_MODEL`] (a sequence of a few tokens has few
    /// elements, so its error is far from the batch's; the flat peer spread would pass or fail it
    /// by chance); otherwise [`LAYER_PEER_SPREAD`].
    fn o_bounds(
        p: &LayerProblem,
        pool: &[f32],
        pool_shape: &kda::pool::PoolShape,
        uses: &[kda::pool::SlotUse],
        want_o: &[Option<Vec<f32>>],
    ) -> Vec<f64> {
        use kda::layer::{Rounding, layer_chunked};
        let h0 = kda::pool::initial_states(pool, pool_shape, uses).unwrap();
        let with_h0 = LayerProblem { h0: Some(h0), ..p.clone() };
        let Ok(model) = layer_chunked(&with_h0, Rounding::Kernels) else {
            return vec![LAYER_PEER_SPREAD; uses.len()];
        };
        let row = p.shape.value_heads * p.shape.value_dim;
        p.plan
            .seqs()
            .iter()
            .zip(want_o)
            .map(|(seq, want)| match want {
                Some(want) => {
                    let rows = seq.token_start * row..(seq.token_start + seq.len) * row;
                    let model_error = kda::rel_error(&model.o[rows], want);
                    (LAYER_SLACK_OVER_MODEL * model_error).max(precision::ERROR_BOUND)
                }
                None => LAYER_PEER_SPREAD,
            })
            .collect()
    }

    /// Asserts a run's pool and `o` (`[T, HV, V]` as f32): each live sequence's `o` and slot
    /// within [`LAYER_PEER_SPREAD`] of the reference, every other slot bit for bit as before.
    pub fn check(&self, got_pool: &[f32], got_o: &[f32]) {
        let s = self.p.shape;
        let (row, state) = (s.value_heads * s.value_dim, s.value_heads * s.key_dim * s.value_dim);
        for (n, seq) in self.p.plan.seqs().iter().enumerate() {
            let Some(want) = &self.want_o[n] else { continue };
            let e = kda::rel_error(&got_o[seq.token_start * row..(seq.token_start + seq.len) * row], want);
            let bound = self.o_bound[n];
            println!("{:?} pooled prefill, sequence {n}: o {e:.2e} (bound {bound:.2e})", s.kind);
            assert!(e < bound, "{:?} sequence {n}: o {e:.2e}, bound {bound:.2e}", s.kind);
        }
        for slot in 0..self.pool_shape.slots {
            let range = slot * state..(slot + 1) * state;
            let (got, want) = (&got_pool[range.clone()], &self.want_pool[range]);
            if self.uses.iter().any(|u| u.slot() == Some(slot)) {
                let e = kda::rel_error(got, want);
                assert!(e < LAYER_PEER_SPREAD, "{:?} slot {slot}: state {e:.2e}", s.kind);
            } else {
                assert!(
                    got.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{:?} slot {slot} changed",
                    s.kind
                );
            }
        }
    }
}

/// The decode step's bound on `o` against the f64 definition: its bf16 rounding (at most 2^-9
/// relative per element) with headroom; the pooled states, f32 after one token, at most
/// `DECODE_STATE_BOUND`.
pub const DECODE_O_BOUND: f64 = 4e-3;
/// See [`DECODE_O_BOUND`].
pub const DECODE_STATE_BOUND: f64 = 1e-5;

/// One decode step over a state pool and what the f64 layer over the pool gives for it
/// (`kda::pool::layer_reference_pooled`).
pub struct DecodeCase {
    /// What the case covers.
    pub name: String,
    /// One token per sequence.
    pub p: LayerProblem,
    /// The pool's shape.
    pub pool_shape: kda::pool::PoolShape,
    /// The pool before the step.
    pub pool: Vec<f32>,
    /// Each sequence's slot (negative: padding).
    pub indices: Vec<i64>,
    /// Whether each sequence starts from zeros.
    pub fresh: Vec<bool>,
    /// `indices` and `fresh` as checked slot uses.
    pub uses: Vec<kda::pool::SlotUse>,
    /// The pool after the step, by the reference.
    pub want_pool: Vec<f32>,
    /// Each sequence's `o` row by the reference (`None`: padding).
    pub want_o: Vec<Option<Vec<f32>>>,
}

/// Decode steps of both kinds, grouped value heads, the gate forms and options, padding
/// sequences (nothing read or written), a fresh sequence (from zeros).
pub fn decode_cases() -> Vec<DecodeCase> {
    use kda::layer::{GateInput, LayerKind, LayerOptions, LayerShape};
    use kda::pool::layer_reference_pooled;
    use kda::pool::{PoolShape, slot_uses};
    let indices = vec![3i64, -1, 0, 5, 7, -1];
    let fresh = vec![false, false, true, false, false, false];
    let cases = [
        (LayerKind::Kda, 2, 2, 128, 128, GateInput::LowerBound(-5.0), true),
        (LayerKind::Kda, 1, 2, 64, 64, GateInput::Log, false),
        (LayerKind::Gdn, 1, 2, 128, 128, GateInput::Softplus, true),
        (LayerKind::Gdn, 2, 4, 64, 192, GateInput::Log, false),
        // K = 96: three vectors of keys per key lane.
        (LayerKind::Kda, 1, 1, 96, 64, GateInput::Softplus, true),
    ];
    let mut out = Vec::new();
    for (c, (kind, heads, value_heads, key_dim, value_dim, gate, flag)) in cases.into_iter().enumerate() {
        let shape = LayerShape { kind, heads, value_heads, key_dim, value_dim };
        let options = LayerOptions { scale: (key_dim as f64).powf(-0.5), l2norm_qk: flag, beta_sigmoid: !flag, gate };
        // Every other case with the gate and `beta` in bf16.
        let dtypes = if c % 2 == 1 { kda::layer::TokenDtypes::BF16 } else { Default::default() };
        let p = random_layer_problem(&[1; 6], shape, options, false, 40 + c as u64).with_dtypes(dtypes);
        let pool_shape = PoolShape::for_layer(&shape, 8, StateLayout::KeyFirst, kda::pool::StateDtype::F32);
        let pool: Vec<f32> = kda::inputs::random_pool(&pool_shape, c as u64);
        let uses = slot_uses(&indices, &fresh, &pool_shape).unwrap();
        let mut want_pool = pool.clone();
        let want_o = layer_reference_pooled(&p, &mut want_pool, &pool_shape, &uses).unwrap();
        let name = format!("case {c} {kind:?} {heads}/{value_heads} K={key_dim} V={value_dim} {gate:?} {dtypes:?}");
        out.push(DecodeCase {
            name,
            p,
            pool_shape,
            pool,
            indices: indices.clone(),
            fresh: fresh.clone(),
            uses,
            want_pool,
            want_o,
        });
    }
    out
}

/// A speculative verify call over a state pool: `draft` tokens per sequence, their parents
/// (chains and trees) and the slot each token's state goes to.
pub struct VerifyCase {
    /// What the case covers.
    pub name: String,
    /// `draft` tokens per sequence, no initial states (the pool holds them).
    pub p: LayerProblem,
    pub pool_shape: kda::pool::PoolShape,
    /// The pool before the call.
    pub pool: Vec<f32>,
    /// Each sequence's slot (negative: padding) and whether it starts from zeros.
    pub indices: Vec<i64>,
    pub fresh: Vec<bool>,
    pub uses: Vec<kda::pool::SlotUse>,
    pub draft: usize,
    /// `[N * draft]`: each token's parent inside its sequence (negative: the initial state).
    pub parents: Vec<i64>,
    /// `[N * draft]`: where each token's state goes.
    pub token_slots: Vec<i64>,
}

/// Verify calls: a KDA chain of four tokens per sequence (one sequence padding, one fresh, one
/// writing its last state back to its own slot) and a Gated DeltaNet tree of five (two branches
/// off the first token and a second root).
pub fn verify_cases() -> Vec<VerifyCase> {
    use kda::layer::{GateInput, LayerKind, LayerOptions, LayerShape};
    use kda::pool::{PoolShape, slot_uses};
    let specs = [
        (
            "KDA chain",
            LayerShape { kind: LayerKind::Kda, heads: 2, value_heads: 2, key_dim: 128, value_dim: 64 },
            GateInput::Softplus,
            4,
            vec![-1i64, 0, 1, 2],
            vec![3i64, -1, 0],
            vec![false, false, true],
            vec![8i64, 9, 10, 3, -1, -1, -1, -1, 11, 12, 13, 14],
        ),
        (
            "GDN tree",
            LayerShape { kind: LayerKind::Gdn, heads: 1, value_heads: 2, key_dim: 64, value_dim: 64 },
            GateInput::Log,
            5,
            vec![-1i64, 0, 0, 1, -1],
            vec![5i64, 2],
            vec![false, false],
            vec![0i64, 1, 3, 4, 6, 7, 8, 9, 10, 11],
        ),
    ];
    let mut out = Vec::new();
    for (c, (name, shape, gate, draft, chain, indices, fresh, token_slots)) in specs.into_iter().enumerate() {
        let flag = c % 2 == 0;
        let options =
            LayerOptions { scale: (shape.key_dim as f64).powf(-0.5), l2norm_qk: flag, beta_sigmoid: !flag, gate };
        let n = indices.len();
        let p = random_layer_problem(&vec![draft; n], shape, options, false, 60 + c as u64);
        let pool_shape = PoolShape::for_layer(&shape, 16, StateLayout::KeyFirst, kda::pool::StateDtype::F32);
        let pool: Vec<f32> = kda::inputs::random_pool(&pool_shape, c as u64);
        let uses = slot_uses(&indices, &fresh, &pool_shape).unwrap();
        let parents = chain.iter().copied().cycle().take(n * draft).collect();
        out.push(VerifyCase {
            name: name.into(),
            p,
            pool_shape,
            pool,
            indices,
            fresh,
            uses,
            draft,
            parents,
            token_slots,
        });
    }
    out
}

impl VerifyCase {
    /// Per sequence, each token's output row and the state after it, by the definition
    /// (`kda::layer::verify_tree_reference` from each sequence's slot, or zeros).
    pub fn reference(&self) -> Vec<kda::layer::VerifiedTokens> {
        let s = self.p.shape;
        let state = s.value_heads * s.key_dim * s.value_dim;
        let mut h0 = vec![0.0f32; self.uses.len() * state];
        for (n, u) in self.uses.iter().enumerate() {
            if let kda::pool::SlotUse::Continue(slot) = u {
                h0[n * state..(n + 1) * state].copy_from_slice(&self.pool[slot * state..(slot + 1) * state]);
            }
        }
        let with_h0 = LayerProblem { h0: Some(h0), ..self.p.clone() };
        kda::layer::verify_tree_reference(&with_h0, &self.parents).unwrap()
    }
}

impl DecodeCase {
    /// `o` for the step, every element poisoned.
    pub fn poisoned_o(&self) -> Vec<bf16> {
        vec![bf16::from_bits(POISON_BF16); self.indices.len() * self.p.shape.value_heads * self.p.shape.value_dim]
    }

    /// Asserts a step's pool and `o`: every named slot within [`DECODE_STATE_BOUND`], every other
    /// slot bit for bit as before, every live sequence's `o` within [`DECODE_O_BOUND`], every
    /// padding sequence's `o` still poisoned.
    pub fn check(&self, got_pool: &[f32], got_o: &[bf16]) {
        let s = self.p.shape;
        let state = s.value_heads * s.key_dim * s.value_dim;
        for slot in 0..self.pool_shape.slots {
            let range = slot * state..(slot + 1) * state;
            if self.uses.iter().any(|u| u.slot() == Some(slot)) {
                let e = kda::rel_error(&got_pool[range.clone()], &self.want_pool[range]);
                assert!(e < DECODE_STATE_BOUND, "{}: slot {slot}: state error {e:.2e}", self.name);
            } else {
                assert!(
                    got_pool[range.clone()] == self.pool[range],
                    "{}: slot {slot}, named by no sequence, changed",
                    self.name
                );
            }
        }
        let row = s.value_heads * s.value_dim;
        for (n, want) in self.want_o.iter().enumerate() {
            let got = &got_o[n * row..(n + 1) * row];
            match want {
                Some(want) => {
                    let got: Vec<f32> = got.iter().map(|x| x.to_f32()).collect();
                    let e = kda::rel_error(&got, want);
                    println!("{}: sequence {n}: o {e:.2e}", self.name);
                    assert!(e < DECODE_O_BOUND, "{}: sequence {n}: o error {e:.2e}", self.name);
                }
                None => assert!(
                    got.iter().all(|x| x.to_bits() == POISON_BF16),
                    "{}: padding sequence {n}'s o was written",
                    self.name
                ),
            }
        }
    }
}

/// Bound on the split passes against the f64 model of the same split (`split_reference`, which
/// rounds where the kernels round) and against the unsplit recurrence: the CPU-measured level of
/// the pre-scan's extra roundings (tests/tests/split.rs, 3.0e-3 at most) with headroom. A wrong
/// entry state or a segment written at the wrong place is orders of magnitude above it.
pub const SPLIT_BOUND: f64 = 5e-3;

/// A split run's errors: against the f64 model of the same split (`model`), against the unsplit
/// model (`unsplit`), and the bound on the latter (`bounds`): [`SPLIT_BOUND`], or the split's own
/// rounding difference on that problem (the f64 model of the split against the unsplit model,
/// measured on the CPU) with [`precision::FLOOR_SLACK`] where that is larger. Without any gate
/// the state never decays, and the pre-scan's extra roundings grow with it (4.6e-3 measured at
/// K = 64 over 1400 tokens): the same problem's CPU model sets the level, not a constant.
pub struct SplitErrors {
    pub model: [f64; 3],
    pub unsplit: [f64; 3],
    pub bounds: [f64; 3],
}

impl SplitErrors {
    pub fn of(out: &Outputs, p: &ModelView<'_>, split: &SplitPlan) -> Self {
        let (split_model, unsplit_model) =
            (kda::split::split_reference(p, split).unwrap(), kda::reference::model_reference(p).unwrap());
        let bounds =
            split_model.errors(&unsplit_model).map(|inherent| SPLIT_BOUND.max(precision::FLOOR_SLACK * inherent));
        Self { model: out.errors(&split_model), unsplit: out.errors(&unsplit_model), bounds }
    }
}

#[cfg(test)]
mod tests {
    use super::transpose_states;

    #[test]
    fn states_transpose_and_back() {
        // Two [2, 3] states.
        let key_first: Vec<f32> = (0..12).map(|x| x as f32).collect();
        let value_first = transpose_states(&key_first, 2, 3, false);
        assert_eq!(value_first, [0.0, 3.0, 1.0, 4.0, 2.0, 5.0, 6.0, 9.0, 7.0, 10.0, 8.0, 11.0]);
        assert_eq!(transpose_states(&value_first, 2, 3, true), key_first);
    }
}
