//! What the fake itself refuses or fails at: a control operation (Rust or admin API) it cannot
//! honour, a seed it cannot build, a listener it cannot start, close or reopen. What coderd answers
//! a client is `api::ApiError`, not this.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::api::ApiError;
use crate::session_token::TokenFormatError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("unknown organization {0:?}")]
    UnknownOrganization(String),
    #[error("organization name must not be empty")]
    EmptyOrganizationName,
    #[error("organization {name:?} (id {id}) already exists")]
    DuplicateOrganization { name: String, id: String },
    #[error("username must not be empty")]
    EmptyUsername,
    #[error("user {0:?} already exists")]
    DuplicateUser(String),
    #[error("unknown user {0:?}")]
    UnknownUser(String),
    #[error("session token of user {username:?} is not <10>-<22> shaped: {reason}")]
    MalformedUserToken {
        username: String,
        reason: TokenFormatError,
    },
    #[error("session token id of user {0:?} is already in use")]
    DuplicateTokenId(String),
    #[error("user {username:?}: unknown organization {organization:?}")]
    UnknownMembership {
        username: String,
        organization: String,
    },
    #[error("no key with id {id:?} in organization {organization:?}")]
    UnknownKey { organization: String, id: String },
    /// coderd's own rules refused a key created or deleted directly (name, duplicate, reserved).
    #[error("{}", .0.body.message)]
    KeyRefused(ApiError),

    #[error("unknown route template {0:?}; expected one of {templates:?}", templates = crate::routes::templates::TEMPLATES)]
    UnknownRouteTemplate(String),
    #[error("times must be at least 1 (omit it for a sticky fault)")]
    ZeroFaultTimes,
    #[error("key_organization widens a session-token scope; set session_token_fingerprint too")]
    KeyOrganizationWithoutFingerprint,
    #[error("fault status {0} is not an error status (400..=599)")]
    NotAnErrorStatus(u16),
    #[error("apply_then_fail needs an HTTP answer; use a status fault")]
    ResetCannotApplyThenFail,
    #[error("a legacy_organization_not_found fault needs a route with {{organization}}, not {0:?}")]
    NoOrganizationInRoute(String),
    #[error(
        "a legacy_organization_not_found fault changes only a body; apply_then_fail does not apply"
    )]
    LegacyBodyCannotApplyThenFail,

    #[error("operator token is not <10>-<22> shaped: {0}")]
    MalformedOperatorToken(TokenFormatError),
    #[error("invalid seed: {0}")]
    InvalidSeed(Box<Error>),
    #[error("reading seed file {path}")]
    ReadSeed {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("parsing {format} seed file {path}")]
    ParseSeed {
        path: PathBuf,
        format: &'static str,
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    #[error("binding {addr}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("reading the address of listener {addr}")]
    LocalAddress {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("{addr} still accepts connections after {waited:?}")]
    StillAccepting { addr: SocketAddr, waited: Duration },
    #[error("the fake coderd is shutting down")]
    ShuttingDown,
}
