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
//! replays from that boundary. Sends from buffers that later steps overwrite go out of a
//! private copy, and a collective finishes only when every receiver confirmed its bytes, so a
//! replay always finds the bytes first sent.
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
use r2ccl_transport::{
    Buffer, CommId, HeaderKey, LaneId, MemHandle, MigrationRequest, PathEvidence, PathFault, PathId, RequestId,
    Session, SessionConfig, SessionError, SessionEvent, TransferKey, Transport,
};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

/// First byte of an engine control frame ([`Ctrl`]) on the OOB `Detect` channel.
const FRAME_CTRL: u8 = 0xC0;
/// First byte of an r2ccl-detect protocol frame on the same channel.
const FRAME_DETECT: u8 = 0xD0;
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
}

#[derive(Clone, Copy, Debug)]
struct PendingMigration {
    req: MigrationRequest,
    to: PathId,
    epoch: u32,
    sent_at: Duration,
    stopped_at: Duration,
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
    outbox: VecDeque<(Rank, Vec<u8>)>,
    events: VecDeque<EngineEvent>,
    migrations: BTreeMap<LaneId, PendingMigration>,
    no_path: Vec<(MigrationRequest, Duration)>,
    epochs: BTreeMap<LaneId, u32>,
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

impl Engine {
    /// An engine for `rank` of `world` ranks over `topo`.
    pub fn new(
        rank: Rank,
        world: u32,
        cfg: EngineConfig,
        topo: r2ccl_transport::Topology,
    ) -> Result<Self, EngineError> {
        let local_nics = topo.node_of(rank).map_or(0, |n| topo.nics_of(n).len());
        let members: Vec<Member> =
            (0..world).filter_map(|r| topo.node_of(Rank(r)).map(|node| Member { rank: Rank(r), node })).collect();
        let detector = Detector::new(cfg.detect.clone(), rank, &members)?;
        let mut session = Session::new(rank, cfg.session, topo, &cfg.header_key)?;
        session.open_comm(CommId(cfg.comm));
        Ok(Self {
            rank,
            world,
            cfg,
            session,
            work: None,
            exec: None,
            finished: None,
            outbox: VecDeque::new(),
            events: VecDeque::new(),
            migrations: BTreeMap::new(),
            no_path: Vec::new(),
            epochs: BTreeMap::new(),
            probes: BTreeMap::new(),
            early_receipts: BTreeSet::new(),
            moved_sends: 0,
            suspects: BTreeMap::new(),
            evidence_at: Duration::ZERO,
            silent_declared: 0,
            abandoned_probes: BTreeSet::new(),
            quiet: BTreeMap::new(),
            notified: BTreeSet::new(),
            down_nics: BTreeSet::new(),
            health_changed: false,
            local_nics,
            last_output: None,
            detector,
            watched: BTreeSet::new(),
            detect_reqs: BTreeMap::new(),
            blamed: BTreeSet::new(),
            verdicts: BTreeMap::new(),
        })
    }

    /// The transport session (statistics, path state).
    pub const fn session(&self) -> &Session {
        &self.session
    }

    /// NICs known to be down (this node's and peers').
    pub const fn down_nics(&self) -> &BTreeSet<NicId> {
        &self.down_nics
    }

    /// Next control message for a peer (send it on the OOB `Detect` channel).
    pub fn poll_outbox(&mut self) -> Option<(Rank, Vec<u8>)> {
        self.outbox.pop_front()
    }

    /// Next event for logs and metrics.
    pub fn poll_event(&mut self) -> Option<EngineEvent> {
        self.events.pop_front()
    }

    /// How many sends moved to their private copy because a write that overwrites their bytes
    /// waited [`PRIVATE_COPY_AFTER`] past their last chunk for the receipt (since start).
    #[cfg(test)]
    pub fn moved_sends(&self) -> u64 {
        self.moved_sends
    }

    /// The sequence number of a collective that finished since the last call.
    pub fn take_finished(&mut self) -> Option<u64> {
        self.finished.take()
    }

    /// Lanes still looking for a usable path or waiting for the receiver's answer to a migration.
    /// None is left once every send is acknowledged (a receipt drops its transfer's lanes).
    #[cfg(test)]
    pub fn pending_lanes(&self) -> usize {
        self.migrations.len() + self.no_path.len()
    }

    /// Steps still waiting, as (step kind, peer) descriptions, for timeout diagnostics.
    pub fn waiting(&self) -> Vec<String> {
        let Some(x) = &self.exec else { return Vec::new() };
        let mut out = Vec::new();
        for (i, st) in x.state.iter().enumerate() {
            if *st == StepState::Running {
                if let StepKind::Recv { peer, dst, .. } = x.sched.steps()[i].kind {
                    let topo = self.session.topology();
                    let nics = topo.node_of(peer).map_or(1, |n| topo.nics_of(n).len());
                    let chunk = r2ccl_transport::transfer_chunk_size(self.session.config().chunk_size, dst.len, nics);
                    let n = r2ccl_transport::chunk_count(dst.len, chunk);
                    match x.keys[i].map(|k| (k, self.session.held(k, 0, n))) {
                        Some((k, Ok(held))) => {
                            out.push(format!("receive of {k} from {peer} ({held}/{n} chunks in order)"))
                        }
                        _ => out.push(format!("receive from {peer}")),
                    }
                }
            }
        }
        for &(i, _) in &x.parked {
            let blockers: Vec<String> =
                x.blockers[i].iter().filter_map(|&j| x.keys[j as usize]).map(|k| k.to_string()).collect();
            out.push(format!("step {i} parked until the receipts of [{}]", blockers.join(", ")));
        }
        for k in &x.unacked {
            let lanes: Vec<String> = self
                .session
                .lanes(*k)
                .iter()
                .map(|l| {
                    let state = if l.quiesced { "quiesced" } else { "on" };
                    format!("lane {} {state} {} sent {}/{}", l.id.lane, l.path, l.sender_done, l.end)
                })
                .collect();
            out.push(format!("receipt of {k} from {} [{}]", k.dst, lanes.join(", ")));
        }
        out.extend(self.migrations.keys().map(|l| format!("migration of {l} (no answer yet)")));
        out.extend(self.no_path.iter().map(|(r, _)| format!("a path for {} (none usable)", r.lane)));
        out.truncate(12);
        out
    }

    /// The detector's last verdict on `path` (this rank's view), if it localized a failure there.
    pub fn verdict(&self, path: PathId) -> Option<Verdict> {
        self.verdicts.get(&path).copied()
    }

    fn send_ctrl(&mut self, to: Rank, msg: Ctrl) {
        if to != self.rank {
            let mut frame = vec![FRAME_CTRL];
            frame.extend(msg.encode());
            self.outbox.push_back((to, frame));
        }
    }

    fn ensure_workspace<T: Transport + ?Sized>(&mut self, t: &mut T, len: usize) -> Result<MemHandle, EngineError> {
        if let Some((h, l)) = self.work {
            if l >= len {
                return Ok(h);
            }
            t.deregister(h)?;
            self.work = None;
        }
        let h = t.register(len.max(1))?;
        self.work = Some((h, len.max(1)));
        Ok(h)
    }

    /// Start collective `seq` with this rank's schedule: `input` is the send buffer,
    /// `output` the receive buffer's current contents (kept where the collective does not write).
    /// Both are copied into (and the result out of, [`Engine::output_into`]) the engine's
    /// workspace; [`Engine::start_registered`] works on registered regions instead.
    pub fn start<T: Transport + ?Sized>(
        &mut self,
        now: Duration,
        t: &mut T,
        seq: u64,
        sched: RankSchedule,
        input: &[u8],
        output: &[u8],
    ) -> Result<(), EngineError> {
        if let Some(x) = &self.exec {
            return Err(EngineError::Busy(x.seq));
        }
        if input.len() as u64 != sched.input_len {
            return Err(EngineError::BufferSize { got: input.len(), want: sched.input_len });
        }
        if output.len() as u64 != sched.output_len {
            return Err(EngineError::BufferSize { got: output.len(), want: sched.output_len });
        }
        let scratch_at = sched.input_len + sched.output_len;
        let (h, staging) = self.workspace_for(t, &sched, scratch_at)?;
        let base = [(h, 0), (h, sched.input_len), (h, scratch_at)];
        // Copies out of the input that wait for nothing run now, straight from the caller's
        // bytes (a ring AllReduce starts with input -> output); the input goes into the
        // workspace only if another step reads it. That saves one pass over the buffer.
        let direct = copies_from_input_now(&sched);
        let input_read_later = sched.steps().iter().enumerate().any(|(i, s)| !direct[i] && touches_input(s));
        {
            let ws = t.region_mut(h)?;
            if input_read_later {
                ws[..input.len()].copy_from_slice(input);
            }
            // Only schedules that leave output bytes unwritten (Send/Recv away from the
            // receiver, Reduce away from the root) need the caller's bytes preserved.
            let writes_all = sched.steps().iter().any(|s| match s.kind {
                StepKind::Copy { dst, .. } | StepKind::Reduce { dst, .. } | StepKind::Recv { dst, .. } => {
                    dst.buf == Buf::Output && dst.offset == 0 && dst.len == sched.output_len
                }
                _ => false,
            });
            if !writes_all {
                ws[input.len()..input.len() + output.len()].copy_from_slice(output);
            }
            for (i, _) in direct.iter().enumerate().filter(|(_, &d)| d) {
                let StepKind::Copy { src, dst } = sched.steps()[i].kind else { continue };
                let (s, (_, d), l) = (src.offset as usize, place(&base, &dst), src.len as usize);
                let from = input.get(s..s + l).ok_or(EngineError::BadRegion(src))?;
                ws.get_mut(d..d + l).ok_or(EngineError::BadRegion(dst))?.copy_from_slice(from);
            }
        }
        self.begin(now, t, seq, sched, base, staging, &direct)
    }

