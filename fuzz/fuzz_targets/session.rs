//! A receiving `Session` fed, message by message, what a peer and a stranger could make its
//! posted receives complete with: correctly tagged chunks of the expected transfer and of future
//! ones (whole, or split with their payloads), headers under another key, raw bytes, oversized and
//! empty messages, failures; while future transfers become expected now and then. Whenever the
//! session reports the transfer complete, its destination holds exactly the right bytes: no forged
//! byte lands, whatever the order.
#![no_main]
use libfuzzer_sys::fuzz_target;
use r2ccl_core::Rank;
use r2ccl_transport::script::Script;
use r2ccl_transport::{
    Buffer, ChunkHeader, ChunkId, CommId, CompletionKind, HeaderKey, HeaderMac, PathFault, PayloadId, PayloadInto,
    Session, SessionConfig, SessionEvent, Topology, TransferKey, Transport,
};
use std::time::Duration;

const CS: u32 = 4096;
const CHUNKS: u32 = 3;
const LEN: usize = (CS * CHUNKS) as usize;

fn payload(seq: u64, index: u32) -> Vec<u8> {
    (0..CS).map(|i| (i as u8).wrapping_mul(7) ^ (index as u8).wrapping_mul(31) ^ (seq as u8).wrapping_mul(101)).collect()
}

fn key(seq: u64) -> TransferKey {
    TransferKey::new(1, seq, 0, 0, 1)
}

/// Expect transfer `seq` into a fresh region; `(seq, region)` when the session took it.
fn expect(s: &mut Session, t: &mut Script, now: Duration, seq: u64) -> Option<(u64, r2ccl_transport::MemHandle)> {
    let region = t.register(LEN).expect("a region");
    let buf = Buffer { region, offset: 0, len: LEN as u64 };
    if s.expect_recv(now, t, key(seq), buf).is_ok() {
        Some((seq, region))
    } else {
        let _ = t.deregister(region);
        None
    }
}

fuzz_target!(|data: &[u8]| {
    let good = HeaderMac::new(&HeaderKey::from_bytes([0x21; 32]));
    let bad = HeaderMac::new(&HeaderKey::from_bytes([0x22; 32]));
    let topo = Topology::uniform(2, 1, 1, 1).expect("a 2-node topology");
    let cfg = SessionConfig {
        chunk_size: CS,
        recv_depth: 4,
        max_early_bytes: 64 << 10,
        max_early_chunks: 8,
        ..SessionConfig::default()
    };
    let mut s = Session::new(Rank(1), cfg, topo, &HeaderKey::from_bytes([0x21; 32])).expect("a session");
    s.open_comm(CommId(1));
    let mut t = Script::default();
    let mut now = Duration::ZERO;
    let mut dst: Vec<(u64, r2ccl_transport::MemHandle)> = Vec::new();
    dst.extend(expect(&mut s, &mut t, now, 0));
    let mut next_seq = 1;
    for op in data.chunks(4) {
        let [a, b, c, d] = [op[0], *op.get(1).unwrap_or(&0), *op.get(2).unwrap_or(&0), *op.get(3).unwrap_or(&0)];
        let seq = u64::from(b % 3);
        let index = u32::from(c) % (CHUNKS + 1);
        let header = ChunkHeader {
            id: ChunkId { transfer: key(seq), index },
            total_len: LEN as u64,
            len: CS,
            flags: u16::from(d & 1),
            args: 0,
        };
        match a % 8 {
            // A posted receive completes with a whole chunk: tagged right, wrong, or raw bytes.
            0..=2 => {
                if t.recvs.is_empty() {
                    continue;
                }
                let (req, path) = t.take_recv();
                let msg = match a % 8 {
                    0 => [header.encode(&good).as_slice(), &payload(seq, index)].concat(),
                    1 => [header.encode(&bad).as_slice(), &vec![0xEE; CS as usize]].concat(),
                    _ => op.repeat(usize::from(d)),
                };
                t.complete(req, path, CompletionKind::Received(msg));
            }
            // A split header (right or wrong key) naming a payload tag.
            3 => {
                if t.recvs.is_empty() {
                    continue;
                }
                let (req, path) = t.take_recv();
                let mac = if d & 2 == 0 { &good } else { &bad };
                let h = header.encode(mac).to_vec();
                t.complete(req, path, CompletionKind::Header { header: h, payload: PayloadId(u64::from(c)) });
            }
            // A posted payload receive lands: the right bytes for its header, junk, or fails.
            4 => {
                if t.payloads.is_empty() {
                    continue;
                }
                let (req, path, _, into) = t.payloads.remove(usize::from(b) % t.payloads.len());
                let kind = match (d % 3, into) {
                    (2, _) => CompletionKind::Failed(PathFault::Endpoint),
                    (0, PayloadInto::Region { region, offset, len }) => {
                        let i = (offset / CS as usize) as u32;
                        let s_of = dst.iter().find(|(_, r)| *r == region).map_or(0, |(s, _)| *s);
                        if let Ok(r) = t.region_mut(region) {
                            if let Some(place) = r.get_mut(offset..offset + len) {
                                place.copy_from_slice(&payload(s_of, i)[..len]);
                            }
                        }
                        CompletionKind::Placed
                    }
                    (0, PayloadInto::Buffer { mut header, .. }) => {
                        let (s_of, i) =
                            ChunkHeader::decode_split(&header, &good).map_or((0, 0), |h| (h.id.transfer.seq, h.id.index));
                        header.extend_from_slice(&payload(s_of, i));
                        CompletionKind::Received(header)
                    }
                    // Other bytes under a payload tag would mean a stranger guessed 59 random bits.
                    (_, _) => CompletionKind::Failed(PathFault::Endpoint),
                };
                t.complete(req, path, kind);
            }
            // A future transfer becomes expected (its stashed chunks are applied then).
            5 if next_seq < 3 => {
                dst.extend(expect(&mut s, &mut t, now, next_seq));
                next_seq += 1;
            }
            _ => {}
        }
        now += Duration::from_micros(50);
        s.drive(now, &mut t);
        while let Some(ev) = s.poll_event() {
            if let SessionEvent::RecvComplete(k) = ev {
                let (seq, region) = *dst.iter().find(|(s, _)| key(*s) == k).expect("a completed transfer was expected");
                let got = t.region(region).expect("its region");
                let want: Vec<u8> = (0..CHUNKS).flat_map(|i| payload(seq, i)).collect();
                assert!(got == want.as_slice(), "transfer {k} completed with wrong bytes");
            }
        }
    }
});
