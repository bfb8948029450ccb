//! Generated cases: CoderProvisioner specs drawn from the space the contract describes (names at
//! and past the length limits, the organization given, empty or absent, key names in any case,
//! tags added and removed, other Secrets and data keys, replicas from 0, extraEnv of every
//! source, optional references to absent Secrets, …) and one change after the CR settled.
//!
//! Deterministic by seed: the same seed gives the same case in the same suite version, so a
//! failure names its seed and the case, and `--seeds` replays it. The checks are not here: the
//! end-of-scenario oracle ([`crate::invariants`]) holds every settled CR to its spec, whatever
//! the spec is; these cases only make sure it sees specs nobody hand-picked.
use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::{RngExt as _, SeedableRng as _};
use serde_json::{Map, Value, json};

/// The seeds every run checks (the Extended level's generated cases): one per [`BOUNDARIES`]
/// value, since a seed's boundary is `BOUNDARIES[seed % 15]`.
pub const FIXED_SEEDS: [u64; 15] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];

/// A documented limit a case sits at, just under or just past: off-by-one mistakes live on the
/// limit, which random lengths rarely hit. An admitted value must settle as the oracle says; a
/// value past an admission limit must be refused by the API server ([`Case::past_limit`]), and
/// the case then goes on at the limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Boundary {
    /// The CR name's length: child names and the instance label hold 63 (D-6), the default key
    /// name 64 (D-4), the default key Secret name `<name>-provisioner-key` 253 (R-SEC-1).
    NameLength(usize),
    /// `spec.key.name`'s length (D-4: at most 64, refused at admission past it).
    KeyNameLength(usize),
    /// `spec.key.secretName`'s length (R-CRD-6: at most 253).
    SecretNameLength(usize),
    /// `spec.key.secretKey`'s length (R-CRD-6: at most 253).
    SecretKeyLength(usize),
    /// `spec.terminationGracePeriodSeconds: 0`: a value, not "unset" (R-CRD-10, R-POD-6).
    GracePeriodZero,
    /// `spec.replicas: 0`, the schema's minimum (D-4).
    ReplicasZero,
}

/// Every boundary a case can sit on; seed `s` sits on `BOUNDARIES[s % len]`.
pub const BOUNDARIES: [Boundary; 15] = [
    Boundary::NameLength(62),
    Boundary::NameLength(63),
    Boundary::NameLength(64),
    Boundary::NameLength(65),
    // `<name>-provisioner-key` of exactly 253 characters, and of 254 (shortened, R-SEC-1).
    Boundary::NameLength(237),
    Boundary::NameLength(238),
    Boundary::KeyNameLength(63),
    Boundary::KeyNameLength(64),
    Boundary::KeyNameLength(65),
    Boundary::SecretNameLength(253),
    Boundary::SecretNameLength(254),
    Boundary::SecretKeyLength(253),
    Boundary::SecretKeyLength(254),
    Boundary::GracePeriodZero,
    Boundary::ReplicasZero,
];

/// The longest `spec.key.name` (D-4) and `spec.key.secretName`/`secretKey` (R-CRD-6) admitted.
const KEY_NAME_LIMIT: usize = 64;
const SECRET_FIELD_LIMIT: usize = 253;

/// A spec value past an admission limit: the API server must refuse the CR with it.
#[derive(Clone, Debug, PartialEq)]
pub struct PastLimit {
    /// What it is, for messages ("spec.key.name of 65 characters (D-4: at most 64)").
    pub what: String,
    /// The case's spec with that value instead of the one at the limit.
    pub spec: Value,
}

/// coderd answers a case meets once per route (issue 38): in one phase of the case, the first
/// request of the scenario on each coderd route its operator may call on the way to a key gets
/// this answer instead of coderd's own, and coderd answers normally after it. The case must then
/// settle as the oracle says, within the key budget of its change alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CaseFault {
    pub answer: FaultAnswer,
    pub phase: Phase,
}

/// What the faulted request gets. Entitlements are not faulted here: their failures requeue after
/// about two minutes (R-ENT-8), longer than a case waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultAnswer {
    /// A status with coderd's error body: 429 (R-RL-1, D-9), or a 5xx (R-KEY-18).
    Status(u16),
    /// The connection reset before any answer (the request was not carried out).
    Reset,
    /// coderd's own answer, two seconds late (under any sensible request timeout).
    Slow,
}

/// The coderd routes a case's operator may call on its way to a key (D-12: whichever it calls;
/// a fault on a route it does not call is never met).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultRoute {
    /// `GET /api/v2/organizations/{organization}` (R-KEY-1).
    Organization,
    /// `POST …/provisionerkeys` (R-KEY-3).
    KeyCreate,
    /// `GET …/provisionerkeys`, the list (R-KEY-6 by listing, R-DEL-4, R-KEY-22).
    KeyList,
    /// `DELETE …/provisionerkeys/{name}` (a rotation, R-KEY-13…16).
    KeyDelete,
    /// `GET /api/v2/provisionerkeys/{key}`, a new key's own record (D-12).
    KeyLookup,
}

/// When the fault is in force: from the case's first apply, or from its change on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    FirstCreate,
    Change,
}

