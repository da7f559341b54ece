//! One `svc-upgrade` run, from the configuration directory to a restarted agent.
//!
//! The whole data flow of the Linux updater, in order:
//! 1. take the run lock (a second run started by hand while the timer's runs waits for it);
//! 2. read the [state](super::state); a run killed mid-install left `in_progress`: repair the
//!    package database (`dpkg --configure -a` for apt) and restore the hold first;
//! 3. the installed version: the package's ([`PackageManager::installed_version`]), else what
//!    `svc version` prints;
//! 4. the schedule file (a missing, empty or unreadable one is a warning — the agent exports it
//!    after joining — and means no window);
//! 5. the version server ([`VersionClient`]); a failure stops the run, nothing installed;
//! 6. [`decide`]; a refusal stops the run, nothing installed;
//! 7. install: record `in_progress`, [`install_and_hold`], check the installed version, record
//!    `last_install`;
//! 8. restart the agent as `restart-mode` says, when systemd runs and the agent was running;
//! 9. wait (at most `health-timeout`) for proof of health (`health::wait_healthy`);
//!    not healthy in time: install the previous version again (forced, so below the bad one),
//!    hold it, restart, and record the bad version in the state's `bad_versions`;
//! 10. write `status` ([`UpdaterStatus`](svc_core::updater::UpdaterStatus)) — after every `run` and `force`, whatever happened.
//!
//! Everything a person should read goes to the `out` writer (the binary passes stdout) as whole
//! lines (also emitted as `tracing` debug events).

use std::{
    io::{self, Write},
    path::PathBuf,
    process::Stdio,
};

use svc_core::{
    Clock, Version,
    maintenance::parse_schedule_file,
    updater::{SharedFileError, UpdateResult},
};

use super::{
    config::{RestartMode, UpgradeConfig},
    decision::{Decision, Inputs, Mode, Reason, Refusal, decide},
    health,
    pkg::{InstallerKind, PackageManager, PkgError, install_and_hold},
    state::{InstallRecord, StateError, UpgradeState},
    status::{new_status, save_status, unix},
};
use crate::target::{TargetError, Trust, VersionClient};

/// The agent's systemd unit, restarted after an install.
pub(crate) const AGENT_UNIT: &str = "svc.service";

/// Present when systemd is the running init system (`sd_booted(3)`'s test).
pub const SYSTEMD_RUN_DIR: &str = "/run/systemd/system";

/// Why a run stopped without finishing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The configuration directory has no `endpoint`.
    #[error(
        "no version endpoint: expected {path} to hold the Proxy Service's version endpoint \
         (host[:port]/path, written by the agent once it has joined)"
    )]
    NoEndpoint {
        /// The `endpoint` file.
        path: PathBuf,
    },
    /// The version server could not be asked or answered nonsense.
    #[error(transparent)]
    Target(#[from] TargetError),
    /// The advertised version is refused.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The package manager failed.
    #[error("installing failed: {0}")]
    Install(#[from] PkgError),
    /// The installed version could not be read.
    #[error(
        "cannot tell the installed version: {package} is not installed and `{svc} version` gave no \
         version ({reason})"
    )]
    NoCurrentVersion {
        /// The package asked about.
        package: String,
        /// The binary asked.
        svc: String,
        /// Why it gave none.
        reason: String,
    },
    /// After the install the package manager reports another version.
    #[error("after installing {expected} the package manager reports {found:?}")]
    NotInstalled {
        /// The version installed.
        expected: Version,
        /// What `installed_version` says now.
        found: Option<Version>,
    },
    /// The state file could not be read or written.
    #[error(transparent)]
    State(#[from] StateError),
    /// The lock file could not be taken.
    #[error("run lock {path}: {source}")]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// The operating system's reason.
        source: io::Error,
    },
    /// The new version did not prove healthy, and the rollback failed.
    #[error(transparent)]
    Rollback(Box<RollbackFailure>),
    /// The `status` file could not be written.
    #[error("writing the updater's status: {0}")]
    Status(#[from] SharedFileError),
    /// Writing the report failed.
    #[error("writing the report: {0}")]
    Output(#[from] io::Error),
}

/// A rollback that failed: [`RunError::Rollback`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
#[error("{bad} did not prove healthy ({unhealthy}), and {}: {reason}", if *.restored {
    format!("{previous} is installed and held again, but restarting the agent failed")
} else {
    format!("rolling back to {previous} failed; {bad} stays installed and held")
})]
pub struct RollbackFailure {
    /// The version that did not prove healthy.
    pub bad: Version,
    /// The version the rollback restores.
    pub previous: Version,
    /// Why the new version counted as unhealthy.
    pub unhealthy: String,
    /// Whether `previous` was installed again (then the restart failed).
    pub restored: bool,
    /// Why the rollback failed.
    pub reason: String,
}

