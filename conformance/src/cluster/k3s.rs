//! The k3s tier: a single-node k3s in a Docker container (testcontainers-modules' `K3s`), with
//! the images imported into its containerd and the same stack as the kind tier
//! ([`super::kind::install_stack`]).
//!
//! The images travel as one `docker save` archive copied into the container before it starts
//! (works with remote Docker engines too) and are imported with `k3s ctr`. The kubeconfig is read
//! from the container and pointed at the API server's mapped port.
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use kube::config::Kubeconfig;
use testcontainers_modules::k3s::{K3s, KUBE_SECURE_PORT};
use testcontainers_modules::testcontainers::core::{CmdWaitFor, ExecCommand};
use testcontainers_modules::testcontainers::runners::AsyncRunner;
use testcontainers_modules::testcontainers::{ContainerAsync, ImageExt};

use super::images::{self, ImageBuild, Images, Tool};
use super::kind::{DEFAULT_READY_TIMEOUT, ProvisionedCluster, hold_unless_kept, install_stack};
use super::kubeconfig;

/// k3s release of the tier: Kubernetes v1.37, like the local tier (v1.37.2). The module's
/// default (`v1.28.8-k3s1`) is older than the oldest API the suite supports. This tag follows
/// k3s's naming but could not be checked against Docker Hub from the machine it was written on.
pub const K3S_TAG: &str = "v1.37.2-k3s1";
/// Where the image archive is copied inside the container.
pub const ARCHIVE_IN_CONTAINER: &str = "/var/tmp/coder-conformance-images.tar";
const KUBECONFIG_IN_CONTAINER: &str = "/etc/rancher/k3s/k3s.yaml";

#[derive(Clone, Debug)]
pub struct K3sOptions {
    pub repo_root: PathBuf,
    pub images: Images,
    /// Build the images first (`false`: they must already be in the local Docker engine).
    pub build_images: bool,
    /// How to build them (`None`: [`images::IMAGE_BUILD_ENV`], default prebuilt).
    pub image_build: Option<ImageBuild>,
    /// Leave the container running when dropped.
    pub keep: bool,
    pub ready_timeout: Duration,
}

impl K3sOptions {
    pub fn new(repo_root: &Path) -> Self {
        Self {
            repo_root: repo_root.to_path_buf(),
            images: Images::with_tag(images::DEFAULT_TAG),
            build_images: true,
            image_build: None,
            keep: false,
            ready_timeout: DEFAULT_READY_TIMEOUT,
        }
    }
}

