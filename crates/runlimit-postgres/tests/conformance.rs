//! The shared conformance suite (`runlimit-conformance`) on PostgreSQL, one binary.
//!
//! Each generated test runs one scenario in its own fresh database (`postgres/support.rs`,
//! named after the scenario), migrated on a direct pool, with the database clock pinned
//! (`postgres/clock.rs`): the limiter under test runs on a pool whose connections go through
//! a proxy that turns every `pg_catalog.clock_timestamp()` into a read of the pinned instant,
//! which only the scenario's `advance` moves. The database is dropped when the scenario passes
//! and kept for inspection when it fails. The tests are `#[ignore]`d so a plain `cargo test`
//! needs no server. Run them with
//!
//! ```text
//! RUNLIMIT_POSTGRES_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!     cargo test -p runlimit-postgres --test conformance -- --include-ignored
//! ```

#[path = "postgres/clock.rs"]
mod clock;
#[path = "postgres/support.rs"]
mod support;

use std::sync::Arc;

use runlimit_conformance::{AttemptBackend, QuotaBackend};
use runlimit_core::{
    AttemptSubject, FixedWindowPolicy, GcraPolicy, KeyHasher, Observer, SubjectKey,
    attempts::{AttemptCompletionResult, AttemptDecision, AttemptObserver, AttemptOutcome, AttemptPolicy},
};
use runlimit_postgres::{
    PostgresAlgorithm, PostgresConfig, PostgresStore,
    attempts::{PostgresAttemptLimiter, PostgresAttemptReceipt},
};
use sqlx::{PgPool, postgres::PgPoolOptions};

use crate::{clock::PinnedClock, support::TestDatabase};

/// Connections of the direct pool (migrations, storage resets).
const DIRECT_CONNECTIONS: u32 = 2;
/// Connections of the proxied pool the limiter under test uses.
const PROXIED_CONNECTIONS: u32 = 4;
/// The capacity shard of every key [`QuotaBackend::subjects_in_one_shard`] hands out.
const SHARED_SHARD: u8 = 0xC3;
/// `TestDatabase::create` prefixes `runlimit_pg_`; PostgreSQL names hold 63 bytes.
const MAX_NAME: usize = 63 - "runlimit_pg_".len();

/// The test database name (without `TestDatabase`'s prefix) for the scenario `name` the suite
/// passes (`<family>::<scenario>`): `cf_<family tag>_<scenario>` in lowercase ASCII letters,
/// digits and underscores; when that is longer than PostgreSQL allows, or sanitizing changed
/// anything, it is cut and suffixed with a stable hash of the full name.
fn database_name(name: &str) -> String {
    let short = [("fixed_window::", "fw_"), ("gcra::", "gcra_"), ("attempts::", "att_")]
        .iter()
        .find_map(|(family, tag)| name.strip_prefix(family).map(|scenario| format!("cf_{tag}{scenario}")))
        .unwrap_or_else(|| format!("cf_{name}"));
    let sanitized: String =
        short.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' }).collect();
    if sanitized.len() <= MAX_NAME && sanitized == short {
        return sanitized;
    }
    // FNV-1a over the full name: stable across runs and platforms, so distinct names that
    // sanitize or truncate alike still get distinct databases.
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    let suffix = format!("_{:08x}", hash >> 32);
    let keep = sanitized.len().min(MAX_NAME - suffix.len());
    format!("{}{suffix}", &sanitized[..keep])
}

/// One scenario's database, pinned clock and pools.
struct Environment {
    database: TestDatabase,
    clock: PinnedClock,
    /// Direct to the server: migrations and storage resets, on the real clock.
    direct: PgPool,
    /// Through the clock's proxy: the limiter under test.
    proxied: PgPool,
}

