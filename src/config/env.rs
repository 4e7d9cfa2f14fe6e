//! The environment as serde reads it: each variable mapped to its value or default, numbers checked
//! against their ranges; a value a field refuses is an error naming the variable.

use std::str::FromStr;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{DeserializeOwned, Deserializer, Error as _};
use serde_json::{Map, Value};

use super::error::ConfigError;
use super::vars::{Applies, DefaultValue, VARIABLES, Variable};

#[derive(Default)]
pub(super) struct Env {
    values: Map<String, Value>,
    /// The variables set (to something other than blanks).
    set: Vec<&'static str>,
}

impl Env {
    /// Reads every row but the logger's through `lookup`; empty values count as unset.
    pub(super) fn read(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut env = Self::default();
        for var in VARIABLES.iter().filter(|v| v.applies != Applies::Logging) {
            let raw = lookup(var.name).map(|v| v.trim().to_owned());
            let raw = match (raw.filter(|v| !v.is_empty()), var.default) {
                (Some(value), _) => {
                    env.set.push(var.name);
                    value
                }
                (None, DefaultValue::Value(default)) => default.to_owned(),
                (None, DefaultValue::Unset(_)) => continue,
            };
            // Checked once here, so no value can make a later request overflow.
            let value = match var.range {
                Some((min, max)) => match raw.parse() {
                    Ok(n) if (min..=max).contains(&n) => Value::from(n),
                    _ => {
                        let problem =
                            format!("expected a whole number in {min}..={max}, got {raw:?}");
                        return Err(ConfigError::new(var.name, problem));
                    }
                },
                None => Value::String(raw),
            };
            env.values.insert(var.name.to_owned(), value);
        }
        Ok(env)
    }

    pub(super) fn is_set(&self, var: &Variable) -> bool {
        self.set.contains(&var.name)
    }

    pub(super) fn group<T: DeserializeOwned>(&self) -> Result<T, ConfigError> {
        let map = serde_json::Value::Object(self.values.clone());
        serde_path_to_error::deserialize(map).map_err(|e| {
            let path = e.path().to_string();
            let var = VARIABLES.iter().find(|v| v.name == path);
            ConfigError::new(
                var.map_or("configuration", |v| v.name),
                e.into_inner().to_string(),
            )
        })
    }
}

pub(super) fn millis<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    u64::deserialize(d).map(Duration::from_millis)
}

/// `true` or `false` (also `1`/`0`, `yes`/`no`, `on`/`off`).
pub(super) fn flag<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    match String::deserialize(d)?.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        other => Err(D::Error::custom(format!(
            "expected true or false, got {other:?}"
        ))),
    }
}

pub(super) fn parsed<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr<Err = String>,
{
    String::deserialize(d)?.parse().map_err(D::Error::custom)
}
