//! The OOB control-message wire format: versioned, length-prefixed frames.
//!
//! Frame: `version: u8 (= 1) | kind: u8 | payload length: u16 LE | payload`. All integers
//! are little-endian; a NIC is `node: u32 | rail: u16`, a connection `src: u32 | dst: u32 |
//! chan: u32`. Decoding any byte string returns a message or a [`WireError`], never panics.

use crate::ids::{ConnId, FailoverEpoch, PathPair};
use crate::triangulate::Observation;
use r2ccl_core::{NicId, NodeId, RailId, Rank};

/// The wire format version this crate writes and reads.
pub const WIRE_VERSION: u8 = 1;
/// Bytes of the frame header.
pub const HEADER_LEN: usize = 4;

/// Why a migration is requested.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MigrationReason {
    /// The current path failed.
    Failover,
    /// A more preferred path recovered.
    FailBack,
}

/// An OOB control message between detectors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OobMessage {
    /// Sender to receiver: "I move `conn` to chain entry `index` (`path`); my last completed
    /// chunk count is `sender_done`".
    FailoverReq {
        /// The connection.
        conn: ConnId,
        /// The new failover epoch.
        epoch: FailoverEpoch,
        /// Chunks the sender completed (the boundary can be no later).
        sender_done: u64,
        /// Failover or fail-back.
        reason: MigrationReason,
        /// Index of the new path in the connection's chain.
        index: u16,
        /// The new path (checked against the receiver's chain).
        path: PathPair,
    },
    /// Receiver to sender: "I rolled back to `applied`" (the replay boundary).
    FailoverAck {
        /// The connection.
        conn: ConnId,
        /// The epoch acknowledged.
        epoch: FailoverEpoch,
        /// min(sender_done, chunks the receiver really holds).
        applied: u64,
    },
    /// Receiver to sender when only the receiver saw the failure; resent until a REQ comes.
    FailoverHint {
        /// The connection.
        conn: ConnId,
        /// The epoch the receiver expects the failover to have.
        epoch_hint: FailoverEpoch,
        /// Chunks the receiver holds.
        receiver_seen: u64,
    },
    /// "Probe NIC `to` from your NIC `from` and report" (to the peer or an auxiliary node).
    ProbeRequest {
        /// The requester's id for this request.
        id: u64,
        /// The prober's NIC.
        from: NicId,
        /// The probed NIC.
        to: NicId,
    },
    /// The outcome of a requested probe.
    ProbeReport {
        /// The request's id.
        id: u64,
        /// What the probe saw.
        outcome: Observation,
    },
    /// Hot-repair broadcast: `conn` moved off `failed` at `epoch`; re-plan at the next
    /// collective.
    HotRepair {
        /// The notice's id (unique per origin).
        id: u64,
        /// The connection that moved.
        conn: ConnId,
        /// Its new epoch.
        epoch: FailoverEpoch,
        /// The path it left.
        failed: PathPair,
        /// Failover or fail-back.
        reason: MigrationReason,
    },
    /// Acknowledges a hot-repair notice.
    HotRepairAck {
        /// The notice's id.
        id: u64,
    },
}

/// Why a byte string is not a valid OOB frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Fewer bytes than the header or the declared payload needs.
    #[error("truncated frame: need {needed} bytes, have {have}")]
    Truncated {
        /// Bytes needed.
        needed: usize,
        /// Bytes present.
        have: usize,
    },
    /// A version this crate does not speak.
    #[error("unsupported wire version {0} (this build speaks {WIRE_VERSION})")]
    Version(u8),
    /// An unknown message kind.
    #[error("unknown message kind {0}")]
    Kind(u8),
    /// A field holds a value outside its range.
    #[error("field {field} has invalid value {value}")]
    BadValue {
        /// The field's name.
        field: &'static str,
        /// The value found.
        value: u64,
    },
    /// The payload length does not match what the kind needs.
    #[error("payload of kind {kind} is {len} bytes, expected {expected}")]
    PayloadLength {
        /// The message kind.
        kind: u8,
        /// Declared payload length.
        len: usize,
        /// Length the kind needs.
        expected: usize,
    },
    /// Bytes after the frame where exactly one frame was expected.
    #[error("{0} trailing bytes after the frame")]
    Trailing(usize),
}

