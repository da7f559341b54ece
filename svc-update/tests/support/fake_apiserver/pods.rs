//! The fake's pod subresources, as the kubelet would serve them behind the API server:
//!
//! - `exec` and `attach` (which runs the container's `command` and `args` for the session):
//!   WebSocket (`v5.channel.k8s.io`, `v4.channel.k8s.io`) with kubectl's channel
//!   framing (each binary message starts with its stream id: 0 stdin, 1 stdout, 2 stderr,
//!   3 the final `Status`; in v5, a client message `[255, 0]` closes stdin). The "container" is
//!   this machine: the command runs as a local process, so `kubectl exec -- echo hi`,
//!   `kubectl exec -i -- cat` and `kubectl cp` (which runs `tar` through exec) really work.
//!   Or bare SPDY/3.1 with `v4.channel.k8s.io` (kubectl with
//!   `KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false`, older clients; see [`super::spdy`]).
//! - `portforward`: SPDY/3.1 (see [`super::spdy`]), tunnelled in WebSocket binary messages
//!   (subprotocol `SPDY/3.1+portforward.k8s.io`, kubectl's default) or bare
//!   (`Upgrade: SPDY/3.1`, with `KUBECTL_PORT_FORWARD_WEBSOCKETS=false` or older clients).
//! - `log`: the lines given to [`FakeApiServer::append_log`], `follow=true` keeping the stream
//!   open and sending each new line as it is appended.

use std::process::Stdio;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::stream;
use http::{Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Empty, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::Mutex;

use super::{Body, State, decode, status};

/// The WebSocket subprotocols the fake's exec speaks, preferred first.
const EXEC_PROTOCOLS: [&str; 2] = ["v5.channel.k8s.io", "v4.channel.k8s.io"];

/// `/api/v1/namespaces/<ns>/pods/<name>/<sub>` → (ns, name, sub), for the subresources served
/// here.
pub(super) fn subresource(path: &str) -> Option<(String, String, String)> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segments.as_slice() {
        [
            "api",
            "v1",
            "namespaces",
            ns,
            "pods",
            name,
            sub @ ("exec" | "attach" | "log" | "portforward"),
        ] => Some(((*ns).to_owned(), (*name).to_owned(), (*sub).to_owned())),
        _ => None,
    }
}

/// Every value of `key` in `query`, decoded (`command` repeats).
fn all_values(query: &str, key: &str) -> Vec<String> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| *k == key)
        .map(|(_, v)| decode(v))
        .collect()
}

fn flag(query: &str, key: &str) -> bool {
    all_values(query, key).iter().any(|v| v == "true" || v == "1")
}

