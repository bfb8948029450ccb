//! The local tier's stand-in for the ReplicaSet controller and the kubelet (contract D-8).
//!
//! A control plane without nodes never runs pods, so no Deployment would ever report ready
//! replicas and no CoderProvisioner could reach `phase: Ready`. [`ReadinessSimulator`] watches
//! Deployments and writes the status a healthy cluster would report once the pod template could
//! run: a container with an image and a command, the ServiceAccount it names, and the Secrets
//! its environment requires. A template that could not run gets zero ready replicas, as pods
//! stuck in `CreateContainerConfigError` would. The report must say readiness was simulated.
//!
//! It refuses to start on a cluster that has Nodes or lacks the marker ConfigMap written by
//! [`LocalControlPlane`]: on a real cluster the real
//! controllers own Deployment status.
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition, DeploymentStatus};
use k8s_openapi::api::core::v1::{
    ConfigMap, Node, PodTemplateSpec, ResourceQuota, Secret, ServiceAccount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::watcher;
use serde_json::json;

use crate::cluster::local::{LOCAL_MARKER, LocalControlPlane};

/// Re-evaluation period of blocked Deployments: picks up Secrets and ServiceAccounts that appear
/// after the Deployment. (Running pods do not stop when a Secret goes away, so ready Deployments
/// are only re-evaluated when they change.)
const RESYNC: Duration = Duration::from_secs(1);

/// Which Deployments the simulator looks after.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchScope {
    AllNamespaces,
    Namespaces(Vec<String>),
}

/// Background task writing Deployment status; stops on [`ReadinessSimulator::stop`] or drop.
pub struct ReadinessSimulator {
    task: tokio::task::JoinHandle<()>,
    patches: Arc<AtomicU64>,
}

impl ReadinessSimulator {
    /// Starts on the given local control plane with its admin identity.
    pub async fn for_local(cluster: &LocalControlPlane, scope: WatchScope) -> anyhow::Result<Self> {
        Self::start(cluster.admin_client().await?, scope).await
    }

    /// Starts with `client`, after checking that the cluster is a local control plane (marker
    /// ConfigMap present, no Nodes). The client needs Deployment status and Secret/ServiceAccount
    /// read rights.
    pub async fn start(client: kube::Client, scope: WatchScope) -> anyhow::Result<Self> {
        if scope == WatchScope::Namespaces(Vec::new()) {
            bail!("the readiness simulator needs at least one namespace to watch");
        }
        ensure_local(&client).await?;
        let patches = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(run(client, scope, Arc::clone(&patches)));
        Ok(Self { task, patches })
    }

    /// Number of status patches written so far.
    pub fn patches(&self) -> u64 {
        self.patches.load(Ordering::Relaxed)
    }

    pub fn is_running(&self) -> bool {
        !self.task.is_finished()
    }

    pub async fn stop(mut self) {
        self.task.abort();
        // Aborted (or already finished): either way there is nothing to report.
        let _ = (&mut self.task).await;
    }
}

