//! The session used directly over the fabric (no harness): the boundary invariants are enforced,
//! early chunks are kept until their transfer is expected, and wrong calls are refused.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]

use r2ccl_core::{DType, NicId, Rank, ReduceOp};
use r2ccl_transport::harness::HARNESS_KEY;
use r2ccl_transport::{
    Buffer, CommId, FabricConfig, FaultAction, MemFabric, MoveReason, PathFault, Session, SessionConfig, SessionError,
    SessionEvent, Topology, TransferKey, Transport,
};
use std::time::Duration;

const CS: u32 = 4096;

struct World {
    f: MemFabric,
    s: Vec<Session>,
    now: Duration,
}

impl World {
    fn new() -> Self {
        let f = MemFabric::new(FabricConfig { nics_per_node: 2, ..FabricConfig::default() });
        let topo = Topology::uniform(2, 1, 2, 1).unwrap();
        let cfg = SessionConfig { chunk_size: CS, window: 4, ..SessionConfig::default() };
        let mut s: Vec<_> = (0..2).map(|r| Session::new(Rank(r), cfg, topo.clone(), &HARNESS_KEY).unwrap()).collect();
        for x in &mut s {
            x.open_comm(CommId(1));
        }
        Self { f, s, now: Duration::ZERO }
    }

    fn region(&mut self, rank: u32, bytes: &[u8]) -> Buffer {
        let mut p = self.f.port(Rank(rank)).unwrap();
        let h = p.register(bytes.len()).unwrap();
        p.region_mut(h).unwrap().copy_from_slice(bytes);
        Buffer { region: h, offset: 0, len: bytes.len() as u64 }
    }

    /// Step (at most 200 times) until rank 1 reports `key` complete; whether it did.
    fn run_until_received(&mut self, key: TransferKey) -> bool {
        (0..200).any(|_| self.step().iter().any(|(r, e)| *r == 1 && *e == SessionEvent::RecvComplete(key)))
    }

    fn step(&mut self) -> Vec<(u32, SessionEvent)> {
        let mut out = Vec::new();
        for (r, s) in self.s.iter_mut().enumerate() {
            let mut p = self.f.port(Rank(r as u32)).unwrap();
            s.drive(self.now, &mut p);
            out.extend(std::iter::from_fn(|| s.poll_event()).map(|e| (r as u32, e)));
        }
        self.now = self.f.next_event_time().unwrap_or(self.now + Duration::from_micros(100)).max(self.now);
        out
    }
}

