//! Version channels, as configured under `proxy_service.automatic_upgrades_channels`.
//!
//! A channel either serves a static version (optionally flagged critical) or forwards to an
//! upstream version server. This module holds the validated definition and the pure rules of
//! the version server ([`Channels`]: which channels exist, which answer a channel gives);
//! fetching from upstreams and serving HTTP is `svc_net::proxy::web::version`'s job.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::Version;

/// The channel that always exists (specification §2.6 rule 1).
pub const DEFAULT_CHANNEL: &str = "default";
/// The cloud channel name (specification §2.6 rule 4); an alias of `default` unless configured.
pub const CLOUD_CHANNEL: &str = "stable/cloud";

/// The path under which a channel's answers live on the proxy's web address
/// (`<prefix><channel>/version`, `<prefix><channel>/critical`): what updaters ask and what the
/// version server serves.
pub const CHANNEL_PATH_PREFIX: &str = "/v1/webapi/automaticupgrades/channel/";

/// A validated channel definition.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChannelSpec {
    /// Serves a fixed answer.
    Static {
        /// The version served; `None` is the literal `none` (the channel advertises no version).
        version: Option<Version>,
        /// Whether the update is critical (installed outside the maintenance window).
        critical: bool,
    },
    /// Forwards `version` and `critical` requests to an upstream version server.
    Forward {
        /// The upstream base URL; `<url>/version` and `<url>/critical` are fetched.
        url: String,
    },
}

/// The channels a proxy serves, with the rules of the specification (§2.6) applied:
///
/// - `default` always exists: the configured `default`, else a configured `stable/cloud`, else a
///   static channel serving the proxy's own version;
/// - an unconfigured `stable/cloud` is an alias of `default`;
/// - a target with a higher major version than the proxy is replaced by the proxy's own version:
///   agents must never be ahead of the cluster.
///
/// Pure: forwarding channels are answered by whoever fetches the upstream (see
/// [`Channels::spec`]), then passed through [`Channels::cap`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Channels {
    channels: BTreeMap<String, ChannelSpec>,
    own: Version,
}

impl Channels {
    /// The configured `channels` of a proxy at version `own`, `default` added when missing.
    pub fn new(mut channels: BTreeMap<String, ChannelSpec>, own: Version) -> Self {
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
        Channels { channels, own }
    }

    /// The definition serving `channel` (`stable/cloud` falls back to `default`); `None` for a
    /// channel that does not exist.
    pub fn spec(&self, channel: &str) -> Option<&ChannelSpec> {
        self.channels.get(channel).or_else(|| {
            (channel == CLOUD_CHANNEL)
                .then(|| self.channels.get(DEFAULT_CHANNEL))
                .flatten()
        })
    }

    /// The version agents are told: `version`, or the proxy's own when `version` is of a
    /// higher major.
    pub fn cap(&self, version: Option<Version>) -> Option<Version> {
        version.map(|v| {
            if v.major() > self.own.major() {
                self.own.clone()
            } else {
                v
            }
        })
    }

    /// The proxy's own version.
    pub fn own(&self) -> &Version {
        &self.own
    }
}

/// A channel as written in the configuration file, before validation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawChannel {
    /// `v<major>.<minor>.<patch>` or `none`.
    #[serde(default)]
    pub static_version: Option<String>,
    /// Only with `static_version`.
    #[serde(default)]
    pub critical: Option<bool>,
    /// An upstream version server; excludes `static_version` and `critical`.
    #[serde(default)]
    pub forward_url: Option<String>,
}

/// Why a channel definition is invalid. Messages name the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChannelError {
    /// `forward_url` with `static_version` or `critical`.
    #[error(
        "forward_url cannot be combined with static_version or critical: a channel either forwards or serves a static version"
    )]
    ForwardWithStatic,
    /// Neither `forward_url` nor `static_version`.
    #[error("a channel needs either static_version (v<major>.<minor>.<patch> or none) or forward_url")]
    Empty,
    /// `static_version` is not a version.
    #[error("static_version: {0}")]
    Version(#[from] crate::VersionError),
    /// `forward_url` is not an http(s) URL.
    #[error("forward_url: expected an http:// or https:// URL, got \"{0}\"")]
    Url(String),
    /// The channel name is empty or malformed.
    #[error(
        "invalid channel name \"{0}\": expected non-empty segments of letters, digits, '-', '_' and '.', separated by '/'"
    )]
    Name(String),
}

