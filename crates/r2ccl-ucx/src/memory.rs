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
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

/// Page size the alias mapping works in.
const PAGE: usize = 4096;

/// Memory owned by the library (a memory file mapped twice, see [`MemRegion::alias_slice`], or a heap
/// allocation) and mapped in several UCP contexts (one per NIC).
///
/// The bytes are shared with UCX: requests on [`RegionSlice`]s read and write them while in flight. The
/// copy helpers ([`MemRegion::write_at`], [`MemRegion::read_at`]) must not be used on a range a request
/// is currently using; the transport's chunk bookkeeping guarantees that.
pub struct MemRegion {
    ptr: NonNull<u8>,
    len: usize,
    /// Where the bytes live.
    backing: Backing,
    /// One `(context, memory handle)` per NIC; `None` for an empty region (UCX cannot map 0 bytes).
    maps: Vec<(Arc<Context>, Option<sys::ucp_mem_h>)>,
}

/// Where a region's bytes live.
enum Backing {
    /// A heap allocation (an empty region, or a host without `memfd_create`): no alias.
    Heap,
    /// A memory file mapped twice: at `ptr` (every use but receives into place) and at `alias`,
    /// which receives into place ([`MemRegion::alias_slice`]) write through. A receive into place
    /// that is given up while UCX still holds it cannot be cancelled (UCX 1.13 cannot cancel a
    /// matched receive, and TCP delivers bytes the sender's kernel retransmits once a link
    /// returns): its range of the alias is then replaced by private anonymous pages
    /// ([`MemRegion::poison`]), so whatever it still writes lands in memory nobody reads.
    Shared {
        /// The second mapping of the file.
        alias: NonNull<u8>,
        /// Both mappings' length: `len` rounded up to whole pages.
        map_len: usize,
        /// The memory file (both mappings keep its pages alive; a healed alias range maps it again).
        fd: OwnedFd,
        /// Alias ranges (page-aligned) replaced by throwaway pages, one entry per receive that UCX
        /// still held when it was given up: not received into until that receive is over
        /// ([`MemRegion::heal`]).
        poisoned: Mutex<Vec<Range<usize>>>,
    },
}

