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
    fmt,
    path::PathBuf,
    sync::{
        Arc, RwLock,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use redis::{
    AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, ErrorKind, RedisError, ServerErrorKind, Value,
    aio::MultiplexedConnection,
};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpStream,
    time::Instant,
};

use crate::watch::Watch;

/// Why an operation failed below the script's own logic.
#[derive(Debug)]
pub(crate) enum Failure {
    /// No live connection to `Node` within the connect timeout. Nothing was sent.
    ConnectTimeout(Node, Duration),
    /// Opening a connection to `Node` failed. Nothing was sent.
    Connect(Node, RedisError),
    /// The eviction watch found the server at `Node` with an evicting `maxmemory-policy`
    /// (`String`): nothing was sent.
    Evicting(Node, String),
    /// No Sentinel named a reachable primary for the service: nothing was sent.
    NoPrimary { service: String, sentinels: String, cause: String },
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

/// A server's address: a TCP host and port, or a Unix socket's path.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Node {
    Tcp(String, u16),
    Unix(PathBuf),
}

impl fmt::Display for Node {
    /// `host:port` (`[v6]:port` for an IPv6 address), or `unix:<path>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tcp(host, port) if host.contains(':') => write!(f, "[{host}]:{port}"),
            Self::Tcp(host, port) => write!(f, "{host}:{port}"),
            Self::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

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
    async fn live(
        &self,
        info: &ConnectionInfo,
        tls: Option<&Tls>,
        timeout: Duration,
    ) -> Result<Live, Failure> {
        if let Some(live) = self.cached() {
            return Ok(live);
        }
        let open = async {
            let _one_at_a_time = self.reconnect.lock().await;
            if let Some(live) = self.cached() {
                return Ok(live);
            }
            let live = open(&self.node, info, tls)
                .await
                .map_err(|error| Failure::Connect(self.node.clone(), error))?;
            *self.current.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(live.clone());
            Ok(live)
        };
        tokio::time::timeout(timeout, open)
            .await
            .unwrap_or_else(|_| Err(Failure::ConnectTimeout(self.node.clone(), timeout)))
    }
}

/// Opens a connection to `node`: TCP (with TLS when `tls` is given) or a Unix socket, then
/// redis-rs' handshake (authentication, database selection) on it.
async fn open(node: &Node, info: &ConnectionInfo, tls: Option<&Tls>) -> Result<Live, RedisError> {
    match node {
        Node::Tcp(host, port) => {
            let stream = TcpStream::connect((host.as_str(), *port)).await?;
            stream.set_nodelay(true)?;
            match tls {
                Some(tls) => {
                    let stream = tls.handshake(host, stream).await?;
                    handshake(info, stream).await
                }
                None => handshake(info, stream).await,
            }
        }
        #[cfg(unix)]
        Node::Unix(path) => handshake(info, tokio::net::UnixStream::connect(path).await?).await,
        #[cfg(not(unix))]
        Node::Unix(_) => {
            Err(RedisError::from((ErrorKind::InvalidClientConfig, "Unix sockets need a Unix platform")))
        }
    }
}

async fn handshake<C>(info: &ConnectionInfo, stream: C) -> Result<Live, RedisError>
where
    C: Unpin + AsyncRead + AsyncWrite + Send + 'static,
{
    // Timeouts are this crate's (the operation timeout); no response timeout of redis-rs.
    let config = AsyncConnectionConfig::new().set_response_timeout(None);
    let (connection, driver) =
        MultiplexedConnection::new_with_config(info.redis_settings(), stream, config).await?;
    let closed = Arc::new(AtomicBool::new(false));
    // Set when the driver ends, or when its task is dropped unfinished (its runtime shut
    // down): either way nothing more can be sent on the connection, and the next operation
    // opens another instead of handing a request to a dead one.
    let flag = ClosedWhenDropped(Arc::clone(&closed));
    tokio::spawn(async move {
        let _flag = flag;
        driver.await;
    });
    Ok(Live { connection, closed })
}

