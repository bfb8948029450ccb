//! A pause between two of the operator's Kubernetes writes, whatever their order: a validating
//! admission webhook the suite serves holds back the first write of one resource kind that a
//! leader-elected replica makes in the scenario's namespace, so that a step can freeze that
//! replica (SIGSTOP) while the API server waits. The held write is then allowed (it is accepted
//! before the pause ends, so it is no deposed replica's write); the replica is frozen right after
//! it, before its next write.
//!
//! Only on the local tier: its API server runs on this host and reaches the webhook on 127.0.0.1.
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use base64::Engine as _;
use cucumber::when;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};

use super::str_at;
use crate::cluster::pki::Authority;
use crate::report::not_applicable::DOES_NOT_APPLY;
use crate::wait;
use crate::world::ProvisionerWorld;

/// The kind of the suite's own dry-run probe, which tells when the API server calls the webhook.
const PROBE_RESOURCE: &str = "configmaps";
const PROBE_NAME: &str = "conformance-write-hold-probe";

/// What the webhook holds back and what it saw.
#[derive(Debug, Default)]
struct HoldState {
    /// `<resource>` as the API server names it (`deployments`, `rolebindings`, …).
    resource: String,
    namespace: String,
    /// The replicas' user names: only their writes are held.
    users: BTreeSet<String>,
    delay: Duration,
    /// The user whose write was held (the hold is spent then).
    held: Option<String>,
}

impl HoldState {
    /// How long to hold the write `request` (an AdmissionRequest) back, if at all; spends the hold.
    fn hold_for(&mut self, request: &Value) -> Option<Duration> {
        let user = str_at(request, "/userInfo/username")?;
        let matches = self.held.is_none()
            && self.users.contains(user)
            && str_at(request, "/namespace") == Some(self.namespace.as_str())
            && str_at(request, "/resource/resource") == Some(self.resource.as_str())
            && str_at(request, "/subResource").is_none_or(str::is_empty)
            && request.get("dryRun").and_then(Value::as_bool) != Some(true);
        matches.then(|| {
            self.held = Some(user.to_owned());
            self.delay
        })
    }
}

/// The webhook of one scenario: its server and its configuration in the cluster.
pub struct WriteHold {
    state: Arc<Mutex<HoldState>>,
    probes: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    address: SocketAddr,
    configuration: String,
}

impl WriteHold {
    fn state(&self) -> std::sync::MutexGuard<'_, HoldState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The user whose write is (or was) held.
    pub fn held_user(&self) -> Option<String> {
        self.state().held.clone()
    }

    /// Removes the webhook's configuration and stops its server (the after-hook).
    pub async fn remove(self, client: kube::Client) -> anyhow::Result<()> {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop, which then sees the stop.
        let _ = TcpStream::connect(self.address);
        let api: Api<ValidatingWebhookConfiguration> = Api::all(client);
        match api
            .delete(&self.configuration, &DeleteParams::default())
            .await
        {
            Ok(_) | Err(kube::Error::Api(_)) => Ok(()),
            Err(error) => Err(error.into()),
        }
    }
}

/// Serves the webhook on a loopback port with a certificate of its own authority.
fn serve(
    state: Arc<Mutex<HoldState>>,
    probes: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<(SocketAddr, String)> {
    let authority = Authority::generate("conformance-write-hold")?;
    let served = authority.serving_cert("conformance-write-hold", &["127.0.0.1".to_owned()])?;
    let certs = CertificateDer::pem_slice_iter(served.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .context("the webhook's certificate")?;
    let key =
        PrivateKeyDer::from_pem_slice(served.key_pem.as_bytes()).context("the webhook's key")?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(certs, key)?;
    let config = Arc::new(config);
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let address = listener.local_addr()?;
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            let Ok(stream) = stream else { continue };
            let (config, state, probes) = (config.clone(), state.clone(), probes.clone());
            // One thread per connection: a held answer blocks only its own connection.
            std::thread::spawn(move || {
                if let Err(error) = answer(stream, config, &state, &probes) {
                    tracing::debug!(%error, "write-hold webhook connection ended");
                }
            });
        }
    });
    Ok((address, authority.ca_pem().to_owned()))
}

