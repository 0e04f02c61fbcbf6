//! A deterministic multi-node simulator that drives one `Detector` per node: a simulated
//! clock, a data fabric with injectable NIC/link faults, paced chunk streams with
//! acknowledgements on rail 0 (idle, heartbeat-watched connections on the other rails), and a
//! lossy, delaying, duplicating, reordering OOB network. The detector moves no data, so a
//! stream whose path fails just stops: what the tests check is detection, localization and
//! recovery.

#![allow(dead_code, reason = "each test binary uses a different part of the simulator")]

use r2ccl_core::{NicId, NodeId, Rank};
use r2ccl_detect::{
    Command, ConnId, DetectConfig, DetectEvent, Detector, Member, OobMessage, PathId, PathPair, ProbeId, ProbeResult,
    Verdict,
};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::time::Duration;

/// splitmix64: a tiny seeded generator, enough for fault schedules and network noise.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed ^ 0x9e37_79b9_7f4a_7c15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 > 1.0 - p
    }
    /// Uniform in [0, max].
    pub fn upto(&mut self, max: Duration) -> Duration {
        let n = max.as_nanos() as u64;
        if n == 0 {
            Duration::ZERO
        } else {
            Duration::from_nanos(self.next_u64() % (n + 1))
        }
    }
}

/// The OOB network's behaviour.
#[derive(Clone, Debug)]
pub struct OobModel {
    /// Minimum one-way delay.
    pub base: Duration,
    /// Extra uniform random delay (reorders messages).
    pub jitter: Duration,
    /// Loss probability per message.
    pub loss: f64,
    /// Duplication probability per message.
    pub dup: f64,
    /// Drop exactly the n-th message sent (0-based), whatever `loss` says.
    pub drop_nth: Option<usize>,
}

