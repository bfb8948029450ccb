//! The scripting side: faults of every kind, the journal, reset isolation, the unreachable switch,
//! and the admin HTTP API driven through `AdminClient` (as the conformance suite does).

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{Env, Request, http};
use fake_coderd::api::INTERNAL_ERROR_MESSAGE;
use fake_coderd::journal::REDACTED;
use fake_coderd::state::TokenFormatError;
use fake_coderd::{
    AdminClient, Entitlement, Error, FakeCoderd, FakeConfig, FaultKind, FaultSpec, JournalQuery,
    RateLimitSpec, SeedUser, UserRole, fingerprint, routes,
};
use rstest::rstest;
use serde_json::json;

const KEYS: &str = "/api/v2/organizations/default/provisionerkeys";

#[test]
fn reqwest_client_new_works_once_ring_is_installed() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let _client = reqwest::Client::new();
    assert!(rustls::crypto::CryptoProvider::get_default().is_some());
}

#[rstest]
#[case::once(Some(1), 1)]
#[case::three_times(Some(3), 3)]
#[case::sticky(None, 6)]
#[tokio::test]
async fn status_faults_fire_the_scripted_number_of_times(
    #[case] times: Option<u32>,
    #[case] expected_failures: usize,
) {
    let env = Env::start().await;
    let mut fault = FaultSpec::status("GET", routes::LIST_KEYS, 503);
    fault.times = times;
    env.fake.inject_fault(fault).expect("valid fault");
    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(env.as_operator(Request::new("GET", KEYS)).await.status);
    }
    let failures = statuses.iter().filter(|status| **status == 503).count();
    assert_eq!(failures, expected_failures, "{statuses:?}");
    assert!(
        statuses[failures..].iter().all(|status| *status == 200),
        "{statuses:?}"
    );
    env.fake.clear_faults();
    assert_eq!(env.as_operator(Request::new("GET", KEYS)).await.status, 200);
}

#[tokio::test]
async fn status_fault_bodies_default_per_status_or_are_given() {
    let env = Env::start().await;
    env.fake
        .inject_fault(FaultSpec::status("GET", routes::USER, 500))
        .expect("valid");
    let internal = env
        .as_operator(Request::new("GET", "/api/v2/users/me"))
        .await;
    assert_eq!(internal.status, 500);
    assert_eq!(
        internal.json(),
        json!({"message": INTERNAL_ERROR_MESSAGE, "detail": "fault injected by fake-coderd"})
    );

    let body = json!({"message": "custom", "detail": "scripted"});
    let custom = FaultSpec {
        kind: FaultKind::Status {
            status: 502,
            body: Some(body.clone()),
        },
        ..FaultSpec::status("GET", routes::USER, 502)
    };
    env.fake.inject_fault(custom).expect("valid");
    let answer = env
        .as_operator(Request::new("GET", "/api/v2/users/me"))
        .await;
    assert_eq!(answer.status, 502);
    assert_eq!(answer.json(), body);
}

/// coderd before PR #13629 (`coderd/httpmw/organizationparam.go` at commit c8554470) wrote a second
/// object after the generic 404; the `legacy_organization_not_found` fault brings that body back,
/// only for an organization the caller cannot see, and over the admin API as JSON too.
#[tokio::test]
async fn the_legacy_organization_404_body_is_a_fault() {
    let env = Env::start().await;
    let unknown = "/api/v2/organizations/no-such-org";
    let single = env.as_operator(Request::new("GET", unknown)).await;
    assert_eq!(single.status, 404);
    assert_eq!(
        single.json(),
        json!({"message": "Resource not found or you do not have access to this resource"}),
        "one JSON object by default"
    );

    env.fake.add_organization("Acme").expect("org");
    let member = env
        .fake
        .add_user("plain", UserRole::Member)
        .expect("member of the default organization only");
    let spec: FaultSpec = serde_json::from_value(json!({
        "method": "GET",
        "route": routes::ORGANIZATION,
        "kind": {"type": "legacy_organization_not_found"},
    }))
    .expect("the admin API's JSON form");
    env.fake.admin().inject_fault(spec).await.expect("injected");

    let legacy = env.as_operator(Request::new("GET", unknown)).await;
    assert_eq!(legacy.status, 404);
    assert_eq!(
        legacy.json_values(),
        [
            json!({"message": "Resource not found or you do not have access to this resource"}),
            json!({
                "message": "Organization \"no-such-org\" not found.",
                "detail": "Provide either the organization id or name."
            }),
        ]
    );
    let hidden = env
        .send(Request::new("GET", "/api/v2/organizations/acme").token(&member))
        .await;
    assert_eq!(hidden.status, 404);
    assert_eq!(
        hidden.json_values().len(),
        2,
        "hidden from the caller is the same 404: {}",
        hidden.text
    );
    let known = env
        .as_operator(Request::new("GET", "/api/v2/organizations/default"))
        .await;
    assert_eq!(known.status, 200, "a known organization is untouched");
    assert_eq!(known.json()["is_default"], true);
    let signed_out = env.send(Request::new("GET", unknown)).await;
    assert_eq!(signed_out.status, 401, "authentication still comes first");

    env.fake.clear_faults();
    assert_eq!(
        env.as_operator(Request::new("GET", unknown))
            .await
            .json_values()
            .len(),
        1
    );
}

