//! The ready-made per-peer-address extractor (feature `axum`).

use std::net::{IpAddr, SocketAddr};

use axum::extract::ConnectInfo;
use http::request::Parts;
use runlimit_core::{KeyHasher, RateLimitPolicy, SubjectKey};

use crate::ExtractSubjectKey;

/// The IPv6 prefix length [`PeerAddressKey::new`] keys by: one /64, the network a single
/// subscriber usually controls whole (RFC 6177 §3 recommends assigning at least a /64 to an
/// end site, so one client can choose among 2^64 addresses).
pub const DEFAULT_IPV6_PREFIX_LEN: u8 = 64;

/// A ready-made [`ExtractSubjectKey`] (feature `axum`): the subject is the TCP peer's IP
/// address, as axum's [`ConnectInfo<SocketAddr>`](axum::extract::ConnectInfo) gives it,
/// hashed with the application's [`KeyHasher`] under the layer's policy.
///
/// - An IPv4 peer is keyed by its whole address; an IPv4-mapped IPv6 peer (`::ffff:a.b.c.d`,
///   which a dual-stack listener reports for IPv4 clients) is keyed as that IPv4 address.
/// - An IPv6 peer is keyed by its network prefix, /64 unless
///   [`with_ipv6_prefix_len`](Self::with_ipv6_prefix_len) says otherwise: the bits past the
///   prefix are cleared before hashing, so every address of one /64 shares one quota.
/// - The port is never part of the key (a client opens connections from many ports).
///
/// It reads the socket peer, never `Forwarded` or `X-Forwarded-For`: behind a reverse proxy
/// every request comes from the proxy's address and shares one quota. Deriving the client
/// from forwarding headers is only correct for the proxies the application trusts, and is
/// the application's own extractor to write (see the crate docs' recipes).
///
/// The router must be served with
/// `into_make_service_with_connect_info::<SocketAddr>()`; otherwise the request has no
/// `ConnectInfo<SocketAddr>` extension and every request is refused with
/// [`MissingPeerAddress`], whose message names that call (the mapper's
/// [`RateLimitRejection::Extraction`](crate::RateLimitRejection::Extraction);
/// [`ProblemRejections`](crate::ProblemRejections) answers 400). Nothing is consumed then.
/// Every request costs one unit.
///
/// # Examples
///
/// ```
/// use std::{net::SocketAddr, sync::Arc, time::Duration};
/// use axum::{Router, routing::post};
/// use runlimit_axum::{PeerAddressKey, ProblemRejections, RateLimitLayer};
/// use runlimit_core::{FixedWindowPolicy, KeyHasher, PolicyId, ScopeId};
/// use runlimit_memory::{MemoryStore, MemoryStoreConfig};
///
/// async fn serve(secret: &[u8], listener: tokio::net::TcpListener) -> Result<(), Box<dyn std::error::Error>> {
///     let store = Arc::new(MemoryStore::new(MemoryStoreConfig::new(100_000)?));
///     let policy = FixedWindowPolicy::new(PolicyId::new("auth.login")?, ScopeId::new("client")?, 40, Duration::from_secs(60))?;
///     let gate = RateLimitLayer::new(store, policy, PeerAddressKey::new(KeyHasher::new(secret)?), ProblemRejections::new());
///     let app = Router::new().route("/login", post(|| async { "welcome" }).route_layer(gate));
///     // Without `_with_connect_info`, every request would be refused: there is no peer address.
///     axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
///     Ok(())
/// }
/// # let _ = serve;
/// ```
#[derive(Clone)]
pub struct PeerAddressKey {
    hasher: KeyHasher,
    ipv6_prefix_len: u8,
}

impl PeerAddressKey {
    /// Keys requests by the peer's IPv4 address or IPv6 /64 network
    /// ([`DEFAULT_IPV6_PREFIX_LEN`]), hashed with `hasher`.
    #[must_use]
    pub fn new(hasher: KeyHasher) -> Self {
        Self { hasher, ipv6_prefix_len: DEFAULT_IPV6_PREFIX_LEN }
    }

    /// Keys IPv6 peers by their first `bits` bits instead: 128 keys each address on its own
    /// (when clients are known not to control whole networks), 48 or 56 whole sites.
    ///
    /// # Errors
    ///
    /// [`InvalidIpv6PrefixLen`] when `bits` is 0 (every IPv6 client would share one quota) or
    /// above 128.
    pub fn with_ipv6_prefix_len(self, bits: u8) -> Result<Self, InvalidIpv6PrefixLen> {
        if bits == 0 || bits > 128 {
            return Err(InvalidIpv6PrefixLen { bits });
        }
        Ok(Self { ipv6_prefix_len: bits, ..self })
    }

    /// The number of leading bits an IPv6 peer is keyed by (1 to 128).
    #[must_use]
    pub fn ipv6_prefix_len(&self) -> u8 {
        self.ipv6_prefix_len
    }

