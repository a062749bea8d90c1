//! The WebSocket under a connection: opening it, sending text, reading the
//! next text frame before a deadline, and the handshake.

use std::net::{IpAddr, SocketAddr};

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::{HeaderName, HeaderValue, Request, Uri};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{Message, Utf8Bytes};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::error::{ClientError, Close};
use crate::frame::{CHALLENGE_EVENT, CONNECT_ID, ConnectParams, request};

/// A client's socket to a gateway (`ws://` or `wss://`).
pub type WebSocket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// How a socket is opened. Every socket has Nagle's algorithm off: frames
/// are small and each is waited for.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// Extra headers on the upgrade request (`Origin`, a forwarded-for, …).
    pub headers: Vec<(String, String)>,
    /// The local address to connect from (a loopback alias, say).
    pub source: Option<IpAddr>,
    /// The socket's kernel receive buffer (`SO_RCVBUF`): a small one makes
    /// a client that stops reading back the gateway up quickly.
    pub receive_buffer: Option<u32>,
    /// The library's read buffer (its default when `None`).
    pub read_buffer: Option<usize>,
}

/// Opens the WebSocket at `url`.
pub async fn open(url: &str, options: &OpenOptions) -> Result<WebSocket, ClientError> {
    let unreachable = |reason: String| ClientError::Unreachable {
        url: url.to_owned(),
        reason,
    };
    let mut request = url
        .into_client_request()
        .map_err(|e| unreachable(e.to_string()))?;
    for (name, value) in &options.headers {
        let name =
            HeaderName::from_bytes(name.as_bytes()).map_err(|e| unreachable(e.to_string()))?;
        let value = HeaderValue::from_str(value).map_err(|e| unreachable(e.to_string()))?;
        request.headers_mut().insert(name, value);
    }
    let config = options
        .read_buffer
        .map(|size| WebSocketConfig::default().read_buffer_size(size));
    let opened = if options.source.is_none() && options.receive_buffer.is_none() {
        tokio_tungstenite::connect_async_with_config(request, config, true).await
    } else {
        let stream = tcp_stream(&request, options)
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        tokio_tungstenite::client_async_with_config(request, MaybeTlsStream::Plain(stream), config)
            .await
    };
    match opened {
        Ok((socket, _)) => Ok(socket),
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            let body = response.body().as_deref().unwrap_or_default();
            Err(ClientError::UpgradeRefused {
                status: response.status().as_u16(),
                body: String::from_utf8_lossy(body).trim().to_owned(),
            })
        }
        Err(other) => Err(unreachable(other.to_string())),
    }
}

/// A plain TCP connection to the request's host, set as `options` say.
async fn tcp_stream(request: &Request<()>, options: &OpenOptions) -> std::io::Result<TcpStream> {
    let address = resolve_uri(request.uri(), options.source).await?;
    let socket = match address {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    if let Some(size) = options.receive_buffer {
        socket.set_recv_buffer_size(size)?;
    }
    if let Some(source) = options.source {
        socket.bind(SocketAddr::new(source, 0))?;
    }
    let stream = socket.connect(address).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// The socket address a `ws://` URL names, of the family of `like` (any
/// family without).
pub async fn resolve(url: &str, like: Option<IpAddr>) -> std::io::Result<SocketAddr> {
    let request = url
        .into_client_request()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    resolve_uri(request.uri(), like).await
}

async fn resolve_uri(uri: &Uri, like: Option<IpAddr>) -> std::io::Result<SocketAddr> {
    let host = uri.host().ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "the URL has no host")
    })?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = uri.port_u16().unwrap_or(80);
    tokio::net::lookup_host((host, port))
        .await?
        .find(|a| like.is_none_or(|l| l.is_ipv4() == a.is_ipv4()))
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{host} has no address of the family wanted"),
            )
        })
}

/// Sends one text frame.
pub async fn send_text(socket: &mut WebSocket, text: String) -> Result<(), ClientError> {
    socket
        .send(Message::text(text))
        .await
        .map_err(|e| ClientError::Lost(Some(e.to_string())))
}

/// Sends `frame` as JSON text.
pub async fn send_json(socket: &mut WebSocket, frame: &Value) -> Result<(), ClientError> {
    send_text(socket, frame.to_string()).await
}

/// The next text frame, before `deadline` (`None`: however long it takes;
/// `what` names what is awaited, for the timeout). Pings are answered by
/// the library; pongs and binary frames are skipped (the protocol sends
/// text only). A close, with its frame or without, is
/// [`ClientError::Closed`]; a failed or ended stream [`ClientError::Lost`].
pub async fn next_text(
    socket: &mut WebSocket,
    deadline: Option<Instant>,
    what: &str,
) -> Result<Utf8Bytes, ClientError> {
    loop {
        let next = match deadline {
            Some(deadline) => tokio::time::timeout_at(deadline, socket.next())
                .await
                .map_err(|_| ClientError::TimedOut {
                    what: what.to_owned(),
                })?,
            None => socket.next().await,
        };
        match next {
            Some(Ok(Message::Text(text))) => return Ok(text),
            Some(Ok(Message::Close(frame))) => {
                return Err(ClientError::Closed(frame.map(|f| Close {
                    code: f.code.into(),
                    reason: f.reason.to_string(),
                })));
            }
            Some(Ok(_)) => continue,
            Some(Err(e)) => return Err(ClientError::Lost(Some(e.to_string()))),
            None => return Err(ClientError::Lost(None)),
        }
    }
}

/// The next frame that is a JSON object (the protocol sends nothing else;
/// any other text is skipped), before `deadline`.
pub async fn next_json(
    socket: &mut WebSocket,
    deadline: Option<Instant>,
    what: &str,
) -> Result<Value, ClientError> {
    loop {
        let text = next_text(socket, deadline, what).await?;
        if let Ok(frame @ Value::Object(_)) = serde_json::from_str::<Value>(&text) {
            return Ok(frame);
        }
    }
}

/// What the handshake received: the challenge and the `hello-ok` payload.
#[derive(Debug, Clone)]
pub struct Handshake {
    pub challenge: Value,
    pub hello: Value,
}

/// The handshake on an opened socket, done by `deadline`: the gateway's
/// `connect.challenge`, then `connect` with `params` (request id
/// [`CONNECT_ID`]), then its answer: `hello-ok`, or the refusal.
pub async fn handshake(
    socket: &mut WebSocket,
    params: &ConnectParams,
    deadline: Instant,
) -> Result<Handshake, ClientError> {
    let challenge = next_json(socket, Some(deadline), CHALLENGE_EVENT).await?;
    if challenge["type"] != "event" || challenge["event"] != CHALLENGE_EVENT {
        return Err(ClientError::NoChallenge { first: challenge });
    }
    send_json(socket, &request(CONNECT_ID, "connect", params.to_json())).await?;
    loop {
        let frame = next_json(socket, Some(deadline), "the connect response").await?;
        if frame["type"] != "res" || frame["id"] != CONNECT_ID {
            continue;
        }
        if frame["ok"] != true {
            let error = frame.get("error").cloned().unwrap_or_else(|| json!({}));
            return Err(ClientError::Rejected { error });
        }
        let hello = frame.get("payload").cloned().unwrap_or(Value::Null);
        return Ok(Handshake { challenge, hello });
    }
}
