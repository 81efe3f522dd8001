//! The decode step (`../shared/LAYER.md`, "Decode"): a few tokens per sequence through the layer
//! (one, or up to `MAX_DRAFT` draft tokens of speculative decoding), each sequence's state read
//! from its slot of a caller's pool and written back in place, or each token's state into a slot
//! of its own.
//!
//! One CTA per (sequence, value head, block of `COLS` value columns): lane `c` of warp `q` holds
//! the state's column `c` at keys `q, q + KEY_GROUPS, ..` in registers, so every warp reads and
//! writes whole rows of the pool. Per token, with the layer's options applied to its inputs:
//!
//! ```text
//! S = diag(exp(g)) S;   delta = beta (v - S^T k);   S += k delta^T;   o = scale S^T q
//! ```
//!
//! `S^T k` and `S^T q` are summed over the key groups in shared memory. A sequence's tokens form a
//! chain (each continues from the previous one) or, with `parents`, a tree: a token continues from
//! its parent's state, which the CTA rebuilds from the sequence's initial state (read again from
//! its slot) along the parent's ancestors whenever the parent is not the token just run. Every
//! token runs the same `Token::step` as a one-token call, so a verify call's outputs and states
//! are bit for bit those of running its tokens one call at a time. A padding sequence (negative
//! slot) reads and writes nothing; a fresh one starts from zeros. Plain f32 arithmetic on every
//! target; the state is memory-bound (read once, written once per stored token).

use crate::arch::sm80::{
    bf16_to_f32, block_idx_x, f32_to_bf16, fma_f32, rsqrt_approx, smem_base_generic, sync_threads, thread_idx_x_fresh,
};
use crate::abi::StateDtypeCode;
use crate::layer::{L2NORM_EPS, activate, exp, sigmoid};
use crate::layout::decode::{COLS, KEY_GROUPS, MAX_DRAFT, MAX_K, MAX_KEYS_PER_THREAD};
use crate::layout::layer::{OPT_BETA_SIGMOID, OPT_L2NORM};

/// This thread's part of one head's state: keys `group + KEY_GROUPS * t` of its column.
type Keys = [f32; MAX_KEYS_PER_THREAD];

kernel_entry! {
    /// The decode step (`abi::DECODE`, parameters `abi::DECODE_PARAMS`). Grid: `N * HV * V / COLS`
    /// CTAs, sequence-major; `layout::decode::THREADS` threads; `layout::decode::SMEM_BYTES`.
    ///
    /// Each sequence has `draft` tokens (1 to `MAX_DRAFT`), token `t` of sequence `n` at row
    /// `n * draft + t` of `q`, `k` `[N * draft, H, K]`, `v` `[N * draft, HV, V]` (bf16), the gate
    /// `g` `[N * draft, HV, gate_width]` and `beta` `[N * draft, HV]` (f32; `a_log`, `dt_bias` as
    /// the prepare kernel takes them); `o` `[N * draft, HV, V]` (bf16) times
    /// `f32::from_bits(scale_bits)`. `slots` `[N]` (i64, negative: padding) names the slot each
    /// sequence starts from, `fresh` `[N]` (u32, nonzero: from zeros instead). `parents`
    /// `[N * draft]` (i64; null: a chain) names the token each continues from (an earlier token of
    /// its sequence, or negative: the initial state). `token_slots` `[N * draft]` (i64; null: the
    /// last token's state goes back to the sequence's slot) names where each token's state is
    /// written (negative: nowhere). The pool is key-first `[slots, HV, K, V]`, f32 or bf16 as
    /// `pool_dtype` says (a `StateDtypeCode`; with bf16 every written state is rounded, and a
    /// chain's state is rounded after each token as if written and read back, so that a verify
    /// call stays bit for bit the one-token calls).
    ///
    /// # Safety
    /// Every non-negative slot lies inside the pool; no slot is written by one sequence and read
    /// or written by another, nor twice by one, nor, in a call with a tree, by its own sequence;
    /// each parent precedes its token; the tensors hold
    /// `N * draft` rows; `K` a multiple of `KEY_GROUPS` up to `MAX_K`, `V` a multiple of `COLS`.
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
        parents: *const i64,
        token_slots: *const i64,
        pool: *mut f32,
        o: *mut u16,
        pool_dtype: u32,
        draft: u32,
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
        let (h, hv, kd, vd, gw, d) = (
            heads as usize,
            value_heads as usize,
            key_dim as usize,
            value_dim as usize,
            gate_width as usize,
            draft as usize,
        );
        if h == 0
            || hv == 0
            || !hv.is_multiple_of(h)
            || kd == 0
            || kd > MAX_K
            || !kd.is_multiple_of(KEY_GROUPS)
            || vd == 0
            || !vd.is_multiple_of(COLS)
            || !(gw == 1 || gw == kd)
            || d == 0
            || d > MAX_DRAFT
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
        let token = Token {
            q,
            k,
            v,
            g,
            beta,
            a_log,
            dt_bias,
            o,
            h,
            hv,
            kd,
            vd,
            gw,
            i,
            j: i.checked_div(hv / h).unwrap_or(0),
            col0,
            options,
            gate_mode,
            bf16_pool: pool_dtype == StateDtypeCode::Bf16 as u32,
            lower_bound: f32::from_bits(lower_bound_bits),
            scale: f32::from_bits(scale_bits),
        };
        // SAFETY (block): the kernel's contract.
        unsafe {
            let slot = *slots.add(n);
            if slot < 0 {
                return; // padding: nothing read or written
            }
            // `s` is the state after token `current` (-1: the initial state, read from the slot,
            // or zeros).
            let start_fresh = *fresh.add(n) != 0;
            let mut s: Keys = [0.0; MAX_KEYS_PER_THREAD];
            if !start_fresh {
                token.load(pool, slot as usize, &mut s);
            }
            let mut current = -1i64;
            for t in 0..d {
                let row = n * d + t;
                let parent = if parents.is_null() { t as i64 - 1 } else { *parents.add(row) };
                // The tokens to run, as a bit mask over the sequence's tokens: `t`, after the
                // parent's ancestors from the initial state when `s` is not the parent's state.
                let mut run = 1u32 << t;
                if parent != current {
                    // Rebuild from the initial state, read again (the contract keeps a tree's own
                    // slot unwritten until the call ends), rather than held in registers.
                    s = [0.0; MAX_KEYS_PER_THREAD];
                    if !start_fresh {
                        token.load(pool, slot as usize, &mut s);
                    }
                    // (At most `MAX_DRAFT` steps whatever the table holds: each parent precedes its
                    // token by the contract.)
                    let mut at = parent;
                    for _ in 0..MAX_DRAFT {
                        if at < 0 || at as usize >= t {
                            break;
                        }
                        run |= 1 << at;
                        at = if parents.is_null() { at - 1 } else { *parents.add(n * d + at as usize) };
                    }
                }
                // Ancestors precede their tokens, so running the mask in token order runs the
                // path from the root (one call site of `step`: the kernel keeps one copy of it).
                for u in 0..=t {
                    if run & (1 << u) != 0 {
                        token.step(n * d + u, &mut s, u == t);
                        token.as_stored(&mut s);
                    }
                }
                current = t as i64;
                let store = if token_slots.is_null() {
                    if t + 1 == d { slot } else { -1 }
                } else {
                    *token_slots.add(row)
                };
                if store >= 0 {
                    token.store(pool, store as usize, &s);
                }
            }
        }
    }
}

