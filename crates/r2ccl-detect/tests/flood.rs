//! A rank that floods another with probe requests: at most `MAX_OPEN_REQUESTS` of them are served
//! at a time and at most `MAX_REMEMBERED_REQUESTS` remembered; the rest are rejected, each with an
//! event, and a duplicate of a request being served starts nothing new.
#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]

use r2ccl_core::{NicId, NodeId, Rank};
use r2ccl_detect::{
    Command, DetectConfig, DetectEvent, Detector, Member, OobMessage, ProbeResult, MAX_OPEN_REQUESTS,
    MAX_REMEMBERED_REQUESTS,
};
use std::time::Duration;

fn detector() -> Detector {
    let members: Vec<Member> = (0..3).map(|r| Member { rank: Rank(r), node: NodeId(r) }).collect();
    Detector::new(DetectConfig::default(), Rank(0), &members).unwrap()
}

/// Feed `ids` as probe requests from rank 1 (probe node 2 from this node's NIC 0); returns the
/// probes started and the requests rejected.
fn ask(det: &mut Detector, now: Duration, ids: std::ops::Range<u64>) -> (Vec<r2ccl_detect::ProbeId>, usize) {
    for id in ids {
        let msg = OobMessage::ProbeRequest { id, from: NicId::new(0, 0), to: NicId::new(2, 0) };
        det.handle_message(now, Rank(1), msg).unwrap();
    }
    let mut started = Vec::new();
    while let Some(c) = det.poll_command() {
        if let Command::StartProbe { probe, .. } = c {
            started.push(probe);
        }
    }
    let mut rejected = 0;
    while let Some(ev) = det.poll_event() {
        if let DetectEvent::Rejected { from, why, .. } = ev {
            assert_eq!((from, why), (Rank(1), "too many probe requests from one rank"));
            rejected += 1;
        }
    }
    (started, rejected)
}

#[test]
fn a_flood_of_probe_requests_is_served_only_up_to_the_bounds() {
    let mut det = detector();
    let now = Duration::from_millis(1);
    let flood = 3 * MAX_OPEN_REQUESTS as u64;
    let (started, rejected) = ask(&mut det, now, 0..flood);
    assert_eq!(started.len(), MAX_OPEN_REQUESTS, "probes started for the flood");
    assert_eq!(rejected, flood as usize - MAX_OPEN_REQUESTS, "requests rejected");

    // Asked again while being served: nothing new starts, nothing is rejected.
    let (again, rejected) = ask(&mut det, now, 0..MAX_OPEN_REQUESTS as u64);
    assert_eq!((again.len(), rejected), (0, 0), "duplicates of open requests");

    // Answered, they make room for more, until MAX_REMEMBERED_REQUESTS are remembered.
    let mut next = flood;
    let mut served = MAX_OPEN_REQUESTS;
    let mut open = started;
    while served < MAX_REMEMBERED_REQUESTS {
        for p in open.drain(..) {
            det.handle_probe_result(now, p, ProbeResult::Answered).unwrap();
        }
        let (s, _) = ask(&mut det, now, next..next + MAX_OPEN_REQUESTS as u64);
        next += MAX_OPEN_REQUESTS as u64;
        served += s.len();
        assert!(!s.is_empty(), "answered requests make room ({served} served)");
        open = s;
    }
    assert_eq!(served, MAX_REMEMBERED_REQUESTS);
    for p in open.drain(..) {
        det.handle_probe_result(now, p, ProbeResult::Answered).unwrap();
    }
    let (s, rejected) = ask(&mut det, now, next..next + 10);
    assert_eq!((s.len(), rejected), (0, 10), "past the remembered bound");

    // Forgotten after their time, the rank is served again.
    det.handle_timeout(now + Duration::from_secs(11)).unwrap();
    let (s, rejected) = ask(&mut det, now + Duration::from_secs(11), next + 10..next + 11);
    assert_eq!((s.len(), rejected), (1, 0), "served again once the old requests are forgotten");
}
