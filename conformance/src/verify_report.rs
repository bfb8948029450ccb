//! `conformance verify-report`: checks a conformance report against this suite's features
//! (schema, digest, feature hashes, every scenario listed, the rule verdicts recomputed) and the
//! requirements named on the command line (tier, nothing simulated, the Core claim).
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;

use crate::features::feature_hashes;
use crate::report::model::{self, ConformanceReport};

#[derive(Args, Debug, Clone)]
pub struct VerifyArgs {
    /// The conformance report (YAML).
    pub file: PathBuf,
    /// Folder with the suite's feature files (default: the ones built into this binary).
    #[arg(long)]
    pub features: Option<PathBuf>,
    /// Also require the run to be on this tier (e.g. `kind`).
    #[arg(long)]
    pub require_tier: Option<String>,
    /// Also require that the suite simulated nothing (a cluster with kubelets).
    #[arg(long)]
    pub require_nothing_simulated: bool,
    /// Also require the Core conformance claim.
    #[arg(long)]
    pub require_core: bool,
}

pub fn run(args: &VerifyArgs) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("reading {}", args.file.display()))?;
    let report = ConformanceReport::from_yaml(&text)?;
    let inputs = crate::assets::Inputs::resolve(args.features.as_deref(), None, None)?;
    let mut problems = model::verify(&report, &feature_hashes(&inputs.features)?)?;
    // Every scenario listed, and the rule verdicts recomputed from the results with this suite's
    // features and catalogue.
    problems.extend(crate::coverage::verdict_problems(
        &report,
        &crate::coverage::load_rules(&inputs.features)?,
        &crate::attribution::Attribution::load(&inputs.features)?,
    ));
    problems.extend(model::unmet_requirements(
        &report,
        &model::Requirements {
            tier: args.require_tier.clone(),
            nothing_simulated: args.require_nothing_simulated,
            core: args.require_core,
        },
    ));
    if problems.is_empty() {
        println!(
            "{}: valid; Core conformance {}, Extended {}",
            args.file.display(),
            if report.summary.core_conformant {
                "yes"
            } else {
                "no"
            },
            if report.summary.extended_conformant {
                "yes"
            } else {
                "no"
            }
        );
        Ok(ExitCode::SUCCESS)
    } else {
        for problem in &problems {
            eprintln!("{}: {problem}", args.file.display());
        }
        Ok(ExitCode::FAILURE)
    }
}
