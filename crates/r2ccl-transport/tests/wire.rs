//! Chunk header wire format: round trips, and decoding never panics on any bytes.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]

use proptest::prelude::*;
use r2ccl_transport::wire::FLAG_REPLAY;
use r2ccl_transport::{ChunkHeader, ChunkId, HeaderKey, HeaderMac, TransferKey, WireError, HEADER_LEN};

fn mac() -> HeaderMac {
    HeaderMac::new(&HeaderKey::from_bytes([3; 32]))
}

fn header() -> impl Strategy<Value = ChunkHeader> {
    (any::<(u64, u64, u32, u32, u32)>(), any::<u32>(), any::<bool>(), 0u32..4096).prop_map(
        |((comm, seq, step, src, dst), index, replay, len)| ChunkHeader {
            id: ChunkId { transfer: TransferKey::new(comm, seq, step, src, dst), index },
            total_len: u64::from(len) + u64::from(index),
            len,
            flags: if replay { FLAG_REPLAY } else { 0 },
            args: 0,
        },
    )
}

proptest! {
    #[test]
    fn decode_never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = ChunkHeader::decode(&bytes, &mac());
    }

    #[test]
    fn round_trip(h in header(), fill in any::<u8>()) {
        let mut msg = h.encode(&mac()).to_vec();
        msg.extend(std::iter::repeat_n(fill, h.len as usize));
        let (d, payload) = ChunkHeader::decode(&msg, &mac()).unwrap();
        prop_assert_eq!(d, h);
        prop_assert_eq!(payload.len(), h.len as usize);
    }

    #[test]
    fn a_corrupted_header_byte_is_always_refused(
        h in header(),
        at in 0usize..HEADER_LEN,
        xor in 1u8..=255,
        cut in any::<bool>(),
    ) {
        let mut msg = h.encode(&mac()).to_vec();
        msg.extend(std::iter::repeat_n(0u8, h.len as usize));
        msg[at] ^= xor;
        // Cut one payload byte (with no payload that would cut the header itself, which is
        // refused as short instead).
        if cut && h.len > 0 {
            msg.pop();
        }
        match ChunkHeader::decode(&msg, &mac()) {
            // A single corrupted header byte is always caught (magic, version, kind or tag).
            Ok((d, _)) => prop_assert!(false, "corruption at byte {} decoded as {:?}", at, d),
            Err(e) => {
                let short = matches!(e, WireError::Short { .. });
                prop_assert!(!short);
            }
        }
    }

    #[test]
    fn wrong_payload_length_is_refused(h in header(), extra in 1usize..10) {
        let mut msg = h.encode(&mac()).to_vec();
        msg.extend(std::iter::repeat_n(0u8, h.len as usize + extra));
        let refused = matches!(ChunkHeader::decode(&msg, &mac()), Err(WireError::Length { .. }));
        prop_assert!(refused);
    }
}

#[test]
fn unknown_version_and_flags_are_refused() {
    let h = ChunkHeader {
        id: ChunkId { transfer: TransferKey::new(1, 2, 3, 4, 5), index: 6 },
        total_len: 0,
        len: 0,
        flags: 0,
        args: 7,
    };
    let mut m = h.encode(&mac());
    // Version 2 (before the argument digest) and a future 4 are refused alike.
    for v in [2, 4] {
        m[4] = v;
        assert_eq!(ChunkHeader::decode(&m, &mac()), Err(WireError::Version { found: v }));
    }
    let h2 = ChunkHeader { flags: 0x8000, ..h };
    assert_eq!(ChunkHeader::decode(&h2.encode(&mac()), &mac()), Err(WireError::Flags { found: 0x8000 }));
}
