//! Whole states between a caller's pool of slots and a packed buffer (`../shared/LAYER.md`,
//! "Decode": state pools), for the layer's prefill over a pool: the states are gathered from the
//! sequences' slots before the recurrence and scattered back after it.

use crate::abi::{PoolCopyCode, StateDtypeCode};
use crate::arch::sm80::{bf16_to_f32, block_idx_x, f32_to_bf16, thread_idx_x};
use crate::layout::pool_copy::{PER_CTA, PER_THREAD};

/// Four f32, so that each thread moves 16 bytes with one vector access.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct Quad([f32; PER_THREAD]);

kernel_entry! {
    /// Copies each sequence's state between the pool and the packed buffer (`abi::POOL_COPY`,
    /// parameters `abi::POOL_COPY_PARAMS`). Grid: `N * ceil(state_len / PER_CTA)` CTAs,
    /// sequence-major; `layout::pool_copy::THREADS` threads; no shared memory.
    ///
    /// `pool` is `[slots, state_len]` f32 or bf16 (`pool_dtype`, a `StateDtypeCode`; bf16 is read
    /// exactly and rounded to nearest even when written), `packed` `[N, state_len]` f32, `slots` `[N]` (i64,
    /// negative: padding) and `fresh` `[N]` (u32). Gathering (`PoolCopyCode::Gather`) writes
    /// sequence `n`'s packed state from its slot, or zeros for a fresh or padding sequence;
    /// scattering (`PoolCopyCode::Scatter`) writes it back to the slot of every live sequence
    /// and touches no other slot.
    ///
    /// # Safety
    /// `state_len` is a multiple of `PER_THREAD`; every non-negative slot lies inside the pool;
    /// no two sequences name one slot; both buffers are 16-byte aligned and do not overlap.
    pub unsafe fn kda_pool_copy(
        pool: *mut f32,
        packed: *mut f32,
        slots: *const i64,
        fresh: *const u32,
        state_len: u32,
        direction: u32,
        pool_dtype: u32,
    ) {
        let len = state_len as usize;
        let blocks = len.div_ceil(PER_CTA);
        if blocks == 0 || !len.is_multiple_of(PER_THREAD) {
            return; // the launcher never launches so; this proves the divisions below safe
        }
        let b = block_idx_x();
        let (n, block) = (b / blocks, b % blocks);
        let at = block * PER_CTA + thread_idx_x() * PER_THREAD;
        if at >= len {
            return;
        }
        // SAFETY: the kernel's contract; `at + PER_THREAD <= len` (both multiples of PER_THREAD).
        unsafe {
            let slot = *slots.add(n);
            let here = packed.add(n * len + at) as *mut Quad;
            let gather = direction == PoolCopyCode::Gather as u32;
            let bf16 = pool_dtype == StateDtypeCode::Bf16 as u32;
            // (The pool offset only for a live sequence: a padding slot is negative.)
            let e = || slot as usize * len + at;
            if gather {
                *here = if slot < 0 || *fresh.add(n) != 0 {
                    Quad([0.0; PER_THREAD])
                } else if bf16 {
                    let from = pool as *const u16;
                    Quad(core::array::from_fn(|j| bf16_to_f32(*from.add(e() + j))))
                } else {
                    *(pool.add(e()) as *const Quad)
                };
            } else if slot >= 0 {
                if bf16 {
                    let to = pool as *mut u16;
                    for (j, x) in (*here).0.iter().enumerate() {
                        *to.add(e() + j) = f32_to_bf16(*x);
                    }
                } else {
                    *(pool.add(e()) as *mut Quad) = *here;
                }
            }
        }
    }
}
