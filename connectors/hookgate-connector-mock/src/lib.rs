//! The mock CRM: a real, stateful CRM stand-in for the demo, the tests and chaos runs.
//!
//! Records live by (object, external-id field, value) in the mock's **own** SQLite file, never
//! in the gateway's database or transactions: a real CRM is a separate system. Every write it
//! applies is appended to an **effect log** with its idempotency key, so a test can count
//! effects per event. Idempotency keys are honoured only when the instance enables it, so the
//! engine's own guarantees can be tested without that help. **Faults** are set in the instance
//! settings: failure rate, latency, lost responses (the write is applied, then the call times
//! out), 429 with retry-after, and permanent rejection of chosen external ids. A `seed` makes
//! the faults repeatable.
//!
//! Several processes may share one mock file: every write runs in `BEGIN IMMEDIATE`.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::Mutex;
use std::time::Duration;

use hookgate_connector::{
    Answer, BoxFuture, Capabilities, ConfigError, Connector, ConnectorError, Credentials,
    Description, KindDescription, LookupOutcome, LookupRequest, Operation, UpsertOutcome,
    UpsertRequest,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{ConnectOptions, Row};

/// Instance settings of `kind: mock`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MockSettings {
    /// The mock CRM's SQLite file (created if missing).
    pub path: String,
    /// Apply a repeated idempotency key once (like a CRM that supports them).
    #[serde(default = "yes")]
    pub idempotency: bool,
    #[serde(default)]
    pub faults: Faults,
    /// Writes one batch call takes at most, applied in one transaction; 1: no batch call.
    #[serde(default = "default_batch_max")]
    pub batch_max: usize,
}

fn yes() -> bool {
    true
}

fn default_batch_max() -> usize {
    100
}

/// Injected faults; rates are fractions from 0 to 1, drawn per call.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Faults {
    /// Calls that fail before any write, as a 503 would.
    #[serde(default)]
    pub failure_rate: f64,
    /// Calls answered 429 before any write.
    #[serde(default)]
    pub rate_limit_rate: f64,
    /// The retry-after of a 429, in milliseconds.
    #[serde(default = "default_retry_after_ms")]
    pub retry_after_ms: u64,
    /// Writes applied, then answered with a timeout: the response is lost.
    #[serde(default)]
    pub lost_response_rate: f64,
    /// Added to every call, before anything is written.
    #[serde(default)]
    pub latency_ms: u64,
    /// Added after a write is applied, before it is answered: a worker killed in this window
    /// leaves a write applied and unanswered.
    #[serde(default)]
    pub latency_after_write_ms: u64,
    /// The first this-many write calls of this process fail before writing, as a 503 would:
    /// deterministic retries for tests.
    #[serde(default)]
    pub fail_first_calls: u64,
    /// The first this-many write calls of this process are answered 429 with `retry_after_ms`.
    #[serde(default)]
    pub rate_limit_first_calls: u64,
    /// Calls rejected as invalid before any write, as a validation rule would.
    #[serde(default)]
    pub reject_rate: f64,
    /// Calls refused for bad credentials before any write (a 401 that no refresh fixes).
    #[serde(default)]
    pub misconfigured_rate: f64,
    /// External id values that are always rejected, as a validation rule would.
    #[serde(default)]
    pub reject_external_ids: Vec<String>,
    /// Seeds the fault dice, for repeatable runs.
    #[serde(default)]
    pub seed: Option<u64>,
    /// A rate limit as a CRM enforces one: a call beyond `calls` in any rolling `per_ms` is
    /// answered 429, with the time until the oldest call leaves the window as its
    /// retry-after. Writes, batches and lookups all count; counted per gateway process (the
    /// mock is in the process). Declare the same in `limits.rate` to stay within it.
    #[serde(default)]
    pub window: Option<MockWindow>,
}

/// A rolling window of calls.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MockWindow {
    pub calls: u32,
    pub per_ms: u64,
}

fn default_retry_after_ms() -> u64 {
    1000
}

#[derive(Debug, thiserror::Error)]
pub enum MockError {
    #[error("invalid mock settings: {0}")]
    Settings(String),
    #[error("mock CRM database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("mock CRM database: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

/// A record as the mock CRM holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MockRecord {
    pub record_id: String,
    pub object: String,
    pub external_id_field: String,
    pub external_id_value: String,
    pub fields: BTreeMap<String, String>,
    pub updated_at_ms: i64,
}

