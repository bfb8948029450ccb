//! The Gherkin suite under `cargo test`, with the defaults of `conformance run` (local tier,
//! reference operator). cucumber drives its own main, so libtest arguments are not accepted;
//! select scenarios with `CUCUMBER_FILTER_TAGS`. A failing scenario fails `cargo test`.
//!
//! The reference operator is built from this workspace first, so the suite always judges the
//! source as it is (a stale binary next to the test would otherwise be used, e.g. by
//! cargo-mutants, which changes the source between runs). With `CONFORMANCE_UNIT_TESTS_FIRST`
//! set (scripts/mutants.sh), the operator's unit tests run before the suite, and a failure there
//! ends the test: cargo would otherwise run them after this target.
use std::process::ExitCode;

use clap::Parser as _;
use conformance::cli::{Cli, main_with};

fn main() -> ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let built = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|runtime| {
            runtime.block_on(async {
                if std::env::var_os("CONFORMANCE_UNIT_TESTS_FIRST").is_some() {
                    conformance::implementation::run_reference_unit_tests().await?;
                }
                conformance::implementation::build_reference_operator().await
            })
        });
    match built {
        // SAFETY: no other thread exists yet (the build's runtime is gone, the suite's not started).
        Ok(binary) => unsafe {
            std::env::set_var(conformance::implementation::REFERENCE_BINARY_ENV, binary)
        },
        Err(error) => {
            eprintln!("{error:#}");
            return ExitCode::FAILURE;
        }
    }
    let report_dir = concat!(env!("CARGO_TARGET_TMPDIR"), "/conformance-reports");
    let cli = match Cli::try_parse_from(["conformance", "run", "--report-dir", report_dir]) {
        Ok(cli) => cli,
        Err(error) => {
            eprintln!("{error}");
            return ExitCode::from(2);
        }
    };
    match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime.block_on(main_with(cli)),
        Err(error) => {
            eprintln!("starting the tokio runtime: {error}");
            ExitCode::FAILURE
        }
    }
}
