//! A pinned database clock for exact-time tests, installed from outside the production code.
//!
//! The limiters read time only through `pg_catalog.clock_timestamp()`, and production code has
//! no clock hook. [`PinnedClock::install`] puts a one-row table `public.runlimit_test_clock
//! (pinned timestamptz)` and a `VOLATILE` SQL function `public.runlimit_test_clock()` returning
//! it into a test database (one fresh database per test, so nothing shared changes), and starts
//! a loopback TCP proxy in front of the server that rewrites every occurrence of the exact text
//! `pg_catalog.clock_timestamp()` into `public.runlimit_test_clock()` inside the SQL of simple
//! `Query` ('Q') and extended `Parse` ('P') messages, fixing the message length. Everything
//! else is relayed byte for byte. A limiter on a pool built from [`PinnedClock::options`]
//! therefore decides at the pinned instant, which moves only with [`PinnedClock::advance`];
//! connections made directly to the server (migrations, assertions) still see the real clock.
//! The clock calls inside Runlimit's admission functions never cross the wire, so `install`
//! also redefines, in the test database only, every `public.runlimit_*` function whose body
//! calls `pg_catalog.clock_timestamp()` with that call replaced by the pinned one: migrate every
//! stream the test uses before installing the clock.
//!
//! The rewrite replaces a function call that PostgreSQL evaluates at execution time, so a
//! statement SQLx prepared and cached before an `advance` reads the new instant when it runs
//! again. Everything the function reads is schema-qualified, so it reads the same tables whatever
//! `search_path` a limiter's transaction runs with.
//!
//! The proxy answers an `SSLRequest` or `GSSENCRequest` with 'N' itself and never forwards it:
//! the test server may well accept TLS (the reference server has `ssl = on` and answers 'S'),
//! and an encrypted stream could not be rewritten. [`PinnedClock::options`] also sets
//! `sslmode=disable`, so SQLx does not ask in the first place.
//!
//! Usable from any test binary: `#[path = "postgres/clock.rs"] mod clock;` next to
//! `#[path = "postgres/support.rs"] mod support;`.

#![allow(dead_code)]

use sqlx::{
    PgPool,
    postgres::{PgConnectOptions, PgPoolOptions, PgSslMode},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    task::AbortHandle,
};

use crate::support::TestDatabase;

/// The clock call every limiter statement makes, byte for byte.
pub(crate) const CLOCK_CALL: &[u8] = b"pg_catalog.clock_timestamp()";

/// What the proxy puts in its place.
pub(crate) const PINNED_CALL: &[u8] = b"public.runlimit_test_clock()";

/// How far ahead of the real clock the pinned origin starts: committed state written at
/// real-clock time (for example a GCRA shard watermark) stays behind the pinned clock.
const ORIGIN_LEAD: &str = "1 day";

/// Installs the table, its single row (the origin: the real clock plus a day, truncated to a
/// whole second) and the function. Runs on a direct connection, so its own clock call is the
/// real one. The unique index on a constant keeps the table at one row.
const INSTALL: &str = "\
CREATE TABLE public.runlimit_test_clock (pinned timestamp with time zone NOT NULL);
CREATE UNIQUE INDEX runlimit_test_clock_one_row ON public.runlimit_test_clock ((true));
INSERT INTO public.runlimit_test_clock (pinned)
    VALUES (pg_catalog.date_trunc('second', pg_catalog.clock_timestamp() + INTERVAL '{lead}'));
CREATE FUNCTION public.runlimit_test_clock() RETURNS timestamp with time zone
    LANGUAGE sql VOLATILE PARALLEL UNSAFE
    AS $$ SELECT c.pinned FROM public.runlimit_test_clock AS c $$;
DO $install$
DECLARE
    f oid;
BEGIN
    FOR f IN
        SELECT p.oid
        FROM pg_catalog.pg_proc AS p
        JOIN pg_catalog.pg_namespace AS n ON n.oid = p.pronamespace
        WHERE n.nspname = 'public'
          AND p.proname LIKE 'runlimit%'
          AND p.prosrc LIKE '%pg_catalog.clock_timestamp()%'
    LOOP
        EXECUTE pg_catalog.replace(
            pg_catalog.pg_get_functiondef(f),
            'pg_catalog.clock_timestamp()',
            'public.runlimit_test_clock()'
        );
    END LOOP;
END
$install$;";

