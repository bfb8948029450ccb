//! The kube-runtime `Controller` for CoderProvisioner: watches, triggers and readiness.
//!
//! Triggers (contract §13), each starting its pass at once (no debounce): the events that would
//! only echo this operator's own writes are dropped ([`OwnWrites`]), so a pass's writes start no
//! follow-up pass, and triggers that arrive while a CR's pass runs start one pass after it:
//! * the CR itself, when something a pass reads of it changes ([`trigger_predicate`]): other
//!   writers' labels and annotations start no pass;
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
use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{ObjectMeta, PartialObjectMeta};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, Predicate, WatchStreamExt, controller, predicates, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tracing::{info, warn};

use crate::api::{
    CREDENTIAL_LABEL, CoderControlPlane, CoderProvisioner, LABEL_MANAGED_BY, MANAGED_BY,
};
use crate::coderd::{ClientOptions, Connector, WriteGuard};
use crate::fence::Fence;
use crate::metrics::Metrics;
use crate::provisioner::{
    AttemptCounters, CoderdSlots, Context, ENTITLEMENT_WINDOW, EntitlementCache, HoldOff, Names,
    OwnWrites, credential_refs, error_policy, reconcile,
};

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

/// What a pass reads of its own CR, as a kube-runtime predicate: an event whose hash equals the
/// last one seen for that CR (kube-runtime keys it by namespace, name and uid, so a re-created
/// namesake always passes) starts no pass. It covers the spec (through `metadata.generation`),
/// the finalizers, the deletion mark and the status, so that a status edited by someone else is
/// corrected; the operator's own status writes, made only on change, cost one extra pass each.
/// Labels, annotations, managedFields and ownerReferences of the CR are never read by a pass.
fn trigger_predicate() -> impl Predicate<CoderProvisioner> {
    predicates::generation
        .combine(predicates::finalizers)
        .combine(|cr: &CoderProvisioner| {
            Some(hash(&cr.metadata.deletion_timestamp.as_ref().map(|t| t.0)))
        })
        .combine(|cr: &CoderProvisioner| {
            // The stored form: the status has no `Hash`, and equal statuses serialize equally.
            Some(hash(&serde_json::to_vec(&cr.status).unwrap_or_default()))
        })
}

/// Metadata events of one kind of child, without this operator's own writes (their echoes).
fn owned_triggers<K>(
    client: &Client,
    namespace: Option<&str>,
    config: &watcher::Config,
    own_writes: &OwnWrites,
) -> impl Stream<Item = Result<PartialObjectMeta<K>, watcher::Error>> + Send + 'static
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static,
{
    let own_writes = own_writes.clone();
    watcher(
        api::<PartialObjectMeta<K>>(client, namespace),
        config.clone(),
    )
    .touched_objects()
    .filter(move |event| not_an_echo::<K>(&own_writes, event.as_ref().ok().map(|o| &o.metadata)))
}

/// Whether a watch event of a `K` is not the echo of this operator's own write (errors are not).
fn not_an_echo<K: Resource<DynamicType = ()>>(
    own_writes: &OwnWrites,
    observed: Option<&ObjectMeta>,
) -> impl Future<Output = bool> + Send + use<K> {
    let own_writes = own_writes.clone();
    let observed = observed.cloned();
    async move {
        match observed {
            Some(meta) => !own_writes.is_echo::<K>(&meta).await,
            None => true,
        }
    }
}

