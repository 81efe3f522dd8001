//! The decode step (`../shared/LAYER.md`, "Decode"): one token per sequence through the layer,
//! each sequence's state read from and written back to its slot of a caller's pool, in place.
//!
//! One CTA per (sequence, value head, block of `COLS` value columns): lane `c` of warp `q` holds
//! the state's column `c` at keys `q, q + KEY_GROUPS, ..` in registers, so every warp reads and
//! writes whole rows of the pool. Per token, with the layer's options applied to its inputs:
//!
//! ```text
//! S = diag(exp(g)) S;   delta = beta (v - S^T k);   S += k delta^T;   o = scale S^T q
//! ```
//!
//! `S^T k` and `S^T q` are summed over the key groups in shared memory. A padding sequence
//! (negative slot) reads and writes nothing; a fresh one starts from zeros. Plain f32 arithmetic
//! on every target; the state is memory-bound (read once, written once).

use crate::arch::sm80::{
    bf16_to_f32, block_idx_x, f32_to_bf16, fma_f32, rsqrt_approx, smem_base_generic, sync_threads, thread_idx_x,
};
use crate::layer::{L2NORM_EPS, activate, exp, sigmoid};
use crate::layout::decode::{COLS, KEY_GROUPS, MAX_K, MAX_KEYS_PER_THREAD};
use crate::layout::layer::{OPT_BETA_SIGMOID, OPT_L2NORM};

