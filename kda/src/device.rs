//! Opening a CUDA device without panicking.
//!
//! cudarc loads the driver library (`libcuda`) lazily and panics when it is absent. [`Kda::open`]
//! checks for the library first and turns every way of not having a device into a
//! [`KdaError`]: [`KdaError::NoDriver`], [`KdaError::NoDevice`], or
//! [`KdaError::UnsupportedDevice`] for a GPU older than compute capability 8.0.

use crate::{Kda, KdaError};
use cudarc::driver::sys::CUresult;
use cudarc::driver::{CudaContext, CudaStream, DriverError};
use std::sync::Arc;

impl Kda {
    /// Opens device `ordinal`, loads the kernels on it and returns them with the device's default
    /// stream.
    ///
    /// Fails with [`KdaError::NoDriver`] when the CUDA driver library cannot be loaded,
    /// [`KdaError::NoDevice`] when the driver has no device `ordinal`, and
    /// [`KdaError::UnsupportedDevice`] below compute capability 8.0. To launch on a context of
    /// your own, use [`Kda::new`].
    ///
    /// ```no_run
    /// let (kda, stream) = kda::Kda::open(0)?;
    /// println!("compute capability {:?}", kda.compute_capability());
    /// # Ok::<(), kda::KdaError>(())
    /// ```
    pub fn open(ordinal: usize) -> Result<(Kda, Arc<CudaStream>), KdaError> {
        let ctx = open_context(ordinal)?;
        let stream = ctx.default_stream();
        Ok((Kda::new(ctx)?, stream))
    }
}

/// Whether the CUDA driver library (`libcuda`) can be loaded, where cudarc loads it at run time.
#[cfg(not(feature = "candle"))]
fn driver_library_present() -> bool {
    // SAFETY: this only tries to load the driver library (running its initialisers, as any use of
    // cudarc's driver API does) and unloads it again; it calls nothing in it.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// With the `candle` feature cudarc links `libcuda` when the program is built (candle's choice),
/// so a process that started has it.
#[cfg(feature = "candle")]
fn driver_library_present() -> bool {
    true
}

/// The primary context of device `ordinal`, or the typed reason there is none.
pub(crate) fn open_context(ordinal: usize) -> Result<Arc<CudaContext>, KdaError> {
    if !driver_library_present() {
        return Err(KdaError::NoDriver);
    }
    // The driver numbers devices with an `int`; cudarc would wrap a larger ordinal.
    if i32::try_from(ordinal).is_err() {
        return Err(KdaError::NoDevice { ordinal, reason: "the ordinal exceeds the driver's range".into() });
    }
    let no_device = |e: DriverError| match e.0 {
        CUresult::CUDA_ERROR_NO_DEVICE | CUresult::CUDA_ERROR_INVALID_DEVICE => {
            KdaError::NoDevice { ordinal, reason: e.to_string() }
        }
        _ => KdaError::Cuda(e),
    };
    let count = CudaContext::device_count().map_err(no_device)?;
    if usize::try_from(count).is_ok_and(|count| ordinal >= count) {
        return Err(KdaError::NoDevice { ordinal, reason: format!("the driver sees {count} device(s)") });
    }
    CudaContext::new(ordinal).map_err(no_device)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine without a driver (CI) or without a GPU this must be the typed error, not a
    /// panic; on a GPU machine it opens the device.
    #[test]
    fn opening_a_device_never_panics() {
        match Kda::open(0) {
            Ok((kda, _stream)) => println!("opened device 0: compute capability {:?}", kda.compute_capability()),
            Err(e @ (KdaError::NoDriver | KdaError::NoDevice { ordinal: 0, .. })) => {
                println!("no device, as typed: {e:?}: {e}");
            }
            Err(e) => panic!("expected a device, NoDriver or NoDevice, got {e:?}: {e}"),
        }
    }

    #[test]
    fn an_ordinal_past_every_device_is_no_device() {
        for ordinal in [1 << 20, usize::MAX] {
            match Kda::open(ordinal) {
                Err(KdaError::NoDriver) => println!("no driver"),
                Err(KdaError::NoDevice { ordinal: o, reason }) => {
                    assert_eq!(o, ordinal);
                    println!("device {ordinal}: {reason}");
                }
                Err(e) => panic!("device {ordinal}: expected NoDriver or NoDevice, got {e:?}: {e}"),
                Ok(_) => panic!("device {ordinal} opened"),
            }
        }
    }
}
