//! [`RedisConnector`]: the connections one process holds to one Redis deployment, shared by
//! every limiter built on it; [`RedisTls`]: how `rediss://` servers are verified.

use std::{
    fmt,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use redis::{ConnectionAddr, IntoConnectionInfo, RedisConnectionInfo};
use rustls::{
    RootCertStore,
    client::{
        WebPkiServerVerifier,
        danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    },
    pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime, pem::PemObject},
};

use crate::{
    client::{Connector, Node, Sentinel, Tls},
    config::ConfigError,
    error::{TlsError, UrlError},
    watch::{MAX_EVICTION_WATCH_INTERVAL, MIN_EVICTION_WATCH_INTERVAL},
};

/// The connections of one process to one Redis server or Redis Cluster, shared by every
/// limiter built from it with [`RedisStore::from_connector`](crate::RedisStore::from_connector):
/// one multiplexed connection per server (per cluster primary), whatever the number of
/// limiters, algorithms and key prefixes. Cloning is cheap and shares the connections.
///
/// # URLs
///
/// | URL | transport |
/// |---|---|
/// | `redis://[[user]:password@]host[:port][/db]` (or `valkey://`) | TCP |
/// | `rediss://[[user]:password@]host[:port][/db]` (or `valkeys://`) | TLS over TCP, verified against the system's trusted roots (see [`RedisTls`] for another CA, a client certificate) |
/// | `redis+unix:///path/to/socket[?db=N&user=U&pass=P]`, `unix:///path/to/socket[...]` | a Unix socket (Unix platforms) |
///
/// A user name selects a Redis ACL user (`AUTH user password`); the crate README gives the
/// smallest ACL a limiter needs.
///
/// # The eviction watch
///
/// Once a limiter of the connector has been [prepared](crate::RedisStore::prepare), the
/// connector reads `INFO memory` from every server admissions go to, every
/// [`DEFAULT_EVICTION_WATCH_INTERVAL`](crate::DEFAULT_EVICTION_WATCH_INTERVAL) (1 s) unless
/// [set otherwise](Self::with_eviction_watch_interval), on a background task. While the last
/// reading (or `prepare`) found a server whose `maxmemory-policy` is not `noeviction`, every
/// operation of every limiter of the connector fails before sending anything with
/// [`CheckError::EvictingServer`](crate::CheckError::EvictingServer) (not consumed): an
/// evicting server silently deletes quota state, which resets limits. A reading of
/// `noeviction` lifts it, as does the server's leaving the servers admissions go to (a
/// failover, a cluster's new slot map). Between a policy change and the reading that sees
/// it, admissions proceed: for at most one interval plus one round of readings (with
/// Sentinel, an ask of the Sentinels first; then one `INFO` per server, one after another,
/// each within the limiter's connect and operation timeouts).
///
/// # Examples
///
/// ```no_run
/// use runlimit_redis::{RedisConnector, RedisGcraLimiter, RedisLimiter};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let redis = RedisConnector::new("redis://127.0.0.1:6379")?;
/// let logins = RedisLimiter::from_connector(&redis);
/// let api = RedisGcraLimiter::from_connector(&redis);
/// logins.prepare().await?;
/// api.prepare().await?; // still one connection
/// # Ok(())
/// # }
/// # let _ = run;
/// ```
#[derive(Clone)]
pub struct RedisConnector {
    pub(crate) inner: Arc<Connector>,
}

impl fmt::Debug for RedisConnector {
    /// `RedisConnector { address: .., tls: .. }` (never a password).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConnector")
            .field("address", &self.inner.address())
            .field("tls", &self.inner.uses_tls())
            .finish_non_exhaustive()
    }
}

/// The URL of a TLS scheme (`rediss://`, or Valkey's `valkeys://`) with `redis://` in its
/// place (what redis-rs parses without its own TLS support), or `None` for any other scheme.
fn without_tls_scheme(url: &str) -> Option<String> {
    ["rediss://", "valkeys://"].into_iter().find_map(|scheme| {
        let head = url.get(..scheme.len())?;
        head.eq_ignore_ascii_case(scheme)
            .then(|| format!("redis://{}", url.get(scheme.len()..).unwrap_or_default()))
    })
}

