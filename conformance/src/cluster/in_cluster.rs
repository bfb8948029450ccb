//! An operator that runs in the cluster as a Deployment: the reference operator as the kind and
//! k3s tiers install it with its Helm chart, or a vendor's operator already installed and named
//! with `--operator installed --operator-deployment NAMESPACE/NAME`.
//!
//! The suite stops and starts it by scaling its Deployment (a real process restart: the pods are
//! replaced), reads its pods' logs (diagnostics and the secret-leak check), and knows its identity
//! (the Deployment's ServiceAccount).
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, LogParams};
use serde_json::{Value, json};

use super::kind::{POLL, label_selector, wait_deployment_available};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InClusterOperator {
    pub namespace: String,
    pub deployment: String,
    pub service_account: String,
    /// Label selector of its pods.
    pub selector: String,
    /// The replicas a start restores (the Deployment's own count, e.g. 2 with leader election).
    pub replicas: i32,
}

impl InClusterOperator {
    /// Read from the live Deployment `namespace/name` (an operator installed by its user).
    pub async fn from_live(client: &kube::Client, reference: &str) -> anyhow::Result<Self> {
        let Some((namespace, name)) = reference.split_once('/') else {
            bail!("--operator-deployment {reference:?}: expected NAMESPACE/NAME");
        };
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
        let deployment = deployments
            .get_opt(name)
            .await
            .with_context(|| format!("reading the operator's Deployment {reference}"))?
            .with_context(|| {
                format!("--operator-deployment: Deployment {reference} does not exist")
            })?;
        let spec = serde_json::to_value(&deployment.spec)?;
        Self::from_spec(namespace.to_owned(), name.to_owned(), &spec)
    }

    fn from_spec(namespace: String, deployment: String, spec: &Value) -> anyhow::Result<Self> {
        let service_account = spec
            .pointer("/template/spec/serviceAccountName")
            .and_then(Value::as_str)
            .unwrap_or("default")
            .to_owned();
        let labels: BTreeMap<String, String> =
            serde_json::from_value(spec["selector"]["matchLabels"].clone())
                .context("the operator Deployment's selector.matchLabels")?;
        let replicas = spec["replicas"]
            .as_i64()
            .and_then(|r| i32::try_from(r).ok())
            .filter(|r| *r > 0)
            .unwrap_or(1);
        Ok(Self {
            namespace,
            deployment,
            service_account,
            selector: label_selector(&labels),
            replicas,
        })
    }

    /// Scales the Deployment to 0 and waits until none of its pods is left (the process ended).
    pub async fn stop(&self, client: &kube::Client, timeout: Duration) -> anyhow::Result<()> {
        self.scale(client, 0).await?;
        let deadline = Instant::now() + timeout;
        loop {
            let left = self.pods(client).await?.len();
            if left == 0 {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "{left} pod(s) of Deployment {}/{} still exist {timeout:?} after scaling it to 0",
                    self.namespace,
                    self.deployment
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Scales the Deployment back to its replicas and waits until it is available.
    pub async fn start(&self, client: &kube::Client, timeout: Duration) -> anyhow::Result<()> {
        self.scale(client, self.replicas).await?;
        wait_deployment_available(
            client,
            &self.namespace,
            &self.deployment,
            Instant::now() + timeout,
        )
        .await
    }

    /// The logs of its current pods (a pod replaced by a restart took its log with it), each
    /// pod's under a header line; `tail_lines` per container.
    pub async fn logs(
        &self,
        client: &kube::Client,
        tail_lines: Option<i64>,
    ) -> anyhow::Result<String> {
        let api: Api<Pod> = Api::namespaced(client.clone(), &self.namespace);
        let mut out = String::new();
        for pod in self.pods(client).await? {
            let name = pod.metadata.name.clone().unwrap_or_default();
            let containers = pod.spec.map(|s| s.containers).unwrap_or_default();
            for container in containers {
                let params = LogParams {
                    container: Some(container.name.clone()),
                    tail_lines,
                    ..LogParams::default()
                };
                let log = api.logs(&name, &params).await.unwrap_or_else(|error| {
                    format!("(log of {name}/{} unreadable: {error})\n", container.name)
                });
                out.push_str(&format!("# pod {name}, container {}\n", container.name));
                out.push_str(&log);
            }
        }
        Ok(out)
    }

    async fn pods(&self, client: &kube::Client) -> anyhow::Result<Vec<Pod>> {
        let pods: Api<Pod> = Api::namespaced(client.clone(), &self.namespace);
        Ok(pods
            .list(&ListParams::default().labels(&self.selector))
            .await
            .context("listing the operator's pods")?
            .items)
    }

    async fn scale(&self, client: &kube::Client, replicas: i32) -> anyhow::Result<()> {
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), &self.namespace);
        deployments
            .patch_scale(
                &self.deployment,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({ "spec": { "replicas": replicas } })),
            )
            .await
            .with_context(|| {
                format!(
                    "scaling Deployment {}/{} to {replicas}",
                    self.namespace, self.deployment
                )
            })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_restores_the_deployments_own_replicas() {
        let spec = json!({
            "replicas": 2,
            "selector": { "matchLabels": { "app": "vendor-operator" } },
            "template": { "spec": { "serviceAccountName": "vendor" } },
        });
        let operator = InClusterOperator::from_spec("ops".into(), "vendor".into(), &spec)
            .expect("a Deployment spec");
        assert_eq!(operator.replicas, 2);
        assert_eq!(operator.selector, "app=vendor-operator");
        assert_eq!(operator.service_account, "vendor");
        let scaled_to_zero = json!({ "selector": { "matchLabels": { "a": "b" } }, "replicas": 0 });
        let operator = InClusterOperator::from_spec("ops".into(), "vendor".into(), &scaled_to_zero)
            .expect("a Deployment spec");
        assert_eq!(
            operator.replicas, 1,
            "a Deployment left at 0 restarts with one replica"
        );
        assert_eq!(operator.service_account, "default");
    }
}
