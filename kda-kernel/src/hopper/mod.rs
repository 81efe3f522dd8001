//! The warp-specialized Hopper (sm_90a) kernel.
//!
//! A persistent grid: one CTA per SM, `THREADS` = 160 threads, each CTA walking its list of work
//! items (one item = one block of value columns of one head of one sequence: 64 columns wide,
//! or 32 narrow, `layout::hopper::Block`) from the launcher's longest-first schedule
//! ([`crate::schedule`]). Both roles walk the same list; the
//! ring position runs on across items, so the next item's first loads overlap the current item's
//! last chunks.
//!
//! | file | role |
//! |---|---|
//! | `mod.rs` | the entry: barriers, then a match on the thread's role |
//! | [`producer`] | warp 4: the `h0` slot and the ring's chunk tiles (TMA), `STAGES` chunks ahead |
//! | [`consumer`] | warps 0-3 (one warpgroup) of a wide block: the state in registers, the two wgmma products per chunk, the `h`/`v_new`/`ht` stores (in the fused layer pass, two more products and the `o` stores) |
//! | [`narrow`] | the consumer of a narrow block: the state key-major, both products' operands in shared memory (in the fused layer pass, two more products and the `o` stores) |
//! | [`tail`] | a sequence's partial last chunk: one-row loads, masking, plain `v_new` stores |
//! | [`smem`] | shared-memory addresses from `layout::hopper::SharedStorage` |
//! | [`keys`] | what the key size changes: state registers, the products' shapes, the layout |
//! | [`fragments`] | accumulator fragments, the 128-byte swizzle, `ldmatrix`/`stmatrix` lanes |
//! | [`maps`] | the tensor maps each role hands to TMA |
//!
//! The ring itself is [`crate::pipeline`]; the work lists are [`crate::schedule`]. Nothing
//! outside a sequence's rows is read into the math or written (`docs/CONTRACT.md`, "Ragged
//! batches, tails and empty sequences").

mod consumer;
mod fragments;
mod keys;
mod maps;
mod narrow;
mod producer;
mod smem;
mod tail;

use crate::abi::{MapSlot, PassCode, StateLayoutCode, TENSOR_MAP_BYTES, TensorMaps};
use crate::arch::sm80::{sync_threads, thread_idx_x};
use crate::arch::sm90::{fence_mbarrier_init, param_address, prefetch_tensormap};
use crate::layout::hopper::{Block, CONSUMER_THREADS, Fused, Narrow, NarrowFused, PRODUCER_THREADS, Wide};
use crate::schedule::{RowStrides, Work};
use consumer::Variant;
use keys::{K64, K128, K256, KeySize, WideKey};
use maps::{LoadMaps, OutputLoadMaps, Outputs, StoreMaps};
use producer::Gates;
use smem::Smem;

/// The consumer role's number, for what each role must compute itself (`Work::items`).
const CONSUMER_ROLE: u32 = 0;
/// The producer role's number.
const PRODUCER_ROLE: u32 = 1;

/// A block width's consumer warpgroup at key size `C`.
trait BlockConsumer<C: KeySize>: Block + Sized {
    /// The consumer's loop over the CTA's items.
    ///
    /// # Safety
    /// As for `consumer::run`.
    unsafe fn consume(work: &Work, smem: Smem<C, Self>, tid: usize, out: Outputs, has_h0: bool, kind: Variant);
}

impl<C: WideKey> BlockConsumer<C> for Wide {
    #[inline(always)]
    unsafe fn consume(work: &Work, smem: Smem<C, Self>, tid: usize, out: Outputs, has_h0: bool, kind: Variant) {
        // SAFETY: the caller's contract.
        unsafe { consumer::run(work, smem, tid, out, has_h0, kind) }
    }
}

