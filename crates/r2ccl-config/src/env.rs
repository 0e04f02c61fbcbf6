//! The `R2CCL_*` environment: aliases for common keys, generic `R2CCL_<SECTION>__<KEY>`,
//! and the identity variables that other parts of r2ccl read.

/// Short environment names for common keys, as NCCL users expect them.
pub const ENV_ALIASES: &[(&str, &str)] = &[
    ("R2CCL_DEBUG", "log.level"),
    ("R2CCL_DEBUG_SUBSYS", "log.subsys"),
    ("R2CCL_DEBUG_FILE", "log.file"),
    ("R2CCL_OOB_IFACE", "bootstrap.oob_iface"),
    ("R2CCL_NODE", "bootstrap.node"),
    ("R2CCL_NICS", "transport.nics"),
    ("R2CCL_TOPO_FILE", "topo.file"),
    ("R2CCL_TOPO_DUMP_FILE", "topo.dump_file"),
    ("R2CCL_METRICS_ADDR", "metrics.addr"),
];

/// Variables that are not configuration keys but are read elsewhere (launch identity,
/// fault injection, the config file path, benchmark knobs, the UCX a build uses, which cargo
/// sets for every process it starts in this workspace). Documented in `docs/configuration.md`.
pub const IDENTITY_VARS: &[&str] = &[
    "R2CCL_CONFIG",
    "R2CCL_RANK",
    "R2CCL_WORLD_SIZE",
    "R2CCL_ROOT",
    "R2CCL_SECRET",
    "R2CCL_UNIQUE_ID",
    "R2CCL_FAULT",
    "R2CCL_BENCH_REPS",
    "R2CCL_UCX_DIR",
    "R2CCL_UCX_ALLOW_MISMATCH",
    "R2CCL_INSECURE_DERIVED_SECRET",
    "R2CCL_ROOT_IP",
    "R2CCL_TEST_FAULT_INJECTION",
    "R2CCL_PYTHON",
];

/// What an `R2CCL_*` variable is.
pub(crate) enum EnvKey {
    /// A configuration key (dotted path), by alias or as `R2CCL_<SECTION>__<KEY>`.
    Config(String),
    /// A variable read elsewhere ([`IDENTITY_VARS`]).
    Identity,
    /// Neither: a variable of another r2ccl version, or a typo.
    Unknown,
}

/// Map one `R2CCL_*` variable to what it is.
pub(crate) fn key_of(var: &str) -> EnvKey {
    if let Some((_, key)) = ENV_ALIASES.iter().find(|(v, _)| *v == var) {
        return EnvKey::Config((*key).to_owned());
    }
    if IDENTITY_VARS.contains(&var) {
        return EnvKey::Identity;
    }
    let rest = var.strip_prefix("R2CCL_").unwrap_or(var);
    if rest.contains("__") {
        let key = rest.split("__").map(str::to_ascii_lowercase).collect::<Vec<_>>().join(".");
        return EnvKey::Config(key);
    }
    EnvKey::Unknown
}
