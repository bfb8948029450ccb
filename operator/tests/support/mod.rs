//! Shared harness of the operator's integration tests: a local control plane (etcd +
//! kube-apiserver), the committed CRDs, the in-process fake coderd, a control plane object whose
//! status points at the fake, the operator binary started as a child process with a kubeconfig
//! for the ServiceAccount of `config/rbac/` only, and the simulated kubelet (contract D-8).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use conformance::cluster::local::{LocalControlPlane, LocalOptions};
use conformance::implementation::{
    OperatorCommand, OperatorProcess, OperatorUnderTest, REFERENCE_ARGS,
};
use conformance::kubelet::{ReadinessSimulator, WatchScope};
use fake_coderd::{FakeCoderd, JournalEntry};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use operator::api::{CoderControlPlane, CoderProvisioner};
use serde_json::json;
use tokio::sync::{Semaphore, SemaphorePermit};

pub const NAMESPACE: &str = "coder";
pub const CONTROL_PLANE: &str = "codercontrolplane-sample";
pub const TOKEN_SECRET: &str = "coder-operator-token";
pub const SAMPLE: &str = "coderprovisioner-sample";
/// Generous: two cores are shared by etcd, kube-apiserver, the operator and the test.
pub const EVENTUALLY: Duration = Duration::from_secs(90);
const POLL: Duration = Duration::from_millis(250);

/// Two local control planes at a time: each test starts its own (2.5 s, 1.2 s to stop) and then
/// mostly waits for the operator. On 2 cores the 13 tests took 132 s one at a time, 73 s two at a
/// time and 72 s three at a time. A tokio semaphore works across the tests' runtimes.
static PLANES: Semaphore = Semaphore::const_new(PLANES_AT_ONCE);
const PLANES_AT_ONCE: usize = 2;

/// How the operator under test is run.
pub struct Options {
    /// Appended to the reference command line (a repeated flag overrides the earlier one).
    pub extra_args: Vec<String>,
    pub rbac_dir: PathBuf,
    pub rust_log: String,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            extra_args: Vec::new(),
            rbac_dir: repo_path("config/rbac"),
            rust_log: "info".into(),
        }
    }
}

/// Just a local control plane (no CRDs, no operator), held exclusively.
pub struct Cluster {
    pub admin: kube::Client,
    pub cluster: LocalControlPlane,
    plane_permit: SemaphorePermit<'static>,
}

impl Cluster {
    pub async fn start() -> anyhow::Result<Self> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let plane_permit = PLANES.acquire().await.expect("never closed");
        let cluster = LocalControlPlane::start(LocalOptions {
            controller_manager: false,
            ..LocalOptions::default()
        })
        .await
        .context("starting the local control plane")?;
        let admin = cluster.admin_client().await?;
        Ok(Self {
            admin,
            cluster,
            plane_permit,
        })
    }
}

pub struct Harness {
    // Field order is drop order: operator and kubelet stop before the control plane. The
    // underscored fields are only held for their lifetime.
    _kubelet: ReadinessSimulator,
    pub operator: OperatorProcess,
    pub fake: FakeCoderd,
    pub admin: kube::Client,
    _cluster: LocalControlPlane,
    _plane_permit: SemaphorePermit<'static>,
}

pub fn repo_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(relative)
}

