//! The decisions of the pure steps that a seeded variant ([`crate::seeded`]) bends, as data: the
//! pass builds one [`Policy`] and hands it to the pure functions, which never read the seeded
//! switch themselves and so stay functions of their arguments. [`Policy::REFERENCE`] is the
//! reference behaviour, and the only policy of a build without the `seeded-bugs` feature.
use crate::seeded::{self, Bug};

/// Each flag names the [`Bug`] that sets it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// [`Bug::UnownedKeySecretAdopted`].
    pub unowned_key_secret_adopted: bool,
    /// [`Bug::KeySecretOfAnotherProvisionerAdopted`].
    pub any_provisioners_key_secret_adopted: bool,
    /// [`Bug::EntitlementsUnauthorizedAsQueryFailure`].
    pub unauthorized_entitlements_as_query_failure: bool,
    /// [`Bug::TagsIgnoredOnDrift`].
    pub tags_ignored_on_drift: bool,
    /// [`Bug::CredentialSecretsUnchecked`].
    pub credential_secrets_unchecked: bool,
    /// [`Bug::CredentialOriginPrefixMatch`].
    pub credential_origin_prefix_match: bool,
    /// [`Bug::CredentialOriginPortIgnored`].
    pub credential_origin_port_ignored: bool,
    /// [`Bug::ObservedGenerationFrozen`].
    pub observed_generation_frozen: bool,
    /// [`Bug::PhaseReadyWhenDeploymentExists`].
    pub phase_ready_when_deployment_exists: bool,
    /// [`Bug::TransitionTimeAlwaysNow`].
    pub transition_time_always_now: bool,
    /// [`Bug::StatusRewrittenEveryReconcile`].
    pub condition_messages_timestamped: bool,
    /// [`Bug::KeySecretWithoutBlockOwnerDeletion`].
    pub key_secret_without_block_owner_deletion: bool,
    /// [`Bug::DaemonWithOrganizationEnv`].
    pub daemon_with_organization_env: bool,
    /// [`Bug::DaemonWithoutCoderCommand`].
    pub daemon_without_coder_command: bool,
}

impl Policy {
    pub const REFERENCE: Policy = Policy {
        unowned_key_secret_adopted: false,
        any_provisioners_key_secret_adopted: false,
        unauthorized_entitlements_as_query_failure: false,
        tags_ignored_on_drift: false,
        credential_secrets_unchecked: false,
        credential_origin_prefix_match: false,
        credential_origin_port_ignored: false,
        observed_generation_frozen: false,
        phase_ready_when_deployment_exists: false,
        transition_time_always_now: false,
        condition_messages_timestamped: false,
        key_secret_without_block_owner_deletion: false,
        daemon_with_organization_env: false,
        daemon_without_coder_command: false,
    };

    /// This process's policy: the reference, bent by the seeded variant that is active, if any.
    pub fn current() -> Self {
        Self {
            unowned_key_secret_adopted: seeded::active(Bug::UnownedKeySecretAdopted),
            any_provisioners_key_secret_adopted: seeded::active(
                Bug::KeySecretOfAnotherProvisionerAdopted,
            ),
            unauthorized_entitlements_as_query_failure: seeded::active(
                Bug::EntitlementsUnauthorizedAsQueryFailure,
            ),
            tags_ignored_on_drift: seeded::active(Bug::TagsIgnoredOnDrift),
            credential_secrets_unchecked: seeded::active(Bug::CredentialSecretsUnchecked),
            credential_origin_prefix_match: seeded::active(Bug::CredentialOriginPrefixMatch),
            credential_origin_port_ignored: seeded::active(Bug::CredentialOriginPortIgnored),
            observed_generation_frozen: seeded::active(Bug::ObservedGenerationFrozen),
            phase_ready_when_deployment_exists: seeded::active(Bug::PhaseReadyWhenDeploymentExists),
            transition_time_always_now: seeded::active(Bug::TransitionTimeAlwaysNow),
            condition_messages_timestamped: seeded::active(Bug::StatusRewrittenEveryReconcile),
            key_secret_without_block_owner_deletion: seeded::active(
                Bug::KeySecretWithoutBlockOwnerDeletion,
            ),
            daemon_with_organization_env: seeded::active(Bug::DaemonWithOrganizationEnv),
            daemon_without_coder_command: seeded::active(Bug::DaemonWithoutCoderCommand),
        }
    }
}
