//! Scripted misbehaviour per route (method + route template): an error answer, a slow answer, or a
//! connection reset; for the next N matching requests or until cleared; optionally after applying
//! the request's state change (the crash-safety case: "key created, but the client saw a 500");
//! optionally only once another request of the same callers has succeeded (`after`: "the first
//! list that follows a key create", whatever lists came before it).
//!
//! Each injected fault is a wiremock mock of its own (`routes::fault_mock`): wiremock's priority puts
//! it before the routes, and `up_to_n_times` ends a counted one. `Faults` is the list of those in
//! force: what clearing switches off, and what a reopened coderd listener mounts again.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::api::{ApiError, Reply};
use crate::error::Error;
use crate::journal::JournalEntry;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum FaultKind {
    /// Answer `status` with `body` (default: a `codersdk.Response` fitting the status).
    Status {
        status: u16,
        #[serde(default)]
        body: Option<Value>,
    },
    /// Handle the request normally (state changes apply) but hold the answer back for `millis`,
    /// e.g. to exceed a client timeout.
    Delay { millis: u64 },
    /// Close the connection without an HTTP answer (the state change does not apply).
    Reset,
    /// Handle the request normally, but when the answer is the 404 of an organization the caller
    /// cannot see (coderd-api.md §2.3), write coderd's legacy body: the generic not-found object
    /// followed by `{"message":"Organization \"<arg>\" not found.","detail":"Provide either the
    /// organization id or name."}` in the same body, as coderd did before PR #13629. Any other
    /// answer passes unchanged (and still uses up one of the fault's `times`). Only for routes
    /// with `{organization}`.
    LegacyOrganizationNotFound,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct FaultSpec {
    /// HTTP method, case-insensitive.
    pub method: String,
    /// Route template, one of the `routes::*` constants.
    pub route: String,
    pub kind: FaultKind,
    /// How many matching requests the fault applies to; `None` = sticky until cleared.
    #[serde(default)]
    pub times: Option<u32>,
    /// For `status` faults: run the request (state change included) first, then answer the fault.
    #[serde(default)]
    pub apply_then_fail: bool,
    /// Only requests made with the session token of this fingerprint ([`crate::fingerprint`]);
    /// `None` = every caller. Lets concurrent tests fault their own client and nobody else's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_token_fingerprint: Option<String>,
    /// With `session_token_fingerprint`: also requests authenticated by a provisioner key of this
    /// organization (id), which carry no session token (the daemon-key route,
    /// `GET /api/v2/provisionerkeys/{key}`), so a test can fault its own keys' lookups too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_organization: Option<String>,
    /// The fault is in force only once a request of its callers matching this one was answered
    /// with a success (2xx) after the fault was injected; until then matching requests pass, and
    /// none of its `times` is used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<Trigger>,
}

/// The request that arms a fault with [`FaultSpec::after`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Trigger {
    /// HTTP method, case-insensitive.
    pub method: String,
    /// Route template, one of the `routes::*` constants.
    pub route: String,
}

impl FaultSpec {
    /// A one-shot error answer.
    pub fn status(method: &str, route: &str, status: u16) -> Self {
        Self::once(method, route, FaultKind::Status { status, body: None })
    }

    /// A one-shot delayed answer.
    pub fn delay(method: &str, route: &str, delay: Duration) -> Self {
        let millis = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        Self::once(method, route, FaultKind::Delay { millis })
    }

    /// A one-shot connection reset.
    pub fn reset(method: &str, route: &str) -> Self {
        Self::once(method, route, FaultKind::Reset)
    }

    /// The legacy two-object body for the organization 404, for the next matching request
    /// (`.sticky()` for all of them).
    pub fn legacy_organization_not_found(method: &str, route: &str) -> Self {
        Self::once(method, route, FaultKind::LegacyOrganizationNotFound)
    }

    fn once(method: &str, route: &str, kind: FaultKind) -> Self {
        Self {
            method: method.to_string(),
            route: route.to_string(),
            kind,
            times: Some(1),
            apply_then_fail: false,
            session_token_fingerprint: None,
            key_organization: None,
            after: None,
        }
    }

    /// Applies to the next `n` matching requests.
    pub fn times(mut self, n: u32) -> Self {
        self.times = Some(n);
        self
    }

    /// Applies until cleared.
    pub fn sticky(mut self) -> Self {
        self.times = None;
        self
    }

    /// Lets the request change state before the fault answer replaces the real one.
    pub fn apply_then_fail(mut self) -> Self {
        self.apply_then_fail = true;
        self
    }

