//! The coderd routes (coderd-api.md §2.1–§2.7, §2.9 step 1) behind one wiremock `Mock`, and the
//! request pipeline they share: faults → router (`router`) → rate limiter → middleware precedence
//! of §1.6 → handler, or the router's 404/405 → journal. Each fault is a `Mock` of its own, ahead
//! of the router.

mod buildinfo;
mod entitlements;
mod organizations;
mod provisioner_keys;
mod router;
pub(crate) mod templates;
mod users;

pub use router::{Guard, Routed, route, routing_path};
pub use templates::*;

use std::sync::Arc;
use std::time::Duration;

use percent_encoding::percent_decode_str;
use wiremock::{Match, Mock, Request, Respond, ResponseTemplate};

use crate::api::{ApiError, Reply, ReplyBody};
use crate::faults::{FaultId, FaultKind, FaultSpec};
use crate::journal::{JournalEntry, REDACTED, fingerprint, redact_body};
use crate::ratelimit::{BYPASS_HEADER, Caller, Verdict, unix_now_ms};
use crate::state::User;
use crate::world::{Shared, World};

pub const SESSION_TOKEN_HEADER: &str = "Coder-Session-Token";
pub const SESSION_TOKEN_COOKIE: &str = "coder_session_token";
pub const DAEMON_KEY_HEADER: &str = "Coder-Provisioner-Daemon-Key";
pub const DAEMON_PSK_HEADER: &str = "Coder-Provisioner-Daemon-PSK";
/// Marks a request of an observer (a test's own check, e.g. "does this key authenticate"), not
/// of the client under test: no injected fault applies to it, and its journal entry says
/// `observer: true`, so a check never consumes the fault a test injected for the client.
/// Not a coderd header: coderd ignores it.
pub const OBSERVER_HEADER: &str = "Fake-Coderd-Observer";
/// Shorter header values are not searched for in paths (they would match ordinary words).
const MIN_REDACTED_SECRET_LENGTH: usize = 8;
/// wiremock tries mocks by ascending priority number, and in registration order within one: faults
/// come before the router, the first injected first.
const FAULT_PRIORITY: u8 = 1;
const ROUTER_PRIORITY: u8 = 5;

/// One coderd endpoint: a method on a route template.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    BuildInfo,
    User,
    Organization,
    Entitlements,
    ListKeys,
    CreateKey,
    DeleteKey,
    DaemonKey,
}

impl Endpoint {
    pub const ALL: [Endpoint; 8] = [
        Endpoint::BuildInfo,
        Endpoint::User,
        Endpoint::Organization,
        Endpoint::Entitlements,
        Endpoint::ListKeys,
        Endpoint::CreateKey,
        Endpoint::DeleteKey,
        Endpoint::DaemonKey,
    ];

    /// Registered only by the enterprise router (§1.1): absent from an AGPL coderd.
    pub fn is_enterprise_only(self) -> bool {
        matches!(
            self,
            Endpoint::Entitlements
                | Endpoint::ListKeys
                | Endpoint::CreateKey
                | Endpoint::DeleteKey
                | Endpoint::DaemonKey
        )
    }

    pub fn method(self) -> &'static str {
        match self {
            Endpoint::CreateKey => "POST",
            Endpoint::DeleteKey => "DELETE",
            _ => "GET",
        }
    }

    pub fn template(self) -> &'static str {
        match self {
            Endpoint::BuildInfo => BUILD_INFO,
            Endpoint::User => USER,
            Endpoint::Organization => ORGANIZATION,
            Endpoint::Entitlements => ENTITLEMENTS,
            Endpoint::ListKeys | Endpoint::CreateKey => PROVISIONER_KEYS,
            Endpoint::DeleteKey => DELETE_KEY,
            Endpoint::DaemonKey => DAEMON_KEY,
        }
    }
}

