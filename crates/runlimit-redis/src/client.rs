//! The connection and the script call: where every failure gets its consumption class.
//!
//! redis-rs' `ConnectionManager` and cluster client reconnect and may resend a command after a
//! failure, and its multiplexed connection reports "the connection was already closed" and
//! "the connection closed after the request was sent" as the same error. Neither lets a caller
//! tell an unsent admission from a sent one. So this module owns the connection's lifecycle
//! (a small amount of code on top of redis-rs' `MultiplexedConnection`): it opens the TCP
//! connection itself, runs the connection's driver on a task it spawns and records when that
//! task ends. An admission either fails to obtain a live connection (nothing was sent:
//! [`Failure::Connect`] / [`Failure::ConnectTimeout`]) or hands its request to a connection
//! believed live, after which any lost reply is uncertain ([`Failure::Connection`],
//! [`Failure::Timeout`]). Error replies from the server are always [`Failure::Server`]: every
//! Runlimit script writes only after its last possible error, and the server refuses a script
//! before running it for the rest (`NOSCRIPT`, `OOM`, `BUSY`, `READONLY`, cluster
//! redirections). Nothing is retried except one `SCRIPT LOAD` and resend after `NOSCRIPT`,
//! which is safe because the script did not run.

use std::{
    sync::{
        Arc, RwLock,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use redis::{
    AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, ErrorKind, IntoConnectionInfo, RedisError,
    ServerErrorKind, Value, aio::MultiplexedConnection,
};
use tokio::{net::TcpStream, time::Instant};

/// Why an operation failed below the script's own logic.
#[derive(Debug)]
pub(crate) enum Failure {
    /// No live connection within the connect timeout. Nothing was sent.
    ConnectTimeout(Duration),
    /// Opening a connection failed. Nothing was sent.
    Connect(RedisError),
    /// The server answered with an error reply: the script did not write.
    Server(RedisError),
    /// The operation timeout elapsed after the request was handed to the connection.
    Timeout(Duration),
    /// The connection failed after the request was handed to it.
    Connection(RedisError),
}

/// A script's source and its SHA-1 (what `EVALSHA` names).
#[derive(Debug)]
pub(crate) struct Script {
    source: &'static str,
    sha: String,
}

impl Script {
    pub(crate) fn new(source: &'static str) -> Self {
        Self { source, sha: redis::Script::new(source).get_hash().to_owned() }
    }

    /// The script's source.
    pub(crate) fn source(&self) -> &'static str {
        self.source
    }

    /// `EVALSHA <sha> <keys>`, to which the caller appends the keys and then the arguments.
    /// `args` and `bytes` size the command's buffers (a hint).
    pub(crate) fn evalsha(&self, keys: usize, args: usize, bytes: usize) -> redis::Cmd {
        let mut command = redis::Cmd::with_capacity(3 + args, 64 + bytes);
        command.arg("EVALSHA").arg(self.sha.as_str()).arg(keys);
        command
    }
}

/// A live multiplexed connection and the flag its driver task sets when it ends.
#[derive(Clone)]
struct Live {
    connection: MultiplexedConnection,
    closed: Arc<AtomicBool>,
}

impl Live {
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Marks the connection unusable, so the next operation opens a new one.
    fn discard(&self) {
        self.closed.store(true, Ordering::Release);
    }
}

/// A server's address.
pub(crate) type Node = (String, u16);

/// The connection to one server: opened lazily, replaced when its driver ends or an operation
/// on it fails with an I/O error or a timeout.
struct Link {
    node: Node,
    current: RwLock<Option<Live>>,
    reconnect: tokio::sync::Mutex<()>,
}

impl Link {
    fn new(node: Node) -> Self {
        Self { node, current: RwLock::new(None), reconnect: tokio::sync::Mutex::new(()) }
    }

    fn cached(&self) -> Option<Live> {
        let current = self.current.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        current.as_ref().filter(|live| !live.is_closed()).cloned()
    }

    /// A live connection, opening one when there is none, within `timeout`.
    async fn live(&self, info: &ConnectionInfo, timeout: Duration) -> Result<Live, Failure> {
        if let Some(live) = self.cached() {
            return Ok(live);
        }
        let open = async {
            let _one_at_a_time = self.reconnect.lock().await;
            if let Some(live) = self.cached() {
                return Ok(live);
            }
            let live = open(&self.node, info).await.map_err(Failure::Connect)?;
            *self.current.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(live.clone());
            Ok(live)
        };
        tokio::time::timeout(timeout, open).await.unwrap_or(Err(Failure::ConnectTimeout(timeout)))
    }
}

async fn open(node: &Node, info: &ConnectionInfo) -> Result<Live, RedisError> {
    let stream = TcpStream::connect((node.0.as_str(), node.1)).await?;
    stream.set_nodelay(true)?;
    // Timeouts are this crate's (the operation timeout); no response timeout of redis-rs.
    let config = AsyncConnectionConfig::new().set_response_timeout(None);
    let (connection, driver) =
        MultiplexedConnection::new_with_config(info.redis_settings(), stream, config).await?;
    let closed = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&closed);
    tokio::spawn(async move {
        driver.await;
        flag.store(true, Ordering::Release);
    });
    Ok(Live { connection, closed })
}

