//! Device (GPU) buffers: collectives and grouped send/recv on device memory, ordered on the
//! caller's stream like NCCL's, staged through page-locked host memory the transport has
//! registered.
//!
//! What it does: a device call returns once its work is enqueued on the stream; the caller's
//! later work on that stream sees the result; the host waits only through the
//! [`DeviceHandle`] or a stream sync. Under it, the call is cut into segments of at most a
//! quarter of `transport.device_staging_bytes`; for each, the stream copies the device bytes
//! into a staging slot and sets a host-mapped flag, this communicator's staging worker (a
//! thread) sees the flag, runs the host collective in place on the slot (exactly the host
//! path: the same plans, kernels, failover and deadlines, so results are bit-identical to it),
//! and sets another flag the stream waits on before copying the result back. Four slots let
//! the copies of the next and the previous segments overlap the network of the current one.
//! Where the device cannot wait on host-mapped flags it falls back to a blocking mode (each
//! segment synchronizes the stream on the caller's thread) and logs so once.
//!
//! What it does not do: no GPUDirect and no NVLink kernels (ranks on one node exchange through
//! host memory); it reduces on the host, with the host kernels. The driver seam is
//! [`Device`] and [`Stream`]: the `cuda` feature implements them with cudarc
//! (`device::cuda`), and [`mock`] implements them on host memory for tests without a GPU.
//!
//! # Example
//!
//! Two ranks as threads, each with a mock device whose stream runs on a thread of its own:
//!
//! ```
//! use r2ccl::device::mock::{MockBuffer, MockDevice};
//! use r2ccl::device::Stream;
//! use r2ccl::{Collective, Communicator, DType, Rank, ReduceOp, Root};
//!
//! fn rank(r: u32, id: r2ccl::UniqueId, root: Option<Root>) -> Result<Vec<u8>, r2ccl::CommError> {
//!     let comm = Communicator::builder(Rank(r), 2, id).node(format!("n{r}")).nics(["lo"]).root(root).init()?;
//!     let device = MockDevice::new(true);
//!     let stream = device.stream();
//!     let buf = MockBuffer::from_bytes(&[r as u8 + 1; 64]);
//!     let all_reduce = Collective::AllReduce { op: ReduceOp::Sum };
//!     // SAFETY: `buf` outlives the stream's work (synchronized below) and nothing else uses it.
//!     let handle = unsafe { comm.start_device(&device, &stream, all_reduce, DType::U8, 64, buf.addr(), buf.addr(), None)? };
//!     handle.wait()?;
//!     stream.synchronize().map_err(r2ccl::CommError::from)?;
//!     comm.finalize()?;
//!     Ok(buf.to_vec())
//! }
//! let root = Root::create([127, 0, 0, 1].into())?;
//! let id = root.unique_id()?;
//! let peer = std::thread::spawn({
//!     let id = id.clone();
//!     move || rank(1, id, None)
//! });
//! assert_eq!(rank(0, id, Some(root))?, vec![3u8; 64]);
//! assert_eq!(peer.join().expect("rank 1")?, vec![3u8; 64]);
//! # Ok::<(), r2ccl::CommError>(())
//! ```

mod api;
#[cfg(feature = "cuda")]
pub mod cuda;
mod lane;
pub mod mock;
pub(crate) mod segments;

pub use api::{DeviceHandle, DeviceP2p, DeviceReport};
pub(crate) use lane::{alloc as alloc_registered, Lane};

use std::sync::Arc;

/// Why a device operation failed. No driver, no device, out of memory and an illegal address
/// are named; other driver errors carry the call and the driver's code and name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// The CUDA driver library could not be loaded (a machine without the NVIDIA driver).
    #[error("no CUDA driver library on this machine ({looked}); device buffers need the NVIDIA driver")]
    NoDriver {
        /// What was looked for.
        looked: String,
    },
    /// The driver sees no device of that ordinal.
    #[error("no CUDA device {ordinal}: the driver sees {count}")]
    NoDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// How many devices the driver sees.
        count: usize,
    },
    /// Device or page-locked host memory ran out.
    #[error("out of memory in {call}")]
    OutOfMemory {
        /// The driver call.
        call: &'static str,
    },
    /// A kernel or copy touched memory it does not own; the context is unusable from now on.
    #[error("illegal device address seen by {call} (the CUDA context is unusable from now on)")]
    IllegalAddress {
        /// The driver call.
        call: &'static str,
    },
    /// Another driver error.
    #[error("{call} failed: {name} (CUresult {code})")]
    Driver {
        /// The driver call.
        call: &'static str,
        /// The driver's error code.
        code: i32,
        /// The driver's name for it.
        name: String,
    },
    /// The device cannot do what the call needs.
    #[error("{0}")]
    Unsupported(String),
}