impl<C: WideKey> BlockConsumer<C> for Fused {
    #[inline(always)]
    unsafe fn consume(work: &Work, smem: Smem<C, Self>, tid: usize, out: Outputs, has_h0: bool, kind: Variant) {
        // SAFETY: the caller's contract.
        unsafe { consumer::run(work, smem, tid, out, has_h0, kind) }
    }
}

impl<C: KeySize> BlockConsumer<C> for Narrow {
    #[inline(always)]
    unsafe fn consume(work: &Work, smem: Smem<C, Self>, tid: usize, out: Outputs, has_h0: bool, kind: Variant) {
        // SAFETY: the caller's contract.
        unsafe { narrow::run(work, smem, tid, out, has_h0, kind) }
    }
}

impl<C: WideKey> BlockConsumer<C> for NarrowFused {
    #[inline(always)]
    unsafe fn consume(work: &Work, smem: Smem<C, Self>, tid: usize, out: Outputs, has_h0: bool, kind: Variant) {
        // SAFETY: the caller's contract.
        unsafe { narrow::run(work, smem, tid, out, has_h0, kind) }
    }
}

/// The role of a thread of the CTA.
enum Role {
    /// Warps 0-3: the consumer warpgroup (warpgroup-aligned, as wgmma needs).
    Consumer,
    /// Warp 4: the producer, with this thread's lane.
    Producer { lane: usize },
}

impl Role {
    #[inline(always)]
    fn of(tid: usize) -> Self {
        if tid < CONSUMER_THREADS { Role::Consumer } else { Role::Producer { lane: tid - CONSUMER_THREADS } }
    }
}

/// The kernel's parameters past the tensor maps, as both entries take them (`abi::HOPPER_PARAMS`).
#[derive(Clone, Copy)]
struct Params {
    g: *const f32,
    gk: *const f32,
    h0: *const f32,
    v_new: *mut u16,
    ht: *mut f32,
    work: *const u32,
    heads: u32,
    value_dim: u32,
    state_layout: u32,
    pass: u32,
    strides: [u32; 6],
    /// The fused layer pass's output scale (1 elsewhere, unused).
    scale: f32,
}

