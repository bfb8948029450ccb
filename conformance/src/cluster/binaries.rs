//! Locating the control-plane binaries through `scripts/k8s-binaries.sh`.
//!
//! The script is the single place that pins versions and knows how to build them; this module only
//! runs it (its progress goes straight to our stderr) and takes the folder it prints on stdout.
use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context, bail};

/// The binaries every tier that starts its own control plane needs.
pub const REQUIRED: [&str; 3] = ["etcd", "kube-apiserver", "kubectl"];
/// Optional: without it there is no garbage collection or namespace deletion.
pub const CONTROLLER_MANAGER: &str = "kube-controller-manager";

/// Path of the resolver script inside this repository.
pub fn script_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/k8s-binaries.sh")
}

/// Runs `scripts/k8s-binaries.sh` (which honours `KUBEBUILDER_ASSETS`, then the per-user cache,
/// then builds the pinned versions with Go) and returns the folder holding the binaries.
///
/// The first run may take many minutes; its progress is streamed to stderr.
pub async fn resolve() -> anyhow::Result<PathBuf> {
    let script = script_path();
    if !script.is_file() {
        // An installed `conformance` binary has no repository next to it: only envtest-style
        // assets can be used then.
        if let Some(dir) = std::env::var_os("KUBEBUILDER_ASSETS") {
            let dir = PathBuf::from(dir);
            check_folder(&dir)?;
            return Ok(dir);
        }
        bail!(
            "cannot find {} (the repository is not next to this build); set KUBEBUILDER_ASSETS to a folder holding {}",
            script.display(),
            REQUIRED.join(", ")
        );
    }
    // spawn + wait_with_output keeps the inherited stderr (tokio's `output()` would pipe it and
    // swallow the script's progress lines).
    let output = tokio::process::Command::new("bash")
        .arg(&script)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("running {}", script.display()))?
        .wait_with_output()
        .await
        .with_context(|| format!("running {}", script.display()))?;
    if !output.status.success() {
        bail!(
            "{} failed ({}); its messages are above on stderr",
            script.display(),
            output.status
        );
    }
    let dir = folder_from_stdout(&String::from_utf8_lossy(&output.stdout))
        .with_context(|| format!("{} printed no folder on stdout", script.display()))?;
    check_folder(&dir)?;
    Ok(dir)
}

/// The script prints exactly one folder, as its last stdout line.
fn folder_from_stdout(stdout: &str) -> Option<PathBuf> {
    stdout
        .lines()
        .map(str::trim)
        .rfind(|line| !line.is_empty())
        .map(PathBuf::from)
}

fn check_folder(dir: &Path) -> anyhow::Result<()> {
    let missing: Vec<&str> = REQUIRED
        .iter()
        .copied()
        .filter(|name| !dir.join(name).is_file())
        .collect();
    if !missing.is_empty() {
        bail!("{} lacks {}", dir.display(), missing.join(", "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folder_is_the_last_non_empty_stdout_line() {
        assert_eq!(
            folder_from_stdout("noise\n/cache/k8s\n\n"),
            Some(PathBuf::from("/cache/k8s"))
        );
        assert_eq!(folder_from_stdout("  \n"), None);
    }

    #[test]
    fn a_folder_without_the_binaries_is_refused_with_their_names() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = check_folder(dir.path())
            .expect_err("empty folder")
            .to_string();
        assert!(err.contains("etcd, kube-apiserver, kubectl"), "{err}");
    }
}
