//! coderd-api.md §1.7: the API rate limiter and its owner-only bypass header.
//!
//! The real limiter is always on (512/min by default), which a test suite cannot afford to trip by
//! accident, so the fake counts nothing until a `RateLimitSpec` is set. The bypass rule is always
//! applied, as with the real default: a true `X-Coder-Bypass-Ratelimit` from anyone but an
//! authenticated owner is answered 428 text/plain.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::api::{ApiError, Reply};

pub const BYPASS_HEADER: &str = "X-Coder-Bypass-Ratelimit";
/// Numbers used in the message of a scripted 429 (coderd's defaults).
const DEFAULT_LIMIT: u32 = 512;
const DEFAULT_WINDOW_SECS: u64 = 60;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RateLimitSpec {
    /// The next `count` requests (optionally only this method and/or route template) are answered 429.
    NextRequests {
        #[serde(default)]
        method: Option<String>,
        #[serde(default)]
        route: Option<String>,
        count: u32,
    },
    /// At most `limit` requests per `window_secs` sliding window, per caller (user, or anonymous) and
    /// path, like httprate's `KeyByEndpoint`.
    Window { limit: u32, window_secs: u64 },
}

/// What the limiter decided for one request.
#[derive(Debug, PartialEq)]
pub enum Verdict {
    Allow,
    Limited(Reply),
    BypassRefused(Reply),
}

#[derive(Default, Debug)]
pub struct RateLimiter {
    spec: Option<RateLimitSpec>,
    hits: HashMap<String, VecDeque<Instant>>,
}

/// Go's `strconv.ParseBool` true values.
pub fn is_true(value: &str) -> bool {
    matches!(value, "1" | "t" | "T" | "TRUE" | "true" | "True")
}

/// Go `time.Duration` formatting for whole seconds (`1m0s`, `10s`, `1h0m0s`).
pub fn go_duration(secs: u64) -> String {
    let (hours, minutes, seconds) = (secs / 3600, secs % 3600 / 60, secs % 60);
    match (hours, minutes) {
        (0, 0) => format!("{seconds}s"),
        (0, _) => format!("{minutes}m{seconds}s"),
        _ => format!("{hours}h{minutes}m{seconds}s"),
    }
}

fn too_many_requests(limit: u32, window_secs: u64, reset_unix: u64) -> Reply {
    let message = format!(
        "You've been rate limited for sending more than {limit} requests in {}.",
        go_duration(window_secs)
    );
    Reply::from(ApiError::new(429, message))
        .with_header("Retry-After", window_secs.to_string())
        .with_header("X-Ratelimit-Limit", limit.to_string())
        .with_header("X-Ratelimit-Remaining", "0")
        .with_header("X-Ratelimit-Reset", reset_unix.to_string())
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_secs())
        .unwrap_or(0)
}

/// The request facts the limiter looks at.
pub struct Caller<'a> {
    pub method: &'a str,
    pub route: Option<&'a str>,
    pub path: &'a str,
    /// User id of a valid session token, `None` for anonymous callers (keyed by IP in coderd).
    pub user_id: Option<&'a str>,
    pub is_owner: bool,
    pub bypass_header: Option<&'a str>,
}

impl RateLimiter {
    pub fn set(&mut self, spec: Option<RateLimitSpec>) {
        self.spec = spec;
        self.hits.clear();
    }

    pub fn spec(&self) -> Option<&RateLimitSpec> {
        self.spec.as_ref()
    }

    pub fn check(&mut self, caller: &Caller<'_>, now: Instant) -> Verdict {
        if caller.bypass_header.is_some_and(is_true) {
            if caller.is_owner {
                return Verdict::Allow;
            }
            return Verdict::BypassRefused(Reply::text(
                428,
                format!("\"{BYPASS_HEADER}\" provided but user is not owner\n"),
            ));
        }
        match &mut self.spec {
            None => Verdict::Allow,
            Some(RateLimitSpec::NextRequests {
                method,
                route,
                count,
            }) => {
                let method_matches = method
                    .as_deref()
                    .is_none_or(|m| m.eq_ignore_ascii_case(caller.method));
                let route_matches = route.is_none() || route.as_deref() == caller.route;
                if *count == 0 || !method_matches || !route_matches {
                    return Verdict::Allow;
                }
                *count -= 1;
                Verdict::Limited(too_many_requests(
                    DEFAULT_LIMIT,
                    DEFAULT_WINDOW_SECS,
                    unix_now() + DEFAULT_WINDOW_SECS,
                ))
            }
            Some(RateLimitSpec::Window { limit, window_secs }) => {
                let window = Duration::from_secs(*window_secs);
                let key = format!("{}|{}", caller.user_id.unwrap_or("anonymous"), caller.path);
                let hits = self.hits.entry(key).or_default();
                while hits
                    .front()
                    .is_some_and(|hit| now.duration_since(*hit) >= window)
                {
                    hits.pop_front();
                }
                if hits.len() >= *limit as usize {
                    let reset_in = hits
                        .front()
                        .map(|oldest| window.saturating_sub(now.duration_since(*oldest)));
                    let reset_unix =
                        unix_now() + reset_in.map(|d| d.as_secs()).unwrap_or(*window_secs);
                    return Verdict::Limited(too_many_requests(*limit, *window_secs, reset_unix));
                }
                hits.push_back(now);
                Verdict::Allow
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn caller<'a>(bypass: Option<&'a str>, is_owner: bool) -> Caller<'a> {
        Caller {
            method: "GET",
            route: Some("/api/v2/buildinfo"),
            path: "/api/v2/buildinfo",
            user_id: is_owner.then_some("owner-id"),
            is_owner,
            bypass_header: bypass,
        }
    }

    #[rstest]
    #[case(60, "1m0s")]
    #[case(10, "10s")]
    #[case(90, "1m30s")]
    #[case(3600, "1h0m0s")]
    fn durations_are_formatted_like_go(#[case] secs: u64, #[case] expected: &str) {
        assert_eq!(go_duration(secs), expected);
    }

    #[rstest]
    #[case(Some("true"), true, "allow")]
    #[case(Some("1"), false, "428")]
    #[case(Some("false"), false, "429")]
    #[case(Some("yes"), true, "429")]
    #[case(None, true, "429")]
    fn bypass_header_rules(
        #[case] bypass: Option<&str>,
        #[case] is_owner: bool,
        #[case] expected: &str,
    ) {
        let mut limiter = RateLimiter::default();
        limiter.set(Some(RateLimitSpec::NextRequests {
            method: None,
            route: None,
            count: 1,
        }));
        let verdict = limiter.check(&caller(bypass, is_owner), Instant::now());
        let outcome = match verdict {
            Verdict::Allow => "allow",
            Verdict::Limited(reply) => {
                assert_eq!(reply.status, 429);
                "429"
            }
            Verdict::BypassRefused(reply) => {
                assert_eq!(reply.status, 428);
                "428"
            }
        };
        assert_eq!(outcome, expected);
    }

    #[test]
    fn window_limits_then_recovers() {
        let mut limiter = RateLimiter::default();
        limiter.set(Some(RateLimitSpec::Window {
            limit: 2,
            window_secs: 10,
        }));
        let start = Instant::now();
        let who = caller(None, false);
        assert_eq!(limiter.check(&who, start), Verdict::Allow);
        assert_eq!(limiter.check(&who, start), Verdict::Allow);
        assert!(matches!(
            limiter.check(&who, start + Duration::from_secs(9)),
            Verdict::Limited(_)
        ));
        assert_eq!(
            limiter.check(&who, start + Duration::from_secs(10)),
            Verdict::Allow
        );
    }
}
