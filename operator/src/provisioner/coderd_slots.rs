//! A bound on the reconcile slots that the passes for one coderd (URL and token) may hold at
//! once, so that a hanging or slow coderd costs its own CRs and not the others': a pass takes a
//! slot before its first coderd call and, when none is free, gives its reconcile slot back. The
//! CR then waits in its coderd's line, and each slot that comes back wakes the first CR in line
//! (through the controller's `reconcile_on` stream), so a burst of new CRs moves at the pace of
//! coderd rather than of a retry timer. The deferred pass also requeues itself, in case the CR
//! it was woken for is gone by then.
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use futures::channel::mpsc::{self, UnboundedReceiver, UnboundedSender};
use kube::runtime::reflector::ObjectRef;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::api::CoderProvisioner;
use crate::coderd::{CoderdIdentity, SecretString};

type Waiter = ObjectRef<CoderProvisioner>;

#[derive(Debug)]
pub struct CoderdSlots {
    per_coderd: usize,
    coderds: Mutex<HashMap<CoderdIdentity, Arc<Line>>>,
    wake: UnboundedSender<Waiter>,
}

/// One coderd's slots and the CRs waiting for one, first come first woken.
#[derive(Debug)]
struct Line {
    semaphore: Arc<Semaphore>,
    waiting: Mutex<VecDeque<Waiter>>,
}

impl Line {
    fn waiting(&self) -> MutexGuard<'_, VecDeque<Waiter>> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A pass's hold on one of its coderd's slots; giving it back wakes the next CR in line.
#[derive(Debug)]
pub struct Slot {
    permit: Option<OwnedSemaphorePermit>,
    line: Arc<Line>,
    wake: UnboundedSender<Waiter>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        // The slot is given back before the next CR is woken: its pass may start at once.
        drop(self.permit.take());
        if let Some(next) = self.line.waiting().pop_front() {
            let _ = self.wake.unbounded_send(next);
        }
    }
}

impl CoderdSlots {
    /// `per_coderd` slots for each coderd (at least one), and the stream of CRs to wake (for
    /// `Controller::reconcile_on`).
    pub fn new(per_coderd: usize) -> (Self, UnboundedReceiver<Waiter>) {
        let (wake, woken) = mpsc::unbounded();
        let slots = Self {
            per_coderd: per_coderd.max(1),
            coderds: Mutex::default(),
            wake,
        };
        (slots, woken)
    }

    /// A slot of (`url`, `token`) for `waiter`'s pass, held until dropped; `None` while all are
    /// taken, and then `waiter` is in line to be woken when one comes back.
    pub fn try_take(&self, url: &str, token: &SecretString, waiter: &Waiter) -> Option<Slot> {
        let key = CoderdIdentity::new(url, token);
        let line = {
            let mut coderds = self.coderds.lock().unwrap_or_else(PoisonError::into_inner);
            coderds
                .entry(key)
                .or_insert_with(|| {
                    Arc::new(Line {
                        semaphore: Arc::new(Semaphore::new(self.per_coderd)),
                        waiting: Mutex::default(),
                    })
                })
                .clone()
        };
        let mut waiting = line.waiting();
        match Arc::clone(&line.semaphore).try_acquire_owned() {
            Ok(permit) => {
                waiting.retain(|queued| queued != waiter);
                drop(waiting);
                Some(Slot {
                    permit: Some(permit),
                    line,
                    wake: self.wake.clone(),
                })
            }
            Err(_) => {
                if !waiting.contains(waiter) {
                    waiting.push_back(waiter.clone());
                }
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cr(name: &str) -> Waiter {
        ObjectRef::new(name).within("ns")
    }

    #[test]
    fn one_coderd_holds_at_most_its_share_and_others_are_unaffected() {
        let (slots, _woken) = CoderdSlots::new(2);
        let slow = SecretString::new("slow-token");
        let held: Vec<_> = ["a", "b"]
            .iter()
            .map(|name| {
                slots
                    .try_take("http://coderd", &slow, &cr(name))
                    .expect("a free slot")
            })
            .collect();
        assert!(
            slots.try_take("http://coderd/", &slow, &cr("c")).is_none(),
            "the share is used up"
        );
        assert!(
            slots
                .try_take("http://coderd", &SecretString::new("other"), &cr("c"))
                .is_some(),
            "another token is another coderd client"
        );
        assert!(
            slots
                .try_take("http://elsewhere", &slow, &cr("c"))
                .is_some()
        );
        drop(held);
        assert!(
            slots.try_take("http://coderd", &slow, &cr("c")).is_some(),
            "slots come back"
        );
    }

    #[test]
    fn a_zero_share_still_lets_one_pass_through() {
        let (slots, _woken) = CoderdSlots::new(0);
        let token = SecretString::new("t");
        let _held = slots
            .try_take("http://coderd", &token, &cr("a"))
            .expect("one slot");
        assert!(slots.try_take("http://coderd", &token, &cr("b")).is_none());
    }

    /// The wake-up is sent when the slot is dropped, so `try_recv` sees it (a missing one fails
    /// the test instead of hanging it).
    #[test]
    fn each_slot_given_back_wakes_the_next_cr_in_line_once() {
        let (slots, mut woken) = CoderdSlots::new(1);
        let token = SecretString::new("t");
        let held = slots.try_take("http://coderd", &token, &cr("a"));
        for name in ["b", "c", "b"] {
            assert!(slots.try_take("http://coderd", &token, &cr(name)).is_none());
        }
        drop(held);
        assert_eq!(woken.try_recv().ok(), Some(cr("b")), "first in line first");
        let held = slots.try_take("http://coderd", &token, &cr("b"));
        assert!(held.is_some(), "the woken CR finds the slot free");
        drop(held);
        assert_eq!(
            woken.try_recv().ok(),
            Some(cr("c")),
            "b waited once, and left the line when it got its slot"
        );
        let _held = slots.try_take("http://coderd", &token, &cr("c"));
        assert!(woken.try_recv().is_err(), "no one else is in line");
    }
}