/// Where a run looks for things; [`Runner::new`] gives the system's places.
#[derive(Debug, Clone)]
pub struct Runner {
    /// The configuration directory's values.
    pub config: UpgradeConfig,
    /// The state file.
    pub state_path: PathBuf,
    /// The `svc` binary asked for its version when the package manager knows none.
    pub svc_binary: PathBuf,
    /// Present when systemd runs ([`SYSTEMD_RUN_DIR`]).
    pub systemd_dir: PathBuf,
    /// The `systemctl` program that restarts the agent.
    pub systemctl: PathBuf,
}

/// What a finished run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunReport {
    /// The decision taken.
    pub decision: Decision,
    /// The version installed by this run and kept, if any (`None` after a rollback).
    pub installed: Option<Version>,
    /// The result written to `status`: [`UpdateResult::None`], [`UpdateResult::Updated`] or
    /// [`UpdateResult::RolledBack`] (a run that ends in [`UpdateResult::Failed`] returns an
    /// error).
    pub result: UpdateResult,
    /// The health check's finding after a rollback, or a note on an update whose health was not
    /// checked; empty otherwise.
    pub reason: String,
}

/// What restarting the agent did.
enum Restarted {
    /// Restarted at this Unix second: its health can be checked.
    Yes(u64),
    /// Not restarted (restart-mode none, no systemd, the agent not running): why.
    No(String),
    /// The restart command failed: why.
    Failed(String),
}

/// What a run learnt before it stopped, for the `status` of a run that ends in an error.
#[derive(Default)]
struct Progress {
    current: Option<Version>,
    target: Option<Version>,
}

impl Runner {
    /// A runner for `config` with the state file `state_path` and the system's `svc` binary and
    /// systemd directory.
    pub fn new(config: UpgradeConfig, state_path: PathBuf) -> Self {
        Runner {
            config,
            state_path,
            svc_binary: super::pkg::find_program("svc").unwrap_or_else(|| PathBuf::from("/usr/bin/svc")),
            systemd_dir: PathBuf::from(SYSTEMD_RUN_DIR),
            systemctl: PathBuf::from("systemctl"),
        }
    }

    /// Restarts the agent with `program` instead of `systemctl` (`SVC_UPGRADE_SYSTEMCTL`: another
    /// supervisor, tests). It is called as systemctl would be (`is-active --quiet svc.service`,
    /// `try-restart svc.service`, ...), whether or not systemd runs.
    pub fn with_systemctl(mut self, program: PathBuf) -> Self {
        self.systemctl = program;
        // The root directory always exists: "systemd runs" as far as the check is concerned.
        self.systemd_dir = PathBuf::from("/");
        self
    }

