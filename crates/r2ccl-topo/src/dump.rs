//! Dumps of the cluster view in TOML or JSON, loadable again as descriptions.

use crate::description::TopologyDescription;
use crate::error::DumpError;
use crate::model::ClusterTopology;
use std::path::Path;
use std::str::FromStr;

/// A dump format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DumpFormat {
    /// TOML (the description format).
    Toml,
    /// JSON (same schema).
    Json,
}

impl DumpFormat {
    /// JSON for `*.json`, TOML otherwise.
    pub fn for_path(path: &Path) -> Self {
        if path.extension().is_some_and(|e| e == "json") {
            Self::Json
        } else {
            Self::Toml
        }
    }

    const fn name(self) -> &'static str {
        match self {
            Self::Toml => "toml",
            Self::Json => "json",
        }
    }
}

impl FromStr for DumpFormat {
    type Err = DumpError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "toml" => Ok(Self::Toml),
            "json" => Ok(Self::Json),
            _ => Err(DumpError::UnknownFormat(s.to_owned())),
        }
    }
}

/// Render a description in `format`.
pub fn render_description(desc: &TopologyDescription, format: DumpFormat) -> Result<String, DumpError> {
    let err = |message: String| DumpError::Render { format: format.name(), message };
    match format {
        DumpFormat::Toml => toml::to_string_pretty(desc).map_err(|e| err(e.to_string())),
        DumpFormat::Json => serde_json::to_string_pretty(desc).map(|s| s + "\n").map_err(|e| err(e.to_string())),
    }
}

/// Render the cluster view in `format` (a description that loads back to an equal
/// view).
pub fn render_cluster(cluster: &ClusterTopology, format: DumpFormat) -> Result<String, DumpError> {
    render_description(&TopologyDescription::from_cluster(cluster), format)
}

/// Write the merged cluster view to `path`, in `format` (or by the file extension
/// when `None`).
///
/// This is what the facade calls when `R2CCL_TOPO_DUMP_FILE` is set (the facade reads
/// that variable; this crate never reads the environment).
pub fn write_cluster_view(path: &Path, cluster: &ClusterTopology, format: Option<DumpFormat>) -> Result<(), DumpError> {
    let text = render_cluster(cluster, format.unwrap_or_else(|| DumpFormat::for_path(path)))?;
    std::fs::write(path, text).map_err(|source| DumpError::Io { path: path.into(), source })
}
