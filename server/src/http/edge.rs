//! The edge every request crosses first: which client sent it (the TCP peer,
//! or what a trusted proxy forwarded), whether it was addressed to a host this
//! server answers for, and the security headers on every answer.
//!
//! The host check defeats DNS rebinding: a page on `rebind.attacker.example`
//! whose name is made to resolve to this server sends `Host:
//! rebind.attacker.example`, and its `Origin` matches that host, so an Origin
//! check alone passes. A request is served only when its `Host` is an IP
//! address (a rebinding page always uses a name), `localhost`, or one of the
//! configured public hosts.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use holdfast_app::server::csp::content_security_policy;
use holdfast_app::server::guard::{ClientIp, CookiePolicy};

/// The edge's settings: public names, trusted proxies, cookies and the
/// connection limits the listener applies.
#[derive(Debug, Clone)]
pub struct EdgeConfig {
    /// Host names (without port) this server answers for besides IP addresses
    /// and `localhost`, lower case.
    pub public_hosts: Vec<String>,
    /// Peers whose `X-Forwarded-For` / `Forwarded` is believed.
    pub trusted_proxies: Vec<Cidr>,
    /// How the session cookie is set.
    pub cookies: CookiePolicy,
    /// Longest wait for a request's headers, from the moment a connection is
    /// open or idle between requests (slow-header clients and idle keep-alive
    /// connections are closed after it).
    pub header_read_timeout: Duration,
    /// Longest time from a request's headers to its answer's headers: the
    /// body must arrive, and the handler answer, within it (a body dripped a
    /// byte at a time cannot hold a connection longer).
    pub request_timeout: Duration,
    /// Most connections open at once, WebSockets included; further clients
    /// wait in the kernel's accept queue until one closes.
    pub max_connections: usize,
    /// Most WebSockets open at once, of those connections; `None`: nine in
    /// ten of them ([`socket_share`]).
    pub max_sockets: Option<usize>,
    /// Most connections open at once from one client address (trusted
    /// proxies exempt); more are closed at once.
    pub max_connections_per_address: usize,
    /// Largest API request body, in bytes (413 above).
    pub api_max_body: usize,
    /// Every API and webhook request is answered within it (503 after).
    pub api_deadline: super::deadline::Deadline,
    /// Longest a write to a client may wait (the client stopped reading)
    /// before its connection is closed.
    pub write_timeout: Duration,
}

/// Default for [`EdgeConfig::header_read_timeout`].
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default for [`EdgeConfig::request_timeout`].
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// Default for [`EdgeConfig::max_connections`] (lowered at start-up to what
/// the process's open-file limit allows).
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
/// Default for [`EdgeConfig::write_timeout`].
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Default for [`EdgeConfig::max_connections_per_address`].
pub const DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: usize = 256;

impl Default for EdgeConfig {
    fn default() -> Self {
        Self {
            public_hosts: Vec::new(),
            trusted_proxies: Vec::new(),
            cookies: CookiePolicy::default(),
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_sockets: None,
            max_connections_per_address: DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
            api_max_body: crate::api::DEFAULT_BODY_LIMIT,
            api_deadline: super::deadline::DEFAULT_DEADLINE,
            write_timeout: DEFAULT_WRITE_TIMEOUT,
        }
    }
}

impl EdgeConfig {
    /// Whether `host` (a `Host` header: name or address, maybe with a port)
    /// names this server. Anything that is not a well-formed `name[:port]`,
    /// `a.b.c.d[:port]` or `[v6][:port]` is refused.
    pub fn host_allowed(&self, host: &str) -> bool {
        let Some(name) = host_name(host) else {
            return false;
        };
        let name = name.to_ascii_lowercase();
        let bare = name.trim_start_matches('[').trim_end_matches(']');
        bare.parse::<IpAddr>().is_ok() || name == "localhost" || self.public_hosts.contains(&name)
    }

    /// The client behind a request from `peer`: `peer` itself unless it is a
    /// trusted proxy, in which case the forwarded chain is walked from the
    /// nearest hop back to the first address no trusted proxy vouches for.
    ///
    /// Only `X-Forwarded-For` is read, the header proxies append to: a
    /// `Forwarded` header would pass through such a proxy untouched, so a
    /// client could name any address in it.
    pub fn client_ip(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        if !self.trusts(peer) {
            return peer;
        }
        let chain = forwarded_chain(headers);
        let mut client = peer;
        for hop in chain.iter().rev() {
            client = *hop;
            if !self.trusts(*hop) {
                break;
            }
        }
        client
    }

