//! The executor: starting a collective's schedule on the session (workspace, private copies of
//! sends later steps overwrite), advancing its steps as their data arrives, and its output.

use super::*;

impl Engine {
    /// An engine for `rank` of `world` ranks over `topo`.
    pub fn new(
        rank: Rank,
        world: u32,
        cfg: EngineConfig,
        topo: r2ccl_transport::Topology,
    ) -> Result<Self, EngineError> {
        let local_nics = topo.node_of(rank).map_or(0, |n| topo.nics_of(n).len());
        let members: Vec<Member> =
            (0..world).filter_map(|r| topo.node_of(Rank(r)).map(|node| Member { rank: Rank(r), node })).collect();
        let detector = Detector::new(cfg.detect.clone(), rank, &members)?;
        let mut session = Session::new(rank, cfg.session, topo, &cfg.header_key)?;
        session.open_comm(CommId(cfg.comm));
        let migrate = MigrateConfig { retry: cfg.migrate_retry, no_path_timeout: cfg.no_path_timeout };
        Ok(Self {
            rank,
            world,
            cfg,
            session,
            work: None,
            exec: None,
            finished: None,
            begun: None,
            outbox: VecDeque::new(),
            events: VecDeque::new(),
            migrations: Migrations::new(migrate),
            migrate_rx: MigrateReceiver::new(),
            probes: BTreeMap::new(),
            early_receipts: BTreeSet::new(),
            moved_sends: 0,
            suspects: BTreeMap::new(),
            evidence_at: Duration::ZERO,
            silent_declared: 0,
            abandoned_probes: BTreeSet::new(),
            quiet: BTreeMap::new(),
            notified: BTreeSet::new(),
            down_nics: BTreeSet::new(),
            health_changed: false,
            local_nics,
            last_output: None,
            detector,
            watched: BTreeSet::new(),
            detect_reqs: BTreeMap::new(),
            blamed: BTreeSet::new(),
            verdicts: BTreeMap::new(),
            linger: Linger::default(),
        })
    }

    /// The transport session (statistics, path state).
    pub const fn session(&self) -> &Session {
        &self.session
    }

    /// NICs known to be down (this node's and peers').
    pub const fn down_nics(&self) -> &BTreeSet<NicId> {
        &self.down_nics
    }

    /// Next control message for a peer (send it on the OOB `Detect` channel).
    pub fn poll_outbox(&mut self) -> Option<(Rank, Vec<u8>)> {
        self.outbox.pop_front()
    }

    /// Next event for logs and metrics.
    pub fn poll_event(&mut self) -> Option<EngineEvent> {
        self.events.pop_front()
    }

    /// How many sends moved to their private copy because a write that overwrites their bytes
    /// waited [`PRIVATE_COPY_AFTER`] past their last chunk for the receipt (since start).
    #[cfg(test)]
    pub fn moved_sends(&self) -> u64 {
        self.moved_sends
    }

    /// How many receipts are kept for sends not started yet.
    #[cfg(test)]
    pub fn early_receipts(&self) -> usize {
        self.early_receipts.len()
    }

    /// The sequence number of a collective that finished since the last call.
    pub fn take_finished(&mut self) -> Option<u64> {
        self.finished.take()
    }

    /// This rank's digest of the arguments of collective `seq`, set before it starts: its chunks
    /// carry it, and a peer's chunk for `seq` with another digest ends in
    /// [`EngineEvent::ArgsDiffer`] instead of being applied.
    pub fn set_args(&mut self, seq: u64, args: r2ccl_transport::ArgDigest) {
        self.session.set_args(CommId(self.cfg.comm), seq, args);
    }

    /// Lanes still looking for a usable path or waiting for the receiver's answer to a migration.
    /// None is left once every send is acknowledged (a receipt drops its transfer's lanes).
    #[cfg(test)]
    pub fn pending_lanes(&self) -> usize {
        self.migrations.pending().count()
    }

