//! The `Transport` trait: the seam between the session logic and a backend that moves bytes
//! (the in-memory fabric here, UCX in `r2ccl-ucx`).
//!
//! A backend is one rank's view of its node's NICs. Everything is asynchronous: posting returns
//! a [`RequestId`] at once and the outcome arrives later as a [`TransportEvent`] from
//! [`Transport::poll_event`] after [`Transport::progress`]. Every posted request ends in exactly
//! one completion (done, failed or cancelled), except requests lost in a silent fault, which
//! never complete: the layer above owns deadlines.

use crate::{MemHandle, PathId, RequestId};
use r2ccl_core::{NicId, Rank};
use std::time::Duration;

/// Why a path failed, as a backend or a detector reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PathFault {
    /// This side's NIC is down (link-state event or immediate local error).
    LocalNicDown,
    /// The endpoint reported an error (peer unreachable, connection reset).
    Endpoint,
    /// No progress before the deadline (decided by the detector, not the backend).
    Timeout,
    /// The peer or the control plane reported the failure out of band.
    Reported,
}

/// The outcome of a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CompletionKind {
    /// A send finished: the bytes reached the peer's NIC.
    Sent,
    /// A receive finished with this message (chunk header and payload).
    Received(Vec<u8>),
    /// A receive finished with a chunk header whose payload the sender sent as a message of its
    /// own ([`Transport::post_send`] of a large range): the payload waits, unreceived, until
    /// [`Transport::post_payload_recv`] receives it into place or into a buffer. The receiver
    /// must post exactly one payload receive for every `Header`.
    Header {
        /// The header bytes ([`crate::HEADER_LEN`] of them when the sender is well-formed).
        header: Vec<u8>,
        /// Names the waiting payload for [`Transport::post_payload_recv`].
        payload: PayloadId,
    },
    /// A payload receive into a region ([`PayloadInto::Region`]) finished: the bytes are in place.
    Placed,
    /// A zero-byte probe got its answer.
    ProbeOk,
    /// The request failed on its path.
    Failed(PathFault),
    /// The request was cancelled before it finished.
    Cancelled,
}

/// The completion of one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The request.
    pub req: RequestId,
    /// The path it was posted on.
    pub path: PathId,
    /// What happened.
    pub kind: CompletionKind,
}

/// Something the backend reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TransportEvent {
    /// A request finished.
    Completion(Completion),
    /// An endpoint error on a path, independent of any one request (UCX's error callback).
    PathError {
        /// The path.
        path: PathId,
        /// What kind of failure.
        fault: PathFault,
    },
    /// A local NIC's link went down or came back (netlink on Linux).
    LinkState {
        /// The NIC.
        nic: NicId,
        /// Whether it is up now.
        up: bool,
    },
    /// A message that arrived on `path` while no receive was posted there (a path the session does
    /// not listen on yet), taken out of the backend's own queue so that nothing waits there without
    /// bound. Handled as a completed receive on `path` ([`CompletionKind::Received`] or
    /// [`CompletionKind::Header`]), with no request of the session's behind it.
    Unsolicited {
        /// The path it came on.
        path: PathId,
        /// What arrived.
        kind: CompletionKind,
    },
}

/// A payload that waits for its receive, announced by [`CompletionKind::Header`]. Opaque: only the
/// backend that made it knows what it means.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PayloadId(pub u64);

/// Where [`Transport::post_payload_recv`] puts a payload.
#[derive(Debug, PartialEq, Eq)]
pub enum PayloadInto {
    /// Straight into `len` bytes at `offset` of a registered region (no copy); completes with
    /// [`CompletionKind::Placed`]. Until that request's completion (whatever its kind) the backend
    /// may write those bytes; after it, never again.
    Region {
        /// The region.
        region: MemHandle,
        /// Where in it.
        offset: usize,
        /// Payload bytes expected.
        len: usize,
    },
    /// Into a buffer after `header` (at most `capacity` payload bytes); completes with
    /// [`CompletionKind::Received`] of the header followed by the payload, as a whole message.
    Buffer {
        /// The header bytes of the [`CompletionKind::Header`] (handed back).
        header: Vec<u8>,
        /// Most payload bytes accepted.
        capacity: usize,
    },
}