pub const FAULT_ANSWERS: [FaultAnswer; 7] = [
    FaultAnswer::Status(429),
    FaultAnswer::Status(500),
    FaultAnswer::Status(502),
    FaultAnswer::Status(503),
    FaultAnswer::Status(504),
    FaultAnswer::Reset,
    FaultAnswer::Slow,
];
pub const FAULT_ROUTES: [FaultRoute; 5] = [
    FaultRoute::Organization,
    FaultRoute::KeyCreate,
    FaultRoute::KeyList,
    FaultRoute::KeyDelete,
    FaultRoute::KeyLookup,
];
pub const PHASES: [Phase; 2] = [Phase::FirstCreate, Phase::Change];

impl FaultRoute {
    /// The method and the route alias of [`crate::coderd_routes`].
    pub fn request(self) -> (&'static str, &'static str) {
        match self {
            Self::Organization => ("GET", "organization"),
            Self::KeyCreate => ("POST", "provisionerkeys"),
            Self::KeyList => ("GET", "provisionerkeys"),
            Self::KeyDelete => ("DELETE", "provisionerkey"),
            Self::KeyLookup => ("GET", "daemon-key"),
        }
    }
}

impl CaseFault {
    /// The fault of `seed`: none for one seed in four; otherwise its answer and phase drawn by the
    /// seed's residues, so that consecutive seeds meet every value of each.
    fn of_seed(seed: u64) -> Option<Self> {
        if seed.is_multiple_of(4) {
            return None;
        }
        let at = |len: usize, step: u64| ((seed / step) % len as u64) as usize;
        Some(Self {
            answer: FAULT_ANSWERS[at(FAULT_ANSWERS.len(), 1)],
            phase: PHASES[at(PHASES.len(), 7)],
        })
    }

    /// The routes the answer is given on. A failed delete in a rotation is best-effort (R-KEY-16:
    /// the old key may stay), so a delete gets only the answers after which it is retried: 429
    /// (D-9) or a slow success.
    pub fn routes(self) -> impl Iterator<Item = FaultRoute> {
        FAULT_ROUTES.into_iter().filter(move |route| {
            *route != FaultRoute::KeyDelete
                || matches!(self.answer, FaultAnswer::Status(429) | FaultAnswer::Slow)
        })
    }
}

/// Which coderds a case meets (issue 38's environment shapes): the fake alone, or other coderds
/// on the same host, on other ports, each holding the scenario's organizations under the same
/// names with other ids, a default organization of another name and id, an owner token of its
/// own, and the older or newer modelled release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// The fake alone (the second control plane is the fake's too).
    OneCoderd,
    /// The case's control plane publishes coderd B; a change of control plane moves it to the
    /// fake.
    OnOtherPort,
    /// The case starts on the fake and its change moves it to coderd B's control plane.
    MovesToOtherPort,
    /// The case starts on coderd B and its change moves it to coderd C's: three coderds.
    MovesBetweenOtherPorts,
    /// The case starts on the fake and its change is its control plane's `status.url` moving to
    /// coderd B (which takes the same operator token, as a coderd moved to another port would).
    UrlMovesToOtherPort,
}

pub const SHAPES: [Shape; 5] = [
    Shape::OneCoderd,
    Shape::OnOtherPort,
    Shape::MovesToOtherPort,
    Shape::MovesBetweenOtherPorts,
    Shape::UrlMovesToOtherPort,
];

impl Shape {
    /// The shape of `seed`: `SHAPES[(seed / 3) % 5]`, so that seeds 1 to 15 meet each.
    fn of_seed(seed: u64) -> Self {
        SHAPES[((seed / 3) % SHAPES.len() as u64) as usize]
    }

    /// The other coderds the case needs, by index into [`Context::other_control_planes`].
    pub fn other_coderds(self) -> &'static [usize] {
        match self {
            Self::OneCoderd => &[],
            Self::OnOtherPort | Self::MovesToOtherPort | Self::UrlMovesToOtherPort => &[0],
            Self::MovesBetweenOtherPorts => &[0, 1],
        }
    }
}

/// What a case may refer to in its scenario.
#[derive(Clone, Debug)]
pub struct Context {
    /// The scenario's own coderd organization and a second one.
    pub organizations: [String; 2],
    /// The fixture control plane and a second Ready one with its own operator token.
    pub control_planes: [String; 2],
    /// The Ready control planes of coderds B and C (same host, other ports), made when a case's
    /// [`Shape`] needs them.
    pub other_control_planes: [String; 2],
    /// The URLs of coderds B and C, as control planes publish them.
    pub other_urls: [String; 2],
}

/// One generated CoderProvisioner, and the entitlement and image its control plane gives.
#[derive(Clone, Debug, PartialEq)]
pub struct Case {
    pub name: String,
    pub spec: Value,
    pub entitlement: Entitlement,
    /// The control plane's `spec.image` (R-POD-8's second choice), when the case sets one.
    pub control_plane_image: Option<String>,
    /// The limit the case sits on.
    pub boundary: Boundary,
    /// The same case one past an admission limit, applied first and refused.
    pub past_limit: Option<PastLimit>,
    /// The coderd answer the case meets once, if any.
    pub fault: Option<CaseFault>,
    /// The coderds it meets.
    pub shape: Shape,
}

