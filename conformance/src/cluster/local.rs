//! A throw-away Kubernetes control plane on loopback: etcd, kube-apiserver (RBAC on) and, by
//! default, kube-controller-manager running only the garbage-collector and namespace controllers
//! so owner-reference cleanup and namespace deletion behave as in a real cluster. There are no
//! kubelets: nothing runs pods (see [`crate::kubelet`] for the readiness stand-in, contract D-8).
//! kube-apiserver writes an audit log of the requests made with ServiceAccount tokens, so the
//! suite can count the requests the operator under test makes ([`AUDIT_LOG`]).
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};

use super::binaries;
use super::children::{self, DEFAULT_GRACE, ManagedChild};
use super::kubeconfig::{self, ClusterEndpoint, Credentials};
use super::pki::{self, Authority};

/// Namespace and name of the ConfigMap that marks a control plane started by this module.
/// [`crate::kubelet::ReadinessSimulator`] refuses to run on a cluster without it.
pub const LOCAL_MARKER: (&str, &str) = ("kube-system", "coder-conformance-local-control-plane");

/// Controllers run by the local kube-controller-manager: just enough for ownerReference garbage
/// collection and namespace deletion; no ReplicaSets or pods (there are no kubelets).
pub const CONTROLLERS: &str = "garbage-collector-controller,namespace-controller";

/// Service range handed to kube-apiserver; [`pki::SERVICE_IP`] is its first address.
const SERVICE_RANGE: &str = "10.0.0.0/24";

/// The audit log in the scratch folder: one JSON line per completed request made with a
/// ServiceAccount token, at level Metadata (who, verb, object; never a body).
pub const AUDIT_LOG: &str = "audit.log";

/// Only ServiceAccounts are audited. The operator's is not known when the API server starts (its
/// RBAC is applied later), and nothing else here authenticates as one: no kubelets run pods,
/// and the suite and kube-controller-manager use client certificates. One event per request
/// (at its end), so a line is a request.
const AUDIT_POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
  - level: Metadata
    userGroups: ["system:serviceaccounts"]
  - level: None
"#;
const POLL: Duration = Duration::from_millis(200);

#[derive(Clone, Debug)]
pub struct LocalOptions {
    /// Folder with the binaries; `None` runs [`binaries::resolve`].
    pub binaries_dir: Option<PathBuf>,
    /// Run kube-controller-manager (GC + namespace controllers). Default true.
    pub controller_manager: bool,
    /// Deadline for `/readyz` after the processes are started.
    pub startup_timeout: Duration,
    /// Keep the scratch folder (certs, logs, etcd data) after stopping, for debugging.
    pub keep_files: bool,
    /// Write the audit log of ServiceAccount requests ([`AUDIT_LOG`]). Default true; the bench
    /// turns it off (it reads no audit log, and a blocking log costs the API server time).
    pub audit: bool,
    /// Serve kube-apiserver's `/debug/pprof` (for the bench's profile). Default false.
    pub profiling: bool,
}

impl Default for LocalOptions {
    fn default() -> Self {
        Self {
            binaries_dir: None,
            controller_manager: true,
            startup_timeout: Duration::from_secs(90),
            keep_files: false,
            audit: true,
            profiling: false,
        }
    }
}

/// A running local control plane. Dropping it stops every process and removes its files.
pub struct LocalControlPlane {
    /// In start order; stopped in reverse.
    children: Vec<ManagedChild>,
    dir: PathBuf,
    keep_files: bool,
    binaries: PathBuf,
    authority: Authority,
    endpoint: ClusterEndpoint,
    kubeconfig: PathBuf,
    startup: Duration,
}

