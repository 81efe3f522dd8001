//! The host-device ABI: everything a launch and a kernel must agree on, defined once.
//!
//! This module compiles for every target. The kernels' signatures follow it, the launcher
//! (`kda::launch`) pushes its arguments in its order and checks each against it, the PTX builder
//! (`kda/build.rs`) reads the parameter alignments and launch bounds from it, and a test parses
//! the `.entry` of every kernel in the built PTX and checks it against [`KernelAbi::params`] and
//! the launcher's argument list.
//!
//! Pointers and scalars are separate kernel parameters, not fields of one by-value struct: rustc
//! passes a struct parameter as an integer array, and LLVM's NVPTX backend then no longer knows
//! the pointers address global memory (every access would compile to a generic `ld`/`st` instead
//! of `ld.global`/`st.global`). The tensor maps, which the kernel only takes the address of, are
//! one aggregate parameter ([`TensorMaps`]).

use crate::layout::{baseline, hopper};

/// A CUDA tensor map (`CUtensorMap`: 128 opaque bytes, encoded by the driver on the host).
///
/// TMA needs a tensor map 64-byte aligned. rustc's nvptx kernel ABI declares no parameter above
/// `.align 16` (and panics on a higher `align` attribute), so the type says 16 and the PTX
/// builder raises the parameter's declaration to [`Param::align`]; every map sits at a multiple
/// of 64 bytes inside the aggregate (asserted below).
#[derive(Clone, Copy)]
#[repr(C, align(16))]
pub struct TensorMap(pub [u64; 16]);

/// Bytes of one tensor map.
pub const TENSOR_MAP_BYTES: usize = core::mem::size_of::<TensorMap>();
/// The alignment TMA requires of a tensor map.
pub const TENSOR_MAP_ALIGN: usize = 64;

/// The tensor maps of the Hopper kernel, in the order of [`TensorMaps`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum MapSlot {
    /// `k` as a 3-D `[T][H][K]` bf16 tensor in `[CHUNK][1][64]` boxes, 128-byte swizzled.
    K,
    /// `w`, as `K`.
    W,
    /// `u` (`[T][H][V]`) in `[CHUNK][1][BV]` boxes (the launch's block width; 64-byte swizzled
    /// for narrow blocks).
    U,
    /// `k` in one-token boxes (`[1][1][64]`), for the tail chunk's valid rows.
    KRow,
    /// `w` in one-token boxes.
    WRow,
    /// `u` in one-token boxes.
    URow,
    /// The output `h` as a 3-D `[NT * H][K][V]` bf16 tensor in `[1][K][BV]` boxes (value-first:
    /// `[1][BV][64]`), swizzled.
    H,
    /// The output `v_new` (`[T][H][V]`), as `U`.
    VNew,
    /// `h0` as a 3-D `[N * H][K][V]` f32 tensor in unswizzled `[1][K][BV]` boxes (all zero bytes,
    /// and never used, when the launch has no initial states).
    H0,
    /// The fused layer pass's `q Γ` (`[T][HV][K]` bf16), as `W` (all zero bytes, and never used,
    /// outside the fused pass; so are the three below).
    Q,
    /// `q Γ` in one-token boxes.
    QRow,
    /// The fused pass's causal attention `P` (`[T][HV][CHUNK]` bf16: each token's row of its
    /// chunk's `P`) in `[CHUNK][1][64]` boxes, 128-byte swizzled.
    P,
    /// `P` in one-token boxes.
    PRow,
    /// `k` in boxes of one swizzle atom of tokens (`[8][1][64]`, `layout::hopper::ATOM_ROWS`),
    /// for the tail chunk's valid rows a whole atom at a time.
    KAtom,
    /// `w` in boxes of one atom of tokens.
    WAtom,
    /// `u` in boxes of one atom of tokens.
    UAtom,
    /// `q Γ` in boxes of one atom of tokens (fused pass only).
    QAtom,
    /// `P` in boxes of one atom of tokens (fused pass only).
    PAtom,
}

/// Tensor maps per Hopper launch.
pub const TENSOR_MAPS: usize = MapSlot::PAtom as usize + 1;

/// The Hopper kernel's tensor maps, indexed by [`MapSlot`]: its first parameter, passed by
/// value and handed to TMA by address (`cvta.param`), so each map's address is the parameter's
/// plus `128 * slot`.
#[derive(Clone, Copy)]
#[repr(C, align(16))]
pub struct TensorMaps(pub [TensorMap; TENSOR_MAPS]);

/// The type of a kernel parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamKind {
    /// A global-memory pointer (64 bits).
    Pointer,
    /// A 32-bit unsigned integer.
    U32,
    /// The [`TensorMaps`] aggregate.
    TensorMaps,
}

/// One kernel parameter: its name in the launcher and its type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Param {
    /// The argument's name (the tensor or scalar it carries).
    pub name: &'static str,
    /// Its type.
    pub kind: ParamKind,
}

impl Param {
    const fn pointer(name: &'static str) -> Self {
        Self { name, kind: ParamKind::Pointer }
    }

    const fn u32(name: &'static str) -> Self {
        Self { name, kind: ParamKind::U32 }
    }