/// Why a backend refused a call. Failures of the network itself are completions or events, not
/// errors: an error here means the call was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    /// The rank is not part of the fabric.
    #[error("{0} is not part of this fabric")]
    UnknownRank(Rank),
    /// The NIC is not one of this rank's node's NICs.
    #[error("{nic} is not a NIC of {rank}'s node")]
    NotLocalNic {
        /// The NIC named as local.
        nic: NicId,
        /// The rank posting.
        rank: Rank,
    },
    /// The remote NIC is not a NIC of the peer's node.
    #[error("{nic} is not a NIC of {peer}'s node")]
    NotPeerNic {
        /// The NIC named as remote.
        nic: NicId,
        /// The peer.
        peer: Rank,
    },
    /// The memory handle is unknown or belongs to another rank.
    #[error("memory handle {0:?} is not registered by this rank")]
    UnknownHandle(MemHandle),
    /// The byte range lies outside the registered region.
    #[error("bytes {offset}..{offset}+{len} lie outside a region of {size} bytes")]
    OutOfBounds {
        /// Start of the range.
        offset: usize,
        /// Length of the range.
        len: usize,
        /// Size of the region.
        size: usize,
    },
    /// The request is not outstanding (unknown or already completed).
    #[error("request {0:?} is not outstanding")]
    UnknownRequest(RequestId),
    /// The payload is unknown to this backend (or this backend never splits messages).
    #[error("payload {0:?} is not waiting for a receive")]
    UnknownPayload(PayloadId),
    /// The bytes cannot take a payload in place ([`Transport::can_place`] says no).
    #[error("bytes {offset}..{offset}+{len} of {handle:?} cannot take a payload in place")]
    NotPlaceable {
        /// The region.
        handle: MemHandle,
        /// Start of the range.
        offset: usize,
        /// Length of the range.
        len: usize,
    },
    /// [`Transport::region_pair`] was given one region twice, or the backend cannot lend two.
    #[error("regions {src:?} and {dst:?} cannot be lent at once")]
    NoRegionPair {
        /// The region to read.
        src: MemHandle,
        /// The region to write.
        dst: MemHandle,
    },
}

/// What the layer below a transport knows about a path's liveness ([`Transport::path_evidence`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathEvidence {
    /// Nothing conclusive (no bytes in flight, no such layer, or mixed signs).
    Unknown,
    /// Something on the path was acknowledged recently and nothing is stuck: the path carries.
    Acking,
    /// Bytes in flight on the path have had no acknowledgement for the quiet time: it is dead.
    Silent,
}

/// One rank's access to its node's NICs.
///
/// Registration is node-wide: a region is registered with every NIC at once and its one
/// [`MemHandle`] is valid on all of them, so a migration never registers anything. Data and
/// probes use separate endpoints, so a probe never queues behind data.
pub trait Transport {
    /// The rank this transport serves.
    fn rank(&self) -> Rank;

    /// The NICs of this rank's node, by rail.
    fn local_nics(&self) -> Vec<NicId>;

    /// Allocates a region of `len` zeroed bytes and registers it on all local NICs.
    fn register(&mut self, len: usize) -> Result<MemHandle, TransportError>;

    /// As [`Transport::register`], but only the first `hot` bytes need be backed by memory now;
    /// the rest may be allocated on first touch (space that is rarely written). The default
    /// backs everything.
    fn register_hot(&mut self, len: usize, hot: usize) -> Result<MemHandle, TransportError> {
        let _ = hot;
        self.register(len)
    }

    /// Deregisters a region from every NIC and frees it.
    fn deregister(&mut self, handle: MemHandle) -> Result<(), TransportError>;

    /// The bytes of a registered region.
    fn region(&self, handle: MemHandle) -> Result<&[u8], TransportError>;

    /// The bytes of a registered region, writable.
    fn region_mut(&mut self, handle: MemHandle) -> Result<&mut [u8], TransportError>;

    /// The bytes of two different regions at once, `src` to read and `dst` to write (a copy or
    /// a reduction from one into the other without a bounce buffer). The default lends none
    /// ([`TransportError::NoRegionPair`]); callers then copy through a buffer.
    fn region_pair(&mut self, src: MemHandle, dst: MemHandle) -> Result<(&[u8], &mut [u8]), TransportError> {
        Err(TransportError::NoRegionPair { src, dst })
    }

