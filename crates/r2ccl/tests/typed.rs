//! The typed API over UCX on loopback (three ranks as threads of this process, each its own
//! node with two `lo` rails): every typed collective, in place and out of place, on plain and
//! registered memory, is bit-exact and equal to the byte-level call; sizes that do not fit are
//! refused before anything is sent and the communicator goes on; calls in a scope overlap and
//! finish; a deadline is honoured; finalize and destroy end as documented.
#![allow(clippy::unwrap_used, reason = "a panic here is a test failure with a message")]

mod common;

use r2ccl::{Collective, CommError, DType, Rank, ReduceOp};
use std::time::{Duration, Instant};

const WORLD: u32 = 3;

/// Rank `me`'s input: small integers as f32, so every order of the sum gives the same bits.
fn input(me: u32, n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i as u32 * 7 + me * 13) % 29) as f32).collect()
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn floats(b: &[u8]) -> Vec<f32> {
    b.chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

#[test]
fn every_typed_collective_matches_the_byte_level_call() {
    let threads = common::spawn_ranks(WORLD, 5_000, |me, comm| {
        let (p, n) = (WORLD as usize, 100_003usize);
        let sum = ReduceOp::Sum;
        // The byte-level reference of each collective.
        let reference = |coll: Collective, count: usize, send: &[f32], out: usize| {
            let mut o = vec![0u8; out * 4];
            comm.run(coll, DType::F32, count as u64, &bytes(send), &mut o).unwrap();
            floats(&o)
        };
        let x = input(me, n);
        let big = input(me, p * n);

        let mut out = vec![0f32; n];
        comm.all_reduce(&x, &mut out, sum).unwrap();
        assert_eq!(out, reference(Collective::AllReduce { op: sum }, n, &x, n), "rank {me}: all_reduce");
        let mut buf = x.clone();
        comm.all_reduce_in_place(&mut buf, sum).unwrap();
        assert_eq!(buf, out, "rank {me}: all_reduce_in_place");

        let mut all = vec![0f32; p * n];
        comm.all_gather(&x, &mut all).unwrap();
        assert_eq!(all, reference(Collective::AllGather, n, &x, p * n), "rank {me}: all_gather");
        let mut buf = vec![0f32; p * n];
        buf[me as usize * n..(me as usize + 1) * n].copy_from_slice(&x);
        comm.all_gather_in_place(&mut buf).unwrap();
        assert_eq!(buf, all, "rank {me}: all_gather_in_place");

        let mut block = vec![0f32; n];
        comm.reduce_scatter(&big, &mut block, sum).unwrap();
        assert_eq!(block, reference(Collective::ReduceScatter { op: sum }, n, &big, n), "rank {me}: reduce_scatter");
        let mut buf = big.clone();
        comm.reduce_scatter_in_place(&mut buf, sum).unwrap();
        assert_eq!(buf[me as usize * n..(me as usize + 1) * n], block[..], "rank {me}: reduce_scatter_in_place");

        let mut got = vec![0f32; n];
        comm.broadcast(&x, &mut got, Rank(1)).unwrap();
        assert_eq!(got, input(1, n), "rank {me}: broadcast");
        let mut buf = x.clone();
        comm.broadcast_in_place(&mut buf, Rank(2)).unwrap();
        assert_eq!(buf, input(2, n), "rank {me}: broadcast_in_place");

        let mut red = vec![0f32; n];
        comm.reduce(&x, &mut red, ReduceOp::Max, Rank(0)).unwrap();
        let mut buf = x.clone();
        comm.reduce_in_place(&mut buf, ReduceOp::Max, Rank(0)).unwrap();
        if me == 0 {
            let inputs: Vec<Vec<f32>> = (0..WORLD).map(|r| input(r, n)).collect();
            let want: Vec<f32> = (0..n).map(|i| inputs.iter().map(|v| v[i]).fold(f32::MIN, f32::max)).collect();
            assert_eq!(red, want, "reduce at the root");
            assert_eq!(buf, want, "reduce_in_place at the root");
        }

        let mut a2a = vec![0f32; p * n];
        comm.all_to_all(&big, &mut a2a).unwrap();
        assert_eq!(a2a, reference(Collective::AlltoAll, n, &big, p * n), "rank {me}: all_to_all");
        let mut buf = big.clone();
        comm.all_to_all_in_place(&mut buf).unwrap();
        assert_eq!(buf, a2a, "rank {me}: all_to_all_in_place");

        // Registered memory: both buffers registered (no copy), and mixed with plain memory.
        let mut rin = comm.alloc::<f32>(n).unwrap();
        rin.copy_from_slice(&x);
        let mut rout = comm.alloc::<f32>(n).unwrap();
        comm.all_reduce(&rin, &mut rout, sum).unwrap();
        assert_eq!(rout[..], out[..], "rank {me}: registered all_reduce");
        let mut plain = vec![0f32; n];
        comm.all_reduce(&rin, &mut plain, sum).unwrap();
        assert_eq!(plain, out, "rank {me}: registered input, plain output");
        comm.all_reduce_in_place(&mut rin, sum).unwrap();
        assert_eq!(rin[..], out[..], "rank {me}: registered in place");

        // Other element types: integers wrap, halves reduce in their own precision.
        let mut v = vec![u8::MAX; 1001];
        comm.all_reduce_in_place(&mut v, sum).unwrap();
        assert!(v.iter().all(|&b| b == u8::MAX.wrapping_mul(3)), "rank {me}: u8 wraps");
        let mut h = vec![r2ccl::f16::from_f32(0.5); 77];
        comm.all_reduce_in_place(&mut h, sum).unwrap();
        assert!(h.iter().all(|&x| x == r2ccl::f16::from_f32(1.5)), "rank {me}: f16");
    });
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn sizes_that_do_not_fit_are_refused_before_anything_is_sent() {
    let threads = common::spawn_ranks(WORLD, 5_000, |me, comm| {
        let refused = |r: Result<r2ccl::CollReport, CommError>| matches!(r, Err(CommError::Invalid(_)));
        assert!(refused(comm.all_reduce(&[1f32; 4], &mut [0f32; 5], ReduceOp::Sum)), "rank {me}");
        assert!(refused(comm.all_gather(&[1u32; 4], &mut [0u32; 4])), "rank {me}");
        assert!(refused(comm.reduce_scatter(&[1i64; 7], &mut [0i64; 2], ReduceOp::Sum)), "rank {me}");
        assert!(refused(comm.all_to_all(&[1u8; 4], &mut [0u8; 4])), "rank {me}: 4 is not 3 blocks");
        assert!(refused(comm.all_gather_in_place(&mut [0i32; 4])), "rank {me}");
        // Nothing was sent: the next collective is the communicator's first.
        let mut x = [me as i32];
        let report = comm.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
        assert_eq!((x, report.seq), ([3], 1), "rank {me}");
        comm.finalize().unwrap();
    });
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn calls_started_in_a_scope_overlap_and_all_finish() {
    let threads = common::spawn_ranks(WORLD, 5_000, |me, comm| {
        let n = 1 << 20;
        let (a, mut sums) = (vec![1.0f32; n], vec![0f32; n]);
        let mut flags = [me];
        let (mine, mut gathered) = ([u64::from(me)], vec![0u64; WORLD as usize]);
        let seqs = comm.scope(|s| {
            let first = s.all_reduce(&a, &mut sums, ReduceOp::Sum).unwrap();
            let second = s.all_reduce_in_place(&mut flags, ReduceOp::Max).unwrap();
            // Left for the scope to wait for.
            let _third = s.all_gather(&mine, &mut gathered).unwrap();
            let done_early = second.is_done();
            let (f, s2) = (first.wait().unwrap(), second.wait().unwrap());
            (f.seq, s2.seq, done_early)
        });
        assert_eq!((seqs.0, seqs.1), (1, 2), "rank {me}: calls run in the order they were started");
        assert!(sums.iter().all(|&x| x == 3.0) && flags == [2], "rank {me}");
        assert_eq!(gathered, vec![0, 1, 2], "rank {me}: the scope waited for the call left to it");
    });
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn a_call_whose_peers_never_come_ends_by_its_deadline() {
    let threads = common::spawn_ranks(2, 5_000, |me, comm| {
        if me == 1 {
            // Rank 1 comes late: rank 0's call must end by its own deadline, not wait for it.
            std::thread::sleep(Duration::from_millis(2_500));
            return None;
        }
        let started = Instant::now();
        let h = comm
            .start(
                Collective::AllReduce { op: ReduceOp::Sum },
                DType::U32,
                1,
                vec![0; 4],
                vec![0; 4],
                Duration::from_millis(400),
            )
            .unwrap();
        let err = h.wait().unwrap_err();
        Some((err, started.elapsed()))
    });
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let (err, took) = results[0].clone().unwrap();
    assert!(matches!(err, CommError::Timeout { seq: 1, .. }), "{err}");
    assert!(took >= Duration::from_millis(400) && took < Duration::from_millis(2_000), "took {took:?}");
}

#[test]
fn destroy_leaves_at_once_and_peers_get_a_clean_error() {
    let threads = common::spawn_ranks(2, 10_000, |me, comm| {
        let mut x = [1u32];
        comm.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
        if me == 0 {
            let t = Instant::now();
            comm.destroy();
            return Ok(t.elapsed());
        }
        std::thread::sleep(Duration::from_millis(200));
        let t = Instant::now();
        let err = comm.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap_err();
        Err((err, t.elapsed()))
    });
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let left = results[0].clone().unwrap();
    assert!(left < Duration::from_secs(1), "destroy took {left:?}");
    let (err, took) = results[1].clone().unwrap_err();
    assert!(matches!(err, CommError::PeerLost { rank: Rank(0), .. }), "{err}");
    assert!(took < Duration::from_secs(5), "the error took {took:?}");
}

#[test]
fn the_raw_entry_point_runs_out_of_place_and_in_place_on_caller_memory() {
    let threads = common::spawn_ranks(WORLD, 5_000, |me, comm| {
        let n = 50_001usize;
        let x = input(me, n);
        let mut out = vec![0f32; n];
        let mut want = vec![0f32; n];
        comm.all_reduce(&x, &mut want, ReduceOp::Sum).unwrap();
        let coll = Collective::AllReduce { op: ReduceOp::Sum };
        // SAFETY: `x` and `out` outlive the wait below and nothing else touches them meanwhile.
        let h = unsafe { comm.start_raw(coll, DType::F32, n as u64, x.as_ptr().cast(), out.as_mut_ptr().cast(), None) };
        let (rest, report) = h.unwrap().wait().unwrap();
        assert!(rest.is_empty() && out == want, "rank {me}: out of place (#{})", report.seq);
        let mut buf = x.clone();
        let p = buf.as_mut_ptr().cast::<u8>();
        // SAFETY: as above, one buffer for both (in place).
        let mut h = unsafe { comm.start_raw(coll, DType::F32, n as u64, p, p, Some(Duration::from_secs(30))) }.unwrap();
        while !h.is_done() {
            std::thread::yield_now();
        }
        h.wait().unwrap();
        assert_eq!(buf, want, "rank {me}: in place");
    });
    for t in threads {
        t.join().unwrap();
    }
}