    /// Bytes of the parameter.
    pub const fn bytes(&self) -> usize {
        match self.kind {
            ParamKind::Pointer => 8,
            ParamKind::U32 => 4,
            ParamKind::TensorMaps => core::mem::size_of::<TensorMaps>(),
        }
    }

    /// The alignment the PTX declares for it (for the tensor maps, the builder's, above rustc's).
    pub const fn align(&self) -> usize {
        match self.kind {
            ParamKind::TensorMaps => TENSOR_MAP_ALIGN,
            _ => self.bytes(),
        }
    }
}

/// The Hopper kernel's parameters, in order. Pointers are the tensors the kernel reaches without
/// a tensor map: `g` and `gk` (null when the gate is absent; each chunk's rows of `g`, each
/// chunk's last row of `gk`), `h0` (only tested for null: the map loads it), `v_new` (the tail
/// chunk's valid rows), `ht`, and the schedule's work records. `heads` counts value heads (each
/// work record names its key head); `value_dim` is `V` (`K + V` in the pre-scan, the width of
/// its `ht`); `state_layout` is a [`StateLayoutCode`]; `pass` a [`PassCode`];
/// the strides are in elements, of the token and head dimensions of `g`, `gk` and `v_new` (the
/// tensor maps carry those of `k`, `w`, `u` and `v_new`'s full boxes).
pub const HOPPER_PARAMS: [Param; 17] = [
    Param { name: "maps", kind: ParamKind::TensorMaps },
    Param::pointer("g"),
    Param::pointer("gk"),
    Param::pointer("h0"),
    Param::pointer("v_new"),
    Param::pointer("ht"),
    Param::pointer("work"),
    Param::u32("heads"),
    Param::u32("value_dim"),
    Param::u32("state_layout"),
    Param::u32("pass"),
    Param::u32("g_token_stride"),
    Param::u32("g_head_stride"),
    Param::u32("gk_token_stride"),
    Param::u32("gk_head_stride"),
    Param::u32("v_new_token_stride"),
    Param::u32("v_new_head_stride"),
];

/// How `h`, `h0` and `ht` store each `[K, V]` state, as the kernels' `state_layout` parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum StateLayoutCode {
    /// `[.., K, V]`.
    KeyFirst = 0,
    /// `[.., V, K]`.
    ValueFirst = 1,
}

/// The element type of a state pool's states, as the decode step's and the pool copy's
/// `pool_dtype` parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum StateDtypeCode {
    /// f32.
    F32 = 0,
    /// bf16, rounded to nearest even on every write.
    Bf16 = 1,
}

/// Which pass of the recurrence a launch of the Hopper or the portable kernel runs, as the
/// kernel's `pass` parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum PassCode {
    /// The recurrence: each item from its initial state, writing `h`, `v_new` and `ht`.
    Recurrence = 0,
    /// The pre-scan of split sequences (docs/CONTRACT.md, "Splitting one sequence"): each item a
    /// block of the augmented state `[M | B]` (`K + V` columns) of one segment, from `[I | 0]`
    /// (no `h0`), with the values `[0 | u]`; writes only its final state (key-first) to `ht`.
    Prescan = 1,
}

/// The split merge's parameters, in order: the pre-scan's maps (`[rows][K][K + V]` f32), `h0`
/// (null for zeros), the entry states it writes (`[rows][K][V]` f32 in `state_layout`), its
/// table (`layout::MERGE_WORDS` words per sequence), `heads` (value heads), `key_dim`,
/// `value_dim`, `state_layout` (a [`StateLayoutCode`]).
pub const MERGE_PARAMS: [Param; 8] = [
    Param::pointer("maps"),
    Param::pointer("h0"),
    Param::pointer("entries"),
    Param::pointer("table"),
    Param::u32("heads"),
    Param::u32("key_dim"),
    Param::u32("value_dim"),
    Param::u32("state_layout"),
];

/// The layer's prepare kernel's parameters, in order: `k`, `v`, the gate, `beta`, `A_log` and
/// `dt_bias` (null unless the gate is raw), the chunk table (`layout::layer::CHUNK_WORDS` words
/// per chunk), the outputs `k_rec`, `w`, `u` and the recurrence's gate, then `heads`,
/// `value_heads`, `key_dim`, `value_dim`, `gate_width` (`K` or 1), `options`
/// (`layout::layer::OPT_*` bits), `gate_mode` (`layout::layer::GATE_*`) and the lower bound's
/// f32 bits.
pub const LAYER_PREPARE_PARAMS: [Param; 19] = [
    Param::pointer("k"),
    Param::pointer("v"),
    Param::pointer("g"),
    Param::pointer("beta"),
    Param::pointer("a_log"),
    Param::pointer("dt_bias"),
    Param::pointer("chunks"),
    Param::pointer("k_rec"),
    Param::pointer("w"),
    Param::pointer("u"),
    Param::pointer("gate_out"),
    Param::u32("heads"),
    Param::u32("value_heads"),
    Param::u32("key_dim"),
    Param::u32("value_dim"),
    Param::u32("gate_width"),
    Param::u32("options"),
    Param::u32("gate_mode"),
    Param::u32("lower_bound_bits"),
];

