//! Every response body of every route, validated against coderd's own swagger schemas
//! (`schema/coderd-swagger-subset.json`, a verbatim subset of coder/coder `coderd/apidoc/swagger.json`).
//! Stricter than swagger in one way: a field the schema does not declare fails, so the fake cannot
//! drift into inventing fields. Error bodies are checked against `codersdk.Response`.

mod common;

use std::collections::BTreeMap;

use common::{Env, Request};
use fake_coderd::{Entitlement, FaultSpec, RateLimitSpec, routes};
use serde_json::Value;

const SWAGGER: &str = include_str!("schema/coderd-swagger-subset.json");

struct Schemas {
    swagger: Value,
}

impl Schemas {
    fn load() -> Schemas {
        Schemas {
            swagger: serde_json::from_str(SWAGGER).expect("swagger subset is JSON"),
        }
    }

    /// The declared schema of a success answer (`None`: no body, e.g. 204).
    fn response(&self, template: &str, method: &str, status: u16) -> Option<&Value> {
        let path = template.strip_prefix("/api/v2").expect("under /api/v2");
        let operation = &self.swagger["paths"][path][method.to_lowercase()];
        assert!(operation.is_object(), "swagger has no {method} {path}");
        let response = &operation["responses"][status.to_string()];
        assert!(
            response.is_object(),
            "swagger declares no {status} for {method} {path}"
        );
        response.get("schema")
    }

    fn definition(&self, name: &str) -> &Value {
        let schema = &self.swagger["definitions"][name];
        assert!(schema.is_object(), "no definition {name}");
        schema
    }

    fn resolve<'a>(&'a self, schema: &'a Value) -> &'a Value {
        match schema.get("$ref").and_then(Value::as_str) {
            Some(reference) => {
                let name = reference
                    .strip_prefix("#/definitions/")
                    .expect("local reference");
                self.resolve(self.definition(name))
            }
            None => schema,
        }
    }

    /// Problems of `value` against `schema`, each with its JSON path.
    fn validate(&self, schema: &Value, value: &Value, at: &str, problems: &mut Vec<String>) {
        let schema = self.resolve(schema);
        if let Some(all_of) = schema.get("allOf").and_then(Value::as_array) {
            for part in all_of {
                self.validate(part, value, at, problems);
            }
        }
        if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
            && !allowed.contains(value)
        {
            problems.push(format!("{at}: {value} is not one of {allowed:?}"));
        }
        let Some(kind) = schema.get("type").and_then(Value::as_str) else {
            return;
        };
        let fits = match kind {
            "object" => value.is_object(),
            "array" => value.is_array(),
            "string" => value.is_string(),
            "integer" => value.is_i64() || value.is_u64(),
            "number" => value.is_number(),
            "boolean" => value.is_boolean(),
            other => panic!("schema type {other} not supported"),
        };
        if !fits {
            problems.push(format!("{at}: {value} is not of type {kind}"));
            return;
        }
        match value {
            Value::String(text) => {
                let format = schema.get("format").and_then(Value::as_str);
                let valid = match format {
                    Some("uuid") => uuid::Uuid::parse_str(text).is_ok(),
                    Some("date-time") => text.parse::<jiff::Timestamp>().is_ok(),
                    _ => true,
                };
                if !valid {
                    problems.push(format!("{at}: {text:?} is not a {format:?}"));
                }
            }
            Value::Array(items) => {
                if let Some(item_schema) = schema.get("items") {
                    for (index, item) in items.iter().enumerate() {
                        self.validate(item_schema, item, &format!("{at}[{index}]"), problems);
                    }
                }
            }
            Value::Object(fields) => {
                let properties = schema.get("properties").and_then(Value::as_object);
                let additional = schema.get("additionalProperties");
                for required in schema
                    .get("required")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                {
                    if !fields.contains_key(required) {
                        problems.push(format!("{at}: required field {required:?} is missing"));
                    }
                }
                for (name, field) in fields {
                    let field_at = format!("{at}.{name}");
                    match (properties.and_then(|p| p.get(name)), additional) {
                        (Some(field_schema), _) | (None, Some(field_schema)) => {
                            self.validate(field_schema, field, &field_at, problems);
                        }
                        (None, None) => {
                            problems.push(format!("{field_at}: not declared by coderd's schema"));
                        }
                    }
                }
            }
            _ => {}
        }
    }

    fn assert_valid(&self, schema: &Value, value: &Value, what: &str) {
        let mut problems = Vec::new();
        self.validate(schema, value, "$", &mut problems);
        assert!(problems.is_empty(), "{what}: {problems:#?}\n{value}");
    }
}

