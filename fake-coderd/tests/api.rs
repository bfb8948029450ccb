//! The coderd routes over HTTP: every error row of coderd-api.md §1.4–§2.9, the success answers with
//! their exact field names, and the §1.7 rate limiter.

mod common;

use std::collections::BTreeMap;

use common::{Env, JSON, Request, field_names};
use fake_coderd::api::{
    AUTHORIZER_REFUSED_DETAIL, FEATURE_GATE_MESSAGE, INTERNAL_ERROR_MESSAGE,
    RESOURCE_NOT_FOUND_MESSAGE, SIGNED_OUT_MESSAGE,
};
use fake_coderd::{
    CoderdVersion, Entitlement, JournalQuery, RateLimitSpec, SeedUser, UserRole, UserStatus,
    fingerprint, routes,
};
use rstest::rstest;
use serde_json::{Value, json};

const KEY_43: &str = "0123456789012345678901234567890123456789012";
const NAME_65: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const NAME_64: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
/// 33 two-byte characters: 66 bytes, so too long although only 33 characters.
const NAME_66_BYTES: &str = "ééééééééééééééééééééééééééééééééé";

/// Who sends the request.
#[derive(Clone, Copy, Debug)]
enum Who {
    Nobody,
    Operator,
    Member,
    Expired,
    Suspended,
    WrongSecret,
    Raw(&'static str),
    DaemonKey(&'static str),
    DaemonKeyAndPsk,
    DaemonPsk(&'static str),
}

/// Deployment state before the request.
#[derive(Clone, Copy, Debug)]
enum Given {
    Nothing,
    Entitlement(Entitlement),
    KeyNamed(&'static str),
    EntitlementsNeedToken,
    Agpl,
}

async fn prepare(env: &Env, given: Given, who: Who) -> Vec<(&'static str, String)> {
    let fake = &env.fake;
    match given {
        Given::Nothing => {}
        Given::Entitlement(entitlement) => fake.set_entitlement(entitlement),
        Given::KeyNamed(name) => {
            fake.create_key_directly("default", name, BTreeMap::new())
                .expect("key created");
        }
        Given::EntitlementsNeedToken => fake.set_entitlements_require_token(true),
        Given::Agpl => fake.set_enterprise(false),
    }
    let session = |token: String| vec![("Coder-Session-Token", token)];
    let user = |status: UserStatus, expired: bool| {
        let mut spec = SeedUser::new("someone", UserRole::Member);
        spec.status = status;
        spec.token_expired = expired;
        fake.add_user_with(&spec).expect("user added")
    };
    match who {
        Who::Nobody => Vec::new(),
        Who::Operator => session(fake.operator_token()),
        Who::Member => session(user(UserStatus::Active, false)),
        Who::Expired => session(user(UserStatus::Active, true)),
        Who::Suspended => session(user(UserStatus::Suspended, false)),
        Who::WrongSecret => {
            let (id, _) = fake
                .operator_token()
                .split_once('-')
                .map(|(id, s)| (id.to_string(), s.to_string()))
                .expect("shaped");
            session(format!("{id}-{}", "x".repeat(22)))
        }
        Who::Raw(token) => session(token.to_string()),
        Who::DaemonKey(key) => vec![("Coder-Provisioner-Daemon-Key", key.to_string())],
        Who::DaemonKeyAndPsk => {
            vec![
                ("Coder-Provisioner-Daemon-Key", KEY_43.to_string()),
                ("Coder-Provisioner-Daemon-PSK", "psk".to_string()),
            ]
        }
        Who::DaemonPsk(psk) => vec![("Coder-Provisioner-Daemon-PSK", psk.to_string())],
    }
}

/// `expected` must equal `actual`, except that a string ending in `*` only has to be a prefix.
fn assert_matches(expected: &Value, actual: &Value) {
    match (expected, actual) {
        (Value::String(pattern), Value::String(text)) if pattern.ends_with('*') => {
            assert!(
                text.starts_with(pattern.trim_end_matches('*')),
                "{text:?} does not start with {pattern:?}"
            );
        }
        (Value::Object(expected_fields), Value::Object(actual_fields)) => {
            assert_eq!(
                field_names(expected),
                field_names(actual),
                "fields of {actual}"
            );
            for (name, value) in expected_fields {
                assert_matches(value, &actual_fields[name]);
            }
        }
        _ => assert_eq!(expected, actual),
    }
}

fn signed_out(detail: &str) -> Value {
    json!({ "message": SIGNED_OUT_MESSAGE, "detail": detail })
}

fn message(text: &str) -> Value {
    json!({ "message": text })
}

/// coderd `httpmw/organizationparam.go` (since coder/coder PR #13629): an unknown organization (or
/// one the caller may not read) gets the generic not-found response, ONE JSON object. The older
/// two-object body is the `legacy_organization_not_found` fault (tests/control.rs).
fn org_not_found(_arg: &str) -> Value {
    json!({ "message": RESOURCE_NOT_FOUND_MESSAGE })
}

fn validation(text: &str) -> Value {
    json!({ "message": text, "validations": [{ "field": "name", "detail": text }] })
}

const NO_TOKEN: &str = "Cookie \"coder_session_token\" or query parameter must be provided.";
const KEYS: &str = "/api/v2/organizations/default/provisionerkeys";
const ME: &str = "/api/v2/users/me";

#[rstest]
// §1.4 authentication failures
#[case::no_token(
    Given::Nothing,
    Who::Nobody,
    "GET",
    ME,
    None,
    401,
    signed_out(NO_TOKEN)
)]
#[case::one_part(
    Given::Nothing,
    Who::Raw("abc"),
    "GET",
    ME,
    None,
    401,
    signed_out("Invalid API key format: incorrect amount of API key parts, expected 2 got 1")
)]
#[case::three_parts(
    Given::Nothing,
    Who::Raw("a-b-c"),
    "GET",
    ME,
    None,
    401,
    signed_out("Invalid API key format: incorrect amount of API key parts, expected 2 got 3")
)]
#[case::short_id(
    Given::Nothing,
    Who::Raw("abcdefg-0123456789012345678901"),
    "GET",
    ME,
    None,
    401,
    signed_out("Invalid API key format: invalid API key ID length, expected 10 got 7")
)]
#[case::short_secret(
    Given::Nothing,
    Who::Raw("abcdefghij-01234"),
    "GET",
    ME,
    None,
    401,
    signed_out("Invalid API key format: invalid API key secret length, expected 22 got 5")
)]
#[case::unknown_id(
    Given::Nothing,
    Who::Raw("zzzzzzzzzz-0123456789012345678901"),
    "GET",
    ME,
    None,
    401,
    signed_out("API key is invalid.")
)]
#[case::wrong_secret(
    Given::Nothing,
    Who::WrongSecret,
    "GET",
    ME,
    None,
    401,
    signed_out("API key secret is invalid.")
)]
#[case::expired(
    Given::Nothing,
    Who::Expired,
    "GET",
    ME,
    None,
    401,
    signed_out("API key expired at \"*")
)]
#[case::suspended(
    Given::Nothing,
    Who::Suspended,
    "GET",
    ME,
    None,
    401,
    message(
        "User is not active (status = \"suspended\"). Contact an admin to reactivate your account."
    )
)]
#[case::keys_need_token(
    Given::Nothing,
    Who::Nobody,
    "GET",
    KEYS,
    None,
    401,
    signed_out(NO_TOKEN)
)]
#[case::create_needs_token(
    Given::Nothing,
    Who::Nobody,
    "POST",
    KEYS,
    Some(r#"{"name":"k"}"#),
    401,
    signed_out(NO_TOKEN)
)]
#[case::delete_needs_token(
    Given::Nothing,
    Who::Nobody,
    "DELETE",
    "/api/v2/organizations/default/provisionerkeys/k",
    None,
    401,
    signed_out(NO_TOKEN)
)]
#[case::org_needs_token(
    Given::Nothing,
    Who::Nobody,
    "GET",
    "/api/v2/organizations/default",
    None,
    401,
    signed_out(NO_TOKEN)
)]
// §1.5 shared answers and §1.6 precedence
#[case::token_before_org(
    Given::Nothing,
    Who::Nobody,
    "GET",
    "/api/v2/organizations/nope/provisionerkeys",
    None,
    401,
    signed_out(NO_TOKEN)
)]
#[case::org_before_gate(
    Given::Entitlement(Entitlement::NotEntitled),
    Who::Operator,
    "GET",
    "/api/v2/organizations/nope/provisionerkeys",
    None,
    404,
    org_not_found("nope")
)]
#[case::gate_list(
    Given::Entitlement(Entitlement::NotEntitled),
    Who::Operator,
    "GET",
    KEYS,
    None,
    403,
    message(FEATURE_GATE_MESSAGE)
)]
#[case::gate_list_absent(
    Given::Entitlement(Entitlement::Absent),
    Who::Operator,
    "GET",
    KEYS,
    None,
    403,
    message(FEATURE_GATE_MESSAGE)
)]
#[case::gate_create(
    Given::Entitlement(Entitlement::NotEntitled),
    Who::Operator,
    "POST",
    KEYS,
    Some(r#"{"name":"k"}"#),
    403,
    message(FEATURE_GATE_MESSAGE)
)]
#[case::gate_before_body(
    Given::Entitlement(Entitlement::NotEntitled),
    Who::Operator,
    "POST",
    KEYS,
    Some("not json"),
    403,
    message(FEATURE_GATE_MESSAGE)
)]
#[case::gate_delete(
    Given::Entitlement(Entitlement::NotEntitled),
    Who::Operator,
    "DELETE",
    "/api/v2/organizations/default/provisionerkeys/k",
    None,
    403,
    message(FEATURE_GATE_MESSAGE)
)]
// coderd `rbac/roles.go`: a member reads provisioner daemons site-wide, so the list is theirs too.
#[case::member_lists(Given::Nothing, Who::Member, "GET", KEYS, None, 200, json!([]))]
// `dbauthz` refuses a member's insert; `postProvisionerKey` answers that error 500.
#[case::member_create_refused(Given::Nothing, Who::Member, "POST", KEYS, Some(r#"{"name":"k"}"#), 500, json!({"message": INTERNAL_ERROR_MESSAGE, "detail": AUTHORIZER_REFUSED_DETAIL}))]
#[case::member_other_org(
    Given::Nothing,
    Who::Member,
    "GET",
    "/api/v2/organizations/{acme_id}",
    None,
    404,
    org_not_found("{acme_id}")
)]
#[case::member_other_user(
    Given::Nothing,
    Who::Member,
    "GET",
    "/api/v2/users/coder-k8s-operator",
    None,
    404,
    message(RESOURCE_NOT_FOUND_MESSAGE)
)]
// §2.3 organization lookup
#[case::org_unknown_name(
    Given::Nothing,
    Who::Operator,
    "GET",
    "/api/v2/organizations/nope",
    None,
    404,
    org_not_found("nope")
)]
// coderd `httpmw/organizationparam.go`: only the exact path value `default` means the default
// organization; `Default` is a name lookup, and the default organization is `coder`.
#[case::org_default_capitalised(
    Given::Nothing,
    Who::Operator,
    "GET",
    "/api/v2/organizations/Default",
    None,
    404,
    org_not_found("Default")
)]
#[case::org_default_upper_on_keys(
    Given::Nothing,
    Who::Operator,
    "GET",
    "/api/v2/organizations/DEFAULT/provisionerkeys",
    None,
    404,
    org_not_found("DEFAULT")
)]
#[case::org_unknown_id(
    Given::Nothing,
    Who::Operator,
    "GET",
    "/api/v2/organizations/11111111-1111-1111-1111-111111111111",
    None,
    404,
    org_not_found("11111111-1111-1111-1111-111111111111")
)]
// §2.4 entitlements with the token switch on
#[case::entitlements_switch(
    Given::EntitlementsNeedToken,
    Who::Nobody,
    "GET",
    "/api/v2/entitlements",
    None,
    401,
    signed_out(NO_TOKEN)
)]
#[case::entitlements_switch_bad_token(
    Given::EntitlementsNeedToken,
    Who::Raw("zzzzzzzzzz-0123456789012345678901"),
    "GET",
    "/api/v2/entitlements",
    None,
    401,
    signed_out("API key is invalid.")
)]
// §2.6 create validation, in coderd's order
#[case::body_not_json(Given::Nothing, Who::Operator, "POST", KEYS, Some("not json"), 400, json!({"message": "Request body must be valid JSON.", "detail": "*"}))]
#[case::body_empty(Given::Nothing, Who::Operator, "POST", KEYS, Some(""), 400, json!({"message": "Request body must be valid JSON.", "detail": "*"}))]
#[case::tag_value_number(Given::Nothing, Who::Operator, "POST", KEYS, Some(r#"{"name":"k","tags":{"a":1}}"#), 400, json!({"message": "Request body must be valid JSON.", "detail": "*"}))]
#[case::name_missing(
    Given::Nothing,
    Who::Operator,
    "POST",
    KEYS,
    Some(r#"{"tags":{}}"#),
    400,
    validation("Name is required")
)]
#[case::name_empty(
    Given::Nothing,
    Who::Operator,
    "POST",
    KEYS,
    Some(r#"{"name":""}"#),
    400,
    validation("Name is required")
)]
#[case::name_65(
    Given::Nothing,
    Who::Operator,
    "POST",
    KEYS,
    Some(const_format_name(NAME_65)),
    400,
    validation("Name must be at most 64 characters")
)]
#[case::name_66_bytes(
    Given::Nothing,
    Who::Operator,
    "POST",
    KEYS,
    Some(const_format_name(NAME_66_BYTES)),
    400,
    validation("Name must be at most 64 characters")
)]
#[case::reserved_psk_upper(
    Given::Nothing,
    Who::Operator,
    "POST",
    KEYS,
    Some(r#"{"name":"PSK"}"#),
    400,
    validation("Name cannot be reserved name 'PSK'")
)]
#[case::reserved_built_in(
    Given::Nothing,
    Who::Operator,
    "POST",
    "/api/v2/organizations/{acme_id}/provisionerkeys",
    Some(r#"{"name":"built-in"}"#),
    400,
    validation("Name cannot be reserved name 'built-in'")
)]
// coderd `enterprise/coderd/provisionerkeys.go`: `strings.EqualFold` uses Unicode simple folding.
#[case::reserved_long_s(
    Given::Nothing,
    Who::Operator,
    "POST",
    KEYS,
    Some(r#"{"name":"pſk"}"#),
    400,
    validation("Name cannot be reserved name 'pſk'")
)]
// coderd `httpapi.Read` (Go `json.Decoder`): an array does not decode into the request struct.
#[case::body_array(Given::Nothing, Who::Operator, "POST", KEYS, Some(r#"["x"]"#), 400, json!({"message": "Request body must be valid JSON.", "detail": "*"}))]
#[case::body_null_is_an_empty_request(
    Given::Nothing,
    Who::Operator,
    "POST",
    KEYS,
    Some("null"),
    400,
    validation("Name is required")
)]
#[case::reserved_user_auth(
    Given::Nothing,
    Who::Operator,
    "POST",
    KEYS,
    Some(r#"{"name":"User-Auth"}"#),
    400,
    validation("Name cannot be reserved name 'User-Auth'")
)]
#[case::duplicate_other_case(
    Given::KeyNamed("taken"),
    Who::Operator,
    "POST",
    KEYS,
    Some(r#"{"name":"TAKEN"}"#),
    409,
    message("Provisioner key with name 'TAKEN' already exists in organization")
)]
#[case::duplicate_same_case(
    Given::KeyNamed("taken"),
    Who::Operator,
    "POST",
    KEYS,
    Some(r#"{"name":"taken","tags":{"a":"b"}}"#),
    409,
    message("Provisioner key with name 'taken' already exists in organization")
)]
// §2.7 delete
#[case::delete_unknown(
    Given::Nothing,
    Who::Operator,
    "DELETE",
    "/api/v2/organizations/default/provisionerkeys/nope",
    None,
    404,
    message(RESOURCE_NOT_FOUND_MESSAGE)
)]
#[case::delete_reserved(
    Given::Nothing,
    Who::Operator,
    "DELETE",
    "/api/v2/organizations/default/provisionerkeys/built-in",
    None,
    400,
    message("Cannot delete reserved 'built-in' provisioner key")
)]
#[case::delete_reserved_upper(
    Given::Nothing,
    Who::Operator,
    "DELETE",
    "/api/v2/organizations/default/provisionerkeys/PSK",
    None,
    400,
    message("Cannot delete reserved 'psk' provisioner key")
)]
#[case::delete_reserved_user_auth(
    Given::Nothing,
    Who::Operator,
    "DELETE",
    "/api/v2/organizations/default/provisionerkeys/user-auth",
    None,
    400,
    message("Cannot delete reserved 'user-auth' provisioner key")
)]
#[case::delete_reserved_elsewhere(
    Given::Nothing,
    Who::Operator,
    "DELETE",
    "/api/v2/organizations/{acme_id}/provisionerkeys/psk",
    None,
    404,
    message(RESOURCE_NOT_FOUND_MESSAGE)
)]
#[case::delete_unknown_org(
    Given::Nothing,
    Who::Operator,
    "DELETE",
    "/api/v2/organizations/nope/provisionerkeys/k",
    None,
    404,
    org_not_found("nope")
)]
// §2.9 daemon key authentication
#[case::daemon_no_key(
    Given::Nothing,
    Who::Nobody,
    "GET",
    "/api/v2/provisionerkeys/x",
    None,
    401,
    message("provisioner daemon key required")
)]
#[case::daemon_key_and_psk(
    Given::Nothing,
    Who::DaemonKeyAndPsk,
    "GET",
    "/api/v2/provisionerkeys/x",
    None,
    400,
    message("provisioner daemon key and psk provided, but only one is allowed")
)]
#[case::daemon_key_short(Given::Nothing, Who::DaemonKey("short"), "GET", "/api/v2/provisionerkeys/short", None, 400, json!({"message": "provisioner daemon key invalid", "detail": "must be 43 characters"}))]
#[case::daemon_key_unknown(
    Given::Nothing,
    Who::DaemonKey(KEY_43),
    "GET",
    "/api/v2/provisionerkeys/x",
    None,
    401,
    message("provisioner daemon key invalid")
)]
#[case::daemon_psk_when_none_configured(
    Given::Nothing,
    Who::DaemonPsk("some-psk"),
    "GET",
    "/api/v2/provisionerkeys/x",
    None,
    401,
    message("provisioner daemon key required")
)]
#[case::daemon_session_token_is_not_a_key(
    Given::Nothing,
    Who::Operator,
    "GET",
    "/api/v2/provisionerkeys/x",
    None,
    401,
    message("provisioner daemon key required")
)]
// §1.1 unknown routes
#[case::unknown_route(
    Given::Nothing,
    Who::Operator,
    "GET",
    "/api/v2/nope",
    None,
    404,
    message("Route not found.")
)]
#[case::agpl_has_no_entitlements(
    Given::Agpl,
    Who::Operator,
    "GET",
    "/api/v2/entitlements",
    None,
    404,
    message("Route not found.")
)]
#[case::agpl_has_no_key_routes(
    Given::Agpl,
    Who::Operator,
    "POST",
    KEYS,
    Some(r#"{"name":"k"}"#),
    404,
    message("Route not found.")
)]
#[case::agpl_has_no_daemon_key_route(
    Given::Agpl,
    Who::DaemonKey(KEY_43),
    "GET",
    "/api/v2/provisionerkeys/x",
    None,
    404,
    message("Route not found.")
)]
#[case::daemons_not_served(
    Given::Nothing,
    Who::Operator,
    "GET",
    "/api/v2/organizations/default/provisionerkeys/daemons",
    None,
    404,
    message("Route not found.")
)]
#[tokio::test]
async fn error_rows(
    #[case] given: Given,
    #[case] who: Who,
    #[case] method: &str,
    #[case] path: &str,
    #[case] body: Option<&str>,
    #[case] status: u16,
    #[case] expected: Value,
) {
    let env = Env::start().await;
    let acme = env.fake.add_organization("Acme").expect("org added");
    let path = path.replace("{acme_id}", &acme.id);
    let mut request = Request::new(method, &path);
    for (name, value) in prepare(&env, given, who).await {
        request = request.header(name, &value);
    }
    if let Some(body) = body {
        request = request.body(body);
    }
    let answer = env.send(request).await;
    assert_eq!(answer.status, status, "{method} {path}: {}", answer.text);
    let expected: Value =
        serde_json::from_str(&expected.to_string().replace("{acme_id}", &acme.id))
            .expect("expected value stays JSON");
    assert_matches(&expected, &answer.json());
    assert_eq!(
        answer.header("x-coder-build-version"),
        Some(
            fake_coderd::CoderdVersion::default()
                .build_version()
                .as_str()
        )
    );
}

