//! The authenticated rendezvous: every rank connects to rank 0, proves it knows the
//! secret against a fresh nonce, and receives the table of all ranks, itself tagged so
//! that ranks know the root knows the secret too. Strangers are dropped and counted;
//! every wait is bounded by the caller's deadline.

use super::mac::{tag, tags_equal};
use super::wire::{read_frame, read_frame_max, write_frame, Deadlined, Reader, WireError, Writer};
use super::{Secret, UniqueId};
use r2ccl_core::subsys;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const MAGIC: &[u8; 4] = b"R2CB";
const VERSION: u8 = 2;
const HELLO: u8 = 1;
const TABLE: u8 = 2;
const ABORT: u8 = 3;
/// How long one connection may take to authenticate, in all, before it is dropped.
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(2);
/// Largest hello a joiner may send before it has proven the secret.
const MAX_HELLO: usize = 64 << 10;
/// Most handshakes in progress at once (one thread each); more connections wait in the backlog.
const MAX_HANDSHAKES: usize = 64;

/// What each rank publishes to every other rank at bootstrap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerInfo {
    /// The rank.
    pub rank: u32,
    /// Node identity (host name or `R2CCL_NODE`).
    pub node: String,
    /// Address of the rank's OOB control listener.
    pub oob_addr: String,
    /// Opaque payload (transport addresses, local topology), passed through unchanged.
    pub blob: Vec<u8>,
}

/// What the root saw while serving the rendezvous.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RendezvousStats {
    /// Connections dropped for not proving the secret or speaking garbage.
    pub rejected: u64,
}

/// Why the bootstrap failed. Every variant is final: nothing is retried behind the caller's back.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    /// The deadline passed before every rank joined.
    #[error("bootstrap timed out after {waited_ms} ms waiting for rank(s) {missing:?}")]
    Timeout {
        /// Ranks that never joined (or, on a non-root rank, `[0]` for the root).
        missing: Vec<u32>,
        /// How long was waited.
        waited_ms: u64,
    },
    /// Socket error.
    #[error("bootstrap socket error during {during}: {source}")]
    Io {
        /// What was being done.
        during: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// The peer spoke something that is not this protocol.
    #[error("bootstrap protocol error from {peer}: {detail}")]
    Protocol {
        /// Who sent it.
        peer: String,
        /// What was wrong.
        detail: String,
    },
    /// The root's table did not carry a valid tag: it does not know the secret.
    #[error("the rendezvous at {0} does not know the job secret (wrong R2CCL_SECRET or unique id?)")]
    RootNotAuthentic(String),
    /// Two authenticated ranks disagree on the world size.
    #[error("rank {rank} says the world has {theirs} ranks, rank 0 says {ours}")]
    WorldMismatch {
        /// The disagreeing rank.
        rank: u32,
        /// Its world size.
        theirs: u32,
        /// The root's world size.
        ours: u32,
    },
    /// Two authenticated processes claim the same rank.
    #[error("rank {0} joined twice (two processes launched with the same rank?)")]
    DuplicateRank(u32),
    /// Rank or world size out of range.
    #[error("invalid rank {rank} for world size {world}")]
    BadRank {
        /// The rank.
        rank: u32,
        /// The world size.
        world: u32,
    },
    /// The root aborted the bootstrap and said why.
    #[error("rank 0 aborted the bootstrap: {0}")]
    Aborted(String),
}

fn io_err(during: &'static str) -> impl FnOnce(io::Error) -> BootstrapError {
    move |source| BootstrapError::Io { during, source }
}

fn protocol(peer: impl ToString, detail: impl ToString) -> BootstrapError {
    BootstrapError::Protocol { peer: peer.to_string(), detail: detail.to_string() }
}

fn encode_info(w: &mut Writer, p: &PeerInfo) {
    w.u32(p.rank).bytes(p.node.as_bytes()).bytes(p.oob_addr.as_bytes()).bytes(&p.blob);
}

fn decode_info(r: &mut Reader<'_>) -> Result<PeerInfo, WireError> {
    Ok(PeerInfo { rank: r.u32()?, node: r.string()?, oob_addr: r.string()?, blob: r.bytes()?.to_vec() })
}

fn random_nonce() -> Result<[u8; 16], String> {
    super::uid::random16().map_err(|e| e.to_string())
}

/// The rank table every rank gets from the rendezvous, and the random session nonce rank 0
/// chose for this communicator (its chunk-header key and id are derived from it and the secret).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    /// One entry per rank, in rank order.
    pub peers: Vec<PeerInfo>,
    /// Fresh random bytes, the same on every rank of this communicator.
    pub session: [u8; 16],
}

impl std::ops::Deref for Table {
    type Target = [PeerInfo];
    fn deref(&self) -> &[PeerInfo] {
        &self.peers
    }
}

