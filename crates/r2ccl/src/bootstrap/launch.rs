//! Rank, world size, rendezvous address and secret from a launcher's environment.
//!
//! Precedence: `R2CCL_UNIQUE_ID` (address and secret) over `R2CCL_ROOT`/`R2CCL_SECRET`
//! over torchrun's `MASTER_ADDR`/`MASTER_PORT`; rank and size from `R2CCL_RANK`/
//! `R2CCL_WORLD_SIZE`, then OpenMPI (`OMPI_COMM_WORLD_RANK`/`_SIZE`), then Slurm
//! (`SLURM_PROCID`/`SLURM_NTASKS`), then torchrun (`RANK`/`WORLD_SIZE`). Without a secret
//! one is derived from public job facts (the job id the launcher exports, the root address,
//! the world size), which anyone who knows them can compute: that is allowed only when the root
//! is on this host (loopback), or when [`INSECURE_SECRET_ENV`] is `1`; [`LaunchInfo::secret_is_derived`]
//! says so (the caller logs a warning). Under a PMIx launcher (`PMIX_NAMESPACE`, as OpenMPI's
//! `mpirun` sets) with no rendezvous address, [`LaunchInfo::from_process_env`] gets the unique id
//! through PMIx instead: rank 0 creates it with a random secret and publishes it (`pmix.rs`).
//! Errors never echo a secret. Variables that are not UTF-8 are ignored, not a panic.

use super::{Secret, UniqueId};
use std::collections::BTreeMap;

/// Opt-in, by name insecure, to a secret derived from public job facts on a multi-host run.
pub const INSECURE_SECRET_ENV: &str = "R2CCL_INSECURE_DERIVED_SECRET";

/// Which launcher convention supplied the rank and size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaunchSource {
    /// `R2CCL_RANK` / `R2CCL_WORLD_SIZE`.
    R2ccl,
    /// OpenMPI / PMIx (`OMPI_COMM_WORLD_*`).
    OpenMpi,
    /// Slurm `srun` (`SLURM_PROCID`, `SLURM_NTASKS`).
    Slurm,
    /// torchrun (`RANK`, `WORLD_SIZE`).
    Torchrun,
}

/// Everything a rank needs to join the rendezvous.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchInfo {
    /// This process's rank.
    pub rank: u32,
    /// Number of ranks.
    pub world_size: u32,
    /// `host:port` of rank 0's rendezvous listener.
    pub root: String,
    /// The job secret.
    pub secret: Secret,
    /// Where rank and size came from.
    pub source: LaunchSource,
    /// True when no secret was given and one was derived from the job id.
    pub secret_is_derived: bool,
}

/// Why the environment does not describe a launch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LaunchError {
    /// No launcher variables for rank and size.
    #[error(
        "no rank/world size in the environment: set R2CCL_RANK and R2CCL_WORLD_SIZE, or launch with mpirun, srun or torchrun"
    )]
    NoRank,
    /// No rendezvous address.
    #[error("no rendezvous address: set R2CCL_UNIQUE_ID, R2CCL_ROOT=host:port, or MASTER_ADDR and MASTER_PORT")]
    NoRoot,
    /// No secret for a rendezvous beyond this host.
    #[error(
        "no R2CCL_SECRET or R2CCL_UNIQUE_ID for a rendezvous at {root}, which is not on this host: a secret derived \
         from the job id would let anyone who knows it join or forge data; set R2CCL_SECRET (32 hex digits, the same \
         on every rank), or {INSECURE_SECRET_ENV}=1 to accept the derived one"
    )]
    NoSecret {
        /// The rendezvous address.
        root: String,
    },
    /// The PMIx exchange of the unique id failed.
    #[error("no rendezvous address set, and getting rank 0's unique id through PMIx failed: {0}")]
    Pmix(String),
    /// A variable that is present but unusable.
    #[error("environment variable {var}={value:?}: {why}")]
    Bad {
        /// The variable.
        var: String,
        /// Its value.
        value: String,
        /// What is wrong.
        why: String,
    },
}

fn bad(var: &str, value: &str, why: impl Into<String>) -> LaunchError {
    LaunchError::Bad { var: var.into(), value: value.into(), why: why.into() }
}

fn number(env: &BTreeMap<String, String>, var: &str) -> Result<Option<u32>, LaunchError> {
    env.get(var).map(|v| v.trim().parse::<u32>().map_err(|_| bad(var, v, "not a non-negative integer"))).transpose()
}

