//! Enforces the pre-auth frame limit on the raw socket, below the WebSocket
//! library: the declared length in each frame header is checked as soon as
//! the header arrives, so an oversized frame before the handshake is refused
//! at once (close 1009) instead of being buffered up to the post-auth limit.
//! After the handshake the limit steps aside, but the guard still walks the
//! headers to know whether a message is half-read and since when: a
//! message that does not finish within `EDGE_FRAME_TIMEOUT` closes the
//! socket (a client that starts a frame and never ends it would otherwise
//! hold its buffer for as long as the socket lives).

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// Shared between the IO wrapper and the connection task.
pub struct PreauthGuard {
    limit: u64,
    authenticated: AtomicBool,
    exceeded: AtomicBool,
    reading: Mutex<Reading>,
}

/// Where the byte stream is.
#[derive(Default)]
struct Reading {
    headers: FrameHeaders,
    /// Since when the message being read has been arriving; `None`
    /// between messages.
    unfinished_since: Option<Instant>,
}

/// Walks client frame headers in the byte stream.
#[derive(Default)]
struct FrameHeaders {
    header: [u8; 14],
    have: usize,
    /// Payload bytes of the current frame still to pass.
    skipping: u64,
    /// Payload bytes declared so far, over all frames.
    total: u64,
    /// A data message has begun and its final frame has not ended.
    in_message: bool,
    /// The frame being skipped ends its message (a data frame with FIN).
    ends_message: bool,
    /// Messages ended so far.
    messages: u64,
}

impl FrameHeaders {
    /// Feeds bytes; returns the total payload declared so far.
    fn feed(&mut self, mut bytes: &[u8]) -> u64 {
        while !bytes.is_empty() {
            if self.skipping > 0 {
                let skip = self.skipping.min(bytes.len() as u64);
                self.skipping -= skip;
                bytes = &bytes[skip as usize..];
                if self.skipping == 0 {
                    self.frame_done();
                }
                continue;
            }
            self.header[self.have] = bytes[0];
            self.have += 1;
            bytes = &bytes[1..];
            if self.have < 2 {
                continue;
            }
            let masked = self.header[1] & 0x80 != 0;
            let extended = match self.header[1] & 0x7f {
                126 => 2,
                127 => 8,
                _ => 0,
            };
            let header_len = 2 + extended + if masked { 4 } else { 0 };
            if self.have < header_len {
                continue;
            }
            let length = match extended {
                0 => u64::from(self.header[1] & 0x7f),
                2 => u64::from(u16::from_be_bytes([self.header[2], self.header[3]])),
                _ => u64::from_be_bytes(self.header[2..10].try_into().expect("8 bytes")),
            };
            self.total = self.total.saturating_add(length);
            self.skipping = length;
            self.have = 0;
            // Control frames (opcode 8 and up) may come between the frames
            // of a message and neither start nor end one.
            let fin = self.header[0] & 0x80 != 0;
            if self.header[0] & 0x08 == 0 {
                self.in_message = true;
                self.ends_message = fin;
            }
            if length == 0 {
                self.frame_done();
            }
        }
        self.total
    }

    fn frame_done(&mut self) {
        if self.in_message && self.ends_message {
            self.in_message = false;
            self.ends_message = false;
            self.messages += 1;
        }
    }

    /// Bytes of a message (or a frame header) have arrived whose end has not.
    fn unfinished(&self) -> bool {
        self.in_message || self.have > 0 || self.skipping > 0
    }
}

impl PreauthGuard {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit: limit as u64,
            authenticated: AtomicBool::new(false),
            exceeded: AtomicBool::new(false),
            reading: Mutex::default(),
        })
    }

    /// The handshake succeeded: no limit from here on.
    pub fn authenticated(&self) {
        self.authenticated.store(true, Ordering::Relaxed);
    }

    pub fn exceeded(&self) -> bool {
        self.exceeded.load(Ordering::Relaxed)
    }

    /// How long the message being read has been arriving, at `now`.
    pub fn unfinished_for(&self, now: Instant) -> Option<Duration> {
        let since = self.reading.lock().unwrap().unfinished_since;
        since.map(|since| now.saturating_duration_since(since))
    }

    /// Every byte read so far ends a frame, and no message is half-read
    /// (a parked socket loses nothing: `park`).
    pub fn between_messages(&self) -> bool {
        self.reading.lock().unwrap().unfinished_since.is_none()
    }

    /// Walks `bytes` just read; the payload bytes declared so far.
    fn read(&self, bytes: &[u8]) -> u64 {
        let mut reading = self.reading.lock().unwrap();
        let Reading {
            headers,
            unfinished_since,
        } = &mut *reading;
        let messages = headers.messages;
        let declared = headers.feed(bytes);
        if !headers.unfinished() {
            *unfinished_since = None;
        } else if unfinished_since.is_none() || headers.messages != messages {
            // A message began in these bytes (after any that ended in them).
            *unfinished_since = Some(Instant::now());
        }
        declared
    }
}

pub struct Guarded<T> {
    inner: T,
    guard: Arc<PreauthGuard>,
}

impl<T> Guarded<T> {
    pub fn new(inner: T, guard: Arc<PreauthGuard>) -> Self {
        Self { inner, guard }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Guarded<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            let declared = self.guard.read(&buf.filled()[before..]);
            if declared > self.guard.limit && !self.guard.authenticated.load(Ordering::Relaxed) {
                self.guard.exceeded.store(true, Ordering::Relaxed);
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "preauth payload too large",
                )));
            }
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Guarded<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_declared_lengths_across_splits() {
        let mut headers = FrameHeaders::default();
        // A masked 5-byte text frame, then a masked frame declaring 70000 (16-bit ext is 126 → u16 max 65535, so 127).
        let mut bytes = vec![0x81, 0x85, 1, 2, 3, 4, b'h', b'e', b'l', b'l', b'o'];
        bytes.extend_from_slice(&[0x82, 0x80 | 127]);
        bytes.extend_from_slice(&70_000_u64.to_be_bytes());
        bytes.extend_from_slice(&[0, 0, 0, 0]);
        let mut total = 0;
        for byte in &bytes {
            total = headers.feed(std::slice::from_ref(byte));
        }
        assert_eq!(total, 70_005);
        let mut headers = FrameHeaders::default();
        assert_eq!(
            headers.feed(&[0x81, 0x80 | 126, 0x01, 0x00, 9, 9, 9, 9]),
            256
        );
    }

    /// A message is unfinished from its first header byte to the end of
    /// its final frame; a ping between its frames changes nothing.
    #[test]
    fn knows_when_a_message_is_half_read() {
        let mut headers = FrameHeaders::default();
        assert!(!headers.unfinished());
        headers.feed(&[0x01]);
        assert!(headers.unfinished(), "half a header");
        // A text frame without FIN (3 bytes), a ping, the final continuation.
        headers.feed(&[0x83, 1, 2, 3, 4, b'a', b'b', b'c']);
        assert!(headers.unfinished(), "the message goes on");
        headers.feed(&[0x89, 0x80, 1, 2, 3, 4]);
        assert!(headers.unfinished(), "a ping does not end it");
        headers.feed(&[0x80, 0x82, 1, 2, 3, 4, b'd']);
        assert!(headers.unfinished(), "one byte of the final frame to come");
        headers.feed(b"e");
        assert!(!headers.unfinished());
        assert_eq!(headers.messages, 1);
        // An empty final frame ends its message at its header.
        headers.feed(&[0x81, 0x80, 1, 2, 3, 4]);
        assert!(!headers.unfinished());
        assert_eq!(headers.messages, 2);
    }
}
