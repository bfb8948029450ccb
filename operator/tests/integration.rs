//! The operator binary against a local control plane (RBAC on) and the fake coderd, run with
//! the rights of `config/rbac/` only. Needs the control-plane binaries (resolved, or built, by
//! `scripts/k8s-binaries.sh`). Run: `cargo test -p operator --test integration`.
mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use fake_coderd::journal::JournalQuery;
use fake_coderd::routes;
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use operator::runtime::leader::{LeaderElectionSettings, LeadershipFlag, run_with_leader_election};
use serde_json::json;
use support::{
    Cluster, Harness, NAMESPACE, Options, SAMPLE, condition, has_condition, key_calls, phase,
};
use tokio_util::sync::CancellationToken;

fn is_ready(cr: &operator::api::CoderProvisioner) -> bool {
    phase(cr) == Some("Ready")
        && has_condition(cr, "CredentialsReady", "True")
        && has_condition(cr, "DeploymentReady", "True")
}

#[tokio::test]
async fn the_sample_becomes_ready_with_exactly_one_key_create() -> anyhow::Result<()> {
    let harness = Harness::start().await?;
    harness.create_provisioner(SAMPLE, json!({})).await?;

    let ready = harness
        .wait_for(
            SAMPLE,
            "phase Ready with CredentialsReady and DeploymentReady True",
            is_ready,
        )
        .await?;
    let status = ready.status.clone().unwrap_or_default();
    assert_eq!(status.ready_replicas, Some(1));
    for condition_type in [
        "ControlPlaneReady",
        "OperatorAccessReady",
        "ExternalProvisionersEntitled",
        "ProvisionerKeySecretReady",
        "ProvisionerKeyReady",
    ] {
        assert_eq!(
            condition(&ready, condition_type).map(|c| c.0),
            Some("True".to_owned()),
            "{condition_type}"
        );
    }
    let journal = harness.fake.journal();
    assert_eq!(
        journal.count("POST", routes::CREATE_KEY),
        1,
        "{:#?}",
        journal.counts()
    );
    assert_eq!(journal.count("DELETE", routes::DELETE_KEY), 0);
    let org_id = status.organization_id.clone().unwrap_or_default();
    let keys = harness.fake.keys(&org_id)?;
    assert_eq!(
        keys.iter().map(|k| k.name.as_str()).collect::<Vec<_>>(),
        [SAMPLE]
    );
    assert_eq!(
        status.provisioner_key_id.as_deref(),
        Some(keys[0].id.as_str())
    );
    let plaintext = harness.key_plaintext(SAMPLE).await?.unwrap_or_default();
    assert_eq!(
        plaintext.len(),
        43,
        "the Secret holds coderd's plaintext key"
    );
    let deployment = Api::<Deployment>::namespaced(harness.admin.clone(), NAMESPACE)
        .get(&format!("provisioner-{SAMPLE}"))
        .await?;
    assert!(deployment.spec.is_some(), "the Deployment exists");

    let base = support::metrics_url(&harness.operator.full_log())
        .expect("the operator logs its metrics address");
    let http = reqwest::Client::new();
    assert_eq!(
        http.get(format!("{base}/healthz")).send().await?.status(),
        200
    );
    assert_eq!(
        http.get(format!("{base}/readyz")).send().await?.status(),
        200
    );
    let metrics = http
        .get(format!("{base}/metrics"))
        .send()
        .await?
        .text()
        .await?;
    for series in [
        r#"coder_provisioner_operator_coderd_requests_total{route="/api/v2/organizations/{organization}/provisionerkeys",status="201"} 1"#,
        "coder_provisioner_operator_provisioner_keys_created_total 1",
        r#"coder_provisioner_operator_reconciles_total{result="ok"}"#,
    ] {
        assert!(metrics.contains(series), "missing {series:?} in\n{metrics}");
    }
    Ok(())
}

