//! Signing keys a delivery names and the gateway fetches (AWS SNS certificates): only from the
//! hosts the pipeline allows, through a fetcher the binary provides (the one owner of outbound
//! HTTP), and kept for a day so a sender's key costs one fetch, not one per delivery.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hookgate_pipeline::evaluate::printable;
use hookgate_pipeline::{CompiledPipeline, KeyFetch};
use hookgate_verify::{Clock, Rejection, Request, SecretBytes, Verified, Verifier};

/// Keys kept at most; a sender rotates rarely, so more are an attack on memory.
pub const FETCHED_KEYS_MAX: usize = 32;
/// How long a fetched key is used before it is fetched again.
pub const FETCHED_KEY_TTL: Duration = Duration::from_secs(24 * 3600);

/// Why a key could not be fetched.
#[derive(Debug, Clone)]
pub enum FetchError {
    /// The host answered that there is no such key (4xx), or what it served is too large:
    /// the delivery names a key that does not exist, so it is refused.
    NoSuchKey(String),
    /// Timeouts, connection failures, 5xx: the sender should retry.
    Unavailable(String),
}

/// Fetches a key's bytes from a URL already allowed by the pipeline. Implemented over the
/// shared outbound HTTP client, with its timeouts and bounded answers.
pub trait KeyFetcher: Send + Sync {
    fn fetch<'a>(
        &'a self,
        url: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<Vec<u8>, FetchError>> + Send + 'a>>;
}

/// Fetches in flight at most per pipeline; a delivery waits this long for a turn, then is
/// answered 503.
pub const FETCHES_IN_FLIGHT_MAX: usize = 4;
pub const FETCH_TURN_WAIT: Duration = Duration::from_secs(2);
/// How long a URL that could not be fetched is not tried again, and how many such URLs are
/// remembered.
pub const FAILED_FETCH_TTL: Duration = Duration::from_secs(60);
pub const FAILED_FETCHES_MAX: usize = 256;

/// A pipeline's fetched keys. Only a key that verified a delivery from a trusted sender is
/// kept, so deliveries naming other keys (real ones of other regions, say) cannot push it out.
pub struct FetchedKeys {
    config: KeyFetch,
    fetcher: Arc<dyn KeyFetcher>,
    proven: Mutex<HashMap<String, (Arc<Verifier>, Instant)>>,
    failed: Mutex<HashMap<String, (KeyProblemKind, String, Instant)>>,
    in_flight: Arc<tokio::sync::Semaphore>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyProblemKind {
    NoSuchKey,
    Unavailable,
}

impl std::fmt::Debug for FetchedKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FetchedKeys").field("config", &self.config).finish_non_exhaustive()
    }
}

/// Why a delivery naming its key was not verified.
#[derive(Debug)]
pub enum KeyProblem {
    /// The delivery names no key, a key the pipeline does not allow or that does not exist,
    /// or is not signed by it: a refusal.
    Refused(Rejection),
    /// The key could not be fetched now: the sender should retry.
    Unavailable(String),
}

impl FetchedKeys {
    pub fn new(config: KeyFetch, fetcher: Arc<dyn KeyFetcher>) -> FetchedKeys {
        FetchedKeys {
            config,
            fetcher,
            proven: Mutex::new(HashMap::new()),
            failed: Mutex::new(HashMap::new()),
            in_flight: Arc::new(tokio::sync::Semaphore::new(FETCHES_IN_FLIGHT_MAX)),
        }
    }

