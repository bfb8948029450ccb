//! coderd's router over HTTP: a known path with a method it does not serve (chi's 405 with
//! `Allow`, after the middleware of the subrouters on the way), repeated and trailing slashes
//! (`singleSlashMW`, chi's mounted subrouters) and an encoded slash (routing on the decoded path).

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::{Env, Request};
use fake_coderd::api::{FEATURE_GATE_MESSAGE, RESOURCE_NOT_FOUND_MESSAGE, SIGNED_OUT_MESSAGE};
use fake_coderd::{Entitlement, JournalQuery, routes};
use rstest::rstest;
use serde_json::{Value, json};

const KEYS: &str = "/api/v2/organizations/default/provisionerkeys";
const ROUTE_NOT_FOUND: &str = "Route not found.";

/// Who sends the request.
#[derive(Clone, Copy, Debug)]
enum Who {
    Nobody,
    Operator,
    /// `Coder-Provisioner-Daemon-Key` with the secret of a key named `k`.
    DaemonKey,
}

/// Starts a fake with a key named `k` in the default organization; `{key}` in `path` is its secret.
async fn send(env: &Env, who: Who, method: &str, path: &str) -> common::Answer {
    let secret = env
        .fake
        .create_key_directly("default", "k", BTreeMap::new())
        .expect("key created");
    let path = path.replace("{key}", &secret);
    let request = Request::new(method, &path);
    match who {
        Who::Nobody => env.send(request).await,
        Who::Operator => env.as_operator(request).await,
        Who::DaemonKey => {
            env.send(request.header("Coder-Provisioner-Daemon-Key", &secret))
                .await
        }
    }
}

fn allowed(answer: &common::Answer) -> BTreeSet<String> {
    answer
        .headers
        .get_all("allow")
        .iter()
        .map(|value| value.to_str().expect("ASCII").to_string())
        .collect()
}

// chi `methodNotAllowedHandler`: 405, no body, one `Allow` per method of the route nodes that
// matched the path (coderd sets no `MethodNotAllowed` handler of its own).
#[rstest]
#[case::buildinfo(Who::Nobody, "PUT", "/api/v2/buildinfo", &["GET"])]
#[case::entitlements(Who::Nobody, "POST", "/api/v2/entitlements", &["GET"])]
#[case::user(Who::Operator, "POST", "/api/v2/users/me", &["GET", "DELETE"])]
#[case::organization(Who::Operator, "PUT", "/api/v2/organizations/default", &["PATCH", "DELETE", "GET"])]
#[case::organization_trailing_slash(Who::Operator, "PATCH", "/api/v2/organizations/default/", &["GET"])]
#[case::keys(Who::Operator, "PUT", KEYS, &["GET", "POST"])]
#[case::keys_delete_trailing_slash(Who::Operator, "DELETE", "/api/v2/organizations/default/provisionerkeys/", &["GET", "POST"])]
#[case::key(Who::Operator, "GET", "/api/v2/organizations/default/provisionerkeys/k", &["DELETE"])]
#[case::daemon_key(Who::DaemonKey, "DELETE", "/api/v2/provisionerkeys/{key}", &["GET"])]
#[case::unknown_method(Who::Nobody, "BREW", "/api/v2/buildinfo", &[])]
#[tokio::test]
async fn a_known_path_with_another_method_is_405_with_allow(
    #[case] who: Who,
    #[case] method: &str,
    #[case] path: &str,
    #[case] expected: &[&str],
) {
    let env = Env::start().await;
    let answer = send(&env, who, method, path).await;
    assert_eq!(answer.status, 405, "{method} {path}: {}", answer.text);
    assert_eq!(answer.text, "", "chi writes no body");
    assert_eq!(answer.content_type(), None);
    let expected: BTreeSet<String> = expected.iter().map(|m| m.to_string()).collect();
    assert_eq!(allowed(&answer), expected);
    assert_eq!(
        answer.header("x-coder-build-version"),
        Some(
            fake_coderd::CoderdVersion::default()
                .build_version()
                .as_str()
        )
    );
    let journal = env.fake.journal();
    assert_eq!(journal[0].route, None, "no endpoint served it");
    assert_eq!(journal[0].status, 405);
}