/// The control plane's own entitlement check (R-ENT-1…3), as the fixture writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entitlement {
    FreshEntitled,
    FreshGracePeriod,
    /// Checked more than two minutes ago: the operator must ask coderd.
    StaleEntitled,
    /// A value that settles nothing (`unknown`): the operator must ask coderd.
    FreshUnknown,
}

impl Entitlement {
    /// Whether the control plane's check alone settles the entitlement (R-ENT-1).
    pub fn settles(self) -> bool {
        matches!(self, Self::FreshEntitled | Self::FreshGracePeriod)
    }

    /// The control plane status patch, given "now" and "five minutes ago" as RFC 3339.
    pub fn status_patch(self, now: &str, long_ago: &str) -> Value {
        let (value, checked) = match self {
            Self::FreshEntitled => ("entitled", now),
            Self::FreshGracePeriod => ("grace_period", now),
            Self::StaleEntitled => ("entitled", long_ago),
            Self::FreshUnknown => ("unknown", now),
        };
        json!({"status": {"externalProvisionerDaemonsEntitlement": value, "entitlementsLastChecked": checked}})
    }
}

/// A change to a settled case's spec, as a JSON merge patch of the spec.
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    pub what: &'static str,
    pub patch: Value,
    /// The case's control plane's `status.url` moves here instead (the spec is not patched).
    pub control_plane_url: Option<String>,
    /// Whether the change may replace the key: tags, key name, organization, or where the key is
    /// stored (R-KEY-13…15; a move may or may not make a new key). Any other change makes no key
    /// request (R-KEY-4).
    pub may_rotate: bool,
}

fn pick<'a, T>(rng: &mut StdRng, items: &'a [T]) -> &'a T {
    &items[rng.random_range(0..items.len())]
}

fn word(rng: &mut StdRng, len: usize) -> String {
    const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    (0..len).map(|_| char::from(*pick(rng, LETTERS))).collect()
}

/// A DNS-label-like name of exactly `len` characters starting with `prefix`.
fn name_of_length(rng: &mut StdRng, prefix: &str, len: usize) -> String {
    let mut name = prefix.to_owned();
    while name.len() < len {
        name.push_str(&word(rng, 1));
    }
    name.truncate(len);
    name
}

fn tags(rng: &mut StdRng) -> Map<String, Value> {
    const KEYS: [&str; 5] = ["scope", "team", "owner", "region", "os"];
    let count = rng.random_range(0..=3);
    (0..count)
        .map(|_| (pick(rng, &KEYS).to_string(), Value::from(word(rng, 5))))
        .collect()
}

