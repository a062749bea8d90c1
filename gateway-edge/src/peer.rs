//! Who is connecting: the client's address behind trusted proxies, and
//! whether its browser Origin may open a socket.
//!
//! Behind a load balancer every socket comes from the balancer's address, so
//! per-IP limits (the pre-auth budget, the auth-failure rate) would lump all
//! clients together. With `--trusted-proxies`, a socket whose peer is in one
//! of those CIDRs is attributed to the address its `Forwarded` (RFC 7239) or
//! `X-Forwarded-For` header names: the nearest hop that is not itself a
//! trusted proxy. From any other peer the headers are ignored (anyone can
//! send them). Off by default.

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use hyper::HeaderMap;

/// An IP network, `10.0.0.0/8` or `fd00::/8` (a bare address is a /32 or
/// /128).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(raw: &str) -> Result<Self, String> {
        let raw = raw.trim();
        let (address, prefix) = match raw.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (raw, None),
        };
        let network: IpAddr = address
            .parse()
            .map_err(|_| format!("{raw:?} is not an IP network (like 10.0.0.0/8)"))?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("{raw:?}: the prefix length must be 0..={max}"))?,
        };
        Ok(Self { network, prefix })
    }
}

impl Cidr {
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        match (self.network, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => prefix_matches(
                u128::from(u32::from(net)) << 96,
                u128::from(u32::from(ip)) << 96,
                self.prefix,
            ),
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                prefix_matches(u128::from(net), u128::from(ip), self.prefix)
            }
            _ => false,
        }
    }
}

fn prefix_matches(network: u128, ip: u128, prefix: u8) -> bool {
    let mask = match prefix {
        0 => 0,
        p => u128::MAX << (128 - u32::from(p)),
    };
    network & mask == ip & mask
}

/// An IPv4-mapped IPv6 address (`::ffff:10.1.2.3`, what a dual-stack
/// listener reports) is the IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The client's address: `peer`, or when `peer` is a trusted proxy, the
/// nearest untrusted hop its forwarding headers name (the leftmost when
/// every hop is trusted). A hop that does not parse ends the walk there.
pub fn client_ip(peer: IpAddr, headers: &HeaderMap, trusted: &[Cidr]) -> IpAddr {
    let is_trusted = |ip: IpAddr| trusted.iter().any(|c| c.contains(ip));
    let peer = canonical(peer);
    if !is_trusted(peer) {
        return peer;
    }
    let mut client = peer;
    for hop in forwarded_hops(headers).iter().rev() {
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

/// The hops a request passed, client first: `Forwarded: for=` when present,
/// else `X-Forwarded-For`, every header line in order.
fn forwarded_hops(headers: &HeaderMap) -> Vec<String> {
    let forwarded: Vec<String> = headers
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
        .collect();
    if !forwarded.is_empty() {
        return forwarded;
    }
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
            client_ip(ip("198.51.100.1"), &xff, &trusted),
            ip("198.51.100.1")
        );
        // From the balancer: the nearest untrusted hop.
        assert_eq!(client_ip(ip("10.0.0.1"), &xff, &trusted), ip("203.0.113.9"));
        // A spoofed left part does not move it past a real client.
        let spoofed = headers(&[("x-forwarded-for", "1.2.3.4, 203.0.113.9")]);
        assert_eq!(
            client_ip(ip("10.0.0.1"), &spoofed, &trusted),
            ip("203.0.113.9")
        );
        // Off by default.
        assert_eq!(client_ip(ip("10.0.0.1"), &xff, &[]), ip("10.0.0.1"));
        // No header: the proxy itself.
        assert_eq!(
            client_ip(ip("10.0.0.1"), &HeaderMap::new(), &trusted),
            ip("10.0.0.1")
        );
    }

    #[test]
    fn forwarded_takes_precedence_and_handles_its_forms() {
        let trusted: Vec<Cidr> = vec!["10.0.0.0/8".parse().unwrap()];
        let both = headers(&[
            (
                "forwarded",
                r#"for="[2001:db8::5]:4711";proto=https, for=10.1.1.1"#,
            ),
            ("x-forwarded-for", "198.51.100.77"),
        ]);
        assert_eq!(
            client_ip(ip("10.0.0.1"), &both, &trusted),
            ip("2001:db8::5")
        );
        let port = headers(&[("forwarded", "for=192.0.2.60:8080")]);
        assert_eq!(client_ip(ip("10.0.0.1"), &port, &trusted), ip("192.0.2.60"));
        // An obfuscated hop ends the walk at the last trusted one.
        let hidden = headers(&[("forwarded", "for=_hidden, for=10.2.2.2")]);
        assert_eq!(client_ip(ip("10.0.0.1"), &hidden, &trusted), ip("10.2.2.2"));
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
