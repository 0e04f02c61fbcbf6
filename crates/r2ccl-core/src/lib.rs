//! r2ccl-core: the shared vocabulary of r2ccl.
//!
//! What it does: defines the ids every other crate speaks in (rank, node, rail, NIC),
//! the [`HealthView`] with its epoch, the data types and reduce operations of
//! collectives, fast CPU reduction kernels, the logging subsystem names, an integer-key
//! hash map for hot lookups ([`fastmap`]), and the text and Graphviz renderings of the state
//! machines' declared transition tables ([`table`]).
//!
//! What it does not do: no IO, no clocks, no threads, no configuration loading and no
//! logging setup. It is small and slow-moving on purpose so that single crates can be
//! picked into other systems without pulling anything heavy.

mod dtype;
mod error;
pub mod fastmap;
mod health;
mod ids;
pub mod kernels;
pub mod subsys;
pub mod table;

pub use dtype::{DType, ParseNameError, ReduceOp};
pub use error::{HealthError, KernelError};
pub use half::{bf16, f16};
pub use health::{HealthEpoch, HealthView, NicHealth, NodeHealth};
pub use ids::{NicId, NodeId, RailId, Rank};
pub use kernels::Element;