/// A pass's own writes (finalizer, children, key Secret, status) come back as watch events that
/// start no pass: the sample takes the pass that creates everything, the pass its Deployment's
/// readiness starts, perhaps one more that the first list of a related watch (its control plane)
/// starts when it arrives after the CR's, and then none while nothing changes. Without the
/// filter, each status write's echo is a pass: 4 at least.
#[tokio::test]
async fn the_operators_own_writes_start_no_pass() -> anyhow::Result<()> {
    // kube-runtime's debug lines name what started each pass, for the failure message.
    let harness = Harness::start_with(support::Options {
        rust_log: "info,kube_runtime::controller=debug,operator=debug".into(),
        ..Default::default()
    })
    .await?;
    harness.create_provisioner(SAMPLE, json!({})).await?;
    harness.wait_for(SAMPLE, "phase Ready", is_ready).await?;
    let base = support::metrics_url(&harness.operator.full_log())
        .expect("the operator logs its metrics address");
    let passes = || async {
        let metrics = reqwest::get(format!("{base}/metrics"))
            .await?
            .text()
            .await?;
        anyhow::Ok(support::metric_sum(
            &metrics,
            "coder_provisioner_operator_reconciles_total",
        ))
    };
    let at_ready = passes().await?;
    let passes_started = || {
        let log = harness.operator.full_log();
        log.lines()
            .filter(|line| line.contains("pass starting"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(
        at_ready <= 3.0,
        "{at_ready} passes until Ready (the echoes started passes):\n{}",
        passes_started()
    );
    // A window long enough for every echo of the last pass's writes to arrive (milliseconds
    // here), watched throughout.
    let window = std::time::Instant::now();
    while window.elapsed() < std::time::Duration::from_secs(2) {
        let now = passes().await?;
        assert_eq!(
            now,
            at_ready,
            "a pass started after Ready, with nothing changed:\n{}",
            passes_started()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    Ok(())
}

#[tokio::test]
async fn a_key_secret_the_provisioner_does_not_own_is_refused_and_left_alone() -> anyhow::Result<()>
{
    let harness = Harness::start().await?;
    let foreign = Secret {
        metadata: ObjectMeta {
            name: Some(format!("{SAMPLE}-provisioner-key")),
            labels: Some(BTreeMap::from([(
                "owner".to_owned(),
                "someone-else".to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            "key".to_owned(),
            ByteString(b"not-yours".to_vec()),
        )])),
        ..Secret::default()
    };
    let before = harness
        .secrets()
        .create(&PostParams::default(), &foreign)
        .await?;
    harness.create_provisioner(SAMPLE, json!({})).await?;

    let refused = harness
        .wait_for(SAMPLE, "ProvisionerKeySecretReady=False", |cr| {
            has_condition(cr, "ProvisionerKeySecretReady", "False")
        })
        .await?;
    assert_eq!(
        condition(&refused, "ProvisionerKeySecretReady").map(|c| c.1),
        Some("KeySecretNotOwned".to_owned())
    );
    let after = harness
        .secrets()
        .get(&format!("{SAMPLE}-provisioner-key"))
        .await?;
    assert_eq!(
        after.metadata.resource_version, before.metadata.resource_version,
        "the refused Secret is untouched"
    );
    assert_eq!(after.data, before.data);
    assert!(
        key_calls(&harness.fake.journal())
            .iter()
            .all(|e| e.method != "POST"),
        "no key is created"
    );
    let deployments = Api::<Deployment>::namespaced(harness.admin.clone(), NAMESPACE);
    assert!(
        deployments
            .get_opt(&format!("provisioner-{SAMPLE}"))
            .await?
            .is_none()
    );
    Ok(())
}

#[tokio::test]
async fn an_unlabelled_credential_secret_keeps_credentials_false_and_creates_nothing()
-> anyhow::Result<()> {
    let harness = Harness::start().await?;
    let credential = Secret {
        metadata: ObjectMeta {
            name: Some("proxy-credentials".into()),
            ..ObjectMeta::default()
        },
        string_data: Some(BTreeMap::from([(
            "password".to_owned(),
            "hunter2".to_owned(),
        )])),
        ..Secret::default()
    };
    harness
        .secrets()
        .create(&PostParams::default(), &credential)
        .await?;
    let extra_env = json!({"extraEnv": [{"name": "HTTPS_PROXY_PASSWORD",
        "valueFrom": {"secretKeyRef": {"name": "proxy-credentials", "key": "password"}}}]});
    harness.create_provisioner(SAMPLE, extra_env).await?;

    let blocked = harness
        .wait_for(SAMPLE, "CredentialsReady=False", |cr| {
            has_condition(cr, "CredentialsReady", "False")
        })
        .await?;
    assert_ne!(phase(&blocked), Some("Ready"));
    assert!(
        key_calls(&harness.fake.journal()).is_empty(),
        "no key request while credentials are refused"
    );
    let deployments = Api::<Deployment>::namespaced(harness.admin.clone(), NAMESPACE);
    assert!(
        deployments
            .get_opt(&format!("provisioner-{SAMPLE}"))
            .await?
            .is_none(),
        "no Deployment"
    );
    Ok(())
}

#[tokio::test]
async fn deletion_with_coderd_down_still_removes_the_finalizer() -> anyhow::Result<()> {
    let harness = Harness::start().await?;
    harness.create_provisioner(SAMPLE, json!({})).await?;
    let ready = harness.wait_for(SAMPLE, "phase Ready", is_ready).await?;
    let org_id = ready
        .status
        .and_then(|s| s.organization_id)
        .unwrap_or_default();

    harness.fake.set_unreachable(true).await?;
    harness
        .provisioners()
        .delete(SAMPLE, &DeleteParams::default())
        .await?;
    harness.wait_gone(SAMPLE).await?;
    harness.fake.set_unreachable(false).await?;
    assert_eq!(
        harness.fake.keys(&org_id)?.len(),
        1,
        "the key stays in coderd when cleanup cannot reach it"
    );
    Ok(())
}

#[tokio::test]
async fn a_restart_with_ready_provisioners_makes_no_key_calls() -> anyhow::Result<()> {
    const COUNT: usize = 3;
    let mut harness = Harness::start().await?;
    let names: Vec<String> = (1..=COUNT).map(|i| format!("provisioner-{i}")).collect();
    for name in &names {
        harness.create_provisioner(name, json!({})).await?;
    }
    for name in &names {
        harness.wait_for(name, "phase Ready", is_ready).await?;
    }
    assert_eq!(
        harness.fake.journal().count("POST", routes::CREATE_KEY),
        COUNT
    );

    harness.operator.stop().await;
    let log = harness.operator.full_log();
    assert!(
        log.contains("SIGTERM received") && log.contains("stopped"),
        "a graceful stop on SIGTERM:\n{log}"
    );
    harness.fake.clear_journal();
    // Deleting a child while the operator is down proves below that the restarted operator did
    // reconcile every provisioner (it recreates the ServiceAccounts).
    let service_accounts = Api::<ServiceAccount>::namespaced(harness.admin.clone(), NAMESPACE);
    for name in &names {
        service_accounts
            .delete(&format!("{name}-provisioner"), &DeleteParams::default())
            .await?;
    }
    harness.operator.restart().await?;
    for name in &names {
        let account = format!("{name}-provisioner");
        harness
            .eventually(
                &format!("{account} recreated after the restart"),
                || async { Ok(service_accounts.get_opt(&account).await?.map(|_| ())) },
            )
            .await?;
    }
    let journal = harness.fake.journal();
    assert!(
        key_calls(&journal).is_empty(),
        "key calls after the restart: {:#?}",
        key_calls(&journal)
    );
    Ok(())
}

#[tokio::test]
async fn the_operator_log_never_contains_the_key_or_the_session_token() -> anyhow::Result<()> {
    // Every crate at debug level, so the log holds as much as the operator can ever write.
    let harness = Harness::start_with(Options {
        rust_log: "debug".into(),
        ..Options::default()
    })
    .await?;
    harness.create_provisioner(SAMPLE, json!({})).await?;
    harness.wait_for(SAMPLE, "phase Ready", is_ready).await?;
    let first_key = harness.key_plaintext(SAMPLE).await?.unwrap_or_default();

    // Losing the Secret makes the operator rotate the key (a second plaintext passes through it).
    harness
        .secrets()
        .delete(
            &format!("{SAMPLE}-provisioner-key"),
            &DeleteParams::default(),
        )
        .await?;
    let second_key = harness
        .eventually("a rotated key in a new Secret", || async {
            Ok(harness
                .key_plaintext(SAMPLE)
                .await?
                .filter(|key| *key != first_key))
        })
        .await?;
    harness
        .provisioners()
        .delete(SAMPLE, &DeleteParams::default())
        .await?;
    harness.wait_gone(SAMPLE).await?;

    let log = harness.operator.full_log();
    assert!(
        log.contains("coderd request") && log.contains("DEBUG"),
        "the debug log was captured:\n{log}"
    );
    for (what, secret) in [
        ("first key", &first_key),
        ("rotated key", &second_key),
        ("session token", &harness.fake.operator_token()),
    ] {
        assert!(!secret.is_empty(), "{what} is known");
        assert!(
            !log.contains(secret.as_str()),
            "the operator log contains the {what}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn with_leader_election_the_operator_holds_its_lease_and_reconciles() -> anyhow::Result<()> {
    let options = Options {
        extra_args: vec!["--leader-election=true".into()],
        ..Options::default()
    };
    let mut harness = Harness::start_with(options).await?;
    harness.create_provisioner(SAMPLE, json!({})).await?;
    harness.wait_for(SAMPLE, "phase Ready", is_ready).await?;
    // The Lease lives in the operator's namespace (POD_NAMESPACE), granted by config/rbac's Role.
    let leases = Api::<Lease>::namespaced(harness.admin.clone(), "coder-system");
    let lease = leases.get("coder-provisioner-operator").await?;
    let holder = lease
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default();
    assert!(!holder.is_empty(), "the running operator holds the Lease");

    harness.operator.stop().await;
    let released = leases.get("coder-provisioner-operator").await?;
    assert_eq!(
        released.spec.and_then(|s| s.holder_identity),
        None,
        "SIGTERM releases the Lease"
    );
    assert!(harness.operator.full_log().contains("released the lease"));
    Ok(())
}

/// Two candidates on one Lease: only one runs its controller at a time, and when the leader shuts
/// down it releases the Lease so the other takes over well before the Lease would expire.
#[tokio::test]
async fn leadership_passes_to_the_standby_when_the_leader_stops() -> anyhow::Result<()> {
    let cluster = Cluster::start().await?;
    let admin = cluster.admin.clone();
    support::create_namespace(&admin, "leases").await?;
    let running = Arc::new(AtomicUsize::new(0));
    let most_at_once = Arc::new(AtomicUsize::new(0));
    let candidate = |identity: &str| {
        let settings = LeaderElectionSettings {
            lease_name: "it-lease".into(),
            namespace: "leases".into(),
            identity: identity.into(),
            lease_duration_secs: 30,
            renew_grace_secs: 5,
        };
        let (flag, shutdown) = (LeadershipFlag::default(), CancellationToken::new());
        let (running, most_at_once) = (running.clone(), most_at_once.clone());
        let task = tokio::spawn(run_with_leader_election(
            admin.clone(),
            settings,
            flag.clone(),
            shutdown.clone(),
            move |term, _fence| {
                let (running, most_at_once) = (running.clone(), most_at_once.clone());
                async move {
                    most_at_once
                        .fetch_max(running.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                    term.cancelled().await;
                    running.fetch_sub(1, Ordering::SeqCst);
                    Ok(())
                }
            },
        ));
        (flag, shutdown, task)
    };
    let (flag_a, stop_a, task_a) = candidate("candidate-a");
    let (flag_b, stop_b, task_b) = candidate("candidate-b");

    support::until("a leader", || flag_a.is_leader() || flag_b.is_leader()).await?;
    let (leader_stop, leader_task, standby_flag, standby_stop, standby_task) = if flag_a.is_leader()
    {
        (stop_a, task_a, flag_b, stop_b, task_b)
    } else {
        (stop_b, task_b, flag_a, stop_a, task_a)
    };
    assert!(!standby_flag.is_leader());

    let handed_over_at = Instant::now();
    leader_stop.cancel();
    leader_task.await??;
    support::until("the standby taking over", || standby_flag.is_leader()).await?;
    assert!(
        handed_over_at.elapsed() < Duration::from_secs(10),
        "took over after seeing the release, not at the Lease's expiry (30 s)"
    );
    standby_stop.cancel();
    standby_task.await??;
    assert_eq!(
        most_at_once.load(Ordering::SeqCst),
        1,
        "never two controllers at once"
    );
    assert_eq!(
        running.load(Ordering::SeqCst),
        0,
        "every controller stopped"
    );
    Ok(())
}

/// A copy of `config/rbac` whose ClusterRole has `rule` replaced by `replacement`.
fn rbac_with_role_edit(rule: &str, replacement: &str) -> anyhow::Result<tempfile::TempDir> {
    let rbac = tempfile::tempdir()?;
    for entry in std::fs::read_dir(support::repo_path("config/rbac"))? {
        let path = entry?.path();
        std::fs::copy(
            &path,
            rbac.path().join(path.file_name().unwrap_or_default()),
        )?;
    }
    let role_path = rbac.path().join("role.yaml");
    let role = std::fs::read_to_string(&role_path)?;
    anyhow::ensure!(
        role.contains(rule),
        "config/rbac/role.yaml no longer has this rule in the expected form:\n{rule}"
    );
    std::fs::write(&role_path, role.replacen(rule, replacement, 1))?;
    Ok(rbac)
}

/// A SIGTERM before the CR cache is filled (here it never fills: the operator may not list its
/// CRs) is a graceful stop, not a kill at the end of the grace period: kube-runtime's graceful
/// shutdown alone waits for a cache the shutdown stopped filling.
#[tokio::test]
async fn a_stop_before_the_cache_is_filled_is_graceful() -> anyhow::Result<()> {
    let rbac = rbac_with_role_edit(
        "    resources: [\"coderprovisioners\"]\n    verbs: [\"get\", \"list\", \"watch\", \"update\", \"patch\"]\n",
        "    resources: [\"coderprovisioners\"]\n    verbs: [\"get\", \"watch\", \"update\", \"patch\"]\n",
    )?;
    let mut harness = Harness::start_with(Options {
        rbac_dir: rbac.path().to_path_buf(),
        ..Options::default()
    })
    .await?;
    harness
        .eventually("the controller to start", || async {
            Ok(harness
                .operator
                .full_log()
                .contains("starting CoderProvisioner controller")
                .then_some(()))
        })
        .await?;
    harness.operator.stop().await;
    let log = harness.operator.full_log();
    assert!(
        log.contains("stopped before the cache was filled")
            && log.contains("coder_provisioner_operator: stopped"),
        "a graceful stop on SIGTERM before the cache was filled:\n{log}"
    );
    Ok(())
}

/// The PR's first bug, kept fixed: without pods/persistentvolumeclaims rights the operator cannot
/// create the provisioner Role (Kubernetes refuses it as privilege escalation), and the retries of
/// that failing step must not call coderd's key routes again (R-KEY-7, R-KEY-8).
#[tokio::test]
async fn without_the_pod_rules_role_creation_fails_and_retries_leave_coderd_alone()
-> anyhow::Result<()> {
    const ESCALATION: &str = "attempting to grant RBAC permissions not currently held";
    let pod_rule = "  - apiGroups: [\"\"]\n    resources: [\"pods\", \"persistentvolumeclaims\"]\n    verbs: [\"get\", \"list\", \"watch\", \"create\", \"update\", \"patch\", \"delete\"]\n";
    let rbac = rbac_with_role_edit(pod_rule, "")?;

    let harness = Harness::start_with(Options {
        rbac_dir: rbac.path().to_path_buf(),
        ..Options::default()
    })
    .await?;
    harness.create_provisioner(SAMPLE, json!({})).await?;
    let first_failures = harness
        .eventually("the Role refused as escalation", || async {
            let count = harness.operator.full_log().matches(ESCALATION).count();
            Ok((count > 0).then_some(count))
        })
        .await?;
    let cr = harness.provisioners().get(SAMPLE).await?;
    let status = cr.status.clone().unwrap_or_default();
    assert!(
        status.provisioner_key_id.is_some(),
        "key status is persisted before the Role step (R-KEY-7)"
    );
    assert_ne!(phase(&cr), Some("Ready"));

    harness.fake.clear_journal();
    harness
        .eventually("another failed attempt", || async {
            Ok(
                (harness.operator.full_log().matches(ESCALATION).count() > first_failures)
                    .then_some(()),
            )
        })
        .await?;
    let journal = harness.fake.journal();
    assert!(
        key_calls(&journal).is_empty(),
        "retries called the key routes: {:#?}",
        key_calls(&journal)
    );
    Ok(())
}

/// `config/manager` and `config/rbac` apply as they are (server-side apply, no namespace
/// override), and the Deployment runs the documented command hardened as documented.
#[tokio::test]
async fn the_install_manifests_apply_as_shipped() -> anyhow::Result<()> {
    let cluster = Cluster::start().await?;
    let manager = conformance::manifests::apply_dir(
        &cluster.admin,
        &support::repo_path("config/manager"),
        None,
    )
    .await?;
    let rbac =
        conformance::manifests::apply_dir(&cluster.admin, &support::repo_path("config/rbac"), None)
            .await?;
    let kinds: Vec<String> = manager
        .iter()
        .chain(&rbac)
        .map(|o| o.kind.clone())
        .collect();
    for kind in [
        "Namespace",
        "Deployment",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    ] {
        assert!(
            kinds.iter().any(|k| k == kind),
            "{kind} missing from {kinds:?}"
        );
    }

    let deployment = Api::<Deployment>::namespaced(cluster.admin.clone(), "coder-system")
        .get("coder-provisioner-operator")
        .await?;
    let pod = deployment
        .spec
        .and_then(|s| s.template.spec)
        .unwrap_or_default();
    assert_eq!(
        pod.service_account_name.as_deref(),
        Some("coder-provisioner-operator")
    );
    Api::<ServiceAccount>::namespaced(cluster.admin.clone(), "coder-system")
        .get("coder-provisioner-operator")
        .await?;
    assert_eq!(
        pod.security_context.and_then(|s| s.run_as_non_root),
        Some(true)
    );
    let container = pod.containers.first().cloned().unwrap_or_default();
    let args = container.args.unwrap_or_default();
    for expected in ["run", "--leader-election=true", "--log-format=json"] {
        assert!(
            args.iter().any(|a| a == expected),
            "{expected} missing from {args:?}"
        );
    }
    let probe_path = |probe: Option<k8s_openapi::api::core::v1::Probe>| {
        probe.and_then(|p| p.http_get).and_then(|h| h.path)
    };
    assert_eq!(
        probe_path(container.liveness_probe).as_deref(),
        Some("/healthz")
    );
    assert_eq!(
        probe_path(container.readiness_probe).as_deref(),
        Some("/readyz")
    );
    let security = container.security_context.unwrap_or_default();
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert_eq!(security.allow_privilege_escalation, Some(false));
    assert!(
        container
            .resources
            .and_then(|r| r.limits)
            .is_some_and(|l| l.contains_key("memory"))
    );
    Ok(())
}

/// A leader whose Lease is taken over stops its controller at its next renewal, goes back to
/// standby, and leads again (a second term) once the Lease is free.
#[tokio::test]
async fn a_leader_that_loses_its_lease_stops_its_controller_and_competes_again()
-> anyhow::Result<()> {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use kube::api::{Patch, PatchParams};

    let cluster = Cluster::start().await?;
    support::create_namespace(&cluster.admin, "leases").await?;
    let settings = LeaderElectionSettings {
        lease_name: "it-lease".into(),
        namespace: "leases".into(),
        identity: "candidate".into(),
        lease_duration_secs: 4,
        renew_grace_secs: 2,
    };
    let (terms, running) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (flag, shutdown) = (LeadershipFlag::default(), CancellationToken::new());
    let (terms_in, running_in) = (terms.clone(), running.clone());
    let fences = Arc::new(std::sync::Mutex::new(Vec::new()));
    let fences_in = fences.clone();
    let task = tokio::spawn(run_with_leader_election(
        cluster.admin.clone(),
        settings,
        flag.clone(),
        shutdown.clone(),
        move |term, fence| {
            let (terms, running) = (terms_in.clone(), running_in.clone());
            fences_in.lock().unwrap().push(fence);
            async move {
                terms.fetch_add(1, Ordering::SeqCst);
                running.fetch_add(1, Ordering::SeqCst);
                term.cancelled().await;
                running.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            }
        },
    ));
    support::until("a first term", || {
        flag.is_leader() && running.load(Ordering::SeqCst) == 1
    })
    .await?;

    let intruder = json!({"spec": {"holderIdentity": "intruder", "renewTime": MicroTime(k8s_openapi::jiff::Timestamp::now()), "leaseDurationSeconds": 30}});
    Api::<Lease>::namespaced(cluster.admin.clone(), "leases")
        .patch(
            "it-lease",
            &PatchParams::default(),
            &Patch::Merge(&intruder),
        )
        .await?;
    // The first term's fence refuses at once, before the lease manager notices the loss. (Had it
    // proven the hold earlier, it would trust that proof until the hold's end: a replica that
    // follows the protocol takes a Lease only once it expired, which this intruder does not.)
    let first_term = fences.lock().unwrap()[0].clone();
    let refused = first_term.check().await.unwrap_err();
    assert!(refused.to_string().contains("intruder"), "{refused}");
    support::until("the controller stopped after the loss", || {
        !flag.is_leader() && running.load(Ordering::SeqCst) == 0
    })
    .await?;
    support::until("a second term", || {
        flag.is_leader() && terms.load(Ordering::SeqCst) == 2
    })
    .await?;

    shutdown.cancel();
    task.await??;
    assert_eq!(running.load(Ordering::SeqCst), 0);
    Ok(())
}
