//! `r2ccl-detect` on its own: three ranks' [`Detector`]s (one rank per node, two NICs per
//! node) wired together by a tiny in-memory driver that plays the OOB channel, the probes
//! and the heartbeats. Two faults are injected on rail 0 and the verdicts and commands the
//! detectors produce are printed and checked: a NIC that reports link down (local evidence,
//! failover to rail 1, then re-probe and fail-back after the link comes back), and a NIC
//! that goes silent without any event (missed heartbeats, probe timeouts, three-point
//! triangulation with the third node). Time is a [`Duration`] since the start of the run;
//! there is no clock, thread or socket anywhere.
//!
//! Run with `cargo run -p r2ccl-detect --example detect_alone`.
#![allow(clippy::print_stdout, reason = "an example prints what it shows")]

use r2ccl_core::{NicId, NodeId, Rank};
use r2ccl_detect::health::StateKind;
use r2ccl_detect::{
    Command, ConnId, DetectConfig, DetectEvent, Detector, Member, Method, OobMessage, PathId, PathPair, ProbeId,
    ProbeResult, ReplanReason, Verdict,
};
use std::error::Error;
use std::time::Duration;

/// One-way delay of the OOB channel, of heartbeats and of probe answers in this driver.
const HOP: Duration = Duration::from_micros(200);
const NODES: u32 = 3;

fn ms(t: Duration) -> String {
    format!("{:>8.3} ms", t.as_secs_f64() * 1e3)
}

/// How a NIC is broken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Broken {
    /// The kernel reported it down: probes from it fail at once, nothing reaches it.
    LinkDown,
    /// It black-holes everything and nobody is told.
    Silent,
}

/// Something the driver hands to a detector at a given time.
#[derive(Clone, Debug)]
enum Input {
    Oob { from: Rank, bytes: Vec<u8> },
    Heartbeat(PathId),
    Probe(ProbeId, ProbeResult),
}

/// The driver: what a transport would do around each rank's detector.
struct Cluster {
    dets: Vec<Detector>,
    now: Duration,
    broken: Option<(NicId, Broken)>,
    queue: Vec<(Duration, usize, Input)>,
    /// Every command any detector issued: (time, rank, command).
    commands: Vec<(Duration, Rank, Command)>,
    /// Every event any detector reported: (rank, event).
    events: Vec<(Rank, DetectEvent)>,
    /// Chatty commands (OOB sends, probes, heartbeats), counted but not printed.
    chatter: usize,
}

impl Cluster {
    /// Ranks 0..3 on nodes 0..3; connections 0->1 and 1->0 on chain [rail 0, rail 1].
    fn new(done: [(ConnId, u64, u64); 2]) -> Result<Self, Box<dyn Error>> {
        let members: Vec<Member> = (0..NODES).map(|i| Member { rank: Rank(i), node: NodeId(i) }).collect();
        let mut dets = Vec::new();
        for m in &members {
            dets.push(Detector::new(DetectConfig::default(), m.rank, &members)?);
        }
        for (conn, _, _) in done {
            let chain = (0..2u16)
                .map(|rail| PathPair { src_nic: NicId::new(conn.src.0, rail), dst_nic: NicId::new(conn.dst.0, rail) })
                .collect::<Vec<_>>();
            for end in [conn.src, conn.dst] {
                dets[end.index()].add_connection(Duration::ZERO, conn, chain.clone())?;
            }
        }
        // Data already moved before the fault: the sender completed `sent` chunks, the
        // receiver holds `held` contiguous ones. Both paths are idle afterwards.
        for (conn, sent, held) in done {
            dets[conn.src.index()].handle_progress(Duration::ZERO, conn, sent, None)?;
            dets[conn.dst.index()].handle_progress(Duration::ZERO, conn, held, None)?;
        }
        let mut c = Self {
            dets,
            now: Duration::ZERO,
            broken: None,
            queue: Vec::new(),
            commands: Vec::new(),
            events: Vec::new(),
            chatter: 0,
        };
        for r in 0..c.dets.len() {
            c.drain(r);
        }
        Ok(c)
    }

    fn is_broken(&self, nic: NicId) -> bool {
        self.broken.is_some_and(|(n, _)| n == nic)
    }