kernel_entry! {
    /// The decode step (`abi::DECODE`, parameters `abi::DECODE_PARAMS`). Grid: `N * HV * V / COLS`
    /// CTAs, sequence-major; `layout::decode::THREADS` threads; `layout::decode::SMEM_BYTES`.
    ///
    /// Reads `q`, `k` `[N, H, K]`, `v` `[N, HV, V]` (bf16), the gate `g` `[N, HV, gate_width]` and
    /// `beta` `[N, HV]` (f32; `a_log`, `dt_bias` as the prepare kernel takes them), the slot of each
    /// sequence `slots` `[N]` (i64, negative: padding) and `fresh` `[N]` (u32, nonzero: start from
    /// zeros); reads and writes the key-first pool `[slots, HV, K, V]` f32 at each slot; writes `o`
    /// `[N, HV, V]` (bf16) times `f32::from_bits(scale_bits)`.
    ///
    /// # Safety
    /// Every non-negative slot lies inside the pool and no two sequences name one slot; the tensors
    /// hold `N` rows; `K` a multiple of `KEY_GROUPS` up to `MAX_K`, `V` a multiple of `COLS`.
    pub unsafe fn kda_decode_step(
        q: *const u16,
        k: *const u16,
        v: *const u16,
        g: *const f32,
        beta: *const f32,
        a_log: *const f32,
        dt_bias: *const f32,
        slots: *const i64,
        fresh: *const u32,
        pool: *mut f32,
        o: *mut u16,
        heads: u32,
        value_heads: u32,
        key_dim: u32,
        value_dim: u32,
        gate_width: u32,
        options: u32,
        gate_mode: u32,
        lower_bound_bits: u32,
        scale_bits: u32,
    ) {
        let (h, hv, kd, vd, gw) =
            (heads as usize, value_heads as usize, key_dim as usize, value_dim as usize, gate_width as usize);
        if h == 0
            || hv == 0
            || !hv.is_multiple_of(h)
            || kd == 0
            || kd > MAX_K
            || !kd.is_multiple_of(KEY_GROUPS)
            || vd == 0
            || !vd.is_multiple_of(COLS)
            || !(gw == 1 || gw == kd)
        {
            return; // the launcher never launches so; this proves the indices below safe
        }
        let blocks = (vd / COLS) as u32;
        let per_seq = value_heads.wrapping_mul(blocks);
        let b = block_idx_x() as u32;
        let (Some(n), Some(rest)) = (b.checked_div(per_seq), b.checked_rem(per_seq)) else { return };
        // (Checked divisions: the sizes are positive, which the compiler cannot see; no panic path.)
        let (Some(i), Some(block)) = (rest.checked_div(blocks), rest.checked_rem(blocks)) else { return };
        let (n, i, col0) = (n as usize, i as usize, block as usize * COLS);
        let j = i.checked_div(hv / h).unwrap_or(0);
        let tid = thread_idx_x();
        let (lane, group) = (tid % COLS, tid / COLS);
        let c = col0 + lane;
        // SAFETY (block): the kernel's contract; shared indices below `MAX_K` and the partial sums'.
        unsafe {
            let slot = *slots.add(n);
            if slot < 0 {
                return; // padding: nothing read or written
            }
            let smem = smem_base_generic() as *mut f32;
            let (qs, ks, decay) = (smem, smem.add(MAX_K), smem.add(2 * MAX_K));
            let (sum_k, sum_q) = (smem.add(3 * MAX_K), smem.add(3 * MAX_K + KEY_GROUPS * COLS));

            // The token's q, k (normalised when asked) and the decay per key row.
            if tid < kd {
                *qs.add(tid) = bf16_to_f32(*q.add((n * h + j) * kd + tid));
                *ks.add(tid) = bf16_to_f32(*k.add((n * h + j) * kd + tid));
                let a = if gw == 1 { 0 } else { tid };
                let raw = *g.add((n * hv + i) * gw + a);
                let strength = if a_log.is_null() { 1.0 } else { exp(*a_log.add(i)) };
                let bias = if dt_bias.is_null() { 0.0 } else { *dt_bias.add(i * gw + a) };
                *decay.add(tid) = exp(activate(raw, gate_mode, strength, bias, f32::from_bits(lower_bound_bits)));
            }
            sync_threads();
            let (mut q_scale, mut k_scale) = (1.0, 1.0);
            if options & OPT_L2NORM != 0 {
                let (mut sq, mut sk) = (0.0, 0.0);
                for a in 0..kd {
                    sq = fma_f32(*qs.add(a), *qs.add(a), sq);
                    sk = fma_f32(*ks.add(a), *ks.add(a), sk);
                }
                (q_scale, k_scale) = (rsqrt_approx(sq + L2NORM_EPS), rsqrt_approx(sk + L2NORM_EPS));
            }
            let b_raw = *beta.add(n * hv + i);
            let strength_beta = if options & OPT_BETA_SIGMOID != 0 { sigmoid(b_raw) } else { b_raw };

            // This thread's keys a = group + KEY_GROUPS * t of column c: decayed state, S^T k part.
            let state = pool.add(((slot as usize * hv + i) * kd) * vd);
            let start_fresh = *fresh.add(n) != 0;
            let keys = kd / KEY_GROUPS;
            let mut s = [0.0f32; MAX_KEYS_PER_THREAD];
            let mut part = 0.0;
            for (t, x) in s.iter_mut().enumerate() {
                if t < keys {
                    let a = group + KEY_GROUPS * t;
                    let v0 = if start_fresh { 0.0 } else { *state.add(a * vd + c) };
                    *x = v0 * *decay.add(a);
                    part = fma_f32(*x, *ks.add(a) * k_scale, part);
                }
            }
            *sum_k.add(group * COLS + lane) = part;
            sync_threads();
            let mut sk = 0.0;
            for grp in 0..KEY_GROUPS {
                sk += *sum_k.add(grp * COLS + lane);
            }
            let delta = strength_beta * (bf16_to_f32(*v.add((n * hv + i) * vd + c)) - sk);
            // S += k delta^T; S^T q part; the state back to its slot.
            let mut part_q = 0.0;
            for (t, x) in s.iter_mut().enumerate() {
                if t < keys {
                    let a = group + KEY_GROUPS * t;
                    *x = fma_f32(*ks.add(a) * k_scale, delta, *x);
                    part_q = fma_f32(*x, *qs.add(a) * q_scale, part_q);
                    *state.add(a * vd + c) = *x;
                }
            }
            *sum_q.add(group * COLS + lane) = part_q;
            sync_threads();
            if group == 0 {
                let mut oq = 0.0;
                for grp in 0..KEY_GROUPS {
                    oq += *sum_q.add(grp * COLS + lane);
                }
                *o.add((n * hv + i) * vd + c) = f32_to_bf16(f32::from_bits(scale_bits) * oq);
            }
        }
    }
}
