//! In-process UCX tests over TCP on loopback (`lo`): tagged transfers between two workers, deadlines,
//! cancellation, memory regions mapped on several contexts, probes.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]

use r2ccl_core::{RailId, Rank};
use r2ccl_ucx::{wait_all, Context, ContextConfig, NicEndpointSet, Pending, UcxError, Worker};
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(20);

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ ((i >> 8) as u8)).collect()
}

fn worker_on_lo() -> Worker {
    Worker::new(Context::new(ContextConfig::tcp("lo")).unwrap()).unwrap()
}

#[test]
fn two_workers_exchange_tagged_messages_bit_exact() {
    let a = worker_on_lo();
    let b = worker_on_lo();
    let a_to_b = a.connect(&b.address().unwrap(), "a->b").unwrap();
    let b_to_a = b.connect(&a.address().unwrap(), "b->a").unwrap();
    for (i, size) in [0usize, 1, 4 << 20].into_iter().enumerate() {
        let tag = 0x100 + i as u64;
        let data = pattern(size, i as u8);
        // a -> b, receive posted first.
        let mut recv = b.tag_recv(tag, u64::MAX, vec![0u8; size]).unwrap();
        let mut send = a_to_b.tag_send(tag, data.clone()).unwrap();
        wait_all(&[&a, &b], &mut [&mut send as &mut dyn Pending, &mut recv], DEADLINE).unwrap();
        assert_eq!(send.poll().unwrap().unwrap(), size);
        assert_eq!(recv.poll().unwrap().unwrap(), size);
        assert!(recv.take_buffer().unwrap() == data, "a->b {size} bytes differ");
        // b -> a, send posted first (unexpected message path on the receiver).
        let mut send = b_to_a.tag_send(tag, data.clone()).unwrap();
        for _ in 0..100 {
            a.progress();
            b.progress();
        }
        let mut recv = a.tag_recv(tag, u64::MAX, vec![0u8; size]).unwrap();
        wait_all(&[&a, &b], &mut [&mut send as &mut dyn Pending, &mut recv], DEADLINE).unwrap();
        assert_eq!(recv.poll().unwrap().unwrap(), size);
        assert!(recv.take_buffer().unwrap() == data, "b->a {size} bytes differ");
    }
    assert!(a_to_b.failure().is_none() && b_to_a.failure().is_none());
    // Flush and graceful close need the peer's worker to answer, so progress it from a second thread
    // (the worker lock makes that legal).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (b2, stop2) = (b.clone(), stop.clone());
    let t = std::thread::spawn(move || {
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            b2.progress();
        }
    });
    a_to_b.flush(DEADLINE).unwrap();
    a_to_b.close(DEADLINE).unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    t.join().unwrap();
    assert_eq!(a.orphan_count(), 0);
    assert_eq!(b.orphan_count(), 0);
}

/// A stranger who opens connection after connection and never leaves holds at most the cap of
/// accepted endpoints; the rest are rejected and counted.
#[test]
fn a_listener_keeps_at_most_its_cap_of_accepted_endpoints() {
    let target = worker_on_lo();
    target.set_max_accepted(3);
    let addr = target.address().unwrap();
    let stranger = worker_on_lo();
    let eps: Vec<_> = (0..10).map(|i| stranger.connect(&addr, format!("stranger {i}")).unwrap()).collect();
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until && target.accepted_count() as u64 + target.rejected_count() < 10 {
        target.progress();
        stranger.progress();
    }
    assert_eq!(target.accepted_count(), 3, "accepted endpoints");
    assert_eq!(target.rejected_count(), 7, "rejected connection requests");
    drop(eps);
}

fn worker_with_id(id: u64) -> Worker {
    Worker::new(Context::new(ContextConfig { client_id: Some(id), ..ContextConfig::tcp("lo") }).unwrap()).unwrap()
}

