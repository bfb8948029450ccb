//! The container images a real cluster (kind, k3s) needs, and the commands that build them and
//! put them into a cluster without a registry.
//!
//! Three images: the reference operator, the fake coderd, and the stub provisioner daemon (the
//! `coder-stub` binary installed as `coder`, so provisioner pods run `coder provisioner start`
//! against the fake, contract D-8). Command lines are built by pure functions (unit-tested) and
//! run by [`run`], which streams the tools' output to our stderr.
use std::ffi::OsString;
use std::os::fd::AsFd;
use std::path::Path;
use std::process::Stdio;

use anyhow::{Context, bail};

/// Tag of locally built images. Not `latest`: with any other tag the kubelet's default pull
/// policy is `IfNotPresent`, so the loaded image is used and no registry is asked.
pub const DEFAULT_TAG: &str = "dev";
pub const OPERATOR_REPOSITORY: &str = "coder-provisioner-operator";
pub const FAKE_CODERD_REPOSITORY: &str = "fake-coderd";
pub const CODER_STUB_REPOSITORY: &str = "coder-stub";

/// How one image is built from this repository.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuildSpec {
    /// Full reference, e.g. `fake-coderd:dev`.
    pub image: String,
    /// Dockerfile, relative to the repository root (the build context is the root).
    pub dockerfile: &'static str,
    /// Stage of a multi-stage Dockerfile, when one file builds several images.
    pub target: Option<&'static str>,
}

/// The references of the three images of one build.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Images {
    pub operator: String,
    pub fake_coderd: String,
    /// Image of provisioner pods on real clusters: `coder` is the stub daemon.
    pub coder_stub: String,
}

impl Images {
    pub fn with_tag(tag: &str) -> Self {
        Self {
            operator: format!("{OPERATOR_REPOSITORY}:{tag}"),
            fake_coderd: format!("{FAKE_CODERD_REPOSITORY}:{tag}"),
            coder_stub: format!("{CODER_STUB_REPOSITORY}:{tag}"),
        }
    }

    pub fn all(&self) -> [&str; 3] {
        [&self.operator, &self.fake_coderd, &self.coder_stub]
    }

    /// What `docker build` needs for each image. The fake coderd and the stub share
    /// `fake-coderd/Dockerfile` (one Rust build, two final stages named like the images).
    pub fn build_specs(&self) -> [BuildSpec; 3] {
        [
            BuildSpec {
                image: self.operator.clone(),
                dockerfile: "operator/Dockerfile",
                target: None,
            },
            BuildSpec {
                image: self.fake_coderd.clone(),
                dockerfile: "fake-coderd/Dockerfile",
                target: Some(FAKE_CODERD_REPOSITORY),
            },
            BuildSpec {
                image: self.coder_stub.clone(),
                dockerfile: "fake-coderd/Dockerfile",
                target: Some(CODER_STUB_REPOSITORY),
            },
        ]
    }
}

/// `docker build -f <repo>/<dockerfile> [--target T] -t <image> <repo>`.
pub fn docker_build_args(spec: &BuildSpec, repo: &Path) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![
        "build".into(),
        "-f".into(),
        repo.join(spec.dockerfile).into(),
    ];
    if let Some(target) = spec.target {
        args.extend(["--target".into(), target.into()]);
    }
    args.extend(["-t".into(), spec.image.clone().into(), repo.into()]);
    args
}

/// `kind load docker-image --name <cluster> <images…>`: copies the images into every node.
pub fn kind_load_args(cluster: &str, images: &Images) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![
        "load".into(),
        "docker-image".into(),
        "--name".into(),
        cluster.into(),
    ];
    args.extend(images.all().map(OsString::from));
    args
}

/// `docker save -o <archive> <images…>`: one archive that k3s's containerd can import.
pub fn docker_save_args(archive: &Path, images: &Images) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec!["save".into(), "-o".into(), archive.into()];
    args.extend(images.all().map(OsString::from));
    args
}

/// Imports an archive into the containerd namespace the kubelet uses (`k8s.io`), inside a k3s
/// container (`k3s ctr` is the multi-call binary's containerd client).
pub fn k3s_import_command(archive_in_container: &str) -> Vec<String> {
    [
        "k3s",
        "ctr",
        "--namespace",
        "k8s.io",
        "images",
        "import",
        archive_in_container,
    ]
    .map(str::to_owned)
    .to_vec()
}

