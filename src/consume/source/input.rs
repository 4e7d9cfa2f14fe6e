//! Standard input's lines, read so that a stopping consumer can always exit
//! and never loses a line it took.
//!
//! Tokio's own `stdin` reads in a thread of the runtime's blocking pool: a
//! read that cannot be cancelled, and that the runtime waits for when it
//! shuts down. A consumer told to stop therefore stayed alive until one more
//! line came, and that line, taken from the pipe, went nowhere. Instead:
//!
//! - **A pipe or FIFO** (the spool: `serve | consume`, `< fifo`) is opened
//!   again through `/proc/self/fd/0`, a file description of the consumer's
//!   own (so `O_NONBLOCK` is set on it, not on the one a shell may share),
//!   and read without blocking on the runtime's reactor. A read takes only
//!   what the pipe holds at that moment, and [`Input::next_line`] is
//!   cancel-safe (a partial line stays buffered here). Once the consumer
//!   stops asking, nothing more leaves the pipe: every line taken is in the
//!   consumer's hands, and the process exits at once; what the pipe still
//!   holds was never taken.
//! - **Anything else** (a file, a terminal, a socket) is read by a thread of
//!   its own, outside the runtime, which never keeps the process alive. A
//!   file ends by itself; a line that reaches a terminal or a socket after
//!   [`Input::close`] may be read by that thread: it is written back to
//!   standard output (best effort: the process may be exiting) and logged.

use std::io::{self, BufRead};

use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::net::unix::pipe;
use tokio::sync::mpsc;

/// Standard input, as a path that opens a new file description of it.
const OWN_STDIN: &str = "/proc/self/fd/0";

/// Where standard input's lines come from.
pub enum Input {
    /// A pipe or FIFO, read without blocking.
    Pipe(Lines<BufReader<pipe::Receiver>>),
    /// Anything else, read by a thread; `None` once it ended.
    Thread(mpsc::Receiver<io::Result<String>>),
}

impl Input {
    /// Standard input. Must be called within the runtime (a pipe registers
    /// with its reactor).
    pub fn stdin() -> Self {
        match pipe::OpenOptions::new().open_receiver(OWN_STDIN) {
            Ok(rx) => Self::Pipe(BufReader::new(rx).lines()),
            Err(_) => Self::thread(),
        }
    }

    /// Standard input read by a thread of its own.
    fn thread() -> Self {
        let (tx, rx) = mpsc::channel(1);
        let spawned = std::thread::Builder::new()
            .name("stdin".into())
            .spawn(move || read_into(io::stdin().lock(), &tx));
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the thread that reads standard input");
        }
        Self::Thread(rx)
    }

    /// The next line (without its `\n` or `\r\n`); `None` at the end.
    /// Cancel-safe: a line is either returned or still to come.
    pub async fn next_line(&mut self) -> io::Result<Option<String>> {
        match self {
            Self::Pipe(lines) => lines.next_line().await,
            Self::Thread(rx) => rx.recv().await.transpose(),
        }
    }

    /// No more lines are taken: a reading thread's next one is logged, not
    /// handed out (a pipe is simply not read again).
    pub fn close(&mut self) {
        if let Self::Thread(rx) = self {
            rx.close();
        }
    }
}

/// Sends `input`'s lines to `tx` until the end, an error, or `tx`'s receiver
/// is closed.
fn read_into(mut input: impl BufRead, tx: &mpsc::Sender<io::Result<String>>) {
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let line = match input.read_until(b'\n', &mut buf) {
            Ok(0) => return,
            Ok(_) => Ok(text(&buf)),
            Err(e) => Err(e),
        };
        let failed = line.is_err();
        if let Err(mpsc::error::SendError(Ok(line))) = tx.blocking_send(line) {
            write_back(line);
            return;
        }
        if failed {
            return;
        }
    }
}

/// A line read after the consumer stopped taking lines: written back to
/// standard output (not journaled), so it is not silently dropped.
fn write_back(line: String) {
    let mut bytes = line.into_bytes();
    bytes.push(b'\n');
    let written = crate::stdout::LineWriter::stdout().try_line(bytes).is_ok();
    tracing::error!(
        written_back = written,
        "a line read from standard input after stopping was not handed out"
    );
}

/// `buf` without its line ending, as text (invalid UTF-8 replaced: such a
/// line is no job anyway).
fn text(buf: &[u8]) -> String {
    let line = buf.strip_suffix(b"\n").unwrap_or(buf);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    String::from_utf8_lossy(line).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread's lines arrive in order without their endings, then the end.
    #[tokio::test]
    async fn thread_lines() {
        let (tx, rx) = mpsc::channel(1);
        let input: &[u8] = b"a\r\nb\nc";
        std::thread::spawn(move || read_into(input, &tx));
        let mut input = Input::Thread(rx);
        for want in ["a", "b", "c"] {
            assert_eq!(input.next_line().await.unwrap().as_deref(), Some(want));
        }
        assert_eq!(input.next_line().await.unwrap(), None);
    }
}
