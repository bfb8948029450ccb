//! coderd-api.md §1.7: the API rate limiter and its owner-only bypass header.
//!
//! Like coderd (`coderd/httpmw/ratelimit.go` over go-chi/httprate), the fake counts every
//! `/api/v2` request by default: 512 per minute per caller and endpoint (path), with httprate's
//! sliding-window estimate, `X-Ratelimit-Limit`/`-Remaining`/`-Reset` on every answer and
//! `Retry-After` on a 429. As v2.31.0 does (coder/coder PR #22049), callers are keyed by user id
//! when a valid session token is presented, else as one anonymous caller (coderd keys them by
//! client IP, which wiremock does not expose), and the bypass header lets an authenticated owner
//! through, is answered 428 text/plain for any other authenticated user, and is ignored for
//! unauthenticated callers. As v2.30.0 does (the limiter ran before the API key was known, coder/coder
//! issue #20857), every caller is keyed by client IP, all callers being one IP here, and the bypass
//! header is never looked at. The admin API can change the window, script the next
//! answers, or switch counting off (as coderd's `--api-rate-limit -1`, which also ignores the
//! bypass header).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::api::{ApiError, Reply};

pub const BYPASS_HEADER: &str = "X-Coder-Bypass-Ratelimit";
/// coderd's defaults: `--api-rate-limit 512` per `time.Minute`.
pub const DEFAULT_LIMIT: u32 = 512;
pub const DEFAULT_WINDOW_SECS: u64 = 60;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RateLimitSpec {
    /// The next `count` requests (optionally only this method and/or route template) are answered
    /// 429, on top of the counting in force.
    NextRequests {
        #[serde(default)]
        method: Option<String>,
        #[serde(default)]
        route: Option<String>,
        count: u32,
    },
    /// At most `limit` requests per `window_secs` per caller and path (httprate's sliding window);
    /// replaces the counting in force and any scripted answers.
    Window { limit: u32, window_secs: u64 },
    /// No counting, no headers, and the bypass header is not looked at (coderd with a negative
    /// `--api-rate-limit`).
    Off,
}

/// What the limiter decided for one request.
#[derive(Debug, PartialEq)]
pub enum Verdict {
    /// Go on; put these `X-Ratelimit-*` headers on the answer.
    Allow(Vec<(String, String)>),
    Limited(Reply),
    BypassRefused(Reply),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Window {
    limit: u32,
    window_secs: u64,
}

const DEFAULT_WINDOW: Window = Window {
    limit: DEFAULT_LIMIT,
    window_secs: DEFAULT_WINDOW_SECS,
};

#[derive(Clone, Debug, PartialEq, Eq)]
struct Script {
    method: Option<String>,
    route: Option<String>,
    count: u32,
}

/// Request counts of one key: the current fixed window (by its start) and the one before.
#[derive(Clone, Copy, Debug, Default)]
struct Counts {
    window_start_ms: u64,
    current: u32,
    previous: u32,
}

#[derive(Debug)]
pub struct RateLimiter {
    /// What `set(None)` and a reset return to: coderd's default unless configured otherwise.
    base: Option<Window>,
    /// Keyed by the session token's user, with the owner bypass (v2.31.0); else by client IP.
    by_user: bool,
    window: Option<Window>,
    script: Option<Script>,
    /// By a fingerprint of (caller, path): the paths may hold daemon keys.
    counts: HashMap<String, Counts>,
    bypasses: u64,
}

impl Default for RateLimiter {
    /// coderd's default: counting on at 512 per minute.
    fn default() -> Self {
        Self {
            base: Some(DEFAULT_WINDOW),
            by_user: true,
            window: Some(DEFAULT_WINDOW),
            script: None,
            counts: HashMap::new(),
            bypasses: 0,
        }
    }
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

fn headers(limit: u32, remaining: i64, reset_unix: u64) -> Vec<(String, String)> {
    vec![
        ("X-Ratelimit-Limit".to_string(), limit.to_string()),
        ("X-Ratelimit-Remaining".to_string(), remaining.to_string()),
        ("X-Ratelimit-Reset".to_string(), reset_unix.to_string()),
    ]
}

fn too_many_requests(window: Window, remaining: i64, reset_unix: u64) -> Reply {
    let message = format!(
        "You've been rate limited for sending more than {} requests in {}.",
        window.limit,
        go_duration(window.window_secs)
    );
    let mut reply = Reply::from(ApiError::new(429, message));
    reply
        .headers
        .extend(headers(window.limit, remaining, reset_unix));
    reply.with_header("Retry-After", window.window_secs.to_string())
}

/// An injected 429 as coderd's limiter answers it at its default window: its message, the
/// `X-Ratelimit-*` headers and `Retry-After: 60` (an operator that waits for `Retry-After`
/// instead of its own backoff shows here as it would against coderd).
pub(crate) fn injected_too_many_requests() -> Reply {
    let reset_unix = unix_now_ms() / 1000 + DEFAULT_WINDOW.window_secs;
    too_many_requests(DEFAULT_WINDOW, 0, reset_unix)
}

/// Milliseconds since the Unix epoch, the limiter's clock.
pub fn unix_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The request facts the limiter looks at.
pub struct Caller<'a> {
    pub method: &'a str,
    pub route: Option<&'a str>,
    /// The decoded request path (httprate's `KeyByEndpoint`); may hold a daemon key.
    pub path: &'a str,
    /// User id of a valid session token, `None` for anonymous callers (keyed by IP in coderd).
    pub user_id: Option<&'a str>,
    pub is_owner: bool,
    pub bypass_header: Option<&'a str>,
}

impl RateLimiter {
    /// A limiter like coderd's `--api-rate-limit` per minute: 0 or less switches counting off.
    /// `by_user`: keyed by the session token's user, with the owner bypass (v2.31.0), else by
    /// client IP (v2.30.0).
    pub fn per_minute(limit: i64, by_user: bool) -> Self {
        let base = u32::try_from(limit)
            .ok()
            .filter(|limit| *limit > 0)
            .map(|limit| Window {
                limit,
                window_secs: DEFAULT_WINDOW_SECS,
            });
        Self {
            base,
            by_user,
            window: base,
            ..Self::default()
        }
    }

