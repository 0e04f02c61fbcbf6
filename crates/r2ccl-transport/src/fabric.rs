//! An in-memory fabric: N ranks x K NICs in one process, single-threaded and deterministic
//! under a seed, driven by a simulated clock, with fault injection.
//!
//! Model: every NIC has one egress queue served at its bandwidth (times a slow-down factor);
//! a message arrives after its transmission ends plus the base latency, both NICs' added delay
//! and a seeded jitter. A send completes when its message arrives at the peer's NIC (a remote
//! completion), or with [`FabricConfig::local_completion`] when it is posted; arrived messages wait in the receiving path's inbox until a receive is posted.
//! Probes use separate endpoints: they skip the egress queue.
//!
//! Faults, applied at scheduled times or at once:
//! - NIC down: its queued sends fail with [`PathFault::LocalNicDown`], its posted receives fail,
//!   its inbox is lost, its node's ranks get a link-down event, and messages to it vanish.
//! - Link down between two NICs, and black hole on a NIC: messages vanish silently (no
//!   completion, no error), in both directions; probes get no answer.
//! - Slow NIC (bandwidth per mille) and added delay per NIC.
//!
//! Ingress bandwidth is not modelled; a receiving NIC takes messages at any rate.

use crate::transport::{Completion, CompletionKind};
use crate::{MemHandle, PathEvidence, PathFault, PathId, RequestId, Transport, TransportError, TransportEvent};
use r2ccl_core::{NicId, NodeId, RailId, Rank};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

/// Shape and timing of a fabric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FabricConfig {
    /// Number of nodes.
    pub nodes: u32,
    /// Ranks per node (rank r is on node r / ranks_per_node).
    pub ranks_per_node: u32,
    /// NICs per node.
    pub nics_per_node: u16,
    /// Line rate of every NIC in bytes per second.
    pub nic_bytes_per_sec: u64,
    /// One-way latency between two NICs.
    pub latency: Duration,
    /// Upper bound of the seeded random extra latency per message.
    pub jitter: Duration,
    /// Seed of the fabric's random choices (jitter, cancel races).
    pub seed: u64,
    /// Per mille of cancelled sends whose message still arrives (as on a real wire).
    pub cancel_race_permille: u16,
    /// A data send completes when it is posted (its bytes are copied out at once), as over TCP
    /// where the kernel takes them, instead of when it arrives: a black hole or a link down
    /// then loses bytes whose sends completed, and only the receiver's receipt says they
    /// arrived.
    pub local_completion: bool,
}

impl Default for FabricConfig {
    fn default() -> Self {
        Self {
            nodes: 2,
            ranks_per_node: 1,
            nics_per_node: 2,
            nic_bytes_per_sec: 1_000_000_000,
            latency: Duration::from_micros(5),
            jitter: Duration::from_micros(2),
            seed: 1,
            cancel_race_permille: 0,
            local_completion: false,
        }
    }
}

/// A fault (or its repair) to inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultAction {
    /// The NIC's link goes down.
    NicDown(NicId),
    /// The NIC's link comes back.
    NicUp(NicId),
    /// The link between two NICs (either direction) stops carrying messages, silently.
    LinkDown(NicId, NicId),
    /// The link between two NICs works again.
    LinkUp(NicId, NicId),
    /// The NIC starts (`true`) or stops (`false`) swallowing every message, with its link up.
    BlackHole(NicId, bool),
    /// The NIC's bandwidth becomes `permille` / 1000 of its line rate (1000 = full speed).
    Slow(NicId, u32),
    /// The NIC adds `extra` latency to every message through it.
    Delay(NicId, Duration),
}

/// Counters of one NIC.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NicStats {
    /// Payload bytes (without chunk headers) of data messages posted on the NIC.
    pub tx_payload: u64,
    /// Data messages posted on the NIC.
    pub tx_messages: u64,
    /// Messages from or to the NIC that vanished in a fault.
    pub dropped: u64,
}

