//! Control messages between the engines of two ranks, carried on the OOB `Detect` channel:
//! path-down notices (bilateral awareness), NIC state broadcasts (hot repair), the
//! lane migration protocol's request and acknowledgement (`r2ccl_transport::migrate`; replay boundary =
//! min(sender done, receiver holds)), transfer receipts, probe results, and verdicts that blame
//! a NIC (sent to the lead rank of its node, which alone announces it).

use r2ccl_core::{NicId, Rank};
use r2ccl_transport::migrate::{MigrateAck, MigrateReq};
use r2ccl_transport::{CommId, LaneId, PathId, TransferKey};

/// What a [`Ctrl::NicState`] announces about a NIC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NicStatus {
    /// It carries traffic (its link came back, or a blamed NIC answers probes again).
    Up,
    /// Its link is down: it cannot carry traffic until the link returns.
    LinkDown,
    /// A localization verdict took it out while its link is up: its node is not gone while it has
    /// such a NIC, which its lead puts back if the node's other NICs go down.
    Blamed,
}

impl NicStatus {
    /// Whether the NIC carries traffic.
    pub const fn is_up(self) -> bool {
        matches!(self, Self::Up)
    }

    const fn byte(self) -> u8 {
        match self {
            Self::LinkDown => 0,
            Self::Up => 1,
            Self::Blamed => 2,
        }
    }

    const fn from_byte(b: u8) -> Option<Self> {
        match b {
            0 => Some(Self::LinkDown),
            1 => Some(Self::Up),
            2 => Some(Self::Blamed),
            _ => None,
        }
    }
}

/// One control message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ctrl {
    /// The sender marked this path (its view) down; the receiver marks the mirror down.
    PathDown {
        /// The sender's NIC.
        local: NicId,
        /// The receiver's NIC.
        remote: NicId,
    },
    /// A NIC of the sender's node changed state.
    NicState {
        /// The NIC.
        nic: NicId,
        /// Its new state.
        state: NicStatus,
    },
    /// FAILOVER_REQ (sender to receiver) of the lane migration protocol
    /// ([`r2ccl_transport::migrate`]).
    MigrateReq(MigrateReq),
    /// FAILOVER_ACK (receiver to sender) of the lane migration protocol.
    MigrateAck(MigrateAck),
    /// Receiver to sender: every byte of `key` arrived; the source may be released.
    RecvDone {
        /// The transfer.
        key: TransferKey,
    },
    /// Receiver to sender: chunk `index` of `key` arrived before its transfer was expected
    /// and could not be kept; replay the lane that holds it.
    Nack {
        /// The transfer.
        key: TransferKey,
        /// The chunk that was dropped.
        index: u32,
    },
    /// To the lead rank of `nic`'s node: a failure detector's verdict blames `nic` (`failed`), or
    /// a path through it it had blamed answers again (`!failed`). The lead decides and announces
    /// the NIC's state with `NicState`, so that concurrent verdicts never take a node's last NIC.
    Blame {
        /// The NIC.
        nic: NicId,
        /// Blamed (true) or answering again (false).
        failed: bool,
    },
    /// A probe over this path (sender's view) got through; the receiver marks the mirror up.
    PathUp {
        /// The sender's NIC.
        local: NicId,
        /// The receiver's NIC.
        remote: NicId,
    },
}

/// A control message that did not decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed control message ({0})")]
pub struct CtrlError(&'static str);

struct W(Vec<u8>);

impl W {
    fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn nic(&mut self, n: NicId) -> &mut Self {
        self.u32(n.node.0).u16(n.rail.0)
    }
    fn key(&mut self, k: TransferKey) -> &mut Self {
        self.u64(k.comm.0).u64(k.seq).u32(k.step).u32(k.src.0).u32(k.dst.0)
    }
}

struct R<'a>(&'a [u8]);

