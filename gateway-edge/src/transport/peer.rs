//! Who is connecting: the client's address behind trusted proxies, and
//! whether its browser Origin may open a socket.
//!
//! Behind a load balancer every socket comes from the balancer's address, so
//! per-IP limits (the pre-auth budget, the auth-failure rate) would lump all
//! clients together. With `--trusted-proxies`, a socket whose peer is in one
//! of those CIDRs is attributed to the address named by the one header the
//! proxies set (`--forwarded-header`: `X-Forwarded-For`, or `Forwarded` of
//! RFC 7239): the nearest hop, walking from the right, that is not itself a
//! trusted proxy. Only that header is read: a proxy that appends to
//! `X-Forwarded-For` passes a client's own `Forwarded` through untouched,
//! so preferring whichever is present would let the client pick its
//! address. From any other peer the headers are ignored (anyone can send
//! them). Off by default.
//!
//! Where the edge listens on loopback (or has no authentication), a browser
//! page from anywhere could reach it through DNS rebinding: its name
//! resolves to 127.0.0.1 after the page loaded, and its Origin and Host are
//! then both the attacker's, so the same-origin check passes.
//! [`local_only`] closes that: such an edge answers only requests whose
//! `Host` is a loopback name (or in `--allowed-hosts`), and in auth mode
//! `none` only clients on loopback.

use std::net::{IpAddr, SocketAddr};

use hyper::HeaderMap;

use crate::config::ForwardedHeader;
use crate::config::cidr::{Cidr, canonical};

/// The client's address: `peer`, or when `peer` is a trusted proxy, the
/// nearest untrusted hop that `header` names (the leftmost when every hop
/// is trusted). A hop that does not parse ends the walk there.
pub fn client_ip(
    peer: IpAddr,
    headers: &HeaderMap,
    trusted: &[Cidr],
    header: ForwardedHeader,
) -> IpAddr {
    let is_trusted = |ip: IpAddr| trusted.iter().any(|c| c.contains(ip));
    let peer = canonical(peer);
    if !is_trusted(peer) {
        return peer;
    }
    let hops = match header {
        ForwardedHeader::Forwarded => forwarded_for(headers),
        ForwardedHeader::XForwardedFor => x_forwarded_for(headers),
    };
    let mut client = peer;
    for hop in hops.iter().rev() {
        let Some(ip) = parse_hop(hop) else {
            return client;
        };
        client = ip;
        if !is_trusted(ip) {
            return ip;
        }
    }
    client
}

/// The hops of `Forwarded: for=`, client first, every header line in order.
fn forwarded_for(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all("forwarded")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|element| {
            element.split(';').find_map(|pair| {
                let (name, value) = pair.split_once('=')?;
                name.trim()
                    .eq_ignore_ascii_case("for")
                    .then(|| value.trim().trim_matches('"').to_owned())
            })
        })
        .collect()
}

/// The hops of `X-Forwarded-For`, client first, every header line in order.
fn x_forwarded_for(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|hop| hop.trim().to_owned())
        .filter(|hop| !hop.is_empty())
        .collect()
}

/// `192.0.2.1`, `192.0.2.1:4711`, `2001:db8::1`, `[2001:db8::1]:4711`;
/// `unknown` and obfuscated names are not addresses.
fn parse_hop(hop: &str) -> Option<IpAddr> {
    if let Ok(ip) = hop.parse::<IpAddr>() {
        return Some(canonical(ip));
    }
    if let Ok(address) = hop.parse::<SocketAddr>() {
        return Some(canonical(address.ip()));
    }
    let inner = hop.strip_prefix('[')?.split(']').next()?;
    inner.parse().ok().map(canonical)
}

/// Whether a WebSocket upgrade with this `Origin` may go ahead. No Origin
/// (the CLI, the TUI, services): yes. A browser's Origin: when it is this
/// edge's own origin (its authority equals the `Host` the browser asked
/// for), or listed in `allowed` (`scheme://host[:port]`, or `*` for any).
pub fn origin_allowed(origin: Option<&str>, host: Option<&str>, allowed: &[String]) -> bool {
    let Some(origin) = origin.map(|o| o.trim().trim_end_matches('/')) else {
        return true;
    };
    if allowed
        .iter()
        .any(|a| a == "*" || a.trim_end_matches('/').eq_ignore_ascii_case(origin))
    {
        return true;
    }
    let authority = origin.split_once("://").map(|(_, rest)| rest);
    matches!((authority, host), (Some(a), Some(h)) if a.eq_ignore_ascii_case(h.trim()))
}

