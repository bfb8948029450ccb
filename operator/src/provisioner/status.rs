//! Status computation (pure): conditions and phase are derived together, in one place.
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use crate::api::{
    CoderProvisionerStatus, PHASE_PENDING, PHASE_READY, SecretKeyRef, condition, reason,
};

use super::gates::ConditionUpdate;
use super::keys::KeyRecord;

/// What one reconcile pass learned, in gate order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassReport {
    pub conditions: Vec<ConditionUpdate>,
    /// Set when a key was established (or the recorded one confirmed) in this pass.
    pub key: Option<(KeyRecord, SecretKeyRef)>,
    /// The pass applied the Deployment (R-ST-4: only then observedGeneration moves).
    pub reached_deployment: bool,
    /// Why the API server refused a child this pass (shown in `DeploymentReady`'s message).
    pub refused: Option<String>,
}

impl PassReport {
    pub fn set(&mut self, update: ConditionUpdate) {
        self.conditions.retain(|known| known.type_ != update.type_);
        self.conditions.push(update);
    }
}

/// The status after this pass. `deployment` is the Deployment as last observed: `DeploymentReady`,
/// `phase` and `readyReplicas` describe what runs, even when an earlier gate failed (D-1).
pub fn next_status(
    previous: Option<&CoderProvisionerStatus>,
    generation: Option<i64>,
    report: &PassReport,
    deployment: Option<&Deployment>,
    now: Timestamp,
) -> CoderProvisionerStatus {
    let mut status = previous.cloned().unwrap_or_default();
    let ready_replicas = deployment.map(|d| {
        d.status
            .as_ref()
            .and_then(|s| s.ready_replicas)
            .unwrap_or(0)
    });
    let deployment_ready = ready_replicas.is_some_and(|ready| ready >= 1);
    let had_deployment_condition = status
        .conditions
        .iter()
        .any(|c| c.type_ == condition::DEPLOYMENT_READY);

    let mut updates = report.conditions.clone();
    if ready_replicas.is_some() || had_deployment_condition || report.refused.is_some() {
        let ready = ready_replicas.unwrap_or(0);
        let mut update = if deployment_ready {
            ConditionUpdate::ok(
                condition::DEPLOYMENT_READY,
                reason::MINIMUM_REPLICAS_READY,
                format!("{ready} replica(s) ready"),
            )
        } else {
            ConditionUpdate::failed(
                condition::DEPLOYMENT_READY,
                reason::NO_REPLICAS_READY,
                "no provisioner replica is ready",
            )
        };
        // The reasons stay the contract's (R-ST-9): readiness describes what runs (D-1); the
        // message says why the spec could not be applied.
        if let Some(refused) = &report.refused {
            update.message = format!("{}; {refused}", update.message);
        }
        updates.push(update);
    }
    for update in &updates {
        merge_condition(&mut status.conditions, update, generation, now);
    }

    let ready = ready_replicas.unwrap_or(0);
    status.ready_replicas = Some(ready);
    status.phase = Some(
        if deployment_ready {
            PHASE_READY
        } else {
            PHASE_PENDING
        }
        .to_owned(),
    );
    if report.reached_deployment {
        status.observed_generation = generation;
    }
    if let Some((record, secret_ref)) = &report.key {
        status.organization_id = Some(record.organization_id.clone());
        status.organization_name = Some(record.organization_name.clone());
        // `None` while the key's own lookup is pending: never the previous key's id.
        status.provisioner_key_id = record.key_id.clone();
        status.provisioner_key_name = Some(record.key_name.clone());
        status.tags_hash = Some(record.tags_hash.clone());
        status.control_plane_ref_name = Some(record.control_plane_ref.clone());
        status.control_plane_url = Some(record.control_plane_url.clone());
        status.secret_ref = Some(secret_ref.clone());
    }
    status
}

/// Sets one condition; `lastTransitionTime` moves only when the status flips.
fn merge_condition(
    conditions: &mut Vec<Condition>,
    update: &ConditionUpdate,
    generation: Option<i64>,
    now: Timestamp,
) {
    let status = if update.ok { "True" } else { "False" };
    let existing = conditions.iter().position(|c| c.type_ == update.type_);
    let last_transition_time = existing
        .map(|i| &conditions[i])
        .filter(|c| c.status == status)
        .map_or(Time(now), |c| c.last_transition_time.clone());
    let condition = Condition {
        type_: update.type_.to_owned(),
        status: status.to_owned(),
        reason: update.reason.to_owned(),
        message: update.message.clone(),
        observed_generation: generation,
        last_transition_time,
    };
    match existing {
        Some(i) => conditions[i] = condition,
        None => conditions.push(condition),
    }
}

/// False conditions of this pass that were not already False for the same reason: each is
/// announced once as a Warning Event (e.g. a refused key Secret), not on every retry.
pub fn newly_failed<'a>(
    previous: Option<&CoderProvisionerStatus>,
    report: &'a PassReport,
) -> Vec<&'a ConditionUpdate> {
    let known = |update: &ConditionUpdate| {
        previous.is_some_and(|status| {
            status.conditions.iter().any(|c| {
                c.type_ == update.type_ && c.status == "False" && c.reason == update.reason
            })
        })
    };
    report
        .conditions
        .iter()
        .filter(|update| !update.ok && !known(update))
        .collect()
}

