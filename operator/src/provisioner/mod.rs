//! The CoderProvisioner reconciler as a pipeline:
//! `dereference` (read) → `gates` (pure checks of D-1) → `keys` (coderd key lifecycle) →
//! `children` (pure objects) → `apply` (server-side apply) → `status` (pure, written once per change).
//! Shared between passes: `entitlement_cache` (one entitlements request per coderd and window)
//! and `coderd_slots` (a bound on the reconcile slots one coderd's passes hold). Each pass reads
//! its CR from the API server and writes its status conditionally on that read's
//! resourceVersion, so nothing is decided from a stale copy.
pub mod apply;
pub mod backoff;
pub mod children;
pub mod coderd_slots;
pub mod credentials;
pub mod dereference;
pub mod entitlement_cache;
pub mod gates;
pub mod keys;
pub mod names;
pub mod status;

#[cfg(test)]
pub(crate) mod fixtures;

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::finalizer::{self, finalizer};
use kube::{Api, Client, Resource, ResourceExt};
use tracing::{info, warn};

use crate::api::{
    CoderProvisioner, CoderProvisionerStatus, FINALIZER, SecretKeyRef, condition, reason,
};
use crate::coderd::{CoderdClient, CoderdError, Connector, SecretString};
use crate::runtime::leader::{Fence, FenceError};
use crate::runtime::metrics::Metrics;
use crate::seeded::{self, Bug};

use self::backoff::{AttemptCounters, HoldOff};
use self::children::ChildInputs;
use self::coderd_slots::CoderdSlots;
use self::entitlement_cache::EntitlementCache;
use self::gates::{Blocked, ConditionUpdate, EntitlementSource};
use self::keys::{DesiredKey, KeyAction, KeyEvent};
use self::names::Names;
use self::status::PassReport;

