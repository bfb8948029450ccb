//! The suite's own inputs, carried by the binary: `features/`, `config/crd`, `config/samples`
//! and `config/rbac` are embedded at build time (see `build.rs`), so the `conformance` binary
//! works from any folder and never reads the source tree it was compiled in. Files on disk are
//! used only when the command line points at them (`--features`, `--operator-rbac`, `--crds`).
//!
//! A run [`materialize`]s the embedded files into a scratch folder laid out like the repository
//! (the Worlds and `kubectl` need paths), removed when the [`Bundle`] is dropped.
use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::Context as _;

use crate::report::model::{FeatureFile, ManifestSet, files_digest, sha256_hex};

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/embedded_assets.rs"));
}

/// The git commit the binary was built from (`unknown` outside git).
pub const GIT_COMMIT: &str = env!("CONFORMANCE_GIT_COMMIT");

pub const FEATURES_DIR: &str = "features";
pub const CRD_DIR: &str = "config/crd";
pub const SAMPLES_DIR: &str = "config/samples";
pub const RBAC_DIR: &str = "config/rbac";

/// The embedded files: `(path relative to the repository root, content)`, sorted.
pub fn files() -> &'static [(&'static str, &'static [u8])] {
    embedded::FILES
}

/// The embedded files of one folder (`features`, `config/crd`, …): `(file name, content)`.
pub fn folder(dir: &str) -> impl Iterator<Item = (&'static str, &'static [u8])> + '_ {
    files().iter().filter_map(move |(path, bytes)| {
        path.strip_prefix(dir)
            .and_then(|rest| rest.strip_prefix('/'))
            .filter(|name| !name.contains('/'))
            .map(|name| (name, *bytes))
    })
}

/// Where a set of inputs came from: built into the binary, or a folder given on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    Embedded,
    Path(PathBuf),
}

impl Source {
    pub fn from_option(path: Option<&Path>) -> Self {
        path.map_or(Self::Embedded, |p| {
            Self::Path(p.canonicalize().unwrap_or_else(|_| p.to_path_buf()))
        })
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Embedded => f.write_str("embedded"),
            Self::Path(path) => write!(f, "{}", path.display()),
        }
    }
}

/// The embedded files written out, laid out like the repository.
pub struct Bundle {
    dir: tempfile::TempDir,
}

/// Writes every embedded file into a new scratch folder.
pub fn materialize() -> anyhow::Result<Bundle> {
    let dir = tempfile::Builder::new()
        .prefix("coder-conformance-assets-")
        .tempdir()
        .context("creating a folder for the suite's embedded files")?;
    for (path, bytes) in files() {
        let target = dir.path().join(path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&target, bytes).with_context(|| format!("writing {}", target.display()))?;
    }
    Ok(Bundle { dir })
}

impl Bundle {
    /// Stands in for the repository root: `features/`, `config/…` below it.
    pub fn root(&self) -> &Path {
        self.dir.path()
    }
    pub fn features(&self) -> PathBuf {
        self.root().join(FEATURES_DIR)
    }
    pub fn crd(&self) -> PathBuf {
        self.root().join(CRD_DIR)
    }
    pub fn rbac(&self) -> PathBuf {
        self.root().join(RBAC_DIR)
    }
}

/// What a run reads: the embedded files, or the folders the command line named instead.
pub struct Inputs {
    /// Keeps the materialized embedded files for the run.
    pub bundle: Bundle,
    pub features: PathBuf,
    pub features_source: Source,
    pub crds: PathBuf,
    pub crds_source: Source,
    pub rbac: PathBuf,
    pub rbac_source: Source,
}

