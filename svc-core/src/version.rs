//! Versions: parsing, ordering, display, and the cluster's compatibility rules.
//!
//! A [`Version`] is a semantic version that may be written with or without a leading `v`
//! (`v1.2.3`, `1.2.3`, `17.0.0-dev`, `v15.1.3-rc.1`) and is always displayed with one. Ordering
//! is semver precedence: a pre-release sorts below its release (`17.0.0-dev < 17.0.0`).
//!
//! The rules the rest of the project enforces live here as plain functions:
//! - an agent may be at most one major version behind the cluster and never ahead
//!   ([`Version::agent_compatibility`], specification §1 rule 4 and §9.4);
//! - automatic updates need agents at v14.3.7 / v15.1.3 or later ([`Version::supports_automatic_updates`],
//!   specification §8);
//! - `tctl` and `tsh` must be at least 17.0.0-dev ([`min_client_version`], specification §5.6).

use std::{cmp::Ordering, fmt, str::FromStr, sync::OnceLock};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A semantic version, written `v<major>.<minor>.<patch>[-<pre-release>][+<build>]`.
///
/// Parsing accepts an optional leading `v`; [`Display`](fmt::Display) always writes one.
/// Equality and ordering follow semver precedence, with build metadata as the last tie-breaker
/// so that the order is total and consistent with `Eq`.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Version(semver::Version);

/// Why a string is not a [`Version`]. The message quotes the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VersionError {
    /// The input was empty (or only a `v`).
    #[error("invalid version \"{input}\": empty")]
    Empty {
        /// The rejected input, as given.
        input: String,
    },
    /// The input contained white space.
    #[error("invalid version \"{input}\": white space is not allowed")]
    Whitespace {
        /// The rejected input, as given.
        input: String,
    },
    /// The input is not of the form `v<major>.<minor>.<patch>[-pre][+build]`.
    #[error("invalid version \"{input}\": expected v<major>.<minor>.<patch>, for example v17.0.0 ({reason})")]
    Syntax {
        /// The rejected input, as given.
        input: String,
        /// What the semver parser objected to.
        reason: String,
    },
}

impl Version {
    /// Builds a release version `v<major>.<minor>.<patch>`.
    pub const fn new(major: u64, minor: u64, patch: u64) -> Self {
        Self(semver::Version::new(major, minor, patch))
    }

    /// Parses `v1.2.3`, `1.2.3`, `17.0.0-dev` or `v15.1.3-rc.1`.
    ///
    /// Rejects empty strings, white space anywhere, and anything that is not a full
    /// `major.minor.patch` triple (`1.2`, `..`, `one/two`).
    pub fn parse(input: &str) -> Result<Self, VersionError> {
        if input.chars().any(char::is_whitespace) {
            return Err(VersionError::Whitespace {
                input: input.to_owned(),
            });
        }
        let bare = input.strip_prefix('v').unwrap_or(input);
        if bare.is_empty() {
            return Err(VersionError::Empty {
                input: input.to_owned(),
            });
        }
        semver::Version::parse(bare)
            .map(Self)
            .map_err(|e| VersionError::Syntax {
                input: input.to_owned(),
                reason: e.to_string(),
            })
    }

    /// The major version.
    pub fn major(&self) -> u64 {
        self.0.major
    }

    /// The minor version.
    pub fn minor(&self) -> u64 {
        self.0.minor
    }

    /// The patch version.
    pub fn patch(&self) -> u64 {
        self.0.patch
    }

    /// The pre-release part (`dev` in `17.0.0-dev`), empty for a release.
    pub fn pre_release(&self) -> &str {
        self.0.pre.as_str()
    }

    /// Whether this is a pre-release (`17.0.0-dev`, `15.1.3-rc.1`).
    pub fn is_pre_release(&self) -> bool {
        !self.0.pre.is_empty()
    }

    /// The version without its leading `v`, as package managers and image tags want it
    /// (`17.0.0-dev`). The specification's procedures "strip the leading v" with this.
    pub fn without_v(&self) -> String {
        self.0.to_string()
    }

    /// Whether an agent at `self` may connect to a cluster at `cluster`.
    ///
    /// The rule (specification §1.4, §9.4): an agent may be at most one major version behind
    /// the cluster and never ahead of it.
    pub fn agent_compatibility(&self, cluster: &Version) -> Compatibility {
        let (agent, cluster_major) = (self.major(), cluster.major());
        if agent > cluster_major {
            Compatibility::AgentAhead
        } else if agent + 1 < cluster_major {
            Compatibility::AgentTooOld
        } else {
            Compatibility::Compatible
        }
    }

    /// Whether an agent at this version can be enrolled in automatic updates.
    ///
    /// Specification §8: automatic upgrades in a self-hosted cluster need v14.3.7 or v15.1.3 or
    /// later. That reads as: within major 14, at least 14.3.7; within major 15, at least 15.1.3;
    /// every later major; no earlier major.
    pub fn supports_automatic_updates(&self) -> bool {
        match self.major() {
            0..=13 => false,
            14 => *self >= Version::new(14, 3, 7),
            15 => *self >= Version::new(15, 1, 3),
            _ => true,
        }
    }
}

