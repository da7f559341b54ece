//! Generates the Auth gRPC API from `proto/auth.proto` with protox (pure Rust: no system
//! `protoc` needed) and tonic-prost-build.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/auth.proto");
    let descriptors = protox::compile(["proto/auth.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_transport(false)
        .compile_fds(descriptors)?;
    Ok(())
}
