//! Re-planning without a host wait: a plan's tables copied to the device from page-locked
//! memory.
//!
//! A copy from pageable memory (a `Vec`) is staged by the driver, which may first wait for the
//! stream's earlier work: a serving loop that re-plans in place before each layer call would then
//! wait for the previous call to finish before it enqueues the next, and the GPU would idle while
//! the host plans. A copy from page-locked memory is enqueued and returns at once. Each table
//! alternates between two page-locked buffers: filling one waits only for the copy made from it
//! two uploads before, so the host runs up to two calls ahead of the GPU.

use crate::KdaError;
use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr, PinnedHostSlice, ValidAsZeroBits};
use std::sync::Arc;

/// Page-locked buffers a table alternates between: copies in turn.
const BUFFERS: usize = 2;

/// The page-locked staging of one device table ([`Staging::upload`]), allocated at its first
/// upload (a plan that is never re-planned holds none).
pub(super) struct Staging<T> {
    buffers: [Option<PinnedHostSlice<T>>; BUFFERS],
    next: usize,
}

impl<T> Default for Staging<T> {
    fn default() -> Self {
        Self { buffers: [None, None], next: 0 }
    }
}

impl<T: DeviceRepr + ValidAsZeroBits + Copy> Staging<T> {
    /// Copies `values` into the start of `dst` on `stream` through the next page-locked buffer
    /// (sized to `dst`: the copy also rewrites the rest of `dst` with what the buffer held, which
    /// the caller's tables never read). Waits only while that buffer's previous copy is still
    /// queued. `values` must fit `dst`.
    pub(super) fn upload(
        &mut self,
        stream: &Arc<CudaStream>,
        values: &[T],
        dst: &mut CudaSlice<T>,
    ) -> Result<(), KdaError> {
        if values.len() > dst.len() {
            return Err(KdaError::Argument {
                name: "plan",
                reason: format!("{} table entries for a buffer of {}", values.len(), dst.len()),
            });
        }
        let slot = &mut self.buffers[self.next];
        self.next = (self.next + 1) % BUFFERS;
        let buffer = match slot {
            Some(b) if b.len() == dst.len() => b,
            _ => slot.insert(zeroed_pinned(stream, dst.len())?),
        };
        // `as_mut_slice` waits for the copy last made from this buffer.
        buffer.as_mut_slice()?[..values.len()].copy_from_slice(values);
        stream.memcpy_htod(buffer, dst)?;
        Ok(())
    }
}

/// `len` zeroed elements of page-locked memory in `stream`'s context.
fn zeroed_pinned<T: DeviceRepr + ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    len: usize,
) -> Result<PinnedHostSlice<T>, KdaError> {
    // SAFETY: the allocation is zeroed below before any element is read, and zeros are a valid
    // `T` (`ValidAsZeroBits`).
    let mut buffer = unsafe { stream.context().alloc_pinned::<T>(len) }?;
    let ptr = buffer.as_mut_ptr()?;
    // SAFETY: `ptr` holds `len` elements of `T`, no copy from it is queued (it is new).
    unsafe { std::ptr::write_bytes(ptr, 0, len) };
    Ok(buffer)
}
