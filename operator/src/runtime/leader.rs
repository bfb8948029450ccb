//! Leader election on a `coordination.k8s.io/v1` Lease (kube-lease-manager).
//!
//! Only the holder of the Lease runs the controller. When the Lease is lost, the controller is
//! stopped (its shutdown token is cancelled and it is awaited) and the process goes back to
//! standby, competing for the Lease again; it does not exit, so losing a lease never looks like a
//! crash. On shutdown the Lease is released so a standby replica takes over without waiting for
//! it to expire.
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context as _;
use kube_lease_manager::LeaseManagerBuilder;
use tokio_util::sync::CancellationToken;

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

/// Competes for the Lease until `shutdown` is cancelled and runs `lead` for every term of
/// leadership. `lead` receives a token that is cancelled when the term ends (lease lost or
/// shutdown) and must return once it is. An error from `lead` ends the election with that error.
pub async fn run_with_leader_election<F, Fut>(
    client: kube::Client,
    settings: LeaderElectionSettings,
    flag: LeadershipFlag,
    shutdown: CancellationToken,
    mut lead: F,
) -> anyhow::Result<()>
where
    F: FnMut(CancellationToken) -> Fut,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let manager = LeaseManagerBuilder::new(client, settings.lease_name.as_str())
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
    let (mut leading, lease_task) = manager.watch().await;

    let result = loop {
        tokio::select! {
            _ = shutdown.cancelled() => break Ok(()),
            changed = leading.changed() => {
                if changed.is_err() {
                    break Err(anyhow::anyhow!("the lease manager stopped unexpectedly"));
                }
            }
        }
        if !*leading.borrow_and_update() {
            continue;
        }
        tracing::info!(identity = %settings.identity, "acquired the lease; starting the controller");
        flag.set(true);
        let term = shutdown.child_token();
        let mut controller = tokio::spawn(lead(term.clone()));
        let finished = loop {
            tokio::select! {
                joined = &mut controller => break Some(joined),
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
            break outcome;
        }
        if leading.has_changed().is_err() {
            break Err(anyhow::anyhow!("the lease manager stopped unexpectedly"));
        }
        if *leading.borrow() {
            // The controller ended on its own while still leading: nothing would restart it.
            break Err(anyhow::anyhow!(
                "the controller stopped while this process still held the lease"
            ));
        }
        tracing::info!("back to standby");
    };

    // Dropping the receiver makes the lease task release the Lease and finish.
    drop(leading);
    match lease_task.await {
        Ok(Ok(_)) => tracing::info!(lease = %settings.lease_name, "released the lease"),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "releasing the lease failed; it will expire on its own")
        }
        Err(e) => tracing::warn!(error = %e, "the lease task panicked"),
    }
    result
}
