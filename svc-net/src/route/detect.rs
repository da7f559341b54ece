//! Multiplex detection: which protocol a connection on the single port speaks.
//!
//! Sits between the accept loop and the handlers in multiplex mode. [`detect`] is a pure
//! function over the first bytes; [`parse_proxy_header`] reads PROXY protocol v1/v2 headers;
//! [`Multiplexer`] is the `tower::Service` that peeks under the connection's deadline, honours
//! PROXY headers only from trusted networks (the real client address then replaces the peer
//! address), and hands the connection — peeked bytes replayed — to the handler for its protocol.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    sync::Arc,
    task::{Context, Poll},
};

use bytes::BytesMut;
use ipnet::IpNet;
use tokio::io::AsyncWriteExt;
use tower::{BoxError, Service, ServiceExt};

use crate::io::{ConnFuture, ConnService, Connection};

/// The PROXY protocol v2 signature.
pub const PROXY_V2_SIGNATURE: [u8; 12] = [
    0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D, 0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A,
];
/// The Postgres SSLRequest message (length 8, code 80877103).
pub(crate) const POSTGRES_SSL_REQUEST: [u8; 8] = [0x00, 0x00, 0x00, 0x08, 0x04, 0xD2, 0x16, 0x2F];

const HTTP_METHODS: [&[u8]; 9] = [
    b"GET ",
    b"POST ",
    b"HEAD ",
    b"PUT ",
    b"DELETE ",
    b"OPTIONS ",
    b"PATCH ",
    b"CONNECT ",
    b"TRACE ",
];

/// The protocol a connection starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Protocol {
    /// A TLS record (`0x16`).
    Tls,
    /// An SSH identification string (`SSH-`).
    Ssh,
    /// A PROXY protocol v1 header (`PROXY `).
    ProxyV1,
    /// A PROXY protocol v2 header (the 12-byte signature).
    ProxyV2,
    /// Plain HTTP (a request line's method).
    Http,
    /// A Postgres SSLRequest.
    Postgres,
    /// None of the above.
    Unknown,
}

/// Classifies the first bytes; `None` means they are a prefix of several candidates (read more).
pub fn detect(prefix: &[u8]) -> Option<Protocol> {
    if prefix.first() == Some(&0x16) {
        return Some(Protocol::Tls);
    }
    let candidates: [(&[u8], Protocol); 4] = [
        (b"SSH-", Protocol::Ssh),
        (b"PROXY ", Protocol::ProxyV1),
        (&PROXY_V2_SIGNATURE, Protocol::ProxyV2),
        (&POSTGRES_SSL_REQUEST, Protocol::Postgres),
    ];
    let methods = HTTP_METHODS.iter().map(|m| (*m, Protocol::Http));
    let mut undecided = false;
    for (sig, proto) in candidates.into_iter().chain(methods) {
        if prefix.starts_with(sig) {
            return Some(proto);
        }
        if sig.starts_with(prefix) {
            undecided = true;
        }
    }
    if undecided { None } else { Some(Protocol::Unknown) }
}

/// The outcome of reading a PROXY header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProxyHeader {
    /// More bytes are needed.
    NeedMore,
    /// A whole header of `len` bytes; `source` is the client it names (`None`: LOCAL/UNKNOWN,
    /// keep the TCP peer).
    Complete {
        /// Bytes the header occupies.
        len: usize,
        /// The original client, if the header names one.
        source: Option<SocketAddr>,
    },
}

/// Why a PROXY header is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyHeaderError {
    /// Not a v1 or v2 header.
    #[error("invalid PROXY protocol header: {0}")]
    Invalid(&'static str),
}

/// Parses a PROXY protocol v1 or v2 header at the start of `buf`.
pub fn parse_proxy_header(buf: &[u8]) -> Result<ProxyHeader, ProxyHeaderError> {
    if buf.starts_with(&PROXY_V2_SIGNATURE) {
        parse_v2(buf)
    } else if buf.starts_with(b"PROXY ") {
        parse_v1(buf)
    } else {
        Err(ProxyHeaderError::Invalid("missing PROXY signature"))
    }
}

