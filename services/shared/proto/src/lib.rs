//! Generated protobuf and gRPC code shared by every clawgate service.

/// Encoded `FileDescriptorSet` of every proto in `proto/`, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/clawgate_descriptor.bin"));

pub mod agent_runtime {
    pub mod v1 {
        tonic::include_proto!("clawgate.agent_runtime.v1");
    }
}

pub mod rpc {
    pub mod v1 {
        tonic::include_proto!("clawgate.rpc.v1");
    }
}

pub mod run_coordinator {
    pub mod v1 {
        tonic::include_proto!("clawgate.run_coordinator.v1");
    }
}

pub mod session_store {
    pub mod v1 {
        tonic::include_proto!("clawgate.session_store.v1");
    }
}

/// Errors with a machine-readable detail, the standard way: a
/// `google.rpc.Status` (here `rpc::v1::Status`) in the
/// `grpc-status-details-bin` trailer, the detail inside as an `Any`.
///
/// A status travels in the response trailers, which an HTTP/2 peer accepts
/// only up to a bound (16 KiB by default for hyper, hence tonic): beyond it
/// the client gets a protocol error instead of the status, and may lose the
/// connection. The message appears there twice (percent-encoded in
/// `grpc-message`, again inside the details), so it is cut to
/// [`MAX_MESSAGE_BYTES`](status_detail::MAX_MESSAGE_BYTES), and each service
/// keeps its encoded detail within
/// [`MAX_DETAIL_BYTES`](status_detail::MAX_DETAIL_BYTES). Together that is
/// at most about 11 KiB of trailers.
pub mod status_detail {
    use prost::Message;

    /// The longest status message sent (bytes); a longer one (one that
    /// quotes client input, say) is cut at a char boundary, marked `…`.
    pub const MAX_MESSAGE_BYTES: usize = 512;

    /// The largest encoded detail a service may attach; a service whose
    /// detail would be larger leaves payload fields out (and says so in the
    /// detail).
    pub const MAX_DETAIL_BYTES: usize = 6 * 1024;

    /// `message` cut to at most [`MAX_MESSAGE_BYTES`] (plus the marker).
    pub fn bounded_message(mut message: String) -> String {
        if message.len() > MAX_MESSAGE_BYTES {
            let mut end = MAX_MESSAGE_BYTES;
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            message.truncate(end);
            message.push('…');
        }
        message
    }

    /// A `tonic::Status` carrying `detail` under `type_url`, its message
    /// bounded (see [`bounded_message`]).
    pub fn with_detail(
        code: tonic::Code,
        message: String,
        type_url: &str,
        detail: &impl Message,
    ) -> tonic::Status {
        let message = bounded_message(message);
        let details = crate::rpc::v1::Status {
            code: code as i32,
            message: message.clone(),
            details: vec![prost_types::Any {
                type_url: type_url.to_owned(),
                value: detail.encode_to_vec(),
            }],
        };
        tonic::Status::with_details(code, message, details.encode_to_vec().into())
    }

    /// The detail of type `type_url` a status carries, if any.
    pub fn detail_of<M: Message + Default>(status: &tonic::Status, type_url: &str) -> Option<M> {
        crate::rpc::v1::Status::decode(status.details())
            .ok()?
            .details
            .into_iter()
            .find(|d| d.type_url == type_url)
            .and_then(|any| M::decode(any.value.as_slice()).ok())
    }
}
