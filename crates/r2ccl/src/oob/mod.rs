//! The out-of-band control mesh: one authenticated TCP connection per pair of ranks over
//! the bootstrap network (never a data NIC), carrying detection messages, health-view
//! agreement and aborts, with heartbeats so a dead peer is noticed within the peer timeout.
//!
//! Both ends of a connection prove the job secret ([`hello`]) and every frame carries a tag
//! under the connection's key for its direction over a sequence number ([`frame`]): a relay
//! cannot inject, replay or reorder frames. Writes never block: each peer has a queue that is
//! written as far as its socket takes, and a peer whose queue has not drained for the peer
//! timeout (or grew past 64 MiB) is cut off, which its reader sees as the connection lost.
//!
//! Threads: one heartbeat sender (it also drains the queues) and one acceptor that runs each
//! handshake on a thread of its own (at most 16 at once) and drops and counts strangers for the
//! mesh's lifetime. Reading is done by the thread that asks for events
//! ([`OobMesh::recv_deadline`], the progress thread once the communicator runs): non-blocking
//! reads of every connection, so a control message reaches the engine without a hand-off
//! between threads; [`OobMesh::fds`] lets that thread sleep in `poll(2)` on the connections too.

mod frame;
mod hello;
mod msg;

pub(crate) use frame::{decode_frames, FrameKey};
pub(crate) use msg::Msg;

use crate::bootstrap::{PeerInfo, Secret};
use r2ccl_core::subsys;
use std::collections::VecDeque;
use std::io::{self, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// What an OOB frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Channel {
    /// Liveness only; never surfaced as an event.
    Heartbeat = 0,
    /// r2ccl-detect protocol messages.
    Detect = 1,
    /// Health-view agreement.
    Agree = 2,
    /// A rank aborts the communicator.
    Abort = 3,
    /// Anything else the facade needs (collective argument checks, tests).
    Control = 4,
}

impl Channel {
    /// The channel a frame's first byte names, if any.
    pub(crate) fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => Channel::Heartbeat,
            1 => Channel::Detect,
            2 => Channel::Agree,
            3 => Channel::Abort,
            4 => Channel::Control,
            _ => return None,
        })
    }

    /// Every channel, in wire order.
    pub const ALL: [Channel; 5] =
        [Channel::Heartbeat, Channel::Detect, Channel::Agree, Channel::Abort, Channel::Control];

    /// The channel's name (the `channel` label of `r2ccl_oob_messages_total`).
    pub const fn name(self) -> &'static str {
        match self {
            Channel::Heartbeat => "heartbeat",
            Channel::Detect => "detect",
            Channel::Agree => "agree",
            Channel::Abort => "abort",
            Channel::Control => "control",
        }
    }
}

/// Something that happened on the mesh.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OobEvent {
    /// A message from a peer.
    Message {
        /// Sender rank.
        from: u32,
        /// Its channel.
        channel: Channel,
        /// Its payload.
        payload: Vec<u8>,
    },
    /// A peer's connection closed or went silent past the peer timeout.
    PeerLost {
        /// The lost rank.
        rank: u32,
        /// What was seen.
        why: String,
    },
}

/// Why the mesh could not be built or used.
#[derive(Debug, thiserror::Error)]
pub enum OobError {
    /// Not every peer connected by the deadline.
    #[error("OOB mesh timed out after {waited_ms} ms; no connection with rank(s) {missing:?}")]
    Timeout {
        /// Peers without a connection.
        missing: Vec<u32>,
        /// How long was waited.
        waited_ms: u64,
    },
    /// A socket operation failed.
    #[error("OOB socket error with rank {rank}: {source}")]
    Io {
        /// The peer.
        rank: u32,
        /// The OS error.
        source: io::Error,
    },
    /// A peer is known to be gone.
    #[error("OOB peer rank {0} is gone")]
    PeerGone(u32),
    /// No such rank.
    #[error("rank {0} is not part of this mesh")]
    NoSuchRank(u32),
}

/// Longest the acceptor sleeps in poll(2) before it looks at the shutdown flag again (a safety
/// net: a shutdown wakes it at once through [`StopFd`]).
const ACCEPT_WAIT_MS: i32 = 5_000;

/// An eventfd the acceptor sleeps on beside its listener: setting it wakes the acceptor at once,
/// so an idle communicator's acceptor needs no timer to notice a shutdown.
#[derive(Debug)]
struct StopFd(std::os::fd::OwnedFd);

