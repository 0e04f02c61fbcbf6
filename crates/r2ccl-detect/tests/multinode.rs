//! Multi-node scenarios on the deterministic simulator: every fault class is detected and
//! declared by both ends of the path in bounded time with the verdict of the injected class,
//! short delays never fail a path, flapping yields a bounded number of failure declarations
//! and ends in recovery, a single lost OOB message or duplicated and reordered ones do not
//! change a verdict, and detection latencies are printed.
#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]
#![allow(clippy::print_stdout, reason = "the latency test prints its figures")]

mod sim;

use r2ccl_core::NicId;
use r2ccl_detect::health::StateKind;
use r2ccl_detect::{Command, DetectConfig, DetectEvent, OobMessage, PathState, Verdict};
use sim::{Fault, OobModel, Sim};
use std::time::Duration;

const MS: Duration = Duration::from_millis(1);
/// Faults are injected after this warm-up.
const T0: Duration = Duration::from_millis(200);
/// Stated bound: with a noisy OOB network (5% loss, 5% duplication, up to 1.5 ms jitter),
/// every injected fault is declared by both ends of the failed path (nodes 0 and 1, rail 0)
/// within this time of the injection.
const DECLARE_BOUND: Duration = Duration::from_millis(150);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    SenderLinkDown,
    SenderNicSilent,
    ReceiverLinkDown,
    ReceiverNicSilent,
    LinkCut,
}

const CLASSES: [Class; 5] =
    [Class::SenderLinkDown, Class::SenderNicSilent, Class::ReceiverLinkDown, Class::ReceiverNicSilent, Class::LinkCut];

const A: NicId = NicId::new(0, 0);
const B: NicId = NicId::new(1, 0);

fn inject(sim: &mut Sim, class: Class, at: Duration) {
    let f = match class {
        Class::SenderLinkDown => Fault::LinkDown(A),
        Class::SenderNicSilent => Fault::Silence(A),
        Class::ReceiverLinkDown => Fault::LinkDown(B),
        Class::ReceiverNicSilent => Fault::Silence(B),
        Class::LinkCut => Fault::Cut(A, B),
    };
    sim.at(at, f);
}

/// The verdict node `n` (0 or 1) must reach for the rail-0 path, with three or more nodes.
fn expected_verdict(class: Class, n: usize) -> Verdict {
    let (mine, theirs) = if n == 0 { (A, B) } else { (B, A) };
    let failed = match class {
        Class::SenderLinkDown | Class::SenderNicSilent => A,
        Class::ReceiverLinkDown | Class::ReceiverNicSilent => B,
        Class::LinkCut => return Verdict::Link { local: mine, remote: theirs },
    };
    if failed == mine {
        Verdict::LocalNic(failed)
    } else {
        Verdict::RemoteNic(failed)
    }
}

/// The two-node verdict: local evidence (link down) still names the NIC; silence can only be
/// blamed on the pair (the link: the two-node fallback).
fn expected_two_node(class: Class, n: usize) -> Verdict {
    match class {
        Class::SenderLinkDown | Class::ReceiverLinkDown => expected_verdict(class, n),
        _ => {
            let (mine, theirs) = if n == 0 { (A, B) } else { (B, A) };
            Verdict::Link { local: mine, remote: theirs }
        }
    }
}

fn run_case(class: Class, nodes: usize, seed: u64, oob: OobModel) -> (Sim, Duration) {
    let mut sim = Sim::new(nodes, 2, DetectConfig::default(), seed, oob);
    let at = T0 + Duration::from_micros(seed * 137 % 1000);
    inject(&mut sim, class, at);
    sim.run_until(T0 + Duration::from_millis(400));
    (sim, at)
}

/// Node `n`'s first failure declaration of its rail-0 path: (time, verdict).
fn first_declared(sim: &Sim, n: usize) -> Option<(Duration, Verdict)> {
    let path = sim.rail0(n);
    sim.declared().into_iter().find(|d| d.1 == n && d.2 == path).map(|d| (d.0, d.3))
}

fn first_verdict(sim: &Sim, n: usize) -> Option<Verdict> {
    first_declared(sim, n).map(|d| d.1)
}

/// Both ends of the rail-0 path declared it failed, once, with `want(n)`, by `deadline`; no
/// other path was declared.
fn check_declared(sim: &Sim, deadline: Duration, want: impl Fn(usize) -> Verdict, what: &str) {
    for n in [0, 1] {
        let (at, v) = first_declared(sim, n).unwrap_or_else(|| panic!("{what}: node {n} declared nothing"));
        assert_eq!(v, want(n), "{what}: verdict of node {n}");
        assert!(at <= deadline, "{what}: node {n} declared at {at:?}, after the bound {deadline:?}");
        let times = sim.declared().iter().filter(|d| d.1 == n && d.2 == sim.rail0(n)).count();
        assert_eq!(times, 1, "{what}: node {n} declared its failed path {times} times");
    }
    let others: Vec<_> = sim.declared().into_iter().filter(|d| d.2.local.rail.0 != 0).collect();
    assert!(others.is_empty(), "{what}: a healthy rail-1 path was declared failed: {others:?}");
}

