//! The process's recent log lines, kept in memory for `logs.tail`: a ring
//! bounded by lines and bytes (`CLAWGATE_LOG_RING_LINES`, default 1000;
//! `CLAWGATE_LOG_RING_BYTES`, default 1 MiB), oldest dropped first. Lines
//! are addressed by a cursor: the byte offset of the line in everything
//! logged since the process started (each line counted with its newline),
//! so a reader that keeps the cursor of its last answer gets only what came
//! after it, as with a tailed file.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::sync::{Mutex, OnceLock};

use tracing_subscriber::fmt::MakeWriter;

const DEFAULT_LINES: usize = 1000;
const DEFAULT_BYTES: usize = 1 << 20;

/// The bounded ring.
pub struct LogRing {
    max_lines: usize,
    max_bytes: usize,
    inner: Mutex<Ring>,
}

#[derive(Default)]
struct Ring {
    /// Each line with the cursor it starts at, oldest first.
    lines: VecDeque<(u64, String)>,
    bytes: usize,
    /// The cursor after the newest line.
    end: u64,
}

/// What a read of the ring gives.
#[derive(Debug, PartialEq, Eq)]
pub struct Tail {
    /// The cursor to ask from next time (the end of the log).
    pub cursor: u64,
    /// Bytes logged so far.
    pub size: u64,
    pub lines: Vec<String>,
    /// Some lines after the asked cursor are not in `lines` (dropped from
    /// the ring, or over the read's limits).
    pub truncated: bool,
    /// The cursor asked is past the end: another process's, or the ring was
    /// restarted; the answer reads from the start of the ring.
    pub reset: bool,
    /// Bytes between the asked cursor and the first line given.
    pub skipped_bytes: u64,
}

impl LogRing {
    pub fn new(max_lines: usize, max_bytes: usize) -> Self {
        Self {
            max_lines,
            max_bytes,
            inner: Mutex::default(),
        }
    }

    /// Adds one line (without its newline).
    pub fn push(&self, line: &str) {
        let mut ring = self.inner.lock().unwrap();
        let start = ring.end;
        ring.end += line.len() as u64 + 1;
        ring.bytes += line.len();
        ring.lines.push_back((start, line.to_owned()));
        while ring.lines.len() > self.max_lines || ring.bytes > self.max_bytes {
            let Some((_, dropped)) = ring.lines.pop_front() else {
                break;
            };
            ring.bytes -= dropped.len();
        }
    }

    /// The lines after `cursor` (all the ring holds without one), the
    /// newest `limit` lines of at most `max_bytes` bytes of them.
    pub fn tail(&self, cursor: Option<u64>, limit: usize, max_bytes: usize) -> Tail {
        let ring = self.inner.lock().unwrap();
        let reset = cursor.is_some_and(|c| c > ring.end);
        let from = cursor.filter(|_| !reset).unwrap_or(0);
        let mut taken: Vec<&(u64, String)> = Vec::new();
        let mut bytes = 0;
        for entry in ring.lines.iter().rev() {
            if entry.0 < from || taken.len() == limit || bytes + entry.1.len() > max_bytes {
                break;
            }
            bytes += entry.1.len();
            taken.push(entry);
        }
        taken.reverse();
        let first = taken.first().map_or(ring.end, |(start, _)| *start);
        let skipped_bytes = first.saturating_sub(from);
        Tail {
            cursor: ring.end,
            size: ring.end,
            lines: taken.into_iter().map(|(_, line)| line.clone()).collect(),
            truncated: skipped_bytes > 0 && cursor.is_some(),
            reset,
            skipped_bytes: if cursor.is_some() { skipped_bytes } else { 0 },
        }
    }
}

/// This process's ring, its limits read from the environment at first use.
pub fn recent_logs() -> &'static LogRing {
    static RING: OnceLock<LogRing> = OnceLock::new();
    RING.get_or_init(|| {
        let limit = |name: &str, default: usize| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(default)
        };
        LogRing::new(
            limit("CLAWGATE_LOG_RING_LINES", DEFAULT_LINES),
            limit("CLAWGATE_LOG_RING_BYTES", DEFAULT_BYTES),
        )
    })
}

