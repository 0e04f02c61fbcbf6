//! Rails: one UCP context and worker per local NIC, and per peer a data endpoint and a separate probe
//! endpoint on each rail.
//!
//! UCX 1.13 does not stripe one context over several TCP devices (all lanes dial one rail, TESTBED.md),
//! so every NIC gets its own context restricted to it; the library stripes across them.

use crate::context::{Context, ContextConfig};
use crate::endpoint::Endpoint;
use crate::error::{Status, UcxError};
use crate::memory::MemRegion;
use crate::request::{RecvBuf, Request, SendBuf};
use crate::worker::{Worker, WorkerAddress};
use r2ccl_core::{RailId, Rank};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Tag bit reserved for zero-byte probes; data tags must leave it clear.
pub const PROBE_TAG_BIT: u64 = 1 << 63;

/// The two endpoints to one peer on one rail.
#[derive(Debug)]
pub struct PeerEndpoints {
    /// Carries data chunks; `None` once closed on its own ([`Rail::close_data`]) until reconnected.
    pub data: Option<Endpoint>,
    /// Carries only zero-byte probes, so a probe never queues behind megabytes of data.
    pub probe: Endpoint,
}

/// One local NIC: its context, its worker, and its endpoints to every connected peer's NIC on the same
/// rail.
#[derive(Debug)]
pub struct Rail {
    id: RailId,
    worker: Worker,
    peers: BTreeMap<Rank, PeerEndpoints>,
}

impl Rail {
    /// Open the NIC `config.device` as rail `id`.
    pub fn open(id: RailId, config: ContextConfig) -> Result<Self, UcxError> {
        let context = Context::new(config)?;
        let worker = Worker::new(context)?;
        Ok(Self { id, worker, peers: BTreeMap::new() })
    }

    /// The rail index.
    pub fn id(&self) -> RailId {
        self.id
    }

    /// The NIC name.
    pub fn device(&self) -> &str {
        self.worker.device()
    }

    /// The rail's worker.
    pub fn worker(&self) -> &Worker {
        &self.worker
    }

    /// The rail's context.
    pub fn context(&self) -> &Arc<Context> {
        self.worker.context()
    }

    /// Connect data and probe endpoints to `peer`'s worker on this rail (replacing old ones, which are
    /// closed by force).
    pub fn connect(&mut self, peer: Rank, address: &WorkerAddress) -> Result<(), UcxError> {
        let data = self.worker.connect(address, self.label(peer, "data"))?;
        let probe = self.worker.connect(address, self.label(peer, "probe"))?;
        self.peers.insert(peer, PeerEndpoints { data: Some(data), probe });
        Ok(())
    }

    /// Replace only those endpoints to `peer` that are missing or failed, leaving healthy ones alone
    /// (replacing a healthy one would cut the chunks in flight on it). Returns whether anything was
    /// replaced.
    pub fn reconnect(&mut self, peer: Rank, address: &WorkerAddress) -> Result<bool, UcxError> {
        let Some(eps) = self.peers.get(&peer) else {
            self.connect(peer, address)?;
            return Ok(true);
        };
        let data_bad = eps.data.as_ref().is_none_or(|d| d.failure().is_some());
        let probe_bad = eps.probe.failure().is_some();
        let data = if data_bad { Some(self.worker.connect(address, self.label(peer, "data"))?) } else { None };
        let probe = if probe_bad { Some(self.worker.connect(address, self.label(peer, "probe"))?) } else { None };
        if let Some(eps) = self.peers.get_mut(&peer) {
            if let Some(d) = data {
                eps.data = Some(d);
            }
            if let Some(p) = probe {
                eps.probe = p;
            }
        }
        Ok(data_bad || probe_bad)
    }

    /// The endpoints to `peer`.
    pub fn peer(&self, peer: Rank) -> Result<&PeerEndpoints, UcxError> {
        self.peers.get(&peer).ok_or(UcxError::OutOfRange {
            what: "peer rank",
            index: peer.index(),
            len: self.peers.len(),
        })
    }

    /// Replace the data endpoint to `peer` with a fresh one (a new connection), keeping its probe
    /// endpoint (probes in flight on it stay valid); connects both if `peer` has none yet.
    pub fn replace_data(&mut self, peer: Rank, address: &WorkerAddress) -> Result<(), UcxError> {
        if !self.peers.contains_key(&peer) {
            return self.connect(peer, address);
        }
        let data = self.worker.connect(address, self.label(peer, "data"))?;
        if let Some(eps) = self.peers.get_mut(&peer) {
            eps.data = Some(data);
        }
        Ok(())
    }

