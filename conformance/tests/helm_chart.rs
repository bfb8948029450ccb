//! The reference operator's Helm chart (config/helm/coder-provisioner-operator), checked with the
//! pinned helm that scripts/helm-binary.sh resolves (or builds): `helm lint --strict`, and
//! `helm template` renderings compared with config/: the RBAC rules are exactly those of
//! config/rbac, the CRDs are config/crd's (byte for byte), the default Deployment is
//! config/manager's, the Deployments' args follow the values, and the values schema refuses
//! unknown keys. Only helm runs here (no cluster): each test takes well under a second once helm
//! is cached.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use conformance::manifests;
use kube::api::DynamicObject;
use serde_json::Value;

const CHART: &str = "config/helm/coder-provisioner-operator";
/// The release name and namespace of the renderings: with these, the chart names its objects as
/// config/ does.
const RELEASE: &str = "coder-provisioner-operator";
const NAMESPACE: &str = "coder-system";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn chart() -> PathBuf {
    repo().join(CHART)
}

/// The helm binary, from `bash scripts/helm-binary.sh` (once per test binary: a first run builds
/// it). No helm is a failure, with the script's own message, never a skip; the script runs once
/// even then (every test fails with its message).
fn helm() -> &'static Path {
    static HELM: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let resolved = HELM.get_or_init(|| {
        let output = Command::new("bash")
            .arg("scripts/helm-binary.sh")
            .current_dir(repo())
            .output()
            .map_err(|e| format!("running bash scripts/helm-binary.sh: {e}"))?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        if !output.status.success() {
            return Err(format!(
                "scripts/helm-binary.sh failed ({}), so the chart cannot be checked:\n{stderr}",
                output.status
            ));
        }
        let path = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
        if !path.is_file() {
            return Err(format!(
                "scripts/helm-binary.sh printed {path:?}, which is not a file:\n{stderr}"
            ));
        }
        Ok(path)
    });
    match resolved {
        Ok(path) => path,
        Err(message) => panic!("{message}"),
    }
}

/// Helm's own folders (cache, configuration, data), kept away from the user's: in Cargo's scratch
/// folder for integration tests (`helm lint` and `helm template` write nothing there).
fn helm_home() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("helm-home")
}