/// The parts of a request the handlers look at.
pub struct Call {
    pub method: String,
    /// The path as sent; routing decodes and normalises it ([`routing_path`]).
    pub raw_path: String,
    /// Session token from cookie, then query parameter, then header (§1.2).
    pub session_token: Option<String>,
    pub daemon_key: Option<String>,
    pub daemon_psk: Option<String>,
    pub bypass: Option<String>,
    /// Sent with [`OBSERVER_HEADER`].
    pub observer: bool,
    pub body: Vec<u8>,
    /// The percent-decoded path, as Go's `r.URL.Path` (the rate limiter's endpoint key). May hold
    /// a daemon key: never log or journal it.
    pub decoded_path: String,
    /// Path and query with secrets redacted, for the journal and logs.
    pub redacted_path: String,
}

fn header(request: &Request, name: &str) -> Option<String> {
    request
        .headers
        .get(name)
        .and_then(|value| value.to_str().ok())
        .map(str::to_string)
}

fn is_observer(request: &Request) -> bool {
    request.headers.contains_key(OBSERVER_HEADER)
}

fn cookie(request: &Request, name: &str) -> Option<String> {
    request
        .headers
        .get_all("cookie")
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.to_string())
}

/// The daemon key travels in the path of §2.9 step 1 (whatever the method), the session token may
/// travel in the query: neither reaches the journal or the log. The key is found where routing
/// finds it, in the decoded path with slashes collapsed: `/api/v2/provisioner%6Beys/KEY`,
/// `//api/v2/provisionerkeys/KEY` and `/api/v2/provisionerkeys%2FKEY` are journaled as
/// `/api/v2/provisionerkeys/<redacted>`; any secret header value left in the path or query is
/// replaced as well.
fn redacted_path(request: &Request) -> String {
    let path = request.url.path();
    let routing = routing_path(path);
    let segments: Vec<&str> = routing.split('/').collect();
    let keys_index = segments
        .iter()
        .position(|segment| segment.eq_ignore_ascii_case("provisionerkeys"));
    let mut redacted = match (segments.as_slice(), keys_index) {
        (["", api, v2, ..], Some(3))
            if api.eq_ignore_ascii_case("api")
                && v2.eq_ignore_ascii_case("v2")
                && segments[4..].iter().any(|segment| !segment.is_empty()) =>
        {
            format!("{}/{REDACTED}", segments[..4].join("/"))
        }
        _ => path.to_string(),
    };
    if request.url.query().is_some() {
        let pairs: Vec<String> = request
            .url
            .query_pairs()
            .map(|(key, value)| {
                if key == SESSION_TOKEN_COOKIE {
                    format!("{key}={REDACTED}")
                } else {
                    format!("{key}={value}")
                }
            })
            .collect();
        redacted = format!("{redacted}?{}", pairs.join("&"));
    }
    let secrets = [DAEMON_KEY_HEADER, DAEMON_PSK_HEADER, SESSION_TOKEN_HEADER]
        .into_iter()
        .filter_map(|name| header(request, name))
        .chain(cookie(request, SESSION_TOKEN_COOKIE))
        .filter(|secret| secret.len() >= MIN_REDACTED_SECRET_LENGTH);
    for secret in secrets {
        if !redacted.contains(&secret) {
            let decoded = percent_decode_str(&redacted)
                .decode_utf8_lossy()
                .into_owned();
            if decoded.contains(&secret) {
                redacted = decoded;
            }
        }
        redacted = redacted.replace(&secret, REDACTED);
    }
    redacted
}

/// The session token from cookie, then query parameter, then header (§1.2). coderd
/// `httpmw/apikey.go` `APITokenFromRequest`: an empty value falls through to the next source.
fn session_token(request: &Request) -> Option<String> {
    let query_token = request
        .url
        .query_pairs()
        .find(|(key, _)| key == SESSION_TOKEN_COOKIE)
        .map(|(_, value)| value.into_owned());
    let present = |token: &String| !token.is_empty();
    cookie(request, SESSION_TOKEN_COOKIE)
        .filter(present)
        .or(query_token.filter(present))
        .or_else(|| header(request, SESSION_TOKEN_HEADER).filter(present))
}

