//! A header receive posted while a stranger's oversized message under its data tag is already
//! waiting in UCX's unexpected queue fails, truncated (UCX 1.22 reports it when the receive
//! completes; a post that fails at once is handled the same way, `UcxTransport::launch`). Either
//! way it is reported as an empty receipt, which the session counts as malformed and posts again,
//! never as a path failure.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]

use r2ccl_core::{NicId, NodeId, Rank};
use r2ccl_transport::{CompletionKind, PathId, Transport, TransportEvent, HEADER_LEN};
use r2ccl_ucx::{Context, ContextConfig, UcxTransport, UcxTransportConfig, Worker};
use std::time::{Duration, Instant};

fn open(rank: u32) -> UcxTransport {
    let mut cfg = UcxTransportConfig::tcp(Rank(rank), NodeId(rank), &["lo"]);
    cfg.link_monitor = false;
    UcxTransport::open(cfg).unwrap()
}

#[test]
fn a_header_receive_matching_a_waiting_oversized_message_is_an_empty_receipt_not_a_path_failure() {
    let (mut a, mut b) = (open(0), open(1));
    let blobs = vec![a.local_address_blob().unwrap(), b.local_address_blob().unwrap()];
    a.connect_peers(&blobs).unwrap();
    b.connect_peers(&blobs).unwrap();
    // A stranger connects to rank 1's listener and sends, claiming to be rank 0 on rail 0, messages
    // larger than any header receive, before rank 1 has posted one.
    let (_, addrs) = r2ccl_ucx::parse_address_blob(&blobs[1]).unwrap();
    let stranger = Worker::new(Context::new(ContextConfig::tcp("lo")).unwrap()).unwrap();
    let ep = stranger.connect(&addrs[0], "stranger").unwrap();
    let data_tag = 0u64; // rank 0, rail 0
    let mut sends: Vec<_> = (0..3).map(|_| ep.tag_send(data_tag, vec![0xEE; 192 << 10]).unwrap()).collect();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(800) {
        stranger.progress();
        b.progress(t0.elapsed());
        sends.retain_mut(|s| !s.is_done());
    }
    assert!(sends.is_empty(), "the stranger's messages were not delivered in 800 ms");
    let from_a = PathId::new(NicId::new(1, 0), Rank(0), NicId::new(0, 0));
    let mut kinds = Vec::new();
    for _ in 0..3 {
        let req = b.post_recv(t0.elapsed(), from_a, HEADER_LEN + 64).unwrap();
        let kind = loop {
            assert!(t0.elapsed() < Duration::from_secs(20), "the header receive never completed: {kinds:?}");
            stranger.progress();
            b.progress(t0.elapsed());
            let mut got = None;
            while let Some(ev) = b.poll_event() {
                match ev {
                    TransportEvent::Completion(c) if c.req == req => got = Some(c.kind),
                    TransportEvent::PathError { path, fault } => panic!("path {path} failed: {fault:?}"),
                    _ => {}
                }
            }
            if let Some(k) = got {
                break k;
            }
        };
        kinds.push(kind);
    }
    for k in &kinds {
        assert!(matches!(k, CompletionKind::Received(v) if v.is_empty()), "completions {kinds:?}");
    }
    drop(ep);
}