/// Runs helm with `args`: its stdout when it succeeds, else its stderr (and stdout).
fn run_helm(args: &[&str]) -> Result<String, String> {
    let home = helm_home();
    let output = Command::new(helm())
        .args(args)
        .current_dir(repo())
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()
        .expect("running helm");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if output.status.success() {
        Ok(stdout)
    } else {
        Err(format!(
            "helm {} failed ({}):\n{}{stdout}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// `helm template` of the chart as release RELEASE in NAMESPACE, with `extra` arguments
/// (`--set …`, `-f …`, `--include-crds`).
fn try_template(extra: &[&str]) -> Result<Vec<DynamicObject>, String> {
    let chart = chart();
    let chart = chart.to_str().expect("a UTF-8 path");
    let mut args = vec!["template", RELEASE, chart, "--namespace", NAMESPACE];
    args.extend_from_slice(extra);
    let yaml = run_helm(&args)?;
    manifests::parse_documents(&yaml).map_err(|e| format!("the rendering does not parse: {e:#}"))
}

fn template(extra: &[&str]) -> Vec<DynamicObject> {
    try_template(extra).unwrap_or_else(|e| panic!("{e}"))
}

fn one<'a>(objects: &'a [DynamicObject], kind: &str) -> &'a DynamicObject {
    manifests::only_of_kind(objects, kind).unwrap_or_else(|e| panic!("{e:#}"))
}

fn config(dir: &str) -> Vec<DynamicObject> {
    manifests::read_dir(&repo().join(dir)).unwrap_or_else(|e| panic!("{dir}: {e:#}"))
}

/// One RBAC rule, its lists by field (apiGroups, resources, verbs, …), so that rules compare
/// whatever the order of their fields.
type Rule = BTreeMap<String, Vec<String>>;

/// The rules of every object of `kind`, as a set.
fn rules(objects: &[DynamicObject], kind: &str) -> BTreeSet<Rule> {
    manifests::of_kind(objects, kind)
        .into_iter()
        .flat_map(|role| {
            role.data["rules"]
                .as_array()
                .unwrap_or_else(|| panic!("{kind} {:?} has rules", role.metadata.name))
                .clone()
        })
        .map(|rule| serde_json::from_value(rule).expect("a rule holds lists of strings"))
        .collect()
}

fn deployments(objects: &[DynamicObject]) -> Vec<&DynamicObject> {
    manifests::of_kind(objects, "Deployment")
}

fn pod_spec(deployment: &DynamicObject) -> &Value {
    &deployment.data["spec"]["template"]["spec"]
}

fn args(deployment: &DynamicObject) -> Vec<String> {
    pod_spec(deployment)["containers"][0]["args"]
        .as_array()
        .expect("the manager container has args")
        .iter()
        .map(|a| a.as_str().expect("an arg is a string").to_owned())
        .collect()
}

/// The value of `--flag=VALUE` in `args`, if present (the chart always writes the `=` form).
fn flag<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let prefix = format!("--{flag}=");
    args.iter().find_map(|a| a.strip_prefix(prefix.as_str()))
}

#[test]
fn the_chart_passes_helm_lint_strict() {
    let chart = chart();
    let chart = chart.to_str().expect("a UTF-8 path");
    for sets in [
        &[][..],
        &[
            "--set",
            "replicaCount=2",
            "--set",
            "watchNamespaces={a,b}",
            "--set",
            "logFormat=text",
            "--set",
            "metrics.service.enabled=true",
        ][..],
    ] {
        let mut args = vec!["lint", "--strict", chart, "--namespace", NAMESPACE];
        args.extend_from_slice(sets);
        let output = run_helm(&args).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            output.contains("1 chart(s) linted, 0 chart(s) failed"),
            "{output}"
        );
    }
}

/// The chart's crds/ holds byte-identical copies of config/crd (regenerated by the operator's
/// crd_drift test: copy them again when it rewrites config/crd), and helm installs exactly them.
#[test]
fn the_crds_are_those_of_config_crd() {
    let crd_files = |dir: &Path| -> BTreeMap<String, Vec<u8>> {
        std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|entry| entry.expect("a folder entry").path())
            .filter(|path| {
                path.extension().is_some_and(|e| e == "yaml")
                    && path.file_name().is_some_and(|n| n != "kustomization.yaml")
            })
            .map(|path| {
                let name = path.file_name().expect("a file name").to_string_lossy();
                (name.into_owned(), std::fs::read(&path).expect("read a CRD"))
            })
            .collect()
    };
    let config_crds = crd_files(&repo().join("config/crd"));
    let chart_crds = crd_files(&chart().join("crds"));
    assert_eq!(
        config_crds.keys().collect::<Vec<_>>(),
        chart_crds.keys().collect::<Vec<_>>(),
        "{CHART}/crds holds the files of config/crd"
    );
    for (name, bytes) in &config_crds {
        assert!(
            chart_crds[name] == *bytes,
            "{CHART}/crds/{name} differs from config/crd/{name}: copy it again \
             (cp config/crd/coder.com_*.yaml {CHART}/crds/)"
        );
    }

    let rendered = template(&["--include-crds"]);
    let rendered_crds: Vec<Value> = manifests::of_kind(&rendered, "CustomResourceDefinition")
        .into_iter()
        .map(|crd| serde_json::to_value(crd).expect("serialize"))
        .collect();
    let expected: Vec<Value> = config("config/crd")
        .iter()
        .map(|crd| serde_json::to_value(crd).expect("serialize"))
        .collect();
    assert_eq!(rendered_crds, expected, "helm installs config/crd's CRDs");
    assert!(
        manifests::of_kind(&template(&[]), "CustomResourceDefinition").is_empty(),
        "the CRDs come from crds/, not from templates/"
    );
}

