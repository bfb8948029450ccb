//! The `conformance` command line: `run` (the suite, with its reports), `verify-report`,
//! `report` (a report as an HTML page), `local-cluster` (a local control plane for other
//! tools), `bench`, `seeded-bugs` and `coverage`.
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::local_cluster::LocalClusterArgs;
use crate::report::html::ReportArgs;
use crate::run::args::RunArgs;
use crate::verify_report::VerifyArgs;

#[derive(Parser, Debug)]
#[command(
    name = "conformance",
    version,
    about = "Conformance suite for CoderProvisioner operators"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the suite against an operator and write the reports.
    Run(Box<RunArgs>),
    /// Check a conformance report: schema, digest, feature hashes, and the Core claim.
    VerifyReport(VerifyArgs),
    /// Render a conformance report as one self-contained HTML page (`--html <report.yaml>`),
    /// written beside the YAML as report.html unless `--out` says where.
    Report(ReportArgs),
    /// Start a local control plane (etcd + kube-apiserver + controller manager), write its
    /// admin kubeconfig and keep it running until Ctrl-C or SIGTERM (for `--cluster kubeconfig`).
    LocalCluster(LocalClusterArgs),
    /// Measure the reference operator at scale on the local tier (prints a table, writes JSON and SVG).
    Bench(Box<crate::bench::BenchArgs>),
    /// Prove the suite can fail: run it against seeded variants (patches) of the reference operator.
    SeededBugs(crate::seeded::SeededArgs),
    /// Print the rule coverage table (rules.tsv → scenarios → seeded variants); `--write`
    /// updates features/README.md, `--check` fails when it is stale or a rule is uncovered.
    Coverage(crate::coverage::CoverageArgs),
}

pub async fn main_with(cli: Cli) -> ExitCode {
    let result = match cli.command {
        Command::Run(args) => crate::run::run(*args).await,
        Command::VerifyReport(args) => crate::verify_report::run(&args),
        Command::Report(args) => crate::report::html::run(&args),
        Command::LocalCluster(args) => crate::local_cluster::run(&args).await,
        Command::Bench(args) => crate::bench::run(*args).await.map(|()| ExitCode::SUCCESS),
        Command::SeededBugs(args) => crate::seeded::run(args).await,
        Command::Coverage(args) => crate::coverage::run(&args),
    };
    result.unwrap_or_else(|error| {
        eprintln!("conformance: {error:#}");
        ExitCode::from(2)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn run_args(args: &[&str]) -> RunArgs {
        let argv = ["conformance", "run"].iter().chain(args).copied();
        let Command::Run(run) = Cli::try_parse_from(argv).expect("arguments").command else {
            panic!("not the run command");
        };
        *run
    }

    #[rstest]
    #[case(&[], 32)]
    #[case(&["--cluster", "kind"], 16)]
    #[case(&["--cluster", "kubeconfig"], 4)]
    #[case(&["--cluster", "k3s"], 4)]
    #[case(&["--operator-cmd", "./bin/manager"], 16)]
    #[case(&["--concurrency", "2"], 2)]
    #[case(&["--cluster", "kind", "--concurrency", "0"], 1)]
    fn concurrency_defaults_by_tier_and_implementation(
        #[case] args: &[&str],
        #[case] expected: usize,
    ) {
        let run = run_args(args);
        assert_eq!(run.concurrency(), expected);
    }

    /// A one-worker operator keeps its 16 in the shared environment, and each private
    /// environment, with an operator of its own, takes the machine's share as the reference's do.
    #[rstest]
    #[case(&[], 6)]
    #[case(&["--operator-cmd", "./bin/manager"], 6)]
    #[case(&["--operator-cmd", "./bin/manager", "--concurrency", "4"], 1)]
    #[case(&["--cluster", "kind"], 3)]
    fn private_environments_take_the_machines_share_with_five(
        #[case] args: &[&str],
        #[case] expected: usize,
    ) {
        let run = run_args(args);
        assert_eq!(run.private_seats(5), expected);
    }

    #[rstest]
    #[case(&[], 5)]
    #[case(&["--cluster", "kind"], 1)]
    #[case(&["--cluster", "kind", "--private-environments", "0"], 0)]
    fn private_environments_default_by_tier(#[case] args: &[&str], #[case] expected: usize) {
        let run = run_args(args);
        assert_eq!(run.private_environments(), expected);
    }
}
