//! [`UcxTransport`]: `r2ccl_transport::Transport` over UCX for one rank: one rail (context + worker) per
//! local NIC, data and probe endpoints per peer per rail, node-wide registration, probe-and-reply,
//! endpoint errors as path errors, netlink link state, and `R2CCL_FAULT` software fault injection.
//!
//! Tags (64 bits): data `rail << 32 | rank` of the sender (rail in bits 32..40, bit 63 clear); probes
//! set bit 63 and carry the prober's `rail << 32 | rank` and an 8-byte random nonce as payload; a
//! reply sets bits 63 and 62 and the nonce's low 62 bits as its tag. A receive on
//! path `(L, P, R)` runs on rail `L`'s worker and matches only sends of rank `P` from its rail `R`. Endpoints connect rail `i` to the
//! peer's rail `i` only (per-rail networks); a cross-rail path cannot carry data: its sends fail at once
//! with an endpoint fault and its receives stay posted until cancelled.
//!
//! A chunk of at least [`SPLIT_MIN`] bytes travels as two messages, so that neither side copies it: its
//! header alone (tag bit 59, [`SPLIT_BIT`]) followed by 8 bytes naming the payload's tag, then its
//! payload straight from the registered region under that tag: bit 60 ([`PAYLOAD_BIT`]) and 59 random
//! bits, fresh from the OS for every chunk. Random bits cover two needs: a stale payload (a sender's
//! kernel delivers what a closed connection still held once a link comes back) never matches a current
//! header's payload receive, and a stranger who connects to a listener but cannot read the traffic
//! cannot guess the tag of a payload receive (1 in 2^59 per message), while the header itself carries
//! a keyed tag (`r2ccl_transport::wire`). Probe replies are unguessable the same way: a forged
//! reply cannot make a dead path look alive. A header receive that fails (a message longer than any
//! chunk, or a stranger's rendezvous abandoned half way: tags match any endpoint) is handed to the
//! session as an empty message, which it counts as malformed and re-posts: never a path failure
//! unless the NIC itself is down. What no receive takes does not stay in UCX's unexpected queues:
//! sweeps drop it, or hand it to the session when it may be a peer's ([`TransportEvent::Unsolicited`];
//! `transport/sweep.rs`). The receiver
//! reports the header ([`CompletionKind::Header`]); the session decides where the payload goes, and
//! [`Transport::post_payload_recv`] posts a receive for exactly that tag, straight into the destination
//! region where it can (`SessionConfig::place_payloads`, [`Transport::can_place`]; UCX's rendezvous then
//! lands the bytes in place) or into a buffer. UCX 1.13 cannot cancel
//! a send, so a split send given up with its failed path closes that path's data endpoint to the peer (it
//! never reads its region again). Nor can it cancel a receive that matched, and on TCP one can still be
//! written long after its path failed (retransmitted bytes): a receive into place goes through the
//! region's second mapping, and giving one up that UCX still holds first unmaps its range there
//! ([`MemRegion::poison`]), so it is reported cancelled at once and never writes the region. Reconnecting
//! replaces only failed or missing endpoints: closing a healthy one would fail the peer's.

use crate::context::ContextConfig;
use crate::error::UcxError;
use crate::fault::{parse_faults, FaultKind, FaultParseError, FaultSpec};
use crate::memory::{MemRegion, RegionSlice};
use crate::netlink::{self, LinkMonitor};
use crate::rail::{NicEndpointSet, PROBE_TAG_BIT};
use crate::request::{Request, SendBuf};
use crate::worker::{Worker, WorkerAddress};
use r2ccl_core::subsys::NET;
use r2ccl_core::{NicId, NodeId, RailId, Rank};
use r2ccl_transport::{
    Completion, CompletionKind, MemHandle, PathEvidence, PathFault, PathId, PayloadId, PayloadInto, RequestId,
    Transport, TransportError, TransportEvent, HEADER_LEN,
};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod backend;
mod databuf;
mod events;
mod lifecycle;
mod sweep;
use databuf::DataBuf;
use events::{outcome, TagRng};
pub use sweep::SweepStats;

/// Tag bit of probe replies (with [`PROBE_TAG_BIT`]).
const REPLY_BIT: u64 = 1 << 62;
/// The bits of a probe reply's tag taken from the probe's random nonce.
const PROBE_NONCE_MASK: u64 = (1 << 62) - 1;
/// Bytes of a probe: its nonce.
const PROBE_LEN: usize = 8;
/// The bits of a data tag that identify the sender (rank and rail).
const DATA_MASK: u64 = 0x0000_00FF_FFFF_FFFF;
/// Data tag bit: a chunk header sent alone; its payload follows under [`PAYLOAD_BIT`].
pub const SPLIT_BIT: u64 = 1 << 59;
/// Data tag bit: the payload of a split chunk.
pub const PAYLOAD_BIT: u64 = 1 << 60;
/// The random bits of a split payload's tag (below [`SPLIT_BIT`]).
const PAYLOAD_RANDOM: u64 = SPLIT_BIT - 1;
/// Bytes after a split header naming its payload's tag.
const PAYLOAD_TAG_LEN: usize = 8;
/// Tag of the empty messages [`UcxTransport::leave`] settles connections with: no receive
/// matches it (rank `u32::MAX` on rail 255 in the data bits, neither the probe nor the split
/// or payload bits).
const SETTLE_TAG: u64 = (1 << 61) | DATA_MASK;
/// Rails a data tag can name (8 bits).
const MAX_RAILS: usize = 256;