/// The pinned instant in whole milliseconds since the Unix epoch.
const READ_MS: &str =
    "SELECT (EXTRACT(EPOCH FROM c.pinned) * 1000)::bigint AS pinned_ms FROM public.runlimit_test_clock AS c";

/// Sets the pinned instant to `$1` milliseconds since the Unix epoch, returning it as read back.
const SET_MS: &str = "UPDATE public.runlimit_test_clock \
     SET pinned = pg_catalog.to_timestamp(0) + $1::bigint * INTERVAL '1 millisecond' \
     RETURNING (EXTRACT(EPOCH FROM pinned) * 1000)::bigint AS pinned_ms";

/// A database clock pinned at a fixed origin and moved only by [`advance`](Self::advance).
#[derive(Debug)]
pub(crate) struct PinnedClock {
    /// A direct (unproxied) pool on the test database, for moving the clock.
    direct: PgPool,
    proxy: RewritingProxy,
    options: PgConnectOptions,
    origin_ms: i64,
    elapsed_ms: u64,
}

impl PinnedClock {
    /// Installs the pinned clock into `database`, pins it at its origin and starts the
    /// rewriting proxy. Call it after migrating (on a direct connection).
    pub(crate) async fn install(database: &TestDatabase) -> Self {
        let direct =
            database.pool_with(PgPoolOptions::new().max_connections(1), database.options.clone()).await;
        sqlx::raw_sql(sqlx::AssertSqlSafe(INSTALL.replace("{lead}", ORIGIN_LEAD)))
            .execute(&direct)
            .await
            .expect("install the pinned test clock");
        let origin_ms: i64 =
            sqlx::query_scalar(READ_MS).fetch_one(&direct).await.expect("read the pinned origin");
        assert_eq!(origin_ms % 1_000, 0, "the pinned origin is a whole second");
        let proxy = RewritingProxy::start(&database.options).await;
        let options = proxy.options(&database.options);
        Self { direct, proxy, options, origin_ms, elapsed_ms: 0 }
    }

    /// Connect options for the test database through the rewriting proxy, TLS disabled. Build
    /// the pool of the limiter under test from these; run migrations without them.
    pub(crate) fn options(&self) -> PgConnectOptions {
        self.options.clone()
    }

    /// Moves the pinned clock forward by `millis`, committed before it returns: every later
    /// statement through the proxy reads the new instant.
    pub(crate) async fn advance(&mut self, millis: u64) {
        let elapsed = self.elapsed_ms.checked_add(millis).expect("pinned clock overflow");
        let target = i64::try_from(elapsed)
            .ok()
            .and_then(|elapsed| self.origin_ms.checked_add(elapsed))
            .expect("pinned clock beyond i64 milliseconds");
        let stored: i64 = sqlx::query_scalar(SET_MS)
            .bind(target)
            .fetch_one(&self.direct)
            .await
            .expect("advance the pinned clock");
        assert_eq!(stored, target, "the pinned clock stores whole milliseconds exactly");
        self.elapsed_ms = elapsed;
    }

    /// The origin, in milliseconds since the Unix epoch (a whole second).
    pub(crate) fn origin_ms(&self) -> i64 {
        self.origin_ms
    }

    /// Milliseconds advanced since the origin.
    pub(crate) fn elapsed_ms(&self) -> u64 {
        self.elapsed_ms
    }

    /// The pinned instant, in milliseconds since the Unix epoch.
    pub(crate) fn now_ms(&self) -> i64 {
        self.origin_ms + i64::try_from(self.elapsed_ms).expect("elapsed fits i64")
    }

    /// Moves the pinned clock back by `millis` (a backwards step of the database clock), not
    /// before its origin.
    pub(crate) async fn step_back(&mut self, millis: u64) {
        let elapsed = self.elapsed_ms.checked_sub(millis).expect("stepped back before the origin");
        self.elapsed_ms = 0;
        self.advance(elapsed).await;
    }

    /// The pinned instant as stored in the database, in milliseconds since the Unix epoch.
    pub(crate) async fn stored_ms(&self) -> i64 {
        sqlx::query_scalar(READ_MS).fetch_one(&self.direct).await.expect("read the pinned clock")
    }

    /// Stops the proxy (open connections end with their sockets) and closes the direct pool.
    pub(crate) async fn close(self) {
        drop(self.proxy);
        self.direct.close().await;
    }

    /// The proxy's loopback port.
    pub(crate) fn proxy_port(&self) -> u16 {
        self.proxy.port
    }
}

