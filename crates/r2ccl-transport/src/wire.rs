//! The chunk header wire format: versioned, fixed-size, little-endian, keyed; decoding never panics.
//!
//! Layout (`HEADER_LEN` = 64 bytes), all integers little-endian:
//!
//! | bytes  | field     | meaning                                           |
//! |--------|-----------|---------------------------------------------------|
//! | 0..4   | magic     | `b"R2CK"`                                         |
//! | 4      | version   | [`WIRE_VERSION`]                                  |
//! | 5      | kind      | 1 = data chunk                                    |
//! | 6..8   | flags     | bit 0 = replayed chunk; other bits must be zero   |
//! | 8..16  | comm      | communicator id (random per communicator)         |
//! | 16..24 | seq       | collective sequence number                        |
//! | 24..28 | step      | step of the collective                            |
//! | 28..32 | chunk     | chunk index within the transfer                   |
//! | 32..36 | src       | sending rank                                      |
//! | 36..40 | dst       | receiving rank                                    |
//! | 40..48 | total_len | bytes of the whole transfer                       |
//! | 48..52 | len       | payload bytes that follow the header              |
//! | 52..56 | args      | digest of the collective's arguments as the sender called it (0: none) |
//! | 56..64 | tag       | HMAC-SHA-256 of bytes 0..56 under the [`HeaderKey`], first 8 bytes |
//!
//! The tag makes a header unforgeable by anyone who does not hold the communicator's key (derived
//! from the job secret; a guess verifies with probability 2^-64): a stranger who can connect to a rank's data listeners can make it receive
//! bytes, but never have them applied as a chunk. Only the header is keyed, not the payload (hashing
//! every byte would cost bandwidth; see `docs/security.md` for why that suffices against a stranger
//! who cannot read the traffic). Comparison is constant-time.
//!
//! `args` lets the receiver check, on every chunk and at no cost in messages, that the sender
//! called the same collective with the same arguments (`Session::set_args`).
//!
//! The payload follows the header directly; a message is exactly `HEADER_LEN + len` bytes. A backend
//! may also send the header alone (exactly `HEADER_LEN` bytes) with the payload as a message of its
//! own ([`ChunkHeader::decode_split`]).

use crate::{ChunkId, CommId, TransferKey};
use hmac::{Hmac, Mac};
use r2ccl_core::Rank;
use sha2::Sha256;

/// Size of an encoded chunk header in bytes.
pub const HEADER_LEN: usize = 64;
/// The header format version this crate writes and accepts.
pub const WIRE_VERSION: u8 = 3;
/// Bytes of the header that the tag covers.
const SIGNED: usize = 56;
/// Bytes of the truncated HMAC-SHA-256 tag.
const TAG_LEN: usize = HEADER_LEN - SIGNED;

/// The 32-byte key chunk headers are tagged with; one per communicator, derived from the job
/// secret. Its `Debug` form hides the bytes, and they are wiped when it is dropped.
#[derive(Clone, PartialEq, Eq)]
pub struct HeaderKey([u8; 32]);

impl HeaderKey {
    /// A key from its bytes.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The key's bytes.
    pub const fn bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl std::fmt::Debug for HeaderKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HeaderKey(..)")
    }
}

impl Drop for HeaderKey {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.0);
    }
}

/// A [`HeaderKey`] ready to tag and verify headers (the HMAC's keyed state, computed once).
#[derive(Clone)]
pub struct HeaderMac(Hmac<Sha256>);

impl HeaderMac {
    /// The MAC for `key`.
    pub fn new(key: &HeaderKey) -> Self {
        // HMAC takes keys of any length; 32 bytes never fails.
        Self(
            <Hmac<Sha256> as Mac>::new_from_slice(&key.0)
                .unwrap_or_else(|_| unreachable!("HMAC accepts any key length")),
        )
    }

    fn tag(&self, signed: &[u8]) -> [u8; TAG_LEN] {
        let mut m = self.0.clone();
        m.update(signed);
        let full = m.finalize().into_bytes();
        let mut out = [0u8; TAG_LEN];
        out.copy_from_slice(&full[..TAG_LEN]);
        out
    }

    fn verify(&self, signed: &[u8], tag: &[u8]) -> bool {
        let mut m = self.0.clone();
        m.update(signed);
        m.verify_truncated_left(tag).is_ok()
    }

