//! Endpoints to a peer worker, with peer error handling and an error callback that records the failure
//! for the owning path.

use crate::error::{Status, UcxError};
use crate::request::{wait_raw, Orphan, Request, SendBuf};
use crate::sockaddr::RawSockaddr;
use crate::worker::{WorkerAddress, WorkerShared};
use r2ccl_ucx_sys as sys;
use std::ffi::c_void;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicI8, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How long a drop waits for a forced close to finish before parking the close request.
const FORCE_CLOSE_WAIT: Duration = Duration::from_millis(100);

/// What the error callback records for one endpoint; shared with the endpoint's requests.
#[derive(Debug)]
pub(crate) struct EpState {
    label: String,
    /// `UCS_OK` (0) while healthy; the first error status UCX reported otherwise.
    failed: AtomicI8,
    /// Whether a failure is logged as a warning (not for accepted endpoints: their failure is the peer
    /// closing its side, which it logs itself; not once [`Endpoint::expect_close`] said the peer
    /// may go away).
    warn: AtomicBool,
}

impl EpState {
    pub(crate) fn new(label: String, warn: bool) -> Self {
        Self { label, failed: AtomicI8::new(0), warn: AtomicBool::new(warn) }
    }

    /// The error handler to register for an endpoint that keeps this state alive while open.
    pub(crate) fn err_handler(self: &Arc<Self>) -> sys::ucp_err_handler {
        sys::ucp_err_handler { cb: Some(on_endpoint_error), arg: Arc::as_ptr(self).cast_mut().cast() }
    }

    /// The recorded failure, if any.
    pub(crate) fn failure(&self) -> Option<Status> {
        match self.failed.load(Ordering::Acquire) {
            0 => None,
            s => Some(Status(s)),
        }
    }

    pub(crate) fn error(&self, status: Status) -> UcxError {
        UcxError::EndpointFailed { peer: self.label.clone(), status, message: status.message() }
    }
}

/// UCX's error callback (`ucp_err_handler_cb_t`): runs inside `ucp_worker_progress`, under the worker lock.
unsafe extern "C" fn on_endpoint_error(arg: *mut c_void, _ep: sys::ucp_ep_h, status: sys::ucs_status_t) {
    if arg.is_null() {
        return;
    }
    // SAFETY: `arg` is the `EpState` the endpoint registered; the endpoint holds an Arc to it until after
    // the UCX endpoint is closed, and UCX calls this only for open endpoints.
    let state = unsafe { &*arg.cast_const().cast::<EpState>() };
    let status = if status == sys::UCS_OK { sys::UCS_ERR_IO_ERROR } else { status };
    if state.failed.compare_exchange(0, status, Ordering::AcqRel, Ordering::Acquire).is_ok() {
        if state.warn.load(Ordering::Acquire) {
            tracing::warn!(
                target: r2ccl_core::subsys::NET,
                path = %state.label,
                status = %Status(status),
                "UCX endpoint error"
            );
        } else {
            tracing::debug!(
                target: r2ccl_core::subsys::NET,
                path = %state.label,
                status = %Status(status),
                "UCX endpoint closed (expected)"
            );
        }
    }
}

/// An endpoint (`ucp_ep_h`) to one peer worker, created with `UCP_ERR_HANDLING_MODE_PEER`.
///
/// Dropping it closes it with `UCP_EP_CLOSE_FLAG_FORCE` (immediate; outstanding sends complete with
/// `UCS_ERR_CANCELED`). Use [`Endpoint::close`] to flush first.
pub struct Endpoint {
    worker: Arc<WorkerShared>,
    handle: sys::ucp_ep_h,
    state: Arc<EpState>,
}

// SAFETY: the endpoint handle is only used under the worker's lock (see WorkerShared).
unsafe impl Send for Endpoint {}
// SAFETY: as above; all methods go through the worker lock or atomics.
unsafe impl Sync for Endpoint {}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint").field("path", &self.state.label).field("failure", &self.state.failure()).finish()
    }
}

impl Endpoint {
    pub(crate) fn connect(worker: Arc<WorkerShared>, address: &WorkerAddress, label: String) -> Result<Self, UcxError> {
        let peer = address.socket_addr()?;
        let state = Arc::new(EpState::new(label, true));
        let remote = RawSockaddr::new(peer);
        // SAFETY: ucp_ep_params_t is a plain C struct; all-zero means "no fields set".
        let mut params: sys::ucp_ep_params_t = unsafe { std::mem::zeroed() };
        params.field_mask = u64::from(
            sys::UCP_EP_PARAM_FIELD_FLAGS
                | sys::UCP_EP_PARAM_FIELD_SOCK_ADDR
                | sys::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE
                | sys::UCP_EP_PARAM_FIELD_ERR_HANDLER,
        );
        params.flags = sys::UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
        if worker.context().config().client_id.is_some() {
            // The worker's id goes with the connection request (the peer's listener may admit
            // only the job's ids, `Worker::admit_only`).
            params.flags |= sys::UCP_EP_PARAMS_FLAGS_SEND_CLIENT_ID;
        }
        params.sockaddr = remote.as_ucs();
        params.err_mode = sys::UCP_ERR_HANDLING_MODE_PEER;
        params.err_handler = state.err_handler();
        let mut handle: sys::ucp_ep_h = std::ptr::null_mut();
        let status = {
            let mut locked = worker.lock();
            // SAFETY: live worker, lock held; `remote` outlives the call (UCX copies the address); the
            // callback argument stays valid as long as the endpoint is open (we keep `state`).
            let status = Status(unsafe { sys::ucp_ep_create(locked.handle, &params, &mut handle) });
            if !status.is_ok() {
                locked.drain_missed_events();
            }
            status
        };
        if !status.is_ok() {
            return Err(UcxError::Status {
                op: "ucp_ep_create",
                status,
                message: format!("{} (path {}, peer {peer})", status.message(), state.label),
            });
        }
        Ok(Self { worker, handle, state })
    }

