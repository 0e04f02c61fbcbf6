//! Error enums of r2ccl-algo, one per concern: building schedules, executing them, simulating them.

use r2ccl_core::{KernelError, NicId, NodeId, Rank};

/// Why a schedule (or a layout, fabric or model input) was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AlgoError {
    /// The communicator has no ranks.
    #[error("a communicator needs at least one rank, got zero")]
    ZeroRanks,
    /// A layout or model needs at least one node.
    #[error("a layout needs at least one node, got zero")]
    ZeroNodes,
    /// Nodes must have at least one NIC and at most 64.
    #[error("NICs per node must be in 1..=64, got {0}")]
    BadNicCount(usize),
    /// A rank id is not part of the communicator.
    #[error("{rank} is outside the communicator of {ranks} ranks")]
    RankOutOfRange {
        /// The offending rank.
        rank: Rank,
        /// Communicator size.
        ranks: usize,
    },
    /// The root of a rooted collective is not part of the communicator.
    #[error("root {root} is outside the communicator of {ranks} ranks")]
    RootOutOfRange {
        /// The offending root.
        root: Rank,
        /// Communicator size.
        ranks: usize,
    },
    /// A node of the layout holds no rank.
    #[error("{0} holds no rank; every node of a layout must hold at least one")]
    EmptyNode(NodeId),
    /// The health view does not describe the layout's nodes and NICs.
    #[error("health view shape mismatch: layout has {layout_nodes} nodes x {layout_nics} NICs, view has {view_nodes} nodes ({detail})")]
    ShapeMismatch {
        /// Nodes in the layout.
        layout_nodes: usize,
        /// NICs per node in the layout.
        layout_nics: usize,
        /// Nodes in the health view.
        view_nodes: usize,
        /// What differs.
        detail: String,
    },
    /// A node of a multi-node communicator has lost every NIC.
    #[error("{0} has no usable NIC left; it cannot take part in inter-node collectives")]
    NodeWithoutNic(NodeId),
    /// A ring order is not a permutation of the communicator's ranks (or nodes).
    #[error("ring order is not a permutation of 0..{expected}: {detail}")]
    BadRingOrder {
        /// Number of ranks (or nodes) the order must permute.
        expected: usize,
        /// What is wrong.
        detail: String,
    },
    /// A strategy or algorithm parameter is out of its domain.
    #[error("invalid parameter {name} = {value}: {why}")]
    InvalidParameter {
        /// Parameter name.
        name: &'static str,
        /// The value given, formatted.
        value: String,
        /// The allowed domain.
        why: &'static str,
    },
    /// The strategy or algorithm does not exist for this collective.
    #[error("{what} is not available for {collective}")]
    NotApplicable {
        /// Strategy or algorithm name.
        what: &'static str,
        /// Collective name.
        collective: &'static str,
    },
    /// A buffer would exceed the addressable size.
    #[error("buffer size overflows: {count} elements x {factor} x {elem} bytes")]
    SizeOverflow {
        /// Elements per block.
        count: u64,
        /// Number of blocks.
        factor: u64,
        /// Bytes per element.
        elem: u64,
    },
}

/// Why the reference executor stopped.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ExecError {
    /// Number of schedules and number of input buffers differ, or schedule `i` is not rank `i`'s.
    #[error("schedule/input mismatch: {0}")]
    Mismatch(String),
    /// A rank's input buffer has the wrong size.
    #[error("{rank}: input buffer has {got} bytes, the schedule expects {expected}")]
    InputSize {
        /// The rank.
        rank: Rank,
        /// Bytes given.
        got: usize,
        /// Bytes expected.
        expected: u64,
    },
    /// A step addresses bytes outside its buffer.
    #[error("{rank} step {step}: region {offset}+{len} is outside its {buf_len}-byte buffer")]
    RegionOutOfBounds {
        /// The rank.
        rank: Rank,
        /// Step index.
        step: usize,
        /// Region offset.
        offset: u64,
        /// Region length.
        len: u64,
        /// Buffer length.
        buf_len: u64,
    },
    /// A step names a peer outside the communicator or a dependency that is not an earlier step.
    #[error("{rank} step {step}: {detail}")]
    BadStep {
        /// The rank.
        rank: Rank,
        /// Step index.
        step: usize,
        /// What is wrong.
        detail: String,
    },
    /// Two sends use the same (source, destination, tag).
    #[error("duplicate message {src} -> {dst} tag {tag:#x}")]
    DuplicateMessage {
        /// Sender.
        src: Rank,
        /// Receiver.
        dst: Rank,
        /// Tag.
        tag: u64,
    },
    /// A received message does not fit the receive region.
    #[error("{dst} step {step}: message from {src} tag {tag:#x} has {got} bytes, receive region has {expected}")]
    MessageSize {
        /// Sender.
        src: Rank,
        /// Receiver.
        dst: Rank,
        /// Receiver's step.
        step: usize,
        /// Tag.
        tag: u64,
        /// Message bytes.
        got: usize,
        /// Region bytes.
        expected: u64,
    },
    /// No rank can make progress and some steps are unfinished.
    #[error("deadlock: {blocked} ranks blocked; first: {rank} step {step} waits for {peer} tag {tag:#x}")]
    Deadlock {
        /// Number of ranks with unfinished steps.
        blocked: usize,
        /// First blocked rank.
        rank: Rank,
        /// Its blocked step.
        step: usize,
        /// The peer it waits on (itself when it waits on a local dependency).
        peer: Rank,
        /// The tag it waits for (0 for a local dependency).
        tag: u64,
    },
    /// Every step finished but a sent message was never received.
    #[error("message {src} -> {dst} tag {tag:#x} was sent but never received")]
    Unconsumed {
        /// Sender.
        src: Rank,
        /// Receiver.
        dst: Rank,
        /// Tag.
        tag: u64,
    },
    /// A reduction kernel refused its operands.
    #[error("reduction failed: {0}")]
    Kernel(#[from] KernelError),
}

/// Why the bandwidth-model simulator stopped.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SimError {
    /// A transfer part uses a failed NIC.
    #[error("{rank} step {step} uses failed {nic}")]
    FailedNic {
        /// The sending rank.
        rank: Rank,
        /// Its step.
        step: usize,
        /// The failed NIC.
        nic: NicId,
    },
    /// Some steps never became runnable (a receive without a send, or a dependency cycle).
    #[error("{unfinished} steps never completed (first: {rank} step {step})")]
    Stuck {
        /// Number of unfinished steps.
        unfinished: usize,
        /// First unfinished rank.
        rank: Rank,
        /// Its step.
        step: usize,
    },
    /// The schedules do not match the fabric.
    #[error("schedules do not match the fabric: {0}")]
    Mismatch(String),
}
