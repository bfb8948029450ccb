//! The admin HTTP API (under `/__fake/`, on its own listener, `Authorization: Bearer <admin token>`):
//! the Rust control operations for fakes running in another process. Admin requests are not journaled.
//! `AdminClient` is its Rust client.

mod client;

pub use client::AdminClient;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use wiremock::matchers::any;
use wiremock::{Mock, Request, Respond, ResponseTemplate};

use crate::api::Reply;
use crate::error::Error;
use crate::faults::FaultSpec;
use crate::ratelimit::RateLimitSpec;
use crate::seed::SeedUser;
use crate::state::Entitlement;
use crate::world::{Shared, World};

pub const PREFIX: &str = "/__fake";
/// The admin thread waits at most this long for the coderd listener to close or reopen.
const REACHABILITY_WAIT: Duration = Duration::from_secs(15);

/// `PATCH /__fake/deployment`: fields left out are unchanged.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DeploymentPatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entitlement: Option<Entitlement>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub has_license: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entitlements_require_token: Option<bool>,
    /// `false` = AGPL coderd without the enterprise routes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enterprise: Option<bool>,
}

/// `GET /__fake/info`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct FakeInfo {
    pub coderd_url: String,
    pub operator_token: String,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct NewOrganization {
    pub name: String,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct NewKey {
    pub name: String,
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Reachability {
    pub unreachable: bool,
}

/// Answer of `POST /__fake/users`.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct SessionToken {
    pub token: String,
}

/// Answer of `POST /__fake/organizations/{org}/keys`.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct KeySecret {
    pub key: String,
}

struct AdminResponder {
    shared: Arc<Shared>,
    token: String,
    coderd_url: String,
}

fn error(status: u16, message: impl Into<String>) -> Reply {
    Reply::json(status, json!({ "message": message.into() }))
}

fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, Reply> {
    serde_json::from_slice(body)
        .map_err(|decode| error(400, format!("invalid request body: {decode}")))
}

fn done(outcome: Result<(), Error>) -> Reply {
    match outcome {
        Ok(()) => Reply::empty(204),
        Err(refused) => error(400, refused.to_string()),
    }
}

fn json_or_400<T: Serialize>(outcome: Result<T, Error>) -> Reply {
    match outcome {
        Ok(value) => Reply::json(200, value),
        Err(refused) => error(400, refused.to_string()),
    }
}

impl AdminResponder {
    fn authorized(&self, request: &Request) -> bool {
        request
            .headers
            .get("authorization")
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .is_some_and(|token| token == self.token)
    }

    fn set_unreachable(&self, unreachable: bool) -> Reply {
        let (sender, receiver) = std::sync::mpsc::channel();
        self.shared.request_reachability(
            unreachable,
            Box::new(move |outcome| {
                let _ = sender.send(outcome);
            }),
        );
        match receiver.recv_timeout(REACHABILITY_WAIT) {
            Ok(outcome) => done(outcome),
            Err(_) => error(
                500,
                format!("the coderd listener did not change within {REACHABILITY_WAIT:?}"),
            ),
        }
    }

