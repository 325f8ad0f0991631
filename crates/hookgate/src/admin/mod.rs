//! The admin listener: an HTTP API for evidence, replay and pauses (`/api/v1/...`, described
//! by the OpenAPI document in `schemas/admin.openapi.json`) and the console, server-rendered
//! pages over the same operations (`/console/...`).
//!
//! It listens apart from intake (by default on loopback), so that senders can never reach it,
//! and everything on it needs the admin token: `Authorization: Bearer TOKEN` for the API, or
//! the console's session cookie, set by its login form. Tokens are compared as SHA-256
//! digests in constant time. A request without a valid token gets 401 and nothing else.
//!
//! # Layout
//! - `api`: the JSON routes, their query and answer types, and the route table.
//! - `openapi`: the OpenAPI document, generated from the route table and the types.
//! - `console`: the pages (minijinja templates under `templates/`, auto-escaped).

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Result, bail};
use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hmac::{Hmac, Mac};
use hookgate_engine::Gateway;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::payloads::{SharedViews, Views};

mod api;
mod console;
mod openapi;

pub use openapi::document as openapi_document;

/// Where the admin listener listens unless told otherwise: loopback only.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9180";
/// A token shorter than this is refused at start: it could be guessed.
pub const TOKEN_BYTES_MIN: usize = 16;
/// Admin request bodies (replay filters, pause reasons, the login form) are at most this big.
pub const BODY_BYTES_MAX: usize = 64 * 1024;
/// The console's session cookie.
const SESSION_COOKIE: &str = "hookgate_session";
/// A console session lasts this long; then the token is asked for again.
pub const SESSION_SECS: u64 = 12 * 60 * 60;

/// What the admin listener is started with.
#[derive(Clone)]
pub struct AdminConfig {
    pub listen: SocketAddr,
    pub token: String,
}

impl std::fmt::Debug for AdminConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminConfig").field("listen", &self.listen).finish_non_exhaustive()
    }
}

impl AdminConfig {
    pub fn new(listen: SocketAddr, token: String) -> Result<AdminConfig> {
        let token = token.trim().to_owned();
        if token.len() < TOKEN_BYTES_MIN {
            bail!(
                "the admin token has {} bytes: at least {TOKEN_BYTES_MIN} are needed",
                token.len()
            );
        }
        Ok(AdminConfig { listen, token })
    }
}

/// Everything the routes share.
#[derive(Clone)]
struct Admin {
    gateway: Gateway,
    views: SharedViews,
    token_digest: [u8; 32],
    /// The key of the console's session cookies and its forms' CSRF field, derived from the
    /// token, so that neither is the token itself.
    session_key: String,
    csrf: String,
    console: Arc<console::Pages>,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin").finish_non_exhaustive()
    }
}

fn unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs())
}

fn derived(token: &str, purpose: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(token.as_bytes()).expect("HMAC takes any key");
    mac.update(purpose.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

/// Constant-time equality of two texts, through their digests (lengths do not leak either).
fn same(given: &str, expected_digest: &[u8; 32]) -> bool {
    let digest: [u8; 32] = Sha256::digest(given.as_bytes()).into();
    digest.ct_eq(expected_digest).into()
}

impl Admin {
    fn views(&self) -> Arc<Views> {
        self.views.current()
    }

    fn bearer_ok(&self, headers: &HeaderMap) -> bool {
        let Some(value) = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) else {
            return false;
        };
        let Some(token) = value.strip_prefix("Bearer ") else { return false };
        same(token.trim(), &self.token_digest)
    }

    /// A session cookie for one issued now: `SECONDS.MAC`, the MAC binding the time, so that
    /// a session ends after [`SESSION_SECS`] however the browser keeps it.
    fn new_session(&self) -> String {
        let issued = unix_secs();
        format!("{issued}.{}", derived(&self.session_key, &issued.to_string()))
    }

    fn session_ok(&self, headers: &HeaderMap) -> bool {
        let Some((issued, mac)) = cookie(headers, SESSION_COOKIE).and_then(|v| v.split_once('.'))
        else {
            return false;
        };
        let Ok(issued_secs) = issued.parse::<u64>() else { return false };
        let now = unix_secs();
        // A little skew allowed into the future; none past the end.
        if issued_secs > now + 60 || now.saturating_sub(issued_secs) > SESSION_SECS {
            return false;
        }
        let expected: [u8; 32] =
            Sha256::digest(derived(&self.session_key, issued).as_bytes()).into();
        same(mac, &expected)
    }

    fn csrf_ok(&self, given: &str) -> bool {
        let expected: [u8; 32] = Sha256::digest(self.csrf.as_bytes()).into();
        same(given, &expected)
    }

    fn token_ok(&self, given: &str) -> bool {
        same(given.trim(), &self.token_digest)
    }
}

/// A cookie's value from the `Cookie` headers.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v)
}

/// The API's door: the bearer token only. The console's cookie does not open it: a browser
/// sends cookies with requests other pages make (any port of the same host is the same
/// site), and the API's writes carry no CSRF field.
async fn api_auth(State(admin): State<Admin>, request: Request, next: Next) -> Response {
    if admin.bearer_ok(request.headers()) { next.run(request).await } else { unauthorized() }
}

/// 401 and nothing else: no body, no hint of what was wrong.
fn unauthorized() -> Response {
    (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "Bearer")]).into_response()
}

/// The admin router over `gateway`.
pub fn router(gateway: Gateway, views: SharedViews, token: &str) -> Router {
    let admin = Admin {
        gateway,
        views,
        token_digest: Sha256::digest(token.as_bytes()).into(),
        session_key: derived(token, "hookgate console session"),
        csrf: derived(token, "hookgate console form"),
        console: Arc::new(console::Pages::new()),
    };
    let api = api::routes()
        .layer(axum::middleware::from_fn_with_state(admin.clone(), api_auth))
        .with_state(admin.clone());
    Router::new()
        .nest("/api/v1", api)
        .merge(console::routes(admin.clone()))
        .layer(DefaultBodyLimit::max(BODY_BYTES_MAX))
}
