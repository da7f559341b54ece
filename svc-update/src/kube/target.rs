//! Where the Kubernetes updater learns its target: the channel's `version` and `critical`
//! endpoints.
//!
//! Sits at the start of a reconcile: [`TargetSource::fetch`] → [`Target`] →
//! [`super::decision::decide`]. The HTTP implementation is the updaters' shared
//! [`VersionClient`] (the Linux updater uses the same one), over any connector — svc's
//! environment-aware `ProxyDialer` in the binary. The trait exists so tests and embedding
//! products can supply targets another way.

use std::{future::Future, pin::Pin};

pub use crate::target::{CHANNEL_PATH_PREFIX, Target, TargetError, VersionClient};

/// A source of the channel's target.
pub trait TargetSource: Send + Sync + 'static {
    /// Fetches the target version and whether it is critical.
    fn fetch(&self) -> Pin<Box<dyn Future<Output = Result<Target, TargetError>> + Send + '_>>;
}

impl<C> TargetSource for VersionClient<C>
where
    C: svc_net::http::Connector,
{
    fn fetch(&self) -> Pin<Box<dyn Future<Output = Result<Target, TargetError>> + Send + '_>> {
        Box::pin(self.target())
    }
}

/// The base URL of a channel on a version server given as a URL (the updater's
/// `--version-server` flag): `<server>/v1/webapi/automaticupgrades/channel/<channel>` (§4.2).
/// A trailing `/` on the server is ignored; the channel may contain `/` (`stable/cloud`).
pub fn channel_base_url(server: &str, channel: &str) -> String {
    format!(
        "{}{CHANNEL_PATH_PREFIX}{}",
        server.trim_end_matches('/'),
        channel.trim_matches('/')
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls() {
        assert_eq!(
            channel_base_url("https://proxy.example.com:443/", "stable/cloud"),
            "https://proxy.example.com:443/v1/webapi/automaticupgrades/channel/stable/cloud"
        );
        assert_eq!(
            channel_base_url("http://127.0.0.1:1", "/default/"),
            "http://127.0.0.1:1/v1/webapi/automaticupgrades/channel/default"
        );
    }
}