    /// Whether a send this backend still runs (posted, or given up but not ended, as UCX 1.13
    /// sends cannot be stopped) may read bytes `offset..offset + len` of `handle`. The default
    /// says no: a backend that copies a send's bytes when it is posted never reads them later.
    fn reads_region(&self, handle: MemHandle, offset: usize, len: usize) -> bool {
        let _ = (handle, offset, len);
        false
    }

    /// Posts a send on `path` of `header` followed by `len` bytes at `offset` of `src`. The
    /// region's bytes must stay unchanged until the send completes: a backend may read them from
    /// the region while the send is in flight (UCX does, for large ranges). It may send the
    /// header and the payload as two messages; the receiving backend then reports a
    /// [`CompletionKind::Header`] first.
    fn post_send(
        &mut self,
        now: Duration,
        path: PathId,
        header: &[u8],
        src: MemHandle,
        offset: usize,
        len: usize,
    ) -> Result<RequestId, TransportError>;

    /// Posts a receive for one message of at most `capacity` bytes arriving on `path`.
    fn post_recv(&mut self, now: Duration, path: PathId, capacity: usize) -> Result<RequestId, TransportError>;

    /// Receives the payload that a [`CompletionKind::Header`] announced, on the path the header
    /// came on, into `into`. The default refuses: a backend that never reports `Header` needs none.
    fn post_payload_recv(
        &mut self,
        now: Duration,
        path: PathId,
        payload: PayloadId,
        into: PayloadInto,
    ) -> Result<RequestId, TransportError> {
        let _ = (now, path, into);
        Err(TransportError::UnknownPayload(payload))
    }

    /// Whether a payload may be received straight into `len` bytes at `offset` of `region`
    /// ([`PayloadInto::Region`]); the session receives into a buffer otherwise. The default says
    /// yes; a backend says no for bytes it could not protect from a receive it has to give up.
    fn can_place(&self, region: MemHandle, offset: usize, len: usize) -> bool {
        let _ = (region, offset, len);
        true
    }

    /// Posts a zero-byte probe on the probe endpoint of `path`; completes with
    /// [`CompletionKind::ProbeOk`] when the peer's NIC answered.
    fn post_probe(&mut self, now: Duration, path: PathId) -> Result<RequestId, TransportError>;

    /// What the layer below says about `path` (the kernel's TCP state of its connections, say):
    /// [`PathEvidence::Silent`] when bytes in flight on it have had no acknowledgement for at
    /// least `quiet`, while nothing on it was acknowledged within `quiet`. A stall detector may
    /// then declare the path failed without waiting for its probe's timeout. The default knows
    /// nothing.
    fn path_evidence(&mut self, now: Duration, path: PathId, quiet: Duration) -> PathEvidence {
        let _ = (now, path, quiet);
        PathEvidence::Unknown
    }

    /// Cancels one outstanding request; it completes with [`CompletionKind::Cancelled`] (or with
    /// its real outcome if it had already finished). A payload receive into a region completes only
    /// once the backend can no longer write the region (it may close the path's connection to
    /// make sure).
    fn cancel(&mut self, now: Duration, req: RequestId) -> Result<(), TransportError>;

    /// Cancels every outstanding data request (sends and receives) of this rank on `path`;
    /// returns how many were cancelled. Probes are left alone.
    fn cancel_path(&mut self, now: Duration, path: PathId) -> usize;

    /// Lets the backend make progress up to time `now`.
    fn progress(&mut self, now: Duration);

    /// The next event, if any is ready.
    fn poll_event(&mut self) -> Option<TransportEvent>;

    /// When the backend next has something to report without new input (`None`: unknown or
    /// never). A simulated backend knows; a real one returns `None`.
    fn poll_timeout(&self) -> Option<Duration>;

    /// Hand back the buffer of a [`CompletionKind::Received`] once its bytes were used, so the
    /// backend can receive into it again instead of allocating (and page-faulting) a fresh one.
    fn recycle(&mut self, buf: Vec<u8>) {
        drop(buf);
    }
}
