//! Shared-memory addresses of one CTA, derived from [`SharedStorage`]'s field offsets.

use crate::arch::sm80::smem_base_shared;
use crate::layout::hopper::{STAGES, SharedStorage, Stage, StateTile, TileBox, ValueTile};
use crate::layout::{CHUNK, K_DIM};
use crate::pipeline::Pipeline;
use core::mem::{offset_of, size_of};

/// The `.shared` addresses (32-bit) of this CTA's [`SharedStorage`].
#[derive(Clone, Copy)]
pub struct Smem {
    base: u32,
}

/// The byte offset of field `$field` of [`SharedStorage`], as a `u32`.
macro_rules! at {
    ($field:ident) => {
        offset_of!(SharedStorage, $field) as u32
    };
}

impl Smem {
    /// The dynamic shared memory of this CTA.
    #[inline(always)]
    pub fn of_cta() -> Self {
        Self { base: smem_base_shared() }
    }

    /// Ring stage `s`.
    #[inline(always)]
    pub fn stage(self, s: usize) -> StageTiles {
        StageTiles { base: self.base + at!(stages) + (s * size_of::<Stage>()) as u32 }
    }

    /// Stage `s`'s decay row: the state's decay per key row, f32 `[K]`.
    #[inline(always)]
    pub fn decay(self, s: usize) -> u32 {
        self.base + at!(decay) + (s * K_DIM * 4) as u32
    }

    /// Stage `s`'s row scales: the scalar gate's `exp2(g_last - g[r])` per token, f32 `[CHUNK]`.
    #[inline(always)]
    pub fn row_scale(self, s: usize) -> u32 {
        self.base + at!(row_scale) + (s * CHUNK * 4) as u32
    }

    /// Staging buffer `buf` of `bf16(S)` for the `h` store.
    #[inline(always)]
    pub fn h(self, buf: usize) -> u32 {
        self.base + at!(h_staging) + (buf * size_of::<StateTile>()) as u32
    }

    /// Staging buffer `buf` of `bf16(Vn)` for the `v_new` store.
    #[inline(always)]
    pub fn vn(self, buf: usize) -> u32 {
        self.base + at!(vn_staging) + (buf * size_of::<ValueTile>()) as u32
    }

    /// The initial-state slot, f32 `[K][BV]`.
    #[inline(always)]
    pub fn h0(self) -> u32 {
        self.base + at!(h0)
    }

    /// The ring's barriers.
    #[inline(always)]
    pub fn ring(self) -> Pipeline<STAGES> {
        Pipeline::new(self.base + at!(full), self.base + at!(empty))
    }

    /// The initial-state slot's barriers: a one-stage ring.
    #[inline(always)]
    pub fn h0_slot(self) -> Pipeline<1> {
        Pipeline::new(self.base + at!(h0_full), self.base + at!(h0_empty))
    }
}

/// The tiles of one ring stage.
#[derive(Clone, Copy)]
pub struct StageTiles {
    base: u32,
}

impl StageTiles {
    /// Column box `b` of the `k` tile.
    #[inline(always)]
    pub fn k(self, b: usize) -> u32 {
        self.base + (offset_of!(Stage, k) + b * size_of::<TileBox>()) as u32
    }

    /// Column box `b` of the `w` tile.
    #[inline(always)]
    pub fn w(self, b: usize) -> u32 {
        self.base + (offset_of!(Stage, w) + b * size_of::<TileBox>()) as u32
    }

    /// The `u` tile.
    #[inline(always)]
    pub fn u(self) -> u32 {
        self.base + offset_of!(Stage, u) as u32
    }
}