impl Drop for ReadinessSimulator {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn ensure_local(client: &kube::Client) -> anyhow::Result<()> {
    let (namespace, name) = LOCAL_MARKER;
    let markers: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    if markers
        .get_opt(name)
        .await
        .context("looking for the local-control-plane marker")?
        .is_none()
    {
        bail!(
            "refusing to simulate Deployment readiness: ConfigMap {namespace}/{name} is missing, so \
             this is not a control plane started by the suite (real clusters have real kubelets)"
        );
    }
    let nodes: Api<Node> = Api::all(client.clone());
    let listed = nodes
        .list_metadata(&ListParams::default().limit(1))
        .await
        .context("listing Nodes")?;
    if !listed.items.is_empty() {
        bail!("refusing to simulate Deployment readiness: the cluster has Nodes that run pods");
    }
    Ok(())
}

type Key = (String, String);

/// Deployments looked at in parallel: one at a time paced a 1000-CR bench at ~9 Deployments/s
/// (each look is a few API reads and a patch), far below what the operator under test does.
const CONCURRENCY: u16 = 16;

struct Looker {
    client: kube::Client,
    patches: Arc<AtomicU64>,
}

/// kube-runtime's controller, one per watched scope: it looks at each Deployment when it
/// changes (never twice at once), and again after [`RESYNC`] while its pods could not start.
async fn run(client: kube::Client, scope: WatchScope, patches: Arc<AtomicU64>) {
    let apis: Vec<Api<Deployment>> = match &scope {
        WatchScope::AllNamespaces => vec![Api::all(client.clone())],
        WatchScope::Namespaces(namespaces) => namespaces
            .iter()
            .map(|ns| Api::namespaced(client.clone(), ns))
            .collect(),
    };
    let looker = Arc::new(Looker { client, patches });
    let controllers = apis.into_iter().map(|api| {
        Controller::new(api, watcher::Config::default())
            .with_config(controller::Config::default().concurrency(CONCURRENCY))
            .run(look, never_fails, Arc::clone(&looker))
            .boxed()
    });
    futures::stream::select_all(controllers)
        .for_each(|looked| async move {
            if let Err(e) = looked {
                tracing::debug!(error = %e, "readiness simulator watch error (retrying)");
            }
        })
        .await;
}

async fn look(deployment: Arc<Deployment>, looker: Arc<Looker>) -> Result<Action, Infallible> {
    Ok(
        match reconcile(&looker.client, &deployment, &looker.patches).await {
            Verdict::Runnable => Action::await_change(),
            Verdict::Blocked => Action::requeue(RESYNC),
        },
    )
}

fn never_fails(_: Arc<Deployment>, error: &Infallible, _: Arc<Looker>) -> Action {
    match *error {}
}

fn key_of(deployment: &Deployment) -> Option<Key> {
    Some((
        deployment.metadata.namespace.clone()?,
        deployment.metadata.name.clone()?,
    ))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    /// The status shows every replica ready; nothing to do until the Deployment changes.
    Runnable,
    /// Pods could not start (or the status could not be written yet): look again later.
    Blocked,
}

/// Writes the simulated status when it differs from what the Deployment reports.
async fn reconcile(client: &kube::Client, deployment: &Deployment, patches: &AtomicU64) -> Verdict {
    let Some((namespace, name)) = key_of(deployment) else {
        return Verdict::Runnable;
    };
    if deployment.metadata.deletion_timestamp.is_some() || all_pods_ready(deployment) {
        return Verdict::Runnable;
    }
    let problems = match runtime_problems(client, &namespace, deployment).await {
        Ok(problems) => problems,
        Err(e) => {
            tracing::debug!(%namespace, %name, error = %e, "readiness simulator lookup failed");
            return Verdict::Blocked;
        }
    };
    let verdict = if problems.is_empty() {
        Verdict::Runnable
    } else {
        Verdict::Blocked
    };
    // Only a runnable template starts pods, so only then can a quota cap them.
    let quota = if problems.is_empty() {
        pod_quota(client, &namespace).await
    } else {
        Ok(None)
    };
    let pod_quota = match quota {
        Ok(quota) => quota,
        Err(e) => {
            tracing::debug!(%namespace, %name, error = %e, "readiness simulator quota lookup failed");
            return Verdict::Blocked;
        }
    };
    let desired = simulated_status(deployment, &problems, pod_quota);
    if !status_differs(deployment.status.as_ref(), &desired) {
        return verdict;
    }
    let api: Api<Deployment> = Api::namespaced(client.clone(), &namespace);
    let patch = json!({ "status": desired });
    match api
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {
            patches.fetch_add(1, Ordering::Relaxed);
            verdict
        }
        Err(e) => {
            tracing::debug!(%namespace, %name, error = %e, "readiness simulator patch failed");
            Verdict::Blocked
        }
    }
}

/// Everything that would keep the pods of `deployment` from running, including what only the
/// API knows (missing ServiceAccount or Secrets).
async fn runtime_problems(
    client: &kube::Client,
    namespace: &str,
    deployment: &Deployment,
) -> anyhow::Result<Vec<String>> {
    let Some(template) = deployment.spec.as_ref().map(|s| &s.template) else {
        return Ok(vec!["the Deployment has no spec".to_owned()]);
    };
    let mut problems = template_problems(template);
    if let Some(account) = service_account_name(template) {
        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
        if accounts.get_opt(account).await?.is_none() {
            problems.push(format!("ServiceAccount {account} does not exist"));
        }
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    for reference in required_secret_keys(template) {
        let secret = secrets.get_opt(&reference.name).await?;
        let has_key = |s: &Secret| match &reference.key {
            None => true,
            Some(key) => {
                s.data.as_ref().is_some_and(|d| d.contains_key(key))
                    || s.string_data.as_ref().is_some_and(|d| d.contains_key(key))
            }
        };
        match (&secret, &reference.key) {
            (None, _) => problems.push(format!("Secret {} does not exist", reference.name)),
            (Some(s), Some(key)) if !has_key(s) => {
                problems.push(format!("Secret {} has no key {key}", reference.name));
            }
            _ => {}
        }
    }
    Ok(problems)
}

/// The fewest pods a ResourceQuota of the namespace allows (`pods` or `count/pods`): the
/// ReplicaSet controller could start no more (the suite's namespaces run no other pods).
async fn pod_quota(client: &kube::Client, namespace: &str) -> anyhow::Result<Option<i32>> {
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), namespace);
    let quotas = quotas.list(&ListParams::default()).await?;
    Ok(quotas
        .items
        .iter()
        .filter_map(|quota| quota.spec.as_ref()?.hard.as_ref())
        .flat_map(|hard| {
            ["pods", "count/pods"]
                .into_iter()
                .filter_map(|k| hard.get(k))
        })
        .filter_map(|limit| limit.0.parse::<i32>().ok())
        .min())
}

