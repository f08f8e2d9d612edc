//! The admission protocol on the wire, and its interoperation with the previous release's.
//!
//! Admissions run in simple-query round trips: both limiters execute statements prepared on
//! each connection (`src/fixed_window/calls.rs`, `src/gcra/calls.rs`), and fixed windows call
//! PL/pgSQL admission functions for new keys and ended windows. A [`CountingProxy`] in front of
//! the server frames the frontend stream and records every `Query` message's SQL text and every
//! extended-protocol message, so the round trips and statements of one admission can be pinned
//! exactly. The second pair of tests runs limiters of the previous statement protocols
//! (`PostgresConfig::with_previous_admission_protocol`, and for GCRA
//! `with_previous_prepared_protocol`) and of the current one concurrently on the same keys, as
//! replicas of two releases do during a rolling deploy.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use runlimit_core::{
    BatchDecisionView, Check, Denial, FixedWindowPolicy, GcraPolicy, PolicyId, ScopeId, SubjectKey,
};
use runlimit_memory::{GcraStore, ManualClock, MemoryStoreConfig};
use runlimit_postgres::{PostgresGcraLimiter, PostgresLimiter, PostgresStore};
use sqlx::{
    PgConnection, PgPool,
    postgres::{PgConnectOptions, PgPoolOptions, PgSslMode},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    task::AbortHandle,
};

use crate::support::*;

// ---------------------------------------------------------------------------------------------
// The counting proxy
// ---------------------------------------------------------------------------------------------

/// What the client sent through a [`CountingProxy`] since the last [`CountingProxy::take`].
#[derive(Clone, Debug, Default)]
struct Recording {
    /// The type byte of every frontend typed message, in order.
    tags: Vec<u8>,
    /// The SQL text of every `Query` ('Q') message, in order.
    queries: Vec<String>,
    /// How many `Parse` ('P'), `Bind` ('B') and `Execute` ('E') messages.
    extended: usize,
}

impl Recording {
    fn record(&mut self, tag: u8, body: &[u8]) {
        self.tags.push(tag);
        match tag {
            b'Q' => {
                let text = body.strip_suffix(&[0]).unwrap_or(body);
                self.queries.push(String::from_utf8_lossy(text).into_owned());
            }
            b'P' | b'B' | b'E' => self.extended += 1,
            _ => {}
        }
    }

    /// The statements of each simple query: its text split on ';', trimmed, empty parts
    /// dropped (Runlimit's SQL has no ';' inside a literal).
    fn statements(&self) -> Vec<Vec<String>> {
        self.queries
            .iter()
            .map(|query| {
                query.split(';').map(str::trim).filter(|part| !part.is_empty()).map(str::to_owned).collect()
            })
            .collect()
    }

    /// (simple-query round trips, statements).
    fn figures(&self) -> (usize, usize) {
        (self.queries.len(), self.statements().iter().map(Vec::len).sum())
    }
}

/// A loopback TCP proxy in front of the test server that relays both directions byte for
/// byte and records the frontend typed messages (a sibling of `clock::RewritingProxy`, which
/// rewrites them instead). It answers an `SSLRequest`/`GSSENCRequest` with 'N' itself, so the
/// stream stays readable; [`CountingProxy::options`] also disables TLS.
struct CountingProxy {
    port: u16,
    recording: Arc<Mutex<Recording>>,
    listener: AbortHandle,
}

/// The `SSLRequest` code (1234.5679).
const SSL_REQUEST: i32 = 80_877_103;
/// The `GSSENCRequest` code (1234.5680).
const GSSENC_REQUEST: i32 = 80_877_104;
/// The `CancelRequest` code (1234.5678).
const CANCEL_REQUEST: i32 = 80_877_102;
/// The server's own bound on a startup packet.
const MAX_STARTUP_PACKET: usize = 10_000;

impl CountingProxy {
    async fn start(upstream: &PgConnectOptions) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind counting proxy");
        let port = listener.local_addr().expect("counting proxy address").port();
        let target = format!("{}:{}", upstream.get_host(), upstream.get_port());
        let recording = Arc::new(Mutex::new(Recording::default()));
        let shared = Arc::clone(&recording);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let target = target.clone();
                let recording = Arc::clone(&shared);
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&target).await
                        && let Err(error) = relay(client, server, recording).await
                    {
                        eprintln!("counting proxy: closed a connection: {error}");
                    }
                });
            }
        });
        Self { port, recording, listener: task.abort_handle() }
    }

    /// `base` through the proxy, with TLS disabled.
    fn options(&self, base: &PgConnectOptions) -> PgConnectOptions {
        base.clone().host("127.0.0.1").port(self.port).ssl_mode(PgSslMode::Disable)
    }

    /// Everything recorded so far, leaving the recording empty.
    fn take(&self) -> Recording {
        std::mem::take(&mut *self.recording.lock().unwrap())
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

/// Relays one connection. The startup packets are framed until the `StartupMessage` (an
/// encryption request is answered 'N' and not forwarded); from then on the client's bytes are
/// forwarded unchanged and, after a `StartupMessage`, framed as typed messages and recorded
/// before they are forwarded. The server's bytes are copied unchanged.
async fn relay(
    client: TcpStream,
    server: TcpStream,
    recording: Arc<Mutex<Recording>>,
) -> std::io::Result<()> {
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let mut buffer = vec![0u8; 64 * 1024];
    let mut pending = Vec::new();

    // Startup: untyped packets `Int32 length, Int32 code, body`.
    let typed = 'startup: loop {
        let n = client_read.read(&mut buffer).await?;
        if n == 0 {
            return Ok(());
        }
        pending.extend_from_slice(&buffer[..n]);
        while let Some(length) = pending.get(..4) {
            let length = usize::try_from(u32::from_be_bytes(length.try_into().expect("four bytes")))
                .expect("u32 fits usize");
            if !(8..=MAX_STARTUP_PACKET).contains(&length) {
                return Err(std::io::Error::other(format!("startup packet length {length}")));
            }
            if pending.len() < length {
                break;
            }
            let packet: Vec<u8> = pending.drain(..length).collect();
            match i32::from_be_bytes(packet[4..8].try_into().expect("four bytes")) {
                SSL_REQUEST | GSSENC_REQUEST => client_write.write_all(b"N").await?,
                CANCEL_REQUEST => {
                    server_write.write_all(&packet).await?;
                    break 'startup false;
                }
                _ => {
                    server_write.write_all(&packet).await?;
                    break 'startup true;
                }
            }
        }
    };

    let upstream = async {
        let mut framer = Framer::default();
        let mut chunk = std::mem::take(&mut pending);
        loop {
            if !chunk.is_empty() {
                if typed {
                    framer.feed(&chunk, &recording)?;
                }
                server_write.write_all(&chunk).await?;
            }
            let n = client_read.read(&mut buffer).await?;
            if n == 0 {
                return server_write.shutdown().await;
            }
            chunk.clear();
            chunk.extend_from_slice(&buffer[..n]);
        }
    };
    let downstream = async {
        tokio::io::copy(&mut server_read, &mut client_write).await?;
        client_write.shutdown().await
    };
    tokio::select! {
        result = upstream => result,
        result = downstream => result,
    }
}

/// Frames typed frontend messages (`Byte1 type, Int32 length including itself, body`) across
/// reads.
#[derive(Default)]
struct Framer {
    pending: Vec<u8>,
}