/// An authenticated joiner, waiting for the table.
struct Joined {
    rank: u32,
    world: u32,
    info: PeerInfo,
    stream: TcpStream,
    nonce: [u8; 16],
}

/// Authenticate one incoming connection (runs on its own thread, bounded by `HANDSHAKE_LIMIT`).
fn handshake(stream: TcpStream, secret: &Secret) -> Result<Joined, String> {
    // One deadline for the whole exchange, not per read: a slow-drip stranger is cut off.
    let mut io = Deadlined { stream: &stream, deadline: Instant::now() + HANDSHAKE_LIMIT };
    let nonce = random_nonce()?;
    let mut w = Writer::default();
    w.raw(MAGIC).u8(VERSION).raw(&nonce);
    write_frame(&mut io, &w.0).map_err(|e| format!("sending challenge: {e}"))?;
    let frame = read_frame_max(&mut io, MAX_HELLO).map_err(|e| format!("reading hello: {e}"))?;
    let (kind, mac, rank, world, info) = parse_hello(&frame).map_err(|e| format!("malformed hello: {e}"))?;
    if kind != HELLO {
        return Err(format!("expected hello, got message kind {kind}"));
    }
    let expected = tag(secret, &[b"hello", &nonce, &rank.to_le_bytes(), &world.to_le_bytes(), &info_bytes(&info)]);
    if !tags_equal(&mac, &expected) {
        return Err("does not prove the job secret".into());
    }
    if info.rank != rank {
        return Err(format!("hello for rank {rank} carries info of rank {}", info.rank));
    }
    stream.set_read_timeout(None).map_err(|e| e.to_string())?;
    stream.set_write_timeout(Some(HANDSHAKE_LIMIT)).map_err(|e| e.to_string())?;
    Ok(Joined { rank, world, info, stream, nonce })
}

/// A joiner's hello: kind, tag, rank, world size, its info. Never panics, whatever the bytes.
pub(crate) fn parse_hello(frame: &[u8]) -> Result<(u8, [u8; 16], u32, u32, PeerInfo), WireError> {
    let mut r = Reader::new(frame);
    let kind = r.u8()?;
    let mac = r.array16()?;
    let rank = r.u32()?;
    let world = r.u32()?;
    let info = decode_info(&mut r)?;
    r.finish()?;
    Ok((kind, mac, rank, world, info))
}

/// The rank table's payload: the session nonce, then one entry per rank. Never panics.
pub(crate) fn parse_table(payload: &[u8]) -> Result<([u8; 16], Vec<PeerInfo>), WireError> {
    let mut r = Reader::new(payload);
    let session = r.array16()?;
    let n = r.u32()?;
    let t = (0..n).map(|_| decode_info(&mut r)).collect::<Result<Vec<_>, _>>()?;
    r.finish()?;
    Ok((session, t))
}

fn info_bytes(info: &PeerInfo) -> Vec<u8> {
    let mut w = Writer::default();
    encode_info(&mut w, info);
    w.0
}

fn table_bytes(table: &[PeerInfo]) -> Vec<u8> {
    let mut w = Writer::default();
    w.u32(table.len() as u32);
    for p in table {
        encode_info(&mut w, p);
    }
    w.0
}

fn send_abort(stream: &mut TcpStream, secret: &Secret, nonce: &[u8; 16], reason: &str) {
    let mut w = Writer::default();
    w.u8(ABORT).raw(&tag(secret, &[b"abort", nonce, reason.as_bytes()])).bytes(reason.as_bytes());
    // Best effort: the peer may already be gone, and the root is failing anyway.
    let _ = write_frame(stream, &w.0);
}

/// Rank 0's rendezvous listener.
pub struct Root {
    listener: TcpListener,
    secret: Secret,
}

impl Root {
    /// Bind the rendezvous listener (port 0 picks a free port) for a job with `secret`.
    pub fn bind(addr: SocketAddr, secret: Secret) -> Result<Self, BootstrapError> {
        let listener = TcpListener::bind(addr).map_err(io_err("binding the rendezvous listener"))?;
        Ok(Self { listener, secret })
    }

    /// Serve the rendezvous on an already bound `listener` (a port chosen by binding port 0
    /// and kept, so no other socket can take it in between).
    pub fn from_listener(listener: TcpListener, secret: Secret) -> Self {
        Self { listener, secret }
    }

    /// Bind a free port on `ip` with a freshly generated secret (NCCL's `ncclGetUniqueId`):
    /// hand [`Root::unique_id`] to every other rank, and this `Root` to rank 0's
    /// [`crate::CommBuilder::root`], which serves the rendezvous on the same listener.
    pub fn create(ip: std::net::IpAddr) -> Result<Self, BootstrapError> {
        let secret = Secret::generate().map_err(|e| BootstrapError::Io {
            during: "generating the job secret",
            source: io::Error::other(e.to_string()),
        })?;
        Self::bind(SocketAddr::new(ip, 0), secret)
    }

