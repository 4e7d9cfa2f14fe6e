//! Budgets above the subject, each counted and paced like one client: networks enclosing an address
//! (`QUOTA_NETWORKS`; `QUOTA_TOKEN_NETWORKS` for token holders, counted apart so an anonymous flood
//! never slows them) and all anonymous traffic (`QUOTA_ANON_GLOBAL`). A per-address quota is only
//! as strong as the cheapest block of addresses, and a token is as cheap as an e-mail address.

use std::fmt;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use ipnet::IpNet;

use crate::rules::count::{Count, LevelCount};
use crate::rules::decide::{Decision, Limits, decide};
use crate::rules::key::QuotaKey;
use crate::rules::networks::{Family, Network, NetworkLevel};
use crate::rules::scope::Scope;
use crate::rules::unix::{UnixSecs, duration_ms};

/// Which counter set a scan's delay, as clients and metrics name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LevelName {
    Subject,
    Network(Network),
    TokenNetwork(Network),
    Anon,
}

impl LevelName {
    /// The label (`quota.level`): `subject`, `v4/24`, `tid:v4/24`, `anon`.
    pub fn label(self) -> String {
        self.to_string()
    }

    /// The level of `network` for the traffic of `scope`.
    pub fn network(scope: Scope, network: Network) -> Self {
        match scope {
            Scope::Ip => Self::Network(network),
            Scope::Tid => Self::TokenNetwork(network),
        }
    }
}

impl fmt::Display for LevelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Subject => f.write_str("subject"),
            Self::Network(n) => n.fmt(f),
            Self::TokenNetwork(n) => write!(f, "tid:{n}"),
            Self::Anon => f.write_str("anon"),
        }
    }
}

/// In JSON, its label (`quota.level`, `nextScan.level`).
impl serde::Serialize for LevelName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A level's name in `RateLimit-Policy` (`daily`, `v4-24`, `tid-v4-24`, `anon`).
#[derive(Debug, Clone, Copy)]
pub struct PolicyName(pub LevelName);

impl fmt::Display for PolicyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            LevelName::Subject => f.write_str("daily"),
            LevelName::Network(n) => write!(f, "{}-{}", n.family, n.len),
            LevelName::TokenNetwork(n) => write!(f, "tid-{}-{}", n.family, n.len),
            LevelName::Anon => f.write_str("anon"),
        }
    }
}

/// The material of the anonymous budget's digest: one counter for all.
pub const ANON_MATERIAL: &str = "anon";

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
    /// Narrowest first within a family.
    pub anon_networks: Vec<NetworkLevel>,
    pub token_networks: Vec<NetworkLevel>,
    pub anon: Option<AnonBudget>,
}

/// One level of one address: its name, its digest's material (never the address) and its limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LevelOf {
    pub name: LevelName,
    pub material: String,
    pub limit: NonZeroU32,
}

/// A level a scan is counted at, in the order the store is asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Level {
    pub name: LevelName,
    pub key: QuotaKey,
    /// Its tier rule with its own limit, before any grant.
    pub limits: Limits,
    /// `None` before the count, and for a resumed scan, which counts at no level again.
    pub count: Option<LevelCount>,
}

impl Level {
    /// A level not counted yet.
    pub fn new(name: LevelName, key: QuotaKey, limits: Limits) -> Self {
        Self {
            name,
            key,
            limits,
            count: None,
        }
    }

    /// Its count and the decision on it (grant added), where the count answered.
    pub fn counted(&self) -> Option<(Decision, Count)> {
        match self.count? {
            Ok(c) => Some((decide(c.used, &self.limits.with_grant(c.grant)), c)),
            Err(_) => None,
        }
    }

    /// The line a counted scan waits in here: its tier delay (0: within limit) and counter expiry.
    pub fn line(&self) -> Option<(u64, UnixSecs)> {
        self.counted()
            .map(|(decision, count)| (duration_ms(decision.delay), count.reset_at))
    }
}

impl Levels {
    /// The network levels of `scope`'s traffic.
    pub fn networks(&self, scope: Scope) -> &[NetworkLevel] {
        match scope {
            Scope::Ip => &self.anon_networks,
            Scope::Tid => &self.token_networks,
        }
    }

    /// Each network level of `scope` and `ip`'s family, with its network that holds `ip`.
    pub fn networks_of(
        &self,
        scope: Scope,
        ip: IpAddr,
    ) -> impl Iterator<Item = (LevelName, NetworkLevel, IpNet)> + '_ {
        self.networks(scope).iter().filter_map(move |level| {
            let name = LevelName::network(scope, level.network);
            Some((name, *level, level.network.enclosing(ip)?))
        })
    }

    /// One network level's digest material (`v4/24:203.0.113.0`, `tid:v4/24:203.0.113.0`).
    pub fn material(name: LevelName, net: IpNet) -> String {
        format!("{name}:{}", net.addr())
    }

    /// The levels a `scope` scan from `ip` is counted at: its networks, then the anonymous budget.
    pub fn of(&self, scope: Scope, ip: IpAddr) -> impl Iterator<Item = LevelOf> + '_ {
        let networks = self
            .networks_of(scope, ip)
            .map(|(name, level, net)| LevelOf {
                name,
                material: Self::material(name, net),
                limit: level.limit,
            });
        let anon = self.anon.filter(|_| scope == Scope::Ip);
        networks.chain(anon.map(|budget| LevelOf {
            name: LevelName::Anon,
            material: ANON_MATERIAL.into(),
            limit: budget.limit,
        }))
    }

    /// The configured level `cidr` names for `scope` (the operator commands' `--network`).
    pub fn of_network(&self, scope: Scope, cidr: IpNet) -> Option<LevelOf> {
        let cidr = cidr.trunc();
        let network = Network {
            family: Family::of(cidr.addr()),
            len: cidr.prefix_len(),
        };
        let level = self.networks(scope).iter().find(|l| l.network == network)?;
        let name = LevelName::network(scope, network);
        Some(LevelOf {
            name,
            material: Self::material(name, cidr),
            limit: level.limit,
        })
    }

    /// The subject's rule with the level's limit (the anonymous budget: its interval), no reminder.
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

