//! `forward_url` channels: fetching an upstream version server, with a cache.
//!
//! Sits under the [`VersionResolver`](super::VersionResolver): `GET <url>/version` and
//! `GET <url>/critical` with a 10 s timeout, through svc's [`HttpClient`] over any connector
//! (such as hyper-util's `HttpConnector` or the environment-aware proxy dialer), with TLS for
//! `https://` URLs. Results — errors included — are cached for one minute and
//! concurrent misses share one fetch, so thousands of agents never stampede the upstream.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use http::StatusCode;
use hyper_util::client::legacy::connect::HttpConnector;
use svc_core::{Clock, SystemClock, Version, VersionError};

use crate::http::{Connector, HttpClient, HttpErrorKind};

/// How long one upstream fetch may take.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a result (or an error) is reused.
pub const CACHE_TTL: Duration = Duration::from_secs(60);
/// The most body bytes read from an upstream answer.
const MAX_BODY: usize = 4096;

/// Why an upstream answer could not be had. Cloneable so a cached error can be served again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FetchError {
    /// The URL is not a valid `http(s)://` URL.
    #[error("forward_url {url}: not a valid http(s) URL")]
    Url {
        /// The URL.
        url: String,
    },
    /// Connecting, TLS or HTTP failed.
    #[error("GET {url}: {reason}")]
    Transport {
        /// The URL fetched.
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// No answer within [`FETCH_TIMEOUT`].
    #[error("GET {url}: no answer within {FETCH_TIMEOUT:?}")]
    Timeout {
        /// The URL fetched.
        url: String,
    },
    /// The upstream answered with a status other than 200.
    #[error("GET {url}: expected status 200, got {status}")]
    Status {
        /// The URL fetched.
        url: String,
        /// The status.
        status: u16,
    },
    /// The upstream's version body is not a version.
    #[error("GET {url}: {source}")]
    Version {
        /// The URL fetched.
        url: String,
        /// The parse error.
        source: VersionError,
    },
    /// The upstream's critical body is not yes/no/true/false.
    #[error("GET {url}: expected yes, no, true or false, got \"{body}\"")]
    Critical {
        /// The URL fetched.
        url: String,
        /// The body, trimmed.
        body: String,
    },
}

/// Parses a version body: trimmed, `none` means no version, a missing `v` is added.
pub fn parse_version_body(url: &str, body: &str) -> Result<Option<Version>, FetchError> {
    let body = body.trim();
    if body == "none" {
        return Ok(None);
    }
    Version::parse(body)
        .map(Some)
        .map_err(|source| FetchError::Version {
            url: url.to_owned(),
            source,
        })
}

/// Parses a critical body: `yes/no/true/false` in any case.
pub fn parse_critical_body(url: &str, body: &str) -> Result<bool, FetchError> {
    match body.trim().to_ascii_lowercase().as_str() {
        "yes" | "true" => Ok(true),
        "no" | "false" => Ok(false),
        other => Err(FetchError::Critical {
            url: url.to_owned(),
            body: other.chars().take(64).collect(),
        }),
    }
}

type Slot = Arc<tokio::sync::Mutex<Option<(SystemTime, Result<String, FetchError>)>>>;

/// Fetches upstream bodies with an [`HttpClient`] over connector `C`, caching per URL.
pub struct Fetcher<C = HttpConnector> {
    client: HttpClient<C>,
    clock: Arc<dyn Clock>,
    ttl: Duration,
    cache: Mutex<HashMap<String, Slot>>,
}

impl Fetcher<HttpConnector> {
    /// A fetcher dialing directly (hyper-util's `HttpConnector`), trusting `tls`'s roots for
    /// `https://` upstreams.
    pub fn direct(tls: Arc<rustls::ClientConfig>) -> Self {
        let mut http = HttpConnector::new();
        // TLS is added by the client above it, so https:// URIs reach the connector too.
        http.enforce_http(false);
        http.set_nodelay(true);
        Self::new(http, tls, Arc::new(SystemClock))
    }
}