    /// The job secret.
    pub(crate) const fn secret(&self) -> &Secret {
        &self.secret
    }

    /// The bound listener, for rank 0's communicator.
    pub(crate) fn into_listener(self) -> TcpListener {
        self.listener
    }

    /// The id to hand to every other rank.
    pub fn unique_id(&self) -> Result<UniqueId, BootstrapError> {
        let root = self.listener.local_addr().map_err(io_err("reading the listener address"))?;
        Ok(UniqueId { root, secret: self.secret.clone() })
    }

    /// Serve the rendezvous for `world` ranks, rank 0 contributing `own`. Returns the
    /// table ordered by rank, or an error naming what went wrong by `deadline`.
    pub fn run(self, world: u32, own: PeerInfo, deadline: Instant) -> Result<(Table, RendezvousStats), BootstrapError> {
        if world == 0 || own.rank != 0 {
            return Err(BootstrapError::BadRank { rank: own.rank, world });
        }
        let start = Instant::now();
        let mut stats = RendezvousStats::default();
        self.listener.set_nonblocking(true).map_err(io_err("configuring the listener"))?;
        let (tx, rx) = mpsc::channel::<(SocketAddr, Result<Joined, String>)>();
        let mut joined: Vec<Option<Joined>> = (0..world).map(|_| None).collect();
        let mut count = 1u32;
        let mut in_progress = 0usize;
        let fail = |joined: &mut Vec<Option<Joined>>, err: BootstrapError| {
            let reason = err.to_string();
            for j in joined.iter_mut().flatten() {
                send_abort(&mut j.stream, &self.secret, &j.nonce, &reason);
            }
            err
        };
        while count < world {
            let now = Instant::now();
            if now >= deadline {
                let missing = (1..world).filter(|&r| joined[r as usize].is_none()).collect();
                let waited_ms = start.elapsed().as_millis() as u64;
                return Err(fail(&mut joined, BootstrapError::Timeout { missing, waited_ms }));
            }
            // Accept until the backlog is empty (thousands of ranks join within the loop's first
            // rounds), with at most MAX_HANDSHAKES in progress; the rest wait in the backlog.
            while in_progress < MAX_HANDSHAKES {
                match self.listener.accept() {
                    Ok((stream, peer)) => {
                        let tx = tx.clone();
                        let secret = self.secret.clone();
                        let spawned = std::thread::Builder::new().name("r2ccl-rendezvous".into()).spawn(move || {
                            let r = stream
                                .set_nonblocking(false)
                                .map_err(|e| e.to_string())
                                .and_then(|()| handshake(stream, &secret));
                            // The receiver is gone only if the rendezvous already ended.
                            let _ = tx.send((peer, r));
                        });
                        match spawned {
                            Ok(_) => in_progress += 1,
                            Err(e) => {
                                stats.rejected += 1;
                                tracing::warn!(target: subsys::BOOTSTRAP, %peer, error = %e, "no thread for a bootstrap handshake; connection dropped");
                            }
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if matches!(e.kind(), io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted) => {}
                    Err(e) => {
                        // Out of descriptors and the like: retry on the next round, not fail the job.
                        tracing::warn!(target: subsys::BOOTSTRAP, error = %e, "accept failed; retrying");
                        break;
                    }
                }
            }
            let wait = deadline.saturating_duration_since(Instant::now()).min(Duration::from_millis(5));
            while let Ok((peer, result)) = rx.recv_timeout(wait) {
                in_progress = in_progress.saturating_sub(1);
                match result {
                    Err(why) => {
                        stats.rejected += 1;
                        tracing::warn!(target: subsys::BOOTSTRAP, %peer, %why, "rejected bootstrap connection");
                    }
                    Ok(j) if j.world != world => {
                        let err = BootstrapError::WorldMismatch { rank: j.rank, theirs: j.world, ours: world };
                        let mut j = j;
                        send_abort(&mut j.stream, &self.secret, &j.nonce, &err.to_string());
                        return Err(fail(&mut joined, err));
                    }
                    Ok(j) if j.rank == 0 || j.rank >= world => {
                        let err = BootstrapError::BadRank { rank: j.rank, world };
                        let mut j = j;
                        send_abort(&mut j.stream, &self.secret, &j.nonce, &err.to_string());
                        return Err(fail(&mut joined, err));
                    }
                    Ok(j) if joined[j.rank as usize].is_some() => {
                        let err = BootstrapError::DuplicateRank(j.rank);
                        let mut j = j;
                        send_abort(&mut j.stream, &self.secret, &j.nonce, &err.to_string());
                        return Err(fail(&mut joined, err));
                    }
                    Ok(j) => {
                        tracing::debug!(target: subsys::BOOTSTRAP, rank = j.rank, %peer, "rank joined");
                        let slot = j.rank as usize;
                        joined[slot] = Some(j);
                        count += 1;
                    }
                }
                if count == world {
                    break;
                }
            }
        }
        let mut table = vec![own];
        table.extend(joined.iter().flatten().map(|j| j.info.clone()));
        let session = random_nonce().map_err(|e| fail(&mut joined, protocol("rank 0", e)))?;
        let mut payload = session.to_vec();
        payload.extend(table_bytes(&table));
        for j in joined.iter_mut().flatten() {
            let mut w = Writer::default();
            w.u8(TABLE).raw(&tag(&self.secret, &[b"table", &j.nonce, &payload])).raw(&payload);
            write_frame(&mut j.stream, &w.0).map_err(io_err("sending the rank table"))?;
        }
        Ok((Table { peers: table, session }, stats))
    }
}

/// Join the rendezvous at `root` (`host:port`) as `own.rank` of `world` ranks; returns
/// the table ordered by rank, or an error by `deadline`.
pub fn join(
    root: &str,
    secret: &Secret,
    world: u32,
    own: PeerInfo,
    deadline: Instant,
) -> Result<Table, BootstrapError> {
    if own.rank == 0 || own.rank >= world {
        return Err(BootstrapError::BadRank { rank: own.rank, world });
    }
    let start = Instant::now();
    let timeout =
        |start: Instant| BootstrapError::Timeout { missing: vec![0], waited_ms: start.elapsed().as_millis() as u64 };
    let mut stream = loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(timeout(start));
        }
        let addrs: Vec<SocketAddr> =
            root.to_socket_addrs().map_err(io_err("resolving the rendezvous address"))?.collect();
        let attempt =
            addrs.iter().find_map(|a| TcpStream::connect_timeout(a, remaining.min(Duration::from_secs(1))).ok());
        match attempt {
            Some(s) => break s,
            None => std::thread::sleep(remaining.min(Duration::from_millis(50))),
        }
    };
    let remaining = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    stream.set_read_timeout(Some(remaining)).map_err(io_err("configuring the socket"))?;
    stream.set_write_timeout(Some(remaining)).map_err(io_err("configuring the socket"))?;
    let read = |stream: &mut TcpStream, what: &'static str| {
        read_frame(stream).map_err(|e| match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => timeout(start),
            _ => io_err(what)(e),
        })
    };
    let challenge = read(&mut stream, "reading the challenge")?;
    let mut r = Reader::new(&challenge);
    let (magic, version, nonce) =
        (|| Ok::<_, WireError>((r.raw(4)?.to_vec(), r.u8()?, r.array16()?)))().map_err(|e| protocol(root, e))?;
    if magic != MAGIC || version != VERSION {
        return Err(protocol(root, format!("not an r2ccl rendezvous (magic {magic:?}, version {version})")));
    }
    let info = info_bytes(&own);
    let mut w = Writer::default();
    w.u8(HELLO)
        .raw(&tag(secret, &[b"hello", &nonce, &own.rank.to_le_bytes(), &world.to_le_bytes(), &info]))
        .u32(own.rank)
        .u32(world)
        .raw(&info);
    write_frame(&mut stream, &w.0).map_err(io_err("sending hello"))?;
    let reply = read(&mut stream, "reading the rank table").map_err(|e| match e {
        BootstrapError::Io { source, .. } if source.kind() == io::ErrorKind::UnexpectedEof => {
            BootstrapError::RootNotAuthentic(format!("{root} (it closed the connection: wrong secret on either side?)"))
        }
        other => other,
    })?;
    let mut r = Reader::new(&reply);
    let kind = r.u8().map_err(|e| protocol(root, e))?;
    let mac = r.array16().map_err(|e| protocol(root, e))?;
    match kind {
        TABLE => {
            let payload = &reply[17..];
            if !tags_equal(&mac, &tag(secret, &[b"table", &nonce, payload])) {
                return Err(BootstrapError::RootNotAuthentic(root.to_owned()));
            }
            let (session, table) = parse_table(payload).map_err(|e| protocol(root, e))?;
            let ordered = table.len() == world as usize && table.iter().enumerate().all(|(i, p)| p.rank == i as u32);
            if !ordered {
                return Err(protocol(root, "rank table is not one entry per rank in order"));
            }
            Ok(Table { peers: table, session })
        }
        ABORT => {
            let reason = r.string().map_err(|e| protocol(root, e))?;
            if !tags_equal(&mac, &tag(secret, &[b"abort", &nonce, reason.as_bytes()])) {
                return Err(BootstrapError::RootNotAuthentic(root.to_owned()));
            }
            Err(BootstrapError::Aborted(reason))
        }
        k => Err(protocol(root, format!("unexpected message kind {k}"))),
    }
}
