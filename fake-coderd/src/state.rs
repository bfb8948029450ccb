//! The deployment a fake coderd models: organizations, users and their session tokens, provisioner
//! keys per organization, and licensing. Pure logic, no I/O: routes translate HTTP into these calls.

use std::collections::BTreeMap;

use jiff::Timestamp;
use rand::RngExt;
use rand::distr::Alphanumeric;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::api::ApiError;
use crate::error::Error;
pub use crate::seed::{
    DEFAULT_ORGANIZATION_PARAM, Entitlement, Seed, SeedUser, UserRole, UserStatus,
};
use crate::session_token::{TOKEN_ID_LENGTH, TOKEN_SECRET_LENGTH};
pub use crate::session_token::{TokenFormatError, split_session_token};

/// The name of the default organization of a deployment: coderd's migrations insert it as
/// `first-organization` and `000259_rename_first_organization.up.sql` (coder/coder, read at commit
/// bdaae5e3e280ec5069b5daadbd7966c59f6d0dda, PR #14808, v2.16) renames it to `coder`, display name
/// `Coder`. No organization is named `default`: that is a path alias (issue 25, item 1). Clients
/// must find the default organization through the alias, never by this name.
pub const DEFAULT_ORGANIZATION_NAME: &str = "coder";
/// The display name migration 000259 gives the default organization.
pub const DEFAULT_ORGANIZATION_DISPLAY_NAME: &str = "Coder";
/// The path value that means "the default organization", compared exactly (case-sensitive), as in
/// coderd's `httpmw.ExtractOrganizationParam` (`arg == codersdk.DefaultOrganization`).
pub const NIL_UUID: &str = "00000000-0000-0000-0000-000000000000";
/// The owner user that holds the operator token (coderd-api.md §1.2).
pub const OPERATOR_USERNAME: &str = "coder-k8s-operator";
/// coderd-api.md §2.6: `secretLength = 43`.
pub const KEY_SECRET_LENGTH: usize = 43;
/// coderd-api.md §2.6: `varchar(64)`, checked in bytes.
pub const MAX_KEY_NAME_BYTES: usize = 64;
/// coderd-api.md §2.5/§2.7: the reserved keys, present only in the default organization, with fixed ids.
pub const RESERVED_KEYS: [(&str, &str); 3] = [
    ("built-in", "00000000-0000-0000-0000-000000000001"),
    ("user-auth", "00000000-0000-0000-0000-000000000002"),
    ("psk", "00000000-0000-0000-0000-000000000003"),
];

/// `codersdk.Organization` (§2.3).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Organization {
    pub id: String,
    pub name: String,
    pub display_name: String,
    pub icon: String,
    pub description: String,
    pub created_at: String,
    pub updated_at: String,
    pub is_default: bool,
}

/// `codersdk.ProvisionerKey` (§2.5); never carries the secret.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ProvisionerKey {
    pub id: String,
    pub created_at: String,
    pub organization: String,
    pub name: String,
    pub tags: BTreeMap<String, String>,
}

/// One role entry of `codersdk.User.roles`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct RoleView {
    pub name: String,
    pub display_name: String,
}

/// `codersdk.User` (§2.2).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct UserView {
    pub id: String,
    pub username: String,
    pub email: String,
    pub created_at: String,
    pub updated_at: String,
    /// coderd always sends it (`omitempty` does not drop a zero `time.Time`); the fake uses the
    /// creation time.
    pub last_seen_at: String,
    pub status: String,
    pub login_type: String,
    pub organization_ids: Vec<String>,
    pub roles: Vec<RoleView>,
}

