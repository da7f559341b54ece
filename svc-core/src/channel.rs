//! Version channels, as configured under `proxy_service.automatic_upgrades_channels`.
//!
//! A channel either serves a static version (optionally flagged critical) or forwards to an
//! upstream version server. This module holds the validated definition; serving it is
//! `svc_net::web::version`'s job.

use serde::Deserialize;

use crate::Version;

/// The channel that always exists (specification §2.6 rule 1).
pub const DEFAULT_CHANNEL: &str = "default";
/// The cloud channel name (specification §2.6 rule 4); an alias of `default` unless configured.
pub const CLOUD_CHANNEL: &str = "stable/cloud";

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

/// A channel as written in the configuration file, before validation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawChannel {
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
    pub fn validate(&self) -> Result<ChannelSpec, ChannelError> {
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
pub fn validate_channel_name(name: &str) -> Result<(), ChannelError> {
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
}
