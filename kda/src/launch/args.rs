//! A launch's arguments: the caller's device addresses, and each kernel's argument list, pushed
//! in the order of its `kda_kernel::abi` parameter list and checked against it.

use super::{KdaInputs, KdaOutputs};
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, LaunchArgs, PushKernelArg, SyncOnDrop};
use kda_kernel::abi::{KernelAbi, TensorMaps};

/// A device address as a kernel's pointer parameter (0 for an absent optional tensor).
pub(super) type Address = u64;

/// The device addresses of one launch's tensors (0 for an absent `h0` or `ht`), with the stream
/// records that keep cudarc's event tracking right until the launch is enqueued.
pub(super) struct Pointers<'a> {
    pub k: Address,
    pub w: Address,
    pub u: Address,
    pub g: Address,
    pub gk: Address,
    pub h0: Address,
    pub h: Address,
    pub v_new: Address,
    pub ht: Address,
    _records: Vec<SyncOnDrop<'a>>,
}

impl<'a> Pointers<'a> {
    /// The addresses of `inputs` and `outputs` as used on `stream`.
    pub fn of(stream: &'a CudaStream, inputs: &'a KdaInputs<'_>, outputs: &'a mut KdaOutputs<'_>) -> Self {
        let mut records = Vec::new();
        let mut read = |t: (u64, SyncOnDrop<'a>)| {
            records.push(t.1);
            t.0
        };
        let (k, w, u) =
            (read(inputs.k.device_ptr(stream)), read(inputs.w.device_ptr(stream)), read(inputs.u.device_ptr(stream)));
        let g = inputs.g.as_ref().map_or(0, |t| read(t.device_ptr(stream)));
        let gk = inputs.gk.as_ref().map_or(0, |t| read(t.device_ptr(stream)));
        let h0 = inputs.h0.as_ref().map_or(0, |t| read(t.device_ptr(stream)));
        let h = read(outputs.h.device_ptr_mut(stream));
        let v_new = read(outputs.v_new.device_ptr_mut(stream));
        let ht = outputs.ht.as_mut().map_or(0, |t| read(t.device_ptr_mut(stream)));
        Self { k, w, u, g, gk, h0, h, v_new, ht, _records: records }
    }
}

/// The Hopper kernel's tensor maps, as a by-value argument.
#[repr(transparent)]
pub(super) struct MapsArg(pub TensorMaps);

// SAFETY: 1152 bytes of encoded tensor maps, plain data the driver copies into the parameter
// space (at the 64-byte alignment the PTX declares for it).
unsafe impl DeviceRepr for MapsArg {}

/// The Hopper kernel's arguments (`kda_kernel::abi::HOPPER_PARAMS`).
pub(super) struct HopperArgs {
    pub maps: MapsArg,
    pub g: Address,
    pub gk: Address,
    pub h0: Address,
    pub v_new: Address,
    pub ht: Address,
    pub work: Address,
    /// Value heads `HV`.
    pub heads: u32,
    pub value_dim: u32,
    /// A `kda_kernel::abi::StateLayoutCode`.
    pub state_layout: u32,
    /// A `kda_kernel::abi::PassCode`.
    pub pass: u32,
    /// Token and head strides (elements) of `g`, `gk` and `v_new`, in that order.
    pub strides: [[u32; 2]; 3],
    /// The fused layer pass (`kda_kernel::abi::HOPPER_FUSED_PARAMS`): the output scale as f32
    /// bits, `v_new` and its strides then being the layer's output `o`'s.
    pub fused_scale_bits: Option<u32>,
}

