//! The only crate that speaks SQL.
//!
//! Two backends behave identically: SQLite (a file, WAL, `synchronous=FULL`), the embedded
//! default, and PostgreSQL, for production and for several gateway processes sharing one
//! database. Migrations are embedded and applied on connect.
//!
//! # Layout
//! - [`Store`]: the connection pools and every query. Each query is written once where both
//!   dialects agree; the `on_both!` macro expands one body for each backend's pool type.
//! - Records ([`EventRecord`], [`OutboxRecord`], [`DeliveryRecord`]) are plain data returned
//!   to callers; the engine gives them meaning.
//!
//! # Invariants
//! - An event is inserted together with its outbox items in one transaction; a caller told
//!   [`IntakeRecord::Accepted`] knows both are committed.
//! - Deduplication is the `UNIQUE (pipeline, scope, event_key)` constraint, never a read
//!   followed by a write.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{ConnectOptions, Row};

static SQLITE_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");
static POSTGRES_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be reached or is saturated now; the same call may succeed later.
    /// Intake answers 503 with Retry-After.
    // The cause is in the message, not also a `source`: sqlx's errors repeat their own cause,
    // and a chain printed with `{:#}` would say everything three times.
    #[error("database unavailable: {0}")]
    Unavailable(sqlx::Error),
    /// The gateway cannot take the work to the database now (its intake queue is full, or no
    /// commit came in time): unavailable too, so intake answers 503 with Retry-After.
    #[error("database unavailable: {0}")]
    Busy(String),
    #[error("database error: {0}")]
    Database(sqlx::Error),
    #[error("migration failed: {0}")]
    Migration(#[from] sqlx::migrate::MigrateError),
    /// The URL itself is not repeated: it may hold a password. Callers name it, redacted.
    #[error("unsupported database URL (a `{0}` URL): use sqlite://PATH or postgres://...")]
    UnsupportedUrl(String),
    /// Operators' commands never create a database: a mistyped path is an error.
    #[error("no database at {0}: `hookgate serve` creates it; check the path")]
    NoDatabase(String),
    /// The database exists but is not (or not yet, or no longer) one this binary can read.
    #[error("{0}")]
    Schema(String),
}

impl StoreError {
    pub fn is_unavailable(&self) -> bool {
        matches!(self, StoreError::Unavailable(_) | StoreError::Busy(_))
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(error: sqlx::Error) -> StoreError {
        let unavailable = match &error {
            sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::WorkerCrashed => true,
            sqlx::Error::Database(db) => match db.code() {
                // PostgreSQL: connection exceptions (08), operator intervention such as a
                // shutdown (57), insufficient resources (53). SQLite: busy (5), locked (6).
                Some(code) => {
                    code.starts_with("08")
                        || code.starts_with("57")
                        || code.starts_with("53")
                        || code == "5"
                        || code == "6"
                }
                None => false,
            },
            _ => false,
        };
        if unavailable { StoreError::Unavailable(error) } else { StoreError::Database(error) }
    }
}

/// How the pools are sized and how long a caller waits for a connection.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// PostgreSQL connections per process.
    pub max_connections: u32,
    /// How long a request waits for a connection before it is answered 503.
    pub acquire_timeout: Duration,
}

impl Default for StoreOptions {
    fn default() -> StoreOptions {
        StoreOptions { max_connections: 16, acquire_timeout: Duration::from_secs(3) }
    }
}

#[derive(Debug, Clone)]
pub enum Store {
    Sqlite {
        /// One connection: SQLite has one writer, and queueing in the pool is cheaper and fairer
        /// than `SQLITE_BUSY` retries.
        writer: SqlitePool,
        /// WAL lets readers proceed while the writer commits.
        reader: SqlitePool,
    },
    Postgres(PgPool),
}

/// Runs `$body` with `$pool` bound to the backend's pool; the body is compiled once per
/// backend, so one query text serves both where the dialects agree.
macro_rules! on_both {
    ($store:expr, $pool:ident => $body:expr) => {
        match $store {
            Store::Sqlite { writer: $pool, .. } => $body,
            Store::Postgres($pool) => $body,
        }
    };
}

