//! `conformance run`: the suite against an operator, with its reports.
//!
//! `run` starts the shared environment once (control plane, fake coderd, operator under test,
//! readiness simulator), publishes it for the Worlds, runs cucumber with the terminal, JUnit,
//! Cucumber-JSON and conformance writers teed together, and tears everything down again.
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow};
use cucumber::gherkin::tagexpr::TagOperation;
use cucumber::{World as _, WriterExt as _, event, gherkin, writer};
use futures::FutureExt as _;
use regex::Regex;

use crate::cli::{ClusterTier, ControlPlaneAccess, OperatorMode, RunArgs};
use crate::cluster::k3s::{K3sCluster, K3sOptions};
use crate::cluster::kind::{KindCluster, KindOptions, StartedCluster};
use crate::cluster::kubeconfig::{ClusterEndpoint, load_config};
use crate::cluster::local::{LocalControlPlane, LocalOptions};
use crate::features::{all_tags, feature_hashes, parse_features};
use crate::implementation::{OperatorCommand, OperatorProcess, OperatorUnderTest};
use crate::paths::{KIND_LOGS_DIR, OPERATOR_LOG_FILE, REPORT_FILE, repo_root};
use crate::report::collector::{Collector, Outcomes, ScenarioKey, key};
use crate::report::model::{self, ConformanceReport, Implementation, SCHEMA, Suite};
use crate::selection::{NOT_SELECTED, NOT_STARTED, Selection, list};
use crate::wait::{TimeoutProfile, Timeouts};
use crate::world::{
    Coderd, Environment, ExistingControlPlane, Gate, Operator, ProvisionerWorld,
    install_environment,
};

// ---- the shared environment ----

/// What `run` owns and stops at the end (the Worlds only see the [`Environment`]).
struct Owned {
    control_plane: Option<LocalControlPlane>,
    /// A kind cluster or k3s container; dropping it closes its port-forwards and deletes it unless kept.
    started_cluster: Option<StartedCluster>,
    fake: Option<fake_coderd::FakeCoderd>,
    simulator: Option<crate::kubelet::ReadinessSimulator>,
}

struct Prepared {
    environment: Arc<Environment>,
    owned: Owned,
    tier: String,
    simulated: Vec<String>,
    mode: String,
    /// The report's `setup` section.
    setup: model::Setup,
    /// Watches the suite's control planes for changes by others (none with --control-plane).
    guard: Option<crate::fixture_guard::FixtureGuard>,
}

