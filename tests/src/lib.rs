//! Shared helpers of the integration tests: a GPU runner that surrounds every input and output with
//! guard regions, poisons the outputs, and checks afterwards that each output element was written
//! and no guard byte changed.

use half::bf16;
use kda::{DevicePlan, KdaInputs, KdaOutputs};
use kda::{Kda, Kernel, Outputs, Problem, precision, rel_error};
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
    let s = &gpu.stream;
    let d = p.dims();
    let nan_bf = bf16::NAN;
    let k = guarded(s, &p.k, nan_bf);
    let w = guarded(s, &p.w, nan_bf);
    let u = guarded(s, &p.u, nan_bf);
    let gk = guarded(s, &p.gk, f32::NAN);
    let h0 = p.h0.as_ref().map(|h0| guarded(s, h0, f32::NAN));
    let poison_bf = vec![bf16::from_bits(POISON_BF16); d.h_len().max(d.value_len())];
    let poison_f = vec![f32::from_bits(POISON_F32); d.state_len()];
    let sent_bf = bf16::from_bits(SENTINEL_BF16);
    let sent_f = f32::from_bits(SENTINEL_F32);
    let mut h = guarded(s, &poison_bf[..d.h_len()], sent_bf);
    let mut v_new = guarded(s, &poison_bf[..d.value_len()], sent_bf);
    let mut ht = guarded(s, &poison_f, sent_f);
    let plan = DevicePlan::grouped(s, p.plan.clone(), p.heads, p.value_heads).expect("plan upload");
    {
        let inputs = KdaInputs {
            k: k.slice(GUARD..GUARD + d.key_len()),
            w: w.slice(GUARD..GUARD + d.weight_len()),
            u: u.slice(GUARD..GUARD + d.value_len()),
            gk: gk.slice(GUARD..GUARD + d.weight_len()),
            h0: h0.as_ref().map(|h0| h0.slice(GUARD..GUARD + d.state_len())),
        };
        let mut outputs = KdaOutputs {
            h: h.slice_mut(GUARD..GUARD + d.h_len()),
            v_new: v_new.slice_mut(GUARD..GUARD + d.value_len()),
            ht: Some(ht.slice_mut(GUARD..GUARD + d.state_len())),
        };
        gpu.kda.launch(s, &plan, &inputs, &mut outputs, kernel).expect("launch");
    }
    s.synchronize().expect("kernel failed");
    let h = s.clone_dtoh(&h).expect("download");
    let v_new = s.clone_dtoh(&v_new).expect("download");
    let ht = s.clone_dtoh(&ht).expect("download");
    check_guards("h", &h, sent_bf);
    check_guards("v_new", &v_new, sent_bf);
    check_guards("ht", &ht, sent_f);
    let out = Outputs {
        h: h[GUARD..GUARD + d.h_len()].to_vec(),
        v_new: v_new[GUARD..GUARD + d.value_len()].to_vec(),
        ht: ht[GUARD..GUARD + d.state_len()].to_vec(),
    };
    assert_all_written("h", out.h.iter().map(|x| x.to_bits() as u32), POISON_BF16 as u32);
    assert_all_written("v_new", out.v_new.iter().map(|x| x.to_bits() as u32), POISON_BF16 as u32);
    assert_all_written("ht", out.ht.iter().map(|x| x.to_bits()), POISON_F32);
    out
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

/// Relative errors of `out` against `want`: `[h, v_new, ht]`.
pub fn errors(out: &Outputs, want: &Outputs) -> [f64; 3] {
    [rel_error(&out.h, &want.h), rel_error(&out.v_new, &want.v_new), rel_error(&out.ht, &want.ht)]
}

/// Asserts every error is under [`precision::ERROR_BOUND`], naming the case and the output (for
/// problems whose f32 rounding floor is below it: short sequences, the golden fixtures).
pub fn assert_close(case: &str, errs: [f64; 3]) {
    assert_within_floor(case, errs, [0.0; 3]);
}

/// Asserts every error is under its [`precision::bound`] given the f32 rounding floor of each
/// output (docs/CONTRACT.md#precision), naming the case and the output.
pub fn assert_within_floor(case: &str, errs: [f64; 3], floor: [f64; 3]) {
    for ((name, e), f) in OUTPUTS.iter().zip(errs).zip(floor) {
        let bound = precision::bound(f);
        assert!(e < bound, "{case}: {name} relative error {e:.3e} >= {bound:.3e} (f32 floor {f:.3e})");
    }
}

/// Names of the outputs, in the order of [`errors`].
pub const OUTPUTS: [&str; 3] = ["h", "v_new", "ht"];

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
