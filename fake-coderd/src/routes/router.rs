//! Where coderd's chi router sends a request, for the paths the fake knows.
//!
//! coderd routes on the percent-decoded path with runs of slashes collapsed to one
//! (`coderd/coderd.go` `singleSlashMW`, read at commit 004d4b8281783f8c94cad2e8276e63bac51a1c7b:
//! it rewrites chi's `RoutePath` from `r.URL.Path` before routing, so chi never routes on
//! `RawPath`, and an encoded slash `%2F` splits a segment). chi (v5.2.2 in coderd's `go.mod`;
//! `mux.go` `Mount`, `routeHTTP`, `tree.go` `findRoute` as stored with `methodsAllowed`):
//!
//! * `r.Route(pattern)` mounts a subrouter at `pattern`, `pattern/` and `pattern/*`, so a trailing
//!   slash reaches the subrouter's `/` route; a plain `r.Get(pattern)` does not match `pattern/`;
//! * a subrouter's `Use` middleware runs before it routes, so its 401/404/403 come before the
//!   subrouter's 404 or 405;
//! * a `{param}` never matches an empty segment;
//! * a path that matches a route but not its method answers `405` with an empty body and one
//!   `Allow` header per method of every route node on the way that matched the path (coderd sets no
//!   `MethodNotAllowed` handler; chi collects the methods in Go map order, the fake in a fixed one).
//!
//! The route tree is coderd's (`coderd/coderd.go` at 004d4b82, `enterprise/coderd/coderd.go` at
//! 00199bfcf437b2a7356c665352a4d735ed3fecaa), reduced to the subtrees the fake serves.

use super::Endpoint;

/// A middleware that runs before a subrouter routes (and so before its 404 or 405).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Guard {
    /// `httpmw.ExtractAPIKeyMW`: a valid session token (401).
    Session,
    /// `httpmw.ExtractOrganizationParam` on this path value (400/404).
    Organization(String),
    /// `RequireFeatureMW(external_provisioner_daemons)` (403).
    FeatureGate,
    /// `httpmw.ExtractProvisionerKeyParam` on this key name, in the guarded organization (404).
    ProvisionerKey(String),
    /// `httpmw.ExtractProvisionerDaemonAuthenticated`, without a PSK (401/400).
    DaemonKey,
}

/// The router's verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Routed {
    /// An endpoint the fake serves, with its decoded path values.
    Endpoint(Endpoint, Vec<String>),
    /// A path with routes, none for this method: `405` with `Allow`, once the guards pass.
    MethodNotAllowed {
        guards: Vec<Guard>,
        allowed: Vec<&'static str>,
    },
    /// `404 Route not found.` once the guards pass. Also the answer for coderd routes the fake
    /// does not serve (the `/organizations` list, `…/provisionerkeys/daemons`…), without guards.
    NotFound { guards: Vec<Guard> },
}

const API_PREFIX: &str = "/api/v2";
/// chi's `methodMap`: any other method is answered 405 before any route is looked at.
const CHI_METHODS: [&str; 9] = [
    "CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE",
];

/// The path coderd routes on: percent-decoded, as Go's `r.URL.Path`, with runs of slashes
/// collapsed to one (`singleSlashMW`).
pub fn routing_path(raw_path: &str) -> String {
    let decoded = percent_encoding::percent_decode_str(raw_path).decode_utf8_lossy();
    let mut path = String::with_capacity(decoded.len());
    for c in decoded.chars() {
        if !(c == '/' && path.ends_with('/')) {
            path.push(c);
        }
    }
    path
}

/// The segments after `/api/v2` of a routing path; a trailing slash leaves a last empty segment.
/// `None` outside `/api/v2`.
pub fn api_segments(routing_path: &str) -> Option<Vec<&str>> {
    match routing_path.strip_prefix(API_PREFIX)? {
        "" => Some(Vec::new()),
        rest => Some(rest.strip_prefix('/')?.split('/').collect()),
    }
}

fn params(values: &[&str]) -> Vec<String> {
    values.iter().map(|value| value.to_string()).collect()
}

