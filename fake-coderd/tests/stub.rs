//! `coder-stub` against an in-process fake: it authenticates with the key, stays up until SIGTERM,
//! and fails clearly (without printing the key) when the key or the setup is wrong.

mod common;

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use fake_coderd::{FakeCoderd, JournalQuery, fingerprint, routes};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::Command;

fn stub(coder_url: &str, key: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_coder-stub"));
    command
        .args(["provisioner", "start"])
        .env("CODER_URL", coder_url)
        .env("CODER_PROVISIONER_DAEMON_KEY", key)
        .env_remove("CODER_ORGANIZATION")
        .env_remove("CODER_PROVISIONERD_TAGS")
        .env_remove("CODER_PROVISIONER_DAEMON_PSK")
        .env("NO_COLOR", "1")
        .kill_on_drop(true);
    command
}

#[tokio::test]
async fn stub_connects_with_its_key_and_stays_up_until_sigterm() {
    let fake = FakeCoderd::start().await.expect("fake");
    let secret = fake
        .create_key_directly("default", "pod-key", BTreeMap::new())
        .expect("key");
    let key_id = fake.keys("default").expect("keys")[0].id.clone();
    let ready = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
    let ready_addr = ready.local_addr().expect("addr");
    drop(ready);

    let mut child = stub(&fake.url(), &secret)
        .env("CODER_STUB_READY_ADDR", ready_addr.to_string())
        .stderr(Stdio::piped())
        .spawn()
        .expect("stub starts");
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
    let mut log = String::new();
    let connected = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let mut line = String::new();
            if stderr.read_line(&mut line).await.expect("readable") == 0 {
                return false;
            }
            log.push_str(&line);
            if line.contains("readiness endpoint serving") {
                return log.contains("successfully connected to coderd");
            }
        }
    })
    .await
    .expect("stub logged in time");
    assert!(connected, "stub did not connect:\n{log}");
    let probe = common::http()
        .get(format!("http://{ready_addr}/ready"))
        .send()
        .await
        .expect("readiness answers");
    assert_eq!(probe.status(), 200);

    let journal = fake.journal();
    let fetches = journal.for_route(routes::DAEMON_KEY);
    assert_eq!(fetches.len(), 1);
    assert_eq!(
        fetches[0].authenticated_key_id.as_deref(),
        Some(key_id.as_str()),
        "the pod used the key the operator wrote"
    );
    assert_eq!(
        fetches[0].daemon_key_fingerprint,
        Some(fingerprint(&secret))
    );
    assert_eq!(journal.count("GET", routes::DAEMON_KEY), 1);

    assert!(
        child.try_wait().expect("status").is_none(),
        "the stub stays up"
    );
    let pid =
        nix::unistd::Pid::from_raw(i32::try_from(child.id().expect("running")).expect("pid fits"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("exits")
        .expect("status");
    assert!(status.success());
    stderr
        .read_to_string(&mut log)
        .await
        .expect("rest of the log");
    assert!(!log.contains(&secret), "the key is never logged:\n{log}");
}

#[rstest::rstest]
#[case::unknown_key("unknown", "401 Unauthorized: provisioner daemon key invalid")]
#[case::short_key("short", "400 Bad Request: provisioner daemon key invalid")]
#[case::unreachable(
    "unreachable",
    "unable to get provisioner key details: http://127.0.0.1"
)]
#[case::organization_env("org", "cannot provide --org value with --psk or --key flags")]
#[tokio::test]
async fn stub_fails_clearly(#[case] situation: &str, #[case] expected: &str) {
    let fake = FakeCoderd::start().await.expect("fake");
    let key = match situation {
        "short" => "Sh0rtK3y".to_string(),
        _ => "A".repeat(43),
    };
    if situation == "unreachable" {
        fake.set_unreachable(true).await.expect("closed");
    }
    let mut command = stub(&fake.url(), &key);
    if situation == "org" {
        command.env("CODER_ORGANIZATION", "default");
    }
    let output = tokio::time::timeout(Duration::from_secs(30), command.output())
        .await
        .expect("exits in time")
        .expect("runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(expected), "{stderr}");
    assert!(!stderr.contains(&key), "the key is never printed: {stderr}");
}
