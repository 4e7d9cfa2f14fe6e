//! The idempotency record: pure types shared by the store that keeps it and the rules that read it.
//! Its field names and states are defined once here; a test checks the Lua scripts spell the same.

use uuid::Uuid;

use crate::rules::count::Tally;
use crate::rules::key::IDEMPOTENCY_TTL_SECS;
use crate::rules::unix::{UnixMillis, UnixSecs};

/// What a keyed request leaves in its record before it is counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Claim {
    pub record: String,
    pub scan_id: Uuid,
    /// SHA-256 of the request body, hex: the same key with another body is refused.
    pub fingerprint: String,
    pub received_ms: UnixMillis,
    /// Until when the first request may still be in flight.
    pub lease_until_ms: UnixMillis,
}

/// When a record for a request received at `received` expires (later writes keep the expiry).
pub fn expires_at(received: UnixMillis) -> UnixSecs {
    UnixSecs(received.secs().get() + IDEMPOTENCY_TTL_SECS)
}

words! {
    /// One field of an idempotency record (a Valkey hash).
    RecordField {
        State = "state",
        ScanId = "scanId",
        Fingerprint = "fp",
        Received = "received",
        /// Unix ms until which an attempt holds the key (0: free to take over).
        Until = "until",
        /// The count the claim got (0: not counted).
        Count = "count",
        /// The counter's expiry (unix s) the claim saw.
        ResetAt = "resetAt",
        /// The paced delay (ms), once pacing decided it.
        DelayMs = "delayMs",
        Response = "response",
    }

    /// Where a keyed scan stands.
    #[derive(Default)]
    RecordState {
        /// An attempt holds it (or gave up on it without knowing its outcome).
        #[default]
        Pending = "pending",
        /// The job is queued and the answer saved.
        Done = "done",
    }
}

/// An idempotency record as the store holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub state: RecordState,
    pub scan_id: Uuid,
    pub fingerprint: String,
    pub received_ms: UnixMillis,
    pub lease_until_ms: UnixMillis,
    pub count: u64,
    pub reset_at: UnixSecs,
    pub delay_ms: Option<u64>,
    pub response: Option<String>,
}

impl Record {
    /// The record a claim writes, counted `count`, its counter expiring at `reset_at`.
    pub fn claimed(claim: &Claim, count: u64, reset_at: UnixSecs) -> Self {
        Self {
            state: RecordState::Pending,
            scan_id: claim.scan_id,
            fingerprint: claim.fingerprint.clone(),
            received_ms: claim.received_ms,
            lease_until_ms: claim.lease_until_ms,
            count,
            reset_at,
            delay_ms: None,
            response: None,
        }
    }

    /// A record from a hash's pairs; no valid `scanId` or state is an error, not a fresh identity.
    pub fn from_pairs<'a>(
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, RecordError> {
        let mut record = Self::claimed(&Claim::default(), 0, UnixSecs(0));
        let (mut state, mut scan_id) = (None, None);
        for (name, value) in pairs {
            let Ok(field) = name.parse::<RecordField>() else {
                continue;
            };
            match field {
                RecordField::State => state = value.parse().ok(),
                RecordField::ScanId => scan_id = value.parse().ok(),
                _ => record.set(field, value),
            }
        }
        record.state = state.ok_or(RecordError("no valid state"))?;
        record.scan_id = scan_id.ok_or(RecordError("no valid scanId"))?;
        Ok(record)
    }

    /// Sets fields as [`QuotaStore::update_record`](crate::io::store::QuotaStore::update_record) writes them.
    pub fn apply(&mut self, fields: &[Field]) {
        for (field, value) in fields {
            self.set(*field, value);
        }
    }

    /// Sets one field from its text; a number that does not parse is 0.
    fn set(&mut self, field: RecordField, value: &str) {
        let int = || value.parse::<i64>().unwrap_or(0);
        match field {
            RecordField::State => self.state = value.parse().unwrap_or_default(),
            RecordField::ScanId => self.scan_id = value.parse().unwrap_or(self.scan_id),
            RecordField::Fingerprint => value.clone_into(&mut self.fingerprint),
            RecordField::Received => self.received_ms = UnixMillis(int()),
            RecordField::Until => self.lease_until_ms = UnixMillis(int()),
            RecordField::Count => self.count = u64::try_from(int()).unwrap_or(0),
            RecordField::ResetAt => self.reset_at = UnixSecs(int()),
            RecordField::DelayMs => self.delay_ms = value.parse().ok(),
            RecordField::Response => self.response = Some(value.to_owned()),
        }
    }
}

/// One field of a record and its value, as [`QuotaStore::update_record`](crate::io::store::QuotaStore::update_record) sets it.
pub type Field = (RecordField, String);

/// The answer to a keyed count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claimed {
    /// The key is new: the record is written and the scan counted (at its levels too).
    New(Tally),
    /// The key was seen before: nothing counted; here is its record.
    Existing(Record),
}

/// A hash that is not a valid idempotency record: what is wrong with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("idempotency record: {0}")]
pub struct RecordError(pub &'static str);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::connection::quoted_words as quoted;
    use crate::io::store::valkey::RECORD_SCRIPTS;

    /// The script `name` of [`RECORD_SCRIPTS`].
    fn script(name: &str) -> &'static str {
        RECORD_SCRIPTS
            .iter()
            .find(|(file, _)| *file == name)
            .map(|(_, s)| *s)
            .unwrap_or_else(|| panic!("{name} is not a record script"))
    }

    /// Every script spells the record's fields and states exactly as
    /// `RecordField` and `RecordState` do: a word that is not a command
    /// must be one of them.
    #[test]
    fn scripts_use_the_record_names() {
        let names: Vec<&str> = RecordField::ALL
            .iter()
            .map(|f| f.as_str())
            .chain(RecordState::ALL.iter().map(|s| s.as_str()))
            .collect();
        let mut seen = std::collections::HashSet::new();
        for (file, script) in RECORD_SCRIPTS {
            for word in quoted(script) {
                let command = word.chars().all(|c| c.is_ascii_uppercase());
                // Numbers and the EXAT/EX/NX options are arguments, not names.
                let argument = word.parse::<f64>().is_ok() || word.starts_with('%');
                assert!(
                    command || argument || names.contains(&word),
                    "{file}: '{word}' is not a record field or state"
                );
                seen.insert(word);
            }
        }
        // The claim writes the whole record but its response and delay.
        for field in RecordField::ALL {
            let written_later = matches!(field, RecordField::Response | RecordField::DelayMs);
            assert!(
                written_later || quoted(script("claim.lua")).contains(&field.as_str()),
                "claim.lua does not write {}",
                field.as_str()
            );
        }
        assert!(quoted(script("pace.lua")).contains(&RecordField::DelayMs.as_str()));
        assert!(seen.contains(RecordState::Pending.as_str()));
    }
}
