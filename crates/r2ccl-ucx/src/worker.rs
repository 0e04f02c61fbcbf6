//! A UCP worker on one NIC's context: progress, its listener for peers' connections, receives, and the
//! lock that serializes every call on it.

use crate::context::Context;
use crate::endpoint::{close_force_nowait, Endpoint, EpState};
use crate::error::{Status, UcxError};
use crate::request::{Orphan, RecvBuf, Request};
use crate::sockaddr::{self, RawSockaddr};
use r2ccl_ucx_sys as sys;
use std::ffi::c_void;
use std::fmt;
use std::net::SocketAddr;
use std::ptr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Where peers connect to a worker: its listener's IP address and port, packed (opaque bytes to hand to
/// a peer out of band).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct WorkerAddress(Vec<u8>);

impl WorkerAddress {
    /// Wrap address bytes received from a peer (checked when connecting).
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

    /// The listener's socket address, or why the bytes are not one.
    pub fn socket_addr(&self) -> Result<SocketAddr, UcxError> {
        sockaddr::unpack(&self.0).map_err(|why| UcxError::BadAddress { len: self.0.len(), why })
    }

    /// The address of a listener at `addr` (what a rank's address blob carries per rail).
    pub fn from_socket_addr(addr: SocketAddr) -> Self {
        Self(sockaddr::pack(addr))
    }
}

impl fmt::Debug for WorkerAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match sockaddr::unpack(&self.0) {
            Ok(a) => write!(f, "WorkerAddress({a})"),
            Err(_) => write!(f, "WorkerAddress({} bytes, malformed)", self.0.len()),
        }
    }
}

/// A connection request the listener received, to accept at the next progress.
struct ConnRequest(sys::ucp_conn_request_h);

// SAFETY: a connection request handle is only used under the worker lock (accepted in progress).
unsafe impl Send for ConnRequest {}

/// An endpoint created from a peer's connection request: it carries the peer's sends to us. Nothing is
/// sent on it; it is closed once it fails (the peer closed its side) or with the worker.
struct Accepted {
    handle: sys::ucp_ep_h,
    state: Arc<EpState>,
}

/// The worker's listener and the address it publishes.
struct Listener {
    handle: sys::ucp_listener_h,
    address: WorkerAddress,
}

/// UCX's connection callback (`ucp_listener_conn_callback_t`): queue the request; the next progress
/// accepts it (UCX's own tests accept outside the callback, too).
unsafe extern "C" fn on_conn_request(request: sys::ucp_conn_request_h, arg: *mut c_void) {
    if arg.is_null() {
        return;
    }
    // SAFETY: `arg` is the `incoming` queue of the WorkerShared that owns the listener; the listener is
    // destroyed before that WorkerShared is freed.
    let incoming = unsafe { &*arg.cast_const().cast::<Mutex<Vec<ConnRequest>>>() };
    incoming.lock().unwrap_or_else(PoisonError::into_inner).push(ConnRequest(request));
}

/// State behind the worker lock.
pub(crate) struct WorkerState {
    /// Requests dropped while UCX still owned their buffers; reaped by progress, released at destroy.
    pub(crate) orphans: Vec<Orphan>,
    /// The listener, created by the first [`Worker::address`].
    listener: Option<Listener>,
    /// Endpoints accepted from peers' connection requests.
    accepted: Vec<Accepted>,
    /// The most endpoints accepted at once; further connection requests are rejected.
    max_accepted: usize,
    /// Connection requests rejected for being over `max_accepted`.
    rejected: u64,
    /// The client ids admitted (`Worker::admit_only`); `None`: every request.
    admitted: Option<std::collections::BTreeSet<u64>>,
    /// Connection requests rejected for presenting no admitted client id.
    strangers: u64,
}

/// The default cap on endpoints a worker's listener keeps accepted at once (each holds a socket
/// and UCX state); [`Worker::set_max_accepted`] sizes it to the job.
pub const DEFAULT_MAX_ACCEPTED: usize = 4096;