impl R<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], CtrlError> {
        let (head, rest) = self.0.split_at_checked(N).ok_or(CtrlError("truncated"))?;
        self.0 = rest;
        let mut out = [0u8; N];
        out.copy_from_slice(head);
        Ok(out)
    }
    fn u8(&mut self) -> Result<u8, CtrlError> {
        Ok(self.take::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, CtrlError> {
        Ok(u16::from_le_bytes(self.take()?))
    }
    fn u32(&mut self) -> Result<u32, CtrlError> {
        Ok(u32::from_le_bytes(self.take()?))
    }
    fn u64(&mut self) -> Result<u64, CtrlError> {
        Ok(u64::from_le_bytes(self.take()?))
    }
    fn nic(&mut self) -> Result<NicId, CtrlError> {
        Ok(NicId::new(self.u32()?, self.u16()?))
    }
    fn key(&mut self) -> Result<TransferKey, CtrlError> {
        Ok(TransferKey {
            comm: CommId(self.u64()?),
            seq: self.u64()?,
            step: self.u32()?,
            src: Rank(self.u32()?),
            dst: Rank(self.u32()?),
        })
    }
}

const VERSION: u8 = 1;

impl Ctrl {
    /// Encode with a version byte and a kind byte.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = W(Vec::with_capacity(64));
        w.u8(VERSION);
        match *self {
            Ctrl::PathDown { local, remote } => w.u8(1).nic(local).nic(remote),
            Ctrl::NicState { nic, state } => w.u8(2).nic(nic).u8(state.byte()),
            Ctrl::MigrateReq(MigrateReq { lane, start, end, sender_done, local, remote, epoch }) => w
                .u8(3)
                .key(lane.transfer)
                .u16(lane.lane)
                .u32(start)
                .u32(end)
                .u32(sender_done)
                .nic(local)
                .nic(remote)
                .u32(epoch),
            Ctrl::MigrateAck(MigrateAck { lane, boundary, epoch }) => {
                w.u8(4).key(lane.transfer).u16(lane.lane).u32(boundary).u32(epoch)
            }
            Ctrl::RecvDone { key } => w.u8(5).key(key),
            Ctrl::PathUp { local, remote } => w.u8(6).nic(local).nic(remote),
            Ctrl::Nack { key, index } => w.u8(7).key(key).u32(index),
            Ctrl::Blame { nic, failed } => w.u8(8).nic(nic).u8(u8::from(failed)),
        };
        w.0
    }

    /// Decode; never panics on any bytes.
    pub fn decode(bytes: &[u8]) -> Result<Self, CtrlError> {
        let mut r = R(bytes);
        if r.u8()? != VERSION {
            return Err(CtrlError("unknown version"));
        }
        let msg = match r.u8()? {
            1 => Ctrl::PathDown { local: r.nic()?, remote: r.nic()? },
            2 => Ctrl::NicState {
                nic: r.nic()?,
                state: NicStatus::from_byte(r.u8()?).ok_or(CtrlError("unknown NIC state"))?,
            },
            3 => Ctrl::MigrateReq(MigrateReq {
                lane: LaneId { transfer: r.key()?, lane: r.u16()? },
                start: r.u32()?,
                end: r.u32()?,
                sender_done: r.u32()?,
                local: r.nic()?,
                remote: r.nic()?,
                epoch: r.u32()?,
            }),
            4 => Ctrl::MigrateAck(MigrateAck {
                lane: LaneId { transfer: r.key()?, lane: r.u16()? },
                boundary: r.u32()?,
                epoch: r.u32()?,
            }),
            5 => Ctrl::RecvDone { key: r.key()? },
            6 => Ctrl::PathUp { local: r.nic()?, remote: r.nic()? },
            7 => Ctrl::Nack { key: r.key()?, index: r.u32()? },
            8 => Ctrl::Blame { nic: r.nic()?, failed: r.u8()? != 0 },
            _ => return Err(CtrlError("unknown kind")),
        };
        if !r.0.is_empty() {
            return Err(CtrlError("trailing bytes"));
        }
        Ok(msg)
    }

    /// The path a `PathDown`/`PathUp` names, in the receiver's view.
    pub fn mirrored(local: NicId, remote: NicId, sender: Rank) -> PathId {
        PathId { local: remote, peer: sender, remote: local }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_garbage() {
        let key = TransferKey::new(7, 9, 3, 1, 2);
        let msgs = [
            Ctrl::PathDown { local: NicId::new(0, 1), remote: NicId::new(1, 1) },
            Ctrl::NicState { nic: NicId::new(2, 0), state: NicStatus::LinkDown },
            Ctrl::NicState { nic: NicId::new(2, 1), state: NicStatus::Up },
            Ctrl::NicState { nic: NicId::new(2, 1), state: NicStatus::Blamed },
            Ctrl::MigrateReq(MigrateReq {
                lane: LaneId { transfer: key, lane: 1 },
                start: 4,
                end: 9,
                sender_done: 6,
                local: NicId::new(1, 0),
                remote: NicId::new(2, 0),
                epoch: 2,
            }),
            Ctrl::MigrateAck(MigrateAck { lane: LaneId { transfer: key, lane: 1 }, boundary: 5, epoch: 2 }),
            Ctrl::RecvDone { key },
            Ctrl::PathUp { local: NicId::new(0, 1), remote: NicId::new(1, 1) },
            Ctrl::Nack { key, index: 3 },
            Ctrl::Blame { nic: NicId::new(3, 1), failed: true },
            Ctrl::Blame { nic: NicId::new(3, 0), failed: false },
        ];
        for m in msgs {
            let b = m.encode();
            assert_eq!(Ctrl::decode(&b), Ok(m));
            for cut in 0..b.len() {
                assert!(Ctrl::decode(&b[..cut]).is_err());
            }
        }
        assert!(Ctrl::decode(&[1, 99]).is_err());
        assert!(Ctrl::decode(&[2, 1]).is_err());
        let mut bad_state = Ctrl::NicState { nic: NicId::new(2, 1), state: NicStatus::Up }.encode();
        if let Some(last) = bad_state.last_mut() {
            *last = 3;
        }
        assert_eq!(Ctrl::decode(&bad_state), Err(CtrlError("unknown NIC state")));
    }
}
