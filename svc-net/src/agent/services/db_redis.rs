//! Redis on the agent: TLS to the server and a session that runs as the authorised user.
//!
//! The agent connects to the server (TLS verified with the database's `tls.ca_cert_file`, else
//! the public web roots, for `tls.server_name`, else the host of `uri`, when `tls` is set;
//! plain TCP otherwise) and relays the client's commands (RESP) through a filter; the
//! server's replies flow back unchanged. The user the proxy authorised (the dial request's
//! `db_route.user`) is the only user the session may run as:
//!
//! - `AUTH <user> <password>` and `HELLO <ver> AUTH <user> <password>` naming another user are
//!   answered `-ERR user "<name>" is not allowed ...` and the session ends (after the replies
//!   to the commands sent before it have been delivered).
//! - `AUTH <password>` (the one-argument form, which means the `default` user to Redis) is sent
//!   on as `AUTH <db_route.user> <password>`.
//! - A client whose first command is not an authentication: the agent authenticates the
//!   session as `db_route.user` itself first (`AUTH <user> <placeholder>`, which succeeds for a
//!   user defined with `nopass`, whose access then rests on the proxy's certificate check and
//!   the agent's TLS to the server). If the server refuses (the user has a password), the
//!   command is answered `-NOAUTH ...` and not sent; only authentication is accepted until it
//!   succeeds, so nothing ever runs as the server's `default` user.
//! - `RESET` (which would return the connection to the `default` user) is refused like a
//!   foreign user.
//!
//! Limits: inline commands (not RESP arrays) are split at whitespace without Redis's quoting
//! rules; a refusal ends the session rather than answering in place.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{
    AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader,
};

use super::{ServiceError, connect, tls_to};
use crate::io::BoxIo;
use crate::tunnel::DbRoute;

/// The largest bulk string accepted (Redis's own `proto-max-bulk-len` default).
const MAX_BULK: u64 = 512 * 1024 * 1024;
/// The most arguments in one command.
const MAX_ARGS: i64 = 1024 * 1024;
/// The longest header or inline line (Redis's inline limit).
const MAX_LINE: u64 = 64 * 1024;
/// The buffer between the tunnel side and the session task.
const PIPE: usize = 64 * 1024;
/// How long, after a refusal, the replies to earlier commands may take to drain.
const DRAIN: Duration = Duration::from_secs(10);
/// The password of the agent's own `AUTH` (a `nopass` user accepts any).
const PLACEHOLDER_PASSWORD: &[u8] = b"svc-agent";

/// A malformed or failed RESP exchange.
#[derive(Debug, thiserror::Error)]
enum RespError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("malformed RESP from the {peer}: {what}")]
    Protocol { peer: &'static str, what: String },
    #[error("the server closed the connection")]
    ServerClosed,
}

fn malformed(peer: &'static str, what: impl Into<String>) -> RespError {
    RespError::Protocol {
        peer,
        what: what.into(),
    }
}

/// Opens a Redis session for database `name` at `host:port` as `route`'s user; the returned
/// stream is the client's side of the session.
pub(super) async fn open(
    name: &str,
    host: &str,
    port: u16,
    tls: Option<&(Arc<rustls::ClientConfig>, String)>,
    route: Option<&DbRoute>,
    client: &str,
) -> Result<BoxIo, ServiceError> {
    let user = route
        .map(|r| r.user.clone())
        .filter(|u| !u.is_empty())
        .ok_or_else(|| ServiceError::Handshake {
            kind: "db",
            name: name.to_owned(),
            reason: "the dial request names no database user (db_route): a Redis session runs only as the user the proxy authorised".into(),
        })?;
    let tcp = connect("db", name, host, port).await?;
    let server: BoxIo = match tls {
        Some((config, server_name)) => Box::new(tls_to("db", name, config.clone(), server_name, tcp).await?),
        None => Box::new(tcp),
    };
    let (ours, theirs) = tokio::io::duplex(PIPE);
    tracing::info!(db = %name, protocol = "redis", user = %user, client = %client, "database connection");
    let name = name.to_owned();
    tokio::spawn(async move {
        if let Err(e) = session(ours, server, &user).await {
            tracing::info!(db = %name, user = %user, reason = %e, "redis session ended");
        }
    });
    Ok(Box::new(theirs))
}

