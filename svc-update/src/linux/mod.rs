//! The Linux updater, `svc-upgrade`: the configuration directory `/etc/svc-upgrade.d/`, the
//! package version mapping, the package managers that install and hold the agent package, the
//! decision when to install, the state kept between runs, and one whole run.
//!
//! A `svc-upgrade run` ([`runner`]) reads [`config`] and [`state`], asks the version server
//! ([`crate::target`]), reads the windows from `schedule`, [`decision::decide`]s, then installs
//! through a [`pkg::PackageManager`], whose version strings come from [`version`]; then restarts
//! the agent, waits for proof of health (the `health` module, from the agent's `agent` file) or rolls
//! back, and writes the result to `status` ([`status`]). The
//! packages themselves, the systemd units and the install script live in `deploy/`.

pub mod config;
pub mod decision;
pub(crate) mod health;
pub mod pkg;
pub mod runner;
pub mod state;
pub mod status;
pub mod version;

pub use config::{ConfigError, RestartMode, UpgradeConfig};
pub use decision::{Decision, Mode, Reason, Refusal, decide};
pub use pkg::{InstallerKind, PackageManager, PkgError, install_and_hold, package_manager};
pub use runner::{RollbackFailure, RunError, RunReport, Runner};
pub use state::{InstallRecord, StateError, UpgradeState};
pub use status::{new_status, save_status};
pub use version::{PackageVersionError, from_package_version, to_package_version};
