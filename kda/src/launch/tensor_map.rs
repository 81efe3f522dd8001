//! Tensor maps (`CUtensorMap`) of the tensors the Hopper kernel reaches through TMA.

use super::args::Pointers;
use crate::layout::{CHUNK, hopper};
use crate::model::StateLayout;
use crate::strides::{RowStrides, Strides};
use crate::{Dims, KdaError, Tensor};
use kda_kernel::abi::{MapSlot, TENSOR_MAPS, TensorMap};

/// The Hopper kernel's tensor maps of the launch's tensors, in [`MapSlot`] order, with the
/// initial states `h0` (address and rows of `[K][V]` f32 states) when the pass reads any, for
/// column blocks of `width` value columns (`hopper::BV` or `hopper::NARROW_BV`). `strides` has
/// passed [`Strides::check_hopper`] (TMA's stride rules); the head sizes are the Hopper kernel's.
/// The fused layer pass gives `fused`, the addresses of its packed `q Γ` (`[T, HV, K]`) and
/// causal attention (`[T, HV, CHUNK]`): their maps are set and `h`'s is not (nothing writes it).
pub(super) fn hopper_maps(
    p: &Pointers<'_>,
    d: &Dims,
    strides: &Strides,
    h0: Option<(u64, usize)>,
    width: usize,
    fused: Option<(u64, u64)>,
) -> Result<[TensorMap; TENSOR_MAPS], KdaError> {
    // `k` has the key heads; every other tensor the value heads.
    let (heads, hv, kd, vd) = (d.heads, d.value_heads, d.key_dim, d.value_dim);
    let rows = |tensor: Tensor, heads: usize, width: usize| Rows {
        tokens: d.tokens,
        heads,
        width,
        strides: strides.effective(d, tensor),
    };
    let (k, w, u, v_new) =
        (rows(Tensor::K, heads, kd), rows(Tensor::W, hv, kd), rows(Tensor::U, hv, vd), rows(Tensor::VNew, hv, vd));
    let mut maps = [TensorMapArg::unused().0; TENSOR_MAPS];
    let mut set = |slot: MapSlot, map: TensorMapArg| maps[slot as usize] = map.0;
    let tile = hopper::BOX_COLS;
    set(MapSlot::K, TensorMapArg::tokens(p.k, k, CHUNK, tile)?);
    set(MapSlot::W, TensorMapArg::tokens(p.w, w, CHUNK, tile)?);
    set(MapSlot::U, TensorMapArg::tokens(p.u, u, CHUNK, width)?);
    set(MapSlot::KRow, TensorMapArg::tokens(p.k, k, 1, tile)?);
    set(MapSlot::WRow, TensorMapArg::tokens(p.w, w, 1, tile)?);
    set(MapSlot::URow, TensorMapArg::tokens(p.u, u, 1, tile)?);
    let atom = hopper::ATOM_ROWS;
    set(MapSlot::KAtom, TensorMapArg::tokens(p.k, k, atom, tile)?);
    set(MapSlot::WAtom, TensorMapArg::tokens(p.w, w, atom, tile)?);
    set(MapSlot::UAtom, TensorMapArg::tokens(p.u, u, atom, tile)?);
    set(MapSlot::VNew, TensorMapArg::tokens(p.v_new, v_new, CHUNK, width)?);
    match fused {
        None => set(MapSlot::H, TensorMapArg::states(p.h, d, d.chunks * hv, width)?),
        Some((qg, attention)) => {
            let packed =
                |width: usize| Rows { tokens: d.tokens, heads: hv, width, strides: RowStrides::packed(hv, width) };
            let (q, a) = (packed(kd), packed(CHUNK));
            set(MapSlot::Q, TensorMapArg::tokens(qg, q, CHUNK, tile)?);
            set(MapSlot::QRow, TensorMapArg::tokens(qg, q, 1, tile)?);
            set(MapSlot::P, TensorMapArg::tokens(attention, a, CHUNK, CHUNK)?);
            set(MapSlot::PRow, TensorMapArg::tokens(attention, a, 1, CHUNK)?);
            set(MapSlot::QAtom, TensorMapArg::tokens(qg, q, atom, tile)?);
            set(MapSlot::PAtom, TensorMapArg::tokens(attention, a, atom, CHUNK)?);
        }
    }
    if let Some((address, rows)) = h0 {
        set(MapSlot::H0, TensorMapArg::initial_states(address, d, rows, width)?);
    }
    Ok(maps.map(|m| TensorMap(m.opaque)))
}

