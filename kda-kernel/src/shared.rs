//! Typed addresses in the CTA's shared window (the `.shared` state space, 32-bit): a tile's
//! loads and stores through [`Shared`] compile to `LDS` / `STS` with 32-bit address arithmetic and
//! immediate offsets, where a generic pointer (`cvta.shared`) costs 64-bit address arithmetic and
//! a generic `LD` / `ST` the hardware must first resolve to shared memory.

use crate::arch::sm80::{
    ld_shared_f32, ld_shared_u16, ld_shared_u32, smem_base_shared, st_shared_f32, st_shared_u16, st_shared_u32,
};
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

    /// The address itself (for the instructions that take one, as `ldmatrix`).
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

/// An element a shared tile holds, with its load and store instructions.
pub(crate) trait Element: Copy {
    /// Loads the element at `addr`.
    ///
    /// # Safety
    /// `addr` lies inside the CTA's allocation, aligned to the element's size.
    unsafe fn load(addr: u32) -> Self;

    /// Stores `v` at `addr`.
    ///
    /// # Safety
    /// As [`Element::load`].
    unsafe fn store(addr: u32, v: Self);
}

/// `Element` for `$t` through the wrappers of its `ld.shared` and `st.shared`.
macro_rules! element {
    ($($(#[$doc:meta])* $t:ty => $load:ident, $store:ident;)*) => {$(
        $(#[$doc])*
        impl Element for $t {
            #[inline(always)]
            unsafe fn load(addr: u32) -> Self {
                // SAFETY: the caller's contract.
                unsafe { $load(addr) }
            }

            #[inline(always)]
            unsafe fn store(addr: u32, v: Self) {
                // SAFETY: the caller's contract.
                unsafe { $store(addr, v) }
            }
        }
    )*};
}

element! {
    f32 => ld_shared_f32, st_shared_f32;
    /// A bf16's bits.
    u16 => ld_shared_u16, st_shared_u16;
    /// Two bf16's bits (the first in the low half).
    u32 => ld_shared_u32, st_shared_u32;
}

impl<T: Element> Shared<T> {
    /// `ld.shared` of the element here.
    ///
    /// # Safety
    /// The address lies inside the CTA's allocation, aligned to `T`.
    #[inline(always)]
    pub(crate) unsafe fn ld(self) -> T {
        // SAFETY: the caller's contract.
        unsafe { T::load(self.addr) }
    }

    /// `st.shared` of `v` here.
    ///
    /// # Safety
    /// As [`Shared::ld`].
    #[inline(always)]
    pub(crate) unsafe fn st(self, v: T) {
        // SAFETY: the caller's contract.
        unsafe { T::store(self.addr, v) }
    }
}
