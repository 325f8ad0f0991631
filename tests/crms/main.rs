//! Deliveries through the gateway into the fake Salesforce and the fake HubSpot: the shipped
//! `shopify` and `signups` pipelines, `hookgate serve` as a child process with workers, and the
//! fakes in this process. One record per external id with the expected values, including
//! after a token expiry, a 429 burst and a lost response.

// Test helpers panic on a broken setup, which is what a test should do.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use crate::support::*;
use hookgate_fakes::hubspot::{self, FakeHubSpot};
use hookgate_fakes::salesforce::{self, FakeSalesforce};
use hookgate_store::Store;

/// An instances file pointing `salesforce` and `hubspot` at the fakes; the credentials are
/// the ones the test server's environment carries.
fn instances(dir: &std::path::Path, sf: &FakeSalesforce, hs: &FakeHubSpot) -> std::path::PathBuf {
    let path = dir.join("hookgate.yaml");
    let text = format!(
        "connectors:\n  - name: salesforce\n    kind: salesforce\n    settings:\n      login_url: {}\n      api_version: \"60.0\"\n    credentials:\n      client_id: {{ env: SALESFORCE_CLIENT_ID }}\n      client_secret: {{ env: SALESFORCE_CLIENT_SECRET }}\n  - name: hubspot\n    kind: hubspot\n    settings:\n      base_url: {}\n    credentials:\n      token: {{ env: HUBSPOT_TOKEN }}\n",
        sf.base_url, hs.base_url
    );
    std::fs::write(&path, text).unwrap();
    path
}

async fn drained(store: &Store) {
    let done = eventually(Duration::from_secs(90), || async {
        store.unfinished_items().await.unwrap() == 0
    })
    .await;
    assert!(done, "writes still pending after 90 s");
}

