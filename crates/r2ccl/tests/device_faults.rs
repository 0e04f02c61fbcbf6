//! A NIC failure during device AllReduces (mock device, UCX on loopback, `R2CCL_FAULT`
//! software faults, three ranks as threads with two `lo` rails each): the failed NIC's
//! traffic migrates under the segments' host collectives and every result is exact.
#![allow(clippy::unwrap_used, reason = "a panic here is a test failure with a message")]

mod common;

use r2ccl::device::mock::{MockBuffer, MockDevice};
use r2ccl::device::Stream;
use r2ccl::{Collective, DType, ReduceOp};

const WORLD: u32 = 3;
const COUNT: usize = 1 << 20;

#[test]
fn a_nic_failure_during_device_all_reduces_keeps_every_result_exact() {
    // Set before any thread starts; only communicators built with fault injection read it.
    std::env::set_var("R2CCL_FAULT", "rank=1,nic=0,after_bytes=6M,kind=down");
    let mut config = common::config(5_000);
    // Slots of 1 MiB: each 4 MiB call runs in four segments.
    config.transport.device_staging_bytes = 4 << 20;
    let threads = common::spawn_ranks_faulted(WORLD, config, |me, comm| {
        let device = MockDevice::new(true);
        let stream = device.stream();
        let coll = Collective::AllReduce { op: ReduceOp::Sum };
        for round in 0..4u32 {
            let input: Vec<u8> = (0..COUNT as u32).flat_map(|i| ((i % 97 + me + round) as f32).to_le_bytes()).collect();
            let (send, recv) = (MockBuffer::from_bytes(&input), MockBuffer::zeroed(4 * COUNT));
            // SAFETY: both buffers outlive the stream's work (synchronized below).
            let h = unsafe {
                comm.start_device(&device, &stream, coll, DType::F32, COUNT as u64, send.addr(), recv.addr(), None)
            }
            .unwrap();
            let report = h.wait().unwrap();
            assert_eq!(report.segments, 4, "{report:?}");
            stream.synchronize().unwrap();
            let want: Vec<u8> =
                (0..COUNT as u32).flat_map(|i| ((3 * (i % 97 + round) + 3) as f32).to_le_bytes()).collect();
            assert!(recv.to_vec() == want, "rank {me} round {round}: wrong AllReduce result");
        }
        let failed = comm.failed_nics();
        comm.finalize().unwrap();
        failed
    });
    let failed: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(failed.iter().all(|f| f.len() == 1), "every rank agreed one NIC failed: {failed:?}");
}