const K_REQ: u8 = 1;
const K_ACK: u8 = 2;
const K_HINT: u8 = 3;
const K_PROBE_REQ: u8 = 4;
const K_PROBE_REP: u8 = 5;
const K_REPAIR: u8 = 6;
const K_REPAIR_ACK: u8 = 7;

const CONN: usize = 12;
const NIC: usize = 6;

fn payload_len(kind: u8) -> Option<usize> {
    Some(match kind {
        K_REQ => CONN + 8 + 8 + 1 + 2 + 2 * NIC,
        K_ACK => CONN + 8 + 8,
        K_HINT => CONN + 8 + 8,
        K_PROBE_REQ => 8 + 2 * NIC,
        K_PROBE_REP => 8 + 1,
        K_REPAIR => 8 + CONN + 8 + 2 * NIC + 1,
        K_REPAIR_ACK => 8,
        _ => return None,
    })
}

struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn nic(&mut self, n: NicId) {
        self.u32(n.node.0);
        self.u16(n.rail.0);
    }
    fn conn(&mut self, c: ConnId) {
        self.u32(c.src.0);
        self.u32(c.dst.0);
        self.u32(c.chan);
    }
    fn path(&mut self, p: PathPair) {
        self.nic(p.src_nic);
        self.nic(p.dst_nic);
    }
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let Some((head, rest)) = self.buf.split_first_chunk::<N>() else {
            return Err(WireError::Truncated { needed: N, have: self.buf.len() });
        };
        self.buf = rest;
        Ok(*head)
    }
    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.take()?))
    }
    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.take()?))
    }
    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.take()?))
    }
    fn nic(&mut self) -> Result<NicId, WireError> {
        Ok(NicId { node: NodeId(self.u32()?), rail: RailId(self.u16()?) })
    }
    fn conn(&mut self) -> Result<ConnId, WireError> {
        Ok(ConnId { src: Rank(self.u32()?), dst: Rank(self.u32()?), chan: self.u32()? })
    }
    fn path(&mut self) -> Result<PathPair, WireError> {
        Ok(PathPair { src_nic: self.nic()?, dst_nic: self.nic()? })
    }
    fn reason(&mut self) -> Result<MigrationReason, WireError> {
        match self.u8()? {
            0 => Ok(MigrationReason::Failover),
            1 => Ok(MigrationReason::FailBack),
            v => Err(WireError::BadValue { field: "reason", value: u64::from(v) }),
        }
    }
    fn observation(&mut self) -> Result<Observation, WireError> {
        match self.u8()? {
            0 => Ok(Observation::Ok),
            1 => Ok(Observation::Timeout),
            2 => Ok(Observation::LocalError),
            3 => Ok(Observation::Unknown),
            v => Err(WireError::BadValue { field: "outcome", value: u64::from(v) }),
        }
    }
}

fn reason_byte(r: MigrationReason) -> u8 {
    match r {
        MigrationReason::Failover => 0,
        MigrationReason::FailBack => 1,
    }
}

fn observation_byte(o: Observation) -> u8 {
    match o {
        Observation::Ok => 0,
        Observation::Timeout => 1,
        Observation::LocalError => 2,
        Observation::Unknown => 3,
    }
}

impl OobMessage {
    fn kind(&self) -> u8 {
        match self {
            OobMessage::FailoverReq { .. } => K_REQ,
            OobMessage::FailoverAck { .. } => K_ACK,
            OobMessage::FailoverHint { .. } => K_HINT,
            OobMessage::ProbeRequest { .. } => K_PROBE_REQ,
            OobMessage::ProbeReport { .. } => K_PROBE_REP,
            OobMessage::HotRepair { .. } => K_REPAIR,
            OobMessage::HotRepairAck { .. } => K_REPAIR_ACK,
        }
    }

