//! Signing keys a delivery names and the gateway fetches (AWS SNS certificates): only from the
//! hosts the pipeline allows, through a fetcher the binary provides (the one owner of outbound
//! HTTP), and kept for a day so a sender's key costs one fetch, not one per delivery.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hookgate_pipeline::KeyFetch;
use hookgate_verify::{Rejection, Request, Scheme, SecretBytes, Verifier};

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

/// A pipeline's fetched keys.
pub struct FetchedKeys {
    config: KeyFetch,
    fetcher: Arc<dyn KeyFetcher>,
    cache: Mutex<HashMap<String, (Arc<Verifier>, Instant)>>,
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
        FetchedKeys { config, fetcher, cache: Mutex::new(HashMap::new()) }
    }

    /// The verifier for the key `request`'s body names, fetched or from the cache.
    pub async fn verifier_for(
        &self,
        scheme: &Scheme,
        tolerance_secs: Option<u32>,
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
        if let Some(verifier) = self.cached(&url) {
            return Ok(verifier);
        }
        let bytes = self.fetcher.fetch(&url).await.map_err(KeyProblem::Unavailable)?;
        let verifier = Verifier::new(scheme.clone(), &[SecretBytes::new(bytes)], tolerance_secs)
            .map_err(|e| KeyProblem::Unavailable(format!("the key at {url}: {e}")))?;
        let verifier = Arc::new(verifier);
        let mut cache = self.cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if cache.len() >= FETCHED_KEYS_MAX {
            // Forget the oldest: the cache stays bounded whatever URLs deliveries name.
            if let Some(oldest) =
                cache.iter().min_by_key(|(_, (_, at))| *at).map(|(url, _)| url.clone())
            {
                cache.remove(&oldest);
            }
        }
        cache.insert(url, (Arc::clone(&verifier), Instant::now()));
        Ok(verifier)
    }

    fn cached(&self, url: &str) -> Option<Arc<Verifier>> {
        let cache = self.cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        cache
            .get(url)
            .filter(|(_, at)| at.elapsed() < FETCHED_KEY_TTL)
            .map(|(verifier, _)| Arc::clone(verifier))
    }
}

fn key_url(body: &[u8], pointer: &str) -> Option<String> {
    let json: serde_json::Value = serde_json::from_slice(body).ok()?;
    json.pointer(pointer)?.as_str().map(str::to_owned)
}