impl RedisConnector {
    /// A connector for `url` (see [URLs](Self#urls)); `rediss://` verifies the server against
    /// the system's trusted roots and its host name. Connects nothing.
    ///
    /// # Errors
    ///
    /// [`UrlError::Invalid`] for a URL redis-rs cannot parse; [`UrlError::UnsupportedScheme`]
    /// for another scheme (or a Unix socket on a platform without them);
    /// [`UrlError::Tls`] for `rediss://` when no trusted root can be loaded from the system.
    pub fn new(url: &str) -> Result<Self, UrlError> {
        match without_tls_scheme(url) {
            Some(plain) => Self::build(&plain, Some(RedisTls::system_roots().map_err(UrlError::Tls)?)),
            None => Self::build(url, None),
        }
    }

    /// A connector for the `rediss://` (or `valkeys://`) URL `url`, with the TLS settings `tls`
    /// (a private CA, a client certificate). Connects nothing.
    ///
    /// # Errors
    ///
    /// [`UrlError::TlsNeedsRediss`] when `url` is not a `rediss://` or `valkeys://` URL;
    /// otherwise those of [`new`](Self::new), and [`UrlError::Tls`] when the client certificate does not match
    /// its key.
    pub fn with_tls(url: &str, tls: RedisTls) -> Result<Self, UrlError> {
        let plain = without_tls_scheme(url).ok_or(UrlError::TlsNeedsRediss)?;
        Self::build(&plain, Some(tls))
    }

    fn build(url: &str, tls: Option<RedisTls>) -> Result<Self, UrlError> {
        let info = url.into_connection_info().map_err(UrlError::Invalid)?;
        let tls = tls.map(|tls| tls.client_config().map(Tls::new)).transpose().map_err(UrlError::Tls)?;
        let connector = Connector::new(info, tls).ok_or(UrlError::UnsupportedScheme)?;
        Ok(Self { inner: Arc::new(connector) })
    }

    /// A connector for the primary of a service that Redis Sentinel monitors (see
    /// [`RedisSentinel`]). Connects nothing: the Sentinels are asked on first use.
    ///
    /// # Errors
    ///
    /// [`UrlError::Invalid`] if redis-rs refuses the primary's settings (it does not for any
    /// [`RedisSentinel`] built by its methods).
    pub fn sentinel(sentinel: RedisSentinel) -> Result<Self, UrlError> {
        // The address is a placeholder: operations go to the primary the Sentinels name.
        let info = ConnectionAddr::Tcp(String::new(), 0)
            .into_connection_info()
            .map_err(UrlError::Invalid)?
            .set_redis_settings(sentinel.primary);
        let nodes = sentinel.sentinels;
        Ok(Self { inner: Arc::new(Connector::with_sentinel(info, Sentinel::new(sentinel.service, nodes))) })
    }

    /// The URL's server: `host:port` (`[v6]:port`) or `unix:<path>`; never credentials. With
    /// Sentinel, the primary last named (`sentinel service <name>` before the first).
    #[must_use]
    pub fn address(&self) -> String {
        self.inner.address()
    }

    /// Whether connections use TLS (`rediss://`).
    #[must_use]
    pub fn uses_tls(&self) -> bool {
        self.inner.uses_tls()
    }

    /// Sets how often the [eviction watch](Self#the-eviction-watch) reads every server's
    /// `maxmemory-policy`; takes effect after the current interval. The bound it gives: an
    /// evicting policy is noticed at most `interval` plus one round of readings after it is
    /// set (see [the eviction watch](Self#the-eviction-watch)).
    ///
    /// # Errors
    ///
    /// [`ConfigError::EvictionWatchIntervalOutOfRange`] outside
    /// [`MIN_EVICTION_WATCH_INTERVAL`](crate::MIN_EVICTION_WATCH_INTERVAL) (10 ms) to
    /// [`MAX_EVICTION_WATCH_INTERVAL`](crate::MAX_EVICTION_WATCH_INTERVAL) (1 hour).
    pub fn with_eviction_watch_interval(self, interval: Duration) -> Result<Self, ConfigError> {
        if !(MIN_EVICTION_WATCH_INTERVAL..=MAX_EVICTION_WATCH_INTERVAL).contains(&interval) {
            return Err(ConfigError::EvictionWatchIntervalOutOfRange { interval });
        }
        self.inner.watch.set_interval(Some(interval));
        Ok(self)
    }

    /// Turns the [eviction watch](Self#the-eviction-watch) off: an evicting policy set after
    /// [`prepare`](crate::RedisStore::prepare) then goes unnoticed (until `prepare` runs
    /// again), and with Sentinel the primary is asked again only after failures. A verdict
    /// already recorded stays until `prepare` reads `noeviction` or the server is no longer
    /// one admissions go to.
    #[must_use]
    pub fn without_eviction_watch(self) -> Self {
        self.inner.watch.set_interval(None);
        self
    }

