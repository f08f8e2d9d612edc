//! The attempt-limiting migration stream, separate from the fixed-window and GCRA ones.

use std::sync::LazyLock;

use sqlx::migrate::Migrator;

/// Migration `20250801000001_create_runlimit_attempts`: the `public.runlimit_attempt_shards`
/// lock table (256 rows, `capacity_shard` 0..=255) and the `public.runlimit_attempts` table
/// (`attempt_key bytea` primary key of 64 bytes, `capacity_shard smallint` 0..=255,
/// `capacity_slot integer` checked to 0..=65,535 and unique per shard, `consecutive_failures
/// bigint` 0..=`u32::MAX`, `last_failure_at_ms`, `lease_deadline_ms` and `expires_at_ms bigint`
/// milliseconds since the Unix epoch of the server clock, `lease_token bytea`, `claim_xid
/// xid8`), with the `(capacity_shard, expires_at_ms)` index used by bounded reclamation.
///
/// The exact text of the bundled file, byte for byte (SQLx checksums it), for hosts that
/// vendor the migrations into their own strict migration set.
pub const CREATE_RUNLIMIT_ATTEMPTS_SQL: &str =
    include_str!("../../attempts-migrations/20250801000001_create_runlimit_attempts.sql");

/// The versions of the attempt migrations: `20250801000001`. They never collide with the
/// fixed-window or GCRA versions; host migrations must not reuse them.
pub const ATTEMPTS_MIGRATION_VERSIONS: [i64; 1] = [20_250_801_000_001];

/// The attempt migrations with SQLx's strict defaults (`VersionMissing` for any version it does
/// not know, including other Runlimit streams). Suitable only when this stream exclusively
/// owns the history; run it on a dedicated `PgConnection`. Prefer
/// [`PostgresAttemptLimiter::migrate`](super::PostgresAttemptLimiter::migrate), which tolerates
/// other migrators' versions.
///
/// Built on first use from the SQL constants above, exactly as `sqlx::migrate!` would build it
/// from the crate's migration directory (the same versions, descriptions and checksums); it
/// dereferences to [`Migrator`](https://docs.rs/sqlx/0.9/sqlx/migrate/struct.Migrator.html).
pub static ATTEMPTS_MIGRATOR: LazyLock<Migrator> = LazyLock::new(|| {
    crate::migrations::bundled(&[(
        ATTEMPTS_MIGRATION_VERSIONS[0],
        "create runlimit attempts",
        CREATE_RUNLIMIT_ATTEMPTS_SQL,
    )])
});

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_migrator_is_what_sqlx_reads_from_the_directory() {
        crate::migrations::assert_matches_directory(&ATTEMPTS_MIGRATOR, "attempts-migrations").await;
    }

    #[test]
    fn the_shared_history_copy_tolerates_other_versions() {
        // The migrator itself is compared with its directory above (which also shows the SQL
        // constants are the files' text); the copy for a shared history keeps every migration.
        assert!(!ATTEMPTS_MIGRATOR.ignore_missing);
        let shared = crate::migrations::shared_history(&ATTEMPTS_MIGRATOR);
        assert!(shared.ignore_missing);
        assert_eq!(shared.iter().count(), 1);
    }
}