async fn prepare(
    args: &RunArgs,
    inputs: &crate::assets::Inputs,
    report_dir: &Path,
) -> anyhow::Result<Prepared> {
    let mut started_cluster = None;
    let (client, kubeconfig, endpoint, kubectl, control_plane, profile, tier) = match args.cluster {
        ClusterTier::Kind | ClusterTier::K3s => {
            // These tiers build the images from the source tree this binary was compiled in.
            let repo = repo_root().canonicalize().context(
                "locating the repository root (the kind and k3s tiers build images from it)",
            )?;
            let started = provision_cluster(args, &repo, report_dir).await?;
            let cluster = started.provisioned();
            let config = load_config(&cluster.kubeconfig).await?;
            let endpoint = ClusterEndpoint::from_config(&config);
            let client = kube::Client::try_from(config).context("building a Kubernetes client")?;
            let kubeconfig = cluster.kubeconfig.clone();
            let tier = if args.cluster == ClusterTier::Kind {
                "kind"
            } else {
                "k3s"
            };
            started_cluster = Some(started);
            (
                client,
                kubeconfig,
                endpoint,
                find_on_path("kubectl"),
                None,
                TimeoutProfile::RealCluster,
                tier,
            )
        }
        ClusterTier::Local => {
            eprintln!(
                "conformance: starting a local control plane (etcd + kube-apiserver + controller manager)"
            );
            // With --keep-on-failure the control plane's files (etcd data, certificates, admin
            // kubeconfig, logs) survive the run, so a kept namespace can still be inspected.
            let options = LocalOptions {
                keep_files: args.keep_on_failure,
                ..LocalOptions::default()
            };
            let local = LocalControlPlane::start(options)
                .await
                .context("starting the local control plane")?;
            if args.keep_on_failure {
                eprintln!(
                    "conformance: the local control plane's files are kept in {}",
                    local.dir().display()
                );
            }
            let client = local.admin_client().await?;
            let kubeconfig = local.kubeconfig_path().to_path_buf();
            let endpoint = local.endpoint().clone();
            let kubectl = Some(local.kubectl());
            (
                client,
                kubeconfig,
                endpoint,
                kubectl,
                Some(local),
                TimeoutProfile::Local,
                "local",
            )
        }
        ClusterTier::Kubeconfig => {
            let path = args
                .kubeconfig
                .clone()
                .or_else(|| std::env::var_os("KUBECONFIG").map(PathBuf::from))
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".kube/config")))
                .ok_or_else(|| {
                    anyhow!("--cluster kubeconfig needs --kubeconfig (or $KUBECONFIG)")
                })?;
            let config = match &args.context {
                None => load_config(&path).await?,
                Some(context) => {
                    let file = kube::config::Kubeconfig::read_from(&path)?;
                    let options = kube::config::KubeConfigOptions {
                        context: Some(context.clone()),
                        ..Default::default()
                    };
                    kube::Config::from_custom_kubeconfig(file, &options).await?
                }
            };
            let endpoint = ClusterEndpoint::from_config(&config);
            let client = kube::Client::try_from(config).context("building a Kubernetes client")?;
            let kubectl = find_on_path("kubectl");
            (
                client,
                path,
                endpoint,
                kubectl,
                None,
                TimeoutProfile::RealCluster,
                "kubeconfig",
            )
        }
    };
    let timeouts =
        Timeouts::for_profile(profile).adjusted(args.timeout_scale, args.wait_timeout)?;

    let crd_set = if args.operator != OperatorMode::Installed || args.started.crds.is_some() {
        let crds = crate::manifests::install_crds(&client, &inputs.crds)
            .await
            .with_context(|| format!("installing the CRDs of {}", inputs.crds_source))?;
        crate::manifests::wait_crds_established(&client, &crds, timeouts.eventually).await?;
        crate::assets::manifest_set(&inputs.crds_source, &inputs.crds)?
    } else {
        crate::setup::installed_crds(&client).await?
    };

    let in_cluster_fake = started_cluster
        .as_ref()
        .map(|c: &StartedCluster| &c.provisioned().fake_coderd);
    let daemon_image = started_cluster
        .as_ref()
        .map(|c| c.provisioned().images.coder_stub.clone());
    let (coderd, fake, existing_control_plane) = match (&args.coderd, &args.control_plane) {
        (Some(url), Some(reference)) => {
            let (namespace, name) = reference.split_once('/').ok_or_else(|| {
                anyhow!("--control-plane must be NAMESPACE/NAME, got {reference:?}")
            })?;
            let existing = ExistingControlPlane {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            };
            let url = url.trim_end_matches('/').to_owned();
            (
                Coderd {
                    runner_url: url.clone(),
                    url,
                    admin: None,
                },
                None,
                Some(existing),
            )
        }
        _ if let Some(in_cluster) = in_cluster_fake => {
            let coderd = Coderd {
                url: in_cluster.in_cluster_url.clone(),
                runner_url: in_cluster.local_url(),
                admin: Some(in_cluster.admin()),
            };
            (coderd, None, None)
        }
        _ => {
            let fake = fake_coderd::FakeCoderd::start()
                .await
                .context("starting the fake coderd")?;
            eprintln!("conformance: fake coderd at {}", fake.url());
            (
                Coderd {
                    url: fake.url(),
                    runner_url: fake.url(),
                    admin: Some(fake.admin()),
                },
                Some(fake),
                None,
            )
        }
    };

    // D-8: only a control plane started by the suite (marker present, no Nodes) gets the
    // readiness simulator; the simulator itself refuses any other cluster. A kubeconfig may
    // point at such a control plane, so the kubeconfig tier asks too and reports the answer.
    let mut simulated = Vec::new();
    let simulator = match crate::kubelet::ReadinessSimulator::start(
        client.clone(),
        crate::kubelet::WatchScope::AllNamespaces,
    )
    .await
    {
        Ok(simulator) => {
            simulated.push(
                "Deployment readiness: the control plane has no kubelet, so the suite sets Deployment status \
                 (readyReplicas) once the pod template is valid (contract D-8); provisioner pods never run"
                    .to_owned(),
            );
            Some(simulator)
        }
        Err(error) if control_plane.is_some() => {
            return Err(error.context("starting the readiness simulator"));
        }
        Err(error) => {
            eprintln!(
                "conformance: no readiness simulation on this cluster ({error:#}); provisioner pods must become ready by themselves"
            );
            None
        }
    };

    let extra_manifests = match &args.extra_manifests {
        Some(dir) => {
            let applied =
                crate::setup::apply_extra_manifests(&client, dir, timeouts.eventually).await?;
            eprintln!(
                "conformance: applied {} object(s) of --extra-manifests {}",
                applied.len(),
                dir.display()
            );
            let source = crate::assets::Source::from_option(Some(dir));
            Some(crate::assets::manifest_set(&source, dir)?)
        }
        None => None,
    };

    // The fixture guard learns the suite's own field managers before the operator starts.
    let guard = if args.control_plane.is_none() {
        let managers = crate::fixture_guard::suite_managers(&client).await?;
        Some(crate::fixture_guard::FixtureGuard::start(
            client.clone(),
            managers,
        ))
    } else {
        None
    };
    let read_only = args.control_plane_access == ControlPlaneAccess::ReadOnly;
    if read_only && (args.operator == OperatorMode::Installed || started_cluster.is_some()) {
        anyhow::bail!(
            "--control-plane-access read-only applies the operator's RBAC, so the suite must start the operator \
             (not --operator installed, nor the kind or k3s tier); give an installed operator read-only RBAC yourself"
        );
    }

    let mut operator_command = None;
    let mut replica_command = None;
    let mut rbac_set = None;
    let (operator, mode) = match (&args.started.operator_cmd, args.operator) {
        (_, OperatorMode::Installed) => match &args.operator_deployment {
            Some(reference) => (
                Operator::InCluster(
                    crate::cluster::in_cluster::InClusterOperator::from_live(&client, reference)
                        .await?,
                ),
                "installed (its Deployment named)",
            ),
            None => (Operator::Installed, "installed"),
        },
        // kind and k3s run the reference operator in the cluster, from config/manager; the suite
        // restarts it by scaling its Deployment.
        _ if started_cluster.is_some() => {
            let repo = repo_root()
                .canonicalize()
                .context("locating the repository root (config/manager)")?;
            (
                Operator::InCluster(crate::cluster::in_cluster::InClusterOperator::from_manager(
                    &repo,
                )?),
                "in-cluster (config/manager)",
            )
        }
        (command, OperatorMode::Reference) => {
            let (command, mode) = match command {
                Some(line) => (OperatorCommand::from_shell(line)?, "command"),
                None => (OperatorCommand::reference().await?, "reference"),
            };
            replica_command = match (&args.started.replica_cmd, &args.started.operator_cmd) {
                (Some(line), _) => Some(OperatorCommand::from_shell(line)?),
                (None, None) => Some(OperatorCommand::reference_replica().await?),
                (None, Some(_)) => None,
            };
            let mut spec = OperatorUnderTest::new(command);
            spec.rbac_dir = inputs.rbac.clone();
            let mut rbac_source = inputs.rbac_source.to_string();
            if read_only {
                spec.rbac_dir =
                    crate::fixture_guard::write_read_only_rbac(&inputs.rbac, report_dir)?;
                rbac_source = format!(
                    "{rbac_source}, without write verbs on codercontrolplanes (+/status, /finalizers): {}",
                    spec.rbac_dir.display()
                );
            }
            let shown = crate::setup::mask_secrets(
                args.started
                    .operator_cmd
                    .as_deref()
                    .map_or(spec.command.display(), str::to_owned)
                    .as_str(),
            );
            eprintln!("conformance: starting the operator: {shown} (RBAC {rbac_source})");
            operator_command = Some(shown);
            let mut set = crate::assets::manifest_set(&inputs.rbac_source, &spec.rbac_dir)?;
            set.source = rbac_source;
            rbac_set = Some(set);
            let process = OperatorProcess::start(&client, &endpoint, spec)
                .await
                .context("starting the operator")?;
            (
                Operator::Started(Box::new(tokio::sync::Mutex::new(Some(process)))),
                mode,
            )
        }
    };

    let environment = Arc::new(Environment {
        client,
        kubeconfig,
        kubectl,
        coderd,
        operator,
        replica_command,
        existing_control_plane,
        daemon_image,
        timeouts,
        repo_root: inputs.bundle.root().to_path_buf(),
        report_dir: report_dir.to_path_buf(),
        keep_on_failure: args.keep_on_failure,
        audit_log: control_plane
            .as_ref()
            .map(LocalControlPlane::audit_log_path),
        shrink_budget: Duration::from_secs(args.shrink_seconds).mul_f64(timeouts.scale),
    });
    Ok(Prepared {
        environment,
        owned: Owned {
            control_plane,
            started_cluster,
            fake,
            simulator,
        },
        setup: model::Setup {
            mode: mode.to_owned(),
            operator_command,
            rbac: rbac_set,
            crds: crd_set,
            extra_manifests,
            control_plane_access: args.control_plane_access.as_str().to_owned(),
            tier: tier.to_owned(),
            timeouts: crate::setup::timeouts(&timeouts, args.timeout_scale),
            retries: args.retry,
            concurrency: args.concurrency(),
        },
        tier: tier.to_owned(),
        simulated,
        mode: mode.to_owned(),
        guard,
    })
}