/// The scan's decision: the most severe of its subject's and its levels' (longest delay, then
/// higher tier; a tie goes to the subject, then the narrowest level), with the level that set it.
pub fn most_severe(
    subject: Decision,
    levels: impl IntoIterator<Item = (LevelName, Decision)>,
) -> (LevelName, Decision) {
    let severity = |(_, d): &(LevelName, Decision)| (d.delay, d.tier as u8);
    // `max_by_key` keeps its second argument on a tie: the one found first.
    let worse = |worst, next| std::cmp::max_by_key(next, worst, severity);
    levels
        .into_iter()
        .fold((LevelName::Subject, subject), worse)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::count::NoAnswer;
    use crate::rules::decide::{Tier, decide};
    use crate::rules::networks::parse_networks;
    use crate::rules::networks::{n, v};

    fn levels() -> Levels {
        Levels {
            anon_networks: parse_networks("v4/24=8x,v6/56=2x,v6/48=8x", n(33), 64).unwrap(),
            token_networks: parse_networks("v4/24=10x", n(333), 64).unwrap(),
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
        let of: Vec<_> = levels().of(Scope::Ip, ip).collect();
        assert_eq!(of.len(), 2);
        assert_eq!(of[0].material, "v4/24:203.0.113.0");
        assert_eq!(of[0].name.label(), "v4/24");
        assert_eq!(PolicyName(of[0].name).to_string(), "v4-24");
        assert_eq!(of[1].name, LevelName::Anon);
        let ip: IpAddr = "2001:db8:1:2:3::9".parse().unwrap();
        let of: Vec<_> = levels().of(Scope::Ip, ip).map(|l| l.material).collect();
        assert_eq!(of, ["v6/56:2001:db8:1::", "v6/48:2001:db8:1::", "anon"]);
        assert!(Levels::default().of(Scope::Ip, ip).next().is_none());
        let net = levels().of_network(Scope::Ip, "2001:db8:1:ff12::/56".parse().unwrap());
        assert_eq!(net.unwrap().material, "v6/56:2001:db8:1:ff00::");
        let cidr = "203.0.113.0/25".parse().unwrap();
        assert!(levels().of_network(Scope::Ip, cidr).is_none());
    }

    /// A token holder's levels: its networks on counters of their own (the
    /// material says whose traffic), never the anonymous budget.
    #[test]
    fn a_token_holders_levels() {
        let ip: IpAddr = "203.0.113.77".parse().unwrap();
        let of: Vec<_> = levels().of(Scope::Tid, ip).collect();
        assert_eq!(of.len(), 1);
        assert_eq!(of[0].material, "tid:v4/24:203.0.113.0");
        assert_eq!(of[0].name.label(), "tid:v4/24");
        assert_eq!(PolicyName(of[0].name).to_string(), "tid-v4-24");
        assert_eq!(of[0].limit.get(), 3330);
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        assert!(levels().of(Scope::Tid, v6).next().is_none());
        let cidr = "203.0.113.0/24".parse().unwrap();
        let net = levels().of_network(Scope::Tid, cidr).unwrap();
        assert_eq!(net.name, LevelName::TokenNetwork(v(Family::V4, 24)));
    }

    /// A level decides on its own count, its grant added: over its limit it
    /// is a line with its tier's delay and its counter's expiry; within it,
    /// a line of no delay; not counted, or its count failed, nothing.
    #[test]
    fn a_level_decides_on_its_own_count() {
        let limits = Limits {
            limit: n(3),
            soft_window: 2,
            soft_delay: Duration::from_secs(5),
            hard_delay: Duration::from_secs(60),
            warn_at: n(100),
        };
        let digest = crate::rules::digest::Hasher::new(b"k").level_digest("v4/24:203.0.113.0");
        let name = LevelName::Network(v(Family::V4, 24));
        let mut level = Level::new(name, QuotaKey::level(&digest), limits);
        assert_eq!((level.counted(), level.line()), (None, None));
        let count = |used, grant| Count {
            used,
            reset_at: UnixSecs(86_400),
            now: UnixSecs(1),
            grant,
        };
        level.count = Some(Ok(count(4, 0)));
        let (decision, counted) = level.counted().unwrap();
        assert_eq!((decision.tier, counted.used), (Tier::Soft, 4));
        assert_eq!(level.line(), Some((5_000, UnixSecs(86_400))));
        level.count = Some(Ok(count(4, 1)));
        assert_eq!(level.counted().unwrap().0.tier, Tier::Within);
        assert_eq!(level.line(), Some((0, UnixSecs(86_400))));
        level.count = Some(Err(NoAnswer { may_land: true }));
        assert_eq!(level.counted(), None);
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
