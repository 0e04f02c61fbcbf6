//! Session logic of one rank (sans-IO): sender lanes with striping, windows and replay, the
//! receiver's delivery record, path state, migration and fail-back.
//!
//! The session never decides that a path is dead on its own clock: failures come in as
//! transport events (error completions, endpoint errors, link state) or as
//! [`Session::handle_path_down`] from a detector. On a failure it quiesces the path (stops
//! posting, cancels its requests) and emits [`SessionEvent::MigrationNeeded`] per lane with
//! the sender's completed prefix; the control plane agrees on the boundary with the receiver
//! ([`Session::held`]) and calls [`Session::handle_migrate`] (sender) and
//! [`Session::handle_peer_migrate`] (receiver).

use crate::stripe::{chunk_count, chunk_len, Striper};
use crate::transport::{Completion, CompletionKind, PayloadId, PayloadInto};
use crate::wire::{ChunkHeader, HeaderKey, HeaderMac, WireError, FLAG_REPLAY, HEADER_LEN};
use crate::{
    ChunkId, ChunkSet, CommId, LaneId, MemHandle, PathFault, PathId, RequestId, Topology, TransferKey, Transport,
    TransportError, TransportEvent,
};
use r2ccl_core::kernels::reduce_bytes;
use r2ccl_core::subsys::NET;
use r2ccl_core::{DType, NicId, NodeId, Rank, ReduceOp};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

mod args;
mod drive;
pub use args::ArgDigest;
mod paths;

/// A byte range of a registered region: the source or destination of a transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Buffer {
    /// The region.
    pub region: MemHandle,
    /// First byte.
    pub offset: usize,
    /// Length in bytes.
    pub len: u64,
}

