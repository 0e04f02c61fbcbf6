//! [`CommBuilder`]: how a rank starts a communicator, from a unique id or a launcher's
//! environment.

use crate::bootstrap::{LaunchInfo, Root, UniqueId};
use crate::comm::{CommOptions, Communicator};
use crate::error::CommError;
use r2ccl_config::Config;
use r2ccl_core::{subsys, Rank};

/// Starts a [`Communicator`]: [`Communicator::builder`] for an explicit rank, world and
/// unique id, [`CommBuilder::from_env`] for a launcher (torchrun, OpenMPI's `mpirun`, Slurm,
/// or `R2CCL_UNIQUE_ID`/`R2CCL_RANK`/`R2CCL_WORLD_SIZE`).
#[must_use = "a builder does nothing until init()"]
pub struct CommBuilder {
    rank: u32,
    world: u32,
    root_addr: String,
    secret: crate::bootstrap::Secret,
    config: Config,
    node: Option<String>,
    nics: Option<Vec<String>>,
    root: Option<Root>,
    env_faults: bool,
}

impl std::fmt::Debug for CommBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommBuilder")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("root_addr", &self.root_addr)
            .field("node", &self.node)
            .field("nics", &self.nics)
            .field("serves_root", &self.root.is_some())
            .finish_non_exhaustive()
    }
}

impl Communicator {
    /// A builder for rank `rank` of `world` ranks that meet at `id` (rank 0's
    /// [`Root::unique_id`]); the configuration is the default one until
    /// [`CommBuilder::config`].
    pub fn builder(rank: Rank, world: u32, id: UniqueId) -> CommBuilder {
        CommBuilder {
            rank: rank.0,
            world,
            root_addr: id.root.to_string(),
            secret: id.secret,
            config: Config::default(),
            node: None,
            nics: None,
            root: None,
            env_faults: false,
        }
    }

    /// A communicator from the launcher's environment and the configuration of the
    /// environment and `R2CCL_CONFIG` (see [`CommBuilder::from_env`]).
    pub fn from_env() -> Result<Communicator, CommError> {
        let config = r2ccl_config::load().map_err(|e| CommError::Invalid(e.to_string()))?;
        CommBuilder::from_env(config)?.init()
    }
}

impl CommBuilder {
    /// A builder from the launcher environment (`R2CCL_UNIQUE_ID`, `R2CCL_*`, OpenMPI, Slurm,
    /// torchrun, or the unique id through PMIx, see [`LaunchInfo::from_process_env_within`]) with
    /// `config`. The node defaults to `bootstrap.node`, else the host name; the
    /// data NICs to `transport.nics`, else those `topo.file` lists for this node, else the
    /// discovered physical NICs other than the OOB interface (`lo` when there are none).
    pub fn from_env(config: Config) -> Result<Self, CommError> {
        let within = std::time::Duration::from_millis(config.bootstrap.connect_timeout_ms);
        let launch = LaunchInfo::from_process_env_within(within).map_err(|e| CommError::Invalid(e.to_string()))?;
        if launch.secret_is_derived {
            tracing::warn!(target: subsys::BOOTSTRAP, "no R2CCL_SECRET or unique id: using a secret derived from the job id");
        }
        Ok(Self {
            rank: launch.rank,
            world: launch.world_size,
            root_addr: launch.root,
            secret: launch.secret,
            config,
            node: None,
            nics: None,
            // Rank 0's rendezvous, when the PMIx exchange bound it.
            root: if launch.rank == 0 { crate::bootstrap::pmix::take_root() } else { None },
            env_faults: false,
        })
    }

    /// The validated configuration (deadlines, chunking, detection timing, policy).
    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// The node identity: ranks with the same name share their NICs.
    pub fn node(mut self, name: impl Into<String>) -> Self {
        self.node = Some(name.into());
        self
    }

