//! Argument validation: every device tensor's length against its contract shape, its alignment
//! and its device.

use crate::model::{ModelShape, StateLayout};
use crate::strides::Strides;
use crate::{Dims, KdaError, Tensor};
use cudarc::driver::{CudaStream, DevicePtr};
use std::sync::Arc;

/// Device tensors must start at this many bytes: the alignment TMA tile loads need (and more than
/// the baseline's 32-bit accesses need).
pub const TENSOR_ALIGN: usize = 16;

/// What validation needs to know of one device tensor argument.
#[derive(Clone, Copy, Debug)]
pub(super) struct TensorArg {
    tensor: Tensor,
    len: usize,
    address: u64,
    ordinal: usize,
}

impl TensorArg {
    pub(super) fn of<T, S: DevicePtr<T>>(tensor: Tensor, t: &S, stream: &Arc<CudaStream>) -> Self {
        let (address, _record) = t.device_ptr(stream);
        Self { tensor, len: t.len(), address, ordinal: t.stream().context().ordinal() }
    }
}

/// Everything a launch's arguments are checked against: the plan's sizes, shape and strides, and
/// the devices of the launcher, the stream and the plan.
pub(super) struct Launch<'a> {
    pub dims: &'a Dims,
    pub shape: &'a ModelShape,
    pub strides: &'a Strides,
    /// The launcher's device.
    pub ordinal: usize,
    pub stream_ordinal: usize,
    pub plan_ordinal: usize,
}