fn hash(value: &impl std::hash::Hash) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    BuildHasherDefault::<DefaultHasher>::default().hash_one(value)
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

    // The store sees every event (the mappers and readiness read it); only the triggers are
    // filtered. Watch errors pass the filter to the controller's own trigger backoff, as with
    // `Controller::new`.
    let (store, writer) = reflector::store();
    let events = watcher(provisioners, watcher::Config::default())
        // No pass reads the cached CR's managedFields (each reads its CR live), and they are
        // a large part of what the cache would hold.
        .modify(|cr| cr.managed_fields_mut().clear())
        .reflect(writer)
        .applied_objects();
    let own_writes = OwnWrites::default();
    let triggers = {
        let own_writes = own_writes.clone();
        events
            .predicate_filter(trigger_predicate(), Default::default())
            // After the predicate, which must see the echo to know the status it carries.
            .filter(move |event| {
                not_an_echo::<CoderProvisioner>(
                    &own_writes,
                    event.as_ref().ok().map(|cr| &cr.metadata),
                )
            })
    };
    // kube-runtime's runner, at its concurrency limit, parks the triggers that come due in a
    // set and starts them in no particular order: under a steady stream of triggers one CR can
    // wait behind newer ones for as long as they keep coming (35 s seen with one worker). So the
    // runner starts every pass at once, and passes wait in line for one of the
    // `max_concurrent_reconciles` permits of a fair semaphore: first due, first run.
    let config = controller::Config::default();
    let workers = Arc::new(tokio::sync::Semaphore::new(usize::from(
        settings.max_concurrent_reconciles,
    )));
    let controller = Controller::for_stream(triggers, store.clone()).with_config(config);
    let ready_store = store.clone();
    let store_at_stop = store.clone();
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
    let secret_store = store.clone();
    // Half the reconcile slots per coderd: a hanging one leaves the other half to the rest.
    let (coderd_slots, woken_for_a_coderd_slot) =
        CoderdSlots::new(usize::from(settings.max_concurrent_reconciles) / 2);
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
            write_guard: Some({
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
        coderd_slots,
        fence,
        own_writes: own_writes.clone(),
    });
    // `graceful_shutdown_on` needs a `Sync` future; relay the caller's signal through a channel.
    // kube-runtime lets the runner drain only once the cache is filled, and the shutdown stops
    // the watch that fills it: a stop before the first list completed would hang until the
    // process is killed. No pass starts before then, so such a stop ends the run at once. (One
    // poll of the readiness signal: a filled cache answers at once, and an unfilled one means
    // the runner is abandoned anyway, so taking its wake-up does no harm.)
    let (shutdown_tx, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
    let (unready_stop_tx, unready_stop_rx) = tokio::sync::oneshot::channel::<()>();
    let workers_at_stop = workers.clone();
    tokio::spawn(async move {
        shutdown.await;
        // The passes still in line give up (the next leader's first list starts them again);
        // the running ones finish.
        workers_at_stop.close();
        if store_at_stop.wait_until_ready().now_or_never().is_none() {
            let _ = unready_stop_tx.send(());
        }
        let _ = shutdown_tx.send(());
    });
    info!(
        namespace = namespace.unwrap_or("<all>"),
        "starting CoderProvisioner controller"
    );
    let running = controller
        .owns_stream(owned_triggers::<Deployment>(
            &client,
            namespace,
            &owned,
            &own_writes,
        ))
        .owns_stream(owned_triggers::<Secret>(
            &client,
            namespace,
            &owned,
            &own_writes,
        ))
        .owns_stream(owned_triggers::<ServiceAccount>(
            &client,
            namespace,
            &owned,
            &own_writes,
        ))
        .owns_stream(owned_triggers::<Role>(
            &client,
            namespace,
            &owned,
            &own_writes,
        ))
        .owns_stream(owned_triggers::<RoleBinding>(
            &client,
            namespace,
            &owned,
            &own_writes,
        ))
        .watches(
            api::<CoderControlPlane>(&client, namespace),
            watcher::Config::default(),
            move |control_plane| referencing_control_plane(&control_plane_store, &control_plane),
        )
        .watches(
            api::<Secret>(&client, namespace),
            credentials,
            move |secret| referencing_secret(&secret_store, &secret),
        )
        .reconcile_on(woken_for_a_coderd_slot)
        .graceful_shutdown_on(shutdown_rx.map(|_| ()))
        .run(
            move |cr, ctx| {
                let workers = workers.clone();
                async move {
                    match workers.acquire_owned().await {
                        // Boxed: in line, a pass holds a pointer, not the pass's whole state.
                        Ok(_worker) => Box::pin(reconcile(cr, ctx)).await,
                        Err(_stopping) => Ok(controller::Action::await_change()),
                    }
                }
            },
            error_policy,
            context,
        )
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
        });
    tokio::select! {
        () = running => {}
        Ok(()) = unready_stop_rx => info!("stopped before the cache was filled; no pass had started"),
    }
    info!("CoderProvisioner controller stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
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

    /// A Ready-looking CR as a watch delivers it: uid, generation, finalizer, status.
    fn watched() -> CoderProvisioner {
        let mut cr = provisioner("coder", "a", "cp", None);
        cr.metadata.uid = Some("uid-1".into());
        cr.metadata.generation = Some(1);
        cr.metadata.resource_version = Some("100".into());
        cr.metadata.finalizers = Some(vec!["coder.com/provisioner-key-cleanup".into()]);
        cr.status = Some(serde_json::from_value(serde_json::json!({"phase": "Ready"})).unwrap());
        cr
    }

    /// Whether `edit`, applied to [`watched`] after a first event of it, starts a pass, through
    /// the filter the controller uses.
    fn triggers(edit: Edit) -> bool {
        let before = watched();
        let mut after = before.clone();
        after.metadata.resource_version = Some("101".into());
        edit(&mut after);
        let events = futures::stream::iter([Ok(before), Ok(after)])
            .predicate_filter(trigger_predicate(), Default::default());
        let passed: Vec<_> = futures::executor::block_on(events.collect());
        passed.len() == 2
    }

    type Edit = fn(&mut CoderProvisioner);

    #[test]
    fn edits_a_pass_reads_start_a_pass() {
        let edits: [(&str, Edit); 7] = [
            ("spec", |cr| cr.metadata.generation = Some(2)),
            ("finalizer removed", |cr| cr.metadata.finalizers = None),
            ("finalizer added", |cr| {
                cr.finalizers_mut().push("other".into());
            }),
            ("deletion mark", |cr| {
                let time = "2026-01-01T00:00:00Z".parse().expect("timestamp");
                cr.metadata.deletion_timestamp = Some(Time(time));
            }),
            ("status by someone else", |cr| {
                cr.status.get_or_insert_default().phase = Some("Pending".into());
            }),
            ("status removed", |cr| cr.status = None),
            ("re-created namesake", |cr| {
                cr.metadata.uid = Some("uid-2".into())
            }),
        ];
        for (name, edit) in edits {
            assert!(triggers(edit), "{name} must start a pass");
        }
    }

    #[test]
    fn edits_no_pass_reads_start_none() {
        let edits: [(&str, Edit); 5] = [
            ("annotation", |cr| {
                cr.annotations_mut().insert("writer".into(), "1".into());
            }),
            ("label", |cr| {
                cr.labels_mut().insert("team".into(), "a".into());
            }),
            ("resourceVersion alone", |_| {}),
            ("managedFields", |cr| {
                cr.metadata.managed_fields = Some(vec![Default::default()]);
            }),
            ("ownerReferences", |cr| {
                cr.metadata.owner_references = Some(vec![Default::default()]);
            }),
        ];
        for (name, edit) in edits {
            assert!(!triggers(edit), "{name} must not start a pass");
        }
    }

    #[test]
    fn readiness_starts_unready() {
        let readiness = Readiness::default();
        assert!(!readiness.is_ready());
        readiness.clone().mark_ready();
        assert!(readiness.is_ready());
    }
}
