//! Where the updater learns its target: the channel's `version` and `critical` endpoints.
//!
//! Sits at the start of a reconcile: [`TargetSource::fetch`] → [`Target`] →
//! [`super::decision::decide`]. The HTTP implementation is generic over the connector so an
//! embedding product (or svc's own proxy-aware dialer) decides how the version server is reached.

use std::{future::Future, pin::Pin, time::Duration};

use bytes::Bytes;
use http::{StatusCode, Uri};
use http_body_util::{BodyExt, Empty};
use hyper_util::{
    client::legacy::{Client, connect::Connect, connect::HttpConnector},
    rt::TokioExecutor,
};
use svc_core::{Version, VersionError};

/// Time allowed for one request to the version server (REFERENCE.md: 10 s).
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest body read from the version server; a version string is a few bytes.
const MAX_BODY: usize = 1024;

/// What the channel serves now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The target version; `None` when the channel answers `none`.
    pub version: Option<Version>,
    /// Whether the update is critical (applied outside the maintenance window).
    pub critical: bool,
}

/// Why the target could not be fetched. The controller leaves the workload unchanged.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TargetError {
    /// The URL built from the base and the endpoint is not a valid URI.
    #[error("version server url \"{url}\": {reason}")]
    Url {
        /// The URL as built.
        url: String,
        /// Why it is invalid.
        reason: String,
    },
    /// The request failed (connection refused, reset, TLS).
    #[error("GET {url}: {source}")]
    Request {
        /// The URL requested.
        url: String,
        /// The client error.
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    /// Reading the body failed.
    #[error("GET {url}: reading the body: {source}")]
    Body {
        /// The URL requested.
        url: String,
        /// The body error.
        #[source]
        source: hyper::Error,
    },
    /// No answer within [`FETCH_TIMEOUT`].
    #[error("GET {url}: no answer within {timeout:?}")]
    Timeout {
        /// The URL requested.
        url: String,
        /// The timeout that expired.
        timeout: Duration,
    },
    /// A status other than 200.
    #[error("GET {url}: expected status 200, got {status}")]
    Status {
        /// The URL requested.
        url: String,
        /// The status received.
        status: StatusCode,
    },
    /// A body larger than a version string can be.
    #[error("GET {url}: expected a short plain-text body, got more than {MAX_BODY} bytes")]
    TooLarge {
        /// The URL requested.
        url: String,
    },
    /// The `version` body is neither `none` nor a version.
    #[error("GET {url}: expected v<major>.<minor>.<patch> or none: {source}")]
    Version {
        /// The URL requested.
        url: String,
        /// Why the body is not a version.
        #[source]
        source: VersionError,
    },
    /// The `critical` body is not `yes`, `no`, `true` or `false`.
    #[error("GET {url}: expected yes or no, got \"{body}\"")]
    Critical {
        /// The URL requested.
        url: String,
        /// The body received, truncated.
        body: String,
    },
}

/// A source of the channel's target. Implemented over HTTP by [`HttpTargetSource`]; tests and
/// embedding products may implement it directly.
pub trait TargetSource: Send + Sync + 'static {
    /// Fetches the target version and whether it is critical.
    fn fetch(&self) -> Pin<Box<dyn Future<Output = Result<Target, TargetError>> + Send + '_>>;
}

/// Fetches `<base>/version` and `<base>/critical` over HTTP with a connector `C`
/// (default: hyper-util's plain [`HttpConnector`]).
#[derive(Clone)]
pub struct HttpTargetSource<C = HttpConnector> {
    base: String,
    client: Client<C, Empty<Bytes>>,
}

impl<C> std::fmt::Debug for HttpTargetSource<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpTargetSource")
            .field("base", &self.base)
            .finish()
    }
}

/// The base URL of a channel on a version server:
/// `<server>/v1/webapi/automaticupgrades/channel/<channel>` (§4.2). A trailing `/` on the server
/// is ignored; the channel may contain `/` (`stable/cloud`).
pub fn channel_base_url(server: &str, channel: &str) -> String {
    format!(
        "{}/v1/webapi/automaticupgrades/channel/{}",
        server.trim_end_matches('/'),
        channel.trim_matches('/')
    )
}

impl HttpTargetSource<HttpConnector> {
    /// A source for the channel base URL `base` over plain HTTP.
    pub fn new(base: impl Into<String>) -> Self {
        Self::with_connector(base, HttpConnector::new())
    }
}

