//! The levels above a subject, for operators. A `--network` CIDR must have a configured length:
//! any other names a counter the gate never writes. A level's grant is held in its counter (used −
//! granted), as the request path reads no grant; a counter without expiry gets [`period_end`].

use ipnet::IpNet;

use super::change::{Granted, Removal};
use super::level_report::LevelReport;
use super::{OpsError, now, valkey_store};
use crate::config::Config;
use crate::gate::identity::{Identifier, ip};
use crate::io::store::period_end;
use crate::io::store::valkey::ValkeyStore;
use crate::rules::level::Level;
use crate::rules::scope::Scope;

/// The level `--network <cidr>` names: of `QUOTA_NETWORKS`, or, as `tid:<cidr>`, of
/// `QUOTA_TOKEN_NETWORKS`.
pub fn resolve(config: &Config, raw: &str) -> Result<Level, OpsError> {
    let (scope, text, var) = match raw.trim().strip_prefix("tid:") {
        Some(cidr) => (Scope::Tid, cidr, "QUOTA_TOKEN_NETWORKS"),
        None => (Scope::Ip, raw.trim(), "QUOTA_NETWORKS"),
    };
    let cidr: IpNet = text.parse().map_err(|_| {
        OpsError::BadInput(format!(
            "--network {raw}: not a CIDR (give a network such as 203.0.113.0/24 or \
             2001:db8::/48, or tid:203.0.113.0/24 for its token holders' level)"
        ))
    })?;
    let levels = &config.policy.levels;
    let level = levels.of_network(scope, cidr).ok_or_else(|| {
        let configured: Vec<String> = levels
            .networks(scope)
            .iter()
            .map(|l| l.network.to_string())
            .collect();
        OpsError::BadInput(match configured.is_empty() {
            true => format!(
                "--network {raw}: no network level is configured ({var}=off), \
                 so the gate counts no network"
            ),
            false => format!(
                "--network {raw}: /{} is not a configured level; the configured levels \
                 ({var}) are {}",
                cidr.prefix_len(),
                configured.join(", ")
            ),
        })
    })?;
    Ok(Identifier::new(config)?.level(level))
}

/// The levels an anonymous scan from `--ip <raw>` is counted at, in the gate's order.
pub fn of_ip(config: &Config, raw: &str) -> Result<Vec<Level>, OpsError> {
    let addr =
        ip::parse_source(raw).ok_or_else(|| OpsError::Usage("--ip: not an IP address".into()))?;
    Ok(Identifier::new(config)?.levels_of(Scope::Ip, addr))
}

/// Reads each of `levels`, one round trip each.
pub async fn inspect(
    store: &ValkeyStore,
    config: &Config,
    levels: &[Level],
) -> Result<Vec<LevelReport>, OpsError> {
    let now = now();
    let mut reports = Vec::with_capacity(levels.len());
    for level in levels {
        let snapshot = store.inspect_level(&level.key).await?;
        reports.push(LevelReport::new(config, level, snapshot.as_ref(), now));
    }
    Ok(reports)
}

/// `inspect --network`.
pub async fn inspect_network(config: &Config, raw: &str) -> Result<LevelReport, OpsError> {
    let level = resolve(config, raw)?;
    let snapshot = valkey_store(config)?.inspect_level(&level.key).await?;
    Ok(LevelReport::new(config, &level, snapshot.as_ref(), now()))
}

/// `grant --network`: `scans` extra scans for the level's period (0 revokes).
pub async fn grant(config: &Config, raw: &str, scans: u64) -> Result<Granted, OpsError> {
    let level = resolve(config, raw)?;
    let store = valkey_store(config)?;
    let label = level.name.label();
    let (at, earlier) = store
        .grant_level(&level.key, scans, period_end(config.policy.reset, now()))
        .await?;
    let revoked = earlier > 0;
    if scans == 0 {
        tracing::info!(level = %label, revoked, "level grant revoked");
    } else {
        tracing::info!(level = %label, scans, "level grant set");
    }
    Ok(Granted::new(level.key.counter, scans, at, revoked))
}

/// `reset --network`.
pub async fn reset(config: &Config, raw: &str) -> Result<Removal, OpsError> {
    let level = resolve(config, raw)?;
    let removed = valkey_store(config)?.reset(&level.key).await?;
    Ok(Removal {
        key: level.key.counter,
        removed,
    })
}

/// The human form of `reset --network`.
pub fn render_removal(removal: &Removal) -> String {
    removal.render_of("counter, pacing slot, grant", "the network's next scan")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(networks: &str) -> Config {
        let networks = networks.to_owned();
        Config::from_lookup(move |k| match k {
            "QUOTA_ANON" => Some("3".into()),
            "QUOTA_NETWORKS" => Some(networks.clone()),
            "QUOTA_HASH_SECRET" => Some("ops-test-secret-0123456789".into()),
            _ => None,
        })
        .unwrap()
    }

    /// `--network` names the key the gate counts an address of that network under.
    #[test]
    fn a_network_is_the_gates_level() {
        let c = config("v4/24=8x,v6/48=8x");
        let net = resolve(&c, "203.0.113.0/24").unwrap();
        assert_eq!(net, resolve(&c, "203.0.113.77/24").unwrap());
        assert_eq!(of_ip(&c, "203.0.113.9").unwrap(), vec![net.clone()]);
        assert_eq!(net.limits.limit.get(), 24);
        assert!(net.key.counter.starts_with("quota:net:{"));
        let v6 = resolve(&c, "2001:db8:1::/48").unwrap();
        assert_eq!(of_ip(&c, "2001:db8:1:2::3").unwrap(), vec![v6]);
    }

    /// A CIDR of a length that is not configured, or not a CIDR, is refused naming the configured levels.
    #[test]
    fn bad_networks() {
        let c = config("v4/24=8x,v6/56=2x");
        for bad in ["203.0.113.0/16", "2001:db8::/48", "203.0.113.9", "nope"] {
            let e = resolve(&c, bad).unwrap_err();
            assert!(matches!(e, OpsError::BadInput(_)), "{bad}: {e}");
            if bad.contains('/') {
                assert!(e.to_string().contains("v4/24, v6/56"), "{e}");
            }
        }
        let off = config("off");
        let e = resolve(&off, "203.0.113.0/24").unwrap_err().to_string();
        assert!(e.contains("QUOTA_NETWORKS=off"), "{e}");
    }
}
