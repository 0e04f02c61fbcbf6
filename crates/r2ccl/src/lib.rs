//! r2ccl: the facade of the resilient collective communication library.
//!
//! What it does:
//! - Bootstrap: a [`comm::Communicator`] starts from a [`bootstrap::UniqueId`] created by
//!   rank 0 (its rendezvous address plus a 128-bit secret, printable as a string) or from a
//!   launcher's environment ([`bootstrap::LaunchInfo`]: `R2CCL_UNIQUE_ID`, `R2CCL_*`,
//!   OpenMPI, Slurm, torchrun). Every connection proves it knows the secret; strangers are
//!   dropped and counted; every wait has a deadline.
//! - Collectives (AllReduce, ReduceScatter, AllGather, Broadcast, Reduce, AlltoAll,
//!   Send/Recv), grouped point-to-point, in place and out of place, blocking and with a
//!   [`comm::Handle`]; split, abort, destroy, an async error query.
//! - One progress thread per communicator ([`comm`]) drives the UCX transport, the OOB mesh
//!   ([`oob`]), the health-view agreement ([`agree`]) and the [`engine`], which runs the
//!   planned schedule and repairs NIC failures under the call; Prometheus metrics
//!   ([`metrics`]) and structured log events.
//!
//! What it does not do: it never plans or chooses a strategy by itself (r2ccl-policy and
//! r2ccl-algo do), and it moves no bytes itself (r2ccl-ucx does). GPU buffers are not
//! supported yet.

pub mod agree;
pub mod bootstrap;
pub mod comm;
pub mod ctrl;
pub mod engine;
pub mod metrics;
pub mod netif;
pub mod oob;
pub mod wake;

pub(crate) use bootstrap::mac as bootstrap_mac;
