//! The kind tier: a throw-away kind cluster with the reference operator and the fake coderd
//! running in it, and the parts every real cluster shares (k3s reuses them):
//!
//! - [`install_stack`] = [`install_operator_with_helm`] (CRDs, then the chart
//!   `config/helm/coder-provisioner-operator` with the image set to the loaded tag) +
//!   [`install_fake_coderd`] (`config/fake-coderd` plus a Secret with a
//!   random admin token), each waiting until its Deployment is available.
//! - [`InClusterFakeCoderd`]: how the suite reaches that fake. Control planes publish its
//!   in-cluster Service URL; the suite itself talks to it through port-forwards to the pod
//!   (kube's portforward subresource, so any cluster works). The API server's service proxy is
//!   not usable here: the API server removes the `Authorization` header after authenticating the
//!   caller, so the admin API's bearer token would never arrive.
//!
//! Provisioner pods run the stub daemon image ([`Images::coder_stub`]) when the suite sets it as
//! the control plane's (or the CR's) `spec.image`; the stub authenticates with the key the
//! operator wrote, which the fake journals (contract D-8).
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use fake_coderd::AdminClient;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, DynamicObject, ListParams};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};

use super::images::{self, ImageBuild, Images, Tool};
use super::kubeconfig;
use crate::manifests::{self, ApplyOptions};

/// kind configuration of the tier (node image pinned there), relative to the repository root.
pub const KIND_CONFIG: &str = "config/kind/kind-config.yaml";
pub const DEFAULT_CLUSTER_NAME: &str = "coder-conformance";

pub const CRD_DIR: &str = "config/crd";
pub const RBAC_DIR: &str = "config/rbac";
pub const MANAGER_DIR: &str = "config/manager";
pub const FAKE_CODERD_DIR: &str = "config/fake-coderd";
/// Name of the operator's container in `config/manager`'s Deployment.
pub const MANAGER_CONTAINER: &str = "manager";

/// Where `config/fake-coderd` puts the fake, and the names the suite relies on.
pub const FAKE_CODERD_NAMESPACE: &str = "coder-fake";
pub const FAKE_CODERD_NAME: &str = "fake-coderd";
pub const FAKE_CODERD_ADMIN_SECRET: &str = "fake-coderd-admin";
pub const FAKE_CODERD_ADMIN_SECRET_KEY: &str = "token";
/// Pod-template annotation with the admin token's fingerprint: a new token rolls the fake's pod.
pub const ADMIN_TOKEN_ANNOTATION: &str = "conformance.coder.com/admin-token-fingerprint";
/// Container (and Service) ports of the fake: the coderd API and the admin API.
pub const FAKE_CODERD_PORT: u16 = 3000;
pub const FAKE_CODERD_ADMIN_PORT: u16 = 3001;
/// The other coderds of the fake's pod (containers `fake-coderd-b`, `-c`): coderd and admin
/// ports, on the same Service host as the fake (issue 38's environment shapes).
pub const OTHER_FAKE_CODERDS: [(&str, u16, u16); 2] =
    [("fake-coderd-b", 3002, 3003), ("fake-coderd-c", 3004, 3005)];

/// Default deadline for the operator and the fake to become available.
pub const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(300);
pub(crate) const POLL: Duration = Duration::from_secs(1);

// ---- what a provisioned real cluster offers the suite ----

/// A real cluster with the operator and the fake coderd running in it.
#[derive(Debug)]
pub struct ProvisionedCluster {
    /// Admin kubeconfig of the cluster.
    pub kubeconfig: PathBuf,
    pub images: Images,
    pub fake_coderd: InClusterFakeCoderd,
}

/// The fake coderd inside the cluster, as seen from the cluster and from the suite.
pub struct InClusterFakeCoderd {
    pub namespace: String,
    /// URL the operator and the provisioner pods use: control planes publish it in `status.url`.
    pub in_cluster_url: String,
    coderd: PortForward,
    admin: PortForward,
    pub(crate) admin_token: String,
    /// The other coderds of the pod, in the order of [`OTHER_FAKE_CODERDS`].
    pub others: Vec<OtherInClusterCoderd>,
}

/// Another coderd of the fake's pod: the same host as the fake, another port.
pub struct OtherInClusterCoderd {
    pub in_cluster_url: String,
    coderd: PortForward,
    admin: PortForward,
}

impl OtherInClusterCoderd {
    pub fn local_url(&self) -> String {
        self.coderd.url()
    }

    /// Its admin API, which takes the fake's admin token.
    pub fn admin(&self, token: &str) -> AdminClient {
        AdminClient::new(&self.admin.url(), token)
    }
}

impl std::fmt::Debug for InClusterFakeCoderd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InClusterFakeCoderd")
            .field("in_cluster_url", &self.in_cluster_url)
            .field("local_url", &self.local_url())
            .field("admin_url", &self.admin_url())
            .finish_non_exhaustive()
    }
}

