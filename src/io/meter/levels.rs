//! Scans whose delay a level above the subject set: a configured network level (dimension `Level`,
//! `v4/24` or `tid:v4/24`: family and prefix length, never an address or digest), or the budget
//! of all anonymous traffic (dimension `Scope`, always `ip`). A shadow decision is no hit. In EMF
//! these go on a line of their own: one directive has one set of dimensions.

use crate::rules::decide::Tier;
use crate::rules::level::{LevelName, Levels};
use crate::rules::outcome::Metered;
use crate::rules::scope::Scope;

use super::emf::Handles;

/// Scans delayed in the soft tier by a network level's counter.
pub const NETWORK_SOFT_HITS: &str = "stella_quota_network_soft_hits_total";
/// Scans delayed in the hard tier by a network level's counter.
pub const NETWORK_HARD_HITS: &str = "stella_quota_network_hard_hits_total";
/// Anonymous scans paced by the budget of all anonymous traffic.
pub const GLOBAL_PACED: &str = "stella_quota_global_paced_total";
/// The level metrics, one per kind of [`LevelHit`].
pub const LEVEL_METRICS: [&str; 3] = [NETWORK_SOFT_HITS, NETWORK_HARD_HITS, GLOBAL_PACED];

/// What a level did to one scan, if it set the scan's delay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LevelHit {
    /// A network level (anonymous or token holders': its name).
    NetworkSoft(LevelName),
    NetworkHard(LevelName),
    GlobalPaced,
}

impl LevelHit {
    /// A scan's hit: a delay (not in shadow mode) set by a network level or the anonymous budget.
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
            (LevelName::Network(_) | LevelName::TokenNetwork(_), Tier::Soft) => {
                Some(Self::NetworkSoft(level))
            }
            (LevelName::Network(_) | LevelName::TokenNetwork(_), Tier::Hard) => {
                Some(Self::NetworkHard(level))
            }
            (LevelName::Anon, _) => Some(Self::GlobalPaced),
        }
    }

    pub const fn metric(self) -> &'static str {
        match self {
            Self::NetworkSoft(_) => NETWORK_SOFT_HITS,
            Self::NetworkHard(_) => NETWORK_HARD_HITS,
            Self::GlobalPaced => GLOBAL_PACED,
        }
    }

    /// The counter of this hit's series, registered where counted (a lookup per hit: only a
    /// delayed scan has one).
    pub(super) fn counter(self, handles: &Handles) -> metrics::Counter {
        match self {
            Self::GlobalPaced => handles.counter(GLOBAL_PACED, &[("scope", Scope::Ip.as_str())]),
            Self::NetworkSoft(n) | Self::NetworkHard(n) => {
                handles.counter(self.metric(), &[("level", &n.to_string())])
            }
        }
    }

    /// The `# HELP` text of each level metric, in [`LEVEL_METRICS`] order.
    pub const HELP: [&str; 3] = [
        "Scans given the soft delay by a network level (QUOTA_NETWORKS, QUOTA_TOKEN_NETWORKS), by level.",
        "Scans given the hard delay by a network level (QUOTA_NETWORKS, QUOTA_TOKEN_NETWORKS), by level.",
        "Anonymous scans paced by the budget of all anonymous traffic (QUOTA_ANON_GLOBAL).",
    ];
}

/// Registers each configured network level's series and the global one, so queries have data
/// from the start; not incremented, so no EMF line holds a 0 for them.
pub(super) fn register(handles: &Handles, levels: &Levels) {
    for scope in Scope::ALL {
        for level in levels.networks(scope) {
            let name = LevelName::network(scope, level.network);
            let _ = LevelHit::NetworkSoft(name).counter(handles);
            let _ = LevelHit::NetworkHard(name).counter(handles);
        }
    }
    let _ = LevelHit::GlobalPaced.counter(handles);
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::rules::networks::{Family, Network};

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
        let tokens = LevelName::TokenNetwork(v4);
        assert_eq!(
            LevelHit::of(counted(Tier::Hard, tokens, false)),
            Some(LevelHit::NetworkHard(tokens))
        );
        let of = LevelHit::of;
        assert_eq!(
            of(counted(Tier::Soft, net, false)),
            Some(LevelHit::NetworkSoft(net))
        );
        assert_eq!(
            of(counted(Tier::Hard, net, false)),
            Some(LevelHit::NetworkHard(net))
        );
        assert_eq!(
            of(counted(Tier::Soft, LevelName::Anon, false)),
            Some(LevelHit::GlobalPaced)
        );
        assert_eq!(of(counted(Tier::Hard, net, true)), None);
        assert_eq!(of(counted(Tier::Within, net, false)), None);
        assert_eq!(of(counted(Tier::Hard, LevelName::Subject, false)), None);
        assert_eq!(of(Metered::StoreFailed), None);
        for hit in [LevelHit::NetworkSoft(net), LevelHit::GlobalPaced] {
            assert!(LEVEL_METRICS.contains(&hit.metric()));
        }
    }
}