async fn send_all(server: &Server, deliveries: &[Delivery]) {
    let client = client();
    for delivery in deliveries {
        let status = delivery.send(&client, server).await.status();
        assert!(status.is_success(), "{status}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_reach_salesforce_and_hubspot_once_each_through_faults() {
    let sf = FakeSalesforce::start().await;
    let hs = FakeHubSpot::start().await;
    {
        let mut state = sf.lock();
        state.client_id = "e2e-client".into();
        state.client_secret = "e2e-secret".into();
    }
    hs.lock().token = "pat-na1-e2e".into();
    let dir = tempfile::tempdir().unwrap();
    let pipelines = dir.path().join("pipelines");
    std::fs::create_dir(&pipelines).unwrap();
    for name in ["shopify.yaml", "signups.yaml"] {
        std::fs::copy(root().join("pipelines").join(name), pipelines.join(name)).unwrap();
    }
    let database = Database::sqlite().await;
    let server = ServerBuilder::new(database.url())
        .pipelines(pipelines)
        .instances(instances(dir.path(), &sf, &hs))
        .workers(4)
        .arg("--call-timeout-ms")
        .arg("1500")
        .start();
    let store = database.store().await;

    // Salesforce: five customers, then an expired token, then updates; one answer lost.
    let first: Vec<Delivery> = (1..=5)
        .map(|i| {
            shopify_customer(
                &format!("w-{i}"),
                1000 + i,
                "2026-03-01T10:00:00Z",
                &format!("First{i}"),
                &format!("c{i}@example.com"),
            )
        })
        .collect();
    send_all(&server, &first).await;
    drained(&store).await;
    assert_eq!(sf.lock().token_requests, 1);
    sf.expire_tokens();
    sf.push_fault(salesforce::Fault::LostResponse(Duration::from_secs(3)));
    let updates: Vec<Delivery> = (1..=5)
        .map(|i| {
            shopify_customer(
                &format!("w-u{i}"),
                1000 + i,
                "2026-03-01T11:00:00Z",
                &format!("Renamed{i}"),
                &format!("c{i}@example.com"),
            )
        })
        .collect();
    send_all(&server, &updates).await;
    drained(&store).await;

    let contacts = sf.records("Contact");
    assert_eq!(contacts.len(), 5, "one record per Shopify customer id");
    for i in 1..=5u64 {
        let id = (1000 + i).to_string();
        let contact =
            contacts.iter().find(|c| c.fields["Shopify_Customer_Id__c"] == id.as_str()).unwrap();
        assert_eq!(contact.fields["FirstName"], format!("Renamed{i}"));
        assert_eq!(contact.fields["Email"], format!("c{i}@example.com"));
        assert_eq!(contact.fields["Shopify_Shop__c"], "e2e-shop.myshopify.com");
    }
    assert_eq!(
        sf.writes().len(),
        10,
        "ten writes for ten events: the lost answer was reconciled, not rewritten"
    );
    assert_eq!(sf.lock().token_requests, 2, "the expired token was refreshed once");

    // HubSpot: a burst of twelve sign-ups against three requests per second; one answer lost.
    {
        let mut state = hs.lock();
        state.max_per_window = 3;
        state.window_length = Duration::from_secs(1);
        state.retry_after_on_429 = true;
    }
    hs.push_fault(hubspot::Fault::LostResponse(Duration::from_secs(3)));
    let signups: Vec<Delivery> = (1..=12)
        .map(|i| {
            signup(
                &format!("evt-{i}"),
                &format!("User{i}@Example.com"),
                &format!("User{i}"),
                "team",
            )
        })
        .collect();
    send_all(&server, &signups).await;
    drained(&store).await;

    let contacts = hs.records("contacts");
    assert_eq!(contacts.len(), 12, "one record per email");
    for i in 1..=12 {
        let email = format!("user{i}@example.com");
        let contact = contacts.iter().find(|c| c.properties["email"] == email).unwrap();
        assert_eq!(contact.properties["firstname"], format!("User{i}"));
        assert_eq!(contact.properties["plan"], "team");
    }
    assert_eq!(hs.writes().len(), 12, "twelve writes: no event written twice");
    let mut limited = 0;
    for event in store.events("signups").await.unwrap() {
        limited += store
            .attempts_for(event.id)
            .await
            .unwrap()
            .iter()
            .filter(|a| a.outcome == Some(hookgate_store::AttemptOutcome::RateLimited))
            .count();
    }
    assert!(limited > 0, "the burst met the rate limit");
    for event in store
        .events("signups")
        .await
        .unwrap()
        .iter()
        .chain(store.events("shopify").await.unwrap().iter())
    {
        assert_eq!(
            event.state,
            hookgate_store::EventState::Done,
            "event {} is {}",
            event.id,
            event.state
        );
    }
    store.close().await;
    drop(server);
    database.cleanup().await;
}

/// The delivery tests' `orders` pipeline (ordered by `seq` per customer), writing to the
/// connector instance `crm`, which `instances` points at one of the fakes.
fn orders_pipeline() -> std::path::PathBuf {
    root().join("tests/delivery/orders.yaml")
}

fn crm_instances(dir: &std::path::Path, crm: &str) -> std::path::PathBuf {
    let path = dir.join("hookgate.yaml");
    std::fs::write(&path, format!("connectors:\n  - name: crm\n{crm}")).unwrap();
    path
}

async fn fake_salesforce() -> FakeSalesforce {
    let sf = FakeSalesforce::start().await;
    {
        let mut state = sf.lock();
        state.client_id = "e2e-client".into();
        state.client_secret = "e2e-secret".into();
        state.objects.insert("customers".into());
    }
    sf
}

/// A fake HubSpot that knows the `orders` pipeline's object, with `customer_id` unique.
async fn fake_hubspot() -> FakeHubSpot {
    let hs = FakeHubSpot::start().await;
    {
        let mut state = hs.lock();
        state.token = "pat-na1-e2e".into();
        state.unique_properties.insert("customers".into(), ["customer_id".into()].into());
    }
    hs
}

/// An instances file whose `crm` is the fake HubSpot.
fn hubspot_instances(dir: &std::path::Path, hs: &FakeHubSpot) -> std::path::PathBuf {
    crm_instances(
        dir,
        &format!(
            "    kind: hubspot\n    settings: {{ base_url: \"{}\" }}\n    credentials: {{ token: {{ env: HUBSPOT_TOKEN }} }}\n",
            hs.base_url
        ),
    )
}

/// The states of the events with these ids, in that order.
async fn states(store: &Store, events: &[i64]) -> Vec<String> {
    let mut states = Vec::new();
    for event in events {
        states.push(store.outbox_for(*event).await.unwrap().remove(0).state.to_string());
    }
    states
}

async fn accept(client: &reqwest::Client, server: &Server, delivery: &Delivery) -> i64 {
    let response = delivery.send(client, server).await;
    assert!(response.status().is_success(), "{}", response.status());
    response.json::<serde_json::Value>().await.unwrap()["event_id"].as_i64().unwrap()
}

fn stories(attempts: &[hookgate_store::AttemptRecord]) -> Vec<(String, String)> {
    attempts
        .iter()
        .map(|a| {
            let outcome =
                a.outcome.map_or("(unfinished)", hookgate_store::AttemptOutcome::as_str).to_owned();
            (a.action.clone().unwrap_or_default(), outcome)
        })
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(a, b)| ((*a).to_owned(), (*b).to_owned())).collect()
}

/// A regression test for the first sequence the chaos run found: v3 is applied by the CRM and
/// its worker is killed before it records the answer; v1 and v2 arrive. Before the fix, v1
/// was leased first when v3's lease expired (nothing recorded v3 as applied), so the CRM went
/// back from v3 to v1, then v2, and v3 was then written a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_in_doubt_after_a_kill_is_settled_before_older_versions_are_written() {
    for database in Database::both().await {
        let backend = database.name();
        let sf = fake_salesforce().await;
        // The write is applied; its answer would come 60 s later.
        sf.push_fault(salesforce::Fault::LostResponse(Duration::from_secs(60)));
        let dir = tempfile::tempdir().unwrap();
        let instances = crm_instances(
            dir.path(),
            &format!(
                "    kind: salesforce\n    settings: {{ login_url: \"{}\", api_version: \"60.0\" }}\n    credentials:\n      client_id: {{ env: SALESFORCE_CLIENT_ID }}\n      client_secret: {{ env: SALESFORCE_CLIENT_SECRET }}\n",
                sf.base_url
            ),
        );
        let builder = ServerBuilder::new(database.url())
            .pipelines(orders_pipeline())
            .instances(instances)
            .workers(2)
            .arg("--lease-ms")
            .arg("4000")
            .arg("--call-timeout-ms")
            .arg("3000");
        let mut first = builder.start();
        let client = client();
        let v3 = accept(&client, &first, &order("o-3", "C-1", 3, "shipped")).await;
        let applied =
            eventually(Duration::from_secs(20), || async { sf.writes().len() == 1 }).await;
        assert!(applied, "{backend}: v3 never reached the CRM");
        first.kill();

        let second = builder.start();
        let v1 = accept(&client, &second, &order("o-1", "C-1", 1, "paid")).await;
        let v2 = accept(&client, &second, &order("o-2", "C-1", 2, "packed")).await;
        let store = database.store().await;
        drained(&store).await;

        let writes: Vec<String> = sf.writes().iter().map(|w| w.fields["seq"].clone()).collect();
        assert_eq!(writes, ["3"], "{backend}: v3 once, and nothing older after it");
        assert_eq!(sf.records("customers")[0].fields["status"], "shipped");
        assert_eq!(
            states(&store, &[v1, v2, v3]).await,
            ["skipped_stale", "skipped_stale", "done"],
            "{backend}"
        );
        let v3_story = stories(&store.attempts_for(v3).await.unwrap());
        assert_eq!(
            v3_story,
            pairs(&[("lease", "abandoned"), ("lookup", "reconciled")]),
            "{backend}: looked up, and found, before anything else"
        );
        let stale = store.outbox_for(v1).await.unwrap().remove(0);
        assert_eq!(
            stale.last_error.as_deref(),
            Some("version 1 is not newer than 3, already applied to C-1"),
            "{backend}: evidence in the sender's terms"
        );
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_hookgate"))
            .args(["events", "--database-url", database.url(), "show", &v3.to_string()])
            .output()
            .unwrap();
        let story = String::from_utf8_lossy(&output.stdout);
        assert!(story.contains("entity C-1  version 3  state done"), "{backend}: {story}");
        assert!(!story.contains("0922337"), "{backend}: no sort keys in evidence: {story}");
        store.close().await;
        drop(second);
        database.cleanup().await;
    }
}

