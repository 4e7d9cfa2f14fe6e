//! Budgets above the subject, as pure rules: the networks that enclose an
//! anonymous address (`QUOTA_NETWORKS`) and all anonymous traffic together
//! (`QUOTA_ANON_GLOBAL`), each counted and paced like one client.
//!
//! A per-address quota is only as strong as the cheapest block of
//! addresses: one IPv6 /48 holds 65,536 /64s, each with its own quota. So an
//! anonymous scan is also counted at each configured level: its /24 (IPv4),
//! its /56 and /48 (IPv6), and, when set, the anonymous budget. Each level
//! has the subject's tier rule with its own limit (the anonymous budget has
//! only its interval), its own pacing slot and the backlog cap; the scan
//! gets the most severe tier of all of them ([`most_severe`]). Token holders
//! and exempt scans are never counted at a level.
//!
//! Here: the grammar of `QUOTA_NETWORKS` ([`parse_networks`]), the levels of
//! one address ([`Levels::of`], with the material each level's digest is
//! made from: family, prefix and length, never the address) and the rule
//! that picks the scan's decision. No I/O, no clock.

use std::fmt;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use ipnet::IpNet;

use crate::rules::count::{Count, Lane};
use crate::rules::decide::{Decision, Limits, decide};
use crate::rules::key::QuotaKey;
use crate::rules::unix::{UnixSecs, duration_ms};

/// The most network levels of one family (`QUOTA_NETWORKS`): each costs
/// every anonymous scan a few Valkey commands.
pub const MAX_PER_FAMILY: usize = 3;

/// An address family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => Self::V4,
            IpAddr::V6(_) => Self::V6,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::V4 => "v4",
            Self::V6 => "v6",
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
        write!(f, "{}/{}", self.family.as_str(), self.len)
    }
}

/// Which counter set a scan's delay, as clients and metrics name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LevelName {
    /// The subject itself: its address (or /64) or its token.
    Subject,
    Network(Network),
    /// All anonymous traffic together.
    Anon,
}

impl LevelName {
    /// `subject`, `v4/24`, `anon`, … (`quota.level`).
    pub fn label(self) -> String {
        self.to_string()
    }
}

/// The label (`subject`, `v4/24`, `anon`), written without a `String`.
impl fmt::Display for LevelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Subject => f.write_str("subject"),
            Self::Network(n) => n.fmt(f),
            Self::Anon => f.write_str("anon"),
        }
    }
}

/// A level's name in `RateLimit-Policy` (`daily`, `v4-24`, `anon`), written
/// without a `String`.
#[derive(Debug, Clone, Copy)]
pub struct PolicyName(pub LevelName);

impl fmt::Display for PolicyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            LevelName::Subject => f.write_str("daily"),
            LevelName::Network(n) => write!(f, "{}-{}", n.family.as_str(), n.len),
            LevelName::Anon => f.write_str("anon"),
        }
    }
}

/// The material of the anonymous budget's digest: one counter for all.
pub const ANON_MATERIAL: &str = "anon";

/// One configured network level and its limit per period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetworkLevel {
    pub network: Network,
    pub limit: NonZeroU32,
}

/// The budget of all anonymous traffic together (`QUOTA_ANON_GLOBAL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnonBudget {
    pub limit: NonZeroU32,
    /// Beyond the budget, anonymous scans start at most one per interval.
    pub interval: Duration,
}

/// Every level above the subject, as configured.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Levels {
    /// Widest last within a family, as `QUOTA_NETWORKS` lists them sorted.
    pub networks: Vec<NetworkLevel>,
    pub anon: Option<AnonBudget>,
}

/// One level of one address: its name, the material its digest is made of
/// (`v4/24:203.0.113.0`, `anon`: never the address itself), and its limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LevelOf {
    pub name: LevelName,
    pub material: String,
    pub limit: NonZeroU32,
}

/// One level above a subject, end to end: its name, its counter's keys,
/// the limits it is decided on, and what this scan's count did there. A
/// scan carries one per level it is counted at, in the order the store is
/// asked (the subject's identity makes them; the count fills in `lane`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Level {
    pub name: LevelName,
    pub key: QuotaKey,
    /// The level's tier rule with its own limit (before any grant).
    pub limits: Limits,
    /// What the count answered here: `None` before the count, and for a
    /// scan resumed from an earlier attempt, which counts at no level again.
    pub lane: Option<Lane>,
}

impl Level {
    /// A level not counted yet.
    pub fn new(name: LevelName, key: QuotaKey, limits: Limits) -> Self {
        Self {
            name,
            key,
            limits,
            lane: None,
        }
    }

