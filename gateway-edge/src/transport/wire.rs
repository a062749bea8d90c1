//! Framed writes and reads on an upgraded socket: the socket's type,
//! text messages fragmented to `--socket-frame-bytes`, batches flushed
//! once, close frames (with the rest of an over-limit frame drained), and
//! what an incoming message is.

use futures::SinkExt;
use hyper_util::rt::TokioIo;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use super::coalesce::Coalesced;
use super::preauth_io::Guarded;
use crate::state::connection::{OutFrame, OutboxReader};

/// The socket stack: WebSocket framing over write coalescing over the
/// pre-auth guard over the upgraded HTTP connection.
pub type WebSocket = WebSocketStream<RawIo>;
/// What the WebSocket library runs over (all a parked link keeps,
/// `park::Link`).
pub type RawIo = Coalesced<Guarded<TokioIo<hyper::upgrade::Upgraded>>>;
/// Boxed, because the socket is handed from the task to the handshake to
/// the serving loop, and each async function's state would otherwise keep
/// its own copy of it (a few hundred bytes each) for the connection's life.
pub type Socket = Box<WebSocket>;
type WsError = tokio_tungstenite::tungstenite::Error;

pub async fn close(socket: &mut Socket, code: u16, reason: &str) {
    let frame = CloseFrame {
        code: CloseCode::from(code),
        reason: reason.to_owned().into(),
    };
    // A peer that does not read gets a few seconds, then the socket goes.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        let _ = socket.send(Message::Close(Some(frame))).await;
        let _ = socket.flush().await;
    })
    .await;
}

/// Closes because of a frame over a size limit. The rest of that frame is
/// still arriving: closing with it unread would make the kernel answer with
/// a reset, and the client could lose the close frame. So after the close
/// frame the write side is shut and whatever the client still sends is read
/// and dropped, until it closes too or a few seconds pass.
pub async fn close_over_limit(socket: &mut Socket, code: u16, reason: &str) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    close(socket, code, reason).await;
    let io = socket.get_mut();
    let _ = io.shutdown().await;
    let mut sink = vec![0u8; 64 * 1024];
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        while matches!(io.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}

pub async fn send_text(socket: &mut Socket, text: String, frame_bytes: usize) -> bool {
    write_text(socket, text, frame_bytes).await.is_ok()
}

/// Writes one text message, as frames of at most `frame_bytes` of payload
/// (a first `Text` frame, then `Continue` frames, split at character
/// boundaries). The WebSocket library stages every frame it writes in a
/// buffer that keeps its largest size until the socket parks (`park`), so
/// a busy connection would hold the largest message it was sent (a
/// `hello-ok` with its presence list, a history page); fragmenting bounds
/// that buffer by `frame_bytes`.
async fn write_text(socket: &mut Socket, text: String, frame_bytes: usize) -> Result<(), WsError> {
    feed_text(socket, text, frame_bytes).await?;
    socket.flush().await
}

/// Frames of a batch are written together, up to this many.
pub const WRITE_BATCH: usize = 64;

/// Writes `first` and what else is queued already (up to `WRITE_BATCH`
/// frames), flushing once: a fan-out queues several events at once (a run's
/// `agent` and `chat` event), and each write is a system call. Returns the
/// outcome and the bytes taken from the outbox.
pub async fn write_batch(
    socket: &mut Socket,
    first: OutFrame,
    queued: &mut OutboxReader,
    frame_bytes: usize,
) -> (Result<(), WsError>, usize) {
    let (mut next, mut bytes, mut count) = (Some(first), 0, 0);
    while let Some(frame) = next.take() {
        bytes += frame.wire_len();
        if let Err(err) = feed_text(socket, frame.into_text(), frame_bytes).await {
            return (Err(err), bytes);
        }
        count += 1;
        if count < WRITE_BATCH {
            next = queued.try_recv();
        }
    }
    (socket.flush().await, bytes)
}

/// `write_text` without the flush: the frames reach the socket once the
/// library's write buffer is full or flushed.
async fn feed_text(socket: &mut Socket, text: String, frame_bytes: usize) -> Result<(), WsError> {
    use tokio_tungstenite::tungstenite::protocol::frame::Frame;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
    if text.len() <= frame_bytes {
        return socket.feed(Message::text(text)).await;
    }
    let bytes = tokio_tungstenite::tungstenite::Bytes::from(text);
    let mut start = 0;
    while start < bytes.len() {
        let mut end = (start + frame_bytes.max(4)).min(bytes.len());
        // A fragment ends on a character boundary (UTF-8 continuation
        // bytes are 0b10xx_xxxx), so each one is valid text by itself.
        while end < bytes.len() && (bytes[end] & 0xC0) == 0x80 {
            end -= 1;
        }
        let opcode = if start == 0 {
            Data::Text
        } else {
            Data::Continue
        };
        let last = end == bytes.len();
        let frame = Frame::message(bytes.slice(start..end), OpCode::Data(opcode), last);
        socket.feed(Message::Frame(frame)).await?;
        start = end;
    }
    Ok(())
}

/// The text of a data frame (binary is read as UTF-8; binary that is not
/// is empty text, so it is ignored like any frame that is not JSON) with
/// the frame's size in bytes, or why there is none.
pub enum Incoming {
    Text(String, usize),
    /// A frame over the socket's size limit (`policy.maxPayload`).
    TooLarge,
    /// A text message that is not UTF-8: closed 1007, as RFC 6455 (and the
    /// OpenClaw gateway's WebSocket library) has it.
    NotUtf8,
    Closed,
    Ignore,
}

pub fn incoming(
    message: Option<Result<Message, tokio_tungstenite::tungstenite::Error>>,
) -> Incoming {
    match message {
        Some(Ok(Message::Text(text))) => Incoming::Text(text.to_string(), text.len()),
        Some(Ok(Message::Binary(bytes))) => Incoming::Text(
            String::from_utf8(bytes.to_vec()).unwrap_or_default(),
            bytes.len(),
        ),
        Some(Err(tokio_tungstenite::tungstenite::Error::Utf8(_))) => Incoming::NotUtf8,
        Some(Err(tokio_tungstenite::tungstenite::Error::Capacity(_))) => Incoming::TooLarge,
        Some(Ok(Message::Close(_))) | None | Some(Err(_)) => Incoming::Closed,
        Some(Ok(_)) => Incoming::Ignore,
    }
}

/// The close reason for a message that is not UTF-8.
pub const NOT_UTF8: &str = "invalid UTF-8";

/// Writes what the outbox holds, for a few seconds at most (a peer that
/// does not read gets no longer).
pub async fn flush_queued(socket: &mut Socket, reader: &mut OutboxReader, frame_bytes: usize) {
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        while let Some(frame) = reader.try_recv() {
            let _ = write_batch(socket, frame, reader, frame_bytes).await;
        }
    })
    .await;
}
