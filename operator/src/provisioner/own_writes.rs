//! The operator's own writes, remembered so that their watch events start no pass.
//!
//! Every object a pass writes (a child, the key Secret, the CR's status) comes back through the
//! watches as an event carrying the resourceVersion the write produced: an echo. The pass that
//! wrote it already decided from what it says, so a pass it started would find nothing to do.
//! Dropping echoes (and only them: another writer's change carries another resourceVersion)
//! lets every other trigger start its pass at once, instead of a debounce delaying them all.
//!
//! An echo can arrive before the write's response does (the watch and the response travel
//! separately), so a write is marked while it is under way, and an event for that object waits
//! for the write to end before it is judged. A write made of several requests (a create, then
//! the move of its fields to the operator's apply) has an echo per request: the last few
//! versions written are remembered.
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use kube::Resource;
use kube::api::ObjectMeta;
use tokio::sync::watch;

/// Entries are removed when their echo arrives; writes whose echo never comes (an apply that
/// changed nothing, an object deleted first) are forgotten once this many are held.
const MAX_REMEMBERED: usize = 100_000;

/// How long an event waits for a write under way; past it the event counts as someone else's.
const LONGEST_WAIT: Duration = Duration::from_secs(5);

/// Versions remembered per object: the requests of one write, and an older one whose echo is due.
const VERSIONS_PER_OBJECT: usize = 4;

/// kind/namespace/name: a created object has no uid before its write returns.
type ObjectKey = String;

#[derive(Debug)]
enum Entry {
    /// A write is under way; the sender is dropped when it ends. `earlier`: the versions written
    /// before it whose echoes have not come yet.
    Writing {
        id: u64,
        ended: watch::Receiver<()>,
        earlier: Vec<String>,
    },
    /// The resourceVersions this operator's last writes produced, whose echoes have not come.
    Written(Vec<String>),
}

#[derive(Debug, Default)]
struct Writes {
    entries: HashMap<ObjectKey, Entry>,
    next_id: u64,
}

#[derive(Clone, Debug, Default)]
pub struct OwnWrites(Arc<Mutex<Writes>>);

impl OwnWrites {
    /// Runs `write` (a write of `object`, returning what the API server stored) and remembers
    /// the resourceVersion it produced; events for the object wait while it runs.
    pub async fn track<K, W>(&self, object: &K, write: W) -> kube::Result<K>
    where
        K: Resource<DynamicType = ()>,
        W: Future<Output = kube::Result<K>>,
    {
        let key = key_of::<K>(object.meta());
        let (ended, receiver) = watch::channel(());
        let id = {
            let mut writes = self.lock();
            if writes.entries.len() >= MAX_REMEMBERED {
                writes.entries.clear();
            }
            writes.next_id += 1;
            let id = writes.next_id;
            let earlier = match writes.entries.remove(&key) {
                Some(
                    Entry::Written(versions)
                    | Entry::Writing {
                        earlier: versions, ..
                    },
                ) => versions,
                None => Vec::new(),
            };
            let entry = Entry::Writing {
                id,
                ended: receiver,
                earlier,
            };
            writes.entries.insert(key.clone(), entry);
            id
        };
        let written = write.await;
        {
            let mut writes = self.lock();
            if let Some(Entry::Writing { id: i, earlier, .. }) = writes.entries.get_mut(&key)
                && *i == id
            {
                let mut versions = std::mem::take(earlier);
                versions.extend(
                    written
                        .as_ref()
                        .ok()
                        .and_then(|w| w.meta().resource_version.clone()),
                );
                let excess = versions.len().saturating_sub(VERSIONS_PER_OBJECT);
                versions.drain(..excess);
                if versions.is_empty() {
                    writes.entries.remove(&key);
                } else {
                    writes.entries.insert(key, Entry::Written(versions));
                }
            }
        }
        drop(ended);
        written
    }

