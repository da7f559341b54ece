//! The Linux updater's configuration directory, `/etc/svc-upgrade.d/`: one value per file.
//!
//! First step of a `svc-upgrade` run: read what the agent and the administrator left here, then
//! fetch the target version from `endpoint`, read the windows from `schedule`, and install the
//! `package` with the `installer`. Files:
//!
//! | file | value | when missing or empty |
//! |---|---|---|
//! | `endpoint` | the Proxy Service's version endpoint, `host[:port]/path`, no scheme (written by the agent) | none |
//! | `installer` | `apt`, `yum`, `zypper` or `nop` | detected from the binaries present |
//! | `package` | the package to update | `svc` |
//! | `restart-mode` | `restart`, `reload` or `none` | `restart` |
//! | `schedule` | maintenance windows exported by the agent (read elsewhere) | no window |
//! | `health-timeout` | how long to wait for proof of health after a restart ([`parse_duration`] form) | 120 s |
//! | `unhealthy-after` | how stale the agent's last heartbeat may be before an update outside a window is allowed | 15 min |
//!
//! Two files are written here rather than read as configuration: `status` (the updater's last
//! result, [`super::status`]) and `agent` (the agent's last accepted heartbeat, written by the
//! agent, read by the health check).
//!
//! `SVC_UPGRADE_CONFIG` names another directory (self-hosting, tests). Values are read whole
//! and trimmed, so a trailing newline from `echo apt > installer` is fine.

use std::{
    fmt, io,
    path::{Path, PathBuf},
    str::FromStr,
    time::Duration,
};

use super::pkg::InstallerKind;

/// The default configuration directory (the agent's schedule export writes there).
pub use svc_net::agent::node::export::DEFAULT_UPGRADE_DIR as DEFAULT_DIR;

/// The environment variable that overrides [`DEFAULT_DIR`].
pub use svc_net::agent::node::export::UPGRADE_DIR_ENV as DIR_ENV;

/// The package updated when the `package` file is absent.
pub(crate) const DEFAULT_PACKAGE: &str = "svc";

/// How long a run waits for proof of health after restarting the agent, when the
/// `health-timeout` file is absent.
pub const DEFAULT_HEALTH_TIMEOUT: Duration = Duration::from_secs(120);

/// How stale the agent's last accepted heartbeat must be (with `/readyz` not answering 200)
/// before a non-critical update may be installed outside a maintenance window, when the
/// `unhealthy-after` file is absent.
pub const DEFAULT_UNHEALTHY_AFTER: Duration = Duration::from_secs(15 * 60);

/// The longest `health-timeout` or `unhealthy-after` accepted: one day.
const MAX_DURATION: Duration = Duration::from_secs(86_400);

/// What a duration file must hold.
const DURATION_FORM: &str = "a whole number of seconds from 1 to 86400, optionally with the unit s, m or h \
                             (for example 120, 90s, 15m)";

/// What the updater does to the running agent after installing a new version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum RestartMode {
    /// `systemctl restart svc`: the new binary runs at once (the default).
    #[default]
    Restart,
    /// `systemctl reload svc`: SIGHUP, the agent restarts itself gracefully.
    Reload,
    /// Leave the running agent alone; the new version runs after its next restart.
    None,
}

impl RestartMode {
    /// The value as written in the `restart-mode` file.
    pub fn as_str(self) -> &'static str {
        match self {
            RestartMode::Restart => "restart",
            RestartMode::Reload => "reload",
            RestartMode::None => "none",
        }
    }
}

impl fmt::Display for RestartMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RestartMode {
    type Err = ();

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "restart" => Ok(RestartMode::Restart),
            "reload" => Ok(RestartMode::Reload),
            "none" => Ok(RestartMode::None),
            _ => Err(()),
        }
    }
}

/// Why the configuration directory could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A file exists but could not be read (permissions, not a regular file, not UTF-8).
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The operating system's reason.
        source: io::Error,
    },
    /// A file holds a value that is not allowed.
    #[error("{path}: expected {expected}, found \"{found}\"")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The allowed values or form.
        expected: &'static str,
        /// The value found (trimmed).
        found: String,
    },
}

