//! What every pass shares: clients, metrics, counters and the leadership fence.
use std::sync::Arc;

use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Client, Resource, ResourceExt};
use tracing::warn;

use crate::api::CoderProvisioner;
use crate::coderd::{CoderdClient, CoderdError, Connector, SecretString};
use crate::fence::Fence;
use crate::metrics::Metrics;

use super::backoff::{AttemptCounters, HoldOff};
use super::coderd_slots::CoderdSlots;
use super::entitlement_cache::EntitlementCache;
use super::own_writes::OwnWrites;

/// Shared state of all reconciles.
pub struct Context {
    pub client: Client,
    pub field_manager: String,
    /// Builds the coderd client of each pass on one shared connection pool.
    pub coderd: Connector,
    pub metrics: Arc<Metrics>,
    pub recorder: Recorder,
    /// Consecutive 429 outcomes per CR (§11).
    pub rate_limits: AttemptCounters,
    /// Consecutive reconcile errors per CR (error backoff).
    pub failures: AttemptCounters,
    /// Earliest next coderd key call per CR after a 429 or a key failure.
    pub key_hold_off: HoldOff,
    pub entitlements: EntitlementCache,
    /// Reconcile slots per coderd, so that a hanging one does not starve the others.
    pub coderd_slots: CoderdSlots,
    /// Asked before writing a key's plaintext or record, and (through the coderd clients)
    /// before every key request: a replica whose leadership ended must not change keys.
    pub fence: Fence,
    /// This operator's writes, whose watch events start no pass.
    pub own_writes: OwnWrites,
}

impl Context {
    pub(super) fn coderd(
        &self,
        url: &str,
        token: &SecretString,
    ) -> Result<CoderdClient, CoderdError> {
        self.coderd.client(url, token.clone())
    }

    /// Publishes an Event on the CR, only while this replica holds its Lease (R-HA-2: a deposed
    /// leader writes nothing, an Event included); failures only log (events are advisory).
    pub(super) async fn event(
        &self,
        cr: &CoderProvisioner,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        if let Err(fenced) = self.fence.check().await {
            warn!(error = %fenced, reason, "not the leader: publishing no event");
            return;
        }
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: action.to_owned(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, &cr.object_ref(&())).await {
            warn!(%error, reason, "could not publish event");
        }
    }
}

/// `namespace/name`, the key of per-CR counters.
pub fn object_key(cr: &CoderProvisioner) -> String {
    format!("{}/{}", cr.namespace().unwrap_or_default(), cr.name_any())
}
