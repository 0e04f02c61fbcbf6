//! An engine fed control messages that a job's own rank could forge: ones about paths, NICs and
//! transfers the sender cannot speak for change nothing and are reported, and receipts for sends
//! not started yet are kept only within a window and up to a bound.
#![allow(clippy::unwrap_used, reason = "test code: a panic is a failure")]

use crate::ctrl::{Ctrl, NicStatus};
use crate::engine::{Engine, EngineConfig, EngineEvent, FRAME_CTRL};
use r2ccl_core::{NicId, Rank};
use r2ccl_transport::{FabricConfig, MemFabric, Topology, TransferKey};
use std::time::Duration;

struct One {
    fabric: MemFabric,
    engine: Engine,
}

impl One {
    /// Rank 0 of 3 nodes, one rank and 2 NICs each.
    fn new() -> Self {
        let fabric =
            MemFabric::new(FabricConfig { nodes: 3, ranks_per_node: 1, nics_per_node: 2, ..FabricConfig::default() });
        let topo = Topology::uniform(3, 1, 2, 1).unwrap();
        Self { fabric, engine: Engine::new(Rank(0), 3, EngineConfig::default(), topo).unwrap() }
    }

    /// Deliver `msg` from `from`; returns the bad-input reports it caused.
    fn feed(&mut self, from: u32, msg: &Ctrl) -> Vec<String> {
        let mut frame = vec![FRAME_CTRL];
        frame.extend(msg.encode());
        let mut port = self.fabric.port(Rank(0)).unwrap();
        self.engine.handle_ctrl(Duration::from_millis(1), &mut port, Rank(from), &frame).unwrap();
        let mut bad = Vec::new();
        while let Some(ev) = self.engine.poll_event() {
            if let EngineEvent::BadInput { from: f, what } = ev {
                assert_eq!(f, Rank(from));
                bad.push(what);
            }
        }
        bad
    }
}

#[test]
fn messages_about_what_the_sender_cannot_speak_for_change_nothing() {
    let mut one = One::new();
    let cases = [
        // A path of another pair of nodes, and one through a NIC no node has.
        Ctrl::PathDown { local: NicId::new(2, 0), remote: NicId::new(0, 0) },
        Ctrl::PathDown { local: NicId::new(1, 0), remote: NicId::new(0, 7) },
        Ctrl::PathUp { local: NicId::new(1, 9), remote: NicId::new(0, 0) },
        Ctrl::NicState { nic: NicId::new(7, 0), state: NicStatus::LinkDown },
        Ctrl::NicState { nic: NicId::new(2, 0), state: NicStatus::LinkDown },
        Ctrl::Blame { nic: NicId::new(0, 5), failed: true },
        // Transfers rank 1 does not receive, or of another communicator.
        Ctrl::RecvDone { key: TransferKey::new(1, 1, 0, 0, 2) },
        Ctrl::RecvDone { key: TransferKey::new(99, 1, 0, 0, 1) },
        Ctrl::Nack { key: TransferKey::new(1, 1, 0, 0, 2), index: 0 },
    ];
    for msg in &cases {
        let bad = one.feed(1, msg);
        assert_eq!(bad.len(), 1, "{msg:?} reported once: {bad:?}");
    }
    assert_eq!(one.engine.early_receipts(), 0, "no receipt kept");
    assert!(one.engine.down_nics().is_empty(), "no NIC taken down");
    // A well-addressed one is taken.
    assert!(one.feed(1, &Ctrl::PathDown { local: NicId::new(1, 1), remote: NicId::new(0, 1) }).is_empty());
}

#[test]
fn receipts_for_sends_not_started_are_bounded() {
    let mut one = One::new();
    let (mut kept, mut refused) = (0usize, 0usize);
    // Receipts of rank 1 for the first 200 collectives, 40 steps each.
    for seq in 0..200u64 {
        for step in 0..40u32 {
            let bad = one.feed(1, &Ctrl::RecvDone { key: TransferKey::new(1, seq, step, 0, 1) });
            if bad.is_empty() {
                kept += 1;
            } else {
                assert!(bad[0].contains("far from starting"), "{bad:?}");
                refused += 1;
            }
        }
    }
    // Collectives 0 to 64 ahead are kept (65 x 40 = 2,600), up to the bound; the rest refused.
    assert_eq!((kept, refused), (65 * 40, 200 * 40 - 65 * 40));
    assert_eq!(one.engine.early_receipts(), 65 * 40);
    // The bound: 4,096 in all, whatever the window holds.
    let mut one = One::new();
    let mut refused = 0;
    for seq in 0..=64u64 {
        for step in 0..100u32 {
            refused += one.feed(1, &Ctrl::RecvDone { key: TransferKey::new(1, seq, step, 0, 1) }).len();
        }
    }
    assert_eq!(one.engine.early_receipts(), 4096);
    assert_eq!(refused, 65 * 100 - 4096);
}
