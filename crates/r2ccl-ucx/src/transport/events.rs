//! What happens to a `UcxTransport` between calls: NICs going down and up (link monitor and
//! injected faults), probes answered, endpoint errors reported, and completions collected into
//! transport events; with the tag generator and the outcome of a finished request. Part of
//! [`UcxTransport`]; its state lives there.

#[allow(clippy::wildcard_imports, reason = "UcxTransport split by concern: its types are the parent's")]
use super::*;

impl UcxTransport {
    /// A local NIC went down (link or injected): report it, then fail everything on it.
    pub(super) fn nic_down(&mut self, rail: usize) {
        let nic = self.nic_id(rail);
        tracing::warn!(target: NET, %nic, "local NIC down: failing its requests");
        self.events.push_back(TransportEvent::LinkState { nic, up: false });
        let ids: Vec<RequestId> =
            self.out.iter().filter(|(_, o)| o.path.local.rail.index() == rail).map(|(id, _)| *id).collect();
        for id in ids {
            if let Some(mut o) = self.out.remove(&id) {
                // A receive into place that UCX still holds would write the region whenever its
                // bytes arrive after the NIC returns, over whatever a later collective put there.
                if o.kind == Kind::Placed && !self.stop_placed(rail, &mut o.state).1 {
                    self.out.insert(id, o);
                    continue;
                }
                self.retire(o.path, o.kind, o.state, true);
                self.complete(id, o.path, CompletionKind::Failed(PathFault::LocalNicDown));
            }
        }
    }

    pub(super) fn nic_up(&mut self, rail: usize) {
        let nic = self.nic_id(rail);
        tracing::info!(target: NET, %nic, "local NIC up");
        self.events.push_back(TransportEvent::LinkState { nic, up: true });
    }

    pub(super) fn run_faults(&mut self) {
        let Some(t0) = self.connected_at else { return };
        let now = Instant::now();
        for i in 0..self.faults.len() {
            let f = &self.faults[i];
            let rail = usize::from(f.spec.nic);
            match f.fired {
                None => {
                    let n = &self.nics[rail];
                    if f.spec.is_due(n.bytes, n.msgs, now - t0) {
                        let kind = f.spec.kind;
                        self.faults[i].fired = Some(self.fired.len());
                        self.fired.push(FiredFault { nic: self.nic_id(rail), kind, at: now, healed: None });
                        tracing::warn!(target: NET, rail, %kind, "R2CCL_FAULT fired");
                        self.apply_fault(rail, kind, true);
                    }
                }
                Some(k) if !f.healed => {
                    if let Some(d) = f.spec.duration {
                        if now - self.fired[k].at >= d {
                            let kind = f.spec.kind;
                            self.faults[i].healed = true;
                            self.fired[k].healed = Some(now);
                            tracing::warn!(target: NET, rail, %kind, "R2CCL_FAULT healed");
                            self.apply_fault(rail, kind, false);
                        }
                    }
                }
                Some(_) => {}
            }
        }
    }

    pub(super) fn apply_fault(&mut self, rail: usize, kind: FaultKind, on: bool) {
        match kind {
            FaultKind::Down => {
                let was_down = self.nics[rail].is_down();
                self.nics[rail].fault_down = on;
                let is_down = self.nics[rail].is_down();
                if is_down && !was_down {
                    self.nic_down(rail);
                } else if was_down && !is_down {
                    self.nic_up(rail);
                }
            }
            FaultKind::Blackhole => {
                self.nics[rail].blackhole = on;
                if !on {
                    let held: Vec<RequestId> = self
                        .out
                        .iter()
                        .filter(|(_, o)| o.path.local.rail.index() == rail && matches!(o.state, State::Held(_)))
                        .map(|(id, _)| *id)
                        .collect();
                    for id in held {
                        if let Some(mut o) = self.out.remove(&id) {
                            if let State::Held(h) = std::mem::replace(&mut o.state, State::Stuck) {
                                o.state = self.launch(o.path, h);
                            }
                            self.out.insert(id, o);
                        }
                    }
                }
            }
            FaultKind::Slow { factor } => self.nics[rail].slow = on.then_some(factor),
        }
    }

    pub(super) fn run_link_monitor(&mut self) {
        let Some(m) = self.monitor.as_mut() else { return };
        for change in m.poll() {
            for rail in 0..self.nics.len() {
                if self.nics[rail].ifindex != Some(change.ifindex) || self.nics[rail].link_up == change.up {
                    continue;
                }
                if self.nics[rail].dead {
                    continue;
                }
                let was_down = self.nics[rail].is_down();
                self.nics[rail].link_up = change.up;
                let is_down = self.nics[rail].is_down();
                if is_down && !was_down {
                    self.nic_down(rail);
                } else if was_down && !is_down {
                    self.nic_up(rail);
                }
            }
        }
    }

