//! CUDA through cudarc's driver API (feature `cuda`): [`CudaDevice`] and [`CudaStreamRef`]
//! implement the staging seam, and the typed calls take cudarc device slices.
//!
//! The driver library is loaded at run time, so building needs no CUDA; [`driver_present`] is
//! checked before any cudarc call (cudarc panics when the library is missing), and no driver,
//! no device, out of memory and an illegal address come back as named [`DeviceError`]s.

use super::{DeviceError, DeviceHandle, DeviceP2p};
use crate::comm::Communicator;
use crate::error::CommError;
use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr};
use r2ccl_algo::Collective;
use r2ccl_core::{Element, Rank};
use std::sync::{Arc, OnceLock};

/// Whether the CUDA driver library can be loaded (cached after the first look).
pub fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to open the library (dlopen), which runs no code of ours.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

fn need_driver() -> Result<(), DeviceError> {
    if driver_present() {
        Ok(())
    } else {
        Err(DeviceError::NoDriver { looked: "libcuda.so (the NVIDIA driver's library) on the loader's path".into() })
    }
}

/// A driver result as a [`DeviceError`], naming `call`.
fn check(call: &'static str, r: CUresult) -> Result<(), DeviceError> {
    match r {
        CUresult::CUDA_SUCCESS => Ok(()),
        CUresult::CUDA_ERROR_OUT_OF_MEMORY => Err(DeviceError::OutOfMemory { call }),
        CUresult::CUDA_ERROR_ILLEGAL_ADDRESS => Err(DeviceError::IllegalAddress { call }),
        CUresult::CUDA_ERROR_NO_DEVICE => Err(DeviceError::NoDevice { ordinal: 0, count: 0 }),
        other => {
            let name = cudarc::driver::DriverError(other)
                .error_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|_| format!("{other:?}"));
            Err(DeviceError::Driver { call, code: other as i32, name })
        }
    }
}

fn from_driver(call: &'static str, e: cudarc::driver::DriverError) -> DeviceError {
    check(call, e.0).err().unwrap_or(DeviceError::Unsupported(format!("{call}: {e}")))
}

/// One CUDA context, as the staging seam's [`super::Device`].
#[derive(Debug)]
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    memops: bool,
}

