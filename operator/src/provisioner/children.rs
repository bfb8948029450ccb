//! Child objects of a CoderProvisioner (pure): key Secret, ServiceAccount, Role, RoleBinding and
//! Deployment (contract §5, §7, §8, §9).
use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Container, EnvVar, EnvVarSource, PodSpec, PodTemplateSpec, Secret, SecretKeySelector,
    ServiceAccount,
};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};

use crate::api::{
    APP_NAME, CoderProvisioner, KEY_CHECKSUM_ANNOTATION, LABEL_INSTANCE, LABEL_MANAGED_BY,
    LABEL_NAME, MANAGED_BY,
};

use super::names::{Names, fnv_hex};

pub const DEFAULT_IMAGE: &str = "ghcr.io/coder/coder:latest";
pub const DEFAULT_GRACE_PERIOD_SECONDS: i64 = 600;
pub const CONTAINER_NAME: &str = "provisioner";

/// Everything the children are built from; produced only after the gates passed.
#[derive(Clone, Debug)]
pub struct ChildInputs<'a> {
    pub cr: &'a CoderProvisioner,
    pub names: &'a Names,
    pub control_plane_url: &'a str,
    pub control_plane_image: Option<&'a str>,
}

/// The three labels every child carries (R-RES-4, D-6).
pub fn labels(names: &Names) -> BTreeMap<String, String> {
    [
        (LABEL_NAME.to_owned(), APP_NAME.to_owned()),
        (LABEL_INSTANCE.to_owned(), names.instance.clone()),
        (LABEL_MANAGED_BY.to_owned(), MANAGED_BY.to_owned()),
    ]
    .into()
}

/// Controller ownerReference to the CR (R-RES-3).
pub fn owner_reference(cr: &CoderProvisioner) -> OwnerReference {
    OwnerReference {
        api_version: "coder.com/v1alpha1".to_owned(),
        kind: "CoderProvisioner".to_owned(),
        name: cr.metadata.name.clone().unwrap_or_default(),
        uid: cr.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

fn metadata(inputs: &ChildInputs<'_>, name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: inputs.cr.metadata.namespace.clone(),
        labels: Some(labels(inputs.names)),
        owner_references: Some(vec![owner_reference(inputs.cr)]),
        ..Default::default()
    }
}

/// The key Secret with freshly created key material (R-SEC-1…5).
pub fn key_secret(inputs: &ChildInputs<'_>, plaintext: &str) -> Secret {
    Secret {
        metadata: metadata(inputs, &inputs.names.key_secret),
        type_: Some("Opaque".to_owned()),
        data: Some(
            [(
                inputs.names.key_secret_data_key.clone(),
                ByteString(plaintext.as_bytes().to_vec()),
            )]
            .into(),
        ),
        ..Default::default()
    }
}

pub fn service_account(inputs: &ChildInputs<'_>) -> ServiceAccount {
    ServiceAccount {
        metadata: metadata(inputs, &inputs.names.service_account),
        ..Default::default()
    }
}

/// The daemon manages workspace pods and volumes in its namespace, nothing else (R-RBAC-1).
pub fn role(inputs: &ChildInputs<'_>) -> Role {
    let strings = |items: &[&str]| items.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    Role {
        metadata: metadata(inputs, &inputs.names.workload),
        rules: Some(vec![PolicyRule {
            api_groups: Some(strings(&[""])),
            resources: Some(strings(&["pods", "persistentvolumeclaims"])),
            verbs: strings(&[
                "get", "list", "watch", "create", "update", "patch", "delete",
            ]),
            ..Default::default()
        }]),
    }
}

pub fn role_binding(inputs: &ChildInputs<'_>) -> RoleBinding {
    RoleBinding {
        metadata: metadata(inputs, &inputs.names.workload),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".to_owned(),
            kind: "Role".to_owned(),
            name: inputs.names.workload.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".to_owned(),
            name: inputs.names.service_account.clone(),
            namespace: inputs.cr.metadata.namespace.clone(),
            ..Default::default()
        }]),
    }
}

