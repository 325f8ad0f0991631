//! The only crate that speaks HTTP inbound.
//!
//! Routes: `POST /hooks/{pipeline}` (intake), `GET /healthz` (the process is up), `GET /readyz`
//! (the database answers and its migrations are applied), `GET /metrics` (Prometheus text).
//!
//! The edge reads the raw body under a size limit and a read timeout, hands the bytes to the
//! engine untouched, and maps the engine's outcome to a status code and a small JSON body.
//! Internal errors are logged here and answered with a bare message: the sender learns the
//! outcome, never our internals.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hookgate_engine::{Gateway, IncomingDelivery, IntakeOutcome, now_ms};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde_json::json;
use tokio::net::TcpListener;

/// Seconds a sender is asked to wait before retrying when the database is unavailable.
pub const RETRY_AFTER_SECS: u32 = 5;

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Bodies larger than this are answered 413.
    pub body_bytes_max: usize,
    /// All headers together larger than this are answered 431.
    pub header_bytes_max: usize,
    /// A body not received within this time is answered 408.
    pub read_timeout: Duration,
    /// The public base URL senders call (`https://hooks.example.com`), for URL-signed schemes.
    /// Without it the URL is rebuilt from the `Host` header, which is wrong behind a proxy
    /// that rewrites it.
    pub public_url: Option<String>,
    /// Renders `/metrics`; without it the route answers 404.
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            body_bytes_max: 1024 * 1024,
            header_bytes_max: 32 * 1024,
            read_timeout: Duration::from_secs(30),
            public_url: None,
            metrics: None,
        }
    }
}

#[derive(Debug, Clone)]
struct AppState {
    gateway: Gateway,
    config: Arc<ServerConfig>,
}

pub fn router(gateway: Gateway, config: ServerConfig) -> Router {
    let state = AppState { gateway, config: Arc::new(config) };
    Router::new()
        .route("/hooks/{pipeline}", post(intake))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(state)
}

/// Serves until `shutdown` completes, then stops accepting, lets in-flight requests finish,
/// and returns.
pub async fn serve(
    listener: TcpListener,
    gateway: Gateway,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = router(gateway, config);
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
}

fn answer(status: StatusCode, body: serde_json::Value) -> Response {
    (status, axum::Json(body)).into_response()
}

async fn intake(
    State(state): State<AppState>,
    Path(pipeline): Path<String>,
    request: Request,
) -> Response {
    let received_at_ms = now_ms();
    let (parts, body) = request.into_parts();

    let header_bytes: usize = parts.headers.iter().map(|(n, v)| n.as_str().len() + v.len()).sum();
    if header_bytes > state.config.header_bytes_max {
        return answer(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            json!({"status": "headers_too_large", "limit_bytes": state.config.header_bytes_max}),
        );
    }
    let body = match read_body(body, &state.config).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let headers = header_pairs(&parts.headers);
    let url = public_url(&state.config, &parts.headers, &parts.uri);
    let incoming = IncomingDelivery {
        pipeline: &pipeline,
        method: parts.method.as_str(),
        url: &url,
        headers: &headers,
        body: &body,
        received_at_ms,
    };
    match state.gateway.intake(&incoming).await {
        IntakeOutcome::Accepted { event_id } => {
            answer(StatusCode::ACCEPTED, json!({"status": "accepted", "event_id": event_id}))
        }
        IntakeOutcome::Duplicate { event_id } => {
            answer(StatusCode::OK, json!({"status": "duplicate", "event_id": event_id}))
        }
        IntakeOutcome::Conflict { event_id, status } => answer(
            StatusCode::from_u16(status).unwrap_or(StatusCode::CONFLICT),
            json!({"status": "conflict", "event_id": event_id}),
        ),
        IntakeOutcome::Rejected { reason } => answer(
            StatusCode::BAD_REQUEST,
            json!({"status": "rejected", "reason": reason.to_string()}),
        ),
        // No detail: telling a forger which check failed helps the forger.
        IntakeOutcome::Unauthorized(_) => {
            answer(StatusCode::UNAUTHORIZED, json!({"status": "unauthorized"}))
        }
        IntakeOutcome::UnknownPipeline => {
            answer(StatusCode::NOT_FOUND, json!({"status": "unknown_pipeline"}))
        }
        IntakeOutcome::Unavailable(_) => unavailable(),
        IntakeOutcome::Failed(_) => {
            answer(StatusCode::INTERNAL_SERVER_ERROR, json!({"status": "error"}))
        }
    }
}

fn unavailable() -> Response {
    let mut response = answer(StatusCode::SERVICE_UNAVAILABLE, json!({"status": "unavailable"}));
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
    response
}

/// Reads the whole body under the size limit and the read timeout.
async fn read_body(body: Body, config: &ServerConfig) -> Result<bytes::Bytes, Response> {
    let limited = Limited::new(body, config.body_bytes_max);
    match tokio::time::timeout(config.read_timeout, limited.collect()).await {
        Err(_) => Err(answer(StatusCode::REQUEST_TIMEOUT, json!({"status": "read_timeout"}))),
        Ok(Err(error)) if error.downcast_ref::<LengthLimitError>().is_some() => Err(answer(
            StatusCode::PAYLOAD_TOO_LARGE,
            json!({"status": "too_large", "limit_bytes": config.body_bytes_max}),
        )),
        Ok(Err(error)) => {
            tracing::info!(error = %error, "body read failed");
            Err(answer(StatusCode::BAD_REQUEST, json!({"status": "unreadable_body"})))
        }
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
    }
}

fn header_pairs(headers: &HeaderMap) -> Vec<(String, Vec<u8>)> {
    headers
        .iter()
        .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
        .collect()
}

fn public_url(config: &ServerConfig, headers: &HeaderMap, uri: &axum::http::Uri) -> String {
    let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    match &config.public_url {
        Some(base) => format!("{}{path}", base.trim_end_matches('/')),
        None => {
            let host =
                headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("localhost");
            format!("http://{host}{path}")
        }
    }
}

async fn healthz() -> Response {
    answer(StatusCode::OK, json!({"status": "ok"}))
}

/// Prometheus text: the counters and histograms the engine records, and the writes still to do.
async fn metrics_text(State(state): State<AppState>) -> Response {
    let Some(handle) = &state.config.metrics else {
        return answer(StatusCode::NOT_FOUND, json!({"status": "metrics_disabled"}));
    };
    match state.gateway.store().unfinished_items().await {
        Ok(count) => metrics::gauge!("hookgate_writes_unfinished").set(count as f64),
        Err(error) => tracing::warn!(error = %error, "cannot count unfinished writes for /metrics"),
    }
    let mut response = handle.render().into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
    response
}

async fn readyz(State(state): State<AppState>) -> Response {
    match state.gateway.store().ready().await {
        Ok(true) => answer(StatusCode::OK, json!({"status": "ready"})),
        Ok(false) => {
            answer(StatusCode::SERVICE_UNAVAILABLE, json!({"status": "migrations_pending"}))
        }
        Err(error) => {
            tracing::warn!(error = %error, "readiness check failed");
            unavailable()
        }
    }
}
