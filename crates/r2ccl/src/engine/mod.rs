//! The per-rank engine: runs one collective's schedule over the transport session and
//! carries the control plane that keeps it running through NIC failures.
//!
//! Sans-IO apart from the `&mut impl Transport` it is handed on each call: time comes in as
//! `now`, control messages to peers go out through [`Engine::poll_outbox`] and come in
//! through [`Engine::handle_ctrl`]. The communicator's progress thread drives it over UCX
//! and the OOB mesh; tests drive several engines over the in-memory fabric in one thread.
//!
//! Control plane (MECHANISMS.md sections 2.2 and 3): a path failure seen by either end is
//! told to the other (bilateral awareness); the sender of each affected lane picks the next
//! path of its backup chain and asks the receiver, which answers with the replay boundary
//! min(sender done, what it holds) and starts listening on the new path; the sender then
//! replays from that boundary. That exchange is `r2ccl_transport::migrate` (a declared
//! transition table per lane, epochs, resends, the no-path deadline); the engine carries its
//! messages as [`Ctrl`] frames and applies its decisions to the session. Sends from buffers that later steps overwrite go out of a
//! private copy, and a collective finishes only when every receiver confirmed its bytes or (a
//! small send, `linger.rs`) its bytes wait in the linger pool for the receipt, so a replay
//! always finds the bytes first sent.
//!
//! Health (MECHANISMS.md sections 2.1 and 2.3): an [`r2ccl_detect::Detector`] watches every
//! same-rail path to each peer this rank exchanges data with. The engine feeds it what it sees
//! (stalls confirmed by an unanswered probe, endpoint errors, local link state, probe answers,
//! heartbeats on idle paths, its OOB frames) and carries out its commands: probes, OOB frames,
//! failure verdicts and recoveries. A verdict that blames a NIC (three-point triangulation)
//! takes that NIC out on every rank at once, so paths through it to other peers move before
//! they stall; a failed path comes back only after the detector's hold-down and consecutive
//! good probes, so a flapping link is damped. The engine's own stall check stays the fast
//! path: a lane moves as soon as its path stops, and the verdict follows.

use crate::ctrl::{Ctrl, NicStatus};
use r2ccl_algo::{Buf, RankSchedule, Region, Step, StepKind};
use r2ccl_core::kernels::{finalize_avg_bytes, reduce_bytes};
use r2ccl_core::{subsys, DType, NicId, NodeId, Rank, ReduceOp};
use r2ccl_detect::{
    Command as DetectCommand, ConnId, DetectConfig, DetectEvent, Detector, Member, Method, PathPair, ProbeId,
    ProbeResult, Verdict,
};
use r2ccl_transport::migrate::{
    LaneState, MigrateConfig, MigrateOutput, Migrations, Receiver as MigrateReceiver, ReqOutcome,
};
use r2ccl_transport::{
    Buffer, CommId, HeaderKey, LaneId, MemHandle, MigrationRequest, PathEvidence, PathFault, PathId, RequestId,
    Session, SessionConfig, SessionError, SessionEvent, TransferKey, Transport,
};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

/// First byte of an engine control frame ([`Ctrl`]) on the OOB `Detect` channel.
pub(crate) const FRAME_CTRL: u8 = 0xC0;
/// First byte of an r2ccl-detect protocol frame on the same channel.
pub(crate) const FRAME_DETECT: u8 = 0xD0;
/// How often the kernel's evidence on a path is read while a probe on it is out (an engine
/// suspect's, or a detector probe older than the stall time).
const EVIDENCE_INTERVAL: Duration = Duration::from_millis(10);

/// Engine tunables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    /// Communicator id (all ranks use the same; random per communicator, so chunks of another one
    /// never match).
    pub comm: u64,
    /// The key chunk headers are tagged with (all ranks use the same). The default, all zeros, is
    /// for tests; a communicator derives its key from the job secret.
    pub header_key: HeaderKey,
    /// Session tunables (chunk size, window, ...).
    pub session: SessionConfig,
    /// A path with outstanding sends and no completion for this long is declared failed.
    pub stall_timeout: Duration,
    /// Re-probe period of failed paths.
    pub probe_interval: Duration,
    /// How long a stalled path's probe may take before the path is declared failed.
    pub probe_timeout: Duration,
    /// Resend period of an unanswered migration request.
    pub migrate_retry: Duration,
    /// The backend connects NIC r only to the peers' NIC r (no spine): two nodes without a
    /// common healthy rail cannot reach each other, which fails the collective at once.
    pub rail_only: bool,
    /// The failure detector's timing and hysteresis (localization, heartbeats on idle paths,
    /// hold-down of flapping paths, good probes before a recovery).
    pub detect: DetectConfig,
    /// How long a lane or a send may wait for a usable path before the collective fails
    /// ([`EngineError::NoPathLeft`]): a black hole on the last common rail is an error, not a hang.
    pub no_path_timeout: Duration,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            comm: 1,
            header_key: HeaderKey::from_bytes([0; 32]),
            session: SessionConfig::default(),
            stall_timeout: Duration::from_millis(100),
            probe_interval: Duration::from_millis(100),
            probe_timeout: Duration::from_millis(50),
            migrate_retry: Duration::from_millis(50),
            rail_only: false,
            detect: DetectConfig::default(),
            no_path_timeout: Duration::from_secs(8),
        }
    }
}