/// The same RBAC objects as config/rbac, with the same rules (names and labels aside), bound to
/// the ServiceAccount the Deployment runs as.
#[test]
fn the_rbac_rules_are_those_of_config_rbac() {
    let expected = config("config/rbac");
    let rendered = template(&[]);
    let kinds = |objects: &[DynamicObject]| -> Vec<String> {
        let mut kinds: Vec<String> = objects
            .iter()
            .map(manifests::kind_of)
            .filter(|k| {
                [
                    "ServiceAccount",
                    "ClusterRole",
                    "ClusterRoleBinding",
                    "Role",
                    "RoleBinding",
                ]
                .contains(k)
            })
            .map(str::to_owned)
            .collect();
        kinds.sort();
        kinds
    };
    assert_eq!(kinds(&rendered), kinds(&expected), "the RBAC objects");
    for kind in ["ClusterRole", "Role"] {
        assert_eq!(
            rules(&rendered, kind),
            rules(&expected, kind),
            "the {kind} rules differ from config/rbac's"
        );
    }

    let service_account = one(&rendered, "ServiceAccount");
    let sa_name = service_account.metadata.name.as_deref().expect("a name");
    assert_eq!(
        service_account.metadata.namespace.as_deref(),
        Some(NAMESPACE)
    );
    assert_eq!(
        pod_spec(deployments(&rendered)[0])["serviceAccountName"],
        sa_name
    );
    for (binding_kind, role_kind) in [
        ("ClusterRoleBinding", "ClusterRole"),
        ("RoleBinding", "Role"),
    ] {
        let binding = one(&rendered, binding_kind);
        let role = one(&rendered, role_kind);
        assert_eq!(binding.data["roleRef"]["kind"], role_kind);
        assert_eq!(
            binding.data["roleRef"]["name"].as_str(),
            role.metadata.name.as_deref(),
            "{binding_kind} binds the {role_kind}"
        );
        assert_eq!(
            binding.data["subjects"],
            serde_json::json!([{"kind": "ServiceAccount", "name": sa_name, "namespace": NAMESPACE}]),
            "{binding_kind} subjects"
        );
    }
    // The Lease Role is where the Lease is: the operator's namespace.
    assert_eq!(
        one(&rendered, "Role").metadata.namespace.as_deref(),
        Some(NAMESPACE)
    );

    // A chosen ServiceAccount name is the one created, bound and run as.
    let named = template(&["--set", "serviceAccount.name=provisioner-operator"]);
    assert_eq!(
        one(&named, "ServiceAccount").metadata.name.as_deref(),
        Some("provisioner-operator")
    );
    assert_eq!(
        pod_spec(deployments(&named)[0])["serviceAccountName"],
        "provisioner-operator"
    );
    for binding in manifests::of_kind(&named, "ClusterRoleBinding")
        .into_iter()
        .chain(manifests::of_kind(&named, "RoleBinding"))
    {
        assert_eq!(binding.data["subjects"][0]["name"], "provisioner-operator");
    }
}

