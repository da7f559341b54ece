//! The updaters' client of the version server: what version should this agent run, and is it
//! critical?
//!
//! First network step of every updater run (`svc-upgrade` on Linux, the Kubernetes controller):
//! `GET <base>/version` and `GET <base>/critical` on the cluster's own Proxy Service, where
//! `<base>` is `https://<proxy>/v1/webapi/automaticupgrades/channel/<channel>`. The requests go
//! through [`Fetcher`] over svc's
//! [`HttpClient`](svc_net::http::HttpClient) — the same HTTP(S) client the proxy uses for
//! `forward_url` channels — over any connector; the default, [`ProxyDialer`], honours
//! `HTTPS_PROXY` / `NO_PROXY`, so an agent behind a corporate proxy reaches its cluster the same
//! way its tunnel does.
//!
//! Answers are read leniently: trimmed; `none` is no version; a version without `v`
//! gets one; `critical` is `yes`/`no`/`true`/`false` in any case. Anything else — a status other
//! than 200, garbage, no answer within [`TIMEOUT`] — is an error: an updater never acts on a
//! version it could not read.
//!
//! ```no_run
//! # async fn example() -> Result<(), svc_update::target::TargetError> {
//! use svc_update::target::{Trust, VersionClient, channel_url, tls_config};
//!
//! let url = channel_url("proxy.example.com:443", "stable/cloud")?;
//! let client = VersionClient::from_env(url, tls_config(Trust::Roots(None))?)?;
//! let target = client.target().await?; // Target { version: Some(v17.1.0), critical: false }
//! # let _ = target;
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;

use http::Uri;
use svc_core::{SystemClock, Version};
use svc_net::dial::ProxyDialer;

use svc_net::proxy::web::version::forward::{
    FETCH_TIMEOUT, FetchError, Fetcher, parse_critical_body, parse_version_body,
};

/// How long one request to the version server may take.
pub const TIMEOUT: std::time::Duration = FETCH_TIMEOUT;

/// The version server's channel path (served by the proxy, asked here).
pub use svc_core::channel::CHANNEL_PATH_PREFIX;

/// What the version server advertises for the agent's channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The version agents should run; `None` when the channel advertises none.
    pub version: Option<Version>,
    /// Whether the update must be applied at once, outside maintenance windows.
    pub critical: bool,
}