    /// As [`Engine::start`], but the input and the output are registered regions, given as
    /// (region, offset of the buffer's first byte): the collective reads and writes them in
    /// place (no copy in or out; in place when both are the same bytes). The workspace holds
    /// only scratch space and the sends' private copies.
    pub fn start_registered<T: Transport + ?Sized>(
        &mut self,
        now: Duration,
        t: &mut T,
        seq: u64,
        sched: RankSchedule,
        input: (MemHandle, usize),
        output: (MemHandle, usize),
    ) -> Result<(), EngineError> {
        if let Some(x) = &self.exec {
            return Err(EngineError::Busy(x.seq));
        }
        for ((h, at), want) in [(input, sched.input_len), (output, sched.output_len)] {
            let size = t.region(h)?.len();
            if (at as u64).saturating_add(want) > size as u64 {
                return Err(EngineError::BufferSize { got: size.saturating_sub(at), want });
            }
        }
        let (i_at, o_at) = (input.1 as u64, output.1 as u64);
        let overlap = input.0 == output.0 && i_at < o_at + sched.output_len && o_at < i_at + sched.input_len;
        // A schedule that reads its input after writing over it gets a copy of the input.
        let copy_input = overlap && !runs_in_place(&sched, i_at, o_at);
        let scratch_at = if copy_input { sched.input_len } else { 0 };
        let (h, staging) = self.workspace_for(t, &sched, scratch_at)?;
        let mut base = [(input.0, i_at), (output.0, o_at), (h, scratch_at)];
        if copy_input {
            let what = Region { buf: Buf::Input, offset: 0, len: sched.input_len };
            move_bytes(t, input, (h, 0), sched.input_len as usize, None, what)?;
            base[Buf::Input as usize] = (h, 0);
        }
        self.begin(now, t, seq, sched, base, staging, &[])
    }

    /// The workspace for `sched` with its scratch space at `scratch_at`, followed by room for
    /// the private copy of every send whose bytes a later step overwrites; and those offsets.
    fn workspace_for<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        sched: &RankSchedule,
        scratch_at: u64,
    ) -> Result<(MemHandle, Staging), EngineError> {
        let blockers = overwritten_sends(sched);
        let mut end = scratch_at + sched.scratch_len;
        let mut staging = vec![None; sched.steps().len()];
        for (i, private) in private_sends(&blockers).into_iter().enumerate() {
            if let (true, StepKind::Send { src, .. }) = (private, sched.steps()[i].kind) {
                staging[i] = Some(end);
                end += src.len;
            }
        }
        let len = usize::try_from(end).map_err(|_| EngineError::BufferSize { got: usize::MAX, want: end })?;
        Ok((self.ensure_workspace(t, len)?, Staging { offsets: staging, blockers }))
    }

    /// Set up and start a collective whose buffers lie at `base`; `direct` marks steps that
    /// already ran (copies out of the caller's input; empty: none).
    #[allow(clippy::too_many_arguments, reason = "the two start paths hand over what they set up")]
    fn begin<T: Transport + ?Sized>(
        &mut self,
        now: Duration,
        t: &mut T,
        seq: u64,
        sched: RankSchedule,
        base: Places,
        staging: Staging,
        direct: &[bool],
    ) -> Result<(), EngineError> {
        let n = sched.steps().len();
        let is_direct = |i: usize| direct.get(i).copied().unwrap_or(false);
        // Sends from regions that later steps overwrite keep their bytes until the receiver
        // confirms them: the writes wait (parked). Each has room for a private copy, made only
        // when a parked write waits too long (a receipt held up by a failure), so a replay
        // still finds the bytes that were first sent.
        let Staging { offsets: staging, blockers } = staging;
        let copy_at_send = sends_copied_at_once(&sched, &blockers);
        // Dense per-pair message numbers: both ends sort the same tag set the same way.
        let mut send_tags: BTreeMap<Rank, Vec<(u64, usize)>> = BTreeMap::new();
        let mut recv_tags: BTreeMap<Rank, Vec<(u64, usize)>> = BTreeMap::new();
        let mut dependents = vec![Vec::new(); n];
        let mut remaining = vec![0u32; n];
        for (i, s) in sched.steps().iter().enumerate() {
            match s.kind {
                StepKind::Send { peer, tag, .. } => send_tags.entry(peer).or_default().push((tag.0, i)),
                StepKind::Recv { peer, tag, .. } => recv_tags.entry(peer).or_default().push((tag.0, i)),
                _ => {}
            }
            for &d in sched.deps(i) {
                dependents[d as usize].push(i as u32);
            }
            remaining[i] = sched.deps(i).len() as u32;
        }
        let peers: BTreeSet<Rank> = send_tags.keys().chain(recv_tags.keys()).copied().collect();
        for peer in peers {
            self.watch_peer(now, peer);
        }
        let mut keys = vec![None; n];
        let mut by_send = BTreeMap::new();
        let mut by_recv = BTreeMap::new();
        for (peer, mut tags) in send_tags {
            tags.sort_unstable();
            for (k, (_, i)) in tags.into_iter().enumerate() {
                let key = TransferKey::new(self.cfg.comm, seq, k as u32, self.rank.0, peer.0);
                keys[i] = Some(key);
                by_send.insert(key, i);
            }
        }
        for (peer, mut tags) in recv_tags {
            tags.sort_unstable();
            for (k, (_, i)) in tags.into_iter().enumerate() {
                let key = TransferKey::new(self.cfg.comm, seq, k as u32, peer.0, self.rank.0);
                keys[i] = Some(key);
                by_recv.insert(key, i);
            }
        }
        let ready: VecDeque<usize> = (0..n).filter(|&i| remaining[i] == 0 && !is_direct(i)).collect();
        self.early_receipts.retain(|k| k.seq >= seq);
        self.exec = Some(Exec {
            seq,
            sched,
            base,
            staging,
            blockers,
            copy_at_send,
            rebased: vec![false; n],
            drained_at: vec![None; n],
            parked: Vec::new(),
            remaining,
            dependents,
            state: vec![StepState::Waiting; n],
            keys,
            by_send,
            by_recv,
            ready,
            deferred: Vec::new(),
            deferred_since: BTreeMap::new(),
            done: 0,
            unacked: BTreeSet::new(),
        });
        for i in (0..n).filter(|&i| is_direct(i)) {
            self.complete_step(i);
        }
        tracing::debug!(target: subsys::COLL, rank = %self.rank, seq, steps = n, "collective started");
        // NICs that went down between collectives: the check at the NIC event saw no collective.
        self.check_peers()?;
        self.advance(now, t)
    }

    /// Whether the running collective can still finish given the NICs known to be down: this
    /// node and every node it exchanges data with keep a usable NIC (a lost common rail is left
    /// to the no-path timeout). Called when a collective starts and whenever a NIC's state
    /// changes while one runs.
    fn check_peers(&self) -> Result<(), EngineError> {
        let Some(x) = &self.exec else { return Ok(()) };
        let topo = self.session.topology();
        let Some(me) = topo.node_of(self.rank) else { return Ok(()) };
        let peers: BTreeSet<NodeId> = x
            .by_send
            .keys()
            .map(|k| k.dst)
            .chain(x.by_recv.keys().map(|k| k.src))
            .filter_map(|r| topo.node_of(r))
            .filter(|&n| n != me)
            .collect();
        // Only a node with no usable NIC is gone for good. Two nodes left without a common rail
        // wait (bounded by the no-path timeout) for a NIC to come back: a flap on one node while
        // the other has lost its other rail must not end the job.
        let gone = self.gone_nics();
        for peer in peers {
            reachable(topo, &gone, false, me, peer)?;
        }
        Ok(())
    }

    /// NICs down for good as far as this rank knows: down, and not merely blamed by a verdict
    /// (a blamed NIC's link is up; its node's lead puts it back when it is the node's last).
    fn gone_nics(&self) -> BTreeSet<NicId> {
        gone_for_good(&self.down_nics, &self.blamed)
    }

    /// The output buffer of the collective that finished last.
    pub fn output<T: Transport + ?Sized>(&self, t: &T, len: usize) -> Result<Vec<u8>, EngineError> {
        let (h, at) = self.last_output.ok_or(EngineError::BufferSize { got: 0, want: len as u64 })?;
        let ws = t.region(h)?;
        Ok(ws.get(at..at + len).map(<[u8]>::to_vec).unwrap_or_default())
    }