/// A regression test for the second sequence, with no kill at all: v10's answer is lost and
/// the lookup right after it is rate-limited, so v10 waits in doubt; v7, v8 and v9 arrive
/// meanwhile. Before the fix, they were written over v10, and v10 was then written again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn older_versions_wait_while_a_lost_answer_cannot_be_looked_up() {
    for database in Database::both().await {
        let backend = database.name();
        let hs = fake_hubspot().await;
        // A 429 without Retry-After waits for the window: the time v7..v9 arrive in.
        hs.lock().window_length = Duration::from_secs(2);
        hs.push_fault(hubspot::Fault::LostResponse(Duration::from_secs(30)));
        hs.push_lookup_fault(hubspot::Fault::RateLimited { retry_after: None });
        let dir = tempfile::tempdir().unwrap();
        let instances = hubspot_instances(dir.path(), &hs);
        let server = ServerBuilder::new(database.url())
            .pipelines(orders_pipeline())
            .instances(instances)
            .workers(4)
            .arg("--call-timeout-ms")
            .arg("1000")
            .start();
        let store = database.store().await;
        let client = client();
        let v10 = accept(&client, &server, &order("o-10", "C-1", 10, "delivered")).await;
        let waiting = eventually(Duration::from_secs(20), || async {
            let item = store.outbox_for(v10).await.unwrap().remove(0);
            item.state.as_str() == "pending" && item.in_doubt
        })
        .await;
        assert!(waiting, "{backend}: v10 should wait in doubt after its lookup was refused");
        let mut older = Vec::new();
        for seq in [7, 8, 9] {
            older.push(
                accept(&client, &server, &order(&format!("o-{seq}"), "C-1", seq, "old")).await,
            );
        }
        drained(&store).await;

        let writes: Vec<String> = hs.writes().iter().map(|w| w.properties["seq"].clone()).collect();
        assert_eq!(writes, ["10"], "{backend}: nothing older was written, and v10 only once");
        assert_eq!(hs.records("customers")[0].properties["status"], "delivered");
        assert_eq!(
            states(&store, &older).await,
            ["skipped_stale", "skipped_stale", "skipped_stale"],
            "{backend}"
        );
        let attempts = store.attempts_for(v10).await.unwrap();
        assert_eq!(
            stories(&attempts),
            pairs(&[("upsert", "ambiguous"), ("lookup", "rate_limited"), ("lookup", "reconciled")]),
            "{backend}"
        );
        assert_eq!(attempts[1].status, Some(429), "{backend}: the failed lookup is evidence");
        assert!(
            attempts[1].excerpt.as_deref().unwrap().contains("RATE_LIMIT"),
            "{backend}: with the CRM's answer"
        );
        let waited = attempts[2].started_at_ms - attempts[1].finished_at_ms.unwrap();
        assert!(waited >= 2000, "{backend}: looked up again after the window, not {waited} ms");
        store.close().await;
        drop(server);
        database.cleanup().await;
    }
}