/// Sets its flag when dropped.
struct ClosedWhenDropped(Arc<AtomicBool>);

impl Drop for ClosedWhenDropped {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
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
            let host = match answered {
                Node::Tcp(answered, _) if host.is_empty() || host == "?" => answered.clone(),
                _ => host,
            };
            map.ranges.push((
                u16::try_from(*start).ok()?,
                u16::try_from(*end).ok()?,
                Node::Tcp(host, u16::try_from(*port).ok()?),
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
    tls: Option<Tls>,
    links: RwLock<Vec<Arc<Link>>>,
    slots: RwLock<Option<Arc<SlotMap>>>,
    /// With Redis Sentinel: where the primary is found (`seed` is then unused).
    sentinel: Option<Sentinel>,
    /// The eviction watch's verdict and schedule.
    pub(crate) watch: Watch,
}

/// A monitored service's Sentinels and the primary they last named.
pub(crate) struct Sentinel {
    service: String,
    /// Each Sentinel's address, connection settings (its own credentials) and connection.
    nodes: Vec<(Node, ConnectionInfo, Arc<Link>)>,
    primary: RwLock<Option<Node>>,
    /// Set after a failure that may mean the primary moved: the next operation asks again.
    stale: AtomicBool,
    /// One ask at a time; operations that waited through an ask take its result.
    asking: tokio::sync::Mutex<()>,
    /// Incremented by every completed ask.
    asked: std::sync::atomic::AtomicU64,
    /// The last completed ask's failure (`None` after a success).
    last_failure: std::sync::Mutex<Option<String>>,
}

impl Sentinel {
    /// Sentinels at `nodes` (TCP) monitoring `service`.
    pub(crate) fn new(service: String, nodes: Vec<(Node, ConnectionInfo)>) -> Self {
        Self {
            service,
            nodes: nodes
                .into_iter()
                .map(|(node, info)| (node.clone(), info, Arc::new(Link::new(node))))
                .collect(),
            primary: RwLock::new(None),
            stale: AtomicBool::new(true),
            asking: tokio::sync::Mutex::new(()),
            asked: std::sync::atomic::AtomicU64::new(0),
            last_failure: std::sync::Mutex::new(None),
        }
    }

    fn no_primary(&self, cause: String) -> Failure {
        Failure::NoPrimary { service: self.service.clone(), sentinels: self.addresses(), cause }
    }

    fn known(&self) -> Option<Node> {
        if self.stale.load(Ordering::Acquire) {
            return None;
        }
        self.primary.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    fn addresses(&self) -> String {
        self.nodes.iter().map(|(node, _, _)| node.to_string()).collect::<Vec<_>>().join(", ")
    }
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        f.debug_struct("Connector")
            .field("server", &self.seed.to_string())
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

/// The TLS client of a `rediss://` connector: rustls (with the *ring* provider) through
/// tokio-rustls, so no OpenSSL is needed.
pub(crate) struct Tls {
    connector: tokio_rustls::TlsConnector,
}

impl Tls {
    pub(crate) fn new(config: rustls::ClientConfig) -> Self {
        Self { connector: tokio_rustls::TlsConnector::from(Arc::new(config)) }
    }

    /// The TLS handshake with `host` (a DNS name or an IP address, verified against the
    /// server's certificate unless the configuration says otherwise).
    async fn handshake(
        &self,
        host: &str,
        stream: TcpStream,
    ) -> Result<tokio_rustls::client::TlsStream<TcpStream>, RedisError> {
        let name = rustls::pki_types::ServerName::try_from(host.to_owned()).map_err(|_| {
            RedisError::from((ErrorKind::InvalidClientConfig, "the host is not a valid TLS server name"))
        })?;
        Ok(self.connector.connect(name, stream).await?)
    }
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
    /// A connector for the server of `info` (TCP or a Unix socket; TLS over TCP when `tls` is
    /// given). Connects nothing. `None` for an address of another kind.
    pub(crate) fn new(info: ConnectionInfo, tls: Option<Tls>) -> Option<Self> {
        let seed = match info.addr().clone() {
            ConnectionAddr::Tcp(host, port) => Node::Tcp(host, port),
            ConnectionAddr::Unix(path) if tls.is_none() => Node::Unix(path),
            _ => return None,
        };
        Some(Self {
            seed,
            info,
            tls,
            links: RwLock::new(Vec::new()),
            slots: RwLock::new(None),
            sentinel: None,
            watch: Watch::default(),
        })
    }

    /// A connector whose primary `sentinel` names; `info` holds the primary's settings
    /// (credentials, database; its address is unused).
    pub(crate) fn with_sentinel(info: ConnectionInfo, sentinel: Sentinel) -> Self {
        Self {
            seed: Node::Tcp(String::new(), 0),
            info,
            tls: None,
            links: RwLock::new(Vec::new()),
            slots: RwLock::new(None),
            sentinel: Some(sentinel),
            watch: Watch::default(),
        }
    }

    /// The URL's server: `host:port` or `unix:<path>` (never credentials); with Sentinel, the
    /// primary last named, or `sentinel service <name>` before one is known.
    pub(crate) fn address(&self) -> String {
        match &self.sentinel {
            None => self.seed.to_string(),
            Some(sentinel) => sentinel
                .primary
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .as_ref()
                .map_or_else(|| format!("sentinel service {}", sentinel.service), Node::to_string),
        }
    }

    /// The server admissions go to outside a cluster: the URL's, or the primary the Sentinels
    /// name (asked when unknown or after a failure that may mean it moved), within
    /// `connect_timeout` (nothing is sent before it is known).
    pub(crate) async fn target(
        &self,
        connect_timeout: Duration,
        operation_timeout: Duration,
    ) -> Result<Node, Failure> {
        match &self.sentinel {
            None => Ok(self.seed.clone()),
            Some(sentinel) => match sentinel.known() {
                Some(primary) => Ok(primary),
                None => tokio::time::timeout(
                    connect_timeout,
                    self.ask_sentinels(sentinel, false, connect_timeout, operation_timeout),
                )
                .await
                .unwrap_or_else(|_| {
                    Err(sentinel
                        .no_primary(format!("no Sentinel named a usable primary within {connect_timeout:?}")))
                }),
            },
        }
    }

    /// Asks every Sentinel at once for the service's primary and takes the first that names a
    /// server answering `ROLE` as a primary. Unless the operator vouched for the servers, a
    /// newly named primary's `maxmemory-policy` is read first and recorded for the eviction
    /// watch (a primary whose policy cannot be read is not switched to). One ask at a time:
    /// callers that waited through another's ask take its result. `force`: ask even when a
    /// primary is known (admissions meanwhile use the known one).
    async fn ask_sentinels(
        &self,
        sentinel: &Sentinel,
        force: bool,
        connect_timeout: Duration,
        operation_timeout: Duration,
    ) -> Result<Node, Failure> {
        let seen = sentinel.asked.load(Ordering::Acquire);
        let _one_at_a_time = sentinel.asking.lock().await;
        if !force {
            if let Some(primary) = sentinel.known() {
                return Ok(primary);
            }
            if sentinel.asked.load(Ordering::Acquire) != seen
                && let Some(cause) =
                    sentinel.last_failure.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
            {
                return Err(sentinel.no_primary(cause));
            }
        }
        let result = self.ask_all(sentinel, connect_timeout, operation_timeout).await;
        *sentinel.last_failure.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
            result.as_ref().err().cloned();
        sentinel.asked.fetch_add(1, Ordering::AcqRel);
        result.map_err(|cause| sentinel.no_primary(cause))
    }

    /// [`ask_sentinels`](Self::ask_sentinels)' work: the primary; or, when every Sentinel
    /// failed, the reason the last Sentinel in configured order gave (the Sentinels are asked
    /// concurrently, so their answers arrive in any order, and the reason reported must not
    /// depend on it); or why the named primary's eviction policy could not be read.
    async fn ask_all(
        &self,
        sentinel: &Sentinel,
        connect_timeout: Duration,
        operation_timeout: Duration,
    ) -> Result<Node, String> {
        use futures_util::stream::{FuturesUnordered, StreamExt};
        let mut answers: FuturesUnordered<_> = sentinel
            .nodes
            .iter()
            .enumerate()
            .map(|(position, (node, info, link))| async move {
                self.ask_one(sentinel, info, link, connect_timeout, operation_timeout)
                    .await
                    .map_err(|reason| (position, format!("{node}: {reason}")))
            })
            .collect();
        // The reason of the last Sentinel in configured order that has answered so far.
        let mut cause: Option<(usize, String)> = None;
        let primary = loop {
            match answers.next().await {
                None => {
                    return Err(
                        cause.map_or_else(|| String::from("no Sentinel is configured"), |(_, reason)| reason)
                    );
                }
                Some(Ok(primary)) => break primary,
                Some(Err((position, reason))) => {
                    if cause.as_ref().is_none_or(|(latest, _)| position > *latest) {
                        cause = Some((position, reason));
                    }
                }
            }
        };
        drop(answers);
        let previous = sentinel.primary.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        if previous.as_ref() != Some(&primary) && !self.watch.is_vouched() {
            let policy =
                self.read_policy(&primary, connect_timeout, operation_timeout).await.map_err(|reason| {
                    format!("names {primary}, whose maxmemory-policy could not be read: {reason}")
                })?;
            self.watch.record(&primary, &policy);
        }
        *sentinel.primary.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(primary.clone());
        sentinel.stale.store(false, Ordering::Release);
        // Verdicts about servers no longer in use go: the new primary's reading stands.
        self.watch.retain(std::slice::from_ref(&primary));
        Ok(primary)
    }

    /// One Sentinel's answer, confirmed by the named server's `ROLE`; the reason otherwise.
    async fn ask_one(
        &self,
        sentinel: &Sentinel,
        info: &ConnectionInfo,
        link: &Link,
        connect_timeout: Duration,
        operation_timeout: Duration,
    ) -> Result<Node, String> {
        let live = link.live(info, None, connect_timeout).await.map_err(|failure| describe(&failure))?;
        let mut ask = redis::cmd("SENTINEL");
        ask.arg("GET-MASTER-ADDR-BY-NAME").arg(&sentinel.service);
        let reply = send(&live, &ask, Instant::now() + operation_timeout, operation_timeout)
            .await
            .map_err(|failure| describe(&failure))?;
        let primary = match &reply {
            Value::Array(fields) => match (
                fields.first().and_then(crate::store::text),
                fields.get(1).and_then(crate::store::text),
            ) {
                (Some(host), Some(port)) => port.parse().ok().map(|port| Node::Tcp(host, port)),
                _ => None,
            },
            _ => None,
        }
        .ok_or_else(|| format!("does not monitor a service named {}", sentinel.service))?;
        let role = self
            .command_on(&primary, &redis::cmd("ROLE"), connect_timeout, operation_timeout)
            .await
            .map_err(|failure| format!("names {primary}, which {}", describe(&failure)))?;
        match &role {
            Value::Array(fields)
                if fields.first().and_then(crate::store::text).as_deref() == Some("master") =>
            {
                Ok(primary)
            }
            _ => Err(format!("names {primary}, which is not a primary (yet)")),
        }
    }

    /// `node`'s `maxmemory-policy`, from `INFO memory` (what the eviction watch and a newly
    /// named primary's check read); the reason in a few words otherwise.
    pub(crate) async fn read_policy(
        &self,
        node: &Node,
        connect_timeout: Duration,
        operation_timeout: Duration,
    ) -> Result<String, String> {
        let mut info = redis::cmd("INFO");
        info.arg("memory");
        let reply = self
            .command_on(node, &info, connect_timeout, operation_timeout)
            .await
            .map_err(|failure| describe(&failure))?;
        crate::store::text(&reply)
            .and_then(|text| {
                text.lines()
                    .find_map(|line| line.strip_prefix("maxmemory_policy:"))
                    .map(|policy| policy.trim().to_owned())
            })
            .ok_or_else(|| "its INFO lacks maxmemory_policy".to_owned())
    }

    /// Marks the Sentinels' answer stale after `failure`, when it may mean the primary moved.
    fn after_failure(&self, failure: &Failure) {
        let Some(sentinel) = &self.sentinel else { return };
        let moved = match failure {
            Failure::Connect(..)
            | Failure::ConnectTimeout(..)
            | Failure::Timeout(_)
            | Failure::Connection(_) => true,
            Failure::Server(error) => {
                matches!(
                    error.kind(),
                    ErrorKind::Server(
                        ServerErrorKind::ReadOnly
                            | ServerErrorKind::BusyLoading
                            | ServerErrorKind::MasterDown
                    )
                ) || error.code() == Some("NOREPLICAS")
            }
            Failure::Evicting(..) | Failure::NoPrimary { .. } => false,
        };
        if moved {
            sentinel.stale.store(true, Ordering::Release);
        }
    }

    /// Asks the Sentinels again now (the eviction watch does, every interval). `None` outside
    /// Sentinel mode.
    pub(crate) async fn refresh_primary(
        &self,
        connect_timeout: Duration,
        operation_timeout: Duration,
    ) -> Option<Result<Node, Failure>> {
        let sentinel = self.sentinel.as_ref()?;
        Some(self.ask_sentinels(sentinel, true, connect_timeout, operation_timeout).await)
    }

    /// Whether connections use TLS.
    pub(crate) fn uses_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The servers admissions go to: the cluster's primaries once known, else the URL's
    /// server.
    pub(crate) fn servers(&self) -> Vec<Node> {
        if let Some(sentinel) = &self.sentinel {
            return sentinel
                .primary
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .iter()
                .cloned()
                .collect();
        }
        let map = self.slots.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        map.map_or_else(|| vec![self.seed.clone()], |map| map.primaries())
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
        if let Some((node, policy)) = self.watch.evicting() {
            return Err(Failure::Evicting(node, policy));
        }
        let result = self.run_on_target(script, slot, evalsha, connect_timeout, operation_timeout).await;
        if let Err(failure) = &result {
            self.after_failure(failure);
        }
        result
    }

    async fn run_on_target(
        &self,
        script: &Script,
        slot: u16,
        evalsha: &redis::Cmd,
        connect_timeout: Duration,
        operation_timeout: Duration,
    ) -> Result<Value, Failure> {
        let link = match &self.sentinel {
            None => self.route(slot),
            Some(_) => {
                let primary = self.target(connect_timeout, operation_timeout).await?;
                // Finding the primary may have read its policy.
                if let Some((node, policy)) = self.watch.evicting() {
                    return Err(Failure::Evicting(node, policy));
                }
                self.link(&primary)
            }
        };
        let live = link.live(&self.info, self.tls.as_ref(), connect_timeout).await?;
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
        let live = self.link(node).live(&self.info, self.tls.as_ref(), connect_timeout).await?;
        let deadline = Instant::now() + operation_timeout;
        send(&live, command, deadline, operation_timeout).await
    }
}

/// A failure's cause in a few words, for a Sentinel's reason.
fn describe(failure: &Failure) -> String {
    match failure {
        Failure::ConnectTimeout(_, timeout) => format!("did not connect within {timeout:?}"),
        Failure::Connect(_, error) | Failure::Connection(error) => error.to_string(),
        Failure::Server(error) => format!("refused with {}", error.code().unwrap_or("ERR")),
        Failure::Timeout(timeout) => format!("did not answer within {timeout:?}"),
        Failure::Evicting(_, policy) => format!("has maxmemory-policy {policy}"),
        Failure::NoPrimary { cause, .. } => cause.clone(),
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