impl RawChannel {
    /// Validates the definition.
    pub(crate) fn validate(&self) -> Result<ChannelSpec, ChannelError> {
        match (&self.forward_url, &self.static_version) {
            (Some(_), Some(_)) => Err(ChannelError::ForwardWithStatic),
            (Some(_), None) if self.critical.is_some() => Err(ChannelError::ForwardWithStatic),
            (Some(url), None) => {
                let ok = (url.starts_with("http://") || url.starts_with("https://"))
                    && !url.chars().any(char::is_whitespace)
                    && url.split_once("://").is_some_and(|(_, rest)| !rest.is_empty());
                if ok {
                    Ok(ChannelSpec::Forward {
                        url: url.trim_end_matches('/').to_owned(),
                    })
                } else {
                    Err(ChannelError::Url(url.clone()))
                }
            }
            (None, Some(v)) => {
                let version = if v == "none" {
                    None
                } else {
                    Some(Version::parse(v)?)
                };
                Ok(ChannelSpec::Static {
                    version,
                    critical: self.critical.unwrap_or(false),
                })
            }
            (None, None) => Err(ChannelError::Empty),
        }
    }
}

/// Checks a channel name: one or more `/`-separated segments of `[A-Za-z0-9._-]`.
pub(crate) fn validate_channel_name(name: &str) -> Result<(), ChannelError> {
    let ok = !name.is_empty()
        && name.split('/').all(|seg| {
            !seg.is_empty()
                && seg != "."
                && seg != ".."
                && seg
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        });
    if ok {
        Ok(())
    } else {
        Err(ChannelError::Name(name.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(yaml: &str) -> RawChannel {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    #[test]
    fn static_forward_and_none() {
        assert_eq!(
            raw("static_version: v17.1.0\ncritical: true").validate().unwrap(),
            ChannelSpec::Static {
                version: Some(Version::new(17, 1, 0)),
                critical: true
            }
        );
        assert_eq!(
            raw("static_version: none").validate().unwrap(),
            ChannelSpec::Static {
                version: None,
                critical: false
            }
        );
        assert_eq!(
            raw("forward_url: https://updates.example.com/v1/webapi/automaticupgrades/channel/stable/cloud/")
                .validate()
                .unwrap(),
            ChannelSpec::Forward {
                url: "https://updates.example.com/v1/webapi/automaticupgrades/channel/stable/cloud".into()
            }
        );
    }

    #[test]
    fn invalid_definitions() {
        assert_eq!(
            raw("static_version: v1.0.0\nforward_url: http://x").validate(),
            Err(ChannelError::ForwardWithStatic)
        );
        assert_eq!(
            raw("critical: true\nforward_url: http://x").validate(),
            Err(ChannelError::ForwardWithStatic)
        );
        assert_eq!(raw("{}").validate(), Err(ChannelError::Empty));
        assert!(matches!(
            raw("static_version: '1.2'").validate(),
            Err(ChannelError::Version(_))
        ));
        assert!(matches!(
            raw("forward_url: ftp://x").validate(),
            Err(ChannelError::Url(_))
        ));
        assert!(serde_yaml_ng::from_str::<RawChannel>("static_versoin: v1.0.0").is_err());
    }

    #[test]
    fn channel_names() {
        for ok in ["default", "stable/cloud", "m-1.2_x"] {
            validate_channel_name(ok).unwrap();
        }
        for bad in ["", "/", "a//b", "a/", "../x", "a b", "a/./b"] {
            assert!(validate_channel_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn default_always_exists_cloud_aliases_it_and_majors_are_capped() {
        let own = Version::new(17, 2, 0);
        let none = Channels::new(BTreeMap::new(), own.clone());
        assert_eq!(
            none.spec(DEFAULT_CHANNEL),
            Some(&ChannelSpec::Static {
                version: Some(own.clone()),
                critical: false
            })
        );
        assert_eq!(none.spec(CLOUD_CHANNEL), none.spec(DEFAULT_CHANNEL));
        assert_eq!(none.spec("stable/rolling"), None);

        let cloud = ChannelSpec::Forward {
            url: "https://updates.example.com/v1/stable/cloud".into(),
        };
        let with_cloud = Channels::new([(CLOUD_CHANNEL.to_owned(), cloud.clone())].into(), own.clone());
        assert_eq!(with_cloud.spec(DEFAULT_CHANNEL), Some(&cloud));

        assert_eq!(none.cap(Some(Version::new(18, 0, 0))), Some(own.clone()));
        assert_eq!(
            none.cap(Some(Version::new(17, 9, 1))),
            Some(Version::new(17, 9, 1))
        );
        assert_eq!(none.cap(None), None);
    }
}