/// A cheap fingerprint of a chunk's bytes (64 sampled words), for TRACE logs that follow a chunk
/// from its sender's region to its receiver's.
fn fingerprint(b: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let step = (b.len() / 64).max(8);
    for w in b.chunks(8).step_by(step / 8).take(64) {
        for &x in w {
            h = (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h ^ b.len() as u64
}

/// The smallest chunk a transfer is cut into so that it stripes over several NICs (a
/// configured chunk size below it is used as is).
pub const MIN_STRIPE_CHUNK: u32 = 64 * 1024;

/// Bytes per chunk of a transfer of `len` bytes from a node with `sender_nics` NICs: the
/// configured `chunk_size`, halved (not below [`MIN_STRIPE_CHUNK`]) until the transfer has at
/// least two chunks per NIC, so that a transfer of a few chunks still stripes over every NIC.
pub fn transfer_chunk_size(chunk_size: u32, len: u64, sender_nics: usize) -> u32 {
    let mut chunk = chunk_size;
    while chunk / 2 >= MIN_STRIPE_CHUNK && u64::from(chunk_count(len, chunk)) < 2 * sender_nics as u64 {
        chunk /= 2;
    }
    chunk
}

/// Tunables of a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionConfig {
    /// Bytes per chunk (the unit of transfer and of replay); both ends must use the same value.
    /// A transfer too short to give every NIC two chunks uses a smaller one (see
    /// [`MIN_STRIPE_CHUNK`]).
    pub chunk_size: u32,
    /// Chunks in flight per lane.
    pub window: u32,
    /// Receives kept posted per listened path.
    pub recv_depth: u32,
    /// Bytes of the buffers holding chunks that arrived before their transfer was expected, kept
    /// until it is (whole buffers are counted, not only their payload, so memory stays bounded).
    pub max_early_bytes: usize,
    /// Most chunks kept that way (so header-only chunks are bounded too).
    pub max_early_chunks: usize,
    /// How many finished receive transfers are remembered, so late replays count as duplicates.
    pub retired_memory: usize,
    /// Receive the payload of a split chunk ([`crate::CompletionKind::Header`]) straight into the
    /// destination of a copying receive, instead of into a buffer it is then copied from, where
    /// the backend can take it ([`Transport::can_place`]). On by default. A backend must make
    /// sure that a receive into place it gives up never writes the destination again: on TCP such
    /// a receive can still be written by bytes that were in flight when a link comes back
    /// (measured: a flapping NIC under `cargo xtask bench` corrupted a later collective), and UCX
    /// 1.13 cannot cancel a receive that matched; the UCX backend receives into place through a
    /// second mapping of the region and unmaps the given-up range from it.
    pub place_payloads: bool,
}

impl Default for SessionConfig {
    fn default() -> Self {
        Self {
            chunk_size: 64 * 1024,
            window: 8,
            recv_depth: 8,
            max_early_bytes: 64 << 20,
            max_early_chunks: 4096,
            retired_memory: 4096,
            place_payloads: true,
        }
    }
}

/// Why the session refused a call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    /// A configuration value is out of range.
    #[error("invalid session configuration: {0} must be at least 1")]
    InvalidConfig(&'static str),
    /// The rank is not in the topology.
    #[error("{0} is not in the topology")]
    UnknownRank(Rank),
    /// The transfer's sender (for sends) or receiver (for receives) is not this rank.
    #[error("transfer {key} does not belong to {me} in this role")]
    WrongRank {
        /// The transfer.
        key: TransferKey,
        /// This rank.
        me: Rank,
    },
    /// The communicator is not open on this session.
    #[error("communicator {0:?} is not open")]
    CommNotOpen(CommId),
    /// The transfer is already active.
    #[error("transfer {0} is already active")]
    DuplicateTransfer(TransferKey),
    /// A send's source was to move while chunks of it were still being sent.
    #[error("send {0} still has chunks in flight: its source cannot move")]
    SendBusy(TransferKey),
    /// A send's new source is not as long as the transfer.
    #[error("send {key} is {want} bytes: its source cannot move to {len} bytes")]
    RebaseLength {
        /// The send.
        key: TransferKey,
        /// Length of the new source.
        len: u64,
        /// Length of the transfer.
        want: u64,
    },
    /// A reducing receive whose length or chunks do not hold whole elements.
    #[error("transfer {key} of {len} bytes cannot be reduced as {dtype:?} (not whole elements)")]
    Misaligned {
        /// The transfer.
        key: TransferKey,
        /// Its length.
        len: u64,
        /// The element type.
        dtype: DType,
    },
    /// One weight per local NIC is needed.
    #[error("{got} striping weights for {nics} local NICs")]
    WeightCount {
        /// Weights given.
        got: usize,
        /// Local NICs.
        nics: usize,
    },
    /// Every NIC has weight zero, or every NIC of the node is down.
    #[error("no usable NIC to stripe transfer {0} over")]
    NoUsableNic(TransferKey),
    /// No path to the peer is usable for a lane.
    #[error("no usable path for {0}")]
    NoPath(LaneId),
    /// The transfer is longer than 2^32 chunks.
    #[error("transfer of {len} bytes has more than 2^32 chunks")]
    TooLarge {
        /// Length in bytes.
        len: u64,
    },
    /// The lane does not exist.
    #[error("{0} does not exist")]
    UnknownLane(LaneId),
    /// The transfer does not exist (or is no longer remembered).
    #[error("transfer {0} is unknown")]
    UnknownTransfer(TransferKey),
    /// A migration was requested for a lane that is still posting.
    #[error("{0} is not quiesced")]
    LaneNotQuiesced(LaneId),
    /// A move was requested for a lane that is quiesced already.
    #[error("{0} is quiesced already")]
    LaneNotActive(LaneId),
    /// A chunk range outside the transfer.
    #[error("chunk range {start}..{end} outside transfer {key} of {chunks} chunks")]
    BadRange {
        /// The transfer.
        key: TransferKey,
        /// Range start.
        start: u32,
        /// Range end.
        end: u32,
        /// Chunks in the transfer.
        chunks: u32,
    },
    /// The path is marked down.
    #[error("path {0} is down")]
    PathDown(PathId),
    /// The path does not start at this rank's node or does not lead to the right peer.
    #[error("path {path} cannot serve this transfer")]
    ForeignPath {
        /// The path.
        path: PathId,
    },
    /// The sender was asked to replay from beyond what it completed.
    #[error("boundary {boundary} of {lane} is ahead of the sender's completed prefix {sender_done}")]
    BoundaryAhead {
        /// The lane.
        lane: LaneId,
        /// The boundary asked for.
        boundary: u32,
        /// The lane's completed prefix.
        sender_done: u32,
    },
    /// The receiver was told a boundary beyond what it really holds.
    #[error("boundary {boundary} of {key} is ahead of what the receiver holds ({held})")]
    BoundaryAheadOfReceiver {
        /// The transfer.
        key: TransferKey,
        /// The boundary.
        boundary: u32,
        /// End of the held prefix.
        held: u32,
    },
    /// The backend refused a call.
    #[error(transparent)]
    Transport(#[from] TransportError),
}

/// Why a lane must move.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoveReason {
    /// Its path failed.
    Failure(PathFault),
    /// A better path (usually the primary) is usable again.
    Failback,
}

/// A lane that stopped posting and waits for the control plane to agree on its replay boundary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MigrationRequest {
    /// The lane.
    pub lane: LaneId,
    /// The path it was on.
    pub from: PathId,
    /// The lane's chunk range.
    pub start: u32,
    /// End of the lane's chunk range.
    pub end: u32,
    /// The sender's completed prefix: every chunk in `start..sender_done` completed.
    pub sender_done: u32,
    /// Why.
    pub reason: MoveReason,
}

/// What was wrong with a received chunk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChunkProblem {
    /// The header did not decode.
    Malformed(WireError),
    /// The header names other ranks than the path's.
    Misrouted {
        /// Sender named in the header.
        src: Rank,
        /// Receiver named in the header.
        dst: Rank,
    },
    /// The communicator is not open here.
    UnknownCollective(CommId),
    /// The header disagrees with the expected transfer (length, index, chunk size).
    Mismatch(ChunkId),
    /// The chunk came before its transfer was expected and the early buffer is full.
    Unexpected(ChunkId),
    /// The sender called the collective with other arguments than this rank
    /// ([`Session::set_args`]).
    ArgsDiffer {
        /// The collective.
        seq: u64,
        /// The sender.
        from: Rank,
        /// The sender's digest (the header's).
        theirs: u32,
        /// This rank's digest for that sender.
        mine: u32,
    },
}