/// `pattern` or `pattern/`: what a mounted subrouter's `/` route sees.
fn with_optional_slash<'a>(segments: &'a [&'a str], length: usize) -> Option<&'a [&'a str]> {
    match segments.len() {
        n if n == length => Some(segments),
        n if n == length + 1 && segments[length].is_empty() => Some(&segments[..length]),
        _ => None,
    }
}

/// One route node: the endpoint serving `method`, else 405 with `allowed`.
fn node(
    method: &str,
    served: &[(&str, Endpoint)],
    allowed: &[&'static str],
    guards: Vec<Guard>,
    values: &[&str],
) -> Routed {
    match served
        .iter()
        .find(|(served_method, _)| *served_method == method)
    {
        Some((_, endpoint)) => Routed::Endpoint(*endpoint, params(values)),
        // coderd serves the method there, the fake does not.
        None if allowed.contains(&method) => Routed::NotFound { guards: Vec::new() },
        None => Routed::MethodNotAllowed {
            guards,
            allowed: allowed.to_vec(),
        },
    }
}

/// Where `method` on `raw_path` goes in an enterprise (`enterprise`) or AGPL coderd.
pub fn route(method: &str, raw_path: &str, enterprise: bool) -> Routed {
    if !CHI_METHODS.contains(&method) {
        return Routed::MethodNotAllowed {
            guards: Vec::new(),
            allowed: Vec::new(),
        };
    }
    let path = routing_path(raw_path);
    let not_found = Routed::NotFound { guards: Vec::new() };
    let Some(segments) = api_segments(&path) else {
        return not_found;
    };
    match segments.as_slice() {
        ["buildinfo"] => node(
            method,
            &[("GET", Endpoint::BuildInfo)],
            &["GET"],
            Vec::new(),
            &[],
        ),
        ["entitlements"] if enterprise => node(
            method,
            &[("GET", Endpoint::Entitlements)],
            &["GET"],
            Vec::new(),
            &[],
        ),
        ["users", user, rest @ ..] if !user.is_empty() => {
            let guards = vec![Guard::Session];
            match with_optional_slash(rest, 0) {
                Some(_) => node(
                    method,
                    &[("GET", Endpoint::User)],
                    &["GET", "DELETE"],
                    guards,
                    &[user],
                ),
                None => Routed::NotFound { guards },
            }
        }
        ["organizations", organization, rest @ ..] if !organization.is_empty() => {
            organization_route(method, organization, rest, enterprise)
        }
        ["provisionerkeys", rest @ ..] if enterprise => {
            let guards = vec![Guard::DaemonKey];
            match rest {
                [key] if !key.is_empty() => node(
                    method,
                    &[("GET", Endpoint::DaemonKey)],
                    &["GET"],
                    guards,
                    &[key],
                ),
                _ => Routed::NotFound { guards },
            }
        }
        _ => not_found,
    }
}

/// `/organizations/{organization}…`: the AGPL subrouter (API key, then the organization) unless
/// the enterprise `…/provisionerkeys` subrouter takes the path.
fn organization_route(method: &str, organization: &str, rest: &[&str], enterprise: bool) -> Routed {
    let session_and_organization = vec![Guard::Session, Guard::Organization(organization.into())];
    if rest.is_empty() {
        // The enterprise router adds PATCH and DELETE on the exact path: chi lists them in
        // `Allow` before the AGPL subrouter's GET.
        let allowed: &[&'static str] = if enterprise {
            &["PATCH", "DELETE", "GET"]
        } else {
            &["GET"]
        };
        return node(
            method,
            &[("GET", Endpoint::Organization)],
            allowed,
            session_and_organization,
            &[organization],
        );
    }
    if rest == [""] {
        return node(
            method,
            &[("GET", Endpoint::Organization)],
            &["GET"],
            session_and_organization,
            &[organization],
        );
    }
    if !enterprise || rest[0] != "provisionerkeys" {
        return Routed::NotFound {
            guards: session_and_organization,
        };
    }
    let mut guards = session_and_organization;
    guards.push(Guard::FeatureGate);
    if with_optional_slash(rest, 1).is_some() {
        return node(
            method,
            &[("GET", Endpoint::ListKeys), ("POST", Endpoint::CreateKey)],
            &["GET", "POST"],
            guards,
            &[organization],
        );
    }
    let key = rest[1];
    if rest == ["provisionerkeys", "daemons"] && method == "GET" {
        // `provisionerKeyDaemons` (§2.8): not served.
        return Routed::NotFound { guards: Vec::new() };
    }
    if method == "DELETE" && with_optional_slash(rest, 2).is_some() {
        return Routed::Endpoint(Endpoint::DeleteKey, params(&[organization, key]));
    }
    guards.push(Guard::ProvisionerKey(key.into()));
    match with_optional_slash(rest, 2) {
        // The static `/daemons` route (GET) matched before the key subrouter.
        Some(_) if rest.len() == 2 && key == "daemons" => Routed::MethodNotAllowed {
            guards,
            allowed: vec!["GET", "DELETE"],
        },
        Some(_) => Routed::MethodNotAllowed {
            guards,
            allowed: vec!["DELETE"],
        },
        None => Routed::NotFound { guards },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn endpoint(endpoint: Endpoint, values: &[&str]) -> Routed {
        Routed::Endpoint(endpoint, params(values))
    }

    fn not_allowed(guards: Vec<Guard>, allowed: &[&'static str]) -> Routed {
        Routed::MethodNotAllowed {
            guards,
            allowed: allowed.to_vec(),
        }
    }

    fn org_guards(organization: &str) -> Vec<Guard> {
        vec![Guard::Session, Guard::Organization(organization.into())]
    }

    fn key_guards(organization: &str) -> Vec<Guard> {
        let mut guards = org_guards(organization);
        guards.push(Guard::FeatureGate);
        guards
    }

    fn with_key(mut guards: Vec<Guard>, key: &str) -> Vec<Guard> {
        guards.push(Guard::ProvisionerKey(key.into()));
        guards
    }

    #[rstest]
    #[case::buildinfo("GET", "/api/v2/buildinfo", endpoint(Endpoint::BuildInfo, &[]))]
    #[case::buildinfo_put("PUT", "/api/v2/buildinfo", not_allowed(vec![], &["GET"]))]
    #[case::buildinfo_slash("GET", "/api/v2/buildinfo/", Routed::NotFound { guards: vec![] })]
    #[case::doubled_slashes("GET", "//api//v2///buildinfo", endpoint(Endpoint::BuildInfo, &[]))]
    #[case::encoded_segment("GET", "/api/v2/build%69nfo", endpoint(Endpoint::BuildInfo, &[]))]
    #[case::user("GET", "/api/v2/users/me", endpoint(Endpoint::User, &["me"]))]
    #[case::user_slash("GET", "/api/v2/users/me/", endpoint(Endpoint::User, &["me"]))]
    #[case::user_post("POST", "/api/v2/users/me", not_allowed(vec![Guard::Session], &["GET", "DELETE"]))]
    #[case::user_delete_not_served("DELETE", "/api/v2/users/me", Routed::NotFound { guards: vec![] })]
    #[case::user_deeper("GET", "/api/v2/users/me/x", Routed::NotFound { guards: vec![Guard::Session] })]
    #[case::organization("GET", "/api/v2/organizations/a%20b", endpoint(Endpoint::Organization, &["a b"]))]
    #[case::organization_put("PUT", "/api/v2/organizations/x", not_allowed(org_guards("x"), &["PATCH", "DELETE", "GET"]))]
    #[case::organization_slash_put("PUT", "/api/v2/organizations/x/", not_allowed(org_guards("x"), &["GET"]))]
    #[case::organization_list_not_served("GET", "/api/v2/organizations/", Routed::NotFound { guards: vec![] })]
    #[case::organization_unknown_subpath("GET", "/api/v2/organizations/x/nope", Routed::NotFound { guards: org_guards("x") })]
    #[case::keys("GET", "/api/v2/organizations/x/provisionerkeys", endpoint(Endpoint::ListKeys, &["x"]))]
    #[case::keys_slash("GET", "/api/v2/organizations/x/provisionerkeys/", endpoint(Endpoint::ListKeys, &["x"]))]
    #[case::keys_doubled("POST", "/api/v2/organizations//x//provisionerkeys", endpoint(Endpoint::CreateKey, &["x"]))]
    #[case::keys_empty_organization("GET", "/api/v2/organizations//provisionerkeys", endpoint(Endpoint::Organization, &["provisionerkeys"]))]
    #[case::keys_put("PUT", "/api/v2/organizations/x/provisionerkeys", not_allowed(key_guards("x"), &["GET", "POST"]))]
    #[case::keys_delete_slash("DELETE", "/api/v2/organizations/x/provisionerkeys/", not_allowed(key_guards("x"), &["GET", "POST"]))]
    #[case::delete_key("DELETE", "/api/v2/organizations/x/provisionerkeys/k", endpoint(Endpoint::DeleteKey, &["x", "k"]))]
    #[case::delete_key_slash("DELETE", "/api/v2/organizations/x/provisionerkeys/k/", endpoint(Endpoint::DeleteKey, &["x", "k"]))]
    #[case::delete_key_encoded_slash("DELETE", "/api/v2/organizations/x/provisionerkeys/a%2Fb", Routed::NotFound { guards: with_key(key_guards("x"), "a") })]
    #[case::key_get("GET", "/api/v2/organizations/x/provisionerkeys/k", not_allowed(with_key(key_guards("x"), "k"), &["DELETE"]))]
    #[case::daemons_not_served("GET", "/api/v2/organizations/x/provisionerkeys/daemons", Routed::NotFound { guards: vec![] })]
    #[case::daemons_put("PUT", "/api/v2/organizations/x/provisionerkeys/daemons", not_allowed(with_key(key_guards("x"), "daemons"), &["GET", "DELETE"]))]
    #[case::delete_key_named_daemons("DELETE", "/api/v2/organizations/x/provisionerkeys/daemons", endpoint(Endpoint::DeleteKey, &["x", "daemons"]))]
    #[case::daemon_key("GET", "/api/v2/provisionerkeys/secret", endpoint(Endpoint::DaemonKey, &["secret"]))]
    #[case::daemon_key_post("POST", "/api/v2/provisionerkeys/secret", not_allowed(vec![Guard::DaemonKey], &["GET"]))]
    #[case::daemon_key_slash("GET", "/api/v2/provisionerkeys/secret/", Routed::NotFound { guards: vec![Guard::DaemonKey] })]
    #[case::daemon_key_encoded_slash("GET", "/api/v2/provisionerkeys/a%2Fb", Routed::NotFound { guards: vec![Guard::DaemonKey] })]
    #[case::daemon_key_none("GET", "/api/v2/provisionerkeys/", Routed::NotFound { guards: vec![Guard::DaemonKey] })]
    #[case::unknown_method("BREW", "/api/v2/buildinfo", not_allowed(vec![], &[]))]
    #[case::other_api("GET", "/api/v3/buildinfo", Routed::NotFound { guards: vec![] })]
    #[case::prefix_only("GET", "/api/v2buildinfo", Routed::NotFound { guards: vec![] })]
    fn routes_like_coderds_chi(#[case] method: &str, #[case] path: &str, #[case] expected: Routed) {
        assert_eq!(route(method, path, true), expected);
    }

    #[rstest]
    #[case::entitlements("GET", "/api/v2/entitlements", Routed::NotFound { guards: vec![] })]
    #[case::keys("GET", "/api/v2/organizations/x/provisionerkeys", Routed::NotFound { guards: org_guards("x") })]
    #[case::daemon_key("GET", "/api/v2/provisionerkeys/k", Routed::NotFound { guards: vec![] })]
    #[case::organization_patch("PATCH", "/api/v2/organizations/x", not_allowed(org_guards("x"), &["GET"]))]
    fn an_agpl_coderd_lacks_the_enterprise_routes(
        #[case] method: &str,
        #[case] path: &str,
        #[case] expected: Routed,
    ) {
        assert_eq!(route(method, path, false), expected);
    }
}
