//! The session's side of split chunks (a header, then its payload as a message of its own), driven
//! through a scripted backend: a payload lands in place when it can, else as a whole message; a
//! receive into place that a replay supersedes is cancelled and holds the transfer's completion until
//! it ends; a receive given up cancels its receives into place; bytes the backend cannot protect
//! (`Transport::can_place`) are received into a buffer; a refused header posts no payload receive.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]

use r2ccl_core::Rank;
use r2ccl_transport::harness::HARNESS_KEY;
use r2ccl_transport::script::Script;
use r2ccl_transport::HeaderMac;
use r2ccl_transport::{
    Buffer, ChunkHeader, ChunkId, ChunkProblem, CommId, CompletionKind, MemHandle, PathFault, PathId, PayloadId,
    PayloadInto, Session, SessionConfig, SessionEvent, Topology, TransferKey, Transport, WireError,
};
use std::time::Duration;

fn mac() -> HeaderMac {
    HeaderMac::new(&HARNESS_KEY)
}

/// Chunk size: the 2 x 8192-byte transfer below has two chunks.
const CS: u32 = 8192;
const LEN: usize = 2 * CS as usize;

fn key() -> TransferKey {
    TransferKey::new(1, 0, 0, 0, 1)
}

fn header(index: u32, replay: bool) -> Vec<u8> {
    let h = ChunkHeader {
        id: ChunkId { transfer: key(), index },
        total_len: LEN as u64,
        len: CS,
        flags: if replay { r2ccl_transport::wire::FLAG_REPLAY } else { 0 },
        args: 0,
    };
    h.encode(&mac()).to_vec()
}

fn payload(index: u32) -> Vec<u8> {
    (0..CS).map(|i| (i as u8).wrapping_mul(7).wrapping_add(index as u8 * 31 + 1)).collect()
}

fn whole(index: u32, replay: bool) -> Vec<u8> {
    let mut m = header(index, replay);
    m.extend_from_slice(&payload(index));
    m
}

fn expected() -> Vec<u8> {
    let mut v = payload(0);
    v.extend_from_slice(&payload(1));
    v
}

struct Rx {
    s: Session,
    t: Script,
    dst: MemHandle,
    now: Duration,
}

impl Rx {
    /// Rank 1 of two single-NIC nodes, expecting `key()` into a fresh region, payloads into place.
    fn new() -> Self {
        Self::with(true)
    }

    fn with(place_payloads: bool) -> Self {
        let topo = Topology::uniform(2, 1, 1, 1).unwrap();
        let cfg = SessionConfig { chunk_size: CS, recv_depth: 4, place_payloads, ..SessionConfig::default() };
        let mut s = Session::new(Rank(1), cfg, topo, &HARNESS_KEY).unwrap();
        s.open_comm(CommId(1));
        let mut t = Script::default();
        let dst = t.register(LEN).unwrap();
        let mut rx = Self { s, t, dst, now: Duration::ZERO };
        rx.expect();
        rx
    }

    fn expect(&mut self) {
        let buf = Buffer { region: self.dst, offset: 0, len: LEN as u64 };
        self.s.expect_recv(self.now, &mut self.t, key(), buf).unwrap();
        self.drive();
    }

    fn drive(&mut self) -> Vec<SessionEvent> {
        self.now += Duration::from_micros(10);
        self.s.drive(self.now, &mut self.t);
        std::iter::from_fn(|| self.s.poll_event()).collect()
    }

    /// A posted receive completes with a header whose payload waits as `payload`.
    fn header_arrives(&mut self, index: u32, replay: bool, payload: u64) -> PathId {
        let (req, path) = self.t.take_recv();
        self.t.complete(
            req,
            path,
            CompletionKind::Header { header: header(index, replay), payload: PayloadId(payload) },
        );
        path
    }

    /// A posted receive completes with a whole message.
    fn whole_arrives(&mut self, index: u32, replay: bool) {
        let (req, path) = self.t.take_recv();
        self.t.complete(req, path, CompletionKind::Received(whole(index, replay)));
    }

    /// The backend lands payload receive `n` (in posting order): in place, or as a whole message.
    fn land_payload(&mut self, n: usize) {
        let (req, path, _, into) = self.t.payloads.remove(n);
        match into {
            PayloadInto::Region { region, offset, len } => {
                let index = (offset / CS as usize) as u32;
                self.t.region_mut(region).unwrap()[offset..offset + len].copy_from_slice(&payload(index));
                self.t.complete(req, path, CompletionKind::Placed);
            }
            PayloadInto::Buffer { mut header, .. } => {
                let index = ChunkHeader::decode_split(&header, &mac()).map_or(0, |h| h.id.index);
                header.extend_from_slice(&payload(index));
                self.t.complete(req, path, CompletionKind::Received(header));
            }
        }
    }
}

