//! The scanner's guard: what makes an `--exec` scanner die with its
//! consumer, whatever way the consumer ends.
//!
//! The consumer does not run `sh -c <command>` itself. It runs this
//! binary's hidden `scan-guard` command in a **process group of its own**,
//! and the guard runs the scanner as its child, in that same group. So:
//!
//! - to stop a scan (its `--scan-timeout`, a lost lease, the end of
//!   `--grace`), the consumer kills the whole group with `SIGKILL`, which
//!   reaches the scanner's children and grandchildren too, not only the
//!   `sh` wrapper, and then waits for the guard before it lets the job go;
//! - when the consumer dies without a word (`SIGKILL`, OOM, a panic with
//!   `panic = "abort"`), the kernel sends the guard `SIGTERM`
//!   (`PR_SET_PDEATHSIG`), and the guard kills its group, itself included.
//!   A consumer that died before the guard armed that signal is caught by
//!   comparing the parent pid it was given with the one it has.
//!
//! The guard passes the scanner's exit status on (`128 + n` for a signal),
//! and its standard input, output and environment are the scanner's.

use std::process::ExitCode;

use rustix::process::{Pid, Signal, getpgrp, getppid, kill_process_group};

/// The hidden subcommand's name.
pub const COMMAND: &str = "scan-guard";

/// `quota-gate scan-guard`: not for people; the consumer runs it.
#[derive(Debug, clap::Args)]
pub struct GuardArgs {
    /// The consumer's pid: if the guard's parent is not that process any
    /// more, the consumer is gone already.
    #[arg(long)]
    pub parent: i32,
    /// The scanner command, run with `sh -c`.
    pub command: String,
}

/// Kills every process of the guard's group, the guard too.
fn kill_own_group() -> ! {
    let _ = kill_process_group(getpgrp(), Signal::KILL);
    // Unreachable unless the kill was refused.
    std::process::exit(137)
}

/// Runs the scanner under guard until it exits (or the consumer dies).
pub fn run(args: &GuardArgs) -> ExitCode {
    // Armed first, then checked: a consumer that died in between is seen
    // by the pid comparison, one that dies after by the signal.
    let armed = rustix::process::set_parent_process_death_signal(Some(Signal::TERM));
    if armed.is_err() || getppid() != Pid::from_raw(args.parent) {
        kill_own_group();
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("quota-gate scan-guard: {e}");
            return ExitCode::from(125);
        }
    };
    runtime.block_on(guard(&args.command))
}

async fn guard(command: &str) -> ExitCode {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut hup), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
        signal(SignalKind::interrupt()),
    ) else {
        eprintln!("quota-gate scan-guard: cannot handle signals");
        return ExitCode::from(125);
    };
    let mut scanner = match tokio::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            eprintln!("quota-gate scan-guard: cannot run the scanner: {e}");
            return ExitCode::from(127);
        }
    };
    tokio::select! {
        status = scanner.wait() => match status {
            Ok(status) => ExitCode::from(exit_code(status)),
            Err(_) => ExitCode::from(125),
        },
        _ = term.recv() => kill_own_group(),
        _ = hup.recv() => kill_own_group(),
        _ = int.recv() => kill_own_group(),
    }
}

/// The scanner's exit status as one byte: its code, or `128 + signal`.
fn exit_code(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    let code = status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(125);
    u8::try_from(code).unwrap_or(125)
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;

    use super::*;

    /// Codes pass through; a signal becomes 128 + its number.
    #[test]
    fn exit_codes() {
        let code = |raw| exit_code(std::process::ExitStatus::from_raw(raw));
        assert_eq!(code(0), 0);
        assert_eq!(code(3 << 8), 3);
        assert_eq!(code(9), 137);
        assert_eq!(code(15), 143);
    }
}
