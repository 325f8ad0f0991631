//! Fake CRM servers that behave like the documented APIs (see
//! `shared/reference/crm-apis.md`): real HTTP on a loopback port, state kept between calls,
//! the documented answers including their errors, and a switch for each documented edge.
//!
//! - [`salesforce::FakeSalesforce`]: OAuth token endpoint with expiry, upsert and lookup by
//!   external id, 201/200/204 by API version, 300 for non-unique external ids, error arrays,
//!   the daily limit with `Sforce-Limit-Info`, HTML and JSON 503, lost responses.
//! - [`hubspot::FakeHubSpot`]: private-app tokens, batch upsert by a unique `idProperty` with
//!   the `new` flag, update by `idProperty`, search with lag, the 10-second rate-limit window
//!   and the daily limit with their headers (429 `TEN_SECONDLY_ROLLING` or `DAILY`), 401/403
//!   bodies, lost responses.
//! - [`rest::FakeRest`]: a plain in-house REST CRM for the declarative `kind: http`
//!   connector: OAuth client credentials with expiring tokens or a static API key, upsert by
//!   `PUT /objects/{object}/by/{field}/{value}` with 201/200, idempotency keys, 422
//!   validation, 429 with `Retry-After`, 503, lost answers and dropped connections.
//! - [`stripe::FakeStripe`]: a source for `refresh:`, Stripe's customer retrieval with its
//!   Basic-auth secret key, `resource_missing` 404s, deleted customers, and scripted faults.
//!
//! Each fake is started on `127.0.0.1:0` and stops when dropped. Each keeps an effect log
//! (`writes`): every write it applied, in order, with the values it set. Faults come scripted
//! (one-shot queues for writes and for lookups) or at random ([`chaos::Chaos`], seeded).

// Handlers return complete axum answers as their errors, as the real APIs answer: boxing them
// would buy nothing in a test server.
#![allow(clippy::result_large_err)]

pub mod chaos;
pub mod hubspot;
pub mod proxy;
pub mod rest;
pub mod salesforce;
pub mod stripe;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// A running fake server; aborted when dropped.
#[derive(Debug)]
pub struct Running {
    pub base_url: String,
    task: JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A loopback listener and its base URL, bound before the router is built so that the
/// router's state can know its own address.
async fn bind() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a loopback port");
    let address = listener.local_addr().expect("bound");
    (listener, format!("http://{address}"))
}

fn spawn(listener: TcpListener, base_url: String, router: axum::Router) -> Running {
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Running { base_url, task }
}
