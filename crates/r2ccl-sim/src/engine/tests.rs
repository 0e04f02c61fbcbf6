//! The engine's tests: completion order, link sharing, ports, queues, failures and repair.
use super::*;
use crate::fabric::FabricSpec;

fn fab(nodes: u32, nics: u32) -> Fabric {
    let mut s = FabricSpec::new(nodes, 1, nics, 8.0); // 1 GB/s per NIC
    s.nic_latency_us = 0.0;
    s.nvlink_latency_us = 0.0;
    Fabric::new(s).unwrap()
}

#[test]
fn completions_pop_in_time_then_sequence_order_after_moves_and_removals() {
    // Random sets (new and moved entries) and removals against a plain sorted reference.
    let mut c = Completions::default();
    let mut reference: std::collections::BTreeMap<u32, (f64, u64)> = std::collections::BTreeMap::new();
    let mut x: u64 = 12345;
    let mut next = || {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        x >> 33
    };
    for seq in 0..20_000u64 {
        let s = (next() % 300) as u32;
        if next() % 4 == 0 {
            c.remove(s);
            reference.remove(&s);
        } else {
            // Few distinct times, so that ties are decided by the sequence number.
            let t = (next() % 50) as f64 * 0.25 - 3.0;
            c.set(s, t, seq);
            reference.insert(s, (t, seq));
        }
        if seq % 7 == 0 {
            let want =
                reference.iter().map(|(&s, &(t, q))| (t, q, s)).min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            assert_eq!(c.first(), want, "step {seq}");
            if let Some((_, _, s)) = want {
                c.remove(s);
                reference.remove(&s);
            }
        }
    }
    assert_eq!(c.heap.len(), reference.len());
}

#[test]
fn time_keys_order_like_total_cmp_and_give_the_time_back() {
    let ts = [f64::NEG_INFINITY, -1e300, -2.5, -1e-300, -0.0, 0.0, 1e-300, 1e-12, 0.25, 2.5, 1e300, f64::INFINITY];
    for (i, a) in ts.iter().enumerate() {
        assert_eq!(key_time(time_key(*a)).to_bits(), a.to_bits());
        for b in &ts[i + 1..] {
            assert_eq!(time_key(*a).cmp(&time_key(*b)), a.total_cmp(b), "{a} {b}");
        }
    }
}

#[test]
fn two_flows_share_a_link_fairly() {
    let f = fab(3, 1);
    let mut dag = Dag::new();
    let a = Endpoint::new(0, 0);
    dag.add(Op::Transfer { src: a, dst: Endpoint::new(1, 0), bytes: 1e9, rails: 1, weight: 1.0 }, &[]);
    dag.add(Op::Transfer { src: a, dst: Endpoint::new(2, 0), bytes: 2e9, rails: 1, weight: 1.0 }, &[]);
    let r = simulate(&f, &dag, &[], &EngineConfig::with_repair(RepairMode::None)).unwrap();
    // Both at 0.5 GB/s until the first finishes at 2 s, then the second alone: 1e9 left at 1 GB/s.
    assert!((r.finish[0] - 2.0).abs() < 1e-9, "{:?}", r.finish);
    assert!((r.finish[1] - 3.0).abs() < 1e-9, "{:?}", r.finish);
}

#[test]
fn ports_serve_one_flow_at_a_time() {
    let f = fab(3, 1);
    let mut dag = Dag::new();
    let a = Endpoint::new(0, 0);
    dag.add(Op::Transfer { src: a, dst: Endpoint::new(1, 0), bytes: 1e9, rails: 1, weight: 1.0 }, &[]);
    dag.add(Op::Transfer { src: a, dst: Endpoint::new(2, 0), bytes: 2e9, rails: 1, weight: 1.0 }, &[]);
    let cfg = EngineConfig { sharing: Sharing::Ports, ..EngineConfig::with_repair(RepairMode::None) };
    let r = simulate(&f, &dag, &[], &cfg).unwrap();
    // The first flow holds node 0's uplink for 1 s, then the second runs alone for 2 s.
    assert!((r.finish[0] - 1.0).abs() < 1e-9, "{:?}", r.finish);
    assert!((r.finish[1] - 3.0).abs() < 1e-9, "{:?}", r.finish);
}