/// The primaries of a Redis Cluster by hash slot, from `CLUSTER SLOTS`.
#[derive(Debug, Default)]
struct SlotMap {
    ranges: Vec<(u16, u16, Node)>,
}

impl SlotMap {
    fn primary(&self, slot: u16) -> Option<&Node> {
        self.ranges.iter().find(|(start, end, _)| (*start..=*end).contains(&slot)).map(|(_, _, node)| node)
    }

    fn primaries(&self) -> Vec<Node> {
        let mut nodes: Vec<Node> = self.ranges.iter().map(|(_, _, node)| node.clone()).collect();
        nodes.sort();
        nodes.dedup();
        nodes
    }

    /// Decodes a `CLUSTER SLOTS` reply; an empty host means the node that answered.
    fn decode(value: &Value, answered: &Node) -> Option<Self> {
        let Value::Array(ranges) = value else { return None };
        let mut map = Self::default();
        for range in ranges {
            let Value::Array(fields) = range else { return None };
            let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(primary))) =
                (fields.first(), fields.get(1), fields.get(2))
            else {
                return None;
            };
            let host = match primary.first()? {
                Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok()?,
                Value::SimpleString(text) => text.clone(),
                _ => return None,
            };
            let Some(Value::Int(port)) = primary.get(1) else { return None };
            let host = if host.is_empty() || host == "?" { answered.0.clone() } else { host };
            map.ranges.push((
                u16::try_from(*start).ok()?,
                u16::try_from(*end).ok()?,
                (host, u16::try_from(*port).ok()?),
            ));
        }
        Some(map)
    }
}

/// The connections of one limiter (and its clones): to the server of its URL, and in a Redis
/// Cluster to every primary, routed by hash slot.
pub(crate) struct Connector {
    seed: Node,
    info: ConnectionInfo,
    links: RwLock<Vec<Arc<Link>>>,
    slots: RwLock<Option<Arc<SlotMap>>>,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        f.debug_struct("Connector").field("server", &self.seed).finish_non_exhaustive()
    }
}

/// Why a Redis URL was refused.
#[derive(Debug)]
pub(crate) enum UrlFailure {
    Parse(RedisError),
    Unsupported,
}

/// Whether an error reply says the server does not serve the slot (a cluster redirection or
/// an unavailable cluster): the slot map is refreshed.
fn is_redirection(error: &RedisError) -> bool {
    matches!(
        error.kind(),
        ErrorKind::Server(
            ServerErrorKind::Moved
                | ServerErrorKind::Ask
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::TryAgain
        )
    )
}

impl Connector {
    /// A connector for `url` (`redis://[user:password@]host[:port][/db]`). Connects nothing.
    pub(crate) fn new(url: &str) -> Result<Self, UrlFailure> {
        let info = url.into_connection_info().map_err(UrlFailure::Parse)?;
        let ConnectionAddr::Tcp(host, port) = info.addr().clone() else {
            return Err(UrlFailure::Unsupported);
        };
        Ok(Self { seed: (host, port), info, links: RwLock::new(Vec::new()), slots: RwLock::new(None) })
    }

    /// The `host:port` of the URL's server.
    pub(crate) fn address(&self) -> String {
        format!("{}:{}", self.seed.0, self.seed.1)
    }

    /// The link to `node`, created on first use.
    fn link(&self, node: &Node) -> Arc<Link> {
        if let Some(link) = self
            .links
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .find(|link| &link.node == node)
        {
            return Arc::clone(link);
        }
        let mut links = self.links.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(link) = links.iter().find(|link| &link.node == node) {
            return Arc::clone(link);
        }
        let link = Arc::new(Link::new(node.clone()));
        links.push(Arc::clone(&link));
        link
    }

