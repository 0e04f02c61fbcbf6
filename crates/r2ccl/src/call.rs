//! One call's hand-over to the progress thread: its deadline, its reply, and the guard that
//! keeps the progress thread off the caller's memory once the caller has stopped waiting.
//!
//! Invariant: the progress thread touches a caller's borrowed memory only while it holds the
//! call's [`Access`] lock and finds the caller still there (it copies in when the call starts
//! and out when it ends; the collective itself runs in the library's registered workspace). A
//! waiter that gives up first aborts the communicator, waits a short grace for the reply, and
//! then revokes the access, so no wait outlives its deadline and no write outlives the borrow.

use crate::comm::{Communicator, Req};
use crate::error::CommError;
use crate::report::CollReport;
use crate::wake::Waker;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// What the progress thread answers a call with: the output of an owned call (empty
/// otherwise) and the report.
pub(crate) type Reply = Result<(Vec<u8>, CollReport), CommError>;

/// How long past a call's deadline a waiter waits for the progress thread, which enforces the
/// deadline itself and answers by then.
const REPLY_MARGIN: Duration = Duration::from_secs(5);
/// How long a waiter that aborted the communicator waits for the reply before revoking access.
const ABORT_GRACE: Duration = Duration::from_secs(2);

/// Whether the caller's borrowed memory may still be touched (see the module doc).
#[derive(Clone, Debug)]
pub(crate) struct Access(Arc<Mutex<bool>>);

impl Access {
    pub(crate) fn new() -> Self {
        Self(Arc::new(Mutex::new(true)))
    }

    /// Run `f` while holding the lock, if the caller is still waiting.
    pub(crate) fn with<R>(&self, f: impl FnOnce() -> R) -> Option<R> {
        let live = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if *live {
            Some(f())
        } else {
            None
        }
    }

    /// From now on nothing touches the memory (waits for a copy in progress to end).
    fn revoke(&self) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = false;
    }
}

/// The caller's side of one submitted call.
pub(crate) struct Waiter {
    rx: Receiver<Reply>,
    access: Option<Access>,
    /// When to stop waiting for the progress thread: the call's deadline plus a margin.
    give_up_at: Instant,
    /// The call's deadline, for the error of a waiter that gives up.
    timeout: Duration,
    tx: Sender<Req>,
    waker: Waker,
}

impl Waiter {
    /// Wait for the reply, by the call's deadline plus a margin (see the module doc).
    pub(crate) fn wait(self) -> Reply {
        let reply = self.wait_inner();
        if let Err(e) = &reply {
            crate::metrics::count_error(e.kind());
        }
        reply
    }

    fn wait_inner(self) -> Reply {
        match self.rx.recv_deadline(self.give_up_at) {
            Ok(r) => r,
            Err(RecvTimeoutError::Disconnected) => {
                self.revoke();
                Err(CommError::Aborted("the progress thread stopped".into()))
            }
            Err(RecvTimeoutError::Timeout) => {
                let reason = format!("a caller's wait passed its {} ms deadline unanswered", self.timeout.as_millis());
                let _ = self.tx.send(Req::Abort(reason.clone()));
                self.waker.wake();
                let late = self.rx.recv_timeout(ABORT_GRACE);
                self.revoke();
                match late {
                    Ok(r) => r,
                    Err(_) => Err(CommError::Aborted(reason)),
                }
            }
        }
    }

    /// The reply if it has come, without waiting.
    pub(crate) fn try_take(&self) -> Option<Reply> {
        let reply = self.rx.try_recv().ok();
        if let Some(Err(e)) = &reply {
            crate::metrics::count_error(e.kind());
        }
        reply
    }

    fn revoke(&self) {
        if let Some(a) = &self.access {
            a.revoke();
        }
    }
}

/// What hands calls to a communicator's progress thread, apart from the communicator itself
/// (the device staging worker holds one).
#[derive(Clone)]
pub(crate) struct Submitter {
    pub(crate) tx: Sender<Req>,
    pub(crate) waker: Waker,
    pub(crate) shared: Arc<crate::comm::Shared>,
    /// The deadline of a call given none.
    pub(crate) default_timeout: Duration,
}

impl Submitter {
    /// Hand `call` to the progress thread; its deadline is `timeout` from now (the
    /// configured collective timeout when `None`).
    pub(crate) fn submit(&self, call: crate::comm::Call, timeout: Option<Duration>) -> Result<Waiter, CommError> {
        let timeout = timeout.unwrap_or(self.default_timeout);
        let (reply, rx) = crossbeam_channel::bounded(1);
        let (access, deadline) = (call.access.clone(), Instant::now() + timeout);
        self.send(call, deadline, reply)?;
        Ok(self.waiter(rx, access, deadline, timeout))
    }

    /// Hand `call` to the progress thread, to finish by `deadline` and answer on `reply`.
    pub(crate) fn send(
        &self,
        call: crate::comm::Call,
        deadline: Instant,
        reply: Sender<Reply>,
    ) -> Result<(), CommError> {
        if let Some(e) = self.shared.async_error() {
            return Err(e);
        }
        self.tx
            .send(Req::Coll { call, deadline, reply })
            .map_err(|_| CommError::Aborted("the progress thread is gone".into()))?;
        self.waker.wake();
        Ok(())
    }

    /// The caller's side of a call answered on `rx` by `deadline` (`timeout` after it started).
    pub(crate) fn waiter(
        &self,
        rx: Receiver<Reply>,
        access: Option<Access>,
        deadline: Instant,
        timeout: Duration,
    ) -> Waiter {
        Waiter {
            rx,
            access,
            give_up_at: deadline + REPLY_MARGIN,
            timeout,
            tx: self.tx.clone(),
            waker: self.waker.clone(),
        }
    }
}

impl Communicator {
    /// What submits calls to this communicator's progress thread.
    pub(crate) fn submitter(&self) -> Submitter {
        Submitter {
            tx: self.tx.clone(),
            waker: self.waker.clone(),
            shared: self.shared.clone(),
            default_timeout: self.collective_timeout(),
        }
    }

    /// Hand `call` over, to finish within `timeout` of now (the configured collective timeout
    /// when `None`): to the progress thread, or to the host lane when the call runs in
    /// segments or the lane still has calls to hand over before it (`segmented.rs`).
    pub(crate) fn submit(&self, call: crate::comm::Call, timeout: Option<Duration>) -> Result<Waiter, CommError> {
        self.submit_ordered(call, timeout)
    }
}

/// A collective started with [`Communicator::start`] on owned buffers.
pub struct Handle {
    waiter: Waiter,
    /// The reply, once [`Handle::is_done`] has seen it.
    done: Option<Reply>,
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle").field("timeout", &self.waiter.timeout).finish_non_exhaustive()
    }
}

impl Handle {
    pub(crate) const fn new(waiter: Waiter) -> Self {
        Self { waiter, done: None }
    }

    /// Wait for completion: the output buffer and the report. Returns by the deadline given
    /// at the start (plus a few seconds' margin should the progress thread not answer, in
    /// which case the communicator is aborted).
    pub fn wait(self) -> Result<(Vec<u8>, CollReport), CommError> {
        match self.done {
            Some(r) => r,
            None => self.waiter.wait(),
        }
    }

    /// Whether the collective has finished (then [`Handle::wait`] returns at once), without
    /// waiting.
    pub fn is_done(&mut self) -> bool {
        if self.done.is_none() {
            self.done = self.waiter.try_take();
        }
        self.done.is_some()
    }
}
