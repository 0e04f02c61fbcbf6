//! r2ccl-ucx: the UCX backend foundation of r2ccl: safe, RAII wrappers over UCP for multi-NIC transfers.
//!
//! What it does:
//! - [`Context`]: one UCP context per NIC, restricted to it (`NET_DEVICES`), TCP only and keepalive-tuned
//!   through `ucp_config_modify` (never the process environment), with the TAG feature.
//! - [`Worker`]: progress, address export, tagged receives; every UCX call on a worker is serialized by its
//!   lock. [`Endpoint`]: to a peer worker, `UCP_ERR_HANDLING_MODE_PEER`, with an error callback that records
//!   the failure for the owning path.
//! - [`Request`]: tagged send/receive (`*_nbx`) owning its buffer until UCX releases it; completion, cancel,
//!   and waits with deadlines ([`Request::wait`], [`wait_all`]) — TCP never reports local drops, so every wait
//!   needs one.
//! - [`MemRegion`]: memory mapped in every NIC's context at once; [`RegionSlice`] buffers.
//! - [`Rail`] / [`NicEndpointSet`]: one context+worker per NIC, a data and a separate probe endpoint per peer
//!   per NIC.
//!
//! What it does not do: no chunking, striping, replay or migration (r2ccl-transport's session logic), no
//! netlink link monitoring and no software fault injection yet, no bootstrap (worker addresses are
//! exchanged by the caller), no GPU memory.

mod context;
mod endpoint;
mod error;
mod memory;
mod rail;
mod request;
mod worker;

pub use context::{Context, ContextConfig, KeepAlive};
pub use endpoint::Endpoint;
pub use error::{Status, UcxError};
pub use memory::{MemRegion, RegionSlice};
pub use rail::{probe_seq, NicEndpointSet, PeerEndpoints, Rail, PROBE_TAG_BIT};
pub use request::{wait_all, Pending, RecvBuf, Request, SendBuf, CANCEL_GRACE};
pub use worker::{Worker, WorkerAddress};

/// The UCX library version this process runs with, as `major.minor.release`.
pub fn ucx_version() -> (u32, u32, u32) {
    let (mut major, mut minor, mut release) = (0u32, 0u32, 0u32);
    // SAFETY: ucp_get_version only writes the three integers.
    unsafe { r2ccl_ucx_sys::ucp_get_version(&mut major, &mut minor, &mut release) };
    (major, minor, release)
}
