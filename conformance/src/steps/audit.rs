//! Steps that count the operator's own Kubernetes API requests, read from the API server's audit
//! log. Only the local tier writes one (the suite starts kube-apiserver there); scenarios tagged
//! `@api-audit` are reported skipped elsewhere.
use std::collections::BTreeMap;

use anyhow::{Context as _, anyhow, bail};
use cucumber::then;
use serde_json::Value;

use super::provisioner::WRITER_ANNOTATION;
use super::str_at;
use crate::wait;
use crate::world::ProvisionerWorld;

/// R-W-4: the requests the operator's ServiceAccount made in the scenario's namespace while the
/// background writer ("someone keeps annotating the provisioner") rewrote the CR's annotation
/// `writes` more times: the audit log's events that ended in that window.
///
/// Why a bound like 25 for 100 writes: a pass costs an operator several requests (this one
/// reads its CR, the control plane, the token Secret and its children: five or more), so one
/// that starts a pass per foreign write makes hundreds, and one that merges the writes that
/// arrive during a pass still makes a hundred or more at 20 writes a second. One that ignores
/// them makes none, or those of a few passes already due when the window opened (the follow-up
/// of its own last status write, say).
#[then(
    expr = "the operator makes at most {int} API requests in the namespace while the provisioner is annotated {int} more times"
)]
async fn requests_while_annotated(
    world: &mut ProvisionerWorld,
    most: usize,
    writes: u64,
) -> anyhow::Result<()> {
    let (log, user) = audit_log_and_operator(world).await?;
    let first = writes_so_far(world).await?;
    let opened = std::fs::metadata(&log)
        .with_context(|| format!("reading {}", log.display()))?
        .len();
    let world = &*world;
    wait::eventually(
        &format!("{writes} more writes of the annotation {WRITER_ANNOTATION}"),
        world.timeouts(),
        || async {
            let now = writes_so_far(world).await?;
            Ok(if now >= first + writes {
                Ok(())
            } else {
                Err(format!("{} of {writes} written", now - first))
            })
        },
    )
    .await?;
    let text =
        std::fs::read_to_string(&log).with_context(|| format!("reading {}", log.display()))?;
    let (before, during) = split_at_line(&text, usize::try_from(opened)?);
    if requests_by(before, &user, &world.namespace)?.is_empty() {
        bail!(
            "the audit log {} holds no request of {user} in namespace {} before the window, \
             though the operator made the provisioner Ready: it cannot count the operator's requests",
            log.display(),
            world.namespace
        );
    }
    let requests = requests_by(during, &user, &world.namespace)?;
    let total: usize = requests.values().sum();
    if total > most {
        let listed = requests
            .iter()
            .map(|(what, n)| format!("{what} ×{n}"))
            .collect::<Vec<_>>()
            .join(", ");
        bail!(
            "{user} made {total} API requests in namespace {} while the annotation was rewritten \
             {writes} times (at most {most} expected): {listed}",
            world.namespace
        );
    }
    Ok(())
}

/// R-KEY-7: the key's record reaches the CR's status right after the key Secret is written and
/// before the ServiceAccount, Role, RoleBinding and Deployment: in the audit log, the operator's
/// first write of the key Secret is followed by a status write of the CR before its first write
/// of any of those.
#[then(
    "the operator wrote the provisioner's status after its key Secret and before its other children"
)]
async fn key_recorded_before_children(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let (log, user) = audit_log_and_operator(world).await?;
    let text =
        std::fs::read_to_string(&log).with_context(|| format!("reading {}", log.display()))?;
    let writes = writes_by(&text, &user, &world.namespace)?;
    match key_record_order(&writes) {
        Ok(()) => Ok(()),
        Err(why) => bail!(
            "{why}; the operator's writes in order: {}",
            writes.join(", ")
        ),
    }
}

/// The write requests (`create`, `update`, `patch`) of `user` in `namespace`, in log order, as
/// `"<resource>[/<subresource>]"`.
fn writes_by(events: &str, user: &str, namespace: &str) -> anyhow::Result<Vec<String>> {
    let mut writes = Vec::new();
    for line in events.lines().filter(|l| l.contains(namespace)) {
        let Ok(event) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if str_at(&event, "/user/username") != Some(user)
            || str_at(&event, "/objectRef/namespace") != Some(namespace)
            || !matches!(str_at(&event, "/verb"), Some("create" | "update" | "patch"))
            || str_at(&event, "/stage") != Some("ResponseComplete")
        {
            continue;
        }
        let resource = str_at(&event, "/objectRef/resource").unwrap_or("?");
        writes.push(match str_at(&event, "/objectRef/subresource") {
            Some(sub) => format!("{resource}/{sub}"),
            None => resource.to_owned(),
        });
    }
    Ok(writes)
}