#[derive(Clone, Debug)]
pub struct User {
    pub id: String,
    pub username: String,
    pub role: UserRole,
    pub status: UserStatus,
    /// Organization ids the user is a member of.
    pub organization_ids: Vec<String>,
    /// Organization ids in which the user holds `organization-admin`.
    pub admin_organization_ids: Vec<String>,
    pub created_at: String,
    /// Changes when coderd updates the user: here, when a dormant user is made active.
    pub updated_at: String,
    /// The entitlement this user's calls see instead of the deployment's (`None`: the
    /// deployment's). Not coderd behaviour, which has one per deployment: it lets tests that share
    /// one fake each see their own answer (see [`State::entitlement_seen_by`]).
    pub entitlement: Option<Entitlement>,
}

impl User {
    /// `ExtractAPIKey`'s status check.
    fn ensure_active(&self) -> Result<(), ApiError> {
        if self.status == UserStatus::Active {
            return Ok(());
        }
        Err(ApiError::new(
            401,
            format!(
                "User is not active (status = \"{}\"). Contact an admin to reactivate your account.",
                self.status.wire_value()
            ),
        ))
    }

    pub fn is_owner(&self) -> bool {
        self.role == UserRole::Owner
    }

    /// May create and delete the organization's provisioner keys: the site owner, a template
    /// admin (site-wide CRUD on provisioner daemons), or an organization admin (coderd RBAC:
    /// `organization-admin` holds every action in its organization). A plain member may only read
    /// them; coderd's database authorizer refuses the insert or delete (see
    /// [`State::create_key`], [`State::delete_key`]).
    pub fn may_manage_keys_in(&self, organization_id: &str) -> bool {
        matches!(self.role, UserRole::Owner | UserRole::TemplateAdmin)
            || self
                .admin_organization_ids
                .iter()
                .any(|id| id == organization_id)
    }

    /// May read every organization (owners; template admins read `organization` site-wide);
    /// anyone else reads only the organizations they are a member of.
    pub fn reads_every_organization(&self) -> bool {
        matches!(self.role, UserRole::Owner | UserRole::TemplateAdmin)
    }
}

#[derive(Clone, Debug)]
struct SessionToken {
    id: String,
    secret_hash: String,
    user_id: String,
    expired_at: Option<String>,
}

#[derive(Clone, Debug)]
struct StoredKey {
    view: ProvisionerKey,
    /// sha256 of the plaintext; reserved keys have none.
    secret_hash: Option<String>,
    reserved: bool,
}

/// The whole mutable deployment.
#[derive(Clone, Debug)]
pub struct State {
    organizations: Vec<Organization>,
    users: Vec<User>,
    tokens: Vec<SessionToken>,
    keys: Vec<StoredKey>,
    pub entitlement: Entitlement,
    pub has_license: bool,
    pub entitlements_require_token: bool,
    pub enterprise: bool,
    last_timestamp: Timestamp,
    entitlements_refreshed: EntitlementsRefresh,
}

/// What coderd's last entitlements refresh saw (`license.Entitlements` runs at start, every
/// `EntitlementsUpdateInterval` and when a license changes; `serveEntitlements` answers its
/// result): when it ran and the active user count it took.
#[derive(Clone, Copy, Debug)]
pub struct EntitlementsRefresh {
    pub at: Timestamp,
    pub active_users: i64,
}

/// `enterprise/coderd/coderd.go` `New`: `EntitlementsUpdateInterval` defaults to 10 minutes.
const ENTITLEMENTS_UPDATE_INTERVAL: jiff::SignedDuration = jiff::SignedDuration::from_mins(10);

/// Random `[A-Za-z0-9]` string.
pub fn random_alphanumeric(length: usize) -> String {
    rand::rng()
        .sample_iter(Alphanumeric)
        .take(length)
        .map(char::from)
        .collect()
}

/// A new session token shaped `<10>-<22>` (§1.2).
pub fn generate_session_token() -> String {
    format!(
        "{}-{}",
        random_alphanumeric(TOKEN_ID_LENGTH),
        random_alphanumeric(TOKEN_SECRET_LENGTH)
    )
}