impl Call {
    pub fn from_request(request: &Request) -> Call {
        Call {
            method: request.method.as_str().to_string(),
            raw_path: request.url.path().to_string(),
            session_token: session_token(request),
            daemon_key: header(request, DAEMON_KEY_HEADER),
            daemon_psk: header(request, DAEMON_PSK_HEADER),
            bypass: header(request, BYPASS_HEADER),
            observer: is_observer(request),
            body: request.body.clone(),
            decoded_path: percent_decode_str(request.url.path())
                .decode_utf8_lossy()
                .into_owned(),
            redacted_path: redacted_path(request),
        }
    }

    /// Where coderd's router sends this request.
    fn routed(&self, enterprise: bool) -> Routed {
        route(&self.method, &self.raw_path, enterprise)
    }
}

fn param(params: &[String], index: usize) -> &str {
    params.get(index).map(String::as_str).unwrap_or_default()
}

/// The handler of an endpoint, after faults and the rate limiter. Each handler enforces the
/// session (`ExtractAPIKeyMW`, which also wakes a dormant user) or not, in the order of §1.6.
fn dispatch(
    world: &mut World,
    endpoint: Endpoint,
    params: &[String],
    call: &Call,
) -> Result<Reply, ApiError> {
    let state = &mut world.state;
    let token = call.session_token.as_deref();
    let first = param(params, 0);
    match endpoint {
        Endpoint::BuildInfo => Ok(buildinfo::get(world.coderd_version)),
        Endpoint::Entitlements => entitlements::get(state, token),
        Endpoint::DaemonKey => {
            provisioner_keys::daemon_key(state, call).map(|key| Reply::json(200, key))
        }
        Endpoint::User => {
            let caller = state.authenticate_session(token)?;
            users::get(state, &caller, first)
        }
        Endpoint::Organization => {
            let caller = state.authenticate_session(token)?;
            organizations::get(state, &caller, first)
        }
        Endpoint::ListKeys => {
            let caller = state.authenticate_session(token)?;
            provisioner_keys::list(state, &caller, first)
        }
        Endpoint::CreateKey => {
            let caller = state.authenticate_session(token)?;
            provisioner_keys::create(state, &caller, first, &call.body)
        }
        Endpoint::DeleteKey => {
            let caller = state.authenticate_session(token)?;
            provisioner_keys::delete(state, &caller, first, param(params, 1))
        }
    }
}

/// The middleware a subrouter runs before its 404 or 405, in order; the first refusal answers.
fn pass_guards(world: &mut World, call: &Call, guards: &[Guard]) -> Result<(), ApiError> {
    let state = &mut world.state;
    let mut caller = None;
    let mut organization_id = String::new();
    for guard in guards {
        match guard {
            Guard::Session => {
                caller = Some(state.authenticate_session(call.session_token.as_deref())?);
            }
            Guard::Organization(ident) => {
                // Always after `Session` in coderd's trees: the organization needs the caller.
                let user = match caller.take() {
                    Some(user) => user,
                    None => state.authenticate_session(call.session_token.as_deref())?,
                };
                organization_id = state.organization_for(&user, ident)?.id.clone();
                caller = Some(user);
            }
            Guard::FeatureGate => {
                if !state.entitlement_seen_by(caller.as_ref()).enabled() {
                    return Err(ApiError::feature_gate());
                }
            }
            Guard::ProvisionerKey(name) => {
                state.key_named(&organization_id, name)?;
            }
            Guard::DaemonKey => {
                provisioner_keys::daemon_key(state, call)?;
            }
        }
    }
    Ok(())
}

/// chi's default 405: no body, one `Allow` header per method.
fn method_not_allowed(allowed: &[&str]) -> Reply {
    allowed.iter().fold(Reply::empty(405), |reply, method| {
        reply.with_header("Allow", *method)
    })
}

