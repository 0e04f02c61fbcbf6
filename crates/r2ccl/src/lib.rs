//! r2ccl: the facade of the resilient collective communication library.
//!
//! What it does:
//! - Bootstrap: a [`Communicator`] starts from a [`UniqueId`] created by rank 0 with
//!   [`Root::create`] (its rendezvous address plus a 128-bit secret, printable as a string),
//!   through [`Communicator::builder`], or from a launcher's environment
//!   ([`Communicator::from_env`]: `R2CCL_UNIQUE_ID`, `R2CCL_*`, OpenMPI, Slurm, torchrun).
//!   Every bootstrap and OOB connection proves it knows the secret; strangers are dropped and
//!   counted; every wait has a deadline.
//! - Typed collectives on any [`Element`] type ([`SendBuf`]/[`RecvBuf`]: slices, vectors,
//!   arrays, registered [`CommBuf`]s): AllReduce, ReduceScatter, AllGather, Broadcast, Reduce,
//!   AlltoAll, in place and out of place, blocking or started in a [`Scope`]; grouped
//!   send/recv ([`Communicator::group`]); registered memory ([`Communicator::alloc`]); split,
//!   abort, finalize, destroy, an async error query, failover events. Under them a byte-level
//!   layer ([`Communicator::run`], [`Communicator::start`], [`Communicator::group_bytes`]) for
//!   bindings.
//! - One progress thread per communicator drives the UCX transport, the authenticated OOB
//!   mesh, the health-view agreement and the engine, which runs the planned schedule and
//!   repairs NIC failures under the call; Prometheus metrics ([`install_prometheus`]) and
//!   structured log events.
//!
//! What it does not do: it never plans or chooses a strategy by itself (r2ccl-policy and
//! r2ccl-algo do), and it moves no bytes itself (r2ccl-ucx does). Device (GPU) buffers go
//! through [`device`]: staged through page-locked host memory and ordered on the caller's
//! stream; no GPUDirect, no NVLink kernels (docs/gpu.md).
//!
//! # Example
//!
//! Two ranks as threads of one process, each a node of its own with two NICs on loopback:
//!
//! ```
//! use r2ccl::{Communicator, Rank, ReduceOp, Root};
//!
//! let root = Root::create([127, 0, 0, 1].into())?;
//! let id = root.unique_id()?;
//! let peer = std::thread::spawn({
//!     let id = id.clone();
//!     move || -> Result<Vec<i64>, r2ccl::CommError> {
//!         let comm = Communicator::builder(Rank(1), 2, id).node("b").nics(["lo", "lo"]).init()?;
//!         let mut v = vec![2i64; 1000];
//!         comm.all_reduce_in_place(&mut v, ReduceOp::Sum)?;
//!         comm.finalize()?;
//!         Ok(v)
//!     }
//! });
//! let comm = Communicator::builder(Rank(0), 2, id).node("a").nics(["lo", "lo"]).root(root).init()?;
//! let mut v = vec![1i64; 1000];
//! let report = comm.all_reduce_in_place(&mut v, ReduceOp::Sum)?;
//! assert_eq!(v, vec![3i64; 1000]);
//! assert_eq!(report.seq, 1);
//! comm.finalize()?;
//! assert_eq!(peer.join().expect("rank 1")?, vec![3i64; 1000]);
//! # Ok::<(), r2ccl::CommError>(())
//! ```

pub mod agree;
pub mod bootstrap;
mod buffers;
mod builder;
mod call;
mod comm;
mod ctrl;
pub mod device;
mod engine;
mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod metrics;
mod netif;
mod oob;
mod raw;
mod report;
mod scope;
mod segmented;
pub mod switch;
mod typed;
mod wake;

pub(crate) use bootstrap::mac as bootstrap_mac;

pub use bootstrap::{Root, Secret, UniqueId};
pub use buffers::{CommBuf, RecvBuf, SendBuf};
pub use builder::CommBuilder;
pub use call::Handle;
pub use comm::Communicator;
pub use error::CommError;
pub use metrics::{install_prometheus, MetricsError};
pub use r2ccl_algo::{Collective, P2pOp};
pub use r2ccl_config::Config;
pub use r2ccl_core::{bf16, f16, DType, Element, NicId, NodeId, Rank, ReduceOp};
pub use r2ccl_policy::CandidateKind;
pub use raw::P2p;
pub use report::{CollReport, CommEvent, Schedule};
pub use scope::{Pending, Scope};
pub use typed::Group;

/// What most programs need, in one import.
pub mod prelude {
    pub use crate::{
        CollReport, CommError, Communicator, DType, Element, Rank, RecvBuf, ReduceOp, Root, SendBuf, UniqueId,
    };
}

/// The README's example, compiled and run as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

#[cfg(test)]
mod tests;