/// Something the session reports to the layer above.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SessionEvent {
    /// Every chunk of a send completed (reported once; the source must stay until released).
    SendComplete(TransferKey),
    /// Every chunk of a receive arrived and was applied.
    RecvComplete(TransferKey),
    /// A path was marked down (both directions).
    PathFailed {
        /// The path.
        path: PathId,
        /// Why.
        fault: PathFault,
    },
    /// One of this node's NICs changed link state (to broadcast as a hot-repair notice).
    LocalNic {
        /// The NIC.
        nic: NicId,
        /// Whether it is up.
        up: bool,
    },
    /// A lane is quiesced and needs a boundary and a new path.
    MigrationNeeded(MigrationRequest),
    /// A better path is usable for an active lane (fail-back candidate).
    BetterPath {
        /// The lane.
        lane: LaneId,
        /// The path it could use.
        path: PathId,
    },
    /// A probe finished.
    ProbeDone {
        /// The probe request.
        req: RequestId,
        /// Its path.
        path: PathId,
        /// Whether the peer answered (false: the probe failed locally).
        ok: bool,
    },
    /// A received chunk was refused (counted in the stats as well).
    BadChunk {
        /// The path it came on.
        path: PathId,
        /// What was wrong.
        problem: ChunkProblem,
    },
}

/// Counters of one session.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SessionStats {
    /// Chunk sends posted (first sends and replays).
    pub chunks_posted: u64,
    /// Chunk sends posted as replays.
    pub chunks_replayed: u64,
    /// Chunk sends completed.
    pub chunks_sent: u64,
    /// Chunks applied to a destination (each chunk of a transfer at most once).
    pub chunks_applied: u64,
    /// Payload bytes applied.
    pub bytes_applied: u64,
    /// Chunks received again after they were applied (not applied twice).
    pub duplicates: u64,
    /// Messages whose header did not decode.
    pub malformed: u64,
    /// Chunks whose header names other ranks than their path.
    pub misrouted: u64,
    /// Chunks of communicators not open here.
    pub unknown_collective: u64,
    /// Chunks whose header disagrees with the expected transfer.
    pub mismatched: u64,
    /// Chunks whose sender called their collective with other arguments ([`Session::set_args`]).
    pub args_differ: u64,
    /// Chunks kept because they came before their transfer was expected.
    pub early_stashed: u64,
    /// Early chunks dropped because the early buffer was full.
    pub early_dropped: u64,
    /// Completions of requests the session no longer tracks.
    pub stale_completions: u64,
    /// Paths marked down.
    pub path_failures: u64,
    /// Lane migrations carried out.
    pub migrations: u64,
    /// Migrations back to a lane's primary path.
    pub failbacks: u64,
}

/// A lane as seen from outside.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaneInfo {
    /// The lane.
    pub id: LaneId,
    /// First chunk.
    pub start: u32,
    /// One past the last chunk.
    pub end: u32,
    /// The path striping chose.
    pub primary: PathId,
    /// The path in use (or last used, when quiesced).
    pub path: PathId,
    /// Whether the lane waits for a migration.
    pub quiesced: bool,
    /// Completed prefix end.
    pub sender_done: u32,
    /// Chunks in flight.
    pub in_flight: u32,
    /// Migrations so far.
    pub migrations: u32,
}

