//! Standard input's lines, read so that a stopping consumer can always exit and loses no line it
//! took (Tokio's own `stdin` blocks in a thread that shutdown waits for).
//!
//! A pipe or FIFO is opened again through `/proc/self/fd/0` (a file description of its own, so
//! `O_NONBLOCK` does not reach one a shell shares) and read on the reactor, cancel-safe; anything
//! else is read by a thread outside the runtime, holding at most one line besides the one waiting.
//! [`Input::close`] returns every line taken and not handed out; only a pipe's line whose end does
//! not come within the wait loses its start (its rest stays in the pipe).

use std::io::{self, BufRead};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::net::unix::pipe;
use tokio::sync::mpsc;

use crate::consume::sync::lock;

/// Standard input, as a path that opens a new file description of it.
const OWN_STDIN: &str = "/proc/self/fd/0";

/// Where standard input's lines come from.
pub enum Input {
    /// A pipe or FIFO, read without blocking.
    Pipe(PipeLines),
    /// Anything else, read by a thread.
    Thread(ThreadLines),
}

/// A pipe's lines: what was taken and not handed out is in `reader`'s buffer and `partial`.
pub struct PipeLines {
    reader: BufReader<pipe::Receiver>,
    /// The start of the line being read (a read cut short leaves it here).
    partial: Vec<u8>,
}

/// The lines a thread reads.
pub struct ThreadLines {
    rx: mpsc::Receiver<io::Result<String>>,
    hand: Arc<Mutex<Hand>>,
    /// None if it could not be started.
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What the reading thread and [`Input::close`] agree on.
#[derive(Default)]
struct Hand {
    /// [`Input::close`] has taken `back`: a line the thread reads from now on it writes back.
    closed: bool,
    /// The line the thread held when the channel closed.
    back: Option<String>,
}

impl Input {
    /// Standard input. Must be called within the runtime (a pipe registers with its reactor).
    pub fn stdin() -> Self {
        match pipe::OpenOptions::new().open_receiver(OWN_STDIN) {
            Ok(rx) => Self::Pipe(PipeLines {
                reader: BufReader::new(rx),
                partial: Vec::new(),
            }),
            Err(_) => Self::thread(|| io::stdin().lock()),
        }
    }

    fn thread<R: BufRead>(open: impl FnOnce() -> R + Send + 'static) -> Self {
        let (tx, rx) = mpsc::channel(1);
        let hand = Arc::new(Mutex::new(Hand::default()));
        let theirs = hand.clone();
        let spawned = std::thread::Builder::new()
            .name("stdin".into())
            .spawn(move || read_into(open(), &tx, &theirs));
        let failed = |e: &_| {
            tracing::error!(error = %e, "cannot start the thread that reads standard input");
        };
        let thread = spawned.inspect_err(failed).ok();
        Self::Thread(ThreadLines { rx, hand, thread })
    }

    /// The next line (without its `\n` or `\r\n`); `None` at the end. Cancel-safe.
    pub async fn next_line(&mut self) -> io::Result<Option<String>> {
        match self {
            Self::Pipe(pipe) => pipe.next_line().await,
            Self::Thread(t) => t.rx.recv().await.transpose(),
        }
    }

    /// Stops taking lines and returns those taken and not handed out, waiting at most `wait` for
    /// the end of a started one.
    pub async fn close(&mut self, wait: Duration) -> Vec<String> {
        match self {
            Self::Pipe(pipe) => pipe.close(wait).await,
            Self::Thread(t) => t.close(wait).await,
        }
    }
}

impl PipeLines {
    async fn next_line(&mut self) -> io::Result<Option<String>> {
        let n = self.reader.read_until(b'\n', &mut self.partial).await?;
        if n == 0 && self.partial.is_empty() {
            return Ok(None);
        }
        let line = text(&self.partial);
        self.partial.clear();
        Ok(Some(line))
    }

