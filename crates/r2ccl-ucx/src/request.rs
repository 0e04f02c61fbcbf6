//! Tagged send and receive requests (`ucp_tag_*_nbx`), their buffers, completion, cancellation and
//! deadlines.
//!
//! A [`Request`] owns its buffer until UCX is done with it. Dropping a request that UCX still works on
//! cancels it and, if UCX does not let go at once, parks it (buffer included) on the worker as an orphan:
//! it is freed when a later progress sees it finish, or when the worker is destroyed. So no buffer is ever
//! freed while UCX may still read or write it, and no drop blocks.

use crate::context::Context;
use crate::endpoint::EpState;
use crate::error::{Status, UcxError};
use crate::worker::{Locked, WorkerShared};
use r2ccl_ucx_sys as sys;
use std::ffi::c_void;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a drop or a timed-out wait keeps progressing after a cancel for UCX to release the request.
pub const CANCEL_GRACE: Duration = Duration::from_millis(20);

/// Memory UCX may read for a send.
///
/// # Safety
/// `as_ptr` must return a pointer to `byte_len` readable bytes that stays valid, at the same address, for
/// as long as the value lives, even when the value itself is moved (heap memory, not inline storage), and
/// nothing else may write those bytes while a request holds the value. `memh`, when it returns a handle,
/// must return one from `ucp_mem_map` on `context` that covers those bytes.
pub unsafe trait SendBuf: Send + 'static {
    /// Start of the bytes.
    fn as_ptr(&self) -> *const u8;
    /// Number of bytes.
    fn byte_len(&self) -> usize;
    /// A memory handle of `context` covering the bytes, if they are registered there.
    fn memh(&self, context: &Context) -> Option<sys::ucp_mem_h> {
        let _ = context;
        None
    }
    /// A receive into this buffer completed: UCX wrote `n` bytes from its start.
    ///
    /// # Safety
    /// Called only by the request that owned the buffer for a receive, after UCX wrote those `n`
    /// bytes (`n` at most the posted [`RecvBuf::recv_capacity`]).
    unsafe fn on_received(&mut self, n: usize) {
        let _ = n;
    }
}

/// Memory UCX may write for a receive.
///
/// # Safety
/// As [`SendBuf`], and `as_mut_ptr` must return the same bytes, writable, with nothing else reading or
/// writing them while a request holds the value.
pub unsafe trait RecvBuf: SendBuf {
    /// Start of the bytes, writable.
    fn as_mut_ptr(&mut self) -> *mut u8;
    /// How many bytes a receive may write from [`RecvBuf::as_mut_ptr`].
    fn recv_capacity(&self) -> usize {
        self.byte_len()
    }
}

// SAFETY: a Vec's heap buffer does not move when the Vec is moved; the request owns the Vec exclusively.
unsafe impl SendBuf for Vec<u8> {
    fn as_ptr(&self) -> *const u8 {
        self.as_slice().as_ptr()
    }
    fn byte_len(&self) -> usize {
        self.len()
    }
    unsafe fn on_received(&mut self, n: usize) {
        if n > self.len() {
            // SAFETY: n <= capacity (the posted length) and UCX initialized bytes 0..n.
            unsafe { self.set_len(n) };
        }
    }
}

// SAFETY: as for SendBuf; a receive writes into the Vec's whole allocation (its capacity), so a
// pooled buffer needs no zeroing before reuse; the length becomes what arrived (`on_received`).
unsafe impl RecvBuf for Vec<u8> {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        Vec::as_mut_ptr(self)
    }
    fn recv_capacity(&self) -> usize {
        self.capacity()
    }
}

// SAFETY: a boxed slice's heap buffer does not move with the box; the request owns it exclusively.
unsafe impl SendBuf for Box<[u8]> {
    fn as_ptr(&self) -> *const u8 {
        (**self).as_ptr()
    }
    fn byte_len(&self) -> usize {
        self.len()
    }
}

// SAFETY: as for SendBuf.
unsafe impl RecvBuf for Box<[u8]> {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        (**self).as_mut_ptr()
    }
}

// SAFETY: shared immutable bytes; nothing can write through an `Arc<[u8]>` while the request holds a clone.
unsafe impl SendBuf for Arc<[u8]> {
    fn as_ptr(&self) -> *const u8 {
        (**self).as_ptr()
    }
    fn byte_len(&self) -> usize {
        self.len()
    }
}

