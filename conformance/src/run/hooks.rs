//! Per-scenario hooks: what runs after each scenario.
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::report::collector::{Outcomes, ScenarioKey};
use crate::world::ProvisionerWorld;

/// After each scenario: coderd call counts, diagnostics on failure, global coderd switches
/// restored, namespace removed (kept on failure with --keep-on-failure).
pub(super) async fn after_scenario(
    outcomes: Arc<Mutex<Outcomes>>,
    scenario_key: ScenarioKey,
    scenario_name: String,
    failed: bool,
    world: Option<&mut ProvisionerWorld>,
) {
    let Some(world) = world else { return };
    // Before anything is cleaned up: the scenario's secrets and its CRs are still there. The
    // end-of-scenario checks first: they wait for the CRs to settle, so the watch's findings
    // read after them include the settled states' (D-15).
    let mut findings = crate::scenario_checks::end_of_scenario(world).await;
    findings.extend(crate::scenario_checks::leaks::findings(world).await);
    if let (false, Some(generated)) = (findings.is_empty(), &world.generated) {
        findings.push(generated.describe());
    }
    let failed = failed || !findings.is_empty();
    let calls = if world.env.coderd.admin.is_some() && world.coderd.is_some() {
        world.journal().await.ok().map(|entries| {
            let mut counts = BTreeMap::new();
            for entry in entries {
                let route = entry.route.unwrap_or(entry.path);
                *counts
                    .entry(format!("{} {route}", entry.method))
                    .or_insert(0) += 1;
            }
            counts
        })
    } else {
        None
    };
    let mut diagnostics = None;
    if failed {
        let folder =
            crate::diagnostics::folder_name(&scenario_key.0, &scenario_name, scenario_key.1);
        let dir = world.env.report_dir.join("diagnostics").join(&folder);
        match crate::diagnostics::write_bundle(world, &dir).await {
            Ok(dir) => {
                eprintln!(
                    "conformance: diagnostics for \"{scenario_name}\" in {}",
                    dir.display()
                );
                diagnostics = Some(format!("diagnostics/{folder}"));
            }
            Err(error) => eprintln!(
                "conformance: could not write diagnostics for \"{scenario_name}\": {error:#}"
            ),
        }
    }
    outcomes
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .set_extras(scenario_key, calls, diagnostics);
    // After the diagnostics, which show the scenario's own objects, not the trials'.
    if failed && let Some(shrunk) = crate::steps::generated::shrink(world).await {
        eprintln!("conformance: \"{scenario_name}\": {shrunk}");
        findings.push(shrunk);
    }
    if let Err(error) = world.clear_scenario_faults().await {
        eprintln!("conformance: could not clear the scenario's coderd faults: {error:#}");
    }
    let faults_cleared = tokio::time::Instant::now();
    if world.touched_global_coderd
        && let Err(error) = world.restore_global_coderd().await
    {
        eprintln!("conformance: could not restore the fake coderd's global state: {error:#}");
    }
    world.stop_replicas().await;
    if let Some(hold) = world.write_hold.take()
        && let Err(error) = hold.remove(world.client()).await
    {
        eprintln!("conformance: could not remove the write-hold webhook: {error:#}");
    }
    if world.operator_stopped
        && let Err(error) = world.restart_operator().await
    {
        eprintln!("conformance: could not start the stopped operator again: {error:#}");
    }
    if let Err(error) = crate::steps::provisioner::release_held(world).await {
        eprintln!("conformance: could not remove the suite's finalizer: {error:#}");
    }
    // An answer delayed before the faults were cleared still holds one of the operator's
    // workers until it comes (with one worker, the only one): a scenario that runs alone keeps
    // the others out until then, so that its hold costs only its own verdict.
    if let (Some(delay), Some(crate::world::Gate::Alone(..))) = (world.longest_delay, &world.gate) {
        tokio::time::sleep_until(faults_cleared + delay).await;
    }
    // Namespace deletion runs in the background, so the gate can be released before it.
    world.gate = None;
    if failed && world.env.keep_on_failure && world.owns_namespace {
        eprintln!(
            "conformance: kept namespace {} of failed scenario \"{scenario_name}\"",
            world.namespace
        );
    } else if let Err(error) = world.delete_namespace().await {
        eprintln!(
            "conformance: could not delete namespace {}: {error:#}",
            world.namespace
        );
    }
    // The existing control plane's namespace (--control-plane) stays: what the scenario created
    // in it goes.
    if let Err(error) = world.delete_created_objects().await {
        findings.push(format!(
            "the scenario's objects in namespace {} could not be cleaned up: {error:#}",
            world.namespace
        ));
    }
    // A panic is how an after-hook fails its scenario in cucumber (reported as a failed hook).
    if !findings.is_empty() {
        panic!("after the scenario: {}", findings.join("; "));
    }
}
