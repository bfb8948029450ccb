//! Typed coderd errors and the pure mapping from an HTTP answer to one.
use std::time::Duration;

use serde::Deserialize;

/// Why a coderd call failed. No variant ever carries the session token or key plaintext:
/// messages come from coderd's error body and are scrubbed of the token before use.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CoderdError {
    #[error("coderd rate limited the request{}", retry_after_suffix(.retry_after))]
    RateLimited { retry_after: Option<Duration> },
    #[error("coderd: not found: {message}")]
    NotFound { message: String },
    #[error("coderd rejected the session token (401): {message}")]
    Unauthorized { message: String },
    /// A 401 to a request authenticated by a provisioner daemon key (a key's own lookup): the
    /// key is not (or no longer) valid; the session token was not sent.
    #[error("coderd refused the provisioner daemon key (401): {message}")]
    DaemonKeyRefused { message: String },
    #[error("coderd refused the request (403): {message}")]
    Forbidden { message: String },
    #[error("coderd reported a conflict (409): {message}")]
    Conflict { message: String },
    #[error("coderd answered {status}: {message}")]
    Api { status: u16, message: String },
    #[error("coderd did not answer within the request timeout")]
    Timeout,
    #[error("coderd is unreachable: {detail}")]
    Unreachable { detail: String },
    #[error("coderd sent an unexpected answer: {detail}")]
    InvalidResponse { detail: String },
    /// The client could not be built (bad base URL, token not usable as a header value).
    #[error("invalid coderd client configuration: {detail}")]
    InvalidConfiguration { detail: String },
    /// The request was not sent: this replica may no longer change coderd (its leadership
    /// fence said why).
    #[error("request not sent: {detail}")]
    Fenced { detail: String },
}

fn retry_after_suffix(retry_after: &Option<Duration>) -> String {
    retry_after
        .map(|d| format!(" (retry after {}s)", d.as_secs()))
        .unwrap_or_default()
}

impl CoderdError {
    /// The same error with `secret` replaced by `<redacted>` in its text (e.g. a key that was
    /// part of the request's URL, which transport errors quote).
    pub fn redacted(self, secret: &str) -> Self {
        if secret.is_empty() {
            return self;
        }
        let scrub = |text: String| text.replace(secret, "<redacted>");
        match self {
            Self::NotFound { message } => Self::NotFound {
                message: scrub(message),
            },
            Self::Unauthorized { message } => Self::Unauthorized {
                message: scrub(message),
            },
            Self::DaemonKeyRefused { message } => Self::DaemonKeyRefused {
                message: scrub(message),
            },
            Self::Forbidden { message } => Self::Forbidden {
                message: scrub(message),
            },
            Self::Conflict { message } => Self::Conflict {
                message: scrub(message),
            },
            Self::Api { status, message } => Self::Api {
                status,
                message: scrub(message),
            },
            Self::Unreachable { detail } => Self::Unreachable {
                detail: scrub(detail),
            },
            Self::InvalidResponse { detail } => Self::InvalidResponse {
                detail: scrub(detail),
            },
            Self::InvalidConfiguration { detail } => Self::InvalidConfiguration {
                detail: scrub(detail),
            },
            other @ (Self::RateLimited { .. } | Self::Timeout | Self::Fenced { .. }) => other,
        }
    }

    pub fn is_rate_limited(&self) -> bool {
        matches!(self, Self::RateLimited { .. })
    }

    /// A failure that says nothing about the request itself, so the same request may succeed
    /// later: a 429, a 5xx, a timeout, an unreachable coderd.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::RateLimited { .. } | Self::Timeout | Self::Unreachable { .. } => true,
            Self::Api { status, .. } => *status >= 500,
            _ => false,
        }
    }
}

/// `codersdk.Response`, the body of every JSON error.
#[derive(Deserialize)]
struct ErrorBody {
    #[serde(default)]
    message: String,
    #[serde(default)]
    detail: String,
}

/// Longest body excerpt kept in an error message when the body is not a coderd error document.
const MAX_EXCERPT: usize = 200;

/// The human-readable message of an error body: `message: detail` from the FIRST JSON value
/// (coderd before PR #13629 wrote two JSON objects into one organization 404, coderd-api.md §2.3), or a
/// short excerpt of a non-JSON body (e.g. the plain-text 428). `secret` is replaced by
/// `<redacted>` wherever it appears.
pub(crate) fn error_message(body: &[u8], secret: &str) -> String {
    let first = serde_json::Deserializer::from_slice(body)
        .into_iter::<ErrorBody>()
        .next();
    let message = match first {
        Some(Ok(parsed)) if !parsed.message.is_empty() => {
            if parsed.detail.is_empty() {
                parsed.message
            } else {
                format!("{}: {}", parsed.message, parsed.detail)
            }
        }
        _ => {
            let text = String::from_utf8_lossy(body);
            let trimmed = text.trim();
            match trimmed.char_indices().nth(MAX_EXCERPT) {
                Some((cut, _)) => format!("{}…", &trimmed[..cut]),
                None if trimmed.is_empty() => "(empty body)".to_owned(),
                None => trimmed.to_owned(),
            }
        }
    };
    if secret.is_empty() {
        message
    } else {
        message.replace(secret, "<redacted>")
    }
}