/// The layer's output kernel's parameters, in order: `q`, `k`, the prepare kernel's gate, the
/// recurrence's `h` and `v_new`, the output `o`, the chunk table, then `heads`, `value_heads`,
/// `key_dim`, `value_dim`, `gate_width`, `options`, the scale's f32 bits and `h`'s layout (a
/// [`StateLayoutCode`]).
pub const LAYER_OUTPUT_PARAMS: [Param; 15] = [
    Param::pointer("q"),
    Param::pointer("k"),
    Param::pointer("gate"),
    Param::pointer("h"),
    Param::pointer("v_new"),
    Param::pointer("o"),
    Param::pointer("chunks"),
    Param::u32("heads"),
    Param::u32("value_heads"),
    Param::u32("key_dim"),
    Param::u32("value_dim"),
    Param::u32("gate_width"),
    Param::u32("options"),
    Param::u32("scale_bits"),
    Param::u32("state_layout"),
];

/// The parameters of the output kernel on prepared attention ([`LAYER_OUTPUT_PREPARED`]):
/// [`LAYER_OUTPUT_PARAMS`] with the fused prepare kernel's `qg` and `attention` in place of `q`,
/// `k` and the gate.
pub const LAYER_OUTPUT_PREPARED_PARAMS: [Param; 14] = {
    /// `q`, `k` and the gate, replaced by two.
    const REPLACED: usize = 3;
    let mut out = [Param::u32(""); 14];
    out[0] = Param::pointer("qg");
    out[1] = Param::pointer("attention");
    let mut i = REPLACED;
    while i < LAYER_OUTPUT_PARAMS.len() {
        out[i - 1] = LAYER_OUTPUT_PARAMS[i];
        i += 1;
    }
    out
};

/// The decode step's parameters, in order: `q`, `k`, `v`, the gate, `beta`, `A_log`, `dt_bias`
/// (null unless the gate is raw), the slots (`[N]` i64, negative: padding), the fresh flags
/// (`[N]` u32), each token's parent and state slot (`[N * draft]` i64 each, null for a chain and
/// for the last state back to the sequence's slot), the pool, the output `o`, then the pool's
/// element type (a [`StateDtypeCode`]) and layout (a [`StateLayoutCode`]), `draft`
/// (tokens per sequence), `heads`, `value_heads`, `key_dim`, `value_dim`, `gate_width`,
/// `options`, `gate_mode`, the lower bound's and the scale's f32 bits.
pub const DECODE_PARAMS: [Param; 25] = [
    Param::pointer("q"),
    Param::pointer("k"),
    Param::pointer("v"),
    Param::pointer("g"),
    Param::pointer("beta"),
    Param::pointer("a_log"),
    Param::pointer("dt_bias"),
    Param::pointer("slots"),
    Param::pointer("fresh"),
    Param::pointer("parents"),
    Param::pointer("token_slots"),
    Param::pointer("pool"),
    Param::pointer("o"),
    Param::u32("pool_dtype"),
    Param::u32("pool_layout"),
    Param::u32("draft"),
    Param::u32("heads"),
    Param::u32("value_heads"),
    Param::u32("key_dim"),
    Param::u32("value_dim"),
    Param::u32("gate_width"),
    Param::u32("options"),
    Param::u32("gate_mode"),
    Param::u32("lower_bound_bits"),
    Param::u32("scale_bits"),
];

/// The checkpoint kernel's parameters, in order: the layer's token inputs and gate parameters
/// as the decode step takes them, `h` (the layer's chunk entry states, bf16), each item's source
/// state in `h`, first token row, token count and destination slot, the pool; then the pool's
/// element type and layout, `h`'s layout (each a [`StateLayoutCode`]), and the layer's sizes and
/// options (no `scale`: no output rows).
pub const ADVANCE_PARAMS: [Param; 24] = [
    Param::pointer("q"),
    Param::pointer("k"),
    Param::pointer("v"),
    Param::pointer("g"),
    Param::pointer("beta"),
    Param::pointer("a_log"),
    Param::pointer("dt_bias"),
    Param::pointer("h"),
    Param::pointer("sources"),
    Param::pointer("first_rows"),
    Param::pointer("counts"),
    Param::pointer("slots"),
    Param::pointer("pool"),
    Param::u32("pool_dtype"),
    Param::u32("pool_layout"),
    Param::u32("h_layout"),
    Param::u32("heads"),
    Param::u32("value_heads"),
    Param::u32("key_dim"),
    Param::u32("value_dim"),
    Param::u32("gate_width"),
    Param::u32("options"),
    Param::u32("gate_mode"),
    Param::u32("lower_bound_bits"),
];

/// The pool copy's parameters, in order: the pool, the packed states, the slots (`[N]` i64), the
/// fresh flags (`[N]` u32), elements per state, the direction (a [`PoolCopyCode`]) and the pool's
/// element type (a [`StateDtypeCode`]; the packed states are f32).
pub const POOL_COPY_PARAMS: [Param; 7] = [
    Param::pointer("pool"),
    Param::pointer("packed"),
    Param::pointer("slots"),
    Param::pointer("fresh"),
    Param::u32("state_len"),
    Param::u32("direction"),
    Param::u32("pool_dtype"),
];

