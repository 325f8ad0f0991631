//! `hookgate demo`: the whole path on embedded defaults, shown.
//!
//! Starts the gateway in-process on the shipped pipelines, a SQLite store and mock CRMs (for
//! every instance, Salesforce and HubSpot included) that fail calls and lose answers after
//! applying writes (and do not honour idempotency keys),
//! then acts as the senders: a new event, a duplicate, a conflict, an out-of-order pair, a
//! forgery, a retry with a changed timestamp. It waits for delivery and prints, for every
//! event, how many CRM effects it had, and one event's whole story. It exits non-zero if any
//! write had other than exactly one effect.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use hookgate_engine::{WorkerConfig, now_ms};
use hookgate_server::ServerConfig;
use hookgate_store::{AttemptOutcome, EventFilter, ItemState, StoreOptions, WriteView};
use hookgate_verify::{Algorithm, Encoding, compute_mac};

use hookgate_fakes::stripe::{self, FakeStripe};

use crate::payloads::Views;
use crate::serve::{self, ServeOptions};
use crate::{check, connectors, events, secrets};

const GITHUB_SECRET: &str = "demo-github-secret";
const STRIPE_SECRET: &str = "whsec_demo_stripe_secret";
const STANDARD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const PARTNER_SECRET: &str = "demo-partner-secret";
/// How long the demo waits for every write to reach its final state.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug)]
pub struct DemoOptions {
    pub pipelines: PathBuf,
    /// Where the demo's database and mock CRM go; a new directory by default.
    pub dir: Option<PathBuf>,
}

struct Sent {
    pipeline: &'static str,
    what: &'static str,
    status: u16,
    answer: serde_json::Value,
}

