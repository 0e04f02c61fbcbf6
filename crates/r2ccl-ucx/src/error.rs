//! Errors of the UCX backend: UCS status codes with their strings, deadlines, bad arguments.

use r2ccl_ucx_sys as sys;
use std::ffi::CStr;
use std::fmt;
use std::time::Duration;

/// A UCS status code (`ucs_status_t`) as UCX returned it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Status(pub i8);

impl Status {
    /// `UCS_OK`.
    pub const OK: Self = Self(sys::UCS_OK);
    /// `UCS_ERR_BUSY`: e.g. `ucp_worker_arm` with events pending.
    pub const BUSY: Self = Self(sys::UCS_ERR_BUSY);
    /// `UCS_INPROGRESS`.
    pub const IN_PROGRESS: Self = Self(sys::UCS_INPROGRESS);
    /// `UCS_ERR_CANCELED`: the request was cancelled (by `ucp_request_cancel` or a forced close).
    pub const CANCELED: Self = Self(sys::UCS_ERR_CANCELED);
    /// `UCS_ERR_MESSAGE_TRUNCATED`: a received message was larger than the receive buffer.
    pub const MESSAGE_TRUNCATED: Self = Self(sys::UCS_ERR_MESSAGE_TRUNCATED);

    /// UCX's description of the status (`ucs_status_string`).
    pub fn message(self) -> String {
        // SAFETY: ucs_status_string returns a pointer to a static NUL-terminated string for every
        // value, including unknown ones ("Unknown error").
        let ptr = unsafe { sys::ucs_status_string(self.0) };
        if ptr.is_null() {
            return format!("unknown UCS status {}", self.0);
        }
        // SAFETY: non-null, static and NUL-terminated (above).
        unsafe { CStr::from_ptr(ptr) }.to_string_lossy().into_owned()
    }

    /// Whether this is `UCS_OK`.
    pub fn is_ok(self) -> bool {
        self == Self::OK
    }

    /// Whether the status is an error (negative).
    pub fn is_err(self) -> bool {
        self.0 < 0
    }

    /// `Ok(())` for `UCS_OK`, else a [`UcxError::Status`] naming `op`.
    pub(crate) fn check(self, op: &'static str) -> Result<(), UcxError> {
        if self.is_ok() {
            Ok(())
        } else {
            Err(UcxError::status(op, self))
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message(), self.0)
    }
}

/// Everything that can go wrong in the UCX backend.
#[derive(Debug, thiserror::Error)]
pub enum UcxError {
    /// A UCX call returned an error status.
    #[error("UCX {op} failed: {message} (status {code})", code = .status.0)]
    Status {
        /// The UCX call or operation that failed (e.g. `ucp_ep_create`).
        op: &'static str,
        /// The status it returned.
        status: Status,
        /// `ucs_status_string` of the status.
        message: String,
    },
    /// A request did not complete by its deadline; it was cancelled.
    #[error("{op} did not complete within its deadline of {deadline:?}; the request was cancelled")]
    Timeout {
        /// What was waited for (`tag send`, `tag recv`, `endpoint flush`, ...).
        op: &'static str,
        /// The deadline, as a duration from the start of the wait.
        deadline: Duration,
    },
    /// The endpoint a request used reported an error through its error callback.
    #[error("endpoint to {peer} failed: {message} (status {code})", code = .status.0)]
    EndpointFailed {
        /// Which endpoint (peer and NIC, as the endpoint's label says).
        peer: String,
        /// The status UCX passed to the error callback.
        status: Status,
        /// `ucs_status_string` of the status.
        message: String,
    },
    /// A configuration value cannot be passed to UCX (contains a NUL byte, or is empty).
    #[error("invalid UCX configuration value for {key}: {value:?} ({why})")]
    InvalidConfig {
        /// The UCX configuration key (without the `UCX_` prefix).
        key: String,
        /// The rejected value.
        value: String,
        /// Why it is rejected.
        why: &'static str,
    },
    /// An index (NIC, rail, peer, memory range) is out of range.
    #[error("{what} {index} is out of range (have {len})")]
    OutOfRange {
        /// What the index selects.
        what: &'static str,
        /// The index given.
        index: usize,
        /// How many there are.
        len: usize,
    },
    /// The UCX library this process loaded is not the one r2ccl-ucx was built against.
    #[error(
        "UCX {loaded} is loaded but r2ccl was built against UCX {built} ({libdir}): put that directory first in \
         LD_LIBRARY_PATH, or set R2CCL_UCX_ALLOW_MISMATCH=1 to run anyway"
    )]
    VersionMismatch {
        /// The version loaded.
        loaded: String,
        /// The version built against.
        built: String,
        /// Where the built one's libraries are.
        libdir: String,
    },
    /// A NIC has no IP address to listen on for peers' connections.
    #[error("NIC {device} cannot take connections: {why}")]
    NoDeviceAddress {
        /// The network interface.
        device: String,
        /// What is missing.
        why: String,
    },
    /// A peer's packed worker address is malformed.
    #[error("worker address ({len} bytes) is malformed: {why}")]
    BadAddress {
        /// Its length.
        len: usize,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A received message was longer than the receive buffer (`UCS_ERR_MESSAGE_TRUNCATED`).
    #[error("received message of {got} bytes did not fit the {capacity}-byte buffer")]
    Truncated {
        /// Size of the message the sender sent, as far as UCX reports it (0 when unknown).
        got: usize,
        /// Capacity of the receive buffer.
        capacity: usize,
    },
}

impl UcxError {
    /// A [`UcxError::Status`] for `status` returned by `op`.
    pub fn status(op: &'static str, status: Status) -> Self {
        Self::Status { op, status, message: status.message() }
    }

    /// The UCS status this error carries, if any.
    pub fn ucs_status(&self) -> Option<Status> {
        match self {
            Self::Status { status, .. } | Self::EndpointFailed { status, .. } => Some(*status),
            Self::Truncated { .. } => Some(Status::MESSAGE_TRUNCATED),
            Self::Timeout { .. }
            | Self::InvalidConfig { .. }
            | Self::OutOfRange { .. }
            | Self::NoDeviceAddress { .. }
            | Self::BadAddress { .. }
            | Self::VersionMismatch { .. } => None,
        }
    }

    /// Whether this is a deadline expiry.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Self::Timeout { .. })
    }

    /// Whether the request was cancelled (by the caller, a deadline or a forced endpoint close).
    pub fn is_canceled(&self) -> bool {
        self.ucs_status() == Some(Status::CANCELED)
    }
}
