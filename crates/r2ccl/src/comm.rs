//! The communicator: bootstrap, OOB mesh, UCX transport and the engine, driven by one
//! progress thread per communicator; callers talk to it over crossbeam channels.
//!
//! Init: rendezvous at rank 0 (node names and OOB addresses), the authenticated OOB mesh,
//! node numbering from the node names, one UCX context per data NIC, an allgather of UCX
//! addresses over the OOB mesh, then the engine. Every step has a deadline.
//!
//! Per collective: the schedule is planned from the health view agreed in the previous
//! round (every rank contributes its local view at the start of each collective, off the
//! critical path; the next collective uses the merge, so every rank plans from the same
//! view), the arguments are checked against the ring neighbour's, and the engine runs the
//! schedule. NIC failures are repaired under the call; a lost peer, an abort or mismatched
//! arguments end the call with an error naming them.

use crate::agree::{decode_view, encode_view, Agreement};
use crate::bootstrap::{join, PeerInfo, Root, Secret};
use crate::call::{Access, Reply};
use crate::engine::{Engine, EngineConfig, EngineEvent};
use crate::error::CommError;
use crate::oob::{Channel, OobEvent, OobMesh};
use crate::report::{CollReport, CommEvent, Schedule};
use crate::wake::{WakeReceiver, Waker};
use crossbeam_channel::{Receiver, Sender};
use r2ccl_algo::{
    build_p2p_group, build_rank_schedule, Algorithm, Collective, Fabric, Layout, P2pOp, ScheduleRequest, Strategy,
};
use r2ccl_config::Config;
use r2ccl_core::{subsys, DType, HealthView, NicId, NodeId, Rank};
use r2ccl_transport::{MemHandle, SessionConfig, Topology, Transport as _};
use r2ccl_ucx::{ContextConfig, UcxTransport, UcxTransportConfig};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How to start a communicator (made by [`crate::CommBuilder`]).
#[derive(Clone, Debug)]
pub(crate) struct CommOptions {
    /// This rank.
    pub rank: u32,
    /// Number of ranks.
    pub world: u32,
    /// `host:port` of rank 0's rendezvous listener (rank 0 binds it).
    pub root: String,
    /// The job secret.
    pub secret: Secret,
    /// Node identity (ranks with the same name share NICs).
    pub node: String,
    /// Data NIC interface names, by rail.
    pub nics: Vec<String>,
    /// Validated configuration (deadlines, chunking, detection timing).
    pub config: Config,
    /// Read `R2CCL_FAULT` for software fault injection (tests and drills only).
    pub env_faults: bool,
}

impl CommOptions {
    /// The node identity: `bootstrap.node`, else the host name.
    pub(crate) fn default_node(config: &Config) -> String {
        if config.bootstrap.node.is_empty() {
            r2ccl_topo::discover::hostname()
        } else {
            config.bootstrap.node.clone()
        }
    }

    /// The data NICs: `transport.nics`, else those `topo.file` lists for `node`, else the
    /// discovered physical NICs other than the OOB interface (`lo` when there are none: a
    /// single-host run). The OOB interface is `R2CCL_OOB_IFACE`, or the one that routes to
    /// `root`.
    pub(crate) fn default_nics(config: &Config, node: &str, root: &str) -> Result<Vec<String>, CommError> {
        // The OOB interface: configured (a name, prefix or exclusion list), or the one that routes
        // to the root.
        let oob = || {
            if config.bootstrap.oob_iface.is_empty() {
                crate::netif::iface_of(oob_bind_addr(root))
            } else {
                crate::netif::select_oob(&config.bootstrap.oob_iface, &crate::netif::ipv4_addresses()).map(|(n, _)| n)
            }
        };
        Ok(if !config.transport.nics.is_empty() {
            // Discovery only for an exclusion list (`^...`), which starts from the data NICs found.
            let discovered = if config.transport.nics.first().is_some_and(|f| f.starts_with('^')) {
                crate::netif::default_data_nics(oob().as_deref())
            } else {
                Vec::new()
            };
            let nics = crate::netif::select_nics(&config.transport.nics, &crate::netif::interface_names(), &discovered)
                .map_err(CommError::Invalid)?;
            if nics != config.transport.nics {
                tracing::info!(target: subsys::INIT, spec = ?config.transport.nics, ?nics, "data NICs from transport.nics");
            }
            nics
        } else if !config.topo.file.is_empty() {
            // The static description names this node's data NICs.
            let nics = file_nics(&topo_file_node(&config.topo.file, node)?);
            tracing::info!(target: subsys::INIT, ?nics, file = %config.topo.file, "data NICs from topo.file");
            nics
        } else {
            // Discovered physical NICs, keeping the OOB interface out of the data path when there
            // are others.
            let oob = oob();
            let nics = crate::netif::default_data_nics(oob.as_deref());
            tracing::info!(target: subsys::INIT, ?nics, ?oob, "data NICs discovered (set R2CCL_NICS to choose)");
            nics
        })
    }
}

/// The caller's memory for one collective: owned (non-blocking [`Communicator::start`]),
/// borrowed (a blocking call or a [`crate::Scope`]'s: touched only under the call's
/// [`crate::call::Access`]), or registered.
pub(crate) enum Bufs {
    Owned {
        input: Vec<u8>,
        output: Vec<u8>,
    },
    Borrowed {
        input: *const u8,
        in_len: usize,
        output: *mut u8,
        out_len: usize,
    },
    /// One buffer for both (NCCL's in-place convention): the input of AllGather and the output
    /// of ReduceScatter are this rank's block of it.
    InPlace {
        buf: *mut u8,
        len: usize,
    },
    /// Registered regions ([`CommBuf`]), read and written where they are: (region, length).
    Registered {
        input: (MemHandle, usize),
        output: (MemHandle, usize),
    },
    /// One registered region for both, with [`Bufs::InPlace`]'s convention.
    RegisteredInPlace {
        buf: MemHandle,
        len: usize,
    },
}

// SAFETY: borrowed pointers travel with the call's `Access`; the progress thread dereferences
// them only while holding its lock and finding the caller still waiting, and the caller keeps
// the memory borrowed until it has either had the reply or revoked the access (call.rs).
unsafe impl Send for Bufs {}

impl Bufs {
    /// The input and output bytes of a collective that reads `in_len` and writes `out_len`
    /// bytes on `rank`, and where the result goes when the caller's memory is borrowed;
    /// `None` when the buffers do not have those sizes.
    #[allow(clippy::type_complexity, reason = "a private helper's one-off tuple")]
    fn split(&self, in_len: usize, out_len: usize, rank: u32) -> Option<(&[u8], &[u8], Option<(*mut u8, usize)>)> {
        match self {
            Bufs::Owned { input, output } => {
                (input.len() == in_len && output.len() == out_len).then_some((input, output, None))
            }
            Bufs::Borrowed { input, in_len: il, output, out_len: ol } => (*il == in_len && *ol == out_len).then(|| {
                // SAFETY: see the `Send` impl: the caller's slices outlive every use.
                let (i, o) =
                    unsafe { (std::slice::from_raw_parts(*input, *il), std::slice::from_raw_parts(*output, *ol)) };
                (i, o, Some((*output, *ol)))
            }),
            Bufs::Registered { .. } | Bufs::RegisteredInPlace { .. } => None,
            Bufs::InPlace { buf, len } => {
                let (i_at, o_at) = in_place_offsets(in_len, out_len, rank);
                if *len != in_len.max(out_len) || i_at + in_len > *len || o_at + out_len > *len {
                    return None;
                }
                // SAFETY: as `Borrowed`; both views are only read until the collective finishes,
                // and the result is written through the pointer after the last read.
                let (i, o) = unsafe {
                    (
                        std::slice::from_raw_parts(buf.add(i_at), in_len),
                        std::slice::from_raw_parts(buf.add(o_at), out_len),
                    )
                };
                // SAFETY: o_at + out_len <= len, checked above.
                Some((i, o, Some((unsafe { buf.add(o_at) }, out_len))))
            }
        }
    }
}

/// Where the input and the output start in one in-place buffer (NCCL's convention: AllGather's
/// input is this rank's block of the output, ReduceScatter's output this rank's block of the
/// input; otherwise both at 0).
fn in_place_offsets(in_len: usize, out_len: usize, rank: u32) -> (usize, usize) {
    let rank = rank as usize;
    if in_len < out_len {
        (rank * in_len, 0)
    } else if out_len < in_len {
        (0, rank * out_len)
    } else {
        (0, 0)
    }
}

/// What a request runs: a collective, or a group of point-to-point operations.
#[derive(Clone, Debug)]
pub(crate) enum Work {
    /// A collective of every rank.
    Coll(Collective),
    /// This rank's sends and receives of a group (every rank calls one, possibly empty).
    Group(Vec<P2pOp>),
}

impl Work {
    fn name(&self) -> &'static str {
        match self {
            Work::Coll(c) => c.name(),
            Work::Group(_) => "group",
        }
    }
}

/// How ranks `me` and `q` describe the operations between them in a group: both list the
/// counts from the lower rank to the higher, then back, so that mirrored calls compare equal.
fn pair_desc(me: u32, q: u32, dtype: DType, ops: &[P2pOp]) -> String {
    let counts = |send: bool| -> Vec<u64> {
        ops.iter().filter(|o| o.peer() == Rank(q) && o.is_send() == send).map(P2pOp::count).collect()
    };
    let (lo, hi) = (me.min(q), me.max(q));
    let (up, down) = if me == lo { (counts(true), counts(false)) } else { (counts(false), counts(true)) };
    format!("group of {dtype}: rank {lo} -> {hi} {up:?}, rank {hi} -> {lo} {down:?}")
}

/// A region registered for a caller: its handle, first byte and mapping.
pub(crate) type Registered = (MemHandle, usize, Arc<r2ccl_ucx::MemRegion>);

/// One call as the caller hands it over: what to run, on what, and who guards the memory.
pub(crate) struct Call {
    pub(crate) work: Work,
    pub(crate) dtype: DType,
    pub(crate) count: u64,
    pub(crate) bufs: Bufs,
    /// Present when `bufs` borrows the caller's memory.
    pub(crate) access: Option<Access>,
}

pub(crate) enum Req {
    Coll {
        call: Call,
        /// When the call must have finished (or failed) on this rank.
        deadline: Instant,
        reply: Sender<Reply>,
    },
    /// Register a region of this many bytes for a [`CommBuf`].
    Alloc {
        len: usize,
        reply: Sender<Result<Registered, CommError>>,
    },
    /// A [`CommBuf`] was dropped.
    Free(MemHandle),
    Abort(String),
    /// Leave: fail what is left, say goodbye, linger for the peers when asked; answer with the
    /// ranks that had not left.
    Shutdown {
        linger: bool,
        reply: Sender<Vec<u32>>,
    },
}

/// A communicator of `world` ranks. Cheap to call from one thread; the work happens on its
/// progress thread.
pub struct Communicator {
    pub(crate) rank: u32,
    pub(crate) world: u32,
    node_of: Vec<u32>,
    pub(crate) tx: Sender<Req>,
    /// Wakes the progress thread after every request (it may be asleep in `poll(2)`).
    pub(crate) waker: Waker,
    thread: Option<std::thread::JoinHandle<()>>,
    pub(crate) shared: Arc<Shared>,
    /// How this communicator was started (node, NICs, configuration) for [`Communicator::split`].
    pub(crate) template: CommOptions,
    /// Staging of device buffers, set up by the first device call.
    pub(crate) device: Mutex<Option<crate::device::Lane>>,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator").field("rank", &self.rank).field("world", &self.world).finish_non_exhaustive()
    }
}

#[derive(Default)]
pub(crate) struct Shared {
    error: Mutex<Option<CommError>>,
    events: Mutex<Vec<CommEvent>>,
    /// The failed NICs of the agreed health view the latest collective was planned on.
    failed: Mutex<Vec<NicId>>,
}