impl Framer {
    fn feed(&mut self, bytes: &[u8], recording: &Mutex<Recording>) -> std::io::Result<()> {
        self.pending.extend_from_slice(bytes);
        let mut offset = 0;
        while let Some(header) = self.pending.get(offset..offset + 5) {
            let length = i32::from_be_bytes(header[1..5].try_into().expect("four bytes"));
            let length = usize::try_from(length)
                .ok()
                .filter(|length| *length >= 4)
                .ok_or_else(|| std::io::Error::other(format!("message length {length}")))?;
            let Some(message) = self.pending.get(offset..offset + 1 + length) else { break };
            recording.lock().unwrap().record(message[0], &message[5..]);
            offset += 1 + length;
        }
        self.pending.drain(..offset);
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn gcra_policy(id: &str, quota: u64, period_ms: u64, burst: u64) -> GcraPolicy {
    GcraPolicy::new(
        PolicyId::new(id).unwrap(),
        ScopeId::new("subject").unwrap(),
        quota,
        Duration::from_millis(period_ms),
        burst,
    )
    .unwrap()
}

fn gcra_check(policy: &GcraPolicy, subject: SubjectKey) -> Check<'_, GcraPolicy> {
    Check::new(subject.bind(policy))
}

/// The database clock in whole milliseconds, as the GCRA limiter samples it.
async fn db_now_ms(connection: &mut PgConnection) -> i64 {
    sqlx::query_scalar("SELECT floor(extract(epoch from clock_timestamp()) * 1000)::bigint")
        .fetch_one(connection)
        .await
        .unwrap()
}

/// A pool of one connection through `proxy`, without SQLx's liveness ping on acquire (a
/// `Sync` round trip of the pool, not of the admission), so the proxy sees only what the
/// limiter sends.
async fn counted_pool(db: &TestDatabase, proxy: &CountingProxy) -> PgPool {
    db.pool_with(
        PgPoolOptions::new().max_connections(1).min_connections(0).test_before_acquire(false),
        proxy.options(&db.options),
    )
    .await
}

/// Shortens long statements (a 64-key batch renders 8 KiB of hexadecimal) for messages.
fn abbreviated(statements: &[Vec<String>]) -> Vec<Vec<String>> {
    statements
        .iter()
        .map(|round_trip| {
            round_trip
                .iter()
                .map(|statement| match statement.char_indices().nth(90) {
                    Some((end, _)) => format!("{}… ({} bytes)", &statement[..end], statement.len()),
                    None => statement.clone(),
                })
                .collect()
        })
        .collect()
}

/// Waits until the pool's one connection is idle again. SQLx returns a connection to the pool
/// in a spawned task that first pings it (a `Sync` message and its `ReadyForQuery`), so only
/// then has the proxy seen everything the admission's connection sent.
async fn settled(pool: &PgPool) {
    for _ in 0..5_000 {
        if pool.size() == 1 && pool.num_idle() == 1 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("the pool's connection did not return to the pool");
}

/// Runs `admission` on `pool` (one connection, idle before) and returns its output with
/// everything its connection sent meanwhile, up to its return to the pool.
async fn recorded<T>(
    proxy: &CountingProxy,
    pool: &PgPool,
    admission: impl std::future::Future<Output = T>,
) -> (T, Recording) {
    settled(pool).await;
    let before = proxy.take();
    assert!(before.tags.is_empty(), "nothing is sent between admissions: {:?}", before.tags);
    let output = admission.await;
    settled(pool).await;
    (output, proxy.take())
}

/// Runs `sql` on `pool` (a session of the limiter's own) outside any recording.
async fn unrecorded(proxy: &CountingProxy, pool: &PgPool, sql: &'static str) {
    settled(pool).await;
    sqlx::raw_sql(sql).execute(pool).await.expect(sql);
    settled(pool).await;
    proxy.take();
}

/// Whether `decision` is a quota denial of the batch's first check.
fn denied_first(decision: &runlimit_core::BatchDecision) -> bool {
    matches!(decision.view(), BatchDecisionView::Denied { index: 0, denial: Denial::QuotaExceeded(_), .. })
}

/// Asserts that `recording` is exactly the simple-query round trips `expected` (per round trip,
/// the prefix of each statement) followed by the pool's `Sync` on release: no other message,
/// and no extended protocol.
fn assert_script(recording: &Recording, expected: &[&[&str]], context: &str) {
    let statements = recording.statements();
    assert_eq!(recording.extended, 0, "{context}: extended-protocol messages {:?}", recording.tags);
    let tags: String = recording.tags.iter().map(|tag| char::from(*tag)).collect();
    assert_eq!(tags, format!("{}S", "Q".repeat(expected.len())), "{context}: frontend messages");
    let shape: Vec<usize> = statements.iter().map(Vec::len).collect();
    let expected_shape: Vec<usize> = expected.iter().map(|round_trip| round_trip.len()).collect();
    assert_eq!(
        shape,
        expected_shape,
        "{context}: statements per round trip in {:#?}",
        abbreviated(&statements)
    );
    for (round_trip, (actual, prefixes)) in statements.iter().zip(expected).enumerate() {
        for (index, (statement, prefix)) in actual.iter().zip(prefixes.iter()).enumerate() {
            assert!(
                statement.starts_with(prefix),
                "{context}: round trip {round_trip} statement {index} is not {prefix:?}…: {:#?}",
                abbreviated(&statements)
            );
        }
    }
}

const BEGIN: &str = "BEGIN ISOLATION LEVEL READ COMMITTED, READ WRITE";
const FIXED_LOCK: &str = "EXECUTE runlimit_fixed_window_lock_";
const FIXED_PREFLIGHT: &str = "EXECUTE runlimit_fixed_window_preflight_";
const PREPARE_FIXED_LOCK_ONE: &str = "PREPARE runlimit_fixed_window_lock_one_v1 (";
const PREPARE_FIXED_LOCK_BATCH: &str = "PREPARE runlimit_fixed_window_lock_batch_v1 (";
const PREPARE_FIXED_PREFLIGHT_ONE: &str = "PREPARE runlimit_fixed_window_preflight_one_v1 (";
const PREPARE_FIXED_PREFLIGHT_BATCH: &str = "PREPARE runlimit_fixed_window_preflight_batch_v1 (";
const FIXED_RESERVE: &str = "SELECT * FROM public.runlimit_fixed_window_reserve(";
const FIXED_WRITE: &str = "SELECT public.runlimit_fixed_window_write(";
const SETTINGS: &str = "EXECUTE runlimit_settings_v1(";
const GCRA_LOCK: &str = "EXECUTE runlimit_gcra_lock_";
const GCRA_READ: &str = "EXECUTE runlimit_gcra_read_";
const GCRA_WRITE: &str = "EXECUTE runlimit_gcra_write_";
const GCRA_PREFLIGHT: &str = "EXECUTE runlimit_gcra_preflight_one_v2(";
const PREPARE_GCRA_LOCK_ONE: &str = "PREPARE runlimit_gcra_lock_one_v1 (";
const PREPARE_GCRA_PREFLIGHT_ONE: &str = "PREPARE runlimit_gcra_preflight_one_v2 (";
const PREPARE_SETTINGS: &str = "PREPARE runlimit_settings_v1 (";
const PREPARE_GCRA_WRITE_ONE_INSERT: &str = "PREPARE runlimit_gcra_write_one_insert_v1 (";
const PREPARE_GCRA_LOCK: &str = "PREPARE runlimit_gcra_lock_v1 (";
const PREPARE_GCRA_READ: &str = "PREPARE runlimit_gcra_read_v1 (";
const PREPARE_GCRA_WRITE: &str = "PREPARE runlimit_gcra_write_v1 (";
const PREPARE_GCRA_WRITE_INSERTS: &str = "PREPARE runlimit_gcra_write_inserts_v1 (";
const COMMIT: &str = "COMMIT";
const ROLLBACK: &str = "ROLLBACK";

/// The subject of key `index` of the batches of `size` (indexes from `size` up make a second,
/// mixed batch): distinct per batch, two keys per capacity shard, the shards spread over the
/// whole range.
fn batch_subject(size: usize, index: usize) -> SubjectKey {
    let shard = u8::try_from((index / 2 * 37 + size) % 256).unwrap();
    subject(shard, u64::try_from(size * 1_000 + index).unwrap())
}

/// Asserts that the statement at `(round_trip, index)` of `recording` passes the counter keys
/// of `keys` checks: its hexadecimal literals whose length is a multiple of 128 (one key or
/// several concatenated) hold exactly 128 × `keys` digits.
fn assert_carries_keys(
    recording: &Recording,
    (round_trip, index): (usize, usize),
    keys: usize,
    context: &str,
) {
    let statements = recording.statements();
    let statement = &statements[round_trip][index];
    let digits: usize = statement
        .split('\'')
        .skip(1)
        .step_by(2)
        .filter(|literal| {
            !literal.is_empty()
                && literal.len() % 128 == 0
                && literal.bytes().all(|byte| byte.is_ascii_hexdigit())
        })
        .map(str::len)
        .sum();
    assert!(
        digits == 128 * keys,
        "{context}: statement {index} of round trip {round_trip} does not carry {keys} keys: {:?}",
        abbreviated(&statements)[round_trip][index]
    );
}

/// Asserts the stored `used` of each check's counter.
async fn assert_stored(
    connection: &mut PgConnection,
    checks: &[Check<'_, FixedWindowPolicy>],
    expected: &[i64],
    context: &str,
) {
    let mut stored = Vec::new();
    for check in checks {
        stored.push(stored_used(connection, check).await);
    }
    let expected: Vec<Option<i64>> = expected.iter().copied().map(Some).collect();
    assert_eq!(stored, expected, "{context}: stored counters");
}

// ---------------------------------------------------------------------------------------------
// Round trips and statements
// ---------------------------------------------------------------------------------------------

/// Pins the wire cost of an admission, for both limiters and for batches of 1, 2, 8 and the
/// largest allowed size: only simple queries, never an extended-protocol message, and a number
/// of round trips and statements that does not grow with the batch.
///
/// * fixed window, keys not yet stored: 3 round trips, 6 statements (`BEGIN`, `EXECUTE` of the
///   prepared lock, `EXECUTE` of the prepared preflight | reserve call | write call, `COMMIT`);
///   the same for a batch of stored and new keys, whose write call carries only the new keys;
/// * fixed window, keys stored, allowed: 2 round trips, 4 statements (`BEGIN`, lock,
///   preflight | `COMMIT`): the preflight's provisional increments are the writes;
/// * the first admission on a connection: one more round trip, the first one, answered with
///   SQLSTATE 26000 (the connection has no prepared statements yet), then `ROLLBACK` and the
///   same statements with a `PREPARE` before each `EXECUTE` (and, for GCRA, the `PREPARE`
///   statements of the two write statements at the end); the same after the session
///   deallocated them, and only the missing ones after it deallocated some;
/// * GCRA, keys new, stored or both, allowed: 2 round trips, 6 statements (`BEGIN`, settings,
///   lock, read | write, `COMMIT`): the lock statement locks the shards, there is no reserve;
/// * a denied batch: 2 round trips (fixed window: `BEGIN`, lock, preflight | `ROLLBACK`, 4
///   statements; GCRA: `BEGIN`, settings, lock, read | `ROLLBACK`, 5).
///
/// The preflight (the GCRA read) carries the keys of the whole batch, as does the write call
/// except for the fixed window's stored keys; the fixed window's stored counters are checked
/// after each admission, so a commit without a write call did increment them and a denial
/// undid its provisional increments. Each limiter has its own pool of one connection through a
/// [`CountingProxy`], warmed first (SQLx's connection setup and type lookups are not the
/// admission's), and each recording covers exactly one `check_all`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn admissions_take_a_fixed_number_of_round_trips_and_statements() {
    let db = TestDatabase::create("protocol_round_trips").await;
    // Migrations run on direct connections, outside the proxy. GCRA on the ledger-lock
    // protocol; `row_lock_admissions_take_a_fixed_number_of_round_trips_and_statements` pins the
    // row-lock protocol's.
    db.limiter(1).await;
    ledger_lock_gcra_limiter(db.pool(1).await).await;
    let mut connection = db.connection().await;
    let proxy = CountingProxy::start(&db.options).await;
    let maximum = PostgresStore::<FixedWindowPolicy>::MAX_BATCH_SIZE;
    assert_eq!(maximum, PostgresStore::<GcraPolicy>::MAX_BATCH_SIZE);
    let sizes = [1, 2, 8, maximum];

    // Fixed window: limit 2 in an hour, so new keys are inserted (with the reserve call),
    // stored keys are incremented, and a third batch is denied.
    let fixed = PostgresLimiter::new(counted_pool(&db, &proxy).await);
    let policy = policy("protocol.fixed", 2, Duration::from_secs(3_600));
    // SQLx's own setup on the new connection, then the first admission on it, which prepares
    // the one-key lock and preflight, then the first batch, which prepares the batch lock and
    // preflight.
    unrecorded(&proxy, fixed.pool(), "SELECT 1").await;
    let warm_up = check(&policy, subject(255, u64::MAX));
    let (decision, recording) = recorded(&proxy, fixed.pool(), fixed.check(&warm_up)).await;
    assert!(decision.unwrap().permits_request());
    let what = "fixed window, first admission on a connection";
    assert_script(
        &recording,
        &[
            &[BEGIN, FIXED_LOCK, FIXED_PREFLIGHT],
            &[
                ROLLBACK,
                BEGIN,
                PREPARE_FIXED_LOCK_ONE,
                FIXED_LOCK,
                PREPARE_FIXED_PREFLIGHT_ONE,
                FIXED_PREFLIGHT,
            ],
            &[FIXED_RESERVE],
            &[FIXED_WRITE, COMMIT],
        ],
        what,
    );
    assert_eq!(recording.figures(), (4, 12), "{what}");
    let warm_up_batch = [check(&policy, subject(254, u64::MAX)), check(&policy, subject(253, u64::MAX))];
    let (decision, recording) = recorded(&proxy, fixed.pool(), fixed.check_all(&warm_up_batch)).await;
    assert!(matches!(decision.unwrap().view(), BatchDecisionView::Allowed { .. }));
    let what = "fixed window, first batch on a connection";
    assert_script(
        &recording,
        &[
            &[BEGIN, FIXED_LOCK, FIXED_PREFLIGHT],
            &[
                ROLLBACK,
                BEGIN,
                PREPARE_FIXED_LOCK_BATCH,
                FIXED_LOCK,
                PREPARE_FIXED_PREFLIGHT_BATCH,
                FIXED_PREFLIGHT,
            ],
            &[FIXED_RESERVE],
            &[FIXED_WRITE, COMMIT],
        ],
        what,
    );
    assert_eq!(recording.figures(), (4, 12), "{what}");
    // A session that deallocated the statements prepares them again.
    unrecorded(&proxy, fixed.pool(), "DEALLOCATE ALL").await;
    let (decision, recording) = recorded(&proxy, fixed.pool(), fixed.check(&warm_up)).await;
    assert!(decision.unwrap().permits_request());
    let what = "fixed window, after DEALLOCATE ALL";
    assert_script(
        &recording,
        &[
            &[BEGIN, FIXED_LOCK, FIXED_PREFLIGHT],
            &[
                ROLLBACK,
                BEGIN,
                PREPARE_FIXED_LOCK_ONE,
                FIXED_LOCK,
                PREPARE_FIXED_PREFLIGHT_ONE,
                FIXED_PREFLIGHT,
            ],
            &[COMMIT],
        ],
        what,
    );
    assert_stored(&mut connection, &[warm_up], &[2], what).await;
    // Only the batch preflight deallocated: the batch prepares it alone.
    let (decision, _) = recorded(&proxy, fixed.pool(), fixed.check_all(&warm_up_batch)).await;
    assert!(decision.is_ok());
    unrecorded(&proxy, fixed.pool(), "DEALLOCATE runlimit_fixed_window_preflight_batch_v1").await;
    let (decision, recording) = recorded(&proxy, fixed.pool(), fixed.check_all(&warm_up_batch)).await;
    assert!(decision.is_ok());
    assert_script(
        &recording,
        &[
            &[BEGIN, FIXED_LOCK, FIXED_PREFLIGHT],
            &[ROLLBACK, BEGIN, FIXED_LOCK, PREPARE_FIXED_PREFLIGHT_BATCH, FIXED_PREFLIGHT],
            &[ROLLBACK],
        ],
        "fixed window, after DEALLOCATE of the batch preflight",
    );
    // Only the lock deallocated: preparing both again finds the preflight there.
    unrecorded(&proxy, fixed.pool(), "DEALLOCATE runlimit_fixed_window_lock_one_v1").await;
    let (decision, recording) = recorded(&proxy, fixed.pool(), fixed.check(&warm_up)).await;
    assert!(!decision.unwrap().permits_request());
    assert_script(
        &recording,
        &[
            &[BEGIN, FIXED_LOCK, FIXED_PREFLIGHT],
            &[
                ROLLBACK,
                BEGIN,
                PREPARE_FIXED_LOCK_ONE,
                FIXED_LOCK,
                PREPARE_FIXED_PREFLIGHT_ONE,
                FIXED_PREFLIGHT,
            ],
            &[ROLLBACK, BEGIN, FIXED_LOCK, FIXED_PREFLIGHT],
            &[ROLLBACK],
        ],
        "fixed window, after DEALLOCATE of the lock",
    );
    assert_stored(&mut connection, &[warm_up], &[2], "fixed window, denied after re-preparing").await;
    for size in sizes {
        let checks: Vec<_> = (0..size).map(|index| check(&policy, batch_subject(size, index))).collect();
        let context = |what: &str| format!("fixed window, batch of {size}, {what}");
        let mut stored = Vec::new();
        for check in &checks {
            stored.push(stored_used(&mut connection, check).await);
        }
        assert!(stored.iter().all(Option::is_none), "{}", context("fresh keys"));

        let (decision, recording) = recorded(&proxy, fixed.pool(), fixed.check_all(&checks)).await;
        assert!(matches!(decision.unwrap().view(), BatchDecisionView::Allowed { .. }));
        assert_script(
            &recording,
            &[&[BEGIN, FIXED_LOCK, FIXED_PREFLIGHT], &[FIXED_RESERVE], &[FIXED_WRITE, COMMIT]],
            &context("new keys"),
        );
        assert_eq!(recording.figures(), (3, 6), "{}", context("new keys"));
        assert_carries_keys(&recording, (0, 2), size, &context("new keys"));
        assert_carries_keys(&recording, (2, 0), size, &context("new keys"));
        assert_stored(&mut connection, &checks, &vec![1; size], &context("new keys")).await;

        let (decision, recording) = recorded(&proxy, fixed.pool(), fixed.check_all(&checks)).await;
        assert!(matches!(decision.unwrap().view(), BatchDecisionView::Allowed { .. }));
        assert_script(
            &recording,
            &[&[BEGIN, FIXED_LOCK, FIXED_PREFLIGHT], &[COMMIT]],
            &context("stored keys"),
        );
        assert_eq!(recording.figures(), (2, 4), "{}", context("stored keys"));
        assert_carries_keys(&recording, (0, 2), size, &context("stored keys"));
        assert_stored(&mut connection, &checks, &vec![2; size], &context("stored keys")).await;

        let (decision, recording) = recorded(&proxy, fixed.pool(), fixed.check_all(&checks)).await;
        let decision = decision.unwrap();
        assert!(denied_first(&decision), "{decision:?}");
        assert_script(&recording, &[&[BEGIN, FIXED_LOCK, FIXED_PREFLIGHT], &[ROLLBACK]], &context("denied"));
        assert_eq!(recording.figures(), (2, 4), "{}", context("denied"));
        assert_stored(&mut connection, &checks, &vec![2; size], &context("denied")).await;

        // A batch of stored and new keys: one reserve call, and one write call for the new keys
        // only (the stored ones are the preflight's increments).
        if size > 1 {
            let mixed: Vec<_> =
                (size..2 * size).map(|index| check(&policy, batch_subject(size, index))).collect();
            let (decision, _) = recorded(&proxy, fixed.pool(), fixed.check_all(&mixed[..size / 2])).await;
            assert!(matches!(decision.unwrap().view(), BatchDecisionView::Allowed { .. }));
            let (decision, recording) = recorded(&proxy, fixed.pool(), fixed.check_all(&mixed)).await;
            assert!(matches!(decision.unwrap().view(), BatchDecisionView::Allowed { .. }));
            let what = context("stored and new keys");
            assert_script(
                &recording,
                &[&[BEGIN, FIXED_LOCK, FIXED_PREFLIGHT], &[FIXED_RESERVE], &[FIXED_WRITE, COMMIT]],
                &what,
            );
            assert_eq!(recording.figures(), (3, 6), "{what}");
            assert_carries_keys(&recording, (0, 2), size, &what);
            assert_carries_keys(&recording, (2, 0), size - size / 2, &what);
            let expected: Vec<i64> = (0..size).map(|index| if index < size / 2 { 2 } else { 1 }).collect();
            assert_stored(&mut connection, &mixed, &expected, &what).await;
        }
    }

    // GCRA: a burst of 2 and one unit an hour, so two batches are allowed (the first inserts,
    // the second updates) and a third is denied.
    let gcra = PostgresGcraLimiter::new(counted_pool(&db, &proxy).await);
    let policy = gcra_policy("protocol.gcra", 1, 3_600_000, 2);
    unrecorded(&proxy, gcra.pool(), "SELECT 1").await;
    let (warm_up, recording) =
        recorded(&proxy, gcra.pool(), gcra.check(&gcra_check(&policy, subject(255, u64::MAX)))).await;
    assert!(warm_up.unwrap().permits_request());
    let what = "GCRA, first admission on a connection";
    assert_script(
        &recording,
        &[
            &[BEGIN, SETTINGS, GCRA_LOCK, GCRA_PREFLIGHT],
            &[
                ROLLBACK,
                BEGIN,
                PREPARE_SETTINGS,
                SETTINGS,
                PREPARE_GCRA_LOCK_ONE,
                GCRA_LOCK,
                PREPARE_GCRA_PREFLIGHT_ONE,
                GCRA_PREFLIGHT,
                PREPARE_GCRA_WRITE_ONE_INSERT,
            ],
            &[GCRA_WRITE, COMMIT],
        ],
        what,
    );
    assert_eq!(recording.figures(), (3, 15), "{what}");
    // The first batch prepares the batch statements (the settings are there).
    let warm_up_batch =
        [gcra_check(&policy, subject(254, u64::MAX)), gcra_check(&policy, subject(253, u64::MAX))];
    let (decision, recording) = recorded(&proxy, gcra.pool(), gcra.check_all(&warm_up_batch)).await;
    assert!(matches!(decision.unwrap().view(), BatchDecisionView::Allowed { .. }));
    let what = "GCRA, first batch on a connection";
    assert_script(
        &recording,
        &[
            &[BEGIN, SETTINGS, GCRA_LOCK, GCRA_READ],
            &[
                ROLLBACK,
                BEGIN,
                SETTINGS,
                PREPARE_GCRA_LOCK,
                GCRA_LOCK,
                PREPARE_GCRA_READ,
                GCRA_READ,
                PREPARE_GCRA_WRITE,
                PREPARE_GCRA_WRITE_INSERTS,
            ],
            &[GCRA_WRITE, COMMIT],
        ],
        what,
    );
    assert_eq!(recording.figures(), (3, 15), "{what}");
    for size in sizes {
        let checks: Vec<_> = (0..size).map(|index| gcra_check(&policy, batch_subject(size, index))).collect();
        let context = |what: &str| format!("GCRA, batch of {size}, {what}");
        if size == 1 {
            // One check, whether through `check` or `check_all`: the settings, the lock, the
            // preflight (the provisional update); `COMMIT` alone for a stored key, the insert and
            // `COMMIT` for a new one, `ROLLBACK` for a denial.
            let first = [BEGIN, SETTINGS, GCRA_LOCK, GCRA_PREFLIGHT];
            let (decision, recording) = recorded(&proxy, gcra.pool(), gcra.check_all(&checks)).await;
            assert!(matches!(decision.unwrap().view(), BatchDecisionView::Allowed { .. }));
            assert_script(&recording, &[&first, &[GCRA_WRITE, COMMIT]], &context("new key"));
            assert_eq!(recording.figures(), (2, 6), "{}", context("new key"));
            assert_carries_keys(&recording, (0, 3), 1, &context("new key"));
            assert_carries_keys(&recording, (1, 0), 1, &context("new key"));
            let (decision, recording) = recorded(&proxy, gcra.pool(), gcra.check(&checks[0])).await;
            assert!(decision.unwrap().permits_request());
            assert_script(&recording, &[&first, &[COMMIT]], &context("stored key"));
            assert_eq!(recording.figures(), (2, 5), "{}", context("stored key"));
            assert_carries_keys(&recording, (0, 3), 1, &context("stored key"));
            let (decision, recording) = recorded(&proxy, gcra.pool(), gcra.check(&checks[0])).await;
            assert!(!decision.unwrap().permits_request());
            assert_script(&recording, &[&first, &[ROLLBACK]], &context("denied"));
            assert_eq!(recording.figures(), (2, 5), "{}", context("denied"));
            continue;
        }
        for what in ["new keys", "stored keys"] {
            let (decision, recording) = recorded(&proxy, gcra.pool(), gcra.check_all(&checks)).await;
            assert!(matches!(decision.unwrap().view(), BatchDecisionView::Allowed { .. }));
            assert_script(
                &recording,
                &[&[BEGIN, SETTINGS, GCRA_LOCK, GCRA_READ], &[GCRA_WRITE, COMMIT]],
                &context(what),
            );
            assert_eq!(recording.figures(), (2, 6), "{}", context(what));
            assert_carries_keys(&recording, (0, 3), size, &context(what));
            assert_carries_keys(&recording, (1, 0), size, &context(what));
        }
        let (decision, recording) = recorded(&proxy, gcra.pool(), gcra.check_all(&checks)).await;
        let decision = decision.unwrap();
        assert!(denied_first(&decision), "{decision:?}");
        assert_script(
            &recording,
            &[&[BEGIN, SETTINGS, GCRA_LOCK, GCRA_READ], &[ROLLBACK]],
            &context("denied"),
        );
        assert_eq!(recording.figures(), (2, 5), "{}", context("denied"));

        let mixed: Vec<_> =
            (size..2 * size).map(|index| gcra_check(&policy, batch_subject(size, index))).collect();
        let (decision, _) = recorded(&proxy, gcra.pool(), gcra.check_all(&mixed[..size / 2])).await;
        assert!(matches!(decision.unwrap().view(), BatchDecisionView::Allowed { .. }));
        let (decision, recording) = recorded(&proxy, gcra.pool(), gcra.check_all(&mixed)).await;
        assert!(matches!(decision.unwrap().view(), BatchDecisionView::Allowed { .. }));
        let what = context("stored and new keys");
        assert_script(&recording, &[&[BEGIN, SETTINGS, GCRA_LOCK, GCRA_READ], &[GCRA_WRITE, COMMIT]], &what);
        assert_eq!(recording.figures(), (2, 6), "{what}");
        assert_carries_keys(&recording, (0, 3), size, &what);
        assert_carries_keys(&recording, (1, 0), size, &what);
    }

    drop(connection);
    fixed.pool().close().await;
    gcra.pool().close().await;
    drop(proxy);
    db.finish().await;
}

const ROW_LOCK_ADMIT: &str = "EXECUTE runlimit_gcra_rowlock_admit_one_v1(";
const ROW_LOCK_INSERT: &str = "EXECUTE runlimit_gcra_rowlock_insert_one_v1(";
const LEDGER_LOCK: &str = "EXECUTE runlimit_gcra_ledger_lock_";
const ROW_LOCK_WRITE: &str = "EXECUTE runlimit_gcra_rowlock_write_";

/// On the row-lock protocol (a fresh database, which `migrate` switches), a one-check admission
/// is two round trips: `BEGIN`, the settings and the admission statement, then `COMMIT` alone
/// (a stored key the statement updated), the insert and `COMMIT` (a new key), or the read of the
/// key's time and `ROLLBACK` (a denial); a batch locks the row-lock ledger and reads its keys'
/// rows, then writes them (only if unchanged since the read) and commits, for every batch size. A limiter that did not
/// migrate learns the switch on its first admission, and admits it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn row_lock_admissions_take_a_fixed_number_of_round_trips_and_statements() {
    let db = TestDatabase::create("protocol_row_locks").await;
    gcra_limiter_on(db.pool(1).await, true).await;
    let proxy = CountingProxy::start(&db.options).await;
    let gcra = PostgresGcraLimiter::new(counted_pool(&db, &proxy).await);
    let policy = gcra_policy("protocol.row_locks", 1, 3_600_000, 2);
    unrecorded(&proxy, gcra.pool(), "SELECT 1").await;
    // Learning the switch: the ledger-lock admission finds no ledger row, the transaction is
    // rolled back, the row-lock ledger is counted, and the check is admitted on row locks.
    let (warm_up, recording) =
        recorded(&proxy, gcra.pool(), gcra.check(&gcra_check(&policy, subject(255, u64::MAX)))).await;
    assert!(warm_up.unwrap().permits_request());
    let statements = recording.statements();
    assert!(
        statements.iter().any(|round_trip| round_trip.iter().any(|s| s.starts_with(ROW_LOCK_ADMIT))),
        "{:#?}",
        abbreviated(&statements)
    );
    let warm_up_batch =
        [gcra_check(&policy, subject(254, u64::MAX)), gcra_check(&policy, subject(253, u64::MAX))];
    let (decision, _) = recorded(&proxy, gcra.pool(), gcra.check_all(&warm_up_batch)).await;
    assert!(matches!(decision.unwrap().view(), BatchDecisionView::Allowed { .. }));
    for size in [1, 2, 8, PostgresStore::<GcraPolicy>::MAX_BATCH_SIZE] {
        let checks: Vec<_> = (0..size).map(|index| gcra_check(&policy, batch_subject(size, index))).collect();
        let context = |what: &str| format!("GCRA row locks, batch of {size}, {what}");
        if size == 1 {
            let first = [BEGIN, SETTINGS, ROW_LOCK_ADMIT];
            let (decision, recording) = recorded(&proxy, gcra.pool(), gcra.check_all(&checks)).await;
            assert!(matches!(decision.unwrap().view(), BatchDecisionView::Allowed { .. }));
            assert_script(&recording, &[&first, &[ROW_LOCK_INSERT, COMMIT]], &context("new key"));
            assert_eq!(recording.figures(), (2, 5), "{}", context("new key"));
            assert_carries_keys(&recording, (0, 2), 1, &context("new key"));
            assert_carries_keys(&recording, (1, 0), 1, &context("new key"));
            let (decision, recording) = recorded(&proxy, gcra.pool(), gcra.check(&checks[0])).await;
            assert!(decision.unwrap().permits_request());
            assert_script(&recording, &[&first, &[COMMIT]], &context("stored key"));
            assert_eq!(recording.figures(), (2, 4), "{}", context("stored key"));
            let (decision, recording) = recorded(&proxy, gcra.pool(), gcra.check(&checks[0])).await;
            assert!(!decision.unwrap().permits_request());
            assert_script(&recording, &[&first, &[GCRA_READ, ROLLBACK]], &context("denied"));
            assert_eq!(recording.figures(), (2, 5), "{}", context("denied"));
            continue;
        }
        for what in ["new keys", "stored keys"] {
            let (decision, recording) = recorded(&proxy, gcra.pool(), gcra.check_all(&checks)).await;
            assert!(matches!(decision.unwrap().view(), BatchDecisionView::Allowed { .. }));
            assert_script(
                &recording,
                &[&[BEGIN, SETTINGS, LEDGER_LOCK, GCRA_READ], &[ROW_LOCK_WRITE, COMMIT]],
                &context(what),
            );
            assert_eq!(recording.figures(), (2, 6), "{}", context(what));
            assert_carries_keys(&recording, (0, 3), size, &context(what));
        }
        let (decision, recording) = recorded(&proxy, gcra.pool(), gcra.check_all(&checks)).await;
        assert!(denied_first(&decision.unwrap()));
        assert_script(
            &recording,
            &[&[BEGIN, SETTINGS, LEDGER_LOCK, GCRA_READ], &[ROLLBACK]],
            &context("denied"),
        );
    }
    gcra.pool().close().await;
    drop(proxy);
    db.finish().await;
}

/// The statements are prepared inside the admission's own transaction, after its `BEGIN`, so
/// sessions whose defaults are a stricter isolation level or read-only transactions still
/// admit on their first admission (a `BEGIN .. ISOLATION LEVEL` after any other statement of a
/// transaction is refused), and the admissions still run `READ COMMITTED, READ WRITE`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn strict_session_defaults_do_not_stop_the_first_admission() {
    let db = TestDatabase::create("protocol_session_defaults").await;
    db.limiter(1).await;
    PostgresGcraLimiter::new(db.pool(1).await).migrate().await.expect("migrate GCRA");
    let mut connection = db.connection().await;
    let fixed_policy = policy("defaults.fixed", 2, Duration::from_secs(3_600));
    let gcra_policy = gcra_policy("defaults.gcra", 1, 3_600_000, 2);
    for (index, (setting, value)) in
        [("default_transaction_isolation", "serializable"), ("default_transaction_read_only", "on")]
            .into_iter()
            .enumerate()
    {
        let options = db.options.clone().options([(setting, value)]);
        let shard = u8::try_from(index).unwrap();
        let fixed = PostgresLimiter::new(
            db.pool_with(PgPoolOptions::new().max_connections(1), options.clone()).await,
        );
        let key = check(&fixed_policy, subject(shard, 1));
        for expected in [true, true, false] {
            assert_eq!(fixed.check(&key).await.unwrap().permits_request(), expected, "{setting}");
        }
        assert_stored(&mut connection, &[key], &[2], setting).await;
        let gcra =
            PostgresGcraLimiter::new(db.pool_with(PgPoolOptions::new().max_connections(1), options).await);
        let key = gcra_check(&gcra_policy, subject(shard, 2));
        for expected in [true, true, false] {
            assert_eq!(gcra.check(&key).await.unwrap().permits_request(), expected, "{setting}");
        }
        fixed.pool().close().await;
        gcra.pool().close().await;
    }
    drop(connection);
    db.finish().await;
}

