use super::*;

fn request(external_id: &str, key: &str, name: &str) -> UpsertRequest {
    UpsertRequest {
        object: "contacts".into(),
        external_id_field: "login".into(),
        external_id_value: external_id.into(),
        fields: BTreeMap::from([("name".to_owned(), name.to_owned())]),
        operation: Operation::Upsert,
        idempotency_key: key.into(),
    }
}

async fn mock(dir: &tempfile::TempDir, idempotency: bool, faults: Faults) -> MockCrm {
    let path = dir.path().join("crm.db").display().to_string();
    MockCrm::open(MockSettings { path, idempotency, faults, batch_max: 100 }).await.unwrap()
}

#[tokio::test]
async fn create_then_update_one_record_and_log_every_effect() {
    let dir = tempfile::tempdir().unwrap();
    let crm = mock(&dir, true, Faults::default()).await;
    let first = crm.upsert(&request("ada", "k1", "Ada")).await.unwrap();
    assert!(first.created);
    let second = crm.upsert(&request("ada", "k2", "Ada L.")).await.unwrap();
    assert!(!second.created);
    assert_eq!(first.record_id, second.record_id);
    let records = crm.records(Some("contacts")).await.unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].fields["name"], "Ada L.");
    assert_eq!(crm.effects().await.unwrap().len(), 2);
    let LookupOutcome::Found { fields, .. } =
        crm.lookup(&(&request("ada", "", "")).into()).await.unwrap()
    else {
        panic!("not found")
    };
    assert_eq!(fields["name"], "Ada L.");
    assert!(matches!(
        crm.lookup(&(&request("bob", "", "")).into()).await.unwrap(),
        LookupOutcome::NotFound { .. }
    ));
}

#[tokio::test]
async fn idempotency_keys_are_honoured_only_when_enabled() {
    let dir = tempfile::tempdir().unwrap();
    let crm = mock(&dir, true, Faults::default()).await;
    crm.upsert(&request("ada", "same", "Ada")).await.unwrap();
    crm.upsert(&request("ada", "same", "Ada")).await.unwrap();
    assert_eq!(crm.effects().await.unwrap().len(), 1, "a repeated key is not a new effect");
    crm.close().await;

    let dir = tempfile::tempdir().unwrap();
    let crm = mock(&dir, false, Faults::default()).await;
    crm.upsert(&request("ada", "same", "Ada")).await.unwrap();
    crm.upsert(&request("ada", "same", "Ada")).await.unwrap();
    assert_eq!(
        crm.effects().await.unwrap().len(),
        2,
        "without idempotency every write is an effect"
    );
}

#[tokio::test]
async fn faults_are_injected_as_configured() {
    let dir = tempfile::tempdir().unwrap();
    let faults = Faults { lost_response_rate: 1.0, ..Faults::default() };
    let crm = mock(&dir, false, faults).await;
    let error = crm.upsert(&request("ada", "k", "Ada")).await.unwrap_err();
    assert_eq!(error.class(), "ambiguous");
    assert_eq!(crm.effects().await.unwrap().len(), 1, "a lost response still applied the write");
    crm.close().await;

    let dir = tempfile::tempdir().unwrap();
    let faults = Faults { rate_limit_rate: 1.0, retry_after_ms: 1500, ..Faults::default() };
    let crm = mock(&dir, false, faults).await;
    let error = crm.upsert(&request("ada", "k", "Ada")).await.unwrap_err();
    assert_eq!(
        (error.class(), error.retry_after()),
        ("rate_limited", Some(Duration::from_millis(1500)))
    );
    assert_eq!(error.answer().status, Some(429));
    assert!(crm.effects().await.unwrap().is_empty());
    crm.close().await;

    let dir = tempfile::tempdir().unwrap();
    let faults = Faults {
        reject_external_ids: vec!["bad".into()],
        failure_rate: 0.5,
        seed: Some(7),
        ..Faults::default()
    };
    let crm = mock(&dir, false, faults).await;
    assert_eq!(crm.upsert(&request("bad", "k", "x")).await.unwrap_err().class(), "rejected");
    let mut failures = 0;
    for i in 0..200 {
        if crm.upsert(&request(&format!("c{i}"), &format!("k{i}"), "x")).await.is_err() {
            failures += 1;
        }
    }
    assert!((60..140).contains(&failures), "about half of 200 calls fail: {failures}");
    assert_eq!(crm.effects().await.unwrap().len(), 200 - failures, "a failed call writes nothing");
}

