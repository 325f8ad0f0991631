//! Real databases for tests: a fresh PostgreSQL database per test, so tests run in parallel
//! without seeing each other's rows. There is no fallback: without PostgreSQL these fail.

use sqlx::Connection;
use sqlx::postgres::PgConnection;

/// The server tests create databases on. Override with `HOOKGATE_TEST_POSTGRES`.
pub fn postgres_admin_url() -> String {
    std::env::var("HOOKGATE_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// Creates an empty database and returns its URL.
///
/// # Panics
/// When PostgreSQL cannot be reached: a test that needs it must fail, not skip.
pub async fn fresh_postgres_database() -> String {
    let admin = postgres_admin_url();
    let mut connection = PgConnection::connect(&admin)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL must be running for the tests ({admin}): {e}"));
    drop_orphans(&mut connection).await;
    let name = format!("hookgate_test_{}_{:016x}", std::process::id(), rand::random::<u64>());
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut connection)
        .await
        .unwrap_or_else(|e| panic!("cannot create a test database: {e}"));
    let _ = connection.close().await;
    match admin.rsplit_once('/') {
        Some((server, _)) => format!("{server}/{name}"),
        None => panic!("cannot derive a database URL from {admin}"),
    }
}

/// Drops the test databases of processes that are gone: a test that panics, or a run that is
/// killed, leaves its database behind. Names carry the creating process's id; a database whose
/// process still runs (another test binary, on this machine) is left alone.
async fn drop_orphans(connection: &mut PgConnection) {
    // Without /proc there is no telling whether a process runs: leave everything.
    if !std::path::Path::new("/proc/self").exists() {
        return;
    }
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT datname FROM pg_database WHERE datname LIKE 'hookgate\\_test\\_%'",
    )
    .fetch_all(&mut *connection)
    .await
    .unwrap_or_default();
    for name in names {
        let pid = name.split('_').nth(2).and_then(|pid| pid.parse::<u32>().ok());
        let alive = pid.is_none_or(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists());
        if !alive {
            let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .execute(&mut *connection)
                .await;
        }
    }
}

/// Drops a database made by [`fresh_postgres_database`], closing other sessions first.
pub async fn drop_postgres_database(url: &str) {
    let Some((_, name)) = url.rsplit_once('/') else { return };
    if let Ok(mut connection) = PgConnection::connect(&postgres_admin_url()).await {
        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .execute(&mut connection)
            .await;
        let _ = connection.close().await;
    }
}

/// A SQLite URL for a file in `dir`.
pub fn sqlite_url(dir: &std::path::Path) -> String {
    format!("sqlite://{}", dir.join("hookgate.db").display())
}