#[test]
fn boundaries_ahead_of_either_side_are_refused() {
    let mut w = World::new();
    let key = TransferKey::new(1, 0, 0, 0, 1);
    let data = vec![5u8; 64 * CS as usize];
    let src = w.region(0, &data);
    let dst = w.region(1, &vec![0; data.len()]);
    let mut p1 = w.f.port(Rank(1)).unwrap();
    w.s[1].expect_recv(w.now, &mut p1, key, dst).unwrap();
    let p0 = w.f.port(Rank(0)).unwrap();
    let lanes = w.s[0].start_send(w.now, &p0, key, src, &[1, 1]).unwrap();
    assert_eq!(lanes.len(), 2);
    // Migrating an active lane is refused.
    let backup = w.s[0].choose_path(lanes[0]).unwrap();
    assert_eq!(w.s[0].handle_migrate(w.now, lanes[0], backup, 0), Err(SessionError::LaneNotQuiesced(lanes[0])));
    for _ in 0..6 {
        w.step();
    }
    w.f.apply(FaultAction::NicDown(NicId::new(0, 0)));
    let mut req = None;
    for _ in 0..3 {
        for (r, e) in w.step() {
            if let SessionEvent::MigrationNeeded(m) = e {
                assert_eq!(r, 0);
                req = Some(m);
            }
        }
    }
    let m = req.expect("a migration request");
    assert_eq!(m.reason, MoveReason::Failure(PathFault::LocalNicDown));
    assert_eq!(m.lane, lanes[0]);
    let held = w.s[1].held(key, m.start, m.end).unwrap();
    assert!(held > m.start, "some chunks arrived before the failure");
    let to = w.s[0].choose_path(m.lane).unwrap();
    assert_eq!(to.local, NicId::new(0, 1));
    // The dead path is refused; so are boundaries beyond either side.
    assert_eq!(w.s[0].handle_migrate(w.now, m.lane, m.from, 0), Err(SessionError::PathDown(m.from)));
    let ahead = m.sender_done + 1;
    assert_eq!(
        w.s[0].handle_migrate(w.now, m.lane, to, ahead),
        Err(SessionError::BoundaryAhead { lane: m.lane, boundary: ahead, sender_done: m.sender_done })
    );
    assert_eq!(
        w.s[1].handle_peer_migrate(w.now, key, m.start, m.end, to.mirror(Rank(0)), held + 1),
        Err(SessionError::BoundaryAheadOfReceiver { key, boundary: held + 1, held })
    );
    let boundary = held.min(m.sender_done);
    w.s[1].handle_peer_migrate(w.now, key, m.start, m.end, to.mirror(Rank(0)), boundary).unwrap();
    w.s[0].handle_migrate(w.now, m.lane, to, boundary).unwrap();
    let mut done = false;
    for _ in 0..10_000 {
        if w.step().iter().any(|(_, e)| *e == SessionEvent::RecvComplete(key)) {
            done = true;
            break;
        }
    }
    assert!(done);
    assert_eq!(w.f.region(Rank(1), dst.region).unwrap(), &data[..]);
    assert_eq!(w.s[1].stats().chunks_applied, 64);
}

#[test]
fn early_chunks_wait_for_their_transfer() {
    let mut w = World::new();
    let key = TransferKey::new(1, 7, 3, 0, 1);
    let data: Vec<u8> = (0..10 * CS + 17).map(|i| (i % 251) as u8).collect();
    let src = w.region(0, &data);
    let dst = w.region(1, &vec![0; data.len()]);
    let p0 = w.f.port(Rank(0)).unwrap();
    w.s[0].start_send(w.now, &p0, key, src, &[1, 1]).unwrap();
    // The receiver listens (another transfer from rank 0 is expected) but not for this one yet.
    let other = TransferKey::new(1, 6, 0, 0, 1);
    let odst = w.region(1, &[0; 10]);
    let mut p1 = w.f.port(Rank(1)).unwrap();
    w.s[1].expect_recv(w.now, &mut p1, other, odst).unwrap();
    for _ in 0..200 {
        w.step();
    }
    assert!(w.s[1].stats().early_stashed > 0);
    let mut p1 = w.f.port(Rank(1)).unwrap();
    w.s[1].expect_recv(w.now, &mut p1, key, dst).unwrap();
    let ev: Vec<_> = std::iter::from_fn(|| w.s[1].poll_event()).collect();
    assert!(ev.contains(&SessionEvent::RecvComplete(key)), "{ev:?}");
    assert_eq!(w.f.region(Rank(1), dst.region).unwrap(), &data[..]);
    assert_eq!(w.s[1].stats().chunks_applied, 11);
}

