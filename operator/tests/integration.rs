//! The operator binary against a local control plane (RBAC on) and the fake coderd, run with
//! the rights of `config/rbac/` only. Needs the control-plane binaries (resolved, or built, by
//! `scripts/k8s-binaries.sh`). Run: `cargo test -p operator --test integration`.
mod support;

use std::collections::BTreeMap;

use fake_coderd::journal::JournalQuery;
use fake_coderd::routes;
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use serde_json::json;
use support::{Harness, NAMESPACE, SAMPLE, condition, has_condition, key_calls, phase};

fn is_ready(cr: &operator::api::CoderProvisioner) -> bool {
    phase(cr) == Some("Ready") && has_condition(cr, "CredentialsReady", "True") && has_condition(cr, "DeploymentReady", "True")
}

#[tokio::test]
async fn the_sample_becomes_ready_with_exactly_one_key_create() -> anyhow::Result<()> {
    let harness = Harness::start().await?;
    harness.create_provisioner(SAMPLE, json!({})).await?;

    let ready = harness.wait_for(SAMPLE, "phase Ready with CredentialsReady and DeploymentReady True", is_ready).await?;
    let status = ready.status.clone().unwrap_or_default();
    assert_eq!(status.ready_replicas, Some(1));
    for condition_type in ["ControlPlaneReady", "OperatorAccessReady", "ExternalProvisionersEntitled", "ProvisionerKeySecretReady", "ProvisionerKeyReady"] {
        assert_eq!(condition(&ready, condition_type).map(|c| c.0), Some("True".to_owned()), "{condition_type}");
    }
    let journal = harness.fake.journal();
    assert_eq!(journal.count("POST", routes::CREATE_KEY), 1, "{:#?}", journal.counts());
    assert_eq!(journal.count("DELETE", routes::DELETE_KEY), 0);
    let org_id = status.organization_id.clone().unwrap_or_default();
    let keys = harness.fake.keys(&org_id)?;
    assert_eq!(keys.iter().map(|k| k.name.as_str()).collect::<Vec<_>>(), [SAMPLE]);
    assert_eq!(status.provisioner_key_id.as_deref(), Some(keys[0].id.as_str()));
    let plaintext = harness.key_plaintext(SAMPLE).await?.unwrap_or_default();
    assert_eq!(plaintext.len(), 43, "the Secret holds coderd's plaintext key");
    let deployment = Api::<Deployment>::namespaced(harness.admin.clone(), NAMESPACE)
        .get(&format!("provisioner-{SAMPLE}"))
        .await?;
    assert!(deployment.spec.is_some(), "the Deployment exists");
    Ok(())
}

