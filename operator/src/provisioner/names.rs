//! Names of child objects and of the coderd key (contract §7 R-RES-2, R-SEC-1, D-4, D-6).
//!
//! Long names are shortened to a prefix plus the FNV-1a-32 hash of the full name, so the result
//! is deterministic and distinct for distinct CR names.
use std::collections::BTreeMap;

use crate::api::CoderProvisioner;

/// Kubernetes object names that are also DNS labels (Deployment, Role, ...) stay within this.
const MAX_LABEL_NAME: usize = 63;
/// Longest key name coderd stores (`varchar(64)`, coderd-api.md §2.6).
pub const MAX_KEY_NAME: usize = 64;
/// Longest Secret name (DNS subdomain).
const MAX_SECRET_NAME: usize = 253;
const HASH_LEN: usize = 8;

const DEPLOYMENT_PREFIX: &str = "provisioner-";
const SERVICE_ACCOUNT_SUFFIX: &str = "-provisioner";
const KEY_SECRET_SUFFIX: &str = "-provisioner-key";
pub const DEFAULT_SECRET_KEY: &str = "key";
pub const DEFAULT_ORGANIZATION: &str = "default";

/// FNV-1a, 32 bit.
pub fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(*byte)).wrapping_mul(0x0100_0193)
    })
}

/// 8 lowercase hex digits of FNV-1a-32.
pub fn fnv_hex(bytes: &[u8]) -> String {
    format!("{:08x}", fnv1a32(bytes))
}

/// R-ST-8: FNV-1a-32 over the tags sorted by key, each as key, 0, value, 0 (no tags: `811c9dc5`).
pub fn tags_hash(tags: &BTreeMap<String, String>) -> String {
    let mut bytes = Vec::new();
    for (key, value) in tags {
        bytes.extend_from_slice(key.as_bytes());
        bytes.push(0);
        bytes.extend_from_slice(value.as_bytes());
        bytes.push(0);
    }
    fnv_hex(&bytes)
}

fn prefix(name: &str, chars: usize) -> &str {
    name.char_indices()
        .nth(chars)
        .map_or(name, |(end, _)| &name[..end])
}

/// `prefix(name, keep)-hash(name)`: the shared shortening shape.
fn shortened(name: &str, keep: usize) -> String {
    format!("{}-{}", prefix(name, keep), fnv_hex(name.as_bytes()))
}

/// Deployment, Role and RoleBinding: `provisioner-<n>` (R-RES-1/2).
pub fn workload_name(cr_name: &str) -> String {
    let full = format!("{DEPLOYMENT_PREFIX}{cr_name}");
    if full.len() <= MAX_LABEL_NAME {
        full
    } else {
        format!("{DEPLOYMENT_PREFIX}{}", shortened(cr_name, 42))
    }
}

/// ServiceAccount: `<n>-provisioner` (R-RES-1/2).
pub fn service_account_name(cr_name: &str) -> String {
    let full = format!("{cr_name}{SERVICE_ACCOUNT_SUFFIX}");
    if full.len() <= MAX_LABEL_NAME {
        full
    } else {
        format!("{}{SERVICE_ACCOUNT_SUFFIX}", shortened(cr_name, 42))
    }
}

/// Value of `app.kubernetes.io/instance` (R-RES-4): label values are limited to 63 characters.
pub fn instance_label(cr_name: &str) -> String {
    if cr_name.len() <= MAX_LABEL_NAME {
        cr_name.to_owned()
    } else {
        shortened(cr_name, 54)
    }
}

/// Default key Secret name `<n>-provisioner-key` (R-SEC-1).
fn default_key_secret_name(cr_name: &str) -> String {
    let full = format!("{cr_name}{KEY_SECRET_SUFFIX}");
    if full.len() <= MAX_SECRET_NAME {
        full
    } else {
        let keep = MAX_SECRET_NAME - KEY_SECRET_SUFFIX.len() - HASH_LEN - 1;
        format!("{}{KEY_SECRET_SUFFIX}", shortened(cr_name, keep))
    }
}

/// The key name sent to coderd: lower-cased (R-KEY-21); a default (CR) name longer than 64
/// is shortened to 64 (D-4). An explicit `spec.key.name` is limited to 64 by the CRD.
pub fn key_name(cr_name: &str, spec_name: Option<&str>) -> String {
    let name = match spec_name.map(str::trim).filter(|name| !name.is_empty()) {
        Some(explicit) => explicit.to_ascii_lowercase(),
        None => cr_name.to_ascii_lowercase(),
    };
    if name.len() <= MAX_KEY_NAME {
        name
    } else {
        shortened(&name, MAX_KEY_NAME - HASH_LEN - 1)
    }
}

