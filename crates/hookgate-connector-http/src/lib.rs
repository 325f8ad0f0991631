//! HTTP for connectors, done once.
//!
//! - One [`reqwest::Client`] per connector instance, with a connect timeout and a request
//!   timeout, so connection pools are shared by every call of that instance.
//! - HTTPS through rustls (ring) with the platform's roots; plain HTTP only to loopback
//!   addresses, which is where test servers live.
//! - Answers are read up to a bound; a larger body is cut, never buffered whole.
//! - Transport failures get their class here: a connection that was never made is
//!   `retryable` (nothing was sent); a timeout or a connection lost after sending is
//!   `ambiguous` (the CRM may have applied the write).

use std::time::Duration;

use hookgate_connector::{Answer, ConnectorError};
use reqwest::header::HeaderMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Timeouts and bounds, part of every HTTP connector's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    /// Milliseconds to establish a connection.
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// Milliseconds for a whole request and its answer.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// Bytes of an answer read at most.
    #[serde(default = "default_response_bytes_max")]
    pub response_bytes_max: usize,
}

fn default_connect_timeout_ms() -> u64 {
    5_000
}
fn default_request_timeout_ms() -> u64 {
    20_000
}
fn default_response_bytes_max() -> usize {
    1024 * 1024
}

impl Default for HttpSettings {
    fn default() -> HttpSettings {
        HttpSettings {
            connect_timeout_ms: default_connect_timeout_ms(),
            request_timeout_ms: default_request_timeout_ms(),
            response_bytes_max: default_response_bytes_max(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("`{0}` is not a valid URL")]
    InvalidUrl(String),
    #[error("`{0}` must use https (plain http is only allowed to loopback test servers)")]
    InsecureUrl(String),
    #[error("cannot build the HTTP client: {0}")]
    Client(#[from] reqwest::Error),
}

/// Checks that `url` is https, or http to a loopback host.
pub fn check_url(url: &str) -> Result<reqwest::Url, HttpError> {
    let parsed = reqwest::Url::parse(url).map_err(|_| HttpError::InvalidUrl(url.to_owned()))?;
    match parsed.scheme() {
        "https" => Ok(parsed),
        "http" if is_loopback(&parsed) => Ok(parsed),
        _ => Err(HttpError::InsecureUrl(url.to_owned())),
    }
}

fn is_loopback(url: &reqwest::Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(domain)) => domain == "localhost",
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

/// Installs ring as rustls' crypto provider for the process, once; every later call is a
/// no-op. Any `reqwest::Client` in the process needs it first (reqwest is built without a
/// provider of its own, to avoid compiling a second one).
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A client for one connector instance.
pub fn client(settings: &HttpSettings) -> Result<reqwest::Client, HttpError> {
    install_crypto_provider();
    Ok(reqwest::Client::builder()
        .connect_timeout(Duration::from_millis(settings.connect_timeout_ms))
        .timeout(Duration::from_millis(settings.request_timeout_ms))
        .https_only(false)
        .build()?)
}

/// An answer, read up to the bound.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: String,
    /// The body was longer than the bound and was cut.
    pub truncated: bool,
}

impl Response {
    /// The answer as evidence: status and the start of the body.
    pub fn answer(&self) -> Answer {
        Answer::with_excerpt(Some(self.status), &self.body)
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// Sends a request and reads its answer under the bound, classifying transport failures.
pub async fn send(
    request: reqwest::RequestBuilder,
    settings: &HttpSettings,
) -> Result<Response, ConnectorError> {
    let mut response = request.send().await.map_err(|e| transport_error(&e))?;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let mut body = Vec::new();
    let mut truncated = false;
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = settings.response_bytes_max.saturating_sub(body.len());
                if chunk.len() > room {
                    body.extend_from_slice(&chunk[..room]);
                    truncated = true;
                    break;
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => break,
            // The request was sent and an answer started: whatever happened, it happened.
            Err(error) => {
                return Err(ConnectorError::Ambiguous {
                    message: format!("the answer was lost: {error}"),
                    answer: Answer { status: Some(status), ..Answer::default() },
                });
            }
        }
    }
    Ok(Response { status, headers, body: String::from_utf8_lossy(&body).into_owned(), truncated })
}

/// A request that got no answer: retryable if it never left, ambiguous otherwise.
pub fn transport_error(error: &reqwest::Error) -> ConnectorError {
    if error.is_connect() {
        ConnectorError::Retryable {
            message: format!("cannot connect: {error}"),
            retry_after: None,
            answer: Answer::default(),
        }
    } else if error.is_timeout() {
        ConnectorError::Ambiguous {
            message: format!("no answer in time: {error}"),
            answer: Answer::default(),
        }
    } else {
        ConnectorError::Ambiguous {
            message: format!("the request failed after sending: {error}"),
            answer: Answer::default(),
        }
    }
}

/// `Retry-After` in seconds (the HTTP-date form is not used by CRMs we know).
pub fn retry_after(response: &Response) -> Option<Duration> {
    response
        .header("retry-after")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_may_use_plain_http() {
        assert!(check_url("https://login.salesforce.com").is_ok());
        assert!(check_url("http://127.0.0.1:8080").is_ok());
        assert!(check_url("http://localhost:1").is_ok());
        assert!(check_url("http://[::1]:1").is_ok());
        assert!(matches!(check_url("http://api.hubapi.com"), Err(HttpError::InsecureUrl(_))));
        assert!(matches!(check_url("http://10.0.0.1"), Err(HttpError::InsecureUrl(_))));
        assert!(matches!(check_url("not a url"), Err(HttpError::InvalidUrl(_))));
    }
}