// ---------------------------------------------------------------------------------------------
// Previous and current protocols on shared keys
// ---------------------------------------------------------------------------------------------

/// Keys shared by the interoperation tests: 8 subjects over capacity shards 40, 41 and 42.
const SHARED_KEYS: usize = 8;
/// The first `EXISTING_KEYS` keys are stored before the concurrent run; the rest are new.
const EXISTING_KEYS: usize = 4;
/// Limiters (replicas): the first two use the previous protocol, the last two the current one.
const LIMITERS: usize = 4;
const TASKS_PER_LIMITER: usize = 4;
const OPERATIONS_PER_TASK: usize = 48;

fn shared_subject(key: usize) -> SubjectKey {
    subject(u8::try_from(40 + key % 3).unwrap(), u64::try_from(key).unwrap())
}

/// Operation `operation` of task `task`: the keys it checks, one (a single check) or two
/// distinct ones (a batch). Every fourth operation is a batch.
fn scheduled_keys(task: usize, operation: usize) -> Vec<usize> {
    let first = (task * 3 + operation) % SHARED_KEYS;
    if operation % 4 == 3 {
        vec![first, (first + 1 + (task + operation) % (SHARED_KEYS - 1)) % SHARED_KEYS]
    } else {
        vec![first]
    }
}

