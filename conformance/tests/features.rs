//! The Gherkin suite under `cargo test`, with the defaults of `conformance run` (local tier,
//! reference operator). cucumber drives its own main, so libtest arguments are not accepted;
//! select scenarios with `CUCUMBER_FILTER_TAGS`. A failing scenario fails `cargo test`.
use std::process::ExitCode;

use clap::Parser as _;
use conformance::cli::{Cli, main_with};

#[tokio::main]
async fn main() -> ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let report_dir = concat!(env!("CARGO_TARGET_TMPDIR"), "/conformance-reports");
    match Cli::try_parse_from(["conformance", "run", "--report-dir", report_dir]) {
        Ok(cli) => main_with(cli).await,
        Err(error) => {
            eprintln!("{error}");
            ExitCode::from(2)
        }
    }
}
