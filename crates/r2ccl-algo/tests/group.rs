//! Grouped point-to-point schedules: every rank sends a distinct payload to several peers
//! (itself included) and receives from several, in an order that differs per rank; the
//! reference executor delivers each payload to the right place, bit-exact, in both orders.
#![allow(clippy::unwrap_used, reason = "tests")]

use r2ccl_algo::{build_p2p_group, execute, p2p_group_lens, AlgoError, ExecOrder, Fabric, Layout, P2pOp};
use r2ccl_core::{DType, NicId, Rank};

fn fabric() -> Fabric {
    // 3 nodes x 2 ranks, 2 NICs each, node 1 has lost NIC 0 (sends are split by the survivors).
    let layout = Layout::uniform(3, 2, 2).unwrap();
    let mut view = r2ccl_core::HealthView::uniform(3, 2, 100_000);
    view.set_failed(NicId::new(1, 0)).unwrap();
    Fabric::new(layout, view).unwrap()
}

/// Elements rank `a` sends to rank `b` in its `k`-th send to b (0 means none for some pairs).
fn count(a: u32, b: u32, k: u32) -> u64 {
    u64::from((a * 7 + b * 3 + k * 5) % 6)
}

fn payload(a: u32, b: u32, k: u32) -> Vec<u8> {
    (0..count(a, b, k) * 4).map(|i| (a * 31 + b * 17 + k * 11) as u8 ^ i as u8).collect()
}

/// Rank `me`'s operations: two sends to every peer and two receives from every peer, itself
/// included; receives first on odd ranks, peers in reverse on ranks divisible by 3.
fn ops(me: u32, p: u32) -> Vec<P2pOp> {
    let mut peers: Vec<u32> = (0..p).collect();
    if me.is_multiple_of(3) {
        peers.reverse();
    }
    let mut sends = Vec::new();
    let mut recvs = Vec::new();
    for k in 0..2 {
        for &q in &peers {
            sends.push(P2pOp::Send { peer: Rank(q), count: count(me, q, k) });
            recvs.push(P2pOp::Recv { peer: Rank(q), count: count(q, me, k) });
        }
    }
    if me % 2 == 1 {
        recvs.into_iter().chain(sends).collect()
    } else {
        sends.into_iter().chain(recvs).collect()
    }
}

#[test]
fn every_payload_lands_where_its_receive_says() {
    let fab = fabric();
    let p = fab.layout().ranks() as u32;
    let all: Vec<Vec<P2pOp>> = (0..p).map(|r| ops(r, p)).collect();
    let scheds: Vec<_> =
        (0..p).map(|r| build_p2p_group(&fab, Rank(r), DType::F32, &all[r as usize]).unwrap()).collect();
    let inputs: Vec<Vec<u8>> = (0..p)
        .map(|r| {
            let mut k = vec![0u32; p as usize];
            let mut input = Vec::new();
            for op in all[r as usize].iter().filter(|o| o.is_send()) {
                let q = op.peer().0;
                input.extend(payload(r, q, k[q as usize]));
                k[q as usize] += 1;
            }
            assert_eq!(input.len() as u64, p2p_group_lens(DType::F32, &all[r as usize]).unwrap().0);
            input
        })
        .collect();
    for order in [ExecOrder::Program, ExecOrder::Dataflow] {
        let outputs = execute(&scheds, &inputs, order).unwrap();
        for r in 0..p {
            let mut k = vec![0u32; p as usize];
            let mut want = Vec::new();
            for op in all[r as usize].iter().filter(|o| !o.is_send()) {
                let q = op.peer().0;
                want.extend(payload(q, r, k[q as usize]));
                k[q as usize] += 1;
            }
            assert_eq!(outputs[r as usize], want, "rank {r} ({order:?})");
        }
    }
}

#[test]
fn bad_groups_are_refused() {
    let fab = fabric();
    let out_of_range = [P2pOp::Send { peer: Rank(6), count: 1 }];
    assert!(build_p2p_group(&fab, Rank(0), DType::F32, &out_of_range).is_err());
    let unpaired = [P2pOp::Send { peer: Rank(0), count: 1 }];
    assert!(matches!(build_p2p_group(&fab, Rank(0), DType::F32, &unpaired), Err(AlgoError::InvalidParameter { .. })));
    let unequal = [P2pOp::Send { peer: Rank(2), count: 1 }, P2pOp::Recv { peer: Rank(2), count: 2 }];
    assert!(build_p2p_group(&fab, Rank(2), DType::F32, &unequal).is_err());
    assert!(build_p2p_group(&fab, Rank(1), DType::F32, &[]).is_ok());
}
