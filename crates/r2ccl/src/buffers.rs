//! Caller memory: [`CommBuf`] (registered with every NIC, read and written in place) and the
//! [`SendBuf`]/[`RecvBuf`] traits the typed calls take (slices, vectors, arrays, `CommBuf`s).

use crate::comm::{Communicator, Req, Shared};
use crate::error::CommError;
use crate::wake::Waker;
use crossbeam_channel::Sender;
use r2ccl_core::Element;
use r2ccl_transport::MemHandle;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

/// Memory registered with every NIC of this rank ([`Communicator::alloc`], NCCL's
/// `ncclMemAlloc` with its buffer registration): collectives on it read and write it where it
/// is, with no copy into the library's workspace or out of it (when every buffer of the call is
/// a `CommBuf` of the same communicator; mixed with plain memory it is copied like plain memory).
/// It derefs to `count` elements of `T`, zeroed at first, and is freed when dropped.
pub struct CommBuf<'c, T: Element = u8> {
    handle: MemHandle,
    ptr: *mut T,
    count: usize,
    /// Keeps the mapping alive whatever the progress thread does.
    _region: Arc<r2ccl_ucx::MemRegion>,
    /// Which communicator registered it.
    owner: Arc<Shared>,
    tx: Sender<Req>,
    waker: Waker,
    _comm: PhantomData<&'c Communicator>,
}

// SAFETY: the buffer owns its mapping (kept alive by `_region`) like a `Vec<T>` owns its heap
// memory; `T: Send + Sync` (an `Element` bound), and the sender and waker are thread-safe.
unsafe impl<T: Element> Send for CommBuf<'_, T> {}
// SAFETY: as `Send`; shared access only reads.
unsafe impl<T: Element> Sync for CommBuf<'_, T> {}

impl<T: Element> std::fmt::Debug for CommBuf<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommBuf").field("handle", &self.handle).field("count", &self.count).finish()
    }
}

impl<T: Element> std::ops::Deref for CommBuf<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `_region` keeps the `count` elements at `ptr` (aligned, checked in `alloc`)
        // mapped and initialised (zeroed, and `T` is `Pod`); the library touches them only during
        // a call, which borrows this buffer for its whole duration.
        unsafe { std::slice::from_raw_parts(self.ptr, self.count) }
    }
}

impl<T: Element> std::ops::DerefMut for CommBuf<'_, T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`; `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.count) }
    }
}

impl<T: Element> Drop for CommBuf<'_, T> {
    fn drop(&mut self) {
        // Raw-pointer calls stop finding it; the region leaves the transport; its memory goes
        // with the last `Arc`.
        self.owner.unregistered(self.ptr as usize);
        let _ = self.tx.send(Req::Free(self.handle));
        self.waker.wake();
    }
}

impl<T: Element> CommBuf<'_, T> {
    /// Its registration and length in bytes, for a call on communicator `owner`.
    pub(crate) fn registration(&self, owner: &Arc<Shared>) -> Result<(MemHandle, usize), CommError> {
        if Arc::ptr_eq(&self.owner, owner) {
            Ok((self.handle, std::mem::size_of_val::<[T]>(self)))
        } else {
            Err(CommError::Invalid("a registered buffer of another communicator".into()))
        }
    }
}

impl Communicator {
    /// Register `count` zeroed elements of `T` with every NIC of this rank, for calls that read
    /// and write them in place.
    pub fn alloc<T: Element>(&self, count: usize) -> Result<CommBuf<'_, T>, CommError> {
        self.alloc_any(count)
    }

    /// As [`Communicator::alloc`], for a binding that keeps the buffer beside its communicator
    /// instead of borrowing it (the Python package's `Communicator.alloc`). The memory stays valid
    /// until the buffer drops; once the communicator is gone, calls on the buffer fail with an
    /// error. A raw-pointer call ([`Communicator::start_raw`]) whose buffers each start at a live
    /// registered buffer of this communicator, as long as the call needs or longer, runs on it
    /// in place too.
    pub fn alloc_owned<T: Element>(&self, count: usize) -> Result<CommBuf<'static, T>, CommError> {
        self.alloc_any(count)
    }

    fn alloc_any<'a, T: Element>(&self, count: usize) -> Result<CommBuf<'a, T>, CommError> {
        let len = count
            .checked_mul(std::mem::size_of::<T>())
            .ok_or_else(|| CommError::Invalid(format!("{count} elements of {} overflow", T::DTYPE)))?;
        let (reply, rx) = crossbeam_channel::bounded(1);
        self.tx
            .send(Req::Alloc { len, reply })
            .map_err(|_| CommError::Aborted("the progress thread is gone".into()))?;
        self.waker.wake();
        let (handle, ptr, region) = rx
            .recv_timeout(Duration::from_secs(30))
            .map_err(|_| CommError::Aborted("the progress thread did not answer an allocation".into()))??;
        let buf = CommBuf {
            handle,
            ptr: ptr as *mut T,
            count,
            _region: region,
            owner: self.shared.clone(),
            tx: self.tx.clone(),
            waker: self.waker.clone(),
            _comm: PhantomData,
        };
        if ptr % std::mem::align_of::<T>() != 0 {
            return Err(CommError::Invalid(format!("registered memory at {ptr:#x} is not aligned for {}", T::DTYPE)));
        }
        self.shared.registered(ptr, len, handle);
        Ok(buf)
    }
}

