//! Argument validation: every device tensor's length against its contract shape, its alignment
//! and its device.

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
}
