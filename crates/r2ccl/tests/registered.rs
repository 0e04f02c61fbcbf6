//! Collectives on memory registered with the communicator (`Communicator::alloc`) over UCX on
//! loopback (three ranks as threads of this process, each its own node with two `lo` rails):
//! read and written where they are, in place and out of place, every collective bit-exact and
//! the same as on the caller's own buffers; a buffer too small is a clean error.
#![allow(clippy::unwrap_used, reason = "a panic here is a test failure with a message")]

mod common;

use r2ccl::{Collective, CommError, DType, Rank, ReduceOp};

const WORLD: u32 = 3;

/// Rank `me`'s input of `len` bytes (small integers as f32: every order gives the same sum).
fn input(me: u32, len: usize) -> Vec<u8> {
    (0..len / 4).flat_map(|i| (((i as u32 * 7 + me * 13) % 29) as f32).to_le_bytes()).collect()
}

#[test]
fn collectives_on_registered_buffers_match_those_on_the_callers_buffers() {
    let threads = common::spawn_ranks(WORLD, 5_000, |me, comm| {
        let w = WORLD as usize;
        let count = 300_001u64;
        let sum = ReduceOp::Sum;
        // (collective, element count, input bytes, output bytes)
        let cases = [
            (Collective::AllReduce { op: sum }, count, 4 * count as usize, 4 * count as usize),
            (Collective::AllGather, count, 4 * count as usize, 4 * w * count as usize),
            (Collective::ReduceScatter { op: sum }, count, 4 * w * count as usize, 4 * count as usize),
            (Collective::Broadcast { root: Rank(1) }, count, 4 * count as usize, 4 * count as usize),
        ];
        for (coll, n, il, ol) in cases {
            let data = input(me, il);
            let mut want = vec![0u8; ol];
            comm.run(coll, DType::F32, n, &data, &mut want).unwrap();
            // Out of place.
            let mut inb = comm.alloc::<u8>(il).unwrap();
            inb.copy_from_slice(&data);
            let mut outb = comm.alloc::<u8>(ol).unwrap();
            comm.run_registered(coll, DType::F32, n, &inb, &mut outb).unwrap();
            assert!(outb[..] == want[..], "rank {me}: {coll:?} out of place");
            assert!(inb[..] == data[..], "rank {me}: {coll:?} left its input alone");
            // In place, twice on the same buffer (the second run starts from the reset bytes).
            let mut buf = comm.alloc::<u8>(il.max(ol)).unwrap();
            for _ in 0..2 {
                let at = if il < ol { me as usize * il } else { 0 };
                buf[at..at + il].copy_from_slice(&data);
                comm.run_registered_in_place(coll, DType::F32, n, &mut buf).unwrap();
                let at = if ol < il { me as usize * ol } else { 0 };
                assert!(buf[at..at + ol] == want[..], "rank {me}: {coll:?} in place");
            }
        }
        // Too small a buffer is an error before anything moves, and the communicator goes on.
        let mut small = comm.alloc::<u8>(16).unwrap();
        let err = comm.run_registered_in_place(Collective::AllReduce { op: sum }, DType::F32, 8, &mut small);
        assert!(matches!(err, Err(CommError::Invalid(_))), "rank {me}: {err:?}");
        let data = input(me, 4096);
        let mut buf = comm.alloc::<u8>(4096).unwrap();
        buf.copy_from_slice(&data);
        comm.run_registered_in_place(Collective::AllReduce { op: sum }, DType::F32, 1024, &mut buf).unwrap();
        let mut want = vec![0u8; 4096];
        comm.run(Collective::AllReduce { op: sum }, DType::F32, 1024, &data, &mut want).unwrap();
        assert!(buf[..] == want[..], "rank {me}: after the refused call");
    });
    for t in threads {
        t.join().unwrap();
    }
}
