//! The pinned test clock (`clock.rs`): the frontend-stream rewriter on its own, then the clock
//! and the limiters through the rewriting proxy.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use runlimit_core::{
    Check, Decision, DecisionView, Delay, Denial, GcraPolicy, KeyHasher, PolicyId, QuotaDenial, ScopeId,
    attempts::{AttemptCompletionResult, AttemptDecision, AttemptDenial, AttemptOutcome, AttemptPolicy},
};
use runlimit_postgres::{PostgresGcraLimiter, PostgresLimiter, attempts::PostgresAttemptLimiter};
use sqlx::{
    ConnectOptions, Connection, PgConnection, Row,
    postgres::{PgPoolOptions, PgSslMode},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    time::timeout,
};

use crate::{
    clock::{Action, CLOCK_CALL, EpochMicros, PINNED_CALL, PinnedClock, Rewriter},
    support::{TestDatabase, check, gcra_ledger_table, gcra_limiter_on, policy, subject},
};

// ---------------------------------------------------------------------------------------------
// The rewriter, without a server.

fn typed(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut message = vec![kind];
    message.extend_from_slice(&i32::try_from(4 + body.len()).unwrap().to_be_bytes());
    message.extend_from_slice(body);
    message
}

fn untyped(code: i32, body: &[u8]) -> Vec<u8> {
    let mut packet = i32::try_from(8 + body.len()).unwrap().to_be_bytes().to_vec();
    packet.extend_from_slice(&code.to_be_bytes());
    packet.extend_from_slice(body);
    packet
}

fn startup() -> Vec<u8> {
    untyped(196_608, b"user\0postgres\0database\0test\0\0")
}

fn query(sql: &str) -> Vec<u8> {
    typed(b'Q', format!("{sql}\0").as_bytes())
}

fn parse(name: &str, sql: &str, types: &[i32]) -> Vec<u8> {
    let mut body = format!("{name}\0{sql}\0").into_bytes();
    body.extend_from_slice(&i16::try_from(types.len()).unwrap().to_be_bytes());
    for oid in types {
        body.extend_from_slice(&oid.to_be_bytes());
    }
    typed(b'P', &body)
}

/// A Bind of the unnamed portal to `statement` with one text parameter, then Execute and Sync.
fn bind_execute_sync(statement: &str, parameter: &[u8]) -> Vec<u8> {
    let mut bind = format!("\0{statement}\0").into_bytes();
    bind.extend_from_slice(&0i16.to_be_bytes());
    bind.extend_from_slice(&1i16.to_be_bytes());
    bind.extend_from_slice(&i32::try_from(parameter.len()).unwrap().to_be_bytes());
    bind.extend_from_slice(parameter);
    bind.extend_from_slice(&0i16.to_be_bytes());
    let mut messages = typed(b'B', &bind);
    messages.extend(typed(b'E', b"\0\0\0\0\0"));
    messages.extend(typed(b'S', b""));
    messages
}

fn server_bytes(actions: &[Action]) -> Vec<u8> {
    actions
        .iter()
        .flat_map(|action| match action {
            Action::ToServer(bytes) => bytes.clone(),
            Action::ToClient(bytes) => panic!("unexpected answer to the client: {bytes:?}"),
        })
        .collect()
}

/// A client stream and what the server must receive for it, rewriting `from` into `to`.
fn session(from: &str, to: &str) -> (Vec<u8>, Vec<u8>) {
    let statements = [
        format!("SELECT {from}, {from} AS again"),
        format!("SELECT (EXTRACT(EPOCH FROM {from}) * 1000)::bigint; SELECT 1"),
        "SELECT pg_catalog.clock_timestamp".to_owned(),
    ];
    let mut sent = startup();
    let mut expected = startup();
    for sql in &statements {
        sent.extend(query(sql));
        expected.extend(query(&sql.replace(from, to)));
    }
    let prepared = format!("SELECT {from} + $1::bigint * INTERVAL '1 millisecond'");
    sent.extend(parse("sqlx_s_1", &prepared, &[20]));
    expected.extend(parse("sqlx_s_1", &prepared.replace(from, to), &[20]));
    for stream in [&mut sent, &mut expected] {
        stream.extend(typed(b'D', b"Ssqlx_s_1\0"));
        stream.extend(typed(b'H', b""));
        stream.extend(bind_execute_sync("sqlx_s_1", b"1500"));
        stream.extend(typed(b'X', b""));
    }
    (sent, expected)
}