impl LaunchInfo {
    /// Read the launch description from this process's environment.
    ///
    /// Under a PMIx launcher with no rendezvous address (`R2CCL_UNIQUE_ID`, `R2CCL_ROOT`,
    /// `MASTER_ADDR`), the unique id comes through PMIx (once per process, waiting at most
    /// `deadline` for every rank); rank 0's communicator from [`crate::CommBuilder::from_env`]
    /// then serves the rendezvous it bound.
    pub fn from_process_env_within(deadline: std::time::Duration) -> Result<Self, LaunchError> {
        // vars_os: a variable that is not UTF-8 (none of ours can be) is skipped, not a panic.
        let mut env: BTreeMap<String, String> =
            std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))).collect();
        match Self::from_env(&env) {
            Err(LaunchError::NoRoot) if super::pmix::launched_by_pmix(&env) => {
                let id = super::pmix::unique_id(deadline).map_err(LaunchError::Pmix)?;
                env.insert("R2CCL_UNIQUE_ID".into(), id.to_string());
                Self::from_env(&env)
            }
            other => other,
        }
    }

    /// [`LaunchInfo::from_process_env_within`] with the configured bootstrap deadline
    /// (`bootstrap.connect_timeout_ms`, from the environment and `R2CCL_CONFIG`).
    pub fn from_process_env() -> Result<Self, LaunchError> {
        let ms = r2ccl_config::load().map_or_else(
            |_| r2ccl_config::Config::default().bootstrap.connect_timeout_ms,
            |c| c.bootstrap.connect_timeout_ms,
        );
        Self::from_process_env_within(std::time::Duration::from_millis(ms))
    }

    /// Read the launch description from `env`.
    pub fn from_env(env: &BTreeMap<String, String>) -> Result<Self, LaunchError> {
        let conventions = [
            ("R2CCL_RANK", "R2CCL_WORLD_SIZE", LaunchSource::R2ccl),
            ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", LaunchSource::OpenMpi),
            ("SLURM_PROCID", "SLURM_NTASKS", LaunchSource::Slurm),
            ("RANK", "WORLD_SIZE", LaunchSource::Torchrun),
        ];
        let mut found = None;
        for (rv, sv, source) in conventions {
            if let (Some(rank), Some(size)) = (number(env, rv)?, number(env, sv)?) {
                if size == 0 {
                    return Err(bad(sv, "0", "world size must be at least 1"));
                }
                if rank >= size {
                    return Err(bad(rv, &rank.to_string(), format!("rank must be below {sv}={size}")));
                }
                found = Some((rank, size, source));
                break;
            }
        }
        let (rank, world_size, source) = found.ok_or(LaunchError::NoRank)?;

        let uid = env
            .get("R2CCL_UNIQUE_ID")
            .map(|v| v.parse::<UniqueId>().map_err(|e| bad("R2CCL_UNIQUE_ID", &super::uid::redacted(v), e.to_string())))
            .transpose()?;
        let root = match (&uid, env.get("R2CCL_ROOT"), env.get("MASTER_ADDR"), env.get("MASTER_PORT")) {
            (Some(u), ..) => u.root.to_string(),
            (None, Some(r), ..) => {
                if !r.contains(':') {
                    return Err(bad("R2CCL_ROOT", r, "expected host:port"));
                }
                r.clone()
            }
            (None, None, Some(a), Some(p)) => {
                p.parse::<u16>().map_err(|_| bad("MASTER_PORT", p, "not a port number"))?;
                if a.contains(':') {
                    format!("[{a}]:{p}")
                } else {
                    format!("{a}:{p}")
                }
            }
            _ => return Err(LaunchError::NoRoot),
        };
        let (secret, secret_is_derived) = match (uid, env.get("R2CCL_SECRET")) {
            (Some(u), _) => (u.secret, false),
            (None, Some(s)) => {
                (Secret::from_hex(s).map_err(|e| bad("R2CCL_SECRET", "(hidden)", e.to_string()))?, false)
            }
            (None, None) => {
                let job = ["TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"]
                    .iter()
                    .find_map(|v| env.get(*v).map(|j| format!("{v}={j}")))
                    .unwrap_or_default();
                if !is_local(&root) && env.get(INSECURE_SECRET_ENV).map(String::as_str) != Some("1") {
                    return Err(LaunchError::NoSecret { root });
                }
                (Secret::derive(&format!("{job}|{root}|{world_size}")), true)
            }
        };
        Ok(Self { rank, world_size, root, secret, source, secret_is_derived })
    }
}