    /// The link to the server that serves `slot`: its cluster primary, or the URL's server
    /// outside a cluster (or before the slot map is known).
    fn route(&self, slot: u16) -> Arc<Link> {
        let map = self.slots.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        self.link(map.as_deref().and_then(|map| map.primary(slot)).unwrap_or(&self.seed))
    }

    /// Reads the cluster's slot map from `node` (`CLUSTER SLOTS`) and routes by it from now on.
    /// Returns the primaries.
    pub(crate) async fn discover(
        &self,
        node: &Node,
        connect_timeout: Duration,
        operation_timeout: Duration,
    ) -> Result<Vec<Node>, Failure> {
        let mut slots = redis::cmd("CLUSTER");
        slots.arg("SLOTS");
        let value = self.command_on(node, &slots, connect_timeout, operation_timeout).await?;
        let map = SlotMap::decode(&value, node).ok_or_else(|| {
            Failure::Server(RedisError::from((ErrorKind::Parse, "unexpected CLUSTER SLOTS reply")))
        })?;
        let primaries = map.primaries();
        *self.slots.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Arc::new(map));
        Ok(primaries)
    }

    /// The URL's server.
    pub(crate) fn seed(&self) -> &Node {
        &self.seed
    }

    /// Runs `evalsha` (of `script`, from [`Script::evalsha`], every key in hash slot `slot`) on
    /// the server of `slot`: one `EVALSHA`, and after `NOSCRIPT` one `SCRIPT LOAD` and one more `EVALSHA`, all
    /// within `operation_timeout` once a connection is at hand (obtained within
    /// `connect_timeout`). A cluster redirection refreshes the slot map and is returned as the
    /// error it is (the script did not run); it is not followed.
    pub(crate) async fn run(
        &self,
        script: &Script,
        slot: u16,
        evalsha: &redis::Cmd,
        connect_timeout: Duration,
        operation_timeout: Duration,
    ) -> Result<Value, Failure> {
        let link = self.route(slot);
        let live = link.live(&self.info, connect_timeout).await?;
        let deadline = Instant::now() + operation_timeout;
        let result = match send(&live, evalsha, deadline, operation_timeout).await {
            Err(Failure::Server(error)) if error.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                let mut load = redis::cmd("SCRIPT");
                load.arg("LOAD").arg(script.source);
                send(&live, &load, deadline, operation_timeout).await?;
                send(&live, evalsha, deadline, operation_timeout).await
            }
            result => result,
        };
        if let Err(Failure::Server(error)) = &result
            && is_redirection(error)
        {
            // Best effort: the next admission of the slot goes where the cluster says.
            let _ = self.discover(&link.node, connect_timeout, operation_timeout).await;
        }
        result
    }

    /// Runs a plain command on `node` under the same classification.
    pub(crate) async fn command_on(
        &self,
        node: &Node,
        command: &redis::Cmd,
        connect_timeout: Duration,
        operation_timeout: Duration,
    ) -> Result<Value, Failure> {
        let live = self.link(node).live(&self.info, connect_timeout).await?;
        let deadline = Instant::now() + operation_timeout;
        send(&live, command, deadline, operation_timeout).await
    }
}

async fn send(
    live: &Live,
    command: &redis::Cmd,
    deadline: Instant,
    operation_timeout: Duration,
) -> Result<Value, Failure> {
    let mut connection = live.connection.clone();
    match tokio::time::timeout_at(deadline, connection.send_packed_command(command)).await {
        Err(_) => {
            // The reply may still arrive on this connection and be read by nobody; a late
            // reply is harmless, but a connection that stalls is replaced.
            live.discard();
            Err(Failure::Timeout(operation_timeout))
        }
        Ok(Ok(value)) => value.extract_error().map_err(|error| classify(live, error)),
        Ok(Err(error)) => Err(classify(live, error)),
    }
}

fn classify(live: &Live, error: RedisError) -> Failure {
    match error.kind() {
        ErrorKind::Server(_) | ErrorKind::Extension => Failure::Server(error),
        _ => {
            live.discard();
            Failure::Connection(error)
        }
    }
}

/// The hash slot of a key whose hash tag is `tag` (CRC16/XMODEM of the tag, modulo 16,384, as
/// Redis Cluster computes it; the `crc16` crate computes the checksum).
pub(crate) fn slot_of(tag: &str) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(tag.as_bytes()) % 16_384
}
