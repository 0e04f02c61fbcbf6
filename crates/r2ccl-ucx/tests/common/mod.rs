//! Shared multi-process driver: a test (or bench) binary re-executes itself as rank processes that run
//! `r2ccl_transport::Session` over `UcxTransport`; the parent is the bootstrap table and the OOB control
//! plane (it relays `TO <rank> ...` lines between the ranks' stdin/stdout).
//!
//! Each rank sends one transfer to the next rank (ring) or rank 0 sends to rank 1 (`one`), striped over
//! all its NICs; the control plane tells peers about path failures and NIC changes, agrees replay
//! boundaries (`min(sender_done, receiver held)`), marks stalled paths down (a silent black hole), and
//! re-probes down paths. Every receiver checks its bytes bit for bit.
#![allow(dead_code, reason = "each test binary uses a different part of the driver")]

pub mod testbed;

use r2ccl_core::{NicId, NodeId, Rank};
use r2ccl_transport::migrate::{
    MigrateAck, MigrateConfig, MigrateOutput, MigrateReq, Migrations, Receiver as MigrateReceiver, ReqOutcome,
};
use r2ccl_transport::{
    Buffer, CommId, LaneId, PathFault, PathId, RequestId, Session, SessionConfig, SessionError, SessionEvent, Topology,
    TransferKey, Transport,
};
use r2ccl_ucx::{EndpointAuth, UcxTransport, UcxTransportConfig};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Marks a re-executed rank process.
pub const ROLE_VAR: &str = "R2CCL_UCX_RANK_ROLE";

/// Deterministic test bytes.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(151).wrapping_add(seed) ^ ((i >> 11) as u8).rotate_left(3)).collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap()).collect()
}

/// Wall clock in ns (comparable across the processes of one host).
pub fn unix_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// What a rank process does.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Number of ranks.
    pub ranks: u32,
    /// NIC names (the same on every rank).
    pub devices: Vec<String>,
    /// Bytes per transfer.
    pub bytes: usize,
    /// `ring` (r sends to r+1) or `one` (0 sends to 1).
    pub pattern: String,
    /// Session chunk size.
    pub chunk: u32,
    /// Session window per lane.
    pub window: u32,
    /// Stall timeout (ms) of the stand-in detector.
    pub stall_ms: u64,
    /// R2CCL_FAULT for the ranks (empty: none).
    pub fault: String,
    /// Striping weights per NIC (empty: equal).
    pub weights: Vec<u32>,
    /// Transfers of `bytes` each; more than one makes a fault-free stream ([`stream_main`]).
    pub repeat: u32,
    /// Transfers of a stream in flight at once.
    pub inflight: u32,
    /// Report `RESULT` no earlier than this long after GO (0: as soon as done); the report then
    /// also counts what still waits in UCX's unexpected queues (and drops it).
    pub report_after_ms: u64,
    /// Listeners admit only the ranks' endpoint ids (`UcxTransportConfig::endpoints`).
    pub endpoint_ids: bool,
}

impl Scenario {
    /// `ranks` ranks with `k` rails on `lo`.
    pub fn loopback(ranks: u32, k: usize, bytes: usize) -> Self {
        Self {
            ranks,
            devices: vec!["lo".into(); k],
            bytes,
            pattern: "ring".into(),
            chunk: 256 << 10,
            window: 8,
            stall_ms: 300,
            fault: String::new(),
            weights: Vec::new(),
            repeat: 1,
            inflight: 1,
            report_after_ms: 0,
            endpoint_ids: false,
        }
    }

    fn to_env(&self, cmd: &mut Command, rank: u32) {
        cmd.env(ROLE_VAR, "rank")
            .env("R2T_RANK", rank.to_string())
            .env("R2T_RANKS", self.ranks.to_string())
            .env("R2T_DEVICES", self.devices.join(","))
            .env("R2T_BYTES", self.bytes.to_string())
            .env("R2T_PATTERN", &self.pattern)
            .env("R2T_CHUNK", self.chunk.to_string())
            .env("R2T_WINDOW", self.window.to_string())
            .env("R2T_STALL_MS", self.stall_ms.to_string())
            .env("R2T_WEIGHTS", self.weights.iter().map(u32::to_string).collect::<Vec<_>>().join(","))
            .env("R2T_REPEAT", self.repeat.to_string())
            .env("R2T_INFLIGHT", self.inflight.to_string())
            .env("R2T_REPORT_AFTER_MS", self.report_after_ms.to_string())
            .env("R2T_ENDPOINT_IDS", if self.endpoint_ids { "1" } else { "0" })
            .env("R2CCL_FAULT", &self.fault);
    }

