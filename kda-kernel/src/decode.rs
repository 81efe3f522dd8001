//! The decode step (`../shared/LAYER.md`, "Decode"): a few tokens per sequence through the layer
//! (one, or up to `MAX_DRAFT` draft tokens of speculative decoding), each sequence's state read
//! from its slot of a caller's pool and written back in place, or each token's state into a slot
//! of its own.
//!
//! One CTA per (sequence, value head, block of `COLS` value columns); each warp holds every key
//! of its own `WARP_COLS` columns. Each thread holds `VEC` consecutive columns of `K / KEY_LANES`
//! keys of the state in registers (vectors of `KEY_VECTOR` keys, interleaved with the warp's
//! other key lanes), loaded and stored as one vector per key row, so each quarter-warp reads and
//! writes 64 contiguous bytes of a row of the pool. Per token, with the layer's options applied
//! to its inputs:
//!
//! ```text
//! S = diag(exp(g)) S;   delta = beta (v - S^T k);   S += k delta^T;   o = scale S^T q
//! ```
//!
//! with `o` taken as `scale (S^T q + delta (k . q))` from the decayed `S`, so that one pass over
//! the state gives every sum the token needs: `S^T k`, `S^T q`, and the norms `q . q`, `k . k` and
//! `k . q` (the L2 norms scale the sums afterwards). The warp's key lanes add theirs by butterfly
//! shuffles, after which every lane holds its columns' whole sums and forms their delta (and,
//! on the first key lane, the output) itself: a token's sums never leave the warp. Every token's
//! rows are copied to shared memory (`cp.async`) under the state's loads and converted once, so a
//! CTA waits for memory once per call, not once per token, and a token then costs no CTA barrier
//! at all (against two, the sums and the deltas, when the warps split the keys: verify 0.875x of
//! that time on the H100, one-token steps within 1%). A sequence's tokens form a
//! chain (each continues from the previous one) or, with `parents`, a tree: a token continues from
//! its parent's state, which the CTA rebuilds from the sequence's initial state (read again from
//! its slot) along the parent's ancestors whenever the parent is not the token just run. Every
//! token runs the same `Token::step` as a one-token call, so a verify call's outputs and states
//! are bit for bit those of running its tokens one call at a time. A padding sequence (negative
//! slot) reads and writes nothing; a fresh one starts from zeros. Plain f32 arithmetic on every
//! target; the state is memory-bound (read once, written once per stored token).

use crate::arch::sm80::{
    bf16_to_f32, block_idx_x, cp_async_4, cp_async_16, cp_async_wait_all, f32_to_bf16, fma_f32, ld_global_v2,
    ld_global_v4, ld_shared_f32, ld_shared_u16, ld_shared_v2_f32, ld_shared_v4, nanosleep, pack_bf16x2, rsqrt_approx, shfl_xor,
    smem_base_shared, st_global_v2, st_global_v4, st_shared_f32, sync_threads, thread_idx_x_fresh,
};
use crate::abi::{StateDtypeCode, StateLayoutCode};
use crate::layer::{L2NORM_EPS, activate, exp, load_float, sigmoid};
use crate::layout::decode::{
    COL_LANES, COLS, COPY_BYTES, CTAS_PER_SM, K_MULTIPLE, KEY_LANES, KEY_VECTOR, MAX_DRAFT, MAX_K, MAX_KEYS_PER_THREAD, RAW_AT,
    RAW_BETA, RAW_G, RAW_K, RAW_Q, RAW_TOKEN_BYTES, RAW_V, STAGE_WORDS, STAGES_AT, VEC,
};
use crate::layout::layer::{
    OPT_BETA_BF16, OPT_BETA_SIGMOID, OPT_FIELD_MASK, OPT_GATE_BF16, OPT_L2NORM, OPT_SMS_SHIFT, OPT_STAGGER_SHIFT,
    STAGGER_UNIT_NS,
};

/// This thread's part of one head's state: `VEC` columns of each of its keys.
type Keys = [[f32; VEC]; MAX_KEYS_PER_THREAD];

/// Starts the first wave's CTAs that share an SM a `stagger` apart (`options`' stagger and SM
/// fields, `layout::layer::OPT_STAGGER_SHIFT`; `per_sm` CTAs share an SM): the block scheduler
/// gives CTA `b` of the first wave slot `b / SMs` of its SM, so slot `s` sleeps `s` staggers.
/// Every CTA of a wave runs the same steps (its state's loads, then its tokens, then its
/// stores), so without it an SM's CTAs load together and then compute together; offset, one's
/// loads overlap another's tokens, and each later CTA takes the offset of the slot it fills. No
/// field set (the default), nothing waits.
#[inline(always)]
fn stagger_start(options: u32, per_sm: u32) {
    let units = (options >> OPT_STAGGER_SHIFT) & OPT_FIELD_MASK;
    let sms = (options >> OPT_SMS_SHIFT) & OPT_FIELD_MASK;
    if units == 0 || sms == 0 {
        return;
    }
    let slot = block_idx_x() as u32 / sms;
    if slot > 0 && slot < per_sm {
        nanosleep(slot * units * STAGGER_UNIT_NS);
    }
}

