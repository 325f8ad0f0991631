//! The only crate that speaks HTTP inbound.
//!
//! Routes: `POST /hooks/{pipeline}` (intake), `GET /healthz` (the process is up), `GET /readyz`
//! (the database answers and its migrations are applied), `GET /metrics` (Prometheus text).
//!
//! The edge reads the raw body under a size limit and a read timeout, hands the bytes to the
//! engine untouched, and maps the engine's outcome to a status code and a small JSON body.
//! Internal errors are logged here and answered with a bare message: the sender learns the
//! outcome, never our internals.
//!
//! # Layout
//! - `listen`: accepting and serving connections, with a bound on every resource a client can
//!   hold (connections, time, memory) and a shutdown deadline.
//! - `refusal`: every refusal at the edge, counted and logged at a bounded rate.
//! - this file: the routes and the body reader.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::{Bytes, BytesMut};
use hookgate_engine::{Gateway, IncomingDelivery, IntakeOutcome, now_ms};
use hookgate_pipeline::evaluate::printable;
use http_body_util::BodyExt;
use serde_json::json;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

mod listen;
mod refusal;

pub use listen::{serve, serve_app};
use refusal::{Refusal, refused};

/// A rejection's reason, as answered, is at most this many characters.
const REASON_CHARS_MAX: usize = 512;

/// A body takes its share of the shared body budget in blocks of this many bytes.
const BUDGET_BLOCK_BYTES: usize = 16 * 1024;

/// Seconds a sender is asked to wait before retrying when the database is unavailable.
pub const RETRY_AFTER_SECS: u32 = 5;

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Bodies larger than this are answered 413 (before reading, when the length is announced).
    pub body_bytes_max: usize,
    /// Bodies of all requests together hold at most this much memory; a request that would
    /// go over waits for room, within its read timeout.
    pub body_bytes_in_flight_max: usize,
    /// All headers together larger than this are answered 431.
    pub header_bytes_max: usize,
    /// The request line and headers must arrive within this time, and an idle kept-alive
    /// connection is closed after it.
    pub header_timeout: Duration,
    /// A body not received within this time is answered 408.
    pub read_timeout: Duration,
    /// Connections served at once; more are answered 503 and closed.
    pub connections_max: usize,
    /// After a shutdown is asked for, connections still open after this are dropped.
    pub shutdown_timeout: Duration,
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
            body_bytes_in_flight_max: 64 * 1024 * 1024,
            header_bytes_max: 32 * 1024,
            header_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(30),
            connections_max: 1024,
            shutdown_timeout: Duration::from_secs(15),
            public_url: None,
            metrics: None,
        }
    }
}

#[derive(Debug, Clone)]
struct AppState {
    gateway: Gateway,
    config: Arc<ServerConfig>,
    /// Bytes of body all requests may hold at once; a permit per byte held.
    body_budget: Arc<Semaphore>,
    /// When the backlog gauges may be read from the database again.
    backlog_reads: Arc<ReadSpacing>,
}

/// Spaces out a reading whose cost grows with what it reads. The backlog gauges count every
/// write still to do, which takes longer the larger the backlog (about 1.5 s of the database's
/// time at a million pending writes), and `/metrics` is asked by every monitor and every poll:
/// a reading that took `t` is not repeated for `READ_SPACING × t`, so it costs the database
/// at most about 1% of its time whatever the backlog and however often it is asked, while a
/// small backlog is still read afresh at every scrape. Between readings the gauges keep their
/// last values.
#[derive(Debug, Default)]
struct ReadSpacing {
    not_before: std::sync::Mutex<Option<Instant>>,
}

/// How many times a reading's own duration passes before it is repeated.
const READ_SPACING: u32 = 100;

/// A reading dropped before it ended holds the next one off this long at most.
const READ_HELD_MAX: Duration = Duration::from_secs(10);

impl ReadSpacing {
    /// Whether a reading may start at `now`; if so, later callers wait for it to end.
    fn start(&self, now: Instant) -> bool {
        let mut not_before =
            self.not_before.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let due = not_before.is_none_or(|at| now >= at);
        if due {
            *not_before = Some(now + READ_HELD_MAX);
        }
        due
    }

    /// A reading begun at `started` ended at `now`.
    fn end(&self, started: Instant, now: Instant) {
        let mut not_before =
            self.not_before.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        *not_before = Some(now + (now - started) * READ_SPACING);
    }
}

