//! The kube-runtime `Controller` for CoderProvisioner: watches, triggers and readiness.
//!
//! Triggers (contract §13):
//! * the CR itself;
//! * owned children (Deployment, Secret, ServiceAccount, Role, RoleBinding), selected by the
//!   `app.kubernetes.io/managed-by` label the operator puts on them and mapped by ownerReference;
//! * CoderControlPlanes, mapped through the controller's own CR store to every provisioner in
//!   the namespace that references them (R-W-1), without a list call per event;
//! * credential Secrets: Secrets labelled `coder.com/credential=true`, mapped through the store
//!   to every provisioner whose `extraEnv` names them (R-CRED-11). A label selector is enough
//!   for the transitions that can make `CredentialsReady` True: adding the label makes the
//!   Secret enter the watched set (an ADDED event) and removing it a DELETED event. Edits to a
//!   Secret that still lacks the label cannot make the check pass; the reconciler re-checks
//!   every `CREDENTIALS_RETRY` while the condition is False, which also refreshes its message.
//!   Watching every Secret in the cluster instead would cache all Secret data in memory.
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{Controller, controller, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tracing::{info, warn};

use crate::api::{
    CREDENTIAL_LABEL, CoderControlPlane, CoderProvisioner, LABEL_MANAGED_BY, MANAGED_BY,
};
use crate::coderd::{ClientOptions, Connector, WriteGuard};
use crate::provisioner::backoff::{AttemptCounters, HoldOff};
use crate::provisioner::coderd_slots::CoderdSlots;
use crate::provisioner::credentials::credential_refs;
use crate::provisioner::entitlement_cache::EntitlementCache;
use crate::provisioner::gates::ENTITLEMENT_WINDOW;
use crate::provisioner::names::Names;
use crate::provisioner::{Context, error_policy, reconcile};
use crate::runtime::leader::Fence;
use crate::runtime::metrics::Metrics;
use crate::seeded::{self, Bug};

/// Name under which the operator reports Events and applies objects by default.
pub const CONTROLLER_NAME: &str = "coder-provisioner-operator";

/// Set once the controller's CR cache is filled; cheap to clone (for `/readyz`).
#[derive(Clone, Debug, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    fn mark_ready(&self) {
        self.0.store(true, Ordering::Release);
    }
}

#[derive(Clone, Debug)]
pub struct ControllerSettings {
    /// Namespace to watch; `None` watches all namespaces.
    pub namespace: Option<String>,
    /// Whole-request timeout of coderd calls.
    pub coderd_timeout: Duration,
    /// Reconciles running at the same time (at least 1).
    pub max_concurrent_reconciles: u16,
    /// Server-side apply field manager of children and status.
    pub field_manager: String,
}

impl Default for ControllerSettings {
    fn default() -> Self {
        Self {
            namespace: None,
            coderd_timeout: Duration::from_secs(30),
            max_concurrent_reconciles: 32,
            field_manager: CONTROLLER_NAME.to_owned(),
        }
    }
}

fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope> + DeserializeOwned,
    K::DynamicType: Default,
{
    match namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    }
}

/// Provisioners in the store that reference the control plane `control_plane`.
fn referencing_control_plane(
    store: &Store<CoderProvisioner>,
    control_plane: &CoderControlPlane,
) -> Vec<ObjectRef<CoderProvisioner>> {
    let namespace = control_plane.namespace();
    let name = control_plane.name_any();
    store
        .state_filter(|cr| cr.namespace() == namespace && cr.spec.control_plane_ref.name == name)
        .iter()
        .map(|cr| ObjectRef::from_obj(cr.as_ref()))
        .collect()
}

/// Provisioners in the store whose `extraEnv` names the Secret `secret`.
fn referencing_secret(
    store: &Store<CoderProvisioner>,
    secret: &Secret,
) -> Vec<ObjectRef<CoderProvisioner>> {
    let namespace = secret.namespace();
    let name = secret.name_any();
    store
        .state_filter(|cr| {
            cr.namespace() == namespace && {
                let names = Names::for_provisioner(cr);
                credential_refs(
                    cr.spec.extra_env.as_deref().unwrap_or_default(),
                    &names.key_secret,
                )
                .iter()
                .any(|credential| credential.secret == name)
            }
        })
        .iter()
        .map(|cr| ObjectRef::from_obj(cr.as_ref()))
        .collect()
}