/// Serves `sub` (`exec` or `log`) of pod `ns/name`.
pub(super) async fn serve(
    state: Arc<State>,
    mut req: Request<Incoming>,
    ns: &str,
    name: &str,
    sub: &str,
) -> Response<Body> {
    let pod = state
        .inner
        .lock()
        .unwrap()
        .objects
        .get(&("pods", ns.to_owned(), name.to_owned()))
        .cloned();
    let Some(pod) = pod else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("pods \"{name}\" not found"),
        );
    };
    let query = req.uri().query().unwrap_or("").to_owned();
    if sub == "log" {
        return log_response(state, ns, name, flag(&query, "follow"));
    }
    if sub == "portforward" {
        return portforward(req);
    }
    // attach: the container's own command (`command` and `args` of the container named by
    // `container`, else the first), run for the session.
    let command = if sub == "attach" {
        let containers = pod["spec"]["containers"].as_array().cloned().unwrap_or_default();
        let wanted = all_values(&query, "container");
        let container = containers
            .iter()
            .find(|c| wanted.first().is_none_or(|w| c["name"] == w.as_str()))
            .cloned()
            .unwrap_or_default();
        ["command", "args"]
            .iter()
            .flat_map(|k| container[k].as_array().cloned().unwrap_or_default())
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect()
    } else {
        all_values(&query, "command")
    };
    if let Some(resp) = exec_over_spdy(&mut req, &query, command.clone()) {
        return resp;
    }
    let websocket = req
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let offered: Vec<String> = req
        .headers()
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|p| p.trim().to_owned()))
        .collect();
    let protocol = EXEC_PROTOCOLS.iter().find(|p| offered.iter().any(|o| o == *p));
    let key = req
        .headers()
        .get(header::SEC_WEBSOCKET_KEY)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let (Some(protocol), Some(key), true) = (protocol, key, websocket) else {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!(
                "the fake's exec speaks WebSocket ({}) or SPDY/3.1 ({}); offered upgrade {:?}, protocols {offered:?}",
                EXEC_PROTOCOLS.join(", "),
                EXEC_PROTOCOLS[1],
                req.headers().get(header::UPGRADE)
            ),
        );
    };
    if command.is_empty() {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "you must specify at least 1 command".into(),
        );
    }
    let stdin = flag(&query, "stdin");
    let v5 = *protocol == EXEC_PROTOCOLS[0];
    let upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        match upgrade.await {
            Ok(io) => exec_session(TokioIo::new(io), command, stdin, v5).await,
            Err(e) => eprintln!("fake apiserver: exec upgrade failed: {e}"),
        }
    });
    switch_to_websocket(protocol, &key)
}

/// An exec over bare SPDY/3.1 offering `v4.channel.k8s.io`: switches and runs the command
/// over SPDY streams (see [`super::spdy`]). `None` when `req` is no such offer.
fn exec_over_spdy(req: &mut Request<Incoming>, query: &str, command: Vec<String>) -> Option<Response<Body>> {
    let h = req.headers();
    let spdy = h
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("SPDY/3.1"));
    let v4 = h
        .get_all("x-stream-protocol-version")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.split(',').any(|p| p.trim() == EXEC_PROTOCOLS[1]));
    if !(spdy && v4) {
        return None;
    }
    let exec = super::spdy::Exec {
        command,
        stdin: flag(query, "stdin"),
        stdout: flag(query, "stdout"),
        stderr: flag(query, "stderr"),
    };
    if exec.command.is_empty() {
        return Some(status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "you must specify at least 1 command".into(),
        ));
    }
    let upgrade = hyper::upgrade::on(req);
    tokio::spawn(async move {
        match upgrade.await {
            Ok(io) => super::spdy::session(TokioIo::new(io), Some(exec)).await,
            Err(e) => eprintln!("fake apiserver: exec upgrade failed: {e}"),
        }
    });
    let mut resp = Response::new(Empty::new().map_err(|never| match never {}).boxed());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(header::UPGRADE, header::HeaderValue::from_static("SPDY/3.1"));
    h.insert(header::CONNECTION, header::HeaderValue::from_static("Upgrade"));
    h.insert(
        "x-stream-protocol-version",
        header::HeaderValue::from_static(EXEC_PROTOCOLS[1]),
    );
    Some(resp)
}

/// The WebSocket subprotocol of SPDY tunnelled in WebSocket binary messages.
const TUNNEL_PROTOCOL: &str = "SPDY/3.1+portforward.k8s.io";