/// The checks the schedule makes of each key: (single checks, batches containing it).
fn scheduled_attempts() -> Vec<(u64, u64)> {
    let mut attempts = vec![(0, 0); SHARED_KEYS];
    for task in 0..LIMITERS * TASKS_PER_LIMITER {
        for operation in 0..OPERATIONS_PER_TASK {
            let keys = scheduled_keys(task, operation);
            for key in &keys {
                if keys.len() == 1 {
                    attempts[*key].0 += 1;
                } else {
                    attempts[*key].1 += 1;
                }
            }
        }
    }
    attempts
}

/// What the tasks of one limiter saw.
#[derive(Clone, Debug, Default)]
struct Tally {
    allowed_singles: u64,
    allowed_batches: u64,
    denied: u64,
    /// Admissions per key.
    admitted: HashMap<usize, u64>,
}

impl Tally {
    fn absorb(&mut self, other: Self) {
        self.allowed_singles += other.allowed_singles;
        self.allowed_batches += other.allowed_batches;
        self.denied += other.denied;
        for (key, count) in other.admitted {
            *self.admitted.entry(key).or_default() += count;
        }
    }

    fn admitted(&self, key: usize) -> u64 {
        self.admitted.get(&key).copied().unwrap_or(0)
    }
}

/// Runs the schedule: `TASKS_PER_LIMITER` tasks per limiter, each doing its operations with
/// `admit` (`true` when the checks of those keys were admitted, `false` for a quota denial;
/// any error fails the test). Returns the tally of each limiter.
async fn run_schedule<L, F, Fut>(limiters: &[L], admit: F) -> Vec<Tally>
where
    L: Clone + Send + Sync + 'static,
    F: Fn(L, Vec<usize>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = bool> + Send + 'static,
{
    let mut handles = Vec::new();
    for (index, limiter) in limiters.iter().enumerate() {
        for worker in 0..TASKS_PER_LIMITER {
            let limiter = limiter.clone();
            let admit = admit.clone();
            let task = index * TASKS_PER_LIMITER + worker;
            handles.push((
                index,
                tokio::spawn(async move {
                    let mut tally = Tally::default();
                    for operation in 0..OPERATIONS_PER_TASK {
                        let keys = scheduled_keys(task, operation);
                        if admit(limiter.clone(), keys.clone()).await {
                            if keys.len() == 1 {
                                tally.allowed_singles += 1;
                            } else {
                                tally.allowed_batches += 1;
                            }
                            for key in keys {
                                *tally.admitted.entry(key).or_default() += 1;
                            }
                        } else {
                            tally.denied += 1;
                        }
                    }
                    tally
                }),
            ));
        }
    }
    let mut tallies: Vec<Tally> = (0..limiters.len()).map(|_| Tally::default()).collect();
    for (index, handle) in handles {
        tallies[index].absorb(handle.await.unwrap());
    }
    tallies
}

/// Whether a batch decision allowed every check; a quota denial is `false`, anything else
/// fails the test.
fn allowed(decision: &runlimit_core::BatchDecision, size: usize) -> bool {
    match decision.view() {
        BatchDecisionView::Allowed { allowances } => {
            assert_eq!(allowances.len(), size);
            true
        }
        BatchDecisionView::Denied { denial: Denial::QuotaExceeded(_), .. } => false,
        other => panic!("unexpected decision {other:?}"),
    }
}

/// The ledger rows with a non-zero count, and the rows per shard of the table, both ordered by
/// shard; also asserts the ledger has all 256 rows.
async fn ledger_and_rows(
    connection: &mut PgConnection,
    ledger: &str,
    table: &str,
) -> (Vec<(i16, i64)>, Vec<(i16, i64)>) {
    let ledger_rows: Vec<(i16, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT shard, row_count::bigint FROM {ledger} ORDER BY shard"
    )))
    .fetch_all(&mut *connection)
    .await
    .unwrap();
    assert_eq!(ledger_rows.len(), 256, "{ledger} has a row per shard");
    let counted: Vec<(i16, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT capacity_shard, count(*) FROM {table} GROUP BY 1 ORDER BY 1"
    )))
    .fetch_all(&mut *connection)
    .await
    .unwrap();
    (ledger_rows.into_iter().filter(|(_, count)| *count != 0).collect(), counted)
}

