//! Error enums of r2ccl-core, one per concern.

use crate::{DType, NicId, NodeId};

/// Why a reduction kernel refused its arguments.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    /// Source and destination hold different numbers of bytes.
    #[error("length mismatch: destination has {dst} bytes, source has {src}")]
    LengthMismatch {
        /// Destination length in bytes.
        dst: usize,
        /// Source length in bytes.
        src: usize,
    },
    /// The byte length is not a whole number of elements of the data type.
    #[error("{len} bytes is not a whole number of {dtype} elements ({size} bytes each)")]
    PartialElement {
        /// Length in bytes.
        len: usize,
        /// The element type.
        dtype: DType,
        /// Bytes per element.
        size: usize,
    },
    /// `Avg` finalization with a divisor of zero ranks.
    #[error("average over zero ranks")]
    ZeroDivisor,
}

/// Why a health view operation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HealthError {
    /// The NIC does not exist in this view.
    #[error("{0} is not part of this health view")]
    UnknownNic(NicId),
    /// The node does not exist in this view.
    #[error("{0} is not part of this health view")]
    UnknownNode(NodeId),
    /// Two views of different cluster shapes cannot be merged.
    #[error("cannot merge health views of different shapes ({ours} vs {theirs} nodes, or NIC counts differ)")]
    ShapeMismatch {
        /// Node count of this view.
        ours: usize,
        /// Node count of the other view.
        theirs: usize,
    },
}