impl Inputs {
    /// Embedded files unless a folder is given (`--features`, `--crds`, `--operator-rbac`).
    pub fn resolve(
        features: Option<&Path>,
        crds: Option<&Path>,
        rbac: Option<&Path>,
    ) -> anyhow::Result<Self> {
        let bundle = materialize()?;
        let pick = |given: Option<&Path>, embedded: PathBuf| -> anyhow::Result<(PathBuf, Source)> {
            match given {
                None => Ok((embedded, Source::Embedded)),
                Some(path) if path.is_dir() => {
                    Ok((path.to_path_buf(), Source::from_option(Some(path))))
                }
                Some(path) => anyhow::bail!("{} is not a folder", path.display()),
            }
        };
        let (features, features_source) = pick(features, bundle.features())?;
        let (crds, crds_source) = pick(crds, bundle.crd())?;
        let (rbac, rbac_source) = pick(rbac, bundle.rbac())?;
        Ok(Self {
            bundle,
            features,
            features_source,
            crds,
            crds_source,
            rbac,
            rbac_source,
        })
    }
}

/// sha256 of each manifest-like file (`*.yaml`, `*.yml`, `*.feature`, `*.tsv`, …) of a folder,
/// by file name, sorted; `kustomization.yaml` included (it is part of what was applied from).
pub fn file_digests(dir: &Path) -> anyhow::Result<Vec<FeatureFile>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_file() {
            let bytes =
                std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            files.push(FeatureFile {
                path: path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                sha256: sha256_hex(&bytes),
            });
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(files)
}

/// A folder as the report records it: source, digest and each file's sha256.
pub fn manifest_set(source: &Source, dir: &Path) -> anyhow::Result<ManifestSet> {
    let files = file_digests(dir)?;
    Ok(ManifestSet {
        source: source.to_string(),
        sha256: files_digest(&files),
        files,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case(FEATURES_DIR, "crd.feature")]
    #[case(FEATURES_DIR, "rules.tsv")]
    #[case(CRD_DIR, "coder.com_coderprovisioners.yaml")]
    #[case(SAMPLES_DIR, "coder_v1alpha1_coderprovisioner.yaml")]
    #[case(RBAC_DIR, "service_account.yaml")]
    fn the_binary_carries_the_suites_inputs(#[case] dir: &str, #[case] name: &str) {
        let on_disk = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(dir)
            .join(name);
        let embedded = folder(dir).find(|(n, _)| *n == name).map(|(_, b)| b);
        assert_eq!(embedded, Some(std::fs::read(on_disk).unwrap().as_slice()));
    }

    #[test]
    fn a_materialized_bundle_mirrors_the_embedded_files() {
        let bundle = materialize().unwrap();
        let digests = file_digests(&bundle.features()).unwrap();
        assert_eq!(digests.len(), folder(FEATURES_DIR).count());
        let (name, bytes) = folder(CRD_DIR).next().unwrap();
        assert_eq!(std::fs::read(bundle.crd().join(name)).unwrap(), bytes);
    }

    #[rstest]
    #[case(&[("a.yaml", "1"), ("b.yaml", "2")], &[("b.yaml", "2"), ("a.yaml", "1")], true)]
    #[case(&[("a.yaml", "1")], &[("a.yaml", "2")], false)]
    #[case(&[("a.yaml", "1")], &[("c.yaml", "1")], false)]
    fn folder_digests_ignore_order_only(
        #[case] left: &[(&str, &str)],
        #[case] right: &[(&str, &str)],
        #[case] equal: bool,
    ) {
        let files = |list: &[(&str, &str)]| -> Vec<FeatureFile> {
            list.iter()
                .map(|(p, s)| FeatureFile {
                    path: (*p).into(),
                    sha256: (*s).into(),
                })
                .collect()
        };
        assert_eq!(
            files_digest(&files(left)) == files_digest(&files(right)),
            equal
        );
    }

    #[rstest]
    #[case(None, "embedded")]
    #[case(Some("/nonexistent/features"), "/nonexistent/features")]
    fn sources_name_themselves(#[case] path: Option<&str>, #[case] shown: &str) {
        assert_eq!(Source::from_option(path.map(Path::new)).to_string(), shown);
    }

    #[test]
    fn the_git_commit_is_known_or_says_so() {
        assert!(
            GIT_COMMIT == "unknown" || GIT_COMMIT.chars().all(|c| c.is_ascii_hexdigit()),
            "{GIT_COMMIT}"
        );
    }
}
