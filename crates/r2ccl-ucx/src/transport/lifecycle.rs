//! Leaving and waiting: settling connections before a goodbye, forgetting a departed peer, the
//! NICs dead since the start, byte counts, and the poll that sleeps on UCX's and the caller's
//! descriptors. Part of [`UcxTransport`]; its state lives there.

#[allow(clippy::wildcard_imports, reason = "UcxTransport split by concern: its types are the parent's")]
use super::*;

impl UcxTransport {
    /// Start leaving the communicator: from now on no endpoint is connected or reconnected to
    /// any peer, and every connection this rank started is settled (established or failed)
    /// before this returns, within `settle`. Call it before telling the peers this rank leaves.
    ///
    /// From then on a peer closing an endpoint is expected (logged at DEBUG, not as a warning).
    ///
    /// Why: a peer that hears this rank leave may destroy its listeners, and UCX 1.22 calls a
    /// destroyed listener's connection callback when a connection it accepted delivers its
    /// request afterwards (SIGSEGV in `ucp_cm_server_conn_request_cb`): a connection of ours
    /// still on its way, or a reconnect started after our goodbye, would crash that peer.
    ///
    /// How: an empty message on every live endpoint, under `SETTLE_TAG` (which no receive
    /// matches; it stays in the peer's unexpected queue until its worker goes), completes only
    /// once the connection is wired up, that is once the peer accepted it. (An endpoint flush
    /// would say the same, but a flush still pending when its endpoint is closed by force makes
    /// UCX 1.22 touch the freed endpoint.) Returns how many endpoints had not settled in time.
    pub fn leave(&mut self, settle: Duration) -> usize {
        self.leaving = true;
        let deadline = Instant::now() + settle;
        let mut pending: Vec<Request<Vec<u8>>> = Vec::new();
        for rail in self.set.rails() {
            // Peers that heard our goodbye close their endpoints once all have left: expected.
            for ep in rail.endpoints() {
                ep.expect_close();
            }
            for ep in rail.endpoints().filter(|e| e.failure().is_none()) {
                if let Ok(r) = ep.tag_send(SETTLE_TAG, Vec::new()) {
                    pending.push(r);
                }
            }
        }
        while !pending.is_empty() && Instant::now() < deadline {
            let mut events = 0;
            for rail in self.set.rails() {
                events += rail.worker().progress();
            }
            pending.retain_mut(|r| !r.is_done());
            if events == 0 {
                std::thread::yield_now();
            }
        }
        let unsettled = pending.len();
        if unsettled > 0 {
            tracing::debug!(target: NET, unsettled, "leaving with endpoints whose connection had not settled");
        }
        // Released with the endpoints (or the workers), as every request given up on.
        self.detached.extend(pending);
        unsettled
    }

    /// Take in the peers' settle messages ([`UcxTransport::leave`]) that arrived here, and whatever
    /// else waits in the unexpected queues, so that UCX does not report them as unmatched when the
    /// workers go (a `tag_match.c` warning per message at exit). Call it once every peer has left.
    pub fn drain_settles(&mut self) {
        for rail in self.set.rails() {
            rail.worker().progress();
        }
        let (n, bytes) = self.discard_unexpected();
        tracing::debug!(target: NET, messages = n, bytes, "unexpected messages discarded at the end");
    }

    /// Receive and drop every message waiting in the unexpected queues now, whatever its tag;
    /// returns how many and their bytes. For the end of a communicator (and tests), not while data
    /// flows: a peer's message that waits for its receive would be lost.
    pub fn discard_unexpected(&mut self) -> (u64, u64) {
        let (mut n, mut bytes) = (0, 0);
        for rail in self.set.rails() {
            let w = rail.worker();
            while let Some(m) = w.peek_unexpected(0, 0) {
                match w.take_unexpected(m.tag, Vec::new()) {
                    Ok(Some(r)) => self.detached.push(r),
                    Ok(None) => break,
                    Err(_) => {}
                }
                n += 1;
                bytes += m.len as u64;
            }
        }
        (n, bytes)
    }

    /// Forget `peer`, which left the communicator: close its endpoints on every rail now, so
    /// that its process exiting raises no endpoint errors here, and never reconnect to it.
    /// Call it only when nothing more is exchanged with that peer over the data paths.
    pub fn forget_peer(&mut self, peer: Rank) {
        if !self.forgotten.insert(peer) {
            return;
        }
        for rail in 0..self.nics.len() {
            if let Some(r) = self.set.rail_mut(rail) {
                r.disconnect(peer);
            }
        }
        tracing::debug!(target: NET, %peer, "peer left: its endpoints are closed");
    }

    /// NICs that could not be opened when their rank started (this rank's and, after
    /// [`UcxTransport::connect_peers`], every peer's): down for the whole job. Every rank
    /// computes the same set from the same address blobs.
    pub fn dead_nics(&self) -> Vec<NicId> {
        let mut out: Vec<NicId> =
            self.nics.iter().enumerate().filter(|(_, n)| n.dead).map(|(r, _)| self.nic_id(r)).collect();
        for p in self.peers.values() {
            for (r, a) in p.addrs.iter().enumerate() {
                if a.as_bytes().is_empty() {
                    out.push(NicId { node: p.node, rail: RailId(rail_u16(r)) });
                }
            }
        }
        out.sort();
        out.dedup();
        out
    }

    /// Bytes sent and received so far on each local NIC, in rail order: `(tx, rx)`.
    pub fn nic_bytes(&self) -> Vec<(u64, u64)> {
        self.nics.iter().map(|n| (n.tx_bytes, n.rx_bytes)).collect()
    }

    /// Sleep until a NIC's worker has something to do, one of the `wake` fds (the caller's own
    /// sources, e.g. a pipe its other threads write to, its control connections) or a link-state
    /// change is readable, or `timeout`
    /// passed, whichever comes first. Returns at once when a worker has events pending. Call it
    /// only after a progress call found nothing to do: an idle progress thread then gives the
    /// CPU to the ranks and kernel work it is waiting for instead of spinning.
    pub fn wait(&mut self, timeout: Duration, wake: &[RawFd]) {
        // A send in flight needs progress to push more bytes when its socket drains, and UCX's
        // TCP transport does not signal writability on the event fd: nap for at most
        // SEND_NAP then (far less than a socket buffer takes to drain), never spin; a spinning
        // thread per rank starves the kernel's packet processing and the other ranks.
        let sending = self
            .out
            .values()
            .any(|o| matches!(o.kind, Kind::Send | Kind::SplitSend) && matches!(o.state, State::Live(_)));
        let timeout = if sending { timeout.min(SEND_NAP) } else { timeout };
        let mut fds: Vec<libc::pollfd> = Vec::with_capacity(self.nics.len() + 1 + wake.len());
        for w in self.set.workers() {
            match (w.arm(), w.event_fd()) {
                (Ok(true), Ok(fd)) => fds.push(libc::pollfd { fd, events: libc::POLLIN, revents: 0 }),
                // Events pending (or no wake-up support): the caller progresses again now.
                _ => return,
            }
        }
        if let Some(m) = &self.monitor {
            fds.push(libc::pollfd { fd: m.raw_fd(), events: libc::POLLIN, revents: 0 });
        }
        fds.extend(wake.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }));
        let ts = libc::timespec {
            tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
            tv_nsec: libc::c_long::from(timeout.subsec_nanos().min(999_999_999) as i32),
        };
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd structs and `ts` a valid timespec
        // for the call's duration; a null signal mask leaves the thread's mask unchanged.
        unsafe { libc::ppoll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, &ts, std::ptr::null()) };
    }
}