// A subrouter's middleware runs before it routes (chi `Mux.ServeHTTP` → middleware chain →
// `routeHTTP`): the key routes' API key, organization, feature gate and key lookup, the daemon
// key check, answer before their 405.
#[rstest]
#[case::token_first(Who::Nobody, "PUT", KEYS, 401, json!({"message": SIGNED_OUT_MESSAGE, "detail": "Cookie \"coder_session_token\" or query parameter must be provided."}))]
#[case::organization_first(Who::Operator, "PUT", "/api/v2/organizations/nope", 404, json!({"message": RESOURCE_NOT_FOUND_MESSAGE}))]
#[case::key_first(Who::Operator, "GET", "/api/v2/organizations/default/provisionerkeys/nope", 404, json!({"message": RESOURCE_NOT_FOUND_MESSAGE}))]
#[case::daemons_is_a_key_name_for_other_methods(Who::Operator, "POST", "/api/v2/organizations/default/provisionerkeys/daemons", 404, json!({"message": RESOURCE_NOT_FOUND_MESSAGE}))]
#[case::daemon_key_first(Who::Nobody, "POST", "/api/v2/provisionerkeys/x", 401, json!({"message": "provisioner daemon key required"}))]
#[case::unknown_subpath_needs_a_token(Who::Nobody, "GET", "/api/v2/organizations/default/nope", 401, json!({"message": SIGNED_OUT_MESSAGE, "detail": "Cookie \"coder_session_token\" or query parameter must be provided."}))]
#[case::unknown_subpath(Who::Operator, "GET", "/api/v2/organizations/default/nope", 404, json!({"message": ROUTE_NOT_FOUND}))]
#[tokio::test]
async fn middleware_answers_before_the_405(
    #[case] who: Who,
    #[case] method: &str,
    #[case] path: &str,
    #[case] status: u16,
    #[case] expected: Value,
) {
    let env = Env::start().await;
    let answer = send(&env, who, method, path).await;
    assert_eq!(answer.status, status, "{method} {path}: {}", answer.text);
    assert_eq!(answer.json(), expected);
}

#[tokio::test]
async fn the_feature_gate_answers_before_the_405() {
    let env = Env::start().await;
    env.fake.set_entitlement(Entitlement::NotEntitled);
    let answer = send(&env, Who::Operator, "PUT", KEYS).await;
    assert_eq!(answer.status, 403, "{}", answer.text);
    assert_eq!(answer.json(), json!({"message": FEATURE_GATE_MESSAGE}));
}

// An AGPL coderd has neither the enterprise routes nor their methods: the AGPL organization
// subrouter still authenticates and resolves the organization first.
#[rstest]
#[case::organization_patch(Who::Operator, "PATCH", "/api/v2/organizations/default", 405)]
#[case::keys_need_a_token(Who::Nobody, "POST", KEYS, 401)]
#[case::keys_not_routed(Who::Operator, "POST", KEYS, 404)]
#[tokio::test]
async fn an_agpl_coderd_routes_without_the_enterprise_subrouters(
    #[case] who: Who,
    #[case] method: &str,
    #[case] path: &str,
    #[case] status: u16,
) {
    let env = Env::start().await;
    env.fake.set_enterprise(false);
    let answer = send(&env, who, method, path).await;
    assert_eq!(answer.status, status, "{method} {path}: {}", answer.text);
    if status == 405 {
        assert_eq!(allowed(&answer), BTreeSet::from(["GET".to_string()]));
    }
}