/// Outstanding sends on a path and when it last made progress (input to a stall detector).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathActivity {
    /// The path.
    pub path: PathId,
    /// Sends outstanding.
    pub outstanding: u32,
    /// Last completion, or when the first of the outstanding sends was posted.
    pub since: Duration,
}

#[derive(Clone, Copy, Debug)]
struct PathState {
    outstanding: u32,
    since: Duration,
    posted_recvs: u32,
    listen: bool,
    down: bool,
}

impl PathState {
    const fn new(now: Duration) -> Self {
        Self { outstanding: 0, since: now, posted_recvs: 0, listen: false, down: false }
    }
}

#[derive(Clone, Copy, Debug)]
enum Pending {
    Send {
        lane: LaneId,
        chunk: u32,
        path: PathId,
    },
    Recv {
        path: PathId,
    },
    Probe {
        path: PathId,
    },
    /// The receive of a payload that a [`CompletionKind::Header`] announced.
    Payload {
        path: PathId,
        dest: PayloadDest,
    },
}

/// Where a payload receive puts its bytes.
#[derive(Clone, Copy, Debug)]
enum PayloadDest {
    /// Straight into the destination of a receive (the transfer), at a chunk (the index).
    Placed(TransferKey, u32),
    /// Into a buffer, then handled as a whole message (reduce, early, duplicate).
    Whole,
}

#[derive(Debug)]
struct Lane {
    start: u32,
    end: u32,
    primary: PathId,
    path: PathId,
    quiesced: bool,
    next: u32,
    replay_until: u32,
    in_flight: BTreeMap<u32, RequestId>,
    migrations: u32,
    offered: Option<PathId>,
}

#[derive(Debug)]
struct SendTransfer {
    src: MemHandle,
    offset: usize,
    len: u64,
    /// Bytes per chunk of this transfer ([`Session::chunk_size_for`]).
    chunk: u32,
    completed: ChunkSet,
    lanes: Vec<Lane>,
    reported: bool,
}

#[derive(Debug)]
struct RecvTransfer {
    dst: MemHandle,
    offset: usize,
    len: u64,
    /// Bytes per chunk of this transfer ([`Session::chunk_size_for`]).
    chunk: u32,
    have: ChunkSet,
    reported: bool,
    /// How an arriving chunk lands in `dst`.
    combine: Combine,
    /// Payload receives writing straight into `dst`, by chunk: the request and whether it was
    /// cancelled. The transfer is not reported complete while any is outstanding, so the
    /// destination is never handed back while the backend may still write it.
    placing: BTreeMap<u32, (RequestId, bool)>,
}

/// How a received chunk is applied to its destination bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Combine {
    /// `dst = chunk`.
    Copy,
    /// `dst = dst op chunk`, element-wise.
    Reduce(DType, ReduceOp),
}

/// Chunks that came before their transfer was expected: the whole message (header included) is kept.
type Early = Vec<(PathId, ChunkHeader, Vec<u8>)>;

/// The transport session of one rank.
#[derive(Debug)]
pub struct Session {
    rank: Rank,
    node: NodeId,
    cfg: SessionConfig,
    topo: Topology,
    comms: BTreeSet<CommId>,
    sends: BTreeMap<TransferKey, SendTransfer>,
    recvs: BTreeMap<TransferKey, RecvTransfer>,
    retired: VecDeque<TransferKey>,
    retired_set: BTreeSet<TransferKey>,
    early: BTreeMap<TransferKey, Early>,
    early_bytes: usize,
    early_chunks: usize,
    /// This rank's argument digests of its recent collectives ([`Session::set_args`]).
    args: BTreeMap<(CommId, u64), ArgDigest>,
    /// Tags outgoing chunk headers and verifies incoming ones.
    mac: HeaderMac,
    requests: BTreeMap<RequestId, Pending>,
    paths: BTreeMap<PathId, PathState>,
    down_nics: BTreeSet<NicId>,
    /// Splits transfers over this node's NICs, carrying rounding debts between transfers.
    striper: Striper,
    events: VecDeque<SessionEvent>,
    stats: SessionStats,
    /// Per communicator and peer, the highest collective sequence number an authentic chunk
    /// from that peer carried ([`Session::peer_seq`]).
    peer_seqs: BTreeMap<(CommId, Rank), u64>,
}