    /// Copy the output buffer of the collective that finished last into `dst`.
    pub fn output_into<T: Transport + ?Sized>(&self, t: &T, dst: &mut [u8]) -> Result<(), EngineError> {
        let (h, at) = self.last_output.ok_or(EngineError::BufferSize { got: 0, want: dst.len() as u64 })?;
        let ws = t.region(h)?;
        let src = ws
            .get(at..at + dst.len())
            .ok_or(EngineError::BufferSize { got: ws.len(), want: (at + dst.len()) as u64 })?;
        dst.copy_from_slice(src);
        Ok(())
    }

    /// Abandon the running collective (after a timeout or an abort); its transfers are released,
    /// and its receives into place cancelled (they never write the workspace again).
    pub fn abandon<T: Transport + ?Sized>(&mut self, now: Duration, t: &mut T) {
        if let Some(x) = self.exec.take() {
            for &k in x.by_send.keys() {
                self.session.release_send(k);
            }
            for &k in x.by_recv.keys() {
                self.session.cancel_recv(now, t, k);
            }
        }
        self.migrations.clear();
        self.no_path.clear();
        self.epochs.clear();
    }

    fn complete_step(&mut self, i: usize) {
        let Some(x) = &mut self.exec else { return };
        if x.state[i] == StepState::Done {
            return;
        }
        x.state[i] = StepState::Done;
        x.done += 1;
        for &d in &x.dependents[i] {
            let d = d as usize;
            x.remaining[d] -= 1;
            if x.remaining[d] == 0 {
                x.ready.push_back(d);
            }
        }
    }

    fn local_op<T: Transport + ?Sized>(t: &mut T, x: &Exec, i: usize) -> Result<(), EngineError> {
        let (src, dst, reduce) = match x.sched.steps()[i].kind {
            StepKind::Copy { src, dst } => (src, dst, None),
            StepKind::Reduce { src, dst } => (src, dst, Some((x.sched.dtype, x.sched.op))),
            _ => return Ok(()),
        };
        move_bytes(t, place(&x.base, &src), place(&x.base, &dst), src.len as usize, reduce, src)
    }

    /// Parked writes whose blockers are resolved become ready. A blocker whose chunks have all
    /// left but whose receipt is still missing [`PRIVATE_COPY_AFTER`] later (a receipt held up
    /// by a failure, or a cycle of writes waiting for each other's receipts) moves to its
    /// private copy, so the write no longer waits for the receipt.
    fn unpark<T: Transport + ?Sized>(&mut self, now: Duration, t: &mut T, h: MemHandle) -> Result<(), EngineError> {
        let Some(x) = &mut self.exec else { return Ok(()) };
        if x.parked.is_empty() {
            return Ok(());
        }
        // Receipts normally beat PRIVATE_COPY_AFTER: only writes parked that long look further.
        let waiting: Vec<usize> =
            x.parked.iter().filter(|(_, at)| now >= *at + PRIVATE_COPY_AFTER).map(|&(i, _)| i).collect();
        for w in waiting {
            for j in x.blockers[w].clone() {
                let j = j as usize;
                let (Some(key), Some(stage)) = (x.keys[j], x.staging[j]) else { continue };
                let StepKind::Send { src, .. } = x.sched.steps()[j].kind else { continue };
                if x.rebased[j] || !x.unacked.contains(&key) {
                    continue;
                }
                // Every chunk gone, by the session's count and the backend's (UCX may still read
                // for a send it was told to give up), and since PRIVATE_COPY_AFTER: a replay after
                // a failure puts chunks in flight again, and the wait starts over.
                let (region, at) = place(&x.base, &src);
                if !self.session.is_send_drained(key) || t.reads_region(region, at, src.len as usize) {
                    x.drained_at[j] = None;
                    continue;
                }
                let since = *x.drained_at[j].get_or_insert(now);
                if now < since + PRIVATE_COPY_AFTER {
                    continue;
                }
                let stage = stage as usize;
                move_bytes(t, (region, at), (h, stage), src.len as usize, None, src)?;
                self.session.rebase_send(t, key, Buffer { region: h, offset: stage, len: src.len })?;
                x.rebased[j] = true;
                self.moved_sends += 1;
                tracing::debug!(target: subsys::COLL, rank = %self.rank, %key, "send moved to its private copy");
            }
        }
        let parked = std::mem::take(&mut x.parked);
        for (i, at) in parked {
            if is_blocked(x, i) {
                x.parked.push((i, at));
            } else {
                x.ready.push_back(i);
            }
        }
        Ok(())
    }

    /// Start every ready step; finish the collective when all are done.
    fn advance<T: Transport + ?Sized>(&mut self, now: Duration, t: &mut T) -> Result<(), EngineError> {
        let Some((h, _)) = self.work else { return Ok(()) };
        self.unpark(now, t, h)?;
        loop {
            let Some(x) = &mut self.exec else { return Ok(()) };
            let Some(i) = x.ready.pop_front() else { break };
            if is_blocked(x, i) {
                x.parked.push((i, now));
                continue;
            }
            x.state[i] = StepState::Running;
            tracing::trace!(target: subsys::COLL, rank = %self.rank, seq = x.seq, step = i, kind = ?x.sched.steps()[i].kind, "step started");
            let base = x.base;
            match x.sched.steps()[i].kind {
                StepKind::Copy { .. } | StepKind::Reduce { .. } => {
                    Self::local_op(t, x, i)?;
                    self.complete_step(i);
                }
                StepKind::Send { peer: _, src, split, .. } => {
                    let key = x.keys[i].ok_or(EngineError::BadRegion(src))?;
                    let mut weights = vec![0u32; self.local_nics];
                    match x.sched.split(split) {
                        Some(s) if !split.is_intra() => {
                            for p in &s.parts {
                                if let Some(w) = weights.get_mut(p.src.index()) {
                                    *w = w.saturating_add(
                                        u32::try_from(p.weight.min(u64::from(u32::MAX / 8))).unwrap_or(1),
                                    );
                                }
                            }
                        }
                        _ => weights.iter_mut().for_each(|w| *w = 1),
                    }
                    if weights.iter().all(|&w| w == 0) {
                        weights.iter_mut().for_each(|w| *w = 1);
                    }
                    let (mut region, mut offset) = place(&base, &src);
                    if let (true, Some(stage)) = (x.copy_at_send[i], x.staging[i]) {
                        let stage = stage as usize;
                        move_bytes(t, (region, offset), (h, stage), src.len as usize, None, src)?;
                        (region, offset) = (h, stage);
                        x.rebased[i] = true;
                    }
                    let buf = Buffer { region, offset, len: src.len };
                    match self.session.start_send(now, t, key, buf, &weights) {
                        Ok(_) => {
                            x.deferred_since.remove(&i);
                            // A receipt can beat its send here (an empty transfer completes at
                            // the receiver at once): then the send is acknowledged already.
                            if self.early_receipts.remove(&key) {
                                self.session.release_send(key);
                            } else {
                                x.unacked.insert(key);
                            }
                        }
                        Err(SessionError::NoPath(_) | SessionError::NoUsableNic(_)) => {
                            // Paths may be down only for now (a stall); a node whose NICs are all
                            // reported down is gone for good.
                            let topo = self.session.topology();
                            let nodes = (topo.node_of(self.rank), topo.node_of(key.dst));
                            if let (Some(a), Some(b)) = nodes {
                                reachable(topo, &gone_for_good(&self.down_nics, &self.blamed), false, a, b)?;
                            }
                            let since = *x.deferred_since.entry(i).or_insert(now);
                            let waited = now.saturating_sub(since);
                            if waited > self.cfg.no_path_timeout {
                                // The precise reason first: no common rail left, else no path.
                                if let (Some(a), Some(b)) = nodes {
                                    reachable(topo, &self.down_nics, self.cfg.rail_only, a, b)?;
                                }
                                return Err(EngineError::NoPathLeft {
                                    what: format!("send {key}"),
                                    peer: key.dst.0,
                                    waited_ms: waited.as_millis() as u64,
                                });
                            }
                            x.deferred.push(i);
                            continue;
                        }
                        Err(e) => return Err(e.into()),
                    }
                    // The bytes are safe in the send buffer: later steps may reuse the region.
                    self.complete_step(i);
                }
                StepKind::Recv { dst, reduce, .. } => {
                    let key = x.keys[i].ok_or(EngineError::BadRegion(dst))?;
                    let (region, offset) = place(&base, &dst);
                    let buf = Buffer { region, offset, len: dst.len };
                    if reduce {
                        // Each chunk is reduced into place as it arrives (exactly once): no
                        // staging copy, and the chunk is still in cache.
                        let (dtype, op) = (x.sched.dtype, x.sched.op);
                        self.session.expect_recv_reduce(now, t, key, buf, dtype, op)?;
                    } else {
                        self.session.expect_recv(now, t, key, buf)?;
                    }
                }
            }
        }
        self.process_session_events(now, t)?;
        let finished = self.exec.as_ref().is_some_and(|x| x.done == x.state.len() && x.unacked.is_empty());
        if finished {
            if let Some(x) = self.exec.take() {
                if let Some((r, n)) = x.sched.finalize {
                    let (region, a) = place(&x.base, &r);
                    let bytes =
                        t.region_mut(region)?.get_mut(a..a + r.len as usize).ok_or(EngineError::BadRegion(r))?;
                    finalize_avg_bytes(x.sched.dtype, bytes, n)?;
                }
                let (region, at) = x.base[Buf::Output as usize];
                self.last_output = Some((region, at as usize));
                self.finished = Some(x.seq);
                tracing::debug!(target: subsys::COLL, rank = %self.rank, seq = x.seq, "collective finished");
            }
        }
        Ok(())
    }
}