#[tokio::test]
async fn update_only_never_creates() {
    let dir = tempfile::tempdir().unwrap();
    let crm = mock(&dir, true, Faults::default()).await;
    let update = UpsertRequest { operation: Operation::UpdateOnly, ..request("ada", "k", "Ada") };
    assert_eq!(crm.upsert(&update).await.unwrap_err().class(), "rejected");
    assert!(crm.records(None).await.unwrap().is_empty());
}

#[tokio::test]
async fn bad_settings_are_reported() {
    let settings = BTreeMap::from([("pth".to_owned(), serde_json::json!("x.db"))]);
    let error = MockCrm::from_settings(&settings).await.unwrap_err();
    assert!(error.to_string().contains("unknown field `pth`"), "{error}");
}

#[tokio::test]
async fn first_call_faults_are_deterministic() {
    let dir = tempfile::tempdir().unwrap();
    let faults = Faults { fail_first_calls: 2, rate_limit_first_calls: 1, ..Faults::default() };
    let crm = mock(&dir, true, faults).await;
    let classes: Vec<&str> = [
        crm.upsert(&request("ada", "k", "Ada")).await.err().map(|e| e.class()),
        crm.upsert(&request("ada", "k", "Ada")).await.err().map(|e| e.class()),
        crm.upsert(&request("ada", "k", "Ada")).await.err().map(|e| e.class()),
    ]
    .iter()
    .map(|c| c.unwrap_or("ok"))
    .collect();
    assert_eq!(classes, ["rate_limited", "retryable", "ok"]);
}

#[tokio::test]
async fn a_batch_refuses_records_one_by_one_and_fails_whole_for_a_call_fault() {
    let dir = tempfile::tempdir().unwrap();
    let faults = Faults { reject_external_ids: vec!["bad".into()], ..Faults::default() };
    let crm = mock(&dir, true, faults).await;
    let missing =
        UpsertRequest { operation: Operation::UpdateOnly, ..request("nobody", "k3", "No one") };
    let batch = [request("ada", "k1", "Ada"), request("bad", "k2", "Bad"), missing];
    let outcomes = crm.upsert_batch(&batch).await;
    let classes: Vec<&str> =
        outcomes.iter().map(|o| o.as_ref().map_or_else(|e| e.class(), |_| "ok")).collect();
    assert_eq!(classes, ["ok", "rejected", "rejected"], "{outcomes:?}");
    assert_eq!(crm.effects().await.unwrap().len(), 1, "only the accepted record was written");
    crm.close().await;

    let dir = tempfile::tempdir().unwrap();
    let crm = mock(&dir, true, Faults { fail_first_calls: 1, ..Faults::default() }).await;
    let batch = [request("ada", "k1", "Ada"), request("bob", "k2", "Bob")];
    let outcomes = crm.upsert_batch(&batch).await;
    assert!(outcomes.iter().all(|o| o.as_ref().is_err_and(|e| e.class() == "retryable")));
    assert!(crm.effects().await.unwrap().is_empty(), "a 503 writes nothing of the batch");
    let outcomes = crm.upsert_batch(&batch).await;
    assert!(outcomes.iter().all(|o| o.as_ref().is_ok_and(|w| w.created)), "{outcomes:?}");
    assert_eq!(crm.effects().await.unwrap().len(), 2);
    crm.close().await;
}

