//! The application's client-address extractor: socket peer, IPv6 /64 aggregation, and
//! `X-Forwarded-For` only from a configured trusted proxy.

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    sync::Arc,
};

use axum::extract::ConnectInfo;
use http::{StatusCode, request::Parts};
use runlimit_axum::ExtractSubjectKey;
use runlimit_core::{KeyHasher, RateLimitPolicy, SubjectKey};

/// The `X-Forwarded-For` header name (de facto standard; not in `http`'s constants).
const X_FORWARDED_FOR: &str = "x-forwarded-for";

/// Why no client could be named for a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClientAddressError {
    /// The request has no `ConnectInfo<SocketAddr>` extension: the server was not started
    /// with `into_make_service_with_connect_info`. A server bug; answered with 500.
    #[error("request carries no socket peer address")]
    MissingPeerAddress,
    /// The peer is a trusted proxy but sent no `X-Forwarded-For`. Answered with 400: a
    /// trusted proxy must always say whom it forwards for.
    #[error("trusted proxy sent no X-Forwarded-For")]
    MissingForwardedFor,
    /// The peer is a trusted proxy but the rightmost `X-Forwarded-For` entry is not a bare
    /// IPv4 or IPv6 address. Answered with 400.
    #[error("trusted proxy sent a malformed X-Forwarded-For entry")]
    InvalidForwardedFor,
}

impl ClientAddressError {
    /// The HTTP status the demo answers with: 500 for
    /// [`MissingPeerAddress`](Self::MissingPeerAddress), 400 otherwise.
    #[must_use]
    pub fn status(&self) -> StatusCode {
        match self {
            Self::MissingPeerAddress => StatusCode::INTERNAL_SERVER_ERROR,
            Self::MissingForwardedFor | Self::InvalidForwardedFor => StatusCode::BAD_REQUEST,
        }
    }
}

/// A client as the per-client gates count it: one IPv4 address, or one IPv6 /64 prefix.
///
/// IPv4-mapped IPv6 addresses (`::ffff:192.0.2.4`) are IPv4 clients. A single IPv6 host
/// usually controls a whole /64 (SLAAC, privacy addresses), so counting individual IPv6
/// addresses would let one host rotate through 2⁶⁴ subjects.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClientNetwork {
    /// One IPv4 address.
    V4(Ipv4Addr),
    /// An IPv6 /64 prefix: the address with its low 64 bits cleared.
    V6Prefix64(Ipv6Addr),
}

impl ClientNetwork {
    /// The client network of `address`.
    #[must_use]
    pub fn of(address: IpAddr) -> Self {
        match address.to_canonical() {
            IpAddr::V4(v4) => Self::V4(v4),
            IpAddr::V6(v6) => Self::V6Prefix64(Ipv6Addr::from(v6.to_bits() & !u128::from(u64::MAX))),
        }
    }

    /// The normalized subject bytes hashed into the subject key:
    /// `client-v4:192.0.2.4` or `client-v6/64:2001:db8:1:2::`.
    #[must_use]
    pub fn subject(&self) -> String {
        match self {
            Self::V4(v4) => format!("client-v4:{v4}"),
            Self::V6Prefix64(prefix) => format!("client-v6/64:{prefix}"),
        }
    }
}

impl fmt::Debug for ClientNetwork {
    /// Redacted: a client address is personal data and never logged.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::V4(_) => "ClientNetwork::V4(..)",
            Self::V6Prefix64(_) => "ClientNetwork::V6Prefix64(..)",
        })
    }
}