/// Why a pod template could not run, judged from the template alone (empty = it could): at least
/// one container, each with a non-blank image and a non-empty command whose first word is not
/// blank.
///
/// Requiring a command is stricter than Kubernetes (which falls back to the image entrypoint):
/// provisioner pods must run `coder` explicitly (R-POD-9), and the suite's stand-in has no image
/// to read an entrypoint from.
pub fn template_problems(template: &PodTemplateSpec) -> Vec<String> {
    let containers = template
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    if containers.is_empty() {
        return vec!["the pod template has no container".to_owned()];
    }
    let mut problems = Vec::new();
    for container in containers {
        if container
            .image
            .as_deref()
            .is_none_or(|i| i.trim().is_empty())
        {
            problems.push(format!("container {} has no image", container.name));
        }
        let command_ok = container
            .command
            .as_ref()
            .and_then(|c| c.first())
            .is_some_and(|program| !program.trim().is_empty());
        if !command_ok {
            problems.push(format!("container {} has no command", container.name));
        }
    }
    problems
}

/// A Secret (and optionally one of its keys) that a container needs to start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretNeed {
    pub name: String,
    /// `None` for `envFrom` (the whole Secret).
    pub key: Option<String>,
}

/// Secrets the containers need: non-optional `env[].valueFrom.secretKeyRef` and `envFrom[].secretRef`.
pub fn required_secret_keys(template: &PodTemplateSpec) -> Vec<SecretNeed> {
    let containers = template
        .spec
        .as_ref()
        .map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
        })
        .into_iter()
        .flatten();
    let mut needs = Vec::new();
    for container in containers {
        for var in container.env.iter().flatten() {
            if let Some(r) = var
                .value_from
                .as_ref()
                .and_then(|v| v.secret_key_ref.as_ref())
                && !r.optional.unwrap_or(false)
            {
                needs.push(SecretNeed {
                    name: r.name.clone(),
                    key: Some(r.key.clone()),
                });
            }
        }
        for source in container.env_from.iter().flatten() {
            if let Some(r) = source.secret_ref.as_ref()
                && !r.optional.unwrap_or(false)
            {
                needs.push(SecretNeed {
                    name: r.name.clone(),
                    key: None,
                });
            }
        }
    }
    needs
}

/// The ServiceAccount the pods run as, unless it is `default` (present in every real namespace).
fn service_account_name(template: &PodTemplateSpec) -> Option<&str> {
    template
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.as_deref())
        .filter(|name| !name.is_empty() && *name != "default")
}

/// Whether the status already reports every replica of this generation ready: its pods run, and
/// running pods do not stop when a Secret or quota changes, so there is nothing to look up (this
/// is also the echo of the simulator's own status patch).
fn all_pods_ready(deployment: &Deployment) -> bool {
    let desired = deployment
        .spec
        .as_ref()
        .and_then(|s| s.replicas)
        .unwrap_or(1);
    deployment.status.as_ref().is_some_and(|status| {
        status.observed_generation.is_some()
            && status.observed_generation == deployment.metadata.generation
            && status.replicas == Some(desired)
            && status.ready_replicas == Some(desired)
    })
}