/// One attempt that takes longer than a lease: the write's answer is lost after 2 s and the
/// lookup that follows answers after 1.5 s, against 3 s leases. The lease is renewed before each
/// call, so the second gateway never takes the entity over mid-attempt, and one worker settles
/// it with one lookup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_is_renewed_before_each_call_so_no_worker_takes_over_mid_attempt() {
    for database in Database::both().await {
        let backend = database.name();
        let hs = fake_hubspot().await;
        hs.push_fault(hubspot::Fault::LostResponse(Duration::from_millis(2500)));
        hs.push_lookup_fault(hubspot::Fault::LostResponse(Duration::from_millis(1500)));
        let dir = tempfile::tempdir().unwrap();
        let instances = hubspot_instances(dir.path(), &hs);
        let builder = ServerBuilder::new(database.url())
            .pipelines(orders_pipeline())
            .instances(instances)
            .workers(1)
            .arg("--lease-ms")
            .arg("3000")
            .arg("--call-timeout-ms")
            .arg("2000");
        let (first, second) = (builder.start(), builder.start());
        let store = database.store().await;
        let event = accept(&client(), &first, &order("o-1", "C-1", 1, "paid")).await;
        drained(&store).await;

        let attempts = store.attempts_for(event).await.unwrap();
        assert_eq!(
            stories(&attempts),
            pairs(&[("upsert", "ambiguous"), ("lookup", "reconciled")]),
            "{backend}"
        );
        assert_eq!(attempts[0].worker, attempts[1].worker, "{backend}: one lease throughout");
        assert!(
            attempts[1].finished_at_ms.unwrap() - attempts[0].started_at_ms > 3000,
            "{backend}: the attempt outlasted one lease period"
        );
        assert_eq!(hs.writes().len(), 1, "{backend}");
        store.close().await;
        drop((first, second));
        database.cleanup().await;
    }
}

