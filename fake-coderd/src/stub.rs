//! `coder-stub`: a stand-in for `coder provisioner start` in provisioner pod images (contract D-8).
//! It does what the real CLI does before serving (coderd-api.md §2.9): refuse the flag combinations the
//! CLI refuses with a key, then fetch the key's details with `Coder-Provisioner-Daemon-Key`. On success
//! it logs "successfully connected to coderd" and stays up; any failure ends it with a clear message.

use std::net::SocketAddr;

use crate::routes::DAEMON_KEY_HEADER;
use crate::state::ProvisionerKey;

/// Env var (or `--ready-addr` flag) for the optional readiness endpoint.
pub const READINESS_ADDR_ENV: &str = "CODER_STUB_READY_ADDR";

/// Why the stub stops: the CLI's refusals (its own words) and a failed key fetch (§2.9 step 1).
/// None of them carries the key.
#[derive(Debug, thiserror::Error)]
pub enum StubError {
    #[error("usage: coder provisioner start [flags] (this is coder-stub, a test stand-in)")]
    Usage,
    #[error("no provisioner key: set CODER_PROVISIONER_DAEMON_KEY or --key")]
    NoKey,
    #[error("cannot provide both provisioner key --key and pre-shared key --psk")]
    KeyAndPsk,
    #[error("cannot provide --org value with --psk or --key flags")]
    OrganizationWithKey,
    #[error("cannot provide tags when using provisioner key")]
    TagsWithKey,
    #[error("no coderd URL: set CODER_URL or --url")]
    NoUrl,
    #[error("invalid readiness address {addr:?}: {reason}")]
    ReadinessAddress {
        addr: String,
        reason: std::net::AddrParseError,
    },
    /// Transport failures, stripped of their URL (it holds the key).
    #[error("unable to get provisioner key details: {coder_url}: {reason}")]
    Unreachable {
        coder_url: String,
        reason: reqwest::Error,
    },
    #[error("unable to get provisioner key details: {0}")]
    UnreadableAnswer(reqwest::Error),
    #[error("unable to get provisioner key details: {status}: {message}")]
    Refused {
        status: reqwest::StatusCode,
        message: String,
    },
    #[error("unable to get provisioner key details: unexpected answer: {0}")]
    UnexpectedAnswer(serde_json::Error),
}

/// What `coder provisioner start` was asked to do. The key is kept out of `Debug`.
pub struct Invocation {
    pub coder_url: String,
    pub key: String,
    pub readiness_addr: Option<SocketAddr>,
}

impl std::fmt::Debug for Invocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Invocation")
            .field("coder_url", &self.coder_url)
            .field("key", &"<redacted>")
            .field("readiness_addr", &self.readiness_addr)
            .finish()
    }
}

/// Value of `--name value` or `--name=value`.
fn flag_value(args: &[String], name: &str) -> Option<String> {
    let with_equals = format!("{name}=");
    args.iter().enumerate().find_map(|(index, arg)| {
        if arg == name {
            args.get(index + 1).cloned()
        } else {
            arg.strip_prefix(&with_equals).map(str::to_string)
        }
    })
}

