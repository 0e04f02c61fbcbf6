//! What to build: the collective, its algorithm, its failure strategy and parameters.

use crate::layout::RailPolicy;
use crate::AlgoError;
use r2ccl_core::{DType, NodeId, Rank, ReduceOp};
use serde::{Deserialize, Serialize};

/// A collective operation with its per-call arguments.
///
/// Buffer sizes, with `count` elements of the request's dtype and `p` ranks:
///
/// | collective | input | output |
/// |---|---|---|
/// | AllReduce, Broadcast, Reduce, SendRecv | count | count |
/// | ReduceScatter | p x count (block j goes to rank j) | count |
/// | AllGather | count | p x count (block j from rank j) |
/// | AlltoAll | p x count (block j to rank j) | p x count (block j from rank j) |
///
/// Reduce leaves non-root outputs unspecified; SendRecv leaves every output but the
/// receiver's untouched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Collective {
    /// Every rank gets the reduction of all inputs.
    AllReduce {
        /// Reduce op.
        op: ReduceOp,
    },
    /// Rank j gets block j of the reduction of all inputs.
    ReduceScatter {
        /// Reduce op.
        op: ReduceOp,
    },
    /// Every rank gets every rank's input, in rank order.
    AllGather,
    /// Every rank gets the root's input.
    Broadcast {
        /// Source rank.
        root: Rank,
    },
    /// The root gets the reduction of all inputs.
    Reduce {
        /// Reduce op.
        op: ReduceOp,
        /// Destination rank.
        root: Rank,
    },
    /// Rank j's output block i is rank i's input block j.
    AlltoAll,
    /// `dst`'s output is `src`'s input.
    SendRecv {
        /// Sender.
        src: Rank,
        /// Receiver.
        dst: Rank,
    },
}

impl Collective {
    /// Lower-case name (`allreduce`, ...).
    pub const fn name(&self) -> &'static str {
        match self {
            Collective::AllReduce { .. } => "allreduce",
            Collective::ReduceScatter { .. } => "reducescatter",
            Collective::AllGather => "allgather",
            Collective::Broadcast { .. } => "broadcast",
            Collective::Reduce { .. } => "reduce",
            Collective::AlltoAll => "alltoall",
            Collective::SendRecv { .. } => "sendrecv",
        }
    }

    /// nccl-tests' bus-bandwidth factor on `nranks` ranks: what each rank's link carries per
    /// byte of the call's size (AllReduce 2(n-1)/n; AllGather, ReduceScatter and AlltoAll
    /// (n-1)/n; Broadcast, Reduce and SendRecv 1).
    pub fn bus_factor(&self, nranks: u32) -> f64 {
        let n = f64::from(nranks.max(1));
        match self {
            Collective::AllReduce { .. } => 2.0 * (n - 1.0) / n,
            Collective::AllGather | Collective::ReduceScatter { .. } | Collective::AlltoAll => (n - 1.0) / n,
            Collective::Broadcast { .. } | Collective::Reduce { .. } | Collective::SendRecv { .. } => 1.0,
        }
    }

    /// The reduce op (`Sum` for collectives that do not reduce).
    pub const fn op(&self) -> ReduceOp {
        match self {
            Collective::AllReduce { op } | Collective::ReduceScatter { op } | Collective::Reduce { op, .. } => *op,
            _ => ReduceOp::Sum,
        }
    }
}

/// The base algorithm of a collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    /// Bandwidth-optimal ring (pipelined chain for Broadcast/Reduce, pairwise exchange
    /// for AlltoAll, direct for SendRecv).
    #[default]
    Ring,
    /// Latency-optimal: recursive doubling for AllReduce (non-powers of two fold the
    /// extra ranks in and out), binomial tree for Broadcast and Reduce.
    Tree,
    /// AllReduce only: chain-reduce inside each node to a leader, ring AllReduce among
    /// the node leaders, chain-broadcast inside each node.
    Hierarchical,
    /// AllReduce only, rail-parallel. A direct reduce-scatter inside each node (each rank
    /// sends segment `j` straight to the node's `j`-th rank: one hop on a switched intra-node
    /// fabric) leaves segment `i` of `G` (the ranks per node) reduced over the node at its
    /// `i`-th rank. The `i`-th ranks of all nodes run a ring AllReduce of segment `i` on their
    /// own rails: rail `i % NICs`, or the NICs `r` with `r % G == i` when a node has more NICs
    /// than ranks. A transfer whose rails are unusable at either end is split over the others
    /// per the strategy; under Balance a group one of whose rails runs below its nominal rate
    /// somewhere spreads over every rail by bandwidth. A direct all-gather inside each node
    /// ends it. Each rank sends `1/G` of the buffer across nodes. Nodes that hold different
    /// numbers of ranks run [`Algorithm::Hierarchical`] instead.
    Rails,
}

/// Parameters of R2CCL-AllReduce (MECHANISMS.md section 5.2).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct R2cclParams {
    /// The degraded node kept off the critical path.
    pub degraded: NodeId,
    /// Tail fraction Y of the buffer handled by the healthy nodes (0 < Y < 1); the paper uses Y = X.
    pub tail_fraction: f64,
    /// Pipeline chunks K of the reduce-to-helper / broadcast-back stage (>= 1).
    pub pipeline_chunks: u32,
}