/// A 502 answering a write proves nothing (a gateway that gave up may sit in front of a CRM
/// that committed): the record is looked up before the write is sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_error_to_a_write_is_looked_up_before_the_write_is_sent_again() {
    let database = Database::postgres().await;
    let hs = fake_hubspot().await;
    hs.push_fault(hubspot::Fault::ServerError(502));
    let dir = tempfile::tempdir().unwrap();
    let instances = hubspot_instances(dir.path(), &hs);
    let server = ServerBuilder::new(database.url())
        .pipelines(orders_pipeline())
        .instances(instances)
        .workers(2)
        .start();
    let store = database.store().await;
    let event = accept(&client(), &server, &order("o-1", "C-1", 1, "paid")).await;
    drained(&store).await;
    let attempts = store.attempts_for(event).await.unwrap();
    assert_eq!(
        stories(&attempts),
        pairs(&[("upsert", "retryable"), ("lookup", "not_found"), ("upsert", "created")])
    );
    assert_eq!(attempts[0].status, Some(502));
    assert_eq!(hs.writes().len(), 1);
    store.close().await;
    drop(server);
    database.cleanup().await;
}

/// `kind: http` end to end: the shipped `inhouse` instance (settings only, its URLs given by
/// reference) and the example pipeline, against the fake in-house REST CRM with a 503, a 429,
/// a lost answer and an expired token on the way. Judged from the CRM's own effect log: one
/// write per customer and order, the lost one reconciled by a lookup, not written twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_declarative_rest_connector_writes_once_each_through_faults() {
    use hookgate_fakes::rest::{self as rest, FakeRest};
    let crm = FakeRest::start().await;
    crm.push_fault(rest::Fault::ServerError(503));
    crm.push_fault(rest::Fault::RateLimited { retry_after: Some("1".into()) });
    crm.push_fault(rest::Fault::LostResponse(Duration::from_secs(15)));
    let database = Database::sqlite().await;
    let server = ServerBuilder::new(database.url())
        .pipelines(root().join("pipelines/examples/inhouse-orders.yaml"))
        .workers(2)
        .env("INHOUSE_CRM_URL", &crm.base_url)
        .env("INHOUSE_TOKEN_URL", &format!("{}/oauth/token", crm.base_url))
        .env("INHOUSE_CLIENT_ID", rest::CLIENT_ID)
        .env("INHOUSE_CLIENT_SECRET", rest::CLIENT_SECRET)
        .env("INHOUSE_ORDERS_SECRET", "inhouse-e2e-secret")
        .arg("--call-timeout-ms")
        .arg("3000")
        .start();
    let signed = |id: &str, customer: &str, seq: u64| {
        let body =
            format!(r#"{{"id":"{id}","customer":"{customer}","seq":{seq},"status":"paid"}}"#);
        let mac = hookgate_verify::compute_mac(
            hookgate_verify::Algorithm::HmacSha256,
            b"inhouse-e2e-secret",
            &[body.as_bytes()],
        );
        Delivery {
            pipeline: "inhouse-orders",
            headers: vec![(
                "X-Signature".into(),
                format!("sha256={}", hookgate_verify::Encoding::Hex.encode(&mac)),
            )],
            body: body.into_bytes(),
        }
    };
    let deliveries = [
        signed("o-1", "ada", 1),
        signed("o-2", "grace", 1),
        signed("o-3", "linus", 1),
        // At least once: a redelivery is the same event.
        signed("o-2", "grace", 1),
    ];
    send_all(&server, &deliveries).await;
    // Once the first writes are in, the token they used is revoked: the next write is refused
    // with 401 and must fetch a new one.
    assert!(
        eventually(Duration::from_secs(60), || async { crm.writes().len() >= 3 }).await,
        "{:#?}",
        crm.writes()
    );
    crm.expire_tokens();
    send_all(&server, &[signed("o-4", "ada", 2)]).await;
    drained(&database.store().await).await;

    let writes = crm.writes();
    let mut per_customer: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for write in &writes {
        per_customer.entry(&write.value).or_default().push(&write.fields["last_order"]);
    }
    assert_eq!(
        per_customer,
        std::collections::BTreeMap::from([
            ("ada", vec!["o-1", "o-4"]),
            ("grace", vec!["o-2"]),
            ("linus", vec!["o-3"]),
        ]),
        "{writes:#?}"
    );
    assert_eq!(crm.records("customers").len(), 3);
    // The expired token was refused once and a new one fetched.
    assert!(crm.lock().token_requests >= 2, "no new token after the expiry");
    let store = database.store().await;
    let filter = hookgate_store::EventFilter { limit: 100, ..Default::default() };
    let events = store.list_events(&filter).await.unwrap();
    let mut actions = Vec::new();
    for event in &events {
        assert_eq!(event.state, hookgate_store::EventState::Done, "{event:?}");
        actions.extend(
            store.attempts_for(event.id).await.unwrap().into_iter().filter_map(|a| a.action),
        );
    }
    assert!(
        actions.iter().any(|a| a == "lookup"),
        "the lost answer was not looked up: {actions:?}"
    );
    drop(server);
    database.cleanup().await;
}

