//! A watch on the scenario's namespace for the whole scenario, so that the checks that hold in
//! every observation see every observation, not only those a step happened to poll: every
//! version of every CoderProvisioner goes through the status-shape checks and the oracle's
//! per-observation checks, and every value any Secret ever held is remembered for the leak
//! check (a key Secret garbage-collected before the end of a clean-up scenario included).
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use serde_json::Value;

use crate::crd_resources::provisioner_resource;

/// What the watch saw during the scenario.
#[derive(Debug, Default)]
pub struct Recorded {
    /// Findings of the per-observation checks, each naming its CR and rule, with the
    /// resourceVersion they were made on (see [`Recorded::violations`]).
    findings: BTreeSet<(String, String)>,
    /// Every value any Secret of the namespace held (for the leak check; never printed).
    pub secret_values: BTreeSet<String>,
    /// CoderProvisioners deleted during the scenario (their keys may rightly stay in coderd).
    pub deleted_provisioners: BTreeSet<String>,
    /// Every CoderProvisioner seen (by uid: one made again under its name is another), and when
    /// the watch first saw each one being deleted.
    pub seen_provisioners: BTreeSet<String>,
    pub deletion_seen: std::collections::BTreeMap<String, jiff::Timestamp>,
    /// Whether the last version of a CR seen before its deletion was settled.
    settled_when_deleted: bool,
    last_settled: bool,
    /// Versions of a CR the suite itself wrote (a status it edited on purpose): not checked.
    pub suite_versions: BTreeSet<String>,
    /// CR observations seen, so a report can say the watch ran.
    pub observations: usize,
    /// Whether a CR showed `ProvisionerKeyReady=False` with reason `RateLimited`.
    pub rate_limited_seen: bool,
}

/// The running watch; stopped when dropped.
pub struct Recorder {
    recorded: Arc<Mutex<Recorded>>,
    task: tokio::task::AbortHandle,
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Recorder {
    /// Starts watching CoderProvisioners and Secrets in `namespace`.
    pub fn start(client: kube::Client, namespace: &str) -> Recorder {
        let recorded = Arc::new(Mutex::new(Recorded::default()));
        let provisioners: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), namespace, &provisioner_resource());
        let secrets: Api<Secret> = Api::namespaced(client, namespace);
        let sink = Arc::clone(&recorded);
        let crs = watcher::watcher(provisioners, watcher::Config::default())
            .default_backoff()
            .map_ok(Seen::Provisioner);
        let values = watcher::watcher(secrets, watcher::Config::default())
            .default_backoff()
            .map_ok(Seen::Secret);
        let task = tokio::spawn(async move {
            let mut both = futures::stream::select(Box::pin(crs), Box::pin(values));
            while let Some(seen) = both.next().await {
                // A watch error is retried with backoff by the stream itself.
                if let Ok(seen) = seen {
                    sink.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .record(seen);
                }
            }
        })
        .abort_handle();
        Recorder { recorded, task }
    }

    /// Reads what was recorded so far.
    pub fn read<T>(&self, read: impl FnOnce(&Recorded) -> T) -> T {
        read(&self.recorded.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Marks a CR version the suite wrote itself, so its (deliberately odd) status is not judged.
    pub fn suite_wrote(&self, resource_version: Option<String>) {
        if let Some(version) = resource_version {
            self.recorded
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .suite_versions
                .insert(version);
        }
    }
}

enum Seen {
    Provisioner(Event<DynamicObject>),
    Secret(Event<Secret>),
}

impl Recorded {
    fn record(&mut self, seen: Seen) {
        match seen {
            Seen::Provisioner(Event::Apply(cr) | Event::InitApply(cr)) => self.provisioner(&cr),
            Seen::Provisioner(Event::Delete(cr)) => {
                self.provisioner(&cr);
                self.deleted_provisioners
                    .insert(cr.metadata.name.unwrap_or_default());
            }
            Seen::Secret(
                Event::Apply(secret) | Event::InitApply(secret) | Event::Delete(secret),
            ) => {
                for value in secret.data.into_iter().flatten().map(|(_, v)| v.0) {
                    if let Ok(text) = String::from_utf8(value) {
                        self.secret_values.insert(text);
                    }
                }
            }
            Seen::Provisioner(Event::Init | Event::InitDone)
            | Seen::Secret(Event::Init | Event::InitDone) => {}
        }
    }

    /// The findings, but not those on a version the suite wrote itself (its answer may come
    /// after the watch event of that version).
    pub fn violations(&self) -> BTreeSet<String> {
        self.findings
            .iter()
            .filter(|(version, _)| !self.suite_versions.contains(version))
            .map(|(_, finding)| finding.clone())
            .collect()
    }

    /// When the watch first saw the scenario's CR being deleted, if the scenario had one CR and
    /// it was settled just before (so no pass of the live CR was still under way).
    pub fn only_cr_deleted_at(&self) -> Option<jiff::Timestamp> {
        if self.seen_provisioners.len() != 1 || !self.settled_when_deleted {
            return None;
        }
        self.deletion_seen.values().next().copied()
    }

    fn provisioner(&mut self, cr: &DynamicObject) {
        self.observations += 1;
        let uid = cr.metadata.uid.clone().unwrap_or_default();
        let Ok(json) = serde_json::to_value(cr) else {
            return;
        };
        if cr.metadata.deletion_timestamp.is_some() {
            if !self.deletion_seen.contains_key(&uid) {
                self.settled_when_deleted = self.last_settled;
            }
            self.deletion_seen
                .entry(uid.clone())
                .or_insert_with(jiff::Timestamp::now);
        } else {
            self.last_settled = super::oracle::settled(&json);
        }
        self.rate_limited_seen |= super::oracle::shows_rate_limited(&json);
        self.seen_provisioners.insert(uid);
        let name = cr.metadata.name.clone().unwrap_or_default();
        let version = cr.metadata.resource_version.clone().unwrap_or_default();
        self.findings
            .extend(observation_checks(&json).into_iter().map(|finding| {
                (
                    version.clone(),
                    format!("CoderProvisioner {name}: {finding}"),
                )
            }));
    }
}

/// Everything that must hold in any single observation of a CR.
pub fn observation_checks(cr: &Value) -> Vec<String> {
    let mut found = super::status_shape::provisioner_invariants(cr);
    found.extend(super::oracle::observation_findings(cr));
    found
}