// SAFETY: static bytes live forever and are immutable.
unsafe impl SendBuf for &'static [u8] {
    fn as_ptr(&self) -> *const u8 {
        (**self).as_ptr()
    }
    fn byte_len(&self) -> usize {
        self.len()
    }
}

/// What a request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Send,
    Recv,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Send => "tag send",
            Op::Recv => "tag recv",
        }
    }
}

/// How a request ended.
#[derive(Clone, Copy, Debug)]
struct Done {
    status: Status,
    len: usize,
    /// The tag the message was sent with (receives); the posted tag (sends).
    sender_tag: u64,
}

/// A request dropped while UCX still owned it; kept with its buffer until UCX lets go.
pub(crate) struct Orphan {
    raw: *mut c_void,
    _buffer: Box<dyn Send>,
}

// SAFETY: the raw request is only touched under the owning worker's lock (it lives in the locked state).
unsafe impl Send for Orphan {}

impl Orphan {
    /// A request UCX still owns, kept with `keep` until it lets go.
    pub(crate) fn new(raw: *mut c_void, keep: Box<dyn Send>) -> Self {
        Self { raw, _buffer: keep }
    }

    /// Free the request if UCX finished it; true when released.
    ///
    /// # Safety
    /// The worker lock must be held and the worker must be live.
    pub(crate) unsafe fn try_release(&mut self) -> bool {
        // SAFETY: `raw` is a live request of the locked worker (caller's contract).
        let status = Status(unsafe { sys::ucp_request_check_status(self.raw) });
        if status == Status::IN_PROGRESS {
            return false;
        }
        // SAFETY: the request is complete and freed exactly once.
        unsafe { sys::ucp_request_free(self.raw) };
        true
    }

    /// Hand the request back to UCX unfinished (before the worker is destroyed).
    ///
    /// # Safety
    /// The worker must be live and not used concurrently; call once, then only [`Orphan::drop_buffer`].
    pub(crate) unsafe fn free_request(&self) {
        // SAFETY: live request of a live worker (caller's contract); UCX allows freeing unfinished ones.
        unsafe { sys::ucp_request_free(self.raw) };
    }

    /// Drop the buffer after the worker was destroyed (which ended every operation inside UCX).
    pub(crate) fn drop_buffer(self) {}
}

/// A tagged send or receive posted to UCX, owning its buffer until completion.
pub struct Request<B: SendBuf> {
    worker: Arc<WorkerShared>,
    /// The UCX request while it is in flight; null once complete (or when it completed immediately).
    raw: *mut c_void,
    op: Op,
    tag: u64,
    buffer: Option<B>,
    /// Final status, byte count and sender tag, once known.
    done: Option<Done>,
    /// The endpoint a send went out on, to name a failed path in the error.
    endpoint: Option<Arc<EpState>>,
    /// Bytes posted: what a send reads, or the most a receive may write.
    posted: usize,
}

// SAFETY: the raw request is only used under the worker's lock; the buffer is Send (SendBuf: Send).
unsafe impl<B: SendBuf> Send for Request<B> {}

impl<B: SendBuf> fmt::Debug for Request<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Request")
            .field("op", &self.op)
            .field("tag", &format_args!("{:#x}", self.tag))
            .field("done", &self.done)
            .finish()
    }
}

/// Empty request parameters (all-zero is "no fields").
fn zeroed_param() -> sys::ucp_request_param_t {
    // SAFETY: ucp_request_param_t holds integers, raw pointers, nullable function pointers and unions of
    // those; all-zero is a valid value of each.
    unsafe { std::mem::zeroed() }
}

impl<B: SendBuf> Request<B> {
    /// Post a tagged send on `ep` (of `worker`).
    pub(crate) fn tag_send(
        worker: Arc<WorkerShared>,
        ep: sys::ucp_ep_h,
        endpoint: Arc<EpState>,
        tag: u64,
        buffer: B,
    ) -> Result<Self, UcxError> {
        if let Some(status) = endpoint.failure() {
            return Err(endpoint.error(status));
        }
        let mut param = zeroed_param();
        if let Some(memh) = buffer.memh(worker.context()) {
            param.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_MEMH;
            param.memh = memh;
        }
        let len = buffer.byte_len();
        let ptr = {
            let _locked = worker.lock();
            // SAFETY: `ep` is a live endpoint of this worker (the Endpoint borrows it for this call), the
            // lock is held, and the buffer (owned by the request from now on) has `len` readable bytes at a
            // stable address (SendBuf contract).
            unsafe { sys::ucp_tag_send_nbx(ep, buffer.as_ptr().cast(), len, tag, &param) }
        };
        let mut req = Self {
            worker,
            raw: std::ptr::null_mut(),
            op: Op::Send,
            tag,
            buffer: Some(buffer),
            done: None,
            endpoint: Some(endpoint),
            posted: len,
        };
        req.accept(ptr, len)?;
        Ok(req)
    }

