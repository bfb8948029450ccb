//! Leader election on a `coordination.k8s.io/v1` Lease (kube-lease-manager).
//!
//! Only the holder of the Lease runs the controller. When the Lease is lost, the controller is
//! stopped (its shutdown token is cancelled and it is awaited) and the process goes back to
//! standby, competing for the Lease again; it does not exit, so losing a lease never looks like a
//! crash. On shutdown the Lease is released, and a standby that sees the release (it watches the
//! Lease) competes for it at once instead of waiting for its expiry.
//!
//! A term is fenced ([`Fence`]): a leader that was paused (SIGSTOP, a frozen VM, a long GC) can
//! wake after its Lease expired and a standby took over, with passes in flight. Every step that
//! creates, replaces or deletes a provisioner key, or writes a key's plaintext or record, asks the
//! fence first, so such a pass stops instead of overwriting the new leader's key.
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context as _;
use futures::{Stream, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::runtime::watcher;
use kube_lease_manager::LeaseManagerBuilder;
use tokio_util::sync::CancellationToken;

use crate::fence::Fence;

#[derive(Clone, Debug)]
pub struct LeaderElectionSettings {
    pub lease_name: String,
    pub namespace: String,
    /// Unique per replica (pod name plus a random suffix by default).
    pub identity: String,
    /// Seconds a Lease stays valid after its last renewal.
    pub lease_duration_secs: u64,
    /// Seconds before expiry at which the holder renews.
    pub renew_grace_secs: u64,
}

/// Whether this process currently holds the Lease (read by `/readyz`).
#[derive(Clone, Debug, Default)]
pub struct LeadershipFlag(Arc<AtomicBool>);

impl LeadershipFlag {
    pub fn is_leader(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    fn set(&self, leading: bool) {
        self.0.store(leading, Ordering::SeqCst);
    }
}

/// True when `event` shows the Lease free: released by its holder (no holder identity).
fn released(event: Option<Result<Option<Lease>, watcher::Error>>) -> bool {
    matches!(event, Some(Ok(Some(lease)))
        if lease.spec.as_ref().is_none_or(|spec| spec.holder_identity.as_deref().is_none_or(str::is_empty)))
}

/// The Lease's holder as the API server has it now (`None`: no holder).
async fn holder_now(api: &Api<Lease>, lease: &str) -> kube::Result<Option<String>> {
    let lease = api.get(lease).await?;
    Ok(lease
        .spec
        .and_then(|spec| spec.holder_identity)
        .filter(|holder| !holder.is_empty()))
}

/// Competes for the Lease until `shutdown` is cancelled and runs `lead` for every term of
/// leadership. `lead` receives a token that is cancelled when the term ends (lease lost or
/// shutdown), which it must return once it is, and the term's [`Fence`]. An error from `lead`
/// ends the election with that error.
pub async fn run_with_leader_election<F, Fut>(
    client: kube::Client,
    settings: LeaderElectionSettings,
    flag: LeadershipFlag,
    shutdown: CancellationToken,
    mut lead: F,
) -> anyhow::Result<()>
where
    F: FnMut(CancellationToken, Fence) -> Fut,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let api: Api<Lease> = Api::namespaced(client.clone(), &settings.namespace);
    // While standing by, a release wakes this replica: the lease manager alone would sleep
    // until the released Lease's old expiry.
    let mut lease_events = watcher::watch_object(api.clone(), &settings.lease_name).boxed();
    loop {
        let manager = LeaseManagerBuilder::new(client.clone(), settings.lease_name.as_str())
            .with_namespace(settings.namespace.as_str())
            .with_identity(settings.identity.as_str())
            .with_duration(settings.lease_duration_secs)
            .with_grace(settings.renew_grace_secs)
            .build()
            .await
            .with_context(|| {
                format!(
                    "preparing Lease {}/{}",
                    settings.namespace, settings.lease_name
                )
            })?;
        tracing::info!(lease = %settings.lease_name, namespace = %settings.namespace, identity = %settings.identity,
            "waiting for leadership");
        let (leading, lease_task) = manager.watch().await;
        let ended = compete(
            &settings,
            &api,
            &flag,
            &shutdown,
            &mut lead,
            leading,
            &mut lease_events,
        )
        .await;
        // Dropping the receiver (done by `compete`) makes the lease task release the Lease (if
        // held) and finish.
        match lease_task.await {
            // Said only when leaving: a manager replaced while standing by held nothing.
            Ok(Ok(_)) if ended.is_some() => {
                tracing::info!(lease = %settings.lease_name, "released the lease")
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "releasing the lease failed; it will expire on its own")
            }
            Err(e) => tracing::warn!(error = %e, "the lease task panicked"),
        }
        match ended {
            Some(outcome) => break outcome,
            None => {
                tracing::info!(lease = %settings.lease_name, "the Lease has no holder (released); competing for it now")
            }
        }
    }
}

