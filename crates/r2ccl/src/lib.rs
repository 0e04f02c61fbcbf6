//! r2ccl: the facade of the resilient collective communication library.
//!
//! What it does (so far): bootstrap. A communicator starts from a [`bootstrap::UniqueId`]
//! created by rank 0 (its rendezvous address plus a 128-bit secret, printable as a
//! string) or from a launcher's environment ([`bootstrap::LaunchInfo`]: `R2CCL_UNIQUE_ID`,
//! `R2CCL_*`, OpenMPI, Slurm, torchrun). Every bootstrap connection proves it knows the
//! secret; strangers are dropped and counted; every wait has a deadline.
//!
//! What it does not do yet: collectives, the progress thread, the executor and metrics
//! arrive with issue 6 once the transport lands. It never plans or detects by itself:
//! those decisions live in the sans-IO crates it drives.

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