/// Like `on_both!`, for reads: SQLite reads go to the reader pool.
macro_rules! read_on_both {
    ($store:expr, $pool:ident => $body:expr) => {
        match $store {
            Store::Sqlite { reader: $pool, .. } => $body,
            Store::Postgres($pool) => $body,
        }
    };
}

// First: its macros give the other modules their states' SQL text.
#[macro_use]
mod state;
mod batch;
mod budget;
mod delivery;
mod intake;
mod operate;
mod payloads;
mod refusals;

pub use batch::FinishItem;
pub use budget::SliceRequest;
pub use delivery::{
    AppliedVersion, AttemptRecord, Backlog, Call, Doubt, EntityGuard, Finish, LANE_FRESH,
    LANE_PARKED, LANE_REPLAY, LeasedItem, PoolUsage, Renewal, Replay, SWEEP_BATCH,
};
pub use intake::{IntakeWriter, POSTGRES_INTAKE};
pub use operate::{DeadLetter, Pause, PauseKind, ReplayFilter, TargetBacklog};
pub use payloads::{PURGE_BATCH, PayloadTable, Purged, StoredAnswer, StoredPayload};
pub use refusals::{REFUSALS_KEPT_MS, REFUSALS_PER_PIPELINE_MAX, RefusalCount};
pub use state::{AttemptOutcome, DeliveryOutcome, EventState, ItemState, WriteView};

/// Everything about one verified delivery that the inbox keeps.
#[derive(Debug, Clone)]
pub struct NewDelivery<'a> {
    pub pipeline: &'a str,
    pub scope: &'a str,
    pub key: &'a str,
    pub fingerprint: &'a str,
    pub event_type: Option<&'a str>,
    pub received_at_ms: i64,
    /// JSON object of the stored headers (signature and credential headers removed).
    pub headers_json: &'a str,
    /// What a repeated delivery (duplicate or conflict) keeps of them: a bounded excerpt.
    pub headers_excerpt_json: &'a str,
    pub body: &'a [u8],
    /// The key the body and both header texts are sealed under, or `None` for plaintext.
    pub sealed_with: Option<&'a str>,
    /// The outbox items to create if the event is new.
    pub outbox: Vec<NewOutboxItem>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewOutboxItem {
    pub target: String,
    pub target_index: i64,
    /// The ordering entity, or else the target's external id value.
    pub entity: String,
    /// A text that sorts like the version (see `hookgate_pipeline::evaluate::Version`).
    pub version: Option<String>,
    /// The version as the sender wrote it, for evidence.
    pub version_text: Option<String>,
}

/// What the inbox made of a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntakeRecord {
    /// A new event, committed with its outbox items.
    Accepted { event_id: i64 },
    /// The same key with the same fingerprint: counted on the original, nothing scheduled.
    Duplicate { event_id: i64 },
    /// The same key with a different fingerprint: the original is untouched; the delivery is
    /// kept as a conflict with its body.
    Conflict { event_id: i64 },
}

