//! Steps of `leader_election.feature`: the operator as two leader-elected replicas, the leader
//! paused (SIGSTOP) or stopped, and who holds the Lease.
//!
//! The suite names its replicas `conformance-replica-a`, `-b` (their `POD_NAME`); the leader is
//! the replica whose name the holder identity of a Lease in the operator's namespace contains,
//! or, for identities that do not (`<hostname>_<uuid>`), the one that identity was observed for.
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use cucumber::{given, then, when};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

use crate::coderd_routes::route_template;
use crate::implementation::REPLICA_NAME_PREFIX;
use crate::report::not_applicable::DOES_NOT_APPLY;
use crate::steps::coderd::count_observation;
use crate::wait;
use crate::world::ProvisionerWorld;

/// Where a step remembers the replica it paused or stopped.
const PAUSED: &str = "paused replica";
/// Where a stop or kill step remembers when it signalled the leader (milliseconds since the
/// Unix epoch).
const STOPPED_AT: &str = "leader stopped at";
/// When the stopped leader's Lease was first seen released (no longer held by it).
const RELEASED_AT: &str = "lease released at";
/// When every process of the stopped leader had exited.
const EXITED_AT: &str = "leader exited at";
/// How long the API server's audit log was when the paused replica resumed.
const RESUMED_IN_AUDIT_LOG: &str = "audit log length at resume";

/// The Leases in the operator's namespace.
async fn leases(world: &ProvisionerWorld) -> anyhow::Result<Vec<Lease>> {
    let (namespace, _) = world
        .operator_service_account()
        .await
        .context("the operator's namespace is unknown")?;
    let leases: Api<Lease> = Api::namespaced(world.client(), &namespace);
    Ok(leases.list(&Default::default()).await?.items)
}

fn holder(lease: &Lease) -> &str {
    lease
        .spec
        .as_ref()
        .and_then(|spec| spec.holder_identity.as_deref())
        .unwrap_or_default()
}

/// The replica a Lease holder identity belongs to: the one whose name it contains (a pod name,
/// `POD_NAME`), the one it was seen for while that replica alone could take the Lease, or else
/// the one replica whose identity is not known yet, for an identity new since the replicas
/// started (so `<hostname>_<uuid>` identities are told apart by observation).
fn replica_of(world: &ProvisionerWorld, identity: &str) -> Option<String> {
    if identity.is_empty() || world.holders_before_replicas.contains(identity) {
        return None;
    }
    if let Some(replica) = world.replicas.iter().find(|r| identity.contains(r.name())) {
        return Some(replica.name().to_owned());
    }
    if let Some(name) = world.replica_identities.get(identity) {
        return Some(name.clone());
    }
    let unknown: Vec<&str> = world
        .replicas
        .iter()
        .map(|r| r.name())
        .filter(|name| !world.replica_identities.values().any(|n| n == name))
        .collect();
    match unknown.as_slice() {
        [only] => Some((*only).to_owned()),
        _ => None,
    }
}

/// The replica holding a Lease in the operator's namespace, with that Lease.
async fn lease_holder(world: &ProvisionerWorld) -> anyhow::Result<Option<(String, Lease)>> {
    for lease in leases(world).await? {
        if let Some(replica) = replica_of(world, holder(&lease)) {
            return Ok(Some((replica, lease)));
        }
    }
    Ok(None)
}

