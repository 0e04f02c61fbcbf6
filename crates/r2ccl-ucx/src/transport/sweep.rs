//! Emptying UCX's unexpected queues: a message no receive of this rank's will ever take is
//! received and dropped, and a header or whole chunk on a path the session does not listen on
//! yet goes to the session as unsolicited; so nothing a stranger sends waits inside UCX without
//! bound. Part of [`UcxTransport`]; its state lives there.
//!
//! UCX keeps a message that matched no posted receive in its worker's unexpected queue until a
//! receive takes it. A sweep looks at each rail's queue (probes apart, the rest oldest first) and
//! judges each message by its tag alone:
//! - a probe reply: dropped. Its receive is posted before the probe goes out, so a reply that
//!   waits here answers a probe given up on, or none;
//! - a probe: left for the responder (it re-arms until the queue holds none; dropped when a rail
//!   has no responder). Probes are swept apart from the rest, so a flood of them holds nothing up.
//!   A probe waiting while the responder is posted means the responder is held: a free one takes
//!   a probe at once (a receive posted after a probe arrived takes it from the queue). What holds
//!   it is a message under the probe tag whose rest never comes (a stranger's, sent in part and
//!   left so with its connection open). That responder is set aside, to end whenever UCX ends
//!   it (UCX 1.22 keeps it until the worker goes, even once the stranger has gone), and a new one
//!   posted, which takes the waiting probes; at most [`RESPONDERS_REPLACED_MAX`] are set aside;
//! - a payload (bit 60): dropped, unless a header announced it and the receive for it is not
//!   posted yet, and then the sweep of that rail stops there. Why that is sound: a peer sends a
//!   payload after its header on the same endpoint, so the header arrived first. Either a header
//!   receive took it, and the session, which handled every event before this sweep, has posted
//!   the payload's receive (it would have taken the payload at once); or the header waits in the
//!   queue too, older, and this sweep hands it over first and notes the payload it names;
//! - a data tag with bits set that no sender sets, naming no peer, or a rail the peer does not
//!   have (the settle messages of [`UcxTransport::leave`] among them): dropped;
//! - any other data tag (a header or whole chunk of a peer's, on a path the session does not
//!   listen on yet, or a forgery claiming to be one): received into a buffer and handed to the
//!   session ([`TransportEvent::Unsolicited`]), which checks its keyed header like any other,
//!   stashes an early chunk within its bounds and refuses the rest.
//!
//! A sweep runs only when the session has handled every event and no header receive has
//! finished unseen (one posted since the last round may have taken a waiting header at once):
//! the soundness argument above relies on both. It runs at most every [`SWEEP_EVERY`] and takes
//! at most [`SWEEP_MAX`] messages per rail; it passes over a rail that is down or an (injected)
//! black hole, whose completions wait too. A split header is exactly a header and its payload's
//! tag; anything else under a split tag is dropped, so every split header handed over is read
//! at once and its payload noted before the sweep looks further. Unsolicited receives still in
//! flight are at most [`UNSOLICITED_MAX`]; at that many the sweep of the rail stops there and the
//! message waits for a later sweep. It is never dropped: it may be a peer's early chunk (a burst of
//! rendezvous chunks, each in flight until its data comes, is how a four-stage joiner's
//! scatter-in arrives), and nothing would ask for a chunk the session never saw again.

#[allow(clippy::wildcard_imports, reason = "UcxTransport split by concern: its types are the parent's")]
use super::*;

/// Least time between two sweeps.
pub(super) const SWEEP_EVERY: Duration = Duration::from_millis(10);
/// Most messages one sweep takes from one rail's queue.
const SWEEP_MAX: usize = 4096;
/// Most unsolicited receives in flight (a rendezvous message is received in the background);
/// what waits beyond them waits for a later sweep.
const UNSOLICITED_MAX: usize = 64;
/// Most held probe responders set aside (UCX keeps each until its worker goes: ending the
/// stranger's connection does not end it); past that a held responder stays, and probes on its
/// rail go unanswered until it ends.
const RESPONDERS_REPLACED_MAX: u64 = 64;

