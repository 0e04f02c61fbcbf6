//! The Python exceptions of `r2ccl`, one per [`CommError`] variant, under `R2cclError`.

use pyo3::create_exception;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use r2ccl::CommError;

create_exception!(_r2ccl, R2cclError, PyRuntimeError, "Any error of an r2ccl call.");
create_exception!(_r2ccl, BootstrapError, R2cclError, "Bootstrap or OOB setup failed.");
create_exception!(_r2ccl, TransportError, R2cclError, "The transport (UCX) could not be set up.");
create_exception!(_r2ccl, InvalidArgumentError, R2cclError, "Invalid options or arguments; nothing was sent.");
create_exception!(_r2ccl, PeerLostError, R2cclError, "A peer process is gone (attribute `rank`).");
create_exception!(_r2ccl, MismatchError, R2cclError, "Ranks called collective `seq` with different arguments.");
create_exception!(_r2ccl, CollectiveTimeoutError, R2cclError, "A collective did not finish by its deadline.");
create_exception!(_r2ccl, NodeIsolatedError, R2cclError, "Every NIC of a node is down (attribute `node`).");
create_exception!(_r2ccl, NoCommonRailError, R2cclError, "Two nodes that must talk share no healthy rail.");
create_exception!(_r2ccl, NoPathLeftError, R2cclError, "Every path to a peer failed for too long.");
create_exception!(_r2ccl, CollectiveFailedError, R2cclError, "A collective failed for another reason.");
create_exception!(_r2ccl, AbortedError, R2cclError, "The communicator was aborted.");

/// The Python exception for `e`, with the ranks, nodes and sequence numbers it names as
/// attributes (`seq`, `rank`, `node`, `nodes`).
pub(crate) fn to_py(e: CommError) -> PyErr {
    let msg = e.to_string();
    let (err, attrs): (PyErr, Vec<(&str, u64)>) = match e {
        CommError::Bootstrap(_) => (BootstrapError::new_err(msg), vec![]),
        CommError::Transport(_) => (TransportError::new_err(msg), vec![]),
        CommError::Invalid(_) => (InvalidArgumentError::new_err(msg), vec![]),
        CommError::PeerLost { rank, .. } => (PeerLostError::new_err(msg), vec![("rank", rank.0.into())]),
        CommError::Mismatch { seq, .. } => (MismatchError::new_err(msg), vec![("seq", seq)]),
        CommError::Timeout { seq, .. } => (CollectiveTimeoutError::new_err(msg), vec![("seq", seq)]),
        CommError::NodeIsolated { seq, node } => {
            (NodeIsolatedError::new_err(msg), vec![("seq", seq), ("node", node.0.into())])
        }
        CommError::NoCommonRail { seq, .. } => (NoCommonRailError::new_err(msg), vec![("seq", seq)]),
        CommError::NoPathLeft { seq, peer, .. } => {
            (NoPathLeftError::new_err(msg), vec![("seq", seq), ("rank", peer.0.into())])
        }
        CommError::Failed { seq, .. } => (CollectiveFailedError::new_err(msg), vec![("seq", seq)]),
        CommError::Aborted(_) => (AbortedError::new_err(msg), vec![]),
        _ => (R2cclError::new_err(msg), vec![]),
    };
    if !attrs.is_empty() {
        Python::with_gil(|py| {
            let value = err.value(py);
            for (name, v) in attrs {
                // Setting an attribute on a fresh exception object cannot fail short of
                // memory exhaustion; the message carries the same facts if it does.
                let _ = value.setattr(name, v);
            }
        });
    }
    err
}

/// Add every exception class to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("R2cclError", py.get_type::<R2cclError>())?;
    m.add("BootstrapError", py.get_type::<BootstrapError>())?;
    m.add("TransportError", py.get_type::<TransportError>())?;
    m.add("InvalidArgumentError", py.get_type::<InvalidArgumentError>())?;
    m.add("PeerLostError", py.get_type::<PeerLostError>())?;
    m.add("MismatchError", py.get_type::<MismatchError>())?;
    m.add("CollectiveTimeoutError", py.get_type::<CollectiveTimeoutError>())?;
    m.add("NodeIsolatedError", py.get_type::<NodeIsolatedError>())?;
    m.add("NoCommonRailError", py.get_type::<NoCommonRailError>())?;
    m.add("NoPathLeftError", py.get_type::<NoPathLeftError>())?;
    m.add("CollectiveFailedError", py.get_type::<CollectiveFailedError>())?;
    m.add("AbortedError", py.get_type::<AbortedError>())?;
    Ok(())
}
