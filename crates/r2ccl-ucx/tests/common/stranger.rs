//! A stranger on the network who speaks UCX but does not know the job secret: it connects to every
//! data listener of a running job and sends what a forger would, for as long as it is told.
//!
//! It learns the listeners from the ranks' address blobs (a real attacker would scan ports; the blob
//! tells it nothing more). What it sends, every round to every rank on every rail, claiming to be
//! every other rank:
//! - well-formed chunk headers tagged under a key of its own, with a payload, for the transfer in
//!   flight (collective 0) and for future ones (stashed before, if they had verified);
//! - split headers naming a payload tag, and payloads under guessed payload tags;
//! - messages longer than any receive under the data tags (a truncated receive used to fail the
//!   path), and now and then a 4 MiB one;
//! - probe replies under every tag the old 14-bit scheme could use, and random ones;
//! - malformed probes (wrong size) claiming to come from a rank.

use r2ccl_transport::{ChunkHeader, ChunkId, HeaderKey, HeaderMac, TransferKey};
use r2ccl_ucx::{Context, ContextConfig, Endpoint, Request, Worker, WorkerAddress, PROBE_TAG_BIT};
use std::time::{Duration, Instant};

const SPLIT_BIT: u64 = 1 << 59;
const PAYLOAD_BIT: u64 = 1 << 60;
const REPLY_BIT: u64 = 1 << 62;

/// What the stranger managed to send.
#[derive(Debug, Default, Clone, Copy)]
pub struct Sent {
    /// Endpoints it connected to listeners.
    pub endpoints: usize,
    /// Messages it posted.
    pub messages: u64,
    /// Rounds it ran.
    pub rounds: u64,
}

/// Attack the job whose address blobs are `blobs` for `duration`; transfers of `total_len` bytes.
pub fn attack(blobs: &[Vec<u8>], total_len: u64, duration: Duration) -> Sent {
    let worker = match Context::new(ContextConfig::tcp("lo")).and_then(Worker::new) {
        Ok(w) => w,
        Err(e) => panic!("the stranger could not open UCX on lo: {e}"),
    };
    let ranks: Vec<(u32, Vec<WorkerAddress>)> =
        blobs.iter().filter_map(|b| r2ccl_ucx::parse_address_blob(b).ok()).map(|(r, a)| (r.0, a)).collect();
    assert_eq!(ranks.len(), blobs.len(), "every address blob parses");
    let n = ranks.len() as u32;
    let mut eps: Vec<(u32, u64, Endpoint)> = Vec::new();
    for (rank, addrs) in &ranks {
        for (rail, a) in addrs.iter().enumerate() {
            if let Ok(ep) = worker.connect(a, format!("stranger->{rank}/{rail}")) {
                eps.push((*rank, rail as u64, ep));
            }
        }
    }
    // Not the job's key: what a stranger who does not know the secret can do at best.
    let mac = HeaderMac::new(&HeaderKey::from_bytes([0xEE; 32]));
    let mut sent = Sent { endpoints: eps.len(), ..Sent::default() };
    let mut reqs: Vec<Request<Vec<u8>>> = Vec::new();
    let start = Instant::now();
    let mut round = 0u64;
    while start.elapsed() < duration {
        for (rank, rail, ep) in &eps {
            let mut post = |tag: u64, bytes: Vec<u8>| {
                if let Ok(r) = ep.tag_send(tag, bytes) {
                    reqs.push(r);
                    sent.messages += 1;
                }
            };
            for src in (0..n).filter(|s| s != rank) {
                let data_tag = u64::from(src) | (rail << 32);
                for seq in [0, 1 + round % 8] {
                    let h = ChunkHeader {
                        id: ChunkId { transfer: TransferKey::new(1, seq, 0, src, *rank), index: (round % 64) as u32 },
                        total_len,
                        len: 4096,
                        flags: 0,
                    };
                    let mut whole = h.encode(&mac).to_vec();
                    whole.extend(std::iter::repeat_n(0xEE, 4096));
                    post(data_tag, whole);
                    let mut split = h.encode(&mac).to_vec();
                    split.extend((PAYLOAD_BIT | round).to_le_bytes());
                    post(data_tag | SPLIT_BIT, split);
                    post(PAYLOAD_BIT | round, vec![0xEE; 4096]);
                }
                post(data_tag, vec![0xEE; 192 << 10]);
                if round % 50 == 0 {
                    post(data_tag, vec![0xEE; 4 << 20]);
                }
                for k in 0..16u64 {
                    let old = (((round * 16 + k) & 0x3FFF) << 48) | (rail << 32) | u64::from(src);
                    post(PROBE_TAG_BIT | REPLY_BIT | old, Vec::new());
                    post(PROBE_TAG_BIT | REPLY_BIT | (round.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 2), Vec::new());
                }
                post(PROBE_TAG_BIT | (rail << 32) | u64::from(src), vec![1, 2, 3]);
            }
        }
        // Gentle on the CPU (the ranks share two cores with it): progress, then nap.
        for _ in 0..10 {
            worker.progress();
            std::thread::sleep(Duration::from_millis(1));
        }
        reqs.retain_mut(|r| !r.is_done());
        round += 1;
    }
    sent.rounds = round;
    for (_, _, ep) in eps {
        ep.close_force();
    }
    let until = Instant::now() + Duration::from_millis(200);
    while Instant::now() < until {
        worker.progress();
    }
    sent
}