/// Watching some namespaces: the same ClusterRole, bound in those namespaces only.
#[test]
fn watched_namespaces_get_the_cluster_role_in_them_only() {
    let expected = config("config/rbac");
    let rendered = template(&["--set", "watchNamespaces={a,b}"]);
    assert_eq!(
        rules(&rendered, "ClusterRole"),
        rules(&expected, "ClusterRole")
    );
    assert_eq!(rules(&rendered, "Role"), rules(&expected, "Role"));
    assert!(
        manifests::of_kind(&rendered, "ClusterRoleBinding").is_empty(),
        "no cluster-wide binding when namespaces are listed"
    );
    let cluster_role = one(&rendered, "ClusterRole").metadata.name.as_deref();
    let mut bound_in: Vec<&str> = manifests::of_kind(&rendered, "RoleBinding")
        .into_iter()
        .filter(|b| b.data["roleRef"]["kind"] == "ClusterRole")
        .inspect(|b| assert_eq!(b.data["roleRef"]["name"].as_str(), cluster_role))
        .map(|b| b.metadata.namespace.as_deref().expect("a namespace"))
        .collect();
    bound_in.sort();
    assert_eq!(bound_in, ["a", "b"]);

    // Without leader election (one replica), no Lease Role.
    let single = template(&["--set", "leaderElection.enabled=false"]);
    assert!(
        manifests::of_kind(&single, "Role").is_empty(),
        "a Lease Role without leader election"
    );
    assert!(
        manifests::of_kind(&single, "RoleBinding").is_empty(),
        "a Lease RoleBinding without leader election"
    );
}

/// The default rendering runs what config/manager runs: same pod spec, same args (plus the Lease
/// name, which is the Deployment's).
#[test]
fn the_default_deployment_is_config_manager() {
    let manager = config("config/manager");
    let expected = one(&manager, "Deployment");
    let rendered = template(&[]);
    let deployment = one(&rendered, "Deployment");
    assert_eq!(deployment.metadata.name, expected.metadata.name);
    assert_eq!(deployment.metadata.namespace, expected.metadata.namespace);
    assert_eq!(
        deployment.data["spec"]["replicas"],
        expected.data["spec"]["replicas"]
    );

    let mut expected_args = args(expected);
    expected_args.push(format!("--leader-election-lease-name={RELEASE}"));
    let mut rendered_args = args(deployment);
    expected_args.sort();
    rendered_args.sort();
    assert_eq!(rendered_args, expected_args);

    let without_args = |deployment: &DynamicObject| {
        let mut spec = pod_spec(deployment).clone();
        spec["containers"][0]
            .as_object_mut()
            .expect("a container")
            .remove("args");
        spec
    };
    assert_eq!(without_args(deployment), without_args(expected));
}