impl Shared {
    /// The error that ended the communicator, if one has.
    pub(crate) fn async_error(&self) -> Option<CommError> {
        self.error.lock().ok().and_then(|e| e.clone())
    }
}

impl Communicator {
    /// Start a communicator; returns when every rank is connected or with a bounded error.
    /// Rank 0 serves the rendezvous on `root_listener` when given (a listener already bound to
    /// `opts.root`, so that no other socket can take its port between choosing it and binding
    /// it).
    pub(crate) fn init_with(opts: CommOptions, root_listener: Option<TcpListener>) -> Result<Self, CommError> {
        if opts.world == 0 || opts.rank >= opts.world {
            return Err(CommError::Invalid(format!("rank {} of world {}", opts.rank, opts.world)));
        }
        if opts.nics.is_empty() {
            return Err(CommError::Invalid("no data NICs".into()));
        }
        let (rank, world) = (opts.rank, opts.world);
        let template = opts.clone();
        let (tx, rx) = crossbeam_channel::unbounded();
        let (init_tx, init_rx) = crossbeam_channel::bounded(1);
        let shared = Arc::new(Shared::default());
        let sh = shared.clone();
        let connect_timeout = Duration::from_millis(opts.config.bootstrap.connect_timeout_ms);
        let (waker, wake_rx) =
            crate::wake::pair().map_err(|e| CommError::Bootstrap(format!("cannot create the wake-up socket: {e}")))?;
        let thread = std::thread::Builder::new()
            .name(format!("r2ccl-progress-{}", opts.rank))
            .spawn(move || match Progress::init(opts, root_listener, sh, wake_rx) {
                Ok(p) => {
                    let _ = init_tx.send(Ok(p.node_of.clone()));
                    p.run(&rx);
                }
                Err(e) => {
                    let _ = init_tx.send(Err(e));
                }
            })
            .map_err(|e| CommError::Bootstrap(format!("cannot start the progress thread: {e}")))?;
        let node_of = init_rx
            .recv_timeout(connect_timeout * 2 + Duration::from_secs(5))
            .map_err(|_| CommError::Bootstrap("initialisation did not finish by its deadline".into()))??;
        Ok(Self { rank, world, node_of, tx, waker, thread: Some(thread), shared, template, device: Mutex::new(None) })
    }

    /// Split into sub-communicators, like `ncclCommSplit`: ranks that pass the same `color`
    /// form one, ranked by `key` (ties by their rank here); `None` takes part in the split but
    /// joins none (returns `Ok(None)`). Collective over this communicator: every rank must call
    /// it. Each new communicator has its own rendezvous (a fresh port and a random nonce chosen
    /// by its rank 0 and shared through two AllGathers here), secret (derived by each member from
    /// this communicator's secret and that nonce: no secret travels), OOB mesh and transport.
    pub fn split(&self, color: Option<u32>, key: u32) -> Result<Option<Communicator>, CommError> {
        const NONE: u32 = u32::MAX;
        let c = color.unwrap_or(NONE);
        if c == NONE && color.is_some() {
            return Err(CommError::Invalid(format!("split color {NONE} is reserved for `None`")));
        }
        let world = self.world as usize;
        let mine = [c.to_le_bytes(), key.to_le_bytes()].concat();
        let mut all = vec![0u8; world * 8];
        self.run(Collective::AllGather, DType::U32, 2, &mine, &mut all)?;
        let word = |r: usize, i: usize| {
            let at = r * 8 + i * 4;
            u32::from_le_bytes([all[at], all[at + 1], all[at + 2], all[at + 3]])
        };
        let mut members: Vec<usize> = (0..world).filter(|&r| c != NONE && word(r, 0) == c).collect();
        members.sort_by_key(|&r| (word(r, 1), r));
        // The new rank 0 of each color picks the rendezvous address and a nonce for the secret.
        const BLOB: usize = 96;
        let mut blob = [0u8; BLOB];
        // The leader keeps the listener it picked the port with and serves the rendezvous on it.
        let mut listener = None;
        if members.first() == Some(&(self.rank as usize)) {
            let ip = oob_bind_addr(&self.template.root);
            let l = TcpListener::bind((ip, 0))
                .map_err(|e| CommError::Bootstrap(format!("split: no free port on {ip}: {e}")))?;
            let port = l.local_addr().map_err(|e| CommError::Bootstrap(format!("split: {e}")))?.port();
            listener = Some(l);
            let nonce = Secret::generate().map_err(|e| CommError::Bootstrap(format!("split: {e}")))?;
            let text = format!("{}|{}", SocketAddr::new(ip, port), nonce.to_hex());
            blob[..text.len().min(BLOB)].copy_from_slice(&text.as_bytes()[..text.len().min(BLOB)]);
        }
        let mut blobs = vec![0u8; world * BLOB];
        self.run(Collective::AllGather, DType::U8, BLOB as u64, &blob, &mut blobs)?;
        let Some(&leader) = members.first() else { return Ok(None) };
        let text =
            String::from_utf8_lossy(&blobs[leader * BLOB..(leader + 1) * BLOB]).trim_end_matches('\0').to_owned();
        let (root, nonce) = text
            .split_once('|')
            .ok_or_else(|| CommError::Bootstrap(format!("split: rank {leader} sent no rendezvous address")))?;
        let nonce = Secret::from_hex(nonce).map_err(|e| CommError::Bootstrap(format!("split: {e}")))?;
        let secret = crate::bootstrap_mac::split_secret(&self.template.secret, nonce.bytes(), c);
        let rank = members.iter().position(|&r| r == self.rank as usize).unwrap_or(0) as u32;
        let opts = CommOptions {
            rank,
            world: members.len() as u32,
            root: root.to_owned(),
            secret,
            env_faults: false,
            ..self.template.clone()
        };
        Communicator::init_with(opts, listener).map(Some)
    }

    /// This rank.
    pub const fn rank(&self) -> Rank {
        Rank(self.rank)
    }

    /// Number of ranks.
    pub const fn world(&self) -> u32 {
        self.world
    }

    /// The node of every rank, by rank (nodes numbered by first appearance in rank order).
    pub fn nodes(&self) -> Vec<NodeId> {
        self.node_of.iter().map(|&n| NodeId(n)).collect()
    }

    /// The communicator's asynchronous error, if one happened (a lost peer, an abort).
    pub fn async_error(&self) -> Option<CommError> {
        self.shared.async_error()
    }

