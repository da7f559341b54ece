//! Connection upgrade: svc's routed protocols inside an HTTPS request, for clients that reach
//! the proxy through a layer-7 load balancer which terminates TLS and drops ALPN.
//!
//! Where it sits: a client that wants, say, `svc-reversetunnel` first tries TLS to the proxy
//! address with that ALPN ([`connect_tls`]). If the handshake completes without the ALPN it
//! asked for, or is refused with the `no_application_protocol` alert, a load balancer answered
//! it. The client then sends `GET /webapi/connectionupgrade` over HTTPS (ALPN `http/1.1`) with
//! `Upgrade: alpn` (or the WebSocket form: `Upgrade: websocket` with
//! `Sec-WebSocket-Protocol: alpn`, the stream then carried in binary frames, see [`ws`]). After
//! `101 Switching Protocols` it runs the TLS handshake it wanted — its ALPN, SNI and client
//! certificate — inside the upgraded stream; the proxy hands that stream to its ALPN router
//! as if it had arrived on the web port (`proxy::web::upgrade`).
//!
//! The outer handshake (to the load balancer) checks the balancer's certificate with the same
//! trust as the inner one (public web roots, the extra CA bundle given to the client, the
//! cluster CA), so a balancer's own certificate must chain to one of those. What a client
//! learned about an address is remembered for the life of the process: later dials go straight
//! to the upgrade. [`MODE_ENV`] forces a form (or turns the upgrade off).

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

/// Whether a finished handshake shows that a load balancer answered: the client asked for
/// ALPN and got none of it.
fn alpn_missing(config: &rustls::ClientConfig, negotiated: Option<&[u8]>) -> bool {
    !config.alpn_protocols.is_empty()
        && !negotiated.is_some_and(|p| config.alpn_protocols.iter().any(|w| w == p))
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

/// A TLS stream to the proxy's router at `addr` under `config` (its ALPN, its client
/// certificate), through the connection upgrade when a load balancer is in the way or
/// [`MODE_ENV`] says so. `dial` opens a fresh byte stream to `addr` (it is called again for
/// the upgrade after a probe the load balancer answered).
pub async fn connect_tls<D, F, E>(
    dial: D,
    config: Arc<rustls::ClientConfig>,
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
    let tls_err = |stage, source| UpgradeError::Tls {
        addr: addr.to_owned(),
        stage,
        source,
    };
    let mode = Mode::from_env()?;
    let websocket = mode == Mode::WebSocket;
    let forced = matches!(mode, Mode::Alpn | Mode::WebSocket);
    if !forced && (mode == Mode::Off || remembered(addr) != Some(true)) {
        let io = dial().await.map_err(dial_err)?;
        match TlsConnector::from(config.clone()).connect(name.clone(), io).await {
            Ok(tls) if mode == Mode::Off || !alpn_missing(&config, tls.get_ref().1.alpn_protocol()) => {
                remember(addr, false);
                return Ok(tls);
            }
            Ok(_) => {
                tracing::info!(%addr, "the TLS handshake ended without the ALPN asked for (a load balancer answered it); using the connection upgrade");
            }
            Err(e) if mode != Mode::Off && no_application_protocol(&e) => {
                tracing::info!(%addr, "the TLS handshake was refused for its ALPN (a load balancer answered it); using the connection upgrade");
            }
            Err(e) => return Err(tls_err("direct", e)),
        }
        remember(addr, true);
    }
    let io = dial().await.map_err(dial_err)?;
    let upgraded = upgrade(io, &config, name.clone(), addr, websocket).await?;
    TlsConnector::from(config)
        .connect(name, upgraded)
        .await
        .map_err(|e| tls_err("inside the upgraded connection", e))
}

/// Runs the upgrade request on a fresh stream to the load balancer: TLS with `config`'s trust
/// and ALPN `http/1.1`, `GET` [`PATH`], `101`; returns the upgraded stream.
async fn upgrade(
    io: BoxIo,
    config: &rustls::ClientConfig,
    name: ServerName<'static>,
    addr: &str,
    websocket: bool,
) -> Result<BoxIo, UpgradeError> {
    let fail = |reason: String| UpgradeError::Upgrade {
        addr: addr.to_owned(),
        reason,
    };
    let mut outer = config.clone();
    outer.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tls = TlsConnector::from(Arc::new(outer))
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
    fn websocket_accept_matches_the_rfc_example() {
        assert_eq!(
            websocket_accept("dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaE9kWKGkgxOo4OZ2Q="
        );
    }
}
