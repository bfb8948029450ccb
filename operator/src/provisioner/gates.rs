//! The ordered prerequisite checks of decision D-1, each yielding a condition (pure).
use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;

use crate::api::{CoderControlPlane, condition, reason};
use crate::coderd::{CoderdError, EntitlementValue, SecretString};

use super::credentials::{self, CredentialRef, SecretMeta};

/// Retry interval while a prerequisite on the control plane is missing (R-PRE-5).
pub const PREREQUISITE_RETRY: Duration = Duration::from_secs(15);
/// Entitlement freshness window and retry interval (§3).
pub const ENTITLEMENT_WINDOW: Duration = Duration::from_secs(120);
/// Re-check interval while the key Secret is refused (D-3: at most 60 s).
pub const NOT_OWNED_RETRY: Duration = Duration::from_secs(30);
/// Re-check interval while credentials are invalid (a fallback: labelled Secrets are watched).
pub const CREDENTIALS_RETRY: Duration = Duration::from_secs(60);
/// Data key of the operator token when the reference leaves it blank (R-PRE-8).
pub const DEFAULT_TOKEN_KEY: &str = "token";

/// A condition one step of the pass wants to set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConditionUpdate {
    pub type_: &'static str,
    pub ok: bool,
    pub reason: &'static str,
    pub message: String,
}

impl ConditionUpdate {
    pub fn ok(type_: &'static str, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            type_,
            ok: true,
            reason,
            message: message.into(),
        }
    }

    pub fn failed(type_: &'static str, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            type_,
            ok: false,
            reason,
            message: message.into(),
        }
    }
}

/// A gate that did not pass: its False condition and when to look again (no reconcile error).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocked {
    pub condition: ConditionUpdate,
    pub retry_after: Duration,
}

impl Blocked {
    fn new(
        type_: &'static str,
        reason: &'static str,
        message: impl Into<String>,
        retry_after: Duration,
    ) -> Self {
        Self {
            condition: ConditionUpdate::failed(type_, reason, message),
            retry_after,
        }
    }
}

/// What later steps need from a usable control plane.
#[derive(Clone, Debug)]
pub struct ControlPlaneView<'a> {
    pub object: &'a CoderControlPlane,
    pub url: String,
    pub image: Option<String>,
}

/// Gate 1 (R-PRE-2/3/4): the control plane exists and publishes a URL; its phase is not checked.
pub fn control_plane<'a>(
    ref_name: &str,
    control_plane: Option<&'a CoderControlPlane>,
) -> Result<(ControlPlaneView<'a>, ConditionUpdate), Blocked> {
    let unavailable = |message: String| {
        Blocked::new(
            condition::CONTROL_PLANE_READY,
            reason::CONTROL_PLANE_UNAVAILABLE,
            message,
            PREREQUISITE_RETRY,
        )
    };
    if ref_name.trim().is_empty() {
        return Err(unavailable("spec.controlPlaneRef.name is empty".to_owned()));
    }
    let Some(control_plane) = control_plane else {
        return Err(unavailable(format!(
            "CoderControlPlane {ref_name:?} not found in this namespace"
        )));
    };
    let url = control_plane
        .status
        .as_ref()
        .and_then(|s| s.url.as_deref())
        .map(str::trim)
        .unwrap_or_default();
    if url.is_empty() {
        return Err(unavailable(format!(
            "CoderControlPlane {ref_name:?} has no status.url yet"
        )));
    }
    let image = control_plane
        .spec
        .image
        .clone()
        .filter(|image| !image.trim().is_empty());
    let view = ControlPlaneView {
        object: control_plane,
        url: url.to_owned(),
        image,
    };
    let condition = ConditionUpdate::ok(
        condition::CONTROL_PLANE_READY,
        reason::CONTROL_PLANE_AVAILABLE,
        format!("CoderControlPlane {ref_name:?} is available at {url}"),
    );
    Ok((view, condition))
}

