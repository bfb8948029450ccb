//! The operator's HTTP endpoints: `/healthz` (liveness), `/readyz` (readiness) and `/metrics`.
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// Answers whether the process is ready: `Ok(what)` or `Err(why not)`, both shown in the body.
pub type ReadinessProbe = Arc<dyn Fn() -> Result<String, String> + Send + Sync>;

/// OpenMetrics text, which is what `prometheus-client` encodes (it ends with `# EOF`).
const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    readiness: ReadinessProbe,
}

pub fn router(metrics: Arc<Metrics>, readiness: ReadinessProbe) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(AppState { metrics, readiness })
}

async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    match (state.readiness)() {
        Ok(what) => (StatusCode::OK, format!("ok: {what}\n")),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        ),
    }
}

async fn metrics_text(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)],
        state.metrics.render(),
    )
}

/// Serves the endpoints on `listener` until `shutdown` is cancelled.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    readiness: ReadinessProbe,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router(metrics, readiness))
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    #[tokio::test]
    async fn endpoints_answer_and_readiness_follows_the_probe() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let metrics = Arc::new(Metrics::new());
        metrics.key_created();
        let ready = Arc::new(AtomicBool::new(false));
        let probe_flag = ready.clone();
        let probe: ReadinessProbe = Arc::new(move || {
            if probe_flag.load(Ordering::SeqCst) {
                Ok("controller ready".into())
            } else {
                Err("watches starting".into())
            }
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve(listener, metrics, probe, shutdown.clone()));
        let http = reqwest::Client::new();

        let health = http.get(format!("{base}/healthz")).send().await.unwrap();
        assert_eq!(health.status(), 200);
        let not_ready = http.get(format!("{base}/readyz")).send().await.unwrap();
        assert_eq!(not_ready.status(), 503);
        assert_eq!(
            not_ready.text().await.unwrap(),
            "not ready: watches starting\n"
        );
        ready.store(true, Ordering::SeqCst);
        let now_ready = http.get(format!("{base}/readyz")).send().await.unwrap();
        assert_eq!(now_ready.status(), 200);
        let scraped = http.get(format!("{base}/metrics")).send().await.unwrap();
        assert!(
            scraped.headers()[header::CONTENT_TYPE]
                .to_str()
                .unwrap()
                .starts_with("application/openmetrics-text")
        );
        assert!(
            scraped
                .text()
                .await
                .unwrap()
                .contains("coder_provisioner_operator_provisioner_keys_created_total 1")
        );

        shutdown.cancel();
        server.await.unwrap().unwrap();
    }
}