/// A delivery whose signature held but whose event could not be derived.
#[derive(Debug, Clone)]
pub struct RejectedDelivery<'a> {
    pub pipeline: &'a str,
    pub received_at_ms: i64,
    pub reason: &'a str,
    pub headers_json: &'a str,
    pub body: &'a [u8],
    /// The key the body and headers are sealed under, or `None` for plaintext.
    pub sealed_with: Option<&'a str>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRecord {
    pub id: i64,
    pub pipeline: String,
    pub scope: String,
    pub key: String,
    pub fingerprint: String,
    pub event_type: Option<String>,
    pub received_at_ms: i64,
    /// The stored header pairs as JSON, or their sealed form (see `sealed_with`).
    pub headers_json: String,
    /// The raw body, or its sealed form; empty once `payload_purged_at_ms` is set, and in
    /// lists, which do not read it.
    pub body: Vec<u8>,
    /// How many bytes the stored body has (raw or sealed), read even where `body` is not.
    pub body_bytes: i64,
    pub state: EventState,
    pub delivery_count: i64,
    pub conflict_count: i64,
    pub last_delivery_at_ms: i64,
    /// The key the body and headers are sealed under; `None`: plaintext.
    pub sealed_with: Option<String>,
    /// When `payload_retention` deleted the body and headers.
    pub payload_purged_at_ms: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRecord {
    pub id: i64,
    pub event_id: i64,
    pub target: String,
    pub target_index: i64,
    pub entity: String,
    pub version: Option<String>,
    pub version_text: Option<String>,
    pub state: WriteView,
    pub attempts: i64,
    pub next_attempt_at_ms: i64,
    pub in_doubt: bool,
    pub record_id: Option<String>,
    pub last_error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryRecord {
    pub id: i64,
    pub pipeline: String,
    pub event_id: Option<i64>,
    pub outcome: DeliveryOutcome,
    pub received_at_ms: i64,
    pub event_key: Option<String>,
    pub fingerprint: Option<String>,
    pub reason: Option<String>,
    pub headers_json: String,
    pub body: Option<Vec<u8>>,
    pub sealed_with: Option<String>,
    pub payload_purged_at_ms: Option<i64>,
}

/// An event keeps the evidence rows (headers excerpt, and the body of a conflict) of at most
/// this many duplicates, and as many conflicts; the rest are counted on the event.
pub const REPEATED_DELIVERIES_KEPT: i64 = 20;

/// Which events to list.
#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    pub pipeline: Option<String>,
    pub state: Option<EventState>,
    pub since_ms: Option<i64>,
    /// A cursor: only events older than this id (the last one a page showed).
    pub before_id: Option<i64>,
    pub limit: i64,
}

/// How [`Store::open_existing`] uses the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Reading evidence: no statement can change anything.
    ReadOnly,
    /// Operators' writes (replay), to a database that must already exist and be migrated.
    ReadWrite,
}

impl Store {
    /// Connects and applies migrations. `url` is `sqlite://PATH` (created if missing) or
    /// `postgres://...`.
    pub async fn connect(url: &str, options: &StoreOptions) -> Result<Store> {
        let store = if url.starts_with("sqlite:") {
            let connect = SqliteConnectOptions::from_str(url)?
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                // With WAL, NORMAL survives a process crash but may lose the last commits on
                // power loss; FULL syncs the WAL at every commit, so a 2xx is never taken back.
                .synchronous(SqliteSynchronous::Full)
                // Deleted content (a purged payload, a plaintext row re-sealed) is overwritten
                // with zeros instead of lingering in free pages of the file.
                .pragma("secure_delete", "ON")
                .busy_timeout(Duration::from_secs(5))
                .foreign_keys(true)
                .disable_statement_logging();
            let writer = SqlitePoolOptions::new()
                .max_connections(1)
                .acquire_timeout(options.acquire_timeout)
                .connect_with(connect.clone())
                .await?;
            SQLITE_MIGRATIONS.run(&writer).await?;
            let reader = SqlitePoolOptions::new()
                .max_connections(4)
                .acquire_timeout(options.acquire_timeout)
                .connect_with(connect.read_only(true))
                .await?;
            Store::Sqlite { writer, reader }
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            let connect = PgConnectOptions::from_str(url)?.disable_statement_logging();
            let pool = PgPoolOptions::new()
                .max_connections(options.max_connections)
                .acquire_timeout(options.acquire_timeout)
                .connect_with(connect)
                .await?;
            // Several processes may start at once; the migrator takes an advisory lock.
            POSTGRES_MIGRATIONS.run(&pool).await?;
            Store::Postgres(pool)
        } else {
            return Err(StoreError::UnsupportedUrl(
                url.split(':').next().unwrap_or_default().to_owned(),
            ));
        };
        Ok(store)
    }

