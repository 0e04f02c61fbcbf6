//! `--device cuda` (feature `cuda`): the benchmark's buffers in GPU memory, each collective
//! enqueued on a stream of the rank's GPU (local rank modulo the device count; several ranks
//! may share one) and timed until that stream has run past it.

use anyhow::{anyhow, bail, Context, Result};
use cudarc::driver::sys;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use r2ccl::device::cuda::{CudaDevice, CudaStreamRef};
use r2ccl::device::{DeviceP2p, DeviceReport, Stream};
use r2ccl::{Collective, Communicator, DType, Rank};
use std::sync::Arc;

/// The result check that runs on the device, on the collective's stream: counts the elements
/// whose bytes differ from the expected ones (PTX for sm_80 and later, checked with `ptxas`).
const COUNT_WRONG_PTX: &str = include_str!("count_wrong.ptx");

/// This rank's GPU and the stream its collectives run on.
pub struct Gpu {
    device: Arc<CudaDevice>,
    stream: Arc<CudaStream>,
    /// Which GPU, for the header.
    pub ordinal: usize,
    /// The check kernel, or why it could not be loaded (results are then checked on the host).
    check: Result<sys::CUfunction, String>,
}

impl Gpu {
    /// GPU `local_rank % count`, with a new stream.
    pub fn open(local_rank: usize) -> Result<Self> {
        let count = CudaDevice::count()?;
        if count == 0 {
            bail!("--device cuda: the driver sees no GPU");
        }
        let ordinal = local_rank % count;
        let device = CudaDevice::new(ordinal)?;
        let stream = device.context().new_stream().context("cuStreamCreate")?;
        let check = load_check(&device);
        if let Err(e) = &check {
            eprintln!(
                "r2ccl-perf: NOTE: the device-side result check is unavailable ({e}); results are checked on the host"
            );
        }
        Ok(Self { device, stream, ordinal, check })
    }

    /// Whether results are checked on the device.
    pub fn checks_on_device(&self) -> bool {
        self.check.is_ok()
    }

    /// The GPU's name.
    pub fn name(&self) -> String {
        self.device.context().name().unwrap_or_else(|_| "?".into())
    }
}

/// Load the check kernel into the device's context.
fn load_check(device: &CudaDevice) -> Result<sys::CUfunction, String> {
    device.context().bind_to_thread().map_err(|e| e.to_string())?;
    let ptx = std::ffi::CString::new(COUNT_WRONG_PTX).map_err(|e| e.to_string())?;
    let mut module = std::ptr::null_mut();
    // SAFETY: a NUL-terminated PTX image; the module stays loaded for the process's life.
    let r = unsafe { sys::cuModuleLoadData(&mut module, ptx.as_ptr().cast()) };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(format!("cuModuleLoadData: {r:?}"));
    }
    let mut f = std::ptr::null_mut();
    // SAFETY: `module` was loaded above; the name is NUL-terminated.
    let r = unsafe { sys::cuModuleGetFunction(&mut f, module, c"r2ccl_count_wrong".as_ptr()) };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(format!("cuModuleGetFunction: {r:?}"));
    }
    Ok(f)
}

/// One case's device buffers: the send buffer (none in place) and the receive buffer (in
/// place: the one buffer, holding the larger of the two).
pub struct DeviceBufs {
    send: Option<CudaSlice<u8>>,
    recv: CudaSlice<u8>,
}

/// What the device-side check compares: the expected bytes and the counter it adds to.
pub struct DeviceCheck {
    want: CudaSlice<u8>,
    counter: CudaSlice<u32>,
}

impl DeviceCheck {
    /// The expected result `want`, on the device.
    pub fn new(gpu: &Gpu, want: &[u8]) -> Result<Self> {
        let want = gpu.stream.clone_htod(want).context("copy the expected result")?;
        let counter = gpu.stream.alloc_zeros::<u32>(1).context("allocate the check's counter")?;
        Ok(Self { want, counter })
    }
}

impl DeviceBufs {
    /// Copy `input` (not in place) and `out_init` to new device buffers.
    pub fn new(gpu: &Gpu, input: &[u8], out_init: &[u8], in_place: bool) -> Result<Self> {
        let send = if in_place { None } else { Some(gpu.stream.clone_htod(input).context("copy the input")?) };
        let recv = gpu.stream.clone_htod(out_init).context("copy the output")?;
        gpu.stream.synchronize().context("cuStreamSynchronize")?;
        Ok(Self { send, recv })
    }

    /// Reset the receive buffer to `init`.
    pub fn reset(&mut self, gpu: &Gpu, init: &[u8]) -> Result<()> {
        gpu.stream.memcpy_htod(init, &mut self.recv).context("reset the output")?;
        Ok(())
    }

