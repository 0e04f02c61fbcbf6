//! The communicator's OOB messages as one typed enum: every payload the facade sends on the mesh
//! is built by [`Msg::encode`] and read by [`Msg::decode`], nowhere by hand.
//!
//! Wire form: the [`Channel`] of the frame, then a payload per channel. `Control` and `Abort`
//! and `Agree` payloads start with a kind byte (`Agree` carries the health-view switch, its views
//! as `agree::encode_view` writes them); `Detect` carries the engine's own frames, which their
//! decoders read (this module only carries them).
//! A payload that does not decode is a [`MsgError`], counted and dropped by the caller, never a
//! panic.

use super::Channel;
use crate::agree::{decode_view, encode_view, AgreeError};
use crate::switch::SwitchMsg;

/// `Control`: a rank's UCX address blob (setup).
const ADDRESS: u8 = 1;
/// `Control`: a collective's arguments as this rank called it (the argument check).
const ARG_CHECK: u8 = 2;
/// `Abort`: an argument mismatch found at a collective.
const MISMATCH: u8 = 1;
/// `Abort`: the communicator is aborted, with a reason.
const REASON: u8 = 2;
/// `Abort`: the sender leaves the communicator (its disconnect is not a failure).
const DEPART: u8 = 3;

/// `Agree`: a rank's view and first collective not started, to the leader.
const JOIN: u8 = 1;
/// `Agree`: the leader opens a round.
const FREEZE: u8 = 2;
/// `Agree`: the leader's decision.
const DECIDE: u8 = 3;

/// The longest argument description kept (a line of text).
pub(crate) const MAX_DESC: usize = 4096;

/// One OOB message of the communicator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Msg {
    /// The sender's UCX address blob, at setup.
    Address(Vec<u8>),
    /// How the sender called collective `seq` (compared with this rank's call).
    ArgCheck { seq: u64, desc: String },
    /// A message of the health-view switch.
    Switch(SwitchMsg),
    /// An engine frame (control or detection protocol), decoded by the engine.
    Engine(Vec<u8>),
    /// The sender found an argument mismatch at collective `seq`.
    Mismatch { seq: u64, detail: String },
    /// The sender aborted the communicator.
    Abort { reason: String },
    /// The sender leaves after collective `last_done`.
    Depart { last_done: u64 },
    /// Liveness only.
    Heartbeat,
}

/// Why a payload is not a message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum MsgError {
    /// The payload is empty where a kind byte is needed.
    #[error("an empty {0:?} message")]
    Empty(Channel),
    /// The kind byte names no message of the channel.
    #[error("unknown {channel:?} message kind {kind}")]
    UnknownKind { channel: Channel, kind: u8 },
    /// The payload ends before its fixed fields.
    #[error("a truncated {0} message")]
    Truncated(&'static str),
    /// A health view that does not decode.
    #[error("a malformed health view: {0}")]
    View(&'static str),
}

fn u64_at(bytes: &[u8], what: &'static str) -> Result<u64, MsgError> {
    bytes.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()).map(u64::from_le_bytes).ok_or(MsgError::Truncated(what))
}

/// A line of text: at most [`MAX_DESC`] bytes of it, cut at a character boundary (so the text
/// encodes back to bytes that decode to itself).
fn text(bytes: &[u8]) -> String {
    let mut s = String::from_utf8_lossy(&bytes[..bytes.len().min(MAX_DESC)]).into_owned();
    let mut end = s.len().min(MAX_DESC);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s
}

impl Msg {
    /// The channel and payload of this message.
    pub(crate) fn encode(&self) -> (Channel, Vec<u8>) {
        let with = |kind: u8, head: &[u8], tail: &[u8]| {
            let mut v = Vec::with_capacity(1 + head.len() + tail.len());
            v.push(kind);
            v.extend_from_slice(head);
            v.extend_from_slice(tail);
            v
        };
        match self {
            Msg::Address(blob) => (Channel::Control, with(ADDRESS, &[], blob)),
            Msg::ArgCheck { seq, desc } => (Channel::Control, with(ARG_CHECK, &seq.to_le_bytes(), desc.as_bytes())),
            Msg::Switch(SwitchMsg::Join { round, next, view }) => {
                (Channel::Agree, with(JOIN, &next.to_le_bytes(), &encode_view(*round, view)))
            }
            Msg::Switch(SwitchMsg::Freeze { round }) => (Channel::Agree, with(FREEZE, &round.to_le_bytes(), &[])),
            Msg::Switch(SwitchMsg::Decide { round, at, view }) => {
                (Channel::Agree, with(DECIDE, &at.to_le_bytes(), &encode_view(*round, view)))
            }
            Msg::Engine(bytes) => (Channel::Detect, bytes.clone()),
            Msg::Mismatch { seq, detail } => (Channel::Abort, with(MISMATCH, &seq.to_le_bytes(), detail.as_bytes())),
            Msg::Abort { reason } => (Channel::Abort, with(REASON, &[], reason.as_bytes())),
            Msg::Depart { last_done } => (Channel::Abort, with(DEPART, &last_done.to_le_bytes(), &[])),
            Msg::Heartbeat => (Channel::Heartbeat, Vec::new()),
        }
    }

    /// The message a received frame carries, taking its payload (engine frames are passed on
    /// without a copy).
    pub(crate) fn from_frame(channel: Channel, payload: Vec<u8>) -> Result<Msg, MsgError> {
        match channel {
            Channel::Detect => Ok(Msg::Engine(payload)),
            _ => Self::decode(channel, &payload),
        }
    }

