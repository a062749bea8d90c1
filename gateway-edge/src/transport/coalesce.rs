//! A socket's writes gathered into one system call per flush.
//!
//! The WebSocket library writes its staged frames to the socket whenever
//! its write buffer passes `write_buffer_size` (2 KiB, kept small because
//! that buffer never shrinks). A fan-out batch of a dozen events would then
//! be several `sendto` calls, and on loopback each call also runs the
//! peer's TCP receive path: under a heavy fan-out those calls were most of
//! the edge's CPU, and the admissions waiting for that CPU felt it.
//!
//! [`Coalesced`] sits under the library: writes are copied into a buffer
//! that goes to the socket in one call when the library flushes (once per
//! batch, `socket::write_batch`) or when it would pass `limit`. After each
//! flush the buffer is freed, so an idle connection holds none of it, and
//! a busy one at most `limit` beside what the library holds. Bytes reach
//! the socket in the order they were written, so frames never interleave
//! (a close frame queued behind half-written events comes after them).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

pub struct Coalesced<T> {
    inner: T,
    /// Bytes written by the library, not yet handed to `inner`.
    pending: Vec<u8>,
    /// How much of `pending` `inner` has taken.
    sent: usize,
    limit: usize,
}

impl<T> Coalesced<T> {
    /// `limit`: the most bytes held before they go to `inner` unasked.
    pub fn new(inner: T, limit: usize) -> Self {
        Self {
            inner,
            pending: Vec::new(),
            sent: 0,
            limit: limit.max(1),
        }
    }
}

impl<T: AsyncWrite + Unpin> Coalesced<T> {
    /// Hands every pending byte to `inner`, then frees the buffer.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.pending.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.pending = Vec::new();
        self.sent = 0;
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Coalesced<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Coalesced<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.pending.len() + buf.len() > this.limit {
            ready!(this.poll_drain(cx))?;
            if buf.len() >= this.limit {
                return Pin::new(&mut this.inner).poll_write(cx, buf);
            }
        }
        this.pending.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Counts the writes that reach it.
    #[derive(Default)]
    struct Counting {
        bytes: Vec<u8>,
        writes: usize,
    }

    impl AsyncWrite for Counting {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.writes += 1;
            self.bytes.extend_from_slice(buf);
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// Small writes reach the socket as one, at the flush, and the buffer
    /// is gone after it.
    #[tokio::test]
    async fn small_writes_go_out_together_at_the_flush() {
        let mut io = Coalesced::new(Counting::default(), 1024);
        for part in [&b"abc"[..], b"def", b"ghi"] {
            io.write_all(part).await.unwrap();
        }
        assert_eq!(io.inner.writes, 0, "nothing written before the flush");
        io.flush().await.unwrap();
        assert_eq!(io.inner.writes, 1);
        assert_eq!(io.inner.bytes, b"abcdefghi");
        assert_eq!(io.pending.capacity(), 0, "the buffer is freed");
    }

    /// Past the limit, what is held goes first, and a write as large as
    /// the limit goes straight through: order is kept either way.
    #[tokio::test]
    async fn the_limit_bounds_what_is_held() {
        let mut io = Coalesced::new(Counting::default(), 8);
        io.write_all(b"12345").await.unwrap();
        io.write_all(b"6789").await.unwrap();
        assert_eq!(io.inner.bytes, b"12345", "the held bytes went first");
        io.write_all(b"abcdefghij").await.unwrap();
        assert_eq!(io.inner.bytes, b"123456789abcdefghij");
        assert!(io.pending.is_empty());
        io.flush().await.unwrap();
        assert_eq!(io.inner.bytes, b"123456789abcdefghij");
    }

    /// A peer that reads slowly gets every byte, in order, through a
    /// small pipe that takes part of each write.
    #[tokio::test]
    async fn partial_writes_keep_the_order() {
        let (near, mut far) = tokio::io::duplex(7);
        let mut io = Coalesced::new(near, 64);
        let expected: Vec<u8> = (0..200u8).collect();
        let writer = tokio::spawn(async move {
            for chunk in (0..200u8).collect::<Vec<_>>().chunks(13) {
                io.write_all(chunk).await.unwrap();
            }
            io.shutdown().await.unwrap();
        });
        let mut got = Vec::new();
        far.read_to_end(&mut got).await.unwrap();
        writer.await.unwrap();
        assert_eq!(got, expected);
    }
}