/// rstest cases need `&'static str`; these bodies are built once.
fn const_format_name(name: &'static str) -> &'static str {
    Box::leak(json!({ "name": name }).to_string().into_boxed_str())
}

// `enterprise/coderd/coderd.go` mounts `/provisionerkeys` behind
// `ExtractProvisionerDaemonAuthenticated` without the deployment's PSK: even the right PSK, on any
// method, is answered like no credential, and with a key it is the "only one" 400.
#[rstest]
#[case::right_psk(
    "GET",
    Some("right-psk"),
    false,
    401,
    "provisioner daemon key required"
)]
#[case::wrong_psk("GET", Some("wrong"), false, 401, "provisioner daemon key required")]
#[case::right_psk_other_method(
    "POST",
    Some("right-psk"),
    false,
    401,
    "provisioner daemon key required"
)]
#[case::right_psk_with_a_key(
    "GET",
    Some("right-psk"),
    true,
    400,
    "provisioner daemon key and psk provided, but only one is allowed"
)]
#[tokio::test]
async fn a_psk_never_authenticates_the_daemon_key_route(
    #[case] method: &str,
    #[case] psk: Option<&str>,
    #[case] with_key: bool,
    #[case] status: u16,
    #[case] expected: &str,
) {
    let seed = fake_coderd::Seed {
        provisioner_daemon_psk: Some("right-psk".to_string()),
        ..Default::default()
    };
    let fake = fake_coderd::FakeCoderd::start_with(fake_coderd::FakeConfig {
        seed,
        ..Default::default()
    })
    .await
    .expect("starts");
    let secret = fake
        .create_key_directly("default", "k", BTreeMap::new())
        .expect("key");
    let mut request = Request::new(method, "/api/v2/provisionerkeys/x");
    if let Some(psk) = psk {
        request = request.header("Coder-Provisioner-Daemon-PSK", psk);
    }
    if with_key {
        request = request.header("Coder-Provisioner-Daemon-Key", &secret);
    }
    let answer = request.send(&common::http(), &fake.url()).await;
    assert_eq!(answer.status, status, "{}", answer.text);
    assert_eq!(answer.json(), message(expected));
    assert_eq!(fake.journal()[0].authenticated_key_id, None);
}