pub(crate) mod sealed {
    use super::{CommBuf, Element, MemHandle, Shared};
    use crate::error::CommError;
    use std::sync::Arc;

    /// Where a buffer's elements are, and its registration when it has one.
    #[derive(Clone, Copy, Debug)]
    pub struct View {
        pub(crate) ptr: *mut u8,
        /// Length in elements.
        pub(crate) count: usize,
        /// Length in bytes.
        pub(crate) bytes: usize,
        /// Registered memory: it must belong to the calling communicator.
        pub(crate) registered: Option<(MemHandle, *const ())>,
    }

    impl View {
        fn plain<T: Element>(s: &[T]) -> Self {
            Self { ptr: s.as_ptr() as *mut u8, count: s.len(), bytes: std::mem::size_of_val(s), registered: None }
        }

        /// The registration if the buffer is registered with `owner`'s communicator (an error
        /// when it is registered with another).
        pub(crate) fn registration(&self, owner: &Arc<Shared>) -> Result<Option<MemHandle>, CommError> {
            match self.registered {
                None => Ok(None),
                Some((h, o)) if std::ptr::eq(o, Arc::as_ptr(owner).cast()) => Ok(Some(h)),
                Some(_) => Err(CommError::Invalid("a registered buffer of another communicator".into())),
            }
        }
    }

    /// The sealed part of [`super::SendBuf`].
    pub trait Viewable {
        /// Where the elements are.
        fn view(&self) -> View;
    }

    impl<T: Element> Viewable for [T] {
        fn view(&self) -> View {
            View::plain(self)
        }
    }
    impl<T: Element> Viewable for Vec<T> {
        fn view(&self) -> View {
            View::plain(self)
        }
    }
    impl<T: Element, const N: usize> Viewable for [T; N] {
        fn view(&self) -> View {
            View::plain(self)
        }
    }
    impl<T: Element> Viewable for CommBuf<'_, T> {
        fn view(&self) -> View {
            let mut v = View::plain(self);
            v.registered = Some((self.handle, Arc::as_ptr(&self.owner).cast()));
            v
        }
    }
    impl<S: Viewable + ?Sized> Viewable for &S {
        fn view(&self) -> View {
            (**self).view()
        }
    }
    impl<S: Viewable + ?Sized> Viewable for &mut S {
        fn view(&self) -> View {
            (**self).view()
        }
    }
}

/// Memory a call reads: `[T]`, `Vec<T>`, `[T; N]`, a [`CommBuf<T>`], or a reference to one, for
/// any element type `T` ([`r2ccl_core::Element`]: `f32`, `f64`, `f16`, `bf16`, `i8`, `u8`, `i32`,
/// `u32`, `i64`, `u64`). Sealed.
pub trait SendBuf: sealed::Viewable {
    /// The element type.
    type Elem: Element;
}

/// Memory a call writes (and reads, in place). Sealed.
pub trait RecvBuf: SendBuf {}

impl<T: Element> SendBuf for [T] {
    type Elem = T;
}
impl<T: Element> SendBuf for Vec<T> {
    type Elem = T;
}
impl<T: Element, const N: usize> SendBuf for [T; N] {
    type Elem = T;
}
impl<T: Element> SendBuf for CommBuf<'_, T> {
    type Elem = T;
}
impl<S: SendBuf + ?Sized> SendBuf for &S {
    type Elem = S::Elem;
}
impl<S: SendBuf + ?Sized> SendBuf for &mut S {
    type Elem = S::Elem;
}
impl<T: Element> RecvBuf for [T] {}
impl<T: Element> RecvBuf for Vec<T> {}
impl<T: Element, const N: usize> RecvBuf for [T; N] {}
impl<T: Element> RecvBuf for CommBuf<'_, T> {}
impl<R: RecvBuf + ?Sized> RecvBuf for &mut R {}
