//! Package version strings: how a [`Version`] is written in `.deb` and `.rpm` metadata and on
//! the package managers' command lines, and back.
//!
//! Sits between the version the updater decided on (a [`Version`]) and the package manager
//! commands in [`pkg`](super::pkg). `deploy/packaging/build-packages.sh` applies the same
//! mapping when it builds the packages (`build-packages.sh package-version <v>`); a test checks
//! the two agree.
//!
//! A semver pre-release sorts *before* its release (`17.0.0-dev < 17.0.0`). dpkg and rpm (4.10
//! and later) give `~` that meaning, and neither accepts `-` inside an upstream version (dpkg
//! reads the last `-` as the start of a Debian revision, rpm forbids it), so the one `-` that
//! starts the pre-release becomes `~`: `17.0.0-dev` ↔ `17.0.0~dev`. Build metadata (`+build`)
//! is kept as is; both formats accept `+`.

use svc_core::{Version, VersionError};

/// Why a version cannot be written as a package version, or a package version read back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PackageVersionError {
    /// The pre-release or build part contains `-`, which neither dpkg nor rpm accept inside an
    /// upstream version.
    #[error(
        "version {version} cannot be packaged: expected no \"-\" after the one that starts the \
         pre-release (dpkg and rpm forbid it), found \"{version_without_v}\""
    )]
    HyphenInPreRelease {
        /// The version, as displayed.
        version: String,
        /// The version without its leading `v`.
        version_without_v: String,
    },
    /// A package version (from dpkg or rpm) that does not map back to a [`Version`].
    #[error("package version \"{package_version}\" is not an svc version: {source}")]
    NotAVersion {
        /// The package version as the package manager reported it.
        package_version: String,
        /// Why the mapped string is not a version.
        source: VersionError,
    },
}

/// The package version of `version`: `v17.0.0-dev` → `17.0.0~dev`, `v17.1.2` → `17.1.2`.
///
/// The same string is used for `.deb` and `.rpm` packages and on the `apt-get`, `dnf`/`yum` and
/// `zypper` command lines.
pub fn to_package_version(version: &Version) -> Result<String, PackageVersionError> {
    let bare = version.without_v();
    let mapped = bare.replacen('-', "~", 1);
    if mapped.contains('-') {
        return Err(PackageVersionError::HyphenInPreRelease {
            version: version.to_string(),
            version_without_v: bare,
        });
    }
    Ok(mapped)
}

/// The [`Version`] of a package version string: `17.0.0~dev` → `v17.0.0-dev`.
///
/// Accepts exactly what [`to_package_version`] produces (the inverse mapping); surrounding white
/// space, such as the newline of a query's output, is ignored.
pub fn from_package_version(package_version: &str) -> Result<Version, PackageVersionError> {
    let trimmed = package_version.trim();
    Version::parse(&trimmed.replacen('~', "-", 1)).map_err(|source| PackageVersionError::NotAVersion {
        package_version: trimmed.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        Version::parse(s).expect("valid version")
    }

    #[test]
    fn pre_release_hyphen_becomes_tilde_and_back() {
        for (version, package) in [
            ("v17.0.0-dev", "17.0.0~dev"),
            ("17.0.0", "17.0.0"),
            ("v15.1.3-rc.1", "15.1.3~rc.1"),
            ("v16.2.0-alpha.2+build.5", "16.2.0~alpha.2+build.5"),
            ("v14.3.7+linux", "14.3.7+linux"),
        ] {
            assert_eq!(
                to_package_version(&v(version)).expect("maps"),
                package,
                "{version}"
            );
            assert_eq!(
                from_package_version(package).expect("maps back"),
                v(version),
                "{package}"
            );
        }
    }

    #[test]
    fn hyphen_inside_pre_release_is_refused() {
        let err = to_package_version(&v("17.0.0-dev-1")).expect_err("two hyphens");
        assert_eq!(
            err.to_string(),
            "version v17.0.0-dev-1 cannot be packaged: expected no \"-\" after the one that starts \
             the pre-release (dpkg and rpm forbid it), found \"17.0.0-dev-1\""
        );
    }

    #[test]
    fn query_output_is_trimmed_and_junk_refused() {
        assert_eq!(
            from_package_version("17.0.0~dev\n").expect("trimmed"),
            v("17.0.0-dev")
        );
        let err = from_package_version("1:17.0.0-1").expect_err("epoch and revision");
        assert!(
            err.to_string()
                .starts_with("package version \"1:17.0.0-1\" is not an svc version")
        );
        assert!(from_package_version("").is_err());
    }

    proptest::proptest! {
        #[test]
        fn mapping_round_trips(major in 0u64..100, minor in 0u64..100, patch in 0u64..100,
                               pre in proptest::option::of("[a-z][a-z0-9]{0,6}(\\.[1-9][0-9]{0,2})?")) {
            let text = match &pre { Some(p) => format!("{major}.{minor}.{patch}-{p}"), None => format!("{major}.{minor}.{patch}") };
            let version = v(&text);
            let package = to_package_version(&version).expect("maps");
            proptest::prop_assert!(!package.contains('-'));
            proptest::prop_assert_eq!(from_package_version(&package).expect("maps back"), version);
        }
    }
}
