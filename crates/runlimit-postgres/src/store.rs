//! [`PostgresStore`]: the one public surface of the quota limiters, generic over what they
//! count. [`PostgresLimiter`](crate::PostgresLimiter) (anchored fixed windows) and
//! [`PostgresGcraLimiter`](crate::PostgresGcraLimiter) (GCRA) are its two names.

use std::{fmt, future::Future, marker::PhantomData, sync::Arc, time::Instant};

use runlimit_core::{
    BatchDecision, Check, Decision, FixedWindowPolicy, GcraPolicy, Limiter, Observer, PolicySubject,
    QuotaControl, QuotaSnapshot, RateLimitPolicy,
};
use sqlx::PgPool;

use crate::{
    config::PostgresConfig,
    error::{BatchCheckError, CheckError, MaintenanceError, MigrationError},
    migrations::{run_migrator, run_migrator_then},
    observe::{finish_batch, finish_check, finish_cleanup, finish_reset, validate},
    transaction,
};

/// A policy type a [`PostgresStore`] can count: [`FixedWindowPolicy`]
/// ([`PostgresLimiter`](crate::PostgresLimiter)) or [`GcraPolicy`]
/// ([`PostgresGcraLimiter`](crate::PostgresGcraLimiter)).
///
/// Sealed: only this crate implements it, so a store only ever runs the bundled SQL protocols
/// and the rules of `runlimit_core::backend`, and only this crate can call its protocol, so
/// every admission goes through batch validation, the transaction skeleton and the observer:
///
/// ```compile_fail
/// use runlimit_postgres::{PostgresAlgorithm, PostgresConfig};
/// async fn bypass<P: PostgresAlgorithm>(pool: &sqlx::PgPool, config: &PostgresConfig) {
///     let _ = P::cleanup(pool, config, 10).await; // not callable outside the crate
/// }
/// ```
pub trait PostgresAlgorithm: RateLimitPolicy + Sized + sealed::Algorithm {}

impl PostgresAlgorithm for FixedWindowPolicy {}
impl PostgresAlgorithm for GcraPolicy {}

#[expect(
    unnameable_types,
    reason = "the sealed half of `PostgresAlgorithm`: only this crate implements and calls it"
)]
pub(crate) mod sealed {
    use sqlx::{PgConnection, migrate::Migrator};
    use tokio::time::Instant as Deadline;

    use runlimit_core::{
        Allowance, Check, QuotaMode, QuotaSnapshot, RateLimitPolicy, backend::batch::BatchDenial,
    };

    use crate::{
        config::PostgresConfig,
        error::{CheckError, MaintenanceError},
    };

    /// What an admission transaction produced, before observation: every check's allowance
    /// (it committed) or the batch rule's deciding denial (it rolled back).
    #[derive(Debug)]
    pub enum Evaluated {
        Allowed(Vec<Allowance>),
        Denied(BatchDenial),
    }

    /// What a store learned about its database while running, shared by its clones: for GCRA,
    /// whether the protocol was switched to row locks (see `crate::gcra::rowlock`). It starts
    /// unknown (the ledger-lock protocol) and is learned from the database: once set it stays set,
    /// because the switch cannot be undone.
    #[derive(Debug, Default)]
    pub struct Learned {
        row_locks: std::sync::atomic::AtomicBool,
    }

    impl Learned {
        /// Whether the GCRA protocol is known to be switched to row locks.
        pub(crate) fn row_locks(&self) -> bool {
            self.row_locks.load(std::sync::atomic::Ordering::Relaxed)
        }

