//! Seeded bugs: deliberately broken variants of this operator that prove the conformance suite
//! can fail. Each [`Bug`] re-creates one mistake the contract forbids (the PR's bugs, the
//! tutorial's rules, stability rules) at one small decision point, marked by an
//! `if seeded::active(Bug::…)` hook.
//!
//! The variants exist only in builds with the cargo feature `seeded-bugs`, which release builds
//! never enable, and even there only the one named by [`ENV_VAR`] is active. Without the feature
//! [`active`] is a `const fn` returning `false`, so every hook is dead code the compiler removes
//! and the environment variable is never read.
//!
//! The PR's RBAC bug (the operator's ClusterRole without the pod verbs) is not a code hook: it is
//! an RBAC folder variant produced by the runner (`conformance::seeded`). The runner also grants
//! [`Bug::ControlPlaneStatusRewritten`] the write its hook needs, which `config/rbac/` does not.

use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};

use crate::api::CoderControlPlane;

/// Names the active variant (kebab-case, see [`Bug::name`]) in a `seeded-bugs` build.
pub const ENV_VAR: &str = "CODER_OPERATOR_SEEDED_BUG";

/// One seeded bug, named after what it breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bug {
    /// The key status is written only when a whole pass succeeds, so a failure after the key
    /// step (e.g. a refused Role) makes every retry call coderd again (R-KEY-7, R-KEY-8; the PR).
    KeyStatusNotPersistedEarly,
    /// The daemon container has no `command: ["coder"]` (R-POD-9; the PR).
    DaemonWithoutCoderCommand,
    /// The daemon container gets `CODER_ORGANIZATION`, which `--key` rejects (R-POD-14; the PR).
    DaemonWithOrganizationEnv,
    /// An existing key Secret the CR does not control is adopted instead of refused
    /// (R-SEC-8, R-SEC-10, R-SEC-11, D-3).
    UnownedKeySecretAdopted,
    /// A key Secret controlled by any CoderProvisioner counts as owned (kind checked, uid not),
    /// so a second CR naming the first one's Secret takes it over (R-SEC-12).
    KeySecretOfAnotherProvisionerAdopted,
    /// Secrets named by `extraEnv` secretKeyRefs are not checked at all (R-CRED-3…7, D-2).
    CredentialSecretsUnchecked,
    /// A destination "matches" when it starts with the control plane's origin, so lookalike
    /// hosts pass (R-CRED-6, R-CRED-10, D-2).
    CredentialOriginPrefixMatch,
    /// Clean-up deletes the key named by `spec.key.name` instead of the recorded id
    /// (R-DEL-3, D-5).
    CleanupBySpecKeyName,
    /// Clean-up calls coderd even when the status records no key (R-DEL-5).
    CleanupWithoutKeyCallsCoderd,
    /// When the key delete fails the finalizer is kept and the delete retried (R-DEL-8).
    FinalizerKeptWhileCoderdDown,
    /// A CR being deleted without the operator's finalizer is reconciled like a live one
    /// (R-DEL-11).
    DeletedWithoutFinalizerReconciled,
    /// `CredentialsReady` is set False but the pass goes on to the key and the Deployment
    /// (R-CRED-8, R-CRED-9, D-1).
    DeploymentUpdatedDespiteInvalidCredentials,
    /// `not_entitled` is reported but does not stop the pass (R-ENT-2, R-ENT-5, R-ENT-9).
    NotEntitledIgnored,
    /// Condition messages carry the time of the reconcile ("… as of <now>"), so every reconcile
    /// rewrites the status, and each write triggers the next reconcile (R-ST-7).
    StatusRewrittenEveryReconcile,
    /// The first reconcile of each CR after an operator start rotates its key (R-KEY-4).
    KeyRotatedOnRestart,
    /// A change of `spec.tags` is not seen as drift, so the key keeps the old tags (R-KEY-13).
    TagsIgnoredOnDrift,
    /// After a 429 on a key request the CR is retried after 100 ms instead of the doubling
    /// backoff (R-RL-2).
    RateLimitRetriedWithoutBackoff,
    /// The per-CR 429 counter is not reset by a successful pass, so the next run of 429s starts
    /// where the last one stopped (R-RL-3).
    BackoffNotResetAfterSuccess,
    /// Clean-up deletes the key named `status.provisionerKeyName` without matching the recorded
    /// id, so a same-named key that replaced it is deleted (R-DEL-3, R-DEL-4, D-5).
    CleanupByRecordedName,
    /// A spec-drift rotation deletes the old key by its recorded name, not by the recorded id
    /// (R-KEY-24).
    DriftRotationByRecordedName,
    /// The operator token is logged at info level whenever a coderd client is built (R-SEC-14).
    SessionTokenLogged,
    /// Destination origins are compared by scheme and host only; ports are ignored
    /// (R-CRED-6, R-CRED-10).
    CredentialOriginPortIgnored,
    /// Clean-up spawns the key delete in the background and removes the finalizer at once
    /// (R-DEL-2).
    CleanupInBackground,
    /// Phase `Ready` and `DeploymentReady=True` whenever the Deployment exists, whatever its
    /// readyReplicas (R-ST-2, R-ST-5).
    PhaseReadyWhenDeploymentExists,
    /// `tagsHash` covers the tag keys only, so a changed tag value is not drift
    /// (R-KEY-13, R-ST-8).
    TagsHashOverKeysOnly,
    /// A refused key Secret (`KeySecretNotOwned`) still lets the pass list the keys in coderd
    /// first (R-SEC-11, D-3).
    RefusedSecretListsKeys,
    /// Clean-up looks the organization up by `spec.organizationName` instead of using the
    /// recorded `status.organizationID` (R-DEL-3).
    CleanupOrganizationFromSpec,
    /// Every condition's `lastTransitionTime` is set to now on each status write (R-ST-4).
    TransitionTimeAlwaysNow,
    /// `observedGeneration` (status and conditions) stays at the first generation recorded,
    /// never moving for later generations (R-ST-4).
    ObservedGenerationFrozen,
    /// `spec.key.secretKey` is ignored: the key lives under `key` (in the Secret, `status.secretRef`
    /// and the pod env alike) (R-SEC-1, R-SEC-6, R-KEY-5).
    SecretKeyIgnored,
    /// A 401 from the entitlements call gives `EntitlementsQueryFailed` instead of `Forbidden`
    /// (R-ENT-7).
    EntitlementsUnauthorizedAsQueryFailure,
    /// When deleting the old key of a rotation fails, the pass fails and no new key is created
    /// (R-KEY-16).
    RotationStopsOnDeleteFailure,
    /// The key Secret's controller ownerReference lacks `blockOwnerDeletion: true` (R-SEC-3).
    KeySecretWithoutBlockOwnerDeletion,
    /// The operator also writes the status of every control plane it watches (phase `Pending`),
    /// as an operator that also reconciles CoderControlPlanes does. It breaks no rule of the
    /// contract, only the suite's control-plane fixture, which the suite's fixture guard reports.
    /// `config/rbac/` grants no write on control planes, so the runner adds patch on
    /// codercontrolplanes/status for this variant.
    ControlPlaneStatusRewritten,
    /// A 429 on the clean-up delete is handled like one on a live CR: the finalizer is kept and
    /// the delete retried after a backoff, instead of removed after that single attempt (R-DEL-8).
    RateLimitedCleanupRetried,
    /// coderd's error bodies are decoded strictly, as exactly one JSON document, and a body that
    /// is not one ends the process: coderd's organization 404 holds two objects (R-KEY-19).
    ErrorBodyDecodedStrictly,
    /// The `ReplacedUnrecordedKey` Event is published after the DELETE it announces, so a crash
    /// in between loses it (D-5; events before effects).
    ReplacementAnnouncedAfterDelete,
    /// A key created in a pass whose Secret write is refused stays in coderd, so every retry
    /// replaces it (POST 409, DELETE, POST: key churn, the PR's bug in another form).
    UnstoredKeyLeftInCoderd,
    /// A child the API server refuses (an invalid spec field) is only logged: the conditions
    /// stay as they were and nothing tells the user why nothing changes.
    ChildRefusalOnlyLogged,
    /// Passes for a hanging coderd hold every reconcile slot, and each waits out its own
    /// timeout (no failure shared with the waiters, no bound per coderd): CRs on another control
    /// plane wait for minutes.
    HangingCoderdStarvesOthers,
    /// Nothing checks the leadership term before a key step: a leader paused past its lease
    /// finishes its pass when it wakes, and its key requests replace the key the new leader made
    /// (a Secret and a key record that can disagree).
    PausedLeaderUnfenced,
    /// The fence trusts the term's token alone: a leader paused past its lease wakes before its
    /// lease manager has noticed the loss, and the pass in flight goes on (no Lease read).
    FenceTrustsTermToken,
    /// A standby does not watch the Lease: after the leader released it on shutdown, the
    /// standby sleeps until the released Lease's old expiry (up to its whole duration).
    StandbyWaitsForExpiry,
    /// Every event of a CR starts a pass, other writers' label and annotation edits included:
    /// no trigger predicate and no debounce, as `Controller::new` does it (R-W-4).
    MetadataEditsReconciled,
}