/// Creates the kind cluster or k3s container with the images, the operator and the fake coderd.
async fn provision_cluster(
    args: &RunArgs,
    repo: &Path,
    report_dir: &Path,
) -> anyhow::Result<StartedCluster> {
    Ok(match args.cluster {
        ClusterTier::Kind => {
            let options = KindOptions {
                keep: args.keep_cluster,
                node_image: args.node_image.clone(),
                image_build: Some(args.image_build),
                logs_dir: Some(report_dir.join(KIND_LOGS_DIR)),
                ..KindOptions::new(repo)
            };
            StartedCluster::Kind(Box::new(KindCluster::provision(options).await?))
        }
        _ => {
            let options = K3sOptions {
                keep: args.keep_cluster,
                image_build: Some(args.image_build),
                ..K3sOptions::new(repo)
            };
            StartedCluster::K3s(Box::new(K3sCluster::provision(options).await?))
        }
    })
}

fn find_on_path(binary: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(binary))
        .find(|candidate| candidate.is_file())
}

async fn teardown(environment: &Environment, owned: Owned) {
    if let Operator::Started(process) = &environment.operator
        && let Some(mut process) = process.lock().await.take()
    {
        process.stop().await;
        // The whole log (every start) is evidence: keep it with the reports.
        let kept = environment.report_dir.join(OPERATOR_LOG_FILE);
        if let Err(error) = std::fs::copy(process.log_path(), &kept) {
            eprintln!(
                "conformance: could not keep the operator's log in {}: {error}",
                kept.display()
            );
        }
        // Dropping it removes its scratch folder (kubeconfig with the ServiceAccount token).
        drop(process);
    }
    if let Some(simulator) = owned.simulator {
        simulator.stop().await;
    }
    drop(owned.fake);
    if let Some(control_plane) = owned.control_plane {
        control_plane.stop().await;
    }
    drop(owned.started_cluster);
}