/// The updater's configuration, read from the configuration directory.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct UpgradeConfig {
    /// The directory the values were read from.
    pub dir: PathBuf,
    /// The version endpoint, `host[:port]/path` without a scheme, when set.
    pub endpoint: Option<String>,
    /// The package manager to use; `None` means detect it.
    pub installer: Option<InstallerKind>,
    /// The package to update.
    pub package: String,
    /// What to do to the running agent after an install.
    pub restart_mode: RestartMode,
    /// How long to wait, after restarting the agent, for proof that the new version is healthy
    /// before rolling back (`health-timeout`).
    pub health_timeout: Duration,
    /// How stale the agent's last accepted heartbeat may be before the agent counts as
    /// unhealthy and a non-critical update may be installed outside a window (`unhealthy-after`).
    pub unhealthy_after: Duration,
}

impl UpgradeConfig {
    /// The configuration directory: `SVC_UPGRADE_CONFIG` when set and not empty, else
    /// [`DEFAULT_DIR`]. `env` looks up an environment variable (`|k| std::env::var(k).ok()`).
    pub fn dir_from_env(env: impl Fn(&str) -> Option<String>) -> PathBuf {
        svc_net::agent::node::export::upgrade_dir_from_env(env)
    }

    /// Reads the directory chosen by [`dir_from_env`](Self::dir_from_env).
    pub fn load(env: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        Self::load_dir(&Self::dir_from_env(env))
    }

    /// Reads `dir`. A missing directory or file means the default for that value.
    pub fn load_dir(dir: &Path) -> Result<Self, ConfigError> {
        let endpoint = match read_value(dir, "endpoint")? {
            Some((path, value)) => Some(parse_endpoint(&path, value)?),
            None => None,
        };
        let installer = match read_value(dir, "installer")? {
            Some((path, value)) => Some(value.parse().map_err(|()| ConfigError::Invalid {
                path,
                expected: "one of apt, yum, zypper, nop",
                found: value,
            })?),
            None => None,
        };
        let package = match read_value(dir, "package")? {
            Some((_, value)) if is_package_name(&value) => value,
            Some((path, value)) => {
                return Err(ConfigError::Invalid {
                    path,
                    expected: "a package name of lowercase letters, digits and . + - (for example svc)",
                    found: value,
                });
            }
            None => DEFAULT_PACKAGE.to_owned(),
        };
        let restart_mode = match read_value(dir, "restart-mode")? {
            Some((path, value)) => value.parse().map_err(|()| ConfigError::Invalid {
                path,
                expected: "one of restart, reload, none",
                found: value,
            })?,
            None => RestartMode::default(),
        };
        let health_timeout = read_duration(dir, "health-timeout")?.unwrap_or(DEFAULT_HEALTH_TIMEOUT);
        let unhealthy_after = read_duration(dir, "unhealthy-after")?.unwrap_or(DEFAULT_UNHEALTHY_AFTER);
        Ok(UpgradeConfig {
            dir: dir.to_owned(),
            endpoint,
            installer,
            package,
            restart_mode,
            health_timeout,
            unhealthy_after,
        })
    }

    /// The updater's last result, written at the end of every run (`<dir>/status`).
    pub fn status_path(&self) -> PathBuf {
        self.dir.join("status")
    }

    /// The agent's last accepted heartbeat, written by the agent (`<dir>/agent`).
    pub fn agent_path(&self) -> PathBuf {
        self.dir.join("agent")
    }

    /// The maintenance schedule file the agent exports (`<dir>/schedule`).
    pub(crate) fn schedule_path(&self) -> PathBuf {
        self.dir.join("schedule")
    }

    /// The endpoint file, which the agent fills in when it is empty.
    pub(crate) fn endpoint_path(&self) -> PathBuf {
        self.dir.join("endpoint")
    }
}