/// A connector's budget is shared by every process on one store: with a budget of six calls a
/// second, one process (SQLite), then two and four `hookgate work` processes on one
/// PostgreSQL write forty versions of four customers. The fake HubSpot lets everything through
/// and counts every call in every rolling second: none ever holds more than six, and every
/// write lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_sharing_a_budget_never_exceed_the_crm_window() {
    let runs = [
        (Database::sqlite().await, 1),
        (Database::postgres().await, 2),
        (Database::postgres().await, 4),
    ];
    for (database, processes) in runs {
        let backend = format!("{} with {processes} processes", database.name());
        let hs = fake_hubspot().await;
        {
            let mut state = hs.lock();
            // The fake refuses nothing: what it counts is the budget's doing alone.
            state.max_per_window = 1_000;
            state.window_length = Duration::from_secs(1);
        }
        let dir = tempfile::tempdir().unwrap();
        let instances = crm_instances(
            dir.path(),
            &format!(
                "    kind: hubspot\n    settings: {{ base_url: \"{}\" }}\n    credentials: {{ token: {{ env: HUBSPOT_TOKEN }} }}\n    limits: {{ rate: {{ calls: 6, per: 1s }} }}\n",
                hs.base_url
            ),
        );
        let builder =
            ServerBuilder::new(database.url()).pipelines(orders_pipeline()).instances(instances);
        let intake = builder.start();
        let store = database.store().await;
        // Versions of one customer are written one after another: each is a call of its own.
        let orders: Vec<Delivery> = (1..=10)
            .flat_map(|seq| {
                ["C-1", "C-2", "C-3", "C-4"]
                    .map(|customer| order(&format!("o-{customer}-{seq}"), customer, seq, "paid"))
            })
            .collect();
        send_all(&intake, &orders).await;
        let workers: Vec<_> =
            (0..processes).map(|_| builder.clone().workers(4).start_workers()).collect();
        drained(&store).await;
        let counts = hs.call_counts();
        assert!(counts.max_in_any_window <= 6, "{backend}: {counts:?}");
        assert!(counts.admitted >= 10, "{backend}: versions of a customer are calls: {counts:?}");
        let customers = hs.records("customers");
        assert_eq!(customers.len(), 4, "{backend}");
        assert!(customers.iter().all(|c| c.properties["seq"] == "10"), "{backend}: {customers:?}");
        for mut worker in workers {
            let _ = worker.kill();
            let _ = worker.wait();
        }
        store.close().await;
        drop(intake);
        database.cleanup().await;
    }
}

