//! The operator under test, run by the suite as a child process.
//!
//! The operator gets a kubeconfig for the ServiceAccount declared in its RBAC folder (default
//! `config/rbac/`), so it runs with exactly the rights it ships: an operator that needs more
//! than its manifests grant fails here as it would in a cluster. Its stdout and stderr go to a
//! log file that survives restarts.
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};

use crate::cluster::children::{self, ManagedChild};
use crate::cluster::identity;
use crate::cluster::kubeconfig::{self, ClusterEndpoint};
use crate::manifests;

pub mod sandbox;

/// Between SIGTERM and SIGKILL, as a pod's termination grace period (contract D-11: at least
/// 10 s; Kubernetes' default is 30 s). Only an operator that does not exit waits it out.
pub const OPERATOR_GRACE: std::time::Duration = std::time::Duration::from_secs(10);
/// Namespace of the operator's own ServiceAccount (and its leader-election Lease).
pub const DEFAULT_OPERATOR_NAMESPACE: &str = "coder-system";
/// Name of the reference operator's binary.
pub const REFERENCE_BINARY: &str = "coder-provisioner-operator";
/// Overrides where the reference operator binary is found.
pub const REFERENCE_BINARY_ENV: &str = "CODER_PROVISIONER_OPERATOR_BIN";
/// Arguments the reference operator runs with under the suite: one replica, no fixed port. The
/// watched namespace comes from [`WATCH_NAMESPACE_ENV`] (a `--namespace` flag would override it).
pub const REFERENCE_ARGS: [&str; 6] = [
    "run",
    "--leader-election=false",
    "--metrics-addr",
    "127.0.0.1:0",
    "--log-format",
    "text",
];
/// Arguments of one replica of the reference operator when it runs leader-elected (the
/// `@leader-election` scenarios). A Lease of 10 s renewed 3 s before expiry (defaults 15 and 5)
/// keeps the paused leader's scenarios short, and is long enough that a standby which only
/// sleeps until the expiry it last read misses R-HA-3's 5 s after a release.
pub const REFERENCE_REPLICA_ARGS: [&str; 10] = [
    "run",
    "--leader-election=true",
    "--leader-election-lease-duration",
    "10",
    "--leader-election-renew-grace",
    "3",
    "--metrics-addr",
    "127.0.0.1:0",
    "--log-format",
    "text",
];
/// `POD_NAME` of the suite's replicas is this prefix and a letter. An operator's Lease holder
/// identity may contain it (a pod's name, where the host name is the pod's); one that does not
/// (`<hostname>_<uuid>` on a shared host) is told apart by observation.
pub const REPLICA_NAME_PREFIX: &str = "conformance-replica-";
/// Environment variable holding a replica's index (0, 1, …), from which a replica command with
/// fixed ports derives ports of its own (`--metrics-bind-address=:$((8080 + 10 * CONFORMANCE_REPLICA_INDEX))`).
pub const REPLICA_INDEX_ENV: &str = "CONFORMANCE_REPLICA_INDEX";
/// Environment variable naming the namespace to watch (operator-sdk convention; the reference
/// operator reads it too).
pub const WATCH_NAMESPACE_ENV: &str = "WATCH_NAMESPACE";

/// A command line: program and arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperatorCommand {
    pub program: String,
    pub args: Vec<String>,
}

impl OperatorCommand {
    /// From an argument vector (`argv[0]` is the program).
    pub fn from_argv<S: Into<String>>(argv: impl IntoIterator<Item = S>) -> anyhow::Result<Self> {
        let mut argv = argv.into_iter().map(Into::into);
        let program = argv
            .next()
            .filter(|p| !p.trim().is_empty())
            .context("the operator command is empty")?;
        Ok(Self {
            program,
            args: argv.collect(),
        })
    }

    /// From a shell command line (`--operator-cmd "…"`), run by `sh -c`. Signals go to the whole
    /// process group, so they reach the operator behind the shell too.
    pub fn from_shell(line: &str) -> anyhow::Result<Self> {
        if line.trim().is_empty() {
            bail!("the operator command is empty");
        }
        Ok(Self {
            program: "sh".to_owned(),
            args: vec!["-c".to_owned(), line.to_owned()],
        })
    }

    /// The reference operator with [`REFERENCE_ARGS`], building it first if needed.
    pub async fn reference() -> anyhow::Result<Self> {
        Self::reference_with(&REFERENCE_ARGS).await
    }