#[test]
fn the_deployment_args_follow_the_values() {
    // Defaults: every namespace, leader election on, JSON logs.
    let rendered = template(&[]);
    let args_default = args(one(&rendered, "Deployment"));
    assert_eq!(flag(&args_default, "namespace"), None, "every namespace");
    assert_eq!(flag(&args_default, "leader-election"), Some("true"));
    assert_eq!(flag(&args_default, "log-format"), Some("json"));
    assert_eq!(flag(&args_default, "metrics-addr"), Some("0.0.0.0:8080"));

    // Leader election off with one replica; text logs; another metrics port, with a Service.
    let rendered = template(&[
        "--set",
        "leaderElection.enabled=false",
        "--set",
        "logFormat=text",
        "--set",
        "metrics.port=9090",
        "--set",
        "metrics.service.enabled=true",
    ]);
    let deployment = one(&rendered, "Deployment");
    let single = args(deployment);
    assert_eq!(flag(&single, "leader-election"), Some("false"));
    assert_eq!(flag(&single, "leader-election-lease-name"), None);
    assert_eq!(flag(&single, "log-format"), Some("text"));
    assert_eq!(flag(&single, "metrics-addr"), Some("0.0.0.0:9090"));
    assert_eq!(
        pod_spec(deployment)["containers"][0]["ports"][0]["containerPort"],
        9090
    );
    let service = one(&rendered, "Service");
    assert_eq!(
        service.data["spec"]["ports"][0]["targetPort"],
        "http-metrics"
    );
    assert_eq!(
        service.data["spec"]["selector"], deployment.data["spec"]["selector"]["matchLabels"],
        "the Service selects the operator's pods"
    );

    // One namespace: one Deployment that watches it.
    let rendered = template(&["--set", "watchNamespaces={a}"]);
    let deployment = one(&rendered, "Deployment");
    assert_eq!(deployment.metadata.name.as_deref(), Some(RELEASE));
    assert_eq!(flag(&args(deployment), "namespace"), Some("a"));

    // Two replicas (leader election forced on, though disabled), two namespaces, JSON logs: one
    // Deployment per namespace (the operator watches one namespace per process), each with its
    // own Lease and pods.
    let rendered = template(&[
        "--set",
        "replicaCount=2",
        "--set",
        "leaderElection.enabled=false",
        "--set",
        "watchNamespaces={a,b}",
        "--set",
        "logFormat=json",
    ]);
    let deployments = deployments(&rendered);
    let mut watched = Vec::new();
    let mut leases = BTreeSet::new();
    let mut selectors = BTreeSet::new();
    for deployment in &deployments {
        let args = args(deployment);
        assert_eq!(deployment.data["spec"]["replicas"], 2);
        assert_eq!(
            flag(&args, "leader-election"),
            Some("true"),
            "forced on with 2 replicas"
        );
        assert_eq!(flag(&args, "log-format"), Some("json"));
        let namespace = flag(&args, "namespace").expect("--namespace").to_owned();
        assert_eq!(
            deployment.metadata.name.as_deref(),
            Some(format!("{RELEASE}-{namespace}").as_str())
        );
        leases.insert(
            flag(&args, "leader-election-lease-name")
                .expect("a Lease name")
                .to_owned(),
        );
        selectors.insert(deployment.data["spec"]["selector"].to_string());
        assert_eq!(
            deployment.data["spec"]["template"]["metadata"]["labels"]["coder.com/watch-namespace"],
            namespace.as_str()
        );
        watched.push(namespace);
    }
    watched.sort();
    assert_eq!(watched, ["a", "b"]);
    assert_eq!(
        leases.len(),
        2,
        "each Deployment has its own Lease: {leases:?}"
    );
    assert_eq!(
        selectors.len(),
        2,
        "the Deployments' selectors do not overlap"
    );
    assert_eq!(
        one(&rendered, "Role").metadata.namespace.as_deref(),
        Some(NAMESPACE),
        "the Lease Role"
    );
}

#[test]
fn the_values_schema_refuses_unknown_keys_and_bad_values() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    for (values, culprit) in [
        ("bogus: true\n", "bogus"),
        ("metrics:\n  prot: 9090\n", "prot"),
        (
            "image:\n  repository: x\n  tag: y\n  pullPolicy: Always\n  digest: z\n",
            "digest",
        ),
        (
            "leaderElection:\n  enabled: true\n  leaseDuration: 15\n",
            "leaseDuration",
        ),
        ("logFormat: yaml\n", "logFormat"),
        ("watchNamespaces: [all]\n", "watchNamespaces"),
        ("replicaCount: 0\n", "replicaCount"),
    ] {
        let file = dir.path().join("values.yaml");
        std::fs::write(&file, values).expect("write the values");
        let Err(error) = try_template(&["-f", file.to_str().expect("a UTF-8 path")]) else {
            panic!("the schema accepted {values:?}");
        };
        assert!(
            error.contains("schema") && error.contains(culprit),
            "the refusal of {values:?} names the schema and {culprit}:\n{error}"
        );
    }
}

// ---- helm test (templates/tests/) ----

const TEST_CODERD: &str = "http://fake-coderd.coder-fake.svc:3000";
const TEST_CONTROL_PLANE: &str = "coder/codercontrolplane-sample";

