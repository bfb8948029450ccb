//! Starting and stopping a fake: the coderd listener (a wiremock `MockServer` that can be closed and
//! reopened on the same port to play "coderd unreachable") and the admin listener, which stays up.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;

use tokio::sync::oneshot;

use crate::admin::{self, AdminClient};
use crate::error::Error;
use crate::faults::FaultSpec;
use crate::journal::JournalEntry;
use crate::listener::CoderdListener;
use crate::ratelimit::RateLimitSpec;
use crate::seed::{Seed, SeedUser};
use crate::state::{
    Entitlement, Organization, ProvisionerKey, UserRole, UserView, generate_session_token,
    random_alphanumeric, split_session_token,
};
use crate::version::CoderdVersion;
use crate::world::{Shared, World};

/// How long closing or reopening the coderd listener may take.

#[derive(Clone, Debug)]
pub struct FakeConfig {
    /// coderd listener; `None` = a free port on 127.0.0.1.
    pub listen: Option<SocketAddr>,
    /// Admin listener; `None` = a free port on the coderd listener's IP.
    pub admin_listen: Option<SocketAddr>,
    /// Bearer token the admin API demands.
    pub admin_token: String,
    /// Owner operator session token (`<10>-<22>`); generated when `None`.
    pub operator_token: Option<String>,
    pub seed: Seed,
    /// Requests per minute per caller and endpoint, as coderd's `--api-rate-limit`: 512 by
    /// default, 0 or less switches the limiter off. A reset returns to this.
    pub api_rate_limit: i64,
    /// The coderd release modelled: the build version reported and the limiter's keying. The
    /// newest modelled by default.
    pub coderd_version: CoderdVersion,
}

impl Default for FakeConfig {
    fn default() -> Self {
        Self {
            listen: None,
            admin_listen: None,
            admin_token: random_alphanumeric(32),
            operator_token: None,
            seed: Seed::default(),
            api_rate_limit: i64::from(crate::ratelimit::DEFAULT_LIMIT),
            coderd_version: CoderdVersion::default(),
        }
    }
}

/// An in-process fake coderd; both listeners stop when it is dropped.
pub struct FakeCoderd {
    coderd: Arc<CoderdListener>,
    admin_addr: SocketAddr,
    /// Dropped with the fake, which stops the admin server.
    _admin_shutdown: oneshot::Sender<()>,
    admin_token: String,
    operator_token: String,
}

/// Binds, retrying while the previous listener on that address is still being released.
impl FakeCoderd {
    /// A fake with the default seed on a free loopback port.
    pub async fn start() -> Result<FakeCoderd, Error> {
        Self::start_with(FakeConfig::default()).await
    }

    pub async fn start_with(config: FakeConfig) -> Result<FakeCoderd, Error> {
        let operator_token = config
            .operator_token
            .clone()
            .unwrap_or_else(generate_session_token);
        split_session_token(&operator_token).map_err(Error::MalformedOperatorToken)?;
        let world = World::new(
            config.seed,
            operator_token.clone(),
            config.api_rate_limit,
            config.coderd_version,
        )
        .map_err(|error| Error::InvalidSeed(Box::new(error)))?;

        let listen = config
            .listen
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
        let coderd_listener = TcpListener::bind(listen).map_err(|source| Error::Bind {
            addr: listen,
            source,
        })?;
        let coderd_addr = coderd_listener
            .local_addr()
            .map_err(|source| Error::LocalAddress {
                addr: listen,
                source,
            })?;
        let admin_listen = config
            .admin_listen
            .unwrap_or_else(|| SocketAddr::new(coderd_addr.ip(), 0));
        let admin_listener =
            tokio::net::TcpListener::bind(admin_listen)
                .await
                .map_err(|source| Error::Bind {
                    addr: admin_listen,
                    source,
                })?;
        let admin_addr = admin_listener
            .local_addr()
            .map_err(|source| Error::LocalAddress {
                addr: admin_listen,
                source,
            })?;

        let shared = Arc::new(Shared::new(world));
        let coderd = Arc::new(CoderdListener::start(coderd_addr, coderd_listener, shared).await);
        let (admin_shutdown, shutdown) = oneshot::channel();
        admin::serve(
            admin_listener,
            Arc::downgrade(&coderd),
            config.admin_token.clone(),
            format!("http://{coderd_addr}"),
            shutdown,
        );

        Ok(FakeCoderd {
            coderd,
            admin_addr,
            _admin_shutdown: admin_shutdown,
            admin_token: config.admin_token,
            operator_token,
        })
    }