impl StopFd {
    fn new() -> io::Result<Self> {
        // SAFETY: eventfd takes no pointers; a negative result is an error.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        Ok(Self(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) }))
    }

    /// Wake whoever polls it (it stays readable: every later poll returns at once too).
    fn signal(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes the 8 bytes of a local array to a descriptor this struct owns.
        let _ = unsafe { libc::write(std::os::fd::AsRawFd::as_raw_fd(&self.0), one.as_ptr().cast(), one.len()) };
    }
}
const HELLO_LIMIT: Duration = Duration::from_secs(2);

/// Most bytes queued for one peer before it counts as stuck.
const MAX_QUEUE: usize = 64 << 20;
/// Most OOB handshakes in progress at once.
const MAX_HANDSHAKES: usize = 16;

/// One connection's write side: frames are tagged in order into `queue`, which is written
/// without blocking as far as the socket takes.
struct PeerOut {
    stream: TcpStream,
    key: FrameKey,
    queue: Vec<u8>,
    /// Since when the queue has been waiting on a full socket.
    stuck_since: Option<Instant>,
    /// Why the connection was cut off, if it was.
    broken: Option<String>,
    /// Set, for the whole mesh, when this queue is left waiting on a full socket.
    backlog: Arc<AtomicBool>,
}

impl PeerOut {
    /// Queue one frame and write what the socket takes.
    fn send(&mut self, channel: Channel, payload: &[u8], timeout: Duration) -> io::Result<()> {
        if let Some(why) = &self.broken {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, why.clone()));
        }
        self.key.seal_into(&mut self.queue, channel, payload)?;
        self.flush(timeout)
    }

    /// Write what the socket takes; cut the connection off when the peer has not read for
    /// `timeout` or the queue is too long (its reader then sees the connection lost).
    fn flush(&mut self, timeout: Duration) -> io::Result<()> {
        if let Some(why) = &self.broken {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, why.clone()));
        }
        while !self.queue.is_empty() {
            match (&self.stream).write(&self.queue) {
                Ok(0) => return self.cut("the connection took no bytes".into()),
                Ok(n) => {
                    self.queue.drain(..n);
                    self.stuck_since = None;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let since = *self.stuck_since.get_or_insert_with(Instant::now);
                    self.backlog.store(true, Ordering::Relaxed);
                    if since.elapsed() > timeout || self.queue.len() > MAX_QUEUE {
                        let why = format!(
                            "peer read nothing for {} ms ({} bytes queued)",
                            since.elapsed().as_millis(),
                            self.queue.len()
                        );
                        return self.cut(why);
                    }
                    return Ok(());
                }
                Err(e) => return self.cut(format!("write failed: {e}")),
            }
        }
        Ok(())
    }

    fn cut(&mut self, why: String) -> io::Result<()> {
        tracing::warn!(target: subsys::BOOTSTRAP, %why, "OOB connection cut off");
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        self.queue = Vec::new();
        self.broken = Some(why.clone());
        Err(io::Error::new(io::ErrorKind::BrokenPipe, why))
    }
}

/// Counters of the mesh.
#[derive(Debug, Default)]
pub struct OobStats {
    /// Connections dropped for not proving the secret or sending garbage.
    pub rejected: AtomicU64,
    /// Frames from authenticated peers that were malformed (unknown channel).
    pub malformed: AtomicU64,
    /// Messages this rank sent, by channel (in [`Channel::ALL`]'s order).
    pub sent: [AtomicU64; 5],
}

/// One rank's end of the mesh.
pub struct OobMesh {
    rank: u32,
    writers: Vec<Option<Arc<Mutex<PeerOut>>>>,
    /// A peer that read nothing for this long is cut off.
    peer_timeout: Duration,
    /// Some peer's queue waits on a full socket ([`OobMesh::flush_queues`] has work).
    backlog: Arc<AtomicBool>,
    inbox: Mutex<Inbox>,
    stats: Arc<OobStats>,
    shutdown: Arc<AtomicBool>,
    /// Wakes the acceptor when the mesh goes away.
    stop: Arc<StopFd>,
}

/// The read side of every connection: partial frames, liveness, decoded events not yet taken.
struct Inbox {
    peers: Vec<Option<PeerIn>>,
    events: VecDeque<OobEvent>,
    /// A peer silent this long is lost.
    timeout: Duration,
}