impl CudaDevice {
    /// The primary context of device `ordinal`. No driver and no such device are named errors.
    pub fn new(ordinal: usize) -> Result<Arc<Self>, DeviceError> {
        need_driver()?;
        let count = CudaContext::device_count().map_err(|e| from_driver("cuDeviceGetCount", e))?;
        let count = usize::try_from(count).unwrap_or(0);
        if ordinal >= count {
            return Err(DeviceError::NoDevice { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| from_driver("cuDevicePrimaryCtxRetain", e))?;
        Self::from_context(ctx)
    }

    /// The device of an existing context (a stream's, a slice's).
    pub fn from_context(ctx: Arc<CudaContext>) -> Result<Arc<Self>, DeviceError> {
        need_driver()?;
        let mut version = 0;
        // SAFETY: writes one int.
        check("cuDriverGetVersion", unsafe { sys::cuDriverGetVersion(&mut version) })?;
        // Stream memory operations are always available from CUDA 12 on.
        Ok(Arc::new(Self { ctx, memops: version >= 12_000 }))
    }

    /// Its context.
    pub const fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// How many devices the driver sees (a named error without a driver).
    pub fn count() -> Result<usize, DeviceError> {
        need_driver()?;
        let n = CudaContext::device_count().map_err(|e| from_driver("cuDeviceGetCount", e))?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    fn bind(&self) -> Result<(), DeviceError> {
        self.ctx.bind_to_thread().map_err(|e| from_driver("cuCtxSetCurrent", e))
    }
}

impl super::Device for CudaDevice {
    fn id(&self) -> u64 {
        self.ctx.cu_ctx() as u64
    }

    fn stream_memops(&self) -> bool {
        self.memops
    }

    unsafe fn pin(&self, ptr: *mut u8, len: usize) -> Result<u64, DeviceError> {
        self.bind()?;
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        // SAFETY: the caller keeps `ptr..ptr + len` mapped until `unpin`.
        check("cuMemHostRegister", unsafe { sys::cuMemHostRegister_v2(ptr.cast(), len, flags) })?;
        let mut dev = 0;
        // SAFETY: `ptr` was registered with DEVICEMAP just above.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, ptr.cast(), 0) };
        if let Err(e) = check("cuMemHostGetDevicePointer", r) {
            // SAFETY: registered above, used by nothing yet.
            let _ = unsafe { sys::cuMemHostUnregister(ptr.cast()) };
            return Err(e);
        }
        Ok(dev)
    }

    unsafe fn unpin(&self, ptr: *mut u8) -> Result<(), DeviceError> {
        self.bind()?;
        // SAFETY: the caller's promise: pinned, and no stream work uses it any more.
        check("cuMemHostUnregister", unsafe { sys::cuMemHostUnregister(ptr.cast()) })
    }

    fn alloc_pinned(&self, len: usize) -> Result<*mut u8, DeviceError> {
        self.bind()?;
        let mut p = std::ptr::null_mut();
        // SAFETY: writes one pointer.
        check("cuMemHostAlloc", unsafe { sys::cuMemHostAlloc(&mut p, len, sys::CU_MEMHOSTALLOC_PORTABLE) })?;
        // SAFETY: `len` bytes just allocated.
        unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0, len) };
        Ok(p.cast())
    }

    unsafe fn free_pinned(&self, ptr: *mut u8, _len: usize) {
        if self.bind().is_ok() {
            // SAFETY: the caller's promise: from `alloc_pinned`, unused by any stream now.
            let _ = unsafe { sys::cuMemFreeHost(ptr.cast()) };
        }
    }
}

/// A CUDA stream, as the staging seam's [`super::Stream`] (borrowed for one call).
#[derive(Debug)]
pub struct CudaStreamRef {
    stream: sys::CUstream,
    device: Arc<CudaDevice>,
}

impl CudaStreamRef {
    /// A cudarc stream.
    pub fn new(stream: &Arc<CudaStream>) -> Result<Self, DeviceError> {
        Ok(Self { stream: stream.cu_stream(), device: CudaDevice::from_context(stream.context().clone())? })
    }

    /// A raw stream handle of `device`'s context (a C ABI's or torch's `cudaStream_t`; null is
    /// the legacy default stream).
    ///
    /// # Safety
    ///
    /// `stream` is a live stream of `device`'s context for as long as this is used.
    pub const unsafe fn from_raw(device: Arc<CudaDevice>, stream: sys::CUstream) -> Self {
        Self { stream, device }
    }

    /// Its device.
    pub const fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }
}

impl super::Stream for CudaStreamRef {
    fn device_id(&self) -> u64 {
        super::Device::id(&*self.device)
    }

    unsafe fn copy_to_host(&self, src: u64, dst: *mut u8, len: usize) -> Result<(), DeviceError> {
        self.device.bind()?;
        // SAFETY: the caller keeps both ranges valid until the stream has run the copy.
        check("cuMemcpyDtoHAsync", unsafe { sys::cuMemcpyDtoHAsync_v2(dst.cast(), src, len, self.stream) })
    }

    unsafe fn copy_to_device(&self, src: *const u8, dst: u64, len: usize) -> Result<(), DeviceError> {
        self.device.bind()?;
        // SAFETY: as `copy_to_host`.
        check("cuMemcpyHtoDAsync", unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), len, self.stream) })
    }

    unsafe fn write_flag(&self, flag: u64, value: u32) -> Result<(), DeviceError> {
        self.device.bind()?;
        // SAFETY: the flag is pinned and device-mapped and outlives the stream's work. Flags 0:
        // the write waits for the work before it, whose writes are visible first.
        check("cuStreamWriteValue32", unsafe { sys::cuStreamWriteValue32_v2(self.stream, flag, value, 0) })
    }

    unsafe fn wait_flag(&self, flag: u64, value: u32) -> Result<(), DeviceError> {
        self.device.bind()?;
        // SAFETY: as `write_flag`. Flags 0: CU_STREAM_WAIT_VALUE_GEQ, compared cyclically.
        check("cuStreamWaitValue32", unsafe { sys::cuStreamWaitValue32_v2(self.stream, flag, value, 0) })
    }

    fn synchronize(&self) -> Result<(), DeviceError> {
        self.device.bind()?;
        // SAFETY: a live stream (the constructor's promise).
        check("cuStreamSynchronize", unsafe { sys::cuStreamSynchronize(self.stream) })
    }
}