    /// Steps still waiting, as (step kind, peer) descriptions, for timeout diagnostics.
    pub fn waiting(&self) -> Vec<String> {
        let Some(x) = &self.exec else { return Vec::new() };
        let mut out = Vec::new();
        for (i, st) in x.state.iter().enumerate() {
            if *st == StepState::Running {
                if let StepKind::Recv { peer, dst, .. } = x.sched.steps()[i].kind {
                    let topo = self.session.topology();
                    let nics = topo.node_of(peer).map_or(1, |n| topo.nics_of(n).len());
                    let chunk = r2ccl_transport::transfer_chunk_size(self.session.config().chunk_size, dst.len, nics);
                    let n = r2ccl_transport::chunk_count(dst.len, chunk);
                    match x.keys[i].map(|k| (k, self.session.held(k, 0, n))) {
                        Some((k, Ok(held))) => {
                            out.push(format!("receive of {k} from {peer} ({held}/{n} chunks in order)"))
                        }
                        _ => out.push(format!("receive from {peer}")),
                    }
                }
            }
        }
        for &(i, _) in &x.parked {
            let blockers: Vec<String> =
                x.blockers[i].iter().filter_map(|&j| x.keys[j as usize]).map(|k| k.to_string()).collect();
            out.push(format!("step {i} parked until the receipts of [{}]", blockers.join(", ")));
        }
        for k in &x.unacked {
            let lanes: Vec<String> = self
                .session
                .lanes(*k)
                .iter()
                .map(|l| {
                    let state = if l.quiesced { "quiesced" } else { "on" };
                    format!("lane {} {state} {} sent {}/{}", l.id.lane, l.path, l.sender_done, l.end)
                })
                .collect();
            out.push(format!("receipt of {k} from {} [{}]", k.dst, lanes.join(", ")));
        }
        out.extend(self.migrations.pending().map(|(l, s)| match s {
            LaneState::WaitingForPath { .. } => format!("a path for {l} (none usable)"),
            _ => format!("migration of {l} (no answer yet)"),
        }));
        out.truncate(12);
        out
    }

    /// The detector's last verdict on `path` (this rank's view), if it localized a failure there.
    pub fn verdict(&self, path: PathId) -> Option<Verdict> {
        self.verdicts.get(&path).copied()
    }

    pub(super) fn send_ctrl(&mut self, to: Rank, msg: Ctrl) {
        if to != self.rank {
            let mut frame = vec![FRAME_CTRL];
            frame.extend(msg.encode());
            self.outbox.push_back((to, frame));
        }
    }

