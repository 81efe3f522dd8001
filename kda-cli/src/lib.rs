//! The measurement harness around the `kda` library, and the `kda` command line (`src/main.rs`).
//!
//! Tools and tests that start from host data and time the kernels use these; a model needs none of
//! them (it launches through [`kda::Kda::launch`] on its own device tensors):
//!
//! * [`DeviceProblem`]: a [`kda::Problem`] copied to the device with output buffers;
//! * [`DeviceLayer`]: a layer problem on the device, launched through `kda::Kda::launch_layer`;
//! * [`median_us`], [`copy_bandwidth`]: event timing of launches and of device copies;
//! * [`floor_bytes`], [`floor_us`], [`model_floor_bytes`], [`model_floor_us`]: the memory floor
//!   (docs/CONTRACT.md#the-memory-floor);
//! * [`bench_shapes`], [`model_bench_shapes`]: the benchmark's batch layouts and model shapes
//!   (docs/CONTRACT.md#reference-shapes);
//! * [`cuda_tool`]: where NVIDIA's `ptxas`, `cuobjdump` and `nvdisasm` are;
//! * [`RemoveOnInterrupt`]: an output's temporary file removed if Ctrl-C or a signal ends the
//!   process during its write.
#![warn(missing_docs)]

pub mod decode;
pub mod device;
pub mod floor;
pub mod interrupt;
pub mod layer;
pub mod progress;
pub mod shapes;
pub mod timing;
pub mod tools;

pub use decode::{DecodeShape, DecodeTiming, decode_bench_shapes, decode_floor_bytes, time_decode};
pub use device::DeviceProblem;
pub use floor::{floor_bytes, floor_us, model_floor_bytes, model_floor_us};
pub use interrupt::RemoveOnInterrupt;
pub use layer::{
    BENCH_ERROR_BOUNDS, DeviceLayer, HOST_TIMED_CALLS, LayerBenchShape, LayerTiming, layer_bench_shapes,
    layer_floor_bytes, reference_heads, time_layer, time_layer_calls, time_layer_shape,
};
pub use progress::Progress;
pub use shapes::{bench_shapes, gates_name, layout_name, model_bench_shapes};
pub use timing::{COPY_BENCH_BYTES, StagedLaunch, copy_bandwidth, median_stage_us, median_us, stage_medians};
pub use tools::{TOOLS_VENV, cuda_tool};