    /// `None` restores the base counting (coderd's default, 512 per minute, unless the fake was
    /// started with another `api_rate_limit`) and drops scripted answers.
    pub fn set(&mut self, spec: Option<RateLimitSpec>) {
        match spec {
            None => {
                self.window = self.base;
                self.script = None;
                self.counts.clear();
            }
            Some(RateLimitSpec::Off) => {
                self.window = None;
                self.script = None;
                self.counts.clear();
            }
            Some(RateLimitSpec::Window { limit, window_secs }) => {
                self.window = Some(Window {
                    limit,
                    window_secs: window_secs.max(1),
                });
                self.script = None;
                self.counts.clear();
            }
            Some(RateLimitSpec::NextRequests {
                method,
                route,
                count,
            }) => {
                self.script = Some(Script {
                    method,
                    route,
                    count,
                });
            }
        }
    }

    /// The counting in force: `Window`, or `Off`.
    pub fn counting(&self) -> RateLimitSpec {
        match self.window {
            Some(window) => RateLimitSpec::Window {
                limit: window.limit,
                window_secs: window.window_secs,
            },
            None => RateLimitSpec::Off,
        }
    }

    /// httprate's handler: key function (bypass rule), then the sliding-window estimate
    /// `previous × (window − elapsed) / window + current`, rounded, against the limit.
    pub fn check(&mut self, caller: &Caller<'_>, now_ms: u64) -> Verdict {
        let scripted = self.script.as_ref().is_some_and(|script| {
            script.count > 0
                && script
                    .method
                    .as_deref()
                    .is_none_or(|m| m.eq_ignore_ascii_case(caller.method))
                && (script.route.is_none() || script.route.as_deref() == caller.route)
        });
        if self.window.is_none() && !scripted {
            return Verdict::Allow(Vec::new());
        }
        let window = self.window.unwrap_or(DEFAULT_WINDOW);
        let user_id = caller.user_id.filter(|_| self.by_user);
        let bypass = user_id.is_some() && caller.bypass_header.is_some_and(is_true);
        let key = match (bypass, caller.is_owner) {
            (true, false) => {
                return Verdict::BypassRefused(Reply::text(
                    428,
                    format!("\"{BYPASS_HEADER}\" provided but user is not owner\n"),
                ));
            }
            // coderd gives an owner's bypass a random key each time: a fresh, unlimited budget.
            (true, true) => {
                self.bypasses += 1;
                format!("bypass|{}", self.bypasses)
            }
            (false, _) => crate::journal::fingerprint(&format!(
                "{}|{}",
                user_id.unwrap_or("anonymous"),
                caller.path
            )),
        };
        let window_ms = window.window_secs.saturating_mul(1000);
        let window_start_ms = now_ms - now_ms % window_ms;
        let reset_unix = (window_start_ms + window_ms) / 1000;
        if scripted && !bypass {
            if let Some(script) = &mut self.script {
                script.count -= 1;
            }
            return Verdict::Limited(too_many_requests(window, 0, reset_unix));
        }
        if self.window.is_none() {
            return Verdict::Allow(Vec::new());
        }
        let counts = self.counts.entry(key.clone()).or_default();
        if counts.window_start_ms != window_start_ms {
            counts.previous = if counts.window_start_ms + window_ms == window_start_ms {
                counts.current
            } else {
                0
            };
            counts.current = 0;
            counts.window_start_ms = window_start_ms;
        }
        let elapsed = (now_ms - window_start_ms) as f64;
        let rate = (f64::from(counts.previous) * (window_ms as f64 - elapsed) / window_ms as f64
            + f64::from(counts.current))
        .round() as i64;
        let limit = i64::from(window.limit);
        if rate + 1 > limit {
            return Verdict::Limited(too_many_requests(window, limit - rate, reset_unix));
        }
        counts.current += 1;
        if bypass {
            // One use only: do not keep a counter per bypassed request.
            self.counts.remove(&key);
        }
        Verdict::Allow(headers(window.limit, limit - rate - 1, reset_unix))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    const T0: u64 = 1_800_000_000_000; // a whole minute, in ms

    fn caller<'a>(bypass: Option<&'a str>, user: Option<bool>) -> Caller<'a> {
        Caller {
            method: "GET",
            route: Some("/api/v2/buildinfo"),
            path: "/api/v2/buildinfo",
            user_id: user.map(|owner| if owner { "owner-id" } else { "member-id" }),
            is_owner: user == Some(true),
            bypass_header: bypass,
        }
    }

