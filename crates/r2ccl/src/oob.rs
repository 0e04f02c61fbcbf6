//! The out-of-band control mesh: one authenticated TCP connection per pair of ranks over
//! the bootstrap network (never a data NIC), carrying detection messages, health-view
//! agreement and aborts, with heartbeats so a dead peer is noticed within the peer timeout.
//!
//! Threads: one heartbeat sender and one acceptor that drops and counts strangers for the
//! mesh's lifetime. Reading is done by the thread that asks for events
//! ([`OobMesh::recv_deadline`], the progress thread once the communicator runs): non-blocking
//! reads of every connection, so a control message reaches the engine without a hand-off
//! between threads; [`OobMesh::fds`] lets that thread sleep in `poll(2)` on the connections too.

use crate::bootstrap::{PeerInfo, Secret};
use crate::bootstrap_mac::{tag, tags_equal};
use r2ccl_core::subsys;
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => Channel::Heartbeat,
            1 => Channel::Detect,
            2 => Channel::Agree,
            3 => Channel::Abort,
            4 => Channel::Control,
            _ => return None,
        })
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

const MAX_PAYLOAD: usize = 16 << 20;
const HELLO_LIMIT: Duration = Duration::from_secs(2);

fn write_msg(stream: &mut TcpStream, channel: Channel, payload: &[u8]) -> io::Result<()> {
    let mut buf = Vec::with_capacity(5 + payload.len());
    frame_into(&mut buf, channel, payload)?;
    stream.write_all(&buf)
}

/// Append one frame (length, channel, payload) to `buf`.
fn frame_into(buf: &mut Vec<u8>, channel: Channel, payload: &[u8]) -> io::Result<()> {
    let len = u32::try_from(payload.len() + 1).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "too large"))?;
    buf.extend_from_slice(&len.to_le_bytes());
    buf.push(channel as u8);
    buf.extend_from_slice(payload);
    Ok(())
}

/// Counters of the mesh.
#[derive(Debug, Default)]
pub struct OobStats {
    /// Connections dropped for not proving the secret or sending garbage.
    pub rejected: AtomicU64,
    /// Frames from authenticated peers that were malformed (unknown channel).
    pub malformed: AtomicU64,
}

/// One rank's end of the mesh.
pub struct OobMesh {
    rank: u32,
    writers: Vec<Option<Arc<Mutex<TcpStream>>>>,
    inbox: Mutex<Inbox>,
    stats: Arc<OobStats>,
    shutdown: Arc<AtomicBool>,
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
    /// Read what the socket holds without blocking (the socket itself stays blocking for the
    /// writers that share it).
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

    /// Decode the complete frames in the buffer; an impossible length loses the peer.
    fn decode(&mut self, from: u32, stats: &OobStats, out: &mut VecDeque<OobEvent>) -> Result<(), String> {
        decode_frames(&mut self.buf, from, stats, out)
    }
}

/// Take the complete frames off the front of `buf` (what a peer's connection delivered so far)
/// as events; an impossible length is an error (the peer is lost). Never panics, whatever the
/// bytes.
pub(crate) fn decode_frames(
    buf: &mut Vec<u8>,
    from: u32,
    stats: &OobStats,
    out: &mut VecDeque<OobEvent>,
) -> Result<(), String> {
    let mut at = 0;
    while buf.len() - at >= 4 {
        let len = u32::from_le_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]) as usize;
        if len == 0 || len > MAX_PAYLOAD + 1 {
            return Err(format!("connection error: bad OOB frame length {len}"));
        }
        if buf.len() - at - 4 < len {
            break;
        }
        let ch = buf[at + 4];
        let payload = &buf[at + 5..at + 4 + len];
        match Channel::from_u8(ch) {
            Some(Channel::Heartbeat) => {}
            Some(channel) => out.push_back(OobEvent::Message { from, channel, payload: payload.to_vec() }),
            None => {
                stats.malformed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(target: subsys::BOOTSTRAP, peer = from, channel = ch, "dropped OOB frame with unknown channel");
            }
        }
        at += 4 + len;
    }
    buf.drain(..at);
    Ok(())
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