#[test]
fn every_fault_is_detected_and_declared_by_both_ends_in_bounded_time() {
    for class in CLASSES {
        for nodes in [2, 3] {
            for seed in 0..4 {
                let what = format!("{class:?} nodes={nodes} seed={seed}");
                let (sim, at) = run_case(class, nodes, seed, OobModel::noisy(0.05));
                let want = |n| if nodes >= 3 { expected_verdict(class, n) } else { expected_two_node(class, n) };
                check_declared(&sim, at + DECLARE_BOUND, want, &what);
                for n in [0, 1] {
                    let state = sim.dets[n].path_state(&sim.rail0(n));
                    assert!(state.is_some_and(|s| s.is_failed()), "{what}: node {n}'s path is {state:?}");
                }
            }
        }
    }
}

#[test]
fn with_three_or_more_nodes_the_verdict_matches_the_injected_class() {
    for class in CLASSES {
        for nodes in [3, 4, 5] {
            for seed in 10..14 {
                let what = format!("{class:?} nodes={nodes} seed={seed}");
                let (sim, _) = run_case(class, nodes, seed, OobModel::noisy(0.0));
                for n in [0, 1] {
                    assert_eq!(first_verdict(&sim, n), Some(expected_verdict(class, n)), "{what}: node {n}");
                }
                let methods: Vec<_> = sim
                    .events
                    .iter()
                    .filter_map(|(_, e)| match e {
                        DetectEvent::Localized { method, .. } => Some(*method),
                        _ => None,
                    })
                    .collect();
                assert!(!methods.contains(&r2ccl_detect::Method::TwoNodeFallback), "{what}: {methods:?}");
            }
        }
    }
}

#[test]
fn a_delay_shorter_than_the_suspicion_threshold_never_declares_a_failure() {
    let cfg = DetectConfig::default();
    let threshold = cfg.suspicion_threshold();
    let delays = [MS, 5 * MS, 10 * MS, 20 * MS, 25 * MS, threshold - 2 * MS];
    let mut suspected = 0;
    for &d in &delays {
        for seed in 0..3 {
            let mut sim = Sim::new(3, 2, cfg.clone(), seed, OobModel::noisy(0.05));
            // Ten stalls of `d`, 150 ms apart.
            for i in 0..10u32 {
                let start = T0 + 150 * MS * i + Duration::from_micros(seed * 71);
                sim.at(start, Fault::Stall(A, B, start + d));
            }
            sim.run_until(T0 + 2000 * MS);
            let what = format!("delay {d:?} seed {seed}");
            assert!(sim.declared().is_empty(), "{what}: declared {:?}", sim.declared());
            suspected += sim
                .events
                .iter()
                .filter(|(_, e)| matches!(e, DetectEvent::PathTransition { to: StateKind::Suspect, .. }))
                .count();
            let s = &sim.streams[0];
            assert!(s.held > 1500, "{what}: stream stalled for good: {s:?}");
        }
    }
    // The longer delays did make the path suspect, so the property is not vacuous...
    assert!(suspected > 0, "no delay ever made a path suspect");
    // ...and a delay well past the threshold is declared.
    let mut sim = Sim::new(3, 2, cfg.clone(), 7, OobModel::clean());
    sim.at(T0, Fault::Stall(A, B, T0 + threshold + 30 * MS));
    sim.run_until(T0 + 500 * MS);
    assert!(!sim.declared().is_empty(), "a {:?} stall was not declared", threshold + 30 * MS);
}

/// Upper bound on the failure declarations of one path during `span` of flapping: a path is
/// declared once per failure, and fails again only after it recovered; recovery k needs
/// hold-down(k) + (N - 1) probe intervals after failure k, and every failure within the flap
/// window doubles the hold-down. So at most one declaration per completed cycle, plus the
/// failure that opens the last one.
fn flap_bound(cfg: &DetectConfig, span: Duration) -> usize {
    let mut t = Duration::ZERO;
    let mut cycles = 0u32;
    loop {
        let c = cfg.holddown(cycles) + cfg.probe_interval * (cfg.good_probes - 1);
        if t + c > span {
            break;
        }
        t += c;
        cycles += 1;
    }
    cycles as usize + 1
}

