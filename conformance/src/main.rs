//! `conformance`: run the CoderProvisioner conformance suite, or verify a conformance report.
use std::process::ExitCode;

use clap::Parser as _;

#[tokio::main]
async fn main() -> ExitCode {
    // One TLS provider per process (kube and reqwest both use rustls with ring).
    let _ = rustls::crypto::ring::default_provider().install_default();
    conformance::cli::main_with(conformance::cli::Cli::parse()).await
}