/// The outcome of [`Version::agent_compatibility`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Compatibility {
    /// Same major, or one major behind.
    Compatible,
    /// The agent's major version is newer than the cluster's.
    AgentAhead,
    /// The agent is more than one major version behind the cluster.
    AgentTooOld,
}

impl Compatibility {
    /// Whether the agent may connect.
    pub fn is_compatible(self) -> bool {
        self == Compatibility::Compatible
    }
}

/// The version this build was stamped with: `SVC_BUILD_VERSION` at compile time when set (release
/// and package builds stamp the package version this way), else the workspace version.
const BUILD_VERSION: &str = match option_env!("SVC_BUILD_VERSION") {
    Some(v) => v,
    None => env!("CARGO_PKG_VERSION"),
};

/// The version of this build of svc (the workspace version, `v17.0.0-dev` at the start of the
/// 17 line, unless the build was stamped with `SVC_BUILD_VERSION`).
pub fn current() -> &'static Version {
    static CURRENT: OnceLock<Version> = OnceLock::new();
    CURRENT.get_or_init(|| match Version::parse(BUILD_VERSION) {
        Ok(v) => v,
        // A compile-time constant checked by a unit test; a build stamped with an invalid
        // version cannot pass CI, and fails loudly at start-up rather than misreport itself.
        Err(e) => panic!("this build's version is not a valid version: {e}"),
    })
}

/// This build's version as `--version` prints it (`v17.0.0-dev`): the same text as
/// [`current`]'s.
pub fn display() -> &'static str {
    static TEXT: OnceLock<String> = OnceLock::new();
    TEXT.get_or_init(|| current().to_string())
}

/// A client (`tsh`) older than the cluster's `min_client_version` (from the proxy's ping).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "this client is {client}, older than the oldest client version the cluster accepts ({min_client}; \
     the proxy runs {server}): install a client of version {min_client} or later"
)]
pub struct ClientTooOld {
    /// This client's version.
    pub client: Version,
    /// The cluster's `min_client_version`.
    pub min_client: Version,
    /// The proxy's `server_version`.
    pub server: Version,
}

/// Whether a client of version `client` may talk to a proxy running `server` that accepts
/// clients from `min_client` on: an error naming both versions when `client` is older than
/// `min_client`; otherwise a warning to show when the cluster is a major version ahead (the
/// client may lack what the cluster expects), else `None`.
pub fn check_client(
    client: &Version,
    server: &Version,
    min_client: &Version,
) -> Result<Option<String>, ClientTooOld> {
    if client < min_client {
        return Err(ClientTooOld {
            client: client.clone(),
            min_client: min_client.clone(),
            server: server.clone(),
        });
    }
    Ok((server.major() > client.major()).then(|| {
        format!(
            "the cluster runs {server}, a newer major version than this client ({client}); \
             upgrade the client to {}.x to use every feature of the cluster",
            server.major()
        )
    }))
}

/// The oldest `tsh` / `tctl` the procedures in the specification work with (§5.6): 17.0.0-dev.
pub fn min_client_version() -> Version {
    // A constant of known shape; `Version::parse` cannot fail on it (tested).
    Version(semver::Version {
        major: 17,
        minor: 0,
        patch: 0,
        pre: semver::Prerelease::new("dev").unwrap_or(semver::Prerelease::EMPTY),
        build: semver::BuildMetadata::EMPTY,
    })
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

impl fmt::Debug for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Version(v{})", self.0)
    }
}

impl FromStr for Version {
    type Err = VersionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.cmp(&other.0)
    }
}

impl Serialize for Version {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Version {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        Version::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn v(s: &str) -> Version {
        Version::parse(s).unwrap()
    }

    #[test]
    fn a_client_older_than_min_client_version_is_refused_naming_both_versions() {
        let e = check_client(&v("16.4.0"), &v("17.1.0"), &v("17.0.0-dev")).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("v16.4.0") && text.contains("v17.0.0-dev") && text.contains("v17.1.0"),
            "{text}"
        );
        assert_eq!(
            check_client(&v("17.0.0-dev"), &v("17.1.0"), &v("17.0.0-dev")),
            Ok(None)
        );
        let warning = check_client(&v("17.2.0"), &v("18.0.0"), &v("17.0.0-dev"))
            .unwrap()
            .expect("a major version ahead warns");
        assert!(
            warning.contains("v18.0.0") && warning.contains("v17.2.0"),
            "{warning}"
        );
        assert_eq!(display(), current().to_string());
    }

    #[test]
    fn parses_the_forms_the_specification_uses() {
        assert_eq!(v("v1.2.3"), Version::new(1, 2, 3));
        assert_eq!(v("1.2.3"), Version::new(1, 2, 3));
        assert_eq!(v("17.0.0-dev").pre_release(), "dev");
        assert_eq!(v("v15.1.3-rc.1").pre_release(), "rc.1");
        assert_eq!(v("v15.1.3-rc.1").to_string(), "v15.1.3-rc.1");
        assert_eq!(v("1.2.3").to_string(), "v1.2.3");
        assert_eq!(v("v1.2.3").without_v(), "1.2.3");
    }