/// The writes of `user` the API server accepted (`create`, `update`, `patch`, `delete` answered
/// below 400, dry runs left out), in any namespace, except its Lease's: as
/// `"<verb> <resource>[/<subresource>] <namespace>/<name>"`. Lines still being written are left
/// out.
pub(super) fn accepted_writes_by(events: &str, user: &str) -> Vec<String> {
    let complete = events.rfind('\n').map_or("", |end| &events[..end]);
    complete
        .lines()
        .filter(|line| line.contains(user))
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|event| {
            str_at(event, "/user/username") == Some(user)
                && str_at(event, "/stage") == Some("ResponseComplete")
                && matches!(
                    str_at(event, "/verb"),
                    Some("create" | "update" | "patch" | "delete")
                )
                && str_at(event, "/objectRef/resource") != Some("leases")
                && !str_at(event, "/requestURI").is_some_and(|uri| uri.contains("dryRun="))
                && event
                    .pointer("/responseStatus/code")
                    .and_then(Value::as_u64)
                    .is_some_and(|code| code < 400)
        })
        .map(|event| {
            let resource = match (
                str_at(&event, "/objectRef/resource"),
                str_at(&event, "/objectRef/subresource"),
            ) {
                (Some(resource), Some(sub)) => format!("{resource}/{sub}"),
                (resource, _) => resource.unwrap_or("?").to_owned(),
            };
            format!(
                "{} {resource} {}/{}",
                str_at(&event, "/verb").unwrap_or("?"),
                str_at(&event, "/objectRef/namespace").unwrap_or_default(),
                str_at(&event, "/objectRef/name").unwrap_or_default()
            )
        })
        .collect()
}

/// Pure part of [`key_recorded_before_children`].
fn key_record_order(writes: &[String]) -> Result<(), String> {
    const LATER: [&str; 4] = ["serviceaccounts", "roles", "rolebindings", "deployments"];
    let secret = writes
        .iter()
        .position(|w| w == "secrets")
        .ok_or("no write of a Secret")?;
    let first_later = writes
        .iter()
        .position(|w| LATER.contains(&w.as_str()))
        .ok_or("no write of the ServiceAccount, Role, RoleBinding or Deployment")?;
    let recorded = writes[secret..]
        .iter()
        .position(|w| w == "coderprovisioners/status")
        .map(|at| secret + at);
    match recorded {
        Some(at) if at < first_later => Ok(()),
        _ if first_later < secret => Err(format!(
            "{} was written before the key Secret",
            writes[first_later]
        )),
        _ => Err(format!(
            "the status was not written between the key Secret and the first {}",
            writes[first_later]
        )),
    }
}

/// The API server's audit log and the user name the operator's requests carry in it.
async fn audit_log_and_operator(
    world: &ProvisionerWorld,
) -> anyhow::Result<(std::path::PathBuf, String)> {
    let log = world
        .env
        .audit_log
        .clone()
        .ok_or_else(|| anyhow!("no audit log: the suite reads one only on the local tier"))?;
    let (namespace, name) = world.operator_service_account().await?;
    Ok((log, format!("system:serviceaccount:{namespace}:{name}")))
}

/// The writer's count, from the annotation's current value (the writer may not have written yet).
async fn writes_so_far(world: &ProvisionerWorld) -> anyhow::Result<u64> {
    let cr = world
        .provisioner_json()
        .await?
        .ok_or_else(|| anyhow!("the CoderProvisioner does not exist"))?;
    let pointer = format!(
        "/metadata/annotations/{}",
        WRITER_ANNOTATION.replace('/', "~1")
    );
    Ok(str_at(&cr, &pointer)
        .map(str::parse::<u64>)
        .transpose()
        .with_context(|| format!("the annotation {WRITER_ANNOTATION}"))?
        .map_or(0, |n| n + 1))
}

/// `text` cut at the start of the line holding byte `at`: a line being written when the window
/// opened belongs to the window.
fn split_at_line(text: &str, at: usize) -> (&str, &str) {
    let at = at.min(text.len());
    let cut = text.as_bytes()[..at]
        .iter()
        .rposition(|b| *b == b'\n')
        .map_or(0, |i| i + 1);
    text.split_at(cut)
}

