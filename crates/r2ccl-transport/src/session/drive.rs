//! The session's progress: the backend's events and completions, headers and payloads as they
//! arrive (checked, placed, applied or reduced exactly once), and posting sends within each
//! lane's window and receives on listened paths. Part of [`Session`]; its state lives there.

#[allow(clippy::wildcard_imports, reason = "the session split by concern: its types are the parent's")]
use super::*;

impl Session {
    /// Makes progress: lets the backend run, handles its events, posts sends within each lane's
    /// window and keeps receives posted on listened paths.
    pub fn drive<T: Transport + ?Sized>(&mut self, now: Duration, t: &mut T) {
        t.progress(now);
        while let Some(ev) = t.poll_event() {
            self.on_transport_event(now, t, ev);
        }
        self.post_work(now, t);
    }

    pub(super) fn on_transport_event<T: Transport + ?Sized>(&mut self, now: Duration, t: &mut T, ev: TransportEvent) {
        match ev {
            TransportEvent::Completion(c) => self.on_completion(now, t, c),
            TransportEvent::PathError { path, fault } => self.handle_path_down(now, t, path, fault),
            TransportEvent::LinkState { nic, up } => {
                if nic.node == self.node {
                    self.events.push_back(SessionEvent::LocalNic { nic, up });
                }
                if up {
                    self.handle_nic_up(now, nic);
                } else {
                    self.handle_nic_down(now, t, nic);
                }
            }
            TransportEvent::Unsolicited { path, kind } => match kind {
                CompletionKind::Received(bytes) => self.on_message(now, t, path, bytes),
                CompletionKind::Header { header, payload } => self.on_header(now, t, path, header, payload),
                _ => {}
            },
        }
    }

    pub(super) fn on_completion<T: Transport + ?Sized>(&mut self, now: Duration, t: &mut T, c: Completion) {
        let Some(p) = self.requests.remove(&c.req) else {
            if c.kind != CompletionKind::Cancelled {
                self.stats.stale_completions += 1;
            }
            return;
        };
        match p {
            Pending::Send { lane, chunk, path } => {
                if let Some(st) = self.paths.get_mut(&path) {
                    st.outstanding = st.outstanding.saturating_sub(1);
                    st.since = now;
                }
                if let Some(tr) = self.sends.get_mut(&lane.transfer) {
                    if let Some(l) = tr.lanes.get_mut(usize::from(lane.lane)) {
                        l.in_flight.remove(&chunk);
                    }
                    if c.kind == CompletionKind::Sent {
                        if tr.completed.insert(chunk) {
                            self.stats.chunks_sent += 1;
                        }
                        if tr.completed.is_full() && !tr.reported {
                            tr.reported = true;
                            self.events.push_back(SessionEvent::SendComplete(lane.transfer));
                        }
                    }
                }
                if let CompletionKind::Failed(f) = c.kind {
                    self.handle_path_down(now, t, path, f);
                }
            }
            Pending::Recv { path } => {
                if let Some(st) = self.paths.get_mut(&path) {
                    st.posted_recvs = st.posted_recvs.saturating_sub(1);
                }
                match c.kind {
                    CompletionKind::Received(bytes) => self.on_message(now, t, path, bytes),
                    CompletionKind::Header { header, payload } => self.on_header(now, t, path, header, payload),
                    CompletionKind::Failed(f) => self.handle_path_down(now, t, path, f),
                    _ => {}
                }
            }
            Pending::Payload { path, dest } => self.on_payload(now, t, c.req, path, dest, c.kind),
            Pending::Probe { path } => {
                let ok = c.kind == CompletionKind::ProbeOk;
                self.events.push_back(SessionEvent::ProbeDone { req: c.req, path, ok });
            }
        }
    }

    pub(super) fn bad(&mut self, path: PathId, problem: ChunkProblem) {
        // Debug only: the event carries it up, and a stranger's flood must not flood the log.
        tracing::debug!(target: NET, rank = %self.rank, %path, ?problem, "chunk refused");
        self.events.push_back(SessionEvent::BadChunk { path, problem });
    }

    /// A received message: applied, stashed (kept whole) or refused; its buffer goes back to `t`
    /// unless stashed.
    pub(super) fn on_message<T: Transport + ?Sized>(
        &mut self,
        now: Duration,
        t: &mut T,
        path: PathId,
        message: Vec<u8>,
    ) {
        if let Some(keep) = self.take_message(now, t, path, &message, message.capacity()) {
            self.early.entry(keep.0).or_default().push((path, keep.1, message));
        } else {
            t.recycle(message);
        }
    }

