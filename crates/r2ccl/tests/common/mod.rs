//! Shared set-up of the communicator tests: every rank a thread of this process, its own node
//! with two `lo` rails, over UCX on loopback.
#![allow(dead_code, reason = "each test binary uses its own part")]

use r2ccl::bootstrap::Secret;
use r2ccl::comm::{CommOptions, Communicator};
use r2ccl_config::Config;
use std::net::TcpListener;
use std::thread::JoinHandle;

/// Options for `rank` of `world` with the given peer timeout (connect timeout 20 s).
pub fn options(rank: u32, world: u32, root: &str, secret: &Secret, peer_timeout_ms: u64) -> CommOptions {
    let mut config = Config::default();
    config.bootstrap.connect_timeout_ms = 20_000;
    config.bootstrap.peer_timeout_ms = peer_timeout_ms;
    CommOptions {
        rank,
        world,
        root: root.to_owned(),
        secret: secret.clone(),
        node: format!("node{rank}"),
        nics: vec!["lo".into(), "lo".into()],
        config,
        env_faults: false,
    }
}

/// Start `world` ranks, each running `body(rank, its communicator)` on its own thread.
pub fn spawn_ranks<T, F>(world: u32, peer_timeout_ms: u64, body: F) -> Vec<JoinHandle<T>>
where
    T: Send + 'static,
    F: Fn(u32, Communicator) -> T + Send + Clone + 'static,
{
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let root = format!("127.0.0.1:{port}");
    let secret = Secret::generate().unwrap();
    (0..world)
        .map(|rank| {
            let (root, secret, body) = (root.clone(), secret.clone(), body.clone());
            std::thread::spawn(move || {
                let comm = Communicator::init(options(rank, world, &root, &secret, peer_timeout_ms)).unwrap();
                body(rank, comm)
            })
        })
        .collect()
}
