//! The cucumber World: one per scenario, with its own namespace, coderd organization and
//! coderd user, on top of the process-wide [`Environment`] started once per run.
//!
//! Scenario isolation: every scenario gets a fresh namespace, a unique coderd organization and
//! a unique coderd owner user whose session token is the control plane's operator token. The
//! fake coderd's journal records a fingerprint of the session token, so a scenario counts only
//! the calls the operator made on its behalf, even while other scenarios run concurrently.
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use cucumber::World;
use fake_coderd::{AdminClient, JournalEntry};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::crd_resources::{control_plane_resource, provisioner_resource};
use crate::wait::{self, Observation, Timeouts};

/// Field manager for everything the suite writes.
pub const FIELD_MANAGER: &str = "coder-provisioner-conformance";
/// Label put on namespaces the suite creates (so leftovers are easy to find and remove).
pub const SCENARIO_LABEL: &str = "conformance.coder.com/scenario";
/// The control plane name used by the tutorial and, for readability, by every scenario.
pub const CONTROL_PLANE: &str = "codercontrolplane-sample";
/// The CR name of the sample, reused by every scenario that applies "the sample provisioner".
pub const SAMPLE_PROVISIONER: &str = "coderprovisioner-sample";
/// Name of the Secret holding the operator token that the fixture control plane points at.
pub const OPERATOR_TOKEN_SECRET: &str = "coder-operator-token";

/// How the implementation under test runs.
pub enum Operator {
    /// Started by the suite (the reference operator or `--operator-cmd`); can be restarted.
    /// `None` once the run is over and the process was stopped.
    Started(Box<tokio::sync::Mutex<Option<crate::implementation::OperatorProcess>>>),
    /// Already installed in the cluster (`--operator installed` without `--operator-deployment`):
    /// nothing started, no restarts, no log.
    Installed,
    /// A Deployment in the cluster: the reference operator the kind/k3s tier installed from
    /// `config/manager`, or the one `--operator-deployment` names. Stopped and started by scaling
    /// it, identity from its ServiceAccount, log from its pods.
    InCluster(crate::cluster::in_cluster::InClusterOperator),
}

/// How the suite reaches coderd.
pub struct Coderd {
    /// Base URL that control planes publish in `status.url`.
    pub url: String,
    /// Base URL at which the suite itself reaches coderd: the same as `url` unless coderd runs
    /// inside the cluster (kind, k3s), where the suite goes through a port-forward.
    pub runner_url: String,
    /// Admin handle of the fake coderd; `None` when `--coderd` points at a real coderd.
    pub admin: Option<AdminClient>,
}

/// An existing control plane given with `--control-plane` (used with a real coderd).
#[derive(Clone, Debug)]
pub struct ExistingControlPlane {
    pub namespace: String,
    pub name: String,
}

/// Everything started once per run and shared by all scenarios; on the local tier a second one,
/// private to the `@serial` scenarios (see [`Gate`]).
pub struct Environment {
    /// The number of a private environment of the `@serial` scenarios; `None` for the shared one.
    pub private: Option<usize>,
    /// A `@serial` scenario holds it alone; in the shared environment every other scenario holds
    /// it shared (the private one has only `@serial` scenarios).
    pub lane: Arc<tokio::sync::RwLock<()>>,
    pub client: kube::Client,
    /// Admin kubeconfig, for the real `kubectl` the tutorial scenario runs.
    pub kubeconfig: PathBuf,
    /// The `kubectl` binary, when one was found.
    pub kubectl: Option<PathBuf>,
    pub coderd: Coderd,
    /// Other fake coderds on the same host, on other ports (issue 38's environment shapes);
    /// empty with a real coderd.
    pub other_coderds: Vec<Coderd>,
    pub operator: Operator,
    /// The command of one leader-elected replica, when the suite can start replicas.
    pub replica_command: Option<crate::implementation::OperatorCommand>,
    pub existing_control_plane: Option<ExistingControlPlane>,
    /// Image the fixture control plane names in `spec.image`, inherited by provisioner pods
    /// (the stub daemon on clusters with kubelets, contract D-8); `None` leaves it unset.
    pub daemon_image: Option<String>,
    pub timeouts: Timeouts,
    /// How long an observation after an action watches (constant, or measured on a real
    /// cluster; see [`wait::ObservationWindow`]).
    pub observation_window: wait::ObservationWindow,
    /// Folder holding `config/` (samples, RBAC) of the suite.
    pub repo_root: PathBuf,
    pub report_dir: PathBuf,
    pub keep_on_failure: bool,
    /// The API server's audit log of ServiceAccount requests, when the suite started the API
    /// server (local tier); `None` elsewhere.
    pub audit_log: Option<PathBuf>,
    /// The time the run may spend looking for smaller failing generated cases, shared by every
    /// environment of the run.
    pub shrink_budget: Arc<crate::shrink_budget::ShrinkBudget>,
    /// Whether the suite plays the kubelet (D-8): a runnable pod template is ready at once.
    pub readiness_simulated: bool,
}

static ENVIRONMENT: OnceLock<Arc<Environment>> = OnceLock::new();
/// The private environments of the `@serial` scenarios, when the run makes them.
static PRIVATE_ENVIRONMENTS: OnceLock<PrivateEnvironments> = OnceLock::new();
/// With private environments, where the other scenarios run (see [`Places`]).
static PLACES: OnceLock<Places> = OnceLock::new();

/// Private environments free for a `@serial` scenario: one permit per free environment, added
/// as each is ready. Closed when none could be made (the `@serial` scenarios then run alone in
/// the shared environment), and once every `@serial` scenario has started: each private
/// environment then becomes a place for the other scenarios when its last one ends.
pub struct PrivateEnvironments {
    lanes: std::sync::Mutex<Lanes>,
    available: Arc<tokio::sync::Semaphore>,
    /// `@serial` scenarios not started yet.
    serial_left: std::sync::atomic::AtomicUsize,
    /// The other scenarios' places a private environment joins once it is open.
    places: &'static Places,
    /// Scenarios a private environment holds at a time once open.
    capacity: usize,
}

#[derive(Default)]
struct Lanes {
    free: Vec<Arc<Environment>>,
    /// No `@serial` scenario is left to start.
    open: bool,
}

impl PrivateEnvironments {
    fn lanes(&self) -> std::sync::MutexGuard<'_, Lanes> {
        self.lanes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A private environment is ready: for the `@serial` scenarios, or for the others when no
    /// `@serial` one is left to start.
    pub fn add(&self, environment: Arc<Environment>) {
        if self.keep(environment) {
            self.available.add_permits(1);
        }
    }

    /// Keeps a free private environment for the `@serial` scenarios (true), or makes it a place
    /// for the others when none is left to start.
    fn keep(&self, environment: Arc<Environment>) -> bool {
        let mut lanes = self.lanes();
        if lanes.open {
            self.places.add(environment, self.capacity);
            false
        } else {
            lanes.free.push(environment);
            true
        }
    }

    /// No (more) private environment will come.
    pub fn close_if_empty(&self) {
        if self.available.available_permits() == 0 && self.lanes().free.is_empty() {
            self.available.close();
        }
    }

    /// A free private environment, or `None` once none will come (a retried `@serial`
    /// scenario after the last one started then runs alone in the shared environment).
    async fn take(&'static self) -> Option<Borrowed> {
        let permit = Arc::clone(&self.available).acquire_owned().await.ok()?;
        let environment = self.lanes().free.pop()?;
        let left = self
            .serial_left
            .fetch_update(SeqCst, SeqCst, |left| left.checked_sub(1))
            .map_or(0, |before| before - 1);
        if left == 0 {
            self.open();
        }
        Some(Borrowed {
            pool: self,
            environment: Some(environment),
            _permit: permit,
        })
    }

    /// The last `@serial` scenario has started: the free private environments become places
    /// for the other scenarios now, the busy ones when their scenario ends.
    fn open(&self) {
        let mut lanes = self.lanes();
        lanes.open = true;
        for environment in lanes.free.drain(..) {
            self.places.add(environment, self.capacity);
        }
        self.available.close();
    }
}

/// A private environment in use by one scenario, given back when dropped.
pub struct Borrowed {
    pool: &'static PrivateEnvironments,
    environment: Option<Arc<Environment>>,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Drop for Borrowed {
    fn drop(&mut self) {
        // Given back before the permit (a field, dropped after this) is released.
        if let Some(environment) = self.environment.take() {
            self.pool.keep(environment);
        }
    }
}

/// Where the scenarios that share an environment run: the shared one, `--concurrency` at a
/// time, and each private environment once its `@serial` scenarios are done, a few at a time
/// with its own operator. An operator with one reconcile worker (controller-runtime's
/// default) is then not the pace of the whole run, and its load in the shared environment is
/// never more than `--concurrency` scenarios.
pub struct Places {
    /// One permit per free seat, all places together.
    seats: Arc<tokio::sync::Semaphore>,
    places: std::sync::Mutex<Vec<Place>>,
    /// Scenarios that ran in a private environment after its `@serial` ones.
    moved: std::sync::atomic::AtomicUsize,
}

struct Place {
    environment: Arc<Environment>,
    capacity: usize,
    running: usize,
}

impl Places {
    fn new(shared: Arc<Environment>, capacity: usize) -> Self {
        Self {
            seats: Arc::new(tokio::sync::Semaphore::new(capacity)),
            places: std::sync::Mutex::new(vec![Place {
                environment: shared,
                capacity,
                running: 0,
            }]),
            moved: Default::default(),
        }
    }

