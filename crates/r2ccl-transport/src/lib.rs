//! r2ccl-transport: multi-rail transport session logic and the backend seam.
//!
//! What it does:
//! - [`Transport`]: the trait a backend implements (node-wide memory registration, sends and
//!   receives of identified chunks on a chosen path, zero-byte probes on separate endpoints,
//!   cancellation, progress, completions, path errors, link-state events).
//! - [`Session`]: one rank's sans-IO session logic: chunk identity and the versioned
//!   [`ChunkHeader`] wire format, weighted [`stripe`]-ing of a transfer over NICs, per-path
//!   in-flight tracking, the receiver's delivery record (duplicate-free: a chunk is applied at
//!   most once, copied or, for a reducing receive, reduced into place with r2ccl-core's
//!   kernels; malformed, misrouted and unknown-collective chunks are counted and refused),
//!   live migration (quiesce a failed path, replay from an agreed boundary on the next path of
//!   a locality-ordered backup chain) and fail-back when a better path is usable again.
//! - [`migrate`]: the lane migration protocol (the spec's FAILOVER_REQ / FAILOVER_ACK, epoch
//!   numbered, keyed by lane), a table-driven machine per lane on the sender
//!   ([`migrate::TRANSITIONS`]) and the receiver's answer; every control plane (the facade's
//!   engine, [`harness::Harness`]) runs it.
//! - [`MemFabric`]: a deterministic in-memory backend (N ranks x K NICs, simulated clock,
//!   per-NIC bandwidth, fault injection: NIC down, link down, black hole, slow NIC, delay).
//! - [`harness::Harness`]: a test driver that runs sessions over the fabric with an instant
//!   control plane (the [`migrate`] machines with messages delivered at once) and a simple stall
//!   detector, for this crate's tests and the layers above.
//!
//! What it does not do: no real network IO, clocks or threads (time comes in as `now`); no
//! failure detection or localization (that is `r2ccl-detect`; the session reports path failures
//! as outputs and takes migrations as inputs); no message transport for the migration protocol
//! (the caller carries [`migrate::MigrateReq`] and [`migrate::MigrateAck`] over its control
//! channel); no UCX (that is `r2ccl-ucx`); no collective algorithms.
//!
//! Invariants: a replay boundary is never ahead of the sender's completed prefix nor of what
//! the receiver holds (both checked, refused with an error); a source region is never read
//! after its transfer is released; decoding never panics on any bytes.

mod chunkset;
pub mod fabric;
pub mod harness;
mod ids;
pub mod migrate;
pub mod script;
mod session;
mod stripe;
mod topology;
mod transport;
pub mod wire;

pub use chunkset::ChunkSet;
pub use fabric::{FabricConfig, FabricPort, FaultAction, MemFabric, NicStats};
pub use ids::{ChunkId, CommId, LaneId, MemHandle, PathId, RequestId, TransferKey};
pub use session::{
    transfer_chunk_size, ArgDigest, Buffer, ChunkProblem, LaneInfo, MigrationRequest, MoveReason, PathActivity,
    Session, SessionConfig, SessionError, SessionEvent, SessionStats, MIN_STRIPE_CHUNK,
};
pub use stripe::{chunk_count, chunk_len, stripe, stripe_wide, Striper};
pub use topology::{Topology, TopologyError};
pub use transport::{
    Completion, CompletionKind, PathEvidence, PathFault, PayloadId, PayloadInto, Transport, TransportError,
    TransportEvent,
};
pub use wire::{ChunkHeader, HeaderKey, HeaderMac, WireError, HEADER_LEN};