#[test]
fn a_queue_carries_its_transfers_one_at_a_time_in_ready_order() {
    let f = fab(2, 1);
    let (a, b) = (Endpoint::new(0, 0), Endpoint::new(1, 0));
    let op = Op::Transfer { src: a, dst: b, bytes: 1e9, rails: 1, weight: 1.0 };
    let mut dag = Dag::new();
    let d = dag.add(Op::Delay(0.5), &[]);
    // Added first but ready at 0.5 s: it waits for the transfer that was ready at 0 s.
    let late = dag.add_queued(op, &[d], 7);
    let early = dag.add_queued(op, &[], 7);
    let r = simulate(&f, &dag, &[], &EngineConfig::with_repair(RepairMode::None)).unwrap();
    assert!((r.finish[early as usize] - 1.0).abs() < 1e-9, "{:?}", r.finish);
    assert!((r.finish[late as usize] - 2.0).abs() < 1e-9, "{:?}", r.finish);
    // Without the queue they share the link from 0.5 s on.
    let mut dag = Dag::new();
    let d = dag.add(Op::Delay(0.5), &[]);
    let late = dag.add(op, &[d]);
    let early = dag.add(op, &[]);
    let r = simulate(&f, &dag, &[], &EngineConfig::with_repair(RepairMode::None)).unwrap();
    assert!((r.finish[early as usize] - 1.5).abs() < 1e-9, "{:?}", r.finish);
    assert!((r.finish[late as usize] - 2.0).abs() < 1e-9, "{:?}", r.finish);
}

#[test]
fn leaving_out_links_that_cannot_bind_changes_nothing() {
    // PXN traffic between 4-NIC nodes: NVLink (4 x 100 Gbit/s <= nvlink) and the spine are left out of the
    // sharing computation. A tiny intra-node transfer elsewhere keeps them in; the times must not move.
    let mut s = FabricSpec::new(3, 4, 4, 100.0);
    s.nvlink_gbps = 400.0;
    let f = Fabric::new(s).unwrap();
    let build = |intra: bool| {
        let mut dag = Dag::new();
        for (i, (src, dst, sr, dr)) in
            [(0u32, 1u32, 0u32, 1u32), (0, 2, 1, 1), (1, 2, 2, 3), (2, 0, 3, 0), (0, 1, 2, 2)].into_iter().enumerate()
        {
            let bytes = 1e8 * (i + 1) as f64;
            let op = Op::Pinned {
                src: Endpoint::new(src, 0),
                dst: Endpoint::new(dst, 3),
                bytes,
                src_rail: sr,
                dst_rail: dr,
                weight: 1.0,
            };
            dag.add(op, &[]);
        }
        if intra {
            let op =
                Op::Transfer { src: Endpoint::new(2, 1), dst: Endpoint::new(2, 2), bytes: 1.0, rails: 0, weight: 1.0 };
            dag.add(op, &[]);
        }
        dag
    };
    let cfg = EngineConfig::with_repair(RepairMode::Spread);
    let fails = [Failure::known_down(1, 0)];
    let lean = simulate(&f, &build(false), &fails, &cfg).unwrap();
    let full = simulate(&f, &build(true), &fails, &cfg).unwrap();
    for i in 0..5 {
        assert!((lean.finish[i] / full.finish[i] - 1.0).abs() < 1e-9, "{i}: {:?} vs {:?}", lean.finish, full.finish);
    }
}