    #[test]
    fn rejects_malformed_input_quoting_it() {
        for bad in [
            "", "v", "..", "one/two", "1.2", "1.2.3 ", " 1.2.3", "1. 2.3", "1.2.3\n", "vv1.2.3", "1.2.3.4",
            "x1.2.3",
        ] {
            let err = Version::parse(bad).unwrap_err();
            assert!(err.to_string().contains(&format!("\"{bad}\"")), "{bad:?}: {err}");
        }
        assert!(matches!(
            Version::parse("").unwrap_err(),
            VersionError::Empty { .. }
        ));
        assert!(matches!(
            Version::parse("1 .2.3").unwrap_err(),
            VersionError::Whitespace { .. }
        ));
    }

    #[test]
    fn pre_release_sorts_below_release() {
        assert!(v("17.0.0-dev") < v("17.0.0"));
        assert!(v("15.1.3-rc.1") < v("15.1.3-rc.2"));
        assert!(v("15.1.3-rc.2") < v("15.1.3"));
        assert!(v("14.3.7") < v("15.0.0-dev"));
        assert!(v("v1.10.0") > v("v1.9.9"));
    }

    #[test]
    fn agent_compatibility_rule() {
        let cluster = v("17.2.0");
        assert_eq!(
            v("17.0.0").agent_compatibility(&cluster),
            Compatibility::Compatible
        );
        assert_eq!(
            v("16.4.1").agent_compatibility(&cluster),
            Compatibility::Compatible
        );
        assert_eq!(
            v("17.9.9").agent_compatibility(&cluster),
            Compatibility::Compatible
        );
        assert_eq!(
            v("15.4.1").agent_compatibility(&cluster),
            Compatibility::AgentTooOld
        );
        assert_eq!(
            v("18.0.0-dev").agent_compatibility(&cluster),
            Compatibility::AgentAhead
        );
        assert!(!Compatibility::AgentAhead.is_compatible());
    }

    #[test]
    fn automatic_update_minimums_from_the_specification() {
        assert!(!v("13.9.9").supports_automatic_updates());
        assert!(!v("14.3.6").supports_automatic_updates());
        assert!(v("14.3.7").supports_automatic_updates());
        assert!(v("14.4.0").supports_automatic_updates());
        assert!(!v("15.1.2").supports_automatic_updates());
        assert!(!v("15.1.3-rc.1").supports_automatic_updates());
        assert!(v("15.1.3").supports_automatic_updates());
        assert!(v("16.0.0").supports_automatic_updates());
        assert!(current().supports_automatic_updates());
    }

    #[test]
    fn product_version_and_client_minimum() {
        assert_eq!(
            current().to_string(),
            format!("v{}", BUILD_VERSION.trim_start_matches('v'))
        );
        assert_eq!(min_client_version(), v("17.0.0-dev"));
        assert!(
            *current() >= min_client_version(),
            "this build must satisfy its own client minimum"
        );
        assert!(v("16.4.0") < min_client_version());
    }

    #[test]
    fn serde_round_trip() {
        let json = serde_json::to_string(&v("1.2.3-rc.1")).unwrap();
        assert_eq!(json, "\"v1.2.3-rc.1\"");
        assert_eq!(serde_json::from_str::<Version>(&json).unwrap(), v("1.2.3-rc.1"));
        assert!(
            serde_json::from_str::<Version>("\"1.2\"")
                .unwrap_err()
                .to_string()
                .contains("\"1.2\"")
        );
    }

    fn arb_version() -> impl Strategy<Value = Version> {
        let pre = prop_oneof![
            Just(String::new()),
            "[a-z][a-z0-9]{0,5}",
            "[a-z]{1,4}\\.[1-9][0-9]{0,2}",
        ];
        (0u64..40, 0u64..40, 0u64..40, pre).prop_map(|(a, b, c, pre)| {
            let s = if pre.is_empty() {
                format!("{a}.{b}.{c}")
            } else {
                format!("{a}.{b}.{c}-{pre}")
            };
            Version::parse(&s).unwrap()
        })
    }

    proptest! {
        #[test]
        fn display_parse_round_trip(ver in arb_version()) {
            let shown = ver.to_string();
            prop_assert!(shown.starts_with('v'));
            prop_assert_eq!(Version::parse(&shown).unwrap(), ver.clone());
            prop_assert_eq!(Version::parse(&ver.without_v()).unwrap(), ver);
        }

        #[test]
        fn ordering_is_total_and_consistent(a in arb_version(), b in arb_version(), c in arb_version()) {
            // Antisymmetry and consistency with Eq.
            prop_assert_eq!(a.cmp(&b), b.cmp(&a).reverse());
            prop_assert_eq!(a.cmp(&b) == Ordering::Equal, a == b);
            // Transitivity.
            if a <= b && b <= c {
                prop_assert!(a <= c);
            }
        }

        #[test]
        fn arbitrary_strings_never_panic(s in "\\PC{0,24}") {
            let _ = Version::parse(&s);
        }
    }
}