    /// The path label given at connect time.
    pub fn label(&self) -> &str {
        &self.state.label
    }

    /// The failure UCX reported through the error callback, if any. Once failed, an endpoint stays failed;
    /// close it and connect a new one.
    pub fn failure(&self) -> Option<Status> {
        self.state.failure()
    }

    /// The peer may close this endpoint from now on (both sides are leaving): its failure is
    /// logged at DEBUG, not as a warning.
    pub fn expect_close(&self) {
        self.state.warn.store(false, Ordering::Release);
    }

    /// Post a tagged send of `buffer` with `tag`.
    pub fn tag_send<B: SendBuf>(&self, tag: u64, buffer: B) -> Result<Request<B>, UcxError> {
        Request::tag_send(self.worker.clone(), self.handle, self.state.clone(), tag, buffer)
    }

    /// Wait until everything sent on this endpoint is delivered to the transport (`ucp_ep_flush_nbx`),
    /// at most `timeout`.
    pub fn flush(&self, timeout: Duration) -> Result<(), UcxError> {
        if let Some(status) = self.failure() {
            return Err(self.state.error(status));
        }
        let param = zeroed_param();
        let ptr = {
            let _locked = self.worker.lock();
            // SAFETY: live endpoint of this worker, lock held, valid params.
            unsafe { sys::ucp_ep_flush_nbx(self.handle, &param) }
        };
        match wait_raw(&self.worker, ptr, timeout, Box::new(self.state.clone())) {
            Some(s) if s.is_ok() => Ok(()),
            Some(s) => {
                Err(self.failure().map_or_else(|| UcxError::status("ucp_ep_flush_nbx", s), |f| self.state.error(f)))
            }
            None => Err(UcxError::Timeout { op: "endpoint flush", deadline: timeout }),
        }
    }

    /// Close gracefully: flush outstanding operations (at most `timeout`), then release the endpoint. A
    /// failed endpoint, or one whose flush does not finish in time, is closed by force instead.
    pub fn close(mut self, timeout: Duration) -> Result<(), UcxError> {
        if self.failure().is_some() {
            self.close_force_inner();
            return Ok(());
        }
        let param = zeroed_param();
        let ptr = {
            let mut locked = self.worker.lock();
            // SAFETY: live endpoint, lock held; after this call the handle is never used again.
            let ptr = unsafe { sys::ucp_ep_close_nbx(self.handle, &param) };
            locked.drain_missed_events();
            ptr
        };
        self.handle = std::ptr::null_mut();
        match wait_raw(&self.worker, ptr, timeout, Box::new(self.state.clone())) {
            Some(s) if s.is_ok() => Ok(()),
            Some(s) => Err(UcxError::status("ucp_ep_close_nbx", s)),
            None => Err(UcxError::Timeout { op: "endpoint close", deadline: timeout }),
        }
    }

    /// Close by force at once: outstanding requests complete with `UCS_ERR_CANCELED` (how a stuck send on
    /// a dead path gets its buffer back).
    pub fn close_force(mut self) {
        self.close_force_inner();
    }

    fn close_force_inner(&mut self) {
        if self.handle.is_null() {
            return;
        }
        let mut param = zeroed_param();
        param.op_attr_mask = sys::UCP_OP_ATTR_FIELD_FLAGS;
        param.flags = sys::UCP_EP_CLOSE_FLAG_FORCE;
        let ptr = {
            let mut locked = self.worker.lock();
            // SAFETY: live endpoint, lock held; after this call the handle is never used again.
            let ptr = unsafe { sys::ucp_ep_close_nbx(self.handle, &param) };
            locked.drain_missed_events();
            ptr
        };
        self.handle = std::ptr::null_mut();
        if let Some(s) = wait_raw(&self.worker, ptr, FORCE_CLOSE_WAIT, Box::new(self.state.clone())) {
            if s.is_err() && s != Status::CANCELED && self.failure().is_none() {
                tracing::debug!(target: r2ccl_core::subsys::NET, path = %self.state.label, status = %s, "forced endpoint close");
            }
        }
    }
}

/// Close `ep` by force without waiting. A close still in progress comes back as an orphan holding
/// `keep` (the endpoint's error-callback state, which UCX may still call until the close finishes),
/// to park on the worker until UCX lets go; a close finished at once drops `keep` here.
///
/// # Safety
/// The caller holds the lock of `ep`'s live worker; `ep` is live and never used again.
pub(crate) unsafe fn close_force_nowait(ep: sys::ucp_ep_h, keep: Box<dyn Send>) -> Option<Orphan> {
    let mut param = zeroed_param();
    param.op_attr_mask = sys::UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = sys::UCP_EP_CLOSE_FLAG_FORCE;
    // SAFETY: the caller guarantees a live endpoint under the worker lock.
    let ptr = unsafe { sys::ucp_ep_close_nbx(ep, &param) };
    sys::ucs_ptr_is_ptr(ptr).then(|| Orphan::new(ptr, keep))
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.close_force_inner();
    }
}

fn zeroed_param() -> sys::ucp_request_param_t {
    // SAFETY: all-zero is a valid ucp_request_param_t (integers, raw and nullable function pointers).
    unsafe { std::mem::zeroed() }
}
