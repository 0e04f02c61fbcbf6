//! Scenario files: bad input is rejected with an error naming it; the bundled scenarios parse and run.
#![allow(clippy::unwrap_used, reason = "tests")]

use r2ccl_sim::collective::Scheme;
use r2ccl_sim::reproduce::SCENARIOS;
use r2ccl_sim::scenario::Scenario;

const BASE: &str = r#"
name = "t"
strategies = ["balance", "hot_repair", "no_resilience"]
[fabric]
nodes = 3
gpus_per_node = 2
nics_per_node = 4
nic_gbps = 100
[workload]
kind = "allreduce"
bytes_mib = 16
"#;

fn err(text: &str) -> String {
    Scenario::from_toml(text).unwrap_err().to_string()
}

#[test]
fn unknown_keys_are_named() {
    assert!(err(&BASE.replace("nic_gbps = 100", "nic_gbps = 100\nnic_speed = 3")).contains("nic_speed"));
    assert!(err(&format!("{BASE}\nbogus = 1")).contains("bogus"));
    let f = "[[failures]]\nnode = 0\nrail = 0\nkind = \"down\"\nat_s = 0.0\ncolour = 1\n";
    assert!(err(&format!("{BASE}{f}")).contains("colour"));
    // Every table: the workload, detection and recovery settings.
    assert!(err(&BASE.replace("bytes_mib = 16", "bytes_mib = 16\nbyte_mib = 3")).contains("byte_mib"));
    assert!(err(&format!("{BASE}[detection]\nerror_msec = 3\n")).contains("error_msec"));
    assert!(err(&format!("{BASE}[recovery]\nrestart_minutes = 3\n")).contains("restart_minutes"));
    // Unknown values of enumerations are named too.
    let e = err(&BASE.replace("\"no_resilience\"", "\"no_such_strategy\""));
    assert!(e.contains("no_such_strategy"), "{e}");
    let e = err(&format!("{BASE}[[failures]]\nnode = 0\nrail = 0\nkind = \"melted\"\nat_s = 0.0\n"));
    assert!(e.contains("melted"), "{e}");
}

#[test]
fn impossible_topology_is_named() {
    for (from, to, field) in [
        ("nodes = 3", "nodes = 0", "fabric.nodes"),
        ("nic_gbps = 100", "nic_gbps = -1", "fabric.nic_gbps"),
        ("gpus_per_node = 2", "gpus_per_node = 0", "fabric.gpus_per_node"),
        ("nics_per_node = 4", "nics_per_node = 65", "fabric.nics_per_node"),
        ("nic_gbps = 100", "nic_gbps = 100\nspine_oversubscription = 0", "fabric.spine_oversubscription"),
        ("nic_gbps = 100", "nic_gbps = 100\nnic_latency_us = -2", "fabric.nic_latency_us"),
    ] {
        let e = err(&BASE.replace(from, to));
        assert!(e.contains(field) && e.contains("impossible topology"), "{to}: {e}");
    }
    // A workload that does not fit the fabric is named as well.
    let tp = BASE.replace(
        "kind = \"allreduce\"\nbytes_mib = 16",
        "kind = \"tensor_pipeline\"\nparams = 1e9\nhidden = 1024\npp = 2\ndp = 2\nmicro_batches = 4\n\
         micro_batch_tokens = 1024\ngpu = { tflops = 989, mfu = 0.4 }",
    );
    let e = err(&tp);
    assert!(e.contains("workload.pp") && e.contains("fabric.nodes"), "{e}");
}

#[test]
fn the_command_line_tool_rejects_bad_files_naming_the_problem() {
    let dir = std::env::temp_dir().join(format!("r2ccl-sim-bad-input-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases = [
        ("unknown_key.toml", format!("{BASE}\nbogus = 1"), "bogus"),
        ("topology.toml", BASE.replace("nodes = 3", "nodes = 0"), "fabric.nodes"),
        ("component.toml", format!("{BASE}[[failures]]\nnode = 9\nrail = 0\nkind = \"down\"\nat_s = 0.0\n"), "node 9"),
    ];
    for (name, text, needle) in cases {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_r2ccl-sim")).arg("run").arg(&path).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name} was accepted");
        assert!(stderr.contains(needle), "{name}: {stderr}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn failure_of_missing_component_is_named() {
    let f = "[[failures]]\nnode = 7\nrail = 0\nkind = \"down\"\nat_s = 0.0\n";
    let e = err(&format!("{BASE}{f}"));
    assert!(e.contains("node 7"), "{e}");
    let f = "[[failures]]\nnode = 1\nrail = 5\nkind = \"down\"\nat_s = 0.0\n";
    let e = err(&format!("{BASE}{f}"));
    assert!(e.contains("rail 5"), "{e}");
}

#[test]
fn allreduce_scenario_orders_strategies_sensibly() {
    let f = "[[failures]]\nnode = 1\nrail = 0\nkind = \"black_hole\"\nat_s = 0.0\n";
    let rep = Scenario::from_toml(&format!("{BASE}{f}")).unwrap().run().unwrap();
    let get = |s: Scheme| rep.rows.iter().find(|r| r.strategy == s).unwrap();
    assert!(get(Scheme::Balance).seconds < get(Scheme::HotRepair).seconds);
    assert!(get(Scheme::NoResilience).seconds.is_infinite(), "fail-stop hangs");
}

#[test]
fn bundled_scenarios_parse() {
    for (name, text) in SCENARIOS {
        Scenario::from_toml(text).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn in_flight_failure_is_repaired_with_bounded_cost() {
    // A 2-node run hit mid-collective: live migration finishes; fail-stop hangs.
    let f = "[[failures]]\nnode = 0\nrail = 1\nkind = \"down\"\nat_s = 0.5\n";
    let rep = Scenario::from_toml(&format!("{BASE}{f}")).unwrap().run().unwrap();
    let bal = rep.rows.iter().find(|r| r.strategy == Scheme::Balance).unwrap();
    assert!(bal.failure_induced_s.is_finite() && bal.failure_induced_s > 0.0);
    let nr = rep.rows.iter().find(|r| r.strategy == Scheme::NoResilience).unwrap();
    assert!(nr.failure_induced_s > 3600.0, "crash and restart costs the restart time");
}
