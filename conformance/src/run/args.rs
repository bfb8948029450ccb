//! The options of `conformance run`.
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::shared_args::{StartedOperatorArgs, parse_duration};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ClusterTier {
    /// Start etcd + kube-apiserver (+ controller manager) on loopback; readiness is simulated.
    Local,
    /// Use an existing cluster from --kubeconfig / --context.
    Kubeconfig,
    /// Create a kind cluster, build and load the images, install the operator and an in-cluster
    /// fake coderd (needs Docker and kind; run by .ci/run through scripts/kind-e2e.sh).
    Kind,
    /// Start k3s in a container through testcontainers, then as kind (needs Docker; not
    /// exercised by this repository's CI).
    K3s,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OperatorMode {
    /// The reference operator of this repository, started under --operator-rbac.
    Reference,
    /// Already running in the cluster: nothing is started, restart scenarios are skipped.
    Installed,
}

/// What the operator under test may do to CoderControlPlanes (the suite's fixture).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ControlPlaneAccess {
    /// Its RBAC as shipped.
    ReadWrite,
    /// Its RBAC without write verbs on codercontrolplanes, their status and finalizers (for an
    /// operator that also reconciles CoderControlPlanes); recorded in the report.
    ReadOnly,
}

impl ControlPlaneAccess {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ReadWrite => "read-write",
            Self::ReadOnly => "read-only",
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Where the Kubernetes API comes from.
    #[arg(long, value_enum, default_value_t = ClusterTier::Local)]
    pub cluster: ClusterTier,
    /// Kubeconfig for --cluster kubeconfig (default: $KUBECONFIG or ~/.kube/config).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Context in the kubeconfig.
    #[arg(long)]
    pub context: Option<String>,
    /// Keep the kind cluster or k3s container after the run (a later run reuses a kept kind cluster).
    #[arg(long)]
    pub keep_cluster: bool,
    /// kind node image: an image reference, or `offline` to build (or reuse) the node image made
    /// here without a registry (scripts/kind-node-image.sh). Default: the image
    /// config/kind/kind-config.yaml pins (kind's stock image).
    #[arg(long, env = "KIND_NODE_IMAGE")]
    pub node_image: Option<String>,
    /// How the kind and k3s tiers build their images: `prebuilt` (host binaries copied by
    /// */Dockerfile.prebuilt, no registry) or `dockerfile` (multi-stage */Dockerfile, needs internet).
    #[arg(long, value_enum, env = "CONFORMANCE_IMAGE_BUILD", default_value_t = crate::cluster::images::ImageBuild::Prebuilt)]
    pub image_build: crate::cluster::images::ImageBuild,
    /// Cucumber tag expression selecting scenarios, e.g. "@core and not @serial".
    #[arg(long, short = 't', env = "CUCUMBER_FILTER_TAGS")]
    pub tags: Option<String>,
    /// Regex on scenario names.
    #[arg(long, short = 'n')]
    pub name: Option<String>,
    /// Stop at the first failing scenario.
    #[arg(long, env = "CONFORMANCE_FAIL_FAST")]
    pub fail_fast: bool,
    /// Scenarios run at the same time, at most (`@serial` ones run alone in their environment,
    /// beside the others on the local and kind tiers). A scenario starts only while the CPUs have room
    /// (below 97 % busy over 5 s, or fewer than 4 running), unless `--pin-concurrency`. Default limit
    /// on the local tier (no kubelets; a scenario mostly waits out its observation window): 32
    /// for the reference operator, which runs 32 reconcile workers (on 2 cores its whole run
    /// took 183 s at 16, 140 s at 32, 135 s at 48), and 16 for any other operator, which may
    /// run one worker as controller-runtime does by default (one worker keeps up with 16
    /// scenarios at a time, not with 32: 14 scenarios then timed out before their first
    /// reconcile). 16 on kind, whose cluster shares the machine's CPUs with the suite (on 2
    /// cores the suite took 805 s at 8 with its `@serial` scenarios alone, 375 s at 16 with two
    /// private environments). 4 on other clusters, which also run the operator, the fake coderd
    /// and provisioner pods. 1 with --control-plane, whose namespace every scenario shares (more
    /// is refused).
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Start scenarios up to `--concurrency` however busy the CPUs are.
    #[arg(long)]
    pub pin_concurrency: bool,
    /// Private environments of the `@serial` scenarios, where they run one at a time beside the
    /// others: on the local tier a control plane, fake coderds and an operator each; on kind a
    /// kind cluster each, with the chart's operator and the fake coderd. 0: they run alone in the
    /// shared environment, after the others. Once no `@serial` scenario is left to start, each
    /// takes a share of the others with its own operator, so that one reconcile worker does not
    /// pace the whole run: `--concurrency` / (N + 1) at a time, or without the flag the reference's
    /// default / (N + 1) (6 on the local tier) and never more than the shared environment's limit
    /// (a one-worker operator's run took 147 s instead of 173 s with 6 instead of 3). Default 5 on the local tier
    /// (their 13 scenarios hold about 300 s of work: with 3 the last lane ended the run), 1 on
    /// kind (its 7 hold about 270 s there; on 2 cores the suite took 376 s with one, 394–404 s
    /// with two and 570 s with three: a kind cluster's own work slows every scenario).
    #[arg(long)]
    pub private_environments: Option<usize>,
    /// Retries for a failing scenario; one that passes on a retry is reported Flaky.
    #[arg(long, default_value_t = 0)]
    pub retry: usize,
    /// Folder for junit.xml, cucumber.json, the conformance report and diagnostics.
    #[arg(long, default_value = "reports")]
    pub report_dir: PathBuf,
    /// Keep the namespace of a failed scenario for inspection.
    #[arg(long)]
    pub keep_on_failure: bool,
    /// List the scenarios with their tags, without running anything.
    #[arg(long)]
    pub list: bool,
    /// Folder with the feature files (default: the ones built into this binary).
    #[arg(long)]
    pub features: Option<PathBuf>,
    /// The implementation under test.
    #[arg(long, value_enum, default_value_t = OperatorMode::Reference, conflicts_with = "operator_cmd")]
    pub operator: OperatorMode,
    /// With --operator installed: its Deployment, as NAMESPACE/NAME. The suite then restarts it
    /// (scaling to 0 and back to its replicas), reads its pods' logs (diagnostics, the secret-leak
    /// check) and checks its ServiceAccount's permissions; without it those scenarios are skipped.
    #[arg(long, value_name = "NAMESPACE/NAME")]
    pub operator_deployment: Option<String>,
    #[command(flatten)]
    pub started: StartedOperatorArgs,
    /// Anything else the operator needs (e.g. a CRD of its own): applied before the operator
    /// starts, waiting for CRDs to be Established and Deployments to be available.
    #[arg(long)]
    pub extra_manifests: Option<PathBuf>,
    /// What the started operator's RBAC allows on CoderControlPlanes, the suite's fixture.
    #[arg(long, value_enum, default_value_t = ControlPlaneAccess::ReadWrite)]
    pub control_plane_access: ControlPlaneAccess,
    /// Use a real coderd at this URL (with --control-plane); fake-coderd scenarios are skipped.
    #[arg(long, requires = "control_plane")]
    pub coderd: Option<String>,
    /// Existing control plane as NAMESPACE/NAME (with --coderd).
    #[arg(long, requires = "coderd")]
    pub control_plane: Option<String>,
    /// The coderd release the fake coderd models (its rate limiting differs between them); the
    /// local tier's in-process fake only.
    #[arg(long, value_enum, conflicts_with = "coderd")]
    pub coderd_version: Option<fake_coderd::CoderdVersion>,
    /// Name of the implementation, for the report.
    #[arg(long, default_value = "coder-provisioner-operator (reference)")]
    pub impl_name: String,
    #[arg(long, default_value = env!("CARGO_PKG_VERSION"))]
    pub impl_version: String,
    #[arg(long, default_value = "")]
    pub impl_url: String,
    #[arg(long, default_value = "")]
    pub impl_contact: String,
    /// Multiplies every wait deadline and observation window.
    #[arg(long)]
    pub timeout_scale: Option<f64>,
    /// Deadline of "eventually" assertions, e.g. 90s or 3m (overrides the tier's default).
    #[arg(long, value_parser = parse_duration)]
    pub wait_timeout: Option<Duration>,
    /// Explore: run the generated cases (`@generated`, unless --tags says otherwise) with N seeds
    /// instead of the fixed ones, starting at --explore-from. Its report is not a conformance
    /// report (its features differ from the suite's); a failing seed reruns alone with
    /// `--explore 1 --explore-from <seed>`.
    #[arg(long, value_name = "N")]
    pub explore: Option<u64>,
    /// The first seed of --explore (default: drawn from the clock, and printed).
    #[arg(long, value_name = "SEED", requires = "explore")]
    pub explore_from: Option<u64>,
    /// How long the whole run may spend looking for the smallest specs that still fail, shared by
    /// every failed generated case, each trying one-step simpler specs as new CRs in its
    /// namespace (0: no shrinking). The summary says how much was spent, and whether it ran out.
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    pub shrink_seconds: u64,
}