impl OobModel {
    pub fn clean() -> Self {
        Self { base: Duration::from_micros(200), jitter: Duration::ZERO, loss: 0.0, dup: 0.0, drop_nth: None }
    }
    pub fn noisy(loss: f64) -> Self {
        Self { base: Duration::from_micros(200), jitter: Duration::from_micros(1500), loss, dup: 0.05, drop_nth: None }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NicMode {
    Up,
    /// Link down: the owner gets a link-down event; its sends fail at once.
    Down,
    /// Carrier up, drops everything (black hole).
    Silent,
}

/// A fault action at a given time.
#[derive(Clone, Copy, Debug)]
pub enum Fault {
    LinkDown(NicId),
    LinkUp(NicId),
    Silence(NicId),
    Unsilence(NicId),
    Cut(NicId, NicId),
    Uncut(NicId, NicId),
    /// Hold all traffic between the two NICs until the given time.
    Stall(NicId, NicId, Duration),
}

#[derive(Clone, Debug)]
enum Ev {
    Fault(Fault),
    Oob { to: usize, from: Rank, bytes: Vec<u8> },
    Tick { conn: usize },
    Chunk { conn: usize, seq: u64 },
    Ack { conn: usize, seq: u64 },
    Heartbeat { to: usize, path: PathId },
    Probe { node: usize, probe: ProbeId, result: ProbeResult },
}

/// One simulated data stream `src -> dst` on one path, with a window of unacknowledged
/// chunks. A chunk lost on a failed path is never resent (no replay here), so the stream
/// stalls for good once its window is full.
#[derive(Clone, Debug)]
pub struct Stream {
    pub id: ConnId,
    pub src: usize,
    pub dst: usize,
    pub path: PathPair,
    // sender side
    pub next_seq: u64,
    pub done: u64,
    // receiver side
    pub held: u64,
}

/// An OOB message as it reached a detector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delivered {
    pub at: Duration,
    pub to: usize,
    pub from: Rank,
    pub msg: OobMessage,
}

pub struct Sim {
    pub now: Duration,
    pub cfg: DetectConfig,
    pub dets: Vec<Detector>,
    pub streams: Vec<Stream>,
    nic: BTreeMap<NicId, NicMode>,
    cuts: BTreeSet<(NicId, NicId)>,
    stalls: BTreeMap<(NicId, NicId), Duration>,
    queue: BinaryHeap<Reverse<(Duration, u64, usize)>>,
    evs: Vec<Option<Ev>>,
    seq: u64,
    rng: Rng,
    pub oob: OobModel,
    pub oob_sent: usize,
    pub data_latency: Duration,
    pub chunk_interval: Duration,
    pub expected: Duration,
    pub window: u64,
    /// Every command the detectors gave, with time and node.
    pub log: Vec<(Duration, usize, Command)>,
    pub events: Vec<(usize, DetectEvent)>,
    /// Every OOB message delivered (duplicates included).
    pub delivered: Vec<Delivered>,
}

fn key(a: NicId, b: NicId) -> (NicId, NicId) {
    if a <= b {
        (a, b)
    } else {
        (b, a)
    }
}

impl Sim {
    /// `nodes` nodes with one rank each and `rails` NICs each. Ranks 0 and 1 watch one
    /// connection per rail in each direction (`ConnId(src, dst, rail)`, same rail at both
    /// ends, as the engine registers them); the rail-0 ones carry streams 0->1 and 1->0, the
    /// others stay idle (heartbeats).
    pub fn new(nodes: usize, rails: u16, cfg: DetectConfig, seed: u64, oob: OobModel) -> Self {
        let members: Vec<Member> = (0..nodes as u32).map(|i| Member { rank: Rank(i), node: NodeId(i) }).collect();
        let mut dets: Vec<Detector> =
            (0..nodes as u32).map(|i| Detector::new(cfg.clone(), Rank(i), &members).unwrap()).collect();
        let mut nic = BTreeMap::new();
        for n in 0..nodes as u32 {
            for r in 0..rails {
                nic.insert(NicId::new(n, r), NicMode::Up);
            }
        }
        let mut streams = Vec::new();
        for (src, dst) in [(0usize, 1usize), (1, 0)] {
            for r in 0..rails {
                let id = ConnId::new(src as u32, dst as u32, u32::from(r));
                let path = PathPair { src_nic: NicId::new(src as u32, r), dst_nic: NicId::new(dst as u32, r) };
                dets[src].add_connection(Duration::ZERO, id, path).unwrap();
                dets[dst].add_connection(Duration::ZERO, id, path).unwrap();
                if r == 0 {
                    streams.push(Stream { id, src, dst, path, next_seq: 0, done: 0, held: 0 });
                }
            }
        }
        let mut sim = Self {
            now: Duration::ZERO,
            cfg,
            dets,
            streams,
            nic,
            cuts: BTreeSet::new(),
            stalls: BTreeMap::new(),
            queue: BinaryHeap::new(),
            evs: Vec::new(),
            seq: 0,
            rng: Rng::new(seed),
            oob,
            oob_sent: 0,
            data_latency: Duration::from_micros(100),
            chunk_interval: Duration::from_millis(1),
            expected: Duration::from_millis(2),
            window: 4,
            log: Vec::new(),
            events: Vec::new(),
            delivered: Vec::new(),
        };
        for i in 0..sim.streams.len() {
            let (dst, id, exp) = (sim.streams[i].dst, sim.streams[i].id, sim.expected);
            sim.dets[dst].handle_transfer(Duration::ZERO, id, exp).unwrap();
            sim.push(Duration::ZERO, Ev::Tick { conn: i });
        }
        sim
    }

    fn push(&mut self, at: Duration, ev: Ev) {
        self.seq += 1;
        self.evs.push(Some(ev));
        self.queue.push(Reverse((at, self.seq, self.evs.len() - 1)));
    }

    /// Schedule a fault.
    pub fn at(&mut self, at: Duration, fault: Fault) {
        self.push(at, Ev::Fault(fault));
    }

