//! The `cuda` feature on a machine without the NVIDIA driver (this project's CI): every entry
//! point answers with the named `NoDriver` error, never a panic. On a machine with the driver
//! it says so loudly and checks that device 0 opens (`cargo xtask gpu-check` runs the rest).
#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used, reason = "a panic here is a test failure with a message")]

mod common;

use r2ccl::device::cuda::{driver_present, CudaDevice};
use r2ccl::device::DeviceError;
use r2ccl::{Collective, CommError, DType, ReduceOp};

#[test]
fn without_a_driver_every_cuda_entry_point_is_the_named_no_driver_error() {
    if driver_present() {
        eprintln!("NOTE: the CUDA driver is present here: the no-driver checks do not apply; opening device 0 instead");
        let n = CudaDevice::count().unwrap();
        if n > 0 {
            CudaDevice::new(0).unwrap();
        }
        assert!(matches!(CudaDevice::new(n), Err(DeviceError::NoDevice { .. })));
        return;
    }
    assert!(matches!(CudaDevice::new(0), Err(DeviceError::NoDriver { .. })));
    assert!(matches!(CudaDevice::count(), Err(DeviceError::NoDriver { .. })));
    let e = CudaDevice::new(0).unwrap_err();
    assert!(e.to_string().contains("NVIDIA driver"), "{e}");
    let threads = common::spawn_ranks(1, 5_000, |_, comm| {
        let coll = Collective::AllReduce { op: ReduceOp::Sum };
        // SAFETY: refused before any pointer is used.
        let r = unsafe { comm.start_cuda_raw(coll, DType::F32, 16, 0x1000, 0x1000, std::ptr::null_mut(), None) };
        let err = r.unwrap_err();
        assert!(matches!(err, CommError::Device(DeviceError::NoDriver { .. })), "{err}");
        assert_eq!(err.kind(), "device");
        comm.finalize().unwrap();
    });
    for t in threads {
        t.join().unwrap();
    }
}