    /// Interpret the status pointer an `*_nbx` call returned.
    fn accept(&mut self, ptr: sys::ucs_status_ptr_t, immediate_len: usize) -> Result<(), UcxError> {
        if sys::ucs_ptr_is_ptr(ptr) {
            self.raw = ptr;
            Ok(())
        } else {
            let status = Status(sys::ucs_ptr_status(ptr));
            self.done = Some(Done { status, len: immediate_len, sender_tag: self.tag });
            if status.is_ok() {
                Ok(())
            } else {
                Err(self.error(status, immediate_len))
            }
        }
    }

    fn error(&self, status: Status, len: usize) -> UcxError {
        if let Some(ep) = &self.endpoint {
            if let Some(failure) = ep.failure() {
                return ep.error(failure);
            }
        }
        if status == Status::MESSAGE_TRUNCATED {
            return UcxError::Truncated { got: len, capacity: self.posted };
        }
        UcxError::status(self.op.name(), status)
    }

    /// The tag the request was posted with.
    pub fn tag(&self) -> u64 {
        self.tag
    }

    /// Check for completion without progressing the worker. `None` while in flight; then the number of
    /// bytes sent or received, or the error.
    pub fn poll(&mut self) -> Option<Result<usize, UcxError>> {
        if self.done.is_none() {
            let worker = self.worker.clone();
            let locked = worker.lock();
            self.check_locked(&locked);
        }
        let Done { status, len, .. } = self.done?;
        Some(if status.is_ok() { Ok(len) } else { Err(self.error(status, len)) })
    }

    /// For a completed receive, the full tag the message was sent with (useful with a partial mask); for a
    /// send, the posted tag. `None` while in flight.
    pub fn sender_tag(&mut self) -> Option<u64> {
        let finished = self.poll().is_some();
        self.done.filter(|_| finished).map(|d| d.sender_tag)
    }

    /// Whether UCX is done with the request (successfully or not).
    pub fn is_done(&mut self) -> bool {
        self.poll().is_some()
    }

    /// Query UCX; on completion record the outcome and free the request.
    fn check_locked(&mut self, _locked: &Locked<'_>) {
        if self.raw.is_null() {
            return;
        }
        let (status, len, sender_tag) = match self.op {
            Op::Recv => {
                let mut info = sys::ucp_tag_recv_info { sender_tag: 0, length: 0 };
                // SAFETY: `raw` is an in-flight receive request of this worker; the lock is held.
                let status = Status(unsafe { sys::ucp_tag_recv_request_test(self.raw, &mut info) });
                if status.is_ok() {
                    if let Some(b) = self.buffer.as_mut() {
                        // SAFETY: this receive completed; UCX wrote `info.length` bytes, at most the posted length.
                        unsafe { b.on_received(info.length) };
                    }
                }
                (status, info.length, info.sender_tag)
            }
            Op::Send => {
                // SAFETY: `raw` is an in-flight request of this worker; the lock is held.
                let status = Status(unsafe { sys::ucp_request_check_status(self.raw) });
                (status, self.buffer.as_ref().map_or(0, SendBuf::byte_len), self.tag)
            }
        };
        if status == Status::IN_PROGRESS {
            return;
        }
        // SAFETY: the request is complete; freed exactly once, then forgotten.
        unsafe { sys::ucp_request_free(self.raw) };
        self.raw = std::ptr::null_mut();
        self.done = Some(Done { status, len, sender_tag });
    }

    /// Ask UCX to cancel the request (`ucp_request_cancel`). A receive that has not matched a message
    /// completes with `UCS_ERR_CANCELED` at the next progress. UCX 1.13 does not cancel sends this way;
    /// a stuck send is released by closing its endpoint (see `Endpoint::close_force`).
    pub fn cancel(&mut self) {
        let worker = self.worker.clone();
        let locked = worker.lock();
        self.check_locked(&locked);
        if !self.raw.is_null() {
            // SAFETY: `raw` is an in-flight request of this worker; the lock is held.
            unsafe { sys::ucp_request_cancel(locked.handle, self.raw) };
        }
    }