/// One connection's read side.
struct PeerIn {
    stream: TcpStream,
    /// Verifies the peer's frames.
    key: FrameKey,
    /// Bytes received and not yet decoded (at most one partial frame after a pump).
    buf: Vec<u8>,
    /// When the last byte arrived (heartbeats included).
    heard: Instant,
}

/// What one non-blocking read saw.
enum ReadOutcome {
    /// Bytes were appended.
    Data,
    /// Nothing to read now.
    Empty,
    /// The connection is gone, with why.
    Lost(String),
}

impl PeerIn {
    /// Read what the socket holds without blocking.
    fn read_some(&mut self) -> ReadOutcome {
        const READ: usize = 64 * 1024;
        self.buf.reserve(READ);
        let spare = self.buf.spare_capacity_mut();
        // SAFETY: `spare` is writable memory of `spare.len()` bytes owned by `self.buf`; the fd
        // is open while `self` lives; recv writes at most that many bytes.
        let n =
            unsafe { libc::recv(self.stream.as_raw_fd(), spare.as_mut_ptr().cast(), spare.len(), libc::MSG_DONTWAIT) };
        match usize::try_from(n) {
            Ok(0) => ReadOutcome::Lost("connection closed (process exited?)".into()),
            Ok(n) => {
                // SAFETY: recv initialized the first `n` spare bytes (n <= spare.len()).
                unsafe { self.buf.set_len(self.buf.len() + n) };
                ReadOutcome::Data
            }
            Err(_) => {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => ReadOutcome::Empty,
                    _ => ReadOutcome::Lost(format!("connection error: {e}")),
                }
            }
        }
    }

    /// Decode and verify the complete frames in the buffer; an impossible length or a frame
    /// that does not verify loses the peer.
    fn decode(&mut self, from: u32, stats: &OobStats, out: &mut VecDeque<OobEvent>) -> Result<(), String> {
        decode_frames(&mut self.buf, &mut self.key, from, stats, out)
    }
}

impl Inbox {
    /// Read every connection that has bytes, decode its frames, and report peers that closed,
    /// failed, sent garbage or stayed silent past the timeout (each once; it is then dropped).
    fn pump(&mut self, stats: &OobStats) {
        let live: Vec<usize> = (0..self.peers.len()).filter(|&r| self.peers[r].is_some()).collect();
        if live.is_empty() {
            return;
        }
        let mut fds: Vec<libc::pollfd> = live
            .iter()
            .filter_map(|&r| self.peers[r].as_ref())
            .map(|p| libc::pollfd { fd: p.stream.as_raw_fd(), events: libc::POLLIN, revents: 0 })
            .collect();
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd structs; zero timeout.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) };
        let now = Instant::now();
        for (i, &r) in live.iter().enumerate() {
            let from = r as u32;
            let Some(peer) = self.peers[r].as_mut() else { continue };
            let mut lost = None;
            if ready > 0 && fds[i].revents != 0 {
                loop {
                    match peer.read_some() {
                        ReadOutcome::Data => peer.heard = now,
                        ReadOutcome::Empty => break,
                        ReadOutcome::Lost(why) => {
                            lost = Some(why);
                            break;
                        }
                    }
                }
                // Frames that arrived before a close are still delivered, in order.
                if let Err(why) = peer.decode(from, stats, &mut self.events) {
                    lost = Some(why);
                }
            }
            if lost.is_none() && now.duration_since(peer.heard) > self.timeout {
                lost = Some(format!("silent for {} ms (no heartbeat)", self.timeout.as_millis()));
            }
            if let Some(why) = lost {
                self.events.push_back(OobEvent::PeerLost { rank: from, why });
                self.peers[r] = None;
            }
        }
    }
}