/// Why the target could not be had.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TargetError {
    /// The configured endpoint is not `host[:port]/path`.
    #[error(
        "version endpoint \"{endpoint}\": expected host[:port]/path without a scheme or white space \
         (for example proxy.example.com:443/v1/webapi/automaticupgrades/channel/default)"
    )]
    Endpoint {
        /// The endpoint as configured.
        endpoint: String,
    },
    /// The request failed, timed out, or the answer was not a version / critical flag.
    #[error("version server: {0}")]
    Fetch(#[from] FetchError),
    /// The CA bundle given for the version server is unusable.
    #[error("version server CA bundle: {0}")]
    Tls(#[from] svc_net::tls::TlsError),
    /// `HTTPS_PROXY` / `HTTP_PROXY` / `NO_PROXY` could not be used.
    #[error("proxy environment: {0}")]
    Dial(#[from] svc_net::dial::Error),
}

/// The `https://` base URL of an endpoint written `host[:port]/path` (the Linux `endpoint`
/// file): `proxy.example.com/v1/webapi/automaticupgrades/channel/default` →
/// `https://proxy.example.com/v1/webapi/automaticupgrades/channel/default`. A trailing `/` is
/// dropped; a scheme, white space, an empty host or an unparsable result are errors.
pub fn endpoint_url(endpoint: &str) -> Result<String, TargetError> {
    let invalid = || TargetError::Endpoint {
        endpoint: endpoint.to_owned(),
    };
    let trimmed = endpoint.trim().trim_end_matches('/');
    if trimmed.is_empty()
        || trimmed.contains("://")
        || trimmed.starts_with('/')
        || trimmed.chars().any(char::is_whitespace)
    {
        return Err(invalid());
    }
    let url = format!("https://{trimmed}");
    let uri: Uri = url.parse().map_err(|_| invalid())?;
    match uri.host() {
        Some(host) if !host.is_empty() => Ok(url),
        _ => Err(invalid()),
    }
}

/// The `https://` base URL of `channel` on the Proxy Service at `proxy` (`host[:port]`), as the
/// Kubernetes updater's flags give them: `https://<proxy>/v1/webapi/automaticupgrades/channel/<channel>`.
pub fn channel_url(proxy: &str, channel: &str) -> Result<String, TargetError> {
    endpoint_url(&format!(
        "{}{CHANNEL_PATH_PREFIX}{}",
        proxy.trim_end_matches('/'),
        channel.trim_matches('/')
    ))
}

/// Asks one channel of a version server for its target, over connector `C`.
///
/// Cheap to share behind an `Arc`. Every call asks the server (concurrent calls for one URL share
/// one request): an updater decides on the answer, and the proxy's version server already
/// answers from memory and caches its own upstream.
pub struct VersionClient<C = ProxyDialer> {
    fetcher: Fetcher<C>,
    base: String,
}

impl<C> std::fmt::Debug for VersionClient<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VersionClient")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl VersionClient<ProxyDialer> {
    /// A client of `base_url` (`https://…/channel/<channel>`) that dials as the proxy
    /// environment says (`HTTPS_PROXY`, `NO_PROXY`) and verifies the server with `tls` (see
    /// [`tls_config`]).
    pub fn from_env(
        base_url: impl Into<String>,
        tls: Arc<rustls::ClientConfig>,
    ) -> Result<Self, TargetError> {
        Ok(Self::new(ProxyDialer::from_env()?, tls, base_url))
    }
}

/// How the version server's certificate is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Trust<'a> {
    /// The public web roots plus, when given, a PEM bundle (the cluster's self-signed CA, a
    /// private CA).
    Roots(Option<&'a [u8]>),
    /// Any certificate, for trials against a self-signed proxy: the connection is still
    /// encrypted and the handshake signatures checked, but anyone on the path could answer in
    /// the proxy's name.
    Insecure,
}

/// The TLS client configuration for `trust`.
pub fn tls_config(trust: Trust<'_>) -> Result<Arc<rustls::ClientConfig>, TargetError> {
    match trust {
        Trust::Roots(extra) => Ok(svc_net::tls::client_config(extra)?),
        Trust::Insecure => {
            let config = svc_net::tls::insecure_client_config().map_err(svc_net::tls::TlsError::from)?;
            Ok(Arc::new(config))
        }
    }
}

impl<C> VersionClient<C>
where
    C: svc_net::http::Connector,
{
    /// A client of `base_url` over `connector` (any hyper-util style connector: `ProxyDialer`,
    /// `HttpConnector` with `enforce_http(false)`, a test's), verifying `https://` servers with
    /// `tls`.
    pub fn new(connector: C, tls: Arc<rustls::ClientConfig>, base_url: impl Into<String>) -> Self {
        Self {
            // An updater acts on the answer it gets: no minute-old cache between it and the
            // channel (the proxy's version server caches its own upstream).
            fetcher: Fetcher::new(connector, tls, Arc::new(SystemClock)).with_ttl(std::time::Duration::ZERO),
            base: base_url.into().trim_end_matches('/').to_owned(),
        }
    }

    /// The channel's base URL, without `/version` or `/critical`.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// The version the channel advertises; `None` for `none`.
    pub async fn version(&self) -> Result<Option<Version>, TargetError> {
        let url = format!("{}/version", self.base);
        let body = self.fetcher.get(&url).await?;
        Ok(parse_version_body(&url, &body)?)
    }

    /// Whether the channel's update is critical.
    pub async fn critical(&self) -> Result<bool, TargetError> {
        let url = format!("{}/critical", self.base);
        let body = self.fetcher.get(&url).await?;
        Ok(parse_critical_body(&url, &body)?)
    }

    /// Both answers, asked concurrently. The version must be read; a critical flag that cannot
    /// be read counts as not critical, so the update waits for the window.
    pub async fn target(&self) -> Result<Target, TargetError> {
        let (version, critical) = tokio::join!(self.version(), self.critical());
        let critical = critical.unwrap_or_else(|error| {
            tracing::warn!(%error, "critical flag unknown, treating the update as not critical");
            false
        });
        Ok(Target {
            version: version?,
            critical,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::{convert::Infallible, sync::Mutex};

    use bytes::Bytes;
    use http_body_util::Full;
    use hyper_util::client::legacy::connect::HttpConnector;
    use tokio::net::TcpListener;

    use super::*;

    #[test]
    fn endpoints_become_https_urls() {
        assert_eq!(
            endpoint_url("proxy.example.com:443/v1/webapi/automaticupgrades/channel/default/").unwrap(),
            "https://proxy.example.com:443/v1/webapi/automaticupgrades/channel/default"
        );
        assert_eq!(
            endpoint_url("127.0.0.1:3080/v1/webapi/automaticupgrades/channel/stable/cloud\n").unwrap(),
            "https://127.0.0.1:3080/v1/webapi/automaticupgrades/channel/stable/cloud"
        );
        for bad in ["", "https://p/x", "/v1/x", "p x/y", ":443/x"] {
            let err = endpoint_url(bad).unwrap_err().to_string();
            assert!(err.contains("expected host[:port]/path"), "{bad:?}: {err}");
        }
        assert_eq!(
            channel_url("proxy.example.com:3080", "stable/cloud").unwrap(),
            "https://proxy.example.com:3080/v1/webapi/automaticupgrades/channel/stable/cloud"
        );
    }

    /// A plain HTTP version server answering from a mutable table of path suffix → (status, body).
    /// Path suffix, status, body.
    type Answers = Arc<Mutex<Vec<(&'static str, u16, &'static str)>>>;

    async fn server(answers: Answers) -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let answers = answers.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let path = req.uri().path().to_owned();
                        let (status, body) = answers
                            .lock()
                            .unwrap()
                            .iter()
                            .find(|(suffix, _, _)| path.ends_with(suffix))
                            .map_or((404, "not found"), |(_, s, b)| (*s, *b));
                        let mut resp = http::Response::new(Full::new(Bytes::from(body)));
                        *resp.status_mut() = http::StatusCode::from_u16(status).unwrap();
                        async move { Ok::<_, Infallible>(resp) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        addr
    }

    fn client(addr: std::net::SocketAddr, channel: &str) -> VersionClient<HttpConnector> {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        VersionClient::new(
            http,
            svc_net::tls::client_config(None).unwrap(),
            format!("http://{addr}/v1/webapi/automaticupgrades/channel/{channel}"),
        )
    }

    #[tokio::test]
    async fn answers_are_read_as_the_reference_says() {
        let answers = Arc::new(Mutex::new(vec![
            ("/a/version", 200, "17.1.0\n"),
            ("/a/critical", 200, "TRUE"),
            ("/b/version", 200, "none"),
            ("/b/critical", 200, "no"),
            ("/c/version", 200, "<html>oops</html>"),
            ("/c/critical", 200, "no"),
            ("/d/version", 200, "v17.1.0"),
            ("/d/critical", 200, "perhaps"),
            ("/e/version", 503, "v17.1.0"),
            ("/e/critical", 200, "no"),
        ]));
        let addr = server(answers).await;
        assert_eq!(
            client(addr, "a").target().await.unwrap(),
            Target {
                version: Some(Version::new(17, 1, 0)),
                critical: true
            }
        );
        assert_eq!(
            client(addr, "b").target().await.unwrap(),
            Target {
                version: None,
                critical: false
            }
        );
        let err = client(addr, "c").target().await.unwrap_err().to_string();
        assert!(err.contains("invalid version \"<html>oops</html>\""), "{err}");
        // An unreadable critical flag is an error of its own, but the target stands as not
        // critical: the update then waits for the window.
        let err = client(addr, "d").critical().await.unwrap_err().to_string();
        assert!(
            err.contains("expected yes, no, true or false, got \"perhaps\""),
            "{err}"
        );
        assert_eq!(
            client(addr, "d").target().await.unwrap(),
            Target {
                version: Some(Version::new(17, 1, 0)),
                critical: false
            }
        );
        let err = client(addr, "e").target().await.unwrap_err().to_string();
        assert!(err.contains("expected status 200, got 503"), "{err}");
    }

    #[tokio::test]
    async fn a_server_that_is_down_is_an_error() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let err = client(addr, "default").target().await.unwrap_err().to_string();
        assert!(err.starts_with("version server: GET http://127.0.0.1:"), "{err}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_server_times_out_after_10s() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let held = tokio::spawn(async move {
            let mut conns = Vec::new();
            while let Ok((tcp, _)) = listener.accept().await {
                conns.push(tcp);
            }
        });
        let err = client(addr, "default").version().await.unwrap_err().to_string();
        assert!(err.ends_with("no answer within 10s"), "{err}");
        held.abort();
    }
}
