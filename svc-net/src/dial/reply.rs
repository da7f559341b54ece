//! The proxy's reply to CONNECT: a pure parser over the bytes read so far.
//!
//! [`HttpConnectFuture`](super::HttpConnectFuture) reads into a bounded buffer and calls
//! [`parse`] after each read; the bytes after the head belong to the tunnel.

/// The longest reply head accepted (status line and headers).
pub const MAX_REPLY_HEAD: usize = 16 * 1024;

/// Headers a CONNECT reply may carry; proxies send a handful.
const MAX_HEADERS: usize = 64;

/// A complete reply head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyHead {
    /// The status code.
    pub status: u16,
    /// The reason phrase (lossily decoded, for error messages).
    pub reason: String,
    /// Bytes taken by the head, including the blank line.
    pub len: usize,
}

/// Parses `buf` as the start of an HTTP/1.x response.
///
/// `Ok(None)`: more bytes are needed. `Err`: not an HTTP/1.x response head.
pub fn parse(buf: &[u8]) -> Result<Option<ReplyHead>, String> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    match response.parse(buf) {
        Ok(httparse::Status::Partial) => Ok(None),
        Ok(httparse::Status::Complete(len)) => {
            // `Complete` guarantees the status line was read.
            let status = response.code.ok_or("missing status code")?;
            Ok(Some(ReplyHead {
                status,
                reason: response.reason.unwrap_or("").to_owned(),
                len,
            }))
        }
        Err(e) => Err(format!("expected an HTTP/1.x response head: {e}")),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn complete_partial_and_bad() {
        let buf = b"HTTP/1.1 200 Connection established\r\n\r\nSSH-2.0-x";
        let head = parse(buf).unwrap().unwrap();
        assert_eq!(head.status, 200);
        assert_eq!(head.reason, "Connection established");
        assert_eq!(&buf[head.len..], b"SSH-2.0-x");

        let buf = b"HTTP/1.0 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"x\"\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(parse(buf).unwrap().unwrap().status, 407);
        assert_eq!(parse(b"HTTP/1.1 200 OK\r\nVia: x").unwrap(), None);
        assert_eq!(parse(b"").unwrap(), None);
        assert!(parse(b"SSH-2.0-OpenSSH\r\n\r\n").is_err());
        assert!(parse(b"HTTP/2 200\r\n\r\n").is_err());
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = parse(&bytes);
        }

        #[test]
        fn head_then_tunnel_bytes_split_exactly(
            status in 100u16..600,
            tail in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let mut buf = format!("HTTP/1.1 {status} Whatever\r\nX-A: b\r\n\r\n").into_bytes();
            let head_len = buf.len();
            buf.extend_from_slice(&tail);
            let head = parse(&buf).unwrap().unwrap();
            prop_assert_eq!(head.status, status);
            prop_assert_eq!(head.len, head_len);
        }
    }
}
