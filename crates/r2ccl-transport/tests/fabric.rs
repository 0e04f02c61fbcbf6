//! The in-memory fabric as a `Transport`: timing, completions, faults, cancellation, probes,
//! refusals and determinism.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]

use r2ccl_core::{NicId, Rank};
use r2ccl_transport::harness::{Harness, HarnessConfig};
use r2ccl_transport::{
    CommId, CompletionKind, FabricConfig, FaultAction, MemFabric, PathFault, PathId, SessionConfig, TransferKey,
    Transport, TransportError, TransportEvent,
};
use std::time::Duration;

fn ns(v: u64) -> Duration {
    Duration::from_nanos(v)
}

fn fabric() -> MemFabric {
    MemFabric::new(FabricConfig {
        nodes: 2,
        ranks_per_node: 1,
        nics_per_node: 2,
        nic_bytes_per_sec: 1_000_000_000,
        latency: ns(5000),
        jitter: Duration::ZERO,
        seed: 1,
        cancel_race_permille: 0,
        local_completion: false,
    })
}

const A: NicId = NicId::new(0, 0);
const B: NicId = NicId::new(1, 0);

fn path01() -> PathId {
    PathId::new(A, Rank(1), B)
}

fn events(f: &mut MemFabric, rank: u32) -> Vec<TransportEvent> {
    let mut p = f.port(Rank(rank)).unwrap();
    std::iter::from_fn(|| p.poll_event()).collect()
}

/// Registers 1000 bytes on rank 0 and posts one send of 44 of them with a 56-byte header
/// (100 bytes on the wire, 100 ns at 1 GB/s).
fn send_one(f: &mut MemFabric, now: Duration) -> r2ccl_transport::RequestId {
    let mut p = f.port(Rank(0)).unwrap();
    let h = p.register(1000).unwrap();
    p.region_mut(h).unwrap()[..44].fill(9);
    p.post_send(now, path01(), &[1u8; 56], h, 0, 44).unwrap()
}

#[test]
fn send_completes_on_arrival_with_bandwidth_and_latency() {
    let mut f = fabric();
    let req = send_one(&mut f, Duration::ZERO);
    assert_eq!(f.next_event_time(), Some(ns(5100)));
    let rreq = f.port(Rank(1)).unwrap().post_recv(ns(0), path01().mirror(Rank(0)), 200).unwrap();
    f.advance(ns(5099));
    assert!(events(&mut f, 0).is_empty());
    f.advance(ns(5100));
    let ev = events(&mut f, 0);
    assert!(matches!(&ev[..], [TransportEvent::Completion(c)] if c.req == req && c.kind == CompletionKind::Sent));
    let ev = events(&mut f, 1);
    let [TransportEvent::Completion(c)] = &ev[..] else { panic!("{ev:?}") };
    assert_eq!(c.req, rreq);
    let CompletionKind::Received(bytes) = &c.kind else { panic!("{c:?}") };
    assert_eq!(bytes.len(), 100);
    assert_eq!(&bytes[56..], &[9u8; 44]);
    assert_eq!(f.nic_stats(A).tx_payload, 44);
}

#[test]
fn egress_queues_and_slow_and_delayed_nics_take_longer() {
    let mut f = fabric();
    send_one(&mut f, Duration::ZERO);
    send_one(&mut f, Duration::ZERO);
    f.advance(ns(5100));
    assert_eq!(events(&mut f, 0).len(), 1, "the second message waits behind the first");
    assert_eq!(f.next_event_time(), Some(ns(5200)));
    f.advance(ns(6000));
    f.apply(FaultAction::Slow(A, 500));
    f.apply(FaultAction::Delay(B, ns(1000)));
    send_one(&mut f, ns(6000));
    // 100 bytes at half speed = 200 ns, plus 5 us latency, plus 1 us added delay.
    assert_eq!(f.next_event_time(), Some(ns(6000 + 200 + 5000 + 1000)));
}

#[test]
fn unexpected_messages_wait_and_small_receives_fail() {
    let mut f = fabric();
    send_one(&mut f, Duration::ZERO);
    f.advance(ns(10_000));
    assert_eq!(events(&mut f, 1), vec![]);
    let mut p = f.port(Rank(1)).unwrap();
    let r = p.post_recv(ns(10_000), path01().mirror(Rank(0)), 99).unwrap();
    let ev: Vec<_> = std::iter::from_fn(|| p.poll_event()).collect();
    assert!(
        matches!(&ev[..], [TransportEvent::Completion(c)] if c.req == r && c.kind == CompletionKind::Failed(PathFault::Endpoint))
    );
}

#[test]
fn nic_down_fails_queued_requests_and_reports_link_state() {
    let mut f = fabric();
    let s = send_one(&mut f, Duration::ZERO);
    let r = f.port(Rank(0)).unwrap().post_recv(ns(0), path01(), 200).unwrap();
    f.schedule(ns(1000), FaultAction::NicDown(A));
    f.advance(ns(1000));
    let ev = events(&mut f, 0);
    assert_eq!(ev[0], TransportEvent::LinkState { nic: A, up: false });
    let failed: Vec<_> = ev[1..]
        .iter()
        .filter_map(|e| match e {
            TransportEvent::Completion(c) if c.kind == CompletionKind::Failed(PathFault::LocalNicDown) => Some(c.req),
            _ => None,
        })
        .collect();
    assert_eq!(failed, vec![s, r]);
    f.advance(ns(100_000));
    assert!(events(&mut f, 1).is_empty(), "nothing arrives from a dead NIC");
    // Posting on a dead NIC fails at once, asynchronously.
    let s2 = send_one(&mut f, ns(100_000));
    let ev = events(&mut f, 0);
    assert!(
        matches!(&ev[..], [TransportEvent::Completion(c)] if c.req == s2 && c.kind == CompletionKind::Failed(PathFault::LocalNicDown))
    );
    f.apply(FaultAction::NicUp(A));
    assert_eq!(events(&mut f, 0), vec![TransportEvent::LinkState { nic: A, up: true }]);
}