// ---- per-scenario hooks ----

/// After each scenario: coderd call counts, diagnostics on failure, global coderd switches
/// restored, namespace removed (kept on failure with --keep-on-failure).
async fn after_scenario(
    outcomes: Arc<Mutex<Outcomes>>,
    scenario_key: ScenarioKey,
    scenario_name: String,
    failed: bool,
    world: Option<&mut ProvisionerWorld>,
) {
    let Some(world) = world else { return };
    // Before anything is cleaned up: the scenario's secrets and its CRs are still there.
    let mut findings = crate::hygiene::findings(world).await;
    findings.extend(crate::invariants::end_of_scenario(world).await);
    if let (false, Some(generated)) = (findings.is_empty(), &world.generated) {
        findings.push(generated.describe());
    }
    let failed = failed || !findings.is_empty();
    let calls = if world.env.coderd.admin.is_some() && world.coderd.is_some() {
        world.journal().await.ok().map(|entries| {
            let mut counts = BTreeMap::new();
            for entry in entries {
                let route = entry.route.unwrap_or(entry.path);
                *counts
                    .entry(format!("{} {route}", entry.method))
                    .or_insert(0) += 1;
            }
            counts
        })
    } else {
        None
    };
    let mut diagnostics = None;
    if failed {
        let folder =
            crate::diagnostics::folder_name(&scenario_key.0, &scenario_name, scenario_key.1);
        let dir = world.env.report_dir.join("diagnostics").join(&folder);
        match crate::diagnostics::write_bundle(world, &dir).await {
            Ok(dir) => {
                eprintln!(
                    "conformance: diagnostics for \"{scenario_name}\" in {}",
                    dir.display()
                );
                diagnostics = Some(format!("diagnostics/{folder}"));
            }
            Err(error) => eprintln!(
                "conformance: could not write diagnostics for \"{scenario_name}\": {error:#}"
            ),
        }
    }
    outcomes
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .set_extras(scenario_key, calls, diagnostics);
    // After the diagnostics, which show the scenario's own objects, not the trials'.
    if failed && let Some(shrunk) = crate::steps::generated::shrink(world).await {
        eprintln!("conformance: \"{scenario_name}\": {shrunk}");
        findings.push(shrunk);
    }
    if let Err(error) = crate::steps::coderd::clear_scenario_faults(world).await {
        eprintln!("conformance: could not clear the scenario's coderd faults: {error:#}");
    }
    if world.touched_global_coderd
        && let Err(error) = crate::steps::coderd::restore_global_coderd(world).await
    {
        eprintln!("conformance: could not restore the fake coderd's global state: {error:#}");
    }
    world.stop_replicas().await;
    if world.operator_stopped
        && let Err(error) = world.restart_operator().await
    {
        eprintln!("conformance: could not start the stopped operator again: {error:#}");
    }
    if let Err(error) = crate::steps::provisioner::release_held(world).await {
        eprintln!("conformance: could not remove the suite's finalizer: {error:#}");
    }
    // Namespace deletion runs in the background, so the gate can be released before it.
    world.gate = None;
    if failed && world.env.keep_on_failure && world.owns_namespace {
        eprintln!(
            "conformance: kept namespace {} of failed scenario \"{scenario_name}\"",
            world.namespace
        );
    } else if let Err(error) = world.delete_namespace().await {
        eprintln!(
            "conformance: could not delete namespace {}: {error:#}",
            world.namespace
        );
    }
    // A panic is how an after-hook fails its scenario in cucumber (reported as a failed hook).
    if !findings.is_empty() {
        panic!("after the scenario: {}", findings.join("; "));
    }
}

