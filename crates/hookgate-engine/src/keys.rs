//! Signing keys a delivery names and the gateway fetches (AWS SNS certificates): only from the
//! hosts the pipeline allows, through a fetcher the binary provides (the one owner of outbound
//! HTTP), and kept for a day so a sender's key costs one fetch, not one per delivery.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hookgate_pipeline::{CompiledPipeline, KeyFetch};
use hookgate_verify::{Rejection, Request, SecretBytes, Verifier};

/// Keys kept at most; a sender rotates rarely, so more are an attack on memory.
pub const FETCHED_KEYS_MAX: usize = 32;
/// How long a fetched key is used before it is fetched again.
pub const FETCHED_KEY_TTL: Duration = Duration::from_secs(24 * 3600);

/// Fetches a key's bytes from a URL already allowed by the pipeline. Implemented over the
/// shared outbound HTTP client, with its timeouts and bounded answers.
pub trait KeyFetcher: Send + Sync {
    fn fetch<'a>(
        &'a self,
        url: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<Vec<u8>, String>> + Send + 'a>>;
}

/// Fetches in flight at most, over every pipeline's deliveries: a flood naming new URLs is
/// answered 503 rather than queued.
pub const FETCHES_IN_FLIGHT_MAX: usize = 4;
/// How long a URL that could not be fetched is not tried again.
pub const FAILED_FETCH_TTL: Duration = Duration::from_secs(60);

/// A pipeline's fetched keys.
pub struct FetchedKeys {
    config: KeyFetch,
    fetcher: Arc<dyn KeyFetcher>,
    cache: Mutex<HashMap<String, (Cached, Instant)>>,
    in_flight: Arc<tokio::sync::Semaphore>,
}

#[derive(Clone)]
enum Cached {
    Key(Arc<Verifier>),
    Failed(String),
}

impl std::fmt::Debug for FetchedKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FetchedKeys").field("config", &self.config).finish_non_exhaustive()
    }
}

/// Why no verifier could be had for a delivery.
#[derive(Debug)]
pub enum KeyProblem {
    /// The delivery names no key, or one the pipeline does not allow: a refusal.
    Refused(Rejection),
    /// The key could not be fetched or used now: the sender should retry.
    Unavailable(String),
}

impl FetchedKeys {
    pub fn new(config: KeyFetch, fetcher: Arc<dyn KeyFetcher>) -> FetchedKeys {
        FetchedKeys {
            config,
            fetcher,
            cache: Mutex::new(HashMap::new()),
            in_flight: Arc::new(tokio::sync::Semaphore::new(FETCHES_IN_FLIGHT_MAX)),
        }
    }

    /// The verifier for the key `request`'s body names, fetched or from the cache.
    pub async fn verifier_for(
        &self,
        pipeline: &CompiledPipeline,
        request: &Request<'_>,
    ) -> Result<Arc<Verifier>, KeyProblem> {
        let url = key_url(request.body, &self.config.field).ok_or_else(|| {
            KeyProblem::Refused(Rejection::MalformedBody(format!(
                "no `{}` naming the signing key",
                self.config.field
            )))
        })?;
        self.config
            .allows(&url)
            .map_err(|why| KeyProblem::Refused(Rejection::UntrustedKey(why)))?;
        match self.cached(&url) {
            Some(Cached::Key(verifier)) => return Ok(verifier),
            Some(Cached::Failed(why)) => return Err(KeyProblem::Unavailable(why)),
            None => {}
        }
        let Ok(_permit) = self.in_flight.try_acquire() else {
            return Err(KeyProblem::Unavailable("too many signing keys being fetched".into()));
        };
        let fetched = match self.fetcher.fetch(&url).await {
            Ok(bytes) => pipeline
                .verifier(&[SecretBytes::new(bytes)])
                .map(Arc::new)
                .map_err(|e| format!("the key at {url}: {e}")),
            Err(why) => Err(why),
        };
        let entry = match &fetched {
            Ok(verifier) => Cached::Key(Arc::clone(verifier)),
            Err(why) => Cached::Failed(why.clone()),
        };
        self.remember(url, entry);
        fetched.map_err(KeyProblem::Unavailable)
    }

    fn remember(&self, url: String, entry: Cached) {
        let mut cache = self.cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if cache.len() >= FETCHED_KEYS_MAX {
            // Forget failures first, then the oldest: the cache stays bounded whatever URLs
            // deliveries name.
            let victim = cache
                .iter()
                .min_by_key(|(_, (cached, at))| (matches!(cached, Cached::Key(_)), *at))
                .map(|(url, _)| url.clone());
            if let Some(victim) = victim {
                cache.remove(&victim);
            }
        }
        cache.insert(url, (entry, Instant::now()));
    }

    fn cached(&self, url: &str) -> Option<Cached> {
        let cache = self.cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (cached, at) = cache.get(url)?;
        let ttl = match cached {
            Cached::Key(_) => FETCHED_KEY_TTL,
            Cached::Failed(_) => FAILED_FETCH_TTL,
        };
        (at.elapsed() < ttl).then(|| cached.clone())
    }
}

fn key_url(body: &[u8], pointer: &str) -> Option<String> {
    let json: serde_json::Value = serde_json::from_slice(body).ok()?;
    json.pointer(pointer)?.as_str().map(str::to_owned)
}