/// Runs the controller until `shutdown` resolves (then finishes running reconciles and returns).
/// `readiness` turns ready once the CoderProvisioner cache is filled (for `/readyz`); `fence`
/// guards every key change of this run (see [`Fence`]).
pub async fn run(
    client: Client,
    settings: ControllerSettings,
    metrics: Arc<Metrics>,
    readiness: Readiness,
    shutdown: impl Future<Output = ()> + Send + 'static,
    fence: Fence,
) -> anyhow::Result<()> {
    let namespace = settings.namespace.as_deref();
    let provisioners: Api<CoderProvisioner> = api(&client, namespace);
    let owned = watcher::Config::default().labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY}"));
    let credentials = watcher::Config::default().labels(&format!("{CREDENTIAL_LABEL}=true"));

    let controller = Controller::new(provisioners, watcher::Config::default())
        .with_config(controller::Config::default().concurrency(settings.max_concurrent_reconciles));
    let store = controller.store();
    let ready_store = store.clone();
    tokio::spawn(async move {
        // The store's readiness signal wakes only one waiter (the controller's own runner also
        // waits on it), so re-poll with a short timeout instead of awaiting once.
        loop {
            match tokio::time::timeout(Duration::from_millis(250), ready_store.wait_until_ready())
                .await
            {
                Ok(Ok(())) => break readiness.mark_ready(),
                Ok(Err(_writer_dropped)) => break,
                Err(_still_waiting) => {}
            }
        }
    });

    let control_plane_store = store.clone();
    let control_plane_writer = (client.clone(), settings.field_manager.clone());
    let secret_store = store.clone();
    let context = Arc::new(Context {
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: CONTROLLER_NAME.to_owned(),
                instance: None,
            },
        ),
        client: client.clone(),
        field_manager: settings.field_manager.clone(),
        coderd: Connector::new(ClientOptions {
            timeout: settings.coderd_timeout,
            metrics: Some(metrics.clone()),
            write_guard: (!seeded::active(Bug::PausedLeaderUnfenced)).then(|| {
                let fence = fence.clone();
                WriteGuard::new(move || {
                    let fence = fence.clone();
                    async move { fence.check().await.map_err(|error| error.to_string()) }
                })
            }),
        })?,
        metrics,
        rate_limits: AttemptCounters::default(),
        failures: AttemptCounters::default(),
        key_hold_off: HoldOff::default(),
        entitlements: EntitlementCache::new(ENTITLEMENT_WINDOW),
        // Half the reconcile slots per coderd: a hanging one leaves the other half to the rest.
        coderd_slots: CoderdSlots::new(usize::from(settings.max_concurrent_reconciles) / 2),
        fence,
    });
    // `graceful_shutdown_on` needs a `Sync` future; relay the caller's signal through a channel.
    let (shutdown_tx, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        shutdown.await;
        let _ = shutdown_tx.send(());
    });
    info!(
        namespace = namespace.unwrap_or("<all>"),
        "starting CoderProvisioner controller"
    );
    controller
        .owns(api::<Deployment>(&client, namespace), owned.clone())
        .owns(api::<Secret>(&client, namespace), owned.clone())
        .owns(api::<ServiceAccount>(&client, namespace), owned.clone())
        .owns(api::<Role>(&client, namespace), owned.clone())
        .owns(api::<RoleBinding>(&client, namespace), owned)
        .watches(
            api::<CoderControlPlane>(&client, namespace),
            watcher::Config::default(),
            move |control_plane| {
                if seeded::active(Bug::ControlPlaneStatusRewritten) {
                    let (client, field_manager) = &control_plane_writer;
                    seeded::rewrite_control_plane_status(client, &control_plane, field_manager);
                }
                referencing_control_plane(&control_plane_store, &control_plane)
            },
        )
        .watches(
            api::<Secret>(&client, namespace),
            credentials,
            move |secret| referencing_secret(&secret_store, &secret),
        )
        .graceful_shutdown_on(shutdown_rx.map(|_| ()))
        .run(reconcile, error_policy, context)
        .for_each(|outcome| async move {
            match outcome {
                Ok((object, action)) => tracing::debug!(%object, ?action, "reconciled"),
                // A trigger for an object deleted meanwhile (R-W-3): nothing to do.
                Err(kube::runtime::controller::Error::ObjectNotFound(object)) => {
                    tracing::debug!(%object, "object is gone; nothing to reconcile")
                }
                // Already logged with its backoff by the error policy.
                Err(kube::runtime::controller::Error::ReconcilerFailed(error, object)) => {
                    tracing::debug!(%object, %error, "reconcile failed")
                }
                Err(error) => warn!(%error, "controller error"),
            }
        })
        .await;
    info!("CoderProvisioner controller stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::reflector;
    use kube::runtime::watcher::Event;

    fn provisioner(
        namespace: &str,
        name: &str,
        control_plane: &str,
        credential: Option<&str>,
    ) -> CoderProvisioner {
        let mut value = serde_json::json!({
            "apiVersion": "coder.com/v1alpha1", "kind": "CoderProvisioner",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"controlPlaneRef": {"name": control_plane}},
        });
        if let Some(secret) = credential {
            value["spec"]["extraEnv"] = serde_json::json!([{"name": "P", "valueFrom": {"secretKeyRef": {"name": secret, "key": "k"}}}]);
        }
        serde_json::from_value(value).expect("valid CR")
    }

    fn store_with(objects: Vec<CoderProvisioner>) -> Store<CoderProvisioner> {
        let (reader, mut writer) = reflector::store();
        writer.apply_watcher_event(&Event::Init);
        for object in objects {
            writer.apply_watcher_event(&Event::InitApply(object));
        }
        writer.apply_watcher_event(&Event::InitDone);
        reader
    }

    fn names(mut refs: Vec<ObjectRef<CoderProvisioner>>) -> Vec<String> {
        refs.sort_by(|a, b| a.name.cmp(&b.name));
        refs.into_iter()
            .map(|r| format!("{}/{}", r.namespace.unwrap_or_default(), r.name))
            .collect()
    }

    #[test]
    fn control_plane_change_maps_to_its_provisioners_in_the_same_namespace() {
        let store = store_with(vec![
            provisioner("coder", "a", "cp", None),
            provisioner("coder", "b", "cp", None),
            provisioner("coder", "c", "other", None),
            provisioner("elsewhere", "d", "cp", None),
        ]);
        let control_plane: CoderControlPlane = serde_json::from_value(serde_json::json!({
            "apiVersion": "coder.com/v1alpha1", "kind": "CoderControlPlane",
            "metadata": {"name": "cp", "namespace": "coder"}, "spec": {}
        }))
        .expect("valid control plane");
        assert_eq!(
            names(referencing_control_plane(&store, &control_plane)),
            ["coder/a", "coder/b"]
        );
    }

    #[test]
    fn credential_secret_change_maps_to_the_provisioners_that_name_it() {
        let store = store_with(vec![
            provisioner("coder", "a", "cp", Some("proxy")),
            provisioner("coder", "b", "cp", Some("other")),
            provisioner("elsewhere", "c", "cp", Some("proxy")),
            provisioner("coder", "d", "cp", None),
        ]);
        let mut secret = Secret::default();
        secret.metadata.name = Some("proxy".into());
        secret.metadata.namespace = Some("coder".into());
        assert_eq!(names(referencing_secret(&store, &secret)), ["coder/a"]);
    }

    #[test]
    fn readiness_starts_unready() {
        let readiness = Readiness::default();
        assert!(!readiness.is_ready());
        readiness.clone().mark_ready();
        assert!(readiness.is_ready());
    }
}
