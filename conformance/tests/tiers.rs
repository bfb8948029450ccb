//! The kind and k3s tiers' inputs, checked without Docker: the kind configuration, every
//! manifest under config/ (parsed, and accepted by a real API server in a server-side dry run on
//! the local control plane), the operator Deployment's ServiceAccount and the fake coderd's ports.
//!
//! The tiers themselves need a Docker engine: those tests are `#[ignore]`d and run by
//! scripts/kind-e2e.sh (`cargo test -p conformance --test tiers kind -- --ignored`), which also
//! runs the fake coderd's image as a container through testcontainers (`fake_coderd_image`).
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use conformance::cluster::images::{DEFAULT_TAG, Images};
use conformance::cluster::k3s::{K3S_TAG, K3sCluster, K3sOptions};
use conformance::cluster::kind::{
    self, FAKE_CODERD_ADMIN_PORT, FAKE_CODERD_ADMIN_SECRET, FAKE_CODERD_ADMIN_SECRET_KEY,
    FAKE_CODERD_NAME, FAKE_CODERD_NAMESPACE, FAKE_CODERD_PORT, KindCluster, KindOptions,
    ProvisionedCluster,
};
use conformance::cluster::kubeconfig::client_from_file;
use conformance::cluster::local::{LocalControlPlane, LocalOptions};
use conformance::manifests::{self, ApplyOptions};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use regex::Regex;
use serde_json::{Value, json};

/// Folders of Kubernetes objects under config/ (config/kind holds kind's own format).
const MANIFEST_DIRS: [&str; 5] = [
    "config/crd",
    "config/rbac",
    "config/manager",
    "config/samples",
    "config/fake-coderd",
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn one<'a>(objects: &'a [DynamicObject], kind: &str) -> &'a DynamicObject {
    manifests::only_of_kind(objects, kind).unwrap_or_else(|e| panic!("{e:#}"))
}

