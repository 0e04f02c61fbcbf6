//! Device calls through the mock device (host memory standing in for a GPU, a stream that runs
//! its copies and flag operations on a thread of its own after random delays), over UCX on
//! loopback with three ranks as threads: every collective, in place and out of place, cut into
//! many segments by a small staging area, is bit-identical to the same collective on host
//! buffers; every dtype and op of AllReduce too; grouped send/recv; the blocking mode; a call
//! that fails leaves the stream usable.
#![allow(clippy::unwrap_used, reason = "a panic here is a test failure with a message")]

mod common;

use r2ccl::device::mock::{MockBuffer, MockDevice};
use r2ccl::device::{DeviceP2p, Stream};
use r2ccl::{bf16, f16, Collective, CommError, Communicator, DType, Rank, ReduceOp};
use std::time::{Duration, Instant};

const WORLD: u32 = 3;

/// 64 KiB of staging: slots of 16 KiB, so the calls below run in many segments.
fn config() -> r2ccl::Config {
    let mut c = common::config(5_000);
    c.transport.device_staging_bytes = 64 << 10;
    c
}

/// `n` elements of `dtype` for rank `me`: small integers (every reduction order gives the same
/// result), a NaN first for the float types.
fn values(dtype: DType, n: usize, me: u32) -> Vec<u8> {
    let v = |i: usize| ((i as u32 * 7 + me * 13) % 5 + 1) as f64;
    let nan = |i: usize| i == 0 && me == 1;
    (0..n)
        .flat_map(|i| -> Vec<u8> {
            let x = v(i);
            match dtype {
                DType::I8 => vec![x as i8 as u8],
                DType::U8 => vec![x as u8],
                DType::I32 => (x as i32).to_le_bytes().to_vec(),
                DType::U32 => (x as u32).to_le_bytes().to_vec(),
                DType::I64 => (x as i64).to_le_bytes().to_vec(),
                DType::U64 => (x as u64).to_le_bytes().to_vec(),
                DType::F16 => f16::from_f64(if nan(i) { f64::NAN } else { x }).to_le_bytes().to_vec(),
                DType::Bf16 => bf16::from_f64(if nan(i) { f64::NAN } else { x }).to_le_bytes().to_vec(),
                DType::F32 => (if nan(i) { f32::NAN } else { x as f32 }).to_le_bytes().to_vec(),
                DType::F64 => (if nan(i) { f64::NAN } else { x }).to_le_bytes().to_vec(),
            }
        })
        .collect()
}

/// Run `coll` on the device (out of place, or in place with NCCL's layout) and on the host;
/// return both outputs.
#[allow(clippy::too_many_arguments, reason = "a test helper")]
fn both(
    comm: &Communicator,
    device: &std::sync::Arc<MockDevice>,
    stream: &dyn Stream,
    coll: Collective,
    dtype: DType,
    count: u64,
    in_place: bool,
) -> (Vec<u8>, Vec<u8>) {
    let me = comm.rank().0;
    let e = dtype.size();
    let w = WORLD as usize;
    let (il, ol) = match coll {
        Collective::AllGather => (count as usize * e, w * count as usize * e),
        Collective::ReduceScatter { .. } => (w * count as usize * e, count as usize * e),
        Collective::AlltoAll => (w * count as usize * e, w * count as usize * e),
        _ => (count as usize * e, count as usize * e),
    };
    let input = values(dtype, il / e, me);
    let mut want = vec![0xAB; ol];
    let got = if in_place {
        let mut host = vec![0xAB; il.max(ol)];
        let at = if il < ol { me as usize * il } else { 0 };
        host[at..at + il].copy_from_slice(&input);
        let buf = MockBuffer::from_bytes(&host);
        comm.run_in_place(coll, dtype, count, &mut host).unwrap();
        // SAFETY: `buf` outlives the stream's work (synchronized below).
        let h = unsafe { comm.start_device(device, stream, coll, dtype, count, buf.addr(), buf.addr(), None) }.unwrap();
        h.wait().unwrap();
        stream.synchronize().unwrap();
        let at = if ol < il { me as usize * ol } else { 0 };
        want.copy_from_slice(&host[at..at + ol]);
        buf.to_vec()[at..at + ol].to_vec()
    } else {
        comm.run(coll, dtype, count, &input, &mut want).unwrap();
        let (send, recv) = (MockBuffer::from_bytes(&input), MockBuffer::from_bytes(&vec![0xAB; ol]));
        // SAFETY: as above.
        let h =
            unsafe { comm.start_device(device, stream, coll, dtype, count, send.addr(), recv.addr(), None) }.unwrap();
        let report = h.wait().unwrap();
        // A slot holds 16 KiB.
        let min_segments = if il.max(ol) > 16 << 10 { 2 } else { usize::from(count > 0) };
        assert!(report.segments >= min_segments, "{coll:?} of {count}: {report:?}");
        stream.synchronize().unwrap();
        assert_eq!(send.to_vec(), input, "rank {me}: {coll:?} left its device input alone");
        recv.to_vec()
    };
    if let Collective::Reduce { root, .. } = coll {
        if root.0 != me {
            // Only the root's output is defined.
            return (Vec::new(), Vec::new());
        }
    }
    (got, want)
}