pub fn router(gateway: Gateway, config: ServerConfig) -> Router {
    let body_budget = Arc::new(Semaphore::new(config.body_bytes_in_flight_max));
    let state = AppState {
        gateway,
        config: Arc::new(config),
        body_budget,
        backlog_reads: Arc::new(ReadSpacing::default()),
    };
    Router::new()
        .route("/hooks/{pipeline}", post(intake))
        // Senders' forms keep a trailing slash someone typed: it names the same pipeline, and
        // a redelivery through either path is the same event.
        .route("/hooks/{pipeline}/", post(intake))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .with_state(state)
}

/// A path that is no route: answered, counted and logged like any refusal, so that a sender
/// configured with a wrong URL shows up in the log and the metrics.
async fn no_route(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    refused(Refusal::NoRoute, &format_args!("{method} {}", printable(uri.path(), 128)));
    answer(StatusCode::NOT_FOUND, json!({"status": "not_found"}))
}

async fn wrong_method(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    refused(Refusal::WrongMethod, &format_args!("{method} {}", printable(uri.path(), 128)));
    answer(StatusCode::METHOD_NOT_ALLOWED, json!({"status": "method_not_allowed"}))
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
    // Before the body is read: a paused pipeline's sender retries later, as it would after
    // an outage, and nothing of the delivery is kept.
    if state.gateway.intake_paused(&pipeline) {
        refused(Refusal::Paused, &printable(&pipeline, 64));
        return closing(paused());
    }
    let (parts, body) = request.into_parts();

    let header_bytes: usize = parts.headers.iter().map(|(n, v)| n.as_str().len() + v.len()).sum();
    if header_bytes > state.config.header_bytes_max {
        refused(Refusal::HeadersTooLarge, &format_args!("{header_bytes} bytes of headers"));
        return closing(answer(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            json!({"status": "headers_too_large", "limit_bytes": state.config.header_bytes_max}),
        ));
    }
    // Held until the answer: the body's bytes count against the shared budget until then.
    let (body, _held) = match read_body(body, &parts.headers, &state).await {
        Ok(read) => read,
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
            json!({"status": "rejected", "reason": printable(&reason.to_string(), REASON_CHARS_MAX)}),
        ),
        // No detail: telling a forger which check failed helps the forger. The log says it.
        IntakeOutcome::Unauthorized(rejection) => {
            refused(Refusal::Unauthorized, &format_args!("pipeline {pipeline}: {rejection}"));
            answer(StatusCode::UNAUTHORIZED, json!({"status": "unauthorized"}))
        }
        IntakeOutcome::UnknownPipeline => {
            refused(Refusal::UnknownPipeline, &printable(&pipeline, 64));
            answer(StatusCode::NOT_FOUND, json!({"status": "unknown_pipeline"}))
        }
        IntakeOutcome::Unavailable(_) | IntakeOutcome::KeyUnavailable(_) => unavailable(),
        IntakeOutcome::Failed(_) => {
            answer(StatusCode::INTERNAL_SERVER_ERROR, json!({"status": "error"}))
        }
    }
}

/// Answered while an operator has paused the pipeline's intake.
fn paused() -> Response {
    let mut response = answer(StatusCode::SERVICE_UNAVAILABLE, json!({"status": "paused"}));
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
    response
}

fn unavailable() -> Response {
    let mut response = answer(StatusCode::SERVICE_UNAVAILABLE, json!({"status": "unavailable"}));
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
    response
}