// ---- run ----

pub async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    if args.operator_deployment.is_some() && args.operator != OperatorMode::Installed {
        anyhow::bail!(
            "--operator-deployment names the Deployment of an installed operator: use it with --operator installed"
        );
    }
    let tags = match (&args.tags, args.explore) {
        (None, Some(_)) => Some("@generated".to_owned()),
        (tags, _) => tags.clone(),
    };
    let selection = Selection {
        tags: tags
            .as_deref()
            .map(|t| {
                t.parse::<TagOperation>()
                    .map_err(|e| anyhow!("--tags {t:?}: {e}"))
            })
            .transpose()?,
        name: args
            .name
            .as_deref()
            .map(Regex::new)
            .transpose()
            .context("--name is not a valid regex")?,
        real_coderd: args.coderd.is_some(),
        operator_installed: args.operator == OperatorMode::Installed
            && args.operator_deployment.is_none(),
        replicas: matches!(args.cluster, ClusterTier::Local | ClusterTier::Kubeconfig)
            && args.operator == OperatorMode::Reference
            && (args.started.operator_cmd.is_none() || args.started.replica_cmd.is_some()),
        audit_log: args.cluster == ClusterTier::Local,
    };
    let mut inputs = args.started.inputs(args.features.as_deref())?;
    if let Some(count) = args.explore {
        inputs.features = explored_features(&inputs, count, args.explore_from)?;
    }
    let features = parse_features(&inputs.features)?;
    if args.list {
        list(&features, &selection);
        return Ok(ExitCode::SUCCESS);
    }
    let report_dir = args.report_dir.clone();
    std::fs::create_dir_all(&report_dir)
        .with_context(|| format!("creating {}", report_dir.display()))?;
    let report_dir = report_dir.canonicalize()?;

    let started_at = jiff::Timestamp::now();
    let clock = Instant::now();
    let prepared = prepare(&args, &inputs, &report_dir).await?;
    install_environment(prepared.environment.clone())?;

    let collector = Collector::default();
    let outcomes = collector.outcomes.clone();
    let junit =
        std::fs::File::create(report_dir.join("junit.xml")).context("creating junit.xml")?;
    let json = std::fs::File::create(report_dir.join("cucumber.json"))
        .context("creating cucumber.json")?;
    let writer = writer::Basic::raw(io::stdout(), writer::Coloring::Auto, 0)
        .summarized()
        .tee::<ProvisionerWorld, _>(writer::JUnit::for_tee(junit, 0))
        .tee::<ProvisionerWorld, _>(writer::Json::for_tee(json))
        .tee::<ProvisionerWorld, _>(collector.discard_stats_writes().discard_arbitrary_writes())
        .normalized();

    let filter_outcomes = outcomes.clone();
    let filter = move |feature: &gherkin::Feature,
                       rule: Option<&gherkin::Rule>,
                       scenario: &gherkin::Scenario| {
        let tags = all_tags(feature, rule, scenario);
        let skip = selection.skip_reason(&tags, &scenario.name);
        let selected = skip.is_none();
        // A selected scenario is "not started" until cucumber starts it, so one that a stopped
        // run never starts is in the report (and keeps the run from claiming conformance).
        filter_outcomes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .skipped(
                feature,
                scenario,
                skip.unwrap_or_else(|| NOT_STARTED.to_owned()),
            );
        selected
    };
    let hook_outcomes = outcomes.clone();
    let mut cucumber = ProvisionerWorld::cucumber::<&PathBuf>()
        .with_parser(
            if inputs.features_source == crate::assets::Source::Embedded {
                crate::schedule::SlowFirst::showing_embedded_as_features(&inputs.features)
            } else {
                crate::schedule::SlowFirst::default()
            },
        )
        .max_concurrent_scenarios(args.concurrency())
        .retries(args.retry)
        .before(|feature, rule, scenario, world| {
            let tags = all_tags(feature, rule, scenario);
            let serial = tags.iter().any(|t| t == "serial");
            world.prompt_outcome = crate::world::expects_prompt_outcome(&tags);
            async move { world.gate = Some(Gate::enter(serial).await) }.boxed_local()
        })
        .after(move |feature, _rule, scenario, finished, world| {
            let failed = matches!(
                finished,
                event::ScenarioFinished::StepFailed(..)
                    | event::ScenarioFinished::BeforeHookFailed(_)
            );
            after_scenario(
                hook_outcomes.clone(),
                key(feature, scenario),
                scenario.name.clone(),
                failed,
                world,
            )
            .boxed_local()
        })
        .with_writer(writer)
        // A step without a definition fails its scenario instead of skipping it silently.
        .fail_on_skipped()
        .with_default_cli();
    if args.fail_fast {
        cucumber = cucumber.fail_fast();
    }
    let run = cucumber.filter_run(&inputs.features, filter);
    // A changed control-plane fixture stops the run at once, with one message.
    let aborted = match &prepared.guard {
        Some(guard) => tokio::select! {
            finished = run => Err(finished),
            message = guard.tampered() => Ok(message),
        },
        None => Err(run.await),
    };
    let (cucumber_failed, aborted) = match aborted {
        Err(finished) => (
            cucumber::writer::Stats::<ProvisionerWorld>::execution_has_failed(&finished),
            None,
        ),
        Ok(message) => (true, Some(message)),
    };

    if cucumber_failed && let Some(StartedCluster::Kind(cluster)) = &prepared.owned.started_cluster
    {
        cluster.export_logs(&report_dir.join(KIND_LOGS_DIR));
    }
    teardown(&prepared.environment, prepared.owned).await;

    let mut results = outcomes
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .into_results();
    // Blames each failure on its failing step's rules (filling `failed_rules`).
    let coverage = crate::coverage::for_report(&inputs.features, &mut results);
    let report = ConformanceReport {
        schema: SCHEMA.to_owned(),
        implementation: Implementation {
            name: args.impl_name.clone(),
            version: args.impl_version.clone(),
            url: args.impl_url.clone(),
            contact: args.impl_contact.clone(),
            mode: prepared.mode,
        },
        suite: Suite {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            git_commit: crate::assets::GIT_COMMIT.to_owned(),
            features_source: inputs.features_source.to_string(),
            features: feature_hashes(&inputs.features)?,
        },
        environment: model::Environment {
            tier: prepared.tier,
            coderd: if args.coderd.is_some() {
                "real"
            } else {
                "fake"
            }
            .to_owned(),
            simulated: prepared.simulated,
        },
        setup: Some(prepared.setup),
        aborted: aborted.clone(),
        started_at: started_at
            .round(jiff::Unit::Second)
            .unwrap_or(started_at)
            .to_string(),
        duration_ms: u64::try_from(clock.elapsed().as_millis()).unwrap_or(u64::MAX),
        summary: model::summarise(&[]),
        coverage,
        results,
        digest: String::new(),
    }
    .seal()?;
    let path = report_dir.join(REPORT_FILE);
    std::fs::write(&path, report.to_yaml()?)
        .with_context(|| format!("writing {}", path.display()))?;
    // cucumber names the embedded features by their scratch path, relative to the working
    // folder when inside it; "features/…" reads better and is the same in every run.
    let root = inputs.bundle.root();
    let strip: Vec<String> = if inputs.features_source == crate::assets::Source::Embedded {
        let full = root.display().to_string();
        let last = root.file_name().map(|n| n.to_string_lossy().into_owned());
        std::iter::once(full.trim_start_matches('/').to_owned())
            .chain(last)
            .map(|p| format!("{p}/"))
            .collect()
    } else {
        Vec::new()
    };
    crate::report::junit::annotate_file(&report_dir.join("junit.xml"), &report.results, &strip)?;
    print_summary(&report, &report_dir);

    let any_failed = report
        .results
        .iter()
        .any(|r| r.status == model::Status::Failed);
    if let Some(message) = &aborted {
        eprintln!("conformance: STOPPED: {message}");
        return Ok(ExitCode::from(2));
    }
    Ok(if cucumber_failed || any_failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// A copy of the features (in the run's scratch folder) whose generated cases run `count` seeds
/// from `from` (default: from the clock), said on the terminal so that the run can be repeated.
fn explored_features(
    inputs: &crate::assets::Inputs,
    count: u64,
    from: Option<u64>,
) -> anyhow::Result<PathBuf> {
    if count == 0 {
        anyhow::bail!("--explore needs at least one seed");
    }
    let from = from.unwrap_or_else(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        // Small enough to read and type back; seeds 1–8 are the fixed ones.
        1_000 + now.as_secs() % 1_000_000
    });
    let dir = inputs.bundle.root().join("explored-features");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    for entry in std::fs::read_dir(&inputs.features)
        .with_context(|| format!("reading {}", inputs.features.display()))?
    {
        let path = entry?.path();
        let Some(name) = path.file_name() else {
            continue;
        };
        if path.extension().is_none_or(|e| e != "feature") {
            continue;
        }
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let text = if name == "generated.feature" {
            crate::cases::with_seeds(&text, from..from + count)?
        } else {
            text
        };
        std::fs::write(dir.join(name), text)?;
    }
    eprintln!(
        "conformance: exploring {count} generated case(s), seeds {from}–{} (repeat with --explore {count} --explore-from {from})",
        from + count - 1
    );
    Ok(dir)
}