        /// Records that the GCRA protocol is switched to row locks.
        pub(crate) fn set_row_locks(&self) {
            self.row_locks.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// What [`Algorithm::fresh_install`] returns: the statements around the migrations, and what
    /// to record once they ran.
    pub(crate) type FreshInstallHook = (crate::migrations::FreshInstall, fn(&Learned));

    /// Proof of being this crate: every method of [`Algorithm`] takes one, and nothing
    /// outside the crate can make one, so nothing outside it can call them (and so skip batch
    /// validation, the observer or the transaction skeleton).
    #[derive(Clone, Copy, Debug)]
    pub(crate) struct Internal(());

    impl Internal {
        pub(crate) const fn new() -> Self {
            Self(())
        }
    }

    /// One algorithm's SQL protocol: its migrations, its admission transaction and its
    /// cleanup pass. The transaction skeleton (`crate::transaction`) and the public surface
    /// ([`PostgresStore`](super::PostgresStore)) are shared.
    #[expect(
        private_interfaces,
        reason = "sealed: each method takes an `Internal`, which only this crate can make"
    )]
    pub trait Algorithm: RateLimitPolicy + Sized {
        /// The name the store shows in its `Debug` output.
        const NAME: &'static str;

        /// The algorithm's migrations with `ignore_missing` set, for a shared history.
        fn migrator(internal: Internal) -> Migrator;

        /// What [`migrate`](super::PostgresStore::migrate) runs around the migrations when they
        /// install the algorithm's tables for the first time, and what it then learned; `None`
        /// when nothing.
        fn fresh_install(_: Internal) -> Option<FreshInstallHook> {
            None
        }

        /// The admission transaction of a validated batch on a leased connection: the result
        /// and whether the transaction finished cleanly (the connection may be reused).
        fn admit(
            internal: Internal,
            learned: &Learned,
            connection: &mut PgConnection,
            deadline: Deadline,
            config: &PostgresConfig,
            checks: &[Check<'_, Self>],
            mode: QuotaMode,
        ) -> impl Future<Output = (Result<Evaluated, CheckError>, bool)> + Send;

        /// The state of `key` (a counter key of `policy`) in a read-only transaction that
        /// takes no lock and ends with `ROLLBACK`, in one round trip: the snapshot, and
        /// whether the transaction finished cleanly (the connection may be reused). Every
        /// failure is a pre-commit [`CheckError`]: a peek never consumes.
        fn peek(
            internal: Internal,
            learned: &Learned,
            connection: &mut PgConnection,
            deadline: Deadline,
            config: &PostgresConfig,
            policy: &Self,
            key: &[u8; 64],
        ) -> impl Future<Output = (Result<QuotaSnapshot, CheckError>, bool)> + Send;

        /// Deletes the state of `key` inside a maintenance transaction (see
        /// `transaction::maintain`), serialized with admissions of the key by the locks they
        /// take: `None` when nothing was stored (roll back), `Some(1)` when live state was
        /// deleted, `Some(0)` when an expired row was (both commit).
        fn reset(
            internal: Internal,
            learned: &Learned,
            connection: &mut PgConnection,
            deadline: Deadline,
            config: &PostgresConfig,
            key: &[u8; 64],
        ) -> impl Future<Output = Result<Option<u64>, MaintenanceError>> + Send;

        /// One bounded cleanup pass of at least one row.
        fn cleanup(
            internal: Internal,
            learned: &Learned,
            pool: &sqlx::PgPool,
            config: &PostgresConfig,
            maximum_rows: u32,
        ) -> impl Future<Output = Result<u64, MaintenanceError>> + Send;
    }
}

/// A quota limiter stored in PostgreSQL and shared by every replica using the same database,
/// for one algorithm: anchored fixed windows for [`FixedWindowPolicy`] checks (named
/// [`PostgresLimiter`](crate::PostgresLimiter)) or GCRA for [`GcraPolicy`] checks (named
/// [`PostgresGcraLimiter`](crate::PostgresGcraLimiter)).
///
/// Use those two names; this is the type they stand for. Their pages describe each
/// algorithm's protocol, time, capacity and cleanup. Both share this surface, the transaction
/// skeleton, the failure classification of [`CheckError`] and the rules of
/// `runlimit_core::backend`.
///
/// # Cancel safety
///
/// Quota is evaluated only when a returned future is first polled; creating and dropping an
/// unpolled future consumes nothing. Dropping a future before it sends `COMMIT` rolls the
/// transaction back (the connection is closed instead of returned to the pool, and the server
/// rolls back when the session ends). Dropping it while `COMMIT` is in flight leaves the
/// outcome unknown, like [`CheckError::CommitTimeout`]. An outer timeout should allow for
/// [`pool_acquire_timeout`](PostgresConfig::pool_acquire_timeout) plus
/// [`operation_timeout`](PostgresConfig::operation_timeout) plus scheduling overhead.
pub struct PostgresStore<P, O = ()> {
    pool: PgPool,
    config: PostgresConfig,
    observer: O,
    learned: Arc<sealed::Learned>,
    policy: PhantomData<fn() -> P>,
}

impl<P: PostgresAlgorithm> PostgresStore<P, ()> {
    /// A limiter on `pool` with the default [`PostgresConfig`] and no observer.
    ///
    /// Run [`migrate`](Self::migrate) (or the vendored migrations) before serving traffic.
    #[must_use]
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            config: PostgresConfig::default(),
            observer: (),
            learned: Arc::default(),
            policy: PhantomData,
        }
    }
}

