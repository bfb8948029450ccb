//! The CoderProvisioner reconciler. One pass over a live CR runs these stages, each with typed
//! inputs and outputs:
//!
//! 1. `dereference` (I/O): the CR's objects; once the prerequisites passed, a coderd slot, the
//!    coderd client and the entitlement reading;
//! 2. `gates` (pure, D-1): each passes facts on to the next stage or blocks the pass;
//! 3. `keys`: `decide` (pure) what the key needs, `establish` it in coderd (I/O), store it in
//!    its Secret and record it in the status at once (R-KEY-7);
//! 4. `children` (pure): the objects to apply;
//! 5. `apply` (I/O): server-side apply in a fixed order, the Deployment last;
//! 6. `status` (pure): the next status, written once per change.
//!
//! The pass yields a `PassOutcome`: its report, the Deployment as it left it, and how it ended.
//! Shared between passes: `entitlement_cache` (one entitlements request per coderd and window)
//! and `coderd_slots` (a bound on the reconcile slots one coderd's passes hold). Each pass reads
//! its CR from the API server and writes its status conditionally on that read's
//! resourceVersion, so nothing is decided from a stale copy.
mod apply;
mod backoff;
mod children;
mod cleanup;
mod coderd_slots;
mod context;
mod credentials;
mod dereference;
mod entitlement_cache;
mod error;
mod gates;
mod keys;
mod names;
mod own_writes;
mod status;

