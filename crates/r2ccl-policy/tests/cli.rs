//! The `r2ccl-plan` binary: text output, `--json` output and bad input (exit status 2).
#![allow(clippy::unwrap_used, reason = "tests: a failure is a test failure")]

use std::process::Command;

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_r2ccl-plan")).args(args).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
}

#[test]
fn text_lists_strategies_bound_and_choice() {
    let (code, out, err) = run(&["--nodes", "4", "--nics", "2", "--fail", "1:0", "--bytes", "1GiB"]);
    assert_eq!(code, 0, "{err}");
    for s in [
        "fault-free (t_nf)",
        "balance",
        "single_backup",
        "r2ccl_allreduce",
        "recursive",
        "four_stage",
        "lower bound",
        "chosen: four_stage",
    ] {
        assert!(out.contains(s), "missing {s:?} in\n{out}");
    }
    let bal = out.lines().find(|l| l.starts_with("balance")).unwrap();
    assert!(bal.trim_end().ends_with("1.998") || bal.trim_end().ends_with("2.000"), "{bal}");
    let lb = out.lines().find(|l| l.starts_with("lower bound")).unwrap();
    assert!(lb.trim_end().ends_with("1.331") || lb.trim_end().ends_with("1.333"), "{lb}");
}

#[test]
fn json_is_one_object_with_the_agreed_fields() {
    let (code, out, err) =
        run(&["--nodes", "4", "--nics", "2", "--fail", "1:0", "--bytes", "1G", "--json", "--alpha-us", "0"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim().lines().count(), 1);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let t_nf = v["t_nf"].as_f64().unwrap();
    let lb = v["lower_bound"].as_f64().unwrap();
    assert!(((lb / t_nf) - 4.0 / 3.0).abs() < 1e-9);
    let s = v["strategies"].as_object().unwrap();
    assert!(s.get("ring").is_none(), "ring does not apply with a failed NIC");
    for k in ["single_backup", "balance", "r2ccl_allreduce", "recursive", "four_stage"] {
        assert!(s[k].as_f64().unwrap() > 0.0, "{k}");
    }
    assert!((s["balance"].as_f64().unwrap() / t_nf - 2.0).abs() < 1e-9);
    assert_eq!(v["chosen"], "four_stage");
    // 1G = 2^30 bytes, as in nccl-tests.
    assert_eq!(v["bytes"], 1u64 << 30);

    let (code, out, _) = run(&["--nodes", "8", "--nics", "8", "--bytes", "256M", "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let s = v["strategies"].as_object().unwrap();
    assert!(s.contains_key("ring") && !s.contains_key("balance") && !s.contains_key("four_stage"));
    assert_eq!(v["chosen"], "ring");
}

#[test]
fn bad_input_exits_2_with_one_line() {
    let cases: &[(&[&str], &str)] = &[
        (&["--nics", "2", "--bytes", "1M"], "--nodes is required"),
        (&["--nodes", "0", "--nics", "2", "--bytes", "1M"], "--nodes must be at least 1"),
        (&["--nodes", "2", "--nics", "2", "--bytes", "1X"], "unknown suffix"),
        (&["--nodes", "2", "--nics", "2", "--bytes", "lots"], "does not start with a number"),
        (&["--nodes", "2", "--nics", "2", "--bytes", "1M", "--fail", "5:0"], "node 5 is out of range"),
        (&["--nodes", "2", "--nics", "2", "--bytes", "1M", "--fail", "1:2"], "NIC 2 is out of range"),
        (&["--nodes", "2", "--nics", "2", "--bytes", "1M", "--fail", "1:0,1:1"], "node1 has no usable NIC"),
        (&["--nodes", "2", "--nics", "2", "--bytes", "1M", "--fail", "x"], "is not NODE:NIC"),
        (&["--nodes", "2", "--nics", "2", "--bytes", "1M", "--ranks-per-node", "0"], "ranks per node"),
        (&["--nodes", "2", "--nics", "2", "--bytes", "1M", "--frobnicate"], "unknown argument"),
        (&["--nodes", "2", "--nics", "2", "--bytes"], "--bytes needs a value"),
        (&["--nodes", "2", "--nics", "2", "--bytes", "99999999999G"], "too large"),
    ];
    for (args, msg) in cases {
        let (code, out, err) = run(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("r2ccl-plan: error: ") && err.contains(msg), "{args:?}: {err}");
    }
}

#[test]
fn zero_bytes_is_accepted() {
    let (code, out, _) = run(&["--nodes", "3", "--nics", "2", "--bytes", "0", "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["t_nf"].as_f64(), Some(0.0));
}

#[test]
fn communicator_plans_as_a_communicator_does() {
    // 3 nodes x 2 rails, rail-only: nodes 1 and 2 share no usable rail. A communicator plans
    // with their failed NICs (its engine steers around them): the plain ring. The default
    // topology has a spine, so the four-stage schedule crosses rails instead.
    let args = ["--nodes", "3", "--nics", "2", "--fail", "1:0,2:1", "--bytes", "16M", "--json"];
    let chosen = |extra: &[&str]| {
        let (code, out, err) = run(&[&args[..], extra].concat());
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        v["chosen"].as_str().unwrap().to_owned()
    };
    assert_eq!(chosen(&["--communicator"]), "ring");
    assert_eq!(chosen(&[]), "four_stage");
    // With one NIC lost the communicator's plan is the default topology's.
    let one = ["--nodes", "4", "--nics", "2", "--fail", "1:0", "--bytes", "64M", "--json", "--alpha-us", "20"];
    let (_, a, _) = run(&one);
    let (_, b, _) = run(&[&one[..], &["--communicator"]].concat());
    assert_eq!(a, b);
}