/// One lease manager's life: stands by, leads each term it wins. `None` when the Lease was seen
/// released while standing by (the caller starts a fresh manager, which competes at once);
/// `Some` when the election is over.
async fn compete<F, Fut>(
    settings: &LeaderElectionSettings,
    api: &Api<Lease>,
    flag: &LeadershipFlag,
    shutdown: &CancellationToken,
    lead: &mut F,
    mut leading: tokio::sync::watch::Receiver<bool>,
    lease_events: &mut (impl Stream<Item = Result<Option<Lease>, watcher::Error>> + Unpin),
) -> Option<anyhow::Result<()>>
where
    F: FnMut(CancellationToken, Fence) -> Fut,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return Some(Ok(())),
            changed = leading.changed() => {
                if changed.is_err() {
                    return Some(Err(anyhow::anyhow!("the lease manager stopped unexpectedly")));
                }
            }
            event = lease_events.next() => {
                if released(event) {
                    // Events wait in the stream while this replica leads: a release seen now can
                    // be one the new leader made of this replica's expired Lease before taking it.
                    match holder_now(api, &settings.lease_name).await {
                        Ok(None) => return None,
                        Err(error) => {
                            tracing::warn!(%error, "reading the Lease seen released failed; competing for it");
                            return None;
                        }
                        // Taken by this replica's manager: `leading` says so next.
                        Ok(Some(holder)) if holder == settings.identity => {}
                        Ok(Some(holder)) => tracing::info!(lease = %settings.lease_name,
                            "the Lease is held by {holder}; standing by"),
                    }
                }
                continue;
            }
        }
        if !*leading.borrow_and_update() {
            continue;
        }
        tracing::info!(identity = %settings.identity, "acquired the lease; starting the controller");
        flag.set(true);
        let term = shutdown.child_token();
        let fence = Fence::for_term(
            api.clone(),
            &settings.lease_name,
            &settings.identity,
            term.clone(),
        );
        let mut controller = tokio::spawn(lead(term.clone(), fence));
        let finished = loop {
            tokio::select! {
                joined = &mut controller => break Some(joined),
                // A stop hands the Lease over at once, not after the controller has wound down
                // (its caches may still be syncing): every write it could still make is fenced
                // on the Lease, which it no longer holds once this returns.
                _ = shutdown.cancelled() => {
                    flag.set(false);
                    return Some(Ok(()));
                }
                changed = leading.changed() => {
                    if changed.is_err() || !*leading.borrow_and_update() {
                        tracing::warn!(identity = %settings.identity, "lost the lease; stopping the controller");
                        term.cancel();
                        break None;
                    }
                }
            }
        };
        let joined = match finished {
            Some(joined) => joined,
            None => (&mut controller).await,
        };
        flag.set(false);
        let outcome = joined
            .context("the controller task panicked")
            .and_then(|run| run);
        if outcome.is_err() || shutdown.is_cancelled() {
            return Some(outcome);
        }
        if leading.has_changed().is_err() {
            return Some(Err(anyhow::anyhow!(
                "the lease manager stopped unexpectedly"
            )));
        }
        if *leading.borrow() {
            // The controller ended on its own while still leading: nothing would restart it.
            return Some(Err(anyhow::anyhow!(
                "the controller stopped while this process still held the lease"
            )));
        }
        tracing::info!("back to standby");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;

    #[test]
    fn a_lease_without_holder_is_released() {
        let lease = |holder: Option<&str>| Lease {
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        };
        assert!(released(Some(Ok(Some(lease(None))))));
        assert!(released(Some(Ok(Some(lease(Some("")))))));
        assert!(!released(Some(Ok(Some(lease(Some("leader")))))));
        assert!(!released(Some(Ok(None))));
        assert!(!released(None));
    }
}