impl<P, O> PostgresStore<P, O> {
    /// The largest batch [`check_all`](Self::check_all) accepts: 64 checks. Larger batches
    /// fail with [`BatchError::TooManyChecks`](runlimit_core::BatchError::TooManyChecks).
    pub const MAX_BATCH_SIZE: usize = 64;

    /// Replaces the configuration (timeouts and the operational rows-per-shard bound).
    #[must_use]
    pub fn with_config(mut self, config: PostgresConfig) -> Self {
        self.config = config;
        self
    }

    /// Replaces the observer. It receives one [`Observation`](runlimit_core::Observation) per
    /// admission and cleanup, synchronously, after the transaction is committed or rolled
    /// back. Observer panics are caught.
    #[must_use]
    pub fn with_observer<O2: Observer>(self, observer: O2) -> PostgresStore<P, O2> {
        PostgresStore {
            pool: self.pool,
            config: self.config,
            observer,
            learned: self.learned,
            policy: PhantomData,
        }
    }

    /// The connection pool.
    #[must_use]
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &PostgresConfig {
        &self.config
    }

    /// The observer.
    #[must_use]
    pub fn observer(&self) -> &O {
        &self.observer
    }
}

impl<P: PostgresAlgorithm, O: Observer> PostgresStore<P, O> {
    /// Applies the algorithm's bundled migrations, tolerating versions owned by other
    /// migrators that share SQLx's `_sqlx_migrations` history (`ignore_missing`): the
    /// fixed-window stream ([`MIGRATOR`](crate::MIGRATOR)) or the GCRA stream
    /// ([`GCRA_MIGRATOR`](crate::GCRA_MIGRATOR)), each installing only its own tables.
    ///
    /// Runs on a dedicated connection detached from the pool and closed afterwards, so SQLx's
    /// session-level migration advisory lock can never leak back into the pool when a
    /// migration fails. Not bounded by the operation timeout: a migration may rewrite a table
    /// under an `ACCESS EXCLUSIVE` lock. Idempotent: applied versions are skipped after their
    /// checksum is verified. The future is `Send`, so migrating can run on a spawned task. See
    /// the [operations guide](crate::operations#migrations) for sharing the history with a
    /// host application.
    ///
    /// # Errors
    ///
    /// [`MigrationError::PoolTimeout`] / [`MigrationError::Acquire`] when no connection can be
    /// acquired; [`MigrationError::Migrate`] when SQLx's migrator fails (for example
    /// `VersionMismatch` for a version another migrator applied with different SQL).
    pub async fn migrate(&self) -> Result<(), MigrationError> {
        let migrator = P::migrator(sealed::Internal::new());
        match P::fresh_install(sealed::Internal::new()) {
            None => run_migrator(&self.pool, &self.config, &migrator).await,
            Some((fresh, learn)) => {
                if run_migrator_then(&self.pool, &self.config, &migrator, Some(fresh)).await? {
                    learn(&self.learned);
                }
                Ok(())
            }
        }
    }