    fn from_env() -> (u32, Self) {
        let get = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("rank process without {k}"));
        let weights = get("R2T_WEIGHTS");
        let s = Self {
            ranks: get("R2T_RANKS").parse().unwrap(),
            devices: get("R2T_DEVICES").split(',').map(str::to_owned).collect(),
            bytes: get("R2T_BYTES").parse().unwrap(),
            pattern: get("R2T_PATTERN"),
            chunk: get("R2T_CHUNK").parse().unwrap(),
            window: get("R2T_WINDOW").parse().unwrap(),
            stall_ms: get("R2T_STALL_MS").parse().unwrap(),
            fault: std::env::var("R2CCL_FAULT").unwrap_or_default(),
            weights: weights.split(',').filter(|w| !w.is_empty()).map(|w| w.parse().unwrap()).collect(),
            repeat: get("R2T_REPEAT").parse().unwrap(),
            inflight: get("R2T_INFLIGHT").parse().unwrap(),
            report_after_ms: get("R2T_REPORT_AFTER_MS").parse().unwrap(),
            endpoint_ids: get("R2T_ENDPOINT_IDS") == "1",
        };
        (get("R2T_RANK").parse().unwrap(), s)
    }

    /// (send to, receive from) of `rank`.
    fn peers(&self, rank: u32) -> (Option<u32>, Option<u32>) {
        let n = self.ranks;
        match self.pattern.as_str() {
            "one" => match rank {
                0 => (Some(1), None),
                1 => (None, Some(0)),
                _ => (None, None),
            },
            _ => (Some((rank + 1) % n), Some((rank + n - 1) % n)),
        }
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").unwrap();
    out.flush().unwrap();
}

// ---------------------------------------------------------------- rank process

/// Wait for a control line starting with `prefix`; returns the rest of it.
fn wait_line(rx: &mpsc::Receiver<String>, prefix: &str) -> String {
    loop {
        let l = rx.recv().expect("parent went away");
        if let Some(rest) = l.strip_prefix(prefix) {
            return rest.trim().to_owned();
        }
    }
}

/// A fault-free stream, the way `ucx_perftest -t tag_bw` (the benchmark's yardstick) streams
/// messages out of and into one buffer: `sc.repeat` transfers of `sc.bytes` each from rank 0 to
/// rank 1, at most `sc.inflight` in flight, all from one source region into one destination
/// region. Every transfer carries the same pattern, so the destination is checked once, at the
/// end. Each rank reports `RESULT` when its side is done (the receiver's `ms`: GO to the last
/// transfer complete), then waits for `EXIT`.
fn stream_main(me: u32, sc: &Scenario, t: &mut UcxTransport, s: &mut Session, rx: &mpsc::Receiver<String>) -> ! {
    let t0 = Instant::now();
    let len = sc.bytes;
    let n = u64::from(sc.repeat);
    let key = |i: u64| TransferKey::new(1, i, 0, 0, 1);
    let region = t.register(len).unwrap();
    let buf = Buffer { region, offset: 0, len: len as u64 };
    if me == 0 {
        t.region_mut(region).unwrap().copy_from_slice(&pattern(len, 0));
    } else {
        t.region_mut(region).unwrap().fill(0x5A);
        for i in 0..n {
            s.expect_recv(t0.elapsed(), t, key(i), buf).unwrap();
        }
    }
    say("READY");
    wait_line(rx, "GO");
    let started = Instant::now();
    let weights = if sc.weights.is_empty() { vec![1; sc.devices.len()] } else { sc.weights.clone() };
    let (mut posted, mut done, mut idle) = (0u64, 0u64, 0u32);
    let mut reported = false;
    loop {
        let now = t0.elapsed();
        while me == 0 && posted < n && posted - done < u64::from(sc.inflight) {
            s.start_send(now, t, key(posted), buf, &weights).unwrap();
            posted += 1;
        }
        s.drive(now, t);
        let mut busy = false;
        while let Some(ev) = s.poll_event() {
            busy = true;
            match ev {
                SessionEvent::SendComplete(k) => {
                    s.release_send(k);
                    done += 1;
                }
                SessionEvent::RecvComplete(k) => {
                    s.release_recv(k);
                    done += 1;
                }
                // Once this side is done, the peer exiting may fail the paths: not an error.
                SessionEvent::PathFailed { path, fault } if !reported => {
                    panic!("rank {me}: path {path} failed in a stream: {fault:?}")
                }
                _ => {}
            }
        }
        if done == n && !reported {
            reported = true;
            let ms = started.elapsed().as_millis();
            let ok = me == 0 || t.region(region).unwrap() == pattern(len, 0).as_slice();
            let st = s.stats();
            say(&format!(
                "RESULT ok={ok} bytes={} ms={ms} migrations={} replayed={} duplicates={} bad=0 path_failures={} \
                 resumed=- migrated=-",
                len as u64 * n,
                st.migrations,
                st.chunks_replayed,
                st.duplicates,
                st.path_failures
            ));
        }
        while let Ok(line) = rx.try_recv() {
            if line.starts_with("EXIT") {
                std::process::exit(0);
            }
        }
        idle = if busy { 0 } else { idle + 1 };
        if idle > 64 {
            std::thread::yield_now();
        }
    }
}