/// An update-only target through a connector instance that cannot write without creating (a
/// `kind: http` whose templates do not honour `operation`) is refused when `serve` builds it:
/// its writes could create the records the target says must exist. Nothing is listened on.
#[test]
fn serve_refuses_update_only_targets_on_a_connector_that_would_create() {
    let dir = tempfile::tempdir().unwrap();
    let instances = dir.path().join("hookgate.yaml");
    let shipped = std::fs::read_to_string(root().join("hookgate.yaml")).unwrap();
    assert!(shipped.contains("        update_only: true\n"));
    std::fs::write(
        &instances,
        shipped.replace("        update_only: true\n", "        update_only: false\n"),
    )
    .unwrap();
    let pipeline = dir.path().join("inhouse-orders.yaml");
    let example =
        std::fs::read_to_string(root().join("pipelines/examples/inhouse-orders.yaml")).unwrap();
    let edited = example
        .replace("    object: customers\n", "    object: customers\n    operation: update_only\n");
    assert_ne!(edited, example);
    std::fs::write(&pipeline, edited).unwrap();
    let database = format!("sqlite://{}", dir.path().join("hookgate.db").display());
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_hookgate"))
        .args(["serve", "--listen", "127.0.0.1:0", "--database-url", &database, "--instances"])
        .arg(&instances)
        .arg(&pipeline)
        .env("INHOUSE_CRM_URL", "https://crm.example.com")
        .env("INHOUSE_TOKEN_URL", "https://crm.example.com/oauth/token")
        .env("INHOUSE_CLIENT_ID", "id")
        .env("INHOUSE_CLIENT_SECRET", "secret")
        .env("INHOUSE_ORDERS_SECRET", "s")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A serve that took the configuration would run on: it is stopped and the test fails.
    let mut child = child;
    let exited = (0..300).find_map(|_| {
        std::thread::sleep(Duration::from_millis(100));
        child.try_wait().unwrap()
    });
    if exited.is_none() {
        let _ = child.kill();
    }
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(exited.is_some_and(|status| !status.success()), "serve started: {stderr}");
    assert!(
        stderr.contains("target `customer` is `operation: update_only`, and connector instance `inhouse` (http) does not declare"),
        "{stderr}"
    );
}