#[tokio::test]
async fn buildinfo_needs_no_token_and_has_the_sdk_fields() {
    let env = Env::start().await;
    let answer = env.send(Request::new("GET", "/api/v2/buildinfo")).await;
    assert_eq!(answer.status, 200);
    let body = answer.json();
    assert_eq!(
        field_names(&body),
        [
            "agent_api_version",
            "dashboard_url",
            "deployment_id",
            "external_url",
            "provisioner_api_version",
            "telemetry",
            "upgrade_message",
            "version",
            "workspace_proxy"
        ]
    );
    assert_eq!(
        body["version"], "v2.31.0+fake",
        "the newest modelled release"
    );
}

#[rstest]
#[case::header("header")]
#[case::cookie("cookie")]
#[case::query("query")]
#[tokio::test]
async fn users_me_accepts_the_token_from_header_cookie_or_query(#[case] carrier: &str) {
    let env = Env::start().await;
    let token = env.fake.operator_token();
    let path = format!("{ME}?coder_session_token={token}");
    let request = match carrier {
        "header" => Request::new("GET", ME).token(&token),
        "cookie" => Request::new("GET", ME)
            .header("Cookie", &format!("other=1; coder_session_token={token}")),
        _ => Request::new("GET", &path),
    };
    let answer = env.send(request).await;
    assert_eq!(answer.status, 200, "{}", answer.text);
    let user = answer.json();
    assert_eq!(
        field_names(&user),
        [
            "created_at",
            "email",
            "id",
            "last_seen_at",
            "login_type",
            "organization_ids",
            "roles",
            "status",
            "updated_at",
            "username"
        ]
    );
    assert_eq!(user["username"], "coder-k8s-operator");
    assert_eq!(user["status"], "active");
    assert_eq!(
        user["roles"],
        json!([{ "name": "owner", "display_name": "Owner" }])
    );
}