/// The status the ReplicaSet controller and kubelets would produce: all replicas ready when the
/// template can run (`problems` empty), as many as `pod_quota` lets start, none otherwise.
pub fn simulated_status(
    deployment: &Deployment,
    problems: &[String],
    pod_quota: Option<i32>,
) -> DeploymentStatus {
    let desired = deployment
        .spec
        .as_ref()
        .and_then(|s| s.replicas)
        .unwrap_or(1);
    let runnable = problems.is_empty();
    let started = pod_quota.map_or(desired, |quota| desired.min(quota.max(0)));
    let ready = if runnable { started } else { 0 };
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let available = ready >= desired;
    let condition = |type_: &str, ok: bool, reason: &str, message: String| DeploymentCondition {
        type_: type_.to_owned(),
        status: if ok { "True" } else { "False" }.to_owned(),
        reason: Some(reason.to_owned()),
        message: Some(message),
        last_transition_time: Some(now.clone()),
        last_update_time: Some(now.clone()),
    };
    let available_condition = if available {
        condition(
            "Available",
            true,
            "MinimumReplicasAvailable",
            "Deployment has minimum availability (simulated by the conformance suite).".to_owned(),
        )
    } else {
        condition(
            "Available",
            false,
            "MinimumReplicasUnavailable",
            if runnable {
                format!(
                    "{started} of {desired} pods allowed by the namespace's pod quota (simulated)."
                )
            } else {
                format!("Pods cannot start (simulated): {}", problems.join("; "))
            },
        )
    };
    DeploymentStatus {
        observed_generation: deployment.metadata.generation,
        replicas: Some(desired),
        updated_replicas: Some(desired),
        ready_replicas: Some(ready),
        available_replicas: Some(ready),
        unavailable_replicas: (desired > ready).then_some(desired - ready),
        conditions: Some(vec![
            available_condition,
            condition(
                "Progressing",
                true,
                "NewReplicaSetAvailable",
                "Simulated by the conformance suite.".to_owned(),
            ),
        ]),
        ..Default::default()
    }
}

/// True when `current` differs from `desired` in anything but condition timestamps and messages.
pub fn status_differs(current: Option<&DeploymentStatus>, desired: &DeploymentStatus) -> bool {
    let Some(current) = current else { return true };
    let counts = |s: &DeploymentStatus| {
        (
            s.observed_generation,
            s.replicas.unwrap_or(0),
            s.updated_replicas.unwrap_or(0),
            s.ready_replicas.unwrap_or(0),
            s.available_replicas.unwrap_or(0),
            s.unavailable_replicas.unwrap_or(0),
        )
    };
    let conditions = |s: &DeploymentStatus| {
        let mut c: Vec<(String, String, Option<String>)> = s
            .conditions
            .iter()
            .flatten()
            .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone()))
            .collect();
        c.sort();
        c
    };
    counts(current) != counts(desired) || conditions(current) != conditions(desired)
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    fn deployment(yaml: &str) -> Deployment {
        serde_saphyr::from_str(yaml).expect("deployment fixture")
    }

    const VALID: &str = r#"
metadata: {name: provisioner-x, namespace: ns, generation: 3}
spec:
  replicas: 2
  selector: {matchLabels: {app: x}}
  template:
    metadata: {labels: {app: x}}
    spec:
      serviceAccountName: x-provisioner
      containers:
        - name: provisioner
          image: ghcr.io/coder/coder:latest
          command: [coder]
          args: [provisioner, start]
          env:
            - {name: CODER_URL, value: "http://coder"}
            - name: CODER_PROVISIONER_DAEMON_KEY
              valueFrom: {secretKeyRef: {name: x-provisioner-key, key: key}}
            - name: OPTIONAL
              valueFrom: {secretKeyRef: {name: maybe, key: k, optional: true}}
          envFrom:
            - secretRef: {name: whole}
