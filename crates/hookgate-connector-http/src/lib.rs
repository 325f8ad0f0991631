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

use hookgate_connector::{Answer, ConnectorError, SourceFetcher, SourceOutcome, SourceRequest};
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

/// Fetches source objects over the one shared client: connect timeout here, the request's
/// own timeout per fetch, answers read up to the request's bound.
#[derive(Debug, Clone)]
pub struct HttpSourceFetcher {
    client: reqwest::Client,
}

impl HttpSourceFetcher {
    pub fn new() -> Result<HttpSourceFetcher, HttpError> {
        install_crypto_provider();
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(default_connect_timeout_ms()))
            // A redirect could leave the host the pipeline wrote out.
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        Ok(HttpSourceFetcher { client })
    }

    async fn fetch_source(&self, request: &SourceRequest) -> Result<SourceOutcome, ConnectorError> {
        let misconfigured =
            |message: String| ConnectorError::Misconfigured { message, answer: Answer::default() };
        let url = match check_url(&request.url) {
            Ok(url) => url,
            Err(HttpError::InsecureUrl(_)) if request.allow_plain_http => {
                reqwest::Url::parse(&request.url)
                    .map_err(|_| misconfigured(format!("`{}` is not a valid URL", request.url)))?
            }
            Err(error) => return Err(misconfigured(error.to_string())),
        };
        let method =
            if request.method == "POST" { reqwest::Method::POST } else { reqwest::Method::GET };
        let mut builder = self
            .client
            .request(method, url)
            .timeout(request.timeout)
            .header("accept", "application/json");
        for (name, value) in &request.headers {
            builder = builder.header(name.as_str(), value.expose());
        }
        // One byte past the bound tells a long answer from one exactly at it.
        let settings = HttpSettings {
            response_bytes_max: request.max_bytes.saturating_add(1),
            ..HttpSettings::default()
        };
        let response = match send(builder, &settings).await {
            Ok(response) => response,
            // Nothing was written: a read that got no answer is simply made again.
            Err(ConnectorError::Ambiguous { message, answer }) => {
                return Err(ConnectorError::Retryable { message, retry_after: None, answer });
            }
            Err(error) => return Err(error),
        };
        classify_source(&response, request.max_bytes)
    }
}

impl SourceFetcher for HttpSourceFetcher {
    fn fetch<'a>(
        &'a self,
        request: &'a SourceRequest,
    ) -> hookgate_connector::BoxFuture<'a, Result<SourceOutcome, ConnectorError>> {
        Box::pin(self.fetch_source(request))
    }
}

/// A source's answer, classified like a connector's: the object, gone, or why not.
pub fn classify_source(
    response: &Response,
    max_bytes: usize,
) -> Result<SourceOutcome, ConnectorError> {
    let answer = response.answer();
    let status = response.status;
    let message = |what: &str| format!("the source answered {status}: {what}");
    match status {
        200..=299 => {
            if response.truncated || response.body.len() > max_bytes {
                return Err(ConnectorError::Rejected {
                    message: format!("the source object is larger than max_bytes ({max_bytes})"),
                    answer,
                });
            }
            match serde_json::from_str::<serde_json::Value>(&response.body) {
                Ok(object @ serde_json::Value::Object(_)) => {
                    Ok(SourceOutcome::Found { object, answer })
                }
                // A proxy's error page or a maintenance answer: transient, and bounded by the
                // attempts.
                _ => Err(ConnectorError::Retryable {
                    message: message("not a JSON object"),
                    retry_after: None,
                    answer,
                }),
            }
        }
        404 | 410 => Ok(SourceOutcome::Gone { answer }),
        429 => Err(ConnectorError::RateLimited {
            message: message("slow down"),
            retry_after: retry_after(response),
            answer,
        }),
        401 | 403 => Err(ConnectorError::Misconfigured {
            message: message("check the refresh's auth"),
            answer,
        }),
        408 | 500..=599 => Err(ConnectorError::Retryable {
            message: message("a transient failure"),
            retry_after: retry_after(response),
            answer,
        }),
        _ => Err(ConnectorError::Rejected { message: message("the request is refused"), answer }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(status: u16, body: &str, truncated: bool) -> Response {
        let mut headers = HeaderMap::new();
        headers.insert("retry-after", "7".parse().unwrap());
        Response { status, headers, body: body.to_owned(), truncated }
    }

    #[test]
    fn source_answers_are_classified_like_a_connectors() {
        let found = classify_source(&response(200, r#"{"id":"cus_1"}"#, false), 100).unwrap();
        assert!(
            matches!(found, SourceOutcome::Found { ref object, .. } if object["id"] == "cus_1")
        );
        for gone in [404, 410] {
            assert!(matches!(
                classify_source(&response(gone, "{}", false), 100),
                Ok(SourceOutcome::Gone { .. })
            ));
        }
        let class = |status, body: &str, truncated| {
            classify_source(&response(status, body, truncated), 100).unwrap_err()
        };
        let limited = class(429, "{}", false);
        assert_eq!(
            (limited.class(), limited.retry_after()),
            ("rate_limited", Some(Duration::from_secs(7)))
        );
        assert_eq!(class(401, "{}", false).class(), "misconfigured");
        assert_eq!(class(403, "{}", false).class(), "misconfigured");
        assert_eq!(class(503, "{}", false).class(), "retryable");
        assert_eq!(class(408, "{}", false).class(), "retryable");
        assert_eq!(class(400, "{}", false).class(), "rejected");
        // Not an object: a proxy's page, or an array; retried, and kept as evidence.
        let page = class(200, "<html>maintenance</html>", false);
        assert_eq!(page.class(), "retryable");
        assert_eq!(page.answer().excerpt.as_deref(), Some("<html>maintenance</html>"));
        assert_eq!(class(200, "[1]", false).class(), "retryable");
        // Longer than the bound: refused for good.
        assert_eq!(class(200, "{}", true).class(), "rejected");
        assert_eq!(
            class(200, &format!(r#"{{"a":"{}"}}"#, "x".repeat(100)), false).class(),
            "rejected"
        );
    }

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
