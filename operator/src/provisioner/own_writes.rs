//! The operator's own writes, remembered so that their watch events start no pass.
//!
//! Every object a pass writes (a child, the key Secret, the CR's status) comes back through the
//! watches as an event carrying the resourceVersion the write produced: an echo. The pass that
//! wrote it already decided from what it says, so a pass it started would find nothing to do.
//! Dropping echoes (and only them: another writer's change carries another resourceVersion)
//! lets every other trigger start its pass at once, instead of a debounce delaying them all.
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use kube::api::ObjectMeta;

/// Entries are removed when their echo arrives; writes whose echo never comes (an apply that
/// changed nothing, an object deleted first) are forgotten once this many are held.
const MAX_REMEMBERED: usize = 100_000;

/// uid → the resourceVersion of this operator's last write of that object.
#[derive(Clone, Debug, Default)]
pub struct OwnWrites(Arc<Mutex<HashMap<String, String>>>);

impl OwnWrites {
    /// Remembers `written`, the object as a write of this operator returned it.
    pub fn record(&self, written: &ObjectMeta) {
        let (Some(uid), Some(version)) = (&written.uid, &written.resource_version) else {
            return;
        };
        let mut writes = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if writes.len() >= MAX_REMEMBERED {
            writes.clear();
        }
        writes.insert(uid.clone(), version.clone());
    }

    /// Whether `observed` (from a watch event) is the echo of this operator's last write of the
    /// object; an echo is forgotten once seen.
    pub fn is_echo(&self, observed: &ObjectMeta) -> bool {
        let (Some(uid), Some(version)) = (&observed.uid, &observed.resource_version) else {
            return false;
        };
        let mut writes = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if writes.get(uid) == Some(version) {
            writes.remove(uid);
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(uid: &str, version: &str) -> ObjectMeta {
        ObjectMeta {
            uid: Some(uid.to_owned()),
            resource_version: Some(version.to_owned()),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn only_the_version_this_operator_wrote_is_an_echo_and_only_once() {
        let own = OwnWrites::default();
        own.record(&meta("a", "5"));
        assert!(
            !own.is_echo(&meta("a", "4")),
            "an older event is not the echo"
        );
        assert!(!own.is_echo(&meta("b", "5")), "another object is not");
        assert!(own.is_echo(&meta("a", "5")));
        assert!(!own.is_echo(&meta("a", "5")), "seen once");
        assert!(
            !own.is_echo(&meta("a", "6")),
            "someone else's later write is not"
        );
    }

    #[test]
    fn metadata_without_uid_or_version_is_never_an_echo() {
        let own = OwnWrites::default();
        own.record(&ObjectMeta::default());
        assert!(!own.is_echo(&ObjectMeta::default()));
    }
}
