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

/// The repository root (holding `config/`), next to this crate.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}
