//! `r2ccl-detect` on its own: three ranks' [`Detector`]s (one rank per node, two NICs per
//! node) wired together by a tiny in-memory driver that plays the OOB channel, the probes
//! and the heartbeats. Two faults are injected on rail 0 and the verdicts and commands the
//! detectors produce are printed and checked: a NIC that reports link down (local evidence
//! at its own rank, missed heartbeats and the peer's probe at the other end, then re-probes
//! after the hold-down and recovery after consecutive good probes once the link is back),
//! and a NIC that goes silent without any event (missed heartbeats, probe timeouts,
//! three-point triangulation with the third node). The detectors only judge health: no data
//! moves, and moving it off a failed path is the driver's business (r2ccl's engine migrates
//! lanes with `r2ccl_transport::migrate`). Time is a [`Duration`] since the start of the run;
//! there is no clock, thread or socket anywhere.
//!
//! Run with `cargo run -p r2ccl-detect --example detect_alone`.
#![allow(clippy::print_stdout, reason = "an example prints what it shows")]

use r2ccl_core::{NicId, NodeId, Rank};
use r2ccl_detect::health::StateKind;
use r2ccl_detect::{
    Command, ConnId, DetectConfig, DetectEvent, Detector, Member, Method, OobMessage, PathId, PathPair, PathState,
    ProbeId, ProbeResult, Verdict,
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
    /// Ranks 0..3 on nodes 0..3; ranks 0 and 1 watch one connection per rail in each
    /// direction (`ConnId(src, dst, rail)`, as r2ccl's engine registers them), all idle:
    /// the paths live on heartbeats.
    fn new() -> Result<Self, Box<dyn Error>> {
        let members: Vec<Member> = (0..NODES).map(|i| Member { rank: Rank(i), node: NodeId(i) }).collect();
        let mut dets = Vec::new();
        for m in &members {
            dets.push(Detector::new(DetectConfig::default(), m.rank, &members)?);
        }
        for (src, dst) in [(0u32, 1u32), (1, 0)] {
            for rail in 0..2u16 {
                let conn = ConnId::new(src, dst, u32::from(rail));
                let path = PathPair { src_nic: NicId::new(src, rail), dst_nic: NicId::new(dst, rail) };
                for end in [conn.src, conn.dst] {
                    dets[end.index()].add_connection(Duration::ZERO, conn, path)?;
                }
            }
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

    /// When `rank` declared `path` recovered.
    fn recovered(&self, rank: Rank, path: PathId) -> Vec<Duration> {
        self.commands
            .iter()
            .filter(|(_, r, c)| *r == rank && *c == Command::DeclareRecovered { path })
            .map(|(t, _, _)| *t)
            .collect()
    }

    /// The probe requests `rank` received from others.
    fn probe_requests_to(&self, rank: Rank) -> usize {
        self.commands
            .iter()
            .filter(
                |(_, _, c)| matches!(c, Command::AskProbe { to, msg: OobMessage::ProbeRequest { .. } } if *to == rank),
            )
            .count()
    }
}

fn describe(c: &Command) -> String {
    match c {
        Command::DeclareFailed { path, verdict, method } => format!("DeclareFailed {path}: {verdict} ({method:?})"),
        Command::DeclareRecovered { path } => format!("DeclareRecovered {path}"),
        other => format!("{other:?}"),
    }
}

/// The events worth a line.
fn describe_event(e: &DetectEvent) -> Option<String> {
    Some(match e {
        // Re-probes (Failed -> Probing -> Recovering -> ...) are left out; where they end is shown.
        DetectEvent::PathTransition { to: StateKind::Probing | StateKind::Recovering, .. } => return None,
        DetectEvent::PathTransition { path, from, to, event, .. } => format!("{path}: {from} -> {to} on {event}"),
        DetectEvent::Localized { path, observations: o, .. } => {
            let aux = o.aux.map_or("none".to_owned(), |(a, b)| format!("{a:?}/{b:?}"));
            format!("localized {path}: a->b {:?}, b->a {:?}, aux->a/aux->b {aux}", o.ab, o.ba)
        }
        DetectEvent::HeldDown { path, holddown, flaps, .. } => {
            format!("{path} held down for {holddown:?} ({flaps} flaps) before re-probing")
        }
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

/// NIC 0 of node 0 reports link down at 50 ms and up again at 300 ms.
fn link_down_scenario() -> Result<(), Box<dyn Error>> {
    let a = NicId::new(0, 0);
    let cfg = DetectConfig::default();
    println!("== scenario 1: {a} reports link down at 50 ms, up again at 300 ms");
    let mut c = Cluster::new()?;
    let (t_fault, t_up) = (Duration::from_millis(50), Duration::from_millis(300));
    c.run_until(t_fault)?;
    c.link_down(a)?;
    c.run_until(t_up)?;
    c.link_up(a)?;
    c.run_until(Duration::from_millis(900))?;
    println!("  ({} OOB messages, probes and heartbeats not shown)", c.chatter);

    let rail0_at_0 = PathId { local: a, peer: Rank(1), remote: NicId::new(1, 0) };
    let rail0_at_1 = PathId { local: NicId::new(1, 0), peer: Rank(0), remote: a };
    let d0 = c.declared(Rank(0));
    check(
        d0 == [(t_fault, rail0_at_0, Verdict::LocalNic(a), Method::LocalEvidence)],
        "rank 0 blames its own NIC at once, from local evidence, and declares the path once",
    )?;
    let d1 = c.declared(Rank(1));
    let bound = cfg.heartbeat_timeout() + cfg.heartbeat_interval + cfg.localize_timeout;
    check(
        d1.len() == 1
            && d1[0].1 == rail0_at_1
            && d1[0].2 == Verdict::RemoteNic(a)
            && d1[0].3 == Method::LocalEvidence
            && d1[0].0.saturating_sub(t_fault) <= bound,
        &format!("rank 1 blames node0's NIC within {bound:?} (heartbeats stop; its probe request gets a local error)"),
    )?;
    check([&d0, &d1].iter().all(|d| d.iter().all(|x| x.1.local.rail.0 == 0)), "no rail-1 path is declared failed")?;
    let asked = c.commands.iter().any(|(_, r, cmd)| *r == Rank(0) && matches!(cmd, Command::AskProbe { .. }));
    check(!asked, "rank 0 asks nobody to probe: its local evidence decides")?;
    for (rank, path, declared_at) in [(Rank(0), rail0_at_0, d0[0].0), (Rank(1), rail0_at_1, d1[0].0)] {
        let back = c.recovered(rank, path);
        // The first good probe comes after the hold-down and after the link is back; N - 1
        // more follow, a probe interval apart.
        let earliest = (declared_at + cfg.holddown_base).max(t_up) + cfg.probe_interval * (cfg.good_probes - 1);
        check(
            back.len() == 1 && back[0] >= earliest,
            &format!(
                "{rank} declares {path} recovered once, after the link is back, the hold-down and {} good probes",
                cfg.good_probes
            ),
        )?;
        check(c.dets[rank.index()].path_state(&path) == Some(PathState::Healthy), &format!("{path} is healthy again"))?;
    }
    Ok(())
}

/// NIC 0 of node 1 goes silent at 50 ms; nobody is told.
fn silent_nic_scenario() -> Result<(), Box<dyn Error>> {
    let b = NicId::new(1, 0);
    println!("== scenario 2: {b} goes silent at 50 ms (no link event)");
    let mut c = Cluster::new()?;
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
    check(
        [&d0, &d1].iter().all(|d| d.len() == 1 && d[0].1.local.rail.0 == 0),
        "each end declares its rail-0 path once; the rail-1 paths stay healthy",
    )?;
    let served =
        c.commands.iter().filter(|(_, r, cmd)| *r == Rank(2) && matches!(cmd, Command::StartProbe { .. })).count();
    check(
        c.probe_requests_to(Rank(2)) == 4 && served == 4,
        "the bystander rank 2 runs the four auxiliary probes the two ends ask for (one to each NIC, per end)",
    )?;
    check(
        c.declared(Rank(2)).is_empty()
            && c.commands.iter().all(|(_, r, cmd)| *r != Rank(2) || !matches!(cmd, Command::DeclareRecovered { .. })),
        "rank 2 declares nothing: it watches no path of its own",
    )?;
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    link_down_scenario()?;
    println!();
    silent_nic_scenario()?;
    Ok(())
}