/// What a failure to find the leader shows: the holders seen, and each replica that exited
/// with the end of its log.
async fn leadership_state(world: &mut ProvisionerWorld) -> String {
    let holders = match leases(world).await {
        Ok(leases) => leases
            .iter()
            .map(|l| {
                format!(
                    "{} held by {:?}",
                    l.metadata.name.as_deref().unwrap_or("?"),
                    holder(l)
                )
            })
            .collect::<Vec<_>>()
            .join(", "),
        Err(error) => format!("the Leases could not be read: {error:#}"),
    };
    let mut text = format!(
        "Leases: {}",
        if holders.is_empty() { "none" } else { &holders }
    );
    for replica in &mut world.replicas {
        if let Some(status) = replica.exit_status() {
            let log = std::fs::read_to_string(replica.log_path()).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(5).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            text.push_str(&format!(
                "; replica {} exited ({status}), its log ends: {}",
                replica.name(),
                tail.join(" | ")
            ));
        }
    }
    text
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

/// [`await_leader`], its failure saying which holders it saw and which replicas exited.
async fn leader_explained(
    world: &mut ProvisionerWorld,
    not: Option<&str>,
    deadline: Option<Duration>,
) -> anyhow::Result<(String, Lease)> {
    match await_leader(world, not, deadline).await {
        Ok(found) => Ok(found),
        Err(error) => {
            let state = leadership_state(world).await;
            Err(anyhow!("{error:#}; {state}"))
        }
    }
}

fn replica_index(world: &ProvisionerWorld, name: &str) -> anyhow::Result<usize> {
    world
        .replicas
        .iter()
        .position(|r| r.name() == name)
        .ok_or_else(|| anyhow!("no replica named {name}"))
}

/// The first replica starts alone, so the identity that takes the Lease is known to be its
/// own whatever its form; then the second starts.
#[given("the operator runs as two leader-elected replicas")]
async fn two_replicas(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    world.holders_before_replicas = leases(world)
        .await?
        .iter()
        .map(|l| holder(l).to_owned())
        .filter(|h| !h.is_empty())
        .collect();
    let first = world.start_replica().await?;
    let (_, lease) = leader_explained(world, None, None).await.map_err(|error| {
        anyhow!("the first replica, started alone, did not take the Lease: {error:#}")
    })?;
    world
        .replica_identities
        .insert(holder(&lease).to_owned(), first);
    world.start_replica().await?;
    Ok(())
}

/// Pauses (SIGSTOP) or stops (SIGTERM) the leader while it waits for coderd's answer to a
/// request of this scenario (a delay fault holds the answer back): paused, it wakes in the
/// middle of a pass; stopped, it must hand its Lease over without waiting for that answer.
#[when(expr = "the leader is {word} as soon as coderd sees its {word} on {string}")]
async fn leader_interrupted_mid_request(
    world: &mut ProvisionerWorld,
    how: String,
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
    let (leader, lease) = leader_explained(world, None, None).await?;
    let index = replica_index(world, &leader)?;
    match how.as_str() {
        "paused" => world.replicas[index].pause(),
        "stopped" => {
            world.mark_action().await?;
            stop_watching_the_lease(world, index, &lease).await?;
        }
        other => anyhow::bail!("the leader can be paused or stopped, not {other:?}"),
    }
    world.remembered.insert(PAUSED.to_owned(), leader);
    Ok(())
}

/// Pauses the leader while it waits for coderd's answer to its lookup of the key it just created
/// (by listing keys or with the key itself, D-12; a delay fault holds the answer back): a key
/// exists in coderd that nothing records yet, and the leader wakes with it after its Lease passed
/// on.
#[when("the leader is paused as soon as coderd sees it look its new key up")]
async fn leader_paused_mid_lookup(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let create = route_template("provisionerkeys")?;
    let daemon_key = route_template("daemon-key")?;
    wait::eventually(
        "coderd to see a lookup of a newly created key",
        world.timeouts(),
        || async {
            let journal = world.journal().await?;
            let created = journal.iter().position(|e| {
                e.method == "POST" && e.route.as_deref() == Some(create) && e.status < 300
            });
            Ok(match created {
                Some(at)
                    if journal[at + 1..].iter().any(|e| {
                        e.method == "GET"
                            && (e.route.as_deref() == Some(create)
                                || e.route.as_deref() == Some(daemon_key))
                    }) =>
                {
                    Ok(())
                }
                Some(_) => Err("a key was created and not looked up yet".to_owned()),
                None => Err("no key created yet".to_owned()),
            })
        },
    )
    .await?;
    let (leader, _) = leader_explained(world, None, None).await?;
    world.replicas[replica_index(world, &leader)?].pause();
    world.remembered.insert(PAUSED.to_owned(), leader);
    Ok(())
}

/// Stops replica `index`, the holder of `lease` (SIGTERM to its process group, SIGKILL after the
/// grace period if a process of it still runs), watching the Lease meanwhile: remembers when it
/// was signalled, when the Lease was first seen no longer held by it, and when it had exited.
async fn stop_watching_the_lease(
    world: &mut ProvisionerWorld,
    index: usize,
    lease: &Lease,
) -> anyhow::Result<()> {
    let identity = holder(lease).to_owned();
    let name = lease.metadata.name.clone().unwrap_or_default();
    let leases: Api<Lease> = Api::namespaced(
        world.client(),
        lease.metadata.namespace.as_deref().unwrap_or_default(),
    );
    let released = |lease: &Lease| holder(lease) != identity;
    let stopped_at = epoch_millis();
    world
        .remembered
        .insert(STOPPED_AT.to_owned(), stopped_at.to_string());
    let (exited, exit) = futures::channel::oneshot::channel::<()>();
    let watch = async {
        let mut exit = exit;
        loop {
            if let Ok(lease) = leases.get(&name).await
                && released(&lease)
            {
                return Some(epoch_millis());
            }
            tokio::select! {
                _ = &mut exit => return None,
                () = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
        }
    };
    let replica = &mut world.replicas[index];
    let stopping = async {
        replica.stop().await;
        let _ = exited.send(());
        epoch_millis()
    };
    let (released_at, exited_at) = futures::join!(watch, stopping);
    // Released in the last moments before the exit, between two looks.
    let released_at = match released_at {
        Some(at) => Some(at),
        None => leases
            .get(&name)
            .await
            .ok()
            .filter(released)
            .map(|_| exited_at),
    };
    if let Some(at) = released_at {
        world
            .remembered
            .insert(RELEASED_AT.to_owned(), at.to_string());
    }
    world
        .remembered
        .insert(EXITED_AT.to_owned(), exited_at.to_string());
    Ok(())
}

/// Remembers `replica` as the one a step paused.
pub(super) fn remember_paused(world: &mut ProvisionerWorld, replica: String) {
    world.remembered.insert(PAUSED.to_owned(), replica);
}

#[then("another replica takes over the Lease")]
async fn another_replica_leads(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let paused = world.remembered.get(PAUSED).cloned();
    leader_explained(world, paused.as_deref(), None).await?;
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
    if let Some(log) = &world.env.audit_log {
        let length = std::fs::metadata(log).map_or(0, |m| m.len());
        world
            .remembered
            .insert(RESUMED_IN_AUDIT_LOG.to_owned(), length.to_string());
    }
    world.replicas[replica_index(world, &paused)?].resume();
    Ok(())
}

/// R-HA-2: from its resumption on, the deposed replica (authenticated as a ServiceAccount of its
/// own) gets no write accepted: no key Secret, child, status, finalizer or Event. A write the API
/// server refused as stale is the mechanism R-HA-2 asks for, not a write.
#[then(
    "the paused replica gets no Kubernetes write accepted after it resumes, during the observation window"
)]
async fn deposed_replica_writes_nothing(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let Some(log) = world.env.audit_log.clone() else {
        bail!(
            "{DOES_NOT_APPLY}this tier keeps no API server audit log, which tells the deposed \
             replica's writes apart (the local tier does)"
        );
    };
    let paused = world
        .remembered
        .get(PAUSED)
        .cloned()
        .ok_or_else(|| anyhow!("no replica was paused"))?;
    let (namespace, account) = world.replicas[replica_index(world, &paused)?].service_account();
    let user = format!("system:serviceaccount:{namespace}:{account}");
    let from: usize = world
        .remembered
        .get(RESUMED_IN_AUDIT_LOG)
        .and_then(|at| at.parse().ok())
        .unwrap_or(0);
    let window = world.observation_window();
    let world = &*world;
    wait::stays(
        &format!("no write of the deposed replica {paused} ({user})"),
        world.timeouts(),
        window,
        || async {
            let text = std::fs::read_to_string(&log)?;
            let since = text.get(from.min(text.len())..).unwrap_or_default();
            let writes = super::audit::accepted_writes_by(since, &user);
            Ok(if writes.is_empty() {
                Ok(())
            } else {
                Err(format!(
                    "it wrote after it resumed (R-HA-2): {}",
                    writes.join(", ")
                ))
            })
        },
    )
    .await
}

