//! Property tests of the OOB wire format: any byte string decodes to a value or an error
//! without panicking, and every message round-trips.
#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]

use proptest::prelude::*;
use r2ccl_core::NicId;
use r2ccl_detect::wire::{HEADER_LEN, WIRE_VERSION};
use r2ccl_detect::{Observation, OobMessage};

fn nic() -> impl Strategy<Value = NicId> {
    (any::<u32>(), any::<u16>()).prop_map(|(n, r)| NicId::new(n, r))
}

fn message() -> impl Strategy<Value = OobMessage> {
    let obs = prop_oneof![
        Just(Observation::Ok),
        Just(Observation::Timeout),
        Just(Observation::LocalError),
        Just(Observation::Unknown)
    ];
    prop_oneof![
        (any::<u64>(), nic(), nic()).prop_map(|(id, from, to)| OobMessage::ProbeRequest { id, from, to }),
        (any::<u64>(), obs).prop_map(|(id, outcome)| OobMessage::ProbeReport { id, outcome }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
        let _ = OobMessage::decode(&bytes);
        let _ = OobMessage::decode_prefix(&bytes);
    }

    #[test]
    fn plausible_headers_with_random_payloads_never_panic(
        kind in 0u8..10,
        len in 0u16..64,
        payload in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let mut bytes = vec![WIRE_VERSION, kind];
        bytes.extend_from_slice(&len.to_le_bytes());
        bytes.extend_from_slice(&payload);
        if let Ok((msg, used)) = OobMessage::decode_prefix(&bytes) {
            prop_assert_eq!(used, HEADER_LEN + usize::from(len));
            prop_assert_eq!(&msg.encode()[..], &bytes[..used]);
        }
    }

    #[test]
    fn every_message_round_trips(msg in message(), extra in proptest::collection::vec(any::<u8>(), 0..8)) {
        let bytes = msg.encode();
        prop_assert_eq!(OobMessage::decode(&bytes), Ok(msg));
        let mut stream = bytes.clone();
        stream.extend_from_slice(&extra);
        prop_assert_eq!(OobMessage::decode_prefix(&stream), Ok((msg, bytes.len())));
        for cut in 0..bytes.len() {
            prop_assert!(OobMessage::decode(&bytes[..cut]).is_err());
        }
    }
}
