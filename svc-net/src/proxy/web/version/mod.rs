//! The version server: which version each channel advertises, and whether it is critical.
//!
//! Sits behind the proxy's web API (`GET /v1/webapi/automaticupgrades/channel/<channel>/…`,
//! served by [`http`]); agents' updaters ask it. [`VersionResolver`] answers `channel →
//! {version, critical}` by the rules of `svc_core::channel::Channels` (pure: `default` always
//! exists, `stable/cloud` aliases it, a higher major is capped to the proxy's version); static
//! channels answer from configuration (`none` allowed), `forward_url` channels ask an upstream
//! through an [`UpstreamFetch`] — [`forward::Fetcher`] over HTTP(S) (10 s timeout, one-minute
//! cache of results and errors).

pub mod forward;
pub mod http;

use std::{
    collections::BTreeMap,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use svc_core::{
    Version,
    channel::{ChannelSpec, Channels},
};
use tower::Service;

pub use forward::{FetchError, Fetcher};

/// A channel's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelAnswer {
    /// The target version; `None` when the channel advertises none.
    pub version: Option<Version>,
    /// Whether the update is critical.
    pub critical: bool,
}

/// Why a channel has no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResolveError {
    /// No channel of that name is configured.
    #[error("channel \"{0}\" is not configured")]
    UnknownChannel(String),
    /// The upstream of a `forward_url` channel failed.
    #[error("channel \"{channel}\": {source}")]
    Upstream {
        /// The channel.
        channel: String,
        /// The upstream failure.
        source: FetchError,
    },
}

/// Fetches an upstream version server's answers for `forward_url` channels: what
/// [`VersionResolver`] asks. [`Fetcher`] is the HTTP(S) implementation (any connector, with a
/// one-minute cache); tests and embedders may answer from anywhere.
pub trait UpstreamFetch: Send + Sync + 'static {
    /// The body at `url` (`<forward_url>/version` or `<forward_url>/critical`).
    fn fetch<'a>(
        &'a self,
        url: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<String, FetchError>> + Send + 'a>>;
}

impl<C: crate::http::Connector> UpstreamFetch for Fetcher<C> {
    fn fetch<'a>(
        &'a self,
        url: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<String, FetchError>> + Send + 'a>> {
        Box::pin(self.get(url))
    }
}

struct Inner {
    channels: Channels,
    fetch: Box<dyn UpstreamFetch>,
}

/// Resolves channel names to answers: a `tower::Service<String>`. The rules are
/// [`Channels`]' (pure, in `svc-core`); this adds the upstream fetch of `forward_url` channels.
#[derive(Clone)]
pub struct VersionResolver {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for VersionResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VersionResolver")
            .field("channels", &self.inner.channels)
            .finish_non_exhaustive()
    }
}

impl VersionResolver {
    /// A resolver for the configured `channels`, for a proxy at version `own`, asking `fetch`
    /// for forwarding channels.
    pub fn new(channels: BTreeMap<String, ChannelSpec>, own: Version, fetch: impl UpstreamFetch) -> Self {
        Self {
            inner: Arc::new(Inner {
                channels: Channels::new(channels, own),
                fetch: Box::new(fetch),
            }),
        }
    }

    fn spec(&self, channel: &str) -> Result<&ChannelSpec, ResolveError> {
        self.inner
            .channels
            .spec(channel)
            .ok_or_else(|| ResolveError::UnknownChannel(channel.to_owned()))
    }

    /// The version `channel` advertises.
    pub async fn version(&self, channel: &str) -> Result<Option<Version>, ResolveError> {
        Ok(self.resolve(channel).await?.version)
    }

    /// Whether `channel`'s update is critical. An upstream that cannot say is not critical.
    pub async fn critical(&self, channel: &str) -> Result<bool, ResolveError> {
        match self.spec(channel)? {
            ChannelSpec::Static { critical, .. } => Ok(*critical),
            ChannelSpec::Forward { url } => Ok(self.forward(channel, url).await.1),
            _ => Err(ResolveError::UnknownChannel(channel.to_owned())),
        }
    }

    /// Both answers.
    pub async fn resolve(&self, channel: &str) -> Result<ChannelAnswer, ResolveError> {
        let channels = &self.inner.channels;
        match self.spec(channel)? {
            ChannelSpec::Static { version, critical } => Ok(ChannelAnswer {
                version: channels.cap(version.clone()),
                critical: *critical,
            }),
            ChannelSpec::Forward { url } => {
                let (version, critical) = self.forward(channel, url).await;
                Ok(ChannelAnswer {
                    version: version?,
                    critical,
                })
            }
            _ => Err(ResolveError::UnknownChannel(channel.to_owned())),
        }
    }

    /// A `forward_url` channel's version and critical flag, always asked together: the
    /// fetcher's cache then holds the two answers from the same moment, so a version and the
    /// critical flag published with it are served together (asked apart, each answer had an
    /// age of its own, and a critical update could be served as the new version with the old
    /// flag, and installed outside the window only a minute later).
    async fn forward(&self, channel: &str, url: &str) -> (Result<Option<Version>, ResolveError>, bool) {
        let (version_url, critical_url) = (format!("{url}/version"), format!("{url}/critical"));
        let fetch = &self.inner.fetch;
        let (version, critical) = tokio::join!(fetch.fetch(&version_url), fetch.fetch(&critical_url));
        let version = version
            .and_then(|b| forward::parse_version_body(&version_url, &b))
            .map(|v| self.inner.channels.cap(v))
            .map_err(|source| ResolveError::Upstream {
                channel: channel.to_owned(),
                source,
            });
        let critical = critical
            .and_then(|b| forward::parse_critical_body(&critical_url, &b))
            .unwrap_or(false);
        (version, critical)
    }
}