/// What the sweeps of the unexpected queues did ([`UcxTransport::sweep_stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SweepStats {
    /// Messages received and dropped: stray probe replies, tags naming no peer or rail, payloads
    /// no header announced.
    pub dropped: u64,
    /// Bytes of the dropped messages.
    pub dropped_bytes: u64,
    /// Messages handed to the session as unsolicited.
    pub unsolicited: u64,
    /// Sweeps of a rail that stopped at a message they had to leave (a payload whose header was
    /// just handed over, or a split header still arriving), or skipped because a header receive
    /// had finished unseen.
    pub held_off: u64,
    /// Probe responders set aside because a message that never finished held them while probes
    /// waited (a new one took their place).
    pub responders_replaced: u64,
}

/// What a sweep does with a message.
enum Verdict {
    Drop,
    Unsolicited(PathId),
    Leave,
}

impl UcxTransport {
    /// What the sweeps of the unexpected queues did so far.
    pub fn sweep_stats(&self) -> SweepStats {
        self.sweep
    }

    /// Sweep every rail's unexpected queue (see the module docs), if one is due.
    pub(super) fn sweep_unexpected(&mut self) {
        let now = Instant::now();
        if !self.events.is_empty() || now < self.swept_at + SWEEP_EVERY {
            return;
        }
        self.swept_at = now;
        // A header receive that UCX finished and nobody looked at yet (one posted since the last
        // round took a waiting header at once): its payload may wait in the queue, its receive not
        // posted yet. The next round reports it and the session posts that receive; sweep then.
        // (Rails that are down or black holes are not swept: their completions wait too.)
        let nics = &self.nics;
        let unseen = self.out.values_mut().any(|o| match &mut o.state {
            State::Live(r) if o.kind == Kind::Recv && !nics[o.path.local.rail.index()].blackhole => r.is_done(),
            _ => false,
        });
        if unseen {
            self.sweep.held_off += 1;
            return;
        }
        // Payloads whose header was handled but whose receive is held back (a black-holed NIC).
        let mut announced: BTreeSet<u64> = self
            .out
            .values()
            .filter_map(|o| match &o.state {
                State::Held(Held::Payload(tag, _)) => Some(*tag),
                _ => None,
            })
            .collect();
        for rail in 0..self.nics.len() {
            // A black hole (injected) takes in nothing, and a down NIC's requests are failed:
            // what waits there stays for when the rail is back.
            if self.nics[rail].blackhole || self.nics[rail].is_down() {
                continue;
            }
            // A probe waiting beside a posted responder: that responder is held (module doc).
            let held = self.nics[rail].responder.is_some()
                && self.sweep.responders_replaced < RESPONDERS_REPLACED_MAX
                && self.set.rails()[rail].worker().peek_unexpected(PROBE_TAG_BIT, PROBE_TAG_BIT | REPLY_BIT).is_some();
            if held {
                if let Some(old) = self.nics[rail].responder.take() {
                    self.detached.push(old);
                }
                self.arm_responder(rail);
                self.sweep.responders_replaced += 1;
                let n = self.sweep.responders_replaced;
                if n.is_power_of_two() {
                    tracing::warn!(target: NET, rail, replaced_so_far = n, "probe responder held by a message that does not finish (a stranger's?); replaced");
                }
            }
            // Probe replies, and probes while no responder takes them: dropped, in any order.
            let probes = if self.nics[rail].responder.is_some() { PROBE_TAG_BIT | REPLY_BIT } else { PROBE_TAG_BIT };
            for _ in 0..SWEEP_MAX {
                let Some(m) = self.set.rails()[rail].worker().peek_unexpected(probes, probes) else { break };
                if !self.drop_unexpected(rail, m) {
                    break;
                }
            }
            // Everything else, oldest first (the order the soundness argument needs): probes
            // are passed over, the responder takes them.
            for _ in 0..SWEEP_MAX {
                let Some(m) = self.set.rails()[rail].worker().peek_unexpected(0, PROBE_TAG_BIT) else { break };
                match self.verdict(rail, m.tag, m.len, &announced) {
                    Verdict::Leave => {
                        self.sweep.held_off += 1;
                        break;
                    }
                    Verdict::Unsolicited(path) => {
                        // At the cap, the message waits for the next sweep (it is a peer's chunk
                        // until its keyed header says otherwise: dropping it would lose it).
                        if self.unsolicited.len() >= UNSOLICITED_MAX
                            || !self.take_unsolicited(rail, path, m.tag, &mut announced)
                        {
                            self.sweep.held_off += 1;
                            break;
                        }
                    }
                    Verdict::Drop => {
                        if !self.drop_unexpected(rail, m) {
                            break;
                        }
                    }
                }
            }
        }
    }