/// Environment variable selecting how the images are built: `prebuilt` (default) or `dockerfile`.
pub const IMAGE_BUILD_ENV: &str = "CONFORMANCE_IMAGE_BUILD";
/// Environment variable naming a folder that already holds the three binaries (e.g.
/// `target/release`); with it, `prebuilt` does not run cargo.
pub const IMAGE_BIN_DIR_ENV: &str = "CONFORMANCE_IMAGE_BIN_DIR";
/// The binaries the prebuilt images copy, with their packages.
pub const PREBUILT_BINARIES: [(&str, &str); 3] = [
    ("operator", "coder-provisioner-operator"),
    ("fake-coderd", "fake-coderd"),
    ("fake-coderd", "coder-stub"),
];

/// How the three images are built.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ImageBuild {
    /// Binaries built on the host with cargo, copied onto a base image by the thin
    /// `*/Dockerfile.prebuilt` (scripts/images.sh): no registry needed, the base image is made
    /// locally unless `IMAGES_BASE_IMAGE` names one.
    #[default]
    Prebuilt,
    /// The multi-stage `*/Dockerfile`s with BuildKit: Rust inside the build, base images from
    /// their registries (needs internet).
    Dockerfile,
}

impl ImageBuild {
    /// From [`IMAGE_BUILD_ENV`] (unset or empty: the default).
    pub fn from_env() -> anyhow::Result<Self> {
        match std::env::var(IMAGE_BUILD_ENV) {
            Ok(value) if !value.trim().is_empty() => Self::parse(&value),
            _ => Ok(Self::default()),
        }
    }

    pub fn parse(text: &str) -> anyhow::Result<Self> {
        <Self as clap::ValueEnum>::from_str(text.trim(), true)
            .map_err(|_| anyhow::anyhow!("unknown image build {text:?} (prebuilt or dockerfile)"))
    }
}

/// `scripts/images.sh --tag <tag> --bin-dir <dir>`.
pub fn images_script_args(repo: &Path, tag: &str, bin_dir: &Path) -> Vec<OsString> {
    vec![
        repo.join("scripts/images.sh").into(),
        "--tag".into(),
        tag.into(),
        "--bin-dir".into(),
        bin_dir.into(),
    ]
}

/// The cargo profile of the images' binaries (Cargo.toml `[profile.image]`: release, stripped).
pub const IMAGE_PROFILE: &str = "image";
/// Environment variable naming the target folder of the images' release build (default:
/// [`image_target_dir`]'s cache folder).
pub const IMAGE_TARGET_DIR_ENV: &str = "CONFORMANCE_IMAGE_TARGET_DIR";

/// Where the images' binaries are built: [`IMAGE_TARGET_DIR_ENV`], else
/// `~/.cache/coder-provisioner-conformance/target-image` (kept between CI runs, apart from the
/// debug build's `target/`).
pub fn image_target_dir() -> std::path::PathBuf {
    if let Some(dir) = std::env::var_os(IMAGE_TARGET_DIR_ENV).filter(|d| !d.is_empty()) {
        return dir.into();
    }
    crate::paths::cache_dir().join("target-image")
}

/// The folder holding the images' binaries after [`cargo_build_binaries_args`]: the operator,
/// the fake coderd, the stub daemon and the suite (`conformance`, for scripts/suite-image.sh).
pub fn image_binaries_dir() -> std::path::PathBuf {
    image_target_dir().join(IMAGE_PROFILE)
}

