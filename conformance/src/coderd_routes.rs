//! The coderd routes scenarios and checks name, by alias, as the fake's journal records them
//! (route templates).
use anyhow::anyhow;

/// The coderd routes scenarios name, as `(alias, route template)`; the journal records templates.
pub const ROUTES: &[(&str, &str)] = &[
    (
        "provisionerkeys",
        "/api/v2/organizations/{organization}/provisionerkeys",
    ),
    (
        "provisionerkey",
        "/api/v2/organizations/{organization}/provisionerkeys/{provisionerkey}",
    ),
    ("entitlements", "/api/v2/entitlements"),
    ("organization", "/api/v2/organizations/{organization}"),
    // A key's own record, fetched with the key (the operator learns a new key's id there).
    ("daemon-key", DAEMON_KEY_ROUTE),
];

/// A key's own record, fetched with the key itself.
const DAEMON_KEY_ROUTE: &str = "/api/v2/provisionerkeys/{provisionerkey}";

pub fn route_template(alias: &str) -> anyhow::Result<&'static str> {
    ROUTES
        .iter()
        .find(|(name, _)| *name == alias)
        .map(|(_, template)| *template)
        .ok_or_else(|| {
            let known: Vec<_> = ROUTES.iter().map(|(name, _)| *name).collect();
            anyhow!(
                "unknown coderd route \"{alias}\"; known: {}",
                known.join(", ")
            )
        })
}

/// Whether a journal entry is a provisioner-key request (create, list or delete) of the operator:
/// not a fetch of a key's own record with the key, which daemon pods make whenever they start.
pub fn is_key_request(route: Option<&str>) -> bool {
    route.is_some_and(|r| r.contains("/provisionerkeys") && !is_daemon_key_fetch(Some(r)))
}

/// A fetch of a key's own record, authenticated by the key (`daemon-key`).
pub fn is_daemon_key_fetch(route: Option<&str>) -> bool {
    route == Some(DAEMON_KEY_ROUTE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case("provisionerkeys", true)]
    #[case("entitlements", true)]
    #[case("keys", false)]
    fn route_aliases_resolve(#[case] alias: &str, #[case] known: bool) {
        assert_eq!(route_template(alias).is_ok(), known);
    }

    #[rstest]
    #[case("provisionerkeys", true)]
    #[case("provisionerkey", true)]
    #[case("daemon-key", false)]
    #[case("entitlements", false)]
    fn key_requests_are_the_operators_creates_lists_and_deletes(
        #[case] alias: &str,
        #[case] key_request: bool,
    ) {
        let route = route_template(alias).ok();
        assert_eq!(is_key_request(route), key_request);
    }
}
