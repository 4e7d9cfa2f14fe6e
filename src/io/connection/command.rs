//! The commands the store and the queue build: sized, and scripts as one `EVAL` each.

/// `<name>` as a command with room for `args` arguments of `bytes` bytes in all (the name
/// included), so building it grows no buffer.
pub fn sized_cmd(name: &str, args: usize, bytes: usize) -> redis::Cmd {
    let mut cmd = redis::Cmd::with_capacity(args, bytes);
    cmd.arg(name);
    cmd
}

/// `EVAL <script> <keys>`, which Valkey compiles once and caches. Not `EVALSHA` with an `EVAL`
/// fallback on `NOSCRIPT`: a caller timing out between the two would lose a claim whose refund
/// still lands. One command each keeps "sent" meaning "will run, in order".
pub fn eval(script: &str, keys: &[&str]) -> redis::Cmd {
    // Room for the keys and for some 200 bytes of arguments after them.
    let bytes = script.len() + keys.iter().map(|k| k.len()).sum::<usize>() + 256;
    let mut cmd = sized_cmd("EVAL", keys.len() + 10, bytes);
    cmd.arg(script).arg(keys.len()).arg(keys);
    cmd
}

/// `WAIT <replicas> <ms>`: blocks the connection until `replicas` replicas acknowledged every
/// earlier write on it, or half its `timeout` passed; answers how many did.
pub fn wait(replicas: u32, timeout: std::time::Duration) -> redis::Cmd {
    let mut cmd = redis::cmd("WAIT");
    cmd.arg(replicas)
        .arg(crate::rules::unix::duration_ms(timeout / 2).max(1));
    cmd
}

#[cfg(test)]
pub(crate) use tests::quoted_words;

#[cfg(test)]
mod tests {
    /// The quoted words of a Lua script, comments skipped, for tests against the Rust names.
    pub(crate) fn quoted_words(script: &str) -> Vec<&str> {
        script
            .lines()
            .filter(|l| !l.trim_start().starts_with("--"))
            .flat_map(|l| l.split('\'').skip(1).step_by(2))
            .collect()
    }
}