    /// Progress the worker until the request completes, or until `timeout` has passed; then cancel it,
    /// give UCX [`CANCEL_GRACE`] to release it, and return [`UcxError::Timeout`].
    ///
    /// TCP never reports local drops and reports remote ones only after minutes, so every wait on the
    /// network must have a deadline.
    pub fn wait(&mut self, timeout: Duration) -> Result<usize, UcxError> {
        let start = Instant::now();
        loop {
            if let Some(r) = self.poll() {
                return r;
            }
            if start.elapsed() >= timeout {
                self.cancel();
                self.drain(CANCEL_GRACE);
                return Err(UcxError::Timeout { op: self.op.name(), deadline: timeout });
            }
            if self.worker.lock().progress() == 0 {
                std::thread::yield_now();
            }
        }
    }

    /// Progress until the request is done or `grace` passes.
    fn drain(&mut self, grace: Duration) {
        let start = Instant::now();
        while !self.is_done() && start.elapsed() < grace {
            self.worker.lock().progress();
        }
    }

    /// The buffer, in flight or not (to look at, e.g. which bytes a receive writes).
    pub fn buffer(&self) -> Option<&B> {
        self.buffer.as_ref()
    }

    /// The buffer back, once UCX is done with the request; `None` while it is in flight.
    pub fn take_buffer(&mut self) -> Option<B> {
        if self.is_done() {
            self.buffer.take()
        } else {
            None
        }
    }
}

impl<B: RecvBuf> Request<B> {
    /// Post a tagged receive on `worker`.
    pub(crate) fn tag_recv(worker: Arc<WorkerShared>, tag: u64, mask: u64, mut buffer: B) -> Result<Self, UcxError> {
        let param = recv_param(&worker, &buffer);
        let len = buffer.recv_capacity();
        let ptr = {
            let locked = worker.lock();
            // SAFETY: live worker, lock held; the buffer has `len` writable bytes at a stable address that
            // the request owns from now on (RecvBuf contract).
            unsafe { sys::ucp_tag_recv_nbx(locked.handle, buffer.as_mut_ptr().cast(), len, tag, mask, &param) }
        };
        Self::posted_recv(worker, tag, buffer, ptr)
    }

    /// The request a receive call returned as `ptr`, owning `buffer`.
    fn posted_recv(
        worker: Arc<WorkerShared>,
        tag: u64,
        buffer: B,
        ptr: sys::ucs_status_ptr_t,
    ) -> Result<Self, UcxError> {
        let posted = buffer.recv_capacity();
        let mut req = Self {
            worker,
            raw: std::ptr::null_mut(),
            op: Op::Recv,
            tag,
            buffer: Some(buffer),
            done: None,
            endpoint: None,
            posted,
        };
        req.accept(ptr, 0)?;
        Ok(req)
    }

    /// Take the oldest message waiting in `worker`'s unexpected queue under exactly `tag` (one no
    /// receive matched when it arrived) and receive it into `buffer`: `ucp_tag_probe_nb` with
    /// removal, then `ucp_tag_msg_recv_nbx`, under one hold of the lock. `Ok(None)` when no such
    /// message waits. A message longer than the buffer completes as truncated, which frees it.
    pub(crate) fn take_unexpected(
        worker: Arc<WorkerShared>,
        tag: u64,
        mut buffer: B,
    ) -> Result<Option<Self>, UcxError> {
        let param = recv_param(&worker, &buffer);
        let len = buffer.recv_capacity();
        let ptr = {
            let locked = worker.lock();
            let mut info = sys::ucp_tag_recv_info { sender_tag: 0, length: 0 };
            // SAFETY: live worker, lock held, valid out pointer; with `remove` set the message is
            // ours to receive, which happens below before the lock is released.
            let msg = unsafe { sys::ucp_tag_probe_nb(locked.handle, tag, u64::MAX, 1, &mut info) };
            if msg.is_null() {
                return Ok(None);
            }
            // SAFETY: as in `tag_recv` for the buffer; `msg` was just removed from this worker's
            // unexpected queue and is received exactly once.
            unsafe { sys::ucp_tag_msg_recv_nbx(locked.handle, buffer.as_mut_ptr().cast(), len, msg, &param) }
        };
        Self::posted_recv(worker, tag, buffer, ptr).map(Some)
    }
}