impl Environment {
    /// Creates the database, runs `migrate` on a direct pool, pins the clock and opens the
    /// proxied pool.
    async fn create(name: &str, migrate: impl AsyncFnOnce(&PgPool)) -> Self {
        let database = TestDatabase::create(&database_name(name)).await;
        let direct = database.pool(DIRECT_CONNECTIONS).await;
        migrate(&direct).await;
        let clock = PinnedClock::install(&database).await;
        let proxied = database
            .pool_with(PgPoolOptions::new().max_connections(PROXIED_CONNECTIONS), clock.options())
            .await;
        Self { database, clock, direct, proxied }
    }

    /// Deletes every row of `table` through the table, so the statement-level ledger triggers
    /// keep the shard counts exact, and checks that `ledger` (if any) counts zero rows again.
    async fn empty(&self, table: &str, ledger: Option<&str>) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DELETE FROM {table}")))
            .execute(&self.direct)
            .await
            .unwrap_or_else(|error| panic!("empty {table}: {error}"));
        if let Some(ledger) = ledger {
            let counted: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "SELECT COALESCE(pg_catalog.sum(row_count), 0)::bigint FROM {ledger}"
            )))
            .fetch_one(&self.direct)
            .await
            .unwrap_or_else(|error| panic!("read {ledger}: {error}"));
            assert_eq!(counted, 0, "{ledger} still counts rows after emptying {table}");
        }
    }

    /// Closes the pools and drops the database: call it only after the scenario passed.
    async fn finish(self) {
        let Self { database, clock, direct, proxied } = self;
        proxied.close().await;
        direct.close().await;
        clock.close().await;
        database.finish().await;
    }
}

/// A runtime per scenario, as `#[tokio::test(flavor = "multi_thread", worker_threads = 2)]`.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("build a tokio runtime")
}

/// `PostgresConfig` with the rows-per-shard bound of a bounded scenario.
fn bounded_config(keys_per_shard: usize) -> PostgresConfig {
    let rows = u32::try_from(keys_per_shard).expect("keys per shard fits u32");
    PostgresConfig::default()
        .with_maximum_rows_per_shard(rows)
        .unwrap_or_else(|error| panic!("bounded({keys_per_shard}): {error}"))
}

/// `count` distinct subject keys whose first byte, the capacity shard, is [`SHARED_SHARD`].
fn keys_in_one_shard(count: usize) -> Vec<SubjectKey> {
    (0..u64::try_from(count).expect("count fits u64")).map(|n| support::subject(SHARED_SHARD, n)).collect()
}

/// The tables a quota algorithm stores its state in.
trait Tables: PostgresAlgorithm {
    /// The counter table and its capacity ledger (`ledger_locks`: the GCRA ledger-lock protocol's).
    fn tables(ledger_locks: bool) -> (&'static str, &'static str);
}

impl Tables for FixedWindowPolicy {
    fn tables(_: bool) -> (&'static str, &'static str) {
        ("public.runlimit_fixed_windows", "public.runlimit_fixed_window_shards")
    }
}

impl Tables for GcraPolicy {
    // The shard watermarks stay when the table is emptied: they are at most the pinned
    // instant, the same clock.
    fn tables(ledger_locks: bool) -> (&'static str, &'static str) {
        let ledger = if ledger_locks { "public.runlimit_gcra_shards" } else { "public.runlimit_gcra_ledger" };
        ("public.runlimit_gcra", ledger)
    }
}

/// The observer a quota limiter under the suite reports to until a scenario installs its own.
fn no_observer() -> Arc<dyn Observer> {
    Arc::new(())
}

/// The observer an attempt limiter under the suite reports to until a scenario installs its own.
fn no_attempt_observer() -> Arc<dyn AttemptObserver> {
    Arc::new(())
}

/// A quota harness: [`PostgresStore`] for policy `P` through the pinned clock. The
/// fixed-window and GCRA limiters are one type, so they are one harness. `LEDGER_LOCKS`: GCRA on
/// a database an earlier release installed, so on the ledger-lock protocol (without it, a fresh
/// database, which `migrate` switches to row locks).
pub(crate) struct PostgresQuota<P, const LEDGER_LOCKS: bool = false> {
    environment: Environment,
    limiter: PostgresStore<P, Arc<dyn Observer>>,
}

