//! The few Postgres wire messages svc reads and writes itself: the startup message (whose
//! `user` and `database` the proxy checks against the roles and the agent against the dial
//! request's route) and the `ErrorResponse` a refused client is shown.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Postgres request codes that ask for encryption first (SSLRequest, GSSENCRequest).
const SSL_CODE: u32 = 80_877_103;
const GSSENC_CODE: u32 = 80_877_104;
/// Protocol 3.0, the only startup version svc forwards.
const PROTOCOL_3: u32 = 196_608;

/// SQLSTATE `28000` (invalid authorization specification): the refusals of svc's RBAC.
pub(crate) const REFUSED: &str = "28000";
/// SQLSTATE `08006` (connection failure): the database could not be reached.
pub(crate) const UNREACHABLE: &str = "08006";

/// A client's startup message and the parameters svc checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Startup {
    /// The message as the client sent it (forwarded unchanged).
    pub raw: Vec<u8>,
    /// The `user` parameter.
    pub user: String,
    /// The `database` parameter (Postgres' default, the user name, when absent).
    pub database: String,
}

/// Reads messages until the startup message: SSLRequest and GSSENCRequest are answered `N`
/// (the hop they would protect is TLS already). Returns the raw startup message.
pub(crate) async fn read_startup_raw<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut S,
) -> std::io::Result<Vec<u8>> {
    loop {
        let mut len = [0u8; 4];
        io.read_exact(&mut len).await?;
        let n = u32::from_be_bytes(len) as usize;
        if !(8..=10_000).contains(&n) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("a Postgres startup message of {n} bytes: expected 8 to 10000"),
            ));
        }
        let mut body = vec![0u8; n - 4];
        io.read_exact(&mut body).await?;
        let code = u32::from_be_bytes([body[0], body[1], body[2], body[3]]);
        if n == 8 && (code == SSL_CODE || code == GSSENC_CODE) {
            io.write_all(b"N").await?;
            continue;
        }
        let mut msg = len.to_vec();
        msg.extend_from_slice(&body);
        return Ok(msg);
    }
}

/// Why a startup message cannot be checked.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StartupError {
    /// Reading failed.
    #[error("reading the Postgres startup message: {0}")]
    Io(#[from] std::io::Error),
    /// Not a protocol 3.0 startup message with a user.
    #[error("the Postgres startup message {0}")]
    Malformed(String),
}

/// Parses a raw startup message (length, protocol 3.0, `key\0value\0` pairs, `\0`).
pub(crate) fn parse_startup(raw: Vec<u8>) -> Result<Startup, StartupError> {
    let bad = |why: &str| StartupError::Malformed(why.to_owned());
    if raw.len() < 8 {
        return Err(bad("is shorter than 8 bytes"));
    }
    let version = u32::from_be_bytes([raw[4], raw[5], raw[6], raw[7]]);
    if version != PROTOCOL_3 {
        return Err(StartupError::Malformed(format!(
            "asks for protocol {}.{} (or is a cancel request): only 3.0 is forwarded",
            version >> 16,
            version & 0xffff
        )));
    }
    let mut fields = raw[8..].split(|b| *b == 0);
    let (mut user, mut database) = (None, None);
    while let Some(key) = fields.next() {
        if key.is_empty() {
            break;
        }
        let value = fields.next().ok_or_else(|| bad("ends inside a parameter"))?;
        let value = String::from_utf8_lossy(value).into_owned();
        match key {
            b"user" => user = Some(value),
            b"database" => database = Some(value),
            _ => {}
        }
    }
    let user = user
        .filter(|u| !u.is_empty())
        .ok_or_else(|| bad("names no user"))?;
    let database = database.filter(|d| !d.is_empty()).unwrap_or_else(|| user.clone());
    Ok(Startup { raw, user, database })
}

/// Reads and parses the startup message ([`read_startup_raw`], [`parse_startup`]).
pub(crate) async fn read_startup<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut S,
) -> Result<Startup, StartupError> {
    parse_startup(read_startup_raw(io).await?)
}

/// A Postgres `ErrorResponse`: severity FATAL, SQLSTATE `code`, message `text`.
pub(crate) fn error_response(code: &str, text: &str) -> Vec<u8> {
    let mut fields = Vec::new();
    for (tag, value) in [(b'S', "FATAL"), (b'V', "FATAL"), (b'C', code), (b'M', text)] {
        fields.push(tag);
        fields.extend_from_slice(value.replace('\0', " ").as_bytes());
        fields.push(0);
    }
    fields.push(0);
    let mut msg = vec![b'E'];
    msg.extend_from_slice(&u32::try_from(fields.len() + 4).unwrap_or(u32::MAX).to_be_bytes());
    msg.extend_from_slice(&fields);
    msg
}

/// Sends an `ErrorResponse` and closes the write side.
pub(crate) async fn refuse<S: AsyncWrite + Unpin>(io: &mut S, code: &str, text: &str) {
    let _ = io.write_all(&error_response(code, text)).await;
    let _ = io.flush().await;
    let _ = io.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn startup(params: &[(&str, &str)]) -> Vec<u8> {
        let mut body = PROTOCOL_3.to_be_bytes().to_vec();
        for (k, v) in params {
            body.extend_from_slice(k.as_bytes());
            body.push(0);
            body.extend_from_slice(v.as_bytes());
            body.push(0);
        }
        body.push(0);
        let mut m = ((body.len() + 4) as u32).to_be_bytes().to_vec();
        m.extend_from_slice(&body);
        m
    }

    #[test]
    fn user_and_database_are_read_and_the_database_defaults_to_the_user() {
        let raw = startup(&[
            ("user", "alice"),
            ("database", "shop"),
            ("application_name", "psql"),
        ]);
        let s = parse_startup(raw.clone()).unwrap();
        assert_eq!((s.user.as_str(), s.database.as_str()), ("alice", "shop"));
        assert_eq!(s.raw, raw);
        let s = parse_startup(startup(&[("user", "bob")])).unwrap();
        assert_eq!(s.database, "bob");
        let err = parse_startup(startup(&[("database", "x")])).unwrap_err();
        assert_eq!(err.to_string(), "the Postgres startup message names no user");
        let mut cancel = 16u32.to_be_bytes().to_vec();
        cancel.extend_from_slice(&80_877_102u32.to_be_bytes());
        cancel.extend_from_slice(&[0; 8]);
        assert!(parse_startup(cancel).is_err());
    }

    #[test]
    fn error_responses_carry_the_code_and_the_text() {
        let msg = error_response(REFUSED, "access denied to db \"pg\"");
        assert_eq!(msg[0], b'E');
        let len = u32::from_be_bytes([msg[1], msg[2], msg[3], msg[4]]) as usize;
        assert_eq!(len + 1, msg.len());
        let text = String::from_utf8_lossy(&msg[5..]);
        assert!(text.contains("SFATAL\0") && text.contains("C28000\0"), "{text}");
        assert!(text.contains("Maccess denied to db \"pg\"\0"), "{text}");
    }
}