#[rstest]
#[case::no_organization_in_route(FaultSpec::legacy_organization_not_found("GET", routes::USER))]
#[case::apply_then_fail(
    FaultSpec::legacy_organization_not_found("POST", routes::CREATE_KEY).apply_then_fail()
)]
#[tokio::test]
async fn a_legacy_organization_fault_needs_an_organization_route(#[case] spec: FaultSpec) {
    let env = Env::start().await;
    assert!(env.fake.inject_fault(spec.clone()).is_err());
    assert!(env.fake.admin().inject_fault(spec).await.is_err());
}

/// coderd's 429 comes from its rate limiter (coderd/httpmw/ratelimit.go, go-chi/httprate): an
/// injected one carries the same message and headers, `Retry-After: 60` included.
#[tokio::test]
async fn an_injected_429_is_the_rate_limiters_answer() {
    let env = Env::start().await;
    env.fake
        .inject_fault(FaultSpec::status("GET", routes::USER, 429))
        .expect("valid");
    let limited = env
        .as_operator(Request::new("GET", "/api/v2/users/me"))
        .await;
    assert_eq!(limited.status, 429);
    assert_eq!(limited.header("Retry-After"), Some("60"));
    assert_eq!(limited.header("X-Ratelimit-Remaining"), Some("0"));
    assert_eq!(
        limited.json(),
        json!({"message": "You've been rate limited for sending more than 512 requests in 1m0s."})
    );
}

#[rstest]
#[case::fail_only(false, 0)]
#[case::apply_then_fail(true, 1)]
#[tokio::test]
async fn apply_then_fail_changes_state_before_failing(
    #[case] apply: bool,
    #[case] keys_after: usize,
) {
    let env = Env::start().await;
    let mut fault = FaultSpec::status("POST", routes::CREATE_KEY, 500);
    fault.apply_then_fail = apply;
    env.fake.inject_fault(fault).expect("valid");
    let answer = env.create_key("default", "crash-safe").await;
    assert_eq!(answer.status, 500);
    assert!(
        !answer.text.contains("\"key\""),
        "the secret is never sent with the fault answer"
    );
    assert_eq!(env.fake.keys("default").expect("keys").len(), keys_after);
    let retry = env.create_key("default", "crash-safe").await;
    assert_eq!(retry.status, if apply { 409 } else { 201 });
}

#[tokio::test]
async fn delay_fault_outlasts_a_client_timeout_but_the_state_change_happens() {
    let env = Env::start().await;
    env.fake
        .inject_fault(FaultSpec::delay(
            "POST",
            routes::CREATE_KEY,
            Duration::from_secs(3),
        ))
        .expect("valid");
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .expect("client");
    let outcome = impatient
        .post(format!("{}{KEYS}", env.fake.url()))
        .header("Coder-Session-Token", env.fake.operator_token())
        .json(&json!({"name": "slow"}))
        .send()
        .await;
    assert!(outcome.is_err_and(|error| error.is_timeout()));
    assert_eq!(
        env.fake.keys("default").expect("keys").len(),
        1,
        "a slow server still created the key"
    );
    let journal = env.fake.journal();
    assert_eq!(journal.count("POST", routes::CREATE_KEY), 1);
    assert_eq!(
        journal[0].status, 201,
        "the journal records the answer the server gave (late)"
    );
}

#[tokio::test]
async fn reset_fault_drops_the_connection_without_changing_state() {
    let env = Env::start().await;
    env.fake
        .inject_fault(FaultSpec::reset("POST", routes::CREATE_KEY))
        .expect("valid");
    let outcome = env
        .http
        .post(format!("{}{KEYS}", env.fake.url()))
        .header("Coder-Session-Token", env.fake.operator_token())
        .json(&json!({"name": "reset"}))
        .send()
        .await;
    assert!(outcome.is_err(), "no HTTP answer: {outcome:?}");
    assert!(env.fake.keys("default").expect("keys").is_empty());
    assert_eq!(
        env.create_key("default", "reset").await.status,
        201,
        "one-shot: the next request is served"
    );
    let statuses: Vec<u16> = env
        .fake
        .journal()
        .iter()
        .map(|entry| entry.status)
        .collect();
    assert_eq!(statuses, [0, 201]);
}