/// `Retry-After` in delta-seconds (what coderd's limiter sends); HTTP-date values are ignored.
pub(crate) fn parse_retry_after(value: Option<&str>) -> Option<Duration> {
    value?.trim().parse::<u64>().ok().map(Duration::from_secs)
}

/// Maps a non-success status to an error.
pub(crate) fn error_for_status(
    status: u16,
    retry_after: Option<&str>,
    body: &[u8],
    secret: &str,
) -> CoderdError {
    if status == 429 {
        return CoderdError::RateLimited {
            retry_after: parse_retry_after(retry_after),
        };
    }
    let message = error_message(body, secret);
    match status {
        401 => CoderdError::Unauthorized { message },
        403 => CoderdError::Forbidden { message },
        404 => CoderdError::NotFound { message },
        409 => CoderdError::Conflict { message },
        _ => CoderdError::Api { status, message },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    const TOKEN: &str = "abcdefghij-0123456789012345678901";

    #[rstest]
    #[case::first_of_two_json_objects(
        br#"{"message":"Resource not found or you do not have access to this resource"}{"message":"Organization \"x\" not found.","detail":"Provide either the organization id or name."}"#.as_slice(),
        "Resource not found or you do not have access to this resource"
    )]
    #[case::message_and_detail(
        br#"{"message":"You are signed out or your session has expired. Please sign in again to continue.","detail":"API key is invalid."}"#.as_slice(),
        "You are signed out or your session has expired. Please sign in again to continue.: API key is invalid."
    )]
    #[case::plain_text(b"\"X-Coder-Bypass-Ratelimit\" provided but user is not owner\n".as_slice(),
        "\"X-Coder-Bypass-Ratelimit\" provided but user is not owner")]
    #[case::empty(b"".as_slice(), "(empty body)")]
    #[case::json_without_message(br#"{"other":1}"#.as_slice(), r#"{"other":1}"#)]
    fn messages(#[case] body: &[u8], #[case] expected: &str) {
        assert_eq!(error_message(body, TOKEN), expected);
    }

    #[test]
    fn long_bodies_are_cut_and_the_token_is_scrubbed() {
        let body = format!("{{\"message\":\"bad token {TOKEN}\"}}");
        assert_eq!(
            error_message(body.as_bytes(), TOKEN),
            "bad token <redacted>"
        );
        let long = "x".repeat(1000);
        assert_eq!(
            error_message(long.as_bytes(), TOKEN).chars().count(),
            MAX_EXCERPT + 1
        );
    }

    #[rstest]
    #[case(429, Some("60"), CoderdError::RateLimited { retry_after: Some(Duration::from_secs(60)) })]
    #[case(429, Some("Wed, 21 Oct 2015 07:28:00 GMT"), CoderdError::RateLimited { retry_after: None })]
    #[case(429, None, CoderdError::RateLimited { retry_after: None })]
    #[case(401, None, CoderdError::Unauthorized { message: "m".into() })]
    #[case(403, None, CoderdError::Forbidden { message: "m".into() })]
    #[case(404, None, CoderdError::NotFound { message: "m".into() })]
    #[case(409, None, CoderdError::Conflict { message: "m".into() })]
    #[case(500, None, CoderdError::Api { status: 500, message: "m".into() })]
    fn statuses(
        #[case] status: u16,
        #[case] retry_after: Option<&str>,
        #[case] expected: CoderdError,
    ) {
        assert_eq!(
            error_for_status(status, retry_after, br#"{"message":"m"}"#, TOKEN),
            expected
        );
    }

    #[rstest]
    #[case::rate_limited(CoderdError::RateLimited { retry_after: None }, true)]
    #[case::server_error(CoderdError::Api { status: 503, message: "m".into() }, true)]
    #[case::timeout(CoderdError::Timeout, true)]
    #[case::unreachable(CoderdError::Unreachable { detail: "d".into() }, true)]
    #[case::client_error(CoderdError::Api { status: 400, message: "m".into() }, false)]
    #[case::unauthorized(CoderdError::Unauthorized { message: "m".into() }, false)]
    #[case::not_found(CoderdError::NotFound { message: "m".into() }, false)]
    #[case::invalid_answer(CoderdError::InvalidResponse { detail: "d".into() }, false)]
    fn retryable_failures(#[case] error: CoderdError, #[case] retryable: bool) {
        assert_eq!(error.is_retryable(), retryable);
    }

    #[test]
    fn display_mentions_retry_after() {
        let error = CoderdError::RateLimited {
            retry_after: Some(Duration::from_secs(60)),
        };
        assert_eq!(
            error.to_string(),
            "coderd rate limited the request (retry after 60s)"
        );
    }
}