    /// Every endpoint of this rail, data and probe, to every peer.
    pub fn endpoints(&self) -> impl Iterator<Item = &Endpoint> {
        self.peers.values().flat_map(|e| e.data.iter().chain(std::iter::once(&e.probe)))
    }

    /// An endpoint's label in errors and logs, e.g. `rank 3 rail 1 data`.
    fn label(&self, peer: Rank, what: &str) -> String {
        format!("rank {} rail {} {what}", peer.0, self.id.0)
    }

    /// Drop the endpoints to `peer` (forced close). Returns whether there were any.
    pub fn disconnect(&mut self, peer: Rank) -> bool {
        self.peers.remove(&peer).is_some()
    }

    /// Close the data endpoint to `peer` by force (every send on it ends at once), keeping its probe
    /// endpoint: probes still tell when the path works again, and no connect (which blocks on a
    /// black-holed path) is needed for that. Returns whether a data endpoint was open.
    pub fn close_data(&mut self, peer: Rank) -> bool {
        self.peers.get_mut(&peer).and_then(|e| e.data.take()).is_some()
    }

    /// Post a data send to `peer` with `tag` (bit [`PROBE_TAG_BIT`] must be clear).
    pub fn send<B: SendBuf>(&self, peer: Rank, tag: u64, buffer: B) -> Result<Request<B>, UcxError> {
        check_data_tag(tag)?;
        let data = self.peer(peer)?.data.as_ref().ok_or(UcxError::OutOfRange {
            what: "open data endpoint to peer rank",
            index: peer.index(),
            len: self.peers.len(),
        })?;
        data.tag_send(tag, buffer)
    }

    /// Post a data receive matching `tag` on the bits of `mask` (probes never match it).
    pub fn recv<B: RecvBuf>(&self, tag: u64, mask: u64, buffer: B) -> Result<Request<B>, UcxError> {
        check_data_tag(tag)?;
        self.worker.tag_recv(tag, mask | PROBE_TAG_BIT, buffer)
    }

    /// Post a zero-byte probe to `peer` on the probe endpoint, carrying `seq` (low 63 bits).
    pub fn probe(&self, peer: Rank, seq: u64) -> Result<Request<Vec<u8>>, UcxError> {
        self.peer(peer)?.probe.tag_send(PROBE_TAG_BIT | (seq & !PROBE_TAG_BIT), Vec::new())
    }

    /// Post a receive for the next probe from any peer; its sequence number is
    /// [`probe_seq`]`(request.sender_tag())` once complete.
    pub fn recv_probe(&self) -> Result<Request<Vec<u8>>, UcxError> {
        self.worker.tag_recv(PROBE_TAG_BIT, PROBE_TAG_BIT, Vec::new())
    }

    /// Endpoint failures recorded on this rail: `(peer, which endpoint is "data" or "probe", status)`.
    pub fn failures(&self) -> Vec<(Rank, &'static str, Status)> {
        let mut out = Vec::new();
        for (rank, eps) in &self.peers {
            if let Some(s) = eps.data.as_ref().and_then(Endpoint::failure) {
                out.push((*rank, "data", s));
            }
            if let Some(s) = eps.probe.failure() {
                out.push((*rank, "probe", s));
            }
        }
        out
    }
}

/// The sequence number a probe's tag carries.
pub fn probe_seq(tag: u64) -> u64 {
    tag & !PROBE_TAG_BIT
}

fn check_data_tag(tag: u64) -> Result<(), UcxError> {
    if tag & PROBE_TAG_BIT != 0 {
        return Err(UcxError::InvalidConfig {
            key: "tag".into(),
            value: format!("{tag:#x}"),
            why: "bit 63 is reserved for probes",
        });
    }
    Ok(())
}

/// Every local NIC as a [`Rail`]: the set of contexts, workers and endpoints of one process.
#[derive(Debug)]
pub struct NicEndpointSet {
    rails: Vec<Rail>,
}