fn print_summary(report: &ConformanceReport, report_dir: &Path) {
    println!();
    for line in summary_lines(report) {
        println!("{line}");
    }
    println!(
        "Reports in {}: junit.xml, cucumber.json, {REPORT_FILE}",
        report_dir.display()
    );
}

/// Skipped because this run left the scenario out (a filter, or --fail-fast stopping early),
/// not because the environment lacks something it needs.
fn left_out_by_the_run(result: &model::ScenarioResult) -> bool {
    result.status == model::Status::Skipped
        && result
            .reason
            .as_deref()
            .is_some_and(|reason| reason.starts_with(NOT_SELECTED) || reason == NOT_STARTED)
}

/// The claim for one level. A run that left scenarios out is partial: it neither claims nor
/// denies conformance unless a scenario it ran failed. A skip this run could not avoid (the tier
/// lacks what the scenario needs) denies it, saying so: nothing failed, but nothing proves it.
fn claim(conformant: bool, failed: usize, skipped: usize, left_out: usize) -> String {
    if conformant {
        "yes".to_owned()
    } else if failed > 0 {
        "no".to_owned()
    } else if left_out == 0 && skipped > 0 {
        format!("no ({skipped} scenarios skipped, each with its reason above; none failed)")
    } else if left_out == 0 {
        "no".to_owned()
    } else {
        format!("not claimed (a partial run: {left_out} scenarios not run)")
    }
}