    /// Whether `ip` is a trusted proxy.
    pub fn trusts(&self, ip: IpAddr) -> bool {
        self.trusted_proxies.iter().any(|c| c.contains(ip))
    }
}

/// The policy of every answer that is not a page with its own nonce: the same
/// text each time, so made once.
static POLICY: std::sync::LazyLock<Option<HeaderValue>> =
    std::sync::LazyLock::new(|| HeaderValue::from_str(&content_security_policy(None)).ok());

/// The name or address of a `Host` value without its port, if the value is
/// well formed: `name[:port]` (letters, digits, `-` and `.`), or `[v6][:port]`.
fn host_name(host: &str) -> Option<&str> {
    let port_ok = |p: &str| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit());
    if let Some(rest) = host.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        inside.parse::<std::net::Ipv6Addr>().ok()?;
        if !(after.is_empty() || after.strip_prefix(':').is_some_and(port_ok)) {
            return None;
        }
        return Some(&host[..inside.len() + 2]);
    }
    let name = match host.split_once(':') {
        Some((name, port)) if port_ok(port) => name,
        Some(_) => return None,
        None => host,
    };
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    ok.then_some(name)
}

/// The key every per-client limit uses for `ip`: the address itself, except
/// that an IPv6 client counts as its /64 (one subscriber holds a whole /64,
/// so per-address limits would otherwise not limit it).
pub fn limit_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) if v6.to_ipv4_mapped().is_none() => {
            let s = v6.segments();
            IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
        other => other,
    }
}

/// The client addresses `X-Forwarded-For` says a request passed through,
/// first (the original client) to last. Entries that are not addresses
/// (`unknown`, obfuscated names) end the chain there, as an untrusted hop would.
fn forwarded_chain(headers: &HeaderMap) -> Vec<IpAddr> {
    let mut chain = Vec::new();
    let entries = headers
        .get_all(header::HeaderName::from_static("x-forwarded-for"))
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim);
    for entry in entries {
        match entry.parse::<IpAddr>() {
            Ok(ip) => chain.push(ip),
            // An unreadable hop: nothing before it can be believed.
            Err(_) => chain.clear(),
        }
    }
    chain
}

/// A connection's place under the connection caps, held by the connection and
/// by a WebSocket it is upgraded to: the place is free once both are done.
#[derive(Clone)]
pub struct ConnectionSlot {
    /// What the connection holds while it is open (its places under the caps).
    pub held: Arc<dyn Send + Sync>,
    /// The places WebSockets may hold: [`socket_share`] of the connection cap.
    pub sockets: Arc<tokio::sync::Semaphore>,
}

/// How many of `max_connections` places WebSockets (badges, dashboards) may
/// hold at once: `max_sockets` when set (at most every place), else nine in
/// ten. Sockets stay open for hours and cost their holder almost nothing to
/// keep, so without a share of their own, enough of them (answering pings,
/// from a few hundred addresses) would take every place, and checkout's
/// requests would wait to be accepted.
pub fn socket_share(max_connections: usize, max_sockets: Option<usize>) -> usize {
    max_sockets.map_or(max_connections - max_connections / 10, |n| {
        n.min(max_connections)
    })
}

/// A WebSocket's place under [`socket_share`], given back when dropped.
pub struct SocketPlace {
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl SocketPlace {
    /// The answer when WebSockets hold their whole share: 503, retry shortly
    /// (a badge falls back to polling meanwhile).
    pub fn refused() -> Response {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "10")],
            "live connections are at their share of the server's connections; retry shortly",
        )
            .into_response()
    }
}

/// What the edge recorded about a request's connection: the client's address
/// (for per-client limits) and its place under the caps (for a WebSocket to
/// keep).
pub struct Connection {
    /// The client's address, as every per-client limit keys it.
    pub client: Option<IpAddr>,
    /// The connection's place under the caps.
    pub slot: Option<ConnectionSlot>,
}

impl Connection {
    /// The client address as a limiter key (empty when unknown).
    pub fn key(&self) -> String {
        self.client.map(|c| c.to_string()).unwrap_or_default()
    }

    /// A place for this connection to become a WebSocket; `None` when
    /// WebSockets hold their whole share ([`socket_share`]). A connection
    /// not served by [`crate::startup::serve`] is under no cap.
    pub fn socket_place(&self) -> Option<SocketPlace> {
        match &self.slot {
            Some(slot) => slot
                .sockets
                .clone()
                .try_acquire_owned()
                .ok()
                .map(|p| SocketPlace { _permit: Some(p) }),
            None => Some(SocketPlace { _permit: None }),
        }
    }
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Connection {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(Self {
            client: parts.extensions.get::<ClientIp>().map(|c| c.0),
            slot: parts.extensions.get::<ConnectionSlot>().cloned(),
        })
    }
}

