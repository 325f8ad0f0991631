//! The transport: accepting connections and serving HTTP/1 on them, with a bound on each
//! resource an unauthenticated client can hold.
//!
//! - **Connections**: at most `connections_max` are served at once. One more is answered a
//!   canned 503 with one non-blocking write and closed, without reading it.
//! - **Time**: the request line and headers must arrive within `header_timeout`, and a
//!   keep-alive connection waiting for its next request is closed after it too (hyper runs the
//!   same timer for both). A body must arrive within `read_timeout` (in the handler).
//! - **Memory**: hyper's read buffer holds at most the header limit plus a margin; bodies are
//!   bounded per request (`body_bytes_max`) and, all together, by `body_bytes_in_flight_max`.
//! - **Shutdown**: the listener closes at once, idle connections close, requests in flight
//!   finish; whatever is still open after `shutdown_timeout` is dropped.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::refusal::{Refusal, refused};
use crate::{ServerConfig, router};
use hookgate_engine::Gateway;

/// After a failed accept (out of file descriptors, most often), wait this long before the
/// next: retrying at once would spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// hyper's read buffer: the header limit plus room for the request line.
const REQUEST_LINE_BYTES: usize = 8 * 1024;

/// What a connection over the limit is told, in one write, before it is closed.
const OVER_CAPACITY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nretry-after: 1\r\ncontent-type: application/json\r\ncontent-length: 27\r\nconnection: close\r\n\r\n{\"status\":\"over_capacity\"}";

/// Serves intake until `shutdown` completes; see the module documentation for the limits.
pub async fn serve(
    listener: TcpListener,
    gateway: Gateway,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let limits = config.clone();
    serve_app(listener, router(gateway, config), &limits, shutdown).await
}

/// Serves any router under the same limits (connections, header time and size) until
/// `shutdown` completes: the admin listener uses it too. Bodies are the router's to bound.
pub async fn serve_app(
    listener: TcpListener,
    app: axum::Router,
    config: &ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let shutdown_timeout = config.shutdown_timeout;
    let connections = Arc::new(Semaphore::new(config.connections_max));
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(config.header_timeout)
        .max_buf_size((config.header_bytes_max + REQUEST_LINE_BYTES).max(8192));
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    refused(Refusal::AcceptFailed, &error);
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(permit) = Arc::clone(&connections).try_acquire_owned() else {
            // A fresh socket's send buffer takes this whole; if not, the close says enough.
            let _ = stream.try_write(OVER_CAPACITY);
            refused(Refusal::OverCapacity, &"all connections in use");
            continue;
        };
        let service = TowerToHyperService::new(app.clone());
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                let refusal = if error.is_timeout() {
                    Some(Refusal::HeaderTimeout)
                } else if error.is_parse_too_large() {
                    Some(Refusal::HeadersTooLarge)
                } else if error.is_parse() {
                    Some(Refusal::Malformed)
                } else {
                    None
                };
                if let Some(refusal) = refusal {
                    refused(refusal, &error);
                }
            }
            drop(permit);
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(shutdown_timeout) => {
            tracing::warn!(timeout_ms = shutdown_timeout.as_millis(), "connections still open at the shutdown deadline are dropped");
        }
    }
    Ok(())
}