    /// Whether `observed` (a `K` from a watch event) is the echo of this operator's last write
    /// of the object; an echo is forgotten once seen.
    pub async fn is_echo<K: Resource<DynamicType = ()>>(&self, observed: &ObjectMeta) -> bool {
        let Some(version) = &observed.resource_version else {
            return false;
        };
        let key = key_of::<K>(observed);
        loop {
            let mut ended = {
                let mut writes = self.lock();
                match writes.entries.get_mut(&key) {
                    None => return false,
                    Some(Entry::Written(written)) => {
                        let Some(at) = written.iter().position(|w| w == version) else {
                            return false;
                        };
                        written.remove(at);
                        if written.is_empty() {
                            writes.entries.remove(&key);
                        }
                        return true;
                    }
                    Some(Entry::Writing { ended, .. }) => ended.clone(),
                }
            };
            // Resolves (with an error) when the write's sender is dropped.
            if tokio::time::timeout(LONGEST_WAIT, ended.changed())
                .await
                .is_err()
            {
                return false;
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Writes> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn key_of<K: Resource<DynamicType = ()>>(meta: &ObjectMeta) -> ObjectKey {
    format!(
        "{}/{}/{}",
        K::kind(&()),
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};

    use super::*;

    fn secret(name: &str, version: Option<&str>) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some("ns".to_owned()),
                resource_version: version.map(str::to_owned),
                ..ObjectMeta::default()
            },
            ..Secret::default()
        }
    }

    async fn written(own: &OwnWrites, name: &str, version: &str) {
        let stored = secret(name, Some(version));
        own.track(&secret(name, None), async { Ok(stored) })
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn only_the_version_this_operator_wrote_is_an_echo_and_only_once() {
        let own = OwnWrites::default();
        written(&own, "a", "5").await;
        let event = |name, version| secret(name, Some(version)).metadata;
        assert!(
            !own.is_echo::<Secret>(&event("a", "4")).await,
            "an older event is not the echo"
        );
        assert!(
            !own.is_echo::<Secret>(&event("b", "5")).await,
            "another object is not"
        );
        assert!(
            !own.is_echo::<ConfigMap>(&event("a", "5")).await,
            "another kind is not"
        );
        assert!(own.is_echo::<Secret>(&event("a", "5")).await);
        assert!(!own.is_echo::<Secret>(&event("a", "5")).await, "seen once");
        assert!(
            !own.is_echo::<Secret>(&event("a", "6")).await,
            "someone else's later write is not"
        );
    }

    #[tokio::test]
    async fn each_request_of_a_write_and_an_earlier_write_have_their_echo() {
        let own = OwnWrites::default();
        written(&own, "a", "3").await;
        written(&own, "a", "5").await;
        written(&own, "a", "6").await;
        let event = |version| secret("a", Some(version)).metadata;
        assert!(own.is_echo::<Secret>(&event("5")).await);
        assert!(own.is_echo::<Secret>(&event("3")).await);
        assert!(own.is_echo::<Secret>(&event("6")).await);
        assert!(!own.is_echo::<Secret>(&event("6")).await, "seen once");
        for version in 10..20 {
            written(&own, "a", &version.to_string()).await;
        }
        assert!(
            !own.is_echo::<Secret>(&event("10")).await,
            "only the last few are remembered"
        );
        assert!(own.is_echo::<Secret>(&event("19")).await);
    }

    #[tokio::test]
    async fn an_echo_that_arrives_before_the_response_waits_for_it() {
        let own = OwnWrites::default();
        let (respond, response) = tokio::sync::oneshot::channel::<()>();
        let writing = {
            let own = own.clone();
            tokio::spawn(async move {
                own.track(&secret("a", None), async {
                    response.await.unwrap();
                    Ok(secret("a", Some("7")))
                })
                .await
            })
        };
        tokio::task::yield_now().await;
        let judged = {
            let own = own.clone();
            tokio::spawn(async move {
                own.is_echo::<Secret>(&secret("a", Some("7")).metadata)
                    .await
            })
        };
        tokio::task::yield_now().await;
        assert!(!judged.is_finished(), "the event waits for the write");
        respond.send(()).unwrap();
        writing.await.unwrap().unwrap();
        assert!(judged.await.unwrap());
    }

    #[tokio::test]
    async fn a_failed_write_leaves_nothing_to_match() {
        let own = OwnWrites::default();
        let refused: kube::Result<Secret> = Err(kube::Error::LinesCodecMaxLineLengthExceeded);
        assert!(
            own.track(&secret("a", None), async { refused })
                .await
                .is_err()
        );
        assert!(
            !own.is_echo::<Secret>(&secret("a", Some("1")).metadata)
                .await
        );
    }

    #[tokio::test]
    async fn metadata_without_a_version_is_never_an_echo() {
        let own = OwnWrites::default();
        written(&own, "a", "5").await;
        assert!(!own.is_echo::<Secret>(&secret("a", None).metadata).await);
    }
}