/// One applied write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Effect {
    pub id: i64,
    pub record_id: String,
    pub object: String,
    pub external_id_value: String,
    pub idempotency_key: String,
    pub created: bool,
    pub fields: BTreeMap<String, String>,
    pub applied_at_ms: i64,
}

#[derive(Debug)]
pub struct MockCrm {
    pool: SqlitePool,
    settings: MockSettings,
    dice: Mutex<StdRng>,
    /// Write calls so far, for the `*_first_calls` faults.
    calls: std::sync::atomic::AtomicU64,
    /// When each call of the window (`faults.window`) arrived, oldest first.
    window: Mutex<std::collections::VecDeque<std::time::Instant>>,
    /// Calls the window refused, for tests.
    refused: std::sync::atomic::AtomicU64,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS records (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    object TEXT NOT NULL,
    external_id_field TEXT NOT NULL,
    external_id_value TEXT NOT NULL,
    fields TEXT NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    UNIQUE (object, external_id_field, external_id_value)
);
CREATE TABLE IF NOT EXISTS effects (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    record_id TEXT NOT NULL,
    object TEXT NOT NULL,
    external_id_value TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    created INTEGER NOT NULL,
    fields TEXT NOT NULL,
    applied_at_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS idempotency_keys (
    idempotency_key TEXT PRIMARY KEY,
    record_id TEXT NOT NULL
);
";

impl MockCrm {
    /// Opens (or creates) the mock CRM described by instance settings.
    pub async fn from_settings(
        settings: &BTreeMap<String, serde_json::Value>,
    ) -> Result<MockCrm, MockError> {
        let object = serde_json::Value::Object(settings.clone().into_iter().collect());
        let settings: MockSettings =
            serde_json::from_value(object).map_err(|e| MockError::Settings(e.to_string()))?;
        MockCrm::open(settings).await
    }

    pub async fn open(settings: MockSettings) -> Result<MockCrm, MockError> {
        for (name, rate) in [
            ("failure_rate", settings.faults.failure_rate),
            ("rate_limit_rate", settings.faults.rate_limit_rate),
            ("lost_response_rate", settings.faults.lost_response_rate),
            ("reject_rate", settings.faults.reject_rate),
            ("misconfigured_rate", settings.faults.misconfigured_rate),
        ] {
            if !(0.0..=1.0).contains(&rate) {
                return Err(MockError::Settings(format!(
                    "faults.{name} must be between 0 and 1, not {rate}"
                )));
            }
        }
        let options = SqliteConnectOptions::from_str(&format!("sqlite://{}", settings.path))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // A stand-in CRM must keep what it applied when a process sharing it is killed,
            // which WAL does at NORMAL (the commit is in the log, in the OS's hands), not through
            // a power loss: no sync at every commit.
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(30))
            .disable_statement_logging();
        let pool = SqlitePoolOptions::new().max_connections(2).connect_with(options).await?;
        sqlx::raw_sql(SCHEMA).execute(&pool).await?;
        let dice = match settings.faults.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_os_rng(),
        };
        Ok(MockCrm {
            pool,
            settings,
            dice: Mutex::new(dice),
            calls: std::sync::atomic::AtomicU64::new(0),
            window: Mutex::new(std::collections::VecDeque::new()),
            refused: std::sync::atomic::AtomicU64::new(0),
        })
    }

    fn roll(&self, rate: f64) -> bool {
        rate > 0.0
            && self.dice.lock().expect("the dice lock is never poisoned").random::<f64>() < rate
    }

    async fn latency(&self) {
        if self.settings.faults.latency_ms > 0 {
            tokio::time::sleep(Duration::from_millis(self.settings.faults.latency_ms)).await;
        }
    }

