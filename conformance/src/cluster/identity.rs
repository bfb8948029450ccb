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

/// A ServiceAccount of its own for one replica of the operator, `<name>-<replica>` in
/// `namespace`, bound to every Role and ClusterRole the operator's ServiceAccount `name` is bound
/// to (copies of those bindings, named after the replica): the replica has the operator's rights,
/// and the API server's audit log tells its requests from the other replicas'. Returns its name.
pub async fn replica_service_account(
    admin: &kube::Client,
    namespace: &str,
    name: &str,
    replica: &str,
) -> anyhow::Result<String> {
    use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding, Subject};
    use kube::api::{ListParams, ObjectMeta, Patch, PatchParams};

    let own = format!("{name}-{replica}");
    let apply = PatchParams::apply("conformance-replicas").force();
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), namespace);
    let account = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(own.clone()),
            namespace: Some(namespace.to_owned()),
            ..Default::default()
        },
        ..Default::default()
    };
    accounts
        .patch(&own, &apply, &Patch::Apply(&account))
        .await
        .with_context(|| format!("creating the replica's ServiceAccount {namespace}/{own}"))?;
    let is_operator = |subjects: &Option<Vec<Subject>>| {
        subjects.iter().flatten().any(|s| {
            s.kind == "ServiceAccount"
                && s.name == name
                && s.namespace.as_deref() == Some(namespace)
        })
    };
    let subject = Subject {
        kind: "ServiceAccount".to_owned(),
        name: own.clone(),
        namespace: Some(namespace.to_owned()),
        ..Default::default()
    };
    let copy_meta = |binding: &ObjectMeta| ObjectMeta {
        name: Some(format!(
            "{}-{replica}",
            binding.name.as_deref().unwrap_or("binding")
        )),
        namespace: binding.namespace.clone(),
        ..Default::default()
    };
    let cluster: Api<ClusterRoleBinding> = Api::all(admin.clone());
    for binding in cluster.list(&ListParams::default()).await?.items {
        if !is_operator(&binding.subjects) {
            continue;
        }
        let copy = ClusterRoleBinding {
            metadata: copy_meta(&binding.metadata),
            role_ref: binding.role_ref.clone(),
            subjects: Some(vec![subject.clone()]),
        };
        let copy_name = copy.metadata.name.clone().unwrap_or_default();
        cluster
            .patch(&copy_name, &apply, &Patch::Apply(&copy))
            .await
            .with_context(|| format!("binding the replica's ServiceAccount ({copy_name})"))?;
    }
    let namespaced: Api<RoleBinding> = Api::all(admin.clone());
    for binding in namespaced.list(&ListParams::default()).await?.items {
        if !is_operator(&binding.subjects) {
            continue;
        }
        let copy = RoleBinding {
            metadata: copy_meta(&binding.metadata),
            role_ref: binding.role_ref.clone(),
            subjects: Some(vec![subject.clone()]),
        };
        let copy_name = copy.metadata.name.clone().unwrap_or_default();
        let api: Api<RoleBinding> = Api::namespaced(
            admin.clone(),
            copy.metadata.namespace.as_deref().unwrap_or(namespace),
        );
        api.patch(&copy_name, &apply, &Patch::Apply(&copy))
            .await
            .with_context(|| format!("binding the replica's ServiceAccount ({copy_name})"))?;
    }
    Ok(own)
}
