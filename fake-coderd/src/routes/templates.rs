//! The route templates the fake serves (coderd's chi patterns), shared by the router, the
//! faults and the errors that name them.

pub const BUILD_INFO: &str = "/api/v2/buildinfo";
pub const USER: &str = "/api/v2/users/{user}";
pub const ORGANIZATION: &str = "/api/v2/organizations/{organization}";
pub const ENTITLEMENTS: &str = "/api/v2/entitlements";
/// GET lists, POST creates (§2.5, §2.6).
pub const PROVISIONER_KEYS: &str = "/api/v2/organizations/{organization}/provisionerkeys";
pub const LIST_KEYS: &str = PROVISIONER_KEYS;
pub const CREATE_KEY: &str = PROVISIONER_KEYS;
pub const DELETE_KEY: &str =
    "/api/v2/organizations/{organization}/provisionerkeys/{provisionerkey}";
/// §2.9 step 1, authenticated by `Coder-Provisioner-Daemon-Key`.
pub const DAEMON_KEY: &str = "/api/v2/provisionerkeys/{provisionerkey}";
/// Every route template the fake serves.
pub const TEMPLATES: [&str; 7] = [
    BUILD_INFO,
    USER,
    ORGANIZATION,
    ENTITLEMENTS,
    PROVISIONER_KEYS,
    DELETE_KEY,
    DAEMON_KEY,
];