#[test]
fn rewriter_rewrites_queries_and_parses_across_any_read_boundaries() {
    // The real patterns have the same length (28 bytes), which would hide a length bug; a
    // shorter and a longer replacement prove the length is recomputed.
    assert_eq!(CLOCK_CALL.len(), PINNED_CALL.len());
    for (from, to) in [
        ("pg_catalog.clock_timestamp()", "public.runlimit_test_clock()"),
        ("pg_catalog.clock_timestamp()", "public.t()"),
        ("pg_catalog.clock_timestamp()", "public.a_much_longer_replacement_function_name()"),
    ] {
        let (sent, expected) = session(from, to);
        let leak = |s: &str| -> &'static [u8] { Box::leak(s.as_bytes().to_vec().into_boxed_slice()) };
        let (from, to) = (leak(from), leak(to));

        // Everything in one read: several messages per read, coalesced into one write.
        let mut rewriter = Rewriter::new(from, to);
        let actions = rewriter.feed(&sent).unwrap();
        assert_eq!(actions.len(), 1, "one read, one server write");
        assert_eq!(server_bytes(&actions), expected);
        assert_eq!(rewriter.rewritten, 3);

        // Byte by byte, and in reads of every size from 2 to 40: messages split anywhere.
        for size in 1..=40 {
            let mut rewriter = Rewriter::new(from, to);
            let mut received = Vec::new();
            for chunk in sent.chunks(size) {
                received.extend(server_bytes(&rewriter.feed(chunk).unwrap()));
            }
            assert_eq!(received, expected, "reads of {size} bytes");
            assert_eq!(rewriter.rewritten, 3);
        }
    }
}

#[test]
fn rewriter_touches_only_the_sql_text_of_a_parse() {
    // A statement name and parameter types that happen to contain the pattern's bytes stay.
    let name = "pg_catalog.clock_timestamp()";
    let sent = parse(name, "SELECT 1", &[0x2829_2829]);
    let mut rewriter = Rewriter::new(CLOCK_CALL, PINNED_CALL);
    let mut stream = startup();
    stream.extend(&sent);
    assert_eq!(server_bytes(&rewriter.feed(&stream).unwrap()), stream);
    assert_eq!(rewriter.rewritten, 0);
    // Other message types are never rewritten, even when they carry the text.
    let mut rewriter = Rewriter::new(CLOCK_CALL, PINNED_CALL);
    let mut stream = startup();
    stream.extend(typed(b'd', b"COPY DATA pg_catalog.clock_timestamp()\n"));
    stream.extend(bind_execute_sync("pg_catalog.clock_timestamp()", b"pg_catalog.clock_timestamp()"));
    assert_eq!(server_bytes(&rewriter.feed(&stream).unwrap()), stream);
    assert_eq!(rewriter.rewritten, 0);
}

