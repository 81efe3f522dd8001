//! The one error type of the library: every variant carries the data that was wrong.

use std::fmt;

/// Everything that can go wrong between the caller's tensors and a finished launch.
#[derive(Debug)]
pub enum KdaError {
    /// `cu_seqlens` is not a valid boundary list `0 = cu[0] <= cu[1] <= ... <= cu[N]`.
    CuSeqlens {
        /// Index of the offending entry.
        index: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// A tensor's element count does not match the shape the contract requires.
    Shape {
        /// Argument name (`"k"`, `"w"`, `"u"`, `"gk"`, `"h0"`, `"h"`, `"v_new"`, `"ht"`, ...).
        tensor: &'static str,
        /// Expected shape in the contract's layout, e.g. `[T=200, H=2, K=128]`.
        expected: String,
        /// Expected element count.
        expected_len: usize,
        /// Actual element count (or the actual shape where the caller gave one).
        actual: String,
    },
    /// A tensor's shape has more elements than memory can address (its byte size would exceed
    /// `isize::MAX`): the token count, the sequence count or the head count is far too large.
    TooLarge {
        /// Argument name.
        tensor: &'static str,
        /// The shape, e.g. `[T=200, H=2, K=128]`.
        shape: String,
    },
    /// A problem the contract allows but no GPU kernel runs yet (a scalar gate, grouped value
    /// heads, another head size, the value-first layout): the f64 reference computes it.
    Unsupported {
        /// The argument or tensor that needs what is missing.
        argument: &'static str,
        /// What the problem needs and what the kernels support.
        reason: String,
    },
    /// A tensor's device address is not aligned as the kernels need.
    Alignment {
        /// Argument name.
        tensor: &'static str,
        /// Required alignment in bytes.
        required: usize,
        /// The address that was given.
        address: u64,
    },
    /// A tensor has the wrong element type (file input only: device tensors are typed).
    Dtype {
        /// Tensor name.
        tensor: String,
        /// Accepted element types.
        expected: &'static str,
        /// The element type found.
        actual: String,
    },
    /// A scalar argument is out of range (heads = 0, a zero repeat count, ...).
    Argument {
        /// Argument name.
        name: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A required tensor is missing from an input file.
    MissingTensor {
        /// Tensor name.
        tensor: &'static str,
    },
    /// The CUDA driver library (`libcuda.so` / `nvcuda.dll`) could not be loaded: no NVIDIA driver
    /// is installed, or it is not on the library search path.
    NoDriver,
    /// The driver is loaded but has no device of this ordinal (no GPU, or fewer than
    /// `ordinal + 1`, or none visible through `CUDA_VISIBLE_DEVICES`).
    NoDevice {
        /// The device ordinal that was asked for.
        ordinal: usize,
        /// What the driver said.
        reason: String,
    },
    /// The device cannot run any of the kernels (compute capability below 8.0).
    UnsupportedDevice {
        /// Compute capability `(major, minor)` of the device.
        compute_capability: (i32, i32),
    },
    /// A kernel, as the driver compiled it for this device, cannot run the CTA it launches: its
    /// registers per thread leave room for fewer threads per CTA than its block holds. Reported
    /// when the launcher loads the module, not by a failed launch.
    KernelResources {
        /// The kernel's entry point.
        entry: &'static str,
        /// Threads per CTA it launches.
        threads: usize,
        /// The most threads per CTA the compiled kernel runs.
        max_threads: usize,
        /// Registers per thread of the compiled kernel.
        registers: usize,
    },
    /// A tensor or plan belongs to another device than the launcher.
    WrongDevice {
        /// Argument name.
        tensor: &'static str,
        /// Ordinal of the launcher's device.
        expected: usize,
        /// Ordinal of the argument's device.
        actual: usize,
    },
    /// A CUDA driver call failed.
    Cuda(cudarc::driver::DriverError),
    /// Reading or writing a file failed.
    Io {
        /// The path involved.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A safetensors file could not be parsed or written.
    Safetensors {
        /// The path involved.
        path: String,
        /// What went wrong.
        reason: String,
    },
}

impl fmt::Display for KdaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::CuSeqlens { index, reason } => write!(f, "cu_seqlens[{index}]: {reason}"),
            Self::Shape { tensor, expected, expected_len, actual } => {
                write!(f, "tensor `{tensor}`: expected shape {expected} ({expected_len} elements), got {actual}")
            }
            Self::TooLarge { tensor, shape } => write!(
                f,
                "tensor `{tensor}`: shape {shape} has more elements than memory can address; \
                 split the batch or use fewer heads"
            ),
            Self::Unsupported { argument, reason } => {
                write!(f, "`{argument}`: {reason}; no GPU kernel runs this yet (the f64 reference does: `--cpu`)")
            }
            Self::Alignment { tensor, required, address } => {
                write!(f, "tensor `{tensor}`: device address {address:#x} is not {required}-byte aligned")
            }
            Self::Dtype { tensor, expected, actual } => {
                write!(f, "tensor `{tensor}`: expected dtype {expected}, got {actual}")
            }
            Self::Argument { name, reason } => write!(f, "argument `{name}`: {reason}"),
            Self::MissingTensor { tensor } => write!(f, "required tensor `{tensor}` is missing"),
            Self::NoDriver => write!(
                f,
                "the CUDA driver library (libcuda) could not be loaded: install the NVIDIA driver, or \
                 add the directory holding libcuda.so to LD_LIBRARY_PATH"
            ),
            Self::NoDevice { ordinal, reason } => write!(
                f,
                "no CUDA device {ordinal} ({reason}): run on a machine with an NVIDIA GPU of compute \
                 capability 8.0 or newer, and check CUDA_VISIBLE_DEVICES"
            ),
            Self::UnsupportedDevice { compute_capability: (ma, mi) } => {
                write!(f, "device of compute capability {ma}.{mi} is not supported (sm_80 or newer needed)")
            }
            Self::KernelResources { entry, threads, max_threads, registers } => write!(
                f,
                "kernel `{entry}` as compiled for this device takes {registers} registers per thread, so a CTA \
                 runs at most {max_threads} threads; it launches {threads}"
            ),
            Self::WrongDevice { tensor, expected, actual } => {
                write!(f, "`{tensor}` lives on device {actual}, the launcher on device {expected}")
            }
            Self::Cuda(e) => write!(f, "CUDA driver error: {e}"),
            Self::Io { path, source } => write!(f, "{path}: {source}"),
            Self::Safetensors { path, reason } => write!(f, "{path}: {reason}"),
        }
    }
}

impl std::error::Error for KdaError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Cuda(e) => Some(e),
            Self::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl From<cudarc::driver::DriverError> for KdaError {
    fn from(e: cudarc::driver::DriverError) -> Self {
        Self::Cuda(e)
    }
}