#[tokio::test]
async fn journal_records_each_request_without_secrets() {
    let env = Env::start().await;
    let token = env.fake.operator_token();
    let created = env.create_key("default", "journaled").await.json();
    let secret = created["key"].as_str().expect("secret").to_string();
    env.as_operator(Request::new("GET", KEYS).header("X-Coder-Bypass-Ratelimit", "true"))
        .await;
    env.send(
        Request::new("GET", &format!("/api/v2/provisionerkeys/{secret}"))
            .header("Coder-Provisioner-Daemon-Key", &secret),
    )
    .await;
    env.send(Request::new(
        "GET",
        &format!("/api/v2/users/me?coder_session_token={token}"),
    ))
    .await;
    env.send(Request::new("POST", "/api/v2/nope").body(r#"{"token":"hidden","name":"n"}"#))
        .await;
    env.fake.admin().keys("default").await.expect("admin call");

    let journal = env.fake.journal();
    assert_eq!(
        journal.len(),
        5,
        "admin requests are not journaled: {journal:#?}"
    );
    let seqs: Vec<u64> = journal.iter().map(|entry| entry.seq).collect();
    assert_eq!(seqs, [1, 2, 3, 4, 5]);

    let create = &journal[0];
    assert_eq!(
        (
            create.method.as_str(),
            create.path.as_str(),
            create.route.as_deref()
        ),
        ("POST", KEYS, Some(routes::CREATE_KEY))
    );
    assert_eq!(create.status, 201);
    assert_eq!(create.session_token_fingerprint, Some(fingerprint(&token)));
    assert_eq!(
        create.body,
        Some(json!({"name": "journaled", "tags": null}))
    );
    assert_eq!(journal[1].bypass_ratelimit.as_deref(), Some("true"));
    assert_eq!(
        journal[2].path,
        format!("/api/v2/provisionerkeys/{REDACTED}")
    );
    assert_eq!(
        journal[2].daemon_key_fingerprint,
        Some(fingerprint(&secret))
    );
    assert_eq!(
        journal[3].path,
        format!("/api/v2/users/me?coder_session_token={REDACTED}")
    );
    assert_eq!(
        journal[3].session_token_fingerprint,
        Some(fingerprint(&token))
    );
    assert_eq!(
        (journal[4].route.as_deref(), journal[4].status),
        (None, 404)
    );
    assert_eq!(
        journal[4].body,
        Some(json!({"token": REDACTED, "name": "n"}))
    );

    assert_eq!(journal.count("get", routes::LIST_KEYS), 1);
    assert_eq!(journal.for_route(routes::PROVISIONER_KEYS).len(), 2);
    let counts = journal.counts();
    assert_eq!(
        counts[&("POST".to_string(), routes::CREATE_KEY.to_string())],
        1
    );
    assert_eq!(counts[&("POST".to_string(), "-".to_string())], 1);

    let serialized =
        serde_json::to_string(&env.fake.admin().journal().await.expect("journal")).expect("json");
    for secret in [token.as_str(), secret.as_str(), "hidden"] {
        assert!(!serialized.contains(secret), "journal leaks a secret");
    }
    env.fake.clear_journal();
    assert!(env.fake.journal().is_empty());
}

// Secrets are redacted wherever they sit in a JSON body: in a nested object, and in a body that is
// an array (coderd answers that one 400, but the journal records it all the same).
#[rstest]
#[case::nested_object(
    r#"{"name":"n","tags":{"token":"s3cret-token"}}"#,
    json!({"name": "n", "tags": {"token": REDACTED}})
)]
#[case::top_level_array(
    r#"[{"name":"n","password":"s3cret-token"},["psk",{"PSK":"s3cret-token"}]]"#,
    json!([{"name": "n", "password": REDACTED}, ["psk", {"PSK": REDACTED}]])
)]
#[tokio::test]
async fn journal_redacts_secrets_at_any_depth(
    #[case] body: &str,
    #[case] recorded: serde_json::Value,
) {
    let env = Env::start().await;
    env.as_operator(Request::new("POST", KEYS).body(body)).await;
    let journal = env.fake.journal();
    assert_eq!(journal[0].body, Some(recorded));
    let serialized = serde_json::to_string(&journal).expect("json");
    assert!(!serialized.contains("s3cret-token"), "{serialized}");
}

#[tokio::test]
async fn reset_returns_to_the_seed_and_isolates_tests() {
    let env = Env::start().await;
    let default_before = env
        .as_operator(Request::new("GET", "/api/v2/organizations/default"))
        .await
        .json();
    env.fake.add_organization("Temporary").expect("org");
    let member = env.fake.add_user("member", UserRole::Member).expect("user");
    env.create_key("default", "left-over").await;
    env.fake.set_entitlement(Entitlement::NotEntitled);
    env.fake
        .inject_fault(FaultSpec::status("GET", routes::USER, 500).sticky())
        .expect("fault");
    env.fake.set_rate_limit(Some(RateLimitSpec::NextRequests {
        method: None,
        route: Some(routes::BUILD_INFO.to_string()),
        count: 5,
    }));

    env.fake.reset().expect("reset");

    assert!(env.fake.journal().is_empty());
    assert_eq!(
        env.as_operator(Request::new("GET", "/api/v2/users/me"))
            .await
            .status,
        200,
        "faults cleared, token kept"
    );
    assert_eq!(
        env.send(Request::new("GET", "/api/v2/buildinfo"))
            .await
            .status,
        200,
        "rate limit cleared"
    );
    assert_eq!(
        env.as_operator(Request::new("GET", KEYS)).await.json(),
        json!([]),
        "keys gone, entitlement back"
    );
    assert_eq!(
        env.send(Request::new("GET", "/api/v2/users/me").token(&member))
            .await
            .status,
        401,
        "added users gone"
    );
    assert_eq!(
        env.as_operator(Request::new("GET", "/api/v2/organizations/temporary"))
            .await
            .status,
        404
    );
    let default_after = env
        .as_operator(Request::new("GET", "/api/v2/organizations/default"))
        .await
        .json();
    assert_eq!(
        default_after["id"], default_before["id"],
        "seeded ids are stable across resets"
    );
}