impl Bug {
    pub const ALL: [Bug; 44] = [
        Bug::KeyStatusNotPersistedEarly,
        Bug::DaemonWithoutCoderCommand,
        Bug::DaemonWithOrganizationEnv,
        Bug::UnownedKeySecretAdopted,
        Bug::KeySecretOfAnotherProvisionerAdopted,
        Bug::CredentialSecretsUnchecked,
        Bug::CredentialOriginPrefixMatch,
        Bug::CleanupBySpecKeyName,
        Bug::CleanupWithoutKeyCallsCoderd,
        Bug::FinalizerKeptWhileCoderdDown,
        Bug::DeletedWithoutFinalizerReconciled,
        Bug::DeploymentUpdatedDespiteInvalidCredentials,
        Bug::NotEntitledIgnored,
        Bug::StatusRewrittenEveryReconcile,
        Bug::KeyRotatedOnRestart,
        Bug::TagsIgnoredOnDrift,
        Bug::RateLimitRetriedWithoutBackoff,
        Bug::BackoffNotResetAfterSuccess,
        Bug::CleanupByRecordedName,
        Bug::DriftRotationByRecordedName,
        Bug::SessionTokenLogged,
        Bug::CredentialOriginPortIgnored,
        Bug::CleanupInBackground,
        Bug::PhaseReadyWhenDeploymentExists,
        Bug::TagsHashOverKeysOnly,
        Bug::RefusedSecretListsKeys,
        Bug::CleanupOrganizationFromSpec,
        Bug::TransitionTimeAlwaysNow,
        Bug::ObservedGenerationFrozen,
        Bug::SecretKeyIgnored,
        Bug::EntitlementsUnauthorizedAsQueryFailure,
        Bug::RotationStopsOnDeleteFailure,
        Bug::KeySecretWithoutBlockOwnerDeletion,
        Bug::ControlPlaneStatusRewritten,
        Bug::RateLimitedCleanupRetried,
        Bug::ErrorBodyDecodedStrictly,
        Bug::ReplacementAnnouncedAfterDelete,
        Bug::UnstoredKeyLeftInCoderd,
        Bug::ChildRefusalOnlyLogged,
        Bug::HangingCoderdStarvesOthers,
        Bug::PausedLeaderUnfenced,
        Bug::FenceTrustsTermToken,
        Bug::StandbyWaitsForExpiry,
        Bug::MetadataEditsReconciled,
    ];

