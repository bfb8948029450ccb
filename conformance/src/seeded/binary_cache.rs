//! Variant operators kept between runs, by what they were built from: the operator's sources,
//! the workspace's manifests and lock file, the toolchain, the build's settings and the patch.
//! A stage whose operator did not change since the last run builds nothing (102 builds cost
//! about 700 CPU-seconds on 2 cores, half the seeded stage's); any change to those inputs gives
//! every variant a new key, so a binary is never reused for other sources.
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use sha2::{Digest as _, Sha256};

/// Binaries kept, the most recently used first: one stage's variants and the legal stacks, with
/// room for a second set (each about 38 MB, stripped).
const MAX_ENTRIES: usize = 160;
/// Bumped when what a key covers changes.
const KEY_VERSION: &str = "seeded-operator-binary v1";

/// Whether the file at `relative` (a workspace path) goes into a variant's build: the
/// operator's own folder, the workspace manifest and lock file, cargo's and rustup's settings.
pub fn is_build_input(relative: &Path) -> bool {
    relative.starts_with("operator")
        || relative.starts_with(".cargo")
        || [Path::new("Cargo.toml"), Path::new("Cargo.lock")].contains(&relative)
        || relative
            .to_str()
            .is_some_and(|path| path.starts_with("rust-toolchain"))
}

/// Feeds `part` with its length first, so that no two sequences of parts digest alike.
fn feed(digest: &mut Sha256, part: &[u8]) {
    digest.update((part.len() as u64).to_le_bytes());
    digest.update(part);
}

/// The digest of a workspace's build inputs, fed file by file.
#[derive(Clone, Default)]
pub struct BuildInputs(Sha256);

impl BuildInputs {
    pub fn add(&mut self, relative: &Path, contents: &[u8]) {
        feed(&mut self.0, relative.to_string_lossy().as_bytes());
        feed(&mut self.0, contents);
    }
}

pub struct BinaryCache {
    dir: PathBuf,
    /// The workspace's inputs, the toolchain and the build's settings, without the patch.
    base: Sha256,
}

impl BinaryCache {
    /// The cache for builds of the workspace whose inputs are `inputs`, built by `toolchain`
    /// (`rustc -vV`) with `settings` (the cargo command line and environment that differ from
    /// a plain build).
    pub fn new(dir: PathBuf, inputs: BuildInputs, toolchain: &str, settings: &str) -> Self {
        let mut base = inputs.0;
        for part in [KEY_VERSION, toolchain, settings] {
            feed(&mut base, part.as_bytes());
        }
        Self { dir, base }
    }

    /// The key of the binary built with `patch` applied.
    pub fn key(&self, patch: &str) -> String {
        let mut digest = self.base.clone();
        digest.update(patch.as_bytes());
        hex::encode(digest.finalize())
    }

    /// Puts the binary cached under `key` at `to` (a hard link, else a copy); false when none is.
    pub fn fetch(&self, key: &str, to: &Path) -> bool {
        let cached = self.dir.join(key);
        if !cached.is_file() {
            return false;
        }
        // Its modification time is its last use: what `prune` keeps.
        let used = std::fs::File::options()
            .append(true)
            .open(&cached)
            .and_then(|file| file.set_modified(std::time::SystemTime::now()));
        used.is_ok()
            && (std::fs::hard_link(&cached, to).is_ok() || std::fs::copy(&cached, to).is_ok())
    }

    /// Keeps the binary at `built` under `key` (written beside, then renamed: a concurrent
    /// stage never finds half a file).
    pub fn store(&self, key: &str, built: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("creating {}", self.dir.display()))?;
        let partial = self.dir.join(format!(".{key}.{}", std::process::id()));
        std::fs::copy(built, &partial)
            .with_context(|| format!("copying {} to {}", built.display(), partial.display()))?;
        std::fs::rename(&partial, self.dir.join(key)).context("renaming the cached binary")
    }

    /// Removes all but the [`MAX_ENTRIES`] most recently used binaries; how many it removed.
    pub fn prune(&self) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return 0;
        };
        let mut binaries: Vec<(std::time::SystemTime, PathBuf)> = entries
            .filter_map(|entry| {
                let entry = entry.ok()?;
                let used = entry.metadata().ok()?.modified().ok()?;
                Some((used, entry.path()))
            })
            .collect();
        binaries.sort_by_key(|(used, _)| std::cmp::Reverse(*used));
        binaries
            .iter()
            .skip(MAX_ENTRIES)
            .filter(|(_, path)| std::fs::remove_file(path).is_ok())
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(dir: &Path, operator_source: &[u8]) -> BinaryCache {
        let mut inputs = BuildInputs::default();
        inputs.add(Path::new("operator/src/lib.rs"), operator_source);
        BinaryCache::new(dir.to_path_buf(), inputs, "rustc 1.95.0", "debug=0")
    }

    #[test]
    fn a_key_changes_with_the_sources_the_toolchain_and_the_patch() {
        let dir = Path::new("/nonexistent");
        let key = cache(dir, b"fn a() {}").key("patch 1");
        assert_eq!(key, cache(dir, b"fn a() {}").key("patch 1"), "stable");
        assert_ne!(key, cache(dir, b"fn b() {}").key("patch 1"), "sources");
        assert_ne!(key, cache(dir, b"fn a() {}").key("patch 2"), "patch");
        let mut inputs = BuildInputs::default();
        inputs.add(Path::new("operator/src/lib.rs"), b"fn a() {}");
        let other_toolchain = BinaryCache::new(dir.into(), inputs, "rustc 1.96.0", "debug=0");
        assert_ne!(key, other_toolchain.key("patch 1"), "toolchain");
    }

    #[test]
    fn what_goes_into_a_build() {
        for input in [
            "operator/src/main.rs",
            "Cargo.lock",
            "Cargo.toml",
            ".cargo/config.toml",
        ] {
            assert!(is_build_input(Path::new(input)), "{input}");
        }
        for other in [
            "features/crd.feature",
            "conformance/src/lib.rs",
            "config/rbac/role.yaml",
        ] {
            assert!(!is_build_input(Path::new(other)), "{other}");
        }
    }

    #[test]
    fn a_stored_binary_is_fetched_and_the_least_recently_used_go_first() {
        let dir = std::env::temp_dir().join(format!("binary-cache-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let cache = cache(&dir.join("cache"), b"fn a() {}");
        let built = dir.join("built");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(&built, b"binary").unwrap();
        let key = cache.key("patch");
        assert!(
            !cache.fetch(&key, &dir.join("missing")),
            "nothing cached yet"
        );
        cache.store(&key, &built).unwrap();
        let fetched = dir.join("fetched");
        assert!(cache.fetch(&key, &fetched));
        assert_eq!(std::fs::read(&fetched).unwrap(), b"binary");
        for extra in 0..MAX_ENTRIES {
            cache.store(&format!("old-{extra}"), &built).unwrap();
        }
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        for extra in 0..MAX_ENTRIES {
            let file = std::fs::File::options()
                .append(true)
                .open(dir.join("cache").join(format!("old-{extra}")))
                .unwrap();
            file.set_modified(old + std::time::Duration::from_secs(extra as u64))
                .unwrap();
        }
        assert_eq!(cache.prune(), 1);
        assert!(dir.join("cache").join(&key).is_file(), "the newest stays");
        assert!(!dir.join("cache").join("old-0").exists(), "the oldest goes");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