/// Reads the whole body into one buffer, within the size limit, the shared budget and the
/// read timeout. An announced length over the limit is refused before anything is read (so an
/// `Expect: 100-continue` gets no `100 Continue`). Returns the body and its share of the budget.
async fn read_body(
    body: Body,
    headers: &HeaderMap,
    state: &AppState,
) -> Result<(Bytes, OwnedSemaphorePermit), Response> {
    let limit = state.config.body_bytes_max;
    let too_large = |detail: &dyn std::fmt::Display| {
        refused(Refusal::TooLarge, detail);
        closing(answer(
            StatusCode::PAYLOAD_TOO_LARGE,
            json!({"status": "too_large", "limit_bytes": limit}),
        ))
    };
    let announced = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(length) = announced.filter(|l| *l > limit as u64) {
        return Err(too_large(&format_args!("announced {length} bytes")));
    }
    // The buffer grows with the budget it holds, never ahead of it: the announced length
    // only caps what is reserved, so that no request allocates what it has not been given.
    let announced = announced.map_or(limit, |l| usize::try_from(l).unwrap_or(limit));
    let read = async {
        let mut buffer = BytesMut::new();
        // Permits are taken as bytes arrive, not for the announced length up front, so a lie
        // in Content-Length cannot reserve the budget.
        // The budget is never closed: acquiring from it fails only if it were.
        let mut held = Arc::clone(&state.body_budget)
            .acquire_many_owned(0)
            .await
            .map_err(|_| ReadError::TooLarge)?;
        let mut body = body;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(ReadError::Broken)?;
            let Ok(data) = frame.into_data() else { continue };
            let needed = buffer.len() + data.len();
            if needed > limit {
                return Err(ReadError::TooLarge);
            }
            if needed > held.num_permits() {
                // In blocks, so that a body of tiny chunks does not cost a wait per chunk.
                let block = (needed - held.num_permits()).max(BUDGET_BLOCK_BYTES);
                let block = block.min(limit - held.num_permits());
                let block = u32::try_from(block).map_err(|_| ReadError::TooLarge)?;
                let more = Arc::clone(&state.body_budget)
                    .acquire_many_owned(block)
                    .await
                    .map_err(|_| ReadError::TooLarge)?;
                held.merge(more);
                let wanted = held.num_permits().min(announced.max(needed));
                buffer.reserve(wanted.saturating_sub(buffer.len()));
            }
            buffer.extend_from_slice(&data);
        }
        Ok((buffer.freeze(), held))
    };
    match tokio::time::timeout(state.config.read_timeout, read).await {
        Err(_) => {
            refused(Refusal::ReadTimeout, &format_args!("after {:?}", state.config.read_timeout));
            Err(closing(answer(StatusCode::REQUEST_TIMEOUT, json!({"status": "read_timeout"}))))
        }
        Ok(Err(ReadError::TooLarge)) => Err(too_large(&"the body went over the limit")),
        Ok(Err(ReadError::Broken(error))) => {
            refused(Refusal::UnreadableBody, &error);
            Err(closing(answer(StatusCode::BAD_REQUEST, json!({"status": "unreadable_body"}))))
        }
        Ok(Ok(read)) => Ok(read),
    }
}

/// An answer after which the connection closes: the rest of a body was not read, so the next
/// bytes on the connection are not a request.
fn closing(mut response: Response) -> Response {
    response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

enum ReadError {
    TooLarge,
    Broken(axum::Error),
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
    let store = state.gateway.store();
    let started = Instant::now();
    let backlog = if state.backlog_reads.start(started) {
        let backlog = store.backlog().await;
        state.backlog_reads.end(started, Instant::now());
        Some(backlog)
    } else {
        None
    };
    match backlog {
        None => {}
        Some(Ok(backlog)) => {
            metrics::gauge!("hookgate_writes_unfinished").set(backlog.unfinished as f64);
            metrics::gauge!("hookgate_writes_dead").set(backlog.dead as f64);
            // 0 when nothing waits: the age of the oldest write still to do.
            let age_ms =
                backlog.oldest_received_at_ms.map_or(0, |received| (now_ms() - received).max(0));
            metrics::gauge!("hookgate_oldest_unfinished_write_age_seconds")
                .set(age_ms as f64 / 1000.0);
        }
        Some(Err(error)) => {
            tracing::warn!(error = %error, "cannot read the backlog for /metrics");
        }
    }
    let pool = store.pool_usage();
    metrics::gauge!("hookgate_db_pool_connections", "state" => "in_use")
        .set(f64::from(pool.in_use));
    metrics::gauge!("hookgate_db_pool_connections", "state" => "idle").set(f64::from(pool.idle));
    metrics::gauge!("hookgate_db_pool_connections_max").set(f64::from(pool.max));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_reading_is_spaced_out_by_its_own_duration_and_a_fast_one_is_not() {
        let reads = ReadSpacing::default();
        let t0 = Instant::now();
        assert!(reads.start(t0));
        assert!(!reads.start(t0 + Duration::from_millis(1)), "one reading at a time");
        // It took 300 ms: the next waits 30 s after it ended.
        let end = t0 + Duration::from_millis(300);
        reads.end(t0, end);
        assert!(!reads.start(end + Duration::from_secs(29)));
        assert!(reads.start(end + Duration::from_secs(30)));
        // A 1 ms reading may be repeated 100 ms later.
        let t1 = end + Duration::from_secs(31);
        reads.end(t1, t1 + Duration::from_millis(1));
        assert!(reads.start(t1 + Duration::from_millis(101)));
        // A reading that never ends holds the next off for READ_HELD_MAX only.
        let t2 = t1 + Duration::from_secs(1);
        assert!(!reads.start(t2));
        assert!(reads.start(t1 + Duration::from_millis(101) + READ_HELD_MAX));
    }
}
