//! The web terminal: `GET /webapi/terminal?node=&login=&cols=&rows=` upgraded to a WebSocket.
//!
//! Data flow: the browser (cookie-authenticated, its `Origin` this proxy's own — the CSRF
//! defence for WebSockets, which browsers open cross-site with cookies) → this handler answers
//! `101` and takes the upgraded connection → it opens an SSH session exactly as `tsh ssh` does
//! ([`crate::client::ssh::open_session`]): to this proxy's own SSH entry with the **user's**
//! certificate, the proxy's node RBAC, then the node's own checks through the tunnel → a PTY of
//! `cols`×`rows` and a shell → binary frames carry terminal bytes both ways untouched (UTF-8
//! included), a text frame `{"type":"resize","cols":N,"rows":N}` becomes an SSH window change;
//! the server ends with `{"type":"exit","code":N}` or `{"type":"error","message":"…"}` and a
//! normal close. The terminal also ends when the web session does (logout, lock, deletion,
//! expiry), checked every [`SESSION_CHECK`].

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, header};
use hyper_util::rt::TokioIo;
use russh::ChannelMsg;
use serde_json::json;
use svc_core::Addr;
use svc_core::proxy_env::ProxyEnv;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, frame::coding::CloseCode};

use super::api::{host_of, parse_query};
use super::session::{WebError, WebSessions, WebUser};
use super::{Body, ResponseBody, UpgradedTask, WebService, full, web_service};
use crate::client::ssh::{Target, open_session};
use crate::client::{ProxyEndpoint, SshIdentity};

/// The terminal's path.
pub const TERMINAL_PATH: &str = "/webapi/terminal";
/// How often an open terminal checks that its web session still lives.
pub const SESSION_CHECK: Duration = Duration::from_secs(5);
/// The largest terminal size accepted (either dimension).
const MAX_DIMENSION: u32 = 1000;

/// The terminal handler. The proxy's own SSH entry ([`set_ssh_addr`](Self::set_ssh_addr)) is
/// known once its listeners are bound.
#[derive(Clone, Debug)]
pub struct TerminalService {
    sessions: WebSessions,
    ssh_addr: Arc<OnceLock<Addr>>,
    public_hosts: Arc<[String]>,
}

impl TerminalService {
    /// A terminal over `sessions`; `public_hosts` are extra `host[:port]` origins accepted
    /// besides the host the request names (the proxy's public address).
    pub fn new(sessions: WebSessions, public_hosts: Vec<String>) -> Self {
        Self {
            sessions,
            ssh_addr: Arc::default(),
            public_hosts: public_hosts.into(),
        }
    }

    /// Where the proxy accepts plain SSH from clients (its web port in multiplex mode, its SSH
    /// port otherwise): set once after bind.
    pub fn set_ssh_addr(&self, addr: Addr) {
        let _ = self.ssh_addr.set(addr);
    }

    /// The handler to mount at [`TERMINAL_PATH`].
    pub fn service(&self) -> WebService {
        let this = self.clone();
        web_service(tower::service_fn(move |req: Request<Body>| {
            let this = this.clone();
            async move {
                Ok::<_, std::convert::Infallible>(match this.handle(req).await {
                    Ok(r) => r,
                    Err(e) => e.into_response(),
                })
            }
        }))
    }

    /// Whether `origin` is this proxy's own: `https://` and the host the request was sent to,
    /// or one of the public hosts.
    fn origin_allowed(&self, origin: Option<&str>, host: &str) -> bool {
        let Some(origin) = origin.and_then(|o| o.strip_prefix("https://")) else {
            return false;
        };
        let origin = origin.trim_end_matches('/').to_ascii_lowercase();
        let host = host.to_ascii_lowercase();
        (!host.is_empty() && origin == host)
            || self
                .public_hosts
                .iter()
                .any(|h| h.eq_ignore_ascii_case(&origin) || origin == format!("{h}:443"))
    }