    fn places(&self) -> std::sync::MutexGuard<'_, Vec<Place>> {
        self.places
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn add(&self, environment: Arc<Environment>, capacity: usize) {
        self.places().push(Place {
            environment,
            capacity,
            running: 0,
        });
        self.seats.add_permits(capacity);
    }

    /// A seat in the place with the most free seats (the shared environment on a tie).
    async fn take(&'static self) -> anyhow::Result<Seat> {
        let permit = Arc::clone(&self.seats).acquire_owned().await?;
        let mut places = self.places();
        let seats: Vec<_> = places.iter().map(|p| (p.capacity, p.running)).collect();
        let place = roomiest(&seats)
            .and_then(|index| places.get_mut(index))
            .ok_or_else(|| anyhow!("a free seat in no environment"))?;
        place.running += 1;
        if place.environment.private.is_some() {
            self.moved.fetch_add(1, SeqCst);
        }
        Ok(Seat {
            places: self,
            environment: Arc::clone(&place.environment),
            _permit: permit,
        })
    }

    /// Scenarios that ran in a private environment after its `@serial` ones.
    pub fn moved(&self) -> usize {
        self.moved.load(SeqCst)
    }
}

/// The place (by index, from `(capacity, running)`) with the most free seats, the first one on a
/// tie (the shared environment); `None` when every place is full.
fn roomiest(places: &[(usize, usize)]) -> Option<usize> {
    places
        .iter()
        .enumerate()
        .rev()
        .max_by_key(|(_, (capacity, running))| capacity.saturating_sub(*running))
        .filter(|(_, (capacity, running))| running < capacity)
        .map(|(index, _)| index)
}

/// A scenario's seat in one of the [`Places`], given back when dropped.
pub struct Seat {
    places: &'static Places,
    environment: Arc<Environment>,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Drop for Seat {
    fn drop(&mut self) {
        // Counted free before the permit (a field, dropped after this) is released.
        if let Some(place) = self
            .places
            .places()
            .iter_mut()
            .find(|place| Arc::ptr_eq(&place.environment, &self.environment))
        {
            place.running -= 1;
        }
    }
}

/// A scenario's place from its before-hook to its after-hook. The fake coderd's switches
/// (faults, entitlement, reachability) and the operator's restarts are global to an
/// environment, so a `@serial` scenario is alone in its environment: in the private one, where
/// only `@serial` scenarios go, one at a time while the others run in the shared one; without a
/// private environment, alone in the shared one too (cucumber starts a `@serial` scenario one at
/// a time but may start it while concurrent scenarios still run).
pub enum Gate {
    Shared {
        _running: Running,
        _lane: tokio::sync::OwnedRwLockReadGuard<()>,
        _seat: Option<Seat>,
    },
    /// Alone in the shared environment, or in a private one (given back after the lane guard).
    Alone(
        tokio::sync::OwnedRwLockWriteGuard<()>,
        Running,
        Option<Borrowed>,
    ),
}

/// Scenarios past their gate now, and the most there were at once (the run's summary says it).
static RUNNING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static PEAK_RUNNING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// One scenario counted in `RUNNING` while it lives.
pub struct Running(());

impl Running {
    fn start() -> Self {
        let now = RUNNING.fetch_add(1, SeqCst) + 1;
        PEAK_RUNNING.fetch_max(now, SeqCst);
        Running(())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.fetch_sub(1, SeqCst);
    }
}

/// The scenarios past their gate now.
pub fn running() -> usize {
    RUNNING.load(SeqCst)
}

/// The most scenarios that ran at once so far.
pub fn peak_running() -> usize {
    PEAK_RUNNING.load(SeqCst)
}

impl Gate {
    /// Enters `world`'s environment, first moving a `@serial` scenario into the private one
    /// when the run has one.
    pub async fn enter(world: &mut ProvisionerWorld, serial: bool) -> anyhow::Result<Gate> {
        if !serial {
            let seat = match PLACES.get() {
                Some(places) => Some(places.take().await?),
                None => None,
            };
            if let Some(seat) = &seat
                && !Arc::ptr_eq(&seat.environment, &world.env)
            {
                world.move_to(Arc::clone(&seat.environment)).await?;
            }
            let lane = Arc::clone(&world.env.lane).read_owned().await;
            return Ok(Gate::Shared {
                _running: Running::start(),
                _lane: lane,
                _seat: seat,
            });
        }
        let borrowed = match PRIVATE_ENVIRONMENTS.get() {
            Some(pool) => pool.take().await,
            None => None,
        };
        if let Some(environment) = borrowed.as_ref().and_then(|b| b.environment.clone()) {
            world.move_to(environment).await?;
        }
        let lane = Arc::clone(&world.env.lane).write_owned().await;
        Ok(Gate::Alone(lane, Running::start(), borrowed))
    }
}

/// Publishes the shared environment; done once, before the cucumber run starts.
pub fn install_environment(environment: Arc<Environment>) -> anyhow::Result<()> {
    ENVIRONMENT
        .set(environment)
        .map_err(|_| anyhow!("the conformance environment was already initialised in this process"))
}

/// Makes the (still empty) list of the private environments of the `@serial` scenarios, the
/// `serial` of them, and limits the shared environment to `shared_seats` scenarios at a time;
/// a private environment holds `private_seats` of the others once no `@serial` one is left.
pub fn install_private_environments(
    serial: usize,
    shared_seats: usize,
    private_seats: usize,
) -> anyhow::Result<&'static PrivateEnvironments> {
    let places = Places::new(environment()?, shared_seats);
    PLACES
        .set(places)
        .map_err(|_| anyhow!("the scenarios' places were already initialised in this process"))?;
    let places = PLACES
        .get()
        .ok_or_else(|| anyhow!("the scenarios' places are not initialised"))?;
    PRIVATE_ENVIRONMENTS
        .set(PrivateEnvironments {
            lanes: Default::default(),
            available: Arc::new(tokio::sync::Semaphore::new(0)),
            serial_left: serial.into(),
            places,
            capacity: private_seats,
        })
        .map_err(|_| anyhow!("the private environments were already initialised"))?;
    PRIVATE_ENVIRONMENTS
        .get()
        .ok_or_else(|| anyhow!("the private environments are not initialised"))
}

/// Scenarios that ran in a private environment after its `@serial` ones.
pub fn moved_to_private_environments() -> usize {
    PLACES.get().map_or(0, Places::moved)
}

pub fn environment() -> anyhow::Result<Arc<Environment>> {
    ENVIRONMENT.get().cloned().ok_or_else(|| {
        anyhow!("the conformance environment is not initialised (run through `conformance run`)")
    })
}

/// The coderd identity a scenario uses: its own organization and owner user.
pub struct ScenarioCoderd {
    pub organization: String,
    /// Empty when the scenario uses an organization it did not create (the tutorial's `default`).
    pub organization_id: String,
    /// The owner user's name.
    pub user: String,
    /// The user's session token; written only to the operator token Secret, never printed.
    token: String,
    pub token_fingerprint: String,
}

impl ScenarioCoderd {
    /// The owner's session token, for another coderd that must accept the same (a control plane
    /// whose URL moves there); never to be printed.
    pub fn session_token(&self) -> &str {
        &self.token
    }
}

/// Per-scenario state.
#[derive(World)]
#[world(init = Self::new)]
pub struct ProvisionerWorld {
    pub env: Arc<Environment>,
    /// Short random id, also used in namespace, organization and user names.
    pub id: String,
    pub namespace: String,
    /// Whether the suite created the namespace (and so deletes it after the scenario).
    pub owns_namespace: bool,
    /// In a namespace the suite does not own (`--control-plane`): the uids of the
    /// CoderProvisioners and Secrets already there when the scenario started, which it leaves
    /// alone; it deletes the others after the scenario ([`Self::delete_created_objects`]).
    preexisting: Option<std::collections::BTreeSet<String>>,
    pub coderd: Option<ScenarioCoderd>,
    /// Name of the CoderProvisioner the scenario works with.
    pub provisioner: String,
    /// Values remembered by one step for a later one (e.g. a pod-template checksum).
    pub remembered: BTreeMap<String, String>,
    /// Journal length at the start of the latest `When` step ("since the last action").
    pub action_mark: Option<usize>,
    /// The scenario CR as the latest action found it (see [`ActionBaseline`]).
    action_baseline: Option<ActionBaseline>,
    /// When the latest action began, until a condition answered it
    /// ([`ProvisionerWorld::condition_answered`]).
    action_started: Option<tokio::time::Instant>,
    /// End of the observation window opened after the latest action (see
    /// [`ProvisionerWorld::observation_window`]).
    window_end: Option<tokio::time::Instant>,
    /// When the fault in place was injected (a refusing quota, a coderd fault, an unreachable
    /// coderd); `None` while there is none.
    fault_injected: Option<tokio::time::Instant>,
    /// Once a fault is cleared, the deadlines that allow for the operator's error backoff
    /// ([`Timeouts::after_fault`]), until the next action.
    after_fault: Option<Timeouts>,
    /// Set by steps that change the fake coderd's global switches, restored after the scenario.
    pub touched_global_coderd: bool,
    /// Set while a step has stopped the operator; the after-hook starts it again.
    pub operator_stopped: bool,
    /// CRs a step gave the suite's own finalizer; the after-hook removes it so the
    /// namespace can go.
    pub held: Vec<String>,
    /// The last command a tutorial step ran, with what it printed.
    pub last_command: Option<(String, CommandOutput)>,
    /// The last answer of the API server to a submitted CoderProvisioner (admission checks).
    pub last_admission: Option<Result<(), String>>,
    /// Held from the before-hook to the after-hook.
    pub gate: Option<Gate>,
    /// Whether D-10's prompt outcome applies: no fault, retry schedule or operator restart in
    /// the scenario, so a condition wait may end as soon as the operator has settled without it.
    pub prompt_outcome: bool,
    /// Whether the scenario ends with faults or a hand-over that its CRs must get over (rate
    /// limiting, leader election): [`settles_at_end`].
    pub settles_at_end: bool,
    /// A second coderd organization, made on demand by a step: (name, id).
    pub second_organization: Option<(String, String)>,
    /// Secret values the scenario has seen (key plaintexts read from Secrets, credential values
    /// it wrote), searched for by the after-scenario leak check (R-SEC-14).
    pub seen_secrets: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// Contract invariants violated by any observation of the CR (R-ST-1, R-ST-9, R-CRD-12),
    /// reported by the after-hook: a value that flickers past a poll still fails the scenario.
    pub violations: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// Writers a step left running (other clients editing the CR); stopped with the world.
    pub background: Vec<tokio::task::AbortHandle>,
    /// Leader-elected replicas of the operator a step started (the after-hook stops them).
    pub replicas: Vec<crate::implementation::OperatorProcess>,
    /// Lease holder identities seen while one replica alone could take the Lease → its name
    /// (for identities that do not contain the replica's name, e.g. `<hostname>_<uuid>`).
    pub replica_identities: BTreeMap<String, String>,
    /// The longest delay a step gave coderd's answers: an answer delayed before the after-hook
    /// cleared the faults may come that long after (see the after-hook).
    pub longest_delay: Option<std::time::Duration>,
    /// The Lease holders before the first replica started (the stopped operator's own).
    pub holders_before_replicas: std::collections::BTreeSet<String>,
    /// The webhook a step set to hold one of the replicas' writes (the after-hook removes it).
    pub write_hold: Option<crate::steps::write_hold::WriteHold>,
    /// This scenario's journal entries read so far, and the cursor to read on from.
    journal_seen: tokio::sync::Mutex<JournalSeen>,
    /// The scenario on other coderds of the same host, made on demand (issue 38's shapes).
    pub other_coderds: Vec<OtherScenarioCoderd>,
    /// The fingerprints of the scenario's other operator tokens (a second control plane's, the
    /// other coderds' owners'): requests made with them, on any coderd, are the scenario's too.
    pub other_token_fingerprints: Vec<String>,
    /// The watch on the scenario's namespace (see [`crate::invariants::recorder`]).
    pub recorder: Option<crate::invariants::recorder::Recorder>,
    /// Set by steps that put keys into coderd themselves (no abandoned-key check then).
    pub planted_keys: bool,
    /// The generated case of the scenario, if it has one (named in every finding).
    pub generated: Option<crate::cases::Generated>,
    /// Secrets the suite wrote: name → (uid, the field managers its own writes left) (R-SEC-15).
    pub suite_secrets: BTreeMap<String, (String, std::collections::BTreeSet<String>)>,
}

#[derive(Default)]
struct JournalSeen {
    last_seq: u64,
    /// The cursor in each other coderd's journal, by index into [`Environment::other_coderds`].
    other_last_seq: BTreeMap<usize, u64>,
    entries: Vec<JournalEntry>,
    /// Which coderd answered each entry: `None` the fake, `Some(i)` other coderd `i`.
    sources: Vec<Option<usize>>,
}

/// The scenario on another coderd ([`Environment::other_coderds`]): the scenario's organization
/// names made there too (other ids), an owner of its own, and a Ready control plane publishing
/// that coderd's URL.
#[derive(Clone, Debug)]
pub struct OtherScenarioCoderd {
    /// Index into [`Environment::other_coderds`].
    pub index: usize,
    pub control_plane: String,
    /// The organizations made there: (name, id).
    pub organizations: Vec<(String, String)>,
    pub token_fingerprint: String,
}

impl Drop for ProvisionerWorld {
    fn drop(&mut self) {
        for task in &self.background {
            task.abort();
        }
    }
}

impl fmt::Debug for ProvisionerWorld {
    // Printed by cucumber on failures: names only, never the session token.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProvisionerWorld")
            .field("namespace", &self.namespace)
            .field(
                "organization",
                &self.coderd.as_ref().map(|c| c.organization.as_str()),
            )
            .field("provisioner", &self.provisioner)
            .field("remembered", &self.remembered)
            .finish_non_exhaustive()
    }
}

