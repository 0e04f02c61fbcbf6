//! The control plane's cost per fault-free collective, counted by the library
//! (`Communicator::oob_messages_sent`, exported as `r2ccl_oob_messages_total`): four ranks as
//! threads of this process, each its own node with two `lo` rails, run 8-byte and 1 MiB
//! AllReduces with nothing failing. The test pins today's protocol (no health view at all: the
//! switch protocol runs only when a view changes; no argument description unless a collective
//! runs for 100 ms, the arguments' digest travels in the chunk headers; no receipt for small
//! collectives back to back, whose next chunks imply them; nothing on the abort channel) and
//! prints the receipts on the detect channel, so a change to the control plane shows here as
//! numbers.
#![allow(clippy::unwrap_used, clippy::print_stderr, reason = "a panic or a printed figure is the report")]

mod common;

use r2ccl::ReduceOp;

const WORLD: u32 = 4;

fn counts(comm: &r2ccl::Communicator) -> std::collections::BTreeMap<&'static str, u64> {
    comm.oob_messages_sent().into_iter().collect()
}

#[test]
fn fault_free_collectives_send_a_counted_number_of_oob_messages() {
    let threads = common::spawn_ranks(WORLD, 10_000, |me, comm| {
        let mut per_size = Vec::new();
        for elems in [2usize, 256 * 1024] {
            let x = vec![1f32; elems];
            let mut out = vec![0f32; elems];
            // Warm up: the first call pays for connections and plans.
            comm.all_reduce(&x, &mut out, ReduceOp::Sum).unwrap();
            let before = counts(&comm);
            let n = 20u64;
            for _ in 0..n {
                comm.all_reduce(&x, &mut out, ReduceOp::Sum).unwrap();
                assert!(out.iter().all(|&v| v == WORLD as f32), "rank {me}: exact result");
            }
            let after = counts(&comm);
            let per = |c: &str| (after[c] - before[c]) as f64 / n as f64;
            per_size.push((elems * 4, per("agree"), per("control"), per("detect"), per("abort")));
        }
        per_size
    });
    for (me, t) in threads.into_iter().enumerate() {
        for (bytes, agree, control, detect, abort) in t.join().unwrap() {
            eprintln!(
                "rank {me}: {bytes} B AllReduce: OOB messages per collective: agree {agree:.2}, control {control:.2}, detect (receipts) {detect:.2}, abort {abort:.2}"
            );
            assert_eq!(agree, 0.0, "no health view while nothing changes");
            // An 8-byte collective takes far less than 100 ms, but a debug build of four ranks on
            // two loaded cores may take longer now and then: at most 5 of the 20.
            let most = if bytes < 1024 { 0.25 } else { 1.0 };
            assert!(control <= most, "argument descriptions only from collectives that ran 100 ms: {control}");
            assert_eq!(abort, 0.0, "nothing on the abort channel while nothing fails");
            if bytes < 1024 {
                // Recursive doubling: the next collective's chunks imply the receipts of the last
                // (engine/linger.rs); only the last one's, or one after a stall of the 10 ms the
                // receivers hold them back (a loaded debug build), go out.
                assert!(detect <= 0.5, "receipts of back-to-back 8 B AllReduces are implied: {detect}");
            }
        }
    }
}
