//! A rank that calls more collectives than a peer that has already destroyed its communicator
//! gets a prompt error naming that peer, never a hang: two ranks over UCX on loopback (threads
//! of this process, each its own node with two `lo` rails).
#![allow(clippy::unwrap_used, reason = "a panic here is a test failure with a message")]

mod common;

use r2ccl::{CommError, Rank, ReduceOp};
use std::time::{Duration, Instant};

#[test]
fn a_collective_a_departed_peer_never_joins_fails_at_once_naming_it() {
    // The collective deadline is 12 x the peer timeout (120 s): the error below must come long before.
    let threads = common::spawn_ranks(2, 10_000, |rank, comm| {
        let input = [1u32];
        let mut out = [0u32];
        for _ in 0..2 {
            comm.all_reduce(&input, &mut out, ReduceOp::Sum).unwrap();
            assert_eq!(out, [2]);
        }
        if rank == 0 {
            // Rank 0 leaves after two collectives.
            drop(comm);
            return None;
        }
        // Rank 1 calls a third one, which rank 0 will never join.
        std::thread::sleep(Duration::from_millis(200));
        let started = Instant::now();
        let err = comm.all_reduce(&input, &mut out, ReduceOp::Sum).unwrap_err();
        Some((err, started.elapsed()))
    });
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let (err, took) = results[1].clone().unwrap();
    assert!(matches!(err, CommError::PeerLost { rank: Rank(0), .. }), "rank 1 got {err}");
    assert!(err.to_string().contains("left the communicator"), "{err}");
    assert!(took < Duration::from_secs(5), "the error took {took:?}");
}