#[test]
fn placement_is_on_by_default() {
    assert!(SessionConfig::default().place_payloads);
}

#[test]
fn without_placement_split_payloads_come_whole_into_a_buffer() {
    let mut rx = Rx::with(false);
    rx.header_arrives(0, false, 60);
    rx.drive();
    assert!(matches!(rx.t.payloads[0].3, PayloadInto::Buffer { capacity, .. } if capacity == CS as usize));
    rx.land_payload(0);
    rx.header_arrives(1, false, 61);
    rx.drive();
    rx.land_payload(0);
    assert_eq!(rx.drive(), vec![SessionEvent::RecvComplete(key())]);
    assert_eq!(rx.t.region(rx.dst).unwrap(), expected().as_slice());
}

#[test]
fn split_payloads_land_in_place_and_complete_the_transfer() {
    let mut rx = Rx::new();
    let path = rx.header_arrives(0, false, 70);
    assert!(rx.drive().is_empty());
    let (_, p, id, into) = &rx.t.payloads[0];
    assert_eq!((*p, *id), (path, PayloadId(70)));
    assert_eq!(*into, PayloadInto::Region { region: rx.dst, offset: 0, len: CS as usize }, "chunk 0 goes in place");
    rx.land_payload(0);
    assert!(rx.drive().is_empty(), "one chunk of two");
    assert!(rx.s.holds_chunk(key(), 0));
    rx.header_arrives(1, false, 71);
    rx.drive();
    assert_eq!(rx.t.payloads[0].3, PayloadInto::Region { region: rx.dst, offset: CS as usize, len: CS as usize });
    rx.land_payload(0);
    assert_eq!(rx.drive(), vec![SessionEvent::RecvComplete(key())]);
    assert_eq!(rx.t.region(rx.dst).unwrap(), expected().as_slice());
    let st = rx.s.stats();
    assert_eq!((st.chunks_applied, st.bytes_applied, st.duplicates), (2, LEN as u64, 0));
    assert!(rx.t.cancelled.is_empty());
}

#[test]
fn a_replay_supersedes_a_receive_into_place_which_still_holds_completion() {
    let mut rx = Rx::new();
    rx.header_arrives(0, false, 80);
    rx.drive();
    let placed = rx.t.payloads[0].0;
    // The sender migrated: chunk 0 comes again, whole, on the new path, and then chunk 1.
    rx.whole_arrives(0, true);
    assert!(rx.drive().is_empty());
    assert_eq!(rx.t.cancelled, vec![placed], "the receive into place is cancelled");
    rx.whole_arrives(1, false);
    assert!(rx.drive().is_empty(), "not complete while the backend may still write the destination");
    assert_eq!(rx.t.region(rx.dst).unwrap(), expected().as_slice());
    // The backend lets go of it.
    let (req, path, _, _) = rx.t.payloads.remove(0);
    rx.t.complete(req, path, CompletionKind::Cancelled);
    assert_eq!(rx.drive(), vec![SessionEvent::RecvComplete(key())]);
    assert_eq!(rx.s.stats().chunks_applied, 2);
}

#[test]
fn a_second_header_for_a_chunk_on_its_way_in_place_goes_to_a_buffer() {
    let mut rx = Rx::new();
    rx.header_arrives(0, false, 90);
    rx.header_arrives(0, true, 91);
    rx.drive();
    assert_eq!(rx.t.payloads.len(), 2);
    assert!(matches!(rx.t.payloads[0].3, PayloadInto::Region { .. }));
    assert!(matches!(rx.t.payloads[1].3, PayloadInto::Buffer { capacity, .. } if capacity == CS as usize));
    // The buffered replay lands first: applied; the one in place is cancelled, then finishes anyway.
    rx.land_payload(1);
    rx.drive();
    assert_eq!(rx.t.cancelled.len(), 1);
    rx.land_payload(0);
    rx.drive();
    assert_eq!(rx.s.stats().duplicates, 1, "landing in place after the replay counts as a duplicate");
    rx.whole_arrives(1, false);
    assert_eq!(rx.drive(), vec![SessionEvent::RecvComplete(key())]);
    assert_eq!(rx.t.region(rx.dst).unwrap(), expected().as_slice());
}