/// An address range, `10.0.0.0/8` or `::1/128` (a bare address is a /32 or /128).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Parses `addr[/prefix]`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let network: IpAddr = addr
            .parse()
            .map_err(|_| format!("{s:?} is not an address or address/prefix"))?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("{s:?}: the prefix must be 0 to {max}"))?,
            None => max,
        };
        Ok(Self { network, prefix })
    }

    /// Whether `ip` is inside the range.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let bits = |ip: IpAddr| -> (u128, u8) {
            match ip {
                IpAddr::V4(v4) => (u128::from(u32::from(v4)), 32),
                IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                    Some(v4) => (u128::from(u32::from(v4)), 32),
                    None => (u128::from(v6), 128),
                },
            }
        };
        let (net, width) = bits(self.network);
        let (addr, addr_width) = bits(ip);
        if width != addr_width {
            return false;
        }
        let host_bits = u32::from(width - self.prefix.min(width));
        let mask = if host_bits >= 128 {
            0
        } else {
            (u128::MAX << host_bits) & (u128::MAX >> (128 - u32::from(width)))
        };
        net & mask == addr & mask
    }
}

/// Middleware: refuses a request for a host this server does not answer for
/// (421), records the client's address ([`ClientIp`]) for every per-client
/// limit, and adds the security headers to the answer.
pub async fn edge(
    State(edge): State<Arc<EdgeConfig>>,
    mut request: Request,
    next: Next,
) -> Response {
    let mut hosts = request
        .headers()
        .get_all(header::HOST)
        .iter()
        .map(|h| h.to_str().unwrap_or(""));
    let host = hosts.next();
    let authority = request.uri().authority().map(|a| a.as_str());
    // One Host, and an absolute-form target's authority too, must name us.
    let addressed_here = match (host, hosts.next(), authority) {
        (Some(_), Some(_), _) => false,
        (Some(host), None, Some(a)) => edge.host_allowed(host) && edge.host_allowed(a),
        (Some(host), None, None) => edge.host_allowed(host),
        (None, _, Some(a)) => edge.host_allowed(a),
        (None, _, None) => false,
    };
    let mut response = if addressed_here {
        let peer = request
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0.ip());
        if let Some(peer) = peer {
            let client = edge.client_ip(peer, request.headers());
            request.extensions_mut().insert(ClientIp(limit_key(client)));
        }
        match tokio::time::timeout(edge.request_timeout, next.run(request)).await {
            Ok(response) => response,
            Err(_) => (
                StatusCode::REQUEST_TIMEOUT,
                "the request took too long to arrive or to answer",
            )
                .into_response(),
        }
    } else {
        (
            StatusCode::MISDIRECTED_REQUEST,
            "this server does not answer for that host name; an operator can add it with --public-host",
        )
            .into_response()
    };
    let h = response.headers_mut();
    // A page set its own, with its nonce; every other answer gets the policy
    // without one.
    if !h.contains_key(header::CONTENT_SECURITY_POLICY)
        && let Some(policy) = &*POLICY
    {
        h.insert(header::CONTENT_SECURITY_POLICY, policy.clone());
    }
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("strict-origin-when-cross-origin"),
    );
    if edge.cookies.secure {
        h.insert(
            header::STRICT_TRANSPORT_SECURITY,
            HeaderValue::from_static("max-age=31536000"),
        );
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn websockets_leave_requests_a_tenth_unless_told_otherwise() {
        assert_eq!(socket_share(10_000, None), 9_000);
        assert_eq!(socket_share(10, None), 9);
        assert_eq!(socket_share(10, Some(3)), 3);
        assert_eq!(socket_share(10, Some(20)), 10, "never past every place");
    }

    fn edge(hosts: &[&str], proxies: &[&str]) -> EdgeConfig {
        EdgeConfig {
            public_hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
            trusted_proxies: proxies.iter().map(|p| Cidr::parse(p).unwrap()).collect(),
            ..EdgeConfig::default()
        }
    }

    #[test]
    fn names_must_be_listed_addresses_need_not() {
        let e = edge(&["shop.example"], &[]);
        for ok in [
            "127.0.0.1:3000",
            "10.1.2.3",
            "[::1]:3000",
            "localhost:3000",
            "LOCALHOST",
            "shop.example",
            "Shop.Example:443",
        ] {
            assert!(e.host_allowed(ok), "{ok}");
        }
        for refused in [
            "rebind.attacker.example:3000",
            "shop.example.attacker.example",
            "localhost.attacker.example",
            "",
            ":3000",
            "[::1]evil.example",
            "[127.0.0.1]x",
            "127.0.0.1]",
            "localhost.:3000:1",
            "local host",
            "shop.example:99999999",
        ] {
            assert!(!e.host_allowed(refused), "{refused}");
        }
    }

    #[test]
    fn ipv6_clients_are_limited_per_64() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::9".parse().unwrap();
        assert_eq!(limit_key(a), limit_key(b));
        assert_ne!(limit_key(a), limit_key("2001:db8:1:3::1".parse().unwrap()));
        let v4: IpAddr = "203.0.113.9".parse().unwrap();
        assert_eq!(limit_key(v4), v4);
    }

    #[test]
    fn ranges_contain_what_they_should() {
        let c = Cidr::parse("10.0.0.0/8").unwrap();
        assert!(c.contains("10.200.1.1".parse().unwrap()));
        assert!(!c.contains("11.0.0.1".parse().unwrap()));
        assert!(c.contains("::ffff:10.0.0.9".parse().unwrap()));
        assert!(!c.contains("::1".parse().unwrap()));
        let one = Cidr::parse("::1").unwrap();
        assert!(one.contains("::1".parse().unwrap()));
        assert!(!one.contains("::2".parse().unwrap()));
        assert!(
            Cidr::parse("0.0.0.0/0")
                .unwrap()
                .contains("8.8.8.8".parse().unwrap())
        );
        assert!(Cidr::parse("10.0.0.0/33").is_err());
        assert!(Cidr::parse("ten/8").is_err());
    }

    #[test]
    fn forwarded_addresses_count_only_from_trusted_proxies() {
        let peer: IpAddr = "10.0.0.5".parse().unwrap();
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", "203.0.113.7, 10.0.0.4".parse().unwrap());
        // Not trusted: the peer is the client, whatever it claims.
        assert_eq!(edge(&[], &[]).client_ip(peer, &h), peer);
        // Trusted: the first hop no trusted proxy vouches for.
        let trusted = edge(&[], &["10.0.0.0/8"]);
        assert_eq!(
            trusted.client_ip(peer, &h),
            "203.0.113.7".parse::<IpAddr>().unwrap()
        );
        // A client cannot skip the line by prepending an address: the rightmost
        // untrusted hop is the one the proxy saw.
        h.insert(
            "x-forwarded-for",
            "1.1.1.1, 198.51.100.2, 10.0.0.4".parse().unwrap(),
        );
        assert_eq!(
            trusted.client_ip(peer, &h),
            "198.51.100.2".parse::<IpAddr>().unwrap()
        );
        // `Forwarded` is not believed: a proxy that appends X-Forwarded-For
        // passes a client's own `Forwarded` through untouched.
        let mut f = HeaderMap::new();
        f.insert("forwarded", "for=198.51.100.77".parse().unwrap());
        f.insert("x-forwarded-for", "203.0.113.8".parse().unwrap());
        assert_eq!(
            trusted.client_ip(peer, &f),
            "203.0.113.8".parse::<IpAddr>().unwrap()
        );
        // Garbage in the chain ends belief at the last readable hop.
        h.insert("x-forwarded-for", "203.0.113.7, garbage".parse().unwrap());
        assert_eq!(trusted.client_ip(peer, &h), peer);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 2_000, ..Default::default() })]

        #[test]
        fn hostile_headers_never_panic_and_never_invent_a_client(
            host in "\\PC{0,60}",
            xff in "[ -~]{0,120}",
            forwarded in "[ -~]{0,120}",
            cidr in "[ -~]{0,45}",
        ) {
            let e = edge(&["shop.example"], &["127.0.0.0/8"]);
            let _ = e.host_allowed(&host);
            let _ = Cidr::parse(&cidr);
            let mut h = HeaderMap::new();
            if let Ok(v) = xff.parse() {
                h.insert("x-forwarded-for", v);
            }
            if let Ok(v) = forwarded.parse() {
                h.append("x-forwarded-for", v);
            }
            let peer: IpAddr = "127.0.0.1".parse().unwrap();
            let client = e.client_ip(peer, &h);
            proptest::prop_assert!(client == peer || forwarded_chain(&h).contains(&client));
            let stranger: IpAddr = "198.51.100.1".parse().unwrap();
            proptest::prop_assert_eq!(e.client_ip(stranger, &h), stranger);
        }
    }
}
