//! A fake of the Stripe API's customer retrieval, `GET /v1/customers/{id}`, as a source that
//! a pipeline's `refresh:` fetches from:
//! - authentication by the secret key as the HTTP Basic username (Stripe's `-u sk_test_...:`),
//!   401 with Stripe's error object otherwise;
//! - 404 `resource_missing` for a customer that never existed; a deleted customer is 200
//!   `{"id": ..., "object": "customer", "deleted": true}`, as Stripe answers;
//! - scripted faults for the next requests: a status (429 with `Retry-After`, 500, ...), a
//!   delay longer than a caller waits, a body that is not JSON, a body larger than a bound.
//!
//! Every request is logged, so tests can tell how often the source was asked.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{Value, json};

use crate::Running;

/// The secret key the fake accepts.
pub const SECRET_KEY: &str = "sk_test_hookgate_fake";

/// What the next request gets instead of its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceFault {
    /// This status with Stripe's error object, and `Retry-After` seconds if given.
    Status { status: u16, retry_after: Option<u64> },
    /// The answer, after this long.
    Delay(Duration),
    /// 200 with an HTML maintenance page.
    NotJson,
    /// 200 with a customer padded to this many bytes.
    Huge(usize),
}

#[derive(Debug, Default)]
pub struct StripeState {
    pub customers: HashMap<String, Value>,
    pub faults: VecDeque<SourceFault>,
    /// Every customer id asked for, in order, with the status answered.
    pub requests: Vec<(String, u16)>,
}

#[derive(Debug, Clone)]
pub struct FakeStripe {
    pub state: Arc<Mutex<StripeState>>,
    pub base_url: String,
    _server: Arc<Running>,
}

impl FakeStripe {
    pub async fn start() -> FakeStripe {
        let (listener, base_url) = crate::bind().await;
        let state = Arc::new(Mutex::new(StripeState::default()));
        let router =
            Router::new().route("/v1/customers/{id}", get(retrieve)).with_state(Arc::clone(&state));
        let running = crate::spawn(listener, base_url.clone(), router);
        FakeStripe { state, base_url, _server: Arc::new(running) }
    }

    pub fn lock(&self) -> MutexGuard<'_, StripeState> {
        self.state.lock().expect("the fake's lock is never poisoned")
    }

    /// Sets a customer's current state (the `id` and `object` members are added).
    pub fn put_customer(&self, id: &str, mut customer: Value) {
        if let Value::Object(map) = &mut customer {
            map.insert("id".into(), id.into());
            map.insert("object".into(), "customer".into());
        }
        self.lock().customers.insert(id.to_owned(), customer);
    }

    /// Deletes a customer: later retrievals answer Stripe's deleted-customer object.
    pub fn delete_customer(&self, id: &str) {
        self.lock()
            .customers
            .insert(id.to_owned(), json!({"id": id, "object": "customer", "deleted": true}));
    }

    pub fn push_fault(&self, fault: SourceFault) {
        self.lock().faults.push_back(fault);
    }

    pub fn requests(&self) -> Vec<(String, u16)> {
        self.lock().requests.clone()
    }
}

fn error(status: StatusCode, kind: &str, code: Option<&str>, message: &str) -> Response {
    let mut error = json!({"type": kind, "message": message});
    if let Some(code) = code {
        error["code"] = code.into();
    }
    (status, Json(json!({ "error": error }))).into_response()
}

/// Whether `Authorization` is Basic with the secret key as the username.
fn authorised(headers: &HeaderMap) -> bool {
    use base64::Engine as _;
    let Some(value) = headers.get("authorization").and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let Some(encoded) = value.strip_prefix("Basic ") else { return false };
    let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(encoded.trim()) else {
        return false;
    };
    decoded.starts_with(format!("{SECRET_KEY}:").as_bytes())
}

async fn retrieve(
    State(state): State<Arc<Mutex<StripeState>>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let fault = state.lock().expect("not poisoned").faults.pop_front();
    if let Some(SourceFault::Delay(delay)) = &fault {
        tokio::time::sleep(*delay).await;
    }
    let (status, response) = answer(&state, &id, &headers, fault);
    state.lock().expect("not poisoned").requests.push((id, status));
    response
}

fn answer(
    state: &Mutex<StripeState>,
    id: &str,
    headers: &HeaderMap,
    fault: Option<SourceFault>,
) -> (u16, Response) {
    match fault {
        Some(SourceFault::Status { status, retry_after }) => {
            let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let (kind, message) = if status == 429 {
                ("rate_limit_error", "Too many requests hit the API too quickly.")
            } else {
                ("api_error", "Something went wrong on Stripe's end.")
            };
            let mut response = error(code, kind, None, message);
            if let Some(seconds) = retry_after {
                response
                    .headers_mut()
                    .insert("retry-after", seconds.to_string().parse().expect("digits"));
            }
            return (status, response);
        }
        Some(SourceFault::NotJson) => {
            let page = "<html><body>Down for maintenance</body></html>";
            return (200, (StatusCode::OK, page).into_response());
        }
        _ => {}
    }
    if !authorised(headers) {
        let message = "Invalid API Key provided: sk_test_****";
        return (401, error(StatusCode::UNAUTHORIZED, "invalid_request_error", None, message));
    }
    let customer = state.lock().expect("not poisoned").customers.get(id).cloned();
    let Some(mut customer) = customer else {
        let message = format!("No such customer: '{id}'");
        let response = error(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            Some("resource_missing"),
            &message,
        );
        return (404, response);
    };
    if let Some(SourceFault::Huge(bytes)) = fault {
        customer["padding"] = "x".repeat(bytes).into();
    }
    (200, Json(customer).into_response())
}