impl HopperArgs {
    /// The names of [`Self::strides`], in order.
    const STRIDES: [[&'static str; 2]; 3] = [
        ["g_token_stride", "g_head_stride"],
        ["gk_token_stride", "gk_head_stride"],
        ["v_new_token_stride", "v_new_head_stride"],
    ];
    /// The fused pass's name of `v_new`'s strides.
    const O_STRIDES: [&'static str; 2] = ["o_token_stride", "o_head_stride"];

    /// Pushes the arguments in the kernel's parameter order.
    pub fn push<'a>(&'a self, sink: &mut impl ArgSink<'a>) {
        let fused = self.fused_scale_bits.is_some();
        sink.push("maps", &self.maps);
        sink.push("g", &self.g);
        sink.push("gk", &self.gk);
        sink.push("h0", &self.h0);
        sink.push(if fused { "o" } else { "v_new" }, &self.v_new);
        sink.push("ht", &self.ht);
        sink.push("work", &self.work);
        sink.push("heads", &self.heads);
        sink.push("value_dim", &self.value_dim);
        sink.push("state_layout", &self.state_layout);
        sink.push("pass", &self.pass);
        for (i, (names, values)) in Self::STRIDES.iter().zip(&self.strides).enumerate() {
            let names = if fused && i == Self::STRIDES.len() - 1 { &Self::O_STRIDES } else { names };
            for (name, value) in names.iter().zip(values) {
                sink.push(name, value);
            }
        }
        if let Some(scale_bits) = &self.fused_scale_bits {
            sink.push("scale_bits", scale_bits);
        }
    }
}

/// The baseline kernel's arguments (`kda_kernel::abi::BASELINE_PARAMS`).
pub(super) struct BaselineArgs {
    pub ptrs: [Address; 8],
    pub seqs: Address,
    /// Value heads `HV`.
    pub heads: u32,
    /// Key heads `H`.
    pub key_heads: u32,
}

impl BaselineArgs {
    /// The names of [`Self::ptrs`], in order.
    const TENSORS: [&'static str; 8] = ["k", "w", "u", "gk", "h0", "h", "v_new", "ht"];

    /// The arguments of a launch over `p`.
    pub fn new(p: &Pointers<'_>, seqs: Address, heads: u32, key_heads: u32) -> Self {
        Self { ptrs: [p.k, p.w, p.u, p.gk, p.h0, p.h, p.v_new, p.ht], seqs, heads, key_heads }
    }

    /// Pushes the arguments in the kernel's parameter order.
    pub fn push<'a>(&'a self, sink: &mut impl ArgSink<'a>) {
        for (name, ptr) in Self::TENSORS.into_iter().zip(&self.ptrs) {
            sink.push(name, ptr);
        }
        sink.push("seqs", &self.seqs);
        sink.push("heads", &self.heads);
        sink.push("key_heads", &self.key_heads);
    }
}

/// The portable tensor-core kernel's arguments (`kda_kernel::abi::PORTABLE_PARAMS`; with `fused`,
/// `PORTABLE_FUSED_PARAMS`).
#[derive(Clone, Copy)]
pub(super) struct PortableArgs {
    /// `k`, `w`, `u`, `g`, `gk`, `h0`, `h`, `v_new`, `ht` (0 for an absent gate or state).
    pub ptrs: [Address; 9],
    /// The pass's work records.
    pub work: Address,
    /// Value heads `HV`.
    pub heads: u32,
    /// Columns of the pass's states (`V`, or `K + V` in the pre-scan).
    pub value_dim: u32,
    /// A `kda_kernel::abi::StateLayoutCode`.
    pub state_layout: u32,
    /// A `kda_kernel::abi::PassCode`.
    pub pass: u32,
    /// Token and head strides (elements) of `k`, `w`, `u`, `g`, `gk` and `v_new`, in that order.
    pub strides: [[u32; 2]; 6],
    /// The fused layer pass's `qg`, `attention` and output scale bits (`abi::PORTABLE_FUSED`),
    /// whose `o` takes `v_new`'s place and strides.
    pub fused: Option<(Address, Address, u32)>,
}

impl PortableArgs {
    /// The names of [`Self::ptrs`], in order.
    const TENSORS: [&'static str; 9] = ["k", "w", "u", "g", "gk", "h0", "h", "v_new", "ht"];
    /// The names of [`Self::strides`], in order.
    const STRIDES: [[&'static str; 2]; 6] = [
        ["k_token_stride", "k_head_stride"],
        ["w_token_stride", "w_head_stride"],
        ["u_token_stride", "u_head_stride"],
        ["g_token_stride", "g_head_stride"],
        ["gk_token_stride", "gk_head_stride"],
        ["v_new_token_stride", "v_new_head_stride"],
    ];

    /// Pushes the arguments in the kernel's parameter order.
    pub fn push<'a>(&'a self, sink: &mut impl ArgSink<'a>) {
        // The fused pass's `o` in `v_new`'s place, by name too (`abi::PORTABLE_FUSED_PARAMS`).
        let name = |name: &'static str| match (self.fused.is_some(), name) {
            (true, "v_new") => "o",
            (true, "v_new_token_stride") => "o_token_stride",
            (true, "v_new_head_stride") => "o_head_stride",
            _ => name,
        };
        for (tensor, ptr) in Self::TENSORS.into_iter().zip(&self.ptrs) {
            sink.push(name(tensor), ptr);
        }
        sink.push("work", &self.work);
        sink.push("heads", &self.heads);
        sink.push("value_dim", &self.value_dim);
        sink.push("state_layout", &self.state_layout);
        sink.push("pass", &self.pass);
        for (names, values) in Self::STRIDES.iter().zip(&self.strides) {
            for (stride, value) in names.iter().zip(values) {
                sink.push(name(stride), value);
            }
        }
        if let Some((qg, attention, scale_bits)) = &self.fused {
            sink.push("qg", qg);
            sink.push("attention", attention);
            sink.push("scale_bits", scale_bits);
        }
    }
}

/// The split merge's arguments (`kda_kernel::abi::MERGE_PARAMS`).
pub(super) struct MergeArgs {
    pub maps: Address,
    pub h0: Address,
    pub entries: Address,
    pub table: Address,
    /// Value heads `HV`.
    pub heads: u32,
    pub key_dim: u32,
    pub value_dim: u32,
    /// A `kda_kernel::abi::StateLayoutCode`.
    pub state_layout: u32,
}

impl MergeArgs {
    /// Pushes the arguments in the kernel's parameter order.
    pub fn push<'a>(&'a self, sink: &mut impl ArgSink<'a>) {
        sink.push("maps", &self.maps);
        sink.push("h0", &self.h0);
        sink.push("entries", &self.entries);
        sink.push("table", &self.table);
        sink.push("heads", &self.heads);
        sink.push("key_dim", &self.key_dim);
        sink.push("value_dim", &self.value_dim);
        sink.push("state_layout", &self.state_layout);
    }
}

