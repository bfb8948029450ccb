//! The controller's cache of CRs lags behind the operator's own status writes. A pass triggered by
//! the first of a pass's two writes (the key record, R-KEY-7, then the final status) often starts
//! before the second has come back through the watch, and under load a pass can start before
//! either has. Taking that older copy for the truth writes the same status again and, worse,
//! misses a key recorded moments ago and establishes another one: the key churn of the PR this
//! project grew from.
//!
//! The ledger keeps, per CR, the status the operator last wrote and the resourceVersions that
//! write superseded. A pass that starts from one of those versions uses the written status; a
//! pass that sees the written version (or any other, e.g. after someone else's change) uses the
//! cached copy and drops the entry. resourceVersions are only compared for equality.
use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use crate::api::{CoderProvisioner, CoderProvisionerStatus};

/// How many superseded versions are kept per CR (a pass writes at most twice).
const SUPERSEDED_KEPT: usize = 8;

#[derive(Debug, Default)]
pub struct StatusLedger {
    entries: Mutex<HashMap<String, Entry>>,
}

#[derive(Debug)]
struct Entry {
    status: CoderProvisionerStatus,
    written_version: Option<String>,
    superseded: Vec<String>,
}

impl StatusLedger {
    /// The status `cr` would have if the cache had caught up with the operator's own writes:
    /// `Some` when `cr` is a copy from before the last write, `None` when `cr` is current.
    pub fn newer_status(&self, cr: &CoderProvisioner) -> Option<CoderProvisionerStatus> {
        let uid = cr.metadata.uid.as_deref()?;
        let version = cr.metadata.resource_version.as_deref()?;
        let mut entries = self.entries();
        let entry = entries.get(uid)?;
        if entry.superseded.iter().any(|v| v == version) {
            return Some(entry.status.clone());
        }
        entries.remove(uid);
        None
    }

    /// Records that a status write computed from the copy of `cr` at `based_on` stored `status`
    /// as version `written`.
    pub fn record(
        &self,
        cr: &CoderProvisioner,
        based_on: Option<&str>,
        status: &CoderProvisionerStatus,
        written: Option<&str>,
    ) {
        let Some(uid) = cr.metadata.uid.clone() else {
            return;
        };
        let mut entries = self.entries();
        let mut superseded = entries
            .remove(&uid)
            .map(|entry| {
                let mut versions = entry.superseded;
                versions.extend(entry.written_version);
                versions
            })
            .unwrap_or_default();
        superseded.extend(based_on.map(str::to_owned));
        superseded.dedup();
        let excess = superseded.len().saturating_sub(SUPERSEDED_KEPT);
        superseded.drain(..excess);
        entries.insert(
            uid,
            Entry {
                status: status.clone(),
                written_version: written.map(str::to_owned),
                superseded,
            },
        );
    }

    /// Drops what is known about a CR (it is being deleted).
    pub fn forget(&self, cr: &CoderProvisioner) {
        if let Some(uid) = cr.metadata.uid.as_deref() {
            self.entries().remove(uid);
        }
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        // A poisoned lock only means another reconcile panicked mid-update; the map is valid.
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::PHASE_READY;

    fn cr(version: &str, phase: Option<&str>) -> CoderProvisioner {
        let mut cr: CoderProvisioner = serde_json::from_value(serde_json::json!({
            "apiVersion": "coder.com/v1alpha1", "kind": "CoderProvisioner",
            "metadata": {"name": "p", "namespace": "coder", "uid": "u-1", "resourceVersion": version},
            "spec": {"controlPlaneRef": {"name": "coder"}},
        }))
        .expect("valid CR");
        cr.status = phase.map(|phase| CoderProvisionerStatus {
            phase: Some(phase.to_owned()),
            ..Default::default()
        });
        cr
    }

    fn status(key_id: &str) -> CoderProvisionerStatus {
        CoderProvisionerStatus {
            provisioner_key_id: Some(key_id.to_owned()),
            phase: Some(PHASE_READY.to_owned()),
            ..Default::default()
        }
    }

    #[test]
    fn copies_from_before_a_pass_s_writes_get_the_last_written_status() {
        let ledger = StatusLedger::default();
        // One pass: the key record (10 → 11), then the final status (11 → 12).
        ledger.record(&cr("10", None), Some("10"), &status("key-1"), Some("11"));
        ledger.record(
            &cr("10", None),
            Some("11"),
            &status("key-1-final"),
            Some("12"),
        );
        for stale in ["10", "11"] {
            assert_eq!(
                ledger.newer_status(&cr(stale, None)),
                Some(status("key-1-final")),
                "copy at {stale}"
            );
        }
    }

    #[test]
    fn the_written_version_or_any_other_means_the_cache_caught_up() {
        let ledger = StatusLedger::default();
        ledger.record(&cr("10", None), Some("10"), &status("key-1"), Some("11"));
        assert_eq!(ledger.newer_status(&cr("11", Some("Ready"))), None);
        // The entry is gone: even the old version is now taken as it is.
        assert_eq!(ledger.newer_status(&cr("10", None)), None);

        ledger.record(&cr("20", None), Some("20"), &status("key-2"), Some("21"));
        assert_eq!(ledger.newer_status(&cr("25", Some("Pending"))), None);
    }

    #[test]
    fn forgetting_a_cr_drops_its_entry_and_few_versions_are_kept() {
        let ledger = StatusLedger::default();
        for version in 0..20 {
            let (based_on, written) = (version.to_string(), (version + 1).to_string());
            ledger.record(
                &cr("0", None),
                Some(&based_on),
                &status("k"),
                Some(&written),
            );
        }
        assert_eq!(ledger.newer_status(&cr("2", None)), None, "long superseded");
        ledger.record(&cr("30", None), Some("30"), &status("k"), Some("31"));
        ledger.forget(&cr("30", None));
        assert_eq!(ledger.newer_status(&cr("30", None)), None);
    }
}