impl InClusterFakeCoderd {
    /// The coderd API through a port-forward, for requests the suite itself makes (e.g. checking
    /// that a key authenticates). Not reachable from inside the cluster.
    pub fn local_url(&self) -> String {
        self.coderd.url()
    }

    /// The admin API through a port-forward.
    pub fn admin_url(&self) -> String {
        self.admin.url()
    }

    /// An admin client (reset, faults, journal …) for this fake.
    pub fn admin(&self) -> AdminClient {
        AdminClient::new(&self.admin_url(), &self.admin_token)
    }
}

/// `http://<service>.<namespace>.svc:<port>`: resolvable from every pod through the cluster
/// DNS search path, whatever the cluster domain is.
pub fn service_url(service: &str, namespace: &str, port: u16) -> String {
    format!("http://{service}.{namespace}.svc:{port}")
}

// ---- the kind cluster ----

/// Environment variable selecting the node image (as `--node-image`).
pub const NODE_IMAGE_ENV: &str = "KIND_NODE_IMAGE";
/// Node image value meaning "build (or reuse) the node image made here without a registry"
/// (scripts/kind-node-image.sh).
pub const OFFLINE_NODE_IMAGE: &str = "offline";
/// Resolves kind: the one on the PATH (new enough), else the per-user cache, else built from the
/// Go module proxy.
pub const KIND_BINARY_SCRIPT: &str = "scripts/kind-binary.sh";
pub const KIND_NODE_IMAGE_SCRIPT: &str = "scripts/kind-node-image.sh";

#[derive(Clone, Debug)]
pub struct KindOptions {
    /// kind cluster name; an existing cluster of that name is reused.
    pub name: String,
    /// Repository root: Dockerfiles and `config/`.
    pub repo_root: PathBuf,
    pub images: Images,
    /// Build the images first (`false`: they must already be in the local Docker engine).
    pub build_images: bool,
    /// How to build them (`None`: [`images::IMAGE_BUILD_ENV`], default prebuilt).
    pub image_build: Option<ImageBuild>,
    /// Node image: `None` = [`NODE_IMAGE_ENV`], and when that is unset the image the kind
    /// configuration pins (kind's stock image); [`OFFLINE_NODE_IMAGE`] = scripts/kind-node-image.sh;
    /// anything else is an image reference.
    pub node_image: Option<String>,
    /// Where `kind export logs` writes when provisioning fails (`None`: no export).
    pub logs_dir: Option<PathBuf>,
    /// Leave the cluster running when dropped (a later run with the same name reuses it).
    pub keep: bool,
    pub ready_timeout: Duration,
}

impl KindOptions {
    pub fn new(repo_root: &Path) -> Self {
        Self {
            name: DEFAULT_CLUSTER_NAME.to_owned(),
            repo_root: repo_root.to_path_buf(),
            images: Images::with_tag(images::DEFAULT_TAG),
            build_images: true,
            image_build: None,
            node_image: None,
            logs_dir: None,
            keep: false,
            ready_timeout: DEFAULT_READY_TIMEOUT,
        }
    }
}

/// The node image an option (or, when `None`, the environment value) asks for; empty = none.
pub fn requested_node_image(option: Option<&str>, env: Option<&str>) -> Option<String> {
    option
        .or(env)
        .map(str::trim)
        .filter(|image| !image.is_empty())
        .map(str::to_owned)
}

/// A kind cluster with the whole stack installed; deleted on drop unless `keep`.
pub struct KindCluster {
    provisioned: ProvisionedCluster,
    /// Holds the kubeconfig; `None` when kept (the folder then stays).
    _dir: Option<tempfile::TempDir>,
    // Declared last: dropped after the port-forwards.
    guard: KindGuard,
}

