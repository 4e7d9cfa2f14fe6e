//! The scanner's guard (`scan-guard`, run by the consumer in a process group of its own): it runs
//! the scanner (`sh -c`) in a second group and, as a child subreaper (`PR_SET_CHILD_SUBREAPER`),
//! inherits whatever the scanner leaves behind, `setsid` daemons included. However it ends (the
//! scanner exits, the consumer sends `SIGTERM`, or `PR_SET_PDEATHSIG` does when the consumer dies),
//! it kills and reaps them all (`kill_descendants`).

use std::process::ExitCode;

use rustix::io::Errno;
use rustix::process::{
    Pid, Signal, WaitOptions, getpid, getppid, kill_process, kill_process_group,
    set_child_subreaper, wait,
};
use tokio::runtime::Builder;

/// Makes this process not dumpable, so an `--exec` scanner (the same user) cannot read the
/// consumer's `/proc/<pid>/environ` (secrets, AWS credentials) or memory; the scanner, started by
/// `exec`, is dumpable again.
pub fn keep_from_the_scanner() {
    use rustix::process::{DumpableBehavior, set_dumpable_behavior};
    if let Err(e) = set_dumpable_behavior(DumpableBehavior::NotDumpable) {
        tracing::warn!(error = %e, "cannot keep the consumer's environment from its scanners");
    }
}

/// The hidden subcommand's name.
pub const COMMAND: &str = "scan-guard";

/// `quota-gate scan-guard`: not for people; the consumer runs it.
#[derive(Debug, clap::Args)]
pub struct GuardArgs {
    /// The consumer's pid: if the guard's parent is not that process, the consumer is gone.
    #[arg(long)]
    pub parent: i32,
    /// The scanner command, run with `sh -c`.
    pub command: String,
}

/// Kills every descendant of the guard, then exits with `128 + SIGKILL`.
fn kill_all_and_exit(scanner: Option<Pid>) -> ! {
    kill_descendants(scanner);
    std::process::exit(137)
}

/// Kills and reaps every descendant: the scanner's group, then each child and its group until
/// `wait` finds none (orphans are reparented to the guard, so they are children next round).
fn kill_descendants(scanner: Option<Pid>) {
    if let Some(group) = scanner {
        // ESRCH: the group is gone already.
        let _ = kill_process_group(group, Signal::KILL);
    }
    loop {
        for child in children_of(getpid()) {
            let _ = kill_process(child, Signal::KILL);
            // A child that called `setsid` leads a group of its own.
            let _ = kill_process_group(child, Signal::KILL);
        }
        if wait(WaitOptions::empty()).is_err_and(|e| e != Errno::INTR) {
            return; // ECHILD: none left.
        }
    }
}

fn children_of(parent: Pid) -> Vec<Pid> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            (parent_in_stat(&stat)? == parent.as_raw_nonzero().get()).then_some(pid)
        })
        .filter_map(Pid::from_raw)
        .collect()
}

/// The parent pid in a `/proc/<pid>/stat` line, after the command name (which may hold `)`).
fn parent_in_stat(stat: &str) -> Option<i32> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(1)?.parse().ok()
}

/// Runs the scanner under guard until it exits (or the consumer dies).
pub fn run(args: &GuardArgs) -> ExitCode {
    // Armed first, then checked: a consumer that died in between is seen
    // by the pid comparison, one that dies after by the signal.
    let armed = rustix::process::set_parent_process_death_signal(Some(Signal::TERM));
    if armed.is_err() || getppid() != Pid::from_raw(args.parent) {
        std::process::exit(137);
    }
    if let Err(e) = set_child_subreaper(Some(getpid())) {
        return failed(format!("cannot become the scanner's subreaper: {e}"), 125);
    }
    match Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime.block_on(guard(&args.command)),
        Err(e) => failed(e, 125),
    }
}

/// `child`'s pid, until it has been waited for.
pub(super) fn pid_of(child: &tokio::process::Child) -> Option<Pid> {
    Pid::from_raw(i32::try_from(child.id()?).ok()?)
}

/// Says on standard error why the guard cannot run the scanner, and exits with `code`.
fn failed(why: impl std::fmt::Display, code: u8) -> ExitCode {
    eprintln!("quota-gate scan-guard: {why}");
    ExitCode::from(code)
}

async fn guard(command: &str) -> ExitCode {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut hup), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
        signal(SignalKind::interrupt()),
    ) else {
        return failed("cannot handle signals", 125);
    };
    let sh = tokio::process::Command::new("sh")
        .args(["-c", command])
        .process_group(0)
        .spawn();
    let mut scanner = match sh {
        Ok(child) => child,
        Err(e) => return failed(format!("cannot run the scanner: {e}"), 127),
    };
    // The scanner leads its group: its pid is the group's id.
    let group = pid_of(&scanner);
    let code = tokio::select! {
        status = scanner.wait() => status.map_or(125, exit_code),
        _ = term.recv() => kill_all_and_exit(group),
        _ = hup.recv() => kill_all_and_exit(group),
        _ = int.recv() => kill_all_and_exit(group),
    };
    // What it left running in the background goes with it.
    kill_descendants(group);
    ExitCode::from(code)
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

    /// The parent pid is found past a command name holding spaces and `)`.
    #[test]
    fn parent_pid_from_stat() {
        assert_eq!(parent_in_stat("42 (sh) S 7 42 42 0"), Some(7));
        assert_eq!(parent_in_stat("42 (a b) c) R 9 1 1 0"), Some(9));
        assert_eq!(parent_in_stat("42 (sh"), None);
    }
}
