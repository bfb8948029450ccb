//! `fake-coderd`: the fake coderd as a standalone process, driven through its admin HTTP API.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use fake_coderd::state::random_alphanumeric;
use fake_coderd::{CoderdVersion, FakeCoderd, FakeConfig, Seed};

/// A stateful, scriptable fake of the coderd HTTP API (see fake-coderd/README.md).
#[derive(Parser, Debug)]
#[command(name = "fake-coderd", version)]
struct Cli {
    /// Address of the coderd API listener.
    #[arg(long, env = "FAKE_CODERD_LISTEN", default_value = "127.0.0.1:3000")]
    listen: SocketAddr,
    /// Address of the admin API listener [default: the coderd port + 1, or any free port if that is 0].
    #[arg(long, env = "FAKE_CODERD_ADMIN_LISTEN")]
    admin_listen: Option<SocketAddr>,
    /// Seed file (JSON if it ends in .json, YAML otherwise): organizations, users, entitlement, license.
    #[arg(long, env = "FAKE_CODERD_SEED_FILE")]
    seed_file: Option<PathBuf>,
    /// Bearer token of the admin API [default: generated and printed].
    #[arg(long, env = "FAKE_CODERD_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// Session token (`<10>-<22>`) of the owner operator user [default: generated, readable via GET /__fake/info].
    #[arg(long, env = "FAKE_CODERD_OPERATOR_TOKEN", hide_env_values = true)]
    operator_token: Option<String>,
    /// Requests per minute per user (or anonymous caller) and endpoint, as coderd's flag; 0 or
    /// less disables rate limiting.
    #[arg(
        long,
        env = "FAKE_CODERD_API_RATE_LIMIT",
        default_value_t = 512,
        allow_negative_numbers = true
    )]
    api_rate_limit: i64,
    /// The coderd release modelled: the build version reported, and the rate limiter's keying
    /// (v2.30.0: by client IP, bypass header ignored; v2.31.0: by user, owner bypass, 428).
    #[arg(long, env = "FAKE_CODERD_VERSION", value_enum, default_value_t)]
    coderd_version: CoderdVersion,
}

fn default_admin_listen(listen: SocketAddr) -> SocketAddr {
    match listen.port() {
        0 | u16::MAX => SocketAddr::new(listen.ip(), 0),
        port => SocketAddr::new(listen.ip(), port + 1),
    }
}

async fn shutdown_signal() -> anyhow::Result<&'static str> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        interrupted = tokio::signal::ctrl_c() => interrupted.context("waiting for Ctrl-C").map(|()| "SIGINT"),
        _ = terminate.recv() => Ok("SIGTERM"),
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let seed = match &cli.seed_file {
        Some(path) => Seed::from_file(path)?,
        None => Seed::default(),
    };
    let generated_admin_token = cli.admin_token.is_none();
    let config = FakeConfig {
        listen: Some(cli.listen),
        admin_listen: Some(
            cli.admin_listen
                .unwrap_or_else(|| default_admin_listen(cli.listen)),
        ),
        admin_token: cli.admin_token.unwrap_or_else(|| random_alphanumeric(32)),
        operator_token: cli.operator_token,
        seed,
        api_rate_limit: cli.api_rate_limit,
        coderd_version: cli.coderd_version,
    };
    let fake = FakeCoderd::start_with(config).await?;
    println!("fake-coderd: coderd API on {}", fake.url());
    println!("fake-coderd: admin API on {}/__fake/", fake.admin_url());
    if generated_admin_token {
        println!("fake-coderd: generated admin token: {}", fake.admin_token());
    }
    let signal = shutdown_signal().await?;
    tracing::info!(signal, "shutting down");
    drop(fake);
    println!("fake-coderd: stopped ({signal})");
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    fake_coderd::init_logging();
    match run(Cli::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("fake-coderd: {error:#}");
            ExitCode::FAILURE
        }
    }
}