/// Which way the pool copy runs, as its `direction` parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum PoolCopyCode {
    /// Pool slots to the packed buffer (zeros for fresh and padding sequences).
    Gather = 0,
    /// The packed buffer back to the live sequences' slots.
    Scatter = 1,
}

/// The baseline kernel's parameters, in order (`heads` counts value heads, `key_heads` the heads
/// of `k`).
pub const BASELINE_PARAMS: [Param; 11] = [
    Param::pointer("k"),
    Param::pointer("w"),
    Param::pointer("u"),
    Param::pointer("gk"),
    Param::pointer("h0"),
    Param::pointer("h"),
    Param::pointer("v_new"),
    Param::pointer("ht"),
    Param::pointer("seqs"),
    Param::u32("heads"),
    Param::u32("key_heads"),
];

/// The portable tensor-core kernel's parameters, in order: the tensors, the work records of the
/// pass (`layout::ITEM_WORDS` words each, as the Hopper kernel's), value heads, the width of the
/// pass's states (`V`, or `K + V` in the pre-scan), their layout (a [`StateLayoutCode`]), the
/// pass (a [`PassCode`]) and the token and head strides (elements) of `k`, `w`, `u`, `g`, `gk`
/// and `v_new`. `g` and `gk` may be null (that gate absent); `h0` and `ht` too.
pub const PORTABLE_PARAMS: [Param; 26] = [
    Param::pointer("k"),
    Param::pointer("w"),
    Param::pointer("u"),
    Param::pointer("g"),
    Param::pointer("gk"),
    Param::pointer("h0"),
    Param::pointer("h"),
    Param::pointer("v_new"),
    Param::pointer("ht"),
    Param::pointer("work"),
    Param::u32("heads"),
    Param::u32("value_dim"),
    Param::u32("state_layout"),
    Param::u32("pass"),
    Param::u32("k_token_stride"),
    Param::u32("k_head_stride"),
    Param::u32("w_token_stride"),
    Param::u32("w_head_stride"),
    Param::u32("u_token_stride"),
    Param::u32("u_head_stride"),
    Param::u32("g_token_stride"),
    Param::u32("g_head_stride"),
    Param::u32("gk_token_stride"),
    Param::u32("gk_head_stride"),
    Param::u32("v_new_token_stride"),
    Param::u32("v_new_head_stride"),
];

/// The fused layer pass's parameters ([`HOPPER_FUSED`]): [`HOPPER_PARAMS`] with the layer's
/// output `o` (`[T, HV, V]` bf16, the tail chunk's valid rows; the `VNew` map its full boxes) in
/// place of `v_new`, then `scale_bits`, the output scale as f32 bits.
pub const HOPPER_FUSED_PARAMS: [Param; 18] = with_output(&HOPPER_PARAMS, &[Param::u32("scale_bits")]);

/// A fused layer pass's parameters: the recurrence's `params` with `o` in place of `v_new`
/// (`v_new`, `v_new_token_stride`, `v_new_head_stride` renamed), then `added`.
const fn with_output<const N: usize>(params: &[Param], added: &[Param]) -> [Param; N] {
    let renamed = [("v_new", "o"), ("v_new_token_stride", "o_token_stride"), ("v_new_head_stride", "o_head_stride")];
    assert!(params.len() + added.len() == N, "every parameter of the pass");
    let mut out = [Param::u32(""); N];
    let mut i = 0;
    while i < params.len() {
        let mut p = params[i];
        let mut r = 0;
        while r < renamed.len() {
            if str_eq(p.name, renamed[r].0) {
                p.name = renamed[r].1;
            }
            r += 1;
        }
        out[i] = p;
        i += 1;
    }
    let mut j = 0;
    while j < added.len() {
        out[params.len() + j] = added[j];
        j += 1;
    }
    out
}

/// Whether `a` and `b` are the same string (`==` on `str` is not `const`).
const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// The Hopper target: wgmma, TMA and mbarrier transaction counts are `sm_90a` features.
pub const SM90A: &str = "sm_90a";
/// The portable target, JIT-compiled by the driver for every newer GPU.
pub const SM80: &str = "sm_80";
/// Every PTX target the crate is built for, one module each.
pub const TARGETS: [&str; 2] = [SM90A, SM80];

/// What the PTX builder, the launcher and the ABI test need to know of one kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelAbi {
    /// The `.entry` name (the kernel function's unmangled name).
    pub entry: &'static str,
    /// The parameters, in order.
    pub params: &'static [Param],
    /// Threads per CTA.
    pub threads: usize,
    /// Dynamic shared memory per CTA, in bytes.
    pub smem_bytes: usize,
    /// The PTX targets (`.target`) whose module holds this kernel.
    pub targets: &'static [&'static str],
    /// `.maxnreg` the builder writes into the entry (with `.maxntid` = `threads`), when the
    /// kernel has launch bounds.
    pub max_registers: Option<u32>,
}

/// Register budget of the Hopper kernel: room for the 64 + 32 accumulator registers, both
/// products' A fragments and the item loop without spills (the PTX test checks). One CTA runs
/// per SM (the ring's shared memory allows one), so registers do not limit occupancy: an SM
/// sub-partition holds 16384 registers, and the 5-warp CTA puts at most 2 warps on one,
/// 2 x 32 x 240 = 15360.
pub const HOPPER_MAX_REGISTERS: u32 = 240;

