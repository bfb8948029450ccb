//! `AdminClient`: drives any fake coderd (in-process or another process) through its admin HTTP API.

use std::collections::BTreeMap;

use anyhow::{Context, anyhow, bail};
use reqwest::Method;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{
    DeploymentPatch, FakeInfo, KeySecret, NewKey, NewOrganization, PREFIX, Reachability,
    SessionToken, error_message,
};
use crate::faults::FaultSpec;
use crate::journal::JournalEntry;
use crate::ratelimit::RateLimitSpec;
use crate::seed::SeedUser;
use crate::state::{Entitlement, Organization, ProvisionerKey, UserRole, UserView};

#[derive(Clone)]
pub struct AdminClient {
    base_url: String,
    admin_token: String,
    http: reqwest::Client,
}

impl std::fmt::Debug for AdminClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminClient")
            .field("base_url", &self.base_url)
            .finish_non_exhaustive()
    }
}

impl AdminClient {
    /// `base_url` is the admin listener's URL (e.g. `http://127.0.0.1:3001`), with or without `/__fake`.
    pub fn new(base_url: &str, admin_token: &str) -> AdminClient {
        // reqwest is built without a default crypto provider (crates-verified gotcha 4); installing
        // ring here, if nothing is installed yet, keeps `AdminClient::new` from panicking.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let base = base_url.trim_end_matches('/');
        AdminClient {
            base_url: base.strip_suffix(PREFIX).unwrap_or(base).to_string(),
            admin_token: admin_token.to_string(),
            http: reqwest::Client::new(),
        }
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&(impl Serialize + ?Sized)>,
    ) -> anyhow::Result<String> {
        let url = format!("{}{PREFIX}{path}", self.base_url);
        let mut request = self
            .http
            .request(method.clone(), &url)
            .bearer_auth(&self.admin_token);
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request
            .send()
            .await
            .with_context(|| format!("admin {method} {url}"))?;
        let status = response.status();
        let text = response
            .text()
            .await
            .with_context(|| format!("reading admin {method} {url}"))?;
        if !status.is_success() {
            bail!(
                "admin {method} {url} answered {status}: {}",
                error_message(&text)
            );
        }
        Ok(text)
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&(impl Serialize + ?Sized)>,
    ) -> anyhow::Result<T> {
        let text = self.send(method, path, body).await?;
        serde_json::from_str(&text)
            .map_err(|error| anyhow!("admin {path}: unexpected answer: {error}"))
    }

    async fn command(
        &self,
        method: Method,
        path: &str,
        body: Option<&(impl Serialize + ?Sized)>,
    ) -> anyhow::Result<()> {
        self.send(method, path, body).await.map(drop)
    }

    /// coderd URL and operator token of the fake.
    pub async fn info(&self) -> anyhow::Result<FakeInfo> {
        self.call(Method::GET, "/info", None::<&()>).await
    }

    /// State back to the seed, faults and rate limit cleared, journal cleared.
    pub async fn reset(&self) -> anyhow::Result<()> {
        self.command(Method::POST, "/reset", None::<&()>).await
    }

    pub async fn set_entitlement(&self, entitlement: Entitlement) -> anyhow::Result<()> {
        self.patch_deployment(&DeploymentPatch {
            entitlement: Some(entitlement),
            ..DeploymentPatch::default()
        })
        .await
    }

    /// A user (by name or id) as an owner reads it (`GET /__fake/users/{user}`): its `status`
    /// shows whether a dormant user was made active.
    pub async fn user(&self, user: &str) -> anyhow::Result<UserView> {
        self.call(
            Method::GET,
            &format!("/users/{}", encode(user)),
            None::<&()>,
        )
        .await
    }

    /// What `/entitlements` and the key routes' feature gate report to one user (by name or id)
    /// instead of the deployment's entitlement; `None` gives it the deployment's again.
    pub async fn set_user_entitlement(
        &self,
        user: &str,
        entitlement: Option<Entitlement>,
    ) -> anyhow::Result<()> {
        self.command(
            Method::PUT,
            &format!("/users/{user}/entitlement"),
            Some(&entitlement),
        )
        .await
    }

    pub async fn set_license(&self, has_license: bool) -> anyhow::Result<()> {
        self.patch_deployment(&DeploymentPatch {
            has_license: Some(has_license),
            ..DeploymentPatch::default()
        })
        .await
    }

    /// coderd-api.md §2.4: whether `/entitlements` demands a session token.
    pub async fn set_entitlements_require_token(&self, require: bool) -> anyhow::Result<()> {
        self.patch_deployment(&DeploymentPatch {
            entitlements_require_token: Some(require),
            ..DeploymentPatch::default()
        })
        .await
    }

