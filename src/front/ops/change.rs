//! `grant` and `reset` of one client. Nothing printed or logged names its address or token.

use serde::Serialize;

use super::OpsError;
use super::subject::Subject;
use crate::config::ResetPolicy;
use crate::io::store::grant_period_end;
use crate::io::store::valkey::ValkeyStore;
use crate::rules::unix::UnixSecs;

/// What `reset` removed (also its `--json` form).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Removal {
    /// The subject's counter; its other keys share its prefix.
    pub key: String,
    /// How many of its keys existed.
    pub removed: u64,
}

impl Removal {
    pub fn render(&self) -> String {
        self.render_of(
            "counter, first-seen, pacing slot, grant, idempotency records",
            "the next scan",
        )
    }

    /// The human form, naming the `keys` a key removed may be and whose `next` scan counts 1.
    pub(super) fn render_of(&self, keys: &str, next: &str) -> String {
        let (n, key) = (self.removed, &self.key);
        let plural = if n == 1 { "" } else { "s" };
        match n {
            0 => format!("nothing to remove: no key of {key} exists\n"),
            n => format!("removed {n} key{plural} of {key} ({keys}); {next} counts 1\n"),
        }
    }
}

/// The most scans one grant may give.
pub const MAX_GRANT: u64 = 1_000_000;

/// What `grant` did (also its `--json` form).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Granted {
    pub key: String,
    /// The extra scans the subject now has this period (0 after `--revoke`).
    pub scans: u64,
    /// RFC 3339, UTC; `None` after `--revoke` or for a grant made before the period's first scan.
    pub expires_at: Option<String>,
    /// `--revoke` only: whether there was a grant.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revoked: Option<bool>,
}

impl Granted {
    /// `scans` granted to `key` until `at` (`None`: the end of the period the next scan opens);
    /// 0 scans is a revoke, `revoked` whether there was a grant.
    pub(super) fn new(key: String, scans: u64, at: Option<UnixSecs>, revoked: bool) -> Self {
        Self {
            key,
            scans,
            expires_at: at.filter(|_| scans > 0).map(super::rfc3339),
            revoked: (scans == 0).then_some(revoked),
        }
    }

    pub fn render(&self) -> String {
        let (n, key) = (self.scans, &self.key);
        let plural = if n == 1 { "" } else { "s" };
        let granted = format!("granted {n} extra scan{plural} to {key}");
        match (self.revoked, &self.expires_at) {
            (Some(true), _) => format!("revoked the grant of {key}\n"),
            (Some(false), _) => format!("nothing to revoke: {key} has no grant\n"),
            (None, Some(at)) => format!("{granted} until {at} (replaces any earlier grant)\n"),
            (None, None) => format!(
                "{granted} until the end of the period its next scan opens (no scan yet this \
                 period; replaces any earlier grant)\n"
            ),
        }
    }
}

/// Checks a grant's size.
pub fn check_scans(scans: u64) -> Result<u64, OpsError> {
    if (1..=MAX_GRANT).contains(&scans) {
        Ok(scans)
    } else {
        Err(OpsError::Usage(format!(
            "--scans {scans}: give 1 to {MAX_GRANT} extra scans (use --revoke to take a grant back)"
        )))
    }
}

/// Gives a client `scans` extra scans for the current period (0 revokes). Before the period's first
/// scan the grant expires when the period ends under `reset`, if known.
pub async fn grant(
    store: &ValkeyStore,
    subject: &Subject,
    scans: u64,
    reset: ResetPolicy,
) -> Result<Granted, OpsError> {
    let key = subject.key.counter.clone();
    if scans == 0 {
        let revoked = store.revoke(&subject.key).await?;
        tracing::info!(scope = %subject.scope, revoked, "quota grant revoked");
        return Ok(Granted::new(key, 0, None, revoked));
    }
    let at = store
        .grant(&subject.key, scans, grant_period_end(reset, super::now()))
        .await?;
    tracing::info!(scope = %subject.scope, scans, "quota grant set");
    Ok(Granted::new(key, scans, at, false))
}

/// Removes every key of a client.
pub async fn reset(store: &ValkeyStore, subject: &Subject) -> Result<Removal, OpsError> {
    let removed = store.reset(&subject.key).await?;
    Ok(Removal {
        key: subject.key.counter.clone(),
        removed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--revoke` says whether there was a grant to take back.
    #[test]
    fn revoke_says_what_it_did() {
        let g = |revoked| Granted {
            key: "quota:ip:{d}".into(),
            scans: 0,
            expires_at: None,
            revoked: Some(revoked),
        };
        assert!(g(true).render().starts_with("revoked the grant"));
        assert!(g(false).render().starts_with("nothing to revoke"));
    }

    /// A grant is 1 to 1,000,000 scans, with a clear error otherwise.
    #[test]
    fn grant_size() {
        assert_eq!(check_scans(1).unwrap(), 1);
        assert_eq!(check_scans(MAX_GRANT).unwrap(), MAX_GRANT);
        for bad in [0, MAX_GRANT + 1] {
            let e = check_scans(bad).unwrap_err().to_string();
            assert!(e.contains("1 to 1000000"), "{e}");
        }
    }
}