/// The parameter names of a kernel that takes `P` tensor addresses, then `W` 32-bit words.
pub(super) struct ArgNames<const P: usize, const W: usize> {
    pub tensors: [&'static str; P],
    pub words: [&'static str; W],
}

/// A kernel's arguments as its ABI lists them: `P` tensor addresses, then `W` 32-bit words, each
/// pushed under its parameter name.
pub(super) struct NamedArgs<const P: usize, const W: usize> {
    pub names: &'static ArgNames<P, W>,
    pub ptrs: [Address; P],
    pub words: [u32; W],
}

impl<const P: usize, const W: usize> NamedArgs<P, W> {
    /// Pushes the arguments in the kernel's parameter order.
    pub fn push<'a>(&'a self, sink: &mut impl ArgSink<'a>) {
        push_named(sink, &self.names.tensors, &self.ptrs);
        push_named(sink, &self.names.words, &self.words);
    }

    /// One argument list under `names`, for the launcher's ABI test (`args::tests`).
    #[cfg(test)]
    pub fn sample(names: &'static ArgNames<P, W>) -> Self {
        Self { names, ptrs: [1; P], words: [2; W] }
    }
}

/// Pushes `values` under `names`, pairwise in order: a kernel's tensor addresses, or its 32-bit
/// words.
pub(super) fn push_named<'a, T: DeviceRepr>(sink: &mut impl ArgSink<'a>, names: &[&'static str], values: &'a [T]) {
    for (name, value) in names.iter().zip(values) {
        sink.push(name, value);
    }
}

/// Where a launch's arguments go: cudarc's launch builder (through [`Checked`]), or a recorder
/// in the tests.
pub(super) trait ArgSink<'a> {
    /// Appends the argument `name`, passed by value.
    fn push<T: DeviceRepr>(&mut self, name: &'static str, value: &'a T);
}

/// A launch builder that checks every argument against the kernel's parameter list: its name,
/// its position and its size.
pub(super) struct Checked<'a> {
    pub launch: LaunchArgs<'a>,
    abi: &'static KernelAbi,
    pushed: usize,
    mismatch: Option<String>,
}

