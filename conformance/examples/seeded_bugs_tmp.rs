//! TEMPORARY harness until the lead wires `conformance seeded-bugs`; removed before hand-over.
use clap::Parser;
#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: conformance::seeded::SeededArgs,
}
#[tokio::main]
async fn main() -> std::process::ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    match conformance::seeded::run(Cli::parse().args).await {
        Ok(code) => code,
        Err(error) => {
            eprintln!("seeded-bugs: {error:#}");
            std::process::ExitCode::from(2)
        }
    }
}
