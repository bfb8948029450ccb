//! Everything a fake holds behind one lock — deployment state, faults, rate limiter, journal — and the
//! control operations the Rust API and the admin HTTP API share.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::error::Error;
use crate::faults::Faults;
use crate::journal::{Journal, JournalEntry};
use crate::ratelimit::{RateLimitSpec, RateLimiter};
use crate::seed::{Seed, SeedUser};
use crate::state::{
    Entitlement, Organization, ProvisionerKey, State, UserView, generate_session_token,
};
use crate::version::CoderdVersion;

#[derive(Debug)]
pub struct World {
    pub state: State,
    pub faults: Faults,
    pub limiter: RateLimiter,
    pub journal: Journal,
    /// The modelled release: the build version every answer reports, and the limiter's keying.
    pub coderd_version: CoderdVersion,
    /// The seed with every generated id and token fixed, so a reset returns to the very same deployment.
    seed: Seed,
    operator_token: String,
}

/// Fixes the ids and tokens a seed leaves to chance.
fn pin_seed(mut seed: Seed) -> Seed {
    seed.default_organization_id
        .get_or_insert_with(uuid::Uuid::new_v4);
    for org in &mut seed.organizations {
        org.id.get_or_insert_with(uuid::Uuid::new_v4);
    }
    for user in &mut seed.users {
        user.token.get_or_insert_with(generate_session_token);
    }
    seed
}

impl World {
    /// `api_rate_limit`: requests per minute per caller and endpoint, as coderd's
    /// `--api-rate-limit` (default 512; 0 or less: no limiting), keyed as `coderd_version` keys.
    pub fn new(
        seed: Seed,
        operator_token: String,
        api_rate_limit: i64,
        coderd_version: CoderdVersion,
    ) -> Result<World, Error> {
        let seed = pin_seed(seed);
        let state = State::from_seed(&seed, &operator_token)?;
        Ok(World {
            state,
            faults: Faults::default(),
            limiter: RateLimiter::per_minute(api_rate_limit, coderd_version.limits_by_user()),
            journal: Journal::default(),
            coderd_version,
            seed,
            operator_token,
        })
    }

    pub fn operator_token(&self) -> &str {
        &self.operator_token
    }

    /// State back to the seed, faults cleared, rate limiter back to coderd's default, journal emptied.
    pub fn reset(&mut self) -> Result<(), Error> {
        self.state = State::from_seed(&self.seed, &self.operator_token)?;
        self.faults.clear();
        self.limiter.set(None);
        self.journal.clear();
        Ok(())
    }

    /// Like a license change in coderd, this refreshes the entitlements.
    pub fn set_entitlement(&mut self, entitlement: Entitlement) {
        self.state.entitlement = entitlement;
        self.state.refresh_entitlements();
    }

    /// One user's own entitlement (`None`: the deployment's), see [`State::entitlement_seen_by`].
    pub fn set_user_entitlement(
        &mut self,
        user: &str,
        entitlement: Option<Entitlement>,
    ) -> Result<(), Error> {
        self.state.set_user_entitlement(user, entitlement)
    }

    /// Like a license change in coderd, this refreshes the entitlements.
    pub fn set_license(&mut self, has_license: bool) {
        self.state.has_license = has_license;
        self.state.refresh_entitlements();
    }

    pub fn set_entitlements_require_token(&mut self, require: bool) {
        self.state.entitlements_require_token = require;
    }

    pub fn set_enterprise(&mut self, enterprise: bool) {
        self.state.enterprise = enterprise;
    }

    pub fn add_organization(&mut self, name: &str) -> Result<Organization, Error> {
        self.state.add_organization(name)
    }

    pub fn rename_organization(&mut self, ident: &str, name: &str) -> Result<Organization, Error> {
        self.state.rename_organization(ident, name)
    }

    pub fn add_user(&mut self, user: &SeedUser) -> Result<String, Error> {
        self.state.add_user(user)
    }

    /// A user as coderd's `GET /api/v2/users/{user}` shows it to an owner (by name or id).
    pub fn user(&self, ident: &str) -> Result<UserView, Error> {
        self.state
            .user_by_name_or_id(ident)
            .map(|user| self.state.user_view(user))
            .ok_or_else(|| Error::UnknownUser(ident.to_string()))
    }

    pub fn clear_faults(&mut self) {
        self.faults.clear();
    }

    pub fn clear_faults_for(&mut self, fingerprint: &str) {
        self.faults.clear_for(fingerprint);
    }

    pub fn set_rate_limit(&mut self, spec: Option<RateLimitSpec>) {
        self.limiter.set(spec);
    }

    fn organization_id(&self, org: &str) -> Result<String, Error> {
        self.state
            .organization(org)
            .map(|org| org.id.clone())
            .ok_or_else(|| Error::UnknownOrganization(org.to_string()))
    }

    /// The organization's keys as `GET .../provisionerkeys` would list them.
    pub fn keys(&self, org: &str) -> Result<Vec<ProvisionerKey>, Error> {
        Ok(self.state.list_keys(&self.organization_id(org)?))
    }

    /// Creates a key as if some other client had (not journaled); returns its plaintext.
    pub fn create_key_directly(
        &mut self,
        org: &str,
        name: &str,
        tags: BTreeMap<String, String>,
    ) -> Result<String, Error> {
        let org_id = self.organization_id(org)?;
        self.state
            .create_key(&org_id, name, tags)
            .map_err(Error::KeyRefused)
    }

    /// Deletes a key by id as if some other client had (not journaled).
    pub fn delete_key_directly(&mut self, org: &str, id: &str) -> Result<(), Error> {
        let org_id = self.organization_id(org)?;
        let name = self
            .state
            .list_keys(&org_id)
            .into_iter()
            .find(|key| key.id == id)
            .map(|key| key.name)
            .ok_or_else(|| Error::UnknownKey {
                organization: org.to_string(),
                id: id.to_string(),
            })?;
        self.state
            .delete_key(&org_id, &name)
            .map_err(Error::KeyRefused)
    }

    pub fn journal(&self) -> Vec<JournalEntry> {
        self.journal.entries().to_vec()
    }

    /// The entries after sequence number `since` (sequence numbers never repeat, not even across
    /// a clear or reset), so pollers fetch only what is new.
    pub fn journal_since(&self, since: u64) -> Vec<JournalEntry> {
        let entries = self.journal.entries();
        let start = entries.partition_point(|entry| entry.seq <= since);
        entries[start..].to_vec()
    }

    pub fn clear_journal(&mut self) {
        self.journal.clear();
    }
}

/// What the coderd responders, the admin API and the Rust API share.
pub struct Shared {
    world: Mutex<World>,
}

impl Shared {
    pub fn new(world: World) -> Shared {
        Shared {
            world: Mutex::new(world),
        }
    }

    /// The world; a panic in another responder does not make it unusable.
    pub fn lock(&self) -> MutexGuard<'_, World> {
        self.world.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
