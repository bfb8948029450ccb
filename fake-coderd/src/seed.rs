//! What a fake starts from and returns to on reset: organizations, users with their session tokens,
//! and the deployment's licensing. Read from JSON or YAML (`--seed-file`) or built in Rust.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::Error;

/// The path value coderd reads as the default organization, whatever its name.
pub const DEFAULT_ORGANIZATION_PARAM: &str = "default";

/// `external_provisioner_daemons` entitlement of the deployment; `Absent` leaves the feature out of the map.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Entitlement {
    Entitled,
    GracePeriod,
    NotEntitled,
    Absent,
}

impl Entitlement {
    /// The wire value, `None` for an absent feature.
    pub fn wire_value(self) -> Option<&'static str> {
        match self {
            Entitlement::Entitled => Some("entitled"),
            Entitlement::GracePeriod => Some("grace_period"),
            Entitlement::NotEntitled => Some("not_entitled"),
            Entitlement::Absent => None,
        }
    }

    /// §1.5: the feature gate passes when the feature is entitled or in grace period.
    pub fn enabled(self) -> bool {
        matches!(self, Entitlement::Entitled | Entitlement::GracePeriod)
    }
}

/// Site role of a user (coderd `coderd/rbac/roles.go`, read at commit
/// db4576d1f43808142247814bdebcf6e4aeb437e9). Owners may do everything and may bypass rate limits
/// (§1.7). A template admin holds create/read/update/delete on provisioner daemons (the RBAC
/// resource of provisioner keys) and read on every organization, site-wide. A member's site role
/// holds only read on provisioner daemons ("All users can see the provisioner daemons").
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum UserRole {
    Owner,
    #[serde(alias = "template-admin")]
    TemplateAdmin,
    Member,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum UserStatus {
    #[default]
    Active,
    Suspended,
    Dormant,
}

impl UserStatus {
    pub(crate) fn wire_value(self) -> &'static str {
        match self {
            UserStatus::Active => "active",
            UserStatus::Suspended => "suspended",
            UserStatus::Dormant => "dormant",
        }
    }
}

/// Deployment seed. Every field is optional in a seed file; the default is a licensed deployment,
/// entitled to external provisioner daemons, with only the `default` organization and the operator user.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Seed {
    /// Fixed id of the default organization (random when absent).
    pub default_organization_id: Option<uuid::Uuid>,
    /// Organizations besides `default`.
    pub organizations: Vec<SeedOrganization>,
    /// Users besides the owner operator user.
    pub users: Vec<SeedUser>,
    /// `external_provisioner_daemons` entitlement.
    pub entitlement: Entitlement,
    /// `has_license` in `/entitlements`.
    pub has_license: bool,
    /// coderd-api.md §2.4: real coderd serves `/entitlements` without a token; `true` demands one.
    pub entitlements_require_token: bool,
    /// `false` models an AGPL (OSS) coderd: `/entitlements` and the provisioner-key routes do not exist (§1.1, §2.4).
    pub enterprise: bool,
    /// coderd's `--provisioner-daemon-psk` (§2.9, deprecated PSK mode); none by default. It
    /// authenticates only the daemons' serve route, which the fake does not serve, so it changes
    /// no answer: in particular it never authenticates `GET /api/v2/provisionerkeys/{key}`.
    pub provisioner_daemon_psk: Option<String>,
}

impl Default for Seed {
    fn default() -> Self {
        Self {
            default_organization_id: None,
            organizations: Vec::new(),
            users: Vec::new(),
            entitlement: Entitlement::Entitled,
            has_license: true,
            entitlements_require_token: false,
            enterprise: true,
            provisioner_daemon_psk: None,
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SeedOrganization {
    pub name: String,
    #[serde(default)]
    pub id: Option<uuid::Uuid>,
}

/// A user and their session token.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SeedUser {
    pub username: String,
    #[serde(default = "default_role")]
    pub role: UserRole,
    /// Session token `<10>-<22>`; generated when absent.
    #[serde(default)]
    pub token: Option<String>,
    /// Names of the organizations the user is a member of (owners see every organization anyway).
    #[serde(default = "default_memberships")]
    pub organizations: Vec<String>,
    /// Organizations (names, ids or `default`) in which the user holds the `organization-admin`
    /// role; being admin implies membership.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub organization_admin: Vec<String>,
    #[serde(default)]
    pub status: UserStatus,
    /// The token exists but expired (coderd-api.md §1.4 "expired").
    #[serde(default)]
    pub token_expired: bool,
}

fn default_role() -> UserRole {
    UserRole::Member
}

fn default_memberships() -> Vec<String> {
    vec![DEFAULT_ORGANIZATION_PARAM.to_string()]
}

impl SeedUser {
    pub fn new(username: &str, role: UserRole) -> Self {
        Self {
            username: username.to_string(),
            role,
            token: None,
            organizations: default_memberships(),
            organization_admin: Vec::new(),
            status: UserStatus::Active,
            token_expired: false,
        }
    }
}

impl Seed {
    /// Reads a seed from a `.json` file, or from YAML for any other extension.
    pub fn from_file(path: &Path) -> Result<Seed, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::ReadSeed {
            path: path.to_path_buf(),
            source,
        })?;
        let is_json = path
            .extension()
            .is_some_and(|ext| ext.eq_ignore_ascii_case("json"));
        let parse_error =
            |format, source: Box<dyn std::error::Error + Send + Sync>| Error::ParseSeed {
                path: path.to_path_buf(),
                format,
                source,
            };
        if is_json {
            serde_json::from_str(&text).map_err(|error| parse_error("JSON", Box::new(error)))
        } else {
            serde_saphyr::from_str(&text).map_err(|error| parse_error("YAML", Box::new(error)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case(
        "seed.json",
        r#"{"organizations":[{"name":"acme"}],"entitlement":"absent","has_license":false}"#
    )]
    #[case(
        "seed.yaml",
        "organizations:\n  - name: acme\nentitlement: absent\nhas_license: false\n"
    )]
    fn seed_files_in_json_or_yaml(#[case] file: &str, #[case] text: &str) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(file);
        std::fs::write(&path, text).expect("written");
        let seed = Seed::from_file(&path).expect("parsed");
        assert_eq!(
            seed.organizations,
            [SeedOrganization {
                name: "acme".to_string(),
                id: None
            }]
        );
        assert_eq!(
            (seed.entitlement, seed.has_license, seed.enterprise),
            (Entitlement::Absent, false, true)
        );
    }

    #[rstest]
    #[case(
        "seed.yaml",
        "users:\n  - username: bob\n    role: admin\n",
        "parsing YAML seed file"
    )]
    #[case("seed.json", r#"{"unknown_field":1}"#, "parsing JSON seed file")]
    #[case("missing.yaml", "", "reading seed file")]
    fn bad_seed_files_are_reported(#[case] file: &str, #[case] text: &str, #[case] expected: &str) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(file);
        if file != "missing.yaml" {
            std::fs::write(&path, text).expect("written");
        }
        let error = Seed::from_file(&path).expect_err("rejected");
        assert!(format!("{error:#}").contains(expected), "{error:#}");
    }
}
