//! The contract's checks that need no cluster: the [`oracle`] (what a settled CR's children and
//! keys must be), the shape of every status ([`status_shape`]), the checks over coderd's journal,
//! and the [`recorder`], a watch that applies them to every version of every CR in a namespace.
//! [`crate::scenario_checks`] runs them against a scenario's cluster.
//!
//! Every finding ends with the rule it breaks in parentheses, so the report blames that rule.
pub mod oracle;
pub mod recorder;
pub mod status_shape;

use std::collections::BTreeSet;

use fake_coderd::JournalEntry;

/// The field managers of an object the suite just wrote, to tell later writers apart.
pub fn managers_of(meta: &kube::api::ObjectMeta) -> BTreeSet<String> {
    meta.managed_fields
        .iter()
        .flatten()
        .filter_map(|entry| entry.manager.clone())
        .collect()
}

/// Checks over every coderd request of the scenario, whatever its steps (pure).
///
/// R-KEY-23: a key create or delete and an entitlements call carry `X-Coder-Bypass-Ratelimit:
/// true`, unless they repeat a request coderd answered 428 (the fallback the rule allows).
/// A list of an organization's keys answered with a failure other than 429 (a 5xx, a reset):
/// in a rotation, the old key's deletion may then be skipped (R-KEY-16, best-effort; a 429
/// stops the pass instead, D-9).
pub fn is_failed_key_list(entry: &JournalEntry) -> bool {
    entry.method == "GET"
        && entry.route.as_deref() == Some("/api/v2/organizations/{organization}/provisionerkeys")
        && !(200..300).contains(&entry.status)
        && entry.status != 429
}

pub fn journal_findings(journal: &[JournalEntry]) -> Vec<String> {
    let mut found = BTreeSet::new();
    for (n, entry) in journal.iter().enumerate() {
        let route = entry.route.as_deref().unwrap_or_default();
        let needs_bypass = matches!(
            (entry.method.as_str(), route),
            (
                "POST",
                "/api/v2/organizations/{organization}/provisionerkeys"
            ) | (
                "DELETE",
                "/api/v2/organizations/{organization}/provisionerkeys/{provisionerkey}"
            ) | ("GET", "/api/v2/entitlements")
        );
        let repeats_a_428 = journal[..n]
            .iter()
            .rev()
            .find(|e| e.method == entry.method && e.path == entry.path)
            .is_some_and(|e| e.status == 428);
        if needs_bypass && entry.bypass_ratelimit.as_deref() != Some("true") && !repeats_a_428 {
            found.insert(format!(
                "{} {route} was sent without X-Coder-Bypass-Ratelimit: true (R-KEY-23)",
                entry.method
            ));
        }
    }
    found.into_iter().collect()
}

/// R-DEL-10: once the scenario's only CR, settled (no pass under way), is being deleted, the
/// clean-up asks coderd for no entitlements and creates no key: nothing of that answered after
/// the suite's watch saw the deletion (a request of the live CR's last pass ends before).
pub fn after_deletion_findings(
    journal: &[JournalEntry],
    deleted_at: jiff::Timestamp,
) -> Vec<String> {
    let mut found = BTreeSet::new();
    for entry in journal {
        let Ok(at) = entry.at.parse::<jiff::Timestamp>() else {
            continue;
        };
        let route = entry.route.as_deref().unwrap_or_default();
        let forbidden = matches!(
            (entry.method.as_str(), route),
            ("GET", "/api/v2/entitlements")
                | (
                    "POST",
                    "/api/v2/organizations/{organization}/provisionerkeys"
                )
        );
        if at > deleted_at && forbidden {
            found.insert(format!(
                "the clean-up of the deleted CoderProvisioner sent {} {route} (R-DEL-10)",
                entry.method
            ));
        }
    }
    found.into_iter().collect()
}

#[cfg(test)]
mod journal_tests {
    use super::*;

    fn entry(
        method: &str,
        route: &str,
        status: u16,
        bypass: Option<&str>,
        at: &str,
    ) -> JournalEntry {
        serde_json::from_value(serde_json::json!({
            "seq": 1, "at": at, "method": method, "path": route.replace("{organization}", "o").replace("{provisionerkey}", "k"),
            "route": route, "status": status, "session_token_fingerprint": null, "daemon_key_fingerprint": null,
            "bypass_ratelimit": bypass, "body": null,
        }))
        .expect("entry")
    }

    const CREATE: &str = "/api/v2/organizations/{organization}/provisionerkeys";
    const ENTITLEMENTS: &str = "/api/v2/entitlements";

    #[test]
    fn key_and_entitlement_requests_carry_the_bypass_header() {
        let at = "2026-12-02T00:00:00Z";
        assert!(journal_findings(&[entry("POST", CREATE, 201, Some("true"), at)]).is_empty());
        assert_eq!(
            journal_findings(&[entry("GET", ENTITLEMENTS, 200, None, at)]).len(),
            1
        );
        let fallback = [
            entry("POST", CREATE, 428, Some("true"), at),
            entry("POST", CREATE, 201, None, at),
        ];
        assert!(journal_findings(&fallback).is_empty());
        assert!(
            journal_findings(&[entry(
                "GET",
                "/api/v2/organizations/{organization}",
                200,
                None,
                at
            )])
            .is_empty()
        );
    }

    #[test]
    fn a_clean_up_asks_for_no_entitlements() {
        let deleted: jiff::Timestamp = "2026-12-02T00:00:10Z".parse().expect("time");
        let journal = [
            entry(
                "GET",
                ENTITLEMENTS,
                200,
                Some("true"),
                "2026-12-02T00:00:05Z",
            ),
            entry(
                "GET",
                ENTITLEMENTS,
                200,
                Some("true"),
                "2026-12-02T00:00:09.200Z",
            ),
        ];
        assert!(after_deletion_findings(&journal, deleted).is_empty());
        let late = [entry(
            "GET",
            ENTITLEMENTS,
            200,
            Some("true"),
            "2026-12-02T00:00:12Z",
        )];
        assert_eq!(after_deletion_findings(&late, deleted).len(), 1);
    }
}
