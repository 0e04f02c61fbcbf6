//! r2ccl-config: the library's configuration, loaded and validated once.
//!
//! What it does: layers built-in defaults, then the TOML file `R2CCL_CONFIG` names (none is
//! read otherwise), then `R2CCL_*` environment variables, into
//! the typed [`Config`]. An unknown key in a file, a wrong type or an out-of-range
//! value is rejected with a one-line [`ConfigError`] naming the key, the value and
//! what is allowed; an `R2CCL_*` variable this version does not know is ignored and
//! named in [`Config::ignored_env`] (fleets set one environment for several versions).
//! Every key and variable is listed in `docs/configuration.md`.
//!
//! What it does not do: it does not act on the configuration (no logging setup, no
//! sockets); it does not read launcher identity variables (`R2CCL_RANK`, ...), which
//! belong to the facade's bootstrap, though it knows their names so that it can tell a
//! typo from a legitimate variable.

mod env;
mod error;
mod load;
mod model;

pub use env::{ENV_ALIASES, IDENTITY_VARS};
pub use error::ConfigError;
pub use load::{load, load_from, load_str, DEFAULT_CONFIG_PATH};
pub use model::{
    BootstrapConfig, Config, DetectConfig, LogConfig, MetricsConfig, PolicyConfig, TopoConfig, TransportConfig,
};
