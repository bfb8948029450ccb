//! The bundle written for a failed scenario, before its namespace is deleted: the CRs as YAML,
//! the operator's children, the namespace's events, the operator's log tail and the scenario's
//! coderd journal. Secret values never reach the bundle: Secret data is replaced by its size,
//! and every known secret value (Secret data, the session token) is masked in all text.
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Event, Secret};
use kube::api::{Api, DynamicObject, ListParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

use crate::crd_resources::{control_plane_resource, provisioner_resource};
use crate::world::ProvisionerWorld;

/// Lines of operator log kept in a bundle.
const LOG_LINES: usize = 200;
/// At most this many of the operator's log lines that mention the scenario are kept.
const SCENARIO_LOG_LINES: usize = 2000;
const MASK: &str = "<redacted>";

/// A file-system-friendly folder name for a scenario.
pub fn folder_name(feature: &str, scenario: &str, line: usize) -> String {
    let slug: String = format!("{}-{line}-{scenario}", feature.trim_end_matches(".feature"))
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let mut collapsed = String::new();
    for c in slug.chars() {
        if !(c == '-' && collapsed.ends_with('-')) {
            collapsed.push(c);
        }
    }
    collapsed.trim_matches('-').chars().take(100).collect()
}

/// Replaces each secret (≥ 6 characters, shorter ones would mask ordinary words) by a mask.
pub fn mask(text: &str, secrets: &[String]) -> String {
    secrets
        .iter()
        .filter(|s| s.len() >= 6)
        .fold(text.to_owned(), |acc, secret| {
            acc.replace(secret.as_str(), MASK)
        })
}

/// The lines of `log` that mention one of `needles` (the scenario's namespace, its CR names),
/// with the `=== start #N` banners of the operator's (re)starts, the last `max` of them. A log
/// shared by concurrent scenarios thus yields the failing scenario's own lines.
pub fn lines_mentioning(log: &str, needles: &[String], max: usize) -> String {
    let needles: Vec<&str> = needles
        .iter()
        .map(String::as_str)
        .filter(|n| !n.is_empty())
        .collect();
    let lines: Vec<&str> = log
        .lines()
        .filter(|line| line.starts_with("=== start #") || needles.iter().any(|n| line.contains(n)))
        .collect();
    let skipped = lines.len().saturating_sub(max);
    let mut out = String::new();
    if skipped > 0 {
        out.push_str(&format!("… {skipped} earlier line(s) left out\n"));
    }
    for line in &lines[skipped..] {
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// `metadata.uid` of each object.
fn uids(objects: &anyhow::Result<Vec<Value>>) -> Vec<String> {
    objects
        .iter()
        .flatten()
        .filter_map(|o| o.pointer("/metadata/uid").and_then(Value::as_str))
        .map(str::to_owned)
        .collect()
}

/// Each diagnostics file is cut at this size, saying so: a bundle stays readable and small.
const FILE_LIMIT: usize = 256 * 1024;

/// `text` cut to at most `limit` bytes (its end kept, where a failure's last lines are).
fn capped(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_owned();
    }
    let mut start = text.len() - limit;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!(
        "… the first {start} bytes are left out (each diagnostics file keeps its last {limit})\n{}",
        &text[start..]
    )
}

/// Removes terminal colour sequences (`ESC [ … m`) that some loggers write even to files.
pub fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            for next in chars.by_ref() {
                if next.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Secret data replaced by sizes (pure, so the redaction is unit-tested).
pub fn redact_secret(mut secret: Value) -> Value {
    for field in ["data", "stringData"] {
        if let Some(map) = secret.get_mut(field).and_then(Value::as_object_mut) {
            for value in map.values_mut() {
                let size = value.as_str().map_or(0, str::len);
                *value = json!(format!("{MASK} ({size} base64 characters)"));
            }
        }
    }
    if let Some(annotations) = secret
        .pointer_mut("/metadata/annotations")
        .and_then(Value::as_object_mut)
    {
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
    if let Some(metadata) = secret.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.remove("managedFields");
    }
    secret
}

fn without_managed_fields(mut object: Value) -> Value {
    if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.remove("managedFields");
    }
    object
}

async fn list(world: &ProvisionerWorld, resource: &ApiResource) -> anyhow::Result<Vec<Value>> {
    let api: Api<DynamicObject> = Api::namespaced_with(world.client(), &world.namespace, resource);
    let items = api.list(&ListParams::default()).await?.items;
    Ok(items
        .into_iter()
        .map(|o| serde_json::to_value(o).map(without_managed_fields))
        .collect::<Result<_, _>>()?)
}

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

fn to_yaml(value: &Value) -> String {
    serde_saphyr::to_string(value)
        .unwrap_or_else(|e| format!("# cannot render as YAML: {e}\n{value}"))
}

/// Writes the bundle into `dir` and returns it. Each part is best-effort: a part that cannot be
/// collected says why in its file instead of aborting the bundle.
pub async fn write_bundle(world: &ProvisionerWorld, dir: &Path) -> anyhow::Result<PathBuf> {
    tokio::fs::create_dir_all(dir)
        .await
        .with_context(|| format!("creating {}", dir.display()))?;

    let secrets_api: Api<Secret> = world.api();
    let secrets = secrets_api
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    let mut known_secrets = world.secret_values();
    for secret in &secrets {
        for value in secret.data.iter().flat_map(|d| d.values()) {
            known_secrets.push(String::from_utf8_lossy(&value.0).into_owned());
        }
    }

    let mut parts: Vec<(&str, String)> = Vec::new();
    let groups: [(&str, anyhow::Result<Vec<Value>>); 7] = [
        (
            "coderprovisioners.yaml",
            list(world, &provisioner_resource()).await,
        ),
        (
            "codercontrolplanes.yaml",
            list(world, &control_plane_resource()).await,
        ),
        (
            "deployments.yaml",
            list(world, &resource("apps", "v1", "Deployment", "deployments")).await,
        ),
        (
            "serviceaccounts.yaml",
            list(
                world,
                &resource("", "v1", "ServiceAccount", "serviceaccounts"),
            )
            .await,
        ),
        (
            "roles.yaml",
            list(
                world,
                &resource("rbac.authorization.k8s.io", "v1", "Role", "roles"),
            )
            .await,
        ),
        (
            "rolebindings.yaml",
            list(
                world,
                &resource(
                    "rbac.authorization.k8s.io",
                    "v1",
                    "RoleBinding",
                    "rolebindings",
                ),
            )
            .await,
        ),
        (
            "resourcequotas.yaml",
            list(
                world,
                &resource("", "v1", "ResourceQuota", "resourcequotas"),
            )
            .await,
        ),
    ];
    // The namespace and the objects' uids are the scenario's own; names are not (every scenario
    // has a `coderprovisioner-sample`).
    let mut needles = vec![world.namespace.clone()];
    for (_, objects) in &groups {
        needles.extend(uids(objects));
    }
    needles.sort();
    needles.dedup();
    for (file, objects) in groups {
        let text = match objects {
            Ok(objects) => to_yaml(&Value::Array(objects)),
            Err(error) => format!("# could not list: {error:#}\n"),
        };
        parts.push((file, text));
    }
    let redacted: Vec<Value> = secrets
        .iter()
        .filter_map(|s| serde_json::to_value(s).ok())
        .map(redact_secret)
        .collect();
    parts.push(("secrets.yaml", to_yaml(&Value::Array(redacted))));

    let events_api: Api<Event> = world.api();
    let events = match events_api.list(&ListParams::default()).await {
        Ok(list) => {
            let mut events = list.items;
            // core/v1 recorders set lastTimestamp, events.k8s.io/v1 recorders set eventTime.
            let when = |e: &Event| {
                e.last_timestamp
                    .as_ref()
                    .map(|t| t.0.to_string())
                    .or_else(|| e.event_time.as_ref().map(|t| t.0.to_string()))
                    .unwrap_or_default()
            };
            events.sort_by_key(when);
            events
                .iter()
                .map(|e| {
                    format!(
                        "{} {} {}/{}: {} {}",
                        when(e),
                        e.type_.as_deref().unwrap_or(""),
                        e.involved_object.kind.as_deref().unwrap_or(""),
                        e.involved_object.name.as_deref().unwrap_or(""),
                        e.reason.as_deref().unwrap_or(""),
                        e.message.as_deref().unwrap_or(""),
                    )
                })
                .collect::<Vec<_>>()
                .join("\n")
        }
        Err(error) => format!("could not list events: {error:#}"),
    };
    parts.push(("events.txt", events));

    let log = world
        .operator_log(Some(LOG_LINES))
        .await
        .unwrap_or_else(|| {
            "the operator is installed in the cluster and its Deployment was not named \
         (--operator-deployment); its log is not available to the suite"
                .to_owned()
        });
    parts.push(("operator.log", strip_ansi(&log)));
    let full_log = world.operator_log(None).await;
    if let Some(full_log) = full_log {
        let mine = lines_mentioning(&strip_ansi(&full_log), &needles, SCENARIO_LOG_LINES);
        let header = format!(
            "# operator log lines that mention {} (with each start banner)\n",
            needles.join(", ")
        );
        parts.push(("operator-scenario.log", header + &mine));
    }

    let journal = if world.env.coderd.admin.is_none() {
        "a real coderd has no journal".to_owned()
    } else if world.coderd.is_none() {
        "this scenario had no coderd identity (no control plane fixture)".to_owned()
    } else {
        match world.journal().await {
            Ok(entries) => to_yaml(&serde_json::to_value(entries).unwrap_or(Value::Null)),
            Err(error) => format!("could not read the journal: {error:#}"),
        }
    };
    parts.push(("coderd-journal.yaml", journal));

    let mut files: Vec<(String, String)> = parts
        .into_iter()
        .map(|(file, text)| (file.to_owned(), text))
        .collect();
    // The leader-elected replicas a scenario started log apart from the operator.
    for replica in &world.replicas {
        let log = tokio::fs::read_to_string(replica.log_path())
            .await
            .unwrap_or_else(|error| {
                format!("could not read {}: {error}", replica.log_path().display())
            });
        files.push((format!("{}.log", replica.name()), strip_ansi(&log)));
    }
    for (file, text) in files {
        tokio::fs::write(
            dir.join(&file),
            capped(&mask(&text, &known_secrets), FILE_LIMIT),
        )
        .await
        .with_context(|| format!("writing {file}"))?;
    }
    Ok(dir.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case(
        "key_lifecycle.feature",
        "Lost Secret: key rotated!",
        12,
        "key-lifecycle-12-lost-secret-key-rotated"
    )]
    #[case("a.feature", "--x--", 1, "a-1-x")]
    fn folder_names_are_safe(
        #[case] feature: &str,
        #[case] scenario: &str,
        #[case] line: usize,
        #[case] expected: &str,
    ) {
        assert_eq!(folder_name(feature, scenario, line), expected);
    }

    #[rstest]
    #[case(&["ns-a"], 10, "=== start #1\nreconcile ns-a/p\n=== start #2\nns-a done\n")]
    #[case(&["ns-a", "key-x"], 10, "=== start #1\nreconcile ns-a/p\nkey-x created\n=== start #2\nns-a done\n")]
    #[case(&["ns-a"], 2, "… 2 earlier line(s) left out\n=== start #2\nns-a done\n")]
    #[case(&["", "nothing"], 10, "=== start #1\n=== start #2\n")]
    fn scenario_log_lines_are_picked(
        #[case] needles: &[&str],
        #[case] max: usize,
        #[case] expected: &str,
    ) {
        let log = "=== start #1\nreconcile ns-a/p\nreconcile ns-b/p\nkey-x created\n=== start #2\nns-a done\n";
        let needles: Vec<String> = needles.iter().map(|n| (*n).to_owned()).collect();
        assert_eq!(lines_mentioning(log, &needles, max), expected);
    }

    #[test]
    fn long_files_keep_their_end_and_say_so() {
        assert_eq!(capped("short", 10), "short");
        let cut = capped("0123456789abcdef", 6);
        assert!(
            cut.starts_with("… the first 10 bytes are left out"),
            "{cut}"
        );
        assert!(cut.ends_with("\nabcdef"), "{cut}");
        // A multi-byte character is never split.
        assert!(capped("ééééé", 3).ends_with("é"));
    }

    #[test]
    fn colour_codes_are_stripped() {
        assert_eq!(
            strip_ansi("\u{1b}[2m2026\u{1b}[0m \u{1b}[33m WARN\u{1b}[0m done"),
            "2026  WARN done"
        );
    }

    #[test]
    fn secret_data_is_replaced_by_its_size() {
        let secret =
            json!({"metadata": {"name": "k", "managedFields": []}, "data": {"key": "c2VjcmV0"}});
        let redacted = redact_secret(secret);
        assert_eq!(
            redacted["data"]["key"],
            json!("<redacted> (8 base64 characters)")
        );
        assert!(redacted["metadata"].get("managedFields").is_none());
    }

    #[test]
    fn known_secrets_are_masked_everywhere() {
        let text = "token=abcdef123 and again abcdef123, short=xy";
        assert_eq!(
            mask(text, &["abcdef123".into(), "xy".into()]),
            "token=<redacted> and again <redacted>, short=xy"
        );
    }
}