/// `PostgresLimiter` under the suite.
pub(crate) type PostgresFixedWindow = PostgresQuota<FixedWindowPolicy>;
/// `PostgresGcraLimiter` under the suite, on the row-lock protocol.
pub(crate) type PostgresGcra = PostgresQuota<GcraPolicy>;
/// `PostgresGcraLimiter` under the suite, on the ledger-lock protocol.
pub(crate) type PostgresGcraLedgerLocks = PostgresQuota<GcraPolicy, true>;

impl<P: Tables, const LEDGER_LOCKS: bool> QuotaBackend for PostgresQuota<P, LEDGER_LOCKS> {
    type Policy = P;
    type Limiter = PostgresStore<P, Arc<dyn Observer>>;

    const MAX_BATCH_SIZE: usize = PostgresStore::<P>::MAX_BATCH_SIZE;
    const REPORTS_STORAGE_RETRY: bool = false;

    fn run<F>(name: &'static str, scenario: F)
    where
        F: AsyncFnOnce(&mut Self),
    {
        runtime().block_on(async {
            let name = if LEDGER_LOCKS { format!("ll_{name}") } else { name.to_owned() };
            let environment = Environment::create(&name, async |pool: &PgPool| {
                if LEDGER_LOCKS {
                    support::migrate_gcra_as_earlier_release(pool).await;
                }
                PostgresStore::<P>::new(pool.clone()).migrate().await.expect("migrate");
            })
            .await;
            let limiter = PostgresStore::new(environment.proxied.clone()).with_observer(no_observer());
            let mut backend = Self { environment, limiter };
            scenario(&mut backend).await;
            backend.environment.finish().await;
        });
    }

    fn limiter(&self) -> &Self::Limiter {
        &self.limiter
    }

    async fn bounded(&mut self, keys_per_shard: usize) {
        let (table, ledger) = P::tables(LEDGER_LOCKS);
        self.environment.empty(table, Some(ledger)).await;
        self.limiter = PostgresStore::new(self.environment.proxied.clone())
            .with_config(bounded_config(keys_per_shard))
            .with_observer(no_observer());
    }

    async fn observed(&mut self, observer: Arc<dyn Observer>) {
        let (table, ledger) = P::tables(LEDGER_LOCKS);
        self.environment.empty(table, Some(ledger)).await;
        self.limiter = PostgresStore::new(self.environment.proxied.clone()).with_observer(observer);
    }

    fn subjects_in_one_shard(&self, count: usize) -> Vec<SubjectKey> {
        keys_in_one_shard(count)
    }

    async fn advance(&mut self, millis: u64) {
        self.environment.clock.advance(millis).await;
    }

    async fn reclaim_expired(&mut self) {
        self.limiter.cleanup_expired(1_000).await.expect("cleanup_expired");
    }
}

/// The attempt harness: [`PostgresAttemptLimiter`] through the pinned clock.
pub(crate) struct PostgresAttempts {
    environment: Environment,
    limiter: PostgresAttemptLimiter<Arc<dyn AttemptObserver>>,
}

impl AttemptBackend for PostgresAttempts {
    type Receipt = PostgresAttemptReceipt;

