//! Deletion (§12): best-effort removal of the recorded key; never blocks the finalizer.
use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use tracing::info;

use crate::api::{CoderProvisioner, CoderProvisionerStatus};

use super::context::{Context, object_key};
use super::error::{CleanupError, Error};
use super::{dereference, gates, keys};

pub async fn cleanup(cr: &CoderProvisioner, ctx: &Arc<Context>) -> Result<Action, Error> {
    let key = object_key(cr);
    ctx.failures.reset(&key);
    ctx.rate_limits.reset(&key);
    ctx.key_hold_off.clear(&key);
    let status = cr.status.clone().unwrap_or_default();
    let Some(recorded) = keys::recorded_key(&status, "") else {
        info!(provisioner = %object_key(cr), "no provisioner key recorded; nothing to clean up in coderd");
        return Ok(Action::await_change());
    };
    let key_name = status
        .provisioner_key_name
        .clone()
        .unwrap_or_else(|| "<name>".to_owned());
    let organization = status
        .organization_name
        .clone()
        .unwrap_or_else(|| recorded.organization_id.clone());
    let manual = format!("coder provisioner keys delete {key_name} --org {organization}");
    let outcome = delete_recorded_key(cr, ctx, &status, &recorded).await;
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

/// Deletes the recorded key: `Some(name)` when deleted, `None` when no key has its id any more.
async fn delete_recorded_key(
    cr: &CoderProvisioner,
    ctx: &Context,
    status: &CoderProvisionerStatus,
    recorded: &keys::RecordedKey,
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
    let url = if recorded.control_plane_url.is_empty() {
        control_plane
            .status
            .as_ref()
            .and_then(|s| s.url.clone())
            .unwrap_or_default()
    } else {
        recorded.control_plane_url.clone()
    };
    let client = ctx.coderd(&url, &token)?;
    Ok(keys::delete_by_id(&client, &recorded.organization_id, &recorded.key_id).await?)
}
