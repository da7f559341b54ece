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
    #[cfg(feature = "web-ui")]
    web_ui::embed()?;
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

/// Embeds the Web UI's built assets (`web/dist`, written by `npm ci && npm run build` in `web/`)
/// as a generated table `$OUT_DIR/web_ui_assets.rs` of `(path, content type, strong ETag,
/// include_bytes!)`, read by `src/proxy/web/ui.rs`.
#[cfg(feature = "web-ui")]
mod web_ui {
    use std::fmt::Write as _;
    use std::path::{Path, PathBuf};

    /// The command that builds the assets, from the repository's root.
    const BUILD_COMMAND: &str = "(cd svc-net/web && npm ci && npm run build)";

    pub(super) fn embed() -> Result<(), Box<dyn std::error::Error>> {
        let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
        let dist = manifest.join("web").join("dist");
        // Rebuilt when the assets are (re)built; a directory is scanned for any change.
        println!("cargo:rerun-if-changed={}", dist.display());
        let index = dist.join("index.html");
        if !index.is_file() {
            return Err(format!(
                "the Web UI is not built: {} is missing. Build it with `{BUILD_COMMAND}` \
                 (Node.js 20.19 or newer), or build svc-net without its `web-ui` feature",
                index.display()
            )
            .into());
        }
        let mut files = Vec::new();
        collect(&dist, &dist, &mut files)?;
        files.sort();
        let mut out = String::from(
            "/// The embedded assets: path under `/web/`, content type, strong ETag, bytes.\n\
             pub(crate) static ASSETS: &[(&str, &str, &str, &[u8])] = &[\n",
        );
        for (rel, path) in &files {
            let bytes = std::fs::read(path)?;
            let etag = format!("\"{:016x}-{:x}\"", fnv1a(&bytes), bytes.len());
            writeln!(
                out,
                "    ({rel:?}, {ctype:?}, {etag:?}, include_bytes!({path:?})),",
                ctype = content_type(rel),
                path = path.display().to_string(),
            )?;
        }
        out.push_str("];\n");
        let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
        std::fs::write(out_dir.join("web_ui_assets.rs"), out)?;
        Ok(())
    }

    /// Every file under `dir`, as (path relative to `root` with `/` separators, full path).
    fn collect(
        root: &Path,
        dir: &Path,
        files: &mut Vec<(String, PathBuf)>,
    ) -> Result<(), Box<dyn std::error::Error>> {
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.is_dir() {
                collect(root, &path, files)?;
            } else {
                let rel = path
                    .strip_prefix(root)?
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join("/");
                println!("cargo:rerun-if-changed={}", path.display());
                files.push((rel, path));
            }
        }
        Ok(())
    }

    fn content_type(path: &str) -> &'static str {
        match path.rsplit_once('.').map(|(_, ext)| ext) {
            Some("html") => "text/html; charset=utf-8",
            Some("js" | "mjs") => "text/javascript; charset=utf-8",
            Some("css") => "text/css; charset=utf-8",
            Some("json" | "map") => "application/json",
            Some("svg") => "image/svg+xml",
            Some("png") => "image/png",
            Some("ico") => "image/x-icon",
            Some("woff2") => "font/woff2",
            Some("txt") => "text/plain; charset=utf-8",
            _ => "application/octet-stream",
        }
    }

    /// FNV-1a, 64 bits: the ETag only has to change when the bytes do.
    fn fnv1a(bytes: &[u8]) -> u64 {
        bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
    }
}