    /// One collective, enqueued and waited for (its network part, then the stream).
    pub fn run(
        &mut self,
        gpu: &Gpu,
        comm: &Communicator,
        coll: Collective,
        dtype: DType,
        count: u64,
    ) -> Result<DeviceReport> {
        let sref = CudaStreamRef::new(&gpu.stream)?;
        let (r, _w) = self.recv.device_ptr_mut(&gpu.stream);
        let s = match &self.send {
            Some(s) => s.device_ptr(&gpu.stream).0,
            None => r,
        };
        // SAFETY: both buffers hold the sizes `case` computed for this collective and live until
        // the stream has run past it (synchronized below).
        let h = unsafe { comm.start_device(&gpu.device, &sref, coll, dtype, count, s, r, None) }?;
        let report = h.wait()?;
        sref.synchronize()?;
        Ok(report)
    }

    /// nccl-tests' sendrecv step on the device: to the next rank, from the previous one.
    pub fn ring_sendrecv(&mut self, gpu: &Gpu, comm: &Communicator, dtype: DType) -> Result<DeviceReport> {
        let (rank, world) = (comm.rank().0, comm.world());
        let sref = CudaStreamRef::new(&gpu.stream)?;
        let count = (self.recv.len() / dtype.size()) as u64;
        let (r, _w) = self.recv.device_ptr_mut(&gpu.stream);
        let s = match &self.send {
            Some(s) => s.device_ptr(&gpu.stream).0,
            None => r,
        };
        let ops = [
            DeviceP2p::Send { peer: Rank((rank + 1) % world), addr: s, count },
            DeviceP2p::Recv { peer: Rank((rank + world - 1) % world), addr: r, count },
        ];
        // SAFETY: as `run`.
        let h = unsafe { comm.start_device_group(&gpu.device, &sref, dtype, &ops, None) }?;
        let report = h.wait()?;
        sref.synchronize()?;
        Ok(report)
    }

    /// Run one collective and check its result with a kernel on the same stream, with no host
    /// sync between them: the elements of `esize` bytes at byte `offset` of the receive buffer
    /// that differ from `check`'s; `None` when the kernel is unavailable (check on the host).
    pub fn run_checked(
        &mut self,
        gpu: &Gpu,
        comm: &Communicator,
        coll: Option<Collective>,
        dtype: DType,
        count: u64,
        (offset, check): (usize, &mut DeviceCheck),
    ) -> Result<Option<u64>> {
        let Ok(f) = gpu.check else { return Ok(None) };
        let sref = CudaStreamRef::new(&gpu.stream)?;
        let n_recv = (self.recv.len() / dtype.size()) as u64;
        let handle = {
            let (r, _w) = self.recv.device_ptr_mut(&gpu.stream);
            let s = match &self.send {
                Some(s) => s.device_ptr(&gpu.stream).0,
                None => r,
            };
            match coll {
                // SAFETY: as `run`.
                Some(coll) => unsafe { comm.start_device(&gpu.device, &sref, coll, dtype, count, s, r, None) }?,
                None => {
                    let (rank, world) = (comm.rank().0, comm.world());
                    let ops = [
                        DeviceP2p::Send { peer: Rank((rank + 1) % world), addr: s, count: n_recv },
                        DeviceP2p::Recv { peer: Rank((rank + world - 1) % world), addr: r, count: n_recv },
                    ];
                    // SAFETY: as `run`.
                    unsafe { comm.start_device_group(&gpu.device, &sref, dtype, &ops, None) }?
                }
            }
        };
        gpu.stream.memset_zeros(&mut check.counter).context("reset the check's counter")?;
        let esize = dtype.size() as u64;
        let n = check.want.len() as u64 / esize;
        {
            let (got, _r) = self.recv.device_ptr(&gpu.stream);
            let (want, _w) = check.want.device_ptr(&gpu.stream);
            let (counter, _c) = check.counter.device_ptr_mut(&gpu.stream);
            let mut params = [got + offset as u64, want, n, esize, counter];
            let mut args: Vec<*mut std::ffi::c_void> = params.iter_mut().map(|p| (p as *mut u64).cast()).collect();
            // SAFETY: the kernel takes five u64 parameters, given in order; every pointer is a
            // live device allocation of at least the bytes the kernel reads (`n` elements at
            // `offset` of the receive buffer, all of `want`) or writes (one u32).
            let r = unsafe {
                sys::cuLaunchKernel(
                    f,
                    256,
                    1,
                    1,
                    256,
                    1,
                    1,
                    0,
                    gpu.stream.cu_stream(),
                    args.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            };
            if r != sys::CUresult::CUDA_SUCCESS {
                bail!("cuLaunchKernel (the result check): {r:?}");
            }
        }
        handle.wait()?;
        let wrong = gpu.stream.clone_dtoh(&check.counter).context("read the check's counter")?;
        gpu.stream.synchronize().context("cuStreamSynchronize")?;
        wrong.first().map(|&w| Some(u64::from(w))).ok_or_else(|| anyhow!("the check's counter is empty"))
    }

    /// The receive buffer's bytes.
    pub fn read(&self, gpu: &Gpu) -> Result<Vec<u8>> {
        let v = gpu.stream.clone_dtoh(&self.recv).context("copy the output back")?;
        gpu.stream.synchronize().context("cuStreamSynchronize")?;
        Ok(v)
    }
}