impl Engine {
    /// Make progress: drive the transport, react to its events, run timers (stall
    /// detection, probes, migration resends) and start steps that became ready.
    pub fn drive<T: Transport + ?Sized>(&mut self, now: Duration, t: &mut T) -> Result<(), EngineError> {
        self.session.drive(now, t);
        self.process_session_events(now, t)?;
        // Progress deadline: a stalled path is first probed (a slow peer answers, a black hole
        // does not); only an unanswered probe declares it failed.
        let activity = self.session.path_activity();
        // A path whose sends make no progress at all for much longer, although its probes are
        // answered, has lost something (the peer gave the path up without telling us, say): it
        // is declared failed all the same, so that its lanes replay elsewhere instead of waiting
        // forever.
        let hard = self.hard_stall_limit();
        let lost: Vec<PathId> = activity.iter().filter(|a| now >= a.since + hard).map(|a| a.path).collect();
        let stalled: Vec<PathId> = activity
            .into_iter()
            .chain(self.session.awaiting_receipt())
            .filter(|a| now >= a.since + self.cfg.stall_timeout)
            .map(|a| a.path)
            .filter(|p| !self.suspects.contains_key(p) && self.quiet.get(p).is_none_or(|&q| now >= q))
            .collect();
        for p in lost {
            tracing::warn!(target: subsys::DETECT, rank = %self.rank, path = %p, limit = ?hard, "sends made no progress although probes were answered: path declared failed");
            if self.suspects.remove(&p).is_some() {
                self.abandoned_probes.insert(p);
            }
            self.quiet.remove(&p);
            self.declare_stalled(now, t, p);
        }
        for p in stalled {
            if self.session.is_path_down(p) {
                continue;
            }
            // The kernel may already know: bytes in flight and no acknowledgement for the stall
            // time is a dead path, whatever the peer's process is doing (its kernel would ACK).
            if t.path_evidence(now, p, self.cfg.stall_timeout) == PathEvidence::Silent {
                self.declare_silent(now, t, p);
                continue;
            }
            match self.session.probe(now, t, p) {
                Ok(_) => {
                    tracing::debug!(target: subsys::DETECT, rank = %self.rank, path = %p, "no progress: probing");
                    self.suspects.insert(p, now + self.cfg.probe_timeout);
                }
                Err(_) => self.declare_stalled(now, t, p),
            }
        }
        // While a suspect's probe or a localization probe is out, the kernel's evidence is read
        // every EVIDENCE_INTERVAL: a black hole is then declared (or the localization probe
        // counted as unanswered) as soon as its silence shows, not at the probe's timeout.
        if self.evidence_due(now) {
            self.evidence_at = now + EVIDENCE_INTERVAL;
            let suspects: Vec<PathId> = self.suspects.keys().copied().collect();
            for p in suspects {
                if t.path_evidence(now, p, self.cfg.stall_timeout) == PathEvidence::Silent {
                    self.suspects.remove(&p);
                    self.abandoned_probes.insert(p);
                    self.declare_silent(now, t, p);
                }
            }
            let quiet = self.cfg.stall_timeout;
            let probes: Vec<(RequestId, ProbeId, PathId)> = self
                .detect_reqs
                .iter()
                .filter_map(|(&r, &(w, at))| match w {
                    DetectProbe::Probe(probe, path) if now >= at + quiet => Some((r, probe, path)),
                    _ => None,
                })
                .collect();
            for (req, probe, path) in probes {
                if t.path_evidence(now, path, quiet) == PathEvidence::Silent {
                    tracing::debug!(target: subsys::DETECT, rank = %self.rank, %path, "probe unacknowledged by the peer's kernel: counted as unanswered");
                    self.detect_reqs.remove(&req);
                    let _ = t.cancel(now, req);
                    self.detector.handle_probe_result(now, probe, ProbeResult::Unacknowledged)?;
                }
            }
        }
        let expired: Vec<PathId> = self.suspects.iter().filter(|(_, &d)| now >= d).map(|(&p, _)| p).collect();
        for p in expired {
            self.suspects.remove(&p);
            self.declare_stalled(now, t, p);
        }
        if self.detector.poll_timeout().is_some_and(|d| d <= now) {
            self.detector.handle_timeout(now)?;
        }
        self.run_detector(now, t)?;
        // Probes the detector gave up on (it counts them as timeouts) leave the transport too.
        let limit = self.detector.config().probe_timeout + self.detector.config().heartbeat_timeout();
        let stale: Vec<RequestId> =
            self.detect_reqs.iter().filter(|(_, (_, at))| now >= *at + limit).map(|(r, _)| *r).collect();
        for req in stale {
            self.detect_reqs.remove(&req);
            let _ = t.cancel(now, req);
        }
        let down = self.session.down_paths();
        self.probes.retain(|p, _| down.contains(p));
        for p in down {
            // A path the detector declared failed comes back through its hold-down and
            // consecutive good probes (run_detector), not on the first answer.
            if self.session.is_nic_down(p.local)
                || self.session.is_nic_down(p.remote)
                || self.detector.path_state(&to_detect(p)).is_some_and(|s| !s.is_usable())
            {
                self.probes.remove(&p);
                continue;
            }
            let due = self.probes.get(&p).is_none_or(|&at| now >= at);
            if due {
                self.probes.insert(p, now + self.cfg.probe_interval);
                // A probe that cannot be posted is retried at the next interval.
                let _ = self.session.probe(now, t, p);
            }
        }
        let retry: Vec<LaneId> = self
            .migrations
            .iter()
            .filter(|(_, m)| now >= m.sent_at + self.cfg.migrate_retry)
            .map(|(&l, _)| l)
            .collect();
        for lane in retry {
            if let Some(m) = self.migrations.get_mut(&lane) {
                m.sent_at = now;
                let msg = migrate_req(m.req, m.to, m.epoch);
                let to = lane.transfer.dst;
                self.send_ctrl(to, msg);
            }
        }
        for (req, stopped_at) in std::mem::take(&mut self.no_path) {
            let (a, b) = (req.from.local.node, req.from.remote.node);
            reachable(self.session.topology(), &self.gone_nics(), false, a, b)?;
            let waited = now.saturating_sub(stopped_at);
            if waited > self.cfg.no_path_timeout {
                self.check_reachable(a, b)?;
                return Err(EngineError::NoPathLeft {
                    what: format!("lane {}", req.lane),
                    peer: req.lane.transfer.dst.0,
                    waited_ms: waited.as_millis() as u64,
                });
            }
            self.begin_migration(now, req, stopped_at);
        }
        if let Some(x) = &mut self.exec {
            let deferred = std::mem::take(&mut x.deferred);
            x.ready.extend(deferred);
        }
        self.process_session_events(now, t)?;
        self.advance(now, t)
    }

    /// Have the detector watch the same-rail paths to `peer` (one connection per rail, a chain
    /// of one path: lanes move between paths through the engine's own per-lane agreement).
    fn watch_peer(&mut self, now: Duration, peer: Rank) {
        if peer == self.rank || !self.watched.insert(peer) {
            return;
        }
        let topo = self.session.topology();
        let (Some(me), Some(them)) = (topo.node_of(self.rank), topo.node_of(peer)) else { return };
        let theirs = topo.nics_of(them);
        for nic in topo.nics_of(me) {
            let Some(&remote) = theirs.iter().find(|n| n.rail == nic.rail) else { continue };
            let conn = ConnId::new(self.rank.0, peer.0, u32::from(nic.rail.0));
            if let Err(e) = self.detector.add_connection(now, conn, vec![PathPair { src_nic: nic, dst_nic: remote }]) {
                tracing::debug!(target: subsys::DETECT, rank = %self.rank, %peer, %e, "path not watched");
            }
        }
    }

    /// Tell the detector about a path failure this rank saw itself (a stall confirmed by an
    /// unanswered probe, an endpoint error). Link-state failures arrive as `LocalNic`; failures
    /// a peer reported are that peer's detector's to localize.
    fn detect_failure(&mut self, now: Duration, path: PathId, fault: PathFault) {
        if !matches!(fault, PathFault::Timeout | PathFault::Endpoint) {
            return;
        }
        // Only watched same-rail paths, and only once: the detector already localizes a failed one.
        if !self.detector.path_state(&to_detect(path)).is_some_and(|s| s.is_usable()) {
            return;
        }
        let conn = ConnId::new(self.rank.0, path.peer.0, u32::from(path.local.rail.0));
        if let Err(e) = self.detector.handle_remote_error(now, conn) {
            tracing::debug!(target: subsys::DETECT, rank = %self.rank, %path, %e, "failure not fed to the detector");
        }
    }

    /// A rank on `node` other than this one (the other end of a probe to one of its NICs).
    fn rank_on(&self, node: NodeId) -> Option<Rank> {
        let topo = self.session.topology();
        (0..self.world).map(Rank).find(|&r| r != self.rank && topo.node_of(r) == Some(node))
    }