impl<'a> Checked<'a> {
    pub fn new(launch: LaunchArgs<'a>, abi: &'static KernelAbi) -> Self {
        Self { launch, abi, pushed: 0, mismatch: None }
    }

    /// `Ok` when exactly the kernel's parameters were pushed, in order, with their sizes.
    pub fn finish(&self) -> Result<(), String> {
        match &self.mismatch {
            Some(m) => Err(m.clone()),
            None if self.pushed != self.abi.params.len() => Err(format!(
                "{}: {} arguments pushed, the kernel takes {}",
                self.abi.entry,
                self.pushed,
                self.abi.params.len()
            )),
            None => Ok(()),
        }
    }
}

impl<'a> ArgSink<'a> for Checked<'a> {
    fn push<T: DeviceRepr>(&mut self, name: &'static str, value: &'a T) {
        let expected = self.abi.params.get(self.pushed);
        let size = std::mem::size_of::<T>();
        if self.mismatch.is_none() && expected.is_none_or(|p| p.name != name || p.bytes() != size) {
            self.mismatch = Some(format!(
                "{}: argument {} is `{name}` of {size} bytes, the kernel's parameter is {expected:?}",
                self.abi.entry, self.pushed
            ));
        }
        self.pushed += 1;
        self.launch.arg(value);
    }
}

#[cfg(test)]
mod tests {
    //! The launch argument list against the `.entry` signature of every kernel in the built PTX:
    //! parameter count, order, sizes and alignments.

    use super::*;
    use crate::ptx;
    use kda_kernel::abi::{
        ADVANCE, BASELINE, DECODE, HOPPER, HOPPER_ENTRIES, HOPPER_FUSED, HOPPER_FUSED_ENTRIES, HOPPER_K64,
        HOPPER_K64_FUSED, HOPPER_K64_NARROW, HOPPER_K64_NARROW_FUSED, HOPPER_K256_NARROW, HOPPER_NARROW,
        HOPPER_NARROW_FUSED, KERNELS, LAYER_OUTPUT, LAYER_OUTPUT_PREPARED, LAYER_PREPARE, LAYER_PREPARE_FUSED,
        LAYER_PREPARE_FUSED_SCALAR, MERGE, POOL_COPY, PORTABLE, PORTABLE_ENTRIES, PORTABLE_FUSED,
        PORTABLE_FUSED_ENTRIES, PORTABLE_FUSED_K64, PORTABLE_FUSED_K64_WIDE, PORTABLE_FUSED_WIDE, PORTABLE_K64,
        PORTABLE_K64_WIDE, PORTABLE_K256, PORTABLE_WIDE, TENSOR_MAP_ALIGN, TENSOR_MAPS, TensorMap,
    };

    /// The kernels the launcher pushes arguments for.
    const ABIS: [&KernelAbi; 28] = [
        &BASELINE,
        &PORTABLE_K64,
        &PORTABLE,
        &PORTABLE_K256,
        &PORTABLE_K64_WIDE,
        &PORTABLE_WIDE,
        &PORTABLE_FUSED_K64,
        &PORTABLE_FUSED,
        &PORTABLE_FUSED_K64_WIDE,
        &PORTABLE_FUSED_WIDE,
        &HOPPER,
        &HOPPER_K64,
        &HOPPER_NARROW,
        &HOPPER_K64_NARROW,
        &HOPPER_K256_NARROW,
        &HOPPER_FUSED,
        &HOPPER_K64_FUSED,
        &HOPPER_NARROW_FUSED,
        &HOPPER_K64_NARROW_FUSED,
        &MERGE,
        &LAYER_PREPARE,
        &LAYER_OUTPUT,
        &LAYER_PREPARE_FUSED,
        &LAYER_PREPARE_FUSED_SCALAR,
        &LAYER_OUTPUT_PREPARED,
        &DECODE,
        &ADVANCE,
        &POOL_COPY,
    ];

    /// One parameter of a PTX `.entry`.
    #[derive(Debug, PartialEq, Eq)]
    struct PtxParam {
        name: String,
        bytes: usize,
        align: usize,
    }

