//! Steps of `leader_election.feature`: the operator as two leader-elected replicas, the leader
//! paused (SIGSTOP) or stopped, and who holds the Lease.
//!
//! The suite names its replicas `conformance-replica-a`, `-b` (their `POD_NAME`); the leader is
//! the replica whose name the holder identity of a Lease in the operator's namespace contains.
use std::time::Duration;

use anyhow::{Context as _, anyhow};
use cucumber::{given, then, when};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

use crate::implementation::REPLICA_NAME_PREFIX;
use crate::steps::route_template;
use crate::wait;
use crate::world::ProvisionerWorld;

/// Where [`the_leader`] remembers the replica a step paused.
const PAUSED: &str = "paused replica";

/// The replica holding a Lease in the operator's namespace, by name, with the Lease's name.
async fn lease_holder(world: &ProvisionerWorld) -> anyhow::Result<Option<(String, String)>> {
    let (namespace, _) = world
        .operator_service_account()
        .await
        .context("the operator's namespace is unknown")?;
    let leases: Api<Lease> = Api::namespaced(world.client(), &namespace);
    let replicas: Vec<String> = world.replicas.iter().map(|r| r.name().to_owned()).collect();
    for lease in leases.list(&Default::default()).await?.items {
        let holder = lease
            .spec
            .and_then(|spec| spec.holder_identity)
            .unwrap_or_default();
        if let Some(replica) = replicas.iter().find(|name| holder.contains(name.as_str())) {
            return Ok(Some((
                replica.clone(),
                lease.metadata.name.unwrap_or_default(),
            )));
        }
    }
    Ok(None)
}

/// Waits (with the scenario's deadline, or `deadline`) until a replica other than `not`
/// holds the Lease, and returns its name.
async fn await_leader(
    world: &ProvisionerWorld,
    not: Option<&str>,
    deadline: Option<Duration>,
) -> anyhow::Result<String> {
    let mut timeouts = *world.timeouts();
    if let Some(deadline) = deadline {
        timeouts.eventually = deadline;
    }
    let what = match not {
        Some(name) => format!("a replica other than {name} to hold the Lease"),
        None => "a replica to hold the Lease".to_owned(),
    };
    wait::eventually(&what, &timeouts, || async {
        Ok(match lease_holder(world).await? {
            Some((holder, _)) if Some(holder.as_str()) != not => Ok(holder),
            Some((holder, lease)) => Err(format!("Lease {lease} is held by {holder}")),
            None => Err(format!(
                "no Lease in the operator's namespace names a replica ({REPLICA_NAME_PREFIX}…)"
            )),
        })
    })
    .await
}

fn replica_index(world: &ProvisionerWorld, name: &str) -> anyhow::Result<usize> {
    world
        .replicas
        .iter()
        .position(|r| r.name() == name)
        .ok_or_else(|| anyhow!("no replica named {name}"))
}

#[given("the operator runs as two leader-elected replicas")]
async fn two_replicas(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    world.start_replicas(2).await?;
    await_leader(world, None, None).await?;
    Ok(())
}

/// Pauses the leader while it waits for coderd's answer to a request of this scenario (a delay
/// fault holds the answer back), so it wakes in the middle of a pass.
#[when(expr = "the leader is paused as soon as coderd sees its {word} on {string}")]
async fn pause_leader_mid_request(
    world: &mut ProvisionerWorld,
    method: String,
    alias: String,
) -> anyhow::Result<()> {
    let route = route_template(&alias)?;
    wait::eventually(
        &format!("coderd to see a {method} on {route}"),
        world.timeouts(),
        || async {
            let seen = world.journal().await?.iter().any(|entry| {
                entry.method.eq_ignore_ascii_case(&method) && entry.route.as_deref() == Some(route)
            });
            Ok(if seen {
                Ok(())
            } else {
                Err("not yet".to_owned())
            })
        },
    )
    .await?;
    let leader = await_leader(world, None, None).await?;
    world.replicas[replica_index(world, &leader)?].pause();
    world.remembered.insert(PAUSED.to_owned(), leader);
    Ok(())
}

#[then("another replica takes over the Lease")]
async fn another_replica_leads(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let paused = world.remembered.get(PAUSED).cloned();
    await_leader(world, paused.as_deref(), None).await?;
    Ok(())
}

#[when("the paused replica resumes")]
async fn resume_paused(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let paused = world
        .remembered
        .get(PAUSED)
        .cloned()
        .ok_or_else(|| anyhow!("no replica was paused"))?;
    world.mark_action().await?;
    world.replicas[replica_index(world, &paused)?].resume();
    Ok(())
}

/// A graceful stop (SIGTERM), as a rolling update or a drained node does.
#[when("the leader is stopped")]
async fn stop_leader(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let leader = await_leader(world, None, None).await?;
    let index = replica_index(world, &leader)?;
    world.mark_action().await?;
    world.replicas[index].stop().await;
    world.remembered.insert(PAUSED.to_owned(), leader);
    Ok(())
}

/// A released Lease is taken at once: well before it would have expired (15 s is the usual
/// lease duration), the standby holds it.
#[then(expr = "another replica holds the Lease within {int} seconds")]
async fn another_replica_leads_within(
    world: &mut ProvisionerWorld,
    seconds: u64,
) -> anyhow::Result<()> {
    let previous = world.remembered.get(PAUSED).cloned();
    await_leader(
        world,
        previous.as_deref(),
        Some(Duration::from_secs(seconds)),
    )
    .await?;
    Ok(())
}