    /// The bytes hashed for `ip`: a family tag, the IPv6 prefix length, and the address with
    /// every bit past the prefix cleared. Distinct networks never share bytes, and an IPv4
    /// address never collides with an IPv6 network.
    fn subject(&self, ip: IpAddr) -> [u8; 18] {
        let mut subject = [0; 18];
        match canonical(ip) {
            IpAddr::V4(v4) => {
                subject[0] = 4;
                subject[1] = 32;
                subject[2..6].copy_from_slice(&v4.octets());
            }
            IpAddr::V6(v6) => {
                let mask = u128::MAX << (128 - u32::from(self.ipv6_prefix_len));
                subject[0] = 6;
                subject[1] = self.ipv6_prefix_len;
                subject[2..].copy_from_slice(&(u128::from(v6) & mask).to_be_bytes());
            }
        }
        subject
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it carries; any other address unchanged.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 @ IpAddr::V4(_) => v4,
    }
}

impl std::fmt::Debug for PeerAddressKey {
    /// The IPv6 prefix length only (never the hasher's secret).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerAddressKey")
            .field("ipv6_prefix_len", &self.ipv6_prefix_len)
            .finish_non_exhaustive()
    }
}

impl<P: RateLimitPolicy> ExtractSubjectKey<P> for PeerAddressKey {
    type Error = MissingPeerAddress;

    fn extract_subject_key(&self, parts: &Parts, policy: &P) -> Result<SubjectKey, MissingPeerAddress> {
        let ConnectInfo(peer) =
            parts.extensions.get::<ConnectInfo<SocketAddr>>().ok_or(MissingPeerAddress)?;
        Ok(self.hasher.hash_for(policy, &self.subject(peer.ip())).into_unbound_subject_key())
    }
}

/// Why a [`PeerAddressKey`] named no subject: the request carries no
/// `ConnectInfo<SocketAddr>` extension, because the router was not served with
/// `into_make_service_with_connect_info::<SocketAddr>()`. A configuration error of the
/// application, never the client's doing; the message names the fix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MissingPeerAddress;

impl std::fmt::Display for MissingPeerAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            "the request has no peer address (no axum::extract::ConnectInfo<SocketAddr> extension): \
             serve the router with `into_make_service_with_connect_info::<SocketAddr>()`",
        )
    }
}

impl std::error::Error for MissingPeerAddress {}

/// [`PeerAddressKey::with_ipv6_prefix_len`] was given a prefix length outside 1 to 128.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InvalidIpv6PrefixLen {
    bits: u8,
}

impl InvalidIpv6PrefixLen {
    /// The length refused, in bits.
    #[must_use]
    pub fn bits(&self) -> u8 {
        self.bits
    }
}

impl std::fmt::Display for InvalidIpv6PrefixLen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "an IPv6 prefix length must be 1 to 128 bits, not {}", self.bits)
    }
}

impl std::error::Error for InvalidIpv6PrefixLen {}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> PeerAddressKey {
        PeerAddressKey::new(KeyHasher::new(&[9; 32]).unwrap())
    }

    #[test]
    fn ipv4_is_keyed_by_the_whole_address_and_mapped_ipv6_as_ipv4() {
        let key = key();
        let v4 = key.subject("192.0.2.7".parse().unwrap());
        assert_eq!(v4, [4, 32, 192, 0, 2, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(key.subject("::ffff:192.0.2.7".parse().unwrap()), v4);
        assert_ne!(key.subject("192.0.2.8".parse().unwrap()), v4);
    }

    #[test]
    fn ipv6_is_keyed_by_its_prefix() {
        let key = key();
        let a = key.subject("2001:db8:1:2:aaaa::1".parse().unwrap());
        assert_eq!(a, [6, 64, 0x20, 0x01, 0x0d, 0xb8, 0, 1, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(key.subject("2001:db8:1:2:ffff:ffff:ffff:ffff".parse().unwrap()), a);
        assert_ne!(key.subject("2001:db8:1:3::1".parse().unwrap()), a);

        let whole = key.clone().with_ipv6_prefix_len(128).unwrap();
        assert_ne!(
            whole.subject("2001:db8:1:2::1".parse().unwrap()),
            whole.subject("2001:db8:1:2::2".parse().unwrap())
        );
        let odd = key.with_ipv6_prefix_len(57).unwrap();
        // 57 bits: the top bit of the eighth byte stays, the rest of it is cleared.
        assert_eq!(odd.subject("2001:db8:1:2ff::".parse().unwrap())[9], 0x80);
        assert_eq!(odd.subject("2001:db8:1:2ff::".parse().unwrap())[1], 57);
    }

    #[test]
    fn a_prefix_length_outside_1_to_128_is_refused() {
        assert_eq!(key().with_ipv6_prefix_len(0).unwrap_err(), InvalidIpv6PrefixLen { bits: 0 });
        assert_eq!(
            key().with_ipv6_prefix_len(129).unwrap_err().to_string(),
            "an IPv6 prefix length must be 1 to 128 bits, not 129"
        );
        assert_eq!(key().with_ipv6_prefix_len(1).unwrap().ipv6_prefix_len(), 1);
        assert_eq!(format!("{:?}", key()), "PeerAddressKey { ipv6_prefix_len: 64, .. }");
    }
}
