//! Whether the quota Valkey may evict the gate's keys, and what the start does about it. Every
//! quota key has a TTL, so any policy but `noeviction` evicts them when the store is full; the
//! policy is read from each primary's `INFO memory` (`CONFIG` is disabled on ElastiCache).

use crate::rules::modes::OnEviction;

/// What a `maxmemory-policy` can evict of the gate's keys, from harmless to worst.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Eviction {
    /// `noeviction`: a full store refuses writes; nothing is lost.
    Never,
    /// `volatile-*`, an unknown policy or none reported: keys with a TTL, every quota key.
    KeysWithTtl,
    /// `allkeys-*`: every key, the stream's jobs included.
    AllKeys,
}

impl Eviction {
    /// The class of the reported policy; none reported is taken as evicting.
    pub fn of(policy: Option<&str>) -> Self {
        match policy {
            Some("noeviction") => Self::Never,
            Some(p) if p.starts_with("allkeys-") => Self::AllKeys,
            _ => Self::KeysWithTtl,
        }
    }

    /// Whether it can evict any of the gate's keys.
    pub fn evicts(self) -> bool {
        self != Self::Never
    }

    /// What breaks when the store evicts so.
    pub fn breaks(self) -> &'static str {
        match self {
            Self::Never => "nothing: a full store refuses writes and the fail mode answers",
            Self::KeysWithTtl => {
                "every quota key has a TTL, so a full store evicts counters and pacing slots \
                 (the client's next scans are free), idempotency records (a keyed scan is \
                 queued twice) and the consumer's markers (a finished scan runs again)"
            }
            Self::AllKeys => {
                "a full store evicts any key: counters and pacing slots (free scans), idempotency \
                 records (a keyed scan queued twice), the consumer's markers (a scan run again) \
                 and stream jobs (202'd scans that never run)"
            }
        }
    }
}

/// How to make the store safe: the one fix every evicting policy shares.
pub const FIX: &str = "set maxmemory-policy noeviction (on ElastiCache: a parameter group with \
     maxmemory-policy noeviction); ElastiCache Serverless evicts at its data-storage maximum \
     whatever the policy, so alarm on BytesUsedForCache well under it (docs/production.md, \
     \"Eviction and memory\")";

/// One primary's `maxmemory_policy` (`None`: its `INFO memory` has none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePolicy {
    pub node: String,
    pub policy: Option<String>,
}

/// An evicting store, as found at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub eviction: Eviction,
    /// The evicting policies found, each once, in the order read (`unreported`: none named).
    pub policies: String,
}

impl Finding {
    /// The line that says it: the policy, what breaks and the fix.
    pub fn message(&self) -> String {
        format!(
            "the quota Valkey's maxmemory-policy is {}: {}; {FIX}",
            self.policies,
            self.eviction.breaks()
        )
    }
}

/// What the start does with the store's policies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AtStart {
    Safe,
    Warn(Finding),
    Refuse(Finding),
}

/// The store is as bad as its worst primary: evicting, it is said, or refused per `on_eviction`.
pub fn at_start(nodes: &[NodePolicy], on_eviction: OnEviction) -> AtStart {
    let mut policies: Vec<&str> = Vec::new();
    let mut worst = Eviction::Never;
    for node in nodes {
        let eviction = Eviction::of(node.policy.as_deref());
        let name = node.policy.as_deref().unwrap_or("unreported");
        if eviction.evicts() && !policies.contains(&name) {
            policies.push(name);
        }
        worst = worst.max(eviction);
    }
    if !worst.evicts() {
        return AtStart::Safe;
    }
    let finding = Finding {
        eviction: worst,
        policies: policies.join(", "),
    };
    match on_eviction {
        OnEviction::Warn => AtStart::Warn(finding),
        OnEviction::Refuse => AtStart::Refuse(finding),
    }
}

/// What a policy reading calls for, given the last one's finding (`None`: the first reading).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reading {
    Unchanged,
    Safe,
    Evicting(Finding),
    /// Evicting at the first reading with `QUOTA_STORE_EVICTION=refuse`: the process does not run.
    Refuse(Finding),
}

/// Said once a change; evicting later is metered, not refused: stopping a fleet is an outage.
pub fn reading(last: Option<bool>, nodes: &[NodePolicy], on_eviction: OnEviction) -> Reading {
    match (last, at_start(nodes, on_eviction)) {
        (None, AtStart::Refuse(finding)) => Reading::Refuse(finding),
        (Some(false), AtStart::Safe) | (Some(true), AtStart::Warn(_) | AtStart::Refuse(_)) => {
            Reading::Unchanged
        }
        (_, AtStart::Safe) => Reading::Safe,
        (_, AtStart::Warn(finding) | AtStart::Refuse(finding)) => Reading::Evicting(finding),
    }
}