    /// Carry out the detector's commands and log its events.
    fn run_detector<T: Transport + ?Sized>(&mut self, now: Duration, t: &mut T) -> Result<(), EngineError> {
        while let Some(cmd) = self.detector.poll_command() {
            match cmd {
                DetectCommand::SendOob { to, msg } | DetectCommand::AskProbe { to, msg } => {
                    if to != self.rank {
                        let mut frame = vec![FRAME_DETECT];
                        frame.extend(msg.encode());
                        self.outbox.push_back((to, frame));
                    }
                }
                DetectCommand::StartProbe { probe, from, to } => {
                    let Some(peer) = self.rank_on(to.node) else { continue };
                    let path = PathId { local: from, peer, remote: to };
                    match self.session.probe(now, t, path) {
                        Ok(req) => {
                            self.detect_reqs.insert(req, (DetectProbe::Probe(probe, path), now));
                        }
                        Err(_) if self.session.is_nic_down(from) => {
                            self.detector.handle_probe_result(now, probe, ProbeResult::LocalError)?;
                        }
                        // Not posted: the detector counts it as a timeout.
                        Err(_) => {}
                    }
                }
                DetectCommand::SendHeartbeat { path } => {
                    let beat = DetectProbe::Heartbeat(path);
                    if self.detect_reqs.values().all(|(w, _)| *w != beat) {
                        if let Ok(req) = self.session.probe(now, t, from_detect(path)) {
                            self.detect_reqs.insert(req, (beat, now));
                        }
                    }
                }
                DetectCommand::DeclareFailed { path, verdict, method } => {
                    self.on_verdict(now, t, from_detect(path), verdict, method)?;
                }
                DetectCommand::DeclareRecovered { path } => self.on_detector_recovered(now, t, from_detect(path))?,
                // Connections have a single path here: lanes move through the engine's own
                // per-lane agreement (MigrateReq/MigrateAck), and every collective is planned
                // from the agreed view anyway.
                DetectCommand::Quiesce { .. }
                | DetectCommand::MigratePath { .. }
                | DetectCommand::FailBack { .. }
                | DetectCommand::RequestReplan { .. } => {}
            }
        }
        while let Some(ev) = self.detector.poll_event() {
            match ev {
                DetectEvent::Localized { path, verdict, method, observations, .. } => {
                    tracing::info!(target: subsys::DETECT, rank = %self.rank, %path, %verdict, ?method, ?observations, "path failure localized");
                }
                DetectEvent::HeldDown { path, holddown, flaps, .. } if flaps > 0 => {
                    tracing::info!(target: subsys::DETECT, rank = %self.rank, %path, ?holddown, flaps, "flapping path held down");
                }
                other => tracing::trace!(target: subsys::DETECT, rank = %self.rank, event = ?other, "detector"),
            }
        }
        Ok(())
    }

    /// The detector declared `path` failed and blamed `verdict`: the path goes down (if the
    /// stall check had not taken it down already), and a blamed NIC is reported to the lead rank
    /// of its node, which takes it down on every rank.
    fn on_verdict<T: Transport + ?Sized>(
        &mut self,
        now: Duration,
        t: &mut T,
        path: PathId,
        verdict: Verdict,
        method: Method,
    ) -> Result<(), EngineError> {
        self.verdicts.insert(path, verdict);
        self.events.push_back(EngineEvent::Localized { path, verdict, method, at: now });
        if !self.session.is_path_down(path) {
            self.session.handle_path_down(now, t, path, PathFault::Timeout);
        }
        let (Verdict::LocalNic(nic) | Verdict::RemoteNic(nic)) = verdict else { return Ok(()) };
        self.report_blame(now, t, nic, true)
    }

    /// The lead rank of `node`: the lowest rank on it. It alone announces verdicts on its NICs.
    fn lead_of(&self, node: NodeId) -> Option<Rank> {
        let topo = self.session.topology();
        (0..self.world).map(Rank).find(|&r| topo.node_of(r) == Some(node))
    }