fn extra_env(rng: &mut StdRng) -> Vec<Value> {
    let count = rng.random_range(0..=3);
    (0..count)
        .map(|n| match rng.random_range(0..4) {
            0 => json!({"name": format!("EXTRA_{n}"), "value": word(rng, 6)}),
            1 => json!({"name": format!("POD_{n}"), "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}),
            // D-2: an optional reference to a Secret that does not exist is allowed.
            2 => json!({"name": format!("OPTIONAL_{n}"), "valueFrom": {"secretKeyRef": {"name": format!("absent-{}", word(rng, 4)), "key": "value", "optional": true}}}),
            _ => json!({"name": format!("EMPTY_{n}"), "value": ""}),
        })
        .collect()
}

/// The case of `seed`.
pub fn case(seed: u64, context: &Context) -> Case {
    let mut rng = StdRng::seed_from_u64(seed);
    // Short, at the 63-character limit of child names, and past it (children and labels
    // shortened; the default key name past coderd's 64).
    let length = *pick(&mut rng, &[12usize, 20, 51, 63, 70]);
    let name = name_of_length(&mut rng, &format!("gen{seed}-"), length);
    let shape = Shape::of_seed(seed);
    let control_plane = match shape {
        Shape::OnOtherPort | Shape::MovesBetweenOtherPorts => &context.other_control_planes[0],
        Shape::OneCoderd | Shape::MovesToOtherPort | Shape::UrlMovesToOtherPort => {
            &context.control_planes[0]
        }
    };
    let mut spec = Map::new();
    spec.insert("controlPlaneRef".into(), json!({"name": control_plane}));
    match rng.random_range(0..4) {
        0 => {}
        1 => {
            spec.insert("organizationName".into(), json!(""));
        }
        n => {
            spec.insert(
                "organizationName".into(),
                json!(context.organizations[n - 2]),
            );
        }
    }
    let mut key = Map::new();
    if rng.random_bool(0.5) {
        let len = *pick(&mut rng, &[5usize, 30, 64]);
        let mut key_name = name_of_length(&mut rng, "key-", len);
        if rng.random_bool(0.5) {
            key_name = key_name.to_uppercase();
        }
        key.insert("name".into(), json!(key_name));
    }
    if rng.random_bool(0.4) {
        key.insert(
            "secretName".into(),
            json!(format!("gen-{}", word(&mut rng, 6))),
        );
    }
    if rng.random_bool(0.4) {
        key.insert(
            "secretKey".into(),
            json!(pick(
                &mut rng,
                &["key", "token", "daemon.key", "daemon_key"]
            )),
        );
    }
    if !key.is_empty() {
        spec.insert("key".into(), Value::Object(key));
    }
    let tags = tags(&mut rng);
    if !tags.is_empty() || rng.random_bool(0.3) {
        spec.insert("tags".into(), Value::Object(tags));
    }
    if let Some(replicas) = *pick(&mut rng, &[None, Some(0), Some(1), Some(2), Some(3)]) {
        spec.insert("replicas".into(), json!(replicas));
    }
    if rng.random_bool(0.4) {
        spec.insert(
            "image".into(),
            json!(format!("registry.test/coder:v{}", rng.random_range(1..9))),
        );
    }
    if rng.random_bool(0.4) {
        let args: Vec<&str> = (0..rng.random_range(1..=2))
            .map(|_| {
                *pick(
                    &mut rng,
                    &["--verbose", "--poll-interval=2s", "--log-human=/dev/stderr"],
                )
            })
            .collect();
        spec.insert("extraArgs".into(), json!(args));
    }
    let env = extra_env(&mut rng);
    if !env.is_empty() {
        spec.insert("extraEnv".into(), json!(env));
    }
    match rng.random_range(0..3) {
        0 => {}
        1 => {
            spec.insert(
                "resources".into(),
                json!({"requests": {"cpu": "100m", "memory": "64Mi"}}),
            );
        }
        _ => {
            spec.insert(
                "resources".into(),
                json!({"limits": {"cpu": "0.5", "memory": "1Gi"}}),
            );
        }
    }
    if rng.random_bool(0.3) {
        spec.insert("imagePullSecrets".into(), json!([{"name": "pull-secret"}]));
    }
    if let Some(grace) = *pick(&mut rng, &[None, Some(0), Some(30), Some(900)]) {
        spec.insert("terminationGracePeriodSeconds".into(), json!(grace));
    }
    let entitlement = *pick(
        &mut rng,
        &[
            Entitlement::FreshEntitled,
            Entitlement::FreshGracePeriod,
            Entitlement::StaleEntitled,
            Entitlement::FreshUnknown,
        ],
    );
    let control_plane_image = rng
        .random_bool(0.5)
        .then(|| format!("registry.test/control-plane:v{}", rng.random_range(1..9)));
    let boundary = BOUNDARIES[(seed % BOUNDARIES.len() as u64) as usize];
    let (name, past_limit) = sit_on(boundary, &mut rng, seed, name, &mut spec);
    let fault = CaseFault::of_seed(seed);
    Case {
        name,
        spec: Value::Object(spec),
        entitlement,
        control_plane_image,
        boundary,
        past_limit,
        fault,
        shape,
    }
}

/// Puts the case on `boundary`: the name or spec field at that length or value. A length past an
/// admission limit gives the spec with it as [`PastLimit`], and the case keeps the limit itself.
fn sit_on(
    boundary: Boundary,
    rng: &mut StdRng,
    seed: u64,
    name: String,
    spec: &mut Map<String, Value>,
) -> (String, Option<PastLimit>) {
    let mut key_field = |field: &str, length: usize, limit: usize, rule: &str, prefix: &str| {
        let value = name_of_length(rng, prefix, length);
        let past = (length > limit).then(|| {
            let mut past = spec.clone();
            key_object(&mut past).insert(field.into(), json!(value));
            PastLimit {
                what: format!("spec.key.{field} of {length} characters ({rule}: at most {limit})"),
                spec: Value::Object(past),
            }
        });
        key_object(spec).insert(field.into(), json!(&value[..length.min(limit)]));
        past
    };
    match boundary {
        Boundary::NameLength(length) => {
            // The limits the name reaches are those of the names made from it by default.
            if let Some(key) = spec.get_mut("key").and_then(Value::as_object_mut) {
                key.remove("name");
                key.remove("secretName");
            }
            return (name_of_length(rng, &format!("gen{seed}-"), length), None);
        }
        Boundary::KeyNameLength(length) => {
            let past = key_field("name", length, KEY_NAME_LIMIT, "D-4", "key-");
            return (name, past);
        }
        Boundary::SecretNameLength(length) => {
            let past = key_field("secretName", length, SECRET_FIELD_LIMIT, "R-CRD-6", "gen-");
            return (name, past);
        }
        Boundary::SecretKeyLength(length) => {
            let past = key_field("secretKey", length, SECRET_FIELD_LIMIT, "R-CRD-6", "data.");
            return (name, past);
        }
        Boundary::GracePeriodZero => {
            spec.insert("terminationGracePeriodSeconds".into(), json!(0));
        }
        Boundary::ReplicasZero => {
            spec.insert("replicas".into(), json!(0));
        }
    }
    (name, None)
}

fn key_object(spec: &mut Map<String, Value>) -> &mut Map<String, Value> {
    let key = spec.entry("key").or_insert_with(|| json!({}));
    if !key.is_object() {
        *key = json!({});
    }
    key.as_object_mut().expect("an object")
}

/// The change of `seed`'s case (drawn from the seed too, after the case).
pub fn change(seed: u64, case: &Case, context: &Context) -> Change {
    let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let spec = &case.spec;
    let current_tags: BTreeMap<String, Value> = spec
        .get("tags")
        .and_then(Value::as_object)
        .map(|t| t.clone().into_iter().collect())
        .unwrap_or_default();
    let moved_to = |control_plane: &String| Change {
        what: "the control plane",
        patch: json!({"controlPlaneRef": {"name": control_plane}}),
        control_plane_url: None,
        may_rotate: true,
    };
    match case.shape {
        Shape::MovesToOtherPort => return moved_to(&context.other_control_planes[0]),
        Shape::MovesBetweenOtherPorts => return moved_to(&context.other_control_planes[1]),
        Shape::UrlMovesToOtherPort => {
            return Change {
                what: "the control plane's URL",
                patch: json!({}),
                control_plane_url: Some(context.other_urls[0].clone()),
                may_rotate: true,
            };
        }
        Shape::OneCoderd | Shape::OnOtherPort => {}
    }
    match rng.random_range(0..10) {
        0 => {
            // A tag added, one removed, or one's value changed.
            let patch = match current_tags.keys().next() {
                Some(key) if rng.random_bool(0.5) => json!({"tags": {key: null}}),
                Some(key) => json!({"tags": {key: word(&mut rng, 7)}}),
                None => json!({"tags": {"added": word(&mut rng, 4)}}),
            };
            Change {
                what: "a tag",
                patch,
                control_plane_url: None,
                may_rotate: true,
            }
        }
        1 => Change {
            what: "the key name",
            patch: json!({"key": {"name": format!("Renamed-{}", word(&mut rng, 6))}}),
            control_plane_url: None,
            may_rotate: true,
        },
        2 => {
            let now = spec
                .get("organizationName")
                .and_then(Value::as_str)
                .unwrap_or("");
            let other = if now == context.organizations[0] {
                &context.organizations[1]
            } else {
                &context.organizations[0]
            };
            Change {
                what: "the organization",
                patch: json!({"organizationName": other}),
                control_plane_url: None,
                may_rotate: true,
            }
        }
        3 => Change {
            what: "where the key is stored",
            patch: json!({"key": {"secretName": format!("moved-{}", word(&mut rng, 5)), "secretKey": "moved.key"}}),
            control_plane_url: None,
            may_rotate: true,
        },
        4 => Change {
            what: "the replicas",
            patch: json!({"replicas": rng.random_range(0..4)}),
            control_plane_url: None,
            may_rotate: false,
        },
        5 => Change {
            what: "the image",
            patch: json!({"image": format!("registry.test/coder:changed-{}", word(&mut rng, 3))}),
            control_plane_url: None,
            may_rotate: false,
        },
        6 => Change {
            what: "the extra env",
            patch: json!({"extraEnv": extra_env(&mut rng)}),
            control_plane_url: None,
            may_rotate: false,
        },
        8 => moved_to(&context.control_planes[1]),
        7 => Change {
            what: "the resources and grace period",
            patch: json!({"resources": null, "terminationGracePeriodSeconds": rng.random_range(1..120)}),
            control_plane_url: None,
            may_rotate: false,
        },
        _ => Change {
            what: "the extra args",
            patch: json!({"extraArgs": ["--changed"]}),
            control_plane_url: None,
            may_rotate: false,
        },
    }
}

/// The cases one step simpler than `case`, the largest simplifications first (for shrinking a
/// failing case): the name at 12 characters, each optional spec field removed, each tag, key
/// field, extraEnv entry or extraArg removed, the control plane's image removed, and its
/// entitlement check fresh and `entitled`. `controlPlaneRef` always stays.
pub fn simpler(case: &Case) -> Vec<Case> {
    const SHORT: usize = 12;
    let mut out = Vec::new();
    let with_spec = |spec: Map<String, Value>| Case {
        spec: Value::Object(spec),
        ..case.clone()
    };
    if case.name.len() > SHORT {
        let mut name = case.name[..SHORT].to_owned();
        while name.ends_with('-') {
            name.pop();
        }
        out.push(Case {
            name,
            ..case.clone()
        });
    }
    let spec = case.spec.as_object().cloned().unwrap_or_default();
    for field in spec.keys().filter(|f| *f != "controlPlaneRef") {
        let mut smaller = spec.clone();
        smaller.remove(field);
        out.push(with_spec(smaller));
    }
    for (field, value) in &spec {
        match value {
            Value::Object(members) if members.len() > 1 => {
                for member in members.keys() {
                    let mut fewer = members.clone();
                    fewer.remove(member);
                    let mut smaller = spec.clone();
                    smaller.insert(field.clone(), Value::Object(fewer));
                    out.push(with_spec(smaller));
                }
            }
            Value::Array(items) if items.len() > 1 => {
                for at in 0..items.len() {
                    let mut fewer = items.clone();
                    fewer.remove(at);
                    let mut smaller = spec.clone();
                    smaller.insert(field.clone(), Value::Array(fewer));
                    out.push(with_spec(smaller));
                }
            }
            _ => {}
        }
    }
    if case.control_plane_image.is_some() {
        out.push(Case {
            control_plane_image: None,
            ..case.clone()
        });
    }
    if case.entitlement != Entitlement::FreshEntitled {
        out.push(Case {
            entitlement: Entitlement::FreshEntitled,
            ..case.clone()
        });
    }
    if case.fault.is_some() {
        out.push(Case {
            fault: None,
            ..case.clone()
        });
    }
    out
}

/// The name of a shrinking trial: `name` with its end replaced by `-t<trial>` (`-T<trial>` in a
/// name without lower-case letters), the same length, so that a trial keeps the name's shape (at
/// or past a limit, upper-case or not) and never meets another trial's objects.
fn trial_name(name: &str, trial: usize) -> String {
    let upper = !name.chars().any(|c| c.is_ascii_lowercase());
    let (marker, filler) = if upper { ('T', 'X') } else { ('t', 'x') };
    let suffix = format!("-{marker}{trial}");
    let keep = name.len().saturating_sub(suffix.len());
    let mut head = name[..keep].trim_end_matches('-').to_owned();
    while head.len() < keep.max(1) {
        head.push(filler);
    }
    format!("{head}{suffix}")
}

/// The names in a spec or a change's patch that a trial must not share with the scenario's CR
/// or another trial: the coderd key's name and the key Secret's name.
fn rename_for_trial(spec: &mut Value, trial: usize) {
    for field in ["name", "secretName"] {
        if let Some(value) = spec.pointer_mut(&format!("/key/{field}"))
            && let Some(name) = value.as_str()
        {
            *value = json!(trial_name(name, trial));
        }
    }
}

/// `case` as shrinking trial `trial` applies it: its CR, explicit key name and key Secret name
/// renamed by [`trial_name`] (the default key and Secret names follow the CR's), so that trials
/// never meet each other's objects, nor the scenario's.
pub fn for_trial(case: &Case, trial: usize) -> Case {
    let mut spec = case.spec.clone();
    rename_for_trial(&mut spec, trial);
    Case {
        name: trial_name(&case.name, trial),
        spec,
        ..case.clone()
    }
}

/// `change` as shrinking trial `trial` makes it: a new key name or key Secret renamed as
/// [`for_trial`] renames the case's.
pub fn change_for_trial(change: &Change, trial: usize) -> Change {
    let mut patch = change.patch.clone();
    rename_for_trial(&mut patch, trial);
    Change {
        patch,
        ..change.clone()
    }
}

/// The case as a reader wants it in a failure: name, spec, and the change.
pub fn describe(seed: u64, case: &Case, change: Option<&Change>) -> String {
    let spec = serde_json::to_string(&case.spec).unwrap_or_default();
    let mut text = format!(
        "generated case seed {seed} ({:?}, fault {:?}, {:?}): CoderProvisioner {} with spec {spec}, control plane entitlement {:?} and image {:?}",
        case.boundary,
        case.fault,
        case.shape,
        case.name,
        case.entitlement,
        case.control_plane_image
    );
    if let Some(change) = change {
        match &change.control_plane_url {
            Some(url) => text.push_str(&format!("; then {} moved to {url}", change.what)),
            None => text.push_str(&format!(
                "; then {} changed by {}",
                change.what, change.patch
            )),
        }
    }
    text
}

/// The generated cases' feature text with its Examples rows replaced by `seeds` (`--explore`):
/// the same scenario, other cases. Fails when the text has no `| seed |` table.
pub fn with_seeds(feature: &str, seeds: impl IntoIterator<Item = u64>) -> anyhow::Result<String> {
    let seeds: Vec<u64> = seeds.into_iter().collect();
    let header = feature
        .lines()
        .find(|line| line.trim() == "| seed |")
        .ok_or_else(|| anyhow::anyhow!("the generated cases' feature has no `| seed |` table"))?;
    let indent = &header[..header.len() - header.trim_start().len()];
    let mut out = String::new();
    let mut in_table = false;
    for line in feature.lines() {
        if line == header {
            in_table = true;
            out.push_str(line);
            out.push('\n');
            for seed in &seeds {
                out.push_str(&format!("{indent}| {seed} |\n"));
            }
            continue;
        }
        if in_table && line.trim_start().starts_with('|') {
            continue;
        }
        in_table = false;
        out.push_str(line);
        out.push('\n');
    }
    Ok(out)
}

/// The seed, case and change of the scenario, kept for later steps and failure messages.
pub struct Generated {
    pub seed: u64,
    pub case: Case,
    pub change: Option<Change>,
    /// What the API server did wrong at admission: admitted the case's value past its limit, or
    /// refused the case at its limit.
    pub admission_findings: Vec<String>,
    /// The key the CR recorded when its change was made: `controlPlaneURL`, `organizationID`,
    /// `provisionerKeyID`.
    pub key_before_change: Option<[String; 3]>,
}

impl Generated {
    pub fn describe(&self) -> String {
        describe(self.seed, &self.case, self.change.as_ref())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn exploring_replaces_the_seed_rows() {
        let feature = "Feature: g\n  Scenario Outline: s <seed>\n    Given x <seed>\n\n    Examples:\n      | seed |\n      | 1    |\n      | 2    |\n\n  Scenario: after\n";
        let explored = super::with_seeds(feature, [40, 41]).unwrap();
        assert_eq!(
            explored,
            "Feature: g\n  Scenario Outline: s <seed>\n    Given x <seed>\n\n    Examples:\n      | seed |\n      | 40 |\n      | 41 |\n\n  Scenario: after\n"
        );
        assert!(super::with_seeds("Feature: none\n", [1]).is_err());
    }

    use super::*;

    fn context() -> Context {
        Context {
            organizations: ["conf-a".into(), "conf-b".into()],
            control_planes: ["cp".into(), "cp2".into()],
            other_control_planes: ["cp-b".into(), "cp-c".into()],
            other_urls: ["http://127.0.0.1:2".into(), "http://127.0.0.1:3".into()],
        }
    }

    #[test]
    fn each_simpler_case_is_one_step_smaller_and_keeps_its_control_plane() {
        for seed in FIXED_SEEDS {
            let case = case(seed, &context());
            let size = |c: &Case| {
                serde_json::to_string(&c.spec).unwrap().len()
                    + c.name.len()
                    + usize::from(c.control_plane_image.is_some())
                    + usize::from(c.entitlement != Entitlement::FreshEntitled)
                    + usize::from(c.fault.is_some())
            };
            for smaller in simpler(&case) {
                assert!(size(&smaller) < size(&case), "{smaller:?} from {case:?}");
                assert_eq!(
                    smaller.spec.get("controlPlaneRef"),
                    case.spec.get("controlPlaneRef")
                );
            }
        }
        let bare = Case {
            name: "gen1-abc".into(),
            spec: json!({"controlPlaneRef": {"name": "cp"}}),
            entitlement: Entitlement::FreshEntitled,
            control_plane_image: None,
            boundary: Boundary::ReplicasZero,
            past_limit: None,
            fault: None,
            shape: Shape::OneCoderd,
        };
        assert!(
            simpler(&bare).is_empty(),
            "the smallest case has nothing to drop"
        );
    }

    #[test]
    fn a_trial_name_keeps_the_length_and_the_case() {
        assert_eq!(trial_name("gen3-abcdefgh", 7), "gen3-abcde-t7");
        assert_eq!(trial_name("gen3-abc-xyz", 5), "gen3-abcx-t5");
        assert_eq!(trial_name("KEY-ABCDEF", 12), "KEY-AB-T12");
        assert_eq!(trial_name("key", 100), "x-t100");
        let long = name_of_length(&mut StdRng::seed_from_u64(1), "gen1-", 70);
        assert_eq!(trial_name(&long, 3).len(), 70);
    }

    /// A shrunk case once reused the scenario's key Secret name in every trial, and its trials
    /// failed on each other's Secret.
    #[test]
    fn trials_share_no_name_with_the_case_or_each_other() {
        let names = |case: &Case, change: &Change| {
            [
                Some(case.name.clone()),
                case.spec.pointer("/key/name").map(Value::to_string),
                case.spec.pointer("/key/secretName").map(Value::to_string),
                change.patch.pointer("/key/name").map(Value::to_string),
                change
                    .patch
                    .pointer("/key/secretName")
                    .map(Value::to_string),
            ]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
        };
        let mut checked = 0;
        for seed in 0..200 {
            let case = case(seed, &context());
            let change = change(seed, &case, &context());
            let original = names(&case, &change);
            let trials: Vec<Vec<String>> = (1..=3)
                .map(|n| names(&for_trial(&case, n), &change_for_trial(&change, n)))
                .collect();
            for trial in &trials {
                assert_eq!(trial.len(), original.len());
                for name in trial {
                    assert!(!original.contains(name), "{name} in {original:?}");
                    assert!(
                        trials.iter().filter(|t| t.contains(name)).count() == 1,
                        "{name} in two trials"
                    );
                }
            }
            let trial = for_trial(&case, 2);
            assert_eq!(trial.name.len(), case.name.len());
            assert_eq!(
                trial
                    .spec
                    .pointer("/key/name")
                    .and_then(Value::as_str)
                    .map(str::len),
                case.spec
                    .pointer("/key/name")
                    .and_then(Value::as_str)
                    .map(str::len),
                "a key name keeps its length (D-4's limit)"
            );
            checked += usize::from(case.spec.pointer("/key/secretName").is_some());
        }
        assert!(checked > 0, "some cases name their key Secret");
    }

    #[test]
    fn a_seed_gives_the_same_case_every_time() {
        for seed in FIXED_SEEDS {
            assert_eq!(case(seed, &context()), case(seed, &context()));
            let case = case(seed, &context());
            assert_eq!(
                change(seed, &case, &context()),
                change(seed, &case, &context())
            );
        }
    }

    #[test]
    fn cases_stay_inside_what_admission_accepts() {
        for seed in 0..500 {
            let case = case(seed, &context());
            assert!(
                case.name.len() <= 253 && !case.name.ends_with('-'),
                "{case:?}"
            );
            let key_name = case
                .spec
                .pointer("/key/name")
                .and_then(Value::as_str)
                .unwrap_or("");
            assert!(key_name.len() <= 64, "{case:?}");
            assert!(
                case.spec
                    .pointer("/replicas")
                    .and_then(Value::as_i64)
                    .unwrap_or(0)
                    >= 0
            );
        }
    }

    #[test]
    fn the_fixed_seeds_sit_on_every_boundary_and_past_limits_only_in_their_field() {
        let cases: Vec<Case> = FIXED_SEEDS.iter().map(|s| case(*s, &context())).collect();
        for boundary in BOUNDARIES {
            assert!(
                cases.iter().any(|c| c.boundary == boundary),
                "no fixed seed sits on {boundary:?}"
            );
        }
        for case in &cases {
            let key = |spec: &Value, field: &str| {
                spec.pointer(&format!("/key/{field}"))
                    .and_then(Value::as_str)
                    .map(str::len)
            };
            match case.boundary {
                Boundary::NameLength(length) => {
                    assert_eq!(case.name.len(), length);
                    assert_eq!(key(&case.spec, "name"), None, "the default key name");
                    assert_eq!(
                        key(&case.spec, "secretName"),
                        None,
                        "the default Secret name"
                    );
                }
                Boundary::KeyNameLength(length) => {
                    assert_eq!(key(&case.spec, "name"), Some(length.min(64)));
                }
                Boundary::SecretNameLength(length) => {
                    assert_eq!(key(&case.spec, "secretName"), Some(length.min(253)));
                }
                Boundary::SecretKeyLength(length) => {
                    assert_eq!(key(&case.spec, "secretKey"), Some(length.min(253)));
                }
                Boundary::GracePeriodZero => {
                    assert_eq!(case.spec["terminationGracePeriodSeconds"], json!(0));
                }
                Boundary::ReplicasZero => assert_eq!(case.spec["replicas"], json!(0)),
            }
            let past = case.past_limit.as_ref();
            match case.boundary {
                Boundary::KeyNameLength(65) => {
                    assert_eq!(key(&past.expect("past").spec, "name"), Some(65));
                }
                Boundary::SecretNameLength(254) => {
                    assert_eq!(key(&past.expect("past").spec, "secretName"), Some(254));
                }
                Boundary::SecretKeyLength(254) => {
                    assert_eq!(key(&past.expect("past").spec, "secretKey"), Some(254));
                }
                _ => assert_eq!(past, None, "{case:?}"),
            }
            if let Some(past) = past {
                let mut at_limit = past.spec.clone();
                let (Some(past_key), Some(key)) = (
                    at_limit.get_mut("key").and_then(Value::as_object_mut),
                    case.spec.get("key").and_then(Value::as_object),
                ) else {
                    panic!("both specs have a key object: {case:?}");
                };
                for (field, value) in key {
                    past_key.insert(field.clone(), value.clone());
                }
                assert_eq!(at_limit, case.spec, "only the one field differs");
            }
        }
    }

    #[test]
    fn the_fixed_seeds_meet_every_fault_answer_and_phase_and_some_meet_none() {
        let faults: Vec<Option<CaseFault>> = FIXED_SEEDS
            .iter()
            .map(|s| case(*s, &context()).fault)
            .collect();
        assert!(faults.contains(&None), "a case without a fault");
        let faults: Vec<CaseFault> = faults.into_iter().flatten().collect();
        for answer in FAULT_ANSWERS {
            assert!(faults.iter().any(|f| f.answer == answer), "{answer:?}");
        }
        for phase in PHASES {
            assert!(faults.iter().any(|f| f.phase == phase), "{phase:?}");
        }
        for fault in &faults {
            let routes: Vec<FaultRoute> = fault.routes().collect();
            assert_eq!(
                routes.contains(&FaultRoute::KeyDelete),
                matches!(fault.answer, FaultAnswer::Status(429) | FaultAnswer::Slow),
                "a delete is faulted only where it is retried: {fault:?}"
            );
            assert!(routes.contains(&FaultRoute::KeyCreate));
        }
    }

    /// Every environment shape, and a case on another coderd that asks for the default
    /// organization (each coderd's is another).
    #[test]
    fn the_fixed_seeds_meet_every_environment_shape() {
        let cases: Vec<Case> = FIXED_SEEDS.iter().map(|s| case(*s, &context())).collect();
        for shape in SHAPES {
            assert!(cases.iter().any(|c| c.shape == shape), "{shape:?}");
        }
        assert!(cases.iter().any(|c| {
            c.shape != Shape::OneCoderd
                && c.spec
                    .get("organizationName")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .is_empty()
        }));
        for (seed, case) in FIXED_SEEDS.iter().zip(&cases) {
            let change = change(*seed, case, &context());
            if matches!(
                case.shape,
                Shape::MovesToOtherPort | Shape::MovesBetweenOtherPorts
            ) {
                assert_eq!(change.what, "the control plane", "seed {seed}");
            }
        }
    }

    #[test]
    fn the_fixed_seeds_cover_the_shapes_that_matter() {
        let cases: Vec<Case> = FIXED_SEEDS.iter().map(|s| case(*s, &context())).collect();
        let changes: Vec<Change> = FIXED_SEEDS
            .iter()
            .zip(&cases)
            .map(|(s, c)| change(*s, c, &context()))
            .collect();
        assert!(
            cases.iter().any(|c| c.name.len() > 63),
            "a name past the label limit"
        );
        assert!(
            cases
                .iter()
                .any(|c| c.spec.get("organizationName").is_none())
        );
        assert!(
            cases
                .iter()
                .any(|c| c.spec.pointer("/key/secretKey").is_some())
        );
        assert!(changes.iter().any(|c| c.may_rotate));
        assert!(changes.iter().any(|c| !c.may_rotate));
        assert!(cases.iter().any(|c| c.entitlement.settles()));
        assert!(cases.iter().any(|c| !c.entitlement.settles()));
        assert!(
            cases
                .iter()
                .any(|c| c.control_plane_image.is_some() && c.spec.get("image").is_some())
        );
        assert!(
            cases
                .iter()
                .any(|c| c.control_plane_image.is_some() && c.spec.get("image").is_none())
        );
    }
}
