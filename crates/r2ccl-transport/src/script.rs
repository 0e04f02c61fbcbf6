//! [`Script`]: a `Transport` whose completions the caller writes, recording what the session
//! posts; for tests and fuzz targets that drive a [`crate::Session`] message by message (not a
//! backend: it moves no bytes).

use crate::{
    Completion, CompletionKind, MemHandle, PathId, PayloadId, PayloadInto, RequestId, Transport, TransportError,
    TransportEvent,
};
use r2ccl_core::{NicId, Rank};
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

/// Rank 1's single-NIC backend whose completions the caller writes: it records what the session
/// posts.
#[derive(Debug, Default)]
pub struct Script {
    /// Registered regions.
    pub regions: BTreeMap<MemHandle, Vec<u8>>,
    /// The last request id handed out.
    pub next: u64,
    /// Completions written, not yet polled.
    pub events: VecDeque<TransportEvent>,
    /// Receives posted, in order.
    pub recvs: Vec<(RequestId, PathId)>,
    /// Payload receives posted, in order.
    pub payloads: Vec<(RequestId, PathId, PayloadId, PayloadInto)>,
    /// Requests the session cancelled.
    pub cancelled: Vec<RequestId>,
    /// Buffers the session handed back.
    pub recycled: usize,
    /// `can_place` says no.
    pub unplaceable: bool,
}

impl Script {
    fn id(&mut self) -> RequestId {
        self.next += 1;
        RequestId(self.next)
    }

    /// Queue a completion of `req` on `path`.
    pub fn complete(&mut self, req: RequestId, path: PathId, kind: CompletionKind) {
        self.events.push_back(TransportEvent::Completion(Completion { req, path, kind }));
    }

    /// The oldest posted receive not yet used (the caller completes each at most once).
    ///
    /// # Panics
    /// When no receive is posted.
    pub fn take_recv(&mut self) -> (RequestId, PathId) {
        self.recvs.remove(0)
    }
}

impl Transport for Script {
    fn rank(&self) -> Rank {
        Rank(1)
    }
    fn local_nics(&self) -> Vec<NicId> {
        vec![NicId::new(1, 0)]
    }
    fn register(&mut self, len: usize) -> Result<MemHandle, TransportError> {
        let h = MemHandle(self.next + 1000);
        self.next += 1;
        self.regions.insert(h, vec![0; len]);
        Ok(h)
    }
    fn deregister(&mut self, handle: MemHandle) -> Result<(), TransportError> {
        self.regions.remove(&handle).map(drop).ok_or(TransportError::UnknownHandle(handle))
    }
    fn region(&self, handle: MemHandle) -> Result<&[u8], TransportError> {
        self.regions.get(&handle).map(Vec::as_slice).ok_or(TransportError::UnknownHandle(handle))
    }
    fn region_mut(&mut self, handle: MemHandle) -> Result<&mut [u8], TransportError> {
        self.regions.get_mut(&handle).map(Vec::as_mut_slice).ok_or(TransportError::UnknownHandle(handle))
    }
    fn post_send(
        &mut self,
        _now: Duration,
        _path: PathId,
        _header: &[u8],
        _src: MemHandle,
        _offset: usize,
        _len: usize,
    ) -> Result<RequestId, TransportError> {
        Ok(self.id())
    }
    fn post_recv(&mut self, _now: Duration, path: PathId, _capacity: usize) -> Result<RequestId, TransportError> {
        let id = self.id();
        self.recvs.push((id, path));
        Ok(id)
    }
    fn post_payload_recv(
        &mut self,
        _now: Duration,
        path: PathId,
        payload: PayloadId,
        into: PayloadInto,
    ) -> Result<RequestId, TransportError> {
        let id = self.id();
        self.payloads.push((id, path, payload, into));
        Ok(id)
    }
    fn can_place(&self, _region: MemHandle, _offset: usize, _len: usize) -> bool {
        !self.unplaceable
    }
    fn post_probe(&mut self, _now: Duration, _path: PathId) -> Result<RequestId, TransportError> {
        Ok(self.id())
    }
    fn cancel(&mut self, _now: Duration, req: RequestId) -> Result<(), TransportError> {
        self.cancelled.push(req);
        Ok(())
    }
    fn cancel_path(&mut self, _now: Duration, _path: PathId) -> usize {
        0
    }
    fn progress(&mut self, _now: Duration) {}
    fn poll_event(&mut self) -> Option<TransportEvent> {
        self.events.pop_front()
    }
    fn poll_timeout(&self) -> Option<Duration> {
        None
    }
    fn recycle(&mut self, _buf: Vec<u8>) {
        self.recycled += 1;
    }
}
