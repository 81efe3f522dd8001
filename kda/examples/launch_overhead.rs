//! The period of back-to-back launches of kernels that only wait `SPIN_NS` (20 us, so that the
//! host stays ahead of the GPU), timed as `kda run` and `xtask bench`
//! time the recurrence (one CUDA event between consecutive launches, median of many), for a
//! small and a large parameter list (the Hopper kernel's: nine 128-byte tensor maps and eleven
//! scalars) and with and without the Hopper kernel's dynamic shared memory. It says how much of a
//! timed launch is the launch itself.
//!
//! ```text
//! cargo run --release -p kda --example launch_overhead
//! ```

use std::sync::Arc;

use cudarc::driver::sys::{CUevent_flags, CUfunction_attribute};
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use kda_kernel::layout::hopper;

/// How long each kernel waits, in nanoseconds of `%globaltimer`: longer than the host takes to
/// issue a launch and an event (6 to 7 us), so that the host stays ahead of the GPU.
const SPIN_NS: u64 = 20_000;

/// Kernels that wait `SPIN_NS` and exit: `small` takes two pointers, `large` the Hopper kernel's
/// parameter layout.
fn ptx() -> String {
    let body = format!(
        "{{
    .reg .u64 t0, t;
    .reg .pred p;
    mov.u64 t0, %globaltimer;
spin:
    mov.u64 t, %globaltimer;
    sub.u64 t, t, t0;
    setp.lt.u64 p, t, {SPIN_NS};
    @p bra spin;
    ret;
}}
"
    );
    format!(
        ".version 8.0
.target sm_90a
.address_size 64
.visible .entry small(.param .u64 a, .param .u64 b) {body}
.visible .entry large(
    .param .align 64 .b8 m0[128], .param .align 64 .b8 m1[128], .param .align 64 .b8 m2[128],
    .param .align 64 .b8 m3[128], .param .align 64 .b8 m4[128], .param .align 64 .b8 m5[128],
    .param .align 64 .b8 m6[128], .param .align 64 .b8 m7[128], .param .align 64 .b8 m8[128],
    .param .u64 p0, .param .u64 p1, .param .u64 p2, .param .u64 p3, .param .u64 p4,
    .param .u64 p5, .param .u64 p6, .param .u64 p7, .param .u64 p8, .param .u32 heads,
    .param .u64 work) {body}"
    )
}

/// Launches timed per variant.
const REPEAT: usize = 2000;
/// Untimed launches before them.
const WARMUP: usize = 200;
/// The Hopper kernel's grid on fixed_8192: one CTA per work item.
const GRID: u32 = 128;

/// A 128-byte parameter standing in for a `CUtensorMap`.
#[repr(C, align(64))]
struct Map([u8; 128]);
// SAFETY: a plain 128-byte value copied into the parameter buffer.
unsafe impl DeviceRepr for Map {}

fn launch(stream: &Arc<CudaStream>, f: &CudaFunction, large: bool, smem: u32) -> Result<(), Box<dyn std::error::Error>> {
    let cfg = LaunchConfig { grid_dim: (GRID, 1, 1), block_dim: (hopper::THREADS as u32, 1, 1), shared_mem_bytes: smem };
    let maps: Vec<Map> = (0..9).map(|_| Map([0; 128])).collect();
    let (p, heads) = (0u64, 64u32);
    let mut b = stream.launch_builder(f);
    if large {
        for m in &maps {
            b.arg(m);
        }
        for _ in 0..9 {
            b.arg(&p);
        }
        b.arg(&heads).arg(&p);
    } else {
        b.arg(&p).arg(&p);
    }
    // SAFETY: the kernels take exactly these parameters and touch no memory.
    unsafe { b.launch(cfg) }?;
    Ok(())
}

fn period_us(stream: &Arc<CudaStream>, f: &CudaFunction, large: bool, smem: u32) -> Result<f64, Box<dyn std::error::Error>> {
    for _ in 0..WARMUP {
        launch(stream, f, large, smem)?;
    }
    let ctx = stream.context();
    let events: Vec<_> =
        (0..=REPEAT).map(|_| ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))).collect::<Result<_, _>>()?;
    events[0].record(stream)?;
    for e in &events[1..] {
        launch(stream, f, large, smem)?;
        e.record(stream)?;
    }
    events[REPEAT].synchronize()?;
    let mut t: Vec<f64> =
        events.windows(2).map(|w| w[0].elapsed_ms(&w[1]).map(|ms| f64::from(ms) * 1e3)).collect::<Result<_, _>>()?;
    t.sort_by(f64::total_cmp);
    Ok(t[REPEAT / 2])
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ctx = CudaContext::new(0)?;
    let stream = ctx.default_stream();
    let module = ctx.load_module(Ptx::from_src(ptx()))?;
    let smem = hopper::SMEM_BYTES as u32;
    println!("{:<8} {:>11} {:>18}", "params", "smem bytes", "median period us");
    for name in ["small", "large"] {
        let f = module.load_function(name)?;
        f.set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32)?;
        for s in [0, smem] {
            println!("{:<8} {:>11} {:>18.2}", name, s, period_us(&stream, &f, name == "large", s)?);
        }
    }
    Ok(())
}
