//! `conformance local-cluster`: a local control plane (etcd + kube-apiserver + controller
//! manager) for other tools, kept running until Ctrl-C or SIGTERM.
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;

use crate::cluster::local::{LocalControlPlane, LocalOptions};

#[derive(Args, Debug, Clone)]
pub struct LocalClusterArgs {
    /// Where to write the admin kubeconfig (written last, so its presence means "ready").
    #[arg(long)]
    pub kubeconfig_out: PathBuf,
    /// Also install the suite's CRDs (config/crd, built into this binary).
    #[arg(long)]
    pub install_crds: bool,
}

/// `conformance local-cluster`: the kubeconfig tier's counterpart in CI, and a quick cluster
/// for trying an operator by hand.
pub async fn run(args: &LocalClusterArgs) -> anyhow::Result<ExitCode> {
    let local = LocalControlPlane::start(LocalOptions::default())
        .await
        .context("starting the local control plane")?;
    if args.install_crds {
        let client = local.admin_client().await?;
        let bundle = crate::assets::materialize()?;
        let crds = crate::manifests::install_crds(&client, &bundle.crd()).await?;
        crate::manifests::wait_crds_established(&client, &crds, Duration::from_secs(60)).await?;
    }
    let partial = args.kubeconfig_out.with_extension("partial");
    std::fs::copy(local.kubeconfig_path(), &partial)
        .and_then(|_| std::fs::rename(&partial, &args.kubeconfig_out))
        .with_context(|| format!("writing {}", args.kubeconfig_out.display()))?;
    eprintln!(
        "conformance: local control plane at {} (started in {:.1?}); kubeconfig {}; Ctrl-C or SIGTERM stops it",
        local.server_url(),
        local.startup_duration(),
        args.kubeconfig_out.display()
    );
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    local.stop().await;
    let _ = std::fs::remove_file(&args.kubeconfig_out);
    Ok(ExitCode::SUCCESS)
}