impl Harness {
    /// Everything up to a running operator watching [`NAMESPACE`], with the control plane object
    /// (and its operator-token Secret) in place.
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_with(Options::default()).await
    }

    pub async fn start_with(options: Options) -> anyhow::Result<Self> {
        let Cluster {
            cluster,
            admin,
            plane_permit,
        } = Cluster::start().await?;
        let crds = conformance::manifests::install_crds(&admin, &repo_path("config/crd")).await?;
        conformance::manifests::wait_crds_established(&admin, &crds, EVENTUALLY).await?;
        create_namespace(&admin, NAMESPACE).await?;

        let fake = FakeCoderd::start().await?;
        let token_secret = Secret {
            metadata: ObjectMeta {
                name: Some(TOKEN_SECRET.into()),
                ..ObjectMeta::default()
            },
            string_data: Some([("token".to_owned(), fake.operator_token())].into()),
            ..Secret::default()
        };
        Api::<Secret>::namespaced(admin.clone(), NAMESPACE)
            .create(&PostParams::default(), &token_secret)
            .await?;
        create_control_plane(&admin, &fake.url()).await?;

        let kubelet =
            ReadinessSimulator::for_local(&cluster, WatchScope::Namespaces(vec![NAMESPACE.into()]))
                .await?;
        let binary = env!("CARGO_BIN_EXE_coder-provisioner-operator");
        let argv = std::iter::once(binary)
            .chain(REFERENCE_ARGS)
            .chain(options.extra_args.iter().map(String::as_str));
        let command = OperatorCommand::from_argv(argv)?;
        let mut spec = OperatorUnderTest::new(command);
        spec.rbac_dir = options.rbac_dir;
        spec.watch_namespace = Some(NAMESPACE.into());
        spec.extra_env.push(("RUST_LOG".into(), options.rust_log));
        let operator = OperatorProcess::start(&admin, cluster.endpoint(), spec).await?;
        Ok(Self {
            _kubelet: kubelet,
            operator,
            fake,
            admin,
            _cluster: cluster,
            _plane_permit: plane_permit,
        })
    }

    pub fn provisioners(&self) -> Api<CoderProvisioner> {
        Api::namespaced(self.admin.clone(), NAMESPACE)
    }

    pub fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.admin.clone(), NAMESPACE)
    }

    /// Creates a CoderProvisioner from the sample's spec with `name` and extra spec fields.
    pub async fn create_provisioner(
        &self,
        name: &str,
        extra_spec: serde_json::Value,
    ) -> anyhow::Result<()> {
        let mut spec = json!({"controlPlaneRef": {"name": CONTROL_PLANE}, "replicas": 1, "tags": {"scope": "organization"}});
        if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra_spec.as_object()) {
            spec.extend(extra.clone());
        }
        let cr: CoderProvisioner = serde_json::from_value(json!({
            "apiVersion": "coder.com/v1alpha1", "kind": "CoderProvisioner",
            "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec,
        }))?;
        self.provisioners()
            .create(&PostParams::default(), &cr)
            .await?;
        Ok(())
    }

    /// Polls the CoderProvisioner `name` until `check` accepts it; the error shows the last state
    /// and the operator's log tail.
    pub async fn wait_for(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&CoderProvisioner) -> bool,
    ) -> anyhow::Result<CoderProvisioner> {
        let deadline = Instant::now() + EVENTUALLY;
        loop {
            let current = self.provisioners().get_opt(name).await?;
            if let Some(cr) = current.as_ref().filter(|cr| check(cr)) {
                return Ok(cr.clone());
            }
            if Instant::now() >= deadline {
                bail!(
                    "{name}: {what} not reached within {EVENTUALLY:?}\nlast status: {}\noperator log tail:\n{}",
                    serde_json::to_string_pretty(&current.map(|cr| cr.status)).unwrap_or_default(),
                    self.operator.log_tail(40)
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Polls until the CoderProvisioner `name` no longer exists.
    pub async fn wait_gone(&self, name: &str) -> anyhow::Result<()> {
        let deadline = Instant::now() + EVENTUALLY;
        while self.provisioners().get_opt(name).await?.is_some() {
            if Instant::now() >= deadline {
                bail!(
                    "{name} still exists after {EVENTUALLY:?}\noperator log tail:\n{}",
                    self.operator.log_tail(40)
                );
            }
            tokio::time::sleep(POLL).await;
        }
        Ok(())
    }

    /// Polls `probe` until it yields `Some`.
    pub async fn eventually<T, F, Fut>(&self, what: &str, mut probe: F) -> anyhow::Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = anyhow::Result<Option<T>>>,
    {
        let deadline = Instant::now() + EVENTUALLY;
        loop {
            if let Some(found) = probe().await? {
                return Ok(found);
            }
            if Instant::now() >= deadline {
                bail!(
                    "{what} not reached within {EVENTUALLY:?}\noperator log tail:\n{}",
                    self.operator.log_tail(40)
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The key plaintext stored in the provisioner's key Secret, if any.
    pub async fn key_plaintext(&self, provisioner: &str) -> anyhow::Result<Option<String>> {
        let secret = self
            .secrets()
            .get_opt(&format!("{provisioner}-provisioner-key"))
            .await?;
        Ok(secret
            .and_then(|s| s.data)
            .and_then(|mut data| data.remove("key"))
            .map(|bytes| String::from_utf8_lossy(&bytes.0).into_owned())
            .filter(|key| !key.is_empty()))
    }
}

/// Polls a local condition (no API calls) every 100 ms until it holds.
pub async fn until(what: &str, done: impl Fn() -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + EVENTUALLY;
    while !done() {
        if Instant::now() >= deadline {
            bail!("{what} not reached within {EVENTUALLY:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// The operator's `/healthz` `/readyz` `/metrics` base URL, from its (text) start-up log line.
pub fn metrics_url(log: &str) -> Option<String> {
    let start = log.rfind("metrics_addr=")? + "metrics_addr=".len();
    let addr = log[start..].split_whitespace().next()?;
    Some(format!("http://{addr}"))
}

/// The sum of every series of `name` (any labels) in a Prometheus text exposition.
pub fn metric_sum(exposition: &str, name: &str) -> f64 {
    exposition
        .lines()
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// Requests to the provisioner-key routes (list, create, delete), whatever their answer.
pub fn key_calls(journal: &[JournalEntry]) -> Vec<&JournalEntry> {
    journal
        .iter()
        .filter(|e| {
            matches!(
                e.route.as_deref(),
                Some(fake_coderd::routes::PROVISIONER_KEYS | fake_coderd::routes::DELETE_KEY)
            )
        })
        .collect()
}

/// `(status, reason)` of the condition `type_`.
pub fn condition(cr: &CoderProvisioner, type_: &str) -> Option<(String, String)> {
    cr.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

pub fn has_condition(cr: &CoderProvisioner, type_: &str, status: &str) -> bool {
    condition(cr, type_).is_some_and(|(s, _)| s == status)
}

pub fn phase(cr: &CoderProvisioner) -> Option<&str> {
    cr.status.as_ref()?.phase.as_deref()
}

pub async fn create_namespace(admin: &kube::Client, name: &str) -> anyhow::Result<()> {
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &namespace)
        .await?;
    Ok(())
}

/// The control plane as the control-plane operator would publish it: URL of the fake coderd,
/// operator access ready, token in [`TOKEN_SECRET`].
async fn create_control_plane(admin: &kube::Client, url: &str) -> anyhow::Result<()> {
    let api: Api<CoderControlPlane> = Api::namespaced(admin.clone(), NAMESPACE);
    let control_plane: CoderControlPlane = serde_json::from_value(json!({
        "apiVersion": "coder.com/v1alpha1", "kind": "CoderControlPlane",
        "metadata": {"name": CONTROL_PLANE, "namespace": NAMESPACE},
        "spec": {"image": "ghcr.io/coder/coder:latest"},
    }))?;
    api.create(&PostParams::default(), &control_plane).await?;
    let status = json!({"status": {
        "phase": "Ready", "url": url, "operatorAccessReady": true,
        "operatorTokenSecretRef": {"name": TOKEN_SECRET, "key": "token"},
    }});
    api.patch_status(
        CONTROL_PLANE,
        &PatchParams::default(),
        &Patch::Merge(&status),
    )
    .await?;
    Ok(())
}
