//! The anonymous subject: the caller's source IP from the platform (a client header only via a
//! trusted proxy), normalised so a host cannot rotate addresses: an IPv6 host owns a /64.

use std::net::{IpAddr, Ipv6Addr};

use http::HeaderMap;
use ipnet::{IpNet, Ipv6Net};

/// Parses a platform-given source address, tolerating a `/32` or `/128` suffix.
pub fn parse_source(raw: &str) -> Option<IpAddr> {
    let raw = raw.trim();
    let addr = match raw.split_once('/') {
        Some((addr, "32" | "128")) => addr,
        Some(_) => return None,
        None => raw,
    };
    let addr = addr.trim_start_matches('[').trim_end_matches(']');
    addr.parse::<IpAddr>().ok().map(|ip| ip.to_canonical())
}

/// The address a request is counted under, and whether it is the client's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientIp {
    pub addr: IpAddr,
    /// A trusted proxy's own address, standing in for a client its `X-Forwarded-For` did not name
    /// usably: counted on the proxy-fallback counter and never exempt (a proxy is never a client).
    pub proxy_fallback: bool,
}

/// The client address: the peer, or behind a trusted proxy the right-most `X-Forwarded-For` entry
/// not itself trusted (else the proxy's own address).
pub fn client_ip(peer: IpAddr, headers: &HeaderMap, trusted: &[IpNet]) -> ClientIp {
    let peer = peer.to_canonical();
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|net| net.contains(ip));
    if !is_trusted(&peer) {
        return ClientIp {
            addr: peer,
            proxy_fallback: false,
        };
    }
    let values = headers.get_all("x-forwarded-for");
    let forwarded = values.iter().filter_map(|v| v.to_str().ok());
    let client = forwarded
        .flat_map(|v| v.split(','))
        .rev()
        .map(parse_source)
        .take_while(Option::is_some)
        .flatten()
        .find(|ip| !is_trusted(ip));
    ClientIp {
        addr: client.unwrap_or(peer),
        proxy_fallback: client.is_none(),
    }
}

/// The exempt networks that overlap a trusted proxy network, as `(exempt, trusted)` pairs.
pub fn exempt_covering_proxies(exempt: &[IpNet], trusted: &[IpNet]) -> Vec<(IpNet, IpNet)> {
    let overlap = |a: &IpNet, b: &IpNet| a.contains(&b.network()) || b.contains(&a.network());
    exempt
        .iter()
        .flat_map(|e| trusted.iter().filter(|t| overlap(e, t)).map(|t| (*e, *t)))
        .collect()
}

/// The counting material for an address: IPv4 as is, IPv6 as its prefix.
pub fn material(ip: IpAddr, ipv6_prefix: u8) -> String {
    match ip.to_canonical() {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => {
            let net = Ipv6Net::new(v6, ipv6_prefix).map_or_else(
                |_| Ipv6Net::new(Ipv6Addr::UNSPECIFIED, 0).expect("0 is a valid prefix"),
                |n| n.trunc(),
            );
            net.to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    /// Suffixes are stripped, mapped IPv6 becomes IPv4, other prefixes are refused.
    #[test]
    fn parsing() {
        for (raw, parsed) in [
            ("203.0.113.7/32", Some("203.0.113.7")),
            ("2001:db8::1/128", Some("2001:db8::1")),
            ("::ffff:203.0.113.7", Some("203.0.113.7")),
            ("[2001:db8::1]", Some("2001:db8::1")),
            ("203.0.113.0/24", None),
            ("not an ip", None),
            ("", None),
        ] {
            let parsed: Option<IpAddr> = parsed.map(|p| p.parse().unwrap());
            assert_eq!(parse_source(raw), parsed, "{raw:?}");
        }
    }

    /// Two addresses in one /64 share material; another /64 does not.
    #[test]
    fn ipv6_prefix() {
        let a = material("2001:db8:abcd:12:1:2:3:4".parse().unwrap(), 64);
        let b = material("2001:db8:abcd:12:ffff::9".parse().unwrap(), 64);
        let c = material("2001:db8:abcd:13::1".parse().unwrap(), 64);
        assert_eq!(a, "2001:db8:abcd:12::/64");
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(material("203.0.113.7".parse().unwrap(), 64), "203.0.113.7");
        assert_eq!(
            material("::ffff:203.0.113.7".parse().unwrap(), 64),
            "203.0.113.7"
        );
    }

    fn xff(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_str(value).unwrap());
        h
    }

    /// X-Forwarded-For is ignored unless the peer is trusted.
    #[test]
    fn forwarded_only_from_trusted_peers() {
        let peer: IpAddr = "203.0.113.7".parse().unwrap();
        let direct = client_ip(peer, &xff("198.51.100.1"), &[]);
        assert_eq!((direct.addr, direct.proxy_fallback), (peer, false));

        let proxy: IpAddr = "10.0.0.5".parse().unwrap();
        let trusted: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        // The client may prepend anything; only the entry the proxy appended counts.
        let h = xff("1.2.3.4, 198.51.100.1, 10.0.0.9");
        let client = client_ip(proxy, &h, &trusted);
        assert_eq!(client.addr, "198.51.100.1".parse::<IpAddr>().unwrap());
        assert!(!client.proxy_fallback);
        // Nothing usable where the proxy's entry should be: the proxy's own
        // address, marked as the fallback.
        for unusable in ["nonsense", "198.51.100.1:443", "198.51.100.1,", "10.0.0.9"] {
            let c = client_ip(proxy, &xff(unusable), &trusted);
            assert_eq!((c.addr, c.proxy_fallback), (proxy, true), "{unusable:?}");
        }
        let none = client_ip(proxy, &HeaderMap::new(), &trusted);
        assert_eq!((none.addr, none.proxy_fallback), (proxy, true));
    }

    /// An exempt network that contains, or lies in, a trusted one is found.
    #[test]
    fn exempt_networks_over_proxies() {
        let nets = |v: &[&str]| v.iter().map(|n| n.parse().unwrap()).collect::<Vec<IpNet>>();
        let trusted = nets(&["10.0.0.0/24", "192.0.2.1/32"]);
        let found = exempt_covering_proxies(&nets(&["10.0.0.0/8", "198.51.100.0/24"]), &trusted);
        assert_eq!(found, [(nets(&["10.0.0.0/8"])[0], trusted[0])]);
        let inside = exempt_covering_proxies(&nets(&["10.0.0.128/25"]), &trusted);
        assert_eq!(inside.len(), 1);
        assert!(exempt_covering_proxies(&nets(&["203.0.113.0/24"]), &trusted).is_empty());
    }
}
