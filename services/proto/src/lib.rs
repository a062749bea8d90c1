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