/// Names the client of a request from its head.
///
/// 1. The socket peer address comes from axum's `ConnectInfo<SocketAddr>` extension.
/// 2. If the peer (canonicalized, so `::ffff:127.0.0.1` is `127.0.0.1`) is one of
///    `trusted_proxies`, the client is the **rightmost** `X-Forwarded-For` entry (in the last
///    header line): the one that proxy appended. Entries to its left were supplied by the
///    client and are never trusted. The entry must be a bare IP address.
/// 3. Otherwise the client is the peer itself. `Forwarded`, `X-Forwarded-For`,
///    `X-Real-IP` and every other header are ignored.
///
/// The address is then aggregated by [`ClientNetwork::of`].
///
/// # Errors
///
/// - [`ClientAddressError::MissingPeerAddress`] without `ConnectInfo`;
/// - [`ClientAddressError::MissingForwardedFor`] when a trusted proxy sent no
///   `X-Forwarded-For` (or an empty last entry);
/// - [`ClientAddressError::InvalidForwardedFor`] when the rightmost entry is not an IP
///   address.
pub fn client_network(
    parts: &Parts,
    trusted_proxies: &[IpAddr],
) -> Result<ClientNetwork, ClientAddressError> {
    let ConnectInfo(peer) =
        parts.extensions.get::<ConnectInfo<SocketAddr>>().ok_or(ClientAddressError::MissingPeerAddress)?;
    let peer = peer.ip().to_canonical();
    if !trusted_proxies.iter().any(|proxy| proxy.to_canonical() == peer) {
        return Ok(ClientNetwork::of(peer));
    }
    let last_line = parts
        .headers
        .get_all(X_FORWARDED_FOR)
        .iter()
        .next_back()
        .ok_or(ClientAddressError::MissingForwardedFor)?;
    let line = last_line.to_str().map_err(|_| ClientAddressError::InvalidForwardedFor)?;
    let rightmost = line.rsplit(',').next().map(str::trim).unwrap_or_default();
    if rightmost.is_empty() {
        return Err(ClientAddressError::MissingForwardedFor);
    }
    let address: IpAddr = rightmost.parse().map_err(|_| ClientAddressError::InvalidForwardedFor)?;
    Ok(ClientNetwork::of(address))
}

/// The per-client key extractor of the demo's [`RateLimitLayer`](runlimit_axum::RateLimitLayer)s.
///
/// Names the client with [`client_network`] and derives its opaque key with
/// [`KeyHasher::hash_for`] under the layer's policy, so the same client has unrelated keys
/// under `login-client` and `items`. Works for any policy type.
#[derive(Clone)]
pub struct ClientKey {
    hasher: KeyHasher,
    trusted_proxies: Arc<[IpAddr]>,
}

impl ClientKey {
    /// An extractor hashing with `hasher` and trusting `X-Forwarded-For` only from
    /// `trusted_proxies`.
    #[must_use]
    pub fn new(hasher: KeyHasher, trusted_proxies: impl Into<Arc<[IpAddr]>>) -> Self {
        Self { hasher, trusted_proxies: trusted_proxies.into() }
    }
}

impl fmt::Debug for ClientKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientKey").field("trusted_proxies", &self.trusted_proxies).finish_non_exhaustive()
    }
}

impl<P: RateLimitPolicy> ExtractSubjectKey<P> for ClientKey {
    type Error = ClientAddressError;

    fn extract_subject_key(&self, parts: &Parts, policy: &P) -> Result<SubjectKey, ClientAddressError> {
        let client = client_network(parts, &self.trusted_proxies)?;
        Ok(self.hasher.hash_for(policy, client.subject().as_bytes()).into_unbound_subject_key())
    }
}

#[cfg(test)]
mod tests {
    use http::Request;

    use super::*;

    fn parts(peer: &str, forwarded_for: &[&str]) -> Parts {
        let mut request = Request::get("/").header("forwarded", "for=203.0.113.77");
        for line in forwarded_for {
            request = request.header(X_FORWARDED_FOR, *line);
        }
        let (mut parts, ()) = request.body(()).unwrap().into_parts();
        parts.extensions.insert(ConnectInfo(peer.parse::<SocketAddr>().unwrap()));
        parts
    }

    fn subject(peer: &str, forwarded_for: &[&str], trusted: &[&str]) -> Result<String, ClientAddressError> {
        let trusted: Vec<IpAddr> = trusted.iter().map(|ip| ip.parse().unwrap()).collect();
        client_network(&parts(peer, forwarded_for), &trusted).map(|client| client.subject())
    }

    #[test]
    fn peer_address_without_trusted_proxy() {
        assert_eq!(subject("192.0.2.4:5000", &[], &[]).unwrap(), "client-v4:192.0.2.4");
        // Forwarding headers are ignored without a trusted proxy.
        assert_eq!(subject("192.0.2.4:5000", &["198.51.100.1"], &[]).unwrap(), "client-v4:192.0.2.4");
        // ... and from a peer that is not the trusted proxy.
        assert_eq!(
            subject("192.0.2.4:5000", &["198.51.100.1"], &["192.0.2.5"]).unwrap(),
            "client-v4:192.0.2.4"
        );
    }