pub async fn run(options: DemoOptions) -> Result<String> {
    let dir = match options.dir {
        Some(dir) => dir,
        None => {
            std::env::temp_dir().join(format!("hookgate-demo-{}-{}", std::process::id(), now_ms()))
        }
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    // Stripe's API, faked on loopback: the stripe pipeline fetches the customer an event
    // names before writing it, and the customer has changed its email since the event.
    let stripe_api = FakeStripe::start().await;
    stripe_api.put_customer(
        "cus_demo",
        serde_json::json!({"email": "ada.lovelace@example.com", "created": now_ms() / 1000, "livemode": false}),
    );
    let instances = dir.join("hookgate.yaml");
    std::fs::write(
        &instances,
        format!(
            // Every CRM of the shipped pipelines is a mock here, with the same faults.
            "connectors:\n{}{}{}{}source_origins:\n  https://api.stripe.com: {}\n",
            mock_instance("crm", &dir),
            mock_instance("salesforce", &dir),
            mock_instance("hubspot", &dir),
            // Payloads are sealed at rest, as production should have them.
            "payload_encryption:\n  keys:\n    - id: demo-k1\n      secret: { env: HOOKGATE_DEMO_PAYLOAD_KEY }\n",
            stripe_api.base_url,
        ),
    )?;
    let resolver = secrets::Resolver::Fixed(HashMap::from([
        ("GITHUB_WEBHOOK_SECRET".to_owned(), GITHUB_SECRET.to_owned()),
        ("STRIPE_WEBHOOK_SECRET".to_owned(), STRIPE_SECRET.to_owned()),
        ("STANDARD_WEBHOOKS_SECRET".to_owned(), STANDARD_SECRET.to_owned()),
        ("CRM_PARTNER_SECRET".to_owned(), PARTNER_SECRET.to_owned()),
        ("SHOPIFY_WEBHOOK_SECRET".to_owned(), "demo-shopify-secret".to_owned()),
        ("SIGNUPS_SECRET".to_owned(), "demo-signups-secret".to_owned()),
        ("STRIPE_API_KEY".to_owned(), stripe::SECRET_KEY.to_owned()),
        // A demo key, public like the demo's secrets: never one to keep data under.
        (
            "HOOKGATE_DEMO_PAYLOAD_KEY".to_owned(),
            "ZGVtby1vbmx5LWRlbW8tb25seS1kZW1vLW9ubHktMzI=".to_owned(),
        ),
    ]));
    let views = Views::load(&check::Options {
        paths: vec![options.pipelines.clone()],
        instances: instances.clone(),
        secrets: check::SecretPolicy::Allow,
        resolver: resolver.clone(),
    });
    let running = serve::start(ServeOptions {
        database_url: format!("sqlite://{}", dir.join("hookgate.db").display()),
        listen: Some("127.0.0.1:0".parse()?),
        pipelines: vec![options.pipelines],
        instances,
        server: ServerConfig::default(),
        store: StoreOptions::default(),
        workers: Some(WorkerConfig {
            idle_poll: Duration::from_millis(50),
            ..WorkerConfig::default()
        }),
        group_commit: Some(hookgate_engine::GroupCommitConfig {
            committers: 1,
            ..Default::default()
        }),
        resolver,
        admin: None,
        watch: false,
    })
    .await?;
    let base = format!("http://{}", running.address.context("the demo listens")?);
    let store = running.gateway.store().clone();
    let client = reqwest::Client::new();
    let mut out = String::new();
    let _ = writeln!(out, "hookgate demo in {}", dir.display());
    out.push_str(
        "  the shipped pipelines, a SQLite store, and mock CRMs (standing in for Salesforce and HubSpot\n  \
         too) that fail 30% of calls, lose 20% of answers after applying the write, and do not honour\n  \
         idempotency keys.\n\n",
    );

    let started = Instant::now();
    let mut sent = Vec::new();
    let push = |login: &str, commit: &str| {
        format!(
            r#"{{"after":"{commit}","repository":{{"full_name":"octo/repo"}},"pusher":{{"name":"{login}","email":"{login}@example.com"}},"sender":{{"login":"{login}"}}}}"#
        )
    };
    let github = |id: &str, body: &str| -> Delivery {
        let signature =
            format!("sha256={}", hex_hmac(GITHUB_SECRET.as_bytes(), &[body.as_bytes()]));
        Delivery::new("github", body)
            .header("X-GitHub-Delivery", id)
            .header("X-GitHub-Event", "push")
            .header("X-GitHub-Hook-ID", "4242")
            .header("X-Hub-Signature-256", &signature)
    };
    let first_push = push("mona", "59b20b8d");
    sent.push(github("d-1", &first_push).send(&client, &base, "a push by mona").await?);
    sent.push(github("d-1", &first_push).send(&client, &base, "the same delivery, retried").await?);
    sent.push(
        github("d-1", &push("mona", "ffffffff"))
            .send(&client, &base, "the same id with other content")
            .await?,
    );
    sent.push(
        github("d-2", &push("hubot", "0badc0de")).send(&client, &base, "a push by hubot").await?,
    );
    let forged = github("d-3", &push("mallory", "1")).header("X-Hub-Signature-256", "sha256=00");
    sent.push(forged.send(&client, &base, "a forged signature").await?);

    let t = now_ms() / 1000;
    let stripe_body = format!(
        r#"{{"id":"evt_demo_1","object":"event","created":{t},"type":"customer.created","data":{{"object":{{"id":"cus_demo","email":"ada@example.com","created":{t},"livemode":false}}}}}}"#
    );
    let signed = format!("{t}.{stripe_body}");
    let stripe = Delivery::new("stripe", &stripe_body).header(
        "Stripe-Signature",
        &format!("t={t},v1={}", hex_hmac(STRIPE_SECRET.as_bytes(), &[signed.as_bytes()])),
    );
    sent.push(stripe.send(&client, &base, "customer.created").await?);

    let standard = |attempted_at: &str| -> Result<Delivery> {
        let body = format!(
            r#"{{"type":"account.updated","attempted_at":"{attempted_at}","data":{{"account_id":"acc_42","plan":"business","seats":25}}}}"#
        );
        let key = decode_whsec(STANDARD_SECRET)?;
        let ts = t.to_string();
        let mac = compute_mac(
            Algorithm::HmacSha256,
            &key,
            &[b"msg_demo.", ts.as_bytes(), b".", body.as_bytes()],
        );
        Ok(Delivery::new("standard-webhooks", &body)
            .header("webhook-id", "msg_demo")
            .header("webhook-timestamp", &ts)
            .header("webhook-signature", &format!("v1,{}", Encoding::Base64.encode(&mac))))
    };
    sent.push(standard("12:00:00")?.send(&client, &base, "account.updated").await?);
    sent.push(standard("12:05:00")?.send(&client, &base, "its retry, restamped").await?);

    let partner = |command_time: &str, status: &str| {
        let body = format!(
            r#"{{"PracticeId":"practice-7","Command":"PatientUpdated","PatientId":"P-1001","CommandTime":"{command_time}","FirstName":"Ada","LastName":"Lovelace","Status":"{status}"}}"#
        );
        let signature =
            format!("sha256={}", hex_hmac(PARTNER_SECRET.as_bytes(), &[body.as_bytes()]));
        Delivery::new("crm-partner", &body).header("X-Hub-Signature-256", &signature)
    };
    sent.push(
        partner("2026-03-01T10:00:00Z", "active")
            .send(&client, &base, "P-1001 at 10:00 (newer)")
            .await?,
    );
    wait_drained(&store, DRAIN_TIMEOUT).await?;
    sent.push(
        partner("2026-03-01T09:00:00Z", "pending")
            .send(&client, &base, "P-1001 at 09:00, arriving late")
            .await?,
    );

    let _ = writeln!(out, "sender -> hookgate");
    for s in &sent {
        let event = s.answer.get("event_id").map(|id| format!(" (event {id})")).unwrap_or_default();
        let status = s.answer.get("status").and_then(|s| s.as_str()).unwrap_or("");
        let _ =
            writeln!(out, "  {:<18} {:<34} -> {} {status}{event}", s.pipeline, s.what, s.status);
    }

    wait_drained(&store, DRAIN_TIMEOUT).await?;
    let _ = writeln!(
        out,
        "\nevery write settled {:.1} s after the first delivery\n",
        started.elapsed().as_secs_f64()
    );

    let crm = connectors::mock(&running.instances, "crm").await?;
    let mut effects: BTreeMap<String, usize> = BTreeMap::new();
    for effect in crm.effects().await? {
        *effects.entry(effect.idempotency_key).or_default() += 1;
    }
    let _ = writeln!(out, "hookgate -> CRM: effects per write");
    let _ = writeln!(
        out,
        "  {:>5}  {:<18} {:<10} {:<13} {:<14} {:>8} {:>7}",
        "event", "pipeline", "target", "state", "outcome", "attempts", "effects"
    );
    let mut wrong = 0;
    let filter = EventFilter { limit: 1000, ..EventFilter::default() };
    let mut listed = store.list_events(&filter).await?;
    listed.reverse();
    for event in &listed {
        let items = store.outbox_for(event.id).await?;
        let attempts = store.attempts_for(event.id).await?;
        for item in items {
            let count = effects
                .get(&format!("hookgate-{}-{}", event.id, item.target))
                .copied()
                .unwrap_or(0);
            let expected = usize::from(item.state == WriteView::Item(ItemState::Done));
            if count != expected {
                wrong += 1;
            }
            let outcome = attempts
                .iter()
                .rev()
                .find(|a| a.outbox_id == item.id)
                .and_then(|a| a.outcome)
                .map_or("", AttemptOutcome::as_str);
            let _ = writeln!(
                out,
                "  {:>5}  {:<18} {:<10} {:<13} {:<14} {:>8} {:>7}{}",
                event.id,
                event.pipeline,
                item.target,
                item.state,
                outcome,
                item.attempts,
                count,
                if count == expected { "" } else { "  <- unexpected" }
            );
        }
    }
    let _ = writeln!(out, "\nCRM records:");
    for record in crm.records(None).await? {
        let _ = writeln!(
            out,
            "  {} {} {}={} {:?}",
            record.record_id,
            record.object,
            record.external_id_field,
            record.external_id_value,
            record.fields
        );
    }
    // Three stories: mona's push (a duplicate, a conflict, faults and their reconciliation),
    // the Stripe customer written as Stripe has it now, and the patient's late, older update,
    // which was never written.
    let stories = [
        listed.iter().find(|e| e.pipeline == "github"),
        listed.iter().find(|e| e.pipeline == "stripe"),
        listed.iter().rev().find(|e| e.pipeline == "crm-partner"),
    ];
    for event in stories.into_iter().flatten() {
        let _ = writeln!(
            out,
            "\nThe story of event {} (`hookgate events show {}`):",
            event.id, event.id
        );
        out.push_str(&events::story(&store, &views, event).await?);
    }
    crm.close().await;
    running.stop().await;
    if wrong > 0 {
        bail!("{out}\n{wrong} writes did not have exactly the expected effect");
    }
    let _ = writeln!(
        out,
        "\nEvery write that was done had exactly one CRM effect; stale and duplicate deliveries had none."
    );
    Ok(out)
}

fn mock_instance(name: &str, dir: &std::path::Path) -> String {
    format!(
        "  - name: {name}\n    kind: mock\n    settings:\n      path: {}\n      idempotency: false\n      faults:\n        failure_rate: 0.3\n        lost_response_rate: 0.2\n        seed: 7\n",
        dir.join(format!("{name}.sqlite")).display()
    )
}

async fn wait_drained(store: &hookgate_store::Store, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while store.unfinished_items().await? > 0 {
        if Instant::now() > deadline {
            bail!("writes still pending after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

struct Delivery {
    pipeline: &'static str,
    headers: Vec<(String, String)>,
    body: String,
}

impl Delivery {
    fn new(pipeline: &'static str, body: &str) -> Delivery {
        Delivery {
            pipeline,
            headers: vec![("Content-Type".into(), "application/json".into())],
            body: body.to_owned(),
        }
    }

    fn header(mut self, name: &str, value: &str) -> Delivery {
        self.headers.retain(|(n, _)| n != name);
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    async fn send(self, client: &reqwest::Client, base: &str, what: &'static str) -> Result<Sent> {
        let mut request = client.post(format!("{base}/hooks/{}", self.pipeline)).body(self.body);
        for (name, value) in &self.headers {
            request = request.header(name, value);
        }
        let response = request.send().await?;
        let status = response.status().as_u16();
        let answer = response.json().await.unwrap_or(serde_json::Value::Null);
        Ok(Sent { pipeline: self.pipeline, what, status, answer })
    }
}

fn hex_hmac(key: &[u8], parts: &[&[u8]]) -> String {
    Encoding::Hex.encode(&compute_mac(Algorithm::HmacSha256, key, parts))
}

fn decode_whsec(secret: &str) -> Result<Vec<u8>> {
    use base64::Engine as _;
    let body = secret.trim_start_matches("whsec_");
    Ok(base64::engine::general_purpose::STANDARD.decode(body)?)
}
