//! Logs and traces: the process's `tracing` subscriber.
//!
//! Logs go to stderr, filtered by `RUST_LOG`. With the `otlp` cargo feature and
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) set, spans are also
//! exported in batches over OTLP/HTTP (JSON), as service `hookgate` unless `OTEL_SERVICE_NAME`
//! says otherwise. The standard `OTEL_*` variables (headers, timeout, `OTEL_BSP_*`) apply.
//!
//! The engine's spans are `delivery` (one per request at intake) and `attempt` (one per leased
//! write), carrying the pipeline, the event id, the target and the outcome.

use tracing_subscriber::Layer;
use tracing_subscriber::filter::{EnvFilter, FilterExt as _, filter_fn};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::registry::Registry;
use tracing_subscriber::util::SubscriberInitExt as _;

/// The variables that turn export on: the generic endpoint, or the traces one.
const ENDPOINT_VARS: [&str; 2] =
    ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"];

/// How log lines look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// `key=value` lines.
    Text,
    /// One JSON object per line, fields at the top level.
    Json,
}

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[cfg(feature = "otlp")]
    #[error("OTLP export: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
}

/// Keeps the span exporter running; [`Telemetry::shutdown`] (or dropping it) exports the spans
/// still queued. Without export it holds nothing.
#[derive(Debug)]
#[must_use = "dropping the guard stops span export"]
pub struct Telemetry {
    #[cfg(feature = "otlp")]
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Telemetry {
    /// Exports the spans still queued and stops the exporter. Waits at most a few seconds for
    /// an unreachable collector.
    pub fn shutdown(mut self) {
        self.flush();
    }

    fn flush(&mut self) {
        #[cfg(feature = "otlp")]
        if let Some(provider) = self.provider.take()
            && let Err(error) = provider.shutdown()
        {
            // The subscriber may be gone or its output closed by now: straight to stderr.
            eprintln!("warning: exporting the last spans over OTLP failed: {error}");
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Installs the process's subscriber: logs filtered by `RUST_LOG` (or `default_filter` when it
/// is unset or invalid) in `format`, and span export when it is configured (see the module).
pub fn init(default_filter: &str, format: LogFormat) -> Result<Telemetry, TelemetryError> {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(false);
    let logs = match format {
        LogFormat::Text => logs.boxed(),
        // Fields at the top level of each object, beside `timestamp`, `level` and `message`.
        LogFormat::Json => logs.json().flatten_event(true).with_current_span(false).boxed(),
    };
    // Log lines leave spans out: they name their pipeline and event themselves, the JSON shape
    // stays as documented, and intake formats nothing per delivery for a span nobody reads.
    let logs = logs.with_filter(filter.and(filter_fn(|metadata| !metadata.is_span())));
    #[cfg_attr(not(feature = "otlp"), allow(unused_mut))]
    let mut layers: Vec<Box<dyn Layer<Registry> + Send + Sync>> = vec![logs.boxed()];

    let endpoint = ENDPOINT_VARS
        .into_iter()
        .find(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()));
    #[cfg(feature = "otlp")]
    let (provider, warnings) = match endpoint {
        Some(_) => {
            let (provider, layer) = otlp::layer()?;
            layers.push(layer);
            (Some(provider), otlp::protocol_warnings())
        }
        None => (None, Vec::new()),
    };
    #[cfg(not(feature = "otlp"))]
    let warnings: Vec<String> = endpoint
        .map(|name| {
            format!(
                "{name} is set, but this build of hookgate has no OTLP export (cargo feature \
                 `otlp`): spans are not exported"
            )
        })
        .into_iter()
        .collect();

    tracing_subscriber::registry().with(layers).init();
    for warning in warnings {
        tracing::warn!("{warning}");
    }
    Ok(Telemetry {
        #[cfg(feature = "otlp")]
        provider,
    })
}

#[cfg(feature = "otlp")]
mod otlp {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry::{Key, Value};
    use opentelemetry_sdk::Resource;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing::level_filters::LevelFilter;
    use tracing_subscriber::Layer;
    use tracing_subscriber::filter::Targets;
    use tracing_subscriber::registry::Registry;

    use super::TelemetryError;

    const SERVICE_NAME: &str = "hookgate";

    /// The only encoding this build sends.
    const PROTOCOL: &str = "http/json";

    /// The tracer provider, batching spans to the endpoint the environment names, and the
    /// layer that feeds it.
    pub(super) fn layer()
    -> Result<(SdkTracerProvider, Box<dyn Layer<Registry> + Send + Sync>), TelemetryError> {
        // Reads the endpoint, headers, timeout and compression from the `OTEL_*` variables.
        let exporter = opentelemetry_otlp::SpanExporter::builder().with_http().build()?;
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource())
            .build();
        let tracer = provider.tracer(SERVICE_NAME);
        let layer = tracing_opentelemetry::layer()
            .with_tracer(tracer)
            // Tokio's worker threads say nothing about a delivery.
            .with_threads(false)
            // The attribute `target` is the pipeline's target; the module that opened the span
            // is in `code.module.name` already.
            .with_target(false)
            // The gateway's own spans and events, whatever `RUST_LOG` keeps in the log: a target
            // matches by prefix, so `hookgate` covers every `hookgate_*` crate. Leaving out the
            // HTTP client's and the SDK's own targets also keeps export from tracing itself.
            .with_filter(Targets::new().with_target("hookgate", LevelFilter::INFO));
        Ok((provider, layer.boxed()))
    }

    /// `hookgate` unless the environment names the service (`OTEL_SERVICE_NAME`, or
    /// `service.name` in `OTEL_RESOURCE_ATTRIBUTES`); the detectors fill in the rest.
    fn resource() -> Resource {
        let detected = Resource::builder().build();
        let named = detected
            .get(&Key::from_static_str("service.name"))
            .is_some_and(|name| !name.as_str().starts_with("unknown_service"));
        if named {
            detected
        } else {
            Resource::builder().with_service_name(Value::from(SERVICE_NAME)).build()
        }
    }

    /// A protocol the environment asks for that this build does not send: the exporter falls
    /// back to JSON without a word.
    pub(super) fn protocol_warnings() -> Vec<String> {
        ["OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"]
            .into_iter()
            .filter_map(|name| {
                let value = std::env::var(name).ok()?;
                (!value.is_empty() && !value.eq_ignore_ascii_case(PROTOCOL)).then(|| {
                    format!("{name}={value} is ignored: this build exports OTLP as {PROTOCOL}")
                })
            })
            .collect()
    }
}