/// The operator token Secret the control plane names: (Secret name, data key); `None` when the
/// reference is absent or blank (gate 2 then reports why).
pub fn token_secret_ref(control_plane: &CoderControlPlane) -> Option<(String, String)> {
    let reference = control_plane
        .status
        .as_ref()?
        .operator_token_secret_ref
        .as_ref()?;
    let name = reference
        .name
        .as_deref()
        .map(str::trim)
        .filter(|n| !n.is_empty())?;
    let key = reference
        .key
        .as_deref()
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .unwrap_or(DEFAULT_TOKEN_KEY);
    Some((name.to_owned(), key.to_owned()))
}

/// Gate 2 (R-PRE-5…9): operator access is ready and the token Secret holds a token.
pub fn operator_access(
    control_plane: &CoderControlPlane,
    token_secret: Option<&Secret>,
) -> Result<(SecretString, ConditionUpdate), Blocked> {
    let blocked = |reason: &'static str, message: String| {
        Blocked::new(
            condition::OPERATOR_ACCESS_READY,
            reason,
            message,
            PREREQUISITE_RETRY,
        )
    };
    let status = control_plane.status.clone().unwrap_or_default();
    if status.operator_access_ready != Some(true) {
        return Err(blocked(
            reason::OPERATOR_ACCESS_NOT_READY,
            "waiting for the control plane to report status.operatorAccessReady=true".to_owned(),
        ));
    }
    let Some(reference) = status.operator_token_secret_ref.as_ref() else {
        return Err(blocked(
            reason::TOKEN_REF_MISSING,
            "control plane status.operatorTokenSecretRef is not set".to_owned(),
        ));
    };
    if reference
        .name
        .as_deref()
        .is_none_or(|name| name.trim().is_empty())
    {
        return Err(blocked(
            reason::TOKEN_REF_INVALID,
            "control plane status.operatorTokenSecretRef.name is empty".to_owned(),
        ));
    }
    let Some((secret_name, data_key)) = token_secret_ref(control_plane) else {
        return Err(blocked(
            reason::TOKEN_REF_INVALID,
            "control plane status.operatorTokenSecretRef is invalid".to_owned(),
        ));
    };
    let token = token_secret
        .and_then(|secret| secret.data.as_ref()?.get(&data_key))
        .and_then(|bytes| std::str::from_utf8(&bytes.0).ok())
        .map(str::trim)
        .filter(|token| !token.is_empty());
    let Some(token) = token else {
        return Err(blocked(
            reason::TOKEN_SECRET_UNAVAILABLE,
            format!(
                "operator token Secret {secret_name:?} is missing or has no value under {data_key:?}"
            ),
        ));
    };
    let condition = ConditionUpdate::ok(
        condition::OPERATOR_ACCESS_READY,
        reason::OPERATOR_ACCESS_READY,
        "operator token is available",
    );
    Ok((SecretString::new(token), condition))
}

/// Gate 3 (D-2): every Secret named by `spec.extraEnv` is allowed for the control plane origin.
pub fn credentials(
    refs: &[CredentialRef],
    secrets: &BTreeMap<String, Option<SecretMeta>>,
    control_plane_url: &str,
) -> Result<ConditionUpdate, Blocked> {
    match credentials::check_credentials(refs, secrets, control_plane_url) {
        Ok(()) => Ok(ConditionUpdate::ok(
            condition::CREDENTIALS_READY,
            reason::CREDENTIALS_VALID,
            "every Secret named by spec.extraEnv is allowed for the control plane origin",
        )),
        Err((reason, message)) => Err(Blocked::new(
            condition::CREDENTIALS_READY,
            reason,
            message,
            CREDENTIALS_RETRY,
        )),
    }
}

/// How gate 4 learns the entitlement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntitlementSource {
    /// The control plane checked less than 2 minutes ago (R-ENT-1/2).
    Fresh(Result<ConditionUpdate, Blocked>),
    /// Ask coderd (R-ENT-3).
    AskCoderd,
}

