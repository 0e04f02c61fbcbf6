//! A receive into place that is given up while UCX still holds it never writes its region again:
//! two `UcxTransport`s in one process on `lo`, a large split payload received into place, given up
//! while its bytes are still arriving (cancelled, or failed with the receiver's NIC); the bytes that
//! arrive afterwards land in throwaway pages, and the range is received into a buffer from then on
//! (`Transport::can_place`).
#![allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]

use r2ccl_core::{NicId, NodeId, Rank};
use r2ccl_transport::{
    CompletionKind, MemHandle, PathFault, PathId, PayloadInto, RequestId, Transport, TransportEvent, HEADER_LEN,
};
use r2ccl_ucx::{FaultKind, FaultSpec, UcxTransport, UcxTransportConfig};
use std::time::{Duration, Instant};

/// Large enough that loopback TCP takes tens of milliseconds to move it.
const LEN: usize = 256 << 20;

fn open(rank: u32) -> UcxTransport {
    let mut cfg = UcxTransportConfig::tcp(Rank(rank), NodeId(rank), &["lo"]);
    cfg.link_monitor = false;
    UcxTransport::open(cfg).unwrap()
}

/// Progress both sides once and collect their completions: `(side, request, kind)`.
fn pump(ts: &mut [&mut UcxTransport; 2], now: Duration, out: &mut Vec<(usize, RequestId, CompletionKind)>) {
    for (i, t) in ts.iter_mut().enumerate() {
        t.progress(now);
        while let Some(ev) = t.poll_event() {
            if let TransportEvent::Completion(c) = ev {
                out.push((i, c.req, c.kind));
            }
        }
    }
}

/// Sends `LEN` bytes of `src` from `a` to `b` split (header, then payload) and posts the payload's
/// receive straight into `dst` once the header names it: `(send, receive into place)`.
#[allow(clippy::too_many_arguments, reason = "the two sides, their regions and the test's clock")]
fn send_into_place(
    a: &mut UcxTransport,
    b: &mut UcxTransport,
    src: MemHandle,
    dst: MemHandle,
    t0: Instant,
    deadline: Duration,
    done: &mut Vec<(usize, RequestId, CompletionKind)>,
) -> (RequestId, RequestId) {
    let to_b = PathId::new(NicId::new(0, 0), Rank(1), NicId::new(1, 0));
    let from_a = PathId::new(NicId::new(1, 0), Rank(0), NicId::new(0, 0));
    let header_recv = b.post_recv(t0.elapsed(), from_a, HEADER_LEN + 64).unwrap();
    let send = a.post_send(t0.elapsed(), to_b, &[7u8; HEADER_LEN], src, 0, LEN).unwrap();
    // The header arrives on its own and names the payload.
    let payload = loop {
        assert!(t0.elapsed() < deadline, "no header; completions {done:?}");
        pump(&mut [&mut *a, &mut *b], t0.elapsed(), done);
        if let Some(i) = done.iter().position(|(side, r, _)| *side == 1 && *r == header_recv) {
            match done.remove(i).2 {
                CompletionKind::Header { payload, .. } => break payload,
                other => panic!("header receive completed with {other:?}"),
            }
        }
    };
    let placed = b
        .post_payload_recv(t0.elapsed(), from_a, payload, PayloadInto::Region { region: dst, offset: 0, len: LEN })
        .unwrap();
    (send, placed)
}

/// How the receiver gives its receive into place up.
#[derive(Clone, Copy, Debug)]
enum GiveUp {
    /// `Transport::cancel` (a replay delivered the chunk another way, or the collective was abandoned).
    Cancel,
    /// The receiver's NIC goes down: every request on it fails. On TCP its bytes still come once the
    /// link returns (here, on `lo`, at once), long after the chunk was received again elsewhere and
    /// the range handed to a later collective.
    LocalNicDown,
}

#[test]
fn a_cancelled_receive_into_place_never_writes_its_region_again() {
    given_up_receive_into_place_never_writes_its_region_again(GiveUp::Cancel);
}

#[test]
fn a_receive_into_place_failed_with_its_nic_never_writes_its_region_again() {
    given_up_receive_into_place_never_writes_its_region_again(GiveUp::LocalNicDown);
}

