//! The PostgreSQL admin connection the PostgreSQL and Redis modes' tests create and drop their
//! databases through.

use sqlx::{AssertSqlSafe, Connection as _, PgConnection};

const DATABASE_URL_VARIABLE: &str = "RUNLIMIT_POSTGRES_TEST_DATABASE_URL";

/// The admin URL. Panics (never silently passes) when the variable is missing.
pub(crate) fn admin_url() -> String {
    std::env::var(DATABASE_URL_VARIABLE).unwrap_or_else(|_| {
        panic!(
            "{DATABASE_URL_VARIABLE} must name a PostgreSQL database whose role has CREATEDB, \
             e.g. postgres://postgres@127.0.0.1:5432/test"
        )
    })
}

/// Runs `sql` on a fresh admin connection.
pub(crate) async fn admin_sql(sql: String) {
    let mut connection = PgConnection::connect(&admin_url()).await.expect("connect to the admin database");
    sqlx::raw_sql(AssertSqlSafe(sql)).execute(&mut connection).await.expect("admin statement");
    connection.close().await.expect("close the admin connection");
}