/// Why a collective failed on this rank.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// The transport session refused a call.
    #[error("transport session: {0}")]
    Session(#[from] SessionError),
    /// The backend refused a call.
    #[error("transport: {0}")]
    Transport(#[from] r2ccl_transport::TransportError),
    /// A reduction kernel refused its buffers (a schedule bug or mismatched arguments).
    #[error("reduction: {0}")]
    Kernel(#[from] r2ccl_core::KernelError),
    /// The failure detector refused its configuration or the cluster's membership.
    #[error("failure detector: {0}")]
    Detect(#[from] r2ccl_detect::DetectError),
    /// The lane migration machine was fed an event its table does not allow (a bug here).
    #[error("lane migration: {0}")]
    Migrate(#[from] r2ccl_transport::migrate::IllegalMigration),
    /// A collective is already running on this engine.
    #[error("a collective is already running (sequence {0})")]
    Busy(u64),
    /// The caller's buffers do not match the schedule.
    #[error("buffer of {got} bytes where the schedule needs {want}")]
    BufferSize {
        /// Bytes given.
        got: usize,
        /// Bytes needed.
        want: u64,
    },
    /// A schedule region lies outside its buffer.
    #[error("schedule region {0:?} lies outside its buffer")]
    BadRegion(Region),
    /// Every NIC of a node is down: its ranks cannot communicate.
    #[error("node {0} has no usable NIC left (every NIC reported down)")]
    NodeIsolated(u32),
    /// A transfer found no usable path to its peer for longer than the no-path timeout (every
    /// path failed without its NICs being reported down, e.g. a silent black hole on the last
    /// common rail).
    #[error("no usable path for {what} for {waited_ms} ms (every path to rank {peer} failed); giving up")]
    NoPathLeft {
        /// The lane or send that waited.
        what: String,
        /// The peer rank.
        peer: u32,
        /// How long it waited.
        waited_ms: u64,
    },
    /// On a rail-only fabric, two nodes that must talk have no healthy rail in common.
    #[error("nodes {a} and {b} have no healthy rail in common (rail-only fabric); a transfer between them cannot be repaired")]
    NoCommonRail {
        /// One node.
        a: u32,
        /// The other node.
        b: u32,
    },
}

/// Something worth a log line, a metric or a line in r2ccl-perf's output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EngineEvent {
    /// A path was marked failed on this rank.
    PathFailed {
        /// The path (this rank's view).
        path: PathId,
        /// What was seen.
        fault: PathFault,
        /// When.
        at: Duration,
    },
    /// A lane moved to another path after the boundary was agreed.
    Migrated {
        /// The lane.
        lane: LaneId,
        /// The path it left.
        from: PathId,
        /// The path it uses now.
        to: PathId,
        /// First chunk replayed.
        boundary: u32,
        /// Chunks sent again (completed before, replayed now).
        replayed: u32,
        /// Whether this was a fail-back to a recovered path.
        failback: bool,
        /// When the lane stopped.
        stopped_at: Duration,
        /// When it resumed.
        at: Duration,
    },
    /// A NIC changed state (`local`: one of this node's).
    NicState {
        /// The NIC.
        nic: NicId,
        /// Whether it is up.
        up: bool,
        /// Whether it is this node's NIC.
        local: bool,
    },
    /// The detector localized a path failure (three-point probing): which component failed.
    Localized {
        /// The failed path (this rank's view).
        path: PathId,
        /// The component blamed.
        verdict: Verdict,
        /// How the verdict was reached.
        method: Method,
        /// When.
        at: Duration,
    },
    /// As the lead rank of its node, this rank took a NIC out on every rank because a verdict
    /// blamed it (`up: false`), or put it back because the detector saw it answer again.
    NicBlamed {
        /// The NIC.
        nic: NicId,
        /// Whether it is back in.
        up: bool,
    },
    /// A failed path answered a probe.
    PathRecovered {
        /// The path.
        path: PathId,
    },
    /// A peer's chunk says it called collective `seq` with other arguments than this rank.
    ArgsDiffer {
        /// The collective.
        seq: u64,
        /// The peer.
        from: Rank,
    },
    /// A peer sent a chunk or control message that was refused.
    BadInput {
        /// Who sent it.
        from: Rank,
        /// What was wrong.
        what: String,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StepState {
    Waiting,
    Running,
    Done,
}

/// One running collective.
#[derive(Debug)]
struct Exec {
    seq: u64,
    sched: RankSchedule,
    base: Places,
    /// Per step: for a send whose source region a later step writes, the workspace offset
    /// reserved for a private copy of its bytes (see [`private_sends`]). The copy is
    /// made only if a write it blocks has waited [`PRIVATE_COPY_AFTER`] for the receipt.
    staging: Vec<Option<u64>>,
    /// Per writing step: the earlier sends whose source bytes it overwrites
    /// ([`overwritten_sends`]). It runs once each is confirmed by its receiver or has moved
    /// to its private copy; until then it is parked.
    blockers: Vec<Vec<u32>>,
    /// Per send step: it goes out of its private copy from the start
    /// ([`sends_copied_at_once`]).
    copy_at_send: Vec<bool>,
    /// Per send step: it goes out of its private copy, from the start or since it moved
    /// there ([`Session::rebase_send`]).
    rebased: Vec<bool>,
    /// Per send step: when a parked write first found all its chunks gone (only its receipt
    /// missing); [`PRIVATE_COPY_AFTER`] later it moves to its private copy.
    drained_at: Vec<Option<Duration>>,
    /// Ready writes waiting for their blockers, with the time each was parked.
    parked: Vec<(usize, Duration)>,
    remaining: Vec<u32>,
    dependents: Vec<Vec<u32>>,
    state: Vec<StepState>,
    keys: Vec<Option<TransferKey>>,
    by_send: BTreeMap<TransferKey, usize>,
    by_recv: BTreeMap<TransferKey, usize>,
    ready: VecDeque<usize>,
    /// Sends that found no usable path (every path to the peer marked down); retried.
    deferred: Vec<usize>,
    /// When each deferred send first found no path (bounded by the no-path timeout).
    deferred_since: BTreeMap<usize, Duration>,
    done: usize,
    unacked: BTreeSet<TransferKey>,
    /// The ranks this rank sends to in this collective.
    send_peers: BTreeSet<Rank>,
}

/// One rank's engine.
#[derive(Debug)]
pub struct Engine {
    rank: Rank,
    world: u32,
    cfg: EngineConfig,
    session: Session,
    work: Option<(MemHandle, usize)>,
    exec: Option<Exec>,
    finished: Option<u64>,
    /// The collective begun last.
    begun: Option<u64>,
    outbox: VecDeque<(Rank, Vec<u8>)>,
    events: VecDeque<EngineEvent>,
    /// The lane migration protocol, sender side: one machine per stopped lane.
    migrations: Migrations,
    /// The lane migration protocol, receiver side.
    migrate_rx: MigrateReceiver,
    probes: BTreeMap<PathId, Duration>,
    /// Receipts that arrived before their send was started (kept until it is).
    early_receipts: BTreeSet<TransferKey>,
    /// Sends moved to their private copy because their receipt was late (since start).
    moved_sends: u64,
    /// Stalled paths being probed, with the time the probe must have answered by.
    suspects: BTreeMap<PathId, Duration>,
    /// When the kernel's evidence ([`Transport::path_evidence`]) on suspects and on the detector's
    /// outstanding probes is read next.
    evidence_at: Duration,
    /// Paths declared failed on the kernel's evidence.
    silent_declared: u64,
    /// Paths declared failed while their suspect probe was still out: that probe's late answer
    /// must not bring the path back behind the detector's hold-down (one answer is ignored).
    abandoned_probes: BTreeSet<PathId>,
    /// Paths whose stall was explained by a probe answer: not suspected again before this time.
    quiet: BTreeMap<PathId, Duration>,
    notified: BTreeSet<PathId>,
    down_nics: BTreeSet<NicId>,
    health_changed: bool,
    local_nics: usize,
    /// Where the output of the collective that finished last lies: (region, offset).
    last_output: Option<(MemHandle, usize)>,
    /// Path health, localization and recovery.
    detector: Detector,
    /// Peers whose same-rail paths the detector watches (added as collectives use them).
    watched: BTreeSet<Rank>,
    /// Transport probes posted for the detector, with what they answer and when they went out.
    detect_reqs: BTreeMap<RequestId, (DetectProbe, Duration)>,
    /// NICs taken out by a detector verdict while their link is up (this rank's lead verdicts
    /// and the ones other nodes' leads announced): back on their recovery. A node is never gone
    /// for good while it has one, and its lead puts them back when its other NICs go down.
    blamed: BTreeSet<NicId>,
    /// The last verdict per failed path (the failover metric's label).
    verdicts: BTreeMap<PathId, Verdict>,
    /// Small sends lingering past their collective, and receipts held back (`linger.rs`).
    linger: Linger,
}

/// What a transport probe posted for the detector answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DetectProbe {
    /// A probe the detector started (localization, re-probe, or one a peer asked for), on its path.
    Probe(ProbeId, PathId),
    /// A heartbeat over an idle path.
    Heartbeat(r2ccl_detect::PathId),
}

/// The detector's view of a transport path (the same three fields).
const fn to_detect(p: PathId) -> r2ccl_detect::PathId {
    r2ccl_detect::PathId { local: p.local, peer: p.peer, remote: p.remote }
}

/// The transport's view of a detector path.
const fn from_detect(p: r2ccl_detect::PathId) -> PathId {
    PathId { local: p.local, peer: p.peer, remote: p.remote }
}

/// Where each buffer of a schedule lies, by [`Buf`]: (region, offset of its first byte).
type Places = [(MemHandle, u64); 3];

/// A collective's room for private copies: per step, the workspace offset of a send's copy
/// ([`private_sends`]), and per writing step the sends it overwrites ([`overwritten_sends`]).
struct Staging {
    offsets: Vec<Option<u64>>,
    blockers: Vec<Vec<u32>>,
}

/// The region and byte offset of `r`.
fn place(base: &Places, r: &Region) -> (MemHandle, usize) {
    let (h, at) = base[r.buf as usize];
    (h, (at + r.offset) as usize)
}

/// Copy `len` bytes from `src` to `dst` (region, offset), or with `reduce` reduce them into
/// `dst` (`dst = dst op src`), within one region or across two. A copy onto itself does
/// nothing; an overlapping reduce reads a copy of its source. `what` names the bytes in errors.
fn move_bytes<T: Transport + ?Sized>(
    t: &mut T,
    src: (MemHandle, usize),
    dst: (MemHandle, usize),
    len: usize,
    reduce: Option<(DType, ReduceOp)>,
    what: Region,
) -> Result<(), EngineError> {
    let ((hs, s), (hd, d)) = (src, dst);
    let bad = || EngineError::BadRegion(what);
    let combine = |to: &mut [u8], from: &[u8]| -> Result<(), EngineError> {
        match reduce {
            Some((dtype, op)) => reduce_bytes(dtype, op, to, from)?,
            None => to.copy_from_slice(from),
        }
        Ok(())
    };
    if hs == hd {
        let ws = t.region_mut(hs)?;
        if s.checked_add(len).is_none_or(|e| e > ws.len()) || d.checked_add(len).is_none_or(|e| e > ws.len()) {
            return Err(bad());
        }
        if reduce.is_none() {
            if s != d {
                ws.copy_within(s..s + len, d);
            }
        } else if s >= d + len {
            let (a, b) = ws.split_at_mut(s);
            combine(&mut a[d..d + len], &b[..len])?;
        } else if d >= s + len {
            let (a, b) = ws.split_at_mut(d);
            combine(&mut b[..len], &a[s..s + len])?;
        } else {
            let from = ws[s..s + len].to_vec();
            combine(&mut ws[d..d + len], &from)?;
        }
        return Ok(());
    }
    match t.region_pair(hs, hd) {
        Ok((a, b)) => {
            let from = a.get(s..s + len).ok_or_else(bad)?;
            combine(b.get_mut(d..d + len).ok_or_else(bad)?, from)
        }
        Err(r2ccl_transport::TransportError::NoRegionPair { .. }) => {
            let from = t.region(hs)?.get(s..s + len).ok_or_else(bad)?.to_vec();
            combine(t.region_mut(hd)?.get_mut(d..d + len).ok_or_else(bad)?, &from)
        }
        Err(e) => Err(e.into()),
    }
}

/// How many collectives ahead of this rank's a receipt for a send not started yet is kept.
const RECEIPTS_AHEAD: u64 = 64;
/// The most receipts kept for sends not started yet.
const MAX_EARLY_RECEIPTS: usize = 4096;

/// How long a write waits for the receipts of the sends whose bytes it overwrites before
/// those sends move to their private copies (a receipt is normally in within a round trip).
pub const PRIVATE_COPY_AFTER: Duration = Duration::from_millis(50);

/// Whether step `i` must wait: it overwrites the source of a send that has not started, or
/// whose receiver has not confirmed it and that still goes out of its own bytes.
fn is_blocked(x: &Exec, i: usize) -> bool {
    x.blockers[i].iter().any(|&j| {
        let j = j as usize;
        x.state[j] != StepState::Done || (!x.rebased[j] && x.keys[j].is_some_and(|k| x.unacked.contains(&k)))
    })
}

mod analysis;
mod control;
mod exec;
mod linger;

use analysis::*;
use linger::Linger;
#[cfg(test)]
pub(crate) use linger::RECEIPT_DELAY;