#[rstest]
#[case::literal_default("default", true)]
#[case::nil_uuid("00000000-0000-0000-0000-000000000000", true)]
#[case::default_by_id("{default_id}", true)]
#[case::name("acme", false)]
#[case::name_other_case("ACME", false)]
#[case::default_by_name("coder", true)]
#[case::default_by_name_other_case("Coder", true)]
#[case::id("{acme_id}", false)]
#[tokio::test]
async fn organizations_resolve_by_default_nil_uuid_id_or_name(
    #[case] ident: &str,
    #[case] is_default: bool,
) {
    let env = Env::start().await;
    let acme = env.fake.add_organization("Acme").expect("org added");
    let default_org = env
        .as_operator(Request::new("GET", "/api/v2/organizations/default"))
        .await
        .json();
    let ident = ident
        .replace("{acme_id}", &acme.id)
        .replace("{default_id}", default_org["id"].as_str().expect("id"));
    let answer = env
        .as_operator(Request::new(
            "GET",
            &format!("/api/v2/organizations/{ident}"),
        ))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.text);
    let org = answer.json();
    assert_eq!(
        field_names(&org),
        [
            "created_at",
            "description",
            "display_name",
            "icon",
            "id",
            "is_default",
            "name",
            "updated_at"
        ]
    );
    assert_eq!(org["is_default"], is_default);
    let expected_id = if is_default {
        default_org["id"].clone()
    } else {
        json!(acme.id)
    };
    assert_eq!(org["id"], expected_id);
}

#[rstest]
#[case::entitled(Entitlement::Entitled, Some(("entitled", true)))]
#[case::grace_period(Entitlement::GracePeriod, Some(("grace_period", true)))]
#[case::not_entitled(Entitlement::NotEntitled, Some(("not_entitled", false)))]
#[case::absent(Entitlement::Absent, None)]
#[tokio::test]
async fn entitlements_report_the_feature_without_a_token(
    #[case] entitlement: Entitlement,
    #[case] expected: Option<(&str, bool)>,
) {
    let env = Env::start().await;
    env.fake.set_entitlement(entitlement);
    env.fake.set_license(false);
    let answer = env.send(Request::new("GET", "/api/v2/entitlements")).await;
    assert_eq!(answer.status, 200);
    let body = answer.json();
    assert_eq!(
        field_names(&body),
        [
            "errors",
            "features",
            "has_license",
            "refreshed_at",
            "require_telemetry",
            "trial",
            "warnings"
        ]
    );
    assert_eq!(body["has_license"], false);
    let feature = &body["features"]["external_provisioner_daemons"];
    match expected {
        Some((value, enabled)) => {
            assert_eq!(feature["entitlement"], value);
            assert_eq!(feature["enabled"], enabled);
        }
        None => assert!(feature.is_null(), "feature should be absent: {body}"),
    }
    env.fake.set_entitlements_require_token(true);
    let with_token = env
        .as_operator(Request::new("GET", "/api/v2/entitlements"))
        .await;
    assert_eq!(with_token.status, 200);
}

#[tokio::test]
async fn key_lifecycle_create_list_authenticate_delete() {
    let env = Env::start().await;
    let empty = env.as_operator(Request::new("GET", KEYS)).await;
    assert_eq!(empty.status, 200);
    assert_eq!(empty.json(), json!([]), "reserved keys are never listed");

    let created = env.create_key("default", "My-Key").await;
    assert_eq!(created.status, 201, "{}", created.text);
    let created = created.json();
    assert_eq!(field_names(&created), ["key"]);
    let secret = created["key"].as_str().expect("key").to_string();
    assert_eq!(secret.len(), 43);
    assert!(secret.chars().all(|c| c.is_ascii_alphanumeric()));

    let tagged = r#"{"name":"second key!","tags":{"scope":"organization","any thing":"goes"}}"#;
    assert_eq!(
        env.as_operator(Request::new("POST", KEYS).body(tagged))
            .await
            .status,
        201,
        "no charset or tag validation"
    );
    assert_eq!(
        env.create_key("default", NAME_64).await.status,
        201,
        "64 bytes is allowed"
    );

    let listed = env.as_operator(Request::new("GET", KEYS)).await.json();
    let keys = listed.as_array().expect("array");
    assert_eq!(keys.len(), 3);
    assert_eq!(
        field_names(&keys[0]),
        ["created_at", "id", "name", "organization", "tags"]
    );
    let names: Vec<&str> = keys
        .iter()
        .map(|key| key["name"].as_str().expect("name"))
        .collect();
    assert_eq!(
        names,
        ["my-key", "second key!", NAME_64],
        "lower-cased, oldest first"
    );
    assert_eq!(keys[0]["tags"], json!({}), "null tags are stored as {{}}");
    assert_eq!(
        keys[1]["tags"],
        json!({"scope":"organization","any thing":"goes"})
    );
    let default_org = env
        .as_operator(Request::new("GET", "/api/v2/organizations/default"))
        .await
        .json();
    assert_eq!(keys[0]["organization"], default_org["id"]);

    let daemon = env
        .send(
            Request::new("GET", &format!("/api/v2/provisionerkeys/{secret}"))
                .header("Coder-Provisioner-Daemon-Key", &secret),
        )
        .await;
    assert_eq!(daemon.status, 200, "{}", daemon.text);
    assert_eq!(daemon.json(), keys[0]);

    let deleted = env
        .as_operator(Request::new("DELETE", &format!("{KEYS}/MY-KEY")))
        .await;
    assert_eq!(deleted.status, 204, "delete by name is case-insensitive");
    assert_eq!(deleted.text, "");
    let remaining = env.as_operator(Request::new("GET", KEYS)).await.json();
    assert_eq!(remaining.as_array().map(Vec::len), Some(2));
    let after_delete = env
        .send(
            Request::new("GET", "/api/v2/provisionerkeys/x")
                .header("Coder-Provisioner-Daemon-Key", &secret),
        )
        .await;
    assert_eq!(
        after_delete.status, 401,
        "a deleted key no longer authenticates"
    );
    assert_eq!(
        after_delete.json(),
        message("provisioner daemon key invalid")
    );

    let journal = env.fake.journal();
    let fetched = journal.for_route(routes::DAEMON_KEY);
    assert_eq!(
        fetched[0].authenticated_key_id.as_deref(),
        keys[0]["id"].as_str()
    );
    assert_eq!(
        fetched[0].daemon_key_fingerprint,
        Some(fingerprint(&secret))
    );
    assert_eq!(fetched[1].authenticated_key_id, None);
}

