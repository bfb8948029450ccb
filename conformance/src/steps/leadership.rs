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
use crate::steps::coderd::count_observation;
use crate::steps::route_template;
use crate::wait;
use crate::world::ProvisionerWorld;

/// Where a step remembers the replica it paused or stopped.
const PAUSED: &str = "paused replica";
/// Where the stop step remembers when it sent SIGTERM (milliseconds since the Unix epoch).
const STOPPED_AT: &str = "leader stopped at";

/// The replica holding a Lease in the operator's namespace, by name, with that Lease.
async fn lease_holder(world: &ProvisionerWorld) -> anyhow::Result<Option<(String, Lease)>> {
    let (namespace, _) = world
        .operator_service_account()
        .await
        .context("the operator's namespace is unknown")?;
    let leases: Api<Lease> = Api::namespaced(world.client(), &namespace);
    for lease in leases.list(&Default::default()).await?.items {
        let holder = lease
            .spec
            .as_ref()
            .and_then(|spec| spec.holder_identity.as_deref())
            .unwrap_or_default();
        if let Some(replica) = world.replicas.iter().find(|r| holder.contains(r.name())) {
            return Ok(Some((replica.name().to_owned(), lease)));
        }
    }
    Ok(None)
}

/// Waits (with the scenario's deadline, or `deadline`) until a replica other than `not`
/// holds the Lease, and returns its name with the Lease.
async fn await_leader(
    world: &ProvisionerWorld,
    not: Option<&str>,
    deadline: Option<Duration>,
) -> anyhow::Result<(String, Lease)> {
    let mut timeouts = *world.timeouts();
    if let Some(deadline) = deadline {
        // A bound on how soon: the first sight counts, looked for often.
        timeouts.eventually = deadline;
        timeouts.reach_and_hold = 1;
        timeouts.interval = Duration::from_millis(100);
    }
    let what = match not {
        Some(name) => format!("a replica other than {name} to hold the Lease"),
        None => "a replica to hold the Lease".to_owned(),
    };
    wait::eventually(&what, &timeouts, || async {
        Ok(match lease_holder(world).await? {
            Some((holder, lease)) if Some(holder.as_str()) != not => Ok((holder, lease)),
            Some((holder, lease)) => Err(format!(
                "Lease {} is held by {holder}",
                lease.metadata.name.unwrap_or_default()
            )),
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
        || count_observation(world, &method, route, |seen| seen > 0),
    )
    .await?;
    let (leader, _) = await_leader(world, None, None).await?;
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

/// A graceful stop (SIGTERM), as a rolling update or a drained node does, just after the leader
/// renewed its Lease: a standby that only sleeps until the expiry it last read then sleeps for
/// most of a Lease duration, so a release that is not watched cannot look like a fast hand-over.
#[when("the leader is stopped right after it renews its Lease")]
async fn stop_leader(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let (leader, lease) = await_leader(world, None, None).await?;
    let index = replica_index(world, &leader)?;
    let renewed_at = |lease: &Lease| lease.spec.as_ref().and_then(|s| s.renew_time.clone());
    let first = renewed_at(&lease);
    let lease_name = lease.metadata.name.unwrap_or_default();
    let leases: Api<Lease> = Api::namespaced(
        world.client(),
        lease.metadata.namespace.as_deref().unwrap_or_default(),
    );
    let mut timeouts = *world.timeouts();
    timeouts.reach_and_hold = 1;
    timeouts.interval = Duration::from_millis(50);
    wait::eventually("the leader to renew its Lease", &timeouts, || async {
        let now = renewed_at(&leases.get(&lease_name).await?);
        Ok(if now != first {
            Ok(())
        } else {
            Err(format!("renewTime still {first:?}"))
        })
    })
    .await?;
    world.mark_action().await?;
    world
        .remembered
        .insert(STOPPED_AT.to_owned(), epoch_millis().to_string());
    world.replicas[index].stop().await;
    world.remembered.insert(PAUSED.to_owned(), leader);
    Ok(())
}

fn epoch_millis() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// A released Lease is taken at once: within `seconds` of the leader's SIGTERM, well before the
/// Lease would have expired, the standby holds it.
#[then(expr = "another replica holds the Lease within {int} seconds of the stop")]
async fn another_replica_leads_within(
    world: &mut ProvisionerWorld,
    seconds: u64,
) -> anyhow::Result<()> {
    let previous = world.remembered.get(PAUSED).cloned();
    let stopped_at: u128 = world
        .remembered
        .get(STOPPED_AT)
        .and_then(|at| at.parse().ok())
        .ok_or_else(|| anyhow!("no leader was stopped"))?;
    let left = (stopped_at + u128::from(seconds) * 1000).saturating_sub(epoch_millis());
    let left = Duration::from_millis(u64::try_from(left).unwrap_or(0));
    await_leader(world, previous.as_deref(), Some(left))
        .await
        .with_context(|| format!("within {seconds} s of the leader's SIGTERM"))?;
    Ok(())
}