    fn outcome(verdict: &Verdict) -> &'static str {
        match verdict {
            Verdict::Allow(_) => "allow",
            Verdict::Limited(reply) => {
                assert_eq!(reply.status, 429);
                "429"
            }
            Verdict::BypassRefused(reply) => {
                assert_eq!(reply.status, 428);
                "428"
            }
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
    #[case(Some("true"), Some(true), "allow")]
    #[case(Some("1"), Some(false), "428")]
    #[case(Some("true"), None, "429")] // unauthenticated: the header is ignored
    #[case(Some("false"), Some(false), "429")]
    #[case(Some("yes"), Some(true), "429")]
    #[case(None, Some(true), "429")]
    fn bypass_header_rules(
        #[case] bypass: Option<&str>,
        #[case] user: Option<bool>,
        #[case] expected: &str,
    ) {
        let mut limiter = RateLimiter::default();
        limiter.set(Some(RateLimitSpec::NextRequests {
            method: None,
            route: None,
            count: 1,
        }));
        assert_eq!(outcome(&limiter.check(&caller(bypass, user), T0)), expected);
    }

    #[test]
    fn off_ignores_the_bypass_header_and_sets_no_headers() {
        let mut limiter = RateLimiter::default();
        limiter.set(Some(RateLimitSpec::Off));
        assert_eq!(
            limiter.check(&caller(Some("true"), Some(false)), T0),
            Verdict::Allow(Vec::new())
        );
    }

    #[test]
    fn default_counts_512_per_minute_with_headers() {
        let mut limiter = RateLimiter::default();
        let who = caller(None, Some(false));
        let Verdict::Allow(first) = limiter.check(&who, T0) else {
            panic!("first request allowed");
        };
        assert_eq!(
            first,
            headers(512, 511, T0 / 1000 + 60),
            "limit, remaining, reset"
        );
        for _ in 1..512 {
            assert_eq!(outcome(&limiter.check(&who, T0 + 1)), "allow");
        }
        let Verdict::Limited(reply) = limiter.check(&who, T0 + 2) else {
            panic!("513th request limited");
        };
        assert!(
            reply
                .headers
                .contains(&("Retry-After".to_string(), "60".to_string()))
        );
        assert!(
            reply
                .headers
                .contains(&("X-Ratelimit-Remaining".to_string(), "0".to_string()))
        );
        let owner = caller(Some("true"), Some(true));
        let Verdict::Allow(bypassed) = limiter.check(&owner, T0 + 3) else {
            panic!("owner bypasses");
        };
        assert_eq!(bypassed, headers(512, 511, T0 / 1000 + 60));
    }

    #[test]
    fn window_slides_over_the_previous_window() {
        let mut limiter = RateLimiter::default();
        limiter.set(Some(RateLimitSpec::Window {
            limit: 2,
            window_secs: 10,
        }));
        let who = caller(None, None);
        assert_eq!(outcome(&limiter.check(&who, T0)), "allow");
        assert_eq!(outcome(&limiter.check(&who, T0)), "allow");
        assert_eq!(outcome(&limiter.check(&who, T0 + 9_000)), "429");
        // Next window, 1 s in: 2 × 0.9 = 1.8, rounds to 2: still limited.
        assert_eq!(outcome(&limiter.check(&who, T0 + 11_000)), "429");
        // 6 s in: 2 × 0.4 = 0.8, rounds to 1: one more request fits.
        assert_eq!(outcome(&limiter.check(&who, T0 + 16_000)), "allow");
        assert_eq!(outcome(&limiter.check(&who, T0 + 16_000)), "429");
        assert_eq!(outcome(&limiter.check(&who, T0 + 30_000)), "allow");
    }
}