    /// Opens a database that `serve` created, for operators' commands: never creates it,
    /// never migrates it, and with [`Access::ReadOnly`] cannot write (SQLite opened read-only,
    /// PostgreSQL sessions whose transactions are read-only). A database whose schema is not
    /// exactly what this binary's migrations make is refused with what to do.
    pub async fn open_existing(url: &str, options: &StoreOptions, access: Access) -> Result<Store> {
        let read_only = access == Access::ReadOnly;
        let store = if url.starts_with("sqlite:") {
            let connect = SqliteConnectOptions::from_str(url)?
                .create_if_missing(false)
                .busy_timeout(Duration::from_secs(5))
                .foreign_keys(true)
                .disable_statement_logging();
            let path = connect.get_filename().to_owned();
            if !path.is_file() {
                return Err(StoreError::NoDatabase(path.display().to_string()));
            }
            let connect = if read_only { connect.read_only(true) } else { connect };
            let reader = SqlitePoolOptions::new()
                .max_connections(1)
                .acquire_timeout(options.acquire_timeout)
                .connect_with(connect)
                .await?;
            Store::Sqlite { writer: reader.clone(), reader }
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            let mut connect = PgConnectOptions::from_str(url)?.disable_statement_logging();
            if read_only {
                connect = connect.options([("default_transaction_read_only", "on")]);
            }
            let pool = PgPoolOptions::new()
                .max_connections(2)
                .acquire_timeout(options.acquire_timeout)
                .connect_with(connect)
                .await?;
            Store::Postgres(pool)
        } else {
            return Err(StoreError::UnsupportedUrl(
                url.split(':').next().unwrap_or_default().to_owned(),
            ));
        };
        store.check_schema().await?;
        Ok(store)
    }

    /// Whether the database's applied migrations are exactly this binary's.
    async fn check_schema(&self) -> Result<()> {
        let (migrator, table): (&sqlx::migrate::Migrator, Option<String>) = match self {
            Store::Sqlite { reader, .. } => (
                &SQLITE_MIGRATIONS,
                sqlx::query_scalar(
                    "SELECT name FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'",
                )
                .fetch_optional(reader)
                .await?,
            ),
            Store::Postgres(pool) => (
                &POSTGRES_MIGRATIONS,
                sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations')::text")
                    .fetch_one(pool)
                    .await?,
            ),
        };
        if table.is_none() {
            return Err(StoreError::Schema(
                "not a hookgate database (it has no schema): `hookgate serve` creates one".into(),
            ));
        }
        let applied: Vec<i64> = read_on_both!(self, pool => {
            sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success ORDER BY version")
                .fetch_all(pool)
                .await?
        });
        let known: Vec<i64> = migrator.iter().map(|m| m.version).collect();
        if let Some(newer) = applied.iter().find(|v| !known.contains(v)) {
            return Err(StoreError::Schema(format!(
                "the database has migration {newer}, which this hookgate does not know: use a newer hookgate"
            )));
        }
        if let Some(missing) = known.iter().find(|v| !applied.contains(v)) {
            return Err(StoreError::Schema(format!(
                "the database lacks migration {missing}: start this version's `hookgate serve` once to migrate it"
            )));
        }
        Ok(())
    }

    /// Whether the store has any event or delivery of `pipeline`.
    pub async fn has_pipeline(&self, pipeline: &str) -> Result<bool> {
        read_on_both!(self, pool => {
            // A boolean in both dialects (SQLite's 0/1 decodes as one too).
            Ok(sqlx::query_scalar::<_, bool>(
                "SELECT EXISTS (SELECT 1 FROM events WHERE pipeline = $1) \
                 OR EXISTS (SELECT 1 FROM deliveries WHERE pipeline = $1)",
            )
            .bind(pipeline)
            .fetch_one(pool)
            .await?)
        })
    }

    /// Every pipeline the store has events or deliveries of, sorted.
    pub async fn pipelines(&self) -> Result<Vec<String>> {
        read_on_both!(self, pool => {
            Ok(sqlx::query_scalar(
                "SELECT pipeline FROM events UNION SELECT pipeline FROM deliveries ORDER BY 1",
            )
            .fetch_all(pool)
            .await?)
        })
    }