struct Mig {
    lane: LaneId,
    boundary: u32,
    at_ns: u64,
    resumed_ns: Option<u64>,
}

/// How long the stand-in detector waits for the probe of a path whose receipt is overdue
/// (the library's engine waits at least 500 ms).
const SUSPECT_PROBE_WAIT: Duration = Duration::from_secs(1);

/// The rank process: bootstrap, run the scenario, report `RESULT ...`, wait for `EXIT`.
pub fn rank_main() {
    if let Ok(level) = std::env::var("R2T_LOG") {
        let spec = r2ccl_log::LogSpec::parse(&level, "", "").expect("R2T_LOG is a log level (e.g. INFO, DEBUG)");
        r2ccl_log::init(&spec).expect("logging starts");
    }
    let (me, sc) = Scenario::from_env();
    let k = sc.devices.len();
    let devs: Vec<&str> = sc.devices.iter().map(String::as_str).collect();
    let mut cfg = UcxTransportConfig::tcp(Rank(me), NodeId(me), &devs).with_env_faults().unwrap();
    if sc.endpoint_ids {
        cfg.endpoints = Some(EndpointAuth { key: r2ccl_transport::harness::HARNESS_KEY, world: sc.ranks });
    }
    let mut t = UcxTransport::open(cfg).unwrap();
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    say(&format!("ADDR {}", hex(&t.local_address_blob().unwrap())));
    let blobs: Vec<Vec<u8>> = wait_line(&rx, "PEERS").split_whitespace().map(unhex).collect();
    t.connect_peers(&blobs).unwrap();

    let topo = Topology::uniform(sc.ranks, 1, k as u16, 1).unwrap();
    // R2T_PLACE=0: split payloads into a buffer, not straight into the destination
    // (SessionConfig::place_payloads, on by default).
    let place_payloads = std::env::var("R2T_PLACE").map_or(SessionConfig::default().place_payloads, |v| v != "0");
    let cfg = SessionConfig { chunk_size: sc.chunk, window: sc.window, place_payloads, ..SessionConfig::default() };
    let mut s = Session::new(Rank(me), cfg, topo, &r2ccl_transport::harness::HARNESS_KEY).unwrap();
    let comm = CommId(1);
    s.open_comm(comm);
    if sc.repeat > 1 {
        stream_main(me, &sc, &mut t, &mut s, &rx);
    }
    let t0 = Instant::now();
    let len = sc.bytes;
    let (send_to, recv_from) = sc.peers(me);
    let recv_key = recv_from.map(|src| TransferKey::new(1, 0, 0, src, me));
    let dst = recv_key.map(|key| {
        let h = t.register(len).unwrap();
        // Fault the destination's pages in before GO: a transfer is timed, not first touches of
        // fresh memory (ucx_perftest, the benchmark's yardstick, reuses one buffer).
        t.region_mut(h).unwrap().fill(0x5A);
        s.expect_recv(t0.elapsed(), &mut t, key, Buffer { region: h, offset: 0, len: len as u64 }).unwrap();
        h
    });
    let send_key = send_to.map(|d| TransferKey::new(1, 0, 0, me, d));
    let src = send_key.map(|_| {
        let h = t.register(len).unwrap();
        t.region_mut(h).unwrap().copy_from_slice(&pattern(len, me as u8));
        h
    });
    say("READY");
    wait_line(&rx, "GO");
    let started = Instant::now();
    if let (Some(key), Some(h)) = (send_key, src) {
        let weights = if sc.weights.is_empty() { vec![1; k] } else { sc.weights.clone() };
        s.start_send(t0.elapsed(), &t, key, Buffer { region: h, offset: 0, len: len as u64 }, &weights).unwrap();
    }

    let nic = |rank: u32, rail: u16| NicId::new(rank, rail);
    let stall = Duration::from_millis(sc.stall_ms);
    let probe_every = Duration::from_millis(50);
    // The lane migration protocol (sender and receiver sides), its messages on the text channel.
    let mut migrations =
        Migrations::new(MigrateConfig { retry: probe_every, no_path_timeout: Duration::from_secs(3600) });
    let mut migrate_rx = MigrateReceiver::new();
    let mut migs: Vec<Mig> = Vec::new();
    let mut probes: BTreeMap<PathId, (RequestId, Duration)> = BTreeMap::new();
    // Paths whose sends completed locally but whose receipt is overdue: the probe asked and its deadline.
    let mut suspects: BTreeMap<PathId, (RequestId, Duration)> = BTreeMap::new();
    // Suspects whose probe was answered: not suspected again before this time.
    let mut quiet: BTreeMap<PathId, Duration> = BTreeMap::new();
    let mut recv_done = recv_key.is_none();
    let mut recv_ok = true;
    let mut send_done = send_key.is_none();
    let mut reported = false;
    let mut fired_seen = 0;
    let mut bad_chunks = 0u64;
    let mut finish_ms = 0u128;
    let mut idle = 0u32;
    loop {
        let now = t0.elapsed();
        s.drive(now, &mut t);
        let mut busy = false;
        // Session events.
        while let Some(ev) = s.poll_event() {
            busy = true;
            match ev {
                SessionEvent::SendComplete(_) | SessionEvent::BetterPath { .. } => {}
                SessionEvent::RecvComplete(key) => {
                    finish_ms = started.elapsed().as_millis();
                    // The receipt first: checking the bytes takes seconds in a debug build on a
                    // loaded host, and a sender without its receipt probes the path meanwhile
                    // (this loop answers no probe while it checks, and the stand-in detector
                    // would take the path down).
                    s.release_recv(key);
                    migrate_rx.release(key);
                    say(&format!("TO {} RECVDONE", key.src.0));
                    recv_done = true;
                    let got = t.region(dst.unwrap()).unwrap();
                    let want = pattern(len, key.src.0 as u8);
                    recv_ok = got == want.as_slice();
                    if !recv_ok {
                        let at = got.iter().zip(&want).position(|(a, b)| a != b);
                        eprintln!("rank {me}: transfer {key} differs first at byte {at:?}");
                    }
                }
                SessionEvent::PathFailed { path, fault } => {
                    if fault != PathFault::Reported {
                        say(&format!("TO {} PATHDOWN {} {}", path.peer.0, path.local.rail.0, path.remote.rail.0));
                    }
                }
                SessionEvent::LocalNic { nic, up } => {
                    for r in (0..sc.ranks).filter(|&r| r != me) {
                        say(&format!("TO {r} NIC {} {}", nic.rail.0, u8::from(up)));
                    }
                }
                SessionEvent::MigrationNeeded(req) => {
                    migrations.handle_stopped(now, req, now, s.choose_path(req.lane)).unwrap();
                }
                SessionEvent::ProbeDone { path, ok, req } if suspects.get(&path).is_some_and(|(r, _)| *r == req) => {
                    suspects.remove(&path);
                    if ok {
                        quiet.insert(path, now + stall);
                    }
                }
                SessionEvent::ProbeDone { path, ok, req } => {
                    if probes.get(&path).is_some_and(|(r, _)| *r == req) {
                        probes.remove(&path);
                    }
                    if ok {
                        s.handle_path_up(now, path);
                        say(&format!("TO {} PATHUP {} {}", path.peer.0, path.local.rail.0, path.remote.rail.0));
                    }
                }
                SessionEvent::BadChunk { .. } => bad_chunks += 1,
            }
        }
        // Control messages from peers.
        while let Ok(line) = rx.try_recv() {
            busy = true;
            let w: Vec<&str> = line.split_whitespace().collect();
            if w.first() == Some(&"EXIT") {
                drop(t);
                std::process::exit(0);
            }
            if w.first() == Some(&"DUMP") {
                // The parent gave up waiting: say where this rank stands.
                let chunks = u32::try_from((len as u64).div_ceil(sc.chunk as u64)).unwrap();
                let recv_held = recv_key.map(|key| s.held(key, 0, chunks));
                let lanes: String = send_key
                    .map(|key| s.lanes(key))
                    .unwrap_or_default()
                    .iter()
                    .map(|l| {
                        format!(
                            "\n  lane {} chunks {}..{} path {} quiesced {} sender_done {} in_flight {} migrations {}",
                            l.id.lane, l.start, l.end, l.path, l.quiesced, l.sender_done, l.in_flight, l.migrations
                        )
                    })
                    .collect();
                let dump = format!(
                    "rank {me} state: send_done {send_done} recv_done {recv_done} held {recv_held:?}{lanes}\n  \
                     active {:?}\n  awaiting receipt {:?}\n  down {:?}\n  pending migrations {:?}\n  \
                     suspects {:?}\n  stats {:?}\n  transport {:?}\n",
                    s.path_activity(),
                    s.awaiting_receipt(),
                    s.down_paths(),
                    migrations.pending().collect::<Vec<_>>(),
                    suspects,
                    s.stats(),
                    t.outstanding_summary(),
                );
                // One write, so that two ranks' dumps do not interleave.
                let _ = std::io::stderr().lock().write_all(dump.as_bytes());
                continue;
            }
            if w.first() != Some(&"FROM") || w.len() < 3 {
                continue;
            }
            let from: u32 = w[1].parse().unwrap();
            let num = |i: usize| -> u32 { w[i].parse().unwrap() };
            match w[2] {
                "PATHDOWN" | "PATHUP" => {
                    let path = PathId::new(nic(me, num(4) as u16), Rank(from), nic(from, num(3) as u16));
                    if w[2] == "PATHDOWN" {
                        s.handle_path_down(now, &mut t, path, PathFault::Reported);
                    } else {
                        s.handle_path_up(now, path);
                    }
                }
                "NIC" => {
                    let n = nic(from, num(3) as u16);
                    if num(4) == 1 {
                        s.handle_nic_up(now, n);
                    } else {
                        s.handle_nic_down(now, &mut t, n);
                    }
                }
                "MIGREQ" => {
                    // MIGREQ lane start end sender_done sender_rail receiver_rail epoch
                    let req = MigrateReq {
                        lane: LaneId { transfer: TransferKey::new(1, 0, 0, from, me), lane: num(3) as u16 },
                        start: num(4),
                        end: num(5),
                        sender_done: num(6),
                        local: nic(from, num(7) as u16),
                        remote: nic(me, num(8) as u16),
                        epoch: num(9),
                    };
                    let held = s.held(req.lane.transfer, req.start, req.end).ok();
                    let ack = match migrate_rx.handle_req(&req, held) {
                        ReqOutcome::Apply(ack) => {
                            let path = req.receiver_path(Rank(from));
                            s.handle_peer_migrate(now, req.lane.transfer, req.start, req.end, path, ack.boundary)
                                .unwrap();
                            Some(ack)
                        }
                        ReqOutcome::AckOnly(ack) => Some(ack),
                        ReqOutcome::Stale => None,
                    };
                    if let Some(a) = ack {
                        say(&format!("TO {from} MIGACK {} {} {}", a.lane.lane, a.boundary, a.epoch));
                    }
                }
                "MIGACK" => {
                    let lane = LaneId { transfer: TransferKey::new(1, 0, 0, me, from), lane: num(3) as u16 };
                    let ack = MigrateAck { lane, boundary: num(4), epoch: num(5) };
                    assert!(migrations.handle_ack(now, Rank(from), ack).unwrap(), "acknowledgement from the receiver");
                }
                "RECVDONE" => {
                    if let Some(key) = send_key {
                        s.release_send(key);
                    }
                    send_done = true;
                }
                other => panic!("rank {me}: unknown control message {other}"),
            }
        }
        // The migration protocol: waiting lanes look for a path, requests go out, agreed
        // boundaries are applied.
        migrations.handle_timeout(now, |req| s.choose_path(req.lane)).unwrap();
        while let Some((to, r)) = migrations.poll_transmit() {
            say(&format!(
                "TO {} MIGREQ {} {} {} {} {} {} {}",
                to.0, r.lane.lane, r.start, r.end, r.sender_done, r.local.rail.0, r.remote.rail.0, r.epoch
            ));
            busy = true;
        }
        while let Some(out) = migrations.poll_output() {
            let MigrateOutput::Apply { req, to, boundary, stopped_at } = out else { continue };
            match s.handle_migrate(now, req.lane, to, boundary) {
                Ok(()) => migs.push(Mig { lane: req.lane, boundary, at_ns: unix_ns(), resumed_ns: None }),
                // The new path failed meanwhile: the next epoch.
                Err(SessionError::PathDown(_)) => {
                    migrations.handle_stopped(now, req, stopped_at, s.choose_path(req.lane)).unwrap();
                }
                // Its transfer finished and was released while the request was out (as the
                // engine, nothing left to move).
                Err(SessionError::UnknownLane(_)) => {}
                Err(e) => panic!("rank {me}: migration of {} refused: {e}", req.lane),
            }
            busy = true;
        }
        // Data flowing again on the new path: the first chunk past the boundary completed.
        for m in migs.iter_mut().filter(|m| m.resumed_ns.is_none()) {
            let info = s.lanes(m.lane.transfer).into_iter().find(|l| l.id == m.lane);
            if let Some(l) = info {
                if l.sender_done > m.boundary || l.sender_done == l.end {
                    m.resumed_ns = Some(unix_ns());
                }
            }
        }
        // Stand-in detector: stalled paths are down; down paths are re-probed.
        for a in s.path_activity() {
            if now >= a.since + stall {
                s.handle_path_down(now, &mut t, a.path, PathFault::Timeout);
            }
        }
        // A silent black hole swallows sends the local stack already completed: a path whose
        // receipt is overdue is probed, and an unanswered probe declares it down.
        for a in s.awaiting_receipt() {
            let p = a.path;
            if now < a.since + stall || suspects.contains_key(&p) || quiet.get(&p).is_some_and(|&q| now < q) {
                continue;
            }
            match s.probe(now, &mut t, p) {
                Ok(req) => {
                    // A loaded host answers late; only silence this long is a black hole.
                    suspects.insert(p, (req, now + SUSPECT_PROBE_WAIT));
                }
                Err(_) => s.handle_path_down(now, &mut t, p, PathFault::Timeout),
            }
        }
        let expired: Vec<PathId> = suspects.iter().filter(|(_, (_, d))| now >= *d).map(|(p, _)| *p).collect();
        for p in expired {
            suspects.remove(&p);
            s.handle_path_down(now, &mut t, p, PathFault::Timeout);
        }
        for p in s.down_paths() {
            if s.is_nic_down(p.local) || p.local.rail != p.remote.rail {
                continue;
            }
            match probes.get(&p) {
                Some(&(req, at)) if now >= at + probe_every => {
                    let _ = t.cancel(now, req);
                    probes.remove(&p);
                }
                Some(_) => {}
                None => {
                    if let Ok(req) = s.probe(now, &mut t, p) {
                        probes.insert(p, (req, now));
                    }
                }
            }
        }
        // Faults that fired here.
        let fired = t.fired_faults();
        while fired_seen < fired.len() {
            let ago = fired[fired_seen].at.elapsed().as_nanos() as u64;
            say(&format!("FIRED {}", unix_ns() - ago));
            fired_seen += 1;
        }
        let report_due = started.elapsed() >= Duration::from_millis(sc.report_after_ms);
        if recv_done && send_done && !reported && report_due {
            reported = true;
            let st = s.stats();
            let swept = t.sweep_stats();
            // What still waits in UCX's unexpected queues (counted by taking it out).
            let (left, left_bytes) = if sc.report_after_ms > 0 { t.discard_unexpected() } else { (0, 0) };
            let resumed: Vec<String> = migs.iter().filter_map(|m| m.resumed_ns).map(|n| n.to_string()).collect();
            let migrated: Vec<String> = migs.iter().map(|m| m.at_ns.to_string()).collect();
            say(&format!(
                "RESULT ok={} bytes={len} ms={finish_ms} migrations={} replayed={} duplicates={} bad={bad_chunks} \
                 path_failures={} swept={} swept_bytes={} unsolicited={} left={left} left_bytes={left_bytes} \
                 strangers={} \
                 resumed={} migrated={}",
                recv_ok,
                st.migrations,
                st.chunks_replayed,
                st.duplicates,
                st.path_failures,
                swept.dropped,
                swept.dropped_bytes,
                swept.unsolicited,
                t.strangers_rejected(),
                if resumed.is_empty() { "-".into() } else { resumed.join(",") },
                if migrated.is_empty() { "-".into() } else { migrated.join(",") },
            ));
        }
        idle = if busy { 0 } else { idle + 1 };
        if idle > 64 {
            std::thread::yield_now();
        }
    }
}

