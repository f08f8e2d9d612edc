//! PostgreSQL integration tests for `PostgresAttemptLimiter`, one binary.
//!
//! Every test needs `RUNLIMIT_POSTGRES_TEST_DATABASE_URL` and runs in its own fresh database
//! (the harness of the fixed-window suite, `postgres/support.rs`). PostgreSQL time cannot be
//! stepped, so "advancing the clock by d" moves every stored instant d milliseconds into the
//! past; delays recorded by a completion are exact, while a denial's remaining delay is checked
//! within the few real milliseconds the test itself takes. Run them with
//!
//! ```text
//! RUNLIMIT_POSTGRES_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!     cargo test -p runlimit-postgres --all-features --test postgres attempts:: -- --include-ignored
//! ```

use crate::support;

use std::{sync::Arc, time::Duration};

use runlimit_core::{
    AttemptSubject, ConsumptionStatus, Delay, KeyHasher, PolicyId, ScopeId,
    attempts::{
        AttemptCompletionResult, AttemptDecision, AttemptDenial, AttemptDenialReason, AttemptEvent,
        AttemptObservation, AttemptObserver, AttemptOperation, AttemptOutcome, AttemptPolicy,
    },
};
use runlimit_memory::{ManualClock, MemoryAttemptLimiter, MemoryStoreConfig};
use runlimit_postgres::{
    CheckError, CheckPhase, PostgresConfig,
    attempts::{
        AttemptClaim, AttemptClaimResult, CREATE_RUNLIMIT_ATTEMPTS_SQL, PostgresAttemptLimiter,
        PostgresAttemptReceipt,
    },
};
use sqlx::{Connection, PgConnection, postgres::PgPoolOptions};
use support::{Cut, Proxy, TestDatabase};

/// initial 1 s, cap 8 s, quiet 60 s, lease 5 s.
fn policy() -> AttemptPolicy {
    AttemptPolicy::new(
        PolicyId::new("auth.password").unwrap(),
        ScopeId::new("identity").unwrap(),
        Duration::from_secs(1),
        Duration::from_secs(8),
        Duration::from_secs(60),
        Duration::from_secs(5),
    )
    .unwrap()
}

fn hasher() -> KeyHasher {
    KeyHasher::new(&[9; 32]).unwrap()
}

async fn limiter(database: &TestDatabase, connections: u32) -> PostgresAttemptLimiter {
    let limiter = PostgresAttemptLimiter::new(database.pool(connections).await);
    limiter.migrate().await.expect("migrate");
    limiter
}

/// Moves every stored instant `millis` into the past: the clock "advances" by `millis`.
async fn advance(connection: &mut PgConnection, millis: i64) {
    sqlx::query(
        "UPDATE public.runlimit_attempts SET last_failure_at_ms = last_failure_at_ms - $1, \
         lease_deadline_ms = lease_deadline_ms - $1, expires_at_ms = expires_at_ms - $1",
    )
    .bind(millis)
    .execute(connection)
    .await
    .expect("advance");
}

async fn rows(connection: &mut PgConnection) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM public.runlimit_attempts").fetch_one(connection).await.unwrap()
}

async fn admit(limiter: &PostgresAttemptLimiter, subject: &AttemptSubject<'_>) -> PostgresAttemptReceipt {
    match limiter.acquire(subject).await.expect("acquire") {
        AttemptDecision::Admitted(receipt) => receipt,
        AttemptDecision::Denied(denial) => panic!("expected admission, got {denial:?}"),
    }
}

async fn denial(limiter: &PostgresAttemptLimiter, subject: &AttemptSubject<'_>) -> AttemptDenial {
    match limiter.acquire(subject).await.expect("acquire") {
        AttemptDecision::Admitted(receipt) => panic!("expected denial, got {receipt:?}"),
        AttemptDecision::Denied(denial) => denial,
    }
}

/// A denial, with its remaining delay rounded up to whole seconds (the test takes well under a
/// second between the instants it compares).
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    InProgress(u64),
    Backoff(u32, u64),
    StorageCapacity(Option<u64>),
}