    fn run<F>(name: &'static str, scenario: F)
    where
        F: AsyncFnOnce(&mut Self),
    {
        runtime().block_on(async {
            let environment = Environment::create(name, async |pool: &PgPool| {
                PostgresAttemptLimiter::new(pool.clone())
                    .migrate()
                    .await
                    .expect("migrate the attempt tables");
            })
            .await;
            let limiter =
                PostgresAttemptLimiter::new(environment.proxied.clone()).with_observer(no_attempt_observer());
            let mut backend = Self { environment, limiter };
            scenario(&mut backend).await;
            backend.environment.finish().await;
        });
    }

    async fn acquire(&mut self, subject: &AttemptSubject<'_>) -> AttemptDecision<Self::Receipt> {
        self.limiter.acquire(subject).await.unwrap_or_else(|error| panic!("acquire failed: {error:?}"))
    }

    async fn complete(&mut self, receipt: Self::Receipt, outcome: AttemptOutcome) -> AttemptCompletionResult {
        self.limiter
            .complete(receipt, outcome)
            .await
            .unwrap_or_else(|error| panic!("complete failed: {error:?}"))
    }

    async fn reset(&mut self, subject: &AttemptSubject<'_>) -> bool {
        self.limiter.reset(subject).await.unwrap_or_else(|error| panic!("reset failed: {error:?}"))
    }

    async fn advance(&mut self, millis: u64) {
        self.environment.clock.advance(millis).await;
    }

    async fn bounded(&mut self, subjects_per_shard: usize) {
        // No ledger: a row's slot is its capacity, so the rows are the whole count.
        self.environment.empty("public.runlimit_attempts", None).await;
        self.limiter = PostgresAttemptLimiter::new(self.environment.proxied.clone())
            .with_config(bounded_config(subjects_per_shard))
            .with_observer(no_attempt_observer());
    }

    async fn observed(&mut self, observer: Arc<dyn AttemptObserver>) {
        self.environment.empty("public.runlimit_attempts", None).await;
        self.limiter = PostgresAttemptLimiter::new(self.environment.proxied.clone()).with_observer(observer);
    }

    fn subjects_in_one_shard(
        &self,
        hasher: &KeyHasher,
        policy: &AttemptPolicy,
        count: usize,
    ) -> Vec<Vec<u8>> {
        // The shard is byte 32 of the 64-byte key (the first subject-key byte), as
        // `tests/attempts.rs` finds one: hash inputs until the shard matches the first's.
        let shard = |input: &[u8]| hasher.hash_attempt_for(policy, input).counter_key().to_bytes()[32];
        let mut inputs = (0u64..).map(|n| format!("conformance-subject-{n}").into_bytes());
        let first = inputs.next().expect("an endless sequence");
        let target = shard(&first);
        std::iter::once(first).chain(inputs.filter(|input| shard(input) == target)).take(count).collect()
    }
}

/// Checks of the harness itself: naming, and one exact scenario per family written here.
mod harness_checks {
    use std::time::Duration;

    use runlimit_core::{Check, DecisionView, Delay, Denial, PolicyId, ScopeId, attempts::AttemptDenial};

    use super::*;

    fn allowed(view: DecisionView<'_>) -> (u64, u128) {
        let DecisionView::Allowed { allowance } = view else { panic!("expected allowed, got {view:?}") };
        (allowance.available(), allowance.replenishes_after().millis())
    }

    fn retry(view: DecisionView<'_>) -> u128 {
        let DecisionView::Denied { denial: Denial::QuotaExceeded(quota) } = view else {
            panic!("expected a quota denial, got {view:?}")
        };
        quota.retry_after().millis()
    }

    fn storage(view: DecisionView<'_>) -> Option<Delay> {
        let DecisionView::Denied { denial: Denial::StorageCapacity { retry_after } } = view else {
            panic!("expected a storage denial, got {view:?}")
        };
        *retry_after
    }

