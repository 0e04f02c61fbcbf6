//! Loading and validation: precedence, unknown keys, bad types, out-of-range values.
#![allow(clippy::unwrap_used, reason = "a panic here is a test failure with a message")]

use r2ccl_config::{load_from, load_str, Config, ConfigError};
use std::io::Write;

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

fn temp_file(name: &str, text: &str) -> String {
    let path = std::env::temp_dir().join(format!("r2ccl-config-{}-{name}.toml", std::process::id()));
    std::fs::File::create(&path).unwrap().write_all(text.as_bytes()).unwrap();
    path.display().to_string()
}

#[test]
fn defaults_need_nothing() {
    let c = load_str("", "test").unwrap();
    assert_eq!(c, Config::default());
    assert_eq!(c.log.level, "WARN");
    assert_eq!(c.bootstrap.peer_timeout_ms, 10_000);
}

#[test]
fn env_overrides_file_overrides_defaults() {
    let file = temp_file("prec", "[detect]\nprobe_timeout_ms = 30\nprobe_interval_ms = 900\n[log]\nlevel = \"INFO\"\n");
    let c = load_from(env(&[
        ("R2CCL_CONFIG", &file),
        ("R2CCL_DETECT__PROBE_TIMEOUT_MS", "40"),
        ("R2CCL_DEBUG", "TRACE"),
        ("R2CCL_NICS", "rail0, rail1"),
        ("R2CCL_RANK", "3"),
        ("HOME", "/root"),
    ]))
    .unwrap();
    assert_eq!(c.detect.probe_timeout_ms, 40, "env beats file");
    assert_eq!(c.detect.probe_interval_ms, 900, "file beats defaults");
    assert_eq!(c.log.level, "TRACE", "alias R2CCL_DEBUG");
    assert_eq!(c.transport.nics, vec!["rail0", "rail1"]);
    std::fs::remove_file(file).unwrap();
}

#[test]
fn unknown_key_in_file_names_key_and_file() {
    let err = load_str("[detect]\nprobe_timout_ms = 5\n", "my.toml").unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, ConfigError::UnknownKey { .. }));
    assert!(
        msg.contains("detect.probe_timout_ms") && msg.contains("my.toml") && msg.contains("probe_timeout_ms"),
        "{msg}"
    );
    let err = load_str("[nosuch]\nx = 1\n", "my.toml").unwrap_err().to_string();
    assert!(err.contains("nosuch.x") && err.contains("detect"), "{err}");
}

#[test]
fn unknown_env_is_set_aside_and_named() {
    // One environment may serve several r2ccl versions: a variable or key this version does not
    // know is ignored, and named for the communicator to warn about; the rest still applies.
    let c = load_from(env(&[("R2CCL_DEBG", "INFO"), ("R2CCL_DETECT__NOPE", "1"), ("R2CCL_DEBUG", "INFO")])).unwrap();
    assert_eq!(c.log.level, "INFO");
    assert_eq!(c.ignored_env.len(), 2, "{:?}", c.ignored_env);
    assert!(c.ignored_env[0].starts_with("R2CCL_DEBG: not a variable of r2ccl"), "{:?}", c.ignored_env);
    assert!(c.ignored_env[1].contains("R2CCL_DETECT__NOPE") && c.ignored_env[1].contains("detect.nope"));
    // A bad value of a known key still stops the load, and so does an unknown key in a file.
    assert!(load_from(env(&[("R2CCL_DETECT__GOOD_PROBES", "0"), ("R2CCL_DEBG", "x")])).is_err());
    assert!(load_str("[detect]\nnope = 1\n", "f.toml").is_err());
    assert!(load_from(env(&[])).unwrap().ignored_env.is_empty());
}

#[test]
fn wrong_type_names_key_value_and_expectation() {
    let err = load_from(env(&[("R2CCL_DETECT__PROBE_TIMEOUT_MS", "fast")])).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, ConfigError::BadType { .. }), "{msg}");
    assert!(
        msg.contains("detect.probe_timeout_ms")
            && msg.contains("fast")
            && msg.contains("R2CCL_DETECT__PROBE_TIMEOUT_MS"),
        "{msg}"
    );
    let msg = load_str("[policy]\nrerank = \"sometimes\"\n", "f.toml").unwrap_err().to_string();
    assert!(msg.contains("policy.rerank") && msg.contains("sometimes"), "{msg}");
    let msg = load_str("[transport]\nnics = 3\n", "f.toml").unwrap_err().to_string();
    assert!(msg.contains("transport.nics"), "{msg}");
}

#[test]
fn out_of_range_names_key_value_and_range() {
    let msg = load_str("[detect]\ngood_probes = 0\n", "f").unwrap_err().to_string();
    assert!(msg.contains("detect.good_probes") && msg.contains("value 0") && msg.contains("1..=1000"), "{msg}");
    let msg = load_from(env(&[("R2CCL_TRANSPORT__CHUNK_BYTES", "3000000")])).unwrap_err().to_string();
    assert!(msg.contains("transport.chunk_bytes") && msg.contains("power of two"), "{msg}");
    let msg = load_from(env(&[("R2CCL_TRANSPORT__TCP_RX_SEGMENT_BYTES", "4096")])).unwrap_err().to_string();
    assert!(msg.contains("transport.tcp_rx_segment_bytes") && msg.contains("8192..=67108864"), "{msg}");
    let cfg = load_from(env(&[("R2CCL_TRANSPORT__TCP_RX_SEGMENT_BYTES", "262144")])).unwrap();
    assert_eq!(cfg.transport.tcp_rx_segment_bytes, 262_144);
    let msg = load_from(env(&[("R2CCL_DEBUG", "LOUD")])).unwrap_err().to_string();
    assert!(msg.contains("log.level") && msg.contains("LOUD") && msg.contains("TRACE"), "{msg}");
    let msg = load_from(env(&[("R2CCL_POLICY__STRATEGY", "magic")])).unwrap_err().to_string();
    assert!(msg.contains("policy.strategy") && msg.contains("four_stage"), "{msg}");
    let msg = load_from(env(&[("R2CCL_METRICS_ADDR", "localhost")])).unwrap_err().to_string();
    assert!(msg.contains("metrics.addr"), "{msg}");
    let msg = load_str("[detect]\nholddown_base_ms = 5000\nholddown_max_ms = 10\n", "f").unwrap_err().to_string();
    assert!(msg.contains("detect.holddown_max_ms"), "{msg}");
}

#[test]
fn errors_are_one_line() {
    for err in [
        load_str("[detect]\nx = 1", "f").unwrap_err(),
        load_from(env(&[("R2CCL_DETECT__PROBE_TIMEOUT_MS", "x")])).unwrap_err(),
        load_str("[detect]\nprobe_timeout_ms = 0", "f").unwrap_err(),
        load_str("not toml [", "f").unwrap_err(),
        load_from(env(&[("R2CCL_CONFIG", "/nonexistent/r2ccl.toml")])).unwrap_err(),
    ] {
        let msg = err.to_string();
        assert!(!msg.contains('\n'), "multi-line error: {msg}");
    }
}

#[test]
fn shipped_default_file_equals_built_in_defaults() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../configs/default.toml");
    let text = std::fs::read_to_string(path).unwrap();
    assert_eq!(load_str(&text, path).unwrap(), Config::default());
}
