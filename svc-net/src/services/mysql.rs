//! The MySQL/MariaDB wire messages of the connection phase that svc speaks itself.
//!
//! Proxy side (`greet_client`, `read_packet`, `parse_login`, driven by the proxy's resource
//! entry): svc sends the server greeting advertising `CLIENT_SSL`, takes the client's
//! SSLRequest, runs TLS (the client's `tsh db login` certificate), and
//! reads the HandshakeResponse (user, database). It then dials the agent and writes one
//! [`MysqlHello`] line with the capabilities the client settled on; the agent
//! (`connect_server`) does its own handshake with the real server — TLS verified, its own
//! client certificate, as the route's user — and answers one line, [`HELLO_OK`] or the
//! server's refusal. The client is then sent an OK (or an ERR packet) and from there on the
//! command phase flows unchanged both ways: both handshakes used the same capabilities.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// `CLIENT_LONG_PASSWORD` (also `CLIENT_MYSQL`: no MariaDB extended capabilities).
const LONG_PASSWORD: u32 = 0x1;
const FOUND_ROWS: u32 = 0x2;
const LONG_FLAG: u32 = 0x4;
/// `CLIENT_CONNECT_WITH_DB`.
pub(crate) const CONNECT_WITH_DB: u32 = 0x8;
const PROTOCOL_41: u32 = 0x200;
/// `CLIENT_SSL`.
pub(crate) const SSL: u32 = 0x800;
const TRANSACTIONS: u32 = 0x2000;
const SECURE_CONNECTION: u32 = 0x8000;
const MULTI_STATEMENTS: u32 = 0x1_0000;
const MULTI_RESULTS: u32 = 0x2_0000;
const PS_MULTI_RESULTS: u32 = 0x4_0000;
const PLUGIN_AUTH: u32 = 0x8_0000;
const CONNECT_ATTRS: u32 = 0x10_0000;
const PLUGIN_AUTH_LENENC: u32 = 0x20_0000;

/// What svc's greeting advertises: the classic protocol 4.1 set, without the later
/// result-format changes (deprecated EOF, session tracking, query attributes), so the agent
/// can ask any MySQL or MariaDB server for the very same set.
pub(crate) const PROXY_CAPS: u32 = LONG_PASSWORD
    | FOUND_ROWS
    | LONG_FLAG
    | CONNECT_WITH_DB
    | PROTOCOL_41
    | SSL
    | TRANSACTIONS
    | SECURE_CONNECTION
    | MULTI_STATEMENTS
    | MULTI_RESULTS
    | PS_MULTI_RESULTS
    | PLUGIN_AUTH
    | CONNECT_ATTRS
    | PLUGIN_AUTH_LENENC;

/// The longest connection-phase packet svc reads.
const MAX_HANDSHAKE_PACKET: usize = 64 * 1024;
/// The agent's answer when the server accepted it.
pub const HELLO_OK: &str = "ok";
/// `ER_ACCESS_DENIED_ERROR`.
pub(crate) const ACCESS_DENIED: u16 = 1045;
/// `ER_UNKNOWN_ERROR`: the database could not be reached or refused the agent (a server-side
/// code: clients keep the 2000 range for their own errors).
pub(crate) const UNREACHABLE: u16 = 1105;

/// The first line from the proxy to the agent on a MySQL dial: what the client settled on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MysqlHello {
    /// The capability flags both handshakes use (the client's, within the proxy's own set).
    pub caps: u32,
    /// The client's character set.
    pub charset: u8,
}

/// Reads one packet: (sequence number, payload).
pub(crate) async fn read_packet<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<(u8, Vec<u8>)> {
    let mut head = [0u8; 4];
    r.read_exact(&mut head).await?;
    let len = usize::from(head[0]) | usize::from(head[1]) << 8 | usize::from(head[2]) << 16;
    if len > MAX_HANDSHAKE_PACKET {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a MySQL handshake packet of {len} bytes: at most {MAX_HANDSHAKE_PACKET}"),
        ));
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await?;
    Ok((head[3], payload))
}

/// Writes one packet (payloads here are far below 16 MiB).
pub(crate) async fn write_packet<W: AsyncWrite + Unpin>(
    w: &mut W,
    seq: u8,
    payload: &[u8],
) -> std::io::Result<()> {
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX).to_le_bytes();
    let mut out = Vec::with_capacity(payload.len() + 4);
    out.extend_from_slice(&[len[0], len[1], len[2], seq]);
    out.extend_from_slice(payload);
    w.write_all(&out).await?;
    w.flush().await
}