/// One entry of the warp-specialized kernel (sm_90a): every entry takes [`HOPPER_PARAMS`] and
/// launches alike; the key size and block width set its shared memory.
const fn hopper_entry(entry: &'static str, key_dim: usize, bv: usize) -> KernelAbi {
    KernelAbi {
        entry,
        params: &HOPPER_PARAMS,
        threads: hopper::THREADS,
        smem_bytes: hopper::smem_bytes(key_dim, bv),
        max_registers: Some(HOPPER_MAX_REGISTERS),
        targets: &[SM90A],
    }
}

/// The warp-specialized TMA + wgmma kernel (sm_90a) at `K = 128`, in wide blocks.
pub const HOPPER: KernelAbi = hopper_entry("kda_fwd_h_hopper", crate::layout::K_DIM, hopper::BV);
/// The warp-specialized kernel at `K = 64`, in wide blocks.
pub const HOPPER_K64: KernelAbi = hopper_entry("kda_fwd_h_hopper_k64", 64, hopper::BV);
/// The warp-specialized kernel at `K = 128`, in narrow blocks (`layout::hopper::Narrow`).
pub const HOPPER_NARROW: KernelAbi = hopper_entry("kda_fwd_h_hopper_narrow", crate::layout::K_DIM, hopper::NARROW_BV);
/// The warp-specialized kernel at `K = 64`, in narrow blocks.
pub const HOPPER_K64_NARROW: KernelAbi = hopper_entry("kda_fwd_h_hopper_k64_narrow", 64, hopper::NARROW_BV);

/// The warp-specialized kernel at `K = 256`, in narrow blocks (its only width).
pub const HOPPER_K256_NARROW: KernelAbi = hopper_entry("kda_fwd_h_hopper_k256_narrow", 256, hopper::NARROW_BV);

/// Register budget of the fused layer pass: the recurrence's plus the output's 32 accumulator
/// registers, while product 1's A fragments stay live until the output's first product is done.
/// At 240 the `K = 128` entry spilled 40 bytes; 255 (256 per thread as allocated) still fits
/// the 5-warp CTA: at most 2 of its warps share an SM sub-partition, 2 x 32 x 256 = 16384
/// registers, the sub-partition's file.
pub const HOPPER_FUSED_MAX_REGISTERS: u32 = 255;

/// One entry of the fused layer pass (sm_90a, [`HOPPER_FUSED_PARAMS`]): the recurrence in
/// blocks of `bv` columns with the layer's output `o` computed in its chunk loop.
const fn hopper_fused_entry(entry: &'static str, key_dim: usize, bv: usize) -> KernelAbi {
    KernelAbi {
        entry,
        params: &HOPPER_FUSED_PARAMS,
        threads: hopper::THREADS,
        smem_bytes: hopper::fused_smem_bytes(key_dim, bv),
        max_registers: Some(HOPPER_FUSED_MAX_REGISTERS),
        targets: &[SM90A],
    }
}

/// The fused layer pass at `K = 128` (`layout::hopper::Fused` blocks).
pub const HOPPER_FUSED: KernelAbi = hopper_fused_entry("kda_layer_fused_hopper", crate::layout::K_DIM, hopper::BV);
/// The fused layer pass at `K = 64`.
pub const HOPPER_K64_FUSED: KernelAbi = hopper_fused_entry("kda_layer_fused_hopper_k64", 64, hopper::BV);
/// The fused layer pass at `K = 128` in narrow blocks (`layout::hopper::NarrowFused`).
pub const HOPPER_NARROW_FUSED: KernelAbi =
    hopper_fused_entry("kda_layer_fused_hopper_narrow", crate::layout::K_DIM, hopper::NARROW_BV);
/// The fused layer pass at `K = 64` in narrow blocks.
pub const HOPPER_K64_NARROW_FUSED: KernelAbi =
    hopper_fused_entry("kda_layer_fused_hopper_k64_narrow", 64, hopper::NARROW_BV);

/// Every entry of the fused layer pass.
pub const HOPPER_FUSED_ENTRIES: [&KernelAbi; 4] =
    [&HOPPER_FUSED, &HOPPER_K64_FUSED, &HOPPER_NARROW_FUSED, &HOPPER_K64_NARROW_FUSED];

/// The fused layer pass's entry for key size `key_dim` in blocks of `bv` value columns
/// ([`hopper::BV`] or [`hopper::NARROW_BV`]), if it has one.
pub const fn hopper_fused_for(key_dim: usize, bv: usize) -> Option<&'static KernelAbi> {
    match (key_dim, bv) {
        (64, hopper::BV) => Some(&HOPPER_K64_FUSED),
        (crate::layout::K_DIM, hopper::BV) => Some(&HOPPER_FUSED),
        (64, hopper::NARROW_BV) => Some(&HOPPER_K64_NARROW_FUSED),
        (crate::layout::K_DIM, hopper::NARROW_BV) => Some(&HOPPER_NARROW_FUSED),
        _ => None,
    }
}

/// Every entry of the warp-specialized kernel.
pub const HOPPER_ENTRIES: [&KernelAbi; 5] =
    [&HOPPER, &HOPPER_K64, &HOPPER_NARROW, &HOPPER_K64_NARROW, &HOPPER_K256_NARROW];