    /// Carry out what detector `r` asked for, and record its events.
    fn drain(&mut self, r: usize) {
        let me = Rank(r as u32);
        let now = self.now;
        while let Some(cmd) = self.dets[r].poll_command() {
            match &cmd {
                Command::SendOob { to, msg } | Command::AskProbe { to, msg } => {
                    self.chatter += 1;
                    let bytes = msg.encode();
                    self.queue.push((now + HOP, to.index(), Input::Oob { from: me, bytes }));
                }
                Command::StartProbe { probe, from, to } => {
                    self.chatter += 1;
                    match self.broken {
                        Some((n, Broken::LinkDown)) if n == *from => {
                            self.queue.push((now, r, Input::Probe(*probe, ProbeResult::LocalError)));
                        }
                        // A probe to or from a dead NIC gets no answer: the detector times it out.
                        _ if self.is_broken(*from) || self.is_broken(*to) => {}
                        _ => self.queue.push((now + HOP + HOP, r, Input::Probe(*probe, ProbeResult::Answered))),
                    }
                }
                Command::SendHeartbeat { path } => {
                    self.chatter += 1;
                    if !self.is_broken(path.local) && !self.is_broken(path.remote) {
                        let theirs = PathId { local: path.remote, peer: me, remote: path.local };
                        self.queue.push((now + HOP, path.peer.index(), Input::Heartbeat(theirs)));
                    }
                }
                other => {
                    println!("{} {me} command {}", ms(now), describe(other));
                    self.commands.push((now, me, cmd.clone()));
                    continue;
                }
            }
            self.commands.push((now, me, cmd));
        }
        while let Some(ev) = self.dets[r].poll_event() {
            if let Some(text) = describe_event(&ev) {
                println!("{} {me} event   {text}", ms(now));
            }
            self.events.push((me, ev));
        }
    }

    /// Advance time to `end`, running every delivery and timer in order.
    fn run_until(&mut self, end: Duration) -> Result<(), Box<dyn Error>> {
        for _ in 0..1_000_000 {
            let next_input = self.queue.iter().map(|q| q.0).min();
            let next_timer = self.dets.iter().filter_map(Detector::poll_timeout).min();
            let Some(t) = next_input.into_iter().chain(next_timer).min().filter(|t| *t <= end) else {
                self.now = end;
                return Ok(());
            };
            self.now = self.now.max(t);
            let now = self.now;
            let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.queue).into_iter().partition(|q| q.0 <= now);
            self.queue = later;
            for (_, r, input) in due {
                match input {
                    Input::Oob { from, bytes } => self.dets[r].handle_oob(now, from, &bytes)?,
                    Input::Heartbeat(path) => self.dets[r].handle_heartbeat(now, path)?,
                    Input::Probe(probe, result) => self.dets[r].handle_probe_result(now, probe, result)?,
                }
                self.drain(r);
            }
            for r in 0..self.dets.len() {
                if self.dets[r].poll_timeout().is_some_and(|t| t <= now) {
                    self.dets[r].handle_timeout(now)?;
                    self.drain(r);
                }
            }
        }
        Err("the driver did not settle (a timer that never advances?)".into())
    }

    /// The NIC reports link down to the detector of its node's rank.
    fn link_down(&mut self, nic: NicId) -> Result<(), Box<dyn Error>> {
        self.broken = Some((nic, Broken::LinkDown));
        let r = nic.node.index();
        self.dets[r].handle_link_down(self.now, nic)?;
        self.drain(r);
        Ok(())
    }

    fn link_up(&mut self, nic: NicId) -> Result<(), Box<dyn Error>> {
        self.broken = None;
        let r = nic.node.index();
        self.dets[r].handle_link_up(self.now, nic)?;
        self.drain(r);
        Ok(())
    }

    fn declared(&self, rank: Rank) -> Vec<(Duration, PathId, Verdict, Method)> {
        self.commands
            .iter()
            .filter(|(_, r, _)| *r == rank)
            .filter_map(|(t, _, c)| match c {
                Command::DeclareFailed { path, verdict, method } => Some((*t, *path, *verdict, *method)),
                _ => None,
            })
            .collect()
    }

    /// (time, epoch, index, boundary) of every MigratePath (`failback` false) or FailBack
    /// (`failback` true) of `conn` at `rank`.
    fn migrations(&self, rank: Rank, conn: ConnId, failback: bool) -> Vec<(Duration, u64, usize, u64)> {
        self.commands
            .iter()
            .filter(|(_, r, _)| *r == rank)
            .filter_map(|(t, _, c)| match *c {
                Command::MigratePath { conn: c, epoch, index, boundary, .. } if c == conn && !failback => {
                    Some((*t, epoch.0, index, boundary))
                }
                Command::FailBack { conn: c, epoch, index, boundary, .. } if c == conn && failback => {
                    Some((*t, epoch.0, index, boundary))
                }
                _ => None,
            })
            .collect()
    }
}

