//! The buffer of a UCX data request ([`DataBuf`]) and the memory contract it keeps with UCX. Part
//! of [`super::UcxTransport`].

use crate::memory::RegionSlice;
use crate::request::{RecvBuf, SendBuf};

/// The buffer of a data request: a staging or receive buffer, a range of a registered region (a
/// split payload, sent or received in place), or a buffer holding a header with the payload received
/// after it.
#[derive(Debug)]
pub(super) enum DataBuf {
    Owned(Vec<u8>),
    Region(RegionSlice),
    /// `.0[..=.1]` holds the header; the payload lands after it.
    After(Vec<u8>, usize),
}

// SAFETY: each variant's bytes are heap memory owned by the value (the Vecs) or kept alive by it (the
// region's Arc), at addresses that do not move with the value; `After` only hands out its tail.
unsafe impl SendBuf for DataBuf {
    fn as_ptr(&self) -> *const u8 {
        match self {
            Self::Owned(v) | Self::After(v, _) => v.as_ptr(),
            Self::Region(r) => r.as_ptr(),
        }
    }
    fn byte_len(&self) -> usize {
        match self {
            Self::Owned(v) | Self::After(v, _) => v.len(),
            Self::Region(r) => r.byte_len(),
        }
    }
    fn memh(&self, context: &crate::context::Context) -> Option<r2ccl_ucx_sys::ucp_mem_h> {
        match self {
            Self::Region(r) => r.memh(context),
            Self::Owned(_) | Self::After(..) => None,
        }
    }
    unsafe fn on_received(&mut self, n: usize) {
        match self {
            // SAFETY: forwarded under the same contract.
            Self::Owned(v) => unsafe { v.on_received(n) },
            Self::After(v, at) => {
                // SAFETY: UCX wrote n <= capacity - at bytes from `at` (the posted capacity), and
                // 0..at already held the header.
                unsafe { v.set_len(*at + n) }
            }
            Self::Region(_) => {}
        }
    }
}

// SAFETY: as for SendBuf; `After` receives into its spare capacity past the header only.
unsafe impl RecvBuf for DataBuf {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        match self {
            Self::Owned(v) => v.as_mut_ptr(),
            // SAFETY: at <= len <= capacity.
            Self::After(v, at) => unsafe { v.as_mut_ptr().add(*at) },
            Self::Region(r) => r.as_mut_ptr(),
        }
    }
    fn recv_capacity(&self) -> usize {
        match self {
            Self::Owned(v) => v.capacity(),
            Self::After(v, at) => v.capacity() - *at,
            Self::Region(r) => r.byte_len(),
        }
    }
}