/// Four fixed-window limiters, two on the previous statement protocol and two on the current
/// function protocol, each with its own pool, run a fixed schedule of single checks and
/// two-key batches concurrently on 8 shared keys over 3 capacity shards (4 keys stored before
/// the run by both protocols in turn, 4 new). With a limit of 50 in an hour and more than 50
/// single checks of every key scheduled, every key ends with exactly 50 admitted across all
/// limiters (`min(attempts, limit)`, never more); the stored `used` of each key equals the
/// admissions the clients counted for it, and the sum of the stored counters equals the
/// admitted singles plus twice the admitted batches, so no batch committed one key without the
/// other; no check fails; and the capacity ledger counts exactly the rows of each shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn previous_and_current_protocols_share_keys_without_over_admission() {
    const LIMIT: u64 = 50;
    let db = TestDatabase::create("protocol_interop_fixed").await;
    db.limiter(1).await;
    let current = config().with_operation_timeout(Duration::from_secs(10)).unwrap();
    let previous = current.with_previous_admission_protocol();
    let mut limiters = Vec::new();
    for index in 0..LIMITERS {
        let config = if index < LIMITERS / 2 { previous } else { current };
        limiters.push(Arc::new(PostgresLimiter::new(db.pool(3).await).with_config(config)));
    }
    let policy = Arc::new(policy("protocol.interop", LIMIT, Duration::from_secs(3_600)));

    // Stored keys: each written first by one protocol, then read and incremented by the other.
    let mut preloaded = [0u64; SHARED_KEYS];
    for (key, admitted) in preloaded.iter_mut().enumerate().take(EXISTING_KEYS) {
        let (first, second) = if key % 2 == 0 { (0, LIMITERS - 1) } else { (LIMITERS - 1, 0) };
        for limiter in [first, first, second] {
            let decision = limiters[limiter].check(&check(&policy, shared_subject(key))).await.unwrap();
            assert!(decision.permits_request(), "preload of key {key}: {decision:?}");
            *admitted += 1;
        }
    }

    let attempts = scheduled_attempts();
    for (key, (singles, _)) in attempts.iter().enumerate() {
        assert!(
            preloaded[key] + singles > LIMIT,
            "key {key}: the schedule must exhaust the limit by single checks"
        );
    }
    let started = std::time::Instant::now();
    let tallies = run_schedule(&limiters, {
        let policy = Arc::clone(&policy);
        move |limiter: Arc<PostgresLimiter>, keys: Vec<usize>| {
            let policy = Arc::clone(&policy);
            async move {
                let checks: Vec<_> = keys.iter().map(|&key| check(&policy, shared_subject(key))).collect();
                let decision = limiter.check_all(&checks).await.expect("no check errors");
                allowed(&decision, keys.len())
            }
        }
    })
    .await;
    let elapsed = started.elapsed();

    let mut total = Tally::default();
    for tally in &tallies {
        total.absorb(tally.clone());
    }
    let operations = u64::try_from(LIMITERS * TASKS_PER_LIMITER * OPERATIONS_PER_TASK).unwrap();
    assert_eq!(total.allowed_singles + total.allowed_batches + total.denied, operations);

    let mut connection = db.connection().await;
    let mut stored_total = 0;
    for key in 0..SHARED_KEYS {
        let (singles, batches) = attempts[key];
        let admitted = preloaded[key] + total.admitted(key);
        assert_eq!(admitted, (preloaded[key] + singles + batches).min(LIMIT), "key {key}");
        let stored = stored_used(&mut connection, &check(&policy, shared_subject(key)))
            .await
            .map_or(0, |used| u64::try_from(used).unwrap());
        assert_eq!(stored, admitted, "key {key}: stored used against admissions");
        stored_total += stored;
    }
    let preloaded_total: u64 = preloaded.iter().sum();
    assert_eq!(
        stored_total,
        preloaded_total + total.allowed_singles + 2 * total.allowed_batches,
        "no half-committed batch"
    );

    let (ledger, rows) = ledger_and_rows(
        &mut connection,
        "public.runlimit_fixed_window_shards",
        "public.runlimit_fixed_windows",
    )
    .await;
    assert_eq!(ledger, rows, "the ledger counts the rows of every shard");
    assert_eq!(rows, vec![(40, 3), (41, 3), (42, 2)]);

    println!(
        "fixed window: {operations} operations in {elapsed:?}; per limiter (previous, previous, current, current): {:?}",
        tallies.iter().map(|t| (t.allowed_singles, t.allowed_batches, t.denied)).collect::<Vec<_>>()
    );
    drop(connection);
    for limiter in &limiters {
        limiter.pool().close().await;
    }
    db.finish().await;
}