/// The trimmed content of `dir/name`, or `None` when the file is missing or blank.
fn read_value(dir: &Path, name: &str) -> Result<Option<(PathBuf, String)>, ConfigError> {
    let path = dir.join(name);
    match std::fs::read_to_string(&path) {
        Ok(text) if text.trim().is_empty() => Ok(None),
        Ok(text) => Ok(Some((path, text.trim().to_owned()))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ConfigError::Read { path, source }),
    }
}

/// The duration in `dir/name`, `None` when the file is missing or blank.
fn read_duration(dir: &Path, name: &str) -> Result<Option<Duration>, ConfigError> {
    match read_value(dir, name)? {
        Some((path, value)) => match parse_duration(&value) {
            Some(d) => Ok(Some(d)),
            None => Err(ConfigError::Invalid {
                path,
                expected: DURATION_FORM,
                found: value,
            }),
        },
        None => Ok(None),
    }
}

/// A duration as the `health-timeout` and `unhealthy-after` files hold it: a whole number of
/// seconds, or of seconds, minutes or hours with the unit `s`, `m` or `h` (`120`, `90s`, `15m`,
/// `1h`); at least one second and at most one day. `None` for anything else.
pub fn parse_duration(value: &str) -> Option<Duration> {
    let value = value.trim();
    let (number, unit) = match value.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => value.split_at(i),
        None => (value, "s"),
    };
    let scale = match unit.trim() {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        _ => return None,
    };
    if number.is_empty() {
        return None;
    }
    let seconds = number.parse::<u64>().ok()?.checked_mul(scale)?;
    let d = Duration::from_secs(seconds);
    (seconds >= 1 && d <= MAX_DURATION).then_some(d)
}

fn parse_endpoint(path: &Path, value: String) -> Result<String, ConfigError> {
    let expected = "host[:port]/path without a scheme or white space \
                    (for example proxy.example.com:443/v1/webapi/automaticupgrades/channel/default)";
    if value.contains("://") || value.chars().any(char::is_whitespace) || value.starts_with('/') {
        return Err(ConfigError::Invalid {
            path: path.to_owned(),
            expected,
            found: value,
        });
    }
    Ok(value)
}