/// Runs one provisioning step, printing its duration, and names it in the error.
async fn step<T>(
    name: &str,
    work: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    let started = Instant::now();
    let result = work
        .await
        .with_context(|| format!("kind tier, step '{name}' failed"));
    if result.is_ok() {
        eprintln!(
            "conformance: kind tier: {name}: done in {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
    result
}

/// The kind program: scripts/kind-binary.sh's answer when the script exists, else `kind`.
async fn resolve_kind(repo: &Path) -> anyhow::Result<String> {
    let script = repo.join(KIND_BINARY_SCRIPT);
    let program = if script.is_file() {
        let out = images::run_captured_streaming_stderr(&Tool::new("bash", [script])).await?;
        last_line(&out)
            .context("scripts/kind-binary.sh printed no path")?
            .to_owned()
    } else {
        "kind".to_owned()
    };
    let version = images::run_captured(&Tool::new(&program, ["version"]))
        .await
        .context("the kind tier needs kind (https://kind.sigs.k8s.io)")?;
    eprintln!("conformance: using {program} ({})", version.trim());
    Ok(program)
}

/// The node image to boot: `None` (the configuration's), a reference, or the offline image's
/// tag from scripts/kind-node-image.sh.
async fn resolve_node_image(
    repo: &Path,
    requested: Option<String>,
) -> anyhow::Result<Option<String>> {
    match requested {
        Some(image) if image == OFFLINE_NODE_IMAGE => {
            eprintln!(
                "conformance: building or reusing the offline node image ({KIND_NODE_IMAGE_SCRIPT})"
            );
            let out = images::run_captured_streaming_stderr(&Tool::new(
                "bash",
                [repo.join(KIND_NODE_IMAGE_SCRIPT)],
            ))
            .await?;
            let tag = last_line(&out).context("scripts/kind-node-image.sh printed no tag")?;
            Ok(Some(tag.to_owned()))
        }
        other => Ok(other),
    }
}

fn last_line(text: &str) -> Option<&str> {
    text.lines().map(str::trim).rfind(|l| !l.is_empty())
}

impl KindCluster {
    /// Builds the images, creates (or reuses) the cluster, loads the images and installs the
    /// stack. On error the cluster's logs go to `logs_dir` and the cluster is deleted again
    /// (unless `keep`). Every error names the step that failed.
    pub async fn provision(options: KindOptions) -> anyhow::Result<Self> {
        let repo = options.repo_root.clone();
        let kind = step("kind", resolve_kind(&repo)).await?;
        step("docker engine", images::require_docker_engine("docker")).await?;
        let requested = requested_node_image(
            options.node_image.as_deref(),
            std::env::var(NODE_IMAGE_ENV).ok().as_deref(),
        );
        let node_image = step("node image", resolve_node_image(&repo, requested)).await?;
        if options.build_images {
            let how = match options.image_build {
                Some(how) => how,
                None => ImageBuild::from_env()?,
            };
            step("images", images::build_with(how, &repo, &options.images)).await?;
        }
        let existing = images::run_captured(&Tool::new(&kind, ["get", "clusters"]))
            .await
            .context("kind tier, step 'cluster' failed")?;
        let guard = KindGuard::new(&kind, &options.name, options.keep);
        let result = Self::provision_cluster(
            &kind,
            &options,
            node_image.as_deref(),
            cluster_listed(&existing, &options.name),
        )
        .await;
        match result {
            Ok((provisioned, dir)) => Ok(Self {
                provisioned,
                _dir: hold_unless_kept(dir, options.keep),
                guard,
            }),
            Err(error) => {
                if let Some(logs) = &options.logs_dir {
                    export_logs(&kind, &options.name, logs);
                }
                Err(error)
            }
        }
    }

    async fn provision_cluster(
        kind: &str,
        options: &KindOptions,
        node_image: Option<&str>,
        exists: bool,
    ) -> anyhow::Result<(ProvisionedCluster, tempfile::TempDir)> {
        if exists {
            eprintln!("conformance: reusing kind cluster {}", options.name);
        } else {
            let config = options.repo_root.join(KIND_CONFIG);
            eprintln!(
                "conformance: creating kind cluster {} from {}{}",
                options.name,
                config.display(),
                node_image
                    .map(|i| format!(" with node image {i}"))
                    .unwrap_or_default()
            );
            step(
                "cluster",
                images::run(Tool::new(
                    kind,
                    kind_create_args(&options.name, &config, node_image, options.ready_timeout),
                )),
            )
            .await?;
        }
        let dir = tempfile::Builder::new()
            .prefix("coder-conformance-kind-")
            .tempdir()
            .context("creating a folder for the kind kubeconfig")?;
        let kubeconfig_path = dir.path().join("kubeconfig");
        let kubeconfig_yaml = images::run_captured(&Tool::new(
            kind,
            ["get", "kubeconfig", "--name", &options.name],
        ))
        .await
        .context("kind tier, step 'kubeconfig' failed")?;
        kubeconfig::write_private(&kubeconfig_path, &kubeconfig_yaml)?;
        step(
            "load images",
            images::run(Tool::new(
                kind,
                images::kind_load_args(&options.name, &options.images),
            )),
        )
        .await?;
        let client = kubeconfig::client_from_file(&kubeconfig_path).await?;
        let fake_coderd = step(
            "install operator and fake coderd",
            install_stack(
                &client,
                &kubeconfig_path,
                &options.repo_root,
                &options.images,
                options.ready_timeout,
            ),
        )
        .await?;
        eprintln!(
            "conformance: kind cluster {} ready; kubeconfig {}",
            options.name,
            kubeconfig_path.display()
        );
        Ok((
            ProvisionedCluster {
                kubeconfig: kubeconfig_path,
                images: options.images.clone(),
                fake_coderd,
            },
            dir,
        ))
    }

    pub fn provisioned(&self) -> &ProvisionedCluster {
        &self.provisioned
    }

    pub fn name(&self) -> &str {
        &self.guard.name
    }

    /// `kind export logs` of this cluster into `dir` (best effort; says what happened).
    pub fn export_logs(&self, dir: &Path) {
        export_logs(&self.guard.kind, &self.guard.name, dir);
    }
}

/// `kind export logs --name N DIR`, best effort: the outcome is printed, never an error.
pub fn export_logs(kind: &str, name: &str, dir: &Path) {
    let status = std::process::Command::new(kind)
        .args(["export", "logs", "--name", name])
        .arg(dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
    match status {
        Ok(status) if status.success() => {
            eprintln!("conformance: kind cluster logs in {}", dir.display());
        }
        Ok(status) => {
            eprintln!("conformance: `{kind} export logs --name {name}` failed ({status})")
        }
        Err(error) => eprintln!("conformance: could not run {kind} to export logs: {error}"),
    }
}

/// The folder to remove on drop, or `None` after telling where a kept folder stays.
pub(super) fn hold_unless_kept(dir: tempfile::TempDir, keep: bool) -> Option<tempfile::TempDir> {
    if keep {
        eprintln!("conformance: kept {} (kubeconfig)", dir.keep().display());
        None
    } else {
        Some(dir)
    }
}

/// Deletes the kind cluster when dropped (and on Ctrl-C), unless it is to be kept.
struct KindGuard {
    kind: String,
    name: String,
    keep: bool,
}

impl KindGuard {
    fn new(kind: &str, name: &str, keep: bool) -> Self {
        if !keep {
            super::children::register_cleanup_command(
                &Self::cleanup_id(name),
                vec![
                    kind.to_owned(),
                    "delete".to_owned(),
                    "cluster".to_owned(),
                    "--name".to_owned(),
                    name.to_owned(),
                ],
            );
        }
        Self {
            kind: kind.to_owned(),
            name: name.to_owned(),
            keep,
        }
    }

    fn cleanup_id(name: &str) -> String {
        format!("deleting kind cluster {name}")
    }
}

impl Drop for KindGuard {
    fn drop(&mut self) {
        if self.keep {
            eprintln!(
                "conformance: kept kind cluster {0} (delete it with: kind delete cluster --name {0})",
                self.name
            );
            return;
        }
        // Blocking on purpose: drop may run while the runtime shuts down.
        match std::process::Command::new(&self.kind)
            .args(["delete", "cluster", "--name", &self.name])
            .stdin(std::process::Stdio::null())
            .status()
        {
            Ok(status) if status.success() => {}
            Ok(status) => eprintln!(
                "conformance: `kind delete cluster --name {}` failed ({status})",
                self.name
            ),
            Err(error) => eprintln!(
                "conformance: could not run kind to delete cluster {}: {error}",
                self.name
            ),
        }
        super::children::unregister_cleanup_command(&Self::cleanup_id(&self.name));
    }
}

/// `kind create cluster --name N --config F [--image I] --wait Ns --retain` (`--retain`: a
/// failed cluster's nodes stay for `kind export logs`; the suite deletes the cluster itself).
pub fn kind_create_args(
    name: &str,
    config: &Path,
    node_image: Option<&str>,
    wait: Duration,
) -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = vec![
        "create".into(),
        "cluster".into(),
        "--name".into(),
        name.into(),
        "--config".into(),
        config.into(),
    ];
    if let Some(image) = node_image {
        args.extend(["--image".into(), image.into()]);
    }
    args.extend([
        "--wait".into(),
        format!("{}s", wait.as_secs()).into(),
        "--retain".into(),
    ]);
    args
}

/// Whether `kind get clusters` output lists `name`.
pub fn cluster_listed(kind_get_clusters: &str, name: &str) -> bool {
    kind_get_clusters.lines().any(|line| line.trim() == name)
}

/// The node images a kind configuration pins (`nodes[].image`); errors if it is no kind config.
pub fn kind_node_images(config_yaml: &str) -> anyhow::Result<Vec<String>> {
    let config: Value =
        serde_saphyr::from_str(config_yaml).context("parsing the kind configuration")?;
    if config.get("kind").and_then(Value::as_str) != Some("Cluster")
        || config.get("apiVersion").and_then(Value::as_str) != Some("kind.x-k8s.io/v1alpha4")
    {
        bail!("not a kind configuration (kind: Cluster, apiVersion: kind.x-k8s.io/v1alpha4)");
    }
    let nodes = config
        .get("nodes")
        .and_then(Value::as_array)
        .context("the kind configuration has no nodes")?;
    nodes
        .iter()
        .enumerate()
        .map(|(index, node)| {
            node.get("image")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .with_context(|| format!("node {} pins no image", index + 1))
        })
        .collect()
}

// ---- installing the stack (any real cluster) ----

/// Installs the CRDs, the operator with its Helm chart ([`install_operator_with_helm`]) and the
/// fake coderd, waits until both Deployments are available, and opens the port-forwards to the
/// fake.
pub async fn install_stack(
    client: &kube::Client,
    kubeconfig: &Path,
    repo: &Path,
    images: &Images,
    ready_timeout: Duration,
) -> anyhow::Result<InClusterFakeCoderd> {
    let deadline = Instant::now() + ready_timeout;
    install_operator_with_helm(client, kubeconfig, repo, &images.operator, deadline).await?;
    install_fake_coderd(client, repo, &images.fake_coderd, deadline).await
}

/// The chart the kind and k3s tiers install the operator with, its release and namespace: the
/// objects are named as `config/` names them (`kubectl apply -k config/` stays the other
/// documented way; conformance/tests/helm_chart.rs checks that both grant the same RBAC).
pub const CHART_DIR: &str = "config/helm/coder-provisioner-operator";
pub const HELM_RELEASE: &str = "coder-provisioner-operator";
pub const OPERATOR_NAMESPACE: &str = "coder-system";
/// Resolves the pinned helm (the per-user cache, or built from the Go module proxy).
pub const HELM_BINARY_SCRIPT: &str = "scripts/helm-binary.sh";

/// `helm upgrade --install` of the chart as [`HELM_RELEASE`] in [`OPERATOR_NAMESPACE`], its
/// image set to `image`; the CRDs are applied by the suite before (`--skip-crds`: helm installs a
/// chart's CRDs only once, and a reused cluster must get the current ones). `--take-ownership`
/// adopts the objects of an earlier install from `config/manager` (a kept cluster).
pub fn helm_install_args(kubeconfig: &Path, chart: &Path, image: &str) -> Vec<std::ffi::OsString> {
    let (repository, tag) = image.rsplit_once(':').unwrap_or((image, "latest"));
    let mut args: Vec<std::ffi::OsString> = vec![
        "upgrade".into(),
        "--install".into(),
        HELM_RELEASE.into(),
        chart.into(),
        "--namespace".into(),
        OPERATOR_NAMESPACE.into(),
        "--create-namespace".into(),
        "--skip-crds".into(),
        "--take-ownership".into(),
        "--kubeconfig".into(),
        kubeconfig.into(),
    ];
    for (key, value) in [
        ("image.repository", repository),
        ("image.tag", tag),
        ("image.pullPolicy", "IfNotPresent"),
    ] {
        args.extend(["--set".into(), format!("{key}={value}").into()]);
    }
    args
}

/// The reference operator with its Helm chart: CRDs, then `helm upgrade --install`; waits until
/// its Deployment is available.
pub async fn install_operator_with_helm(
    client: &kube::Client,
    kubeconfig: &Path,
    repo: &Path,
    image: &str,
    deadline: Instant,
) -> anyhow::Result<()> {
    manifests::install_crds(client, &repo.join(CRD_DIR))
        .await
        .context("installing the CRDs")?;
    let out =
        images::run_captured_streaming_stderr(&Tool::new("bash", [repo.join(HELM_BINARY_SCRIPT)]))
            .await
            .context("resolving helm (scripts/helm-binary.sh)")?;
    let helm = last_line(&out)
        .context("scripts/helm-binary.sh printed no path")?
        .to_owned();
    images::run(Tool::new(
        &helm,
        helm_install_args(kubeconfig, &repo.join(CHART_DIR), image),
    ))
    .await
    .context("installing the operator with its Helm chart")?;
    wait_deployment_available(client, OPERATOR_NAMESPACE, HELM_RELEASE, deadline).await
}

/// The fake coderd of `config/fake-coderd` (image `image`, which the cluster must be able to
/// run) with a fresh random admin token; usable alone, next to an operator installed by a
/// vendor. Waits until it is available and its admin API answers through the port-forward.
pub async fn install_fake_coderd(
    client: &kube::Client,
    repo: &Path,
    image: &str,
    deadline: Instant,
) -> anyhow::Result<InClusterFakeCoderd> {
    let admin_token = fake_coderd::state::random_alphanumeric(32);
    let objects = fake_coderd_objects(repo, image, &admin_token)?;
    manifests::apply_objects(client, objects, &ApplyOptions::default())
        .await
        .context("installing the fake coderd")?;
    wait_deployment_available(client, FAKE_CODERD_NAMESPACE, FAKE_CODERD_NAME, deadline).await?;
    let fake = InClusterFakeCoderd {
        namespace: FAKE_CODERD_NAMESPACE.to_owned(),
        in_cluster_url: service_url(FAKE_CODERD_NAME, FAKE_CODERD_NAMESPACE, FAKE_CODERD_PORT),
        coderd: PortForward::to_service(
            client,
            FAKE_CODERD_NAMESPACE,
            FAKE_CODERD_NAME,
            FAKE_CODERD_PORT,
        )
        .await?,
        admin: PortForward::to_service(
            client,
            FAKE_CODERD_NAMESPACE,
            FAKE_CODERD_NAME,
            FAKE_CODERD_ADMIN_PORT,
        )
        .await?,
        admin_token,
        others: Vec::new(),
    };
    wait_admin_answers(&fake.admin(), deadline).await?;
    let mut fake = fake;
    for (_, port, admin_port) in OTHER_FAKE_CODERDS {
        let other = OtherInClusterCoderd {
            in_cluster_url: service_url(FAKE_CODERD_NAME, FAKE_CODERD_NAMESPACE, port),
            coderd: PortForward::to_service(client, FAKE_CODERD_NAMESPACE, FAKE_CODERD_NAME, port)
                .await?,
            admin: PortForward::to_service(
                client,
                FAKE_CODERD_NAMESPACE,
                FAKE_CODERD_NAME,
                admin_port,
            )
            .await?,
        };
        wait_admin_answers(&other.admin(&fake.admin_token), deadline).await?;
        fake.others.push(other);
    }
    Ok(fake)
}

/// `config/manager` with the operator container's image set to `image`.
pub fn manager_objects(repo: &Path, image: &str) -> anyhow::Result<Vec<DynamicObject>> {
    let mut objects = manifests::read_dir(&repo.join(MANAGER_DIR))?;
    set_container_image(&mut objects, MANAGER_CONTAINER, image)?;
    Ok(objects)
}

/// `config/fake-coderd` with its image set to `image`, preceded by the admin Secret.
pub fn fake_coderd_objects(
    repo: &Path,
    image: &str,
    admin_token: &str,
) -> anyhow::Result<Vec<DynamicObject>> {
    let mut objects = manifests::read_dir(&repo.join(FAKE_CODERD_DIR))?;
    set_container_image(&mut objects, FAKE_CODERD_NAME, image)?;
    for (container, _, _) in OTHER_FAKE_CODERDS {
        set_container_image(&mut objects, container, image)?;
    }
    // The token reaches the pod through its environment, read at start: a new token must roll
    // the pod (a reused cluster keeps the Deployment, and would keep the old token).
    let fingerprint = fake_coderd::fingerprint(admin_token);
    for deployment in objects.iter_mut().filter(|o| kind_of(o) == "Deployment") {
        let template = deployment
            .data
            .pointer_mut("/spec/template")
            .and_then(Value::as_object_mut)
            .context("the fake coderd Deployment has no pod template")?;
        let metadata = template.entry("metadata").or_insert_with(|| json!({}));
        metadata["annotations"][ADMIN_TOKEN_ANNOTATION] = Value::String(fingerprint.clone());
    }
    let secret: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": { "name": FAKE_CODERD_ADMIN_SECRET, "namespace": FAKE_CODERD_NAMESPACE },
        "type": "Opaque",
        "stringData": { FAKE_CODERD_ADMIN_SECRET_KEY: admin_token },
    }))
    .context("building the admin Secret")?;
    // Before the Deployment, so its pod starts with the Secret present.
    objects.insert(0, secret);
    Ok(objects)
}