/// An ERR packet payload: `code`, SQLSTATE `28000` (refusals) or `08S01`, the message.
pub(crate) fn err_payload(code: u16, text: &str) -> Vec<u8> {
    let state = if code == ACCESS_DENIED { "28000" } else { "HY000" };
    let mut p = vec![0xff];
    p.extend_from_slice(&code.to_le_bytes());
    p.push(b'#');
    p.extend_from_slice(state.as_bytes());
    p.extend_from_slice(text.as_bytes());
    p
}

/// An OK packet payload (no rows, autocommit on).
pub(crate) fn ok_payload() -> Vec<u8> {
    vec![0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00]
}

/// Sends an ERR packet as packet `seq` and closes the write side.
pub(crate) async fn refuse<W: AsyncWrite + Unpin>(w: &mut W, seq: u8, code: u16, text: &str) {
    let _ = write_packet(w, seq, &err_payload(code, text)).await;
    let _ = w.shutdown().await;
}

/// The greeting svc sends (protocol 10): `scramble` is 20 random bytes (svc checks no
/// password: the client certificate authenticates).
pub(crate) fn greeting(connection_id: u32, scramble: &[u8; 20], tls: bool) -> Vec<u8> {
    let caps = if tls { PROXY_CAPS } else { PROXY_CAPS & !SSL }.to_le_bytes();
    let mut p = vec![10];
    p.extend_from_slice(b"8.0.0-svc\0");
    p.extend_from_slice(&connection_id.to_le_bytes());
    p.extend_from_slice(&scramble[..8]);
    p.push(0);
    p.extend_from_slice(&caps[..2]);
    p.push(45); // utf8mb4_general_ci
    p.extend_from_slice(&2u16.to_le_bytes()); // autocommit
    p.extend_from_slice(&caps[2..]);
    p.push(21);
    p.extend_from_slice(&[0; 10]);
    p.extend_from_slice(&scramble[8..]);
    p.push(0);
    p.extend_from_slice(b"mysql_native_password\0");
    p
}

/// Why a client's or server's connection phase failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HandshakeError {
    /// Reading or writing failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// A packet is not what the connection phase expects.
    #[error("{0}")]
    Protocol(String),
}

/// The client's capabilities and charset from its SSLRequest (or HandshakeResponse).
pub(crate) fn client_caps(payload: &[u8]) -> Result<MysqlHello, HandshakeError> {
    if payload.len() < 32 {
        return Err(HandshakeError::Protocol(format!(
            "the client's handshake packet has {} bytes, expected at least 32",
            payload.len()
        )));
    }
    let caps = u32::from_le_bytes([payload[0], payload[1], payload[2], payload[3]]);
    Ok(MysqlHello {
        caps,
        charset: payload[8],
    })
}

/// The user and database of a HandshakeResponse41.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClientLogin {
    /// The capabilities and charset.
    pub hello: MysqlHello,
    /// The user.
    pub user: String,
    /// The database, if the client named one.
    pub database: Option<String>,
}

fn cstr(p: &[u8], at: &mut usize, what: &str) -> Result<String, HandshakeError> {
    let rest = p.get(*at..).unwrap_or_default();
    let end = rest
        .iter()
        .position(|b| *b == 0)
        .ok_or_else(|| HandshakeError::Protocol(format!("the client's {what} is not terminated")))?;
    *at += end + 1;
    Ok(String::from_utf8_lossy(&rest[..end]).into_owned())
}

fn lenenc(p: &[u8], at: &mut usize) -> Result<usize, HandshakeError> {
    let bad = || HandshakeError::Protocol("a truncated length in the client's handshake".into());
    let first = *p.get(*at).ok_or_else(bad)?;
    *at += 1;
    let n = match first {
        0xfc => 2,
        0xfd => 3,
        0xfe => 8,
        v => return Ok(usize::from(v)),
    };
    let bytes = p.get(*at..*at + n).ok_or_else(bad)?;
    *at += n;
    let mut v: u64 = 0;
    for (i, b) in bytes.iter().enumerate() {
        v |= u64::from(*b) << (8 * i);
    }
    usize::try_from(v).map_err(|_| bad())
}

