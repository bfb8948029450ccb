//! A stateful, faithful, scriptable and journaled fake of the coderd HTTP API subset a
//! CoderProvisioner operator uses (`/work/shared/spec/coderd-api.md`), built on wiremock.
//!
//! * `state` — organizations, users and session tokens, provisioner keys, entitlement (pure logic);
//! * `routes` — one wiremock responder per coderd endpoint and the shared request pipeline;
//! * `faults`, `ratelimit`, `journal` — scripted misbehaviour, §1.7 limiter, request record;
//! * `admin` — the admin HTTP API and `AdminClient`; `server` — `FakeCoderd`, listeners;
//! * `error` — `Error`, what the fake itself refuses or fails at;
//! * `version` — the modelled coderd release (`--coderd-version`);
//! * `stub` — the `coder-stub` provisioner daemon stand-in (binary `coder-stub`).

pub mod admin;
pub mod api;
pub mod error;
pub mod faults;
pub mod journal;
mod listener;
pub mod ratelimit;
pub mod routes;
pub mod seed;
pub mod server;
mod session_token;
pub mod state;
pub mod stub;
pub mod version;
pub mod world;

/// Logs of the two binaries: `RUST_LOG` (default `info`) on stderr, colours only on a terminal.
pub fn init_logging() {
    use std::io::IsTerminal as _;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

pub use admin::AdminClient;
pub use error::Error;
pub use faults::{FaultKind, FaultSpec};
pub use journal::{JournalEntry, JournalQuery, fingerprint};
pub use ratelimit::RateLimitSpec;
pub use seed::{Seed, SeedOrganization, SeedUser};
pub use server::{FakeCoderd, FakeConfig};
pub use state::{Entitlement, Organization, ProvisionerKey, UserRole, UserStatus, UserView};
pub use version::CoderdVersion;