fn entitled() -> ConditionUpdate {
    ConditionUpdate::ok(
        condition::ENTITLED,
        reason::ENTITLED,
        "external provisioner daemons are entitled",
    )
}

fn not_entitled(retry_after: Duration) -> Blocked {
    Blocked::new(
        condition::ENTITLED,
        reason::NOT_ENTITLED,
        "the Coder license does not entitle external_provisioner_daemons",
        retry_after,
    )
}

/// Gate 4, first half: use the control plane's recent entitlement reading when there is one.
pub fn entitlement_from_control_plane(
    control_plane: &CoderControlPlane,
    now: Timestamp,
) -> EntitlementSource {
    let Some(status) = control_plane.status.as_ref() else {
        return EntitlementSource::AskCoderd;
    };
    let Some(checked) = status.entitlements_last_checked.as_ref() else {
        return EntitlementSource::AskCoderd;
    };
    let window =
        k8s_openapi::jiff::SignedDuration::try_from(ENTITLEMENT_WINDOW).unwrap_or_default();
    let age = now.duration_since(checked.0);
    if age.is_negative() || age >= window {
        return EntitlementSource::AskCoderd;
    }
    let remaining = Duration::try_from(window - age)
        .unwrap_or(ENTITLEMENT_WINDOW)
        .max(Duration::from_secs(1));
    match status.external_provisioner_daemons_entitlement.as_deref() {
        Some("entitled" | "grace_period") => EntitlementSource::Fresh(Ok(entitled())),
        Some("not_entitled") => EntitlementSource::Fresh(Err(not_entitled(remaining))),
        _ => EntitlementSource::AskCoderd,
    }
}

/// Gate 4, second half: interpret coderd's answer (R-ENT-4…8).
pub fn entitlement_from_coderd(
    answer: Result<Option<EntitlementValue>, &CoderdError>,
) -> Result<ConditionUpdate, Blocked> {
    let failed = |reason: &'static str, message: String| {
        Blocked::new(condition::ENTITLED, reason, message, ENTITLEMENT_WINDOW)
    };
    match answer {
        Ok(Some(value)) if value.is_usable() => Ok(entitled()),
        Ok(_) => Err(not_entitled(ENTITLEMENT_WINDOW)),
        Err(CoderdError::NotFound { .. }) => Err(failed(
            reason::NOT_SUPPORTED,
            "coderd has no entitlements API (not an enterprise build)".to_owned(),
        )),
        Err(error @ (CoderdError::Unauthorized { .. } | CoderdError::Forbidden { .. })) => {
            Err(failed(
                reason::FORBIDDEN,
                format!("reading entitlements was refused: {error}"),
            ))
        }
        Err(error) => Err(failed(
            reason::ENTITLEMENTS_QUERY_FAILED,
            format!("reading entitlements failed: {error}"),
        )),
    }
}

/// What gate 4 decides from, read by the pass (`dereference::entitlement`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntitlementReading {
    /// The control plane's recent check, already interpreted.
    ControlPlane(Result<ConditionUpdate, Blocked>),
    /// coderd's answer (or why there was none).
    Coderd(Result<Option<EntitlementValue>, CoderdError>),
}

/// Gate 4 (R-ENT-1…9).
pub fn entitlement(reading: &EntitlementReading) -> Result<ConditionUpdate, Blocked> {
    match reading {
        EntitlementReading::ControlPlane(outcome) => outcome.clone(),
        EntitlementReading::Coderd(answer) => entitlement_from_coderd(answer.as_ref().cloned()),
    }
}

/// The key Secret as the key lifecycle sees it (only Secrets this CR controls get here).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeySecretState {
    Absent,
    /// Exists but holds no value under the data key.
    Empty,
    /// Holds a key; the value is kept only to compute the pod template checksum.
    Usable(SecretString),
}

