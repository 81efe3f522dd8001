//! Typed addresses in the CTA's shared window (the `.shared` state space, 32-bit): a tile's
//! loads and stores through [`Shared`] compile to `LDS` / `STS` with 32-bit address arithmetic and
//! immediate offsets, where a generic pointer (`cvta.shared`) costs 64-bit address arithmetic and
//! a generic `LD` / `ST` the hardware must first resolve to shared memory.

use crate::arch::sm80::{ld_shared_f32, ld_shared_u16, smem_base_shared, st_shared_f32, st_shared_u16};
use core::marker::PhantomData;

/// The shared-window address of a `T` (or of the first `T` of a tile).
pub(crate) struct Shared<T> {
    addr: u32,
    _element: PhantomData<T>,
}

impl<T> Clone for Shared<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Shared<T> {}

impl<T> Shared<T> {
    /// The first byte of the CTA's dynamic shared memory.
    #[inline(always)]
    pub(crate) fn base() -> Self {
        Self::at(smem_base_shared())
    }

    #[inline(always)]
    fn at(addr: u32) -> Self {
        Self { addr, _element: PhantomData }
    }

    /// The `n`-th `T` after this one (only the address is formed: the shared window is 32-bit
    /// and every tile index is below 2^16).
    #[inline(always)]
    pub(crate) fn add(self, n: usize) -> Self {
        Self::at(self.addr.wrapping_add((n as u32).wrapping_mul(core::mem::size_of::<T>() as u32)))
    }

    /// The address itself (for the instructions that take one: `ldmatrix`, 32-bit stores).
    #[inline(always)]
    pub(crate) fn addr(self) -> u32 {
        self.addr
    }

    /// The same address read as `U`s (a tile of another type laid after this one).
    #[inline(always)]
    pub(crate) fn cast<U>(self) -> Shared<U> {
        Shared::at(self.addr)
    }
}

impl Shared<f32> {
    /// `ld.shared.f32`.
    ///
    /// # Safety
    /// The address lies inside the CTA's allocation (4-byte aligned).
    #[inline(always)]
    pub(crate) unsafe fn ld(self) -> f32 {
        // SAFETY: the caller's contract.
        unsafe { ld_shared_f32(self.addr) }
    }

    /// `st.shared.f32`.
    ///
    /// # Safety
    /// As [`Shared::ld`].
    #[inline(always)]
    pub(crate) unsafe fn st(self, v: f32) {
        // SAFETY: the caller's contract.
        unsafe { st_shared_f32(self.addr, v) }
    }
}

impl Shared<u16> {
    /// `ld.shared.b16` (a bf16's bits).
    ///
    /// # Safety
    /// The address lies inside the CTA's allocation (2-byte aligned).
    #[inline(always)]
    pub(crate) unsafe fn ld(self) -> u16 {
        // SAFETY: the caller's contract.
        unsafe { ld_shared_u16(self.addr) }
    }

    /// `st.shared.b16`.
    ///
    /// # Safety
    /// As [`Shared::ld`].
    #[inline(always)]
    pub(crate) unsafe fn st(self, v: u16) {
        // SAFETY: the caller's contract.
        unsafe { st_shared_u16(self.addr, v) }
    }
}