/// The terminal summary: per level the tally, with the scenarios the run left out counted apart
/// from skips, each real skip with its reason, what was simulated, and each level's claim.
fn summary_lines(report: &ConformanceReport) -> Vec<String> {
    let left_out = |level: model::Level| {
        report
            .results
            .iter()
            .filter(|r| r.level == Some(level) && left_out_by_the_run(r))
            .count()
    };
    let (core_left_out, extended_left_out) = (
        left_out(model::Level::Core),
        left_out(model::Level::Extended),
    );
    let tally = |t: &model::Tally, left_out: usize| {
        let mut line = format!(
            "{} passed, {} failed, {} skipped, {} flaky",
            t.passed,
            t.failed,
            t.skipped.saturating_sub(left_out),
            t.flaky
        );
        if left_out > 0 {
            line += &format!("; {left_out} not run");
        }
        line
    };
    let summary = &report.summary;
    let mut lines = vec![
        format!("Core:     {}", tally(&summary.core, core_left_out)),
        format!("Extended: {}", tally(&summary.extended, extended_left_out)),
    ];
    let (left_out, skipped): (Vec<_>, Vec<_>) = report
        .results
        .iter()
        .filter(|r| r.status == model::Status::Skipped)
        .partition(|r| left_out_by_the_run(r));
    let not_started = left_out
        .iter()
        .filter(|r| r.reason.as_deref() == Some(NOT_STARTED))
        .count();
    if !left_out.is_empty() {
        lines.push(format!(
            "  not run: {} not selected by --tags/--name, {not_started} not started before the run stopped (listed in the report)",
            left_out.len() - not_started
        ));
    }
    lines.extend(skipped.iter().map(|result| {
        format!(
            "  skipped {}:{} \"{}\": {}",
            result.feature,
            result.line,
            result.scenario,
            result.reason.as_deref().unwrap_or("")
        )
    }));
    lines.extend(
        report
            .environment
            .simulated
            .iter()
            .map(|note| format!("Simulated: {note}")),
    );
    lines.extend(rule_lines(&report.coverage));
    lines.push(format!(
        "Core conformance: {}",
        claim(
            summary.core_conformant,
            summary.core.failed,
            summary.core.skipped - core_left_out,
            core_left_out
        )
    ));
    lines.push(format!(
        "Extended conformance: {}",
        claim(
            summary.extended_conformant,
            summary.core.failed + summary.extended.failed,
            summary.core.skipped + summary.extended.skipped - core_left_out - extended_left_out,
            core_left_out + extended_left_out
        )
    ));
    lines
}

