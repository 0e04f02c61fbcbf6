//! A NIC failure during large blocking calls that run in segments (`transport.host_segment_bytes`
//! of 1 MiB, so each 4 MiB-per-rank AllReduce is four collectives; UCX on loopback, `R2CCL_FAULT`
//! software faults, three ranks as threads with two `lo` rails each): the failed NIC's traffic
//! migrates under a segment, later segments plan around it, and every result is exact.
#![allow(clippy::unwrap_used, reason = "a panic here is a test failure with a message")]

mod common;

use r2ccl::{Collective, DType, ReduceOp};

const WORLD: u32 = 3;
const COUNT: usize = 1 << 20;

#[test]
fn a_nic_failure_during_segmented_all_reduces_keeps_every_result_exact() {
    // Set before any thread starts; only communicators built with fault injection read it.
    std::env::set_var("R2CCL_FAULT", "rank=1,nic=0,after_bytes=6M,kind=down");
    let mut config = common::config(5_000);
    config.transport.host_segment_bytes = 1 << 20;
    let threads = common::spawn_ranks_faulted(WORLD, config, |me, comm| {
        let coll = Collective::AllReduce { op: ReduceOp::Sum };
        let mut seq = 0;
        for round in 0..4u32 {
            let input: Vec<u8> = (0..COUNT as u32).flat_map(|i| ((i % 97 + me + round) as f32).to_le_bytes()).collect();
            let mut out = vec![0u8; 4 * COUNT];
            let report = comm.run(coll, DType::F32, COUNT as u64, &input, &mut out).unwrap();
            assert_eq!(report.seq, seq + 4, "rank {me} round {round}: four segments");
            seq = report.seq;
            let want: Vec<u8> =
                (0..COUNT as u32).flat_map(|i| ((3 * (i % 97 + round) + 3) as f32).to_le_bytes()).collect();
            assert!(out == want, "rank {me} round {round}: wrong AllReduce result");
        }
        let failed = comm.failed_nics();
        comm.finalize().unwrap();
        failed
    });
    let failed: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(failed.iter().all(|f| f.len() == 1), "every rank agreed one NIC failed: {failed:?}");
}