/// The audit events of `user` on objects in `namespace`, counted by verb and resource. The last
/// line is ignored when it has no line break yet (still being written).
fn requests_by(
    events: &str,
    user: &str,
    namespace: &str,
) -> anyhow::Result<BTreeMap<String, usize>> {
    let complete = match events.rfind('\n') {
        Some(end) => &events[..end],
        None => "",
    };
    let mut counted = BTreeMap::new();
    for line in complete.lines().filter(|l| l.contains(namespace)) {
        let event: Value = serde_json::from_str(line)
            .with_context(|| format!("an audit log line is not a JSON event: {line}"))?;
        if str_at(&event, "/user/username") != Some(user)
            || str_at(&event, "/objectRef/namespace") != Some(namespace)
        {
            continue;
        }
        let resource = match (
            str_at(&event, "/objectRef/resource"),
            str_at(&event, "/objectRef/subresource"),
        ) {
            (Some(resource), Some(sub)) => format!("{resource}/{sub}"),
            (resource, _) => resource.unwrap_or("?").to_owned(),
        };
        let verb = str_at(&event, "/verb").unwrap_or("?");
        *counted.entry(format!("{verb} {resource}")).or_default() += 1;
    }
    Ok(counted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_record_comes_between_the_secret_and_the_other_children() {
        let order =
            |w: &[&str]| key_record_order(&w.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert!(
            order(&[
                "coderprovisioners",
                "secrets",
                "coderprovisioners/status",
                "serviceaccounts",
                "deployments"
            ])
            .is_ok()
        );
        assert!(
            order(&[
                "secrets",
                "serviceaccounts",
                "coderprovisioners/status",
                "roles"
            ])
            .is_err()
        );
        assert!(order(&["serviceaccounts", "secrets", "coderprovisioners/status"]).is_err());
    }

    fn event(user: &str, namespace: &str, verb: &str, resource: &str) -> String {
        serde_json::json!({
            "kind": "Event", "stage": "ResponseComplete", "verb": verb,
            "user": {"username": user},
            "objectRef": {"namespace": namespace, "resource": resource},
        })
        .to_string()
    }

    #[test]
    fn only_the_users_requests_in_the_namespace_count() {
        let operator = "system:serviceaccount:ops:operator";
        let log = [
            event(operator, "s1", "get", "coderprovisioners"),
            event(operator, "s1", "get", "coderprovisioners"),
            event(operator, "s1", "patch", "deployments"),
            event(operator, "s2", "get", "coderprovisioners"),
            event("system:serviceaccount:s1:other", "s1", "get", "secrets"),
        ]
        .join("\n")
            + "\n";
        let counted = requests_by(&log, operator, "s1").unwrap();
        assert_eq!(
            counted,
            BTreeMap::from([
                ("get coderprovisioners".to_owned(), 2),
                ("patch deployments".to_owned(), 1)
            ])
        );
    }

    #[test]
    fn accepted_writes_leave_out_reads_refusals_dry_runs_and_the_lease() {
        let user = "system:serviceaccount:ops:replica-b";
        let with = |verb: &str, resource: &str, code: u64, uri: &str| {
            serde_json::json!({
                "stage": "ResponseComplete", "verb": verb, "requestURI": uri,
                "user": {"username": user},
                "objectRef": {"namespace": "s1", "name": "x", "resource": resource},
                "responseStatus": {"code": code},
            })
            .to_string()
        };
        let log = [
            with("get", "secrets", 200, "/api/v1/namespaces/s1/secrets/x"),
            with("patch", "secrets", 409, "/api/v1/namespaces/s1/secrets/x"),
            with(
                "patch",
                "secrets",
                200,
                "/api/v1/namespaces/s1/secrets/x?dryRun=All",
            ),
            with(
                "update",
                "leases",
                200,
                "/apis/coordination.k8s.io/v1/namespaces/ops/leases/l",
            ),
            with(
                "create",
                "events",
                201,
                "/apis/events.k8s.io/v1/namespaces/s1/events",
            ),
            with(
                "patch",
                "deployments",
                200,
                "/apis/apps/v1/namespaces/s1/deployments/x",
            ),
        ]
        .join("\n")
            + "\n";
        assert_eq!(
            accepted_writes_by(&log, user),
            ["create events s1/x", "patch deployments s1/x"]
        );
    }

    #[test]
    fn a_line_still_being_written_is_left_out_and_a_broken_one_is_an_error() {
        let operator = "u";
        let whole = event(operator, "s1", "get", "secrets");
        let partial = format!("{whole}\n{}", &whole[..20]);
        assert_eq!(requests_by(&partial, operator, "s1").unwrap().len(), 1);
        let broken = format!("{{\"s1\": \n{whole}\n");
        assert!(requests_by(&broken, operator, "s1").is_err());
    }

    #[test]
    fn the_window_starts_at_the_line_being_written_when_it_opened() {
        let text = "one\ntwo\nthree\n";
        assert_eq!(split_at_line(text, 4), ("one\n", "two\nthree\n"));
        assert_eq!(split_at_line(text, 6), ("one\n", "two\nthree\n"));
        assert_eq!(split_at_line(text, 0), ("", text));
        assert_eq!(split_at_line(text, 99), (text, ""));
    }
}