/// How long a worker being destroyed keeps progressing to let its orphaned requests finish.
const ORPHAN_DRAIN: std::time::Duration = std::time::Duration::from_millis(200);

/// The worker handle plus its lock; shared by the [`Worker`], its endpoints and its requests.
pub(crate) struct WorkerShared {
    handle: sys::ucp_worker_h,
    state: Mutex<WorkerState>,
    context: Arc<Context>,
    /// Connection requests queued by the listener's callback (which runs inside progress, with `state`
    /// locked, hence a lock of its own).
    incoming: Mutex<Vec<ConnRequest>>,
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
    incoming: &'a Mutex<Vec<ConnRequest>>,
}

impl Locked<'_> {
    /// One `ucp_worker_progress` call, then accept queued connection requests, close accepted endpoints
    /// that failed, and reap finished orphans. Returns UCX's event count.
    pub(crate) fn progress(&mut self) -> u32 {
        // SAFETY: the handle is a live worker and the lock is held.
        let events = unsafe { sys::ucp_worker_progress(self.handle) };
        self.accept_incoming();
        if self.state.accepted.iter().any(|a| a.state.failure().is_some()) {
            let (failed, live): (Vec<Accepted>, Vec<Accepted>) =
                std::mem::take(&mut self.state.accepted).into_iter().partition(|a| a.state.failure().is_some());
            self.state.accepted = live;
            for a in failed {
                // SAFETY: a live endpoint of this worker, lock held; never used again. Its error
                // state stays alive with the close until UCX lets go of it.
                if let Some(o) = unsafe { close_force_nowait(a.handle, Box::new(a.state)) } {
                    self.state.orphans.push(o);
                }
            }
            self.drain_missed_events();
        }
        if !self.state.orphans.is_empty() {
            // SAFETY: orphan requests belong to this worker and the lock is held.
            self.state.orphans.retain_mut(|o| unsafe { !o.try_release() });
        }
        events
    }

    /// One more `ucp_worker_progress` right after a call that may have removed one of this worker's
    /// UCX async handlers (an endpoint's close, a failed connect, a listener's reject or destroy):
    /// progress ends by draining the worker's queue of missed async events.
    ///
    /// Why: UCX 1.13 keys an fd's async handler by the fd number in one table for the whole process,
    /// queues events it could not deliver at once per worker, and does not purge a removed handler's
    /// queued events (fixed upstream in 1.18, openucx/ucx#9942). When the fd number is reused by
    /// another worker's socket (every NIC has its own worker here) before this worker drains its
    /// queue, the next progress asserts `handler->async == async` and aborts the process (seen once
    /// in about 120 fault storms). Draining at once closes the window our own calls open; the UCX
    /// async thread can still close and reuse an fd on its own, so this narrows the race, it does
    /// not remove it (one worker per process would).
    pub(crate) fn drain_missed_events(&mut self) {
        // SAFETY: the handle is a live worker and the lock is held.
        unsafe { sys::ucp_worker_progress(self.handle) };
    }

    /// Whether `request` may be accepted: every one when no ids are set, else only one whose
    /// client id is admitted (a request that carries none, or cannot be queried, is not).
    fn admits(&self, request: sys::ucp_conn_request_h) -> bool {
        let Some(ids) = &self.state.admitted else { return true };
        // SAFETY: ucp_conn_request_attr_t is a plain C struct; all-zero is valid before the query.
        let mut attr: sys::ucp_conn_request_attr_t = unsafe { std::mem::zeroed() };
        attr.field_mask = u64::from(sys::UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ID);
        // SAFETY: a live request this worker's listener delivered, not yet accepted or rejected;
        // lock held; valid out pointer.
        let status = Status(unsafe { sys::ucp_conn_request_query(request, &mut attr) });
        status.is_ok() && ids.contains(&attr.client_id)
    }

    /// Turn a connection request away. Not with `ucp_listener_reject`: over TCP, a UCX without
    /// openucx/ucx#11393 (Debian's 1.13 among them) calls a null callback on its async thread
    /// when the client sends more after a reject, which a stranger can do at will. The request is
    /// accepted and its endpoint closed by force at once instead (no warning: it is expected).
    fn refuse(&mut self, request: sys::ucp_conn_request_h) {
        let state = Arc::new(EpState::new("refused connection".into(), false));
        if let Ok(handle) = self.server_endpoint(request, &state) {
            // SAFETY: the endpoint just created, lock held; never used again. Its error state is
            // kept with the close.
            if let Some(o) = unsafe { close_force_nowait(handle, Box::new(state)) } {
                self.state.orphans.push(o);
            }
        }
    }

    /// The endpoint for a connection request this worker's listener delivered, with peer error
    /// handling reported to `state` (which must outlive the endpoint: the caller keeps it).
    fn server_endpoint(
        &mut self,
        request: sys::ucp_conn_request_h,
        state: &Arc<EpState>,
    ) -> Result<sys::ucp_ep_h, Status> {
        // SAFETY: ucp_ep_params_t is a plain C struct; all-zero means "no fields set".
        let mut params: sys::ucp_ep_params_t = unsafe { std::mem::zeroed() };
        params.field_mask = u64::from(
            sys::UCP_EP_PARAM_FIELD_CONN_REQUEST
                | sys::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE
                | sys::UCP_EP_PARAM_FIELD_ERR_HANDLER,
        );
        params.conn_request = request;
        params.err_mode = sys::UCP_ERR_HANDLING_MODE_PEER;
        params.err_handler = state.err_handler();
        let mut handle: sys::ucp_ep_h = ptr::null_mut();
        // SAFETY: live worker, lock held; the request came from this worker's listener and is used
        // once; the error callback's argument lives as long as the endpoint (the caller's contract).
        let status = Status(unsafe { sys::ucp_ep_create(self.handle, &params, &mut handle) });
        if status.is_ok() {
            Ok(handle)
        } else {
            Err(status)
        }
    }

    /// Create an endpoint for every queued connection request.
    fn accept_incoming(&mut self) {
        let requests = std::mem::take(&mut *self.incoming.lock().unwrap_or_else(PoisonError::into_inner));
        let mut rejected_now = 0u64;
        for ConnRequest(request) in requests {
            if !self.admits(request) {
                self.refuse(request);
                rejected_now += 1;
                self.state.strangers += 1;
                if self.state.strangers.is_power_of_two() {
                    tracing::warn!(
                        target: r2ccl_core::subsys::NET,
                        rejected = self.state.strangers,
                        "connection request without this job's endpoint id rejected (a stranger, or another job)"
                    );
                }
                continue;
            }
            if self.state.accepted.len() >= self.state.max_accepted {
                self.refuse(request);
                rejected_now += 1;
                self.state.rejected += 1;
                if self.state.rejected.is_power_of_two() {
                    tracing::warn!(
                        target: r2ccl_core::subsys::NET,
                        accepted = self.state.accepted.len(),
                        rejected = self.state.rejected,
                        "a listener holds its most accepted endpoints; connection requests rejected"
                    );
                }
                continue;
            }
            let state = Arc::new(EpState::new("accepted peer endpoint".into(), false));
            // The error state lives as long as the endpoint: both are kept in `accepted`.
            match self.server_endpoint(request, &state) {
                Ok(handle) => self.state.accepted.push(Accepted { handle, state }),
                Err(status) => {
                    tracing::debug!(target: r2ccl_core::subsys::NET, %status, "could not accept a peer's connection");
                    self.drain_missed_events();
                }
            }
        }
        if rejected_now > 0 {
            // A reject can remove a UCX async handler: drain its missed events (see
            // `drain_missed_events`).
            self.drain_missed_events();
        }
    }
}

