//! The admin HTTP API (under `/__fake/`, on its own listener, `Authorization: Bearer <admin token>`):
//! the Rust control operations for fakes running in another process. Admin requests are not journaled.
//! `AdminClient` is its Rust client.
//!
//! It is a small axum server rather than a wiremock mock: closing or reopening the coderd listener
//! takes a while, and wiremock's `Respond` is synchronous, so a mock would have to block a thread
//! until it is done; an axum handler awaits it.

mod client;

pub use client::AdminClient;

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method, Uri, header};
use axum::response::Response;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::api::Reply;
use crate::error::Error;
use crate::faults::FaultSpec;
use crate::listener::CoderdListener;
use crate::ratelimit::RateLimitSpec;
use crate::seed::SeedUser;
use crate::state::Entitlement;
use crate::version::CoderdVersion;
use crate::world::World;

pub const PREFIX: &str = "/__fake";

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
    /// The coderd release the fake models (`--coderd-version`).
    pub coderd_version: CoderdVersion,
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

struct Admin {
    /// Weak, so that dropping the `FakeCoderd` closes the coderd listener even while an admin
    /// connection is kept alive.
    coderd: Weak<CoderdListener>,
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

fn authorized(headers: &HeaderMap, token: &str) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .is_some_and(|sent| sent == token)
}

/// `?since=<seq>` of `GET /__fake/journal`, 0 when absent.
fn journal_cursor(uri: &Uri) -> Result<u64, Reply> {
    let Query(pairs) = Query::<Vec<(String, String)>>::try_from_uri(uri)
        .map_err(|rejection| error(400, rejection.body_text()))?;
    match pairs.into_iter().find(|(key, _)| key == "since") {
        None => Ok(0),
        Some((_, value)) => value
            .parse()
            .map_err(|parse| error(400, format!("since: {parse}"))),
    }
}

async fn route(
    admin: &Admin,
    coderd: &CoderdListener,
    method: &Method,
    uri: &Uri,
    body: &[u8],
) -> Result<Reply, Reply> {
    let path = uri
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
    let shared = coderd.shared();
    let with_world = |operation: &dyn Fn(&mut World) -> Reply| operation(&mut shared.lock());
    let reply = match (method.as_str(), segments.as_slice()) {
        ("GET", ["info"]) => with_world(&|world| {
            Reply::json(
                200,
                FakeInfo {
                    coderd_url: admin.coderd_url.clone(),
                    operator_token: world.operator_token().to_string(),
                    coderd_version: world.coderd_version,
                },
            )
        }),
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
        ("PATCH", ["organizations", org]) => {
            let renamed: NewOrganization = parse(body)?;
            with_world(&|world| json_or_400(world.rename_organization(org, &renamed.name)))
        }
        ("POST", ["users"]) => {
            let user: SeedUser = parse(body)?;
            with_world(&|world| {
                json_or_400(world.add_user(&user).map(|token| SessionToken { token }))
            })
        }
        ("GET", ["users", user]) => with_world(&|world| json_or_400(world.user(user))),
        ("PUT", ["users", user, "entitlement"]) => {
            let entitlement: Option<Entitlement> = parse(body)?;
            with_world(&|world| done(world.set_user_entitlement(user, entitlement)))
        }
        ("POST", ["faults"]) => {
            let fault: FaultSpec = parse(body)?;
            done(coderd.inject_fault(fault))
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
            match coderd.set_unreachable(reachability.unreachable).await {
                Ok(()) => Reply::empty(204),
                Err(failure) => error(500, failure.to_string()),
            }
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
            let since = journal_cursor(uri)?;
            with_world(&|world| Reply::json(200, world.journal_since(since)))
        }
        ("DELETE", ["journal"]) => with_world(&|world| {
            world.clear_journal();
            Reply::empty(204)
        }),
        _ => error(404, format!("unknown admin route {method} {}", uri.path())),
    };
    Ok(reply)
}

/// Every admin request: token check, then the route.
async fn handle(
    State(admin): State<Arc<Admin>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let reply = if !authorized(&headers, &admin.token) {
        error(
            401,
            "admin token required: send 'Authorization: Bearer <admin token>'",
        )
    } else if let Some(coderd) = admin.coderd.upgrade() {
        route(&admin, &coderd, &method, &uri, &body)
            .await
            .unwrap_or_else(|reply| reply)
    } else {
        error(503, Error::ShuttingDown.to_string())
    };
    into_response(reply)
}

fn into_response(reply: Reply) -> Response {
    let mut response = Response::builder().status(reply.status);
    let body = match reply.encoded_body() {
        Some((bytes, content_type)) => {
            response = response.header(header::CONTENT_TYPE, content_type);
            Body::from(bytes)
        }
        None => Body::empty(),
    };
    for (name, value) in &reply.headers {
        response = response.header(name.as_str(), value.as_str());
    }
    response.body(body).unwrap_or_else(|build| {
        let mut failed = Response::new(Body::from(build.to_string()));
        *failed.status_mut() = axum::http::StatusCode::INTERNAL_SERVER_ERROR;
        failed
    })
}

/// Serves the admin API on `listener` until `shutdown` fires or its sender is dropped.
pub(crate) fn serve(
    listener: tokio::net::TcpListener,
    coderd: Weak<CoderdListener>,
    token: String,
    coderd_url: String,
    shutdown: oneshot::Receiver<()>,
) {
    let admin = Arc::new(Admin {
        coderd,
        token,
        coderd_url,
    });
    let app = axum::Router::new().fallback(handle).with_state(admin);
    tokio::spawn(async move {
        let stopped = axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = shutdown.await;
            })
            .await;
        if let Err(failure) = stopped {
            tracing::warn!(%failure, "admin API stopped");
        }
    });
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
