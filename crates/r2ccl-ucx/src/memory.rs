//! Memory regions mapped (`ucp_mem_map`) in every NIC's context at once, and slices of them as
//! send/receive buffers.
//!
//! Registration on every NIC up front is what lets a transfer move to a backup NIC without registering
//! anything on the failure path.

use crate::context::Context;
use crate::error::{Status, UcxError};
use crate::request::{RecvBuf, SendBuf};
use r2ccl_ucx_sys as sys;
use std::fmt;
use std::ops::Range;
use std::ptr::NonNull;
use std::sync::Arc;

/// A heap buffer owned by the library and mapped in several UCP contexts (one per NIC).
///
/// The bytes are shared with UCX: requests on [`RegionSlice`]s read and write them while in flight. The
/// copy helpers ([`MemRegion::write_at`], [`MemRegion::read_at`]) must not be used on a range a request
/// is currently using; the transport's chunk bookkeeping guarantees that.
pub struct MemRegion {
    ptr: NonNull<u8>,
    len: usize,
    /// One `(context, memory handle)` per NIC; `None` for an empty region (UCX cannot map 0 bytes).
    maps: Vec<(Arc<Context>, Option<sys::ucp_mem_h>)>,
}

// SAFETY: the memory is a plain heap allocation owned by the region; the memory handles are only
// unmapped in Drop, and ucp_mem_map/unmap are serialized by UCX's context lock (mt_workers_shared).
unsafe impl Send for MemRegion {}
// SAFETY: as above; shared access only copies bytes or hands out raw pointers to requests.
unsafe impl Sync for MemRegion {}

impl fmt::Debug for MemRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let devices: Vec<&str> = self.maps.iter().map(|(c, _)| c.device()).collect();
        f.debug_struct("MemRegion").field("len", &self.len).field("devices", &devices).finish()
    }
}

impl MemRegion {
    /// Take ownership of `data` and map it in every context of `contexts`.
    pub fn new(contexts: &[Arc<Context>], data: Vec<u8>) -> Result<Arc<Self>, UcxError> {
        let boxed: Box<[u8]> = data.into_boxed_slice();
        let len = boxed.len();
        // Box::into_raw never returns null.
        let ptr = NonNull::new(Box::into_raw(boxed).cast::<u8>()).unwrap_or(NonNull::dangling());
        advise_huge_pages(ptr.as_ptr(), len);
        let mut region = Self { ptr, len, maps: Vec::with_capacity(contexts.len()) };
        for ctx in contexts {
            let memh = if len == 0 { None } else { Some(region.map_in(ctx)?) };
            region.maps.push((ctx.clone(), memh));
        }
        Ok(Arc::new(region))
    }

    /// A zero-filled region of `len` bytes mapped in every context of `contexts`.
    pub fn zeroed(contexts: &[Arc<Context>], len: usize) -> Result<Arc<Self>, UcxError> {
        Self::new(contexts, vec![0; len])
    }

    fn map_in(&self, ctx: &Context) -> Result<sys::ucp_mem_h, UcxError> {
        // SAFETY: ucp_mem_map_params_t is a plain C struct; all-zero means "no fields set".
        let mut params: sys::ucp_mem_map_params_t = unsafe { std::mem::zeroed() };
        params.field_mask = u64::from(sys::UCP_MEM_MAP_PARAM_FIELD_ADDRESS | sys::UCP_MEM_MAP_PARAM_FIELD_LENGTH);
        params.address = self.ptr.as_ptr().cast();
        params.length = self.len;
        let mut memh: sys::ucp_mem_h = std::ptr::null_mut();
        // SAFETY: the context is live; address/length describe memory this region owns until Drop, where
        // it is unmapped before being freed.
        let status = Status(unsafe { sys::ucp_mem_map(ctx.raw(), &params, &mut memh) });
        if !status.is_ok() {
            return Err(UcxError::Status {
                op: "ucp_mem_map",
                status,
                message: format!("{} ({} bytes on {})", status.message(), self.len, ctx.device()),
            });
        }
        Ok(memh)
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of contexts (NICs) the region is mapped in.
    pub fn mapped_count(&self) -> usize {
        self.maps.len()
    }

    /// The memory handle for `context`, if the region is mapped there (and not empty).
    pub fn memh(&self, context: &Context) -> Option<sys::ucp_mem_h> {
        self.maps.iter().find(|(c, _)| std::ptr::eq(Arc::as_ptr(c), context)).and_then(|(_, m)| *m)
    }

    fn check(&self, range: &Range<usize>) -> Result<(), UcxError> {
        if range.start > range.end || range.end > self.len {
            return Err(UcxError::OutOfRange {
                what: "region byte offset",
                index: range.end.max(range.start),
                len: self.len,
            });
        }
        Ok(())
    }

    /// Copy `data` into the region at `offset`.
    pub fn write_at(&self, offset: usize, data: &[u8]) -> Result<(), UcxError> {
        let end = offset.saturating_add(data.len());
        self.check(&(offset..end))?;
        // SAFETY: in bounds (checked); the region owns the memory; callers keep ranges in flight off-limits.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(offset), data.len()) };
        Ok(())
    }

    /// Copy bytes of the region at `offset` into `out`.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<(), UcxError> {
        let end = offset.saturating_add(out.len());
        self.check(&(offset..end))?;
        // SAFETY: in bounds (checked); see write_at.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(offset), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// A copy of the whole region.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.len];
        // SAFETY: `v` has exactly `len` bytes; see write_at.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr(), v.as_mut_ptr(), self.len) };
        v
    }