    /// The message a frame of `channel` carries.
    pub(crate) fn decode(channel: Channel, payload: &[u8]) -> Result<Msg, MsgError> {
        let kinded = || payload.split_first().ok_or(MsgError::Empty(channel));
        Ok(match channel {
            Channel::Heartbeat => Msg::Heartbeat,
            Channel::Agree => {
                let view = |rest: &[u8]| {
                    decode_view(0, rest).map_err(|e| match e {
                        AgreeError::Malformed { why, .. } => MsgError::View(why),
                        _ => MsgError::View("unreadable"),
                    })
                };
                match kinded()? {
                    (&JOIN, rest) => {
                        let (round, view) = view(rest.get(8..).unwrap_or(&[]))?;
                        Msg::Switch(SwitchMsg::Join { round, next: u64_at(rest, "join")?, view })
                    }
                    (&FREEZE, rest) => Msg::Switch(SwitchMsg::Freeze { round: u64_at(rest, "freeze")? }),
                    (&DECIDE, rest) => {
                        let at = u64_at(rest, "decision")?;
                        let (round, view) = view(rest.get(8..).unwrap_or(&[]))?;
                        Msg::Switch(SwitchMsg::Decide { round, at, view })
                    }
                    (&kind, _) => return Err(MsgError::UnknownKind { channel, kind }),
                }
            }
            Channel::Detect => Msg::Engine(payload.to_vec()),
            Channel::Control => match kinded()? {
                (&ADDRESS, blob) => Msg::Address(blob.to_vec()),
                (&ARG_CHECK, rest) => {
                    Msg::ArgCheck { seq: u64_at(rest, "argument check")?, desc: text(rest.get(8..).unwrap_or(&[])) }
                }
                (&kind, _) => return Err(MsgError::UnknownKind { channel, kind }),
            },
            Channel::Abort => match kinded()? {
                (&MISMATCH, rest) => {
                    Msg::Mismatch { seq: u64_at(rest, "mismatch")?, detail: text(rest.get(8..).unwrap_or(&[])) }
                }
                (&REASON, rest) => Msg::Abort { reason: text(rest) },
                (&DEPART, rest) => Msg::Depart { last_done: u64_at(rest, "departure")? },
                (&kind, _) => return Err(MsgError::UnknownKind { channel, kind }),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use r2ccl_core::HealthView;

    #[test]
    fn every_message_round_trips_and_bad_payloads_are_named() {
        let mut failed = HealthView::uniform(3, 2, 1000);
        let _ = failed.set_failed(r2ccl_core::NicId::new(2, 1));
        for m in [
            Msg::Address(vec![1, 2, 3]),
            Msg::ArgCheck { seq: 7, desc: "AllReduce f32 count=3".into() },
            Msg::Switch(SwitchMsg::Join { round: 3, next: 9, view: HealthView::uniform(2, 3, 100) }),
            Msg::Switch(SwitchMsg::Freeze { round: u64::MAX }),
            Msg::Switch(SwitchMsg::Decide { round: 4, at: 11, view: failed }),
            Msg::Engine(vec![0xC0, 1]),
            Msg::Mismatch { seq: u64::MAX, detail: "rank 1 called x".into() },
            Msg::Abort { reason: "a caller gave up".into() },
            Msg::Depart { last_done: 42 },
            Msg::Heartbeat,
        ] {
            let (channel, payload) = m.encode();
            assert_eq!(Msg::decode(channel, &payload), Ok(m));
        }
        assert_eq!(Msg::decode(Channel::Abort, &[]), Err(MsgError::Empty(Channel::Abort)));
        assert_eq!(
            Msg::decode(Channel::Control, &[9]),
            Err(MsgError::UnknownKind { channel: Channel::Control, kind: 9 })
        );
        assert_eq!(Msg::decode(Channel::Abort, &[DEPART, 1, 2]), Err(MsgError::Truncated("departure")));
        assert_eq!(Msg::decode(Channel::Agree, &[JOIN, 1, 2]), Err(MsgError::View("truncated")));
        assert_eq!(Msg::decode(Channel::Agree, &[FREEZE, 1]), Err(MsgError::Truncated("freeze")));
        // A description is cut at MAX_DESC bytes, at a character boundary; a cut one round-trips.
        let long = Msg::ArgCheck { seq: 1, desc: "x".repeat(MAX_DESC + 10) };
        let (c, p) = long.encode();
        assert!(matches!(Msg::decode(c, &p), Ok(Msg::ArgCheck { desc, .. }) if desc.len() == MAX_DESC));
        let mut bytes = vec![ARG_CHECK, 0, 0, 0, 0, 0, 0, 0, 0];
        bytes.extend(std::iter::repeat_n(0xFF, MAX_DESC));
        let m = Msg::decode(Channel::Control, &bytes).unwrap_or(Msg::Heartbeat);
        let (c, p) = m.encode();
        assert_eq!(Msg::decode(c, &p), Ok(m), "invalid UTF-8 past the cut round-trips");
    }

    proptest! {
        /// Any payload on any channel decodes or is refused, never a panic; what decodes
        /// encodes back to a payload that decodes to the same message.
        #[test]
        fn any_payload_decodes_or_is_refused(ch in 0u8..5, payload in proptest::collection::vec(any::<u8>(), 0..64)) {
            let channel = Channel::from_u8(ch).unwrap_or(Channel::Control);
            if let Ok(m) = Msg::decode(channel, &payload) {
                let (c, p) = m.encode();
                prop_assert_eq!(Msg::decode(c, &p), Ok(m));
            }
        }
    }
}