// ---------------------------------------------------------------- parent

/// One rank's `RESULT` line, parsed.
#[derive(Clone, Debug)]
pub struct RankResult {
    /// The rank.
    pub rank: u32,
    /// key=value fields.
    pub fields: BTreeMap<String, String>,
}

impl RankResult {
    /// A numeric field.
    pub fn num(&self, key: &str) -> u64 {
        self.fields.get(key).and_then(|v| v.parse().ok()).unwrap_or(0)
    }
    /// A list of ns timestamps.
    pub fn times(&self, key: &str) -> Vec<u64> {
        self.fields.get(key).map_or(vec![], |v| v.split(',').filter_map(|x| x.parse().ok()).collect())
    }
}

/// What a cluster run produced.
#[derive(Debug)]
pub struct Outcome {
    /// Per rank.
    pub results: Vec<RankResult>,
    /// Software faults that fired (unix ns), any rank.
    pub fired: Vec<u64>,
    /// Faults the parent injected (unix ns).
    pub injected: Vec<u64>,
    /// From GO to the last RESULT.
    pub elapsed: Duration,
    /// When GO was sent (unix ns).
    pub go_ns: u64,
}

impl Outcome {
    /// Pause after fault time `f`: until the first lane resumed on a backup path after it.
    pub fn pause_after(&self, f: u64) -> Option<Duration> {
        self.results
            .iter()
            .flat_map(|r| r.times("resumed"))
            .filter(|&t| t >= f)
            .min()
            .map(|t| Duration::from_nanos(t - f))
    }

