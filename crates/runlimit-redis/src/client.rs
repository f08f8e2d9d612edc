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
}

/// The connection of one limiter (and its clones): opened lazily, replaced when its driver
/// ends or an operation on it fails with an I/O error.
pub(crate) struct Connector {
    host: String,
    port: u16,
    info: ConnectionInfo,
    current: RwLock<Option<Live>>,
    reconnect: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        f.debug_struct("Connector")
            .field("host", &self.host)
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

/// Why a Redis URL was refused.
#[derive(Debug)]
pub(crate) enum UrlFailure {
    Parse(RedisError),
    Unsupported,
}

impl Connector {
    /// A connector for `url` (`redis://[user:password@]host[:port][/db]`). Connects nothing.
    pub(crate) fn new(url: &str) -> Result<Self, UrlFailure> {
        let info = url.into_connection_info().map_err(UrlFailure::Parse)?;
        let ConnectionAddr::Tcp(host, port) = info.addr().clone() else {
            return Err(UrlFailure::Unsupported);
        };
        Ok(Self { host, port, info, current: RwLock::new(None), reconnect: tokio::sync::Mutex::new(()) })
    }

    /// The server's `host:port`.
    pub(crate) fn address(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    fn cached(&self) -> Option<Live> {
        let current = self.current.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        current.as_ref().filter(|live| !live.is_closed()).cloned()
    }

    /// A live connection, opening one when there is none, within `timeout`.
    async fn live(&self, timeout: Duration) -> Result<Live, Failure> {
        if let Some(live) = self.cached() {
            return Ok(live);
        }
        let open = async {
            let _one_at_a_time = self.reconnect.lock().await;
            if let Some(live) = self.cached() {
                return Ok(live);
            }
            let live = self.open().await.map_err(Failure::Connect)?;
            *self.current.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(live.clone());
            Ok(live)
        };
        tokio::time::timeout(timeout, open).await.unwrap_or(Err(Failure::ConnectTimeout(timeout)))
    }

    async fn open(&self) -> Result<Live, RedisError> {
        let stream = TcpStream::connect((self.host.as_str(), self.port)).await?;
        stream.set_nodelay(true)?;
        // Timeouts are this crate's (the operation timeout); no response timeout of redis-rs.
        let config = AsyncConnectionConfig::new().set_response_timeout(None);
        let (connection, driver) =
            MultiplexedConnection::new_with_config(self.info.redis_settings(), stream, config).await?;
        let closed = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&closed);
        tokio::spawn(async move {
            driver.await;
            flag.store(true, Ordering::Release);
        });
        Ok(Live { connection, closed })
    }

    /// Marks `live` as unusable, so the next operation opens a new connection.
    fn discard(&self, live: &Live) {
        live.closed.store(true, Ordering::Release);
    }

    /// Runs `script` with `keys` and `args`: one `EVALSHA`, and after `NOSCRIPT` one
    /// `SCRIPT LOAD` and one more `EVALSHA`, all within `operation_timeout` once a
    /// connection is at hand (obtained within `connect_timeout`).
    pub(crate) async fn run(
        &self,
        script: &Script,
        keys: &[Vec<u8>],
        args: &[Vec<u8>],
        connect_timeout: Duration,
        operation_timeout: Duration,
    ) -> Result<Value, Failure> {
        let live = self.live(connect_timeout).await?;
        let deadline = Instant::now() + operation_timeout;
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha.arg(&script.sha).arg(keys.len()).arg(keys).arg(args);
        match self.send(&live, &evalsha, deadline, operation_timeout).await {
            Err(Failure::Server(error)) if error.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                let mut load = redis::cmd("SCRIPT");
                load.arg("LOAD").arg(script.source);
                self.send(&live, &load, deadline, operation_timeout).await?;
                self.send(&live, &evalsha, deadline, operation_timeout).await
            }
            result => result,
        }
    }

    /// Runs a plain command (preparation and test helpers) under the same classification.
    pub(crate) async fn command(
        &self,
        command: &redis::Cmd,
        connect_timeout: Duration,
        operation_timeout: Duration,
    ) -> Result<Value, Failure> {
        let live = self.live(connect_timeout).await?;
        let deadline = Instant::now() + operation_timeout;
        self.send(&live, command, deadline, operation_timeout).await
    }

    async fn send(
        &self,
        live: &Live,
        command: &redis::Cmd,
        deadline: Instant,
        operation_timeout: Duration,
    ) -> Result<Value, Failure> {
        let mut connection = live.connection.clone();
        match tokio::time::timeout_at(deadline, connection.send_packed_command(command)).await {
            Err(_) => {
                // The reply may still arrive on this connection and be read by nobody; a
                // late reply is harmless, but a connection that stalls is replaced.
                self.discard(live);
                Err(Failure::Timeout(operation_timeout))
            }
            Ok(Ok(value)) => value.extract_error().map_err(|error| classify(self, live, error)),
            Ok(Err(error)) => Err(classify(self, live, error)),
        }
    }
}

fn classify(connector: &Connector, live: &Live, error: RedisError) -> Failure {
    match error.kind() {
        ErrorKind::Server(_) | ErrorKind::Extension => Failure::Server(error),
        _ => {
            connector.discard(live);
            Failure::Connection(error)
        }
    }
}
