//! The leadership fence: proof, asked before every step that changes a provisioner key or writes
//! its plaintext, and before every kind of Kubernetes write (status, a failure status included;
//! children; the finalizer; Events), that this replica still holds its Lease. The writes carry
//! their own precondition besides (R-HA-2): a check cannot close the window of a pause after it.
//!
//! A leader that was paused (SIGSTOP, a frozen VM, a long GC) can wake after its Lease expired and
//! a standby took over, with passes in flight; such a pass must stop instead of overwriting the
//! new leader's key. A leaf module: `runtime::leader` makes a fence per term, the pass and the
//! coderd client's write guard ask it.
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use tokio_util::sync::CancellationToken;

/// Why a fenced step may not run.
#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    #[error("this replica's leadership term has ended")]
    TermEnded,
    #[error("the Lease {lease} is held by {holder}, not by this replica")]
    HeldByOther { lease: String, holder: String },
    #[error("this replica's hold on the Lease {lease} has expired")]
    Expired { lease: String },
    #[error("reading the Lease {lease} to prove leadership failed: {source}")]
    Unreadable {
        lease: String,
        #[source]
        source: kube::Error,
    },
}

/// Asked before every step that changes a provisioner key or writes its plaintext or record.
/// Without leader election (one replica) every check passes.
#[derive(Clone, Debug, Default)]
pub struct Fence(Option<Arc<LeaseFence>>);

#[derive(Debug)]
struct LeaseFence {
    api: Api<Lease>,
    lease: String,
    identity: String,
    /// Cancelled when the lease manager reports the term over.
    term: CancellationToken,
    /// Until when the last read of the Lease proves this replica holds it. Monotonic time keeps
    /// running while the process is paused, so a process that wakes after that reads again.
    proven_until: Mutex<Option<Instant>>,
}

/// Margin kept off a proof, for the time between reading the Lease and the step it allows.
const PROOF_MARGIN: Duration = Duration::from_secs(1);

impl Fence {
    /// The fence of one leadership term: `identity`'s hold on the Lease `lease` (read through
    /// `api`), until `term` is cancelled.
    pub fn for_term(api: Api<Lease>, lease: &str, identity: &str, term: CancellationToken) -> Self {
        Self(Some(Arc::new(LeaseFence {
            api,
            lease: lease.to_owned(),
            identity: identity.to_owned(),
            term,
            proven_until: Mutex::new(None),
        })))
    }

    /// `Ok` when this replica may still change keys: it holds the Lease and its hold has not
    /// expired. Reads the Lease unless an earlier read proves that for a while yet.
    pub async fn check(&self) -> Result<(), FenceError> {
        let Some(fence) = &self.0 else {
            return Ok(());
        };
        if fence.term.is_cancelled() {
            return Err(FenceError::TermEnded);
        }
        if fence.proof().is_some_and(|until| Instant::now() < until) {
            return Ok(());
        }
        let read_at = Instant::now();
        let lease = fence
            .api
            .get(&fence.lease)
            .await
            .map_err(|source| FenceError::Unreadable {
                lease: fence.lease.clone(),
                source,
            })?;
        let held_for = remaining_hold(
            &fence.lease,
            lease.spec.as_ref(),
            &fence.identity,
            Timestamp::now(),
        )?;
        if fence.term.is_cancelled() {
            return Err(FenceError::TermEnded);
        }
        *fence.proof() = held_for
            .checked_sub(PROOF_MARGIN)
            .map(|valid| read_at + valid);
        Ok(())
    }
}

impl LeaseFence {
    fn proof(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.proven_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// How long `identity`'s hold on the Lease lasts from `now`, or why it holds none.
fn remaining_hold(
    lease: &str,
    spec: Option<&LeaseSpec>,
    identity: &str,
    now: Timestamp,
) -> Result<Duration, FenceError> {
    let spec = spec.cloned().unwrap_or_default();
    match spec.holder_identity.as_deref() {
        Some(holder) if holder == identity => {}
        holder => {
            return Err(FenceError::HeldByOther {
                lease: lease.to_owned(),
                holder: holder.unwrap_or("nobody").to_owned(),
            });
        }
    }
    let expired = || FenceError::Expired {
        lease: lease.to_owned(),
    };
    let (Some(renewed), Some(seconds)) = (spec.renew_time, spec.lease_duration_seconds) else {
        return Err(expired());
    };
    let expiry = renewed.0 + Duration::from_secs(u64::try_from(seconds).unwrap_or(0));
    let left = now.duration_until(expiry);
    if left.is_negative() || left.is_zero() {
        return Err(expired());
    }
    Duration::try_from(left).map_err(|_| expired())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn spec(holder: Option<&str>, renewed_secs_ago: i64, duration: i32) -> LeaseSpec {
        let now = Timestamp::from_second(1_000_000).unwrap();
        LeaseSpec {
            holder_identity: holder.map(str::to_owned),
            renew_time: Some(MicroTime(
                now - k8s_openapi::jiff::SignedDuration::from_secs(renewed_secs_ago),
            )),
            lease_duration_seconds: Some(duration),
            ..LeaseSpec::default()
        }
    }

    fn now() -> Timestamp {
        Timestamp::from_second(1_000_000).unwrap()
    }

    #[test]
    fn the_holder_holds_until_renewal_plus_duration() {
        let left = remaining_hold("l", Some(&spec(Some("me"), 5, 15)), "me", now()).unwrap();
        assert_eq!(left, Duration::from_secs(10));
    }

    #[test]
    fn another_holder_or_none_is_no_hold() {
        let error = remaining_hold("l", Some(&spec(Some("you"), 0, 15)), "me", now()).unwrap_err();
        assert!(
            matches!(&error, FenceError::HeldByOther { holder, .. } if holder == "you"),
            "{error}"
        );
        let released = remaining_hold("l", Some(&spec(None, 0, 15)), "me", now()).unwrap_err();
        assert!(matches!(&released, FenceError::HeldByOther { holder, .. } if holder == "nobody"));
        assert!(remaining_hold("l", None, "me", now()).is_err());
    }

    #[test]
    fn an_expired_hold_of_ones_own_is_no_hold() {
        // A leader that wakes after a pause finds its own name on a Lease nobody renewed.
        for renewed_secs_ago in [15, 16, 300] {
            let error = remaining_hold(
                "l",
                Some(&spec(Some("me"), renewed_secs_ago, 15)),
                "me",
                now(),
            )
            .unwrap_err();
            assert!(matches!(error, FenceError::Expired { .. }), "{error}");
        }
        let mut never_renewed = spec(Some("me"), 0, 15);
        never_renewed.renew_time = None;
        assert!(remaining_hold("l", Some(&never_renewed), "me", now()).is_err());
    }

    #[tokio::test]
    async fn without_leader_election_every_check_passes() {
        Fence::default().check().await.unwrap();
    }
}