#[test]
fn flapping_causes_a_bounded_number_of_failure_declarations() {
    let cfg = DetectConfig::default();
    let span = Duration::from_secs(10);
    let bound = flap_bound(&cfg, span);
    assert_eq!(bound, 6, "bound for the default config (state it in the docs if it changes)");
    for (period, nic) in [(100 * MS, A), (50 * MS, A), (100 * MS, B), (130 * MS, A), (400 * MS, B)] {
        for seed in 0..2 {
            let mut sim = Sim::new(3, 2, cfg.clone(), seed, OobModel::noisy(0.02));
            let toggles = (span.as_millis() / period.as_millis()) as u32;
            for i in 0..toggles {
                let f = if i % 2 == 0 { Fault::LinkDown(nic) } else { Fault::LinkUp(nic) };
                sim.at(T0 + period * i, f);
            }
            sim.at(T0 + span, Fault::LinkUp(nic));
            sim.run_until(T0 + span);
            let what = format!("flap {period:?} on {nic} seed {seed}");
            for n in [0, 1] {
                let path = sim.rail0(n);
                let k = sim.declared().iter().filter(|d| d.1 == n && d.2 == path).count();
                println!("{what}: node {n} declared {path} failed {k} times in 10 s of flapping (bound {bound})");
                assert!(k <= bound, "{what}: node {n} declared {path} failed {k} times, bound {bound}");
                if n == nic.node.index() {
                    assert!(k >= 1, "{what}: the flapping NIC's own node never declared it");
                }
            }
            // After the flapping stops, every path recovers: one recovery per failure.
            sim.run_until(T0 + span + cfg.holddown_max + Duration::from_secs(2));
            for n in [0, 1] {
                let path = sim.rail0(n);
                assert_eq!(sim.dets[n].path_state(&path), Some(PathState::Healthy), "{what}: node {n}");
                let failed = sim.declared().iter().filter(|d| d.1 == n && d.2 == path).count();
                let recovered = sim.recovered().iter().filter(|r| r.1 == n && r.2 == path).count();
                assert_eq!(failed, recovered, "{what}: node {n} failures vs recoveries of {path}");
            }
        }
    }
}

#[test]
fn the_verdict_survives_the_loss_of_any_single_oob_message() {
    let retry = DetectConfig::default().oob_retry;
    for class in [Class::ReceiverLinkDown, Class::SenderNicSilent, Class::LinkCut] {
        let (base, _) = run_case(class, 3, 1, OobModel::clean());
        let total = base.oob_sent;
        // Each end that localizes asks three probes (peer, auxiliary twice) and gets three reports.
        assert!(total >= 6, "{class:?}: only {total} OOB messages");
        let mut resent = 0;
        for k in 0..total {
            let oob = OobModel { drop_nth: Some(k), ..OobModel::clean() };
            let mut sim = Sim::new(3, 2, DetectConfig::default(), 1, oob);
            let at = T0 + Duration::from_micros(137);
            inject(&mut sim, class, at);
            sim.run_until(T0 + 400 * MS);
            let what = format!("{class:?} dropping OOB message {k} of {total}");
            // A lost request or report costs one resend interval.
            check_declared(&sim, at + DECLARE_BOUND + retry, |n| expected_verdict(class, n), &what);
            resent += sim.log.iter().filter(|(_, _, c)| matches!(c, Command::AskProbe { .. })).count();
        }
        let asked = base.log.iter().filter(|(_, _, c)| matches!(c, Command::AskProbe { .. })).count();
        println!(
            "{class:?}: {total} OOB messages, each dropped once: {} probe requests resent",
            resent - asked * total
        );
        assert!(resent > asked * total, "{class:?}: no probe request was ever resent");
    }
}

#[test]
fn duplicated_and_reordered_oob_messages_are_handled() {
    // Heavy duplication and reordering: a duplicate probe request is answered from the cache
    // of served requests, never probed again; a duplicate report is ignored as stale.
    let oob = OobModel { dup: 0.5, ..OobModel::noisy(0.0) };
    let mut cached = 0;
    let mut stale = 0;
    for seed in 0..4 {
        let what = format!("duplicates, seed {seed}");
        let (sim, at) = run_case(Class::SenderNicSilent, 3, seed, oob.clone());
        check_declared(&sim, at + DECLARE_BOUND, |n| expected_verdict(Class::SenderNicSilent, n), &what);
        // Node 2 watches no path of its own: each of its probes serves one request.
        let requests: Vec<_> = sim
            .delivered
            .iter()
            .filter(|d| d.to == 2 && matches!(d.msg, OobMessage::ProbeRequest { .. }))
            .map(|d| match d.msg {
                OobMessage::ProbeRequest { id, .. } => (d.from, id),
                OobMessage::ProbeReport { .. } => unreachable!(),
            })
            .collect();
        let mut distinct = requests.clone();
        distinct.sort();
        distinct.dedup();
        let probes = sim.log.iter().filter(|(_, n, c)| *n == 2 && matches!(c, Command::StartProbe { .. })).count();
        assert_eq!(probes, distinct.len(), "{what}: node 2 probed {probes} times for {distinct:?}");
        let mut reports: Vec<_> = sim
            .log
            .iter()
            .filter_map(|(_, n, c)| match c {
                Command::SendOob { to, msg: OobMessage::ProbeReport { id, outcome } } if *n == 2 => {
                    Some((*to, *id, *outcome))
                }
                _ => None,
            })
            .collect();
        reports.sort_by_key(|r| (r.0, r.1));
        for w in reports.windows(2) {
            if (w[0].0, w[0].1) == (w[1].0, w[1].1) {
                assert_eq!(w[0].2, w[1].2, "{what}: request {:?} answered twice differently", (w[0].0, w[0].1));
                cached += 1;
            }
        }
        stale += sim.events.iter().filter(|(_, e)| matches!(e, DetectEvent::StaleIgnored { .. })).count();
        assert!(requests.len() >= distinct.len());
    }
    println!("{cached} duplicate probe requests answered from the cache, {stale} stale reports ignored");
    assert!(cached > 0, "no duplicate request was answered from the cache");
    assert!(stale > 0, "no duplicate report reached a detector");
}

