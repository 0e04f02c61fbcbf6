//! A stranger's oversized messages under a data tag, waiting in UCX's unexpected queue before any
//! receive for that tag is posted, end as empty receipts, which the session counts as malformed:
//! taken by the transport's sweep (as unsolicited: truncated), or by a header receive posted while
//! one waits (it fails, truncated; UCX 1.22 reports it when the receive completes, and a post that
//! fails at once is handled the same way, `UcxTransport::launch`). Never a path failure.
//!
//! A large message under the probe tag, sent in part and left so with the connection open, does
//! not keep a peer's probes unanswered. The probe responder (an 8-byte receive) takes its first
//! bytes and UCX then waits for the rest; the next sweep finds a probe waiting, which a free
//! responder would have taken at once, sets the held responder aside and posts a new one. Without
//! that, every probe on the path went unanswered and the path looked dead to its peer (the test
//! failed: "probe 0 unanswered after 3 s").
#![allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]

use r2ccl_core::{NicId, NodeId, Rank};
use r2ccl_transport::{CompletionKind, PathId, Transport, TransportEvent, HEADER_LEN};
use r2ccl_ucx::{Context, ContextConfig, UcxTransport, UcxTransportConfig, Worker, PROBE_TAG_BIT};
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
    let from_a = PathId::new(NicId::new(1, 0), Rank(0), NicId::new(0, 0));
    // Each message ends as an empty receipt: taken from the unexpected queue by the transport's
    // sweep, as unsolicited (the sweep runs while they wait), or through the header receive
    // posted once the stranger's sends are done.
    let mut empties = Vec::new();
    let mut req = None;
    while empties.len() < 3 {
        assert!(t0.elapsed() < Duration::from_secs(20), "not every message was accounted for: {empties:?}");
        stranger.progress();
        b.progress(t0.elapsed());
        sends.retain_mut(|s| !s.is_done());
        if sends.is_empty() && req.is_none() {
            req = Some(b.post_recv(t0.elapsed(), from_a, HEADER_LEN + 64).unwrap());
        }
        while let Some(ev) = b.poll_event() {
            match ev {
                TransportEvent::Completion(c) if Some(c.req) == req => {
                    empties.push(c.kind);
                    req = Some(b.post_recv(t0.elapsed(), from_a, HEADER_LEN + 64).unwrap());
                }
                TransportEvent::Unsolicited { path, kind } => {
                    assert_eq!(path, from_a, "the stranger claimed rank 0 on rail 0");
                    empties.push(kind);
                }
                TransportEvent::PathError { path, fault } => panic!("path {path} failed: {fault:?}"),
                _ => {}
            }
        }
    }
    for k in &empties {
        assert!(matches!(k, CompletionKind::Received(v) if v.is_empty()), "completions {empties:?}");
    }
    drop(ep);
}

#[test]
fn a_stranger_holding_the_probe_responder_does_not_silence_a_peers_probes() {
    let (mut a, mut b) = (open(0), open(1));
    let blobs = vec![a.local_address_blob().unwrap(), b.local_address_blob().unwrap()];
    a.connect_peers(&blobs).unwrap();
    b.connect_peers(&blobs).unwrap();
    let t0 = Instant::now();
    // The stranger sends 64 MiB under the probe tag, eagerly, to rank 1's listener, lets its first bytes out,
    // then falls silent with its connection open.
    let (_, addrs) = r2ccl_ucx::parse_address_blob(&blobs[1]).unwrap();
    // Eager, not rendezvous: UCX matches the first fragment to the responder and then waits for
    // the rest.
    let mut cc = ContextConfig::tcp("lo");
    cc.extra.push(("RNDV_THRESH".into(), "inf".into()));
    let stranger = Worker::new(Context::new(cc).unwrap()).unwrap();
    let ep = stranger.connect(&addrs[0], "stranger").unwrap();
    let mut send = ep.tag_send(PROBE_TAG_BIT, vec![0xEE; 64 << 20]).unwrap();
    let (silent_at, quiet_at) =
        (Instant::now() + Duration::from_millis(20), Instant::now() + Duration::from_millis(300));
    while Instant::now() < quiet_at {
        if Instant::now() < silent_at {
            stranger.progress();
        }
        b.progress(t0.elapsed());
        a.progress(t0.elapsed());
        while b.poll_event().is_some() {}
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(!send.is_done(), "the stranger's message was left unfinished");
    // Rank 0 probes rank 1 on rail 0, five times in a row: each must be answered.
    let path = PathId::new(NicId::new(0, 0), Rank(1), NicId::new(1, 0));
    for i in 0..5 {
        let req = a.post_probe(t0.elapsed(), path).unwrap();
        let asked = Instant::now();
        'answered: loop {
            assert!(asked.elapsed() < Duration::from_secs(3), "probe {i} unanswered after 3 s");
            a.progress(t0.elapsed());
            b.progress(t0.elapsed());
            while b.poll_event().is_some() {}
            while let Some(ev) = a.poll_event() {
                match ev {
                    TransportEvent::Completion(c) if c.req == req => {
                        assert_eq!(c.kind, CompletionKind::ProbeOk, "probe {i}");
                        break 'answered;
                    }
                    TransportEvent::PathError { path, fault } => panic!("path {path} failed: {fault:?}"),
                    _ => {}
                }
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    assert_eq!(b.sweep_stats().responders_replaced, 1, "{:?}", b.sweep_stats());
    // (UCX keeps the held receive until rank 1's worker goes, and warns then that one request
    // was not returned.)
    drop((send, ep));
}
