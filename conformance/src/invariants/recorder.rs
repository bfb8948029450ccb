//! A watch on the scenario's namespace for the whole scenario, so that the checks see every
//! version, not only those a step happened to poll. D-15 decides which version a rule judges:
//! * every version of every CoderProvisioner goes through the rules that hold at all times (the
//!   status's shape: R-ST-1, R-ST-9, R-CRD-12);
//! * a version whose generation and status then stood unchanged for the tier's window is a
//!   settled state, held to the oracle's settled-state checks (R-ST-2/5, and R-KEY-6, R-SEC-6,
//!   R-ST-8 against its spec); the versions between two settled states are not (D-13);
//! * every value any Secret ever held is remembered for the leak check (a key Secret
//!   garbage-collected before the end of a clean-up scenario included).
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use serde_json::Value;

use crate::crd_resources::provisioner_resource;

/// What the watch saw during the scenario.
#[derive(Debug)]
pub struct Recorded {
    /// Findings, each naming its CR and rule, with the resourceVersion they were made on (see
    /// [`Recorded::violations`]).
    findings: BTreeSet<(String, String)>,
    /// Each live CR's latest version (by uid) and since when it has stood (D-15).
    standing: BTreeMap<String, Standing>,
    /// How long a version must stand to be a settled state: the tier's window.
    settle_window: Duration,
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
    /// Every `False` condition any version of a CR showed: (CR name, type, reason).
    pub false_conditions: BTreeSet<(String, String, String)>,
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
    /// Starts watching CoderProvisioners and Secrets in `namespace`; a CR version that stands
    /// for `settle_window` is a settled state.
    pub fn start(client: kube::Client, namespace: &str, settle_window: Duration) -> Recorder {
        let recorded = Arc::new(Mutex::new(Recorded::new(settle_window)));
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

    /// How long the CR `name` has stood in the state `fingerprint`
    /// ([`super::oracle::state_fingerprint`]), if that is the latest state the watch saw.
    pub fn stood(&self, name: &str, fingerprint: &str) -> Option<Duration> {
        self.read(|recorded| {
            recorded
                .standing
                .values()
                .find(|s| s.name == name && s.fingerprint == fingerprint)
                .map(|s| s.since.elapsed())
        })
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

/// A CR version, and since when its generation and status have stood as they are.
#[derive(Debug)]
struct Standing {
    name: String,
    cr: Value,
    resource_version: String,
    fingerprint: String,
    since: Instant,
}

impl Standing {
    /// The settled-state findings of this version if it stood for `window` by `now` (D-15).
    fn findings_if_settled(&self, window: Duration, now: Instant) -> Vec<(String, String)> {
        let stood = now.saturating_duration_since(self.since);
        if stood < window {
            return Vec::new();
        }
        super::oracle::settled_state_findings(&self.cr)
            .into_iter()
            .map(|finding| {
                (
                    self.resource_version.clone(),
                    format!(
                        "CoderProvisioner {} (settled: its status stood {:.0} s): {finding}",
                        self.name,
                        stood.as_secs_f64()
                    ),
                )
            })
            .collect()
    }
}

impl Recorded {
    fn new(settle_window: Duration) -> Self {
        Recorded {
            findings: BTreeSet::new(),
            standing: BTreeMap::new(),
            settle_window,
            secret_values: BTreeSet::new(),
            deleted_provisioners: BTreeSet::new(),
            seen_provisioners: BTreeSet::new(),
            deletion_seen: BTreeMap::new(),
            settled_when_deleted: false,
            last_settled: false,
            suite_versions: BTreeSet::new(),
            observations: 0,
            rate_limited_seen: false,
            false_conditions: BTreeSet::new(),
        }
    }

    fn record(&mut self, seen: Seen) {
        match seen {
            Seen::Provisioner(Event::Apply(cr) | Event::InitApply(cr)) => self.provisioner(&cr),
            Seen::Provisioner(Event::Delete(cr)) => {
                self.provisioner(&cr);
                // Its last state stood until now, and stands no longer.
                let gone = self
                    .standing
                    .remove(cr.metadata.uid.as_deref().unwrap_or_default());
                if let Some(gone) = gone {
                    let found = gone.findings_if_settled(self.settle_window, Instant::now());
                    self.findings.extend(found);
                }
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

    /// The findings, those of the CRs' latest versions that have stood for the window by now
    /// included, but not those on a version the suite wrote itself (its answer may come after
    /// the watch event of that version).
    pub fn violations(&self) -> BTreeSet<String> {
        let now = Instant::now();
        let latest = self
            .standing
            .values()
            .flat_map(|standing| standing.findings_if_settled(self.settle_window, now));
        self.findings
            .iter()
            .cloned()
            .chain(latest)
            .filter(|(version, _)| !self.suite_versions.contains(version))
            .map(|(_, finding)| finding)
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
        let name = cr.metadata.name.clone().unwrap_or_default();
        let version = cr.metadata.resource_version.clone().unwrap_or_default();
        let now = Instant::now();
        // The version that stood until now ends here: judged if it stood long enough.
        let replaced = match self.standing.get(&uid) {
            Some(standing)
                if standing.fingerprint == super::oracle::state_fingerprint(&json)
                    && cr.metadata.deletion_timestamp.is_none() =>
            {
                None
            }
            _ => self.standing.remove(&uid),
        };
        if let Some(replaced) = replaced {
            let found = replaced.findings_if_settled(self.settle_window, now);
            self.findings.extend(found);
        }
        if cr.metadata.deletion_timestamp.is_some() {
            // A CR being deleted is held to its clean-up, not to its spec.
            if !self.deletion_seen.contains_key(&uid) {
                self.settled_when_deleted = self.last_settled;
            }
            self.deletion_seen
                .entry(uid.clone())
                .or_insert_with(jiff::Timestamp::now);
        } else {
            self.last_settled = super::oracle::ready_for_its_spec(&json);
            self.standing
                .entry(uid.clone())
                .or_insert_with(|| Standing {
                    name: name.clone(),
                    cr: json.clone(),
                    resource_version: version.clone(),
                    fingerprint: super::oracle::state_fingerprint(&json),
                    since: now,
                });
        }
        self.rate_limited_seen |= super::oracle::shows_rate_limited(&json);
        let text = |condition: &Value, key: &str| {
            condition
                .get(key)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        self.false_conditions.extend(
            json.pointer("/status/conditions")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter(|c| c.get("status").and_then(Value::as_str) == Some("False"))
                .map(|c| (name.clone(), text(c, "type"), text(c, "reason"))),
        );
        self.seen_provisioners.insert(uid);
        self.findings.extend(
            super::status_shape::provisioner_invariants(&json)
                .into_iter()
                .map(|finding| {
                    (
                        version.clone(),
                        format!("CoderProvisioner {name}: {finding}"),
                    )
                }),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settled_cr() -> DynamicObject {
        let all: Value = serde_saphyr::from_str(include_str!("oracle/settled.yaml")).expect("YAML");
        let mut cr = all["cr"].clone();
        cr["metadata"]["resourceVersion"] = Value::from("1");
        serde_json::from_value(cr).expect("a CoderProvisioner")
    }

    /// D-15: the combined legal variants' case, the old key record for a moment under the new
    /// generation, then the status the new spec asks for.
    fn a_moment_of_the_old_record_then_the_new_one(window: Duration) -> BTreeSet<String> {
        let mut recorded = Recorded::new(window);
        let mut between = settled_cr();
        between.data["status"]["tagsHash"] = Value::from("00000000");
        between.metadata.resource_version = Some("2".to_owned());
        recorded.record(Seen::Provisioner(Event::Apply(between)));
        let mut settled = settled_cr();
        settled.metadata.resource_version = Some("3".to_owned());
        recorded.record(Seen::Provisioner(Event::Apply(settled)));
        recorded.violations()
    }

    #[test]
    fn a_status_between_two_settled_states_is_not_judged() {
        assert_eq!(
            a_moment_of_the_old_record_then_the_new_one(Duration::from_secs(3600)),
            BTreeSet::new()
        );
    }

    #[test]
    fn a_status_that_stood_for_the_window_is_judged() {
        let found = a_moment_of_the_old_record_then_the_new_one(Duration::ZERO);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found.iter().all(|f| f.ends_with("(R-ST-8)")), "{found:?}");
    }

    #[test]
    fn a_shape_the_contract_never_allows_is_judged_on_every_version() {
        let mut recorded = Recorded::new(Duration::from_secs(3600));
        let mut odd = settled_cr();
        odd.data["status"]["phase"] = Value::from("Running");
        recorded.record(Seen::Provisioner(Event::Apply(odd)));
        recorded.record(Seen::Provisioner(Event::Apply(settled_cr())));
        let found = recorded.violations();
        assert!(found.iter().any(|f| f.ends_with("(R-ST-1)")), "{found:?}");
    }
}
