//! The quota and what happens past it: the settings the decision, the delay and pacing read.

use std::num::NonZeroU32;
use std::time::Duration;

use serde::Deserialize;

use super::env::{Env, millis, parsed};
use super::error::ConfigError;
use super::vars::{QUOTA_NETWORKS, QUOTA_TOKEN_NETWORKS, Variable};
use crate::rules::decide::Limits;
use crate::rules::level::{AnonBudget, LevelName, Levels};
use crate::rules::modes::{DelayMode, Mode, Pacing, ResetPolicy};
use crate::rules::networks::{NetworkLevel, parse_networks};

/// The quota and what happens past it.
#[derive(Debug, Clone, Deserialize)]
pub struct Policy {
    #[serde(rename = "QUOTA_ANON")]
    pub quota_anon: NonZeroU32,
    #[serde(rename = "QUOTA_TOKEN")]
    pub quota_token: NonZeroU32,
    #[serde(rename = "QUOTA_WARN_AT")]
    pub warn_at: NonZeroU32,
    #[serde(rename = "QUOTA_SOFT_WINDOW")]
    pub soft_window: u32,
    #[serde(rename = "QUOTA_SOFT_DELAY_MS", deserialize_with = "millis")]
    pub soft_delay: Duration,
    #[serde(rename = "QUOTA_HARD_DELAY_MS", deserialize_with = "millis")]
    pub hard_delay: Duration,
    #[serde(rename = "QUOTA_RESET", deserialize_with = "parsed")]
    pub reset: ResetPolicy,
    #[serde(rename = "QUOTA_MODE", deserialize_with = "parsed")]
    pub mode: Mode,
    #[serde(rename = "QUOTA_PACING", deserialize_with = "parsed")]
    pub pacing: Pacing,
    #[serde(rename = "QUOTA_MAX_BACKLOG_MS", deserialize_with = "millis")]
    pub max_backlog: Duration,
    #[serde(rename = "QUOTA_DELAY_MODE", deserialize_with = "parsed")]
    pub delay_mode: DelayMode,
    #[serde(rename = "QUOTA_MAX_ASLEEP")]
    pub max_asleep: u32,
    #[serde(rename = "QUOTA_GATEWAY_TIMEOUT_MS", deserialize_with = "millis")]
    pub gateway_timeout: Duration,
    #[serde(rename = "QUOTA_DELAY_MARGIN_MS", deserialize_with = "millis")]
    pub delay_margin: Duration,
    /// Budgets above the subject (`Policy::with_levels`).
    #[serde(skip)]
    pub levels: Levels,
}

/// The levels' variables: their grammar needs the subject's IPv6 prefix, read with the identity.
#[derive(Deserialize)]
pub(super) struct LevelVars {
    #[serde(rename = "QUOTA_NETWORKS")]
    anon_networks: String,
    #[serde(rename = "QUOTA_TOKEN_NETWORKS")]
    token_networks: String,
    #[serde(rename = "QUOTA_ANON_GLOBAL")]
    anon_global: u32,
    #[serde(rename = "QUOTA_ANON_GLOBAL_INTERVAL_MS", deserialize_with = "millis")]
    anon_global_interval: Duration,
}

impl Policy {
    pub(super) fn with_levels(self, env: &Env, ipv6_prefix: u8) -> Result<Self, ConfigError> {
        let vars: LevelVars = env.group()?;
        let networks = |var: &Variable, value: &str, base: NonZeroU32| {
            if env.is_set(var) {
                parse_networks(value, base, ipv6_prefix)
                    .map_err(|why| ConfigError::new(var.name, why))
            } else {
                Ok(default_networks(value, base, ipv6_prefix))
            }
        };
        let levels = Levels {
            anon_networks: networks(&QUOTA_NETWORKS, &vars.anon_networks, self.quota_anon)?,
            token_networks: networks(
                &QUOTA_TOKEN_NETWORKS,
                &vars.token_networks,
                self.quota_token,
            )?,
            anon: NonZeroU32::new(vars.anon_global).map(|limit| AnonBudget {
                limit,
                interval: vars.anon_global_interval,
            }),
        };
        Ok(Self { levels, ..self })
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

    /// The limits a level `name` of ceiling `limit` is decided on ([`Levels::limits`]).
    pub fn level_limits(&self, name: LevelName, limit: NonZeroU32) -> Limits {
        self.levels.limits(name, limit, self.limits(limit))
    }
}

/// The default levels less those a wide `QUOTA_IPV6_PREFIX` leaves no shorter than the subject, so
/// widening it needs no restated levels; a set `QUOTA_NETWORKS` is refused whole instead.
fn default_networks(default: &str, anon: NonZeroU32, ipv6_prefix: u8) -> Vec<NetworkLevel> {
    default
        .split(',')
        .filter_map(|level| parse_networks(level, anon, ipv6_prefix).ok())
        .flatten()
        .collect()
}