fn given_up_receive_into_place_never_writes_its_region_again(how: GiveUp) {
    let (mut a, mut b) = (open(0), open(1));
    let blobs = vec![a.local_address_blob().unwrap(), b.local_address_blob().unwrap()];
    a.connect_peers(&blobs).unwrap();
    b.connect_peers(&blobs).unwrap();
    let src = a.register(LEN).unwrap();
    a.region_mut(src).unwrap().fill(0xA5);
    let dst = b.register(LEN).unwrap();
    let spare = b.register(LEN).unwrap();
    assert!(b.can_place(dst, 0, LEN) && b.can_place(spare, 0, LEN));
    assert!(!b.can_place(dst, 1, 4096), "a range off a page boundary is received into a buffer");

    let t0 = Instant::now();
    let deadline = Duration::from_secs(30);
    let mut done = Vec::new();
    let (send, placed) = send_into_place(&mut a, &mut b, src, dst, t0, deadline, &mut done);
    // Wait until the payload's first bytes landed (it is matched and under way), then give it up.
    loop {
        assert!(t0.elapsed() < deadline, "no payload bytes arrived; completions {done:?}");
        pump(&mut [&mut a, &mut b], t0.elapsed(), &mut done);
        assert!(!done.iter().any(|(_, r, _)| *r == placed), "the payload finished before it could be given up");
        if b.region(dst).unwrap()[..4096].iter().all(|&x| x == 0xA5) {
            break;
        }
    }
    let reported = match how {
        GiveUp::Cancel => {
            b.cancel(t0.elapsed(), placed).unwrap();
            CompletionKind::Cancelled
        }
        GiveUp::LocalNicDown => {
            b.inject(nic_down());
            CompletionKind::Failed(PathFault::LocalNicDown)
        }
    };
    pump(&mut [&mut a, &mut b], t0.elapsed(), &mut done);
    let i = done.iter().position(|(_, r, _)| *r == placed).expect("the given-up receive is reported at once");
    assert_eq!(done.remove(i).2, reported, "{how:?}");
    assert!(!b.can_place(dst, 0, LEN), "the given-up range is received into a buffer from now on");
    assert!(b.can_place(spare, 0, LEN), "other regions are not affected");

    // The region is the caller's again: whatever UCX still receives must not reach it.
    b.region_mut(dst).unwrap().fill(0xEE);
    loop {
        assert!(t0.elapsed() < deadline, "the send did not finish; completions {done:?}");
        pump(&mut [&mut a, &mut b], t0.elapsed(), &mut done);
        if let Some(i) = done.iter().position(|(side, r, _)| *side == 0 && *r == send) {
            assert_eq!(done.remove(i).2, CompletionKind::Sent);
            break;
        }
    }
    // Let UCX deliver anything still queued on the receiving side.
    let settle = Instant::now();
    while settle.elapsed() < Duration::from_millis(200) {
        pump(&mut [&mut a, &mut b], t0.elapsed(), &mut done);
    }
    let region = b.region(dst).unwrap();
    let changed = region.iter().filter(|&&x| x != 0xEE).count();
    assert_eq!(changed, 0, "{changed} bytes of the region were written after its receive was given up");

    // That receive is over (its last bytes went to the throwaway pages): the range is received
    // into place again, and such a receive lands in the region.
    loop {
        assert!(t0.elapsed() < deadline, "the given-up range never became placeable again");
        pump(&mut [&mut a, &mut b], t0.elapsed(), &mut done);
        if b.can_place(dst, 0, LEN) {
            break;
        }
    }
    a.region_mut(src).unwrap().fill(0x5A);
    let (send, placed) = send_into_place(&mut a, &mut b, src, dst, t0, deadline, &mut done);
    let (mut sent, mut landed) = (false, false);
    while !(sent && landed) {
        assert!(t0.elapsed() < deadline, "the second transfer did not finish; completions {done:?}");
        pump(&mut [&mut a, &mut b], t0.elapsed(), &mut done);
        for (_, r, kind) in done.drain(..) {
            if r == send {
                assert_eq!(kind, CompletionKind::Sent);
                sent = true;
            } else if r == placed {
                assert_eq!(kind, CompletionKind::Placed);
                landed = true;
            }
        }
    }
    let wrong = b.region(dst).unwrap().iter().filter(|&&x| x != 0x5A).count();
    assert_eq!(wrong, 0, "{wrong} bytes of the healed range missed the second receive into place");
}

/// The receiver's NIC 0 goes down at once for 100 ms (a software fault).
fn nic_down() -> FaultSpec {
    FaultSpec {
        rank: None,
        nic: 0,
        after_bytes: None,
        after_msgs: None,
        after: None,
        duration: Some(Duration::from_millis(100)),
        kind: FaultKind::Down,
    }
}