/// A WebSocket upgrade offering [`TUNNEL_PROTOCOL`] (kubectl's default): switches, then runs
/// the SPDY session over the messages' bytes. `None` when `req` is no such offer.
fn portforward_over_websocket(req: &mut Request<Incoming>) -> Option<Response<Body>> {
    let h = req.headers();
    let websocket = h
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let offered = h
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.split(',').any(|p| p.trim() == TUNNEL_PROTOCOL));
    let key = h
        .get(header::SEC_WEBSOCKET_KEY)
        .and_then(|v| v.to_str().ok())?
        .to_owned();
    if !(websocket && offered) {
        return None;
    }
    let upgrade = hyper::upgrade::on(req);
    tokio::spawn(async move {
        match upgrade.await {
            Ok(io) => {
                // SPDY bytes ↔ binary messages.
                let (near, far) = tokio::io::duplex(64 * 1024);
                tokio::spawn(super::spdy::session(far, None));
                let (mut ws_rd, mut ws_wr) = tokio::io::split(TokioIo::new(io));
                let (mut rd, mut wr) = tokio::io::split(near);
                let inbound = async move {
                    while let Ok((opcode, payload)) = read_frame(&mut ws_rd).await {
                        match opcode {
                            0x8 => break,
                            0x0..=0x2 if wr.write_all(&payload).await.is_err() => break,
                            _ => {}
                        }
                    }
                    let _ = wr.shutdown().await;
                };
                let outbound = async move {
                    let mut buf = vec![0u8; 32 * 1024];
                    while let Ok(n @ 1..) = rd.read(&mut buf).await {
                        if write_frame(&mut ws_wr, 0x2, &buf[..n]).await.is_err() {
                            return;
                        }
                    }
                    let _ = write_frame(&mut ws_wr, 0x8, &1000u16.to_be_bytes()).await;
                    let _ = ws_wr.shutdown().await;
                };
                tokio::join!(inbound, outbound);
            }
            Err(e) => eprintln!("fake apiserver: portforward upgrade failed: {e}"),
        }
    });
    Some(switch_to_websocket(TUNNEL_PROTOCOL, &key))
}

/// `101 Switching Protocols` to WebSocket with `protocol`, answering `key`.
fn switch_to_websocket(protocol: &'static str, key: &str) -> Response<Body> {
    let mut resp = Response::new(Empty::new().map_err(|never| match never {}).boxed());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(header::UPGRADE, header::HeaderValue::from_static("websocket"));
    h.insert(header::CONNECTION, header::HeaderValue::from_static("Upgrade"));
    h.insert(
        header::SEC_WEBSOCKET_PROTOCOL,
        header::HeaderValue::from_static(protocol),
    );
    h.insert(
        header::SEC_WEBSOCKET_ACCEPT,
        header::HeaderValue::from_str(&accept_key(key)).expect("base64 is a header value"),
    );
    resp
}

/// Switches to SPDY/3.1 for a port-forward, bare (`Upgrade: SPDY/3.1`) or tunnelled in
/// WebSocket; anything else is a `400`.
fn portforward(mut req: Request<Incoming>) -> Response<Body> {
    if let Some(resp) = portforward_over_websocket(&mut req) {
        return resp;
    }
    let h = req.headers();
    let spdy = h
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("SPDY/3.1"));
    let portforward = h
        .get_all("x-stream-protocol-version")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.split(',').any(|p| p.trim() == "portforward.k8s.io"));
    if !(spdy && portforward) {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!(
                "the fake's portforward speaks SPDY/3.1 (portforward.k8s.io), bare or tunnelled in WebSocket ({TUNNEL_PROTOCOL}); offered upgrade {:?}",
                h.get(header::UPGRADE)
            ),
        );
    }
    let upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        match upgrade.await {
            Ok(io) => super::spdy::session(TokioIo::new(io), None).await,
            Err(e) => eprintln!("fake apiserver: portforward upgrade failed: {e}"),
        }
    });
    let mut resp = Response::new(Empty::new().map_err(|never| match never {}).boxed());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(header::UPGRADE, header::HeaderValue::from_static("SPDY/3.1"));
    h.insert(header::CONNECTION, header::HeaderValue::from_static("Upgrade"));
    h.insert(
        "x-stream-protocol-version",
        header::HeaderValue::from_static("portforward.k8s.io"),
    );
    resp
}