impl Session {
    /// A session for `rank` in `topo`, tagging and verifying chunk headers under `key` (every
    /// rank of a communicator must use the same key; a chunk under another key is refused).
    pub fn new(rank: Rank, cfg: SessionConfig, topo: Topology, key: &HeaderKey) -> Result<Self, SessionError> {
        if cfg.chunk_size == 0 {
            return Err(SessionError::InvalidConfig("chunk_size"));
        }
        if cfg.window == 0 {
            return Err(SessionError::InvalidConfig("window"));
        }
        if cfg.recv_depth == 0 {
            return Err(SessionError::InvalidConfig("recv_depth"));
        }
        let node = topo.node_of(rank).ok_or(SessionError::UnknownRank(rank))?;
        Ok(Self {
            rank,
            node,
            cfg,
            topo,
            comms: BTreeSet::new(),
            sends: BTreeMap::new(),
            recvs: BTreeMap::new(),
            retired: VecDeque::new(),
            retired_set: BTreeSet::new(),
            peer_seqs: BTreeMap::new(),
            early: BTreeMap::new(),
            early_bytes: 0,
            early_chunks: 0,
            args: BTreeMap::new(),
            mac: HeaderMac::new(key),
            requests: BTreeMap::new(),
            paths: BTreeMap::new(),
            down_nics: BTreeSet::new(),
            striper: Striper::default(),
            events: VecDeque::new(),
            stats: SessionStats::default(),
        })
    }

    /// This session's rank.
    pub const fn rank(&self) -> Rank {
        self.rank
    }

    /// The configuration.
    pub const fn config(&self) -> &SessionConfig {
        &self.cfg
    }

    /// The topology.
    pub const fn topology(&self) -> &Topology {
        &self.topo
    }

    /// The counters.
    pub const fn stats(&self) -> SessionStats {
        self.stats
    }

    /// Accepts chunks of communicator `comm` from now on.
    pub fn open_comm(&mut self, comm: CommId) {
        self.comms.insert(comm);
    }

    /// Stops accepting chunks of `comm` (later ones count as unknown collective).
    pub fn close_comm(&mut self, comm: CommId) {
        self.comms.remove(&comm);
    }

    /// The next event for the layer above.
    pub fn poll_event(&mut self) -> Option<SessionEvent> {
        self.events.pop_front()
    }

    /// Starts sending buffer `src` as transfer `key`, striped over the
    /// local NICs by `weights` (one per local NIC by rail; NICs marked down get nothing).
    pub fn start_send<T: Transport + ?Sized>(
        &mut self,
        now: Duration,
        t: &T,
        key: TransferKey,
        src: Buffer,
        weights: &[u32],
    ) -> Result<Vec<LaneId>, SessionError> {
        let Buffer { region: src, offset, len } = src;
        if key.src != self.rank {
            return Err(SessionError::WrongRank { key, me: self.rank });
        }
        self.check_transfer(t, key, key.dst, src, offset, len)?;
        if self.sends.contains_key(&key) {
            return Err(SessionError::DuplicateTransfer(key));
        }
        let peer_node = self.topo.node_of(key.dst).ok_or(SessionError::UnknownRank(key.dst))?;
        let locals = self.topo.nics_of(self.node);
        let remotes = self.topo.nics_of(peer_node);
        if weights.len() != locals.len() {
            return Err(SessionError::WeightCount { got: weights.len(), nics: locals.len() });
        }
        let mut eff: Vec<u32> =
            locals.iter().zip(weights).map(|(n, &w)| if self.down_nics.contains(n) { 0 } else { w }).collect();
        if eff.iter().all(|&w| w == 0) && weights.iter().any(|&w| w > 0) {
            // Every NIC the plan weighted is down (it was planned before they failed): the node's
            // NICs are one pool, so the transfer goes over the ones still up, evenly.
            eff = locals.iter().map(|n| u32::from(!self.down_nics.contains(n))).collect();
        }
        if eff.iter().all(|&w| w == 0) && len > 0 {
            return Err(SessionError::NoUsableNic(key));
        }
        let chunk = self.chunk_size_for(key, len);
        let n = chunk_count(len, chunk);
        let mut lanes = Vec::new();
        let mut ids = Vec::new();
        // Rounding to whole chunks gives a transfer of fewer chunks than NICs to some NICs
        // only; the striper carries each NIC's shortfall to the next transfer, so short
        // messages spread over the NICs by weight (not every one onto the same NIC).
        let ranges = self.striper.stripe(len, chunk, &eff);
        for (i, (start, end)) in ranges.into_iter().enumerate() {
            if start == end {
                continue;
            }
            let id = LaneId { transfer: key, lane: u16::try_from(lanes.len()).unwrap_or(u16::MAX) };
            let remote = remotes[i % remotes.len()];
            let primary = PathId::new(locals[i], key.dst, remote);
            let path = self.choose_from(primary).ok_or(SessionError::NoPath(id))?;
            lanes.push(Lane {
                start,
                end,
                primary,
                path,
                quiesced: false,
                next: start,
                replay_until: start,
                in_flight: BTreeMap::new(),
                migrations: 0,
                offered: None,
            });
            ids.push(id);
        }
        let reported = n == 0;
        self.sends.insert(key, SendTransfer { src, offset, len, chunk, completed: ChunkSet::new(n), lanes, reported });
        if reported {
            self.events.push_back(SessionEvent::SendComplete(key));
        }
        tracing::debug!(target: NET, %key, len, lanes = ids.len(), ?now, "send started");
        Ok(ids)
    }

