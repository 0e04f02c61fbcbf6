//! `Communicator::split` over UCX on loopback: four ranks (threads of this process, each its
//! own node with two `lo` rails) split by parity, ranked by a reversed key; each half runs an
//! AllReduce whose result proves who is in it, and a rank passing no color joins nothing.
#![allow(clippy::unwrap_used, reason = "a panic here is a test failure with a message")]

mod common;

use r2ccl::ReduceOp;

#[test]
fn split_by_parity_gives_two_working_communicators() {
    let threads = common::spawn_ranks(5, 10_000, |rank, comm| {
        // Rank 4 passes no color; the others split by parity, ranked by a reversed key.
        let color = (rank < 4).then_some(rank % 2);
        let sub = comm.split(color, 10 - rank).unwrap();
        let Some(sub) = sub else {
            assert_eq!(rank, 4);
            return (rank, None);
        };
        let mut out = [0u32];
        sub.all_reduce(&[rank], &mut out, ReduceOp::Sum).unwrap();
        (rank, Some((sub.rank().0, sub.world(), out[0])))
    });
    let mut got: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    got.sort();
    // Evens {0, 2} sum to 2, odds {1, 3} to 4; a higher parent rank has a lower key, so it
    // comes first.
    assert_eq!(
        got,
        vec![(0, Some((1, 2, 2))), (1, Some((1, 2, 4))), (2, Some((0, 2, 2))), (3, Some((0, 2, 4))), (4, None)]
    );
}
