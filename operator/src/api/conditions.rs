//! Condition types, reasons, labels and other fixed strings of the contract (§10, D-1, D-2, D-3).

pub const FINALIZER: &str = "coder.com/provisioner-key-cleanup";

pub const PHASE_PENDING: &str = "Pending";
pub const PHASE_READY: &str = "Ready";

pub const LABEL_NAME: &str = "app.kubernetes.io/name";
pub const LABEL_INSTANCE: &str = "app.kubernetes.io/instance";
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const APP_NAME: &str = "coder-provisioner";
pub const MANAGED_BY: &str = "coder-provisioner-operator";

pub const CREDENTIAL_LABEL: &str = "coder.com/credential";
pub const CREDENTIAL_DESTINATIONS_ANNOTATION: &str = "coder.com/credential-destinations";
pub const KEY_CHECKSUM_ANNOTATION: &str = "checksum/provisioner-key";

/// Condition types in gate order (D-1).
pub mod condition {
    pub const CONTROL_PLANE_READY: &str = "ControlPlaneReady";
    pub const OPERATOR_ACCESS_READY: &str = "OperatorAccessReady";
    pub const CREDENTIALS_READY: &str = "CredentialsReady";
    pub const ENTITLED: &str = "ExternalProvisionersEntitled";
    pub const KEY_SECRET_READY: &str = "ProvisionerKeySecretReady";
    pub const KEY_READY: &str = "ProvisionerKeyReady";
    pub const DEPLOYMENT_READY: &str = "DeploymentReady";
}

/// Condition reasons (R-ST-9, D-2, D-3).
pub mod reason {
    pub const CONTROL_PLANE_AVAILABLE: &str = "ControlPlaneAvailable";
    pub const CONTROL_PLANE_UNAVAILABLE: &str = "ControlPlaneUnavailable";
    pub const OPERATOR_ACCESS_READY: &str = "OperatorAccessReady";
    pub const OPERATOR_ACCESS_NOT_READY: &str = "OperatorAccessNotReady";
    pub const TOKEN_REF_MISSING: &str = "OperatorTokenSecretRefMissing";
    pub const TOKEN_REF_INVALID: &str = "OperatorTokenSecretRefInvalid";
    pub const TOKEN_SECRET_UNAVAILABLE: &str = "OperatorTokenSecretUnavailable";
    pub const CREDENTIALS_VALID: &str = "CredentialsValid";
    pub const CREDENTIAL_SECRET_NOT_FOUND: &str = "CredentialSecretNotFound";
    pub const CREDENTIAL_LABEL_MISSING: &str = "CredentialLabelMissing";
    pub const CREDENTIAL_DESTINATION_MISSING: &str = "CredentialDestinationMissing";
    pub const CREDENTIAL_DESTINATION_MISMATCH: &str = "CredentialDestinationMismatch";
    pub const ENTITLED: &str = "Entitled";
    pub const NOT_ENTITLED: &str = "NotEntitled";
    pub const NOT_SUPPORTED: &str = "NotSupported";
    pub const FORBIDDEN: &str = "Forbidden";
    pub const ENTITLEMENTS_QUERY_FAILED: &str = "EntitlementsQueryFailed";
    pub const SECRET_READY: &str = "SecretReady";
    pub const KEY_SECRET_NOT_OWNED: &str = "KeySecretNotOwned";
    pub const KEY_READY: &str = "ProvisionerKeyReady";
    pub const KEY_FAILED: &str = "ProvisionerKeyFailed";
    pub const RATE_LIMITED: &str = "RateLimited";
    pub const MINIMUM_REPLICAS_READY: &str = "MinimumReplicasReady";
    pub const NO_REPLICAS_READY: &str = "NoReplicasReady";
}