/// Accept-side handshake: challenge, then the connector proves the secret and names its rank.
fn accept_hello(stream: &mut TcpStream, secret: &Secret, world: u32) -> Result<u32, String> {
    stream.set_read_timeout(Some(HELLO_LIMIT)).map_err(|e| e.to_string())?;
    stream.set_write_timeout(Some(HELLO_LIMIT)).map_err(|e| e.to_string())?;
    let nonce = *Secret::generate().map_err(|e| e.to_string())?.bytes();
    stream.write_all(&nonce).map_err(|e| format!("sending challenge: {e}"))?;
    let mut reply = [0u8; 20];
    stream.read_exact(&mut reply).map_err(|e| format!("reading hello: {e}"))?;
    let rank = u32::from_le_bytes([reply[0], reply[1], reply[2], reply[3]]);
    let mut mac = [0u8; 16];
    mac.copy_from_slice(&reply[4..]);
    if !tags_equal(&mac, &tag(secret, &[b"oob-hello", &nonce, &rank.to_le_bytes()])) {
        return Err("does not prove the job secret".into());
    }
    if rank >= world {
        return Err(format!("claims rank {rank} of {world}"));
    }
    Ok(rank)
}

fn connect_hello(addr: &str, secret: &Secret, rank: u32, deadline: Instant) -> io::Result<TcpStream> {
    loop {
        match TcpStream::connect(addr) {
            Ok(mut s) => {
                let limit = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
                s.set_read_timeout(Some(limit))?;
                let mut nonce = [0u8; 16];
                s.read_exact(&mut nonce)?;
                let mut hello = rank.to_le_bytes().to_vec();
                hello.extend_from_slice(&tag(secret, &[b"oob-hello", &nonce, &rank.to_le_bytes()]));
                s.write_all(&hello)?;
                return Ok(s);
            }
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
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
        let mut streams: Vec<Option<TcpStream>> = (0..world).map(|_| None).collect();
        for peer in table.iter().filter(|p| p.rank < rank) {
            let s = connect_hello(&peer.oob_addr, secret, rank, deadline)
                .map_err(|source| OobError::Io { rank: peer.rank, source })?;
            streams[peer.rank as usize] = Some(s);
        }
        let expected: u32 = world - rank - 1;
        let (acc_tx, acc_rx) = crossbeam_channel::unbounded::<(u32, TcpStream)>();
        {
            let (secret, stats, shutdown) = (secret.clone(), stats.clone(), shutdown.clone());
            if let Err(source) = listener.set_nonblocking(true) {
                return Err(OobError::Io { rank, source });
            }
            std::thread::spawn(move || {
                while !shutdown.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((mut s, addr)) => {
                            let verdict = s
                                .set_nonblocking(false)
                                .map_err(|e| e.to_string())
                                .and_then(|()| accept_hello(&mut s, &secret, world));
                            match verdict {
                                Ok(r) if r > rank && acc_tx.send((r, s)).is_ok() => {}
                                Ok(r) => {
                                    stats.rejected.fetch_add(1, Ordering::Relaxed);
                                    tracing::warn!(target: subsys::BOOTSTRAP, %addr, r, "rejected unexpected OOB connection");
                                }
                                Err(why) => {
                                    stats.rejected.fetch_add(1, Ordering::Relaxed);
                                    tracing::warn!(target: subsys::BOOTSTRAP, %addr, %why, "rejected OOB connection");
                                }
                            }
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(10)),
                    }
                }
            });
        }
        let mut accepted = 0;
        while accepted < expected {
            let remaining = deadline.saturating_duration_since(Instant::now());
            match acc_rx.recv_timeout(remaining) {
                Ok((r, s)) if streams[r as usize].is_none() => {
                    streams[r as usize] = Some(s);
                    accepted += 1;
                }
                Ok((r, _)) => {
                    stats.rejected.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(target: subsys::BOOTSTRAP, r, "rejected duplicate OOB connection");
                }
                Err(_) => {
                    shutdown.store(true, Ordering::Relaxed);
                    let missing = (0..world).filter(|&r| r != rank && streams[r as usize].is_none()).collect();
                    return Err(OobError::Timeout { missing, waited_ms: start.elapsed().as_millis() as u64 });
                }
            }
        }
        let mut writers = Vec::with_capacity(world as usize);
        let mut peers = Vec::with_capacity(world as usize);
        let heard = Instant::now();
        for (peer, s) in streams.into_iter().enumerate() {
            let Some(s) = s else {
                writers.push(None);
                peers.push(None);
                continue;
            };
            // Control messages are small and latency-bound: no Nagle delay.
            s.set_nodelay(true).map_err(|source| OobError::Io { rank: peer as u32, source })?;
            let reader = s.try_clone().map_err(|source| OobError::Io { rank: peer as u32, source })?;
            // Heartbeat writes must not block forever on a dead peer's full buffer.
            s.set_write_timeout(Some(peer_timeout)).map_err(|source| OobError::Io { rank: peer as u32, source })?;
            peers.push(Some(PeerIn { stream: reader, buf: Vec::new(), heard }));
            writers.push(Some(Arc::new(Mutex::new(s))));
        }
        let beat: Vec<Arc<Mutex<TcpStream>>> = writers.iter().flatten().cloned().collect();
        let stop = shutdown.clone();
        let period = peer_timeout / 4;
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                for w in &beat {
                    if let Ok(mut s) = w.lock() {
                        // A failed heartbeat shows up as PeerLost on the reader side.
                        let _ = write_msg(&mut s, Channel::Heartbeat, &[]);
                    }
                }
                std::thread::sleep(period);
            }
        });
        let inbox = Inbox { peers, events: VecDeque::new(), timeout: peer_timeout };
        Ok(Self { rank, writers, inbox: Mutex::new(inbox), stats, shutdown })
    }

    /// This rank.
    #[cfg(test)]
    pub const fn rank(&self) -> u32 {
        self.rank
    }

    /// Send `payload` on `channel` to `to`.
    pub fn send(&self, to: u32, channel: Channel, payload: &[u8]) -> Result<(), OobError> {
        let w =
            self.writers.get(to as usize).ok_or(OobError::NoSuchRank(to))?.as_ref().ok_or(OobError::NoSuchRank(to))?;
        let mut s = w.lock().map_err(|_| OobError::PeerGone(to))?;
        write_msg(&mut s, channel, payload).map_err(|source| OobError::Io { rank: to, source })
    }

    /// Send several messages to one peer on one channel in a single write (in order): a
    /// collective's receipts to one sender add up to hundreds per collective, and a system
    /// call (and a wake-up of the reader) per message adds up with them.
    pub fn send_many(&self, to: u32, channel: Channel, payloads: &[Vec<u8>]) -> Result<(), OobError> {
        let w =
            self.writers.get(to as usize).ok_or(OobError::NoSuchRank(to))?.as_ref().ok_or(OobError::NoSuchRank(to))?;
        let mut buf = Vec::with_capacity(payloads.iter().map(|p| 5 + p.len()).sum());
        for p in payloads {
            frame_into(&mut buf, channel, p).map_err(|source| OobError::Io { rank: to, source })?;
        }
        let mut s = w.lock().map_err(|_| OobError::PeerGone(to))?;
        s.write_all(&buf).map_err(|source| OobError::Io { rank: to, source })
    }

    /// Send to every peer; returns the ranks that could not be reached.
    pub fn broadcast(&self, channel: Channel, payload: &[u8]) -> Vec<u32> {
        (0..self.writers.len() as u32)
            .filter(|&r| r != self.rank)
            .filter(|&r| self.send(r, channel, payload).is_err())
            .collect()
    }

    /// The next event, or `None` if nothing arrives by `deadline` (a deadline already passed
    /// still reads what the connections hold, without blocking).
    pub fn recv_deadline(&self, deadline: Instant) -> Option<OobEvent> {
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

    /// The connections' descriptors, to `poll(2)` for readability beside other sources (then
    /// call [`OobMesh::recv_deadline`] with a passed deadline to take what arrived).
    pub fn fds(&self) -> Vec<RawFd> {
        let inbox = self.inbox.lock().unwrap_or_else(PoisonError::into_inner);
        inbox.peers.iter().flatten().map(|p| p.stream.as_raw_fd()).collect()
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
        for w in self.writers.iter().flatten() {
            if let Ok(s) = w.lock() {
                // Closing both directions tells every peer at once (it reads end of file).
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}