#[test]
fn a_send_planned_onto_nics_that_went_down_goes_over_the_nics_still_up() {
    // Planned before node 0's NIC 0 failed, the plan weights NIC 0 only: the node's NICs are one
    // pool, so the transfer goes over NIC 1 instead of failing with NoUsableNic.
    let mut w = World::new();
    let key = TransferKey::new(1, 9, 0, 0, 1);
    let data: Vec<u8> = (0..5 * CS + 3).map(|i| (i % 253) as u8).collect();
    let src = w.region(0, &data);
    let dst = w.region(1, &vec![0; data.len()]);
    let mut p0 = w.f.port(Rank(0)).unwrap();
    w.s[0].handle_nic_down(w.now, &mut p0, NicId::new(0, 0));
    let lanes = w.s[0].start_send(w.now, &p0, key, src, &[5, 0]).unwrap();
    assert_eq!(lanes.len(), 1);
    assert!(w.s[0].lanes(key).iter().all(|l| l.path.local == NicId::new(0, 1)), "{:?}", w.s[0].lanes(key));
    let mut p1 = w.f.port(Rank(1)).unwrap();
    w.s[1].expect_recv(w.now, &mut p1, key, dst).unwrap();
    assert!(w.run_until_received(key));
    assert_eq!(w.f.region(Rank(1), dst.region).unwrap(), &data[..]);
    // With every NIC of the node down there is nothing to fall back to.
    let mut p0 = w.f.port(Rank(0)).unwrap();
    w.s[0].handle_nic_down(w.now, &mut p0, NicId::new(0, 1));
    let again = TransferKey::new(1, 10, 0, 0, 1);
    assert_eq!(w.s[0].start_send(w.now, &p0, again, src, &[5, 0]), Err(SessionError::NoUsableNic(again)));
}

#[test]
fn wrong_calls_are_refused() {
    let mut w = World::new();
    let buf = w.region(0, &[0; 100]);
    let p0 = w.f.port(Rank(0)).unwrap();
    let key = TransferKey::new(1, 0, 0, 0, 1);
    assert_eq!(
        w.s[0].start_send(w.now, &p0, TransferKey::new(1, 0, 0, 1, 0), buf, &[1, 1]),
        Err(SessionError::WrongRank { key: TransferKey::new(1, 0, 0, 1, 0), me: Rank(0) })
    );
    assert_eq!(
        w.s[0].start_send(w.now, &p0, TransferKey::new(2, 0, 0, 0, 1), buf, &[1, 1]),
        Err(SessionError::CommNotOpen(CommId(2)))
    );
    assert_eq!(w.s[0].start_send(w.now, &p0, key, buf, &[1]), Err(SessionError::WeightCount { got: 1, nics: 2 }));
    assert_eq!(w.s[0].start_send(w.now, &p0, key, buf, &[0, 0]), Err(SessionError::NoUsableNic(key)));
    let big = Buffer { len: 101, ..buf };
    assert!(matches!(w.s[0].start_send(w.now, &p0, key, big, &[1, 1]), Err(SessionError::Transport(_))));
    w.s[0].start_send(w.now, &p0, key, buf, &[1, 1]).unwrap();
    assert_eq!(w.s[0].start_send(w.now, &p0, key, buf, &[1, 1]), Err(SessionError::DuplicateTransfer(key)));
    assert_eq!(w.s[1].held(key, 0, 1), Err(SessionError::UnknownTransfer(key)));
    let cfg = SessionConfig { chunk_size: 0, ..SessionConfig::default() };
    assert!(Session::new(Rank(0), cfg, Topology::uniform(1, 1, 1, 1).unwrap(), &HARNESS_KEY).is_err());
    assert!(
        Session::new(Rank(5), SessionConfig::default(), Topology::uniform(1, 1, 1, 1).unwrap(), &HARNESS_KEY).is_err()
    );
}

