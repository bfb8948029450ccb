//! The standalone `fake-coderd` process: flags, seed file, URLs printed on start, clean SIGTERM
//! shutdown, and no secret anywhere in its output (run with debug logging to be strict).

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::{Request, http};
use fake_coderd::{AdminClient, JournalQuery, routes};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};

const OPERATOR_TOKEN: &str = "OPERATOR01-abcdefghijklmnopqrstuv";
const MEMBER_TOKEN: &str = "MEMBERTOK1-zyxwvutsrqponmlkjihgfe";
const ADMIN_TOKEN: &str = "admin-token-for-the-binary-test";

const SEED_YAML: &str = "\
organizations:
  - name: acme
users:
  - username: alice
    role: member
    token: MEMBERTOK1-zyxwvutsrqponmlkjihgfe
    organizations: [default, acme]
entitlement: grace_period
has_license: true
";

struct Running {
    child: Child,
    stdout: BufReader<ChildStdout>,
    printed: String,
}

impl Running {
    async fn start(args: &[&str], admin_token: Option<&str>) -> Running {
        let mut command = Command::new(env!("CARGO_BIN_EXE_fake-coderd"));
        command
            .args(args)
            .env("RUST_LOG", "debug")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        match admin_token {
            Some(token) => command.env("FAKE_CODERD_ADMIN_TOKEN", token),
            None => command.env_remove("FAKE_CODERD_ADMIN_TOKEN"),
        };
        let mut child = command.spawn().expect("fake-coderd starts");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        Running {
            child,
            stdout,
            printed: String::new(),
        }
    }

    /// Reads printed lines until one starts with `prefix`; returns the rest of that line.
    async fn printed_value(&mut self, prefix: &str) -> String {
        let read = async {
            loop {
                let mut line = String::new();
                let read = self
                    .stdout
                    .read_line(&mut line)
                    .await
                    .expect("stdout readable");
                assert!(
                    read > 0,
                    "fake-coderd exited early; printed so far:\n{}",
                    self.printed
                );
                self.printed.push_str(&line);
                if let Some(value) = line.trim_end().strip_prefix(prefix) {
                    return value.to_string();
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(30), read)
            .await
            .expect("fake-coderd printed its URLs in time")
    }

    /// SIGTERM, then everything it printed (stdout + stderr) and whether it exited successfully.
    async fn terminate(mut self) -> (String, bool) {
        let pid = self.child.id().expect("still running");
        let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).expect("pid fits"));
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM sent");
        let status = tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .expect("exits after SIGTERM")
            .expect("status");
        let mut rest = String::new();
        self.stdout.read_to_string(&mut rest).await.expect("stdout");
        let mut stderr = String::new();
        if let Some(mut pipe) = self.child.stderr.take() {
            pipe.read_to_string(&mut stderr).await.expect("stderr");
        }
        (format!("{}{rest}{stderr}", self.printed), status.success())
    }
}