/// Sets the image of the container named `container` in every Deployment holding one; fails
/// when no Deployment has it (a renamed container must not silently keep an old image).
pub fn set_container_image(
    objects: &mut [DynamicObject],
    container: &str,
    image: &str,
) -> anyhow::Result<()> {
    let mut found = false;
    for object in objects.iter_mut().filter(|o| kind_of(o) == "Deployment") {
        let containers = object
            .data
            .pointer_mut("/spec/template/spec/containers")
            .and_then(Value::as_array_mut);
        for candidate in containers.into_iter().flatten() {
            if candidate.get("name").and_then(Value::as_str) == Some(container) {
                candidate["image"] = Value::String(image.to_owned());
                found = true;
            }
        }
    }
    if !found {
        bail!("no Deployment has a container named {container:?}");
    }
    Ok(())
}

pub(crate) fn kind_of(object: &DynamicObject) -> &str {
    object
        .types
        .as_ref()
        .map(|t| t.kind.as_str())
        .unwrap_or_default()
}

/// All desired replicas are available, for the current generation.
pub fn deployment_available(deployment: &Deployment) -> bool {
    let desired = deployment
        .spec
        .as_ref()
        .and_then(|s| s.replicas)
        .unwrap_or(1);
    let Some(status) = &deployment.status else {
        return false;
    };
    let current = status.observed_generation >= deployment.metadata.generation;
    current
        && status.updated_replicas.unwrap_or(0) >= desired
        && status.available_replicas.unwrap_or(0) >= desired
}