/// What to do with one client command.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// An authentication as the session's user (possibly rewritten): send it.
    Auth(Vec<Vec<u8>>),
    /// Any other command: send it (once the session is authenticated).
    Pass(Vec<Vec<u8>>),
    /// Refused: the error line (without `-` and CRLF) sent to the client before closing.
    Refuse(String),
}

fn refuse_user(name: &[u8], user: &str) -> Verdict {
    Verdict::Refuse(format!(
        "ERR user {:?} is not allowed: this session runs as database user {user:?}",
        String::from_utf8_lossy(name)
    ))
}

fn classify(mut cmd: Vec<Vec<u8>>, user: &str) -> Verdict {
    let Some(first) = cmd.first() else {
        return Verdict::Pass(cmd);
    };
    let word = first.to_ascii_uppercase();
    match word.as_slice() {
        b"AUTH" if cmd.len() == 2 => {
            cmd.insert(1, user.as_bytes().to_vec());
            Verdict::Auth(cmd)
        }
        b"AUTH" if cmd.len() == 3 => {
            if cmd[1] == user.as_bytes() {
                Verdict::Auth(cmd)
            } else {
                refuse_user(&cmd[1], user)
            }
        }
        b"HELLO" => {
            // HELLO <protover> [AUTH <user> <password>] [SETNAME <name>], options read as
            // Redis reads them; Redis answers anything else with a syntax error and
            // authenticates no one.
            let mut names = Vec::new();
            let mut j = 2;
            while j < cmd.len() {
                if cmd[j].eq_ignore_ascii_case(b"AUTH") && j + 2 < cmd.len() {
                    names.push(j + 1);
                    j += 3;
                } else if cmd[j].eq_ignore_ascii_case(b"SETNAME") && j + 1 < cmd.len() {
                    j += 2;
                } else {
                    break;
                }
            }
            match names.iter().find(|i| cmd[**i] != user.as_bytes()) {
                Some(i) => refuse_user(&cmd[*i], user),
                None if names.is_empty() => Verdict::Pass(cmd),
                None => Verdict::Auth(cmd),
            }
        }
        b"RESET" => Verdict::Refuse(format!(
            "ERR RESET is not allowed: it would end this session's authentication as database user {user:?}"
        )),
        _ => Verdict::Pass(cmd),
    }
}

/// Reads one line (with its line end), at most `max` bytes; `None` at a clean end of stream.
async fn read_line<R: AsyncBufRead + Unpin>(
    r: &mut R,
    max: u64,
    peer: &'static str,
) -> Result<Option<Vec<u8>>, RespError> {
    let mut line = Vec::new();
    (&mut *r).take(max).read_until(b'\n', &mut line).await?;
    if line.is_empty() {
        return Ok(None);
    }
    if !line.ends_with(b"\n") {
        return Err(malformed(
            peer,
            format!("a line longer than {max} bytes or cut short"),
        ));
    }
    Ok(Some(line))
}