fn sha256_hex(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// One character under Go's simple Unicode case folding, as `strings.EqualFold` compares
/// (`ſ` folds with `s`, the Kelvin sign `K` with `k`); multi-character mappings are not folds.
fn simple_fold(c: char) -> char {
    let mut upper = c.to_uppercase();
    let folded = match (upper.next(), upper.next()) {
        (Some(single), None) => single,
        _ => c,
    };
    let mut lower = folded.to_lowercase();
    match (lower.next(), lower.next()) {
        (Some(single), None) => single,
        _ => folded,
    }
}

/// Go's `strings.EqualFold`.
pub fn equal_fold(a: &str, b: &str) -> bool {
    a.chars().count() == b.chars().count()
        && a.chars()
            .zip(b.chars())
            .all(|(x, y)| simple_fold(x) == simple_fold(y))
}

/// coderd `enterprise/coderd/provisionerkeys.go`: `strings.EqualFold` against the reserved names.
fn is_reserved_key_name(name: &str) -> bool {
    RESERVED_KEYS
        .iter()
        .any(|(reserved, _)| equal_fold(reserved, name))
}

impl State {
    /// Builds the deployment a seed describes, with `operator_token` belonging to the owner operator user.
    pub fn from_seed(seed: &Seed, operator_token: &str) -> Result<State, Error> {
        let mut state = State {
            organizations: Vec::new(),
            users: Vec::new(),
            tokens: Vec::new(),
            keys: Vec::new(),
            entitlement: seed.entitlement,
            has_license: seed.has_license,
            entitlements_require_token: seed.entitlements_require_token,
            enterprise: seed.enterprise,
            last_timestamp: Timestamp::UNIX_EPOCH,
            entitlements_refreshed: EntitlementsRefresh {
                at: Timestamp::UNIX_EPOCH,
                active_users: 0,
            },
        };
        let default_id = seed.default_organization_id.unwrap_or_else(Uuid::new_v4);
        let default_org = state.insert_organization(
            DEFAULT_ORGANIZATION_NAME,
            DEFAULT_ORGANIZATION_DISPLAY_NAME,
            default_id,
            true,
        )?;
        for (name, id) in RESERVED_KEYS {
            let created_at = state.next_timestamp();
            state.keys.push(StoredKey {
                view: ProvisionerKey {
                    id: id.to_string(),
                    created_at,
                    organization: default_org.id.clone(),
                    name: name.to_string(),
                    tags: BTreeMap::new(),
                },
                secret_hash: None,
                reserved: true,
            });
        }
        for org in &seed.organizations {
            state.insert_organization(
                &org.name,
                &org.name,
                org.id.unwrap_or_else(Uuid::new_v4),
                false,
            )?;
        }
        let mut operator = SeedUser::new(OPERATOR_USERNAME, UserRole::Owner);
        operator.token = Some(operator_token.to_string());
        for user in std::iter::once(&operator).chain(&seed.users) {
            state.add_user(user)?;
        }
        state.refresh_entitlements();
        Ok(state)
    }

    /// Strictly increasing "now", so that keys created in one burst still sort by `created_at`.
    fn next_timestamp(&mut self) -> String {
        let now = Timestamp::now();
        let next = if now > self.last_timestamp {
            now
        } else {
            self.last_timestamp
                .checked_add(jiff::SignedDuration::from_micros(1))
                .unwrap_or(self.last_timestamp)
        };
        self.last_timestamp = next;
        next.to_string()
    }

    fn insert_organization(
        &mut self,
        name: &str,
        display_name: &str,
        id: Uuid,
        is_default: bool,
    ) -> Result<Organization, Error> {
        if name.is_empty() {
            return Err(Error::EmptyOrganizationName);
        }
        let id = id.to_string();
        if self
            .organizations
            .iter()
            .any(|org| org.name.eq_ignore_ascii_case(name) || org.id == id)
        {
            return Err(Error::DuplicateOrganization {
                name: name.to_string(),
                id,
            });
        }
        let created_at = self.next_timestamp();
        let org = Organization {
            id,
            name: name.to_string(),
            display_name: display_name.to_string(),
            icon: String::new(),
            description: String::new(),
            updated_at: created_at.clone(),
            created_at,
            is_default,
        };
        self.organizations.push(org.clone());
        Ok(org)
    }

    /// Adds a non-default organization.
    pub fn add_organization(&mut self, name: &str) -> Result<Organization, Error> {
        self.insert_organization(name, name, Uuid::new_v4(), false)
    }

    /// Renames an organization (by name, id, `default` or the nil UUID), as an owner may with
    /// coderd's `PATCH /api/v2/organizations/{organization}`: the default one too, so that no
    /// client can count on its name (`coder` since coderd v2.16, `first-organization` before).
    pub fn rename_organization(&mut self, ident: &str, name: &str) -> Result<Organization, Error> {
        if name.is_empty() {
            return Err(Error::EmptyOrganizationName);
        }
        let id = self
            .organization(ident)
            .ok_or_else(|| Error::UnknownOrganization(ident.to_string()))?
            .id
            .clone();
        if let Some(taken) = self
            .organizations
            .iter()
            .find(|org| org.id != id && org.name.eq_ignore_ascii_case(name))
        {
            return Err(Error::DuplicateOrganization {
                name: name.to_string(),
                id: taken.id.clone(),
            });
        }
        let updated_at = self.next_timestamp();
        let org = self
            .organizations
            .iter_mut()
            .find(|org| org.id == id)
            .expect("found above");
        org.name = name.to_string();
        org.updated_at = updated_at;
        Ok(org.clone())
    }

    pub fn organizations(&self) -> &[Organization] {
        &self.organizations
    }

    /// Adds a user with a session token (the given one or a new one) and returns the token.
    pub fn add_user(&mut self, spec: &SeedUser) -> Result<String, Error> {
        if spec.username.is_empty() {
            return Err(Error::EmptyUsername);
        }
        if self
            .users
            .iter()
            .any(|user| user.username.eq_ignore_ascii_case(&spec.username))
        {
            return Err(Error::DuplicateUser(spec.username.clone()));
        }
        let token = spec.token.clone().unwrap_or_else(generate_session_token);
        let (token_id, token_secret) =
            split_session_token(&token).map_err(|reason| Error::MalformedUserToken {
                username: spec.username.clone(),
                reason,
            })?;
        if self.tokens.iter().any(|existing| existing.id == token_id) {
            return Err(Error::DuplicateTokenId(spec.username.clone()));
        }
        let mut organization_ids = Vec::new();
        let mut admin_organization_ids = Vec::new();
        for (name, admin) in spec
            .organizations
            .iter()
            .map(|name| (name, false))
            .chain(spec.organization_admin.iter().map(|name| (name, true)))
        {
            let org = self
                .organization(name)
                .ok_or_else(|| Error::UnknownMembership {
                    username: spec.username.clone(),
                    organization: name.clone(),
                })?;
            if !organization_ids.contains(&org.id) {
                organization_ids.push(org.id.clone());
            }
            if admin {
                admin_organization_ids.push(org.id.clone());
            }
        }
        let created_at = self.next_timestamp();
        let user = User {
            id: Uuid::new_v4().to_string(),
            username: spec.username.clone(),
            role: spec.role,
            status: spec.status,
            organization_ids,
            admin_organization_ids,
            created_at: created_at.clone(),
            updated_at: created_at.clone(),
            entitlement: None,
        };
        self.tokens.push(SessionToken {
            id: token_id.to_string(),
            secret_hash: sha256_hex(token_secret),
            user_id: user.id.clone(),
            expired_at: spec.token_expired.then_some(created_at),
        });
        self.users.push(user);
        Ok(token)
    }

    /// The §1.4 token checks in coderd's order, for a token found in cookie, query or header: the
    /// index of the token's user.
    fn token_user(&self, token: Option<&str>) -> Result<usize, ApiError> {
        let Some(token) = token.filter(|token| !token.is_empty()) else {
            return Err(ApiError::signed_out(
                "Cookie \"coder_session_token\" or query parameter must be provided.",
            ));
        };
        let (id, secret) = split_session_token(token)
            .map_err(|reason| ApiError::signed_out(format!("Invalid API key format: {reason}")))?;
        let stored = self
            .tokens
            .iter()
            .find(|stored| stored.id == id)
            .ok_or_else(|| ApiError::signed_out("API key is invalid."))?;
        if stored.secret_hash != sha256_hex(secret) {
            return Err(ApiError::signed_out("API key secret is invalid."));
        }
        if let Some(expired_at) = &stored.expired_at {
            return Err(ApiError::signed_out(format!(
                "API key expired at \"{expired_at}\"."
            )));
        }
        self.users
            .iter()
            .position(|user| user.id == stored.user_id)
            .ok_or_else(|| ApiError::signed_out("API key is invalid."))
    }

    /// The token's user if active; read-only, as the rate limiter and the routes without
    /// `ExtractAPIKeyMW` see a token.
    pub fn authenticate(&self, token: Option<&str>) -> Result<&User, ApiError> {
        let user = &self.users[self.token_user(token)?];
        user.ensure_active()?;
        Ok(user)
    }

    /// `httpmw.ExtractAPIKeyMW` on a route: the token checks, then a dormant user is made active
    /// (`ActivateDormantUser`: status `active`, `updated_at` now) before the status check, so
    /// the request goes on (`coderd/httpmw/apikey.go` `ExtractAPIKey`, read at commit
    /// a2c107ca853268ccc52fd7cba323e013906eb733; `coderd/userauth.go` `ActivateDormantUser`).
    /// A suspended user is still refused.
    pub fn authenticate_session(&mut self, token: Option<&str>) -> Result<User, ApiError> {
        let index = self.token_user(token)?;
        if self.users[index].status == UserStatus::Dormant {
            let now = self.next_timestamp();
            let user = &mut self.users[index];
            user.status = UserStatus::Active;
            user.updated_at = now;
        }
        let user = &self.users[index];
        user.ensure_active()?;
        Ok(user.clone())
    }

    /// §2.3 resolution: exactly `default` or the nil UUID, then a UUID by id, then a
    /// case-insensitive name (so `Default` is a name lookup, and no organization is named that).
    pub fn organization(&self, ident: &str) -> Option<&Organization> {
        if ident == DEFAULT_ORGANIZATION_PARAM || ident == NIL_UUID {
            return self.organizations.iter().find(|org| org.is_default);
        }
        if let Ok(id) = Uuid::parse_str(ident) {
            let id = id.to_string();
            return self.organizations.iter().find(|org| org.id == id);
        }
        self.organizations
            .iter()
            .find(|org| org.name.eq_ignore_ascii_case(ident))
    }

    /// The organization as `user` may see it: owners see all, members only their own (§2.3 "no
    /// read access" is 404, the same answer as an unknown organization). The path value is never
    /// empty: chi matches no `{organization}` to an empty segment, so the middleware's 400 for an
    /// empty value is unreachable.
    pub fn organization_for(&self, user: &User, ident: &str) -> Result<&Organization, ApiError> {
        self.organization(ident)
            .filter(|org| {
                user.reads_every_organization() || user.organization_ids.contains(&org.id)
            })
            .ok_or_else(|| ApiError::organization_not_found(ident))
    }

    pub fn user_view(&self, user: &User) -> UserView {
        let role = |name: &str, display_name: &str| RoleView {
            name: name.to_string(),
            display_name: display_name.to_string(),
        };
        let roles = match user.role {
            UserRole::Owner => vec![role("owner", "Owner")],
            UserRole::TemplateAdmin => vec![role("template-admin", "Template Admin")],
            UserRole::Member => Vec::new(),
        };
        UserView {
            id: user.id.clone(),
            username: user.username.clone(),
            email: format!("{}@fake-coderd.invalid", user.username),
            created_at: user.created_at.clone(),
            updated_at: user.updated_at.clone(),
            last_seen_at: user.created_at.clone(),
            status: user.status.wire_value().to_string(),
            login_type: if user.username == OPERATOR_USERNAME {
                "none"
            } else {
                "password"
            }
            .to_string(),
            organization_ids: user.organization_ids.clone(),
            roles,
        }
    }

    /// The entitlement `/entitlements` and the key routes' feature gate apply to a call: the
    /// caller's own when one was set for it, else the deployment's.
    pub fn entitlement_seen_by(&self, caller: Option<&User>) -> Entitlement {
        caller
            .and_then(|user| user.entitlement)
            .unwrap_or(self.entitlement)
    }

    /// Recomputes the entitlements now, as coderd does when a license is added or removed.
    pub fn refresh_entitlements(&mut self) {
        let active_users = self
            .users
            .iter()
            .filter(|user| user.status == UserStatus::Active)
            .count();
        self.entitlements_refreshed = EntitlementsRefresh {
            at: Timestamp::now(),
            active_users: i64::try_from(active_users).unwrap_or(i64::MAX),
        };
    }

    /// The last refresh, renewed first when it is older than coderd's update interval.
    pub fn entitlements_refresh(&mut self) -> EntitlementsRefresh {
        let due = self
            .entitlements_refreshed
            .at
            .checked_add(ENTITLEMENTS_UPDATE_INTERVAL)
            .is_ok_and(|due| due <= Timestamp::now());
        if due {
            self.refresh_entitlements();
        }
        self.entitlements_refreshed
    }

    /// Gives one user an entitlement of its own (`None`: the deployment's again).
    pub fn set_user_entitlement(
        &mut self,
        ident: &str,
        entitlement: Option<Entitlement>,
    ) -> Result<(), Error> {
        let user = self
            .users
            .iter_mut()
            .find(|user| user.id == ident || user.username.eq_ignore_ascii_case(ident))
            .ok_or_else(|| Error::UnknownUser(ident.to_owned()))?;
        user.entitlement = entitlement;
        self.refresh_entitlements();
        Ok(())
    }

    pub fn user_by_name_or_id(&self, ident: &str) -> Option<&User> {
        self.users
            .iter()
            .find(|user| user.id == ident || user.username.eq_ignore_ascii_case(ident))
    }

    /// §2.5: the organization's keys without the reserved ones, oldest first.
    pub fn list_keys(&self, organization_id: &str) -> Vec<ProvisionerKey> {
        let mut keys: Vec<ProvisionerKey> = self
            .keys
            .iter()
            .filter(|key| key.view.organization == organization_id && !key.reserved)
            .map(|key| key.view.clone())
            .collect();
        keys.sort_by(|a, b| a.created_at.cmp(&b.created_at));
        keys
    }

    /// §2.6 validation (after JSON decoding) and insert as a caller allowed to create keys;
    /// returns the plaintext secret.
    pub fn create_key(
        &mut self,
        organization_id: &str,
        name: &str,
        tags: BTreeMap<String, String>,
    ) -> Result<String, ApiError> {
        self.create_key_as(organization_id, name, tags, true)
    }

    /// §2.6 in coderd's order (`enterprise/coderd/provisionerkeys.go` `postProvisionerKey`, read at
    /// commit 09e87fc2b0283d5c2988fccbd6d3a2bd00877ec8): the name checks (400), then the insert,
    /// which coderd's database authorizer (`coderd/database/dbauthz/dbauthz.go`
    /// `InsertProvisionerKey`, commit ccc309e8c341aef9c8e3483a4b9d8fd693f94364) refuses for a
    /// caller without create on the organization's provisioner daemons; the handler turns that
    /// error into a 500 (`httpapi.InternalServerError`), before any duplicate (409) could show.
    pub fn create_key_as(
        &mut self,
        organization_id: &str,
        name: &str,
        tags: BTreeMap<String, String>,
        may_create: bool,
    ) -> Result<String, ApiError> {
        if name.is_empty() {
            return Err(ApiError::validation("name", "Name is required"));
        }
        if name.len() > MAX_KEY_NAME_BYTES {
            return Err(ApiError::validation(
                "name",
                "Name must be at most 64 characters",
            ));
        }
        if is_reserved_key_name(name) {
            return Err(ApiError::validation(
                "name",
                format!("Name cannot be reserved name '{name}'"),
            ));
        }
        if !may_create {
            return Err(ApiError::authorizer_refused());
        }
        if self.find_key(organization_id, name).is_some() {
            return Err(ApiError::new(
                409,
                format!("Provisioner key with name '{name}' already exists in organization"),
            ));
        }
        let secret = random_alphanumeric(KEY_SECRET_LENGTH);
        let created_at = self.next_timestamp();
        self.keys.push(StoredKey {
            view: ProvisionerKey {
                id: Uuid::new_v4().to_string(),
                created_at,
                organization: organization_id.to_string(),
                // §2.6: stored lower-cased (`lower(@name)`).
                name: name.to_lowercase(),
                tags,
            },
            secret_hash: Some(sha256_hex(&secret)),
            reserved: false,
        });
        Ok(secret)
    }

    fn find_key(&self, organization_id: &str, name: &str) -> Option<&StoredKey> {
        let lowered = name.to_lowercase();
        self.keys
            .iter()
            .find(|key| key.view.organization == organization_id && key.view.name == lowered)
    }

    /// `httpmw.ExtractProvisionerKeyParam`: the organization's key of that name, else the generic 404.
    pub fn key_named(
        &self,
        organization_id: &str,
        name: &str,
    ) -> Result<&ProvisionerKey, ApiError> {
        self.find_key(organization_id, name)
            .map(|key| &key.view)
            .ok_or_else(ApiError::resource_not_found)
    }

    /// §2.7 as a caller allowed to delete keys.
    pub fn delete_key(&mut self, organization_id: &str, name: &str) -> Result<(), ApiError> {
        self.delete_key_as(organization_id, name, true)
    }

    /// §2.7: 404 when the name is unknown in the organization (checked first, by
    /// `httpmw.ExtractProvisionerKeyParam`, which every reader of provisioner daemons passes), then
    /// 400 for a reserved key, then the delete, which coderd's database authorizer
    /// (`dbauthz.go` `DeleteProvisionerKey`: `deleteQ`, action delete) refuses for a caller
    /// without delete on provisioner daemons; `deleteProvisionerKey` answers that error 500.
    pub fn delete_key_as(
        &mut self,
        organization_id: &str,
        name: &str,
        may_delete: bool,
    ) -> Result<(), ApiError> {
        let key = self
            .find_key(organization_id, name)
            .ok_or_else(ApiError::resource_not_found)?;
        if key.reserved {
            return Err(ApiError::new(
                400,
                format!("Cannot delete reserved '{}' provisioner key", key.view.name),
            ));
        }
        if !may_delete {
            return Err(ApiError::authorizer_refused());
        }
        let id = key.view.id.clone();
        self.keys.retain(|key| key.view.id != id);
        Ok(())
    }

    /// §2.9: a daemon key is found by the hash of its plaintext.
    pub fn key_by_secret(&self, secret: &str) -> Option<&ProvisionerKey> {
        let hash = sha256_hex(secret);
        self.keys
            .iter()
            .find(|key| key.secret_hash.as_deref() == Some(hash.as_str()))
            .map(|key| &key.view)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn state() -> State {
        let seed = Seed {
            organizations: vec![crate::seed::SeedOrganization {
                name: "Acme".to_string(),
                id: None,
            }],
            ..Seed::default()
        };
        State::from_seed(&seed, "abcdefghij-0123456789012345678901").expect("seed is valid")
    }

    #[rstest]
    #[case("a", "incorrect amount of API key parts, expected 2 got 1")]
    #[case("a-b-c", "incorrect amount of API key parts, expected 2 got 3")]
    #[case(
        "abcdefg-0123456789012345678901",
        "invalid API key ID length, expected 10 got 7"
    )]
    #[case("abcdefghij-01234", "invalid API key secret length, expected 22 got 5")]
    fn malformed_tokens_report_coderds_reason(#[case] token: &str, #[case] reason: &str) {
        assert_eq!(
            split_session_token(token).map_err(|error| error.to_string()),
            Err(reason.to_string())
        );
    }

    #[rstest]
    #[case("default", true)]
    #[case(NIL_UUID, true)]
    #[case("coder", true)]
    #[case("CODER", true)]
    #[case("acme", false)]
    #[case("ACME", false)]
    fn organization_lookup(#[case] ident: &str, #[case] is_default: bool) {
        let state = state();
        let org = state.organization(ident).expect("organization found");
        assert_eq!(org.is_default, is_default);
        assert_eq!(
            state.organization(&org.id.clone()).map(|o| o.name.as_str()),
            Some(org.name.as_str())
        );
    }

    #[test]
    fn a_renamed_default_organization_keeps_its_id_and_is_found_by_default_only() {
        let mut state = state();
        let before = state.organization("default").expect("default org").clone();
        let renamed = state
            .rename_organization("default", "main-org")
            .expect("renamed");
        assert_eq!(
            (renamed.id.as_str(), renamed.is_default),
            (before.id.as_str(), true)
        );
        assert_eq!(
            state.organization("default").map(|o| o.name.as_str()),
            Some("main-org")
        );
        assert_eq!(
            state.organization("MAIN-ORG").map(|o| o.id.as_str()),
            Some(before.id.as_str())
        );
        assert!(
            state.organization("coder").is_none(),
            "the old name is gone"
        );
        assert!(matches!(
            state.rename_organization("default", "ACME"),
            Err(Error::DuplicateOrganization { .. })
        ));
        assert!(matches!(
            state.rename_organization("no-such-org", "x"),
            Err(Error::UnknownOrganization(_))
        ));
    }

    #[rstest]
    #[case("Default")]
    #[case("DEFAULT")]
    #[case("default ")]
    fn only_the_exact_lower_case_default_means_the_default_organization(#[case] ident: &str) {
        assert!(state().organization(ident).is_none());
    }

    #[test]
    fn the_default_organization_is_no_longer_named_first_organization() {
        let state = state();
        assert!(state.organization("first-organization").is_none());
        let org = state.organization("default").expect("default org");
        assert_eq!(
            (org.name.as_str(), org.display_name.as_str()),
            ("coder", "Coder")
        );
    }

    #[test]
    fn unknown_uuid_is_not_looked_up_by_name() {
        assert!(
            state()
                .organization("11111111-1111-1111-1111-111111111111")
                .is_none()
        );
    }

    #[test]
    fn created_keys_are_lower_cased_sorted_and_authenticate_by_secret() {
        let mut state = state();
        let org = state
            .organization("default")
            .expect("default org")
            .id
            .clone();
        let first = state
            .create_key(&org, "Zeta", BTreeMap::new())
            .expect("created");
        state
            .create_key(&org, "alpha", BTreeMap::new())
            .expect("created");
        assert_eq!(first.len(), KEY_SECRET_LENGTH);
        let names: Vec<String> = state.list_keys(&org).into_iter().map(|k| k.name).collect();
        assert_eq!(names, ["zeta", "alpha"]);
        assert_eq!(
            state.key_by_secret(&first).map(|k| k.name.as_str()),
            Some("zeta")
        );
        assert_eq!(
            state
                .create_key(&org, "ZETA", BTreeMap::new())
                .map_err(|e| e.status),
            Err(409)
        );
    }
}
