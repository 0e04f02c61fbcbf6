//! `UcxTransport` as an r2ccl-transport [`Transport`]: regions, posting sends, receives and
//! probes, path evidence, cancellation and progress.

#[allow(clippy::wildcard_imports, reason = "UcxTransport split by concern: its types are the parent's")]
use super::*;

impl Transport for UcxTransport {
    fn rank(&self) -> Rank {
        self.rank
    }

    fn local_nics(&self) -> Vec<NicId> {
        (0..self.nics.len()).map(|i| self.nic_id(i)).collect()
    }

    fn register(&mut self, len: usize) -> Result<MemHandle, TransportError> {
        self.register_hot(len, len)
    }

    fn register_hot(&mut self, len: usize, hot: usize) -> Result<MemHandle, TransportError> {
        let region = self.set.register_zeroed_hot(len, hot).map_err(|e| {
            tracing::error!(target: NET, len, error = %e, "registration failed");
            TransportError::OutOfBounds { offset: 0, len, size: 0 }
        })?;
        let h = MemHandle(self.next_handle);
        self.next_handle += 1;
        self.regions.insert(h, region);
        Ok(h)
    }

    fn deregister(&mut self, handle: MemHandle) -> Result<(), TransportError> {
        self.regions.remove(&handle).map(drop).ok_or(TransportError::UnknownHandle(handle))
    }

    fn region(&self, handle: MemHandle) -> Result<&[u8], TransportError> {
        let r = self.regions.get(&handle).ok_or(TransportError::UnknownHandle(handle))?;
        // SAFETY: requests on slices of the region (split sends and receives into place) touch its
        // bytes only inside UCX calls, and every UCX call of this transport needs `&mut self`, which
        // the returned slice's borrow of `self` excludes while it lives.
        Ok(unsafe { r.as_slice() })
    }

    fn region_mut(&mut self, handle: MemHandle) -> Result<&mut [u8], TransportError> {
        let r = self.regions.get(&handle).ok_or(TransportError::UnknownHandle(handle))?;
        // SAFETY: as in `region`: the slice borrows `self` mutably, so no other slice of the region
        // lives and no UCX call runs until it is gone. Ranges a request in flight uses are the
        // session's to leave alone (the Transport contract).
        Ok(unsafe { r.as_mut_slice_unchecked() })
    }

    fn reads_region(&self, handle: MemHandle, offset: usize, len: usize) -> bool {
        let Some(region) = self.regions.get(&handle) else { return false };
        let end = offset.saturating_add(len);
        let hit = |slice: &RegionSlice| {
            let r = slice.range();
            Arc::ptr_eq(slice.region(), region) && !slice.is_alias() && r.start < end && offset < r.end
        };
        let in_buf = |b: Option<&DataBuf>| matches!(b, Some(DataBuf::Region(s)) if hit(s));
        self.out.values().any(|o| match &o.state {
            State::Live(r) => o.kind == Kind::SplitSend && in_buf(r.buffer()),
            State::Held(Held::Split(_, s)) => hit(s),
            _ => false,
        }) || self.detached_data.iter().any(|r| in_buf(r.buffer()))
    }

    fn region_pair(&mut self, src: MemHandle, dst: MemHandle) -> Result<(&[u8], &mut [u8]), TransportError> {
        if src == dst {
            return Err(TransportError::NoRegionPair { src, dst });
        }
        let a = self.regions.get(&src).ok_or(TransportError::UnknownHandle(src))?;
        let b = self.regions.get(&dst).ok_or(TransportError::UnknownHandle(dst))?;
        // SAFETY: two different regions are two separate mappings, so the slices do not overlap;
        // both borrow `self` mutably, which excludes any other slice and every UCX call while
        // they live (as in `region_mut`).
        Ok(unsafe { (a.as_slice(), b.as_mut_slice_unchecked()) })
    }

    fn post_send(
        &mut self,
        _now: Duration,
        path: PathId,
        header: &[u8],
        src: MemHandle,
        offset: usize,
        len: usize,
    ) -> Result<RequestId, TransportError> {
        if len >= SPLIT_MIN {
            let body = self.region_slice(src, offset, len)?;
            return self.post(path, Kind::SplitSend, Held::Split(header.to_vec(), body));
        }
        let mut payload = self.pool.take(header.len() + len);
        let bytes = self.region(src)?;
        let size = bytes.len();
        let data = offset
            .checked_add(len)
            .and_then(|end| bytes.get(offset..end))
            .ok_or(TransportError::OutOfBounds { offset, len, size })?;
        payload.clear();
        payload.extend_from_slice(header);
        payload.extend_from_slice(data);
        self.post(path, Kind::Send, Held::Send(payload))
    }

    fn post_recv(&mut self, _now: Duration, path: PathId, capacity: usize) -> Result<RequestId, TransportError> {
        // A message with SPLIT_MIN payload bytes or more arrives split, as a bare header: no receive
        // needs room for more than a header and a smaller payload.
        self.post(path, Kind::Recv, Held::Recv(capacity.min(HEADER_LEN + SPLIT_MIN)))
    }