fn seen(denial: AttemptDenial) -> Seen {
    match denial {
        AttemptDenial::InProgress { retry_after } => Seen::InProgress(retry_after.seconds()),
        AttemptDenial::Backoff { retry_after, consecutive_failures } => {
            Seen::Backoff(consecutive_failures, retry_after.seconds())
        }
        AttemptDenial::StorageCapacity { retry_after } => {
            Seen::StorageCapacity(retry_after.map(Delay::seconds))
        }
    }
}

fn failure(failures: u32, millis: u64) -> AttemptCompletionResult {
    AttemptCompletionResult::FailureRecorded {
        consecutive_failures: failures,
        retry_after: Delay::from_millis(millis),
    }
}

/// One step of a scripted sequence, run against both backends.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// Acquire; complete at once with the outcome (or drop the receipt when `None`).
    Attempt(Option<AttemptOutcome>),
    /// Acquire and keep the receipt to complete later with `Late`.
    Hold,
    /// Complete the held receipt.
    Late(AttemptOutcome),
    /// Acquire, expecting a denial.
    Denied,
    /// Advance the clock.
    Advance(i64),
}

#[derive(Debug, PartialEq, Eq)]
enum Observed {
    Completed(AttemptCompletionResult),
    Dropped,
    Held,
    Denied(Seen),
}

const SEQUENCE: &[Step] = &[
    Step::Attempt(Some(AttemptOutcome::Failure)),
    Step::Denied,
    Step::Advance(1_000),
    Step::Attempt(Some(AttemptOutcome::Failure)),
    Step::Advance(2_000),
    Step::Attempt(Some(AttemptOutcome::Abandoned)),
    Step::Advance(3_000),
    Step::Denied,
    Step::Advance(1_000),
    Step::Attempt(Some(AttemptOutcome::Failure)),
    Step::Advance(8_000),
    Step::Attempt(Some(AttemptOutcome::Failure)),
    Step::Advance(8_000),
    Step::Attempt(None),
    Step::Denied,
    Step::Advance(5_500),
    Step::Denied,
    Step::Advance(8_000),
    Step::Hold,
    Step::Advance(6_000),
    Step::Late(AttemptOutcome::Success),
    Step::Denied,
    Step::Advance(8_000),
    Step::Attempt(Some(AttemptOutcome::Success)),
    Step::Attempt(Some(AttemptOutcome::Failure)),
    Step::Advance(60_000),
    Step::Attempt(Some(AttemptOutcome::Failure)),
];

fn expected() -> Vec<Observed> {
    use Observed::*;
    vec![
        Completed(failure(1, 1_000)),
        Denied(Seen::Backoff(1, 1)),
        Completed(failure(2, 2_000)),
        Completed(failure(3, 4_000)),
        Denied(Seen::Backoff(3, 1)),
        Completed(failure(4, 8_000)),
        Completed(failure(5, 8_000)),
        Dropped,
        Denied(Seen::InProgress(5)),
        // The dropped lease counted as failure 6 at its deadline: 0.5 s later, 7.5 s remain.
        Denied(Seen::Backoff(6, 8)),
        Held,
        // The held lease expired 1 s ago as failure 7; its late success records nothing.
        Completed(AttemptCompletionResult::Stale),
        Denied(Seen::Backoff(7, 7)),
        Completed(AttemptCompletionResult::Reset),
        Completed(failure(1, 1_000)),
        // Quiet period over: forgotten.
        Completed(failure(1, 1_000)),
    ]
}

