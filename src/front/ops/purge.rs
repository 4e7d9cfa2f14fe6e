//! `purge`: the seed's mass expiry of every `quota:*` key. A real purge always needs `--yes`, on a
//! terminal or not; `--dry-run` only counts.

use std::time::Instant;

use serde::Serialize;

use super::OpsError;
use super::progress::Progress;
use crate::io::store::valkey::ValkeyStore;

/// Refuses a real purge without `--yes`; `interactive` is whether stdin is a terminal.
pub fn check_consent(dry_run: bool, yes: bool, interactive: bool) -> Result<(), OpsError> {
    if dry_run || yes {
        return Ok(());
    }
    Err(OpsError::Usage(if interactive {
        "purge removes every quota:* key: every client starts afresh. \
         See how many with `quota-gate purge --dry-run`, then run `quota-gate purge --yes`."
            .into()
    } else {
        "refusing to purge without --yes (stdin is not a terminal, so nobody can confirm); \
         add --yes to the command, or --dry-run to only count"
            .into()
    }))
}

/// What a purge did (also its `--json` form).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PurgeReport {
    pub dry_run: bool,
    /// Keys removed, or found in a dry run (an upper bound: SCAN may report a key twice).
    pub keys: u64,
    pub seconds: f64,
}

impl PurgeReport {
    pub fn render(&self) -> String {
        let (n, secs) = (self.keys, self.seconds);
        let keys = if n == 1 { "key" } else { "keys" };
        if self.dry_run {
            format!("dry run: {n} quota:* {keys} would be removed (found in {secs:.1} s)\n")
        } else {
            format!("removed {n} quota:* {keys} in {secs:.1} s\n")
        }
    }
}

/// Purges (or counts) every quota key.
pub async fn purge(
    store: ValkeyStore,
    dry_run: bool,
    progress: Option<Progress>,
) -> Result<PurgeReport, OpsError> {
    let started = Instant::now();
    let result = store.purge(dry_run, progress.as_ref()).await;
    if let Some(p) = &progress {
        p.finish();
    }
    Ok(PurgeReport {
        dry_run,
        keys: result?,
        seconds: started.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--dry-run` or `--yes` proceed; otherwise refused, with the way out named.
    #[test]
    fn consent() {
        assert!(check_consent(true, false, true).is_ok());
        assert!(check_consent(true, false, false).is_ok());
        assert!(check_consent(false, true, true).is_ok());
        assert!(check_consent(false, true, false).is_ok());
        let tty = check_consent(false, false, true).unwrap_err().to_string();
        assert!(tty.contains("--yes") && tty.contains("--dry-run"), "{tty}");
        let pipe = check_consent(false, false, false).unwrap_err().to_string();
        assert!(pipe.contains("--yes"), "{pipe}");
    }
}