    #[test]
    fn database_names_fit_and_stay_stable() {
        assert_eq!(database_name("fixed_window::limit_reached"), "cf_fw_limit_reached");
        assert_eq!(database_name("attempts::lease"), "cf_att_lease");
        assert_eq!(database_name("harness_gcra"), "cf_harness_gcra");
        let long = "gcra::a_scenario_name_that_is_much_too_long_for_a_postgres_database";
        let name = database_name(long);
        assert_eq!(name.len(), MAX_NAME);
        assert!(name.starts_with("cf_gcra_a_scenario_name"), "{name}");
        assert_eq!(name, database_name(long));
        assert_ne!(name, database_name(&format!("{long}_2")));
        assert_ne!(database_name("fixed_window::Upper"), database_name("fixed_window::upper"));
        let odd = database_name("a::b-c");
        assert!(odd.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'), "{odd}");
        // Every generated test gets its own database.
        let families = [
            ("fixed_window", runlimit_conformance::fixed_window::SCENARIOS),
            ("gcra", runlimit_conformance::gcra::SCENARIOS),
            ("attempts", runlimit_conformance::attempts::SCENARIOS),
        ];
        let mut names = std::collections::BTreeSet::new();
        for (family, scenarios) in families {
            for scenario in scenarios {
                let name = database_name(&format!("{family}::{scenario}"));
                assert!(name.len() <= MAX_NAME, "{name}");
                assert!(names.insert(name.clone()), "{name} twice");
            }
        }
    }

    #[test]
    #[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
    fn fixed_window_exact_values_and_bounded_storage() {
        PostgresFixedWindow::run("harness_fixed_window", async |backend: &mut PostgresFixedWindow| {
            let policy = support::policy("harness.fixed", 2, Duration::from_millis(1_000));
            let key = support::check(&policy, support::subject(1, 1));
            assert_eq!(allowed(backend.limiter().check(&key).await.unwrap().view()), (1, 1_000));
            assert_eq!(allowed(backend.limiter().check(&key).await.unwrap().view()), (0, 1_000));
            assert_eq!(retry(backend.limiter().check(&key).await.unwrap().view()), 1_000);
            backend.advance(999).await;
            assert_eq!(retry(backend.limiter().check(&key).await.unwrap().view()), 1);
            backend.advance(1).await;
            assert_eq!(allowed(backend.limiter().check(&key).await.unwrap().view()), (1, 1_000));

            backend.bounded(2).await;
            let keys = backend.subjects_in_one_shard(3);
            let checks: Vec<_> = keys.iter().map(|key| support::check(&policy, *key)).collect();
            assert_eq!(allowed(backend.limiter().check(&checks[0]).await.unwrap().view()), (1, 1_000));
            assert_eq!(allowed(backend.limiter().check(&checks[1]).await.unwrap().view()), (1, 1_000));
            assert_eq!(storage(backend.limiter().check(&checks[2]).await.unwrap().view()), None);
            // A key of another shard still has room.
            let other = support::check(&policy, support::subject(SHARED_SHARD.wrapping_add(1), 0));
            assert_eq!(allowed(backend.limiter().check(&other).await.unwrap().view()), (1, 1_000));
            backend.advance(1_000).await;
            assert_eq!(storage(backend.limiter().check(&checks[2]).await.unwrap().view()), None);
            backend.reclaim_expired().await;
            assert_eq!(allowed(backend.limiter().check(&checks[2]).await.unwrap().view()), (1, 1_000));
            let batch = backend.limiter().check_all(&checks[..1]).await.unwrap();
            assert!(batch.permits_request(), "{batch:?}");
        });
    }

    #[test]
    #[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
    fn gcra_exact_values_and_bounded_storage() {
        PostgresGcra::run("harness_gcra", async |backend: &mut PostgresGcra| {
            let policy = GcraPolicy::new(
                PolicyId::new("harness.gcra").unwrap(),
                ScopeId::new("subject").unwrap(),
                3,
                Duration::from_millis(1_000),
                2,
            )
            .unwrap();
            let key = Check::new(support::subject(1, 1).bind(&policy));
            assert_eq!(allowed(backend.limiter().check(&key).await.unwrap().view()), (1, 334));
            assert_eq!(allowed(backend.limiter().check(&key).await.unwrap().view()), (0, 667));
            assert_eq!(retry(backend.limiter().check(&key).await.unwrap().view()), 334);
            backend.advance(333).await;
            assert_eq!(retry(backend.limiter().check(&key).await.unwrap().view()), 1);

            backend.bounded(1).await;
            let keys = backend.subjects_in_one_shard(2);
            let checks: Vec<_> = keys.iter().map(|key| Check::new(key.bind(&policy))).collect();
            assert_eq!(allowed(backend.limiter().check(&checks[0]).await.unwrap().view()), (1, 334));
            assert_eq!(storage(backend.limiter().check(&checks[1]).await.unwrap().view()), None);
            backend.advance(334).await;
            backend.reclaim_expired().await;
            assert_eq!(allowed(backend.limiter().check(&checks[1]).await.unwrap().view()), (1, 334));
        });
    }

    #[test]
    #[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
    fn attempts_exact_values_and_bounded_storage() {
        PostgresAttempts::run("harness_attempts", async |backend: &mut PostgresAttempts| {
            let policy = AttemptPolicy::new(
                PolicyId::new("harness.attempts").unwrap(),
                ScopeId::new("identity").unwrap(),
                Duration::from_millis(1_000),
                Duration::from_millis(8_000),
                Duration::from_millis(60_000),
                Duration::from_millis(5_000),
            )
            .unwrap();
            let hasher = KeyHasher::new(&[3; 32]).unwrap();
            let subject = hasher.hash_attempt_for(&policy, b"alice");
            let AttemptDecision::Admitted(receipt) = backend.acquire(&subject).await else { panic!() };
            assert_eq!(
                backend.acquire(&subject).await.denial(),
                Some(AttemptDenial::InProgress { retry_after: Delay::from_millis(5_000) })
            );
            backend.advance(10).await;
            assert_eq!(
                backend.complete(receipt, AttemptOutcome::Failure).await,
                AttemptCompletionResult::FailureRecorded {
                    consecutive_failures: 1,
                    retry_after: Delay::from_millis(1_000)
                }
            );
            backend.advance(999).await;
            assert_eq!(
                backend.acquire(&subject).await.denial(),
                Some(AttemptDenial::Backoff { retry_after: Delay::from_millis(1), consecutive_failures: 1 })
            );

            backend.bounded(1).await;
            let inputs = backend.subjects_in_one_shard(&hasher, &policy, 2);
            assert_eq!(inputs.len(), 2);
            let subjects: Vec<_> =
                inputs.iter().map(|input| hasher.hash_attempt_for(&policy, input)).collect();
            assert_eq!(subjects[0].counter_key().to_bytes()[32], subjects[1].counter_key().to_bytes()[32]);
            let AttemptDecision::Admitted(_) = backend.acquire(&subjects[0]).await else { panic!() };
            assert_eq!(
                backend.acquire(&subjects[1]).await.denial(),
                Some(AttemptDenial::StorageCapacity { retry_after: Some(Delay::from_millis(65_000)) })
            );
            // The lapsed lease is a failure at +5 s; the row is quiet at +65 s and reclaimed by
            // the next admission of its shard.
            backend.advance(65_000).await;
            assert!(matches!(backend.acquire(&subjects[1]).await, AttemptDecision::Admitted(_)));
        });
    }

    /// Unpacks a denial.
    trait DenialOf {
        fn denial(self) -> Option<AttemptDenial>;
    }

    impl<R> DenialOf for AttemptDecision<R> {
        fn denial(self) -> Option<AttemptDenial> {
            match self {
                Self::Admitted(_) => None,
                Self::Denied(denial) => Some(denial),
            }
        }
    }
}

mod conformance {
    use super::*;

    runlimit_conformance::fixed_window_scenarios!(
        PostgresFixedWindow,
        #[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
    );
    runlimit_conformance::gcra_scenarios!(PostgresGcra, #[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]);

    mod ledger_locks {
        use super::*;

        runlimit_conformance::gcra_scenarios!(
            PostgresGcraLedgerLocks,
            #[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
        );
    }
    runlimit_conformance::attempt_scenarios!(
        PostgresAttempts,
        #[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
    );
}
