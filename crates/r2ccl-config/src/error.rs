//! Configuration errors: every message names the key (or variable), the value and what is allowed.

/// Why a configuration was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A key that no part of r2ccl reads (a typo, or a key from another version).
    #[error("unknown config key `{key}` (from {origin}); known keys in this section: {known}")]
    UnknownKey {
        /// Dotted key path, e.g. `detect.probe_interval`.
        key: String,
        /// Where it came from (file path or environment variable).
        origin: String,
        /// Known keys of the same section.
        known: String,
    },
    /// A value of the wrong type for its key.
    #[error("config key `{key}` (from {origin}): {detail}")]
    BadType {
        /// Dotted key path.
        key: String,
        /// Where the value came from.
        origin: String,
        /// What was found and what was expected.
        detail: String,
    },
    /// A value of the right type outside the allowed range or set.
    #[error("config key `{key}`: value {value} is not allowed; allowed: {allowed}")]
    OutOfRange {
        /// Dotted key path.
        key: String,
        /// The rejected value as written.
        value: String,
        /// What is allowed.
        allowed: String,
    },
    /// The configuration file could not be read or parsed.
    #[error("config file `{path}`: {detail}")]
    File {
        /// Path of the file.
        path: String,
        /// What went wrong.
        detail: String,
    },
}