async fn wait_for<F: std::future::Future<Output = bool>>(what: &str, mut probe: impl FnMut() -> F) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !probe().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn unreachable_closes_and_reopens_the_same_port_keeping_state_and_admin() {
    let env = Env::start().await;
    let admin = env.fake.admin();
    env.create_key("default", "survivor").await;
    let url = env.fake.url();

    admin.set_unreachable(true).await.expect("closed");
    let refused = http().get(format!("{url}/api/v2/buildinfo")).send().await;
    assert!(
        refused.is_err_and(|error| error.is_connect()),
        "the coderd port is closed"
    );
    assert_eq!(
        admin
            .keys("default")
            .await
            .expect("admin still answers")
            .len(),
        1
    );
    admin
        .set_unreachable(true)
        .await
        .expect("closing twice is fine");

    admin.set_unreachable(false).await.expect("reopened");
    assert_eq!(env.fake.url(), url);
    wait_for("coderd to answer again", || async {
        http()
            .get(format!("{url}/api/v2/buildinfo"))
            .send()
            .await
            .is_ok_and(|answer| answer.status() == 200)
    })
    .await;
    let keys = env.as_operator(Request::new("GET", KEYS)).await.json();
    assert_eq!(keys[0]["name"], "survivor", "state survives the outage");

    env.fake
        .set_unreachable(true)
        .await
        .expect("in-process close");
    assert!(
        http()
            .get(format!("{url}/api/v2/buildinfo"))
            .send()
            .await
            .is_err()
    );
    env.fake
        .set_unreachable(false)
        .await
        .expect("in-process reopen");
    assert_eq!(
        env.send(Request::new("GET", "/api/v2/buildinfo"))
            .await
            .status,
        200
    );
}

#[tokio::test]
async fn admin_client_drives_every_operation_over_http() {
    let fake = FakeCoderd::start().await.expect("fake");
    let admin = AdminClient::new(
        &format!("{}/__fake/", fake.admin_url()),
        &fake.admin_token(),
    );
    let client = http();

    let info = admin.info().await.expect("info");
    assert_eq!(info.coderd_url, fake.url());
    assert_eq!(info.operator_token, fake.operator_token());

    let org = admin.add_organization("Remote").await.expect("org");
    assert!(
        admin
            .organizations()
            .await
            .expect("orgs")
            .iter()
            .any(|o| o.id == org.id)
    );
    assert!(
        admin.add_organization("remote").await.is_err(),
        "duplicate names are refused"
    );

    let secret = admin
        .create_key_directly(
            "remote",
            "Pre-Existing",
            BTreeMap::from([("a".into(), "b".into())]),
        )
        .await
        .expect("key");
    let keys = admin.keys(&org.id).await.expect("keys");
    assert_eq!(
        (
            keys[0].name.as_str(),
            keys[0].tags.get("a").map(String::as_str)
        ),
        ("pre-existing", Some("b"))
    );
    let daemon = Request::new("GET", "/api/v2/provisionerkeys/x")
        .header("Coder-Provisioner-Daemon-Key", &secret)
        .send(&client, &fake.url())
        .await;
    assert_eq!(daemon.status, 200);
    assert!(admin.keys("nope").await.is_err());

    let token = admin
        .add_user("remote-member", UserRole::Member)
        .await
        .expect("user");
    let me = Request::new("GET", "/api/v2/users/me")
        .token(&token)
        .send(&client, &fake.url())
        .await
        .json();
    assert_eq!(me["username"], "remote-member");

    admin
        .set_entitlement(Entitlement::GracePeriod)
        .await
        .expect("entitlement");
    admin.set_license(false).await.expect("license");
    let entitlements = Request::new("GET", "/api/v2/entitlements")
        .send(&client, &fake.url())
        .await
        .json();
    assert_eq!(
        entitlements["features"]["external_provisioner_daemons"]["entitlement"],
        "grace_period"
    );
    assert_eq!(entitlements["has_license"], false);
    admin
        .set_entitlements_require_token(true)
        .await
        .expect("switch");
    assert_eq!(
        Request::new("GET", "/api/v2/entitlements")
            .send(&client, &fake.url())
            .await
            .status,
        401
    );

    admin.set_enterprise(false).await.expect("agpl");
    assert_eq!(
        Request::new("GET", "/api/v2/entitlements")
            .send(&client, &fake.url())
            .await
            .status,
        404
    );
    admin.set_enterprise(true).await.expect("enterprise");

    admin
        .inject_fault(FaultSpec::status("GET", routes::BUILD_INFO, 418))
        .await
        .expect("fault");
    assert_eq!(
        Request::new("GET", "/api/v2/buildinfo")
            .send(&client, &fake.url())
            .await
            .status,
        418
    );
    admin
        .inject_fault(FaultSpec::status("GET", routes::BUILD_INFO, 503).sticky())
        .await
        .expect("fault");
    admin.clear_faults().await.expect("cleared");
    assert_eq!(
        Request::new("GET", "/api/v2/buildinfo")
            .send(&client, &fake.url())
            .await
            .status,
        200
    );
    assert!(
        admin
            .inject_fault(FaultSpec::status("GET", "/api/v2/unknown", 500))
            .await
            .is_err()
    );

    admin
        .set_rate_limit(Some(RateLimitSpec::NextRequests {
            method: None,
            route: None,
            count: 1,
        }))
        .await
        .expect("limit");
    assert_eq!(
        Request::new("GET", "/api/v2/buildinfo")
            .send(&client, &fake.url())
            .await
            .status,
        429
    );
    admin
        .set_rate_limit(Some(RateLimitSpec::NextRequests {
            method: None,
            route: None,
            count: 1,
        }))
        .await
        .expect("limit");
    admin.set_rate_limit(None).await.expect("no limit");
    assert_eq!(
        Request::new("GET", "/api/v2/buildinfo")
            .send(&client, &fake.url())
            .await
            .status,
        200
    );

    let journal = admin.journal().await.expect("journal");
    assert_eq!(journal.count("GET", routes::BUILD_INFO), 4);
    admin.clear_journal().await.expect("cleared");
    assert!(admin.journal().await.expect("journal").is_empty());

    admin.reset().await.expect("reset");
    assert!(admin.keys("default").await.expect("keys").is_empty());
    assert!(
        admin.keys("remote").await.is_err(),
        "added organizations are gone after reset"
    );
}

