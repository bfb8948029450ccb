//! Reference operator for `CoderProvisioner` (coder.com/v1alpha1).
//!
//! `api` holds the CRD types, `coderd` the typed coderd client, `provisioner` the reconcile
//! pipeline (dereference → gates → children → apply → status), `runtime` the process wiring, `fence` and `metrics` leaves the pass and the runtime share.
pub mod api;
pub mod coderd;
pub mod fence;
pub mod metrics;
pub mod provisioner;
pub mod runtime;
