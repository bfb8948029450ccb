use super::*;
use rstest::rstest;

struct Fixture {
    cr: Value,
    around: Surroundings,
}

fn fixture() -> Fixture {
    let all: Value = serde_saphyr::from_str(include_str!("settled.yaml")).expect("fixture YAML");
    let coderd = &all["coderd"];
    Fixture {
        cr: all["cr"].clone(),
        around: Surroundings {
            control_plane: Some(all["controlPlane"].clone()),
            objects: all["objects"].as_array().cloned().unwrap_or_default(),
            coderd: Some(CoderdView {
                organizations: serde_json::from_value(coderd["organizations"].clone())
                    .expect("organizations"),
                keys: serde_json::from_value(coderd["keys"].clone()).expect("keys"),
            }),
            secret_key_identity: Some(Ok("key-1".to_owned())),
        },
    }
}

fn set(target: &mut Value, pointer: &str, value: Value) {
    *target
        .pointer_mut(pointer)
        .unwrap_or_else(|| panic!("{pointer}")) = value;
}

fn object<'a>(fixture: &'a mut Fixture, kind: &str) -> &'a mut Value {
    fixture
        .around
        .objects
        .iter_mut()
        .find(|o| o["kind"] == kind)
        .expect(kind)
}

fn all_findings(fixture: &Fixture) -> Vec<String> {
    let mut found = settled_state_findings(&fixture.cr);
    found.extend(world_findings(&fixture.cr, &fixture.around));
    found
}

#[test]
fn the_fixture_is_settled_and_clean() {
    let fixture = fixture();
    assert!(ready_for_its_spec(&fixture.cr));
    assert_eq!(all_findings(&fixture), Vec::<String>::new());
}

#[test]
fn an_unsettled_cr_names_the_rules_its_status_contradicts() {
    let mut cr = fixture().cr;
    assert_eq!(unsettled_rules(&cr), Vec::<&str>::new());
    let conditions = cr["status"]["conditions"]
        .as_array_mut()
        .expect("conditions");
    for condition in conditions.iter_mut() {
        if condition["type"] == "ProvisionerKeyReady" {
            condition["status"] = Value::from("False");
        }
    }
    assert_eq!(unsettled_rules(&cr), vec!["R-KEY-20"]);
    set(&mut cr, "/status/observedGeneration", Value::from(0));
    assert_eq!(
        unsettled_rules(&cr),
        vec!["R-KEY-20"],
        "the generation unobserved follows from the key's failure: only the root is blamed"
    );
    for condition in cr["status"]["conditions"]
        .as_array_mut()
        .expect("conditions")
    {
        condition["status"] = Value::from("True");
    }
    assert_eq!(unsettled_rules(&cr), vec!["R-ST-4"]);
}

#[test]
fn a_condition_shown_false_is_the_root_before_one_left_absent() {
    let mut cr = fixture().cr;
    let conditions = cr["status"]["conditions"]
        .as_array_mut()
        .expect("conditions");
    conditions.retain(|c| c["type"] != "ProvisionerKeySecretReady");
    for condition in conditions.iter_mut() {
        if condition["type"] == "ProvisionerKeyReady" {
            condition["status"] = Value::from("False");
        }
    }
    assert_eq!(unsettled_rules(&cr), vec!["R-KEY-20"]);
    cr["status"]["conditions"]
        .as_array_mut()
        .expect("conditions")
        .retain(|c| c["type"] != "ProvisionerKeyReady");
    assert_eq!(unsettled_rules(&cr), vec!["R-SEC-7"], "absent, the earlier stage is the root");
}

#[test]
fn tags_hash_of_no_tags_is_the_offset_basis() {
    assert_eq!(tags_hash(&BTreeMap::new()), "811c9dc5");
}

/// Each mistake an operator can make in one place gives exactly the finding of its rule.
#[rstest]
#[case::organization_from_elsewhere("/cr/status/organizationName", json!("default"), "R-KEY-6")]
#[case::key_name_not_lowered("/cr/status/provisionerKeyName", json!("Sample-Key"), "R-KEY-6")]
#[case::secret_ref_default_key("/cr/status/secretRef/key", json!("key"), "R-SEC-6")]
#[case::tags_hash_stale("/cr/status/tagsHash", json!("811c9dc5"), "R-ST-8")]
#[case::control_plane_name("/cr/status/controlPlaneRefName", json!("other"), "R-KEY-6")]
#[case::control_plane_url("/cr/status/controlPlaneURL", json!("http://old:3000"), "R-KEY-6")]
#[case::organization_id("/cr/status/organizationID", json!("org-2"), "R-KEY-6")]
#[case::ready_without_replicas("/cr/status/readyReplicas", json!(0), "R-ST-2")]
fn one_status_mistake_one_finding(#[case] pointer: &str, #[case] value: Value, #[case] rule: &str) {
    let mut fixture = fixture();
    set(&mut fixture.cr, pointer.trim_start_matches("/cr"), value);
    let found = all_findings(&fixture);
    assert!(
        found.iter().any(|f| f.ends_with(&format!("({rule})"))),
        "{found:?}"
    );
}