impl<C: Connector> Fetcher<C> {
    /// A fetcher over any connector (e.g. the environment-aware proxy dialer): an
    /// [`HttpClient`] with [`FETCH_TIMEOUT`] for connecting and for the whole request, and
    /// bodies of at most 4 KiB.
    pub fn new(connector: C, tls: Arc<rustls::ClientConfig>, clock: Arc<dyn Clock>) -> Self {
        let client = HttpClient::builder(tls)
            .connect_timeout(FETCH_TIMEOUT)
            .timeout(FETCH_TIMEOUT)
            .max_body(MAX_BODY)
            .user_agent(http::HeaderValue::from_static(concat!(
                "svc-proxy/",
                env!("CARGO_PKG_VERSION")
            )))
            // One request per URL a minute at most: a kept connection would only hold the
            // upstream's slot.
            .pool_max_idle_per_host(0)
            .build(connector);
        Self::with_client(client, clock)
    }

    /// A fetcher asking through `client` (its own deadlines and body cap apply; a deadline
    /// that runs out is [`FetchError::Timeout`]).
    pub fn with_client(client: HttpClient<C>, clock: Arc<dyn Clock>) -> Self {
        Self {
            client,
            clock,
            ttl: CACHE_TTL,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// How long an answer (or an error) is served from the cache; [`CACHE_TTL`] by default.
    /// `Duration::ZERO` fetches every time — for clients that decide on the answer, such as
    /// the updaters, while concurrent requests for one URL still share one fetch.
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The body of `GET url`, from the cache when fetched (or failed) within the cache's time to
    /// live ([`CACHE_TTL`] unless [`with_ttl`](Self::with_ttl) says otherwise).
    pub async fn get(&self, url: &str) -> Result<String, FetchError> {
        let slot = {
            let mut cache = self
                .cache
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            cache.entry(url.to_owned()).or_default().clone()
        };
        // Holding the slot's lock across the fetch makes concurrent misses wait for one fetch.
        let mut entry = slot.lock_owned().await;
        if let Some((at, result)) = entry.as_ref()
            // A clock that went backwards (`Err`) counts as expired: refetch rather than serve
            // an answer of unknown age.
            && self.clock.now().duration_since(*at).is_ok_and(|age| age < self.ttl)
        {
            return result.clone();
        }
        // The fetch runs in its own task: a requester that gives up (the 5 s request timeout)
        // does not cancel it, so its result — or its error — still lands in the cache.
        let (client, clock, owned_url) = (self.client.clone(), self.clock.clone(), url.to_owned());
        let task = tokio::spawn(async move {
            let result = fetch(&client, &owned_url).await;
            if let Err(e) = &result {
                tracing::warn!(error = %e, "version channel upstream failed; the error is cached for a minute");
            }
            *entry = Some((clock.now(), result.clone()));
            result
        });
        match task.await {
            Ok(result) => result,
            Err(e) => Err(FetchError::Transport {
                url: url.to_owned(),
                reason: format!("fetch task failed: {e}"),
            }),
        }
    }
}

/// `GET url` through `client`: the body of a 200 answer, else the error naming `url`.
async fn fetch<C: Connector>(client: &HttpClient<C>, url: &str) -> Result<String, FetchError> {
    let resp = client.get(url).await.map_err(|e| match e.kind() {
        HttpErrorKind::Url => FetchError::Url { url: url.to_owned() },
        _ if e.is_timeout() => FetchError::Timeout { url: url.to_owned() },
        kind => FetchError::Transport {
            url: url.to_owned(),
            reason: kind.to_string(),
        },
    })?;
    if resp.status() != StatusCode::OK {
        return Err(FetchError::Status {
            url: url.to_owned(),
            status: resp.status().as_u16(),
        });
    }
    Ok(String::from_utf8_lossy(resp.body()).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies() {
        assert_eq!(
            parse_version_body("u", " v17.1.0\n"),
            Ok(Some(Version::new(17, 1, 0)))
        );
        assert_eq!(
            parse_version_body("u", "17.1.0"),
            Ok(Some(Version::new(17, 1, 0)))
        );
        assert_eq!(parse_version_body("u", "none"), Ok(None));
        assert!(parse_version_body("u", "").is_err());
        assert!(parse_version_body("u", "<html>").is_err());
        for (b, v) in [("yes", true), ("NO", false), ("True\n", true), ("false", false)] {
            assert_eq!(parse_critical_body("u", b), Ok(v));
        }
        assert!(parse_critical_body("u", "maybe").is_err());
    }
}