    /// Applies only to requests made with the session token of this fingerprint.
    pub fn for_session_token_fingerprint(mut self, fingerprint: impl Into<String>) -> Self {
        self.session_token_fingerprint = Some(fingerprint.into());
        self
    }

    /// With a session-token scope: also requests authenticated by a key of `organization_id`.
    pub fn or_key_of_organization(mut self, organization_id: impl Into<String>) -> Self {
        self.key_organization = Some(organization_id.into());
        self
    }

    /// In force only once a `method` on `route` of the fault's callers has succeeded after the
    /// injection (e.g. the next list that follows a key create: `after("POST", CREATE_KEY)`).
    pub fn after(mut self, method: &str, route: &str) -> Self {
        self.after = Some(Trigger {
            method: method.to_string(),
            route: route.to_string(),
        });
        self
    }

    /// Whether `entry` is a request of the fault's callers: any client's but an observer's, or
    /// only those of its session token and, with `key_organization`, of that organization's keys.
    fn covers(&self, entry: &JournalEntry) -> bool {
        if entry.observer {
            return false;
        }
        let Some(fingerprint) = &self.session_token_fingerprint else {
            return true;
        };
        entry.session_token_fingerprint.as_ref() == Some(fingerprint)
            || self.key_organization.as_ref().is_some_and(|organization| {
                entry
                    .key_organization_id
                    .as_ref()
                    .is_some_and(|of| of.eq_ignore_ascii_case(organization))
            })
    }

    /// Whether `entry` arms the fault: a success of its trigger request, from its callers.
    fn armed_by(&self, entry: &JournalEntry) -> bool {
        self.after.as_ref().is_some_and(|trigger| {
            entry.method.eq_ignore_ascii_case(&trigger.method)
                && entry.route.as_deref() == Some(trigger.route.as_str())
                && (200..300).contains(&entry.status)
                && self.covers(entry)
        })
    }

    /// Rejects specs the fake could not honour.
    pub fn validate(&self) -> Result<(), Error> {
        let known = |route: &str| crate::routes::templates::TEMPLATES.contains(&route);
        if !known(&self.route) {
            return Err(Error::UnknownRouteTemplate(self.route.clone()));
        }
        if let Some(trigger) = self.after.as_ref().filter(|trigger| !known(&trigger.route)) {
            return Err(Error::UnknownRouteTemplate(trigger.route.clone()));
        }
        if self.times == Some(0) {
            return Err(Error::ZeroFaultTimes);
        }
        if self.key_organization.is_some() && self.session_token_fingerprint.is_none() {
            return Err(Error::KeyOrganizationWithoutFingerprint);
        }
        match &self.kind {
            FaultKind::Status { status, .. } if !(400..=599).contains(status) => {
                Err(Error::NotAnErrorStatus(*status))
            }
            FaultKind::Reset if self.apply_then_fail => Err(Error::ResetCannotApplyThenFail),
            FaultKind::LegacyOrganizationNotFound if !self.route.contains("{organization}") => {
                Err(Error::NoOrganizationInRoute(self.route.clone()))
            }
            FaultKind::LegacyOrganizationNotFound if self.apply_then_fail => {
                Err(Error::LegacyBodyCannotApplyThenFail)
            }
            _ => Ok(()),
        }
    }

    /// The answer a `status` fault gives: a 429 is the rate limiter's own answer, headers included.
    pub fn reply(status: u16, body: &Option<Value>) -> Reply {
        match body {
            Some(body) => Reply::json(status, body),
            None if status == 500 => ApiError::internal("fault injected by fake-coderd").into(),
            None if status == 429 => crate::ratelimit::injected_too_many_requests(),
            None => ApiError::new(
                status,
                format!("Fault injected by fake-coderd (status {status})."),
            )
            .into(),
        }
    }
}

/// Names an injected fault; never reused, so the mock of a cleared fault cannot serve a new one.
pub type FaultId = u64;

/// The faults in force, in injection order, each with what is left of its `times`.
#[derive(Default, Debug)]
pub struct Faults {
    active: Vec<(FaultId, FaultSpec)>,
    last_id: FaultId,
    /// The faults with an `after` trigger not yet seen, each with the journal sequence number it
    /// was injected at: only a later request arms it.
    unarmed: Vec<(FaultId, u64)>,
}

impl Faults {
    /// Adds a fault; `journal_seq` is the sequence number of the last journal entry so far.
    pub fn inject(&mut self, spec: FaultSpec, journal_seq: u64) -> Result<FaultId, Error> {
        spec.validate()?;
        self.last_id += 1;
        if spec.after.is_some() {
            self.unarmed.push((self.last_id, journal_seq));
        }
        self.active.push((self.last_id, spec));
        Ok(self.last_id)
    }

