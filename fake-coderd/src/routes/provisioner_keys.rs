//! §2.5 list, §2.6 create, §2.7 delete (by name) of an organization's provisioner keys, and §2.9
//! step 1, a daemon fetching its own key by `Coder-Provisioner-Daemon-Key`.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::json;

use super::Call;
use crate::api::{ApiError, Reply};
use crate::state::{KEY_SECRET_LENGTH, Organization, ProvisionerKey, State, User, equal_fold};

/// §1.6 after authentication: organization lookup (400/404), then the feature gate (403). There is
/// no permission middleware on these routes in coderd: each query is checked by the database
/// authorizer, so a user outside the organization already got the organization's 404, and a plain
/// member of it lists (read on provisioner daemons) but is refused the insert or the delete, which
/// the handlers answer 500 (see `State::create_key_as`, `State::delete_key_as`).
fn gated_organization<'s>(
    state: &'s State,
    caller: &User,
    ident: &str,
) -> Result<&'s Organization, ApiError> {
    let org = state.organization_for(caller, ident)?;
    if !state.entitlement_seen_by(Some(caller)).enabled() {
        return Err(ApiError::feature_gate());
    }
    Ok(org)
}

pub fn list(state: &State, caller: &User, org: &str) -> Result<Reply, ApiError> {
    let org = gated_organization(state, caller, org)?;
    Ok(Reply::json(200, state.list_keys(&org.id)))
}

/// `codersdk.CreateProvisionerKeyRequest`, decoded as Go's `json.Decoder` does in coderd's
/// `httpapi.Read`: only a JSON object (or `null`) fits the struct; field names match
/// case-insensitively (Unicode simple folding), later fields overwrite earlier ones, unknown fields are
/// ignored, a `null` name changes nothing, a `null` tag value is `""`, objects for `tags` merge into
/// the map, and anything after the first JSON value is not read.
#[derive(Default)]
struct CreateRequest {
    name: String,
    tags: BTreeMap<String, String>,
}

impl<'de> Deserialize<'de> for CreateRequest {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = CreateRequest;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object (codersdk.CreateProvisionerKeyRequest)")
            }

            fn visit_unit<E: serde::de::Error>(self) -> Result<CreateRequest, E> {
                Ok(CreateRequest::default())
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<CreateRequest, A::Error> {
                let mut request = CreateRequest::default();
                while let Some(key) = map.next_key::<String>()? {
                    if equal_fold(&key, "name") {
                        if let Some(name) = map.next_value::<Option<String>>()? {
                            request.name = name;
                        }
                    } else if equal_fold(&key, "tags") {
                        match map.next_value::<Option<BTreeMap<String, Option<String>>>>()? {
                            None => request.tags.clear(),
                            Some(tags) => request.tags.extend(
                                tags.into_iter()
                                    .map(|(key, value)| (key, value.unwrap_or_default())),
                            ),
                        }
                    } else {
                        map.next_value::<serde::de::IgnoredAny>()?;
                    }
                }
                Ok(request)
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

pub fn create(state: &mut State, caller: &User, org: &str, body: &[u8]) -> Result<Reply, ApiError> {
    let org_id = gated_organization(state, caller, org)?.id.clone();
    // No `end()`: like `json.Decoder.Decode`, whatever follows the first value is not read.
    let mut decoder = serde_json::Deserializer::from_slice(body);
    let request = CreateRequest::deserialize(&mut decoder)
        .map_err(|error| ApiError::invalid_json(error.to_string()))?;
    let may_create = caller.may_manage_keys_in(&org_id);
    let secret = state.create_key_as(&org_id, &request.name, request.tags, may_create)?;
    Ok(Reply::json(201, json!({ "key": secret })))
}

pub fn delete(state: &mut State, caller: &User, org: &str, name: &str) -> Result<Reply, ApiError> {
    let org_id = gated_organization(state, caller, org)?.id.clone();
    let may_delete = caller.may_manage_keys_in(&org_id);
    state.delete_key_as(&org_id, name, may_delete)?;
    Ok(Reply::empty(204))
}

/// §2.9 daemon-auth middleware rows, then the key itself. The path value is ignored, as in coderd.
/// The route's middleware is configured without the deployment's PSK
/// (`enterprise/coderd/coderd.go` route `/provisionerkeys`, `ExtractProvisionerAuthConfig{DB,
/// Optional: false}`, read at commit 00199bfcf437b2a7356c665352a4d735ed3fecaa), so
/// `ExtractProvisionerDaemonAuthenticated` (`coderd/httpmw/provisionerdaemon.go`, stored at
/// 1e9b79a7858944c3a041e3ecd32a807c6f513180) never falls back to a PSK: without a key, a PSK
/// header is answered like no credential at all.
pub fn daemon_key<'s>(state: &'s State, call: &Call) -> Result<&'s ProvisionerKey, ApiError> {
    let key = call.daemon_key.as_deref().filter(|key| !key.is_empty());
    let psk = call.daemon_psk.as_deref().filter(|psk| !psk.is_empty());
    match (key, psk) {
        (Some(_), Some(_)) => Err(ApiError::new(
            400,
            "provisioner daemon key and psk provided, but only one is allowed",
        )),
        (None, _) => Err(ApiError::new(401, "provisioner daemon key required")),
        (Some(key), None) => {
            if key.len() != KEY_SECRET_LENGTH {
                return Err(ApiError::new(400, "provisioner daemon key invalid")
                    .with_detail("must be 43 characters"));
            }
            state
                .key_by_secret(key)
                .ok_or_else(|| ApiError::new(401, "provisioner daemon key invalid"))
        }
    }
}