/// Debian and rpm package names both fit `[a-z0-9][a-z0-9.+-]*`.
fn is_package_name(value: &str) -> bool {
    let mut chars = value.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '+' | '-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, value: &str) {
        std::fs::write(dir.join(name), value).expect("write config file");
    }

    #[test]
    fn missing_directory_and_files_give_defaults() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("absent");
        let config = UpgradeConfig::load_dir(&dir).expect("defaults");
        assert_eq!(config.endpoint, None);
        assert_eq!(config.installer, None);
        assert_eq!(config.package, "svc");
        assert_eq!(config.restart_mode, RestartMode::Restart);
        assert_eq!(config.schedule_path(), dir.join("schedule"));
        assert_eq!(config.health_timeout, Duration::from_secs(120));
        assert_eq!(config.unhealthy_after, Duration::from_secs(900));
        assert_eq!(config.status_path(), dir.join("status"));
        assert_eq!(config.agent_path(), dir.join("agent"));
    }

    #[test]
    fn values_are_read_trimmed() {
        let tmp = tempfile::tempdir().expect("tempdir");
        write(
            tmp.path(),
            "endpoint",
            "proxy.example.com:443/v1/webapi/automaticupgrades/channel/default\n",
        );
        write(tmp.path(), "installer", "zypper\n");
        write(tmp.path(), "package", " svc-ent \n");
        write(tmp.path(), "restart-mode", "reload");
        write(tmp.path(), "schedule", "# periodically exported by svc\n");
        write(tmp.path(), "health-timeout", "90\n");
        write(tmp.path(), "unhealthy-after", "30m\n");
        let config = UpgradeConfig::load_dir(tmp.path()).expect("valid");
        assert_eq!(
            config.endpoint.as_deref(),
            Some("proxy.example.com:443/v1/webapi/automaticupgrades/channel/default")
        );
        assert_eq!(config.installer, Some(InstallerKind::Zypper));
        assert_eq!(config.package, "svc-ent");
        assert_eq!(config.restart_mode, RestartMode::Reload);
        assert_eq!(config.health_timeout, Duration::from_secs(90));
        assert_eq!(config.unhealthy_after, Duration::from_secs(1800));
    }

    #[test]
    fn durations() {
        for (text, secs) in [
            ("120", 120),
            ("90s", 90),
            ("15m", 900),
            ("1h", 3600),
            (" 2 m", 120),
            ("86400", 86_400),
        ] {
            assert_eq!(parse_duration(text), Some(Duration::from_secs(secs)), "{text}");
        }
        for text in [
            "",
            "0",
            "-5",
            "1.5",
            "2d",
            "m",
            "86401",
            "25h",
            "99999999999999999999",
            "10 minutes",
        ] {
            assert_eq!(parse_duration(text), None, "{text}");
        }
    }

    #[test]
    fn empty_endpoint_file_means_unset() {
        let tmp = tempfile::tempdir().expect("tempdir");
        write(tmp.path(), "endpoint", "\n");
        assert_eq!(UpgradeConfig::load_dir(tmp.path()).expect("valid").endpoint, None);
    }

    #[test]
    fn invalid_values_name_the_file_and_the_allowed_values() {
        let cases = [
            (
                "installer",
                "pacman",
                "installer: expected one of apt, yum, zypper, nop, found \"pacman\"",
            ),
            (
                "restart-mode",
                "kill",
                "restart-mode: expected one of restart, reload, none, found \"kill\"",
            ),
            (
                "package",
                "Svc Agent",
                "package: expected a package name of lowercase letters, digits and . + - (for example svc), found \"Svc Agent\"",
            ),
            (
                "health-timeout",
                "soon",
                "health-timeout: expected a whole number of seconds from 1 to 86400, optionally with the unit s, m or h (for example 120, 90s, 15m), found \"soon\"",
            ),
            (
                "unhealthy-after",
                "0",
                "unhealthy-after: expected a whole number of seconds from 1 to 86400",
            ),
            (
                "endpoint",
                "https://proxy.example.com/v1",
                "endpoint: expected host[:port]/path without a scheme",
            ),
        ];
        for (file, value, message) in cases {
            let tmp = tempfile::tempdir().expect("tempdir");
            write(tmp.path(), file, value);
            let err = UpgradeConfig::load_dir(tmp.path()).expect_err(file).to_string();
            let expected = format!("{}/{message}", tmp.path().display());
            assert!(
                err.starts_with(&expected),
                "{err}\n  does not start with\n{expected}"
            );
        }
    }

    #[test]
    fn unreadable_file_is_an_error_naming_it() {
        let tmp = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(tmp.path().join("installer")).expect("mkdir");
        let err = UpgradeConfig::load_dir(tmp.path()).expect_err("a directory is not a value");
        assert!(
            err.to_string()
                .starts_with(&format!("cannot read {}/installer: ", tmp.path().display()))
        );
    }

    #[test]
    fn environment_variable_overrides_the_directory() {
        assert_eq!(
            UpgradeConfig::dir_from_env(|_| None),
            PathBuf::from("/etc/svc-upgrade.d")
        );
        assert_eq!(
            UpgradeConfig::dir_from_env(
                |k| (k == "SVC_UPGRADE_CONFIG").then(|| "/opt/svc/upgrade.d".to_owned())
            ),
            PathBuf::from("/opt/svc/upgrade.d")
        );
        assert_eq!(
            UpgradeConfig::dir_from_env(|_| Some(String::new())),
            PathBuf::from(DEFAULT_DIR)
        );
        let tmp = tempfile::tempdir().expect("tempdir");
        write(tmp.path(), "installer", "nop");
        let dir = tmp.path().to_str().expect("utf-8 temp path").to_owned();
        let config = UpgradeConfig::load(|k| (k == DIR_ENV).then(|| dir.clone())).expect("valid");
        assert_eq!(config.installer, Some(InstallerKind::Nop));
    }
}