#[test]
fn rewriter_declines_encryption_requests_itself() {
    let ssl = untyped(80_877_103, b"");
    let gss = untyped(80_877_104, b"");
    let mut rewriter = Rewriter::new(CLOCK_CALL, PINNED_CALL);
    // Split, as a slow client might send it.
    assert_eq!(rewriter.feed(&ssl[..3]).unwrap(), vec![]);
    assert_eq!(rewriter.feed(&ssl[3..]).unwrap(), vec![Action::ToClient(b"N".to_vec())]);
    assert!(rewriter.in_startup());
    assert_eq!(rewriter.feed(&gss).unwrap(), vec![Action::ToClient(b"N".to_vec())]);
    assert!(rewriter.in_startup());
    let mut stream = startup();
    stream.extend(query("SELECT pg_catalog.clock_timestamp()"));
    let actions = rewriter.feed(&stream).unwrap();
    assert!(!rewriter.in_startup());
    let mut expected = startup();
    expected.extend(query("SELECT public.runlimit_test_clock()"));
    assert_eq!(server_bytes(&actions), expected);
    assert_eq!(rewriter.declined, 2);
}

#[test]
fn rewriter_relays_a_cancel_request_and_refuses_garbage() {
    let cancel = untyped(80_877_102, &[0, 0, 0, 42, 1, 2, 3, 4]);
    let mut rewriter = Rewriter::new(CLOCK_CALL, PINNED_CALL);
    assert_eq!(server_bytes(&rewriter.feed(&cancel).unwrap()), cancel);
    assert!(!rewriter.in_startup());

    let mut rewriter = Rewriter::new(CLOCK_CALL, PINNED_CALL);
    assert!(rewriter.feed(&[0, 0, 0, 4, 0, 0, 0, 0]).is_err(), "startup length below 8");
    let mut rewriter = Rewriter::new(CLOCK_CALL, PINNED_CALL);
    let mut stream = startup();
    stream.extend([b'Q', 0, 0, 0, 3]);
    assert!(rewriter.feed(&stream).is_err(), "typed length below 4");
}

#[test]
fn timestamptz_text_decodes_exactly() {
    let cases = [
        ("1970-01-01 00:00:00+00", 0),
        ("1970-01-01 00:00:00.5+00", 500_000),
        ("2000-01-01 00:00:00+00", 946_684_800_000_000),
        ("2000-02-29 23:59:59.999999+00", 951_868_799_999_999),
        ("2026-12-31 01:02:03.04+00", 1_798_678_923_040_000),
    ];
    for (text, micros) in cases {
        assert_eq!(crate::clock::parse_utc_timestamp(text), Some(micros), "{text}");
    }
    assert_eq!(crate::clock::parse_utc_timestamp("2026-12-31 01:02:03+01"), None);
}

// ---------------------------------------------------------------------------------------------
// Through the proxy, on a server.

fn system_now_ms() -> i64 {
    i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap()
}