    /// Evaluates one check, consuming its [`cost`](runlimit_core::Check::cost) when allowed.
    ///
    /// # Errors
    ///
    /// Every [`CheckError`] variant; see its docs for when each occurs and
    /// [`CheckError::consumption`] for whether quota may have been consumed. A denial is not an
    /// error: it is an `Ok` [`Decision`]. An enforced or shadow denial is returned even if the
    /// rollback that follows it fails (that connection is then closed instead of reused). A
    /// stored state no evaluation could have produced is a [`CheckError::MalformedResponse`].
    ///
    /// # Cancel safety
    ///
    /// See the [type docs](Self#cancel-safety).
    pub async fn check(&self, check: &Check<'_, P>) -> Result<Decision, CheckError> {
        let started = Instant::now();
        let checks = std::slice::from_ref(check);
        let mode = check.policy().quota_mode();
        let result = transaction::run(&self.pool, &self.config, async |connection, deadline| {
            P::admit(sealed::Internal::new(), &self.learned, connection, deadline, &self.config, checks, mode)
                .await
        })
        .await;
        finish_check(&self.observer, check.policy(), result, started)
    }

    /// Evaluates an atomic batch of at most [`MAX_BATCH_SIZE`](Self::MAX_BATCH_SIZE) checks
    /// in one transaction, at one database time: when every check is allowed all are committed
    /// together and the allowances keep input order; otherwise nothing is consumed and the
    /// decision names the deciding index (the rule of `runlimit_core::backend::batch`: under
    /// enforcement the first denial in input order, whatever its reason; in shadow mode a
    /// storage denial wins over every shadow denial, because storage capacity fails closed in
    /// every mode).
    ///
    /// # Errors
    ///
    /// [`BatchCheckError::InvalidBatch`] for a structurally invalid batch (empty, too large,
    /// mixed quota modes, duplicate keys; checked before any connection is acquired),
    /// otherwise [`BatchCheckError::Check`] with the same failures as [`check`](Self::check).
    ///
    /// # Cancel safety
    ///
    /// See the [type docs](Self#cancel-safety).
    pub async fn check_all(&self, checks: &[Check<'_, P>]) -> Result<BatchDecision, BatchCheckError> {
        let started = Instant::now();
        let mode = validate(&self.observer, checks, Self::MAX_BATCH_SIZE, started)?;
        let result = transaction::run(&self.pool, &self.config, async |connection, deadline| {
            P::admit(sealed::Internal::new(), &self.learned, connection, deadline, &self.config, checks, mode)
                .await
        })
        .await;
        finish_batch(&self.observer, checks, result, started)
    }

    /// The subject's quota now, without consuming, creating or changing anything.
    ///
    /// One round trip on a pooled connection: a `READ ONLY` transaction (the server rejects
    /// any write in it) that reads the subject's row without locking it, samples the database
    /// clock, and rolls back. The snapshot is decided by the same rule as a check at that
    /// instant (`runlimit_core::backend::fixed_window::peek` or `gcra::peek`), but it is only a
    /// snapshot: a concurrent check, on this replica or another, may change the row at once,
    /// so never admit on it. No capacity slot is taken and nothing is reported to the
    /// observer.
    ///
    /// # Errors
    ///
    /// The pre-commit [`CheckError`] variants ([`PoolTimeout`](CheckError::PoolTimeout),
    /// [`Acquire`](CheckError::Acquire), [`Timeout`](CheckError::Timeout),
    /// [`Database`](CheckError::Database), [`MalformedResponse`](CheckError::MalformedResponse)
    /// for a stored row no check could have written); a peek never consumes, so
    /// [`CheckError::consumption`] is always `NotConsumed`.
    pub async fn peek(&self, subject: PolicySubject<'_, P>) -> Result<QuotaSnapshot, CheckError> {
        let key = Check::new(subject).counter_key().to_bytes();
        transaction::run(&self.pool, &self.config, async |connection, deadline| {
            P::peek(
                sealed::Internal::new(),
                &self.learned,
                connection,
                deadline,
                &self.config,
                subject.policy(),
                &key,
            )
            .await
        })
        .await
    }

    /// Removes the subject's row for its policy and returns whether it held live state (an
    /// expired row not yet cleaned up is deleted too, and reported as `false`). The capacity
    /// ledger's trigger frees the row's slot in the same transaction, and the next check of the
    /// subject behaves as for a fresh key. Quota mode is not part of the key: a reset through a
    /// shadow policy clears the enforced counter too.
    ///
    /// One transaction of two round trips that takes the lock an admission of the key takes
    /// first (the key's advisory lock for fixed windows, its shard's ledger row for GCRA), so
    /// it waits for an admission in flight and the next one sees the row gone. Reported to the
    /// observer as [`Observation::Reset`](runlimit_core::Observation::Reset).
    ///
    /// # Errors
    ///
    /// Every [`MaintenanceError`] variant; only the commit-outcome-unknown ones
    /// ([`MaintenanceError::may_have_removed_rows`]) may have deleted the row.
    pub async fn reset(&self, subject: PolicySubject<'_, P>) -> Result<bool, MaintenanceError> {
        let started = Instant::now();
        let key = Check::new(subject).counter_key().to_bytes();
        let result = transaction::maintain(&self.pool, &self.config, async |connection, deadline| {
            P::reset(sealed::Internal::new(), &self.learned, connection, deadline, &self.config, &key).await
        })
        .await
        .map(|live| live == 1);
        finish_reset(&self.observer, subject.policy(), &result, started);
        result
    }

    /// Deletes at most `maximum_rows` expired rows, oldest expiry first, freeing their
    /// capacity-ledger slots, and returns how many were deleted. Expired rows never affect
    /// decisions; cleanup only reclaims storage and capacity, so schedule it periodically (see
    /// the [operations guide](crate::operations#cleanup)). Each algorithm's page describes its
    /// pass. `maximum_rows == 0` returns `Ok(0)` without touching the database.
    ///
    /// # Errors
    ///
    /// Every [`MaintenanceError`] variant; only the commit-outcome-unknown ones
    /// ([`MaintenanceError::may_have_removed_rows`]) may have deleted rows.
    pub async fn cleanup_expired(&self, maximum_rows: u32) -> Result<u64, MaintenanceError> {
        let started = Instant::now();
        let result = if maximum_rows == 0 {
            Ok(0)
        } else {
            P::cleanup(sealed::Internal::new(), &self.learned, &self.pool, &self.config, maximum_rows).await
        };
        finish_cleanup(&self.observer, maximum_rows, result, started)
    }
}

impl<O: Observer> PostgresStore<GcraPolicy, O> {
    /// Switches the database's GCRA admissions from the ledger-lock protocol to the row-lock
    /// protocol, and returns whether this call switched (`false`: it already was). Call it once
    /// every replica using the database runs this release or a later one (a replica of an earlier
    /// release fails closed from then on: its admissions, peeks and resets return errors and
    /// consume nothing, and its cleanup passes find nothing to clean). Idempotent and safe to
    /// call from several replicas at once.
    ///
    /// Until the switch, every admission locks its shards' rows of the capacity ledger, so
    /// admissions of keys in one shard (of 256) are serialized. After it, a check of one stored
    /// key is a single row update, with no shard-wide lock, which costs PostgreSQL about a
    /// seventh less CPU per check (see the crate README's figures); batches, new keys, cleanup and
    /// reset still lock their shards. Every
    /// guarantee holds under both protocols: database time clamped to a per-shard watermark,
    /// capacity bounds, all-or-nothing batches, and the consumption classification of errors.
    /// [`migrate`](Self::migrate) switches a database it installs the GCRA tables on, since no
    /// replica has used it yet (a replica of an earlier release that installs them at the same
    /// moment fails closed afterwards, like any earlier replica after a switch). See the
    /// [operations guide](crate::operations#switching-gcra-to-row-locks).
    ///
    /// One transaction: the switch locks every ledger row of the ledger-lock protocol in
    /// ascending shard order (waiting for the admissions in flight, within the
    /// [operation timeout](PostgresConfig::operation_timeout)), moves the rows, with their counts
    /// and watermarks (each at least the switch's own clock sample), to the row-lock ledger, and
    /// commits.
    ///
    /// # Errors
    ///
    /// Every [`MaintenanceError`] variant, [`MaintenanceError::Timeout`] when admissions held the
    /// ledger longer than the operation timeout (nothing changed; call it again). The database
    /// must hold migration `20250701000003` ([`migrate`](Self::migrate) applies it); without it,
    /// [`MaintenanceError::Database`].
    pub async fn switch_to_row_locks(&self) -> Result<bool, MaintenanceError> {
        let switched = crate::gcra::switch_to_row_locks(&self.pool, &self.config).await?;
        self.learned.set_row_locks();
        Ok(switched)
    }
}

impl<P, O: Clone> Clone for PostgresStore<P, O> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            config: self.config,
            observer: self.observer.clone(),
            learned: Arc::clone(&self.learned),
            policy: PhantomData,
        }
    }
}