    /// The parameters of `.entry entry(...)` in `ptx`, in order.
    fn entry_params(ptx: &str, entry: &str) -> Vec<PtxParam> {
        let head = format!(".entry {entry}(");
        let start = ptx.find(&head).unwrap_or_else(|| panic!("no `{head}` in the PTX")) + head.len();
        let end = start + ptx[start..].find(')').expect("parameter list closes");
        ptx[start..end].split(',').map(str::trim).filter(|p| !p.is_empty()).map(parse_param).collect()
    }

    /// `.param .align A .b8 NAME[N]`, `.param .u64 .ptr .align A NAME` (a pointer: `A` is the
    /// pointee's alignment) or `.param .uN NAME`.
    fn parse_param(decl: &str) -> PtxParam {
        let words: Vec<&str> = decl.split_whitespace().collect();
        match words.as_slice() {
            [".param", ".u64", ".ptr", ".align", _, name] => PtxParam { name: (*name).into(), bytes: 8, align: 8 },
            [".param", ".align", align, ".b8", array] => {
                let (name, bytes) = array.trim_end_matches(']').split_once('[').expect("array parameter");
                PtxParam { name: name.into(), bytes: bytes.parse().unwrap(), align: align.parse().unwrap() }
            }
            [".param", ty, name] => {
                let bits: usize = ty[2..].parse().unwrap_or_else(|_| panic!("scalar type {ty}"));
                PtxParam { name: (*name).into(), bytes: bits / 8, align: bits / 8 }
            }
            _ => panic!("unexpected parameter declaration `{decl}`"),
        }
    }