    pub fn clear(&mut self) {
        self.active.clear();
        self.unarmed.clear();
    }

    /// Removes the faults scoped to one session-token fingerprint, leaving the others.
    pub fn clear_for(&mut self, fingerprint: &str) {
        self.active
            .retain(|(_, fault)| fault.session_token_fingerprint.as_deref() != Some(fingerprint));
        self.forget_unarmed_inactive();
    }

    fn forget_unarmed_inactive(&mut self) {
        let active = &self.active;
        self.unarmed
            .retain(|(id, _)| active.iter().any(|(active, _)| active == id));
    }

    /// Whether the fault is in force and armed: it has no `after` trigger, or `journal` shows the
    /// trigger's success after the fault's injection (remembered from then on).
    pub fn is_in_force(&mut self, id: FaultId, journal: &[JournalEntry]) -> bool {
        let Some(spec) = self
            .active
            .iter()
            .find(|(active, _)| *active == id)
            .map(|(_, spec)| spec)
        else {
            return false;
        };
        let Some(index) = self.unarmed.iter().position(|(unarmed, _)| *unarmed == id) else {
            return true;
        };
        let injected_at = self.unarmed[index].1;
        let armed = journal
            .iter()
            .rev()
            .take_while(|entry| entry.seq > injected_at)
            .any(|entry| spec.armed_by(entry));
        if armed {
            self.unarmed.remove(index);
        }
        armed
    }

    /// Counts one use of a fault (its mock answered); a counted fault that runs out is removed.
    pub fn used(&mut self, id: FaultId) {
        let Some(index) = self.active.iter().position(|(active, _)| *active == id) else {
            return;
        };
        match &mut self.active[index].1.times {
            Some(1) => {
                self.active.remove(index);
            }
            Some(remaining) => *remaining -= 1,
            None => {}
        }
    }

    /// The faults in force, in injection order, with their remaining `times`.
    pub fn active(&self) -> &[(FaultId, FaultSpec)] {
        &self.active
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routes::CREATE_KEY;

    #[test]
    fn counted_faults_run_out_and_sticky_ones_do_not() {
        let mut faults = Faults::default();
        let counted = faults
            .inject(FaultSpec::status("POST", CREATE_KEY, 500).times(2), 0)
            .expect("valid");
        let sticky = faults
            .inject(FaultSpec::status("GET", CREATE_KEY, 503).sticky(), 0)
            .expect("valid");
        faults.used(counted);
        assert_eq!(faults.active()[0].1.times, Some(1), "one use left");
        faults.used(counted);
        assert!(!faults.is_in_force(counted, &[]));
        for _ in 0..5 {
            faults.used(sticky);
        }
        assert!(faults.is_in_force(sticky, &[]));
    }

    #[test]
    fn ids_are_never_reused_and_scoped_clears_keep_the_others() {
        let mut faults = Faults::default();
        let mine = crate::journal::fingerprint("mine");
        let scoped = faults
            .inject(
                FaultSpec::status("POST", CREATE_KEY, 429).for_session_token_fingerprint(&mine),
                0,
            )
            .expect("valid");
        let everyone = faults
            .inject(FaultSpec::status("POST", CREATE_KEY, 500), 0)
            .expect("valid");
        faults.clear_for(&mine);
        assert!(!faults.is_in_force(scoped, &[]));
        assert!(faults.is_in_force(everyone, &[]));
        faults.clear();
        let next = faults
            .inject(FaultSpec::status("POST", CREATE_KEY, 500), 0)
            .expect("valid");
        assert!(
            next > everyone,
            "a cleared fault's id is not given out again"
        );
    }

    #[rstest::rstest]
    #[case(FaultSpec::status("POST", "/api/v2/nope", 500))]
    #[case(FaultSpec::status("POST", CREATE_KEY, 200))]
    #[case(FaultSpec::status("POST", CREATE_KEY, 500).times(0))]
    #[case(FaultSpec::status("GET", CREATE_KEY, 500).after("POST", "/api/v2/nope"))]
    #[case(FaultSpec::reset("POST", CREATE_KEY).apply_then_fail())]
    #[case(FaultSpec::legacy_organization_not_found("GET", crate::routes::ENTITLEMENTS))]
    #[case(FaultSpec::legacy_organization_not_found("POST", CREATE_KEY).apply_then_fail())]
    fn invalid_specs_are_rejected(#[case] spec: FaultSpec) {
        assert!(Faults::default().inject(spec, 0).is_err());
    }
}
