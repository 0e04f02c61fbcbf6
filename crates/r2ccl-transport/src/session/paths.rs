//! The session's paths: which are usable, choosing one for a lane (its primary, else the
//! first usable backup), path and NIC failures and recoveries, fail-back offers, and the moves
//! and migrations a control plane agrees on. Part of [`Session`]; its state lives there.

#[allow(clippy::wildcard_imports, reason = "the session split by concern: its types are the parent's")]
use super::*;

impl Session {
    pub(super) fn usable(&self, p: PathId) -> bool {
        !self.down_nics.contains(&p.local)
            && !self.down_nics.contains(&p.remote)
            && !self.paths.get(&p).is_some_and(|s| s.down)
    }

    /// The best usable path starting from `primary`: the local NIC then its backup chain, each
    /// first with the peer's NIC on the same rail, then with the peer's NIC and its chain.
    pub(super) fn choose_from(&self, primary: PathId) -> Option<PathId> {
        let locals: Vec<NicId> =
            std::iter::once(primary.local).chain(self.topo.chain(primary.local).iter().copied()).collect();
        let remotes: Vec<NicId> =
            std::iter::once(primary.remote).chain(self.topo.chain(primary.remote).iter().copied()).collect();
        let same_rail = locals.iter().flat_map(|&l| {
            remotes.iter().filter(move |r| r.rail == l.rail).map(move |&r| PathId::new(l, primary.peer, r))
        });
        let any = locals.iter().flat_map(|&l| remotes.iter().map(move |&r| PathId::new(l, primary.peer, r)));
        same_rail.chain(any).find(|&p| self.usable(p))
    }

    /// The path a lane should use now, following its primary's backup chain (`None`: nothing usable).
    pub fn choose_path(&self, lane: LaneId) -> Option<PathId> {
        let l = self.sends.get(&lane.transfer)?.lanes.get(usize::from(lane.lane))?;
        self.choose_from(l.primary)
    }

    /// Posts a zero-byte probe on `path`'s probe endpoint; the answer comes as
    /// [`SessionEvent::ProbeDone`].
    pub fn probe<T: Transport + ?Sized>(
        &mut self,
        now: Duration,
        t: &mut T,
        path: PathId,
    ) -> Result<RequestId, SessionError> {
        let req = t.post_probe(now, path)?;
        self.requests.insert(req, Pending::Probe { path });
        Ok(req)
    }

    /// Marks `path` down (both directions): stops posting on it, cancels its requests and asks
    /// for a migration of every lane on it. Idempotent.
    pub fn handle_path_down<T: Transport + ?Sized>(
        &mut self,
        now: Duration,
        t: &mut T,
        path: PathId,
        fault: PathFault,
    ) {
        let st = self.paths.entry(path).or_insert(PathState::new(now));
        if st.down {
            return;
        }
        st.down = true;
        st.outstanding = 0;
        st.posted_recvs = 0;
        self.stats.path_failures += 1;
        t.cancel_path(now, path);
        // Payload receives stay tracked: each completes (cancelled) once the backend let go of
        // its destination, and a transfer is only complete after that.
        self.requests.retain(|_, p| match p {
            Pending::Send { path: q, .. } | Pending::Recv { path: q } => *q != path,
            Pending::Probe { .. } | Pending::Payload { .. } => true,
        });
        tracing::warn!(target: NET, rank = %self.rank, %path, ?fault, ?now, "path down");
        self.events.push_back(SessionEvent::PathFailed { path, fault });
        for (&key, tr) in &mut self.sends {
            for (i, lane) in tr.lanes.iter_mut().enumerate() {
                if lane.path != path || lane.quiesced {
                    continue;
                }
                lane.quiesced = true;
                lane.in_flight.clear();
                let id = LaneId { transfer: key, lane: u16::try_from(i).unwrap_or(u16::MAX) };
                self.events.push_back(SessionEvent::MigrationNeeded(MigrationRequest {
                    lane: id,
                    from: path,
                    start: lane.start,
                    end: lane.end,
                    sender_done: tr.completed.first_missing(lane.start, lane.end),
                    reason: MoveReason::Failure(fault),
                }));
            }
        }
    }

    /// Clears the down mark of `path` (a probe got through) and offers fail-backs.
    pub fn handle_path_up(&mut self, _now: Duration, path: PathId) {
        if let Some(st) = self.paths.get_mut(&path) {
            if st.down {
                st.down = false;
                self.offer_better();
            }
        }
    }

    /// Marks a NIC (this node's or a peer's) down and fails every path through it.
    pub fn handle_nic_down<T: Transport + ?Sized>(&mut self, now: Duration, t: &mut T, nic: NicId) {
        if !self.down_nics.insert(nic) {
            return;
        }
        let fault = if nic.node == self.node { PathFault::LocalNicDown } else { PathFault::Reported };
        let mut hit: BTreeSet<PathId> =
            self.paths.keys().filter(|p| p.local == nic || p.remote == nic).copied().collect();
        for tr in self.sends.values() {
            hit.extend(tr.lanes.iter().map(|l| l.path).filter(|p| p.local == nic || p.remote == nic));
        }
        for p in hit {
            self.handle_path_down(now, t, p, fault);
        }
    }