    /// `false` models an AGPL coderd (no entitlements or provisioner-key routes).
    pub async fn set_enterprise(&self, enterprise: bool) -> anyhow::Result<()> {
        self.patch_deployment(&DeploymentPatch {
            enterprise: Some(enterprise),
            ..DeploymentPatch::default()
        })
        .await
    }

    pub async fn patch_deployment(&self, patch: &DeploymentPatch) -> anyhow::Result<()> {
        self.command(Method::PATCH, "/deployment", Some(patch))
            .await
    }

    pub async fn organizations(&self) -> anyhow::Result<Vec<Organization>> {
        self.call(Method::GET, "/organizations", None::<&()>).await
    }

    pub async fn add_organization(&self, name: &str) -> anyhow::Result<Organization> {
        self.call(
            Method::POST,
            "/organizations",
            Some(&NewOrganization {
                name: name.to_string(),
            }),
        )
        .await
    }

    /// Adds a user (member of `default`) and returns their session token.
    /// Renames an organization (by name, id or `default`).
    pub async fn rename_organization(&self, org: &str, name: &str) -> anyhow::Result<Organization> {
        let path = format!("/organizations/{}", encode(org));
        self.call(
            Method::PATCH,
            &path,
            Some(&NewOrganization {
                name: name.to_string(),
            }),
        )
        .await
    }

    pub async fn add_user(&self, username: &str, role: UserRole) -> anyhow::Result<String> {
        self.add_user_with(&SeedUser::new(username, role)).await
    }

    pub async fn add_user_with(&self, user: &SeedUser) -> anyhow::Result<String> {
        let token: SessionToken = self.call(Method::POST, "/users", Some(user)).await?;
        Ok(token.token)
    }

    pub async fn inject_fault(&self, fault: FaultSpec) -> anyhow::Result<()> {
        self.command(Method::POST, "/faults", Some(&fault)).await
    }

    pub async fn clear_faults(&self) -> anyhow::Result<()> {
        self.command(Method::DELETE, "/faults", None::<&()>).await
    }

    /// Removes only the faults scoped to this session-token fingerprint.
    pub async fn clear_faults_for(&self, fingerprint: &str) -> anyhow::Result<()> {
        self.command(
            Method::DELETE,
            &format!("/faults/{}", encode(fingerprint)),
            None::<&()>,
        )
        .await
    }

    /// `None` returns to the fake's base counting (coderd's 512 per minute unless started with
    /// another `api_rate_limit`); `Some(RateLimitSpec::Off)` stops counting.
    pub async fn set_rate_limit(&self, spec: Option<RateLimitSpec>) -> anyhow::Result<()> {
        self.command(Method::PUT, "/rate-limit", Some(&spec)).await
    }

    /// Closes (`true`) or reopens on the same port (`false`) the coderd listener; the admin API stays up.
    pub async fn set_unreachable(&self, unreachable: bool) -> anyhow::Result<()> {
        self.command(
            Method::PUT,
            "/reachability",
            Some(&Reachability { unreachable }),
        )
        .await
    }

    /// The organization's keys (no secrets), by organization name, id or `default`.
    pub async fn keys(&self, org: &str) -> anyhow::Result<Vec<ProvisionerKey>> {
        self.call(
            Method::GET,
            &format!("/organizations/{}/keys", encode(org)),
            None::<&()>,
        )
        .await
    }

    /// Creates a key as another client would have (not journaled); returns its plaintext.
    pub async fn create_key_directly(
        &self,
        org: &str,
        name: &str,
        tags: BTreeMap<String, String>,
    ) -> anyhow::Result<String> {
        let new = NewKey {
            name: name.to_string(),
            tags,
        };
        let secret: KeySecret = self
            .call(
                Method::POST,
                &format!("/organizations/{}/keys", encode(org)),
                Some(&new),
            )
            .await?;
        Ok(secret.key)
    }

    /// Deletes a key by id as another client would have (not journaled).
    pub async fn delete_key_directly(&self, org: &str, id: &str) -> anyhow::Result<()> {
        self.command(
            Method::DELETE,
            &format!("/organizations/{}/keys/{}", encode(org), encode(id)),
            None::<&()>,
        )
        .await
    }

    pub async fn journal(&self) -> anyhow::Result<Vec<JournalEntry>> {
        self.call(Method::GET, "/journal", None::<&()>).await
    }

    /// The entries recorded after sequence number `since` (`GET /__fake/journal?since=<seq>`).
    pub async fn journal_since(&self, since: u64) -> anyhow::Result<Vec<JournalEntry>> {
        self.call(Method::GET, &format!("/journal?since={since}"), None::<&()>)
            .await
    }

    pub async fn clear_journal(&self) -> anyhow::Result<()> {
        self.command(Method::DELETE, "/journal", None::<&()>).await
    }
}

fn encode(segment: &str) -> String {
    percent_encoding::utf8_percent_encode(segment, percent_encoding::NON_ALPHANUMERIC).to_string()
}