#[rstest]
#[case::replicas("Deployment", "/spec/replicas", json!(1), "R-POD-1")]
#[case::command("Deployment", "/spec/template/spec/containers/0/command", json!(["/bin/coder"]), "R-POD-9")]
#[case::args("Deployment", "/spec/template/spec/containers/0/args", json!(["provisionerd", "start", "--verbose"]), "R-POD-10")]
#[case::url("Deployment", "/spec/template/spec/containers/0/env/0/value", json!("http://old:3000"), "R-POD-11")]
#[case::key_env_default_key("Deployment", "/spec/template/spec/containers/0/env/1/valueFrom/secretKeyRef/key", json!("key"), "R-POD-12")]
#[case::extra_env_dropped_optional("Deployment", "/spec/template/spec/containers/0/env/3/valueFrom/secretKeyRef/optional", json!(false), "R-POD-13")]
#[case::image_default("Deployment", "/spec/template/spec/containers/0/image", json!("ghcr.io/coder/coder:latest"), "R-POD-8")]
#[case::grace("Deployment", "/spec/template/spec/terminationGracePeriodSeconds", json!(30), "R-POD-6")]
#[case::pull_secrets("Deployment", "/spec/template/spec/imagePullSecrets", json!([]), "R-POD-5")]
#[case::resources("Deployment", "/spec/template/spec/containers/0/resources", json!({"limits": {"cpu": "500m"}}), "R-POD-16")]
#[case::account("Deployment", "/spec/template/spec/serviceAccountName", json!("default"), "R-POD-4")]
#[case::secret_type("Secret", "/type", json!("kubernetes.io/opaque"), "R-SEC-2")]
#[case::secret_block("Secret", "/metadata/ownerReferences/0/blockOwnerDeletion", json!(false), "R-SEC-3")]
#[case::secret_label("Secret", "/metadata/labels/app.kubernetes.io~1instance", json!("other"), "R-SEC-4")]
#[case::role_verbs("Role", "/rules/0/verbs", json!(["get", "list", "watch"]), "R-RBAC-1")]
#[case::binding_subject("RoleBinding", "/subjects/0/namespace", json!("default"), "R-RBAC-2")]
#[case::account_label("ServiceAccount", "/metadata/labels/app.kubernetes.io~1name", json!("coder"), "R-RES-4")]
#[case::role_name("Role", "/metadata/name", json!("sample-role"), "R-RES-1")]
fn one_child_mistake_one_finding(
    #[case] kind: &str,
    #[case] pointer: &str,
    #[case] value: Value,
    #[case] rule: &str,
) {
    let mut fixture = fixture();
    set(object(&mut fixture, kind), pointer, value);
    let found = all_findings(&fixture);
    assert!(
        found.iter().any(|f| f.ends_with(&format!("({rule})"))),
        "{found:?}"
    );
}

#[test]
fn an_injected_organization_env_is_found() {
    let mut fixture = fixture();
    let env = object(&mut fixture, "Deployment")
        .pointer_mut("/spec/template/spec/containers/0/env")
        .and_then(Value::as_array_mut)
        .expect("env");
    env.push(json!({"name": "CODER_ORGANIZATION", "value": "team"}));
    let found = all_findings(&fixture);
    assert!(found.iter().any(|f| f.ends_with("(R-POD-14)")), "{found:?}");
}

#[test]
fn a_child_without_its_controller_is_missing() {
    let mut fixture = fixture();
    set(
        object(&mut fixture, "Deployment"),
        "/metadata/ownerReferences/0/controller",
        json!(false),
    );
    let found = all_findings(&fixture);
    assert!(
        found.iter().any(|f| f.contains("no Deployment")),
        "{found:?}"
    );
}