/// What a mock holds after some writes: its records and its effect log, without the times.
async fn state_of(crm: &MockCrm) -> (Vec<(String, String, BTreeMap<String, String>)>, Vec<String>) {
    let records = crm
        .records(None)
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.record_id, r.external_id_value, r.fields))
        .collect();
    let effects = crm
        .effects()
        .await
        .unwrap()
        .into_iter()
        .map(|e| {
            format!(
                "{} {} {} {} {:?}",
                e.record_id, e.external_id_value, e.idempotency_key, e.created, e.fields
            )
        })
        .collect();
    (records, effects)
}

/// A batch (its bulk statements when its records and keys are distinct, record by record when
/// not) leaves the CRM as the same writes one call each would, and answers each alike.
#[tokio::test]
async fn a_batch_applies_each_record_as_a_single_call_would() {
    let updated = |id: &str, key: &str, name: &str| UpsertRequest {
        fields: BTreeMap::from([("title".to_owned(), name.to_owned())]),
        ..request(id, key, name)
    };
    let update_only = |id: &str, key: &str| UpsertRequest {
        operation: Operation::UpdateOnly,
        ..request(id, key, "U")
    };
    let batches: Vec<Vec<UpsertRequest>> = vec![
        vec![request("ada", "k1", "Ada"), request("bob", "k2", "Bob")],
        // An update merging fields, a create, a replayed key, an update of nothing.
        vec![
            updated("ada", "k3", "Dr"),
            request("cy", "k4", "Cy"),
            request("bob", "k2", "Bob again"),
            update_only("nobody", "k5"),
            update_only("cy", "k6"),
        ],
        // One record twice: the record-by-record path.
        vec![
            request("dee", "k7", "Dee"),
            updated("dee", "k8", "Ms"),
            request("ada", "k9", "Ada L."),
        ],
    ];
    for idempotency in [true, false] {
        let (one_dir, batch_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let one = mock(&one_dir, idempotency, Faults::default()).await;
        let batched = mock(&batch_dir, idempotency, Faults::default()).await;
        for batch in &batches {
            let mut alone = Vec::new();
            for request in batch {
                alone.push(one.upsert(request).await);
            }
            let together = batched.upsert_batch(batch).await;
            let describe = |outcomes: &[Result<UpsertOutcome, ConnectorError>]| -> Vec<String> {
                outcomes
                    .iter()
                    .map(|o| match o {
                        Ok(w) => format!("{} {} {:?}", w.record_id, w.created, w.answer.excerpt),
                        Err(e) => format!("{} {e}", e.class()),
                    })
                    .collect()
            };
            assert_eq!(describe(&together), describe(&alone), "idempotency {idempotency}");
        }
        assert_eq!(state_of(&batched).await, state_of(&one).await, "idempotency {idempotency}");
        assert!(!state_of(&one).await.1.is_empty());
    }
}

/// A rate limit as a CRM keeps one: writes and lookups count, the call past it is refused
/// whole with the time until the window has room, and nothing of it is applied.
#[tokio::test]
async fn a_window_refuses_the_calls_past_its_limit() {
    let dir = tempfile::tempdir().unwrap();
    let faults = Faults { window: Some(MockWindow { calls: 2, per_ms: 400 }), ..Faults::default() };
    let crm = mock(&dir, true, faults).await;
    crm.upsert(&request("ada", "k1", "Ada")).await.unwrap();
    crm.lookup(&(&request("ada", "", "")).into()).await.unwrap();
    let refused = crm.upsert(&request("bob", "k2", "Bob")).await.unwrap_err();
    assert_eq!(refused.class(), "rate_limited");
    let wait = refused.retry_after().unwrap();
    assert!(wait > Duration::ZERO && wait <= Duration::from_millis(400), "{wait:?}");
    assert_eq!(crm.refused_by_window(), 1);
    assert_eq!(crm.effects().await.unwrap().len(), 1, "nothing of the refused call applied");
    tokio::time::sleep(wait).await;
    crm.upsert(&request("bob", "k2", "Bob")).await.unwrap();
    assert_eq!(crm.effects().await.unwrap().len(), 2);
}
