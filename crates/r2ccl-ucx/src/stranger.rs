//! A stranger on the network who speaks UCX but does not know the job secret (test support, not
//! part of the API): it connects to data listeners of a running job and sends what a forger would,
//! for as long as it is told. The session tests and `r2ccl-perf`'s job tests attack with it.
//!
//! It learns the listeners either from the ranks' address blobs ([`attack`]; the blob tells it
//! nothing more than a port scan would) or from a port scan ([`attack_addrs`], every listening port
//! of the job's processes, not knowing which belongs to which rank or rail, so it claims every
//! rank and rail on each). What it sends, every round, to every endpoint, claiming to be every
//! other rank:
//! - well-formed chunk headers tagged under a key of its own, with a payload, for the transfer in
//!   flight (collective 0) and for future ones (stashed before, if they had verified);
//! - split headers naming a payload tag, and payloads under guessed payload tags;
//! - messages longer than any receive under the data tags (a truncated receive used to fail the
//!   path), and now and then a 4 MiB one;
//! - probe replies under every tag the old 14-bit scheme could use, and random ones;
//! - malformed probes (wrong size) claiming to come from a rank;
//! - 16 KiB messages under tags no receive of the job's matches.

use crate::{Context, ContextConfig, Endpoint, Request, UcxError, Worker, WorkerAddress, PROBE_TAG_BIT};
use r2ccl_transport::{ChunkHeader, ChunkId, HeaderKey, HeaderMac, TransferKey};
use std::net::SocketAddr;
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
/// Blobs that do not parse are skipped.
pub fn attack(blobs: &[Vec<u8>], total_len: u64, duration: Duration) -> Result<Sent, UcxError> {
    let worker = Context::new(ContextConfig::tcp("lo")).and_then(Worker::new)?;
    let ranks: Vec<(u32, Vec<WorkerAddress>)> =
        blobs.iter().filter_map(|b| crate::parse_address_blob(b).ok()).map(|(r, a)| (r.0, a)).collect();
    let world = ranks.len() as u32;
    let mut eps = Vec::new();
    for (rank, addrs) in &ranks {
        for (rail, a) in addrs.iter().enumerate() {
            if let Ok(ep) = worker.connect(a, format!("stranger->{rank}/{rail}")) {
                eps.push(Target { rank: Some(*rank), rail: Some(rail as u64), ep });
            }
        }
    }
    Ok(run(&worker, eps, world, 1, total_len, duration))
}

/// Attack every listener in `addrs` (a port scan's findings: which rank and rail each belongs to
/// is unknown, so each is sent what every rank of a `world`-rank job on `rails` rails would
/// receive) for `duration`; transfers of `total_len` bytes. Addresses UCX cannot connect to (not
/// UCX listeners) are skipped.
pub fn attack_addrs(
    addrs: &[SocketAddr],
    world: u32,
    rails: u64,
    total_len: u64,
    duration: Duration,
) -> Result<Sent, UcxError> {
    let worker = Context::new(ContextConfig::tcp("lo")).and_then(Worker::new)?;
    let mut eps = Vec::new();
    for addr in addrs {
        if let Ok(ep) = worker.connect(&WorkerAddress::from_socket_addr(*addr), format!("stranger->{addr}")) {
            eps.push(Target { rank: None, rail: None, ep });
        }
    }
    Ok(run(&worker, eps, world, rails, total_len, duration))
}

/// One endpoint of the stranger's, and whom it believes it reaches.
struct Target {
    rank: Option<u32>,
    rail: Option<u64>,
    ep: Endpoint,
}

fn run(worker: &Worker, eps: Vec<Target>, n: u32, rails: u64, total_len: u64, duration: Duration) -> Sent {
    // Not the job's key: what a stranger who does not know the secret can do at best.
    let mac = HeaderMac::new(&HeaderKey::from_bytes([0xEE; 32]));
    let mut sent = Sent { endpoints: eps.len(), ..Sent::default() };
    let mut reqs: Vec<Request<Vec<u8>>> = Vec::new();
    let start = Instant::now();
    let mut round = 0u64;
    while start.elapsed() < duration {
        for t in &eps {
            let mut post = |tag: u64, bytes: Vec<u8>| {
                if let Ok(r) = t.ep.tag_send(tag, bytes) {
                    reqs.push(r);
                    sent.messages += 1;
                }
            };
            let dsts: Vec<u32> = t.rank.map_or_else(|| (0..n).collect(), |r| vec![r]);
            let rail_list: Vec<u64> = t.rail.map_or_else(|| (0..rails).collect(), |r| vec![r]);
            for &dst in &dsts {
                for &rail in &rail_list {
                    for src in (0..n).filter(|s| *s != dst) {
                        forge(&mut post, &mac, src, dst, rail, total_len, round);
                    }
                }
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
    for t in eps {
        t.ep.close_force();
    }
    let until = Instant::now() + Duration::from_millis(200);
    while Instant::now() < until {
        worker.progress();
    }
    sent
}

/// One round's forgeries from `src` to `dst` on `rail`.
fn forge(
    post: &mut impl FnMut(u64, Vec<u8>),
    mac: &HeaderMac,
    src: u32,
    dst: u32,
    rail: u64,
    total_len: u64,
    round: u64,
) {
    let data_tag = u64::from(src) | (rail << 32);
    for seq in [0, 1 + round % 8] {
        let h = ChunkHeader {
            id: ChunkId { transfer: TransferKey::new(1, seq, 0, src, dst), index: (round % 64) as u32 },
            total_len,
            len: 4096,
            flags: 0,
            args: 0,
        };
        let mut whole = h.encode(mac).to_vec();
        whole.extend(std::iter::repeat_n(0xEE, 4096));
        post(data_tag, whole);
        let mut split = h.encode(mac).to_vec();
        split.extend((PAYLOAD_BIT | round).to_le_bytes());
        post(data_tag | SPLIT_BIT, split);
        post(PAYLOAD_BIT | round, vec![0xEE; 4096]);
    }
    post(data_tag, vec![0xEE; 192 << 10]);
    if round.is_multiple_of(50) {
        post(data_tag, vec![0xEE; 4 << 20]);
    }
    for k in 0..16u64 {
        let old = (((round * 16 + k) & 0x3FFF) << 48) | (rail << 32) | u64::from(src);
        post(PROBE_TAG_BIT | REPLY_BIT | old, Vec::new());
        post(PROBE_TAG_BIT | REPLY_BIT | (round.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 2), Vec::new());
    }
    post(PROBE_TAG_BIT | (rail << 32) | u64::from(src), vec![1, 2, 3]);
    // Tags that no receive of the job's ever matches (bits no sender sets, a rank past the world,
    // a rail no rank has): UCX kept these in its unexpected queue for good.
    for junk in [data_tag | (1 << 45), (1 << 61) | (rail << 32) | 0xFFFF_FF00, (200 << 32) | u64::from(src)] {
        post(junk, vec![0xEE; 16 << 10]);
    }
}
