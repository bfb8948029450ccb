//! §2.5 list, §2.6 create, §2.7 delete (by name) of an organization's provisioner keys, and §2.9
//! step 1, a daemon fetching its own key by `Coder-Provisioner-Daemon-Key`.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::json;

use super::Call;
use crate::api::{ApiError, Reply};
use crate::state::{KEY_SECRET_LENGTH, Organization, State, User};

/// §1.6 after authentication: organization lookup (400/404), feature gate (403), then permission.
/// Owners and the organization's admins may manage keys (coderd RBAC); a user outside the
/// organization already got the organization's 404; a plain member gets the §1.5 forbidden answer.
fn gated_organization<'s>(
    state: &'s State,
    caller: &User,
    ident: &str,
) -> Result<&'s Organization, ApiError> {
    let org = state.organization_for(caller, ident)?;
    if !state.entitlement.enabled() {
        return Err(ApiError::feature_gate());
    }
    if !caller.may_manage_keys_in(&org.id) {
        return Err(ApiError::forbidden());
    }
    Ok(org)
}

pub fn list(state: &State, caller: &User, org: &str) -> Result<Reply, ApiError> {
    let org = gated_organization(state, caller, org)?;
    Ok(Reply::json(200, state.list_keys(&org.id)))
}

/// `codersdk.CreateProvisionerKeyRequest`; unknown fields are ignored and `null` means empty, as Go decodes.
#[derive(Deserialize)]
struct CreateRequest {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    tags: Option<BTreeMap<String, String>>,
}

pub fn create(state: &mut State, caller: &User, org: &str, body: &[u8]) -> Result<Reply, ApiError> {
    let org_id = gated_organization(state, caller, org)?.id.clone();
    let request: CreateRequest =
        serde_json::from_slice(body).map_err(|error| ApiError::invalid_json(error.to_string()))?;
    let secret = state.create_key(
        &org_id,
        &request.name.unwrap_or_default(),
        request.tags.unwrap_or_default(),
    )?;
    Ok(Reply::json(201, json!({ "key": secret })))
}

pub fn delete(state: &mut State, caller: &User, org: &str, name: &str) -> Result<Reply, ApiError> {
    let org_id = gated_organization(state, caller, org)?.id.clone();
    state.delete_key(&org_id, name)?;
    Ok(Reply::empty(204))
}

/// §2.9 daemon-auth middleware rows, then the key itself. The path value is ignored, as in coderd.
pub fn daemon_key(state: &State, call: &Call) -> Result<Reply, ApiError> {
    let key = call.daemon_key.as_deref().filter(|key| !key.is_empty());
    let psk = call.daemon_psk.as_deref().filter(|psk| !psk.is_empty());
    match (key, psk) {
        (Some(_), Some(_)) => Err(ApiError::new(
            400,
            "provisioner daemon key and psk provided, but only one is allowed",
        )),
        (None, Some(psk)) if state.daemon_psk.is_some() => {
            if state.daemon_psk.as_deref() != Some(psk) {
                return Err(ApiError::new(401, "provisioner daemon psk invalid"));
            }
            // A PSK-authenticated daemon has no key to show; the spec does not pin this answer.
            Err(ApiError::resource_not_found())
        }
        (None, _) => Err(ApiError::new(401, "provisioner daemon key required")),
        (Some(key), None) => {
            if key.len() != KEY_SECRET_LENGTH {
                return Err(ApiError::new(400, "provisioner daemon key invalid")
                    .with_detail("must be 43 characters"));
            }
            let view = state
                .key_by_secret(key)
                .ok_or_else(|| ApiError::new(401, "provisioner daemon key invalid"))?;
            Ok(Reply::json(200, view))
        }
    }
}