/// The objects applied after the key step, in apply order: the Deployment last.
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    pub service_account: ServiceAccount,
    pub role: Role,
    pub role_binding: RoleBinding,
    pub deployment: Deployment,
}

/// Every child but the key Secret; `key_value` as for [`deployment`].
pub fn workload(inputs: &ChildInputs<'_>, key_value: &str) -> Workload {
    Workload {
        service_account: service_account(inputs),
        role: role(inputs),
        role_binding: role_binding(inputs),
        deployment: deployment(inputs, key_value),
    }
}

fn non_blank(value: Option<&str>) -> Option<&str> {
    value.filter(|v| !v.trim().is_empty())
}

/// Image chain of R-POD-8: spec, then control plane, then the default.
pub fn image(inputs: &ChildInputs<'_>) -> String {
    non_blank(inputs.cr.spec.image.as_deref())
        .or(non_blank(inputs.control_plane_image))
        .unwrap_or(DEFAULT_IMAGE)
        .to_owned()
}

/// The daemon's environment: `CODER_URL`, the key from the Secret, then `extraEnv` verbatim.
/// No `CODER_ORGANIZATION` and no tags: `coder provisioner start --key` rejects both (R-POD-14/15).
fn env(inputs: &ChildInputs<'_>) -> Vec<EnvVar> {
    let mut env = vec![
        EnvVar {
            name: "CODER_URL".to_owned(),
            value: Some(inputs.control_plane_url.to_owned()),
            ..Default::default()
        },
        EnvVar {
            name: "CODER_PROVISIONER_DAEMON_KEY".to_owned(),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: inputs.names.key_secret.clone(),
                    key: inputs.names.key_secret_data_key.clone(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        },
    ];
    env.extend(inputs.cr.spec.extra_env.iter().flatten().cloned());
    env
}

/// The Deployment (§8). `key_value` is the key in the Secret: its checksum in the pod template
/// rolls the pods when the key rotates (R-POD-3); the value itself never enters the Deployment.
pub fn deployment(inputs: &ChildInputs<'_>, key_value: &str) -> Deployment {
    let spec = &inputs.cr.spec;
    let labels = labels(inputs.names);
    let mut args = vec!["provisioner".to_owned(), "start".to_owned()];
    args.extend(spec.extra_args.iter().flatten().cloned());
    let container = Container {
        name: CONTAINER_NAME.to_owned(),
        image: Some(image(inputs)),
        command: Some(vec!["coder".to_owned()]),
        args: Some(args),
        env: Some(env(inputs)),
        resources: spec.resources.clone(),
        ..Default::default()
    };
    Deployment {
        metadata: metadata(inputs, &inputs.names.workload),
        spec: Some(DeploymentSpec {
            replicas: Some(spec.replicas.unwrap_or(1)),
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    annotations: Some(
                        [(
                            KEY_CHECKSUM_ANNOTATION.to_owned(),
                            fnv_hex(key_value.as_bytes()),
                        )]
                        .into(),
                    ),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(inputs.names.service_account.clone()),
                    image_pull_secrets: spec.image_pull_secrets.clone(),
                    termination_grace_period_seconds: Some(
                        spec.termination_grace_period_seconds
                            .unwrap_or(DEFAULT_GRACE_PERIOD_SECONDS),
                    ),
                    containers: vec![container],
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provisioner::fixtures;
    use rstest::rstest;

    fn inputs_for<'a>(
        cr: &'a CoderProvisioner,
        names: &'a Names,
        cp_image: Option<&'a str>,
    ) -> ChildInputs<'a> {
        ChildInputs {
            cr,
            names,
            control_plane_url: "http://coder.test",
            control_plane_image: cp_image,
        }
    }

    fn container(deployment: &Deployment) -> &Container {
        let pod = deployment
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .expect("pod spec");
        assert_eq!(pod.containers.len(), 1, "exactly one container");
        &pod.containers[0]
    }

    #[test]
    fn sample_children_have_the_tutorial_names_labels_and_owner() {
        let cr: CoderProvisioner = fixtures::load("provisioners/sample.yaml");
        let names = Names::for_provisioner(&cr);
        let inputs = inputs_for(&cr, &names, None);
        let deployment = deployment(&inputs, "plaintext");
        assert_eq!(
            deployment.metadata.name.as_deref(),
            Some("provisioner-coderprovisioner-sample")
        );
        assert_eq!(
            role(&inputs).metadata.name.as_deref(),
            Some("provisioner-coderprovisioner-sample")
        );
        assert_eq!(
            role_binding(&inputs).metadata.name.as_deref(),
            Some("provisioner-coderprovisioner-sample")
        );
        assert_eq!(
            service_account(&inputs).metadata.name.as_deref(),
            Some("coderprovisioner-sample-provisioner")
        );
        let secret = key_secret(&inputs, "plaintext");
        assert_eq!(
            secret.metadata.name.as_deref(),
            Some("coderprovisioner-sample-provisioner-key")
        );
        assert_eq!(secret.type_.as_deref(), Some("Opaque"));
        assert_eq!(
            secret
                .data
                .as_ref()
                .and_then(|d| d.get("key"))
                .map(|b| b.0.as_slice()),
            Some(&b"plaintext"[..])
        );

        let expected_labels: BTreeMap<String, String> = [
            ("app.kubernetes.io/name", "coder-provisioner"),
            ("app.kubernetes.io/instance", "coderprovisioner-sample"),
            ("app.kubernetes.io/managed-by", "coder-provisioner-operator"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let metas = [
            &deployment.metadata,
            &secret.metadata,
            &service_account(&inputs).metadata,
            &role(&inputs).metadata,
            &role_binding(&inputs).metadata,
        ];
        for meta in metas {
            assert_eq!(meta.labels.as_ref(), Some(&expected_labels));
            assert_eq!(meta.namespace.as_deref(), Some("coder"));
            let owner = &meta.owner_references.as_ref().expect("owner")[0];
            assert_eq!(
                (
                    owner.kind.as_str(),
                    owner.uid.as_str(),
                    owner.controller,
                    owner.block_owner_deletion
                ),
                ("CoderProvisioner", "uid-1", Some(true), Some(true))
            );
        }
        let spec = deployment.spec.as_ref().expect("spec");
        assert_eq!(spec.selector.match_labels.as_ref(), Some(&expected_labels));
        assert_eq!(
            spec.template
                .metadata
                .as_ref()
                .and_then(|m| m.labels.as_ref()),
            Some(&expected_labels)
        );
    }

    #[test]
    fn sample_pod_template_runs_coder_provisioner_start_with_url_and_key() {
        let cr: CoderProvisioner = fixtures::load("provisioners/sample.yaml");
        let names = Names::for_provisioner(&cr);
        let deployment = deployment(&inputs_for(&cr, &names, None), "plaintext");
        let expected: Deployment = fixtures::load("children/sample_deployment.yaml");
        assert_eq!(deployment, expected);
    }

    #[test]
    fn full_spec_is_carried_into_the_pod() {
        let cr: CoderProvisioner = fixtures::load("provisioners/full.yaml");
        let names = Names::for_provisioner(&cr);
        let deployment = deployment(&inputs_for(&cr, &names, Some("cp/image:1")), "k");
        let spec = deployment.spec.as_ref().expect("spec");
        assert_eq!(spec.replicas, Some(3));
        let pod = spec.template.spec.as_ref().expect("pod");
        assert_eq!(pod.termination_grace_period_seconds, Some(30));
        assert_eq!(
            pod.image_pull_secrets.as_ref().map(|s| s[0].name.as_str()),
            Some("registry")
        );
        let container = container(&deployment);
        assert_eq!(
            container.image.as_deref(),
            Some("example.test/coder:custom")
        );
        assert_eq!(
            container.args.as_deref(),
            Some(
                &["provisioner", "start", "--verbose", "--poll-interval=1s"].map(String::from)[..]
            )
        );
        assert_eq!(container.resources, cr.spec.resources);
        let env = container.env.as_ref().expect("env");
        let env_names: Vec<_> = env.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            env_names,
            [
                "CODER_URL",
                "CODER_PROVISIONER_DAEMON_KEY",
                "HTTPS_PROXY",
                "LOG_LEVEL"
            ]
        );
        assert_eq!(&env[2..], cr.spec.extra_env.as_deref().expect("extraEnv"));
        let key_ref = env[1]
            .value_from
            .as_ref()
            .and_then(|v| v.secret_key_ref.as_ref())
            .expect("secretKeyRef");
        assert_eq!(
            (key_ref.name.as_str(), key_ref.key.as_str()),
            ("team-key", "daemon-key")
        );
        assert!(
            env.iter()
                .all(|e| e.name != "CODER_ORGANIZATION" && e.name != "CODER_PROVISIONERD_TAGS")
        );
        assert!(
            container
                .args
                .iter()
                .flatten()
                .all(|a| !a.starts_with("--org") && !a.starts_with("--tag"))
        );
    }

    #[rstest]
    #[case::spec_image(Some("spec/image:1"), Some("cp/image:1"), "spec/image:1")]
    #[case::control_plane_image(None, Some("cp/image:1"), "cp/image:1")]
    #[case::blank_spec_image(Some(" "), Some("cp/image:1"), "cp/image:1")]
    #[case::default_image(None, None, DEFAULT_IMAGE)]
    fn image_chain(
        #[case] spec_image: Option<&str>,
        #[case] cp_image: Option<&str>,
        #[case] expected: &str,
    ) {
        let mut cr: CoderProvisioner = fixtures::load("provisioners/sample.yaml");
        cr.spec.image = spec_image.map(String::from);
        let names = Names::for_provisioner(&cr);
        assert_eq!(image(&inputs_for(&cr, &names, cp_image)), expected);
    }

    #[test]
    fn key_rotation_changes_the_pod_template_and_never_embeds_the_key() {
        let cr: CoderProvisioner = fixtures::load("provisioners/sample.yaml");
        let names = Names::for_provisioner(&cr);
        let inputs = inputs_for(&cr, &names, None);
        let before = deployment(&inputs, "old-key-material");
        let after = deployment(&inputs, "new-key-material");
        assert_ne!(
            before.spec.as_ref().map(|s| &s.template),
            after.spec.as_ref().map(|s| &s.template)
        );
        let rendered = serde_json::to_string(&after).expect("serializable");
        assert!(!rendered.contains("new-key-material"));
    }

    #[test]
    fn role_grants_exactly_pods_and_pvcs() {
        let cr: CoderProvisioner = fixtures::load("provisioners/sample.yaml");
        let names = Names::for_provisioner(&cr);
        let inputs = inputs_for(&cr, &names, None);
        let expected: Role = fixtures::load("children/sample_role.yaml");
        assert_eq!(role(&inputs).rules, expected.rules);
        let binding = role_binding(&inputs);
        assert_eq!(binding.role_ref.name, "provisioner-coderprovisioner-sample");
        let subjects = binding.subjects.expect("subjects");
        assert_eq!(subjects.len(), 1);
        assert_eq!(
            (
                subjects[0].kind.as_str(),
                subjects[0].name.as_str(),
                subjects[0].namespace.as_deref()
            ),
            (
                "ServiceAccount",
                "coderprovisioner-sample-provisioner",
                Some("coder")
            )
        );
    }

    #[test]
    fn long_cr_names_are_shortened_for_every_child() {
        let mut cr: CoderProvisioner = fixtures::load("provisioners/sample.yaml");
        cr.metadata.name = Some("p".repeat(120));
        let names = Names::for_provisioner(&cr);
        let inputs = inputs_for(&cr, &names, None);
        for name in [
            deployment(&inputs, "k").metadata.name,
            service_account(&inputs).metadata.name,
        ] {
            assert!(name.expect("name").len() <= 63);
        }
        assert!(labels(&names).values().all(|v| v.len() <= 63));
    }
}
