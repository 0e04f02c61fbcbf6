//! Scenario files: bad input is rejected with an error naming it; the bundled scenarios parse and run.
#![allow(clippy::unwrap_used, reason = "tests")]

use r2ccl_sim::collective::Strategy;
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
}

#[test]
fn impossible_topology_is_named() {
    assert!(err(&BASE.replace("nodes = 3", "nodes = 0")).contains("fabric.nodes"));
    assert!(err(&BASE.replace("nic_gbps = 100", "nic_gbps = -1")).contains("fabric.nic_gbps"));
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
    let get = |s: Strategy| rep.rows.iter().find(|r| r.strategy == s).unwrap();
    assert!(get(Strategy::Balance).seconds < get(Strategy::HotRepair).seconds);
    assert!(get(Strategy::NoResilience).seconds.is_infinite(), "fail-stop hangs");
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
    let bal = rep.rows.iter().find(|r| r.strategy == Strategy::Balance).unwrap();
    assert!(bal.failure_induced_s.is_finite() && bal.failure_induced_s > 0.0);
    let nr = rep.rows.iter().find(|r| r.strategy == Strategy::NoResilience).unwrap();
    assert!(nr.failure_induced_s > 3600.0, "crash and restart costs the restart time");
}