/// The GCRA counterpart: four GCRA limiters run the same schedule on the same 8 keys: one
/// sends the statements of earlier releases, one the previous release's prepared statements
/// (one-check admissions through the statements of a batch of one: ledger lock, read, write),
/// and two the current protocol (one-check admissions through the provisional update,
/// `src/gcra/one.rs`). The policy has a burst of 50 and a rate of 50 an hour (one unit per 72
/// seconds), so no unit replenishes during the test. Every key ends with exactly the admissions the reference
/// model (`runlimit_memory::GcraStore`) allows for its attempts, 50; each stored arrival time
/// is the key's first admission plus one emission interval per admission counted by the
/// clients (so no batch committed one key without the other); no check fails; and the
/// capacity ledger counts exactly the rows of each shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn previous_and_current_gcra_protocols_share_keys_without_over_admission() {
    const BURST: u64 = 50;
    const PERIOD_MS: u64 = 3_600_000;
    const EMISSION_INTERVAL_MS: i64 = 72_000;
    let db = TestDatabase::create("protocol_interop_gcra").await;
    // A database the previous releases ran on: the ledger-lock protocol.
    ledger_lock_gcra_limiter(db.pool(1).await).await;
    let current = config().with_operation_timeout(Duration::from_secs(10)).unwrap();
    let configs = [
        current.with_previous_admission_protocol(),
        current.with_previous_prepared_protocol(),
        current,
        current,
    ];
    let mut limiters = Vec::new();
    for config in configs {
        limiters.push(Arc::new(PostgresGcraLimiter::new(db.pool(3).await).with_config(config)));
    }
    let policy = Arc::new(gcra_policy("protocol.interop", BURST, PERIOD_MS, BURST));
    let mut connection = db.connection().await;
    let start_ms = db_now_ms(&mut connection).await;

    let mut preloaded = [0u64; SHARED_KEYS];
    for (key, admitted) in preloaded.iter_mut().enumerate().take(EXISTING_KEYS) {
        let (first, second) = if key % 2 == 0 { (0, LIMITERS - 1) } else { (LIMITERS - 1, 0) };
        for limiter in [first, first, second] {
            let decision = limiters[limiter].check(&gcra_check(&policy, shared_subject(key))).await.unwrap();
            assert!(decision.permits_request(), "preload of key {key}: {decision:?}");
            *admitted += 1;
        }
    }

    let attempts = scheduled_attempts();
    for (key, (singles, _)) in attempts.iter().enumerate() {
        assert!(
            preloaded[key] + singles > BURST,
            "key {key}: the schedule must exhaust the burst by single checks"
        );
    }
    let tallies = run_schedule(&limiters, {
        let policy = Arc::clone(&policy);
        move |limiter: Arc<PostgresGcraLimiter>, keys: Vec<usize>| {
            let policy = Arc::clone(&policy);
            async move {
                let checks: Vec<_> =
                    keys.iter().map(|&key| gcra_check(&policy, shared_subject(key))).collect();
                let decision = limiter.check_all(&checks).await.expect("no check errors");
                allowed(&decision, keys.len())
            }
        }
    })
    .await;
    let elapsed_ms = db_now_ms(&mut connection).await - start_ms;
    assert!(elapsed_ms < EMISSION_INTERVAL_MS, "no unit can replenish within the test: {elapsed_ms} ms");

    let mut total = Tally::default();
    for tally in &tallies {
        total.absorb(tally.clone());
    }
    let operations = u64::try_from(LIMITERS * TASKS_PER_LIMITER * OPERATIONS_PER_TASK).unwrap();
    assert_eq!(total.allowed_singles + total.allowed_batches + total.denied, operations);

    // The reference model: the key's attempts, all within one emission interval.
    let clock = ManualClock::new();
    let model = GcraStore::builder(MemoryStoreConfig::new(100).unwrap()).with_clock(clock.clone()).build();
    let mut admitted_total = 0;
    for key in 0..SHARED_KEYS {
        let (singles, batches) = attempts[key];
        let check = gcra_check(&policy, shared_subject(key));
        let mut expected = 0;
        for _ in 0..preloaded[key] + singles + batches {
            if model.check(&check).unwrap().permits_request() {
                expected += 1;
            }
        }
        assert_eq!(expected, BURST, "key {key}: the model admits the burst");
        let admitted = preloaded[key] + total.admitted(key);
        assert_eq!(admitted, expected, "key {key}");
        admitted_total += admitted;

        // Each admission advanced the arrival time by one emission interval from the first
        // admission's instant, which lies within the test (less than an interval after start).
        let (tat_ms, tat_remainder): (i64, i64) =
            sqlx::query_as("SELECT tat_ms, tat_remainder FROM public.runlimit_gcra WHERE counter_key = $1")
                .bind(check.counter_key().to_bytes().as_slice())
                .fetch_one(&mut connection)
                .await
                .unwrap();
        assert_eq!(tat_remainder, 0, "key {key}");
        assert_eq!(
            (tat_ms - start_ms).div_euclid(EMISSION_INTERVAL_MS),
            i64::try_from(admitted).unwrap(),
            "key {key}: stored arrival time {tat_ms} against {admitted} admissions from {start_ms}"
        );
    }
    let preloaded_total: u64 = preloaded.iter().sum();
    assert_eq!(
        admitted_total,
        preloaded_total + total.allowed_singles + 2 * total.allowed_batches,
        "no half-committed batch"
    );

    let (ledger, rows) =
        ledger_and_rows(&mut connection, "public.runlimit_gcra_shards", "public.runlimit_gcra").await;
    assert_eq!(ledger, rows, "the ledger counts the rows of every shard");
    assert_eq!(rows, vec![(40, 3), (41, 3), (42, 2)]);

    println!(
        "GCRA: {operations} operations in {elapsed_ms} ms; per limiter (earlier statements, previous prepared, current, current): {:?}",
        tallies.iter().map(|t| (t.allowed_singles, t.allowed_batches, t.denied)).collect::<Vec<_>>()
    );
    drop(connection);
    for limiter in &limiters {
        limiter.pool().close().await;
    }
    db.finish().await;
}