    /// Clears the down mark of a NIC and of the paths through it; offers fail-backs.
    pub fn handle_nic_up(&mut self, _now: Duration, nic: NicId) {
        if !self.down_nics.remove(&nic) {
            return;
        }
        for (p, st) in &mut self.paths {
            if p.local == nic || p.remote == nic {
                st.down = false;
            }
        }
        self.offer_better();
    }

    pub(super) fn offer_better(&mut self) {
        let mut offers = Vec::new();
        for (&key, tr) in &self.sends {
            for (i, lane) in tr.lanes.iter().enumerate() {
                let unfinished = lane.next < lane.end || !lane.in_flight.is_empty();
                if lane.quiesced || !unfinished {
                    continue;
                }
                if let Some(p) = self.choose_from(lane.primary) {
                    if p != lane.path && lane.offered != Some(p) {
                        offers.push((key, i, p));
                    }
                }
            }
        }
        for (key, i, path) in offers {
            if let Some(lane) = self.sends.get_mut(&key).and_then(|tr| tr.lanes.get_mut(i)) {
                lane.offered = Some(path);
                let id = LaneId { transfer: key, lane: u16::try_from(i).unwrap_or(u16::MAX) };
                self.events.push_back(SessionEvent::BetterPath { lane: id, path });
            }
        }
    }

    /// Planned move of an active lane (fail-back): cancels its in-flight chunks, quiesces it and
    /// emits [`SessionEvent::MigrationNeeded`] with [`MoveReason::Failback`].
    pub fn handle_move<T: Transport + ?Sized>(
        &mut self,
        now: Duration,
        t: &mut T,
        lane: LaneId,
    ) -> Result<(), SessionError> {
        let tr = self.sends.get_mut(&lane.transfer).ok_or(SessionError::UnknownLane(lane))?;
        let l = tr.lanes.get_mut(usize::from(lane.lane)).ok_or(SessionError::UnknownLane(lane))?;
        if l.quiesced {
            return Err(SessionError::LaneNotActive(lane));
        }
        for (_, req) in std::mem::take(&mut l.in_flight) {
            // A request that already finished cannot be cancelled; its completion is then stale.
            let _ = t.cancel(now, req);
            if self.requests.remove(&req).is_some() {
                if let Some(st) = self.paths.get_mut(&l.path) {
                    st.outstanding = st.outstanding.saturating_sub(1);
                }
            }
        }
        l.quiesced = true;
        self.events.push_back(SessionEvent::MigrationNeeded(MigrationRequest {
            lane,
            from: l.path,
            start: l.start,
            end: l.end,
            sender_done: tr.completed.first_missing(l.start, l.end),
            reason: MoveReason::Failback,
        }));
        Ok(())
    }

    /// Sender side of a migration: resume quiesced `lane` on `path`, replaying from `boundary`
    /// (the agreed min of the sender's completed prefix and what the receiver holds).
    pub fn handle_migrate(
        &mut self,
        now: Duration,
        lane: LaneId,
        path: PathId,
        boundary: u32,
    ) -> Result<(), SessionError> {
        self.check_path(path, lane.transfer.dst)?;
        if !self.usable(path) {
            return Err(SessionError::PathDown(path));
        }
        let tr = self.sends.get_mut(&lane.transfer).ok_or(SessionError::UnknownLane(lane))?;
        let l = tr.lanes.get_mut(usize::from(lane.lane)).ok_or(SessionError::UnknownLane(lane))?;
        if !l.quiesced {
            return Err(SessionError::LaneNotQuiesced(lane));
        }
        let sender_done = tr.completed.first_missing(l.start, l.end);
        if boundary < l.start || boundary > sender_done {
            return Err(SessionError::BoundaryAhead { lane, boundary, sender_done });
        }
        tr.completed.remove_range(boundary, l.end);
        l.replay_until = l.replay_until.max(l.next);
        l.next = boundary;
        let from = l.path;
        l.path = path;
        l.quiesced = false;
        l.offered = None;
        l.migrations += 1;
        self.stats.migrations += 1;
        if path == l.primary {
            self.stats.failbacks += 1;
        }
        self.paths.entry(path).or_insert(PathState::new(now));
        tracing::info!(target: NET, %lane, %from, to = %path, boundary, sender_done, ?now, "lane migrated");
        Ok(())
    }

    /// Receiver side of a migration: checks that `boundary` is not ahead of what this rank holds
    /// of `start..end` of `key`, and listens on `path` (this rank's view of the new path).
    pub fn handle_peer_migrate(
        &mut self,
        now: Duration,
        key: TransferKey,
        start: u32,
        end: u32,
        path: PathId,
        boundary: u32,
    ) -> Result<(), SessionError> {
        self.check_path(path, key.src)?;
        let held = self.held(key, start, end)?;
        if boundary > held {
            return Err(SessionError::BoundaryAheadOfReceiver { key, boundary, held });
        }
        if !self.down_nics.contains(&path.local) {
            let st = self.paths.entry(path).or_insert(PathState::new(now));
            st.listen = true;
            st.down = false;
        }
        Ok(())
    }

    pub(super) fn check_path(&self, path: PathId, peer: Rank) -> Result<(), SessionError> {
        let ok = path.peer == peer
            && path.local.node == self.node
            && self.topo.has_nic(path.local)
            && self.topo.has_nic(path.remote)
            && self.topo.node_of(peer) == Some(path.remote.node);
        if ok {
            Ok(())
        } else {
            Err(SessionError::ForeignPath { path })
        }
    }
}