    async fn handle(&self, mut req: Request<Body>) -> Result<Response<ResponseBody>, WebError> {
        if req.uri().path() != TERMINAL_PATH {
            return Err(WebError::NotFound(format!("not found: {}", req.uri().path())));
        }
        if req.method() != http::Method::GET {
            return Err(WebError::BadRequest(format!("use GET on {TERMINAL_PATH}")));
        }
        let origin = req.headers().get(header::ORIGIN).and_then(|o| o.to_str().ok());
        if !self.origin_allowed(origin, &host_of(&req)) {
            return Err(WebError::Forbidden(format!(
                "the WebSocket's Origin ({}) is not this proxy's: refused",
                origin.unwrap_or("none")
            )));
        }
        let user = self.sessions.authenticate(req.headers(), false).await?;
        let query = parse_query(req.uri().query().unwrap_or_default());
        let node = query
            .get("node")
            .filter(|n| !n.is_empty())
            .cloned()
            .ok_or_else(|| WebError::BadRequest("node: expected a node name or host ID".into()))?;
        let login = query
            .get("login")
            .filter(|l| !l.is_empty())
            .cloned()
            .ok_or_else(|| WebError::BadRequest("login: expected the OS login to use".into()))?;
        let dimension = |field: &str, default: u32| -> Result<u32, WebError> {
            match query.get(field).filter(|v| !v.is_empty()) {
                None => Ok(default),
                Some(v) => v
                    .parse::<u32>()
                    .ok()
                    .filter(|n| (1..=MAX_DIMENSION).contains(n))
                    .ok_or_else(|| {
                        WebError::BadRequest(format!("{field}: expected 1 to {MAX_DIMENSION}, not {v}"))
                    }),
            }
        };
        let (cols, rows) = (dimension("cols", 80)?, dimension("rows", 24)?);
        if req.version() != http::Version::HTTP_11 {
            return Err(WebError::BadRequest(
                "the terminal's WebSocket needs HTTP/1.1".into(),
            ));
        }
        let accept = websocket_accept(req.headers())?;
        let ssh_addr = self
            .ssh_addr
            .get()
            .cloned()
            .ok_or_else(|| WebError::Unavailable("the proxy is starting".into()))?;
        let on_upgrade = hyper::upgrade::on(&mut req);
        let slot = req.extensions().get::<UpgradedTask>().cloned();
        // The session is checked again with the cookie while the terminal runs.
        let mut cookie_headers = HeaderMap::new();
        for v in req.headers().get_all(header::COOKIE) {
            cookie_headers.append(header::COOKIE, v.clone());
        }
        let sessions = self.sessions.clone();
        let task = tokio::spawn(async move {
            let upgraded = match on_upgrade.await {
                Ok(u) => TokioIo::new(u),
                Err(e) => {
                    tracing::debug!(error = %e, "the terminal's WebSocket upgrade did not complete");
                    return;
                }
            };
            let ws = WebSocketStream::from_raw_socket(upgraded, Role::Server, None).await;
            let spec = Spec {
                node,
                login,
                cols,
                rows,
                ssh_addr,
            };
            run(ws, &user, spec, sessions, cookie_headers).await;
        });
        if let Some(slot) = slot {
            slot.set(task);
        }
        let mut resp = Response::new(full(""));
        *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let h = resp.headers_mut();
        h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert(
            header::SEC_WEBSOCKET_ACCEPT,
            HeaderValue::from_str(&accept).map_err(|e| WebError::Upstream(e.to_string()))?,
        );
        Ok(resp)
    }
}

fn has_token(headers: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// The `Sec-WebSocket-Accept` for a valid WebSocket upgrade request.
fn websocket_accept(headers: &HeaderMap) -> Result<String, WebError> {
    if !has_token(headers, header::UPGRADE, "websocket") || !has_token(headers, header::CONNECTION, "upgrade")
    {
        return Err(WebError::BadRequest(
            "the terminal is a WebSocket: expected Connection: Upgrade and Upgrade: websocket".into(),
        ));
    }
    if headers
        .get(header::SEC_WEBSOCKET_VERSION)
        .map(HeaderValue::as_bytes)
        != Some(b"13")
    {
        return Err(WebError::BadRequest("Sec-WebSocket-Version: expected 13".into()));
    }
    let key = headers
        .get(header::SEC_WEBSOCKET_KEY)
        .ok_or_else(|| WebError::BadRequest("Sec-WebSocket-Key: missing".into()))?;
    Ok(derive_accept_key(key.as_bytes()))
}

/// What the browser asked for.
struct Spec {
    node: String,
    login: String,
    cols: u32,
    rows: u32,
    ssh_addr: Addr,
}

/// A frame from the browser in text form.
#[derive(serde::Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Control {
    Resize { cols: u32, rows: u32 },
}

type Ws = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

/// Sends the closing text frame and a normal close.
async fn finish(ws: &mut Ws, last: serde_json::Value) {
    let _ = ws.send(Message::text(last.to_string())).await;
    let _ = ws
        .close(Some(CloseFrame {
            code: CloseCode::Normal,
            reason: "".into(),
        }))
        .await;
}

