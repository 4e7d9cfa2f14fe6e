//! Scans whose delay a level above the subject set: a network
//! (`stella_quota_network_soft_hits_total` / `…_hard_hits_total`, dimension
//! `Level`: `v4/24`, `v6/48`, … the configured levels only) or all
//! anonymous traffic (`stella_quota_global_paced_total`, dimension `Scope`,
//! always `ip`: only anonymous scans are counted there).
//!
//! A level's name is its family and prefix length, never an address or a
//! digest: one series per configured level. Which level set a scan's delay
//! comes from [`Metered::Counted`]'s `level`, as the tier does; a shadow
//! decision is no hit (nobody waited), as for the subject's hits.
//!
//! In EMF these go on a line of their own, after the scan's line: a level's
//! dimension is not the scan's `Scope`, and one directive has one set of
//! dimensions.

use crate::rules::decide::Tier;
use crate::rules::level::{LevelName, Levels, Network};
use crate::rules::outcome::Metered;
use crate::rules::scope::Scope;

use super::emf::{self, Line, Unit};

/// Scans delayed in the soft tier by a network level's counter.
pub const NETWORK_SOFT_HITS: &str = "stella_quota_network_soft_hits_total";
/// Scans delayed in the hard tier by a network level's counter.
pub const NETWORK_HARD_HITS: &str = "stella_quota_network_hard_hits_total";
/// Anonymous scans paced by the budget of all anonymous traffic.
pub const GLOBAL_PACED: &str = "stella_quota_global_paced_total";
/// The level metrics, in [`LevelHit::index`] order.
pub const LEVEL_METRICS: [&str; 3] = [NETWORK_SOFT_HITS, NETWORK_HARD_HITS, GLOBAL_PACED];
/// The EMF dimension of the network metrics (Prometheus: the label `level`).
pub const LEVEL_DIMENSION: &str = "Level";

/// What a level did to one scan, if it set the scan's delay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LevelHit {
    NetworkSoft(Network),
    NetworkHard(Network),
    GlobalPaced,
}

impl LevelHit {
    /// The hit a scan that left the gate so is counted as: a delay (not a
    /// shadow decision) set by a network level or the anonymous budget.
    pub fn of(metered: Metered) -> Option<Self> {
        let Metered::Counted {
            tier,
            shadow: false,
            level,
            ..
        } = metered
        else {
            return None;
        };
        match (level, tier) {
            (_, Tier::Within) | (LevelName::Subject, _) => None,
            (LevelName::Network(n), Tier::Soft) => Some(Self::NetworkSoft(n)),
            (LevelName::Network(n), Tier::Hard) => Some(Self::NetworkHard(n)),
            (LevelName::Anon, _) => Some(Self::GlobalPaced),
        }
    }

    pub const fn index(self) -> usize {
        match self {
            Self::NetworkSoft(_) => 0,
            Self::NetworkHard(_) => 1,
            Self::GlobalPaced => 2,
        }
    }

    pub const fn metric(self) -> &'static str {
        LEVEL_METRICS[self.index()]
    }

    /// The `# HELP` text of each level metric, in [`LEVEL_METRICS`] order.
    pub const HELP: [&str; 3] = [
        "Anonymous scans given the soft delay by a network level (QUOTA_NETWORKS), by level.",
        "Anonymous scans given the hard delay by a network level (QUOTA_NETWORKS), by level.",
        "Anonymous scans paced by the budget of all anonymous traffic (QUOTA_ANON_GLOBAL).",
    ];
}

/// The `metrics` handles and EMF directives of the level metrics.
pub(super) struct LevelMeter {
    /// Per configured network level: its soft and hard hits.
    networks: Vec<(Network, [metrics::Counter; 2])>,
    global: metrics::Counter,
    /// Per [`LEVEL_METRICS`]: the directive of its line.
    directives: [String; 3],
}