    /// coderd base URL, e.g. `http://127.0.0.1:PORT` (no trailing slash).
    pub fn url(&self) -> String {
        format!("http://{}", self.coderd.addr())
    }

    /// Admin API base URL (the API lives under `/__fake/`), no trailing slash.
    pub fn admin_url(&self) -> String {
        format!("http://{}", self.admin_addr)
    }

    pub fn address(&self) -> SocketAddr {
        self.coderd.addr()
    }

    /// The owner operator session token.
    pub fn operator_token(&self) -> String {
        self.operator_token.clone()
    }

    /// The coderd release the fake models.
    pub fn coderd_version(&self) -> CoderdVersion {
        self.coderd.shared().lock().coderd_version
    }

    pub fn admin_token(&self) -> String {
        self.admin_token.clone()
    }

    /// An HTTP admin client for this fake.
    pub fn admin(&self) -> AdminClient {
        AdminClient::new(&self.admin_url(), &self.admin_token)
    }

    pub fn reset(&self) -> Result<(), Error> {
        self.coderd.shared().lock().reset()
    }

    pub fn set_entitlement(&self, entitlement: Entitlement) {
        self.coderd.shared().lock().set_entitlement(entitlement);
    }

    pub fn set_license(&self, has_license: bool) {
        self.coderd.shared().lock().set_license(has_license);
    }

    pub fn set_entitlements_require_token(&self, require: bool) {
        self.coderd
            .shared()
            .lock()
            .set_entitlements_require_token(require);
    }

    /// `false` models an AGPL coderd (no entitlements or provisioner-key routes).
    pub fn set_enterprise(&self, enterprise: bool) {
        self.coderd.shared().lock().set_enterprise(enterprise);
    }

    pub fn add_organization(&self, name: &str) -> Result<Organization, Error> {
        self.coderd.shared().lock().add_organization(name)
    }

    /// Renames an organization (by name, id or `default`); see [`crate::state::State::rename_organization`].
    pub fn rename_organization(&self, ident: &str, name: &str) -> Result<Organization, Error> {
        self.coderd.shared().lock().rename_organization(ident, name)
    }

    /// Adds a user (member of `default`) and returns their session token.
    pub fn add_user(&self, username: &str, role: UserRole) -> Result<String, Error> {
        self.add_user_with(&SeedUser::new(username, role))
    }

    pub fn add_user_with(&self, user: &SeedUser) -> Result<String, Error> {
        self.coderd.shared().lock().add_user(user)
    }

    /// A user (by name or id) as an owner reads it, e.g. to see a dormant user made active.
    pub fn user(&self, user: &str) -> Result<UserView, Error> {
        self.coderd.shared().lock().user(user)
    }

    pub fn inject_fault(&self, fault: FaultSpec) -> Result<(), Error> {
        self.coderd.inject_fault(fault)
    }

    pub fn clear_faults(&self) {
        self.coderd.shared().lock().clear_faults();
    }

    /// Removes only the faults scoped to this session-token fingerprint.
    pub fn clear_faults_for(&self, fingerprint: &str) {
        self.coderd.shared().lock().clear_faults_for(fingerprint);
    }

    /// `None` returns to the base counting (see [`FakeConfig::api_rate_limit`]).
    pub fn set_rate_limit(&self, spec: Option<RateLimitSpec>) {
        self.coderd.shared().lock().set_rate_limit(spec);
    }

    /// Closes (`true`) or reopens (`false`, same port) the coderd listener; returns once done.
    pub async fn set_unreachable(&self, unreachable: bool) -> Result<(), Error> {
        self.coderd.set_unreachable(unreachable).await
    }

    pub fn keys(&self, org: &str) -> Result<Vec<ProvisionerKey>, Error> {
        self.coderd.shared().lock().keys(org)
    }

    pub fn create_key_directly(
        &self,
        org: &str,
        name: &str,
        tags: BTreeMap<String, String>,
    ) -> Result<String, Error> {
        self.coderd
            .shared()
            .lock()
            .create_key_directly(org, name, tags)
    }

    pub fn delete_key_directly(&self, org: &str, id: &str) -> Result<(), Error> {
        self.coderd.shared().lock().delete_key_directly(org, id)
    }

    pub fn journal(&self) -> Vec<JournalEntry> {
        self.coderd.shared().lock().journal()
    }

    /// The entries recorded after sequence number `since`.
    pub fn journal_since(&self, since: u64) -> Vec<JournalEntry> {
        self.coderd.shared().lock().journal_since(since)
    }

    pub fn clear_journal(&self) {
        self.coderd.shared().lock().clear_journal();
    }
}