    #[test]
    fn ipv6_is_aggregated_to_its_64_prefix() {
        assert_eq!(
            subject("[2001:db8:1:2:aaaa:bbbb:cccc:dddd]:1", &[], &[]).unwrap(),
            "client-v6/64:2001:db8:1:2::"
        );
        assert_eq!(subject("[2001:db8:1:2::1]:1", &[], &[]), subject("[2001:db8:1:2:ffff::9]:1", &[], &[]));
        assert_ne!(subject("[2001:db8:1:2::1]:1", &[], &[]), subject("[2001:db8:1:3::1]:1", &[], &[]));
        // IPv4-mapped addresses are IPv4 clients.
        assert_eq!(subject("[::ffff:192.0.2.4]:1", &[], &[]).unwrap(), "client-v4:192.0.2.4");
    }

    #[test]
    fn trusted_proxy_uses_the_rightmost_forwarded_for_entry() {
        let trusted = ["10.0.0.1"];
        assert_eq!(
            subject("10.0.0.1:1", &["203.0.113.9, 198.51.100.7"], &trusted).unwrap(),
            "client-v4:198.51.100.7"
        );
        // Several header lines: the last line holds the proxy's entry.
        assert_eq!(
            subject("10.0.0.1:1", &["203.0.113.9", "192.0.2.1 , 198.51.100.8 "], &trusted).unwrap(),
            "client-v4:198.51.100.8"
        );
        assert_eq!(
            subject("10.0.0.1:1", &["2001:db8::1:2:3:4"], &trusted).unwrap(),
            "client-v6/64:2001:db8::"
        );
        // A mapped peer address matches an IPv4 proxy.
        assert_eq!(
            subject("[::ffff:10.0.0.1]:1", &["198.51.100.7"], &trusted).unwrap(),
            "client-v4:198.51.100.7"
        );
    }

    #[test]
    fn trusted_proxy_errors() {
        let trusted = ["10.0.0.1"];
        assert_eq!(subject("10.0.0.1:1", &[], &trusted), Err(ClientAddressError::MissingForwardedFor));
        assert_eq!(
            subject("10.0.0.1:1", &["192.0.2.1, "], &trusted),
            Err(ClientAddressError::MissingForwardedFor)
        );
        assert_eq!(
            subject("10.0.0.1:1", &["unknown"], &trusted),
            Err(ClientAddressError::InvalidForwardedFor)
        );
        assert_eq!(
            subject("10.0.0.1:1", &["198.51.100.7:443"], &trusted),
            Err(ClientAddressError::InvalidForwardedFor)
        );
        let (parts, ()) = Request::get("/").body(()).unwrap().into_parts();
        assert_eq!(client_network(&parts, &[]), Err(ClientAddressError::MissingPeerAddress));
        assert_eq!(ClientAddressError::MissingPeerAddress.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(ClientAddressError::InvalidForwardedFor.status(), StatusCode::BAD_REQUEST);
    }

    #[test]
    fn keys_differ_per_policy_and_client() {
        use std::time::Duration;

        use runlimit_core::{FixedWindowPolicy, PolicyId, ScopeId};

        let hasher = KeyHasher::new(&[3; 32]).unwrap();
        let extractor = ClientKey::new(hasher, Vec::new());
        let policy = |id: &str| {
            FixedWindowPolicy::new(
                PolicyId::new(id).unwrap(),
                ScopeId::new("client").unwrap(),
                1,
                Duration::from_secs(1),
            )
            .unwrap()
        };
        let (a, b) = (policy("a"), policy("b"));
        let key =
            |peer: &str, p: &FixedWindowPolicy| extractor.extract_subject_key(&parts(peer, &[]), p).unwrap();
        assert_eq!(key("192.0.2.4:1", &a), key("192.0.2.4:2", &a));
        assert_ne!(key("192.0.2.4:1", &a), key("192.0.2.5:1", &a));
        assert_ne!(key("192.0.2.4:1", &a), key("192.0.2.4:1", &b));
        assert_eq!(format!("{:?}", ClientNetwork::of("192.0.2.4".parse().unwrap())), "ClientNetwork::V4(..)");
    }
}
