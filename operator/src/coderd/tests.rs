//! The client against the in-process fake coderd: wire behaviour, errors, bypass, cache, metrics.
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use fake_coderd::journal::JournalQuery;
use fake_coderd::{
    Entitlement, FakeCoderd, FakeConfig, FaultSpec, JournalEntry, RateLimitSpec, Seed, UserRole,
    fingerprint, routes as fake_routes,
};

use super::*;
use crate::metrics::Metrics;

/// The fixed id of the fake's default organization (see [`fake`]).
const DEFAULT_ORGANIZATION_ID: &str = "5eed0000-0000-4000-8000-000000000001";

/// A fake whose default organization always has the same id. The organization cache is
/// process-wide and keyed by URL, and a later test's fake may get an earlier one's port; with a
/// fixed id a cached entry stays true across fakes.
async fn fake() -> FakeCoderd {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let seed: Seed = serde_json::from_value(
        serde_json::json!({"default_organization_id": DEFAULT_ORGANIZATION_ID}),
    )
    .expect("valid seed");
    FakeCoderd::start_with(FakeConfig {
        seed,
        ..FakeConfig::default()
    })
    .await
    .expect("fake coderd starts")
}

fn client_with(
    fake: &FakeCoderd,
    token: &str,
    timeout: Duration,
    metrics: Option<Arc<Metrics>>,
) -> CoderdClient {
    CoderdClient::new(
        &fake.url(),
        SecretString::new(token),
        ClientOptions {
            timeout,
            metrics,
            write_guard: None,
        },
    )
    .expect("valid client")
}

fn client(fake: &FakeCoderd) -> CoderdClient {
    client_with(fake, &fake.operator_token(), Duration::from_secs(10), None)
}