#[rstest]
#[case::no_token(None, "GET", "/__fake/journal", None, 401)]
#[case::wrong_token(Some("wrong"), "GET", "/__fake/journal", None, 401)]
#[case::unknown_route(Some("right"), "GET", "/__fake/nope", None, 404)]
#[case::bad_body(Some("right"), "POST", "/__fake/faults", Some("{}"), 400)]
#[case::bad_status(
    Some("right"),
    "POST",
    "/__fake/faults",
    Some(r#"{"method":"GET","route":"/api/v2/buildinfo","kind":{"type":"status","status":99}}"#),
    400
)]
#[case::bad_user(
    Some("right"),
    "POST",
    "/__fake/users",
    Some(r#"{"username":"x","token":"bad"}"#),
    400
)]
#[case::unknown_deployment_field(
    Some("right"),
    "PATCH",
    "/__fake/deployment",
    Some(r#"{"nope":true}"#),
    400
)]
#[tokio::test]
async fn admin_api_rejects_bad_requests(
    #[case] token: Option<&str>,
    #[case] method: &str,
    #[case] path: &str,
    #[case] body: Option<&str>,
    #[case] status: u16,
) {
    let fake = FakeCoderd::start_with(FakeConfig {
        admin_token: "right".to_string(),
        ..Default::default()
    })
    .await
    .expect("fake");
    let mut request = Request::new(method, path);
    if let Some(token) = token {
        request = request.header("Authorization", &format!("Bearer {token}"));
    }
    if let Some(body) = body {
        request = request.body(body);
    }
    let answer = request.send(&http(), &fake.admin_url()).await;
    assert_eq!(answer.status, status, "{}", answer.text);
    assert!(answer.json()["message"].is_string());
    assert!(
        fake.journal().is_empty(),
        "admin requests are not journaled"
    );
}

#[tokio::test]
async fn the_journal_is_readable_by_cursor() {
    let env = Env::start().await;
    let admin = env.fake.admin();
    for _ in 0..3 {
        env.send(Request::new("GET", "/api/v2/buildinfo")).await;
    }
    let all = admin.journal().await.expect("journal");
    assert_eq!(all.len(), 3);
    let after_first = admin.journal_since(all[0].seq).await.expect("since");
    assert_eq!(after_first, all[1..].to_vec());
    assert!(
        admin
            .journal_since(all[2].seq)
            .await
            .expect("since")
            .is_empty()
    );
    admin.clear_journal().await.expect("clear");
    env.send(Request::new("GET", "/api/v2/buildinfo")).await;
    let new = admin.journal_since(all[2].seq).await.expect("since");
    assert_eq!(new.len(), 1, "sequence numbers go on after a clear");
    assert_eq!(env.fake.journal_since(0), new);
}

/// The Rust API refuses with `fake_coderd::Error` variants a caller can match on; the admin API
/// answers the same refusal 400 with the error's text as `message`.
#[tokio::test]
async fn refusals_are_typed_errors_with_the_same_text_over_the_admin_api() {
    let env = Env::start().await;
    let admin = env.fake.admin();

    let unknown = env.fake.keys("nope").expect_err("unknown organization");
    assert!(
        matches!(&unknown, Error::UnknownOrganization(org) if org == "nope"),
        "{unknown:?}"
    );
    let over_http = admin.keys("nope").await.expect_err("refused over HTTP too");
    assert!(
        over_http
            .to_string()
            .ends_with(&format!("answered 400 Bad Request: {unknown}")),
        "{over_http:#}"
    );

    assert!(matches!(
        env.fake.add_organization("Coder"),
        Err(Error::DuplicateOrganization { name, .. }) if name == "Coder"
    ));
    let reserved = env
        .fake
        .create_key_directly("default", "PSK", BTreeMap::new())
        .expect_err("reserved name");
    assert!(
        matches!(&reserved, Error::KeyRefused(refusal) if refusal.status == 400),
        "{reserved:?}"
    );
    assert_eq!(reserved.to_string(), "Name cannot be reserved name 'PSK'");
    assert!(matches!(
        env.fake.delete_key_directly("default", "no-such-id"),
        Err(Error::UnknownKey { .. })
    ));
    assert!(matches!(
        env.fake.add_user_with(&SeedUser {
            token: Some("short-token".to_string()),
            ..SeedUser::new("bad-token", UserRole::Member)
        }),
        Err(Error::MalformedUserToken {
            reason: TokenFormatError::IdLength(5),
            ..
        })
    ));
    assert!(matches!(
        env.fake
            .inject_fault(FaultSpec::status("GET", "/api/v2/unknown", 500)),
        Err(Error::UnknownRouteTemplate(route)) if route == "/api/v2/unknown"
    ));
    assert!(matches!(
        env.fake
            .inject_fault(FaultSpec::status("GET", routes::BUILD_INFO, 302)),
        Err(Error::NotAnErrorStatus(302))
    ));

    let malformed = FakeCoderd::start_with(FakeConfig {
        operator_token: Some("not-a-token".to_string()),
        ..FakeConfig::default()
    })
    .await
    .err();
    assert!(
        matches!(
            malformed,
            Some(Error::MalformedOperatorToken(TokenFormatError::PartCount(
                3
            )))
        ),
        "{malformed:?}"
    );
    let taken = FakeCoderd::start_with(FakeConfig {
        listen: Some(env.fake.address()),
        ..FakeConfig::default()
    })
    .await
    .err();
    assert!(
        matches!(&taken, Some(Error::Bind { addr, source }) if *addr == env.fake.address() && source.kind() == std::io::ErrorKind::AddrInUse),
        "{taken:?}"
    );
}

