//! Running a bundled migration stream.

use std::borrow::Cow;

use sqlx::{
    AssertSqlSafe, Connection, PgPool, SqlSafeStr as _,
    migrate::{Migration, MigrationType, Migrator},
};
use tokio::time::timeout;

use crate::{config::PostgresConfig, error::MigrationError};

/// Runs `migrator` on a dedicated connection taken from `pool` (within the pool acquisition
/// timeout), detached from the pool and closed afterwards, so SQLx's session-level migration
/// lock can never leak back into the pool when a migration fails (SQLx takes it with
/// `pg_advisory_lock`, which lasts as long as the session, and a failed migration returns
/// before unlocking).
pub(crate) async fn run_migrator(
    pool: &PgPool,
    config: &PostgresConfig,
    migrator: &Migrator,
) -> Result<(), MigrationError> {
    run_migrator_then(pool, config, migrator, None).await.map(|_| ())
}

/// What [`run_migrator_then`] does around the migrations on a fresh install: `probe` (a query of
/// one boolean: whether the database is fresh) runs before them, and `then` after them when the
/// probe said it was.
pub(crate) struct FreshInstall {
    pub(crate) probe: &'static str,
    pub(crate) then: &'static str,
}

/// [`run_migrator`], with `fresh`'s statements around the migrations on the same connection.
/// Returns whether the database was fresh and `fresh.then` ran.
pub(crate) async fn run_migrator_then(
    pool: &PgPool,
    config: &PostgresConfig,
    migrator: &Migrator,
    fresh: Option<FreshInstall>,
) -> Result<bool, MigrationError> {
    let connection = match timeout(config.pool_acquire_timeout(), pool.acquire()).await {
        Ok(Ok(connection)) => connection,
        Ok(Err(source)) => return Err(MigrationError::Acquire { source }),
        Err(_) => return Err(MigrationError::PoolTimeout { timeout: config.pool_acquire_timeout() }),
    };
    let mut connection = connection.detach();
    // `Migrator::run(&mut connection)` is what this means, but its future is not `Send`: it is
    // generic over `Acquire<'a>`, and rustc cannot prove the HRTB (`implementation of
    // `sqlx::Acquire` is not general enough`), so `tokio::spawn(async move {
    // limiter.migrate().await })` would not compile. `run_direct` is the same operation on a
    // connection (`run` is `acquire` then `run_direct(None, conn, false)`), public but hidden
    // from SQLx's docs, which names it the workaround for exactly this error. Pinned by the
    // `migrate_futures_are_send` compile test.
    let result = async {
        let fresh = match &fresh {
            Some(install) => {
                let fresh: bool =
                    sqlx::query_scalar(AssertSqlSafe(install.probe)).fetch_one(&mut connection).await?;
                fresh.then_some(install.then)
            }
            None => None,
        };
        migrator.run_direct(None, &mut connection, false).await?;
        if let Some(then) = fresh {
            sqlx::query(AssertSqlSafe(then)).execute(&mut connection).await?;
        }
        Ok::<bool, sqlx::migrate::MigrateError>(fresh.is_some())
    }
    .await;
    // Closing ends the session, which releases the migrator's session-level lock even when
    // `run` returned early without unlocking. A failed close leaves nothing to clean up.
    let _closed = connection.close().await;
    result.map_err(|source| MigrationError::Migrate { source })
}

/// A copy of `migrator` with `ignore_missing` set, for a `_sqlx_migrations` history shared
/// with other migrators.
pub(crate) fn shared_history(migrator: &Migrator) -> Migrator {
    let mut shared = Migrator::with_migrations(migrator.iter().cloned().collect());
    shared.set_ignore_missing(true);
    shared
}

/// The migrator of a bundled stream, from its migrations as `(version, description, SQL)`:
/// what `sqlx::migrate!` builds from a directory of `VERSION_DESCRIPTION.sql` files (the
/// description is the file name's with `_` as spaces; `-- no-transaction` as the first line
/// opts out of the transaction; the checksum is SHA-384 of the text), built at run time
/// instead, so that building this crate compiles no SQLx proc macro (and with it a second copy
/// of SQLx and Tokio for the host). Each stream's tests compare it with
/// `Migrator::new` reading the directory, checksums included.
pub(crate) fn bundled(migrations: &[(i64, &'static str, &'static str)]) -> Migrator {
    Migrator::with_migrations(
        migrations
            .iter()
            .map(|&(version, description, sql)| {
                Migration::new(
                    version,
                    Cow::Borrowed(description),
                    MigrationType::Simple,
                    AssertSqlSafe(sql).into_sql_str(),
                    sql.starts_with("-- no-transaction"),
                )
            })
            .collect(),
    )
}

/// Test support: `migrator` equals what SQLx resolves from `directory` (relative to this
/// crate's manifest): the same versions, descriptions, types, SQL, checksums and transaction
/// choices, in the same order, and SQLx's strict defaults.
#[cfg(test)]
pub(crate) async fn assert_matches_directory(migrator: &Migrator, directory: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(directory);
    let resolved = Migrator::new(path).await.unwrap();
    let shape = |migrator: &Migrator| -> Vec<_> {
        migrator
            .iter()
            .map(|m| {
                (
                    m.version,
                    m.description.to_string(),
                    m.migration_type,
                    m.sql.as_str().to_owned(),
                    m.checksum.to_vec(),
                    m.no_tx,
                )
            })
            .collect()
    };
    assert_eq!(shape(migrator), shape(&resolved));
    assert_eq!(
        (migrator.ignore_missing, migrator.locking, migrator.no_tx),
        (resolved.ignore_missing, resolved.locking, resolved.no_tx)
    );
}
