//! The credential-Secret origin check (contract §6, decision D-2).
//!
//! Every Secret named by an `extraEnv[].valueFrom.secretKeyRef` must be labelled
//! `coder.com/credential=true` and list the control plane's origin in the annotation
//! `coder.com/credential-destinations`, so a CR cannot hand an arbitrary Secret to a daemon
//! that talks to another host.
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::EnvVar;
use url::Url;

use crate::api::{CREDENTIAL_DESTINATIONS_ANNOTATION, CREDENTIAL_LABEL, reason};

/// What the check needs to know about one referenced Secret (never its data).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SecretMeta {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

/// A Secret named by an `extraEnv` secretKeyRef.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CredentialRef {
    pub secret: String,
    pub optional: bool,
}

/// Secrets referenced by `extraEnv` secretKeyRefs, in order, without duplicates and without the
/// operator's own key Secret (R-CRED-14). A Secret is optional only if every reference is.
pub fn credential_refs(extra_env: &[EnvVar], own_key_secret: &str) -> Vec<CredentialRef> {
    let mut refs: Vec<CredentialRef> = Vec::new();
    for key_ref in extra_env
        .iter()
        .filter_map(|env| env.value_from.as_ref()?.secret_key_ref.as_ref())
    {
        if key_ref.name == own_key_secret {
            continue;
        }
        let optional = key_ref.optional.unwrap_or(false);
        match refs.iter_mut().find(|known| known.secret == key_ref.name) {
            Some(known) => known.optional &= optional,
            None => refs.push(CredentialRef {
                secret: key_ref.name.clone(),
                optional,
            }),
        }
    }
    refs
}

/// Outcome of the check: `Ok(())` is `CredentialsValid`; `Err` carries a False reason and a
/// message that names the Secret and what is missing, never a value.
pub type CredentialCheck = Result<(), (&'static str, String)>;

/// Checks the referenced Secrets (`None` = the Secret does not exist) against `control_plane_url`.
pub fn check_credentials(
    refs: &[CredentialRef],
    secrets: &BTreeMap<String, Option<SecretMeta>>,
    control_plane_url: &str,
) -> CredentialCheck {
    for credential in refs {
        let Some(meta) = secrets.get(&credential.secret).and_then(Option::as_ref) else {
            if credential.optional {
                continue;
            }
            return Err((
                reason::CREDENTIAL_SECRET_NOT_FOUND,
                format!(
                    "Secret {:?} named by spec.extraEnv does not exist",
                    credential.secret
                ),
            ));
        };
        if meta.labels.get(CREDENTIAL_LABEL).map(String::as_str) != Some("true") {
            return Err((
                reason::CREDENTIAL_LABEL_MISSING,
                format!(
                    "Secret {:?} lacks the label {CREDENTIAL_LABEL}=true",
                    credential.secret
                ),
            ));
        }
        let destinations = meta
            .annotations
            .get(CREDENTIAL_DESTINATIONS_ANNOTATION)
            .map(|value| value.trim())
            .filter(|value| !value.is_empty());
        let Some(destinations) = destinations else {
            return Err((
                reason::CREDENTIAL_DESTINATION_MISSING,
                format!(
                    "Secret {:?} lacks the annotation {CREDENTIAL_DESTINATIONS_ANNOTATION}",
                    credential.secret
                ),
            ));
        };
        if !destinations_allow(destinations, control_plane_url) {
            return Err((
                reason::CREDENTIAL_DESTINATION_MISMATCH,
                format!(
                    "annotation {CREDENTIAL_DESTINATIONS_ANNOTATION} of Secret {:?} does not list the control plane origin {}",
                    credential.secret,
                    origin_of(control_plane_url).map_or_else(
                        || "(invalid control plane URL)".to_owned(),
                        |o| o.to_string()
                    ),
                ),
            ));
        }
    }
    Ok(())
}

/// `scheme://host:port` with the effective port (R-CRED-10).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Origin {
    scheme: String,
    host: String,
    port: Option<u16>,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.port {
            Some(port) => write!(f, "{}://{}:{port}", self.scheme, self.host),
            None => write!(f, "{}://{}", self.scheme, self.host),
        }
    }
}