    /// Refused deliveries (signed correctly, then rejected), newest first, after a cursor.
    pub async fn rejected_deliveries(
        &self,
        pipeline: Option<&str>,
        before_id: Option<i64>,
        limit: i64,
    ) -> Result<Vec<DeliveryRecord>> {
        self.deliveries_page(DeliveryOutcome::Rejected, pipeline, before_id, limit).await
    }

    /// Whether several processes may work on this store at once (PostgreSQL): then what they
    /// share, such as a connector's call budget, is kept here.
    pub fn is_shared(&self) -> bool {
        matches!(self, Store::Postgres(_))
    }

    pub fn backend(&self) -> &'static str {
        match self {
            Store::Sqlite { .. } => "sqlite",
            Store::Postgres(_) => "postgres",
        }
    }

    /// Whether the database answers and every embedded migration is applied: readiness.
    pub async fn ready(&self) -> Result<bool> {
        let (migrator, applied): (&sqlx::migrate::Migrator, Vec<i64>) = match self {
            Store::Sqlite { reader, .. } => (
                &SQLITE_MIGRATIONS,
                sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
                    .fetch_all(reader)
                    .await?,
            ),
            Store::Postgres(pool) => (
                &POSTGRES_MIGRATIONS,
                sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
                    .fetch_all(pool)
                    .await?,
            ),
        };
        Ok(migrator.iter().all(|m| applied.contains(&m.version)))
    }

    /// Keeps a delivery whose event could not be derived, body included, so nothing a sender
    /// sent is lost.
    pub async fn record_rejection(&self, rejected: &RejectedDelivery<'_>) -> Result<i64> {
        on_both!(self, pool => {
            let id: i64 = sqlx::query_scalar(
                "INSERT INTO deliveries (pipeline, outcome, received_at_ms, reason, headers, body, sealed_with) \
                 VALUES ($1, $7, $2, $3, $4, $5, $6) RETURNING id",
            )
            .bind(rejected.pipeline)
            .bind(rejected.received_at_ms)
            .bind(rejected.reason)
            .bind(rejected.headers_json)
            .bind(rejected.body)
            .bind(rejected.sealed_with)
            .bind(DeliveryOutcome::Rejected)
            .fetch_one(pool)
            .await?;
            Ok(id)
        })
    }

    pub async fn event(&self, id: i64) -> Result<Option<EventRecord>> {
        read_on_both!(self, pool => {
            let row = sqlx::query(&format!("{EVENT_COLUMNS} WHERE id = $1")).bind(id).fetch_optional(pool).await?;
            row.map(|r| event_from_row(&r)).transpose()
        })
    }

    /// The events of these ids that exist, in one query (the events of a batch of leased
    /// items).
    pub async fn events_by_id(&self, ids: &[i64]) -> Result<Vec<EventRecord>> {
        let postgres = matches!(self, Store::Postgres(_));
        let sql = format!(
            "{} {EVENT_COLUMNS} WHERE id IN (SELECT v_id FROM v)",
            batch::json_rows(postgres, 1, &[("v_id", "bigint")])
        );
        read_on_both!(self, pool => {
            let rows = sqlx::query(&sql).bind(batch::ids_json(ids)).fetch_all(pool).await?;
            rows.iter().map(event_from_row).collect()
        })
    }

    pub async fn event_by_key(
        &self,
        pipeline: &str,
        scope: &str,
        key: &str,
    ) -> Result<Option<EventRecord>> {
        read_on_both!(self, pool => {
            let row = sqlx::query(&format!("{EVENT_COLUMNS} WHERE pipeline = $1 AND scope = $2 AND event_key = $3"))
                .bind(pipeline)
                .bind(scope)
                .bind(key)
                .fetch_optional(pool)
                .await?;
            row.map(|r| event_from_row(&r)).transpose()
        })
    }

    /// Events of a pipeline, oldest first.
    pub async fn events(&self, pipeline: &str) -> Result<Vec<EventRecord>> {
        read_on_both!(self, pool => {
            let rows = sqlx::query(&format!("{EVENT_COLUMNS} WHERE pipeline = $1 ORDER BY id"))
                .bind(pipeline)
                .fetch_all(pool)
                .await?;
            rows.iter().map(event_from_row).collect()
        })
    }

    /// Events matching a filter, newest first, without their payload: `headers_json` and
    /// `body` are empty (a page of 1,000 events must not hold 1,000 bodies; `event` reads one
    /// whole).
    pub async fn list_events(&self, filter: &EventFilter) -> Result<Vec<EventRecord>> {
        let empty_body = if matches!(self, Store::Postgres(_)) { "''::bytea" } else { "X''" };
        let columns = format!(
            "SELECT id, pipeline, scope, event_key, fingerprint, event_type, received_at_ms, '' AS headers, \
             {empty_body} AS body, CAST(LENGTH(body) AS BIGINT) AS body_bytes, state, delivery_count, conflict_count, last_delivery_at_ms, sealed_with, \
             payload_purged_at_ms FROM events"
        );
        read_on_both!(self, pool => {
            let rows = sqlx::query(&format!(
                "{columns} WHERE ($1 IS NULL OR pipeline = $1) AND ($2 IS NULL OR state = $2) \
                 AND received_at_ms >= $3 AND id < $4 ORDER BY id DESC LIMIT $5"
            ))
            .bind(&filter.pipeline)
            .bind(filter.state)
            .bind(filter.since_ms.unwrap_or(0))
            .bind(filter.before_id.unwrap_or(i64::MAX))
            .bind(filter.limit)
            .fetch_all(pool)
            .await?;
            rows.iter().map(event_from_row).collect()
        })
    }

    pub async fn outbox_for(&self, event_id: i64) -> Result<Vec<OutboxRecord>> {
        read_on_both!(self, pool => {
            let rows = sqlx::query(
                "SELECT o.id, o.event_id, o.target, o.target_index, o.entity, o.version, o.version_text, \
                 o.state, e.in_flight_item IS NOT NULL AS in_flight, \
                 o.attempts + CASE WHEN e.in_flight_item IS NULL THEN 0 ELSE 1 END AS attempts, \
                 o.next_attempt_at_ms, o.in_doubt, o.record_id, o.last_error FROM outbox o \
                 LEFT JOIN entities e ON e.pipeline = o.pipeline AND e.target = o.target AND e.entity = o.entity \
                   AND e.in_flight_item = o.id \
                 WHERE o.event_id = $1 ORDER BY o.target_index",
            )
            .bind(event_id)
            .fetch_all(pool)
            .await?;
            rows.iter()
                .map(|r| {
                    Ok(OutboxRecord {
                        id: r.try_get("id")?,
                        event_id: r.try_get("event_id")?,
                        target: r.try_get("target")?,
                        target_index: r.try_get("target_index")?,
                        entity: r.try_get("entity")?,
                        version: r.try_get("version")?,
                        version_text: r.try_get("version_text")?,
                        state: if r.try_get("in_flight")? {
                            WriteView::InFlight
                        } else {
                            WriteView::Item(r.try_get("state")?)
                        },
                        attempts: r.try_get("attempts")?,
                        next_attempt_at_ms: r.try_get("next_attempt_at_ms")?,
                        in_doubt: r.try_get::<i64, _>("in_doubt")? != 0,
                        record_id: r.try_get("record_id")?,
                        last_error: r.try_get("last_error")?,
                    })
                })
                .collect()
        })
    }

    /// Deliveries of a pipeline with the given outcome, oldest first.
    pub async fn deliveries(
        &self,
        pipeline: &str,
        outcome: DeliveryOutcome,
    ) -> Result<Vec<DeliveryRecord>> {
        read_on_both!(self, pool => {
            let rows = sqlx::query(&format!("{DELIVERY_COLUMNS} WHERE pipeline = $1 AND outcome = $2 ORDER BY id"))
                .bind(pipeline)
                .bind(outcome)
                .fetch_all(pool)
                .await?;
            rows.iter().map(delivery_from_row).collect()
        })
    }

    /// Every delivery that concerned an event, oldest first.
    pub async fn deliveries_for(&self, event_id: i64) -> Result<Vec<DeliveryRecord>> {
        read_on_both!(self, pool => {
            let rows = sqlx::query(&format!("{DELIVERY_COLUMNS} WHERE event_id = $1 ORDER BY id"))
                .bind(event_id)
                .fetch_all(pool)
                .await?;
            rows.iter().map(delivery_from_row).collect()
        })
    }

    /// The fingerprints of these events, by id (no payload read): what a conflict is shown
    /// beside.
    pub async fn fingerprints(&self, ids: &[i64]) -> Result<Vec<(i64, String)>> {
        let postgres = matches!(self, Store::Postgres(_));
        let ids_source = if postgres {
            "SELECT value::bigint FROM jsonb_array_elements_text($1::jsonb) AS t(value)"
        } else {
            "SELECT value FROM json_each($1)"
        };
        let ids = serde_json::Value::from(ids.to_vec()).to_string();
        read_on_both!(self, pool => {
            Ok(sqlx::query_as(&format!("SELECT id, fingerprint FROM events WHERE id IN ({ids_source})"))
                .bind(&ids)
                .fetch_all(pool)
                .await?)
        })
    }

    /// Closes the pools, waiting for connections in use to be returned.
    pub async fn close(&self) {
        match self {
            Store::Sqlite { writer, reader } => {
                writer.close().await;
                reader.close().await;
            }
            Store::Postgres(pool) => pool.close().await,
        }
    }
}