/// The text of a line without its line end.
fn trimmed(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

fn parse_len(header: &[u8], peer: &'static str) -> Result<i64, RespError> {
    let text = trimmed(header).get(1..).unwrap_or_default();
    std::str::from_utf8(text)
        .ok()
        .and_then(|t| t.parse::<i64>().ok())
        .ok_or_else(|| malformed(peer, format!("bad length {:?}", String::from_utf8_lossy(text))))
}

/// Reads `len` bytes and the CRLF after them.
async fn read_bulk<R: AsyncBufRead + Unpin>(
    r: &mut R,
    len: u64,
    peer: &'static str,
) -> Result<Vec<u8>, RespError> {
    let mut data = Vec::new();
    (&mut *r).take(len + 2).read_to_end(&mut data).await?;
    if u64::try_from(data.len()).ok() != Some(len + 2) || !data.ends_with(b"\r\n") {
        return Err(malformed(peer, "a bulk string cut short or without CRLF"));
    }
    Ok(data)
}

/// Reads one client command (a RESP array of bulk strings, or an inline command); `None` at
/// the end of the stream.
async fn read_command<R: AsyncBufRead + Unpin>(r: &mut R) -> Result<Option<Vec<Vec<u8>>>, RespError> {
    const PEER: &str = "client";
    loop {
        let Some(line) = read_line(r, MAX_LINE, PEER).await? else {
            return Ok(None);
        };
        if line.first() == Some(&b'*') {
            let n = parse_len(&line, PEER)?;
            if n <= 0 {
                continue;
            }
            if n > MAX_ARGS {
                return Err(malformed(PEER, format!("{n} arguments (at most {MAX_ARGS})")));
            }
            let mut args = Vec::new();
            for _ in 0..n {
                let header = read_line(r, MAX_LINE, PEER)
                    .await?
                    .ok_or_else(|| malformed(PEER, "a command cut short"))?;
                if header.first() != Some(&b'$') {
                    return Err(malformed(PEER, "expected a bulk string ('$') in a command"));
                }
                let len = u64::try_from(parse_len(&header, PEER)?)
                    .ok()
                    .filter(|l| *l <= MAX_BULK)
                    .ok_or_else(|| malformed(PEER, "a bulk string length out of range"))?;
                let mut data = read_bulk(r, len, PEER).await?;
                data.truncate(data.len() - 2);
                args.push(data);
            }
            return Ok(Some(args));
        }
        let args: Vec<Vec<u8>> = trimmed(&line)
            .split(u8::is_ascii_whitespace)
            .filter(|a| !a.is_empty())
            .map(<[u8]>::to_vec)
            .collect();
        if !args.is_empty() {
            return Ok(Some(args));
        }
    }
}

/// Appends `args` as a RESP array of bulk strings.
fn encode(args: &[Vec<u8>], out: &mut Vec<u8>) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// Reads one complete server reply (RESP2 or RESP3), returned as its bytes.
async fn read_reply<R: AsyncBufRead + Unpin>(r: &mut R) -> Result<Vec<u8>, RespError> {
    const PEER: &str = "server";
    let mut out = Vec::new();
    let mut pending: i64 = 1;
    while pending > 0 {
        pending -= 1;
        let line = read_line(r, MAX_LINE, PEER)
            .await?
            .ok_or(RespError::ServerClosed)?;
        out.extend_from_slice(&line);
        match line.first() {
            Some(b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(') => {}
            Some(b'$' | b'!' | b'=') => {
                if let Ok(len) = u64::try_from(parse_len(&line, PEER)?) {
                    if len > MAX_BULK {
                        return Err(malformed(PEER, "a bulk string length out of range"));
                    }
                    out.extend_from_slice(&read_bulk(r, len, PEER).await?);
                }
            }
            Some(b'*' | b'~' | b'>') => pending += parse_len(&line, PEER)?.clamp(0, MAX_ARGS),
            Some(b'%') => pending += 2 * parse_len(&line, PEER)?.clamp(0, MAX_ARGS),
            // Attributes come before the reply they describe.
            Some(b'|') => pending += 2 * parse_len(&line, PEER)?.clamp(0, MAX_ARGS) + 1,
            _ => return Err(malformed(PEER, "an unknown reply type")),
        }
    }
    Ok(out)
}

fn is_error(reply: &[u8]) -> bool {
    matches!(reply.first(), Some(b'-' | b'!'))
}

async fn send<W: AsyncWrite + Unpin>(w: &mut W, bytes: &[u8]) -> std::io::Result<()> {
    w.write_all(bytes).await?;
    w.flush().await
}

async fn send_error<W: AsyncWrite + Unpin>(w: &mut W, text: &str) -> std::io::Result<()> {
    let line = text.replace(['\r', '\n'], " ");
    send(w, format!("-{line}\r\n").as_bytes()).await
}

/// Runs one session between the tunnel side `client` and the server.
async fn session<C, S>(client: C, server: S, user: &str) -> Result<(), RespError>
where
    C: AsyncRead + AsyncWrite + Unpin,
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (cr, mut cw) = tokio::io::split(client);
    let mut cr = BufReader::new(cr);
    let (sr, mut sw) = tokio::io::split(server);
    let mut sr = BufReader::new(sr);

    // Until the session is authenticated as `user`, one command at a time.
    let mut placeholder_refused: Option<String> = None;
    let first = loop {
        let Some(cmd) = read_command(&mut cr).await? else {
            return Ok(());
        };
        match classify(cmd, user) {
            Verdict::Refuse(text) => {
                send_error(&mut cw, &text).await?;
                return Ok(cw.shutdown().await?);
            }
            Verdict::Auth(cmd) => {
                let mut out = Vec::new();
                encode(&cmd, &mut out);
                send(&mut sw, &out).await?;
                let reply = read_reply(&mut sr).await?;
                send(&mut cw, &reply).await?;
                if !is_error(&reply) {
                    break None;
                }
            }
            Verdict::Pass(cmd) => {
                if cmd.first().is_some_and(|c| c.eq_ignore_ascii_case(b"QUIT")) {
                    send(&mut cw, b"+OK\r\n").await?;
                    return Ok(cw.shutdown().await?);
                }
                if placeholder_refused.is_none() {
                    let mut out = Vec::new();
                    encode(
                        &[
                            b"AUTH".to_vec(),
                            user.as_bytes().to_vec(),
                            PLACEHOLDER_PASSWORD.to_vec(),
                        ],
                        &mut out,
                    );
                    send(&mut sw, &out).await?;
                    let reply = read_reply(&mut sr).await?;
                    if !is_error(&reply) {
                        break Some(cmd);
                    }
                    placeholder_refused = Some(
                        String::from_utf8_lossy(trimmed(reply.get(1..).unwrap_or_default())).into_owned(),
                    );
                }
                let why = placeholder_refused.as_deref().unwrap_or_default();
                send_error(
                    &mut cw,
                    &format!("NOAUTH this session runs as database user {user:?}, which needs a password (the server said: {why}): send AUTH <password>"),
                )
                .await?;
            }
        }
    };

    let mut pending = Vec::new();
    if let Some(cmd) = first {
        encode(&cmd, &mut pending);
    }
    let refusal = {
        let down = relay_commands(&mut cr, &mut sw, user, pending);
        let up = tokio::io::copy(&mut sr, &mut cw);
        tokio::pin!(up);
        tokio::select! {
            r = down => match r? {
                Some(text) => {
                    // Replies to the commands before the refused one come first.
                    let _ = tokio::time::timeout(DRAIN, &mut up).await;
                    Some(text)
                }
                None => {
                    up.await?;
                    None
                }
            },
            r = &mut up => {
                r?;
                None
            }
        }
    };
    if let Some(text) = refusal {
        send_error(&mut cw, &text).await?;
    }
    Ok(cw.shutdown().await?)
}

/// Sends the client's commands on (after `pending`) until the client ends (`None`) or one is
/// refused (its error text); the server's side is shut for writing either way.
async fn relay_commands<R, W>(
    cr: &mut BufReader<R>,
    sw: &mut W,
    user: &str,
    mut pending: Vec<u8>,
) -> Result<Option<String>, RespError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    send(sw, &pending).await?;
    pending.clear();
    loop {
        let Some(cmd) = read_command(cr).await? else {
            send(sw, &pending).await?;
            sw.shutdown().await?;
            return Ok(None);
        };
        match classify(cmd, user) {
            Verdict::Refuse(text) => {
                send(sw, &pending).await?;
                sw.shutdown().await?;
                return Ok(Some(text));
            }
            Verdict::Auth(cmd) | Verdict::Pass(cmd) => encode(&cmd, &mut pending),
        }
        // Commands the client sent together (pipelining) go out in one write.
        if cr.buffer().is_empty() || pending.len() >= PIPE {
            send(sw, &pending).await?;
            pending.clear();
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::process::{Child, Command, Stdio};
    use std::time::Duration;

    use svc_core::auth::ServedKind;
    use tower::ServiceExt;

    use super::*;
    use crate::tunnel::DialRequest;

    const DEADLINE: Duration = Duration::from_secs(30);

    /// Test PKI, all PEM: a CA, a server certificate for `localhost` and a client certificate
    /// (for the agent), both signed by the CA.
    pub(in crate::agent::services) struct Pki {
        pub ca: String,
        pub cert: String,
        pub key: String,
        pub client_cert: String,
        pub client_key: String,
    }

    pub(in crate::agent::services) fn localhost_pki() -> Pki {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        // Distinct subjects: OpenSSL takes a certificate whose subject is its issuer's for a
        // self-signed one.
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "svc test database CA");
        let ca = rcgen::CertifiedIssuer::self_signed(params, ca_key).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let mut server = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        server
            .distinguished_name
            .push(rcgen::DnType::CommonName, "localhost");
        let cert = server.signed_by(&key, &ca).unwrap();
        let client_key = rcgen::KeyPair::generate().unwrap();
        let mut client = rcgen::CertificateParams::new(vec!["svc-agent".to_owned()]).unwrap();
        client
            .distinguished_name
            .push(rcgen::DnType::CommonName, "svc-agent");
        client.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let client_cert = client.signed_by(&client_key, &ca).unwrap();
        Pki {
            ca: ca.pem(),
            cert: cert.pem(),
            key: key.serialize_pem(),
            client_cert: client_cert.pem(),
            client_key: client_key.serialize_pem(),
        }
    }

    /// The agent's Database Service for one database `name` of `protocol` at
    /// `127.0.0.1:port`, TLS verified with `ca_pem` for `server_name`, presenting `client`
    /// (certificate and key PEM) when given.
    pub(in crate::agent::services) fn service(
        dir: &std::path::Path,
        name: &str,
        protocol: &str,
        port: u16,
        ca_pem: &str,
        server_name: &str,
        client: Option<(&str, &str)>,
    ) -> crate::tunnel::DialService {
        let ca_file = dir.join("db-ca.pem");
        std::fs::write(&ca_file, ca_pem).unwrap();
        let mut yaml = format!(
            "version: v1\ndb_service:\n  enabled: true\n  databases:\n  - name: {name}\n    protocol: {protocol}\n    uri: 127.0.0.1:{port}\n    tls:\n      ca_cert_file: {}\n      server_name: {server_name}\n",
            ca_file.display()
        );
        if let Some((cert, key)) = client {
            let (cert_file, key_file) = (dir.join("agent.pem"), dir.join("agent-key.pem"));
            std::fs::write(&cert_file, cert).unwrap();
            std::fs::write(&key_file, key).unwrap();
            yaml += &format!(
                "      cert_file: {}\n      key_file: {}\n",
                cert_file.display(),
                key_file.display()
            );
        }
        let config = svc_core::config::Config::from_yaml_str_with_hostname(&yaml, "h").unwrap();
        super::super::db_service(&config.db.databases).unwrap()
    }

    pub(in crate::agent::services) fn dial_request(name: &str, user: Option<&str>) -> DialRequest {
        DialRequest {
            address: name.into(),
            server_id: "h.test".into(),
            conn_type: ServedKind::Db,
            client_src_addr: "127.0.0.1:1".into(),
            client_dst_addr: "127.0.0.1:2".into(),
            db_route: user.map(|u| DbRoute {
                user: u.into(),
                database: None,
            }),
        }
    }

    /// A redis-server listening with TLS only and requiring client certificates, users
    /// `alice` (no password) and `bob` (password `bobpass`), the `default` user off. Killed on
    /// drop.
    struct Redis {
        child: Child,
        port: u16,
        pki: Pki,
        _dir: tempfile::TempDir,
    }

    impl Redis {
        /// The agent's service for database `cache` verifying `server_name`.
        fn service(&self, dir: &std::path::Path, server_name: &str) -> crate::tunnel::DialService {
            let client = Some((self.pki.client_cert.as_str(), self.pki.client_key.as_str()));
            service(
                dir,
                "cache",
                "redis",
                self.port,
                &self.pki.ca,
                server_name,
                client,
            )
        }
    }

    impl Drop for Redis {
        fn drop(&mut self) {
            if std::thread::panicking() {
                let log = std::fs::read_to_string(self._dir.path().join("redis.log")).unwrap_or_default();
                eprintln!("--- redis-server log ---\n{log}--- end ---");
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    async fn redis() -> Redis {
        let dir = tempfile::tempdir().unwrap();
        let pki = localhost_pki();
        for (file, pem) in [
            ("ca.pem", &pki.ca),
            ("cert.pem", &pki.cert),
            ("key.pem", &pki.key),
        ] {
            std::fs::write(dir.path().join(file), pem).unwrap();
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let d = dir.path().display();
        let conf = format!(
            "port 0\nbind 127.0.0.1\ntls-port {port}\ntls-cert-file {d}/cert.pem\ntls-key-file {d}/key.pem\ntls-ca-cert-file {d}/ca.pem\ntls-auth-clients yes\nsave \"\"\nappendonly no\ndir {d}\nlogfile {d}/redis.log\nuser default off\nuser alice on nopass ~* &* +@all\nuser bob on >bobpass ~* &* +@all\n"
        );
        std::fs::write(dir.path().join("redis.conf"), conf).unwrap();
        let child = Command::new("redis-server")
            .arg(dir.path().join("redis.conf"))
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server is required for this test (apt-get install redis-server)");
        let started = tokio::time::Instant::now();
        while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            assert!(
                started.elapsed() < DEADLINE,
                "redis-server did not listen on its TLS port {port} within {DEADLINE:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Redis {
            child,
            port,
            pki,
            _dir: dir,
        }
    }

    /// A plain local listener that dials `svc` for `user` per connection (the tunnel's part).
    async fn relay(svc: crate::tunnel::DialService, user: Option<&'static str>) -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                let svc = svc.clone();
                tokio::spawn(async move {
                    match svc.oneshot(dial_request("cache", user)).await {
                        Ok(mut io) => {
                            let _ = tokio::io::copy_bidirectional(&mut tcp, &mut io).await;
                        }
                        Err(e) => {
                            let _ = tcp.write_all(format!("dial refused: {e}\n").as_bytes()).await;
                        }
                    }
                });
            }
        });
        port
    }

    /// Runs `redis-cli` against the relay; stdout and stderr together.
    async fn cli(port: u16, args: &[&str]) -> String {
        let mut cmd = tokio::process::Command::new("redis-cli");
        cmd.args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(args)
            .env("REDISCLI_AUTH", "")
            .kill_on_drop(true);
        let out = tokio::time::timeout(DEADLINE, cmd.output())
            .await
            .unwrap_or_else(|_| panic!("redis-cli {args:?} did not finish within {DEADLINE:?}"))
            .expect("redis-cli is required for this test (apt-get install redis-tools)");
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
        .trim()
        .to_owned()
    }

    #[tokio::test]
    async fn redis_cli_without_auth_runs_as_the_route_user_over_verified_tls() {
        let server = redis().await;
        let dir = tempfile::tempdir().unwrap();
        let svc = server.service(dir.path(), "localhost");
        let port = relay(svc, Some("alice")).await;
        assert_eq!(cli(port, &["ACL", "WHOAMI"]).await, "alice");
        assert_eq!(cli(port, &["SET", "k", "v"]).await, "OK");
        assert_eq!(cli(port, &["GET", "k"]).await, "v");
        // The user's own AUTH (and HELLO AUTH with RESP3) for the route user passes.
        assert_eq!(
            cli(
                port,
                &[
                    "--user",
                    "alice",
                    "--pass",
                    "x",
                    "--no-auth-warning",
                    "ACL",
                    "WHOAMI"
                ]
            )
            .await,
            "alice"
        );
        assert_eq!(
            cli(
                port,
                &[
                    "-3",
                    "--user",
                    "alice",
                    "--pass",
                    "x",
                    "--no-auth-warning",
                    "ACL",
                    "WHOAMI"
                ]
            )
            .await,
            "alice"
        );
        // Pipelined commands keep their order.
        let mut io = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        io.write_all(b"*1\r\n$4\r\nPING\r\nECHO one\r\n*2\r\n$4\r\nECHO\r\n$3\r\ntwo\r\n")
            .await
            .unwrap();
        let want = b"+PONG\r\n$3\r\none\r\n$3\r\ntwo\r\n";
        let mut got = vec![0u8; want.len()];
        tokio::time::timeout(DEADLINE, io.read_exact(&mut got))
            .await
            .expect("the pipelined replies did not come within the deadline")
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&got), String::from_utf8_lossy(want));
    }

    #[tokio::test]
    async fn another_user_is_refused_by_name_and_a_password_user_authenticates() {
        let server = redis().await;
        let dir = tempfile::tempdir().unwrap();
        let svc = server.service(dir.path(), "localhost");
        let alice = relay(svc.clone(), Some("alice")).await;
        let out = cli(
            alice,
            &["--user", "mallory", "--pass", "x", "--no-auth-warning", "PING"],
        )
        .await;
        assert!(out.contains("user \"mallory\" is not allowed"), "{out}");
        assert!(out.contains("\"alice\""), "{out}");
        let out = cli(
            alice,
            &[
                "-3",
                "--user",
                "bob",
                "--pass",
                "bobpass",
                "--no-auth-warning",
                "PING",
            ],
        )
        .await;
        assert!(out.contains("user \"bob\" is not allowed"), "{out}");
        // Replies to the commands before a refused one come first, then the refusal.
        let mut io = tokio::net::TcpStream::connect(("127.0.0.1", alice))
            .await
            .unwrap();
        io.write_all(b"PING\r\nECHO x\r\nAUTH mallory pw\r\nPING\r\n")
            .await
            .unwrap();
        let mut got = Vec::new();
        tokio::time::timeout(DEADLINE, io.read_to_end(&mut got))
            .await
            .expect("the session did not end within the deadline after a refusal")
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&got),
            "+PONG\r\n$1\r\nx\r\n-ERR user \"mallory\" is not allowed: this session runs as database user \"alice\"\r\n"
        );
        // RESET would fall back to the default user.
        let out = cli(alice, &["RESET"]).await;
        assert!(out.contains("RESET is not allowed"), "{out}");

        let bob = relay(svc.clone(), Some("bob")).await;
        let out = cli(bob, &["ACL", "WHOAMI"]).await;
        assert!(out.contains("NOAUTH") && out.contains("\"bob\""), "{out}");
        // The one-argument AUTH authenticates the route user.
        assert_eq!(
            cli(bob, &["-a", "bobpass", "--no-auth-warning", "ACL", "WHOAMI"]).await,
            "bob"
        );
        let out = cli(bob, &["-a", "wrong", "--no-auth-warning", "ACL", "WHOAMI"]).await;
        assert!(out.contains("WRONGPASS"), "{out}");

        // A dial without a database user is refused by the agent.
        let err = svc
            .oneshot(dial_request("cache", None))
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.starts_with("db \"cache\": the dial request carries no database route"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_server_certificate_for_another_name_is_refused() {
        let server = redis().await;
        let dir = tempfile::tempdir().unwrap();
        let svc = server.service(dir.path(), "redis.example.com");
        let err = svc
            .oneshot(dial_request("cache", Some("alice")))
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(err.starts_with("db \"cache\": TLS to the server:"), "{err}");
        assert!(err.contains("certificate"), "{err}");
        // Another CA is refused too.
        // Without the agent's client certificate the server (tls-auth-clients yes) refuses.
        let no_client = service(
            dir.path(),
            "cache",
            "redis",
            server.port,
            &server.pki.ca,
            "localhost",
            None,
        );
        let port = relay(no_client, Some("alice")).await;
        let out = cli(port, &["PING"]).await;
        assert!(!out.contains("PONG"), "{out}");
        let other = localhost_pki();
        let client = Some((server.pki.client_cert.as_str(), server.pki.client_key.as_str()));
        let svc = service(
            dir.path(),
            "cache",
            "redis",
            server.port,
            &other.ca,
            "localhost",
            client,
        );
        let err = svc
            .oneshot(dial_request("cache", Some("alice")))
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(err.starts_with("db \"cache\": TLS to the server:"), "{err}");
    }

    #[test]
    fn a_client_key_that_is_not_pem_fails_at_start_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let pki = localhost_pki();
        let (cert_file, key_file) = (dir.path().join("agent.pem"), dir.path().join("agent-key.pem"));
        std::fs::write(&cert_file, &pki.client_cert).unwrap();
        std::fs::write(&key_file, "secret-looking bytes").unwrap();
        let yaml = format!(
            "version: v1\ndb_service:\n  enabled: true\n  databases:\n  - name: cache\n    protocol: redis\n    uri: 127.0.0.1:6379\n    tls:\n      cert_file: {}\n      key_file: {}\n",
            cert_file.display(),
            key_file.display()
        );
        let config = svc_core::config::Config::from_yaml_str_with_hostname(&yaml, "h").unwrap();
        let err = super::super::db_service(&config.db.databases)
            .err()
            .unwrap()
            .to_string();
        assert_eq!(
            err,
            format!(
                "database \"cache\": tls: key_file {}: no readable PEM PRIVATE KEY",
                key_file.display()
            )
        );
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    proptest::proptest! {
        /// Client and server bytes are read without panicking, whatever they are.
        #[test]
        fn any_bytes_are_read_without_panicking(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            block_on(async {
                let mut r = BufReader::new(&bytes[..]);
                while let Ok(Some(cmd)) = read_command(&mut r).await {
                    let _ = classify(cmd, "alice");
                }
                let mut r = BufReader::new(&bytes[..]);
                while read_reply(&mut r).await.is_ok() {}
            });
        }

        /// What the agent sends on is what the client sent (or its rewrite), framed again.
        #[test]
        fn commands_survive_encoding(cmd in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..64), 1..8)) {
            let mut out = Vec::new();
            encode(&cmd, &mut out);
            let got = block_on(async { read_command(&mut BufReader::new(&out[..])).await.unwrap() });
            proptest::prop_assert_eq!(got, Some(cmd));
        }
    }

    fn args(words: &[&str]) -> Vec<Vec<u8>> {
        words.iter().map(|w| w.as_bytes().to_vec()).collect()
    }

    #[test]
    fn classify_holds_the_session_to_the_route_user() {
        assert_eq!(
            classify(args(&["auth", "pw"]), "alice"),
            Verdict::Auth(args(&["auth", "alice", "pw"]))
        );
        assert_eq!(
            classify(args(&["AUTH", "alice", "pw"]), "alice"),
            Verdict::Auth(args(&["AUTH", "alice", "pw"]))
        );
        let Verdict::Refuse(text) = classify(args(&["AUTH", "root\r\n", "pw"]), "alice") else {
            panic!("a foreign user passed");
        };
        assert_eq!(
            text,
            "ERR user \"root\\r\\n\" is not allowed: this session runs as database user \"alice\""
        );
        assert!(matches!(
            classify(args(&["HELLO", "3", "AUTH", "bob", "pw"]), "alice"),
            Verdict::Refuse(_)
        ));
        assert!(matches!(
            classify(args(&["hello", "3", "auth", "alice", "pw"]), "alice"),
            Verdict::Auth(_)
        ));
        assert!(matches!(
            classify(args(&["HELLO", "3"]), "alice"),
            Verdict::Pass(_)
        ));
        assert!(matches!(
            classify(
                args(&["HELLO", "3", "SETNAME", "AUTH", "AUTH", "bob", "pw"]),
                "alice"
            ),
            Verdict::Refuse(_)
        ));
        assert!(matches!(
            classify(
                args(&["HELLO", "3", "SETNAME", "AUTH", "alice", "AUTH", "bob", "pw"]),
                "alice"
            ),
            Verdict::Pass(_)
        ));
        assert!(matches!(
            classify(
                args(&["HELLO", "3", "AUTH", "alice", "pw", "AUTH", "bob", "pw"]),
                "alice"
            ),
            Verdict::Refuse(_)
        ));
        assert!(matches!(classify(args(&["reset"]), "alice"), Verdict::Refuse(_)));
        assert!(matches!(
            classify(args(&["GET", "AUTH"]), "alice"),
            Verdict::Pass(_)
        ));
    }

    #[tokio::test]
    async fn commands_and_replies_are_framed() {
        let mut r = BufReader::new(&b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n\r\nPING  x\n*-1\r\n"[..]);
        assert_eq!(read_command(&mut r).await.unwrap(), Some(args(&["GET", "k"])));
        assert_eq!(read_command(&mut r).await.unwrap(), Some(args(&["PING", "x"])));
        assert_eq!(read_command(&mut r).await.unwrap(), None);
        let mut r = BufReader::new(&b"*2\r\n$9\r\nshort\r\n"[..]);
        assert!(read_command(&mut r).await.is_err());
        let reply = b"|1\r\n+a\r\n:1\r\n%2\r\n+server\r\n$5\r\nredis\r\n+proto\r\n*2\r\n:3\r\n_\r\n";
        let mut r = BufReader::new(&reply[..]);
        assert_eq!(read_reply(&mut r).await.unwrap(), reply.to_vec());
        let mut r = BufReader::new(&b"*3\r\n:1\r\n"[..]);
        assert!(matches!(read_reply(&mut r).await, Err(RespError::ServerClosed)));
    }
}
