//! `topo.file` over UCX on loopback: two ranks (threads, nodes `node0` and `node1`, two `lo`
//! rails each) take their NIC rates from a static topology description, and the communicator's
//! cluster model (visible in the `topo.dump_file` cluster view; the planner and the health view
//! start from it) carries each NIC's own rate, looked up by interface name; a rank whose node the
//! file does not list fails init with an error naming it.
#![allow(clippy::unwrap_used, reason = "a panic here is a test failure with a message")]

mod common;

use r2ccl::ReduceOp;

fn site(dir: &std::path::Path, hosts: &[&str]) -> String {
    let mut text = String::from("name = \"site\"\nrails = 2\n");
    for host in hosts {
        text.push_str(&format!(
            "\n[[nodes]]\nhostname = \"{host}\"\nranks = 1\nnuma_nodes = [{{ id = 0 }}]\n\
             \n[[nodes.nics]]\nname = \"lo\"\nrail = 0\nspeed_mbps = 1000\nvirtual = true\nnuma = 0\n\
             \n[[nodes.nics]]\nname = \"lo1\"\nrail = 1\nspeed_mbps = 3000\nvirtual = true\nnuma = 0\n"
        ));
    }
    let path = dir.join("site.toml");
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

#[test]
fn nic_rates_come_from_the_topology_file_and_unlisted_nodes_are_refused() {
    let dir = std::env::temp_dir().join(format!("r2ccl-topo-file-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = site(&dir, &["node0", "node1"]);
    let dump = dir.join("view.toml").to_string_lossy().into_owned();
    let mut config = common::config(10_000);
    config.topo.file = file;
    config.topo.dump_file = dump.clone();
    let threads = common::spawn_ranks_with(2, config, |rank, comm| {
        let mut out = [0u32];
        comm.all_reduce(&[rank + 1], &mut out, ReduceOp::Sum).unwrap();
        out[0]
    });
    for t in threads {
        assert_eq!(t.join().unwrap(), 3);
    }
    let view = std::fs::read_to_string(&dump).unwrap();
    // The view loads back as a valid cluster topology: one placement per rank, every NIC at the
    // file's rate for the interface it names (both rails are `lo` here: 1000; `lo1`'s 3000 is
    // never used).
    let back = r2ccl_topo::load_cluster_file(std::path::Path::new(&dump)).unwrap();
    assert_eq!(back.ranks().len(), 2, "{view}");
    for node in back.nodes() {
        let rates: Vec<u64> = node.nics.iter().map(|nic| nic.speed_mbps).collect();
        assert_eq!(rates, [1000, 1000], "{view}");
    }

    // A node the file does not list.
    let file = site(&dir, &["node1"]);
    let mut config = common::config(10_000);
    config.topo.file = file;
    let id = "r2ccl1:127.0.0.1:1:000102030405060708090a0b0c0d0e0f".parse().unwrap();
    let err = common::builder(0, 1, &id, config).init().expect_err("init refuses a node the file does not list");
    let err = err.to_string();
    assert!(err.contains("node0") && err.contains("topo.file"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