    /// The value of [`ENV_VAR`] that selects this bug.
    pub const fn name(self) -> &'static str {
        match self {
            Bug::KeyStatusNotPersistedEarly => "key-status-not-persisted-early",
            Bug::DaemonWithoutCoderCommand => "daemon-without-coder-command",
            Bug::DaemonWithOrganizationEnv => "daemon-with-organization-env",
            Bug::UnownedKeySecretAdopted => "unowned-key-secret-adopted",
            Bug::KeySecretOfAnotherProvisionerAdopted => {
                "key-secret-of-another-provisioner-adopted"
            }
            Bug::CredentialSecretsUnchecked => "credential-secrets-unchecked",
            Bug::CredentialOriginPrefixMatch => "credential-origin-prefix-match",
            Bug::CleanupBySpecKeyName => "cleanup-by-spec-key-name",
            Bug::CleanupWithoutKeyCallsCoderd => "cleanup-without-key-calls-coderd",
            Bug::FinalizerKeptWhileCoderdDown => "finalizer-kept-while-coderd-down",
            Bug::DeletedWithoutFinalizerReconciled => "deleted-without-finalizer-reconciled",
            Bug::DeploymentUpdatedDespiteInvalidCredentials => {
                "deployment-updated-despite-invalid-credentials"
            }
            Bug::NotEntitledIgnored => "not-entitled-ignored",
            Bug::StatusRewrittenEveryReconcile => "status-rewritten-every-reconcile",
            Bug::KeyRotatedOnRestart => "key-rotated-on-restart",
            Bug::TagsIgnoredOnDrift => "tags-ignored-on-drift",
            Bug::RateLimitRetriedWithoutBackoff => "rate-limit-retried-without-backoff",
            Bug::BackoffNotResetAfterSuccess => "backoff-not-reset-after-success",
            Bug::CleanupByRecordedName => "cleanup-by-recorded-name",
            Bug::DriftRotationByRecordedName => "drift-rotation-by-recorded-name",
            Bug::SessionTokenLogged => "session-token-logged",
            Bug::CredentialOriginPortIgnored => "credential-origin-port-ignored",
            Bug::CleanupInBackground => "cleanup-in-background",
            Bug::PhaseReadyWhenDeploymentExists => "phase-ready-when-deployment-exists",
            Bug::TagsHashOverKeysOnly => "tags-hash-over-keys-only",
            Bug::RefusedSecretListsKeys => "refused-secret-lists-keys",
            Bug::CleanupOrganizationFromSpec => "cleanup-organization-from-spec",
            Bug::TransitionTimeAlwaysNow => "transition-time-always-now",
            Bug::ObservedGenerationFrozen => "observed-generation-frozen",
            Bug::SecretKeyIgnored => "secret-key-ignored",
            Bug::EntitlementsUnauthorizedAsQueryFailure => {
                "entitlements-unauthorized-as-query-failure"
            }
            Bug::RotationStopsOnDeleteFailure => "rotation-stops-on-delete-failure",
            Bug::KeySecretWithoutBlockOwnerDeletion => "key-secret-without-block-owner-deletion",
            Bug::ControlPlaneStatusRewritten => "control-plane-status-rewritten",
            Bug::RateLimitedCleanupRetried => "rate-limited-cleanup-retried",
            Bug::ErrorBodyDecodedStrictly => "error-body-decoded-strictly",
            Bug::ReplacementAnnouncedAfterDelete => "replacement-announced-after-delete",
            Bug::UnstoredKeyLeftInCoderd => "unstored-key-left-in-coderd",
            Bug::ChildRefusalOnlyLogged => "child-refusal-only-logged",
            Bug::HangingCoderdStarvesOthers => "hanging-coderd-starves-others",
            Bug::PausedLeaderUnfenced => "paused-leader-unfenced",
            Bug::FenceTrustsTermToken => "fence-trusts-term-token",
            Bug::StandbyWaitsForExpiry => "standby-waits-for-expiry",
            Bug::MetadataEditsReconciled => "metadata-edits-reconciled",
        }
    }

    pub fn from_name(name: &str) -> Option<Bug> {
        Bug::ALL.into_iter().find(|bug| bug.name() == name)
    }
}