/// No admin request blocks a thread while it waits: a reopen that must wait for its port (held
/// here by someone else) leaves the admin API answering, on this test's one-thread runtime too.
#[tokio::test]
async fn a_waiting_reachability_change_blocks_neither_the_admin_api_nor_the_runtime() {
    let env = Env::start().await;
    let admin = env.fake.admin();
    admin.set_unreachable(true).await.expect("closed");
    let squatter =
        std::net::TcpListener::bind(env.fake.address()).expect("the closed port is free");
    let reopening = tokio::spawn({
        let admin = admin.clone();
        async move { admin.set_unreachable(false).await }
    });
    for _ in 0..5 {
        let info = tokio::time::timeout(Duration::from_secs(2), admin.info())
            .await
            .expect("the admin API answers while the reopen waits")
            .expect("info");
        assert_eq!(info.coderd_url, env.fake.url());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!reopening.is_finished(), "the reopen waits for the port");
    drop(squatter);
    tokio::time::timeout(Duration::from_secs(5), reopening)
        .await
        .expect("reopened once the port is free")
        .expect("task")
        .expect("reopen");
    assert_eq!(
        env.send(Request::new("GET", "/api/v2/buildinfo"))
            .await
            .status,
        200
    );
}

/// A delayed answer holds back only its own request: wiremock waits out the delay after the
/// responder has returned, without holding a thread or the fake's lock.
#[tokio::test]
async fn a_delayed_answer_holds_back_no_other_request() {
    let env = Env::start().await;
    env.fake
        .inject_fault(FaultSpec::delay(
            "GET",
            routes::LIST_KEYS,
            Duration::from_secs(3),
        ))
        .expect("valid");
    let slow = tokio::spawn({
        let (http, url, token) = (env.http.clone(), env.fake.url(), env.fake.operator_token());
        async move {
            Request::new("GET", KEYS)
                .token(&token)
                .send(&http, &url)
                .await
                .status
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = std::time::Instant::now();
    for _ in 0..3 {
        assert_eq!(env.as_operator(Request::new("GET", KEYS)).await.status, 200);
    }
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "others are answered while one waits: {:?}",
        started.elapsed()
    );
    assert!(!slow.is_finished(), "the delayed request still waits");
    assert_eq!(slow.await.expect("task"), 200);
}

/// Dropping the fake closes both listeners, even while an admin client keeps a connection open.
#[tokio::test]
async fn dropping_the_fake_closes_both_ports() {
    let fake = FakeCoderd::start().await.expect("fake");
    let admin = fake.admin();
    admin.info().await.expect("a kept-alive admin connection");
    let coderd_addr = fake.address();
    let admin_addr: std::net::SocketAddr = fake
        .admin_url()
        .trim_start_matches("http://")
        .parse()
        .expect("admin address");
    drop(fake);
    wait_for("both ports to close", || async {
        tokio::net::TcpStream::connect(coderd_addr).await.is_err()
            && tokio::net::TcpStream::connect(admin_addr).await.is_err()
    })
    .await;
    assert!(admin.info().await.is_err());
}

fn statuses(journal: &[fake_coderd::JournalEntry]) -> Vec<u16> {
    journal.iter().map(|entry| entry.status).collect()
}

/// Faults are served first injected first; a counted one runs out and hands over to the next,
/// whatever its kind (a reset journals status 0).
#[tokio::test]
async fn faults_are_served_in_injection_order_until_each_runs_out() {
    let env = Env::start().await;
    for fault in [
        FaultSpec::status("GET", routes::LIST_KEYS, 503).times(2),
        FaultSpec::reset("GET", routes::LIST_KEYS),
        FaultSpec::delay("GET", routes::LIST_KEYS, Duration::from_millis(10)),
        FaultSpec::status("GET", routes::LIST_KEYS, 500).sticky(),
        FaultSpec::status("GET", routes::LIST_KEYS, 418).sticky(),
    ] {
        env.fake.inject_fault(fault).expect("valid");
    }
    for _ in 0..6 {
        let _ = env
            .http
            .get(format!("{}{KEYS}", env.fake.url()))
            .header("Coder-Session-Token", env.fake.operator_token())
            .send()
            .await;
    }
    assert_eq!(
        statuses(&env.fake.journal()),
        [503, 503, 0, 200, 500, 500],
        "the sticky 500 shadows the later 418"
    );
}

/// `up_to_n_times` counts exactly, even when the requests race.
#[tokio::test]
async fn a_counted_fault_fires_exactly_its_times_under_concurrent_requests() {
    let env = Env::start().await;
    env.fake
        .inject_fault(FaultSpec::status("GET", routes::BUILD_INFO, 503).times(5))
        .expect("valid");
    let requests = (0..20).map(|_| {
        let (http, url) = (env.http.clone(), env.fake.url());
        tokio::spawn(async move {
            Request::new("GET", "/api/v2/buildinfo")
                .send(&http, &url)
                .await
                .status
        })
    });
    let mut answered = Vec::new();
    for request in requests.collect::<Vec<_>>() {
        answered.push(request.await.expect("task"));
    }
    assert_eq!(answered.iter().filter(|status| **status == 503).count(), 5);
    assert_eq!(answered.iter().filter(|status| **status == 200).count(), 15);
}

/// A fault scoped to a session-token fingerprint hits that token from any of its sources (cookie,
/// query, header) and nobody else; clearing by fingerprint leaves the other faults in force.
#[tokio::test]
async fn scoped_faults_hit_only_their_session_token() {
    let env = Env::start().await;
    let mine = env.fake.operator_token();
    let theirs = env.fake.add_user("theirs", UserRole::Owner).expect("user");
    env.fake
        .inject_fault(
            FaultSpec::status("GET", routes::USER, 503)
                .sticky()
                .for_session_token_fingerprint(fingerprint(&mine)),
        )
        .expect("valid");
    env.fake
        .inject_fault(FaultSpec::status("GET", routes::ORGANIZATION, 502).sticky())
        .expect("valid");
    let me = "/api/v2/users/me";
    for request in [
        Request::new("GET", me).token(&mine),
        Request::new("GET", me).header("Cookie", &format!("coder_session_token={mine}")),
        Request::new("GET", &format!("{me}?coder_session_token={mine}")),
        Request::new("GET", me)
            .header("Cookie", "coder_session_token=")
            .token(&mine),
    ] {
        assert_eq!(env.send(request).await.status, 503);
    }
    assert_eq!(
        env.send(Request::new("GET", me).token(&theirs))
            .await
            .status,
        200
    );
    assert_eq!(
        env.send(Request::new("GET", me)).await.status,
        401,
        "no token, no fault"
    );

    env.fake.clear_faults_for(&fingerprint(&mine));
    assert_eq!(
        env.send(Request::new("GET", me).token(&mine)).await.status,
        200
    );
    assert_eq!(
        env.send(Request::new("GET", "/api/v2/organizations/default").token(&mine))
            .await
            .status,
        502,
        "the unscoped fault is still in force"
    );
}

/// A scoped fault widened to an organization's keys also hits the daemon-key route (which
/// carries no session token) for a key of that organization, and no other key.
#[tokio::test]
async fn a_scoped_fault_can_cover_its_organizations_daemon_keys() {
    let env = Env::start().await;
    let mine = env.fake.operator_token();
    let ours = env.fake.add_organization("ours").expect("organization");
    let our_key = env
        .fake
        .create_key_directly("ours", "k", BTreeMap::new())
        .expect("key");
    let other_key = env
        .fake
        .create_key_directly("default", "k", BTreeMap::new())
        .expect("key");
    env.fake
        .inject_fault(
            FaultSpec::status("GET", routes::DAEMON_KEY, 429)
                .for_session_token_fingerprint(fingerprint(&mine))
                .or_key_of_organization(&ours.id),
        )
        .expect("valid");
    let (other_path, our_path) = (
        format!("/api/v2/provisionerkeys/{other_key}"),
        format!("/api/v2/provisionerkeys/{our_key}"),
    );
    fn lookup<'a>(path: &'a str, key: &str) -> Request<'a> {
        Request::new("GET", path).header("Coder-Provisioner-Daemon-Key", key)
    }
    assert_eq!(env.send(lookup(&other_path, &other_key)).await.status, 200);
    assert_eq!(env.send(lookup(&our_path, &our_key)).await.status, 429);
    assert_eq!(
        env.send(lookup(&our_path, &our_key)).await.status,
        200,
        "used up"
    );
    assert!(
        env.fake
            .inject_fault(
                FaultSpec::status("GET", routes::DAEMON_KEY, 429).or_key_of_organization(&ours.id)
            )
            .is_err(),
        "an organization scope widens a session-token scope"
    );
}

