//! Two NIC failures on different nodes at once (the same rail: the fabric is rail-only) (UCX on loopback, `R2CCL_FAULT` software faults,
//! three ranks as threads, each its own node with two `lo` rails): every result stays exact,
//! every collective is planned with the same health epoch and schedule on every rank, every rank
//! ends with both NICs failed, and the health switch costs a few rounds of messages, not a
//! message per rank and collective.
#![allow(clippy::unwrap_used, clippy::print_stderr, reason = "a panic or a printed figure is the report")]

mod common;

use r2ccl::{Collective, DType, ReduceOp};

const WORLD: u32 = 3;
const COUNT: usize = 1 << 18;
const CALLS: u32 = 16;

#[test]
fn two_concurrent_nic_failures_on_two_nodes_give_one_plan_on_every_rank() {
    // Set before any thread starts; only communicators built with fault injection read it.
    std::env::set_var("R2CCL_FAULT", "rank=1,nic=0,after_bytes=3M,kind=down; rank=2,nic=0,after_bytes=3M,kind=down");
    let threads = common::spawn_ranks_faulted(WORLD, common::config(5_000), |me, comm| {
        let coll = Collective::AllReduce { op: ReduceOp::Sum };
        let mut plans = Vec::new();
        for call in 0..CALLS {
            let input: Vec<u8> = (0..COUNT as u32).flat_map(|i| ((i % 89 + me + call) as f32).to_le_bytes()).collect();
            let mut out = vec![0u8; 4 * COUNT];
            let report = comm.run(coll, DType::F32, COUNT as u64, &input, &mut out).unwrap();
            let want: Vec<u8> =
                (0..COUNT as u32).flat_map(|i| ((3 * (i % 89 + call) + 3) as f32).to_le_bytes()).collect();
            assert!(out == want, "rank {me} call {call}: wrong AllReduce result");
            plans.push((report.seq, report.epoch, format!("{:?}", report.strategy)));
        }
        let failed = comm.failed_nics();
        let agree = comm.oob_messages_sent().into_iter().find(|(c, _)| *c == "agree").map_or(0, |(_, n)| n);
        comm.finalize().unwrap();
        (plans, failed, agree)
    });
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    for (me, (_, failed, agree)) in results.iter().enumerate() {
        eprintln!("rank {me}: failed NICs {failed:?}, health-switch messages sent {agree}");
        assert_eq!(failed.len(), 2, "rank {me} ends with both failed NICs: {failed:?}");
    }
    for call in 0..CALLS as usize {
        let plans: Vec<_> = results.iter().map(|(p, _, _)| &p[call]).collect();
        assert!(plans.windows(2).all(|w| w[0] == w[1]), "call {call}: one plan on every rank: {plans:?}");
    }
    let epochs: Vec<u64> = results[0].0.iter().map(|(_, e, _)| *e).collect();
    assert!(epochs.last() > epochs.first(), "the plans changed with the failures: {epochs:?}");
    // A round costs at most 3 (world - 1) messages in all; at most six rounds (each failure is
    // seen by both ends of its paths, perhaps at different instants; four in the runs seen),
    // against the world (world - 1) views per collective (96 here) a per-collective agreement sent.
    let total: u64 = results.iter().map(|(_, _, a)| a).sum();
    assert!(total <= 3 * u64::from(WORLD - 1) * 6, "{total} health-switch messages in {CALLS} collectives");
}
