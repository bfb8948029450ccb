//! §2.4 `GET /api/v2/entitlements`: no token needed, as in the real router, unless the deployment
//! was set to demand one (`entitlements_require_token`).

use serde_json::{Map, Value, json};

use crate::api::{ApiError, Reply};
use crate::state::{Entitlement, State};

const FEATURE: &str = "external_provisioner_daemons";
/// Every other feature name of coderd v2.30.0 (coderd-api.md §2.4): coderd's map always holds every
/// feature, so a client sees the same keys here (`Absent` still drops ours, to test that path).
const OTHER_FEATURES: [&str; 25] = [
    "user_limit",
    "audit_log",
    "connection_log",
    "browser_only",
    "scim",
    "template_rbac",
    "user_role_management",
    "high_availability",
    "multiple_external_auth",
    "appearance",
    "advanced_template_scheduling",
    "workspace_proxy",
    "external_token_encryption",
    "workspace_batch_actions",
    "task_batch_actions",
    "access_control",
    "control_shared_ports",
    "custom_roles",
    "multiple_organizations",
    "workspace_prebuilds",
    "managed_agent_limit",
    "workspace_external_agent",
    "aibridge",
    "boundary",
    "ai_governance_user_limit",
];

pub fn get(state: &mut State, token: Option<&str>) -> Result<Reply, ApiError> {
    let caller = if state.entitlements_require_token {
        // The switch models the route behind `ExtractAPIKeyMW`.
        Some(state.authenticate_session(token)?)
    } else {
        state.authenticate(token).ok().cloned()
    };
    let entitlement = state.entitlement_seen_by(caller.as_ref());
    let mut features = Map::new();
    for name in OTHER_FEATURES {
        features.insert(
            name.to_string(),
            json!({"entitlement": "not_entitled", "enabled": false}),
        );
    }
    if let Some(value) = entitlement.wire_value() {
        features.insert(
            FEATURE.to_string(),
            json!({"entitlement": value, "enabled": entitlement.enabled()}),
        );
    }
    let warnings: Vec<&str> = match entitlement {
        Entitlement::GracePeriod => vec!["Your license expired and is in its grace period."],
        _ => Vec::new(),
    };
    Ok(Reply::json(
        200,
        json!({
            "features": Value::Object(features),
            "warnings": warnings,
            "errors": [],
            "has_license": state.has_license,
            "trial": false,
            "require_telemetry": false,
            "refreshed_at": jiff::Timestamp::now().to_string(),
        }),
    ))
}
