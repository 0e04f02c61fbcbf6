//! A stranger's large message under the probe tag, sent in part and left so with the connection
//! open, does not keep a peer's probes unanswered. The probe responder (an 8-byte receive) takes
//! its first bytes and UCX then waits for the rest; the next sweep finds a probe waiting, which a
//! free responder would have taken at once, sets the held responder aside and posts a new one.
//! Without that, every probe on the path went unanswered and the path looked dead to its peer
//! (this test failed: "probe 0 unanswered after 3 s").
#![allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]

use r2ccl_core::{NicId, NodeId, Rank};
use r2ccl_transport::{CompletionKind, PathId, Transport, TransportEvent};
use r2ccl_ucx::{Context, ContextConfig, UcxTransport, UcxTransportConfig, Worker, PROBE_TAG_BIT};
use std::time::{Duration, Instant};

fn open(rank: u32) -> UcxTransport {
    let mut cfg = UcxTransportConfig::tcp(Rank(rank), NodeId(rank), &["lo"]);
    cfg.link_monitor = false;
    UcxTransport::open(cfg).unwrap()
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
