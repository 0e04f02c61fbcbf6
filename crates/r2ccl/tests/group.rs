//! Grouped point-to-point over UCX on loopback (three ranks as threads of this process, each
//! its own node with two `lo` rails): every rank sends a distinct payload to every rank, itself
//! included, with receives listed before sends on some ranks, and gets exactly what was sent;
//! a group whose operations do not mirror the peer's gives every rank a mismatch error.
#![allow(clippy::unwrap_used, reason = "a panic here is a test failure with a message")]

mod common;

use r2ccl::comm::{CommError, P2p};
use r2ccl_core::{DType, ReduceOp};

const WORLD: u32 = 3;

/// What rank `a` sends rank `b`: a size and pattern of its own (large enough to be striped).
fn payload(a: u32, b: u32) -> Vec<u8> {
    let n = 4 * (1000 + 70_000 * a as usize + 9_000 * b as usize);
    (0..n).map(|i| (i as u32 ^ (a * 131 + b * 71)) as u8).collect()
}

#[test]
fn every_rank_gets_exactly_what_each_peer_sent_it() {
    let threads = common::spawn_ranks(WORLD, 5_000, |me, comm| {
        for _round in 0..2 {
            let sends: Vec<Vec<u8>> = (0..WORLD).map(|b| payload(me, b)).collect();
            let mut recvs: Vec<Vec<u8>> = (0..WORLD).map(|a| vec![0u8; payload(a, me).len()]).collect();
            let mut ops: Vec<P2p<'_>> = Vec::new();
            let recv_ops = recvs.iter_mut().enumerate().map(|(a, buf)| P2p::Recv { peer: a as u32, buf });
            let send_ops = sends.iter().enumerate().map(|(b, data)| P2p::Send { peer: b as u32, data });
            if me == 1 {
                ops.extend(recv_ops);
                ops.extend(send_ops);
            } else {
                ops.extend(send_ops);
                ops.extend(recv_ops);
            }
            comm.group(DType::F32, &mut ops).unwrap();
            drop(ops);
            for (a, got) in recvs.iter().enumerate() {
                assert!(*got == payload(a as u32, me), "rank {me}: wrong bytes from rank {a}");
            }
        }
        // An empty group is a no-op step that every rank takes together.
        comm.group(DType::U8, &mut []).unwrap();
    });
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn a_group_that_does_not_mirror_its_peer_is_a_mismatch_on_every_rank() {
    let threads = common::spawn_ranks(WORLD, 5_000, |me, comm| {
        // Rank 0 sends 8 bytes to rank 1, which expects 12; rank 2 has nothing to do.
        let data = [7u8; 8];
        let mut buf = [0u8; 12];
        let mut ops = match me {
            0 => vec![P2p::Send { peer: 1, data: &data }],
            1 => vec![P2p::Recv { peer: 0, buf: &mut buf }],
            _ => vec![],
        };
        match comm.group(DType::U8, &mut ops) {
            Err(e) => e,
            // Rank 2 has no operation with either side of the mismatch, so its (empty)
            // group may finish before the mismatch reaches it; its next call must fail.
            Ok(_) if me == 2 => {
                let mut out = [0u8; 4];
                comm.all_reduce(&[1u8; 4], &mut out, DType::U8, ReduceOp::Sum).unwrap_err()
            }
            Ok(_) => panic!("rank {me}: a mismatched group succeeded"),
        }
    });
    for (r, t) in threads.into_iter().enumerate() {
        let err = t.join().unwrap();
        assert!(matches!(err, CommError::Mismatch(_)), "rank {r} got {err}");
        assert!(err.to_string().contains("rank 0 -> 1 [8]") || err.to_string().contains("rank 0 -> 1 [12]"), "{err}");
    }
}
