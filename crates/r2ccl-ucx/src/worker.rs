//! A UCP worker on one NIC's context: progress, address export, receives, and the lock that serializes
//! every call on it.

use crate::context::Context;
use crate::endpoint::Endpoint;
use crate::error::{Status, UcxError};
use crate::request::{Orphan, RecvBuf, Request};
use r2ccl_ucx_sys as sys;
use std::fmt;
use std::ptr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// A worker's address as `ucp_worker_get_address` packs it: opaque bytes to hand to a peer out of band.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct WorkerAddress(Vec<u8>);

impl WorkerAddress {
    /// Wrap address bytes received from a peer.
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        Self(bytes)
    }

    /// The packed address.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The packed address, by value.
    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }
}

impl fmt::Debug for WorkerAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WorkerAddress({} bytes)", self.0.len())
    }
}

/// State behind the worker lock.
pub(crate) struct WorkerState {
    /// Requests dropped while UCX still owned their buffers; reaped by progress, released at destroy.
    pub(crate) orphans: Vec<Orphan>,
}

/// How long a worker being destroyed keeps progressing to let its orphaned requests finish.
const ORPHAN_DRAIN: std::time::Duration = std::time::Duration::from_millis(200);

/// The worker handle plus its lock; shared by the [`Worker`], its endpoints and its requests.
pub(crate) struct WorkerShared {
    handle: sys::ucp_worker_h,
    state: Mutex<WorkerState>,
    context: Arc<Context>,
}

// SAFETY: the worker is created with UCS_THREAD_MODE_SERIALIZED and every UCX call that takes this
// handle (or a request or endpoint of it) is made while holding `state`'s lock (see `lock`).
unsafe impl Send for WorkerShared {}
// SAFETY: as above.
unsafe impl Sync for WorkerShared {}

/// Proof that the worker lock is held; UCX calls on the worker go through it.
pub(crate) struct Locked<'a> {
    pub(crate) state: MutexGuard<'a, WorkerState>,
    pub(crate) handle: sys::ucp_worker_h,
}

impl Locked<'_> {
    /// One `ucp_worker_progress` call, then reap finished orphans. Returns UCX's event count.
    pub(crate) fn progress(&mut self) -> u32 {
        // SAFETY: the handle is a live worker and the lock is held.
        let events = unsafe { sys::ucp_worker_progress(self.handle) };
        if !self.state.orphans.is_empty() {
            // SAFETY: orphan requests belong to this worker and the lock is held.
            self.state.orphans.retain_mut(|o| unsafe { !o.try_release() });
        }
        events
    }
}

impl WorkerShared {
    pub(crate) fn lock(&self) -> Locked<'_> {
        Locked { state: self.state.lock().unwrap_or_else(PoisonError::into_inner), handle: self.handle }
    }

    pub(crate) fn context(&self) -> &Arc<Context> {
        &self.context
    }
}

impl Drop for WorkerShared {
    fn drop(&mut self) {
        // Endpoints and requests hold an Arc to this, so none is alive. Orphans may still be in flight
        // (typically forced endpoint closes on a dead path that outlived their wait): give them a bounded
        // time to finish under progress first, so that the worker is destroyed with as little UCX work in
        // flight as possible. Whatever is left is released by the destroy, and only then may its buffers
        // be freed.
        let drain_start = std::time::Instant::now();
        loop {
            let mut locked = self.lock();
            if locked.state.orphans.is_empty() || drain_start.elapsed() >= ORPHAN_DRAIN {
                break;
            }
            if locked.progress() == 0 {
                drop(locked);
                std::thread::yield_now();
            }
        }
        let orphans = std::mem::take(&mut self.state.get_mut().unwrap_or_else(PoisonError::into_inner).orphans);
        for o in &orphans {
            // SAFETY: the worker is still live and no other reference to it exists (we are in its drop);
            // ucp_request_free may be called on an unfinished request (no further notifications).
            unsafe { o.free_request() };
        }
        // SAFETY: the handle came from a successful ucp_worker_create and is destroyed once.
        unsafe { sys::ucp_worker_destroy(self.handle) };
        if !orphans.is_empty() {
            tracing::debug!(target: r2ccl_core::subsys::NET, count = orphans.len(), "released orphaned requests with the worker");
        }
        for o in orphans {
            o.drop_buffer();
        }
    }
}