    /// One leader-elected replica of the reference operator ([`REFERENCE_REPLICA_ARGS`]).
    pub async fn reference_replica() -> anyhow::Result<Self> {
        Self::reference_with(&REFERENCE_REPLICA_ARGS).await
    }

    async fn reference_with(args: &[&str]) -> anyhow::Result<Self> {
        let binary = reference_operator_binary().await?;
        Ok(Self {
            program: binary.display().to_string(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
        })
    }

    /// Shell-like rendering for logs and reports.
    pub fn display(&self) -> String {
        std::iter::once(&self.program)
            .chain(&self.args)
            .map(|word| {
                if word.is_empty() || word.contains(|c: char| c.is_whitespace() || c == '\'') {
                    format!("'{}'", word.replace('\'', r"'\''"))
                } else {
                    word.clone()
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// What to run and with which identity.
#[derive(Clone, Debug)]
pub struct OperatorUnderTest {
    pub command: OperatorCommand,
    /// RBAC manifests; must declare exactly one ServiceAccount (the operator's identity).
    pub rbac_dir: PathBuf,
    /// Namespace the RBAC objects (and the ServiceAccount) are put in.
    pub namespace: String,
    /// Passed as [`WATCH_NAMESPACE_ENV`] when set.
    pub watch_namespace: Option<String>,
    pub extra_env: Vec<(String, String)>,
    /// Where `operator.log` goes; `None` = the scratch folder (removed on drop) that always holds
    /// the operator's kubeconfig.
    pub work_dir: Option<PathBuf>,
    /// Runs the operator in a [`sandbox::Sandbox`] with this host name, reaching the API server
    /// and these coderd URLs (a second operator on the host, whose fixed ports would collide
    /// with the first one's); `None`: on the host.
    pub sandboxed: Option<(String, Vec<String>)>,
}

impl OperatorUnderTest {
    /// `command` with the repository's `config/rbac/` in [`DEFAULT_OPERATOR_NAMESPACE`].
    pub fn new(command: OperatorCommand) -> Self {
        Self {
            command,
            rbac_dir: default_rbac_dir(),
            namespace: DEFAULT_OPERATOR_NAMESPACE.to_owned(),
            watch_namespace: None,
            extra_env: Vec::new(),
            work_dir: None,
            sandboxed: None,
        }
    }
}

/// `config/rbac/` of this repository.
pub fn default_rbac_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/rbac")
}

/// A running (or stopped) operator process.
pub struct OperatorProcess {
    spec: OperatorUnderTest,
    child: Option<ManagedChild>,
    /// Keeps the scratch folder (the kubeconfig, and the log without a `work_dir`) alive; a
    /// replica shares its first process's.
    scratch: Option<tempfile::TempDir>,
    kubeconfig: PathBuf,
    /// The API server, which a replica's sandbox forwards and its kubeconfig names.
    endpoint: ClusterEndpoint,
    api_server: String,
    /// A replica's own namespaces, when the host allows them.
    sandbox: Option<sandbox::Sandbox>,
    log: PathBuf,
    service_account: (String, String),
    starts: u32,
}

impl OperatorProcess {
    /// Applies `spec.rbac_dir` into `spec.namespace` (creating it), gets a token for the
    /// ServiceAccount declared there, and starts the command with `KUBECONFIG` pointing at it.
    pub async fn start(
        admin: &kube::Client,
        endpoint: &ClusterEndpoint,
        spec: OperatorUnderTest,
    ) -> anyhow::Result<Self> {
        let service_account = rbac_service_account(&spec.rbac_dir, &spec.namespace)?;
        ensure_namespace(admin, &spec.namespace).await?;
        manifests::apply_dir(admin, &spec.rbac_dir, Some(&spec.namespace))
            .await
            .with_context(|| {
                format!(
                    "applying the operator's RBAC from {}",
                    spec.rbac_dir.display()
                )
            })?;
        let yaml = identity::service_account_kubeconfig(
            admin,
            endpoint,
            &service_account.0,
            &service_account.1,
        )
        .await?;
        // The kubeconfig (the operator's credentials) always lives in a private scratch folder,
        // removed on drop, never in a results folder a user publishes; the log goes to
        // `work_dir` when one is given.
        let scratch = tempfile::Builder::new()
            .prefix("coder-conformance-operator-")
            .tempdir()
            .context("creating the operator's scratch folder")?;
        // exit(130) in the interrupt handler skips TempDir's drop.
        children::register_scratch_dir(scratch.path());
        let dir = match &spec.work_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
                dir.clone()
            }
            None => scratch.path().to_path_buf(),
        };
        let kubeconfig = scratch.path().join("operator.kubeconfig");
        kubeconfig::write_private(&kubeconfig, &yaml)?;
        let log = dir.join("operator.log");
        let sandbox = match &spec.sandboxed {
            Some((name, coderd_urls)) => {
                let (sandbox, forwarded) =
                    sandbox_reaching(name, &endpoint.server_url, coderd_urls).await?;
                append(&log, &in_sandbox_banner(name, &forwarded))?;
                Some(sandbox)
            }
            None => None,
        };
        let mut process = Self {
            spec,
            child: None,
            scratch: Some(scratch),
            kubeconfig,
            endpoint: endpoint.clone(),
            api_server: endpoint.server_url.clone(),
            sandbox,
            log,
            service_account,
            starts: 0,
        };
        process.spawn()?;
        Ok(process)
    }

    /// Stops the process (SIGTERM, SIGKILL after a grace period) and starts it again with the
    /// same identity and environment. Also starts a process that was stopped or killed.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.stop().await;
        self.spawn()
    }

    /// SIGTERM to the process group, then SIGKILL after [`OPERATOR_GRACE`] if a process of it
    /// still runs: a graceful shutdown, as a kubelet stops a pod.
    pub async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.stop(OPERATOR_GRACE).await;
        }
    }