fn parse_v1(buf: &[u8]) -> Result<ProxyHeader, ProxyHeaderError> {
    const MAX_V1: usize = 107;
    let Some(end) = buf.windows(2).take(MAX_V1 - 1).position(|w| w == b"\r\n") else {
        return if buf.len() >= MAX_V1 {
            Err(ProxyHeaderError::Invalid("v1 header longer than 107 bytes"))
        } else {
            Ok(ProxyHeader::NeedMore)
        };
    };
    let line =
        std::str::from_utf8(&buf[..end]).map_err(|_| ProxyHeaderError::Invalid("v1 header is not ASCII"))?;
    let parts: Vec<&str> = line.split(' ').collect();
    let source = match parts.as_slice() {
        ["PROXY", "UNKNOWN", ..] => None,
        ["PROXY", family @ ("TCP4" | "TCP6"), src, _dst, sport, _dport] => {
            let ip: IpAddr = src
                .parse()
                .map_err(|_| ProxyHeaderError::Invalid("v1 source address"))?;
            if ip.is_ipv4() != (*family == "TCP4") {
                return Err(ProxyHeaderError::Invalid("v1 address family mismatch"));
            }
            let port: u16 = sport
                .parse()
                .map_err(|_| ProxyHeaderError::Invalid("v1 source port"))?;
            Some(SocketAddr::new(ip, port))
        }
        _ => {
            return Err(ProxyHeaderError::Invalid(
                "v1 header: expected PROXY TCP4|TCP6|UNKNOWN src dst sport dport",
            ));
        }
    };
    Ok(ProxyHeader::Complete { len: end + 2, source })
}

fn parse_v2(buf: &[u8]) -> Result<ProxyHeader, ProxyHeaderError> {
    if buf.len() < 16 {
        return Ok(ProxyHeader::NeedMore);
    }
    let (ver_cmd, family) = (buf[12], buf[13]);
    if ver_cmd >> 4 != 2 {
        return Err(ProxyHeaderError::Invalid("v2 version is not 2"));
    }
    let len = usize::from(buf[14]) << 8 | usize::from(buf[15]);
    if buf.len() < 16 + len {
        return Ok(ProxyHeader::NeedMore);
    }
    let body = &buf[16..16 + len];
    let source = match (ver_cmd & 0x0F, family) {
        (0, _) => None, // LOCAL: a health check from the balancer itself.
        (1, 0x11) if body.len() >= 12 => {
            let ip = Ipv4Addr::new(body[0], body[1], body[2], body[3]);
            Some(SocketAddr::new(
                ip.into(),
                u16::from(body[8]) << 8 | u16::from(body[9]),
            ))
        }
        (1, 0x21) if body.len() >= 36 => {
            let mut octets = [0u8; 16];
            octets.copy_from_slice(&body[..16]);
            let ip = Ipv6Addr::from(octets);
            Some(SocketAddr::new(
                ip.into(),
                u16::from(body[32]) << 8 | u16::from(body[33]),
            ))
        }
        (1, 0x00) => None, // UNSPEC.
        (1, _) => {
            return Err(ProxyHeaderError::Invalid(
                "v2 unsupported address family or short body",
            ));
        }
        _ => return Err(ProxyHeaderError::Invalid("v2 command is neither LOCAL nor PROXY")),
    };
    Ok(ProxyHeader::Complete {
        len: 16 + len,
        source,
    })
}

/// Handlers of the multiplexed port, by detected protocol.
#[derive(Clone, Default)]
pub(crate) struct MultiplexerBuilder {
    tls: Option<ConnService>,
    ssh: Option<ConnService>,
    postgres: Option<ConnService>,
    trusted: Vec<IpNet>,
}

impl MultiplexerBuilder {
    /// The handler for TLS connections (usually the ALPN [`Router`](crate::route::Router)).
    pub(crate) fn tls(mut self, svc: ConnService) -> Self {
        self.tls = Some(svc);
        self
    }

    /// The handler for SSH connections.
    pub(crate) fn ssh(mut self, svc: ConnService) -> Self {
        self.ssh = Some(svc);
        self
    }

    /// The handler for Postgres connections (they start with an SSLRequest).
    pub(crate) fn postgres(mut self, svc: ConnService) -> Self {
        self.postgres = Some(svc);
        self
    }

    /// Networks whose PROXY protocol headers are honoured (load balancers).
    pub(crate) fn trusted_proxies(mut self, nets: Vec<IpNet>) -> Self {
        self.trusted = nets;
        self
    }

    /// Builds the service.
    pub(crate) fn build(self) -> Multiplexer {
        Multiplexer {
            inner: Arc::new(self),
        }
    }
}

/// The multiplexer: `Connection → ()`, handing each connection to its protocol's handler.
#[derive(Clone)]
pub struct Multiplexer {
    inner: Arc<MultiplexerBuilder>,
}

impl Multiplexer {
    /// Starts building a multiplexer.
    pub(crate) fn builder() -> MultiplexerBuilder {
        MultiplexerBuilder::default()
    }
}