/// Router, rate limiter, then the endpoint (or the router's 404 or 405). Returns the endpoint that
/// served the request, if one did.
fn handle(world: &mut World, call: &Call) -> (Option<Endpoint>, Reply) {
    let routed = call.routed(world.state.enterprise);
    let endpoint = match &routed {
        Routed::Endpoint(endpoint, _) => Some(*endpoint),
        Routed::MethodNotAllowed { .. } | Routed::NotFound { .. } => None,
    };
    let user = world
        .state
        .authenticate(call.session_token.as_deref())
        .cloned();
    let caller = Caller {
        method: &call.method,
        route: endpoint.map(Endpoint::template),
        path: &call.decoded_path,
        user_id: user.as_ref().ok().map(|user| user.id.as_str()),
        is_owner: user.as_ref().is_ok_and(User::is_owner),
        bypass_header: call.bypass.as_deref(),
    };
    let rate_headers = match world.limiter.check(&caller, unix_now_ms()) {
        Verdict::Allow(headers) => headers,
        Verdict::Limited(reply) | Verdict::BypassRefused(reply) => return (endpoint, reply),
    };
    let mut reply = match routed {
        Routed::Endpoint(endpoint, params) => {
            dispatch(world, endpoint, &params, call).unwrap_or_else(Reply::from)
        }
        Routed::MethodNotAllowed { guards, allowed } => match pass_guards(world, call, &guards) {
            Ok(()) => method_not_allowed(&allowed),
            Err(refused) => refused.into(),
        },
        Routed::NotFound { guards } => match pass_guards(world, call, &guards) {
            Ok(()) => ApiError::route_not_found().into(),
            Err(refused) => refused.into(),
        },
    };
    reply.headers.extend(rate_headers);
    (endpoint, reply)
}

/// The routes an enterprise coderd serves; an AGPL one lacks the enterprise-only ones (§1.1).
fn served(world: &World, endpoint: Endpoint) -> bool {
    world.state.enterprise || !endpoint.is_enterprise_only()
}

/// Journals the request with the answer it got, and stamps the build version every answer carries.
fn finish(world: &mut World, endpoint: Option<Endpoint>, call: &Call, reply: Reply) -> Reply {
    let authenticated_key_id = match (&reply.body, endpoint) {
        (ReplyBody::Json(body), Some(Endpoint::DaemonKey)) if reply.status == 200 => body
            .get("id")
            .and_then(|id| id.as_str())
            .map(str::to_string),
        _ => None,
    };
    let entry = journal_entry(
        world,
        call,
        endpoint.map(Endpoint::template),
        reply.status,
        authenticated_key_id,
    );
    world.journal.record(entry);
    reply.with_header(
        "X-Coder-Build-Version",
        world.coderd_version.build_version(),
    )
}

/// The whole pipeline for a request no fault claimed.
pub fn serve(world: &mut World, call: &Call) -> Reply {
    let (endpoint, reply) = handle(world, call);
    finish(world, endpoint, call, reply)
}

fn journal_entry(
    world: &World,
    call: &Call,
    route: Option<&str>,
    status: u16,
    authenticated_key_id: Option<String>,
) -> JournalEntry {
    let key_organization_id = call
        .daemon_key
        .as_deref()
        .filter(|key| !key.is_empty())
        .and_then(|key| world.state.key_by_secret(key))
        .map(|key| key.organization.clone());
    tracing::info!(method = %call.method, path = %call.redacted_path, status, "coderd request");
    JournalEntry {
        seq: 0,
        at: String::new(),
        method: call.method.clone(),
        path: call.redacted_path.clone(),
        route: route.map(str::to_string),
        status,
        session_token_fingerprint: call.session_token.as_deref().map(fingerprint),
        daemon_key_fingerprint: call
            .daemon_key
            .as_deref()
            .filter(|key| !key.is_empty())
            .map(fingerprint),
        bypass_ratelimit: call.bypass.clone(),
        body: redact_body(&call.body),
        authenticated_key_id,
        key_organization_id,
        observer: call.observer,
    }
}