impl OobMesh {
    /// Connect to every peer in `table` (lower ranks accept, higher ranks connect) by
    /// `deadline`. `listener` is this rank's OOB listener (its address is in the table).
    /// A peer silent for `peer_timeout` is reported as lost.
    pub fn establish(
        listener: TcpListener,
        rank: u32,
        table: &[PeerInfo],
        secret: &Secret,
        peer_timeout: Duration,
        deadline: Instant,
    ) -> Result<Self, OobError> {
        let world = table.len() as u32;
        if rank >= world {
            return Err(OobError::NoSuchRank(rank));
        }
        let start = Instant::now();
        let stats = Arc::new(OobStats::default());
        let shutdown = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(StopFd::new().map_err(|source| OobError::Io { rank, source })?);
        let mut streams: Vec<Option<(TcpStream, hello::Keys)>> = (0..world).map(|_| None).collect();
        for peer in table.iter().filter(|p| p.rank < rank) {
            let s = hello::connect(&peer.oob_addr, secret, rank, peer.rank, deadline)
                .map_err(|source| OobError::Io { rank: peer.rank, source })?;
            streams[peer.rank as usize] = Some(s);
        }
        let expected: u32 = world - rank - 1;
        let (acc_tx, acc_rx) = crossbeam_channel::unbounded::<(u32, TcpStream, hello::Keys)>();
        {
            let (secret, stats, shutdown, stop) = (secret.clone(), stats.clone(), shutdown.clone(), stop.clone());
            if let Err(source) = listener.set_nonblocking(true) {
                return Err(OobError::Io { rank, source });
            }
            // Each handshake on a thread of its own (at most MAX_HANDSHAKES at once): a silent
            // stranger holds one of them for HELLO_LIMIT, never the acceptor.
            let busy = Arc::new(AtomicUsize::new(0));
            let accept = move || {
                while !shutdown.load(Ordering::Relaxed) {
                    if busy.load(Ordering::Relaxed) >= MAX_HANDSHAKES {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                    let (s, addr) = match listener.accept() {
                        Ok(x) => x,
                        Err(_) => {
                            // Sleep in poll(2) until a connection arrives or a shutdown signals
                            // the stop descriptor, not in a nap: an idle communicator's acceptor
                            // must not wake on a timer.
                            let mut fds = [
                                libc::pollfd {
                                    fd: std::os::fd::AsRawFd::as_raw_fd(&listener),
                                    events: libc::POLLIN,
                                    revents: 0,
                                },
                                libc::pollfd {
                                    fd: std::os::fd::AsRawFd::as_raw_fd(&stop.0),
                                    events: libc::POLLIN,
                                    revents: 0,
                                },
                            ];
                            // SAFETY: two valid pollfd structs for the call's duration.
                            unsafe { libc::poll(fds.as_mut_ptr(), 2, ACCEPT_WAIT_MS) };
                            continue;
                        }
                    };
                    let (secret, stats2, acc_tx, busy2) = (secret.clone(), stats.clone(), acc_tx.clone(), busy.clone());
                    busy.fetch_add(1, Ordering::Relaxed);
                    let run = move || {
                        let verdict = s
                            .set_nonblocking(false)
                            .map_err(|e| e.to_string())
                            .and_then(|()| hello::accept(&s, &secret, rank, world, HELLO_LIMIT));
                        match verdict {
                            Ok((r, keys)) if r > rank => {
                                // The mesh may be built (or given up) already: then it is a stray.
                                if acc_tx.send((r, s, keys)).is_err() {
                                    stats2.rejected.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                            Ok((r, _)) => {
                                stats2.rejected.fetch_add(1, Ordering::Relaxed);
                                tracing::warn!(target: subsys::BOOTSTRAP, %addr, r, "rejected unexpected OOB connection");
                            }
                            Err(why) => {
                                stats2.rejected.fetch_add(1, Ordering::Relaxed);
                                tracing::warn!(target: subsys::BOOTSTRAP, %addr, %why, "rejected OOB connection");
                            }
                        }
                        busy2.fetch_sub(1, Ordering::Relaxed);
                    };
                    if std::thread::Builder::new().name("r2ccl-oob-hello".into()).spawn(run).is_err() {
                        // No thread: the connection (moved into the closure) is dropped.
                        busy.fetch_sub(1, Ordering::Relaxed);
                        stats.rejected.fetch_add(1, Ordering::Relaxed);
                    }
                }
            };
            std::thread::Builder::new()
                .name("r2ccl-oob-accept".into())
                .spawn(accept)
                .map_err(|source| OobError::Io { rank, source })?;
        }
        let mut accepted = 0;
        while accepted < expected {
            let remaining = deadline.saturating_duration_since(Instant::now());
            match acc_rx.recv_timeout(remaining) {
                Ok((r, s, k)) if streams[r as usize].is_none() => {
                    streams[r as usize] = Some((s, k));
                    accepted += 1;
                }
                Ok((r, ..)) => {
                    stats.rejected.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(target: subsys::BOOTSTRAP, r, "rejected duplicate OOB connection");
                }
                Err(_) => {
                    shutdown.store(true, Ordering::Relaxed);
                    stop.signal();
                    let missing = (0..world).filter(|&r| r != rank && streams[r as usize].is_none()).collect();
                    return Err(OobError::Timeout { missing, waited_ms: start.elapsed().as_millis() as u64 });
                }
            }
        }
        // From here on an error must also end the acceptor, which is running already.
        let fail = |e: OobError| {
            shutdown.store(true, Ordering::Relaxed);
            stop.signal();
            e
        };
        let backlog = Arc::new(AtomicBool::new(false));
        let mut writers = Vec::with_capacity(world as usize);
        let mut peers = Vec::with_capacity(world as usize);
        let heard = Instant::now();
        for (peer, s) in streams.into_iter().enumerate() {
            let Some((s, keys)) = s else {
                writers.push(None);
                peers.push(None);
                continue;
            };
            let io = |source| OobError::Io { rank: peer as u32, source };
            // Control messages are small and latency-bound: no Nagle delay.
            s.set_nodelay(true).map_err(io).map_err(fail)?;
            // Reads (MSG_DONTWAIT) and writes (queued) never block.
            s.set_nonblocking(true).map_err(io).map_err(fail)?;
            let reader = s.try_clone().map_err(io).map_err(fail)?;
            peers.push(Some(PeerIn { stream: reader, key: keys.inbound, buf: Vec::new(), heard }));
            let out = PeerOut {
                stream: s,
                key: keys.outbound,
                queue: Vec::new(),
                stuck_since: None,
                broken: None,
                backlog: backlog.clone(),
            };
            writers.push(Some(Arc::new(Mutex::new(out))));
        }
        let beat: Vec<Arc<Mutex<PeerOut>>> = writers.iter().flatten().cloned().collect();
        let quit = shutdown.clone();
        let period = peer_timeout / 4;
        let beats = stats.clone();
        let heartbeat = move || {
            while !quit.load(Ordering::Relaxed) {
                for w in &beat {
                    let mut out = w.lock().unwrap_or_else(PoisonError::into_inner);
                    // A heartbeat behind queued frames adds nothing; the queue is drained either
                    // way. A peer cut off shows up as PeerLost on the reader side.
                    let _ = if out.queue.is_empty() {
                        beats.sent[Channel::Heartbeat as usize].fetch_add(1, Ordering::Relaxed);
                        out.send(Channel::Heartbeat, &[], peer_timeout)
                    } else {
                        out.flush(peer_timeout)
                    };
                }
                std::thread::sleep(period);
            }
        };
        std::thread::Builder::new()
            .name("r2ccl-oob-heartbeat".into())
            .spawn(heartbeat)
            .map_err(|source| fail(OobError::Io { rank, source }))?;
        let inbox = Inbox { peers, events: VecDeque::new(), timeout: peer_timeout };
        Ok(Self { rank, writers, peer_timeout, backlog, inbox: Mutex::new(inbox), stats, shutdown, stop })
    }

    /// This rank.
    #[cfg(test)]
    pub const fn rank(&self) -> u32 {
        self.rank
    }

    /// Send `payload` on `channel` to `to`: queued in order and written as far as the socket
    /// takes, never blocking.
    pub fn send(&self, to: u32, channel: Channel, payload: &[u8]) -> Result<(), OobError> {
        let w =
            self.writers.get(to as usize).ok_or(OobError::NoSuchRank(to))?.as_ref().ok_or(OobError::NoSuchRank(to))?;
        let mut out = w.lock().map_err(|_| OobError::PeerGone(to))?;
        self.stats.sent[channel as usize].fetch_add(1, Ordering::Relaxed);
        out.send(channel, payload, self.peer_timeout).map_err(|source| OobError::Io { rank: to, source })
    }

    /// Send several messages to one peer on one channel in a single write (in order): a
    /// collective's receipts to one sender add up to hundreds per collective, and a system
    /// call (and a wake-up of the reader) per message adds up with them.
    pub fn send_many(&self, to: u32, channel: Channel, payloads: &[Vec<u8>]) -> Result<(), OobError> {
        let w =
            self.writers.get(to as usize).ok_or(OobError::NoSuchRank(to))?.as_ref().ok_or(OobError::NoSuchRank(to))?;
        let mut out = w.lock().map_err(|_| OobError::PeerGone(to))?;
        if let Some(why) = &out.broken {
            return Err(OobError::Io { rank: to, source: io::Error::new(io::ErrorKind::BrokenPipe, why.clone()) });
        }
        self.stats.sent[channel as usize].fetch_add(payloads.len() as u64, Ordering::Relaxed);
        let PeerOut { key, queue, .. } = &mut *out;
        for p in payloads {
            key.seal_into(queue, channel, p).map_err(|source| OobError::Io { rank: to, source })?;
        }
        out.flush(self.peer_timeout).map_err(|source| OobError::Io { rank: to, source })
    }

    /// Send to every peer; returns the ranks that could not be reached.
    pub fn broadcast(&self, channel: Channel, payload: &[u8]) -> Vec<u32> {
        (0..self.writers.len() as u32)
            .filter(|&r| r != self.rank)
            .filter(|&r| self.send(r, channel, payload).is_err())
            .collect()
    }

    /// When the first live peer counts as silent (it sent nothing, heartbeats included, for the
    /// peer timeout), if this rank has a live peer: an idle progress thread wakes by then to
    /// report it, as a closed connection wakes it at once.
    pub fn silence_deadline(&self) -> Option<Instant> {
        let inbox = self.inbox.lock().unwrap_or_else(PoisonError::into_inner);
        inbox.peers.iter().flatten().map(|p| p.heard + inbox.timeout).min()
    }

    /// The next event, or `None` if nothing arrives by `deadline` (a deadline already passed
    /// still reads what the connections hold, without blocking).
    pub fn recv_deadline(&self, deadline: Instant) -> Option<OobEvent> {
        self.flush_queues();
        loop {
            let fds = {
                let mut inbox = self.inbox.lock().unwrap_or_else(PoisonError::into_inner);
                if inbox.events.is_empty() {
                    inbox.pump(&self.stats);
                }
                if let Some(ev) = inbox.events.pop_front() {
                    return Some(ev);
                }
                inbox.peers.iter().flatten().map(|p| p.stream.as_raw_fd()).collect::<Vec<RawFd>>()
            };
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            // Wake at least every 50 ms to check the peers' liveness.
            let ms = i32::try_from(left.min(Duration::from_millis(50)).as_micros().div_ceil(1000)).unwrap_or(50);
            let mut pfds: Vec<libc::pollfd> =
                fds.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
            if pfds.is_empty() {
                std::thread::sleep(Duration::from_millis(u64::from(ms.unsigned_abs())));
            } else {
                // SAFETY: `pfds` is a valid array of `pfds.len()` pollfd structs for the call's duration.
                unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
            }
        }
    }

    /// Write what the sockets take of every peer's queued frames (never waiting on a lock a
    /// sender holds: that sender flushes itself).
    /// Only when some queue was left waiting: the progress thread calls this every round, and
    /// the mesh may have thousands of peers.
    fn flush_queues(&self) {
        if !self.backlog.swap(false, Ordering::Relaxed) {
            return;
        }
        for w in self.writers.iter().flatten() {
            match w.try_lock() {
                // A flush that leaves bytes queued sets the flag again.
                Ok(mut out) if !out.queue.is_empty() => {
                    let _ = out.flush(self.peer_timeout);
                }
                Ok(_) => {}
                Err(_) => self.backlog.store(true, Ordering::Relaxed),
            }
        }
    }

    /// The connections' descriptors, to `poll(2)` for readability beside other sources (then
    /// call [`OobMesh::recv_deadline`] with a passed deadline to take what arrived).
    pub fn fds(&self) -> Vec<RawFd> {
        let inbox = self.inbox.lock().unwrap_or_else(PoisonError::into_inner);
        inbox.peers.iter().flatten().map(|p| p.stream.as_raw_fd()).collect()
    }

    /// Messages this rank has sent on `channel` (heartbeats included), since the mesh started.
    pub fn sent(&self, channel: Channel) -> u64 {
        self.stats.sent[channel as usize].load(Ordering::Relaxed)
    }

    /// Connections dropped for not proving the secret.
    #[cfg(test)]
    pub fn rejected(&self) -> u64 {
        self.stats.rejected.load(Ordering::Relaxed)
    }
}

impl Drop for OobMesh {
    fn drop(&mut self) {
        self.shutdown.store(true, Ordering::Relaxed);
        self.stop.signal();
        for w in self.writers.iter().flatten() {
            let out = w.lock().unwrap_or_else(PoisonError::into_inner);
            // What is queued goes out if the socket takes it now; then closing both directions
            // tells every peer at once (it reads end of file).
            if out.broken.is_none() && !out.queue.is_empty() {
                let _ = (&out.stream).write(&out.queue);
            }
            let _ = out.stream.shutdown(std::net::Shutdown::Both);
        }
    }
}