    /// The NICs every rank agreed are failed, as of the latest collective this rank started
    /// (the view its plans use; empty while every NIC is healthy). Rails are NIC indices on
    /// their node, nodes as [`Communicator::nodes`] numbers them.
    pub fn failed_nics(&self) -> Vec<NicId> {
        self.shared.failed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Failover and health events since the last call.
    pub fn take_events(&self) -> Vec<CommEvent> {
        self.shared.events.lock().map(|mut e| std::mem::take(&mut *e)).unwrap_or_default()
    }

    /// Abort: every rank's running and future collectives fail with `reason`. Never blocks on peers.
    pub fn abort(&self, reason: &str) {
        let _ = self.tx.send(Req::Abort(reason.to_owned()));
        self.waker.wake();
    }

    /// Leave the communicator gracefully (NCCL's `ncclCommFinalize` then `ncclCommDestroy`):
    /// every call already submitted finishes first; then this rank says goodbye and keeps
    /// serving its peers (acknowledging their last transfers) until each has left too, by
    /// `bootstrap.peer_timeout_ms`. [`CommError::Timeout`] names the ranks that had not left
    /// by then (this rank has left all the same).
    pub fn finalize(mut self) -> Result<(), CommError> {
        let staying = self.leave(true);
        match staying {
            Some(ranks) if !ranks.is_empty() => Err(CommError::Timeout {
                seq: 0,
                waited_ms: self.template.config.bootstrap.peer_timeout_ms,
                waiting: format!("rank(s) {ranks:?} to leave the communicator"),
            }),
            _ => Ok(()),
        }
    }

    /// Leave at once (NCCL's `ncclCommDestroy` after `ncclCommAbort`): calls not finished
    /// fail with [`CommError::Aborted`], peers are told this rank left, and nothing waits for
    /// them (this rank only gives its own connections still being set up at most 200 ms to
    /// settle, so that no peer's teardown meets them). Peers still in a collective with this rank get [`CommError::PeerLost`].
    pub fn destroy(mut self) {
        let _ = self.leave(false);
    }

    /// Stop the progress thread, lingering for the peers when `linger`; the ranks that had
    /// not left when it stopped (`None` when it had stopped already).
    fn leave(&mut self, linger: bool) -> Option<Vec<u32>> {
        // Device calls first: they need the progress thread, and their streams their flags.
        let lane = self.device.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        if let Some(lane) = lane {
            lane.shutdown(linger);
        }
        let thread = self.thread.take()?;
        let (reply, rx) = crossbeam_channel::bounded(1);
        let _ = self.tx.send(Req::Shutdown { linger, reply });
        self.waker.wake();
        let staying = rx.recv().ok();
        let _ = thread.join();
        staying
    }

    /// How long a call may take by default (from its submission): twelve peer timeouts, at
    /// least 12 s, the deadline the progress thread enforces too.
    pub fn collective_timeout(&self) -> Duration {
        Duration::from_millis(self.template.config.bootstrap.peer_timeout_ms.max(1000) * 12)
    }
}

impl Drop for Communicator {
    /// As [`Communicator::finalize`], ignoring its result: may wait up to
    /// `bootstrap.peer_timeout_ms` for peers that have not left; [`Communicator::destroy`]
    /// leaves at once.
    fn drop(&mut self) {
        let _ = self.leave(true);
    }
}

/// Local address to bind the OOB listener on: the address this host uses to reach the root.
fn oob_bind_addr(root: &str) -> IpAddr {
    let target = root.to_socket_addrs().ok().and_then(|mut a| a.next());
    match target {
        Some(SocketAddr::V4(a)) if a.ip().is_loopback() => IpAddr::from([127, 0, 0, 1]),
        Some(a) => std::net::UdpSocket::bind(if a.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" })
            .and_then(|s| s.connect(a).and_then(|()| s.local_addr()))
            .map_or(IpAddr::from([127, 0, 0, 1]), |l| l.ip()),
        None => IpAddr::from([127, 0, 0, 1]),
    }
}

struct Progress {
    rank: u32,
    world: u32,
    node_of: Vec<u32>,
    nics: usize,
    /// The planner's NIC rate, Mbit/s (the slowest any rank reported at bootstrap).
    nic_mbps: u64,
    mesh: OobMesh,
    /// Readable when a caller or an OOB reader has something for this thread.
    wake_rx: WakeReceiver,
    /// Per-NIC `(tx, rx)` byte counts already exported as metrics.
    nic_bytes_seen: Vec<(u64, u64)>,
    /// Schedules already planned, by collective, type, count and agreed view.
    plan_cache: BTreeMap<String, (r2ccl_algo::RankSchedule, Schedule)>,
    transport: UcxTransport,
    engine: Engine,
    shared: Arc<Shared>,
    start: Instant,
    cfg: Config,
    agreed: HealthView,
    agreement: Option<Agreement>,
    stash: BTreeMap<u64, Vec<(u32, HealthView)>>,
    seq: u64,
    /// This rank's argument descriptions waiting for a peer's: (collective, peer) -> text.
    descs: BTreeMap<(u64, u32), String>,
    /// Peers' argument descriptions that came before this rank's: (collective, peer) -> text.
    peer_descs: BTreeMap<(u64, u32), String>,
    broken: Option<CommError>,
    policy_topo: Option<r2ccl_policy::Topology>,
    /// OOB messages that arrived during init, before the progress loop ran.
    early_oob: Vec<OobEvent>,
    departed: std::collections::BTreeSet<u32>,
    /// For each departed rank, the last collective it completed (from its goodbye): a
    /// collective after that one can never complete here.
    departed_after: std::collections::BTreeMap<u32, u64>,
    /// The last collective this rank completed (its part finished and was delivered).
    last_done: u64,
    /// Chunks and frames refused so far (forged, malformed or stray); logged at powers of two.
    refused_inputs: u64,
}

struct Current {
    seq: u64,
    reply: Sender<Reply>,
    /// The caller's borrowed output buffer (written here, never after the reply, and only
    /// under `access`).
    borrowed: Option<(*mut u8, usize)>,
    /// Guards `borrowed`.
    access: Option<Access>,
    /// The collective ran on registered memory: its result is in place already.
    registered: bool,
    out_len: usize,
    /// The collective's name (`all_reduce`, ..., `group`), for metrics.
    name: &'static str,
    strategy: Schedule,
    epoch: u64,
    started: Instant,
    deadline: Instant,
}

impl Progress {
    fn init(
        opts: CommOptions,
        root_listener: Option<TcpListener>,
        shared: Arc<Shared>,
        wake_rx: WakeReceiver,
    ) -> Result<Self, CommError> {
        let cfg = opts.config.clone();
        let deadline = Instant::now() + Duration::from_millis(cfg.bootstrap.connect_timeout_ms);
        let bind_ip = if cfg.bootstrap.oob_iface.is_empty() {
            oob_bind_addr(&opts.root)
        } else {
            let spec = &cfg.bootstrap.oob_iface;
            let (iface, ip) = crate::netif::select_oob(spec, &crate::netif::ipv4_addresses()).ok_or_else(|| {
                CommError::Invalid(format!(
                    "bootstrap.oob_iface `{spec}` (R2CCL_OOB_IFACE) matches no interface with an IPv4 address here"
                ))
            })?;
            if &iface != spec {
                tracing::info!(target: subsys::INIT, spec = %spec, %iface, %ip, "OOB interface from bootstrap.oob_iface");
            }
            IpAddr::V4(ip)
        };
        let oob = TcpListener::bind((bind_ip, 0))
            .map_err(|e| CommError::Bootstrap(format!("OOB listener on {bind_ip}: {e}")))?;
        let oob_addr = oob.local_addr().map_err(|e| CommError::Bootstrap(e.to_string()))?.to_string();
        // `topo.file`: this node's entry gives NIC rates and NUMA nodes that discovery may not see.
        let file_node = if cfg.topo.file.is_empty() { None } else { Some(topo_file_node(&cfg.topo.file, &opts.node)?) };
        let me = PeerInfo {
            rank: opts.rank,
            node: opts.node.clone(),
            oob_addr,
            blob: nic_blob(&nic_facts(&opts.nics, cfg.transport.nic_speed_mbps, file_node.as_ref())),
        };
        let table = if opts.rank == 0 {
            let addr = opts
                .root
                .to_socket_addrs()
                .ok()
                .and_then(|mut a| a.next())
                .ok_or_else(|| CommError::Invalid(format!("cannot resolve rendezvous address {}", opts.root)))?;
            let root = match root_listener {
                Some(l) => Root::from_listener(l, opts.secret.clone()),
                None => Root::bind(addr, opts.secret.clone()).map_err(|e| CommError::Bootstrap(e.to_string()))?,
            };
            let (table, stats) = root.run(opts.world, me, deadline).map_err(|e| CommError::Bootstrap(e.to_string()))?;
            if stats.rejected > 0 {
                crate::metrics::count_rejected("bootstrap", stats.rejected);
            }
            table
        } else {
            join(&opts.root, &opts.secret, opts.world, me, deadline).map_err(|e| CommError::Bootstrap(e.to_string()))?
        };
        // Node numbering: by first appearance in rank order, identical on every rank.
        let mut names: Vec<&str> = Vec::new();
        let node_of: Vec<u32> = table
            .iter()
            .map(|p| match names.iter().position(|n| *n == p.node) {
                Some(i) => i as u32,
                None => {
                    names.push(&p.node);
                    (names.len() - 1) as u32
                }
            })
            .collect();
        let nic_counts: Vec<u32> =
            table.iter().map(|p| p.blob.get(..4).map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))).collect();
        if nic_counts.iter().any(|&k| k as usize != opts.nics.len()) {
            return Err(CommError::Invalid(format!("ranks disagree on the number of data NICs: {nic_counts:?}")));
        }
        // The planner's NIC rate: the slowest NIC any rank reported, the same on every rank.
        let nic_mbps = table.iter().filter_map(|p| blob_min_speed(&p.blob)).min().unwrap_or(NIC_MBPS);
        let mesh = OobMesh::establish(
            oob,
            opts.rank,
            &table,
            &opts.secret,
            Duration::from_millis(cfg.bootstrap.peer_timeout_ms),
            deadline,
        )
        .map_err(|e| CommError::Bootstrap(e.to_string()))?;
        let node = NodeId(node_of[opts.rank as usize]);
        let mut ucfg = UcxTransportConfig {
            rank: Rank(opts.rank),
            node,
            nics: opts
                .nics
                .iter()
                .map(|d| ContextConfig {
                    rx_segment: usize::try_from(cfg.transport.tcp_rx_segment_bytes).ok(),
                    ..ContextConfig::tcp(d.clone())
                })
                .collect(),
            faults: Vec::new(),
            link_monitor: true,
        };
        if opts.env_faults {
            ucfg = ucfg.with_env_faults().map_err(|e| CommError::Invalid(format!("R2CCL_FAULT: {e}")))?;
        }
        let mut transport = UcxTransport::open(ucfg).map_err(|e| CommError::Transport(e.to_string()))?;
        crate::metrics::set_build_info(
            &r2ccl_ucx::UcxVersion::built().map(|v| v.to_string()).unwrap_or_default(),
            &r2ccl_ucx::UcxVersion::loaded().to_string(),
        );
        let blob = transport.local_address_blob().map_err(|e| CommError::Transport(e.to_string()))?;
        // Allgather of UCX addresses over the OOB mesh.
        mesh.broadcast(Channel::Control, &blob);
        let mut blobs: Vec<Option<Vec<u8>>> = vec![None; opts.world as usize];
        blobs[opts.rank as usize] = Some(blob);
        // Faster ranks may already send collective traffic (views, argument checks): keep it
        // for the progress loop; only a rank's first control message is its address.
        let mut early_oob = Vec::new();
        while blobs.iter().any(Option::is_none) {
            match mesh.recv_deadline(deadline) {
                Some(OobEvent::Message { from, channel: Channel::Control, payload })
                    if blobs.get(from as usize).is_some_and(Option::is_none) =>
                {
                    blobs[from as usize] = Some(payload);
                }
                Some(OobEvent::PeerLost { rank, why }) => return Err(CommError::PeerLost { rank: Rank(rank), why }),
                Some(ev) => early_oob.push(ev),
                None => {
                    let missing: Vec<usize> =
                        blobs.iter().enumerate().filter(|(_, b)| b.is_none()).map(|(i, _)| i).collect();
                    return Err(CommError::Bootstrap(format!(
                        "no transport address from rank(s) {missing:?} by the deadline"
                    )));
                }
            }
        }
        let blobs: Vec<Vec<u8>> = blobs.into_iter().flatten().collect();
        transport.connect_peers(&blobs).map_err(|e| CommError::Transport(e.to_string()))?;
        let nodes = names.len();
        let nics = opts.nics.len();
        // Each node's NIC NUMA nodes, from its first rank's blob.
        let numa: Vec<Vec<Option<u32>>> = (0..nodes)
            .map(|n| {
                let first = node_of.iter().position(|&x| x as usize == n);
                let facts = first.and_then(|r| table.get(r)).and_then(|p| blob_facts(&p.blob)).unwrap_or_default();
                facts.iter().map(|f| f.numa).collect()
            })
            .collect();
        let topo = transport_topology(&node_of, nics, &numa)?;
        // Progress deadline: the margin plus the time a full window of chunks takes at a
        // pessimistic 100 MB/s (a loaded host must not look like a black hole).
        let stall_timeout = Duration::from_millis(
            cfg.detect.progress_margin_ms
                + cfg.transport.chunk_bytes * u64::from(cfg.transport.max_inflight_chunks) / 100_000,
        );
        // A slow peer (a busy or descheduled process) must be given time to answer before
        // its path counts as dead; a silent black hole is still declared within a second.
        let probe_timeout = (2 * stall_timeout).max(Duration::from_millis(500));
        // This communicator's chunk-header key and id: from the secret and the random session
        // nonce rank 0 put in the authenticated table (docs/security.md).
        let (header_key, comm_id) = crate::bootstrap_mac::data_keys(&opts.secret, &table.session);
        let ecfg = EngineConfig {
            comm: comm_id,
            header_key,
            stall_timeout,
            session: SessionConfig {
                chunk_size: u32::try_from(cfg.transport.chunk_bytes).unwrap_or(1 << 20),
                window: cfg.transport.max_inflight_chunks,
                // Chunks of a step the receiver has not reached yet wait here; beyond it they
                // are dropped and replayed on request (Nack), never lost.
                max_early_bytes: 512 << 20,
                ..SessionConfig::default()
            },
            probe_interval: Duration::from_millis(cfg.detect.probe_interval_ms),
            probe_timeout,
            migrate_retry: Duration::from_millis(cfg.detect.oob_retry_ms.max(10)),
            // UcxTransport connects rail r to the peers' rail r only.
            rail_only: true,
            detect: detect_config(&cfg.detect),
            no_path_timeout: Duration::from_millis(cfg.detect.no_path_timeout_ms),
        };
        let mut engine =
            Engine::new(Rank(opts.rank), opts.world, ecfg, topo).map_err(|e| CommError::Transport(e.to_string()))?;
        let mut agreed = HealthView::uniform(nodes, nics, nic_mbps);
        // NICs that could not be opened when their rank started are failed from the first
        // collective on; every rank derives the same set from the same address blobs.
        let dead = transport.dead_nics();
        for nic in &dead {
            let _ = agreed.set_failed(*nic);
            engine.mark_nic_down(Duration::ZERO, &mut transport, *nic);
        }
        if let Ok(mut f) = shared.failed.lock() {
            *f = agreed.failed_nics();
        }
        if !dead.is_empty() {
            let names: Vec<String> = dead.iter().map(ToString::to_string).collect();
            tracing::warn!(target: subsys::INIT, rank = opts.rank, nics = ?names, "NICs unusable since the start; planning without them");
        }
        // The planner models ranks numbered node by node with the same count on every node.
        let rpn = opts.world as usize / nodes.max(1);
        let contiguous = rpn * nodes == opts.world as usize
            && node_of.iter().enumerate().all(|(r, &n)| n as usize == r / rpn.max(1));
        let policy_topo = if contiguous {
            r2ccl_policy::Topology::uniform(nodes, nics, nic_mbps)
                .and_then(|t| t.with_ranks_per_node(rpn as u32))
                .and_then(|t| t.with_alpha(LOOPBACK_ALPHA_S))
                // The UCX backend connects NIC r only to the peers' NIC r (a rail-only fabric, as
                // on the namespace testbed): plans must not send across rails.
                .and_then(|t| t.with_spine_permille(0))
                .ok()
        } else {
            None
        };
        for n in 0..nodes {
            for r in 0..nics {
                crate::metrics::set_nic_up(&format!("node{n}"), &format!("nic{r}"), true);
            }
        }
        if opts.rank == 0 && !cfg.topo.dump_file.is_empty() {
            match dump_cluster_view(&cfg.topo.dump_file, &names, &node_of, &opts.nics, nic_mbps) {
                Ok(()) => tracing::info!(target: subsys::TOPO, file = %cfg.topo.dump_file, "cluster view written"),
                Err(e) => {
                    tracing::warn!(target: subsys::TOPO, file = %cfg.topo.dump_file, error = %e, "cluster view not written")
                }
            }
        }
        tracing::info!(target: subsys::INIT, rank = opts.rank, world = opts.world, nodes, nics, nic_mbps, "communicator ready");
        Ok(Self {
            rank: opts.rank,
            world: opts.world,
            node_of,
            nics,
            nic_mbps,
            mesh,
            transport,
            engine,
            shared,
            start: Instant::now(),
            cfg,
            agreed,
            agreement: None,
            stash: BTreeMap::new(),
            seq: 0,
            descs: BTreeMap::new(),
            peer_descs: BTreeMap::new(),
            broken: None,
            policy_topo,
            early_oob,
            departed: std::collections::BTreeSet::new(),
            departed_after: std::collections::BTreeMap::new(),
            last_done: 0,
            refused_inputs: 0,
            wake_rx,
            nic_bytes_seen: Vec::new(),
            plan_cache: BTreeMap::new(),
        })
    }
}