/// The pod's log lines, then (following) each new one as it is appended.
fn log_response(state: Arc<State>, ns: &str, name: &str, follow: bool) -> Response<Body> {
    let key = (ns.to_owned(), name.to_owned());
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(64);
    let mut changed = state.log_tx.subscribe();
    tokio::spawn(async move {
        let mut sent = 0;
        loop {
            let lines: Vec<String> = {
                let inner = state.inner.lock().unwrap();
                inner
                    .logs
                    .get(&key)
                    .map(|l| l[sent.min(l.len())..].to_vec())
                    .unwrap_or_default()
            };
            sent += lines.len();
            for line in lines {
                if tx.send(Bytes::from(format!("{line}\n"))).await.is_err() {
                    return;
                }
            }
            if !follow {
                return;
            }
            tokio::select! {
                c = changed.changed() => if c.is_err() { return },
                _ = tx.closed() => return,
            }
        }
    });
    let body = StreamBody::new(stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, std::convert::Infallible>(Frame::data(b)), rx))
    }));
    let mut response = Response::new(BodyExt::boxed(body));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain"),
    );
    response
}

/// Runs `command` locally with the WebSocket `io` as its stdin, stdout and stderr (channel
/// framing), then sends its exit as the `Status` on stream 3 and closes.
async fn exec_session<S>(io: S, command: Vec<String>, stdin: bool, v5: bool)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut rd, wr) = tokio::io::split(io);
    let wr = Arc::new(Mutex::new(wr));
    let child = tokio::process::Command::new(&command[0])
        .args(&command[1..])
        .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            let failure = json!({"metadata": {}, "status": "Failure",
                "message": format!("exec: \"{}\": {e}", command[0]), "reason": "InternalError"});
            finish(&wr, failure).await;
            return;
        }
    };
    // The client's messages: stdin data, the v5 close signal, pings, the close frame.
    let mut child_stdin = child.stdin.take();
    let pong = wr.clone();
    let reader = tokio::spawn(async move {
        while let Ok((opcode, payload)) = read_frame(&mut rd).await {
            match opcode {
                0x8 => break,
                0x9 => {
                    let _ = write_frame(&mut *pong.lock().await, 0xA, &payload).await;
                }
                0x0..=0x2 => match payload.split_first() {
                    Some((0, data)) => {
                        if let Some(s) = child_stdin.as_mut()
                            && s.write_all(data).await.is_err()
                        {
                            child_stdin = None;
                        }
                    }
                    Some((255, [0])) if v5 => child_stdin = None,
                    _ => {}
                },
                _ => {}
            }
        }
    });
    let pump = |out: Option<Box<dyn AsyncRead + Unpin + Send>>, id: u8| {
        let wr = wr.clone();
        async move {
            let Some(mut out) = out else { return };
            let mut buf = vec![0u8; 32 * 1024];
            loop {
                match out.read(&mut buf[1..]).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        buf[0] = id;
                        if write_frame(&mut *wr.lock().await, 0x2, &buf[..=n]).await.is_err() {
                            return;
                        }
                    }
                }
            }
        }
    };
    let stdout = child
        .stdout
        .take()
        .map(|s| Box::new(s) as Box<dyn AsyncRead + Unpin + Send>);
    let stderr = child
        .stderr
        .take()
        .map(|s| Box::new(s) as Box<dyn AsyncRead + Unpin + Send>);
    tokio::join!(pump(stdout, 1), pump(stderr, 2));
    let exit = child.wait().await;
    reader.abort();
    finish(&wr, exit_status(exit)).await;
}