    /// The 64-bit id the data endpoints of `rank`'s NIC on `rail` present when they connect (a
    /// backend that can send one with its connection request, as UCX's client id): the first 8
    /// bytes of HMAC-SHA-256, under the header key, of a label of its own (never a header's first
    /// bytes) and the rank and rail. Only holders of the key can name one; a listener that admits
    /// only these keeps every stranger's connection out.
    pub fn endpoint_id(&self, rank: Rank, rail: u16) -> u64 {
        let mut m = self.0.clone();
        m.update(ENDPOINT_ID_LABEL);
        m.update(&rank.0.to_le_bytes());
        m.update(&rail.to_le_bytes());
        let full = m.finalize().into_bytes();
        let mut out = [0u8; 8];
        out.copy_from_slice(&full[..8]);
        u64::from_le_bytes(out)
    }
}

/// What [`HeaderMac::endpoint_id`] tags before the rank and rail (headers begin with `MAGIC`).
const ENDPOINT_ID_LABEL: &[u8] = b"r2ccl data endpoint id v1";

impl std::fmt::Debug for HeaderMac {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HeaderMac(..)")
    }
}
const MAGIC: [u8; 4] = *b"R2CK";
const KIND_DATA: u8 = 1;
/// Flag bit: the chunk is a replay after a migration.
pub const FLAG_REPLAY: u16 = 1;
const KNOWN_FLAGS: u16 = FLAG_REPLAY;

/// Why a message was refused as a chunk.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The message is shorter than a header.
    #[error("message of {len} bytes is shorter than the {HEADER_LEN}-byte chunk header")]
    Short {
        /// Bytes received.
        len: usize,
    },
    /// The first four bytes are not the chunk magic.
    #[error("bad magic {found:02x?}, expected \"R2CK\"")]
    BadMagic {
        /// The bytes found.
        found: [u8; 4],
    },
    /// A header version this build does not speak.
    #[error("unsupported header version {found} (this build speaks {WIRE_VERSION})")]
    Version {
        /// The version found.
        found: u8,
    },
    /// A message kind other than data.
    #[error("unknown message kind {found}")]
    Kind {
        /// The kind found.
        found: u8,
    },
    /// Flag bits that this version does not define.
    #[error("unknown flag bits {found:#06x}")]
    Flags {
        /// The flags found.
        found: u16,
    },
    /// The header's tag does not verify: forged, corrupted, or keyed for another communicator.
    #[error("header tag does not verify (forged, corrupted, or from another communicator)")]
    Tag,
    /// The payload length differs from the header's `len`.
    #[error("header says {header} payload bytes, message carries {actual}")]
    Length {
        /// `len` from the header.
        header: u32,
        /// Payload bytes actually present.
        actual: usize,
    },
    /// The chunk's `len` exceeds the transfer's `total_len`.
    #[error("chunk of {len} bytes in a transfer of {total_len} bytes")]
    Inconsistent {
        /// Chunk payload length.
        len: u32,
        /// Transfer length.
        total_len: u64,
    },
}

/// A decoded chunk header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkHeader {
    /// Which chunk of which transfer.
    pub id: ChunkId,
    /// Bytes of the whole transfer.
    pub total_len: u64,
    /// Payload bytes of this chunk.
    pub len: u32,
    /// Flag bits ([`FLAG_REPLAY`]).
    pub flags: u16,
    /// Digest of the arguments the sender called the collective with (0: not given).
    pub args: u32,
}

fn arr<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    if let Some(s) = b.get(at..at + N) {
        out.copy_from_slice(s);
    }
    out
}

impl ChunkHeader {
    /// Whether the chunk is marked as a replay.
    pub const fn is_replay(&self) -> bool {
        self.flags & FLAG_REPLAY != 0
    }

    /// The header's transfer.
    pub const fn transfer(&self) -> TransferKey {
        self.id.transfer
    }