/// One operation of [`Communicator::cuda_group`].
#[derive(Debug)]
#[non_exhaustive]
pub enum CudaP2p<'a, T> {
    /// Send all of `data` to `peer`.
    Send {
        /// The receiver.
        peer: Rank,
        /// The elements.
        data: &'a CudaSlice<T>,
    },
    /// Receive into all of `buf` from `peer`.
    Recv {
        /// The sender.
        peer: Rank,
        /// Where the elements go.
        buf: &'a mut CudaSlice<T>,
    },
}

impl Communicator {
    /// A collective on cudarc device slices, ordered on `stream` (the typed form of
    /// [`Communicator::start_device`]): sizes as the host calls' table (`recv` = ranks x `send`
    /// for AllGather, the reverse for ReduceScatter, equal and a multiple of the ranks for
    /// AlltoAll, equal otherwise). Returns once enqueued; keep both slices alive until the
    /// stream has run past the call.
    pub fn cuda_collective<T: Element + DeviceRepr>(
        &self,
        coll: Collective,
        send: &CudaSlice<T>,
        recv: &mut CudaSlice<T>,
        stream: &Arc<CudaStream>,
    ) -> Result<DeviceHandle, CommError> {
        let count = self.device_count_of(coll, send.len(), recv.len())?;
        let sref = CudaStreamRef::new(stream)?;
        let (s, _read) = send.device_ptr(stream);
        let (r, _write) = recv.device_ptr_mut(stream);
        // SAFETY: cudarc slices of the sizes checked above, ordered on `stream` by their guards;
        // the caller keeps them alive until the stream has run the call.
        unsafe { self.start_device(sref.device(), &sref, coll, T::DTYPE, count, s, r, None) }
    }

    /// As [`Communicator::cuda_collective`], in place on `buf` (NCCL's convention: AllGather's
    /// input and ReduceScatter's output are this rank's block of it).
    pub fn cuda_collective_in_place<T: Element + DeviceRepr>(
        &self,
        coll: Collective,
        buf: &mut CudaSlice<T>,
        stream: &Arc<CudaStream>,
    ) -> Result<DeviceHandle, CommError> {
        let n = buf.len();
        let p = self.world as usize;
        let count = match coll {
            Collective::AllGather | Collective::ReduceScatter { .. } | Collective::AlltoAll if !n.is_multiple_of(p) => {
                return Err(CommError::Invalid(format!(
                    "{} in place: {n} elements are not a multiple of the {p} ranks",
                    coll.name()
                )))
            }
            Collective::AllGather | Collective::ReduceScatter { .. } | Collective::AlltoAll => n / p,
            _ => n,
        } as u64;
        let sref = CudaStreamRef::new(stream)?;
        let (b, _write) = buf.device_ptr_mut(stream);
        // SAFETY: as `cuda_collective`.
        unsafe { self.start_device(sref.device(), &sref, coll, T::DTYPE, count, b, b, None) }
    }

