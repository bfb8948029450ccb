//! `coder-stub`, installed as `coder` in test images: `coder provisioner start` that authenticates to
//! coderd with its provisioner key (coderd-api.md §2.9 step 1) and then idles until SIGTERM.

use std::process::ExitCode;

use anyhow::Context;
use fake_coderd::stub::{Invocation, fetch_key, parse_invocation};
use wiremock::matchers::any;
use wiremock::{Mock, MockServer, ResponseTemplate};

async fn wait_for_termination() -> anyhow::Result<&'static str> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        interrupted = tokio::signal::ctrl_c() => interrupted.context("waiting for Ctrl-C").map(|()| "SIGINT"),
        _ = terminate.recv() => Ok("SIGTERM"),
    }
}

/// Answers 200 "ok" on every path once connected (a readiness probe target).
async fn serve_readiness(invocation: &Invocation) -> anyhow::Result<Option<MockServer>> {
    let Some(addr) = invocation.readiness_addr else {
        return Ok(None);
    };
    let listener = std::net::TcpListener::bind(addr)
        .with_context(|| format!("binding readiness address {addr}"))?;
    let server = MockServer::builder()
        .listener(listener)
        .disable_request_recording()
        .start()
        .await;
    server
        .register(Mock::given(any()).respond_with(ResponseTemplate::new(200).set_body_string("ok")))
        .await;
    tracing::info!(%addr, "readiness endpoint serving");
    Ok(Some(server))
}

async fn run() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let invocation = parse_invocation(&args, &|name| std::env::var(name).ok())?;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(30))
        .build()
        .context("building the HTTP client")?;
    let key = fetch_key(&http, &invocation).await?;
    tracing::info!(url = %invocation.coder_url, key_id = %key.id, key_name = %key.name, tags = ?key.tags, "successfully connected to coderd");
    let _readiness = serve_readiness(&invocation).await?;
    let signal = wait_for_termination().await?;
    tracing::info!(signal, "shutting down");
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    fake_coderd::init_logging();
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("coder-stub: {error:#}");
            ExitCode::FAILURE
        }
    }
}