    /// Encodes the header into its fixed-size wire form, tagged under `mac`.
    pub fn encode(&self, mac: &HeaderMac) -> [u8; HEADER_LEN] {
        let t = self.id.transfer;
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4] = WIRE_VERSION;
        b[5] = KIND_DATA;
        b[6..8].copy_from_slice(&self.flags.to_le_bytes());
        b[8..16].copy_from_slice(&t.comm.0.to_le_bytes());
        b[16..24].copy_from_slice(&t.seq.to_le_bytes());
        b[24..28].copy_from_slice(&t.step.to_le_bytes());
        b[28..32].copy_from_slice(&self.id.index.to_le_bytes());
        b[32..36].copy_from_slice(&t.src.0.to_le_bytes());
        b[36..40].copy_from_slice(&t.dst.0.to_le_bytes());
        b[40..48].copy_from_slice(&self.total_len.to_le_bytes());
        b[48..52].copy_from_slice(&self.len.to_le_bytes());
        b[52..56].copy_from_slice(&self.args.to_le_bytes());
        let tag = mac.tag(&b[..SIGNED]);
        b[SIGNED..].copy_from_slice(&tag);
        b
    }

    /// Decodes a whole message (header then payload) whose header is tagged under `mac`, and
    /// returns the header and the payload. Never panics, whatever the bytes.
    pub fn decode<'m>(msg: &'m [u8], mac: &HeaderMac) -> Result<(Self, &'m [u8]), WireError> {
        let Some((head, payload)) = msg.split_at_checked(HEADER_LEN) else {
            return Err(WireError::Short { len: msg.len() });
        };
        let h = Self::decode_head(head, mac)?;
        if payload.len() != h.len as usize {
            return Err(WireError::Length { header: h.len, actual: payload.len() });
        }
        Ok((h, payload))
    }

    /// Decodes a header sent alone, ahead of its payload in a message of its own (exactly
    /// [`HEADER_LEN`] bytes), tagged under `mac`. Never panics, whatever the bytes.
    pub fn decode_split(msg: &[u8], mac: &HeaderMac) -> Result<Self, WireError> {
        if msg.len() != HEADER_LEN {
            return Err(if msg.len() < HEADER_LEN {
                WireError::Short { len: msg.len() }
            } else {
                WireError::Length { header: 0, actual: msg.len() - HEADER_LEN }
            });
        }
        Self::decode_head(msg, mac)
    }

    fn decode_head(head: &[u8], mac: &HeaderMac) -> Result<Self, WireError> {
        let magic: [u8; 4] = arr(head, 0);
        if magic != MAGIC {
            return Err(WireError::BadMagic { found: magic });
        }
        if head[4] != WIRE_VERSION {
            return Err(WireError::Version { found: head[4] });
        }
        if head[5] != KIND_DATA {
            return Err(WireError::Kind { found: head[5] });
        }
        if head.len() != HEADER_LEN || !mac.verify(&head[..SIGNED], &head[SIGNED..]) {
            return Err(WireError::Tag);
        }
        let flags = u16::from_le_bytes(arr(head, 6));
        if flags & !KNOWN_FLAGS != 0 {
            return Err(WireError::Flags { found: flags });
        }
        let total_len = u64::from_le_bytes(arr(head, 40));
        let len = u32::from_le_bytes(arr(head, 48));
        if u64::from(len) > total_len {
            return Err(WireError::Inconsistent { len, total_len });
        }
        let transfer = TransferKey {
            comm: CommId(u64::from_le_bytes(arr(head, 8))),
            seq: u64::from_le_bytes(arr(head, 16)),
            step: u32::from_le_bytes(arr(head, 24)),
            src: Rank(u32::from_le_bytes(arr(head, 32))),
            dst: Rank(u32::from_le_bytes(arr(head, 36))),
        };
        let id = ChunkId { transfer, index: u32::from_le_bytes(arr(head, 28)) };
        Ok(Self { id, total_len, len, flags, args: u32::from_le_bytes(arr(head, 52)) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_detects_corruption() {
        let mac = HeaderMac::new(&HeaderKey::from_bytes([7; 32]));
        let h = ChunkHeader {
            id: ChunkId { transfer: TransferKey::new(7, 3, 2, 1, 0), index: 5 },
            total_len: 100,
            len: 4,
            flags: FLAG_REPLAY,
            args: 0xA5A5_0001,
        };
        let mut msg = h.encode(&mac).to_vec();
        msg.extend_from_slice(&[1, 2, 3, 4]);
        let (d, p) = ChunkHeader::decode(&msg, &mac).unwrap();
        assert_eq!(d, h);
        assert_eq!(p, &[1, 2, 3, 4]);
        assert!(d.is_replay());
        msg[20] ^= 1;
        assert_eq!(ChunkHeader::decode(&msg, &mac), Err(WireError::Tag));
        assert_eq!(ChunkHeader::decode(&msg[..10], &mac), Err(WireError::Short { len: 10 }));
        msg[20] ^= 1;
        assert_eq!(ChunkHeader::decode_split(&msg[..HEADER_LEN], &mac), Ok(h));
        assert!(matches!(ChunkHeader::decode_split(&msg, &mac), Err(WireError::Length { .. })));
        assert_eq!(ChunkHeader::decode_split(&msg[..10], &mac), Err(WireError::Short { len: 10 }));
        // The same header under another key is refused: a stranger without the key cannot forge one.
        let other = HeaderMac::new(&HeaderKey::from_bytes([8; 32]));
        assert_eq!(ChunkHeader::decode(&msg, &other), Err(WireError::Tag));
        let forged = h.encode(&other);
        assert_eq!(ChunkHeader::decode_split(&forged, &mac), Err(WireError::Tag));
    }
}