/// One device (a CUDA context): page-locks host memory for it. Implementations: `cuda`'s
/// `CudaDevice`, [`mock::MockDevice`].
pub trait Device: Send + Sync + std::fmt::Debug + 'static {
    /// Tells devices apart (a CUDA context's address): a communicator stages for one device.
    fn id(&self) -> u64;
    /// Whether its streams can wait on and write host-mapped 32-bit flags (`cuStreamWaitValue32`);
    /// without, device calls run in blocking mode.
    fn stream_memops(&self) -> bool;
    /// Page-lock `len` bytes at `ptr` and map them for the device; the device address of `ptr`.
    ///
    /// # Safety
    ///
    /// `ptr..ptr + len` is mapped memory that stays mapped until [`Device::unpin`].
    unsafe fn pin(&self, ptr: *mut u8, len: usize) -> Result<u64, DeviceError>;
    /// Undo [`Device::pin`].
    ///
    /// # Safety
    ///
    /// `ptr` was pinned, and no stream work still uses it.
    unsafe fn unpin(&self, ptr: *mut u8) -> Result<(), DeviceError>;
    /// Allocate `len` bytes of page-locked host memory (zeroed), for staging where the
    /// transport's registered memory cannot be pinned.
    fn alloc_pinned(&self, len: usize) -> Result<*mut u8, DeviceError>;
    /// Free what [`Device::alloc_pinned`] gave.
    ///
    /// # Safety
    ///
    /// `ptr` came from `alloc_pinned(len)`, and no stream work still uses it.
    unsafe fn free_pinned(&self, ptr: *mut u8, len: usize);
}

/// A stream of one [`Device`]: work enqueued on it runs in order, after the caller's earlier
/// work and before its later work.
pub trait Stream: std::fmt::Debug {
    /// Which device it belongs to ([`Device::id`]).
    fn device_id(&self) -> u64;
    /// Enqueue a copy of `len` bytes from device address `src` to pinned host memory `dst`.
    ///
    /// # Safety
    ///
    /// Both ranges stay valid until the stream has run the copy.
    unsafe fn copy_to_host(&self, src: u64, dst: *mut u8, len: usize) -> Result<(), DeviceError>;
    /// Enqueue a copy of `len` bytes from pinned host memory `src` to device address `dst`.
    ///
    /// # Safety
    ///
    /// Both ranges stay valid until the stream has run the copy.
    unsafe fn copy_to_device(&self, src: *const u8, dst: u64, len: usize) -> Result<(), DeviceError>;
    /// Enqueue a write of `value` to the 32-bit flag at device address `flag`, after the work
    /// before it (its writes visible first).
    ///
    /// # Safety
    ///
    /// `flag` is a pinned, device-mapped `u32` that outlives the stream's work.
    unsafe fn write_flag(&self, flag: u64, value: u32) -> Result<(), DeviceError>;
    /// Enqueue a wait: later work starts once the flag at `flag` has reached `value`, compared
    /// cyclically (`(flag - value) as i32 >= 0`).
    ///
    /// # Safety
    ///
    /// As [`Stream::write_flag`].
    unsafe fn wait_flag(&self, flag: u64, value: u32) -> Result<(), DeviceError>;
    /// Block until everything enqueued so far has run.
    fn synchronize(&self) -> Result<(), DeviceError>;
}

/// Whether cyclic counter `value` has reached `target` (as [`Stream::wait_flag`] compares).
pub(crate) const fn reached(value: u32, target: u32) -> bool {
    (value.wrapping_sub(target) as i32) >= 0
}

/// A shared device, as the calls take it.
pub type SharedDevice = Arc<dyn Device>;
