//! Bootstrap: unique ids, launcher environments, and the authenticated rendezvous at rank 0.

mod launch;
pub(crate) mod mac;
pub(crate) mod pmix;
mod port;
pub(crate) mod rendezvous;
pub(crate) mod uid;
pub(crate) mod wire;

pub use launch::{LaunchError, LaunchInfo, LaunchSource, INSECURE_SECRET_ENV};
pub use port::free_port_outside_ephemeral_range;
pub use rendezvous::{join, BootstrapError, PeerInfo, RendezvousStats, Root, Table};
pub use uid::{Secret, UniqueId, UniqueIdError};