    /// Another process of the same operator: `command` with this one's environment,
    /// `POD_NAME=<name>` and [`REPLICA_INDEX_ENV`], logging to `<name>.log` next to this one's
    /// log, authenticated as a ServiceAccount of its own with the same rights
    /// ([`identity::replica_service_account`]), so the audit log tells its writes apart. Where
    /// the host allows it, the replica runs in a [`sandbox::Sandbox`] named `name` that reaches
    /// the API server and `coderd_urls`; its log says where it runs.
    pub async fn replica(
        &self,
        admin: &kube::Client,
        command: OperatorCommand,
        name: &str,
        index: usize,
        coderd_urls: &[String],
    ) -> anyhow::Result<Self> {
        let (namespace, operator_account) = &self.service_account;
        let account =
            identity::replica_service_account(admin, namespace, operator_account, name).await?;
        let yaml = identity::service_account_kubeconfig(admin, &self.endpoint, namespace, &account)
            .await?;
        let kubeconfig = self.kubeconfig.with_file_name(format!("{name}.kubeconfig"));
        kubeconfig::write_private(&kubeconfig, &yaml)?;
        let mut spec = self.spec.clone();
        spec.command = command;
        spec.extra_env
            .push(("POD_NAME".to_owned(), name.to_owned()));
        // Without a sandbox replicas share the host: a command with fixed ports derives its own
        // from this.
        spec.extra_env
            .push((REPLICA_INDEX_ENV.to_owned(), index.to_string()));
        let dir = self.log.parent().unwrap_or(Path::new("."));
        let log = dir.join(format!("{name}.log"));
        let sandbox = match sandbox_reaching(name, &self.api_server, coderd_urls).await {
            Ok((sandbox, forwarded)) => {
                append(&log, &in_sandbox_banner(name, &forwarded))?;
                Some(sandbox)
            }
            Err(error) => {
                append(
                    &log,
                    &format!(
                        "=== on the shared host (ports and host name shared with the other \
                         replicas; {REPLICA_INDEX_ENV}={index}): {error:#}\n"
                    ),
                )?;
                None
            }
        };
        let mut replica = Self {
            spec,
            child: None,
            scratch: None,
            kubeconfig,
            endpoint: self.endpoint.clone(),
            api_server: self.api_server.clone(),
            sandbox,
            log,
            service_account: (namespace.clone(), account),
            starts: 0,
        };
        replica.spawn()?;
        Ok(replica)
    }

    /// SIGSTOP: the process freezes mid-step, as a paused VM or a long GC would.
    pub fn pause(&self) {
        if let Some(child) = &self.child {
            child.pause();
        }
    }

