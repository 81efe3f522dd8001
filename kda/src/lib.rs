#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod device;
mod error;
mod launch;
mod plan;
mod problem;

#[cfg(feature = "candle")]
pub mod candle;
pub mod columns;
pub mod inputs;
pub mod io;
pub mod layer;
pub mod model;
pub mod pool;
pub mod precision;
pub mod reference;
pub mod schedule;
pub mod split;
pub mod strides;

/// The embedded PTX and its kernel names, for the PTX checks in `tests/` and `xtask` (not part
/// of the model-facing API).
#[doc(hidden)]
pub mod ptx;

pub use error::KdaError;
pub use half::bf16;
pub use launch::{
    CODE_VAR, CheckpointPlan, Code, DECODE_STAGGER_NS, DECODE_STAGGER_VAR, DecodeInputs, DecodePlan, DevicePlan,
    FloatBuffer, FloatInput, KERNEL_VAR, Kda, KdaInputs, KdaOptions, KdaOutputs, Kernel, LayerDeviceOutputs,
    LayerInputs, LayerPlan, LayerPool, LayerStage, LayerWorkspace, MODULE_VAR, Module, ModuleCode, OUTPUT_VAR,
    OutputPath, PooledStates, TENSOR_ALIGN,
};
pub use model::{Gates, ModelShape, StateLayout};
pub use plan::{Plan, SeqDesc};
pub use precision::rel_error;
pub use problem::{Dims, Outputs, Problem, Tensor};
pub use strides::{RowStrides, Strides};

/// The layout constants shared with the device crate: head sizes, the chunk length, the
/// descriptor and work-record formats, and each kernel's launch shape.
pub use kda_kernel::layout;

/// The work schedule, for the launcher (`crate::Schedule`); public as [`schedule::Schedule`].
pub(crate) use schedule::Schedule;