/// The Hopper kernel's entry for key size `key_dim` in blocks of `bv` value columns
/// ([`hopper::BV`] or [`hopper::NARROW_BV`]), if it has one (`layout::hopper::KEY_DIMS`).
pub const fn hopper_for(key_dim: usize, bv: usize) -> Option<&'static KernelAbi> {
    match (key_dim, bv) {
        (64, hopper::BV) => Some(&HOPPER_K64),
        (crate::layout::K_DIM, hopper::BV) => Some(&HOPPER),
        (64, hopper::NARROW_BV) => Some(&HOPPER_K64_NARROW),
        (crate::layout::K_DIM, hopper::NARROW_BV) => Some(&HOPPER_NARROW),
        (256, hopper::NARROW_BV) => Some(&HOPPER_K256_NARROW),
        _ => None,
    }
}

/// The portable scalar kernel (sm_80+).
pub const BASELINE: KernelAbi = KernelAbi {
    entry: "kda_fwd_h_baseline",
    params: &BASELINE_PARAMS,
    threads: baseline::THREADS,
    smem_bytes: baseline::SMEM_BYTES,
    max_registers: None,
    targets: &[SM90A, SM80],
};

/// One entry of the portable tensor-core kernel (sm_80+): every entry of the recurrence takes
/// [`PORTABLE_PARAMS`], every entry of the fused layer pass (`fused`) [`PORTABLE_FUSED_PARAMS`],
/// and they launch alike; the key size and the consumer groups set its threads and shared memory.
const fn portable_entry(entry: &'static str, key_dim: usize, groups: usize, fused: bool) -> KernelAbi {
    use crate::layout::portable::{entry_smem_bytes, threads};
    KernelAbi {
        entry,
        params: if fused { &PORTABLE_FUSED_PARAMS } else { &PORTABLE_PARAMS },
        threads: threads(groups),
        smem_bytes: entry_smem_bytes(key_dim, groups, fused),
        // ptxas's own choice, as measured (168 registers at most).
        max_registers: None,
        targets: &[SM90A, SM80],
    }
}

/// The portable tensor-core kernel at `K = 64`: both products of a chunk on `mma.sync`, one CTA
/// per (sequence, value head, block of `BV` value columns), one consumer group.
pub const PORTABLE_K64: KernelAbi = portable_entry("kda_fwd_h_portable_k64", 64, 1, false);
/// The portable tensor-core kernel at `K = 128`, one consumer group.
pub const PORTABLE: KernelAbi = portable_entry("kda_fwd_h_portable", 128, 1, false);
/// The portable tensor-core kernel at `K = 256`, one consumer group.
pub const PORTABLE_K256: KernelAbi = portable_entry("kda_fwd_h_portable_k256", 256, 1, false);
/// The portable tensor-core kernel at `K = 64`, two consumer groups (blocks of `2 BV` columns).
pub const PORTABLE_K64_WIDE: KernelAbi = portable_entry("kda_fwd_h_portable_k64_wide", 64, 2, false);
/// The portable tensor-core kernel at `K = 128`, two consumer groups.
pub const PORTABLE_WIDE: KernelAbi = portable_entry("kda_fwd_h_portable_wide", 128, 2, false);

/// Every entry of the portable tensor-core kernel, in `layout::portable::VARIANTS`' order.
pub const PORTABLE_ENTRIES: [&KernelAbi; 5] =
    [&PORTABLE_K64, &PORTABLE, &PORTABLE_K256, &PORTABLE_K64_WIDE, &PORTABLE_WIDE];

/// The portable kernel's entry for key size `key_dim` and `groups` consumer groups, if it has one.
pub const fn portable_for(key_dim: usize, groups: usize) -> Option<&'static KernelAbi> {
    entry_for(&PORTABLE_ENTRIES, &crate::layout::portable::VARIANTS, key_dim, groups)
}

/// The entry of `entries` whose variant (the same index of `variants`) is `(key_dim, groups)`.
const fn entry_for(
    entries: &[&'static KernelAbi],
    variants: &[(usize, usize)],
    key_dim: usize,
    groups: usize,
) -> Option<&'static KernelAbi> {
    let mut i = 0;
    while i < entries.len() {
        if variants[i].0 == key_dim && variants[i].1 == groups {
            return Some(entries[i]);
        }
        i += 1;
    }
    None
}

/// The fused layer pass's parameters on the portable kernel ([`PORTABLE_FUSED`]):
/// [`PORTABLE_PARAMS`] with the layer's output `o` (`[T, HV, V]` bf16) in place of `v_new` (and
/// `h` unused), then `qg` (`q Γ`, `[T, HV, K]` bf16), `attention` (`P`, `[T, HV, CHUNK]` bf16), both
/// packed, and `scale_bits`, the output scale as f32 bits.
pub const PORTABLE_FUSED_PARAMS: [Param; 29] =
    with_output(&PORTABLE_PARAMS, &[Param::pointer("qg"), Param::pointer("attention"), Param::u32("scale_bits")]);