#[cfg(test)]
pub(crate) mod fixtures;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{self, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use tracing::{debug, info, warn};

use crate::api::{
    CoderProvisioner, CoderProvisionerStatus, FINALIZER, SecretKeyRef, condition, reason,
};
use crate::coderd::{CoderdClient, CoderdError, SecretString};

use self::coderd_slots::Slot;
pub use self::context::{Context, object_key};
pub use self::error::{CleanupError, Error, KeyError, StatusError};
// What the controller needs besides the pass itself: the state shared between passes and the
// names of what triggers them.
pub use self::backoff::{AttemptCounters, HoldOff};
pub use self::coderd_slots::CoderdSlots;
pub use self::credentials::credential_refs;
pub use self::entitlement_cache::EntitlementCache;
pub use self::gates::ENTITLEMENT_WINDOW;
pub use self::names::Names;
pub use self::own_writes::OwnWrites;

use self::children::{ChildInputs, Workload};
use self::dereference::Observed;
use self::gates::{Blocked, ConditionUpdate, ControlPlaneView, EntitlementReading, KeySecretState};
use self::keys::{DesiredKey, KeyAction, KeyEvent};
use self::status::PassReport;

/// Periodic re-check of a healthy CR (every trigger that matters also arrives through a watch).
const RESYNC: Duration = Duration::from_secs(300);
/// When a pass finds all of its coderd's slots taken, it comes again after this long.
const CODERD_BUSY_RETRY: Duration = Duration::from_secs(2);
/// The value the key Secret's dry-run carries (no key exists yet; the value is not validated).
const DRY_RUN_PLAINTEXT: &str = "dry-run-placeholder";
/// Message of R-RL-1.
pub const RATE_LIMITED_MESSAGE: &str = "Coder API rate limited while reconciling provisioner key";

/// Entry point for the controller: finalizer handling, then apply or cleanup.
pub async fn reconcile(cached: Arc<CoderProvisioner>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    // Inside kube-runtime's span, which names what started the pass.
    debug!(
        resource_version = cached.metadata.resource_version.as_deref(),
        "pass starting"
    );
    let outcome = async {
        // Every decision is made from the API server's copy, the finalizer's too: the watch
        // cache can predate this operator's own last write (a finalizer added or a key recorded
        // moments ago); a finalizer added to that copy fails its patch's test, and a key decided
        // from it would be a second key.
        let live = dereference::live_provisioner(&ctx.client, &cached)
            .await
            .map_err(Error::Dereference)?;
        let Some(live) = live.filter(|live| live.metadata.uid == cached.metadata.uid) else {
            // Its deletion, or the creation of its namesake, starts a pass of its own.
            return Ok(Action::await_change());
        };
        let live = if needs_finalizer(&live) {
            ctx.fence.check().await.map_err(Error::Fenced)?;
            // Added here rather than by `finalizer`, which ends the pass after adding it: the
            // pass goes on at once, and the addition's echo starts no pass.
            let added = apply::add_finalizer(&ctx.client, &live, FINALIZER);
            ctx.own_writes
                .track(&live, added)
                .await
                .map_err(|error| Box::new(finalizer::Error::AddFinalizer(error)))?
        } else {
            live
        };
        let namespace = live.namespace().unwrap_or_default();
        let api: Api<CoderProvisioner> = Api::namespaced(ctx.client.clone(), &namespace);
        finalizer(&api, FINALIZER, Arc::new(live), |event| async {
            match event {
                finalizer::Event::Apply(cr) => apply_pass(&cr, &ctx).await,
                finalizer::Event::Cleanup(cr) => cleanup::cleanup(&cr, &ctx).await,
            }
        })
        .await
        .map_err(|error| Error::Finalizer(Box::new(error)))
    }
    .await;
    if let Err(error) = &outcome {
        ctx.metrics.reconcile_failed(error.metric_label());
    }
    ctx.metrics
        .reconcile_finished(outcome_label(&outcome), started.elapsed().as_secs_f64());
    outcome
}

fn needs_finalizer(cr: &CoderProvisioner) -> bool {
    cr.metadata.deletion_timestamp.is_none() && !cr.finalizers().iter().any(|f| f == FINALIZER)
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

/// How soon a pass that met a stale read starts over.
const STALE_RETRY: Duration = Duration::from_millis(200);

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

impl<'a> StatusWriter<'a> {
    fn new(ctx: &'a Context, cr: &'a CoderProvisioner) -> Self {
        Self {
            ctx,
            cr,
            base_version: cr.metadata.resource_version.clone(),
            current: cr.status.clone(),
        }
    }

    async fn write(
        &mut self,
        report: &PassReport,
        deployment: Option<&Deployment>,
    ) -> Result<(), StatusError> {
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
        // Every status write, failure statuses included, only while this replica leads: a
        // deposed leader's status would be written over the new leader's pass (the precondition
        // on the CR's resourceVersion does not see a pass that has not written yet).
        self.ctx.fence.check().await?;
        let mut attempt = 1;
        let written = loop {
            let write = apply::apply_status(
                &self.ctx.client,
                &self.ctx.field_manager,
                self.cr,
                &next,
                self.base_version.as_deref(),
            );
            match self.ctx.own_writes.track(self.cr, write).await {
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
                    tracing::debug!(provisioner = %object_key(self.cr), attempt,
                        "the CR changed since it was read (not its status); writing the status again");
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
async fn apply_pass(cr: &CoderProvisioner, ctx: &Context) -> Result<Action, Error> {
    let names = Names::for_provisioner(cr);
    let observed = dereference::observe(&ctx.client, cr, &names)
        .await
        .map_err(Error::Dereference)?;
    let pass = Pass {
        ctx,
        cr,
        key: object_key(cr),
        names,
        observed,
    };
    let mut writer = StatusWriter::new(ctx, cr);
    let PassOutcome {
        report,
        deployment,
        step,
    } = pass.run(&mut writer).await;
    if let Err(error) = &step
        && error.is_fenced()
    {
        warn!(provisioner = %pass.key, %error, "leadership ended during the pass; leaving the rest to the new leader");
        return step.map(|_| Action::await_change());
    }
    if let Err(error @ Error::Stale(_)) = &step {
        // No status from a stale pass: the next one, from fresh reads, decides.
        info!(provisioner = %pass.key, %error, "starting over from fresh reads");
        return Ok(Action::requeue(STALE_RETRY));
    }
    if let Ok(deferred @ Step::Deferred(_)) = step {
        return Ok(deferred.action());
    }
    // What this pass found is the leader's to announce and record (see `StatusWriter::write`).
    if let Err(fenced) = ctx.fence.check().await {
        warn!(provisioner = %pass.key, error = %fenced, "leadership ended during the pass; writing no status");
        return Err(StatusError::Fenced(fenced).into());
    }
    pass.settle_counters(&step);
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
    Ok(step?.action())
}

/// What one pass learned and did.
struct PassOutcome {
    report: PassReport,
    /// The Deployment as this pass applied it, else as the pass read it.
    deployment: Option<Deployment>,
    step: Result<Step, Error>,
}

/// How a pass ended (errors are `Err`).
enum Step {
    Done,
    /// A gate did not pass; look again after the delay (no reconcile error, R-PRE-5).
    Blocked(Duration),
    RateLimited(Duration),
    /// A key call is due but must wait this long first.
    HeldOff(Duration),
    /// The coderd's slots are taken: the pass gave its reconcile slot back before deciding
    /// anything, so it has nothing to write (a status write here cost a burst of new CRs a
    /// fourth status write each).
    Deferred(Duration),
}

impl Step {
    fn action(self) -> Action {
        match self {
            Step::Done => Action::requeue(RESYNC),
            Step::Blocked(delay)
            | Step::RateLimited(delay)
            | Step::HeldOff(delay)
            | Step::Deferred(delay) => Action::requeue(delay),
        }
    }
}

/// Why the stages ended before the Deployment: a wait, or a failure.
enum Stop {
    Wait(Step),
    Failed(Error),
}

impl<E: Into<Error>> From<E> for Stop {
    fn from(error: E) -> Self {
        Self::Failed(error.into())
    }
}

/// Records the gate that blocked the pass.
fn blocked(report: &mut PassReport, blocked: Blocked) -> Stop {
    report.set(blocked.condition);
    Stop::Wait(Step::Blocked(blocked.retry_after))
}

/// Gates 1–3 passed: where the coderd is and the token to reach it with.
struct Prerequisites<'o> {
    control_plane: ControlPlaneView<'o>,
    token: SecretString,
}

/// The pass's hold on its coderd, and what it read there for gate 4.
struct Coderd {
    /// One of the coderd's reconcile slots, held until the pass ends.
    _slot: Slot,
    client: Result<CoderdClient, CoderdError>,
    /// The operator token, for a client of another coderd (a recorded key may live there).
    token: SecretString,
    entitlement: EntitlementReading,
}

/// Gates 4–5 passed: the key Secret as the key stage finds it.
struct Cleared {
    key_secret: KeySecretState,
    /// `KeySecretReady`, set once the Secret holds the key the pass ends with.
    key_secret_ready: ConditionUpdate,
}

/// What one pass works from, fixed for its duration.
struct Pass<'a> {
    ctx: &'a Context,
    /// The CR as the API server had it when the pass began.
    cr: &'a CoderProvisioner,
    /// `namespace/name`, the key of the per-CR counters.
    key: String,
    names: Names,
    observed: Observed,
}

impl Pass<'_> {
    async fn run(&self, writer: &mut StatusWriter<'_>) -> PassOutcome {
        let mut report = PassReport::default();
        let (deployment, step) = match self.stages(writer, &mut report).await {
            Ok(applied) => {
                report.reached_deployment = true;
                (Some(applied), Ok(Step::Done))
            }
            Err(Stop::Wait(step)) => (self.observed.deployment.clone(), Ok(step)),
            Err(Stop::Failed(error)) => (self.observed.deployment.clone(), Err(error)),
        };
        PassOutcome {
            report,
            deployment,
            step,
        }
    }

    /// The stages after the first reads, in order; `report` collects what each found.
    async fn stages(
        &self,
        writer: &mut StatusWriter<'_>,
        report: &mut PassReport,
    ) -> Result<Deployment, Stop> {
        let prerequisites = self.prerequisites(report)?;
        let coderd = self.reach_coderd(&prerequisites).await?;
        let cleared = self.clearance(&coderd, report).await?;
        let inputs = ChildInputs {
            cr: self.cr,
            names: &self.names,
            control_plane_url: &prerequisites.control_plane.url,
            control_plane_image: prerequisites.control_plane.image.as_deref(),
        };
        let key_value = self.keys(&inputs, &coderd, cleared, writer, report).await?;
        let workload = children::workload(&inputs, key_value.expose());
        self.apply_children(&workload, report).await
    }

    /// Gates 1–3 (pure): control plane, operator access, credential Secrets (D-2: while they
    /// are refused, no key call and no Deployment change).
    fn prerequisites(&self, report: &mut PassReport) -> Result<Prerequisites<'_>, Stop> {
        let observed = &self.observed;
        let (control_plane, condition) = gates::control_plane(
            &self.cr.spec.control_plane_ref.name,
            observed.control_plane.as_ref(),
        )
        .map_err(|failure| blocked(report, failure))?;
        report.set(condition);
        let (token, condition) =
            gates::operator_access(control_plane.object, observed.token_secret.as_ref())
                .map_err(|failure| blocked(report, failure))?;
        report.set(condition);
        let refs = credentials::credential_refs(
            self.cr.spec.extra_env.as_deref().unwrap_or_default(),
            &self.names.key_secret,
        );
        let condition = gates::credentials(&refs, &observed.credential_secrets, &control_plane.url)
            .map_err(|failure| blocked(report, failure))?;
        report.set(condition);
        Ok(Prerequisites {
            control_plane,
            token,
        })
    }

    /// From here on the pass may wait on coderd: it takes one of its coderd's slots, or gives
    /// its reconcile slot back for now. Then the reads of gate 4.
    async fn reach_coderd(&self, prerequisites: &Prerequisites<'_>) -> Result<Coderd, Stop> {
        let (url, token) = (&prerequisites.control_plane.url, &prerequisites.token);
        let Some(slot) = self
            .ctx
            .coderd_slots
            .try_take(url, token, &ObjectRef::from_obj(self.cr))
        else {
            return Err(Stop::Wait(Step::Deferred(CODERD_BUSY_RETRY)));
        };
        let client = self.ctx.coderd(url, token);
        let entitlement = dereference::entitlement(
            &self.ctx.entitlements,
            prerequisites.control_plane.object,
            url,
            token,
            client.as_ref(),
            Timestamp::now(),
        )
        .await;
        Ok(Coderd {
            _slot: slot,
            client,
            token: token.clone(),
            entitlement,
        })
    }

    /// Gates 4–5 (pure): the entitlement, then the key Secret must be ours or absent (D-3),
    /// both before any key request.
    async fn clearance(&self, coderd: &Coderd, report: &mut PassReport) -> Result<Cleared, Stop> {
        let condition =
            gates::entitlement(&coderd.entitlement).map_err(|failure| blocked(report, failure))?;
        report.set(condition);
        let ownership = gates::key_secret_ownership(
            &self.names.key_secret,
            &self.names.key_secret_data_key,
            self.observed.key_secret.as_ref(),
            self.cr.metadata.uid.as_deref().unwrap_or_default(),
        );
        let (key_secret, key_secret_ready) =
            ownership.map_err(|failure| blocked(report, failure))?;
        Ok(Cleared {
            key_secret,
            key_secret_ready,
        })
    }

    /// The key stage: decide (pure) whether the Secret's key serves; if not, establish a new
    /// one, store it and record it in the status before anything else can fail (R-KEY-7).
    /// Returns the key the daemons use.
    async fn keys(
        &self,
        inputs: &ChildInputs<'_>,
        coderd: &Coderd,
        cleared: Cleared,
        writer: &mut StatusWriter<'_>,
        report: &mut PassReport,
    ) -> Result<SecretString, Stop> {
        let tags: BTreeMap<String, String> = self.cr.spec.tags.clone().unwrap_or_default();
        let desired = DesiredKey {
            organization_name: self.names.organization.clone(),
            key_name: self.names.key_name.clone(),
            tags_hash: names::tags_hash(&tags),
            tags,
            control_plane_ref: self.cr.spec.control_plane_ref.name.clone(),
            control_plane_url: inputs.control_plane_url.to_owned(),
        };
        let previous = self.cr.status.clone().unwrap_or_default();
        let mut action = keys::decide(&desired, &previous, &cleared.key_secret);
        if let KeyAction::Identify {
            plaintext,
            control_plane_url,
        } = action
        {
            if let Some(wait) = self.ctx.key_hold_off.remaining(&self.key, Instant::now()) {
                return Err(Stop::Wait(Step::HeldOff(wait)));
            }
            let url = (control_plane_url.as_str(), inputs.control_plane_url);
            action = match self
                .identify_key(coderd, &plaintext, url, previous, writer, report)
                .await?
            {
                Some(identified) => keys::decide(&desired, &identified, &cleared.key_secret),
                None => KeyAction::Establish {
                    cause: keys::KeyCause::KeyRefused,
                    retire: None,
                },
            };
        }
        let key_value = match action {
            KeyAction::Reuse(value) => {
                report.set(cleared.key_secret_ready);
                value
            }
            KeyAction::Establish { cause, retire } => {
                if let Some(wait) = self.ctx.key_hold_off.remaining(&self.key, Instant::now()) {
                    return Err(Stop::Wait(Step::HeldOff(wait)));
                }
                let established = self
                    .establish_key(inputs, coderd, &desired, cause, retire, report)
                    .await?;
                report.set(cleared.key_secret_ready);
                let secret_ref = SecretKeyRef {
                    name: self.names.key_secret.clone(),
                    key: Some(self.names.key_secret_data_key.clone()),
                };
                report.key = Some((established.record, secret_ref));
                let Some(lookup_failed) = established.unidentified else {
                    report.set(key_ready());
                    // R-KEY-7: record the key before anything else can fail, so retries reuse it.
                    writer
                        .write(report, self.observed.deployment.as_ref())
                        .await?;
                    return Ok(established.plaintext);
                };
                // The key is stored: record what is known of it and stop. The next pass learns
                // its id with the key from the Secret (`Identify`) instead of creating another.
                let stop = match lookup_failed {
                    CoderdError::RateLimited { retry_after } => {
                        self.rate_limited(report, retry_after)
                    }
                    error => {
                        report.set(ConditionUpdate::failed(
                            condition::KEY_READY,
                            reason::KEY_FAILED,
                            format!(
                                "provisioner key {:?} was created and stored in Secret {:?}, but looking up its id failed ({error}); the lookup is retried",
                                desired.key_name, self.names.key_secret
                            ),
                        ));
                        Stop::Failed(KeyError::Coderd(error).into())
                    }
                };
                writer
                    .write(report, self.observed.deployment.as_ref())
                    .await?;
                return Err(stop);
            }
            KeyAction::Identify { .. } => {
                unreachable!("a status that records the key's id never asks for it")
            }
        };
        report.set(key_ready());
        Ok(key_value)
    }

    /// Carries out `Identify`: the id of the key in the Secret, learned with the key itself at
    /// the coderd where it was created (`urls`: that one, and the pass's), is recorded at once
    /// (a fenced status write). Returns the status to decide from next, or `None` when coderd
    /// refuses the key (401): it is no key any more, and is replaced.
    async fn identify_key(
        &self,
        coderd: &Coderd,
        plaintext: &SecretString,
        (created_at, pass_url): (&str, &str),
        mut previous: CoderProvisionerStatus,
        writer: &mut StatusWriter<'_>,
        report: &mut PassReport,
    ) -> Result<Option<CoderProvisionerStatus>, Stop> {
        let client = if created_at == pass_url {
            coderd.client.clone()
        } else {
            self.ctx.coderd(created_at, &coderd.token)
        };
        let client = client.map_err(|error| key_failed(report, error))?;
        let key = match keys::identify(&client, plaintext).await {
            Ok(Some(key)) => key,
            Ok(None) => {
                info!(provisioner = %self.key, "coderd refused the stored provisioner key; replacing it");
                return Ok(None);
            }
            Err(CoderdError::RateLimited { retry_after }) => {
                return Err(self.rate_limited(report, retry_after));
            }
            Err(error) => {
                report.set(ConditionUpdate::failed(
                    condition::KEY_READY,
                    reason::KEY_FAILED,
                    format!(
                        "looking up the id of the provisioner key in Secret {:?} failed: {error}",
                        self.names.key_secret
                    ),
                ));
                return Err(KeyError::Coderd(error).into());
            }
        };
        let text = |value: &Option<String>| value.clone().unwrap_or_default();
        let record = keys::KeyRecord {
            organization_id: text(&previous.organization_id),
            organization_name: text(&previous.organization_name),
            key_id: Some(key.id.clone()),
            key_name: key.name,
            tags_hash: text(&previous.tags_hash),
            control_plane_ref: text(&previous.control_plane_ref_name),
            control_plane_url: text(&previous.control_plane_url),
        };
        let secret_ref = previous.secret_ref.clone().unwrap_or_else(|| SecretKeyRef {
            name: self.names.key_secret.clone(),
            key: Some(self.names.key_secret_data_key.clone()),
        });
        report.key = Some((record, secret_ref));
        writer
            .write(report, self.observed.deployment.as_ref())
            .await?;
        previous.provisioner_key_id = Some(key.id);
        Ok(Some(previous))
    }

    /// A 429 on a key request: `RateLimited` and the backoff of R-RL-2.
    fn rate_limited(&self, report: &mut PassReport, retry_after: Option<Duration>) -> Stop {
        let attempt = self.ctx.rate_limits.bump(&self.key);
        let delay = backoff::rate_limit_delay(attempt, retry_after, backoff::random_jitter());
        self.ctx
            .key_hold_off
            .hold(&self.key, Instant::now() + delay);
        report.set(ConditionUpdate::failed(
            condition::KEY_READY,
            reason::RATE_LIMITED,
            RATE_LIMITED_MESSAGE,
        ));
        Stop::Wait(Step::RateLimited(delay))
    }

    /// The key Secret this pass would write (same name, data key, owner, namespace), tried with
    /// a server-side dry-run before any key request: a Secret the API server refuses (a data key
    /// it rejects, a namespace whose Secret quota is full) would make the new key one to delete
    /// again, on every retry. The refusal is reported as a refused Secret write is.
    async fn secret_would_be_stored(
        &self,
        inputs: &ChildInputs<'_>,
        report: &mut PassReport,
    ) -> Result<(), Stop> {
        let secret = children::key_secret(inputs, DRY_RUN_PLAINTEXT);
        match apply::dry_run_apply(&self.ctx.client, &self.ctx.field_manager, &secret).await {
            Ok(_) => Ok(()),
            Err(error) => {
                report.set(ConditionUpdate::failed(
                    condition::KEY_READY,
                    reason::KEY_FAILED,
                    format!(
                        "the provisioner key Secret {:?} could not be written ({error}); no key was created in coderd",
                        self.names.key_secret
                    ),
                ));
                Err(KeyError::SecretWrite(error).into())
            }
        }
    }

    /// The operator token of the control plane the CR's key was made through, when the CR has
    /// moved to another one that still grants access: the recorded key lives at that control
    /// plane's coderd, which knows its token, not the new one's (R-KEY-15: deleted where it was
    /// applied). `None` when the move is the same control plane's URL, or the old one is gone.
    async fn recorded_control_plane_token(&self) -> Option<SecretString> {
        let recorded = self
            .cr
            .status
            .as_ref()?
            .control_plane_ref_name
            .clone()
            .filter(|name| !name.is_empty() && *name != self.cr.spec.control_plane_ref.name)?;
        let namespace = self.cr.namespace().unwrap_or_default();
        let control_plane = dereference::control_plane(&self.ctx.client, &namespace, &recorded)
            .await
            .ok()??;
        let token_secret =
            dereference::token_secret(&self.ctx.client, &namespace, Some(&control_plane))
                .await
                .ok()?;
        gates::operator_access(&control_plane, token_secret.as_ref())
            .ok()
            .map(|(token, _)| token)
    }

    /// Creates the key in coderd (retiring the recorded one) and writes it into its Secret.
    async fn establish_key(
        &self,
        inputs: &ChildInputs<'_>,
        coderd: &Coderd,
        desired: &DesiredKey,
        cause: keys::KeyCause,
        retire: Option<keys::RecordedKey>,
        report: &mut PassReport,
    ) -> Result<keys::EstablishedKey, Stop> {
        let client = match &coderd.client {
            Ok(client) => client,
            Err(error) => return Err(key_failed(report, error.clone())),
        };
        self.secret_would_be_stored(inputs, report).await?;
        info!(provisioner = %self.key, %cause, "establishing provisioner key");
        let retire_token = match &retire {
            Some(key) if key.control_plane_url != desired.control_plane_url => self
                .recorded_control_plane_token()
                .await
                .unwrap_or_else(|| coderd.token.clone()),
            _ => coderd.token.clone(),
        };
        let established = keys::establish(
            client,
            |url| self.ctx.coderd(url, &retire_token),
            desired,
            &cause,
            retire.as_ref(),
            &mut KeyEventPublisher {
                ctx: self.ctx,
                cr: self.cr,
            },
        )
        .await;
        let established = match established {
            Ok(established) => established,
            Err(CoderdError::RateLimited { retry_after }) => {
                return Err(self.rate_limited(report, retry_after));
            }
            Err(error) => return Err(key_failed(report, error)),
        };
        let secret = children::key_secret(inputs, established.plaintext.expose());
        self.ctx.fence.check().await.map_err(KeyError::from)?;
        let stored =
            apply::write_object(self.ctx, &secret, self.observed.key_secret.as_ref()).await;
        if let Err(error) = stored {
            let fate = forget_unstored_key(client, &established.record).await;
            let error = match Error::refused_as_stale(error) {
                Ok(stale) => {
                    warn!(provisioner = %self.key, %fate, "the key Secret changed since this pass read it; starting over");
                    return Err(stale.into());
                }
                Err(error) => error,
            };
            report.set(ConditionUpdate::failed(
                condition::KEY_READY,
                reason::KEY_FAILED,
                format!(
                    "the provisioner key Secret {:?} could not be written ({error}); {fate}",
                    self.names.key_secret
                ),
            ));
            return Err(KeyError::SecretWrite(error).into());
        }
        Ok(established)
    }

    /// Applies the workload in order, the Deployment last. Each is written only when the
    /// cluster's copy differs (the Deployment's was read at the start of the pass). A refusal
    /// (an invalid spec field, a missing permission) is reported in the status, not only in the
    /// log.
    async fn apply_children(
        &self,
        workload: &Workload,
        report: &mut PassReport,
    ) -> Result<Deployment, Stop> {
        let refused = |kind: &str, name: &str, error: kube::Error, report: &mut PassReport| {
            Error::refused_as_stale(error).unwrap_or_else(|error| {
                report.refused = Some(format!("applying {kind} {name:?} failed: {error}"));
                Error::Apply(error)
            })
        };
        let names = &self.names;
        // Each write kind only while this replica leads (R-HA-2); cheap while the last proof holds.
        self.ctx.fence.check().await.map_err(Error::Fenced)?;
        apply::ensure(self.ctx, &workload.service_account)
            .await
            .map_err(|e| refused("ServiceAccount", &names.service_account, e, report))?;
        apply::ensure(self.ctx, &workload.role)
            .await
            .map_err(|e| refused("Role", &names.workload, e, report))?;
        apply::ensure(self.ctx, &workload.role_binding)
            .await
            .map_err(|e| refused("RoleBinding", &names.workload, e, report))?;
        self.ctx.fence.check().await.map_err(Error::Fenced)?;
        let applied = apply::apply_unless_current(
            self.ctx,
            &workload.deployment,
            self.observed.deployment.as_ref(),
        )
        .await
        .map_err(|e| refused("Deployment", &names.workload, e, report))?;
        Ok(applied)
    }

    /// The per-CR counters after a pass.
    fn settle_counters(&self, step: &Result<Step, Error>) {
        // R-RL-3: any outcome other than a 429 (or waiting one out) ends a run of 429s.
        if !matches!(step, Ok(Step::RateLimited(_) | Step::HeldOff(_))) {
            self.ctx.rate_limits.reset(&self.key);
        }
        // Error backoff grows until a pass gets past the key step or stops at a gate; a pass
        // that only waited out a hold-off proves nothing.
        if matches!(step, Ok(Step::Done | Step::Blocked(_))) {
            self.ctx.failures.reset(&self.key);
        }
        if matches!(step, Ok(Step::Done)) {
            self.ctx.key_hold_off.clear(&self.key);
        }
    }
}

/// A key created in this pass whose Secret could not be written exists only in coderd: it is
/// deleted by id at once, or every retry would create another (the next create answers 409 and
/// replaces it). Returns what became of it, for the condition message.
async fn forget_unstored_key(client: &CoderdClient, record: &keys::KeyRecord) -> String {
    let Some(key_id) = &record.key_id else {
        return "the new key's id is not known (its lookup failed), so it stays in coderd until the next create replaces it".to_owned();
    };
    match keys::delete_by_id(client, &record.organization_id, key_id).await {
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

fn key_failed(report: &mut PassReport, error: CoderdError) -> Stop {
    report.set(ConditionUpdate::failed(
        condition::KEY_READY,
        reason::KEY_FAILED,
        format!("reconciling the provisioner key failed: {error}"),
    ));
    KeyError::Coderd(error).into()
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

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case::resync(Ok(Action::requeue(RESYNC)), "ok")]
    #[case::waits_for_a_change(Ok(Action::await_change()), "ok")]
    #[case::back_early(Ok(Action::requeue(Duration::from_secs(2))), "requeue")]
    #[case::failed(Err(Error::Key(KeyError::Coderd(CoderdError::RateLimited { retry_after: None }))), "error")]
    fn each_outcome_has_its_metric_label(
        #[case] outcome: Result<Action, Error>,
        #[case] label: &str,
    ) {
        assert_eq!(outcome_label(&outcome), label);
    }
}