impl<P: PostgresAlgorithm, O> fmt::Debug for PostgresStore<P, O> {
    /// `PostgresLimiter { config: .. }` or `PostgresGcraLimiter { config: .. }`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(P::NAME).field("config", &self.config).finish_non_exhaustive()
    }
}

impl<P: PostgresAlgorithm, O: Observer> Limiter for PostgresStore<P, O> {
    type Policy = P;
    type CheckError = CheckError;
    type CheckAllError = BatchCheckError;

    fn check(&self, check: &Check<'_, P>) -> impl Future<Output = Result<Decision, CheckError>> + Send {
        Self::check(self, check)
    }

    fn check_all(
        &self,
        checks: &[Check<'_, P>],
    ) -> impl Future<Output = Result<BatchDecision, BatchCheckError>> + Send {
        Self::check_all(self, checks)
    }
}

/// Peeks and resets of a [`PostgresStore`]; see [`PostgresStore::peek`] and
/// [`PostgresStore::reset`].
impl<P: PostgresAlgorithm, O: Observer> QuotaControl for PostgresStore<P, O> {
    type PeekError = CheckError;
    type ResetError = MaintenanceError;

    fn peek(
        &self,
        subject: PolicySubject<'_, P>,
    ) -> impl Future<Output = Result<QuotaSnapshot, CheckError>> + Send {
        Self::peek(self, subject)
    }