/// The fused layer pass on the portable kernel at `K = 64`, one consumer group.
pub const PORTABLE_FUSED_K64: KernelAbi = portable_entry("kda_layer_fused_portable_k64", 64, 1, true);
/// The fused layer pass on the portable kernel at `K = 128`, one consumer group.
pub const PORTABLE_FUSED: KernelAbi = portable_entry("kda_layer_fused_portable", 128, 1, true);
/// The fused layer pass on the portable kernel at `K = 64`, two consumer groups.
pub const PORTABLE_FUSED_K64_WIDE: KernelAbi = portable_entry("kda_layer_fused_portable_k64_wide", 64, 2, true);
/// The fused layer pass on the portable kernel at `K = 128`, two consumer groups.
pub const PORTABLE_FUSED_WIDE: KernelAbi = portable_entry("kda_layer_fused_portable_wide", 128, 2, true);

/// Every entry of the fused layer pass on the portable kernel, in
/// `layout::portable::FUSED_VARIANTS`' order.
pub const PORTABLE_FUSED_ENTRIES: [&KernelAbi; 4] =
    [&PORTABLE_FUSED_K64, &PORTABLE_FUSED, &PORTABLE_FUSED_K64_WIDE, &PORTABLE_FUSED_WIDE];

/// The fused layer pass's portable entry for key size `key_dim` and `groups` groups, if it has one.
pub const fn portable_fused_for(key_dim: usize, groups: usize) -> Option<&'static KernelAbi> {
    entry_for(&PORTABLE_FUSED_ENTRIES, &crate::layout::portable::FUSED_VARIANTS, key_dim, groups)
}

/// The merge of split sequences: chains each sequence's segment maps into their entry states
/// (plain f32 arithmetic, so every target has it).
pub const MERGE: KernelAbi = KernelAbi {
    entry: "kda_split_merge",
    params: &MERGE_PARAMS,
    threads: crate::layout::merge::THREADS,
    smem_bytes: crate::layout::merge::SMEM_BYTES,
    max_registers: None,
    targets: &[SM90A, SM80],
};

/// Register budget of the layer's token-parallel kernels: two CTAs of 256 threads per SM (their
/// shared memory allows two), 2 x 256 x 128 = 65536 registers.
pub const LAYER_MAX_REGISTERS: u32 = 128;

/// The fused layer's prepare kernel's parameters ([`LAYER_PREPARE_FUSED`]):
/// [`LAYER_PREPARE_PARAMS`] with `q` in and `qg` (`q Γ`, `[T, HV, K]` bf16) and `attention`
/// (`[T, HV, CHUNK]` bf16) out after the tensors.
pub const LAYER_PREPARE_FUSED_PARAMS: [Param; 22] = {
    const TENSORS: usize = 11;
    let added = [Param::pointer("q"), Param::pointer("qg"), Param::pointer("attention")];
    let mut out = [Param::u32(""); 22];
    let mut i = 0;
    while i < LAYER_PREPARE_PARAMS.len() {
        out[if i < TENSORS { i } else { i + added.len() }] = LAYER_PREPARE_PARAMS[i];
        i += 1;
    }
    let mut j = 0;
    while j < added.len() {
        out[TENSORS + j] = added[j];
        j += 1;
    }
    out
};
/// The layer's prepare kernel: gate, norms, the WY solve, the recurrence's keys and gate (plain
/// f32 arithmetic, every target).
pub const LAYER_PREPARE: KernelAbi = KernelAbi {
    entry: "kda_layer_prepare",
    params: &LAYER_PREPARE_PARAMS,
    threads: crate::layout::layer::THREADS,
    smem_bytes: crate::layout::layer::PREPARE_SMEM_BYTES,
    max_registers: Some(LAYER_MAX_REGISTERS),
    targets: &[SM90A, SM80],
};

/// The layer's output kernel: `o` from the recurrence's `h` and `v_new` (plain f32 arithmetic,
/// every target).
pub const LAYER_OUTPUT: KernelAbi = KernelAbi {
    entry: "kda_layer_output",
    params: &LAYER_OUTPUT_PARAMS,
    threads: crate::layout::layer::THREADS,
    smem_bytes: crate::layout::layer::OUTPUT_SMEM_BYTES,
    max_registers: Some(LAYER_MAX_REGISTERS),
    targets: &[SM90A, SM80],
};
/// The output kernel on prepared attention: the separate path's `o` from the fused prepare
/// kernel's `q Γ` and causal attention (every target; with [`LAYER_PREPARE_FUSED`], so where a
/// CTA gets 110 KB).
pub const LAYER_OUTPUT_PREPARED: KernelAbi = KernelAbi {
    entry: "kda_layer_output_prepared",
    params: &LAYER_OUTPUT_PREPARED_PARAMS,
    threads: crate::layout::layer::THREADS,
    smem_bytes: crate::layout::layer::OUTPUT_PREPARED_SMEM_BYTES,
    max_registers: Some(LAYER_MAX_REGISTERS),
    targets: &[SM90A, SM80],
};
/// The fused layer's prepare kernel (every target; its shared memory limits it to GPUs that give
/// a CTA 110 KB: the A100 and 9.x class): grid and threads as [`LAYER_PREPARE`].
pub const LAYER_PREPARE_FUSED: KernelAbi = KernelAbi {
    entry: "kda_layer_prepare_fused",
    params: &LAYER_PREPARE_FUSED_PARAMS,
    threads: crate::layout::layer::THREADS,
    smem_bytes: crate::layout::layer::PREPARE_FUSED_SMEM_BYTES,
    max_registers: Some(LAYER_MAX_REGISTERS),
    targets: &[SM90A, SM80],
};

