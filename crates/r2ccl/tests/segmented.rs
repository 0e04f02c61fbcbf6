//! Large calls on caller memory run in segments through two registered slots
//! (`transport.host_segment_bytes`, here its smallest, 64 KiB): three ranks as threads, each
//! its own node with two `lo` rails, run every collective in and out of place on buffers of
//! about 1.2 MB per block; results are bit-exact against the definition, the calls really were
//! cut (the sequence numbers jump by the segment count), and a call of two slots or less runs
//! whole. Non-blocking calls (`start`, `start_raw`, scopes) are cut too, and calls started
//! behind a cut one, large or small, run after it in the order they were made. Registered
//! calls are cut the same way, so ranks may mix registered and caller memory in one call.
#![allow(clippy::unwrap_used, reason = "a panic here is a test failure with a message")]

mod common;

use r2ccl::{Collective, DType, Rank, ReduceOp};

const WORLD: u32 = 3;
/// Elements per block: about 1.2 MB of f32, so every call is cut into many 64 KiB slots.
const N: usize = 300_007;

fn input(me: u32, n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i as u32).wrapping_mul(7).wrapping_add(me * 13) % 29) as f32).collect()
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn floats(b: &[u8]) -> Vec<f32> {
    b.chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn sum_of(n: usize, block: usize) -> Vec<f32> {
    let all: Vec<Vec<f32>> = (0..WORLD).map(|r| input(r, n * WORLD as usize)).collect();
    (0..n).map(|i| all.iter().map(|v| v[block * n + i]).sum()).collect()
}

#[test]
fn large_calls_run_in_segments_exactly() {
    let mut config = common::config(10_000);
    config.transport.host_segment_bytes = 64 << 10;
    let threads = common::spawn_ranks_with(WORLD, config, |me, comm| {
        let (p, n) = (WORLD as usize, N);
        let sum = ReduceOp::Sum;
        let f32s = DType::F32;
        let x = input(me, n);
        let big = input(me, p * n);
        let mut seqs = Vec::new();
        let mut out = vec![0u8; n * 4];

        // AllReduce out of place and in place.
        let r = comm.run(Collective::AllReduce { op: sum }, f32s, n as u64, &bytes(&x), &mut out).unwrap();
        seqs.push(r.seq);
        let xs: Vec<Vec<f32>> = (0..WORLD).map(|q| input(q, n)).collect();
        let want: Vec<f32> = (0..n).map(|i| xs.iter().map(|v| v[i]).sum()).collect();
        assert_eq!(floats(&out), want, "rank {me}: all_reduce");
        let mut buf = bytes(&x);
        let r = comm.run_in_place(Collective::AllReduce { op: sum }, f32s, n as u64, &mut buf).unwrap();
        seqs.push(r.seq);
        assert_eq!(floats(&buf), want, "rank {me}: all_reduce in place");

        // AllGather: every rank's input in rank order.
        let want: Vec<f32> = (0..WORLD).flat_map(|q| input(q, n)).collect();
        let mut all = vec![0u8; p * n * 4];
        comm.run(Collective::AllGather, f32s, n as u64, &bytes(&x), &mut all).unwrap();
        assert_eq!(floats(&all), want, "rank {me}: all_gather");
        let mut buf = vec![0u8; p * n * 4];
        buf[me as usize * n * 4..(me as usize + 1) * n * 4].copy_from_slice(&bytes(&x));
        comm.run_in_place(Collective::AllGather, f32s, n as u64, &mut buf).unwrap();
        assert_eq!(floats(&buf), want, "rank {me}: all_gather in place");

        // ReduceScatter: block `me` of the sum of every rank's `big`.
        let want = sum_of(n, me as usize);
        comm.run(Collective::ReduceScatter { op: sum }, f32s, n as u64, &bytes(&big), &mut out).unwrap();
        assert_eq!(floats(&out), want, "rank {me}: reduce_scatter");
        let mut buf = bytes(&big);
        comm.run_in_place(Collective::ReduceScatter { op: sum }, f32s, n as u64, &mut buf).unwrap();
        assert_eq!(
            floats(&buf[me as usize * n * 4..(me as usize + 1) * n * 4]),
            want,
            "rank {me}: reduce_scatter in place"
        );

        // Broadcast from rank 1, Reduce to rank 2 (max).
        comm.run(Collective::Broadcast { root: Rank(1) }, f32s, n as u64, &bytes(&x), &mut out).unwrap();
        assert_eq!(floats(&out), input(1, n), "rank {me}: broadcast");
        let max = ReduceOp::Max;
        comm.run(Collective::Reduce { op: max, root: Rank(2) }, f32s, n as u64, &bytes(&x), &mut out).unwrap();
        if me == 2 {
            let want: Vec<f32> = (0..n).map(|i| xs.iter().map(|v| v[i]).fold(0.0, f32::max)).collect();
            assert_eq!(floats(&out), want, "rank {me}: reduce at the root");
        }

        // AlltoAll: block q of the output is block `me` of rank q's input.
        let want: Vec<f32> =
            (0..WORLD).flat_map(|q| input(q, p * n)[me as usize * n..(me as usize + 1) * n].to_vec()).collect();
        let mut all = vec![0u8; p * n * 4];
        comm.run(Collective::AlltoAll, f32s, n as u64, &bytes(&big), &mut all).unwrap();
        assert_eq!(floats(&all), want, "rank {me}: alltoall");

        // Two slots or less: one collective.
        let small = vec![1f32; 2 * (64 << 10) / 4];
        let mut got = vec![0u8; small.len() * 4];
        let a =
            comm.run(Collective::AllReduce { op: sum }, f32s, small.len() as u64, &bytes(&small), &mut got).unwrap();
        let b =
            comm.run(Collective::AllReduce { op: sum }, f32s, small.len() as u64, &bytes(&small), &mut got).unwrap();
        assert_eq!(b.seq, a.seq + 1, "rank {me}: a call of two slots runs whole");
        assert!(floats(&got).iter().all(|&v| v == WORLD as f32));
        seqs
    });
    for t in threads {
        let seqs = t.join().unwrap();
        // 1.2 MB in 64 KiB slots: at least 18 segments for the first AllReduce.
        assert!(seqs[1] - seqs[0] >= 18, "the AllReduce was cut into segments: sequence numbers {seqs:?}");
    }
}

#[test]
fn non_blocking_calls_are_cut_and_keep_their_order() {
    let mut config = common::config(10_000);
    config.transport.host_segment_bytes = 64 << 10;
    let threads = common::spawn_ranks_with(WORLD, config, |me, comm| {
        let n = N;
        let sum = ReduceOp::Sum;
        let f32s = DType::F32;
        let ar = Collective::AllReduce { op: sum };
        let xs: Vec<Vec<f32>> = (0..WORLD).map(|q| input(q, n)).collect();
        let want: Vec<f32> = (0..n).map(|i| xs.iter().map(|v| v[i]).sum()).collect();
        let x = bytes(&input(me, n));

        // start_raw (the torch backend's call): a cut AllReduce, then a small one and a cut
        // Broadcast in place behind it, then an owned `start`; all waited for at the end.
        let mut out = vec![0u8; n * 4];
        let small_in = bytes(&[me as f32 + 1.0; 5]);
        let mut small_out = vec![0u8; 20];
        let mut bcast = if me == 0 { bytes(&input(7, n)) } else { vec![0u8; n * 4] };
        let tmo = Some(std::time::Duration::from_secs(60));
        // SAFETY: every buffer outlives the waits below and nothing else touches it meanwhile.
        let (a, b, c) = unsafe {
            (
                comm.start_raw(ar, f32s, n as u64, x.as_ptr(), out.as_mut_ptr(), tmo).unwrap(),
                comm.start_raw(ar, f32s, 5, small_in.as_ptr(), small_out.as_mut_ptr(), tmo).unwrap(),
                comm.start_raw(
                    Collective::Broadcast { root: Rank(0) },
                    f32s,
                    n as u64,
                    bcast.as_ptr(),
                    bcast.as_mut_ptr(),
                    tmo,
                )
                .unwrap(),
            )
        };
        let d =
            comm.start(ar, f32s, n as u64, x.clone(), vec![0u8; n * 4], std::time::Duration::from_secs(60)).unwrap();
        let (_, ra) = a.wait().unwrap();
        let (_, rb) = b.wait().unwrap();
        let (_, rc) = c.wait().unwrap();
        let (owned, rd) = d.wait().unwrap();
        assert_eq!(floats(&out), want, "rank {me}: start_raw all_reduce");
        assert_eq!(floats(&small_out), vec![6.0; 5], "rank {me}: the small call behind it");
        assert_eq!(floats(&bcast), input(7, n), "rank {me}: start_raw broadcast in place");
        assert_eq!(floats(&owned), want, "rank {me}: start (owned) all_reduce");
        // In order: the small call right after the first cut call's segments, the Broadcast's
        // segments after it, the owned call's after those.
        assert!(ra.seq >= 18, "rank {me}: the first call was cut: {ra:?}");
        assert_eq!(rb.seq, ra.seq + 1, "rank {me}: the small call ran right after the cut one");
        assert!(rc.seq >= rb.seq + 18 && rd.seq >= rc.seq + 18, "rank {me}: {rb:?} {rc:?} {rd:?}");

        // A scope: a cut AllReduce and a cut AllGather pending at once.
        let mut s_out = vec![0f32; n];
        let mut gathered = vec![0f32; WORLD as usize * n];
        let mine = input(me, n);
        comm.scope(|s| {
            let p = s.all_reduce(&mine[..], &mut s_out[..], sum).unwrap();
            let q = s.all_gather(&mine[..], &mut gathered[..]).unwrap();
            p.wait().unwrap();
            q.wait().unwrap();
        });
        assert_eq!(s_out, want, "rank {me}: scope all_reduce");
        assert_eq!(gathered, xs.concat(), "rank {me}: scope all_gather");
    });
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn a_cut_call_a_peer_never_joins_fails_by_its_deadline() {
    let mut config = common::config(10_000);
    config.transport.host_segment_bytes = 64 << 10;
    let threads = common::spawn_ranks_with(2, config, |me, comm| {
        if me == 1 {
            // Never joins; leaves once rank 0 has given up.
            std::thread::sleep(std::time::Duration::from_secs(4));
            return None;
        }
        let x = bytes(&input(me, N));
        let mut out = vec![0u8; N * 4];
        let t = std::time::Instant::now();
        // SAFETY: both buffers outlive the wait, and nothing else touches them meanwhile.
        let h = unsafe {
            comm.start_raw(
                Collective::AllReduce { op: ReduceOp::Sum },
                DType::F32,
                N as u64,
                x.as_ptr(),
                out.as_mut_ptr(),
                Some(std::time::Duration::from_secs(1)),
            )
        }
        .unwrap();
        let err = h.wait().unwrap_err();
        Some((t.elapsed(), err))
    });
    let mut results = threads.into_iter().map(|t| t.join().unwrap());
    let (took, err) = results.next().flatten().unwrap();
    assert!(took < std::time::Duration::from_secs(8), "answered by its deadline plus the margin: {took:?}");
    assert!(matches!(err, r2ccl::CommError::Timeout { .. } | r2ccl::CommError::Aborted(_)), "a bounded error: {err}");
}

#[test]
fn registered_calls_run_in_segments_one_block_ones_in_place() {
    let mut config = common::config(10_000);
    config.transport.host_segment_bytes = 64 << 10;
    let threads = common::spawn_ranks_with(WORLD, config, |me, comm| {
        let n = N;
        let f32s = DType::F32;
        let xs: Vec<Vec<f32>> = (0..WORLD).map(|q| input(q, n)).collect();
        let want: Vec<f32> = (0..n).map(|i| xs.iter().map(|v| v[i]).sum()).collect();
        let mut inp = comm.alloc::<f32>(n).unwrap();
        inp.copy_from_slice(&input(me, n));
        let mut out = comm.alloc::<f32>(n).unwrap();
        // Out of place, then in place: both cut (128 KiB segments of a 1.2 MB call).
        let ar = Collective::AllReduce { op: ReduceOp::Sum };
        let a = comm.run_registered(ar, f32s, n as u64, &inp, &mut out).unwrap();
        assert_eq!(&out[..], &want[..], "rank {me}: registered all_reduce");
        let b = comm.run_registered_in_place(ar, f32s, n as u64, &mut inp).unwrap();
        assert_eq!(&inp[..], &want[..], "rank {me}: registered all_reduce in place");
        assert!(b.seq >= a.seq + 9, "rank {me}: the in-place call was cut: {a:?} {b:?}");
        // Broadcast from rank 2 and Reduce (max) to rank 1, in place.
        let mut buf = comm.alloc::<f32>(n).unwrap();
        buf.copy_from_slice(&input(me, n));
        comm.run_registered_in_place(Collective::Broadcast { root: Rank(2) }, f32s, n as u64, &mut buf).unwrap();
        assert_eq!(&buf[..], &input(2, n)[..], "rank {me}: registered broadcast");
        buf.copy_from_slice(&input(me, n));
        let max = Collective::Reduce { op: ReduceOp::Max, root: Rank(1) };
        let c = comm.run_registered_in_place(max, f32s, n as u64, &mut buf).unwrap();
        if me == 1 {
            let want: Vec<f32> = (0..n).map(|i| xs.iter().map(|v| v[i]).fold(0.0, f32::max)).collect();
            assert_eq!(&buf[..], &want[..], "rank {me}: registered reduce at the root");
        }
        // A registered AllGather runs whole (its workspace does not grow with the call); a
        // registered ReduceScatter goes through the slots (whole, its scratch would).
        let mut all = comm.alloc::<f32>(WORLD as usize * n).unwrap();
        let d = comm.run_registered(Collective::AllGather, f32s, n as u64, &inp, &mut all).unwrap();
        assert_eq!(d.seq, c.seq + 1, "rank {me}: a registered AllGather runs whole: {c:?} {d:?}");
        assert_eq!(&all[me as usize * n..(me as usize + 1) * n], &want[..]);
        let mut big = comm.alloc::<f32>(WORLD as usize * n).unwrap();
        big.copy_from_slice(&input(me, WORLD as usize * n));
        let rs = Collective::ReduceScatter { op: ReduceOp::Sum };
        let e = comm.run_registered_in_place(rs, f32s, n as u64, &mut big).unwrap();
        assert!(e.seq >= d.seq + 18, "rank {me}: a registered ReduceScatter is cut: {d:?} {e:?}");
        let mine = me as usize * n..(me as usize + 1) * n;
        assert_eq!(&big[mine], &sum_of(n, me as usize)[..], "rank {me}: registered reduce_scatter in place");
    });
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn ranks_may_mix_registered_and_caller_memory_in_one_call() {
    let mut config = common::config(10_000);
    config.transport.host_segment_bytes = 64 << 10;
    let threads = common::spawn_ranks_with(WORLD, config, |me, comm| {
        let (p, n) = (WORLD as usize, N);
        let f32s = DType::F32;
        let sum = ReduceOp::Sum;
        let xs: Vec<Vec<f32>> = (0..WORLD).map(|q| input(q, n)).collect();
        let total: Vec<f32> = (0..n).map(|i| xs.iter().map(|v| v[i]).sum()).collect();
        // Rank 0 runs every call on registered buffers, the others on their own memory.
        let run = |coll: Collective, count: usize, x: &[f32], out_len: usize| {
            if me == 0 {
                let mut inp = comm.alloc::<f32>(x.len()).unwrap();
                inp.copy_from_slice(x);
                let mut out = comm.alloc::<f32>(out_len).unwrap();
                comm.run_registered(coll, f32s, count as u64, &inp, &mut out).map(|_| out.to_vec())
            } else {
                let mut out = vec![0u8; out_len * 4];
                comm.run(coll, f32s, count as u64, &bytes(x), &mut out).map(|_| floats(&out))
            }
        };
        // Cut on every rank (1.2 MB calls, 64 KiB slots).
        let x = input(me, n);
        assert_eq!(run(Collective::AllReduce { op: sum }, n, &x, n).unwrap(), total, "rank {me}: all_reduce");
        let b = run(Collective::Broadcast { root: Rank(1) }, n, &x, n).unwrap();
        assert_eq!(b, input(1, n), "rank {me}: broadcast");
        let big = input(me, p * n);
        let rs = run(Collective::ReduceScatter { op: sum }, n, &big, n).unwrap();
        assert_eq!(rs, sum_of(n, me as usize), "rank {me}: reduce_scatter");
        let buf = if me == 0 {
            let mut reg = comm.alloc::<f32>(n).unwrap();
            reg.copy_from_slice(&x);
            comm.run_registered_in_place(Collective::AllReduce { op: sum }, f32s, n as u64, &mut reg).unwrap();
            reg.to_vec()
        } else {
            let mut raw = bytes(&x);
            comm.run_in_place(Collective::AllReduce { op: sum }, f32s, n as u64, &mut raw).unwrap();
            floats(&raw)
        };
        assert_eq!(buf, total, "rank {me}: all_reduce in place");
        // AllGather and AlltoAll of at most two slots run whole either way.
        let m = 10_000;
        let gathered: Vec<f32> = (0..WORLD).flat_map(|q| input(q, m)).collect();
        assert_eq!(run(Collective::AllGather, m, &input(me, m), p * m).unwrap(), gathered, "rank {me}: all_gather");
        let a2a = run(Collective::AlltoAll, m, &input(me, p * m), p * m).unwrap();
        let mine = me as usize * m..(me as usize + 1) * m;
        let want: Vec<f32> = (0..WORLD).flat_map(|q| input(q, p * m)[mine.clone()].to_vec()).collect();
        assert_eq!(a2a, want, "rank {me}: all_to_all");
        // Larger, a registered AllGather runs whole and a cut one does not match it: a clear
        // error on every rank, naming the counts, not a hang.
        let err = run(Collective::AllGather, n, &x, p * n).unwrap_err();
        assert!(matches!(err, r2ccl::CommError::Mismatch { .. }), "rank {me}: {err}");
    });
    for t in threads {
        t.join().unwrap();
    }
}
