//! Rendering kubeconfig files (pure) and writing them privately.
use std::io::Write;
use std::path::Path;

use anyhow::Context;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::json;

/// How to reach an API server: what a kubeconfig's `cluster` entry holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterEndpoint {
    /// e.g. `https://127.0.0.1:6443`
    pub server_url: String,
    /// PEM bundle of the CA that signed the serving certificate; `None` = system roots.
    pub ca_pem: Option<String>,
    /// `insecure-skip-tls-verify` (only ever copied from a user-supplied kubeconfig).
    pub insecure: bool,
}

impl ClusterEndpoint {
    /// The endpoint of an already loaded client configuration (e.g. the user's kubeconfig).
    pub fn from_config(config: &kube::Config) -> Self {
        let ca_pem = config.root_cert.as_ref().map(|certs| {
            certs
                .iter()
                .map(|der| der_to_pem("CERTIFICATE", der))
                .collect::<String>()
        });
        Self {
            server_url: config
                .cluster_url
                .to_string()
                .trim_end_matches('/')
                .to_owned(),
            ca_pem,
            insecure: config.accept_invalid_certs,
        }
    }
}

/// Who the kubeconfig authenticates as.
pub enum Credentials<'a> {
    /// A client certificate and its private key (PEM).
    ClientCertificate { cert_pem: &'a str, key_pem: &'a str },
    /// A bearer token (e.g. a ServiceAccount token from the TokenRequest API).
    Token(&'a str),
}

// Deliberately no Debug derive with the secret: the token and key never reach a log.
impl std::fmt::Debug for Credentials<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::ClientCertificate { .. } => f.write_str("ClientCertificate(<redacted>)"),
            Self::Token(_) => f.write_str("Token(<redacted>)"),
        }
    }
}

/// A single-context kubeconfig (YAML) named `name` for `endpoint` and `credentials`.
pub fn render(
    endpoint: &ClusterEndpoint,
    name: &str,
    credentials: &Credentials<'_>,
) -> anyhow::Result<String> {
    let mut cluster = json!({ "server": endpoint.server_url });
    if let Some(ca) = &endpoint.ca_pem {
        cluster["certificate-authority-data"] = json!(BASE64.encode(ca));
    }
    if endpoint.insecure {
        cluster["insecure-skip-tls-verify"] = json!(true);
    }
    let user = match credentials {
        Credentials::ClientCertificate { cert_pem, key_pem } => json!({
            "client-certificate-data": BASE64.encode(cert_pem),
            "client-key-data": BASE64.encode(key_pem),
        }),
        Credentials::Token(token) => json!({ "token": token }),
    };
    let document = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": name, "cluster": cluster }],
        "users": [{ "name": name, "user": user }],
        "contexts": [{ "name": name, "context": { "cluster": name, "user": name } }],
        "current-context": name,
    });
    serde_saphyr::to_string(&document).context("serialising kubeconfig")
}

/// Writes a file readable only by the current user (kubeconfigs and keys hold secrets).
pub fn write_private(path: &Path, contents: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::File::options()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    file.write_all(contents.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

/// Loads a kubeconfig file into a client configuration (no environment lookups).
pub async fn load_config(path: &Path) -> anyhow::Result<kube::Config> {
    let kubeconfig = kube::config::Kubeconfig::read_from(path)
        .with_context(|| format!("reading kubeconfig {}", path.display()))?;
    kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
        .await
        .with_context(|| format!("loading kubeconfig {}", path.display()))
}

/// Where a pod's ServiceAccount credentials are mounted.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// A kubeconfig for the pod's own ServiceAccount (the suite run in a pod, as `helm test` runs it),
/// or `None` outside a pod: the API server from `KUBERNETES_SERVICE_HOST`/`_PORT`, the mounted CA,
/// and the mounted token by its path (`tokenFile`, re-read by kube and kubectl as it rotates), so
/// the file holds no secret. Pure: `host` and `port` are the environment's values.
pub fn in_cluster_kubeconfig(
    host: Option<&str>,
    port: Option<&str>,
    service_account_dir: &Path,
) -> Option<String> {
    let host = host.filter(|h| !h.is_empty())?;
    let port = port.filter(|p| !p.is_empty()).unwrap_or("443");
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_owned()
    };
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "in-cluster", "cluster": {
            "server": format!("https://{host}:{port}"),
            "certificate-authority": service_account_dir.join("ca.crt"),
        }}],
        "users": [{"name": "service-account", "user": {
            "tokenFile": service_account_dir.join("token"),
        }}],
        "contexts": [{"name": "in-cluster", "context": {
            "cluster": "in-cluster", "user": "service-account",
            "namespace": std::fs::read_to_string(service_account_dir.join("namespace"))
                .map(|n| n.trim().to_owned())
                .unwrap_or_else(|_| "default".to_owned()),
        }}],
        "current-context": "in-cluster",
    });
    Some(serde_json::to_string_pretty(&config).expect("a kubeconfig serializes"))
}