async fn run(mut ws: Ws, user: &WebUser, spec: Spec, sessions: WebSessions, cookie: HeaderMap) {
    let node = spec.node.clone();
    match terminal(&mut ws, user, spec, &sessions, &cookie).await {
        Ok(code) => {
            tracing::info!(user = %user.username, %node, code, "web terminal ended");
            finish(&mut ws, json!({ "type": "exit", "code": code })).await;
        }
        Err(message) => {
            tracing::info!(user = %user.username, %node, %message, "web terminal refused or failed");
            finish(&mut ws, json!({ "type": "error", "message": message })).await;
        }
    }
}

/// Runs the shell; its exit status, or why not.
async fn terminal(
    ws: &mut Ws,
    user: &WebUser,
    spec: Spec,
    sessions: &WebSessions,
    cookie: &HeaderMap,
) -> Result<u32, String> {
    let identity = &user.identity;
    let verifier = Arc::new(identity.verifier().map_err(|e| e.to_string())?);
    let dialer = crate::dial::ProxyDialer::builder(ProxyEnv::default())
        .build()
        .map_err(|e| e.to_string())?;
    // The proxy's own SSH entry on loopback: plain SSH, the proxy authenticated by its host
    // certificate against the cluster's host CA (as `tsh ssh --insecure` does).
    let endpoint = ProxyEndpoint {
        addr: spec.ssh_addr,
        tls: false,
        verifier: verifier.clone(),
        extra_ca_pem: None,
        dialer,
        timeout: Duration::from_secs(30),
    };
    let ssh_identity = SshIdentity {
        key: Arc::new(identity.ssh_private_key().map_err(|e| e.to_string())?),
        cert: identity.ssh_certificate().map_err(|e| e.to_string())?,
        login: spec.login.clone(),
    };
    let target = Target {
        login: Some(spec.login.clone()),
        host: spec.node.clone(),
        port: 0,
    };
    let session = open_session(&endpoint, &ssh_identity, verifier, &target)
        .await
        .map_err(|e| e.to_string())?;
    tracing::info!(user = %user.username, node = %spec.node, login = %spec.login, "web terminal opened");
    let mut channel = session.channel_open_session().await.map_err(|e| e.to_string())?;
    channel
        .request_pty(true, "xterm-256color", spec.cols, spec.rows, 0, 0, &[])
        .await
        .map_err(|e| e.to_string())?;
    channel.request_shell(true).await.map_err(|e| e.to_string())?;
    let mut status = None;
    let mut check = tokio::time::interval(SESSION_CHECK);
    check.tick().await;
    loop {
        tokio::select! {
            msg = channel.wait() => match msg {
                Some(ChannelMsg::Data { data }) | Some(ChannelMsg::ExtendedData { data, .. }) => {
                    ws.send(Message::binary(data.to_vec())).await.map_err(|e| e.to_string())?;
                }
                Some(ChannelMsg::ExitStatus { exit_status }) => status = Some(exit_status),
                Some(ChannelMsg::Close) | None => break,
                Some(_) => {}
            },
            frame = ws.next() => match frame {
                Some(Ok(Message::Binary(bytes))) => {
                    channel.data(&bytes[..]).await.map_err(|e| e.to_string())?;
                }
                Some(Ok(Message::Text(text))) => match serde_json::from_str::<Control>(text.as_str()) {
                    Ok(Control::Resize { cols, rows }) => {
                        let (cols, rows) = (cols.clamp(1, MAX_DIMENSION), rows.clamp(1, MAX_DIMENSION));
                        channel.window_change(cols, rows, 0, 0).await.map_err(|e| e.to_string())?;
                    }
                    Err(e) => return Err(format!("expected {{\"type\":\"resize\",\"cols\":N,\"rows\":N}}: {e}")),
                },
                Some(Ok(Message::Close(_))) | None => {
                    let _ = channel.eof().await;
                    let _ = session.disconnect(russh::Disconnect::ByApplication, "", "").await;
                    return Ok(status.unwrap_or(0));
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(format!("the browser's WebSocket: {e}")),
            },
            _ = check.tick() => {
                if let Err(e) = sessions.authenticate(cookie, false).await {
                    let _ = session.disconnect(russh::Disconnect::ByApplication, "", "").await;
                    return Err(e.to_string());
                }
            }
        }
    }
    let _ = session.disconnect(russh::Disconnect::ByApplication, "", "").await;
    status.ok_or_else(|| format!("the session on {} ended without an exit status", spec.node))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_frames_parse() {
        let c: Control = serde_json::from_str(r#"{"type":"resize","cols":120,"rows":40}"#).expect("resize");
        let Control::Resize { cols, rows } = c;
        assert_eq!((cols, rows), (120, 40));
        assert!(serde_json::from_str::<Control>(r#"{"type":"other"}"#).is_err());
    }
}