fn origin_from(url: &Url) -> Option<Origin> {
    Some(Origin {
        scheme: url.scheme().to_ascii_lowercase(),
        host: url.host_str()?.to_ascii_lowercase(),
        port: url.port_or_known_default(),
    })
}

/// The origin of the control plane URL (its path is irrelevant).
fn origin_of(control_plane_url: &str) -> Option<Origin> {
    origin_from(&Url::parse(control_plane_url.trim()).ok()?)
}

/// One annotation entry as an origin; anything with a path, query, fragment, userinfo or
/// wildcard is not an origin and never matches (D-2).
fn parse_destination(entry: &str) -> Option<Origin> {
    if entry.contains('*') {
        return None;
    }
    let url = Url::parse(entry).ok()?;
    let bare = url.username().is_empty()
        && url.password().is_none()
        && url.query().is_none()
        && url.fragment().is_none()
        && (url.path() == "/" || url.path().is_empty())
        // `Url` normalises "https://h" to path "/"; reject an explicit trailing slash or path.
        && !entry.trim_end().ends_with('/');
    if bare { origin_from(&url) } else { None }
}

/// Whether the comma-separated `destinations` list the control plane's origin.
pub fn destinations_allow(destinations: &str, control_plane_url: &str) -> bool {
    let Some(wanted) = origin_of(control_plane_url) else {
        return false;
    };
    destinations
        .split(',')
        .map(str::trim)
        .filter_map(parse_destination)
        .any(|origin| origin == wanted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    const CP: &str = "https://coder.example.com";

    #[rstest]
    #[case::exact("https://coder.example.com", true)]
    #[case::case_insensitive("HTTPS://Coder.Example.COM", true)]
    #[case::explicit_default_port("https://coder.example.com:443", true)]
    #[case::in_a_list(" http://other.test , https://coder.example.com ", true)]
    #[case::other_scheme("http://coder.example.com", false)]
    #[case::other_port("https://coder.example.com:8443", false)]
    #[case::other_host("https://coder.example.org", false)]
    #[case::suffix_lookalike("https://coder.example.com.evil.test", false)]
    #[case::path_lookalike("https://evil.test/coder.example.com", false)]
    #[case::with_path("https://coder.example.com/api", false)]
    #[case::trailing_slash("https://coder.example.com/", false)]
    #[case::with_query("https://coder.example.com?x=1", false)]
    #[case::with_userinfo("https://user@coder.example.com", false)]
    #[case::wildcard("https://*.example.com", false)]
    #[case::bare_host("coder.example.com", false)]
    #[case::empty_entries(" , ", false)]
    fn destination_matching(#[case] annotation: &str, #[case] allowed: bool) {
        assert_eq!(destinations_allow(annotation, CP), allowed, "{annotation}");
    }

    #[rstest]
    #[case::http_default_port("http://coder.test", "http://coder.test:80", true)]
    #[case::control_plane_path_ignored("https://coder.test/some/path", "https://coder.test", true)]
    #[case::non_default_port("http://127.0.0.1:3000", "http://127.0.0.1:3000", true)]
    #[case::port_missing("http://127.0.0.1:3000", "http://127.0.0.1", false)]
    #[case::invalid_control_plane("not a url", "http://127.0.0.1", false)]
    #[case::authority_as_userinfo(
        "http://127.0.0.1:3000",
        "http://127.0.0.1:3000@evil.test",
        false
    )]
    #[case::bare_wildcard("http://127.0.0.1:3000", "*", false)]
    fn control_plane_origin(#[case] cp: &str, #[case] annotation: &str, #[case] allowed: bool) {
        assert_eq!(destinations_allow(annotation, cp), allowed);
    }

    fn env_from_secret(name: &str, secret: &str, optional: Option<bool>) -> EnvVar {
        serde_json::from_value(serde_json::json!({
            "name": name,
            "valueFrom": {"secretKeyRef": {"name": secret, "key": "k", "optional": optional}}
        }))
        .expect("valid EnvVar")
    }

    fn meta(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> Option<SecretMeta> {
        let map = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        Some(SecretMeta {
            labels: map(labels),
            annotations: map(annotations),
        })
    }

    #[test]
    fn refs_skip_own_key_secret_plain_values_and_duplicates() {
        let env = vec![
            EnvVar {
                name: "PLAIN".into(),
                value: Some("x".into()),
                ..Default::default()
            },
            env_from_secret("A", "proxy", Some(true)),
            env_from_secret("B", "proxy", None),
            env_from_secret("C", "own-key", None),
        ];
        assert_eq!(
            credential_refs(&env, "own-key"),
            vec![CredentialRef {
                secret: "proxy".into(),
                optional: false
            }]
        );
    }

    #[rstest]
    #[case::no_refs(vec![], vec![], Ok(()))]
    #[case::valid(vec![("s", false)], vec![("s", meta(&[(CREDENTIAL_LABEL, "true")], &[(CREDENTIAL_DESTINATIONS_ANNOTATION, CP)]))], Ok(()))]
    #[case::absent(vec![("s", false)], vec![("s", None)], Err(reason::CREDENTIAL_SECRET_NOT_FOUND))]
    #[case::absent_optional(vec![("s", true)], vec![("s", None)], Ok(()))]
    #[case::label_missing(vec![("s", false)], vec![("s", meta(&[], &[(CREDENTIAL_DESTINATIONS_ANNOTATION, CP)]))], Err(reason::CREDENTIAL_LABEL_MISSING))]
    #[case::label_not_true(vec![("s", false)], vec![("s", meta(&[(CREDENTIAL_LABEL, "yes")], &[(CREDENTIAL_DESTINATIONS_ANNOTATION, CP)]))], Err(reason::CREDENTIAL_LABEL_MISSING))]
    #[case::annotation_missing(vec![("s", false)], vec![("s", meta(&[(CREDENTIAL_LABEL, "true")], &[]))], Err(reason::CREDENTIAL_DESTINATION_MISSING))]
    #[case::mismatch(vec![("s", false)], vec![("s", meta(&[(CREDENTIAL_LABEL, "true")], &[(CREDENTIAL_DESTINATIONS_ANNOTATION, "https://evil.test")]))], Err(reason::CREDENTIAL_DESTINATION_MISMATCH))]
    fn check_outcomes(
        #[case] refs: Vec<(&str, bool)>,
        #[case] secrets: Vec<(&str, Option<SecretMeta>)>,
        #[case] expected: Result<(), &str>,
    ) {
        let refs: Vec<_> = refs
            .into_iter()
            .map(|(s, optional)| CredentialRef {
                secret: s.into(),
                optional,
            })
            .collect();
        let secrets = secrets
            .into_iter()
            .map(|(name, meta)| (name.to_owned(), meta))
            .collect();
        let outcome = check_credentials(&refs, &secrets, CP);
        assert_eq!(
            outcome.as_ref().map_err(|(reason, _)| *reason),
            expected.as_ref().map_err(|r| *r)
        );
        if let Err((_, message)) = outcome {
            assert!(
                message.contains("\"s\""),
                "message names the Secret: {message}"
            );
        }
    }

    /// Entries that start with the control plane URL are not its origin.
    #[test]
    fn prefix_lookalikes_are_refused() {
        let cp = "http://127.0.0.1:3000";
        for lookalike in [
            "http://127.0.0.1:3000@evil.test",
            "http://127.0.0.1:3000/api",
        ] {
            assert!(!destinations_allow(lookalike, cp), "{lookalike}");
        }
    }
}
