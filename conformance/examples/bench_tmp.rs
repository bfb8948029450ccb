use clap::Parser;
#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: conformance::bench::BenchArgs,
}
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    conformance::bench::run(Cli::parse().args).await
}
