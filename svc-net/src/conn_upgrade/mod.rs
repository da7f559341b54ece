//! Connection upgrade: svc's routed protocols inside an HTTPS request, for clients that reach
//! the proxy through a layer-7 load balancer which terminates TLS and drops ALPN.
//!
//! Where it sits: before its first connection to a proxy address, a client probes it: a TLS
//! handshake offering only ALPN [`alpn::PING`], which the proxy's web API negotiates. If the
//! handshake completes without it, or is refused with the `no_application_protocol` alert, a
//! load balancer answered. The client then sends `GET /webapi/connectionupgrade` over HTTPS
//! (ALPN `http/1.1`) with `Upgrade: alpn` (or the WebSocket form: `Upgrade: websocket` with
//! `Sec-WebSocket-Protocol: alpn`, the stream then carried in binary frames, see [`ws`]). After
//! `101 Switching Protocols` it runs the TLS handshake it wanted — its ALPN, SNI, trust and
//! client certificate — inside the upgraded stream; the proxy hands that stream to its ALPN
//! router as if it had arrived on the web port (`proxy::web::upgrade`).
//!
//! The probe's answer is remembered per address for the life of the process. The load
//! balancer's own certificate is checked per [`OuterTrust`]. [`MODE_ENV`] forces a form (or
//! turns the upgrade off).

pub mod ws;

use std::{
    collections::HashMap,
    future::Future,
    sync::{Arc, LazyLock, Mutex},
};

use base64::Engine;
use bytes::BytesMut;
use rustls::pki_types::ServerName;
use tokio::io::AsyncWriteExt;
use tokio_rustls::{TlsConnector, client::TlsStream};

use crate::io::{BoxIo, rewind::Rewind};
use crate::route::alpn;

/// The web API path of the upgrade.
pub const PATH: &str = "/webapi/connectionupgrade";
/// The `Upgrade` value of the plain form: the routed stream follows the `101` directly.
pub const UPGRADE_ALPN: &str = "alpn";
/// The `Upgrade` value of the WebSocket form.
pub const UPGRADE_WEBSOCKET: &str = "websocket";
/// The `Sec-WebSocket-Protocol` the WebSocket form asks for.
pub const WEBSOCKET_PROTOCOL: &str = "alpn";
/// Environment variable choosing how clients use the upgrade: `auto` (the default: only when
/// a load balancer answered the TLS handshake, then the `alpn` form), `alpn` or `websocket`
/// (always, in that form) or `off` (never).
pub const MODE_ENV: &str = "SVC_CONN_UPGRADE";

/// The GUID of the WebSocket handshake (RFC 6455 section 1.3).
const WEBSOCKET_GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
/// How long the probe's handshake may take; past it the client connects directly.
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// The largest response head accepted to the upgrade request.
const MAX_RESPONSE_HEAD: usize = 16 * 1024;

/// How a client uses the connection upgrade ([`MODE_ENV`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Upgrade only when the TLS handshake shows a load balancer answered it.
    #[default]
    Auto,
    /// Never upgrade.
    Off,
    /// Always upgrade, plain form.
    Alpn,
    /// Always upgrade, WebSocket form.
    WebSocket,
}

impl Mode {
    /// The mode [`MODE_ENV`] names; unset or empty is [`Mode::Auto`].
    pub fn from_env() -> Result<Mode, UpgradeError> {
        match std::env::var(MODE_ENV).ok().as_deref().map(str::trim) {
            None | Some("") | Some("auto") => Ok(Mode::Auto),
            Some("off") => Ok(Mode::Off),
            Some("alpn") => Ok(Mode::Alpn),
            Some("websocket") => Ok(Mode::WebSocket),
            Some(other) => Err(UpgradeError::Mode(other.to_owned())),
        }
    }
}