/// The parameters of a receive into `buffer`: always a request (UCX 1.13.1 does not fill
/// `recv_info.tag_info` when a receive completes immediately, measured: length and sender tag stay
/// unwritten, so the length would be lost), and the buffer's memory handle when it has one.
fn recv_param<B: RecvBuf>(worker: &WorkerShared, buffer: &B) -> sys::ucp_request_param_t {
    let mut param = zeroed_param();
    param.op_attr_mask = sys::UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    if let Some(memh) = buffer.memh(worker.context()) {
        param.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_MEMH;
        param.memh = memh;
    }
    param
}

impl<B: SendBuf> Drop for Request<B> {
    fn drop(&mut self) {
        if self.raw.is_null() {
            return;
        }
        self.cancel();
        self.drain(CANCEL_GRACE);
        if self.raw.is_null() {
            return;
        }
        let raw = std::mem::replace(&mut self.raw, std::ptr::null_mut());
        let buffer: Box<dyn Send> = match self.buffer.take() {
            Some(b) => Box::new(b),
            None => Box::new(()),
        };
        tracing::debug!(target: r2ccl_core::subsys::NET, op = self.op.name(), tag = self.tag, "request dropped in flight; parked until UCX releases it");
        self.worker.lock().state.orphans.push(Orphan { raw, _buffer: buffer });
    }
}

/// Something in flight that [`wait_all`] can wait for.
pub trait Pending {
    /// Whether it is done (checks without progressing).
    fn is_done(&mut self) -> bool;
    /// Cancel it.
    fn cancel(&mut self);
}

impl<B: SendBuf> Pending for Request<B> {
    fn is_done(&mut self) -> bool {
        Request::is_done(self)
    }
    fn cancel(&mut self) {
        Request::cancel(self);
    }
}

/// Progress every worker in `workers` until every request in `requests` is done, or `timeout` passes;
/// then cancel the unfinished ones and return [`UcxError::Timeout`]. Outcomes are read from each request
/// afterwards ([`Request::poll`]).
///
/// Use it when the requests of one transfer sit on several workers (both ends in one process, or one
/// transfer striped over several NICs).
pub fn wait_all(
    workers: &[&crate::Worker],
    requests: &mut [&mut dyn Pending],
    timeout: Duration,
) -> Result<(), UcxError> {
    let start = Instant::now();
    loop {
        if requests.iter_mut().all(|r| r.is_done()) {
            return Ok(());
        }
        if start.elapsed() >= timeout {
            for r in requests.iter_mut() {
                if !r.is_done() {
                    r.cancel();
                }
            }
            let grace = Instant::now();
            while grace.elapsed() < CANCEL_GRACE && !requests.iter_mut().all(|r| r.is_done()) {
                for w in workers {
                    w.progress();
                }
            }
            return Err(UcxError::Timeout { op: "wait_all", deadline: timeout });
        }
        let events: u32 = workers.iter().map(|w| w.progress()).sum();
        if events == 0 {
            std::thread::yield_now();
        }
    }
}

/// Wait for a bare UCX request (flush, close) with a deadline. Returns its final status, or `None` when it
/// is still in flight at the deadline (it is then parked as an orphan together with `keep`, which must
/// hold whatever UCX may still reference, e.g. an endpoint's error-callback state).
pub(crate) fn wait_raw(
    worker: &Arc<WorkerShared>,
    ptr: sys::ucs_status_ptr_t,
    timeout: Duration,
    keep: Box<dyn Send>,
) -> Option<Status> {
    if !sys::ucs_ptr_is_ptr(ptr) {
        return Some(Status(sys::ucs_ptr_status(ptr)));
    }
    let start = Instant::now();
    loop {
        let mut locked = worker.lock();
        // SAFETY: `ptr` is an in-flight request of this worker; the lock is held.
        let status = Status(unsafe { sys::ucp_request_check_status(ptr) });
        if status != Status::IN_PROGRESS {
            // SAFETY: complete; freed exactly once.
            unsafe { sys::ucp_request_free(ptr) };
            return Some(status);
        }
        if start.elapsed() >= timeout {
            locked.state.orphans.push(Orphan { raw: ptr, _buffer: keep });
            return None;
        }
        if locked.progress() == 0 {
            drop(locked);
            std::thread::yield_now();
        }
    }
}
