//! Typed client for the subset of the coderd API the operator uses (coderd-api.md).
//!
//! * Every request carries `Coder-Session-Token` (marked sensitive so it is never printed).
//! * Create, delete, the list that follows a create, and entitlements carry
//!   `X-Coder-Bypass-Ratelimit: true`; a 428 answer (caller is not an owner) makes the client
//!   repeat the same request once without that header (contract R-KEY-23).
//! * Organization lookups are cached per (coderd URL, organization) for the life of the process
//!   (see [`CoderdClient::organization`]).
//! * Errors are typed ([`CoderdError`]) and never contain the session token.
mod error;
mod identity;
mod secret;
#[cfg(test)]
mod tests;
mod types;

use std::collections::{BTreeMap, HashMap};
use std::error::Error as _;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use reqwest::header::{HeaderValue, RETRY_AFTER};
use reqwest::{Method, RequestBuilder, StatusCode};
use serde::de::DeserializeOwned;
use url::Url;

pub use error::CoderdError;
pub use identity::CoderdIdentity;
pub use secret::SecretString;
pub use types::{
    EXTERNAL_PROVISIONER_DAEMONS, EntitlementValue, Entitlements, Feature, Organization,
    ProvisionerKey,
};

use crate::metrics::Metrics;

/// Route templates, used as metric labels (never the concrete path, which names orgs and keys).
pub mod routes {
    pub const ORGANIZATION: &str = "/api/v2/organizations/{organization}";
    pub const PROVISIONER_KEYS: &str = "/api/v2/organizations/{organization}/provisionerkeys";
    pub const PROVISIONER_KEY: &str =
        "/api/v2/organizations/{organization}/provisionerkeys/{provisionerkey}";
    pub const ENTITLEMENTS: &str = "/api/v2/entitlements";
    /// A daemon's own key, authenticated by [`super::DAEMON_KEY_HEADER`].
    pub const DAEMON_KEY: &str = "/api/v2/provisionerkeys/{provisionerkey}";
}

pub const SESSION_TOKEN_HEADER: &str = "Coder-Session-Token";
pub const BYPASS_RATELIMIT_HEADER: &str = "X-Coder-Bypass-Ratelimit";
pub const DAEMON_KEY_HEADER: &str = "Coder-Provisioner-Daemon-Key";

#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// Whole-request timeout (connect, send, read the body). coder-k8s uses 30 s.
    pub timeout: Duration,
    pub metrics: Option<Arc<Metrics>>,
    /// Asked before every request that changes coderd (create, delete).
    pub write_guard: Option<WriteGuard>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(30),
            metrics: None,
            write_guard: None,
        }
    }
}

/// A check that must pass before a request that changes coderd is sent (the operator's
/// leadership fence); its `Err` says why not, and the request fails with [`CoderdError::Fenced`].
#[derive(Clone)]
pub struct WriteGuard(
    Arc<dyn Fn() -> futures::future::BoxFuture<'static, Result<(), String>> + Send + Sync>,
);

impl WriteGuard {
    pub fn new<F, Fut>(check: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<(), String>> + Send + 'static,
    {
        Self(Arc::new(move || Box::pin(check())))
    }
}

impl std::fmt::Debug for WriteGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WriteGuard")
    }
}

/// Organizations resolved so far, keyed by (base URL, lower-cased name or id as requested, or the
/// returned id). Shared by every client of one [`Connector`] because the reconciler builds a
/// client per pass (the token is re-read each time); organization ids never change, so an entry
/// stays valid until coderd answers 404 for a call scoped to that id.
type OrganizationCache = HashMap<(String, String), Organization>;

/// The HTTP side shared by every [`CoderdClient`] built from it: one connection pool and one TLS
/// configuration. The reconciler needs a client per pass (the token is re-read each time);
/// building the HTTP client each time cost a TLS set-up and a fresh connection per pass.
#[derive(Clone, Debug)]
pub struct Connector {
    http: reqwest::Client,
    metrics: Option<Arc<Metrics>>,
    write_guard: Option<WriteGuard>,
    organizations: Arc<Mutex<OrganizationCache>>,
}