#[test]
fn the_sequence_on_memory_gives_the_expected_results() {
    let policy = policy();
    let hasher = hasher();
    let subject = hasher.hash_attempt_for(&policy, b"user@example.test");
    let clock = ManualClock::new();
    let limiter =
        MemoryAttemptLimiter::builder(MemoryStoreConfig::new(16).unwrap()).with_clock(clock.clone()).build();
    let mut held = None;
    let mut observed = Vec::new();
    for step in SEQUENCE {
        match *step {
            Step::Attempt(outcome) => {
                let AttemptDecision::Admitted(receipt) = limiter.acquire(&subject).unwrap() else { panic!() };
                observed.push(match outcome {
                    Some(outcome) => Observed::Completed(limiter.complete(receipt, outcome).unwrap()),
                    None => Observed::Dropped,
                });
            }
            Step::Hold => {
                let AttemptDecision::Admitted(receipt) = limiter.acquire(&subject).unwrap() else { panic!() };
                held = Some(receipt);
                observed.push(Observed::Held);
            }
            Step::Late(outcome) => {
                observed.push(Observed::Completed(limiter.complete(held.take().unwrap(), outcome).unwrap()));
            }
            Step::Denied => {
                let AttemptDecision::Denied(denial) = limiter.acquire(&subject).unwrap() else { panic!() };
                observed.push(Observed::Denied(seen(denial)));
            }
            Step::Advance(millis) => clock.advance_millis(u64::try_from(millis).unwrap()),
        }
    }
    assert_eq!(observed, expected());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn the_same_sequence_on_postgres_gives_the_same_results() {
    let database = TestDatabase::create("attempts_sequence").await;
    let limiter = limiter(&database, 2).await;
    let mut connection = database.connection().await;
    let policy = policy();
    let hasher = hasher();
    let subject = hasher.hash_attempt_for(&policy, b"user@example.test");
    let mut held = None;
    let mut observed = Vec::new();
    for step in SEQUENCE {
        match *step {
            Step::Attempt(outcome) => {
                let receipt = admit(&limiter, &subject).await;
                observed.push(match outcome {
                    Some(outcome) => Observed::Completed(limiter.complete(receipt, outcome).await.unwrap()),
                    None => Observed::Dropped,
                });
            }
            Step::Hold => {
                held = Some(admit(&limiter, &subject).await);
                observed.push(Observed::Held);
            }
            Step::Late(outcome) => {
                let result = limiter.complete(held.take().unwrap(), outcome).await.unwrap();
                observed.push(Observed::Completed(result));
            }
            Step::Denied => observed.push(Observed::Denied(seen(denial(&limiter, &subject).await))),
            Step::Advance(millis) => advance(&mut connection, millis).await,
        }
    }
    assert_eq!(observed, expected());
    database.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn many_concurrent_admissions_for_one_subject_admit_exactly_one() {
    let database = TestDatabase::create("attempts_concurrent").await;
    let limiter = Arc::new(limiter(&database, 8).await);
    let policy = Arc::new(policy());
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let limiter = Arc::clone(&limiter);
        let policy = Arc::clone(&policy);
        tasks.push(tokio::spawn(async move {
            let subject = hasher().hash_attempt_for(&policy, b"user@example.test");
            match limiter.acquire(&subject).await.expect("acquire") {
                AttemptDecision::Admitted(receipt) => {
                    drop(receipt);
                    1
                }
                AttemptDecision::Denied(AttemptDenial::InProgress { .. }) => 0,
                AttemptDecision::Denied(other) => panic!("unexpected denial {other:?}"),
            }
        }));
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.unwrap();
    }
    assert_eq!(admitted, 1);
    let mut connection = database.connection().await;
    assert_eq!(rows(&mut connection).await, 1);
    drop(connection);
    database.finish().await;
}

async fn claim(
    limiter: &PostgresAttemptLimiter,
    connection: &mut PgConnection,
    receipt: PostgresAttemptReceipt,
) -> AttemptClaim {
    match limiter.claim_in(connection, receipt).await.expect("claim") {
        AttemptClaimResult::Claimed(claim) => claim,
        AttemptClaimResult::Stale => panic!("stale claim"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn claim_and_finish_inside_a_host_transaction() {
    let database = TestDatabase::create("attempts_seam").await;
    let limiter = limiter(&database, 2).await;
    let policy = policy();
    let hasher = hasher();
    let mut host = database.connection().await;
    let mut other = database.connection().await;

    // Commit: the staged failure takes effect.
    let alice = hasher.hash_attempt_for(&policy, b"alice");
    let receipt = admit(&limiter, &alice).await;
    let mut transaction = host.begin().await.unwrap();
    let claimed = claim(&limiter, &mut transaction, receipt).await;
    let staged = limiter.finish_in(&mut transaction, claimed, AttemptOutcome::Failure).await.unwrap();
    assert_eq!(staged.provisional_result(), failure(1, 1_000));
    transaction.commit().await.unwrap();
    assert_eq!(seen(denial(&limiter, &alice).await), Seen::Backoff(1, 1));

    // Rollback: nothing staged survives; the original lease is still active.
    let bob = hasher.hash_attempt_for(&policy, b"bob");
    let receipt = admit(&limiter, &bob).await;
    let mut transaction = host.begin().await.unwrap();
    let claimed = claim(&limiter, &mut transaction, receipt).await;
    let staged = limiter.finish_in(&mut transaction, claimed, AttemptOutcome::Success).await.unwrap();
    assert_eq!(staged.provisional_result(), AttemptCompletionResult::Reset);
    transaction.rollback().await.unwrap();
    assert_eq!(seen(denial(&limiter, &bob).await), Seen::InProgress(5));

    // Savepoint rollback invalidates an escaped claim.
    let carol = hasher.hash_attempt_for(&policy, b"carol");
    let receipt = admit(&limiter, &carol).await;
    let mut transaction = host.begin().await.unwrap();
    let mut savepoint = transaction.begin().await.unwrap();
    let escaped = claim(&limiter, &mut savepoint, receipt).await;
    savepoint.rollback().await.unwrap();
    let staged = limiter.finish_in(&mut transaction, escaped, AttemptOutcome::Success).await.unwrap();
    assert_eq!(staged.provisional_result(), AttemptCompletionResult::Stale);
    transaction.rollback().await.unwrap();

    // Savepoint release keeps the claim.
    let dave = hasher.hash_attempt_for(&policy, b"dave");
    let receipt = admit(&limiter, &dave).await;
    let mut transaction = host.begin().await.unwrap();
    let mut savepoint = transaction.begin().await.unwrap();
    let kept = claim(&limiter, &mut savepoint, receipt).await;
    savepoint.commit().await.unwrap(); // RELEASE SAVEPOINT
    let staged = limiter.finish_in(&mut transaction, kept, AttemptOutcome::Abandoned).await.unwrap();
    assert_eq!(staged.provisional_result(), failure(1, 1_000));
    transaction.commit().await.unwrap();
    assert_eq!(seen(denial(&limiter, &dave).await), Seen::Backoff(1, 1));

    // A claim used in another transaction is stale.
    let erin = hasher.hash_attempt_for(&policy, b"erin");
    let receipt = admit(&limiter, &erin).await;
    let mut first = host.begin().await.unwrap();
    let claimed = claim(&limiter, &mut first, receipt).await;
    first.commit().await.unwrap();
    let mut second = other.begin().await.unwrap();
    let staged = limiter.finish_in(&mut second, claimed, AttemptOutcome::Success).await.unwrap();
    assert_eq!(staged.provisional_result(), AttemptCompletionResult::Stale);
    second.rollback().await.unwrap();

    // complete_in for an outcome that is already final.
    let frank = hasher.hash_attempt_for(&policy, b"frank");
    let receipt = admit(&limiter, &frank).await;
    let mut transaction = host.begin().await.unwrap();
    let staged = limiter.complete_in(&mut transaction, receipt, AttemptOutcome::Success).await.unwrap();
    assert_eq!(staged.provisional_result(), AttemptCompletionResult::Reset);
    transaction.commit().await.unwrap();
    drop(admit(&limiter, &frank).await);

    // A receipt whose lease expired cannot be claimed.
    let grace = hasher.hash_attempt_for(&policy, b"grace");
    let receipt = admit(&limiter, &grace).await;
    advance(&mut other, 5_000).await;
    let mut transaction = host.begin().await.unwrap();
    assert!(matches!(limiter.claim_in(&mut transaction, receipt).await.unwrap(), AttemptClaimResult::Stale));
    transaction.rollback().await.unwrap();

    drop((host, other));
    database.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn a_held_claim_outlives_its_lease_and_never_blocks_the_shard() {
    let database = TestDatabase::create("attempts_held_claim").await;
    let config = PostgresConfig::default().with_operation_timeout(Duration::from_millis(500)).unwrap();
    let limiter = limiter(&database, 2).await.with_config(config);
    // A real one-second lease.
    let policy = AttemptPolicy::new(
        PolicyId::new("auth.password").unwrap(),
        ScopeId::new("short-lease").unwrap(),
        Duration::from_secs(1),
        Duration::from_secs(8),
        Duration::from_secs(60),
        Duration::from_secs(1),
    )
    .unwrap();
    let hasher = hasher();
    let subjects = same_shard(&hasher, &policy, 2);
    let receipt = admit(&limiter, &subjects[0]).await;
    let mut host = database.connection().await;
    let mut transaction = host.begin().await.unwrap();
    let claimed = claim(&limiter, &mut transaction, receipt).await;
    // While the claim's row lock is held: the same subject is in progress, the shard is usable.
    assert!(matches!(denial(&limiter, &subjects[0]).await, AttemptDenial::InProgress { .. }));
    drop(admit(&limiter, &subjects[1]).await);
    // Application work outlasts the lease; the held row lock keeps the reservation.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let staged = limiter.finish_in(&mut transaction, claimed, AttemptOutcome::Success).await.unwrap();
    assert_eq!(staged.provisional_result(), AttemptCompletionResult::Reset);
    transaction.commit().await.unwrap();
    drop(admit(&limiter, &subjects[0]).await);

    // A standalone completion waits for a row held by another transaction only until the
    // operation budget ends, and then reports a pre-commit timeout that recorded nothing.
    let five_second_lease = self::policy();
    let blocked = hasher.hash_attempt_for(&five_second_lease, b"blocked");
    let receipt = admit(&limiter, &blocked).await;
    let mut blocker = database.connection().await;
    let mut held = blocker.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM public.runlimit_attempts FOR UPDATE").execute(&mut *held).await.unwrap();
    let error = limiter.complete(receipt, AttemptOutcome::Failure).await.unwrap_err();
    assert!(matches!(error, CheckError::Timeout { phase: CheckPhase::Lock, .. }), "{error:?}");
    assert_eq!(error.consumption(), ConsumptionStatus::NotConsumed);
    held.rollback().await.unwrap();
    assert_eq!(seen(denial(&limiter, &blocked).await), Seen::InProgress(5));
    drop(blocker);
    drop(host);
    database.finish().await;
}

/// `count` attempt subjects whose capacity shard (first subject byte) is the same.
fn same_shard<'p>(hasher: &KeyHasher, policy: &'p AttemptPolicy, count: usize) -> Vec<AttemptSubject<'p>> {
    let mut found = Vec::new();
    for n in 0u32.. {
        let subject = hasher.hash_attempt_for(policy, format!("user-{n}").as_bytes());
        if subject.subject().as_bytes()[0] == 7 {
            found.push(subject);
            if found.len() == count {
                break;
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn full_shards_fail_closed_and_admission_reclaims_at_most_16_expired_rows() {
    let database = TestDatabase::create("attempts_capacity").await;
    let config = PostgresConfig::default().with_maximum_rows_per_shard(20).unwrap();
    let limiter = limiter(&database, 2).await.with_config(config);
    let policy = policy();
    let hasher = hasher();
    let subjects = same_shard(&hasher, &policy, 22);
    let mut connection = database.connection().await;

    for subject in &subjects[..20] {
        drop(admit(&limiter, subject).await);
    }
    // Full: live rows are never reclaimed. Earliest expiry: lease 5 s + quiet 60 s.
    assert_eq!(seen(denial(&limiter, &subjects[20]).await), Seen::StorageCapacity(Some(65)));
    assert_eq!(rows(&mut connection).await, 20);
    // Existing subjects keep working.
    assert_eq!(seen(denial(&limiter, &subjects[0]).await), Seen::InProgress(5));

    // Every row expires: the next new subject reclaims exactly 16 of them.
    advance(&mut connection, 65_000).await;
    drop(admit(&limiter, &subjects[20]).await);
    assert_eq!(rows(&mut connection).await, 20 - 16 + 1);
    let slots: Vec<i32> =
        sqlx::query_scalar("SELECT capacity_slot FROM public.runlimit_attempts ORDER BY capacity_slot")
            .fetch_all(&mut connection)
            .await
            .unwrap();
    assert!(slots.iter().all(|slot| (0..20).contains(slot)), "{slots:?}");
    drop(admit(&limiter, &subjects[21]).await);

    // The database itself checks the slot range and uniqueness per shard.
    let out_of_range = sqlx::query(
        "INSERT INTO public.runlimit_attempts (attempt_key, capacity_shard, capacity_slot, \
         consecutive_failures, last_failure_at_ms, expires_at_ms) \
         VALUES (pg_catalog.decode(repeat('ab', 64), 'hex'), 1, 65536, 0, 0, 0)",
    )
    .execute(&mut connection)
    .await
    .unwrap_err();
    assert_eq!(support::sqlstate(&out_of_range).as_deref(), Some("23514"));
    let duplicate = sqlx::query(
        "INSERT INTO public.runlimit_attempts (attempt_key, capacity_shard, capacity_slot, \
         consecutive_failures, last_failure_at_ms, expires_at_ms) \
         SELECT pg_catalog.decode(repeat('cd', 64), 'hex'), capacity_shard, capacity_slot, 0, 0, 0 \
         FROM public.runlimit_attempts LIMIT 1",
    )
    .execute(&mut connection)
    .await
    .unwrap_err();
    assert_eq!(support::sqlstate(&duplicate).as_deref(), Some("23505"));
    drop(connection);
    database.finish().await;
}

#[derive(Default)]
struct Recorder(std::sync::Mutex<Vec<(AttemptOperation, AttemptEvent)>>);

impl AttemptObserver for Recorder {
    fn observe_attempt(&self, observation: &AttemptObservation<'_>) {
        assert_eq!(observation.policy().id().as_str(), "auth.password");
        self.0.lock().unwrap().push((observation.operation(), observation.event()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn observers_and_a_lost_commit_acknowledgement() {
    let database = TestDatabase::create("attempts_observer").await;
    limiter(&database, 1).await;
    let proxy = Proxy::start(&database.options).await;
    let pool =
        database.pool_with(PgPoolOptions::new().max_connections(1), proxy.options(&database.options)).await;
    let recorder = Arc::new(Recorder::default());
    let limiter = PostgresAttemptLimiter::new(pool).with_observer(Arc::clone(&recorder));
    let policy = policy();
    let subject = hasher().hash_attempt_for(&policy, b"user@example.test");
    let receipt = match limiter.acquire(&subject).await.unwrap() {
        AttemptDecision::Admitted(receipt) => receipt,
        AttemptDecision::Denied(denial) => panic!("{denial:?}"),
    };
    assert!(matches!(limiter.acquire(&subject).await.unwrap(), AttemptDecision::Denied(_)));
    assert_eq!(limiter.complete(receipt, AttemptOutcome::Failure).await.unwrap(), failure(1, 1_000));
    let mut connection = database.connection().await;
    advance(&mut connection, 1_000).await;
    let receipt = match limiter.acquire(&subject).await.unwrap() {
        AttemptDecision::Admitted(receipt) => receipt,
        AttemptDecision::Denied(denial) => panic!("{denial:?}"),
    };
    proxy.arm(Cut::AfterForwarding(b"COMMIT;"));
    let error = limiter.complete(receipt, AttemptOutcome::Failure).await.unwrap_err();
    assert!(matches!(error, CheckError::CommitOutcomeUnknown { .. }), "{error:?}");
    assert_eq!(error.consumption(), ConsumptionStatus::MayHaveBeenConsumed);
    // Here the server did commit the second failure: never replay an uncertain completion.
    support::settled_server(&mut connection).await;
    let failures: i64 = sqlx::query_scalar("SELECT consecutive_failures FROM public.runlimit_attempts")
        .fetch_one(&mut connection)
        .await
        .unwrap();
    assert_eq!(failures, 2);
    assert_eq!(
        *recorder.0.lock().unwrap(),
        [
            (AttemptOperation::Admission, AttemptEvent::Admitted),
            (AttemptOperation::Admission, AttemptEvent::Denied(AttemptDenialReason::InProgress)),
            (
                AttemptOperation::Completion(AttemptOutcome::Failure),
                AttemptEvent::Completed(AttemptOutcome::Failure)
            ),
            (AttemptOperation::Admission, AttemptEvent::Admitted),
            (AttemptOperation::Completion(AttemptOutcome::Failure), AttemptEvent::UncertainCommit),
        ]
    );
    drop(connection);
    database.finish().await;
}

#[test]
fn the_bundled_sql_creates_only_attempt_tables() {
    assert!(CREATE_RUNLIMIT_ATTEMPTS_SQL.contains("CREATE TABLE public.runlimit_attempts ("));
    assert!(!CREATE_RUNLIMIT_ATTEMPTS_SQL.contains("runlimit_fixed_windows"));
}
