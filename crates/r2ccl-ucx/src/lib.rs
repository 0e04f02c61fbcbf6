//! r2ccl-ucx: the UCX backend foundation of r2ccl: safe, RAII wrappers over UCP for multi-NIC transfers.
//!
//! What it does:
//! - [`Context`]: one UCP context per NIC, restricted to it (`NET_DEVICES`), TCP only (keepalive tunable, UCX defaults by default)
//!   through `ucp_config_modify` (never the process environment), with the TAG and WAKEUP features.
//! - [`Worker`]: progress, a listener on its NIC's IP address (its [`WorkerAddress`]; progress accepts
//!   peers' connections, only those presenting an admitted endpoint id once [`Worker::admit_only`]
//!   is set), tagged receives, and a look into UCX's unexpected queue
//!   ([`Worker::peek_unexpected`], [`Worker::take_unexpected`]); every UCX call on a worker is
//!   serialized by its lock.
//!   [`Endpoint`]: to a peer worker's listener (one point-to-point TCP socket), `UCP_ERR_HANDLING_MODE_PEER`, with an error callback that records
//!   the failure for the owning path.
//! - [`Request`]: tagged send/receive (`*_nbx`) owning its buffer until UCX releases it; completion, cancel,
//!   and waits with deadlines ([`Request::wait`], [`wait_all`]) — TCP never reports local drops, so every wait
//!   needs one.
//! - [`MemRegion`]: memory mapped in every NIC's context at once; [`RegionSlice`] buffers.
//! - [`Rail`] / [`NicEndpointSet`]: one context+worker per NIC, a data and a separate probe endpoint per peer
//!   per NIC.
//!
//! - [`UcxTransport`]: `r2ccl_transport::Transport` for one rank over those rails: address blobs to
//!   exchange through the bootstrap ([`UcxTransport::local_address_blob`], [`UcxTransport::connect_peers`]),
//!   node-wide registration, sends/receives/probes as UCX tagged requests, probe-and-reply answered by the
//!   peer's progress, endpoint errors as `PathError`, netlink link state as `LinkState` (a local NIC going
//!   down fails its requests at once with `LocalNicDown`), the kernel's TCP evidence on a path
//!   (`Transport::path_evidence`: `TCP_INFO` of this process's sockets between the two NICs' IPs),
//!   listeners that admit only the communicator's endpoint ids ([`UcxTransportConfig::endpoints`]),
//!   sweeps of the workers' unexpected queues (what no receive would take is dropped, headers on
//!   paths the session does not listen on go to it as unsolicited; [`UcxTransport::sweep_stats`]),
//!   and `R2CCL_FAULT` software fault injection.
//! - [`LinkMonitor`]: a non-blocking `NETLINK_ROUTE` socket for link-state changes.
//!
//! # `R2CCL_FAULT`
//! Software fault injection for machines without root (also in `docs/faults.md`). Read only by
//! [`UcxTransportConfig::with_env_faults`]; parse with [`parse_faults`]. Specs separated by `;`, fields
//! by `,`:
//!
//! | field | meaning |
//! |---|---|
//! | `rank=N` or `rank=*` | which rank injects (default every rank) |
//! | `nic=N` | the rank's local NIC (rail index) that fails; required |
//! | `after_bytes=SIZE` | fire once SIZE bytes went through that NIC (sent + received; `64M`, `4KiB`, binary) |
//! | `after_msgs=N` | fire once N messages were posted on that NIC |
//! | `after_ms=N` | fire N ms after `connect_peers` |
//! | `for_ms=N` | heal N ms after firing (a flap); default: the fault stays |
//! | `kind=down` | link down: outstanding and new requests fail at once (`LocalNicDown`), `LinkState` down event |
//! | `kind=blackhole` | silent: requests on the NIC never complete, no error, no event, probes unanswered |
//! | `kind=slow:F` | every send on the NIC takes `1/F` times as long to complete (0 < F <= 1): its egress at about `F` of its speed; receives, posted ahead of their data, are not delayed |
//!
//! No trigger means "at connect". Several triggers: the first reached fires. Example:
//! `R2CCL_FAULT="rank=1,nic=0,after_bytes=64M,kind=down; rank=*,nic=1,after_ms=500,for_ms=200,kind=blackhole"`.
//! A black hole is local to the injecting rank: a peer's eager sends to it still complete, so inject it on
//! the sending rank (or `rank=*`). Invalid specs are refused with an error naming the spec and the field.
//!
//! What it does not do: no chunking, striping, replay or migration (r2ccl-transport's session logic), no
//! deadlines or stall detection (the layer above owns them; a black hole is silent here too), no
//! bootstrap (the caller ships the address blobs), no cross-rail endpoints (rail `i` connects to the
//! peer's rail `i` only), no GPU memory. A chunk under 64 KiB is sent from a staging copy; a larger one
//! as its header and then its payload straight from the registered region (see `transport`).

mod context;
mod endpoint;
mod error;
mod fault;
mod memory;
mod netlink;
mod pool;
mod rail;
mod request;
mod sockaddr;
#[doc(hidden)]
pub mod stranger;
mod tcpinfo;
mod transport;
mod worker;

pub use context::{Context, ContextConfig, KeepAlive, UcxVersion, ALLOW_MISMATCH_ENV, DEFAULT_RX_SEGMENT};
pub use endpoint::Endpoint;
pub use error::{Status, UcxError};
pub use fault::{parse_faults, FaultKind, FaultParseError, FaultSpec};
pub use memory::{MemRegion, RegionSlice};
pub use netlink::{ifindex, is_running, parse_link_messages, LinkChange, LinkMonitor};
pub use rail::{probe_seq, NicEndpointSet, PeerEndpoints, Rail, PROBE_TAG_BIT};
pub use request::{wait_all, Pending, RecvBuf, Request, SendBuf, CANCEL_GRACE};
pub use transport::{
    parse_address_blob, EndpointAuth, FiredFault, SweepStats, UcxTransport, UcxTransportConfig, UcxTransportError,
    FAULT_ENV,
};
pub use worker::{Unexpected, Worker, WorkerAddress, DEFAULT_MAX_ACCEPTED};

/// The UCX library version this process runs with, as `major.minor.release`.
pub fn ucx_version() -> (u32, u32, u32) {
    let (mut major, mut minor, mut release) = (0u32, 0u32, 0u32);
    // SAFETY: ucp_get_version only writes the three integers.
    unsafe { r2ccl_ucx_sys::ucp_get_version(&mut major, &mut minor, &mut release) };
    (major, minor, release)
}