    /// Vouches that every server of this connector runs Redis 7.0 or newer with
    /// `maxmemory-policy noeviction`, for Redis users that may not run `INFO` (an ACL without
    /// `+info`, as some managed services impose): [`prepare`](crate::RedisStore::prepare)
    /// then reads no `INFO` (it still loads the scripts, and detects a cluster with
    /// `CLUSTER SLOTS` when the user may run it), and there is no eviction watch. Nothing
    /// checks the vouch: an evicting server would silently reset limits.
    #[must_use]
    pub fn vouch_for_noeviction(self) -> Self {
        self.inner.watch.vouch();
        self
    }

    /// The server the eviction watch (or the last [`prepare`](crate::RedisStore::prepare))
    /// last found with an evicting policy, as `(address, policy)`: while this is `Some`,
    /// every operation of the connector's limiters fails with
    /// [`CheckError::EvictingServer`](crate::CheckError::EvictingServer).
    #[must_use]
    pub fn evicting_server(&self) -> Option<(String, String)> {
        self.inner.watch.evicting().map(|(node, policy)| (node.to_string(), policy))
    }

    /// How many rounds the eviction watch has completed (each reads every server once,
    /// whether or not it answered); 0 while it has not started or is off.
    #[must_use]
    pub fn eviction_watch_rounds(&self) -> u64 {
        self.inner.watch.rounds()
    }

    /// Whether the eviction watch's task runs (it starts with the first successful
    /// [`prepare`](crate::RedisStore::prepare) of a limiter of the connector).
    #[must_use]
    pub fn eviction_watch_running(&self) -> bool {
        self.inner.watch.is_running()
    }
}

/// How a `rediss://` [`RedisConnector`] verifies the server, and the client certificate it
/// presents. TLS is rustls (with the *ring* cryptography provider): no OpenSSL. TLS 1.2 and
/// 1.3 with rustls' safe defaults.
///
/// The server's certificate must chain to one of the roots and be valid for the URL's host
/// (a DNS name or an IP address) unless
/// [`danger_accept_any_host_name`](Self::danger_accept_any_host_name) is called.
///
/// # Examples
///
/// ```no_run
/// use runlimit_redis::{RedisConnector, RedisTls};
///
/// # fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let tls = RedisTls::with_ca_file("/etc/redis/ca.pem")?
///     .with_client_certificate(&std::fs::read("client.pem")?, &std::fs::read("client.key")?)?;
/// let redis = RedisConnector::with_tls("rediss://redis.internal:6380", tls)?;
/// assert!(redis.uses_tls());
/// # Ok(())
/// # }
/// # let _ = run;
/// ```
#[derive(Clone)]
pub struct RedisTls {
    roots: Arc<RootCertStore>,
    client: Option<Arc<ClientIdentity>>,
    verify_host_name: bool,
}

/// A client certificate chain and its private key.
struct ClientIdentity {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

impl fmt::Debug for RedisTls {
    /// The number of roots, whether a client certificate is set, whether host names are
    /// verified (never key material).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisTls")
            .field("roots", &self.roots.len())
            .field("client_certificate", &self.client.is_some())
            .field("verify_host_name", &self.verify_host_name)
            .finish()
    }
}

/// Every certificate of a PEM document; `what` names it in errors.
fn certificates(pem: &[u8], what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certificates = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| TlsError::InvalidPem { what, detail: error.to_string() })?;
    if certificates.is_empty() {
        return Err(TlsError::NoCertificates { what });
    }
    Ok(certificates)
}

impl RedisTls {
    /// Trusts the operating system's root certificates (as `rustls-native-certs` loads them:
    /// the platform store, or the files `SSL_CERT_FILE` / `SSL_CERT_DIR` name). What
    /// [`RedisConnector::new`] uses for `rediss://`.
    ///
    /// # Errors
    ///
    /// [`TlsError::NoSystemRoots`] when not one root certificate could be loaded.
    pub fn system_roots() -> Result<Self, TlsError> {
        let loaded = rustls_native_certs::load_native_certs();
        let mut roots = RootCertStore::empty();
        let (added, _ignored) = roots.add_parsable_certificates(loaded.certs);
        if added == 0 {
            return Err(TlsError::NoSystemRoots { errors: loaded.errors.len() });
        }
        Ok(Self::of(roots))
    }