/// Keys evicted since the last `evicted_keys` reading (`None`: base only); after a drop, all new.
pub fn evicted_since(last: Option<u64>, now: u64) -> u64 {
    match last {
        None => 0,
        Some(last) if now >= last => now - last,
        Some(_) => now,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(policies: &[Option<&str>]) -> Vec<NodePolicy> {
        policies
            .iter()
            .enumerate()
            .map(|(i, p)| NodePolicy {
                node: format!("10.0.0.{i}:6379"),
                policy: p.map(str::to_owned),
            })
            .collect()
    }

    /// Only `noeviction` is safe; `allkeys-*` is worst; anything else, named
    /// or not, evicts keys with a TTL.
    #[test]
    fn classes() {
        assert_eq!(Eviction::of(Some("noeviction")), Eviction::Never);
        for p in [
            "volatile-lru",
            "volatile-lfu",
            "volatile-ttl",
            "volatile-random",
        ] {
            assert_eq!(Eviction::of(Some(p)), Eviction::KeysWithTtl, "{p}");
        }
        for p in ["allkeys-lru", "allkeys-lfu", "allkeys-random"] {
            assert_eq!(Eviction::of(Some(p)), Eviction::AllKeys, "{p}");
        }
        assert_eq!(Eviction::of(Some("newfangled")), Eviction::KeysWithTtl);
        assert_eq!(Eviction::of(None), Eviction::KeysWithTtl);
        assert!(Eviction::AllKeys.breaks().contains("stream jobs"));
        assert!(!Eviction::KeysWithTtl.breaks().contains("stream"));
    }

    /// Every pair of policies and setting: safe, said, or refused, naming
    /// each evicting policy once and the worst class of the primaries.
    #[test]
    fn at_start_table() {
        use OnEviction::{Refuse, Warn};
        let safe = nodes(&[Some("noeviction"), Some("noeviction")]);
        assert_eq!(at_start(&safe, Warn), AtStart::Safe);
        assert_eq!(at_start(&safe, Refuse), AtStart::Safe);
        let mixed = nodes(&[
            Some("noeviction"),
            Some("volatile-lru"),
            Some("allkeys-lru"),
            Some("volatile-lru"),
        ]);
        let finding = Finding {
            eviction: Eviction::AllKeys,
            policies: "volatile-lru, allkeys-lru".into(),
        };
        assert_eq!(at_start(&mixed, Warn), AtStart::Warn(finding.clone()));
        assert_eq!(at_start(&mixed, Refuse), AtStart::Refuse(finding));
        let unreported = at_start(&nodes(&[None]), Refuse);
        let AtStart::Refuse(f) = unreported else {
            panic!("{unreported:?}")
        };
        assert_eq!(
            (f.eviction, f.policies.as_str()),
            (Eviction::KeysWithTtl, "unreported")
        );
        let message = f.message();
        assert!(
            message.contains("unreported") && message.contains("noeviction"),
            "{message}"
        );
        assert!(message.contains("parameter group") && message.contains("Serverless"));
    }

    /// The first reading sets the base; a drop is a restart, counted whole.
    #[test]
    fn evictions_between_readings() {
        assert_eq!(evicted_since(None, 500), 0);
        assert_eq!(evicted_since(Some(500), 500), 0);
        assert_eq!(evicted_since(Some(500), 730), 230);
        assert_eq!(evicted_since(Some(500), 40), 40);
    }

    /// Each reading says a change once; refusal only at the first reading
    /// (a store down at start that comes up evicting), never later.
    #[test]
    fn readings_say_each_change_once() {
        use OnEviction::{Refuse, Warn};
        let (safe, lru) = (nodes(&[Some("noeviction")]), nodes(&[Some("allkeys-lru")]));
        let evicting = |r: &Reading| matches!(r, Reading::Evicting(_));
        assert!(matches!(reading(None, &lru, Refuse), Reading::Refuse(_)));
        assert!(evicting(&reading(None, &lru, Warn)));
        assert!(evicting(&reading(Some(false), &lru, Refuse)));
        assert_eq!(reading(Some(true), &lru, Refuse), Reading::Unchanged);
        assert_eq!(reading(None, &safe, Refuse), Reading::Safe);
        assert_eq!(reading(Some(true), &safe, Warn), Reading::Safe);
        assert_eq!(reading(Some(false), &safe, Warn), Reading::Unchanged);
    }
}