// `singleSlashMW` collapses runs of slashes before routing; chi's `Route` mounts a subrouter at
// `pattern/` too, so a trailing slash reaches its `/` route; a plain `Get(pattern)` does not
// match `pattern/`.
#[rstest]
#[case::list_trailing_slash(
    "GET",
    "/api/v2/organizations/default/provisionerkeys/",
    200,
    Some(routes::LIST_KEYS)
)]
#[case::list_repeated_slashes(
    "GET",
    "//api//v2///organizations//default//provisionerkeys",
    200,
    Some(routes::LIST_KEYS)
)]
#[case::create_trailing_slash(
    "POST",
    "/api/v2/organizations/default/provisionerkeys/",
    201,
    Some(routes::CREATE_KEY)
)]
#[case::delete_trailing_slash(
    "DELETE",
    "/api/v2/organizations/default/provisionerkeys/k/",
    204,
    Some(routes::DELETE_KEY)
)]
#[case::user_trailing_slash("GET", "/api/v2/users/me/", 200, Some(routes::USER))]
#[case::organization_trailing_slash(
    "GET",
    "/api/v2/organizations/default/",
    200,
    Some(routes::ORGANIZATION)
)]
#[case::buildinfo_trailing_slash("GET", "/api/v2/buildinfo/", 404, None)]
#[case::organization_list_not_served("GET", "/api/v2/organizations/", 404, None)]
#[case::empty_organization_collapses(
    "GET",
    "/api/v2/organizations//provisionerkeys",
    404,
    Some(routes::ORGANIZATION)
)]
#[tokio::test]
async fn slashes_are_normalised_like_coderd(
    #[case] method: &str,
    #[case] path: &str,
    #[case] status: u16,
    #[case] route: Option<&str>,
) {
    let env = Env::start().await;
    let request = Request::new(method, path);
    let request = if method == "POST" {
        request.body(r#"{"name":"new"}"#)
    } else {
        request
    };
    env.fake
        .create_key_directly("default", "k", BTreeMap::new())
        .expect("key created");
    let answer = env.as_operator(request).await;
    assert_eq!(answer.status, status, "{method} {path}: {}", answer.text);
    let journal = env.fake.journal();
    assert_eq!(journal[0].route.as_deref(), route);
    if status == 404 && route.is_none() {
        assert_eq!(answer.json(), json!({"message": ROUTE_NOT_FOUND}));
    }
    if route == Some(routes::ORGANIZATION) && status == 404 {
        assert_eq!(
            answer.json(),
            json!({"message": RESOURCE_NOT_FOUND_MESSAGE}),
            "the organization named `provisionerkeys` does not exist"
        );
    }
}

// coderd routes on `r.URL.Path`, the decoded path (`singleSlashMW` sets chi's `RoutePath` from
// it, so chi never looks at `RawPath`): an encoded slash splits the segment it is in.
#[rstest]
#[case::key_then_route_not_found(
    Who::Operator,
    "DELETE",
    "/api/v2/organizations/default/provisionerkeys/k%2Fx",
    ROUTE_NOT_FOUND
)]
#[case::unknown_key_first(
    Who::Operator,
    "DELETE",
    "/api/v2/organizations/default/provisionerkeys/nope%2Fx",
    RESOURCE_NOT_FOUND_MESSAGE
)]
#[case::daemon_key_route_not_found(
    Who::DaemonKey,
    "GET",
    "/api/v2/provisionerkeys/{key}%2Fx",
    ROUTE_NOT_FOUND
)]
#[tokio::test]
async fn an_encoded_slash_splits_the_segment(
    #[case] who: Who,
    #[case] method: &str,
    #[case] path: &str,
    #[case] message: &str,
) {
    let env = Env::start().await;
    let answer = send(&env, who, method, path).await;
    assert_eq!(answer.status, 404, "{method} {path}: {}", answer.text);
    assert_eq!(answer.json(), json!({ "message": message }));
    assert_eq!(
        env.fake.keys("default").expect("keys").len(),
        1,
        "nothing deleted"
    );
}

#[tokio::test]
async fn an_encoded_slash_can_spell_a_route() {
    let env = Env::start().await;
    let answer = env
        .as_operator(Request::new(
            "GET",
            "/api/v2/organizations/default%2Fprovisionerkeys",
        ))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.text);
    assert_eq!(env.fake.journal().count("GET", routes::LIST_KEYS), 1);
}