/// What one CTA needs to run a token: the inputs, its head and column, this thread's place, the
/// layer's options.
struct Token {
    q: *const u16,
    k: *const u16,
    v: *const u16,
    g: *const f32,
    beta: *const f32,
    a_log: *const f32,
    dt_bias: *const f32,
    o: *mut u16,
    h: usize,
    hv: usize,
    kd: usize,
    vd: usize,
    gw: usize,
    /// Value head, and its key head.
    i: usize,
    j: usize,
    /// The block's first column.
    col0: usize,
    options: u32,
    gate_mode: u32,
    /// The pool holds bf16 states.
    bf16_pool: bool,
    lower_bound: f32,
    scale: f32,
}

/// A thread's place: its index, lane (column of the block) and key group, read afresh from
/// `%tid.x` by each use (`thread_idx_x_fresh`), so that the compiler recomputes the addresses
/// derived from it per token instead of keeping all of them in registers across the token loop.
struct Place {
    tid: usize,
    lane: usize,
    group: usize,
}

impl Place {
    fn fresh() -> Self {
        let tid = thread_idx_x_fresh();
        Self { tid, lane: tid % COLS, group: tid / COLS }
    }
}

impl Token {
    /// This thread's keys of the head's state in `slot` of the pool, into `s`.
    ///
    /// # Safety
    /// `slot` lies inside the pool.
    #[inline(always)]
    unsafe fn load(&self, pool: *const f32, slot: usize, s: &mut Keys) {
        let (base, at) = (self.state_offset(slot), Place::fresh());
        for (t, x) in s.iter_mut().enumerate() {
            if t < self.kd / KEY_GROUPS {
                let e = base + (at.group + KEY_GROUPS * t) * self.vd + self.col0 + at.lane;
                // SAFETY: the key row is below `kd` and the column below `vd`.
                *x = unsafe {
                    if self.bf16_pool { bf16_to_f32(*(pool as *const u16).add(e)) } else { *pool.add(e) }
                };
            }
        }
    }

    /// This thread's keys of `s` to the head's state in `slot` of the pool.
    ///
    /// # Safety
    /// `slot` lies inside the pool and no other sequence reads or writes it.
    #[inline(always)]
    unsafe fn store(&self, pool: *mut f32, slot: usize, s: &Keys) {
        let (base, at) = (self.state_offset(slot), Place::fresh());
        for (t, x) in s.iter().enumerate() {
            if t < self.kd / KEY_GROUPS {
                let e = base + (at.group + KEY_GROUPS * t) * self.vd + self.col0 + at.lane;
                // SAFETY: as in `load`.
                unsafe {
                    if self.bf16_pool {
                        *(pool as *mut u16).add(e) = f32_to_bf16(*x);
                    } else {
                        *pool.add(e) = *x;
                    }
                }
            }
        }
    }

