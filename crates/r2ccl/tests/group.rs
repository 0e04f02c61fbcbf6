//! Grouped point-to-point over UCX on loopback (three ranks as threads of this process, each
//! its own node with two `lo` rails): every rank sends a distinct payload to every rank, itself
//! included, with receives listed before sends on some ranks, and gets exactly what was sent;
//! a group whose operations do not mirror the peer's gives every rank a mismatch error.
#![allow(clippy::unwrap_used, reason = "a panic here is a test failure with a message")]

mod common;

use r2ccl::{CommError, DType, P2p, Rank, ReduceOp};

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
            comm.group(|g| {
                let mut recv_ops = recvs.iter_mut().enumerate();
                if me == 1 {
                    for (a, buf) in recv_ops.by_ref() {
                        g.recv(buf, Rank(a as u32));
                    }
                }
                for (b, data) in sends.iter().enumerate() {
                    g.send(data, Rank(b as u32));
                }
                for (a, buf) in recv_ops {
                    g.recv(buf, Rank(a as u32));
                }
            })
            .unwrap();
            for (a, got) in recvs.iter().enumerate() {
                assert!(*got == payload(a as u32, me), "rank {me}: wrong bytes from rank {a}");
            }
        }
        // The byte-level form, with a dtype of its own.
        let data = payload(me, (me + 1) % WORLD);
        let from = (me + WORLD - 1) % WORLD;
        let mut got = vec![0u8; payload(from, me).len()];
        let mut ops =
            [P2p::Send { peer: Rank((me + 1) % WORLD), data: &data }, P2p::Recv { peer: Rank(from), buf: &mut got }];
        comm.group_bytes(DType::F32, &mut ops).unwrap();
        assert!(got == payload(from, me), "rank {me}: wrong bytes from rank {from} (byte level)");
        // An empty group is a no-op step that every rank takes together.
        comm.group(|_| {}).unwrap();
        // Mixed element types in one group are refused before anything is sent.
        let (a, mut b) = ([1u32], [0f32]);
        let err = comm.group(|g| {
            g.send(&a, Rank(me)).recv(&mut b, Rank(me));
        });
        assert!(matches!(err, Err(CommError::Invalid(_))), "rank {me}: {err:?}");
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
        let result = comm.group(|g| match me {
            0 => {
                g.send(&data, Rank(1));
            }
            1 => {
                g.recv(&mut buf, Rank(0));
            }
            _ => {}
        });
        match result {
            Err(e) => e,
            // Rank 2 has no operation with either side of the mismatch, so its (empty)
            // group may finish before the mismatch reaches it; and rank 0's small send may
            // finish before rank 1 refuses it (its bytes wait in the linger pool, not for the
            // receipt). Their next call must fail.
            Ok(_) if me != 1 => {
                let mut out = [0u8; 4];
                comm.all_reduce(&[1u8; 4], &mut out, ReduceOp::Sum).unwrap_err()
            }
            Ok(_) => panic!("rank {me}: a mismatched group succeeded"),
        }
    });
    for (r, t) in threads.into_iter().enumerate() {
        let err = t.join().unwrap();
        assert!(matches!(err, CommError::Mismatch { .. }), "rank {r} got {err}");
        assert!(err.to_string().contains("rank 0 -> 1 [8]") || err.to_string().contains("rank 0 -> 1 [12]"), "{err}");
    }
}

/// A mismatch no chunk shows: ranks 0 and 1 each only receive from the other, so neither sends
/// anything whose header could carry its arguments. Each sends its argument description once
/// the group has run for 100 ms, and both end with a named mismatch, well before the collective
/// deadline (the peer timeout is 30 s here).
#[test]
fn a_mismatch_where_both_ranks_only_wait_is_named_on_both_by_the_late_check() {
    let threads = common::spawn_ranks(2, 30_000, |me, comm| {
        let mut buf = [0u8; 8];
        let t0 = std::time::Instant::now();
        let err = comm.group(|g| {
            g.recv(&mut buf, Rank(1 - me));
        });
        (err, t0.elapsed())
    });
    for (r, t) in threads.into_iter().enumerate() {
        let (err, took) = t.join().unwrap();
        assert!(matches!(err, Err(CommError::Mismatch { .. })), "rank {r} got {err:?}");
        assert!(took < std::time::Duration::from_secs(10), "rank {r}: the mismatch took {took:?}");
        eprintln!("rank {r}: {:?} after {took:?}", err.unwrap_err());
    }
}