impl Connector {
    pub fn new(opts: ClientOptions) -> Result<Self, CoderdError> {
        // reqwest is built without a crypto provider (ring only in this workspace); installing it
        // here keeps the client usable from any binary. A second install is a harmless no-op.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .timeout(opts.timeout)
            .connect_timeout(opts.timeout.min(Duration::from_secs(10)))
            .user_agent(concat!(
                "coder-provisioner-operator/",
                env!("CARGO_PKG_VERSION")
            ))
            .build()
            .map_err(|e| CoderdError::InvalidConfiguration {
                detail: error_chain(&e),
            })?;
        Ok(Self {
            http,
            metrics: opts.metrics,
            write_guard: opts.write_guard,
            organizations: Arc::default(),
        })
    }

    /// A client for `base_url` that authenticates with `session_token`.
    pub fn client(
        &self,
        base_url: &str,
        session_token: SecretString,
    ) -> Result<CoderdClient, CoderdError> {
        let base = Url::parse(base_url.trim()).map_err(|e| CoderdError::InvalidConfiguration {
            detail: format!("coderd URL {base_url:?}: {e}"),
        })?;
        if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
            return Err(CoderdError::InvalidConfiguration {
                detail: format!("coderd URL {base_url:?} must be an http(s) URL"),
            });
        }
        let mut token_header = HeaderValue::from_str(session_token.expose()).map_err(|_| {
            CoderdError::InvalidConfiguration {
                detail:
                    "the session token contains characters that cannot be sent in an HTTP header"
                        .to_owned(),
            }
        })?;
        token_header.set_sensitive(true);
        Ok(CoderdClient {
            inner: Arc::new(Inner {
                http: self.http.clone(),
                base,
                token: session_token,
                token_header,
                metrics: self.metrics.clone(),
                write_guard: self.write_guard.clone(),
                organizations: Arc::clone(&self.organizations),
            }),
        })
    }
}

/// A coderd API client for one base URL and one session token. Cheap to clone; clones share
/// the connection pool.
#[derive(Clone, Debug)]
pub struct CoderdClient {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    http: reqwest::Client,
    base: Url,
    token: SecretString,
    /// `token` as a header value marked sensitive (never printed by the HTTP stack).
    token_header: HeaderValue,
    metrics: Option<Arc<Metrics>>,
    write_guard: Option<WriteGuard>,
    organizations: Arc<Mutex<OrganizationCache>>,
}

/// Whether a request carries the rate-limit bypass header.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Bypass {
    No,
    /// Send the header; on 428 repeat once without it.
    WithFallback,
}

/// A completed HTTP exchange.
struct Answer {
    status: StatusCode,
    retry_after: Option<String>,
    body: Vec<u8>,
}

impl CoderdClient {
    /// A client with its own connection pool; see [`Connector`] to share one.
    pub fn new(
        base_url: &str,
        session_token: SecretString,
        opts: ClientOptions,
    ) -> Result<Self, CoderdError> {
        Connector::new(opts)?.client(base_url, session_token)
    }

    /// `GET /api/v2/organizations/{name_or_id}`.
    ///
    /// Successful lookups are cached per (base URL, organization) for the life of the connector,
    /// under the lower-cased argument and the returned id (ids never change; names are
    /// case-insensitive in coderd). A 404 from a later list, create or delete scoped to that
    /// organization id drops its entries, so a deleted or re-created organization is looked up
    /// again on the next call. Failures are never cached. The session token is not part of the
    /// key: an organization is the same object for every caller, and a caller without access
    /// still gets coderd's 404 from the key routes, which check the organization themselves.
    pub async fn organization(&self, name_or_id: &str) -> Result<Organization, CoderdError> {
        let cache_key = self.cache_key(name_or_id);
        if let Some(hit) = self.organizations().get(&cache_key) {
            return Ok(hit.clone());
        }
        let url = self.url(&["organizations", name_or_id]);
        let answer = self
            .send(routes::ORGANIZATION, Method::GET, url, None, Bypass::No)
            .await?;
        let organization: Organization =
            self.decode(expect(answer, StatusCode::OK, &self.inner.token)?)?;
        let by_id = self.cache_key(&organization.id);
        let mut cache = self.organizations();
        cache.insert(cache_key, organization.clone());
        cache.insert(by_id, organization.clone());
        Ok(organization)
    }