    /// Apply or refuse `bytes`; `Some` when the message must be stashed as an early chunk.
    pub(super) fn take_message<T: Transport + ?Sized>(
        &mut self,
        now: Duration,
        t: &mut T,
        path: PathId,
        bytes: &[u8],
        capacity: usize,
    ) -> Option<(TransferKey, ChunkHeader)> {
        let (h, payload) = match ChunkHeader::decode(bytes, &self.mac) {
            Ok(x) => x,
            Err(e) => {
                self.stats.malformed += 1;
                self.bad(path, ChunkProblem::Malformed(e));
                return None;
            }
        };
        let key = h.transfer();
        if key.dst != self.rank || key.src != path.peer {
            self.stats.misrouted += 1;
            self.bad(path, ChunkProblem::Misrouted { src: key.src, dst: key.dst });
            return None;
        }
        if !self.comms.contains(&key.comm) {
            self.stats.unknown_collective += 1;
            self.bad(path, ChunkProblem::UnknownCollective(key.comm));
            return None;
        }
        self.note_peer_seq(path, key);
        if !self.args_agree(path, &h) {
            return None;
        }
        if self.recvs.contains_key(&key) {
            self.apply(now, t, path, &h, payload);
            return None;
        }
        if self.retired_set.contains(&key) {
            self.stats.duplicates += 1;
            return None;
        }
        if self.early_bytes + capacity <= self.cfg.max_early_bytes && self.early_chunks < self.cfg.max_early_chunks {
            self.early_bytes += capacity;
            self.early_chunks += 1;
            self.stats.early_stashed += 1;
            tracing::trace!(target: NET, chunk = h.id.index, %key, %path, replay = h.flags & FLAG_REPLAY != 0, "early chunk stashed");
            Some((key, h))
        } else {
            self.stats.early_dropped += 1;
            self.bad(path, ChunkProblem::Unexpected(h.id));
            None
        }
    }

    /// A header whose payload waits at the sender's side of `path`: receive the payload straight
    /// into its destination when it is a copy of a chunk not held nor already on its way there,
    /// else into a buffer, handled as a whole message when it arrives.
    pub(super) fn on_header<T: Transport + ?Sized>(
        &mut self,
        now: Duration,
        t: &mut T,
        path: PathId,
        header: Vec<u8>,
        payload: PayloadId,
    ) {
        let decoded = ChunkHeader::decode_split(&header, &self.mac);
        if let Ok(h) = &decoded {
            self.note_peer_seq(path, h.transfer());
        }
        let (into, dest) = match decoded {
            Err(e) => {
                // No receive is posted for the payload it announces: a forged header must not make
                // this rank hold a buffer for a message that may never come.
                self.stats.malformed += 1;
                self.bad(path, ChunkProblem::Malformed(e));
                t.recycle(header);
                return;
            }
            Ok(h) if !self.args_agree(path, &h) => {
                // Nothing of it is applied: its payload gets no receive either.
                t.recycle(header);
                return;
            }
            Ok(h) => match self.placement(t, path, &h) {
                Some((region, offset)) => {
                    t.recycle(header);
                    (
                        PayloadInto::Region { region, offset, len: h.len as usize },
                        PayloadDest::Placed(h.transfer(), h.id.index),
                    )
                }
                None => (PayloadInto::Buffer { header, capacity: h.len as usize }, PayloadDest::Whole),
            },
        };
        match t.post_payload_recv(now, path, payload, into) {
            Ok(req) => {
                self.requests.insert(req, Pending::Payload { path, dest });
                if let PayloadDest::Placed(key, idx) = dest {
                    if let Some(rt) = self.recvs.get_mut(&key) {
                        rt.placing.insert(idx, (req, false));
                    }
                }
            }
            Err(e) => {
                // The chunk is lost on this path; failing the path makes the sender replay it.
                tracing::warn!(target: NET, %path, error = %e, "payload receive refused");
                self.handle_path_down(now, t, path, PathFault::Endpoint);
            }
        }
    }

