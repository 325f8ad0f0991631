//! `hookgate serve`: load and check the configuration (refusing to start on any error or
//! unset secret), connect to the store, then serve until SIGTERM or Ctrl-C.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use hookgate_engine::{Gateway, ServedPipeline};
use hookgate_server::ServerConfig;
use hookgate_store::{Store, StoreOptions};
use hookgate_verify::Verifier;

use crate::check::{self, Options, SecretPolicy};
use crate::secrets;

#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub database_url: String,
    pub listen: SocketAddr,
    pub pipelines: Vec<PathBuf>,
    pub instances: PathBuf,
    pub server: ServerConfig,
    pub store: StoreOptions,
}

pub async fn run(options: ServeOptions) -> Result<()> {
    let gateway = build_gateway(&options).await?;
    let listener = tokio::net::TcpListener::bind(options.listen)
        .await
        .with_context(|| format!("cannot listen on {}", options.listen))?;
    let address = listener.local_addr()?;
    let names: Vec<&str> = gateway.pipeline_names().collect();
    tracing::info!(%address, backend = gateway.store().backend(), pipelines = ?names, "serving");
    // Tests and scripts read this line to learn the bound port (`--listen 127.0.0.1:0`).
    println!("hookgate listening on http://{address}");
    let store = gateway.store().clone();
    hookgate_server::serve(listener, gateway, options.server, shutdown_signal()).await?;
    store.close().await;
    tracing::info!("stopped");
    Ok(())
}

async fn build_gateway(options: &ServeOptions) -> Result<Gateway> {
    let project = check::load(&Options {
        paths: options.pipelines.clone(),
        instances: options.instances.clone(),
        secrets: SecretPolicy::Require,
    });
    if project.has_errors() {
        for diagnostic in &project.diagnostics {
            eprintln!("{diagnostic}");
        }
        bail!("the configuration has errors; `hookgate check` reports the same");
    }
    if project.pipelines.is_empty() {
        bail!("no pipelines found in {:?}", options.pipelines);
    }
    let mut served = Vec::new();
    for loaded in project.pipelines {
        let compiled = loaded.compiled;
        let secrets = compiled
            .secrets
            .iter()
            .map(|(reference, _)| secrets::resolve(reference))
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| format!("pipeline `{}`", compiled.name))?;
        let verifier = Verifier::new(compiled.scheme.clone(), &secrets, compiled.tolerance_secs)
            .with_context(|| format!("pipeline `{}`: unusable secret", compiled.name))?;
        served.push(ServedPipeline::new(compiled, verifier));
    }
    let store = Store::connect(&options.database_url, &options.store).await.with_context(|| {
        format!("cannot open the store at {}", redact_url(&options.database_url))
    })?;
    Ok(Gateway::new(store, served))
}

/// A database URL without its password, for messages.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let credentials = &url[scheme_end + 3..at];
            match credentials.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme_end + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
    tracing::info!("shutdown requested: finishing in-flight requests");
}