/// wiremock matcher: the request is for this endpoint (as an enterprise coderd routes it; whether
/// the endpoint is served is [`FaultInForce`]'s question).
struct RouteIs(Endpoint);

impl Match for RouteIs {
    fn matches(&self, request: &Request) -> bool {
        matches!(
            route(request.method.as_str(), request.url.path(), true),
            Routed::Endpoint(found, _) if found == self.0
        )
    }
}

/// wiremock responder for every request no fault claimed: the router and the endpoints over the
/// shared world.
struct Router {
    shared: Arc<Shared>,
}

impl Respond for Router {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let call = Call::from_request(request);
        serve(&mut self.shared.lock(), &call).into_template()
    }
}

/// The coderd mock: every request reaches the router, after any fault.
pub fn mocks(shared: &Arc<Shared>) -> Vec<Mock> {
    vec![
        Mock::given(wiremock::matchers::any())
            .respond_with(Router {
                shared: Arc::clone(shared),
            })
            .with_priority(ROUTER_PRIORITY),
    ]
}

/// wiremock matcher: the request is not an observer's ([`OBSERVER_HEADER`]), so faults pass
/// observers by.
struct NotObserved;

impl Match for NotObserved {
    fn matches(&self, request: &Request) -> bool {
        !is_observer(request)
    }
}

/// wiremock matcher: the request's session token has this fingerprint, or (with
/// `key_organization`) its daemon key is a key of that organization.
struct CallerScope {
    fingerprint: String,
    key_organization: Option<String>,
    shared: Arc<Shared>,
}

impl Match for CallerScope {
    fn matches(&self, request: &Request) -> bool {
        if session_token(request).is_some_and(|token| fingerprint(&token) == self.fingerprint) {
            return true;
        }
        let Some(organization) = &self.key_organization else {
            return false;
        };
        let Some(key) = header(request, DAEMON_KEY_HEADER).filter(|key| !key.is_empty()) else {
            return false;
        };
        let world = self.shared.lock();
        world
            .state
            .key_by_secret(&key)
            .is_some_and(|found| found.organization.eq_ignore_ascii_case(organization))
    }
}

/// wiremock matcher that reads the world: the fault is still in force (not cleared, not used up,
/// armed by its `after` trigger if it has one) and its endpoint is served (an AGPL coderd has no
/// enterprise route to fault). Clearing works through this read because wiremock 0.6 cannot
/// safely unmount one mock (see the README).
struct FaultInForce {
    id: FaultId,
    endpoint: Endpoint,
    shared: Arc<Shared>,
}

impl Match for FaultInForce {
    fn matches(&self, _: &Request) -> bool {
        let mut world = self.shared.lock();
        let world = &mut *world;
        world.faults.is_in_force(self.id, world.journal.entries()) && served(world, self.endpoint)
    }
}

/// What a `status` or `delay` fault answers.
enum FaultAnswer {
    /// The fault's answer instead of the real one, after running the request when `apply_first`.
    Replace {
        status: u16,
        body: Option<serde_json::Value>,
        apply_first: bool,
    },
    /// The real answer, held back.
    Delay(Duration),
    /// The real answer, with the legacy §2.3 body if it is an organization's 404.
    LegacyOrganizationNotFound,
}

/// The `legacy_organization_not_found` fault: an organization 404 (the organization is unknown
/// or hidden from the authenticated caller) gets coderd's pre-PR-#13629 two-object body, headers
/// kept; any other answer is left alone.
fn with_legacy_organization_body(world: &World, call: &Call, reply: Reply) -> Reply {
    if reply.status != 404 {
        return reply;
    }
    let Routed::Endpoint(_, params) = call.routed(world.state.enterprise) else {
        return reply;
    };
    let ident = param(&params, 0);
    let organization_hidden = world
        .state
        .authenticate(call.session_token.as_deref())
        .is_ok_and(|user| {
            world
                .state
                .organization_for(user, ident)
                .is_err_and(|error| error.status == 404)
        });
    if !organization_hidden {
        return reply;
    }
    let mut legacy = Reply::from(ApiError::legacy_organization_not_found(ident));
    legacy.headers = reply.headers;
    legacy
}