    fn reset(
        &self,
        subject: PolicySubject<'_, P>,
    ) -> impl Future<Output = Result<bool, MaintenanceError>> + Send {
        Self::reset(self, subject)
    }
}

#[cfg(test)]
mod tests {
    use sqlx::postgres::PgPoolOptions;

    use crate::{PostgresGcraLimiter, PostgresLimiter, attempts::PostgresAttemptLimiter};

    fn assert_send<T: Send>(_: &T) {}

    /// `tokio::spawn(async move { limiter.migrate().await })` compiles for all three limiters
    /// (it did not while `migrate` awaited SQLx's `Migrator::run` on a connection). A compile
    /// test: the spawned tasks are aborted before they connect anywhere.
    #[tokio::test]
    async fn migrate_futures_are_send() {
        let pool = PgPoolOptions::new().connect_lazy("postgres://runlimit@127.0.0.1:1/none").unwrap();
        let fixed = PostgresLimiter::new(pool.clone());
        let gcra = PostgresGcraLimiter::new(pool.clone());
        let attempts = PostgresAttemptLimiter::new(pool);
        assert_send(&fixed.migrate());
        assert_send(&gcra.migrate());
        assert_send(&attempts.migrate());
        let spawned = [
            tokio::spawn(async move { fixed.migrate().await }),
            tokio::spawn(async move { gcra.migrate().await }),
            tokio::spawn(async move { attempts.migrate().await }),
        ];
        for task in spawned {
            task.abort();
        }
    }
}