    fn route(&self, request: &Request) -> Result<Reply, Reply> {
        let path = request
            .url
            .path()
            .strip_prefix(PREFIX)
            .unwrap_or("<outside the admin prefix>");
        let decoded: Vec<String> = path
            .trim_start_matches('/')
            .split('/')
            .map(|segment| {
                percent_encoding::percent_decode_str(segment)
                    .decode_utf8_lossy()
                    .into_owned()
            })
            .collect();
        let segments: Vec<&str> = decoded.iter().map(String::as_str).collect();
        let body = request.body.as_slice();
        let with_world =
            |operation: &dyn Fn(&mut World) -> Reply| operation(&mut self.shared.lock());
        let reply = match (request.method.as_str(), segments.as_slice()) {
            ("GET", ["info"]) => Reply::json(
                200,
                FakeInfo {
                    coderd_url: self.coderd_url.clone(),
                    operator_token: self.shared.lock().operator_token().to_string(),
                },
            ),
            ("POST", ["reset"]) => with_world(&|world| done(world.reset())),
            ("PATCH", ["deployment"]) => {
                let patch: DeploymentPatch = parse(body)?;
                with_world(&|world| {
                    if let Some(entitlement) = patch.entitlement {
                        world.set_entitlement(entitlement);
                    }
                    if let Some(has_license) = patch.has_license {
                        world.set_license(has_license);
                    }
                    if let Some(require) = patch.entitlements_require_token {
                        world.set_entitlements_require_token(require);
                    }
                    if let Some(enterprise) = patch.enterprise {
                        world.set_enterprise(enterprise);
                    }
                    Reply::empty(204)
                })
            }
            ("GET", ["organizations"]) => {
                with_world(&|world| Reply::json(200, world.state.organizations()))
            }
            ("POST", ["organizations"]) => {
                let new: NewOrganization = parse(body)?;
                with_world(&|world| json_or_400(world.add_organization(&new.name)))
            }
            ("POST", ["users"]) => {
                let user: SeedUser = parse(body)?;
                with_world(&|world| {
                    json_or_400(world.add_user(&user).map(|token| SessionToken { token }))
                })
            }
            ("POST", ["faults"]) => {
                let fault: FaultSpec = parse(body)?;
                with_world(&|world| done(world.inject_fault(fault.clone())))
            }
            ("DELETE", ["faults"]) => with_world(&|world| {
                world.clear_faults();
                Reply::empty(204)
            }),
            ("DELETE", ["faults", fingerprint]) => with_world(&|world| {
                world.clear_faults_for(fingerprint);
                Reply::empty(204)
            }),
            ("PUT", ["rate-limit"]) => {
                let spec: Option<RateLimitSpec> = parse(body)?;
                with_world(&|world| {
                    world.set_rate_limit(spec.clone());
                    Reply::empty(204)
                })
            }
            ("PUT", ["reachability"]) => {
                let reachability: Reachability = parse(body)?;
                self.set_unreachable(reachability.unreachable)
            }
            ("GET", ["organizations", org, "keys"]) => {
                with_world(&|world| json_or_400(world.keys(org)))
            }
            ("POST", ["organizations", org, "keys"]) => {
                let new: NewKey = parse(body)?;
                with_world(&|world| {
                    json_or_400(
                        world
                            .create_key_directly(org, &new.name, new.tags.clone())
                            .map(|key| KeySecret { key }),
                    )
                })
            }
            ("DELETE", ["organizations", org, "keys", id]) => {
                with_world(&|world| done(world.delete_key_directly(org, id)))
            }
            ("GET", ["journal"]) => {
                let since = match request
                    .url
                    .query_pairs()
                    .find(|(key, _)| key == "since")
                    .map(|(_, value)| value.parse::<u64>())
                {
                    None => 0,
                    Some(Ok(since)) => since,
                    Some(Err(parse)) => return Err(error(400, format!("since: {parse}"))),
                };
                with_world(&|world| Reply::json(200, world.journal_since(since)))
            }
            ("DELETE", ["journal"]) => with_world(&|world| {
                world.clear_journal();
                Reply::empty(204)
            }),
            _ => error(
                404,
                format!(
                    "unknown admin route {} {}",
                    request.method,
                    request.url.path()
                ),
            ),
        };
        Ok(reply)
    }
}

impl Respond for AdminResponder {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        if !self.authorized(request) {
            return error(
                401,
                "admin token required: send 'Authorization: Bearer <admin token>'",
            )
            .into_template();
        }
        self.route(request)
            .unwrap_or_else(|reply| reply)
            .into_template()
    }
}

/// The single admin mock: every request on the admin listener goes to the admin router.
pub fn mock(shared: Arc<Shared>, token: String, coderd_url: String) -> Mock {
    Mock::given(any()).respond_with(AdminResponder {
        shared,
        token,
        coderd_url,
    })
}

/// Used by the admin client to decode `{"message": ...}` error bodies.
pub(crate) fn error_message(body: &str) -> String {
    serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|value| {
            value
                .get("message")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .unwrap_or_else(|| body.to_string())
}
