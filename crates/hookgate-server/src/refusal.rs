//! Refusals at the edge: each is counted in `/metrics` and logged, at most once per
//! [`LOG_INTERVAL`] per kind, so that a flood cannot flood the log.

use std::collections::HashMap;
use std::fmt::Display;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

/// A kind of refusal is logged at most this often; the line says how many went unlogged.
pub const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Why the edge refused a connection or a request before intake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// The listener could not accept (out of file descriptors, most often).
    AcceptFailed,
    /// Every connection slot was taken: answered 503.
    OverCapacity,
    /// The request line and headers, or the next request on a kept-alive connection, did not
    /// arrive in time: closed.
    HeaderTimeout,
    /// Not HTTP/1: closed (hyper answers 400 where it can).
    Malformed,
    /// The header block did not fit the read buffer (431), or the headers were over the limit.
    HeadersTooLarge,
    /// The body did not arrive in time: 408.
    ReadTimeout,
    /// The body, or its announced length, is over the limit: 413.
    TooLarge,
    /// The body could not be read (the connection broke mid-body).
    UnreadableBody,
    /// The signature did not hold: 401.
    Unauthorized,
    /// No pipeline has the name in the URL: 404.
    UnknownPipeline,
    /// The path is no route at all (not `/hooks/NAME`): 404.
    NoRoute,
    /// The route exists, not for this method (a GET of a hook): 405.
    WrongMethod,
    /// An operator paused the pipeline's intake: 503 with Retry-After.
    Paused,
}

impl Refusal {
    pub fn name(self) -> &'static str {
        match self {
            Refusal::AcceptFailed => "accept_failed",
            Refusal::OverCapacity => "over_capacity",
            Refusal::HeaderTimeout => "header_timeout",
            Refusal::Malformed => "malformed",
            Refusal::HeadersTooLarge => "headers_too_large",
            Refusal::ReadTimeout => "read_timeout",
            Refusal::TooLarge => "too_large",
            Refusal::UnreadableBody => "unreadable_body",
            Refusal::Unauthorized => "unauthorized",
            Refusal::UnknownPipeline => "unknown_pipeline",
            Refusal::NoRoute => "no_route",
            Refusal::WrongMethod => "wrong_method",
            Refusal::Paused => "paused",
        }
    }
}

/// When each kind was last logged, and how many went unlogged since.
static LOGGED: LazyLock<Mutex<HashMap<Refusal, (Instant, u64)>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// Counts a refusal, and logs it unless one of its kind was logged within [`LOG_INTERVAL`].
pub fn refused(refusal: Refusal, detail: &dyn Display) {
    metrics::counter!("hookgate_edge_refusals_total", "reason" => refusal.name()).increment(1);
    let now = Instant::now();
    let unlogged = {
        let mut logged = LOGGED.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match logged.get_mut(&refusal) {
            Some((last, unlogged)) if now.duration_since(*last) < LOG_INTERVAL => {
                *unlogged += 1;
                return;
            }
            Some((last, unlogged)) => {
                *last = now;
                std::mem::take(unlogged)
            }
            None => {
                logged.insert(refusal, (now, 0));
                0
            }
        }
    };
    tracing::warn!(reason = refusal.name(), %detail, unlogged, "refused at the edge");
}