/// Periodic re-check of a healthy CR (every trigger that matters also arrives through a watch).
const RESYNC: Duration = Duration::from_secs(300);
/// When a pass finds all of its coderd's slots taken, it comes again after this long.
const CODERD_BUSY_RETRY: Duration = Duration::from_secs(2);
/// Message of R-RL-1.
pub const RATE_LIMITED_MESSAGE: &str = "Coder API rate limited while reconciling provisioner key";

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
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API request failed: {0}")]
    Kube(#[from] kube::Error),
    #[error("provisioner key step failed: {0}")]
    Key(#[source] CoderdError),
    #[error(transparent)]
    Finalizer(#[from] Box<finalizer::Error<Error>>),
    #[error("stopped before changing a provisioner key: {0}")]
    Fenced(#[from] FenceError),
}

impl Error {
    /// A pass stopped by the leadership fence: it writes nothing more, not even its status,
    /// which is the new leader's to write.
    fn is_fenced(&self) -> bool {
        matches!(
            self,
            Self::Fenced(_) | Self::Key(CoderdError::Fenced { .. })
        )
    }
}

impl Context {
    fn coderd(&self, url: &str, token: &SecretString) -> Result<CoderdClient, CoderdError> {
        if seeded::active(Bug::SessionTokenLogged) {
            info!(url, token = token.expose(), "building coderd client");
        }
        self.coderd.client(url, token.clone())
    }

    /// Publishes an Event on the CR; failures only log (events are advisory).
    async fn event(
        &self,
        cr: &CoderProvisioner,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
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

/// Entry point for the controller: finalizer handling, then apply or cleanup.
pub async fn reconcile(cr: Arc<CoderProvisioner>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    if seeded::active(Bug::DeletedWithoutFinalizerReconciled)
        && cr.metadata.deletion_timestamp.is_some()
        && !cr.finalizers().iter().any(|f| f == FINALIZER)
    {
        return apply_pass(&cr, &ctx).await;
    }
    let namespace = cr.namespace().unwrap_or_default();
    let api: Api<CoderProvisioner> = Api::namespaced(ctx.client.clone(), &namespace);
    let outcome = finalizer(&api, FINALIZER, cr.clone(), |event| async {
        match event {
            finalizer::Event::Apply(cr) => apply_pass(&cr, &ctx).await,
            finalizer::Event::Cleanup(cr) => cleanup(&cr, &ctx).await,
        }
    })
    .await
    .map_err(|error| Error::Finalizer(Box::new(error)));
    ctx.metrics
        .reconcile_finished(outcome_label(&outcome), started.elapsed().as_secs_f64());
    outcome
}

/// The `result` label of the reconcile metrics: `ok` for a pass that ended normally (resync or
/// wait for a change), `requeue` for one that asked to come back early, `error` otherwise.
fn outcome_label(outcome: &Result<Action, Error>) -> &'static str {
    match outcome {
        Ok(action) if *action == Action::requeue(RESYNC) || *action == Action::await_change() => {
            "ok"
        }
        Ok(_) => "requeue",
        Err(_) => "error",
    }
}

/// Requeue policy after an error: exponential from 5 s, capped at 2 min, per CR.
///
/// The backoff grows per scheduled retry, not per failure: a failure that a watch event (say the
/// operator's own status write) triggers before the scheduled retry keeps that retry, so a burst
/// of events cannot push the next attempt minutes away from a cause that is fixed meanwhile.
pub fn error_policy(cr: Arc<CoderProvisioner>, error: &Error, ctx: Arc<Context>) -> Action {
    if let Some(left) = ctx.key_hold_off.remaining(&object_key(&cr), Instant::now()) {
        warn!(provisioner = %object_key(&cr), %error, retry_in = ?left, "reconcile failed before its scheduled retry");
        return Action::requeue(left);
    }
    let attempt = ctx.failures.bump(&object_key(&cr));
    let delay =
        backoff::exponential_delay(Duration::from_secs(5), attempt, backoff::random_jitter());
    ctx.key_hold_off
        .hold(&object_key(&cr), Instant::now() + delay);
    warn!(provisioner = %object_key(&cr), %error, attempt, ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// The status being built during one pass, written whenever it changed.
struct StatusWriter<'a> {
    ctx: &'a Context,
    cr: &'a CoderProvisioner,
    /// resourceVersion of the CR as of the pass's read or its last write: each write is
    /// conditional on it.
    base_version: Option<String>,
    current: Option<CoderProvisionerStatus>,
}

/// Attempts at a status write that meets writes of others (labels, annotations) in between.
const STATUS_WRITE_ATTEMPTS: usize = 10;

impl StatusWriter<'_> {
    async fn write(
        &mut self,
        report: &PassReport,
        deployment: Option<&Deployment>,
    ) -> Result<(), Error> {
        let next = status::next_status(
            self.current.as_ref(),
            self.cr.metadata.generation,
            report,
            deployment,
            Timestamp::now(),
        );
        if !status::status_changed(self.current.as_ref(), &next) {
            return Ok(());
        }
        // A key established in this pass is recorded only while this replica leads.
        if report.key.is_some() && !seeded::active(Bug::PausedLeaderUnfenced) {
            self.ctx.fence.check().await?;
        }
        let mut attempt = 1;
        let written = loop {
            match apply::apply_status(
                &self.ctx.client,
                &self.ctx.field_manager,
                self.cr,
                &next,
                self.base_version.as_deref(),
            )
            .await
            {
                Err(kube::Error::Api(conflict))
                    if conflict.is_conflict() && attempt < STATUS_WRITE_ATTEMPTS =>
                {
                    // Someone wrote the CR since it was read. A metadata edit changes nothing
                    // this write decided: write again on the new version. A status someone
                    // else wrote does: give up, and the next pass decides from it.
                    let fresh = dereference::live_provisioner(&self.ctx.client, self.cr)
                        .await?
                        .ok_or(kube::Error::Api(conflict))?;
                    if fresh.status != self.current {
                        warn!(provisioner = %object_key(self.cr), "the status was written by someone else during this pass");
                        return Err(kube::Error::Api(conflict_of(&fresh)).into());
                    }
                    self.base_version = fresh.metadata.resource_version;
                    attempt += 1;
                }
                outcome => break outcome?,
            }
        };
        self.base_version = written.metadata.resource_version;
        // The stored form (times at second precision), to compare later reads with.
        self.current = written.status.or(Some(next));
        Ok(())
    }
}

/// The 409 reported when another writer changed the status during a pass.
fn conflict_of(fresh: &CoderProvisioner) -> Box<kube::core::Status> {
    let message = format!(
        "the status of {} changed during this pass (resourceVersion {})",
        object_key(fresh),
        fresh.metadata.resource_version.as_deref().unwrap_or("?")
    );
    kube::core::Status::failure(&message, "Conflict")
        .with_code(409)
        .boxed()
}

/// One full pass for a live CR. The status is written at the end whatever the outcome.
async fn apply_pass(cached: &CoderProvisioner, ctx: &Context) -> Result<Action, Error> {
    // Every decision is made from the API server's copy: the watch cache can predate this
    // operator's own last status write (a key recorded moments ago), and a key decided from it
    // would be a second key.
    let Some(live) = dereference::live_provisioner(&ctx.client, cached).await? else {
        return Ok(Action::await_change());
    };
    let deleted = live.metadata.deletion_timestamp.is_some()
        && !seeded::active(Bug::DeletedWithoutFinalizerReconciled);
    if deleted || live.metadata.uid != cached.metadata.uid {
        // Its deletion, or the creation of its namesake, starts a pass of its own.
        return Ok(Action::await_change());
    }
    let cr = &live;
    let names = Names::for_provisioner(cr);
    let observed = dereference::observe(&ctx.client, cr, &names).await?;
    let mut report = PassReport::default();
    let mut writer = StatusWriter {
        ctx,
        cr,
        base_version: cr.metadata.resource_version.clone(),
        current: cr.status.clone(),
    };
    let mut deployment = observed.deployment.clone();
    let outcome = run_pipeline(
        cr,
        ctx,
        &names,
        &observed,
        &mut report,
        &mut writer,
        &mut deployment,
    )
    .await;
    if let Err(error) = &outcome
        && error.is_fenced()
        && !seeded::active(Bug::PausedLeaderUnfenced)
    {
        warn!(provisioner = %object_key(cr), %error, "leadership ended during the pass; leaving the rest to the new leader");
        return outcome.map(|_| Action::await_change());
    }
    if seeded::active(Bug::KeyStatusNotPersistedEarly) && outcome.is_err() {
        report.key = None;
    }
    // R-RL-3: any outcome other than a 429 (or waiting one out) ends a run of 429s.
    let mut ends_rate_limits = !matches!(outcome, Ok(Step::RateLimited(_) | Step::HeldOff(_)));
    if seeded::active(Bug::BackoffNotResetAfterSuccess) && outcome.is_ok() {
        ends_rate_limits = false;
    }
    if ends_rate_limits {
        ctx.rate_limits.reset(&object_key(cr));
    }
    // Error backoff grows until a pass gets past the key step or stops at a gate; a pass that
    // only waited out a hold-off proves nothing.
    if matches!(outcome, Ok(Step::Done | Step::Blocked(_))) {
        ctx.failures.reset(&object_key(cr));
    }
    if matches!(outcome, Ok(Step::Done)) {
        ctx.key_hold_off.clear(&object_key(cr));
    }
    for failure in status::newly_failed(cr.status.as_ref(), &report) {
        ctx.event(
            cr,
            EventType::Warning,
            failure.reason,
            "Reconcile",
            failure.message.clone(),
        )
        .await;
    }
    writer.write(&report, deployment.as_ref()).await?;
    match outcome? {
        Step::Done => Ok(Action::requeue(RESYNC)),
        Step::Blocked(delay) | Step::RateLimited(delay) | Step::HeldOff(delay) => {
            Ok(Action::requeue(delay))
        }
    }
}

/// How the pipeline ended (errors are `Err`).
enum Step {
    Done,
    /// A gate did not pass; look again after the delay (no reconcile error, R-PRE-5).
    Blocked(Duration),
    RateLimited(Duration),
    /// A key call is due but an earlier 429 or failure asks to wait this long first.
    HeldOff(Duration),
}

fn blocked(report: &mut PassReport, blocked: Blocked) -> Step {
    report.set(blocked.condition);
    Step::Blocked(blocked.retry_after)
}

async fn run_pipeline(
    cr: &CoderProvisioner,
    ctx: &Context,
    names: &Names,
    observed: &dereference::Observed,
    report: &mut PassReport,
    writer: &mut StatusWriter<'_>,
    deployment: &mut Option<Deployment>,
) -> Result<Step, Error> {
    // Gate 1: control plane. Gate 2: operator access.
    let (control_plane, condition) = match gates::control_plane(
        &cr.spec.control_plane_ref.name,
        observed.control_plane.as_ref(),
    ) {
        Ok(passed) => passed,
        Err(failure) => return Ok(blocked(report, failure)),
    };
    report.set(condition);
    let (token, condition) =
        match gates::operator_access(control_plane.object, observed.token_secret.as_ref()) {
            Ok(passed) => passed,
            Err(failure) => return Ok(blocked(report, failure)),
        };
    report.set(condition);

    // Gate 3: credential Secrets (D-2). While False: no key call, no Deployment change.
    let refs = credentials::credential_refs(
        cr.spec.extra_env.as_deref().unwrap_or_default(),
        &names.key_secret,
    );
    match credentials::check_credentials(&refs, &observed.credential_secrets, &control_plane.url) {
        Ok(()) => report.set(ConditionUpdate::ok(
            condition::CREDENTIALS_READY,
            reason::CREDENTIALS_VALID,
            "every Secret named by spec.extraEnv is allowed for the control plane origin",
        )),
        Err((reason, message)) => {
            let failure = Blocked {
                condition: ConditionUpdate::failed(condition::CREDENTIALS_READY, reason, message),
                retry_after: gates::CREDENTIALS_RETRY,
            };
            if !seeded::active(Bug::DeploymentUpdatedDespiteInvalidCredentials) {
                return Ok(blocked(report, failure));
            }
            report.set(failure.condition);
        }
    }

    // Gate 4: entitlement. From here on the pass may wait on coderd: it needs one of its
    // coderd's slots, or gives its reconcile slot back for now.
    let coderd_slot = ctx.coderd_slots.try_take(&control_plane.url, &token);
    if coderd_slot.is_none() && !seeded::active(Bug::HangingCoderdStarvesOthers) {
        return Ok(Step::HeldOff(CODERD_BUSY_RETRY));
    }
    let coderd = ctx.coderd(&control_plane.url, &token);
    let entitlement =
        match gates::entitlement_from_control_plane(control_plane.object, Timestamp::now()) {
            EntitlementSource::Fresh(outcome) => outcome,
            EntitlementSource::AskCoderd => match &coderd {
                Ok(client) => {
                    let answer = ctx
                        .entitlements
                        .reading(&control_plane.url, &token, || async {
                            let entitlements = client.entitlements().await?;
                            Ok(entitlements.external_provisioner_daemons())
                        })
                        .await;
                    gates::entitlement_from_coderd(answer.as_ref().cloned())
                }
                Err(error) => gates::entitlement_from_coderd(Err(error)),
            },
        };
    match entitlement {
        Ok(condition) => report.set(condition),
        Err(failure)
            if seeded::active(Bug::NotEntitledIgnored)
                && failure.condition.reason == reason::NOT_ENTITLED =>
        {
            report.set(failure.condition)
        }
        Err(failure) => return Ok(blocked(report, failure)),
    }

    // Gate 5: the key Secret must be ours or absent (D-3), checked before any key request.
    let uid = cr.metadata.uid.as_deref().unwrap_or_default();
    let (secret_state, condition) = match gates::key_secret_ownership(
        &names.key_secret,
        &names.key_secret_data_key,
        observed.key_secret.as_ref(),
        uid,
    ) {
        Ok(passed) => passed,
        Err(failure) => {
            if seeded::active(Bug::RefusedSecretListsKeys) {
                seeded::list_keys_anyway(coderd.as_ref().ok(), &names.organization).await;
            }
            return Ok(blocked(report, failure));
        }
    };

    // Gate 6: the provisioner key.
    let inputs = ChildInputs {
        cr,
        names,
        control_plane_url: &control_plane.url,
        control_plane_image: control_plane.image.as_deref(),
    };
    let tags = cr.spec.tags.clone().unwrap_or_default();
    let desired = DesiredKey {
        organization_name: names.organization.clone(),
        key_name: names.key_name.clone(),
        tags_hash: names::tags_hash(&tags),
        tags,
        control_plane_ref: cr.spec.control_plane_ref.name.clone(),
        control_plane_url: control_plane.url.clone(),
    };
    let previous = cr.status.clone().unwrap_or_default();
    let mut action = keys::decide(&desired, &previous, &secret_state);
    if seeded::active(Bug::KeyRotatedOnRestart) {
        action = seeded::rotate_on_first_sight(&object_key(cr), action, &previous, &desired);
    }
    let key_value = match action {
        KeyAction::Reuse(value) => {
            report.set(condition);
            value
        }
        KeyAction::Establish { cause, mut retire } => {
            if let Some(wait) = ctx.key_hold_off.remaining(&object_key(cr), Instant::now()) {
                return Ok(Step::HeldOff(wait));
            }
            let client = coderd.map_err(|error| key_failed(report, error))?;
            if seeded::active(Bug::DriftRotationByRecordedName)
                && matches!(cause, keys::KeyCause::Drift(_))
            {
                retire = seeded::retire_by_recorded_name(&client, retire, &previous).await;
            }
            info!(provisioner = %object_key(cr), %cause, "establishing provisioner key");
            let established = keys::establish(
                &client,
                |url| ctx.coderd(url, &token),
                &desired,
                &cause,
                retire.as_ref(),
                &mut KeyEventPublisher { ctx, cr },
            )
            .await;
            let established = match established {
                Ok(established) => established,
                Err(CoderdError::RateLimited { retry_after }) => {
                    let attempt = ctx.rate_limits.bump(&object_key(cr));
                    let mut delay =
                        backoff::rate_limit_delay(attempt, retry_after, backoff::random_jitter());
                    if seeded::active(Bug::RateLimitRetriedWithoutBackoff) {
                        delay = Duration::from_millis(100);
                    }
                    ctx.key_hold_off
                        .hold(&object_key(cr), Instant::now() + delay);
                    report.set(ConditionUpdate::failed(
                        condition::KEY_READY,
                        reason::RATE_LIMITED,
                        RATE_LIMITED_MESSAGE,
                    ));
                    return Ok(Step::RateLimited(delay));
                }
                Err(error) => return Err(key_failed(report, error)),
            };
            let secret = children::key_secret(&inputs, established.plaintext.expose());
            if !seeded::active(Bug::PausedLeaderUnfenced) {
                ctx.fence.check().await?;
            }
            if let Err(error) = apply::apply(&ctx.client, &ctx.field_manager, &secret).await {
                let fate = forget_unstored_key(&client, &established.record).await;
                report.set(ConditionUpdate::failed(
                    condition::KEY_READY,
                    reason::KEY_FAILED,
                    format!(
                        "the provisioner key Secret {:?} could not be written ({error}); {fate}",
                        names.key_secret
                    ),
                ));
                return Err(error.into());
            }
            report.set(condition);
            let secret_ref = SecretKeyRef {
                name: names.key_secret.clone(),
                key: Some(names.key_secret_data_key.clone()),
            };
            report.key = Some((established.record, secret_ref));
            report.set(key_ready());
            // R-KEY-7: record the key before anything else can fail, so retries reuse it.
            if !seeded::active(Bug::KeyStatusNotPersistedEarly) {
                writer.write(report, deployment.as_ref()).await?;
            }
            established.plaintext
        }
    };
    report.set(key_ready());

    // Children in fixed order; the Deployment last. Each is written only when the cluster's copy
    // differs (the Deployment's was read at the start of the pass). A refusal (an invalid spec
    // field, a missing permission) is reported in the status, not only in the log.
    let refused = |kind: &str, name: &str, error: kube::Error, report: &mut PassReport| {
        if !seeded::active(Bug::ChildRefusalOnlyLogged) {
            report.refused = Some(format!("applying {kind} {name:?} failed: {error}"));
        }
        Error::from(error)
    };
    let service_account = children::service_account(&inputs);
    apply::ensure(&ctx.client, &ctx.field_manager, &service_account)
        .await
        .map_err(|e| refused("ServiceAccount", &names.service_account, e, report))?;
    apply::ensure(&ctx.client, &ctx.field_manager, &children::role(&inputs))
        .await
        .map_err(|e| refused("Role", &names.workload, e, report))?;
    apply::ensure(
        &ctx.client,
        &ctx.field_manager,
        &children::role_binding(&inputs),
    )
    .await
    .map_err(|e| refused("RoleBinding", &names.workload, e, report))?;
    let applied = apply::apply_unless_current(
        &ctx.client,
        &ctx.field_manager,
        &children::deployment(&inputs, key_value.expose()),
        observed.deployment.as_ref(),
    )
    .await
    .map_err(|e| refused("Deployment", &names.workload, e, report))?;
    *deployment = Some(applied);
    report.reached_deployment = true;
    Ok(Step::Done)
}

/// A key created in this pass whose Secret could not be written exists only in coderd: it is
/// deleted by id at once, or every retry would create another (the next create answers 409 and
/// replaces it). Returns what became of it, for the condition message.
async fn forget_unstored_key(client: &CoderdClient, record: &keys::KeyRecord) -> String {
    if seeded::active(Bug::UnstoredKeyLeftInCoderd) {
        return "the new key was left in coderd".to_owned();
    }
    match keys::delete_by_id(client, &record.organization_id, &record.key_id).await {
        Ok(_) => "the new key was deleted from coderd".to_owned(),
        Err(error) => {
            warn!(key = %record.key_name, %error, "could not delete a key whose Secret could not be written");
            format!("deleting the new key from coderd failed too ({error})")
        }
    }
}

fn key_ready() -> ConditionUpdate {
    ConditionUpdate::ok(
        condition::KEY_READY,
        reason::KEY_READY,
        "the provisioner key exists in coderd",
    )
}

fn key_failed(report: &mut PassReport, error: CoderdError) -> Error {
    report.set(ConditionUpdate::failed(
        condition::KEY_READY,
        reason::KEY_FAILED,
        format!("reconciling the provisioner key failed: {error}"),
    ));
    Error::Key(error)
}

/// Publishes the key step's Events as they happen (see [`keys::KeyEventSink`]).
struct KeyEventPublisher<'a> {
    ctx: &'a Context,
    cr: &'a CoderProvisioner,
}

impl keys::KeyEventSink for KeyEventPublisher<'_> {
    async fn record(&mut self, event: KeyEvent) {
        let (type_, reason, action, note) = match &event {
            KeyEvent::Created { name } => (
                EventType::Normal,
                "ProvisionerKeyCreated",
                "CreateKey",
                format!("created provisioner key {name:?} in coderd"),
            ),
            KeyEvent::Retired { name } => (
                EventType::Normal,
                "ProvisionerKeyRotated",
                "DeleteKey",
                format!("deleted previous provisioner key {name:?}"),
            ),
            KeyEvent::RetireFailed {
                organization_id,
                error,
            } => (
                EventType::Warning,
                "ProvisionerKeyDeleteFailed",
                "DeleteKey",
                format!(
                    "could not delete the previous provisioner key in organization {organization_id}: {error}; it may remain in coderd"
                ),
            ),
            KeyEvent::ReplacedUnrecorded { name } => (
                EventType::Warning,
                "ReplacedUnrecordedKey",
                "DeleteKey",
                format!(
                    "replacing provisioner key {name:?} that exists in coderd without a record in this CoderProvisioner's status"
                ),
            ),
        };
        self.ctx.event(self.cr, type_, reason, action, note).await;
    }
}

/// Deletion (§12): best-effort removal of the recorded key; never blocks the finalizer.
async fn cleanup(cr: &CoderProvisioner, ctx: &Arc<Context>) -> Result<Action, Error> {
    let key = object_key(cr);
    ctx.failures.reset(&key);
    ctx.rate_limits.reset(&key);
    ctx.key_hold_off.clear(&key);
    let status = cr.status.clone().unwrap_or_default();
    let mut recorded = keys::recorded_key(&status, "");
    if seeded::active(Bug::CleanupWithoutKeyCallsCoderd) {
        recorded = recorded.or_else(|| Some(seeded::key_guessed_from_spec(cr)));
    }
    let Some(recorded) = recorded else {
        info!(provisioner = %object_key(cr), "no provisioner key recorded; nothing to clean up in coderd");
        return Ok(Action::await_change());
    };
    let key_name = status
        .provisioner_key_name
        .clone()
        .unwrap_or_else(|| "<name>".to_owned());
    let organization = status
        .organization_name
        .clone()
        .unwrap_or_else(|| recorded.organization_id.clone());
    let manual = format!("coder provisioner keys delete {key_name} --org {organization}");
    if seeded::active(Bug::CleanupInBackground) {
        let (cr, ctx) = (cr.clone(), Arc::clone(ctx));
        tokio::spawn(async move { delete_recorded_key(&cr, &ctx, &status, &recorded).await });
        return Ok(Action::await_change());
    }
    let outcome = delete_recorded_key(cr, ctx, &status, &recorded).await;
    match outcome {
        Ok(Some(name)) => {
            ctx.event(
                cr,
                EventType::Normal,
                "ProvisionerKeyDeleted",
                "DeleteKey",
                format!("deleted provisioner key {name:?} from coderd"),
            )
            .await;
        }
        Ok(None) => {
            info!(provisioner = %object_key(cr), "recorded provisioner key is already gone")
        }
        Err(why) => {
            // A replica whose leadership ended keeps the finalizer: the clean-up is the new
            // leader's (its delete would be the one that counts).
            if !seeded::active(Bug::PausedLeaderUnfenced) {
                ctx.fence.check().await?;
            }
            let note =
                format!("provisioner key may remain in coderd ({why}); delete it with `{manual}`");
            ctx.event(
                cr,
                EventType::Warning,
                "ProvisionerKeyCleanupFailed",
                "DeleteKey",
                note,
            )
            .await;
            if seeded::failed_cleanup_keeps_finalizer(&why) {
                return Err(Error::Key(CoderdError::Unreachable { detail: why }));
            }
        }
    }
    Ok(Action::await_change())
}

/// Deletes the recorded key; `Err` says (without secrets) why it could not.
async fn delete_recorded_key(
    cr: &CoderProvisioner,
    ctx: &Context,
    status: &CoderProvisionerStatus,
    recorded: &keys::RecordedKey,
) -> Result<Option<String>, String> {
    let namespace = cr.namespace().unwrap_or_default();
    let control_plane_name = status
        .control_plane_ref_name
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| cr.spec.control_plane_ref.name.clone());
    let control_plane = dereference::control_plane(&ctx.client, &namespace, &control_plane_name)
        .await
        .map_err(|e| format!("reading CoderControlPlane {control_plane_name:?} failed: {e}"))?
        .ok_or_else(|| format!("CoderControlPlane {control_plane_name:?} no longer exists"))?;
    let token_secret = dereference::token_secret(&ctx.client, &namespace, Some(&control_plane))
        .await
        .map_err(|e| format!("reading the operator token Secret failed: {e}"))?;
    let (token, _) = gates::operator_access(&control_plane, token_secret.as_ref())
        .map_err(|blocked| blocked.condition.message)?;
    let url = if recorded.control_plane_url.is_empty() {
        control_plane
            .status
            .as_ref()
            .and_then(|s| s.url.clone())
            .unwrap_or_default()
    } else {
        recorded.control_plane_url.clone()
    };
    let client = ctx.coderd(&url, &token).map_err(|e| e.to_string())?;
    if seeded::active(Bug::CleanupBySpecKeyName) {
        return seeded::delete_by_spec_name(&client, cr, &recorded.organization_id).await;
    }
    if seeded::active(Bug::CleanupByRecordedName) {
        return seeded::delete_by_recorded_name(&client, status, &recorded.organization_id).await;
    }
    let mut organization_id = recorded.organization_id.clone();
    if seeded::active(Bug::CleanupOrganizationFromSpec) {
        organization_id = seeded::organization_from_spec(&client, cr).await?;
    }
    keys::delete_by_id(&client, &organization_id, &recorded.key_id)
        .await
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case::resync(Ok(Action::requeue(RESYNC)), "ok")]
    #[case::waits_for_a_change(Ok(Action::await_change()), "ok")]
    #[case::back_early(Ok(Action::requeue(Duration::from_secs(2))), "requeue")]
    #[case::failed(Err(Error::Key(CoderdError::RateLimited { retry_after: None })), "error")]
    fn each_outcome_has_its_metric_label(
        #[case] outcome: Result<Action, Error>,
        #[case] label: &str,
    ) {
        assert_eq!(outcome_label(&outcome), label);
    }
}
