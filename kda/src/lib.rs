#![doc = include_str!("../../README.md")]
#![warn(missing_docs)]

mod error;
pub mod floor;
pub mod gpu;
mod launch;
pub mod inputs;
pub mod io;
mod plan;
pub mod ptx;
mod problem;
pub mod reference;
pub mod schedule;

pub use error::KdaError;
pub use gpu::DeviceProblem;
pub use launch::{DevicePlan, Kda, KdaInputs, KdaOutputs, Kernel, TENSOR_ALIGN};
pub use plan::{Plan, SeqDesc};
pub use schedule::Schedule;
pub use problem::{rel_error, Dims, Outputs, Problem};
pub use half::bf16;
pub use kda_kernel::layout;
