//! The Python exceptions of `r2ccl`, one per [`CommError`] variant, under `R2cclError`.

use pyo3::create_exception;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use r2ccl::CommError;

create_exception!(_r2ccl, R2cclError, PyRuntimeError, "Any error of an r2ccl call.");

/// Each exception class under `R2cclError`, declared and listed for [`register`].
macro_rules! exceptions {
    ($($name:ident: $doc:literal,)*) => {
        $(create_exception!(_r2ccl, $name, R2cclError, $doc);)*

        /// Add every exception class to the module.
        pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
            let py = m.py();
            m.add("R2cclError", py.get_type::<R2cclError>())?;
            $(m.add(stringify!($name), py.get_type::<$name>())?;)*
            Ok(())
        }
    };
}

exceptions! {
    BootstrapError: "Bootstrap or OOB setup failed.",
    TransportError: "The transport (UCX) could not be set up.",
    InvalidArgumentError: "Invalid options or arguments; nothing was sent.",
    PeerLostError: "A peer process is gone (attribute `rank`).",
    MismatchError: "Ranks called collective `seq` with different arguments.",
    CollectiveTimeoutError: "A collective did not finish by its deadline.",
    NodeIsolatedError: "Every NIC of a node is down (attribute `node`).",
    NoCommonRailError: "Two nodes that must talk share no healthy rail.",
    NoPathLeftError: "Every path to a peer failed for too long.",
    CollectiveFailedError: "A collective failed for another reason.",
    AbortedError: "The communicator was aborted.",
    DeviceError: "A device (GPU) operation failed: no CUDA driver, no device, out of memory, an illegal address.",
}

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
        CommError::Device(_) => (DeviceError::new_err(msg), vec![]),
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