/// Why the multiplexer closed a connection without handing it over.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum DetectError {
    /// The peer sent too little before the peek deadline.
    #[error("peer sent {0} bytes before the detection deadline")]
    Timeout(usize),
    /// The peer closed before it could be classified.
    #[error("peer closed after {0} bytes, before its protocol was known")]
    Eof(usize),
    /// Reading failed.
    #[error("reading the first bytes: {0}")]
    Io(#[from] std::io::Error),
    /// A PROXY header from an untrusted address.
    #[error("PROXY protocol header from untrusted address {0}; refused")]
    UntrustedProxy(IpAddr),
    /// A malformed PROXY header, or a second one.
    #[error(transparent)]
    ProxyHeader(#[from] ProxyHeaderError),
    /// No handler for the detected protocol.
    #[error("no handler for {0:?} on this port")]
    NoHandler(Protocol),
    /// The first bytes match no known protocol.
    #[error("unknown protocol; first bytes {0}")]
    Unknown(String),
    /// Plain HTTP on the TLS port (answered with a hint).
    #[error("plain HTTP request on the TLS port; answered with a hint to use HTTPS")]
    PlainHttp,
}

impl DetectError {
    /// Whether the peer left without sending a byte (closed or reset at once).
    fn sent_nothing(&self) -> bool {
        match self {
            DetectError::Eof(0) => true,
            DetectError::Io(e) => matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::UnexpectedEof
            ),
            _ => false,
        }
    }
}

/// The plain-HTTP answer's body: clients that forgot `https://` learn what to do.
const HTTPS_HINT: &str = r#"{"error":{"message":"this port speaks TLS only; use https:// to connect"}}"#;

fn https_hint_response() -> String {
    format!(
        "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{HTTPS_HINT}",
        HTTPS_HINT.len()
    )
}

impl Service<Connection> for Multiplexer {
    type Response = ();
    type Error = BoxError;
    type Future = ConnFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, conn: Connection) -> Self::Future {
        let inner = self.inner.clone();
        ConnFuture::new(async move {
            let peer = conn.peer_addr;
            match classify(&inner, conn).await {
                Ok(()) => Ok(()),
                // A peer that connects and leaves without a byte (a load balancer's TCP health
                // check, a port scan) is routine: not worth a line per check at info.
                Err(e) if e.sent_nothing() => {
                    tracing::debug!(%peer, reason = %e, "connection closed before its first byte");
                    Err(e.into())
                }
                Err(e) => {
                    tracing::info!(%peer, reason = %e, "connection closed by the multiplexer");
                    Err(e.into())
                }
            }
        })
    }
}

/// Reads until `detect` decides, under the connection's deadline.
async fn peek_until<T>(
    conn: &mut Connection,
    buf: &mut BytesMut,
    mut decide: impl FnMut(&[u8]) -> Option<T>,
) -> Result<T, DetectError> {
    loop {
        if let Some(d) = decide(buf) {
            return Ok(d);
        }
        match tokio::time::timeout_at(conn.peek_deadline, conn.io.read_more(buf)).await {
            Err(_) => return Err(DetectError::Timeout(buf.len())),
            Ok(Ok(0)) => return Err(DetectError::Eof(buf.len())),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(e.into()),
        }
    }
}

