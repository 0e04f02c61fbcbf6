//! The progress loop: requests from callers, OOB events, health-view agreement, planning and
//! the engine, until the communicator is left.

use super::*;

impl Progress {
    pub(super) fn now(&self) -> Duration {
        self.start.elapsed()
    }

    pub(super) fn note(&self, text: String) {
        tracing::info!(target: subsys::NET, rank = self.rank, "{text}");
        if let Ok(mut e) = self.shared.events.lock() {
            e.push(CommEvent { at_ms: self.start.elapsed().as_millis() as u64, text });
        }
    }

    pub(super) fn set_broken(&mut self, e: CommError) {
        if self.broken.is_none() {
            tracing::error!(target: subsys::COLL, rank = self.rank, error = %e, "communicator broken");
            if let Ok(mut slot) = self.shared.error.lock() {
                *slot = Some(e.clone());
            }
            self.broken = Some(e);
        }
    }

    pub(super) fn fail(&mut self, current: &mut Option<Current>, e: CommError) {
        if let Some(c) = current.take() {
            let waiting = self.engine.waiting();
            if !waiting.is_empty() {
                tracing::warn!(target: subsys::COLL, rank = self.rank, seq = c.seq, error = %e, waiting = %waiting.join("; "), "collective abandoned");
            }
            let now = self.now();
            self.engine.abandon(now, &mut self.transport);
            // A failure only this rank saw must not leave the others waiting for their deadline.
            if e.is_local_failure() {
                self.broadcast(&Msg::Abort { reason: e.to_string() });
                self.set_broken(CommError::Aborted(format!("rank {}: {e}", self.rank)));
            }
            let _ = c.reply.send(Err(e));
        }
    }

