//! Generates the Auth gRPC API from `proto/auth.proto` with protox (pure Rust: no system
//! `protoc` needed) and tonic-prost-build, and the proxy peering API from `proto/peer.proto`.

/// Messages that carry a password, a join token or a private key: their `Debug` is written by
/// hand (in `src/auth/mod.rs`) so the secret never reaches a log.
#[cfg(feature = "auth")]
const SECRET_MESSAGES: [&str; 6] = [
    "svc.auth.v1.JoinRequest",
    "svc.auth.v1.LoginRequest",
    "svc.auth.v1.CreateUserRequest",
    "svc.auth.v1.CreateTokenResponse",
    "svc.auth.v1.SsoBeginRequest",
    "svc.auth.v1.SsoCallbackRequest",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/auth.proto");
    println!("cargo:rerun-if-changed=proto/peer.proto");
    // Without the gRPC API (`auth` feature off) there is nothing to generate: protox and
    // tonic-prost-build are not even built.
    #[cfg(feature = "auth")]
    generate()?;
    Ok(())
}

#[cfg(feature = "auth")]
fn generate() -> Result<(), Box<dyn std::error::Error>> {
    let descriptors = protox::compile(["proto/auth.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_transport(false)
        .skip_debug(SECRET_MESSAGES)
        .compile_fds(descriptors)?;
    // Proxy peering (`tunnel::peer`): no secrets in its messages.
    let descriptors = protox::compile(["proto/peer.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_transport(false)
        .compile_fds(descriptors)?;
    Ok(())
}
