//! Errors of the simulator: bad scenarios, impossible topologies, failures of missing components.

use thiserror::Error;

/// Everything that can be wrong with a simulation input.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum SimError {
    /// A fabric field has an impossible value.
    #[error("impossible topology: {field} = {value}: {why}")]
    Topology {
        /// The offending field, e.g. `fabric.nodes`.
        field: &'static str,
        /// Its value.
        value: String,
        /// What is wrong.
        why: &'static str,
    },
    /// A failure names a node or NIC that does not exist.
    #[error("failure #{index}: no such component: {what}")]
    NoSuchComponent {
        /// Index of the failure in the scenario's list.
        index: usize,
        /// The missing component.
        what: String,
    },
    /// A failure has inconsistent fields.
    #[error("failure #{index}: {why}")]
    BadFailure {
        /// Index of the failure in the scenario's list.
        index: usize,
        /// What is wrong.
        why: String,
    },
    /// A workload or strategy parameter is out of range.
    #[error("invalid parameter {field} = {value}: {why}")]
    Param {
        /// The offending field.
        field: &'static str,
        /// Its value.
        value: String,
        /// What is wrong.
        why: &'static str,
    },
    /// The scenario file does not parse (unknown key, wrong type, ...).
    #[error("scenario does not parse: {0}")]
    Parse(String),
    /// A schedule from r2ccl-algo or a plan from r2ccl-policy could not be converted.
    #[error("cannot convert schedule: {0}")]
    Convert(String),
}
