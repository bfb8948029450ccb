//! The coderd provisioner-key lifecycle (contract §4, D-3, D-4, D-5).
//!
//! `decide` is pure: desired settings vs. what status recorded vs. the key Secret's state give a
//! [`KeyAction`]. `establish` carries out an `Establish` action against coderd, `identify` an
//! `Identify` action. Steady state and retries after a later failure are `Reuse`, which makes no
//! coderd call (R-KEY-8/9).
//!
//! # Where a new key's plaintext is, and what a crash costs
//!
//! coderd shows a key's plaintext once, in the answer to its `POST`. From that answer until the
//! key Secret is written, the plaintext exists only in this process's memory (the
//! [`EstablishedKey`] of the running pass); the new key's id is learned in between, with the key
//! itself (`GET /api/v2/provisionerkeys/{key}`). A crash in that window leaves a key in coderd
//! that neither a Secret nor the status records. R-KEY-25 still holds: the next pass finds nothing
//! recorded, its create answers 409, and the key is listed, deleted and replaced with a Warning
//! Event `ReplacedUnrecordedKey` (D-5), so an unrecorded key lasts until the CR's next pass.
//!
//! A retryable failure (429, 5xx, timeout, unreachable) of that lookup does not make the new key
//! unusable: `establish` keeps it ([`EstablishedKey::unidentified`]), the pass writes the
//! plaintext to the Secret and records the key in status without `provisionerKeyID`, then stops
//! like any failed key request (429: `RateLimited` and its backoff; else `ProvisionerKeyFailed`
//! and the error backoff). The next pass finds that record and `Identify`s the key from the Secret
//! before anything else, so the key is created once however often its lookup fails.
use std::collections::BTreeMap;

use crate::api::CoderProvisionerStatus;
use crate::coderd::{CoderdClient, CoderdError, ProvisionerKey, SecretString};

use super::gates::KeySecretState;

/// The key this reconcile wants in coderd.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredKey {
    pub organization_name: String,
    /// Lower-cased, at most 64 characters.
    pub key_name: String,
    pub tags: BTreeMap<String, String>,
    pub tags_hash: String,
    pub control_plane_ref: String,
    pub control_plane_url: String,
}

/// The key-related status fields (R-KEY-6), as written after a key was established.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyRecord {
    pub organization_id: String,
    pub organization_name: String,
    /// `None` while the key's own lookup has not succeeded (see the module docs).
    pub key_id: Option<String>,
    pub key_name: String,
    pub tags_hash: String,
    pub control_plane_ref: String,
    pub control_plane_url: String,
}

/// A key recorded in status that must be removed (resolved by id, D-5).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedKey {
    pub organization_id: String,
    pub key_id: String,
    /// The coderd where it was created.
    pub control_plane_url: String,
}

/// Why a new key is needed (used in events and logs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyCause {
    /// Nothing recorded and no Secret: the first key.
    Initial,
    /// The Secret vanished or lost its value while a key is recorded (R-KEY-10).
    SecretLost,
    /// A usable Secret but no baseline in status, e.g. after an upgrade (R-KEY-12).
    BaselineMissing,
    /// These settings differ from the recorded ones (R-KEY-13…15).
    Drift(Vec<&'static str>),
    /// coderd refused the key in the Secret (401 on its own lookup): it is no key any more.
    KeyRefused,
}