/// Write the communicator's cluster view (nodes in rank order, their ranks and data NICs) to
/// `path` as a topology description that `r2ccl-topo` loads back (`R2CCL_TOPO_DUMP_FILE`).
fn dump_cluster_view(path: &str, names: &[&str], node_of: &[u32], nics: &[String], mbps: u64) -> Result<(), String> {
    let contiguous = node_of.windows(2).all(|w| w[1] == w[0] || w[1] == w[0] + 1);
    if !contiguous {
        return Err("ranks are not numbered node by node; the description format needs that".into());
    }
    let mut text = format!(
        "name = \"r2ccl-communicator\"\ndescription = \"cluster view of a communicator: {} ranks on {} nodes\"\nrails = {}\n",
        node_of.len(),
        names.len(),
        nics.len()
    );
    for (n, name) in names.iter().enumerate() {
        let ranks = node_of.iter().filter(|&&x| x as usize == n).count();
        text.push_str(&format!("\n[[nodes]]\nhostname = {name:?}\nranks = {ranks}\nnuma_nodes = [{{ id = 0 }}]\n"));
        for (r, nic) in nics.iter().enumerate() {
            // Several rails on one interface (loopback runs) still need distinct NIC names.
            let unique = nics.iter().filter(|x| *x == nic).count() == 1;
            let nic_name = if unique { nic.clone() } else { format!("{nic}.{r}") };
            text.push_str(&format!(
                "\n[[nodes.nics]]\nname = {nic_name:?}\nrail = {r}\nspeed_mbps = {mbps}\nvirtual = true\nnuma = 0\n"
            ));
        }
    }
    let desc = r2ccl_topo::description::TopologyDescription::from_toml_str(&text).map_err(|e| e.to_string())?;
    let cluster = desc.resolve().map_err(|e| e.to_string())?;
    r2ccl_topo::write_cluster_view(std::path::Path::new(path), &cluster, None).map_err(|e| e.to_string())
}

/// The shortest probe timeout the communicator's detector uses (localization and re-probes).
const DETECT_PROBE_TIMEOUT: Duration = Duration::from_millis(250);

/// The `verdict` label of the failover metric.
const fn verdict_label(v: r2ccl_detect::Verdict) -> &'static str {
    match v {
        r2ccl_detect::Verdict::LocalNic(_) => "local_nic",
        r2ccl_detect::Verdict::RemoteNic(_) => "remote_nic",
        r2ccl_detect::Verdict::Link { .. } => "link",
        r2ccl_detect::Verdict::Transient => "transient",
    }
}

/// The detector's settings from the `[detect]` section. Its probes wait at least
/// [`DETECT_PROBE_TIMEOUT`], so a busy host's late answer does not blame a healthy NIC;
/// re-probes are at least 50 ms further apart than that, localization waits for the probes
/// plus two OOB resends, and the first hold-down outlasts localization by 50 ms (the detector
/// requires each of these orders).
fn detect_config(d: &r2ccl_config::DetectConfig) -> r2ccl_detect::DetectConfig {
    let ms = Duration::from_millis;
    let probe_timeout = DETECT_PROBE_TIMEOUT.max(ms(d.probe_timeout_ms));
    let localize_timeout = (probe_timeout + 2 * ms(d.oob_retry_ms)).max(ms(d.localize_timeout_ms));
    // The detector needs localization to end before the hold-down does.
    let holddown_base = ms(d.holddown_base_ms).max(localize_timeout + ms(50));
    r2ccl_detect::DetectConfig {
        progress_margin: ms(d.progress_margin_ms),
        heartbeat_interval: ms(d.heartbeat_interval_ms),
        heartbeat_misses: d.heartbeat_misses,
        probe_timeout,
        localize_timeout,
        oob_retry: ms(d.oob_retry_ms),
        oob_max_retries: d.oob_max_retries,
        hint_interval: ms(d.hint_interval_ms),
        probe_interval: ms(d.probe_interval_ms).max(probe_timeout + ms(50)),
        good_probes: d.good_probes,
        holddown_base,
        holddown_max: ms(d.holddown_max_ms).max(holddown_base),
        flap_window: ms(d.flap_window_ms),
    }
}

/// The transport topology: every node has `nics` NICs; each NIC's backup chain is the
/// node's other NICs by locality: those on the same NUMA node first (`numa[node][rail]`, from
/// the node's first rank's blob), then the others, each group in rail order starting after it.
fn transport_topology(node_of: &[u32], nics: usize, numa: &[Vec<Option<u32>>]) -> Result<Topology, CommError> {
    let nodes = node_of.iter().max().map_or(0, |&m| m as usize + 1);
    let k = u16::try_from(nics).map_err(|_| CommError::Invalid(format!("{nics} NICs")))?;
    let mut chains = BTreeMap::new();
    for n in 0..nodes as u32 {
        let numa_of = |rail: u16| numa.get(n as usize).and_then(|v| v.get(usize::from(rail))).copied().flatten();
        for r in 0..k {
            let mut others: Vec<u16> = (1..k).map(|d| (r + d) % k).collect();
            // Stable: rail order within each group.
            others.sort_by_key(|&x| !(numa_of(r).is_some() && numa_of(x) == numa_of(r)));
            chains.insert(NicId::new(n, r), others.into_iter().map(|x| NicId::new(n, x)).collect());
        }
    }
    Topology::new(node_of.iter().map(|&n| NodeId(n)).collect(), vec![k; nodes], chains)
        .map_err(|e| CommError::Invalid(e.to_string()))
}

/// NIC rate assumed when neither `transport.nic_speed_mbps` nor the driver gives one, Mbit/s.
const NIC_MBPS: u64 = 100_000;

/// What a rank tells the others about each of its data NICs at bootstrap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct NicFacts {
    /// Line rate, Mbit/s.
    mbps: u64,
    /// NUMA node, if known.
    numa: Option<u32>,
}

/// The facts of this rank's data NICs: the rate is `configured` when set, else the one in
/// `file` (the node's `topo.file` entry, matched by interface name), else what the driver
/// reports in sysfs, else [`NIC_MBPS`]; the NUMA node comes from `file`, else sysfs.
fn nic_facts(nics: &[String], configured: u64, file: Option<&r2ccl_topo::NodeTopology>) -> Vec<NicFacts> {
    nics.iter()
        .map(|name| {
            let listed = file.and_then(|n| n.nics.iter().find(|x| x.name == *name));
            let found = r2ccl_topo::discover::sysfs::read_interface(std::path::Path::new("/sys"), name).ok();
            let mbps = if configured > 0 {
                configured
            } else {
                listed.map(|x| x.speed_mbps).or_else(|| found.as_ref().and_then(|d| d.speed_mbps)).unwrap_or(NIC_MBPS)
            };
            let numa = listed.and_then(|x| x.numa).or_else(|| found.as_ref().and_then(|d| d.numa));
            NicFacts { mbps, numa }
        })
        .collect()
}

/// How many collectives ahead of this rank a peer's health views and argument descriptions are
/// kept (a peer runs ahead by the collectives already queued; the rest is dropped and counted).
const PEER_AHEAD: u64 = 4096;
/// Longest argument description kept from a peer, bytes.
const MAX_DESC: usize = 4096;

/// NUMA node "unknown" in a blob.
const NO_NUMA: u32 = u32::MAX;

/// A rank's bootstrap blob: its number of data NICs (u32), then each NIC's rate in Mbit/s
/// (u64), then each NIC's NUMA node (u32, [`NO_NUMA`] when unknown).
pub(crate) fn nic_blob(facts: &[NicFacts]) -> Vec<u8> {
    let mut blob = (facts.len() as u32).to_le_bytes().to_vec();
    for f in facts {
        blob.extend_from_slice(&f.mbps.to_le_bytes());
    }
    for f in facts {
        blob.extend_from_slice(&f.numa.unwrap_or(NO_NUMA).to_le_bytes());
    }
    blob
}

/// The NIC facts in a peer's blob ([`nic_blob`]); `None` when it is malformed.
pub(crate) fn blob_facts(blob: &[u8]) -> Option<Vec<NicFacts>> {
    let (count, rest) = blob.split_first_chunk::<4>()?;
    let count = u32::from_le_bytes(*count) as usize;
    if rest.len() != count.checked_mul(12)? {
        return None;
    }
    let (speeds, numas) = rest.split_at(count * 8);
    let speeds = speeds.chunks_exact(8).filter_map(|b| <[u8; 8]>::try_from(b).ok().map(u64::from_le_bytes));
    let numas = numas.chunks_exact(4).filter_map(|b| <[u8; 4]>::try_from(b).ok().map(u32::from_le_bytes));
    Some(speeds.zip(numas).map(|(mbps, n)| NicFacts { mbps, numa: (n != NO_NUMA).then_some(n) }).collect())
}

/// The slowest NIC rate in a peer's blob; `None` when it lists none or is malformed.
fn blob_min_speed(blob: &[u8]) -> Option<u64> {
    blob_facts(blob)?.iter().map(|f| f.mbps).filter(|&v| v > 0).min()
}

/// `topo.file`: the entry of host `node` (`R2CCL_NODE` or the host name) in the static
/// topology description at `path`.
fn topo_file_node(path: &str, node: &str) -> Result<r2ccl_topo::NodeTopology, CommError> {
    let cluster = r2ccl_topo::load_cluster_file(std::path::Path::new(path))
        .map_err(|e| CommError::Invalid(format!("topo.file {path}: {e}")))?;
    cluster.nodes().iter().find(|n| n.hostname == node).cloned().ok_or_else(|| {
        let listed: Vec<&str> = cluster.nodes().iter().map(|n| n.hostname.as_str()).collect();
        CommError::Invalid(format!(
            "topo.file {path} has no node {node:?} (R2CCL_NODE, else the host name); it lists {listed:?}"
        ))
    })
}

/// The data NICs of a `topo.file` node entry, in rail order.
fn file_nics(node: &r2ccl_topo::NodeTopology) -> Vec<String> {
    let mut nics: Vec<&r2ccl_topo::Nic> = node.nics.iter().collect();
    nics.sort_by_key(|n| n.rail);
    nics.into_iter().map(|n| n.name.clone()).collect()
}

/// Per-message latency assumed by the planner's cost model, seconds (`cargo xtask bench` passes the same to
/// `r2ccl-plan`: keep `LIBRARY_ALPHA_US` in xtask/src/bench.rs equal).
const LOOPBACK_ALPHA_S: f64 = 20e-6;

/// Smallest part of a pipelined ring step per sending NIC, bytes (see [`pipeline_ring`]).
const RING_PART_MIN: u64 = 128 << 10;
/// A part of a pipelined ring step carries at least this much of a NIC's time (see
/// [`pipeline_ring`]), so the per-message cost stays small next to the transfer.
const RING_PART_TIME_US: u64 = 1000;
/// Most parts a ring step is pipelined in.
const RING_PARTS_MAX: u32 = 64;