/// A client for a kubeconfig file. Installs the ring TLS provider if none is installed yet.
pub async fn client_from_file(path: &Path) -> anyhow::Result<kube::Client> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = load_config(path).await?;
    kube::Client::try_from(config).context("building a Kubernetes client")
}

fn der_to_pem(label: &str, der: &[u8]) -> String {
    let encoded = BASE64.encode(der);
    let mut pem = format!("-----BEGIN {label}-----\n");
    for chunk in encoded.as_bytes().chunks(64) {
        pem.push_str(&String::from_utf8_lossy(chunk));
        pem.push('\n');
    }
    pem.push_str(&format!("-----END {label}-----\n"));
    pem
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::config::Kubeconfig;

    #[test]
    fn in_a_pod_the_kubeconfig_names_the_mounted_token_and_ca() {
        assert_eq!(
            in_cluster_kubeconfig(None, Some("443"), Path::new("/sa")),
            None
        );
        assert_eq!(
            in_cluster_kubeconfig(Some(""), None, Path::new("/sa")),
            None
        );
        let dir = tempfile::tempdir().expect("a folder");
        std::fs::write(dir.path().join("namespace"), "coder-system\n").expect("namespace");
        let yaml =
            in_cluster_kubeconfig(Some("10.96.0.1"), Some("443"), dir.path()).expect("in a pod");
        let config = Kubeconfig::from_yaml(&yaml).expect("a kubeconfig");
        let cluster = config.clusters[0].cluster.as_ref().expect("a cluster");
        assert_eq!(cluster.server.as_deref(), Some("https://10.96.0.1:443"));
        assert_eq!(
            cluster.certificate_authority.as_deref(),
            Some(dir.path().join("ca.crt").to_str().expect("UTF-8"))
        );
        let user = config.auth_infos[0].auth_info.as_ref().expect("a user");
        assert_eq!(
            user.token_file.as_deref(),
            Some(dir.path().join("token").to_str().expect("UTF-8"))
        );
        assert!(user.token.is_none(), "the token itself is not in the file");
        let context = config.contexts[0].context.as_ref().expect("a context");
        assert_eq!(context.namespace.as_deref(), Some("coder-system"));
        let ipv6 =
            in_cluster_kubeconfig(Some("fd00::1"), None, Path::new("/sa")).expect("in a pod");
        assert!(ipv6.contains("https://[fd00::1]:443"), "{ipv6}");
    }

    fn endpoint() -> ClusterEndpoint {
        ClusterEndpoint {
            server_url: "https://127.0.0.1:6443".into(),
            ca_pem: Some("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".into()),
            insecure: false,
        }
    }

    #[test]
    fn token_kubeconfig_round_trips_through_kube() {
        let yaml = render(&endpoint(), "operator", &Credentials::Token("t0ken")).expect("render");
        let parsed = Kubeconfig::from_yaml(&yaml).expect("kube parses it");
        assert_eq!(parsed.current_context.as_deref(), Some("operator"));
        let cluster = parsed.clusters[0].cluster.as_ref().expect("cluster");
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.0.1:6443"));
        let ca = BASE64
            .decode(
                cluster
                    .certificate_authority_data
                    .as_deref()
                    .expect("ca data"),
            )
            .expect("base64");
        assert_eq!(
            String::from_utf8(ca).expect("utf8"),
            endpoint().ca_pem.expect("ca")
        );
        let user = parsed.auth_infos[0].auth_info.as_ref().expect("user");
        assert!(user.token.is_some());
        assert!(user.client_certificate_data.is_none());
    }

    #[test]
    fn client_certificate_kubeconfig_carries_both_halves() {
        let credentials = Credentials::ClientCertificate {
            cert_pem: "CERT",
            key_pem: "KEY",
        };
        let yaml = render(&endpoint(), "admin", &credentials).expect("render");
        let parsed = Kubeconfig::from_yaml(&yaml).expect("kube parses it");
        let user = parsed.auth_infos[0].auth_info.as_ref().expect("user");
        assert_eq!(
            user.client_certificate_data.as_deref(),
            Some(BASE64.encode("CERT").as_str())
        );
        assert!(user.client_key_data.is_some());
        assert!(user.token.is_none());
    }

    #[test]
    fn secrets_stay_out_of_debug_output() {
        let shown = format!("{:?}", Credentials::Token("t0ken"));
        assert!(!shown.contains("t0ken"), "{shown}");
    }

    #[test]
    fn der_is_wrapped_at_64_columns() {
        let pem = der_to_pem("CERTIFICATE", &[7u8; 100]);
        let body: Vec<&str> = pem
            .lines()
            .skip(1)
            .take_while(|l| !l.starts_with("-----"))
            .collect();
        assert_eq!(
            body.iter().map(|l| l.len()).collect::<Vec<_>>(),
            vec![64, 64, 8]
        );
    }
}