    /// Expects transfer `key` into buffer `dst`; chunks that came early
    /// are applied now. Starts listening on every path from the sender.
    pub fn expect_recv<T: Transport + ?Sized>(
        &mut self,
        now: Duration,
        t: &mut T,
        key: TransferKey,
        dst: Buffer,
    ) -> Result<(), SessionError> {
        self.expect(now, t, key, dst, Combine::Copy)
    }

    /// As [`Session::expect_recv`], but each chunk is reduced into `dst` as it arrives
    /// (`dst = dst op chunk`, element-wise, exactly once per chunk: duplicates and replays
    /// are dropped as for a copy). `dst` must hold whole elements of `dtype`.
    pub fn expect_recv_reduce<T: Transport + ?Sized>(
        &mut self,
        now: Duration,
        t: &mut T,
        key: TransferKey,
        dst: Buffer,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<(), SessionError> {
        let elem = dtype.size() as u64;
        let chunk = u64::from(self.chunk_size_for(key, dst.len));
        if !dst.len.is_multiple_of(elem) || chunk % elem != 0 {
            return Err(SessionError::Misaligned { key, len: dst.len, dtype });
        }
        self.expect(now, t, key, dst, Combine::Reduce(dtype, op))
    }

    fn expect<T: Transport + ?Sized>(
        &mut self,
        now: Duration,
        t: &mut T,
        key: TransferKey,
        dst: Buffer,
        combine: Combine,
    ) -> Result<(), SessionError> {
        let Buffer { region: dst, offset, len } = dst;
        if key.dst != self.rank {
            return Err(SessionError::WrongRank { key, me: self.rank });
        }
        self.check_transfer(t, key, key.src, dst, offset, len)?;
        if self.recvs.contains_key(&key) {
            return Err(SessionError::DuplicateTransfer(key));
        }
        if self.retired_set.remove(&key) {
            self.retired.retain(|k| *k != key);
        }
        let chunk = self.chunk_size_for(key, len);
        let n = chunk_count(len, chunk);
        self.recvs.insert(
            key,
            RecvTransfer {
                dst,
                offset,
                len,
                chunk,
                have: ChunkSet::new(n),
                reported: false,
                combine,
                placing: BTreeMap::new(),
            },
        );
        if let Some(peer_node) = self.topo.node_of(key.src) {
            for local in self.topo.nics_of(self.node) {
                for remote in self.topo.nics_of(peer_node) {
                    self.paths.entry(PathId::new(local, key.src, remote)).or_insert(PathState::new(now)).listen = true;
                }
            }
        }
        tracing::trace!(target: NET, %key, ?combine, offset, len, "receive expected");
        for (path, h, message) in self.early.remove(&key).unwrap_or_default() {
            let payload = message.get(HEADER_LEN..).unwrap_or_default();
            self.early_bytes = self.early_bytes.saturating_sub(message.capacity());
            self.early_chunks = self.early_chunks.saturating_sub(1);
            self.apply(now, t, path, &h, payload);
            t.recycle(message);
        }
        self.check_recv_complete(key);
        Ok(())
    }

    /// Bytes per chunk of transfer `key` of `len` bytes ([`transfer_chunk_size`] with the
    /// sending node's NIC count); both ends compute it from the same inputs.
    fn chunk_size_for(&self, key: TransferKey, len: u64) -> u32 {
        let nics = self.topo.node_of(key.src).map_or(1, |n| self.topo.nics_of(n).len());
        transfer_chunk_size(self.cfg.chunk_size, len, nics)
    }

    fn check_transfer<T: Transport + ?Sized>(
        &self,
        t: &T,
        key: TransferKey,
        peer: Rank,
        region: MemHandle,
        offset: usize,
        len: u64,
    ) -> Result<(), SessionError> {
        if !self.comms.contains(&key.comm) {
            return Err(SessionError::CommNotOpen(key.comm));
        }
        self.topo.node_of(peer).ok_or(SessionError::UnknownRank(peer))?;
        let size = t.region(region)?.len();
        let ulen = usize::try_from(len).map_err(|_| SessionError::TooLarge { len })?;
        if offset.checked_add(ulen).is_none_or(|e| e > size) {
            return Err(TransportError::OutOfBounds { offset, len: ulen, size }.into());
        }
        if u64::from(chunk_count(len, self.cfg.chunk_size)) * u64::from(self.cfg.chunk_size) < len {
            return Err(SessionError::TooLarge { len });
        }
        Ok(())
    }

    /// Forgets a finished send (its source may be reused afterwards). Call it once the receiver
    /// confirmed the transfer; before that, a late failure may still need the source for replay.
    pub fn release_send(&mut self, key: TransferKey) {
        if self.sends.remove(&key).is_none() {
            return;
        }
        let paths = &mut self.paths;
        self.requests.retain(|_, p| match p {
            Pending::Send { lane, path, .. } if lane.transfer == key => {
                if let Some(st) = paths.get_mut(path) {
                    st.outstanding = st.outstanding.saturating_sub(1);
                }
                false
            }
            _ => true,
        });
    }

    /// The highest collective sequence number of communicator `comm` that an authentic chunk
    /// from `peer` carried (early chunks and refused ones included; replays carry their own,
    /// older number). A peer runs one collective at a time and sends its chunks of collective `s`
    /// only once it has finished every collective before `s`, so every transfer of an earlier
    /// collective from this rank to `peer` has arrived whole: an implied receipt.
    pub fn peer_seq(&self, comm: CommId, peer: Rank) -> Option<u64> {
        self.peer_seqs.get(&(comm, peer)).copied()
    }

    /// Notes an authentic chunk of `key` that `path` carried (see [`Session::peer_seq`]).
    pub(crate) fn note_peer_seq(&mut self, path: PathId, key: TransferKey) {
        if key.src != path.peer || key.dst != self.rank || !self.comms.contains(&key.comm) {
            return;
        }
        let seen = self.peer_seqs.entry((key.comm, key.src)).or_insert(key.seq);
        *seen = (*seen).max(key.seq);
    }

    /// Whether send `key` has issued every chunk and has no send request outstanding (true for a
    /// send the session no longer holds): from then on only a replay after a failure reads its
    /// source again, so the source may move ([`Session::rebase_send`]).
    pub fn is_send_drained(&self, key: TransferKey) -> bool {
        self.sends.get(&key).is_none_or(|s| s.lanes.iter().all(|l| l.next >= l.end && l.in_flight.is_empty()))
    }

    /// Moves the source of send `key` to `src`, which must hold the same bytes (the caller's
    /// copy): replays read from there, and the old place may be overwritten. Only a drained send
    /// may move ([`Session::is_send_drained`]); a send the session no longer holds is left alone.
    pub fn rebase_send<T: Transport + ?Sized>(
        &mut self,
        t: &T,
        key: TransferKey,
        src: Buffer,
    ) -> Result<(), SessionError> {
        let Buffer { region, offset, len } = src;
        match self.sends.get(&key) {
            None => return Ok(()),
            Some(s) if s.len != len => return Err(SessionError::RebaseLength { key, len, want: s.len }),
            Some(_) if !self.is_send_drained(key) => return Err(SessionError::SendBusy(key)),
            Some(_) => {}
        }
        self.check_transfer(t, key, key.dst, region, offset, len)?;
        if let Some(s) = self.sends.get_mut(&key) {
            (s.src, s.offset) = (region, offset);
        }
        Ok(())
    }

    /// Gives up receive `key` (its collective was abandoned): cancels its receives into place (a
    /// backend makes sure a cancelled one never writes the destination again, see
    /// [`Transport::cancel`]), then forgets it as [`Session::release_recv`] does.
    pub fn cancel_recv<T: Transport + ?Sized>(&mut self, now: Duration, t: &mut T, key: TransferKey) {
        if let Some(rt) = self.recvs.get_mut(&key) {
            for (req, cancelled) in rt.placing.values_mut() {
                if !*cancelled {
                    *cancelled = true;
                    let _ = t.cancel(now, *req);
                }
            }
        }
        self.release_recv(key);
    }

    /// Forgets a receive (finished or abandoned); late chunks of it count as duplicates.
    /// Released before [`SessionEvent::RecvComplete`], payload receives straight into its
    /// destination may still be running: give such a receive up with [`Session::cancel_recv`].
    pub fn release_recv(&mut self, key: TransferKey) {
        if self.recvs.remove(&key).is_none() {
            return;
        }
        if self.retired_set.insert(key) {
            self.retired.push_back(key);
        }
        while self.retired.len() > self.cfg.retired_memory {
            if let Some(old) = self.retired.pop_front() {
                self.retired_set.remove(&old);
            }
        }
    }

    /// End of the prefix of `start..end` that the receiver really holds for transfer `key`
    /// (the receiver's side of the replay boundary). A released transfer holds everything.
    pub fn held(&self, key: TransferKey, start: u32, end: u32) -> Result<u32, SessionError> {
        if let Some(rt) = self.recvs.get(&key) {
            let chunks = rt.have.capacity();
            if start > end || end > chunks {
                return Err(SessionError::BadRange { key, start, end, chunks });
            }
            return Ok(rt.have.first_missing(start, end));
        }
        if self.retired_set.contains(&key) {
            return Ok(end);
        }
        Err(SessionError::UnknownTransfer(key))
    }

    /// Whether receive `key` is expected and not yet released ([`Session::release_recv`]).
    pub fn receiving(&self, key: TransferKey) -> bool {
        self.recvs.contains_key(&key)
    }

    /// Whether this session holds chunk `index` of receive `key`.
    pub fn holds_chunk(&self, key: TransferKey, index: u32) -> bool {
        self.recvs.get(&key).is_some_and(|rt| rt.have.contains(index))
    }

    /// The lanes of send `key`.
    pub fn lanes(&self, key: TransferKey) -> Vec<LaneInfo> {
        let Some(tr) = self.sends.get(&key) else { return Vec::new() };
        tr.lanes
            .iter()
            .enumerate()
            .map(|(i, l)| LaneInfo {
                id: LaneId { transfer: key, lane: u16::try_from(i).unwrap_or(u16::MAX) },
                start: l.start,
                end: l.end,
                primary: l.primary,
                path: l.path,
                quiesced: l.quiesced,
                sender_done: tr.completed.first_missing(l.start, l.end),
                in_flight: u32::try_from(l.in_flight.len()).unwrap_or(u32::MAX),
                migrations: l.migrations,
            })
            .collect()
    }

    /// Paths with outstanding sends that are not marked down, for a stall detector.
    pub fn path_activity(&self) -> Vec<PathActivity> {
        self.paths
            .iter()
            .filter(|(_, s)| s.outstanding > 0 && !s.down)
            .map(|(&path, s)| PathActivity { path, outstanding: s.outstanding, since: s.since })
            .collect()
    }

    /// Paths whose sends all completed locally but whose transfers the receiver has not
    /// acknowledged yet (not released), since their last completion. A silent black hole
    /// swallows bytes that the local stack already reported as sent, so a detector must watch
    /// these too: without a receipt within its deadline, probe the path.
    pub fn awaiting_receipt(&self) -> Vec<PathActivity> {
        let mut paths = BTreeSet::new();
        for tr in self.sends.values() {
            for l in &tr.lanes {
                if !l.quiesced && l.in_flight.is_empty() && l.next >= l.end && l.start < l.end {
                    paths.insert(l.path);
                }
            }
        }
        paths
            .into_iter()
            .filter_map(|p| {
                let s = self.paths.get(&p)?;
                (!s.down && s.outstanding == 0).then_some(PathActivity { path: p, outstanding: 0, since: s.since })
            })
            .collect()
    }

    /// Paths marked down.
    pub fn down_paths(&self) -> Vec<PathId> {
        self.paths.iter().filter(|(_, s)| s.down).map(|(&p, _)| p).collect()
    }

    /// Whether `path` is marked down.
    pub fn is_path_down(&self, path: PathId) -> bool {
        self.paths.get(&path).is_some_and(|s| s.down)
    }

    /// Whether `nic` (local or remote) is marked down.
    pub fn is_nic_down(&self, nic: NicId) -> bool {
        self.down_nics.contains(&nic)
    }
}