    /// One run in `mode`. Lines for a person go to `out`. Except in a dry run, `status` is
    /// written at the end, whatever happened; a run that ends in an error records the result
    /// `failed` when installing or rolling back failed, else `none` with the error as reason.
    pub async fn run<C>(
        &self,
        mode: Mode,
        client: &VersionClient<C>,
        pm: &dyn PackageManager,
        clock: &dyn Clock,
        out: &mut dyn Write,
    ) -> Result<RunReport, RunError>
    where
        C: svc_net::http::Connector,
    {
        let _lock = match mode {
            Mode::DryRun => None,
            _ => Some(self.lock().await?),
        };
        let mut progress = Progress::default();
        let result = self.run_locked(mode, client, pm, clock, out, &mut progress).await;
        if mode == Mode::DryRun {
            return result;
        }
        let bad_versions = UpgradeState::load(&self.state_path)
            .map(|s| s.bad_versions)
            .unwrap_or_default();
        let status = match &result {
            Ok(report) => {
                let (from, to) = match report.result {
                    UpdateResult::RolledBack => (report.decision_target(), report.decision_current()),
                    _ => (report.decision_current(), report.decision_target()),
                };
                let reason = match report.result {
                    UpdateResult::None => report.decision.messages().join("; "),
                    _ => report.reason.clone(),
                };
                new_status(report.result, from, to, reason, clock.now(), &bad_versions)
            }
            Err(e) => {
                let result = match e {
                    RunError::Install(_) | RunError::NotInstalled { .. } | RunError::Rollback(_) => {
                        UpdateResult::Failed
                    }
                    _ => UpdateResult::None,
                };
                new_status(
                    result,
                    progress.current.as_ref(),
                    progress.target.as_ref(),
                    e.to_string(),
                    clock.now(),
                    &bad_versions,
                )
            }
        };
        let path = self.config.status_path();
        match (save_status(&status, &path), result) {
            (Ok(()), result) => result,
            (Err(e), Ok(_)) => Err(e.into()),
            (Err(e), Err(run)) => {
                say(
                    out,
                    &format!("warning: could not write the updater's status: {e}"),
                )?;
                Err(run)
            }
        }
    }