    /// Its count and the decision on it (its grant added), where the count
    /// answered.
    pub fn counted(&self) -> Option<(Decision, Count)> {
        match self.lane? {
            Lane::Counted(c) => Some((decide(c.used, &self.limits.with_grant(c.grant)), c)),
            Lane::Failed { .. } => None,
        }
    }

    /// The line a counted scan waits in here: the level's own tier delay
    /// (0: within its limit) and its counter's expiry, which the line's
    /// slot shares.
    pub fn line(&self) -> Option<(u64, UnixSecs)> {
        self.counted()
            .map(|(decision, count)| (duration_ms(decision.delay), count.reset_at))
    }
}

impl Levels {
    /// Each network level of `ip`'s family with the network of it that
    /// holds `ip` (what a level's digest is made from, see [`Levels::of`]).
    pub fn networks_of(&self, ip: IpAddr) -> impl Iterator<Item = (NetworkLevel, IpNet)> + '_ {
        self.networks
            .iter()
            .filter_map(move |level| Some((*level, level.network.enclosing(ip)?)))
    }

    /// The material of one network's digest: family, prefix and length.
    pub fn material(level: Network, net: IpNet) -> String {
        format!("{level}:{}", net.addr())
    }

    /// The levels an anonymous scan from `ip` is counted at: each network
    /// level of its family, then the anonymous budget.
    pub fn of(&self, ip: IpAddr) -> impl Iterator<Item = LevelOf> + '_ {
        let networks = self.networks_of(ip).map(|(level, net)| LevelOf {
            name: LevelName::Network(level.network),
            material: Self::material(level.network, net),
            limit: level.limit,
        });
        networks.chain(self.anon.map(|budget| LevelOf {
            name: LevelName::Anon,
            material: ANON_MATERIAL.into(),
            limit: budget.limit,
        }))
    }

    /// The level `cidr` names, if it is a configured network level (the
    /// operator commands' `--network`), with the material of its digest.
    pub fn of_network(&self, cidr: IpNet) -> Option<LevelOf> {
        let cidr = cidr.trunc();
        let network = Network {
            family: Family::of(cidr.addr()),
            len: cidr.prefix_len(),
        };
        let level = self.networks.iter().find(|l| l.network == network)?;
        Some(LevelOf {
            name: LevelName::Network(network),
            material: Self::material(network, cidr),
            limit: level.limit,
        })
    }

    /// The limits a level's counter is decided on: the subject's rule
    /// (`base`: W_soft at D_soft, then D_hard) with the level's limit; the
    /// anonymous budget has only its interval. A level never carries the
    /// reminder (that is the subject's own count).
    pub fn limits(&self, name: LevelName, limit: NonZeroU32, base: Limits) -> Limits {
        let never = NonZeroU32::MAX;
        match (name, self.anon) {
            (LevelName::Anon, Some(budget)) => Limits {
                limit,
                soft_window: u32::MAX,
                soft_delay: budget.interval,
                hard_delay: budget.interval,
                warn_at: never,
            },
            _ => Limits {
                limit,
                warn_at: never,
                ..base
            },
        }
    }
}

