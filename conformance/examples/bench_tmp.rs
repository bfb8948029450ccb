use clap::Parser;
#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: conformance::bench::BenchArgs,
}
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    if std::env::args().nth(1).as_deref() == Some("run") {
        let code = conformance::cli::main_with(conformance::cli::Cli::parse()).await;
        println!("suite exit: {code:?}");
        return Ok(());
    }
    conformance::bench::run(Cli::parse().args).await
}