/// A graceful stop (SIGTERM), as a rolling update or a drained node does, or a kill (SIGKILL), as
/// a lost node does, just after the leader renewed its Lease: a standby that only sleeps until
/// the expiry it last read then sleeps for most of a Lease duration, so a release that is not
/// watched cannot look like a fast hand-over.
#[when(expr = "the leader is {word} right after it renews its Lease")]
async fn stop_leader(world: &mut ProvisionerWorld, how: String) -> anyhow::Result<()> {
    let (leader, lease) = leader_explained(world, None, None).await?;
    let index = replica_index(world, &leader)?;
    let renewed_at = |lease: &Lease| lease.spec.as_ref().and_then(|s| s.renew_time.clone());
    let first = renewed_at(&lease);
    let lease_name = lease.metadata.name.clone().unwrap_or_default();
    let leases: Api<Lease> = Api::namespaced(
        world.client(),
        lease.metadata.namespace.as_deref().unwrap_or_default(),
    );
    let mut timeouts = *world.timeouts();
    timeouts.reach_and_hold = 1;
    timeouts.interval = Duration::from_millis(50);
    let renewed = wait::eventually("the leader to renew its Lease", &timeouts, || async {
        let now = leases.get(&lease_name).await?;
        Ok(if renewed_at(&now) != first {
            Ok(now)
        } else {
            Err(format!("renewTime still {first:?}"))
        })
    })
    .await?;
    world.mark_action().await?;
    match how.as_str() {
        "stopped" => stop_watching_the_lease(world, index, &renewed).await?,
        "killed" => {
            world
                .remembered
                .insert(STOPPED_AT.to_owned(), epoch_millis().to_string());
            world.replicas[index].kill().await;
        }
        other => anyhow::bail!("the leader can be stopped or killed, not {other:?}"),
    }
    world.remembered.insert(PAUSED.to_owned(), leader);
    Ok(())
}