/// Parses a HandshakeResponse41 (protocol 4.1 only).
pub(crate) fn parse_login(p: &[u8]) -> Result<ClientLogin, HandshakeError> {
    let hello = client_caps(p)?;
    if hello.caps & PROTOCOL_41 == 0 {
        return Err(HandshakeError::Protocol(
            "the client does not speak protocol 4.1".into(),
        ));
    }
    let mut at = 32;
    let user = cstr(p, &mut at, "user name")?;
    let auth_len = if hello.caps & PLUGIN_AUTH_LENENC != 0 {
        lenenc(p, &mut at)?
    } else if hello.caps & SECURE_CONNECTION != 0 {
        let n = *p
            .get(at)
            .ok_or_else(|| HandshakeError::Protocol("the client's auth data is missing".into()))?;
        at += 1;
        usize::from(n)
    } else {
        // Null-terminated auth data: skipped with its terminator.
        cstr(p, &mut at, "auth data")?;
        0
    };
    at += auth_len;
    let database = if hello.caps & CONNECT_WITH_DB != 0 && at < p.len() {
        Some(cstr(p, &mut at, "database name")?).filter(|d| !d.is_empty())
    } else {
        None
    };
    Ok(ClientLogin {
        hello,
        user,
        database,
    })
}

/// Sends svc's greeting, advertising TLS when `tls` (the proxy's MySQL port) and not for a
/// stream that is TLS to the proxy already (`tsh proxy db`).
pub(crate) async fn send_greeting<S: AsyncWrite + Unpin>(
    io: &mut S,
    tls: bool,
) -> Result<(), HandshakeError> {
    let mut scramble = [0u8; 20];
    for b in &mut scramble {
        // Printable, non-zero bytes, as servers send; svc never checks a password against it.
        *b = b'a' + (rand_byte() % 26);
    }
    write_packet(io, 0, &greeting(rand_u32(), &scramble, tls)).await?;
    Ok(())
}

/// The proxy's side of a native client's connection phase up to TLS: greeting, SSLRequest.
/// The stream is then ready for the TLS handshake; a client that does not ask for TLS gets an
/// ERR packet naming `tsh db login`.
pub(crate) async fn greet_client<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut S,
) -> Result<(), HandshakeError> {
    send_greeting(io, true).await?;
    let (seq, payload) = read_packet(io).await?;
    let hello = client_caps(&payload)?;
    if hello.caps & SSL == 0 {
        let msg = "svc requires TLS with a database certificate: run tsh db login NAME --db-user USER and use the files tsh db config NAME prints";
        refuse(io, seq.wrapping_add(1), ACCESS_DENIED, msg).await;
        return Err(HandshakeError::Protocol(msg.into()));
    }
    Ok(())
}

fn rand_byte() -> u8 {
    rand_u32().to_le_bytes()[0]
}

fn rand_u32() -> u32 {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 4];
    let _ = ring::rand::SystemRandom::new().fill(&mut b);
    u32::from_le_bytes(b)
}

