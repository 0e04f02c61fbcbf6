//! The OOB control-message wire format: versioned, length-prefixed frames.
//!
//! Frame: `version: u8 (= 1) | kind: u8 | payload length: u16 LE | payload`. All integers
//! are little-endian; a NIC is `node: u32 | rail: u16`. The messages are those of
//! localization: a probe request (kind 4) and its report (kind 5). Kinds 1-3, 6 and 7 were the
//! connection failover protocol's, which lanes now run through `r2ccl_transport::migrate`;
//! they are unknown kinds here. Decoding any byte string returns a message or a
//! [`WireError`], never panics.

use crate::triangulate::Observation;
use r2ccl_core::{NicId, NodeId, RailId};

/// The wire format version this crate writes and reads.
pub const WIRE_VERSION: u8 = 1;
/// Bytes of the frame header.
pub const HEADER_LEN: usize = 4;

/// An OOB control message between detectors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OobMessage {
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

const K_PROBE_REQ: u8 = 4;
const K_PROBE_REP: u8 = 5;

const NIC: usize = 6;

fn payload_len(kind: u8) -> Option<usize> {
    Some(match kind {
        K_PROBE_REQ => 8 + 2 * NIC,
        K_PROBE_REP => 8 + 1,
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
            OobMessage::ProbeRequest { .. } => K_PROBE_REQ,
            OobMessage::ProbeReport { .. } => K_PROBE_REP,
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
            OobMessage::ProbeRequest { id, from, to } => {
                w.u64(id);
                w.nic(from);
                w.nic(to);
            }
            OobMessage::ProbeReport { id, outcome } => {
                w.u64(id);
                w.u8(observation_byte(outcome));
            }
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
            K_PROBE_REQ => OobMessage::ProbeRequest { id: r.u64()?, from: r.nic()?, to: r.nic()? },
            K_PROBE_REP => OobMessage::ProbeReport { id: r.u64()?, outcome: r.observation()? },
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
        let m = OobMessage::ProbeReport { id: 4, outcome: Observation::Timeout };
        let b = m.encode();
        assert_eq!(b, [1, 5, 9, 0, 4, 0, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(OobMessage::decode(&b), Ok(m));
        let mut bad = b.clone();
        bad[0] = 9;
        assert_eq!(OobMessage::decode(&bad), Err(WireError::Version(9)));
        assert!(matches!(OobMessage::decode(&b[..10]), Err(WireError::Truncated { .. })));
        let mut two = b.clone();
        two.extend_from_slice(&b);
        assert_eq!(OobMessage::decode(&two), Err(WireError::Trailing(13)));
        assert_eq!(OobMessage::decode_prefix(&two), Ok((m, 13)));
        let req = OobMessage::ProbeRequest { id: 7, from: NicId::new(2, 1), to: NicId::new(3, 0) };
        assert_eq!(&req.encode()[..4], &[1, 4, 20, 0]);
    }

    #[test]
    fn the_retired_failover_kinds_are_unknown() {
        for kind in [1, 2, 3, 6, 7] {
            assert_eq!(
                OobMessage::decode(&[WIRE_VERSION, kind, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
                Err(WireError::Kind(kind))
            );
        }
    }
}
