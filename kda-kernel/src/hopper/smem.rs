//! Shared-memory addresses of one CTA, from the field offsets of its key size's
//! `layout::hopper::SharedStorage` ([`KeySize::SMEM`]).

use super::keys::KeySize;
use crate::arch::sm80::smem_base_shared;
use crate::layout::CHUNK;
use crate::layout::hopper::{STAGES, TileBox, ValueTile};
use crate::pipeline::Pipeline;
use core::marker::PhantomData;
use core::mem::{offset_of, size_of};

/// The `.shared` addresses (32-bit) of this CTA's shared storage for key size `C`.
pub struct Smem<C> {
    base: u32,
    key: PhantomData<C>,
}

impl<C> Clone for Smem<C> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<C> Copy for Smem<C> {}

impl<C: KeySize> Smem<C> {
    /// The dynamic shared memory of this CTA.
    #[inline(always)]
    pub fn of_cta() -> Self {
        Self { base: smem_base_shared(), key: PhantomData }
    }

    /// Ring stage `s`.
    #[inline(always)]
    pub fn stage(self, s: usize) -> StageTiles {
        StageTiles { base: self.base + C::SMEM.stages + s as u32 * C::SMEM.stage_bytes, boxes: C::KB as u32 }
    }

    /// Stage `s`'s decay row: the state's decay per key row, f32 `[K]`.
    #[inline(always)]
    pub fn decay(self, s: usize) -> u32 {
        self.base + C::SMEM.decay + (s * C::K * 4) as u32
    }

    /// Stage `s`'s row scales: the scalar gate's `exp2(g_last - g[r])` per token, f32 `[CHUNK]`.
    #[inline(always)]
    pub fn row_scale(self, s: usize) -> u32 {
        self.base + C::SMEM.row_scale + (s * CHUNK * 4) as u32
    }

    /// Staging buffer `buf` of `bf16(S)` for the `h` store.
    #[inline(always)]
    pub fn h(self, buf: usize) -> u32 {
        self.base + C::SMEM.h_staging + buf as u32 * C::SMEM.state_tile_bytes
    }

    /// Staging buffer `buf` of `bf16(Vn)` for the `v_new` store.
    #[inline(always)]
    pub fn vn(self, buf: usize) -> u32 {
        self.base + C::SMEM.vn_staging + (buf * size_of::<ValueTile>()) as u32
    }

    /// The initial-state slot, f32 `[K][BV]` (or `[BV][K]`).
    #[inline(always)]
    pub fn h0(self) -> u32 {
        self.base + C::SMEM.h0
    }

    /// The ring's barriers.
    #[inline(always)]
    pub fn ring(self) -> Pipeline<STAGES> {
        Pipeline::new(self.base + C::SMEM.full, self.base + C::SMEM.empty)
    }

    /// The initial-state slot's barriers: a one-stage ring.
    #[inline(always)]
    pub fn h0_slot(self) -> Pipeline<1> {
        Pipeline::new(self.base + C::SMEM.h0_full, self.base + C::SMEM.h0_empty)
    }
}

/// The tiles of one ring stage (`layout::hopper::Stage`): `boxes` boxes of `k`, as many of `w`,
/// then `u`.
#[derive(Clone, Copy)]
pub struct StageTiles {
    base: u32,
    boxes: u32,
}

/// Bytes of one tile box.
const BOX: u32 = size_of::<TileBox>() as u32;

impl StageTiles {
    /// Column box `b` of the `k` tile.
    #[inline(always)]
    pub fn k(self, b: usize) -> u32 {
        self.base + b as u32 * BOX
    }

    /// Column box `b` of the `w` tile.
    #[inline(always)]
    pub fn w(self, b: usize) -> u32 {
        self.base + (self.boxes + b as u32) * BOX
    }

    /// The `u` tile.
    #[inline(always)]
    pub fn u(self) -> u32 {
        self.base + 2 * self.boxes * BOX
    }
}

// The stage's fields are its boxes in this order (`layout::hopper::Stage`).
const _: () = {
    use crate::layout::hopper::Stage;
    assert!(offset_of!(Stage<2>, k) == 0 && offset_of!(Stage<2>, w) == 2 * BOX as usize);
    assert!(offset_of!(Stage<2>, u) == 4 * BOX as usize && offset_of!(Stage<1>, u) == 2 * BOX as usize);
};
