//! Broken steps of the seeded variants ([`crate::seeded`]) that need the pass's types or coderd.
//! Only the hooks of the pass's I/O layer (this module's parent and `cleanup`) call them; they
//! live here so that `crate::seeded` imports nothing of the operator.
use crate::api::{CoderProvisioner, CoderProvisionerStatus};
use crate::coderd::{CoderdClient, CoderdError};
#[cfg(doc)]
use crate::seeded::Bug;

use super::keys::{DesiredKey, KeyAction, KeyCause, RecordedKey, recorded_key};
use super::names::Names;

/// For [`Bug::CleanupWithoutKeyCallsCoderd`]: a "key" made up from the spec when status records
/// none (organization name instead of id, no key id), so clean-up goes to coderd anyway.
pub fn key_guessed_from_spec(cr: &CoderProvisioner) -> RecordedKey {
    RecordedKey {
        organization_id: Names::for_provisioner(cr).organization,
        key_id: String::new(),
        control_plane_url: String::new(),
    }
}

/// For [`Bug::CleanupBySpecKeyName`]: deletes whatever key carries the name the spec asks for
/// now, instead of the key recorded in status.
pub async fn delete_by_spec_name(
    client: &CoderdClient,
    cr: &CoderProvisioner,
    organization_id: &str,
) -> Result<Option<String>, CoderdError> {
    let name = Names::for_provisioner(cr).key_name;
    client.delete_key(organization_id, &name).await?;
    Ok(Some(name))
}

/// For [`Bug::CleanupByRecordedName`]: deletes whatever key carries the name status recorded,
/// without listing to check that it still has the recorded id.
pub async fn delete_by_recorded_name(
    client: &CoderdClient,
    status: &CoderProvisionerStatus,
    organization_id: &str,
) -> Result<Option<String>, CoderdError> {
    let Some(name) = status
        .provisioner_key_name
        .clone()
        .filter(|n| !n.is_empty())
    else {
        return Ok(None);
    };
    client.delete_key(organization_id, &name).await?;
    Ok(Some(name))
}

/// For [`Bug::CleanupOrganizationFromSpec`]: the organization of clean-up resolved from
/// `spec.organizationName` (by name) instead of the recorded id.
pub async fn organization_from_spec(
    client: &CoderdClient,
    cr: &CoderProvisioner,
) -> Result<String, CoderdError> {
    let name = Names::for_provisioner(cr).organization;
    Ok(client.organization(&name).await?.id)
}

/// For [`Bug::DriftRotationByRecordedName`]: retires the recorded key by the name status
/// recorded (best-effort, no id check) and returns `None`, so the establish step retires nothing
/// more.
pub async fn retire_by_recorded_name(
    client: &CoderdClient,
    retire: Option<RecordedKey>,
    status: &CoderProvisionerStatus,
) -> Option<RecordedKey> {
    let name = status
        .provisioner_key_name
        .as_deref()
        .filter(|n| !n.is_empty());
    let (Some(key), Some(name)) = (&retire, name) else {
        return retire;
    };
    let _best_effort = client.delete_key(&key.organization_id, name).await;
    None
}

/// For [`Bug::RefusedSecretListsKeys`]: looks the keys up in coderd before the refusal, as if
/// the key list were prefetched ahead of the ownership check. Failures are ignored.
pub async fn list_keys_anyway(client: Option<&CoderdClient>, organization: &str) {
    let Some(client) = client else { return };
    if let Ok(organization) = client.organization(organization).await {
        let _ignored = client.list_keys(&organization.id).await;
    }
}

/// For [`Bug::KeyRotatedOnRestart`]: the first key decision this process makes for a CR (by its
/// `namespace/name`) rotates a key that could be reused, as if a key were only trusted when an
/// in-memory cache, empty after every start, knew it.
pub fn rotate_on_first_sight(
    cr: &str,
    action: KeyAction,
    status: &CoderProvisionerStatus,
    desired: &DesiredKey,
) -> KeyAction {
    static SEEN: std::sync::Mutex<std::collections::BTreeSet<String>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let first_sight = SEEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .insert(cr.to_owned());
    match action {
        KeyAction::Reuse(_) if first_sight => KeyAction::Establish {
            cause: KeyCause::BaselineMissing,
            retire: recorded_key(status, &desired.control_plane_url),
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coderd::SecretString;

    fn desired() -> DesiredKey {
        DesiredKey {
            organization_name: "default".into(),
            key_name: "p".into(),
            tags: Default::default(),
            tags_hash: "811c9dc5".into(),
            control_plane_ref: "cp".into(),
            control_plane_url: "http://coder.test".into(),
        }
    }

    fn recorded() -> CoderProvisionerStatus {
        CoderProvisionerStatus {
            organization_id: Some("org-1".into()),
            provisioner_key_id: Some("key-1".into()),
            ..Default::default()
        }
    }

    #[test]
    fn only_the_first_decision_per_provisioner_rotates() {
        let reuse = || KeyAction::Reuse(SecretString::new("plaintext"));
        let rotation = KeyAction::Establish {
            cause: KeyCause::BaselineMissing,
            retire: recorded_key(&recorded(), "http://coder.test"),
        };
        let decide = |cr, action| rotate_on_first_sight(cr, action, &recorded(), &desired());
        assert_eq!(decide("ns/restarted", reuse()), rotation);
        assert_eq!(decide("ns/restarted", reuse()), reuse());
        // A CR whose first decision already creates a key is not rotated afterwards.
        let initial = KeyAction::Establish {
            cause: KeyCause::Initial,
            retire: None,
        };
        assert_eq!(decide("ns/new", initial.clone()), initial);
        assert_eq!(decide("ns/new", reuse()), reuse());
    }
}