    /// Receive `m` (the oldest waiting message under its tag) into nothing, which frees it.
    /// Returns false when it was gone.
    fn drop_unexpected(&mut self, rail: usize, m: crate::Unexpected) -> bool {
        match self.set.rails()[rail].worker().take_unexpected(m.tag, Vec::new()) {
            Ok(Some(r)) => self.detached.push(r),
            Ok(None) => return false,
            // The receive could not start (UCX out of memory): the message is out of the queue,
            // and what UCX holds of it is UCX's to free.
            Err(_) => {}
        }
        self.sweep.dropped += 1;
        self.sweep.dropped_bytes += m.len as u64;
        true
    }

    fn verdict(&self, rail: usize, tag: u64, len: usize, announced: &BTreeSet<u64>) -> Verdict {
        if tag & PROBE_TAG_BIT != 0 {
            // Not looked at here (the probe space is swept first); the responder's, if ever.
            return Verdict::Leave;
        }
        if tag & PAYLOAD_BIT != 0 {
            return if tag & !(PAYLOAD_BIT | PAYLOAD_RANDOM) == 0 && announced.contains(&tag) {
                Verdict::Leave
            } else {
                Verdict::Drop
            };
        }
        if tag & !(DATA_MASK | SPLIT_BIT) != 0 {
            return Verdict::Drop;
        }
        // A split header is exactly a header and its payload's tag: small, so it arrives whole at
        // once. Anything else under a split tag is not a peer's (and could not be read at once).
        if tag & SPLIT_BIT != 0 && len != HEADER_LEN + PAYLOAD_TAG_LEN {
            return Verdict::Drop;
        }
        let peer = Rank((tag & 0xFFFF_FFFF) as u32);
        let remote_rail = ((tag >> 32) & 0xFF) as usize;
        match self.peers.get(&peer) {
            Some(p) if peer != self.rank && !self.forgotten.contains(&peer) && remote_rail < p.addrs.len() => {
                let remote = NicId { node: p.node, rail: RailId(rail_u16(remote_rail)) };
                Verdict::Unsolicited(PathId::new(self.nic_id(rail), peer, remote))
            }
            _ => Verdict::Drop,
        }
    }

    /// Receive the waiting message under `tag` for the session. Returns false when the sweep of
    /// this rail must stop here: a split header whose payload tag is not known yet (its receive
    /// still in flight).
    fn take_unsolicited(&mut self, rail: usize, path: PathId, tag: u64, announced: &mut BTreeSet<u64>) -> bool {
        let buf = self.pool.take(HEADER_LEN + SPLIT_MIN);
        let mut r = match self.set.rails()[rail].worker().take_unexpected(tag, DataBuf::Owned(buf)) {
            Ok(Some(r)) => r,
            Ok(None) => return false,
            Err(e) => {
                // Failed at once (longer than any chunk): what a header receive reports then.
                tracing::debug!(target: NET, %path, error = %e, "unsolicited message failed to arrive; dropped");
                self.events.push_back(TransportEvent::Unsolicited { path, kind: CompletionKind::Received(Vec::new()) });
                self.sweep.unsolicited += 1;
                return true;
            }
        };
        self.sweep.unsolicited += 1;
        match outcome(&self.nics, Kind::Recv, rail, &mut r) {
            Some((kind, n)) => {
                self.nics[rail].rx_bytes += n as u64;
                if let CompletionKind::Header { payload, .. } = &kind {
                    announced.insert(payload.0);
                }
                self.events.push_back(TransportEvent::Unsolicited { path, kind });
                true
            }
            None => {
                self.unsolicited.push((path, r));
                tag & SPLIT_BIT == 0
            }
        }
    }

    /// Unsolicited receives that finished since the last call, as events.
    pub(super) fn collect_unsolicited(&mut self) {
        let nics = &self.nics;
        let events = &mut self.events;
        let mut rx = vec![0u64; nics.len()];
        self.unsolicited.retain_mut(|(path, r)| {
            let rail = path.local.rail.index();
            match outcome(nics, Kind::Recv, rail, r) {
                Some((kind, n)) => {
                    rx[rail] += n as u64;
                    events.push_back(TransportEvent::Unsolicited { path: *path, kind });
                    false
                }
                None => true,
            }
        });
        for (nic, n) in self.nics.iter_mut().zip(rx) {
            nic.rx_bytes += n;
        }
    }
}