/// Post a rail's probe responder: an 8-byte receive of every probe (not of replies).
fn post_responder(worker: &Worker) -> Result<Request<Vec<u8>>, UcxError> {
    worker.tag_recv(PROBE_TAG_BIT, PROBE_TAG_BIT | REPLY_BIT, Vec::with_capacity(PROBE_LEN))
}
/// Chunks of at least this many bytes are sent split (no copy on either side); smaller ones go as
/// one message from a staging buffer, where the copy costs less than a second message.
pub const SPLIT_MIN: usize = 64 << 10;
/// At most this many `ucp_worker_progress` rounds per [`Transport::progress`] call.
const PROGRESS_ROUNDS: usize = 16;
/// Magic and version of the address blob.
const BLOB_MAGIC: &[u8; 4] = b"R2UX";
const BLOB_VERSION: u8 = 1;
/// The environment variable read by [`UcxTransportConfig::with_env_faults`].
pub const FAULT_ENV: &str = "R2CCL_FAULT";

/// Why the UCX transport could not be set up or connected.
#[derive(Debug, thiserror::Error)]
pub enum UcxTransportError {
    /// A UCX call failed.
    #[error(transparent)]
    Ucx(#[from] UcxError),
    /// `R2CCL_FAULT` is malformed.
    #[error(transparent)]
    Fault(#[from] FaultParseError),
    /// No NIC was configured.
    #[error("a UCX transport needs at least one NIC (got an empty device list)")]
    NoDevices,
    /// More rails than a tag can name.
    #[error("{0} NICs are more than the 256 rails a tag can name")]
    TooManyDevices(usize),
    /// A peer's address blob is malformed.
    #[error("address blob {index} ({len} bytes) is malformed: {why}")]
    BadBlob {
        /// Position of the blob in the table.
        index: usize,
        /// Its length.
        len: usize,
        /// What is wrong.
        why: &'static str,
    },
    /// Two blobs claim the same rank.
    #[error("address blobs {first} and {second} both claim {rank}")]
    DuplicateRank {
        /// The rank.
        rank: Rank,
        /// First blob claiming it.
        first: usize,
        /// Second blob claiming it.
        second: usize,
    },
}

/// How a [`UcxTransport`] is set up. Everything UCX needs (TCP only, one device per context)
/// is in the per-NIC [`ContextConfig`]s; no environment variable is required.
#[derive(Clone, Debug)]
pub struct UcxTransportConfig {
    /// This process's rank.
    pub rank: Rank,
    /// This rank's node.
    pub node: NodeId,
    /// One context configuration per local NIC, by rail.
    pub nics: Vec<ContextConfig>,
    /// Software faults to inject (those for other ranks are ignored).
    pub faults: Vec<FaultSpec>,
    /// Watch link state with netlink (Linux).
    pub link_monitor: bool,
    /// Who may connect to this rank's data listeners: `Some`, only the communicator's ranks (each
    /// endpoint presents an id derived from the communicator's key, and a listener rejects a
    /// connection without one of the ids it expects); `None`, anyone (every message still proves
    /// itself by its keyed header).
    pub endpoints: Option<EndpointAuth>,
}

/// The key and size of the communicator whose ranks alone may connect
/// ([`UcxTransportConfig::endpoints`]).
#[derive(Clone, Debug)]
pub struct EndpointAuth {
    /// The communicator's header key; endpoint ids come from it (`HeaderMac::endpoint_id`).
    pub key: r2ccl_transport::HeaderKey,
    /// Ranks in the communicator: the listener of rail `i` admits rail `i` of every other rank.
    pub world: u32,
}

impl UcxTransportConfig {
    /// TCP rails on the named interfaces, link monitoring on, no faults.
    pub fn tcp(rank: Rank, node: NodeId, devices: &[&str]) -> Self {
        Self {
            rank,
            node,
            nics: devices.iter().map(|d| ContextConfig::tcp(*d)).collect(),
            faults: Vec::new(),
            link_monitor: true,
            endpoints: None,
        }
    }

    /// Adds the faults of `R2CCL_FAULT`, if set.
    pub fn with_env_faults(mut self) -> Result<Self, FaultParseError> {
        if let Ok(v) = std::env::var(FAULT_ENV) {
            self.faults.extend(parse_faults(&v)?);
        }
        Ok(self)
    }
}

/// A software fault that fired, with when.
#[derive(Clone, Debug, PartialEq)]
pub struct FiredFault {
    /// The NIC.
    pub nic: NicId,
    /// What it does.
    pub kind: FaultKind,
    /// When it fired.
    pub at: Instant,
    /// When it healed, if it did.
    pub healed: Option<Instant>,
}

#[derive(Debug)]
struct Peer {
    node: NodeId,
    addrs: Vec<WorkerAddress>,
}

#[derive(Debug)]
struct Nic {
    ifindex: Option<i32>,
    /// The NIC's IP address (its TCP connections' local address), if it has one.
    ip: Option<std::net::IpAddr>,
    link_up: bool,
    /// Could not be opened at start: a placeholder, down for the transport's lifetime.
    dead: bool,
    fault_down: bool,
    blackhole: bool,
    slow: Option<f64>,
    bytes: u64,
    msgs: u64,
    /// Message bytes posted for sending on this NIC (headers included).
    tx_bytes: u64,
    /// Message bytes received on this NIC (headers included).
    rx_bytes: u64,
    responder: Option<Request<Vec<u8>>>,
    reported_eps: BTreeSet<Rank>,
}

impl Nic {
    fn is_down(&self) -> bool {
        self.dead || !self.link_up || self.fault_down
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Send,
    /// A split chunk's send: its payload is read from the region while in flight.
    SplitSend,
    Recv,
    Probe,
    /// A payload receive into a buffer (after its header).
    Payload,
    /// A payload receive straight into a region.
    Placed,
}

#[derive(Debug)]
enum Held {
    Send(Vec<u8>),
    /// A split chunk: its header, then its payload from the region.
    Split(Vec<u8>, RegionSlice),
    Recv(usize),
    /// A payload receive: its exact tag and where the bytes go.
    Payload(u64, DataBuf),
    Probe,
}

#[derive(Debug)]
enum State {
    Live(Request<DataBuf>),
    Probe {
        send: Option<Request<Vec<u8>>>,
        reply: Request<Vec<u8>>,
    },
    /// Not posted: its NIC is a black hole; posted when the fault heals.
    Held(Held),
    /// Never completes (a receive on a cross-rail path).
    Stuck,
    /// Finished on a slow NIC; reported at the instant.
    Delayed(CompletionKind, Instant),
}

#[derive(Debug)]
struct Out {
    path: PathId,
    kind: Kind,
    posted: Instant,
    state: State,
}

#[derive(Debug)]
struct Fault {
    spec: FaultSpec,
    fired: Option<usize>,
    healed: bool,
}

/// `r2ccl_transport::Transport` over UCX for one rank (see the module docs).
///
/// Use: [`UcxTransport::open`], publish [`UcxTransport::local_address_blob`] through the bootstrap,
/// [`UcxTransport::connect_peers`] with every rank's blob, then drive it through a `Session`.
#[derive(Debug)]
pub struct UcxTransport {
    // Requests first: they must be released before the endpoints and workers they use.
    out: BTreeMap<RequestId, Out>,
    detached: Vec<Request<Vec<u8>>>,
    /// Data requests given up on that UCX has not let go of yet (each keeps its buffer or region).
    detached_data: Vec<Request<DataBuf>>,
    /// Messages taken from an unexpected queue for the session, still arriving (`sweep`).
    unsolicited: Vec<(PathId, Request<DataBuf>)>,
    /// Random bits for payload tags and probe nonces.
    rng: TagRng,
    regions: BTreeMap<MemHandle, Arc<MemRegion>>,
    set: NicEndpointSet,
    nics: Vec<Nic>,
    rank: Rank,
    node: NodeId,
    peers: BTreeMap<Rank, Peer>,
    /// Peers that left the communicator: their endpoints are closed and never reconnected.
    forgotten: std::collections::BTreeSet<Rank>,
    /// This rank is leaving the communicator ([`UcxTransport::leave`]): no endpoint is
    /// connected or reconnected any more, to any peer.
    leaving: bool,
    /// The kernel's TCP state of this process's connections, and the instant it was read at
    /// ([`Transport::path_evidence`]).
    tcp_snapshot: Option<(Duration, Vec<crate::tcpinfo::Connection>)>,
    /// `(rail, peer)` pairs whose same-rail path went down: the data connection may have spent the
    /// outage in retransmission backoff (the next retry up to seconds after the link is back), so
    /// the first data send after the path comes back replaces the data endpoint with a fresh one.
    stale: std::collections::BTreeSet<(usize, Rank)>,
    events: VecDeque<TransportEvent>,
    next_req: u64,
    next_handle: u64,
    monitor: Option<LinkMonitor>,
    faults: Vec<Fault>,
    fired: Vec<FiredFault>,
    connected_at: Option<Instant>,
    /// Message buffers to send from and receive into again (fresh large allocations page-fault on
    /// every touch; reusing warm ones keeps the kernel out of the data path).
    pool: crate::pool::BufPool,
    /// A request may have finished since the last full poll: UCX progressed something, or a
    /// request was posted. Polling every outstanding request takes the worker lock
    /// once each, so idle rounds skip it (but never for longer than [`FULL_POLL_EVERY`]).
    unpolled: bool,
    /// When every outstanding request was last polled.
    polled_at: Instant,
    /// When the unexpected queues were last swept, and what the sweeps did (`sweep`).
    swept_at: Instant,
    sweep: SweepStats,
}

/// Longest sleep of [`UcxTransport::wait`] while a send is in flight (see there).
const SEND_NAP: Duration = Duration::from_micros(100);

/// Longest time between two polls of every outstanding request, whatever UCX reported.
const FULL_POLL_EVERY: Duration = Duration::from_millis(1);

fn rail_u16(i: usize) -> u16 {
    u16::try_from(i).unwrap_or(u16::MAX)
}

impl UcxTransport {
    /// Connection requests this rank's listeners rejected for presenting none of the
    /// communicator's endpoint ids ([`UcxTransportConfig::endpoints`]).
    pub fn strangers_rejected(&self) -> u64 {
        self.set.rails().iter().map(|r| r.worker().strangers_rejected()).sum()
    }

    /// The registered region behind `handle`, shared: it stays mapped (and registered with the
    /// NICs' contexts) as long as this `Arc` lives, even after [`Transport::deregister`].
    pub fn region_arc(&self, handle: MemHandle) -> Option<Arc<MemRegion>> {
        self.regions.get(&handle).cloned()
    }

    /// Open one rail per configured NIC and start the link monitor.
    pub fn open(mut cfg: UcxTransportConfig) -> Result<Self, UcxTransportError> {
        if cfg.nics.is_empty() {
            return Err(UcxTransportError::NoDevices);
        }
        if cfg.nics.len() > MAX_RAILS {
            return Err(UcxTransportError::TooManyDevices(cfg.nics.len()));
        }
        let devices: Vec<String> = cfg.nics.iter().map(|c| c.device.clone()).collect();
        let mac = cfg.endpoints.as_ref().map(|a| r2ccl_transport::HeaderMac::new(&a.key));
        if let Some(m) = &mac {
            for (rail, c) in cfg.nics.iter_mut().enumerate() {
                c.client_id = Some(m.endpoint_id(cfg.rank, rail_u16(rail)));
            }
        }
        // A NIC that cannot be opened now (down or missing at start) is a dead rail: the job runs
        // on the others, and every rank learns it from the address blob.
        let (set, dead) = NicEndpointSet::open_tolerant(cfg.nics)?;
        if let (Some(m), Some(auth)) = (&mac, &cfg.endpoints) {
            // Before any address is published: no peer can have connected yet.
            for (rail, r) in set.rails().iter().enumerate() {
                let ids = (0..auth.world)
                    .filter(|&q| q != cfg.rank.0)
                    .map(|q| m.endpoint_id(Rank(q), rail_u16(rail)))
                    .collect();
                r.worker().admit_only(ids);
            }
        }
        for (rail, e) in &dead {
            tracing::warn!(target: NET, rail, device = %devices[*rail], error = %e, "NIC unusable at start: running without it");
        }
        let mut nics = Vec::with_capacity(devices.len());
        for (i, dev) in devices.iter().enumerate() {
            let rail = &set.rails()[i];
            let responder = Some(post_responder(rail.worker())?);
            let is_dead = dead.iter().any(|(r, _)| *r == i);
            nics.push(Nic {
                ifindex: if is_dead { None } else { netlink::ifindex(dev) },
                ip: if is_dead { None } else { crate::sockaddr::device_ip(dev).ok() },
                link_up: netlink::is_running(dev).unwrap_or(true),
                dead: is_dead,
                fault_down: false,
                blackhole: false,
                slow: None,
                bytes: 0,
                tx_bytes: 0,
                rx_bytes: 0,
                msgs: 0,
                responder,
                reported_eps: BTreeSet::new(),
            });
        }
        let monitor = if cfg.link_monitor {
            match LinkMonitor::open() {
                Ok(m) => Some(m),
                Err(e) => {
                    tracing::warn!(target: NET, error = %e, "netlink link monitor unavailable; local link drops will only be found by deadlines");
                    None
                }
            }
        } else {
            None
        };
        let faults: Vec<Fault> = cfg
            .faults
            .into_iter()
            .filter(|f| f.applies_to(cfg.rank.0))
            .filter(|f| {
                let ok = usize::from(f.nic) < devices.len();
                if !ok {
                    tracing::warn!(target: NET, nic = f.nic, nics = devices.len(), "R2CCL_FAULT names a NIC this rank does not have; ignored");
                }
                ok
            })
            .map(|spec| Fault { spec, fired: None, healed: false })
            .collect();
        Ok(Self {
            out: BTreeMap::new(),
            detached: Vec::new(),
            detached_data: Vec::new(),
            unsolicited: Vec::new(),
            rng: TagRng::default(),
            regions: BTreeMap::new(),
            set,
            nics,
            rank: cfg.rank,
            node: cfg.node,
            peers: BTreeMap::new(),
            forgotten: std::collections::BTreeSet::new(),
            leaving: false,
            tcp_snapshot: None,
            stale: std::collections::BTreeSet::new(),
            events: VecDeque::new(),
            next_req: 1,
            next_handle: 1,
            monitor,
            faults,
            fired: Vec::new(),
            connected_at: None,
            pool: crate::pool::BufPool::default(),
            unpolled: true,
            polled_at: Instant::now(),
            swept_at: Instant::now(),
            sweep: SweepStats::default(),
        })
    }

    /// This rank's address blob (rank, node, and every rail's worker address) to publish to every peer.
    pub fn local_address_blob(&self) -> Result<Vec<u8>, UcxError> {
        let mut b = Vec::new();
        b.extend_from_slice(BLOB_MAGIC);
        b.push(BLOB_VERSION);
        b.extend_from_slice(&self.rank.0.to_le_bytes());
        b.extend_from_slice(&self.node.0.to_le_bytes());
        b.extend_from_slice(&rail_u16(self.nics.len()).to_le_bytes());
        for (rail, a) in self.set.addresses()?.into_iter().enumerate() {
            // A dead rail publishes no address: peers neither connect to it nor use it.
            let bytes = if self.nics.get(rail).is_some_and(|n| n.dead) { Vec::new() } else { a.into_bytes() };
            b.extend_from_slice(&u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_le_bytes());
            b.extend_from_slice(&bytes);
        }
        Ok(b)
    }

    /// Connect data and probe endpoints to every rank in `blobs` (this rank's own blob is skipped), rail
    /// `i` to the peer's rail `i`. Fault timers (`after_ms`) start now.
    pub fn connect_peers(&mut self, blobs: &[Vec<u8>]) -> Result<(), UcxTransportError> {
        let mut parsed: BTreeMap<Rank, (usize, Peer)> = BTreeMap::new();
        for (index, blob) in blobs.iter().enumerate() {
            let (rank, peer) =
                parse_blob(blob).map_err(|why| UcxTransportError::BadBlob { index, len: blob.len(), why })?;
            if let Some((first, _)) = parsed.get(&rank) {
                return Err(UcxTransportError::DuplicateRank { rank, first: *first, second: index });
            }
            parsed.insert(rank, (index, peer));
        }
        // Each peer keeps a data and a probe endpoint on each rail (a replaced one closes), so
        // twice that, plus slack for reconnects, bounds what strangers can make a listener hold.
        let max_accepted = 4 * parsed.len() + 64;
        for rail in self.set.rails() {
            rail.worker().set_max_accepted(max_accepted);
        }
        for (rank, (_, peer)) in parsed {
            if rank == self.rank {
                continue;
            }
            let k = self.nics.len().min(peer.addrs.len());
            for (i, addr) in peer.addrs.iter().take(k).enumerate() {
                if !addr.as_bytes().is_empty() && !self.nics[i].dead {
                    self.set_rail_connect(i, rank, addr)?;
                }
            }
            self.peers.insert(rank, peer);
        }
        self.connected_at = Some(Instant::now());
        Ok(())
    }

    fn set_rail_connect(&mut self, rail: usize, peer: Rank, addr: &WorkerAddress) -> Result<(), UcxError> {
        let r =
            self.set.rail_mut(rail).ok_or(UcxError::OutOfRange { what: "rail", index: rail, len: self.nics.len() })?;
        r.connect(peer, addr)?;
        if let Some(n) = self.nics.get_mut(rail) {
            n.reported_eps.remove(&peer);
        }
        Ok(())
    }

    /// The node of `rank`, once connected (or this rank's own node).
    pub fn node_of(&self, rank: Rank) -> Option<NodeId> {
        if rank == self.rank {
            return Some(self.node);
        }
        self.peers.get(&rank).map(|p| p.node)
    }

    /// Every connected peer rank.
    pub fn peers(&self) -> Vec<Rank> {
        self.peers.keys().copied().collect()
    }

    /// The software faults that fired so far.
    pub fn fired_faults(&self) -> &[FiredFault] {
        &self.fired
    }

    /// Add a software fault at run time (`rank` is ignored: it applies to this rank).
    pub fn inject(&mut self, spec: FaultSpec) {
        self.faults.push(Fault { spec, fired: None, healed: false });
    }

    /// Outstanding requests counted by path, kind and state, for diagnostics (`path kind state: n`).
    pub fn outstanding_summary(&self) -> Vec<String> {
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for o in self.out.values() {
            let state = match &o.state {
                State::Live(_) => "live",
                State::Probe { .. } => "probe",
                State::Held(_) => "held",
                State::Stuck => "stuck",
                State::Delayed(..) => "delayed",
            };
            *counts.entry(format!("{} {:?} {state}", o.path, o.kind)).or_default() += 1;
        }
        let mut out: Vec<String> = counts.into_iter().map(|(k, n)| format!("{k}: {n}")).collect();
        out.push(format!("detached {} + {}", self.detached.len(), self.detached_data.len()));
        out
    }

    /// Requests outstanding (posted and not completed, cancelled or failed).
    pub fn outstanding(&self) -> usize {
        self.out.len()
    }

    fn nic_id(&self, rail: usize) -> NicId {
        NicId { node: self.node, rail: RailId(rail_u16(rail)) }
    }

    fn req_id(&mut self) -> RequestId {
        let id = RequestId(self.next_req);
        self.next_req += 1;
        id
    }

    /// Checks a path; returns the local rail index and whether it is cross-rail.
    fn check_path(&self, path: PathId) -> Result<(usize, bool), TransportError> {
        let rail = path.local.rail.index();
        if path.local.node != self.node || rail >= self.nics.len() {
            return Err(TransportError::NotLocalNic { nic: path.local, rank: self.rank });
        }
        let peer = self.peers.get(&path.peer).ok_or(TransportError::UnknownRank(path.peer))?;
        if path.remote.node != peer.node || path.remote.rail.index() >= peer.addrs.len() {
            return Err(TransportError::NotPeerNic { nic: path.remote, peer: path.peer });
        }
        Ok((rail, path.remote.rail != path.local.rail))
    }

    fn complete(&mut self, req: RequestId, path: PathId, kind: CompletionKind) {
        self.events.push_back(TransportEvent::Completion(Completion { req, path, kind }));
    }

    /// The address `peer` published for `rail`, unless it left or published none (a dead rail).
    fn peer_address(&self, rail: usize, peer: Rank) -> Option<WorkerAddress> {
        if self.leaving || self.forgotten.contains(&peer) {
            return None;
        }
        self.peers.get(&peer).and_then(|p| p.addrs.get(rail)).filter(|a| !a.as_bytes().is_empty()).cloned()
    }

    /// Reconnect the endpoints to `peer` on `rail` if UCX reported them failed (a path coming back), or,
    /// for a data send, if the data endpoint was closed ([`UcxTransport::stop_split_send`]).
    fn heal_endpoints(&mut self, rail: usize, peer: Rank, for_data: bool) {
        if self.leaving || self.forgotten.contains(&peer) {
            return;
        }
        let failed = self.set.rails().get(rail).and_then(|r| r.peer(peer).ok()).is_none_or(|e| {
            let data_gone = e.data.as_ref().is_none_or(|d| d.failure().is_some());
            e.probe.failure().is_some() || (for_data && data_gone)
        });
        if !failed {
            return;
        }
        let Some(addr) = self.peer_address(rail, peer) else { return };
        let Some(r) = self.set.rail_mut(rail) else { return };
        match r.reconnect(peer, &addr) {
            Ok(_) => {
                if let Some(n) = self.nics.get_mut(rail) {
                    n.reported_eps.remove(&peer);
                }
                tracing::info!(target: NET, rail, %peer, "reconnected failed endpoints");
            }
            Err(e) => tracing::warn!(target: NET, rail, %peer, error = %e, "reconnect failed"),
        }
    }

    /// Replace the data endpoint to `peer` on `rail` with a fresh one (a new TCP connection): the
    /// first data send on a path that was down. The old one is closed by force; whatever was still
    /// on it belonged to the failed path and was given up with it. The probe endpoint stays (closing
    /// it would cancel the detector's probes in flight, which it counts as unanswered).
    fn refresh_endpoints(&mut self, rail: usize, peer: Rank) {
        let Some(addr) = self.peer_address(rail, peer) else { return };
        let Some(r) = self.set.rail_mut(rail) else { return };
        match r.replace_data(peer, &addr) {
            Ok(()) => {
                // A failure of the new endpoint must be reported again (unless the probe one failed).
                let probe_ok = r.peer(peer).is_ok_and(|e| e.probe.failure().is_none());
                if let (true, Some(n)) = (probe_ok, self.nics.get_mut(rail)) {
                    n.reported_eps.remove(&peer);
                }
                tracing::info!(target: NET, rail, %peer, "path back in use: data endpoint replaced by a fresh connection");
            }
            Err(e) => tracing::warn!(target: NET, rail, %peer, error = %e, "reconnect failed"),
        }
    }

    /// Post `held` on its path now (the NIC is healthy and not a black hole).
    fn launch(&mut self, path: PathId, held: Held) -> State {
        // A post may finish at once (UCX completes small sends inline).
        self.unpolled = true;
        let rail = path.local.rail.index();
        let random = match held {
            Held::Split(..) | Held::Probe => match self.rng.next() {
                Some(x) => x,
                None => {
                    tracing::warn!(target: NET, %path, "the OS gave no randomness for a tag");
                    return State::Delayed(CompletionKind::Failed(PathFault::Endpoint), Instant::now());
                }
            },
            _ => 0,
        };
        let Some(r) = self.set.rails().get(rail) else { return State::Stuck };
        let me = u64::from(self.rank.0) | (u64::from(rail_u16(rail)) << 32);
        let header_recv = matches!(held, Held::Recv(_));
        let res = match held {
            Held::Send(payload) => r.send(path.peer, me, DataBuf::Owned(payload)).map(State::Live),
            Held::Split(mut header, body) => {
                let payload_tag = PAYLOAD_BIT | (random & PAYLOAD_RANDOM);
                header.extend_from_slice(&payload_tag.to_le_bytes());
                // The header goes first; if it fails, so would the payload (same endpoint).
                r.send(path.peer, me | SPLIT_BIT, DataBuf::Owned(header)).and_then(|h| {
                    self.detached_data.push(h);
                    r.send(path.peer, payload_tag, DataBuf::Region(body)).map(State::Live)
                })
            }
            Held::Recv(cap) => {
                let tag = u64::from(path.peer.0) | (u64::from(path.remote.rail.0) << 32);
                // Received bytes land in the buffer's allocation: no zeroing of a pooled buffer.
                let buf = self.pool.take(cap);
                // Headers and whole chunks, never a split payload (whatever its sequence number).
                r.recv(tag, DATA_MASK | PAYLOAD_BIT, DataBuf::Owned(buf)).map(State::Live)
            }
            Held::Payload(tag, buf) => r.recv(tag, u64::MAX, buf).map(State::Live),
            Held::Probe => {
                let nonce = random & PROBE_NONCE_MASK;
                let reply_tag = PROBE_TAG_BIT | REPLY_BIT | nonce;
                r.worker().tag_recv(reply_tag, u64::MAX, Vec::new()).and_then(|reply| {
                    let probe = nonce.to_le_bytes().to_vec();
                    let send = r.peer(path.peer).and_then(|e| e.probe.tag_send(PROBE_TAG_BIT | me, probe));
                    match send {
                        Ok(s) => Ok(State::Probe { send: Some(s), reply }),
                        Err(e) => {
                            self.detached.push(reply);
                            Err(e)
                        }
                    }
                })
            }
        };
        match res {
            Ok(s) => s,
            // A header receive that fails as it is posted matched a message already waiting that
            // does not fit (a stranger's oversized message under a data tag): as when it fails
            // later, an empty receipt, counted as malformed and re-posted, never a path failure.
            Err(e) if header_recv && !self.nics.get(rail).is_some_and(Nic::is_down) => {
                tracing::debug!(target: NET, %path, error = %e, "header receive failed at once");
                State::Delayed(CompletionKind::Received(Vec::new()), Instant::now())
            }
            Err(e) => {
                tracing::debug!(target: NET, %path, error = %e, "post failed at once");
                State::Delayed(CompletionKind::Failed(PathFault::Endpoint), Instant::now())
            }
        }
    }

    fn post(&mut self, path: PathId, kind: Kind, held: Held) -> Result<RequestId, TransportError> {
        let (rail, cross) = self.check_path(path)?;
        let id = self.req_id();
        let nic = &mut self.nics[rail];
        let bytes = match &held {
            Held::Send(p) => p.len() as u64,
            Held::Split(h, b) => (h.len() + b.byte_len()) as u64,
            _ => 0,
        };
        if kind != Kind::Probe {
            nic.bytes += bytes;
            nic.tx_bytes += bytes;
            nic.msgs += 1;
        }
        if nic.is_down() {
            self.complete(id, path, CompletionKind::Failed(PathFault::LocalNicDown));
            return Ok(id);
        }
        let state = if cross {
            match kind {
                Kind::Recv | Kind::Payload | Kind::Placed => State::Stuck,
                Kind::Send | Kind::SplitSend | Kind::Probe => {
                    self.complete(id, path, CompletionKind::Failed(PathFault::Endpoint));
                    return Ok(id);
                }
            }
        } else if nic.blackhole {
            State::Held(held)
        } else {
            let data = matches!(kind, Kind::Send | Kind::SplitSend);
            if data && !self.stale.is_empty() && self.stale.remove(&(rail, path.peer)) {
                self.refresh_endpoints(rail, path.peer);
            } else if matches!(kind, Kind::Send | Kind::SplitSend | Kind::Probe) {
                self.heal_endpoints(rail, path.peer, kind != Kind::Probe);
            }
            self.launch(path, held)
        };
        self.out.insert(id, Out { path, kind, posted: Instant::now(), state });
        Ok(id)
    }

    /// Cancel one request: its real outcome if it finished, else `Cancelled`; in-flight UCX requests are
    /// detached (kept until UCX lets go). A receive into place that UCX still holds is cut out of the
    /// region's alias first ([`UcxTransport::stop_placed`]), so it is reported at once. `path_failed`:
    /// the path is given up (both ends mark it down), so a split send in flight is stopped for good.
    fn cancel_one(&mut self, id: RequestId, path_failed: bool) -> bool {
        let Some(mut o) = self.out.remove(&id) else { return false };
        let rail = o.path.local.rail.index();
        let mut kind = match &mut o.state {
            State::Live(r) => outcome(&self.nics, o.kind, rail, r).map(|(k, _)| k),
            State::Delayed(k, _) => Some(k.clone()),
            _ => None,
        };
        if kind.is_none() && o.kind == Kind::Placed {
            let (finished, safe) = self.stop_placed(rail, &mut o.state);
            if !safe {
                // Cannot happen short of the kernel refusing a mapping: keep waiting for it.
                self.out.insert(id, o);
                return true;
            }
            kind = finished;
        }
        self.retire(o.path, o.kind, o.state, path_failed);
        self.complete(id, o.path, kind.unwrap_or(CompletionKind::Cancelled));
        true
    }

    /// Stops a live receive into place that is being given up (cancelled, or failed with its
    /// NIC). Unmatched, UCX cancels it at once. Matched and under way, UCX 1.13 cannot stop it,
    /// and on TCP it may still write long after (bytes the sender's kernel retransmits once a
    /// link returns): its range is cut out of the region's alias ([`MemRegion::poison`]), so it
    /// writes throwaway pages from now on and never a later collective's bytes. Returns its
    /// outcome if it finished after all, and whether the region is safe from it (false only if
    /// the kernel refused the mapping).
    fn stop_placed(&mut self, rail: usize, state: &mut State) -> (Option<CompletionKind>, bool) {
        let State::Live(r) = state else { return (None, true) };
        if let Some(done) = outcome(&self.nics, Kind::Placed, rail, r) {
            return (Some(done.0), true);
        }
        r.cancel();
        if let Some(rl) = self.set.rails().get(rail) {
            rl.worker().progress();
        }
        let finished = outcome(&self.nics, Kind::Placed, rail, r).map(|(k, _)| k);
        let safe = match (finished.is_none(), r.buffer()) {
            (true, Some(DataBuf::Region(slice))) => slice.region().poison(&slice.range()).is_ok(),
            _ => true,
        };
        (finished, safe)
    }

    /// `len` bytes at `offset` of a registered region, as a request buffer.
    fn region_slice(&self, handle: MemHandle, offset: usize, len: usize) -> Result<RegionSlice, TransportError> {
        let r = self.regions.get(&handle).ok_or(TransportError::UnknownHandle(handle))?;
        let size = r.len();
        offset.checked_add(len).and_then(|end| r.slice(offset..end).ok()).ok_or(TransportError::OutOfBounds {
            offset,
            len,
            size,
        })
    }

    /// Keep `buf` for a later send or receive (`pool.rs` bounds what is kept).
    fn recycle_buf(&mut self, buf: Vec<u8>) {
        self.pool.put(buf);
    }

    fn retire(&mut self, path: PathId, kind: Kind, state: State, path_failed: bool) {
        match state {
            State::Live(mut r) => {
                if r.is_done() {
                    match r.take_buffer() {
                        Some(DataBuf::Owned(b) | DataBuf::After(b, _)) => self.recycle_buf(b),
                        Some(DataBuf::Region(_)) | None => {}
                    }
                } else {
                    r.cancel();
                    if kind == Kind::SplitSend && path_failed {
                        self.stop_split_send(path);
                    }
                    self.detached_data.push(r);
                }
            }
            State::Probe { send, mut reply } => {
                reply.cancel();
                self.detached.push(reply);
                self.detached.extend(send);
            }
            State::Held(_) | State::Stuck | State::Delayed(..) => {}
        }
    }

    /// A split send on a failed path while UCX may still read its payload from the region: UCX 1.13
    /// cannot cancel a send, so close the data endpoint to the peer on this rail, which ends every
    /// send on it at once. So a send given up with its path never reads its region again, and a
    /// receive into place waiting for it can be cancelled safely: nothing more arrives for it (the
    /// bytes that did arrive are the chunk's own, read before the close). The endpoint is reopened
    /// when the path carries data again.
    fn stop_split_send(&mut self, path: PathId) {
        let rail = path.local.rail.index();
        if let Some(rl) = self.set.rail_mut(rail) {
            if rl.close_data(path.peer) {
                tracing::info!(target: NET, %path, "split send cancelled in flight: data endpoint to the peer closed");
            }
        }
    }
}

/// A rank's address blob ([`UcxTransport::local_address_blob`]) read back: the rank and its
/// listener address per rail (empty for a dead rail), or what is wrong with it.
pub fn parse_address_blob(b: &[u8]) -> Result<(Rank, Vec<WorkerAddress>), &'static str> {
    parse_blob(b).map(|(rank, peer)| (rank, peer.addrs))
}

fn parse_blob(b: &[u8]) -> Result<(Rank, Peer), &'static str> {
    let mut r = b;
    let mut take = |n: usize| -> Result<&[u8], &'static str> {
        if r.len() < n {
            return Err("truncated");
        }
        let (h, t) = r.split_at(n);
        r = t;
        Ok(h)
    };
    if take(4)? != BLOB_MAGIC {
        return Err("bad magic (not an r2ccl-ucx address blob)");
    }
    if take(1)? != [BLOB_VERSION] {
        return Err("unsupported version");
    }
    let u32_of = |s: &[u8]| u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    let rank = Rank(u32_of(take(4)?));
    let node = NodeId(u32_of(take(4)?));
    let n = take(2)?;
    let rails = u16::from_le_bytes([n[0], n[1]]);
    if rails == 0 {
        return Err("no rails");
    }
    let mut addrs = Vec::with_capacity(usize::from(rails));
    for _ in 0..rails {
        let len = u32_of(take(4)?) as usize;
        addrs.push(WorkerAddress::from_bytes(take(len)?.to_vec()));
    }
    if !r.is_empty() {
        return Err("trailing bytes");
    }
    Ok((rank, Peer { node, addrs }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blobs_round_trip_and_bad_ones_are_refused() {
        let mut b = Vec::new();
        b.extend_from_slice(BLOB_MAGIC);
        b.push(BLOB_VERSION);
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&2u16.to_le_bytes());
        for a in [&b"abc"[..], &b"de"[..]] {
            b.extend_from_slice(&(a.len() as u32).to_le_bytes());
            b.extend_from_slice(a);
        }
        let (rank, peer) = parse_blob(&b).unwrap();
        assert_eq!((rank, peer.node, peer.addrs.len()), (Rank(3), NodeId(1), 2));
        assert_eq!(peer.addrs[1].as_bytes(), b"de");
        assert_eq!(parse_blob(&b[..b.len() - 1]).unwrap_err(), "truncated");
        let mut t = b.clone();
        t.push(0);
        assert_eq!(parse_blob(&t).unwrap_err(), "trailing bytes");
        assert!(parse_blob(b"XXXX").is_err());
        assert!(parse_blob(&[]).is_err());
    }
}