    /// The region's bytes.
    ///
    /// # Safety
    /// No request may be writing the region while the returned slice lives (no [`RegionSlice`] of it is
    /// posted as a receive buffer).
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr/len describe the owned allocation; the caller excludes concurrent writers.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The region's bytes, writable. `&mut self` on a region (e.g. through `Arc::get_mut`) proves that no
    /// [`RegionSlice`] of it exists, so no request can use the bytes.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: ptr/len describe the owned allocation; exclusive access is proven by `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// The region's bytes, writable, while requests may hold slices of it ([`RegionSlice`]).
    ///
    /// # Safety
    /// No other reference to the region's bytes may live while the returned slice does, and no UCX
    /// call on a worker with a request on a slice of the region in flight may run meanwhile (UCX reads
    /// and writes a request's bytes only inside its calls, so the slice and UCX never touch the bytes
    /// at the same time). Bytes that a request in flight reads or writes are the caller's to keep
    /// off-limits.
    #[allow(clippy::mut_from_ref, reason = "exclusivity is the caller's contract (see # Safety)")]
    pub unsafe fn as_mut_slice_unchecked(&self) -> &mut [u8] {
        // SAFETY: ptr/len describe the owned allocation; the caller guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// A slice of the region, usable as a send or receive buffer on any NIC the region is mapped in.
    pub fn slice(self: &Arc<Self>, range: Range<usize>) -> Result<RegionSlice, UcxError> {
        self.check(&range)?;
        Ok(RegionSlice { region: self.clone(), range })
    }
}

/// Regions at least this large ask for transparent huge pages.
const HUGE_MIN: usize = 4 << 20;

/// Ask the kernel to back a large region with transparent huge pages (`MADV_HUGEPAGE`; this machine's
/// THP mode is `madvise`): received bytes stream into memory that is written once per transfer, and
/// with 4 KiB pages the copies out of the socket spend a good part of their time on TLB misses and
/// page faults. Only a hint: failure changes nothing but speed.
fn advise_huge_pages(ptr: *mut u8, len: usize) {
    if len < HUGE_MIN {
        return;
    }
    const PAGE: usize = 4096;
    let start = (ptr as usize) & !(PAGE - 1);
    let end = (ptr as usize).saturating_add(len);
    // SAFETY: [start, end) lies within the pages of this allocation (`ptr..ptr+len` rounded down to its
    // first page, which the allocation also occupies); MADV_HUGEPAGE changes no contents.
    let rc = unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
    if rc != 0 {
        tracing::debug!(target: r2ccl_core::subsys::NET, len, "madvise(MADV_HUGEPAGE) refused; regular pages");
    }
}

impl Drop for MemRegion {
    fn drop(&mut self) {
        for (ctx, memh) in self.maps.drain(..) {
            if let Some(memh) = memh {
                // SAFETY: memh came from ucp_mem_map on this (still live, we hold an Arc) context; no request
                // uses the memory any more (requests hold an Arc to the region); unmapped once.
                let status = Status(unsafe { sys::ucp_mem_unmap(ctx.raw(), memh) });
                if !status.is_ok() {
                    tracing::warn!(target: r2ccl_core::subsys::NET, device = ctx.device(), %status, "ucp_mem_unmap failed");
                }
            }
        }
        // SAFETY: ptr/len came from Box::<[u8]>::into_raw in `new` and are freed once, after every unmap.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len)) });
    }
}

/// A byte range of a [`MemRegion`], owning a reference to it: a send or receive buffer that carries the
/// region's memory handle for whichever NIC it is posted on.
#[derive(Clone)]
pub struct RegionSlice {
    region: Arc<MemRegion>,
    range: Range<usize>,
}

impl fmt::Debug for RegionSlice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RegionSlice({:?} of {} bytes)", self.range, self.region.len)
    }
}

impl RegionSlice {
    /// The region.
    pub fn region(&self) -> &Arc<MemRegion> {
        &self.region
    }

    /// The byte range within the region.
    pub fn range(&self) -> Range<usize> {
        self.range.clone()
    }
}

// SAFETY: the region's heap memory never moves and lives as long as this slice's Arc; the range is in
// bounds (checked at creation); memh returns the region's handle for that very context. Exclusive use of
// the range while a request holds the slice is the transport's chunk bookkeeping's duty (documented on
// MemRegion).
unsafe impl SendBuf for RegionSlice {
    fn as_ptr(&self) -> *const u8 {
        // SAFETY: range.start <= len (checked at creation).
        unsafe { self.region.ptr.as_ptr().add(self.range.start) }
    }
    fn byte_len(&self) -> usize {
        self.range.len()
    }
    fn memh(&self, context: &Context) -> Option<sys::ucp_mem_h> {
        self.region.memh(context)
    }
}

// SAFETY: as for SendBuf; the memory is writable (owned heap allocation).
unsafe impl RecvBuf for RegionSlice {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        // SAFETY: range.start <= len (checked at creation).
        unsafe { self.region.ptr.as_ptr().add(self.range.start) }
    }
}