/// The pinned instant through the proxy: a simple query (`raw_sql`, text results) and a
/// prepared, cached statement with a bind (binary results).
async fn pinned_through_proxy(connection: &mut PgConnection) -> (i64, i64) {
    let row = sqlx::raw_sql("SELECT pg_catalog.clock_timestamp()").fetch_one(&mut *connection).await.unwrap();
    let EpochMicros(simple) = row.try_get(0).unwrap();
    let row = sqlx::query("SELECT pg_catalog.clock_timestamp() AS pinned, $1::bigint AS marker_4711")
        .bind(4_711_i64)
        .fetch_one(&mut *connection)
        .await
        .unwrap();
    let EpochMicros(prepared) = row.try_get("pinned").unwrap();
    assert_eq!(row.try_get::<i64, _>("marker_4711").unwrap(), 4_711);
    (simple, prepared)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn pinned_clock_reads_exactly_through_simple_and_prepared_statements() {
    let db = TestDatabase::create("clock_pinned_reads").await;
    let mut clock = PinnedClock::install(&db).await;
    let origin_us = clock.origin_ms() * 1_000;
    assert!(clock.origin_ms() - system_now_ms() > 23 * 3_600_000, "the origin is about a day ahead");
    let mut proxied = clock.options().connect().await.unwrap();

    assert_eq!(pinned_through_proxy(&mut proxied).await, (origin_us, origin_us));
    // The clock does not move by itself.
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(pinned_through_proxy(&mut proxied).await, (origin_us, origin_us));

    clock.advance(1_500).await;
    assert_eq!(clock.stored_ms().await, clock.origin_ms() + 1_500);
    let later = origin_us + 1_500_000;
    assert_eq!(pinned_through_proxy(&mut proxied).await, (later, later));

    // The prepared statement was reused, not re-prepared, and the server holds it rewritten.
    let statements: Vec<String> = sqlx::raw_sql(
        "SELECT statement FROM pg_catalog.pg_prepared_statements \
         WHERE pg_catalog.strpos(statement, 'marker_4711') > 0",
    )
    .fetch_all(&mut proxied)
    .await
    .unwrap()
    .iter()
    .map(|row| row.get(0))
    .collect();
    assert_eq!(statements, ["SELECT public.runlimit_test_clock() AS pinned, $1::bigint AS marker_4711"]);

    // Every clock call in a statement is rewritten, whatever surrounds it.
    let (epoch_ms, date_part_ms): (i64, i64) = sqlx::query_as(
        "SELECT pg_catalog.floor(EXTRACT(EPOCH FROM pg_catalog.clock_timestamp()) * 1000)::bigint, \
         pg_catalog.floor(pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()) * 1000)::bigint",
    )
    .fetch_one(&mut proxied)
    .await
    .unwrap();
    assert_eq!((epoch_ms, date_part_ms), (clock.now_ms(), clock.now_ms()));

    proxied.close().await.unwrap();
    clock.close().await;
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn direct_connections_keep_the_real_clock() {
    let db = TestDatabase::create("clock_direct_real").await;
    let mut clock = PinnedClock::install(&db).await;
    clock.advance(60_000).await;
    let mut direct = db.connection().await;
    let first = real_ms(&mut direct).await;
    assert!((first - system_now_ms()).abs() < 60_000, "the direct clock is the real one: {first}");
    assert!(clock.now_ms() - first > 23 * 3_600_000);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let second = real_ms(&mut direct).await;
    assert!(second - first >= 50, "the real clock moves: {first} -> {second}");
    // The pinned clock's function is there for anyone who calls it by name.
    let EpochMicros(pinned) =
        sqlx::query_scalar("SELECT public.runlimit_test_clock()").fetch_one(&mut direct).await.unwrap();
    assert_eq!(pinned, clock.now_ms() * 1_000);
    direct.close().await.unwrap();
    clock.close().await;
    db.finish().await;
}

async fn real_ms(connection: &mut PgConnection) -> i64 {
    sqlx::query_scalar(
        "SELECT pg_catalog.floor(EXTRACT(EPOCH FROM pg_catalog.clock_timestamp()) * 1000)::bigint",
    )
    .fetch_one(connection)
    .await
    .unwrap()
}

/// Reads one byte, with a timeout.
async fn read_byte(stream: &mut TcpStream) -> u8 {
    let mut byte = [0u8];
    timeout(Duration::from_secs(10), stream.read_exact(&mut byte)).await.expect("reply in time").unwrap();
    byte[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn proxy_declines_ssl_and_gssenc_requests_and_then_starts_up() {
    let db = TestDatabase::create("clock_no_tls").await;
    let clock = PinnedClock::install(&db).await;
    let ssl = untyped(80_877_103, b"");
    let gss = untyped(80_877_104, b"");

    // What the server itself answers: on the reference server (ssl = on, GSSAPI built in) 'S'
    // and 'G', so forwarding the requests would let a TLS-capable client encrypt the stream.
    let server = format!("{}:{}", db.options.get_host(), db.options.get_port());
    for (request, accepted, name) in [(&ssl, b'S', "SSLRequest"), (&gss, b'G', "GSSENCRequest")] {
        let mut direct = TcpStream::connect(&server).await.unwrap();
        direct.write_all(request).await.unwrap();
        let answer = read_byte(&mut direct).await;
        assert!(answer == accepted || answer == b'N', "server answered {answer:#04x}");
        eprintln!("the server itself answers {:?} to an {name}", char::from(answer));
    }

    // Through the proxy: 'N' to both, then an ordinary plaintext startup.
    let mut stream = TcpStream::connect(("127.0.0.1", clock.proxy_port())).await.unwrap();
    stream.write_all(&ssl).await.unwrap();
    assert_eq!(read_byte(&mut stream).await, b'N');
    stream.write_all(&gss).await.unwrap();
    assert_eq!(read_byte(&mut stream).await, b'N');
    let parameters = format!("user\0{}\0database\0{}\0\0", db.options.get_username(), db.name);
    stream.write_all(&untyped(196_608, parameters.as_bytes())).await.unwrap();
    // AuthenticationOk under trust authentication, or another authentication request: either
    // way a plaintext backend message.
    assert_eq!(read_byte(&mut stream).await, b'R');
    stream.write_all(&typed(b'X', b"")).await.unwrap();
    drop(stream);

    // SQLx through the proxy with sslmode=prefer (it sends an SSLRequest only when built with
    // TLS; either way the session is plaintext and rewritten).
    let mut prefer = clock.options().ssl_mode(PgSslMode::Prefer).connect().await.unwrap();
    let EpochMicros(pinned) =
        sqlx::query_scalar("SELECT pg_catalog.clock_timestamp()").fetch_one(&mut prefer).await.unwrap();
    assert_eq!(pinned, clock.origin_ms() * 1_000);
    let ssl_in_use: bool =
        sqlx::query_scalar("SELECT ssl FROM pg_catalog.pg_stat_ssl WHERE pid = pg_catalog.pg_backend_pid()")
            .fetch_one(&mut prefer)
            .await
            .unwrap();
    assert!(!ssl_in_use);
    prefer.close().await.unwrap();
    clock.close().await;
    db.finish().await;
}

fn gcra(quota: u64, period_ms: u64, burst: u64) -> GcraPolicy {
    GcraPolicy::new(
        PolicyId::new("clock.gcra").unwrap(),
        ScopeId::new("subject").unwrap(),
        quota,
        Duration::from_millis(period_ms),
        burst,
    )
    .unwrap()
}

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

/// A backwards step of the database clock after one-check GCRA admissions of a stored key
/// (which leave the shard's watermark where the key's insert put it) replenishes nothing early:
/// the key is judged at the earlier reading, which only makes it wait longer, cleanup keeps its
/// row, and once cleanup has deleted a rested row (advancing the watermark), a step back still
/// evaluates the key, new again, at the watermark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn a_backwards_step_after_gcra_admissions_replenishes_nothing_early() {
    for row_locks in [false, true] {
        a_backwards_step_replenishes_nothing_early(row_locks).await;
    }
}

async fn a_backwards_step_replenishes_nothing_early(row_locks: bool) {
    let db = TestDatabase::create(if row_locks { "clock_gcra_backwards_rl" } else { "clock_gcra_backwards" })
        .await;
    let direct = db.pool(2).await;
    gcra_limiter_on(direct.clone(), row_locks).await;
    let mut clock = PinnedClock::install(&db).await;
    let proxied =
        db.pool_with(sqlx::postgres::PgPoolOptions::new().max_connections(2), clock.options()).await;
    let limiter = PostgresGcraLimiter::new(proxied.clone());
    // One unit per 1,000 ms, burst 2.
    let policy = gcra(1, 1_000, 2);
    let key = Check::new(subject(5, 1).bind(&policy));
    let stored_tat = || async {
        sqlx::query_scalar::<_, i64>("SELECT tat_ms FROM public.runlimit_gcra")
            .fetch_one(&direct)
            .await
            .unwrap()
    };
    let origin = clock.now_ms();
    assert_eq!(allowed(limiter.check(&key).await.unwrap().view()), (1, 1_000)); // insert: tat +1,000
    clock.advance(500).await;
    assert_eq!(allowed(limiter.check(&key).await.unwrap().view()), (0, 1_500)); // tat +2,000
    clock.advance(1_000).await;
    assert_eq!(allowed(limiter.check(&key).await.unwrap().view()), (0, 1_500)); // tat +3,000
    assert_eq!(stored_tat().await, origin + 3_000);

    // The clock steps back 900 ms, to +600. At +1,500 the key would wait 500 ms; judged at
    // +600 (the watermark is the insert's +0) it waits 1,400 ms: longer, never shorter.
    clock.step_back(900).await;
    assert_eq!(retry(limiter.check(&key).await.unwrap().view()), 1_400);
    assert_eq!(stored_tat().await, origin + 3_000, "a denial consumes nothing");
    assert_eq!(limiter.cleanup_expired(1_000).await.unwrap(), 0, "the live row is kept");

    // At +3,000 the key is rested; cleanup deletes its row and moves the watermark to +3,000.
    clock.advance(2_400).await;
    assert_eq!(limiter.cleanup_expired(1_000).await.unwrap(), 1);
    // A step back to +2,000: the key, new again, is judged at the watermark (+3,000), so its
    // first unit replenishes at +4,000, not at +3,000.
    clock.step_back(1_000).await;
    assert_eq!(allowed(limiter.check(&key).await.unwrap().view()), (1, 1_000));
    assert_eq!(stored_tat().await, origin + 4_000);
    proxied.close().await;
    clock.close().await;
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn limiters_decide_at_the_pinned_instant() {
    for row_locks in [false, true] {
        limiters_decide_at_the_instant(row_locks).await;
    }
}

async fn limiters_decide_at_the_instant(row_locks: bool) {
    let db = TestDatabase::create(if row_locks { "clock_limiters_rl" } else { "clock_limiters" }).await;
    let direct = db.pool(2).await;
    PostgresLimiter::new(direct.clone()).migrate().await.unwrap();
    gcra_limiter_on(direct.clone(), row_locks).await;
    PostgresAttemptLimiter::new(direct.clone()).migrate().await.unwrap();
    let mut clock = PinnedClock::install(&db).await;
    let proxied =
        db.pool_with(sqlx::postgres::PgPoolOptions::new().max_connections(2), clock.options()).await;

    // GCRA: 3 per 1,000 ms, burst 2.
    let limiter = PostgresGcraLimiter::new(proxied.clone());
    let policy_gcra = gcra(3, 1_000, 2);
    let key = Check::new(subject(3, 1).bind(&policy_gcra));
    let ledger = gcra_ledger_table(&mut direct.acquire().await.unwrap()).await;
    let watermark_sql = format!("SELECT watermark_ms FROM {ledger} WHERE shard = 3");
    let before: i64 =
        sqlx::query_scalar(sqlx::AssertSqlSafe(watermark_sql.clone())).fetch_one(&direct).await.unwrap();
    let inserted_at = clock.now_ms();
    assert_eq!(allowed(limiter.check(&key).await.unwrap().view()), (1, 334));
    assert_eq!(allowed(limiter.check(&key).await.unwrap().view()), (0, 667));
    assert_eq!(retry(limiter.check(&key).await.unwrap().view()), 334);
    assert_eq!(retry(limiter.check(&key).await.unwrap().view()), 334, "time stands still");
    clock.advance(333).await;
    assert_eq!(retry(limiter.check(&key).await.unwrap().view()), 1);
    clock.advance(1).await;
    // At +334 ms the arrival time was 666.67 ms; it becomes exactly 1,000 ms.
    assert_eq!(allowed(limiter.check(&key).await.unwrap().view()), (0, 666));
    let watermark: i64 =
        sqlx::query_scalar(sqlx::AssertSqlSafe(watermark_sql.clone())).fetch_one(&direct).await.unwrap();
    // On ledger locks the insert committed the instant it used; the admissions of the stored key
    // after it leave the watermark to cleanup (see `src/gcra/one.rs`). On row locks the insert
    // leaves it too (see `src/gcra/rowlock.rs`).
    let expected = if row_locks { before } else { inserted_at };
    assert_eq!(watermark, expected, "the committed watermark");
    assert_eq!(limiter.cleanup_expired(1_000).await.unwrap(), 0);
    clock.advance(665).await;
    assert_eq!(limiter.cleanup_expired(1_000).await.unwrap(), 0, "rested only at +1,000 ms");
    clock.advance(1).await;
    assert_eq!(limiter.cleanup_expired(1_000).await.unwrap(), 1);
    let watermark: i64 =
        sqlx::query_scalar(sqlx::AssertSqlSafe(watermark_sql)).fetch_one(&direct).await.unwrap();
    assert_eq!(watermark, clock.now_ms(), "the cleanup committed the pinned instant it deleted at");

    // Fixed window: 2 per 1,000 ms, anchored at the pinned instant.
    let limiter = PostgresLimiter::new(proxied.clone());
    let policy_fixed = policy("clock.fixed", 2, Duration::from_millis(1_000));
    let key = check(&policy_fixed, subject(4, 1));
    let anchor = clock.now_ms();
    assert_eq!(allowed(limiter.check(&key).await.unwrap().view()), (1, 1_000));
    assert_eq!(allowed(limiter.check(&key).await.unwrap().view()), (0, 1_000));
    assert_eq!(retry(limiter.check(&key).await.unwrap().view()), 1_000);
    let (started, expires): (i64, i64) = sqlx::query_as(
        "SELECT (EXTRACT(EPOCH FROM window_started_at) * 1000000)::bigint, \
         (EXTRACT(EPOCH FROM window_expires_at) * 1000000)::bigint FROM public.runlimit_fixed_windows",
    )
    .fetch_one(&direct)
    .await
    .unwrap();
    assert_eq!((started, expires), (anchor * 1_000, (anchor + 1_000) * 1_000));
    clock.advance(400).await;
    assert_eq!(retry(limiter.check(&key).await.unwrap().view()), 600);
    clock.advance(599).await;
    assert_eq!(retry(limiter.check(&key).await.unwrap().view()), 1);
    assert_eq!(limiter.cleanup_expired(1_000).await.unwrap(), 0);
    clock.advance(1).await;
    assert_eq!(limiter.cleanup_expired(1_000).await.unwrap(), 1, "expired exactly at +1,000 ms");
    assert_eq!(allowed(limiter.check(&key).await.unwrap().view()), (1, 1_000));

    // Attempts: 1 s initial delay, 5 s lease.
    let limiter = PostgresAttemptLimiter::new(proxied.clone());
    let attempt_policy = AttemptPolicy::new(
        PolicyId::new("clock.attempts").unwrap(),
        ScopeId::new("identity").unwrap(),
        Duration::from_secs(1),
        Duration::from_secs(8),
        Duration::from_secs(60),
        Duration::from_secs(5),
    )
    .unwrap();
    let hasher = KeyHasher::new(&[7; 32]).unwrap();
    let subject = hasher.hash_attempt_for(&attempt_policy, b"alice");
    let AttemptDecision::Admitted(receipt) = limiter.acquire(&subject).await.unwrap() else { panic!() };
    let AttemptDecision::Denied(denial) = limiter.acquire(&subject).await.unwrap() else { panic!() };
    assert_eq!(denial, AttemptDenial::InProgress { retry_after: Delay::from_millis(5_000) });
    clock.advance(2_000).await;
    assert_eq!(
        limiter.complete(receipt, AttemptOutcome::Failure).await.unwrap(),
        AttemptCompletionResult::FailureRecorded {
            consecutive_failures: 1,
            retry_after: Delay::from_millis(1_000)
        }
    );
    let AttemptDecision::Denied(denial) = limiter.acquire(&subject).await.unwrap() else { panic!() };
    assert_eq!(
        denial,
        AttemptDenial::Backoff { retry_after: Delay::from_millis(1_000), consecutive_failures: 1 }
    );
    clock.advance(999).await;
    let AttemptDecision::Denied(denial) = limiter.acquire(&subject).await.unwrap() else { panic!() };
    assert_eq!(
        denial,
        AttemptDenial::Backoff { retry_after: Delay::from_millis(1), consecutive_failures: 1 }
    );
    clock.advance(1).await;
    assert!(matches!(limiter.acquire(&subject).await.unwrap(), AttemptDecision::Admitted(_)));

    proxied.close().await;
    direct.close().await;
    clock.close().await;
    db.finish().await;
}

/// Sets the pinned instant to `micros` since the Unix epoch (a sub-millisecond instant, which
/// `PinnedClock::advance` cannot reach).
async fn pin_micros(connection: &mut PgConnection, micros: i64) {
    sqlx::query(
        "UPDATE public.runlimit_test_clock \
         SET pinned = pg_catalog.to_timestamp(0) + $1::bigint * INTERVAL '1 microsecond'",
    )
    .bind(micros)
    .execute(connection)
    .await
    .expect("pin a sub-millisecond instant");
}

/// A window written by a release that anchored at the microsecond ends at `origin + 500 µs`.
/// Admission rounds that end up to `origin + 1 ms`, so at `origin + 700 µs` the window is still
/// live for it (retry 1 ms); cleanup must agree and keep the row, or the next check would open
/// a fresh window a fraction of a millisecond early. Regression test: cleanup once compared at
/// the microsecond and deleted it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RUNLIMIT_POSTGRES_TEST_DATABASE_URL"]
async fn cleanup_keeps_a_legacy_window_that_admission_still_counts() {
    let database = TestDatabase::create("clock_legacy_window").await;
    let direct = database.pool(2).await;
    PostgresLimiter::new(direct.clone()).migrate().await.expect("migrate");
    let clock = PinnedClock::install(&database).await;
    let proxied = database.pool_with(PgPoolOptions::new().max_connections(2), clock.options()).await;
    let limiter = PostgresLimiter::new(proxied.clone());
    let origin_us = clock.origin_ms() * 1_000;
    let policy = policy("clock.legacy", 1, Duration::from_secs(1));
    let check = check(&policy, subject(9, 1));
    sqlx::query(
        "INSERT INTO public.runlimit_fixed_windows (counter_key, used, window_started_at, window_expires_at) \
         VALUES ($1, 1, pg_catalog.to_timestamp(0) + $2::bigint * INTERVAL '1 microsecond', \
                 pg_catalog.to_timestamp(0) + $3::bigint * INTERVAL '1 microsecond')",
    )
    .bind(check.counter_key().to_bytes().as_slice())
    .bind(origin_us + 500 - 1_000_000)
    .bind(origin_us + 500)
    .execute(&direct)
    .await
    .expect("insert a legacy row");
    let mut connection = database.connection().await;
    pin_micros(&mut connection, origin_us + 700).await;

    let quota = QuotaDenial::new(policy.limit(), Delay::from_millis(1));
    assert_eq!(limiter.check(&check).await.unwrap(), Decision::denied(Denial::QuotaExceeded(quota)));
    assert_eq!(limiter.cleanup_expired(10).await.unwrap(), 0, "cleanup deleted a window admission counts");
    assert_eq!(limiter.check(&check).await.unwrap(), Decision::denied(Denial::QuotaExceeded(quota)));
    // From the rounded-up end on, both agree that the window is over.
    pin_micros(&mut connection, origin_us + 1_000).await;
    assert_eq!(limiter.cleanup_expired(10).await.unwrap(), 1);
    assert!(limiter.check(&check).await.unwrap().permits_request());
    proxied.close().await;
    direct.close().await;
    clock.close().await;
    database.finish().await;
}
