//! The communicator: bootstrap, OOB mesh, UCX transport and the engine, driven by one
//! progress thread per communicator; callers talk to it over crossbeam channels.
//!
//! Init: rendezvous at rank 0 (node names and OOB addresses), the authenticated OOB mesh,
//! node numbering from the node names, one UCX context per data NIC, an allgather of UCX
//! addresses over the OOB mesh, then the engine. Every step has a deadline.
//!
//! Per collective: the schedule is planned from the agreed health view (a change of any rank's
//! local view starts one round of the switch protocol, `switch.rs`, and every rank plans with
//! the merge from the same collective on; a fault-free collective exchanges no view), the
//! arguments are checked against the ring neighbour's, and the engine runs the schedule. NIC failures are repaired under the call; a lost peer, an abort or mismatched
//! arguments end the call with an error naming them.

use crate::bootstrap::{join, PeerInfo, Root, Secret};
use crate::call::{Access, Reply};
use crate::engine::{Engine, EngineConfig, EngineEvent};
use crate::error::CommError;
use crate::oob::{Msg, OobEvent, OobMesh};
use crate::report::{CollReport, CommEvent, Schedule};
use crate::switch::{Switch, LEADER};
use crate::wake::{WakeReceiver, Waker};
use crossbeam_channel::{Receiver, Sender};
use r2ccl_algo::{Collective, P2pOp};
use r2ccl_config::Config;
use r2ccl_core::{subsys, DType, HealthView, NicId, NodeId, Rank};
use r2ccl_policy::{Choice, PlannerError};
use r2ccl_transport::{ArgDigest, MemHandle, SessionConfig, Topology, Transport as _};
use r2ccl_ucx::{ContextConfig, EndpointAuth, UcxTransport, UcxTransportConfig};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::{Arc, Mutex, PoisonError};
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
    /// Registered regions ([`CommBuf`]), read and written where they are: (region, length);
    /// `mem`, where the caller's view of them starts (for a call cut through the slots).
    Registered {
        input: (MemHandle, usize),
        output: (MemHandle, usize),
        mem: Option<(*const u8, *mut u8)>,
    },
    /// One registered region for both, with [`Bufs::InPlace`]'s convention.
    RegisteredInPlace {
        buf: MemHandle,
        len: usize,
        mem: Option<*mut u8>,
    },
    /// Registered regions, read and written from these offsets (a segment of a registered call,
    /// `segmented.rs`, which checked that the collective fits).
    RegisteredAt {
        input: (MemHandle, usize),
        output: (MemHandle, usize),
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
            Bufs::Registered { .. } | Bufs::RegisteredInPlace { .. } | Bufs::RegisteredAt { .. } => None,
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

/// A 32-bit digest of an argument description (FNV-1a), which chunk headers carry. Not a MAC (the
/// headers are keyed): two ranks' descriptions that differ have the same digest with a chance of
/// 2^-32.
fn args_digest(desc: &str) -> u32 {
    desc.bytes().fold(0x811c_9dc5, |h: u32, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193))
}

/// How long a collective runs before this rank sends its argument description to the peers it
/// checks against (a mismatch no chunk shows: every rank waits for another's data).
const ARG_CHECK_AFTER: Duration = Duration::from_millis(100);

/// Collectives whose argument descriptions are kept for a peer's late check.
const DESCS_KEPT: u64 = 16;

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
    /// The worker that runs large calls on caller memory in segments (`segmented.rs`),
    /// started by the first.
    pub(crate) host_lane: crate::segmented::HostLane,
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
    /// OOB messages this rank sent, by channel (`oob::Channel::ALL`'s order), as of the latest
    /// finished collective.
    pub(crate) oob_sent: [std::sync::atomic::AtomicU64; 5],
    /// The live registered buffers ([`crate::CommBuf`]): first byte's address -> (length in
    /// bytes, registration), so that a call on raw pointers that name one runs on it in place.
    registered: Mutex<BTreeMap<usize, (usize, MemHandle)>>,
}

impl Shared {
    /// The error that ended the communicator, if one has.
    pub(crate) fn async_error(&self) -> Option<CommError> {
        self.error.lock().ok().and_then(|e| e.clone())
    }

    /// Note a registered buffer of `len` bytes at `addr` (it lives until [`Shared::unregistered`]).
    pub(crate) fn registered(&self, addr: usize, len: usize, handle: MemHandle) {
        self.registered.lock().unwrap_or_else(PoisonError::into_inner).insert(addr, (len, handle));
    }

    /// The registered buffer at `addr` is being freed.
    pub(crate) fn unregistered(&self, addr: usize) {
        self.registered.lock().unwrap_or_else(PoisonError::into_inner).remove(&addr);
    }

    /// The registration and length of the live registered buffer whose first byte is at `addr`
    /// and that holds at least `len` bytes.
    pub(crate) fn registration_at(&self, addr: usize, len: usize) -> Option<(MemHandle, usize)> {
        let map = self.registered.lock().unwrap_or_else(PoisonError::into_inner);
        map.get(&addr).filter(|(l, _)| *l >= len).map(|&(l, h)| (h, l))
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
        Ok(Self {
            rank,
            world,
            node_of,
            tx,
            waker,
            thread: Some(thread),
            shared,
            template,
            device: Mutex::new(None),
            host_lane: Arc::default(),
        })
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

    /// The OOB (control-plane TCP) messages this rank has sent, by channel (`heartbeat`,
    /// `detect`, `agree`, `abort`, `control`), as of its latest finished collective: what
    /// `r2ccl_oob_messages_total` exports.
    pub fn oob_messages_sent(&self) -> Vec<(&'static str, u64)> {
        crate::oob::Channel::ALL
            .iter()
            .zip(&self.shared.oob_sent)
            .map(|(c, n)| (c.name(), n.load(std::sync::atomic::Ordering::Relaxed)))
            .collect()
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
        // Then the host lane: with `linger` its calls finish first; without, the shutdown
        // below fails them and the worker ends after it.
        let worker = self.close_host_lane(linger);
        let staying = self.thread.take().map(|thread| {
            let (reply, rx) = crossbeam_channel::bounded(1);
            let _ = self.tx.send(Req::Shutdown { linger, reply });
            self.waker.wake();
            let staying = rx.recv().ok();
            let _ = thread.join();
            staying
        });
        if let Some(worker) = worker {
            let _ = worker.join();
        }
        staying.flatten()
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

mod export;
mod progress;
mod setup;

use setup::*;
pub(crate) use setup::{blob_facts, nic_blob};
