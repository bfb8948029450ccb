//! The seeded-bug switch (`CODER_OPERATOR_SEEDED_BUG`): without the `seeded-bugs` feature it does
//! nothing; with it, it breaks exactly the named decision of a pure step, through the pass's
//! [`Policy`].
//!
//! This binary holds a single test because it sets a process environment variable, which is
//! only sound while no other thread reads the environment.
use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus};
use k8s_openapi::jiff::Timestamp;
use operator::api::{CoderProvisioner, CoderProvisionerStatus, PHASE_PENDING, reason};
use operator::coderd::{CoderdError, SecretString};
use operator::provisioner::children::{ChildInputs, key_secret};
use operator::provisioner::credentials::{CredentialRef, check_credentials, destinations_allow};
use operator::provisioner::gates::{KeySecretState, entitlement_from_coderd};
use operator::provisioner::keys::{DesiredKey, KeyAction, decide};
use operator::provisioner::names::Names;
use operator::provisioner::policy::Policy;
use operator::provisioner::status::{PassReport, next_status, status_changed};
use operator::seeded::{Bug, ENV_VAR, active};

const CONTROL_PLANE: &str = "http://127.0.0.1:3000";

fn desired(tags_hash: &str) -> DesiredKey {
    DesiredKey {
        organization_name: "default".into(),
        key_name: "p".into(),
        tags: BTreeMap::new(),
        tags_hash: tags_hash.into(),
        control_plane_ref: "cp".into(),
        control_plane_url: CONTROL_PLANE.into(),
    }
}

fn applied() -> CoderProvisionerStatus {
    CoderProvisionerStatus {
        organization_id: Some("org-1".into()),
        organization_name: Some("default".into()),
        provisioner_key_id: Some("key-1".into()),
        provisioner_key_name: Some("p".into()),
        tags_hash: Some("811c9dc5".into()),
        control_plane_ref_name: Some("cp".into()),
        control_plane_url: Some(CONTROL_PLANE.into()),
        ..Default::default()
    }
}

fn missing_secret_is_refused() -> bool {
    let refs = [CredentialRef {
        secret: "proxy".into(),
        optional: false,
    }];
    let secrets = [("proxy".to_owned(), None)].into();
    check_credentials(&refs, &secrets, CONTROL_PLANE, &Policy::current()).is_err()
}

fn lookalike_is_refused() -> bool {
    !destinations_allow(
        "http://127.0.0.1:3000@evil.test",
        CONTROL_PLANE,
        &Policy::current(),
    )
}

fn tag_change_rotates() -> bool {
    let usable = KeySecretState::Usable(SecretString::new("plaintext"));
    matches!(
        decide(
            &desired("00000000"),
            &applied(),
            &usable,
            &Policy::current()
        ),
        KeyAction::Establish { .. }
    )
}

fn unchanged_status_is_not_written() -> bool {
    !status_changed(Some(&applied()), &applied())
}

fn other_port_is_refused() -> bool {
    !destinations_allow("http://127.0.0.1:4000", CONTROL_PLANE, &Policy::current())
}

fn unauthorized_entitlements_are_forbidden() -> bool {
    let error = CoderdError::Unauthorized {
        message: "m".into(),
    };
    entitlement_from_coderd(Err(&error), &Policy::current())
        .is_err_and(|b| b.condition.reason == reason::FORBIDDEN)
}

fn no_ready_replica_is_pending() -> bool {
    let deployment = Deployment {
        status: Some(DeploymentStatus {
            ready_replicas: Some(0),
            ..Default::default()
        }),
        ..Default::default()
    };
    let status = next_status(
        None,
        Some(1),
        &PassReport::default(),
        Some(&deployment),
        Timestamp::UNIX_EPOCH,
        &Policy::current(),
    );
    status.phase.as_deref() == Some(PHASE_PENDING)
}

/// The key Secret blocks its owner's deletion.
fn key_secret_blocks_owner_deletion() -> bool {
    let cr: CoderProvisioner = serde_json::from_value(serde_json::json!({
        "apiVersion": "coder.com/v1alpha1", "kind": "CoderProvisioner",
        "metadata": {"name": "p", "namespace": "ns", "uid": "uid-1"},
        "spec": {"controlPlaneRef": {"name": "cp"}, "key": {"secretKey": "custom"}},
    }))
    .expect("valid CR");
    let names = Names::for_provisioner(&cr);
    let secret = key_secret(
        &ChildInputs {
            cr: &cr,
            names: &names,
            control_plane_url: CONTROL_PLANE,
            control_plane_image: None,
            policy: &Policy::current(),
        },
        "plaintext",
    );
    secret
        .metadata
        .owner_references
        .iter()
        .flatten()
        .all(|owner| owner.block_owner_deletion == Some(true))
}

/// A reference decision: its name (for the assertion messages) and whether it holds.
type Decision = (&'static str, fn() -> bool);

/// Every reference decision above.
fn reference_decisions() -> [Decision; 7] {
    [
        ("missing secret is refused", missing_secret_is_refused),
        ("tag change rotates", tag_change_rotates),
        (
            "unchanged status is not written",
            unchanged_status_is_not_written,
        ),
        ("other port is refused", other_port_is_refused),
        (
            "401 on entitlements is Forbidden",
            unauthorized_entitlements_are_forbidden,
        ),
        ("no ready replica is Pending", no_ready_replica_is_pending),
        (
            "key Secret blocks owner deletion",
            key_secret_blocks_owner_deletion,
        ),
    ]
}

/// Without the feature every variant name is ignored: each decision gives the reference answer.
#[cfg(not(feature = "seeded-bugs"))]
#[test]
fn the_switch_does_nothing_without_the_feature() {
    for bug in Bug::ALL {
        // SAFETY: the only test in this binary; no other thread reads the environment.
        unsafe { std::env::set_var(ENV_VAR, bug.name()) };
        assert!(!active(bug), "{} active without the feature", bug.name());
        assert!(lookalike_is_refused(), "{}", bug.name());
        for (decision, holds) in reference_decisions() {
            assert!(holds(), "{}: {decision}", bug.name());
        }
    }
}

/// With the feature the named variant, and only it, changes its decision.
#[cfg(feature = "seeded-bugs")]
#[test]
fn the_switch_breaks_exactly_the_named_decision() {
    let bug = Bug::CredentialOriginPrefixMatch;
    // SAFETY: the only test in this binary, and the variable is set before anything reads it.
    unsafe { std::env::set_var(ENV_VAR, bug.name()) };
    for other in Bug::ALL {
        assert_eq!(active(other), other == bug, "{}", other.name());
    }
    assert!(
        !lookalike_is_refused(),
        "the seeded bug accepts a lookalike origin"
    );
    for (decision, holds) in reference_decisions() {
        assert!(holds(), "{decision}");
    }
}