#[tokio::test]
async fn keys_are_per_organization() {
    let env = Env::start().await;
    let acme = env.fake.add_organization("Acme").expect("org added");
    assert_eq!(env.create_key("default", "same").await.status, 201);
    assert_eq!(
        env.create_key("acme", "same").await.status,
        201,
        "the same name in another organization is fine"
    );
    let acme_keys = env.fake.keys(&acme.id).expect("keys");
    assert_eq!(acme_keys.len(), 1);
    assert_eq!(acme_keys[0].organization, acme.id);
}

#[tokio::test]
async fn rate_limit_next_requests_answers_429_json_with_retry_after() {
    let env = Env::start().await;
    env.fake.set_rate_limit(Some(RateLimitSpec::NextRequests {
        method: Some("GET".to_string()),
        route: Some(routes::LIST_KEYS.to_string()),
        count: 2,
    }));
    assert_eq!(
        env.as_operator(Request::new("GET", ME)).await.status,
        200,
        "other routes are not limited"
    );
    for _ in 0..2 {
        let limited = env.as_operator(Request::new("GET", KEYS)).await;
        assert_eq!(limited.status, 429);
        assert_eq!(limited.header("retry-after"), Some("60"));
        assert_eq!(
            limited.json(),
            message("You've been rate limited for sending more than 512 requests in 1m0s.")
        );
    }
    assert_eq!(
        env.as_operator(Request::new("GET", KEYS)).await.status,
        200,
        "only the next 2 requests"
    );
}

