//! §2.4 `GET /api/v2/entitlements`: no token needed, as in the real router, unless the deployment
//! was set to demand one (`entitlements_require_token`).
//!
//! The body follows `enterprise/coderd/license/license.go` `LicensesEntitlements` (read at commit
//! 000508d56bdc391468ff0ebce2815ca9c114138f) for one Premium license, whose feature set is every
//! feature: its features carry the license's entitlement (`grace_period` when the fake's
//! entitlement is, else `entitled`), except the ones that need a limit in the license
//! (`user_limit`, `managed_agent_limit`, `ai_governance_user_limit`), which stay `not_entitled`;
//! `external_provisioner_daemons` reports the fake's entitlement as set. Without a license every
//! other feature is `not_entitled`. `user_limit` always carries `actual`, the active user count of
//! the last refresh.

use serde_json::{Map, Value, json};

use crate::api::{ApiError, Reply};
use crate::state::{Entitlement, State};

const FEATURE: &str = "external_provisioner_daemons";
/// `codersdk.FeatureNames` of coderd v2.30.0 (coderd-api.md §2.4), in the order coderd walks them
/// for warnings: the order of the stored `codersdk/deployment.go` (index id 1235605407), with the
/// features it lacks after it in the spec's order. coderd's map always holds every feature, so a
/// client sees the same keys here (`Absent` still drops ours, to test that path).
const FEATURE_NAMES: [&str; 26] = [
    "user_limit",
    "audit_log",
    "connection_log",
    "browser_only",
    "scim",
    "template_rbac",
    "high_availability",
    "multiple_external_auth",
    FEATURE,
    "appearance",
    "advanced_template_scheduling",
    "workspace_proxy",
    "user_role_management",
    "external_token_encryption",
    "workspace_batch_actions",
    "access_control",
    "control_shared_ports",
    "custom_roles",
    "multiple_organizations",
    "workspace_prebuilds",
    "task_batch_actions",
    "managed_agent_limit",
    "workspace_external_agent",
    "aibridge",
    "boundary",
    "ai_governance_user_limit",
];
/// Features a license grants only with a limit (`UsesLimit`, `UsesUsagePeriod`); the fake's
/// license has none.
const LIMIT_FEATURES: [&str; 3] = [
    "user_limit",
    "managed_agent_limit",
    "ai_governance_user_limit",
];
/// Features with their own warnings, skipped by the per-feature warning loop.
const OWN_WARNINGS: [&str; 5] = [
    "user_limit",
    "ai_governance_user_limit",
    "high_availability",
    "multiple_external_auth",
    "managed_agent_limit",
];
/// Enabled by the deployment: `enterprise/coderd/coderd.go` `updateEntitlements` sets these
/// enablements to `true` unconditionally (commit 00199bfc), `coder server` turns on audit logging,
/// connection logging and RBAC (`enterprise/cli/server.go`, not read), and
/// `FeatureName.AlwaysEnable` (stored `codersdk/deployment.go`, id 1235605407) adds the rest.
/// Browser-only, SCIM, external auth, token encryption and AI Bridge need configuration: off.
const ENABLED: [&str; 16] = [
    "audit_log",
    "connection_log",
    "template_rbac",
    FEATURE,
    "advanced_template_scheduling",
    "workspace_proxy",
    "user_role_management",
    "access_control",
    "control_shared_ports",
    "multiple_external_auth",
    "appearance",
    "workspace_batch_actions",
    "high_availability",
    "custom_roles",
    "multiple_organizations",
    "workspace_prebuilds",
];

/// `FeatureName.Humanize`: Go's `strings.Title` of the name with spaces, two exceptions.
fn humanize(name: &str) -> String {
    match name {
        "template_rbac" => "Template RBAC".to_string(),
        "scim" => "SCIM".to_string(),
        _ => name
            .split('_')
            .map(|word| {
                let mut chars = word.chars();
                chars
                    .next()
                    .map(|first| first.to_uppercase().chain(chars).collect())
                    .unwrap_or_default()
            })
            .collect::<Vec<String>>()
            .join(" "),
    }
}

pub fn get(state: &mut State, token: Option<&str>) -> Result<Reply, ApiError> {
    let caller = if state.entitlements_require_token {
        // The switch models the route behind `ExtractAPIKeyMW`.
        Some(state.authenticate_session(token)?)
    } else {
        state.authenticate(token).ok().cloned()
    };
    let entitlement = state.entitlement_seen_by(caller.as_ref());
    let refresh = state.entitlements_refresh();
    let license = match (state.has_license, entitlement) {
        (false, _) => None,
        (true, Entitlement::GracePeriod) => Some("grace_period"),
        (true, _) => Some("entitled"),
    };
    let mut features = Map::new();
    let mut warnings = Vec::new();
    for name in FEATURE_NAMES {
        // (entitlement, enabled before coderd disables whatever is not entitled)
        let (value, enabled) = if name == FEATURE {
            match entitlement.wire_value() {
                Some(value) => (value, true),
                None => continue,
            }
        } else {
            match license {
                Some(value) if !LIMIT_FEATURES.contains(&name) => (value, ENABLED.contains(&name)),
                _ => ("not_entitled", false),
            }
        };
        if license.is_some() && enabled && !OWN_WARNINGS.contains(&name) {
            match value {
                "not_entitled" => warnings.push(format!(
                    "{} is enabled but your license is not entitled to this feature.",
                    humanize(name)
                )),
                "grace_period" => warnings.push(format!(
                    "{} is enabled but your license for this feature is expired.",
                    humanize(name)
                )),
                _ => {}
            }
        }
        let mut feature =
            json!({"entitlement": value, "enabled": enabled && value != "not_entitled"});
        if name == "user_limit" {
            feature["actual"] = json!(refresh.active_users);
        }
        features.insert(name.to_string(), feature);
    }
    Ok(Reply::json(
        200,
        json!({
            "features": Value::Object(features),
            "warnings": warnings,
            "errors": [],
            "has_license": state.has_license,
            "trial": false,
            "require_telemetry": false,
            "refreshed_at": refresh.at.to_string(),
        }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[rstest::rstest]
    #[case("external_provisioner_daemons", "External Provisioner Daemons")]
    #[case("template_rbac", "Template RBAC")]
    #[case("scim", "SCIM")]
    #[case("aibridge", "Aibridge")]
    fn humanizes_like_coderd(#[case] name: &str, #[case] expected: &str) {
        assert_eq!(humanize(name), expected);
    }
}