/// D-10: a scenario whose outcome must show promptly; those with injected faults, waits for a
/// retry schedule, restarts or replicas may rightly take longer (a backoff, a re-check).
pub fn expects_prompt_outcome(tags: &[String]) -> bool {
    const LONGER: [&str; 5] = [
        "fault-injection",
        "slow",
        "serial",
        "operator-restart",
        "leader-election",
    ];
    !tags.iter().any(|t| LONGER.contains(&t.as_str()))
}

/// Whether a journal entry is the scenario's: made with one of its session tokens,
/// authenticated by a key of one of its organizations (a new key's lookup of its own record), or
/// naming one of them in its path; never the suite's own checks.
fn is_scenario_request(
    entry: &JournalEntry,
    fingerprints: &[String],
    organizations: &[String],
) -> bool {
    if entry.observer {
        return false;
    }
    let with_token = entry
        .session_token_fingerprint
        .as_ref()
        .is_some_and(|f| fingerprints.contains(f));
    let with_key = entry
        .key_organization_id
        .as_ref()
        .is_some_and(|id| organizations.contains(id));
    with_token || with_key || names_organization(&entry.path, organizations)
}

/// Issue 37: in the scenarios about rate limiting and leader election, every CR must settle
/// once coderd answers normally again, and every key Secret's key then authenticates, however
/// the scenario ended (between a delete and a create, in a backoff, after a hand-over).
pub fn settles_at_end(tags: &[String]) -> bool {
    tags.iter()
        .any(|t| t == "rate-limit" || t == "leader-election")
}

/// D-10: notices that the operator settled without the state a step awaits: after it reacted to
/// the action, the CR's status the same, no new coderd request and the same shortfall observed
/// (a child object's wrong value) for a third of the tier's deadline. Only in scenarios whose
/// outcome must show promptly ([`expects_prompt_outcome`]); elsewhere it never fires.
pub struct SettleWatch {
    window: Option<Duration>,
    /// How long the status, journal length and shortfall have stood.
    steady: std::sync::Mutex<wait::Steady<(String, usize, String)>>,
}

impl SettleWatch {
    pub fn for_world(world: &ProvisionerWorld) -> Self {
        Self {
            window: world
                .prompt_outcome
                .then(|| world.timeouts().eventually / 3),
            steady: Default::default(),
        }
    }

    /// Records an observation of `cr` that lacks the awaited state (`why`); a
    /// [`wait::Hopeless`] error once the operator has settled without it.
    pub async fn observe(
        &self,
        world: &ProvisionerWorld,
        cr: &Value,
        why: &str,
    ) -> anyhow::Result<()> {
        let Some(window) = self.window else {
            return Ok(());
        };
        let requests = world.scenario_request_count().await?;
        let status = status_text(cr);
        let baseline = world.action_baseline.as_ref();
        // An operator that observes no generation (an implementation's choice on a pass a gate
        // stopped, or a fault of its own) has settled too once it reacted and then stood still.
        let current = if observed_current_generation(cr) {
            baseline.is_none_or(|before| before.answered_by(cr, &status, requests))
        } else {
            baseline.map_or(!status.is_empty(), |before| {
                before.reacted(&status, requests)
            })
        };
        // Pods that are still starting are the cluster's to finish, not the operator's; the
        // local tier's simulated kubelet readies a runnable template within a second, so there
        // pods that have not come by the end of the window never come.
        let pods_to_come = waiting_for_pods(cr) && !world.env.readiness_simulated;
        let mut steady = self
            .steady
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let stood = if current && !pods_to_come {
            steady.observe(
                (status, requests, why.to_owned()),
                tokio::time::Instant::now(),
            )
        } else {
            *steady = wait::Steady::default();
            Duration::ZERO
        };
        if stood >= window {
            return Err(wait::Hopeless(format!(
                "the operator settled without it ({:.0} s with the same status and no coderd request after it reacted; D-10): {why}",
                window.as_secs_f64()
            ))
            .into());
        }
        Ok(())
    }
}

