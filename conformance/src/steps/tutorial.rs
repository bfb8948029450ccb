//! The tutorial, run as written: its `kubectl` commands verbatim, with a real `kubectl` and the
//! admin kubeconfig, output compared with the tutorial's "Expected output".
//!
//! One substitution: the sample's GitHub URL is mapped to the sample in this repository, so the
//! suite checks the sample it ships (and needs no network).
use std::process::Stdio;

use anyhow::{Context as _, anyhow, bail};
use cucumber::gherkin::Step;
use cucumber::{given, then, when};
use tokio::process::Command;

use super::fixture::ready_control_plane;
use super::provisioner::SAMPLE_PATH;
use super::table_rows;
use crate::wait;
use crate::world::ProvisionerWorld;

/// The sample URL the tutorial applies.
pub const SAMPLE_URL: &str = "https://raw.githubusercontent.com/coder/coder-k8s/main/config/samples/coder_v1alpha1_coderprovisioner.yaml";

/// What one command printed.
#[derive(Clone, Debug, Default)]
pub struct CommandOutput {
    pub stdout: String,
    pub stderr: String,
    pub success: bool,
}

/// Maps the tutorial's sample URL to the repository's sample (pure, unit-tested).
pub fn localise(command: &str, repo_root: &std::path::Path) -> String {
    command.replace(SAMPLE_URL, &repo_root.join(SAMPLE_PATH).to_string_lossy())
}

async fn run(world: &ProvisionerWorld, command: &str) -> anyhow::Result<CommandOutput> {
    let kubectl = world
        .env
        .kubectl
        .as_ref()
        .ok_or_else(|| anyhow!("no kubectl binary was found (local tier: the control-plane binaries folder; otherwise PATH)"))?;
    let folder = kubectl
        .parent()
        .ok_or_else(|| anyhow!("kubectl path {} has no folder", kubectl.display()))?;
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![folder.to_path_buf()];
    paths.extend(std::env::split_paths(&path));
    let output = Command::new("bash")
        .arg("-c")
        .arg(localise(command, &world.env.repo_root))
        .env("PATH", std::env::join_paths(paths)?)
        .env("KUBECONFIG", &world.env.kubeconfig)
        .current_dir(&world.env.repo_root)
        .stdin(Stdio::null())
        .output()
        .await
        .context("running bash")?;
    Ok(CommandOutput {
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        success: output.status.success(),
    })
}

fn command_of(step: &Step) -> anyhow::Result<String> {
    super::docstring(step)
        .ok_or_else(|| anyhow!("step \"{}\" needs the command as a docstring", step.value))
}

/// The tutorial's prerequisite: namespace `coder` with control plane `codercontrolplane-sample`,
/// its provisioner keys in the `default` organization as the sample does not name one.
#[given("the tutorial's namespace \"coder\" with a Ready control plane with operator access")]
async fn tutorial_namespace(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    if world.env.existing_control_plane.is_none() {
        world.use_namespace("coder").await?;
    }
    ready_control_plane(world, Some("default")).await
}

#[given("I run:")]
#[when("I run:")]
async fn i_run(world: &mut ProvisionerWorld, step: &Step) -> anyhow::Result<()> {
    world.mark_action().await?;
    let command = command_of(step)?;
    let output = run(world, &command).await?;
    world.last_command = Some((command, output));
    Ok(())
}

fn last(world: &ProvisionerWorld) -> anyhow::Result<&(String, CommandOutput)> {
    world
        .last_command
        .as_ref()
        .ok_or_else(|| anyhow!("no command was run yet (\"When I run:\")"))
}

/// Exact comparison: the docstring is the output, each line ended by a newline.
#[then("the output is:")]
async fn output_is(world: &mut ProvisionerWorld, step: &Step) -> anyhow::Result<()> {
    let expected = format!("{}\n", super::docstring(step).unwrap_or_default());
    let (command, output) = last(world)?;
    if !output.success {
        bail!("`{command}` failed: {}", output.stderr.trim());
    }
    if output.stdout != expected {
        bail!(
            "`{command}` printed {:?}, the tutorial expects {expected:?}",
            output.stdout
        );
    }
    Ok(())
}