impl WorkerShared {
    pub(crate) fn lock(&self) -> Locked<'_> {
        Locked {
            state: self.state.lock().unwrap_or_else(PoisonError::into_inner),
            handle: self.handle,
            incoming: &self.incoming,
        }
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
        // be freed. The listener goes first (no new connections), then the accepted endpoints.
        {
            let mut locked = self.lock();
            if let Some(l) = locked.state.listener.take() {
                let pending = std::mem::take(&mut *self.incoming.lock().unwrap_or_else(PoisonError::into_inner));
                for ConnRequest(r) in pending {
                    // Turned away as any other (see `refuse`); its close is drained below.
                    locked.refuse(r);
                }
                // SAFETY: the listener came from ucp_listener_create on this worker and is destroyed once.
                unsafe { sys::ucp_listener_destroy(l.handle) };
            }
            for a in std::mem::take(&mut locked.state.accepted) {
                // SAFETY: a live endpoint of this worker, lock held; never used again. Its error
                // state is kept with the close request until after the worker is destroyed.
                if let Some(o) = unsafe { close_force_nowait(a.handle, Box::new(a.state)) } {
                    locked.state.orphans.push(o);
                }
            }
            locked.drain_missed_events();
        }
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

/// A message in a worker's unexpected queue ([`Worker::peek_unexpected`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unexpected {
    /// The tag it was sent with.
    pub tag: u64,
    /// Its length in bytes.
    pub len: usize,
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
        if let Some(id) = context.config().client_id {
            params.field_mask |= u64::from(sys::UCP_WORKER_PARAM_FIELD_CLIENT_ID);
            params.client_id = id;
        }
        let mut handle: sys::ucp_worker_h = ptr::null_mut();
        // SAFETY: the context is live (we hold an Arc); params and the out pointer are valid.
        let status = Status(unsafe { sys::ucp_worker_create(context.raw(), &params, &mut handle) });
        status.check("ucp_worker_create")?;
        Ok(Self {
            shared: Arc::new(WorkerShared {
                handle,
                state: Mutex::new(WorkerState {
                    orphans: Vec::new(),
                    listener: None,
                    accepted: Vec::new(),
                    max_accepted: DEFAULT_MAX_ACCEPTED,
                    rejected: 0,
                    admitted: None,
                    strangers: 0,
                }),
                context,
                incoming: Mutex::new(Vec::new()),
            }),
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

    /// This worker's address, for peers to connect to: the first call starts a listener on the NIC's IP
    /// address (an ephemeral port); peers' connections are accepted by progress.
    pub fn address(&self) -> Result<WorkerAddress, UcxError> {
        let mut locked = self.shared.lock();
        if let Some(l) = &locked.state.listener {
            return Ok(l.address.clone());
        }
        let ip = sockaddr::device_ip(self.device())?;
        let bind = RawSockaddr::new(SocketAddr::new(ip, 0));
        // SAFETY: ucp_listener_params_t is a plain C struct; all-zero means "no fields set".
        let mut params: sys::ucp_listener_params_t = unsafe { std::mem::zeroed() };
        params.field_mask =
            u64::from(sys::UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | sys::UCP_LISTENER_PARAM_FIELD_CONN_HANDLER);
        params.sockaddr = bind.as_ucs();
        params.conn_handler = sys::ucp_listener_conn_handler {
            cb: Some(on_conn_request),
            arg: (&raw const self.shared.incoming).cast_mut().cast(),
        };
        let mut handle: sys::ucp_listener_h = ptr::null_mut();
        // SAFETY: live worker, lock held; `bind` outlives the call; the callback argument (our queue)
        // outlives the listener, which the worker's drop destroys first.
        let status = Status(unsafe { sys::ucp_listener_create(locked.handle, &params, &mut handle) });
        status.check("ucp_listener_create")?;
        // SAFETY: ucp_listener_attr_t is a plain C struct; all-zero is valid before the query fills it.
        let mut attr: sys::ucp_listener_attr_t = unsafe { std::mem::zeroed() };
        attr.field_mask = u64::from(sys::UCP_LISTENER_ATTR_FIELD_SOCKADDR);
        // SAFETY: live listener, lock held, valid out pointer.
        let status = Status(unsafe { sys::ucp_listener_query(handle, &mut attr) });
        let port = if status.is_ok() { sockaddr::port_of(&attr.sockaddr) } else { None };
        let Some(port) = port else {
            // SAFETY: created above, destroyed once.
            unsafe { sys::ucp_listener_destroy(handle) };
            status.check("ucp_listener_query")?;
            return Err(UcxError::NoDeviceAddress {
                device: self.device().to_owned(),
                why: "its listener reports no IPv4 or IPv6 port".into(),
            });
        };
        let address = WorkerAddress::from_socket_addr(SocketAddr::new(ip, port));
        locked.state.listener = Some(Listener { handle, address: address.clone() });
        Ok(address)
    }

    /// From now on accept only connection requests whose client id is in `ids` (the ids of the
    /// job's endpoints, [`crate::ContextConfig::client_id`]); reject the rest at once, counted
    /// ([`Worker::strangers_rejected`]) and warned about (the 1st, 2nd, 4th, ...). Set it before
    /// peers connect: requests already accepted stay.
    pub fn admit_only(&self, ids: std::collections::BTreeSet<u64>) {
        self.shared.lock().state.admitted = Some(ids);
    }

    /// Connection requests rejected for presenting no admitted client id.
    pub fn strangers_rejected(&self) -> u64 {
        self.shared.lock().state.strangers
    }

    /// How many endpoints accepted from peers' connections are open.
    pub fn accepted_count(&self) -> usize {
        self.shared.lock().state.accepted.len()
    }

    /// Keep at most `max` endpoints accepted at once (at least 1): the listener rejects further
    /// connection requests, so that strangers who connect and never leave hold bounded memory
    /// and sockets. Accepted endpoints that fail are closed and free their place.
    pub fn set_max_accepted(&self, max: usize) {
        self.shared.lock().state.max_accepted = max.max(1);
    }

    /// Connection requests rejected for being over the cap.
    pub fn rejected_count(&self) -> u64 {
        self.shared.lock().state.rejected
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

    /// Connect an endpoint to the worker at `address` (its listener), with peer error handling. The
    /// connection completes in the background: sends posted before then wait for it. `label` names the
    /// path in errors and logs (e.g. `rank 3 rail 1`).
    pub fn connect(&self, address: &WorkerAddress, label: impl Into<String>) -> Result<Endpoint, UcxError> {
        Endpoint::connect(self.shared.clone(), address, label.into())
    }

    /// Post a tagged receive of a message whose tag matches `tag` on the bits set in `mask`, into `buffer`.
    pub fn tag_recv<B: RecvBuf>(&self, tag: u64, mask: u64, buffer: B) -> Result<Request<B>, UcxError> {
        Request::tag_recv(self.shared.clone(), tag, mask, buffer)
    }

    /// The oldest message waiting in the worker's unexpected queue (one that no posted receive
    /// matched when it arrived) whose tag matches `tag` on the bits set in `mask` (`mask` 0: the
    /// oldest of all), without taking it: its tag and length.
    pub fn peek_unexpected(&self, tag: u64, mask: u64) -> Option<Unexpected> {
        let locked = self.shared.lock();
        let mut info = sys::ucp_tag_recv_info { sender_tag: 0, length: 0 };
        // SAFETY: live worker, lock held, valid out pointer; without `remove` the message stays
        // where it is and the returned handle is not used.
        let msg = unsafe { sys::ucp_tag_probe_nb(locked.handle, tag, mask, 0, &mut info) };
        (!msg.is_null()).then_some(Unexpected { tag: info.sender_tag, len: info.length })
    }

    /// Take the oldest message waiting in the unexpected queue under exactly `tag` and receive it
    /// into `buffer` (one longer than the buffer completes as truncated: a way to discard it).
    /// `Ok(None)` when none waits.
    pub fn take_unexpected<B: RecvBuf>(&self, tag: u64, buffer: B) -> Result<Option<Request<B>>, UcxError> {
        Request::take_unexpected(self.shared.clone(), tag, buffer)
    }
}
