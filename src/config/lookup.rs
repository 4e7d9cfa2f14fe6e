//! Reading one variable through its typed handle ([`vars::Var`]): the
//! handle's kind picks the reader, so a number is always read with its
//! range and a word with its setting's `FromStr`.

use std::num::NonZeroU32;
use std::str::FromStr;
use std::time::Duration;

use super::error::ConfigError;
use super::vars::{DefaultValue, Flag, Optional, Text, Var, Whole, Word};

/// The lookup function given to [`super::Config::from_lookup`], read by handle.
pub(super) struct Lookup<'a>(pub(super) &'a dyn Fn(&str) -> Option<String>);

impl Lookup<'_> {
    /// The value as set: trimmed, `None` when unset or empty.
    fn raw<K>(&self, var: &Var<K>) -> Option<String> {
        (self.0)(var.name())
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    }

    /// Whether the variable is set (to something other than blanks).
    pub(super) fn is_set<K>(&self, var: &Var<K>) -> bool {
        self.raw(var).is_some()
    }

    /// The value, or the row's default when unset.
    fn or_default<K>(&self, var: &Var<K>) -> String {
        self.raw(var).unwrap_or_else(|| match var.row.default {
            DefaultValue::Value(default) => default.to_owned(),
            DefaultValue::Unset(_) => String::new(),
        })
    }

    /// A variable that may be unset.
    pub(super) fn optional(&self, var: &Var<Optional>) -> Option<String> {
        self.raw(var)
    }

    /// Text, or its default.
    pub(super) fn text(&self, var: &Var<Text>) -> String {
        self.or_default(var)
    }

    /// A whole number in the handle's range. Every numeric setting has one:
    /// a value outside it stops the start, naming the variable, so no value
    /// can make a later request overflow.
    pub(super) fn number(&self, var: &Var<Whole>) -> Result<u64, ConfigError> {
        let Whole { min, max } = var.kind;
        ranged_number(var.name(), &self.or_default(var), min, max)
    }

    /// A daily ceiling: a number that is not 0.
    pub(super) fn limit(&self, var: &Var<Whole>) -> Result<NonZeroU32, ConfigError> {
        NonZeroU32::new(self.number(var)? as u32)
            .ok_or_else(|| ConfigError::new(var.name(), "must be above 0"))
    }

    /// A count that fits `u32` (every such range ends at [`super::vars::MAX_LIMIT`]).
    pub(super) fn count(&self, var: &Var<Whole>) -> Result<u32, ConfigError> {
        Ok(self.number(var)? as u32)
    }

    /// A number of milliseconds.
    pub(super) fn millis(&self, var: &Var<Whole>) -> Result<Duration, ConfigError> {
        self.number(var).map(Duration::from_millis)
    }

    pub(super) fn flag(&self, var: &Var<Flag>) -> Result<bool, ConfigError> {
        match self.or_default(var).to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => Ok(true),
            "false" | "0" | "no" | "off" => Ok(false),
            other => Err(ConfigError::new(
                var.name(),
                format!("expected true or false, got {other:?}"),
            )),
        }
    }

    /// One of the words of the setting `T`.
    pub(super) fn word<T: FromStr<Err = String>>(
        &self,
        var: &Var<Word<T>>,
    ) -> Result<T, ConfigError> {
        self.or_default(var)
            .parse()
            .map_err(|problem| ConfigError::new(var.name(), problem))
    }
}

/// Parses a whole number in `min..=max` for the variable `var`.
pub fn ranged_number(var: &'static str, raw: &str, min: u64, max: u64) -> Result<u64, ConfigError> {
    let expected = || format!("expected a whole number in {min}..={max}, got {raw:?}");
    let n: u64 = raw
        .trim()
        .parse()
        .map_err(|_| ConfigError::new(var, expected()))?;
    if (min..=max).contains(&n) {
        Ok(n)
    } else {
        Err(ConfigError::new(var, expected()))
    }
}
