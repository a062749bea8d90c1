//! An OpenAI-compatible Chat Completions server for tests that run the real
//! binaries with `--runtime openai`: every `POST …/chat/completions` is
//! answered as a stream that echoes the last user message in a few pieces,
//! ends with `stop`, and reports `usage` (prompt tokens: the words of every
//! message sent; completion tokens: the words of the reply), as a provider
//! does when asked `stream_options.include_usage`. Plain HTTP/1.1 on
//! loopback, one request per connection.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::{CancellationToken, DropGuard};

/// The most a request may be (headers and body).
const MAX_REQUEST: usize = 4 << 20;

pub struct OpenAiStub {
    /// `http://127.0.0.1:<port>/v1`, the runtime's base URL.
    pub base_url: String,
    usage: Arc<Reported>,
    _stop: DropGuard,
}

/// The tokens reported so far, over every completion.
#[derive(Debug, Default)]
struct Reported {
    prompt: AtomicU64,
    completion: AtomicU64,
}

impl OpenAiStub {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
        let usage = Arc::new(Reported::default());
        let stop = CancellationToken::new();
        let (reported, stopped) = (usage.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let socket = tokio::select! {
                    _ = stopped.cancelled() => return,
                    accepted = listener.accept() => match accepted {
                        Ok((socket, _)) => socket,
                        Err(_) => continue,
                    },
                };
                tokio::spawn(answer(socket, reported.clone()));
            }
        });
        Self {
            base_url,
            usage,
            _stop: stop.drop_guard(),
        }
    }

    /// Prompt and completion tokens reported so far.
    pub fn reported(&self) -> (u64, u64) {
        (
            self.usage.prompt.load(Ordering::SeqCst),
            self.usage.completion.load(Ordering::SeqCst),
        )
    }
}

fn words(text: &str) -> u64 {
    text.split_whitespace().count() as u64
}

/// The text of a message's `content` (a string or text parts).
fn text_of(message: &Value) -> String {
    match &message["content"] {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    }
}

async fn answer(mut socket: TcpStream, reported: Arc<Reported>) {
    let Some(body) = read_request(&mut socket).await else {
        let _ = socket
            .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            .await;
        return;
    };
    let request: Value = serde_json::from_slice(&body).unwrap_or_default();
    let messages = request["messages"].as_array().cloned().unwrap_or_default();
    let prompt: u64 = messages.iter().map(|m| words(&text_of(m))).sum();
    let last_user = messages
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .map(text_of)
        .unwrap_or_default();
    let reply = format!("You said: {last_user}");
    let completion = words(&reply);
    reported.prompt.fetch_add(prompt, Ordering::SeqCst);
    reported.completion.fetch_add(completion, Ordering::SeqCst);
    let chunk = |delta: Value, finish: Value| {
        json!({
            "id": "chatcmpl-stub", "object": "chat.completion.chunk", "model": request["model"],
            "choices": [{ "index": 0, "delta": delta, "finish_reason": finish }],
        })
    };
    let mut events: Vec<Value> = reply
        .split_inclusive(' ')
        .map(|piece| chunk(json!({ "content": piece }), Value::Null))
        .collect();
    events.push(chunk(json!({}), json!("stop")));
    events.push(json!({
        "id": "chatcmpl-stub", "object": "chat.completion.chunk", "choices": [],
        "usage": {
            "prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }));
    let mut stream: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
    stream.push_str("data: [DONE]\n\n");
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        stream.len()
    );
    let _ = socket.write_all(head.as_bytes()).await;
    let _ = socket.write_all(stream.as_bytes()).await;
    let _ = socket.shutdown().await;
}

/// The body of one HTTP/1.1 request with a `Content-Length`.
async fn read_request(socket: &mut TcpStream) -> Option<Vec<u8>> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buffer[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())?;
            let start = end + 4;
            while buffer.len() < start + length {
                let n = socket.read(&mut chunk).await.ok().filter(|&n| n > 0)?;
                buffer.extend_from_slice(&chunk[..n]);
            }
            return Some(buffer[start..start + length].to_vec());
        }
        if buffer.len() > MAX_REQUEST {
            return None;
        }
        let n = socket.read(&mut chunk).await.ok().filter(|&n| n > 0)?;
        buffer.extend_from_slice(&chunk[..n]);
    }
}
