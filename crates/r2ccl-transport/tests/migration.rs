//! End-to-end transfers over the in-memory fabric with faults: exactly-once, bit-exact delivery,
//! replay boundaries, chained failures, fail-back, striping by weight, bad chunks.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]

use proptest::prelude::*;
use r2ccl_core::{NicId, Rank};
use r2ccl_transport::harness::{Harness, HarnessConfig, HARNESS_KEY};
use r2ccl_transport::HeaderMac;
use r2ccl_transport::{
    chunk_count, ChunkHeader, ChunkId, CommId, FabricConfig, FaultAction, MoveReason, SessionConfig, TransferKey,
};
use std::time::Duration;

const CS: u32 = 16 * 1024;

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

fn us(v: u64) -> Duration {
    Duration::from_micros(v)
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn harness(nodes: u32, nics: u16, groups: u16, seed: u64) -> Harness {
    harness_bw(nodes, nics, groups, seed, 1_000_000_000)
}

fn harness_bw(nodes: u32, nics: u16, groups: u16, seed: u64, nic_bytes_per_sec: u64) -> Harness {
    let fabric = FabricConfig {
        nodes,
        ranks_per_node: 1,
        nics_per_node: nics,
        nic_bytes_per_sec,
        latency: us(5),
        jitter: us(3),
        seed,
        cancel_race_permille: 200,
        local_completion: false,
    };
    let cfg = HarnessConfig {
        session: SessionConfig { chunk_size: CS, window: 8, ..SessionConfig::default() },
        numa_groups: groups,
        ..HarnessConfig::default()
    };
    let mut h = Harness::new(fabric, cfg).unwrap();
    h.open_comm(CommId(1));
    h
}

fn total_applied(h: &Harness) -> u64 {
    h.sessions().iter().map(|s| s.stats().chunks_applied).sum()
}

#[test]
fn clean_transfer_is_exact_and_striped() {
    let mut h = harness(2, 2, 1, 1);
    let key = TransferKey::new(1, 0, 0, 0, 1);
    let len = 1_000_000;
    h.start_transfer(key, pattern(len, 1), None).unwrap();
    h.run(ms(100)).unwrap();
    h.verify().unwrap();
    assert_eq!(total_applied(&h), u64::from(chunk_count(len as u64, CS)));
    assert!(h.records().is_empty());
    let a = h.fabric().nic_stats(NicId::new(0, 0)).tx_payload;
    let b = h.fabric().nic_stats(NicId::new(0, 1)).tx_payload;
    assert_eq!(a + b, len as u64);
    assert!(a.abs_diff(len as u64 / 2) <= u64::from(CS), "{a} {b}");
    // 1 MB over two 1 GB/s NICs: about 0.5 ms of simulated time.
    assert!(h.now() < ms(2), "{:?}", h.now());
}

#[test]
fn nic_down_mid_transfer_migrates_and_completes() {
    let mut h = harness(2, 2, 1, 2);
    let key = TransferKey::new(1, 0, 0, 0, 1);
    let len = 4 << 20;
    h.fabric_mut().schedule(us(300), FaultAction::NicDown(NicId::new(0, 0)));
    h.start_transfer(key, pattern(len, 2), None).unwrap();
    h.run(ms(200)).unwrap();
    h.verify().unwrap();
    assert_eq!(total_applied(&h), u64::from(chunk_count(len as u64, CS)));
    assert!(!h.records().is_empty());
    for r in h.records() {
        assert!(r.boundary <= r.held && r.boundary <= r.sender_done && r.prefix_exact, "{r:?}");
        assert_eq!(r.to.local, NicId::new(0, 1));
    }
}

fn check_records(h: &Harness) {
    for r in h.records() {
        assert!(r.boundary <= r.held, "boundary ahead of receiver: {r:?}");
        assert!(r.boundary <= r.sender_done, "boundary ahead of sender: {r:?}");
        assert!(r.prefix_exact, "receiver does not hold the bytes below the boundary: {r:?}");
    }
}

#[test]
fn second_failure_during_migration_moves_down_the_chain() {
    // Four NICs in two NUMA groups: nic0's chain is nic1 (same group), then nic2, nic3.
    let mut h = harness(2, 4, 2, 3);
    let key = TransferKey::new(1, 0, 0, 0, 1);
    let len = 6 << 20;
    h.fabric_mut().schedule(us(200), FaultAction::NicDown(NicId::new(0, 0)));
    // nic1 dies while nic0's lane is being replayed on it.
    h.fabric_mut().schedule(us(260), FaultAction::NicDown(NicId::new(0, 1)));
    h.start_transfer(key, pattern(len, 3), Some(&[1, 1, 1, 1])).unwrap();
    h.run(ms(500)).unwrap();
    h.verify().unwrap();
    check_records(&h);
    assert_eq!(total_applied(&h), u64::from(chunk_count(len as u64, CS)));
    let lane0: Vec<_> = h.records().iter().filter(|r| r.lane.lane == 0).collect();
    assert_eq!(lane0.len(), 2, "{lane0:?}");
    assert_eq!(lane0[0].to.local, NicId::new(0, 1), "first backup is the same-NUMA NIC");
    assert_eq!(lane0[1].from.local, NicId::new(0, 1));
    assert_eq!(lane0[1].to.local, NicId::new(0, 2), "second failure moves on down the chain");
}

#[test]
fn receiver_nic_down_is_repaired_through_the_notice() {
    let mut h = harness(2, 2, 1, 4);
    let key = TransferKey::new(1, 0, 0, 0, 1);
    let len = 3 << 20;
    h.fabric_mut().schedule(us(400), FaultAction::NicDown(NicId::new(1, 1)));
    h.start_transfer(key, pattern(len, 4), None).unwrap();
    h.run(ms(200)).unwrap();
    h.verify().unwrap();
    check_records(&h);
    assert!(h.records().iter().any(|r| r.from.remote == NicId::new(1, 1) && r.to.remote == NicId::new(1, 0)));
    // Found by the link-state notice, long before any stall timeout.
    assert!(h.records()[0].at < us(500), "{:?}", h.records()[0]);
}

#[test]
fn chunks_lost_after_send_completion_are_replayed_from_the_receiver_boundary() {
    let mut h = harness(2, 2, 1, 11);
    let key = TransferKey::new(1, 0, 0, 0, 1);
    let len = 4 << 20;
    // The receiver is descheduled: completed chunks pile up in its NIC's inbox, then that NIC
    // dies and takes them along. The sender counts them done; the receiver does not hold them.
    h.pause(Rank(1), us(200), us(700));
    h.fabric_mut().schedule(us(600), FaultAction::NicDown(NicId::new(1, 0)));
    h.start_transfer(key, pattern(len, 11), None).unwrap();
    h.run(ms(200)).unwrap();
    h.verify().unwrap();
    check_records(&h);
    assert!(h.records().iter().any(|r| r.boundary < r.sender_done), "{:?}", h.records());
    assert_eq!(h.sessions()[1].stats().chunks_applied, u64::from(chunk_count(len as u64, CS)));
}

#[test]
fn silent_black_hole_is_caught_by_the_stall_deadline() {
    let mut h = harness(2, 2, 1, 5);
    let key = TransferKey::new(1, 0, 0, 0, 1);
    let len = 2 << 20;
    h.fabric_mut().schedule(us(100), FaultAction::BlackHole(NicId::new(1, 0), true));
    h.start_transfer(key, pattern(len, 5), None).unwrap();
    h.run(ms(500)).unwrap();
    h.verify().unwrap();
    check_records(&h);
    let first = h.records()[0];
    assert_eq!(first.reason, MoveReason::Failure(r2ccl_transport::PathFault::Timeout));
    // Detected one stall timeout (20 ms) after the last progress, not earlier.
    assert!(first.at >= ms(20) && first.at < ms(22), "{first:?}");
}

#[test]
fn fail_back_moves_traffic_back_after_recovery() {
    let mut h = harness(2, 2, 1, 6);
    let key = TransferKey::new(1, 0, 0, 0, 1);
    let len = 16 << 20;
    let nic0 = NicId::new(0, 0);
    h.fabric_mut().schedule(us(500), FaultAction::NicDown(nic0));
    h.fabric_mut().schedule(ms(3), FaultAction::NicUp(nic0));
    h.start_transfer(key, pattern(len, 6), None).unwrap();
    h.run_until(ms(3)).unwrap();
    let before = h.fabric().nic_stats(nic0).tx_payload;
    assert!(h.unfinished() > 0, "transfer must still run when the NIC returns");
    h.run(ms(500)).unwrap();
    h.verify().unwrap();
    check_records(&h);
    let after = h.fabric().nic_stats(nic0).tx_payload;
    assert!(after > before + u64::from(CS) * 16, "traffic moved back to nic0: {before} -> {after}");
    let back = h.records().iter().find(|r| r.reason == MoveReason::Failback).expect("a fail-back record");
    assert_eq!(back.to.local, nic0);
    assert!(back.at >= ms(3) && back.at < ms(4), "{back:?}");
    assert_eq!(h.sessions()[0].stats().failbacks, 1);
}

#[test]
fn link_down_and_slow_nic_with_several_transfers() {
    let mut h = harness(3, 2, 1, 7);
    h.fabric_mut().schedule(us(300), FaultAction::LinkDown(NicId::new(0, 0), NicId::new(1, 0)));
    h.fabric_mut().schedule(us(0), FaultAction::Slow(NicId::new(2, 1), 200));
    h.fabric_mut().schedule(us(0), FaultAction::Delay(NicId::new(1, 1), us(300)));
    let mut n = 0;
    for (i, (src, dst)) in [(0, 1), (1, 2), (2, 0), (0, 2)].into_iter().enumerate() {
        let len = 1_500_000 + i * 7919;
        n += u64::from(chunk_count(len as u64, CS));
        h.start_transfer(TransferKey::new(1, 0, 0, src, dst), pattern(len, 70 + i as u64), None).unwrap();
    }
    h.run(ms(500)).unwrap();
    h.verify().unwrap();
    check_records(&h);
    assert_eq!(total_applied(&h), n);
    assert!(!h.records().is_empty());
}

#[test]
fn bad_chunks_are_counted_and_never_applied() {
    let mut h = harness(2, 2, 1, 8);
    let key = TransferKey::new(1, 0, 0, 0, 1);
    let len = 100_000;
    let data = pattern(len, 8);
    h.start_transfer(key, data.clone(), None).unwrap();
    h.run(ms(50)).unwrap();
    h.verify().unwrap();
    let (a, b) = (NicId::new(0, 0), NicId::new(1, 0));
    let good = |k: TransferKey, index: u32, fill: u8| {
        let hdr = ChunkHeader { id: ChunkId { transfer: k, index }, total_len: len as u64, len: CS, flags: 0, args: 0 };
        let mut m = hdr.encode(&HeaderMac::new(&HARNESS_KEY)).to_vec();
        m.extend(std::iter::repeat_n(fill, CS as usize));
        m
    };
    let f = h.fabric_mut();
    // A duplicate of chunk 0 with other bytes, after the transfer completed.
    f.inject(Rank(0), a, Rank(1), b, good(key, 0, 0xee));
    // A chunk of a communicator rank 1 never opened.
    f.inject(Rank(0), a, Rank(1), b, good(TransferKey::new(99, 0, 0, 0, 1), 0, 0xee));
    // A header naming another receiver.
    f.inject(Rank(0), a, Rank(1), b, good(TransferKey::new(1, 0, 0, 0, 7), 0, 0xee));
    // A chunk whose header disagrees with its payload length, garbage, and an empty message.
    let mut short = good(key, 1, 0xee);
    short.truncate(short.len() - 1);
    f.inject(Rank(0), a, Rank(1), b, short);
    f.inject(Rank(0), a, Rank(1), b, pattern(200, 9));
    f.inject(Rank(0), a, Rank(1), b, Vec::new());
    h.run_until(h.now() + ms(1)).unwrap();
    h.verify().unwrap();
    let st = h.sessions()[1].stats();
    assert_eq!(st.duplicates, 1, "{st:?}");
    assert_eq!(st.unknown_collective, 1, "{st:?}");
    assert_eq!(st.misrouted, 1, "{st:?}");
    assert_eq!(st.malformed, 3, "{st:?}");
    assert_eq!(st.chunks_applied, u64::from(chunk_count(len as u64, CS)));
    assert_eq!(h.bad_chunks(), 5);
}

#[test]
fn duplicates_during_a_transfer_are_not_applied() {
    let mut h = harness(2, 2, 1, 9);
    let key = TransferKey::new(1, 0, 0, 0, 1);
    let len = 8 << 20;
    let data = pattern(len, 10);
    h.start_transfer(key, data.clone(), None).unwrap();
    h.run_until(us(500)).unwrap();
    assert!(h.session(Rank(1)).unwrap().holds_chunk(key, 0));
    let hdr =
        ChunkHeader { id: ChunkId { transfer: key, index: 0 }, total_len: len as u64, len: CS, flags: 0, args: 0 };
    let mut m = hdr.encode(&HeaderMac::new(&HARNESS_KEY)).to_vec();
    m.extend(std::iter::repeat_n(0u8, CS as usize));
    for _ in 0..3 {
        h.fabric_mut().inject(Rank(0), NicId::new(0, 0), Rank(1), NicId::new(1, 0), m.clone());
    }
    h.run(ms(100)).unwrap();
    h.verify().unwrap();
    assert_eq!(h.sessions()[1].stats().duplicates, 3);
}

#[test]
fn zero_length_and_tiny_transfers_complete() {
    let mut h = harness(2, 2, 1, 10);
    for (i, len) in [0usize, 1, 100, CS as usize - 1, CS as usize, CS as usize + 1].into_iter().enumerate() {
        h.start_transfer(TransferKey::new(1, 0, i as u32, 0, 1), pattern(len, i as u64), None).unwrap();
    }
    h.run(ms(10)).unwrap();
    h.verify().unwrap();
}

fn run_with_weights(weights: &[u32], len: usize, seed: u64) -> Vec<u64> {
    let mut h = harness(2, weights.len() as u16, 1, seed);
    h.start_transfer(TransferKey::new(1, 0, 0, 0, 1), pattern(len, seed), Some(weights)).unwrap();
    h.run(ms(200)).unwrap();
    h.verify().unwrap();
    (0..weights.len() as u16).map(|r| h.fabric().nic_stats(NicId::new(0, r)).tx_payload).collect()
}

#[derive(Clone, Debug)]
enum Kind {
    Down,
    BlackHole,
    Link(u16),
    Slow(u32),
    Delay(u64),
    Pause(u64),
}

#[derive(Clone, Debug)]
struct Fault {
    at_us: u64,
    node: u32,
    rail: u16,
    kind: Kind,
    heal_after_us: Option<u64>,
}

fn fault() -> impl Strategy<Value = Fault> {
    let kind = prop_oneof![
        3 => Just(Kind::Down),
        2 => Just(Kind::BlackHole),
        2 => (0u16..4).prop_map(Kind::Link),
        1 => (50u32..1000).prop_map(Kind::Slow),
        1 => (0u64..500).prop_map(Kind::Delay),
        2 => (100u64..3000).prop_map(Kind::Pause),
    ];
    (0u64..3000, 0u32..3, 0u16..4, kind, proptest::option::of(0u64..4000))
        .prop_map(|(at_us, node, rail, kind, heal_after_us)| Fault { at_us, node, rail, kind, heal_after_us })
}

#[derive(Clone, Debug)]
struct Case {
    nodes: u32,
    nics: u16,
    groups: u16,
    seed: u64,
    protected: Vec<u16>,
    transfers: Vec<(u32, u32, usize)>,
    faults: Vec<Fault>,
}

fn case() -> impl Strategy<Value = Case> {
    (2u32..=3, prop_oneof![Just(2u16), Just(4u16)], any::<bool>(), any::<u64>()).prop_flat_map(
        |(nodes, nics, two_groups, seed)| {
            let size = prop_oneof![
                1 => Just(0usize),
                2 => 1usize..(CS as usize * 3),
                4 => 1usize..(4 << 20),
            ];
            let xfer = (0..nodes, 1..nodes, size).prop_map(move |(s, d, len)| (s, (s + d) % nodes, len));
            (
                proptest::collection::vec(0..nics, nodes as usize),
                proptest::collection::vec(xfer, 1..=4),
                proptest::collection::vec(fault(), 1..=6),
            )
                .prop_map(move |(protected, transfers, faults)| Case {
                    nodes,
                    nics,
                    groups: if two_groups { 2 } else { 1 },
                    seed,
                    protected,
                    transfers,
                    faults,
                })
        },
    )
}

/// Schedules the case's faults, never touching a node's protected NIC or the links between
/// protected NICs, so every node keeps at least one NIC and every pair one working path.
fn schedule(h: &mut Harness, c: &Case) {
    for f in &c.faults {
        let node = f.node % c.nodes;
        let rail = f.rail % c.nics;
        let nic = NicId::new(node, rail);
        let protected = |n: NicId| c.protected[n.node.index()] == n.rail.0;
        let at = us(f.at_us);
        let (hit, heal) = match f.kind {
            Kind::Down if !protected(nic) => (FaultAction::NicDown(nic), FaultAction::NicUp(nic)),
            Kind::BlackHole if !protected(nic) => {
                (FaultAction::BlackHole(nic, true), FaultAction::BlackHole(nic, false))
            }
            Kind::Link(other) => {
                // Mostly the same-rail link, which carries traffic; sometimes a cross-rail one.
                let peer_rail = if other < 3 { rail } else { (rail + 1) % c.nics };
                let peer = NicId::new((node + 1) % c.nodes, peer_rail);
                if protected(nic) && protected(peer) {
                    continue;
                }
                (FaultAction::LinkDown(nic, peer), FaultAction::LinkUp(nic, peer))
            }
            Kind::Slow(p) => (FaultAction::Slow(nic, p), FaultAction::Slow(nic, 1000)),
            Kind::Delay(d) => (FaultAction::Delay(nic, us(d)), FaultAction::Delay(nic, Duration::ZERO)),
            Kind::Pause(d) => {
                h.pause(Rank(node), at, at + us(d));
                continue;
            }
            _ => continue,
        };
        h.fabric_mut().schedule(at, hit);
        if let Some(after) = f.heal_after_us {
            h.fabric_mut().schedule(at + us(after), heal);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_transfers_under_random_faults_arrive_exactly_once(c in case()) {
        // 250 MB/s NICs: multi-MiB transfers take milliseconds, so faults land mid-transfer.
        let mut h = harness_bw(c.nodes, c.nics, c.groups, c.seed, 250_000_000);
        schedule(&mut h, &c);
        let mut chunks = 0u64;
        let mut bytes = 0u64;
        for (i, &(src, dst, len)) in c.transfers.iter().enumerate() {
            chunks += u64::from(chunk_count(len as u64, CS));
            bytes += len as u64;
            let key = TransferKey::new(1, i as u64, 0, src, dst);
            h.start_transfer(key, pattern(len, c.seed ^ i as u64), None).unwrap();
        }
        h.run(Duration::from_secs(2)).unwrap();
        h.verify().unwrap();
        check_records(&h);
        let applied: u64 = h.sessions().iter().map(|s| s.stats().chunks_applied).sum();
        let applied_bytes: u64 = h.sessions().iter().map(|s| s.stats().bytes_applied).sum();
        prop_assert_eq!(applied, chunks);
        prop_assert_eq!(applied_bytes, bytes);
        prop_assert_eq!(h.bad_chunks(), 0);
    }

}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn chained_failures_during_migration_are_survived(
        protected in 0u16..4,
        node in 0u32..2,
        t0 in 50u64..600,
        gaps in proptest::collection::vec(0u64..300, 1..=2),
        len in (2usize << 20)..(4 << 20),
        seed in any::<u64>(),
    ) {
        // 250 MB/s NICs: the transfer takes 2-4 ms, so every fault lands mid-transfer.
        let mut h = harness_bw(2, 4, 2, seed, 250_000_000);
        let mut at = t0;
        let mut victims = (0u16..4).filter(|&r| r != protected).collect::<Vec<_>>();
        victims.rotate_left((seed % 3) as usize);
        for (i, rail) in victims.into_iter().take(gaps.len() + 1).enumerate() {
            if i > 0 {
                at += gaps[i - 1];
            }
            h.fabric_mut().schedule(us(at), FaultAction::NicDown(NicId::new(node, rail)));
        }
        let key = TransferKey::new(1, 0, 0, 0, 1);
        h.start_transfer(key, pattern(len, seed), None).unwrap();
        h.run(Duration::from_secs(1)).unwrap();
        h.verify().unwrap();
        check_records(&h);
        prop_assert_eq!(h.sessions()[1].stats().chunks_applied, u64::from(chunk_count(len as u64, CS)));
        prop_assert!(h.records().len() >= 2, "{:?}", h.records());
    }

    #[test]
    fn striping_follows_weights_within_one_chunk(
        weights in proptest::collection::vec(0u32..10, 2..=4).prop_filter("one NIC used", |w| w.iter().any(|&x| x > 0)),
        len in 0usize..(2 << 20),
        seed in any::<u64>(),
    ) {
        let tx = run_with_weights(&weights, len, seed);
        let total: u64 = weights.iter().map(|&w| u64::from(w)).sum();
        prop_assert_eq!(tx.iter().sum::<u64>(), len as u64);
        for (i, &w) in weights.iter().enumerate() {
            let ideal = len as f64 * w as f64 / total as f64;
            prop_assert!((tx[i] as f64 - ideal).abs() <= f64::from(CS), "nic {} got {} want {}", i, tx[i], ideal);
        }
    }
}
