//! [`HttpError`]: why a request of the [`HttpClient`](super::HttpClient) failed, naming the
//! method and the URL (credentials removed).

use std::{error::Error as StdError, time::Duration};

use http::{Method, Uri};

/// Why a request failed: the method, the URL (without user info) and what went wrong.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{method} {url}: {kind}")]
pub struct HttpError {
    method: Method,
    url: String,
    kind: HttpErrorKind,
}

/// What went wrong with a request (see [`HttpError::kind`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HttpErrorKind {
    /// The URL is not an absolute `http://` or `https://` URL with a host.
    #[error("expected an absolute http:// or https:// URL")]
    Url,
    /// No connection (TCP, the proxy's CONNECT and TLS) within the connect deadline.
    #[error("no connection within {0:?}")]
    ConnectTimeout(Duration),
    /// Connecting failed: refused, unresolvable, the proxy refused CONNECT.
    #[error("connecting: {0}")]
    Connect(String),
    /// The TLS handshake with the server failed (e.g. its certificate is not trusted).
    #[error("TLS: {0}")]
    Tls(String),
    /// The whole request (connecting, sending, the answer and its body) took too long.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// Sending the request or reading the answer's head failed.
    #[error("{0}")]
    Request(String),
    /// The answer's body is larger than the client reads.
    #[error("the answer's body exceeds {0} bytes")]
    BodyTooLarge(usize),
    /// Reading the answer's body failed.
    #[error("reading the body: {0}")]
    Body(String),
}

impl HttpError {
    pub(crate) fn new(method: &Method, url: &Uri, kind: HttpErrorKind) -> Self {
        Self {
            method: method.clone(),
            url: redact(url),
            kind,
        }
    }

    /// The request's method.
    pub fn method(&self) -> &Method {
        &self.method
    }

    /// The request's URL, without user info (`user:password@`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// What went wrong.
    pub fn kind(&self) -> &HttpErrorKind {
        &self.kind
    }

    /// Whether a deadline (connect or whole request) ran out.
    pub fn is_timeout(&self) -> bool {
        matches!(
            self.kind,
            HttpErrorKind::Timeout(_) | HttpErrorKind::ConnectTimeout(_)
        )
    }
}

/// `uri` as text without its user info: `https://user:pw@host/p` → `https://host/p`.
pub(crate) fn redact(uri: &Uri) -> String {
    match uri.authority() {
        Some(authority) if authority.as_str().contains('@') => {
            let host_port = authority
                .as_str()
                .rsplit_once('@')
                .map_or(authority.as_str(), |(_, h)| h);
            let scheme = uri.scheme_str().map(|s| format!("{s}://")).unwrap_or_default();
            let path = uri.path_and_query().map_or("", |p| p.as_str());
            format!("{scheme}{host_port}{path}")
        }
        _ => uri.to_string(),
    }
}

/// The messages of `e`'s causes, joined with `: `; `e`'s own message when it has no cause, or
/// when `skip_top` is false.
pub(crate) fn chain(e: &(dyn StdError + 'static), skip_top: bool) -> String {
    let mut parts = Vec::new();
    if !skip_top || e.source().is_none() {
        parts.push(e.to_string());
    }
    let mut next = e.source();
    while let Some(cause) = next {
        let text = cause.to_string();
        // Wrappers often repeat their cause's message; say it once.
        if parts.last() != Some(&text) {
            parts.push(text);
        }
        next = cause.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_credentials() {
        let uri: Uri = "https://user:secret@example.com:8443/v1/x?y=1".parse().unwrap();
        assert_eq!(redact(&uri), "https://example.com:8443/v1/x?y=1");
        let err = HttpError::new(&Method::GET, &uri, HttpErrorKind::Timeout(Duration::from_secs(3)));
        assert_eq!(
            err.to_string(),
            "GET https://example.com:8443/v1/x?y=1: no answer within 3s"
        );
        assert!(!format!("{err:?}").contains("secret"));
        let plain: Uri = "http://127.0.0.1:80/ping".parse().unwrap();
        assert_eq!(redact(&plain), "http://127.0.0.1:80/ping");
    }

    #[test]
    fn chains_name_the_causes() {
        let err = Wrap(std::io::Error::other("connection refused"));
        assert_eq!(chain(&err, true), "connection refused");
        assert_eq!(chain(&err, false), "client error: connection refused");
        let alone = std::io::Error::other("reset");
        assert_eq!(chain(&alone, true), "reset");
    }

    #[derive(Debug)]
    struct Wrap(std::io::Error);
    impl std::fmt::Display for Wrap {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "client error")
        }
    }
    impl StdError for Wrap {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(&self.0)
        }
    }
}
