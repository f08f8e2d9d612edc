//! The attempt SQL: the statements of `src/sql/attempt_*.sql`, each run with bind parameters
//! through SQLx's extended protocol inside a transaction opened by `crate::transaction::begin`.
//!
//! Every statement names `public` tables and `pg_catalog` functions explicitly, and runs under
//! the transaction-local `search_path = pg_catalog, pg_temp`.

/// The server clock in whole milliseconds since the Unix epoch, exactly
/// (`floor(extract(epoch ..) * 1000)`: `extract` returns `numeric`).
pub(super) const NOW_MS: &str = include_str!("../sql/attempt_now.sql");
/// Locks the shard's row of the `runlimit_attempt_shards` lock table (`$1`: shard).
pub(super) const LOCK_SHARD: &str = include_str!("../sql/attempt_lock_shard.sql");
/// Reads and row-locks a subject's state (`$1`: key), saying whether the current transaction
/// holds its claim.
pub(super) const READ_ROW: &str = include_str!("../sql/attempt_read.sql");
/// The admission read: like [`READ_ROW`] but skipping a row another transaction has locked (a
/// host transaction holding a claim, or a completion in flight), so admission never waits on
/// application work while it holds its shard lock.
pub(super) const READ_ROW_SKIP_LOCKED: &str = include_str!("../sql/attempt_read_skip_locked.sql");
/// Whether a row skipped by [`READ_ROW_SKIP_LOCKED`] exists, and its committed lease deadline.
pub(super) const LOCKED_ROW: &str = include_str!("../sql/attempt_locked_row.sql");
/// Deletes at most `$3` expired rows of shard `$1` at time `$2`, oldest first, skipping
/// locked rows; a saturated `i64::MAX` expiry never passes.
pub(super) const RECLAIM: &str = include_str!("../sql/attempt_reclaim.sql");
/// The lowest free slot of shard `$1` below the bound `$2`.
pub(super) const FREE_SLOT: &str = include_str!("../sql/attempt_free_slot.sql");
/// The earliest stored expiry of shard `$1`.
pub(super) const EARLIEST_EXPIRY: &str = include_str!("../sql/attempt_earliest_expiry.sql");
/// Inserts a new subject with a lease (`$1` key, `$2` shard, `$3` slot, `$4` latest failure,
/// `$5` lease deadline, `$6` expiry), returning the new token.
pub(super) const INSERT: &str = include_str!("../sql/attempt_insert.sql");
/// Admits a stored subject (`$1` key, `$2` failures, `$3` latest failure, `$4` lease deadline,
/// `$5` expiry), returning the new token.
pub(super) const ADMIT: &str = include_str!("../sql/attempt_admit.sql");
/// Records a failure (`$1` key, `$2` failures, `$3` latest failure, `$4` expiry).
pub(super) const RECORD_FAILURE: &str = include_str!("../sql/attempt_record_failure.sql");
/// An operator's reset of a subject holding a live lease: clears its failures (`$1` key, `$2`
/// latest failure, `$3` expiry), keeping the lease, its token and any claim.
pub(super) const RESET_FAILURES: &str = include_str!("../sql/attempt_reset_failures.sql");
/// Deletes a subject's state (`$1` key).
pub(super) const DELETE: &str = include_str!("../sql/attempt_delete.sql");
/// Claims a reservation for the current transaction, rotating its token (`$1` key).
pub(super) const CLAIM: &str = include_str!("../sql/attempt_claim.sql");