/// Why the pods are not running, e.g. `fake-coderd-abc: ErrImageNeverPull (…)`.
pub fn pod_problems(pods: &[Pod]) -> Vec<String> {
    pods.iter()
        .flat_map(|pod| {
            let name = pod.metadata.name.clone().unwrap_or_default();
            let statuses = pod
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.clone())
                .unwrap_or_default();
            statuses.into_iter().filter_map(move |status| {
                let waiting = status.state.as_ref()?.waiting.as_ref()?;
                let reason = waiting
                    .reason
                    .clone()
                    .unwrap_or_else(|| "Waiting".to_owned());
                Some(match &waiting.message {
                    Some(message) => format!("{name}: {reason} ({message})"),
                    None => format!("{name}: {reason}"),
                })
            })
        })
        .collect()
}

pub(crate) async fn wait_deployment_available(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    deadline: Instant,
) -> anyhow::Result<()> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    loop {
        let deployment = deployments
            .get_opt(name)
            .await
            .with_context(|| format!("reading Deployment {namespace}/{name}"))?;
        if deployment.as_ref().is_some_and(deployment_available) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
            let selector = deployment
                .as_ref()
                .and_then(|d| d.spec.as_ref())
                .and_then(|s| s.selector.match_labels.clone())
                .map(|labels| label_selector(&labels))
                .unwrap_or_default();
            let problems = match pods.list(&ListParams::default().labels(&selector)).await {
                Ok(list) => pod_problems(&list.items).join("; "),
                Err(error) => format!("pods unreadable: {error}"),
            };
            bail!(
                "Deployment {namespace}/{name} not available before the deadline; pods: {problems}"
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

async fn wait_admin_answers(admin: &AdminClient, deadline: Instant) -> anyhow::Result<()> {
    loop {
        match admin.info().await {
            Ok(_) => return Ok(()),
            Err(error) if Instant::now() >= deadline => {
                return Err(error)
                    .context("the in-cluster fake coderd's admin API does not answer");
            }
            Err(_) => tokio::time::sleep(POLL).await,
        }
    }
}

/// `a=b,c=d` (sorted by key).
pub fn label_selector(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

// ---- port-forwarding ----

/// A loopback listener whose connections are forwarded to a port of a ready pod behind a
/// Service (the pod is looked up per connection, so a restarted pod is found again).
/// Stops when dropped.
pub struct PortForward {
    local: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl PortForward {
    /// Forwards `127.0.0.1:<free port>` to container port `port` of the Service's pods.
    pub async fn to_service(
        client: &kube::Client,
        namespace: &str,
        service: &str,
        port: u16,
    ) -> anyhow::Result<Self> {
        let services: Api<Service> = Api::namespaced(client.clone(), namespace);
        let found = services
            .get(service)
            .await
            .with_context(|| format!("reading Service {namespace}/{service}"))?;
        let selector = found
            .spec
            .and_then(|s| s.selector)
            .filter(|s| !s.is_empty())
            .map(|s| label_selector(&s))
            .ok_or_else(|| anyhow!("Service {namespace}/{service} has no pod selector"))?;
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding a loopback port for a port-forward")?;
        let local = listener
            .local_addr()
            .context("reading the port-forward's address")?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let target = format!("{namespace}/{service}:{port}");
        let task = tokio::spawn(async move {
            loop {
                let connection = match listener.accept().await {
                    Ok((connection, _)) => connection,
                    Err(error) => {
                        tracing::warn!(%target, %error, "port-forward stopped accepting connections");
                        return;
                    }
                };
                let (pods, selector, target) = (pods.clone(), selector.clone(), target.clone());
                tokio::spawn(async move {
                    if let Err(error) = forward(&pods, &selector, port, connection).await {
                        tracing::warn!(%target, error = format!("{error:#}"), "port-forwarded connection failed");
                    }
                });
            }
        });
        Ok(Self { local, task })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.local)
    }
}

impl Drop for PortForward {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn forward(
    pods: &Api<Pod>,
    selector: &str,
    port: u16,
    mut connection: TcpStream,
) -> anyhow::Result<()> {
    let list = pods
        .list(&ListParams::default().labels(selector))
        .await
        .context("listing pods")?;
    let pod = ready_pod(&list.items).with_context(|| format!("no ready pod matches {selector}"))?;
    let mut forwarder = pods
        .portforward(&pod, &[port])
        .await
        .with_context(|| format!("port-forward to pod {pod}"))?;
    let mut upstream = forwarder
        .take_stream(port)
        .context("the port-forward has no stream")?;
    // A peer closing its side ends the copy; errors after that are the usual connection resets.
    let _ = tokio::io::copy_bidirectional(&mut connection, &mut upstream).await;
    drop(upstream);
    forwarder.join().await.context("closing the port-forward")
}

/// Name of the first running pod whose `Ready` condition is true.
pub fn ready_pod(pods: &[Pod]) -> Option<String> {
    pods.iter()
        .find(|pod| {
            let status = pod.status.as_ref();
            pod.metadata.deletion_timestamp.is_none()
                && status.and_then(|s| s.phase.as_deref()) == Some("Running")
                && status
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .and_then(|pod| pod.metadata.name.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, phase: &str, ready: &str, deleting: bool) -> Pod {
        let mut value = json!({
            "metadata": { "name": name },
            "status": { "phase": phase, "conditions": [{ "type": "Ready", "status": ready }] },
        });
        if deleting {
            value["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        serde_json::from_value(value).expect("pod")
    }

    #[test]
    fn the_forward_targets_a_running_ready_pod_that_is_not_going_away() {
        let pods = [
            pod("pending", "Pending", "False", false),
            pod("terminating", "Running", "True", true),
            pod("unready", "Running", "False", false),
            pod("good", "Running", "True", false),
        ];
        assert_eq!(ready_pod(&pods).as_deref(), Some("good"));
        assert_eq!(ready_pod(&pods[..3]), None);
    }

    #[test]
    fn availability_needs_every_replica_of_the_current_generation() {
        let deployment = |generation: i64,
                          observed: i64,
                          updated: i32,
                          available: i32|
         -> Deployment {
            serde_json::from_value(json!({
                "metadata": { "name": "d", "generation": generation },
                "spec": { "replicas": 2, "selector": {}, "template": {} },
                "status": { "observedGeneration": observed, "updatedReplicas": updated, "availableReplicas": available },
            }))
            .expect("deployment")
        };
        assert!(deployment_available(&deployment(3, 3, 2, 2)));
        assert!(
            !deployment_available(&deployment(3, 2, 2, 2)),
            "old generation"
        );
        assert!(
            !deployment_available(&deployment(3, 3, 2, 1)),
            "one replica short"
        );
        assert!(
            !deployment_available(&deployment(3, 3, 1, 2)),
            "rollout not finished"
        );
    }

    #[test]
    fn waiting_containers_are_explained() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": { "name": "fake-1" },
            "status": { "containerStatuses": [
                { "name": "c", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                  "state": { "waiting": { "reason": "ErrImageNeverPull", "message": "image not present" } } },
                { "name": "d", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                  "state": { "running": {} } },
            ]},
        }))
        .expect("pod");
        assert_eq!(
            pod_problems(&[pod]),
            ["fake-1: ErrImageNeverPull (image not present)"]
        );
    }

    #[test]
    fn kind_commands_and_cluster_listing() {
        let args = |image: Option<&str>| -> Vec<String> {
            kind_create_args(
                "c1",
                Path::new("/r/config/kind/kind-config.yaml"),
                image,
                Duration::from_secs(300),
            )
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
        };
        assert_eq!(
            args(None),
            [
                "create",
                "cluster",
                "--name",
                "c1",
                "--config",
                "/r/config/kind/kind-config.yaml",
                "--wait",
                "300s",
                "--retain"
            ]
        );
        assert_eq!(
            args(Some("local/node:v1"))[6..9],
            ["--image", "local/node:v1", "--wait"]
        );
        assert!(cluster_listed(
            "kind\ncoder-conformance\n",
            "coder-conformance"
        ));
        assert!(!cluster_listed(
            "coder-conformance-2\n",
            "coder-conformance"
        ));
        assert!(!cluster_listed(
            "No kind clusters found.\n",
            "coder-conformance"
        ));
    }

    #[test]
    fn the_node_image_option_wins_over_the_environment_and_blank_means_none() {
        assert_eq!(
            requested_node_image(Some("a:1"), Some("b:2")).as_deref(),
            Some("a:1")
        );
        assert_eq!(
            requested_node_image(None, Some(" offline ")).as_deref(),
            Some(OFFLINE_NODE_IMAGE)
        );
        assert_eq!(requested_node_image(None, Some("")), None);
        assert_eq!(requested_node_image(None, None), None);
        assert_eq!(last_line("x\ntag:1\n\n"), Some("tag:1"));
    }

    #[test]
    fn kind_configs_must_pin_every_node_image() {
        let pinned = "kind: Cluster\napiVersion: kind.x-k8s.io/v1alpha4\nnodes:\n- role: control-plane\n  image: kindest/node:v1\n";
        assert_eq!(
            kind_node_images(pinned).expect("parses"),
            ["kindest/node:v1"]
        );
        let unpinned =
            "kind: Cluster\napiVersion: kind.x-k8s.io/v1alpha4\nnodes:\n- role: control-plane\n";
        assert!(
            kind_node_images(unpinned)
                .expect_err("no image")
                .to_string()
                .contains("node 1")
        );
        assert!(kind_node_images("apiVersion: v1\nkind: ConfigMap\n").is_err());
    }

    #[test]
    fn images_are_set_only_on_the_named_container() {
        let mut objects = manifests::parse_documents(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec:\n  template:\n    spec:\n      containers:\n      - {name: manager, image: old}\n      - {name: sidecar, image: keep}\n",
        )
        .expect("parse");
        set_container_image(&mut objects, "manager", "new:dev").expect("found");
        let containers = &objects[0].data["spec"]["template"]["spec"]["containers"];
        assert_eq!(containers[0]["image"], "new:dev");
        assert_eq!(containers[1]["image"], "keep");
        let error =
            set_container_image(&mut objects, "absent", "x").expect_err("no such container");
        assert!(error.to_string().contains("\"absent\""), "{error}");
    }

    #[test]
    fn selectors_and_service_urls() {
        let labels = BTreeMap::from([
            ("b".to_owned(), "2".to_owned()),
            ("a".to_owned(), "1".to_owned()),
        ]);
        assert_eq!(label_selector(&labels), "a=1,b=2");
        assert_eq!(
            service_url("fake-coderd", "coder-fake", 3000),
            "http://fake-coderd.coder-fake.svc:3000"
        );
    }
}
