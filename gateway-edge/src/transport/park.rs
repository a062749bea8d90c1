//! An idle WebSocket holds no buffer: between messages the WebSocket
//! library's state (its read buffer of `read_buffer_size`, its write
//! buffer, which keeps the size of the largest frame it wrote, and its
//! waker proxies) is dropped, and only the raw socket is kept ("parked").
//! The library is attached again when the socket has bytes to read (those
//! bytes are handed to it) or a frame must be written.
//!
//! A link parks only when nothing of the library's state can be lost:
//! - the library has just answered `Pending` to a read, so every whole
//!   frame it had buffered was returned and what it holds is at most a
//!   partial frame;
//! - the pre-auth guard, which walks every frame header read from the
//!   socket, says no frame and no message is half-read, so that partial
//!   frame is empty and no fragmented message is being assembled;
//! - a flush completes at once, so no queued frame (a pong the library
//!   answered a ping with) and no byte of the coalescing buffer is pending.
//!
//! Reattaching makes a fresh library state in the `Active` state with the
//! same configuration, which is what the dropped one was in: the library
//! keeps nothing else between messages.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::{Sink, Stream};
use tokio::io::{AsyncRead, ReadBuf};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

use super::preauth_io::PreauthGuard;
use super::server::{READ_BUFFER_BYTES, websocket_config};
use super::wire::{RawIo, Socket};

/// An authenticated connection's socket, open or parked.
pub struct Link {
    state: State,
    /// The largest frame and message read (`--max-payload`), to make the
    /// library's configuration again when it is attached.
    max_payload: usize,
}

enum State {
    Open(Socket),
    Parked(Box<RawIo>),
    /// Only while the socket moves from one state to the other, inside one
    /// call: never seen outside this module.
    Moving,
}

impl Link {
    pub fn new(socket: Socket, max_payload: usize) -> Self {
        Self {
            state: State::Open(socket),
            max_payload,
        }
    }

    /// The WebSocket, attached again first if it was parked (to write).
    pub async fn socket(&mut self) -> &mut Socket {
        std::future::poll_fn(|cx| {
            if matches!(self.state, State::Parked(_)) {
                self.attach(Vec::new(), cx);
            }
            Poll::Ready(())
        })
        .await;
        match &mut self.state {
            State::Open(socket) => socket,
            State::Parked(_) | State::Moving => unreachable!("attached just above"),
        }
    }

    /// The next message (`poll_next` as a future).
    pub async fn next(&mut self, guard: &PreauthGuard) -> Option<Result<Message, WsError>> {
        std::future::poll_fn(|cx| self.poll_next(guard, cx)).await
    }

    /// The next message, as the WebSocket's stream gives it; parks the
    /// socket while none is arriving (see the module's documentation).
    pub fn poll_next(
        &mut self,
        guard: &PreauthGuard,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Message, WsError>>> {
        loop {
            match &mut self.state {
                State::Open(socket) => {
                    let polled = Pin::new(&mut **socket).poll_next(cx);
                    if polled.is_ready() || !guard.between_messages() {
                        return polled;
                    }
                    // Nothing may stay queued in the library: a flush that
                    // does not complete at once keeps the socket open.
                    let flushed = Sink::<Message>::poll_flush(Pin::new(&mut **socket), cx);
                    if !matches!(flushed, Poll::Ready(Ok(()))) {
                        return Poll::Pending;
                    }
                    self.park();
                }
                State::Parked(io) => {
                    // Up to one read buffer's worth, handed to the library.
                    let mut bytes = [0u8; READ_BUFFER_BYTES];
                    let mut read = ReadBuf::new(&mut bytes);
                    match Pin::new(&mut **io).poll_read(cx, &mut read) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Err(err)) => return Poll::Ready(Some(Err(WsError::Io(err)))),
                        // The peer closed without a close frame.
                        Poll::Ready(Ok(())) if read.filled().is_empty() => {
                            return Poll::Ready(None);
                        }
                        Poll::Ready(Ok(())) => {
                            let part = read.filled().to_vec();
                            self.attach(part, cx);
                        }
                    }
                }
                State::Moving => unreachable!("a link is never left moving"),
            }
        }
    }

    /// Drops the library's state, keeping the raw socket.
    fn park(&mut self) {
        let State::Open(socket) = std::mem::replace(&mut self.state, State::Moving) else {
            unreachable!("only an open link parks");
        };
        self.state = State::Parked(Box::new((*socket).into_inner()));
    }

    /// Makes the library's state again over the parked socket, with `part`
    /// (bytes already read from it) first in its read buffer.
    fn attach(&mut self, part: Vec<u8>, cx: &mut Context<'_>) {
        let State::Parked(io) = std::mem::replace(&mut self.state, State::Moving) else {
            unreachable!("only a parked link attaches");
        };
        let config = websocket_config(self.max_payload);
        let made = WebSocketStream::from_partially_read(*io, part, Role::Server, Some(config));
        let mut made = std::pin::pin!(made);
        // Without a handshake the library is made in its first poll (which
        // gives it this task's waker).
        let Poll::Ready(socket) = made.as_mut().poll(cx) else {
            unreachable!("a WebSocket made without a handshake is ready at once");
        };
        self.state = State::Open(Box::new(socket));
    }
}