fn test_values(extra: &[&'static str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "--set",
        "test.enabled=true",
        "--set",
        &format!("test.coderdURL={TEST_CODERD}"),
        "--set",
        &format!("test.controlPlane={TEST_CONTROL_PLANE}"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn template_owned(args: &[String]) -> Result<Vec<DynamicObject>, String> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    try_template(&args)
}

fn test_objects(objects: &[DynamicObject]) -> Vec<&DynamicObject> {
    objects
        .iter()
        .filter(|o| {
            o.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("app.kubernetes.io/component"))
                .is_some_and(|c| c == "test")
        })
        .collect()
}

fn container_args(pod: &DynamicObject) -> Vec<String> {
    pod.data["spec"]["containers"][0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("a string").to_owned())
        .collect()
}

#[test]
fn the_test_hook_is_off_by_default() {
    let rendered = template(&[]);
    assert!(
        test_objects(&rendered).is_empty(),
        "test.enabled defaults to false: nothing of helm test is rendered"
    );
    assert!(
        rendered.iter().all(|o| kind_name(o) != "Pod"),
        "no Pod by default"
    );
}

fn kind_name(object: &DynamicObject) -> &str {
    object
        .types
        .as_ref()
        .map(|t| t.kind.as_str())
        .unwrap_or_default()
}

/// The hook runs the suite's image against this release's operator and the given coderd and
/// control plane, as test hooks (its RBAC first), deleted after a success.
#[test]
fn the_test_hook_runs_the_suite_against_the_release() {
    let rendered = template_owned(&test_values(&[])).unwrap_or_else(|e| panic!("{e}"));
    let hooks = test_objects(&rendered);
    let kinds: BTreeSet<&str> = hooks.iter().map(|o| kind_name(o)).collect();
    assert_eq!(
        kinds,
        BTreeSet::from([
            "ClusterRole",
            "ClusterRoleBinding",
            "Pod",
            "Role",
            "RoleBinding",
            "ServiceAccount"
        ])
    );
    for hook in &hooks {
        let annotations = hook.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(
            annotations.get("helm.sh/hook").map(String::as_str),
            Some("test"),
            "{:?} is a test hook",
            hook.metadata.name
        );
        assert_eq!(
            annotations
                .get("helm.sh/hook-delete-policy")
                .map(String::as_str),
            Some("before-hook-creation,hook-succeeded")
        );
        let weight = if kind_name(hook) == "Pod" { "0" } else { "-1" };
        assert_eq!(
            annotations.get("helm.sh/hook-weight").map(String::as_str),
            Some(weight),
            "the RBAC exists before the Pod"
        );
    }
    let pod = one(&rendered, "Pod");
    let service_account = hooks
        .iter()
        .find(|o| kind_name(o) == "ServiceAccount")
        .expect("the suite's ServiceAccount");
    assert_eq!(
        pod.data["spec"]["serviceAccountName"].as_str(),
        service_account.metadata.name.as_deref()
    );
    assert_eq!(pod.data["spec"]["restartPolicy"], "Never");
    assert_eq!(
        pod.data["spec"]["containers"][0]["image"],
        "coder-provisioner-conformance:latest"
    );
    let args = container_args(pod);
    assert_eq!(args[0], "run");
    for expected in [
        "--cluster=kubeconfig".to_owned(),
        "--operator=installed".to_owned(),
        format!("--operator-deployment={NAMESPACE}/{RELEASE}"),
        format!("--coderd={TEST_CODERD}"),
        format!("--control-plane={TEST_CONTROL_PLANE}"),
        format!("--tags={DEFAULT_TEST_TAGS}"),
        "--fail-fast".to_owned(),
        "--concurrency=1".to_owned(),
    ] {
        assert!(args.contains(&expected), "{expected} in {args:?}");
    }
    // Scenario objects in the control plane's namespace; the operator's pods and logs in the
    // release's.
    let roles: Vec<&DynamicObject> = rendered.iter().filter(|o| kind_name(o) == "Role").collect();
    let namespaces: BTreeSet<&str> = roles
        .iter()
        .filter_map(|r| r.metadata.namespace.as_deref())
        .collect();
    assert_eq!(namespaces, BTreeSet::from(["coder", NAMESPACE]));
    let scenario_rules = rules(
        &[roles
            .iter()
            .find(|r| r.metadata.namespace.as_deref() == Some("coder"))
            .map(|r| (*r).clone())
            .expect("a Role in the control plane's namespace")],
        "Role",
    );
    assert!(
        scenario_rules
            .iter()
            .any(|rule| rule["resources"] == ["coderprovisioners"]
                && rule["verbs"].contains(&"create".to_owned())
                && rule["verbs"].contains(&"delete".to_owned())),
        "the suite creates and deletes CoderProvisioners there: {scenario_rules:?}"
    );
}

/// The hook targets the Deployment that watches the control plane's namespace; a namespace no
/// Deployment watches is refused at rendering.
#[test]
fn the_test_hook_targets_the_deployment_watching_the_control_planes_namespace() {
    let rendered = template_owned(&test_values(&["--set", "watchNamespaces={team-a,coder}"]))
        .unwrap_or_else(|e| panic!("{e}"));
    let args = container_args(one(&rendered, "Pod"));
    assert!(
        args.contains(&format!(
            "--operator-deployment={NAMESPACE}/{RELEASE}-coder"
        )),
        "{args:?}"
    );
    let error = template_owned(&test_values(&["--set", "watchNamespaces={team-a}"]))
        .expect_err("no Deployment watches coder");
    assert!(error.contains("no operator Deployment"), "{error}");
}

#[test]
fn the_test_values_are_checked() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    for (values, culprit) in [
        ("test:\n  enabled: true\n", "coderdURL"),
        (
            "test:\n  enabled: true\n  coderdURL: http://c:3000\n  controlPlane: just-a-name\n",
            "controlPlane",
        ),
        ("test:\n  enabled: false\n  bogus: 1\n", "bogus"),
        (
            "test:\n  enabled: false\n  coderdURL: not a url\n",
            "coderdURL",
        ),
    ] {
        let file = dir.path().join("values.yaml");
        std::fs::write(&file, values).expect("write the values");
        let Err(error) = try_template(&["-f", file.to_str().expect("a UTF-8 path")]) else {
            panic!("the chart accepted {values:?}");
        };
        assert!(
            error.contains(culprit),
            "the refusal of {values:?} names {culprit}:\n{error}"
        );
    }
}