    async fn run_locked<C>(
        &self,
        mode: Mode,
        client: &VersionClient<C>,
        pm: &dyn PackageManager,
        clock: &dyn Clock,
        out: &mut dyn Write,
        progress: &mut Progress,
    ) -> Result<RunReport, RunError>
    where
        C: svc_net::http::Connector,
    {
        let package = self.config.package.as_str();
        let mut state = UpgradeState::load(&self.state_path)?;
        if let Some(interrupted) = &state.in_progress
            && mode == Mode::DryRun
        {
            say(
                out,
                &format!(
                    "warning: a previous install of {} was interrupted; `svc-upgrade run` will repair the package database and the hold",
                    interrupted.version
                ),
            )?;
        }
        if let Some(interrupted) = state.in_progress.clone()
            && mode != Mode::DryRun
        {
            say(
                out,
                &format!(
                    "warning: a previous install of {} was interrupted; repairing the package database and the hold",
                    interrupted.version
                ),
            )?;
            repair(pm, package).await?;
            // The interrupted run may have got as far as installing: then it counts as this
            // window's install, and only the hold needed restoring.
            if pm.installed_version(package).await? == Some(interrupted.version.clone()) {
                state.last_install = Some(interrupted);
            }
            state.in_progress = None;
            state.save(&self.state_path)?;
        }

        if mode == Mode::Force && !state.bad_versions.is_empty() {
            let listed: Vec<String> = state.bad_versions.iter().map(ToString::to_string).collect();
            say(
                out,
                &format!("force: cleared the versions marked bad ({})", listed.join(", ")),
            )?;
            state.bad_versions.clear();
            state.save(&self.state_path)?;
        }

        let current = self.current_version(pm).await?;
        progress.current = Some(current.clone());
        let schedule = self.config.schedule_path();
        let windows = match std::fs::read_to_string(&schedule) {
            Ok(text) => match parse_schedule_file(&text) {
                Ok(windows) if windows.is_empty() => {
                    say(
                        out,
                        &format!(
                            "warning: no valid upgrade schedule: {} lists no maintenance window (the agent exports one while it is connected)",
                            schedule.display()
                        ),
                    )?;
                    windows
                }
                Ok(windows) if windows.iter().all(|w| w.end <= clock.now()) => {
                    say(
                        out,
                        &format!(
                            "warning: no valid upgrade schedule: every window in {} has ended (the agent has not exported a schedule recently)",
                            schedule.display()
                        ),
                    )?;
                    windows
                }
                Ok(windows) => windows,
                Err(e) => {
                    say(
                        out,
                        &format!("warning: no valid upgrade schedule: {}: {e}", schedule.display()),
                    )?;
                    Vec::new()
                }
            },
            Err(e) => {
                say(
                    out,
                    &format!(
                        "warning: no valid upgrade schedule: cannot read {}: {e} (expected right after install: the agent exports it within about 40 minutes of joining)",
                        schedule.display()
                    ),
                )?;
                Vec::new()
            }
        };

        let target = client.target().await?;
        progress.target.clone_from(&target.version);
        let now = clock.now();
        // Asked only when it matters: a non-critical update outside every window.
        let outside = !windows.iter().any(|w| w.contains(now));
        let unhealthy =
            if outside && !target.critical && target.version.as_ref().is_some_and(|t| *t != current) {
                health::sustained_unhealth(&self.config.agent_path(), now, self.config.unhealthy_after).await
            } else {
                None
            };
        let decision = decide(Inputs {
            current: &current,
            target: &target,
            windows: &windows,
            now,
            mode,
            state: &state,
            agent_unhealthy: unhealthy.is_some(),
        });
        let decision = match decision {
            Ok(d) => d,
            Err(refusal) => {
                if let Some(target) = &target.version {
                    say(out, &format!("an upgrade is available ({current} -> {target})"))?;
                }
                return Err(refusal.into());
            }
        };
        if let (Some(why), Some((_, Reason::Unhealthy))) = (&unhealthy, decision.install_target()) {
            say(out, why)?;
        }
        for line in decision.messages() {
            say(out, &line)?;
        }
        let Some((version, reason)) = decision.install_target() else {
            return Ok(RunReport {
                decision,
                installed: None,
                result: UpdateResult::None,
                reason: String::new(),
            });
        };
        let version = version.clone();
        if mode == Mode::DryRun {
            say(
                out,
                &format!("dry run: would install {package} {version} with {}", pm.kind()),
            )?;
            return Ok(RunReport {
                decision,
                installed: None,
                result: UpdateResult::None,
                reason: String::new(),
            });
        }

        let window = match reason {
            Reason::Window(w) => Some(w),
            _ => None,
        };
        state.in_progress = Some(InstallRecord::new(version.clone(), now, window));
        state.save(&self.state_path)?;
        say(out, &format!("installing {package} {version} with {}", pm.kind()))?;
        if let Err(e) = install_and_hold(pm, package, &version, mode == Mode::Force).await {
            // The package manager reported the failure itself (and the hold is back): nothing
            // was interrupted, so the next run must not go repairing.
            state.in_progress = None;
            state.save(&self.state_path)?;
            return Err(e.into());
        }
        let found = pm.installed_version(package).await?;
        if found.as_ref() != Some(&version) && pm.kind() != InstallerKind::Nop {
            return Err(RunError::NotInstalled {
                expected: version,
                found,
            });
        }
        state.in_progress = None;
        state.last_install = Some(InstallRecord::new(version.clone(), clock.now(), window));
        state.save(&self.state_path)?;
        say(out, &format!("installed {package} {version} and held it"))?;
        let unhealthy = match self.restart(&version, false, out).await? {
            Restarted::No(note) => {
                return Ok(RunReport {
                    decision,
                    installed: Some(version),
                    result: UpdateResult::Updated,
                    reason: note,
                });
            }
            Restarted::Failed(why) => why,
            Restarted::Yes(restarted_at) => {
                let timeout = self.config.health_timeout;
                say(
                    out,
                    &format!(
                        "waiting up to {}s (health-timeout) for {version} to prove healthy",
                        timeout.as_secs()
                    ),
                )?;
                match health::wait_healthy(&self.config.agent_path(), &version, restarted_at, timeout).await {
                    Ok(()) => {
                        say(
                            out,
                            &format!("{version} is healthy: its heartbeat was accepted after the restart"),
                        )?;
                        // A bad version below the one now running can no longer be offered.
                        state.bad_versions.retain(|bad| *bad > version);
                        state.save(&self.state_path)?;
                        return Ok(RunReport {
                            decision,
                            installed: Some(version),
                            result: UpdateResult::Updated,
                            reason: String::new(),
                        });
                    }
                    Err(why) => why,
                }
            }
        };
        self.roll_back(pm, &mut state, &version, &current, &unhealthy, out)
            .await?;
        Ok(RunReport {
            decision,
            installed: None,
            result: UpdateResult::RolledBack,
            reason: unhealthy,
        })
    }