/// R-HA-3's first half: the Lease was seen no longer held by the stopped leader by the time
/// every process of it had exited.
#[then("the stopped leader released its Lease before it exited")]
async fn released_before_exit(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let remembered = |key: &str| {
        world
            .remembered
            .get(key)
            .and_then(|at| at.parse::<u128>().ok())
    };
    let stopped_at = remembered(STOPPED_AT).ok_or_else(|| anyhow!("no leader was stopped"))?;
    let exited_at = remembered(EXITED_AT).ok_or_else(|| anyhow!("no leader was stopped"))?;
    let exit = exited_at.saturating_sub(stopped_at);
    match remembered(RELEASED_AT) {
        Some(released_at) => {
            tracing::info!(
                release_ms = released_at.saturating_sub(stopped_at),
                exit_ms = exit,
                "the stopped leader released its Lease"
            );
            Ok(())
        }
        None => {
            let state = leadership_state(world).await;
            Err(anyhow!(
                "the leader exited {:.1} s after SIGTERM{} still holding its Lease (R-HA-3): {state}",
                exit as f64 / 1000.0,
                if exit >= crate::implementation::OPERATOR_GRACE.as_millis() {
                    " (killed at the end of the grace period)"
                } else {
                    ""
                }
            ))
        }
    }
}

/// R-HA-3's second half: within `seconds` of the release a standby holds the Lease.
#[then(expr = "another replica holds the Lease within {int} seconds of the release")]
async fn another_replica_leads_after_release(
    world: &mut ProvisionerWorld,
    seconds: u64,
) -> anyhow::Result<()> {
    let released_at = world
        .remembered
        .get(RELEASED_AT)
        .and_then(|at| at.parse::<u128>().ok())
        .ok_or_else(|| anyhow!("the stopped leader never released its Lease (R-HA-3)"))?;
    leader_within(world, released_at, seconds, "of the Lease's release")
        .await
        .map_err(|error| anyhow!("{error:#} (R-HA-3)"))
}

/// R-HA-4: after a kill, a standby holds the Lease within the Lease's own duration plus
/// `seconds`.
#[then(
    expr = "another replica holds the Lease within the Lease's duration and {int} seconds of the kill"
)]
async fn another_replica_leads_after_kill(
    world: &mut ProvisionerWorld,
    seconds: u64,
) -> anyhow::Result<()> {
    let killed_at = world
        .remembered
        .get(STOPPED_AT)
        .and_then(|at| at.parse::<u128>().ok())
        .ok_or_else(|| anyhow!("no leader was killed"))?;
    let duration = leases(world)
        .await?
        .iter()
        .filter_map(|l| l.spec.as_ref()?.lease_duration_seconds)
        .max()
        .and_then(|d| u64::try_from(d).ok())
        .ok_or_else(|| anyhow!("no Lease in the operator's namespace states its duration"))?;
    leader_within(
        world,
        killed_at,
        duration + seconds,
        &format!("of the kill (the Lease lasts {duration} s)"),
    )
    .await
    .map_err(|error| anyhow!("{error:#} (R-HA-4)"))
}

/// A replica other than the stopped one holds the Lease within `seconds` of `since` (epoch
/// milliseconds); the first sight counts.
async fn leader_within(
    world: &mut ProvisionerWorld,
    since: u128,
    seconds: u64,
    what: &str,
) -> anyhow::Result<()> {
    let previous = world.remembered.get(PAUSED).cloned();
    let left = (since + u128::from(seconds) * 1000).saturating_sub(epoch_millis());
    let left = Duration::from_millis(u64::try_from(left).unwrap_or(0));
    leader_explained(world, previous.as_deref(), Some(left))
        .await
        .map_err(|error| anyhow!("within {seconds} s {what}: {error:#}"))?;
    tracing::info!(
        handover_ms = epoch_millis().saturating_sub(since),
        "a standby holds the Lease"
    );
    Ok(())
}

fn epoch_millis() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}