    fn usable(&self, a: NicId, b: NicId) -> bool {
        self.nic.get(&a) == Some(&NicMode::Up)
            && self.nic.get(&b) == Some(&NicMode::Up)
            && !self.cuts.contains(&key(a, b))
    }

    /// When a message sent now from `a` to `b` arrives, if it does.
    fn deliver(&self, from: Duration, a: NicId, b: NicId) -> Option<Duration> {
        if !self.usable(a, b) {
            return None;
        }
        let start = self.stalls.get(&key(a, b)).map_or(from, |u| from.max(*u));
        Some(start + self.data_latency)
    }

    /// Run until `until` (simulated).
    pub fn run_until(&mut self, until: Duration) {
        loop {
            let t_det = self.dets.iter().filter_map(Detector::poll_timeout).min();
            let t_ev = self.queue.peek().map(|Reverse((t, _, _))| *t);
            let t = match (t_det, t_ev) {
                (Some(a), Some(b)) => a.min(b),
                (a, b) => a.or(b).unwrap_or(until),
            };
            if t > until {
                self.now = until;
                return;
            }
            self.now = self.now.max(t);
            if t_ev == Some(t) {
                let Some(Reverse((_, _, idx))) = self.queue.pop() else { unreachable!() };
                let ev = self.evs[idx].take().unwrap();
                self.process(ev);
            } else {
                for n in 0..self.dets.len() {
                    if self.dets[n].poll_timeout().is_some_and(|d| d <= self.now) {
                        self.dets[n].handle_timeout(self.now).unwrap();
                    }
                }
            }
            self.drain();
        }
    }

    fn process(&mut self, ev: Ev) {
        let now = self.now;
        match ev {
            Ev::Fault(f) => self.apply_fault(f),
            Ev::Oob { to, from, bytes } => {
                let msg = OobMessage::decode(&bytes).unwrap();
                self.delivered.push(Delivered { at: now, to, from, msg });
                self.dets[to].handle_oob(now, from, &bytes).unwrap();
            }
            Ev::Tick { conn } => {
                let s = &self.streams[conn];
                if s.next_seq - s.done < self.window {
                    let (seq, p, src, id) = (s.next_seq, s.path, s.src, s.id);
                    self.streams[conn].next_seq += 1;
                    self.dets[src].handle_transfer(now, id, self.expected).unwrap();
                    if let Some(t) = self.deliver(now, p.src_nic, p.dst_nic) {
                        self.push(t, Ev::Chunk { conn, seq });
                    }
                }
                self.push(now + self.chunk_interval, Ev::Tick { conn });
            }
            Ev::Chunk { conn, seq } => {
                let s = &mut self.streams[conn];
                if seq == s.held {
                    s.held += 1;
                    let (dst, id, p) = (s.dst, s.id, s.path);
                    self.dets[dst].handle_progress(now, id, Some(self.expected)).unwrap();
                    if let Some(t) = self.deliver(now, p.dst_nic, p.src_nic) {
                        self.push(t, Ev::Ack { conn, seq });
                    }
                }
            }
            Ev::Ack { conn, seq } => {
                let s = &mut self.streams[conn];
                if seq == s.done {
                    s.done += 1;
                    let remaining = (s.next_seq > s.done).then_some(self.expected);
                    let (src, id) = (s.src, s.id);
                    self.dets[src].handle_progress(now, id, remaining).unwrap();
                }
            }
            Ev::Heartbeat { to, path } => self.dets[to].handle_heartbeat(now, path).unwrap(),
            Ev::Probe { node, probe, result } => self.dets[node].handle_probe_result(now, probe, result).unwrap(),
        }
    }

