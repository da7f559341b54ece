//! The Proxy Service's web API as clients and the proxy both see it: the paths, and the
//! sign-in exchange of `POST /webapi/login`. No socket code: the proxy's handlers
//! (`svc_net::proxy::web`) and the clients (`svc_net::client`, the tunnel agent) share these.

use serde::{Deserialize, Serialize};

use crate::Secret;

/// Where the proxy answers the ping document.
pub const PING_PATH: &str = "/webapi/ping";

/// Where the proxy answers the find document (the ping without `auth`).
pub const FIND_PATH: &str = "/webapi/find";

/// Where the proxy signs users in with a password.
pub const LOGIN_PATH: &str = "/webapi/login";

/// The request body.
#[derive(Debug, Serialize, Deserialize)]
pub struct LoginBody {
    /// The user name.
    pub user: String,
    /// The password.
    pub password: Secret,
    /// The TLS public key: DER SubjectPublicKeyInfo, standard base64.
    pub tls_public_key: String,
    /// The SSH public key (`authorized_keys` line).
    pub ssh_public_key: String,
    /// Requested certificate lifetime in seconds (0: the default).
    #[serde(default)]
    pub ttl_seconds: u64,
}

/// The answer: the signed certificates and where the Auth API is.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LoginAnswer {
    /// The user name.
    pub name: String,
    /// The cluster.
    pub cluster_name: String,
    /// The X.509 certificate (PEM).
    pub tls_cert_pem: String,
    /// The OpenSSH certificate.
    pub ssh_cert: String,
    /// The host and user CA certificates (PEM).
    pub tls_ca_pems: Vec<String>,
    /// The host and user OpenSSH CA keys.
    pub ssh_ca_keys: Vec<String>,
    /// When the certificates end (Unix seconds).
    pub not_after_unix: i64,
    /// The Auth API address clients such as `tctl` use with these certificates; absent: the
    /// proxy itself (TLS routing carries the Auth API on its web port).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_addr: Option<String>,
}

/// `POST /webapi/<kind>/login/console`: `tsh login --auth=<connector>` starting a single
/// sign-on (`<kind>`: `oidc`, `github` or `saml`).
pub fn sso_console_path(kind: &str) -> String {
    format!("/webapi/{kind}/login/console")
}

/// Where identity providers send the browser back: `/v1/webapi/<kind>/callback`.
pub fn sso_callback_path(kind: &str) -> String {
    format!("/v1/webapi/{kind}/callback")
}

/// The body of [`sso_console_path`].
#[derive(Debug, Serialize, Deserialize)]
pub struct SsoConsoleBody {
    /// The connector's name.
    pub connector_id: String,
    /// The loopback URL `tsh` listens on, with the `secret_key` the result is sealed with.
    pub redirect_url: Secret,
    /// The TLS public key, DER SubjectPublicKeyInfo in standard base64.
    pub tls_public_key: String,
    /// The SSH public key (OpenSSH line).
    pub ssh_public_key: String,
    /// Requested certificate lifetime in seconds (0: the default).
    #[serde(default)]
    pub ttl_seconds: u64,
}

/// The answer of [`sso_console_path`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SsoConsoleAnswer {
    /// The identity provider's URL for the user's browser.
    pub redirect_url: String,
}

/// What the browser brings back to `tsh`'s loopback listener, sealed ([`seal`]) in the
/// `response` query parameter.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SsoResult {
    /// Signed in: the certificates.
    Ok(LoginAnswer),
    /// Refused, and why.
    Error(String),
}

/// The query parameter of the loopback URL holding the sealing key (64 hex digits).
pub const SSO_SECRET_KEY_PARAM: &str = "secret_key";
/// The query parameter carrying the sealed result.
pub const SSO_RESPONSE_PARAM: &str = "response";
/// Where the proxy starts a single sign-on for the Web UI (`?kind=<kind>&connector_id=<name>`).
pub const SSO_WEB_BEGIN_PATH: &str = "/webapi/sso/web/begin";
/// Where a Web UI single sign-on comes back to the proxy that started it: the path-only
/// `redirect_url` (`?id=…&secret_key=…`) the Auth Service accepts besides `tsh`'s loopback URL.
pub const SSO_WEB_RETURN_PATH: &str = "/webapi/sso/web/return";

/// Why [`seal`] or [`open`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SealError {
    /// The key is not 64 hex digits.
    #[error("the sealing key must be 64 hex digits")]
    Key,
    /// The sealed text is not base64url, too short, or does not open with the key (tampered,
    /// or sealed for another sign-in).
    #[error("the sealed result does not open with this sign-in's key")]
    Open,
    /// The random source failed.
    #[error("the system random source failed")]
    Random,
}

fn seal_key(hex_key: &str) -> Result<ring::aead::LessSafeKey, SealError> {
    let raw = hex::decode(hex_key).map_err(|_| SealError::Key)?;
    let unbound = ring::aead::UnboundKey::new(&ring::aead::AES_256_GCM, &raw).map_err(|_| SealError::Key)?;
    Ok(ring::aead::LessSafeKey::new(unbound))
}

/// Seals `plain` with AES-256-GCM under `hex_key`: base64url of nonce ‖ ciphertext ‖ tag.
pub fn seal(hex_key: &str, plain: &[u8]) -> Result<String, SealError> {
    use base64::Engine;
    use ring::rand::SecureRandom;
    let key = seal_key(hex_key)?;
    let mut nonce = [0u8; 12];
    ring::rand::SystemRandom::new()
        .fill(&mut nonce)
        .map_err(|_| SealError::Random)?;
    let mut buf = plain.to_vec();
    key.seal_in_place_append_tag(
        ring::aead::Nonce::assume_unique_for_key(nonce),
        ring::aead::Aad::empty(),
        &mut buf,
    )
    .map_err(|_| SealError::Key)?;
    let mut out = nonce.to_vec();
    out.extend_from_slice(&buf);
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(out))
}

/// Opens what [`seal`] produced with the same key.
pub fn open(hex_key: &str, sealed: &str) -> Result<Vec<u8>, SealError> {
    use base64::Engine;
    let key = seal_key(hex_key)?;
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(sealed)
        .map_err(|_| SealError::Open)?;
    if raw.len() < 12 + 16 {
        return Err(SealError::Open);
    }
    let (nonce, rest) = raw.split_at(12);
    let nonce = ring::aead::Nonce::try_assume_unique_for_key(nonce).map_err(|_| SealError::Open)?;
    let mut buf = rest.to_vec();
    let plain = key
        .open_in_place(nonce, ring::aead::Aad::empty(), &mut buf)
        .map_err(|_| SealError::Open)?;
    Ok(plain.to_vec())
}

#[cfg(test)]
mod seal_tests {
    #[test]
    fn seal_round_trip_and_tamper() {
        let key = "11".repeat(32);
        let sealed = super::seal(&key, b"certs").unwrap();
        assert_eq!(super::open(&key, &sealed).unwrap(), b"certs");
        assert!(super::open(&"22".repeat(32), &sealed).is_err());
        let mut t = sealed.into_bytes();
        let last = t.len() - 1;
        t[last] = if t[last] == b'A' { b'B' } else { b'A' };
        assert!(super::open(&key, std::str::from_utf8(&t).unwrap()).is_err());
        assert!(super::seal("short", b"x").is_err());
    }
}
