//! Shared-memory addresses of one CTA, from the field offsets of its key size's and block
//! width's `layout::hopper::SharedStorage` ([`KeySize::smem`]).

use super::keys::KeySize;
use crate::arch::sm80::smem_base_shared;
use crate::layout::CHUNK;
use crate::layout::hopper::{Block, TileBox};
use crate::pipeline::Pipeline;
use core::marker::PhantomData;
use core::mem::{offset_of, size_of};

/// The `.shared` addresses (32-bit) of this CTA's shared storage for key size `C` and block
/// width `B`.
pub struct Smem<C, B> {
    base: u32,
    key: PhantomData<(C, B)>,
}

impl<C, B> Clone for Smem<C, B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<C, B> Copy for Smem<C, B> {}

impl<C: KeySize, B: Block> Smem<C, B> {
    /// The dynamic shared memory of this CTA.
    #[inline(always)]
    pub fn of_cta() -> Self {
        Self { base: smem_base_shared(), key: PhantomData }
    }

    /// Ring stage `s`.
    #[inline(always)]
    pub fn stage(self, s: usize) -> StageTiles {
        StageTiles {
            base: self.base + C::smem::<B>().stages + s as u32 * C::smem::<B>().stage_bytes,
            boxes: C::KB as u32,
        }
    }

    /// Stage `s`'s decay row: the state's decay per key row, f32 `[K]`.
    #[inline(always)]
    pub fn decay(self, s: usize) -> u32 {
        self.base + C::smem::<B>().decay + (s * C::K * 4) as u32
    }

    /// Stage `s`'s row scales: the scalar gate's `exp2(g_last - g[r])` per token, f32 `[CHUNK]`.
    #[inline(always)]
    pub fn row_scale(self, s: usize) -> u32 {
        self.base + C::smem::<B>().row_scale + (s * CHUNK * 4) as u32
    }

    /// Staging buffer `buf` of `bf16(S)` for the `h` store.
    #[inline(always)]
    pub fn h(self, buf: usize) -> u32 {
        self.base + C::smem::<B>().h_staging + buf as u32 * C::smem::<B>().state_tile_bytes
    }

    /// Staging buffer `buf` of `bf16(Vn)` for the `v_new` store.
    #[inline(always)]
    pub fn vn(self, buf: usize) -> u32 {
        self.base + C::smem::<B>().vn_staging + buf as u32 * C::smem::<B>().value_tile_bytes
    }

    /// Narrow blocks: the `bf16(S)^T` operand tile (`K / 64` boxes of `[BV][64]`).
    #[inline(always)]
    pub fn s_operand(self) -> u32 {
        self.base + C::smem::<B>().s_operand
    }

    /// Narrow blocks: the `bf16(Vn)^T` operand tile (`[BV][CHUNK]`).
    #[inline(always)]
    pub fn vn_operand(self) -> u32 {
        self.base + C::smem::<B>().vn_operand
    }

    /// Narrow blocks of the fused layer pass with a scalar gate: the unscaled `bf16(Vn)^T`
    /// operand of the output's second product (`[BV][CHUNK]`, as [`Self::vn_operand`]), in the
    /// first `h` staging buffer, which the fused pass never stores from.
    #[inline(always)]
    pub fn output_operand(self) -> u32 {
        self.h(0)
    }

    /// The initial-state slot, f32 `[K][B::BV]` (or `[B::BV][K]`).
    #[inline(always)]
    pub fn h0(self) -> u32 {
        self.base + C::smem::<B>().h0
    }

    /// The ring's barriers.
    #[inline(always)]
    pub fn ring(self) -> Pipeline {
        let o = C::smem::<B>();
        Pipeline::new(self.base + o.full, self.base + o.empty, o.ring as usize)
    }

    /// The initial-state slot's barriers: a one-stage ring.
    #[inline(always)]
    pub fn h0_slot(self) -> Pipeline {
        Pipeline::new(self.base + C::smem::<B>().h0_full, self.base + C::smem::<B>().h0_empty, 1)
    }

    /// Staging buffers of the output stores.
    #[inline(always)]
    pub fn staging_buffers(self) -> usize {
        C::smem::<B>().staging as usize
    }
}

/// The tiles of one ring stage (`layout::hopper::Stage`): `boxes` boxes of `k`, as many of `w`,
/// then `u`; in the fused pass then `boxes` boxes of `q Γ` and the causal attention.
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

    /// Fused blocks: column box `b` of the `q Γ` tile.
    #[inline(always)]
    pub fn q(self, b: usize) -> u32 {
        self.base + (2 * self.boxes + 1 + b as u32) * BOX
    }

    /// Fused blocks: the causal attention tile.
    #[inline(always)]
    pub fn p(self) -> u32 {
        self.base + (3 * self.boxes + 1) * BOX
    }
}

// The stage's fields are its boxes in this order (`layout::hopper::Stage`).
const _: () = {
    use crate::layout::hopper::Stage;
    assert!(offset_of!(Stage<2, 0>, k) == 0 && offset_of!(Stage<2, 0>, w) == 2 * BOX as usize);
    assert!(offset_of!(Stage<2, 0>, u) == 4 * BOX as usize && offset_of!(Stage<1, 0>, u) == 2 * BOX as usize);
    assert!(offset_of!(Stage<2, 1>, q) == 5 * BOX as usize && offset_of!(Stage<2, 1>, p) == 7 * BOX as usize);
    assert!(offset_of!(Stage<1, 1>, q) == 3 * BOX as usize && offset_of!(Stage<1, 1>, p) == 4 * BOX as usize);
};
