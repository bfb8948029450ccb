//! `coder-provisioner-operator`: `run` starts the operator, `crd` prints the CRDs.
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use anyhow::Context as _;
use clap::{ArgAction, Parser, Subcommand};
use kube::config::{KubeConfigOptions, Kubeconfig};
use operator::fence::Fence;
use operator::metrics::Metrics;
use operator::runtime::controller::{self, ControllerSettings, Readiness};
use operator::runtime::http::{self, ReadinessProbe};
use operator::runtime::leader::{self, LeaderElectionSettings, LeadershipFlag};
use operator::runtime::logging::{self, LogFormat};
use tokio_util::sync::CancellationToken;

/// The version and how this binary was built: a benchmark labels its figures with it.
const VERSION: &str = if cfg!(debug_assertions) {
    concat!(env!("CARGO_PKG_VERSION"), " (debug build)")
} else {
    concat!(env!("CARGO_PKG_VERSION"), " (release build)")
};

#[derive(Parser, Debug)]
#[command(
    name = "coder-provisioner-operator",
    version = VERSION,
    about = "Kubernetes operator for Coder external provisioners (CoderProvisioner, coder.com/v1alpha1)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the operator.
    Run(Box<RunArgs>),
    /// Print the CustomResourceDefinitions as multi-document YAML.
    Crd,
}

#[derive(clap::Args, Debug)]
// A flag given twice takes its last value, so wrappers can append overrides to a base command line.
#[command(args_override_self = true)]
struct RunArgs {
    /// Kubeconfig file. Without it: $KUBECONFIG, then ~/.kube/config, then the in-cluster config.
    #[arg(long, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
    /// Namespace to watch, or `all` for every namespace.
    #[arg(
        long,
        env = "WATCH_NAMESPACE",
        default_value = "all",
        value_name = "NS|all"
    )]
    namespace: String,
    /// Address of the /healthz, /readyz and /metrics endpoints.
    #[arg(long, env = "METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    /// Log lines on stderr: human-readable text or one JSON object per line.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Run the controller only while holding a Lease (for more than one replica).
    #[arg(long, env = "LEADER_ELECTION", action = ArgAction::Set, default_value_t = false,
          num_args = 0..=1, default_missing_value = "true", value_name = "true|false")]
    leader_election: bool,
    /// Namespace of the Lease; default: $POD_NAMESPACE, else the kubeconfig's namespace.
    #[arg(long, env = "POD_NAMESPACE")]
    leader_election_namespace: Option<String>,
    #[arg(long, default_value = "coder-provisioner-operator")]
    leader_election_lease_name: String,
    /// Identity in the Lease; default: $POD_NAME (or the host name) plus a random suffix.
    #[arg(long)]
    leader_election_identity: Option<String>,
    /// Seconds a Lease is valid after its last renewal; a standby takes over after this.
    #[arg(long, default_value_t = 15)]
    leader_election_lease_duration: u64,
    /// Seconds before expiry at which the leader renews the Lease.
    #[arg(long, default_value_t = 5)]
    leader_election_renew_grace: u64,
    /// Timeout of each coderd request, in seconds.
    #[arg(long, default_value_t = 30)]
    coderd_timeout: u64,
    /// Reconciles run at the same time. Each holds API server and coderd connections, and
    /// passes that overlap less see fewer stale copies, so a bound keeps memory and writes flat
    /// when many CRs change at once.
    #[arg(long, default_value_t = ControllerSettings::default().max_concurrent_reconciles,
          value_parser = clap::value_parser!(u16).range(1..))]
    max_concurrent_reconciles: u16,
    /// Field manager name for server-side apply.
    #[arg(long, default_value = "coder-provisioner-operator")]
    field_manager: String,
}