    /// The element offset of the head's state in `slot` of the pool (64-bit).
    fn state_offset(&self, slot: usize) -> usize {
        (slot * self.hv + self.i) * self.kd * self.vd
    }

    /// `s` as the pool would give it back after a write: rounded to bf16 for a bf16 pool.
    #[inline(always)]
    fn as_stored(&self, s: &mut Keys) {
        if self.bf16_pool {
            for x in s.iter_mut() {
                *x = bf16_to_f32(f32_to_bf16(*x));
            }
        }
    }

    /// One token (row `row` of the tensors) through the state `s`: decay, the delta rule's
    /// update, and, when `write_o`, the output row. Two CTA barriers; every thread calls it.
    ///
    /// # Safety
    /// As the kernel's: `row` is a row of every tensor.
    #[inline(always)]
    unsafe fn step(&self, row: usize, s: &mut Keys, write_o: bool) {
        let Place { tid, lane, group } = Place::fresh();
        let (kd, vd, gw, c) = (self.kd, self.vd, self.gw, self.col0 + lane);
        // SAFETY (block): the kernel's contract; shared indices below `MAX_K` and the partial sums'.
        unsafe {
            let smem = smem_base_generic() as *mut f32;
            let (qs, ks, decay) = (smem, smem.add(MAX_K), smem.add(2 * MAX_K));
            let (sum_k, sum_q) = (smem.add(3 * MAX_K), smem.add(3 * MAX_K + KEY_GROUPS * COLS));

            // The token's q, k (normalised when asked) and the decay per key row.
            if tid < kd {
                *qs.add(tid) = bf16_to_f32(*self.q.add((row * self.h + self.j) * kd + tid));
                *ks.add(tid) = bf16_to_f32(*self.k.add((row * self.h + self.j) * kd + tid));
                let a = if gw == 1 { 0 } else { tid };
                let raw = *self.g.add((row * self.hv + self.i) * gw + a);
                let strength = if self.a_log.is_null() { 1.0 } else { exp(*self.a_log.add(self.i)) };
                let bias = if self.dt_bias.is_null() { 0.0 } else { *self.dt_bias.add(self.i * gw + a) };
                *decay.add(tid) = exp(activate(raw, self.gate_mode, strength, bias, self.lower_bound));
            }
            sync_threads();
            let (mut q_scale, mut k_scale) = (1.0, 1.0);
            if self.options & OPT_L2NORM != 0 {
                let (mut sq, mut sk) = (0.0, 0.0);
                for a in 0..kd {
                    sq = fma_f32(*qs.add(a), *qs.add(a), sq);
                    sk = fma_f32(*ks.add(a), *ks.add(a), sk);
                }
                (q_scale, k_scale) = (rsqrt_approx(sq + L2NORM_EPS), rsqrt_approx(sk + L2NORM_EPS));
            }
            let b_raw = *self.beta.add(row * self.hv + self.i);
            let strength_beta = if self.options & OPT_BETA_SIGMOID != 0 { sigmoid(b_raw) } else { b_raw };

            // The decayed state and its S^T k part.
            let keys = kd / KEY_GROUPS;
            let mut part = 0.0;
            for (t, x) in s.iter_mut().enumerate() {
                if t < keys {
                    let a = group + KEY_GROUPS * t;
                    *x *= *decay.add(a);
                    part = fma_f32(*x, *ks.add(a) * k_scale, part);
                }
            }
            *sum_k.add(group * COLS + lane) = part;
            sync_threads();
            let mut sk = 0.0;
            for grp in 0..KEY_GROUPS {
                sk += *sum_k.add(grp * COLS + lane);
            }
            let delta = strength_beta * (bf16_to_f32(*self.v.add((row * self.hv + self.i) * vd + c)) - sk);
            // S += k delta^T, and the S^T q part.
            let mut part_q = 0.0;
            for (t, x) in s.iter_mut().enumerate() {
                if t < keys {
                    let a = group + KEY_GROUPS * t;
                    *x = fma_f32(*ks.add(a) * k_scale, delta, *x);
                    part_q = fma_f32(*x, *qs.add(a) * q_scale, part_q);
                }
            }
            *sum_q.add(group * COLS + lane) = part_q;
            sync_threads();
            if write_o && group == 0 {
                let mut oq = 0.0;
                for grp in 0..KEY_GROUPS {
                    oq += *sum_q.add(grp * COLS + lane);
                }
                *self.o.add((row * self.hv + self.i) * vd + c) = f32_to_bf16(self.scale * oq);
            }
            // No barrier before the next token: its staging rewrites `q`, `k` and the decay, read
            // before the barrier above, and its partial sums reach `sum_q` only after its first
            // barrier, which every reader of this token's sums passes after reading them.
        }
    }
}
