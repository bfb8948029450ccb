//! Embeds the suite's own inputs in the `conformance` binary (so a copy anywhere, or a
//! `cargo install`, carries them) and records the git commit it was built from.
//!
//! Writes `$OUT_DIR/embedded_assets.rs`: a table of `(relative path, bytes)` over `features/`,
//! `config/crd`, `config/samples` and `config/rbac`, read through `include_bytes!` so a change to
//! any of them rebuilds the binary. Sets `CONFORMANCE_GIT_COMMIT` (`unknown` outside git;
//! an environment variable of that name, e.g. from a release tarball's build, wins).
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Folders embedded, relative to the repository root.
const EMBEDDED: [&str; 4] = ["features", "config/crd", "config/samples", "config/rbac"];

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let root = manifest.join("..");
    let mut table =
        String::from("/// `(path relative to the repository root, content)`, sorted by path.\n");
    table.push_str("pub static FILES: &[(&str, &[u8])] = &[\n");
    for folder in EMBEDDED {
        let dir = root.join(folder);
        println!("cargo:rerun-if-changed={}", dir.display());
        for file in files(&dir) {
            let name = file
                .file_name()
                .and_then(|n| n.to_str())
                .expect("UTF-8 file name");
            let absolute = file.canonicalize().expect("embedded file");
            writeln!(
                table,
                "    ({:?}, include_bytes!({:?})),",
                format!("{folder}/{name}"),
                absolute.display().to_string()
            )
            .expect("writing to a String");
        }
    }
    table.push_str("];\n");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets it"));
    std::fs::write(out.join("embedded_assets.rs"), table).expect("writing embedded_assets.rs");

    println!("cargo:rerun-if-env-changed=CONFORMANCE_GIT_COMMIT");
    let commit = std::env::var("CONFORMANCE_GIT_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .unwrap_or_else(|| git_commit(&root));
    println!("cargo:rustc-env=CONFORMANCE_GIT_COMMIT={commit}");
}

/// Regular files of `dir`, sorted (not recursive: the embedded folders are flat).
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    files
}

/// `git rev-parse HEAD`, or `unknown`; reruns when HEAD or the checked-out branch moves.
fn git_commit(root: &Path) -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(root)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for file in watched {
        if let Some(path) = git(&["rev-parse", "--git-path", &file])
            && root.join(&path).is_file()
        {
            println!("cargo:rerun-if-changed={}", root.join(path).display());
        }
    }
    git(&["rev-parse", "HEAD"])
        .filter(|commit| !commit.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}