    /// The message as one frame.
    pub fn encode(&self) -> Vec<u8> {
        let kind = self.kind();
        let len = payload_len(kind).unwrap_or(0);
        let mut w = Writer(Vec::with_capacity(HEADER_LEN + len));
        w.u8(WIRE_VERSION);
        w.u8(kind);
        w.u16(len as u16);
        match *self {
            OobMessage::FailoverReq { conn, epoch, sender_done, reason, index, path } => {
                w.conn(conn);
                w.u64(epoch.0);
                w.u64(sender_done);
                w.u8(reason_byte(reason));
                w.u16(index);
                w.path(path);
            }
            OobMessage::FailoverAck { conn, epoch, applied } => {
                w.conn(conn);
                w.u64(epoch.0);
                w.u64(applied);
            }
            OobMessage::FailoverHint { conn, epoch_hint, receiver_seen } => {
                w.conn(conn);
                w.u64(epoch_hint.0);
                w.u64(receiver_seen);
            }
            OobMessage::ProbeRequest { id, from, to } => {
                w.u64(id);
                w.nic(from);
                w.nic(to);
            }
            OobMessage::ProbeReport { id, outcome } => {
                w.u64(id);
                w.u8(observation_byte(outcome));
            }
            OobMessage::HotRepair { id, conn, epoch, failed, reason } => {
                w.u64(id);
                w.conn(conn);
                w.u64(epoch.0);
                w.path(failed);
                w.u8(reason_byte(reason));
            }
            OobMessage::HotRepairAck { id } => w.u64(id),
        }
        w.0
    }

    /// Decode the first frame of `buf`; returns the message and the bytes it used, so a
    /// stream of frames can be read one after another.
    pub fn decode_prefix(buf: &[u8]) -> Result<(Self, usize), WireError> {
        let Some((header, body)) = buf.split_first_chunk::<HEADER_LEN>() else {
            return Err(WireError::Truncated { needed: HEADER_LEN, have: buf.len() });
        };
        let [version, kind, l0, l1] = *header;
        if version != WIRE_VERSION {
            return Err(WireError::Version(version));
        }
        let expected = payload_len(kind).ok_or(WireError::Kind(kind))?;
        let len = usize::from(u16::from_le_bytes([l0, l1]));
        if len != expected {
            return Err(WireError::PayloadLength { kind, len, expected });
        }
        let payload = body.get(..len).ok_or(WireError::Truncated { needed: HEADER_LEN + len, have: buf.len() })?;
        let mut r = Reader { buf: payload };
        let msg = match kind {
            K_REQ => OobMessage::FailoverReq {
                conn: r.conn()?,
                epoch: FailoverEpoch(r.u64()?),
                sender_done: r.u64()?,
                reason: r.reason()?,
                index: r.u16()?,
                path: r.path()?,
            },
            K_ACK => OobMessage::FailoverAck { conn: r.conn()?, epoch: FailoverEpoch(r.u64()?), applied: r.u64()? },
            K_HINT => OobMessage::FailoverHint {
                conn: r.conn()?,
                epoch_hint: FailoverEpoch(r.u64()?),
                receiver_seen: r.u64()?,
            },
            K_PROBE_REQ => OobMessage::ProbeRequest { id: r.u64()?, from: r.nic()?, to: r.nic()? },
            K_PROBE_REP => OobMessage::ProbeReport { id: r.u64()?, outcome: r.observation()? },
            K_REPAIR => OobMessage::HotRepair {
                id: r.u64()?,
                conn: r.conn()?,
                epoch: FailoverEpoch(r.u64()?),
                failed: r.path()?,
                reason: r.reason()?,
            },
            K_REPAIR_ACK => OobMessage::HotRepairAck { id: r.u64()? },
            other => return Err(WireError::Kind(other)),
        };
        if !r.buf.is_empty() {
            return Err(WireError::Trailing(r.buf.len()));
        }
        Ok((msg, HEADER_LEN + len))
    }

    /// Decode exactly one frame; trailing bytes are an error.
    pub fn decode(buf: &[u8]) -> Result<Self, WireError> {
        let (msg, used) = Self::decode_prefix(buf)?;
        match buf.len() - used {
            0 => Ok(msg),
            extra => Err(WireError::Trailing(extra)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_layout_is_stable() {
        let m = OobMessage::FailoverAck { conn: ConnId::new(1, 2, 3), epoch: FailoverEpoch(4), applied: 5 };
        let b = m.encode();
        assert_eq!(&b[..4], &[1, 2, 28, 0]);
        assert_eq!(b.len(), 32);
        assert_eq!(OobMessage::decode(&b), Ok(m));
        let mut bad = b.clone();
        bad[0] = 9;
        assert_eq!(OobMessage::decode(&bad), Err(WireError::Version(9)));
        assert!(matches!(OobMessage::decode(&b[..10]), Err(WireError::Truncated { .. })));
        let mut two = b.clone();
        two.extend_from_slice(&b);
        assert_eq!(OobMessage::decode(&two), Err(WireError::Trailing(32)));
        assert_eq!(OobMessage::decode_prefix(&two), Ok((m, 32)));
    }
}
