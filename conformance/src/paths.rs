//! Fixed paths: the repository this binary was compiled in, and the names of what a run leaves in
//! its report folder.
use std::path::{Path, PathBuf};

/// Name of the conformance report in the report folder.
pub const REPORT_FILE: &str = "conformance-report.yaml";
/// The report as one self-contained HTML page for people, beside the YAML
/// ([`crate::report::html`]; `conformance report --html` renders it again).
pub const HTML_REPORT_FILE: &str = "report.html";
/// The whole log of the operator the suite started (all restarts), in the report folder.
pub const OPERATOR_LOG_FILE: &str = "operator.log";
/// Folder (in the report folder) for `kind export logs` when the kind tier fails.
pub const KIND_LOGS_DIR: &str = "kind-logs";

/// The suite's folder in the user's cache (`$XDG_CACHE_HOME`, else `~/.cache`):
/// `coder-provisioner-conformance`, kept between CI runs.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("coder-provisioner-conformance")
}

/// The repository root (holding `config/`), next to this crate.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}