fn main() -> ExitCode {
    // Before anything touches TLS: kube and reqwest share rustls with the ring provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    match cli.command {
        Command::Crd => {
            print!("{}", operator::api::crds_yaml());
            ExitCode::SUCCESS
        }
        Command::Run(args) => {
            if let Err(e) = logging::init(args.log_format) {
                eprintln!("error: {e:#}");
                return ExitCode::FAILURE;
            }
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(e) => {
                    tracing::error!(error = %e, "cannot start the async runtime");
                    return ExitCode::FAILURE;
                }
            };
            match runtime.block_on(run(*args)) {
                Ok(()) => {
                    tracing::info!("stopped");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    tracing::error!(error = format!("{e:#}"), "operator failed");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(shutdown.clone()));

    let client = kube_client(args.kubeconfig.as_deref()).await?;
    let metrics = Arc::new(Metrics::new());
    let settings = ControllerSettings {
        namespace: (args.namespace != "all").then(|| args.namespace.clone()),
        coderd_timeout: Duration::from_secs(args.coderd_timeout),
        max_concurrent_reconciles: args.max_concurrent_reconciles,
        field_manager: args.field_manager.clone(),
    };
    // The readiness of the current controller run; every leadership term starts a fresh one.
    let readiness = Arc::new(Mutex::new(Readiness::default()));
    let leadership = LeadershipFlag::default();

    let listener = tokio::net::TcpListener::bind(args.metrics_addr)
        .await
        .with_context(|| format!("binding the metrics address {}", args.metrics_addr))?;
    // Log the bound address: with port 0 (tests) it is the only way to learn the real port.
    let bound = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| args.metrics_addr.to_string());
    tracing::info!(metrics_addr = %bound, namespace = %args.namespace, leader_election = args.leader_election,
        "starting");
    let probe = readiness_probe(args.leader_election, readiness.clone(), leadership.clone());
    let server = tokio::spawn(http::serve(
        listener,
        metrics.clone(),
        probe,
        shutdown.clone(),
    ));

    let outcome = if args.leader_election {
        let election = LeaderElectionSettings {
            namespace: args
                .leader_election_namespace
                .clone()
                .unwrap_or_else(|| client.default_namespace().to_owned()),
            lease_name: args.leader_election_lease_name.clone(),
            identity: args
                .leader_election_identity
                .clone()
                .unwrap_or_else(default_identity),
            lease_duration_secs: args.leader_election_lease_duration,
            renew_grace_secs: args.leader_election_renew_grace,
        };
        leader::run_with_leader_election(
            client.clone(),
            election,
            leadership,
            shutdown.clone(),
            |term, fence| {
                let term_readiness = Readiness::default();
                *lock(&readiness) = term_readiness.clone();
                controller::run(
                    client.clone(),
                    settings.clone(),
                    metrics.clone(),
                    term_readiness,
                    term.cancelled_owned(),
                    fence,
                )
            },
        )
        .await
    } else {
        let only_run = lock(&readiness).clone();
        controller::run(
            client,
            settings,
            metrics,
            only_run,
            shutdown.clone().cancelled_owned(),
            Fence::default(),
        )
        .await
    };

    // Whatever ended the controller ends the process; stop serving probes too.
    shutdown.cancel();
    match server.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "the metrics server failed"),
        Err(e) => tracing::warn!(error = %e, "the metrics server task panicked"),
    }
    outcome
}

/// Standby replicas are ready (they are healthy and waiting); the leader, or the only replica
/// without leader election, is ready once the controller's watches are initialised.
fn readiness_probe(
    leader_election: bool,
    readiness: Arc<Mutex<Readiness>>,
    leadership: LeadershipFlag,
) -> ReadinessProbe {
    Arc::new(move || {
        if leader_election && !leadership.is_leader() {
            Ok("standby, waiting for the lease".to_owned())
        } else if lock(&readiness).is_ready() {
            Ok("controller running".to_owned())
        } else {
            Err("controller watches are starting".to_owned())
        }
    })
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Only ever holds a flag handle; a panic elsewhere cannot leave it inconsistent.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

async fn kube_client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path).context("reading the kubeconfig")?;
            kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("loading kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer().await.context(
            "finding a Kubernetes configuration (KUBECONFIG, ~/.kube/config, in-cluster)",
        )?,
    };
    kube::Client::try_from(config).context("building the Kubernetes client")
}

fn default_identity() -> String {
    let base = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "coder-provisioner-operator".to_owned());
    format!("{base}-{:08x}", rand::random::<u32>())
}

/// Cancels `shutdown` on SIGTERM or Ctrl-C (SIGINT).
async fn cancel_on_signal(shutdown: CancellationToken) {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut sigterm) => {
                sigterm.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops the operator");
                std::future::pending::<()>().await;
            }
        }
    };
    let interrupt = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %e, "cannot listen for Ctrl-C; only SIGTERM stops the operator");
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        _ = terminate => tracing::info!("SIGTERM received; shutting down"),
        _ = interrupt => tracing::info!("interrupt received; shutting down"),
    }
    shutdown.cancel();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_args(argv: &[&str]) -> RunArgs {
        let cli = Cli::try_parse_from(
            std::iter::once("coder-provisioner-operator").chain(argv.iter().copied()),
        )
        .expect("valid command line");
        match cli.command {
            Command::Run(args) => *args,
            Command::Crd => panic!("expected run"),
        }
    }

    #[test]
    fn leader_election_accepts_a_bare_flag_an_explicit_value_and_a_later_override() {
        assert!(!run_args(&["run"]).leader_election);
        assert!(run_args(&["run", "--leader-election"]).leader_election);
        assert!(run_args(&["run", "--leader-election=true"]).leader_election);
        assert!(
            !run_args(&["run", "--leader-election=true", "--leader-election=false"])
                .leader_election
        );
        assert!(Cli::try_parse_from(["x", "run", "--leader-election=maybe"]).is_err());
    }

    #[test]
    fn log_format_and_metrics_address_are_validated() {
        let args = run_args(&[
            "run",
            "--log-format",
            "json",
            "--metrics-addr",
            "127.0.0.1:0",
            "--namespace",
            "coder",
        ]);
        assert_eq!(args.log_format, LogFormat::Json);
        assert_eq!(args.metrics_addr.port(), 0);
        assert_eq!(args.namespace, "coder");
        assert!(Cli::try_parse_from(["x", "run", "--log-format", "xml"]).is_err());
        assert!(Cli::try_parse_from(["x", "run", "--metrics-addr", "localhost"]).is_err());
    }

    #[test]
    fn readiness_depends_on_role_and_controller() {
        let controller = Arc::new(Mutex::new(Readiness::default()));
        let leadership = LeadershipFlag::default();
        let single = readiness_probe(false, controller.clone(), leadership.clone());
        let elected = readiness_probe(true, controller, leadership);
        assert!(single().is_err(), "watches not initialised yet");
        assert!(elected().is_ok(), "a standby replica is ready");
    }
}