    /// Records what a launch pushes: each argument's name and size.
    #[derive(Default)]
    struct Recorder(Vec<(&'static str, usize)>);

    impl<'a> ArgSink<'a> for Recorder {
        fn push<T: DeviceRepr>(&mut self, name: &'static str, _: &'a T) {
            self.0.push((name, std::mem::size_of::<T>()));
        }
    }

    /// Checks the arguments a launch of `kernel` pushes against its entry in every module that
    /// holds it, and against its ABI parameter list.
    fn check_entry(kernel: &KernelAbi, pushed: &[(&'static str, usize)]) {
        let mut modules = 0;
        for ptx in ptx::modules_of(kernel) {
            modules += 1;
            let entry = entry_params(ptx, kernel.entry);
            println!("{}: PTX {entry:?}\n  launch pushes {pushed:?}", kernel.entry);
            assert_eq!(entry.len(), pushed.len(), "{}: parameter count", kernel.entry);
            assert_eq!(kernel.params.len(), pushed.len(), "{}: ABI parameter count", kernel.entry);
            for (i, ((p, &(name, size)), abi)) in entry.iter().zip(pushed).zip(kernel.params).enumerate() {
                assert_eq!(p.name, format!("{}_param_{i}", kernel.entry), "parameter order");
                assert_eq!((p.bytes, size, abi.bytes()), (size, size, size), "{}: size of `{name}`", kernel.entry);
                assert_eq!(p.align, abi.align(), "{}: alignment of `{name}`", kernel.entry);
                assert_eq!(name, abi.name, "{}: parameter {i}", kernel.entry);
            }
        }
        assert!(modules > 0, "{} is in no module", kernel.entry);
    }

    #[test]
    fn every_kernel_entry_matches_its_launch_argument_list() {
        let hopper = HopperArgs {
            maps: MapsArg(TensorMaps([TensorMap([0; 16]); TENSOR_MAPS])),
            g: 1,
            gk: 2,
            h0: 3,
            v_new: 4,
            ht: 5,
            work: 6,
            heads: 7,
            value_dim: 8,
            state_layout: 9,
            pass: 1,
            strides: [[10, 11], [12, 13], [14, 15]],
            fused_scale_bits: None,
        };
        let mut pushed = Recorder::default();
        hopper.push(&mut pushed);
        // Every key size's and block width's entry takes the same arguments.
        for abi in HOPPER_ENTRIES {
            check_entry(abi, &pushed.0);
        }
        // The fused layer pass's entries take them with `o`, and the scale.
        let fused = HopperArgs { fused_scale_bits: Some(16), ..hopper };
        let mut pushed = Recorder::default();
        fused.push(&mut pushed);
        for abi in HOPPER_FUSED_ENTRIES {
            check_entry(abi, &pushed.0);
        }

        let baseline = BaselineArgs { ptrs: [1, 2, 3, 4, 5, 6, 7, 8], seqs: 9, heads: 10, key_heads: 5 };
        let mut pushed = Recorder::default();
        baseline.push(&mut pushed);
        check_entry(&BASELINE, &pushed.0);

        let portable = PortableArgs {
            ptrs: [1, 2, 3, 4, 5, 6, 7, 8, 9],
            work: 10,
            heads: 11,
            value_dim: 13,
            state_layout: 1,
            pass: 1,
            strides: [[14, 15], [16, 17], [18, 19], [20, 21], [22, 23], [24, 25]],
            fused: None,
        };
        let mut pushed = Recorder::default();
        portable.push(&mut pushed);
        // Every variant's entry takes the same arguments.
        for abi in PORTABLE_ENTRIES {
            check_entry(abi, &pushed.0);
        }
        // The fused layer pass's take them with `o`, then `qg`, `attention` and the scale.
        let fused = PortableArgs { fused: Some((26, 27, 28)), ..portable };
        let mut pushed = Recorder::default();
        fused.push(&mut pushed);
        for abi in PORTABLE_FUSED_ENTRIES {
            check_entry(abi, &pushed.0);
        }

        let merge =
            MergeArgs { maps: 1, h0: 2, entries: 3, table: 4, heads: 5, key_dim: 6, value_dim: 7, state_layout: 8 };
        let mut pushed = Recorder::default();
        merge.push(&mut pushed);
        check_entry(&MERGE, &pushed.0);

        let (prepare, output, prepare_fused) = super::super::layer::sample_args();
        let mut pushed = Recorder::default();
        prepare.push(&mut pushed);
        check_entry(&LAYER_PREPARE, &pushed.0);
        for (args, abi) in output.iter().zip([&LAYER_OUTPUT, &LAYER_OUTPUT_PREPARED]) {
            let mut pushed = Recorder::default();
            args.push(&mut pushed);
            check_entry(abi, &pushed.0);
        }
        let mut pushed = Recorder::default();
        prepare_fused.push(&mut pushed);
        check_entry(&LAYER_PREPARE_FUSED, &pushed.0);
        check_entry(&LAYER_PREPARE_FUSED_SCALAR, &pushed.0);
        let mut pushed = Recorder::default();
        super::super::decode::sample_args().push(&mut pushed);
        check_entry(&DECODE, &pushed.0);
        let mut pushed = Recorder::default();
        super::super::checkpoint::sample_args().push(&mut pushed);
        check_entry(&ADVANCE, &pushed.0);

        let mut pushed = Recorder::default();
        super::super::pooled::sample_args().push(&mut pushed);
        check_entry(&POOL_COPY, &pushed.0);

        // Those are every kernel there is.
        assert_eq!(KERNELS.map(|k| k.entry), ABIS.map(|k| k.entry));
    }

    #[test]
    fn the_tensor_maps_are_declared_as_tma_needs() {
        let entries = HOPPER_ENTRIES.into_iter().chain(HOPPER_FUSED_ENTRIES);
        for (abi, ptx) in entries.flat_map(|k| ptx::modules_of(k).map(move |p| (k, p))) {
            let maps = &entry_params(ptx, abi.entry)[0];
            assert_eq!(maps.bytes, TENSOR_MAPS * 128, "{maps:?}");
            assert!(maps.align.is_multiple_of(TENSOR_MAP_ALIGN), "{maps:?}");
        }
    }

    #[test]
    fn the_parser_reads_every_declaration_form() {
        let ptx = ".visible .entry f(\n\t.param .align 64 .b8 f_param_0[1152],\n\t.param .u64 .ptr .align 1 f_param_1,\n\t.param .u32 f_param_2\n)\n{";
        let want = [("f_param_0", 1152, 64), ("f_param_1", 8, 8), ("f_param_2", 4, 4)].map(|(n, b, a)| PtxParam {
            name: n.into(),
            bytes: b,
            align: a,
        });
        assert_eq!(entry_params(ptx, "f"), want);
    }
}
