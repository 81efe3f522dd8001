//! Event timing of launches and the device's copy bandwidth.

use cudarc::driver::CudaStream;
use kda::KdaError;
use std::sync::Arc;

/// Median device time in microseconds of `repeat` launches, each timed by its own pair of CUDA
/// events (warm-up launches first; no synchronisation between the timed launches).
///
/// `launch(i)` enqueues launch `i` (warm-ups first, numbered from 0). Fails when `repeat` is 0.
pub fn median_us(
    stream: &Arc<CudaStream>,
    warmup: usize,
    repeat: usize,
    mut launch: impl FnMut(usize) -> Result<(), KdaError>,
) -> Result<f64, KdaError> {
    if repeat == 0 {
        return Err(KdaError::Argument { name: "repeat", reason: "must be at least 1".into() });
    }
    for i in 0..warmup {
        launch(i)?;
    }
    let ctx = stream.context();
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let events: Vec<_> = (0..=repeat).map(|_| ctx.new_event(flags)).collect::<Result<_, _>>()?;
    // `repeat >= 1`: at least two events.
    events[0].record(stream)?;
    for i in 0..repeat {
        launch(warmup + i)?;
        events[i + 1].record(stream)?;
    }
    events[repeat].synchronize()?;
    let mut times = Vec::with_capacity(repeat);
    for pair in events.windows(2) {
        times.push(f64::from(pair[0].elapsed_ms(&pair[1])?) * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[repeat / 2])
}

/// Bytes each copy of [`copy_bandwidth`] moves one way: large enough to leave the L2 (50 MB on an
/// H200) far behind.
pub const COPY_BENCH_BYTES: usize = 1 << 30;

/// Device-to-device copy bandwidth in bytes per second (read plus write), the median of `repeat`
/// event-timed copies of [`COPY_BENCH_BYTES`].
pub fn copy_bandwidth(stream: &Arc<CudaStream>, repeat: usize) -> Result<f64, KdaError> {
    let src = stream.alloc_zeros::<u8>(COPY_BENCH_BYTES)?;
    let mut dst = stream.alloc_zeros::<u8>(COPY_BENCH_BYTES)?;
    let us = median_us(stream, 2, repeat, |_| Ok(stream.memcpy_dtod(&src, &mut dst)?))?;
    Ok(2.0 * COPY_BENCH_BYTES as f64 / (us * 1e-6))
}