impl NicEndpointSet {
    /// Open one rail per config, rail `i` for `configs[i]`.
    pub fn open(configs: Vec<ContextConfig>) -> Result<Self, UcxError> {
        let rails = configs
            .into_iter()
            .enumerate()
            .map(|(i, c)| {
                let id = u16::try_from(i).map_err(|_| UcxError::OutOfRange {
                    what: "rail",
                    index: i,
                    len: usize::from(u16::MAX),
                })?;
                Rail::open(RailId(id), c)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { rails })
    }

    /// Like [`NicEndpointSet::open`], but a rail whose context cannot be opened (a NIC that is
    /// down or missing when the job starts) gets a placeholder on `lo` instead of failing the
    /// whole set; the indices of those rails come back with their errors. The caller must never
    /// publish or use a placeholder's address.
    pub fn open_tolerant(configs: Vec<ContextConfig>) -> Result<(Self, Vec<(usize, UcxError)>), UcxError> {
        let mut rails = Vec::with_capacity(configs.len());
        let mut dead = Vec::new();
        for (i, c) in configs.into_iter().enumerate() {
            let id = RailId(u16::try_from(i).map_err(|_| UcxError::OutOfRange {
                what: "rail",
                index: i,
                len: usize::from(u16::MAX),
            })?);
            let placeholder = ContextConfig { device: "lo".into(), ..c.clone() };
            match Rail::open(id, c) {
                Ok(r) => rails.push(r),
                Err(e) => {
                    rails.push(Rail::open(id, placeholder)?);
                    dead.push((i, e));
                }
            }
        }
        if dead.len() == rails.len() {
            if let Some((_, e)) = dead.into_iter().next() {
                return Err(e);
            }
            return Err(UcxError::OutOfRange { what: "usable rail", index: 0, len: 0 });
        }
        Ok((Self { rails }, dead))
    }

    /// Open TCP rails on the named interfaces.
    pub fn open_tcp(devices: &[&str]) -> Result<Self, UcxError> {
        Self::open(devices.iter().map(|d| ContextConfig::tcp(*d)).collect())
    }

    /// The rails, by index.
    pub fn rails(&self) -> &[Rail] {
        &self.rails
    }

    /// Rail `id`.
    pub fn rail(&self, id: RailId) -> Result<&Rail, UcxError> {
        self.rails.get(id.index()).ok_or(UcxError::OutOfRange {
            what: "rail",
            index: id.index(),
            len: self.rails.len(),
        })
    }

    /// Rail `index`, mutable (to connect or reconnect peers).
    pub fn rail_mut(&mut self, index: usize) -> Option<&mut Rail> {
        self.rails.get_mut(index)
    }

    /// Every rail's worker address, by rail index, to publish to peers.
    pub fn addresses(&self) -> Result<Vec<WorkerAddress>, UcxError> {
        self.rails.iter().map(|r| r.worker.address()).collect()
    }

    /// Connect to `peer` on every rail: local rail `i` to the peer's rail `i` (`addresses[i]`).
    pub fn connect(&mut self, peer: Rank, addresses: &[WorkerAddress]) -> Result<(), UcxError> {
        if addresses.len() != self.rails.len() {
            return Err(UcxError::OutOfRange {
                what: "peer address count",
                index: addresses.len(),
                len: self.rails.len(),
            });
        }
        for (rail, addr) in self.rails.iter_mut().zip(addresses) {
            rail.connect(peer, addr)?;
        }
        Ok(())
    }

    /// A region holding a copy of `data`, mapped on every rail's context.
    pub fn register(&self, data: Vec<u8>) -> Result<Arc<MemRegion>, UcxError> {
        let contexts: Vec<Arc<Context>> = self.rails.iter().map(|r| r.context().clone()).collect();
        MemRegion::new(&contexts, &data)
    }

    /// A zero-filled region of `len` bytes mapped on every rail's context.
    pub fn register_zeroed(&self, len: usize) -> Result<Arc<MemRegion>, UcxError> {
        self.register_zeroed_hot(len, len)
    }

    /// As [`NicEndpointSet::register_zeroed`], only the first `hot` bytes resident now
    /// ([`MemRegion::zeroed_hot`]).
    pub fn register_zeroed_hot(&self, len: usize, hot: usize) -> Result<Arc<MemRegion>, UcxError> {
        let contexts: Vec<Arc<Context>> = self.rails.iter().map(|r| r.context().clone()).collect();
        MemRegion::zeroed_hot(&contexts, len, hot)
    }

    /// Progress every rail's worker once; returns the total event count.
    pub fn progress(&self) -> u32 {
        self.rails.iter().map(|r| r.worker.progress()).sum()
    }

    /// The workers of every rail (for [`crate::wait_all`]).
    pub fn workers(&self) -> Vec<&Worker> {
        self.rails.iter().map(|r| &r.worker).collect()
    }
}
