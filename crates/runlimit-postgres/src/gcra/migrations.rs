//! The GCRA migration stream, separate from the fixed-window one.

use std::sync::LazyLock;

use sqlx::migrate::Migrator;

/// Migration `20250701000001_create_runlimit_gcra`: the `public.runlimit_gcra` table
/// (`counter_key bytea` primary key, generated `capacity_shard smallint` = byte 32 of the key,
/// the exact arrival-time parts `tat_ms` and `tat_remainder bigint`, `expires_at_ms bigint`),
/// the `public.runlimit_gcra_shards` ledger (256 rows: `row_count`, refused past 65,536 by the
/// CHECK constraint `runlimit_gcra_shards_capacity` with SQLSTATE 23514, and the committed
/// time watermark `watermark_ms`) and the statement-level triggers that keep `row_count` exact
/// for every writer.
///
/// The exact text of the bundled file, byte for byte (SQLx checksums it), for hosts that
/// vendor the migrations into their own strict migration set.
pub const CREATE_RUNLIMIT_GCRA_SQL: &str =
    include_str!("../../gcra-migrations/20250701000001_create_runlimit_gcra.sql");

/// Migration `20250701000002_index_runlimit_gcra_shard_expiry`: the index
/// `runlimit_gcra_shard_expiry_idx` on `(capacity_shard, expires_at_ms)` that bounded cleanup
/// probes. Vendor it after [`CREATE_RUNLIMIT_GCRA_SQL`].
pub const INDEX_RUNLIMIT_GCRA_SHARD_EXPIRY_SQL: &str =
    include_str!("../../gcra-migrations/20250701000002_index_runlimit_gcra_shard_expiry.sql");

/// Migration `20250701000003_add_runlimit_gcra_row_lock_protocol`: the row-lock protocol's
/// capacity ledger `public.runlimit_gcra_ledger` (empty until the switch), counting triggers that
/// count into both ledgers, and the switch function `public.runlimit_gcra_switch_to_row_locks()`
/// (see [`PostgresGcraLimiter::switch_to_row_locks`](crate::PostgresGcraLimiter::switch_to_row_locks)).
/// Vendor it after [`INDEX_RUNLIMIT_GCRA_SHARD_EXPIRY_SQL`]; it changes nothing until the switch.
pub const ADD_RUNLIMIT_GCRA_ROW_LOCK_PROTOCOL_SQL: &str =
    include_str!("../../gcra-migrations/20250701000003_add_runlimit_gcra_row_lock_protocol.sql");

/// The versions of the GCRA migrations, in order: `20250701000001`, `20250701000002`,
/// `20250701000003`. They
/// never collide with the fixed-window
/// [`MIGRATION_VERSIONS`](crate::MIGRATION_VERSIONS); the GCRA stream owns the versions
/// `20250701000001` to `20250701999999`, and host migrations must not reuse them.
pub const GCRA_MIGRATION_VERSIONS: [i64; 3] = [20_250_701_000_001, 20_250_701_000_002, 20_250_701_000_003];

/// The GCRA migrations with SQLx's strict defaults (`VersionMissing` for any version it does
/// not know, including the fixed-window ones). Suitable only when Runlimit's GCRA stream
/// exclusively owns the history; run it on a dedicated `PgConnection`. Prefer
/// [`PostgresGcraLimiter::migrate`](crate::PostgresGcraLimiter::migrate).
///
/// Built on first use from the SQL constants above, exactly as `sqlx::migrate!` would build it
/// from the crate's migration directory (the same versions, descriptions and checksums); it
/// dereferences to [`Migrator`](https://docs.rs/sqlx/0.9/sqlx/migrate/struct.Migrator.html).
pub static GCRA_MIGRATOR: LazyLock<Migrator> = LazyLock::new(|| {
    crate::migrations::bundled(&[
        (GCRA_MIGRATION_VERSIONS[0], "create runlimit gcra", CREATE_RUNLIMIT_GCRA_SQL),
        (
            GCRA_MIGRATION_VERSIONS[1],
            "index runlimit gcra shard expiry",
            INDEX_RUNLIMIT_GCRA_SHARD_EXPIRY_SQL,
        ),
        (
            GCRA_MIGRATION_VERSIONS[2],
            "add runlimit gcra row lock protocol",
            ADD_RUNLIMIT_GCRA_ROW_LOCK_PROTOCOL_SQL,
        ),
    ])
});

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_migrator_is_what_sqlx_reads_from_the_directory() {
        crate::migrations::assert_matches_directory(&GCRA_MIGRATOR, "gcra-migrations").await;
    }

    #[test]
    fn the_shared_history_copy_tolerates_other_versions() {
        // The migrator itself is compared with its directory above (which also shows the SQL
        // constants are the files' text); the copy for a shared history keeps every migration.
        assert!(!GCRA_MIGRATOR.ignore_missing);
        let shared = crate::migrations::shared_history(&GCRA_MIGRATOR);
        assert!(shared.ignore_missing);
        assert_eq!(shared.iter().count(), 3);
    }
}
