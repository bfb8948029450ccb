//! The coderd release a fake models (`--coderd-version`): what it reports as its build version and
//! how its rate limiter keys requests, which changed between the two modelled releases.

use serde::{Deserialize, Serialize};

/// A modelled coderd release.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum CoderdVersion {
    /// The limiter runs before the API key is extracted (coder/coder issue #20857), so it keys
    /// every request by client IP and endpoint and never looks at the bypass header.
    #[serde(rename = "v2.30.0")]
    #[value(name = "v2.30.0")]
    V2_30_0,
    /// The first release with coder/coder PR #22049 (merged 2026-02, after v2.30.0 was cut):
    /// `PrecheckAPIKey` validates the session token at the root, so the limiter keys by user,
    /// lets an owner's bypass header through and answers 428 to anyone else's.
    #[default]
    #[serde(rename = "v2.31.0")]
    #[value(name = "v2.31.0")]
    V2_31_0,
}

impl CoderdVersion {
    /// The release name, `v2.31.0`.
    pub fn name(self) -> &'static str {
        match self {
            CoderdVersion::V2_30_0 => "v2.30.0",
            CoderdVersion::V2_31_0 => "v2.31.0",
        }
    }

    /// `X-Coder-Build-Version` and `/buildinfo`'s `version`: the release, marked as the fake.
    pub fn build_version(self) -> String {
        format!("{}+fake", self.name())
    }

    /// Whether the rate limiter sees the session token's user (PR #22049).
    pub fn limits_by_user(self) -> bool {
        self == CoderdVersion::V2_31_0
    }
}

impl std::fmt::Display for CoderdVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