#[test]
fn a_transfer_of_one_configured_chunk_still_stripes_over_every_nic() {
    // 1 MiB chunks configured, a 1 MiB transfer, 2 NICs: cut into 256 KiB chunks, 2 per NIC.
    assert_eq!(r2ccl_transport::transfer_chunk_size(1 << 20, 1 << 20, 2), 256 << 10);
    assert_eq!(r2ccl_transport::transfer_chunk_size(1 << 20, 64 << 20, 2), 1 << 20);
    assert_eq!(r2ccl_transport::transfer_chunk_size(1 << 20, 1000, 4), r2ccl_transport::MIN_STRIPE_CHUNK);
    assert_eq!(r2ccl_transport::transfer_chunk_size(CS, 10, 2), CS, "a configured size below the floor is kept");
    let f = MemFabric::new(FabricConfig { nics_per_node: 2, ..FabricConfig::default() });
    let topo = Topology::uniform(2, 1, 2, 1).unwrap();
    let cfg = SessionConfig { chunk_size: 1 << 20, window: 4, ..SessionConfig::default() };
    let mut s: Vec<_> = (0..2).map(|r| Session::new(Rank(r), cfg, topo.clone(), &HARNESS_KEY).unwrap()).collect();
    for x in &mut s {
        x.open_comm(CommId(1));
    }
    let mut w = World { f, s, now: Duration::ZERO };
    let key = TransferKey::new(1, 0, 0, 0, 1);
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 + i / 251) as u8).collect();
    let src = w.region(0, &data);
    let dst = w.region(1, &vec![0; data.len()]);
    let mut p1 = w.f.port(Rank(1)).unwrap();
    w.s[1].expect_recv(w.now, &mut p1, key, dst).unwrap();
    let p0 = w.f.port(Rank(0)).unwrap();
    let lanes = w.s[0].start_send(w.now, &p0, key, src, &[1, 1]).unwrap();
    assert_eq!(lanes.len(), 2, "both NICs carry a lane");
    assert!(w.run_until_received(key), "the transfer completes");
    let p1 = w.f.port(Rank(1)).unwrap();
    assert!(p1.region(dst.region).unwrap() == data.as_slice(), "bit-exact");
}

#[test]
fn a_reducing_receive_adds_each_chunk_once_into_place() {
    let mut w = World::new();
    let key = TransferKey::new(1, 0, 0, 0, 1);
    let n = 16 * CS as usize / 4;
    let a: Vec<u8> = (0..n as u32).flat_map(|i| i.to_le_bytes()).collect();
    let b: Vec<u8> = (0..n as u32).flat_map(|i| (7 * i + 3).to_le_bytes()).collect();
    let src = w.region(0, &a);
    let dst = w.region(1, &b);
    let mut p1 = w.f.port(Rank(1)).unwrap();
    w.s[1].expect_recv_reduce(w.now, &mut p1, key, dst, DType::U32, ReduceOp::Sum).unwrap();
    let p0 = w.f.port(Rank(0)).unwrap();
    w.s[0].start_send(w.now, &p0, key, src, &[1, 1]).unwrap();
    assert!(w.run_until_received(key), "the transfer completes");
    let p1 = w.f.port(Rank(1)).unwrap();
    let got = p1.region(dst.region).unwrap();
    let want: Vec<u8> = (0..n as u32).flat_map(|i| (8 * i + 3).to_le_bytes()).collect();
    assert!(got == want.as_slice(), "dst = dst + chunk, once per chunk");
    assert_eq!(w.s[1].stats().duplicates, 0);
}

#[test]
fn a_reducing_receive_of_partial_elements_is_refused() {
    let mut w = World::new();
    let key = TransferKey::new(1, 0, 0, 0, 1);
    let dst = w.region(1, &[0u8; 10]);
    let mut p1 = w.f.port(Rank(1)).unwrap();
    let e = w.s[1].expect_recv_reduce(w.now, &mut p1, key, dst, DType::F64, ReduceOp::Sum).unwrap_err();
    assert_eq!(e, SessionError::Misaligned { key, len: 10, dtype: DType::F64 });
}

#[test]
fn consecutive_single_chunk_transfers_take_turns_on_the_nics() {
    let mut w = World::new();
    let src = w.region(0, &[1u8; 100]);
    let p0 = w.f.port(Rank(0)).unwrap();
    let mut nics = Vec::new();
    for step in 0..4 {
        let key = TransferKey::new(1, 0, step, 0, 1);
        w.s[0].start_send(w.now, &p0, key, src, &[1, 1]).unwrap();
        let lanes = w.s[0].lanes(key);
        assert_eq!(lanes.len(), 1, "one chunk, one lane");
        nics.push(lanes[0].primary.local.rail.0);
    }
    assert_eq!(nics, vec![1, 0, 1, 0]);
}