/// wiremock responder of a `status` or `delay` fault.
struct FaultResponder {
    id: FaultId,
    endpoint: Endpoint,
    answer: FaultAnswer,
    shared: Arc<Shared>,
}

impl Respond for FaultResponder {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let call = Call::from_request(request);
        let mut world = self.shared.lock();
        world.faults.used(self.id);
        let endpoint = Some(self.endpoint);
        let reply = match &self.answer {
            FaultAnswer::Replace {
                status,
                body,
                apply_first,
            } => {
                if *apply_first {
                    handle(&mut world, &call);
                }
                FaultSpec::reply(*status, body)
            }
            FaultAnswer::Delay(_) => handle(&mut world, &call).1,
            FaultAnswer::LegacyOrganizationNotFound => {
                let reply = handle(&mut world, &call).1;
                with_legacy_organization_body(&world, &call, reply)
            }
        };
        let template = finish(&mut world, endpoint, &call, reply).into_template();
        match self.answer {
            // wiremock waits out the delay after this returns, holding neither a thread nor the world.
            FaultAnswer::Delay(delay) => template.set_delay(delay),
            FaultAnswer::Replace { .. } | FaultAnswer::LegacyOrganizationNotFound => template,
        }
    }
}

/// The mock of one injected fault: ahead of the routes by priority, ended by `up_to_n_times` when
/// counted. `None` when no endpoint serves the fault's method on its route: it can never fire.
pub fn fault_mock(shared: &Arc<Shared>, id: FaultId, spec: &FaultSpec) -> Option<Mock> {
    let endpoint = Endpoint::ALL.into_iter().find(|endpoint| {
        endpoint.template() == spec.route && endpoint.method().eq_ignore_ascii_case(&spec.method)
    })?;
    let mut given = Mock::given(RouteIs(endpoint)).and(NotObserved);
    if let Some(wanted) = &spec.session_token_fingerprint {
        given = given.and(CallerScope {
            fingerprint: wanted.clone(),
            key_organization: spec.key_organization.clone(),
            shared: Arc::clone(shared),
        });
    }
    given = given.and(FaultInForce {
        id,
        endpoint,
        shared: Arc::clone(shared),
    });
    let answer = |answer| FaultResponder {
        id,
        endpoint,
        answer,
        shared: Arc::clone(shared),
    };
    let mock = match &spec.kind {
        FaultKind::Status { status, body } => given.respond_with(answer(FaultAnswer::Replace {
            status: *status,
            body: body.clone(),
            apply_first: spec.apply_then_fail,
        })),
        FaultKind::Delay { millis } => {
            given.respond_with(answer(FaultAnswer::Delay(Duration::from_millis(*millis))))
        }
        FaultKind::LegacyOrganizationNotFound => {
            given.respond_with(answer(FaultAnswer::LegacyOrganizationNotFound))
        }
        FaultKind::Reset => {
            let shared = Arc::clone(shared);
            given.respond_with_err(move |request: &Request| {
                let call = Call::from_request(request);
                let mut world = shared.lock();
                world.faults.used(id);
                let entry = journal_entry(&world, &call, Some(endpoint.template()), 0, None);
                world.journal.record(entry);
                std::io::Error::new(std::io::ErrorKind::ConnectionReset, "fault: reset")
            })
        }
    }
    .with_priority(FAULT_PRIORITY);
    Some(match spec.times {
        Some(times) => mock.up_to_n_times(u64::from(times)),
        None => mock,
    })
}