/// Answers the AdmissionReviews of one connection (HTTP/1.1, kept alive): every write is
/// allowed, the one to hold after its delay.
fn answer(
    stream: TcpStream,
    config: Arc<rustls::ServerConfig>,
    state: &Mutex<HoldState>,
    probes: &AtomicUsize,
) -> anyhow::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(120)))?;
    let connection = rustls::ServerConnection::new(config)?;
    let mut reader = BufReader::new(rustls::StreamOwned::new(connection, stream));
    loop {
        let mut length = None;
        let mut line = String::new();
        loop {
            line.clear();
            if reader.read_line(&mut line)? == 0 {
                return Ok(());
            }
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = Some(value.trim().parse::<usize>()?);
            }
        }
        let mut body = vec![0; length.ok_or_else(|| anyhow!("no Content-Length"))?];
        reader.read_exact(&mut body)?;
        let review: Value = serde_json::from_slice(&body)?;
        let request = review.get("request").cloned().unwrap_or_default();
        if str_at(&request, "/resource/resource") == Some(PROBE_RESOURCE) {
            probes.fetch_add(1, Ordering::SeqCst);
        }
        let hold = state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .hold_for(&request);
        if let Some(delay) = hold {
            std::thread::sleep(delay);
        }
        let verdict = json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {"uid": request.get("uid"), "allowed": true},
        })
        .to_string();
        let stream = reader.get_mut();
        write!(
            stream,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{verdict}",
            verdict.len()
        )?;
        stream.flush()?;
    }
}

/// The webhook's configuration: writes of `resource` (and the probe's kind) in `namespace` only;
/// a webhook that fails or is gone lets every write through.
fn configuration(
    name: &str,
    namespace: &str,
    resource: &str,
    address: SocketAddr,
    ca_pem: &str,
) -> anyhow::Result<ValidatingWebhookConfiguration> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": "write-hold.conformance.coder.com",
            "clientConfig": {
                "url": format!("https://{address}/hold"),
                "caBundle": base64::engine::general_purpose::STANDARD.encode(ca_pem),
            },
            "rules": [{
                "operations": ["CREATE", "UPDATE"],
                "apiGroups": ["*"],
                "apiVersions": ["*"],
                "resources": [resource, PROBE_RESOURCE],
                "scope": "Namespaced",
            }],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "failurePolicy": "Ignore",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 10,
        }],
    }))?)
}

