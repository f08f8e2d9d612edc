//! The fixed-window migration stream, as SQL text and as SQLx migrators.

use std::sync::LazyLock;

use sqlx::migrate::Migrator;

/// Migration `20250601000001_create_runlimit_fixed_windows`: the `public.runlimit_fixed_windows`
/// counter table (`counter_key bytea` primary key, `used bigint`, `window_started_at` and
/// `window_expires_at timestamptz`) and its expiry index `runlimit_fixed_windows_expires_at_idx`.
///
/// The exact text of the bundled file, byte for byte (SQLx checksums it), for hosts that
/// vendor the migrations into their own strict migration set.
pub const CREATE_RUNLIMIT_FIXED_WINDOWS_SQL: &str =
    include_str!("../../migrations/20250601000001_create_runlimit_fixed_windows.sql");

/// Migration `20250601000002_set_runlimit_fixed_windows_fillfactor`: `fillfactor = 80` on the
/// counter table, reserving page space for HOT updates of in-window increments. Vendor it
/// after [`CREATE_RUNLIMIT_FIXED_WINDOWS_SQL`].
pub const SET_RUNLIMIT_FIXED_WINDOWS_FILLFACTOR_SQL: &str =
    include_str!("../../migrations/20250601000002_set_runlimit_fixed_windows_fillfactor.sql");

/// Migration `20250601000003_bound_runlimit_fixed_window_cardinality`: the generated
/// `capacity_shard` column (byte 32 of the counter key), the `public.runlimit_fixed_window_shards`
/// ledger (256 rows, seeded from the existing rows) and the statement-level triggers that keep
/// it exact and refuse any statement taking a shard past 65,536 rows (SQLSTATE 23514,
/// constraint `runlimit_fixed_window_shards_capacity`). Vendor it after
/// [`SET_RUNLIMIT_FIXED_WINDOWS_FILLFACTOR_SQL`].
pub const BOUND_RUNLIMIT_FIXED_WINDOW_CARDINALITY_SQL: &str =
    include_str!("../../migrations/20250601000003_bound_runlimit_fixed_window_cardinality.sql");

/// Migration `20250601000004_add_runlimit_fixed_window_admission_functions`: the PL/pgSQL
/// functions admissions call when a key has no stored counter or a window ended,
/// `public.runlimit_fixed_window_reserve` and `public.runlimit_fixed_window_write` (each
/// `SECURITY INVOKER`, with `search_path` pinned to `pg_catalog, pg_temp`), so PostgreSQL plans
/// their statements once per connection. (The common admission runs statements Runlimit
/// prepares on each connection instead; see the crate's operations guide.) Additive: it changes
/// no table, and replicas still sending the statements of earlier releases keep working beside
/// replicas of this one. Vendor it after [`BOUND_RUNLIMIT_FIXED_WINDOW_CARDINALITY_SQL`].
pub const ADD_RUNLIMIT_FIXED_WINDOW_ADMISSION_FUNCTIONS_SQL: &str =
    include_str!("../../migrations/20250601000004_add_runlimit_fixed_window_admission_functions.sql");

/// The versions of the bundled migrations, in order: `20250601000001`, `20250601000002`,
/// `20250601000003`, `20250601000004`. Runlimit's fixed-window stream owns the versions
/// `20250601000001` to `20250601999999` in a shared `_sqlx_migrations` history; host migrations
/// must not reuse them.
pub const MIGRATION_VERSIONS: [i64; 4] =
    [20_250_601_000_001, 20_250_601_000_002, 20_250_601_000_003, 20_250_601_000_004];

/// The bundled migrations with SQLx's strict defaults: it fails with `VersionMissing` when
/// `_sqlx_migrations` records a version it does not know.
///
/// Suitable only when Runlimit exclusively owns the migration history and the connection it
/// runs on. Prefer [`PostgresLimiter::migrate`](crate::PostgresStore::migrate), which
/// tolerates other migrators' versions and runs on a dedicated connection. Running this
/// migrator through a pool can leak SQLx's session-level migration lock into the pool when a
/// migration fails (SQLx takes it with `pg_advisory_lock`, a session-level lock, and a failed
/// migration returns before unlocking): run it on a dedicated `PgConnection`.
///
/// Built on first use from the SQL constants above, exactly as `sqlx::migrate!` would build it
/// from the crate's migration directory (the same versions, descriptions and checksums); it
/// dereferences to [`Migrator`](https://docs.rs/sqlx/0.9/sqlx/migrate/struct.Migrator.html).
pub static MIGRATOR: LazyLock<Migrator> = LazyLock::new(|| {
    crate::migrations::bundled(&[
        (MIGRATION_VERSIONS[0], "create runlimit fixed windows", CREATE_RUNLIMIT_FIXED_WINDOWS_SQL),
        (
            MIGRATION_VERSIONS[1],
            "set runlimit fixed windows fillfactor",
            SET_RUNLIMIT_FIXED_WINDOWS_FILLFACTOR_SQL,
        ),
        (
            MIGRATION_VERSIONS[2],
            "bound runlimit fixed window cardinality",
            BOUND_RUNLIMIT_FIXED_WINDOW_CARDINALITY_SQL,
        ),
        (
            MIGRATION_VERSIONS[3],
            "add runlimit fixed window admission functions",
            ADD_RUNLIMIT_FIXED_WINDOW_ADMISSION_FUNCTIONS_SQL,
        ),
    ])
});

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_migrator_is_what_sqlx_reads_from_the_directory() {
        crate::migrations::assert_matches_directory(&MIGRATOR, "migrations").await;
    }

    #[test]
    fn the_shared_history_copy_tolerates_other_versions() {
        // The migrator itself is compared with its directory above (which also shows the SQL
        // constants are the files' text); the copy for a shared history keeps every migration.
        assert!(!MIGRATOR.ignore_missing);
        let shared = crate::migrations::shared_history(&MIGRATOR);
        assert!(shared.ignore_missing);
        assert_eq!(shared.iter().count(), 4);
    }
}