impl LocalControlPlane {
    /// Starts etcd, kube-apiserver and (unless disabled) kube-controller-manager and waits until
    /// `/readyz` answers `ok`. On any error everything started so far is stopped and removed.
    ///
    /// Ports are picked free and then handed to the processes, so another process may take one
    /// in between; such a clash is retried with new ports.
    pub async fn start(opts: LocalOptions) -> anyhow::Result<Self> {
        let binaries = match &opts.binaries_dir {
            Some(dir) => dir.clone(),
            None => binaries::resolve().await?,
        };
        let mut attempt = 1;
        loop {
            match Self::start_once(&opts, binaries.clone()).await {
                Err(e) if attempt < PORT_CLASH_ATTEMPTS && is_port_clash(&e) => {
                    tracing::info!(attempt, "a port was taken meanwhile; starting again");
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    async fn start_once(opts: &LocalOptions, binaries: PathBuf) -> anyhow::Result<Self> {
        let begun = Instant::now();
        let authority = Authority::generate("coder-conformance-ca")?;
        let apiserver_port = free_port()?;
        let endpoint = ClusterEndpoint {
            server_url: format!("https://127.0.0.1:{apiserver_port}"),
            ca_pem: Some(authority.ca_pem().to_owned()),
            insecure: false,
        };
        let dir = tempfile::Builder::new()
            .prefix("coder-conformance-cluster-")
            .tempdir()
            .context("creating the control plane's scratch folder")?
            .keep();
        children::register_scratch_dir(&dir);
        // From here on, dropping `plane` cleans up whatever has been started.
        let mut plane = Self {
            children: Vec::new(),
            kubeconfig: dir.join("admin.kubeconfig"),
            dir,
            keep_files: opts.keep_files,
            binaries,
            authority,
            endpoint,
            startup: Duration::ZERO,
        };
        plane.write_files()?;
        let etcd_url = plane.start_etcd()?;
        plane.start_apiserver(apiserver_port, &etcd_url, opts)?;
        let deadline = Instant::now() + opts.startup_timeout;
        let client = plane.wait_ready(deadline).await?;
        plane.mark_local(&client, deadline).await?;
        if opts.controller_manager {
            plane.start_controller_manager()?;
        }
        plane.startup = begun.elapsed();
        tracing::info!(
            server = %plane.endpoint.server_url,
            kubeconfig = %plane.kubeconfig.display(),
            startup_ms = plane.startup.as_millis() as u64,
            "local control plane ready"
        );
        Ok(plane)
    }

    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    pub fn server_url(&self) -> &str {
        &self.endpoint.server_url
    }

    pub fn ca_pem(&self) -> &str {
        self.authority.ca_pem()
    }

    pub fn endpoint(&self) -> &ClusterEndpoint {
        &self.endpoint
    }

    /// A client authenticated as `conformance-admin` in group `system:masters`.
    pub async fn admin_client(&self) -> anyhow::Result<kube::Client> {
        kubeconfig::client_from_file(&self.kubeconfig).await
    }

    /// Pids of the processes this control plane started (each leads its own process group).
    pub fn child_pids(&self) -> Vec<u32> {
        self.children.iter().map(ManagedChild::pid).collect()
    }

    /// Folder holding etcd, kube-apiserver, kubectl (and kube-controller-manager).
    pub fn binaries_dir(&self) -> &Path {
        &self.binaries
    }

    pub fn kubectl(&self) -> PathBuf {
        self.binaries.join("kubectl")
    }

    /// Scratch folder: certificates, kubeconfigs, `*.log` of every process, etcd data.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The API server's audit log of ServiceAccount requests (see [`AUDIT_LOG`]).
    pub fn audit_log_path(&self) -> PathBuf {
        self.dir.join(AUDIT_LOG)
    }

    /// Time from creating the scratch folder to `/readyz` ok (binaries already resolved).
    pub fn startup_duration(&self) -> Duration {
        self.startup
    }

    /// Whether garbage collection and namespace deletion happen on this control plane.
    pub fn has_controller_manager(&self) -> bool {
        self.children
            .iter()
            .any(|c| c.name() == binaries::CONTROLLER_MANAGER)
    }

    /// Writes a kubeconfig for a client-certificate user (`user`, `groups`) signed by this
    /// control plane's CA, e.g. an identity without any RBAC rights.
    pub fn user_kubeconfig(&self, user: &str, groups: &[&str]) -> anyhow::Result<PathBuf> {
        let cert = self.authority.client_cert(user, groups)?;
        let yaml = kubeconfig::render(
            &self.endpoint,
            user,
            &Credentials::ClientCertificate {
                cert_pem: &cert.cert_pem,
                key_pem: &cert.key_pem,
            },
        )?;
        let path = self.dir.join(format!("user-{}.kubeconfig", sanitize(user)));
        kubeconfig::write_private(&path, &yaml)?;
        Ok(path)
    }

    /// Last `lines` lines of each process's log, for diagnostics.
    pub fn log_tails(&self, lines: usize) -> String {
        self.children
            .iter()
            .map(|c| {
                let log = self.dir.join(format!("{}.log", c.name()));
                format!(
                    "--- {} ---\n{}\n",
                    c.name(),
                    children::tail_lines(&log, lines)
                )
            })
            .collect()
    }

    /// Stops the processes (controller manager, API server, etcd) and removes the files.
    pub async fn stop(mut self) {
        while let Some(mut child) = self.children.pop() {
            child.stop(DEFAULT_GRACE).await;
        }
    }

    fn write_files(&self) -> anyhow::Result<()> {
        let serving = self
            .authority
            .serving_cert("kube-apiserver", &pki::apiserver_hosts())?;
        let admin = self
            .authority
            .client_cert("conformance-admin", &["system:masters"])?;
        let (sa_private, sa_public) = pki::service_account_key()?;
        let files = [
            ("ca.crt", self.authority.ca_pem()),
            ("apiserver.crt", serving.cert_pem.as_str()),
            ("apiserver.key", serving.key_pem.as_str()),
            ("sa.key", sa_private.as_str()),
            ("sa.pub", sa_public.as_str()),
            ("audit-policy.yaml", AUDIT_POLICY),
        ];
        for (name, contents) in files {
            kubeconfig::write_private(&self.dir.join(name), contents)?;
        }
        let admin_yaml = kubeconfig::render(
            &self.endpoint,
            "conformance-admin",
            &Credentials::ClientCertificate {
                cert_pem: &admin.cert_pem,
                key_pem: &admin.key_pem,
            },
        )?;
        kubeconfig::write_private(&self.kubeconfig, &admin_yaml)
    }

    /// Starts etcd and returns its client URL.
    fn start_etcd(&mut self) -> anyhow::Result<String> {
        let client = format!("http://127.0.0.1:{}", free_port()?);
        let peer = format!("http://127.0.0.1:{}", free_port()?);
        let data = self.dir.join("etcd-data");
        let args = [
            "--name=conformance".to_owned(),
            format!("--data-dir={}", data.display()),
            format!("--listen-client-urls={client}"),
            format!("--advertise-client-urls={client}"),
            format!("--listen-peer-urls={peer}"),
            format!("--initial-advertise-peer-urls={peer}"),
            format!("--initial-cluster=conformance={peer}"),
            // Throw-away data: durability buys nothing and fsync is slow on shared disks.
            "--unsafe-no-fsync=true".to_owned(),
            "--log-level=warn".to_owned(),
        ];
        self.spawn("etcd", &args)?;
        Ok(client)
    }

    fn start_apiserver(
        &mut self,
        port: u16,
        etcd_url: &str,
        opts: &LocalOptions,
    ) -> anyhow::Result<()> {
        let file = |name: &str| self.dir.join(name).display().to_string();
        let mut args = vec![
            format!("--etcd-servers={etcd_url}"),
            "--bind-address=127.0.0.1".to_owned(),
            "--advertise-address=127.0.0.1".to_owned(),
            format!("--secure-port={port}"),
            format!("--cert-dir={}", file("apiserver-certs")),
            format!("--tls-cert-file={}", file("apiserver.crt")),
            format!("--tls-private-key-file={}", file("apiserver.key")),
            format!("--client-ca-file={}", file("ca.crt")),
            "--authorization-mode=Node,RBAC".to_owned(),
            format!("--service-cluster-ip-range={SERVICE_RANGE}"),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_owned(),
            format!("--service-account-key-file={}", file("sa.pub")),
            format!("--service-account-signing-key-file={}", file("sa.key")),
            // The default reconciler refuses a loopback advertise address; nothing here needs the
            // `kubernetes` Service endpoints.
            "--endpoint-reconciler-type=none".to_owned(),
            "--allow-privileged=true".to_owned(),
            // Saves CPU on small machines; a single client population needs no fairness.
            "--enable-priority-and-fairness=false".to_owned(),
            format!("--profiling={}", opts.profiling),
        ];
        if opts.audit {
            args.extend([
                format!("--audit-policy-file={}", file("audit-policy.yaml")),
                format!("--audit-log-path={}", file(AUDIT_LOG)),
                // Written as each request ends, not batched for seconds: a step that reads the
                // log right after the requests it counts finds them there.
                "--audit-log-mode=blocking".to_owned(),
            ]);
        }
        self.spawn("kube-apiserver", &args)
    }

    fn start_controller_manager(&mut self) -> anyhow::Result<()> {
        if !self.binaries.join(binaries::CONTROLLER_MANAGER).is_file() {
            tracing::warn!(
                binaries = %self.binaries.display(),
                "no kube-controller-manager: garbage collection and namespace deletion will not happen"
            );
            return Ok(());
        }
        let args = [
            format!("--kubeconfig={}", self.kubeconfig.display()),
            format!("--controllers={CONTROLLERS}"),
            "--use-service-account-credentials=false".to_owned(),
            "--leader-elect=false".to_owned(),
            // No HTTPS endpoint: nothing scrapes it and it would need another port.
            "--secure-port=0".to_owned(),
        ];
        self.spawn(binaries::CONTROLLER_MANAGER, &args)
    }

    fn spawn(&mut self, name: &str, args: &[String]) -> anyhow::Result<()> {
        let mut command = tokio::process::Command::new(self.binaries.join(name));
        command.args(args).current_dir(&self.dir);
        let child = ManagedChild::spawn(name, command, &self.dir.join(format!("{name}.log")))?;
        self.children.push(child);
        Ok(())
    }

    /// Polls `/readyz` until it answers `ok`; fails fast when a process exits.
    async fn wait_ready(&mut self, deadline: Instant) -> anyhow::Result<kube::Client> {
        let client = self.admin_client().await?;
        loop {
            self.check_children_running()?;
            let request = http::Request::get("/readyz")
                .body(Vec::new())
                .context("building the /readyz request")?;
            let last_error = match client.request_text(request).await {
                Ok(body) if body.trim() == "ok" => return Ok(client),
                Ok(body) => format!("/readyz answered {body:?}"),
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline {
                bail!(
                    "kube-apiserver at {} not ready before the deadline (last: {last_error})\n{}",
                    self.endpoint.server_url,
                    self.log_tails(20)
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Creates the [`LOCAL_MARKER`] ConfigMap (kube-system appears shortly after `/readyz`).
    async fn mark_local(&mut self, client: &kube::Client, deadline: Instant) -> anyhow::Result<()> {
        let (namespace, name) = LOCAL_MARKER;
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
        let marker: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": { "name": name },
            "data": { "purpose": "control plane started by the coder-provisioner conformance suite; no kubelets" },
        }))
        .context("building the marker ConfigMap")?;
        loop {
            match api.create(&PostParams::default(), &marker).await {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(status)) if status.code == 409 => return Ok(()),
                Err(e) if Instant::now() >= deadline => {
                    return Err(e).context("creating the local-control-plane marker ConfigMap");
                }
                Err(_) => tokio::time::sleep(POLL).await,
            }
        }
    }

    /// Fails with the log tail of the first process that exited.
    fn check_children_running(&mut self) -> anyhow::Result<()> {
        let exited = self
            .children
            .iter_mut()
            .find_map(|c| c.exit_status().map(|s| (c.name().to_owned(), s)));
        if let Some((name, status)) = exited {
            let log = children::tail_lines(&self.dir.join(format!("{name}.log")), 15);
            bail!("{name} exited during start-up ({status}); the end of its log:\n{log}");
        }
        Ok(())
    }
}

impl Drop for LocalControlPlane {
    fn drop(&mut self) {
        while let Some(mut child) = self.children.pop() {
            child.stop_blocking(DEFAULT_GRACE);
        }
        children::unregister_scratch_dir(&self.dir);
        if self.keep_files {
            eprintln!(
                "kept the local control plane's files in {}",
                self.dir.display()
            );
        } else if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            tracing::warn!(dir = %self.dir.display(), error = %e, "could not remove the scratch folder");
        }
    }
}

const PORT_CLASH_ATTEMPTS: u32 = 3;

fn is_port_clash(error: &anyhow::Error) -> bool {
    format!("{error:#}").contains("address already in use")
}

/// A port that was free a moment ago on 127.0.0.1 (the OS picks it; a later bind may race).
fn free_port() -> anyhow::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free loopback port")?;
    Ok(listener
        .local_addr()
        .context("reading the bound port")?
        .port())
}

fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_port_is_recognised_anywhere_in_the_error_chain() {
        let clash = anyhow::anyhow!("listen tcp 127.0.0.1:4001: bind: address already in use")
            .context("etcd exited during start-up");
        assert!(is_port_clash(&clash));
        assert!(!is_port_clash(&anyhow::anyhow!("etcd exited: bad flag")));
    }

    #[test]
    fn user_names_become_safe_file_names() {
        assert_eq!(sanitize("system:admin/x"), "system_admin_x");
    }
}