impl LevelMeter {
    /// Registers a series for each configured network level (at 0, so a
    /// query has data from the start) and the global one.
    pub(super) fn new(namespace: &str, levels: &Levels) -> Self {
        let networks = levels
            .networks
            .iter()
            .map(|l| (l.network, Self::network_handles(l.network)))
            .collect();
        let dimension = |i: usize| match i {
            2 => "Scope",
            _ => LEVEL_DIMENSION,
        };
        Self {
            networks,
            global: metrics::counter!(GLOBAL_PACED, "scope" => Scope::Ip.as_str()),
            directives: std::array::from_fn(|i| {
                emf::directive(namespace, dimension(i), &[(LEVEL_METRICS[i], Unit::Count)])
            }),
        }
    }

    fn network_handles(network: Network) -> [metrics::Counter; 2] {
        let label = network.to_string();
        [NETWORK_SOFT_HITS, NETWORK_HARD_HITS]
            .map(|name| metrics::counter!(name, "level" => label.clone()))
    }

    /// Counts `hit` in Prometheus.
    pub(super) fn increment(&self, hit: LevelHit) {
        let network = match hit {
            LevelHit::GlobalPaced => return self.global.increment(1),
            LevelHit::NetworkSoft(n) | LevelHit::NetworkHard(n) => n,
        };
        let handles = self.networks.iter().find(|(n, _)| *n == network);
        match handles {
            Some((_, h)) => h[hit.index()].increment(1),
            // A meter built without the levels (tests): registered on first use.
            None => Self::network_handles(network)[hit.index()].increment(1),
        }
    }

    /// The EMF line of `hit`, for a request that arrived at `at_ms`.
    pub(super) fn line(&self, hit: LevelHit, at_ms: i64) -> String {
        let directive = &self.directives[hit.index()];
        let mut line = match hit {
            LevelHit::GlobalPaced => Line::start(at_ms, directive, "Scope", Scope::Ip.as_str()),
            LevelHit::NetworkSoft(n) | LevelHit::NetworkHard(n) => {
                Line::start(at_ms, directive, LEVEL_DIMENSION, &n.to_string())
            }
        };
        line.number(hit.metric(), 1u64);
        line.finish()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::rules::level::Family;

    fn counted(tier: Tier, level: LevelName, shadow: bool) -> Metered {
        Metered::Counted {
            tier,
            reminder: false,
            delay: Duration::from_secs(5),
            shadow,
            level,
        }
    }

    /// A hit is a delay a network or the anonymous budget set; never the subject's, a within scan or a shadow decision.
    #[test]
    fn hits() {
        let v4 = Network {
            family: Family::V4,
            len: 24,
        };
        let net = LevelName::Network(v4);
        let of = LevelHit::of;
        assert_eq!(
            of(counted(Tier::Soft, net, false)),
            Some(LevelHit::NetworkSoft(v4))
        );
        assert_eq!(
            of(counted(Tier::Hard, net, false)),
            Some(LevelHit::NetworkHard(v4))
        );
        assert_eq!(
            of(counted(Tier::Soft, LevelName::Anon, false)),
            Some(LevelHit::GlobalPaced)
        );
        assert_eq!(of(counted(Tier::Hard, net, true)), None);
        assert_eq!(of(counted(Tier::Within, net, false)), None);
        assert_eq!(of(counted(Tier::Hard, LevelName::Subject, false)), None);
        assert_eq!(of(Metered::StoreFailed), None);
        for hit in [LevelHit::NetworkSoft(v4), LevelHit::GlobalPaced] {
            assert_eq!(LEVEL_METRICS[hit.index()], hit.metric());
        }
    }

    /// A network hit's line has the one dimension Level, named by family and length only.
    #[test]
    fn lines() {
        let v6 = Network {
            family: Family::V6,
            len: 48,
        };
        let meter = LevelMeter::new("ns", &Levels::default());
        let doc: serde_json::Value =
            serde_json::from_str(&meter.line(LevelHit::NetworkHard(v6), 7)).unwrap();
        assert_eq!(
            doc["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
            serde_json::json!([["Level"]])
        );
        assert_eq!(doc["Level"], "v6/48");
        assert_eq!(doc[NETWORK_HARD_HITS], 1);
        let global: serde_json::Value =
            serde_json::from_str(&meter.line(LevelHit::GlobalPaced, 7)).unwrap();
        assert_eq!(global["Scope"], "ip");
        assert_eq!(global[GLOBAL_PACED], 1);
    }
}
