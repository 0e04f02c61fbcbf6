//! Entry points for the cargo-fuzz targets in `fuzz/` (not API, hidden from the docs): the
//! crate's private decoders fed arbitrary bytes. Each must return, never panic or hang; where a
//! decoder has an encoder, what decodes must encode back to the same value.

use crate::bootstrap::rendezvous::{parse_hello, parse_table};
use crate::oob::{decode_frames, Channel, FrameKey, OobEvent, OobStats};
use std::collections::VecDeque;

use crate::engine::{FRAME_CTRL, FRAME_DETECT};

/// The key of [`oob_stream`]'s connection.
const OOB_KEY: [u8; 32] = [0x33; 32];

/// An OOB byte stream delivered in the pieces `cuts` splits it into, verified under a fixed
/// key, every frame dispatched to the decoder of its channel (engine control, detection
/// protocol, agreement views). With `sealed`, the bytes are first read as records (channel
/// byte, u16 length, payload) and sent as correctly tagged frames, so the fuzzer reaches the
/// decoders behind the tag; otherwise they are the raw stream (a stranger's, refused at its
/// first frame).
pub fn oob_stream(bytes: &[u8], cuts: &[usize], sealed: bool) {
    let stats = OobStats::default();
    let stream = if sealed {
        let mut tx = FrameKey::new(&OOB_KEY);
        let mut wire = Vec::new();
        let mut rest = bytes;
        while let [ch, l0, l1, tail @ ..] = rest {
            let len = usize::from(u16::from_le_bytes([*l0, *l1])).min(tail.len());
            let channel = Channel::from_u8(ch % 5).unwrap_or(Channel::Control);
            if tx.seal_into(&mut wire, channel, &tail[..len]).is_err() {
                break;
            }
            rest = &tail[len..];
        }
        wire
    } else {
        bytes.to_vec()
    };
    let mut rx = FrameKey::new(&OOB_KEY);
    let mut buf = Vec::new();
    let mut events = VecDeque::new();
    let mut at = 0;
    for &c in cuts.iter().chain(std::iter::once(&usize::MAX)) {
        let end = c.min(stream.len()).max(at);
        buf.extend_from_slice(&stream[at..end]);
        at = end;
        if decode_frames(&mut buf, &mut rx, 1, &stats, &mut events).is_err() {
            assert!(!sealed, "a correctly tagged stream was refused");
            break;
        }
    }
    for ev in events {
        if let OobEvent::Message { channel, payload, .. } = ev {
            match channel {
                Channel::Detect => match payload.split_first() {
                    Some((&FRAME_CTRL, rest)) => ctrl(rest),
                    Some((&FRAME_DETECT, rest)) => detect(rest),
                    _ => {}
                },
                Channel::Agree | Channel::Abort | Channel::Control | Channel::Heartbeat => {
                    if let Ok(m) = crate::oob::Msg::decode(channel, &payload) {
                        let (c, p) = m.encode();
                        assert_eq!(crate::oob::Msg::decode(c, &p), Ok(m), "OOB message round trip");
                    }
                }
            }
        }
    }
}

/// An engine control frame; one that decodes re-encodes to the same frame's meaning.
pub fn ctrl(bytes: &[u8]) {
    if let Ok(c) = crate::ctrl::Ctrl::decode(bytes) {
        assert_eq!(crate::ctrl::Ctrl::decode(&c.encode()), Ok(c), "control frame round trip");
    }
}

/// An r2ccl-detect protocol frame; one that decodes re-encodes to the same message.
pub fn detect(bytes: &[u8]) {
    if let Ok(m) = r2ccl_detect::OobMessage::decode(bytes) {
        assert_eq!(r2ccl_detect::OobMessage::decode(&m.encode()).as_ref(), Ok(&m), "detect frame round trip");
    }
}

/// A health view of the agreement protocol, and the same bytes as a message of the switch
/// protocol (`Agree` channel); what decodes re-encodes to the same thing.
pub fn agree_view(from: u32, bytes: &[u8]) {
    if let Ok((round, view)) = crate::agree::decode_view(from, bytes) {
        let again = crate::agree::decode_view(from, &crate::agree::encode_view(round, &view));
        assert_eq!(again.ok(), Some((round, view)), "agreement view round trip");
    }
    if let Ok(m) = crate::oob::Msg::decode(crate::oob::Channel::Agree, bytes) {
        let (c, p) = m.encode();
        assert_eq!(crate::oob::Msg::decode(c, &p), Ok(m), "switch message round trip");
    }
}