/// Declares one entry point of the warp-specialized recurrence kernel for key size `$key` and
/// block width `$block`
/// (`abi::HOPPER` and its siblings, parameters `abi::HOPPER_PARAMS`: grid = the schedule's
/// workers, at most one CTA per SM; `abi::HOPPER.threads` threads; the entry's
/// `smem_bytes` of dynamic shared memory). Naming `$scale_bits` declares an entry of the fused
/// layer pass (`abi::HOPPER_FUSED` and its sibling, parameters `abi::HOPPER_FUSED_PARAMS`: the
/// output scale last, the layer's output `o` in `v_new`'s place), for [`Fused`] and
/// [`NarrowFused`] blocks.
macro_rules! hopper_entry {
    ($(#[$doc:meta])* $name:ident, $key:ty, $block:ty $(, $scale_bits:ident)?) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// The tensor maps (indexed by `abi::MapSlot`) describe exactly the launch's `k`, `w`,
        /// `u`, `h` (in `state_layout`), `v_new` and (when `h0` is not null) `h0`, at this entry's
        /// key size; `g`, `gk` (when not null), `v_new` and `ht` (when not null) hold the
        /// contract's shapes for the schedule's items, with the given strides (`h0` and `ht`
        /// packed, in `state_layout`); `work` is a schedule of exactly `gridDim.x` workers that
        /// names each item of the plan once, its every next word naming a record of the table or
        /// being `ITEM_LAST`, its columns inside `value_dim` (its `u` columns inside `u`'s),
        /// its rows inside `h0` and `ht`; `heads >= 1`; outputs do not overlap inputs or each
        /// other. In the pre-scan (`pass` = `PassCode::Prescan`) `ht` holds the maps (key-first,
        /// `value_dim` = `K + V` columns), `h` and `v_new` are not written, and `h0` (when not
        /// null: `[rows][K][V]` in `state_layout`, which names its layout alone) is read only by
        /// the items whose records name a row of it: a first segment's `B` columns `K + c`, from
        /// the state's column `c`. An entry of the fused layer pass runs no pre-scan; its `v_new` is the
        /// layer's output `o` (`[T, HV, V]` bf16 at its strides, the `VNew` map's tensor), `h`
        /// is not written, and the `Q`, `QRow`, `QAtom`, `P`, `PRow` and `PAtom` maps describe the chunks' `q Γ`
        /// (`[T, HV, K]` bf16) and causal attention (`[T, HV, CHUNK]` bf16, zero past each row's
        /// diagonal).
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "ptx-kernel" fn $name(
            _maps: TensorMaps,
            g: *const f32,
            gk: *const f32,
            h0: *const f32,
            v_new: *mut u16,
            ht: *mut f32,
            work: *const u32,
            heads: u32,
            value_dim: u32,
            state_layout: u32,
            pass: u32,
            g_token_stride: u32,
            g_head_stride: u32,
            gk_token_stride: u32,
            gk_head_stride: u32,
            v_new_token_stride: u32,
            v_new_head_stride: u32,
            $($scale_bits: u32,)?
        ) {
            // The maps stay in the parameter space (64-byte aligned by the builder) and are
            // handed to TMA by address.
            let maps = param_address!(concat!(stringify!($name), "_param_0"));
            let strides = [
                g_token_stride,
                g_head_stride,
                gk_token_stride,
                gk_head_stride,
                v_new_token_stride,
                v_new_head_stride,
            ];
            let scale = hopper_entry!(@scale $($scale_bits)?);
            let p = Params { g, gk, h0, v_new, ht, work, heads, value_dim, state_layout, pass, strides, scale };
            // SAFETY: this entry's contract.
            unsafe { run::<$key, $block>(maps, p) }
        }
    };
    (@scale $scale_bits:ident) => { f32::from_bits($scale_bits) };
    (@scale) => { 1.0 };
}

hopper_entry!(
    /// The recurrence at `K = 128` in wide blocks (`abi::HOPPER`).
    kda_fwd_h_hopper,
    K128,
    Wide
);
hopper_entry!(
    /// The recurrence at `K = 64` in wide blocks (`abi::HOPPER_K64`).
    kda_fwd_h_hopper_k64,
    K64,
    Wide
);
hopper_entry!(
    /// The recurrence at `K = 128` in narrow blocks (`abi::HOPPER_NARROW`).
    kda_fwd_h_hopper_narrow,
    K128,
    Narrow
);
hopper_entry!(
    /// The recurrence at `K = 64` in narrow blocks (`abi::HOPPER_K64_NARROW`).
    kda_fwd_h_hopper_k64_narrow,
    K64,
    Narrow
);
hopper_entry!(
    /// The recurrence at `K = 256` in narrow blocks (`abi::HOPPER_K256_NARROW`; no wide entry).
    kda_fwd_h_hopper_k256_narrow,
    K256,
    Narrow
);
hopper_entry!(
    /// The fused layer pass at `K = 128` (`abi::HOPPER_FUSED`).
    kda_layer_fused_hopper,
    K128,
    Fused,
    scale_bits
);
hopper_entry!(
    /// The fused layer pass at `K = 64` (`abi::HOPPER_K64_FUSED`).
    kda_layer_fused_hopper_k64,
    K64,
    Fused,
    scale_bits
);
hopper_entry!(
    /// The fused layer pass at `K = 128` in narrow blocks (`abi::HOPPER_NARROW_FUSED`).
    kda_layer_fused_hopper_narrow,
    K128,
    NarrowFused,
    scale_bits
);
hopper_entry!(
    /// The fused layer pass at `K = 64` in narrow blocks (`abi::HOPPER_K64_NARROW_FUSED`).
    kda_layer_fused_hopper_k64_narrow,
    K64,
    NarrowFused,
    scale_bits
);

/// The kernel for key size `C` and block width `B`, with its tensor maps at parameter-space
/// address `maps_base`.
///
/// # Safety
/// The entries' contract.
#[inline(always)]
unsafe fn run<C: KeySize, B: BlockConsumer<C>>(maps_base: u64, p: Params) {
    let map = |slot: MapSlot| maps_base + (slot as usize * TENSOR_MAP_BYTES) as u64;
    // In the pre-scan only the first segments' items read `h0` (their records name its rows).
    let has_h0 = !p.h0.is_null();
    let load_maps = LoadMaps {
        k: map(MapSlot::K),
        w: map(MapSlot::W),
        u: map(MapSlot::U),
        k_row: map(MapSlot::KRow),
        w_row: map(MapSlot::WRow),
        u_row: map(MapSlot::URow),
        k_atom: map(MapSlot::KAtom),
        w_atom: map(MapSlot::WAtom),
        u_atom: map(MapSlot::UAtom),
        h0: if has_h0 { Some(map(MapSlot::H0)) } else { None },
        value_first: p.state_layout == StateLayoutCode::ValueFirst as u32,
        output: B::OUTPUT.then(|| OutputLoadMaps {
            q: map(MapSlot::Q),
            q_row: map(MapSlot::QRow),
            p: map(MapSlot::P),
            p_row: map(MapSlot::PRow),
            q_atom: map(MapSlot::QAtom),
            p_atom: map(MapSlot::PAtom),
        }),
    };
    let store_maps = StoreMaps { h: map(MapSlot::H), v_new: map(MapSlot::VNew) };
    let [g_token, g_head, gk_token, gk_head, v_new_token, v_new_head] = p.strides;
    let gates = Gates {
        g: p.g,
        gk: p.gk,
        g_rows: RowStrides::new(g_token, g_head),
        gk_rows: RowStrides::new(gk_token, gk_head),
    };
    let outputs = Outputs {
        maps: store_maps,
        v_new: p.v_new,
        v_new_rows: RowStrides::new(v_new_token, v_new_head),
        ht: p.ht,
        value_dim: p.value_dim as usize,
        scale: p.scale,
    };
    let kind = Variant {
        scalar_gate: !p.g.is_null(),
        value_first: load_maps.value_first,
        prescan: p.pass == PassCode::Prescan as u32,
    };
    // SAFETY: the kernel's contract on `work`.
    let work = unsafe { Work::new(p.work, p.heads as usize) };
    let smem = Smem::<C, B>::of_cta();
    let tid = thread_idx_x();
    if tid == CONSUMER_THREADS {
        // The descriptors' fetch overlaps the CTA's setup instead of delaying its first copies.
        // SAFETY: each address is a tensor map of the parameter block (`h0`'s only when given).
        unsafe {
            load_maps.prefetch();
            prefetch_tensormap(store_maps.h);
            prefetch_tensormap(store_maps.v_new);
        }
    }
    if tid == 0 {
        // SAFETY: one thread initialises the barriers; the fence and the CTA barrier below
        // publish them before any use.
        unsafe {
            // Every producer lane writes the ring's stages (decay rows, row scales, zeroed rows)
            // and arrives itself; only lane 0 fills the `h0` slot.
            smem.ring().init(PRODUCER_THREADS as u32, CONSUMER_THREADS as u32);
            smem.h0_slot().init(1, CONSUMER_THREADS as u32);
        }
        fence_mbarrier_init();
    }
    // SAFETY: every thread of the CTA reaches this barrier.
    unsafe { sync_threads() };

    match Role::of(tid) {
        // SAFETY: the kernel's contract makes every row and column the consumer reads and
        // writes exist.
        Role::Consumer => unsafe { B::consume(&work, smem, tid, outputs, has_h0, kind) },
        // SAFETY: as above, for the producer's reads.
        Role::Producer { lane } => unsafe { producer::run(&work, smem, lane, load_maps, gates) },
    }
}