#[tokio::test]
async fn binary_serves_the_seed_and_never_prints_secrets() {
    let seed_dir = tempfile::tempdir().expect("tempdir");
    let seed_path = seed_dir.path().join("seed.yaml");
    std::fs::write(&seed_path, SEED_YAML).expect("seed written");
    let seed_arg = seed_path.to_string_lossy().to_string();
    let mut fake = Running::start(
        &[
            "--listen",
            "127.0.0.1:0",
            "--operator-token",
            OPERATOR_TOKEN,
            "--seed-file",
            &seed_arg,
        ],
        Some(ADMIN_TOKEN),
    )
    .await;
    let url = fake.printed_value("fake-coderd: coderd API on ").await;
    let admin_url = fake.printed_value("fake-coderd: admin API on ").await;
    let client = http();

    let me = Request::new("GET", "/api/v2/users/me")
        .token(MEMBER_TOKEN)
        .send(&client, &url)
        .await
        .json();
    assert_eq!(me["username"], "alice", "seeded user and token");
    let acme = Request::new("GET", "/api/v2/organizations/ACME")
        .token(MEMBER_TOKEN)
        .send(&client, &url)
        .await;
    assert_eq!(acme.status, 200, "seeded membership");
    let entitlements = Request::new("GET", "/api/v2/entitlements")
        .send(&client, &url)
        .await
        .json();
    assert_eq!(
        entitlements["features"]["external_provisioner_daemons"]["entitlement"],
        "grace_period"
    );

    let created = Request::new("POST", "/api/v2/organizations/acme/provisionerkeys")
        .token(OPERATOR_TOKEN)
        .body(r#"{"name":"from-the-binary"}"#)
        .send(&client, &url)
        .await
        .json();
    let secret = created["key"].as_str().expect("secret").to_string();
    let daemon = Request::new("GET", &format!("/api/v2/provisionerkeys/{secret}"))
        .header("Coder-Provisioner-Daemon-Key", &secret)
        .send(&client, &url)
        .await;
    assert_eq!(daemon.status, 200);
    Request::new(
        "GET",
        &format!("/api/v2/users/me?coder_session_token={OPERATOR_TOKEN}"),
    )
    .send(&client, &url)
    .await;

    let admin = AdminClient::new(&admin_url, ADMIN_TOKEN);
    assert_eq!(
        admin.info().await.expect("info").operator_token,
        OPERATOR_TOKEN
    );
    assert_eq!(
        admin
            .journal()
            .await
            .expect("journal")
            .count("POST", routes::CREATE_KEY),
        1
    );

    let (output, success) = fake.terminate().await;
    assert!(success, "clean exit on SIGTERM:\n{output}");
    assert!(
        output.contains("fake-coderd: stopped (SIGTERM)"),
        "{output}"
    );
    assert!(
        output.contains("coderd request"),
        "requests are logged:\n{output}"
    );
    assert!(
        !output.contains("generated admin token"),
        "a given admin token is not printed"
    );
    for secret in [OPERATOR_TOKEN, MEMBER_TOKEN, secret.as_str(), ADMIN_TOKEN] {
        assert!(!output.contains(secret), "output leaks a secret:\n{output}");
    }
}

#[tokio::test]
async fn binary_prints_a_generated_admin_token_that_works() {
    let mut fake = Running::start(&["--listen", "127.0.0.1:0"], None).await;
    fake.printed_value("fake-coderd: coderd API on ").await;
    let admin_url = fake.printed_value("fake-coderd: admin API on ").await;
    let admin_token = fake
        .printed_value("fake-coderd: generated admin token: ")
        .await;
    let info = AdminClient::new(&admin_url, &admin_token)
        .info()
        .await
        .expect("generated token accepted");
    let (output, success) = fake.terminate().await;
    assert!(success);
    assert!(
        !output.contains(&info.operator_token),
        "the generated operator token is never printed"
    );
}

#[tokio::test]
async fn binary_rejects_a_bad_seed_file_clearly() {
    let seed_dir = tempfile::tempdir().expect("tempdir");
    let seed_path = seed_dir.path().join("seed.json");
    std::fs::write(&seed_path, r#"{"entitlement":"maybe"}"#).expect("seed written");
    let output = Command::new(env!("CARGO_BIN_EXE_fake-coderd"))
        .args(["--listen", "127.0.0.1:0", "--seed-file"])
        .arg(&seed_path)
        .output()
        .await
        .expect("runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("parsing JSON seed file"), "{stderr}");
}

#[tokio::test]
async fn binary_models_the_release_named_by_coderd_version() {
    let mut fake = Running::start(
        &["--listen", "127.0.0.1:0", "--coderd-version", "v2.30.0"],
        Some(ADMIN_TOKEN),
    )
    .await;
    let coderd_url = fake.printed_value("fake-coderd: coderd API on ").await;
    let admin_url = fake.printed_value("fake-coderd: admin API on ").await;
    let info = AdminClient::new(&admin_url, ADMIN_TOKEN)
        .info()
        .await
        .expect("info");
    assert_eq!(info.coderd_version, fake_coderd::CoderdVersion::V2_30_0);
    let buildinfo = Request::new("GET", "/api/v2/buildinfo")
        .send(&http(), &coderd_url)
        .await;
    assert_eq!(buildinfo.json()["version"], "v2.30.0+fake");
    assert!(fake.terminate().await.1);

    let unknown = Command::new(env!("CARGO_BIN_EXE_fake-coderd"))
        .args(["--listen", "127.0.0.1:0", "--coderd-version", "v2.29.0"])
        .output()
        .await
        .expect("runs");
    assert!(!unknown.status.success());
    let stderr = String::from_utf8_lossy(&unknown.stderr);
    assert!(
        stderr.contains("v2.31.0"),
        "lists the modelled releases: {stderr}"
    );
}