    /// SIGCONT after [`Self::pause`].
    pub fn resume(&self) {
        if let Some(child) = &self.child {
            child.resume();
        }
    }

    /// SIGKILL at once: a crash, as far as the operator can tell.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().await;
        }
    }

    /// True while the process runs.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.exit_status().is_none())
    }

    /// The exit status if the process ended on its own (not through stop/kill).
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        self.child.as_mut().and_then(ManagedChild::exit_status)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(ManagedChild::pid)
    }

    /// `POD_NAME` of a replica; empty for the operator itself.
    pub fn name(&self) -> &str {
        self.spec
            .extra_env
            .iter()
            .rev()
            .find(|(key, _)| key == "POD_NAME")
            .map_or("", |(_, value)| value.as_str())
    }

    /// How many times the process has been started.
    pub fn starts(&self) -> u32 {
        self.starts
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// (namespace, name) of the ServiceAccount the operator authenticates as.
    pub fn service_account(&self) -> (&str, &str) {
        (&self.service_account.0, &self.service_account.1)
    }

    pub fn command(&self) -> &OperatorCommand {
        &self.spec.command
    }

    /// The last `lines` lines of the log (all starts).
    pub fn log_tail(&self, lines: usize) -> String {
        children::tail_lines(&self.log, lines)
    }

    /// The whole log (all starts, each introduced by a `=== start #N` line).
    pub fn full_log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        self.starts += 1;
        let banner = format!(
            "=== start #{} as system:serviceaccount:{}:{}: {}\n",
            self.starts,
            self.service_account.0,
            self.service_account.1,
            self.spec.command.display()
        );
        append(&self.log, &banner)?;
        let mut command = tokio::process::Command::new(&self.spec.command.program);
        command
            .args(&self.spec.command.args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("POD_NAMESPACE", &self.spec.namespace)
            .envs(self.spec.extra_env.iter().map(|(k, v)| (k, v)));
        if let Some(namespace) = &self.spec.watch_namespace {
            command.env(WATCH_NAMESPACE_ENV, namespace);
        }
        if let Some(sandbox) = &self.sandbox {
            sandbox.enter_on_exec(&mut command);
        }
        self.child = Some(ManagedChild::spawn("operator", command, &self.log)?);
        Ok(())
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        // The child field stops the process next, then the scratch folder is removed.
        if let Some(scratch) = &self.scratch {
            children::unregister_scratch_dir(scratch.path());
        }
    }
}

/// A sandbox named `name` reaching `api_server` and `coderd_urls`, and the forwarded addresses
/// (for its log).
async fn sandbox_reaching(
    name: &str,
    api_server: &str,
    coderd_urls: &[String],
) -> anyhow::Result<(sandbox::Sandbox, String)> {
    let urls: Vec<&str> = std::iter::once(api_server)
        .chain(coderd_urls.iter().map(String::as_str))
        .collect();
    let addresses = loopback_addresses(&urls)?;
    let sandbox = sandbox::Sandbox::create(name, &addresses).await?;
    let forwarded: Vec<String> = addresses.iter().map(ToString::to_string).collect();
    Ok((sandbox, forwarded.join(", ")))
}

fn in_sandbox_banner(name: &str, forwarded: &str) -> String {
    format!(
        "=== in network and UTS namespaces of its own: host name {name}, {forwarded} forwarded from the host\n"
    )
}

/// The socket addresses of `urls`, all of them on this host's loopback (a sandbox reaches
/// nothing else).
fn loopback_addresses(urls: &[&str]) -> anyhow::Result<Vec<std::net::SocketAddr>> {
    let mut addresses = Vec::new();
    for text in urls {
        let url = url::Url::parse(text).with_context(|| format!("reading the URL {text}"))?;
        let resolved = url
            .socket_addrs(|| None)
            .with_context(|| format!("resolving {text}"))?;
        let Some(address) = resolved.into_iter().find(|a| a.ip().is_loopback()) else {
            bail!("{text} is not on this host's loopback, which a sandbox could forward");
        };
        if !addresses.contains(&address) {
            addresses.push(address);
        }
    }
    Ok(addresses)
}