/// A UCP worker (`ucp_worker_h`) on one NIC's context. Cheap to clone (a shared handle).
///
/// Thread safety: created `UCS_THREAD_MODE_SERIALIZED`; every call takes the worker's lock, so a worker
/// may be used from several threads, one call at a time.
#[derive(Clone)]
pub struct Worker {
    pub(crate) shared: Arc<WorkerShared>,
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker").field("device", &self.shared.context.device()).finish()
    }
}

impl Worker {
    /// Create a worker on `context`.
    pub fn new(context: Arc<Context>) -> Result<Self, UcxError> {
        // SAFETY: ucp_worker_params_t is a plain C struct; all-zero means "no fields set".
        let mut params: sys::ucp_worker_params_t = unsafe { std::mem::zeroed() };
        params.field_mask = u64::from(sys::UCP_WORKER_PARAM_FIELD_THREAD_MODE);
        params.thread_mode = sys::UCS_THREAD_MODE_SERIALIZED;
        let mut handle: sys::ucp_worker_h = ptr::null_mut();
        // SAFETY: the context is live (we hold an Arc); params and the out pointer are valid.
        let status = Status(unsafe { sys::ucp_worker_create(context.raw(), &params, &mut handle) });
        status.check("ucp_worker_create")?;
        Ok(Self {
            shared: Arc::new(WorkerShared { handle, state: Mutex::new(WorkerState { orphans: Vec::new() }), context }),
        })
    }

    /// The context (NIC) this worker runs on.
    pub fn context(&self) -> &Arc<Context> {
        &self.shared.context
    }

    /// The NIC name.
    pub fn device(&self) -> &str {
        self.shared.context.device()
    }

    /// This worker's address, for peers to connect to.
    pub fn address(&self) -> Result<WorkerAddress, UcxError> {
        let locked = self.shared.lock();
        let mut addr: *mut sys::ucp_address_t = ptr::null_mut();
        let mut len: usize = 0;
        // SAFETY: live worker, lock held, valid out pointers.
        let status = Status(unsafe { sys::ucp_worker_get_address(locked.handle, &mut addr, &mut len) });
        status.check("ucp_worker_get_address")?;
        // SAFETY: on success UCX returns `len` readable bytes at `addr`, valid until released below.
        let bytes = unsafe { std::slice::from_raw_parts(addr.cast::<u8>(), len) }.to_vec();
        // SAFETY: `addr` came from ucp_worker_get_address on this worker and is released once.
        unsafe { sys::ucp_worker_release_address(locked.handle, addr) };
        Ok(WorkerAddress(bytes))
    }

    /// Make progress once (`ucp_worker_progress`); returns the number of events UCX processed.
    pub fn progress(&self) -> u32 {
        self.shared.lock().progress()
    }

    /// The worker's event file descriptor (`ucp_worker_get_efd`): readable after [`Worker::arm`]
    /// when something happens on the worker. Owned by UCX: do not close it.
    pub fn event_fd(&self) -> Result<std::os::fd::RawFd, UcxError> {
        let locked = self.shared.lock();
        let mut fd: std::os::raw::c_int = -1;
        // SAFETY: live worker, lock held, valid out pointer.
        let status = Status(unsafe { sys::ucp_worker_get_efd(locked.handle, &mut fd) });
        status.check("ucp_worker_get_efd")?;
        Ok(fd)
    }

    /// Arm the event fd (`ucp_worker_arm`): `Ok(true)` when armed (sleeping on it is safe now),
    /// `Ok(false)` when events are pending (progress again first).
    pub fn arm(&self) -> Result<bool, UcxError> {
        let locked = self.shared.lock();
        // SAFETY: live worker, lock held.
        let status = Status(unsafe { sys::ucp_worker_arm(locked.handle) });
        if status == Status::BUSY {
            return Ok(false);
        }
        status.check("ucp_worker_arm")?;
        Ok(true)
    }

    /// Requests dropped before UCX released their buffers and not yet reaped.
    pub fn orphan_count(&self) -> usize {
        self.shared.lock().state.orphans.len()
    }

    /// Connect an endpoint to the worker at `address`, with peer error handling. `label` names the path in
    /// errors and logs (e.g. `rank 3 rail 1`).
    pub fn connect(&self, address: &WorkerAddress, label: impl Into<String>) -> Result<Endpoint, UcxError> {
        Endpoint::connect(self.shared.clone(), address, label.into())
    }

    /// Post a tagged receive of a message whose tag matches `tag` on the bits set in `mask`, into `buffer`.
    pub fn tag_recv<B: RecvBuf>(&self, tag: u64, mask: u64, buffer: B) -> Result<Request<B>, UcxError> {
        Request::tag_recv(self.shared.clone(), tag, mask, buffer)
    }
}