    /// This rank's view for the next agreement: the agreed one with every NIC the engine knows
    /// to be down failed, and every failed NIC it no longer knows to be down healthy again (its
    /// link came back, or a blamed NIC answers probes), so a recovered NIC is planned with again
    /// once every rank has seen it come back (the merge is a union of failures).
    pub(super) fn local_view(&self) -> HealthView {
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

    pub(super) fn run(mut self, rx: &Receiver<Req>) {
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
            // A mismatch reported for a later collective ends the communicator once the current
            // one is over (its peers finished it: they were at the later one), or after a grace.
            // A digest mismatch the peer did not answer in time: what this rank knows, to all.
            if let Some((seq, _, until)) = &self.mismatch_fallback {
                if self.broken.is_some() {
                    self.mismatch_fallback = None;
                } else if Instant::now() >= *until {
                    let (seq, text) = (*seq, self.mismatch_fallback.take().map(|f| f.1).unwrap_or_default());
                    self.broadcast_mismatch(seq, &text);
                    self.deferred_break = Some((CommError::Mismatch { seq, detail: text }, Instant::now()));
                }
            }
            if let Some((e, until)) = &self.deferred_break {
                if current.is_none() || Instant::now() >= *until {
                    let e = e.clone();
                    self.deferred_break = None;
                    self.set_broken(e.clone());
                    self.fail(&mut current, e);
                }
            }
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
                    self.broadcast(&Msg::Abort { reason: reason.clone() });
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
                            self.broadcast(&Msg::Abort { reason: e.to_string() });
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
                match current.as_ref().map(|c| c.seq) {
                    Some(seq) => self.fail(&mut current, CommError::from_engine(seq, &e)),
                    // Between collectives, a send lingering past its collective (engine/linger.rs)
                    // that can no longer reach its peer: the peer, still in that collective, waits
                    // for those bytes, so everyone is told. Anything else is logged, as before.
                    None if self.broken.is_none() => {
                        let undeliverable = matches!(
                            e,
                            crate::engine::EngineError::NoPathLeft { .. }
                                | crate::engine::EngineError::NoCommonRail { .. }
                                | crate::engine::EngineError::NodeIsolated(_)
                        );
                        if undeliverable && self.engine.lingering() > 0 {
                            let e = CommError::from_engine(self.last_done, &e);
                            self.broadcast(&Msg::Abort { reason: format!("rank {}: {e}", self.rank) });
                            self.set_broken(CommError::Aborted(format!("rank {}: {e}", self.rank)));
                        } else {
                            tracing::debug!(target: subsys::COLL, rank = self.rank, error = %e, "engine error between collectives");
                        }
                    }
                    None => {}
                }
            }
            self.flush_engine();
            self.count_strangers();
            self.send_late_arg_check(current.as_ref().map(|c| c.seq));
            self.drive_switch();
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
                        self.metrics.collective(c.name, c.strategy.name(), secs, c.bytes, c.bus_factor);
                        self.export_nic_bytes();
                        self.export_oob_messages();
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
                        // Every timer of an idle communicator: the engine's (heartbeats and
                        // probes of idle paths, resends), the health switch's resends, and a
                        // silent OOB peer's deadline.
                        let now = self.now();
                        let timers = [self.engine.poll_timeout(), self.switch.poll_timeout()];
                        let next = timers.into_iter().flatten().min().map_or(QUIET_WAIT, |t| t.saturating_sub(now));
                        let silence = self.mesh.silence_deadline().map(|d| d.saturating_duration_since(Instant::now()));
                        next.min(silence.unwrap_or(QUIET_WAIT)).clamp(IDLE_WAIT, QUIET_WAIT)
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

    /// What two ranks called, for a mismatch error: `from` called `theirs`, this rank `mine`.
    pub(super) fn mismatch_text(&self, seq: u64, from: u32, theirs: &str, mine: &str) -> String {
        format!("collective #{seq}: rank {from} called {theirs}, rank {} called {mine}", self.rank)
    }

    /// Answer every queued call: the communicator is going away.
    pub(super) fn fail_queued(&mut self, queue: &mut std::collections::VecDeque<(Instant, Req)>) {
        for (_, req) in queue.drain(..) {
            if let Req::Coll { reply, .. } = req {
                let _ = reply.send(Err(CommError::Aborted("communicator destroyed".into())));
            }
        }
    }

    /// Leave: tell every peer, then (when `linger`) keep serving them (acknowledgements of
    /// their last transfers) until each has left too or the peer timeout passes. Returns the
    /// ranks that had not left.
    pub(super) fn depart(&mut self, current: &mut Option<Current>, linger: bool) -> Vec<u32> {
        self.fail(current, CommError::Aborted("communicator destroyed".into()));
        // No connection of ours may still be on its way to a peer that hears our goodbye and
        // destroys its listeners (see `UcxTransport::leave`).
        // Bounded: a black-holed path never settles. Leaving at once (`destroy`) waits less.
        let settle = Duration::from_millis(self.cfg.bootstrap.peer_timeout_ms.min(if linger { 2000 } else { 200 }));
        // Receipts held back (small transfers, engine/linger.rs) go first; then, leaving
        // gracefully, this rank's own small sends that ended their collective unconfirmed get
        // their receipts (or are replayed) while every path still works, within `settle`.
        let now = self.now();
        self.engine.flush_receipts(now);
        self.flush_engine();
        let until = Instant::now() + settle;
        while linger && self.broken.is_none() && self.engine.lingering() > 0 && Instant::now() < until {
            self.serve_peers(current);
        }
        self.transport.leave(settle);
        self.broadcast(&Msg::Depart { last_done: self.last_done });
        self.departed.insert(self.rank);
        for &peer in self.departed.iter().filter(|&&r| r != self.rank) {
            self.transport.forget_peer(Rank(peer));
        }
        let deadline = Instant::now() + Duration::from_millis(self.cfg.bootstrap.peer_timeout_ms);
        while linger && (self.departed.len() as u32) < self.world && Instant::now() < deadline {
            self.serve_peers(current);
        }
        self.transport.drain_settles();
        (0..self.world).filter(|r| !self.departed.contains(r)).collect()
    }

    /// One round of serving peers while leaving: OOB messages for up to 1 ms, then the engine
    /// (receipts, replays) and its outbox.
    fn serve_peers(&mut self, current: &mut Option<Current>) {
        while let Some(ev) = self.mesh.recv_deadline(Instant::now() + Duration::from_millis(1)) {
            self.on_oob(ev, current);
        }
        let now = self.now();
        let _ = self.engine.drive(now, &mut self.transport);
        self.flush_engine();
    }

    /// Why the next collective (queued at `queued`) can never start, if it cannot: a rank whose
    /// health view it still needs has left the communicator, or the views did not all arrive
    /// within the collective deadline.
    pub(super) fn unstartable(&self, queued: Instant, req: &Req) -> Option<CommError> {
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
        let (round, missing) = self.switch.waiting_for()?;
        if let Some(&rank) = missing.iter().find(|r| self.departed.contains(r)) {
            let why = format!("it left the communicator during health round {round}, before collective #{next}");
            return Some(CommError::PeerLost { rank: Rank(rank), why });
        }
        if self.rank != LEADER && self.departed.contains(&LEADER) {
            let why = format!("it coordinates health round {round} and left the communicator");
            return Some(CommError::PeerLost { rank: Rank(LEADER), why });
        }
        let waited = queued.elapsed();
        (waited > self.coll_deadline()).then(|| CommError::Timeout {
            seq: next,
            waited_ms: waited.as_millis() as u64,
            waiting: if missing.is_empty() {
                format!("rank {LEADER}'s decision on health round {round}")
            } else {
                format!("the health views of rank(s) {missing:?} for round {round}")
            },
        })
    }

    /// How long one collective may take (from its start, or from its request while it waits
    /// for the previous round's views).
    pub(super) fn coll_deadline(&self) -> Duration {
        Duration::from_millis(self.cfg.bootstrap.peer_timeout_ms.max(1000) * 12)
    }

    /// Whether the next collective may be planned (no health round this rank joined is open).
    pub(super) fn ready_to_plan(&mut self, is_coll: bool) -> bool {
        !is_coll || self.switch.may_start()
    }

    /// This rank's description of collective `seq` as it concerns `peer`, if still kept.
    fn my_arg_text(&self, seq: u64, peer: u32) -> Option<String> {
        let (_, texts) = self.arg_texts.iter().find(|(s, _)| *s == seq)?;
        texts.iter().find(|(q, _)| *q == peer || *q == u32::MAX).map(|(_, d)| d.clone())
    }

    /// Sends this rank's argument descriptions for the current collective once it has run for
    /// [`ARG_CHECK_AFTER`] (see where they are made); forgets them once it is over.
    fn send_late_arg_check(&mut self, current: Option<u64>) {
        let Some((seq, at, _)) = &self.arg_check else { return };
        if current != Some(*seq) {
            self.arg_check = None;
        } else if Instant::now() >= *at {
            for (to, desc) in self.arg_check.take().map(|(_, _, sends)| sends).unwrap_or_default() {
                let (channel, payload) = Msg::ArgCheck { seq: current.unwrap_or(0), desc }.encode();
                let _ = self.mesh.send(to, channel, &payload);
            }
        }
    }

    /// Counts what the transport kept out since the last call: messages no receive would ever
    /// take, dropped from UCX's queues, and connections without this communicator's endpoint id.
    fn count_strangers(&mut self) {
        let swept = self.transport.sweep_stats().dropped;
        if swept > self.swept_seen {
            crate::metrics::count_malformed("unmatched", swept - self.swept_seen);
            self.swept_seen = swept;
        }
        let strangers = self.transport.strangers_rejected();
        if strangers > self.strangers_seen {
            crate::metrics::count_malformed("ucx_connect", strangers - self.strangers_seen);
            self.strangers_seen = strangers;
        }
    }

    /// Give the switch protocol this rank's view when the engine's down NICs changed, repeat what
    /// is unanswered, and send what it has to send.
    pub(super) fn drive_switch(&mut self) {
        let now = self.now();
        if *self.engine.down_nics() != self.fed_down {
            self.fed_down = self.engine.down_nics().clone();
            let local = self.local_view();
            self.switch.handle_local(now, local);
        }
        self.switch.handle_timeout(now);
        while let Some((to, msg)) = self.switch.poll_transmit() {
            let (channel, payload) = Msg::Switch(msg).encode();
            let _ = self.mesh.send(to, channel, &payload);
        }
    }

    pub(super) fn start_coll(&mut self, call: Call, deadline: Instant, reply: Sender<Reply>) -> Option<Current> {
        let Call { work, dtype, count, bufs, access } = call;
        let work = &work;
        self.seq += 1;
        let seq = self.seq;
        // Adopt the view decided for this collective, if one takes effect here.
        if let Some(mut v) = self.switch.start(seq) {
            let changed = v.failed_nics() != self.agreed.failed_nics() || v.nodes() != self.agreed.nodes();
            if changed {
                v.set_epoch(self.agreed.epoch().next());
                self.metrics.epoch(v.epoch().0, true);
                self.export_nic_capacity(&v);
                for nic in v.failed_nics() {
                    self.export_nic_up(nic, false);
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
        // Argument check: a collective with the ring neighbours (each rank sends its call to the
        // next and compares with the previous); a group with every other rank (the operations
        // between two ranks must mirror each other, so both describe the pair the same way).
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
        // The digests of these descriptions go in every chunk header, and the session checks
        // them as chunks arrive: no message of its own. The descriptions themselves go to the
        // peers only if the collective is still running ARG_CHECK_AFTER from now, which finds a
        // mismatch where no chunk crosses (each rank waiting for another).
        if !sends.is_empty() {
            let digest = match work {
                Work::Coll(_) => ArgDigest::Same(args_digest(&sends[0].1)),
                Work::Group(_) => ArgDigest::PerPeer(expects.iter().map(|(q, d)| (Rank(*q), args_digest(d))).collect()),
            };
            self.engine.set_args(seq, digest);
            let texts = match work {
                Work::Coll(_) => vec![(u32::MAX, sends[0].1.clone())],
                Work::Group(_) => expects.clone(),
            };
            if self.arg_texts.len() >= DESCS_KEPT as usize {
                self.arg_texts.pop_front();
            }
            self.arg_texts.push_back((seq, texts));
        }
        self.arg_check = (!sends.is_empty()).then(|| (seq, Instant::now() + ARG_CHECK_AFTER, sends));
        self.descs.retain(|&(s, _), _| s.saturating_add(DESCS_KEPT) > seq);
        let mut mismatch = None;
        for (from, desc) in expects {
            match self.peer_descs.remove(&(seq, from)) {
                Some(theirs) if theirs != desc => {
                    mismatch.get_or_insert_with(|| self.mismatch_text(seq, from, &theirs, &desc));
                }
                Some(_) => {}
                None => {
                    self.descs.insert((seq, from), desc);
                }
            }
        }
        // Descriptions other peers sent ahead for this collective (one that saw a digest
        // mismatch sends its own to the sender) are compared now; older ones are dropped.
        let ahead: Vec<(u32, String)> =
            self.peer_descs.range((seq, 0)..=(seq, u32::MAX)).map(|(&(_, q), d)| (q, d.clone())).collect();
        self.peer_descs.retain(|&(s, _), _| s > seq);
        for (from, theirs) in ahead {
            if let Some(mine) = self.my_arg_text(seq, from).filter(|mine| *mine != theirs) {
                mismatch.get_or_insert_with(|| self.mismatch_text(seq, from, &theirs, &mine));
            }
        }
        if let Some(text) = mismatch {
            self.broadcast_mismatch(seq, &text);
            let _ = reply.send(Err(CommError::Mismatch { seq, detail: text.clone() }));
            self.set_broken(CommError::Mismatch { seq, detail: text });
            return None;
        }
        let failed = |seq: u64, e: PlannerError| match e {
            PlannerError::Build(e) => CommError::Invalid(e.to_string()),
            e @ PlannerError::Plan(_) => CommError::Failed { seq, why: e.to_string() },
        };
        let plan = match work {
            Work::Coll(coll) => self.planner.collective(&self.agreed, *coll, dtype, count).inspect(|p| {
                if p.bridged {
                    tracing::info!(target: subsys::COLL, seq, "no usable rail in common between two nodes: planned with their failed NICs, which the engine steers around");
                }
                if let Choice::Planned(strategy) = p.choice {
                    tracing::debug!(target: subsys::COLL, seq, strategy = strategy.name(), chunks = p.chunks,
                        predicted_s = p.predicted_s, lower_bound_s = p.lower_bound_s, "planned");
                }
            }),
            Work::Group(ops) => self.planner.group(&self.agreed, dtype, ops),
        }
        .map(|p| (p.schedule, p.choice))
        .map_err(|e| failed(seq, e));
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
            Bufs::Registered { input, output, .. } => Some(((input.0, 0), input.1, (output.0, 0), output.1)),
            Bufs::RegisteredInPlace { buf, len, .. } => {
                let (i_at, o_at) = in_place_offsets(in_len, out_len, self.rank);
                Some(((buf, i_at), len.saturating_sub(i_at), (buf, o_at), len.saturating_sub(o_at)))
            }
            // The engine checks that each buffer fits its region from there.
            Bufs::RegisteredAt { input, output } => Some((input, in_len, output, out_len)),
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
            return Some(self.current(seq, reply, (None, None, true), (in_len, out_len, work), strategy, deadline));
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
                    Bufs::Registered { .. } | Bufs::RegisteredInPlace { .. } | Bufs::RegisteredAt { .. } => {
                        String::new()
                    }
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
        Some(self.current(seq, reply, (borrowed, access, false), (in_len, out_len, work), strategy, deadline))
    }

    /// The record of collective `seq`, started now.
    /// `memory`: the borrowed output, its guard, and whether the call runs on registered memory;
    /// `sizes`: the input's and the output's length, and what the call does.
    pub(super) fn current(
        &self,
        seq: u64,
        reply: Sender<Reply>,
        memory: (Option<(*mut u8, usize)>, Option<Access>, bool),
        sizes: (usize, usize, &Work),
        strategy: Schedule,
        deadline: Instant,
    ) -> Current {
        let started = Instant::now();
        let (borrowed, access, registered) = memory;
        let (in_len, out_len, work) = sizes;
        let bus_factor = match work {
            Work::Coll(c) => c.bus_factor(self.world),
            Work::Group(_) => 1.0,
        };
        Current {
            seq,
            reply,
            borrowed,
            access,
            registered,
            out_len,
            name: work.name(),
            bytes: in_len.max(out_len) as u64,
            bus_factor,
            strategy,
            epoch: self.agreed.epoch().0,
            started,
            deadline: deadline.min(started + self.coll_deadline()),
        }
    }

    /// Register a region for a [`CommBuf`]: its handle, first byte and mapping.
    pub(super) fn register_for_caller(&mut self, len: usize) -> Result<Registered, CommError> {
        let failed = |e: String| CommError::Invalid(format!("registering {len} bytes: {e}"));
        let h = self.transport.register(len.max(1)).map_err(|e| failed(e.to_string()))?;
        let ptr = self.transport.region_mut(h).map_err(|e| failed(e.to_string()))?.as_mut_ptr() as usize;
        let region = self.transport.region_arc(h).ok_or_else(|| failed("no mapping".into()))?;
        Ok((h, ptr, region))
    }

    pub(super) fn broadcast_mismatch(&self, seq: u64, text: &str) {
        self.broadcast(&Msg::Mismatch { seq, detail: text.to_owned() });
    }

    /// Send `msg` to every other rank.
    pub(super) fn broadcast(&self, msg: &Msg) {
        let (channel, payload) = msg.encode();
        self.mesh.broadcast(channel, &payload);
    }

    pub(super) fn on_oob(&mut self, ev: OobEvent, current: &mut Option<Current>) {
        match ev {
            OobEvent::Message { from, channel, payload } => match Msg::from_frame(channel, payload) {
                Ok(msg) => self.on_msg(from, msg, current),
                Err(e) => {
                    crate::metrics::count_malformed("oob", 1);
                    tracing::warn!(target: subsys::BOOTSTRAP, from, %e, "refused an OOB message");
                    // An abort that cannot be read still ends the communicator (the mesh is
                    // authenticated: only a rank of the job sent it).
                    if channel == crate::oob::Channel::Abort {
                        let e = CommError::Aborted(format!("rank {from} aborted"));
                        self.set_broken(e.clone());
                        self.fail(current, e);
                    }
                }
            },
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

    /// One decoded OOB message from rank `from`.
    fn on_msg(&mut self, from: u32, msg: Msg, current: &mut Option<Current>) {
        match msg {
            Msg::Engine(frame) => {
                let now = self.now();
                if let Err(e) = self.engine.handle_ctrl(now, &mut self.transport, Rank(from), &frame) {
                    let seq = current.as_ref().map_or(0, |c| c.seq);
                    self.fail(current, CommError::from_engine(seq, &e));
                }
            }
            Msg::Switch(m) => {
                let now = self.now();
                if let Err(e) = self.switch.handle_msg(now, from, m) {
                    crate::metrics::count_malformed("oob", 1);
                    tracing::warn!(target: subsys::BOOTSTRAP, from, %e, "refused a health-switch message");
                }
                self.drive_switch();
            }
            Msg::ArgCheck { seq, desc: theirs } => {
                match self.descs.remove(&(seq, from)).or_else(|| self.my_arg_text(seq, from)) {
                    Some(mine) if mine != theirs => {
                        let text = self.mismatch_text(seq, from, &theirs, &mine);
                        if self.broken.is_none() {
                            self.broadcast_mismatch(seq, &text);
                        }
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
            Msg::Address(_) => {
                // Addresses are exchanged once, at setup.
                crate::metrics::count_malformed("oob", 1);
            }
            Msg::Depart { last_done } => {
                self.departed.insert(from);
                // Both sides are leaving: nothing more crosses the data paths between them.
                if self.departed.contains(&self.rank) {
                    self.transport.forget_peer(Rank(from));
                }
                self.departed_after.insert(from, last_done);
                // Its receipts of this rank's lingering sends will not come: it left.
                let now = self.now();
                if let Err(e) = self.engine.peer_left(now, Rank(from), last_done) {
                    tracing::warn!(target: subsys::COLL, rank = %self.rank, peer = from, error = %e, "releasing sends to a rank that left");
                }
            }
            Msg::Mismatch { seq, detail } => {
                let e = CommError::Mismatch { seq, detail };
                // Ranks that found a mismatch at collective N had finished every collective before
                // N; this rank's current one, if earlier, completes with what they sent: it ends
                // with its own result, and the mismatch ends the communicator right after (no new
                // collective starts in between), so a rank a little behind does not see an
                // earlier call fail for a later one's arguments.
                if current.as_ref().is_some_and(|c| c.seq < seq) && self.broken.is_none() {
                    let grace = Duration::from_millis(self.cfg.bootstrap.peer_timeout_ms.min(2000));
                    self.deferred_break.get_or_insert((e, Instant::now() + grace));
                    return;
                }
                self.set_broken(e.clone());
                self.fail(current, e);
            }
            Msg::Abort { reason } => {
                let e = CommError::Aborted(format!("rank {from}: {reason}"));
                self.set_broken(e.clone());
                self.fail(current, e);
            }
            Msg::Heartbeat => {}
        }
    }

    pub(super) fn flush_engine(&mut self) {
        // Frames to one peer leave in one write, in order (receipts add up to hundreds per
        // collective). A failed send shows up as PeerLost from the mesh.
        let mut batch: BTreeMap<u32, Vec<Vec<u8>>> = BTreeMap::new();
        while let Some((to, bytes)) = self.engine.poll_outbox() {
            batch.entry(to.0).or_default().push(bytes);
        }
        // Each frame is a `Msg::Engine` payload as it stands: its encoding is the frame itself.
        for (to, frames) in batch {
            let _ = self.mesh.send_many(to, crate::oob::Channel::Detect, &frames);
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
                    self.metrics.failover(
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
                    self.export_nic_up(nic, up);
                    self.note(format!(
                        "NIC {nic} {} ({})",
                        if up { "up" } else { "down" },
                        if local { "local link state" } else { "reported by its node" }
                    ));
                }
                EngineEvent::NicBlamed { nic, up } => {
                    self.export_nic_up(nic, up);
                    self.note(if up {
                        format!("NIC {nic} back on every rank (answers probes again after its hold-down)")
                    } else {
                        format!("NIC {nic} taken out on every rank (a localization verdict blamed it)")
                    });
                }
                EngineEvent::PathRecovered { path } => self.note(format!("path {path} answers probes again")),
                EngineEvent::Localized { path, verdict, method, .. } => {
                    self.metrics.verdict(verdict_label(verdict), method_label(method));
                    self.note(format!("path {path} failed: verdict {verdict} ({method:?})"));
                }
                // Once per communicator: every refused chunk of the collective reports it again.
                EngineEvent::ArgsDiffer { .. }
                    if self.broken.is_some() || self.deferred_break.is_some() || self.mismatch_fallback.is_some() => {}
                EngineEvent::ArgsDiffer { seq, from } => {
                    // The digest says only that the arguments differ: this rank's description
                    // goes to the peer, which compares it with its own and names both to every
                    // rank. Should no such word come, this rank tells every rank what it knows.
                    let mine = self.my_arg_text(seq, from.0);
                    if let Some(desc) = mine.clone() {
                        let (channel, payload) = Msg::ArgCheck { seq, desc }.encode();
                        let _ = self.mesh.send(from.0, channel, &payload);
                    }
                    let text = format!(
                        "collective #{seq}: rank {} called it with other arguments than rank {}{}",
                        from.0,
                        self.rank,
                        mine.map(|d| format!(", which called {d}")).unwrap_or_default()
                    );
                    let grace = Duration::from_millis(self.cfg.bootstrap.peer_timeout_ms.min(1000));
                    self.mismatch_fallback = Some((seq, text, Instant::now() + grace));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn the_descriptor_limit_is_raised_only_when_short_and_never_past_the_hard_one() {
        use super::super::setup::{nofile_needed, nofile_target};
        assert_eq!(nofile_needed(4, 2), 3 + 24 + 256);
        // The default 1,024 soft limit falls short from 87 ranks with 2 NICs.
        assert!(nofile_needed(86, 2) <= 1024 && nofile_needed(87, 2) > 1024);
        assert_eq!(nofile_target(1024, 1 << 20, 500), None, "enough already");
        assert_eq!(nofile_target(1024, 1 << 20, 5000), Some(5000));
        assert_eq!(nofile_target(1024, 4096, 5000), Some(4096), "up to the hard limit");
        assert_eq!(nofile_target(4096, 4096, 5000), None, "nothing to raise");
    }

    #[test]
    pub(super) fn nic_blobs_round_trip_and_malformed_ones_are_refused() {
        let facts = vec![NicFacts { mbps: 100, numa: Some(1) }, NicFacts { mbps: 25_000, numa: None }];
        let blob = nic_blob(&facts);
        assert_eq!(blob_facts(&blob), Some(facts));
        assert_eq!(blob_facts(&blob[..blob.len() - 1]), None, "truncated");
        assert_eq!(blob_facts(&[blob.as_slice(), &[0]].concat()), None, "trailing byte");
        assert_eq!(blob_facts(&u32::MAX.to_le_bytes()), None, "a count the bytes do not hold");
        assert_eq!(blob_facts(&nic_blob(&[])), Some(Vec::new()));
    }

    #[test]
    pub(super) fn backup_chains_take_the_same_numa_node_first_then_rail_order() {
        let numa = [Some(0), Some(0), Some(1), Some(1)];
        let facts = vec![numa.map(|numa| NicFacts { mbps: 100, numa }).to_vec(), Vec::new()];
        let nics: Vec<String> = ["lo"; 4].map(String::from).to_vec();
        let cluster = communicator_cluster(&["a", "b"], &[0, 1], &nics, &facts).unwrap();
        let topo = Topology::try_from(&cluster).unwrap();
        let rails = |node: u32, rail: u16| -> Vec<u16> {
            topo.chain(NicId::new(node, rail)).iter().map(|n| n.rail.0).collect()
        };
        assert_eq!(rails(0, 0), [1, 2, 3]);
        assert_eq!(rails(0, 1), [0, 2, 3]);
        assert_eq!(rails(0, 2), [3, 0, 1]);
        assert_eq!(rails(0, 3), [2, 0, 1]);
        // Unknown NUMA nodes: rail order after the NIC.
        assert_eq!(rails(1, 2), [3, 0, 1]);
        // Rates a node did not announce are the default; the health view starts at them.
        let view = cluster.health_view();
        assert_eq!(view.node(NodeId(0)).unwrap().nics[0].nominal_mbps, 100);
        assert_eq!(view.node(NodeId(1)).unwrap().nics[3].nominal_mbps, NIC_MBPS);
    }

    #[test]
    pub(super) fn topo_file_names_this_nodes_nics_rates_and_numa_nodes() {
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
    pub(super) fn every_valid_detect_section_gives_the_detector_a_valid_configuration() {
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
}