    /// Tell the lead rank of `nic`'s node that a verdict blames `nic` (`failed`) or that a path
    /// through it answers again; the lead handles its own reports directly.
    fn report_blame<T: Transport + ?Sized>(
        &mut self,
        now: Duration,
        t: &mut T,
        nic: NicId,
        failed: bool,
    ) -> Result<(), EngineError> {
        match self.lead_of(nic.node) {
            Some(lead) if lead == self.rank => self.on_blame(now, t, nic, failed),
            Some(lead) => {
                self.send_ctrl(lead, Ctrl::Blame { nic, failed });
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// As the lead rank of `nic`'s node: a verdict blames `nic` (`failed`) or a path through it
    /// answers again. A blamed NIC goes down on every rank (the NicState broadcast) unless it is
    /// the node's last usable one: when every NIC of a node looks dead, the host (busy, or its
    /// process gone) is the likelier culprit, and peer loss is the OOB mesh's to report. A NIC
    /// comes back only if a blame took it down, never one whose link is down.
    fn on_blame<T: Transport + ?Sized>(
        &mut self,
        now: Duration,
        t: &mut T,
        nic: NicId,
        failed: bool,
    ) -> Result<(), EngineError> {
        if failed {
            if self.down_nics.contains(&nic) {
                return Ok(());
            }
            let others = self.session.topology().nics_of(nic.node);
            if !others.iter().any(|&x| x != nic && !self.down_nics.contains(&x)) {
                tracing::warn!(target: subsys::DETECT, rank = %self.rank, %nic, "verdict blames the last usable NIC of its node: kept (paths fail one by one)");
                return Ok(());
            }
            tracing::warn!(target: subsys::DETECT, rank = %self.rank, %nic, "NIC blamed by localization: taken out on every rank");
            self.blamed.insert(nic);
            self.note_nic(nic, false);
            self.session.handle_nic_down(now, t, nic);
            self.events.push_back(EngineEvent::NicBlamed { nic, up: false });
            for r in 0..self.world {
                self.send_ctrl(Rank(r), Ctrl::NicState { nic, state: NicStatus::Blamed });
            }
            self.check_peers()
        } else {
            if !self.blamed.remove(&nic) {
                return Ok(());
            }
            tracing::info!(target: subsys::DETECT, rank = %self.rank, %nic, "blamed NIC answers again");
            self.put_back(now, nic);
            Ok(())
        }
    }

    /// As the lead rank of `nic`'s node: a NIC a verdict took out carries traffic again, on every
    /// rank (the NicState broadcast). Its paths start afresh.
    fn put_back(&mut self, now: Duration, nic: NicId) {
        self.blamed.remove(&nic);
        self.note_nic(nic, true);
        self.forget_path_failures(nic);
        self.session.handle_nic_up(now, nic);
        self.events.push_back(EngineEvent::NicBlamed { nic, up: true });
        for r in 0..self.world {
            self.send_ctrl(Rank(r), Ctrl::NicState { nic, state: NicStatus::Up });
        }
    }

    /// The detector saw enough good probes on `path` after its hold-down: the lead ranks of
    /// its NICs' nodes hear of it (a NIC a verdict took down comes back), and the path carries
    /// traffic again.
    fn on_detector_recovered<T: Transport + ?Sized>(
        &mut self,
        now: Duration,
        t: &mut T,
        path: PathId,
    ) -> Result<(), EngineError> {
        self.verdicts.remove(&path);
        for nic in [path.local, path.remote] {
            if self.down_nics.contains(&nic) {
                self.report_blame(now, t, nic, false)?;
            }
        }
        if self.session.is_path_down(path)
            && !self.session.is_nic_down(path.local)
            && !self.session.is_nic_down(path.remote)
        {
            self.probes.remove(&path);
            self.notified.remove(&path);
            self.session.handle_path_up(now, path);
            self.send_ctrl(path.peer, Ctrl::PathUp { local: path.local, remote: path.remote });
            self.events.push_back(EngineEvent::PathRecovered { path });
        }
        Ok(())
    }

    fn check_reachable(&self, a: NodeId, b: NodeId) -> Result<(), EngineError> {
        reachable(self.session.topology(), &self.down_nics, self.cfg.rail_only, a, b)
    }

    /// Whether the kernel's evidence is to be read now: a suspect's probe or a localization
    /// probe older than the stall time is out, and EVIDENCE_INTERVAL has passed.
    fn evidence_due(&self, now: Duration) -> bool {
        now >= self.evidence_at && self.evidence_deadline().is_some_and(|d| now >= d)
    }

    /// When the kernel's evidence is next worth reading (see [`Engine::evidence_due`]).
    fn evidence_deadline(&self) -> Option<Duration> {
        let quiet = self.cfg.stall_timeout;
        let probe = self
            .detect_reqs
            .values()
            .filter_map(|&(w, at)| matches!(w, DetectProbe::Probe(..)).then_some(at + quiet))
            .min();
        let suspect = (!self.suspects.is_empty()).then_some(Duration::ZERO);
        [probe, suspect].into_iter().flatten().min().map(|d| d.max(self.evidence_at))
    }

    fn declare_silent<T: Transport + ?Sized>(&mut self, now: Duration, t: &mut T, p: PathId) {
        tracing::warn!(target: subsys::DETECT, rank = %self.rank, path = %p, quiet = ?self.cfg.stall_timeout, "no progress and no TCP acknowledgement of the bytes in flight: path declared failed");
        self.silent_declared += 1;
        self.session.handle_path_down(now, t, p, PathFault::Timeout);
    }

    /// Paths declared failed on the kernel's evidence ([`Transport::path_evidence`]) so far.
    #[cfg(test)]
    pub const fn silent_declared(&self) -> u64 {
        self.silent_declared
    }

    fn declare_stalled<T: Transport + ?Sized>(&mut self, now: Duration, t: &mut T, p: PathId) {
        tracing::warn!(target: subsys::DETECT, rank = %self.rank, path = %p, "no progress and no probe answer: path declared failed");
        self.session.handle_path_down(now, t, p, PathFault::Timeout);
    }

    /// How long a path's sends may make no progress while its probes are answered.
    fn hard_stall_limit(&self) -> Duration {
        (self.cfg.stall_timeout * 20).max(Duration::from_secs(2))
    }

    /// The next time [`Engine::drive`] has timer work (stall deadlines, probes, resends).
    pub fn poll_timeout(&self) -> Option<Duration> {
        let activity = self.session.path_activity();
        let hard = activity.iter().map(|a| a.since + self.hard_stall_limit()).min();
        let stall = activity
            .into_iter()
            .chain(self.session.awaiting_receipt())
            // As `drive` filters them: a suspect waits for its probe, a quiet path until then.
            .filter(|a| !self.suspects.contains_key(&a.path))
            .map(|a| {
                let due = a.since + self.cfg.stall_timeout;
                self.quiet.get(&a.path).map_or(due, |&q| due.max(q))
            })
            .min();
        let probe = self.probes.values().chain(self.suspects.values()).copied().min();
        let evidence = self.evidence_deadline();
        let retry = self.migrations.values().map(|m| m.sent_at + self.cfg.migrate_retry).min();
        // Just past the no-path deadline of the longest-waiting lane or send.
        let give_up = self
            .no_path
            .iter()
            .map(|(_, since)| *since)
            .chain(self.exec.iter().flat_map(|x| x.deferred_since.values().copied()))
            .min()
            .map(|since| since + self.cfg.no_path_timeout + Duration::from_millis(1));
        [stall, probe, evidence, retry, give_up, hard, self.detector.poll_timeout()].into_iter().flatten().min()
    }

    fn begin_migration(&mut self, now: Duration, req: MigrationRequest, stopped_at: Duration) {
        let Some(to) = self.session.choose_path(req.lane) else {
            self.no_path.push((req, stopped_at));
            return;
        };
        let epoch = self.epochs.entry(req.lane).or_insert(0);
        *epoch += 1;
        let epoch = *epoch;
        self.migrations.insert(req.lane, PendingMigration { req, to, epoch, sent_at: now, stopped_at });
        self.send_ctrl(req.lane.transfer.dst, migrate_req(req, to, epoch));
    }

    fn process_session_events<T: Transport + ?Sized>(&mut self, now: Duration, t: &mut T) -> Result<(), EngineError> {
        while let Some(ev) = self.session.poll_event() {
            match ev {
                SessionEvent::SendComplete(_) => {}
                SessionEvent::RecvComplete(key) => self.on_recv_complete(key),
                SessionEvent::PathFailed { path, fault } => {
                    self.detect_failure(now, path, fault);
                    self.events.push_back(EngineEvent::PathFailed { path, fault, at: now });
                    if fault != PathFault::Reported && self.notified.insert(path) {
                        self.send_ctrl(path.peer, Ctrl::PathDown { local: path.local, remote: path.remote });
                    }
                }
                SessionEvent::LocalNic { nic, up } => {
                    let fed = if up {
                        self.detector.handle_link_up(now, nic)
                    } else {
                        self.detector.handle_link_down(now, nic)
                    };
                    if let Err(e) = fed {
                        tracing::debug!(target: subsys::DETECT, rank = %self.rank, %nic, %e, "link state not fed to the detector");
                    }
                    // Its link state rules from now on: a later probe answer must not bring back a
                    // NIC whose link went down while a verdict held it out.
                    if up {
                        self.forget_path_failures(nic);
                    } else {
                        self.blamed.remove(&nic);
                        self.put_back_last_resort(now, nic);
                    }
                    self.events.push_back(EngineEvent::NicState { nic, up, local: true });
                    self.note_nic(nic, up);
                    let state = if up { NicStatus::Up } else { NicStatus::LinkDown };
                    for r in 0..self.world {
                        self.send_ctrl(Rank(r), Ctrl::NicState { nic, state });
                    }
                    // Every local NIC down: a running collective that involves another node can
                    // never finish (even one that only waits to receive), so fail it now.
                    if !up {
                        self.check_peers()?;
                    }
                }
                SessionEvent::MigrationNeeded(req) => {
                    // Only a send still waiting for its receipt: an acknowledged one needs no path.
                    if self.exec.as_ref().is_some_and(|x| x.unacked.contains(&req.lane.transfer)) {
                        self.begin_migration(now, req, now);
                    }
                }
                SessionEvent::BetterPath { lane, .. } => match self.session.handle_move(now, t, lane) {
                    Ok(()) | Err(SessionError::LaneNotActive(_) | SessionError::UnknownLane(_)) => {}
                    Err(e) => return Err(e.into()),
                },
                SessionEvent::ProbeDone { path, ok, req } if self.detect_reqs.contains_key(&req) => {
                    let Some((what, _)) = self.detect_reqs.remove(&req) else { continue };
                    let fed = match what {
                        DetectProbe::Probe(probe, _) if ok => {
                            self.detector.handle_probe_result(now, probe, ProbeResult::Answered)
                        }
                        // Only a dead local NIC is a local error; anything else is left to the
                        // detector's probe timeout.
                        DetectProbe::Probe(probe, _) if self.session.is_nic_down(path.local) => {
                            self.detector.handle_probe_result(now, probe, ProbeResult::LocalError)
                        }
                        DetectProbe::Heartbeat(p) if ok => self.detector.handle_heartbeat(now, p),
                        DetectProbe::Probe(..) | DetectProbe::Heartbeat(_) => Ok(()),
                    };
                    if let Err(e) = fed {
                        tracing::debug!(target: subsys::DETECT, rank = %self.rank, %path, %e, "probe result not fed to the detector");
                    }
                }
                SessionEvent::ProbeDone { path, ok, .. } if self.suspects.contains_key(&path) => {
                    self.suspects.remove(&path);
                    if ok {
                        self.quiet.insert(path, now + self.cfg.stall_timeout);
                    } else {
                        self.declare_stalled(now, t, path);
                    }
                }
                SessionEvent::ProbeDone { path, .. } if self.abandoned_probes.remove(&path) => {}
                SessionEvent::ProbeDone { path, ok, .. } => {
                    if ok && self.session.is_path_down(path) {
                        self.probes.remove(&path);
                        self.notified.remove(&path);
                        self.session.handle_path_up(now, path);
                        self.send_ctrl(path.peer, Ctrl::PathUp { local: path.local, remote: path.remote });
                        self.events.push_back(EngineEvent::PathRecovered { path });
                    }
                }
                SessionEvent::BadChunk { path, problem: r2ccl_transport::ChunkProblem::Unexpected(id) } => {
                    // Early and no room to keep it: ask the sender to replay its lane later.
                    tracing::debug!(target: subsys::NET, rank = %self.rank, %path, chunk = id.index, "early chunk dropped; asking for a replay");
                    self.send_ctrl(id.transfer.src, Ctrl::Nack { key: id.transfer, index: id.index });
                }
                SessionEvent::BadChunk { path, problem } => {
                    tracing::debug!(target: subsys::NET, rank = %self.rank, %path, ?problem, "refused a chunk");
                    self.events.push_back(EngineEvent::BadInput { from: path.peer, what: format!("{problem:?}") });
                }
            }
        }
        Ok(())
    }

    /// Treat `nic` as down from now on without announcing it (every rank already knows: a NIC
    /// that could not be opened at start).
    pub fn mark_nic_down<T: Transport + ?Sized>(&mut self, now: Duration, t: &mut T, nic: NicId) {
        self.down_nics.insert(nic);
        self.session.handle_nic_down(now, t, nic);
    }

    /// `nic` is back: its paths start afresh, so that a later failure of one of them is reported
    /// to the peer again (`notified`) and its stall state is new.
    fn forget_path_failures(&mut self, nic: NicId) {
        let through = |p: &PathId| p.local == nic || p.remote == nic;
        self.notified.retain(|p| !through(p));
        self.probes.retain(|p, _| !through(p));
        self.suspects.retain(|p, _| !through(p));
        self.quiet.retain(|p, _| !through(p));
    }

    /// The link of `nic` (of this rank's node) just went down: if that leaves the node only NICs
    /// a verdict took out (their links are up), its lead puts them back, so the node keeps a way
    /// to carry traffic (a verdict never takes a node's last NIC, whichever comes first). Their
    /// paths are tried again; the stall check and the detector judge them afresh.
    fn put_back_last_resort(&mut self, now: Duration, nic: NicId) {
        if self.lead_of(nic.node) != Some(self.rank) {
            return;
        }
        let nics = self.session.topology().nics_of(nic.node);
        let others: Vec<NicId> = nics.iter().copied().filter(|&x| x != nic).collect();
        if others.iter().any(|x| !self.down_nics.contains(x)) {
            return;
        }
        let blamed: Vec<NicId> = others.into_iter().filter(|x| self.blamed.contains(x)).collect();
        for x in blamed {
            tracing::warn!(target: subsys::DETECT, rank = %self.rank, nic = %x, down = %nic, "the node's other NIC went down: a blamed NIC is put back as its last");
            self.put_back(now, x);
        }
    }

    fn note_nic(&mut self, nic: NicId, up: bool) {
        let changed = if up { self.down_nics.remove(&nic) } else { self.down_nics.insert(nic) };
        self.health_changed |= changed;
    }

    /// Every chunk of `key` landed (reducing receives reduced each chunk as it came).
    fn on_recv_complete(&mut self, key: TransferKey) {
        let Some(x) = &self.exec else { return };
        let Some(&i) = x.by_recv.get(&key) else { return };
        self.session.release_recv(key);
        self.send_ctrl(key.src, Ctrl::RecvDone { key });
        self.complete_step(i);
    }

    /// A control message from `from` (the OOB `Detect` channel).
    pub fn handle_ctrl<T: Transport + ?Sized>(
        &mut self,
        now: Duration,
        t: &mut T,
        from: Rank,
        bytes: &[u8],
    ) -> Result<(), EngineError> {
        let body = match bytes.split_first() {
            Some((&FRAME_CTRL, body)) => body,
            Some((&FRAME_DETECT, body)) => {
                if let Err(e) = self.detector.handle_oob(now, from, body) {
                    self.events.push_back(EngineEvent::BadInput { from, what: e.to_string() });
                }
                self.run_detector(now, t)?;
                self.process_session_events(now, t)?;
                return self.advance(now, t);
            }
            Some((&kind, _)) => {
                let what = format!("control frame of unknown kind {kind:#04x}");
                self.events.push_back(EngineEvent::BadInput { from, what });
                return Ok(());
            }
            None => {
                self.events.push_back(EngineEvent::BadInput { from, what: "empty control frame".into() });
                return Ok(());
            }
        };
        let msg = match Ctrl::decode(body) {
            Ok(m) => m,
            Err(e) => {
                self.events.push_back(EngineEvent::BadInput { from, what: e.to_string() });
                return Ok(());
            }
        };
        match msg {
            Ctrl::PathDown { local, remote } => {
                let path = Ctrl::mirrored(local, remote, from);
                self.notified.insert(path);
                self.session.handle_path_down(now, t, path, PathFault::Reported);
            }
            Ctrl::PathUp { local, remote } => {
                let path = Ctrl::mirrored(local, remote, from);
                self.notified.remove(&path);
                self.probes.remove(&path);
                self.session.handle_path_up(now, path);
            }
            Ctrl::NicState { nic, state } => {
                let up = state.is_up();
                if state == NicStatus::Blamed {
                    self.blamed.insert(nic);
                } else {
                    self.blamed.remove(&nic);
                }
                self.events.push_back(EngineEvent::NicState { nic, up, local: false });
                self.note_nic(nic, up);
                if up {
                    self.forget_path_failures(nic);
                    self.session.handle_nic_up(now, nic);
                } else {
                    self.session.handle_nic_down(now, t, nic);
                    self.check_peers()?;
                }
            }
            Ctrl::MigrateReq { key, lane, start, end, sender_done, local, remote, epoch } => {
                if key.dst != self.rank || key.src != from {
                    self.events
                        .push_back(EngineEvent::BadInput { from, what: format!("misrouted migration of {key}") });
                    return Ok(());
                }
                let held = match self.session.held(key, start, end) {
                    Ok(h) => Some(h),
                    Err(SessionError::UnknownTransfer(_)) => None,
                    Err(e) => {
                        self.events.push_back(EngineEvent::BadInput { from, what: e.to_string() });
                        return Ok(());
                    }
                };
                let boundary = sender_done.min(held.unwrap_or(start)).max(start);
                if held.is_some() {
                    let path = PathId { local: remote, peer: from, remote: local };
                    if let Err(e) = self.session.handle_peer_migrate(now, key, start, end, path, boundary) {
                        tracing::warn!(target: subsys::NET, rank = %self.rank, %key, %e, "peer migration refused");
                    }
                }
                self.send_ctrl(from, Ctrl::MigrateAck { key, lane, boundary, epoch });
            }
            Ctrl::MigrateAck { key, lane, boundary, epoch } => {
                let id = LaneId { transfer: key, lane };
                let Some(m) = self.migrations.get(&id).copied() else { return Ok(()) };
                if m.epoch != epoch {
                    return Ok(());
                }
                self.migrations.remove(&id);
                match self.session.handle_migrate(now, id, m.to, boundary) {
                    Ok(()) => {
                        let failback = matches!(m.req.reason, r2ccl_transport::MoveReason::Failback);
                        let replayed = m.req.sender_done.saturating_sub(boundary);
                        tracing::info!(
                            target: subsys::NET, rank = %self.rank, lane = %id, from = %m.req.from, to = %m.to,
                            boundary, replayed, failback, "lane migrated"
                        );
                        self.events.push_back(EngineEvent::Migrated {
                            lane: id,
                            from: m.req.from,
                            to: m.to,
                            boundary,
                            replayed,
                            failback,
                            stopped_at: m.stopped_at,
                            at: now,
                        });
                    }
                    Err(SessionError::PathDown(_)) => self.begin_migration(now, m.req, m.stopped_at),
                    Err(SessionError::UnknownLane(_) | SessionError::LaneNotQuiesced(_)) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Ctrl::Blame { nic, failed } => {
                if self.lead_of(nic.node) == Some(self.rank) {
                    self.on_blame(now, t, nic, failed)?;
                } else {
                    self.events.push_back(EngineEvent::BadInput {
                        from,
                        what: format!("verdict on {nic} sent to a rank that does not lead its node"),
                    });
                }
            }
            Ctrl::Nack { key, index } => {
                let pending = self.exec.as_ref().is_some_and(|x| x.unacked.contains(&key));
                if key.src == self.rank && pending {
                    let lane = self.session.lanes(key).into_iter().find(|l| l.start <= index && index < l.end);
                    if let Some(l) = lane.filter(|l| !l.quiesced) {
                        match self.session.handle_move(now, t, l.id) {
                            Ok(()) | Err(SessionError::LaneNotActive(_) | SessionError::UnknownLane(_)) => {}
                            Err(e) => return Err(e.into()),
                        }
                    }
                }
            }
            Ctrl::RecvDone { key } => {
                if key.src != self.rank {
                    return Ok(());
                }
                self.session.release_send(key);
                // Its lanes need no path any more: a stale no-path entry would fail a later
                // collective when its timeout ran out (choose_path finds nothing for a released send).
                self.no_path.retain(|(req, _)| req.lane.transfer != key);
                self.migrations.retain(|lane, _| lane.transfer != key);
                self.epochs.retain(|lane, _| lane.transfer != key);
                let known = self.exec.as_mut().is_some_and(|x| x.unacked.remove(&key));
                let current = self.exec.as_ref().map_or(self.finished.unwrap_or(0), |x| x.seq);
                if !known && key.seq >= current {
                    self.early_receipts.insert(key);
                }
            }
        }
        self.process_session_events(now, t)?;
        self.advance(now, t)
    }
}

/// The steps [`Engine::start`] runs at once from the caller's input: copies out of the input
/// (into another buffer) that depend on nothing.
fn copies_from_input_now(sched: &RankSchedule) -> Vec<bool> {
    sched
        .steps()
        .iter()
        .enumerate()
        .map(|(i, s)| {
            matches!(s.kind, StepKind::Copy { src, dst } if src.buf == Buf::Input && dst.buf != Buf::Input)
                && sched.deps(i).is_empty()
        })
        .collect()
}

/// Whether `sched` stays correct when its input and output are the same memory, the input at
/// byte `in_at` and the output at `out_at` of one region (NCCL's in-place call): every step
/// that touches the input is a copy that waits for nothing onto the very same bytes.
fn runs_in_place(sched: &RankSchedule, in_at: u64, out_at: u64) -> bool {
    sched.steps().iter().enumerate().filter(|(_, s)| touches_input(s)).all(|(i, s)| {
        matches!(s.kind, StepKind::Copy { src, dst }
            if src.buf == Buf::Input && dst.buf == Buf::Output && in_at + src.offset == out_at + dst.offset)
            && sched.deps(i).is_empty()
    })
}

/// Whether a step reads or writes the input buffer.
fn touches_input(s: &Step) -> bool {
    match s.kind {
        StepKind::Send { src, .. } => src.buf == Buf::Input,
        StepKind::Recv { dst, .. } => dst.buf == Buf::Input,
        StepKind::Copy { src, dst } | StepKind::Reduce { src, dst } => src.buf == Buf::Input || dst.buf == Buf::Input,
    }
}

/// For each step that writes (receive, copy, reduce), the earlier sends whose source bytes it
/// overwrites; empty for every other step. The engine counts a send done once posted, and a
/// replay after a failure must find the bytes first sent, so such a write waits until the send
/// is confirmed or has moved to a private copy. Schedules list steps in a valid program order
/// and order every write after the reads before it, so a writer that may run after a send
/// comes later in the list. One forward sweep with the sends so far indexed by offset.
fn overwritten_sends(sched: &RankSchedule) -> Vec<Vec<u32>> {
    let steps = sched.steps();
    let mut out = vec![Vec::new(); steps.len()];
    // Per buffer: the sends so far by source offset (end, step), and the longest one.
    let mut sent: [BTreeMap<u64, Vec<(u64, u32)>>; 3] = Default::default();
    let mut longest = [0u64; 3];
    for (i, s) in steps.iter().enumerate() {
        match s.kind {
            StepKind::Send { src, .. } if src.len > 0 => {
                let b = src.buf as usize;
                sent[b].entry(src.offset).or_default().push((src.offset + src.len, i as u32));
                longest[b] = longest[b].max(src.len);
            }
            StepKind::Recv { dst, .. } | StepKind::Copy { dst, .. } | StepKind::Reduce { dst, .. } if dst.len > 0 => {
                let b = dst.buf as usize;
                let (lo, hi) = (dst.offset, dst.offset + dst.len);
                // A send overlaps [lo, hi) iff it starts before hi and ends after lo.
                for (_, v) in sent[b].range(lo.saturating_sub(longest[b])..hi) {
                    out[i].extend(v.iter().filter(|&&(end, _)| end > lo).map(|&(_, j)| j));
                }
                out[i].sort_unstable();
            }
            _ => {}
        }
    }
    out
}

/// Per step: a send whose bytes a receive from the same peer overwrites. Those go out of a
/// private copy from the start: in an exchange (recursive doubling, a tree's way down) each
/// side's receive would otherwise wait for the other side's receipt, which waits for it.
fn sends_copied_at_once(sched: &RankSchedule, blockers: &[Vec<u32>]) -> Vec<bool> {
    let steps = sched.steps();
    let mut eager = vec![false; steps.len()];
    for (w, bs) in blockers.iter().enumerate() {
        let StepKind::Recv { peer: from, .. } = steps[w].kind else { continue };
        for &j in bs {
            if matches!(steps[j as usize].kind, StepKind::Send { peer, .. } if peer == from) {
                eager[j as usize] = true;
            }
        }
    }
    eager
}

/// Per step: a send that some later step overwrites (it needs room for a private copy).
fn private_sends(blockers: &[Vec<u32>]) -> Vec<bool> {
    let mut private = vec![false; blockers.len()];
    for &j in blockers.iter().flatten() {
        private[j as usize] = true;
    }
    private
}

fn migrate_req(req: MigrationRequest, to: PathId, epoch: u32) -> Ctrl {
    Ctrl::MigrateReq {
        key: req.lane.transfer,
        lane: req.lane.lane,
        start: req.start,
        end: req.end,
        sender_done: req.sender_done,
        local: to.local,
        remote: to.remote,
        epoch,
    }
}

/// Whether nodes `a` and `b` can still reach each other given the NICs known to be `down`:
/// neither is isolated and, on a rail-only fabric, they share a healthy rail.
/// NICs down for good: down, and not merely blamed by a verdict (a blamed NIC's link is up).
fn gone_for_good(down: &BTreeSet<NicId>, blamed: &BTreeSet<NicId>) -> BTreeSet<NicId> {
    down.difference(blamed).copied().collect()
}

fn reachable(
    topo: &r2ccl_transport::Topology,
    down: &BTreeSet<NicId>,
    rail_only: bool,
    a: NodeId,
    b: NodeId,
) -> Result<(), EngineError> {
    for node in [a, b] {
        if topo.nics_of(node).iter().all(|n| down.contains(n)) {
            return Err(EngineError::NodeIsolated(node.0));
        }
    }
    if rail_only && a != b {
        let healthy = |n: NodeId| -> BTreeSet<u16> {
            topo.nics_of(n).iter().filter(|x| !down.contains(x)).map(|x| x.rail.0).collect()
        };
        if healthy(a).is_disjoint(&healthy(b)) {
            return Err(EngineError::NoCommonRail { a: a.0, b: b.0 });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use r2ccl_algo::{build_rank_schedule, Algorithm, Collective, Fabric, Layout, ScheduleRequest};
    use r2ccl_core::{DType, HealthView, ReduceOp};

    /// The definition, by brute force: a later step writes an overlapping range of the buffer.
    fn reference(sched: &RankSchedule) -> Vec<bool> {
        let steps = sched.steps();
        let dst = |k: &StepKind| match *k {
            StepKind::Recv { dst, .. } | StepKind::Copy { dst, .. } | StepKind::Reduce { dst, .. } => Some(dst),
            StepKind::Send { .. } => None,
        };
        (0..steps.len())
            .map(|i| match steps[i].kind {
                StepKind::Send { src, .. } => steps[i + 1..]
                    .iter()
                    .filter_map(|s| dst(&s.kind))
                    .any(|d| d.buf == src.buf && d.offset < src.offset + src.len && src.offset < d.offset + d.len),
                _ => false,
            })
            .collect()
    }

    /// By brute force: for each writing step, the earlier sends of overlapping bytes.
    fn reference_blockers(sched: &RankSchedule) -> Vec<Vec<u32>> {
        let steps = sched.steps();
        (0..steps.len())
            .map(|w| {
                let d = match steps[w].kind {
                    StepKind::Recv { dst, .. } | StepKind::Copy { dst, .. } | StepKind::Reduce { dst, .. } => dst,
                    StepKind::Send { .. } => return Vec::new(),
                };
                let mut v: Vec<u32> = (0..w)
                    .filter(|&j| match steps[j].kind {
                        StepKind::Send { src, .. } => {
                            src.len > 0
                                && d.len > 0
                                && d.buf == src.buf
                                && d.offset < src.offset + src.len
                                && src.offset < d.offset + d.len
                        }
                        _ => false,
                    })
                    .map(|j| j as u32)
                    .collect();
                v.sort_unstable();
                v
            })
            .collect()
    }

    #[test]
    fn private_copies_are_exactly_the_sends_a_later_step_overwrites() {
        let layout = Layout::uniform(4, 1, 2).unwrap();
        let fabric = Fabric::new(layout, HealthView::uniform(4, 2, 100_000)).unwrap();
        let sum = ReduceOp::Sum;
        let cases = [
            ScheduleRequest::new(Collective::AllReduce { op: sum }, DType::F32, 4096).with_chunks(4),
            ScheduleRequest::new(Collective::AllReduce { op: sum }, DType::F32, 1000).with_algorithm(Algorithm::Tree),
            ScheduleRequest::new(Collective::ReduceScatter { op: sum }, DType::F32, 1024).with_chunks(2),
            ScheduleRequest::new(Collective::AllGather, DType::F32, 1024),
            ScheduleRequest::new(Collective::Broadcast { root: Rank(1) }, DType::F32, 1024).with_chunks(3),
            ScheduleRequest::new(Collective::AlltoAll, DType::F32, 256),
        ];
        let mut saved = 0;
        for req in cases {
            for r in 0..4 {
                let sched = build_rank_schedule(&fabric, &req, Rank(r)).unwrap();
                let blockers = overwritten_sends(&sched);
                let got = private_sends(&blockers);
                assert_eq!(got, reference(&sched), "{req:?} rank {r}");
                assert_eq!(blockers, reference_blockers(&sched), "{req:?} rank {r}");
                let sends = sched.steps().iter().filter(|s| matches!(s.kind, StepKind::Send { .. })).count();
                saved += sends - got.iter().filter(|&&p| p).count();
            }
        }
        // The ring's all-gather half and every send from the input need no copy.
        assert!(saved > 0);
    }

    #[test]
    fn a_ring_allreduce_copies_its_input_once_straight_to_the_output() {
        let layout = Layout::uniform(4, 1, 2).unwrap();
        let fabric = Fabric::new(layout, HealthView::uniform(4, 2, 100_000)).unwrap();
        let sum = ReduceOp::Sum;
        let ring = ScheduleRequest::new(Collective::AllReduce { op: sum }, DType::F32, 4096).with_chunks(4);
        for r in 0..4 {
            let sched = build_rank_schedule(&fabric, &ring, Rank(r)).unwrap();
            let direct = copies_from_input_now(&sched);
            assert_eq!(direct.iter().filter(|&&d| d).count(), 1, "rank {r}: one input -> output copy");
            let later = sched.steps().iter().enumerate().any(|(i, s)| !direct[i] && touches_input(s));
            assert!(!later, "rank {r}: nothing else reads the input, so it never enters the workspace");
        }
        // A schedule that sends from the input keeps it in the workspace.
        let a2a = ScheduleRequest::new(Collective::AlltoAll, DType::F32, 256);
        let sched = build_rank_schedule(&fabric, &a2a, Rank(0)).unwrap();
        let direct = copies_from_input_now(&sched);
        assert!(sched.steps().iter().enumerate().any(|(i, s)| !direct[i] && touches_input(s)));
    }
}