/// Pipeline a plain ring (AllReduce, ReduceScatter, AllGather under Ring, Balance or single
/// backup, one part per step as planned) in parts of at least [`RING_PART_MIN`] bytes and
/// [`RING_PART_TIME_US`] of NIC time (at `nic_mbps`) per NIC: a step's next part leaves as
/// soon as its previous part arrived, so the NICs keep sending across step boundaries, where
/// one part per step left every link idle until its slowest lane finished (4 nodes x 2 NICs
/// at 100 mbit, 64 MiB AllReduce: about 0.1 s per step).
fn pipeline_ring(req: ScheduleRequest, ranks: usize, nics: usize, nic_mbps: u64) -> ScheduleRequest {
    let plain = matches!(req.strategy, Strategy::Balance | Strategy::SingleBackup);
    let step_elems = match req.collective {
        Collective::AllReduce { .. } => req.count / (ranks.max(1) as u64),
        Collective::ReduceScatter { .. } | Collective::AllGather => req.count,
        _ => return req,
    };
    if req.algorithm != Algorithm::Ring || !plain || req.chunks != 1 || ranks < 2 {
        return req;
    }
    let step_bytes = step_elems.saturating_mul(req.dtype.size() as u64);
    let part = RING_PART_MIN.max(nic_mbps.saturating_mul(RING_PART_TIME_US) / 8);
    let parts = step_bytes / part.saturating_mul(nics.max(1) as u64);
    let parts = u32::try_from(parts).unwrap_or(u32::MAX).clamp(1, RING_PARTS_MAX);
    req.with_chunks(parts)
}

/// Most plans a communicator keeps (the cache starts over when full).
const PLAN_CACHE: usize = 64;
/// Progress rounds without movement before the progress thread sleeps.
const IDLE_SPINS: u32 = 8;
/// Longest sleep of an idle progress thread while calls are running or queued (bounds every
/// timer's lateness during a collective).
const IDLE_WAIT: Duration = Duration::from_millis(1);
/// Longest sleep once no call has run or waited for [`QUIET_AFTER`]: an idle communicator
/// sleeps until the engine's next timer (heartbeats and probes of idle paths), at most this
/// long, instead of waking 1,000 times a second; UCX, OOB and caller events wake it at once.
const QUIET_WAIT: Duration = Duration::from_millis(100);
/// How long after its last call a communicator counts as quiet.
const QUIET_AFTER: Duration = Duration::from_millis(100);

const ABORT_MISMATCH: u8 = 1;
const ABORT_REASON: u8 = 2;
/// A rank is done with the communicator and leaves; its disconnect is not a failure.
const DEPART: u8 = 3;

impl Progress {
    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    fn note(&self, text: String) {
        tracing::info!(target: subsys::NET, rank = self.rank, "{text}");
        if let Ok(mut e) = self.shared.events.lock() {
            e.push(CommEvent { at_ms: self.start.elapsed().as_millis() as u64, text });
        }
    }

    fn set_broken(&mut self, e: CommError) {
        if self.broken.is_none() {
            tracing::error!(target: subsys::COLL, rank = self.rank, error = %e, "communicator broken");
            if let Ok(mut slot) = self.shared.error.lock() {
                *slot = Some(e.clone());
            }
            self.broken = Some(e);
        }
    }

    fn fail(&mut self, current: &mut Option<Current>, e: CommError) {
        if let Some(c) = current.take() {
            let waiting = self.engine.waiting();
            if !waiting.is_empty() {
                tracing::warn!(target: subsys::COLL, rank = self.rank, seq = c.seq, error = %e, waiting = %waiting.join("; "), "collective abandoned");
            }
            let now = self.now();
            self.engine.abandon(now, &mut self.transport);
            // A failure only this rank saw must not leave the others waiting for their deadline.
            if e.is_local_failure() {
                let mut msg = vec![ABORT_REASON];
                msg.extend_from_slice(e.to_string().as_bytes());
                self.mesh.broadcast(Channel::Abort, &msg);
                self.set_broken(CommError::Aborted(format!("rank {}: {e}", self.rank)));
            }
            let _ = c.reply.send(Err(e));
        }
    }

    /// Add the bytes each local NIC moved since the last call to `r2ccl_nic_bytes_total`.
    fn export_nic_bytes(&mut self) {
        let now = self.transport.nic_bytes();
        let node = format!("node{}", self.node_of.get(self.rank as usize).copied().unwrap_or(0));
        for (r, &(tx, rx)) in now.iter().enumerate() {
            let (ptx, prx) = self.nic_bytes_seen.get(r).copied().unwrap_or((0, 0));
            let nic = format!("nic{r}");
            crate::metrics::add_nic_bytes(&node, &nic, true, tx.saturating_sub(ptx));
            crate::metrics::add_nic_bytes(&node, &nic, false, rx.saturating_sub(prx));
        }
        self.nic_bytes_seen = now;
    }

    /// This rank's view for the next agreement: the agreed one with every NIC the engine knows
    /// to be down failed, and every failed NIC it no longer knows to be down healthy again (its
    /// link came back, or a blamed NIC answers probes), so a recovered NIC is planned with again
    /// once every rank has seen it come back (the merge is a union of failures).
    fn local_view(&self) -> HealthView {
        let mut v = self.agreed.clone();
        let down = self.engine.down_nics();
        for nic in v.failed_nics() {
            if !down.contains(&nic) {
                let _ = v.set_healthy(nic);
            }
        }
        for nic in down {
            let _ = v.set_failed(*nic);
        }
        v
    }

    fn layout(&self) -> Result<Layout, CommError> {
        Layout::from_rank_nodes(self.node_of.iter().map(|&n| NodeId(n)).collect(), self.nics)
            .map_err(|e| CommError::Invalid(e.to_string()))
    }

    fn run(mut self, rx: &Receiver<Req>) {
        let mut current: Option<Current> = None;
        for ev in std::mem::take(&mut self.early_oob) {
            self.on_oob(ev, &mut current);
        }
        // Requests not started yet, with when they arrived (a collective waiting for the
        // previous round's health views is bounded by the collective deadline too).
        let mut queue: std::collections::VecDeque<(Instant, Req)> = std::collections::VecDeque::new();
        let mut last_moved = (0, 0, 0);
        let mut idle_spins = 0u32;
        let mut last_busy = Instant::now();
        // A graceful shutdown waiting for the calls submitted before it.
        let mut shutdown: Option<(bool, Sender<Vec<u32>>)> = None;
        loop {
            if shutdown.is_some() && ((current.is_none() && queue.is_empty()) || self.broken.is_some()) {
                if let Some((linger, reply)) = shutdown.take() {
                    self.fail_queued(&mut queue);
                    let _ = reply.send(self.depart(&mut current, linger));
                    return;
                }
            }
            // try_recv, not recv_timeout(ZERO): the latter backs off (spins, then yields) before
            // it gives up, on every round of this loop.
            match rx.try_recv() {
                Ok(Req::Shutdown { linger, reply }) => {
                    // Calls submitted before the shutdown finish first (a graceful leave).
                    if linger && (current.is_some() || !queue.is_empty()) && self.broken.is_none() {
                        shutdown = Some((linger, reply));
                    } else {
                        self.fail_queued(&mut queue);
                        let _ = reply.send(self.depart(&mut current, linger));
                        return;
                    }
                }
                Err(crossbeam_channel::TryRecvError::Disconnected) => {
                    self.fail_queued(&mut queue);
                    self.depart(&mut current, true);
                    return;
                }
                Ok(Req::Abort(reason)) => {
                    let mut msg = vec![ABORT_REASON];
                    msg.extend_from_slice(reason.as_bytes());
                    self.mesh.broadcast(Channel::Abort, &msg);
                    let e = CommError::Aborted(reason);
                    self.set_broken(e.clone());
                    self.fail(&mut current, e);
                }
                Ok(Req::Alloc { len, reply }) => {
                    let _ = reply.send(self.register_for_caller(len));
                }
                Ok(Req::Free(h)) => {
                    let _ = self.transport.deregister(h);
                }
                Ok(req) => queue.push_back((Instant::now(), req)),
                Err(crossbeam_channel::TryRecvError::Empty) => {}
            }
            if current.is_none() {
                if let Some((queued, req)) = queue.front() {
                    let blocked = if self.broken.is_some() { None } else { self.unstartable(*queued, req) };
                    if let Some(e) = self.broken.clone().or(blocked) {
                        if self.broken.is_none() && e.is_local_failure() {
                            // Peers waiting in this collective must not wait for their deadline.
                            let mut msg = vec![ABORT_REASON];
                            msg.extend_from_slice(e.to_string().as_bytes());
                            self.mesh.broadcast(Channel::Abort, &msg);
                            self.set_broken(CommError::Aborted(format!("rank {}: {e}", self.rank)));
                        }
                        if let Some((_, Req::Coll { reply, .. })) = queue.pop_front() {
                            let _ = reply.send(Err(e));
                        }
                    } else if self.ready_to_plan(matches!(req, Req::Coll { .. })) {
                        if let Some((_, Req::Coll { call, deadline, reply })) = queue.pop_front() {
                            current = self.start_coll(call, deadline, reply);
                        }
                    }
                }
            }
            if let Some(c) = &current {
                // A rank that left after an earlier collective will never join this one.
                let gone = self.departed_after.iter().find(|(_, &last)| last < c.seq).map(|(&r, &last)| (r, last));
                if let Some((rank, last)) = gone {
                    let seq = c.seq;
                    let why = format!("it left the communicator after collective #{last}, so #{seq} cannot complete");
                    self.set_broken(CommError::PeerLost { rank: Rank(rank), why: why.clone() });
                    self.fail(&mut current, CommError::PeerLost { rank: Rank(rank), why });
                }
            }
            while let Some(ev) = self.mesh.recv_deadline(Instant::now()) {
                self.on_oob(ev, &mut current);
            }
            let now = self.now();
            if let Err(e) = self.engine.drive(now, &mut self.transport) {
                let seq = current.as_ref().map_or(0, |c| c.seq);
                self.fail(&mut current, CommError::from_engine(seq, &e));
            }
            self.flush_engine();
            if let Some(c) = &current {
                if self.engine.take_finished() == Some(c.seq) {
                    if let Some(c) = current.take() {
                        let out = match c.borrowed {
                            _ if c.registered => Ok(Vec::new()),
                            Some((ptr, len)) => {
                                let (engine, transport) = (&self.engine, &self.transport);
                                let copy_out = || {
                                    // SAFETY: under the call's access lock with its caller still
                                    // waiting, so the borrow is alive (call.rs).
                                    let dst = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
                                    engine.output_into(transport, dst).map(|()| Vec::new())
                                };
                                // A caller that gave up wants nothing written any more.
                                c.access
                                    .as_ref()
                                    .map_or_else(|| Some(copy_out()), |a| a.with(copy_out))
                                    .unwrap_or(Ok(Vec::new()))
                            }
                            None => self.engine.output(&self.transport, c.out_len),
                        };
                        let secs = c.started.elapsed().as_secs_f64();
                        self.last_done = c.seq;
                        crate::metrics::record_collective(c.name, c.strategy.name(), secs);
                        self.export_nic_bytes();
                        let report = CollReport { seq: c.seq, strategy: c.strategy, epoch: c.epoch, seconds: secs };
                        let _ = c.reply.send(out.map(|o| (o, report)).map_err(|e| CommError::from_engine(c.seq, &e)));
                    }
                } else if Instant::now() > c.deadline {
                    let waiting = self.engine.waiting().join("; ");
                    let e =
                        CommError::Timeout { seq: c.seq, waited_ms: c.started.elapsed().as_millis() as u64, waiting };
                    self.fail(&mut current, e);
                }
            }
            // Sleep when nothing moves, until UCX, a caller or an OOB reader has something (at
            // most IDLE_WAIT, the resolution of every timer): ranks that share cores (many ranks
            // per host, or an oversubscribed CI machine) must not starve the peers they wait for.
            let stats = self.engine.session().stats();
            let moved = (stats.chunks_sent, stats.chunks_applied, stats.chunks_posted);
            if current.is_some() || !queue.is_empty() {
                last_busy = Instant::now();
            }
            if moved == last_moved {
                idle_spins += 1;
                if idle_spins > IDLE_SPINS {
                    let mut fds = self.mesh.fds();
                    fds.push(self.wake_rx.fd());
                    let wait = if last_busy.elapsed() > QUIET_AFTER {
                        let now = self.now();
                        let next = self.engine.poll_timeout().map_or(QUIET_WAIT, |t| t.saturating_sub(now));
                        next.clamp(IDLE_WAIT, QUIET_WAIT)
                    } else {
                        IDLE_WAIT
                    };
                    self.transport.wait(wait, &fds);
                    self.wake_rx.drain();
                } else {
                    std::thread::yield_now();
                }
            } else {
                idle_spins = 0;
                last_moved = moved;
            }
        }
    }

