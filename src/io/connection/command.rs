//! The commands the store and the queue build: sized, and scripts as one
//! `EVAL` each.

/// `<name>` as a command with room for `args` arguments of `bytes` bytes in
/// all (the name included), so building it grows no buffer: a command made
/// with [`redis::cmd`] starts empty and doubles its way up (a key of some 80
/// bytes took five allocations, a job ten).
pub fn sized_cmd(name: &str, args: usize, bytes: usize) -> redis::Cmd {
    let mut cmd = redis::Cmd::with_capacity(args, bytes);
    cmd.arg(name);
    cmd
}

/// `EVAL <script> <keys>`: the whole script in one command, which Valkey
/// compiles once and caches. Not `EVALSHA` with a fallback to `EVAL` on
/// `NOSCRIPT`: that is two commands, and a caller that times out after the
/// first never sends the second. A late claim would then never land while
/// the refund sent after it would, taking back a count that was never made.
/// One command each keeps "sent" meaning "will run, in order".
pub fn eval(script: &str, keys: &[&str]) -> redis::Cmd {
    // Room for the keys and for some 200 bytes of arguments after them.
    let bytes = script.len() + keys.iter().map(|k| k.len()).sum::<usize>() + 256;
    let mut cmd = sized_cmd("EVAL", keys.len() + 10, bytes);
    cmd.arg(script).arg(keys.len()).arg(keys);
    cmd
}

/// `WAIT <replicas> <ms>`: blocks the connection until `replicas` replicas
/// acknowledged every write sent on it before, or half the connection's
/// `timeout` passed; answers how many did. Sent right behind the write it
/// guards (`VALKEY_WAIT_REPLICAS`), in the same pipeline where it can be.
pub fn wait(replicas: u32, timeout: std::time::Duration) -> redis::Cmd {
    let mut cmd = redis::cmd("WAIT");
    cmd.arg(replicas)
        .arg(crate::rules::unix::duration_ms(timeout / 2).max(1));
    cmd
}

/// The quoted words of a Lua script (`'job'`, `'SET'`), comments skipped:
/// what the tests compare with the names Rust defines once.
#[cfg(test)]
pub(crate) fn quoted_words(script: &str) -> Vec<&str> {
    script
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .flat_map(|l| l.split('\'').skip(1).step_by(2))
        .collect()
}