/// Register budget of the scalar-gate prepare kernel ([`LAYER_PREPARE_FUSED_SCALAR`]): three CTAs
/// of 256 threads per SM (its shared memory allows three on 9.x), 65536 / 768 = 85 registers,
/// allocated in steps of 8.
pub const LAYER_SCALAR_MAX_REGISTERS: u32 = 80;

/// The fused layer's prepare kernel for a per-head gate or none (Gated DeltaNet; every target):
/// [`LAYER_PREPARE_FUSED`]'s parameters and outputs without the gate tile, three CTAs per SM on
/// 9.x.
pub const LAYER_PREPARE_FUSED_SCALAR: KernelAbi = KernelAbi {
    entry: "kda_layer_prepare_fused_scalar",
    params: &LAYER_PREPARE_FUSED_PARAMS,
    threads: crate::layout::layer::THREADS,
    smem_bytes: crate::layout::layer::PREPARE_SCALAR_FUSED_SMEM_BYTES,
    max_registers: Some(LAYER_SCALAR_MAX_REGISTERS),
    targets: &[SM90A, SM80],
};

/// Register budget of the decode step: the SM's registers shared by `layout::decode::CTAS_PER_SM`
/// CTAs of `layout::decode::THREADS`: 65536 / (4 x 128) = 128 (four warps in each quarter of the
/// register file), so that four CTAs' states (128 KB, 64 values per thread) are in flight per SM.
pub const DECODE_MAX_REGISTERS: u32 =
    (REGISTERS_PER_SM / (crate::layout::decode::THREADS * crate::layout::decode::CTAS_PER_SM)) as u32;

/// 32-bit registers of an SM on every sm_80+ GPU.
pub const REGISTERS_PER_SM: usize = 65536;

/// The decode step: a few tokens per sequence, states in a pool by slot (plain f32, every target).
pub const DECODE: KernelAbi = KernelAbi {
    entry: "kda_decode_step",
    params: &DECODE_PARAMS,
    threads: crate::layout::decode::THREADS,
    smem_bytes: crate::layout::decode::SMEM_BYTES,
    max_registers: Some(DECODE_MAX_REGISTERS),
    targets: &[SM90A, SM80],
};

/// Checkpoints for prefix caching: states advanced from a layer's chunk entry states through a
/// few tokens, into a pool (the decode step's code and budget, every target).
pub const ADVANCE: KernelAbi = KernelAbi {
    entry: "kda_advance_states",
    params: &ADVANCE_PARAMS,
    threads: crate::layout::decode::THREADS,
    smem_bytes: crate::layout::decode::SMEM_BYTES,
    max_registers: Some(DECODE_MAX_REGISTERS),
    targets: &[SM90A, SM80],
};

/// The copy of whole states between a pool and a packed buffer (plain, every target).
pub const POOL_COPY: KernelAbi = KernelAbi {
    entry: "kda_pool_copy",
    params: &POOL_COPY_PARAMS,
    threads: crate::layout::pool_copy::THREADS,
    smem_bytes: 0,
    max_registers: None,
    targets: &[SM90A, SM80],
};

/// Every kernel of the crate.
pub const KERNELS: [KernelAbi; 28] = [
    BASELINE,
    PORTABLE_K64,
    PORTABLE,
    PORTABLE_K256,
    PORTABLE_K64_WIDE,
    PORTABLE_WIDE,
    PORTABLE_FUSED_K64,
    PORTABLE_FUSED,
    PORTABLE_FUSED_K64_WIDE,
    PORTABLE_FUSED_WIDE,
    HOPPER,
    HOPPER_K64,
    HOPPER_NARROW,
    HOPPER_K64_NARROW,
    HOPPER_K256_NARROW,
    HOPPER_FUSED,
    HOPPER_K64_FUSED,
    HOPPER_NARROW_FUSED,
    HOPPER_K64_NARROW_FUSED,
    MERGE,
    LAYER_PREPARE,
    LAYER_OUTPUT,
    LAYER_PREPARE_FUSED,
    LAYER_PREPARE_FUSED_SCALAR,
    LAYER_OUTPUT_PREPARED,
    DECODE,
    ADVANCE,
    POOL_COPY,
];

const _: () = {
    assert!(TENSOR_MAP_BYTES == 128, "CUtensorMap is 128 bytes");
    assert!(TENSOR_MAP_BYTES.is_multiple_of(TENSOR_MAP_ALIGN), "every map of the aggregate stays 64-byte aligned");
    assert!(core::mem::size_of::<TensorMaps>() == TENSOR_MAPS * TENSOR_MAP_BYTES);
    let mut i = 0;
    while i < hopper::KEY_DIMS.len() {
        assert!(hopper_for(hopper::KEY_DIMS[i], hopper::NARROW_BV).is_some(), "every key size has a narrow entry");
        i += 1;
    }
};