/// The one ServiceAccount an RBAC folder declares, placed in `namespace`.
fn rbac_service_account(dir: &Path, namespace: &str) -> anyhow::Result<(String, String)> {
    let accounts: Vec<String> = manifests::read_dir(dir)?
        .into_iter()
        .filter(|o| o.types.as_ref().is_some_and(|t| t.kind == "ServiceAccount"))
        .filter_map(|o| o.metadata.name)
        .collect();
    match accounts.as_slice() {
        [name] => Ok((namespace.to_owned(), name.clone())),
        [] => bail!(
            "{} declares no ServiceAccount for the operator",
            dir.display()
        ),
        many => bail!(
            "{} declares several ServiceAccounts ({}); the operator's identity is ambiguous",
            dir.display(),
            many.join(", ")
        ),
    }
}

async fn ensure_namespace(admin: &kube::Client, name: &str) -> anyhow::Result<()> {
    let api: Api<Namespace> = Api::all(admin.clone());
    let namespace = Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        ..Default::default()
    };
    match api.create(&PostParams::default(), &namespace).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(e) => Err(e).with_context(|| format!("creating namespace {name}")),
    }
}

fn append(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    std::fs::File::options()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .with_context(|| format!("writing {}", path.display()))
}

/// Finds the reference operator: `$CODER_PROVISIONER_OPERATOR_BIN`; else, while the source tree
/// the suite was built from exists, builds it there with `cargo build -p operator --bin
/// coder-provisioner-operator` (a no-op when current; a binary found elsewhere may predate the
/// last edit); else the one next to the running executable (`target/<profile>/`, also from
/// `target/<profile>/deps/`) of a relocated suite.
pub async fn reference_operator_binary() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os(REFERENCE_BINARY_ENV) {
        let path = PathBuf::from(path);
        if !path.is_file() {
            bail!("{REFERENCE_BINARY_ENV}={} is not a file", path.display());
        }
        return Ok(path);
    }
    if source_workspace().is_err()
        && let Some(found) = next_to_current_exe()
    {
        return Ok(found);
    }
    // Built once per process: the operator and its leader-elected replicas use the same binary.
    static BUILT: tokio::sync::OnceCell<PathBuf> = tokio::sync::OnceCell::const_new();
    BUILT
        .get_or_try_init(build_reference_operator)
        .await
        .cloned()
}

fn next_to_current_exe() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    exe.ancestors()
        .skip(1)
        .take(2)
        .map(|dir| dir.join(REFERENCE_BINARY))
        .find(|candidate| candidate.is_file())
}

/// The workspace the suite was built from, when its source tree is still there.
fn source_workspace() -> anyhow::Result<PathBuf> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    if !workspace.join("operator").is_dir() {
        bail!(
            "the reference operator is neither in ${REFERENCE_BINARY_ENV} nor next to this binary, and \
             its source tree ({}) is gone: set {REFERENCE_BINARY_ENV}, or run your own operator with --operator-cmd",
            workspace.display()
        );
    }
    Ok(workspace)
}

/// `cargo <args>` in the source workspace, without the variables cargo set for the running test:
/// they describe *its* package, and inherited they make build scripts that watch them (ring's
/// watches CARGO_MANIFEST_DIR and OUT_DIR) rebuild, and then the next `cargo test` rebuild them back.
pub(crate) fn workspace_cargo(workspace: &Path, args: &[&str]) -> tokio::process::Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = tokio::process::Command::new(cargo);
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if is_package_variable(&name) {
            command.env_remove(name.as_ref());
        }
    }
    command
        .args(args)
        .current_dir(workspace)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit());
    command
}

/// Builds the reference operator from this workspace with cargo (a no-op when it is fresh).
pub async fn build_reference_operator() -> anyhow::Result<PathBuf> {
    let workspace = source_workspace()?;
    eprintln!("building the reference operator ({REFERENCE_BINARY}) …");
    let output = workspace_cargo(
        &workspace,
        &[
            "build",
            "-p",
            "operator",
            "--bin",
            REFERENCE_BINARY,
            "--message-format=json-render-diagnostics",
        ],
    )
    .output()
    .await
    .context("running cargo to build the reference operator")?;
    if !output.status.success() {
        bail!(
            "building {REFERENCE_BINARY} failed ({}); see the messages above",
            output.status
        );
    }
    built_executable(&String::from_utf8_lossy(&output.stdout))
        .with_context(|| format!("cargo reported no {REFERENCE_BINARY} executable"))
}

