//! The quota and what happens past it: the settings [`crate::rules::decide`],
//! [`crate::rules::delay`] and pacing read.

use std::num::NonZeroU32;
use std::time::Duration;

use super::error::ConfigError;
use super::lookup::Lookup;
use super::vars;
use crate::rules::decide::Limits;
use crate::rules::level::{AnonBudget, LevelName, Levels};
use crate::rules::modes::{DelayMode, Mode, Pacing, ResetPolicy};
use crate::rules::networks::{NetworkLevel, parse_networks};

/// The quota and what happens past it.
#[derive(Debug, Clone)]
pub struct Policy {
    pub quota_anon: NonZeroU32,
    pub quota_token: NonZeroU32,
    pub warn_at: NonZeroU32,
    pub soft_window: u32,
    pub soft_delay: Duration,
    pub hard_delay: Duration,
    pub reset: ResetPolicy,
    /// `enforce` or `shadow` (`QUOTA_MODE`).
    pub mode: Mode,
    pub pacing: Pacing,
    /// The longest delay a paced scan may be given; beyond it, 503 `backlog_full`.
    pub max_backlog: Duration,
    pub delay_mode: DelayMode,
    /// Requests asleep at once across every gate process (`QUOTA_MAX_ASLEEP`).
    pub max_asleep: u32,
    pub gateway_timeout: Duration,
    pub delay_margin: Duration,
    /// Budgets above the subject (`QUOTA_NETWORKS`, `QUOTA_ANON_GLOBAL`).
    pub levels: Levels,
}

impl Policy {
    /// The quota and its delays.
    pub(super) fn from_vars(env: &Lookup) -> Result<Self, ConfigError> {
        Ok(Self {
            quota_anon: env.limit(&vars::QUOTA_ANON)?,
            quota_token: env.limit(&vars::QUOTA_TOKEN)?,
            warn_at: env.limit(&vars::QUOTA_WARN_AT)?,
            soft_window: env.count(&vars::QUOTA_SOFT_WINDOW)?,
            soft_delay: env.millis(&vars::QUOTA_SOFT_DELAY_MS)?,
            hard_delay: env.millis(&vars::QUOTA_HARD_DELAY_MS)?,
            reset: env.word(&vars::QUOTA_RESET)?,
            mode: env.word(&vars::QUOTA_MODE)?,
            pacing: env.word(&vars::QUOTA_PACING)?,
            max_backlog: env.millis(&vars::QUOTA_MAX_BACKLOG_MS)?,
            delay_mode: env.word(&vars::QUOTA_DELAY_MODE)?,
            max_asleep: env.count(&vars::QUOTA_MAX_ASLEEP)?,
            gateway_timeout: env.millis(&vars::QUOTA_GATEWAY_TIMEOUT_MS)?,
            delay_margin: env.millis(&vars::QUOTA_DELAY_MARGIN_MS)?,
            levels: Levels::default(),
        })
    }

    /// The levels above the subject, whose grammar needs the subject's
    /// IPv6 prefix (read with the identity): read after both.
    pub(super) fn with_levels(self, env: &Lookup, ipv6_prefix: u8) -> Result<Self, ConfigError> {
        let networks = |var: &vars::Var<vars::Text>, base: NonZeroU32| {
            if env.is_set(var) {
                parse_networks(&env.text(var), base, ipv6_prefix)
                    .map_err(|why| ConfigError::new(var.name(), why))
            } else {
                Ok(default_networks(&env.text(var), base, ipv6_prefix))
            }
        };
        let anon_networks = networks(&vars::QUOTA_NETWORKS, self.quota_anon)?;
        let token_networks = networks(&vars::QUOTA_TOKEN_NETWORKS, self.quota_token)?;
        let interval = env.millis(&vars::QUOTA_ANON_GLOBAL_INTERVAL_MS)?;
        let anon = std::num::NonZeroU32::new(env.count(&vars::QUOTA_ANON_GLOBAL)?)
            .map(|limit| AnonBudget { limit, interval });
        Ok(Self {
            levels: Levels {
                anon_networks,
                token_networks,
                anon,
            },
            ..self
        })
    }

    /// The limits for a subject whose daily ceiling is `limit`.
    pub fn limits(&self, limit: NonZeroU32) -> Limits {
        Limits {
            limit,
            soft_window: self.soft_window,
            soft_delay: self.soft_delay,
            hard_delay: self.hard_delay,
            warn_at: self.warn_at,
        }
    }

    /// The limits a level's counter is decided on, for a level `name` of
    /// ceiling `limit` ([`Levels::limits`]).
    pub fn level_limits(&self, name: LevelName, limit: NonZeroU32) -> Limits {
        self.levels.limits(name, limit, self.limits(limit))
    }
}

/// The default levels, less those a wide `QUOTA_IPV6_PREFIX` leaves no
/// shorter than the subject (a /48 subject has no /56 or /48 above it): an
/// operator who widens the subject does not have to restate the levels. A
/// `QUOTA_NETWORKS` that is set is held to its grammar, and refused whole.
fn default_networks(default: &str, anon: NonZeroU32, ipv6_prefix: u8) -> Vec<NetworkLevel> {
    default
        .split(',')
        .filter_map(|level| parse_networks(level, anon, ipv6_prefix).ok())
        .flatten()
        .collect()
}
