//! A generic gRPC client over raw bytes: any method of any service, called by
//! its path with an already encoded request, so the fuzzer needs no
//! generated client. Every answer is checked to decode as the method's
//! output type; every wait is bounded.

use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};
use http::uri::PathAndQuery;
use prost_reflect::{DynamicMessage, MethodDescriptor};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;
use tonic::{Code, Status};

/// Passes message bodies through untouched: requests are encoded by the
/// caller, answers are handed back as bytes.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawCodec;

#[derive(Debug, Clone, Copy, Default)]
pub struct RawEncoder;

#[derive(Debug, Clone, Copy, Default)]
pub struct RawDecoder;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }

    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

impl Encoder for RawEncoder {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// Bounds on one call.
#[derive(Debug, Clone)]
pub struct CallLimits {
    /// Sent as the call's `grpc-timeout`; the call must answer (or the
    /// stream must move) within it plus a grace period, else the service
    /// counts as wedged.
    pub deadline: Duration,
    /// A server stream is read for at most this long, then dropped.
    pub stream_window: Duration,
    /// … or until this many messages arrived.
    pub stream_messages: usize,
}

impl Default for CallLimits {
    fn default() -> Self {
        Self {
            deadline: Duration::from_secs(5),
            stream_window: Duration::from_millis(150),
            stream_messages: 8,
        }
    }
}

/// What a call came to.
#[derive(Debug)]
pub enum Outcome {
    /// A unary answer, or a stream read within the limits (`ended`: the
    /// server closed it cleanly; otherwise the client dropped it).
    Answered { messages: usize, ended: bool },
    /// The call, or the stream part-way, ended with this status.
    Failed(Status),
}

impl Outcome {
    /// The gRPC code, `Ok` for an answer.
    pub fn code(&self) -> Code {
        match self {
            Self::Answered { .. } => Code::Ok,
            Self::Failed(status) => status.code(),
        }
    }
}

/// Whether a client input may be answered with `code`: a refusal in the
/// service's words, or a bounded wait that ran out. `UNKNOWN`, `INTERNAL`,
/// `UNAVAILABLE`, `UNIMPLEMENTED`, `DATA_LOSS` are never a clean answer to
/// what a client sent.
pub fn clean(code: Code) -> bool {
    matches!(
        code,
        Code::Ok
            | Code::InvalidArgument
            | Code::NotFound
            | Code::AlreadyExists
            | Code::FailedPrecondition
            | Code::Aborted
            | Code::OutOfRange
            | Code::ResourceExhausted
            | Code::DeadlineExceeded
            | Code::Cancelled
            | Code::Unauthenticated
            | Code::PermissionDenied
    )
}

/// Whether `status` was made by the client's transport (a reset stream, a
/// closed connection) rather than sent by the server: never a clean answer,
/// whatever its code (a closed connection reads as `CANCELLED`).
pub fn broken(status: &Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(cause) = source {
        if cause.is::<tonic::transport::Error>() {
            return true;
        }
        source = cause.source();
    }
    false
}

/// `/package.Service/Method`.
pub fn path_of(method: &MethodDescriptor) -> String {
    format!("/{}/{}", method.parent_service().full_name(), method.name())
}

/// Beyond the deadline, how long before a silent service counts as wedged.
const GRACE: Duration = Duration::from_secs(2);

fn check_answer(method: &MethodDescriptor, body: Bytes) -> Result<(), String> {
    DynamicMessage::decode(method.output(), body)
        .map(drop)
        .map_err(|e| format!("the answer is not a {}: {e}", method.output().full_name()))
}

/// Calls `method` with the encoded `request`. `Err` only for what no client
/// input may cause: no answer in time, an answer of the wrong type.
pub async fn call(
    channel: Channel,
    method: &MethodDescriptor,
    request: Bytes,
    limits: &CallLimits,
) -> Result<Outcome, String> {
    let path = PathAndQuery::try_from(path_of(method)).map_err(|e| e.to_string())?;
    let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(usize::MAX);
    let mut request = tonic::Request::new(request);
    request.set_timeout(limits.deadline);
    let exchange = async {
        grpc.ready()
            .await
            .map_err(|e| format!("the channel is not ready: {e}"))?;
        if !method.is_server_streaming() {
            return match grpc.unary(request, path, RawCodec).await {
                Ok(answer) => {
                    check_answer(method, answer.into_inner())?;
                    Ok(Outcome::Answered {
                        messages: 1,
                        ended: true,
                    })
                }
                Err(status) => Ok(Outcome::Failed(status)),
            };
        }
        let mut stream = match grpc.server_streaming(request, path, RawCodec).await {
            Ok(answer) => answer.into_inner(),
            Err(status) => return Ok(Outcome::Failed(status)),
        };
        let window = tokio::time::sleep(limits.stream_window);
        tokio::pin!(window);
        let mut messages = 0;
        loop {
            let item = tokio::select! {
                () = &mut window => return Ok(Outcome::Answered { messages, ended: false }),
                item = stream.message() => item,
            };
            match item {
                Ok(Some(body)) => {
                    check_answer(method, body)?;
                    messages += 1;
                    if messages >= limits.stream_messages {
                        return Ok(Outcome::Answered {
                            messages,
                            ended: false,
                        });
                    }
                }
                Ok(None) => {
                    return Ok(Outcome::Answered {
                        messages,
                        ended: true,
                    });
                }
                Err(status) => return Ok(Outcome::Failed(status)),
            }
        }
    };
    tokio::time::timeout(limits.deadline + GRACE, exchange)
        .await
        .map_err(|_| {
            format!(
                "{} gave no answer within {:?}",
                path_of(method),
                limits.deadline + GRACE
            )
        })?
}

/// The standard health check for `service` answers SERVING, in time.
pub async fn serving(channel: Channel, service: &str) -> Result<(), String> {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let mut health = HealthClient::new(channel);
    let check = health.check(HealthCheckRequest {
        service: service.to_owned(),
    });
    let answer = tokio::time::timeout(Duration::from_secs(5), check)
        .await
        .map_err(|_| format!("the health check of {service:?} gave no answer"))?
        .map_err(|status| format!("the health check of {service:?} failed: {status:?}"))?;
    match answer.into_inner().status() {
        ServingStatus::Serving => Ok(()),
        other => Err(format!("{service:?} is {other:?}")),
    }
}