impl std::fmt::Display for KeyCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Initial => f.write_str("no key yet"),
            Self::SecretLost => f.write_str("the key Secret lost its value"),
            Self::BaselineMissing => f.write_str("status records no key baseline"),
            Self::Drift(fields) => write!(f, "changed: {}", fields.join(", ")),
            Self::KeyRefused => f.write_str("coderd refused the key in the Secret"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyAction {
    /// The Secret's key (carried here) is current: no coderd call.
    Reuse(SecretString),
    /// Create a new key (after retiring `retire`, best-effort).
    Establish {
        cause: KeyCause,
        retire: Option<RecordedKey>,
    },
    /// The Secret holds a key that status records without its id (its own lookup failed after
    /// the create): learn the id with the key itself, at the coderd where it was created, before
    /// deciding anything else.
    Identify {
        plaintext: SecretString,
        control_plane_url: String,
    },
}

fn recorded(value: &Option<String>) -> Option<&str> {
    value.as_deref().filter(|v| !v.is_empty())
}

/// The key recorded in status, if both ids are known.
pub fn recorded_key(status: &CoderProvisionerStatus, fallback_url: &str) -> Option<RecordedKey> {
    Some(RecordedKey {
        organization_id: recorded(&status.organization_id)?.to_owned(),
        key_id: recorded(&status.provisioner_key_id)?.to_owned(),
        control_plane_url: recorded(&status.control_plane_url)
            .unwrap_or(fallback_url)
            .to_owned(),
    })
}

/// Settings that differ from the recorded baseline; `None` when the baseline is incomplete.
fn drift(desired: &DesiredKey, status: &CoderProvisionerStatus) -> Option<Vec<&'static str>> {
    let pairs = [
        (
            "organizationName",
            recorded(&status.organization_name),
            desired.organization_name.as_str(),
        ),
        (
            "tags",
            recorded(&status.tags_hash),
            desired.tags_hash.as_str(),
        ),
        (
            "controlPlaneRef",
            recorded(&status.control_plane_ref_name),
            desired.control_plane_ref.as_str(),
        ),
        (
            "controlPlaneURL",
            recorded(&status.control_plane_url),
            desired.control_plane_url.as_str(),
        ),
    ];
    let mut changed = Vec::new();
    for (field, was, want) in pairs {
        if was? != want {
            changed.push(field);
        }
    }
    // coderd stores names lower-cased; a recorded name differing only in case is the same key.
    if recorded(&status.provisioner_key_name)
        .is_some_and(|was| !was.eq_ignore_ascii_case(&desired.key_name))
    {
        changed.push("keyName");
    }
    Some(changed)
}

/// Decides what the key step must do (pure).
pub fn decide(
    desired: &DesiredKey,
    status: &CoderProvisionerStatus,
    secret: &KeySecretState,
) -> KeyAction {
    if let KeySecretState::Usable(plaintext) = secret
        && recorded(&status.organization_id).is_some()
        && recorded(&status.provisioner_key_name).is_some()
        && recorded(&status.provisioner_key_id).is_none()
    {
        return KeyAction::Identify {
            plaintext: plaintext.clone(),
            control_plane_url: recorded(&status.control_plane_url)
                .unwrap_or(&desired.control_plane_url)
                .to_owned(),
        };
    }
    let retire = recorded_key(status, &desired.control_plane_url);
    let drift = drift(desired, status);
    match (secret, drift) {
        (KeySecretState::Usable(value), Some(changed)) if changed.is_empty() => {
            KeyAction::Reuse(value.clone())
        }
        (_, Some(changed)) if !changed.is_empty() => KeyAction::Establish {
            cause: KeyCause::Drift(changed),
            retire,
        },
        (KeySecretState::Usable(_), _) => KeyAction::Establish {
            cause: KeyCause::BaselineMissing,
            retire,
        },
        (_, _) if retire.is_some() => KeyAction::Establish {
            cause: KeyCause::SecretLost,
            retire,
        },
        (_, _) => KeyAction::Establish {
            cause: KeyCause::Initial,
            retire: None,
        },
    }
}

/// Which listed keys the establish step deletes before creating (pure):
/// the recorded key (matched by id) and any other key already carrying the desired name,
/// which this CR has no plaintext for and so must replace (R-KEY-22, D-5).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Removals {
    pub recorded: Option<ProvisionerKey>,
    pub unrecorded_same_name: Option<ProvisionerKey>,
}

pub fn plan_removals(
    listed: &[ProvisionerKey],
    recorded_id: Option<&str>,
    key_name: &str,
) -> Removals {
    let recorded = recorded_id
        .and_then(|id| listed.iter().find(|key| key.id == id))
        .cloned();
    let unrecorded_same_name = listed
        .iter()
        .find(|key| key.name.eq_ignore_ascii_case(key_name) && Some(key.id.as_str()) != recorded_id)
        .cloned();
    Removals {
        recorded,
        unrecorded_same_name,
    }
}