/// The scenario CR and its coderd requests when an action began. An action that leaves the
/// generation alone (a credential Secret fixed, a control plane's status changed) is answered by
/// no `observedGeneration`: until the CR shows the operator acted since (a new generation, another
/// status, a coderd request), an unchanged CR may only mean the operator has not come to it yet
/// (one reconcile worker busy with other CRs), so [`SettleWatch`] does not count that time.
struct ActionBaseline {
    generation: Option<i64>,
    status: String,
    requests: usize,
}

impl ActionBaseline {
    fn answered_by(&self, cr: &Value, status: &str, requests: usize) -> bool {
        generation_of(cr) != self.generation || self.reacted(status, requests)
    }

    /// Whether the operator did something since the action: another status, a coderd request.
    fn reacted(&self, status: &str, requests: usize) -> bool {
        status != self.status || requests > self.requests
    }
}

fn generation_of(cr: &Value) -> Option<i64> {
    cr.pointer("/metadata/generation").and_then(Value::as_i64)
}

fn status_text(cr: &Value) -> String {
    cr.get("status").map(Value::to_string).unwrap_or_default()
}

/// An API error worth one more try of the suite's own write: the server busy or timing out, a
/// conflict, or no answer at all; never a refusal of what was sent.
fn transient(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => status.code >= 500 || matches!(status.code, 409 | 429),
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

/// Whether the operator has observed the CR's current generation: in `status.observedGeneration`,
/// or, for a pass stopped at a gate before the Deployment (which R-ST-4 lets leave that field
/// behind), in the `observedGeneration` every condition that pass set carries (R-ST-4).
fn observed_current_generation(cr: &Value) -> bool {
    let generation = cr.pointer("/metadata/generation");
    if generation.is_some() && generation == cr.pointer("/status/observedGeneration") {
        return true;
    }
    let conditions = cr
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    generation.is_some()
        && !conditions.is_empty()
        && conditions
            .iter()
            .all(|c| c.get("observedGeneration") == generation)
}

/// Every gate passed and only the Deployment's readiness is still to come.
fn waiting_for_pods(cr: &Value) -> bool {
    let conditions = cr
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let type_of = |c: &Value| {
        c.get("type")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let deployment_ready = conditions
        .iter()
        .any(|c| type_of(c) == "DeploymentReady" && c.get("status") == Some(&json!("True")));
    // The key and its Secret are the last gates before the Deployment (R-KEY-7): without them
    // the pass stopped earlier, at a gate that may not show (a condition type the operator lacks).
    let reached_the_deployment = ["ProvisionerKeyReady", "ProvisionerKeySecretReady"]
        .iter()
        .all(|kind| conditions.iter().any(|c| type_of(c) == *kind));
    reached_the_deployment
        && !deployment_ready
        && conditions
            .iter()
            .filter(|c| type_of(c) != "DeploymentReady")
            .all(|c| c.get("status") == Some(&json!("True")))
}

/// Whether a request path names one of `organizations` (`/api/v2/organizations/{name or id}/…`).
fn names_organization(path: &str, organizations: &[String]) -> bool {
    let path = path.split('?').next().unwrap_or_default();
    let mut segments = path.split('/');
    segments.any(|s| s == "organizations")
        && segments
            .next()
            .is_some_and(|organization| organizations.iter().any(|o| o == organization))
}

/// What one command printed.
#[derive(Clone, Debug, Default)]
pub struct CommandOutput {
    pub stdout: String,
    pub stderr: String,
    pub success: bool,
}

fn random_id() -> String {
    let value: u32 = rand::random();
    format!("{value:08x}")
}

impl ProvisionerWorld {
    async fn new() -> anyhow::Result<Self> {
        let env = environment()?;
        let id = random_id();
        let (namespace, owns_namespace) = match &env.existing_control_plane {
            Some(existing) => (existing.namespace.clone(), false),
            None => (format!("conf-{id}"), true),
        };
        let mut world = ProvisionerWorld {
            env,
            id,
            namespace,
            owns_namespace: false,
            preexisting: None,
            coderd: None,
            provisioner: SAMPLE_PROVISIONER.to_owned(),
            remembered: BTreeMap::new(),
            action_mark: None,
            action_baseline: None,
            action_started: None,
            window_end: None,
            fault_injected: None,
            after_fault: None,
            touched_global_coderd: false,
            operator_stopped: false,
            held: Vec::new(),
            last_command: None,
            last_admission: None,
            gate: None,
            prompt_outcome: false,
            settles_at_end: false,
            second_organization: None,
            seen_secrets: Default::default(),
            violations: Default::default(),
            background: Vec::new(),
            replicas: Vec::new(),
            replica_identities: BTreeMap::new(),
            longest_delay: None,
            holders_before_replicas: Default::default(),
            write_hold: None,
            journal_seen: Default::default(),
            other_coderds: Vec::new(),
            other_token_fingerprints: Vec::new(),
            recorder: None,
            planted_keys: false,
            generated: None,
            suite_secrets: BTreeMap::new(),
        };
        if owns_namespace {
            world.create_namespace().await?;
        } else {
            world.preexisting = Some(world.namespace_object_uids().await?);
        }
        world.start_recorder();
        Ok(world)
    }

    pub fn client(&self) -> kube::Client {
        self.env.client.clone()
    }

    /// The tier's deadlines, or after a cleared fault the longer ones of [`Timeouts::after_fault`].
    pub fn timeouts(&self) -> &Timeouts {
        self.after_fault.as_ref().unwrap_or(&self.env.timeouts)
    }

    /// A fault the operator will meet is in place from now (the first one counts, until cleared).
    pub fn fault_injected(&mut self) {
        self.fault_injected
            .get_or_insert_with(tokio::time::Instant::now);
    }

    /// The faults are gone: the steps until the next action allow for the error backoff the
    /// operator may have reached while they were in place. Call after [`Self::mark_action`].
    pub fn fault_cleared(&mut self) {
        if let Some(since) = self.fault_injected.take() {
            self.after_fault = Some(self.env.timeouts.after_fault(since.elapsed()));
        }
    }

    /// Moves the scenario into `namespace` (the tutorial needs `coder`), creating it.
    pub async fn use_namespace(&mut self, namespace: &str) -> anyhow::Result<()> {
        if self.owns_namespace {
            self.delete_namespace().await?;
        }
        self.namespace = namespace.to_owned();
        let api: Api<Namespace> = Api::all(self.client());
        if let Some(existing) = api.get_opt(namespace).await? {
            if existing.metadata.deletion_timestamp.is_some() {
                wait::eventually(
                    &format!("namespace {namespace} to finish terminating"),
                    self.timeouts(),
                    || {
                        let api = api.clone();
                        async move {
                            Ok(match api.get_opt(namespace).await? {
                                None => Ok(()),
                                Some(_) => Err("still terminating".to_owned()),
                            })
                        }
                    },
                )
                .await?;
            } else {
                bail!(
                    "namespace {namespace} already exists; the tutorial scenario needs to create it (remove it first)"
                );
            }
        }
        self.create_namespace().await?;
        self.start_recorder();
        Ok(())
    }

    /// Moves a scenario that has done nothing yet into `env`: its namespace made there instead.
    async fn move_to(&mut self, env: Arc<Environment>) -> anyhow::Result<()> {
        let owned = self.owns_namespace;
        self.delete_namespace().await?;
        self.recorder = None;
        self.env = env;
        if owned {
            self.create_namespace().await?;
        }
        self.start_recorder();
        Ok(())
    }

    fn start_recorder(&mut self) {
        self.recorder = Some(crate::invariants::recorder::Recorder::start(
            self.client(),
            &self.namespace,
            self.settle_window(),
        ));
    }

    /// D-15: a CR is settled once its status (and the scenario's coderd requests) stood
    /// unchanged for the tier's window after the operator's last reaction; the rules about what
    /// status shows for a spec judge only such states.
    pub fn settle_window(&self) -> std::time::Duration {
        self.env.observation_window.current()
    }

    /// Remembers a Secret the suite just wrote, with the field managers of that write.
    pub fn suite_wrote_secret(&mut self, secret: &Secret) {
        let name = secret.metadata.name.clone().unwrap_or_default();
        let uid = secret.metadata.uid.clone().unwrap_or_default();
        let entry = self.suite_secrets.entry(name).or_default();
        if entry.0 != uid {
            *entry = (uid, Default::default());
        }
        entry
            .1
            .extend(crate::invariants::managers_of(&secret.metadata));
    }

    async fn create_namespace(&mut self) -> anyhow::Result<()> {
        let api: Api<Namespace> = Api::all(self.client());
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(self.namespace.clone()),
                labels: Some(BTreeMap::from([(
                    SCENARIO_LABEL.to_owned(),
                    self.id.clone(),
                )])),
                ..Default::default()
            },
            ..Default::default()
        };
        api.create(&PostParams::default(), &namespace)
            .await
            .with_context(|| format!("creating namespace {}", self.namespace))?;
        self.owns_namespace = true;
        Ok(())
    }

    /// The uids of the CoderProvisioners and Secrets in the scenario's namespace.
    async fn namespace_object_uids(&self) -> anyhow::Result<std::collections::BTreeSet<String>> {
        let mut uids = std::collections::BTreeSet::new();
        for cr in self
            .provisioners()
            .list(&Default::default())
            .await
            .context("listing CoderProvisioners")?
        {
            uids.extend(cr.metadata.uid);
        }
        let secrets: Api<Secret> = self.api();
        for secret in secrets
            .list_metadata(&Default::default())
            .await
            .context("listing Secrets")?
        {
            uids.extend(secret.metadata.uid);
        }
        Ok(uids)
    }

    /// In a namespace the suite does not own (`--control-plane`): deletes the CoderProvisioners
    /// the scenario created (so that the operator deletes their keys) and the Secrets it created
    /// (those without an owner: the operator's children go with their CR), then waits until those
    /// CRs are gone, so that the next scenario can use their names. Nothing that was there when
    /// the scenario started is touched.
    pub async fn delete_created_objects(&mut self) -> anyhow::Result<()> {
        let Some(preexisting) = self.preexisting.clone() else {
            return Ok(());
        };
        let is_new = |meta: &ObjectMeta| {
            meta.uid
                .as_ref()
                .is_some_and(|uid| !preexisting.contains(uid))
        };
        let provisioners = self.provisioners();
        let mut created = Vec::new();
        for cr in provisioners
            .list(&Default::default())
            .await
            .context("listing CoderProvisioners")?
        {
            if is_new(&cr.metadata)
                && let Some(name) = cr.metadata.name.clone()
            {
                match provisioners
                    .delete(&name, &DeleteParams::background())
                    .await
                {
                    Ok(_) => created.push(name),
                    Err(kube::Error::Api(status)) if status.code == 404 => {}
                    Err(error) => {
                        return Err(error)
                            .with_context(|| format!("deleting CoderProvisioner {name}"));
                    }
                }
            }
        }
        let secrets: Api<Secret> = self.api();
        for secret in secrets
            .list_metadata(&Default::default())
            .await
            .context("listing Secrets")?
        {
            let owned = secret
                .metadata
                .owner_references
                .as_ref()
                .is_some_and(|o| !o.is_empty());
            if is_new(&secret.metadata)
                && !owned
                && let Some(name) = secret.metadata.name.clone()
            {
                match secrets.delete(&name, &DeleteParams::background()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(status)) if status.code == 404 => {}
                    Err(error) => {
                        return Err(error).with_context(|| format!("deleting Secret {name}"));
                    }
                }
            }
        }
        if created.is_empty() {
            return Ok(());
        }
        wait::eventually(
            &format!(
                "the scenario's CoderProvisioners ({}) to be gone",
                created.join(", ")
            ),
            self.timeouts(),
            || async {
                let mut left = Vec::new();
                for name in &created {
                    if provisioners.get_opt(name).await?.is_some() {
                        left.push(name.as_str());
                    }
                }
                Ok(if left.is_empty() {
                    Ok(())
                } else {
                    Err(format!("{} still there", left.join(", ")))
                })
            },
        )
        .await
    }

    /// Deletes the scenario's namespace (if the suite created it) without waiting for it to go.
    pub async fn delete_namespace(&mut self) -> anyhow::Result<()> {
        if !self.owns_namespace {
            return Ok(());
        }
        let api: Api<Namespace> = Api::all(self.client());
        match api
            .delete(&self.namespace, &DeleteParams::background())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => {
                return Err(error)
                    .with_context(|| format!("deleting namespace {}", self.namespace));
            }
        }
        self.owns_namespace = false;
        Ok(())
    }

    pub fn provisioners(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.client(), &self.namespace, &provisioner_resource())
    }

    pub fn control_planes(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.client(), &self.namespace, &control_plane_resource())
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client(), &self.namespace)
    }

    /// The fake coderd's admin handle, or a clear error when running against a real coderd.
    pub fn admin(&self) -> anyhow::Result<&AdminClient> {
        self.env.coderd.admin.as_ref().ok_or_else(|| {
            anyhow!(
                "this step needs the fake coderd's admin API, but --coderd points at a real coderd"
            )
        })
    }

    /// Removes the faults of the scenario's session tokens, at the fake coderd and the other
    /// coderds (the after-hook, the end-of-scenario checks, "coderd answers normally again").
    pub async fn clear_scenario_faults(&self) -> anyhow::Result<()> {
        let (Some(coderd), Some(admin)) = (&self.coderd, &self.env.coderd.admin) else {
            return Ok(());
        };
        admin.clear_faults_for(&coderd.token_fingerprint).await?;
        for other in &self.other_coderds {
            if let Some(admin) = &self.env.other_coderds[other.index].admin {
                admin.clear_faults_for(&other.token_fingerprint).await?;
            }
        }
        Ok(())
    }

    /// Puts the fake's global switches back after a scenario that changed them.
    pub async fn restore_global_coderd(&self) -> anyhow::Result<()> {
        let admin = self.admin()?;
        admin.clear_faults().await?;
        admin.set_unreachable(false).await?;
        admin.set_rate_limit(None).await?;
        Ok(())
    }

    pub fn scenario_coderd(&self) -> anyhow::Result<&ScenarioCoderd> {
        self.coderd
            .as_ref()
            .ok_or_else(|| anyhow!("no control plane fixture in this scenario: start with \"Given a Ready control plane with operator access\""))
    }

    /// Creates the scenario's coderd organization and owner user (fake coderd only).
    pub async fn create_scenario_coderd(
        &mut self,
        organization: Option<&str>,
    ) -> anyhow::Result<()> {
        let admin = self.admin()?;
        let (organization, organization_id) = match organization {
            Some(existing) => (existing.to_owned(), String::new()),
            None => {
                let name = format!("conf-{}", self.id);
                let created = admin
                    .add_organization(&name)
                    .await
                    .context("creating the scenario's coderd organization")?;
                (created.name, created.id.to_string())
            }
        };
        let user = format!("conf-{}", self.id);
        let token = admin
            .add_user(&user, fake_coderd::UserRole::Owner)
            .await
            .context("creating the scenario's coderd owner user")?;
        let token_fingerprint = fake_coderd::fingerprint(&token);
        self.coderd = Some(ScenarioCoderd {
            organization,
            organization_id,
            user,
            token,
            token_fingerprint,
        });
        Ok(())
    }

    /// Gives the operator the token of a new user of the scenario's organization with `role`
    /// instead of the owner's: its requests are then the scenario's (the journal follows).
    pub async fn operator_user_becomes(
        &mut self,
        role: fake_coderd::UserRole,
    ) -> anyhow::Result<()> {
        let admin = self.admin()?;
        let coderd = self.scenario_coderd()?;
        let user = format!("{}-{role:?}", coderd.user).to_lowercase();
        let mut seed = fake_coderd::SeedUser::new(&user, role);
        seed.organizations = vec![coderd.organization.clone()];
        let token = admin
            .add_user_with(&seed)
            .await
            .with_context(|| format!("creating the coderd user {user}"))?;
        let coderd = self.coderd.as_mut().expect("checked above");
        coderd.token_fingerprint = fake_coderd::fingerprint(&token);
        coderd.user = user;
        coderd.token = token;
        self.write_operator_token_secret().await
    }

    /// Another operator token of the scenario (a second control plane's, another coderd's
    /// owner's): never to appear anywhere, and its requests are the scenario's.
    pub fn knows_operator_token(&mut self, token: &str) {
        self.saw_secret(token.as_bytes());
        self.other_token_fingerprints
            .push(fake_coderd::fingerprint(token));
    }

    /// The operator token Secret the fixture control plane points at.
    pub async fn write_operator_token_secret(&mut self) -> anyhow::Result<()> {
        let token = self.scenario_coderd()?.token.clone();
        self.write_token_secret(OPERATOR_TOKEN_SECRET, &token).await
    }

    /// A Secret `name` holding a session token under `token`, as control planes point at.
    pub async fn write_token_secret(&mut self, name: &str, token: &str) -> anyhow::Result<()> {
        let secret = json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name, "namespace": self.namespace},
            "type": "Opaque",
            "stringData": {"token": token},
        });
        let api: Api<Secret> = self.api();
        // The fixture's own write: an API server that is briefly overloaded (CI runs several
        // control planes on 2 cores) is asked again, and the cause is named if it still fails
        // (cucumber prints a step's error without its causes).
        let mut attempt = 1;
        let written = loop {
            match api
                .patch(
                    name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&secret),
                )
                .await
            {
                Ok(written) => break written,
                Err(error) if attempt < 3 && transient(&error) => {
                    tokio::time::sleep(std::time::Duration::from_secs(attempt)).await;
                    attempt += 1;
                }
                Err(error) => {
                    bail!("writing the token Secret {name} (attempt {attempt}): {error}")
                }
            }
        };
        self.suite_wrote_secret(&written);
        Ok(())
    }

    /// Asks coderd which key `key` is, as a daemon does (`GET /api/v2/provisionerkeys/{key}` with
    /// the key itself); the answer's JSON, or why coderd refused it.
    pub async fn daemon_key_lookup(&self, key: &str) -> anyhow::Result<Value> {
        self.daemon_key_lookup_at(&self.env.coderd, key).await
    }

    /// The coderd whose URL (as control planes publish it) is `url`: the fake or one of the
    /// other coderds; the fake when none matches.
    pub fn coderd_at(&self, url: &str) -> &Coderd {
        let url = url.trim_end_matches('/');
        self.env
            .other_coderds
            .iter()
            .find(|c| c.url == url)
            .unwrap_or(&self.env.coderd)
    }

    /// [`Self::daemon_key_lookup`] at `coderd`.
    pub async fn daemon_key_lookup_at(&self, coderd: &Coderd, key: &str) -> anyhow::Result<Value> {
        let url = format!("{}/api/v2/provisionerkeys/{key}", coderd.runner_url);
        let response = reqwest::Client::new()
            .get(url)
            .header("Coder-Provisioner-Daemon-Key", key)
            // No fault the scenario injected for the operator meets this check (D-13).
            .header(fake_coderd::routes::OBSERVER_HEADER, "conformance")
            .send()
            .await
            // The error would carry the URL (and so the key): report only the kind of failure.
            .map_err(|e| {
                anyhow!(
                    "the daemon-key request failed ({})",
                    if e.is_connect() { "connect" } else { "request" }
                )
            })?;
        let status = response.status();
        if !status.is_success() {
            bail!("coderd rejected the key with {status}");
        }
        response
            .json()
            .await
            .map_err(|_| anyhow!("coderd's key answer is not JSON"))
    }

    /// Journal entries made with this scenario's session token.
    ///
    /// Read by cursor: each call fetches only the entries recorded since the last one
    /// (`?since=<seq>`; sequence numbers never go back, not even when the journal is cleared),
    /// so polls every 200 ms do not fetch every scenario's requests again.
    pub async fn journal(&self) -> anyhow::Result<Vec<JournalEntry>> {
        let coderd = self.scenario_coderd()?;
        let mut fingerprints = vec![coderd.token_fingerprint.clone()];
        fingerprints.extend(self.other_token_fingerprints.iter().cloned());
        // The scenario's own organizations (not a shared one like `default`): a request naming
        // one of them in its path is this scenario's, whatever token it carried, or none.
        let mut organizations = Vec::new();
        if !coderd.organization_id.is_empty() {
            organizations.push(coderd.organization.clone());
            organizations.push(coderd.organization_id.clone());
        }
        if let Some((name, id)) = &self.second_organization {
            organizations.extend([name.clone(), id.clone()]);
        }
        let mut seen = self.journal_seen.lock().await;
        let new = self
            .admin()?
            .journal_since(seen.last_seq)
            .await
            .context("reading the fake coderd journal")?;
        for entry in new {
            seen.last_seq = seen.last_seq.max(entry.seq);
            if is_scenario_request(&entry, &fingerprints, &organizations) {
                seen.entries.push(entry);
                seen.sources.push(None);
            }
        }
        // The other coderds' entries follow (each journal is in order; across coderds, an
        // entry is placed when it is read, so that marks of earlier actions stay where they were).
        for other in &self.other_coderds {
            let Some(admin) = self.env.other_coderds[other.index].admin.as_ref() else {
                continue;
            };
            let since = seen.other_last_seq.get(&other.index).copied().unwrap_or(0);
            let new = admin
                .journal_since(since)
                .await
                .context("reading another fake coderd's journal")?;
            let organizations: Vec<String> = other
                .organizations
                .iter()
                .flat_map(|(name, id)| [name.clone(), id.clone()])
                .collect();
            for entry in new {
                let last = seen.other_last_seq.entry(other.index).or_insert(0);
                *last = (*last).max(entry.seq);
                if is_scenario_request(&entry, &fingerprints, &organizations) {
                    seen.entries.push(entry);
                    seen.sources.push(Some(other.index));
                }
            }
        }
        Ok(seen.entries.clone())
    }

    /// [`Self::journal`] with the coderd that answered each entry: `None` the fake, `Some(i)`
    /// other coderd `i` ([`Environment::other_coderds`]).
    pub async fn journal_by_coderd(&self) -> anyhow::Result<Vec<(Option<usize>, JournalEntry)>> {
        self.journal().await?;
        let seen = self.journal_seen.lock().await;
        Ok(seen
            .sources
            .iter()
            .copied()
            .zip(seen.entries.iter().cloned())
            .collect())
    }

    /// Records the journal position at the start of an action (`When` step) and ends the
    /// observation window of the action before.
    pub async fn mark_action(&mut self) -> anyhow::Result<()> {
        self.action_started = Some(tokio::time::Instant::now());
        self.window_end = None;
        self.after_fault = None;
        if self.coderd.is_some() && self.env.coderd.admin.is_some() {
            self.action_mark = Some(self.journal().await?.len());
        }
        let cr = self.provisioner_json().await?;
        self.action_baseline = Some(ActionBaseline {
            generation: cr.as_ref().and_then(generation_of),
            status: cr.as_ref().map(status_text).unwrap_or_default(),
            requests: self.action_mark.unwrap_or(0),
        });
        Ok(())
    }

    /// A condition the scenario awaited was seen: the time since the latest action, when this is
    /// the first answer to it in a scenario D-10 holds to a prompt outcome, is one reaction of
    /// the operator for [`wait::ObservationWindow`] (`DeploymentReady` waits for pods instead).
    pub fn condition_answered(&mut self, kind: &str) {
        if let Some(started) = self.action_started.take()
            && self.prompt_outcome
            && kind != "DeploymentReady"
        {
            self.env.observation_window.record(started.elapsed());
        }
    }

    /// What is left of the observation window after the latest action; the first step that
    /// watches one opens it for the tier's window ([`wait::ObservationWindow`]). The steps after it, until the next
    /// action, watch up to the same end instead of a window each: what they look for leaves a
    /// lasting trace (a journal entry, an object, a finalizer, a moved resourceVersion or digest),
    /// so a later step still sees what happened since the window opened.
    pub fn observation_window(&mut self) -> std::time::Duration {
        let now = tokio::time::Instant::now();
        let end = *self
            .window_end
            .get_or_insert_with(|| now + self.env.observation_window.current());
        end.saturating_duration_since(now)
    }

    /// A window opened by the step itself ("from now on"), shared as above.
    pub fn new_observation_window(&mut self) -> std::time::Duration {
        self.window_end = None;
        self.observation_window()
    }

    /// The CoderProvisioner as JSON (or `None` when absent).
    pub async fn provisioner_json(&self) -> anyhow::Result<Option<Value>> {
        self.provisioner_json_named(&self.provisioner).await
    }

    /// Every observation of a CR is also checked against the contract's invariants.
    async fn provisioner_json_named(&self, name: &str) -> anyhow::Result<Option<Value>> {
        let object = self.provisioners().get_opt(name).await?;
        let cr = object.map(serde_json::to_value).transpose()?;
        if let Some(cr) = &cr {
            let found = crate::invariants::status_shape::provisioner_invariants(cr);
            if !found.is_empty() {
                let mut violations = self
                    .violations
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                violations.extend(
                    found
                        .into_iter()
                        .map(|v| format!("CoderProvisioner {name}: {v}")),
                );
            }
        }
        Ok(cr)
    }

    /// Polls the scenario's CR until `check` accepts it.
    pub async fn provisioner_eventually<T>(
        &self,
        what: &str,
        check: impl Fn(&Value) -> Observation<T>,
    ) -> anyhow::Result<T> {
        self.provisioner_named_eventually(&self.provisioner, what, check)
            .await
    }

    /// Polls the scenario's CR for `window`; fails unless `check` accepts every observation
    /// (a CR that vanishes fails at once).
    pub async fn provisioner_stays<T>(
        &self,
        what: &str,
        window: std::time::Duration,
        check: impl Fn(&Value) -> Observation<T>,
    ) -> anyhow::Result<T> {
        let check = &check;
        wait::stays(what, self.timeouts(), window, || async move {
            let cr = self
                .provisioner_json()
                .await?
                .ok_or_else(|| anyhow!("the CoderProvisioner vanished"))?;
            Ok(check(&cr))
        })
        .await
    }

    /// Polls the scenario's CR until `check` accepts it, failing early when the operator has
    /// settled without it (D-10, see [`SettleWatch`]).
    pub async fn provisioner_promptly<T>(
        &self,
        what: &str,
        check: impl Fn(&Value) -> Observation<T>,
    ) -> anyhow::Result<T> {
        let (check, settle) = (&check, &SettleWatch::for_world(self));
        wait::eventually(what, self.timeouts(), || async move {
            if let Some(exit) = self.operator_exit().await {
                return Err(wait::Hopeless(format!("the operator exited ({exit})")).into());
            }
            let Some(cr) = self.provisioner_json().await? else {
                return Ok(Err(format!(
                    "CoderProvisioner {} does not exist",
                    self.provisioner
                )));
            };
            let observed = check(&cr);
            if let Err(why) = &observed {
                settle.observe(self, &cr, why).await?;
            }
            Ok(observed)
        })
        .await
    }

    /// Polls `probe` (an observation of the scenario CR's children) until it accepts what it
    /// sees, failing early when the operator has settled without it: the CR's status and the
    /// shortfall `probe` reports both unchanged for D-10's window (see [`SettleWatch`]).
    pub async fn children_promptly<T, F, Fut>(
        &self,
        what: &str,
        timeouts: &Timeouts,
        mut probe: F,
    ) -> anyhow::Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<Observation<T>>>,
    {
        let settle = &SettleWatch::for_world(self);
        wait::eventually(what, timeouts, || {
            let observation = probe();
            async move {
                let observed = observation.await?;
                if let Err(why) = &observed
                    && let Some(cr) = self.provisioner_json().await?
                {
                    settle.observe(self, &cr, why).await?;
                }
                Ok(observed)
            }
        })
        .await
    }

    /// Polls the CR `name` in the scenario's namespace until `check` accepts it.
    pub async fn provisioner_named_eventually<T>(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&Value) -> Observation<T>,
    ) -> anyhow::Result<T> {
        self.provisioner_named_within(name, what, self.timeouts(), check)
            .await
    }

    /// Polls the CR `name` until `check` accepts it in a settled state (D-15): its generation
    /// and status, and the scenario's coderd requests, unchanged for [`Self::settle_window`].
    /// The deadline is `timeouts`' plus that window. A CR that never stands that long is said to
    /// break what its last change shows: key requests with the key in place (R-KEY-4), or a
    /// status rewritten (R-ST-7).
    pub async fn provisioner_settles(
        &self,
        name: &str,
        what: &str,
        timeouts: &Timeouts,
        check: impl Fn(&Value) -> Observation<()>,
    ) -> anyhow::Result<()> {
        let window = self.settle_window();
        let timeouts = Timeouts {
            eventually: timeouts.eventually + window,
            reach_and_hold: 1,
            ..*timeouts
        };
        // How long the state has stood, and what changed last.
        let moved = std::sync::Mutex::new((wait::Steady::default(), None::<(String, usize)>, ""));
        let (check, moved) = (&check, &moved);
        wait::eventually(what, &timeouts, || async move {
            if let Some(exit) = self.operator_exit().await {
                return Err(wait::Hopeless(format!("the operator exited ({exit})")).into());
            }
            let Some(cr) = self.provisioner_json_named(name).await? else {
                return Ok(Err(format!("CoderProvisioner {name} does not exist")));
            };
            let fingerprint = crate::invariants::oracle::state_fingerprint(&cr);
            let (requests, quiet_for) = self.scenario_requests_quiet().await?;
            let before = moved
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .1
                .clone();
            let change = match before {
                Some((status, count)) if count < requests => {
                    let journal = self.journal().await?;
                    let key_writes = journal.iter().skip(count).any(|entry| {
                        entry.method != "GET"
                            && crate::coderd_routes::is_key_request(entry.route.as_deref())
                    });
                    Some(if key_writes {
                        "key requests went on with its key in place (R-KEY-4)"
                    } else if status != fingerprint {
                        "its status was rewritten (R-ST-7)"
                    } else {
                        "coderd requests went on"
                    })
                }
                Some((status, _)) if status != fingerprint => {
                    Some("its status was rewritten (R-ST-7)")
                }
                _ => None,
            };
            let (seen_here, last_change) = {
                let mut moved = moved.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                moved.1 = Some((fingerprint.clone(), requests));
                if let Some(change) = change {
                    moved.2 = change;
                }
                let stood = moved
                    .0
                    .observe((fingerprint.clone(), requests), tokio::time::Instant::now());
                (stood, moved.2)
            };
            // The watch may have seen this status stand since before the wait began.
            let watched = self
                .recorder
                .as_ref()
                .and_then(|r| r.stood(name, &fingerprint))
                .map_or(Duration::ZERO, |status| status.min(quiet_for));
            let stood = seen_here.max(watched);
            if let Err(why) = check(&cr) {
                return Ok(Err(why));
            }
            Ok(if stood >= window {
                Ok(())
            } else {
                Err(format!(
                    "its status and the coderd requests stood {:.1} s of the {:.0} s that make a settled state (D-15){}",
                    stood.as_secs_f64(),
                    window.as_secs_f64(),
                    if last_change.is_empty() {
                        String::new()
                    } else {
                        format!("; the last change: {last_change}")
                    }
                ))
            })
        })
        .await
    }

    /// How many of coderd's requests are the scenario's so far (0 without an admin API).
    async fn scenario_request_count(&self) -> anyhow::Result<usize> {
        Ok(self.scenario_requests_quiet().await?.0)
    }

    /// The scenario's coderd requests so far, and how long ago coderd answered the last one
    /// (forever without an admin API or a request).
    async fn scenario_requests_quiet(&self) -> anyhow::Result<(usize, Duration)> {
        let (Some(_), Some(_)) = (&self.env.coderd.admin, &self.coderd) else {
            return Ok((0, Duration::MAX));
        };
        let journal = self.journal().await?;
        let last = journal
            .iter()
            .filter_map(|entry| entry.at.parse::<jiff::Timestamp>().ok())
            .max();
        let quiet_for = last.map_or(Duration::MAX, |at| {
            Duration::try_from(jiff::Timestamp::now().duration_since(at)).unwrap_or_default()
        });
        Ok((journal.len(), quiet_for))
    }

    /// [`Self::provisioner_named_eventually`] with the scenario's own deadline.
    pub async fn provisioner_named_within<T>(
        &self,
        name: &str,
        what: &str,
        timeouts: &Timeouts,
        check: impl Fn(&Value) -> Observation<T>,
    ) -> anyhow::Result<T> {
        let check = &check;
        wait::eventually(what, timeouts, || async move {
            if let Some(exit) = self.operator_exit().await {
                return Err(wait::Hopeless(format!("the operator exited ({exit})")).into());
            }
            Ok(match self.provisioner_json_named(name).await? {
                Some(cr) => check(&cr),
                None => Err(format!("CoderProvisioner {name} does not exist")),
            })
        })
        .await
    }

    /// How many times the scenario's CR was changed (its `metadata.generation` as the suite
    /// counts actions), for naming the state a finding was made in.
    pub fn generation(&self) -> usize {
        self.generated
            .as_ref()
            .map_or(1, |g| 1 + usize::from(g.change.is_some()))
    }

    /// Restarts the operator under test (only possible when the suite started it).
    pub async fn restart_operator(&mut self) -> anyhow::Result<()> {
        match &self.env.operator {
            Operator::Started(process) => match process.lock().await.as_mut() {
                Some(process) => process.restart().await?,
                None => bail!("the operator was already stopped"),
            },
            Operator::Installed => {
                bail!("the operator is installed in the cluster; the suite cannot restart it")
            }
            Operator::InCluster(operator) => {
                let timeout = self.env.timeouts.eventually;
                if !self.operator_stopped {
                    operator.stop(&self.client(), timeout).await?;
                }
                operator.start(&self.client(), timeout).await?;
            }
        }
        self.operator_stopped = false;
        Ok(())
    }

    /// How the operator the suite started ended, if it ended on its own: no CR changes after that.
    async fn operator_exit(&self) -> Option<std::process::ExitStatus> {
        match &self.env.operator {
            Operator::Started(process) => process.lock().await.as_mut()?.exit_status(),
            Operator::Installed | Operator::InCluster(_) => None,
        }
    }

    /// Stops the operator under test (gracefully) until [`Self::restart_operator`].
    pub async fn stop_operator(&mut self) -> anyhow::Result<()> {
        match &self.env.operator {
            Operator::Started(process) => match process.lock().await.as_mut() {
                Some(process) => process.stop().await,
                None => bail!("the operator was already stopped"),
            },
            Operator::Installed => {
                bail!("the operator is installed in the cluster; the suite cannot stop it")
            }
            Operator::InCluster(operator) => {
                operator
                    .stop(&self.client(), self.env.timeouts.eventually)
                    .await?;
            }
        }
        self.operator_stopped = true;
        Ok(())
    }

    /// Starts one more leader-elected replica of the operator, named
    /// `conformance-replica-a`, `-b`, … (stopping the operator itself before the first); the
    /// after-hook stops them and starts the operator again.
    pub async fn start_replica(&mut self) -> anyhow::Result<String> {
        let command = self.env.replica_command.clone().ok_or_else(|| {
            anyhow!("the suite knows no command for a leader-elected replica (--replica-cmd)")
        })?;
        if self.replicas.is_empty() {
            self.stop_operator().await?;
        }
        let Operator::Started(process) = &self.env.operator else {
            bail!("replicas are started only for an operator the suite started itself");
        };
        let guard = process.lock().await;
        let operator = guard
            .as_ref()
            .ok_or_else(|| anyhow!("the operator was already stopped"))?;
        let letter = b'a' + u8::try_from(self.replicas.len()).context("too many replicas")?;
        let name = format!(
            "{}{}",
            crate::implementation::REPLICA_NAME_PREFIX,
            char::from(letter)
        );
        let replica = operator
            .replica(
                &self.env.client,
                command,
                &name,
                self.replicas.len(),
                std::slice::from_ref(&self.env.coderd.url),
            )
            .await?;
        drop(guard);
        self.replicas.push(replica);
        Ok(name)
    }

    /// Namespace and name of the operator's ServiceAccount, known when the suite started the
    /// operator or was given its Deployment.
    pub async fn operator_service_account(&self) -> anyhow::Result<(String, String)> {
        match &self.env.operator {
            Operator::Started(process) => {
                let process = process.lock().await;
                let process = process
                    .as_ref()
                    .ok_or_else(|| anyhow!("the operator was already stopped"))?;
                let (namespace, name) = process.service_account();
                Ok((namespace.to_owned(), name.to_owned()))
            }
            Operator::InCluster(operator) => {
                Ok((operator.namespace.clone(), operator.service_account.clone()))
            }
            Operator::Installed => {
                bail!("the operator's identity is unknown with --operator installed")
            }
        }
    }

    /// Stops the replicas a step started (paused ones included).
    pub async fn stop_replicas(&mut self) {
        for mut replica in self.replicas.drain(..) {
            replica.stop().await;
        }
    }

    /// The operator's log (its last `tail` lines, or all of it) when the suite can read it: the
    /// process it started (and the replicas a step started), or the pods of an in-cluster
    /// operator (their current ones only).
    pub async fn operator_log(&self, tail: Option<usize>) -> Option<String> {
        let read = |p: &crate::implementation::OperatorProcess| match tail {
            Some(lines) => p.log_tail(lines),
            None => p.full_log(),
        };
        match &self.env.operator {
            Operator::Started(process) => process.lock().await.as_ref().map(|p| {
                let mut log = read(p);
                for replica in &self.replicas {
                    log.push_str(&format!("\n=== replica {}\n", replica.name()));
                    log.push_str(&read(replica));
                }
                log
            }),
            Operator::InCluster(operator) => {
                let tail = tail.map(|lines| i64::try_from(lines).unwrap_or(i64::MAX));
                Some(
                    operator
                        .logs(&self.client(), tail)
                        .await
                        .unwrap_or_else(|error| format!("the operator's pods' logs: {error:#}")),
                )
            }
            Operator::Installed => None,
        }
    }

    /// The secret values this scenario knows: its session token, the values it saw in Secrets
    /// and those it wrote. For redaction and the leak check only; never printed.
    pub fn secret_values(&self) -> Vec<String> {
        let seen = self
            .seen_secrets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let watched = self
            .recorder
            .as_ref()
            .map(|r| r.read(|seen| seen.secret_values.clone()))
            .unwrap_or_default();
        self.coderd
            .iter()
            .map(|c| c.token.clone())
            .chain(seen.iter().cloned())
            .chain(watched)
            .collect()
    }

    /// Remembers a secret value the scenario saw or wrote (see [`Self::secret_values`]).
    pub fn saw_secret(&self, value: &[u8]) {
        if let Ok(text) = std::str::from_utf8(value) {
            self.seen_secrets
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(text.to_owned());
        }
    }

    /// The scenario's second coderd organization (name, id), from "the scenario has a second
    /// coderd organization".
    pub fn second_organization(&self) -> anyhow::Result<&(String, String)> {
        self.second_organization.as_ref().ok_or_else(|| {
            anyhow!("no second organization: start with \"the scenario has a second coderd organization\"")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{
        ActionBaseline, expects_prompt_outcome, names_organization, observed_current_generation,
        roomiest, status_text, waiting_for_pods,
    };

    #[test]
    fn a_scenario_takes_the_place_with_the_most_free_seats() {
        // (capacity, running): the shared environment first, then the private ones.
        assert_eq!(roomiest(&[(16, 0)]), Some(0));
        assert_eq!(roomiest(&[(16, 14), (3, 1), (3, 0)]), Some(2));
        assert_eq!(
            roomiest(&[(16, 13), (3, 0)]),
            Some(0),
            "a tie goes to the shared one"
        );
        assert_eq!(roomiest(&[(16, 16), (3, 2)]), Some(1));
        assert_eq!(roomiest(&[(16, 16), (3, 3)]), None);
    }

    #[test]
    fn an_unchanged_cr_after_an_action_that_kept_its_generation_is_not_yet_answered() {
        let cr = |generation: i64, reason: &str| {
            serde_json::json!({"metadata": {"generation": generation}, "status": {"conditions": [
                {"type": "CredentialsReady", "status": "False", "reason": reason}]}})
        };
        let before = cr(3, "CredentialDestinationMissing");
        let baseline = ActionBaseline {
            generation: Some(3),
            status: status_text(&before),
            requests: 7,
        };
        let answered =
            |cr: &serde_json::Value, requests| baseline.answered_by(cr, &status_text(cr), requests);
        assert!(
            !answered(&before, 7),
            "a Secret fixed, the operator not come to it yet"
        );
        assert!(
            answered(&cr(4, "CredentialDestinationMissing"), 7),
            "a spec change"
        );
        assert!(
            answered(&cr(3, "CredentialLabelMissing"), 7),
            "a pass wrote status"
        );
        assert!(answered(&before, 8), "a pass asked coderd");
    }

    #[test]
    fn pods_still_starting_are_not_a_settled_operator() {
        let cr = |conditions: serde_json::Value| serde_json::json!({"status": {"conditions": conditions}});
        let ok = |t: &str| serde_json::json!({"type": t, "status": "True"});
        let no = |t: &str| serde_json::json!({"type": t, "status": "False"});
        assert!(waiting_for_pods(&cr(serde_json::json!([
            ok("ProvisionerKeyReady"),
            ok("ProvisionerKeySecretReady"),
            no("DeploymentReady")
        ]))));
        assert!(
            !waiting_for_pods(&cr(serde_json::json!([
                ok("ControlPlaneReady"),
                ok("OperatorAccessReady")
            ]))),
            "a pass that stopped before the key, at a gate it does not show"
        );
        assert!(!waiting_for_pods(&cr(serde_json::json!([
            no("CredentialsReady"),
            no("DeploymentReady")
        ]))));
        assert!(!waiting_for_pods(&cr(serde_json::json!([
            ok("ProvisionerKeyReady"),
            ok("DeploymentReady")
        ]))));
        assert!(!waiting_for_pods(&cr(serde_json::json!([]))));
    }

    #[test]
    fn a_generation_is_observed_in_status_or_in_every_condition_of_a_stopped_pass() {
        let cr = |observed: Option<i64>, conditions: &[i64]| {
            let conditions: Vec<serde_json::Value> = conditions
                .iter()
                .map(|g| serde_json::json!({"type": "ControlPlaneReady", "observedGeneration": g}))
                .collect();
            serde_json::json!({"metadata": {"generation": 2}, "status": {"observedGeneration": observed, "conditions": conditions}})
        };
        assert!(observed_current_generation(&cr(Some(2), &[])));
        assert!(observed_current_generation(&cr(Some(1), &[2, 2])));
        assert!(!observed_current_generation(&cr(Some(1), &[2, 1])));
        assert!(!observed_current_generation(&cr(None, &[])));
    }

    #[test]
    fn scenarios_with_faults_or_retry_schedules_may_take_longer() {
        let tags = |t: &[&str]| t.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(expects_prompt_outcome(&tags(&["R-CRED-3", "core"])));
        assert!(!expects_prompt_outcome(&tags(&[
            "R-RL-1", "slow", "extended"
        ])));
        assert!(!expects_prompt_outcome(&tags(&["fault-injection"])));
    }

    #[test]
    fn a_request_is_attributed_by_the_organization_in_its_path() {
        let ours = ["conf-1a2b".to_owned(), "0f0e-id".to_owned()];
        assert!(names_organization(
            "/api/v2/organizations/conf-1a2b/provisionerkeys",
            &ours
        ));
        assert!(names_organization(
            "/api/v2/organizations/0f0e-id/provisionerkeys/k?x=1",
            &ours
        ));
        assert!(!names_organization(
            "/api/v2/organizations/conf-other/provisionerkeys",
            &ours
        ));
        assert!(!names_organization("/api/v2/entitlements", &ours));
        assert!(!names_organization("/api/v2/organizations/conf-1a2b", &[]));
    }
}
