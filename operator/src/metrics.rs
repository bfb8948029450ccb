//! Prometheus metrics of the operator, served as text on `/metrics`.
//!
//! Label values are bounded on purpose: reconcile results are a fixed set, coderd requests are
//! labelled by route *template* (never by organization or key name) and by status code.
use std::fmt;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageLabels {
    stage: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CoderdRequestLabels {
    route: String,
    status: String,
}

/// All metrics of one operator process. Share it as `Arc<Metrics>`.
pub struct Metrics {
    registry: Registry,
    reconciles: Family<ResultLabels, Counter>,
    reconcile_duration: Family<ResultLabels, Histogram>,
    reconcile_errors: Family<StageLabels, Counter>,
    coderd_requests: Family<CoderdRequestLabels, Counter>,
    keys_created: Counter,
    keys_deleted: Counter,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn reconcile_histogram() -> Histogram {
    // 5 ms … ~20 s: a reconcile is a handful of API calls, a slow coderd can take its timeout.
    Histogram::new(exponential_buckets(0.005, 2.0, 13))
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("coder_provisioner_operator");
        let reconciles = Family::<ResultLabels, Counter>::default();
        registry.register(
            "reconciles",
            "CoderProvisioner reconciles by result (ok, requeue, error)",
            reconciles.clone(),
        );
        let reconcile_duration = Family::<ResultLabels, Histogram>::new_with_constructor(
            reconcile_histogram as fn() -> Histogram,
        );
        registry.register(
            "reconcile_duration_seconds",
            "Duration of CoderProvisioner reconciles by result",
            reconcile_duration.clone(),
        );
        let reconcile_errors = Family::<StageLabels, Counter>::default();
        registry.register(
            "reconcile_errors",
            "Failed CoderProvisioner reconciles by the stage of the pass that failed \
             (dereference, keys, apply, status, cleanup, finalizer)",
            reconcile_errors.clone(),
        );
        let coderd_requests = Family::<CoderdRequestLabels, Counter>::default();
        registry.register(
            "coderd_requests",
            "HTTP requests sent to coderd by route template and status (code, timeout, unreachable)",
            coderd_requests.clone(),
        );
        let keys_created = Counter::default();
        registry.register(
            "provisioner_keys_created",
            "Provisioner keys created in coderd",
            keys_created.clone(),
        );
        let keys_deleted = Counter::default();
        registry.register(
            "provisioner_keys_deleted",
            "Provisioner keys deleted in coderd (a delete answered 404, key already gone, is not counted)",
            keys_deleted.clone(),
        );
        Self {
            registry,
            reconciles,
            reconcile_duration,
            reconcile_errors,
            coderd_requests,
            keys_created,
            keys_deleted,
        }
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Records one finished reconcile; `result` is `"ok"`, `"requeue"` or `"error"`.
    pub fn reconcile_finished(&self, result: &str, secs: f64) {
        let labels = ResultLabels {
            result: result.to_owned(),
        };
        self.reconciles.get_or_create(&labels).inc();
        self.reconcile_duration.get_or_create(&labels).observe(secs);
    }

    /// Records one failed reconcile by the stage that failed.
    pub fn reconcile_failed(&self, stage: &str) {
        let labels = StageLabels {
            stage: stage.to_owned(),
        };
        self.reconcile_errors.get_or_create(&labels).inc();
    }

    /// Records one coderd request; `route` is a route template, `status` a status code or an
    /// outcome without one (`timeout`, `unreachable`).
    pub fn coderd_request(&self, route: &str, status: &str) {
        let labels = CoderdRequestLabels {
            route: route.to_owned(),
            status: status.to_owned(),
        };
        self.coderd_requests.get_or_create(&labels).inc();
    }

    pub fn key_created(&self) {
        self.keys_created.inc();
    }

    pub fn key_deleted(&self) {
        self.keys_deleted.inc();
    }

    /// The registry in the Prometheus text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Encoding into a String cannot fail: fmt::Write for String is infallible.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_contains_recorded_series() {
        let metrics = Metrics::new();
        metrics.reconcile_finished("ok", 0.02);
        metrics.reconcile_finished("error", 1.5);
        metrics.reconcile_failed("keys");
        metrics.coderd_request("/api/v2/entitlements", "200");
        metrics.key_created();
        metrics.key_deleted();
        metrics.key_deleted();
        let text = metrics.render();
        for expected in [
            r#"coder_provisioner_operator_reconciles_total{result="ok"} 1"#,
            r#"coder_provisioner_operator_reconciles_total{result="error"} 1"#,
            r#"coder_provisioner_operator_reconcile_duration_seconds_count{result="error"} 1"#,
            r#"coder_provisioner_operator_reconcile_errors_total{stage="keys"} 1"#,
            r#"coder_provisioner_operator_coderd_requests_total{route="/api/v2/entitlements",status="200"} 1"#,
            "coder_provisioner_operator_provisioner_keys_created_total 1",
            "coder_provisioner_operator_provisioner_keys_deleted_total 2",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in\n{text}");
        }
    }
}
