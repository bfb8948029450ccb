//! coderd's entitlement answers, shared by every CoderProvisioner that reaches the same coderd
//! with the same token, for as long as a control plane's own reading is trusted (R-ENT-1/2):
//! at most one `GET /api/v2/entitlements` per coderd and token per window, not one per CR.
//!
//! Passes that need an answer while one is being fetched wait for it instead of asking too, and
//! get that answer, a failure included: a failure is kept for [`FAILURE_WINDOW`], so passes that
//! queued behind a hanging coderd return at once instead of each waiting out its own timeout.
//! Keyed by [`CoderdIdentity`] (the token hashed), so that two tokens never share an answer.
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::coderd::{CoderdError, CoderdIdentity, EntitlementValue, SecretString};

/// The `external_provisioner_daemons` entitlement as coderd reported it (`None`: absent).
pub type Reading = Option<EntitlementValue>;

/// How long a failed reading is handed to the passes that ask next (R-ENT-6..8 requeue a failed
/// pass for minutes anyway; this only spares the passes that were already waiting).
pub const FAILURE_WINDOW: Duration = Duration::from_secs(10);

type Slot = Arc<tokio::sync::Mutex<Option<(Instant, Result<Reading, CoderdError>)>>>;

#[derive(Debug)]
pub struct EntitlementCache {
    window: Duration,
    slots: Mutex<HashMap<CoderdIdentity, Slot>>,
}

impl EntitlementCache {
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            slots: Mutex::default(),
        }
    }

    /// The reading for (`url`, `token`): a kept one younger than the window, else `ask`'s answer.
    pub async fn reading<F, Fut>(
        &self,
        url: &str,
        token: &SecretString,
        ask: F,
    ) -> Result<Reading, CoderdError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Reading, CoderdError>>,
    {
        let slot = self.slot(url, token);
        let mut kept = slot.lock().await;
        if let Some((at, answer)) = kept.as_ref() {
            let valid_for = if answer.is_ok() {
                self.window
            } else {
                FAILURE_WINDOW.min(self.window)
            };
            if at.elapsed() < valid_for {
                return answer.clone();
            }
        }
        let answer = ask().await;
        *kept = Some((Instant::now(), answer.clone()));
        answer
    }

    fn slot(&self, url: &str, token: &SecretString) -> Slot {
        let key = CoderdIdentity::new(url, token);
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        slots.entry(key).or_default().clone()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn token(value: &str) -> SecretString {
        SecretString::new(value)
    }

    async fn read(
        cache: &EntitlementCache,
        url: &str,
        token: &SecretString,
        asked: &AtomicUsize,
        answer: Result<Reading, CoderdError>,
    ) -> Result<Reading, CoderdError> {
        cache
            .reading(url, token, || async {
                asked.fetch_add(1, Ordering::SeqCst);
                tokio::task::yield_now().await;
                answer
            })
            .await
    }

    #[tokio::test]
    async fn concurrent_passes_share_one_request_within_the_window() {
        let cache = EntitlementCache::new(Duration::from_secs(120));
        let asked = AtomicUsize::new(0);
        let t = token("a");
        let readings = futures::future::join_all((0..20).map(|_| {
            read(
                &cache,
                "http://coderd",
                &t,
                &asked,
                Ok(Some(EntitlementValue::Entitled)),
            )
        }))
        .await;
        assert_eq!(asked.load(Ordering::SeqCst), 1);
        assert!(
            readings
                .iter()
                .all(|r| matches!(r, Ok(Some(EntitlementValue::Entitled))))
        );
    }

    #[tokio::test]
    async fn another_token_or_coderd_asks_for_itself() {
        let cache = EntitlementCache::new(Duration::from_secs(120));
        let asked = AtomicUsize::new(0);
        let ok = || Ok(Some(EntitlementValue::Entitled));
        read(&cache, "http://coderd", &token("a"), &asked, ok())
            .await
            .unwrap();
        read(&cache, "http://coderd/", &token("a"), &asked, ok())
            .await
            .unwrap();
        read(&cache, "http://coderd", &token("b"), &asked, ok())
            .await
            .unwrap();
        read(&cache, "http://other", &token("a"), &asked, ok())
            .await
            .unwrap();
        assert_eq!(asked.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn passes_waiting_behind_a_failure_get_it_without_asking_again() {
        let cache = EntitlementCache::new(Duration::from_secs(120));
        let asked = AtomicUsize::new(0);
        let t = token("a");
        let answers = futures::future::join_all((0..20).map(|_| {
            read(
                &cache,
                "http://coderd",
                &t,
                &asked,
                Err(CoderdError::Timeout),
            )
        }))
        .await;
        assert_eq!(
            asked.load(Ordering::SeqCst),
            1,
            "one request for all waiters"
        );
        assert!(answers.iter().all(|a| *a == Err(CoderdError::Timeout)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_is_kept_briefly_and_old_readings_are_refreshed() {
        let asked = AtomicUsize::new(0);
        let t = token("a");
        let cache = EntitlementCache::new(Duration::from_secs(120));
        let failed = read(
            &cache,
            "http://coderd",
            &t,
            &asked,
            Err(CoderdError::Timeout),
        )
        .await;
        assert!(failed.is_err());
        let still_failed = read(&cache, "http://coderd", &t, &asked, Ok(None)).await;
        assert!(still_failed.is_err(), "within the failure window");
        tokio::time::advance(FAILURE_WINDOW).await;
        let reading = read(&cache, "http://coderd", &t, &asked, Ok(None)).await;
        assert!(matches!(reading, Ok(None)));
        assert_eq!(asked.load(Ordering::SeqCst), 2);

        // A zero window makes every kept reading too old.
        let expired = EntitlementCache::new(Duration::ZERO);
        let asked = AtomicUsize::new(0);
        for _ in 0..2 {
            read(&expired, "http://coderd", &t, &asked, Ok(None))
                .await
                .unwrap();
        }
        assert_eq!(asked.load(Ordering::SeqCst), 2);
    }
}
