//! §2.1 `GET /api/v2/buildinfo`: no authentication.

use serde_json::json;

use crate::api::Reply;
use crate::version::CoderdVersion;

/// `version` is the modelled release, as `X-Coder-Build-Version`.
pub fn get(version: CoderdVersion) -> Reply {
    Reply::json(
        200,
        json!({
            "external_url": "https://github.com/coder/coder",
            "version": version.build_version(),
            "dashboard_url": "/",
            "telemetry": false,
            "workspace_proxy": false,
            "agent_api_version": "2.0",
            "provisioner_api_version": "1.0",
            "upgrade_message": "",
            "deployment_id": "fake-coderd",
        }),
    )
}