#[test]
fn every_collective_on_device_buffers_matches_the_host_path_bit_for_bit() {
    let threads = common::spawn_ranks_with(WORLD, config(), |me, comm| {
        let device = MockDevice::new(true);
        let stream = device.stream();
        let sum = ReduceOp::Sum;
        let colls = [
            Collective::AllReduce { op: sum },
            Collective::AllReduce { op: ReduceOp::Max },
            Collective::ReduceScatter { op: sum },
            Collective::AllGather,
            Collective::Broadcast { root: Rank(1) },
            Collective::Reduce { op: sum, root: Rank(2) },
            Collective::AlltoAll,
        ];
        for coll in colls {
            for in_place in [false, true] {
                // 10,007 f32: 3 to 8 segments of a 16 KiB slot, the last one short.
                let (got, want) = both(&comm, &device, &stream, coll, DType::F32, 10_007, in_place);
                assert!(got == want, "rank {me}: {coll:?} in_place={in_place}: device and host results differ");
            }
        }
        for dtype in DType::ALL {
            for op in ReduceOp::ALL {
                let coll = Collective::AllReduce { op };
                let (got, want) = both(&comm, &device, &stream, coll, dtype, 9_001, false);
                assert!(got == want, "rank {me}: AllReduce {op:?} on {dtype:?}: device and host results differ");
            }
        }
        // An empty call enqueues nothing and finishes.
        let (got, want) = both(&comm, &device, &stream, Collective::AllReduce { op: sum }, DType::F32, 0, false);
        assert_eq!((got.len(), want.len()), (0, 0));
        comm.finalize().unwrap();
    });
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn grouped_send_recv_and_the_blocking_mode_on_device_buffers() {
    for memops in [true, false] {
        let threads = common::spawn_ranks_with(WORLD, config(), move |me, comm| {
            let device = MockDevice::new(memops);
            let stream = device.stream();
            // A ring exchange: send 1,000 u32 to the next rank, receive from the previous one.
            let next = Rank((me + 1) % WORLD);
            let prev = Rank((me + WORLD - 1) % WORLD);
            let data: Vec<u8> = (0..1000u32).flat_map(|i| (i * 10 + me).to_le_bytes()).collect();
            let send = MockBuffer::from_bytes(&data);
            let recv = MockBuffer::zeroed(4000);
            let ops = [
                DeviceP2p::Send { peer: next, addr: send.addr(), count: 1000 },
                DeviceP2p::Recv { peer: prev, addr: recv.addr(), count: 1000 },
            ];
            // SAFETY: both buffers outlive the stream's work (synchronized below).
            let h = unsafe { comm.start_device_group(&device, &stream, DType::U32, &ops, None) }.unwrap();
            h.wait().unwrap();
            stream.synchronize().unwrap();
            let want: Vec<u8> = (0..1000u32).flat_map(|i| (i * 10 + prev.0).to_le_bytes()).collect();
            assert!(recv.to_vec() == want, "rank {me}: memops={memops}: group receive");
            let (got, want) =
                both(&comm, &device, &stream, Collective::AllReduce { op: ReduceOp::Sum }, DType::F32, 10_007, false);
            assert!(got == want, "rank {me}: memops={memops}: AllReduce");
            // One device per communicator.
            let other = MockDevice::new(memops);
            // SAFETY: refused before it touches the buffers.
            let err = unsafe {
                comm.start_device(
                    &other,
                    &other.stream(),
                    Collective::AllGather,
                    DType::U8,
                    1,
                    send.addr(),
                    recv.addr(),
                    None,
                )
            }
            .unwrap_err();
            assert!(matches!(err, CommError::Invalid(_)), "{err}");
            comm.finalize().unwrap();
        });
        for t in threads {
            t.join().unwrap();
        }
    }
}

#[test]
fn a_device_call_that_fails_returns_a_bounded_error_and_leaves_the_stream_usable() {
    // Rank 1 never joins the device call; rank 0's times out, its stream runs past the call.
    let threads = common::spawn_ranks_with(2, config(), |me, comm| {
        if me == 1 {
            std::thread::sleep(Duration::from_secs(4));
            comm.destroy();
            return;
        }
        let device = MockDevice::new(true);
        let stream = device.stream();
        let (send, recv) = (MockBuffer::from_bytes(&[1u8; 40_000]), MockBuffer::zeroed(40_000));
        let started = Instant::now();
        let coll = Collective::AllReduce { op: ReduceOp::Sum };
        // SAFETY: both buffers outlive the stream's work (synchronized below).
        let h = unsafe {
            comm.start_device(
                &device,
                &stream,
                coll,
                DType::U8,
                40_000,
                send.addr(),
                recv.addr(),
                Some(Duration::from_secs(2)),
            )
        }
        .unwrap();
        let err = h.wait().unwrap_err();
        assert!(matches!(err, CommError::Timeout { .. } | CommError::Aborted(_)), "{err}");
        assert!(started.elapsed() < Duration::from_secs(20), "bounded: {:?}", started.elapsed());
        // The stream is not left waiting: it runs its own later work.
        let (after, sevens) = (MockBuffer::zeroed(4), [7u8; 4]);
        // SAFETY: both live until the synchronize below.
        unsafe { stream.copy_to_device(sevens.as_ptr(), after.addr(), 4) }.unwrap();
        stream.synchronize().unwrap();
        assert_eq!(after.to_vec(), vec![7u8; 4]);
        comm.destroy();
    });
    for t in threads {
        t.join().unwrap();
    }
}

/// The staging lane keeps the communicator shareable across threads, as bindings need it.
#[test]
fn a_communicator_with_device_staging_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Communicator>();
    check::<r2ccl::device::DeviceHandle>();
}

