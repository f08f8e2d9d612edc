//! [`RedisStore`]: the public surface of both quota limiters.

use std::{fmt, future::Future, marker::PhantomData, sync::Arc, time::Instant};

use redis::Value;
use runlimit_core::{
    Allowance, BatchDecision, Check, Decision, Delay, FixedWindowPolicy, GcraPolicy, Limiter, Observer,
    PolicySubject, QuotaControl, QuotaMode, QuotaSnapshot,
    backend::{
        ShardHeadroom,
        batch::{BatchDenial, Precedence},
    },
};

use crate::{
    algorithm::{RedisAlgorithm, Verdict, is_state},
    client::{Connector, Failure, Node, Script},
    config::{Placement, RedisConfig, SHARDS},
    connector::RedisConnector,
    error::{BatchCheckError, CheckError, MaintenanceError, PrepareError, UrlError},
    layout::{Layout, Place},
    observe,
};

/// The scripts and key layout of one configuration.
struct Settings {
    config: RedisConfig,
    layout: Layout,
    /// The start of every admission's plan (admit.lua): the expired entries examined per check
    /// and the capacity per shard.
    plan: String,
    admit: Script,
    peek: Script,
    reset: Script,
    cleanup: Script,
}

const PEEK: &str = concat!(
    "#!lua flags=no-writes\n",
    include_str!("lua/core.lua"),
    include_str!("lua/shard.lua"),
    include_str!("lua/peek.lua")
);
const RESET: &str = concat!(
    "#!lua\n",
    include_str!("lua/core.lua"),
    include_str!("lua/shard.lua"),
    include_str!("lua/reset.lua")
);

impl Settings {
    fn new<P: RedisAlgorithm>(config: RedisConfig) -> Self {
        Self {
            layout: Layout::new(&config, P::TAG),
            plan: format!("{} {}", config.expired_removals_per_check(), config.maximum_keys_per_shard()),
            config,
            admit: Script::new(P::ADMIT),
            peek: Script::new(PEEK),
            reset: Script::new(RESET),
            cleanup: Script::new(P::CLEANUP),
        }
    }
}

/// A quota limiter stored in Redis (or Valkey) and shared by every replica using the same
/// server and [`RedisConfig::key_prefix`], for one algorithm: anchored fixed windows for
/// [`FixedWindowPolicy`] checks (named [`RedisLimiter`](crate::RedisLimiter)) or GCRA for
/// [`GcraPolicy`] checks (named [`RedisGcraLimiter`](crate::RedisGcraLimiter)).
///
/// Every admission, a single check or a whole batch, is one server-side script, run with
/// `EVALSHA` on one multiplexed connection; the [crate docs](crate) describe the protocol,
/// time, storage bounds and failure classification. Cloning is cheap and shares the
/// connection.
///
/// # Cancel safety
///
/// Quota is evaluated only when a returned future is first polled; creating and dropping an
/// unpolled future consumes nothing. Dropping a future after its request was handed to the
/// connection leaves the outcome unknown (the script may run), like [`CheckError::Timeout`].
pub struct RedisStore<P, O = ()> {
    connector: Arc<Connector>,
    settings: Arc<Settings>,
    observer: O,
    policy: PhantomData<fn() -> P>,
}

impl<P: RedisAlgorithm> RedisStore<P, ()> {
    /// A limiter for the server at `url` (any URL of [`RedisConnector`]'s table) with a
    /// connector of its own, the default [`RedisConfig`] and no observer: shorthand for
    /// [`from_connector`](Self::from_connector) of [`RedisConnector::new`]`(url)`. A process
    /// with several limiters should build them from one connector instead (one connection).
    /// Nothing is connected until the first operation; call [`prepare`](Self::prepare) before
    /// serving traffic.
    ///
    /// # Errors
    ///
    /// Those of [`RedisConnector::new`].
    pub fn new(url: &str) -> Result<Self, UrlError> {
        Ok(Self::from_connector(&RedisConnector::new(url)?))
    }

    /// A limiter on `connector`'s connections (shared with every other limiter built from it),
    /// with the default [`RedisConfig`] and no observer. Connects nothing.
    #[must_use]
    pub fn from_connector(connector: &RedisConnector) -> Self {
        Self {
            connector: Arc::clone(&connector.inner),
            settings: Arc::new(Settings::new::<P>(RedisConfig::default())),
            observer: (),
            policy: PhantomData,
        }
    }
}