async fn classify(inner: &MultiplexerBuilder, mut conn: Connection) -> Result<(), DetectError> {
    let mut buf = BytesMut::with_capacity(1024);
    let mut proxied = false;
    loop {
        let proto = peek_until(&mut conn, &mut buf, detect).await?;
        let handler = match proto {
            Protocol::ProxyV1 | Protocol::ProxyV2 => {
                let ip = conn.peer_addr.ip().to_canonical();
                if proxied || !inner.trusted.iter().any(|net| net.contains(&ip)) {
                    if proxied {
                        return Err(ProxyHeaderError::Invalid("a second PROXY header").into());
                    }
                    return Err(DetectError::UntrustedProxy(ip));
                }
                let mut parse_err = None;
                let header = peek_until(&mut conn, &mut buf, |b| match parse_proxy_header(b) {
                    Ok(ProxyHeader::NeedMore) => None,
                    Ok(complete) => Some(Some(complete)),
                    Err(e) => {
                        parse_err = Some(e);
                        Some(None)
                    }
                })
                .await?;
                let Some(ProxyHeader::Complete { len, source }) = header else {
                    return Err(parse_err.unwrap_or(ProxyHeaderError::Invalid("truncated")).into());
                };
                let _ = buf.split_to(len);
                if let Some(source) = source {
                    tracing::debug!(tcp_peer = %conn.peer_addr, client = %source, "PROXY header accepted");
                    conn.peer_addr = source;
                }
                proxied = true;
                continue;
            }
            Protocol::Tls => inner.tls.clone(),
            Protocol::Ssh => inner.ssh.clone(),
            Protocol::Postgres => inner.postgres.clone(),
            Protocol::Http => {
                conn.classified();
                // Best effort: the peer may already be gone.
                let _ = conn.io.write_all(https_hint_response().as_bytes()).await;
                let _ = conn.io.shutdown().await;
                return Err(DetectError::PlainHttp);
            }
            Protocol::Unknown => {
                let shown: String = buf.iter().take(16).map(|b| format!("{b:02x}")).collect();
                return Err(DetectError::Unknown(shown));
            }
        };
        let Some(handler) = handler else {
            return Err(DetectError::NoHandler(proto));
        };
        conn.io.rewind(buf.freeze());
        if proto != Protocol::Tls {
            // The TLS router peeks further (the ClientHello) and releases the slot itself.
            conn.classified();
        }
        // Handler errors are the handler's to log; the multiplexer's job ends here.
        if let Err(e) = handler.oneshot(conn).await {
            tracing::debug!(error = %e, "handler ended with an error");
        }
        return Ok(());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_every_protocol_and_waits_on_prefixes() {
        assert_eq!(detect(b"\x16\x03\x01"), Some(Protocol::Tls));
        assert_eq!(detect(b"SSH-2.0-OpenSSH"), Some(Protocol::Ssh));
        assert_eq!(detect(b"SS"), None);
        assert_eq!(detect(b"PROXY TCP4"), Some(Protocol::ProxyV1));
        assert_eq!(detect(b"PRO"), None);
        assert_eq!(detect(&PROXY_V2_SIGNATURE), Some(Protocol::ProxyV2));
        assert_eq!(detect(&PROXY_V2_SIGNATURE[..5]), None);
        assert_eq!(detect(b"GET / HTTP/1.1"), Some(Protocol::Http));
        assert_eq!(detect(b"P"), None);
        assert_eq!(detect(b"POST "), Some(Protocol::Http));
        assert_eq!(detect(&POSTGRES_SSL_REQUEST), Some(Protocol::Postgres));
        assert_eq!(detect(&POSTGRES_SSL_REQUEST[..3]), None);
        assert_eq!(detect(b"\x00\x00\x00\x09"), Some(Protocol::Unknown));
        assert_eq!(detect(b"hello"), Some(Protocol::Unknown));
        assert_eq!(detect(b""), None);
    }

    #[test]
    fn proxy_v1_headers() {
        let h = b"PROXY TCP4 192.0.2.7 10.0.0.1 51000 443\r\nrest";
        assert_eq!(
            parse_proxy_header(h),
            Ok(ProxyHeader::Complete {
                len: h.len() - 4,
                source: Some("192.0.2.7:51000".parse().unwrap())
            })
        );
        let h6 = b"PROXY TCP6 2001:db8::1 2001:db8::2 4000 443\r\n";
        assert!(
            matches!(parse_proxy_header(h6), Ok(ProxyHeader::Complete { source: Some(s), .. }) if s.port() == 4000)
        );
        assert_eq!(
            parse_proxy_header(b"PROXY UNKNOWN\r\n"),
            Ok(ProxyHeader::Complete {
                len: 15,
                source: None
            })
        );
        assert_eq!(
            parse_proxy_header(b"PROXY TCP4 1.2.3.4"),
            Ok(ProxyHeader::NeedMore)
        );
        assert!(parse_proxy_header(b"PROXY TCP4 ::1 ::1 1 2\r\n").is_err());
        assert!(parse_proxy_header(b"PROXY TCP4 x y z w\r\n").is_err());
        assert!(parse_proxy_header(&[b'P'; 200]).is_err());
    }

    #[test]
    fn proxy_v2_headers() {
        let mut h = PROXY_V2_SIGNATURE.to_vec();
        h.extend_from_slice(&[
            0x21, 0x11, 0, 12, 198, 51, 100, 9, 10, 0, 0, 1, 0x1F, 0x90, 0x01, 0xBB,
        ]);
        assert_eq!(
            parse_proxy_header(&h),
            Ok(ProxyHeader::Complete {
                len: 28,
                source: Some("198.51.100.9:8080".parse().unwrap())
            })
        );
        assert_eq!(parse_proxy_header(&h[..20]), Ok(ProxyHeader::NeedMore));
        let mut local = PROXY_V2_SIGNATURE.to_vec();
        local.extend_from_slice(&[0x20, 0x00, 0, 0]);
        assert_eq!(
            parse_proxy_header(&local),
            Ok(ProxyHeader::Complete {
                len: 16,
                source: None
            })
        );
        let mut bad = PROXY_V2_SIGNATURE.to_vec();
        bad.extend_from_slice(&[0x11, 0x11, 0, 0]);
        assert!(parse_proxy_header(&bad).is_err());
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            let _ = detect(&bytes);
            let _ = parse_proxy_header(&bytes);
            let mut v2 = PROXY_V2_SIGNATURE.to_vec();
            v2.extend_from_slice(&bytes);
            let _ = parse_proxy_header(&v2);
            let mut v1 = b"PROXY ".to_vec();
            v1.extend_from_slice(&bytes);
            let _ = parse_proxy_header(&v1);
        }
    }
}