/// The first of `named` (tensor, device address, required alignment in bytes) whose address is
/// not a multiple of its alignment, as [`KdaError::Alignment`].
pub(super) fn check_alignments(named: &[(&'static str, u64, usize)]) -> Result<(), KdaError> {
    match named.iter().find(|(_, address, required)| !address.is_multiple_of(*required as u64)) {
        Some(&(tensor, address, required)) => Err(KdaError::Alignment { tensor, required, address }),
        None => Ok(()),
    }
}

/// Checks a launch's arguments (`args`: every tensor given, inputs and outputs) before anything
/// is enqueued: the stream and the plan on the launcher's device, the gates given exactly when
/// the plan's shape has them, and each tensor's length, alignment and device.
pub(super) fn check_launch(l: &Launch<'_>, args: &[TensorArg]) -> Result<(), KdaError> {
    for (name, actual) in [("stream", l.stream_ordinal), ("plan", l.plan_ordinal)] {
        if actual != l.ordinal {
            return Err(KdaError::WrongDevice { tensor: name, expected: l.ordinal, actual });
        }
    }
    let given = |t: Tensor| args.iter().any(|a| a.tensor == t);
    for (tensor, wanted) in [(Tensor::G, l.shape.gates.g), (Tensor::Gk, l.shape.gates.gk)] {
        if wanted != given(tensor) {
            let (has, was) = if wanted { ("has", "none was given") } else { ("has no", "one was given") };
            return Err(KdaError::Argument {
                name: tensor.name(),
                reason: format!("the plan's shape {has} gate `{tensor}`, and {was}"),
            });
        }
    }
    args.iter().try_for_each(|&a| check_arg(l.dims, l.strides, l.ordinal, a))
}

/// What the Hopper kernel runs: `K` in `KEY_DIMS` (64 or 128); `V` a multiple of its column
/// block up to `MAX_V_DIM`; every gate combination and state layout; strides TMA can express.
pub(super) fn hopper_supports(strides: &Strides, dims: &Dims) -> Result<(), KdaError> {
    use kda_kernel::layout::{MAX_V_DIM, hopper::BV, hopper::KEY_DIMS};
    if !KEY_DIMS.contains(&dims.key_dim) {
        return Err(KdaError::Unsupported {
            argument: "key_dim",
            reason: format!("K = {}: the Hopper kernel runs K in {KEY_DIMS:?}", dims.key_dim),
        });
    }
    if !dims.value_dim.is_multiple_of(BV) || dims.value_dim > MAX_V_DIM {
        return Err(KdaError::Unsupported {
            argument: "value_dim",
            reason: format!("V = {}: the Hopper kernel runs multiples of {BV} up to {MAX_V_DIM}", dims.value_dim),
        });
    }
    strides.check_hopper(dims)
}

/// What the portable tensor-core kernel runs: the whole generalized contract at `K` in
/// `layout::portable::KEY_DIMS` and `V` a multiple of its column block, rows the kernel can load
/// (`Strides::check_portable`).
pub(super) fn portable_supports(strides: &Strides, dims: &Dims) -> Result<(), KdaError> {
    use kda_kernel::layout::portable::{BV, KEY_DIMS};
    if !KEY_DIMS.contains(&dims.key_dim) {
        return Err(KdaError::Unsupported {
            argument: "key_dim",
            reason: format!("K = {}: the portable kernel runs K in {KEY_DIMS:?}", dims.key_dim),
        });
    }
    if !dims.value_dim.is_multiple_of(BV) || u32::try_from(dims.value_dim).is_err() {
        return Err(KdaError::Unsupported {
            argument: "value_dim",
            reason: format!("V = {}: the portable kernel runs multiples of {BV}", dims.value_dim),
        });
    }
    strides.check_portable(dims)
}

/// What the baseline kernel runs: KDA's slice (`gk` alone, `K = V = 128`, key-first states,
/// packed tensors).
pub(super) fn baseline_supports(shape: &ModelShape, strides: &Strides, dims: &Dims) -> Result<(), KdaError> {
    use kda_kernel::layout::{K_DIM, V_DIM};
    let gates = shape.gates;
    let unsupported = |argument: &'static str, what: &str| {
        Err(KdaError::Unsupported { argument, reason: format!("{what}: the baseline kernel runs only KDA's slice") })
    };
    if dims.key_dim != K_DIM || dims.value_dim != V_DIM {
        return unsupported("key_dim", &format!("K = {}, V = {}", dims.key_dim, dims.value_dim));
    }
    if gates.g || !gates.gk {
        return unsupported(if gates.g { "g" } else { "gk" }, "a scalar gate, or no per-key gate");
    }
    if dims.layout != StateLayout::KeyFirst {
        return unsupported("layout", "value-first states");
    }
    if *strides != Strides::PACKED {
        return unsupported("strides", "strided views");
    }
    Ok(())
}

/// Checks one argument's length against its contract shape (at its strides), its alignment and
/// its device.
pub(super) fn check_arg(dims: &Dims, strides: &Strides, ordinal: usize, arg: TensorArg) -> Result<(), KdaError> {
    strides.check_len(dims, arg.tensor, arg.len)?;
    if arg.ordinal != ordinal {
        return Err(KdaError::WrongDevice { tensor: arg.tensor.name(), expected: ordinal, actual: arg.ordinal });
    }
    if !arg.address.is_multiple_of(TENSOR_ALIGN as u64) {
        return Err(KdaError::Alignment { tensor: arg.tensor.name(), required: TENSOR_ALIGN, address: arg.address });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Plan;

    fn dims() -> Dims {
        Dims::new(&Plan::from_lengths(&[200, 0, 65]), 2)
    }

    fn arg(name: &'static str, len: usize) -> TensorArg {
        let tensor = Tensor::from_name(name).expect("a tensor of the contract");
        TensorArg { tensor, len, address: 0x7000_0000, ordinal: 0 }
    }

    #[test]
    fn exact_lengths_pass() {
        let d = dims();
        for (name, len) in
            [("k", d.key_len()), ("gk", d.key_len()), ("u", d.value_len()), ("h", d.h_len()), ("ht", d.state_len())]
        {
            check_arg(&d, &Strides::PACKED, 0, arg(name, len)).unwrap();
        }
    }

    #[test]
    fn every_tensor_reports_its_own_shape() {
        let d = dims();
        let cases = [
            ("k", d.key_len(), "[T=265, H=2, K=128]"),
            ("w", d.key_len(), "[T=265, H=2, K=128]"),
            ("gk", d.key_len(), "[T=265, H=2, K=128]"),
            ("u", d.value_len(), "[T=265, H=2, V=128]"),
            ("v_new", d.value_len(), "[T=265, H=2, V=128]"),
            ("h0", d.state_len(), "[N=3, H=2, K=128, V=128]"),
            ("ht", d.state_len(), "[N=3, H=2, K=128, V=128]"),
            ("h", d.h_len(), "[NT=6, H=2, K=128, V=128]"),
        ];
        for (name, len, shape) in cases {
            for wrong in [len - 1, len + 1, 0] {
                let err = check_arg(&d, &Strides::PACKED, 0, arg(name, wrong)).unwrap_err();
                match &err {
                    KdaError::Shape { tensor, expected, expected_len, actual } => {
                        assert_eq!((*tensor, expected.as_str(), *expected_len), (name, shape, len));
                        assert_eq!(actual, &format!("{wrong} elements"));
                    }
                    other => panic!("{name}: unexpected {other}"),
                }
                assert!(err.to_string().contains(name), "{err}");
            }
        }
    }

    #[test]
    fn the_first_misaligned_tensor_is_named() {
        assert!(check_alignments(&[("q", 256, 16), ("g", 4, 4)]).is_ok());
        let err = check_alignments(&[("q", 256, 16), ("k", 264, 16), ("v", 8, 16)]).unwrap_err();
        assert!(matches!(err, KdaError::Alignment { tensor: "k", required: 16, address: 264 }), "{err}");
    }

    #[test]
    fn misaligned_and_foreign_tensors_are_rejected() {
        let d = dims();
        let mut a = arg("u", d.value_len());
        a.address += 2;
        let err = check_arg(&d, &Strides::PACKED, 0, a).unwrap_err();
        assert!(matches!(err, KdaError::Alignment { tensor: "u", required: TENSOR_ALIGN, .. }), "{err}");
        let mut a = arg("w", d.key_len());
        a.ordinal = 1;
        let err = check_arg(&d, &Strides::PACKED, 0, a).unwrap_err();
        assert!(matches!(err, KdaError::WrongDevice { tensor: "w", expected: 0, actual: 1 }), "{err}");
    }

    /// A valid launch of `shape` on a ragged batch, and every tensor argument it takes.
    struct Valid {
        dims: Dims,
        shape: ModelShape,
        strides: Strides,
        args: Vec<TensorArg>,
    }

    impl Valid {
        fn new(shape: ModelShape, strides: Strides) -> Self {
            let plan = Plan::from_lengths(&[130, 0, 65]);
            let dims = Dims::model(&plan, &shape);
            let mut tensors = vec![Tensor::K, Tensor::W, Tensor::U, Tensor::H0, Tensor::H, Tensor::VNew, Tensor::Ht];
            if shape.gates.g {
                tensors.push(Tensor::G);
            }
            if shape.gates.gk {
                tensors.push(Tensor::Gk);
            }
            let args = tensors
                .into_iter()
                .enumerate()
                .map(|(i, tensor)| TensorArg {
                    tensor,
                    len: strides.len_of(&dims, tensor).unwrap(),
                    address: 0x7000_0000 + (i as u64) * 0x100_0000,
                    ordinal: 0,
                })
                .collect();
            Self { dims, shape, strides, args }
        }

        fn launch(&self) -> Launch<'_> {
            Launch {
                dims: &self.dims,
                shape: &self.shape,
                strides: &self.strides,
                ordinal: 0,
                stream_ordinal: 0,
                plan_ordinal: 0,
            }
        }

        /// The launch checked with `args`, then, when it passes, what `kernel` supports.
        fn check(&self, args: &[TensorArg], launch: &Launch<'_>, hopper: bool) -> Result<(), KdaError> {
            check_launch(launch, args)?;
            if hopper {
                hopper_supports(launch.strides, launch.dims)
            } else {
                baseline_supports(launch.shape, launch.strides, launch.dims)
            }
        }
    }

    /// Every way to get a launch's arguments wrong that the launcher can see, each against the
    /// typed error that names it; the valid launches around them pass. Prints how many cases ran.
    #[test]
    fn the_bad_argument_matrix() {
        use crate::model::Gates;
        use crate::strides::RowStrides;
        let mut cases = 0;
        let mut expect = |what: &str, got: Result<(), KdaError>, want: &dyn Fn(&KdaError) -> bool| {
            cases += 1;
            match got {
                Err(e) if want(&e) => {}
                other => panic!("{what}: got {other:?}"),
            }
        };
        let qwen = ModelShape { value_heads: 4, gates: Gates { g: true, gk: false }, ..ModelShape::kda(2) };
        let kda = ModelShape::kda(2);
        for (shape, hopper) in [(kda, true), (kda, false), (qwen, true)] {
            let v = Valid::new(shape, Strides::PACKED);
            check_launch(&v.launch(), &v.args).unwrap();
            // Each tensor one element short, one long, empty; misaligned; on another device.
            for (i, a) in v.args.iter().enumerate() {
                let name = a.tensor.name();
                for len in [a.len - 1, a.len + 1, 0] {
                    let mut args = v.args.clone();
                    args[i].len = len;
                    let is_shape = |e: &KdaError| matches!(e, KdaError::Shape { tensor, .. } if *tensor == name);
                    expect(&format!("{name} of {len}"), v.check(&args, &v.launch(), hopper), &is_shape);
                }
                for offset in [2, 4, 8] {
                    let mut args = v.args.clone();
                    args[i].address += offset;
                    let is_align = |e: &KdaError| matches!(e, KdaError::Alignment { tensor, .. } if *tensor == name);
                    expect(&format!("{name} at +{offset}"), v.check(&args, &v.launch(), hopper), &is_align);
                }
                let mut args = v.args.clone();
                args[i].ordinal = 1;
                let is_device = |e: &KdaError| matches!(e, KdaError::WrongDevice { tensor, .. } if *tensor == name);
                expect(&format!("{name} on device 1"), v.check(&args, &v.launch(), hopper), &is_device);
            }
            // The stream or the plan of another device.
            for which in ["stream", "plan"] {
                let mut l = v.launch();
                *(if which == "stream" { &mut l.stream_ordinal } else { &mut l.plan_ordinal }) = 1;
                let is_device = |e: &KdaError| matches!(e, KdaError::WrongDevice { tensor, .. } if *tensor == which);
                expect(which, v.check(&v.args, &l, hopper), &is_device);
            }
            // A gate the shape does not have, or one it has left out.
            for gate in [Tensor::G, Tensor::Gk] {
                let mut args = v.args.clone();
                match args.iter().position(|a| a.tensor == gate) {
                    Some(i) => drop(args.remove(i)),
                    None => args.push(TensorArg {
                        tensor: gate,
                        len: v.dims.len_of(gate).unwrap(),
                        address: 0x100,
                        ordinal: 0,
                    }),
                }
                let is_gate = |e: &KdaError| matches!(e, KdaError::Argument { name, .. } if *name == gate.name());
                expect(&format!("{gate} given against the shape"), v.check(&args, &v.launch(), hopper), &is_gate);
            }
        }
        // What each kernel does not run.
        let unsupported = |argument: &'static str| move |e: &KdaError| matches!(e, KdaError::Unsupported { argument: a, .. } if *a == argument);
        for (shape, argument) in [
            (ModelShape { key_dim: 512, ..kda }, "key_dim"),
            (ModelShape { key_dim: 96, ..kda }, "key_dim"),
            (ModelShape { value_dim: 96, ..kda }, "value_dim"),
            (ModelShape { value_dim: 576, ..kda }, "value_dim"),
        ] {
            let v = Valid::new(shape, Strides::PACKED);
            expect(
                &format!("{shape:?} on the Hopper kernel"),
                v.check(&v.args, &v.launch(), true),
                &unsupported(argument),
            );
        }
        for (shape, argument) in [
            (qwen, "g"),
            (ModelShape { gates: Gates { g: false, gk: false }, ..kda }, "gk"),
            (ModelShape { layout: StateLayout::ValueFirst, ..kda }, "layout"),
            (ModelShape { value_dim: 256, ..kda }, "key_dim"),
        ] {
            let v = Valid::new(shape, Strides::PACKED);
            expect(&format!("{shape:?} on the baseline"), v.check(&v.args, &v.launch(), false), &unsupported(argument));
        }
        // Strides: TMA cannot express them (Hopper), the baseline runs none, a buffer too short.
        let padded = RowStrides { token: 2 * 128 + 64, head: 128 };
        let odd = RowStrides { token: 2 * 128 + 3, head: 128 };
        for tensor in ["k", "w", "u", "v_new"] {
            let set = |s: RowStrides| {
                let mut st = Strides::PACKED;
                *match tensor {
                    "k" => &mut st.k,
                    "w" => &mut st.w,
                    "u" => &mut st.u,
                    _ => &mut st.v_new,
                } = Some(s);
                st
            };
            let v = Valid::new(kda, set(odd));
            expect(&format!("{tensor} at an odd stride"), v.check(&v.args, &v.launch(), true), &unsupported(tensor));
            let v = Valid::new(kda, set(padded));
            v.check(&v.args, &v.launch(), true).unwrap();
            expect(
                &format!("{tensor} strided on the baseline"),
                v.check(&v.args, &v.launch(), false),
                &unsupported("strides"),
            );
            let mut args = v.args.clone();
            let i = args.iter().position(|a| a.tensor.name() == tensor).unwrap();
            args[i].len -= 1;
            let is_shape = |e: &KdaError| matches!(e, KdaError::Shape { tensor: t, .. } if *t == tensor);
            expect(&format!("{tensor} strided, one element short"), v.check(&args, &v.launch(), true), &is_shape);
        }
        // An output whose rows overlap.
        let v = Valid::new(kda, Strides { v_new: Some(RowStrides { token: 128, head: 64 }), ..Strides::PACKED });
        let overlap = |e: &KdaError| matches!(e, KdaError::Argument { name: "v_new", .. });
        expect("v_new rows overlapping", v.check(&v.args, &v.launch(), true), &overlap);
        // Head counts that do not divide, or none; `cu_seqlens` that is not a batch.
        let heads = |e: &KdaError| matches!(e, KdaError::Argument { name: "value_heads" | "heads", .. });
        for shape in [ModelShape { value_heads: 3, ..kda }, ModelShape { heads: 0, ..kda }] {
            expect(&format!("{shape:?}"), shape.validate(), &heads);
        }
        let cu = |e: &KdaError| matches!(e, KdaError::CuSeqlens { .. });
        for bad in [&[1i64, 5][..], &[0, 5, 3], &[], &[0, -1]] {
            expect(&format!("cu_seqlens {bad:?}"), Plan::from_cu_seqlens(bad).map(drop), &cu);
        }
        println!("bad-argument matrix: {cases} cases, each its own typed error");
        assert!(cases > 200, "{cases}");
    }

    #[test]
    fn the_portable_kernel_runs_every_shape_the_baseline_runs_and_refuses_odd_sizes() {
        use crate::model::{Gates, ModelShape};
        let dims = |shape: &ModelShape| Dims::model(&Plan::from_lengths(&[70, 3]), shape);
        let kda = ModelShape::kda(2);
        assert!(baseline_supports(&kda, &Strides::PACKED, &dims(&kda)).is_ok());
        let gdn = ModelShape { value_heads: 4, gates: Gates { g: true, gk: false }, ..kda };
        for shape in [
            kda,
            gdn,
            ModelShape { layout: StateLayout::ValueFirst, ..kda },
            ModelShape { key_dim: 64, value_dim: 64, ..kda },
            ModelShape { key_dim: 256, value_dim: 512, ..gdn },
            ModelShape { value_dim: 96, ..kda },
        ] {
            assert!(portable_supports(&Strides::PACKED, &dims(&shape)).is_ok(), "{shape:?}");
        }
        let padded = Strides { k: Some(crate::RowStrides { token: 2 * 136, head: 136 }), ..Strides::PACKED };
        assert!(portable_supports(&padded, &dims(&kda)).is_ok());
        let refused = |shape: ModelShape, strides: Strides| match portable_supports(&strides, &dims(&shape)) {
            Err(KdaError::Unsupported { argument, .. }) => argument,
            other => panic!("{shape:?}: {other:?}"),
        };
        assert_eq!(refused(ModelShape { key_dim: 96, ..kda }, Strides::PACKED), "key_dim");
        assert_eq!(refused(ModelShape { value_dim: 48, ..kda }, Strides::PACKED), "value_dim");
        let odd = Strides { u: Some(crate::RowStrides { token: 2 * 128 + 3, head: 128 }), ..Strides::PACKED };
        assert_eq!(refused(kda, odd), "u");
    }
}
