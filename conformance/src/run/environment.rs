//! The shared environment a run stands on, prepared once before the scenarios and torn down
//! after them: the Kubernetes API (a local control plane, a kubeconfig's cluster, or a kind
//! cluster or k3s container made for the run), the CRDs and `--extra-manifests`, the coderd, the
//! readiness simulator, the fixture guard and the operator under test.
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, anyhow, bail};

use super::args::{ClusterTier, ControlPlaneAccess, OperatorMode, RunArgs};
use crate::cluster::StartedCluster;
use crate::cluster::k3s::{K3sCluster, K3sOptions};
use crate::cluster::kind::{KindCluster, KindOptions};
use crate::cluster::kubeconfig::{ClusterEndpoint, load_config};
use crate::cluster::local::{LocalControlPlane, LocalOptions};
use crate::implementation::{OperatorCommand, OperatorProcess, OperatorUnderTest};
use crate::paths::{KIND_LOGS_DIR, OPERATOR_LOG_FILE, repo_root};
use crate::report::model;
use crate::shrink_budget::ShrinkBudget;
use crate::wait::{ObservationWindow, TimeoutProfile, Timeouts};
use crate::world::{Coderd, Environment, ExistingControlPlane, Operator};

/// The fake coderd's default organization for a run: neither of the names coderd gives it.
const SUITE_DEFAULT_ORGANIZATION_NAME: &str = "renamed-default-org";

/// The other coderds beside the fake (issue 38's environment shapes): on the same host, on other
/// ports, each with a default organization of another name and id, the first modelling the older
/// release. The in-cluster fake's pod runs them as containers of its own (config/fake-coderd).
pub const OTHER_CODERDS: [(&str, fake_coderd::CoderdVersion); 2] = [
    ("coderd-b-default-org", fake_coderd::CoderdVersion::V2_30_0),
    ("coderd-c-default-org", fake_coderd::CoderdVersion::V2_31_0),
];

/// What `run` owns and stops at the end (the Worlds only see the [`Environment`]).
pub(super) struct Owned {
    control_plane: Option<LocalControlPlane>,
    /// A kind cluster or k3s container; dropping it closes its port-forwards and deletes it unless kept.
    pub(super) started_cluster: Option<StartedCluster>,
    fake: Option<fake_coderd::FakeCoderd>,
    other_fakes: Vec<fake_coderd::FakeCoderd>,
    simulator: Option<crate::kubelet::ReadinessSimulator>,
}

pub(super) struct Prepared {
    pub(super) environment: Arc<Environment>,
    pub(super) owned: Owned,
    pub(super) tier: String,
    pub(super) simulated: Vec<String>,
    pub(super) mode: String,
    /// The report's `setup` section.
    pub(super) setup: model::Setup,
    /// Watches the suite's control planes for changes by others (none with --control-plane).
    pub(super) guard: Option<crate::fixture_guard::FixtureGuard>,
}