/// A fault with an `after` trigger is in force only once its callers' trigger request succeeded
/// after the injection: the lists before a key create pass (none of the fault's uses spent), a
/// failed create, another caller's create and an observer's do not arm it, and the list that
/// follows the caller's own create meets it.
#[tokio::test]
async fn a_fault_after_a_trigger_waits_for_its_callers_success_of_it() {
    let env = Env::start().await;
    let mine = env.fake.operator_token();
    let theirs = env.fake.add_user("theirs", UserRole::Owner).expect("user");
    assert_eq!(env.create_key("default", "before").await.status, 201);
    env.fake
        .inject_fault(
            FaultSpec::status("GET", routes::LIST_KEYS, 429)
                .times(2)
                .after("POST", routes::CREATE_KEY)
                .for_session_token_fingerprint(fingerprint(&mine)),
        )
        .expect("valid");
    let list = || env.send(Request::new("GET", KEYS).token(&mine));
    let create = |token: &str, name: &str| {
        let body = json!({ "name": name }).to_string();
        env.send(Request::new("POST", KEYS).token(token).body(&body))
    };
    assert_eq!(
        list().await.status,
        200,
        "a create before the injection arms nothing"
    );
    assert_eq!(create(&mine, "before").await.status, 409, "a failed create");
    assert_eq!(
        create(&theirs, "theirs").await.status,
        201,
        "another caller's create"
    );
    let observed = Request::new("POST", KEYS)
        .token(&mine)
        .header(fake_coderd::routes::OBSERVER_HEADER, "true")
        .body(r#"{"name":"observed"}"#);
    assert_eq!(env.send(observed).await.status, 201, "an observer's create");
    assert_eq!(list().await.status, 200);
    assert_eq!(create(&mine, "mine").await.status, 201);
    assert_eq!(
        [
            list().await.status,
            list().await.status,
            list().await.status
        ],
        [429, 429, 200],
        "armed, then used up"
    );
}

/// One user's own entitlement: its `/entitlements` and its key requests follow it, every other
/// caller keeps the deployment's, and `null` gives the user the deployment's again.
#[tokio::test]
async fn a_user_entitlement_is_seen_by_that_user_only() {
    let env = Env::start().await;
    let admin = AdminClient::new(
        &format!("{}/__fake/", env.fake.admin_url()),
        &env.fake.admin_token(),
    );
    let mine = env.fake.add_user("mine", UserRole::Owner).expect("user");
    let theirs = env.fake.operator_token();
    admin
        .set_user_entitlement("mine", Some(Entitlement::NotEntitled))
        .await
        .expect("set");
    let seen = |answer: common::Answer| {
        answer.json()["features"]["external_provisioner_daemons"]["entitlement"].clone()
    };
    let entitlements = |token: &str| Request::new("GET", routes::ENTITLEMENTS).token(token);
    assert_eq!(seen(env.send(entitlements(&mine)).await), "not_entitled");
    assert_eq!(seen(env.send(entitlements(&theirs)).await), "entitled");
    assert_eq!(
        seen(env.send(Request::new("GET", routes::ENTITLEMENTS)).await),
        "entitled",
        "no token: the deployment's"
    );
    let create = |token: &str| {
        Request::new("POST", KEYS)
            .token(token)
            .body(r#"{"name":"k"}"#)
    };
    assert_eq!(env.send(create(&mine)).await.status, 403, "feature gate");
    assert_eq!(env.send(create(&theirs)).await.status, 201);

    admin
        .set_user_entitlement("mine", None)
        .await
        .expect("unset");
    assert_eq!(seen(env.send(entitlements(&mine)).await), "entitled");
    assert!(
        admin
            .set_user_entitlement("nobody", Some(Entitlement::Entitled))
            .await
            .is_err(),
        "unknown user"
    );
}

/// A fault outlives the coderd listener: after a close and reopen it goes on with the uses it had
/// left, and one injected while the port is closed fires once it is open again.
#[tokio::test]
async fn faults_survive_a_reopened_listener_with_their_remaining_uses() {
    let env = Env::start().await;
    env.fake
        .inject_fault(FaultSpec::status("GET", routes::BUILD_INFO, 503).times(3))
        .expect("valid");
    let buildinfo = || env.send(Request::new("GET", "/api/v2/buildinfo"));
    assert_eq!(buildinfo().await.status, 503);
    env.fake.set_unreachable(true).await.expect("closed");
    env.fake
        .inject_fault(FaultSpec::status("GET", routes::USER, 500))
        .expect("recorded while closed");
    env.fake.set_unreachable(false).await.expect("reopened");
    let mut answered = Vec::new();
    for _ in 0..3 {
        answered.push(buildinfo().await.status);
    }
    assert_eq!(answered, [503, 503, 200]);
    assert_eq!(
        env.as_operator(Request::new("GET", "/api/v2/users/me"))
            .await
            .status,
        500
    );
}

/// An AGPL coderd has no enterprise routes, so there is nothing to fault: the request gets
/// "Route not found" and the fault waits, unused, for the enterprise routes to come back.
#[rstest]
#[case::status(FaultSpec::status("GET", routes::LIST_KEYS, 503), Some(503))]
#[case::reset(FaultSpec::reset("GET", routes::LIST_KEYS), None)]
#[tokio::test]
async fn faults_on_routes_an_agpl_coderd_lacks_do_not_fire(
    #[case] fault: FaultSpec,
    #[case] faulted_status: Option<u16>,
) {
    let env = Env::start().await;
    env.fake.set_enterprise(false);
    env.fake.inject_fault(fault).expect("valid");
    assert_eq!(env.as_operator(Request::new("GET", KEYS)).await.status, 404);
    env.fake.set_enterprise(true);
    let faulted = env
        .http
        .get(format!("{}{KEYS}", env.fake.url()))
        .header("Coder-Session-Token", env.fake.operator_token())
        .send()
        .await;
    assert_eq!(
        faulted.as_ref().ok().map(|answer| answer.status().as_u16()),
        faulted_status,
        "{faulted:?}"
    );
    assert_eq!(env.as_operator(Request::new("GET", KEYS)).await.status, 200);
}

/// The suite renames the default organization for its runs; `default` still finds it, by id too.
#[tokio::test]
async fn the_admin_api_renames_the_default_organization() {
    let env = Env::start().await;
    let admin = env.fake.admin();
    let renamed = admin
        .rename_organization("default", "renamed-default-org")
        .await
        .expect("renamed");
    assert!(renamed.is_default);
    let by_default = env
        .as_operator(Request::new("GET", "/api/v2/organizations/default"))
        .await;
    assert_eq!(by_default.status, 200);
    assert_eq!(by_default.json()["name"], "renamed-default-org");
    assert_eq!(by_default.json()["id"], renamed.id.as_str());
    let by_old_name = env
        .as_operator(Request::new("GET", "/api/v2/organizations/coder"))
        .await;
    assert_eq!(by_old_name.status, 404);
    assert!(admin.rename_organization("no-such-org", "x").await.is_err());
}
