//! `conformance bench` end to end at the smallest size: every phase but the suite runs on a real
//! local control plane with the reference operator, and the results folder holds figures that
//! could only come from real measurements; side by side, a command operator goes through the
//! same phases.
use std::path::Path;
use std::time::Duration;

use conformance::bench::compare::Comparison;
use conformance::bench::model::BenchReport;
use conformance::bench::{BenchArgs, Phase};
use conformance::run::args::ControlPlaneAccess;
use fake_coderd::routes;

/// The smallest bench: one CR, one namespace, one control plane, short windows.
fn smallest(out: &Path, phases: Vec<Phase>) -> BenchArgs {
    BenchArgs {
        sizes: vec![1],
        phases,
        namespaces: 1,
        control_planes: 1,
        steady_size: 1,
        idle: Duration::from_secs(2),
        settle: Duration::from_secs(1),
        churn_size: 1,
        fault_window: Duration::from_secs(3),
        fault_toggle: Duration::from_millis(500),
        ready_timeout: Duration::from_secs(120),
        out: out.to_path_buf(),
        apiserver_profile: None,
        started: Default::default(),
        compare: None,
        name: None,
        compare_name: "compared".to_owned(),
        compare_rbac: None,
        control_plane_access: ControlPlaneAccess::ReadWrite,
        compare_control_plane_access: None,
        extra_manifests: None,
        compare_extra_manifests: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_provisioner_bench_measures_every_phase() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let out = tempfile::tempdir()?;
    let mut args = smallest(
        out.path(),
        vec![Phase::Scale, Phase::Steady, Phase::Restart, Phase::Churn],
    );
    args.apiserver_profile = Some(1);
    conformance::bench::run(args).await?;

    let report: BenchReport =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("bench.json"))?)?;
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let scale = &report.scale[0];
    assert_eq!((scale.size, scale.ready), (1, 1));
    assert!(scale.all_ready_ms.is_some() && scale.latency.max_ms.is_some());
    let creates = scale
        .coderd
        .by_route
        .get(&format!("POST {}", routes::CREATE_KEY));
    assert_eq!(
        creates,
        Some(&1),
        "one key created for one CR: {:?}",
        scale.coderd.by_route
    );
    assert!(
        scale
            .writes
            .by_kind
            .keys()
            .any(|k| k.ends_with(" deployments")),
        "{:?}",
        scale.writes
    );
    assert!(scale.operator.peak_rss_kib > 0 && scale.operator.cpu_seconds > 0.0);
    assert!(
        scale
            .api_requests_by_kind
            .contains_key("POST coderprovisioners")
            && scale.api_requests_by_kind.values().sum::<u64>() == scale.api_requests_all_clients,
        "every request is counted by kind: {:?}",
        scale.api_requests_by_kind
    );
    let profile = std::fs::read(out.path().join("kube-apiserver-N1.pprof"))?;
    assert!(
        profile.starts_with(&[0x1f, 0x8b]),
        "the profile is Go's gzipped pprof"
    );
    let steady = report.steady.as_ref().expect("steady phase");
    assert_eq!(steady.ready_at_end, 1);
    let restart = report.restart.as_ref().expect("restart phase");
    assert!(
        restart.reconciled_ms.is_some(),
        "the restarted operator reconciled the CR"
    );
    let churn = report.churn.as_ref().expect("churn phase");
    assert_eq!(churn.faulted.ready, 1);
    assert_eq!(
        churn.healthy,
        conformance::bench::model::ChurnRun::from(scale)
    );
    assert!(!report.targets.is_empty());

    let svg = std::fs::read_to_string(out.path().join("bench.svg"))?;
    assert!(svg.starts_with("<svg") && svg.contains(">1</text>"));
    let text = std::fs::read_to_string(out.path().join("bench.txt"))?;
    assert!(text.contains("Targets") && text.contains("Churn under faults"));
    assert!(text.contains("Kubernetes API requests per CR by kind (all clients"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_operator_is_measured_side_by_side_with_the_reference() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let out = tempfile::tempdir()?;
    // The reference binary again, but as another implementation is run: through the shell,
    // finding its metrics address in METRICS_ADDR.
    let binary = conformance::implementation::reference_operator_binary().await?;
    let mut args = smallest(out.path(), vec![Phase::Scale, Phase::Restart]);
    args.compare = Some(format!("'{}' run", binary.display()));
    // As an operator that also reconciles control planes is shipped: without write verbs on them.
    args.compare_control_plane_access = Some(ControlPlaneAccess::ReadOnly);
    conformance::bench::run(args).await?;
    assert!(
        out.path()
            .join("compared/operator-rbac-read-only/rbac.yaml")
            .is_file(),
        "the compared side ran under its read-only RBAC"
    );
    assert!(
        !out.path()
            .join("reference/operator-rbac-read-only")
            .exists()
    );

    let comparison: Comparison =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("bench.json"))?)?;
    assert_eq!(comparison.names(), ["reference", "compared"]);
    for report in &comparison.implementations {
        let name = &report.environment.implementation;
        assert!(report.errors.is_empty(), "{name}: {:?}", report.errors);
        assert_eq!(report.scale[0].ready, 1, "{name}");
        assert!(report.scale[0].operator.peak_rss_kib > 0, "{name}");
        let restart = report.restart.as_ref().expect("restart phase");
        assert!(
            restart.reconciled_ms.is_some(),
            "{name}: the reconcile counter was read at METRICS_ADDR"
        );
    }
    assert!(
        comparison.implementations[1]
            .environment
            .operator_command
            .starts_with("METRICS_ADDR=127.0.0.1:<port> ")
    );
    let all_ready = comparison
        .figures
        .iter()
        .find(|f| f.figure == "scale N=1: all Ready")
        .expect("time to all Ready");
    assert!(all_ready.values.iter().all(Option::is_some) && all_ready.ratio.is_some());
    assert!(
        out.path()
            .join("compared/logs/scale-1/operator.log")
            .is_file()
    );

    let text = std::fs::read_to_string(out.path().join("bench.txt"))?;
    assert!(text.contains("compared/reference") && text.contains("==== compared"));
    let svg = std::fs::read_to_string(out.path().join("bench.svg"))?;
    assert!(svg.contains("Side by side: reference vs compared"));
    Ok(())
}