impl<P, O> RedisStore<P, O> {
    /// The largest batch [`check_all`](Self::check_all) accepts: 64 checks.
    pub const MAX_BATCH_SIZE: usize = 64;

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &RedisConfig {
        &self.settings.config
    }

    /// The observer.
    #[must_use]
    pub fn observer(&self) -> &O {
        &self.observer
    }

    /// The server's `host:port` (or `unix:<path>`).
    #[must_use]
    pub fn address(&self) -> String {
        self.connector.address()
    }

    /// The connector this limiter uses, to build more limiters on the same connections.
    #[must_use]
    pub fn connector(&self) -> RedisConnector {
        RedisConnector { inner: Arc::clone(&self.connector) }
    }
}

impl<P: RedisAlgorithm, O> RedisStore<P, O> {
    /// Replaces the configuration (prefix, placement, bounds, timeouts). The connection is
    /// kept.
    #[must_use]
    pub fn with_config(mut self, config: RedisConfig) -> Self {
        self.settings = Arc::new(Settings::new::<P>(config));
        self
    }

    /// Replaces the observer. It receives one [`Observation`](runlimit_core::Observation) per
    /// admission, reset and cleanup pass, synchronously, after the reply arrived. Observer
    /// panics are caught.
    #[must_use]
    pub fn with_observer<O2: Observer>(self, observer: O2) -> RedisStore<P, O2> {
        RedisStore { connector: self.connector, settings: self.settings, observer, policy: PhantomData }
    }
}

/// The shards a batch touches, in first-appearance order, with their check counts, and each
/// check's position among them.
struct Shards {
    touched: PerCheck<(u8, u64)>,
    position: PerCheck<usize>,
}

/// An admission's per-check (or per-shard) values, inline for up to four.
pub(crate) type PerCheck<T> = smallvec::SmallVec<[T; 4]>;

impl Shards {
    fn of(places: &[Place]) -> Self {
        let mut touched = PerCheck::new();
        let mut position = PerCheck::with_capacity(places.len());
        for place in places {
            let at = match touched.iter().position(|(shard, _)| *shard == place.shard) {
                Some(at) => at,
                None => {
                    touched.push((place.shard, 0));
                    touched.len() - 1
                }
            };
            if let Some((_, count)) = touched.get_mut(at) {
                *count += 1;
            }
            position.push(at);
        }
        Self { touched, position }
    }
}

/// One check's part of an admission reply (borrowed from the reply).
#[derive(Debug)]
struct MemberReply<'a> {
    state: Option<&'a str>,
    present: bool,
    allowed: bool,
    next: Option<&'a str>,
}

/// One shard's part of an admission reply.
#[derive(Debug)]
struct ShardReply {
    entries: u64,
    earliest: Option<u64>,
}

/// An admission script's reply.
#[derive(Debug)]
struct Reply<'a> {
    now: u64,
    written: bool,
    members: PerCheck<MemberReply<'a>>,
    shards: PerCheck<ShardReply>,
}

/// What an admission produced, before observation.
pub(crate) enum Evaluated {
    Allowed(PerCheck<Allowance>),
    Denied { denial: BatchDenial, storage_retry_after: Option<Delay> },
}

/// A reply decoded, with the shard occupancy observers see.
pub(crate) struct Admission {
    pub(crate) evaluated: Evaluated,
    pub(crate) headroom: Option<ShardHeadroom>,
}

/// A reply's text (bulk, simple or integer).
pub(crate) fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(text) => Some(text.clone()),
        Value::Int(number) => Some(number.to_string()),
        _ => None,
    }
}

fn number(value: &Value) -> Option<u64> {
    match value {
        Value::Int(number) => u64::try_from(*number).ok(),
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        Value::SimpleString(text) => text.parse().ok(),
        _ => None,
    }
}

fn optional_text(value: &Value) -> Option<Option<String>> {
    let text = text(value)?;
    Some(if text.is_empty() { None } else { Some(text) })
}

/// The space-separated fields of a reply (a byte search: cheaper than `str::split` on such
/// short fields).
struct Fields<'a>(Option<&'a str>);

impl<'a> Iterator for Fields<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        let rest = self.0?;
        match rest.bytes().position(|byte| byte == b' ') {
            Some(at) => {
                self.0 = rest.get(at + 1..);
                rest.get(..at)
            }
            None => {
                self.0 = None;
                Some(rest)
            }
        }
    }
}

