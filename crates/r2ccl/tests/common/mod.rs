//! Shared set-up of the communicator tests: every rank a thread of this process, its own node
//! with two `lo` rails, over UCX on loopback; rank 0 creates the unique id and serves the
//! rendezvous on the listener it created it with.
#![allow(dead_code, reason = "each test binary uses its own part")]

use r2ccl::{CommBuilder, Communicator, Config, Rank, Root, UniqueId};
use std::thread::JoinHandle;

/// The tests' configuration: connect timeout 20 s, the given peer timeout.
pub fn config(peer_timeout_ms: u64) -> Config {
    let mut config = Config::default();
    config.bootstrap.connect_timeout_ms = 20_000;
    config.bootstrap.peer_timeout_ms = peer_timeout_ms;
    config
}

/// A builder for `rank` of `world` at `id`: node `node<rank>`, two rails on `lo`.
pub fn builder(rank: u32, world: u32, id: &UniqueId, config: Config) -> CommBuilder {
    Communicator::builder(Rank(rank), world, id.clone()).node(format!("node{rank}")).nics(["lo", "lo"]).config(config)
}

/// Start `world` ranks with `config`, each running `body(rank, its communicator)` on its own
/// thread.
pub fn spawn_ranks_with<T, F>(world: u32, config: Config, body: F) -> Vec<JoinHandle<T>>
where
    T: Send + 'static,
    F: Fn(u32, Communicator) -> T + Send + Clone + 'static,
{
    spawn(world, config, false, body)
}

/// As [`spawn_ranks_with`], the communicators reading `R2CCL_FAULT` (software fault injection,
/// `docs/faults.md`): set it before calling.
#[allow(dead_code, reason = "not every test binary injects faults")]
pub fn spawn_ranks_faulted<T, F>(world: u32, config: Config, body: F) -> Vec<JoinHandle<T>>
where
    T: Send + 'static,
    F: Fn(u32, Communicator) -> T + Send + Clone + 'static,
{
    spawn(world, config, true, body)
}

fn spawn<T, F>(world: u32, config: Config, faults: bool, body: F) -> Vec<JoinHandle<T>>
where
    T: Send + 'static,
    F: Fn(u32, Communicator) -> T + Send + Clone + 'static,
{
    let root = Root::create([127, 0, 0, 1].into()).unwrap();
    let id = root.unique_id().unwrap();
    let mut root = Some(root);
    (0..world)
        .map(|rank| {
            let (id, body, config) = (id.clone(), body.clone(), config.clone());
            let root = if rank == 0 { root.take() } else { None };
            std::thread::spawn(move || {
                let comm =
                    builder(rank, world, &id, config).root(root).fault_injection_from_env(faults).init().unwrap();
                body(rank, comm)
            })
        })
        .collect()
}

/// Start `world` ranks with the given peer timeout (see [`spawn_ranks_with`]).
pub fn spawn_ranks<T, F>(world: u32, peer_timeout_ms: u64, body: F) -> Vec<JoinHandle<T>>
where
    T: Send + 'static,
    F: Fn(u32, Communicator) -> T + Send + Clone + 'static,
{
    spawn_ranks_with(world, config(peer_timeout_ms), body)
}