/// Something the establish step did that deserves an Event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyEvent {
    Retired {
        name: String,
    },
    RetireFailed {
        organization_id: String,
        error: String,
    },
    ReplacedUnrecorded {
        name: String,
    },
    Created {
        name: String,
    },
}

/// Where [`establish`] reports what it does, as it does it: an announcement must be out before
/// the effect it announces (`ReplacedUnrecorded` before the DELETE), so that a crash in between
/// cannot leave the effect without its Event.
pub trait KeyEventSink {
    fn record(&mut self, event: KeyEvent) -> impl Future<Output = ()> + Send;
}

/// Collects the events (unit tests).
impl KeyEventSink for Vec<KeyEvent> {
    async fn record(&mut self, event: KeyEvent) {
        self.push(event);
    }
}

/// A freshly created key: the plaintext for the Secret and the record for status.
pub struct EstablishedKey {
    pub plaintext: SecretString,
    pub record: KeyRecord,
    /// Why `record.key_id` is unknown: the key's own lookup failed with a retryable error. The
    /// key is kept (stored and recorded); a later pass learns its id (`KeyAction::Identify`).
    pub unidentified: Option<CoderdError>,
}

/// Whether `establish` tries the create before listing (pure). With nothing recorded to retire,
/// coderd almost never has the key yet, so the list is paid only on 409. A usable Secret without
/// a baseline (R-KEY-12) means the key most likely exists, so that case lists first.
pub fn creates_first(cause: &KeyCause, retire: Option<&RecordedKey>) -> bool {
    retire.is_none() && *cause != KeyCause::BaselineMissing
}

/// Carries out `Establish`: resolve the org, retire the recorded key (best-effort, R-KEY-16),
/// replace a same-named unrecorded key, create, then list to learn the new id (R-KEY-6).
/// `client_for` builds a client for another coderd URL (a recorded key may live elsewhere).
pub async fn establish(
    client: &CoderdClient,
    client_for: impl Fn(&str) -> Result<CoderdClient, CoderdError>,
    desired: &DesiredKey,
    cause: &KeyCause,
    retire: Option<&RecordedKey>,
    events: &mut impl KeyEventSink,
) -> Result<EstablishedKey, CoderdError> {
    let organization = client.organization(&desired.organization_name).await?;
    let same_coderd = |key: &RecordedKey| key.control_plane_url == desired.control_plane_url;
    let retire_here =
        retire.filter(|key| same_coderd(key) && key.organization_id == organization.id);

    if let Some(elsewhere) = retire.filter(|key| retire_here.is_none() && !key.key_id.is_empty()) {
        let remote = if same_coderd(elsewhere) {
            Ok(client.clone())
        } else {
            client_for(&elsewhere.control_plane_url)
        };
        let outcome = match remote {
            Ok(remote) => {
                delete_by_id(&remote, &elsewhere.organization_id, &elsewhere.key_id).await
            }
            Err(error) => Err(error),
        };
        record_retire(outcome, &elsewhere.organization_id, events).await?;
    }

    // A first key is created straight away; only a 409 (a same-named key this CR has no record
    // of, D-5) costs the list and replacement below. Rotations list first: the recorded key is
    // deleted by id, which needs the list (R-DEL-4, R-KEY-24).
    let created_first = if creates_first(cause, retire) {
        match client
            .create_key(&organization.id, &desired.key_name, &desired.tags)
            .await
        {
            Err(CoderdError::Conflict { .. }) => None,
            outcome => Some(outcome?),
        }
    } else {
        None
    };
    let plaintext = match created_first {
        Some(plaintext) => plaintext,
        None => {
            let listed = client.list_keys(&organization.id).await?;
            let removals = plan_removals(
                &listed,
                retire_here.map(|key| key.key_id.as_str()),
                &desired.key_name,
            );
            if let Some(old) = &removals.recorded {
                let outcome = client
                    .delete_key(&organization.id, &old.name)
                    .await
                    .map(|()| Some(old.name.clone()));
                record_retire(outcome, &organization.id, events).await?;
            }
            if let Some(foreign) = &removals.unrecorded_same_name {
                let replaced = KeyEvent::ReplacedUnrecorded {
                    name: foreign.name.clone(),
                };
                events.record(replaced).await;
                // Not best-effort: creating while it exists would only answer 409.
                client.delete_key(&organization.id, &foreign.name).await?;
            }
            client
                .create_key(&organization.id, &desired.key_name, &desired.tags)
                .await?
        }
    };
    events
        .record(KeyEvent::Created {
            name: desired.key_name.clone(),
        })
        .await;
    // The new key's own record (its id), fetched with the key itself: a list by name could
    // show another key of that name created meanwhile by someone else. A retryable failure
    // keeps the key: deleting it and creating another would only meet the same failure again.
    let (key_id, key_name, unidentified) = match client.key_by_plaintext(&plaintext).await {
        Ok(created) => (Some(created.id), created.name, None),
        Err(error) if error.is_retryable() => (None, desired.key_name.clone(), Some(error)),
        Err(error) => return Err(error),
    };
    let record = KeyRecord {
        organization_id: organization.id,
        organization_name: desired.organization_name.clone(),
        key_id,
        key_name,
        tags_hash: desired.tags_hash.clone(),
        control_plane_ref: desired.control_plane_ref.clone(),
        control_plane_url: desired.control_plane_url.clone(),
    };
    Ok(EstablishedKey {
        plaintext,
        record,
        unidentified,
    })
}