/// `cargo build --workspace --bins --profile image --target-dir DIR --locked
/// --message-format=json-render-diagnostics`: release builds of every binary (the suite's too),
/// the whole workspace so that features unify as in `cargo build --workspace`.
pub fn cargo_build_binaries_args(target_dir: &Path) -> Vec<String> {
    [
        "build",
        "--workspace",
        "--bins",
        "--profile",
        IMAGE_PROFILE,
        "--target-dir",
        &target_dir.to_string_lossy(),
        "--locked",
        "--message-format=json-render-diagnostics",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// The images' release build as a command, without the running package's variables: inherited
/// from a test or `cargo run`, they rebuild ring and everything above it whenever the build is
/// next called from elsewhere (262 s instead of 5 s on 2 cores, issue 39).
fn cargo_build_binaries(repo: &Path, target_dir: &Path) -> tokio::process::Command {
    let args = cargo_build_binaries_args(target_dir);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    crate::implementation::workspace_cargo(repo, &args)
}

/// The folder cargo put the binaries in (they share one), from its JSON messages.
pub fn built_binaries_dir(cargo_json: &str) -> anyhow::Result<std::path::PathBuf> {
    let mut dirs = std::collections::BTreeSet::new();
    for (_, binary) in PREBUILT_BINARIES {
        let executable = cargo_json
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == binary)
            .find_map(|m| m["executable"].as_str().map(std::path::PathBuf::from))
            .with_context(|| format!("cargo reported no {binary} executable"))?;
        dirs.insert(
            executable
                .parent()
                .context("an executable without a folder")?
                .to_path_buf(),
        );
    }
    match dirs.len() {
        1 => Ok(dirs.into_iter().next().expect("one")),
        _ => bail!("cargo put the binaries in different folders: {dirs:?}"),
    }
}

/// Builds the three images the way `how` says.
pub async fn build_with(how: ImageBuild, repo: &Path, images: &Images) -> anyhow::Result<()> {
    match how {
        ImageBuild::Dockerfile => build(repo, images).await,
        ImageBuild::Prebuilt => build_prebuilt(repo, images).await,
    }
}

/// The images from host binaries ([`ImageBuild::Prebuilt`]): cargo builds them (or
/// [`IMAGE_BIN_DIR_ENV`] names them), scripts/images.sh copies them onto the base image.
pub async fn build_prebuilt(repo: &Path, images: &Images) -> anyhow::Result<()> {
    require_docker_engine("docker").await?;
    let tag = images
        .operator
        .rsplit_once(':')
        .map(|(_, tag)| tag.to_owned())
        .context("the operator image has no tag")?;
    let bin_dir = match std::env::var_os(IMAGE_BIN_DIR_ENV) {
        Some(dir) => std::path::PathBuf::from(dir),
        None => {
            let target_dir = image_target_dir();
            eprintln!(
                "conformance: building the image binaries with cargo (profile {IMAGE_PROFILE}, target folder {})",
                target_dir.display()
            );
            let started = std::time::Instant::now();
            let output = cargo_build_binaries(repo, &target_dir)
                .output()
                .await
                .map_err(|e| spawn_error("cargo", e))?;
            if !output.status.success() {
                bail!(
                    "cargo build of the image binaries failed ({}); its messages are above",
                    output.status
                );
            }
            eprintln!(
                "conformance: image binaries built in {:.0} s",
                started.elapsed().as_secs_f64()
            );
            built_binaries_dir(&String::from_utf8_lossy(&output.stdout))?
        }
    };
    eprintln!(
        "conformance: building images {} from the binaries in {} (scripts/images.sh)",
        images.all().join(", "),
        bin_dir.display()
    );
    let script = Tool::new("bash", images_script_args(repo, &tag, &bin_dir));
    let output = run_captured_streaming_stderr(&script).await?;
    let built: Vec<&str> = output
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    if built != images.all() {
        bail!(
            "scripts/images.sh built {built:?}, expected {:?}",
            images.all()
        );
    }
    Ok(())
}

/// Runs `tool` with its stderr going to ours (progress) and returns its stdout.
pub async fn run_captured_streaming_stderr(tool: &Tool) -> anyhow::Result<String> {
    let output = tool
        .command()
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .output()
        .await
        .map_err(|e| spawn_error(&tool.program, e))?;
    if !output.status.success() {
        bail!(
            "`{}` failed ({}); its output is above",
            tool.display(),
            output.status
        );
    }
    String::from_utf8(output.stdout)
        .with_context(|| format!("`{}` printed non-UTF-8", tool.display()))
}

/// Builds the three images from `repo` with `docker build` (BuildKit: the Dockerfiles use cache
/// mounts). Fails on the first image that does not build.
pub async fn build(repo: &Path, images: &Images) -> anyhow::Result<()> {
    require_docker_engine("docker").await?;
    for spec in images.build_specs() {
        eprintln!(
            "conformance: building image {} from {}",
            spec.image, spec.dockerfile
        );
        run(Tool::new("docker", docker_build_args(&spec, repo)).env("DOCKER_BUILDKIT", "1"))
            .await?;
    }
    Ok(())
}

/// Fails with a clear message unless `docker` (the given program) reaches a Docker engine.
pub async fn require_docker_engine(program: &str) -> anyhow::Result<()> {
    let output = Tool::new(program, ["info", "--format", "{{.ServerVersion}}"])
        .output()
        .await
        .context("the kind and k3s tiers need Docker")?;
    if !output.status.success() {
        bail!(
            "no Docker engine is reachable (`{program} info` failed: {}); the kind and k3s tiers need one",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

/// A command line of an external tool (docker, kind).
#[derive(Clone, Debug)]
pub struct Tool {
    pub program: String,
    pub args: Vec<OsString>,
    pub env: Vec<(String, String)>,
}

impl Tool {
    pub fn new(program: &str, args: impl IntoIterator<Item = impl Into<OsString>>) -> Self {
        Self {
            program: program.to_owned(),
            args: args.into_iter().map(Into::into).collect(),
            env: Vec::new(),
        }
    }

    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.to_owned(), value.to_owned()));
        self
    }

    /// The command line as a shell user would type it (for messages).
    pub fn display(&self) -> String {
        std::iter::once(self.program.clone())
            .chain(self.args.iter().map(|a| a.to_string_lossy().into_owned()))
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn command(&self) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(&self.program);
        command
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .kill_on_drop(true);
        command
    }

    /// Runs it with stdout and stderr captured.
    pub async fn output(&self) -> anyhow::Result<std::process::Output> {
        self.command()
            .output()
            .await
            .map_err(|e| spawn_error(&self.program, e))
    }
}

/// Runs `tool`, its stdout and stderr going to our stderr (progress stays visible, our stdout
/// stays for results); fails with the command line and exit status.
pub async fn run(tool: Tool) -> anyhow::Result<()> {
    let stdout = std::io::stderr()
        .as_fd()
        .try_clone_to_owned()
        .context("duplicating stderr")?;
    let status = tool
        .command()
        .stdout(Stdio::from(stdout))
        .stderr(Stdio::inherit())
        .status()
        .await
        .map_err(|e| spawn_error(&tool.program, e))?;
    if !status.success() {
        bail!(
            "`{}` failed ({status}); its output is above",
            tool.display()
        );
    }
    Ok(())
}

/// Runs `tool` and returns its stdout; on failure the error carries its stderr.
pub async fn run_captured(tool: &Tool) -> anyhow::Result<String> {
    let output = tool.output().await?;
    if !output.status.success() {
        bail!(
            "`{}` failed ({}): {}",
            tool.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    String::from_utf8(output.stdout)
        .with_context(|| format!("`{}` printed non-UTF-8", tool.display()))
}

fn spawn_error(program: &str, error: std::io::Error) -> anyhow::Error {
    if error.kind() == std::io::ErrorKind::NotFound {
        anyhow::anyhow!("`{program}` is not installed (not found on PATH)")
    } else {
        anyhow::Error::new(error).context(format!("starting `{program}`"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[OsString]) -> Vec<String> {
        args.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn images_are_tagged_and_never_latest() {
        let images = Images::with_tag(DEFAULT_TAG);
        assert_eq!(
            images.all(),
            [
                "coder-provisioner-operator:dev",
                "fake-coderd:dev",
                "coder-stub:dev"
            ]
        );
        assert!(images.all().iter().all(|i| !i.ends_with(":latest")));
    }

    #[test]
    fn build_commands_use_the_repository_as_context_and_name_the_stage() {
        let repo = Path::new("/src/repo");
        let [operator, fake, stub] = Images::with_tag("t1").build_specs();
        assert_eq!(
            strings(&docker_build_args(&operator, repo)),
            [
                "build",
                "-f",
                "/src/repo/operator/Dockerfile",
                "-t",
                "coder-provisioner-operator:t1",
                "/src/repo"
            ]
        );
        assert_eq!(
            strings(&docker_build_args(&fake, repo)),
            [
                "build",
                "-f",
                "/src/repo/fake-coderd/Dockerfile",
                "--target",
                "fake-coderd",
                "-t",
                "fake-coderd:t1",
                "/src/repo"
            ]
        );
        assert_eq!(
            strings(&docker_build_args(&stub, repo)),
            [
                "build",
                "-f",
                "/src/repo/fake-coderd/Dockerfile",
                "--target",
                "coder-stub",
                "-t",
                "coder-stub:t1",
                "/src/repo"
            ]
        );
    }

    #[test]
    fn every_image_is_loaded_into_kind_and_saved_for_k3s() {
        let images = Images::with_tag("dev");
        assert_eq!(
            strings(&kind_load_args("c1", &images)),
            [
                "load",
                "docker-image",
                "--name",
                "c1",
                "coder-provisioner-operator:dev",
                "fake-coderd:dev",
                "coder-stub:dev"
            ]
        );
        assert_eq!(
            strings(&docker_save_args(Path::new("/tmp/i.tar"), &images)),
            [
                "save",
                "-o",
                "/tmp/i.tar",
                "coder-provisioner-operator:dev",
                "fake-coderd:dev",
                "coder-stub:dev"
            ]
        );
        assert_eq!(
            k3s_import_command("/images/i.tar"),
            [
                "k3s",
                "ctr",
                "--namespace",
                "k8s.io",
                "images",
                "import",
                "/images/i.tar"
            ]
        );
    }

    #[test]
    fn prebuilt_is_the_default_and_both_builds_parse() {
        assert_eq!(ImageBuild::default(), ImageBuild::Prebuilt);
        assert_eq!(
            ImageBuild::parse("Dockerfile").unwrap(),
            ImageBuild::Dockerfile
        );
        assert_eq!(
            ImageBuild::parse(" prebuilt ").unwrap(),
            ImageBuild::Prebuilt
        );
        assert!(ImageBuild::parse("buildx").is_err());
    }

    /// Run from `cargo test`, the build must not carry this package's variables on (cargo sets
    /// them for the test; they are absent from a shell).
    #[test]
    fn the_images_release_build_drops_the_running_packages_variables() {
        assert!(std::env::var_os("CARGO_PKG_NAME").is_some());
        let command = cargo_build_binaries(Path::new("/r"), Path::new("/cache/target-image"));
        let removed: Vec<_> = command
            .as_std()
            .get_envs()
            .filter(|(_, value)| value.is_none())
            .map(|(name, _)| name.to_string_lossy().into_owned())
            .collect();
        for name in ["CARGO_PKG_NAME", "CARGO_MANIFEST_DIR"] {
            assert!(
                removed.iter().any(|r| r == name),
                "{name} kept: {removed:?}"
            );
        }
        assert_eq!(command.as_std().get_current_dir(), Some(Path::new("/r")));
    }

    #[test]
    fn prebuilt_images_come_from_cargo_built_binaries_and_the_images_script() {
        assert_eq!(
            cargo_build_binaries_args(Path::new("/cache/target-image")),
            [
                "build",
                "--workspace",
                "--bins",
                "--profile",
                "image",
                "--target-dir",
                "/cache/target-image",
                "--locked",
                "--message-format=json-render-diagnostics"
            ]
        );
        let messages = [
            "coder-provisioner-operator",
            "fake-coderd",
            "coder-stub",
        ]
        .map(|name| {
            format!(
                r#"{{"reason":"compiler-artifact","target":{{"name":"{name}"}},"executable":"/t/debug/{name}"}}"#
            )
        })
        .join("\n");
        assert_eq!(
            built_binaries_dir(&messages).unwrap(),
            Path::new("/t/debug")
        );
        assert!(built_binaries_dir("").is_err());
        assert_eq!(
            strings(&images_script_args(
                Path::new("/r"),
                "dev",
                Path::new("/t/debug")
            )),
            [
                "/r/scripts/images.sh",
                "--tag",
                "dev",
                "--bin-dir",
                "/t/debug"
            ]
        );
    }

    #[tokio::test]
    async fn a_missing_tool_is_named_in_the_error() {
        let error = require_docker_engine("/nonexistent/docker")
            .await
            .expect_err("no such program");
        let text = format!("{error:#}");
        assert!(
            text.contains("`/nonexistent/docker` is not installed"),
            "{text}"
        );
        assert!(text.contains("need Docker"), "{text}");
    }

    #[tokio::test]
    async fn a_failing_tool_reports_its_command_line_and_stderr() {
        let tool = Tool::new("sh", ["-c", "echo broken >&2; exit 3"]);
        let error = run_captured(&tool).await.expect_err("exit 3").to_string();
        assert!(
            error.contains("`sh -c echo broken >&2; exit 3` failed"),
            "{error}"
        );
        assert!(error.contains("broken"), "{error}");
        let ok = run_captured(&Tool::new("sh", ["-c", "printf hi"]))
            .await
            .expect("runs");
        assert_eq!(ok, "hi");
    }
}