impl Service<String> for VersionResolver {
    type Response = ChannelAnswer;
    type Error = ResolveError;
    type Future = Pin<Box<dyn Future<Output = Result<ChannelAnswer, ResolveError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, channel: String) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { this.resolve(&channel).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolver(channels: &[(&str, ChannelSpec)]) -> VersionResolver {
        let tls = crate::tls::client_config(None).unwrap();
        VersionResolver::new(
            channels
                .iter()
                .map(|(n, s)| ((*n).to_owned(), s.clone()))
                .collect(),
            Version::new(17, 2, 0),
            Fetcher::direct(tls),
        )
    }

    fn fixed(v: Option<Version>, critical: bool) -> ChannelSpec {
        ChannelSpec::Static { version: v, critical }
    }

    #[tokio::test]
    async fn default_and_cloud_rules() {
        let r = resolver(&[]);
        assert_eq!(r.version("default").await, Ok(Some(Version::new(17, 2, 0))));
        assert_eq!(r.version("stable/cloud").await, Ok(Some(Version::new(17, 2, 0))));
        assert_eq!(r.critical("default").await, Ok(false));
        assert_eq!(
            r.version("beta").await,
            Err(ResolveError::UnknownChannel("beta".into()))
        );

        let r = resolver(&[("stable/cloud", fixed(Some(Version::new(17, 1, 0)), true))]);
        assert_eq!(r.version("default").await, Ok(Some(Version::new(17, 1, 0))));
        assert_eq!(r.critical("default").await, Ok(true));

        let r = resolver(&[
            ("default", fixed(Some(Version::new(17, 0, 5)), false)),
            ("stable/cloud", fixed(None, false)),
        ]);
        assert_eq!(r.version("default").await, Ok(Some(Version::new(17, 0, 5))));
        assert_eq!(r.version("stable/cloud").await, Ok(None));

        let r = resolver(&[("default", fixed(Some(Version::new(16, 4, 0)), false))]);
        assert_eq!(
            r.version("stable/cloud").await,
            Ok(Some(Version::new(16, 4, 0))),
            "alias of default"
        );
    }

    #[tokio::test]
    async fn major_cap() {
        let r = resolver(&[
            ("ahead", fixed(Some(Version::new(18, 0, 0)), false)),
            ("minor-ahead", fixed(Some(Version::new(17, 9, 0)), false)),
        ]);
        assert_eq!(r.version("ahead").await, Ok(Some(Version::new(17, 2, 0))));
        assert_eq!(r.version("minor-ahead").await, Ok(Some(Version::new(17, 9, 0))));
        let answer = tower::ServiceExt::oneshot(r, "ahead".to_owned()).await.unwrap();
        assert_eq!(
            answer,
            ChannelAnswer {
                version: Some(Version::new(17, 2, 0)),
                critical: false
            }
        );
    }

    /// An upstream whose answers change when the test publishes, behind a cache that keeps each
    /// URL's answer for 60 ticks of the test's clock (as `Fetcher` keeps it for a minute).
    #[derive(Default)]
    struct CachedUpstream {
        now: std::sync::atomic::AtomicU64,
        published: std::sync::Mutex<(String, String)>,
        cached: std::sync::Mutex<BTreeMap<String, (u64, String)>>,
    }

    impl UpstreamFetch for Arc<CachedUpstream> {
        fn fetch<'a>(
            &'a self,
            url: &'a str,
        ) -> Pin<Box<dyn Future<Output = Result<String, FetchError>> + Send + 'a>> {
            let now = self.now.load(std::sync::atomic::Ordering::SeqCst);
            let mut cached = self.cached.lock().unwrap();
            let fresh = cached.get(url).filter(|(at, _)| now - at < 60).cloned();
            let body = match fresh {
                Some((_, body)) => body,
                None => {
                    let (version, critical) = self.published.lock().unwrap().clone();
                    let body = if url.ends_with("/version") {
                        version
                    } else {
                        critical
                    };
                    cached.insert(url.to_owned(), (now, body.clone()));
                    body
                }
            };
            Box::pin(async move { Ok(body) })
        }
    }

    #[tokio::test]
    async fn a_forwarded_version_and_its_critical_flag_are_served_from_the_same_moment() {
        let upstream = Arc::new(CachedUpstream::default());
        let at = |t: u64| upstream.now.store(t, std::sync::atomic::Ordering::SeqCst);
        *upstream.published.lock().unwrap() = ("v17.1.0".into(), "no".into());
        let r = VersionResolver::new(
            [(
                "default".to_owned(),
                ChannelSpec::Forward {
                    url: "https://versions.example/ch".into(),
                },
            )]
            .into(),
            Version::new(17, 2, 0),
            upstream.clone(),
        );
        // Updaters ask for the version at one moment and for the flag at another.
        assert_eq!(r.version("default").await, Ok(Some(Version::new(17, 1, 0))));
        at(30);
        assert_eq!(r.critical("default").await, Ok(false));
        // A critical update is published, and the cache's first answers expire.
        at(40);
        *upstream.published.lock().unwrap() = ("v17.1.1".into(), "yes".into());
        at(65);
        // Asked apart, the flag cached at 30 would still say "no" next to the new version.
        for answer in [
            r.resolve("default").await.unwrap(),
            ChannelAnswer {
                version: r.version("default").await.unwrap(),
                critical: r.critical("default").await.unwrap(),
            },
        ] {
            assert_eq!(
                answer,
                ChannelAnswer {
                    version: Some(Version::new(17, 1, 1)),
                    critical: true,
                }
            );
        }
    }
}
