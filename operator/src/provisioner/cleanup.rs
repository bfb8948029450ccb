//! Deletion (§12): best-effort removal of the recorded key; never blocks the finalizer.
use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use tracing::info;

use crate::api::{CoderProvisioner, CoderProvisionerStatus};
use crate::coderd::SecretString;

use super::context::{Context, object_key};
use super::error::{CleanupError, Error};
use super::{dereference, gates, keys};

pub async fn cleanup(cr: &CoderProvisioner, ctx: &Arc<Context>) -> Result<Action, Error> {
    // Removing the finalizer after this returns is a write too: only the leader's (R-HA-2).
    ctx.fence.check().await.map_err(CleanupError::from)?;
    let key = object_key(cr);
    ctx.failures.reset(&key);
    ctx.rate_limits.reset(&key);
    ctx.key_hold_off.clear(&key);
    let status = cr.status.clone().unwrap_or_default();
    let target = match keys::recorded_key(&status, "") {
        Some(recorded) => Target::Recorded(recorded),
        None => match unidentified_key(cr, ctx, &status).await {
            Some(unidentified) => unidentified,
            None => {
                info!(provisioner = %object_key(cr), "no provisioner key recorded; nothing to clean up in coderd");
                return Ok(Action::await_change());
            }
        },
    };
    let key_name = status
        .provisioner_key_name
        .clone()
        .unwrap_or_else(|| "<name>".to_owned());
    let organization = status
        .organization_name
        .clone()
        .unwrap_or_else(|| target.organization_id().to_owned());
    let manual = format!("coder provisioner keys delete {key_name} --org {organization}");
    let outcome = delete_target(cr, ctx, &status, &target).await;
    match outcome {
        Ok(Some(name)) => {
            ctx.event(
                cr,
                EventType::Normal,
                "ProvisionerKeyDeleted",
                "DeleteKey",
                format!("deleted provisioner key {name:?} from coderd"),
            )
            .await;
        }
        Ok(None) => {
            info!(provisioner = %object_key(cr), "recorded provisioner key is already gone")
        }
        Err(why) => {
            // A replica whose leadership ended keeps the finalizer: the clean-up is the new
            // leader's (its delete would be the one that counts).
            ctx.fence.check().await.map_err(CleanupError::from)?;
            let note =
                format!("provisioner key may remain in coderd ({why}); delete it with `{manual}`");
            ctx.event(
                cr,
                EventType::Warning,
                "ProvisionerKeyCleanupFailed",
                "DeleteKey",
                note,
            )
            .await;
        }
    }
    Ok(Action::await_change())
}

/// The key the clean-up deletes.
enum Target {
    /// Recorded in status by organization and id (R-DEL-2).
    Recorded(keys::RecordedKey),
    /// Recorded in status by organization and name, its id unknown (the new key's lookup met a
    /// 429 or 5xx), and stored in the CR's own key Secret: resolved with the stored plaintext,
    /// so the key the CR made and stored does not stay valid in coderd after it is gone.
    Unidentified {
        organization_id: String,
        control_plane_url: String,
        plaintext: SecretString,
    },
}

impl Target {
    fn organization_id(&self) -> &str {
        match self {
            Self::Recorded(recorded) => &recorded.organization_id,
            Self::Unidentified {
                organization_id, ..
            } => organization_id,
        }
    }

    fn control_plane_url(&self) -> &str {
        match self {
            Self::Recorded(recorded) => &recorded.control_plane_url,
            Self::Unidentified {
                control_plane_url, ..
            } => control_plane_url,
        }
    }
}

/// A key the status names (organization and key name) without its id, whose plaintext the
/// CR's own key Secret (`status.secretRef`, controlled by the CR) holds.
async fn unidentified_key(
    cr: &CoderProvisioner,
    ctx: &Context,
    status: &CoderProvisionerStatus,
) -> Option<Target> {
    let recorded = |field: &Option<String>| field.clone().filter(|v| !v.is_empty());
    let organization_id = recorded(&status.organization_id)?;
    recorded(&status.provisioner_key_name)?;
    let secret_ref = status.secret_ref.as_ref()?;
    let secrets: Api<Secret> =
        Api::namespaced(ctx.client.clone(), &cr.namespace().unwrap_or_default());
    let secret = secrets.get_opt(&secret_ref.name).await.ok().flatten()?;
    if !gates::is_controlled_by(&secret, &cr.uid().unwrap_or_default()) {
        return None;
    }
    let data_key = secret_ref.key.as_deref().unwrap_or("key");
    let plaintext = secret
        .data
        .as_ref()?
        .get(data_key)
        .and_then(|bytes| String::from_utf8(bytes.0.clone()).ok())
        .filter(|value| !value.is_empty())?;
    Some(Target::Unidentified {
        organization_id,
        control_plane_url: recorded(&status.control_plane_url).unwrap_or_default(),
        plaintext: SecretString::new(plaintext),
    })
}

/// Deletes the target key: `Some(name)` when deleted, `None` when no such key exists any more.
async fn delete_target(
    cr: &CoderProvisioner,
    ctx: &Context,
    status: &CoderProvisionerStatus,
    target: &Target,
) -> Result<Option<String>, CleanupError> {
    let namespace = cr.namespace().unwrap_or_default();
    let control_plane_name = status
        .control_plane_ref_name
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| cr.spec.control_plane_ref.name.clone());
    let control_plane = dereference::control_plane(&ctx.client, &namespace, &control_plane_name)
        .await
        .map_err(|source| CleanupError::ControlPlaneUnreadable {
            name: control_plane_name.clone(),
            source,
        })?
        .ok_or_else(|| CleanupError::ControlPlaneGone {
            name: control_plane_name.clone(),
        })?;
    let token_secret = dereference::token_secret(&ctx.client, &namespace, Some(&control_plane))
        .await
        .map_err(CleanupError::TokenSecretUnreadable)?;
    let (token, _) = gates::operator_access(&control_plane, token_secret.as_ref())
        .map_err(|blocked| CleanupError::NoAccess(blocked.condition.message))?;
    let url = if target.control_plane_url().is_empty() {
        control_plane
            .status
            .as_ref()
            .and_then(|s| s.url.clone())
            .unwrap_or_default()
    } else {
        target.control_plane_url().to_owned()
    };
    let client = ctx.coderd(&url, &token)?;
    let key_id = match target {
        Target::Recorded(recorded) => recorded.key_id.clone(),
        Target::Unidentified { plaintext, .. } => match keys::identify(&client, plaintext).await? {
            Some(key) => key.id,
            // coderd refuses the stored key: it is gone already.
            None => return Ok(None),
        },
    };
    Ok(keys::delete_by_id(&client, target.organization_id(), &key_id).await?)
}