#[derive(Clone, Copy, Debug)]
struct NicState {
    down: bool,
    black_hole: bool,
    /// When the black hole began.
    black_hole_since: Duration,
    permille: u32,
    delay: Duration,
    busy_until: Duration,
    stats: NicStats,
}

#[derive(Clone, Debug)]
enum Body {
    Data(Vec<u8>),
    Probe,
}

#[derive(Clone, Debug)]
struct Msg {
    src: Rank,
    dst: Rank,
    src_nic: NicId,
    dst_nic: NicId,
    req: Option<RequestId>,
    body: Body,
}

type Slot = (Duration, u64);

/// The in-memory fabric; [`MemFabric::port`] gives one rank's [`Transport`].
#[derive(Debug)]
pub struct MemFabric {
    cfg: FabricConfig,
    now: Duration,
    rng: u64,
    seq: u64,
    next_req: u64,
    next_handle: u64,
    nics: Vec<NicState>,
    links_down: BTreeSet<(NicId, NicId)>,
    pending: BTreeMap<Slot, Msg>,
    sends: BTreeMap<RequestId, (Rank, PathId, Slot)>,
    recvs: BTreeMap<RequestId, (Rank, PathId)>,
    posted: BTreeMap<(Rank, PathId), VecDeque<(RequestId, usize)>>,
    inbox: BTreeMap<(Rank, PathId), VecDeque<Vec<u8>>>,
    events: Vec<VecDeque<TransportEvent>>,
    regions: BTreeMap<MemHandle, (Rank, Vec<u8>)>,
    faults: BTreeMap<Slot, FaultAction>,
    /// Whether ports answer [`Transport::path_evidence`] (see [`MemFabric::set_kernel_evidence`]).
    kernel_evidence: bool,
    /// `(sender, path)` pairs whose last message vanished in a fault: a kernel would still hold
    /// its bytes as unacknowledged.
    unacked: BTreeSet<(Rank, PathId)>,
}

impl MemFabric {
    /// An idle fabric at time zero.
    pub fn new(cfg: FabricConfig) -> Self {
        let nic_count = cfg.nodes as usize * cfg.nics_per_node as usize;
        let nic = NicState {
            down: false,
            black_hole: false,
            black_hole_since: Duration::ZERO,
            permille: 1000,
            delay: Duration::ZERO,
            busy_until: Duration::ZERO,
            stats: NicStats::default(),
        };
        Self {
            cfg,
            now: Duration::ZERO,
            rng: cfg.seed ^ 0x9e37_79b9_7f4a_7c15,
            seq: 0,
            next_req: 1,
            next_handle: 1,
            nics: vec![nic; nic_count],
            links_down: BTreeSet::new(),
            pending: BTreeMap::new(),
            sends: BTreeMap::new(),
            recvs: BTreeMap::new(),
            posted: BTreeMap::new(),
            inbox: BTreeMap::new(),
            events: vec![VecDeque::new(); (cfg.nodes * cfg.ranks_per_node) as usize],
            regions: BTreeMap::new(),
            faults: BTreeMap::new(),
            kernel_evidence: false,
            unacked: BTreeSet::new(),
        }
    }

    /// The configuration.
    pub const fn config(&self) -> &FabricConfig {
        &self.cfg
    }

    /// The fabric's clock (the latest time it was advanced to).
    pub const fn now(&self) -> Duration {
        self.now
    }

    /// Number of ranks.
    pub fn ranks(&self) -> u32 {
        self.cfg.nodes * self.cfg.ranks_per_node
    }

    /// The node of `rank`.
    pub fn node_of(&self, rank: Rank) -> Option<NodeId> {
        (rank.0 < self.ranks()).then(|| NodeId(rank.0 / self.cfg.ranks_per_node.max(1)))
    }

    /// The bytes of a region registered by `rank` (read-only access without a port).
    pub fn region(&self, rank: Rank, handle: MemHandle) -> Result<&[u8], TransportError> {
        self.region_of(rank, handle).map(Vec::as_slice)
    }