/// Gate 5 (D-3): a Secret with the target name that this CR does not control is refused and left
/// untouched; no key call happens until it is gone.
pub fn key_secret_ownership(
    secret_name: &str,
    data_key: &str,
    secret: Option<&Secret>,
    cr_uid: &str,
) -> Result<(KeySecretState, ConditionUpdate), Blocked> {
    let ready = || {
        ConditionUpdate::ok(
            condition::KEY_SECRET_READY,
            reason::SECRET_READY,
            format!("Secret {secret_name:?} holds the provisioner key"),
        )
    };
    let Some(secret) = secret else {
        return Ok((KeySecretState::Absent, ready()));
    };
    if !is_controlled_by(secret, cr_uid) {
        return Err(Blocked::new(
            condition::KEY_SECRET_READY,
            reason::KEY_SECRET_NOT_OWNED,
            format!(
                "Secret {secret_name:?} already exists and is not controlled by this CoderProvisioner; delete it or choose another spec.key.secretName"
            ),
            NOT_OWNED_RETRY,
        ));
    }
    let value = secret
        .data
        .as_ref()
        .and_then(|data| data.get(data_key))
        .and_then(|bytes| String::from_utf8(bytes.0.clone()).ok())
        .filter(|value| !value.is_empty());
    let state = value.map_or(KeySecretState::Empty, |value| {
        KeySecretState::Usable(SecretString::new(value))
    });
    Ok((state, ready()))
}