#[test]
fn gating_nvlink_links_changes_nothing() {
    // Intra-node transfers (some on NVLink links that PXN hops use as well, some alone), PXN transfers in
    // chains, a NIC known down and one failing during the run: every finish time agrees with the run that
    // keeps every NVLink link in the sharing computation.
    let mut s = FabricSpec::new(4, 4, 4, 100.0);
    s.nvlink_gbps = 400.0;
    let f = Fabric::new(s).unwrap();
    let mut dag = Dag::new();
    let mut x: u64 = 7;
    let mut next = |m: u64| {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (x >> 33) % m
    };
    let mut prev: Vec<TaskId> = Vec::new();
    for i in 0..400u32 {
        let (sn, sg) = (next(4) as u32, next(4) as u32);
        let intra = next(3) == 0;
        let dn = if intra { sn } else { (sn + 1 + next(3) as u32) % 4 };
        let dg = if intra { (sg + 1 + next(3) as u32) % 4 } else { next(4) as u32 };
        let bytes = 1e5 * (1 + next(40)) as f64;
        let (src, dst) = (Endpoint::new(sn, sg), Endpoint::new(dn, dg));
        let op = if intra {
            Op::Transfer { src, dst, bytes, rails: 0, weight: 1.0 }
        } else {
            let (src_rail, dst_rail) = (next(4) as u32, next(4) as u32);
            Op::Pinned { src, dst, bytes, src_rail, dst_rail, weight: 1.0 }
        };
        let deps: Vec<TaskId> = prev.iter().rev().take(next(3) as usize).copied().collect();
        let t = if next(2) == 0 { dag.add_queued(op, &deps, i % 7) } else { dag.add(op, &deps) };
        prev.push(t);
    }
    let fails = [Failure::known_down(1, 2), Failure::down_at(2, 1, 2e-4)];
    for repair in [RepairMode::Spread, RepairMode::SingleBackup] {
        let cfg = EngineConfig::with_repair(repair);
        let gated = run_with(&f, &dag, &fails, &cfg, Shortcuts { gate_nvlink: true, fill_alone: false }).unwrap();
        let full = run_with(&f, &dag, &fails, &cfg, Shortcuts { gate_nvlink: false, fill_alone: false }).unwrap();
        assert_eq!(gated.flows, full.flows);
        for (i, (a, b)) in gated.finish.iter().zip(&full.finish).enumerate() {
            assert!((a / b - 1.0).abs() < 1e-12, "task {i}: {a} vs {b}");
        }
    }
}

#[test]
fn filling_flows_that_share_no_link_one_by_one_changes_nothing() {
    // Transfers between node pairs on their own rails (each alone on its links) and, later, some that share
    // a NIC, with rates that differ by less than the filling's tolerance (a NIC degraded to 1 - 1e-10) and by
    // more: the same finish times, bit for bit, with and without the shortcut.
    let f = fab(8, 4);
    let mut dag = Dag::new();
    let mut prev: Vec<TaskId> = Vec::new();
    for i in 0..200u32 {
        let (a, b) = (i % 8, (i * 3 + 1) % 8);
        let b = if a == b { (b + 1) % 8 } else { b };
        let rail = (i / 8) % 4;
        let bytes = 1e6 * f64::from(1 + i % 5) + f64::from(i);
        let op = Op::Pinned {
            src: Endpoint::new(a, 0),
            dst: Endpoint::new(b, 0),
            bytes,
            src_rail: rail,
            dst_rail: if i % 11 == 0 { (rail + 1) % 4 } else { rail },
            weight: if i % 7 == 0 { 0.5 } else { 1.0 },
        };
        let deps: Vec<TaskId> = prev.iter().rev().skip(usize::from(i % 3 == 0)).take(1).copied().collect();
        prev.push(if i % 2 == 0 { dag.add_queued(op, &deps, i % 5) } else { dag.add(op, &deps) });
    }
    let fails = [
        Failure { node: 2, rail: 1, kind: FailureKind::Degraded { fraction: 1.0 - 1e-10 }, at_s: 0.0, until_s: None },
        Failure { node: 5, rail: 3, kind: FailureKind::Degraded { fraction: 0.5 }, at_s: 0.01, until_s: None },
        Failure::down_at(6, 2, 0.02),
    ];
    for repair in [RepairMode::Spread, RepairMode::SingleBackup] {
        let cfg = EngineConfig::with_repair(repair);
        let fast = run_with(&f, &dag, &fails, &cfg, Shortcuts { gate_nvlink: true, fill_alone: true }).unwrap();
        let slow = run_with(&f, &dag, &fails, &cfg, Shortcuts { gate_nvlink: true, fill_alone: false }).unwrap();
        assert_eq!((fast.flows, fast.events), (slow.flows, slow.events));
        for (i, (a, b)) in fast.finish.iter().zip(&slow.finish).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "task {i}: {a} vs {b}");
        }
    }
}