    /// The workspace, at least `len` bytes; a new one has its first `hot` bytes resident and the
    /// rest (the private copies of sends, written only when a receipt is late) allocated on
    /// first touch.
    pub(super) fn ensure_workspace<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        len: usize,
        hot: usize,
    ) -> Result<MemHandle, EngineError> {
        if let Some((h, l)) = self.work {
            if l >= len {
                return Ok(h);
            }
            t.deregister(h)?;
            self.work = None;
        }
        let h = t.register_hot(len.max(1), hot)?;
        self.work = Some((h, len.max(1)));
        Ok(h)
    }

    /// Start collective `seq` with this rank's schedule: `input` is the send buffer,
    /// `output` the receive buffer's current contents (kept where the collective does not write).
    /// Both are copied into (and the result out of, [`Engine::output_into`]) the engine's
    /// workspace; [`Engine::start_registered`] works on registered regions instead.
    pub fn start<T: Transport + ?Sized>(
        &mut self,
        now: Duration,
        t: &mut T,
        seq: u64,
        sched: RankSchedule,
        input: &[u8],
        output: &[u8],
    ) -> Result<(), EngineError> {
        if let Some(x) = &self.exec {
            return Err(EngineError::Busy(x.seq));
        }
        if input.len() as u64 != sched.input_len {
            return Err(EngineError::BufferSize { got: input.len(), want: sched.input_len });
        }
        if output.len() as u64 != sched.output_len {
            return Err(EngineError::BufferSize { got: output.len(), want: sched.output_len });
        }
        // Copies out of the input that wait for nothing run now, straight from the caller's
        // bytes (a ring AllReduce starts with input -> output); the input goes into the
        // workspace only if another step reads it. That saves one pass over the buffer, and
        // its room: the workspace then starts with the output (the input's place is never read).
        let direct = copies_from_input_now(&sched);
        let input_read_later = sched.steps().iter().enumerate().any(|(i, s)| !direct[i] && touches_input(s));
        let in_room = if input_read_later { sched.input_len } else { 0 };
        let scratch_at = in_room + sched.output_len;
        let (h, staging) = self.workspace_for(t, &sched, scratch_at)?;
        let base = [(h, 0), (h, in_room), (h, scratch_at)];
        {
            let ws = t.region_mut(h)?;
            if input_read_later {
                ws[..input.len()].copy_from_slice(input);
            }
            // Only schedules that leave output bytes unwritten (Send/Recv away from the
            // receiver, Reduce away from the root) need the caller's bytes preserved.
            let writes_all = sched.steps().iter().any(|s| match s.kind {
                StepKind::Copy { dst, .. } | StepKind::Reduce { dst, .. } | StepKind::Recv { dst, .. } => {
                    dst.buf == Buf::Output && dst.offset == 0 && dst.len == sched.output_len
                }
                _ => false,
            });
            if !writes_all {
                let at = in_room as usize;
                ws[at..at + output.len()].copy_from_slice(output);
            }
            for (i, _) in direct.iter().enumerate().filter(|(_, &d)| d) {
                let StepKind::Copy { src, dst } = sched.steps()[i].kind else { continue };
                let (s, (_, d), l) = (src.offset as usize, place(&base, &dst), src.len as usize);
                let from = input.get(s..s + l).ok_or(EngineError::BadRegion(src))?;
                ws.get_mut(d..d + l).ok_or(EngineError::BadRegion(dst))?.copy_from_slice(from);
            }
        }
        self.begin(now, t, seq, sched, base, staging, &direct)
    }

    /// As [`Engine::start`], but the input and the output are registered regions, given as
    /// (region, offset of the buffer's first byte): the collective reads and writes them in
    /// place (no copy in or out; in place when both are the same bytes). The workspace holds
    /// only scratch space and the sends' private copies.
    pub fn start_registered<T: Transport + ?Sized>(
        &mut self,
        now: Duration,
        t: &mut T,
        seq: u64,
        sched: RankSchedule,
        input: (MemHandle, usize),
        output: (MemHandle, usize),
    ) -> Result<(), EngineError> {
        if let Some(x) = &self.exec {
            return Err(EngineError::Busy(x.seq));
        }
        for ((h, at), want) in [(input, sched.input_len), (output, sched.output_len)] {
            let size = t.region(h)?.len();
            if (at as u64).saturating_add(want) > size as u64 {
                return Err(EngineError::BufferSize { got: size.saturating_sub(at), want });
            }
        }
        let (i_at, o_at) = (input.1 as u64, output.1 as u64);
        let overlap = input.0 == output.0 && i_at < o_at + sched.output_len && o_at < i_at + sched.input_len;
        // A schedule that reads its input after writing over it gets a copy of the input.
        let copy_input = overlap && !runs_in_place(&sched, i_at, o_at);
        let scratch_at = if copy_input { sched.input_len } else { 0 };
        let (h, staging) = self.workspace_for(t, &sched, scratch_at)?;
        let mut base = [(input.0, i_at), (output.0, o_at), (h, scratch_at)];
        if copy_input {
            let what = Region { buf: Buf::Input, offset: 0, len: sched.input_len };
            move_bytes(t, input, (h, 0), sched.input_len as usize, None, what)?;
            base[Buf::Input as usize] = (h, 0);
        }
        self.begin(now, t, seq, sched, base, staging, &[])
    }

    /// The workspace for `sched` with its scratch space at `scratch_at`, followed by room for
    /// the private copy of every send whose bytes a later step overwrites; and those offsets.
    pub(super) fn workspace_for<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        sched: &RankSchedule,
        scratch_at: u64,
    ) -> Result<(MemHandle, Staging), EngineError> {
        let blockers = overwritten_sends(sched);
        let hot = scratch_at + sched.scratch_len;
        let mut end = hot;
        let mut staging = vec![None; sched.steps().len()];
        for (i, private) in private_sends(&blockers).into_iter().enumerate() {
            if let (true, StepKind::Send { src, .. }) = (private, sched.steps()[i].kind) {
                staging[i] = Some(end);
                end += src.len;
            }
        }
        let len = usize::try_from(end).map_err(|_| EngineError::BufferSize { got: usize::MAX, want: end })?;
        let hot = usize::try_from(hot).unwrap_or(len);
        Ok((self.ensure_workspace(t, len, hot)?, Staging { offsets: staging, blockers }))
    }

    /// Set up and start a collective whose buffers lie at `base`; `direct` marks steps that
    /// already ran (copies out of the caller's input; empty: none).
    #[allow(clippy::too_many_arguments, reason = "the two start paths hand over what they set up")]
    pub(super) fn begin<T: Transport + ?Sized>(
        &mut self,
        now: Duration,
        t: &mut T,
        seq: u64,
        sched: RankSchedule,
        base: Places,
        staging: Staging,
        direct: &[bool],
    ) -> Result<(), EngineError> {
        let n = sched.steps().len();
        let is_direct = |i: usize| direct.get(i).copied().unwrap_or(false);
        // Sends from regions that later steps overwrite keep their bytes until the receiver
        // confirms them: the writes wait (parked). Each has room for a private copy, made only
        // when a parked write waits too long (a receipt held up by a failure), so a replay
        // still finds the bytes that were first sent.
        let Staging { offsets: staging, blockers } = staging;
        let copy_at_send = sends_copied_at_once(&sched, &blockers);
        // Dense per-pair message numbers: both ends sort the same tag set the same way.
        let mut send_tags: BTreeMap<Rank, Vec<(u64, usize)>> = BTreeMap::new();
        let mut recv_tags: BTreeMap<Rank, Vec<(u64, usize)>> = BTreeMap::new();
        let mut dependents = vec![Vec::new(); n];
        let mut remaining = vec![0u32; n];
        for (i, s) in sched.steps().iter().enumerate() {
            match s.kind {
                StepKind::Send { peer, tag, .. } => send_tags.entry(peer).or_default().push((tag.0, i)),
                StepKind::Recv { peer, tag, .. } => recv_tags.entry(peer).or_default().push((tag.0, i)),
                _ => {}
            }
            for &d in sched.deps(i) {
                dependents[d as usize].push(i as u32);
            }
            remaining[i] = sched.deps(i).len() as u32;
        }
        let send_peers: BTreeSet<Rank> = send_tags.keys().copied().collect();
        let peers: BTreeSet<Rank> = send_tags.keys().chain(recv_tags.keys()).copied().collect();
        for peer in peers {
            self.watch_peer(now, peer);
        }
        let mut keys = vec![None; n];
        let mut by_send = BTreeMap::new();
        let mut by_recv = BTreeMap::new();
        for (peer, mut tags) in send_tags {
            tags.sort_unstable();
            for (k, (_, i)) in tags.into_iter().enumerate() {
                let key = TransferKey::new(self.cfg.comm, seq, k as u32, self.rank.0, peer.0);
                keys[i] = Some(key);
                by_send.insert(key, i);
            }
        }
        for (peer, mut tags) in recv_tags {
            tags.sort_unstable();
            for (k, (_, i)) in tags.into_iter().enumerate() {
                let key = TransferKey::new(self.cfg.comm, seq, k as u32, peer.0, self.rank.0);
                keys[i] = Some(key);
                by_recv.insert(key, i);
            }
        }
        let ready: VecDeque<usize> = (0..n).filter(|&i| remaining[i] == 0 && !is_direct(i)).collect();
        self.early_receipts.retain(|k| k.seq >= seq);
        self.begun = Some(seq);
        self.linger.begin();
        self.exec = Some(Exec {
            seq,
            sched,
            base,
            staging,
            blockers,
            copy_at_send,
            rebased: vec![false; n],
            drained_at: vec![None; n],
            parked: Vec::new(),
            remaining,
            dependents,
            state: vec![StepState::Waiting; n],
            keys,
            by_send,
            by_recv,
            ready,
            deferred: Vec::new(),
            deferred_since: BTreeMap::new(),
            done: 0,
            unacked: BTreeSet::new(),
            send_peers,
        });
        for i in (0..n).filter(|&i| is_direct(i)) {
            self.complete_step(i);
        }
        tracing::debug!(target: subsys::COLL, rank = %self.rank, seq, steps = n, "collective started");
        // NICs that went down between collectives: the check at the NIC event saw no collective.
        self.check_peers()?;
        self.advance(now, t)
    }

    /// Whether the running collective can still finish given the NICs known to be down: this
    /// node and every node it exchanges data with keep a usable NIC (a lost common rail is left
    /// to the no-path timeout). Called when a collective starts and whenever a NIC's state
    /// changes while one runs.
    pub(super) fn check_peers(&self) -> Result<(), EngineError> {
        let Some(x) = &self.exec else { return Ok(()) };
        let topo = self.session.topology();
        let Some(me) = topo.node_of(self.rank) else { return Ok(()) };
        let peers: BTreeSet<NodeId> = x
            .by_send
            .keys()
            .map(|k| k.dst)
            .chain(x.by_recv.keys().map(|k| k.src))
            .filter_map(|r| topo.node_of(r))
            .filter(|&n| n != me)
            .collect();
        // Only a node with no usable NIC is gone for good. Two nodes left without a common rail
        // wait (bounded by the no-path timeout) for a NIC to come back: a flap on one node while
        // the other has lost its other rail must not end the job.
        let gone = self.gone_nics();
        for peer in peers {
            reachable(topo, &gone, false, me, peer)?;
        }
        Ok(())
    }

    /// NICs down for good as far as this rank knows: down, and not merely blamed by a verdict
    /// (a blamed NIC's link is up; its node's lead puts it back when it is the node's last).
    pub(super) fn gone_nics(&self) -> BTreeSet<NicId> {
        gone_for_good(&self.down_nics, &self.blamed)
    }

    /// The output buffer of the collective that finished last.
    pub fn output<T: Transport + ?Sized>(&self, t: &T, len: usize) -> Result<Vec<u8>, EngineError> {
        let (h, at) = self.last_output.ok_or(EngineError::BufferSize { got: 0, want: len as u64 })?;
        let ws = t.region(h)?;
        Ok(ws.get(at..at + len).map(<[u8]>::to_vec).unwrap_or_default())
    }

    /// Copy the output buffer of the collective that finished last into `dst`.
    pub fn output_into<T: Transport + ?Sized>(&self, t: &T, dst: &mut [u8]) -> Result<(), EngineError> {
        let (h, at) = self.last_output.ok_or(EngineError::BufferSize { got: 0, want: dst.len() as u64 })?;
        let ws = t.region(h)?;
        let src = ws
            .get(at..at + dst.len())
            .ok_or(EngineError::BufferSize { got: ws.len(), want: (at + dst.len()) as u64 })?;
        dst.copy_from_slice(src);
        Ok(())
    }

    /// Abandon the running collective (after a timeout or an abort); its transfers are released,
    /// and its receives into place cancelled (they never write the workspace again).
    pub fn abandon<T: Transport + ?Sized>(&mut self, now: Duration, t: &mut T) {
        if let Some(x) = self.exec.take() {
            for &k in x.by_send.keys() {
                self.session.release_send(k);
            }
            for &k in x.by_recv.keys() {
                self.session.cancel_recv(now, t, k);
            }
        }
        self.migrations.clear();
        self.migrate_rx.clear();
        self.drop_lingering();
        self.send_owed_receipts(now, true);
    }

    pub(super) fn complete_step(&mut self, i: usize) {
        let Some(x) = &mut self.exec else { return };
        if x.state[i] == StepState::Done {
            return;
        }
        x.state[i] = StepState::Done;
        x.done += 1;
        for &d in &x.dependents[i] {
            let d = d as usize;
            x.remaining[d] -= 1;
            if x.remaining[d] == 0 {
                x.ready.push_back(d);
            }
        }
    }

    pub(super) fn local_op<T: Transport + ?Sized>(t: &mut T, x: &Exec, i: usize) -> Result<(), EngineError> {
        let (src, dst, reduce) = match x.sched.steps()[i].kind {
            StepKind::Copy { src, dst } => (src, dst, None),
            StepKind::Reduce { src, dst } => (src, dst, Some((x.sched.dtype, x.sched.op))),
            _ => return Ok(()),
        };
        move_bytes(t, place(&x.base, &src), place(&x.base, &dst), src.len as usize, reduce, src)
    }

    /// Parked writes whose blockers are resolved become ready. A blocker whose chunks have all
    /// left but whose receipt is still missing [`PRIVATE_COPY_AFTER`] later (a receipt held up
    /// by a failure, or a cycle of writes waiting for each other's receipts) moves to its
    /// private copy, so the write no longer waits for the receipt.
    pub(super) fn unpark<T: Transport + ?Sized>(
        &mut self,
        now: Duration,
        t: &mut T,
        h: MemHandle,
    ) -> Result<(), EngineError> {
        let Some(x) = &mut self.exec else { return Ok(()) };
        if x.parked.is_empty() {
            return Ok(());
        }
        // Receipts normally beat PRIVATE_COPY_AFTER: only writes parked that long look further.
        let waiting: Vec<usize> =
            x.parked.iter().filter(|(_, at)| now >= *at + PRIVATE_COPY_AFTER).map(|&(i, _)| i).collect();
        for w in waiting {
            for j in x.blockers[w].clone() {
                let j = j as usize;
                let (Some(key), Some(stage)) = (x.keys[j], x.staging[j]) else { continue };
                let StepKind::Send { src, .. } = x.sched.steps()[j].kind else { continue };
                if x.rebased[j] || !x.unacked.contains(&key) {
                    continue;
                }
                // Every chunk gone, by the session's count and the backend's (UCX may still read
                // for a send it was told to give up), and since PRIVATE_COPY_AFTER: a replay after
                // a failure puts chunks in flight again, and the wait starts over.
                let (region, at) = place(&x.base, &src);
                if !self.session.is_send_drained(key) || t.reads_region(region, at, src.len as usize) {
                    x.drained_at[j] = None;
                    continue;
                }
                let since = *x.drained_at[j].get_or_insert(now);
                if now < since + PRIVATE_COPY_AFTER {
                    continue;
                }
                let stage = stage as usize;
                move_bytes(t, (region, at), (h, stage), src.len as usize, None, src)?;
                self.session.rebase_send(t, key, Buffer { region: h, offset: stage, len: src.len })?;
                x.rebased[j] = true;
                self.moved_sends += 1;
                tracing::debug!(target: subsys::COLL, rank = %self.rank, %key, "send moved to its private copy");
            }
        }
        let parked = std::mem::take(&mut x.parked);
        for (i, at) in parked {
            if is_blocked(x, i) {
                x.parked.push((i, at));
            } else {
                x.ready.push_back(i);
            }
        }
        Ok(())
    }

    /// Start every ready step; finish the collective when all are done.
    pub(super) fn advance<T: Transport + ?Sized>(&mut self, now: Duration, t: &mut T) -> Result<(), EngineError> {
        let Some((h, _)) = self.work else { return Ok(()) };
        self.unpark(now, t, h)?;
        loop {
            let Some(x) = &mut self.exec else { return Ok(()) };
            let Some(i) = x.ready.pop_front() else { break };
            if is_blocked(x, i) {
                x.parked.push((i, now));
                continue;
            }
            x.state[i] = StepState::Running;
            tracing::trace!(target: subsys::COLL, rank = %self.rank, seq = x.seq, step = i, kind = ?x.sched.steps()[i].kind, "step started");
            let base = x.base;
            match x.sched.steps()[i].kind {
                StepKind::Copy { .. } | StepKind::Reduce { .. } => {
                    Self::local_op(t, x, i)?;
                    self.complete_step(i);
                }
                StepKind::Send { peer: _, src, split, .. } => {
                    let key = x.keys[i].ok_or(EngineError::BadRegion(src))?;
                    let mut weights = vec![0u32; self.local_nics];
                    match x.sched.split(split) {
                        Some(s) if !split.is_intra() => {
                            for p in &s.parts {
                                if let Some(w) = weights.get_mut(p.src.index()) {
                                    *w = w.saturating_add(
                                        u32::try_from(p.weight.min(u64::from(u32::MAX / 8))).unwrap_or(1),
                                    );
                                }
                            }
                        }
                        _ => weights.iter_mut().for_each(|w| *w = 1),
                    }
                    if weights.iter().all(|&w| w == 0) {
                        weights.iter_mut().for_each(|w| *w = 1);
                    }
                    let (mut region, mut offset) = place(&base, &src);
                    if let (true, Some(stage)) = (x.copy_at_send[i], x.staging[i]) {
                        let stage = stage as usize;
                        move_bytes(t, (region, offset), (h, stage), src.len as usize, None, src)?;
                        (region, offset) = (h, stage);
                        x.rebased[i] = true;
                    }
                    let buf = Buffer { region, offset, len: src.len };
                    match self.session.start_send(now, t, key, buf, &weights) {
                        Ok(_) => {
                            x.deferred_since.remove(&i);
                            // A receipt can beat its send here (an empty transfer completes at
                            // the receiver at once): then the send is acknowledged already.
                            if self.early_receipts.remove(&key) {
                                self.session.release_send(key);
                            } else {
                                x.unacked.insert(key);
                            }
                            if src.len > 0 {
                                self.linger.imply(key);
                            }
                        }
                        Err(SessionError::NoPath(_) | SessionError::NoUsableNic(_)) => {
                            // Paths may be down only for now (a stall); a node whose NICs are all
                            // reported down is gone for good.
                            let topo = self.session.topology();
                            let nodes = (topo.node_of(self.rank), topo.node_of(key.dst));
                            if let (Some(a), Some(b)) = nodes {
                                reachable(topo, &gone_for_good(&self.down_nics, &self.blamed), false, a, b)?;
                            }
                            let since = *x.deferred_since.entry(i).or_insert(now);
                            let waited = now.saturating_sub(since);
                            if waited > self.cfg.no_path_timeout {
                                // The precise reason first: no common rail left, else no path.
                                if let (Some(a), Some(b)) = nodes {
                                    reachable(topo, &self.down_nics, self.cfg.rail_only, a, b)?;
                                }
                                return Err(EngineError::NoPathLeft {
                                    what: format!("send {key}"),
                                    peer: key.dst.0,
                                    waited_ms: waited.as_millis() as u64,
                                });
                            }
                            x.deferred.push(i);
                            continue;
                        }
                        Err(e) => return Err(e.into()),
                    }
                    // The bytes are safe in the send buffer: later steps may reuse the region.
                    self.complete_step(i);
                }
                StepKind::Recv { dst, reduce, .. } => {
                    let key = x.keys[i].ok_or(EngineError::BadRegion(dst))?;
                    let (region, offset) = place(&base, &dst);
                    let buf = Buffer { region, offset, len: dst.len };
                    if reduce {
                        // Each chunk is reduced into place as it arrives (exactly once): no
                        // staging copy, and the chunk is still in cache.
                        let (dtype, op) = (x.sched.dtype, x.sched.op);
                        self.session.expect_recv_reduce(now, t, key, buf, dtype, op)?;
                    } else {
                        self.session.expect_recv(now, t, key, buf)?;
                    }
                }
            }
        }
        self.process_session_events(now, t)?;
        self.release_implied(now)?;
        self.linger_sends(t)?;
        let finished = self.exec.as_ref().is_some_and(|x| x.done == x.state.len() && x.unacked.is_empty());
        if finished {
            if let Some(x) = self.exec.take() {
                if let Some((r, n)) = x.sched.finalize {
                    let (region, a) = place(&x.base, &r);
                    let bytes =
                        t.region_mut(region)?.get_mut(a..a + r.len as usize).ok_or(EngineError::BadRegion(r))?;
                    finalize_avg_bytes(x.sched.dtype, bytes, n)?;
                }
                let (region, at) = x.base[Buf::Output as usize];
                self.last_output = Some((region, at as usize));
                self.finished = Some(x.seq);
                tracing::debug!(target: subsys::COLL, rank = %self.rank, seq = x.seq, "collective finished");
            }
        }
        Ok(())
    }
}