/// A loopback TCP proxy in front of the test server that rewrites the clock call in every
/// frontend `Query` and `Parse` message (a sibling of `support::Proxy`, which cuts connections
/// instead). Dropping it stops accepting; open connections end with their sockets or with the
/// runtime.
#[derive(Debug)]
pub(crate) struct RewritingProxy {
    pub(crate) port: u16,
    listener: AbortHandle,
}

impl RewritingProxy {
    /// Starts the proxy for the server of `upstream`, on the current tokio runtime.
    pub(crate) async fn start(upstream: &PgConnectOptions) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind rewriting proxy");
        let port = listener.local_addr().expect("rewriting proxy address").port();
        let target = format!("{}:{}", upstream.get_host(), upstream.get_port());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let target = target.clone();
                tokio::spawn(async move {
                    match TcpStream::connect(&target).await {
                        Ok(server) => match relay(client, server).await {
                            // A peer that resets or drops its socket just ends the session.
                            Err(error) if error.kind() == std::io::ErrorKind::Other => {
                                eprintln!("runlimit test clock proxy: closed a connection: {error}");
                            }
                            Ok(()) | Err(_) => {}
                        },
                        Err(error) => eprintln!("runlimit test clock proxy: cannot reach {target}: {error}"),
                    }
                });
            }
        });
        Self { port, listener: task.abort_handle() }
    }

    /// `base` through the proxy, with TLS disabled.
    pub(crate) fn options(&self, base: &PgConnectOptions) -> PgConnectOptions {
        base.clone().host("127.0.0.1").port(self.port).ssl_mode(PgSslMode::Disable)
    }
}

