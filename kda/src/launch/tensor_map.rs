//! Tensor maps (`CUtensorMap`) of the tensors the Hopper kernel reaches through TMA.

use super::args::Pointers;
use crate::layout::{CHUNK, K_DIM, V_DIM, hopper};
use crate::{Dims, KdaError};
use kda_kernel::abi::{MapSlot, TENSOR_MAPS, TensorMap};

/// The Hopper kernel's tensor maps of the launch's tensors, in [`MapSlot`] order.
pub(super) fn hopper_maps(p: &Pointers<'_>, d: &Dims) -> Result<[TensorMap; TENSOR_MAPS], KdaError> {
    // `k` has the key heads; every other tensor the value heads.
    let (tokens, heads, hv) = (d.tokens, d.heads, d.value_heads);
    let mut maps = [TensorMapArg::unused().0; TENSOR_MAPS];
    let mut set = |slot: MapSlot, map: TensorMapArg| maps[slot as usize] = map.0;
    set(MapSlot::K, TensorMapArg::tokens(p.k, tokens, heads, K_DIM)?);
    set(MapSlot::W, TensorMapArg::tokens(p.w, tokens, hv, K_DIM)?);
    set(MapSlot::U, TensorMapArg::tokens(p.u, tokens, hv, V_DIM)?);
    set(MapSlot::KRow, TensorMapArg::rows(p.k, tokens, heads, K_DIM)?);
    set(MapSlot::WRow, TensorMapArg::rows(p.w, tokens, hv, K_DIM)?);
    set(MapSlot::URow, TensorMapArg::rows(p.u, tokens, hv, V_DIM)?);
    set(MapSlot::H, TensorMapArg::states(p.h, d.chunks * hv)?);
    set(MapSlot::VNew, TensorMapArg::tokens(p.v_new, tokens, hv, V_DIM)?);
    if p.h0 != 0 {
        set(MapSlot::H0, TensorMapArg::initial_states(p.h0, d.seqs * hv)?);
    }
    Ok(maps.map(|m| TensorMap(m.opaque)))
}

/// An encoded `CUtensorMap`.
struct TensorMapArg(cudarc::driver::sys::CUtensorMap);

impl TensorMapArg {
    /// The tensor map of a packed `[T, H, width]` bf16 tensor at `address`, as a 3-D tensor
    /// `(width, H, T)` read in `[CHUNK][1][BOX_COLS]` boxes with the 128-byte swizzle (which the
    /// wgmma operands `k` and `w` need, and which keeps the `ldmatrix` reads of `u` free of bank
    /// conflicts).
    fn tokens(address: u64, tokens: usize, heads: usize, width: usize) -> Result<Self, KdaError> {
        Self::encode(address, Element::Bf16, [width, heads, tokens], [hopper::BOX_COLS, 1, CHUNK])
    }

    /// As [`Self::tokens`], in one-token boxes: the tail chunk's valid rows, one TMA each.
    fn rows(address: u64, tokens: usize, heads: usize, width: usize) -> Result<Self, KdaError> {
        Self::encode(address, Element::Bf16, [width, heads, tokens], [hopper::BOX_COLS, 1, 1])
    }

    /// The tensor map of the `h` output (`[NT, H, K, V]` bf16) as a 3-D tensor `(V, K, NT * H)`,
    /// written in `[1][K][BOX_COLS]` boxes (one CTA's `bf16(S)` for one chunk) with the 128-byte
    /// swizzle of the kernel's staging tile.
    fn states(address: u64, chunk_heads: usize) -> Result<Self, KdaError> {
        Self::encode(address, Element::Bf16, [V_DIM, K_DIM, chunk_heads], [hopper::BOX_COLS, K_DIM, 1])
    }

    /// The tensor map of `h0` (`[N, H, K, V]` f32) as a 3-D tensor `(V, K, N * H)`, read in
    /// unswizzled `[1][K][BV]` boxes (one item's initial state).
    fn initial_states(address: u64, seq_heads: usize) -> Result<Self, KdaError> {
        Self::encode(address, Element::F32, [V_DIM, K_DIM, seq_heads], [hopper::BV, K_DIM, 1])
    }

    /// A placeholder for a map the kernel does not use in this launch (all zero bytes).
    fn unused() -> Self {
        // SAFETY: `CUtensorMap` is plain bytes; the kernel never hands this one to TMA.
        Self(unsafe { std::mem::zeroed() })
    }

    /// A packed, contiguous tensor of extents `dims` (innermost first) in boxes of `boxes`
    /// elements: bf16 tiles 128-byte swizzled (as wgmma and the staging tiles lay them out), f32
    /// state blocks unswizzled.
    fn encode(address: u64, element: Element, dims: [usize; 3], boxes: [usize; 3]) -> Result<Self, KdaError> {
        use cudarc::driver::sys::*;
        let (data_type, bytes, swizzle) = match element {
            Element::Bf16 => (
                CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                2,
                CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            ),
            Element::F32 => (
                CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
                4,
                CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
            ),
        };
        let strides: [u64; 2] = [dims[0] as u64 * bytes, (dims[0] * dims[1]) as u64 * bytes];
        let dims = dims.map(|d| d as u64);
        let boxes = boxes.map(|b| b as u32);
        let elem_strides: [u32; 3] = [1, 1, 1];
        let mut map = std::mem::MaybeUninit::<CUtensorMap>::uninit();
        // SAFETY: every pointer addresses a live local array of the rank's length; the driver
        // only writes `map`.
        unsafe {
            cuTensorMapEncodeTiled(
                map.as_mut_ptr(),
                data_type,
                3,
                address as *mut std::ffi::c_void,
                dims.as_ptr(),
                strides.as_ptr(),
                boxes.as_ptr(),
                elem_strides.as_ptr(),
                CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                swizzle,
                CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
            .result()?;
            Ok(Self(map.assume_init()))
        }
    }
}

/// Element types of the tensors the Hopper kernel reaches through tensor maps.
#[derive(Clone, Copy)]
enum Element {
    Bf16,
    F32,
}
