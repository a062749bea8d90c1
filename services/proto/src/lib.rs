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
pub mod status_detail {
    use prost::Message;

    /// A `tonic::Status` carrying `detail` under `type_url`.
    pub fn with_detail(
        code: tonic::Code,
        message: String,
        type_url: &str,
        detail: &impl Message,
    ) -> tonic::Status {
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