/// A rolling deploy through the GCRA protocol switch: on a database the ledger-lock releases
/// installed, four replicas (an earlier release's statements, the release before the row-lock
/// protocol, and two of this release) run single checks and two-key batches on 8 shared keys
/// over 3 shards, a burst of 80 in an hour each, and one replica of this release switches the
/// protocol while they run. Before the switch every replica admits; after it the two earlier
/// ones fail closed (errors that consumed nothing) and this release's replicas go on, on row
/// locks. Across the whole run no key admits more than its burst, the stored arrival time of
/// each key is exactly its admissions counted by the clients (no admission decided on a time
/// another had moved, under either protocol or across the switch), no batch committed half,
/// and the row-lock ledger counts the rows of every shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn gcra_replicas_roll_through_the_switch_without_over_admission() {
    const BURST: u64 = 80;
    const EMISSION_INTERVAL_MS: i64 = 45_000;
    const OPERATIONS: usize = 60;
    let db = TestDatabase::create("protocol_switch_gcra").await;
    ledger_lock_gcra_limiter(db.pool(1).await).await;
    let patient = config().with_operation_timeout(Duration::from_secs(10)).unwrap();
    let configs =
        [patient.with_previous_admission_protocol(), patient.with_ledger_lock_protocol(), patient, patient];
    let mut limiters = Vec::new();
    for config in configs {
        limiters.push(Arc::new(PostgresGcraLimiter::new(db.pool(3).await).with_config(config)));
    }
    let policy = Arc::new(gcra_policy("protocol.switch", BURST, 3_600_000, BURST));
    let mut connection = db.connection().await;
    let start_ms = db_now_ms(&mut connection).await;
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // Set before the switch starts and after it committed: an operation that failed must have
    // ended after the first, and one that started after the second runs on row locks.
    let switching = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let switched = Arc::new(std::sync::atomic::AtomicBool::new(false));

    #[derive(Debug, Default)]
    struct Counts {
        singles: u64,
        batches: u64,
        denied: u64,
        fenced_before: u64,
        fenced_after: u64,
        ok_after_switch: u64,
        admitted_after_switch: u64,
        admitted: HashMap<usize, u64>,
    }
    let mut handles = Vec::new();
    for (index, limiter) in limiters.iter().enumerate() {
        for worker in 0..TASKS_PER_LIMITER {
            let (limiter, policy) = (Arc::clone(limiter), Arc::clone(&policy));
            let (done, switching, switched) =
                (Arc::clone(&done), Arc::clone(&switching), Arc::clone(&switched));
            let task = index * TASKS_PER_LIMITER + worker;
            handles.push((
                index,
                tokio::spawn(async move {
                    let mut counts = Counts::default();
                    for operation in 0..OPERATIONS {
                        let keys = scheduled_keys(task, operation);
                        let checks: Vec<_> =
                            keys.iter().map(|&key| gcra_check(&policy, shared_subject(key))).collect();
                        let after = switched.load(std::sync::atomic::Ordering::SeqCst);
                        match limiter.check_all(&checks).await {
                            Ok(decision) => {
                                if after {
                                    counts.ok_after_switch += 1;
                                }
                                if allowed(&decision, keys.len()) {
                                    if after {
                                        counts.admitted_after_switch += 1;
                                    }
                                    if keys.len() == 1 {
                                        counts.singles += 1
                                    } else {
                                        counts.batches += 1
                                    }
                                    for key in keys {
                                        *counts.admitted.entry(key).or_default() += 1;
                                    }
                                } else {
                                    counts.denied += 1;
                                }
                            }
                            Err(error) => {
                                assert!(index < 2, "replica {index} of this release failed: {error:?}");
                                let ended_switching = switching.load(std::sync::atomic::Ordering::SeqCst);
                                assert_eq!(
                                    error.consumption(),
                                    runlimit_core::ConsumptionStatus::NotConsumed,
                                    "{error:?}"
                                );
                                if ended_switching {
                                    counts.fenced_after += 1
                                } else {
                                    counts.fenced_before += 1
                                }
                            }
                        }
                        done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    counts
                }),
            ));
        }
    }
    // Switch a third of the way through.
    let total = LIMITERS * TASKS_PER_LIMITER * OPERATIONS;
    while done.load(std::sync::atomic::Ordering::SeqCst) < total / 3 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    switching.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(limiters[2].switch_to_row_locks().await.unwrap());
    switched.store(true, std::sync::atomic::Ordering::SeqCst);
    let switched_at_operation = done.load(std::sync::atomic::Ordering::SeqCst);
    let mut per_replica: Vec<Counts> = (0..LIMITERS).map(|_| Counts::default()).collect();
    for (index, handle) in handles {
        let counts = handle.await.unwrap();
        let into = &mut per_replica[index];
        into.singles += counts.singles;
        into.batches += counts.batches;
        into.denied += counts.denied;
        into.fenced_before += counts.fenced_before;
        into.fenced_after += counts.fenced_after;
        into.ok_after_switch += counts.ok_after_switch;
        into.admitted_after_switch += counts.admitted_after_switch;
        for (key, count) in counts.admitted {
            *into.admitted.entry(key).or_default() += count;
        }
    }
    let elapsed_ms = db_now_ms(&mut connection).await - start_ms;
    assert!(elapsed_ms < EMISSION_INTERVAL_MS, "no unit can replenish within the test: {elapsed_ms} ms");
    for (index, counts) in per_replica.iter().enumerate() {
        assert!(
            counts.singles + counts.batches > 0,
            "replica {index} admitted before the switch: {counts:?}"
        );
        if index < 2 {
            assert!(counts.fenced_after > 0, "replica {index} was fenced after the switch: {counts:?}");
            assert_eq!(counts.ok_after_switch, 0, "replica {index} decided after the switch: {counts:?}");
        } else {
            assert!(
                counts.admitted_after_switch > 0,
                "replica {index} admitted after the switch: {counts:?}"
            );
        }
        assert_eq!(counts.fenced_before, 0, "replica {index}: {counts:?}");
    }
    let (mut admitted_total, mut singles, mut batches) = (0, 0, 0);
    for counts in &per_replica {
        singles += counts.singles;
        batches += counts.batches;
    }
    for key in 0..SHARED_KEYS {
        let admitted: u64 =
            per_replica.iter().map(|counts| counts.admitted.get(&key).copied().unwrap_or(0)).sum();
        assert!(admitted <= BURST, "key {key}: {admitted} admitted");
        admitted_total += admitted;
        let (tat_ms, tat_remainder): (i64, i64) =
            sqlx::query_as("SELECT tat_ms, tat_remainder FROM public.runlimit_gcra WHERE counter_key = $1")
                .bind(gcra_check(&policy, shared_subject(key)).counter_key().to_bytes().as_slice())
                .fetch_one(&mut connection)
                .await
                .unwrap();
        assert_eq!(tat_remainder, 0, "key {key}");
        assert_eq!(
            (tat_ms - start_ms).div_euclid(EMISSION_INTERVAL_MS),
            i64::try_from(admitted).unwrap(),
            "key {key}: stored arrival time {tat_ms} against {admitted} admissions from {start_ms}"
        );
    }
    assert_eq!(admitted_total, singles + 2 * batches, "no half-committed batch");
    let (ledger, rows) =
        ledger_and_rows(&mut connection, "public.runlimit_gcra_ledger", "public.runlimit_gcra").await;
    assert_eq!(ledger, rows, "the row-lock ledger counts the rows of every shard");
    assert_eq!(rows, vec![(40, 3), (41, 3), (42, 2)]);
    println!(
        "switched after {switched_at_operation} of {total} operations in {elapsed_ms} ms; per replica \
         (admitted singles, batches, denied, fenced): {:?}",
        per_replica.iter().map(|c| (c.singles, c.batches, c.denied, c.fenced_after)).collect::<Vec<_>>()
    );
    drop(connection);
    for limiter in &limiters {
        limiter.pool().close().await;
    }
    db.finish().await;
}
