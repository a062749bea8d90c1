//! Compiles `proto/` with protox (pure Rust), so no system `protoc` is needed.

use std::path::PathBuf;

const PROTO_FILES: &[&str] = &[
    "clawgate/agent_runtime/v1/agent_runtime.proto",
    "clawgate/rpc/v1/status.proto",
    "clawgate/run_coordinator/v1/run_coordinator.proto",
    "clawgate/session_store/v1/session_store.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../proto");
    println!("cargo:rerun-if-changed={}", proto_root.display());

    let descriptors = protox::compile(PROTO_FILES, [&proto_root])?;
    // Server reflection serves this descriptor set; protox does not write it.
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("clawgate_descriptor.bin"),
        prost::Message::encode_to_vec(&descriptors),
    )?;

    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    Ok(())
}
