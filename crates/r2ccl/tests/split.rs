//! `Communicator::split` over UCX on loopback: four ranks (threads of this process, each its
//! own node with two `lo` rails) split by parity, ranked by a reversed key; each half runs an
//! AllReduce whose result proves who is in it, and a rank passing no color joins nothing.
#![allow(clippy::unwrap_used, reason = "a panic here is a test failure with a message")]

use r2ccl::bootstrap::Secret;
use r2ccl::comm::{CommOptions, Communicator};
use r2ccl_config::Config;
use r2ccl_core::{DType, ReduceOp};
use std::net::TcpListener;

#[test]
fn split_by_parity_gives_two_working_communicators() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let root = format!("127.0.0.1:{port}");
    let secret = Secret::from_hex("00112233445566778899aabbccddeeff").unwrap();
    let threads: Vec<_> = (0..5u32)
        .map(|rank| {
            let (root, secret) = (root.clone(), secret.clone());
            std::thread::spawn(move || {
                let mut config = Config::default();
                config.bootstrap.connect_timeout_ms = 20_000;
                config.bootstrap.peer_timeout_ms = 10_000;
                let opts = CommOptions {
                    rank,
                    world: 5,
                    root,
                    secret,
                    node: format!("node{rank}"),
                    nics: vec!["lo".into(), "lo".into()],
                    config,
                    env_faults: false,
                };
                let comm = Communicator::init(opts).unwrap();
                // Rank 4 passes no color; the others split by parity, ranked by a reversed key.
                let color = (rank < 4).then_some(rank % 2);
                let sub = comm.split(color, 10 - rank).unwrap();
                let Some(sub) = sub else {
                    assert_eq!(rank, 4);
                    return (rank, None);
                };
                let input = rank.to_le_bytes();
                let mut out = [0u8; 4];
                sub.all_reduce(&input, &mut out, DType::U32, ReduceOp::Sum).unwrap();
                (rank, Some((sub.rank(), sub.world(), u32::from_le_bytes(out))))
            })
        })
        .collect();
    let mut got: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    got.sort();
    // Evens {0, 2} sum to 2, odds {1, 3} to 4; a higher parent rank has a lower key, so it
    // comes first.
    assert_eq!(
        got,
        vec![(0, Some((1, 2, 2))), (1, Some((1, 2, 4))), (2, Some((0, 2, 2))), (3, Some((0, 2, 4))), (4, None)]
    );
}
