//! A host-memory stand-in for a GPU, for tests and examples on machines without one: "device
//! memory" is host memory ([`MockBuffer`]), and a [`MockStream`] runs its operations in order on
//! a thread of its own, each after a random delay, as a real stream runs them asynchronously.
//!
//! It exercises exactly what the CUDA implementation does through the [`Device`]/[`Stream`]
//! seam: copies enqueued without waiting, flags written and waited on by the stream while the
//! host polls and writes them from other threads. A wait that is never satisfied ends after
//! [`MockStream::STUCK`] with an error that [`Stream::synchronize`] returns, so a test sees a
//! stream left waiting instead of hanging.

use super::{reached, Device, DeviceError, Stream};
use crossbeam_channel::Sender;
use std::cell::UnsafeCell;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A mock device: pinning is the identity (host and device addresses are the same).
#[derive(Debug)]
pub struct MockDevice {
    id: u64,
    memops: bool,
    /// Refuse to pin more than this many bytes (as a driver that cannot page-lock the
    /// transport's memory would): staging falls back to memory of its own.
    pin_limit: usize,
    /// Upper bound of each stream operation's random delay.
    jitter: Duration,
}

impl MockDevice {
    /// A device whose streams can (`memops`) or cannot wait on host-mapped flags (the latter
    /// tests the blocking mode); operations are delayed by up to 200 us each.
    pub fn new(memops: bool) -> Arc<Self> {
        Self::with_jitter(memops, Duration::from_micros(200))
    }

    /// As [`MockDevice::new`], with each stream operation delayed by up to `jitter`.
    pub fn with_jitter(memops: bool, jitter: Duration) -> Arc<Self> {
        Arc::new(Self { id: NEXT_ID.fetch_add(1, Ordering::Relaxed) << 32, memops, jitter, pin_limit: usize::MAX })
    }

    /// A device that pins at most one page at a time (the flags), so that staging must use
    /// memory of its own ([`Device::alloc_pinned`]) rather than the transport's regions.
    pub fn refusing_to_pin_regions(memops: bool) -> Arc<Self> {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed) << 32;
        Arc::new(Self { id, memops, jitter: Duration::from_micros(200), pin_limit: 4096 })
    }

    /// A new stream of this device.
    pub fn stream(&self) -> MockStream {
        MockStream::new(self.id, self.jitter)
    }
}

impl Device for MockDevice {
    fn id(&self) -> u64 {
        self.id
    }

    fn stream_memops(&self) -> bool {
        self.memops
    }

    unsafe fn pin(&self, ptr: *mut u8, len: usize) -> Result<u64, DeviceError> {
        if len > self.pin_limit {
            return Err(DeviceError::Unsupported(format!("mock: will not pin {len} bytes")));
        }
        Ok(ptr as u64)
    }

    unsafe fn unpin(&self, _ptr: *mut u8) -> Result<(), DeviceError> {
        Ok(())
    }

    fn alloc_pinned(&self, len: usize) -> Result<*mut u8, DeviceError> {
        let layout = std::alloc::Layout::from_size_align(len.max(1), 4096)
            .map_err(|e| DeviceError::Unsupported(format!("mock: {e}")))?;
        // SAFETY: a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            Err(DeviceError::OutOfMemory { call: "mock alloc_pinned" })
        } else {
            Ok(p)
        }
    }

    unsafe fn free_pinned(&self, ptr: *mut u8, len: usize) {
        if let Ok(layout) = std::alloc::Layout::from_size_align(len.max(1), 4096) {
            // SAFETY: allocated by `alloc_pinned` with this layout (the caller's promise).
            unsafe { std::alloc::dealloc(ptr, layout) };
        }
    }
}

type Op = Box<dyn FnOnce() -> Result<(), DeviceError> + Send>;

/// Operations enqueued and run, and the first error.
#[derive(Default)]
struct Progress {
    enqueued: u64,
    ran: u64,
    error: Option<DeviceError>,
}

/// A mock stream (see the module doc). Dropping it runs what is enqueued first.
pub struct MockStream {
    device_id: u64,
    tx: Option<Sender<Op>>,
    progress: Arc<(Mutex<Progress>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for MockStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockStream").field("device_id", &self.device_id).finish_non_exhaustive()
    }
}

impl MockStream {
    /// How long a flag wait may stay unsatisfied before the stream gives up with an error.
    pub const STUCK: Duration = Duration::from_secs(60);

    fn new(device_id: u64, jitter: Duration) -> Self {
        let (tx, rx) = crossbeam_channel::unbounded::<Op>();
        let progress = Arc::new((Mutex::new(Progress::default()), Condvar::new()));
        let thread = std::thread::spawn({
            let progress = progress.clone();
            move || {
                let mut rng = std::collections::hash_map::RandomState::new().build_hasher();
                for op in rx {
                    rng.write_u8(0);
                    let delay = jitter.as_nanos() as u64;
                    if delay > 0 {
                        std::thread::sleep(Duration::from_nanos(rng.finish() % delay));
                    }
                    let r = op();
                    let (lock, cv) = &*progress;
                    let mut p = lock.lock().unwrap_or_else(PoisonError::into_inner);
                    p.ran += 1;
                    if let Err(e) = r {
                        p.error.get_or_insert(e);
                    }
                    cv.notify_all();
                }
            }
        });
        Self { device_id, tx: Some(tx), progress, thread: Some(thread) }
    }