#[then("the command succeeds and its output mentions:")]
async fn output_mentions(world: &mut ProvisionerWorld, step: &Step) -> anyhow::Result<()> {
    let (command, output) = last(world)?;
    if !output.success {
        bail!("`{command}` failed: {}", output.stderr.trim());
    }
    let missing: Vec<String> = table_rows(step)?
        .into_iter()
        .filter_map(|row| row.into_iter().next())
        .filter(|text| !output.stdout.contains(text.as_str()))
        .collect();
    if !missing.is_empty() {
        bail!(
            "`{command}` printed {:?}, which lacks {missing:?}",
            output.stdout
        );
    }
    Ok(())
}

/// Checks the first output line and that each table cell starts some line; re-runs the command
/// until that holds, as a reader would while the operator works.
fn verify_observation(output: &CommandOutput, first: &str, lines: &[String]) -> Result<(), String> {
    if !output.success {
        return Err(format!("the command failed: {}", output.stderr.trim()));
    }
    let mut printed = output.stdout.lines();
    if printed.next() != Some(first) {
        return Err(format!("printed {:?}", output.stdout));
    }
    let rest: Vec<&str> = printed.collect();
    let missing: Vec<&String> = lines
        .iter()
        .filter(|wanted| {
            !rest
                .iter()
                .any(|line| *line == wanted.as_str() || line.starts_with(&format!("{wanted} ")))
        })
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "printed {:?}, which lacks {missing:?}",
            output.stdout
        ))
    }
}

#[then(expr = "running it again eventually prints {string} first and includes the lines:")]
async fn eventually_prints(
    world: &mut ProvisionerWorld,
    first: String,
    step: &Step,
) -> anyhow::Result<()> {
    let lines: Vec<String> = table_rows(step)?
        .into_iter()
        .filter_map(|row| row.into_iter().next())
        .collect();
    let command = last(world)?.0.clone();
    let world = &*world;
    wait::eventually(
        &format!("`{command}` to print {first} and {lines:?}"),
        world.timeouts(),
        || async {
            let output = run(world, &command).await?;
            Ok(verify_observation(&output, &first, &lines))
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[test]
    fn the_sample_url_is_mapped_to_the_repository() {
        let command = format!("kubectl apply -f \"{SAMPLE_URL}\"");
        let local = localise(&command, std::path::Path::new("/repo"));
        assert_eq!(local, format!("kubectl apply -f \"/repo/{SAMPLE_PATH}\""));
    }

    fn printed(stdout: &str) -> CommandOutput {
        CommandOutput {
            stdout: stdout.to_owned(),
            stderr: String::new(),
            success: true,
        }
    }

    #[rstest]
    #[case(
        "Ready\nCredentialsReady=True CredentialsValid\nDeploymentReady=True MinimumReplicasReady\n",
        true
    )]
    #[case(
        "Pending\nCredentialsReady=True CredentialsValid\nDeploymentReady=True MinimumReplicasReady\n",
        false
    )]
    #[case(
        "Ready\nCredentialsReady=False CredentialLabelMissing\nDeploymentReady=True MinimumReplicasReady\n",
        false
    )]
    #[case(
        "Ready\nCredentialsReady=TrueX y\nDeploymentReady=True MinimumReplicasReady\n",
        false
    )]
    fn verify_output_is_checked_line_by_line(#[case] stdout: &str, #[case] ok: bool) {
        let lines = vec![
            "CredentialsReady=True".to_owned(),
            "DeploymentReady=True".to_owned(),
        ];
        assert_eq!(
            verify_observation(&printed(stdout), "Ready", &lines).is_ok(),
            ok
        );
    }
}