/// Runs the reference operator's unit tests (`cargo test -p operator --lib`). Mutation testing
/// asks for them before the suite: they judge a mutant of the pure code in a second.
pub async fn run_reference_unit_tests() -> anyhow::Result<()> {
    let workspace = source_workspace()?;
    eprintln!("running the reference operator's unit tests first …");
    let status = workspace_cargo(&workspace, &["test", "-p", "operator", "--lib", "-q"])
        .status()
        .await
        .context("running cargo to test the reference operator")?;
    if !status.success() {
        bail!("the reference operator's unit tests failed ({status})");
    }
    Ok(())
}

/// A variable cargo sets for the package whose test or binary is running (with the one this
/// package's build script adds: cargo sets it when running the test too).
fn is_package_variable(name: &str) -> bool {
    const EXACT: [&str; 7] = [
        "CARGO_MANIFEST_DIR",
        "CARGO_MANIFEST_PATH",
        "CARGO_CRATE_NAME",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_TARGET_TMPDIR",
        "OUT_DIR",
        "CONFORMANCE_GIT_COMMIT",
    ];
    EXACT.contains(&name) || name.starts_with("CARGO_PKG_") || name.starts_with("CARGO_BIN_")
}

/// The `executable` of the `compiler-artifact` message for the reference binary.
pub(crate) fn built_executable(cargo_json: &str) -> Option<PathBuf> {
    built_executable_named(cargo_json, REFERENCE_BINARY)
}

/// The `executable` of the `compiler-artifact` message for the binary `name`.
pub(crate) fn built_executable_named(cargo_json: &str, name: &str) -> Option<PathBuf> {
    cargo_json
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == name)
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nested_build_drops_only_the_running_packages_variables() {
        for name in [
            "CARGO_MANIFEST_DIR",
            "CARGO_PKG_NAME",
            "CARGO_BIN_EXE_conformance",
            "OUT_DIR",
        ] {
            assert!(is_package_variable(name), "{name}");
        }
        for name in [
            "CARGO",
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "CARGO_TERM_COLOR",
            "PATH",
        ] {
            assert!(!is_package_variable(name), "{name}");
        }
    }

    #[test]
    fn shell_commands_run_through_sh() {
        let command = OperatorCommand::from_shell("./op run --x; echo done").expect("command");
        assert_eq!(command.program, "sh");
        assert_eq!(command.args, ["-c", "./op run --x; echo done"]);
        assert!(OperatorCommand::from_shell("  ").is_err());
        assert!(OperatorCommand::from_argv(Vec::<String>::new()).is_err());
    }

    #[test]
    fn display_quotes_words_with_spaces() {
        let command = OperatorCommand::from_argv(["op", "a b", "it's", "plain"]).expect("command");
        assert_eq!(command.display(), r"op 'a b' 'it'\''s' plain");
    }

    #[test]
    fn cargo_messages_name_the_built_executable() {
        let json = concat!(
            r#"{"reason":"compiler-artifact","target":{"name":"operator"},"executable":null}"#,
            "\n",
            r#"{"reason":"compiler-artifact","target":{"name":"coder-provisioner-operator"},"executable":"/t/debug/coder-provisioner-operator"}"#,
            "\n",
            r#"{"reason":"build-finished","success":true}"#,
        );
        assert_eq!(
            built_executable(json),
            Some(PathBuf::from("/t/debug/coder-provisioner-operator"))
        );
    }

    #[test]
    fn the_rbac_folder_names_exactly_one_service_account() {
        let dir = tempfile::tempdir().expect("tempdir");
        let account = "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: op, namespace: x}\n";
        std::fs::write(dir.path().join("sa.yaml"), account).expect("write");
        assert_eq!(
            rbac_service_account(dir.path(), "coder-system").expect("one"),
            ("coder-system".to_owned(), "op".to_owned())
        );
        std::fs::write(dir.path().join("sa2.yaml"), account.replace("op,", "op2,")).expect("write");
        assert!(rbac_service_account(dir.path(), "coder-system").is_err());
    }

    #[test]
    fn the_repository_rbac_declares_the_operator_identity() {
        let (namespace, name) =
            rbac_service_account(&default_rbac_dir(), DEFAULT_OPERATOR_NAMESPACE).expect("rbac");
        assert_eq!(namespace, DEFAULT_OPERATOR_NAMESPACE);
        assert_eq!(name, "coder-provisioner-operator");
    }
}