"#;

    fn template(yaml: &str) -> PodTemplateSpec {
        deployment(yaml).spec.expect("spec").template
    }

    #[rstest]
    #[case::valid("", 0)]
    #[case::no_image("image: ghcr.io/coder/coder:latest", 1)]
    #[case::blank_command("command: [coder]", 1)]
    fn template_validity(#[case] remove: &str, #[case] expected_problems: usize) {
        let yaml = match remove {
            "" => VALID.to_owned(),
            "command: [coder]" => VALID.replace(remove, "command: [\" \"]"),
            other => VALID.replace(other, "image: \"\""),
        };
        assert_eq!(
            template_problems(&template(&yaml)).len(),
            expected_problems,
            "{yaml}"
        );
    }

    #[test]
    fn a_template_without_containers_or_command_cannot_run() {
        let empty = PodTemplateSpec::default();
        assert_eq!(
            template_problems(&empty),
            ["the pod template has no container"]
        );
        let no_command = template(&VALID.replace("          command: [coder]\n", ""));
        assert_eq!(
            template_problems(&no_command),
            ["container provisioner has no command"]
        );
    }

    #[test]
    fn required_secrets_skip_optional_references() {
        let needs = required_secret_keys(&template(VALID));
        assert_eq!(
            needs,
            [
                SecretNeed {
                    name: "x-provisioner-key".into(),
                    key: Some("key".into())
                },
                SecretNeed {
                    name: "whole".into(),
                    key: None
                },
            ]
        );
    }

    #[test]
    fn service_account_default_needs_no_lookup() {
        assert_eq!(
            service_account_name(&template(VALID)),
            Some("x-provisioner")
        );
        let default = template(&VALID.replace("x-provisioner\n", "default\n"));
        assert_eq!(service_account_name(&default), None);
    }

    #[test]
    fn runnable_deployments_report_every_replica_ready() {
        let status = simulated_status(&deployment(VALID), &[], None);
        assert_eq!(status.observed_generation, Some(3));
        assert_eq!(
            (
                status.replicas,
                status.ready_replicas,
                status.available_replicas,
                status.updated_replicas
            ),
            (Some(2), Some(2), Some(2), Some(2))
        );
        assert_eq!(status.unavailable_replicas, None);
        let available = &status.conditions.as_ref().expect("conditions")[0];
        assert_eq!(
            (available.type_.as_str(), available.status.as_str()),
            ("Available", "True")
        );
    }

    #[test]
    fn unrunnable_deployments_report_no_ready_replica() {
        let problems = vec!["Secret x does not exist".to_owned()];
        let status = simulated_status(&deployment(VALID), &problems, None);
        assert_eq!(
            (status.ready_replicas, status.unavailable_replicas),
            (Some(0), Some(2))
        );
        let available = &status.conditions.as_ref().expect("conditions")[0];
        assert_eq!(available.status, "False");
        assert!(
            available
                .message
                .as_deref()
                .unwrap_or_default()
                .contains("Secret x")
        );
    }

    #[test]
    fn a_pod_quota_caps_the_ready_replicas() {
        let mut three = deployment(VALID);
        three.spec.as_mut().expect("spec").replicas = Some(3);
        let status = simulated_status(&three, &[], Some(1));
        assert_eq!(
            (
                status.replicas,
                status.ready_replicas,
                status.unavailable_replicas
            ),
            (Some(3), Some(1), Some(2))
        );
        assert_eq!(
            simulated_status(&three, &[], Some(5)).ready_replicas,
            Some(3)
        );
    }

    #[test]
    fn replicas_default_to_one_and_zero_is_available() {
        let unset = deployment(&VALID.replace("  replicas: 2\n", ""));
        assert_eq!(simulated_status(&unset, &[], None).ready_replicas, Some(1));
        let zero = deployment(&VALID.replace("replicas: 2", "replicas: 0"));
        let status = simulated_status(&zero, &["anything".to_owned()], None);
        assert_eq!(status.ready_replicas, Some(0));
        assert_eq!(status.conditions.expect("conditions")[0].status, "True");
    }

    #[test]
    fn only_a_status_with_every_replica_of_this_generation_ready_needs_no_look() {
        let mut d = deployment(VALID);
        d.metadata.generation = Some(4);
        assert!(!all_pods_ready(&d), "no status yet");
        d.status = Some(simulated_status(&d, &[], None));
        assert!(all_pods_ready(&d));
        d.metadata.generation = Some(5);
        assert!(!all_pods_ready(&d), "a new generation is looked at");
        d.status = Some(simulated_status(&d, &[], Some(1)));
        assert!(
            !all_pods_ready(&d),
            "pods held back by a quota are looked at again"
        );
        d.status = Some(simulated_status(&d, &["no Secret".to_owned()], None));
        assert!(
            !all_pods_ready(&d),
            "pods that could not start are looked at again"
        );
    }

    #[test]
    fn only_a_change_in_counts_generation_or_conditions_needs_a_patch() {
        let d = deployment(VALID);
        let desired = simulated_status(&d, &[], None);
        assert!(status_differs(None, &desired));
        let later = simulated_status(&d, &[], None);
        assert!(
            !status_differs(Some(&later), &desired),
            "timestamps alone do not count"
        );
        let mut rotated = d.clone();
        rotated.metadata.generation = Some(4);
        assert!(status_differs(
            Some(&desired),
            &simulated_status(&rotated, &[], None)
        ));
        let scaled = deployment(&VALID.replace("replicas: 2", "replicas: 3"));
        assert!(status_differs(
            Some(&desired),
            &simulated_status(&scaled, &[], None)
        ));
    }
}
