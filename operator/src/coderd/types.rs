//! The coderd JSON shapes the operator reads and writes (coderd-api.md §2). Unknown fields are
//! ignored because coderd adds fields over time.
use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};

/// `codersdk.Organization`, reduced to what the operator uses.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Organization {
    pub id: String,
    pub name: String,
}

/// `codersdk.ProvisionerKey` as listed by coderd (the secret is never returned).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct ProvisionerKey {
    pub id: String,
    pub name: String,
    /// The organization id (coderd calls the field `organization`).
    pub organization: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub tags: BTreeMap<String, String>,
    #[serde(default)]
    pub created_at: String,
}

#[derive(Serialize)]
pub(crate) struct CreateKeyRequest<'a> {
    pub name: &'a str,
    pub tags: &'a BTreeMap<String, String>,
}

#[derive(Deserialize)]
pub(crate) struct CreateKeyResponse {
    #[serde(default)]
    pub key: String,
}

/// The feature key coderd uses for external provisioners.
pub const EXTERNAL_PROVISIONER_DAEMONS: &str = "external_provisioner_daemons";

/// `codersdk.Entitlements`, reduced to what the operator uses.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Entitlements {
    /// Always present in a valid answer; `features: null` is rejected while decoding.
    pub features: BTreeMap<String, Feature>,
}

/// One feature's state; only the entitlement matters to the operator.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Feature {
    pub entitlement: EntitlementValue,
}

/// `entitled`, `grace_period`, `not_entitled`; any other string is kept as `Unknown`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntitlementValue {
    Entitled,
    GracePeriod,
    NotEntitled,
    Unknown(String),
}

impl EntitlementValue {
    /// Whether external provisioners may be used (coderd enables the feature in both states).
    pub fn is_usable(&self) -> bool {
        matches!(self, Self::Entitled | Self::GracePeriod)
    }
}

impl<'de> Deserialize<'de> for EntitlementValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        Ok(match raw.as_str() {
            "entitled" => Self::Entitled,
            "grace_period" => Self::GracePeriod,
            "not_entitled" => Self::NotEntitled,
            _ => Self::Unknown(raw),
        })
    }
}

impl Entitlements {
    /// The entitlement of `external_provisioner_daemons`; `None` when the feature is absent
    /// (the caller treats that as not entitled).
    pub fn external_provisioner_daemons(&self) -> Option<EntitlementValue> {
        self.features
            .get(EXTERNAL_PROVISIONER_DAEMONS)
            .map(|feature| feature.entitlement.clone())
    }
}

fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[test]
    fn provisioner_key_ignores_unknown_fields_and_null_tags() {
        let keys: Vec<ProvisionerKey> = serde_json::from_str(
            r#"[{"id":"k1","created_at":"2026-01-01T00:00:00Z","organization":"o1","name":"a","tags":null,"extra":1},
                {"id":"k2","created_at":"2026-01-01T00:00:01Z","organization":"o1","name":"b","tags":{"env":"prod"}}]"#,
        )
        .unwrap();
        assert!(keys[0].tags.is_empty());
        assert_eq!(keys[1].tags.get("env").map(String::as_str), Some("prod"));
    }

    #[rstest]
    #[case("entitled", Some(EntitlementValue::Entitled), true)]
    #[case("grace_period", Some(EntitlementValue::GracePeriod), true)]
    #[case("not_entitled", Some(EntitlementValue::NotEntitled), false)]
    #[case("bogus", Some(EntitlementValue::Unknown("bogus".into())), false)]
    fn entitlement_values(
        #[case] raw: &str,
        #[case] expected: Option<EntitlementValue>,
        #[case] usable: bool,
    ) {
        let body = format!(
            r#"{{"features":{{"external_provisioner_daemons":{{"entitlement":"{raw}","enabled":true}},"audit_log":{{"entitlement":"entitled","enabled":true}}}},"has_license":true,"warnings":[]}}"#
        );
        let entitlements: Entitlements = serde_json::from_str(&body).unwrap();
        let value = entitlements.external_provisioner_daemons();
        assert_eq!(value, expected);
        assert_eq!(value.is_some_and(|v| v.is_usable()), usable);
    }

    #[test]
    fn absent_feature_is_none_and_null_features_is_rejected() {
        let entitlements: Entitlements =
            serde_json::from_str(r#"{"features":{},"has_license":false}"#).unwrap();
        assert_eq!(entitlements.external_provisioner_daemons(), None);
        assert!(serde_json::from_str::<Entitlements>(r#"{"features":null}"#).is_err());
    }
}