/// A listener that admits only the job's endpoint ids rejects every other connection request at
/// once: strangers (no id, or a wrong one) hold none of its places, so a peer that connects
/// while they keep trying is accepted and its messages flow, and the strangers' endpoints fail.
/// Without the ids the strangers would fill the cap of 2 and the peer would be rejected.
#[test]
fn a_listener_admitting_only_the_jobs_ids_keeps_strangers_out_and_lets_a_peer_in() {
    let target = worker_on_lo();
    target.set_max_accepted(2);
    target.admit_only([7].into());
    let addr = target.address().unwrap();
    let (stranger, impostor) = (worker_on_lo(), worker_with_id(8));
    let mut eps: Vec<_> = (0..10).map(|i| stranger.connect(&addr, format!("stranger {i}")).unwrap()).collect();
    eps.extend((0..5).map(|i| impostor.connect(&addr, format!("impostor {i}")).unwrap()));
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until && (target.strangers_rejected() < 15 || eps.iter().any(|e| e.failure().is_none())) {
        target.progress();
        stranger.progress();
        impostor.progress();
    }
    assert_eq!(target.strangers_rejected(), 15, "every stranger's request rejected");
    assert_eq!(target.accepted_count(), 0, "no stranger holds a place");
    assert!(eps.iter().all(|e| e.failure().is_some()), "the strangers' endpoints failed");
    let peer = worker_with_id(7);
    let ep = peer.connect(&addr, "peer").unwrap();
    let mut recv = target.tag_recv(1, u64::MAX, vec![0u8; 5]).unwrap();
    let mut send = ep.tag_send(1, vec![1, 2, 3, 4, 5]).unwrap();
    wait_all(&[&target, &peer], &mut [&mut send as &mut dyn Pending, &mut recv], DEADLINE).unwrap();
    assert_eq!(recv.take_buffer().unwrap(), vec![1, 2, 3, 4, 5]);
    assert_eq!(target.accepted_count(), 1, "the peer's endpoint");
    assert_eq!(target.rejected_count(), 0, "nothing rejected for the cap");
}

#[test]
fn a_receive_that_never_matches_times_out_by_its_deadline_and_is_cancelled() {
    let w = worker_on_lo();
    let mut recv = w.tag_recv(0xdead, u64::MAX, vec![7u8; 64]).unwrap();
    let deadline = Duration::from_millis(300);
    let start = Instant::now();
    let err = recv.wait(deadline).unwrap_err();
    let elapsed = start.elapsed();
    assert!(err.is_timeout(), "{err}");
    assert!(elapsed >= deadline && elapsed < deadline + Duration::from_secs(1), "waited {elapsed:?}");
    // The cancel completed the request with UCS_ERR_CANCELED and released the buffer, untouched.
    let outcome = recv.poll().expect("cancelled receive is complete").unwrap_err();
    assert!(outcome.is_canceled(), "{outcome}");
    assert_eq!(recv.take_buffer().unwrap(), vec![7u8; 64]);
    drop(recv);
    assert_eq!(w.orphan_count(), 0);
}

#[test]
fn a_message_larger_than_the_receive_buffer_is_reported_as_truncated() {
    let a = worker_on_lo();
    let b = worker_on_lo();
    let ep = a.connect(&b.address().unwrap(), "a->b").unwrap();
    let mut recv = b.tag_recv(5, u64::MAX, vec![0u8; 8]).unwrap();
    let mut send = ep.tag_send(5, vec![1u8; 64]).unwrap();
    wait_all(&[&a, &b], &mut [&mut send as &mut dyn Pending, &mut recv], DEADLINE).unwrap();
    let err = recv.poll().unwrap().unwrap_err();
    assert!(matches!(err, UcxError::Truncated { capacity: 8, .. }), "{err}");
}

#[test]
fn dropping_an_inflight_receive_parks_nothing_and_later_messages_still_flow() {
    let a = worker_on_lo();
    let b = worker_on_lo();
    let ep = a.connect(&b.address().unwrap(), "a->b").unwrap();
    drop(b.tag_recv(9, u64::MAX, vec![0u8; 16]).unwrap());
    assert_eq!(b.orphan_count(), 0, "an unmatched receive is cancelled at once");
    let mut recv = b.tag_recv(9, u64::MAX, vec![0u8; 3]).unwrap();
    let mut send = ep.tag_send(9, vec![1, 2, 3]).unwrap();
    wait_all(&[&a, &b], &mut [&mut send as &mut dyn Pending, &mut recv], DEADLINE).unwrap();
    assert_eq!(recv.take_buffer().unwrap(), vec![1, 2, 3]);
}