    /// `bad` did not prove healthy (`unhealthy` says why): records it as bad, installs
    /// `previous` again (forced: apt `--allow-downgrades`, dnf `downgrade`, zypper
    /// `--oldpackage`), holds it and restarts the agent.
    async fn roll_back(
        &self,
        pm: &dyn PackageManager,
        state: &mut UpgradeState,
        bad: &Version,
        previous: &Version,
        unhealthy: &str,
        out: &mut dyn Write,
    ) -> Result<(), RunError> {
        let package = self.config.package.as_str();
        say(
            out,
            &format!("{bad} did not prove healthy: {unhealthy}; rolling back to {previous}"),
        )?;
        if !state.bad_versions.contains(bad) {
            state.bad_versions.push(bad.clone());
        }
        state.save(&self.state_path)?;
        let failed = |restored: bool, reason: String| {
            RunError::Rollback(Box::new(RollbackFailure {
                bad: bad.clone(),
                previous: previous.clone(),
                unhealthy: unhealthy.to_owned(),
                restored,
                reason,
            }))
        };
        install_and_hold(pm, package, previous, true)
            .await
            .map_err(|e| failed(false, e.to_string()))?;
        let found = pm
            .installed_version(package)
            .await
            .map_err(|e| failed(false, e.to_string()))?;
        if found.as_ref() != Some(previous) && pm.kind() != InstallerKind::Nop {
            let found = found.map_or_else(|| "nothing".to_owned(), |v| v.to_string());
            return Err(failed(
                false,
                format!("the package manager reports {found} installed"),
            ));
        }
        say(out, &format!("reinstalled {package} {previous} and held it"))?;
        match self.restart(previous, true, out).await? {
            Restarted::Yes(_) | Restarted::No(_) => {}
            Restarted::Failed(reason) => return Err(failed(true, reason)),
        }
        say(
            out,
            &format!(
                "rolled back from {bad} to {previous}; {bad} is not installed again until a newer version is \
                 published or `svc-upgrade force` is run"
            ),
        )?;
        Ok(())
    }

    /// The installed version: the package's, else the one `svc version` prints.
    pub(crate) async fn current_version(&self, pm: &dyn PackageManager) -> Result<Version, RunError> {
        let package = &self.config.package;
        if let Some(v) = pm.installed_version(package).await? {
            return Ok(v);
        }
        let no_version = |reason: String| RunError::NoCurrentVersion {
            package: package.clone(),
            svc: self.svc_binary.display().to_string(),
            reason,
        };
        let output = tokio::process::Command::new(&self.svc_binary)
            .arg("version")
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(|e| no_version(e.to_string()))?;
        let text = String::from_utf8_lossy(&output.stdout);
        parse_svc_version(&text).ok_or_else(|| no_version(format!("it printed \"{}\"", text.trim())))
    }