/// Map a fresh memory file of `len` (> 0) bytes twice, its first `hot` bytes made resident now
/// (the rest is allocated on first touch); `None` when the host refuses.
fn map_shared(len: usize, hot: usize) -> Option<(NonNull<u8>, Backing)> {
    let map_len = len.checked_next_multiple_of(PAGE)?;
    // SAFETY: a valid NUL-terminated name and flags; the result is checked.
    let fd = unsafe { libc::memfd_create(c"r2ccl-region".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` was just created and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let size = libc::off_t::try_from(map_len).ok()?;
    // SAFETY: a valid fd; the file is ours.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
        return None;
    }
    let map = || {
        // SAFETY: a fresh shared mapping of the whole file at an address the kernel picks.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        (p != libc::MAP_FAILED).then(|| NonNull::new(p.cast::<u8>())).flatten()
    };
    let primary = map()?;
    let Some(alias) = map() else {
        // SAFETY: `primary` is the mapping made just above, of `map_len` bytes, used by nothing.
        unsafe { libc::munmap(primary.as_ptr().cast(), map_len) };
        return None;
    };
    // Huge pages where the host allows them for memory files, then every hot page allocated and
    // mapped in both mappings now: faulting the alias's pages in during a transfer cost half
    // the rate of a 2 GiB one. Cold space (rarely written) costs nothing until it is.
    let hot_len = hot.min(len).checked_next_multiple_of(PAGE)?.min(map_len);
    for m in [primary, alias] {
        advise_huge_pages(m.as_ptr(), map_len);
        if hot_len > 0 {
            // SAFETY: the range is a prefix of one of the two mappings just made; populating
            // changes no contents (the file is zero-filled). A kernel without
            // MADV_POPULATE_WRITE refuses it and the pages fault in on first use instead.
            unsafe { libc::madvise(m.as_ptr().cast(), hot_len, libc::MADV_POPULATE_WRITE) };
        }
    }
    Some((primary, Backing::Shared { alias, map_len, fd, poisoned: Mutex::new(Vec::new()) }))
}

// SAFETY: the memory (mappings or heap allocation) is owned by the region; the memory handles are only
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
    /// A region holding a copy of `data`, mapped in every context of `contexts`.
    pub fn new(contexts: &[Arc<Context>], data: &[u8]) -> Result<Arc<Self>, UcxError> {
        let region = Self::zeroed(contexts, data.len())?;
        // SAFETY: the region is new: no request uses it yet.
        unsafe { region.write_at(0, data)? };
        Ok(region)
    }

    /// A zero-filled region of `len` bytes mapped in every context of `contexts`: a memory file
    /// mapped twice (see [`MemRegion::alias_slice`]), or a heap allocation where the host has no
    /// memory files.
    pub fn zeroed(contexts: &[Arc<Context>], len: usize) -> Result<Arc<Self>, UcxError> {
        Self::zeroed_hot(contexts, len, len)
    }

    /// As [`MemRegion::zeroed`], with only the first `hot` bytes made resident now: the rest of a
    /// memory file is allocated on first touch (space that is rarely written, such as the
    /// private copies of sends, costs no memory until it is).
    pub fn zeroed_hot(contexts: &[Arc<Context>], len: usize, hot: usize) -> Result<Arc<Self>, UcxError> {
        let (ptr, backing) = match (len > 0).then(|| map_shared(len, hot)).flatten() {
            Some(shared) => shared,
            None => {
                let boxed: Box<[u8]> = vec![0; len].into_boxed_slice();
                // Box::into_raw never returns null.
                let ptr = NonNull::new(Box::into_raw(boxed).cast::<u8>()).unwrap_or(NonNull::dangling());
                advise_huge_pages(ptr.as_ptr(), len);
                (ptr, Backing::Heap)
            }
        };
        let mut region = Self { ptr, len, backing, maps: Vec::with_capacity(contexts.len()) };
        for ctx in contexts {
            let memh = if len == 0 { None } else { Some(region.map_in(ctx)?) };
            region.maps.push((ctx.clone(), memh));
        }
        Ok(Arc::new(region))
    }

    /// Whether `range` can be received into in place ([`MemRegion::alias_slice`]): the region has
    /// an alias, the range is not empty, starts on a page and ends on one (or at the region's end),
    /// and no part of it was poisoned.
    pub fn is_placeable(&self, range: &Range<usize>) -> bool {
        let Backing::Shared { poisoned, .. } = &self.backing else { return false };
        if self.check(range).is_err() || range.is_empty() {
            return false;
        }
        if !range.start.is_multiple_of(PAGE) || (!range.end.is_multiple_of(PAGE) && range.end != self.len) {
            return false;
        }
        let Ok(p) = poisoned.lock() else { return false };
        !p.iter().any(|q| q.start < range.end && range.start < q.end)
    }

    /// `range` of the region through its alias mapping, as a receive buffer for a receive into
    /// place: if that receive is given up while UCX still holds it, [`MemRegion::poison`] makes
    /// sure it never writes the region again.
    pub fn alias_slice(self: &Arc<Self>, range: Range<usize>) -> Result<RegionSlice, UcxError> {
        if !self.is_placeable(&range) {
            return Err(UcxError::OutOfRange { what: "placeable region range", index: range.start, len: self.len });
        }
        Ok(RegionSlice { region: self.clone(), range, alias: true })
    }

    /// Cut `range` (of an [`MemRegion::alias_slice`]) out of the alias: its pages become private
    /// throwaway memory, so that a receive into place that UCX still holds writes there, never
    /// into the region. The range is not placeable until [`MemRegion::heal`] gives it back.
    pub fn poison(&self, range: &Range<usize>) -> Result<(), UcxError> {
        let Backing::Shared { alias, map_len, poisoned, .. } = &self.backing else {
            return Err(UcxError::OutOfRange { what: "alias of a heap region", index: range.start, len: self.len });
        };
        self.check(range)?;
        let start = range.start - range.start % PAGE;
        let end = range.end.next_multiple_of(PAGE).min(*map_len);
        if start >= end {
            return Ok(());
        }
        // SAFETY: [start, end) lies inside the alias mapping (`map_len` bytes, page-aligned), which
        // this region owns; MAP_FIXED replaces exactly those pages of it and nothing else. Only
        // receives into place use the alias, and the caller gives those up.
        let p = unsafe {
            libc::mmap(
                alias.as_ptr().add(start).cast(),
                end - start,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            let err = std::io::Error::last_os_error();
            tracing::error!(target: r2ccl_core::subsys::NET, start, end, error = %err, "cannot poison an alias range");
            return Err(UcxError::OutOfRange { what: "alias range to poison", index: start, len: self.len });
        }
        if let Ok(mut q) = poisoned.lock() {
            q.push(start..end);
        }
        Ok(())
    }

    /// Give `range` back to receives into place once the receive that poisoned it is over (UCX
    /// completed it, so it writes nothing more): one poisoned entry for its pages is dropped, and
    /// the memory file is mapped back over the pages no other poisoned entry covers. Returns
    /// whether `range` was poisoned.
    pub fn heal(&self, range: &Range<usize>) -> Result<bool, UcxError> {
        let Backing::Shared { alias, map_len, fd, poisoned } = &self.backing else { return Ok(false) };
        self.check(range)?;
        let start = range.start - range.start % PAGE;
        let end = range.end.next_multiple_of(PAGE).min(*map_len);
        let Ok(mut q) = poisoned.lock() else { return Ok(false) };
        let Some(i) = q.iter().position(|p| *p == (start..end)) else { return Ok(false) };
        q.swap_remove(i);
        let mut still: Vec<Range<usize>> =
            q.iter().filter(|p| p.start < end && start < p.end).map(|p| p.start.max(start)..p.end.min(end)).collect();
        still.sort_by_key(|p| p.start);
        let mut gaps = Vec::new();
        let mut at = start;
        for p in still {
            if p.start > at {
                gaps.push(at..p.start);
            }
            at = at.max(p.end);
        }
        if at < end {
            gaps.push(at..end);
        }
        for g in gaps {
            let offset = libc::off_t::try_from(g.start).map_err(|_| UcxError::OutOfRange {
                what: "alias range to heal",
                index: g.start,
                len: self.len,
            })?;
            // SAFETY: [g.start, g.end) lies inside the alias mapping (`map_len` bytes, page-aligned),
            // which this region owns, and no receive uses it (the one that poisoned it is over, and
            // a poisoned range is never handed out); MAP_FIXED replaces exactly those pages with the
            // memory file's own, at the same offset, as the alias had them before the poison.
            let p = unsafe {
                libc::mmap(
                    alias.as_ptr().add(g.start).cast(),
                    g.end - g.start,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    fd.as_raw_fd(),
                    offset,
                )
            };
            if p == libc::MAP_FAILED {
                let err = std::io::Error::last_os_error();
                tracing::error!(target: r2ccl_core::subsys::NET, start = g.start, end = g.end, error = %err, "cannot heal an alias range: it stays out of use");
                // Whatever the failed call left there, nothing may receive into it again.
                q.push(start..end);
                return Err(UcxError::OutOfRange { what: "alias range to heal", index: g.start, len: self.len });
            }
        }
        Ok(true)
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
    ///
    /// # Safety
    /// No request may be reading or writing `offset..offset + data.len()` meanwhile (no live
    /// [`RegionSlice`] over it), and no other thread may access those bytes: the region is
    /// `Sync`, so this rule is the caller's to keep (the transport's chunk bookkeeping does).
    pub unsafe fn write_at(&self, offset: usize, data: &[u8]) -> Result<(), UcxError> {
        let end = offset.saturating_add(data.len());
        self.check(&(offset..end))?;
        // SAFETY: in bounds (checked); the region owns the memory; callers keep ranges in flight off-limits.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(offset), data.len()) };
        Ok(())
    }

    /// Copy bytes of the region at `offset` into `out`.
    ///
    /// # Safety
    /// No request and no other thread may be writing `offset..offset + out.len()` meanwhile (see
    /// [`MemRegion::write_at`]).
    pub unsafe fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<(), UcxError> {
        let end = offset.saturating_add(out.len());
        self.check(&(offset..end))?;
        // SAFETY: in bounds (checked); see write_at.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(offset), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// A copy of the whole region.
    ///
    /// # Safety
    /// No request and no other thread may be writing the region meanwhile (see
    /// [`MemRegion::write_at`]).
    pub unsafe fn to_vec(&self) -> Vec<u8> {
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
        Ok(RegionSlice { region: self.clone(), range, alias: false })
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
        match &self.backing {
            Backing::Heap => {
                // SAFETY: ptr/len came from Box::<[u8]>::into_raw in `zeroed` and are freed once,
                // after every unmap.
                drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len)) })
            }
            Backing::Shared { alias, map_len, .. } => {
                // SAFETY: both mappings were made in `map_shared` with `map_len` bytes, and no request
                // uses them any more (requests hold an Arc to the region); unmapped once. The file
                // closes with the OwnedFd.
                unsafe {
                    libc::munmap(self.ptr.as_ptr().cast(), *map_len);
                    libc::munmap(alias.as_ptr().cast(), *map_len);
                }
            }
        }
    }
}

/// A byte range of a [`MemRegion`], owning a reference to it: a send or receive buffer that carries the
/// region's memory handle for whichever NIC it is posted on.
#[derive(Clone)]
pub struct RegionSlice {
    region: Arc<MemRegion>,
    range: Range<usize>,
    /// Through the alias mapping ([`MemRegion::alias_slice`]).
    alias: bool,
}

impl fmt::Debug for RegionSlice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "RegionSlice({:?} of {} bytes{})",
            self.range,
            self.region.len,
            if self.alias { ", alias" } else { "" }
        )
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

    /// Whether this slice goes through the region's alias mapping (a receive into place).
    pub fn is_alias(&self) -> bool {
        self.alias
    }

    fn base(&self) -> *mut u8 {
        match &self.region.backing {
            Backing::Shared { alias, .. } if self.alias => alias.as_ptr(),
            _ => self.region.ptr.as_ptr(),
        }
    }
}

// SAFETY: the region's heap memory never moves and lives as long as this slice's Arc; the range is in
// bounds (checked at creation); memh returns the region's handle for that very context. Exclusive use of
// the range while a request holds the slice is the transport's chunk bookkeeping's duty (documented on
// MemRegion).
unsafe impl SendBuf for RegionSlice {
    fn as_ptr(&self) -> *const u8 {
        // SAFETY: range.start <= len (checked at creation); both mappings span len bytes.
        unsafe { self.base().add(self.range.start) }
    }
    fn byte_len(&self) -> usize {
        self.range.len()
    }
    fn memh(&self, context: &Context) -> Option<sys::ucp_mem_h> {
        // The handle describes the primary mapping; UCX finds (or needs none for) the alias's pages.
        if self.alias {
            None
        } else {
            self.region.memh(context)
        }
    }
}

// SAFETY: as for SendBuf; the memory is writable (owned heap allocation).
unsafe impl RecvBuf for RegionSlice {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        // SAFETY: range.start <= len (checked at creation); both mappings span len bytes.
        unsafe { self.base().add(self.range.start) }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]
    use super::*;

    /// Write `byte` through a receive buffer's pointer, as UCX does.
    fn write_through(slice: &mut RegionSlice, byte: u8) {
        let len = slice.byte_len();
        // SAFETY: the slice's range is in bounds of a mapping the region owns; nothing else uses it.
        unsafe { std::ptr::write_bytes(slice.as_mut_ptr(), byte, len) };
    }

    #[test]
    fn alias_writes_land_in_the_region_until_poisoned() {
        let len = 16 * PAGE;
        let region = MemRegion::zeroed(&[], len).unwrap();
        let mut a = region.alias_slice(PAGE..3 * PAGE).unwrap();
        assert!(a.is_alias());
        write_through(&mut a, 0xAB);
        let mut got = vec![0; len];
        // SAFETY: no request and no other thread uses the range now.
        unsafe { region.read_at(0, &mut got) }.unwrap();
        assert!(got[..PAGE].iter().all(|&b| b == 0));
        assert!(got[PAGE..3 * PAGE].iter().all(|&b| b == 0xAB));
        assert!(got[3 * PAGE..].iter().all(|&b| b == 0));

        // Given up: whatever the receive still writes goes to throwaway pages.
        // SAFETY: no request and no other thread uses the range now.
        unsafe { region.write_at(PAGE, &[0x11; 2 * PAGE]) }.unwrap();
        region.poison(&a.range()).unwrap();
        write_through(&mut a, 0xCD);
        // SAFETY: no request and no other thread uses the range now.
        unsafe { region.read_at(0, &mut got) }.unwrap();
        assert!(got[PAGE..3 * PAGE].iter().all(|&b| b == 0x11), "a poisoned alias range reached the region");
        assert!(!region.is_placeable(&(PAGE..3 * PAGE)));
        assert!(!region.is_placeable(&(2 * PAGE..4 * PAGE)), "overlaps the poisoned range");
        assert!(region.alias_slice(0..PAGE * 2).is_err());

        // The rest of the alias still reaches the region.
        let mut b = region.alias_slice(4 * PAGE..len).unwrap();
        write_through(&mut b, 0x77);
        // SAFETY: no request and no other thread uses the range now.
        unsafe { region.read_at(0, &mut got) }.unwrap();
        assert!(got[4 * PAGE..].iter().all(|&b| b == 0x77));
        assert!(got[3 * PAGE..4 * PAGE].iter().all(|&b| b == 0));
    }

    #[test]
    fn a_healed_range_reaches_the_region_again_except_pages_still_poisoned() {
        let len = 8 * PAGE;
        let region = MemRegion::zeroed(&[], len).unwrap();
        let mut first = region.alias_slice(0..3 * PAGE).unwrap();
        region.poison(&first.range()).unwrap();
        // Two receives overlap nowhere in practice, but poisoned entries may (page rounding): a
        // second entry over pages 2..5 (placed before the first was poisoned), poisoned too.
        region.poison(&(2 * PAGE..5 * PAGE)).unwrap();
        assert!(!region.heal(&(4 * PAGE..6 * PAGE)).unwrap(), "never poisoned");

        // The first receive is over: pages 0..2 come back; page 2 stays out (the second entry).
        assert!(region.heal(&first.range()).unwrap());
        assert!(!region.heal(&first.range()).unwrap(), "an entry heals once");
        assert!(region.is_placeable(&(0..2 * PAGE)));
        assert!(!region.is_placeable(&(0..3 * PAGE)));
        write_through(&mut first, 0x42);
        let mut got = vec![0; len];
        // SAFETY: no request and no other thread uses the range now.
        unsafe { region.read_at(0, &mut got) }.unwrap();
        assert!(got[..2 * PAGE].iter().all(|&b| b == 0x42), "healed pages write the region");
        assert!(got[2 * PAGE..].iter().all(|&b| b == 0), "a page still poisoned does not");

        // The second one is over too: everything reaches the region again.
        assert!(region.heal(&(2 * PAGE..5 * PAGE)).unwrap());
        let mut all = region.alias_slice(0..len).unwrap();
        write_through(&mut all, 0x24);
        // SAFETY: no request and no other thread uses the range now.
        unsafe { region.read_at(0, &mut got) }.unwrap();
        assert!(got.iter().all(|&b| b == 0x24));
        assert!(!MemRegion::zeroed(&[], 0).unwrap().heal(&(0..0)).unwrap(), "a heap region has no alias");
    }

    #[test]
    fn only_page_aligned_ranges_are_placeable() {
        let len = 8 * PAGE + 100;
        let region = MemRegion::zeroed(&[], len).unwrap();
        assert!(region.is_placeable(&(0..PAGE)));
        assert!(region.is_placeable(&(8 * PAGE..len)), "a range may end at the region's end");
        assert!(!region.is_placeable(&(1..PAGE)));
        assert!(!region.is_placeable(&(0..PAGE + 1)));
        assert!(!region.is_placeable(&(PAGE..PAGE)), "empty");
        assert!(!region.is_placeable(&(0..len + 1)), "out of bounds");
        let heap = MemRegion::zeroed(&[], 0).unwrap();
        assert!(!heap.is_placeable(&(0..0)));
    }
}
