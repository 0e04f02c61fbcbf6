//! OOB frames: length, channel, payload and a 128-bit HMAC-SHA-256 tag under the key of the
//! connection's direction over a per-direction sequence number, so a frame that was injected,
//! replayed, reordered or cut short never decodes: the connection ends instead.
//!
//! Layout: `len` (u32 LE, = 1 + payload + 16) | channel (1 byte) | payload | tag (16 bytes), the
//! tag over (sequence number u64 LE, channel, payload).

use super::{Channel, OobEvent, OobStats};
use hmac::{Hmac, Mac};
use r2ccl_core::subsys;
use sha2::Sha256;
use std::collections::VecDeque;
use std::io;
use std::sync::atomic::Ordering;

/// Bytes of a frame's tag.
pub(crate) const TAG_LEN: usize = 16;
/// Largest payload of a frame.
pub(crate) const MAX_PAYLOAD: usize = 16 << 20;

/// One direction of one connection: its key and the sequence number of its next frame.
#[derive(Clone)]
pub(crate) struct FrameKey {
    mac: Hmac<Sha256>,
    seq: u64,
}

impl std::fmt::Debug for FrameKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FrameKey(.., seq {})", self.seq)
    }
}

impl FrameKey {
    /// The direction keyed by `key` (derived per connection from the secret and both nonces).
    pub(crate) fn new(key: &[u8; 32]) -> Self {
        let mac = <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!("HMAC accepts any key"));
        Self { mac, seq: 0 }
    }

    fn keyed(&self, channel: u8, payload: &[u8]) -> Hmac<Sha256> {
        let mut m = self.mac.clone();
        m.update(&self.seq.to_le_bytes());
        m.update(&[channel]);
        m.update(payload);
        m
    }

    /// Append one tagged frame to `buf` and count it.
    pub(crate) fn seal_into(&mut self, buf: &mut Vec<u8>, channel: Channel, payload: &[u8]) -> io::Result<()> {
        if payload.len() > MAX_PAYLOAD {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "OOB payload too large"));
        }
        let len = (1 + payload.len() + TAG_LEN) as u32;
        let tag = self.keyed(channel as u8, payload).finalize().into_bytes();
        buf.extend_from_slice(&len.to_le_bytes());
        buf.push(channel as u8);
        buf.extend_from_slice(payload);
        buf.extend_from_slice(&tag[..TAG_LEN]);
        self.seq += 1;
        Ok(())
    }

    /// Whether `tag` is the next frame's tag for (`channel`, `payload`); counts it if so.
    fn open(&mut self, channel: u8, payload: &[u8], tag: &[u8]) -> bool {
        let ok = self.keyed(channel, payload).verify_truncated_left(tag).is_ok();
        if ok {
            self.seq += 1;
        }
        ok
    }
}

/// Take the complete frames off the front of `buf` (what a peer's connection delivered so far)
/// as events, verifying each under `key`. An impossible length or a tag that does not verify is
/// an error (the peer is lost). Never panics, whatever the bytes.
pub(crate) fn decode_frames(
    buf: &mut Vec<u8>,
    key: &mut FrameKey,
    from: u32,
    stats: &OobStats,
    out: &mut VecDeque<OobEvent>,
) -> Result<(), String> {
    let mut at = 0;
    let mut result = Ok(());
    while buf.len() - at >= 4 {
        let len = u32::from_le_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]) as usize;
        if !(1 + TAG_LEN..=1 + MAX_PAYLOAD + TAG_LEN).contains(&len) {
            result = Err(format!("connection error: bad OOB frame length {len}"));
            break;
        }
        if buf.len() - at - 4 < len {
            break;
        }
        let ch = buf[at + 4];
        let payload = &buf[at + 5..at + 4 + len - TAG_LEN];
        let tag = &buf[at + 4 + len - TAG_LEN..at + 4 + len];
        if !key.open(ch, payload, tag) {
            stats.malformed.fetch_add(1, Ordering::Relaxed);
            result = Err("OOB frame failed verification (injected, replayed or corrupted): connection dropped".into());
            break;
        }
        match Channel::from_u8(ch) {
            Some(Channel::Heartbeat) => {}
            Some(channel) => out.push_back(OobEvent::Message { from, channel, payload: payload.to_vec() }),
            None => {
                stats.malformed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(target: subsys::BOOTSTRAP, peer = from, channel = ch, "dropped OOB frame with unknown channel");
            }
        }
        at += 4 + len;
    }
    buf.drain(..at);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (FrameKey, FrameKey) {
        (FrameKey::new(&[7; 32]), FrameKey::new(&[7; 32]))
    }

    #[test]
    fn frames_round_trip_in_pieces_and_forgeries_end_the_connection() {
        let (mut tx, mut rx) = pair();
        let mut wire = Vec::new();
        tx.seal_into(&mut wire, Channel::Control, b"one").unwrap();
        tx.seal_into(&mut wire, Channel::Heartbeat, b"").unwrap();
        tx.seal_into(&mut wire, Channel::Abort, b"two").unwrap();
        let stats = OobStats::default();
        let mut out = VecDeque::new();
        let mut buf = Vec::new();
        for piece in wire.chunks(3) {
            buf.extend_from_slice(piece);
            decode_frames(&mut buf, &mut rx, 1, &stats, &mut out).unwrap();
        }
        let got: Vec<_> = out.iter().map(|e| format!("{e:?}")).collect();
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(buf.is_empty());

        // A replayed frame (the first one again), one under another key, and one with a flipped
        // payload byte are each refused.
        let (mut tx2, _) = pair();
        let mut first = Vec::new();
        tx2.seal_into(&mut first, Channel::Control, b"one").unwrap();
        let mut replay = first.clone();
        assert!(decode_frames(&mut replay, &mut rx, 1, &stats, &mut out).is_err());
        let (mut tx3, mut rx3) = (FrameKey::new(&[8; 32]), FrameKey::new(&[7; 32]));
        let mut forged = Vec::new();
        tx3.seal_into(&mut forged, Channel::Abort, b"stop").unwrap();
        assert!(decode_frames(&mut forged, &mut rx3, 1, &stats, &mut out).is_err());
        let (mut tx4, mut rx4) = pair();
        let mut flipped = Vec::new();
        tx4.seal_into(&mut flipped, Channel::Control, b"abc").unwrap();
        flipped[6] ^= 1;
        assert!(decode_frames(&mut flipped, &mut rx4, 1, &stats, &mut out).is_err());
    }
}