/// Every name one CoderProvisioner uses, computed once per reconcile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Names {
    pub cr: String,
    pub workload: String,
    pub service_account: String,
    pub instance: String,
    pub key_secret: String,
    pub key_secret_data_key: String,
    pub key_name: String,
    pub organization: String,
}

impl Names {
    pub fn for_provisioner(cr: &CoderProvisioner) -> Self {
        let cr_name = cr.metadata.name.clone().unwrap_or_default();
        let key = cr.spec.key.as_ref();
        let non_blank =
            |value: Option<&String>| value.map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
        Self {
            workload: workload_name(&cr_name),
            service_account: service_account_name(&cr_name),
            instance: instance_label(&cr_name),
            key_secret: non_blank(key.and_then(|k| k.secret_name.as_ref()))
                .unwrap_or_else(|| default_key_secret_name(&cr_name)),
            key_secret_data_key: non_blank(key.and_then(|k| k.secret_key.as_ref()))
                .unwrap_or_else(|| DEFAULT_SECRET_KEY.to_owned()),
            key_name: key_name(&cr_name, key.and_then(|k| k.name.as_deref())),
            organization: non_blank(cr.spec.organization_name.as_ref())
                .unwrap_or_else(|| DEFAULT_ORGANIZATION.to_owned()),
            cr: cr_name,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case::empty(&[], "811c9dc5")]
    #[case::one_tag(&[("scope", "organization")], "cf1b2b92")]
    fn tags_hash_is_fnv1a_over_sorted_entries(
        #[case] tags: &[(&str, &str)],
        #[case] expected: &str,
    ) {
        let tags: BTreeMap<String, String> = tags
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(tags_hash(&tags), expected);
    }

    #[test]
    fn tags_hash_separates_key_and_value() {
        let a: BTreeMap<_, _> = [("ab".to_owned(), "c".to_owned())].into();
        let b: BTreeMap<_, _> = [("a".to_owned(), "bc".to_owned())].into();
        assert_ne!(tags_hash(&a), tags_hash(&b));
    }

    #[rstest]
    #[case::sample("coderprovisioner-sample".into(), "provisioner-coderprovisioner-sample".into(), "coderprovisioner-sample-provisioner".into())]
    #[case::exactly_63("a".repeat(51), format!("provisioner-{}", "a".repeat(51)), format!("{}-provisioner", "a".repeat(51)))]
    fn short_names_are_kept(#[case] cr: String, #[case] workload: String, #[case] sa: String) {
        assert_eq!(workload_name(&cr), workload);
        assert_eq!(service_account_name(&cr), sa);
        assert_eq!(instance_label(&cr), cr);
    }

    #[test]
    fn long_names_are_shortened_deterministically_and_distinctly() {
        let long_a = format!("{}-a", "x".repeat(70));
        let long_b = format!("{}-b", "x".repeat(70));
        for name_fn in [workload_name, service_account_name, instance_label] {
            let a = name_fn(&long_a);
            assert!(a.len() <= 63, "{a} is longer than 63");
            assert_eq!(a, name_fn(&long_a));
            assert_ne!(a, name_fn(&long_b));
        }
        let hash = fnv_hex(long_a.as_bytes());
        assert_eq!(
            workload_name(&long_a),
            format!("provisioner-{}-{hash}", "x".repeat(42))
        );
        assert_eq!(
            service_account_name(&long_a),
            format!("{}-{hash}-provisioner", "x".repeat(42))
        );
        assert_eq!(
            instance_label(&long_a),
            format!("{}-{hash}", "x".repeat(54))
        );
    }

    #[rstest]
    #[case::default_is_cr_name("coderprovisioner-sample", None, "coderprovisioner-sample")]
    #[case::explicit_is_lower_cased("cr", Some("My-Key"), "my-key")]
    #[case::blank_explicit_uses_default("cr", Some("  "), "cr")]
    fn key_names(#[case] cr: &str, #[case] explicit: Option<&str>, #[case] expected: &str) {
        assert_eq!(key_name(cr, explicit), expected);
    }

    #[test]
    fn long_default_key_name_is_shortened_to_64() {
        let cr = "k".repeat(100);
        let name = key_name(&cr, None);
        assert_eq!(name.len(), 64);
        assert_eq!(
            name,
            format!("{}-{}", "k".repeat(55), fnv_hex(cr.as_bytes()))
        );
    }

    #[test]
    fn long_default_secret_name_is_shortened_to_253() {
        let cr = "s".repeat(250);
        let name = default_key_secret_name(&cr);
        assert_eq!(name.len(), 253);
        assert!(name.ends_with("-provisioner-key"));
        assert_eq!(default_key_secret_name("cr"), "cr-provisioner-key");
    }
}