/// The Kubernetes version scripts/k8s-binaries.sh pins for the local tier, e.g. `v1.37.2`.
fn local_tier_version() -> String {
    let script =
        std::fs::read_to_string(repo().join("scripts/k8s-binaries.sh")).expect("read the script");
    let pin = Regex::new(r#"KUBERNETES_VERSION="\$\{KUBERNETES_VERSION:-(v1\.\d+\.\d+)\}""#)
        .expect("regex");
    pin.captures(&script)
        .expect("the script pins KUBERNETES_VERSION")[1]
        .to_owned()
}

fn minor(version: &str) -> &str {
    let end = version.rfind('.').expect("vMAJOR.MINOR.PATCH");
    &version[..end]
}

#[test]
fn the_kind_node_image_runs_the_local_tiers_kubernetes_minor() {
    let text =
        std::fs::read_to_string(repo().join(kind::KIND_CONFIG)).expect("read the kind config");
    let images =
        kind::kind_node_images(&text).expect("a kind configuration pinning its node images");
    assert!(!images.is_empty());
    let version = local_tier_version();
    for image in images {
        let tag = image
            .strip_prefix("kindest/node:")
            .expect("a kindest/node image");
        assert!(
            tag.starts_with(&format!("{}.", minor(&version))),
            "{image} is not Kubernetes {}",
            minor(&version)
        );
        assert!(tag.contains("@sha256:"), "{image} is pinned by digest");
    }
}

#[test]
fn the_k3s_release_is_the_local_tiers_kubernetes_version() {
    assert_eq!(K3S_TAG, format!("{}-k3s1", local_tier_version()));
}

/// Every folder parses, and its kustomization lists exactly its manifest files (so `kubectl
/// apply -k` and the suite's folder apply install the same objects).
#[test]
fn every_manifest_folder_parses_and_matches_its_kustomization() {
    for dir in MANIFEST_DIRS {
        let path = repo().join(dir);
        let objects = manifests::read_dir(&path).unwrap_or_else(|e| panic!("{dir}: {e:#}"));
        assert!(!objects.is_empty(), "{dir} holds no objects");
        let kustomization: Value = serde_saphyr::from_str(
            &std::fs::read_to_string(path.join("kustomization.yaml")).expect("kustomization.yaml"),
        )
        .expect("kustomization parses");
        let listed: BTreeSet<String> = kustomization["resources"]
            .as_array()
            .expect("resources list")
            .iter()
            .map(|r| r.as_str().expect("file name").to_owned())
            .collect();
        let files: BTreeSet<String> = std::fs::read_dir(&path)
            .expect("list folder")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
            .collect();
        assert_eq!(listed, files, "{dir}/kustomization.yaml resources");
    }
}

/// `kubectl apply -k config/` installs the operator: CRDs, RBAC and the manager.
#[test]
fn the_top_level_kustomization_installs_the_operator_folders() {
    let text = std::fs::read_to_string(repo().join("config/kustomization.yaml"))
        .expect("config/kustomization.yaml");
    let kustomization: Value = serde_saphyr::from_str(&text).expect("parses");
    let listed: Vec<&str> = kustomization["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(listed, ["crd", "rbac", "manager"]);
    for folder in listed {
        assert!(
            repo()
                .join("config")
                .join(folder)
                .join("kustomization.yaml")
                .is_file(),
            "config/{folder} is a kustomization"
        );
    }
}

#[test]
fn the_operator_deployment_runs_as_the_service_account_its_rbac_binds() {
    let images = Images::with_tag(DEFAULT_TAG);
    let manager = kind::manager_objects(&repo(), &images.operator).expect("config/manager");
    let rbac = manifests::read_dir(&repo().join(kind::RBAC_DIR)).expect("config/rbac");
    let deployment = one(&manager, "Deployment");
    let service_account = one(&rbac, "ServiceAccount");
    let (sa_name, sa_namespace) = (
        service_account.metadata.name.as_deref(),
        service_account.metadata.namespace.as_deref(),
    );
    assert_eq!(
        deployment.data["spec"]["template"]["spec"]["serviceAccountName"].as_str(),
        sa_name
    );
    assert_eq!(deployment.metadata.namespace.as_deref(), sa_namespace);
    let namespace = one(&manager, "Namespace");
    assert_eq!(
        namespace.metadata.name.as_deref(),
        sa_namespace,
        "config/manager creates the namespace"
    );
    for binding in manifests::of_kind(&rbac, "ClusterRoleBinding")
        .into_iter()
        .chain(manifests::of_kind(&rbac, "RoleBinding"))
    {
        let subjects = binding.data["subjects"].as_array().expect("subjects");
        assert!(
            subjects.iter().any(|s| s["kind"] == "ServiceAccount"
                && s["name"].as_str() == sa_name
                && s["namespace"].as_str() == sa_namespace),
            "{:?} binds the operator's ServiceAccount",
            binding.metadata.name
        );
    }
    let container = &deployment.data["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["name"], kind::MANAGER_CONTAINER);
    assert_eq!(
        container["image"], "coder-provisioner-operator:dev",
        "the loaded image, not :latest"
    );
    assert_ne!(
        container["imagePullPolicy"], "Always",
        "a loaded image must not be pulled"
    );
}

#[test]
fn the_fake_coderd_manifests_expose_the_ports_and_secret_the_suite_uses() {
    let objects = kind::fake_coderd_objects(&repo(), "fake-coderd:t1", "admin-t0ken")
        .expect("config/fake-coderd");
    assert_eq!(
        one(&objects, "Namespace").metadata.name.as_deref(),
        Some(FAKE_CODERD_NAMESPACE)
    );
    for object in objects
        .iter()
        .filter(|o| manifests::kind_of(o) != "Namespace")
    {
        assert_eq!(
            object.metadata.namespace.as_deref(),
            Some(FAKE_CODERD_NAMESPACE),
            "{:?}",
            object.metadata.name
        );
    }

    let secret = one(&objects, "Secret");
    assert_eq!(
        secret.metadata.name.as_deref(),
        Some(FAKE_CODERD_ADMIN_SECRET)
    );
    assert_eq!(
        secret.data["stringData"][FAKE_CODERD_ADMIN_SECRET_KEY],
        "admin-t0ken"
    );

    let deployment = one(&objects, "Deployment");
    let pod = &deployment.data["spec"]["template"];
    assert_eq!(
        pod["metadata"]["annotations"][kind::ADMIN_TOKEN_ANNOTATION],
        fake_coderd::fingerprint("admin-t0ken"),
        "a new admin token rolls the fake's pod"
    );
    let container = &pod["spec"]["containers"][0];
    assert_eq!(container["name"], FAKE_CODERD_NAME);
    assert_eq!(container["image"], "fake-coderd:t1");
    let container_port = |name: &str| {
        container["ports"]
            .as_array()
            .expect("ports")
            .iter()
            .find(|p| p["name"] == name)
            .map(|p| p["containerPort"].clone())
    };
    assert_eq!(container_port("coderd"), Some(json!(FAKE_CODERD_PORT)));
    assert_eq!(container_port("admin"), Some(json!(FAKE_CODERD_ADMIN_PORT)));
    assert_eq!(
        container["args"],
        json!([
            format!("--listen=0.0.0.0:{FAKE_CODERD_PORT}"),
            format!("--admin-listen=0.0.0.0:{FAKE_CODERD_ADMIN_PORT}")
        ]),
        "the fake listens on the container ports, on every interface"
    );
    let env = |name: &str| {
        container["env"]
            .as_array()
            .expect("env")
            .iter()
            .find(|e| e["name"] == name)
            .cloned()
    };
    let token_ref = &env("FAKE_CODERD_ADMIN_TOKEN").expect("token")["valueFrom"]["secretKeyRef"];
    assert_eq!(token_ref["name"], FAKE_CODERD_ADMIN_SECRET);
    assert_eq!(token_ref["key"], FAKE_CODERD_ADMIN_SECRET_KEY);

    let service = one(&objects, "Service");
    assert_eq!(service.metadata.name.as_deref(), Some(FAKE_CODERD_NAME));
    assert_eq!(
        service.data["spec"]["selector"], pod["metadata"]["labels"],
        "the Service selects the fake's pods"
    );
    let service_port = |name: &str| {
        service.data["spec"]["ports"]
            .as_array()
            .expect("ports")
            .iter()
            .find(|p| p["name"] == name)
            .cloned()
    };
    for (name, port) in [
        ("coderd", FAKE_CODERD_PORT),
        ("admin", FAKE_CODERD_ADMIN_PORT),
    ] {
        let found = service_port(name).unwrap_or_else(|| panic!("Service port {name}"));
        assert_eq!(found["port"], json!(port), "Service port {name}");
        assert_eq!(
            found["targetPort"], name,
            "Service port {name} targets the container port of that name"
        );
    }
}

/// The Dockerfiles and stages `cluster::images` builds exist (their owners may rename them),
/// both the multi-stage ones and the thin `.prebuilt` ones scripts/images.sh uses.
#[test]
fn every_image_is_built_from_an_existing_dockerfile_stage() {
    let script = std::fs::read_to_string(repo().join("scripts/images.sh")).expect("images.sh");
    for spec in Images::with_tag(DEFAULT_TAG).build_specs() {
        let prebuilt = format!("{}.prebuilt", spec.dockerfile);
        assert!(
            script.contains(&format!(
                "build \"{}:$tag\" {prebuilt} ",
                spec.image.rsplit_once(':').expect("tag").0
            )),
            "scripts/images.sh builds {} from {prebuilt}",
            spec.image
        );
        for file in [spec.dockerfile.to_owned(), prebuilt] {
            check_stage(&file, spec.target, &spec.image);
        }
    }
}

fn check_stage(file: &str, target: Option<&str>, image: &str) {
    let dockerfile =
        std::fs::read_to_string(repo().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    if let Some(target) = target {
        let stage = Regex::new(&format!(
            r"(?im)^FROM\s+\S+\s+AS\s+{}\s*$",
            regex::escape(target)
        ))
        .expect("regex");
        assert!(
            stage.is_match(&dockerfile),
            "{file} has no stage {target} for {image}"
        );
    }
}

/// Every object of every manifest folder is accepted by kube-apiserver v1.37 (schema, CRD
/// validation of the samples, RBAC objects) without being stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_manifest_passes_server_side_dry_run_on_the_local_control_plane() -> anyhow::Result<()>
{
    let _ = rustls::crypto::ring::default_provider().install_default();
    let plane = LocalControlPlane::start(LocalOptions {
        controller_manager: false,
        ..LocalOptions::default()
    })
    .await?;
    let client = plane.admin_client().await?;
    let repo = repo();
    let images = Images::with_tag(DEFAULT_TAG);

    let mut objects = Vec::new();
    for dir in MANIFEST_DIRS {
        objects.extend(manifests::read_dir(&repo.join(dir))?);
    }
    // The rendered forms the tiers apply: the operator's image set, the fake's Secret added.
    objects.extend(kind::manager_objects(&repo, &images.operator)?);
    objects.extend(kind::fake_coderd_objects(
        &repo,
        &images.fake_coderd,
        "dry-run-token",
    )?);

    // What a dry run cannot provide: CRDs must exist for the samples' kinds to be served, and
    // namespaces for namespaced objects to be admitted.
    manifests::install_crds(&client, &repo.join(kind::CRD_DIR)).await?;
    let mut namespaces: BTreeSet<String> = objects
        .iter()
        .filter_map(|o| o.metadata.namespace.clone())
        .collect();
    namespaces.extend(
        manifests::of_kind(&objects, "Namespace")
            .iter()
            .filter_map(|n| n.metadata.name.clone()),
    );
    let namespace_api: Api<Namespace> = Api::all(client.clone());
    for name in &namespaces {
        let namespace =
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
        namespace_api
            .patch(
                name,
                &PatchParams::apply("tiers-test").force(),
                &Patch::Apply(&namespace),
            )
            .await
            .with_context(|| format!("creating namespace {name}"))?;
    }

    let total = objects.len();
    let options = ApplyOptions {
        dry_run: true,
        ..ApplyOptions::default()
    };
    let applied = manifests::apply_objects(&client, objects, &options).await?;
    assert_eq!(applied.len(), total, "every object was submitted");

    // The dry run does validate: a CoderProvisioner without its required controlPlaneRef is refused.
    let invalid = manifests::parse_documents(
        "apiVersion: coder.com/v1alpha1\nkind: CoderProvisioner\nmetadata: {name: invalid, namespace: coder}\nspec: {}\n",
    )?;
    let refused = manifests::apply_objects(&client, invalid, &options)
        .await
        .expect_err("schema violation");
    assert!(
        format!("{refused:#}").contains("controlPlaneRef"),
        "{refused:#}"
    );

    // A dry run stores nothing.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), FAKE_CODERD_NAMESPACE);
    assert!(
        deployments.get_opt(FAKE_CODERD_NAME).await?.is_none(),
        "dry run created the fake's Deployment"
    );
    let secrets: Api<Secret> = Api::namespaced(client.clone(), FAKE_CODERD_NAMESPACE);
    assert!(
        secrets.get_opt(FAKE_CODERD_ADMIN_SECRET).await?.is_none(),
        "dry run created the admin Secret"
    );
    plane.stop().await;
    Ok(())
}

// ---- with Docker (scripts/kind-e2e.sh) ----

fn keep_cluster() -> bool {
    std::env::var("CONFORMANCE_KEEP_CLUSTER").is_ok_and(|v| v == "1" || v == "true")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and kind; run by scripts/kind-e2e.sh"]
async fn kind_tier_runs_the_operator_and_a_daemon_that_uses_its_key() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    // Node image: KIND_NODE_IMAGE (`offline`: built here), else the one the kind config pins.
    let options = KindOptions {
        name: "coder-conformance-tiers".to_owned(),
        keep: keep_cluster(),
        logs_dir: Some(repo().join("reports/tiers-kind-logs")),
        ..KindOptions::new(&repo())
    };
    let cluster = KindCluster::provision(options).await?;
    daemon_uses_the_operators_key(cluster.provisioned()).await?;
    suite_image_runs_a_scenario(cluster.provisioned()).await
}

/// The suite's image (scripts/suite-image.sh) runs a scenario against the cluster through its
/// kubeconfig and the installed operator, as a vendor's CI would with nothing but the image: the
/// run passes and its report, written to a mounted folder, says the scenario passed on the
/// kubeconfig tier.
async fn suite_image_runs_a_scenario(cluster: &ProvisionedCluster) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    const SCENARIO: &str = "A spec.organizationName longer than 128 characters is rejected";
    // spawn + wait_with_output keeps the inherited stderr (tokio's `output()` would pipe it), so
    // the script's progress reaches the terminal.
    let built = tokio::process::Command::new("bash")
        .arg(repo().join("scripts/suite-image.sh"))
        // The release build the tier made with the other images' binaries.
        .arg("--binary")
        .arg(conformance::cluster::images::image_binaries_dir().join("conformance"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()?
        .wait_with_output()
        .await?;
    anyhow::ensure!(
        built.status.success(),
        "scripts/suite-image.sh failed (its messages are above)"
    );
    let image = String::from_utf8(built.stdout)?.trim().to_owned();
    // The image runs as a non-root user: the kubeconfig and the report folder must be its to read
    // and write.
    let shared = tempfile::tempdir()?;
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o777))?;
    let kubeconfig = shared.path().join("kubeconfig");
    std::fs::copy(&cluster.kubeconfig, &kubeconfig)?;
    std::fs::set_permissions(&kubeconfig, std::fs::Permissions::from_mode(0o644))?;
    let run = tokio::process::Command::new("docker")
        .args(["run", "--rm", "--network", "host", "-v"])
        .arg(format!("{}:/shared", shared.path().display()))
        .arg(&image)
        .args([
            "run",
            "--cluster",
            "kubeconfig",
            "--kubeconfig",
            "/shared/kubeconfig",
            "--operator",
            "installed",
            "--operator-deployment",
            "coder-system/coder-provisioner-operator",
            "--report-dir",
            "/shared/reports",
            "--name",
            SCENARIO,
        ])
        .stdout(std::process::Stdio::inherit())
        .stderr(std::process::Stdio::inherit())
        .status()
        .await?;
    anyhow::ensure!(
        run.success(),
        "the suite's image failed its run ({run}); its output is above"
    );
    let report: Value = serde_saphyr::from_str(&std::fs::read_to_string(
        shared
            .path()
            .join("reports")
            .join(conformance::paths::REPORT_FILE),
    )?)?;
    let result = report["results"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["scenario"] == SCENARIO)
        .with_context(|| format!("the image's report has no result for {SCENARIO:?}"))?;
    assert_eq!(result["status"], "passed", "{result}");
    assert_eq!(
        report["environment"]["tier"], "kubeconfig",
        "{}",
        report["environment"]
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine (k3s in a privileged container); run with: cargo test -p conformance --test tiers k3s -- --ignored"]
async fn k3s_tier_runs_the_operator_and_a_daemon_that_uses_its_key() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cluster = K3sCluster::provision(K3sOptions {
        keep: keep_cluster(),
        ..K3sOptions::new(&repo())
    })
    .await?;
    daemon_uses_the_operators_key(cluster.provisioned()).await
}

/// The fake coderd's image on its own, as a vendor's test would run it: started through
/// testcontainers (the code path the k3s tier uses, which has no image here), its coderd API
/// driven with the owner token it was given, the admin API on the second port journaling it.
/// Needs the images built by the kind tier test (scripts/kind-e2e.sh runs this after it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the fake-coderd image; run by scripts/kind-e2e.sh"]
async fn fake_coderd_image_serves_coderd_in_a_container_through_testcontainers()
-> anyhow::Result<()> {
    use fake_coderd::JournalQuery;
    use testcontainers_modules::testcontainers::core::{IntoContainerPort, WaitFor};
    use testcontainers_modules::testcontainers::runners::AsyncRunner;
    use testcontainers_modules::testcontainers::{GenericImage, ImageExt};

    let _ = rustls::crypto::ring::default_provider().install_default();
    const OPERATOR_TOKEN: &str = "abcdefghij-0123456789012345678901";
    const ADMIN_TOKEN: &str = "container-admin-token";
    let images = Images::with_tag(DEFAULT_TAG);
    let (name, tag) = images
        .fake_coderd
        .rsplit_once(':')
        .context("image reference has a tag")?;
    let container = GenericImage::new(name, tag)
        .with_exposed_port(3000.tcp())
        .with_exposed_port(3001.tcp())
        .with_wait_for(WaitFor::message_on_stdout("fake-coderd: admin API on"))
        .with_env_var("FAKE_CODERD_OPERATOR_TOKEN", OPERATOR_TOKEN)
        .with_env_var("FAKE_CODERD_ADMIN_TOKEN", ADMIN_TOKEN)
        .start()
        .await
        .with_context(|| format!("starting {} through testcontainers", images.fake_coderd))?;
    let host = container.get_host().await?;
    let api = format!(
        "http://{host}:{}",
        container.get_host_port_ipv4(3000.tcp()).await?
    );
    let admin_url = format!(
        "http://{host}:{}",
        container.get_host_port_ipv4(3001.tcp()).await?
    );
    let http = reqwest::Client::new();

    let created: Value = http
        .post(format!(
            "{api}/api/v2/organizations/default/provisionerkeys"
        ))
        .header("Coder-Session-Token", OPERATOR_TOKEN)
        .json(&json!({"name": "from-a-container"}))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let key = created["key"]
        .as_str()
        .context("the create answer holds the key")?;
    let daemon = http
        .get(format!("{api}/api/v2/provisionerkeys/{key}"))
        .header("Coder-Provisioner-Daemon-Key", key)
        .send()
        .await?;
    assert_eq!(daemon.status(), 200, "the daemon route accepts the new key");
    let anonymous = http
        .post(format!(
            "{api}/api/v2/organizations/default/provisionerkeys"
        ))
        .json(&json!({"name": "no-token"}))
        .send()
        .await?;
    assert_eq!(
        anonymous.status(),
        401,
        "a key request without a token is refused"
    );

    let admin = fake_coderd::AdminClient::new(&admin_url, ADMIN_TOKEN);
    assert_eq!(admin.info().await?.operator_token, OPERATOR_TOKEN);
    let keys = admin.keys("default").await?;
    assert_eq!(
        keys.iter().map(|k| k.name.as_str()).collect::<Vec<_>>(),
        ["from-a-container"]
    );
    let journal = admin.journal().await?;
    assert_eq!(
        journal.count("POST", fake_coderd::routes::CREATE_KEY),
        2,
        "both key requests are journaled"
    );
    Ok(())
}

/// Contract D-8 end to end: the tutorial's sample CoderProvisioner, a control plane pointing at
/// the in-cluster fake with the stub daemon image; the operator (running in the cluster) creates
/// the key and the Deployment, the stub pod becomes ready, and the fake journals a daemon-key
/// request made with exactly the key in the operator's Secret.
async fn daemon_uses_the_operators_key(cluster: &ProvisionedCluster) -> anyhow::Result<()> {
    let client = client_from_file(&cluster.kubeconfig).await?;
    let admin = cluster.fake_coderd.admin();
    admin.reset().await?;
    let operator_token = admin.info().await?.operator_token;
    let namespace = "tiers-e2e";

    let objects = json!([
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "coder-operator-token", "namespace": namespace},
         "type": "Opaque", "stringData": {"token": operator_token}},
        {"apiVersion": "coder.com/v1alpha1", "kind": "CoderControlPlane",
         "metadata": {"name": "codercontrolplane-sample", "namespace": namespace},
         "spec": {"image": cluster.images.coder_stub}},
    ]);
    let objects: Vec<DynamicObject> = serde_json::from_value(objects)?;
    manifests::apply_objects(&client, objects, &ApplyOptions::default()).await?;
    let control_planes: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        namespace,
        &kube::discovery::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
            "coder.com",
            "v1alpha1",
            "CoderControlPlane",
        )),
    );
    let now = jiff::Timestamp::now()
        .round(jiff::Unit::Second)?
        .to_string();
    let status = json!({"status": {
        "phase": "Ready",
        "url": cluster.fake_coderd.in_cluster_url,
        "operatorAccessReady": true,
        "operatorTokenSecretRef": {"name": "coder-operator-token", "key": "token"},
        "externalProvisionerDaemonsEntitlement": "entitled",
        "entitlementsLastChecked": now,
    }});
    control_planes
        .patch_status(
            "codercontrolplane-sample",
            &PatchParams::default(),
            &Patch::Merge(&status),
        )
        .await?;
    let sample = std::fs::read_to_string(
        repo().join("config/samples/coder_v1alpha1_coderprovisioner.yaml"),
    )?;
    let options = ApplyOptions {
        namespace: Some(namespace.to_owned()),
        ..ApplyOptions::default()
    };
    manifests::apply_yaml_str(&client, &sample, &options).await?;

    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let deadline = Instant::now() + Duration::from_secs(300);
    let outcome = loop {
        let key = secrets
            .get_opt("coderprovisioner-sample-provisioner-key")
            .await?
            .and_then(|s| s.data)
            .and_then(|d| {
                d.get("key")
                    .map(|v| String::from_utf8_lossy(&v.0).into_owned())
            });
        let ready = deployments
            .get_opt("provisioner-coderprovisioner-sample")
            .await?
            .is_some_and(|d| kind::deployment_available(&d));
        let authenticated = match &key {
            Some(key) => {
                let fingerprint = fake_coderd::fingerprint(key);
                admin.journal().await?.iter().any(|entry| {
                    entry.route.as_deref() == Some(fake_coderd::routes::DAEMON_KEY)
                        && entry.status == 200
                        && entry.daemon_key_fingerprint.as_deref() == Some(fingerprint.as_str())
                })
            }
            None => false,
        };
        if ready && authenticated {
            break Ok(());
        }
        if Instant::now() >= deadline {
            break Err(anyhow::anyhow!(
                "within 300s: key Secret written {}, stub Deployment available {ready}, daemon-key request journaled {authenticated}",
                key.is_some()
            ));
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    let namespaces: Api<Namespace> = Api::all(client);
    let cleanup = namespaces.delete(namespace, &DeleteParams::default()).await;
    outcome?;
    cleanup.with_context(|| format!("deleting namespace {namespace}"))?;
    Ok(())
}