/// values.yaml's test.tags.
const DEFAULT_TEST_TAGS: &str = "@core and not @fake-coderd and not @fault-injection and not @operator-restart and not @serial and not @slow";

/// The default smoke selection, as the suite reads it against a real coderd and an installed
/// operator: the tutorial and Core scenarios only, none that needs the fake coderd or injects a
/// fault, and at least one (the tutorial) that needs the operator to reconcile.
#[test]
fn the_default_test_tags_select_the_tutorial_and_nothing_that_needs_the_fake() {
    let values: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(chart().join("values.yaml")).expect("values.yaml"),
    )
    .expect("values.yaml parses");
    assert_eq!(values["test"]["tags"], DEFAULT_TEST_TAGS);
    let output = Command::new(env!("CARGO_BIN_EXE_conformance"))
        .args([
            "run",
            "--list",
            "--tags",
            DEFAULT_TEST_TAGS,
            "--coderd",
            TEST_CODERD,
            "--control-plane",
            TEST_CONTROL_PLANE,
            "--operator",
            "installed",
            "--operator-deployment",
            "coder-system/coder-provisioner-operator",
        ])
        .output()
        .expect("running conformance run --list");
    assert!(output.status.success(), "{output:?}");
    let listing = String::from_utf8_lossy(&output.stdout);
    let selected: Vec<&str> = listing
        .lines()
        .filter(|l| !l.contains("(skipped"))
        .filter(|l| l.contains('['))
        .collect();
    assert!(
        selected
            .iter()
            .any(|l| l.contains("The tutorial from its prerequisites to its clean-up")),
        "the tutorial runs:\n{listing}"
    );
    for line in &selected {
        assert!(line.contains("@core"), "{line}");
        for tag in ["@fake-coderd", "@fault-injection", "@operator-restart"] {
            assert!(!line.contains(tag), "{line}");
        }
    }
}