    /// Trusts only the CA certificates of the PEM document `pem` (one or more `CERTIFICATE`
    /// blocks), as for a server whose certificate a private CA issued.
    ///
    /// # Errors
    ///
    /// [`TlsError::InvalidPem`] when `pem` is not valid PEM; [`TlsError::NoCertificates`]
    /// when it holds no certificate; [`TlsError::InvalidCertificate`] when a certificate
    /// cannot be a trust anchor.
    pub fn with_ca_pem(pem: &[u8]) -> Result<Self, TlsError> {
        let mut roots = RootCertStore::empty();
        for certificate in certificates(pem, "the CA PEM")? {
            roots.add(certificate).map_err(|error| TlsError::InvalidCertificate {
                what: "the CA PEM",
                detail: error.to_string(),
            })?;
        }
        Ok(Self::of(roots))
    }

    /// [`with_ca_pem`](Self::with_ca_pem) of the file at `path`.
    ///
    /// # Errors
    ///
    /// [`TlsError::ReadCaFile`] when the file cannot be read; otherwise those of
    /// [`with_ca_pem`](Self::with_ca_pem).
    pub fn with_ca_file(path: impl AsRef<Path>) -> Result<Self, TlsError> {
        let path = path.as_ref();
        let pem = std::fs::read(path)
            .map_err(|source| TlsError::ReadCaFile { path: PathBuf::from(path), source })?;
        Self::with_ca_pem(&pem)
    }

    fn of(roots: RootCertStore) -> Self {
        Self { roots: Arc::new(roots), client: None, verify_host_name: true }
    }

    /// Presents a client certificate (mutual TLS, `tls-auth-clients yes`): `chain_pem` holds
    /// the certificate and any intermediates, leaf first; `key_pem` its private key (PKCS #8,
    /// PKCS #1 or SEC1 PEM).
    ///
    /// # Errors
    ///
    /// [`TlsError::InvalidPem`] or [`TlsError::NoCertificates`] for the chain,
    /// [`TlsError::InvalidPem`] for a key that is not a PEM private key. A key that does
    /// not match the certificate is refused by [`RedisConnector::with_tls`].
    pub fn with_client_certificate(mut self, chain_pem: &[u8], key_pem: &[u8]) -> Result<Self, TlsError> {
        let chain = certificates(chain_pem, "the client certificate chain")?;
        let key = PrivateKeyDer::from_pem_slice(key_pem)
            .map_err(|error| TlsError::InvalidPem { what: "the client key", detail: error.to_string() })?;
        self.client = Some(Arc::new(ClientIdentity { chain, key }));
        Ok(self)
    }

    /// Accepts a certificate issued for any host name (it must still chain to a trusted root
    /// and be in its validity period). Only for servers whose certificates name no host you
    /// can connect by, such as a test server reached through a tunnel: anyone holding any
    /// certificate of the trusted roots can then impersonate the server.
    #[must_use]
    pub fn danger_accept_any_host_name(mut self) -> Self {
        self.verify_host_name = false;
        self
    }

    /// The rustls client configuration.
    pub(crate) fn client_config(&self) -> Result<rustls::ClientConfig, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|error| TlsError::Configuration { detail: error.to_string() })?;
        let builder = if self.verify_host_name {
            builder.with_root_certificates(Arc::clone(&self.roots))
        } else {
            let verifier = WebPkiServerVerifier::builder_with_provider(Arc::clone(&self.roots), provider)
                .build()
                .map_err(|error| TlsError::Configuration { detail: error.to_string() })?;
            builder.dangerous().with_custom_certificate_verifier(Arc::new(AnyHostName(verifier)))
        };
        match &self.client {
            None => Ok(builder.with_no_client_auth()),
            Some(identity) => builder
                .with_client_auth_cert(identity.chain.clone(), identity.key.clone_key())
                .map_err(|error| TlsError::InvalidClientCertificate { detail: error.to_string() }),
        }
    }
}

/// rustls' verifier with one error forgiven: a certificate valid for another host name.
/// (rustls has no switch for it; this wrapper delegates everything else.)
#[derive(Debug)]
struct AnyHostName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyHostName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.0.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName
                | rustls::CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        certificate: &CertificateDer<'_>,
        signature: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, certificate, signature)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        certificate: &CertificateDer<'_>,
        signature: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, certificate, signature)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// Where a [`RedisConnector::sentinel`] finds its primary: the Sentinels monitoring a service,
