//! Argument digests in chunk headers (`Session::set_args`): a chunk whose sender called its
//! collective with other arguments is refused and reported as `ChunkProblem::ArgsDiffer`, never
//! applied, whether it arrives whole, split or before this rank expected its transfer; chunks
//! with the same digest, or of a collective this rank set no digest for, are applied. Sent chunks
//! carry this rank's digest for their peer.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]

use r2ccl_core::Rank;
use r2ccl_transport::harness::HARNESS_KEY;
use r2ccl_transport::script::Script;
use r2ccl_transport::{
    ArgDigest, Buffer, ChunkHeader, ChunkId, ChunkProblem, CommId, CompletionKind, HeaderMac, MemHandle, PayloadId,
    Session, SessionConfig, SessionEvent, Topology, TransferKey, Transport,
};
use std::time::Duration;

const CS: u32 = 8192;
const MINE: u32 = 0x1111;
const THEIRS: u32 = 0x2222;

fn key(seq: u64) -> TransferKey {
    TransferKey::new(1, seq, 0, 0, 1)
}

fn message(seq: u64, args: u32, split: bool) -> Vec<u8> {
    let h =
        ChunkHeader { id: ChunkId { transfer: key(seq), index: 0 }, total_len: u64::from(CS), len: CS, flags: 0, args };
    let mut m = h.encode(&HeaderMac::new(&HARNESS_KEY)).to_vec();
    if !split {
        m.extend(std::iter::repeat_n(7u8, CS as usize));
    }
    m
}

/// Rank 1 of two single-NIC nodes.
struct Rx {
    s: Session,
    t: Script,
    dst: MemHandle,
    now: Duration,
}

impl Rx {
    fn new() -> Self {
        let cfg = SessionConfig { chunk_size: CS, recv_depth: 4, ..SessionConfig::default() };
        let mut s = Session::new(Rank(1), cfg, Topology::uniform(2, 1, 1, 1).unwrap(), &HARNESS_KEY).unwrap();
        s.open_comm(CommId(1));
        let mut t = Script::default();
        let dst = t.register(CS as usize).unwrap();
        Self { s, t, dst, now: Duration::ZERO }
    }

    fn expect(&mut self, seq: u64) {
        let buf = Buffer { region: self.dst, offset: 0, len: u64::from(CS) };
        self.s.expect_recv(self.now, &mut self.t, key(seq), buf).unwrap();
    }

    fn drive(&mut self) -> Vec<SessionEvent> {
        self.now += Duration::from_micros(10);
        self.s.drive(self.now, &mut self.t);
        std::iter::from_fn(|| self.s.poll_event()).collect()
    }

    fn arrives(&mut self, kind: CompletionKind) {
        let (req, path) = self.t.take_recv();
        self.t.complete(req, path, kind);
    }

    fn refused(events: &[SessionEvent], seq: u64) -> bool {
        events.iter().any(|e| {
            matches!(e, SessionEvent::BadChunk { problem: ChunkProblem::ArgsDiffer { seq: s, from: Rank(0), theirs: THEIRS, mine: MINE }, .. } if *s == seq)
        })
    }
}

#[test]
fn a_whole_chunk_with_other_arguments_is_refused_and_one_with_the_same_is_applied() {
    let mut rx = Rx::new();
    rx.s.set_args(CommId(1), 0, ArgDigest::Same(MINE));
    rx.expect(0);
    rx.drive();
    rx.arrives(CompletionKind::Received(message(0, THEIRS, false)));
    let ev = rx.drive();
    assert!(Rx::refused(&ev, 0), "{ev:?}");
    assert_eq!((rx.s.stats().chunks_applied, rx.s.stats().args_differ), (0, 1));
    rx.arrives(CompletionKind::Received(message(0, MINE, false)));
    assert_eq!(rx.drive(), vec![SessionEvent::RecvComplete(key(0))]);
    assert_eq!(rx.t.region(rx.dst).unwrap(), vec![7u8; CS as usize].as_slice());
}

#[test]
fn a_split_header_with_other_arguments_posts_no_payload_receive() {
    let mut rx = Rx::new();
    rx.s.set_args(CommId(1), 0, ArgDigest::PerPeer([(Rank(0), MINE)].into()));
    rx.expect(0);
    rx.drive();
    rx.arrives(CompletionKind::Header { header: message(0, THEIRS, true), payload: PayloadId(5) });
    let ev = rx.drive();
    assert!(Rx::refused(&ev, 0), "{ev:?}");
    assert!(rx.t.payloads.is_empty(), "no receive for its payload");
}

#[test]
fn an_early_chunk_is_checked_when_its_transfer_is_expected() {
    let mut rx = Rx::new();
    // Rank 1 listens to rank 0 (an earlier transfer) but has not reached collective 1 yet.
    rx.s.set_args(CommId(1), 0, ArgDigest::Same(MINE));
    rx.expect(0);
    rx.drive();
    rx.arrives(CompletionKind::Received(message(1, THEIRS, false)));
    assert!(rx.drive().is_empty(), "kept: no digest set for collective 1 yet");
    assert_eq!(rx.s.stats().early_stashed, 1);
    rx.s.set_args(CommId(1), 1, ArgDigest::Same(MINE));
    rx.expect(1);
    let ev = rx.drive();
    assert!(Rx::refused(&ev, 1), "{ev:?}");
    assert_eq!(rx.s.stats().chunks_applied, 0);
}

#[test]
fn without_a_digest_nothing_is_checked() {
    let mut rx = Rx::new();
    rx.expect(0);
    rx.drive();
    rx.arrives(CompletionKind::Received(message(0, THEIRS, false)));
    assert_eq!(rx.drive(), vec![SessionEvent::RecvComplete(key(0))]);
}
