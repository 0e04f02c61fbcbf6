//! A burst of a peer's chunks that arrive before any receive for them is posted (a four-stage
//! schedule's joiner sends its whole scatter-in at once) is handed to the session by the sweep of
//! UCX's unexpected queue, every message of it, however many wait: none is dropped.
//!
//! The sweep takes such messages as unsolicited receives and keeps at most 64 of them in flight.
//! It used to drop what waited beyond that ("under attack only"), but a peer's rendezvous chunks
//! each stay in flight until their data comes, so a burst of them lost chunks that no receiver
//! asked for again: on the 4 x 2 testbed a four-stage AllReduce after a NIC failure hung until a
//! path failed (`cargo xtask bench --part strategies`). Without the fix this test fails with
//! "the sweep dropped 136 of a peer's messages".
#![allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]

use r2ccl_core::{NicId, NodeId, Rank};
use r2ccl_transport::{CompletionKind, PathId, Transport, TransportEvent};
use r2ccl_ucx::{Context, ContextConfig, UcxTransport, UcxTransportConfig, Worker};
use std::time::{Duration, Instant};

/// Messages in the burst: well over the 64 unsolicited receives the sweep keeps in flight.
const BURST: usize = 200;

#[test]
fn a_burst_of_a_peers_waiting_chunks_is_handed_over_whole_not_dropped() {
    let open = |rank: u32| {
        let mut cfg = UcxTransportConfig::tcp(Rank(rank), NodeId(rank), &["lo"]);
        cfg.link_monitor = false;
        UcxTransport::open(cfg).unwrap()
    };
    let (mut a, mut b) = (open(0), open(1));
    let blobs = vec![a.local_address_blob().unwrap(), b.local_address_blob().unwrap()];
    a.connect_peers(&blobs).unwrap();
    b.connect_peers(&blobs).unwrap();
    let (_, addrs) = r2ccl_ucx::parse_address_blob(&blobs[1]).unwrap();
    // Rank 0's rail 0 as far as tags go (rank 0 stays quiet); its chunks go as rendezvous (over 8 KiB), so each
    // unsolicited receive of one stays in flight until the sender answers.
    let mut sender_cfg = ContextConfig::tcp("lo");
    sender_cfg.extra.push(("RNDV_THRESH".into(), "8k".into()));
    let sender = Worker::new(Context::new(sender_cfg).unwrap()).unwrap();
    let ep = sender.connect(&addrs[0], "peer").unwrap();
    let data_tag = 0u64; // rank 0, rail 0
                         // First the connection: one message through, both sides progressing.
    let t0 = Instant::now();
    let mut first = ep.tag_send(data_tag, vec![0xA5; 48 << 10]).unwrap();
    let mut connected = false;
    while !connected || !first.is_done() {
        assert!(t0.elapsed() < Duration::from_secs(10), "the first message did not arrive");
        sender.progress();
        b.progress(t0.elapsed());
        while let Some(ev) = b.poll_event() {
            connected |= matches!(ev, TransportEvent::Unsolicited { .. });
        }
    }
    let mut sends: Vec<_> = (0..BURST).map(|i| ep.tag_send(data_tag, vec![i as u8; 48 << 10]).unwrap()).collect();
    // The sender announces the whole burst while the receiver looks at nothing.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(300) {
        sender.progress();
    }
    // The receiver alone: its worker reads the announcements, and its sweeps (every 10 ms) take
    // what waits while nothing the sender would answer can arrive.
    while t0.elapsed() < Duration::from_millis(500) {
        b.progress(t0.elapsed());
    }
    let from_a = PathId::new(NicId::new(1, 0), Rank(0), NicId::new(0, 0));
    let mut got = 0usize;
    while got < BURST && t0.elapsed() < Duration::from_secs(30) {
        sender.progress();
        b.progress(t0.elapsed());
        sends.retain_mut(|s| !s.is_done());
        while let Some(ev) = b.poll_event() {
            match ev {
                TransportEvent::Unsolicited { path, kind } => {
                    assert_eq!(path, from_a, "every message claims rank 0 on rail 0");
                    assert!(matches!(&kind, CompletionKind::Received(v) if v.len() == 48 << 10), "{kind:?}");
                    got += 1;
                }
                TransportEvent::PathError { path, fault } => panic!("path {path} failed: {fault:?}"),
                _ => {}
            }
        }
    }
    let stats = b.sweep_stats();
    assert_eq!(stats.dropped, 0, "the sweep dropped {} of a peer's messages: {stats:?}", stats.dropped);
    assert_eq!(got, BURST, "messages handed over: {stats:?}");
    assert_eq!(stats.unsolicited, BURST as u64 + 1, "{stats:?}");
    drop(ep);
    drop(a);
}
