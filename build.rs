//! Build script: compiles the vendored kubelet pod-resources API (`proto/kubelet/...`) into Rust
//! with protox (a pure-Rust protobuf compiler, so no `protoc` on the build machine) and
//! tonic-prost-build. Both client and server are generated: gpulse only calls the kubelet, but
//! the integration tests serve the same API on a Unix socket to exercise the client.

use std::error::Error;

const PROTO_ROOT: &str = "proto";
const POD_RESOURCES: &str = "kubelet/podresources/v1/api.proto";

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed={PROTO_ROOT}/{POD_RESOURCES}");
    let descriptors = protox::compile([POD_RESOURCES], [PROTO_ROOT])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