/// The rules' verdicts: a count of each, the rules without a scenario apart, and each failed
/// rule with the scenarios that failed on it (nothing for a report without verdicts).
fn rule_lines(coverage: &[model::RuleCoverage]) -> Vec<String> {
    use model::RuleVerdict;
    if coverage.iter().all(|r| r.verdict.is_none()) {
        return Vec::new();
    }
    let (observable, unobservable): (Vec<_>, Vec<_>) =
        coverage.iter().partition(|r| r.unobservable.is_none());
    let count = |verdict: RuleVerdict| {
        observable
            .iter()
            .filter(|r| r.verdict == Some(verdict))
            .count()
    };
    let mut lines = vec![format!(
        "Rules:    {} passed, {} failed, {} not reached, {} not run; {} not observable",
        count(RuleVerdict::Passed),
        count(RuleVerdict::Failed),
        count(RuleVerdict::NotReached),
        count(RuleVerdict::NotRun),
        unobservable.len()
    )];
    for rule in coverage
        .iter()
        .filter(|r| r.verdict == Some(RuleVerdict::Failed))
    {
        let at: Vec<String> = rule
            .scenarios
            .iter()
            .filter(|s| s.verdict == Some(RuleVerdict::Failed))
            .map(|s| format!("{}:{}", s.feature, s.line))
            .collect();
        lines.push(format!("  failed {}: {}", rule.rule, at.join(", ")));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn skipped(level: model::Level, reason: &str) -> model::ScenarioResult {
        model::ScenarioResult {
            reason: Some(reason.to_owned()),
            ..crate::report::model::tests::result(Some(level), model::Status::Skipped)
        }
    }

    fn ran(level: model::Level, status: model::Status) -> model::ScenarioResult {
        crate::report::model::tests::result(Some(level), status)
    }

    fn summary_of(results: Vec<model::ScenarioResult>) -> Vec<String> {
        summary_lines(&crate::report::model::tests::report(results))
    }

    fn line<'a>(lines: &'a [String], start: &str) -> &'a str {
        lines
            .iter()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no line {start:?} in {lines:#?}"))
    }

    #[test]
    fn a_filtered_run_claims_nothing_and_counts_its_filtered_scenarios_apart() {
        use model::{Level, Status};
        let not_selected = format!("{NOT_SELECTED} --tags");
        let lines = summary_of(vec![
            ran(Level::Core, Status::Passed),
            skipped(Level::Core, &not_selected),
            skipped(Level::Core, &not_selected),
            skipped(Level::Extended, &not_selected),
        ]);
        assert_eq!(
            line(&lines, "Core:"),
            "Core:     1 passed, 0 failed, 0 skipped, 0 flaky; 2 not run"
        );
        assert_eq!(
            line(&lines, "Core conformance:"),
            "Core conformance: not claimed (a partial run: 2 scenarios not run)"
        );
        assert_eq!(
            line(&lines, "Extended conformance:"),
            "Extended conformance: not claimed (a partial run: 3 scenarios not run)"
        );
        assert!(
            !lines.iter().any(|l| l.starts_with("  skipped ")),
            "a filtered scenario is not listed as a skip: {lines:#?}"
        );
    }

    #[test]
    fn scenarios_fail_fast_never_started_keep_the_run_from_claiming() {
        use model::{Level, Status};
        // An Extended failure stopped the run before the remaining Core scenario started.
        let lines = summary_of(vec![
            ran(Level::Core, Status::Passed),
            ran(Level::Extended, Status::Failed),
            skipped(Level::Core, NOT_STARTED),
        ]);
        assert_eq!(
            line(&lines, "Core conformance:"),
            "Core conformance: not claimed (a partial run: 1 scenarios not run)"
        );
        assert_eq!(
            line(&lines, "Extended conformance:"),
            "Extended conformance: no"
        );
        assert!(line(&lines, "  not run:").contains("1 not started before the run stopped"));
    }

    #[test]
    fn a_failure_or_a_real_skip_denies_the_claim_and_a_full_pass_makes_it() {
        use model::{Level, Status};
        let failed = summary_of(vec![
            ran(Level::Core, Status::Failed),
            skipped(Level::Core, &format!("{NOT_SELECTED} --name")),
        ]);
        assert_eq!(line(&failed, "Core conformance:"), "Core conformance: no");
        let gap = summary_of(vec![
            ran(Level::Core, Status::Passed),
            skipped(Level::Core, "needs the fake coderd"),
        ]);
        assert_eq!(
            line(&gap, "Core conformance:"),
            "Core conformance: no (1 scenarios skipped, each with its reason above; none failed)"
        );
        assert!(line(&gap, "  skipped ").ends_with(": needs the fake coderd"));
        let full = summary_of(vec![
            ran(Level::Core, Status::Passed),
            ran(Level::Extended, Status::Passed),
        ]);
        assert_eq!(line(&full, "Core conformance:"), "Core conformance: yes");
        assert_eq!(
            line(&full, "Extended conformance:"),
            "Extended conformance: yes"
        );
    }

    #[test]
    fn the_rules_verdicts_are_counted_and_failed_rules_named() {
        use model::{Level, Status};
        let failed = summary_of(vec![ran(Level::Core, Status::Failed)]);
        assert_eq!(
            line(&failed, "Rules:"),
            "Rules:    0 passed, 1 failed, 0 not reached, 0 not run; 0 not observable"
        );
        assert_eq!(line(&failed, "  failed "), "  failed R-KEY-4: a.feature:3");
        let passed = summary_of(vec![ran(Level::Core, Status::Passed)]);
        assert_eq!(
            line(&passed, "Rules:"),
            "Rules:    1 passed, 0 failed, 0 not reached, 0 not run; 0 not observable"
        );
        let mut old = crate::report::model::tests::report(vec![ran(Level::Core, Status::Passed)]);
        old.coverage[0].verdict = None;
        assert!(!summary_lines(&old).iter().any(|l| l.starts_with("Rules:")));
    }
}