/// The [`OTHER_CODERDS`] beside the fake: started here beside an in-process fake, reached
/// through the in-cluster fake's pod beside that one, none with a real coderd. Each default
/// organization is renamed as the fake's is.
async fn other_coderds(
    in_process: bool,
    in_cluster: Option<&crate::cluster::kind::InClusterFakeCoderd>,
    announce: bool,
) -> anyhow::Result<(Vec<Coderd>, Vec<fake_coderd::FakeCoderd>)> {
    let mut coderds = Vec::new();
    let mut fakes = Vec::new();
    if in_process {
        for (_, version) in OTHER_CODERDS {
            let config = fake_coderd::FakeConfig {
                coderd_version: version,
                ..Default::default()
            };
            let fake = fake_coderd::FakeCoderd::start_with(config)
                .await
                .context("starting another fake coderd")?;
            coderds.push(Coderd {
                url: fake.url(),
                runner_url: fake.url(),
                admin: Some(fake.admin()),
            });
            fakes.push(fake);
        }
    } else if let Some(in_cluster) = in_cluster {
        coderds.extend(in_cluster.others.iter().map(|other| Coderd {
            url: other.in_cluster_url.clone(),
            runner_url: other.local_url(),
            admin: Some(other.admin(&in_cluster.admin_token)),
        }));
    }
    for (coderd, (default_name, _)) in coderds.iter().zip(OTHER_CODERDS) {
        if let Some(admin) = &coderd.admin {
            admin
                .rename_organization("default", default_name)
                .await
                .context("renaming another fake coderd's default organization")?;
        }
    }
    if announce && !coderds.is_empty() {
        eprintln!(
            "conformance: other coderds on the same host: {}",
            coderds
                .iter()
                .zip(OTHER_CODERDS)
                .map(|(c, (name, version))| format!(
                    "{} ({version}, default organization {name:?})",
                    c.url
                ))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok((coderds, fakes))
}

/// Which of a run's environments [`prepare`] makes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Role {
    /// The one every scenario starts in.
    Shared,
    /// The local tier's second one, where the `@serial` scenarios run one at a time beside the
    /// others: a control plane, fake coderds and operator of its own, the operator in a sandbox
    /// (its fixed ports, if any, would collide with the shared one's). Says nothing on the
    /// terminal: the shared one's lines describe it too. Numbered from 1.
    Private(usize),
}

impl Role {
    fn private_number(self) -> Option<usize> {
        match self {
            Role::Shared => None,
            Role::Private(number) => Some(number),
        }
    }
}

/// Outside a pod: `None`. In a pod: a kubeconfig for its ServiceAccount, written (once per run)
/// to a private file in the temporary folder; it names the mounted token's path, not the token.
fn in_cluster_kubeconfig_file() -> anyhow::Result<Option<PathBuf>> {
    let Some(yaml) = crate::cluster::kubeconfig::in_cluster_kubeconfig(
        std::env::var("KUBERNETES_SERVICE_HOST").ok().as_deref(),
        std::env::var("KUBERNETES_SERVICE_PORT").ok().as_deref(),
        Path::new(crate::cluster::kubeconfig::SERVICE_ACCOUNT_DIR),
    ) else {
        return Ok(None);
    };
    let path = std::env::temp_dir().join(format!(
        "conformance-in-cluster-{}.kubeconfig",
        std::process::id()
    ));
    crate::cluster::kubeconfig::write_private(&path, &yaml)?;
    eprintln!(
        "conformance: no kubeconfig; running in a pod, as its ServiceAccount ({})",
        path.display()
    );
    Ok(Some(path))
}

pub(super) async fn prepare(
    args: &RunArgs,
    inputs: &crate::assets::Inputs,
    report_dir: &Path,
    role: Role,
    shrink_budget: &Arc<ShrinkBudget>,
) -> anyhow::Result<Prepared> {
    if args.control_plane.is_some() && args.concurrency() > 1 {
        bail!(
            "--concurrency {}: with --control-plane every scenario runs in that control plane's namespace, \
             where their CoderProvisioners share names, so they run one at a time (--concurrency 1)",
            args.concurrency()
        );
    }
    let private = role != Role::Shared;
    if private && !matches!(args.cluster, ClusterTier::Local | ClusterTier::Kind) {
        bail!("a private environment is made on the local and kind tiers only");
    }
    // The private environment's lines would repeat the shared one's.
    macro_rules! announce {
        ($($arg:tt)*) => {
            if !private {
                eprintln!($($arg)*);
            }
        };
    }
    let mut started_cluster = None;
    let (client, kubeconfig, endpoint, kubectl, control_plane, profile, tier) = match args.cluster {
        ClusterTier::Kind | ClusterTier::K3s => {
            // These tiers build the images from the source tree this binary was compiled in.
            let repo = repo_root().canonicalize().context(
                "locating the repository root (the kind and k3s tiers build images from it)",
            )?;
            let started = provision_cluster(args, &repo, report_dir, role).await?;
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
            announce!(
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
                announce!(
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
                .filter(|path| args.kubeconfig.is_some() || path.exists());
            let path = match path {
                Some(path) => path,
                // In a pod (`helm test`), with no kubeconfig: the pod's ServiceAccount.
                None => in_cluster_kubeconfig_file()?.ok_or_else(|| {
                    anyhow!("--cluster kubeconfig needs --kubeconfig (or $KUBECONFIG), or to run in a pod")
                })?,
            };
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
    let observation_window = match profile {
        TimeoutProfile::Local => ObservationWindow::constant(timeouts.hold_window),
        TimeoutProfile::RealCluster => ObservationWindow::measured(
            Timeouts::for_profile(TimeoutProfile::Local)
                .adjusted(args.timeout_scale, None)?
                .hold_window,
            timeouts.hold_window,
        ),
    };

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
            if let Some(version) = args.coderd_version {
                bail!(
                    "--coderd-version {version}: only the local tier's in-process fake coderd \
                     takes another release; the in-cluster fake models the default"
                );
            }
            let coderd = Coderd {
                url: in_cluster.in_cluster_url.clone(),
                runner_url: in_cluster.local_url(),
                admin: Some(in_cluster.admin()),
            };
            (coderd, None, None)
        }
        _ => {
            let config = fake_coderd::FakeConfig {
                coderd_version: args.coderd_version.unwrap_or_default(),
                ..Default::default()
            };
            let fake = fake_coderd::FakeCoderd::start_with(config)
                .await
                .context("starting the fake coderd")?;
            announce!(
                "conformance: fake coderd {} at {}",
                fake.coderd_version(),
                fake.url()
            );
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
    if let Some(admin) = &coderd.admin {
        // No client may count on the default organization's name (coderd-api.md: `coder` since
        // v2.16, `first-organization` before, and an owner may rename it): an operator must
        // resolve `default`, so the fake's is renamed for the run.
        admin
            .rename_organization("default", SUITE_DEFAULT_ORGANIZATION_NAME)
            .await
            .context("renaming the fake coderd's default organization")?;
        announce!(
            "conformance: the fake coderd's default organization is named {SUITE_DEFAULT_ORGANIZATION_NAME:?} for this run (an operator must ask for \"default\")"
        );
    }
    let (other_coderds, other_fakes) =
        other_coderds(fake.is_some(), in_cluster_fake, !private).await?;

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
            announce!(
                "conformance: no readiness simulation on this cluster ({error:#}); provisioner pods must become ready by themselves"
            );
            None
        }
    };

    let extra_manifests = match &args.extra_manifests {
        Some(dir) => {
            let applied =
                crate::setup::apply_extra_manifests(&client, dir, timeouts.eventually).await?;
            announce!(
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
        // kind and k3s run the reference operator in the cluster, installed with its Helm chart;
        // the suite restarts it by scaling its Deployment.
        _ if started_cluster.is_some() => (
            Operator::InCluster(
                crate::cluster::in_cluster::InClusterOperator::from_live(
                    &client,
                    &format!(
                        "{}/{}",
                        crate::cluster::kind::OPERATOR_NAMESPACE,
                        crate::cluster::kind::HELM_RELEASE
                    ),
                )
                .await?,
            ),
            "in-cluster (Helm chart config/helm/coder-provisioner-operator)",
        ),
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
            if let Some(number) = role.private_number() {
                let coderd_urls = std::iter::once(&coderd)
                    .chain(&other_coderds)
                    .map(|c| c.url.clone())
                    .collect();
                spec.sandboxed = Some((format!("private-operator-{number}"), coderd_urls));
            }
            let mut rbac_source = inputs.rbac_source.to_string();
            if read_only {
                let scratch = match role.private_number() {
                    Some(number) => report_dir.join(format!("private-environment-{number}")),
                    None => report_dir.to_path_buf(),
                };
                spec.rbac_dir = crate::fixture_guard::write_read_only_rbac(&inputs.rbac, &scratch)?;
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
            announce!("conformance: starting the operator: {shown} (RBAC {rbac_source})");
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
        private: role.private_number(),
        lane: Default::default(),
        client,
        kubeconfig,
        kubectl,
        coderd,
        other_coderds,
        operator,
        replica_command,
        existing_control_plane,
        daemon_image,
        timeouts,
        observation_window,
        repo_root: inputs.bundle.root().to_path_buf(),
        report_dir: report_dir.to_path_buf(),
        keep_on_failure: args.keep_on_failure,
        audit_log: control_plane
            .as_ref()
            .map(LocalControlPlane::audit_log_path),
        shrink_budget: shrink_budget.clone(),
        readiness_simulated: simulator.is_some(),
    });
    Ok(Prepared {
        environment,
        owned: Owned {
            control_plane,
            started_cluster,
            fake,
            other_fakes,
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
/// A private environment on kind is a kind cluster of its own, with the images the shared one
/// built, deleted at the end of the run even with `--keep-cluster`.
async fn provision_cluster(
    args: &RunArgs,
    repo: &Path,
    report_dir: &Path,
    role: Role,
) -> anyhow::Result<StartedCluster> {
    Ok(match args.cluster {
        ClusterTier::Kind => {
            let defaults = KindOptions::new(repo);
            let options = match role.private_number() {
                None => KindOptions {
                    keep: args.keep_cluster,
                    logs_dir: Some(report_dir.join(KIND_LOGS_DIR)),
                    ..defaults
                },
                Some(number) => KindOptions {
                    name: format!("{}-private-{number}", defaults.name),
                    build_images: false,
                    logs_dir: Some(report_dir.join(format!("{KIND_LOGS_DIR}-private-{number}"))),
                    ..defaults
                },
            };
            let options = KindOptions {
                node_image: args.node_image.clone(),
                image_build: Some(args.image_build),
                ..options
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

pub(super) async fn teardown(environment: &Environment, owned: Owned) {
    if let Operator::Started(process) = &environment.operator
        && let Some(mut process) = process.lock().await.take()
    {
        process.stop().await;
        // The whole log (every start) is evidence: keep it with the reports.
        // The private environments' operators log apart (the shared one's is the one users read).
        let kept = environment.report_dir.join(match environment.private {
            Some(number) => format!("operator-private-{number}.log"),
            None => OPERATOR_LOG_FILE.to_owned(),
        });
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
    drop(owned.other_fakes);
    if let Some(control_plane) = owned.control_plane {
        control_plane.stop().await;
    }
    drop(owned.started_cluster);
}