/// Whether the `host:port` rendezvous address is on this host (loopback).
fn is_local(root: &str) -> bool {
    let host = root.rsplit_once(':').map_or(root, |(h, _)| h).trim_start_matches('[').trim_end_matches(']');
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect()
    }

    #[test]
    fn unique_id_wins_over_everything() {
        let uid = "r2ccl1:127.0.0.1:4000:000102030405060708090a0b0c0d0e0f";
        let e = env(&[
            ("R2CCL_UNIQUE_ID", uid),
            ("R2CCL_ROOT", "10.0.0.1:1"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "2"),
            ("R2CCL_RANK", "1"),
            ("R2CCL_WORLD_SIZE", "4"),
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
        ]);
        let l = LaunchInfo::from_env(&e).unwrap();
        assert_eq!((l.rank, l.world_size, l.root.as_str(), l.source), (1, 4, "127.0.0.1:4000", LaunchSource::R2ccl));
        assert!(!l.secret_is_derived);
        assert_eq!(l.secret.to_hex(), "000102030405060708090a0b0c0d0e0f");
    }

    #[test]
    fn launcher_conventions_in_order() {
        let ompi = env(&[("OMPI_COMM_WORLD_RANK", "2"), ("OMPI_COMM_WORLD_SIZE", "3"), ("R2CCL_ROOT", "127.0.0.1:1")]);
        assert_eq!(LaunchInfo::from_env(&ompi).unwrap().source, LaunchSource::OpenMpi);
        let slurm =
            env(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2"), ("R2CCL_ROOT", "127.0.0.1:1"), ("SLURM_JOB_ID", "77")]);
        let l = LaunchInfo::from_env(&slurm).unwrap();
        assert_eq!(l.source, LaunchSource::Slurm);
        assert!(l.secret_is_derived);
        let torch = env(&[("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "::1"), ("MASTER_PORT", "29500")]);
        let l = LaunchInfo::from_env(&torch).unwrap();
        assert_eq!((l.source, l.root.as_str()), (LaunchSource::Torchrun, "[::1]:29500"));
        let both = env(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("R2CCL_ROOT", "127.0.0.1:1"),
        ]);
        assert_eq!(LaunchInfo::from_env(&both).unwrap().source, LaunchSource::Slurm);
    }

    #[test]
    fn a_derived_secret_is_refused_beyond_this_host_unless_asked_for() {
        let base = [("R2CCL_RANK", "1"), ("R2CCL_WORLD_SIZE", "2")];
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut v = base.to_vec();
            v.extend_from_slice(extra);
            LaunchInfo::from_env(&env(&v))
        };
        let e = with(&[("R2CCL_ROOT", "10.1.2.3:29500")]).unwrap_err();
        assert!(matches!(e, LaunchError::NoSecret { .. }), "{e}");
        assert!(e.to_string().contains("R2CCL_SECRET"), "{e}");
        assert!(with(&[("R2CCL_ROOT", "10.1.2.3:29500"), (INSECURE_SECRET_ENV, "1")]).unwrap().secret_is_derived);
        for local in ["127.0.0.1:29500", "localhost:1", "[::1]:7"] {
            assert!(with(&[("R2CCL_ROOT", local)]).unwrap().secret_is_derived, "{local}");
        }
        let s = "000102030405060708090a0b0c0d0e0f";
        assert!(!with(&[("R2CCL_ROOT", "10.1.2.3:29500"), ("R2CCL_SECRET", s)]).unwrap().secret_is_derived);
    }

    #[test]
    fn a_malformed_unique_id_is_not_echoed_with_its_secret() {
        let secret = "000102030405060708090a0b0c0d0e0fZZ";
        let id = format!("r2ccl1:127.0.0.1:4000:{secret}");
        let e = LaunchInfo::from_env(&env(&[("R2CCL_UNIQUE_ID", &id), ("R2CCL_RANK", "1"), ("R2CCL_WORLD_SIZE", "2")]))
            .unwrap_err()
            .to_string();
        assert!(!e.contains("0a0b0c0d"), "{e}");
        assert!(e.contains("127.0.0.1:4000"), "{e}");
        let e = LaunchInfo::from_env(&env(&[
            ("R2CCL_UNIQUE_ID", "nonsense-0a0b0c0d0e0f"),
            ("R2CCL_RANK", "1"),
            ("R2CCL_WORLD_SIZE", "2"),
        ]))
        .unwrap_err()
        .to_string();
        assert!(!e.contains("0a0b0c0d"), "{e}");
    }

    #[test]
    fn bad_environments_name_the_variable() {
        assert_eq!(LaunchInfo::from_env(&env(&[])), Err(LaunchError::NoRank));
        let e = LaunchInfo::from_env(&env(&[("R2CCL_RANK", "4"), ("R2CCL_WORLD_SIZE", "4"), ("R2CCL_ROOT", "h:1")]));
        assert!(e.unwrap_err().to_string().contains("R2CCL_RANK"));
        let e = LaunchInfo::from_env(&env(&[("R2CCL_RANK", "x"), ("R2CCL_WORLD_SIZE", "4")]));
        assert!(e.unwrap_err().to_string().contains("R2CCL_RANK=\"x\""));
        assert_eq!(
            LaunchInfo::from_env(&env(&[("R2CCL_RANK", "0"), ("R2CCL_WORLD_SIZE", "1")])),
            Err(LaunchError::NoRoot)
        );
        let e = LaunchInfo::from_env(&env(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "x"),
        ]));
        assert!(e.unwrap_err().to_string().contains("MASTER_PORT"));
        let e = LaunchInfo::from_env(&env(&[
            ("R2CCL_RANK", "0"),
            ("R2CCL_WORLD_SIZE", "1"),
            ("R2CCL_ROOT", "h:1"),
            ("R2CCL_SECRET", "12"),
        ]));
        let msg = e.unwrap_err().to_string();
        assert!(msg.contains("R2CCL_SECRET") && msg.contains("hidden"), "{msg}");
    }
}