/// (route template, method, path, session token, extra header, body)
type Call<'a> = (
    &'a str,
    &'a str,
    String,
    Option<&'a str>,
    Option<(&'a str, &'a str)>,
    Option<&'a str>,
);

/// Every JSON value of an answer: success bodies against the route's schema, error bodies
/// against `codersdk.Response`.
fn check(schemas: &Schemas, template: &str, method: &str, answer: &common::Answer) {
    let what = format!("{method} {template} → {}", answer.status);
    if (200..300).contains(&answer.status) {
        match schemas.response(template, method, answer.status) {
            Some(schema) => schemas.assert_valid(schema, &answer.json(), &what),
            None => assert_eq!(answer.text, "", "{what}: no body declared"),
        }
    } else if answer.status == 428 {
        assert_eq!(
            answer.content_type(),
            Some("text/plain; charset=utf-8"),
            "{what}"
        );
    } else {
        // One `codersdk.Response` per error body: coderd's organization 404 has been a single
        // object since PR #13629 (the legacy doubled body is a fault, checked below).
        let response = schemas.definition("codersdk.Response");
        schemas.assert_valid(response, &answer.json(), &what);
    }
}

/// The `legacy_organization_not_found` fault: both objects of coderd's pre-PR-#13629 organization
/// 404 are `codersdk.Response`s, on the organization route and on the key routes.
#[tokio::test]
async fn the_legacy_organization_404_is_two_codersdk_responses() {
    let schemas = Schemas::load();
    let env = Env::start().await;
    let response = schemas.definition("codersdk.Response");
    let operator = env.fake.operator_token();
    for (template, method, path) in [
        (routes::ORGANIZATION, "GET", "/api/v2/organizations/nope"),
        (
            routes::LIST_KEYS,
            "GET",
            "/api/v2/organizations/nope/provisionerkeys",
        ),
        (
            routes::CREATE_KEY,
            "POST",
            "/api/v2/organizations/nope/provisionerkeys",
        ),
        (
            routes::DELETE_KEY,
            "DELETE",
            "/api/v2/organizations/nope/provisionerkeys/k",
        ),
    ] {
        env.fake
            .inject_fault(FaultSpec::legacy_organization_not_found(method, template))
            .expect("valid fault");
        let mut request = Request::new(method, path).token(&operator);
        if method == "POST" {
            request = request.body(r#"{"name":"k"}"#);
        }
        let answer = env.send(request).await;
        assert_eq!(answer.status, 404, "{method} {path}: {}", answer.text);
        let values = answer.json_values();
        assert_eq!(values.len(), 2, "{method} {path}: {}", answer.text);
        for value in &values {
            schemas.assert_valid(response, value, &format!("{method} {template} → 404"));
        }
    }
}

#[tokio::test]
async fn every_route_answers_within_coderds_schemas() {
    let schemas = Schemas::load();
    let env = Env::start().await;
    env.fake.add_organization("Acme").expect("org");
    let member = env
        .fake
        .add_user("member", fake_coderd::UserRole::Member)
        .expect("user");
    let secret = env
        .fake
        .create_key_directly(
            "default",
            "tagged",
            BTreeMap::from([("team".to_string(), "red".to_string())]),
        )
        .expect("key");
    let keys = "/api/v2/organizations/default/provisionerkeys";
    let operator = env.fake.operator_token();
    let bad_token = "zzzzzzzzzz-0123456789012345678901";

    let calls: Vec<Call<'_>> = vec![
        (
            routes::BUILD_INFO,
            "GET",
            "/api/v2/buildinfo".into(),
            None,
            None,
            None,
        ),
        (
            routes::USER,
            "GET",
            "/api/v2/users/me".into(),
            Some(&operator),
            None,
            None,
        ),
        (
            routes::USER,
            "GET",
            "/api/v2/users/member".into(),
            Some(&operator),
            None,
            None,
        ),
        (
            routes::USER,
            "GET",
            "/api/v2/users/me".into(),
            None,
            None,
            None,
        ),
        (
            routes::USER,
            "GET",
            "/api/v2/users/me".into(),
            Some(bad_token),
            None,
            None,
        ),
        (
            routes::ORGANIZATION,
            "GET",
            "/api/v2/organizations/default".into(),
            Some(&operator),
            None,
            None,
        ),
        (
            routes::ORGANIZATION,
            "GET",
            "/api/v2/organizations/acme".into(),
            Some(&operator),
            None,
            None,
        ),
        (
            routes::ORGANIZATION,
            "GET",
            "/api/v2/organizations/Default".into(),
            Some(&operator),
            None,
            None,
        ),
        (
            routes::ORGANIZATION,
            "GET",
            "/api/v2/organizations/acme".into(),
            Some(&member),
            None,
            None,
        ),
        (
            routes::ENTITLEMENTS,
            "GET",
            "/api/v2/entitlements".into(),
            None,
            None,
            None,
        ),
        (
            routes::LIST_KEYS,
            "GET",
            keys.into(),
            Some(&operator),
            None,
            None,
        ),
        (
            routes::LIST_KEYS,
            "GET",
            keys.into(),
            Some(&member),
            None,
            None,
        ),
        (
            routes::CREATE_KEY,
            "POST",
            keys.into(),
            Some(&operator),
            None,
            Some(r#"{"name":"new","tags":null}"#),
        ),
        (
            routes::CREATE_KEY,
            "POST",
            keys.into(),
            Some(&operator),
            None,
            Some(r#"{"name":"new"}"#),
        ),
        (
            routes::CREATE_KEY,
            "POST",
            keys.into(),
            Some(&operator),
            None,
            Some(r#"{"name":""}"#),
        ),
        (
            routes::CREATE_KEY,
            "POST",
            keys.into(),
            Some(&operator),
            None,
            Some("not json"),
        ),
        (
            routes::DELETE_KEY,
            "DELETE",
            format!("{keys}/new"),
            Some(&operator),
            None,
            None,
        ),
        (
            routes::DELETE_KEY,
            "DELETE",
            format!("{keys}/new"),
            Some(&operator),
            None,
            None,
        ),
        (
            routes::DELETE_KEY,
            "DELETE",
            format!("{keys}/psk"),
            Some(&operator),
            None,
            None,
        ),
        (
            routes::DAEMON_KEY,
            "GET",
            format!("/api/v2/provisionerkeys/{secret}"),
            None,
            Some(("Coder-Provisioner-Daemon-Key", secret.as_str())),
            None,
        ),
        (
            routes::DAEMON_KEY,
            "GET",
            "/api/v2/provisionerkeys/x".into(),
            None,
            Some(("Coder-Provisioner-Daemon-Key", "short")),
            None,
        ),
        (
            routes::DAEMON_KEY,
            "GET",
            "/api/v2/provisionerkeys/x".into(),
            None,
            None,
            None,
        ),
        (
            routes::BUILD_INFO,
            "GET",
            "/api/v2/buildinfo".into(),
            Some(&member),
            Some(("X-Coder-Bypass-Ratelimit", "true")),
            None,
        ),
    ];
    let mut seen = std::collections::BTreeSet::new();
    let mut exercise = async |env: &Env| {
        for (template, method, path, token, header, body) in &calls {
            let mut request = Request::new(method, path);
            if let Some(token) = token {
                request = request.token(token);
            }
            if let Some((name, value)) = header {
                request = request.header(name, value);
            }
            if let Some(body) = body {
                request = request.body(body);
            }
            let answer = env.send(request).await;
            check(&schemas, template, method, &answer);
            seen.insert((*template, *method, answer.status));
        }
    };
    exercise(&env).await;
    for entitlement in [
        Entitlement::GracePeriod,
        Entitlement::NotEntitled,
        Entitlement::Absent,
    ] {
        env.fake.set_entitlement(entitlement);
        exercise(&env).await;
    }
    env.fake.set_entitlement(Entitlement::Entitled);
    env.fake.set_rate_limit(Some(RateLimitSpec::NextRequests {
        method: None,
        route: None,
        count: u32::try_from(calls.len()).expect("few calls"),
    }));
    exercise(&env).await;
    env.fake.set_enterprise(false);
    exercise(&env).await;

    for route in routes::TEMPLATES {
        assert!(
            seen.iter()
                .any(|(template, _, status)| *template == route && *status < 300),
            "no success answer of {route} was checked: {seen:?}"
        );
    }
}

#[test]
fn the_validator_rejects_drift() {
    let schemas = Schemas::load();
    let key = schemas.definition("codersdk.ProvisionerKey");
    let mut problems = Vec::new();
    let drifted = serde_json::json!({
        "id": "not-a-uuid", "created_at": "yesterday", "organization_id": "x",
        "name": 1, "tags": {"a": 2}
    });
    schemas.validate(key, &drifted, "$", &mut problems);
    assert_eq!(problems.len(), 5, "{problems:#?}");
    let org = schemas.definition("codersdk.Organization");
    let mut problems = Vec::new();
    schemas.validate(org, &serde_json::json!({"name": "x"}), "$", &mut problems);
    assert_eq!(problems.len(), 4, "required fields: {problems:#?}");
}