    /// `GET /api/v2/organizations/{org_id}/provisionerkeys` without the bypass header.
    pub async fn list_keys(&self, org_id: &str) -> Result<Vec<ProvisionerKey>, CoderdError> {
        self.list_keys_with(org_id, Bypass::No).await
    }

    /// `GET /api/v2/provisionerkeys/{key}` authenticated by the key itself, as the daemon and
    /// `coder provisioner start` fetch it: the record of exactly the key this plaintext is. A new
    /// key's id is learned here, not from a list by name, which may already show someone else's
    /// key of that name. No session token is sent; the key never appears in an error.
    pub async fn key_by_plaintext(
        &self,
        plaintext: &SecretString,
    ) -> Result<ProvisionerKey, CoderdError> {
        let secret = plaintext.expose();
        let mut key_header =
            HeaderValue::from_str(secret).map_err(|_| CoderdError::InvalidResponse {
                detail: "the created key cannot be sent in an HTTP header".to_owned(),
            })?;
        key_header.set_sensitive(true);
        let url = self.url(&["provisionerkeys", secret]);
        let request = self
            .inner
            .http
            .get(url)
            .header(DAEMON_KEY_HEADER, key_header);
        let answer = self
            .execute(routes::DAEMON_KEY, request)
            .await
            .map_err(|e| e.redacted(secret))?;
        let body = expect(answer, StatusCode::OK, plaintext)
            .map_err(|e| match e {
                // Only the key authenticated this request: a 401 refuses the key.
                CoderdError::Unauthorized { message } => CoderdError::DaemonKeyRefused { message },
                other => other,
            })
            .map_err(|e| e.redacted(secret))?;
        self.decode(body).map_err(|e| e.redacted(secret))
    }

    async fn list_keys_with(
        &self,
        org_id: &str,
        bypass: Bypass,
    ) -> Result<Vec<ProvisionerKey>, CoderdError> {
        let url = self.url(&["organizations", org_id, "provisionerkeys"]);
        let answer = self
            .send(routes::PROVISIONER_KEYS, Method::GET, url, None, bypass)
            .await;
        let answer = self.forget_organization_on_not_found(org_id, answer)?;
        // coderd always sends an array; tolerate `null` as "no keys".
        let keys: Option<Vec<ProvisionerKey>> =
            self.decode(expect(answer, StatusCode::OK, &self.inner.token)?)?;
        Ok(keys.unwrap_or_default())
    }

    /// `POST /api/v2/organizations/{org_id}/provisionerkeys`; returns the plaintext key (201 only).
    pub async fn create_key(
        &self,
        org_id: &str,
        name: &str,
        tags: &BTreeMap<String, String>,
    ) -> Result<SecretString, CoderdError> {
        let url = self.url(&["organizations", org_id, "provisionerkeys"]);
        let body = serde_json::to_vec(&types::CreateKeyRequest { name, tags }).map_err(|e| {
            CoderdError::InvalidConfiguration {
                detail: format!("encoding the create request: {e}"),
            }
        })?;
        let answer = self
            .send(
                routes::PROVISIONER_KEYS,
                Method::POST,
                url,
                Some(body),
                Bypass::WithFallback,
            )
            .await;
        let answer = self.forget_organization_on_not_found(org_id, answer)?;
        let created: types::CreateKeyResponse =
            self.decode(expect(answer, StatusCode::CREATED, &self.inner.token)?)?;
        if created.key.is_empty() {
            return Err(CoderdError::InvalidResponse {
                detail: "create answered 201 without a key".to_owned(),
            });
        }
        if let Some(metrics) = &self.inner.metrics {
            metrics.key_created();
        }
        Ok(SecretString::new(created.key))
    }