#[test]
fn dependencies_and_delays_chain() {
    let f = fab(2, 1);
    let mut dag = Dag::new();
    let d = dag.add(Op::Delay(0.5), &[]);
    let t = dag.add(
        Op::Transfer { src: Endpoint::new(0, 0), dst: Endpoint::new(1, 0), bytes: 1e9, rails: 1, weight: 1.0 },
        &[d],
    );
    dag.add(Op::Delay(0.25), &[t]);
    let r = simulate(&f, &dag, &[], &EngineConfig::with_repair(RepairMode::None)).unwrap();
    assert!((r.makespan - 1.75).abs() < 1e-9);
}

#[test]
fn failure_without_repair_stalls_and_with_repair_migrates() {
    let f = fab(2, 2);
    let mut dag = Dag::new();
    dag.add(
        Op::Transfer { src: Endpoint::new(0, 0), dst: Endpoint::new(1, 0), bytes: 1e9, rails: 1, weight: 1.0 },
        &[],
    );
    let fail = [Failure::down_at(0, 0, 0.5)];
    let r = simulate(&f, &dag, &fail, &EngineConfig::with_repair(RepairMode::None)).unwrap();
    assert!(r.stalled);
    let mut cfg = EngineConfig::with_repair(RepairMode::SingleBackup);
    cfg.replay_chunk_bytes = 0.0;
    let r = simulate(&f, &dag, &fail, &cfg).unwrap();
    assert!(!r.stalled);
    // 0.5 s at 1 GB/s, detection 5 ms stalled, then 0.5e9 on rail 1.
    assert!((r.makespan - 1.005).abs() < 1e-9, "{}", r.makespan);
}

#[test]
fn nic_coming_back_resumes_a_stalled_flow() {
    let f = fab(2, 1);
    let mut dag = Dag::new();
    dag.add(
        Op::Transfer { src: Endpoint::new(0, 0), dst: Endpoint::new(1, 0), bytes: 1e9, rails: 1, weight: 1.0 },
        &[],
    );
    let fail = [Failure { node: 1, rail: 0, kind: FailureKind::BlackHole, at_s: 0.25, until_s: Some(0.75) }];
    let r = simulate(&f, &dag, &fail, &EngineConfig::with_repair(RepairMode::None)).unwrap();
    assert!((r.makespan - 1.5).abs() < 1e-9, "{}", r.makespan);
}

#[test]
fn degraded_nic_slows_its_flows() {
    let f = fab(2, 1);
    let mut dag = Dag::new();
    dag.add(
        Op::Transfer { src: Endpoint::new(0, 0), dst: Endpoint::new(1, 0), bytes: 1e9, rails: 1, weight: 1.0 },
        &[],
    );
    let fail = [Failure { node: 0, rail: 0, kind: FailureKind::Degraded { fraction: 0.5 }, at_s: 0.0, until_s: None }];
    let r = simulate(&f, &dag, &fail, &EngineConfig::with_repair(RepairMode::Spread)).unwrap();
    assert!((r.makespan - 2.0).abs() < 1e-9, "{}", r.makespan);
}

#[test]
fn pinned_parts_use_their_nics_and_move_when_one_fails() {
    let f = fab(2, 2);
    let mut dag = Dag::new();
    let (a, b) = (Endpoint::new(0, 0), Endpoint::new(1, 0));
    // Cross-rail 0 -> 1 and same-rail 1 -> 1 share node 1's NIC 1 downlink: 0.5 GB/s each.
    dag.add(Op::Pinned { src: a, dst: b, bytes: 1e9, src_rail: 0, dst_rail: 1, weight: 1.0 }, &[]);
    dag.add(Op::Pinned { src: a, dst: b, bytes: 1e9, src_rail: 1, dst_rail: 1, weight: 1.0 }, &[]);
    let r = simulate(&f, &dag, &[], &EngineConfig::with_repair(RepairMode::None)).unwrap();
    assert!((r.makespan - 2.0).abs() < 1e-9, "{}", r.makespan);
    // A pinned part on a NIC known dead at the start is spread over the rails alive at both ends.
    let mut dag = Dag::new();
    dag.add(Op::Pinned { src: a, dst: b, bytes: 1e9, src_rail: 0, dst_rail: 0, weight: 1.0 }, &[]);
    let r = simulate(&f, &dag, &[Failure::known_down(1, 0)], &EngineConfig::with_repair(RepairMode::Spread)).unwrap();
    assert!(!r.stalled);
    assert!((r.makespan - 1.0).abs() < 1e-9, "{}", r.makespan);
}