#[test]
fn a_context_is_restricted_to_its_device_and_rejects_bad_config() {
    let ctx = Context::new(ContextConfig::tcp("lo")).unwrap();
    assert_eq!(ctx.device(), "lo");
    let settings = ctx.config().settings();
    assert!(settings.contains(&("TLS".into(), "tcp".into())));
    assert!(settings.contains(&("NET_DEVICES".into(), "lo".into())));
    let err = Context::new(ContextConfig::tcp("")).unwrap_err();
    assert!(matches!(err, UcxError::InvalidConfig { .. }), "{err}");
    let err = Context::new(ContextConfig::tcp("l\0o")).unwrap_err();
    assert!(matches!(err, UcxError::InvalidConfig { .. }), "{err}");
    // A UCP-level key with a value UCX cannot parse is refused by ucp_config_modify. (Unknown keys are
    // not: UCX 1.13 keeps them for the transport layer and only warns when a worker is created.)
    let mut bad = ContextConfig::tcp("lo");
    bad.extra.push(("KEEPALIVE_INTERVAL".into(), "not-a-time".into()));
    let err = Context::new(bad).unwrap_err();
    assert!(matches!(err, UcxError::Status { op: "ucp_config_modify", .. }), "{err}");
}

#[test]
fn regions_mapped_on_two_rails_move_data_on_either_rail_and_probes_use_their_own_endpoints() {
    // Two "NICs" (both on lo here: two contexts, two workers) per process side.
    let mut left = NicEndpointSet::open_tcp(&["lo", "lo"]).unwrap();
    let mut right = NicEndpointSet::open_tcp(&["lo", "lo"]).unwrap();
    left.connect(Rank(1), &right.addresses().unwrap()).unwrap();
    right.connect(Rank(0), &left.addresses().unwrap()).unwrap();

    let size = 1 << 20;
    let src = left.register(pattern(size, 3)).unwrap();
    let dst = right.register(vec![0u8; size]).unwrap();
    assert_eq!(src.mapped_count(), 2);
    let half = size / 2;
    // First half over rail 0, second half over rail 1, from one region registered on both.
    let mut reqs = Vec::new();
    for r in 0..2u16 {
        let range = usize::from(r) * half..usize::from(r + 1) * half;
        let recv =
            right.rail(RailId(r)).unwrap().recv(u64::from(r), u64::MAX, dst.slice(range.clone()).unwrap()).unwrap();
        let send = left.rail(RailId(r)).unwrap().send(Rank(1), u64::from(r), src.slice(range).unwrap()).unwrap();
        reqs.push((send, recv));
    }
    let mut workers = left.workers();
    workers.extend(right.workers());
    let mut pending: Vec<&mut dyn Pending> = Vec::new();
    for (s, r) in &mut reqs {
        pending.push(s);
        pending.push(r);
    }
    wait_all(&workers, &mut pending, DEADLINE).unwrap();
    drop(pending);
    for (s, r) in &mut reqs {
        assert_eq!(s.poll().unwrap().unwrap(), half);
        assert_eq!(r.poll().unwrap().unwrap(), half);
    }
    drop(reqs);
    // SAFETY: every request on the two regions is over (dropped above).
    assert!(unsafe { dst.to_vec() == src.to_vec() });

    // A zero-byte probe travels on the probe endpoint and is not taken by a data receive.
    let rail = right.rail(RailId(1)).unwrap();
    let mut data_recv = rail.recv(0, 0, vec![0u8; 8]).unwrap(); // matches any data tag
    let mut probe_recv = rail.recv_probe().unwrap();
    let mut probe = left.rail(RailId(1)).unwrap().probe(Rank(1), 42).unwrap();
    wait_all(&workers, &mut [&mut probe as &mut dyn Pending, &mut probe_recv], DEADLINE).unwrap();
    assert_eq!(probe_recv.poll().unwrap().unwrap(), 0);
    assert_eq!(r2ccl_ucx::probe_seq(probe_recv.sender_tag().unwrap()), 42);
    assert!(data_recv.poll().is_none(), "a probe must not match a data receive");
    data_recv.cancel();
    assert!(data_recv.wait(DEADLINE).unwrap_err().is_canceled());
    // Data tags may not use the probe bit.
    assert!(rail.send(Rank(0), r2ccl_ucx::PROBE_TAG_BIT | 1, vec![0u8]).is_err());
    assert!(left.rails().iter().all(|r| r.failures().is_empty()));
}