    /// `DELETE /api/v2/organizations/{org_id}/provisionerkeys/{name}`; 204 and 404 (already gone) are `Ok`.
    pub async fn delete_key(&self, org_id: &str, name: &str) -> Result<(), CoderdError> {
        let url = self.url(&["organizations", org_id, "provisionerkeys", name]);
        let answer = self
            .send(
                routes::PROVISIONER_KEY,
                Method::DELETE,
                url,
                None,
                Bypass::WithFallback,
            )
            .await;
        let answer = self.forget_organization_on_not_found(org_id, answer)?;
        match expect(answer, StatusCode::NO_CONTENT, &self.inner.token) {
            Ok(_) => {
                if let Some(metrics) = &self.inner.metrics {
                    metrics.key_deleted();
                }
                Ok(())
            }
            // The key (or its organization) is gone: the goal of the delete is met.
            Err(CoderdError::NotFound { .. }) => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// `GET /api/v2/entitlements` (bypass header). Never cached: licences change at runtime.
    pub async fn entitlements(&self) -> Result<Entitlements, CoderdError> {
        let url = self.url(&["entitlements"]);
        let answer = self
            .send(
                routes::ENTITLEMENTS,
                Method::GET,
                url,
                None,
                Bypass::WithFallback,
            )
            .await?;
        self.decode(expect(answer, StatusCode::OK, &self.inner.token)?)
    }

    /// The path value as written: coderd treats only the exact lower-case `default` as the
    /// default organization (`Default` is a name lookup that finds nothing), so folding case
    /// here would answer `Default` from a cached `default`.
    fn cache_key(&self, name_or_id: &str) -> (String, String) {
        (self.inner.base.as_str().to_owned(), name_or_id.to_owned())
    }

    fn forget_organization_on_not_found(
        &self,
        org_id: &str,
        answer: Result<Answer, CoderdError>,
    ) -> Result<Answer, CoderdError> {
        let answer = answer?;
        if answer.status == StatusCode::NOT_FOUND {
            let base = self.inner.base.as_str();
            self.organizations().retain(|(url, _), organization| {
                url != base || !organization.id.eq_ignore_ascii_case(org_id)
            });
        }
        Ok(answer)
    }

    /// `{base}/api/v2/{segments…}`, each segment percent-encoded.
    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.inner.base.clone();
        // `cannot_be_a_base` was rejected in `new`, so path_segments_mut always succeeds.
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(["api", "v2"]).extend(segments);
        }
        url
    }

    async fn send(
        &self,
        route: &'static str,
        method: Method,
        url: Url,
        body: Option<Vec<u8>>,
        bypass: Bypass,
    ) -> Result<Answer, CoderdError> {
        if method != Method::GET
            && let Some(WriteGuard(check)) = &self.inner.write_guard
        {
            check()
                .await
                .map_err(|detail| CoderdError::Fenced { detail })?;
        }
        let request = |with_bypass: bool| {
            let mut request = self
                .inner
                .http
                .request(method.clone(), url.clone())
                .header(SESSION_TOKEN_HEADER, self.inner.token_header.clone());
            if let Some(body) = &body {
                request = request
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(body.clone());
            }
            if with_bypass {
                request = request.header(BYPASS_RATELIMIT_HEADER, "true");
            }
            request
        };
        if bypass == Bypass::WithFallback {
            let answer = self.execute(route, request(true)).await?;
            if answer.status != StatusCode::PRECONDITION_REQUIRED {
                return Ok(answer);
            }
            tracing::debug!(
                route,
                "coderd refused the rate-limit bypass (428); repeating without it"
            );
        }
        self.execute(route, request(false)).await
    }