/// `k3s server` arguments: the module's `native` snapshotter (works inside Docker on any storage
/// driver), without the ingress controller and metrics server the suite does not use.
pub fn k3s_server_args() -> Vec<String> {
    [
        "server",
        "--snapshotter=native",
        "--disable=traefik,metrics-server",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// The container's kubeconfig with every cluster pointed at `server_url`. k3s's serving
/// certificate names `localhost` and `127.0.0.1`; for any other Docker host the TLS server name
/// stays `localhost`.
pub fn point_kubeconfig_at(yaml: &str, host: &str, port: u16) -> anyhow::Result<String> {
    let mut config = Kubeconfig::from_yaml(yaml).context("parsing the k3s kubeconfig")?;
    if config.clusters.is_empty() {
        bail!("the k3s kubeconfig names no cluster");
    }
    let loopback = matches!(host, "localhost" | "127.0.0.1" | "::1");
    let authority = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_owned()
    };
    for cluster in config
        .clusters
        .iter_mut()
        .filter_map(|c| c.cluster.as_mut())
    {
        cluster.server = Some(format!("https://{authority}:{port}"));
        if !loopback {
            cluster.tls_server_name = Some("localhost".to_owned());
        }
    }
    serde_saphyr::to_string(&config).context("serialising the k3s kubeconfig")
}

/// A k3s container with the whole stack installed; removed on drop unless `keep`.
pub struct K3sCluster {
    provisioned: ProvisionedCluster,
    _dir: Option<tempfile::TempDir>,
    /// Always `Some` until [`Drop`] takes it out to keep or remove it.
    container: Option<ContainerAsync<K3s>>,
    keep: bool,
}

impl K3sCluster {
    /// Builds and saves the images, starts k3s with them, and installs the stack. On error the
    /// container is removed (kept with `keep`, for debugging).
    pub async fn provision(options: K3sOptions) -> anyhow::Result<Self> {
        images::require_docker_engine("docker").await?;
        if options.build_images {
            let how = match options.image_build {
                Some(how) => how,
                None => ImageBuild::from_env()?,
            };
            images::build_with(how, &options.repo_root, &options.images)
                .await
                .context("building the images")?;
        }
        let dir = tempfile::Builder::new()
            .prefix("coder-conformance-k3s-")
            .tempdir()
            .context("creating a folder for the k3s tier")?;
        let archive = dir.path().join("images.tar");
        images::run(Tool::new(
            "docker",
            images::docker_save_args(&archive, &options.images),
        ))
        .await?;

        eprintln!("conformance: starting rancher/k3s:{K3S_TAG}");
        let container = K3s::default()
            .with_cmd(k3s_server_args())
            .with_tag(K3S_TAG)
            .with_privileged(true)
            .with_userns_mode("host")
            .with_copy_to(ARCHIVE_IN_CONTAINER, archive.as_path())
            .with_startup_timeout(options.ready_timeout)
            .start()
            .await
            .context("starting the k3s container")?;
        let kubeconfig_path = dir.path().join("kubeconfig");
        match install(&container, &kubeconfig_path, &options).await {
            Ok(provisioned) => Ok(Self {
                provisioned,
                _dir: hold_unless_kept(dir, options.keep),
                container: Some(container),
                keep: options.keep,
            }),
            Err(error) => {
                release(container, options.keep);
                Err(error)
            }
        }
    }

    pub fn provisioned(&self) -> &ProvisionedCluster {
        &self.provisioned
    }
}

impl Drop for K3sCluster {
    fn drop(&mut self) {
        if let Some(container) = self.container.take() {
            release(container, self.keep);
        }
    }
}

/// Imports the images, writes the kubeconfig and installs the stack.
async fn install(
    container: &ContainerAsync<K3s>,
    kubeconfig_path: &Path,
    options: &K3sOptions,
) -> anyhow::Result<ProvisionedCluster> {
    exec_ok(container, images::k3s_import_command(ARCHIVE_IN_CONTAINER)).await?;
    let raw = exec_ok(container, ["cat", KUBECONFIG_IN_CONTAINER]).await?;
    let host = container
        .get_host()
        .await
        .context("reading the Docker host")?
        .to_string();
    let port = container
        .get_host_port_ipv4(KUBE_SECURE_PORT)
        .await
        .context("reading the API server port")?;
    kubeconfig::write_private(kubeconfig_path, &point_kubeconfig_at(&raw, &host, port)?)?;
    let client = kubeconfig::client_from_file(kubeconfig_path).await?;
    let fake_coderd = install_stack(
        &client,
        kubeconfig_path,
        &options.repo_root,
        &options.images,
        options.ready_timeout,
    )
    .await?;
    eprintln!(
        "conformance: k3s ready; kubeconfig {}",
        kubeconfig_path.display()
    );
    Ok(ProvisionedCluster {
        kubeconfig: kubeconfig_path.to_path_buf(),
        images: options.images.clone(),
        fake_coderd,
    })
}

/// Removes the container (testcontainers' drop), or forgets the handle so it keeps running.
fn release(container: ContainerAsync<K3s>, keep: bool) {
    if keep {
        eprintln!(
            "conformance: kept k3s container {0} (remove it with: docker rm -f {0})",
            container.id()
        );
        std::mem::forget(container);
    }
}

/// Runs `command` in the container; returns its stdout, or fails with its stderr.
async fn exec_ok(
    container: &ContainerAsync<K3s>,
    command: impl IntoIterator<Item = impl Into<String>>,
) -> anyhow::Result<String> {
    let command: Vec<String> = command.into_iter().map(Into::into).collect();
    let shown = command.join(" ");
    let mut result = container
        .exec(ExecCommand::new(command).with_cmd_ready_condition(CmdWaitFor::exit()))
        .await
        .with_context(|| format!("running `{shown}` in the k3s container"))?;
    let stdout = result
        .stdout_to_vec()
        .await
        .with_context(|| format!("reading the output of `{shown}`"))?;
    let stderr = result.stderr_to_vec().await.unwrap_or_default();
    match result
        .exit_code()
        .await
        .with_context(|| format!("reading the exit code of `{shown}`"))?
    {
        Some(0) => {
            String::from_utf8(stdout).with_context(|| format!("`{shown}` printed non-UTF-8"))
        }
        code => bail!(
            "`{shown}` failed in the k3s container ({code:?}): {}",
            String::from_utf8_lossy(&stderr).trim()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K3S_KUBECONFIG: &str = "apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: Q0E=
    server: https://127.0.0.1:6443
  name: default
contexts:
- context: {cluster: default, user: default}
  name: default
current-context: default
kind: Config
users:
- name: default
  user: {client-certificate-data: Q0VSVA==, client-key-data: S0VZ}
";

    #[test]
    fn the_kubeconfig_points_at_the_mapped_port() {
        let yaml = point_kubeconfig_at(K3S_KUBECONFIG, "localhost", 32768).expect("rewrites");
        let config = Kubeconfig::from_yaml(&yaml).expect("still a kubeconfig");
        let cluster = config.clusters[0].cluster.as_ref().expect("cluster");
        assert_eq!(cluster.server.as_deref(), Some("https://localhost:32768"));
        assert_eq!(cluster.tls_server_name, None);
        assert_eq!(cluster.certificate_authority_data.as_deref(), Some("Q0E="));
        assert_eq!(config.current_context.as_deref(), Some("default"));
    }

    #[test]
    fn a_remote_docker_host_keeps_the_certificates_server_name() {
        let yaml = point_kubeconfig_at(K3S_KUBECONFIG, "10.1.2.3", 32768).expect("rewrites");
        let config = Kubeconfig::from_yaml(&yaml).expect("still a kubeconfig");
        let cluster = config.clusters[0].cluster.as_ref().expect("cluster");
        assert_eq!(cluster.server.as_deref(), Some("https://10.1.2.3:32768"));
        assert_eq!(cluster.tls_server_name.as_deref(), Some("localhost"));
        let v6 = point_kubeconfig_at(K3S_KUBECONFIG, "fd00::1", 1).expect("rewrites");
        assert!(v6.contains("https://[fd00::1]:1"), "{v6}");
    }

    #[test]
    fn a_kubeconfig_without_clusters_is_refused() {
        let error = point_kubeconfig_at("apiVersion: v1\nkind: Config\n", "localhost", 1)
            .expect_err("no cluster");
        assert!(error.to_string().contains("no cluster"), "{error}");
    }

    #[test]
    fn k3s_runs_without_the_addons_the_suite_does_not_need() {
        let args = k3s_server_args();
        assert_eq!(args[0], "server");
        assert!(args.contains(&"--disable=traefik,metrics-server".to_owned()));
    }
}
