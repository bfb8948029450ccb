//! A watch on every CoderProvisioner: when each one was first seen `Ready`, and how often any of
//! them changed (resourceVersion) after it was first seen.
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use futures::StreamExt as _;
use kube::api::{Api, DynamicObject};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};

use crate::crd_resources::provisioner_resource;

/// (namespace, name)
pub type Key = (String, String);

#[derive(Default)]
struct Observed {
    resource_version: String,
    ready: bool,
    first_ready: Option<Instant>,
    /// Its first condition that is not `True` (`Type=Status Reason`), or that it has none.
    showing: String,
}

#[derive(Default)]
struct State {
    synced: bool,
    objects: HashMap<Key, Observed>,
    /// resourceVersion changes of objects already known.
    modifications: u64,
}

/// Background watch; stops when dropped.
pub struct ProvisionerWatch {
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl ProvisionerWatch {
    pub fn start(client: kube::Client) -> Self {
        let state = Arc::new(Mutex::new(State::default()));
        let api: Api<DynamicObject> = Api::all_with(client, &provisioner_resource());
        let shared = Arc::clone(&state);
        let task = tokio::spawn(async move {
            let mut events = watcher::watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(event) = events.next().await {
                match event {
                    Ok(Event::Apply(object) | Event::InitApply(object)) => {
                        observe(&shared, &object)
                    }
                    Ok(Event::Delete(object)) => {
                        if let Some(key) = key_of(&object) {
                            lock(&shared).objects.remove(&key);
                        }
                    }
                    Ok(Event::InitDone) => lock(&shared).synced = true,
                    Ok(Event::Init) => {}
                    Err(e) => {
                        tracing::debug!(error = %e, "CoderProvisioner watch error (retrying)")
                    }
                }
            }
        });
        Self { state, task }
    }

    pub fn is_synced(&self) -> bool {
        lock(&self.state).synced
    }

    pub fn is_running(&self) -> bool {
        !self.task.is_finished()
    }

    /// How many of `keys` have been seen Ready at least once.
    pub fn ever_ready(&self, keys: &[Key]) -> usize {
        let state = lock(&self.state);
        keys.iter()
            .filter(|k| {
                state
                    .objects
                    .get(*k)
                    .is_some_and(|o| o.first_ready.is_some())
            })
            .count()
    }

    /// How many CoderProvisioners are Ready now.
    pub fn ready_now(&self) -> usize {
        lock(&self.state)
            .objects
            .values()
            .filter(|o| o.ready)
            .count()
    }

    pub fn first_ready(&self, key: &Key) -> Option<Instant> {
        lock(&self.state)
            .objects
            .get(key)
            .and_then(|o| o.first_ready)
    }

    pub fn modifications(&self) -> u64 {
        lock(&self.state).modifications
    }

    /// Of `keys` not Ready now: how many show each first not-`True` condition (or no status).
    pub fn not_ready(&self, keys: &[Key]) -> BTreeMap<String, usize> {
        let state = lock(&self.state);
        let mut counted = BTreeMap::new();
        for key in keys {
            let showing = match state.objects.get(key) {
                Some(observed) if observed.ready => continue,
                Some(observed) => observed.showing.clone(),
                None => "not seen".to_owned(),
            };
            *counted.entry(showing).or_default() += 1;
        }
        counted
    }
}

impl Drop for ProvisionerWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // A poisoned lock only means a panic elsewhere; the counters are still meaningful.
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

fn key_of(object: &DynamicObject) -> Option<Key> {
    Some((
        object.metadata.namespace.clone()?,
        object.metadata.name.clone()?,
    ))
}

fn observe(state: &Mutex<State>, object: &DynamicObject) {
    let Some(key) = key_of(object) else { return };
    let resource_version = object.metadata.resource_version.clone().unwrap_or_default();
    let ready = object
        .data
        .pointer("/status/phase")
        .and_then(|p| p.as_str())
        == Some("Ready");
    let showing = showing(&object.data);
    let mut state = lock(state);
    let changed = match state.objects.get(&key) {
        Some(known) => known.resource_version != resource_version,
        None => false,
    };
    if changed {
        state.modifications += 1;
    }
    let entry = state.objects.entry(key).or_default();
    entry.resource_version = resource_version;
    entry.ready = ready;
    entry.showing = showing;
    if ready && entry.first_ready.is_none() {
        entry.first_ready = Some(Instant::now());
    }
}

/// What keeps a CR from Ready as its status says: its first condition that is not `True`.
fn showing(object: &serde_json::Value) -> String {
    let Some(conditions) = object
        .pointer("/status/conditions")
        .and_then(|c| c.as_array())
    else {
        return "no status conditions".to_owned();
    };
    let text = |c: &serde_json::Value, field: &str| {
        c.get(field)
            .and_then(|v| v.as_str())
            .unwrap_or("?")
            .to_owned()
    };
    conditions
        .iter()
        .find(|c| c.get("status").and_then(|v| v.as_str()) != Some("True"))
        .map_or_else(
            || "every condition True, phase not Ready".to_owned(),
            |c| {
                format!(
                    "{}={} {}",
                    text(c, "type"),
                    text(c, "status"),
                    text(c, "reason")
                )
            },
        )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn a_cr_shows_its_first_condition_that_is_not_true() {
        let object = json!({"status": {"conditions": [
            {"type": "ControlPlaneReady", "status": "True", "reason": "ControlPlaneAvailable"},
            {"type": "OperatorAccessReady", "status": "False", "reason": "OperatorTokenSecretUnavailable"},
        ]}});
        assert_eq!(
            super::showing(&object),
            "OperatorAccessReady=False OperatorTokenSecretUnavailable"
        );
        assert_eq!(super::showing(&json!({})), "no status conditions");
    }
}
