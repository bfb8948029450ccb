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
use crate::world::{CommandOutput, ProvisionerWorld};

/// The sample URL the tutorial applies.
pub const SAMPLE_URL: &str = "https://raw.githubusercontent.com/coder/coder-k8s/main/config/samples/coder_v1alpha1_coderprovisioner.yaml";

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
    match &world.env.existing_control_plane {
        None => world.use_namespace("coder").await?,
        // The tutorial's commands name the namespace and the control plane: an existing control
        // plane (--control-plane) must be the tutorial's.
        Some(existing)
            if (existing.namespace.as_str(), existing.name.as_str())
                != (TUTORIAL_NAMESPACE, TUTORIAL_CONTROL_PLANE) =>
        {
            bail!(
                "the tutorial's commands name the control plane {TUTORIAL_NAMESPACE}/{TUTORIAL_CONTROL_PLANE}; \
                 --control-plane {}/{} is another one (give the tutorial's, or leave @tutorial out of --tags)",
                existing.namespace,
                existing.name
            )
        }
        Some(_) => {}
    }
    ready_control_plane(world, Some("default")).await
}

/// The namespace and control plane the tutorial's commands name.
pub const TUTORIAL_NAMESPACE: &str = "coder";
pub const TUTORIAL_CONTROL_PLANE: &str = "codercontrolplane-sample";

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

/// An expected output line and the rules it shows (`R-CRED-2, R-ST-6`).
struct ExpectedLine {
    text: String,
    rules: String,
}

/// Checks the first output line (the phase) and that each expected line starts some line;
/// re-runs the command until that holds, as a reader would while the operator works. Each
/// problem names its rules, so that a failure blames only them: a line's own, and for the phase
/// R-ST-2 when the Deployment is reported ready (else R-ST-6: some gate kept it from Ready).
fn verify_observation(
    output: &CommandOutput,
    first: &str,
    lines: &[ExpectedLine],
) -> Result<(), String> {
    if !output.success {
        return Err(format!("the command failed: {}", output.stderr.trim()));
    }
    let mut printed = output.stdout.lines();
    let phase = printed.next().unwrap_or_default();
    let rest: Vec<&str> = printed.collect();
    let shows = |wanted: &str| {
        rest.iter()
            .any(|line| *line == wanted || line.starts_with(&format!("{wanted} ")))
    };
    let mut problems = Vec::new();
    if phase != first {
        let rule = if shows("DeploymentReady=True") {
            "R-ST-2"
        } else {
            "R-ST-6"
        };
        problems.push(format!(
            "the first line is {phase:?}, not {first:?} ({rule})"
        ));
    }
    for line in lines.iter().filter(|line| !shows(&line.text)) {
        let rules: Vec<String> = line
            .rules
            .split(',')
            .map(|r| format!("({})", r.trim()))
            .collect();
        problems.push(format!("no line {:?} {}", line.text, rules.join(" ")));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "printed {:?}: {}",
            output.stdout,
            problems.join("; ")
        ))
    }
}

#[then(expr = "running it again eventually prints {string} first and includes the lines:")]
async fn eventually_prints(
    world: &mut ProvisionerWorld,
    first: String,
    step: &Step,
) -> anyhow::Result<()> {
    let lines = table_rows(step)?
        .into_iter()
        .skip(1)
        .map(|row| match row.as_slice() {
            [text, rules] => Ok(ExpectedLine {
                text: text.clone(),
                rules: rules.clone(),
            }),
            _ => Err(anyhow::anyhow!("row {row:?} needs a line and its rules")),
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let command = last(world)?.0.clone();
    let world = &*world;
    let texts: Vec<&str> = lines.iter().map(|line| line.text.as_str()).collect();
    wait::eventually(
        &format!("`{command}` to print {first} and {texts:?}"),
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
        assert_eq!(
            verify_observation(&printed(stdout), "Ready", &tutorial_lines()).is_ok(),
            ok
        );
    }

    fn tutorial_lines() -> Vec<ExpectedLine> {
        vec![
            ExpectedLine {
                text: "CredentialsReady=True".to_owned(),
                rules: "R-CRED-2, R-ST-6".to_owned(),
            },
            ExpectedLine {
                text: "DeploymentReady=True".to_owned(),
                rules: "R-ST-6".to_owned(),
            },
        ]
    }

    #[rstest]
    #[case::credentials_missing("Pending\nDeploymentReady=True MinimumReplicasReady\n", &["R-ST-2", "R-CRED-2", "R-ST-6"])]
    #[case::not_ready_yet("Pending\nCredentialsReady=True CredentialsValid\n", &["R-ST-6"])]
    fn each_problem_names_its_rules(#[case] stdout: &str, #[case] rules: &[&str]) {
        let message = verify_observation(&printed(stdout), "Ready", &tutorial_lines())
            .expect_err("a problem");
        assert_eq!(
            crate::rule_ids::rules_named_in(&message),
            rules.iter().map(|r| (*r).to_owned()).collect::<Vec<_>>(),
            "{message}"
        );
    }
}
