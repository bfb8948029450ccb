//! coderd's entitlement answers, shared by every CoderProvisioner that reaches the same coderd
//! with the same token, for as long as a control plane's own reading is trusted (R-ENT-1/2):
//! at most one `GET /api/v2/entitlements` per coderd and token per window, not one per CR.
//!
//! Passes that need an answer while one is being fetched wait for it instead of asking too.
//! Failures are not kept: R-ENT-6..8 already requeue the pass for the whole window.
//! Keys include the token (hashed) so that two tokens never share an answer.
use std::collections::HashMap;
use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::coderd::{CoderdError, EntitlementValue, SecretString};

/// The `external_provisioner_daemons` entitlement as coderd reported it (`None`: absent).
pub type Reading = Option<EntitlementValue>;

type Slot = Arc<tokio::sync::Mutex<Option<(Instant, Reading)>>>;

#[derive(Debug)]
pub struct EntitlementCache {
    window: Duration,
    token_hasher: RandomState,
    slots: Mutex<HashMap<(String, u64), Slot>>,
}

impl EntitlementCache {
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            token_hasher: RandomState::new(),
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
        if let Some((at, reading)) = kept.as_ref()
            && at.elapsed() < self.window
        {
            return Ok(reading.clone());
        }
        let reading = ask().await?;
        *kept = Some((Instant::now(), reading.clone()));
        Ok(reading)
    }

    fn slot(&self, url: &str, token: &SecretString) -> Slot {
        let key = (
            url.trim_end_matches('/').to_owned(),
            self.token_hasher.hash_one(token.expose()),
        );
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
    async fn failures_are_not_kept_and_old_readings_are_refreshed() {
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
