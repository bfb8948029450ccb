//! What the fake was asked: one entry per coderd request (admin requests are not journaled), with
//! secrets replaced by fingerprints or `<redacted>`, so scenarios can assert exactly which calls happened.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

pub const REDACTED: &str = "<redacted>";
/// Request body fields that may carry a secret, at any depth.
const SECRET_FIELDS: [&str; 6] = ["key", "token", "secret", "password", "psk", "session_token"];

/// `"sha256:"` + the first 12 hex digits of the secret's SHA-256: enough to tell secrets apart, not to recover one.
pub fn fingerprint(secret: &str) -> String {
    let digest = hex::encode(Sha256::digest(secret.as_bytes()));
    format!("sha256:{}", &digest[..12])
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct JournalEntry {
    pub seq: u64,
    /// RFC 3339 time the request was answered.
    pub at: String,
    pub method: String,
    /// Path and query, with secrets redacted (the daemon key in `/api/v2/provisionerkeys/{key}`, a
    /// `coder_session_token` query parameter).
    pub path: String,
    /// Route template, e.g. `/api/v2/organizations/{organization}/provisionerkeys`; `None` for unknown routes.
    pub route: Option<String>,
    /// Status answered; 0 when the connection was reset instead (fault kind `reset`).
    pub status: u16,
    pub session_token_fingerprint: Option<String>,
    pub daemon_key_fingerprint: Option<String>,
    /// Raw value of `X-Coder-Bypass-Ratelimit`, if sent.
    pub bypass_ratelimit: Option<String>,
    /// Request body (JSON) with secret fields redacted at any depth.
    pub body: Option<Value>,
    /// Id of the provisioner key that authenticated a daemon request (§2.9), when one did.
    #[serde(default)]
    pub authenticated_key_id: Option<String>,
    /// Organization of the key the request's daemon key header names, when coderd holds that key,
    /// whatever the answer (a fault's too): whose request a key-authenticated one is.
    #[serde(default)]
    pub key_organization_id: Option<String>,
    /// Sent by an observer (header `Fake-Coderd-Observer`): a test's own check, which no fault
    /// applies to, not a request of the client under test.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub observer: bool,
}

/// Queries over journal entries (implemented for slices, so `Vec<JournalEntry>` has them too).
pub trait JournalQuery {
    /// Number of requests with this method and route template.
    fn count(&self, method: &str, route: &str) -> usize;
    /// Entries for one route template, any method.
    fn for_route(&self, route: &str) -> Vec<JournalEntry>;
    /// Number of requests per (method, route template); unknown routes are counted under `"-"`.
    fn counts(&self) -> BTreeMap<(String, String), usize>;
}

impl JournalQuery for [JournalEntry] {
    fn count(&self, method: &str, route: &str) -> usize {
        self.iter()
            .filter(|entry| {
                entry.method.eq_ignore_ascii_case(method) && entry.route.as_deref() == Some(route)
            })
            .count()
    }

    fn for_route(&self, route: &str) -> Vec<JournalEntry> {
        self.iter()
            .filter(|entry| entry.route.as_deref() == Some(route))
            .cloned()
            .collect()
    }

    fn counts(&self) -> BTreeMap<(String, String), usize> {
        let mut counts = BTreeMap::new();
        for entry in self {
            let route = entry.route.clone().unwrap_or_else(|| "-".to_string());
            *counts.entry((entry.method.clone(), route)).or_insert(0) += 1;
        }
        counts
    }
}

/// Replaces the value of every secret-carrying field, in nested objects and in arrays too (a body
/// need not be an object); a non-JSON body is summarised by its size.
pub fn redact_body(body: &[u8]) -> Option<Value> {
    if body.is_empty() {
        return None;
    }
    let Ok(mut value) = serde_json::from_slice::<Value>(body) else {
        return Some(Value::String(format!(
            "<non-JSON body, {} bytes>",
            body.len()
        )));
    };
    redact_secrets(&mut value);
    Some(value)
}

fn redact_secrets(value: &mut Value) {
    match value {
        Value::Object(fields) => {
            for (name, field) in fields.iter_mut() {
                if SECRET_FIELDS
                    .iter()
                    .any(|secret| secret.eq_ignore_ascii_case(name))
                {
                    *field = Value::String(REDACTED.to_string());
                } else {
                    redact_secrets(field);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact_secrets),
        _ => {}
    }
}

/// The entries recorded so far, in order.
#[derive(Default, Debug)]
pub struct Journal {
    entries: Vec<JournalEntry>,
    next_seq: u64,
}

impl Journal {
    /// Appends an entry, assigning its sequence number and time.
    pub fn record(&mut self, mut entry: JournalEntry) {
        self.next_seq += 1;
        entry.seq = self.next_seq;
        entry.at = jiff::Timestamp::now().to_string();
        self.entries.push(entry);
    }

    /// The sequence number of the latest entry recorded (0 before the first), kept by a clear.
    pub fn last_seq(&self) -> u64 {
        self.next_seq
    }

    pub fn entries(&self) -> &[JournalEntry] {
        &self.entries
    }

    pub fn clear(&mut self) {
        self.entries.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;
    use serde_json::json;

    #[rstest]
    #[case(br#"{"key":"s3cret","Token":"t"}"#.as_slice(), Some(json!({"key":REDACTED,"Token":REDACTED})))]
    #[case(br#"[{"name":"a","key":"s3cret"},"plain"]"#.as_slice(), Some(json!([{"name":"a","key":REDACTED},"plain"])))]
    #[case(br#"{"tags":{"psk":"p"},"list":[{"Password":"x","n":1}]}"#.as_slice(), Some(json!({"tags":{"psk":REDACTED},"list":[{"Password":REDACTED,"n":1}]})))]
    #[case(br#"{"name":"k","tags":{"key":"v"}}"#.as_slice(), Some(json!({"name":"k","tags":{"key":REDACTED}})))]
    #[case(b"not json".as_slice(), Some(json!("<non-JSON body, 8 bytes>")))]
    #[case(b"".as_slice(), None)]
    fn bodies_are_redacted(#[case] body: &[u8], #[case] expected: Option<Value>) {
        assert_eq!(redact_body(body), expected);
    }

    #[test]
    fn fingerprint_is_stable_short_and_hides_the_secret() {
        let print = fingerprint("abcdefghij-0123456789012345678901");
        assert_eq!(print, fingerprint("abcdefghij-0123456789012345678901"));
        assert_eq!(print.len(), "sha256:".len() + 12);
        assert!(!print.contains("abcdefghij"));
        assert_ne!(print, fingerprint("abcdefghij-0123456789012345678902"));
    }
}
