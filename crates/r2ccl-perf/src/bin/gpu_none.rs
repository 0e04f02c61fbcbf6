//! `--device cuda` in a build without the `cuda` feature: the same API, refusing with a clear
//! error at [`Gpu::open`] (nothing else can be reached without a [`Gpu`]).

use anyhow::{bail, Result};
use r2ccl::device::DeviceReport;
use r2ccl::{Collective, Communicator, DType};

/// Never made: see the module doc.
pub struct Gpu {
    /// Which GPU.
    pub ordinal: usize,
}

impl Gpu {
    /// Refuses: this build has no CUDA support.
    pub fn open(_local_rank: usize) -> Result<Self> {
        bail!("--device cuda: this r2ccl-perf was built without the `cuda` feature (cargo build -p r2ccl-perf --features cuda)")
    }

    /// The GPU's name.
    pub fn name(&self) -> String {
        String::new()
    }

    /// Whether results are checked on the device.
    pub const fn checks_on_device(&self) -> bool {
        false
    }
}

/// Never made: see the module doc.
pub struct DeviceCheck;

impl DeviceCheck {
    /// Unreachable without a [`Gpu`].
    pub fn new(_gpu: &Gpu, _want: &[u8]) -> Result<Self> {
        bail!("no CUDA support in this build")
    }
}

/// Never made: see the module doc.
pub struct DeviceBufs;

impl DeviceBufs {
    /// Unreachable without a [`Gpu`].
    pub fn new(_gpu: &Gpu, _input: &[u8], _out_init: &[u8], _in_place: bool) -> Result<Self> {
        bail!("no CUDA support in this build")
    }

    /// Unreachable without a [`Gpu`].
    pub fn reset(&mut self, _gpu: &Gpu, _init: &[u8]) -> Result<()> {
        bail!("no CUDA support in this build")
    }

    /// Unreachable without a [`Gpu`].
    pub fn run(
        &mut self,
        _gpu: &Gpu,
        _comm: &Communicator,
        _coll: Collective,
        _dtype: DType,
        _count: u64,
    ) -> Result<DeviceReport> {
        bail!("no CUDA support in this build")
    }

    /// Unreachable without a [`Gpu`].
    pub fn ring_sendrecv(&mut self, _gpu: &Gpu, _comm: &Communicator, _dtype: DType) -> Result<DeviceReport> {
        bail!("no CUDA support in this build")
    }

    /// Unreachable without a [`Gpu`].
    pub fn run_checked(
        &mut self,
        _gpu: &Gpu,
        _comm: &Communicator,
        _coll: Option<Collective>,
        _dtype: DType,
        _count: u64,
        _check: (usize, &mut DeviceCheck),
    ) -> Result<Option<u64>> {
        bail!("no CUDA support in this build")
    }

    /// Unreachable without a [`Gpu`].
    pub fn read(&self, _gpu: &Gpu) -> Result<Vec<u8>> {
        bail!("no CUDA support in this build")
    }
}