/// Carries out `Identify`: the record of the key in the Secret, fetched with the key itself.
/// `Ok(None)` when coderd refuses the key (401): it is no key any more and must be replaced.
pub async fn identify(
    client: &CoderdClient,
    plaintext: &SecretString,
) -> Result<Option<ProvisionerKey>, CoderdError> {
    match client.key_by_plaintext(plaintext).await {
        Ok(key) => Ok(Some(key)),
        Err(CoderdError::DaemonKeyRefused { .. }) => Ok(None),
        Err(error) => Err(error),
    }
}

/// Deletes the key with `key_id` (list, match id, delete by that entry's name; D-5, R-DEL-4).
/// Returns the deleted name, or `None` when no key has that id any more.
pub async fn delete_by_id(
    client: &CoderdClient,
    organization_id: &str,
    key_id: &str,
) -> Result<Option<String>, CoderdError> {
    let listed = client.list_keys(organization_id).await?;
    let Some(key) = listed.into_iter().find(|key| key.id == key_id) else {
        return Ok(None);
    };
    client.delete_key(organization_id, &key.name).await?;
    Ok(Some(key.name))
}

/// Retiring the old key is best-effort, except that 429 stops the pass (R-RL-1).
async fn record_retire(
    outcome: Result<Option<String>, CoderdError>,
    organization_id: &str,
    events: &mut impl KeyEventSink,
) -> Result<(), CoderdError> {
    let event = match outcome {
        Ok(Some(name)) => KeyEvent::Retired { name },
        Ok(None) => return Ok(()),
        Err(error) if error.is_rate_limited() => return Err(error),
        Err(error) => KeyEvent::RetireFailed {
            organization_id: organization_id.to_owned(),
            error: error.to_string(),
        },
    };
    events.record(event).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn desired() -> DesiredKey {
        DesiredKey {
            organization_name: "default".into(),
            key_name: "coderprovisioner-sample".into(),
            tags: [("scope".to_owned(), "organization".to_owned())].into(),
            tags_hash: "cf1b2b92".into(),
            control_plane_ref: "codercontrolplane-sample".into(),
            control_plane_url: "http://coder.test".into(),
        }
    }

    /// Status after a successful first pass for `desired()`.
    fn applied() -> CoderProvisionerStatus {
        CoderProvisionerStatus {
            organization_id: Some("org-1".into()),
            organization_name: Some("default".into()),
            provisioner_key_id: Some("key-1".into()),
            provisioner_key_name: Some("coderprovisioner-sample".into()),
            tags_hash: Some("cf1b2b92".into()),
            control_plane_ref_name: Some("codercontrolplane-sample".into()),
            control_plane_url: Some("http://coder.test".into()),
            ..Default::default()
        }
    }

    /// Status after a pass whose new key's own lookup failed: everything but the id.
    fn unidentified() -> CoderProvisionerStatus {
        CoderProvisionerStatus {
            provisioner_key_id: None,
            ..applied()
        }
    }

    fn identify_action() -> KeyAction {
        KeyAction::Identify {
            plaintext: SecretString::new("plaintext"),
            control_plane_url: "http://coder.test".into(),
        }
    }

    fn usable() -> KeySecretState {
        KeySecretState::Usable(SecretString::new("plaintext"))
    }

    fn recorded_key_1() -> Option<RecordedKey> {
        Some(RecordedKey {
            organization_id: "org-1".into(),
            key_id: "key-1".into(),
            control_plane_url: "http://coder.test".into(),
        })
    }

    fn with(change: impl FnOnce(&mut DesiredKey)) -> DesiredKey {
        let mut desired = desired();
        change(&mut desired);
        desired
    }

    #[rstest]
    #[case::steady_state(
        desired(),
        applied(),
        usable(),
        KeyAction::Reuse(SecretString::new("plaintext"))
    )]
    #[case::name_case_only(desired(), CoderProvisionerStatus { provisioner_key_name: Some("CoderProvisioner-Sample".into()), ..applied() }, usable(), KeyAction::Reuse(SecretString::new("plaintext")))]
    #[case::first_pass(desired(), CoderProvisionerStatus::default(), KeySecretState::Absent, KeyAction::Establish { cause: KeyCause::Initial, retire: None })]
    #[case::secret_deleted(desired(), applied(), KeySecretState::Absent, KeyAction::Establish { cause: KeyCause::SecretLost, retire: recorded_key_1() })]
    #[case::secret_emptied(desired(), applied(), KeySecretState::Empty, KeyAction::Establish { cause: KeyCause::SecretLost, retire: recorded_key_1() })]
    #[case::upgrade_without_baseline(desired(), CoderProvisionerStatus::default(), usable(), KeyAction::Establish { cause: KeyCause::BaselineMissing, retire: None })]
    #[case::tags_changed(with(|d| d.tags_hash = "00000000".into()), applied(), usable(), KeyAction::Establish { cause: KeyCause::Drift(vec!["tags"]), retire: recorded_key_1() })]
    #[case::key_name_changed(with(|d| d.key_name = "renamed".into()), applied(), usable(), KeyAction::Establish { cause: KeyCause::Drift(vec!["keyName"]), retire: recorded_key_1() })]
    #[case::org_changed(with(|d| d.organization_name = "eng".into()), applied(), usable(), KeyAction::Establish { cause: KeyCause::Drift(vec!["organizationName"]), retire: recorded_key_1() })]
    #[case::control_plane_ref_changed(with(|d| d.control_plane_ref = "other".into()), applied(), usable(), KeyAction::Establish { cause: KeyCause::Drift(vec!["controlPlaneRef"]), retire: recorded_key_1() })]
    #[case::url_changed(with(|d| d.control_plane_url = "http://new.test".into()), applied(), usable(), KeyAction::Establish { cause: KeyCause::Drift(vec!["controlPlaneURL"]), retire: recorded_key_1() })]
    #[case::drift_and_secret_lost(with(|d| d.tags_hash = "00000000".into()), applied(), KeySecretState::Absent, KeyAction::Establish { cause: KeyCause::Drift(vec!["tags"]), retire: recorded_key_1() })]
    #[case::id_not_yet_known(desired(), unidentified(), usable(), identify_action())]
    #[case::id_not_yet_known_and_drift(with(|d| d.tags_hash = "00000000".into()), unidentified(), usable(), identify_action())]
    #[case::id_not_yet_known_and_secret_lost(desired(), unidentified(), KeySecretState::Absent, KeyAction::Establish { cause: KeyCause::Initial, retire: None })]
    fn key_decisions(
        #[case] desired: DesiredKey,
        #[case] status: CoderProvisionerStatus,
        #[case] secret: KeySecretState,
        #[case] expected: KeyAction,
    ) {
        assert_eq!(decide(&desired, &status, &secret), expected);
    }

    #[test]
    fn recorded_key_uses_the_recorded_url() {
        let status = CoderProvisionerStatus {
            control_plane_url: Some("http://old.test".into()),
            ..applied()
        };
        assert_eq!(
            recorded_key(&status, "http://new.test").map(|k| k.control_plane_url),
            Some("http://old.test".into())
        );
        assert_eq!(
            recorded_key(&CoderProvisionerStatus::default(), "http://new.test"),
            None
        );
    }

    fn key(id: &str, name: &str) -> ProvisionerKey {
        serde_json::from_value(serde_json::json!({
            "id": id, "name": name, "organization": "org-1", "tags": {}, "created_at": "2026-01-01T00:00:00Z"
        }))
        .expect("valid key")
    }

    #[test]
    fn removals_target_the_recorded_id_not_the_name() {
        let listed = [
            key("key-1", "old-name"),
            key("key-2", "coderprovisioner-sample"),
            key("key-3", "unrelated"),
        ];
        let removals = plan_removals(&listed, Some("key-1"), "coderprovisioner-sample");
        assert_eq!(removals.recorded.map(|k| k.id), Some("key-1".into()));
        assert_eq!(
            removals.unrecorded_same_name.map(|k| k.id),
            Some("key-2".into())
        );
    }

    #[test]
    fn recorded_key_with_the_desired_name_is_not_also_unrecorded() {
        let listed = [key("key-1", "coderprovisioner-sample")];
        let removals = plan_removals(&listed, Some("key-1"), "CoderProvisioner-Sample");
        assert_eq!(removals.recorded.map(|k| k.id), Some("key-1".into()));
        assert_eq!(removals.unrecorded_same_name, None);
    }

    #[test]
    fn nothing_to_remove_when_coderd_has_neither() {
        let listed = [key("key-9", "unrelated")];
        assert_eq!(
            plan_removals(&listed, Some("key-1"), "coderprovisioner-sample"),
            Removals::default()
        );
        assert_eq!(
            plan_removals(&[], None, "coderprovisioner-sample"),
            Removals::default()
        );
    }

    #[rstest]
    #[case::first_key(KeyCause::Initial, None, true)]
    #[case::drift_without_a_recorded_id(KeyCause::Drift(vec!["tags"]), None, true)]
    #[case::baseline_missing(KeyCause::BaselineMissing, None, false)]
    #[case::secret_lost(KeyCause::SecretLost, recorded_key_1(), false)]
    #[case::drift_rotation(KeyCause::Drift(vec!["tags"]), recorded_key_1(), false)]
    fn only_a_key_with_nothing_to_retire_is_created_before_listing(
        #[case] cause: KeyCause,
        #[case] retire: Option<RecordedKey>,
        #[case] expected: bool,
    ) {
        assert_eq!(creates_first(&cause, retire.as_ref()), expected);
    }

    /// `establish` against the in-process fake coderd, seen through the fake's journal.
    mod against_fake_coderd {
        use std::time::Duration;

        use fake_coderd::{FakeCoderd, FakeConfig, FaultSpec, Seed};

        use super::*;
        use crate::coderd::{ClientOptions, routes};

        /// Fixed default organization id: the client's organization cache is process-wide and
        /// keyed by URL, and a fake may get an earlier test's port.
        async fn fake() -> (FakeCoderd, CoderdClient) {
            let _ = rustls::crypto::ring::default_provider().install_default();
            let seed: Seed = serde_json::from_value(serde_json::json!(
                {"default_organization_id": "5eed0000-0000-4000-8000-000000000001"}
            ))
            .expect("valid seed");
            let fake = FakeCoderd::start_with(FakeConfig {
                seed,
                ..FakeConfig::default()
            })
            .await
            .expect("fake coderd starts");
            let options = ClientOptions {
                timeout: Duration::from_secs(10),
                ..ClientOptions::default()
            };
            let client = CoderdClient::new(
                &fake.url(),
                SecretString::new(fake.operator_token()),
                options,
            )
            .expect("valid client");
            (fake, client)
        }

        fn desired_at(fake: &FakeCoderd) -> DesiredKey {
            DesiredKey {
                control_plane_url: fake.url(),
                ..desired()
            }
        }

        /// The provisioner-key requests coderd answered, as `METHOD status`, in order.
        fn key_requests(fake: &FakeCoderd) -> Vec<String> {
            fake.journal()
                .into_iter()
                .filter_map(|entry| match entry.route.as_deref() {
                    Some(routes::PROVISIONER_KEYS | routes::PROVISIONER_KEY) => {
                        Some(format!("{} {}", entry.method, entry.status))
                    }
                    // The new key's own record, fetched with the key.
                    Some(routes::DAEMON_KEY) => Some(format!("OWN {}", entry.status)),
                    _ => None,
                })
                .collect()
        }

        async fn run(
            client: &CoderdClient,
            desired: &DesiredKey,
            cause: KeyCause,
            retire: Option<&RecordedKey>,
        ) -> (EstablishedKey, Vec<KeyEvent>) {
            let mut events = Vec::new();
            let established = establish(
                client,
                |_| panic!("no other coderd"),
                desired,
                &cause,
                retire,
                &mut events,
            )
            .await
            .expect("key established");
            (established, events)
        }

        #[tokio::test]
        async fn a_first_key_is_created_then_fetched_with_itself() {
            let (fake, client) = fake().await;
            let desired = desired_at(&fake);
            let (established, events) = run(&client, &desired, KeyCause::Initial, None).await;
            assert_eq!(key_requests(&fake), ["POST 201", "OWN 200"]);
            let stored = fake.keys("default").expect("keys");
            assert_eq!(stored.len(), 1);
            assert_eq!(established.record.key_id.as_ref(), Some(&stored[0].id));
            assert_eq!(
                events,
                [KeyEvent::Created {
                    name: desired.key_name.clone()
                }]
            );
        }

        /// A retryable failure of the new key's own lookup keeps the key: one create, no
        /// delete; the key comes back without an id, and `identify` learns it later.
        #[rstest]
        #[case::rate_limited(FaultSpec::status("GET", fake_coderd::routes::DAEMON_KEY, 429))]
        #[case::internal_error(FaultSpec::status("GET", fake_coderd::routes::DAEMON_KEY, 500))]
        #[case::unavailable(FaultSpec::status("GET", fake_coderd::routes::DAEMON_KEY, 503))]
        #[case::connection_reset(FaultSpec::reset("GET", fake_coderd::routes::DAEMON_KEY))]
        #[tokio::test]
        async fn a_retryable_failure_of_the_new_keys_lookup_keeps_the_key(
            #[case] fault: FaultSpec,
        ) {
            let (fake, client) = fake().await;
            let desired = desired_at(&fake);
            fake.inject_fault(fault).expect("valid fault");
            let (established, events) = run(&client, &desired, KeyCause::Initial, None).await;
            let lookup = key_requests(&fake).last().cloned().expect("a lookup");
            assert!(lookup.starts_with("OWN "), "{lookup}");
            assert_ne!(lookup, "OWN 200");
            assert_eq!(
                key_requests(&fake)
                    .iter()
                    .filter(|r| !r.starts_with("OWN "))
                    .collect::<Vec<_>>(),
                ["POST 201"],
                "one create, no delete"
            );
            let error = established.unidentified.expect("the lookup failed");
            assert!(error.is_retryable(), "{error}");
            assert_eq!(established.record.key_id, None);
            assert_eq!(established.record.key_name, desired.key_name);
            assert_eq!(
                events,
                [KeyEvent::Created {
                    name: desired.key_name.clone()
                }]
            );
            let stored = fake.keys("default").expect("keys");
            assert_eq!(stored.len(), 1, "the key is kept");

            let identified = identify(&client, &established.plaintext)
                .await
                .expect("the lookup succeeds now")
                .expect("the key is valid");
            assert_eq!(identified.id, stored[0].id);
        }

        /// A failure that is no transient one still fails the establish step.
        #[tokio::test]
        async fn a_refused_lookup_of_the_new_key_fails_the_step() {
            let (fake, client) = fake().await;
            let desired = desired_at(&fake);
            fake.inject_fault(FaultSpec::status(
                "GET",
                fake_coderd::routes::DAEMON_KEY,
                400,
            ))
            .expect("valid fault");
            let outcome = establish(
                &client,
                |_| panic!("no other coderd"),
                &desired,
                &KeyCause::Initial,
                None,
                &mut Vec::new(),
            )
            .await;
            assert!(outcome.is_err());
        }

        /// A key coderd no longer knows is refused (401): `identify` says so with `None`.
        #[tokio::test]
        async fn identifying_a_key_coderd_refuses_asks_for_a_new_one() {
            let (fake, client) = fake().await;
            let plaintext = SecretString::new(
                fake.create_key_directly("default", "gone", Default::default())
                    .expect("a key created in the fake"),
            );
            let id = fake.keys("default").expect("keys")[0].id.clone();
            fake.delete_key_directly("default", &id).expect("deleted");
            assert_eq!(
                identify(&client, &plaintext).await.expect("an answer"),
                None
            );
        }

        #[tokio::test]
        async fn a_conflicting_unrecorded_key_is_listed_replaced_and_announced() {
            let (fake, client) = fake().await;
            let desired = desired_at(&fake);
            fake.create_key_directly("default", &desired.key_name, Default::default())
                .expect("a key created in the fake");
            let unrecorded = fake.keys("default").expect("keys")[0].id.clone();
            let (established, events) = run(&client, &desired, KeyCause::Initial, None).await;
            assert_eq!(
                key_requests(&fake),
                ["POST 409", "GET 200", "DELETE 204", "POST 201", "OWN 200"]
            );
            let stored = fake.keys("default").expect("keys");
            assert_eq!(stored.len(), 1);
            assert_ne!(stored[0].id, unrecorded);
            assert_eq!(established.record.key_id.as_ref(), Some(&stored[0].id));
            assert_eq!(
                events,
                [
                    KeyEvent::ReplacedUnrecorded {
                        name: desired.key_name.clone()
                    },
                    KeyEvent::Created {
                        name: desired.key_name.clone()
                    },
                ]
            );
        }

        #[tokio::test]
        async fn a_rotation_lists_first_and_deletes_the_recorded_key_by_id() {
            let (fake, client) = fake().await;
            let desired = desired_at(&fake);
            fake.create_key_directly("default", "old-name", Default::default())
                .expect("a key created in the fake");
            let old = fake.keys("default").expect("keys")[0].clone();
            let recorded = RecordedKey {
                organization_id: old.organization.clone(),
                key_id: old.id.clone(),
                control_plane_url: fake.url(),
            };
            let cause = KeyCause::Drift(vec!["keyName"]);
            let (_, events) = run(&client, &desired, cause, Some(&recorded)).await;
            assert_eq!(
                key_requests(&fake),
                ["GET 200", "DELETE 204", "POST 201", "OWN 200"]
            );
            let names: Vec<String> = fake
                .keys("default")
                .expect("keys")
                .into_iter()
                .map(|key| key.name)
                .collect();
            assert_eq!(names, [desired.key_name.as_str()]);
            assert_eq!(
                events,
                [
                    KeyEvent::Retired {
                        name: "old-name".into()
                    },
                    KeyEvent::Created {
                        name: desired.key_name.clone()
                    },
                ]
            );
        }
    }
}
