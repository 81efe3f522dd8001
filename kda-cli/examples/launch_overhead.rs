//! The period of back-to-back launches of kernels that only wait `SPIN_NS` (20 us, so that the
//! host stays ahead of the GPU), timed as `kda run` and `xtask bench`
//! time the recurrence (one CUDA event between consecutive launches, median of many), for a
//! small and a large parameter list (the Hopper kernel's: nine 128-byte tensor maps and eleven
//! scalars) and with and without the Hopper kernel's dynamic shared memory. It says how much of a
//! timed launch is the launch itself.
//!
//! ```text
//! cargo run --release -p kda-cli --example launch_overhead
//! ```

use std::sync::Arc;

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use kda::KdaError;
use kda::layout::hopper;
use kda_cli::median_us;

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

/// The Hopper kernel's tensor-map parameters and its pointer parameters (nine each).
const MAPS: usize = 9;
const POINTERS: usize = 9;

/// A 128-byte parameter standing in for a `CUtensorMap`.
#[repr(C, align(64))]
struct Map([u8; 128]);
// SAFETY: a plain 128-byte value copied into the parameter buffer.
unsafe impl DeviceRepr for Map {}

/// One launch of `f` on `stream`: with the Hopper kernel's parameters (`maps` and eleven
/// scalars) when `large`, else two pointers.
fn launch(stream: &Arc<CudaStream>, f: &CudaFunction, maps: &[Map], large: bool, smem: u32) -> Result<(), KdaError> {
    let cfg =
        LaunchConfig { grid_dim: (GRID, 1, 1), block_dim: (hopper::THREADS as u32, 1, 1), shared_mem_bytes: smem };
    let (p, heads) = (0u64, 0u32);
    let mut b = stream.launch_builder(f);
    if large {
        for m in maps {
            b.arg(m);
        }
        for _ in 0..POINTERS {
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

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (kda, stream) = kda::Kda::open(0)?;
    let ctx: &Arc<CudaContext> = kda.context();
    let module = ctx.load_module(Ptx::from_src(ptx()))?;
    let smem = hopper::SMEM_BYTES as u32;
    let maps: Vec<Map> = (0..MAPS).map(|_| Map([0; 128])).collect();
    println!("{:<8} {:>11} {:>18}", "params", "smem bytes", "median period us");
    for name in ["small", "large"] {
        let f = module.load_function(name)?;
        f.set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32)?;
        for s in [0, smem] {
            // The period as the recurrence is timed: one event between consecutive launches.
            let us = median_us(&stream, WARMUP, REPEAT, |_| launch(&stream, &f, &maps, name == "large", s))?;
            println!("{:<8} {:>11} {:>18.2}", name, s, us);
        }
    }
    Ok(())
}