    /// One rank's transport.
    pub fn port(&mut self, rank: Rank) -> Result<FabricPort<'_>, TransportError> {
        if rank.0 >= self.ranks() {
            return Err(TransportError::UnknownRank(rank));
        }
        Ok(FabricPort { fabric: self, rank })
    }

    /// Counters of `nic` (zero for an unknown NIC).
    pub fn nic_stats(&self, nic: NicId) -> NicStats {
        self.nic_index(nic).map(|i| self.nics[i].stats).unwrap_or_default()
    }

    /// Makes ports answer [`Transport::path_evidence`] as a kernel's TCP state would: a path
    /// through a black-holed NIC, with a send of the asking rank outstanding on it, is
    /// [`PathEvidence::Silent`] once the black hole is `quiet` old; a passable path is
    /// [`PathEvidence::Acking`]. Off by default (the ports then know nothing, as a backend
    /// without such evidence).
    pub fn set_kernel_evidence(&mut self, on: bool) {
        self.kernel_evidence = on;
    }

    /// Schedules `action` at time `at` (applied when the clock passes it, before messages
    /// arriving at the same time).
    pub fn schedule(&mut self, at: Duration, action: FaultAction) {
        let s = self.next_seq();
        self.faults.insert((at, s), action);
    }

    /// Applies `action` now.
    pub fn apply(&mut self, action: FaultAction) {
        let now = self.now;
        self.apply_fault(now, action);
    }

    /// Puts raw bytes on the wire from `src` (on `src_nic`) to `dst` (on `dst_nic`), as a
    /// misbehaving peer would; no completion goes back to anyone.
    pub fn inject(&mut self, src: Rank, src_nic: NicId, dst: Rank, dst_nic: NicId, bytes: Vec<u8>) {
        let at = self.now + self.cfg.latency;
        let s = self.next_seq();
        self.pending.insert((at, s), Msg { src, dst, src_nic, dst_nic, req: None, body: Body::Data(bytes) });
    }

    /// When something next happens (a message arrives or a fault fires), if anything is pending.
    pub fn next_event_time(&self) -> Option<Duration> {
        let m = self.pending.keys().next().map(|k| k.0);
        let f = self.faults.keys().next().map(|k| k.0);
        match (m, f) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Moves the clock to `now` (never backwards), firing faults and delivering messages due.
    pub fn advance(&mut self, now: Duration) {
        loop {
            let f = self.faults.first_key_value().map(|(k, _)| *k).filter(|k| k.0 <= now);
            let m = self.pending.first_key_value().map(|(k, _)| *k).filter(|k| k.0 <= now);
            match (f, m) {
                (Some(fk), mk) if mk.is_none_or(|mk| fk.0 <= mk.0) => {
                    if let Some(a) = self.faults.remove(&fk) {
                        self.now = self.now.max(fk.0);
                        self.apply_fault(fk.0, a);
                    }
                }
                (_, Some(mk)) => {
                    if let Some(msg) = self.pending.remove(&mk) {
                        self.now = self.now.max(mk.0);
                        self.deliver(msg);
                    }
                }
                _ => break,
            }
        }
        self.now = self.now.max(now);
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    fn random(&mut self) -> u64 {
        // splitmix64
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn jitter(&mut self) -> Duration {
        let j = u64::try_from(self.cfg.jitter.as_nanos()).unwrap_or(u64::MAX);
        if j == 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos(self.random() % (j + 1))
    }

    fn nic_index(&self, nic: NicId) -> Option<usize> {
        (nic.node.0 < self.cfg.nodes && nic.rail.0 < self.cfg.nics_per_node)
            .then(|| nic.node.index() * self.cfg.nics_per_node as usize + nic.rail.index())
    }

    fn nic(&self, nic: NicId) -> Option<&NicState> {
        self.nic_index(nic).map(|i| &self.nics[i])
    }

    fn nic_mut(&mut self, nic: NicId) -> Option<&mut NicState> {
        self.nic_index(nic).map(|i| &mut self.nics[i])
    }

    fn ranks_on(&self, node: NodeId) -> impl Iterator<Item = Rank> {
        let k = self.cfg.ranks_per_node;
        (node.0 * k..node.0 * k + k).map(Rank)
    }

    fn push(&mut self, rank: Rank, ev: TransportEvent) {
        if let Some(q) = self.events.get_mut(rank.index()) {
            q.push_back(ev);
        }
    }

    fn complete(&mut self, rank: Rank, req: RequestId, path: PathId, kind: CompletionKind) {
        self.push(rank, TransportEvent::Completion(Completion { req, path, kind }));
    }

    fn link_key(a: NicId, b: NicId) -> (NicId, NicId) {
        if a <= b {
            (a, b)
        } else {
            (b, a)
        }
    }

    fn passable(&self, a: NicId, b: NicId) -> bool {
        let ok = |n: NicId| self.nic(n).is_some_and(|s| !s.down && !s.black_hole);
        ok(a) && ok(b) && !self.links_down.contains(&Self::link_key(a, b))
    }

    fn apply_fault(&mut self, at: Duration, action: FaultAction) {
        tracing::info!(target: r2ccl_core::subsys::SIM, ?at, ?action, "fault");
        match action {
            FaultAction::NicDown(nic) => self.nic_down(at, nic),
            FaultAction::NicUp(nic) => {
                if self.nic(nic).is_some_and(|s| s.down) {
                    if let Some(s) = self.nic_mut(nic) {
                        s.down = false;
                        s.busy_until = at;
                    }
                    for r in self.ranks_on(nic.node).collect::<Vec<_>>() {
                        self.push(r, TransportEvent::LinkState { nic, up: true });
                    }
                }
            }
            FaultAction::LinkDown(a, b) => {
                self.links_down.insert(Self::link_key(a, b));
            }
            FaultAction::LinkUp(a, b) => {
                self.links_down.remove(&Self::link_key(a, b));
            }
            FaultAction::BlackHole(nic, on) => {
                if let Some(s) = self.nic_mut(nic) {
                    if on && !s.black_hole {
                        s.black_hole_since = at;
                    }
                    s.black_hole = on;
                }
            }
            FaultAction::Slow(nic, permille) => {
                if let Some(s) = self.nic_mut(nic) {
                    s.permille = permille.max(1);
                }
            }
            FaultAction::Delay(nic, extra) => {
                if let Some(s) = self.nic_mut(nic) {
                    s.delay = extra;
                }
            }
        }
    }

    fn nic_down(&mut self, at: Duration, nic: NicId) {
        match self.nic_mut(nic) {
            Some(s) if !s.down => {
                s.down = true;
                s.busy_until = at;
            }
            _ => return,
        }
        for r in self.ranks_on(nic.node).collect::<Vec<_>>() {
            self.push(r, TransportEvent::LinkState { nic, up: false });
        }
        let lost: Vec<Slot> = self.pending.iter().filter(|(_, m)| m.src_nic == nic).map(|(k, _)| *k).collect();
        for k in lost {
            if let Some(m) = self.pending.remove(&k) {
                if let Some(req) = m.req {
                    self.sends.remove(&req);
                    let path = PathId::new(m.src_nic, m.dst, m.dst_nic);
                    self.complete(m.src, req, path, CompletionKind::Failed(PathFault::LocalNicDown));
                }
            }
        }
        let posted: Vec<(Rank, PathId)> = self.posted.keys().filter(|(_, p)| p.local == nic).copied().collect();
        for key in posted {
            for (req, _) in self.posted.remove(&key).unwrap_or_default() {
                self.recvs.remove(&req);
                self.complete(key.0, req, key.1, CompletionKind::Failed(PathFault::LocalNicDown));
            }
        }
        self.inbox.retain(|(_, p), _| p.local != nic);
    }

    fn deliver(&mut self, m: Msg) {
        if let Some(req) = m.req {
            self.sends.remove(&req);
        }
        let send_path = PathId::new(m.src_nic, m.dst, m.dst_nic);
        if !self.passable(m.src_nic, m.dst_nic) {
            for n in [m.src_nic, m.dst_nic] {
                if let Some(s) = self.nic_mut(n) {
                    s.stats.dropped += 1;
                }
            }
            self.unacked.insert((m.src, send_path));
            return;
        }
        self.unacked.remove(&(m.src, send_path));
        match m.body {
            Body::Probe => {
                if let Some(req) = m.req {
                    self.complete(m.src, req, send_path, CompletionKind::ProbeOk);
                }
            }
            Body::Data(bytes) => {
                if let Some(req) = m.req {
                    self.complete(m.src, req, send_path, CompletionKind::Sent);
                }
                let key = (m.dst, PathId::new(m.dst_nic, m.src, m.src_nic));
                self.offer(key, bytes);
            }
        }
    }

    fn offer(&mut self, key: (Rank, PathId), bytes: Vec<u8>) {
        match self.posted.get_mut(&key).and_then(VecDeque::pop_front) {
            Some((req, cap)) => {
                self.recvs.remove(&req);
                let kind = if bytes.len() <= cap {
                    CompletionKind::Received(bytes)
                } else {
                    CompletionKind::Failed(PathFault::Endpoint)
                };
                self.complete(key.0, req, key.1, kind);
            }
            None => self.inbox.entry(key).or_default().push_back(bytes),
        }
    }

    fn check_path(&self, rank: Rank, path: PathId) -> Result<(), TransportError> {
        let node = self.node_of(rank).ok_or(TransportError::UnknownRank(rank))?;
        if path.local.node != node || self.nic_index(path.local).is_none() {
            return Err(TransportError::NotLocalNic { nic: path.local, rank });
        }
        let peer_node = self.node_of(path.peer).ok_or(TransportError::UnknownRank(path.peer))?;
        if path.remote.node != peer_node || self.nic_index(path.remote).is_none() {
            return Err(TransportError::NotPeerNic { nic: path.remote, peer: path.peer });
        }
        Ok(())
    }

    fn wire_delay(&mut self, a: NicId, b: NicId) -> Duration {
        let da = self.nic(a).map_or(Duration::ZERO, |s| s.delay);
        let db = self.nic(b).map_or(Duration::ZERO, |s| s.delay);
        self.cfg.latency + da + db + self.jitter()
    }

    fn region_of(&self, rank: Rank, h: MemHandle) -> Result<&Vec<u8>, TransportError> {
        match self.regions.get(&h) {
            Some((owner, bytes)) if *owner == rank => Ok(bytes),
            _ => Err(TransportError::UnknownHandle(h)),
        }
    }

    fn new_req(&mut self) -> RequestId {
        let r = RequestId(self.next_req);
        self.next_req += 1;
        r
    }
}

/// One rank's view of a [`MemFabric`].
#[derive(Debug)]
pub struct FabricPort<'a> {
    fabric: &'a mut MemFabric,
    rank: Rank,
}

impl FabricPort<'_> {
    /// The fabric behind the port.
    pub fn fabric(&mut self) -> &mut MemFabric {
        self.fabric
    }
}