/// Whether a `Host` header's value names this machine's loopback:
/// `localhost` (or a name under `.localhost`), an address of 127.0.0.0/8,
/// or `[::1]`, with or without a port.
pub fn is_loopback_host(host: &str) -> bool {
    let name = host_name(host);
    if name.eq_ignore_ascii_case("localhost") || name.to_ascii_lowercase().ends_with(".localhost") {
        return true;
    }
    name.trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
        .is_ok_and(|ip| canonical(ip).is_loopback())
}

/// `host[:port]` → `host` (`[v6]:port` → `[v6]`).
fn host_name(host: &str) -> &str {
    let host = host.trim();
    if host.starts_with('[') {
        return host.split_inclusive(']').next().unwrap_or(host);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// Why [`local_only`] refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotLocal {
    /// Auth mode `none` and a client that is not on loopback.
    Client,
    /// A `Host` that is neither a loopback name nor allowed.
    Host,
}

impl NotLocal {
    pub fn message(self) -> &'static str {
        match self {
            Self::Client => "auth mode none serves loopback clients only\n",
            Self::Host => {
                "Host not allowed: a gateway on a loopback address answers to loopback names \
                 only (add the name to EDGE_ALLOWED_HOSTS)\n"
            }
        }
    }
}

/// The DNS rebinding guard of an edge on loopback (or in auth mode `none`,
/// `no_auth`): the request's `Host` must be a loopback name or one of
/// `allowed_hosts` (names, with or without a port), and with no auth the
/// socket's peer and the client it speaks for must both be on loopback.
pub fn local_only(
    no_auth: bool,
    peer: IpAddr,
    client: IpAddr,
    host: Option<&str>,
    allowed_hosts: &[String],
) -> Result<(), NotLocal> {
    let local = |ip: IpAddr| canonical(ip).is_loopback();
    if no_auth && !(local(peer) && local(client)) {
        return Err(NotLocal::Client);
    }
    let allowed = host.is_some_and(|host| {
        is_loopback_host(host)
            || allowed_hosts.iter().any(|a| {
                a.eq_ignore_ascii_case(host.trim()) || a.eq_ignore_ascii_case(host_name(host))
            })
    });
    if allowed { Ok(()) } else { Err(NotLocal::Host) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                hyper::header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        map
    }

    fn ip(raw: &str) -> IpAddr {
        raw.parse().unwrap()
    }

    const XFF: ForwardedHeader = ForwardedHeader::XForwardedFor;
    const FWD: ForwardedHeader = ForwardedHeader::Forwarded;

    #[test]
    fn networks() {
        let net: Cidr = "10.0.0.0/8".parse().unwrap();
        assert!(net.contains(ip("10.200.1.2")));
        assert!(net.contains(ip("::ffff:10.1.1.1")), "a mapped IPv4 address");
        assert!(!net.contains(ip("11.0.0.1")));
        let v6: Cidr = "fd00::/8".parse().unwrap();
        assert!(v6.contains(ip("fd12::1")) && !v6.contains(ip("fe80::1")));
        assert!("0.0.0.0/0".parse::<Cidr>().unwrap().contains(ip("8.8.8.8")));
        assert!(
            "192.0.2.7"
                .parse::<Cidr>()
                .unwrap()
                .contains(ip("192.0.2.7"))
        );
        for bad in ["10.0.0.0/33", "fd00::/129", "ten", "10.0.0.0/x", ""] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
    }

    #[test]
    fn forwarding_headers_count_only_from_trusted_proxies() {
        let trusted: Vec<Cidr> = vec!["10.0.0.0/8".parse().unwrap()];
        let xff = headers(&[("x-forwarded-for", "203.0.113.9, 10.0.0.7")]);
        // From an untrusted peer the header is anyone's word: ignored.
        assert_eq!(
            client_ip(ip("198.51.100.1"), &xff, &trusted, XFF),
            ip("198.51.100.1")
        );
        // From the balancer: the nearest untrusted hop.
        assert_eq!(
            client_ip(ip("10.0.0.1"), &xff, &trusted, XFF),
            ip("203.0.113.9")
        );
        // A spoofed left part does not move it past a real client.
        let spoofed = headers(&[("x-forwarded-for", "1.2.3.4, 203.0.113.9")]);
        assert_eq!(
            client_ip(ip("10.0.0.1"), &spoofed, &trusted, XFF),
            ip("203.0.113.9")
        );
        // Off by default.
        assert_eq!(client_ip(ip("10.0.0.1"), &xff, &[], XFF), ip("10.0.0.1"));
        // No header: the proxy itself.
        assert_eq!(
            client_ip(ip("10.0.0.1"), &HeaderMap::new(), &trusted, XFF),
            ip("10.0.0.1")
        );
    }

    #[test]
    fn only_the_chosen_header_counts_and_forwarded_has_its_forms() {
        let trusted: Vec<Cidr> = vec!["10.0.0.0/8".parse().unwrap()];
        // A proxy that appends to X-Forwarded-For passed the client's own
        // Forwarded through: it is not read.
        let both = headers(&[
            ("forwarded", "for=192.0.2.99"),
            ("x-forwarded-for", "198.51.100.77"),
        ]);
        assert_eq!(
            client_ip(ip("10.0.0.1"), &both, &trusted, XFF),
            ip("198.51.100.77")
        );
        assert_eq!(
            client_ip(ip("10.0.0.1"), &both, &trusted, FWD),
            ip("192.0.2.99")
        );
        // The other way round: a proxy setting Forwarded ignores a
        // client's X-Forwarded-For.
        let only_xff = headers(&[("x-forwarded-for", "198.51.100.77")]);
        assert_eq!(
            client_ip(ip("10.0.0.1"), &only_xff, &trusted, FWD),
            ip("10.0.0.1")
        );
        let forms = headers(&[(
            "forwarded",
            r#"for="[2001:db8::5]:4711";proto=https, for=10.1.1.1"#,
        )]);
        assert_eq!(
            client_ip(ip("10.0.0.1"), &forms, &trusted, FWD),
            ip("2001:db8::5")
        );
        let port = headers(&[("forwarded", "for=192.0.2.60:8080")]);
        assert_eq!(
            client_ip(ip("10.0.0.1"), &port, &trusted, FWD),
            ip("192.0.2.60")
        );
        // An obfuscated hop ends the walk at the last trusted one.
        let hidden = headers(&[("forwarded", "for=_hidden, for=10.2.2.2")]);
        assert_eq!(
            client_ip(ip("10.0.0.1"), &hidden, &trusted, FWD),
            ip("10.2.2.2")
        );
    }

    #[test]
    fn loopback_hosts_and_the_rebinding_guard() {
        for host in [
            "localhost",
            "LOCALHOST:18789",
            "app.localhost:1",
            "127.0.0.1",
            "127.9.9.9:80",
            "[::1]:18789",
            "[::1]",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:18789",
            "localhost.evil.example",
            "10.0.0.1:80",
            "[2001:db8::1]:1",
            "",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
        let (lo, remote) = (ip("127.0.0.1"), ip("203.0.113.9"));
        let allowed = vec!["gw.internal".to_owned()];
        assert_eq!(local_only(true, lo, lo, Some("localhost:1"), &[]), Ok(()));
        assert_eq!(
            local_only(true, lo, lo, Some("gw.internal:18789"), &allowed),
            Ok(())
        );
        assert_eq!(
            local_only(true, lo, lo, Some("evil.example:18789"), &allowed),
            Err(NotLocal::Host)
        );
        assert_eq!(local_only(true, lo, lo, None, &[]), Err(NotLocal::Host));
        assert_eq!(
            local_only(true, remote, remote, Some("localhost"), &[]),
            Err(NotLocal::Client)
        );
        assert_eq!(
            local_only(true, lo, remote, Some("localhost"), &[]),
            Err(NotLocal::Client),
            "a local proxy's remote client"
        );
        // With auth, a remote peer is the auth's business; the Host still counts.
        assert_eq!(
            local_only(false, remote, remote, Some("localhost"), &[]),
            Ok(())
        );
        assert_eq!(
            local_only(false, lo, lo, Some("evil.example"), &[]),
            Err(NotLocal::Host)
        );
    }

    #[test]
    fn origins() {
        let none: Vec<String> = vec![];
        assert!(
            origin_allowed(None, Some("gw:18789"), &none),
            "no Origin: not a browser"
        );
        assert!(
            origin_allowed(Some("http://gw:18789"), Some("gw:18789"), &none),
            "same origin"
        );
        assert!(!origin_allowed(
            Some("https://evil.example"),
            Some("gw:18789"),
            &none
        ));
        assert!(!origin_allowed(Some("null"), Some("gw:18789"), &none));
        let listed = vec!["https://ui.example.com".to_owned()];
        assert!(origin_allowed(
            Some("https://UI.example.com/"),
            Some("gw"),
            &listed
        ));
        assert!(!origin_allowed(
            Some("https://ui.example.com:8443"),
            Some("gw"),
            &listed
        ));
        assert!(origin_allowed(
            Some("https://any.example"),
            None,
            &["*".to_owned()]
        ));
    }
}