fn tags(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn entries(journal: &[JournalEntry], method: &str, route: &str) -> Vec<JournalEntry> {
    journal
        .iter()
        .filter(|e| e.method.eq_ignore_ascii_case(method) && e.route.as_deref() == Some(route))
        .cloned()
        .collect()
}

#[tokio::test]
async fn key_lifecycle_uses_the_documented_requests_and_headers() {
    let fake = fake().await;
    let metrics = Arc::new(Metrics::new());
    let coderd = client_with(
        &fake,
        &fake.operator_token(),
        Duration::from_secs(10),
        Some(metrics.clone()),
    );

    // The default organization is found through the `default` alias, whatever its name (`coder`
    // since coderd v2.16, `first-organization` before): the id is what identifies it.
    let org = coderd.organization("default").await.unwrap();
    assert_eq!(org.id, DEFAULT_ORGANIZATION_ID);
    assert!(!org.name.is_empty() && org.name != "default");
    assert!(coderd.list_keys(&org.id).await.unwrap().is_empty());
    let plaintext = coderd
        .create_key(&org.id, "Build-Farm", &tags(&[("env", "prod")]))
        .await
        .unwrap();
    assert_eq!(plaintext.expose().len(), 43);
    let created = coderd.key_by_plaintext(&plaintext).await.unwrap();
    assert_eq!(
        created.name, "build-farm",
        "coderd stores names lower-cased"
    );
    assert_eq!(created.organization, org.id);
    assert_eq!(created.tags, tags(&[("env", "prod")]));
    assert_eq!(fake.keys(&org.id).unwrap()[0].id.to_string(), created.id);
    coderd.delete_key(&org.id, "build-farm").await.unwrap();
    assert!(fake.keys(&org.id).unwrap().is_empty());
    coderd
        .delete_key(&org.id, "build-farm")
        .await
        .expect("404 on delete means already gone");
    let entitlements = coderd.entitlements().await.unwrap();
    assert_eq!(
        entitlements.external_provisioner_daemons(),
        Some(EntitlementValue::Entitled)
    );

    let journal = fake.journal();
    let token_print = fingerprint(&fake.operator_token());
    let (own_key, with_token): (Vec<_>, Vec<_>) = journal
        .iter()
        .partition(|e| e.route.as_deref() == Some(fake_routes::DAEMON_KEY));
    assert!(
        with_token
            .iter()
            .all(|e| e.session_token_fingerprint.as_deref() == Some(token_print.as_str()))
    );
    assert_eq!(
        own_key.len(),
        1,
        "the new key's record, fetched with the key"
    );
    assert_eq!(
        own_key[0].session_token_fingerprint, None,
        "no session token"
    );
    assert_eq!(
        own_key[0].daemon_key_fingerprint.as_deref(),
        Some(fingerprint(plaintext.expose()).as_str())
    );
    assert!(
        !own_key[0].path.contains(plaintext.expose()),
        "the journal keeps no key"
    );
    let lists = entries(&journal, "GET", fake_routes::LIST_KEYS);
    assert_eq!(lists.len(), 1);
    assert_eq!(
        lists[0].bypass_ratelimit, None,
        "a plain list does not bypass"
    );
    let create = entries(&journal, "POST", fake_routes::CREATE_KEY);
    assert_eq!(create.len(), 1);
    assert_eq!(create[0].bypass_ratelimit.as_deref(), Some("true"));
    assert_eq!(
        create[0].body,
        Some(serde_json::json!({"name": "Build-Farm", "tags": {"env": "prod"}}))
    );
    let deletes = entries(&journal, "DELETE", fake_routes::DELETE_KEY);
    assert_eq!(
        deletes.iter().map(|e| e.status).collect::<Vec<_>>(),
        [204, 404]
    );
    assert!(
        deletes
            .iter()
            .all(|e| e.bypass_ratelimit.as_deref() == Some("true"))
    );
    assert_eq!(
        entries(&journal, "GET", fake_routes::ENTITLEMENTS)[0]
            .bypass_ratelimit
            .as_deref(),
        Some("true")
    );
    assert_eq!(
        entries(&journal, "GET", fake_routes::ORGANIZATION)[0].bypass_ratelimit,
        None
    );

    let text = metrics.render();
    for series in [
        r#"coderd_requests_total{route="/api/v2/organizations/{organization}/provisionerkeys",status="201"} 1"#,
        r#"coderd_requests_total{route="/api/v2/organizations/{organization}/provisionerkeys/{provisionerkey}",status="404"} 1"#,
        "provisioner_keys_created_total 1",
        "provisioner_keys_deleted_total 1",
    ] {
        assert!(text.contains(series), "missing {series:?} in\n{text}");
    }
}

#[tokio::test]
async fn organization_lookups_are_cached_until_a_scoped_404() {
    let fake = fake().await;
    // An organization no other test uses, so no earlier test can have cached it.
    fake.add_organization("cache-test").unwrap();
    let connector = Connector::new(ClientOptions::default()).unwrap();
    let per_pass = || {
        connector
            .client(&fake.url(), SecretString::new(fake.operator_token()))
            .unwrap()
    };
    let coderd = per_pass();
    let first = coderd.organization("cache-test").await.unwrap();
    // A second client of the same connector (the reconciler builds one per pass) shares the
    // cache, also when it asks by id. Another spelling is asked again: only coderd knows that
    // `Default` is not `default`.
    let other = per_pass();
    assert_eq!(other.organization("cache-test").await.unwrap(), first);
    assert_eq!(other.organization(&first.id).await.unwrap(), first);
    assert_eq!(fake.journal().count("GET", fake_routes::ORGANIZATION), 1);
    assert_eq!(other.organization("CACHE-TEST").await.unwrap(), first);
    assert_eq!(fake.journal().count("GET", fake_routes::ORGANIZATION), 2);

    fake.inject_fault(FaultSpec::status("GET", fake_routes::LIST_KEYS, 404))
        .unwrap();
    assert!(matches!(
        coderd.list_keys(&first.id).await,
        Err(CoderdError::NotFound { .. })
    ));
    assert_eq!(coderd.organization("cache-test").await.unwrap(), first);
    assert_eq!(
        fake.journal().count("GET", fake_routes::ORGANIZATION),
        3,
        "the 404 dropped the cached entry"
    );
    // Another connector (another operator process) has a cache of its own.
    client(&fake).organization("cache-test").await.unwrap();
    assert_eq!(fake.journal().count("GET", fake_routes::ORGANIZATION), 4);
}

#[tokio::test]
async fn unknown_organizations_are_not_found_and_not_cached() {
    let fake = fake().await;
    let coderd = client(&fake);
    for _ in 0..2 {
        assert!(matches!(
            coderd.organization("no-such-org").await,
            Err(CoderdError::NotFound { .. })
        ));
    }
    assert_eq!(fake.journal().count("GET", fake_routes::ORGANIZATION), 2);
    let created = fake.add_organization("no-such-org").unwrap();
    assert_eq!(
        coderd.organization("no-such-org").await.unwrap().id,
        created.id
    );
}

#[tokio::test]
async fn status_codes_map_to_typed_errors_without_the_token() {
    let fake = fake().await;
    let coderd = client(&fake);
    let org = coderd.organization("default").await.unwrap();
    for (status, check) in [
        (
            401,
            (|e| matches!(e, CoderdError::Unauthorized { .. })) as fn(&CoderdError) -> bool,
        ),
        (403, |e| matches!(e, CoderdError::Forbidden { .. })),
        (404, |e| matches!(e, CoderdError::NotFound { .. })),
        (409, |e| matches!(e, CoderdError::Conflict { .. })),
        (500, |e| matches!(e, CoderdError::Api { status: 500, .. })),
    ] {
        fake.inject_fault(FaultSpec::status("POST", fake_routes::CREATE_KEY, status))
            .unwrap();
        let error = coderd
            .create_key(&org.id, "k", &BTreeMap::new())
            .await
            .unwrap_err();
        assert!(check(&error), "{status} gave {error:?}");
        assert!(
            !error.to_string().contains(&fake.operator_token()),
            "{error}"
        );
    }
    assert!(fake.keys(&org.id).unwrap().is_empty());
}

#[tokio::test]
async fn real_coderd_answers_map_to_typed_errors() {
    let fake = fake().await;
    let coderd = client(&fake);
    let org = coderd.organization("default").await.unwrap();
    coderd
        .create_key(&org.id, "dup", &BTreeMap::new())
        .await
        .unwrap();
    let conflict = coderd
        .create_key(&org.id, "DUP", &BTreeMap::new())
        .await
        .unwrap_err();
    assert!(
        matches!(&conflict, CoderdError::Conflict { message } if message.contains("already exists")),
        "{conflict:?}"
    );

    fake.set_entitlement(Entitlement::NotEntitled);
    let gated = coderd
        .create_key(&org.id, "gated", &BTreeMap::new())
        .await
        .unwrap_err();
    assert!(
        matches!(&gated, CoderdError::Forbidden { message } if message.contains("Enterprise feature")),
        "{gated:?}"
    );

    let stranger = "abcdefghij-0123456789012345678901";
    let unknown = client_with(&fake, stranger, Duration::from_secs(10), None)
        .list_keys(&org.id)
        .await
        .unwrap_err();
    assert!(
        matches!(unknown, CoderdError::Unauthorized { .. }),
        "{unknown:?}"
    );
    assert!(!format!("{unknown} {unknown:?}").contains(stranger));
}

/// A 401 to a key's own lookup refuses the daemon key, not the session token (not even sent).
#[tokio::test]
async fn a_refused_daemon_key_is_named_as_such() {
    let fake = fake().await;
    let coderd = client(&fake);
    let plaintext = SecretString::new(
        fake.create_key_directly("default", "gone", BTreeMap::new())
            .unwrap(),
    );
    let id = fake.keys("default").unwrap()[0].id.clone();
    fake.delete_key_directly("default", &id).unwrap();
    let refused = coderd.key_by_plaintext(&plaintext).await.unwrap_err();
    assert!(
        matches!(refused, CoderdError::DaemonKeyRefused { .. }),
        "{refused:?}"
    );
    let text = refused.to_string();
    assert!(text.contains("daemon key"), "{text}");
    assert!(!text.contains("session token"), "{text}");
    assert!(!format!("{text} {refused:?}").contains(plaintext.expose()));
}

#[tokio::test]
async fn too_many_requests_carries_retry_after() {
    let fake = fake().await;
    let coderd = client(&fake);
    let org = coderd.organization("default").await.unwrap();
    fake.set_rate_limit(Some(RateLimitSpec::NextRequests {
        method: Some("GET".into()),
        route: Some(fake_routes::LIST_KEYS.into()),
        count: 1,
    }));
    let limited = coderd.list_keys(&org.id).await.unwrap_err();
    assert_eq!(
        limited,
        CoderdError::RateLimited {
            retry_after: Some(Duration::from_secs(60))
        }
    );
    assert!(coderd.list_keys(&org.id).await.is_ok());
}

#[tokio::test]
async fn a_refused_bypass_is_repeated_once_without_the_header() {
    let fake = fake().await;
    let member = fake.add_user("member", UserRole::Member).unwrap();
    let coderd = client_with(&fake, &member, Duration::from_secs(10), None);

    let entitlements = coderd.entitlements().await.unwrap();
    assert_eq!(
        entitlements.external_provisioner_daemons(),
        Some(EntitlementValue::Entitled)
    );
    let org_id = client(&fake).organization("default").await.unwrap().id;
    let refused = coderd
        .create_key(&org_id, "k", &BTreeMap::new())
        .await
        .unwrap_err();
    // coderd has no 403 here: its database authorizer refuses a member's insert and the handler
    // answers that error 500 (enterprise/coderd/provisionerkeys.go, coderd/database/dbauthz).
    assert!(
        matches!(refused, CoderdError::Api { status: 500, .. }),
        "a member may not create keys: {refused:?}"
    );

    let journal = fake.journal();
    for (method, route) in [
        ("GET", fake_routes::ENTITLEMENTS),
        ("POST", fake_routes::CREATE_KEY),
    ] {
        let attempts: Vec<_> = entries(&journal, method, route)
            .into_iter()
            .map(|e| (e.bypass_ratelimit, e.status))
            .collect();
        assert_eq!(
            attempts[0],
            (Some("true".to_owned()), 428),
            "{method} {route}"
        );
        assert_eq!(
            attempts[1].0, None,
            "{method} {route}: the repeat drops the header"
        );
        assert_eq!(attempts.len(), 2, "{method} {route}: exactly one repeat");
    }
}

#[tokio::test]
async fn a_slow_answer_is_a_timeout() {
    let fake = fake().await;
    let metrics = Arc::new(Metrics::new());
    let coderd = client_with(
        &fake,
        &fake.operator_token(),
        Duration::from_millis(300),
        Some(metrics.clone()),
    );
    fake.inject_fault(FaultSpec::delay(
        "GET",
        fake_routes::ENTITLEMENTS,
        Duration::from_secs(3),
    ))
    .unwrap();
    assert_eq!(
        coderd.entitlements().await.unwrap_err(),
        CoderdError::Timeout
    );
    assert!(
        metrics
            .render()
            .contains(r#"coderd_requests_total{route="/api/v2/entitlements",status="timeout"} 1"#)
    );
}

#[tokio::test]
async fn a_closed_listener_is_unreachable() {
    let fake = fake().await;
    let coderd = client(&fake);
    fake.set_unreachable(true).await.unwrap();
    let error = coderd.organization("default").await.unwrap_err();
    assert!(
        matches!(&error, CoderdError::Unreachable { detail } if !detail.is_empty()),
        "{error:?}"
    );
    fake.set_unreachable(false).await.unwrap();
    assert!(coderd.organization("default").await.is_ok());
}

#[tokio::test]
async fn a_reset_connection_is_unreachable_not_a_panic() {
    let fake = fake().await;
    let coderd = client(&fake);
    fake.inject_fault(FaultSpec::reset("GET", fake_routes::ENTITLEMENTS))
        .unwrap();
    assert!(matches!(
        coderd.entitlements().await,
        Err(CoderdError::Unreachable { .. })
    ));
}

#[tokio::test]
async fn a_closed_write_guard_keeps_creates_and_deletes_from_coderd() {
    let fake = fake().await;
    let open = client(&fake);
    let org = open.organization("default").await.unwrap();
    open.create_key(&org.id, "existing", &tags(&[]))
        .await
        .unwrap();
    let guarded = CoderdClient::new(
        &fake.url(),
        SecretString::new(fake.operator_token()),
        ClientOptions {
            write_guard: Some(WriteGuard::new(|| async {
                Err("the term ended".to_owned())
            })),
            ..ClientOptions::default()
        },
    )
    .expect("valid client");
    let before = fake.journal().len();

    let created = guarded.create_key(&org.id, "new", &tags(&[])).await;
    let deleted = guarded.delete_key(&org.id, "existing").await;
    let listed = guarded
        .list_keys(&org.id)
        .await
        .expect("reads are not fenced");

    for refused in [created.map(|_| ()), deleted] {
        assert_eq!(
            refused.unwrap_err(),
            CoderdError::Fenced {
                detail: "the term ended".to_owned()
            }
        );
    }
    assert_eq!(listed.len(), 1);
    let sent: Vec<String> = fake.journal()[before..]
        .iter()
        .map(|e| e.method.clone())
        .collect();
    assert_eq!(sent, ["GET"], "only the list reached coderd");
}