/// A token-major tensor `[T, heads, width]` at its strides.
#[derive(Clone, Copy)]
struct Rows {
    tokens: usize,
    heads: usize,
    width: usize,
    strides: RowStrides,
}

/// An encoded `CUtensorMap`.
struct TensorMapArg(cudarc::driver::sys::CUtensorMap);

impl TensorMapArg {
    /// The tensor map of a token-major bf16 tensor at `address`, as a 3-D tensor
    /// `(width, heads, T)` at its strides, read or written in `[box_tokens][1][box_cols]` boxes
    /// swizzled over their rows (128 bytes for 64 columns: what the wgmma operands `k` and `w`
    /// need, and what keeps `ldmatrix` over `u` and `stmatrix` into the staging tiles free of
    /// bank conflicts; 64 bytes for a narrow block's 32): `CHUNK` tokens for full chunks, one
    /// swizzle atom (`hopper::ATOM_ROWS`) and one for the tail chunk's valid rows.
    fn tokens(address: u64, t: Rows, box_tokens: usize, box_cols: usize) -> Result<Self, KdaError> {
        let dims = [t.width, t.heads, t.tokens];
        let strides = [t.strides.head, t.strides.token];
        Self::encode(address, Element::Bf16, dims, strides, [box_cols, 1, box_tokens])
    }

    /// The tensor map of the `h` output (`[NT * HV]` bf16 states), written in one CTA's boxes of
    /// `bf16(S)` for one chunk, swizzled as the kernel's staging tile is: as `(V, K, NT * HV)` in
    /// `[1][K][width]` boxes for key-first states, as `(K, V, NT * HV)` in
    /// `[1][width][BOX_COLS]` boxes (one per 64 keys) for value-first ones.
    fn states(address: u64, d: &Dims, chunk_heads: usize, width: usize) -> Result<Self, KdaError> {
        let (kd, vd) = (d.key_dim, d.value_dim);
        let (dims, boxes) = match d.layout {
            StateLayout::KeyFirst => ([vd, kd, chunk_heads], [width, kd, 1]),
            StateLayout::ValueFirst => ([kd, vd, chunk_heads], [hopper::BOX_COLS, width, 1]),
        };
        Self::encode(address, Element::Bf16, dims, packed(dims), boxes)
    }

    /// The tensor map of `h0` (`[N * HV]` f32 states), read in unswizzled boxes of one item's
    /// block: `(V, K, N * HV)` in `[1][K][width]` boxes, or `(K, V, N * HV)` in `[1][width][K]`
    /// boxes value-first.
    fn initial_states(address: u64, d: &Dims, seq_heads: usize, width: usize) -> Result<Self, KdaError> {
        let (kd, vd) = (d.key_dim, d.value_dim);
        let (dims, boxes) = match d.layout {
            StateLayout::KeyFirst => ([vd, kd, seq_heads], [width, kd, 1]),
            StateLayout::ValueFirst => ([kd, vd, seq_heads], [kd, width, 1]),
        };
        Self::encode(address, Element::F32, dims, packed(dims), boxes)
    }

    /// A placeholder for a map the kernel does not use in this launch (all zero bytes).
    fn unused() -> Self {
        // SAFETY: `CUtensorMap` is plain bytes; the kernel never hands this one to TMA.
        Self(unsafe { std::mem::zeroed() })
    }

    /// A tensor of extents `dims` (innermost first, the innermost contiguous) with element
    /// strides `strides` for the outer two, in boxes of `boxes` elements: bf16 tiles swizzled
    /// over their box rows (128 or 64 bytes, as wgmma and the staging tiles lay them out), f32
    /// state blocks unswizzled.
    fn encode(
        address: u64,
        element: Element,
        dims: [usize; 3],
        strides: [usize; 2],
        boxes: [usize; 3],
    ) -> Result<Self, KdaError> {
        use cudarc::driver::sys::*;
        let (data_type, bytes, swizzle) = match element {
            Element::Bf16 if boxes[0] == hopper::NARROW_BV => (
                CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                2,
                CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B,
            ),
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
        let strides: [u64; 2] = strides.map(|s| s as u64 * bytes);
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

/// The element strides of the outer two dimensions of a packed tensor of extents `dims`.
fn packed(dims: [usize; 3]) -> [usize; 2] {
    [dims[0], dims[0] * dims[1]]
}
