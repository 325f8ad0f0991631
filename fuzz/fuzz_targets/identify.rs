//! Identity and writes derived from hostile bodies and headers by every shipped pipeline: keys,
//! scopes, types, versions, fingerprints, conditions and templates. Nothing may panic, and
//! whatever is accepted must be a usable identity.
#![no_main]

use std::sync::LazyLock;

use hookgate_pipeline::CompiledPipeline;
use hookgate_pipeline::evaluate::Delivery;
use libfuzzer_sys::fuzz_target;

static PIPELINES: LazyLock<Vec<CompiledPipeline>> = LazyLock::new(|| {
    [
        include_str!("../../pipelines/crm-partner.yaml"),
        include_str!("../../pipelines/github.yaml"),
        include_str!("../../pipelines/shopify.yaml"),
        include_str!("../../pipelines/signups.yaml"),
        include_str!("../../pipelines/standard-webhooks.yaml"),
        include_str!("../../pipelines/stripe.yaml"),
    ]
    .into_iter()
    .map(|source| {
        let (compiled, diagnostics) = hookgate_pipeline::load_pipeline("p.yaml", source, None);
        compiled.unwrap_or_else(|| panic!("a shipped pipeline compiles: {diagnostics:?}"))
    })
    .collect()
});

/// The headers the shipped pipelines read; the input gives each a value.
const HEADERS: &[&str] = &[
    "x-github-delivery",
    "x-github-event",
    "x-github-hook-id",
    "x-shopify-webhook-id",
    "x-shopify-topic",
    "x-shopify-shop-domain",
    "webhook-id",
];

fuzz_target!(|data: &[u8]| {
    let mut parts = data.split(|b| *b == 0);
    let headers: Vec<(String, Vec<u8>)> = HEADERS
        .iter()
        .zip(parts.by_ref())
        .map(|(name, value)| ((*name).to_owned(), value.to_vec()))
        .collect();
    let body: Vec<u8> = parts.flatten().copied().collect();
    let delivery = Delivery { headers: &headers, body: &body };
    for pipeline in PIPELINES.iter() {
        let Ok((identity, ctx)) = pipeline.identify(&delivery) else { continue };
        assert!(!identity.key.is_empty() && identity.key.len() <= 512);
        assert!(!identity.key.chars().any(char::is_control), "{:?}", identity.key);
        if let Some(ordering) = &identity.ordering {
            assert!(!ordering.entity.trim().is_empty());
            let _ = ordering.version.sort_key();
        }
        let _ = pipeline.check_future(&identity, 1_700_000_000_000);
        if let Ok(due) = pipeline.due_targets(&ctx) {
            for index in due {
                let _ = pipeline.render_external_id(index, &ctx);
                let _ = pipeline.render_target(index, &ctx);
            }
        }
    }
});