/// Whether `bug` is the variant selected by [`ENV_VAR`] (read once per process).
#[cfg(feature = "seeded-bugs")]
pub fn active(bug: Bug) -> bool {
    selected() == Some(bug)
}

/// Without the `seeded-bugs` feature no bug is ever active, whatever the environment says.
#[cfg(not(feature = "seeded-bugs"))]
#[inline(always)]
pub const fn active(_bug: Bug) -> bool {
    false
}

#[cfg(feature = "seeded-bugs")]
fn selected() -> Option<Bug> {
    static SELECTED: std::sync::OnceLock<Option<Bug>> = std::sync::OnceLock::new();
    *SELECTED.get_or_init(|| {
        let name = std::env::var(ENV_VAR).ok()?;
        let name = name.trim();
        let bug = Bug::from_name(name);
        match bug {
            Some(bug) => tracing::warn!(
                bug = bug.name(),
                "SEEDED BUG ACTIVE: this operator is deliberately broken for a conformance check"
            ),
            None if name.is_empty() => {}
            None => tracing::error!(
                value = name,
                known = ?Bug::ALL.map(Bug::name),
                "{ENV_VAR} names no seeded bug; running the reference behaviour"
            ),
        }
        bug
    })
}

/// For [`Bug::ErrorBodyDecodedStrictly`]: the strict decode, unwrapped as a careless client does.
pub fn decode_error_body_strictly(body: &[u8]) {
    let _: serde_json::Value =
        serde_json::from_slice(body).expect("coderd error body is one JSON document");
}