    async fn execute(
        &self,
        route: &'static str,
        request: RequestBuilder,
    ) -> Result<Answer, CoderdError> {
        let result = async {
            let response = request.send().await?;
            let status = response.status();
            let retry_after = response
                .headers()
                .get(RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let body = response.bytes().await?.to_vec();
            Ok::<_, reqwest::Error>(Answer {
                status,
                retry_after,
                body,
            })
        }
        .await;
        let outcome = match &result {
            Ok(answer) => answer.status.as_str().to_owned(),
            Err(e) if e.is_timeout() => "timeout".to_owned(),
            Err(_) => "unreachable".to_owned(),
        };
        tracing::debug!(route, outcome, "coderd request");
        if let Some(metrics) = &self.inner.metrics {
            metrics.coderd_request(route, &outcome);
        }
        result.map_err(|e| {
            if e.is_timeout() {
                CoderdError::Timeout
            } else {
                CoderdError::Unreachable {
                    detail: error_chain(&e),
                }
            }
        })
    }

    fn organizations(&self) -> MutexGuard<'_, OrganizationCache> {
        // A poisoned cache only means another task panicked mid-insert; the map is still valid.
        self.inner
            .organizations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn decode<T: DeserializeOwned>(&self, body: Vec<u8>) -> Result<T, CoderdError> {
        serde_json::from_slice(&body).map_err(|e| CoderdError::InvalidResponse {
            detail: format!(
                "undecodable JSON ({e}): {}",
                error::error_message(&body, self.inner.token.expose())
            ),
        })
    }
}

/// The body of an answer with the `success` status, or the typed error for any other status.
fn expect(
    answer: Answer,
    success: StatusCode,
    token: &SecretString,
) -> Result<Vec<u8>, CoderdError> {
    if answer.status == success {
        return Ok(answer.body);
    }
    if answer.status.is_success() {
        return Err(CoderdError::InvalidResponse {
            detail: format!(
                "expected status {}, got {}",
                success.as_u16(),
                answer.status.as_u16()
            ),
        });
    }
    Err(error::error_for_status(
        answer.status.as_u16(),
        answer.retry_after.as_deref(),
        &answer.body,
        token.expose(),
    ))
}

/// An error and its sources on one line (reqwest hides the useful cause, e.g. "connection refused").
fn error_chain(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod unit_tests {
    use super::*;

    fn client(base: &str) -> CoderdClient {
        CoderdClient::new(
            base,
            SecretString::new("abcdefghij-0123456789012345678901"),
            ClientOptions::default(),
        )
        .unwrap()
    }

    #[test]
    fn urls_keep_a_base_path_and_encode_segments() {
        assert_eq!(
            client("https://coder.example.com/")
                .url(&["organizations", "a b/c"])
                .as_str(),
            "https://coder.example.com/api/v2/organizations/a%20b%2Fc"
        );
        assert_eq!(
            client("https://example.com/coder")
                .url(&["entitlements"])
                .as_str(),
            "https://example.com/coder/api/v2/entitlements"
        );
    }

    #[test]
    fn bad_configuration_is_an_error_without_the_token() {
        let bad_url = CoderdClient::new(
            "not a url",
            SecretString::new("t"),
            ClientOptions::default(),
        )
        .unwrap_err();
        assert!(matches!(bad_url, CoderdError::InvalidConfiguration { .. }));
        let secret = "abc\ndef-secret";
        let bad_token = CoderdClient::new(
            "http://127.0.0.1:1",
            SecretString::new(secret),
            ClientOptions::default(),
        )
        .unwrap_err();
        assert!(!bad_token.to_string().contains("def-secret"), "{bad_token}");
    }

    #[test]
    fn debug_output_does_not_contain_the_token() {
        let printed = format!("{:?}", client("http://127.0.0.1:1"));
        assert!(!printed.contains("0123456789012345678901"), "{printed}");
    }
}
