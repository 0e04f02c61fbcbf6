//! Loading: defaults, then the TOML file, then the environment; unknown keys in a file and
//! bad values are rejected with the key and its origin; unknown `R2CCL_*` variables are
//! set aside in [`Config::ignored_env`] (one environment may serve several r2ccl versions).

use crate::env::{key_of, EnvKey};
use crate::{Config, ConfigError};
use config::{FileFormat, Map, Value, ValueKind};
use std::collections::BTreeMap;

/// The repository's documented defaults as a file (equal to the built-in defaults): a starting
/// point to copy. It is read only when `R2CCL_CONFIG` names it; nothing is read implicitly from
/// the working directory.
pub const DEFAULT_CONFIG_PATH: &str = "configs/default.toml";

/// Load from this process's environment and the file it names.
pub fn load() -> Result<Config, ConfigError> {
    // vars_os: a variable that is not UTF-8 (none of ours can be) is skipped, not a panic.
    load_from(std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))))
}

/// Load from the given environment (only `R2CCL_*` variables are looked at) and the
/// file it names in `R2CCL_CONFIG`, if any.
pub fn load_from<I, K, V>(env: I) -> Result<Config, ConfigError>
where
    I: IntoIterator<Item = (K, V)>,
    K: Into<String>,
    V: Into<String>,
{
    let env: BTreeMap<String, String> =
        env.into_iter().map(|(k, v)| (k.into(), v.into())).filter(|(k, _)| k.starts_with("R2CCL_")).collect();
    let (text, origin) = match env.get("R2CCL_CONFIG") {
        Some(path) if !path.is_empty() => (read(path)?, path.clone()),
        _ => (String::new(), String::from("(no file)")),
    };
    build(&text, &origin, &env)
}

/// Load from TOML text alone (no environment), e.g. to validate a file; `origin` names it in errors.
pub fn load_str(toml_text: &str, origin: &str) -> Result<Config, ConfigError> {
    build(toml_text, origin, &BTreeMap::new())
}

fn read(path: &str) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|e| ConfigError::File { path: path.into(), detail: e.to_string() })
}

/// Leaf key paths of the defaults, and whether each holds a list.
fn known_keys() -> BTreeMap<String, bool> {
    let mut out = BTreeMap::new();
    if let Ok(c) = config::Config::try_from(&Config::key_probe()) {
        if let Ok(table) = c.try_deserialize::<Map<String, Value>>() {
            walk(&table, "", &mut |k, v| {
                out.insert(k, matches!(v.kind, ValueKind::Array(_)));
            });
        }
    }
    out
}

fn walk(table: &Map<String, Value>, prefix: &str, f: &mut impl FnMut(String, &Value)) {
    for (k, v) in table {
        let path = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
        match &v.kind {
            ValueKind::Table(t) => walk(t, &path, f),
            _ => f(path, v),
        }
    }
}

fn unknown(key: &str, origin: &str, known: &BTreeMap<String, bool>) -> ConfigError {
    let section = key.split('.').next().unwrap_or("");
    let mut names: Vec<&str> =
        known.keys().filter(|k| k.split('.').next() == Some(section)).map(String::as_str).collect();
    if names.is_empty() {
        let mut sections: Vec<&str> = known.keys().filter_map(|k| k.split('.').next()).collect();
        sections.dedup();
        names = sections;
    }
    ConfigError::UnknownKey { key: key.into(), origin: origin.into(), known: names.join(", ") }
}

fn build(text: &str, file_origin: &str, env: &BTreeMap<String, String>) -> Result<Config, ConfigError> {
    let known = known_keys();
    let defaults = config::Config::try_from(&Config::default())
        .map_err(|e| ConfigError::File { path: "(built-in defaults)".into(), detail: e.to_string() })?;
    let mut builder = config::Config::builder().add_source(defaults);
    let mut origins: BTreeMap<String, String> = BTreeMap::new();

    if !text.is_empty() {
        let file = config::Config::builder()
            .add_source(config::File::from_str(text, FileFormat::Toml))
            .build()
            .and_then(|c| c.try_deserialize::<Map<String, Value>>())
            .map_err(|e| ConfigError::File { path: file_origin.into(), detail: one_line(&e.to_string()) })?;
        let mut err = None;
        walk(&file, "", &mut |k, _| {
            if err.is_none() && !known.contains_key(&k) {
                err = Some(unknown(&k, file_origin, &known));
            }
            origins.insert(k, file_origin.to_owned());
        });
        if let Some(e) = err {
            return Err(e);
        }
        builder = builder.add_source(config::File::from_str(text, FileFormat::Toml));
    }

    let mut ignored = Vec::new();
    for (var, value) in env {
        let key = match key_of(var) {
            EnvKey::Config(key) => key,
            EnvKey::Identity => continue,
            EnvKey::Unknown => {
                ignored.push(format!("{var}: not a variable of r2ccl {}", env!("CARGO_PKG_VERSION")));
                continue;
            }
        };
        let Some(&is_list) = known.get(&key) else {
            ignored.push(format!("{var}: no config key `{key}` in r2ccl {}", env!("CARGO_PKG_VERSION")));
            continue;
        };
        let set = if is_list {
            let items: Vec<String> =
                value.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned).collect();
            builder.set_override(key.as_str(), items)
        } else {
            builder.set_override(key.as_str(), value.as_str())
        };
        builder =
            set.map_err(|e| ConfigError::BadType { key: key.clone(), origin: var.clone(), detail: e.to_string() })?;
        origins.insert(key, var.clone());
    }

    let merged = builder.build().map_err(|e| ConfigError::File { path: file_origin.into(), detail: e.to_string() })?;
    let mut cfg: Config = merged.try_deserialize().map_err(|e| bad_type(e, &origins))?;
    cfg.validate()?;
    cfg.ignored_env = ignored;
    Ok(cfg)
}

fn bad_type(e: config::ConfigError, origins: &BTreeMap<String, String>) -> ConfigError {
    let key = match &e {
        config::ConfigError::Type { key: Some(k), .. } | config::ConfigError::At { key: Some(k), .. } => k.clone(),
        _ => String::from("(unknown key)"),
    };
    let detail = match &e {
        config::ConfigError::Type { unexpected, expected, .. } => format!("found {unexpected}, expected {expected}"),
        other => other.to_string(),
    };
    let base = key.split('[').next().unwrap_or(&key);
    let origin = origins.get(base).cloned().unwrap_or_else(|| "defaults".into());
    ConfigError::BadType { key, origin, detail }
}

/// Fold a multi-line parser message (TOML errors draw a caret diagram) into one line.
fn one_line(msg: &str) -> String {
    msg.lines()
        .map(|l| l.trim().trim_start_matches('|').trim())
        .filter(|l| !l.is_empty() && !l.chars().all(|c| c == '^' || c == ' '))
        .collect::<Vec<_>>()
        .join(" ")
}
