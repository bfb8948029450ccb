//! A watch on every CoderProvisioner: when each one was first seen `Ready`, and how often any of
//! them changed (resourceVersion) after it was first seen.
use std::collections::HashMap;
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
    if ready && entry.first_ready.is_none() {
        entry.first_ready = Some(Instant::now());
    }
}