/// For [`Bug::FinalizerKeptWhileCoderdDown`] and [`Bug::RateLimitedCleanupRetried`]: whether a
/// failed clean-up (`rate_limited`: coderd answered 429) keeps the finalizer; the reference
/// never does.
pub fn failed_cleanup_keeps_finalizer(rate_limited: bool) -> bool {
    active(Bug::FinalizerKeptWhileCoderdDown)
        || (active(Bug::RateLimitedCleanupRetried) && rate_limited)
}

/// For [`Bug::ControlPlaneStatusRewritten`]: sets the control plane's `status.phase` to
/// `Pending` under the operator's field manager (the phase an operator that also reconciles
/// CoderControlPlanes gives a coderd it has not rolled out). In a task of its own: the watch
/// mapper that calls it cannot wait. A refused write is only logged, as a separate controller's
/// would be, and provisioners are reconciled as usual.
pub fn rewrite_control_plane_status(
    client: &Client,
    control_plane: &CoderControlPlane,
    field_manager: &str,
) {
    const PHASE: &str = "Pending";
    // Already written: patching again would only cost a request per watch event.
    if control_plane
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        == Some(PHASE)
    {
        return;
    }
    let api: Api<CoderControlPlane> = Api::namespaced(
        client.clone(),
        &control_plane.namespace().unwrap_or_default(),
    );
    let name = control_plane.name_any();
    let params = PatchParams {
        field_manager: Some(field_manager.to_owned()),
        ..PatchParams::default()
    };
    tokio::spawn(async move {
        let patch = Patch::Merge(serde_json::json!({"status": {"phase": PHASE}}));
        if let Err(error) = api.patch_status(&name, &params, &patch).await {
            tracing::warn!(control_plane = %name, %error, "writing the control plane's status failed");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_kebab_case_and_round_trip() {
        let mut names: Vec<&str> = Bug::ALL.iter().map(|bug| bug.name()).collect();
        for (bug, name) in Bug::ALL.iter().zip(&names) {
            assert!(
                name.chars().all(|c| c.is_ascii_lowercase() || c == '-'),
                "{name} is not kebab-case"
            );
            assert_eq!(Bug::from_name(name), Some(*bug));
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Bug::ALL.len(), "duplicate names");
        assert_eq!(Bug::from_name("no-such-bug"), None);
    }

    /// The runner's table (`conformance::seeded::VARIANTS`) names exactly these code variants.
    #[test]
    fn the_runner_knows_every_code_variant() {
        use conformance::seeded::VARIANTS;
        let mut runner: Vec<&str> = VARIANTS
            .iter()
            .filter(|v| v.breakage.is_seeded_code())
            .map(|v| v.name)
            .collect();
        let mut here: Vec<&str> = Bug::ALL.iter().map(|bug| bug.name()).collect();
        runner.sort_unstable();
        here.sort_unstable();
        assert_eq!(runner, here);
        assert_eq!(conformance::seeded::SEEDED_BUG_ENV, ENV_VAR);
    }

    /// Without the feature the switch is decided at compile time.
    #[cfg(not(feature = "seeded-bugs"))]
    const _: () = {
        let mut i = 0;
        while i < Bug::ALL.len() {
            assert!(!active(Bug::ALL[i]));
            i += 1;
        }
    };
}