fn describe(c: &Command) -> String {
    match c {
        Command::DeclareFailed { path, verdict, method } => format!("DeclareFailed {path}: {verdict} ({method:?})"),
        Command::Quiesce { conn, path } => format!("Quiesce {conn} on {path}"),
        Command::MigratePath { conn, epoch, from_path, to, index, boundary } => {
            format!(
                "MigratePath {conn} {epoch}: {from_path} -> {to} (chain index {index}), replay from chunk {boundary}"
            )
        }
        Command::FailBack { conn, epoch, from_path, to, index, boundary } => {
            format!("FailBack {conn} {epoch}: {from_path} -> {to} (chain index {index}), replay from chunk {boundary}")
        }
        Command::DeclareRecovered { path } => format!("DeclareRecovered {path}"),
        Command::RequestReplan { reason } => match reason {
            ReplanReason::Migrated { conn } => format!("RequestReplan: {conn} migrated"),
            ReplanReason::HotRepair { origin, conn } => format!("RequestReplan: hot repair of {conn} from {origin}"),
            ReplanReason::Recovered { path } => format!("RequestReplan: {path} recovered"),
            ReplanReason::NoBackup { conn } => format!("RequestReplan: {conn} has no backup"),
        },
        other => format!("{other:?}"),
    }
}

/// The events worth a line (agreements and hot repairs already show as commands).
fn describe_event(e: &DetectEvent) -> Option<String> {
    Some(match e {
        // Re-probes (Failed -> Probing -> Recovering -> ...) are left out; where they end is shown.
        DetectEvent::PathTransition { to: StateKind::Probing | StateKind::Recovering, .. } => return None,
        DetectEvent::PathTransition { path, from, to, event, .. } => format!("{path}: {from} -> {to} on {event}"),
        DetectEvent::Localized { path, observations: o, .. } => {
            let aux = o.aux.map_or("none".to_owned(), |(a, b)| format!("{a:?}/{b:?}"));
            format!("localized {path}: a->b {:?}, b->a {:?}, aux->a/aux->b {aux}", o.ab, o.ba)
        }
        DetectEvent::NoBackup { conn, .. } => format!("{conn} has no usable backup path"),
        _ => return None,
    })
}

fn check(ok: bool, what: &str) -> Result<(), Box<dyn Error>> {
    if ok {
        println!("  ok: {what}");
        Ok(())
    } else {
        Err(format!("check failed: {what}").into())
    }
}

const S01: ConnId = ConnId::new(0, 1, 0);
const S10: ConnId = ConnId::new(1, 0, 0);