/// `" <value>"` for a value below 100, as bytes.
fn small_decimal(value: usize) -> SmallDecimal {
    let tens = u8::try_from(value / 10 % 10).unwrap_or(0);
    let ones = u8::try_from(value % 10).unwrap_or(0);
    if value >= 10 {
        SmallDecimal { bytes: [b' ', b'0' + tens, b'0' + ones], len: 3 }
    } else {
        SmallDecimal { bytes: [b' ', b'0' + ones, 0], len: 2 }
    }
}

/// A short byte string on the stack.
struct SmallDecimal {
    bytes: [u8; 3],
    len: usize,
}

impl SmallDecimal {
    fn as_slice(&self) -> &[u8] {
        self.bytes.get(..self.len).unwrap_or_default()
    }
}

/// A `0` or `1` field.
fn flag_field(field: &str) -> Option<bool> {
    match field {
        "0" => Some(false),
        "1" => Some(true),
        _ => None,
    }
}

/// A field that is empty (`None`) or a string.
fn optional_field(field: &str) -> Option<&str> {
    if field.is_empty() { None } else { Some(field) }
}

impl<'a> Reply<'a> {
    /// Decodes an admission reply of `members` checks on `shards` shards (admit.lua: one string
    /// of space-separated fields, borrowed); `Err(written)` when it is malformed (`written`:
    /// whether the script may have written).
    fn decode(value: &'a Value, members: usize, shards: usize) -> Result<Self, bool> {
        let text = match value {
            Value::BulkString(bytes) => std::str::from_utf8(bytes).ok(),
            Value::SimpleString(text) => Some(text.as_str()),
            _ => None,
        };
        let Some(text) = text else { return Err(true) };
        let mut fields = Fields(Some(text));
        let now = fields.next().and_then(|field| field.parse::<u64>().ok());
        let written = fields.next().and_then(flag_field);
        let malformed = Err(written != Some(false));
        let (Some(now), Some(written)) = (now, written) else { return malformed };
        let mut decoded = Self {
            now,
            written,
            members: PerCheck::with_capacity(members),
            shards: PerCheck::with_capacity(shards),
        };
        for _ in 0..members {
            let (Some(state), Some(present), Some(allowed), Some(next)) = (
                fields.next(),
                fields.next().and_then(flag_field),
                fields.next().and_then(flag_field),
                fields.next(),
            ) else {
                return malformed;
            };
            decoded.members.push(MemberReply {
                state: optional_field(state),
                present,
                allowed,
                next: optional_field(next),
            });
        }
        for _ in 0..shards {
            let (Some(entries), Some(_removed), Some(earliest)) = (
                fields.next().and_then(|field| field.parse::<u64>().ok()),
                fields.next().and_then(|field| field.parse::<u64>().ok()),
                fields.next(),
            ) else {
                return malformed;
            };
            let earliest = match optional_field(earliest).map(str::parse::<u64>) {
                None => None,
                Some(Ok(at)) => Some(at),
                Some(Err(_)) => return malformed,
            };
            decoded.shards.push(ShardReply { entries, earliest });
        }
        if fields.next().is_some() {
            return malformed;
        }
        Ok(decoded)
    }
}

impl<P: RedisAlgorithm, O: Observer> RedisStore<P, O> {
    fn timeouts(&self) -> (std::time::Duration, std::time::Duration) {
        (self.settings.config.connect_timeout(), self.settings.config.operation_timeout())
    }

    async fn command_on(&self, node: &Node, command: &redis::Cmd) -> Result<Value, CheckError> {
        let (connect, operation) = self.timeouts();
        Ok(self.connector.command_on(node, command, connect, operation).await?)
    }

    /// Runs `script` on the server of `shard`'s hash slot.
    async fn run(&self, script: &Script, shard: u8, evalsha: &redis::Cmd) -> Result<Value, Failure> {
        let (connect, operation) = self.timeouts();
        self.connector.run(script, self.settings.layout.slot(shard), evalsha, connect, operation).await
    }