#[test]
fn a_failed_receive_into_place_fails_the_path_and_the_replay_completes() {
    let mut rx = Rx::new();
    rx.header_arrives(0, false, 95);
    rx.drive();
    let (req, path, _, _) = rx.t.payloads.remove(0);
    rx.t.complete(req, path, CompletionKind::Failed(PathFault::Endpoint));
    let ev = rx.drive();
    assert!(ev.contains(&SessionEvent::PathFailed { path, fault: PathFault::Endpoint }), "{ev:?}");
    assert!(!rx.s.holds_chunk(key(), 0));
    assert_eq!(rx.s.held(key(), 0, 2).unwrap(), 0, "the replay boundary excludes the failed chunk");
}

#[test]
fn refused_headers_post_no_payload_receive_and_early_ones_are_kept() {
    let mut rx = Rx::new();
    // A header that does not verify (corrupted, or forged without the key): counted, reported, its
    // buffer handed back, and no receive posted for the payload it announces (a stranger's forged
    // header must not make the rank hold a buffer for a message that may never come).
    for bad in [
        {
            let mut b = header(0, false);
            b[20] ^= 1;
            b
        },
        ChunkHeader::decode_split(&header(0, false), &mac())
            .unwrap()
            .encode(&HeaderMac::new(&r2ccl_transport::HeaderKey::from_bytes([9; 32])))
            .to_vec(),
    ] {
        let (req, path) = rx.t.take_recv();
        let recycled = rx.t.recycled;
        rx.t.complete(req, path, CompletionKind::Header { header: bad, payload: PayloadId(1) });
        let ev = rx.drive();
        assert!(
            matches!(ev.as_slice(), [SessionEvent::BadChunk { problem: ChunkProblem::Malformed(WireError::Tag), .. }]),
            "{ev:?}"
        );
        assert!(rx.t.payloads.is_empty(), "no payload receive for a refused header");
        assert_eq!(rx.t.recycled, recycled + 1, "the header's buffer is handed back");
    }
    assert_eq!(rx.s.stats().malformed, 2);
    assert_eq!(rx.s.stats().chunks_applied, 0);

    // A header of a transfer not expected yet: its payload comes whole and waits as an early chunk.
    let early = TransferKey::new(1, 1, 0, 0, 1);
    let (req, path) = rx.t.take_recv();
    let mut h = ChunkHeader::decode_split(&header(0, false), &mac()).unwrap();
    h.id.transfer = early;
    rx.t.complete(req, path, CompletionKind::Header { header: h.encode(&mac()).to_vec(), payload: PayloadId(2) });
    rx.drive();
    assert!(matches!(rx.t.payloads[0].3, PayloadInto::Buffer { .. }), "no destination yet");
    rx.land_payload(0);
    rx.drive();
    assert_eq!(rx.s.stats().early_stashed, 1);
}

#[test]
fn bytes_the_backend_cannot_protect_are_received_into_a_buffer() {
    let mut rx = Rx::new();
    rx.t.unplaceable = true;
    rx.header_arrives(0, false, 80);
    rx.drive();
    assert!(matches!(rx.t.payloads[0].3, PayloadInto::Buffer { capacity, .. } if capacity == CS as usize));
    rx.land_payload(0);
    rx.t.unplaceable = false;
    rx.header_arrives(1, false, 81);
    rx.drive();
    assert!(matches!(rx.t.payloads[0].3, PayloadInto::Region { .. }), "placeable again: in place");
    rx.land_payload(0);
    assert_eq!(rx.drive(), vec![SessionEvent::RecvComplete(key())]);
    assert_eq!(rx.t.region(rx.dst).unwrap(), expected().as_slice());
}

#[test]
fn giving_up_a_receive_cancels_its_receives_into_place() {
    let mut rx = Rx::new();
    rx.header_arrives(0, false, 90);
    rx.drive();
    let placed = rx.t.payloads[0].0;
    let now = rx.now;
    rx.s.cancel_recv(now, &mut rx.t, key());
    assert_eq!(rx.t.cancelled, vec![placed], "the receive into place is cancelled");
    // The backend reports it cancelled; the transfer is gone, nothing completes, late chunks are duplicates.
    let (req, path, ..) = rx.t.payloads.remove(0);
    rx.t.complete(req, path, CompletionKind::Cancelled);
    assert!(rx.drive().is_empty());
    assert_eq!(rx.s.held(key(), 0, 2).unwrap(), 2, "a released transfer holds everything");
    rx.whole_arrives(1, false);
    rx.drive();
    assert_eq!(rx.s.stats().duplicates, 1);
}