/// A rendezvous hello frame and a rank-table payload.
pub fn rendezvous(bytes: &[u8]) {
    let _ = parse_hello(bytes);
    let _ = parse_table(bytes);
}

/// A rank's NIC blob from the rank table.
pub fn nic_blob(bytes: &[u8]) {
    if let Some(facts) = crate::comm::blob_facts(bytes) {
        assert_eq!(crate::comm::blob_facts(&crate::comm::nic_blob(&facts)), Some(facts), "NIC blob round trip");
    }
}

/// A unique id string; one that parses prints back to itself.
pub fn unique_id(text: &str) {
    if let Ok(id) = text.parse::<crate::UniqueId>() {
        assert_eq!(id.to_string().parse::<crate::UniqueId>().ok(), Some(id), "unique id round trip");
    }
}

/// A launch environment; an error never shows the secret it was given.
pub fn launch_env(pairs: &[(String, String)]) {
    let env: std::collections::BTreeMap<String, String> = pairs.iter().cloned().collect();
    if let Err(e) = crate::bootstrap::LaunchInfo::from_env(&env) {
        let text = e.to_string();
        // A secret-looking string that no other variable (name, value, or value as an error
        // quotes it) contains must not appear in the error.
        let elsewhere = |key: &str, s: &str| {
            env.iter().any(|(k, v)| k != key && (k.contains(s) || v.contains(s) || format!("{v:?}").contains(s)))
        };
        // Secret-looking: 8 or more hex digits (no fixed message text has such a run).
        let hex = |s: &&str| s.len() >= 8 && s.bytes().all(|b| b.is_ascii_hexdigit());
        if let Some(secret) = env.get("R2CCL_SECRET").map(String::as_str).filter(hex) {
            if !elsewhere("R2CCL_SECRET", secret) {
                assert!(!text.contains(secret), "R2CCL_SECRET echoed in {text:?}");
            }
        }
        if let Some(uid) = env.get("R2CCL_UNIQUE_ID") {
            if let Some((head, secret)) = uid.trim().rsplit_once(':').filter(|(_, s)| hex(s)) {
                let in_head = head.contains(secret) || format!("{head:?}").contains(secret);
                if !elsewhere("R2CCL_UNIQUE_ID", secret) && !in_head && !"(secret hidden)".contains(secret) {
                    assert!(!text.contains(secret), "the unique id's secret echoed in {text:?}");
                }
            }
        }
    }
}

/// The launcher variables [`launch_env_records`] names by index.
const LAUNCH_VARS: [&str; 16] = [
    "R2CCL_RANK",
    "R2CCL_WORLD_SIZE",
    "R2CCL_ROOT",
    "R2CCL_SECRET",
    "R2CCL_UNIQUE_ID",
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_JOB_ID",
    "TORCHELASTIC_RUN_ID",
    "R2CCL_INSECURE_DERIVED_SECRET",
];

/// [`launch_env`] on records separated by 0xFF, each a variable index byte then the value.
pub fn launch_env_records(data: &[u8]) {
    let pairs: Vec<(String, String)> = data
        .split(|&b| b == 0xFF)
        .filter_map(|rec| {
            let (&i, v) = rec.split_first()?;
            Some((LAUNCH_VARS[usize::from(i) % LAUNCH_VARS.len()].to_owned(), String::from_utf8_lossy(v).into_owned()))
        })
        .collect();
    launch_env(&pairs);
}

/// A metrics request received in the pieces `cuts` splits it into: each prefix parses without
/// panic, nothing past the size limit is accepted, and a request that ends its headers within the
/// limit is accepted once whole, whatever the pieces.
pub fn metrics_request(bytes: &[u8], cuts: &[usize]) {
    use crate::metrics::{request_line, Request};
    let mut seen = Vec::new();
    for &c in cuts.iter().chain(std::iter::once(&bytes.len())) {
        seen = bytes[..c.min(bytes.len()).max(seen.len())].to_vec();
        if let Request::Complete(line) = request_line(&seen) {
            assert!(!line.contains('\n'), "a request line holds no newline");
            return;
        }
    }
    if let Request::Complete(_) = request_line(bytes) {
        panic!("a whole request was not seen through its pieces");
    }
}