    /// Total migrations over every rank.
    pub fn migrations(&self) -> u64 {
        self.results.iter().map(|r| r.num("migrations")).sum()
    }

    /// Asserts every rank reported a bit-exact receive.
    pub fn assert_exact(&self) {
        for r in &self.results {
            assert_eq!(
                r.fields.get("ok").map(String::as_str),
                Some("true"),
                "rank {} not exact: {:?}",
                r.rank,
                r.fields
            );
        }
    }
}

/// A fault schedule the parent runs after GO, given every rank's address blob; returns when each
/// fault was injected (unix ns).
pub type Injector = Box<dyn FnOnce(&[Vec<u8>]) -> Vec<u64> + Send>;

/// Start one rank process per command (`cmds[r]` is rank `r`, already pointing at this binary, possibly
/// behind `ip netns exec`), run `sc`, relay the control plane, and collect the results.
pub fn run_cluster(mut cmds: Vec<Command>, sc: &Scenario, inject: Option<Injector>, limit: Duration) -> Outcome {
    let n = cmds.len();
    let (tx, rx) = mpsc::channel::<(usize, Option<String>)>();
    let mut children: Vec<Child> = Vec::new();
    let mut stdins: Vec<ChildStdin> = Vec::new();
    for (r, cmd) in cmds.iter_mut().enumerate() {
        sc.to_env(cmd, r as u32);
        let mut c = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
        stdins.push(c.stdin.take().unwrap());
        let out = c.stdout.take().unwrap();
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send((r, Some(line))).is_err() {
                    return;
                }
            }
            let _ = tx.send((r, None));
        });
        children.push(c);
    }
    let deadline = Instant::now() + limit;
    let send = |stdins: &mut Vec<ChildStdin>, r: usize, line: &str| {
        let _ = writeln!(stdins[r], "{line}");
        let _ = stdins[r].flush();
    };
    let mut addrs = vec![String::new(); n];
    let mut ready = 0;
    let mut results: Vec<Option<RankResult>> = vec![None; n];
    let mut fired = Vec::new();
    let mut go_at = Instant::now();
    let mut go_ns = 0;
    let mut injector: Option<std::thread::JoinHandle<Vec<u64>>> = None;
    let mut inject = inject;
    let mut failure: Option<String> = None;
    while results.iter().any(Option::is_none) {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok((r, line)) = rx.recv_timeout(left) else {
            failure = Some(format!("cluster did not finish within {limit:?}; results so far: {results:?}"));
            for i in 0..n {
                send(&mut stdins, i, "DUMP");
            }
            std::thread::sleep(Duration::from_secs(1));
            break;
        };
        let Some(line) = line else {
            if results[r].is_none() {
                failure = Some(format!("rank {r} exited before reporting a result"));
                break;
            }
            continue;
        };
        let w: Vec<&str> = line.splitn(3, ' ').collect();
        match w[0] {
            "ADDR" => {
                addrs[r] = w[1].to_owned();
                if addrs.iter().all(|a| !a.is_empty()) {
                    let table = format!("PEERS {}", addrs.join(" "));
                    for i in 0..n {
                        send(&mut stdins, i, &table);
                    }
                }
            }
            "READY" => {
                ready += 1;
                if ready == n {
                    go_at = Instant::now();
                    go_ns = unix_ns();
                    for i in 0..n {
                        send(&mut stdins, i, "GO");
                    }
                    if let Some(f) = inject.take() {
                        let blobs: Vec<Vec<u8>> = addrs.iter().map(|a| unhex(a)).collect();
                        injector = Some(std::thread::spawn(move || f(&blobs)));
                    }
                }
            }
            "TO" => {
                let dst: usize = w[1].parse().unwrap();
                send(&mut stdins, dst, &format!("FROM {r} {}", w[2]));
            }
            "FIRED" => fired.push(w[1].parse::<u64>().unwrap()),
            "RESULT" => {
                let fields = line
                    .split_whitespace()
                    .skip(1)
                    .filter_map(|f| f.split_once('='))
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect();
                results[r] = Some(RankResult { rank: r as u32, fields });
            }
            _ => eprintln!("rank {r}: {line}"),
        }
    }
    let elapsed = go_at.elapsed();
    for i in 0..n {
        send(&mut stdins, i, "EXIT");
    }
    let injected = injector.map(|h| h.join().unwrap()).unwrap_or_default();
    let until = Instant::now() + Duration::from_secs(10);
    for c in &mut children {
        while c.try_wait().unwrap().is_none() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        if c.try_wait().unwrap().is_none() {
            let _ = c.kill();
        }
        let _ = c.wait();
    }
    if let Some(f) = failure {
        panic!("{f}");
    }
    Outcome { results: results.into_iter().map(Option::unwrap).collect(), fired, injected, elapsed, go_ns }
}

/// A command that re-executes this binary.
pub fn self_cmd() -> Command {
    Command::new(std::env::current_exe().unwrap())
}

/// Runs the named tests of a harness-less binary, honouring a name filter from the command line.
pub fn run_tests(binary: &str, tests: &[(&str, fn())]) {
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let mut ran = 0;
    for (name, f) in tests {
        if filter.iter().all(|p| name.contains(p.as_str())) {
            let start = Instant::now();
            f();
            eprintln!("test {name} ... ok ({:?})", start.elapsed());
            ran += 1;
        }
    }
    eprintln!("test result: ok. {ran} passed; 0 failed ({binary})");
}
