//! `--device cuda` (feature `cuda`): the benchmark's buffers in GPU memory, each collective
//! enqueued on a stream of the rank's GPU (local rank modulo the device count; several ranks
//! may share one) and timed until that stream has run past it.

use anyhow::{bail, Context, Result};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use r2ccl::device::cuda::{CudaDevice, CudaStreamRef};
use r2ccl::device::{DeviceP2p, DeviceReport, Stream};
use r2ccl::{Collective, Communicator, DType, Rank};
use std::sync::Arc;

/// This rank's GPU and the stream its collectives run on.
pub struct Gpu {
    device: Arc<CudaDevice>,
    stream: Arc<CudaStream>,
    /// Which GPU, for the header.
    pub ordinal: usize,
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
        Ok(Self { device, stream, ordinal })
    }

    /// The GPU's name.
    pub fn name(&self) -> String {
        self.device.context().name().unwrap_or_else(|_| "?".into())
    }
}

/// One case's device buffers: the send buffer (none in place) and the receive buffer (in
/// place: the one buffer, holding the larger of the two).
pub struct DeviceBufs {
    send: Option<CudaSlice<u8>>,
    recv: CudaSlice<u8>,
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

    /// The receive buffer's bytes.
    pub fn read(&self, gpu: &Gpu) -> Result<Vec<u8>> {
        let v = gpu.stream.clone_dtoh(&self.recv).context("copy the output back")?;
        gpu.stream.synchronize().context("cuStreamSynchronize")?;
        Ok(v)
    }
}