    /// Checks one server (or cluster primary) and loads the scripts there. Reads no `INFO`
    /// when the operator vouched for the server.
    async fn prepare_node(&self, node: &Node) -> Result<(), PrepareError> {
        let watch = &self.connector.watch;
        if !watch.is_vouched() {
            let mut info = redis::cmd("INFO");
            info.arg("server").arg("memory");
            let reply = self.command_on(node, &info).await.map_err(|error| refused(node, error))?;
            let info = text(&reply).unwrap_or_default();
            let version = info_field(&info, "redis_version")?;
            let mut parts = version.split('.').map(|part| part.parse::<u32>().unwrap_or(0));
            let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
            if (major, minor) < (7, 0) {
                return Err(PrepareError::ServerTooOld {
                    address: node.to_string(),
                    version: version.to_owned(),
                });
            }
            let policy = info_field(&info, "maxmemory_policy")?;
            watch.record(node, policy);
            if policy != "noeviction" {
                return Err(PrepareError::EvictionPolicy {
                    address: node.to_string(),
                    policy: policy.to_owned(),
                });
            }
        }
        let settings = &self.settings;
        for script in [&settings.admit, &settings.peek, &settings.reset, &settings.cleanup] {
            let mut load = redis::cmd("SCRIPT");
            load.arg("LOAD").arg(script.source());
            self.command_on(node, &load).await.map_err(PrepareError::Unreachable)?;
        }
        Ok(())
    }

    /// Checks that the server can keep Runlimit's guarantees and loads the scripts: run it
    /// before serving traffic (and as a readiness check).
    ///
    /// It reads `INFO` and requires Redis 7.0 or newer and `maxmemory-policy noeviction`, then
    /// loads every script with `SCRIPT LOAD` (admissions also reload a script the server lost,
    /// once, after `NOSCRIPT`). When the URL's server runs in cluster mode it reads the slot map
    /// (`CLUSTER SLOTS`), routes every operation to the primary of its hash slot from then on,
    /// and checks and loads every primary. It writes no key. A server found with an evicting
    /// policy makes every operation through the limiter's
    /// [connector](crate::RedisConnector) fail until a reading of `noeviction`; the first
    /// successful `prepare` starts the connector's
    /// [eviction watch](crate::RedisConnector#the-eviction-watch). When the operator
    /// [vouched](crate::RedisConnector::vouch_for_noeviction) for the server, no `INFO` is
    /// read: a cluster is detected by `CLUSTER SLOTS` (a server that refuses it, by error or
    /// by ACL, is taken as standalone).
    ///
    /// # Errors
    ///
    /// [`PrepareError::Unreachable`] when a server cannot be reached or answers an error;
    /// [`PrepareError::InfoNotPermitted`] when the Redis user may not run `INFO`;
    /// [`PrepareError::ServerTooOld`] and [`PrepareError::EvictionPolicy`] for a server that
    /// cannot keep the guarantees; [`PrepareError::MissingInfo`] when `INFO` lacks a field it
    /// reads.
    pub async fn prepare(&self) -> Result<(), PrepareError> {
        let (connect, operation) = self.timeouts();
        let seed = self
            .connector
            .target(connect, operation)
            .await
            .map_err(|failure| PrepareError::Unreachable(failure.into()))?;
        let cluster = if self.connector.watch.is_vouched() {
            match self.connector.discover(&seed, connect, operation).await {
                Ok(primaries) => Some(primaries),
                Err(Failure::Server(_)) => None,
                Err(failure) => return Err(PrepareError::Unreachable(failure.into())),
            }
        } else {
            let mut info = redis::cmd("INFO");
            info.arg("cluster");
            let reply = self.command_on(&seed, &info).await.map_err(|error| refused(&seed, error))?;
            let info = text(&reply).unwrap_or_default();
            if info_field(&info, "cluster_enabled")? == "0" {
                None
            } else {
                let primaries = self
                    .connector
                    .discover(&seed, connect, operation)
                    .await
                    .map_err(|failure| PrepareError::Unreachable(failure.into()))?;
                Some(primaries)
            }
        };
        let servers = cluster.unwrap_or_else(|| vec![seed]);
        for node in &servers {
            self.prepare_node(node).await?;
        }
        // Verdicts about servers admissions no longer go to are forgotten.
        self.connector.watch.retain(&servers);
        crate::watch::start(&self.connector, (connect, operation));
        Ok(())
    }