    /// Grouped send/recv on cudarc device slices, ordered on `stream` (the typed form of
    /// [`Communicator::start_device_group`]).
    pub fn cuda_group<T: Element + DeviceRepr>(
        &self,
        ops: &mut [CudaP2p<'_, T>],
        stream: &Arc<CudaStream>,
    ) -> Result<DeviceHandle, CommError> {
        let sref = CudaStreamRef::new(stream)?;
        let mut raw = Vec::with_capacity(ops.len());
        let mut guards = Vec::with_capacity(ops.len());
        for op in ops.iter_mut() {
            match op {
                CudaP2p::Send { peer, data } => {
                    let (addr, g) = data.device_ptr(stream);
                    raw.push(DeviceP2p::Send { peer: *peer, addr, count: data.len() as u64 });
                    guards.push(g);
                }
                CudaP2p::Recv { peer, buf } => {
                    let count = buf.len() as u64;
                    let (addr, g) = buf.device_ptr_mut(stream);
                    raw.push(DeviceP2p::Recv { peer: *peer, addr, count });
                    guards.push(g);
                }
            }
        }
        // SAFETY: as `cuda_collective`, for every operation's slice.
        let r = unsafe { self.start_device_group(sref.device(), &sref, T::DTYPE, &raw, None) };
        drop(guards);
        r
    }

    /// Enqueue a collective on raw device pointers and a raw stream of the current context
    /// (the form the C ABI and the Python package call: `cudaStream_t` as from torch).
    ///
    /// # Safety
    ///
    /// As [`Communicator::start_device`]; `stream` is a live stream of the calling thread's
    /// current CUDA context (null: its legacy default stream).
    #[allow(clippy::too_many_arguments, reason = "NCCL's argument list")]
    pub unsafe fn start_cuda_raw(
        &self,
        coll: Collective,
        dtype: r2ccl_core::DType,
        count: u64,
        send: u64,
        recv: u64,
        stream: sys::CUstream,
        timeout: Option<std::time::Duration>,
    ) -> Result<DeviceHandle, CommError> {
        need_driver()?;
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        if stream.is_null() {
            // SAFETY: writes one handle; a null stream names the current context's default stream.
            check("cuCtxGetCurrent", unsafe { sys::cuCtxGetCurrent(&mut ctx) })?;
        } else {
            // SAFETY: writes one handle of the caller's live stream.
            check("cuStreamGetCtx", unsafe { sys::cuStreamGetCtx(stream, &mut ctx) })?;
        }
        if ctx.is_null() {
            return Err(CommError::Invalid("no current CUDA context on this thread".into()));
        }
        let mut dev = 0;
        // SAFETY: `ctx` is live (it came from the driver just now); pushing it makes it current
        // for the one query, popped right after.
        unsafe {
            check("cuCtxPushCurrent", sys::cuCtxPushCurrent_v2(ctx))?;
            let r = sys::cuCtxGetDevice(&mut dev);
            let mut popped = std::ptr::null_mut();
            let _ = sys::cuCtxPopCurrent_v2(&mut popped);
            check("cuCtxGetDevice", r)?;
        }
        let ordinal = usize::try_from(dev).map_err(|_| DeviceError::NoDevice { ordinal: 0, count: 0 })?;
        let device = CudaDevice::new(ordinal)?;
        if device.ctx.cu_ctx() != ctx {
            return Err(CommError::Invalid(
                "the stream's context is not its device's primary context (the one torch and the runtime API use)"
                    .into(),
            ));
        }
        // SAFETY: the caller's promise: a live stream of this context.
        let sref = unsafe { CudaStreamRef::from_raw(device, stream) };
        // SAFETY: forwarded from the caller.
        unsafe { self.start_device(sref.device(), &sref, coll, dtype, count, send, recv, timeout) }
    }

    /// The per-rank `count` of `coll` on buffers of `send` and `recv` elements.
    fn device_count_of(&self, coll: Collective, send: usize, recv: usize) -> Result<u64, CommError> {
        let p = self.world as usize;
        let (ok, count, want) = match coll {
            Collective::AllGather => (recv == send * p, send, "recv = ranks x send"),
            Collective::ReduceScatter { .. } => (send == recv * p, recv, "send = ranks x recv"),
            Collective::AlltoAll => {
                (send == recv && send.is_multiple_of(p), send / p, "equal lengths, a multiple of the ranks")
            }
            _ => (send == recv, send, "equal lengths"),
        };
        if ok {
            Ok(count as u64)
        } else {
            Err(CommError::Invalid(format!(
                "{}: send holds {send} and recv {recv} elements on {p} ranks; it needs {want}",
                coll.name()
            )))
        }
    }
}