impl R2cclParams {
    /// Elements of the main part (run by every node) for a buffer of `count` elements:
    /// `round((1 - Y) * count)`, at most `count`; the tail is the rest.
    pub fn main_len(&self, count: u64) -> u64 {
        (((1.0 - self.tail_fraction) * count as f64).round() as u64).min(count)
    }
}

/// How a collective copes with the health view.
#[derive(Clone, Copy, Debug, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// R2CCL-Balance: the algorithm is unchanged; inter-node transfers are split over
    /// the NICs healthy at both ends in proportion to their bandwidth. Fault-free when
    /// nothing failed. Every collective.
    #[default]
    Balance,
    /// Hot repair only: a failed NIC's share moves to one backup NIC. Every collective.
    SingleBackup,
    /// R2CCL-AllReduce: main/tail split, tail reduced among healthy nodes, degraded node
    /// joins through reduce-to-helper and broadcast-back in K chunks. AllReduce only.
    R2cclAllReduce(R2cclParams),
    /// Recursive AllReduce (section 6.2): nested levels over bandwidth classes with
    /// stage-1 water-filling; slower nodes join each faster level through
    /// reduce-to-helper and broadcast-back in `pipeline_chunks` chunks. AllReduce only.
    Recursive {
        /// Pipeline chunks K of the join stage (>= 1).
        pipeline_chunks: u32,
    },
    /// The four-stage bound-reaching AllReduce (section 7), generalized to several
    /// stragglers by water-filling over bandwidth classes; transfers use
    /// [`RailPolicy::Spread`]. AllReduce only.
    FourStage,
    /// The four-stage AllReduce with direct exchanges per level instead of one ring: every
    /// pair of a level's nodes exchanges its pieces at once, over same-rail splits weighted by
    /// each NIC's fair share per connection ([`crate::Fabric::fair_split`]). Reaches the bound
    /// where NICs share their bandwidth evenly between connections (queue-pair arbitration).
    /// AllReduce only.
    FourStageDirect,
}

impl Strategy {
    /// Lower-case name as used by plans and tools.
    pub const fn name(&self) -> &'static str {
        match self {
            Strategy::Balance => "balance",
            Strategy::SingleBackup => "single_backup",
            Strategy::R2cclAllReduce(_) => "r2ccl_allreduce",
            Strategy::Recursive { .. } => "recursive",
            Strategy::FourStage => "four_stage",
            Strategy::FourStageDirect => "four_stage_direct",
        }
    }

    /// The NIC split policy this strategy uses for its transfers.
    pub const fn rail_policy(&self) -> RailPolicy {
        match self {
            Strategy::SingleBackup => RailPolicy::SingleBackup,
            Strategy::FourStage | Strategy::FourStageDirect => RailPolicy::Spread,
            _ => RailPolicy::Balance,
        }
    }
}

/// Everything that determines a schedule besides the fabric and the rank.
#[derive(Clone, Debug, PartialEq)]
pub struct ScheduleRequest {
    /// The collective.
    pub collective: Collective,
    /// Element type.
    pub dtype: DType,
    /// Elements per block (see [`Collective`] for buffer sizes).
    pub count: u64,
    /// Base algorithm (ignored by the AllReduce-only strategies, which bring their own).
    pub algorithm: Algorithm,
    /// Failure strategy.
    pub strategy: Strategy,
    /// Ring order of ranks (a permutation); `None` = rank order. Every ring, chain and
    /// node-level builder follows it; node-level strategies use the node order it implies.
    pub ring: Option<Vec<Rank>>,
    /// Pipeline chunks per ring segment / chain message (>= 1).
    pub chunks: u32,
}

impl ScheduleRequest {
    /// A ring/Balance request with one chunk per segment in rank order.
    pub fn new(collective: Collective, dtype: DType, count: u64) -> Self {
        Self {
            collective,
            dtype,
            count,
            algorithm: Algorithm::Ring,
            strategy: Strategy::Balance,
            ring: None,
            chunks: 1,
        }
    }

    /// Set the algorithm.
    #[must_use]
    pub fn with_algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// Set the strategy.
    #[must_use]
    pub fn with_strategy(mut self, strategy: Strategy) -> Self {
        self.strategy = strategy;
        self
    }

    /// Set the ring order.
    #[must_use]
    pub fn with_ring(mut self, ring: Vec<Rank>) -> Self {
        self.ring = Some(ring);
        self
    }

    /// Set the pipeline chunks per segment.
    #[must_use]
    pub fn with_chunks(mut self, chunks: u32) -> Self {
        self.chunks = chunks;
        self
    }

    /// Input and output buffer sizes in bytes for `ranks` ranks.
    pub fn buffer_lens(&self, ranks: usize) -> Result<(u64, u64), AlgoError> {
        let elem = self.dtype.size() as u64;
        let sized = |factor: u64| {
            self.count.checked_mul(factor).and_then(|v| v.checked_mul(elem)).ok_or(AlgoError::SizeOverflow {
                count: self.count,
                factor,
                elem,
            })
        };
        let p = ranks as u64;
        Ok(match self.collective {
            Collective::ReduceScatter { .. } => (sized(p)?, sized(1)?),
            Collective::AllGather => (sized(1)?, sized(p)?),
            Collective::AlltoAll => (sized(p)?, sized(p)?),
            _ => (sized(1)?, sized(1)?),
        })
    }
}
