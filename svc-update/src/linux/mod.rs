//! The Linux updater's packaging side: the configuration directory `/etc/svc-upgrade.d/`, the
//! package version mapping, and the package managers that install and hold the agent package.
//!
//! A `svc-upgrade run` reads [`config`], decides on a target version (elsewhere: the version
//! server and the maintenance windows), then installs it through a [`pkg::PackageManager`],
//! whose version strings come from [`version`]. The packages themselves, the systemd units and
//! the install script live in `deploy/`.

pub mod config;
pub mod pkg;
pub mod version;

pub use config::{ConfigError, RestartMode, UpgradeConfig};
pub use pkg::{InstallerKind, PackageManager, PkgError, install_and_hold, package_manager};
pub use version::{PackageVersionError, from_package_version, to_package_version};