    async fn lock(&self) -> Result<std::fs::File, RunError> {
        let mut name = self.state_path.as_os_str().to_owned();
        name.push(".lock");
        let path = PathBuf::from(name);
        let lock_err = |source| RunError::Lock {
            path: path.clone(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(lock_err)?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(lock_err)?;
        // The lock is released by the kernel when the process dies, kill -9 included.
        tokio::task::spawn_blocking(move || file.lock().map(|()| file))
            .await
            .map_err(|e| lock_err(io::Error::other(e)))?
            .map_err(lock_err)
    }

    /// Restarts the agent as `restart-mode` says, when systemd runs and the agent was running.
    /// A rollback (`rollback`) restarts it with `systemctl restart` after `reset-failed`, so an
    /// agent the bad version left failing comes back too.
    async fn restart(
        &self,
        version: &Version,
        rollback: bool,
        out: &mut dyn Write,
    ) -> Result<Restarted, RunError> {
        let action = match self.config.restart_mode {
            RestartMode::None => {
                let note = format!("restart-mode is none: {version} runs after the agent's next restart");
                say(out, &note)?;
                return Ok(Restarted::No(format!("{note}; health not checked")));
            }
            _ if rollback => "restart",
            RestartMode::Restart => "try-restart",
            RestartMode::Reload => "try-reload-or-restart",
        };
        if !self.systemd_dir.is_dir() {
            say(
                out,
                &format!(
                    "warning: systemd is not running ({} is missing): could not restart {AGENT_UNIT}; restart the agent to run {version}",
                    self.systemd_dir.display()
                ),
            )?;
            return Ok(Restarted::No(format!(
                "systemd is not running: the agent was not restarted and {version}'s health not checked"
            )));
        }
        let running = rollback
            || self
                .systemctl_ok(&["is-active", "--quiet", AGENT_UNIT])
                .await
                .is_ok();
        if rollback {
            // A unit that hit its start limit with the bad version refuses to start until reset.
            let _ = self.systemctl_ok(&["reset-failed", AGENT_UNIT]).await;
        }
        let command = format!("{} {action} {AGENT_UNIT}", self.systemctl.display());
        let restarted_at = unix(std::time::SystemTime::now());
        if let Err(reason) = self.systemctl_ok(&[action, AGENT_UNIT]).await {
            say(out, &format!("`{command}` failed: {reason}"))?;
            return Ok(Restarted::Failed(format!("`{command}` failed: {reason}")));
        }
        say(out, &format!("ran `{command}`"))?;
        if !running {
            let note = format!(
                "{AGENT_UNIT} was not running, so it was not restarted: {version} runs when it is started; health not checked"
            );
            say(out, &note)?;
            return Ok(Restarted::No(note));
        }
        Ok(Restarted::Yes(restarted_at))
    }

    /// Runs the `systemctl` program with `args`; `Err` carries the exit status or why it could not
    /// run.
    async fn systemctl_ok(&self, args: &[&str]) -> Result<(), String> {
        let status = tokio::process::Command::new(&self.systemctl)
            .args(args)
            .stdin(Stdio::null())
            .status()
            .await;
        match status {
            Ok(s) if s.success() => Ok(()),
            Ok(s) => Err(s.to_string()),
            Err(e) => Err(e.to_string()),
        }
    }
}

impl RunReport {
    fn decision_current(&self) -> Option<&Version> {
        match &self.decision {
            Decision::NoTarget { current }
            | Decision::UpToDate { current }
            | Decision::Install { current, .. }
            | Decision::Wait { current, .. }
            | Decision::BadVersion { current, .. }
            | Decision::AlreadyUpgraded { current, .. } => Some(current),
        }
    }

    fn decision_target(&self) -> Option<&Version> {
        match &self.decision {
            Decision::NoTarget { .. } => None,
            Decision::UpToDate { current } => Some(current),
            Decision::Install { target, .. }
            | Decision::Wait { target, .. }
            | Decision::BadVersion { target, .. }
            | Decision::AlreadyUpgraded { target, .. } => Some(target),
        }
    }
}

/// A client of the version endpoint in `config`'s `endpoint` file, dialing as the proxy
/// environment says and checking the server as `trust` says.
pub fn version_client(config: &UpgradeConfig, trust: Trust<'_>) -> Result<VersionClient, RunError> {
    let endpoint = config.endpoint.as_deref().ok_or_else(|| RunError::NoEndpoint {
        path: config.endpoint_path(),
    })?;
    let url = crate::target::endpoint_url(endpoint)?;
    Ok(VersionClient::from_env(url, crate::target::tls_config(trust)?)?)
}

/// The version in `svc version`'s output (`svc v17.0.0`).
pub(crate) fn parse_svc_version(output: &str) -> Option<Version> {
    output
        .lines()
        .find_map(|line| line.trim().strip_prefix("svc "))
        .and_then(|v| Version::parse(v.trim()).ok())
}

/// Brings the package database and the hold back after a run was killed mid-install:
/// - apt: `dpkg --configure -a` finishes what dpkg was unpacking or configuring (apt refuses to
///   work until it has run);
/// - rpm (dnf, zypper): the repository metadata a killed refresh was writing is dropped
///   (`dnf clean metadata`, `zypper clean --metadata`; the next install downloads it again), and
///   a transaction killed between installing the new package and erasing the old one leaves both
///   in the database: the older records are dropped (`rpm -e --justdb`: the files on disk are
///   the newer package's);
///
/// then the hold the killed run had lifted is set again.
async fn repair(pm: &dyn PackageManager, package: &str) -> Result<(), RunError> {
    match pm.kind() {
        InstallerKind::Apt => {
            run_checked("dpkg", &["--configure", "-a"]).await?;
        }
        InstallerKind::Yum | InstallerKind::Zypper => {
            if pm.kind() == InstallerKind::Yum {
                let program = if super::pkg::find_program("yum").is_some() {
                    "yum"
                } else {
                    "dnf"
                };
                run_checked(program, &["clean", "metadata"]).await?;
            } else {
                run_checked("zypper", &["--non-interactive", "clean", "--metadata"]).await?;
            }
            let listed = run_checked(
                "rpm",
                &[
                    "-q",
                    "--queryformat",
                    "%{VERSION} %{NAME}-%{VERSION}-%{RELEASE}.%{ARCH}\\n",
                    package,
                ],
            )
            .await
            .unwrap_or_default();
            let mut installed: Vec<(Version, String)> = listed
                .lines()
                .filter_map(|line| {
                    let (version, nevra) = line.split_once(' ')?;
                    Some((
                        super::version::from_package_version(version).ok()?,
                        nevra.to_owned(),
                    ))
                })
                .collect();
            installed.sort();
            installed.pop();
            for (_, nevra) in installed {
                tracing::warn!(package = %nevra, "dropping the older duplicate left by the interrupted install");
                run_checked("rpm", &["-e", "--justdb", "--nodeps", "--noscripts", &nevra]).await?;
            }
        }
        _ => {}
    }
    if pm.installed_version(package).await?.is_some() {
        pm.hold(package).await?;
    }
    Ok(())
}

/// Runs `program args`, returning stdout; a non-zero exit is [`PkgError::Failed`].
async fn run_checked(program: &str, args: &[&str]) -> Result<String, PkgError> {
    let command = format!("{program} {}", args.join(" "));
    let output = tokio::process::Command::new(program)
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|source| PkgError::Spawn {
            command: command.clone(),
            source,
        })?;
    if !output.status.success() {
        return Err(PkgError::Failed {
            command,
            code: output.status.code(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn say(out: &mut dyn Write, line: &str) -> Result<(), RunError> {
    // The line is the user-facing record (stdout, and the journal under systemd); the trace
    // event lets an embedding program's subscriber see it too.
    tracing::debug!("{line}");
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn svc_version_output() {
        assert_eq!(
            parse_svc_version("svc v17.0.0-dev\n"),
            Some(Version::parse("17.0.0-dev").unwrap())
        );
        assert_eq!(parse_svc_version("garbage"), None);
        assert_eq!(parse_svc_version("svc vx"), None);
    }
}
