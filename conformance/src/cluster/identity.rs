//! Identities for the operator under test: a kubeconfig that authenticates as a ServiceAccount,
//! so the operator has exactly the rights its RBAC manifests grant and nothing more.
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};

use super::kubeconfig::{self, ClusterEndpoint, Credentials};

/// Lifetime requested for ServiceAccount tokens: longer than any suite run.
pub const TOKEN_LIFETIME: Duration = Duration::from_secs(24 * 60 * 60);

/// A kubeconfig (YAML) that authenticates as `system:serviceaccount:<namespace>:<name>` with a
/// token from the TokenRequest API. The ServiceAccount must exist.
pub async fn service_account_kubeconfig(
    admin: &kube::Client,
    endpoint: &ClusterEndpoint,
    namespace: &str,
    name: &str,
) -> anyhow::Result<String> {
    let token = service_account_token(admin, namespace, name).await?;
    kubeconfig::render(
        endpoint,
        &format!("{namespace}-{name}"),
        &Credentials::Token(&token),
    )
}

/// A bearer token for the ServiceAccount, valid for [`TOKEN_LIFETIME`].
pub async fn service_account_token(
    admin: &kube::Client,
    namespace: &str,
    name: &str,
) -> anyhow::Result<String> {
    let api: Api<ServiceAccount> = Api::namespaced(admin.clone(), namespace);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(), // empty = the API server's own audience
            expiration_seconds: Some(TOKEN_LIFETIME.as_secs() as i64),
            ..Default::default()
        },
        ..Default::default()
    };
    let response = api
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .with_context(|| format!("requesting a token for ServiceAccount {namespace}/{name}"))?;
    response
        .status
        .map(|status| status.token)
        .filter(|token| !token.is_empty())
        .with_context(|| format!("the TokenRequest for {namespace}/{name} returned no token"))
}

/// Creates the ServiceAccount if it does not exist yet.
pub async fn ensure_service_account(
    admin: &kube::Client,
    namespace: &str,
    name: &str,
) -> anyhow::Result<()> {
    let api: Api<ServiceAccount> = Api::namespaced(admin.clone(), namespace);
    let account = ServiceAccount {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        ..Default::default()
    };
    match api.create(&PostParams::default(), &account).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(e) => Err(e).with_context(|| format!("creating ServiceAccount {namespace}/{name}")),
    }
}