/// Why a connection to the proxy (direct or upgraded) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UpgradeError {
    /// [`MODE_ENV`] holds an unknown value.
    #[error("{MODE_ENV}={0:?}: expected auto, alpn, websocket or off")]
    Mode(String),
    /// Dialing the address failed.
    #[error("dialing {addr}: {reason}")]
    Dial {
        /// The proxy address.
        addr: String,
        /// What the dialer said.
        reason: String,
    },
    /// A TLS handshake failed (`stage` says which).
    #[error("TLS handshake with {addr} ({stage}): {source}")]
    Tls {
        /// The proxy address.
        addr: String,
        /// `direct`, `to the load balancer` or `inside the upgraded connection`.
        stage: &'static str,
        /// The handshake error.
        source: std::io::Error,
    },
    /// The upgrade request failed or was answered with something else than `101`.
    #[error("connection upgrade at {addr}: {reason}")]
    Upgrade {
        /// The proxy address.
        addr: String,
        /// What went wrong.
        reason: String,
    },
}

/// What clients learned per address: `true` when a load balancer answered.
static REQUIRED: LazyLock<Mutex<HashMap<String, bool>>> = LazyLock::new(Mutex::default);

fn remembered(addr: &str) -> Option<bool> {
    REQUIRED.lock().ok().and_then(|m| m.get(addr).copied())
}

fn remember(addr: &str, required: bool) {
    if let Ok(mut m) = REQUIRED.lock() {
        m.insert(addr.to_owned(), required);
    }
}

/// How the load balancer's own certificate (the outer handshake of the upgrade) is checked.
#[derive(Debug, Clone, Default)]
pub struct OuterTrust {
    /// Extra CAs (PEM) besides the public web roots and [`LB_CA_ENV`]: the client's own CA
    /// bundle (`tsh login --cacert`, the agent's proxy CA).
    pub extra_ca_pem: Option<Vec<u8>>,
    /// Check nothing (`--insecure`). What crosses the load balancer is still the inner TLS,
    /// which authenticates the proxy as without a load balancer.
    pub insecure: bool,
}

/// Environment variable naming a PEM bundle of CAs that issue load balancers' certificates
/// (trusted for the outer handshake of the upgrade only, in addition to the public web roots).
pub const LB_CA_ENV: &str = "SVC_LB_CA_FILE";