    /// The data NICs' interface names, by rail (the same name twice is two rails on one
    /// interface, as on a single host).
    pub fn nics<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.nics = Some(names.into_iter().map(Into::into).collect());
        self
    }

    /// Rank 0 serves the rendezvous on this already bound [`Root`] (the one whose unique id
    /// the ranks were given), so no other socket can take its port in between. `None` binds
    /// the id's address at init.
    pub fn root(mut self, root: impl Into<Option<Root>>) -> Self {
        self.root = root.into();
        self
    }

    /// Testing and drills only: read `R2CCL_FAULT` and inject the software faults it names
    /// (docs/faults.md). Off unless asked for.
    pub fn fault_injection_from_env(mut self, on: bool) -> Self {
        self.env_faults = on;
        self
    }

    /// Start the communicator: returns when every rank is connected, or with a bounded error
    /// (by `bootstrap.connect_timeout_ms`).
    pub fn init(self) -> Result<Communicator, CommError> {
        if self.world == 0 || self.rank >= self.world {
            return Err(CommError::Invalid(format!("rank {} of world {}", self.rank, self.world)));
        }
        let listener = match self.root {
            Some(_) if self.rank != 0 => {
                return Err(CommError::Invalid(format!("rank {} was given the root; only rank 0 serves it", self.rank)))
            }
            Some(root) if root.secret() != &self.secret => {
                return Err(CommError::Invalid("the root's secret is not the unique id's".into()))
            }
            Some(root) => Some(root.into_listener()),
            None => None,
        };
        install_logging(&self.config.log);
        for why in &self.config.ignored_env {
            tracing::warn!(target: subsys::ENV, "ignored environment variable {why}");
        }
        crate::metrics::install_from_config(&self.config.metrics);
        let node = self.node.unwrap_or_else(|| CommOptions::default_node(&self.config));
        let nics = match self.nics {
            Some(n) => n,
            None => CommOptions::default_nics(&self.config, &node, &self.root_addr)?,
        };
        let opts = CommOptions {
            rank: self.rank,
            world: self.world,
            root: self.root_addr,
            secret: self.secret,
            node,
            nics,
            config: self.config,
            env_faults: self.env_faults,
        };
        let (major, minor, release) = r2ccl_ucx::ucx_version();
        tracing::info!(
            target: subsys::INIT,
            "r2ccl {} (UCX {major}.{minor}.{release}): rank {} of {}, node {:?}, data NICs {:?}",
            env!("CARGO_PKG_VERSION"),
            opts.rank,
            opts.world,
            opts.node,
            opts.nics
        );
        Communicator::init_with(opts, listener)
    }
}

/// `R2CCL_DEBUG` in any application (as `NCCL_DEBUG`): when it or `R2CCL_DEBUG_FILE` is set,
/// install the log subscriber unless the process has one (once per process).
fn install_logging(log: &r2ccl_config::LogConfig) {
    if std::env::var_os("R2CCL_DEBUG").is_none() && std::env::var_os("R2CCL_DEBUG_FILE").is_none() {
        return;
    }
    // The environment wins over the configuration (built without it by `Communicator::builder`).
    let var = |name: &str, fallback: &str| std::env::var(name).unwrap_or_else(|_| fallback.to_owned());
    let level = var("R2CCL_DEBUG", &log.level);
    let spec =
        r2ccl_log::LogSpec::parse(&level, &var("R2CCL_DEBUG_SUBSYS", &log.subsys), &var("R2CCL_DEBUG_FILE", &log.file));
    match spec.map(|spec| r2ccl_log::init_unless_set(&spec)) {
        Ok(Ok(true)) => {
            tracing::info!(target: subsys::INIT, "r2ccl {}: logging at {level} (R2CCL_DEBUG)", env!("CARGO_PKG_VERSION"));
        }
        Ok(Ok(false)) => {}
        Ok(Err(e)) | Err(e) => tracing::warn!(target: subsys::INIT, error = %e, "R2CCL_DEBUG: no log output"),
    }
}