    /// Verifies a delivery with the key its body names: fetched (once, and only from an
    /// allowed URL, and only for a sender the pipeline trusts) or from the cache.
    pub async fn verify(
        &self,
        pipeline: &CompiledPipeline,
        request: &Request<'_>,
        now: Clock,
    ) -> Result<Verified, KeyProblem> {
        let refused = KeyProblem::Refused;
        // Cheap checks first: nothing is fetched for a sender the pipeline does not trust.
        let body: serde_json::Value = serde_json::from_slice(request.body)
            .map_err(|_| refused(Rejection::MalformedBody("not JSON".into())))?;
        if let Some(pointer) = &pipeline.scheme.sender_field {
            let sender = body.pointer(pointer).and_then(|v| v.as_str()).unwrap_or("");
            if !pipeline.senders.iter().any(|trusted| trusted == sender) {
                return Err(refused(Rejection::UntrustedSender(printable(sender, 64))));
            }
        }
        let named = body.pointer(&self.config.field).and_then(|v| v.as_str()).ok_or_else(|| {
            refused(Rejection::MalformedBody(format!(
                "no `{}` naming the signing key",
                self.config.field
            )))
        })?;
        let url = self.config.allows(named).map_err(|why| refused(Rejection::UntrustedKey(why)))?;

        let cached = self.proven_key(&url);
        let verifier = match cached {
            Some(verifier) => verifier,
            None => {
                if let Some((kind, why)) = self.failure(&url) {
                    return Err(match kind {
                        KeyProblemKind::NoSuchKey => refused(Rejection::UntrustedKey(why)),
                        KeyProblemKind::Unavailable => KeyProblem::Unavailable(why),
                    });
                }
                self.fetch(pipeline, &url).await?
            }
        };
        let verified = verifier.verify(request, now).map_err(refused)?;
        self.prove(url, verifier);
        Ok(verified)
    }

    async fn fetch(
        &self,
        pipeline: &CompiledPipeline,
        url: &str,
    ) -> Result<Arc<Verifier>, KeyProblem> {
        let Ok(Ok(_turn)) = tokio::time::timeout(FETCH_TURN_WAIT, self.in_flight.acquire()).await
        else {
            return Err(KeyProblem::Unavailable("too many signing keys being fetched".into()));
        };
        let bytes = match self.fetcher.fetch(url).await {
            Ok(bytes) => bytes,
            Err(FetchError::NoSuchKey(why)) => {
                self.remember_failure(url, KeyProblemKind::NoSuchKey, &why);
                return Err(KeyProblem::Refused(Rejection::UntrustedKey(why)));
            }
            Err(FetchError::Unavailable(why)) => {
                self.remember_failure(url, KeyProblemKind::Unavailable, &why);
                return Err(KeyProblem::Unavailable(why));
            }
        };
        match pipeline.verifier(&[SecretBytes::new(bytes)]) {
            Ok(verifier) => Ok(Arc::new(verifier)),
            Err(e) => {
                let why = format!("the key at {url}: {e}");
                self.remember_failure(url, KeyProblemKind::NoSuchKey, &why);
                Err(KeyProblem::Refused(Rejection::UntrustedKey(why)))
            }
        }
    }

    fn proven_key(&self, url: &str) -> Option<Arc<Verifier>> {
        let proven = self.proven.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        proven
            .get(url)
            .filter(|(_, at)| at.elapsed() < FETCHED_KEY_TTL)
            .map(|(verifier, _)| Arc::clone(verifier))
    }

    fn prove(&self, url: String, verifier: Arc<Verifier>) {
        let mut proven = self.proven.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((_, at)) = proven.get(&url)
            && at.elapsed() < FETCHED_KEY_TTL
        {
            return;
        }
        if proven.len() >= FETCHED_KEYS_MAX {
            let oldest = proven.iter().min_by_key(|(_, (_, at))| *at).map(|(u, _)| u.clone());
            if let Some(oldest) = oldest {
                proven.remove(&oldest);
            }
        }
        proven.insert(url, (verifier, Instant::now()));
    }

    fn failure(&self, url: &str) -> Option<(KeyProblemKind, String)> {
        let failed = self.failed.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        failed
            .get(url)
            .filter(|(_, _, at)| at.elapsed() < FAILED_FETCH_TTL)
            .map(|(kind, why, _)| (*kind, why.clone()))
    }

    fn remember_failure(&self, url: &str, kind: KeyProblemKind, why: &str) {
        let mut failed = self.failed.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if failed.len() >= FAILED_FETCHES_MAX {
            let oldest = failed.iter().min_by_key(|(_, (_, _, at))| *at).map(|(u, _)| u.clone());
            if let Some(oldest) = oldest {
                failed.remove(&oldest);
            }
        }
        failed.insert(url.to_owned(), (kind, why.to_owned(), Instant::now()));
    }
}