impl RunArgs {
    /// `--concurrency`, or the tier's default (see the flag).
    pub fn concurrency(&self) -> usize {
        let reference =
            self.operator == OperatorMode::Reference && self.started.operator_cmd.is_none();
        match self.cluster {
            ClusterTier::Local if !reference && self.concurrency.is_none() => 16,
            _ => self.machine_concurrency(),
        }
    }

    /// Scenarios each of `private_count` private environments takes once its `@serial` ones are
    /// done: its share of what the machine holds, never more than one operator is given in the
    /// shared environment.
    pub fn private_seats(&self, private_count: usize) -> usize {
        self.machine_concurrency()
            .div_ceil(private_count + 1)
            .min(self.concurrency())
    }

    /// `--concurrency`, or what the tier's machine holds whichever operator runs (the
    /// reference's default).
    fn machine_concurrency(&self) -> usize {
        let default = match self.cluster {
            // Every scenario runs in the existing control plane's namespace, where the scenarios'
            // CRs share names: one at a time.
            _ if self.control_plane.is_some() => 1,
            ClusterTier::Local => 32,
            ClusterTier::Kind => 16,
            ClusterTier::Kubeconfig | ClusterTier::K3s => 4,
        };
        self.concurrency.unwrap_or(default).max(1)
    }

    /// `--private-environments`, or the tier's default (see the flag).
    pub fn private_environments(&self) -> usize {
        self.private_environments
            .unwrap_or(if self.cluster == ClusterTier::Kind {
                1
            } else {
                5
            })
    }
}