impl Drop for RewritingProxy {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

/// Relays one connection: the startup phase sequentially (the proxy itself answers encryption
/// requests), then both directions at once, the frontend stream through a [`Rewriter`] and the
/// backend stream byte for byte. Returns when either side closes.
async fn relay(client: TcpStream, server: TcpStream) -> std::io::Result<()> {
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let mut rewriter = Rewriter::new(CLOCK_CALL, PINNED_CALL);
    let mut buffer = vec![0u8; 64 * 1024];

    // The backend sends nothing before it has a startup packet, so until the rewriter leaves
    // the startup phase only the proxy writes to the client.
    while rewriter.in_startup() {
        let n = client_read.read(&mut buffer).await?;
        if n == 0 {
            return Ok(());
        }
        for action in rewriter.feed(&buffer[..n]).map_err(std::io::Error::other)? {
            match action {
                Action::ToServer(bytes) => server_write.write_all(&bytes).await?,
                Action::ToClient(bytes) => client_write.write_all(&bytes).await?,
            }
        }
    }

    let upstream = async {
        loop {
            let n = client_read.read(&mut buffer).await?;
            if n == 0 {
                return server_write.shutdown().await;
            }
            for action in rewriter.feed(&buffer[..n]).map_err(std::io::Error::other)? {
                match action {
                    Action::ToServer(bytes) => server_write.write_all(&bytes).await?,
                    Action::ToClient(_) => {
                        return Err(std::io::Error::other(
                            "the proxy answers the client only during startup",
                        ));
                    }
                }
            }
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

/// The `SSLRequest` code (1234.5679).
const SSL_REQUEST: i32 = 80_877_103;
/// The `GSSENCRequest` code (1234.5680).
const GSSENC_REQUEST: i32 = 80_877_104;
/// The `CancelRequest` code (1234.5678).
const CANCEL_REQUEST: i32 = 80_877_102;
/// The server's own bound on a startup packet (`MAX_STARTUP_PACKET_LENGTH`).
const MAX_STARTUP_PACKET: usize = 10_000;

/// What the proxy does with bytes the client sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// Forward to the server.
    ToServer(Vec<u8>),
    /// Answer the client directly (only the 'N' to an encryption request).
    ToClient(Vec<u8>),
}

/// Where the frontend stream is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Untyped packets: `Int32 length` (including itself), `Int32 code`, body.
    Startup,
    /// Typed messages: `Byte1 type`, `Int32 length` (including itself, not the type), body.
    Typed,
    /// After a `CancelRequest`: nothing more is expected; relay whatever comes unchanged.
    Raw,
}

/// A protocol violation the proxy refuses to relay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProtocolError(String);

impl std::fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ProtocolError {}

/// Frames the PostgreSQL frontend stream and rewrites `from` into `to` in the SQL text of every
/// `Query` and `Parse` message. Feed it the bytes of each read, in order; it buffers a partial
/// message until the rest arrives, and handles any number of messages per read.
#[derive(Debug)]
pub(crate) struct Rewriter {
    from: &'static [u8],
    to: &'static [u8],
    phase: Phase,
    pending: Vec<u8>,
    /// How many `Query`/`Parse` messages were rewritten (at least one replacement).
    pub(crate) rewritten: usize,
    /// How many encryption requests the proxy declined.
    pub(crate) declined: usize,
}

impl Rewriter {
    pub(crate) fn new(from: &'static [u8], to: &'static [u8]) -> Self {
        assert!(!from.is_empty() && !from.contains(&0) && !to.contains(&0), "patterns are NUL-free text");
        Self { from, to, phase: Phase::Startup, pending: Vec::new(), rewritten: 0, declined: 0 }
    }

    /// Whether the stream is still in the untyped startup phase.
    pub(crate) fn in_startup(&self) -> bool {
        self.phase == Phase::Startup
    }

    /// Consumes `bytes`, returning what to send where, in order. Consecutive server-bound
    /// output is coalesced into one buffer.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Result<Vec<Action>, ProtocolError> {
        self.pending.extend_from_slice(bytes);
        let mut actions = Vec::new();
        let mut to_server = Vec::new();
        let mut offset = 0;
        loop {
            let rest = &self.pending[offset..];
            match self.phase {
                Phase::Raw => {
                    to_server.extend_from_slice(rest);
                    offset = self.pending.len();
                    break;
                }
                Phase::Startup => {
                    let Some(length) = rest.get(..4) else { break };
                    let length = u32::from_be_bytes(length.try_into().expect("four bytes"));
                    let length = usize::try_from(length).expect("u32 fits usize");
                    if !(8..=MAX_STARTUP_PACKET).contains(&length) {
                        return Err(ProtocolError(format!("startup packet length {length} out of range")));
                    }
                    let Some(packet) = rest.get(..length) else { break };
                    let code = i32::from_be_bytes(packet[4..8].try_into().expect("four bytes"));
                    match code {
                        SSL_REQUEST | GSSENC_REQUEST => {
                            if length != 8 {
                                return Err(ProtocolError(format!("encryption request of length {length}")));
                            }
                            // Never forwarded: the server might accept, and an encrypted
                            // stream cannot be rewritten. The client goes on in plaintext.
                            if !to_server.is_empty() {
                                actions.push(Action::ToServer(std::mem::take(&mut to_server)));
                            }
                            actions.push(Action::ToClient(b"N".to_vec()));
                            self.declined += 1;
                        }
                        CANCEL_REQUEST => {
                            to_server.extend_from_slice(packet);
                            self.phase = Phase::Raw;
                        }
                        // A StartupMessage of any protocol version: the typed phase begins.
                        _ => {
                            to_server.extend_from_slice(packet);
                            self.phase = Phase::Typed;
                        }
                    }
                    offset += length;
                }
                Phase::Typed => {
                    let Some(header) = rest.get(..5) else { break };
                    let length = i32::from_be_bytes(header[1..5].try_into().expect("four bytes"));
                    let length = usize::try_from(length)
                        .ok()
                        .filter(|length| *length >= 4)
                        .ok_or_else(|| ProtocolError(format!("message length {length}")))?;
                    let Some(message) = rest.get(..1 + length) else { break };
                    match message[0] {
                        b'Q' | b'P' => match rewrite_message(message, self.from, self.to)? {
                            Some(rewritten) => {
                                self.rewritten += 1;
                                to_server.extend_from_slice(&rewritten);
                            }
                            None => to_server.extend_from_slice(message),
                        },
                        _ => to_server.extend_from_slice(message),
                    }
                    offset += 1 + length;
                }
            }
        }
        self.pending.drain(..offset);
        if !to_server.is_empty() {
            actions.push(Action::ToServer(to_server));
        }
        Ok(actions)
    }
}

/// Rewrites the SQL text of one complete `Query` (`Q`, body `String query`) or `Parse` (`P`,
/// body `String name, String query, Int16 n, Int32[n] types`) message; `None` when the text
/// has no occurrence (or the body is malformed, which the server then reports).
fn rewrite_message(message: &[u8], from: &[u8], to: &[u8]) -> Result<Option<Vec<u8>>, ProtocolError> {
    let body = &message[5..];
    // The query string's bounds within the body.
    let start = match message[0] {
        b'Q' => 0,
        _ => match body.iter().position(|&byte| byte == 0) {
            Some(name_end) => name_end + 1,
            None => return Ok(None),
        },
    };
    let Some(length) = body[start..].iter().position(|&byte| byte == 0) else { return Ok(None) };
    let end = start + length;
    let Some(query) = replace_all(&body[start..end], from, to) else { return Ok(None) };
    let body_length = start + query.len() + (body.len() - end);
    let length = i32::try_from(4 + body_length)
        .map_err(|_| ProtocolError(format!("rewritten message of {body_length} bytes is too long")))?;
    let mut rewritten = Vec::with_capacity(1 + 4 + body_length);
    rewritten.push(message[0]);
    rewritten.extend_from_slice(&length.to_be_bytes());
    rewritten.extend_from_slice(&body[..start]);
    rewritten.extend_from_slice(&query);
    rewritten.extend_from_slice(&body[end..]);
    Ok(Some(rewritten))
}

/// `haystack` with every non-overlapping occurrence of `from` replaced by `to`, left to right;
/// `None` when there is none.
fn replace_all(haystack: &[u8], from: &[u8], to: &[u8]) -> Option<Vec<u8>> {
    let mut output = Vec::new();
    let mut copied = 0;
    let mut index = 0;
    while index + from.len() <= haystack.len() {
        if &haystack[index..index + from.len()] == from {
            output.extend_from_slice(&haystack[copied..index]);
            output.extend_from_slice(to);
            index += from.len();
            copied = index;
        } else {
            index += 1;
        }
    }
    if copied == 0 {
        return None;
    }
    output.extend_from_slice(&haystack[copied..]);
    Some(output)
}

/// A `timestamptz` decoded exactly, as microseconds since the Unix epoch, from either wire
/// format (binary: prepared statements; text: `raw_sql`, with SQLx's `TimeZone=UTC` and
/// `DateStyle=ISO`). The crate's SQLx has no date-time feature.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct EpochMicros(pub(crate) i64);

/// Microseconds from 1970-01-01 to PostgreSQL's epoch, 2000-01-01.
const POSTGRES_EPOCH_MICROS: i64 = 946_684_800_000_000;

impl sqlx::Type<sqlx::Postgres> for EpochMicros {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        sqlx::postgres::PgTypeInfo::with_name("timestamptz")
    }

    fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
        use sqlx::TypeInfo;
        ty.name().eq_ignore_ascii_case("timestamptz")
    }
}

impl<'r> sqlx::Decode<'r, sqlx::Postgres> for EpochMicros {
    fn decode(value: sqlx::postgres::PgValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        match value.format() {
            sqlx::postgres::PgValueFormat::Binary => {
                let bytes: [u8; 8] = value.as_bytes()?.try_into()?;
                Ok(Self(i64::from_be_bytes(bytes) + POSTGRES_EPOCH_MICROS))
            }
            sqlx::postgres::PgValueFormat::Text => parse_utc_timestamp(value.as_str()?)
                .map(Self)
                .ok_or_else(|| format!("unexpected timestamptz text {:?}", value.as_str()).into()),
        }
    }
}

/// Parses `YYYY-MM-DD HH:MM:SS[.ffffff]+00` (ISO style in UTC) into microseconds since the
/// Unix epoch.
pub(crate) fn parse_utc_timestamp(text: &str) -> Option<i64> {
    let text = text.strip_suffix("+00")?;
    let (date, time) = text.split_once(' ')?;
    let mut date = date.splitn(3, '-').map(str::parse::<i64>);
    let (year, month, day) = (date.next()?.ok()?, date.next()?.ok()?, date.next()?.ok()?);
    let (time, fraction) = time.split_once('.').unwrap_or((time, ""));
    let mut time = time.splitn(3, ':').map(str::parse::<i64>);
    let (hour, minute, second) = (time.next()?.ok()?, time.next()?.ok()?, time.next()?.ok()?);
    if fraction.len() > 6 || !fraction.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    let micros = if fraction.is_empty() { 0 } else { format!("{fraction:0<6}").parse::<i64>().ok()? };
    let days = days_from_civil(year, month, day);
    Some(((days * 24 + hour) * 60 + minute) * 60_000_000 + second * 1_000_000 + micros)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * (month + if month > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}