#[test]
fn black_holes_and_dead_links_swallow_silently() {
    for fault in [FaultAction::BlackHole(B, true), FaultAction::LinkDown(A, B)] {
        let mut f = fabric();
        f.apply(fault);
        send_one(&mut f, Duration::ZERO);
        let probe = f.port(Rank(0)).unwrap().post_probe(ns(0), path01()).unwrap();
        f.advance(Duration::from_secs(10));
        assert!(events(&mut f, 0).is_empty(), "{fault:?}: no completion, no error");
        assert_eq!(f.nic_stats(A).dropped, 2);
        // Another link still works, probes included.
        let other = PathId::new(NicId::new(0, 1), Rank(1), NicId::new(1, 1));
        let now = f.now();
        let p2 = f.port(Rank(0)).unwrap().post_probe(now, other).unwrap();
        f.advance(f.now() + ns(20_000));
        let ev = events(&mut f, 0);
        assert!(matches!(&ev[..], [TransportEvent::Completion(c)] if c.req == p2 && c.kind == CompletionKind::ProbeOk));
        assert_ne!(probe, p2);
    }
}

#[test]
fn probes_skip_the_data_queue() {
    let mut f = fabric();
    let mut p = f.port(Rank(0)).unwrap();
    let h = p.register(1 << 20).unwrap();
    p.post_send(ns(0), path01(), &[], h, 0, 1 << 20).unwrap();
    let probe = p.post_probe(ns(0), path01()).unwrap();
    f.advance(ns(10_001));
    let ev = events(&mut f, 0);
    assert!(
        matches!(&ev[..], [TransportEvent::Completion(c)] if c.req == probe && c.kind == CompletionKind::ProbeOk),
        "{ev:?}"
    );
}

#[test]
fn cancellation_retires_requests_once() {
    let mut f = fabric();
    let s = send_one(&mut f, Duration::ZERO);
    let mut p = f.port(Rank(0)).unwrap();
    let r = p.post_recv(ns(0), path01(), 200).unwrap();
    assert_eq!(p.cancel_path(ns(0), path01()), 2);
    assert_eq!(p.cancel(ns(0), s), Err(TransportError::UnknownRequest(s)));
    let ev: Vec<_> = std::iter::from_fn(|| p.poll_event()).collect();
    let cancelled: Vec<_> = ev
        .iter()
        .filter_map(|e| match e {
            TransportEvent::Completion(c) if c.kind == CompletionKind::Cancelled => Some(c.req),
            _ => None,
        })
        .collect();
    assert_eq!(cancelled, vec![s, r]);
    f.advance(Duration::from_secs(1));
    assert!(events(&mut f, 1).is_empty() && events(&mut f, 0).is_empty());
}

#[test]
fn wrong_calls_are_refused() {
    let mut f = fabric();
    let mut p0 = f.port(Rank(0)).unwrap();
    let h = p0.register(10).unwrap();
    let wrong_local = PathId::new(B, Rank(1), B);
    assert_eq!(
        p0.post_send(ns(0), wrong_local, &[], h, 0, 1),
        Err(TransportError::NotLocalNic { nic: B, rank: Rank(0) })
    );
    let wrong_remote = PathId::new(A, Rank(1), A);
    assert_eq!(p0.post_recv(ns(0), wrong_remote, 1), Err(TransportError::NotPeerNic { nic: A, peer: Rank(1) }));
    assert_eq!(
        p0.post_send(ns(0), path01(), &[], h, 5, 6),
        Err(TransportError::OutOfBounds { offset: 5, len: 6, size: 10 })
    );
    let p1 = f.port(Rank(1)).unwrap();
    assert_eq!(p1.region(h).err(), Some(TransportError::UnknownHandle(h)));
    assert!(f.port(Rank(2)).is_err());
}

fn scenario(seed: u64) -> (Duration, Vec<String>) {
    let fabric = FabricConfig {
        nodes: 3,
        nics_per_node: 2,
        seed,
        jitter: ns(3000),
        cancel_race_permille: 300,
        ..FabricConfig::default()
    };
    let cfg = HarnessConfig {
        session: SessionConfig { chunk_size: 8192, ..SessionConfig::default() },
        ..HarnessConfig::default()
    };
    let mut h = Harness::new(fabric, cfg).unwrap();
    h.open_comm(CommId(1));
    h.fabric_mut().schedule(ns(200_000), FaultAction::NicDown(A));
    h.fabric_mut().schedule(ns(900_000), FaultAction::NicUp(A));
    h.fabric_mut().schedule(ns(300_000), FaultAction::BlackHole(NicId::new(2, 1), true));
    for (i, (s, d)) in [(0, 1), (1, 2), (2, 0)].into_iter().enumerate() {
        h.start_transfer(TransferKey::new(1, 0, 0, s, d), vec![i as u8 + 1; 3 << 20], None).unwrap();
    }
    h.run(Duration::from_secs(1)).unwrap();
    h.verify().unwrap();
    (h.now(), h.records().iter().map(|r| format!("{r:?}")).collect())
}

#[test]
fn runs_are_deterministic_under_a_seed() {
    let a = scenario(42);
    assert!(!a.1.is_empty());
    assert_eq!(a, scenario(42));
    assert_ne!(a.0, scenario(43).0, "the seed changes the jitter");
}
