//! Non-blocking calls over borrowed memory: [`Communicator::scope`] and its [`Pending`] calls.
//!
//! Invariant: a scope returns only after every call started in it has finished or failed
//! (a guard's `Drop` waits for them, panics included), so the memory those calls borrow outlives
//! them, whatever the caller does with the [`Pending`] handles.

use crate::buffers::{RecvBuf, SendBuf};
use crate::call::Waiter;
use crate::comm::{Call, Communicator};
use crate::error::CommError;
use crate::report::CollReport;
use crate::typed::{typed_collectives, Sizes};
use r2ccl_algo::Collective;
use r2ccl_core::{Element, Rank, ReduceOp};
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, PoisonError};

/// Where a pending call stands.
enum Slot {
    Waiting(Waiter),
    Done(Result<CollReport, CommError>),
    Taken,
}

/// The calls of one [`Communicator::scope`]; they run one after another, in the order
/// they were started (on every rank the same order), while the caller goes on.
pub struct Scope<'scope, 'env: 'scope> {
    comm: &'env Communicator,
    pending: Arc<Mutex<Vec<Arc<Mutex<Slot>>>>>,
    _scope: PhantomData<&'scope mut &'scope ()>,
    _env: PhantomData<&'env mut &'env ()>,
}

impl std::fmt::Debug for Scope<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scope").field("comm", self.comm).finish_non_exhaustive()
    }
}

/// A call started in a [`Scope`]: wait for it, or let the scope do so at its end.
#[must_use = "a pending call is waited for at the end of its scope; wait() to see its result"]
pub struct Pending<'scope> {
    slot: Arc<Mutex<Slot>>,
    /// Borrows the scope; not `Send`, so it is waited for on the scope's thread.
    _scope: PhantomData<(&'scope (), *const ())>,
}

impl std::fmt::Debug for Pending<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending").finish_non_exhaustive()
    }
}

fn lock(slot: &Mutex<Slot>) -> std::sync::MutexGuard<'_, Slot> {
    slot.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Pending<'_> {
    /// Wait for the call: its report, or why it failed. Returns by the call's deadline.
    pub fn wait(self) -> Result<CollReport, CommError> {
        let taken = std::mem::replace(&mut *lock(&self.slot), Slot::Taken);
        match taken {
            Slot::Waiting(w) => w.wait().map(|(_, r)| r),
            Slot::Done(r) => r,
            Slot::Taken => Err(CommError::Invalid("this call was already waited for".into())),
        }
    }

    /// Whether the call has finished (then [`Pending::wait`] returns at once), without waiting.
    pub fn is_done(&self) -> bool {
        let mut slot = lock(&self.slot);
        if let Slot::Waiting(w) = &*slot {
            if let Some(r) = w.try_take() {
                *slot = Slot::Done(r.map(|(_, report)| report));
            }
        }
        !matches!(*slot, Slot::Waiting(_))
    }
}

impl Communicator {
    /// Start calls that run while the caller goes on, on memory borrowed for the scope (like
    /// [`std::thread::scope`]): `f` starts them on the [`Scope`] (the same typed collectives as
    /// the blocking ones, each returning a [`Pending`]), and `scope` returns after every one of
    /// them has finished or failed, each by its deadline.
    ///
    /// ```no_run
    /// # fn demo(comm: &r2ccl::Communicator) -> Result<(), r2ccl::CommError> {
    /// use r2ccl::ReduceOp;
    /// let (grads, mut sums) = (vec![1.0f32; 1 << 20], vec![0.0f32; 1 << 20]);
    /// let mut flags = [1u32];
    /// comm.scope(|s| -> Result<(), r2ccl::CommError> {
    ///     let big = s.all_reduce(&grads, &mut sums, ReduceOp::Sum)?;
    ///     let small = s.all_reduce_in_place(&mut flags, ReduceOp::Max)?;
    ///     // ... work that overlaps the two collectives ...
    ///     big.wait()?;
    ///     small.wait()?;
    ///     Ok(())
    /// })?;
    /// # Ok(()) }
    /// ```
    pub fn scope<'env, F, T>(&'env self, f: F) -> T
    where
        F: for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> T,
    {
        // Waits for every call when dropped: after `f` returns, and also when it panics.
        let guard = WaitAll(Arc::default());
        let scope = Scope { comm: self, pending: guard.0.clone(), _scope: PhantomData, _env: PhantomData };
        f(&scope)
    }
}

impl<'scope> Scope<'scope, '_> {
    fn comm(&self) -> &Communicator {
        self.comm
    }

    /// Hand a checked call over; the scope keeps it to wait for at its end.
    fn finish(&'scope self, call: Call) -> Result<Pending<'scope>, CommError> {
        let waiter = self.comm.submit(call, None)?;
        let slot = Arc::new(Mutex::new(Slot::Waiting(waiter)));
        self.pending.lock().unwrap_or_else(PoisonError::into_inner).push(slot.clone());
        Ok(Pending { slot, _scope: PhantomData })
    }

    typed_collectives!('scope, Pending<'scope>);
}

/// Waits for the calls of a scope.
struct WaitAll(Arc<Mutex<Vec<Arc<Mutex<Slot>>>>>);

impl Drop for WaitAll {
    fn drop(&mut self) {
        let slots = std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner));
        for slot in slots {
            let taken = std::mem::replace(&mut *lock(&slot), Slot::Taken);
            if let Slot::Waiting(w) = taken {
                let _ = w.wait();
            }
        }
    }
}