/// A writer that hands every line it is given to [`recent_logs`] as well
/// as to the wrapped writer.
pub(crate) struct Teed<M>(pub M);

impl<'a, M: MakeWriter<'a>> MakeWriter<'a> for Teed<M> {
    type Writer = TeedWriter<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        TeedWriter {
            inner: self.0.make_writer(),
            buffer: Vec::new(),
        }
    }
}

/// One event's output: passed through, and its lines kept when dropped.
pub(crate) struct TeedWriter<W: Write> {
    inner: W,
    buffer: Vec<u8>,
}

impl<W: Write> Write for TeedWriter<W> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let written = self.inner.write(bytes)?;
        self.buffer.extend_from_slice(&bytes[..written]);
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<W: Write> Drop for TeedWriter<W> {
    fn drop(&mut self) {
        let text = without_colours(&String::from_utf8_lossy(&self.buffer));
        for line in text.lines().filter(|line| !line.is_empty()) {
            recent_logs().push(line);
        }
    }
}

/// `text` without the terminal's colour sequences (`ESC [ … letter`), which
/// the log output carries when it goes to a terminal.
fn without_colours(text: &str) -> String {
    let mut plain = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // Up to and including the sequence's final letter.
            chars.by_ref().find(|c| c.is_ascii_alphabetic());
        } else {
            plain.push(c);
        }
    }
    plain
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_after_a_cursor_and_drops_the_oldest() {
        let ring = LogRing::new(3, 1000);
        let empty = ring.tail(None, 10, 1000);
        assert_eq!((empty.cursor, empty.lines.len()), (0, 0));
        ring.push("one");
        ring.push("two");
        let first = ring.tail(None, 10, 1000);
        assert_eq!(first.lines, ["one", "two"]);
        assert_eq!(first.cursor, 8);
        ring.push("three");
        let next = ring.tail(Some(first.cursor), 10, 1000);
        assert_eq!(
            (next.lines.clone(), next.truncated),
            (vec!["three".to_owned()], false)
        );
        assert_eq!(next.cursor, 14);
        ring.push("four");
        // "one" is gone: a reader from the start hears of the gap.
        let from_start = ring.tail(Some(0), 10, 1000);
        assert_eq!(from_start.lines, ["two", "three", "four"]);
        assert!(from_start.truncated);
        assert_eq!(from_start.skipped_bytes, 4);
        // A cursor past the end is another log's.
        let reset = ring.tail(Some(1000), 10, 1000);
        assert!(reset.reset);
        assert_eq!(reset.lines, ["two", "three", "four"]);
    }

    #[test]
    fn a_read_keeps_the_newest_within_its_limits() {
        let ring = LogRing::new(100, 1000);
        for line in ["aaaa", "bbbb", "cccc"] {
            ring.push(line);
        }
        assert_eq!(ring.tail(None, 2, 1000).lines, ["bbbb", "cccc"]);
        assert_eq!(ring.tail(None, 10, 9).lines, ["bbbb", "cccc"]);
        let limited = ring.tail(Some(0), 1, 1000);
        assert_eq!(limited.lines, ["cccc"]);
        assert!(limited.truncated);
        let bytes = LogRing::new(100, 6);
        bytes.push("aaaa");
        bytes.push("bbbb");
        assert_eq!(bytes.tail(None, 10, 1000).lines, ["bbbb"]);
    }

    #[test]
    fn the_log_output_feeds_the_process_ring() {
        let teed = Teed(io::sink);
        {
            let mut writer = teed.make_writer();
            writer
                .write_all(b"teed line one\n\x1b[2mteed\x1b[0m line two\n")
                .unwrap();
        }
        let lines = recent_logs().tail(None, usize::MAX, usize::MAX).lines;
        let ours: Vec<&String> = lines
            .iter()
            .filter(|l| l.starts_with("teed line"))
            .collect();
        assert_eq!(ours, ["teed line one", "teed line two"]);
    }
}