    /// Answer probes that arrived on every rail and re-arm the responders.
    pub(super) fn answer_probes(&mut self) {
        for rail in 0..self.nics.len() {
            while let Some(resp) = self.nics[rail].responder.as_mut() {
                let Some(res) = resp.poll() else { break };
                let tag = resp.sender_tag().unwrap_or(0);
                let nonce = resp.take_buffer().and_then(|b| <[u8; PROBE_LEN]>::try_from(b.as_slice()).ok());
                let silent = self.nics[rail].is_down() || self.nics[rail].blackhole;
                // A probe is exactly its nonce; anything else (a stranger's) gets no answer.
                if let (Ok(_), Some(nonce), false) = (res, nonce, silent) {
                    let peer = Rank(u32::try_from(tag & 0xFFFF_FFFF).unwrap_or(u32::MAX));
                    let reply = PROBE_TAG_BIT | REPLY_BIT | (u64::from_le_bytes(nonce) & PROBE_NONCE_MASK);
                    let r = &self.set.rails()[rail];
                    match r.peer(peer).and_then(|e| e.probe.tag_send(reply, Vec::new())) {
                        Ok(s) => self.detached.push(s),
                        Err(e) => tracing::debug!(target: NET, rail, %peer, error = %e, "probe reply failed"),
                    }
                }
                self.arm_responder(rail);
            }
        }
    }

    /// Post rail `rail`'s probe responder (an 8-byte receive of every probe), in place of the one
    /// there (which the caller has dealt with).
    pub(super) fn arm_responder(&mut self, rail: usize) {
        match post_responder(self.set.rails()[rail].worker()) {
            Ok(r) => self.nics[rail].responder = Some(r),
            Err(e) => {
                tracing::warn!(target: NET, rail, error = %e, "cannot re-arm the probe responder");
                self.nics[rail].responder = None;
            }
        }
    }

    pub(super) fn report_endpoint_errors(&mut self) {
        for rail in 0..self.nics.len() {
            let failed: Vec<Rank> = self.set.rails()[rail].failures().into_iter().map(|(p, _, _)| p).collect();
            for peer in failed {
                if self.forgotten.contains(&peer) || !self.nics[rail].reported_eps.insert(peer) {
                    continue;
                }
                let Some(p) = self.peers.get(&peer) else { continue };
                let path = PathId::new(self.nic_id(rail), peer, NicId { node: p.node, rail: RailId(rail_u16(rail)) });
                let fault = if self.nics[rail].is_down() { PathFault::LocalNicDown } else { PathFault::Endpoint };
                self.events.push_back(TransportEvent::PathError { path, fault });
            }
        }
    }

    pub(super) fn collect_completions(&mut self) {
        let now = Instant::now();
        // Poll in place and take out only what finished: the requests are large, and moving
        // every outstanding one out of the map and back in on every progress round was the
        // progress thread's largest cost.
        let mut finished: Vec<(RequestId, CompletionKind)> = Vec::new();
        let poll_live = self.unpolled || now >= self.polled_at + FULL_POLL_EVERY;
        if poll_live {
            self.unpolled = false;
            self.polled_at = now;
        }
        let nics = &self.nics;
        let mut placed: Vec<(usize, u64)> = Vec::new();
        for (&id, o) in &mut self.out {
            let rail = o.path.local.rail.index();
            if nics[rail].blackhole {
                continue;
            }
            let done = match &mut o.state {
                State::Live(_) | State::Probe { .. } if !poll_live => None,
                State::Live(r) => outcome(nics, o.kind, rail, r).map(|(k, n)| {
                    if k == CompletionKind::Placed {
                        placed.push((rail, n as u64));
                    }
                    k
                }),
                State::Probe { send, reply } => {
                    let send_failed = send.as_mut().and_then(|s| s.poll()).is_some_and(|r| r.is_err());
                    if send_failed {
                        Some(CompletionKind::Failed(if nics[rail].is_down() {
                            PathFault::LocalNicDown
                        } else {
                            PathFault::Endpoint
                        }))
                    } else {
                        match reply.poll() {
                            Some(Ok(_)) => Some(CompletionKind::ProbeOk),
                            Some(Err(_)) => Some(CompletionKind::Failed(PathFault::Endpoint)),
                            None => None,
                        }
                    }
                }
                State::Delayed(k, at) => (now >= *at).then(|| k.clone()),
                State::Held(_) | State::Stuck => None,
            };
            if let Some(kind) = done {
                finished.push((id, kind));
            }
        }
        for (rail, n) in placed {
            self.nics[rail].bytes += n;
            self.nics[rail].rx_bytes += n;
        }
        for (id, kind) in finished {
            let Some(mut o) = self.out.remove(&id) else { continue };
            let rail = o.path.local.rail.index();
            if let CompletionKind::Received(b) = &kind {
                self.nics[rail].bytes += b.len() as u64;
                self.nics[rail].rx_bytes += b.len() as u64;
            }
            // A slow NIC's sends complete 1/F times as late as they did; receives are not delayed:
            // they are posted ahead of their data, so their time since posting is mostly waiting
            // (stretching it held a 6 s run for 18 s and more on loopback).
            let slowed = self.nics[rail]
                .slow
                .filter(|_| matches!(o.kind, Kind::Send | Kind::SplitSend) && !matches!(o.state, State::Delayed(..)));
            if let Some(f) = slowed {
                let extra = now.duration_since(o.posted).mul_f64(1.0 / f - 1.0);
                let old = std::mem::replace(&mut o.state, State::Delayed(kind, now + extra));
                self.retire(o.path, o.kind, old, false);
                self.out.insert(id, o);
                continue;
            }
            self.retire(o.path, o.kind, o.state, false);
            self.complete(id, o.path, kind);
        }
        self.detached.retain_mut(|r| !r.is_done());
        // A receive into place given up while UCX held it is over now: UCX writes nothing more
        // into its (poisoned) range, which receives into place may use again.
        self.detached_data.retain_mut(|r| {
            if !r.is_done() {
                return true;
            }
            if let Some(DataBuf::Region(slice)) = r.buffer() {
                if slice.is_alias() && slice.region().heal(&slice.range()).unwrap_or(false) {
                    tracing::debug!(target: NET, range = ?slice.range(), "given-up receive into place over: its range healed");
                }
            }
            false
        });
    }
}

