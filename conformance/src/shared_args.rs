//! Command-line arguments that more than one command takes: the operator that `run` and `bench`
//! start themselves, and durations such as `--wait-timeout`.
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;

/// The operator `run` and `bench` start themselves, and what it runs under.
#[derive(Args, Debug, Clone, Default)]
pub struct StartedOperatorArgs {
    /// Run this command (through `sh -c`) as the operator instead of the reference operator,
    /// with KUBECONFIG of its ServiceAccount, POD_NAMESPACE and WATCH_NAMESPACE in its env.
    #[arg(long)]
    pub operator_cmd: Option<String>,
    /// The command (through `sh -c`) of one replica of the operator running with leader
    /// election, for the `@leader-election` scenarios: the suite stops the operator, starts two
    /// replicas with this command (POD_NAME=conformance-replica-a, -b and
    /// CONFORMANCE_REPLICA_INDEX=0, 1, for ports of their own on one host; the holder identity
    /// may be anything, e.g. `<hostname>_<uuid>`: the first replica starts alone) and pauses or
    /// stops the leader. Built in for the reference operator; without it, `--operator-cmd` runs
    /// skip those scenarios.
    #[arg(long)]
    pub replica_cmd: Option<String>,
    /// RBAC manifests the started operator runs under (default: the suite's config/rbac, built
    /// into this binary).
    #[arg(long)]
    pub operator_rbac: Option<PathBuf>,
    /// CRDs to install instead of the suite's (the implementation's own); `run` judges them and
    /// also applies them with --operator installed.
    #[arg(long)]
    pub crds: Option<PathBuf>,
}

impl StartedOperatorArgs {
    /// The suite's embedded inputs, with the CRD and RBAC folders named here instead.
    pub fn inputs(&self, features: Option<&Path>) -> anyhow::Result<crate::assets::Inputs> {
        crate::assets::Inputs::resolve(
            features,
            self.crds.as_deref(),
            self.operator_rbac.as_deref(),
        )
    }
}

/// `90`, `90s`, `3m`, `500ms`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 90s or 3m"))?;
    match unit {
        "" | "s" => Ok(Duration::from_secs(number)),
        "ms" => Ok(Duration::from_millis(number)),
        "m" => Ok(Duration::from_secs(number * 60)),
        _ => Err(format!("unknown unit {unit:?} in {text:?} (ms, s, m)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case("90", Ok(Duration::from_secs(90)))]
    #[case("90s", Ok(Duration::from_secs(90)))]
    #[case("3m", Ok(Duration::from_secs(180)))]
    #[case("500ms", Ok(Duration::from_millis(500)))]
    #[case("soon", Err(()))]
    #[case("5h", Err(()))]
    fn durations_parse(#[case] text: &str, #[case] expected: Result<Duration, ()>) {
        assert_eq!(parse_duration(text).map_err(|_| ()), expected);
    }
}
