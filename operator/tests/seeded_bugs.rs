//! The seeded-bug switch (`CODER_OPERATOR_SEEDED_BUG`): without the `seeded-bugs` feature it does
//! nothing; with it, it breaks exactly the named decision.
//!
//! This binary holds a single test because it sets a process environment variable, which is
//! only sound while no other thread reads the environment.
use std::collections::BTreeMap;

use operator::api::CoderProvisionerStatus;
use operator::coderd::SecretString;
use operator::provisioner::credentials::{CredentialRef, check_credentials, destinations_allow};
use operator::provisioner::gates::KeySecretState;
use operator::provisioner::keys::{DesiredKey, KeyAction, decide};
use operator::provisioner::status::status_changed;
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
    check_credentials(&refs, &secrets, CONTROL_PLANE).is_err()
}

fn lookalike_is_refused() -> bool {
    !destinations_allow("http://127.0.0.1:3000@evil.test", CONTROL_PLANE)
}

fn tag_change_rotates() -> bool {
    let usable = KeySecretState::Usable(SecretString::new("plaintext"));
    matches!(
        decide(&desired("00000000"), &applied(), &usable),
        KeyAction::Establish { .. }
    )
}

fn unchanged_status_is_not_written() -> bool {
    !status_changed(Some(&applied()), &applied())
}

/// Without the feature every variant name is ignored: each decision gives the reference answer.
#[cfg(not(feature = "seeded-bugs"))]
#[test]
fn the_switch_does_nothing_without_the_feature() {
    for bug in Bug::ALL {
        // SAFETY: the only test in this binary; no other thread reads the environment.
        unsafe { std::env::set_var(ENV_VAR, bug.name()) };
        assert!(!active(bug), "{} active without the feature", bug.name());
        assert!(missing_secret_is_refused(), "{}", bug.name());
        assert!(lookalike_is_refused(), "{}", bug.name());
        assert!(tag_change_rotates(), "{}", bug.name());
        assert!(unchanged_status_is_not_written(), "{}", bug.name());
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
    assert!(missing_secret_is_refused());
    assert!(tag_change_rotates());
    assert!(unchanged_status_is_not_written());
}