    /// Where a split chunk's payload may land directly: its transfer's destination, when the
    /// transfer copies (not reduces), the header matches it, the chunk is neither held nor
    /// already being received into place, and the backend can take it there
    /// ([`Transport::can_place`]).
    pub(super) fn placement<T: Transport + ?Sized>(
        &self,
        t: &T,
        path: PathId,
        h: &ChunkHeader,
    ) -> Option<(MemHandle, usize)> {
        let key = h.transfer();
        if !self.cfg.place_payloads || key.dst != self.rank || key.src != path.peer {
            return None;
        }
        let rt = self.recvs.get(&key)?;
        let idx = h.id.index;
        let fits = rt.combine == Combine::Copy
            && h.total_len == rt.len
            && idx < rt.have.capacity()
            && h.len == chunk_len(rt.len, rt.chunk, idx)
            && h.len > 0;
        if !fits || rt.have.contains(idx) || rt.placing.contains_key(&idx) {
            return None;
        }
        let offset = rt.offset + idx as usize * rt.chunk as usize;
        t.can_place(rt.dst, offset, h.len as usize).then_some((rt.dst, offset))
    }

    /// A payload receive finished (or failed, or was cancelled).
    pub(super) fn on_payload<T: Transport + ?Sized>(
        &mut self,
        now: Duration,
        t: &mut T,
        req: RequestId,
        path: PathId,
        dest: PayloadDest,
        kind: CompletionKind,
    ) {
        match dest {
            PayloadDest::Placed(key, idx) => {
                if let Some(rt) = self.recvs.get_mut(&key) {
                    if rt.placing.get(&idx).is_some_and(|(r, _)| *r == req) {
                        rt.placing.remove(&idx);
                    }
                    if kind == CompletionKind::Placed {
                        if tracing::enabled!(target: NET, tracing::Level::TRACE) {
                            let off = rt.offset + idx as usize * rt.chunk as usize;
                            let len = chunk_len(rt.len, rt.chunk, idx) as usize;
                            let fp = t.region(rt.dst).ok().and_then(|r| r.get(off..off + len)).map(fingerprint);
                            tracing::trace!(target: NET, chunk = idx, %key, %path, off, fp = ?fp, "chunk placed");
                        }
                        if rt.have.insert(idx) {
                            let len = u64::from(chunk_len(rt.len, rt.chunk, idx));
                            self.stats.chunks_applied += 1;
                            self.stats.bytes_applied += len;
                        } else {
                            self.stats.duplicates += 1;
                        }
                    }
                }
                if let CompletionKind::Failed(f) = kind {
                    self.handle_path_down(now, t, path, f);
                }
                self.check_recv_complete(key);
            }
            PayloadDest::Whole => match kind {
                CompletionKind::Received(bytes) => self.on_message(now, t, path, bytes),
                CompletionKind::Failed(f) => self.handle_path_down(now, t, path, f),
                _ => {}
            },
        }
    }

    pub(super) fn apply<T: Transport + ?Sized>(
        &mut self,
        now: Duration,
        t: &mut T,
        path: PathId,
        h: &ChunkHeader,
        payload: &[u8],
    ) {
        let key = h.transfer();
        // Checked again for a chunk kept from before this rank set its digest (an early one).
        if !self.recvs.contains_key(&key) || !self.args_agree(path, h) {
            return;
        }
        let Some(rt) = self.recvs.get_mut(&key) else { return };
        let cs = rt.chunk;
        let idx = h.id.index;
        if h.total_len != rt.len || idx >= rt.have.capacity() || h.len != chunk_len(rt.len, cs, idx) {
            self.stats.mismatched += 1;
            return self.bad(path, ChunkProblem::Mismatch(h.id));
        }
        if rt.have.contains(idx) {
            self.stats.duplicates += 1;
            tracing::debug!(target: NET, chunk = idx, %key, replay = h.flags & FLAG_REPLAY != 0, "duplicate chunk");
            return;
        }
        let off = rt.offset + idx as usize * cs as usize;
        let (dst, combine) = (rt.dst, rt.combine);
        let base_fp = if tracing::enabled!(target: NET, tracing::Level::TRACE) {
            t.region(dst).ok().and_then(|r| r.get(off..off + payload.len())).map(fingerprint)
        } else {
            None
        };
        let written =
            t.region_mut(dst).ok().and_then(|r| r.get_mut(off..off + payload.len())).is_some_and(|d| match combine {
                Combine::Copy => {
                    d.copy_from_slice(payload);
                    true
                }
                Combine::Reduce(dtype, op) => reduce_bytes(dtype, op, d, payload).is_ok(),
            });
        if !written {
            self.stats.mismatched += 1;
            return self.bad(path, ChunkProblem::Mismatch(h.id));
        }
        let mut superseded = None;
        if let Some(rt) = self.recvs.get_mut(&key) {
            rt.have.insert(idx);
            // The chunk came another way (a replay) while its payload was also on its way into
            // place: that receive is redundant now. Cancelled, it still holds the transfer's
            // completion until the backend lets go of the destination.
            if let Some((req, cancelled)) = rt.placing.get_mut(&idx) {
                if !*cancelled {
                    *cancelled = true;
                    superseded = Some(*req);
                }
            }
        }
        if let Some(req) = superseded {
            let _ = t.cancel(now, req);
        }
        self.stats.chunks_applied += 1;
        self.stats.bytes_applied += payload.len() as u64;
        tracing::trace!(target: NET, chunk = idx, %key, %path, replay = h.flags & FLAG_REPLAY != 0, ?combine, off, ?base_fp, fp = fingerprint(payload), "chunk applied");
        self.check_recv_complete(key);
    }

