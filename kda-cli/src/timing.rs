//! Event timing of launches and the device's copy bandwidth.

use cudarc::driver::CudaStream;
use kda::{KdaError, LayerStage};
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

/// A launch that names its stages as it enqueues them: `launch(after)` calls `after(stage)` once
/// each stage is enqueued (as [`kda::Kda::launch_layer_staged`] does).
pub type StagedLaunch<'a> = dyn FnMut(&mut dyn FnMut(LayerStage) -> Result<(), KdaError>) -> Result<(), KdaError> + 'a;

/// Median device time in microseconds of each stage of `repeat` staged launches (after `warmup`
/// unmarked ones): an event before each launch and one after each of its stages, a stage's time
/// from the mark before it to its own (so a stage's share of the launch gaps is its own). Fails
/// when `repeat` is 0 or the launches do not name the same stages in the same order.
pub fn median_stage_us(
    stream: &Arc<CudaStream>,
    warmup: usize,
    repeat: usize,
    launch: &mut StagedLaunch<'_>,
) -> Result<Vec<(LayerStage, f64)>, KdaError> {
    for _ in 0..warmup {
        launch(&mut |_| Ok(()))?;
    }
    let ctx = stream.context();
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let mut launches = Vec::with_capacity(repeat);
    for _ in 0..repeat {
        let start = ctx.new_event(flags)?;
        start.record(stream)?;
        let mut marks = Vec::new();
        launch(&mut |stage| {
            let mark = ctx.new_event(flags)?;
            mark.record(stream)?;
            marks.push((stage, mark));
            Ok(())
        })?;
        launches.push((start, marks));
    }
    stream.synchronize()?;
    let mut times = Vec::with_capacity(repeat);
    for (start, marks) in &launches {
        let mut before = start;
        let mut stages = Vec::with_capacity(marks.len());
        for (stage, mark) in marks {
            stages.push((*stage, f64::from(before.elapsed_ms(mark)?) * 1e3));
            before = mark;
        }
        times.push(stages);
    }
    stage_medians(&times)
}

/// Each stage's median over `launches` (each launch's `(stage, us)` in its order). Fails when
/// there is no launch or two launches name different stages.
pub fn stage_medians(launches: &[Vec<(LayerStage, f64)>]) -> Result<Vec<(LayerStage, f64)>, KdaError> {
    let first =
        launches.first().ok_or_else(|| KdaError::Argument { name: "repeat", reason: "must be at least 1".into() })?;
    let order: Vec<LayerStage> = first.iter().map(|&(stage, _)| stage).collect();
    if let Some(other) = launches.iter().find(|l| !l.iter().map(|&(stage, _)| stage).eq(order.iter().copied())) {
        return Err(KdaError::Argument {
            name: "launch",
            reason: format!(
                "launches named different stages: {order:?} and {:?}",
                other.iter().map(|x| x.0).collect::<Vec<_>>()
            ),
        });
    }
    Ok(order
        .iter()
        .enumerate()
        .map(|(k, &stage)| {
            let mut us: Vec<f64> = launches.iter().map(|l| l[k].1).collect();
            us.sort_by(f64::total_cmp);
            (stage, us[us.len() / 2])
        })
        .collect())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_medians_take_each_stage_apart_and_refuse_mixed_stages() {
        use LayerStage::{Output, Prepare, Recurrence};
        let launches: Vec<Vec<(LayerStage, f64)>> = [(5.0, 1.0, 9.0), (3.0, 2.0, 7.0), (4.0, 30.0, 8.0)]
            .iter()
            .map(|&(a, b, c)| vec![(Prepare, a), (Recurrence, b), (Output, c)])
            .collect();
        assert_eq!(stage_medians(&launches).unwrap(), vec![(Prepare, 4.0), (Recurrence, 2.0), (Output, 8.0)]);
        let mut mixed = launches.clone();
        mixed[1].pop();
        assert!(stage_medians(&mixed).is_err());
        mixed[1] = vec![(Recurrence, 1.0), (Prepare, 1.0), (Output, 1.0)];
        assert!(stage_medians(&mixed).is_err());
        assert!(stage_medians(&[]).is_err());
    }
}
