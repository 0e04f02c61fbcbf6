//! Error enums, one per concern: validation, loading, merging, dumping and sysfs.

use std::path::PathBuf;

/// A topology or description that breaks a rule. `field` names the offending field
/// as a path, e.g. `nodes[0].nics[2].speed_mbps` or `ranks[5].node`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    /// A required field is absent.
    #[error("{field}: missing (required)")]
    MissingField {
        /// The absent field.
        field: String,
    },
    /// A name field is empty.
    #[error("{field}: must not be empty")]
    EmptyName {
        /// The empty field.
        field: String,
    },
    /// Two NICs of one node share a name or a PCI address.
    #[error("{field}: duplicate NIC `{value}` (also at {first})")]
    DuplicateNic {
        /// The field of the second occurrence.
        field: String,
        /// The duplicated name or PCI address.
        value: String,
        /// The field of the first occurrence.
        first: String,
    },
    /// Two NICs of one node claim the same rail.
    #[error("{field}: rail {rail} is already taken by {first}")]
    DuplicateRail {
        /// The field of the second claim.
        field: String,
        /// The rail.
        rail: u16,
        /// The NIC that claimed it first.
        first: String,
    },
    /// A rail index outside `0..rails`.
    #[error("{field}: unknown rail {rail} (the fabric has rails 0..{rails})")]
    UnknownRail {
        /// The field holding the rail.
        field: String,
        /// The rail given.
        rail: i64,
        /// Number of rails.
        rails: u16,
    },
    /// A node has no NIC for one of the fabric's rails.
    #[error("{field}: no NIC on rail {rail} (every node needs one NIC per rail 0..{rails})")]
    MissingRail {
        /// The node's NIC list.
        field: String,
        /// The rail nobody claims.
        rail: u16,
        /// Number of rails.
        rails: u16,
    },
    /// A NIC speed that is zero, negative or does not fit.
    #[error("{field}: speed must be a positive number of Mbit/s, got {value}")]
    InvalidSpeed {
        /// The speed field.
        field: String,
        /// The value given.
        value: i64,
    },
    /// A count (node `count`, `ranks`) that is zero or negative.
    #[error("{field}: must be at least 1, got {value}")]
    InvalidCount {
        /// The count field.
        field: String,
        /// The value given.
        value: i64,
    },
    /// A rank with no node, or whose node does not exist.
    #[error("{field}: rank {rank} has no node{}", node.map(|n| format!(" (node {n} does not exist; the cluster has {nodes})")).unwrap_or_default())]
    RankWithoutNode {
        /// The rank's node field.
        field: String,
        /// The rank.
        rank: u32,
        /// The node named, if any.
        node: Option<u32>,
        /// Number of nodes.
        nodes: usize,
    },
    /// The same rank twice.
    #[error("{field}: rank {rank} appears twice")]
    DuplicateRank {
        /// The rank field of the second occurrence.
        field: String,
        /// The rank.
        rank: u32,
    },
    /// Ranks are not exactly `0..n`.
    #[error("{field}: rank {rank} is missing (ranks must be 0..{count})")]
    MissingRank {
        /// The rank list.
        field: String,
        /// The first absent rank.
        rank: u32,
        /// Number of ranks.
        count: usize,
    },
    /// A reference to a GPU the node does not have.
    #[error("{field}: node has no GPU {gpu}")]
    UnknownGpu {
        /// The referencing field.
        field: String,
        /// The GPU index.
        gpu: u32,
    },
    /// Two GPUs of one node share a device index or PCI address.
    #[error("{field}: duplicate GPU `{value}`")]
    DuplicateGpu {
        /// The field of the second occurrence.
        field: String,
        /// The duplicated index or PCI address.
        value: String,
    },
    /// A reference to a NUMA node the node does not list.
    #[error("{field}: unknown NUMA node {numa} (the node lists {known:?})")]
    UnknownNuma {
        /// The referencing field.
        field: String,
        /// The NUMA node given.
        numa: u32,
        /// The NUMA nodes the node lists.
        known: Vec<u32>,
    },
    /// Two NUMA nodes with one id.
    #[error("{field}: duplicate NUMA node {numa}")]
    DuplicateNuma {
        /// The field of the second occurrence.
        field: String,
        /// The id.
        numa: u32,
    },
    /// An NVLink from a GPU to itself.
    #[error("{field}: NVLink from GPU {gpu} to itself")]
    SelfLink {
        /// The NVLink entry.
        field: String,
        /// The GPU.
        gpu: u32,
    },
    /// A value that does not fit its field's range.
    #[error("{field}: {value} is out of range ({allowed})")]
    OutOfRange {
        /// The field.
        field: String,
        /// The value given.
        value: i64,
        /// What is allowed.
        allowed: &'static str,
    },
}

/// Reading or parsing a topology description (preset, site file, dump).
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("cannot read topology file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The text is not a valid description (syntax, unknown key, wrong type); the
    /// message names the key and the line.
    #[error("invalid topology description{}: {message}", path.as_ref().map(|p| format!(" {}", p.display())).unwrap_or_default())]
    Parse {
        /// The file, if it came from one.
        path: Option<PathBuf>,
        /// The parser's message.
        message: String,
    },
    /// The description parses but breaks a rule.
    #[error("invalid topology description{}: {source}", path.as_ref().map(|p| format!(" {}", p.display())).unwrap_or_default())]
    Invalid {
        /// The file, if it came from one.
        path: Option<PathBuf>,
        /// The broken rule.
        source: ValidationError,
    },
}

/// Merging the local views of every rank into the cluster view.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MergeError {
    /// No views at all.
    #[error("no local views to merge")]
    Empty,
    /// Two ranks on one host reported different node topologies.
    #[error("ranks {first} and {rank} on host `{host}` report different topologies")]
    ConflictingViews {
        /// The host key.
        host: String,
        /// The first rank that reported the host.
        first: u32,
        /// The rank that disagrees.
        rank: u32,
    },
    /// The merged view is invalid.
    #[error("merged cluster view is invalid: {0}")]
    Invalid(#[from] ValidationError),
}

/// Writing or rendering a dump.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    /// The view could not be rendered in the format.
    #[error("cannot render the topology as {format}: {message}")]
    Render {
        /// The format.
        format: &'static str,
        /// The serializer's message.
        message: String,
    },
    /// The file could not be written.
    #[error("cannot write topology dump {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// An unknown format name.
    #[error("unknown dump format `{0}` (expected toml or json)")]
    UnknownFormat(String),
}

/// Reading the Linux sysfs network and PCI trees.
#[derive(Debug, thiserror::Error)]
pub enum SysfsError {
    /// A directory or file that must exist could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}