    /// Runs one admission script for `checks` (validated) and decides with the core rules.
    async fn admit(&self, checks: &[Check<'_, P>], mode: QuotaMode) -> Result<Admission, CheckError> {
        let settings = &self.settings;
        let config = &settings.config;
        let layout = &settings.layout;
        let places: PerCheck<Place> = checks.iter().map(Place::of).collect();
        let shards = Shards::of(&places);
        // The layout of admit.lua: KEYS are each shard's hash and index, then each check's
        // expiry set; ARGV is each check's member and rule arguments, then the plan.
        let key_count = 2 * shards.touched.len() + checks.len();
        let mut evalsha =
            settings.admit.evalsha(key_count, key_count + 6 * checks.len() + 1, 128 * checks.len());
        for &(shard, _) in &shards.touched {
            evalsha.arg(layout.hash(shard)).arg(layout.index(shard));
        }
        for place in &places {
            layout.write_expiries(&mut evalsha, place.shard, place.bucket);
        }
        for (check, place) in checks.iter().zip(&places) {
            evalsha.arg(&place.member[..]);
            P::arguments(check, &mut evalsha);
        }
        {
            use redis::RedisWrite;
            use std::io::Write;
            let mut plan = evalsha.writer_for_next_arg();
            // Writing to the command's own buffer cannot fail.
            let _ = plan.write_all(settings.plan.as_bytes());
            for (place, position) in places.iter().zip(&shards.position) {
                // Both below 100: a position is at most MAX_BATCH_SIZE, a bucket below BUCKETS.
                for value in [position + 1, usize::from(place.bucket)] {
                    let _ = plan.write_all(small_decimal(value).as_slice());
                }
            }
        }
        // Every key of an admission is in one hash slot: the placement guarantees it (one slot
        // per limiter, or a batch confined to one shard, checked before any I/O).
        let shard = places.first().map_or(0, |place| place.shard);
        let value = self.run(&settings.admit, shard, &evalsha).await?;
        let reply = Reply::decode(&value, checks.len(), shards.touched.len()).map_err(|written| {
            CheckError::MalformedReply {
                reason: "unexpected admission reply",
                consumption: consumption(written),
            }
        })?;
        let evaluated = decide(checks, &shards, mode, &reply, u64::from(config.maximum_keys_per_shard()))?;
        let capacity = usize::try_from(config.maximum_keys_per_shard()).unwrap_or(usize::MAX);
        let headroom = shards
            .touched
            .iter()
            .zip(&reply.shards)
            .map(|(&(shard, _), reply)| ShardHeadroom {
                shard_index: usize::from(shard),
                entries: usize::try_from(reply.entries).unwrap_or(usize::MAX),
                capacity,
            })
            .min_by_key(|headroom| (headroom.headroom(), headroom.shard_index));
        Ok(Admission { evaluated, headroom })
    }

    /// Evaluates one check, consuming its [`cost`](runlimit_core::Check::cost) when allowed:
    /// one script run.
    ///
    /// # Errors
    ///
    /// Every [`CheckError`] variant; see its docs for when each occurs and
    /// [`CheckError::consumption`] for whether quota may have been consumed. A denial is not an
    /// error: it is an `Ok` [`Decision`].
    ///
    /// # Cancel safety
    ///
    /// See the [type docs](Self#cancel-safety).
    pub async fn check(&self, check: &Check<'_, P>) -> Result<Decision, CheckError> {
        let started = Instant::now();
        let mode = check.policy().quota_mode();
        let result = self.admit(std::slice::from_ref(check), mode).await;
        observe::finish_check(&self.observer, check.policy(), result, started)
    }

    /// Evaluates an atomic batch of at most [`MAX_BATCH_SIZE`](Self::MAX_BATCH_SIZE) checks
    /// in one script, at one time: when every check is allowed all are written together and
    /// the allowances keep input order; otherwise nothing is consumed and the decision names
    /// the deciding index (`runlimit_core::backend::batch`'s rule).
    ///
    /// # Errors
    ///
    /// Before any I/O: [`BatchCheckError::InvalidBatch`] (empty, too large, mixed quota modes,
    /// duplicate keys), [`BatchCheckError::BatchExceedsShardCapacity`] and, under
    /// [`Placement::PerShard`], [`BatchCheckError::SpansShards`]. Otherwise
    /// [`BatchCheckError::Check`] with the same failures as [`check`](Self::check).
    ///
    /// # Cancel safety
    ///
    /// See the [type docs](Self#cancel-safety).
    pub async fn check_all(&self, checks: &[Check<'_, P>]) -> Result<BatchDecision, BatchCheckError> {
        let started = Instant::now();
        let mode = observe::validate(&self.observer, checks, Self::MAX_BATCH_SIZE, started)?;
        if let Err(error) = self.place_batch(checks) {
            observe::structural(&self.observer, checks.len(), started);
            return Err(error);
        }
        let result = self.admit(checks, mode).await;
        observe::finish_batch(&self.observer, checks, result, started)
    }

    /// The structural checks of a batch's placement, before any I/O.
    fn place_batch(&self, checks: &[Check<'_, P>]) -> Result<(), BatchCheckError> {
        let places: PerCheck<Place> = checks.iter().map(Place::of).collect();
        if self.settings.config.placement() == Placement::PerShard
            && let Some(first) = places.first()
            && let Some(other) = places.iter().find(|place| place.shard != first.shard)
        {
            return Err(BatchCheckError::SpansShards {
                first_shard: usize::from(first.shard),
                other_shard: usize::from(other.shard),
            });
        }
        let capacity = usize::try_from(self.settings.config.maximum_keys_per_shard()).unwrap_or(usize::MAX);
        if checks.len() > capacity {
            let mut touched = Shards::of(&places).touched;
            touched.sort_unstable();
            if let Some(&(shard, count)) = touched.iter().find(|&&(_, count)| count > capacity as u64) {
                return Err(BatchCheckError::BatchExceedsShardCapacity {
                    shard_index: usize::from(shard),
                    key_count: usize::try_from(count).unwrap_or(usize::MAX),
                    capacity,
                });
            }
        }
        Ok(())
    }

    /// The subject's quota now, without consuming, creating or changing anything: one
    /// read-only script (`flags=no-writes`) reads the state and the store's time, and the
    /// snapshot is decided by `runlimit_core::backend::fixed_window::peek` or `gcra::peek`. A
    /// concurrent check may change the state at once, so never admit on a peek. Nothing is
    /// reported to the observer.
    ///
    /// # Errors
    ///
    /// The [`CheckError`] variants of a check; a peek never consumes, whatever
    /// [`CheckError::consumption`] says.
    pub async fn peek(&self, subject: PolicySubject<'_, P>) -> Result<QuotaSnapshot, CheckError> {
        let policy = subject.policy();
        let place = Place::of(&Check::new(subject));
        let mut evalsha = self.settings.peek.evalsha(1, 2, 128);
        evalsha.arg(self.settings.layout.hash(place.shard)).arg(&place.member[..]);
        let value = self.run(&self.settings.peek, place.shard, &evalsha).await?;
        let malformed = |reason| CheckError::MalformedReply { reason, consumption: consumption(false) };
        let (now, state) = now_and_state(&value).ok_or_else(|| malformed("unexpected peek reply"))?;
        let state = match state {
            Some(state) => Some(policy.parse(&state).ok_or_else(|| malformed("malformed stored state"))?),
            None => None,
        };
        policy.peek(state, now).ok_or_else(|| malformed("stored state out of range"))
    }

    /// Removes the subject's state for its policy and returns whether it was live (an expired
    /// entry not yet cleaned up is removed too, and reported as `false`); its slot is free at
    /// once, and the next check behaves as for a new key. Quota mode is not part of the key: a
    /// reset through a shadow policy clears the enforced counter too. One script run,
    /// reported to the observer as [`Observation::Reset`](runlimit_core::Observation::Reset).
    ///
    /// # Errors
    ///
    /// [`MaintenanceError`], whose [`may_have_removed_entries`](MaintenanceError::may_have_removed_entries)
    /// says whether the state may be gone anyway.
    pub async fn reset(&self, subject: PolicySubject<'_, P>) -> Result<bool, MaintenanceError> {
        let started = Instant::now();
        let policy = subject.policy();
        let place = Place::of(&Check::new(subject));
        let layout = &self.settings.layout;
        let mut evalsha = self.settings.reset.evalsha(2, 3, 128);
        evalsha.arg(layout.hash(place.shard));
        layout.write_expiries(&mut evalsha, place.shard, place.bucket);
        evalsha.arg(&place.member[..]);
        let result = match self.run(&self.settings.reset, place.shard, &evalsha).await {
            Err(failure) => Err(MaintenanceError::new(failure.into(), 0)),
            Ok(value) => match now_and_state(&value) {
                Some((now, state)) => Ok(state
                    .and_then(|state| policy.parse(&state))
                    .is_some_and(|state| policy.is_live(state, now))),
                None => Err(MaintenanceError::new(
                    CheckError::MalformedReply {
                        reason: "unexpected reset reply",
                        consumption: runlimit_core::ConsumptionStatus::MayHaveBeenConsumed,
                    },
                    0,
                )),
            },
        };
        observe::finish_reset(&self.observer, policy, &result, started);
        result
    }

    /// Removes at most `maximum` expired entries, shard by shard (one script run per shard
    /// until the bound is reached), each shard's earliest expiries first, and returns how many
    /// it removed. Admissions already remove up to
    /// [`expired_removals_per_check`](RedisConfig::expired_removals_per_check) expired entries
    /// of their shards; schedule this pass for shards no admission touches. Expired entries
    /// never affect decisions: cleanup only frees memory and slots. `maximum == 0` returns
    /// `Ok(0)` without touching the server.
    ///
    /// # Errors
    ///
    /// [`MaintenanceError`] for the first shard that failed; the pass stops there, and
    /// [`MaintenanceError::removed_before_failure`] counts what it had removed.
    pub async fn cleanup_expired(&self, maximum: u32) -> Result<u64, MaintenanceError> {
        let started = Instant::now();
        let mut removed = 0u64;
        let layout = &self.settings.layout;
        let mut result = Ok(());
        for shard in (0..SHARDS).filter_map(|shard| u8::try_from(shard).ok()) {
            let left = u64::from(maximum).saturating_sub(removed);
            if left == 0 {
                break;
            }
            let mut evalsha = self.settings.cleanup.evalsha(2, 4, 128);
            evalsha.arg(layout.hash(shard)).arg(layout.index(shard)).arg(layout.base(shard)).arg(left);
            match self.run(&self.settings.cleanup, shard, &evalsha).await {
                Ok(value) => match number(&value) {
                    Some(count) => removed += count,
                    None => {
                        result = Err(CheckError::MalformedReply {
                            reason: "unexpected cleanup reply",
                            consumption: runlimit_core::ConsumptionStatus::MayHaveBeenConsumed,
                        });
                        break;
                    }
                },
                Err(failure) => {
                    result = Err(failure.into());
                    break;
                }
            }
        }
        let result = result.map(|()| removed).map_err(|error| MaintenanceError::new(error, removed));
        observe::finish_cleanup(&self.observer, maximum, result, started)
    }
}

/// `prepare`'s error for a failed `INFO`: [`PrepareError::InfoNotPermitted`] for an ACL
/// refusal, else [`PrepareError::Unreachable`].
fn refused(node: &Node, error: CheckError) -> PrepareError {
    match &error {
        CheckError::Server { code, .. } if code == "NOPERM" => {
            PrepareError::InfoNotPermitted { address: node.to_string() }
        }
        _ => PrepareError::Unreachable(error),
    }
}

/// A field of an `INFO` reply.
fn info_field<'a>(info: &'a str, name: &'static str) -> Result<&'a str, PrepareError> {
    info.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
        .ok_or(PrepareError::MissingInfo { field: name })
}

fn consumption(written: bool) -> runlimit_core::ConsumptionStatus {
    if written {
        runlimit_core::ConsumptionStatus::MayHaveBeenConsumed
    } else {
        runlimit_core::ConsumptionStatus::NotConsumed
    }
}

/// `{now, state or ''}` of the peek and reset scripts.
fn now_and_state(value: &Value) -> Option<(u64, Option<String>)> {
    let Value::Array(items) = value else { return None };
    let [now, state] = items.as_slice() else { return None };
    Some((number(now)?, optional_text(state)?))
}

/// The decision of an admission: the core rules applied to the state the script read, at the
/// time it used, checked against what the script did.
fn decide<P: RedisAlgorithm>(
    checks: &[Check<'_, P>],
    shards: &Shards,
    mode: QuotaMode,
    reply: &Reply,
    capacity: u64,
) -> Result<Evaluated, CheckError> {
    let disagree = |reason| CheckError::MalformedReply { reason, consumption: consumption(reply.written) };
    let now = reply.now;
    let mut precedence = Precedence::new(mode);
    let mut allowances = PerCheck::with_capacity(checks.len());
    let mut new_keys: PerCheck<u64> = smallvec::smallvec![0; shards.touched.len()];
    // Each shard's entries before this admission's inserts (after its cleanup).
    let before: PerCheck<u64> = (0..shards.touched.len())
        .zip(&reply.shards)
        .map(|(position, shard)| {
            let inserted = if reply.written { inserted(shards, position, reply) } else { 0 };
            shard.entries.saturating_sub(inserted)
        })
        .collect();
    for (index, (check, member)) in checks.iter().zip(&reply.members).enumerate() {
        let policy = check.policy();
        let state = match member.state {
            Some(state) => Some(policy.parse(state).ok_or_else(|| disagree("malformed stored state"))?),
            None => None,
        };
        if member.present != state.is_some() {
            return Err(disagree("presence does not match the state"));
        }
        let verdict =
            policy.evaluate(state, now, check.cost()).ok_or_else(|| disagree("stored state out of range"))?;
        match verdict {
            Verdict::Exhausted(denial) => {
                if member.allowed {
                    return Err(disagree("the script allowed a check the rule denies"));
                }
                precedence.quota_exceeded(index, denial);
            }
            Verdict::Allowed { allowance, next } => {
                if !member.allowed {
                    return Err(disagree("the script denied a check the rule allows"));
                }
                if reply.written && !member.next.is_some_and(|stored| is_state(stored, next)) {
                    return Err(disagree("the script stored another state than the rule"));
                }
                let position = shards.position.get(index).copied().unwrap_or(0);
                if !member.present
                    && let (Some(count), Some(before)) = (new_keys.get_mut(position), before.get(position))
                {
                    *count += 1;
                    if *count > capacity.saturating_sub(*before) {
                        precedence.storage_capacity(index);
                    }
                }
                allowances.push(allowance);
            }
        }
    }
    let denial = precedence.denial();
    if denial.is_none() != reply.written {
        return Err(disagree("the script's write does not match the batch rule"));
    }
    Ok(match denial {
        None => Evaluated::Allowed(allowances),
        Some(denial) => {
            let mut storage_retry_after = None;
            if denial.is_storage_capacity() {
                // The batch may fit once every short shard has room: the latest of their
                // earliest expiries.
                let mut latest = Some(0u64);
                for ((shard, needed), before) in reply.shards.iter().zip(&new_keys).zip(&before) {
                    if *needed > capacity.saturating_sub(*before) {
                        latest = latest.zip(shard.earliest).map(|(a, b)| a.max(b));
                    }
                }
                storage_retry_after = latest.map(|at| Delay::from_millis(at.saturating_sub(now)));
            }
            Evaluated::Denied { denial, storage_retry_after }
        }
    })
}

/// How many checks at shard `position` a writing script inserted (those not present).
fn inserted(shards: &Shards, position: usize, reply: &Reply) -> u64 {
    let count = shards
        .position
        .iter()
        .zip(&reply.members)
        .filter(|(at, member)| **at == position && !member.present)
        .count();
    u64::try_from(count).unwrap_or(u64::MAX)
}

impl<P, O: Clone> Clone for RedisStore<P, O> {
    fn clone(&self) -> Self {
        Self {
            connector: Arc::clone(&self.connector),
            settings: Arc::clone(&self.settings),
            observer: self.observer.clone(),
            policy: PhantomData,
        }
    }
}

impl<P: RedisAlgorithm, O> fmt::Debug for RedisStore<P, O> {
    /// `RedisLimiter { address: .., config: .. }` (never a password).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(P::NAME)
            .field("address", &self.connector.address())
            .field("config", &self.settings.config)
            .finish_non_exhaustive()
    }
}

impl<P: RedisAlgorithm, O: Observer> Limiter for RedisStore<P, O> {
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

/// Peeks and resets of a [`RedisStore`]; see [`RedisStore::peek`] and [`RedisStore::reset`].
impl<P: RedisAlgorithm, O: Observer> QuotaControl for RedisStore<P, O> {
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

/// Anchored fixed windows in Redis: [`RedisStore`] for [`FixedWindowPolicy`] checks.
pub type RedisLimiter<O = ()> = RedisStore<FixedWindowPolicy, O>;

/// GCRA in Redis: [`RedisStore`] for [`GcraPolicy`] checks.
pub type RedisGcraLimiter<O = ()> = RedisStore<GcraPolicy, O>;