    fn apply_fault(&mut self, f: Fault) {
        let now = self.now;
        match f {
            Fault::LinkDown(n) => {
                self.nic.insert(n, NicMode::Down);
                self.dets[n.node.index()].handle_link_down(now, n).unwrap();
            }
            Fault::LinkUp(n) => {
                self.nic.insert(n, NicMode::Up);
                self.dets[n.node.index()].handle_link_up(now, n).unwrap();
            }
            Fault::Silence(n) => {
                self.nic.insert(n, NicMode::Silent);
            }
            Fault::Unsilence(n) => {
                self.nic.insert(n, NicMode::Up);
            }
            Fault::Cut(a, b) => {
                self.cuts.insert(key(a, b));
            }
            Fault::Uncut(a, b) => {
                self.cuts.remove(&key(a, b));
            }
            Fault::Stall(a, b, until) => {
                self.stalls.insert(key(a, b), until);
            }
        }
    }

    fn send_oob(&mut self, from: usize, to: Rank, msg: &OobMessage) {
        let bytes = msg.encode();
        let n = self.oob_sent;
        self.oob_sent += 1;
        if self.oob.drop_nth == Some(n) || self.rng.chance(self.oob.loss) {
            return;
        }
        let copies = if self.rng.chance(self.oob.dup) { 2 } else { 1 };
        for _ in 0..copies {
            let delay = self.oob.base + self.rng.upto(self.oob.jitter);
            let from_rank = Rank(from as u32);
            self.push(self.now + delay, Ev::Oob { to: to.index(), from: from_rank, bytes: bytes.clone() });
        }
    }

    fn drain(&mut self) {
        let now = self.now;
        for n in 0..self.dets.len() {
            while let Some(e) = self.dets[n].poll_event() {
                self.events.push((n, e));
            }
            while let Some(cmd) = self.dets[n].poll_command() {
                self.log.push((now, n, cmd.clone()));
                match cmd {
                    Command::SendOob { to, msg } | Command::AskProbe { to, msg } => self.send_oob(n, to, &msg),
                    Command::StartProbe { probe, from, to } => {
                        if self.nic.get(&from) == Some(&NicMode::Down) {
                            self.push(now, Ev::Probe { node: n, probe, result: ProbeResult::LocalError });
                        } else if let Some(t1) = self.deliver(now, from, to) {
                            if let Some(t2) = self.deliver(t1, to, from) {
                                self.push(t2, Ev::Probe { node: n, probe, result: ProbeResult::Answered });
                            }
                        }
                    }
                    Command::SendHeartbeat { path } => {
                        if let Some(t) = self.deliver(now, path.local, path.remote) {
                            let theirs = PathId { local: path.remote, peer: Rank(n as u32), remote: path.local };
                            self.push(t, Ev::Heartbeat { to: path.peer.index(), path: theirs });
                        }
                    }
                    Command::DeclareFailed { .. } | Command::DeclareRecovered { .. } => {}
                }
            }
        }
    }

    /// Every failure declaration, as (time, node, path, verdict).
    pub fn declared(&self) -> Vec<(Duration, usize, PathId, Verdict)> {
        self.log
            .iter()
            .filter_map(|(t, n, c)| match c {
                Command::DeclareFailed { path, verdict, .. } => Some((*t, *n, *path, *verdict)),
                _ => None,
            })
            .collect()
    }

    /// Every recovery declaration, as (time, node, path).
    pub fn recovered(&self) -> Vec<(Duration, usize, PathId)> {
        self.log
            .iter()
            .filter_map(|(t, n, c)| match c {
                Command::DeclareRecovered { path } => Some((*t, *n, *path)),
                _ => None,
            })
            .collect()
    }

    /// The rail-0 path of node `n` (0 or 1) to the other of the two.
    pub fn rail0(&self, n: usize) -> PathId {
        let (me, peer) = if n == 0 { (0, 1) } else { (1, 0) };
        PathId { local: NicId::new(me, 0), peer: Rank(peer), remote: NicId::new(peer, 0) }
    }
}