    async fn close(&mut self, wait: Duration) -> Vec<String> {
        let mut taken = std::mem::take(&mut self.partial);
        let buffered = self.reader.buffer().len();
        taken.extend_from_slice(self.reader.buffer());
        self.reader.consume(buffered);
        let whole = taken.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        if whole < taken.len() {
            let finish = finish_line(self.reader.get_mut(), &mut taken);
            if !matches!(tokio::time::timeout(wait, finish).await, Ok(Ok(()))) {
                tracing::error!(
                    bytes = taken.len() - whole,
                    "stopped in the middle of a line from standard input: its start was dropped, its rest left in the pipe"
                );
                taken.truncate(whole);
            }
        }
        taken.split_inclusive(|b| *b == b'\n').map(text).collect()
    }
}

/// Reads the rest of `line` byte by byte, so nothing after its `\n` is taken. Cancel-safe.
async fn finish_line(rx: &mut pipe::Receiver, line: &mut Vec<u8>) -> io::Result<()> {
    let mut byte = [0u8];
    while rx.read(&mut byte).await? > 0 {
        line.push(byte[0]);
        if byte[0] == b'\n' {
            break;
        }
    }
    Ok(())
}

impl ThreadLines {
    async fn close(&mut self, wait: Duration) -> Vec<String> {
        self.rx.close();
        let mut lines = Vec::new();
        let ended = async {
            while let Some(line) = self.rx.recv().await {
                match line {
                    Ok(line) => lines.push(line),
                    Err(e) => tracing::warn!(error = %e, "cannot read standard input"),
                }
            }
            while self.thread.as_ref().is_some_and(|t| !t.is_finished()) {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        let _ = tokio::time::timeout(wait, ended).await;
        let mut hand = lock(&self.hand);
        hand.closed = true;
        lines.extend(hand.back.take());
        lines
    }
}

/// Sends `input`'s lines to `tx` until the end, an error, or `tx`'s receiver is closed; a line it
/// then holds goes to `hand` (or, once [`Input::close`] took that, is written back).
fn read_into(mut input: impl BufRead, tx: &mpsc::Sender<io::Result<String>>, hand: &Mutex<Hand>) {
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let line = match input.read_until(b'\n', &mut buf) {
            Ok(0) => return,
            read => read.map(|_| text(&buf)),
        };
        let failed = line.is_err();
        if let Err(mpsc::error::SendError(Ok(line))) = tx.blocking_send(line) {
            let mut hand = lock(hand);
            if hand.closed {
                drop(hand);
                // Read after the consumer stopped taking lines: written back (not journaled).
                let written_back = write_back_line(line);
                tracing::error!(
                    written_back,
                    "a line read from standard input after stopping was not handed out"
                );
            } else {
                hand.back = Some(line);
            }
            return;
        }
        if failed {
            return;
        }
    }
}

/// `line` written back to stdout, to be piped in again; false if the stdout queue was full.
pub(super) fn write_back_line(line: String) -> bool {
    let mut bytes = line.into_bytes();
    bytes.push(b'\n');
    crate::io::stdout::LineWriter::stdout()
        .try_line(bytes)
        .is_ok()
}

/// `buf` without its line ending, as text (invalid UTF-8 replaced: such a line is no job anyway).
fn text(buf: &[u8]) -> String {
    let line = buf.strip_suffix(b"\n").unwrap_or(buf);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    String::from_utf8_lossy(line).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    const WAIT: Duration = Duration::from_millis(200);

    fn pipe_input() -> (pipe::Sender, Input) {
        let (tx, rx) = pipe::pipe().unwrap();
        let input = Input::Pipe(PipeLines {
            reader: BufReader::new(rx),
            partial: Vec::new(),
        });
        (tx, input)
    }

    /// The bytes the pipe still holds once `tx` is dropped.
    async fn left_in(input: Input, tx: pipe::Sender) -> Vec<u8> {
        drop(tx);
        let Input::Pipe(mut pipe) = input else {
            unreachable!()
        };
        let mut left = Vec::new();
        pipe.reader.get_mut().read_to_end(&mut left).await.unwrap();
        left
    }

    /// A thread's lines arrive in order without their endings, then the end.
    #[tokio::test]
    async fn thread_lines() {
        let input: &[u8] = b"a\r\nb\nc";
        let mut input = Input::thread(move || input);
        for want in ["a", "b", "c"] {
            assert_eq!(input.next_line().await.unwrap().as_deref(), Some(want));
        }
        assert_eq!(input.next_line().await.unwrap(), None);
    }

    /// Closing a thread's input returns the line in the channel and the
    /// one the thread held: what was handed out and returned is a prefix.
    #[tokio::test]
    async fn thread_close_returns_what_it_took() {
        let text: String = (0..1000).map(|i| format!("{i}\n")).collect();
        let mut input = Input::thread(move || io::Cursor::new(text.into_bytes()));
        assert_eq!(input.next_line().await.unwrap().as_deref(), Some("0"));
        tokio::time::sleep(Duration::from_millis(20)).await;
        let rest = input.close(WAIT).await;
        // "1" waited in the channel, "2" (once the thread got to it) in its hand.
        assert!(matches!(&rest[..], [a] | [a, _] if a == "1"), "{rest:?}");
        assert!(rest.get(1).is_none_or(|b| b == "2"), "{rest:?}");
    }

    /// A line read in pieces, with reads cut short between them, comes out
    /// whole.
    #[tokio::test]
    async fn pipe_line_in_pieces() {
        let (mut tx, mut input) = pipe_input();
        tx.write_all(b"{\"a\":").await.unwrap();
        let cut = tokio::time::timeout(WAIT, input.next_line()).await;
        assert!(cut.is_err());
        tx.write_all(b"1}\r\nb").await.unwrap();
        assert_eq!(
            input.next_line().await.unwrap().as_deref(),
            Some("{\"a\":1}")
        );
        drop(tx);
        assert_eq!(input.next_line().await.unwrap().as_deref(), Some("b"));
        assert_eq!(input.next_line().await.unwrap(), None);
    }

    /// Closing a pipe returns the whole lines buffered and the started one,
    /// finished from the pipe without taking anything after it.
    #[tokio::test]
    async fn pipe_close_finishes_the_started_line() {
        let (mut tx, mut input) = pipe_input();
        tx.write_all(b"a\nb\nc\nd-start").await.unwrap();
        assert_eq!(input.next_line().await.unwrap().as_deref(), Some("a"));
        let writer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            tx.write_all(b"-end\ne\nf").await.unwrap();
            tx
        });
        let rest = input.close(WAIT).await;
        assert_eq!(rest, ["b", "c", "d-start-end"]);
        let tx = writer.await.unwrap();
        assert_eq!(left_in(input, tx).await, b"e\nf");
    }

    /// A started line whose end does not come in time is dropped (logged),
    /// the whole ones before it returned; its rest stays in the pipe.
    #[tokio::test]
    async fn pipe_close_drops_a_line_that_does_not_end() {
        let (mut tx, mut input) = pipe_input();
        tx.write_all(b"a\nb\nc-start").await.unwrap();
        assert_eq!(input.next_line().await.unwrap().as_deref(), Some("a"));
        assert_eq!(input.close(Duration::from_millis(50)).await, ["b"]);
        tx.write_all(b"-end\nd\n").await.unwrap();
        assert_eq!(left_in(input, tx).await, b"-end\nd\n");
    }

    /// At the end of input a started line is a line.
    #[tokio::test]
    async fn pipe_close_at_the_end() {
        let (mut tx, mut input) = pipe_input();
        tx.write_all(b"a\nb").await.unwrap();
        drop(tx);
        assert_eq!(input.next_line().await.unwrap().as_deref(), Some("a"));
        assert_eq!(input.close(WAIT).await, ["b"]);
    }
}