    fn push(&self, op: Op) -> Result<(), DeviceError> {
        let (lock, _) = &*self.progress;
        lock.lock().unwrap_or_else(PoisonError::into_inner).enqueued += 1;
        self.tx
            .as_ref()
            .and_then(|tx| tx.send(op).ok())
            .ok_or_else(|| DeviceError::Unsupported("the mock stream's thread is gone".into()))
    }
}

impl Drop for MockStream {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A flag at a "device" address (the same as its host address).
///
/// # Safety
///
/// `addr` is an aligned, live `u32` (the caller's promise in [`Stream::write_flag`]).
unsafe fn flag<'a>(addr: u64) -> &'a AtomicU32 {
    // SAFETY: forwarded from the caller.
    unsafe { &*(addr as *const AtomicU32) }
}

impl Stream for MockStream {
    fn device_id(&self) -> u64 {
        self.device_id
    }

    unsafe fn copy_to_host(&self, src: u64, dst: *mut u8, len: usize) -> Result<(), DeviceError> {
        let dst = dst as usize;
        // SAFETY: both ranges are valid until the stream has run the copy (the caller's promise).
        self.push(Box::new(move || unsafe {
            std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, len);
            Ok(())
        }))
    }

    unsafe fn copy_to_device(&self, src: *const u8, dst: u64, len: usize) -> Result<(), DeviceError> {
        let src = src as usize;
        // SAFETY: as `copy_to_host`.
        self.push(Box::new(move || unsafe {
            std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, len);
            Ok(())
        }))
    }

    unsafe fn write_flag(&self, addr: u64, value: u32) -> Result<(), DeviceError> {
        self.push(Box::new(move || {
            // SAFETY: the flag outlives the stream's work (the caller's promise).
            unsafe { flag(addr) }.store(value, Ordering::Release);
            Ok(())
        }))
    }

    unsafe fn wait_flag(&self, addr: u64, value: u32) -> Result<(), DeviceError> {
        self.push(Box::new(move || {
            let until = Instant::now() + Self::STUCK;
            // SAFETY: as `write_flag`.
            while !reached(unsafe { flag(addr) }.load(Ordering::Acquire), value) {
                if Instant::now() > until {
                    return Err(DeviceError::Unsupported(format!(
                        "mock stream: a flag wait for {value} was not satisfied in {} s",
                        Self::STUCK.as_secs()
                    )));
                }
                std::thread::sleep(Duration::from_micros(10));
            }
            Ok(())
        }))
    }

    fn synchronize(&self) -> Result<(), DeviceError> {
        let (lock, cv) = &*self.progress;
        let mut p = lock.lock().unwrap_or_else(PoisonError::into_inner);
        let target = p.enqueued;
        let until = Instant::now() + Self::STUCK + Duration::from_secs(5);
        while p.ran < target {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(DeviceError::Unsupported("mock stream: synchronize timed out".into()));
            }
            p = cv.wait_timeout(p, left).unwrap_or_else(PoisonError::into_inner).0;
        }
        p.error.clone().map_or(Ok(()), Err)
    }
}

/// Mock "device memory": 8-byte-aligned host memory with a stable address.
pub struct MockBuffer {
    mem: Box<[UnsafeCell<u64>]>,
    len: usize,
}

// SAFETY: the bytes are only touched through raw pointers by a stream and by `to_vec`, which
// callers order with a stream sync (as device memory).
unsafe impl Send for MockBuffer {}
// SAFETY: as `Send`.
unsafe impl Sync for MockBuffer {}

impl std::fmt::Debug for MockBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockBuffer").field("addr", &self.addr()).field("len", &self.len).finish()
    }
}

impl MockBuffer {
    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> Self {
        Self { mem: (0..len.div_ceil(8)).map(|_| UnsafeCell::new(0)).collect(), len }
    }

    /// A copy of `bytes`.
    pub fn from_bytes(bytes: &[u8]) -> Self {
        let b = Self::zeroed(bytes.len());
        // SAFETY: `b` was just made with room for `bytes.len()` bytes, and nothing else uses it.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), b.addr() as *mut u8, bytes.len()) };
        b
    }

    /// Its "device address".
    pub fn addr(&self) -> u64 {
        UnsafeCell::raw_get(self.mem.as_ptr()) as u64
    }

    /// Its length in bytes.
    pub const fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A copy of its bytes. Synchronize the streams that write it first.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.len];
        // SAFETY: `len` bytes at `addr`; no stream writes them now (the documented rule).
        unsafe { std::ptr::copy_nonoverlapping(self.addr() as *const u8, v.as_mut_ptr(), self.len) };
        v
    }
}