/// A driver that cannot page-lock the transport's regions: staging falls back to pinned memory
/// of its own (copied through the library's workspace), with the same exact results.
#[test]
fn staging_falls_back_to_its_own_pinned_memory_when_regions_cannot_be_pinned() {
    let threads = common::spawn_ranks_with(WORLD, config(), |me, comm| {
        let device = MockDevice::refusing_to_pin_regions(true);
        let stream = device.stream();
        for coll in [
            Collective::AllReduce { op: ReduceOp::Sum },
            Collective::AllGather,
            Collective::ReduceScatter { op: ReduceOp::Max },
        ] {
            for in_place in [false, true] {
                let (got, want) = both(&comm, &device, &stream, coll, DType::F32, 10_007, in_place);
                assert!(
                    got == want,
                    "rank {me}: {coll:?} in_place={in_place}: fallback staging differs from the host path"
                );
            }
        }
        let next = Rank((me + 1) % WORLD);
        let prev = Rank((me + WORLD - 1) % WORLD);
        let send = MockBuffer::from_bytes(&[me as u8; 3000]);
        let recv = MockBuffer::zeroed(3000);
        let ops = [
            DeviceP2p::Send { peer: next, addr: send.addr(), count: 3000 },
            DeviceP2p::Recv { peer: prev, addr: recv.addr(), count: 3000 },
        ];
        // SAFETY: both buffers outlive the stream's work (synchronized below).
        unsafe { comm.start_device_group(&device, &stream, DType::U8, &ops, None) }.unwrap().wait().unwrap();
        stream.synchronize().unwrap();
        assert_eq!(recv.to_vec(), vec![prev.0 as u8; 3000], "rank {me}: fallback group receive");
        comm.finalize().unwrap();
    });
    for t in threads {
        t.join().unwrap();
    }
}

/// Calls on two streams of one device, enqueued back to back before either runs: the
/// segments' hand-over counters stay in order and every result is exact.
#[test]
fn calls_on_two_streams_of_one_device_are_exact() {
    let threads = common::spawn_ranks_with(WORLD, config(), |me, comm| {
        let device = MockDevice::new(true);
        let (a, b) = (device.stream(), device.stream());
        let n = 10_007usize;
        let coll = Collective::AllReduce { op: ReduceOp::Sum };
        let mut bufs = Vec::new();
        let mut handles = Vec::new();
        for round in 0..6u32 {
            let input: Vec<u8> = (0..n as u32).flat_map(|i| ((i % 7 + me + round) as f32).to_le_bytes()).collect();
            let (send, recv) = (MockBuffer::from_bytes(&input), MockBuffer::zeroed(4 * n));
            let stream: &dyn Stream = if round % 2 == 0 { &a } else { &b };
            // SAFETY: the buffers are kept in `bufs` until both streams are synchronized.
            let h = unsafe {
                comm.start_device(&device, stream, coll, DType::F32, n as u64, send.addr(), recv.addr(), None)
            }
            .unwrap();
            handles.push(h);
            bufs.push((round, send, recv));
        }
        for h in handles {
            h.wait().unwrap();
        }
        a.synchronize().unwrap();
        b.synchronize().unwrap();
        for (round, _, recv) in &bufs {
            let want: Vec<u8> = (0..n as u32).flat_map(|i| ((3 * (i % 7 + round) + 3) as f32).to_le_bytes()).collect();
            assert!(recv.to_vec() == want, "rank {me} round {round}: wrong result");
        }
        comm.finalize().unwrap();
    });
    for t in threads {
        t.join().unwrap();
    }
}
