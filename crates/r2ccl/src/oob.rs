//! The out-of-band control mesh: one authenticated TCP connection per pair of ranks over
//! the bootstrap network (never a data NIC), carrying detection messages, health-view
//! agreement and aborts, with heartbeats so a dead peer is noticed within the peer timeout.
//!
//! Threads: one reader per connection (it turns frames into [`OobEvent`]s), one
//! heartbeat sender, one acceptor that drops and counts strangers for the mesh's
//! lifetime. The progress thread consumes events with [`OobMesh::recv_deadline`].

use crate::bootstrap::{PeerInfo, Secret};
use crate::bootstrap_mac::{tag, tags_equal};
use crate::wake::Waker;
use crossbeam_channel::{Receiver, Sender};
use r2ccl_core::subsys;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
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
    let len = u32::try_from(payload.len() + 1).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "too large"))?;
    let mut buf = Vec::with_capacity(5 + payload.len());
    buf.extend_from_slice(&len.to_le_bytes());
    buf.push(channel as u8);
    buf.extend_from_slice(payload);
    stream.write_all(&buf)
}

fn read_msg(stream: &mut TcpStream) -> io::Result<(u8, Vec<u8>)> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len == 0 || len > MAX_PAYLOAD + 1 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("bad OOB frame length {len}")));
    }
    let mut buf = vec![0u8; len];
    stream.read_exact(&mut buf)?;
    let channel = buf.remove(0);
    Ok((channel, buf))
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
    events: Receiver<OobEvent>,
    stats: Arc<OobStats>,
    shutdown: Arc<AtomicBool>,
    /// Woken after every event a reader queues (see [`OobMesh::set_waker`]).
    waker: Arc<OnceLock<Waker>>,
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

fn spawn_reader(
    mut stream: TcpStream,
    peer: u32,
    tx: Sender<OobEvent>,
    timeout: Duration,
    stats: Arc<OobStats>,
    waker: Arc<OnceLock<Waker>>,
) {
    std::thread::spawn(move || {
        let lost = |why: String| OobEvent::PeerLost { rank: peer, why };
        if let Err(e) = stream.set_read_timeout(Some(timeout)) {
            let _ = tx.send(lost(format!("cannot arm the liveness timer: {e}")));
            return;
        }
        loop {
            let event = match read_msg(&mut stream) {
                Ok((ch, payload)) => match Channel::from_u8(ch) {
                    Some(Channel::Heartbeat) => continue,
                    Some(channel) => OobEvent::Message { from: peer, channel, payload },
                    None => {
                        stats.malformed.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(target: subsys::BOOTSTRAP, peer, channel = ch, "dropped OOB frame with unknown channel");
                        continue;
                    }
                },
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    lost(format!("silent for {} ms (no heartbeat)", timeout.as_millis()))
                }
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    lost("connection closed (process exited?)".into())
                }
                Err(e) => lost(format!("connection error: {e}")),
            };
            let is_lost = matches!(event, OobEvent::PeerLost { .. });
            let sent = tx.send(event).is_ok();
            if let Some(w) = waker.get() {
                w.wake();
            }
            if !sent || is_lost {
                return;
            }
        }
    });
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
        let waker = Arc::new(OnceLock::new());
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
        let (tx, events) = crossbeam_channel::unbounded();
        let mut writers = Vec::with_capacity(world as usize);
        for (peer, s) in streams.into_iter().enumerate() {
            let Some(s) = s else {
                writers.push(None);
                continue;
            };
            // Control messages are small and latency-bound: no Nagle delay.
            s.set_nodelay(true).map_err(|source| OobError::Io { rank: peer as u32, source })?;
            let reader = s.try_clone().map_err(|source| OobError::Io { rank: peer as u32, source })?;
            // Heartbeat writes must not block forever on a dead peer's full buffer.
            s.set_write_timeout(Some(peer_timeout)).map_err(|source| OobError::Io { rank: peer as u32, source })?;
            spawn_reader(reader, peer as u32, tx.clone(), peer_timeout, stats.clone(), waker.clone());
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
        Ok(Self { rank, writers, events, stats, shutdown, waker })
    }

    /// Have every later event wake `waker` (the progress thread sleeping in `poll(2)`); set once.
    pub fn set_waker(&self, waker: Waker) {
        let _ = self.waker.set(waker);
    }

    /// This rank.
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

    /// Send to every peer; returns the ranks that could not be reached.
    pub fn broadcast(&self, channel: Channel, payload: &[u8]) -> Vec<u32> {
        (0..self.writers.len() as u32)
            .filter(|&r| r != self.rank)
            .filter(|&r| self.send(r, channel, payload).is_err())
            .collect()
    }

    /// The next event, or `None` if nothing arrives by `deadline`.
    pub fn recv_deadline(&self, deadline: Instant) -> Option<OobEvent> {
        self.events.recv_deadline(deadline).ok()
    }

    /// Connections dropped for not proving the secret.
    pub fn rejected(&self) -> u64 {
        self.stats.rejected.load(Ordering::Relaxed)
    }

    /// Frames from peers with an unknown channel.
    pub fn malformed(&self) -> u64 {
        self.stats.malformed.load(Ordering::Relaxed)
    }
}

impl Drop for OobMesh {
    fn drop(&mut self) {
        self.shutdown.store(true, Ordering::Relaxed);
        for w in self.writers.iter().flatten() {
            if let Ok(s) = w.lock() {
                // Closing both directions wakes the reader threads, which then exit.
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}