    /// Answer every queued call: the communicator is going away.
    fn fail_queued(&mut self, queue: &mut std::collections::VecDeque<(Instant, Req)>) {
        for (_, req) in queue.drain(..) {
            if let Req::Coll { reply, .. } = req {
                let _ = reply.send(Err(CommError::Aborted("communicator destroyed".into())));
            }
        }
    }

    /// Leave: tell every peer, then (when `linger`) keep serving them (acknowledgements of
    /// their last transfers) until each has left too or the peer timeout passes. Returns the
    /// ranks that had not left.
    fn depart(&mut self, current: &mut Option<Current>, linger: bool) -> Vec<u32> {
        self.fail(current, CommError::Aborted("communicator destroyed".into()));
        // No connection of ours may still be on its way to a peer that hears our goodbye and
        // destroys its listeners (see `UcxTransport::leave`).
        // Bounded: a black-holed path never settles. Leaving at once (`destroy`) waits less.
        let settle = Duration::from_millis(self.cfg.bootstrap.peer_timeout_ms.min(if linger { 2000 } else { 200 }));
        self.transport.leave(settle);
        let mut bye = vec![DEPART];
        bye.extend_from_slice(&self.last_done.to_le_bytes());
        self.mesh.broadcast(Channel::Abort, &bye);
        self.departed.insert(self.rank);
        for &peer in self.departed.iter().filter(|&&r| r != self.rank) {
            self.transport.forget_peer(Rank(peer));
        }
        let deadline = Instant::now() + Duration::from_millis(self.cfg.bootstrap.peer_timeout_ms);
        while linger && (self.departed.len() as u32) < self.world && Instant::now() < deadline {
            while let Some(ev) = self.mesh.recv_deadline(Instant::now() + Duration::from_millis(1)) {
                self.on_oob(ev, current);
            }
            let now = self.now();
            let _ = self.engine.drive(now, &mut self.transport);
            self.flush_engine();
        }
        self.transport.drain_settles();
        (0..self.world).filter(|r| !self.departed.contains(r)).collect()
    }

    /// Why the next collective (queued at `queued`) can never start, if it cannot: a rank whose
    /// health view it still needs has left the communicator, or the views did not all arrive
    /// within the collective deadline.
    fn unstartable(&self, queued: Instant, req: &Req) -> Option<CommError> {
        let next = self.seq + 1;
        if let Req::Coll { deadline, .. } = req {
            if Instant::now() > *deadline {
                return Some(CommError::Timeout {
                    seq: next,
                    waited_ms: queued.elapsed().as_millis() as u64,
                    waiting: "its turn: the calls queued before it ran past its deadline".into(),
                });
            }
        }
        let a = self.agreement.as_ref()?;
        if a.is_complete() {
            return None;
        }
        let missing = a.missing();
        if let Some(&rank) = missing.iter().find(|r| self.departed.contains(r)) {
            let why = format!("it left the communicator before collective #{next}");
            return Some(CommError::PeerLost { rank: Rank(rank), why });
        }
        let waited = queued.elapsed();
        (waited > self.coll_deadline()).then(|| CommError::Timeout {
            seq: next,
            waited_ms: waited.as_millis() as u64,
            waiting: format!("the health views of rank(s) {missing:?} (they have not called collective #{next})"),
        })
    }

    /// How long one collective may take (from its start, or from its request while it waits
    /// for the previous round's views).
    fn coll_deadline(&self) -> Duration {
        Duration::from_millis(self.cfg.bootstrap.peer_timeout_ms.max(1000) * 12)
    }

    /// Whether the previous round's views are all in (so the next plan can be made).
    fn ready_to_plan(&mut self, is_coll: bool) -> bool {
        if !is_coll {
            return true;
        }
        match &self.agreement {
            None => true,
            Some(a) => a.is_complete(),
        }
    }

    fn start_coll(&mut self, call: Call, deadline: Instant, reply: Sender<Reply>) -> Option<Current> {
        let Call { work, dtype, count, bufs, access } = call;
        let work = &work;
        // Adopt the view agreed in the previous round.
        if let Some(a) = self.agreement.take() {
            if let Some(mut v) = a.result() {
                let changed = v.failed_nics() != self.agreed.failed_nics() || v.nodes() != self.agreed.nodes();
                if changed {
                    v.set_epoch(self.agreed.epoch().next());
                    crate::metrics::record_epoch(v.epoch().0);
                    for nic in v.failed_nics() {
                        crate::metrics::set_nic_up(
                            &format!("node{}", nic.node.0),
                            &format!("nic{}", nic.rail.0),
                            false,
                        );
                    }
                    self.note(format!(
                        "health {}: failed NICs {:?}; re-planning",
                        v.epoch(),
                        v.failed_nics().iter().map(ToString::to_string).collect::<Vec<_>>()
                    ));
                    if let Ok(mut f) = self.shared.failed.lock() {
                        *f = v.failed_nics();
                    }
                    self.agreed = v;
                }
            }
        }
        self.seq += 1;
        let seq = self.seq;
        // Contribute this rank's view to round `seq` (used by collective seq + 1).
        let local = self.local_view();
        self.mesh.broadcast(Channel::Agree, &encode_view(seq, &local));
        let mut a = Agreement::new(seq, self.rank, self.world, local);
        for (from, v) in self.stash.remove(&seq).unwrap_or_default() {
            let _ = a.handle_view(from, seq, &v);
        }
        self.agreement = Some(a);
        self.stash.retain(|&r, _| r > seq);
        // Argument check: a collective with the ring neighbours (each rank sends its call to the
        // next and compares with the previous); a group with every other rank (the operations
        // between two ranks must mirror each other, so both describe the pair the same way).
        type Descs = Vec<(u32, String)>;
        let (sends, expects): (Descs, Descs) = match work {
            _ if self.world < 2 => (Vec::new(), Vec::new()),
            Work::Coll(coll) => {
                let desc = format!("{coll:?} {dtype} count={count}");
                let (next, prev) = ((self.rank + 1) % self.world, (self.rank + self.world - 1) % self.world);
                (vec![(next, desc.clone())], vec![(prev, desc)])
            }
            Work::Group(ops) => {
                let pairs: Vec<(u32, String)> = (0..self.world)
                    .filter(|&q| q != self.rank)
                    .map(|q| (q, pair_desc(self.rank, q, dtype, ops)))
                    .collect();
                (pairs.clone(), pairs)
            }
        };
        for (to, desc) in sends {
            let mut msg = seq.to_le_bytes().to_vec();
            msg.extend_from_slice(desc.as_bytes());
            let _ = self.mesh.send(to, Channel::Control, &msg);
        }
        for (from, desc) in expects {
            match self.peer_descs.remove(&(seq, from)) {
                Some(theirs) if theirs != desc => {
                    let text =
                        format!("collective #{seq}: rank {from} called {theirs}, rank {} called {desc}", self.rank);
                    self.broadcast_mismatch(seq, &text);
                    let _ = reply.send(Err(CommError::Mismatch { seq, detail: text.clone() }));
                    self.set_broken(CommError::Mismatch { seq, detail: text });
                    return None;
                }
                Some(_) => {}
                None => {
                    self.descs.insert((seq, from), desc);
                }
            }
        }
        // Plans are pure functions of (collective, size, agreed view): reuse them.
        let plan = match work {
            Work::Coll(coll) => {
                let key = format!("{coll:?}|{dtype}|{count}|{:x}|{}", self.agreed.digest(), self.agreed.epoch().0);
                match self.plan_cache.get(&key) {
                    Some(p) => Ok(p.clone()),
                    None => self.plan(*coll, dtype, count).inspect(|p| {
                        if self.plan_cache.len() >= PLAN_CACHE {
                            self.plan_cache.clear();
                        }
                        self.plan_cache.insert(key, p.clone());
                    }),
                }
            }
            Work::Group(ops) => self.plan_group(dtype, ops),
        };
        let (sched, strategy) = match plan {
            Ok(p) => p,
            Err(e) => {
                let _ = reply.send(Err(e));
                return None;
            }
        };
        let out_len = sched.output_len as usize;
        let in_len = sched.input_len as usize;
        let registered = match bufs {
            Bufs::Registered { input, output } => Some(((input.0, 0), input.1, (output.0, 0), output.1)),
            Bufs::RegisteredInPlace { buf, len } => {
                let (i_at, o_at) = in_place_offsets(in_len, out_len, self.rank);
                Some(((buf, i_at), len.saturating_sub(i_at), (buf, o_at), len.saturating_sub(o_at)))
            }
            _ => None,
        };
        if let Some((input, in_room, output, out_room)) = registered {
            if in_room < in_len || out_room < out_len {
                let _ = reply.send(Err(CommError::Invalid(format!(
                    "{} needs a {in_len}-byte input and a {out_len}-byte output (in place: one buffer of the larger), got registered buffers of {in_room} and {out_room} bytes",
                    work.name(),
                ))));
                return None;
            }
            let now = self.now();
            if let Err(e) = self.engine.start_registered(now, &mut self.transport, seq, sched, input, output) {
                let _ = reply.send(Err(CommError::from_engine(seq, &e)));
                return None;
            }
            return Some(self.current(seq, reply, (None, None, true), (out_len, work.name()), strategy, deadline));
        }
        let rank = self.rank;
        let copy_in = |engine: &mut Engine, transport: &mut UcxTransport, now: Duration| {
            let Some((input, output, borrowed)) = bufs.split(in_len, out_len, rank) else {
                return Err(None);
            };
            engine.start(now, transport, seq, sched, input, output).map_err(Some)?;
            Ok(borrowed)
        };
        let now = self.now();
        let (engine, transport) = (&mut self.engine, &mut self.transport);
        let started = match &access {
            // SAFETY (of `bufs.split`'s views): under the access lock, the caller still waiting.
            Some(a) => a.with(|| copy_in(engine, transport, now)),
            None => Some(copy_in(engine, transport, now)),
        };
        let borrowed = match started {
            // The caller stopped waiting before the call started: nothing to do or say.
            None => return None,
            Some(Ok(borrowed)) => borrowed,
            Some(Err(Some(e))) => {
                let _ = reply.send(Err(CommError::from_engine(seq, &e)));
                return None;
            }
            Some(Err(None)) => {
                let got = match &bufs {
                    Bufs::Owned { input, output } => format!("got {} and {}", input.len(), output.len()),
                    Bufs::Borrowed { in_len, out_len, .. } => format!("got {in_len} and {out_len}"),
                    Bufs::InPlace { len, .. } => format!("got one in-place buffer of {len}"),
                    Bufs::Registered { .. } | Bufs::RegisteredInPlace { .. } => String::new(),
                };
                let _ = reply.send(Err(CommError::Invalid(format!(
                    "{} needs a {}-byte input and a {}-byte output (in place: one buffer of the larger), {got}",
                    work.name(),
                    in_len,
                    out_len,
                ))));
                return None;
            }
        };
        Some(self.current(seq, reply, (borrowed, access, false), (out_len, work.name()), strategy, deadline))
    }