impl<C> HttpTargetSource<C>
where
    C: Connect + Clone + Send + Sync + 'static,
{
    /// A source for the channel base URL `base` that reaches the server through `connector`.
    pub fn with_connector(base: impl Into<String>, connector: C) -> Self {
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Self {
            base: base.into().trim_end_matches('/').to_owned(),
            client,
        }
    }

    /// The channel base URL this source asks.
    pub fn base(&self) -> &str {
        &self.base
    }

    async fn get(&self, endpoint: &str) -> Result<(String, String), TargetError> {
        let url = format!("{}/{endpoint}", self.base);
        let uri: Uri = url.parse().map_err(|e: http::uri::InvalidUri| TargetError::Url {
            url: url.clone(),
            reason: e.to_string(),
        })?;
        let fetch = async {
            let response = self
                .client
                .get(uri)
                .await
                .map_err(|source| TargetError::Request {
                    url: url.clone(),
                    source,
                })?;
            if response.status() != StatusCode::OK {
                return Err(TargetError::Status {
                    url: url.clone(),
                    status: response.status(),
                });
            }
            let body = http_body_util::Limited::new(response.into_body(), MAX_BODY)
                .collect()
                .await
                .map_err(|e| match e.downcast::<hyper::Error>() {
                    Ok(source) => TargetError::Body {
                        url: url.clone(),
                        source: *source,
                    },
                    Err(_) => TargetError::TooLarge { url: url.clone() },
                })?
                .to_bytes();
            Ok(String::from_utf8_lossy(&body).trim().to_owned())
        };
        match tokio::time::timeout(FETCH_TIMEOUT, fetch).await {
            Ok(body) => body.map(|b| (url, b)),
            Err(_) => Err(TargetError::Timeout {
                url,
                timeout: FETCH_TIMEOUT,
            }),
        }
    }

    /// Fetches and parses `<base>/version`: `none` or a version.
    pub async fn fetch_version(&self) -> Result<Option<Version>, TargetError> {
        let (url, body) = self.get("version").await?;
        parse_version_body(&body).map_err(|source| TargetError::Version { url, source })
    }

    /// Fetches and parses `<base>/critical`: `yes`/`no` (also `true`/`false`, any case).
    pub async fn fetch_critical(&self) -> Result<bool, TargetError> {
        let (url, body) = self.get("critical").await?;
        parse_critical_body(&body).ok_or_else(|| TargetError::Critical {
            url,
            body: body.chars().take(64).collect(),
        })
    }
}

impl<C> TargetSource for HttpTargetSource<C>
where
    C: Connect + Clone + Send + Sync + 'static,
{
    fn fetch(&self) -> Pin<Box<dyn Future<Output = Result<Target, TargetError>> + Send + '_>> {
        Box::pin(async move {
            let version = self.fetch_version().await?;
            // The version is what matters; a critical flag that cannot be read is treated as
            // not critical (REFERENCE.md), so the update waits for the window.
            let critical = match self.fetch_critical().await {
                Ok(critical) => critical,
                Err(error) => {
                    tracing::warn!(%error, "critical flag unknown, treating the update as not critical");
                    false
                }
            };
            Ok(Target { version, critical })
        })
    }
}

/// Parses a `version` body: `none` is no version; anything else must be a version.
pub fn parse_version_body(body: &str) -> Result<Option<Version>, VersionError> {
    let body = body.trim();
    if body == "none" {
        return Ok(None);
    }
    Version::parse(body).map(Some)
}

/// Parses a `critical` body: `yes`/`true` or `no`/`false`, in any case.
pub fn parse_critical_body(body: &str) -> Option<bool> {
    match body.trim().to_ascii_lowercase().as_str() {
        "yes" | "true" => Some(true),
        "no" | "false" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies() {
        assert_eq!(
            parse_version_body("v17.1.2").unwrap(),
            Some(Version::new(17, 1, 2))
        );
        assert_eq!(
            parse_version_body("17.1.2\n").unwrap(),
            Some(Version::new(17, 1, 2))
        );
        assert_eq!(parse_version_body("none").unwrap(), None);
        assert!(parse_version_body("").is_err());
        assert!(parse_version_body("<html>").is_err());
        assert!(parse_version_body("v17").is_err());
        assert_eq!(parse_critical_body("yes"), Some(true));
        assert_eq!(parse_critical_body("NO"), Some(false));
        assert_eq!(parse_critical_body("True"), Some(true));
        assert_eq!(parse_critical_body("maybe"), None);
    }

    #[test]
    fn base_urls() {
        assert_eq!(
            channel_base_url("https://proxy.example.com:443/", "stable/cloud"),
            "https://proxy.example.com:443/v1/webapi/automaticupgrades/channel/stable/cloud"
        );
        assert_eq!(
            HttpTargetSource::new("http://127.0.0.1:1/x/").base(),
            "http://127.0.0.1:1/x"
        );
    }
}