/// Whether `object` has a controller ownerReference to the object with `uid`.
pub fn is_controlled_by(secret: &Secret, uid: &str) -> bool {
    secret
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|owner| owner.controller == Some(true) && owner.uid == uid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provisioner::fixtures;
    use rstest::rstest;

    fn control_plane_from(name: &str) -> CoderControlPlane {
        fixtures::load(&format!("control_plane/{name}.yaml"))
    }

    #[rstest]
    #[case::ready("ready", "codercontrolplane-sample", None)]
    #[case::pending_phase_is_not_a_gate("pending_with_url", "codercontrolplane-sample", None)]
    #[case::no_url(
        "no_url",
        "codercontrolplane-sample",
        Some(reason::CONTROL_PLANE_UNAVAILABLE)
    )]
    #[case::empty_ref("ready", "", Some(reason::CONTROL_PLANE_UNAVAILABLE))]
    fn control_plane_gate(
        #[case] fixture: &str,
        #[case] ref_name: &str,
        #[case] failure: Option<&str>,
    ) {
        let cp = control_plane_from(fixture);
        let outcome = control_plane(ref_name, Some(&cp));
        assert_eq!(outcome.as_ref().err().map(|b| b.condition.reason), failure);
        if let Err(blocked) = outcome {
            assert_eq!(blocked.retry_after, PREREQUISITE_RETRY);
            assert_eq!(blocked.condition.type_, condition::CONTROL_PLANE_READY);
        }
    }

    #[test]
    fn missing_control_plane_is_unavailable() {
        let blocked =
            control_plane("codercontrolplane-sample", None).expect_err("no control plane");
        assert_eq!(blocked.condition.reason, reason::CONTROL_PLANE_UNAVAILABLE);
    }

    #[test]
    fn control_plane_view_carries_url_and_image() {
        let cp = control_plane_from("ready");
        let (view, condition) =
            control_plane("codercontrolplane-sample", Some(&cp)).expect("usable");
        assert_eq!(view.url, "http://coder.coder.svc.cluster.local");
        assert_eq!(view.image.as_deref(), Some("ghcr.io/coder/coder:v2.30.0"));
        assert!(condition.ok);
        assert_eq!(condition.reason, reason::CONTROL_PLANE_AVAILABLE);
    }

    fn token_secret(data_key: &str, value: &str) -> Secret {
        Secret {
            data: Some(
                [(
                    data_key.to_owned(),
                    k8s_openapi::ByteString(value.as_bytes().to_vec()),
                )]
                .into(),
            ),
            ..Default::default()
        }
    }

    #[rstest]
    #[case::ready(
        "ready",
        Some(token_secret("token", "abcdefghij-0123456789012345678901\n")),
        None
    )]
    #[case::access_not_ready(
        "access_not_ready",
        Some(token_secret("token", "tok-value")),
        Some(reason::OPERATOR_ACCESS_NOT_READY)
    )]
    #[case::ref_missing(
        "token_ref_missing",
        Some(token_secret("token", "tok-value")),
        Some(reason::TOKEN_REF_MISSING)
    )]
    #[case::ref_blank_name(
        "token_ref_blank_name",
        Some(token_secret("token", "tok-value")),
        Some(reason::TOKEN_REF_INVALID)
    )]
    #[case::secret_missing("ready", None, Some(reason::TOKEN_SECRET_UNAVAILABLE))]
    #[case::key_missing(
        "ready",
        Some(token_secret("other", "tok-value")),
        Some(reason::TOKEN_SECRET_UNAVAILABLE)
    )]
    #[case::value_empty(
        "ready",
        Some(token_secret("token", " ")),
        Some(reason::TOKEN_SECRET_UNAVAILABLE)
    )]
    fn operator_access_gate(
        #[case] fixture: &str,
        #[case] secret: Option<Secret>,
        #[case] failure: Option<&str>,
    ) {
        let cp = control_plane_from(fixture);
        let outcome = operator_access(&cp, secret.as_ref());
        assert_eq!(outcome.as_ref().err().map(|b| b.condition.reason), failure);
        match outcome {
            Ok((token, _)) => assert_eq!(token.expose(), "abcdefghij-0123456789012345678901"),
            Err(blocked) => {
                assert_eq!(blocked.retry_after, PREREQUISITE_RETRY);
                assert!(
                    !blocked.condition.message.contains("tok-value"),
                    "no token in messages"
                );
            }
        }
    }

    #[test]
    fn blank_token_key_defaults_to_token() {
        let cp = control_plane_from("ready");
        assert_eq!(
            token_secret_ref(&cp),
            Some(("coder-operator-token".into(), "token".into()))
        );
    }

    fn at(rfc3339: &str) -> Timestamp {
        rfc3339.parse().expect("valid timestamp")
    }

    #[rstest]
    #[case::fresh_entitled("ready", "2026-01-01T00:01:00Z", Some(Ok(())))]
    #[case::fresh_grace("grace_period", "2026-01-01T00:01:00Z", Some(Ok(())))]
    #[case::fresh_not_entitled("not_entitled", "2026-01-01T00:01:30Z", Some(Err(30)))]
    #[case::stale("ready", "2026-01-01T00:02:00Z", None)]
    #[case::unknown_value("unknown_entitlement", "2026-01-01T00:00:10Z", None)]
    #[case::never_checked("no_url", "2026-01-01T00:00:10Z", None)]
    fn entitlement_freshness(
        #[case] fixture: &str,
        #[case] now: &str,
        #[case] expected: Option<Result<(), u64>>,
    ) {
        // Every fixture that has a reading was checked at 2026-01-01T00:00:00Z.
        let source = entitlement_from_control_plane(&control_plane_from(fixture), at(now));
        match (source, expected) {
            (EntitlementSource::AskCoderd, None) => {}
            (EntitlementSource::Fresh(Ok(condition)), Some(Ok(()))) => {
                assert_eq!(condition.reason, reason::ENTITLED)
            }
            (EntitlementSource::Fresh(Err(blocked)), Some(Err(remaining))) => {
                assert_eq!(blocked.condition.reason, reason::NOT_ENTITLED);
                assert_eq!(blocked.retry_after, Duration::from_secs(remaining));
            }
            (other, expected) => panic!("got {other:?}, expected {expected:?}"),
        }
    }

    #[rstest]
    #[case::entitled(Ok(Some(EntitlementValue::Entitled)), None)]
    #[case::grace(Ok(Some(EntitlementValue::GracePeriod)), None)]
    #[case::not_entitled(Ok(Some(EntitlementValue::NotEntitled)), Some(reason::NOT_ENTITLED))]
    #[case::absent(Ok(None), Some(reason::NOT_ENTITLED))]
    #[case::not_found(Err(CoderdError::NotFound { message: "Route not found.".into() }), Some(reason::NOT_SUPPORTED))]
    #[case::unauthorized(Err(CoderdError::Unauthorized { message: "signed out".into() }), Some(reason::FORBIDDEN))]
    #[case::forbidden(Err(CoderdError::Forbidden { message: "no".into() }), Some(reason::FORBIDDEN))]
    #[case::server_error(Err(CoderdError::Api { status: 500, message: "boom".into() }), Some(reason::ENTITLEMENTS_QUERY_FAILED))]
    #[case::rate_limited(Err(CoderdError::RateLimited { retry_after: None }), Some(reason::ENTITLEMENTS_QUERY_FAILED))]
    #[case::timeout(Err(CoderdError::Timeout), Some(reason::ENTITLEMENTS_QUERY_FAILED))]
    fn entitlement_answers(
        #[case] answer: Result<Option<EntitlementValue>, CoderdError>,
        #[case] failure: Option<&str>,
    ) {
        let outcome = match &answer {
            Ok(value) => entitlement_from_coderd(Ok(value.clone())),
            Err(error) => entitlement_from_coderd(Err(error)),
        };
        assert_eq!(outcome.as_ref().err().map(|b| b.condition.reason), failure);
        if let Err(blocked) = outcome {
            assert_eq!(blocked.retry_after, ENTITLEMENT_WINDOW);
        }
    }

    fn key_secret(owner_uid: Option<&str>, value: Option<&str>) -> Secret {
        let mut secret: Secret = fixtures::load("secrets/key_secret.yaml");
        match owner_uid {
            Some(uid) => secret
                .metadata
                .owner_references
                .iter_mut()
                .flatten()
                .for_each(|owner| owner.uid = uid.to_owned()),
            None => secret.metadata.owner_references = None,
        }
        secret.data = value.map(|v| {
            [(
                "key".to_owned(),
                k8s_openapi::ByteString(v.as_bytes().to_vec()),
            )]
            .into()
        });
        secret
    }

    #[rstest]
    #[case::absent(None, Ok("absent"))]
    #[case::owned_usable(Some(key_secret(Some("uid-1"), Some("plaintext"))), Ok("usable"))]
    #[case::owned_empty(Some(key_secret(Some("uid-1"), Some(""))), Ok("empty"))]
    #[case::owned_no_data(Some(key_secret(Some("uid-1"), None)), Ok("empty"))]
    #[case::unowned(Some(key_secret(None, Some("x"))), Err(()))]
    #[case::owned_by_other_cr(Some(key_secret(Some("uid-2"), Some("x"))), Err(()))]
    fn key_secret_gate(#[case] secret: Option<Secret>, #[case] expected: Result<&str, ()>) {
        let outcome = key_secret_ownership("s", "key", secret.as_ref(), "uid-1");
        match (outcome, expected) {
            (Ok((KeySecretState::Absent, _)), Ok("absent"))
            | (Ok((KeySecretState::Empty, _)), Ok("empty"))
            | (Ok((KeySecretState::Usable(_), _)), Ok("usable")) => {}
            (Err(blocked), Err(())) => {
                assert_eq!(blocked.condition.type_, condition::KEY_SECRET_READY);
                assert_eq!(blocked.condition.reason, reason::KEY_SECRET_NOT_OWNED);
                assert!(blocked.retry_after <= Duration::from_secs(60));
            }
            (other, expected) => panic!("got {other:?}, expected {expected:?}"),
        }
    }
}