impl Transport for FabricPort<'_> {
    fn rank(&self) -> Rank {
        self.rank
    }

    fn local_nics(&self) -> Vec<NicId> {
        let node = self.fabric.node_of(self.rank).unwrap_or(NodeId(0));
        (0..self.fabric.cfg.nics_per_node).map(|r| NicId { node, rail: RailId(r) }).collect()
    }

    fn register(&mut self, len: usize) -> Result<MemHandle, TransportError> {
        let h = MemHandle(self.fabric.next_handle);
        self.fabric.next_handle += 1;
        self.fabric.regions.insert(h, (self.rank, vec![0; len]));
        Ok(h)
    }

    fn deregister(&mut self, handle: MemHandle) -> Result<(), TransportError> {
        self.fabric.region_of(self.rank, handle)?;
        self.fabric.regions.remove(&handle);
        Ok(())
    }

    fn region(&self, handle: MemHandle) -> Result<&[u8], TransportError> {
        self.fabric.region_of(self.rank, handle).map(Vec::as_slice)
    }

    fn region_mut(&mut self, handle: MemHandle) -> Result<&mut [u8], TransportError> {
        match self.fabric.regions.get_mut(&handle) {
            Some((owner, bytes)) if *owner == self.rank => Ok(bytes.as_mut_slice()),
            _ => Err(TransportError::UnknownHandle(handle)),
        }
    }

    fn region_pair(&mut self, src: MemHandle, dst: MemHandle) -> Result<(&[u8], &mut [u8]), TransportError> {
        if src == dst {
            return Err(TransportError::NoRegionPair { src, dst });
        }
        self.fabric.region_of(self.rank, src)?;
        self.fabric.region_of(self.rank, dst)?;
        // One pass of iter_mut lends disjoint entries.
        let (mut a, mut b) = (None, None);
        for (h, (_, bytes)) in &mut self.fabric.regions {
            if *h == src {
                a = Some(&*bytes);
            } else if *h == dst {
                b = Some(bytes);
            }
        }
        match (a, b) {
            (Some(a), Some(b)) => Ok((a.as_slice(), b.as_mut_slice())),
            _ => Err(TransportError::NoRegionPair { src, dst }),
        }
    }

    fn post_send(
        &mut self,
        now: Duration,
        path: PathId,
        header: &[u8],
        src: MemHandle,
        offset: usize,
        len: usize,
    ) -> Result<RequestId, TransportError> {
        let f = &mut *self.fabric;
        f.check_path(self.rank, path)?;
        let region = f.region_of(self.rank, src)?;
        let size = region.len();
        let payload = offset
            .checked_add(len)
            .and_then(|end| region.get(offset..end))
            .ok_or(TransportError::OutOfBounds { offset, len, size })?;
        let mut bytes = Vec::with_capacity(header.len() + len);
        bytes.extend_from_slice(header);
        bytes.extend_from_slice(payload);
        let req = f.new_req();
        let t0 = now.max(f.now);
        let bps = f.cfg.nic_bytes_per_sec.max(1);
        let Some(nic) = f.nic_mut(path.local) else {
            return Err(TransportError::NotLocalNic { nic: path.local, rank: self.rank });
        };
        if nic.down {
            f.complete(self.rank, req, path, CompletionKind::Failed(PathFault::LocalNicDown));
            return Ok(req);
        }
        nic.stats.tx_payload += len as u64;
        nic.stats.tx_messages += 1;
        let rate = u128::from(bps) * u128::from(nic.permille) / 1000;
        let ns = u64::try_from(bytes.len() as u128 * 1_000_000_000 / rate.max(1)).unwrap_or(u64::MAX);
        let start = t0.max(nic.busy_until);
        nic.busy_until = start + Duration::from_nanos(ns);
        let arrival = nic.busy_until + f.wire_delay(path.local, path.remote);
        let slot = (arrival, f.next_seq());
        let local = f.cfg.local_completion;
        let msg = Msg {
            src: self.rank,
            dst: path.peer,
            src_nic: path.local,
            dst_nic: path.remote,
            req: (!local).then_some(req),
            body: Body::Data(bytes),
        };
        f.pending.insert(slot, msg);
        if local {
            f.complete(self.rank, req, path, CompletionKind::Sent);
        } else {
            f.sends.insert(req, (self.rank, path, slot));
        }
        Ok(req)
    }

    fn post_recv(&mut self, _now: Duration, path: PathId, capacity: usize) -> Result<RequestId, TransportError> {
        let f = &mut *self.fabric;
        f.check_path(self.rank, path)?;
        let req = f.new_req();
        if f.nic(path.local).is_some_and(|s| s.down) {
            f.complete(self.rank, req, path, CompletionKind::Failed(PathFault::LocalNicDown));
            return Ok(req);
        }
        let key = (self.rank, path);
        f.posted.entry(key).or_default().push_back((req, capacity));
        f.recvs.insert(req, key);
        if let Some(bytes) = f.inbox.get_mut(&key).and_then(VecDeque::pop_front) {
            f.offer(key, bytes);
        }
        Ok(req)
    }

    fn path_evidence(&mut self, now: Duration, path: PathId, quiet: Duration) -> PathEvidence {
        let f = &*self.fabric;
        if !f.kernel_evidence {
            return PathEvidence::Unknown;
        }
        if f.passable(path.local, path.remote) {
            return PathEvidence::Acking;
        }
        let silent_for = |n: NicId| f.nic(n).filter(|s| s.black_hole).map(|s| now.saturating_sub(s.black_hole_since));
        let silent = [path.local, path.remote].into_iter().filter_map(silent_for).max();
        let in_flight =
            f.unacked.contains(&(self.rank, path)) || f.sends.values().any(|&(r, p, _)| r == self.rank && p == path);
        match silent {
            Some(d) if d >= quiet && in_flight => PathEvidence::Silent,
            _ => PathEvidence::Unknown,
        }
    }

    fn post_probe(&mut self, now: Duration, path: PathId) -> Result<RequestId, TransportError> {
        let f = &mut *self.fabric;
        f.check_path(self.rank, path)?;
        let req = f.new_req();
        if f.nic(path.local).is_some_and(|s| s.down) {
            f.complete(self.rank, req, path, CompletionKind::Failed(PathFault::LocalNicDown));
            return Ok(req);
        }
        let one_way = f.wire_delay(path.local, path.remote);
        let at = now.max(f.now) + one_way + one_way;
        let slot = (at, f.next_seq());
        let msg = Msg {
            src: self.rank,
            dst: path.peer,
            src_nic: path.local,
            dst_nic: path.remote,
            req: Some(req),
            body: Body::Probe,
        };
        f.pending.insert(slot, msg);
        f.sends.insert(req, (self.rank, path, slot));
        Ok(req)
    }

    fn cancel(&mut self, _now: Duration, req: RequestId) -> Result<(), TransportError> {
        let f = &mut *self.fabric;
        if let Some(&(rank, path, slot)) = f.sends.get(&req) {
            if rank != self.rank {
                return Err(TransportError::UnknownRequest(req));
            }
            f.sends.remove(&req);
            let race = u64::from(f.cfg.cancel_race_permille) > f.random() % 1000;
            if race {
                // Already on the wire: the bytes still arrive, but nobody hears of the send.
                if let Some(m) = f.pending.get_mut(&slot) {
                    m.req = None;
                }
            } else {
                f.pending.remove(&slot);
            }
            f.complete(self.rank, req, path, CompletionKind::Cancelled);
            return Ok(());
        }
        if let Some(&(rank, path)) = f.recvs.get(&req) {
            if rank != self.rank {
                return Err(TransportError::UnknownRequest(req));
            }
            f.recvs.remove(&req);
            if let Some(q) = f.posted.get_mut(&(rank, path)) {
                q.retain(|(r, _)| *r != req);
            }
            f.complete(self.rank, req, path, CompletionKind::Cancelled);
            return Ok(());
        }
        Err(TransportError::UnknownRequest(req))
    }

    fn cancel_path(&mut self, now: Duration, path: PathId) -> usize {
        let rank = self.rank;
        let f = &*self.fabric;
        let mut reqs: Vec<RequestId> = f
            .sends
            .iter()
            .filter(|(_, (r, p, slot))| {
                *r == rank && *p == path && f.pending.get(slot).is_some_and(|m| matches!(m.body, Body::Data(_)))
            })
            .map(|(q, _)| *q)
            .collect();
        reqs.extend(f.posted.get(&(rank, path)).into_iter().flatten().map(|(q, _)| *q));
        reqs.iter().filter(|&&q| self.cancel(now, q).is_ok()).count()
    }

    fn progress(&mut self, now: Duration) {
        self.fabric.advance(now);
    }

    fn poll_event(&mut self) -> Option<TransportEvent> {
        self.fabric.events.get_mut(self.rank.index()).and_then(VecDeque::pop_front)
    }

    fn poll_timeout(&self) -> Option<Duration> {
        self.fabric.next_event_time()
    }
}