/// The `Status` the kubelet reports for a command's exit.
pub(super) fn exit_status(exit: std::io::Result<std::process::ExitStatus>) -> serde_json::Value {
    match exit {
        Ok(s) if s.success() => json!({"metadata": {}, "status": "Success"}),
        Ok(s) => {
            let code = s.code().unwrap_or(-1);
            json!({"metadata": {}, "status": "Failure",
                "message": format!("command terminated with non-zero exit code: {code}"),
                "reason": "NonZeroExitCode",
                "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]}})
        }
        Err(e) => json!({"metadata": {}, "status": "Failure", "message": e.to_string(),
            "reason": "InternalError"}),
    }
}

/// Sends `result` on the error stream (3), then a close frame.
async fn finish<W: AsyncWrite + Unpin>(wr: &Mutex<W>, result: serde_json::Value) {
    let mut w = wr.lock().await;
    let mut message = vec![3u8];
    message.extend_from_slice(result.to_string().as_bytes());
    let _ = write_frame(&mut *w, 0x2, &message).await;
    let _ = write_frame(&mut *w, 0x8, &1000u16.to_be_bytes()).await;
    let _ = w.shutdown().await;
}

/// One server frame (unmasked, final).
async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, opcode: u8, payload: &[u8]) -> std::io::Result<()> {
    let mut head = vec![0x80 | opcode];
    match payload.len() {
        n if n < 126 => head.push(n as u8),
        n if n <= u16::MAX as usize => {
            head.push(126);
            head.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            head.push(127);
            head.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    w.write_all(&head).await?;
    w.write_all(payload).await?;
    w.flush().await
}

/// One client frame: (opcode, unmasked payload).
async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<(u8, Vec<u8>)> {
    let mut head = [0u8; 2];
    r.read_exact(&mut head).await?;
    let opcode = head[0] & 0x0f;
    let masked = head[1] & 0x80 != 0;
    let len = match head[1] & 0x7f {
        126 => u64::from(r.read_u16().await?),
        127 => r.read_u64().await?,
        n => u64::from(n),
    };
    let mut mask = [0u8; 4];
    if masked {
        r.read_exact(&mut mask).await?;
    }
    let len = usize::try_from(len).map_err(std::io::Error::other)?;
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await?;
    if masked {
        for (i, b) in payload.iter_mut().enumerate() {
            *b ^= mask[i % 4];
        }
    }
    Ok((opcode, payload))
}

/// `Sec-WebSocket-Accept` for `key` (RFC 6455: base64 of the SHA-1 of the key and the GUID).
fn accept_key(key: &str) -> String {
    let digest = sha1(format!("{key}258EAFA5-E914-47DA-95CA-C5AB0DC85B11").as_bytes());
    base64(&digest)
}

/// SHA-1 (FIPS 180-4), for the WebSocket handshake only.
fn sha1(data: &[u8]) -> [u8; 20] {
    let mut h: [u32; 5] = [0x6745_2301, 0xEFCD_AB89, 0x98BA_DCFE, 0x1032_5476, 0xC3D2_E1F0];
    let mut msg = data.to_vec();
    let bits = (data.len() as u64).wrapping_mul(8);
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&bits.to_be_bytes());
    for block in msg.chunks(64) {
        let mut w = [0u32; 80];
        for (i, word) in block.chunks(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..80 {
            w[i] = (w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16]).rotate_left(1);
        }
        let [mut a, mut b, mut c, mut d, mut e] = h;
        for (i, wi) in w.iter().enumerate() {
            let (f, k) = match i {
                0..=19 => ((b & c) | (!b & d), 0x5A82_7999),
                20..=39 => (b ^ c ^ d, 0x6ED9_EBA1),
                40..=59 => ((b & c) | (b & d) | (c & d), 0x8F1B_BCDC),
                _ => (b ^ c ^ d, 0xCA62_C1D6),
            };
            let t = a
                .rotate_left(5)
                .wrapping_add(f)
                .wrapping_add(e)
                .wrapping_add(k)
                .wrapping_add(*wi);
            e = d;
            d = c;
            c = b.rotate_left(30);
            b = a;
            a = t;
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e]) {
            *x = x.wrapping_add(y);
        }
    }
    let mut out = [0u8; 20];
    for (i, x) in h.iter().enumerate() {
        out[i * 4..i * 4 + 4].copy_from_slice(&x.to_be_bytes());
    }
    out
}

/// Standard base64 with padding.
fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rfc_6455_handshake_example() {
        assert_eq!(
            accept_key("dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }
}