/// The agent's side: the connection phase with the real server as `user` (and `database`),
/// with TLS (`tls`, verifying the server as `server_name`; the configuration carries the
/// agent's client certificate) and the capabilities of `hello`. The server's refusal is
/// returned as its ERR message.
pub(crate) async fn connect_server(
    mut tcp: tokio::net::TcpStream,
    tls: Arc<rustls::ClientConfig>,
    server_name: &str,
    user: &str,
    database: Option<&str>,
    hello: MysqlHello,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, HandshakeError> {
    let (_, greeting) = read_packet(&mut tcp).await?;
    if greeting.first() == Some(&0xff) {
        return Err(HandshakeError::Protocol(err_text(&greeting)));
    }
    let server_caps = server_caps(&greeting)?;
    if server_caps & SSL == 0 {
        return Err(HandshakeError::Protocol(
            "the server does not offer TLS (CLIENT_SSL): configure it with a certificate".into(),
        ));
    }
    let mut caps = (hello.caps & PROXY_CAPS) | SSL | PROTOCOL_41 | SECURE_CONNECTION | PLUGIN_AUTH;
    caps &= !CONNECT_ATTRS & !PLUGIN_AUTH_LENENC;
    if database.is_some() {
        caps |= CONNECT_WITH_DB;
    } else {
        caps &= !CONNECT_WITH_DB;
    }
    let mut head = Vec::with_capacity(32);
    head.extend_from_slice(&caps.to_le_bytes());
    head.extend_from_slice(&(16u32 * 1024 * 1024).to_le_bytes());
    head.push(hello.charset);
    head.extend_from_slice(&[0; 23]);
    write_packet(&mut tcp, 1, &head).await?;
    let sni = rustls::pki_types::ServerName::try_from(server_name.to_owned())
        .map_err(|e| HandshakeError::Protocol(format!("server name {server_name:?}: {e}")))?;
    let mut tls = tokio_rustls::TlsConnector::from(tls)
        .connect(sni, tcp)
        .await
        .map_err(|e| HandshakeError::Protocol(format!("TLS with the server: {e}")))?;
    let mut login = head;
    login.extend_from_slice(user.as_bytes());
    login.push(0);
    login.push(0); // no password: the client certificate authenticates (REQUIRE X509/SUBJECT)
    if let Some(db) = database {
        login.extend_from_slice(db.as_bytes());
        login.push(0);
    }
    login.extend_from_slice(b"mysql_native_password\0");
    write_packet(&mut tls, 2, &login).await?;
    loop {
        let (seq, reply) = read_packet(&mut tls).await?;
        match reply.first() {
            Some(0x00) => return Ok(tls),
            Some(0xff) => return Err(HandshakeError::Protocol(err_text(&reply))),
            // AuthSwitchRequest: answer with an empty response (no password).
            Some(0xfe) => write_packet(&mut tls, seq.wrapping_add(1), &[]).await?,
            _ => {
                return Err(HandshakeError::Protocol(
                    "the server asked for an authentication exchange svc does not do (use a user authenticated by the agent's certificate)".into(),
                ));
            }
        }
    }
}

/// The capability flags of a server greeting.
fn server_caps(g: &[u8]) -> Result<u32, HandshakeError> {
    let bad = || HandshakeError::Protocol("a malformed server greeting".into());
    if g.first() != Some(&10) {
        return Err(bad());
    }
    let version_end = g.iter().skip(1).position(|b| *b == 0).ok_or_else(bad)? + 2;
    // connection id (4), scramble part 1 (8), filler (1)
    let at = version_end + 13;
    let lower = g.get(at..at + 2).ok_or_else(bad)?;
    let upper = g.get(at + 5..at + 7).ok_or_else(bad)?;
    Ok(u32::from(u16::from_le_bytes([lower[0], lower[1]]))
        | u32::from(u16::from_le_bytes([upper[0], upper[1]])) << 16)
}

/// The message of an ERR packet payload.
pub(crate) fn err_text(p: &[u8]) -> String {
    let code = p.get(1..3).map(|c| u16::from_le_bytes([c[0], c[1]])).unwrap_or(0);
    let msg = match p.get(3) {
        Some(b'#') => p.get(9..).unwrap_or_default(),
        _ => p.get(3..).unwrap_or_default(),
    };
    format!(
        "the server refused (error {code}): {}",
        String::from_utf8_lossy(msg)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn login_packet(caps: u32, user: &str, auth: &[u8], db: Option<&str>) -> Vec<u8> {
        let mut p = caps.to_le_bytes().to_vec();
        p.extend_from_slice(&(1u32 << 24).to_le_bytes());
        p.push(45);
        p.extend_from_slice(&[0; 23]);
        p.extend_from_slice(user.as_bytes());
        p.push(0);
        p.push(u8::try_from(auth.len()).unwrap());
        p.extend_from_slice(auth);
        if let Some(db) = db {
            p.extend_from_slice(db.as_bytes());
            p.push(0);
        }
        p.extend_from_slice(b"mysql_native_password\0");
        p
    }

    #[test]
    fn a_handshake_response_gives_user_database_and_caps() {
        let caps = PROXY_CAPS & !CONNECT_ATTRS;
        let l = parse_login(&login_packet(caps, "alice", &[7; 20], Some("shop"))).unwrap();
        assert_eq!(l.user, "alice");
        assert_eq!(l.database.as_deref(), Some("shop"));
        assert_eq!(l.hello, MysqlHello { caps, charset: 45 });
        let no_db = caps & !CONNECT_WITH_DB;
        let l = parse_login(&login_packet(no_db, "bob", &[], None)).unwrap();
        assert_eq!((l.user.as_str(), l.database), ("bob", None));
        assert!(parse_login(&[0; 10]).is_err());
    }

    #[test]
    fn the_greeting_advertises_tls_and_reads_back() {
        let g = greeting(7, &[b'x'; 20], true);
        assert_eq!(server_caps(&g).unwrap(), PROXY_CAPS);
        let g = greeting(7, &[b'x'; 20], false);
        assert_eq!(server_caps(&g).unwrap() & SSL, 0);
        assert!(g.ends_with(b"mysql_native_password\0"));
    }

    #[test]
    fn err_packets_carry_code_state_and_text() {
        let p = err_payload(ACCESS_DENIED, "access denied to db \"my\"");
        assert_eq!(&p[..3], &[0xff, 0x15, 0x04]);
        assert_eq!(&p[3..9], b"#28000");
        assert_eq!(
            err_text(&p),
            "the server refused (error 1045): access denied to db \"my\""
        );
    }
}