    pub(super) fn check_recv_complete(&mut self, key: TransferKey) {
        if let Some(rt) = self.recvs.get_mut(&key) {
            if rt.have.is_full() && rt.placing.is_empty() && !rt.reported {
                rt.reported = true;
                self.events.push_back(SessionEvent::RecvComplete(key));
            }
        }
    }

    pub(super) fn post_work<T: Transport + ?Sized>(&mut self, now: Duration, t: &mut T) {
        let window = self.cfg.window as usize;
        let mut failed = Vec::new();
        for (&key, tr) in &mut self.sends {
            let cs = tr.chunk;
            let args = args::for_send(&self.args, key);
            for (i, lane) in tr.lanes.iter_mut().enumerate() {
                if lane.quiesced {
                    continue;
                }
                let st = self.paths.entry(lane.path).or_insert(PathState::new(now));
                if st.down {
                    continue;
                }
                while lane.in_flight.len() < window && lane.next < lane.end {
                    let idx = lane.next;
                    if tr.completed.contains(idx) {
                        lane.next += 1;
                        continue;
                    }
                    let len = chunk_len(tr.len, cs, idx);
                    let replay = idx < lane.replay_until;
                    let header = ChunkHeader {
                        id: ChunkId { transfer: key, index: idx },
                        total_len: tr.len,
                        len,
                        flags: if replay { FLAG_REPLAY } else { 0 },
                        args,
                    };
                    let off = tr.offset + idx as usize * cs as usize;
                    match t.post_send(now, lane.path, &header.encode(&self.mac), tr.src, off, len as usize) {
                        Ok(req) => {
                            if tracing::enabled!(target: NET, tracing::Level::TRACE) {
                                let fp =
                                    t.region(tr.src).ok().and_then(|r| r.get(off..off + len as usize)).map(fingerprint);
                                tracing::trace!(target: NET, chunk = idx, %key, path = %lane.path, replay, fp = ?fp, "chunk posted");
                            }
                            lane.next += 1;
                            lane.in_flight.insert(idx, req);
                            let id = LaneId { transfer: key, lane: u16::try_from(i).unwrap_or(u16::MAX) };
                            self.requests.insert(req, Pending::Send { lane: id, chunk: idx, path: lane.path });
                            if st.outstanding == 0 {
                                st.since = now;
                            }
                            st.outstanding += 1;
                            self.stats.chunks_posted += 1;
                            if replay {
                                self.stats.chunks_replayed += 1;
                            }
                        }
                        Err(e) => {
                            tracing::warn!(target: NET, path = %lane.path, error = %e, "send refused");
                            failed.push(lane.path);
                            break;
                        }
                    }
                }
            }
        }
        let cap = HEADER_LEN + self.cfg.chunk_size as usize;
        for (&path, st) in &mut self.paths {
            if !st.listen || st.down || self.down_nics.contains(&path.local) {
                continue;
            }
            while st.posted_recvs < self.cfg.recv_depth {
                match t.post_recv(now, path, cap) {
                    Ok(req) => {
                        self.requests.insert(req, Pending::Recv { path });
                        st.posted_recvs += 1;
                    }
                    Err(e) => {
                        tracing::warn!(target: NET, %path, error = %e, "receive refused");
                        failed.push(path);
                        break;
                    }
                }
            }
        }
        for p in failed {
            self.handle_path_down(now, t, p, PathFault::Endpoint);
        }
    }
}