/// NIC 0 of node 0 reports link down at 50 ms and up again at 120 ms.
fn link_down_scenario() -> Result<(), Box<dyn Error>> {
    let a = NicId::new(0, 0);
    println!("== scenario 1: {a} reports link down at 50 ms, up again at 120 ms");
    // 0->1: rank 0 sent 40 chunks, rank 1 holds 38. 1->0: rank 1 sent 12, rank 0 holds 12.
    let mut c = Cluster::new([(S01, 40, 38), (S10, 12, 12)])?;
    let t_fault = Duration::from_millis(50);
    c.run_until(t_fault)?;
    c.link_down(a)?;
    c.run_until(Duration::from_millis(120))?;
    c.link_up(a)?;
    c.run_until(Duration::from_millis(800))?;
    println!("  ({} OOB messages, probes and heartbeats not shown)", c.chatter);

    let failed_rail0 = PathId { local: a, peer: Rank(1), remote: NicId::new(1, 0) };
    let d0 = c.declared(Rank(0));
    check(
        d0.first() == Some(&(t_fault, failed_rail0, Verdict::LocalNic(a), Method::LocalEvidence)),
        "rank 0 blames its own NIC at once, from local evidence",
    )?;
    let d1 = c.declared(Rank(1));
    check(
        d1.first()
            .is_some_and(|d| d.2 == Verdict::RemoteNic(a) && d.0.saturating_sub(t_fault) <= Duration::from_millis(20)),
        "rank 1 blames node0's NIC too (its probe request came back with a local error)",
    )?;
    check([&d0, &d1].iter().all(|d| d.iter().all(|x| x.1.local.rail.0 == 0)), "no rail-1 path is declared failed")?;
    for conn in [S01, S10] {
        let s = c.migrations(conn.src, conn, false);
        let r = c.migrations(conn.dst, conn, false);
        check(
            s.len() == 1 && r.len() == 1 && s[0].1 == r[0].1 && s[0].2 == 1 && s[0].3 == r[0].3,
            &format!("both ends of {conn} migrate to rail 1 with the same epoch and boundary"),
        )?;
        check(
            s[0].0.max(r[0].0).saturating_sub(t_fault) <= Duration::from_millis(10),
            &format!("{conn} agreed within 10 ms"),
        )?;
    }
    check(c.migrations(Rank(0), S01, false)[0].3 == 38, "0->1 replays from chunk 38 = min(sent 40, held 38)")?;
    let recovered = c.commands.iter().any(|(t, r, cmd)| {
        *r == Rank(0)
            && *t >= t_fault + DetectConfig::default().holddown_base
            && *cmd == Command::DeclareRecovered { path: failed_rail0 }
    });
    check(recovered, "rank 0 declares the path recovered only after the hold-down and the good probes")?;
    for conn in [S01, S10] {
        let s = c.migrations(conn.src, conn, true);
        let r = c.migrations(conn.dst, conn, true);
        check(
            s.len() == 1 && r.len() == 1 && s[0].1 == r[0].1 && s[0].2 == 0,
            &format!("{conn} fails back to rail 0 on both ends"),
        )?;
    }
    Ok(())
}

/// NIC 0 of node 1 goes silent at 50 ms; nobody is told.
fn silent_nic_scenario() -> Result<(), Box<dyn Error>> {
    let b = NicId::new(1, 0);
    println!("== scenario 2: {b} goes silent at 50 ms (no link event)");
    let mut c = Cluster::new([(S01, 7, 7), (S10, 3, 3)])?;
    let t_fault = Duration::from_millis(50);
    c.run_until(t_fault)?;
    c.broken = Some((b, Broken::Silent));
    c.run_until(Duration::from_millis(400))?;
    println!("  ({} OOB messages, probes and heartbeats not shown)", c.chatter);

    let cfg = DetectConfig::default();
    let bound = cfg.heartbeat_timeout() + cfg.heartbeat_interval + cfg.localize_timeout;
    let suspect = c.events.iter().any(|(r, e)| {
        *r == Rank(0)
            && matches!(e, DetectEvent::PathTransition { to: StateKind::Suspect, path, .. } if path.remote == b)
    });
    check(suspect, "rank 0 suspects the rail-0 path after missed heartbeats")?;
    let d0 = c.declared(Rank(0));
    check(
        d0.first().is_some_and(|d| d.2 == Verdict::RemoteNic(b) && d.3 == Method::Triangulated),
        "rank 0 blames node1's NIC by triangulation (node2 reaches node0 but not node1)",
    )?;
    check(
        d0.first().is_some_and(|d| d.0.saturating_sub(t_fault) <= bound),
        &format!("verdict within {bound:?} of the fault"),
    )?;
    let d1 = c.declared(Rank(1));
    check(
        d1.first().is_some_and(|d| d.2 == Verdict::LocalNic(b) && d.3 == Method::Triangulated),
        "rank 1 blames its own NIC by triangulation",
    )?;
    for conn in [S01, S10] {
        let s = c.migrations(conn.src, conn, false);
        let r = c.migrations(conn.dst, conn, false);
        check(
            !s.is_empty() && !r.is_empty() && s[0].1 == r[0].1 && s[0].2 == 1 && s[0].3 == r[0].3,
            &format!("both ends of {conn} migrate to rail 1 with the same epoch and boundary"),
        )?;
    }
    let repaired = c.events.iter().any(|(r, e)| *r == Rank(2) && matches!(e, DetectEvent::HotRepairReceived { .. }));
    check(repaired, "the bystander rank 2 hears of the hot repair (and requests a re-plan)")?;
    let stray = c.commands.iter().any(
        |(_, _, cmd)| matches!(cmd, Command::SendOob { msg: OobMessage::FailoverReq { index, .. }, .. } if *index != 1),
    );
    check(!stray, "every failover request names the rail-1 backup")?;
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    link_down_scenario()?;
    println!();
    silent_nic_scenario()?;
    Ok(())
}