/// Holds the first write of `resource` (as the API server names it: `deployments`,
/// `rolebindings`, …) that a replica makes in the scenario's namespace for `seconds`; returns
/// once the API server calls the webhook.
#[when(expr = "the API server holds the first write of {string} by a replica for {int} seconds")]
async fn hold_first_write(
    world: &mut ProvisionerWorld,
    resource: String,
    seconds: u64,
) -> anyhow::Result<()> {
    if world.env.audit_log.is_none() {
        bail!(
            "{DOES_NOT_APPLY}only the local tier's API server reaches a webhook the suite serves \
             on this host (and keeps the audit log that tells the deposed replica's writes apart)"
        );
    }
    if world.replicas.is_empty() {
        bail!("no replicas run: the hold is for their writes");
    }
    let users = world
        .replicas
        .iter()
        .map(|replica| {
            let (namespace, account) = replica.service_account();
            format!("system:serviceaccount:{namespace}:{account}")
        })
        .collect();
    let state = Arc::new(Mutex::new(HoldState {
        resource: resource.clone(),
        namespace: world.namespace.clone(),
        users,
        delay: Duration::from_secs(seconds),
        held: None,
    }));
    let (probes, stop) = (Arc::default(), Arc::default());
    let (address, ca_pem) = serve(state.clone(), Arc::clone(&probes), Arc::clone(&stop))?;
    let name = format!("conformance-write-hold-{}", world.namespace);
    let api: Api<ValidatingWebhookConfiguration> = Api::all(world.client());
    api.create(
        &PostParams::default(),
        &configuration(&name, &world.namespace, &resource, address, &ca_pem)?,
    )
    .await
    .context("creating the write-hold webhook's configuration")?;
    let hold = WriteHold {
        state,
        probes,
        stop,
        address,
        configuration: name,
    };
    let probes = Arc::clone(&hold.probes);
    world.write_hold = Some(hold);
    // The API server picks a new configuration up a moment later: a dry-run write of the probe's
    // kind shows when it calls the webhook.
    let config_maps: Api<ConfigMap> = Api::namespaced(world.client(), &world.namespace);
    let probe: ConfigMap = serde_json::from_value(json!({"metadata": {"name": PROBE_NAME}}))?;
    wait::eventually(
        "the API server to call the write-hold webhook",
        world.timeouts(),
        || async {
            config_maps
                .create(
                    &PostParams {
                        dry_run: true,
                        ..PostParams::default()
                    },
                    &probe,
                )
                .await?;
            Ok(if probes.load(Ordering::SeqCst) > 0 {
                Ok(())
            } else {
                Err("the webhook has not been called yet".to_owned())
            })
        },
    )
    .await
}

/// Pauses the replica whose write the webhook holds, while the API server waits for it.
#[when("the leader is paused as soon as the API server holds its write")]
async fn pause_the_held_writer(world: &mut ProvisionerWorld) -> anyhow::Result<()> {
    let world_ref = &*world;
    let hold = world_ref
        .write_hold
        .as_ref()
        .ok_or_else(|| anyhow!("no write is to be held"))?;
    let user = wait::eventually(
        "a replica's write to be held",
        world_ref.timeouts(),
        || async {
            Ok(hold
                .held_user()
                .ok_or_else(|| "no write held yet".to_owned()))
        },
    )
    .await?;
    let index = world
        .replicas
        .iter()
        .position(|replica| {
            let (namespace, account) = replica.service_account();
            user == format!("system:serviceaccount:{namespace}:{account}")
        })
        .ok_or_else(|| anyhow!("the held write is of {user}, no replica"))?;
    world.replicas[index].pause();
    let name = world.replicas[index].name().to_owned();
    super::leadership::remember_paused(world, name);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(user: &str, resource: &str, sub: Option<&str>, dry_run: bool) -> Value {
        json!({
            "uid": "u", "userInfo": {"username": user}, "namespace": "s1",
            "resource": {"group": "apps", "version": "v1", "resource": resource},
            "subResource": sub, "dryRun": dry_run,
        })
    }

    #[test]
    fn only_the_first_real_write_of_the_kind_by_a_replica_is_held() {
        let mut state = HoldState {
            resource: "deployments".to_owned(),
            namespace: "s1".to_owned(),
            users: BTreeSet::from(["replica-a".to_owned()]),
            delay: Duration::from_secs(2),
            held: None,
        };
        assert_eq!(
            state.hold_for(&request("someone", "deployments", None, false)),
            None
        );
        assert_eq!(
            state.hold_for(&request("replica-a", "deployments", None, true)),
            None
        );
        assert_eq!(
            state.hold_for(&request("replica-a", "deployments", Some("status"), false)),
            None
        );
        assert_eq!(
            state.hold_for(&request("replica-a", "secrets", None, false)),
            None
        );
        assert_eq!(
            state.hold_for(&request("replica-a", "deployments", None, false)),
            Some(Duration::from_secs(2))
        );
        assert_eq!(state.held.as_deref(), Some("replica-a"));
        assert_eq!(
            state.hold_for(&request("replica-a", "deployments", None, false)),
            None
        );
    }
}