#[tokio::test]
async fn a_key_secret_the_provisioner_does_not_own_is_refused_and_left_alone() -> anyhow::Result<()> {
    let harness = Harness::start().await?;
    let foreign = Secret {
        metadata: ObjectMeta {
            name: Some(format!("{SAMPLE}-provisioner-key")),
            labels: Some(BTreeMap::from([("owner".to_owned(), "someone-else".to_owned())])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([("key".to_owned(), ByteString(b"not-yours".to_vec()))])),
        ..Secret::default()
    };
    let before = harness.secrets().create(&PostParams::default(), &foreign).await?;
    harness.create_provisioner(SAMPLE, json!({})).await?;

    let refused = harness
        .wait_for(SAMPLE, "ProvisionerKeySecretReady=False", |cr| has_condition(cr, "ProvisionerKeySecretReady", "False"))
        .await?;
    assert_eq!(condition(&refused, "ProvisionerKeySecretReady").map(|c| c.1), Some("KeySecretNotOwned".to_owned()));
    let after = harness.secrets().get(&format!("{SAMPLE}-provisioner-key")).await?;
    assert_eq!(after.metadata.resource_version, before.metadata.resource_version, "the refused Secret is untouched");
    assert_eq!(after.data, before.data);
    assert!(key_calls(&harness.fake.journal()).iter().all(|e| e.method != "POST"), "no key is created");
    let deployments = Api::<Deployment>::namespaced(harness.admin.clone(), NAMESPACE);
    assert!(deployments.get_opt(&format!("provisioner-{SAMPLE}")).await?.is_none());
    Ok(())
}

#[tokio::test]
async fn an_unlabelled_credential_secret_keeps_credentials_false_and_creates_nothing() -> anyhow::Result<()> {
    let harness = Harness::start().await?;
    let credential = Secret {
        metadata: ObjectMeta { name: Some("proxy-credentials".into()), ..ObjectMeta::default() },
        string_data: Some(BTreeMap::from([("password".to_owned(), "hunter2".to_owned())])),
        ..Secret::default()
    };
    harness.secrets().create(&PostParams::default(), &credential).await?;
    let extra_env = json!({"extraEnv": [{"name": "HTTPS_PROXY_PASSWORD",
        "valueFrom": {"secretKeyRef": {"name": "proxy-credentials", "key": "password"}}}]});
    harness.create_provisioner(SAMPLE, extra_env).await?;

    let blocked = harness
        .wait_for(SAMPLE, "CredentialsReady=False", |cr| has_condition(cr, "CredentialsReady", "False"))
        .await?;
    assert_ne!(phase(&blocked), Some("Ready"));
    assert!(key_calls(&harness.fake.journal()).is_empty(), "no key request while credentials are refused");
    let deployments = Api::<Deployment>::namespaced(harness.admin.clone(), NAMESPACE);
    assert!(deployments.get_opt(&format!("provisioner-{SAMPLE}")).await?.is_none(), "no Deployment");
    Ok(())
}

#[tokio::test]
async fn deletion_with_coderd_down_still_removes_the_finalizer() -> anyhow::Result<()> {
    let harness = Harness::start().await?;
    harness.create_provisioner(SAMPLE, json!({})).await?;
    let ready = harness.wait_for(SAMPLE, "phase Ready", is_ready).await?;
    let org_id = ready.status.and_then(|s| s.organization_id).unwrap_or_default();

    harness.fake.set_unreachable(true).await?;
    harness.provisioners().delete(SAMPLE, &DeleteParams::default()).await?;
    harness.wait_gone(SAMPLE).await?;
    harness.fake.set_unreachable(false).await?;
    assert_eq!(harness.fake.keys(&org_id)?.len(), 1, "the key stays in coderd when cleanup cannot reach it");
    Ok(())
}

#[tokio::test]
async fn a_restart_with_ready_provisioners_makes_no_key_calls() -> anyhow::Result<()> {
    const COUNT: usize = 3;
    let harness = Harness::start().await?;
    let names: Vec<String> = (1..=COUNT).map(|i| format!("provisioner-{i}")).collect();
    for name in &names {
        harness.create_provisioner(name, json!({})).await?;
    }
    for name in &names {
        harness.wait_for(name, "phase Ready", is_ready).await?;
    }
    assert_eq!(harness.fake.journal().count("POST", routes::CREATE_KEY), COUNT);

    let mut operator = harness.operator;
    operator.stop().await;
    harness.fake.clear_journal();
    // Deleting a child while the operator is down proves below that the restarted operator did
    // reconcile every provisioner (it recreates the ServiceAccounts).
    let service_accounts = Api::<ServiceAccount>::namespaced(harness.admin.clone(), NAMESPACE);
    for name in &names {
        service_accounts.delete(&format!("{name}-provisioner"), &DeleteParams::default()).await?;
    }
    operator.restart().await?;
    let support::Harness { kubelet: _kubelet, fake, admin: _admin, cluster: _cluster, .. } = harness;
    for name in &names {
        let account = format!("{name}-provisioner");
        let deadline = std::time::Instant::now() + support::EVENTUALLY;
        while service_accounts.get_opt(&account).await?.is_none() {
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "{account} not recreated after the restart\n{}",
                operator.log_tail(40)
            );
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        }
    }
    let journal = fake.journal();
    assert!(key_calls(&journal).is_empty(), "key calls after the restart: {:#?}", key_calls(&journal));
    Ok(())
}

#[tokio::test]
async fn the_operator_log_never_contains_the_key_or_the_session_token() -> anyhow::Result<()> {
    let harness = Harness::start().await?;
    harness.create_provisioner(SAMPLE, json!({})).await?;
    harness.wait_for(SAMPLE, "phase Ready", is_ready).await?;
    let first_key = harness.key_plaintext(SAMPLE).await?.unwrap_or_default();

    // Losing the Secret makes the operator rotate the key (a second plaintext passes through it).
    harness.secrets().delete(&format!("{SAMPLE}-provisioner-key"), &DeleteParams::default()).await?;
    let second_key = harness
        .eventually("a rotated key in a new Secret", || async {
            Ok(harness.key_plaintext(SAMPLE).await?.filter(|key| *key != first_key))
        })
        .await?;
    harness.provisioners().delete(SAMPLE, &DeleteParams::default()).await?;
    harness.wait_gone(SAMPLE).await?;

    let log = harness.operator.full_log();
    assert!(log.contains("starting"), "the log was captured:\n{log}");
    for (what, secret) in [("first key", &first_key), ("rotated key", &second_key), ("session token", &harness.fake.operator_token())] {
        assert!(!secret.is_empty(), "{what} is known");
        assert!(!log.contains(secret.as_str()), "the operator log contains the {what}");
    }
    Ok(())
}
