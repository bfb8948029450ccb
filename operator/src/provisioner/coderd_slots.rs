//! A bound on the reconcile slots that the passes for one coderd (URL and token) may hold at
//! once, so that a hanging or slow coderd costs its own CRs and not the others': a pass takes a
//! permit before its first coderd call and, when none is free, gives its reconcile slot back and
//! comes again shortly.
use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::coderd::SecretString;

#[derive(Debug)]
pub struct CoderdSlots {
    per_coderd: usize,
    token_hasher: RandomState,
    semaphores: Mutex<HashMap<(String, u64), Arc<Semaphore>>>,
}

impl CoderdSlots {
    /// `per_coderd` permits for each coderd (at least one).
    pub fn new(per_coderd: usize) -> Self {
        Self {
            per_coderd: per_coderd.max(1),
            token_hasher: RandomState::new(),
            semaphores: Mutex::default(),
        }
    }

    /// A permit for (`url`, `token`), held until dropped; `None` while all are taken.
    pub fn try_take(&self, url: &str, token: &SecretString) -> Option<OwnedSemaphorePermit> {
        let key = (
            url.trim_end_matches('/').to_owned(),
            self.token_hasher.hash_one(token.expose()),
        );
        let semaphore = {
            let mut semaphores = self
                .semaphores
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            semaphores
                .entry(key)
                .or_insert_with(|| Arc::new(Semaphore::new(self.per_coderd)))
                .clone()
        };
        semaphore.try_acquire_owned().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_coderd_holds_at_most_its_share_and_others_are_unaffected() {
        let slots = CoderdSlots::new(2);
        let slow = SecretString::new("slow-token");
        let held: Vec<_> = (0..2)
            .map(|_| {
                slots
                    .try_take("http://coderd", &slow)
                    .expect("a free permit")
            })
            .collect();
        assert!(
            slots.try_take("http://coderd/", &slow).is_none(),
            "the share is used up"
        );
        assert!(
            slots
                .try_take("http://coderd", &SecretString::new("other"))
                .is_some(),
            "another token is another coderd client"
        );
        assert!(slots.try_take("http://elsewhere", &slow).is_some());
        drop(held);
        assert!(
            slots.try_take("http://coderd", &slow).is_some(),
            "permits come back"
        );
    }

    #[test]
    fn a_zero_share_still_lets_one_pass_through() {
        let slots = CoderdSlots::new(0);
        let token = SecretString::new("t");
        let _held = slots.try_take("http://coderd", &token).expect("one permit");
        assert!(slots.try_take("http://coderd", &token).is_none());
    }
}