const EVENT_COLUMNS: &str = "SELECT id, pipeline, scope, event_key, fingerprint, event_type, received_at_ms, headers, \
    body, CAST(LENGTH(body) AS BIGINT) AS body_bytes, state, delivery_count, conflict_count, last_delivery_at_ms, sealed_with, payload_purged_at_ms FROM events";

const DELIVERY_COLUMNS: &str = "SELECT id, pipeline, event_id, outcome, received_at_ms, event_key, fingerprint, \
    reason, headers, body, sealed_with, payload_purged_at_ms FROM deliveries";

fn event_from_row<R: Row>(row: &R) -> Result<EventRecord>
where
    for<'c> &'c str: sqlx::ColumnIndex<R>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<i64>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> EventState: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    Ok(EventRecord {
        id: row.try_get("id")?,
        pipeline: row.try_get("pipeline")?,
        scope: row.try_get("scope")?,
        key: row.try_get("event_key")?,
        fingerprint: row.try_get("fingerprint")?,
        event_type: row.try_get("event_type")?,
        received_at_ms: row.try_get("received_at_ms")?,
        headers_json: row.try_get("headers")?,
        body: row.try_get("body")?,
        body_bytes: row.try_get::<Option<i64>, _>("body_bytes")?.unwrap_or(0),
        state: row.try_get("state")?,
        delivery_count: row.try_get("delivery_count")?,
        conflict_count: row.try_get("conflict_count")?,
        last_delivery_at_ms: row.try_get("last_delivery_at_ms")?,
        sealed_with: row.try_get("sealed_with")?,
        payload_purged_at_ms: row.try_get("payload_purged_at_ms")?,
    })
}

fn delivery_from_row<R: Row>(row: &R) -> Result<DeliveryRecord>
where
    for<'c> &'c str: sqlx::ColumnIndex<R>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<i64>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<Vec<u8>>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> DeliveryOutcome: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    Ok(DeliveryRecord {
        id: row.try_get("id")?,
        pipeline: row.try_get("pipeline")?,
        event_id: row.try_get("event_id")?,
        outcome: row.try_get("outcome")?,
        received_at_ms: row.try_get("received_at_ms")?,
        event_key: row.try_get("event_key")?,
        fingerprint: row.try_get("fingerprint")?,
        reason: row.try_get("reason")?,
        headers_json: row.try_get("headers")?,
        body: row.try_get("body")?,
        sealed_with: row.try_get("sealed_with")?,
        payload_purged_at_ms: row.try_get("payload_purged_at_ms")?,
    })
}

#[cfg(any(test, feature = "testing"))]
pub mod testing;

#[cfg(test)]
mod tests;