    /// The rate limit, before anything else: a call over it is refused whole.
    fn window_faults(&self) -> Result<(), ConnectorError> {
        let Some(limit) = self.settings.faults.window else { return Ok(()) };
        let per = Duration::from_millis(limit.per_ms);
        let now = std::time::Instant::now();
        let mut window = self.window.lock().expect("the window lock is never poisoned");
        while window.front().is_some_and(|at| now.duration_since(*at) >= per) {
            window.pop_front();
        }
        if window.len() >= limit.calls as usize {
            let oldest = window.front().copied().unwrap_or(now);
            let retry_after = per.saturating_sub(now.duration_since(oldest));
            drop(window);
            self.refused.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            return Err(ConnectorError::RateLimited {
                message: format!("more than {} calls in {} ms", limit.calls, limit.per_ms),
                retry_after: Some(retry_after),
                answer: Answer::with_excerpt(Some(429), r#"{"error":"REQUEST_LIMIT_EXCEEDED"}"#),
            });
        }
        window.push_back(now);
        Ok(())
    }

    /// Calls the rate limit (`faults.window`) refused so far in this process.
    pub fn refused_by_window(&self) -> u64 {
        self.refused.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Faults that strike before anything is written.
    /// A single write meets them in the order a CRM checks: credentials, validation, load.
    fn faults_before_write(&self, external_id: &str) -> Result<(), ConnectorError> {
        self.window_faults()?;
        let call = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.credential_faults()?;
        self.record_faults(external_id)?;
        self.load_faults(call)
    }

    /// Faults of a whole batch call, before anything is written.
    fn call_faults(&self) -> Result<(), ConnectorError> {
        self.window_faults()?;
        let call = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.credential_faults()?;
        self.load_faults(call)
    }

    fn credential_faults(&self) -> Result<(), ConnectorError> {
        if self.roll(self.settings.faults.misconfigured_rate) {
            return Err(ConnectorError::Misconfigured {
                message: "invalid credentials".into(),
                answer: Answer::with_excerpt(Some(401), r#"{"error":"INVALID_SESSION_ID"}"#),
            });
        }
        Ok(())
    }

    /// A 429 or a 503: the `call`-th write call of this process.
    fn load_faults(&self, call: u64) -> Result<(), ConnectorError> {
        let faults = &self.settings.faults;
        if call < faults.rate_limit_first_calls || self.roll(faults.rate_limit_rate) {
            let retry_after = Duration::from_millis(faults.retry_after_ms);
            return Err(ConnectorError::RateLimited {
                message: "too many requests".into(),
                retry_after: Some(retry_after),
                answer: Answer::with_excerpt(Some(429), r#"{"error":"RATE_LIMITED"}"#),
            });
        }
        if call < faults.fail_first_calls || self.roll(faults.failure_rate) {
            return Err(ConnectorError::Retryable {
                message: "service unavailable".into(),
                retry_after: None,
                answer: Answer::with_excerpt(Some(503), r#"{"error":"SERVER_UNAVAILABLE"}"#),
            });
        }
        Ok(())
    }

    /// Faults of one record: a validation rule.
    fn record_faults(&self, external_id: &str) -> Result<(), ConnectorError> {
        let faults = &self.settings.faults;
        if faults.reject_external_ids.iter().any(|id| id == external_id)
            || self.roll(faults.reject_rate)
        {
            return Err(ConnectorError::Rejected {
                message: format!("validation rule: external id `{external_id}` is not accepted"),
                answer: Answer::with_excerpt(
                    Some(400),
                    r#"{"error":"FIELD_CUSTOM_VALIDATION_EXCEPTION"}"#,
                ),
            });
        }
        Ok(())
    }

    async fn apply(&self, request: &UpsertRequest) -> Result<UpsertOutcome, sqlx::Error> {
        let mut connection = self.pool.acquire().await?;
        // IMMEDIATE takes the write lock first, so concurrent writers from several processes
        // queue on the busy timeout instead of failing to upgrade a read lock.
        sqlx::query("BEGIN IMMEDIATE").execute(&mut *connection).await?;
        let result = self.apply_in_transaction(&mut connection, request).await;
        let end = if result.is_ok() { "COMMIT" } else { "ROLLBACK" };
        sqlx::query(end).execute(&mut *connection).await?;
        result
    }

    /// Applies a batch in one transaction: each record as [`MockCrm::apply`] would, except
    /// that a record refused (a validation rule, an update of a missing record) is that
    /// record's outcome and the others go on.
    ///
    /// A batch of distinct records and idempotency keys (what the engine sends) costs a few
    /// statements whatever its size, each reading or writing every record at once, like a
    /// CRM's own bulk path; any other batch is applied record by record, in its order.
    async fn apply_batch(
        &self,
        requests: &[UpsertRequest],
    ) -> Result<Vec<Result<UpsertOutcome, ConnectorError>>, sqlx::Error> {
        let mut outcomes: Vec<Option<Result<UpsertOutcome, ConnectorError>>> = requests
            .iter()
            .map(|request| self.record_faults(&request.external_id_value).err().map(Err))
            .collect();
        let accepted: Vec<&UpsertRequest> = requests
            .iter()
            .zip(&outcomes)
            .filter(|(_, outcome)| outcome.is_none())
            .map(|(request, _)| request)
            .collect();
        let mut connection = self.pool.acquire().await?;
        sqlx::query("BEGIN IMMEDIATE").execute(&mut *connection).await?;
        let applied = if distinct(&accepted) {
            self.apply_distinct(&mut connection, &accepted).await
        } else {
            let mut applied = Vec::with_capacity(accepted.len());
            for request in &accepted {
                match self.apply_in_transaction(&mut connection, request).await {
                    Ok(outcome) => applied.push(Ok(outcome)),
                    Err(sqlx::Error::RowNotFound) => applied.push(Err(nothing_to_update(request))),
                    Err(error) => {
                        sqlx::query("ROLLBACK").execute(&mut *connection).await?;
                        return Err(error);
                    }
                }
            }
            Ok(applied)
        };
        let applied = match applied {
            Ok(applied) => applied,
            Err(error) => {
                sqlx::query("ROLLBACK").execute(&mut *connection).await?;
                return Err(error);
            }
        };
        sqlx::query("COMMIT").execute(&mut *connection).await?;
        let mut applied = applied.into_iter();
        Ok(outcomes
            .iter_mut()
            .map(|outcome| match outcome.take() {
                Some(refused) => refused,
                None => applied
                    .next()
                    .unwrap_or_else(|| Err(storage_failure(&sqlx::Error::RowNotFound))),
            })
            .collect())
    }

    /// [`MockCrm::apply_in_transaction`] for records that are distinct, and whose idempotency
    /// keys are: every step is one statement over the whole batch, in the transaction held.
    async fn apply_distinct(
        &self,
        connection: &mut sqlx::SqliteConnection,
        requests: &[&UpsertRequest],
    ) -> Result<Vec<Result<UpsertOutcome, ConnectorError>>, sqlx::Error> {
        let now = now_ms();
        let record_key = |r: &UpsertRequest| {
            (r.object.clone(), r.external_id_field.clone(), r.external_id_value.clone())
        };
        let keys_json = serde_json::Value::Array(
            requests
                .iter()
                .map(|r| {
                    serde_json::json!({
                        "o": r.object, "f": r.external_id_field, "v": r.external_id_value,
                        "k": r.idempotency_key,
                    })
                })
                .collect(),
        )
        .to_string();
        let mut replayed: std::collections::HashMap<String, String> =
            std::collections::HashMap::new();
        if self.settings.idempotency {
            let rows = sqlx::query(
                "SELECT i.idempotency_key, i.record_id FROM json_each(?1) AS j \
                 JOIN idempotency_keys i ON i.idempotency_key = json_extract(j.value, '$.k')",
            )
            .bind(&keys_json)
            .fetch_all(&mut *connection)
            .await?;
            for row in rows {
                replayed.insert(row.try_get(0)?, row.try_get(1)?);
            }
        }
        let mut existing: std::collections::HashMap<(String, String, String), (i64, String)> =
            std::collections::HashMap::new();
        for row in sqlx::query(
            "SELECT r.object, r.external_id_field, r.external_id_value, r.id, r.fields \
             FROM json_each(?1) AS j JOIN records r ON r.object = json_extract(j.value, '$.o') \
               AND r.external_id_field = json_extract(j.value, '$.f') \
               AND r.external_id_value = json_extract(j.value, '$.v')",
        )
        .bind(&keys_json)
        .fetch_all(&mut *connection)
        .await?
        {
            let key = (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
            existing.insert(key, (row.try_get(3)?, row.try_get(4)?));
        }

        // What each request does, decided as `apply_in_transaction` would.
        enum Step {
            Replayed(String),
            Update { id: i64, fields: String },
            Create,
            Missing,
        }
        let steps: Vec<Step> = requests
            .iter()
            .map(|r| {
                if let Some(record_id) = replayed.get(&r.idempotency_key) {
                    return Step::Replayed(record_id.clone());
                }
                match existing.get(&record_key(r)) {
                    Some((id, fields)) => {
                        let mut fields: BTreeMap<String, String> =
                            serde_json::from_str(fields).unwrap_or_default();
                        fields.extend(r.fields.clone());
                        Step::Update { id: *id, fields: to_json(&fields) }
                    }
                    None if r.operation == Operation::UpdateOnly => Step::Missing,
                    None => Step::Create,
                }
            })
            .collect();

        let creates: Vec<serde_json::Value> = requests
            .iter()
            .zip(&steps)
            .filter(|(_, step)| matches!(step, Step::Create))
            .map(|(r, _)| {
                serde_json::json!({
                    "o": r.object, "f": r.external_id_field, "v": r.external_id_value,
                    "fields": to_json(&r.fields),
                })
            })
            .collect();
        let mut created: std::collections::HashMap<(String, String, String), i64> =
            std::collections::HashMap::new();
        if !creates.is_empty() {
            for row in sqlx::query(
                "INSERT INTO records (object, external_id_field, external_id_value, fields, updated_at_ms) \
                 SELECT json_extract(value, '$.o'), json_extract(value, '$.f'), json_extract(value, '$.v'), \
                   json_extract(value, '$.fields'), ?2 FROM json_each(?1) WHERE true \
                 RETURNING object, external_id_field, external_id_value, id",
            )
            .bind(serde_json::Value::Array(creates).to_string())
            .bind(now)
            .fetch_all(&mut *connection)
            .await?
            {
                created.insert((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?), row.try_get(3)?);
            }
        }
        let updates: Vec<serde_json::Value> = steps
            .iter()
            .filter_map(|step| match step {
                Step::Update { id, fields } => {
                    Some(serde_json::json!({ "id": id, "fields": fields }))
                }
                _ => None,
            })
            .collect();
        if !updates.is_empty() {
            sqlx::query(
                "UPDATE records SET fields = json_extract(j.value, '$.fields'), updated_at_ms = ?2 \
                 FROM json_each(?1) AS j WHERE records.id = json_extract(j.value, '$.id')",
            )
            .bind(serde_json::Value::Array(updates).to_string())
            .bind(now)
            .execute(&mut *connection)
            .await?;
        }

        let mut outcomes = Vec::with_capacity(requests.len());
        let mut effects = Vec::new();
        for (r, step) in requests.iter().zip(&steps) {
            let (id, was_created) = match step {
                Step::Replayed(record_id) => {
                    let answer = Answer::with_excerpt(Some(200), r#"{"replayed":true}"#);
                    outcomes.push(Ok(UpsertOutcome {
                        record_id: record_id.clone(),
                        created: false,
                        answer,
                    }));
                    continue;
                }
                Step::Missing => {
                    outcomes.push(Err(nothing_to_update(r)));
                    continue;
                }
                Step::Update { id, .. } => (*id, false),
                Step::Create => match created.get(&record_key(r)) {
                    Some(id) => (*id, true),
                    None => return Err(sqlx::Error::RowNotFound),
                },
            };
            let record_id = record_id(id);
            effects.push(serde_json::json!({
                "r": record_id, "o": r.object, "v": r.external_id_value, "k": r.idempotency_key,
                "c": was_created, "fields": to_json(&r.fields),
            }));
            let status = if was_created { 201 } else { 200 };
            let body = format!(r#"{{"id":"{record_id}","created":{was_created}}}"#);
            let answer = Answer::with_excerpt(Some(status), &body);
            outcomes.push(Ok(UpsertOutcome { record_id, created: was_created, answer }));
        }
        if !effects.is_empty() {
            let effects = serde_json::Value::Array(effects).to_string();
            sqlx::query(
                "INSERT INTO effects (record_id, object, external_id_value, idempotency_key, created, fields, applied_at_ms) \
                 SELECT json_extract(value, '$.r'), json_extract(value, '$.o'), json_extract(value, '$.v'), \
                   json_extract(value, '$.k'), json_extract(value, '$.c'), json_extract(value, '$.fields'), ?2 \
                 FROM json_each(?1) ORDER BY key",
            )
            .bind(&effects)
            .bind(now)
            .execute(&mut *connection)
            .await?;
            if self.settings.idempotency {
                sqlx::query(
                    "INSERT INTO idempotency_keys (idempotency_key, record_id) \
                     SELECT json_extract(value, '$.k'), json_extract(value, '$.r') FROM json_each(?1)",
                )
                .bind(&effects)
                .execute(&mut *connection)
                .await?;
            }
        }
        Ok(outcomes)
    }

    async fn apply_in_transaction(
        &self,
        connection: &mut sqlx::SqliteConnection,
        request: &UpsertRequest,
    ) -> Result<UpsertOutcome, sqlx::Error> {
        let now = now_ms();
        if self.settings.idempotency {
            let seen: Option<String> = sqlx::query_scalar(
                "SELECT record_id FROM idempotency_keys WHERE idempotency_key = ?1",
            )
            .bind(&request.idempotency_key)
            .fetch_optional(&mut *connection)
            .await?;
            if let Some(record_id) = seen {
                let answer = Answer::with_excerpt(Some(200), r#"{"replayed":true}"#);
                return Ok(UpsertOutcome { record_id, created: false, answer });
            }
        }
        let existing = sqlx::query(
            "SELECT id, fields FROM records WHERE object = ?1 AND external_id_field = ?2 AND external_id_value = ?3",
        )
        .bind(&request.object)
        .bind(&request.external_id_field)
        .bind(&request.external_id_value)
        .fetch_optional(&mut *connection)
        .await?;
        let (record_id, created) = match existing {
            Some(row) => {
                let id: i64 = row.try_get("id")?;
                let mut fields: BTreeMap<String, String> =
                    serde_json::from_str(&row.try_get::<String, _>("fields")?).unwrap_or_default();
                fields.extend(request.fields.clone());
                sqlx::query("UPDATE records SET fields = ?1, updated_at_ms = ?2 WHERE id = ?3")
                    .bind(to_json(&fields))
                    .bind(now)
                    .bind(id)
                    .execute(&mut *connection)
                    .await?;
                (record_id(id), false)
            }
            None if request.operation == Operation::UpdateOnly => {
                return Err(sqlx::Error::RowNotFound);
            }
            None => {
                let id: i64 = sqlx::query_scalar(
                    "INSERT INTO records (object, external_id_field, external_id_value, fields, updated_at_ms) \
                     VALUES (?1, ?2, ?3, ?4, ?5) RETURNING id",
                )
                .bind(&request.object)
                .bind(&request.external_id_field)
                .bind(&request.external_id_value)
                .bind(to_json(&request.fields))
                .bind(now)
                .fetch_one(&mut *connection)
                .await?;
                (record_id(id), true)
            }
        };
        sqlx::query(
            "INSERT INTO effects (record_id, object, external_id_value, idempotency_key, created, fields, applied_at_ms) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )
        .bind(&record_id)
        .bind(&request.object)
        .bind(&request.external_id_value)
        .bind(&request.idempotency_key)
        .bind(created)
        .bind(to_json(&request.fields))
        .bind(now)
        .execute(&mut *connection)
        .await?;
        if self.settings.idempotency {
            sqlx::query(
                "INSERT INTO idempotency_keys (idempotency_key, record_id) VALUES (?1, ?2)",
            )
            .bind(&request.idempotency_key)
            .bind(&record_id)
            .execute(&mut *connection)
            .await?;
        }
        let status = if created { 201 } else { 200 };
        let body = format!(r#"{{"id":"{record_id}","created":{created}}}"#);
        Ok(UpsertOutcome { record_id, created, answer: Answer::with_excerpt(Some(status), &body) })
    }

    /// Every record of an object, by external id.
    pub async fn records(&self, object: Option<&str>) -> Result<Vec<MockRecord>, MockError> {
        let rows = sqlx::query(
            "SELECT id, object, external_id_field, external_id_value, fields, updated_at_ms FROM records \
             WHERE ?1 IS NULL OR object = ?1 ORDER BY object, external_id_value",
        )
        .bind(object)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(MockRecord {
                    record_id: record_id(row.try_get("id")?),
                    object: row.try_get("object")?,
                    external_id_field: row.try_get("external_id_field")?,
                    external_id_value: row.try_get("external_id_value")?,
                    fields: serde_json::from_str(&row.try_get::<String, _>("fields")?)
                        .unwrap_or_default(),
                    updated_at_ms: row.try_get("updated_at_ms")?,
                })
            })
            .collect()
    }

    /// The effect log, in the order writes were applied.
    pub async fn effects(&self) -> Result<Vec<Effect>, MockError> {
        let rows = sqlx::query(
            "SELECT id, record_id, object, external_id_value, idempotency_key, created, fields, applied_at_ms \
             FROM effects ORDER BY id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(Effect {
                    id: row.try_get("id")?,
                    record_id: row.try_get("record_id")?,
                    object: row.try_get("object")?,
                    external_id_value: row.try_get("external_id_value")?,
                    idempotency_key: row.try_get("idempotency_key")?,
                    created: row.try_get("created")?,
                    fields: serde_json::from_str(&row.try_get::<String, _>("fields")?)
                        .unwrap_or_default(),
                    applied_at_ms: row.try_get("applied_at_ms")?,
                })
            })
            .collect()
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }
}

fn record_id(id: i64) -> String {
    format!("MOCK-{id:08}")
}

fn to_json(fields: &BTreeMap<String, String>) -> String {
    serde_json::to_string(fields).expect("string maps serialise")
}

fn now_ms() -> i64 {
    let since =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

/// No record and no idempotency key twice: what [`MockCrm::apply_distinct`] takes.
fn distinct(requests: &[&UpsertRequest]) -> bool {
    let mut records = std::collections::HashSet::new();
    let mut keys = std::collections::HashSet::new();
    requests.iter().all(|r| {
        records.insert((&r.object, &r.external_id_field, &r.external_id_value))
            && keys.insert(&r.idempotency_key)
    })
}

fn nothing_to_update(request: &UpsertRequest) -> ConnectorError {
    ConnectorError::Rejected {
        message: format!(
            "no {} with {} = {} to update",
            request.object, request.external_id_field, request.external_id_value
        ),
        answer: Answer::with_excerpt(Some(404), r#"{"error":"NOT_FOUND"}"#),
    }
}

fn storage_failure(error: &sqlx::Error) -> ConnectorError {
    ConnectorError::Retryable {
        message: format!("mock CRM storage: {error}"),
        retry_after: None,
        answer: Answer::with_excerpt(Some(500), "storage error"),
    }
}

impl Connector for MockCrm {
    fn describe(&self) -> Description {
        Description {
            kind: "mock".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            capabilities: Capabilities {
                update_only: true,
                idempotency_keys: self.settings.idempotency,
            },
            settings_schema: serde_json::to_value(schemars::schema_for!(MockSettings))
                .unwrap_or_default(),
        }
    }

    fn upsert<'a>(
        &'a self,
        request: &'a UpsertRequest,
    ) -> BoxFuture<'a, Result<UpsertOutcome, ConnectorError>> {
        Box::pin(async move {
            self.latency().await;
            self.faults_before_write(&request.external_id_value)?;
            let outcome = match self.apply(request).await {
                Ok(outcome) => outcome,
                Err(sqlx::Error::RowNotFound) => return Err(nothing_to_update(request)),
                Err(error) => return Err(storage_failure(&error)),
            };
            if self.settings.faults.latency_after_write_ms > 0 {
                tokio::time::sleep(Duration::from_millis(
                    self.settings.faults.latency_after_write_ms,
                ))
                .await;
            }
            if self.roll(self.settings.faults.lost_response_rate) {
                return Err(ConnectorError::Ambiguous {
                    message: "timed out waiting for the answer (the write was applied)".into(),
                    answer: Answer::default(),
                });
            }
            Ok(outcome)
        })
    }

    fn batch_max(&self) -> usize {
        self.settings.batch_max.max(1)
    }

    /// One transaction for the whole batch; faults of a call strike the whole batch, a
    /// validation rule (or an update of a missing record) only its record.
    fn upsert_batch<'a>(
        &'a self,
        requests: &'a [UpsertRequest],
    ) -> BoxFuture<'a, Vec<Result<UpsertOutcome, ConnectorError>>> {
        Box::pin(async move {
            let every =
                |error: ConnectorError| requests.iter().map(|_| Err(error.clone())).collect();
            self.latency().await;
            if let Err(error) = self.call_faults() {
                return every(error);
            }
            let outcomes = match self.apply_batch(requests).await {
                Ok(outcomes) => outcomes,
                Err(error) => return every(storage_failure(&error)),
            };
            if self.settings.faults.latency_after_write_ms > 0 {
                tokio::time::sleep(Duration::from_millis(
                    self.settings.faults.latency_after_write_ms,
                ))
                .await;
            }
            if self.roll(self.settings.faults.lost_response_rate) {
                return every(ConnectorError::Ambiguous {
                    message: "timed out waiting for the answer (the batch was applied)".into(),
                    answer: Answer::default(),
                });
            }
            outcomes
        })
    }

    fn lookup<'a>(
        &'a self,
        request: &'a LookupRequest,
    ) -> BoxFuture<'a, Result<LookupOutcome, ConnectorError>> {
        Box::pin(async move {
            self.latency().await;
            self.window_faults()?;
            if self.roll(self.settings.faults.failure_rate) {
                return Err(ConnectorError::Retryable {
                    message: "service unavailable".into(),
                    retry_after: None,
                    answer: Answer::with_excerpt(Some(503), r#"{"error":"SERVER_UNAVAILABLE"}"#),
                });
            }
            let row = sqlx::query(
                "SELECT id, fields FROM records WHERE object = ?1 AND external_id_field = ?2 AND external_id_value = ?3",
            )
            .bind(&request.object)
            .bind(&request.external_id_field)
            .bind(&request.external_id_value)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| storage_failure(&e))?;
            Ok(match row {
                Some(row) => {
                    let id: i64 = row.try_get("id").map_err(|e| storage_failure(&e))?;
                    let fields_json: String =
                        row.try_get("fields").map_err(|e| storage_failure(&e))?;
                    LookupOutcome::Found {
                        record_id: record_id(id),
                        fields: serde_json::from_str(&fields_json).unwrap_or_default(),
                        answer: Answer::with_excerpt(Some(200), &fields_json),
                    }
                }
                None => LookupOutcome::NotFound {
                    answer: Answer::with_excerpt(Some(404), r#"{"error":"NOT_FOUND"}"#),
                },
            })
        })
    }

    fn healthcheck(&self) -> BoxFuture<'_, Result<(), ConnectorError>> {
        Box::pin(async move {
            sqlx::query("SELECT 1")
                .execute(&self.pool)
                .await
                .map(|_| ())
                .map_err(|e| storage_failure(&e))
        })
    }
}

impl hookgate_connector::Kind for MockCrm {
    type Settings = MockSettings;

    fn about() -> KindDescription {
        KindDescription {
            kind: "mock".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            settings_schema: serde_json::Value::Null,
            credentials: Vec::new(),
            rules: Vec::new(),
            limits: Default::default(),
            file_settings: vec!["path".into()],
        }
    }

    fn create(
        settings: &BTreeMap<String, serde_json::Value>,
        _credentials: &Credentials,
    ) -> BoxFuture<'static, Result<MockCrm, ConfigError>> {
        let settings = settings.clone();
        Box::pin(async move {
            MockCrm::from_settings(&settings).await.map_err(|e| ConfigError(e.to_string()))
        })
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod conformance {
    use std::sync::Arc;

    use hookgate_connector::conformance::{self, Fault, Harness};
    use hookgate_connector::{BoxFuture, Connector};

    use super::*;

    struct MockHarness {
        dir: tempfile::TempDir,
    }

    impl Harness for MockHarness {
        fn connector(&self, fault: Option<Fault>) -> BoxFuture<'_, Arc<dyn Connector>> {
            Box::pin(async move {
                let mut faults = Faults::default();
                match fault {
                    None => {}
                    Some(Fault::Unavailable) => faults.failure_rate = 1.0,
                    Some(Fault::RateLimited) => faults.rate_limit_rate = 1.0,
                    Some(Fault::Invalid) => faults.reject_rate = 1.0,
                    Some(Fault::LostResponse) => faults.lost_response_rate = 1.0,
                    Some(Fault::BadCredentials) => faults.misconfigured_rate = 1.0,
                }
                let path = self.dir.path().join("crm.db").display().to_string();
                let mock =
                    MockCrm::open(MockSettings { path, idempotency: true, faults, batch_max: 100 })
                        .await
                        .unwrap();
                Arc::new(mock) as Arc<dyn Connector>
            })
        }

        fn object(&self) -> (&str, &str) {
            ("contacts", "external_id")
        }

        fn field(&self) -> &str {
            "name"
        }
    }

    #[tokio::test]
    async fn the_mock_passes_the_conformance_suite() {
        conformance::run(&MockHarness { dir: tempfile::tempdir().unwrap() }).await;
    }
}