/// `QUOTA_NETWORKS`: `off`, or comma-separated `v4/<len>=<limit>` and
/// `v6/<len>=<limit>`, the limit a number or `<k>x` (k × `anon`). A level
/// must be shorter than the subject (IPv4 /32, IPv6 `ipv6_prefix`), and
/// each at most once. Sorted by family, then from the narrowest.
pub fn parse_networks(
    text: &str,
    anon: NonZeroU32,
    ipv6_prefix: u8,
) -> Result<Vec<NetworkLevel>, String> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("off") {
        return Ok(Vec::new());
    }
    let mut levels = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let level = parse_level(item, anon, ipv6_prefix)?;
        if levels
            .iter()
            .any(|l: &NetworkLevel| l.network == level.network)
        {
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
                "at most {MAX_PER_FAMILY} levels of {} (each costs every scan)",
                family.as_str()
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

/// A level's limit: a number of scans, or `<k>x` of the anonymous quota.
fn parse_limit(text: &str, anon: NonZeroU32) -> Result<NonZeroU32, String> {
    let (number, times) = match text.strip_suffix(['x', 'X']) {
        Some(k) => (k, true),
        None => (text, false),
    };
    let n: u32 = number
        .parse()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{text:?} is not a limit (a whole number ≥ 1, or `<k>x`)"))?;
    let limit = if times {
        n.checked_mul(anon.get())
            .ok_or_else(|| format!("{text:?} × {anon} is too large"))?
    } else {
        n
    };
    NonZeroU32::new(limit).ok_or_else(|| format!("{text:?} is not a limit"))
}

/// The scan's decision: the most severe of its subject's and its levels'
/// (the longest delay, then the higher tier; a tie goes to the first, so
/// the subject, then the narrowest level), with the level that set it.
pub fn most_severe(
    subject: Decision,
    levels: impl IntoIterator<Item = (LevelName, Decision)>,
) -> (LevelName, Decision) {
    levels
        .into_iter()
        .fold((LevelName::Subject, subject), |worst, next| {
            let key = |d: &Decision| (d.delay, d.tier as u8);
            if key(&next.1) > key(&worst.1) {
                next
            } else {
                worst
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::decide::{Tier, decide};

    fn n(k: u32) -> NonZeroU32 {
        NonZeroU32::new(k).unwrap()
    }

    fn v(family: Family, len: u8) -> Network {
        Network { family, len }
    }

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

    fn levels() -> Levels {
        Levels {
            networks: parse_networks("v4/24=8x,v6/56=2x,v6/48=8x", n(33), 64).unwrap(),
            anon: Some(AnonBudget {
                limit: n(1000),
                interval: Duration::from_secs(1),
            }),
        }
    }

    /// An address's levels: its family's networks, then the budget; the
    /// material names the network, never the address.
    #[test]
    fn levels_of_an_address() {
        let ip: IpAddr = "203.0.113.77".parse().unwrap();
        let of: Vec<_> = levels().of(ip).collect();
        assert_eq!(of.len(), 2);
        assert_eq!(of[0].material, "v4/24:203.0.113.0");
        assert_eq!(of[0].name.label(), "v4/24");
        assert_eq!(PolicyName(of[0].name).to_string(), "v4-24");
        assert_eq!(of[1].name, LevelName::Anon);
        let ip: IpAddr = "2001:db8:1:2:3::9".parse().unwrap();
        let of: Vec<_> = levels().of(ip).map(|l| l.material).collect();
        assert_eq!(of, ["v6/56:2001:db8:1::", "v6/48:2001:db8:1::", "anon"]);
        assert!(Levels::default().of(ip).next().is_none());
        let net = levels().of_network("2001:db8:1:ff12::/56".parse().unwrap());
        assert_eq!(net.unwrap().material, "v6/56:2001:db8:1:ff00::");
        assert!(
            levels()
                .of_network("203.0.113.0/25".parse().unwrap())
                .is_none()
        );
    }

    /// The longest delay wins; a tie goes to the subject, then the narrowest.
    #[test]
    fn the_most_severe_level_decides() {
        let base = Limits {
            limit: n(3),
            soft_window: 2,
            soft_delay: Duration::from_secs(5),
            hard_delay: Duration::from_secs(60),
            warn_at: n(100),
        };
        let all = levels();
        let net = LevelName::Network(v(Family::V4, 24));
        let net_limits = all.limits(net, n(10), base);
        let anon_limits = all.limits(LevelName::Anon, n(1000), base);
        let pick = |subject: u64, network: u64, anon: u64| {
            most_severe(
                decide(subject, &base),
                [
                    (net, decide(network, &net_limits)),
                    (LevelName::Anon, decide(anon, &anon_limits)),
                ],
            )
        };
        assert_eq!(pick(1, 1, 1).0, LevelName::Subject);
        assert_eq!(pick(1, 1, 1).1.tier, Tier::Within);
        assert_eq!(pick(1, 11, 1).0, net);
        assert_eq!(pick(1, 11, 1).1.delay, Duration::from_secs(5));
        // Both soft: the subject.
        assert_eq!(pick(4, 11, 1).0, LevelName::Subject);
        assert_eq!(pick(4, 13, 1).0, net);
        assert_eq!(pick(4, 13, 1).1.tier, Tier::Hard);
        // The budget: its interval, never a hard tier, never a reminder.
        let (level, d) = pick(1, 1, 5000);
        assert_eq!(
            (level, d.delay, d.tier),
            (LevelName::Anon, Duration::from_secs(1), Tier::Soft)
        );
        assert!(!decide(5000, &anon_limits).reminder);
        assert!(!decide(100, &net_limits).reminder);
        // A soft subject (5 s) outweighs the 1 s budget.
        assert_eq!(pick(4, 1, 5000).0, LevelName::Subject);
    }
}