/// and the credentials and database of the service's servers.
///
/// The connector asks every Sentinel at once (`SENTINEL GET-MASTER-ADDR-BY-NAME`) and takes
/// the first server named that answers `ROLE` as a primary; it sends every operation there,
/// and admissions never go to replicas. Operations wait for an ask at most the limiter's
/// connect timeout, and operations waiting together share one ask. It asks again after a
/// failure that may mean the primary moved (no connection, a lost or late reply, `READONLY`,
/// `LOADING`, `MASTERDOWN`, `NOREPLICAS`) and at every round of the
/// [eviction watch](RedisConnector#the-eviction-watch) while it runs. Before switching to a
/// newly named primary it reads its `maxmemory-policy` (unless the operator
/// [vouched](RedisConnector::vouch_for_noeviction)): an evicting one fails every operation
/// closed, and one whose policy cannot be read is not switched to. The failure itself is
/// returned as it happened, never retried: an admission sent to the old primary keeps its
/// consumption class.
///
/// The Sentinels' answers are trusted: Sentinel speaks no TLS here, and the primary's
/// credentials are sent, in plain text, to whatever server a Sentinel names. Reach the
/// Sentinels and the servers over a network you trust.
///
/// Replication is asynchronous: admissions the old primary acknowledged but had not yet
/// replicated are lost in a failover, which over-admits by at most those (Redis'
/// `min-replicas-to-write` narrows the window). Counters that did replicate keep their
/// windows: every shard's time watermark replicates with them, so a new primary whose clock
/// is behind never reopens a window early. Not with TLS or a Redis Cluster.
///
/// # Examples
///
/// ```no_run
/// use runlimit_redis::{RedisConnector, RedisLimiter, RedisSentinel};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let sentinel = RedisSentinel::new("mymaster", &["redis://10.0.0.1:26379", "redis://10.0.0.2:26379"])?
///     .with_primary_credentials(Some("runlimit"), "a password");
/// let limiter = RedisLimiter::from_connector(&RedisConnector::sentinel(sentinel)?);
/// limiter.prepare().await?;
/// # Ok(())
/// # }
/// # let _ = run;
/// ```
#[derive(Clone)]
pub struct RedisSentinel {
    service: String,
    sentinels: Vec<(Node, redis::ConnectionInfo)>,
    primary: RedisConnectionInfo,
}

impl fmt::Debug for RedisSentinel {
    /// The service and the Sentinels' addresses (never credentials).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sentinels: Vec<String> = self.sentinels.iter().map(|(node, _)| node.to_string()).collect();
        f.debug_struct("RedisSentinel")
            .field("service", &self.service)
            .field("sentinels", &sentinels)
            .finish_non_exhaustive()
    }
}

impl RedisSentinel {
    /// The service `service_name` (as in `sentinel monitor <name> ...`), monitored by the
    /// Sentinels at `sentinel_urls` (`redis://[[USER]:PASSWORD@]HOST:PORT`, with the
    /// credentials of the Sentinel itself, if it requires any). The service's servers are
    /// reached without credentials and on database 0 unless set with
    /// [`with_primary_credentials`](Self::with_primary_credentials) and
    /// [`with_database`](Self::with_database).
    ///
    /// # Errors
    ///
    /// [`UrlError::NoSentinels`] for an empty list or an empty service name;
    /// [`UrlError::Invalid`] for a URL redis-rs cannot parse; [`UrlError::UnsupportedScheme`]
    /// for a Sentinel URL that is not `redis://` over TCP.
    pub fn new(service_name: &str, sentinel_urls: &[&str]) -> Result<Self, UrlError> {
        if service_name.is_empty() || sentinel_urls.is_empty() {
            return Err(UrlError::NoSentinels);
        }
        let mut sentinels = Vec::with_capacity(sentinel_urls.len());
        for url in sentinel_urls {
            let info = url.into_connection_info().map_err(UrlError::Invalid)?;
            let ConnectionAddr::Tcp(host, port) = info.addr().clone() else {
                return Err(UrlError::UnsupportedScheme);
            };
            sentinels.push((Node::Tcp(host, port), info));
        }
        Ok(Self { service: service_name.to_owned(), sentinels, primary: RedisConnectionInfo::default() })
    }

    /// Authenticates to the service's servers as `username` (an ACL user; `None`: the
    /// default user) with `password`.
    #[must_use]
    pub fn with_primary_credentials(mut self, username: Option<&str>, password: &str) -> Self {
        let mut settings = self.primary.set_password(password);
        if let Some(username) = username {
            settings = settings.set_username(username);
        }
        self.primary = settings;
        self
    }

    /// Selects database `database` on the service's servers.
    #[must_use]
    pub fn with_database(mut self, database: u16) -> Self {
        self.primary = self.primary.set_db(i64::from(database));
        self
    }
}
