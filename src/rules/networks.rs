//! The networks above an address, and the grammar of a list of them ([`parse_networks`]).

use std::fmt;
use std::net::IpAddr;
use std::num::NonZeroU32;

use ipnet::IpNet;

/// The most network levels of one family: each costs every scan a few Valkey commands.
pub const MAX_PER_FAMILY: usize = 3;

words! {
    /// An address family.
    #[derive(Hash, PartialOrd, Ord)]
    Family {
        V4 = "v4",
        V6 = "v6",
    }
}

impl Family {
    pub fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => Self::V4,
            IpAddr::V6(_) => Self::V6,
        }
    }
}

/// One network level: a family and a prefix length (`v4/24`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Network {
    pub family: Family,
    pub len: u8,
}

impl Network {
    /// The network of this level that holds `ip` (of the same family).
    pub fn enclosing(self, ip: IpAddr) -> Option<IpNet> {
        (Family::of(ip) == self.family)
            .then(|| IpNet::new(ip, self.len).ok().map(|n| n.trunc()))
            .flatten()
    }
}

impl fmt::Display for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.family, self.len)
    }
}

/// One configured network level and its limit per period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetworkLevel {
    pub network: Network,
    pub limit: NonZeroU32,
}

/// `QUOTA_NETWORKS`: `off`, or comma-separated `v4/<len>=<limit>` and `v6/<len>=<limit>` (limit: a
/// number or `<k>x`, k × `anon`), each once and shorter than the subject; sorted by family,
/// narrowest first.
pub fn parse_networks(
    text: &str,
    anon: NonZeroU32,
    ipv6_prefix: u8,
) -> Result<Vec<NetworkLevel>, String> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("off") {
        return Ok(Vec::new());
    }
    let mut levels: Vec<NetworkLevel> = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let level = parse_level(item, anon, ipv6_prefix)?;
        if levels.iter().any(|l| l.network == level.network) {
            return Err(format!("{} is listed twice", level.network));
        }
        levels.push(level);
    }
    if levels.is_empty() {
        return Err("lists no level (`off` turns levels off)".into());
    }
    for family in [Family::V4, Family::V6] {
        if levels.iter().filter(|l| l.network.family == family).count() > MAX_PER_FAMILY {
            return Err(format!(
                "at most {MAX_PER_FAMILY} levels of {family} (each costs every scan)"
            ));
        }
    }
    // Narrowest first: the order `quota.level` ties are broken in.
    levels.sort_by_key(|l| (l.network.family, std::cmp::Reverse(l.network.len)));
    Ok(levels)
}

fn parse_level(item: &str, anon: NonZeroU32, ipv6_prefix: u8) -> Result<NetworkLevel, String> {
    let (network, limit) = item
        .split_once('=')
        .ok_or_else(|| format!("{item:?} is not `v4/<len>=<limit>` or `v6/<len>=<limit>`"))?;
    let (family, len) = network
        .trim()
        .split_once('/')
        .ok_or_else(|| format!("{network:?} is not `v4/<len>` or `v6/<len>`"))?;
    let (family, subject_len) = match family.trim() {
        "v4" => (Family::V4, 32),
        "v6" => (Family::V6, ipv6_prefix),
        other => return Err(format!("{other:?} is not an address family (v4 or v6)")),
    };
    let len: u8 = len
        .trim()
        .parse()
        .map_err(|_| format!("{network:?}: {len:?} is not a prefix length"))?;
    if len == 0 || len >= subject_len {
        return Err(format!(
            "{network:?} must be shorter than the subject's /{subject_len} and at least /1"
        ));
    }
    Ok(NetworkLevel {
        network: Network { family, len },
        limit: parse_limit(limit.trim(), anon).map_err(|why| format!("{network}: {why}"))?,
    })
}

fn parse_limit(text: &str, anon: NonZeroU32) -> Result<NonZeroU32, String> {
    let (number, factor) = match text.strip_suffix(['x', 'X']) {
        Some(k) => (k, anon),
        None => (text, NonZeroU32::MIN),
    };
    let n: NonZeroU32 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a limit (a whole number ≥ 1, or `<k>x`)"))?;
    n.checked_mul(factor)
        .ok_or_else(|| format!("{text:?} × {anon} is too large"))
}

/// A limit, in tests.
#[cfg(test)]
pub(crate) fn n(k: u32) -> NonZeroU32 {
    NonZeroU32::new(k).unwrap()
}

/// A network level of `family` and prefix `len`, in tests.
#[cfg(test)]
pub(crate) fn v(family: Family, len: u8) -> Network {
    Network { family, len }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default, and every way a level can be written wrong.
    #[test]
    fn grammar() {
        let levels = parse_networks("v4/24=8x,v6/56=2x,v6/48=8x", n(33), 64).unwrap();
        assert_eq!(
            levels,
            [
                NetworkLevel {
                    network: v(Family::V4, 24),
                    limit: n(264)
                },
                NetworkLevel {
                    network: v(Family::V6, 56),
                    limit: n(66)
                },
                NetworkLevel {
                    network: v(Family::V6, 48),
                    limit: n(264)
                },
            ]
        );
        assert_eq!(parse_networks(" OFF ", n(33), 64).unwrap(), []);
        assert_eq!(
            parse_networks("v6/40=1000, v6/48=7", n(33), 64).unwrap()[0].network,
            v(Family::V6, 48)
        );
        for (bad, why) in [
            ("v4/24", "is not `v4/<len>=<limit>`"),
            ("v4=3", "is not `v4/<len>`"),
            ("v5/24=3", "not an address family"),
            ("v4/x=3", "not a prefix length"),
            ("v4/32=3", "shorter than the subject's /32"),
            ("v6/64=3", "shorter than the subject's /64"),
            ("v4/0=3", "at least /1"),
            ("v4/24=0", "not a limit"),
            ("v4/24=lots", "not a limit"),
            ("v4/24=-1", "not a limit"),
            ("v4/24=3,v4/24=4", "listed twice"),
            ("v4/24=4294967295x", "too large"),
            ("v4/8=1,v4/16=1,v4/24=1,v4/28=1", "at most 3 levels of v4"),
            (",", "lists no level"),
        ] {
            let e = parse_networks(bad, n(33), 64).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
        // The subject's IPv6 prefix bounds the levels.
        assert!(parse_networks("v6/56=1", n(33), 56).is_err());
        assert!(parse_networks("v6/56=1", n(33), 60).is_ok());
    }
}