#[rstest]
#[case::key_gone(json!([]), "no key with the recorded id")]
#[case::old_tags(json!([{"id": "key-1", "created_at": "", "organization": "org-1", "name": "sample-key", "tags": {"scope": "organization"}}]), "(R-KEY-3, R-KEY-13)")]
fn coderd_keys_match_the_record(#[case] keys: Value, #[case] expected: &str) {
    let mut fixture = fixture();
    fixture.around.coderd.as_mut().expect("coderd").keys =
        serde_json::from_value(keys).expect("keys");
    let found = all_findings(&fixture);
    assert!(found.iter().any(|f| f.contains(expected)), "{found:?}");
}

#[test]
fn a_secret_holding_another_keys_plaintext_is_found() {
    let mut fixture = fixture();
    fixture.around.secret_key_identity = Some(Ok("key-0".to_owned()));
    let found = all_findings(&fixture);
    assert!(found.iter().any(|f| f.ends_with("(R-KEY-5)")), "{found:?}");
}

#[rstest]
#[case::a_gate_false("/status/conditions/2/status", json!("False"))]
#[case::an_older_generation("/status/observedGeneration", json!(1))]
#[case::key_not_ready("/status/conditions/5/status", json!("False"))]
fn an_unsettled_cr_is_not_held_to_its_spec(#[case] pointer: &str, #[case] value: Value) {
    let mut fixture = fixture();
    set(&mut fixture.cr, pointer, value);
    set(&mut fixture.cr, "/status/tagsHash", json!("00000000"));
    assert!(!ready_for_its_spec(&fixture.cr));
    assert_eq!(settled_state_findings(&fixture.cr), Vec::<String>::new());
}

#[test]
fn zero_replicas_settle_with_deployment_not_ready() {
    let mut fixture = fixture();
    set(&mut fixture.cr, "/spec/replicas", json!(0));
    set(&mut fixture.cr, "/status/readyReplicas", json!(0));
    set(&mut fixture.cr, "/status/phase", json!("Pending"));
    set(
        &mut fixture.cr,
        "/status/conditions/6/status",
        json!("False"),
    );
    set(
        &mut fixture.cr,
        "/status/conditions/6/reason",
        json!("NoReplicasReady"),
    );
    set(
        object(&mut fixture, "Deployment"),
        "/spec/replicas",
        json!(0),
    );
    assert!(ready_for_its_spec(&fixture.cr));
    assert_eq!(all_findings(&fixture), Vec::<String>::new());
}

#[test]
fn defaults_apply_when_the_spec_is_silent() {
    let mut fixture = fixture();
    let spec = fixture
        .cr
        .pointer_mut("/spec")
        .and_then(Value::as_object_mut)
        .expect("spec");
    spec.remove("organizationName");
    spec.remove("key");
    spec.remove("tags");
    let expected = Expected::of(&fixture.cr);
    assert_eq!(expected.organization, "default");
    assert_eq!(expected.key_name.as_deref(), Some("sample"));
    assert_eq!(
        expected.secret_name.as_deref(),
        Some("sample-provisioner-key")
    );
    assert_eq!(expected.secret_key, "key");
}

#[rstest]
#[case("500m", "0.5", true)]
#[case("1Gi", "1024Mi", true)]
#[case("1", "1000m", true)]
#[case("2", "1", false)]
fn quantities_compare_by_value(#[case] a: &str, #[case] b: &str, #[case] same: bool) {
    assert_eq!(same_quantities(&json!(a), &json!(b)), same);
}

/// What the oracle expects of a CR named `name` with an empty spec (only names matter here).
fn named(name: &str) -> Expected {
    Expected {
        name: name.into(),
        uid: String::new(),
        organization: "default".into(),
        key_name: None,
        secret_name: None,
        secret_key: "key".into(),
        tags: BTreeMap::new(),
        control_plane: String::new(),
    }
}

/// R-RES-1 up to 63 characters; past them D-6 asks only for a shortened name's properties, so
/// the oracle names none (the child is found by its controller and held to 63 characters).
#[rstest]
#[case::at_the_limit(51, "Deployment", true)]
#[case::sa_at_the_limit(51, "ServiceAccount", true)]
#[case::past_the_limit(52, "Deployment", false)]
#[case::sa_past_the_limit(52, "ServiceAccount", false)]
fn child_names_follow_the_contract_at_the_limit(
    #[case] length: usize,
    #[case] kind: &str,
    #[case] named_in_full: bool,
) {
    let name: String = "n".repeat(length);
    match named(&name).child_name(kind) {
        Some((child, _)) => assert!(
            named_in_full && child.len() == 63 && child.contains(&name),
            "{child}"
        ),
        None => assert!(!named_in_full),
    }
}
