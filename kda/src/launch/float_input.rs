//! A float token input that model code gives in f32 or bf16: the gate `g` and `beta`
//! (`../shared/LAYER.md`). The kernels read either, told by an option bit
//! ([`crate::layer::TokenDtypes::option_bits`]), so a model's bf16 gate projection goes in as it
//! comes, with no conversion pass and half the bytes.

use super::args::Address;
use super::layer::keep;
use crate::KdaError;
use crate::layer::InputDtype;
use cudarc::driver::{CudaSlice, CudaStream, CudaView, DevicePtr, DeviceSlice, SyncOnDrop};
use half::bf16;
use std::ops::RangeBounds;
use std::sync::Arc;

/// The gate `g` or `beta` on the device, in either dtype the layer, the decode step and the
/// checkpoints take. Made from a view of either with `into()`:
///
/// ```no_run
/// # fn demo(g: &cudarc::driver::CudaSlice<kda::bf16>, beta: &cudarc::driver::CudaSlice<f32>) {
/// let g: kda::FloatInput = g.slice(..).into();
/// let beta: kda::FloatInput = beta.slice(..).into();
/// assert_eq!(g.dtype(), kda::layer::InputDtype::Bf16);
/// # }
/// ```
pub enum FloatInput<'a> {
    /// f32 elements.
    F32(CudaView<'a, f32>),
    /// bf16 elements.
    Bf16(CudaView<'a, bf16>),
}

impl FloatInput<'_> {
    /// Elements.
    pub fn len(&self) -> usize {
        match self {
            FloatInput::F32(x) => x.len(),
            FloatInput::Bf16(x) => x.len(),
        }
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type.
    pub fn dtype(&self) -> InputDtype {
        match self {
            FloatInput::F32(_) => InputDtype::F32,
            FloatInput::Bf16(_) => InputDtype::Bf16,
        }
    }

    /// The whole input, reborrowed (as `CudaView::slice(..)` does for a view).
    pub fn view(&self) -> FloatInput<'_> {
        match self {
            FloatInput::F32(x) => FloatInput::F32(x.slice(..)),
            FloatInput::Bf16(x) => FloatInput::Bf16(x.slice(..)),
        }
    }

    /// The stream the memory belongs to.
    pub(super) fn stream(&self) -> &Arc<CudaStream> {
        match self {
            FloatInput::F32(x) => x.stream(),
            FloatInput::Bf16(x) => x.stream(),
        }
    }

    /// The device address, its stream record kept in `records` until the launch is enqueued.
    pub(super) fn address<'s>(&'s self, stream: &'s Arc<CudaStream>, records: &mut Vec<SyncOnDrop<'s>>) -> Address {
        match self {
            FloatInput::F32(x) => keep(records, x.device_ptr(stream)),
            FloatInput::Bf16(x) => keep(records, x.device_ptr(stream)),
        }
    }
}

impl<'a> From<CudaView<'a, f32>> for FloatInput<'a> {
    fn from(x: CudaView<'a, f32>) -> Self {
        FloatInput::F32(x)
    }
}

impl<'a> From<CudaView<'a, bf16>> for FloatInput<'a> {
    fn from(x: CudaView<'a, bf16>) -> Self {
        FloatInput::Bf16(x)
    }
}

/// A gate or `beta` owned on the device in either dtype, as [`FloatInput`] views it.
pub enum FloatBuffer {
    /// f32 elements.
    F32(CudaSlice<f32>),
    /// bf16 elements.
    Bf16(CudaSlice<bf16>),
}

impl FloatBuffer {
    /// Copies `values` to the device on `stream` in `dtype` (each rounded to the nearest bf16
    /// there). An empty input gets one zero element: a device allocation is never empty.
    pub fn upload(stream: &Arc<CudaStream>, values: &[f32], dtype: InputDtype) -> Result<Self, KdaError> {
        Ok(match dtype {
            InputDtype::F32 if values.is_empty() => FloatBuffer::F32(stream.alloc_zeros(1)?),
            InputDtype::F32 => FloatBuffer::F32(stream.clone_htod(values)?),
            InputDtype::Bf16 if values.is_empty() => FloatBuffer::Bf16(stream.alloc_zeros(1)?),
            InputDtype::Bf16 => {
                let rounded: Vec<bf16> = values.iter().map(|&x| bf16::from_f32(x)).collect();
                FloatBuffer::Bf16(stream.clone_htod(&rounded)?)
            }
        })
    }

    /// Elements.
    pub fn len(&self) -> usize {
        self.slice(..).len()
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type.
    pub fn dtype(&self) -> InputDtype {
        self.slice(..).dtype()
    }

    /// A view of elements `range`.
    ///
    /// # Panics
    /// When `range` is not inside the buffer (as `CudaSlice::slice`).
    pub fn slice(&self, range: impl RangeBounds<usize>) -> FloatInput<'_> {
        match self {
            FloatBuffer::F32(x) => FloatInput::F32(x.slice(range)),
            FloatBuffer::Bf16(x) => FloatInput::Bf16(x.slice(range)),
        }
    }
}