/// Whether writing `next` would change anything, ignoring condition timestamps (R-ST-7).
pub fn status_changed(
    current: Option<&CoderProvisionerStatus>,
    next: &CoderProvisionerStatus,
) -> bool {
    let without_times = |status: &CoderProvisionerStatus| {
        let mut status = status.clone();
        for condition in &mut status.conditions {
            condition.last_transition_time = Time(Timestamp::UNIX_EPOCH);
        }
        status
    };
    current.is_none_or(|current| without_times(current) != without_times(next))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(rfc3339: &str) -> Timestamp {
        rfc3339.parse().expect("timestamp")
    }

    fn deployment(ready: Option<i32>) -> Deployment {
        Deployment {
            status: Some(k8s_openapi::api::apps::v1::DeploymentStatus {
                ready_replicas: ready,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn report(updates: Vec<ConditionUpdate>, reached_deployment: bool) -> PassReport {
        PassReport {
            conditions: updates,
            key: None,
            reached_deployment,
            refused: None,
        }
    }

    fn cp_ready() -> ConditionUpdate {
        ConditionUpdate::ok(
            condition::CONTROL_PLANE_READY,
            reason::CONTROL_PLANE_AVAILABLE,
            "ok",
        )
    }

    fn find<'a>(status: &'a CoderProvisionerStatus, type_: &str) -> &'a Condition {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
            .expect("condition present")
    }

    #[test]
    fn new_cr_with_failed_gate_has_only_that_condition_and_is_pending() {
        let failed = ConditionUpdate::failed(
            condition::CONTROL_PLANE_READY,
            reason::CONTROL_PLANE_UNAVAILABLE,
            "missing",
        );
        let status = next_status(
            None,
            Some(1),
            &report(vec![failed], false),
            None,
            t("2026-01-01T00:00:00Z"),
        );
        assert_eq!(status.conditions.len(), 1);
        assert_eq!(status.phase.as_deref(), Some(PHASE_PENDING));
        assert_eq!(status.observed_generation, None);
        assert_eq!(
            find(&status, condition::CONTROL_PLANE_READY).observed_generation,
            Some(1)
        );
    }

    #[test]
    fn ready_deployment_makes_phase_ready_and_sets_observed_generation() {
        let status = next_status(
            None,
            Some(4),
            &report(vec![cp_ready()], true),
            Some(&deployment(Some(1))),
            t("2026-01-01T00:00:00Z"),
        );
        assert_eq!(status.phase.as_deref(), Some(PHASE_READY));
        assert_eq!(status.ready_replicas, Some(1));
        assert_eq!(status.observed_generation, Some(4));
        let deployment_ready = find(&status, condition::DEPLOYMENT_READY);
        assert_eq!(
            (
                deployment_ready.status.as_str(),
                deployment_ready.reason.as_str()
            ),
            ("True", reason::MINIMUM_REPLICAS_READY)
        );
    }

    #[test]
    fn deployment_readiness_is_reported_even_when_an_earlier_gate_fails() {
        let failed = ConditionUpdate::failed(
            condition::CREDENTIALS_READY,
            reason::CREDENTIAL_LABEL_MISSING,
            "no label",
        );
        let status = next_status(
            None,
            Some(2),
            &report(vec![failed], false),
            Some(&deployment(Some(2))),
            t("2026-01-01T00:00:00Z"),
        );
        assert_eq!(status.phase.as_deref(), Some(PHASE_READY));
        assert_eq!(find(&status, condition::DEPLOYMENT_READY).status, "True");
    }

    #[rstest::rstest]
    #[case::no_deployment_yet(None, "False", reason::NO_REPLICAS_READY)]
    #[case::an_older_one_runs(Some(deployment(Some(1))), "True", reason::MINIMUM_REPLICAS_READY)]
    fn a_refused_child_is_named_in_deployment_ready_with_the_contracts_reasons(
        #[case] running: Option<Deployment>,
        #[case] expected_status: &str,
        #[case] expected_reason: &str,
    ) {
        let mut refused = report(vec![], false);
        refused.refused = Some("applying Deployment \"p\" failed: invalid cpu".to_owned());
        let status = next_status(
            None,
            Some(3),
            &refused,
            running.as_ref(),
            t("2026-01-01T00:00:00Z"),
        );
        let condition = find(&status, condition::DEPLOYMENT_READY);
        assert_eq!(
            (condition.status.as_str(), condition.reason.as_str()),
            (expected_status, expected_reason)
        );
        assert!(
            condition
                .message
                .ends_with("; applying Deployment \"p\" failed: invalid cpu")
        );
        assert_eq!(
            status.observed_generation, None,
            "nothing was applied (R-ST-4)"
        );
    }

    #[test]
    fn unready_deployment_is_pending() {
        let status = next_status(
            None,
            Some(1),
            &report(vec![], true),
            Some(&deployment(None)),
            t("2026-01-01T00:00:00Z"),
        );
        assert_eq!(status.phase.as_deref(), Some(PHASE_PENDING));
        assert_eq!(status.ready_replicas, Some(0));
        assert_eq!(
            find(&status, condition::DEPLOYMENT_READY).reason,
            reason::NO_REPLICAS_READY
        );
    }

    #[test]
    fn last_transition_time_is_kept_while_status_is_unchanged_and_moves_on_flip() {
        let first = next_status(
            None,
            Some(1),
            &report(vec![cp_ready()], false),
            None,
            t("2026-01-01T00:00:00Z"),
        );
        let mut reworded = cp_ready();
        reworded.message = "still ok".into();
        let second = next_status(
            Some(&first),
            Some(2),
            &report(vec![reworded], false),
            None,
            t("2026-01-01T01:00:00Z"),
        );
        assert_eq!(
            find(&second, condition::CONTROL_PLANE_READY).last_transition_time,
            Time(t("2026-01-01T00:00:00Z"))
        );
        assert_eq!(
            find(&second, condition::CONTROL_PLANE_READY).message,
            "still ok"
        );

        let failed = ConditionUpdate::failed(
            condition::CONTROL_PLANE_READY,
            reason::CONTROL_PLANE_UNAVAILABLE,
            "gone",
        );
        let third = next_status(
            Some(&second),
            Some(2),
            &report(vec![failed], false),
            None,
            t("2026-01-01T02:00:00Z"),
        );
        assert_eq!(
            find(&third, condition::CONTROL_PLANE_READY).last_transition_time,
            Time(t("2026-01-01T02:00:00Z"))
        );
    }

    #[test]
    fn identical_pass_changes_nothing() {
        let pass = report(vec![cp_ready()], true);
        let first = next_status(
            None,
            Some(1),
            &pass,
            Some(&deployment(Some(1))),
            t("2026-01-01T00:00:00Z"),
        );
        let second = next_status(
            Some(&first),
            Some(1),
            &pass,
            Some(&deployment(Some(1))),
            t("2026-01-01T05:00:00Z"),
        );
        assert!(!status_changed(Some(&first), &second));
        assert_eq!(first, second);
        assert!(status_changed(None, &second));
    }

    #[test]
    fn later_conditions_are_left_as_they_were() {
        let key_ready = ConditionUpdate::ok(condition::KEY_READY, reason::KEY_READY, "ok");
        let first = next_status(
            None,
            Some(1),
            &report(vec![cp_ready(), key_ready], false),
            None,
            t("2026-01-01T00:00:00Z"),
        );
        let failed = ConditionUpdate::failed(
            condition::CONTROL_PLANE_READY,
            reason::CONTROL_PLANE_UNAVAILABLE,
            "gone",
        );
        let second = next_status(
            Some(&first),
            Some(1),
            &report(vec![failed], false),
            None,
            t("2026-01-01T01:00:00Z"),
        );
        assert_eq!(
            find(&second, condition::KEY_READY),
            find(&first, condition::KEY_READY)
        );
        assert!(status_changed(Some(&first), &second));
    }

    #[test]
    fn failures_are_announced_once_per_reason() {
        let refused = ConditionUpdate::failed(
            condition::KEY_SECRET_READY,
            reason::KEY_SECRET_NOT_OWNED,
            "taken",
        );
        let pass = report(vec![cp_ready(), refused.clone()], false);
        assert_eq!(newly_failed(None, &pass), vec![&refused]);
        let status = next_status(None, Some(1), &pass, None, t("2026-01-01T00:00:00Z"));
        assert!(newly_failed(Some(&status), &pass).is_empty());
        let other_reason =
            ConditionUpdate::failed(condition::KEY_SECRET_READY, reason::KEY_FAILED, "x");
        let pass = report(vec![other_reason.clone()], false);
        assert_eq!(newly_failed(Some(&status), &pass), vec![&other_reason]);
    }

    #[test]
    fn key_record_fills_the_key_fields() {
        let record = KeyRecord {
            organization_id: "org-1".into(),
            organization_name: "default".into(),
            key_id: Some("key-1".into()),
            key_name: "sample".into(),
            tags_hash: "811c9dc5".into(),
            control_plane_ref: "cp".into(),
            control_plane_url: "http://coder.test".into(),
        };
        let secret_ref = SecretKeyRef {
            name: "sample-provisioner-key".into(),
            key: Some("key".into()),
        };
        let pass = PassReport {
            key: Some((record, secret_ref.clone())),
            ..Default::default()
        };
        let status = next_status(None, Some(1), &pass, None, t("2026-01-01T00:00:00Z"));
        assert_eq!(status.organization_id.as_deref(), Some("org-1"));
        assert_eq!(status.provisioner_key_id.as_deref(), Some("key-1"));
        assert_eq!(
            status.control_plane_url.as_deref(),
            Some("http://coder.test")
        );
        assert_eq!(status.secret_ref, Some(secret_ref));
    }
}