#[derive(Debug)]
struct Latency {
    detected: Duration,
    declared: [Duration; 2],
    alarm: [Duration; 2],
    verdict: Verdict,
}

fn measure(class: Class) -> Latency {
    let t_fault = T0 + Duration::from_micros(500);
    let mut sim = Sim::new(3, 2, DetectConfig::default(), 42, OobModel::clean());
    inject(&mut sim, class, t_fault);
    sim.run_until(T0 + 400 * MS);
    let alarm = |n: usize| {
        sim.events
            .iter()
            .filter_map(|(node, e)| match e {
                DetectEvent::PathTransition { at, path, from: StateKind::Healthy, .. }
                    if *node == n && *path == sim.rail0(n) && *at >= t_fault =>
                {
                    Some(*at - t_fault)
                }
                _ => None,
            })
            .min()
            .unwrap()
    };
    let declared = |n: usize| first_declared(&sim, n).unwrap().0 - t_fault;
    let alarm = [alarm(0), alarm(1)];
    Latency {
        detected: alarm[0].min(alarm[1]),
        declared: [declared(0), declared(1)],
        alarm,
        verdict: first_verdict(&sim, 0).unwrap(),
    }
}

#[test]
fn detection_latency_with_the_default_config() {
    let cfg = DetectConfig::default();
    println!("simulated detection latency, default config, 3 nodes, OOB one-way 200 us, data latency 100 us,");
    println!("chunks every 1 ms with expected completion 2 ms (progress deadline = 2 ms + {:?})", cfg.progress_margin);
    println!(
        "{:<18} {:>12} {:>16} {:>16}  verdict at the sender",
        "fault", "first alarm", "declared (0)", "declared (1)"
    );
    for class in CLASSES {
        let l = measure(class);
        println!(
            "{:<18} {:>9.3} ms {:>13.3} ms {:>13.3} ms  {}",
            format!("{class:?}"),
            l.detected.as_secs_f64() * 1e3,
            l.declared[0].as_secs_f64() * 1e3,
            l.declared[1].as_secs_f64() * 1e3,
            l.verdict
        );
        for n in [0, 1] {
            let own_link_down = matches!((class, n), (Class::SenderLinkDown, 0) | (Class::ReceiverLinkDown, 1));
            if own_link_down {
                // A local link-down is acted on within 10 ms (here: in the same call).
                assert!(l.alarm[n] <= 10 * MS && l.declared[n] <= 10 * MS, "{class:?} node {n}: {l:?}");
            } else {
                // Anything else (a black hole, or the peer's link-down, which this end learns
                // only from its own deadlines: telling the peer is the engine's path-down
                // notice): suspect at the progress deadline (the sender keeps posting until
                // its window of 4 chunks is full, 1 ms apart, and the last post is expected to
                // complete 2 ms later, plus the margin), declared one probe round later (plus
                // OOB hops for the peer's and the auxiliary's reports).
                let deadline = 4 * MS + 2 * MS + cfg.progress_margin;
                assert!(l.alarm[n] <= deadline, "{class:?} node {n}: {l:?} suspect later than {deadline:?}");
                let round = cfg.probe_timeout + MS;
                let took = l.declared[n] - l.alarm[n];
                assert!(took <= round, "{class:?} node {n}: {l:?} probe round over {round:?}");
            }
        }
    }
    // The OOB wire format is what travelled: one frame decodes back to itself.
    let m = OobMessage::ProbeReport { id: 9, outcome: r2ccl_detect::Observation::Timeout };
    assert_eq!(OobMessage::decode(&m.encode()), Ok(m));
}