kernel_entry! {
    /// The decode step (`abi::DECODE`, parameters `abi::DECODE_PARAMS`). Grid: `N * HV * V / COLS`
    /// CTAs, sequence-major; `layout::decode::THREADS` threads; `layout::decode::SMEM_BYTES`.
    ///
    /// Each sequence has `draft` tokens (1 to `MAX_DRAFT`), token `t` of sequence `n` at row
    /// `n * draft + t` of `q`, `k` `[N * draft, H, K]`, `v` `[N * draft, HV, V]` (bf16), the gate
    /// `g` `[N * draft, HV, gate_width]` and `beta` `[N * draft, HV]` (f32, or bf16 with
    /// `OPT_GATE_BF16` / `OPT_BETA_BF16` in `options`; `a_log`, `dt_bias` as the prepare kernel
    /// takes them); `o` `[N * draft, HV, V]` (bf16) times
    /// `f32::from_bits(scale_bits)`. `slots` `[N]` (i64, negative: padding) names the slot each
    /// sequence starts from, `fresh` `[N]` (u32, nonzero: from zeros instead). `parents`
    /// `[N * draft]` (i64; null: a chain) names the token each continues from (an earlier token of
    /// its sequence, or negative: the initial state). `token_slots` `[N * draft]` (i64; null: the
    /// last token's state goes back to the sequence's slot) names where each token's state is
    /// written (negative: nowhere). The pool is `[slots, HV, K, V]`, or `[slots, HV, V, K]` as
    /// `pool_layout` says (a `StateLayoutCode`), f32 or bf16 as
    /// `pool_dtype` says (a `StateDtypeCode`; with bf16 every written state is rounded, and a
    /// chain's state is rounded after each token as if written and read back, so that a verify
    /// call stays bit for bit the one-token calls).
    ///
    /// # Safety
    /// `v`, `o` and a bf16 pool are 8-byte aligned, an f32 pool 16-byte aligned. Every non-negative slot lies inside the pool; no slot is written by one sequence and read
    /// or written by another, nor twice by one, nor, in a call with a tree, by its own sequence;
    /// each parent precedes its token; the tensors hold
    /// `N * draft` rows; `K` a multiple of `K_MULTIPLE` up to `MAX_K`, `V` a multiple of `COLS`.
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
        pool_layout: u32,
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
        // (`sizes_run` and `cta_place` spelled out: through them the compiler no longer proves
        // `Token::new`'s head-group division safe here, and the step spills more.)
        if h == 0
            || hv == 0
            || !hv.is_multiple_of(h)
            || kd == 0
            || kd > MAX_K
            || !kd.is_multiple_of(K_MULTIPLE)
            || vd == 0
            || !vd.is_multiple_of(COLS)
            || !(gw == 1 || gw == kd)
            || d == 0
            || d > MAX_DRAFT
        {
            return; // the launcher never launches so; this proves the indices below safe
        }
        stagger_start(options, CTAS_PER_SM as u32);
        let blocks = (vd / COLS) as u32;
        let per_seq = value_heads.wrapping_mul(blocks);
        let b = block_idx_x() as u32;
        let (Some(n), Some(rest)) = (b.checked_div(per_seq), b.checked_rem(per_seq)) else { return };
        // (Checked divisions: the sizes are positive, which the compiler cannot see; no panic path.)
        let (Some(i), Some(block)) = (rest.checked_div(blocks), rest.checked_rem(blocks)) else { return };
        let (n, i, col0) = (n as usize, i as usize, block as usize * COLS);
        let dims = Dims { h, hv, kd, vd, gw };
        let codes = Codes { options, gate_mode, pool_dtype, pool_layout, lower_bound_bits, scale_bits };
        let token = Token::new(Tensors { q, k, v, g, beta, a_log, dt_bias, o }, dims, i, col0, codes);
        // SAFETY (block): the kernel's contract.
        unsafe {
            // The sequence's slot and start, and this thread's key's gate scalars, requested
            // together: the state's loads wait for one memory round trip before them, and the
            // tokens' staging for none (the plan's tables and the head's scalars, not the
            // sequence's pool slot, so a padding sequence still reads nothing of the pool).
            let scalars = token.gate_scalars(thread_idx_x_fresh());
            let (slot, start_fresh) = (*slots.add(n), *fresh.add(n) != 0);
            if slot < 0 {
                return; // padding: nothing read or written
            }
            // Every token's rows copied to shared memory, under the state's loads; then
            // converted once, so that each token waits on a barrier, not on memory.
            token.copy_raw(n * d, d);
            // `s` is the state after token `current` (-1: the initial state, read from the slot,
            // or zeros).
            let mut s: Keys = [[0.0; VEC]; MAX_KEYS_PER_THREAD];
            if !start_fresh {
                token.load(pool, token.bf16_pool, token.value_first_pool, slot as usize, &mut s);
            }
            token.stage_raw(d, scalars);
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
                    s = [[0.0; VEC]; MAX_KEYS_PER_THREAD];
                    if !start_fresh {
                        token.load(pool, token.bf16_pool, token.value_first_pool, slot as usize, &mut s);
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
                        // (A staged token uses no loading stage: parity 0.)
                        token.step(n * d + u, Some(u), &mut s, u == t, 0);
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

kernel_entry! {
    /// Checkpoints for prefix caching (`abi::ADVANCE`, parameters `abi::ADVANCE_PARAMS`): item
    /// `m` starts from state `sources[m]` of `h` (bf16 `[NT, HV, K, V]`, or `[NT, HV, V, K]` as
    /// `h_layout` says: a layer's chunk entry states), runs the `counts[m]` tokens from row
    /// `first_rows[m]` of the layer's inputs through it as the decode step runs a chain (the same
    /// `Token::step`, no output row), and writes the state to slot `slots[m]` of `pool` (in
    /// `pool_layout`, f32 or bf16 as `pool_dtype` says, rounded once). Grid: `M * HV * V / COLS` CTAs, item-major; `layout::decode::THREADS`
    /// threads; `layout::decode::SMEM_BYTES`.
    ///
    /// # Safety
    /// As `kda_decode_step`'s for the tensors and sizes; every source is a state of `h`, every
    /// item's rows are rows of the inputs, every slot lies inside the pool and no two items write
    /// one slot; a bf16 pool is 8-byte aligned, an f32 one 16-byte.
    pub unsafe fn kda_advance_states(
        q: *const u16,
        k: *const u16,
        v: *const u16,
        g: *const f32,
        beta: *const f32,
        a_log: *const f32,
        dt_bias: *const f32,
        h: *const u16,
        sources: *const i64,
        first_rows: *const i64,
        counts: *const u32,
        slots: *const i64,
        pool: *mut f32,
        pool_dtype: u32,
        pool_layout: u32,
        h_layout: u32,
        heads: u32,
        value_heads: u32,
        key_dim: u32,
        value_dim: u32,
        gate_width: u32,
        options: u32,
        gate_mode: u32,
        lower_bound_bits: u32,
    ) {
        let dims = Dims {
            h: heads as usize,
            hv: value_heads as usize,
            kd: key_dim as usize,
            vd: value_dim as usize,
            gw: gate_width as usize,
        };
        if !sizes_run(dims.h, dims.hv, dims.kd, dims.vd, dims.gw) {
            return; // the launcher never launches so; this proves the indices below safe
        }
        let Some((m, i, col0)) = cta_place(value_heads, dims.vd) else { return };
        let codes = Codes { options, gate_mode, pool_dtype, pool_layout, lower_bound_bits, scale_bits: 0 };
        let o = core::ptr::null_mut(); // no output rows
        let token = Token::new(Tensors { q, k, v, g, beta, a_log, dt_bias, o }, dims, i, col0, codes);
        // SAFETY (block): the kernel's contract.
        unsafe {
            let (source, first, count) = (*sources.add(m) as usize, *first_rows.add(m) as usize, *counts.add(m) as usize);
            let mut s: Keys = [[0.0; VEC]; MAX_KEYS_PER_THREAD];
            let h_value_first = h_layout == StateLayoutCode::ValueFirst as u32;
            token.load(h as *const f32, true, h_value_first, source, &mut s);
            let mut parity = 0;
            for t in 0..count {
                token.step(first + t, None, &mut s, false, parity);
                parity ^= 1;
            }
            token.store(pool, *slots.add(m) as usize, &s);
        }
    }
}

/// Whether the kernels run these sizes (the launcher checks the same, with typed errors): `HV` a
/// multiple of `H`, `K` a multiple of `K_MULTIPLE` up to `MAX_K`, `V` a multiple of `COLS`, the
/// gate one value or one per key.
#[inline(always)]
fn sizes_run(h: usize, hv: usize, kd: usize, vd: usize, gw: usize) -> bool {
    h > 0
        && hv > 0
        && hv.is_multiple_of(h)
        && kd > 0
        && kd <= MAX_K
        && kd.is_multiple_of(K_MULTIPLE)
        && vd > 0
        && vd.is_multiple_of(COLS)
        && (gw == 1 || gw == kd)
}

/// This CTA's item (sequence or checkpoint), value head and first column: the grid is item-major,
/// then value heads, then blocks of `COLS` columns. `None` only for sizes `sizes_run` refuses.
fn cta_place(value_heads: u32, vd: usize) -> Option<(usize, usize, usize)> {
    let blocks = (vd / COLS) as u32;
    let b = block_idx_x() as u32;
    // (Checked divisions: the sizes are positive, which the compiler cannot see; no panic path.)
    let per_item = value_heads.wrapping_mul(blocks);
    let (item, rest) = (b.checked_div(per_item)?, b.checked_rem(per_item)?);
    let (i, block) = (rest.checked_div(blocks)?, rest.checked_rem(blocks)?);
    Some((item as usize, i as usize, block as usize * COLS))
}

/// The tensors a token reads (and `o`, which it writes).
struct Tensors {
    q: *const u16,
    k: *const u16,
    v: *const u16,
    g: *const f32,
    beta: *const f32,
    a_log: *const f32,
    dt_bias: *const f32,
    o: *mut u16,
}

/// Head counts and sizes (`gw`: the gate's values per head, 1 or `K`).
#[derive(Clone, Copy)]
struct Dims {
    h: usize,
    hv: usize,
    kd: usize,
    vd: usize,
    gw: usize,
}

/// The launch's option words, as the kernels take them.
struct Codes {
    options: u32,
    gate_mode: u32,
    pool_dtype: u32,
    /// A `StateLayoutCode`.
    pool_layout: u32,
    lower_bound_bits: u32,
    scale_bits: u32,
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
    /// The pool's states are value-first (`[V, K]`).
    value_first_pool: bool,
    lower_bound: f32,
    scale: f32,
}

/// A thread's place: its column vector in the block (its warp's, then its lane's among the
/// warp's) and its key lane, read afresh from `%tid.x` by each use (`thread_idx_x_fresh`), so
/// that the compiler recomputes the addresses derived from it per token instead of keeping all of
/// them in registers across the token loop.
struct Place {
    /// The thread's vector of `VEC` columns in the block.
    col_lane: usize,
    /// The thread's lane along the keys: its keys are vectors `key_lane`, `key_lane +
    /// KEY_LANES`, ... of `KEY_VECTOR` keys ([`Place::key`]).
    key_lane: usize,
}

impl Place {
    fn fresh() -> Self {
        let tid = thread_idx_x_fresh();
        let (warp, lane) = (tid / 32, tid % 32);
        Self { col_lane: warp * COL_LANES + lane % COL_LANES, key_lane: lane / COL_LANES }
    }

    /// The thread's key `t` (of `K / KEY_LANES`): the key lanes' vectors interleave, so that a
    /// warp's lanes read `KEY_LANES` consecutive 16-byte vectors of a staged row at once.
    fn key(&self, t: usize) -> usize {
        (t / KEY_VECTOR * KEY_LANES + self.key_lane) * KEY_VECTOR + t % KEY_VECTOR
    }
}

/// Four bf16 (8 bytes, the first in the low half of the first word) as f32.
pub(crate) fn unpack4(w: [u32; 2]) -> [f32; 4] {
    let half = |x: u32, hi: bool| bf16_to_f32(if hi { (x >> 16) as u16 } else { x as u16 });
    [half(w[0], false), half(w[0], true), half(w[1], false), half(w[1], true)]
}

/// The f32 of a 16-byte vector.
fn floats4(w: [u32; 4]) -> [f32; 4] {
    w.map(f32::from_bits)
}

/// The sum of `x` over the warp's `KEY_LANES` key lanes (lanes `COL_LANES` apart), by
/// butterfly shuffles: every lane ends with the sum.
///
/// # Safety
/// The whole warp calls it together.
#[inline(always)]
unsafe fn add_key_lanes(x: f32) -> f32 {
    let mut x = x;
    let mut apart = COL_LANES;
    while apart < 32 {
        // SAFETY: the caller's contract.
        x += f32::from_bits(unsafe { shfl_xor(x.to_bits(), apart as u32) });
        apart *= 2;
    }
    x
}

/// A key's gate scalars, as [`Token::gate_scalars`] loads them: the value head's raw `A_log`
/// (absent: a strength of 1) and the key's `dt_bias` (0 when absent).
#[derive(Clone, Copy)]
struct GateScalars {
    a_log: Option<f32>,
    bias: f32,
}

/// Where a token's threads read its `v` and `beta`: the draft token's raw slot (shared
/// address), or values loaded from memory before the token's barrier.
#[derive(Clone, Copy)]
enum Inputs {
    Staged(u32),
    Loaded([f32; VEC], f32),
}

/// The shared address of draft token `t`'s raw inputs (`layout::decode::RAW_AT`).
fn raw_slot(t: usize) -> u32 {
    smem_base_shared() + (RAW_AT * 4 + t * RAW_TOKEN_BYTES) as u32
}

/// The shared address of stage `t` (`q`, `k` and the decay per key; `layout::decode::STAGES_AT`).
fn stage_of(t: usize) -> u32 {
    smem_base_shared() + ((STAGES_AT + t * STAGE_WORDS) * 4) as u32
}

impl Token {
    /// Whether the gate is given in bf16 (`OPT_GATE_BF16`; else f32).
    fn gate_bf16(&self) -> bool {
        self.options & OPT_GATE_BF16 != 0
    }

    /// Whether `beta` is given in bf16 (`OPT_BETA_BF16`; else f32).
    fn beta_bf16(&self) -> bool {
        self.options & OPT_BETA_BF16 != 0
    }

    /// The gate's column of key `key`: the key's own with a gate per key, else the one.
    fn gate_column(&self, key: usize) -> usize {
        if self.gw == 1 { 0 } else { key }
    }

    /// A token's view of the launch; `d` passed `sizes_run` (so `d.h` is positive).
    #[inline(always)]
    fn new(x: Tensors, d: Dims, i: usize, col0: usize, c: Codes) -> Self {
        Self {
            q: x.q,
            k: x.k,
            v: x.v,
            g: x.g,
            beta: x.beta,
            a_log: x.a_log,
            dt_bias: x.dt_bias,
            o: x.o,
            h: d.h,
            hv: d.hv,
            kd: d.kd,
            vd: d.vd,
            gw: d.gw,
            i,
            j: i.checked_div(d.hv / d.h).unwrap_or(0),
            col0,
            options: c.options,
            gate_mode: c.gate_mode,
            bf16_pool: c.pool_dtype == StateDtypeCode::Bf16 as u32,
            value_first_pool: c.pool_layout == StateLayoutCode::ValueFirst as u32,
            lower_bound: f32::from_bits(c.lower_bound_bits),
            scale: f32::from_bits(c.scale_bits),
        }
    }

    /// Keys per thread.
    fn keys(&self) -> usize {
        self.kd / KEY_LANES
    }

    /// The element offset of this thread's first column in key row `key` of the head's state in
    /// `slot` of a key-first pool (64-bit; a multiple of `VEC`).
    fn state_offset(&self, slot: usize, key: usize, at: &Place) -> usize {
        ((slot * self.hv + self.i) * self.kd + key) * self.vd + self.col0 + VEC * at.col_lane
    }

    /// The element offset of key `key` in this thread's column `x` of the head's state in `slot`
    /// of a value-first pool (`[slots, HV, V, K]`; 64-bit).
    fn value_first_offset(&self, slot: usize, x: usize, key: usize, at: &Place) -> usize {
        ((slot * self.hv + self.i) * self.vd + self.col0 + VEC * at.col_lane + x) * self.kd + key
    }

    /// This thread's keys of the head's state in `slot` of `pool` (`[slots, HV, K, V]`, or
    /// `[slots, HV, V, K]` when `value_first`; bf16 or f32 as `bf16` says), into `s`.
    ///
    /// # Safety
    /// `slot` lies inside the pool; the pool is 16-byte aligned (bf16: 8-byte).
    #[inline(always)]
    unsafe fn load(&self, pool: *const f32, bf16: bool, value_first: bool, slot: usize, s: &mut Keys) {
        let at = Place::fresh();
        // SAFETY (both): the key rows are below `kd` and the columns below `vd`; the offsets are
        // multiples of the vectors' lengths (`VEC` = `KEY_VECTOR`), so the vectors are aligned.
        let vector = |e: usize| unsafe {
            if bf16 {
                unpack4(ld_global_v2((pool as *const u16).add(e) as *const u32))
            } else {
                floats4(ld_global_v4(pool.add(e) as *const u32))
            }
        };
        if value_first {
            // One element at a time: a thread's keys of a column are contiguous there, and the
            // L1 keeps each 32-byte sector for the thread's next keys.
            for (t, row) in s.iter_mut().enumerate() {
                if t < self.keys() {
                    for (x, value) in row.iter_mut().enumerate() {
                        let e = self.value_first_offset(slot, x, at.key(t), &at);
                        // SAFETY: the key row is below `kd` and the column below `vd`.
                        *value = unsafe {
                            if bf16 { bf16_to_f32(*(pool as *const u16).add(e)) } else { *pool.add(e) }
                        };
                    }
                }
            }
        } else {
            for (t, row) in s.iter_mut().enumerate() {
                if t < self.keys() {
                    *row = vector(self.state_offset(slot, at.key(t), &at));
                }
            }
        }
    }

    /// This thread's keys of `s` to the head's state in `slot` of the pool (in the pool's
    /// layout and element type).
    ///
    /// # Safety
    /// `slot` lies inside the pool and no other sequence reads or writes it; the pool is 16-byte
    /// aligned (bf16: 8-byte).
    #[inline(always)]
    unsafe fn store(&self, pool: *mut f32, slot: usize, s: &Keys) {
        let at = Place::fresh();
        // SAFETY (both): as in `load`.
        let vector = |e: usize, v: [f32; 4]| unsafe {
            if self.bf16_pool {
                let w = [pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3])];
                st_global_v2((pool as *mut u16).add(e) as *mut u32, w);
            } else {
                st_global_v4(pool.add(e) as *mut u16, v.map(f32::to_bits));
            }
        };
        if self.value_first_pool {
            // As in `load`.
            for (t, row) in s.iter().enumerate() {
                if t < self.keys() {
                    for (x, &value) in row.iter().enumerate() {
                        let e = self.value_first_offset(slot, x, at.key(t), &at);
                        // SAFETY: as in `load`.
                        unsafe {
                            if self.bf16_pool {
                                *(pool as *mut u16).add(e) = f32_to_bf16(value);
                            } else {
                                *pool.add(e) = value;
                            }
                        }
                    }
                }
            }
        } else {
            for (t, row) in s.iter().enumerate() {
                if t < self.keys() {
                    vector(self.state_offset(slot, at.key(t), &at), *row);
                }
            }
        }
    }

    /// `s` as the pool would give it back after a write: rounded to bf16 for a bf16 pool.
    #[inline(always)]
    fn as_stored(&self, s: &mut Keys) {
        if self.bf16_pool {
            for row in s.iter_mut() {
                for x in row.iter_mut() {
                    *x = bf16_to_f32(f32_to_bf16(*x));
                }
            }
        }
    }

    /// Copies the rows of the sequence's `d` tokens from `first_row` on (`q`, `k`, the gate,
    /// this CTA's columns of `v`, `beta`) to their raw slots in shared memory, one 16-byte copy (or
    /// one f32) per thread per token, asynchronously: [`Token::stage_raw`] waits for them.
    ///
    /// # Safety
    /// As the kernel's: the rows exist; `q`, `k`, `v` and a gate per key start 16-byte aligned.
    #[inline(always)]
    unsafe fn copy_raw(&self, first_row: usize, d: usize) {
        let (kd, gw) = (self.kd, self.gw);
        let tid = thread_idx_x_fresh();
        // Copies per token of each row, laid end to end over the threads.
        let q_end = kd * 2 / COPY_BYTES;
        let k_end = 2 * q_end;
        let (gate_bf16, beta_bf16) = (self.gate_bf16(), self.beta_bf16());
        let gate_bytes = if gate_bf16 { 2 } else { 4 };
        let g_end = k_end + if gw == 1 { 1 } else { gw * gate_bytes / COPY_BYTES };
        let v_end = g_end + COLS * 2 / COPY_BYTES;
        // SAFETY (block): the kernel's contract; each destination lies in its token's raw slot.
        unsafe {
            let copy = |dst: u32, src: *const u8| cp_async_16(dst, src, COPY_BYTES as u32);
            for t in 0..MAX_DRAFT {
                if t < d {
                    let row = first_row + t;
                    let raw = raw_slot(t);
                    let (head_row, value_row) = (row * self.h + self.j, row * self.hv + self.i);
                    // Copy `e` of a row: elements `8 e ..` of a bf16 row, `4 e ..` of an f32 one.
                    // A per-head gate and `beta` are one element each: copied as f32, or, in
                    // bf16 (2 bytes, below `cp.async`'s 4), loaded and stored converted.
                    if tid < q_end {
                        copy(raw + (RAW_Q + COPY_BYTES * tid) as u32, self.q.add(head_row * kd + 8 * tid) as *const u8);
                    } else if tid < k_end {
                        let e = tid - q_end;
                        copy(raw + (RAW_K + COPY_BYTES * e) as u32, self.k.add(head_row * kd + 8 * e) as *const u8);
                    } else if tid < g_end {
                        let e = tid - k_end;
                        if gw == 1 && gate_bf16 {
                            st_shared_f32(raw + RAW_G as u32, load_float(self.g, value_row, true));
                        } else if gw == 1 {
                            cp_async_4(raw + RAW_G as u32, self.g.add(value_row) as *const u8, 4);
                        } else {
                            let src = self.g.cast::<u8>().add((value_row * gw) * gate_bytes + COPY_BYTES * e);
                            copy(raw + (RAW_G + COPY_BYTES * e) as u32, src);
                        }
                    } else if tid < v_end {
                        let e = tid - g_end;
                        let src = self.v.add(value_row * self.vd + self.col0 + 8 * e);
                        copy(raw + (RAW_V + COPY_BYTES * e) as u32, src as *const u8);
                    } else if tid == v_end && beta_bf16 {
                        st_shared_f32(raw + RAW_BETA as u32, load_float(self.beta, value_row, true));
                    } else if tid == v_end {
                        cp_async_4(raw + RAW_BETA as u32, self.beta.add(value_row) as *const u8, 4);
                    }
                }
            }
        }
    }

    /// Waits for [`Token::copy_raw`]'s copies, then converts each of the `d` tokens' `q`, `k` and
    /// gate into its stage (f32, the decay activated), one key per thread, the thread's key's
    /// gate scalars `scalars` ([`Token::gate_scalars`]). Two CTA barriers.
    ///
    /// # Safety
    /// Every thread calls it, after `copy_raw(_, d)`.
    #[inline(always)]
    unsafe fn stage_raw(&self, d: usize, scalars: GateScalars) {
        cp_async_wait_all();
        // SAFETY (block): every thread calls it; the addresses lie in the raw slots and stages.
        unsafe {
            sync_threads();
            let tid = thread_idx_x_fresh();
            if tid < self.kd {
                for t in 0..MAX_DRAFT {
                    if t < d {
                        let raw = raw_slot(t);
                        let q = bf16_to_f32(ld_shared_u16(raw + (RAW_Q + 2 * tid) as u32));
                        let k = bf16_to_f32(ld_shared_u16(raw + (RAW_K + 2 * tid) as u32));
                        // A per-key bf16 gate as copied; the others as f32.
                        let g = if self.gw > 1 && self.gate_bf16() {
                            bf16_to_f32(ld_shared_u16(raw + (RAW_G + 2 * tid) as u32))
                        } else {
                            ld_shared_f32(raw + (RAW_G + 4 * self.gate_column(tid)) as u32)
                        };
                        self.stage_key(stage_of(t), tid, q, k, g, scalars);
                    }
                }
            }
            sync_threads();
        }
    }

    /// The gate's scalars of key `key` (below `K`; zeros past it): the raw `A_log` of the value
    /// head and the key's `dt_bias` (each absent when its tensor is), loaded and not yet used, so
    /// that a caller may request them beside other loads and use them later.
    ///
    /// # Safety
    /// `a_log` and `dt_bias` hold `HV` and `HV * gate_width` values when present.
    #[inline(always)]
    unsafe fn gate_scalars(&self, key: usize) -> GateScalars {
        if key >= self.kd {
            return GateScalars { a_log: None, bias: 0.0 };
        }
        // SAFETY: see the function's contract.
        unsafe {
            GateScalars {
                a_log: if self.a_log.is_null() { None } else { Some(*self.a_log.add(self.i)) },
                bias: if self.dt_bias.is_null() { 0.0 } else { *self.dt_bias.add(self.i * self.gw + self.gate_column(key)) },
            }
        }
    }

    /// Key `key` of a token into the stage at `stage`: `q`, `k` and the decay, `exp` of the gate
    /// `raw` activated with the key's `scalars` (one code path for the copied and the loaded
    /// rows, so that both give the same bits).
    ///
    /// # Safety
    /// `stage` is a stage's shared address, `key < K`.
    #[inline(always)]
    unsafe fn stage_key(&self, stage: u32, key: usize, q: f32, k: f32, raw: f32, scalars: GateScalars) {
        let strength = match scalars.a_log {
            Some(a_log) => exp(a_log),
            None => 1.0,
        };
        let decay = exp(activate(raw, self.gate_mode, strength, scalars.bias, self.lower_bound));
        // SAFETY: see the function's contract.
        unsafe {
            let word = |x: usize| stage + (x * 4) as u32;
            st_shared_f32(word(key), q);
            st_shared_f32(word(MAX_K + key), k);
            st_shared_f32(word(2 * MAX_K + key), decay);
        }
    }

    /// One token (row `row` of the tensors) through the state `s`: decay, the delta rule's
    /// update, and, when `write_o`, the output row. Its inputs come from draft token `staged`'s
    /// stage and raw slot when given (staged by [`Token::stage_raw`]: no barrier), else from
    /// memory through stage `parity` (one CTA barrier); every thread calls it, with `parity`
    /// alternating between consecutive loaded tokens. A token's sums over the keys stay inside each warp
    /// (its lanes hold every key of the warp's columns): every lane ends with its columns' sums
    /// and forms their delta itself.
    ///
    /// # Safety
    /// As the kernel's: `row` is a row of every tensor; a `staged` token is staged.
    #[inline(always)]
    unsafe fn step(&self, row: usize, staged: Option<usize>, s: &mut Keys, write_o: bool, parity: usize) {
        let (kd, vd, keys) = (self.kd, self.vd, self.keys());
        let (head_row, value_row) = (row * self.h + self.j, row * self.hv + self.i);
        // SAFETY (block): the kernel's contract; the vectors' offsets are multiples of `VEC`
        // (`col0` and `V` are), shared indices below `SMEM_WORDS`.
        unsafe {
            let word = |x: usize| (x * 4) as u32;
            let at = Place::fresh();
            let c = self.col0 + VEC * at.col_lane;
            // `v` and `beta`: from the raw slot when staged, else from memory.
            let (stage, inputs) = match staged {
                Some(t) => (stage_of(t), Inputs::Staged(raw_slot(t))),
                None => {
                    // The token's q, k and decay staged (one key per thread), and this thread's
                    // v and beta, all loads issued before the wait. The stage is rewritten two
                    // tokens on, after the next token's barrier, which every thread reaches only
                    // after reading this one.
                    let stage = stage_of(parity);
                    let tid = thread_idx_x_fresh();
                    if tid < kd {
                        let e = head_row * kd + tid;
                        let (q, k) = (bf16_to_f32(*self.q.add(e)), bf16_to_f32(*self.k.add(e)));
                        let raw = load_float(self.g, value_row * self.gw + self.gate_column(tid), self.gate_bf16());
                        self.stage_key(stage, tid, q, k, raw, self.gate_scalars(tid));
                    }
                    let v = unpack4(ld_global_v2(self.v.add(value_row * vd + c) as *const u32));
                    let loaded = Inputs::Loaded(v, load_float(self.beta, value_row, self.beta_bf16()));
                    sync_threads();
                    (stage, loaded)
                }
            };
            let (qs, ks, decays) = (stage, stage + word(MAX_K), stage + word(2 * MAX_K));

            // The decayed state, and this thread's parts of S^T k, S^T q, q . q, k . k, k . q,
            // its keys' staged values read four at a time.
            let (mut sk, mut sq) = ([0.0f32; VEC], [0.0f32; VEC]);
            let (mut nq, mut nk, mut kq) = (0.0, 0.0, 0.0);
            for quad in 0..MAX_KEYS_PER_THREAD / KEY_VECTOR {
                if quad < keys / KEY_VECTOR {
                    let at_key = word(at.key(KEY_VECTOR * quad));
                    let q4 = floats4(ld_shared_v4(qs + at_key));
                    let k4 = floats4(ld_shared_v4(ks + at_key));
                    let d4 = floats4(ld_shared_v4(decays + at_key));
                    for x in 0..KEY_VECTOR {
                        let (q, k) = (q4[x], k4[x]);
                        for (col, state) in s[KEY_VECTOR * quad + x].iter_mut().enumerate() {
                            *state *= d4[x];
                            sk[col] = fma_f32(*state, k, sk[col]);
                            sq[col] = fma_f32(*state, q, sq[col]);
                        }
                        nq = fma_f32(q, q, nq);
                        nk = fma_f32(k, k, nk);
                        kq = fma_f32(k, q, kq);
                    }
                }
            }
            // The sums over the warp's key lanes: every lane has its columns' whole sums.
            for col in 0..VEC {
                sk[col] = add_key_lanes(sk[col]);
                sq[col] = add_key_lanes(sq[col]);
            }
            let (nq, nk, kq) = (add_key_lanes(nq), add_key_lanes(nk), add_key_lanes(kq));
            let (v, b_raw) = match inputs {
                Inputs::Staged(raw) => {
                    let v = ld_shared_v2_f32(raw + (RAW_V + 2 * VEC * at.col_lane) as u32).map(f32::to_bits);
                    (unpack4(v), ld_shared_f32(raw + RAW_BETA as u32))
                }
                Inputs::Loaded(v, b_raw) => (v, b_raw),
            };
            let (q_scale, k_scale) = if self.options & OPT_L2NORM != 0 {
                (rsqrt_approx(nq + L2NORM_EPS), rsqrt_approx(nk + L2NORM_EPS))
            } else {
                (1.0, 1.0)
            };
            let strength_beta = if self.options & OPT_BETA_SIGMOID != 0 { sigmoid(b_raw) } else { b_raw };
            // o = scale (S^T q + delta (k . q)) from the decayed S, q and k normalised.
            let kq = kq * k_scale * q_scale;
            let mut out = [0.0f32; VEC];
            let mut delta = [0.0f32; VEC];
            for col in 0..VEC {
                delta[col] = strength_beta * (v[col] - k_scale * sk[col]);
                out[col] = self.scale * fma_f32(delta[col], kq, q_scale * sq[col]);
            }
            if write_o && at.key_lane == 0 {
                let w = [pack_bf16x2(out[0], out[1]), pack_bf16x2(out[2], out[3])];
                st_global_v2(self.o.add(value_row * vd + c) as *mut u32, w);
            }
            for quad in 0..MAX_KEYS_PER_THREAD / KEY_VECTOR {
                if quad < keys / KEY_VECTOR {
                    let k4 = floats4(ld_shared_v4(ks + word(at.key(KEY_VECTOR * quad))));
                    for x in 0..KEY_VECTOR {
                        for (col, state) in s[KEY_VECTOR * quad + x].iter_mut().enumerate() {
                            *state = fma_f32(k4[x] * k_scale, delta[col], *state);
                        }
                    }
                }
            }
        }
    }
}
