//! The version server: which version each channel advertises, and whether it is critical.
//!
//! Sits behind the proxy's web API (`GET /v1/webapi/automaticupgrades/channel/<channel>/…`,
//! served by [`http`]); agents' updaters ask it. [`VersionResolver`] holds the configured
//! channels (`proxy_service.automatic_upgrades_channels`) and answers `channel → {version,
//! critical}`:
//! - `default` always exists: the configured `default`, else a configured `stable/cloud`, else
//!   a static channel serving the proxy's own version; an unconfigured `stable/cloud` is an
//!   alias of `default`;
//! - static channels answer from configuration (`none` allowed); `forward_url` channels ask an
//!   upstream through [`forward::Fetcher`] (10 s timeout, one-minute cache of results and
//!   errors);
//! - a target with a higher major version than the proxy is replaced by the proxy's own version:
//!   agents must never be ahead of the cluster.

pub mod forward;
pub mod http;

use std::{
    collections::BTreeMap,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use ::http::Uri;
use svc_core::{
    Version,
    channel::{CLOUD_CHANNEL, ChannelSpec, DEFAULT_CHANNEL},
};
use tower::Service;

pub use forward::{FetchError, Fetcher};

use tower::BoxError;

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

struct Inner<C> {
    channels: BTreeMap<String, ChannelSpec>,
    own: Version,
    fetcher: Fetcher<C>,
}

/// Resolves channel names to answers: a `tower::Service<String>`.
pub struct VersionResolver<C = hyper_util::client::legacy::connect::HttpConnector> {
    inner: Arc<Inner<C>>,
}

impl<C> Clone for VersionResolver<C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<C> VersionResolver<C>
where
    C: Service<Uri> + Clone + Send + Sync + 'static,
    C::Response: hyper::rt::Read + hyper::rt::Write + Send + Unpin + 'static,
    C::Error: Into<BoxError>,
    C::Future: Send,
{
    /// A resolver for the configured `channels`, for a proxy at version `own`.
    pub fn new(mut channels: BTreeMap<String, ChannelSpec>, own: Version, fetcher: Fetcher<C>) -> Self {
        if !channels.contains_key(DEFAULT_CHANNEL) {
            let default = channels
                .get(CLOUD_CHANNEL)
                .cloned()
                .unwrap_or(ChannelSpec::Static {
                    version: Some(own.clone()),
                    critical: false,
                });
            channels.insert(DEFAULT_CHANNEL.to_owned(), default);
        }
        Self {
            inner: Arc::new(Inner {
                channels,
                own,
                fetcher,
            }),
        }
    }

    fn spec(&self, channel: &str) -> Result<&ChannelSpec, ResolveError> {
        let channels = &self.inner.channels;
        channels
            .get(channel)
            .or_else(|| {
                (channel == CLOUD_CHANNEL)
                    .then(|| channels.get(DEFAULT_CHANNEL))
                    .flatten()
            })
            .ok_or_else(|| ResolveError::UnknownChannel(channel.to_owned()))
    }

    /// Agents must never be ahead of the cluster: a higher major becomes the proxy's version.
    fn cap(&self, version: Option<Version>) -> Option<Version> {
        version.map(|v| {
            if v.major() > self.inner.own.major() {
                self.inner.own.clone()
            } else {
                v
            }
        })
    }

    /// The version `channel` advertises.
    pub async fn version(&self, channel: &str) -> Result<Option<Version>, ResolveError> {
        match self.spec(channel)? {
            ChannelSpec::Static { version, .. } => Ok(self.cap(version.clone())),
            ChannelSpec::Forward { url } => {
                let url = format!("{url}/version");
                let body = self.inner.fetcher.get(&url).await;
                let parsed = body.and_then(|b| forward::parse_version_body(&url, &b));
                parsed
                    .map(|v| self.cap(v))
                    .map_err(|source| ResolveError::Upstream {
                        channel: channel.to_owned(),
                        source,
                    })
            }
            _ => Err(ResolveError::UnknownChannel(channel.to_owned())),
        }
    }

    /// Whether `channel`'s update is critical. An upstream that cannot say is not critical.
    pub async fn critical(&self, channel: &str) -> Result<bool, ResolveError> {
        match self.spec(channel)? {
            ChannelSpec::Static { critical, .. } => Ok(*critical),
            ChannelSpec::Forward { url } => {
                let url = format!("{url}/critical");
                let body = self.inner.fetcher.get(&url).await;
                Ok(body
                    .and_then(|b| forward::parse_critical_body(&url, &b))
                    .unwrap_or(false))
            }
            _ => Err(ResolveError::UnknownChannel(channel.to_owned())),
        }
    }

    /// Both answers.
    pub async fn resolve(&self, channel: &str) -> Result<ChannelAnswer, ResolveError> {
        let (version, critical) = tokio::join!(self.version(channel), self.critical(channel));
        Ok(ChannelAnswer {
            version: version?,
            critical: critical?,
        })
    }
}

impl<C> Service<String> for VersionResolver<C>
where
    C: Service<Uri> + Clone + Send + Sync + 'static,
    C::Response: hyper::rt::Read + hyper::rt::Write + Send + Unpin + 'static,
    C::Error: Into<BoxError>,
    C::Future: Send,
{
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
}