    /// The record of collective `seq`, started now.
    /// `memory`: the borrowed output, its guard, and whether the call runs on registered memory;
    /// `output`: the output's length and the collective's name.
    fn current(
        &self,
        seq: u64,
        reply: Sender<Reply>,
        memory: (Option<(*mut u8, usize)>, Option<Access>, bool),
        output: (usize, &'static str),
        strategy: Schedule,
        deadline: Instant,
    ) -> Current {
        let started = Instant::now();
        let (borrowed, access, registered) = memory;
        let (out_len, name) = output;
        Current {
            seq,
            reply,
            borrowed,
            access,
            registered,
            out_len,
            name,
            strategy,
            epoch: self.agreed.epoch().0,
            started,
            deadline: deadline.min(started + self.coll_deadline()),
        }
    }

    /// Register a region for a [`CommBuf`]: its handle, first byte and mapping.
    fn register_for_caller(&mut self, len: usize) -> Result<Registered, CommError> {
        let failed = |e: String| CommError::Invalid(format!("registering {len} bytes: {e}"));
        let h = self.transport.register(len.max(1)).map_err(|e| failed(e.to_string()))?;
        let ptr = self.transport.region_mut(h).map_err(|e| failed(e.to_string()))?.as_mut_ptr() as usize;
        let region = self.transport.region_arc(h).ok_or_else(|| failed("no mapping".into()))?;
        Ok((h, ptr, region))
    }

    /// This rank's schedule for a collective: the planner's choice when the layout is one the
    /// planner models (ranks numbered node by node, the same count on every node), forced by
    /// `policy.strategy` when that is not `auto`; otherwise Balance on the agreed view.
    fn plan(
        &self,
        coll: Collective,
        dtype: DType,
        count: u64,
    ) -> Result<(r2ccl_algo::RankSchedule, Schedule), CommError> {
        let failed = |why: String| CommError::Failed { seq: self.seq, why };
        if let Some(topo) = &self.policy_topo {
            let (plan, view) =
                plan_bridging_splits(topo, &self.agreed, coll, dtype, count).map_err(|e| failed(e.to_string()))?;
            let forced = r2ccl_policy::Strategy::ALL.into_iter().find(|s| s.name() == self.cfg.policy.strategy);
            let strategy = match forced {
                Some(s) if plan.candidate(s).is_some() => s,
                _ => plan.chosen,
            };
            let req = plan.request_for(strategy).map_err(|e| failed(e.to_string()))?;
            let req = pipeline_ring(req, self.node_of.len(), self.nics, self.nic_mbps);
            tracing::debug!(
                target: subsys::COLL,
                seq = self.seq,
                strategy = strategy.name(),
                chunks = req.chunks,
                predicted_s = plan.candidate(strategy).map_or(f64::NAN, |c| c.time_s),
                lower_bound_s = plan.lower_bound_s,
                "planned"
            );
            let fabric = r2ccl_policy::schedule_fabric(topo, &view).map_err(|e| failed(e.to_string()))?;
            let sched =
                build_rank_schedule(&fabric, &req, Rank(self.rank)).map_err(|e| CommError::Invalid(e.to_string()))?;
            return Ok((sched, Schedule::Planned(strategy)));
        }
        let fabric = Fabric::new(self.layout()?, self.agreed.clone()).map_err(|e| failed(e.to_string()))?;
        let bytes = count * dtype.size() as u64;
        let small = bytes < 64 * 1024
            && matches!(coll, Collective::AllReduce { .. } | Collective::Broadcast { .. } | Collective::Reduce { .. });
        let algorithm = if small { Algorithm::Tree } else { Algorithm::Ring };
        let req = ScheduleRequest::new(coll, dtype, count).with_algorithm(algorithm).with_strategy(Strategy::Balance);
        let req = pipeline_ring(req, self.node_of.len(), self.nics, self.nic_mbps);
        let sched =
            build_rank_schedule(&fabric, &req, Rank(self.rank)).map_err(|e| CommError::Invalid(e.to_string()))?;
        Ok((sched, if small { Schedule::FallbackTree } else { Schedule::FallbackBalance }))
    }

    /// This rank's schedule for a point-to-point group on the agreed view (sends split over
    /// the NICs by Balance weights).
    fn plan_group(&self, dtype: DType, ops: &[P2pOp]) -> Result<(r2ccl_algo::RankSchedule, Schedule), CommError> {
        let failed = |why: String| CommError::Failed { seq: self.seq, why };
        let fabric = match &self.policy_topo {
            Some(topo) => r2ccl_policy::schedule_fabric(topo, &self.agreed).map_err(|e| failed(e.to_string()))?,
            None => Fabric::new(self.layout()?, self.agreed.clone()).map_err(|e| failed(e.to_string()))?,
        };
        let sched =
            build_p2p_group(&fabric, Rank(self.rank), dtype, ops).map_err(|e| CommError::Invalid(e.to_string()))?;
        Ok((sched, Schedule::Group))
    }

    fn broadcast_mismatch(&self, seq: u64, text: &str) {
        let mut msg = vec![ABORT_MISMATCH];
        msg.extend_from_slice(&seq.to_le_bytes());
        msg.extend_from_slice(text.as_bytes());
        self.mesh.broadcast(Channel::Abort, &msg);
    }

    fn on_oob(&mut self, ev: OobEvent, current: &mut Option<Current>) {
        match ev {
            OobEvent::Message { from, channel: Channel::Detect, payload } => {
                let now = self.now();
                if let Err(e) = self.engine.handle_ctrl(now, &mut self.transport, Rank(from), &payload) {
                    let seq = current.as_ref().map_or(0, |c| c.seq);
                    self.fail(current, CommError::from_engine(seq, &e));
                }
            }
            OobEvent::Message { from, channel: Channel::Agree, payload } => match decode_view(from, &payload) {
                Ok((round, view)) => {
                    let mine = self.agreement.as_ref().map(Agreement::round);
                    if mine == Some(round) {
                        if let Some(a) = &mut self.agreement {
                            if let Err(e) = a.handle_view(from, round, &view) {
                                crate::metrics::count_malformed("oob", 1);
                                tracing::warn!(target: subsys::BOOTSTRAP, from, %e, "refused a health view");
                            }
                        }
                    } else if mine.is_none_or(|m| round > m) && round <= self.seq.saturating_add(PEER_AHEAD) {
                        // Bounded: rounds at most PEER_AHEAD ahead, one view per peer and round.
                        let views = self.stash.entry(round).or_default();
                        views.retain(|(f, _)| *f != from);
                        views.push((from, view));
                    } else {
                        crate::metrics::count_malformed("oob", 1);
                        tracing::debug!(target: subsys::BOOTSTRAP, from, round, "dropped a health view for a round too far ahead");
                    }
                }
                Err(e) => {
                    crate::metrics::count_malformed("oob", 1);
                    tracing::warn!(target: subsys::BOOTSTRAP, from, %e, "malformed health view");
                }
            },
            OobEvent::Message { from, channel: Channel::Control, payload } => {
                if payload.len() < 8 {
                    crate::metrics::count_malformed("oob", 1);
                    return;
                }
                let seq = u64::from_le_bytes(payload[..8].try_into().unwrap_or([0; 8]));
                // A description is a line of text: at most MAX_DESC bytes are kept.
                let theirs = String::from_utf8_lossy(&payload[8..payload.len().min(8 + MAX_DESC)]).into_owned();
                match self.descs.remove(&(seq, from)) {
                    Some(mine) if mine != theirs => {
                        let text =
                            format!("collective #{seq}: rank {from} called {theirs}, rank {} called {mine}", self.rank);
                        self.broadcast_mismatch(seq, &text);
                        self.set_broken(CommError::Mismatch { seq, detail: text.clone() });
                        self.fail(current, CommError::Mismatch { seq, detail: text });
                    }
                    Some(_) => {}
                    // Kept for a collective this rank has not reached, at most PEER_AHEAD ahead.
                    None if seq >= self.seq && seq <= self.seq.saturating_add(PEER_AHEAD) => {
                        self.peer_descs.insert((seq, from), theirs);
                    }
                    None => {
                        crate::metrics::count_malformed("oob", 1);
                        tracing::debug!(target: subsys::BOOTSTRAP, from, seq, "dropped a description for a collective out of range");
                    }
                }
            }
            OobEvent::Message { from, channel: Channel::Abort, payload } if payload.first() == Some(&DEPART) => {
                self.departed.insert(from);
                // Both sides are leaving: nothing more crosses the data paths between them.
                if self.departed.contains(&self.rank) {
                    self.transport.forget_peer(Rank(from));
                }
                match payload.get(1..9).and_then(|b| <[u8; 8]>::try_from(b).ok()) {
                    Some(b) => {
                        self.departed_after.insert(from, u64::from_le_bytes(b));
                    }
                    None => crate::metrics::count_malformed("oob", 1),
                }
            }
            OobEvent::Message { from, channel: Channel::Abort, payload } => {
                let e = match payload.first() {
                    Some(&ABORT_MISMATCH) if payload.len() >= 9 => CommError::Mismatch {
                        seq: payload.get(1..9).and_then(|b| <[u8; 8]>::try_from(b).ok()).map_or(0, u64::from_le_bytes),
                        detail: String::from_utf8_lossy(&payload[9..]).into_owned(),
                    },
                    Some(&ABORT_REASON) => {
                        CommError::Aborted(format!("rank {from}: {}", String::from_utf8_lossy(&payload[1..])))
                    }
                    _ => CommError::Aborted(format!("rank {from} aborted")),
                };
                self.set_broken(e.clone());
                self.fail(current, e);
            }
            OobEvent::Message { channel: Channel::Heartbeat, .. } => {}
            OobEvent::PeerLost { rank, .. } if self.departed.contains(&rank) => {
                tracing::debug!(target: subsys::BOOTSTRAP, rank, "peer left the communicator");
            }
            OobEvent::PeerLost { rank, why } => {
                // A lost rank will never say goodbye: do not wait for it when leaving.
                self.departed.insert(rank);
                let e = CommError::PeerLost { rank: Rank(rank), why };
                self.note(e.to_string());
                self.set_broken(e.clone());
                self.fail(current, e);
            }
        }
    }

    fn flush_engine(&mut self) {
        // Frames to one peer leave in one write, in order (receipts add up to hundreds per
        // collective). A failed send shows up as PeerLost from the mesh.
        let mut batch: BTreeMap<u32, Vec<Vec<u8>>> = BTreeMap::new();
        while let Some((to, bytes)) = self.engine.poll_outbox() {
            batch.entry(to.0).or_default().push(bytes);
        }
        for (to, frames) in batch {
            let _ = self.mesh.send_many(to, Channel::Detect, &frames);
        }
        while let Some(ev) = self.engine.poll_event() {
            match ev {
                EngineEvent::PathFailed { path, fault, .. } => self.note(format!("path {path} failed ({fault:?})")),
                EngineEvent::Migrated { lane, from, to, boundary, replayed, failback, stopped_at, at } => {
                    let pause = at.saturating_sub(stopped_at).as_secs_f64();
                    let verdict = if let Some(v) = self.engine.verdict(from) {
                        verdict_label(v)
                    } else if self.engine.down_nics().contains(&from.local) {
                        "local_nic"
                    } else if self.engine.down_nics().contains(&from.remote) {
                        "remote_nic"
                    } else if failback {
                        "recovered"
                    } else {
                        "link"
                    };
                    let chunk = u64::from(self.engine.session().config().chunk_size);
                    crate::metrics::count_failover(
                        if failback { "failback" } else { "path_failure" },
                        verdict,
                        pause,
                        u64::from(replayed) * chunk,
                    );
                    self.note(format!(
                        "{} {lane}: {from} -> {to}, replay from chunk {boundary} ({replayed} chunks again), verdict {verdict}, pause {:.1} ms",
                        if failback { "fail-back" } else { "failover" },
                        pause * 1e3
                    ));
                }
                EngineEvent::NicState { nic, up, local } => {
                    crate::metrics::set_nic_up(&format!("node{}", nic.node.0), &format!("nic{}", nic.rail.0), up);
                    self.note(format!(
                        "NIC {nic} {} ({})",
                        if up { "up" } else { "down" },
                        if local { "local link state" } else { "reported by its node" }
                    ));
                }
                EngineEvent::NicBlamed { nic, up } => {
                    crate::metrics::set_nic_up(&format!("node{}", nic.node.0), &format!("nic{}", nic.rail.0), up);
                    self.note(if up {
                        format!("NIC {nic} back on every rank (answers probes again after its hold-down)")
                    } else {
                        format!("NIC {nic} taken out on every rank (a localization verdict blamed it)")
                    });
                }
                EngineEvent::PathRecovered { path } => self.note(format!("path {path} answers probes again")),
                EngineEvent::Localized { path, verdict, method, .. } => {
                    self.note(format!("path {path} failed: verdict {verdict} ({method:?})"));
                }
                EngineEvent::BadInput { from, what } => {
                    crate::metrics::count_malformed("chunk_header", 1);
                    // The 1st, 2nd, 4th, 8th, ... only: a stranger's flood must not flood the log.
                    self.refused_inputs += 1;
                    if self.refused_inputs.is_power_of_two() {
                        tracing::warn!(target: subsys::NET, rank = self.rank, claimed_from = %from, %what, refused_so_far = self.refused_inputs, "refused input (forged, malformed or stray)");
                    }
                }
            }
        }
    }
}

/// The plan of a collective on `agreed`, and the view it was planned from. Two nodes without a
/// usable rail in common (views of a flap taken at different instants, or a split that may heal)
/// do not fail the plan: their failed NICs count as usable for planning, and the engine moves
/// their lanes at run time, waiting up to the no-path timeout for a NIC to come back before it
/// fails the collective with NoCommonRail. Every rank starts from the same agreed view, so every
/// rank plans from the same view.
fn plan_bridging_splits(
    topo: &r2ccl_policy::Topology,
    agreed: &HealthView,
    coll: Collective,
    dtype: DType,
    count: u64,
) -> Result<(r2ccl_policy::Plan, HealthView), r2ccl_policy::PlanError> {
    let mut view = agreed.clone();
    loop {
        match r2ccl_policy::plan_payload(topo, &view, coll, dtype, count) {
            Err(r2ccl_policy::PlanError::NoPath { a, b }) => {
                let stuck: Vec<NicId> = view.failed_nics().into_iter().filter(|n| n.node == a || n.node == b).collect();
                if stuck.is_empty() {
                    return Err(r2ccl_policy::PlanError::NoPath { a, b });
                }
                tracing::info!(target: subsys::COLL, %a, %b, "no usable rail in common: planned with their failed NICs, which the engine steers around");
                for nic in stuck {
                    let _ = view.set_healthy(nic);
                }
            }
            other => return other.map(|plan| (plan, view)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use r2ccl_core::ReduceOp;

    fn allreduce(bytes: u64) -> ScheduleRequest {
        ScheduleRequest::new(Collective::AllReduce { op: ReduceOp::Sum }, DType::F32, bytes / 4)
    }

    #[test]
    fn a_split_between_two_nodes_is_planned_with_their_failed_nics_and_other_failures_stay() {
        let topo = r2ccl_policy::Topology::uniform(4, 2, 1000).and_then(|t| t.with_spine_permille(0)).unwrap();
        let coll = Collective::AllReduce { op: ReduceOp::Sum };
        let mut view = HealthView::uniform(4, 2, 1000);
        // Nodes 0 and 1 share no rail; with four nodes a ring order still avoids that pair.
        view.set_failed(NicId::new(0, 0)).unwrap();
        view.set_failed(NicId::new(1, 1)).unwrap();
        let (_, planned) = plan_bridging_splits(&topo, &view, coll, DType::F32, 1 << 20).unwrap();
        assert_eq!(planned, view, "a ring order that avoids the pair needs no bridging");
        // On two nodes nothing avoids it: their failed NICs count as usable for planning.
        let topo2 = r2ccl_policy::Topology::uniform(2, 2, 1000).and_then(|t| t.with_spine_permille(0)).unwrap();
        let mut view2 = HealthView::uniform(2, 2, 1000);
        view2.set_failed(NicId::new(0, 0)).unwrap();
        view2.set_failed(NicId::new(1, 1)).unwrap();
        assert!(matches!(
            r2ccl_policy::plan_payload(&topo2, &view2, coll, DType::F32, 1 << 20),
            Err(r2ccl_policy::PlanError::NoPath { .. })
        ));
        let (_, planned) = plan_bridging_splits(&topo2, &view2, coll, DType::F32, 1 << 20).unwrap();
        assert!(planned.failed_nics().is_empty(), "{:?}", planned.failed_nics());
        // A node with no usable NIC at all is still an error.
        view2.set_failed(NicId::new(0, 1)).unwrap();
        assert!(plan_bridging_splits(&topo2, &view2, coll, DType::F32, 1 << 20).is_err());
    }

    #[test]
    fn nic_blobs_round_trip_and_malformed_ones_are_refused() {
        let facts = vec![NicFacts { mbps: 100, numa: Some(1) }, NicFacts { mbps: 25_000, numa: None }];
        let blob = nic_blob(&facts);
        assert_eq!(blob_facts(&blob), Some(facts));
        assert_eq!(blob_min_speed(&blob), Some(100));
        assert_eq!(blob_facts(&blob[..blob.len() - 1]), None, "truncated");
        assert_eq!(blob_facts(&[blob.as_slice(), &[0]].concat()), None, "trailing byte");
        assert_eq!(blob_facts(&u32::MAX.to_le_bytes()), None, "a count the bytes do not hold");
        assert_eq!(blob_min_speed(&nic_blob(&[])), None);
    }

    #[test]
    fn backup_chains_take_the_same_numa_node_first_then_rail_order() {
        let numa = vec![vec![Some(0), Some(0), Some(1), Some(1)], vec![None; 4]];
        let topo = transport_topology(&[0, 1], 4, &numa).unwrap();
        let rails = |node: u32, rail: u16| -> Vec<u16> {
            topo.chain(NicId::new(node, rail)).iter().map(|n| n.rail.0).collect()
        };
        assert_eq!(rails(0, 0), [1, 2, 3]);
        assert_eq!(rails(0, 1), [0, 2, 3]);
        assert_eq!(rails(0, 2), [3, 0, 1]);
        assert_eq!(rails(0, 3), [2, 0, 1]);
        // Unknown NUMA nodes: rail order after the NIC.
        assert_eq!(rails(1, 2), [3, 0, 1]);
    }

    #[test]
    fn topo_file_names_this_nodes_nics_rates_and_numa_nodes() {
        let dir = std::env::temp_dir().join(format!("r2ccl-topo-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("site.toml");
        let mut text = String::from("name = \"site\"\nrails = 2\n");
        for host in ["alpha", "beta"] {
            text.push_str(&format!(
                "\n[[nodes]]\nhostname = \"{host}\"\nranks = 1\nnuma_nodes = [{{ id = 0 }}, {{ id = 1 }}]\n\
                 \n[[nodes.nics]]\nname = \"ib1\"\nrail = 1\nspeed_mbps = 200000\nvirtual = true\nnuma = 1\n\
                 \n[[nodes.nics]]\nname = \"ib0\"\nrail = 0\nspeed_mbps = 400000\nvirtual = true\nnuma = 0\n"
            ));
        }
        std::fs::write(&path, text).unwrap();
        let path = path.to_string_lossy().into_owned();
        let beta = topo_file_node(&path, "beta").unwrap();
        assert_eq!(file_nics(&beta), ["ib0", "ib1"], "rail order");
        let facts = nic_facts(&file_nics(&beta), 0, Some(&beta));
        assert_eq!(facts, [NicFacts { mbps: 400_000, numa: Some(0) }, NicFacts { mbps: 200_000, numa: Some(1) }]);
        // A configured rate wins over the file.
        assert!(nic_facts(&file_nics(&beta), 100, Some(&beta)).iter().all(|f| f.mbps == 100));
        let err = topo_file_node(&path, "gamma").unwrap_err().to_string();
        assert!(err.contains("gamma") && err.contains("alpha") && err.contains("beta"), "{err}");
        let err = topo_file_node(&dir.join("missing.toml").to_string_lossy(), "beta").unwrap_err().to_string();
        assert!(err.contains("missing.toml"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn every_valid_detect_section_gives_the_detector_a_valid_configuration() {
        let default = r2ccl_config::DetectConfig::default();
        let fast = r2ccl_config::DetectConfig {
            probe_timeout_ms: 1,
            localize_timeout_ms: 1,
            probe_interval_ms: 2,
            holddown_base_ms: 2,
            holddown_max_ms: 2,
            oob_retry_ms: 1,
            ..default.clone()
        };
        let slow = r2ccl_config::DetectConfig {
            probe_timeout_ms: 5_000,
            localize_timeout_ms: 9_000,
            probe_interval_ms: 100,
            ..default.clone()
        };
        for d in [default, fast, slow] {
            let c = detect_config(&d);
            assert_eq!(c.validate(), Ok(()), "{d:?} -> {c:?}");
            assert!(c.probe_timeout >= DETECT_PROBE_TIMEOUT);
        }
    }

    #[test]
    fn large_plain_rings_are_pipelined_in_parts_of_a_millisecond_per_nic() {
        // 100 Mbit/s NICs: the 128 KiB floor. 64 MiB over 4 ranks: 16 MiB steps; 2 NICs: 64
        // parts (the cap); 4 MiB: 1 MiB steps, 4 parts of 256 KiB (128 KiB per NIC).
        assert_eq!(pipeline_ring(allreduce(64 << 20), 4, 2, 100).chunks, RING_PARTS_MAX);
        assert_eq!(pipeline_ring(allreduce(4 << 20), 4, 2, 100).chunks, 4);
        assert_eq!(pipeline_ring(allreduce(4 << 20), 4, 1, 100).chunks, 8);
        // 100 Gbit/s: 12.5 MB per NIC and part, so 64 MiB over 4 ranks on 1 NIC is one part.
        assert_eq!(pipeline_ring(allreduce(64 << 20), 4, 1, 100_000).chunks, 1);
        assert_eq!(pipeline_ring(allreduce(1 << 30), 4, 1, 100_000).chunks, 21);
        // Never below one part.
        assert_eq!(pipeline_ring(allreduce(1 << 20), 4, 2, 100).chunks, 1);
        let ag = ScheduleRequest::new(Collective::AllGather, DType::F32, (8 << 20) / 4);
        assert_eq!(pipeline_ring(ag, 4, 2, 100).chunks, 32);
    }

    #[test]
    fn other_algorithms_and_planned_chunks_are_left_alone() {
        let tree = allreduce(64 << 20).with_algorithm(Algorithm::Tree);
        assert_eq!(pipeline_ring(tree, 4, 2, 100).chunks, 1);
        let planned = allreduce(64 << 20).with_chunks(4);
        assert_eq!(pipeline_ring(planned, 4, 2, 100).chunks, 4);
        let bcast = ScheduleRequest::new(Collective::Broadcast { root: Rank(0) }, DType::F32, 16 << 20);
        assert_eq!(pipeline_ring(bcast, 4, 2, 100).chunks, 1);
        assert_eq!(pipeline_ring(allreduce(64 << 20), 1, 2, 100).chunks, 1);
    }
}
