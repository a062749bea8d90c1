//! A service's output as its parent reads it: every line kept (or the last
//! few), and the address a line announces.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::sync::oneshot;

/// The lines a process wrote so far: all of them, or the last `limit`.
#[derive(Debug)]
pub(super) struct Lines {
    lines: VecDeque<String>,
    limit: Option<usize>,
}

impl Lines {
    pub(super) fn new(limit: Option<usize>) -> Arc<Mutex<Self>> {
        Arc::new(Mutex::new(Self {
            lines: VecDeque::new(),
            limit,
        }))
    }

    fn push(&mut self, line: String) {
        if self.limit.is_some_and(|limit| self.lines.len() >= limit) {
            self.lines.pop_front();
        }
        self.lines.push_back(line);
    }

    pub(super) fn all(&self) -> Vec<String> {
        self.lines.iter().cloned().collect()
    }
}

/// Who waits for the line that announces the address: the line's message,
/// and where to send the address.
pub(super) type Announce = (&'static str, oneshot::Sender<SocketAddr>);

/// Reads `reader` line by line until it closes, keeping every line (with
/// `prefix`) so that the pipe never fills and failures can show the log.
/// With `announce`, sends the address of the first line that carries the
/// ready message.
pub(super) async fn collect(
    reader: impl AsyncRead + Unpin,
    output: Arc<Mutex<Lines>>,
    prefix: &'static str,
    mut announce: Option<Announce>,
) {
    let mut lines = BufReader::new(reader).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let line = strip_ansi(&line);
        let ready = announce
            .as_ref()
            .is_some_and(|(ready, _)| line.contains(ready));
        let address = address_field(&line).filter(|_| ready);
        // Kept before it is announced: the output of a started process
        // holds its ready line.
        output.lock().unwrap().push(format!("{prefix}{line}"));
        if let Some(address) = address
            && let Some((_, sender)) = announce.take()
        {
            let _ = sender.send(address);
        }
    }
}

/// The `address` field of a log line, in the human format
/// (`… address=127.0.0.1:4000 …`) or as JSON (`"address":"127.0.0.1:4000"`).
/// Fields that merely end in `address` (`store_address=`) do not count.
pub fn address_field(line: &str) -> Option<SocketAddr> {
    const NAME: &str = "address";
    line.match_indices(NAME).find_map(|(at, _)| {
        let before = line[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.') {
            return None;
        }
        let rest = &line[at + NAME.len()..];
        let value = if let Some(human) = rest.strip_prefix('=') {
            human.split_whitespace().next()?.trim_matches('"')
        } else {
            let json = rest.strip_prefix("\":")?.trim_start().strip_prefix('"')?;
            json.split('"').next()?
        };
        value.parse().ok()
    })
}

/// The line without terminal colour sequences (`ESC [ … letter`), in case a
/// log format ignores `NO_COLOR`.
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // Skip the parameters up to and including the final letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_address_of_human_and_json_lines() {
        let human = "2026-01-01T00:00:00Z  INFO run_coordinator::server: run coordinator serving gRPC address=127.0.0.1:4100 epoch=3";
        assert_eq!(
            address_field(human),
            Some("127.0.0.1:4100".parse().unwrap())
        );
        let json = r#"{"timestamp":"…","level":"INFO","fields":{"message":"gateway edge listening","address":"127.0.0.1:4200"},"target":"gateway_edge::server"}"#;
        assert_eq!(address_field(json), Some("127.0.0.1:4200".parse().unwrap()));
        let edge = "2026-01-01T00:00:00Z  INFO gateway_edge::server: gateway edge listening address=127.0.0.1:4100";
        assert_eq!(address_field(edge), Some("127.0.0.1:4100".parse().unwrap()));
        let spaced = r#"{"fields":{"address": "[::1]:4300"}}"#;
        assert_eq!(address_field(spaced), Some("[::1]:4300".parse().unwrap()));
    }

    #[test]
    fn ignores_other_fields_and_non_addresses() {
        assert_eq!(address_field("store_address=127.0.0.1:1 x"), None);
        assert_eq!(address_field(r#"{"store_address":"127.0.0.1:1"}"#), None);
        assert_eq!(address_field("address=somewhere"), None);
        assert_eq!(
            address_field("peer.address=127.0.0.1:1 address=127.0.0.1:2"),
            Some("127.0.0.1:2".parse().unwrap())
        );
    }

    #[test]
    fn strips_colour() {
        let coloured = "\u{1b}[2m2026\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m \u{1b}[3maddress\u{1b}[0m\u{1b}[2m=\u{1b}[0m127.0.0.1:9";
        let plain = strip_ansi(coloured);
        assert_eq!(plain, "2026  INFO address=127.0.0.1:9");
        assert_eq!(address_field(&plain), Some("127.0.0.1:9".parse().unwrap()));
    }

    #[test]
    fn keeps_all_lines_or_the_last_few() {
        let all = Lines::new(None);
        let last = Lines::new(Some(2));
        for n in 0..3 {
            all.lock().unwrap().push(n.to_string());
            last.lock().unwrap().push(n.to_string());
        }
        assert_eq!(all.lock().unwrap().all(), ["0", "1", "2"]);
        assert_eq!(last.lock().unwrap().all(), ["1", "2"]);
    }
}