#[tokio::test]
async fn rate_limit_window_is_per_caller_and_owners_bypass_it() {
    let env = Env::start().await;
    env.fake.set_rate_limit(Some(RateLimitSpec::Window {
        limit: 2,
        window_secs: 30,
    }));
    for _ in 0..2 {
        assert_eq!(env.as_operator(Request::new("GET", ME)).await.status, 200);
    }
    let limited = env.as_operator(Request::new("GET", ME)).await;
    assert_eq!(limited.status, 429);
    assert_eq!(limited.header("retry-after"), Some("30"));
    assert_eq!(limited.header("x-ratelimit-limit"), Some("2"));
    assert_eq!(limited.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(
        limited.json()["message"],
        "You've been rate limited for sending more than 2 requests in 30s."
    );
    let bypass = env
        .as_operator(Request::new("GET", ME).header("X-Coder-Bypass-Ratelimit", "true"))
        .await;
    assert_eq!(bypass.status, 200, "owners bypass the limiter");
    assert_eq!(
        bypass.header("x-ratelimit-remaining"),
        Some("1"),
        "a fresh budget"
    );
    let member = env.fake.add_user("member", UserRole::Member).expect("user");
    assert_eq!(
        env.send(Request::new("GET", ME).token(&member))
            .await
            .status,
        200,
        "each user has a budget"
    );
    assert_eq!(
        env.as_operator(Request::new("GET", "/api/v2/organizations/default"))
            .await
            .status,
        200,
        "and each endpoint"
    );
}

// coderd `coderd/httpmw/ratelimit.go` (go-chi/httprate): always on, 512 per minute per user and
// endpoint, X-Ratelimit-* on every answer, Retry-After on the 429.
#[tokio::test]
async fn rate_limiting_is_on_by_default_at_512_per_minute_with_headers_on_every_answer() {
    let env = Env::start().await;
    let anonymous = env.send(Request::new("GET", "/api/v2/buildinfo")).await;
    let unknown = env.as_operator(Request::new("GET", "/api/v2/nope")).await;
    for answer in [&anonymous, &unknown] {
        assert_eq!(answer.header("x-ratelimit-limit"), Some("512"));
        assert_eq!(answer.header("x-ratelimit-remaining"), Some("511"));
        let reset: u64 = answer
            .header("x-ratelimit-reset")
            .and_then(|reset| reset.parse().ok())
            .expect("X-Ratelimit-Reset in unix seconds");
        let now = jiff::Timestamp::now().as_second() as u64;
        assert!(reset > now && reset <= now + 61, "{reset} vs {now}");
        assert_eq!(answer.header("retry-after"), None);
    }
    let member = env.fake.add_user("member", UserRole::Member).expect("user");
    let mut answers = Vec::new();
    for _ in 0..512 {
        answers.push(env.send(Request::new("GET", ME).token(&member)).await);
    }
    let (first, last) = (&answers[0], &answers[511]);
    // The budget may straddle a minute boundary (the window's reset moves): then it is spread
    // over two windows and the 512th request is not the last of one.
    let one_window = first.header("x-ratelimit-reset") == last.header("x-ratelimit-reset");
    assert_eq!(last.status, 200);
    if one_window {
        assert_eq!(last.header("x-ratelimit-remaining"), Some("0"));
        let limited = env.send(Request::new("GET", ME).token(&member)).await;
        assert_eq!(limited.status, 429);
        assert_eq!(limited.header("retry-after"), Some("60"));
        assert_eq!(
            limited.json(),
            message("You've been rate limited for sending more than 512 requests in 1m0s.")
        );
    }
    let owner = env
        .as_operator(Request::new("GET", ME).header("X-Coder-Bypass-Ratelimit", "true"))
        .await;
    assert_eq!(owner.status, 200);
}

// coderd `coderd/httpmw/ratelimit.go`: only an authenticated owner may bypass; the header is
// ignored (not answered 428) when no valid session token identifies the caller.
#[rstest]
#[case::no_token(None)]
#[case::invalid_token(Some("zzzzzzzzzz-0123456789012345678901"))]
#[tokio::test]
async fn bypass_header_is_ignored_for_unauthenticated_callers(#[case] token: Option<&str>) {
    let env = Env::start().await;
    let mut request =
        Request::new("GET", "/api/v2/buildinfo").header("X-Coder-Bypass-Ratelimit", "true");
    if let Some(token) = token {
        request = request.token(token);
    }
    let answer = env.send(request).await;
    assert_eq!(answer.status, 200, "{}", answer.text);
    assert_eq!(
        answer.header("x-ratelimit-remaining"),
        Some("511"),
        "counted"
    );
}

#[tokio::test]
async fn rate_limiting_can_be_switched_off_and_back_to_coderds_default() {
    let env = Env::start().await;
    let admin = env.fake.admin();
    admin
        .set_rate_limit(Some(RateLimitSpec::Off))
        .await
        .expect("off");
    let member = env.fake.add_user("member", UserRole::Member).expect("user");
    let off = env
        .send(
            Request::new("GET", ME)
                .token(&member)
                .header("X-Coder-Bypass-Ratelimit", "true"),
        )
        .await;
    assert_eq!(
        off.status, 200,
        "no limiter, no bypass check (--api-rate-limit -1)"
    );
    assert_eq!(off.header("x-ratelimit-limit"), None);
    admin.set_rate_limit(None).await.expect("default");
    let on = env.send(Request::new("GET", ME).token(&member)).await;
    assert_eq!(on.header("x-ratelimit-limit"), Some("512"));
    let off_at_start = fake_coderd::FakeCoderd::start_with(fake_coderd::FakeConfig {
        api_rate_limit: -1,
        ..Default::default()
    })
    .await
    .expect("starts");
    let answer = Request::new("GET", "/api/v2/buildinfo")
        .send(&env.http, &off_at_start.url())
        .await;
    assert_eq!(answer.header("x-ratelimit-limit"), None);
    off_at_start.reset().expect("reset");
    let answer = Request::new("GET", "/api/v2/buildinfo")
        .send(&env.http, &off_at_start.url())
        .await;
    assert_eq!(
        answer.header("x-ratelimit-limit"),
        None,
        "a reset keeps the configured limit"
    );
}

#[rstest]
#[case::member("true")]
#[case::member_numeric("1")]
#[case::member_capitalised("True")]
#[tokio::test]
async fn bypass_header_from_non_owner_is_428_plain_text(#[case] value: &str) {
    let env = Env::start().await;
    let member = env
        .fake
        .add_user("someone", UserRole::Member)
        .expect("user");
    let request = Request::new("GET", "/api/v2/buildinfo")
        .header("X-Coder-Bypass-Ratelimit", value)
        .token(&member);
    let answer = env.send(request).await;
    assert_eq!(answer.status, 428);
    assert_eq!(answer.content_type(), Some("text/plain; charset=utf-8"));
    assert_eq!(
        answer.text,
        "\"X-Coder-Bypass-Ratelimit\" provided but user is not owner\n"
    );
    let ignored = env
        .send(
            Request::new("GET", "/api/v2/buildinfo")
                .header("X-Coder-Bypass-Ratelimit", "false")
                .token(&member),
        )
        .await;
    assert_eq!(
        ignored.status, 200,
        "a false bypass header is no bypass attempt"
    );
    assert_eq!(ignored.content_type(), Some(JSON));
}

// coderd `httpmw/organizationparam.go` + migration `000259_rename_first_organization.up.sql`
// (commit bdaae5e3e280ec5069b5daadbd7966c59f6d0dda): `default` is a path alias, not a name; the
// organization behind it is called `coder` (display name `Coder`), reachable by that name too, and
// the pre-v2.16 name `first-organization` names nothing.
#[tokio::test]
async fn the_default_organization_is_named_coder() {
    let env = Env::start().await;
    let by_alias = env
        .as_operator(Request::new("GET", "/api/v2/organizations/default"))
        .await
        .json();
    assert_eq!(by_alias["name"], "coder");
    assert_eq!(by_alias["display_name"], "Coder");
    assert_eq!(by_alias["is_default"], true);
    let by_name = env
        .as_operator(Request::new("GET", "/api/v2/organizations/coder"))
        .await;
    assert_eq!(by_name.status, 200, "{}", by_name.text);
    assert_eq!(by_name.json(), by_alias);
    let old_name = env
        .as_operator(Request::new(
            "GET",
            "/api/v2/organizations/first-organization",
        ))
        .await;
    assert_eq!(old_name.status, 404, "{}", old_name.text);
    let orgs = env
        .fake
        .admin()
        .organizations()
        .await
        .expect("organizations");
    assert!(
        orgs.iter()
            .all(|org| !org.name.eq_ignore_ascii_case("default"))
    );
}

// coderd RBAC (`coderd/rbac/roles.go`, checked by dbauthz behind `enterprise/coderd/provisionerkeys.go`):
// an organization admin manages the organization's keys; a user outside the organization cannot
// even see it (`coderd/httpmw/organizationparam.go` answers its 404).
#[tokio::test]
async fn organization_admins_manage_keys_and_outsiders_get_404() {
    let env = Env::start().await;
    env.fake.add_organization("Acme").expect("org added");
    let mut admin_spec = SeedUser::new("acme-admin", UserRole::Member);
    admin_spec.organizations = vec!["acme".to_string()];
    admin_spec.organization_admin = vec!["acme".to_string()];
    let admin = env.fake.add_user_with(&admin_spec).expect("user");
    let mut member_spec = SeedUser::new("acme-member", UserRole::Member);
    member_spec.organizations = vec!["acme".to_string()];
    let member = env.fake.add_user_with(&member_spec).expect("user");
    let acme_keys = "/api/v2/organizations/acme/provisionerkeys";

    let created = env
        .send(
            Request::new("POST", acme_keys)
                .token(&admin)
                .body(r#"{"name":"by-admin"}"#),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    let listed = env.send(Request::new("GET", acme_keys).token(&admin)).await;
    assert_eq!(listed.status, 200);
    assert_eq!(listed.json()[0]["name"], "by-admin");

    let outside = env.send(Request::new("GET", KEYS).token(&admin)).await;
    assert_eq!(
        outside.status, 404,
        "not a member of the default organization"
    );
    assert_eq!(outside.json(), org_not_found("default"));
    let outside_create = env
        .send(
            Request::new("POST", KEYS)
                .token(&admin)
                .body(r#"{"name":"x"}"#),
        )
        .await;
    assert_eq!(outside_create.status, 404);

    let plain = env
        .send(Request::new("GET", acme_keys).token(&member))
        .await;
    assert_eq!(plain.status, 200, "a plain member lists the keys");
    assert_eq!(plain.json()[0]["name"], "by-admin");

    let deleted = env
        .send(Request::new("DELETE", &format!("{acme_keys}/by-admin")).token(&admin))
        .await;
    assert_eq!(deleted.status, 204, "{}", deleted.text);
    assert!(env.fake.keys("acme").expect("keys").is_empty());
}

/// A plain organization member on the key routes, as coderd answers (no permission middleware;
/// the database authorizer decides per query): `coderd/rbac/roles.go` (commit db4576d1) gives every
/// member read on provisioner daemons, so the list is 200; `dbauthz.InsertProvisionerKey` /
/// `DeleteProvisionerKey` (commit ccc309e8) refuse the write and `enterprise/coderd/provisionerkeys.go`
/// (commit 09e87fc2) answers the error 500. The name checks and the key lookup come first.
#[tokio::test]
async fn a_plain_member_lists_keys_but_create_and_delete_answer_500() {
    let env = Env::start().await;
    env.fake
        .create_key_directly("default", "shared", BTreeMap::new())
        .expect("key");
    let member = env
        .fake
        .add_user("plain-member", UserRole::Member)
        .expect("member of the default organization");
    let refused = json!({"message": INTERNAL_ERROR_MESSAGE, "detail": AUTHORIZER_REFUSED_DETAIL});
    let send = async |method: &str, path: &str, body: Option<&str>| {
        let mut request = Request::new(method, path).token(&member);
        if let Some(body) = body {
            request = request.body(body);
        }
        env.send(request).await
    };

    let listed = send("GET", KEYS, None).await;
    assert_eq!(listed.status, 200, "{}", listed.text);
    assert_eq!(listed.json()[0]["name"], "shared");

    let created = send("POST", KEYS, Some(r#"{"name":"mine"}"#)).await;
    assert_eq!(created.status, 500, "{}", created.text);
    assert_eq!(created.json(), refused);
    let duplicate = send("POST", KEYS, Some(r#"{"name":"shared"}"#)).await;
    assert_eq!(
        (duplicate.status, duplicate.json()),
        (500, refused.clone()),
        "the authorizer refuses the insert before a duplicate could show"
    );
    let empty = send("POST", KEYS, Some(r#"{"name":""}"#)).await;
    assert_eq!(empty.status, 400, "name checks come before the insert");
    let reserved = send("POST", KEYS, Some(r#"{"name":"psk"}"#)).await;
    assert_eq!(reserved.status, 400);

    let deleted = send("DELETE", &format!("{KEYS}/shared"), None).await;
    assert_eq!(deleted.status, 500, "{}", deleted.text);
    assert_eq!(deleted.json(), refused);
    let missing = send("DELETE", &format!("{KEYS}/no-such-key"), None).await;
    assert_eq!(missing.status, 404, "the key lookup comes first");
    assert_eq!(missing.json(), message(RESOURCE_NOT_FOUND_MESSAGE));
    let reserved = send("DELETE", &format!("{KEYS}/psk"), None).await;
    assert_eq!(reserved.status, 400, "{}", reserved.text);

    let names: Vec<String> = env
        .fake
        .keys("default")
        .expect("keys")
        .into_iter()
        .map(|key| key.name)
        .collect();
    assert_eq!(names, ["shared"], "nothing created, nothing deleted");
}

/// `coderd/rbac/roles.go` (commit db4576d1): `template-admin` holds create/read/update/delete on
/// provisioner daemons and read on organizations site-wide, so it manages keys in an organization
/// it is not a member of; it is not an owner, so the bypass header answers 428.
#[tokio::test]
async fn a_template_admin_manages_keys_in_every_organization() {
    let env = Env::start().await;
    env.fake.add_organization("Acme").expect("org added");
    let mut spec = SeedUser::new("templates", UserRole::TemplateAdmin);
    spec.organizations = Vec::new();
    let admin = env.fake.add_user_with(&spec).expect("user");
    let acme_keys = "/api/v2/organizations/acme/provisionerkeys";

    let me = env.send(Request::new("GET", ME).token(&admin)).await.json();
    assert_eq!(
        me["roles"],
        json!([{ "name": "template-admin", "display_name": "Template Admin" }])
    );
    let org = env
        .send(Request::new("GET", "/api/v2/organizations/acme").token(&admin))
        .await;
    assert_eq!(org.status, 200, "{}", org.text);
    let created = env
        .send(
            Request::new("POST", acme_keys)
                .token(&admin)
                .body(r#"{"name":"tpl"}"#),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    let listed = env.send(Request::new("GET", acme_keys).token(&admin)).await;
    assert_eq!(listed.json()[0]["name"], "tpl");
    let deleted = env
        .send(Request::new("DELETE", &format!("{acme_keys}/tpl")).token(&admin))
        .await;
    assert_eq!(deleted.status, 204, "{}", deleted.text);
    let bypass = env
        .send(
            Request::new("GET", acme_keys)
                .token(&admin)
                .header("X-Coder-Bypass-Ratelimit", "true"),
        )
        .await;
    assert_eq!(bypass.status, 428, "only owners may bypass");
}

// coderd routes on the decoded path with slashes collapsed (`singleSlashMW`; chi,
// `enterprise/coderd/coderd.go` `/provisionerkeys/{provisionerkey}`), so the daemon key must be
// redacted from the journal (and the log, which prints the same path) however the path spells it.
#[rstest]
#[case::literal("/api/v2/provisionerkeys/{key}", true)]
#[case::encoded_segment("/api/v2/provisioner%6Beys/{key}", true)]
#[case::encoded_api("/%61pi/v2/provisionerkeys/{key}", true)]
#[case::doubled_slash("//api/v2/provisionerkeys/{key}", true)]
#[case::doubled_inner_slash("/api/v2//provisionerkeys/{key}", true)]
#[case::encoded_key("/api/v2/provisionerkeys/{encoded key}", true)]
#[case::encoded_slash_before_key("/api/v2/provisionerkeys%2F{key}", false)]
#[case::trailing_slash_after_key("/api/v2/provisionerkeys/{key}/", false)]
#[case::literal_without_header("/api/v2/provisionerkeys/{key}", false)]
#[case::encoded_without_header("/api/v2/provisioner%6Beys/{key}", false)]
#[case::key_in_query("/api/v2/buildinfo?k={key}", true)]
#[tokio::test]
async fn daemon_keys_never_reach_the_journal(#[case] path: &str, #[case] with_header: bool) {
    let env = Env::start().await;
    let secret = env
        .fake
        .create_key_directly("default", "k", BTreeMap::new())
        .expect("key");
    let encoded: String = secret
        .chars()
        .map(|c| format!("%{:02X}", c as u32))
        .collect();
    let path = path
        .replace("{key}", &secret)
        .replace("{encoded key}", &encoded);
    let mut request = Request::new("GET", &path);
    if with_header {
        request = request.header("Coder-Provisioner-Daemon-Key", &secret);
    }
    let answer = env.send(request).await;
    let journal = env.fake.journal();
    assert_eq!(journal.len(), 1);
    let recorded = serde_json::to_string(&journal[0]).expect("serialises");
    assert!(
        !recorded.contains(&secret) && !recorded.contains(&encoded),
        "{path} ({}): {recorded}",
        answer.status
    );
    assert!(
        journal[0].path.contains("<redacted>"),
        "{}",
        journal[0].path
    );
}

// coderd `httpapi.Read`: Go's `json.Decoder` matches field names case-insensitively, lets later
// fields win, and does not read past the first JSON value.
#[rstest]
#[case::upper_case_field(r#"{"NAME":"upper"}"#, "upper")]
#[case::folded_field(r#"{"nAmE":"mixed","TAGſ":{"a":null}}"#, "mixed")]
#[case::later_field_wins(r#"{"name":"first","Name":"second"}"#, "second")]
#[case::null_name_changes_nothing(r#"{"name":"kept","NAME":null}"#, "kept")]
#[case::trailing_data(r#"{"name":"trailing"} and then some"#, "trailing")]
#[tokio::test]
async fn create_decodes_the_body_like_go(#[case] body: &str, #[case] name: &str) {
    let env = Env::start().await;
    let created = env.as_operator(Request::new("POST", KEYS).body(body)).await;
    assert_eq!(created.status, 201, "{body}: {}", created.text);
    let keys = env.fake.keys("default").expect("keys");
    assert_eq!(keys[0].name, name);
    if body.contains("TAG") {
        assert_eq!(
            keys[0].tags.get("a").map(String::as_str),
            Some(""),
            "null tag value"
        );
    }
}

// coderd `httpmw/apikey.go` `APITokenFromRequest`: an empty cookie or query value falls through
// to the next source.
#[rstest]
#[case::empty_cookie("cookie")]
#[case::empty_query("query")]
#[tokio::test]
async fn an_empty_token_source_falls_through_to_the_header(#[case] carrier: &str) {
    let env = Env::start().await;
    let token = env.fake.operator_token();
    let path = format!("{ME}?coder_session_token=");
    let request = match carrier {
        "cookie" => Request::new("GET", ME).header("Cookie", "coder_session_token="),
        _ => Request::new("GET", &path),
    };
    let answer = env.send(request.token(&token)).await;
    assert_eq!(answer.status, 200, "{}", answer.text);
}

// coderd `enterprise/coderd/coderd.go` `serveEntitlements`: the features map holds every feature
// name; the seed's Premium license entitles all but the limit features.
#[tokio::test]
async fn entitlements_list_every_feature_name() {
    let env = Env::start().await;
    let body = env
        .send(Request::new("GET", "/api/v2/entitlements"))
        .await
        .json();
    let features = body["features"].as_object().expect("features");
    assert_eq!(features.len(), 26, "{features:?}");
    for (name, entitlement) in [
        ("user_limit", "not_entitled"),
        ("multiple_organizations", "entitled"),
        ("workspace_prebuilds", "entitled"),
        ("boundary", "entitled"),
    ] {
        assert_eq!(features[name]["entitlement"], entitlement, "{name}");
    }
}

// coderd `httpmw/apikey.go` `ExtractAPIKey` with `ActivateDormantUser` (`coderd/userauth.go`): a
// dormant user's token on a route behind the API-key middleware makes the user active (and
// bumps `updated_at`) and the request goes on; a route without that middleware (`/buildinfo`)
// leaves the user dormant.
#[tokio::test]
async fn a_dormant_users_token_makes_them_active() {
    let env = Env::start().await;
    let mut sleeper = SeedUser::new("sleeper", UserRole::Member);
    sleeper.status = UserStatus::Dormant;
    let token = env.fake.add_user_with(&sleeper).expect("user added");
    let before = env.fake.user("sleeper").expect("user");
    assert_eq!(before.status, "dormant");

    let buildinfo = env
        .send(Request::new("GET", "/api/v2/buildinfo").token(&token))
        .await;
    assert_eq!(buildinfo.status, 200);
    assert_eq!(env.fake.user("sleeper").expect("user").status, "dormant");

    let me = env.send(Request::new("GET", ME).token(&token)).await;
    assert_eq!(me.status, 200, "{}", me.text);
    assert_eq!(me.json()["status"], "active");
    let after = env.fake.admin().user("sleeper").await.expect("admin user");
    assert_eq!(after.status, "active");
    assert!(after.updated_at > before.updated_at, "{after:?}");
    assert_eq!(env.fake.user(&after.id).expect("by id"), after);
    assert!(env.fake.admin().user("nobody").await.is_err());
}

const EXPIRED_WARNING: &str =
    "External Provisioner Daemons is enabled but your license for this feature is expired.";
const NOT_ENTITLED_WARNING: &str =
    "External Provisioner Daemons is enabled but your license is not entitled to this feature.";

// `enterprise/coderd/license/license.go` `LicensesEntitlements` for one Premium license: its
// features carry the license's entitlement, `user_limit` always shows `actual`, and each enabled
// feature in grace period (or enabled and not entitled) gets coderd's own warning text.
#[rstest]
#[case::entitled(true, Entitlement::Entitled, "entitled", true, &[])]
#[case::grace_period(true, Entitlement::GracePeriod, "grace_period", true, &[EXPIRED_WARNING, "Audit Log is enabled but your license for this feature is expired."])]
#[case::licensed_without_the_feature(true, Entitlement::NotEntitled, "entitled", true, &[NOT_ENTITLED_WARNING])]
#[case::unlicensed(false, Entitlement::NotEntitled, "not_entitled", false, &[])]
#[tokio::test]
async fn entitlements_follow_coderds_license_rules(
    #[case] has_license: bool,
    #[case] entitlement: Entitlement,
    #[case] licensed: &str,
    #[case] audit_log_enabled: bool,
    #[case] expected_warnings: &[&str],
) {
    let env = Env::start().await;
    env.fake.set_license(has_license);
    env.fake.set_entitlement(entitlement);
    let body = env
        .send(Request::new("GET", "/api/v2/entitlements"))
        .await
        .json();
    let features = &body["features"];
    assert_eq!(
        features["audit_log"],
        json!({"entitlement": licensed, "enabled": audit_log_enabled})
    );
    assert_eq!(
        features["browser_only"],
        json!({"entitlement": licensed, "enabled": false}),
        "licensed, but not configured"
    );
    assert_eq!(
        features["user_limit"],
        json!({"entitlement": "not_entitled", "enabled": false, "actual": 1}),
        "the operator is the one active user; the license has no limit"
    );
    let warnings: Vec<&str> = body["warnings"]
        .as_array()
        .expect("warnings")
        .iter()
        .map(|warning| warning.as_str().expect("text"))
        .collect();
    for expected in expected_warnings {
        assert!(warnings.contains(expected), "{expected:?} in {warnings:#?}");
    }
    if expected_warnings.is_empty() {
        assert!(warnings.is_empty(), "{warnings:#?}");
    }
    assert!(
        warnings
            .iter()
            .all(|warning| !warning.contains("grace period")),
        "{warnings:#?}"
    );
}

// `refreshed_at` is when coderd last computed the entitlements (at start, on a license change,
// every 10 minutes), and `user_limit.actual` is the count taken then, not on every read.
#[tokio::test]
async fn refreshed_at_and_actual_come_from_the_last_refresh() {
    let env = Env::start().await;
    let read = || async {
        env.send(Request::new("GET", "/api/v2/entitlements"))
            .await
            .json()
    };
    let first = read().await;
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    env.fake
        .add_user("newcomer", UserRole::Member)
        .expect("user added");
    let second = read().await;
    assert_eq!(second["refreshed_at"], first["refreshed_at"]);
    assert_eq!(second["features"]["user_limit"]["actual"], 1);
    env.fake.set_entitlement(Entitlement::Entitled);
    let refreshed = read().await;
    let at = |body: &Value| -> jiff::Timestamp {
        body["refreshed_at"]
            .as_str()
            .expect("refreshed_at")
            .parse()
            .expect("RFC 3339")
    };
    assert!(at(&refreshed) > at(&first), "{refreshed} after {first}");
    assert_eq!(refreshed["features"]["user_limit"]["actual"], 2);
}

async fn fake_of(version: CoderdVersion) -> fake_coderd::FakeCoderd {
    fake_coderd::FakeCoderd::start_with(fake_coderd::FakeConfig {
        coderd_version: version,
        ..Default::default()
    })
    .await
    .expect("starts")
}

// `--coderd-version` names the modelled release: `X-Coder-Build-Version`, `/buildinfo`'s
// `version` and the admin API's info report it.
#[rstest]
#[case::v2_30_0(CoderdVersion::V2_30_0, "v2.30.0+fake")]
#[case::v2_31_0(CoderdVersion::V2_31_0, "v2.31.0+fake")]
#[tokio::test]
async fn the_modelled_release_is_reported(#[case] version: CoderdVersion, #[case] build: &str) {
    let fake = fake_of(version).await;
    let answer = Request::new("GET", "/api/v2/buildinfo")
        .send(&common::http(), &fake.url())
        .await;
    assert_eq!(answer.header("x-coder-build-version"), Some(build));
    assert_eq!(answer.json()["version"], build);
    assert_eq!(fake.coderd_version(), version);
    assert_eq!(
        fake.admin().info().await.expect("info").coderd_version,
        version
    );
}

// The limiter of each release, at 2 requests a minute on one path: v2.30.0 ran it before the API
// key was extracted (coder/coder issue #20857), so it keys by client IP (every caller is one IP
// here) and never reads the bypass header; v2.31.0 (PR #22049) keys by user, lets an owner's
// bypass through and answers 428 to a member's.
#[rstest]
#[case::v2_30_0(CoderdVersion::V2_30_0, [200, 200, 429, 429, 429])]
#[case::v2_31_0(CoderdVersion::V2_31_0, [200, 200, 200, 200, 428])]
#[tokio::test]
async fn each_release_keys_the_rate_limit_its_own_way(
    #[case] version: CoderdVersion,
    #[case] expected: [u16; 5],
) {
    let fake = fake_of(version).await;
    fake.set_rate_limit(Some(RateLimitSpec::Window {
        limit: 2,
        window_secs: 60,
    }));
    let member = fake.add_user("member", UserRole::Member).expect("user");
    let owner = fake.operator_token();
    let http = common::http();
    let me = |token: &str, bypass: bool| {
        let request = Request::new("GET", ME).token(token);
        if bypass {
            request.header("X-Coder-Bypass-Ratelimit", "true")
        } else {
            request
        }
    };
    let mut statuses = Vec::new();
    for (token, bypass) in [
        (&owner, false),
        (&owner, false),
        (&member, false),
        (&owner, true),
        (&member, true),
    ] {
        statuses.push(me(token, bypass).send(&http, &fake.url()).await.status);
    }
    assert_eq!(statuses, expected);
}