/// Unguessable 64-bit values for payload tags and probe nonces, drawn from the OS in batches.
#[derive(Debug, Default)]
pub(super) struct TagRng {
    pool: Vec<u64>,
}

impl TagRng {
    /// The next random value; `None` when the OS gives no randomness.
    pub(super) fn next(&mut self) -> Option<u64> {
        if self.pool.is_empty() {
            let mut bytes = [0u8; 512];
            getrandom::fill(&mut bytes).ok()?;
            self.pool.extend(bytes.chunks_exact(8).map(|c| {
                let mut w = [0u8; 8];
                w.copy_from_slice(c);
                u64::from_le_bytes(w)
            }));
        }
        self.pool.pop()
    }
}

/// The outcome of a finished live request, with the bytes it moved.
pub(super) fn outcome(
    nics: &[Nic],
    kind: Kind,
    rail: usize,
    req: &mut Request<DataBuf>,
) -> Option<(CompletionKind, usize)> {
    let res = req.poll()?;
    Some(match res {
        Ok(n) if kind == Kind::Recv => {
            let tag = req.sender_tag().unwrap_or(0);
            let split = tag & SPLIT_BIT != 0;
            let mut buf = match req.take_buffer() {
                Some(DataBuf::Owned(b) | DataBuf::After(b, _)) => b,
                Some(DataBuf::Region(_)) | None => Vec::new(),
            };
            buf.truncate(n);
            // A split header ends with its payload's tag; one that does not name a payload tag is
            // handed over whole, for the session to refuse as malformed.
            let named = split.then(|| buf.len().checked_sub(PAYLOAD_TAG_LEN)).flatten().and_then(|at| {
                let t = u64::from_le_bytes(<[u8; PAYLOAD_TAG_LEN]>::try_from(&buf[at..]).ok()?);
                (t & !(PAYLOAD_BIT | PAYLOAD_RANDOM) == 0 && t & PAYLOAD_BIT != 0).then_some((at, t))
            });
            match named {
                Some((at, t)) => {
                    buf.truncate(at);
                    (CompletionKind::Header { header: buf, payload: PayloadId(t) }, n)
                }
                None => (CompletionKind::Received(buf), n),
            }
        }
        Err(e) if kind == Kind::Recv && !nics.get(rail).is_some_and(Nic::is_down) => {
            // A header receive matches a tag, not an endpoint: what failed it may be anyone's
            // message (one longer than any chunk a peer sends, or a rendezvous from a stranger who
            // then went away). Dropped (the session counts it as malformed) and re-posted, never a
            // path failure: a peer's own failures show on its sends, probes and endpoints.
            tracing::debug!(target: NET, rail, error = %e, "a message under a data tag failed to arrive; dropped");
            let mut buf = match req.take_buffer() {
                Some(DataBuf::Owned(b) | DataBuf::After(b, _)) => b,
                Some(DataBuf::Region(_)) | None => Vec::new(),
            };
            buf.clear();
            (CompletionKind::Received(buf), 0)
        }
        Ok(n) if kind == Kind::Payload => match req.take_buffer() {
            Some(DataBuf::Owned(b) | DataBuf::After(b, _)) => (CompletionKind::Received(b), n),
            Some(DataBuf::Region(_)) | None => (CompletionKind::Received(Vec::new()), n),
        },
        Ok(n) if kind == Kind::Placed => (CompletionKind::Placed, n),
        Ok(n) => (CompletionKind::Sent, n),
        Err(e) => {
            let down = nics.get(rail).is_some_and(Nic::is_down);
            tracing::debug!(target: NET, rail, error = %e, "request failed");
            (CompletionKind::Failed(if down { PathFault::LocalNicDown } else { PathFault::Endpoint }), 0)
        }
    })
}