    fn post_payload_recv(
        &mut self,
        _now: Duration,
        path: PathId,
        payload: PayloadId,
        into: PayloadInto,
    ) -> Result<RequestId, TransportError> {
        let tag = payload.0;
        if tag & !(PAYLOAD_BIT | PAYLOAD_RANDOM) != 0 || tag & PAYLOAD_BIT == 0 {
            return Err(TransportError::UnknownPayload(payload));
        }
        match into {
            PayloadInto::Region { region, offset, len } => {
                let r = self.regions.get(&region).ok_or(TransportError::UnknownHandle(region))?;
                let slice = offset
                    .checked_add(len)
                    .and_then(|end| r.alias_slice(offset..end).ok())
                    .ok_or(TransportError::NotPlaceable { handle: region, offset, len })?;
                self.post(path, Kind::Placed, Held::Payload(tag, DataBuf::Region(slice)))
            }
            PayloadInto::Buffer { header, capacity } => {
                // A warm pooled buffer large enough takes the payload (fresh pages would fault).
                let at = header.len();
                let mut buf = self.pool.take(at + capacity);
                buf.extend_from_slice(&header);
                self.recycle_buf(header);
                self.post(path, Kind::Payload, Held::Payload(tag, DataBuf::After(buf, at)))
            }
        }
    }

    fn can_place(&self, region: MemHandle, offset: usize, len: usize) -> bool {
        self.regions
            .get(&region)
            .is_some_and(|r| offset.checked_add(len).is_some_and(|end| r.is_placeable(&(offset..end))))
    }

    fn post_probe(&mut self, _now: Duration, path: PathId) -> Result<RequestId, TransportError> {
        self.post(path, Kind::Probe, Held::Probe)
    }

    fn path_evidence(&mut self, now: Duration, path: PathId, quiet: Duration) -> PathEvidence {
        // Same-rail TCP paths only: the connections run from this NIC's IP to the peer's listener IP.
        if path.local.node != self.node || path.local.rail != path.remote.rail {
            return PathEvidence::Unknown;
        }
        let rail = path.local.rail.index();
        let local = self.nics.get(rail).and_then(|n| n.ip);
        let remote = self.peer_address(rail, path.peer).and_then(|a| a.socket_addr().ok()).map(|a| a.ip());
        let (Some(local), Some(remote)) = (local, remote) else { return PathEvidence::Unknown };
        // One pass over the process's sockets serves every path judged at the same instant.
        let fresh = self.tcp_snapshot.as_ref().is_some_and(|(at, _)| *at == now);
        if !fresh {
            self.tcp_snapshot = Some((now, crate::tcpinfo::snapshot()));
        }
        let all = self.tcp_snapshot.as_ref().map_or(&[][..], |(_, all)| all.as_slice());
        let samples = crate::tcpinfo::of_path(all, local, remote);
        let verdict = crate::tcpinfo::judge(&samples, quiet);
        tracing::debug!(target: NET, %path, %local, %remote, connections = samples.len(), ?verdict, "kernel TCP evidence");
        match verdict {
            crate::tcpinfo::TcpVerdict::Unknown => PathEvidence::Unknown,
            crate::tcpinfo::TcpVerdict::Acking => PathEvidence::Acking,
            crate::tcpinfo::TcpVerdict::Silent => PathEvidence::Silent,
        }
    }

    fn cancel(&mut self, _now: Duration, req: RequestId) -> Result<(), TransportError> {
        if self.cancel_one(req, false) {
            Ok(())
        } else {
            Err(TransportError::UnknownRequest(req))
        }
    }

    fn cancel_path(&mut self, _now: Duration, path: PathId) -> usize {
        if path.local.rail == path.remote.rail && path.local.node == self.node {
            self.stale.insert((path.local.rail.index(), path.peer));
        }
        let ids: Vec<RequestId> =
            self.out.iter().filter(|(_, o)| o.path == path && o.kind != Kind::Probe).map(|(id, _)| *id).collect();
        ids.into_iter().filter(|&id| self.cancel_one(id, true)).count()
    }

    fn progress(&mut self, _now: Duration) {
        // First, while every event of the last round has been handled (see `sweep`).
        self.sweep_unexpected();
        self.run_faults();
        self.run_link_monitor();
        // Drain what UCX has ready (bounded), so a rendezvous pipeline is not held up by the caller's loop.
        for _ in 0..PROGRESS_ROUNDS {
            if self.set.progress() == 0 {
                break;
            }
            self.unpolled = true;
        }
        self.answer_probes();
        self.report_endpoint_errors();
        self.collect_completions();
        self.collect_unsolicited();
    }

    fn poll_event(&mut self) -> Option<TransportEvent> {
        self.events.pop_front()
    }

    fn poll_timeout(&self) -> Option<Duration> {
        None
    }

    fn recycle(&mut self, buf: Vec<u8>) {
        self.recycle_buf(buf);
    }
}