/// Parses `provisioner start [flags]` plus the environment, with the CLI's refusals for key auth.
pub fn parse_invocation(
    args: &[String],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Invocation, StubError> {
    let set = |value: Option<String>| value.filter(|value| !value.is_empty());
    match args {
        [provisioner, start, ..] if provisioner == "provisioner" && start == "start" => {}
        _ => return Err(StubError::Usage),
    }
    let flags = &args[2..];
    let key = set(flag_value(flags, "--key"))
        .or_else(|| set(env("CODER_PROVISIONER_DAEMON_KEY")))
        .ok_or(StubError::NoKey)?;
    let psk = set(flag_value(flags, "--psk")).or_else(|| set(env("CODER_PROVISIONER_DAEMON_PSK")));
    if psk.is_some() {
        return Err(StubError::KeyAndPsk);
    }
    if set(flag_value(flags, "--org"))
        .or_else(|| set(env("CODER_ORGANIZATION")))
        .is_some()
    {
        return Err(StubError::OrganizationWithKey);
    }
    if set(flag_value(flags, "--tag"))
        .or_else(|| set(env("CODER_PROVISIONERD_TAGS")))
        .is_some()
    {
        return Err(StubError::TagsWithKey);
    }
    let coder_url = set(flag_value(flags, "--url"))
        .or_else(|| set(env("CODER_URL")))
        .ok_or(StubError::NoUrl)?;
    let readiness_addr = set(flag_value(flags, "--ready-addr"))
        .or_else(|| set(env(READINESS_ADDR_ENV)))
        .map(|addr| {
            addr.parse::<SocketAddr>()
                .map_err(|reason| StubError::ReadinessAddress { addr, reason })
        })
        .transpose()?;
    Ok(Invocation {
        coder_url: coder_url.trim_end_matches('/').to_string(),
        key,
        readiness_addr,
    })
}

/// §2.9 step 1. Errors never contain the key (reqwest errors are stripped of their URL).
pub async fn fetch_key(
    http: &reqwest::Client,
    invocation: &Invocation,
) -> Result<ProvisionerKey, StubError> {
    let encoded =
        percent_encoding::utf8_percent_encode(&invocation.key, percent_encoding::NON_ALPHANUMERIC);
    let url = format!("{}/api/v2/provisionerkeys/{encoded}", invocation.coder_url);
    let response = http
        .get(url)
        .header(DAEMON_KEY_HEADER, &invocation.key)
        .send()
        .await
        .map_err(|error| StubError::Unreachable {
            coder_url: invocation.coder_url.clone(),
            reason: error.without_url(),
        })?;
    let status = response.status();
    let body = response
        .text()
        .await
        .map_err(|error| StubError::UnreadableAnswer(error.without_url()))?;
    if status != reqwest::StatusCode::OK {
        return Err(StubError::Refused {
            status,
            message: crate::admin::error_message(&body),
        });
    }
    serde_json::from_str(&body).map_err(StubError::UnexpectedAnswer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_string).collect()
    }

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            pairs
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| value.to_string())
        }
    }

    const BASE: &[(&str, &str)] = &[
        ("CODER_URL", "http://coderd:3000/"),
        ("CODER_PROVISIONER_DAEMON_KEY", "k"),
    ];

    #[rstest]
    #[case("provisioner start", BASE, Ok("http://coderd:3000"))]
    #[case("provisioner start --verbose", BASE, Ok("http://coderd:3000"))]
    #[case("provisioner start --key=k --url http://x", &[], Ok("http://x"))]
    #[case("provisioner", BASE, Err("usage"))]
    #[case("provisioner start", &[("CODER_URL", "http://x")], Err("no provisioner key"))]
    #[case("provisioner start", &[("CODER_PROVISIONER_DAEMON_KEY", "k")], Err("no coderd URL"))]
    #[case(
        "provisioner start --org acme",
        BASE,
        Err("cannot provide --org value")
    )]
    #[case("provisioner start", &[("CODER_URL", "http://x"), ("CODER_PROVISIONER_DAEMON_KEY", "k"), ("CODER_ORGANIZATION", "acme")], Err("cannot provide --org value"))]
    #[case("provisioner start --tag a=b", BASE, Err("cannot provide tags"))]
    #[case("provisioner start --psk p", BASE, Err("cannot provide both"))]
    #[case(
        "provisioner start --ready-addr nope",
        BASE,
        Err("invalid readiness address")
    )]
    fn invocations(
        #[case] line: &str,
        #[case] env: &'static [(&'static str, &'static str)],
        #[case] expected: Result<&str, &str>,
    ) {
        let parsed = parse_invocation(&args(line), &env_of(env));
        match (parsed, expected) {
            (Ok(invocation), Ok(url)) => assert_eq!(invocation.coder_url, url),
            (Err(error), Err(prefix)) => assert!(error.to_string().starts_with(prefix), "{error}"),
            (other, expected) => panic!("{other:?} but expected {expected:?}"),
        }
    }

    #[test]
    fn debug_output_hides_the_key() {
        let invocation = parse_invocation(
            &args("provisioner start --key s3cr3t --url http://x"),
            &|_| None,
        )
        .expect("valid");
        assert!(!format!("{invocation:?}").contains("s3cr3t"));
    }
}