impl OuterTrust {
    fn config(&self, addr: &str) -> Result<Arc<rustls::ClientConfig>, UpgradeError> {
        let fail = |reason: String| UpgradeError::Upgrade {
            addr: addr.to_owned(),
            reason: format!("load balancer trust: {reason}"),
        };
        let mut config = if self.insecure {
            crate::tls::insecure_client_config().map_err(|e| fail(e.to_string()))?
        } else {
            let mut pem = self.extra_ca_pem.clone().unwrap_or_default();
            if let Some(path) = std::env::var_os(LB_CA_ENV).filter(|p| !p.is_empty()) {
                let file = std::fs::read(&path)
                    .map_err(|e| fail(format!("{LB_CA_ENV}={}: {e}", path.to_string_lossy())))?;
                pem.push(b'\n');
                pem.extend(file);
            }
            let extra = (!pem.iter().all(u8::is_ascii_whitespace)).then_some(pem);
            (*crate::tls::client_config(extra.as_deref()).map_err(|e| fail(e.to_string()))?).clone()
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// Whether a handshake error is the `no_application_protocol` alert (a TLS-terminating
/// server, such as nginx, that serves none of the ALPN names asked for).
fn no_application_protocol(e: &std::io::Error) -> bool {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .is_some_and(|r| {
            matches!(
                r,
                rustls::Error::AlertReceived(rustls::AlertDescription::NoApplicationProtocol)
            )
        })
}

/// The probe: a TLS handshake offering only [`alpn::PING`], which the proxy's web API
/// negotiates. It checks no certificate and sends nothing: it only learns who answered.
/// `Some(true)`: a load balancer (no ALPN, or the `no_application_protocol` alert);
/// `Some(false)`: the proxy; `None`: neither could be told (the real handshake will say why).
async fn probe(io: BoxIo, name: ServerName<'static>) -> Option<bool> {
    let mut config = crate::tls::insecure_client_config().ok()?;
    config.alpn_protocols = vec![alpn::PING.as_bytes().to_vec()];
    let handshake = TlsConnector::from(Arc::new(config)).connect(name, io);
    match tokio::time::timeout(PROBE_TIMEOUT, handshake).await {
        Ok(Ok(tls)) => Some(tls.get_ref().1.alpn_protocol() != Some(alpn::PING.as_bytes())),
        Ok(Err(e)) if no_application_protocol(&e) => Some(true),
        Ok(Err(_)) | Err(_) => None,
    }
}

/// A TLS stream to the proxy's router at `addr` under `config` (its ALPN, its trust, its
/// client certificate), through the connection upgrade when a load balancer that terminates
/// TLS is in the way or [`MODE_ENV`] says so. `dial` opens a fresh byte stream to `addr`.
///
/// In `auto` mode the first connection to an address is preceded by a probe ([`alpn::PING`]);
/// its answer is remembered for the life of the process.
pub async fn connect_tls<D, F, E>(
    dial: D,
    config: Arc<rustls::ClientConfig>,
    outer: &OuterTrust,
    name: ServerName<'static>,
    addr: &str,
) -> Result<TlsStream<BoxIo>, UpgradeError>
where
    D: Fn() -> F,
    F: Future<Output = Result<BoxIo, E>>,
    E: std::fmt::Display,
{
    let dial_err = |e: E| UpgradeError::Dial {
        addr: addr.to_owned(),
        reason: e.to_string(),
    };
    let mode = Mode::from_env()?;
    // The load balancer is addressed by the host the client dials (its SNI, its certificate);
    // `name` is for the proxy inside (the Auth API client, for one, uses a fixed name).
    let lb_name = lb_name(addr).unwrap_or_else(|| name.clone());
    let upgrade_needed = match mode {
        Mode::Off => false,
        Mode::Alpn | Mode::WebSocket => true,
        Mode::Auto => match remembered(addr) {
            Some(known) => known,
            None => {
                let io = dial().await.map_err(dial_err)?;
                // No answer either way (an older proxy closes a connection whose ALPN it does
                // not route): connect directly, as before the upgrade existed.
                let found = probe(io, lb_name.clone()).await.unwrap_or(false);
                if found {
                    tracing::info!(%addr, "a load balancer that terminates TLS answered; using the connection upgrade");
                }
                remember(addr, found);
                found
            }
        },
    };
    let mut io = dial().await.map_err(dial_err)?;
    let mut upgrade_needed = upgrade_needed;
    if upgrade_needed {
        let outer = outer.config(addr)?;
        match upgrade(io, outer, lb_name, addr, mode == Mode::WebSocket).await {
            Ok(upgraded) => io = upgraded,
            // The probe's answer came from a TLS server that is no HTTP server either (an
            // older Auth Service, a bare tunnel endpoint): connect directly after all.
            Err(UpgradeError::Tls { source, .. })
                if mode == Mode::Auto && no_application_protocol(&source) =>
            {
                tracing::debug!(%addr, "not an HTTP server either; connecting directly");
                remember(addr, false);
                upgrade_needed = false;
                io = dial().await.map_err(dial_err)?;
            }
            Err(e) => return Err(e),
        }
    }
    TlsConnector::from(config)
        .connect(name, io)
        .await
        .map_err(|source| UpgradeError::Tls {
            addr: addr.to_owned(),
            stage: if upgrade_needed {
                "inside the upgraded connection"
            } else {
                "direct"
            },
            source,
        })
}

/// Runs the upgrade request on a fresh stream to the load balancer: TLS with `outer` (ALPN
/// `http/1.1`), `GET` [`PATH`], `101`; returns the upgraded stream.
async fn upgrade(
    io: BoxIo,
    outer: Arc<rustls::ClientConfig>,
    name: ServerName<'static>,
    addr: &str,
    websocket: bool,
) -> Result<BoxIo, UpgradeError> {
    let fail = |reason: String| UpgradeError::Upgrade {
        addr: addr.to_owned(),
        reason,
    };
    let tls = TlsConnector::from(outer)
        .connect(name, io)
        .await
        .map_err(|source| UpgradeError::Tls {
            addr: addr.to_owned(),
            stage: "to the load balancer",
            source,
        })?;
    let mut stream = Rewind::new(Box::new(tls) as BoxIo);
    let key = base64::engine::general_purpose::STANDARD.encode(rand::random::<[u8; 16]>());
    let headers = if websocket {
        format!(
            "Upgrade: {UPGRADE_WEBSOCKET}\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Protocol: {WEBSOCKET_PROTOCOL}\r\n"
        )
    } else {
        format!("Upgrade: {UPGRADE_ALPN}\r\nConnection: Upgrade\r\n")
    };
    let request = format!("GET {PATH} HTTP/1.1\r\nHost: {addr}\r\n{headers}\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| fail(format!("sending the request: {e}")))?;
    stream
        .flush()
        .await
        .map_err(|e| fail(format!("sending the request: {e}")))?;

    let mut buf = BytesMut::with_capacity(1024);
    let (status, accept, head_len) = loop {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut headers);
        match resp.parse(&buf) {
            Ok(httparse::Status::Complete(n)) => {
                let accept = resp
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("sec-websocket-accept"))
                    .map(|h| String::from_utf8_lossy(h.value).into_owned());
                break (resp.code.unwrap_or(0), accept, n);
            }
            Ok(httparse::Status::Partial) => {}
            Err(e) => return Err(fail(format!("malformed response: {e}"))),
        }
        if buf.len() > MAX_RESPONSE_HEAD {
            return Err(fail(format!(
                "response head longer than {MAX_RESPONSE_HEAD} bytes"
            )));
        }
        match stream.read_more(&mut buf).await {
            Ok(0) => return Err(fail("closed before the response".into())),
            Ok(_) => {}
            Err(e) => return Err(fail(format!("reading the response: {e}"))),
        }
    };
    if status != 101 {
        let body = String::from_utf8_lossy(&buf[head_len..]).trim().to_owned();
        return Err(fail(format!(
            "answered {status} instead of 101 Switching Protocols (does the load balancer pass the Upgrade and Connection headers?) {body}"
        )));
    }
    if websocket && accept.as_deref() != Some(websocket_accept(&key).as_str()) {
        return Err(fail("wrong Sec-WebSocket-Accept in the 101 answer".into()));
    }
    // Bytes after the head belong to the upgraded stream.
    let rest = buf.split_off(head_len).freeze();
    stream.rewind(rest);
    Ok(if websocket {
        Box::new(ws::WsStream::new(stream, ws::Role::Client))
    } else {
        Box::new(stream)
    })
}

/// The TLS name of `addr`'s host (`host:port`, `[v6]:port`).
fn lb_name(addr: &str) -> Option<ServerName<'static>> {
    let addr = svc_core::Addr::parse(addr).ok()?;
    let host = addr
        .host_str()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    ServerName::try_from(host).ok()
}

/// The `Sec-WebSocket-Accept` value for a `Sec-WebSocket-Key`.
pub fn websocket_accept(key: &str) -> String {
    let digest = ring::digest::digest(
        &ring::digest::SHA1_FOR_LEGACY_USE_ONLY,
        format!("{key}{WEBSOCKET_GUID}").as_bytes(),
    );
    base64::engine::general_purpose::STANDARD.encode(digest.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_load_balancer_is_named_by_the_dialed_host() {
        assert_eq!(
            lb_name("proxy.example.com:443").map(|n| n.to_str().into_owned()),
            Some("proxy.example.com".to_owned())
        );
        assert_eq!(
            lb_name("[::1]:3080").map(|n| n.to_str().into_owned()),
            Some("::1".to_owned())
        );
    }

    #[test]
    fn websocket_accept_matches_the_rfc_example() {
        assert_eq!(
            websocket_accept("dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }
}
