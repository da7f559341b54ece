//! The Linux updater's run ([`svc_update::linux::Runner`]) against a real version server over
//! TLS (`svc_net::proxy::web::version` on a `svc_net::proxy` on 127.0.0.1:0), with the recording `nop`
//! installer and a stand-in `systemctl` — no root needed. The real package managers and the real
//! `svc-upgrade` binary are in `linux_packages.rs`.

use std::{
    collections::BTreeMap,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use anyhow::{Context, Result};
use svc_core::updater::{UpdateResult, UpdaterStatus};
use svc_core::{
    Clock, ManualClock, Version,
    channel::ChannelSpec,
    maintenance::{Window, render_schedule_file},
};
use svc_net::{
    dial::TcpConnector,
    proxy::web::version::{Fetcher, VersionResolver, http::VersionHandler},
    proxy::{ProxyBuilder, ProxySettings, RunningProxy},
    tls::TlsSource,
};
use svc_update::{
    linux::{
        Decision, Mode, RunError, Runner, UpgradeConfig, UpgradeState,
        decision::Refusal,
        pkg::{Nop, PackageManager},
    },
    target::{VersionClient, endpoint_url},
};

fn v(s: &str) -> Version {
    Version::parse(s).expect("test version")
}

async fn version_server(data_dir: &Path, version: &str, critical: bool) -> Result<RunningProxy> {
    let mut settings = ProxySettings::default();
    settings.ping.web_listen_addr = "127.0.0.1:0".parse()?;
    settings.tls = TlsSource::Generated {
        data_dir: data_dir.to_owned(),
    };
    settings.channels = BTreeMap::from([(
        "default".to_owned(),
        ChannelSpec::Static {
            version: Some(v(version)),
            critical,
        },
    )]);
    let resolver = VersionResolver::new(
        settings.channels.clone(),
        v("18.0.0"),
        Fetcher::direct(svc_net::tls::client_config(None)?),
    );
    let builder = ProxyBuilder::new(settings).with_version(v("18.0.0"));
    Ok(builder
        .version_server(VersionHandler::new(resolver))
        .bind()
        .await?)
}

fn client(proxy: &RunningProxy) -> Result<VersionClient<TcpConnector>> {
    let ca = std::fs::read(proxy.ca_file().context("ca")?)?;
    let url = endpoint_url(&format!(
        "127.0.0.1:{}/v1/webapi/automaticupgrades/channel/default",
        proxy.addrs().web.port()
    ))?;
    Ok(VersionClient::new(
        TcpConnector::new(),
        svc_net::tls::client_config(Some(&ca))?,
        url,
    ))
}

fn script(path: &Path, body: &str) -> Result<()> {
    std::fs::write(path, format!("#!/bin/sh\n{body}\n"))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// A configuration directory, state file, fake systemd directory and recording `systemctl`
/// that says the agent is not running (`is-active` exits 3), so no health check follows.
struct Setup {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    runner: Runner,
    systemctl_log: PathBuf,
}

fn setup(restart_mode: &str) -> Result<Setup> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("svc-upgrade.d");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("installer"), "nop\n")?;
    std::fs::write(dir.join("restart-mode"), format!("{restart_mode}\n"))?;
    let config = UpgradeConfig::load_dir(&dir)?;
    let mut runner = Runner::new(config, tmp.path().join("state/state.json"));
    let systemctl_log = tmp.path().join("systemctl.log");
    runner.systemctl = tmp.path().join("systemctl");
    script(
        &runner.systemctl,
        &format!(
            "echo \"$@\" >> '{}'\ncase \"$1\" in is-active) exit 3;; esac",
            systemctl_log.display()
        ),
    )?;
    runner.systemd_dir = tmp.path().join("run-systemd-system");
    std::fs::create_dir_all(&runner.systemd_dir)?;
    runner.svc_binary = tmp.path().join("svc");
    script(&runner.svc_binary, "echo 'svc v17.0.0'")?;
    Ok(Setup {
        _tmp: tmp,
        dir,
        runner,
        systemctl_log,
    })
}

fn schedule(dir: &Path, windows: &[Window]) -> Result<()> {
    std::fs::write(dir.join("schedule"), render_schedule_file(windows))?;
    Ok(())
}

fn window_at(now: SystemTime) -> Window {
    Window {
        start: now - Duration::from_secs(60),
        end: now + Duration::from_secs(3540),
    }
}

async fn run(
    setup: &Setup,
    mode: Mode,
    client: &VersionClient<TcpConnector>,
    pm: &dyn PackageManager,
    clock: &ManualClock,
) -> (Result<Decision, RunError>, String) {
    let mut out = Vec::new();
    let result = setup
        .runner
        .run(mode, client, pm, clock, &mut out)
        .await
        .map(|r| r.decision);
    (result, String::from_utf8_lossy(&out).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_critical_flips_and_restart() -> Result<()> {
    let data = tempfile::tempdir()?;
    let s = setup("restart")?;
    let clock = ManualClock::new(SystemTime::now());
    // The agent binary answers 17.0.0; the nop installer knows no package yet.
    let pm = Nop::new(None);

    let same = version_server(data.path(), "17.0.0", false).await?;
    let (decision, out) = run(&s, Mode::DryRun, &client(&same)?, &pm, &clock).await;
    assert!(matches!(decision?, Decision::UpToDate { .. }), "{out}");
    assert!(
        out.contains("warning: no valid upgrade schedule: cannot read "),
        "{out}"
    );
    assert!(
        out.ends_with("no upgrades available (v17.0.0 == v17.0.0)\n"),
        "{out}"
    );
    same.shutdown().await;

    let next = version_server(data.path(), "17.1.0", false).await?;
    let next_client = client(&next)?;
    schedule(&s.dir, &[window_at(clock.now() + Duration::from_secs(86_400))])?;
    let (decision, out) = run(&s, Mode::Run, &next_client, &pm, &clock).await;
    assert!(matches!(decision?, Decision::Wait { .. }));
    assert_eq!(
        out,
        "an upgrade is available (v17.0.0 -> v17.1.0)\n\
         upgrade is non-critical and we are outside of maintenance window, not attempting\n"
    );
    assert!(pm.actions().is_empty());

    // Inside the window: dry-run changes nothing, run installs and restarts.
    // The run outside the window wrote `none` and why.
    let status_before = std::fs::read_to_string(s.dir.join("status"))?;
    let waited: UpdaterStatus = serde_json::from_str(&status_before)?;
    assert_eq!(
        (waited.result, waited.from.as_str(), waited.to.as_str()),
        (UpdateResult::None, "17.0.0", "17.1.0")
    );
    assert!(
        waited
            .reason
            .ends_with("upgrade is non-critical and we are outside of maintenance window, not attempting"),
        "{waited:?}"
    );
    schedule(&s.dir, &[window_at(clock.now())])?;
    let (_, out) = run(&s, Mode::DryRun, &next_client, &pm, &clock).await;
    assert!(
        out.ends_with("dry run: would install svc v17.1.0 with nop\n"),
        "{out}"
    );
    assert!(pm.actions().is_empty());
    assert!(!s.runner.state_path.exists(), "dry-run wrote state");
    assert_eq!(
        std::fs::read_to_string(s.dir.join("status"))?,
        status_before,
        "dry-run wrote status"
    );
    let (decision, out) = run(&s, Mode::Run, &next_client, &pm, &clock).await;
    assert!(decision?.install_target().is_some());
    assert_eq!(pm.actions(), ["unhold svc", "install svc=17.1.0", "hold svc"]);
    assert!(
        out.contains("within maintenance window, upgrade will be attempted\n"),
        "{out}"
    );
    assert!(out.contains("installed svc v17.1.0 and held it\n"), "{out}");
    assert_eq!(
        std::fs::read_to_string(&s.systemctl_log)?,
        "is-active --quiet svc.service\ntry-restart svc.service\n"
    );
    assert!(
        out.ends_with(
            "svc.service was not running, so it was not restarted: v17.1.0 runs when it is started; health not checked\n"
        ),
        "{out}"
    );
    let status = UpdaterStatus::load(&s.dir.join("status"))?.context("status written")?;
    assert_eq!(
        (status.result, status.from.as_str(), status.to.as_str()),
        (UpdateResult::Updated, "17.0.0", "17.1.0")
    );
    let state = UpgradeState::load(&s.runner.state_path)?;
    assert_eq!(
        state.last_install.as_ref().map(|r| &r.version),
        Some(&v("17.1.0"))
    );
    assert_eq!(state.in_progress, None);

    // Another proxy answers 17.1.1 in the same window: one install per window.
    let other = version_server(data.path(), "17.1.1", false).await?;
    let (decision, out) = run(&s, Mode::Run, &client(&other)?, &pm, &clock).await;
    assert!(matches!(decision?, Decision::AlreadyUpgraded { .. }), "{out}");
    assert_eq!(pm.actions().len(), 3);
    other.shutdown().await;

    // Critical: at once, even outside the window.
    next.shutdown().await;
    let critical = version_server(data.path(), "17.1.2", true).await?;
    schedule(&s.dir, &[])?;
    let (decision, out) = run(&s, Mode::Run, &client(&critical)?, &pm, &clock).await;
    assert!(decision?.install_target().is_some(), "{out}");
    assert!(out.contains("warning: no valid upgrade schedule: "), "{out}");
    assert!(out.contains("upgrade is critical"), "{out}");
    assert_eq!(pm.actions()[4], "install svc=17.1.2");
    critical.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_and_failures_install_nothing() -> Result<()> {
    let data = tempfile::tempdir()?;
    let s = setup("none")?;
    let clock = ManualClock::new(SystemTime::now());
    schedule(&s.dir, &[window_at(clock.now())])?;
    let pm = Nop::new(Some(v("17.2.0")));

    let older = version_server(data.path(), "17.1.0", true).await?;
    let (decision, out) = run(&s, Mode::Run, &client(&older)?, &pm, &clock).await;
    assert!(
        matches!(decision, Err(RunError::Refused(Refusal::Downgrade { .. }))),
        "{decision:?}"
    );
    assert_eq!(out, "an upgrade is available (v17.2.0 -> v17.1.0)\n");
    assert!(pm.actions().is_empty());
    // A refusal installs nothing: `none`, with the refusal as the reason.
    let status = UpdaterStatus::load(&s.dir.join("status"))?.context("status written")?;
    assert_eq!(
        (status.result, status.from.as_str(), status.to.as_str()),
        (UpdateResult::None, "17.2.0", "17.1.0")
    );
    assert!(status.reason.starts_with("refusing to downgrade"), "{status:?}");
    // force goes below, and restart-mode none leaves the agent alone.
    let (decision, out) = run(&s, Mode::Force, &client(&older)?, &pm, &clock).await;
    assert!(decision?.install_target().is_some());
    assert_eq!(
        pm.actions(),
        ["unhold svc", "install --force svc=17.1.0", "hold svc"]
    );
    assert!(
        out.ends_with("restart-mode is none: v17.1.0 runs after the agent's next restart\n"),
        "{out}"
    );
    assert!(!s.systemctl_log.exists());
    older.shutdown().await;

    let far = version_server(data.path(), "15.0.0", true).await?;
    let (decision, _) = run(&s, Mode::Force, &client(&far)?, &pm, &clock).await;
    assert!(
        matches!(decision, Err(RunError::Refused(Refusal::MajorJump { .. }))),
        "{decision:?}"
    );
    let down = client(&far)?;
    far.shutdown().await;
    let (decision, out) = run(&s, Mode::Run, &down, &pm, &clock).await;
    let err = decision.expect_err("server down");
    assert!(
        err.to_string()
            .starts_with("version server: GET https://127.0.0.1:"),
        "{err}"
    );
    assert!(!out.contains("available"), "{out}");
    assert_eq!(pm.actions().len(), 3, "nothing installed after the first force");

    // A failure the package manager reports is not an interruption: no repair next time.
    let unpackageable = version_server(data.path(), "17.3.0-rc-1", false).await?;
    let (decision, _) = run(&s, Mode::Run, &client(&unpackageable)?, &pm, &clock).await;
    let err = decision.expect_err("no package version");
    assert!(err.to_string().contains("cannot be packaged"), "{err}");
    let status = UpdaterStatus::load(&s.dir.join("status"))?.context("status written")?;
    assert_eq!(status.result, UpdateResult::Failed, "{status:?}");
    assert_eq!(status.to, "17.3.0-rc-1");
    assert!(status.reason.contains("cannot be packaged"), "{status:?}");
    assert_eq!(pm.actions()[3..], ["unhold svc", "hold svc"]);
    assert_eq!(UpgradeState::load(&s.runner.state_path)?.in_progress, None);
    unpackageable.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_install_is_resumed() -> Result<()> {
    let data = tempfile::tempdir()?;
    let s = setup("restart")?;
    let clock = ManualClock::new(SystemTime::now());
    schedule(&s.dir, &[window_at(clock.now())])?;
    // What a run killed after recording its intent leaves behind.
    let window = window_at(clock.now());
    UpgradeState {
        last_install: None,
        in_progress: Some(svc_update::linux::InstallRecord::new(
            v("17.3.0"),
            clock.now(),
            Some(window),
        )),
        bad_versions: Vec::new(),
    }
    .save(&s.runner.state_path)?;
    let pm = Nop::new(Some(v("17.2.0")));
    let proxy = version_server(data.path(), "17.3.0", false).await?;
    let (_, out) = run(&s, Mode::DryRun, &client(&proxy)?, &pm, &clock).await;
    assert!(
        out.starts_with(
            "warning: a previous install of v17.3.0 was interrupted; `svc-upgrade run` will repair"
        ),
        "{out}"
    );
    assert!(pm.actions().is_empty(), "dry-run repaired");
    let (decision, out) = run(&s, Mode::Run, &client(&proxy)?, &pm, &clock).await;
    assert!(decision?.install_target().is_some(), "{out}");
    assert!(
        out.starts_with("warning: a previous install of v17.3.0 was interrupted"),
        "{out}"
    );
    // The hold first (repair), then the install the killed run did not finish.
    assert_eq!(
        pm.actions(),
        ["hold svc", "unhold svc", "install svc=17.3.0", "hold svc"]
    );
    let state = UpgradeState::load(&s.runner.state_path)?;
    assert_eq!(state.in_progress, None);
    assert!(state.last_install.is_some_and(|r| r.in_window(&window)));
    proxy.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_self_signed_proxy_needs_its_ca_or_insecure() -> Result<()> {
    use svc_update::target::{Trust, tls_config};
    let data = tempfile::tempdir()?;
    let proxy = version_server(data.path(), "17.0.3", false).await?;
    let url = endpoint_url(&format!(
        "127.0.0.1:{}/v1/webapi/automaticupgrades/channel/default",
        proxy.addrs().web.port()
    ))?;
    let ask = |trust| -> Result<VersionClient<TcpConnector>> {
        Ok(VersionClient::new(
            TcpConnector::new(),
            tls_config(trust)?,
            url.clone(),
        ))
    };
    let err = ask(Trust::Roots(None))?
        .version()
        .await
        .expect_err("untrusted CA");
    assert!(err.to_string().contains("TLS: invalid peer certificate"), "{err}");
    let ca = std::fs::read(proxy.ca_file().context("ca")?)?;
    assert_eq!(ask(Trust::Roots(Some(&ca)))?.version().await?, Some(v("17.0.3")));
    assert_eq!(ask(Trust::Insecure)?.version().await?, Some(v("17.0.3")));
    proxy.shutdown().await;
    Ok(())
}

/// A stand-in `systemctl` that plays the agent: `is-active` succeeds, and a restart writes the
/// `agent` file as the agent does after an accepted heartbeat, with the version in
/// `<tmp>/running` (what the restarted agent runs) and the current time.
fn agent_playing_systemctl(s: &mut Setup, health_timeout_secs: u64) -> Result<PathBuf> {
    let running = s.dir.join("../running");
    let agent = s.dir.join("agent");
    script(
        &s.runner.systemctl,
        &format!(
            "echo \"$@\" >> '{log}'\n\
             case \"$1\" in\n\
             is-active) exit 0;;\n\
             restart|try-restart|try-reload-or-restart)\n\
               printf '{{\"version\":\"%s\",\"pid\":1,\"heartbeat_at\":%s,\"diag_addr\":null}}' \"$(cat '{running}')\" \"$(date +%s)\" > '{agent}.tmp'\n\
               mv '{agent}.tmp' '{agent}';;\n\
             esac",
            log = s.systemctl_log.display(),
            running = running.display(),
            agent = agent.display(),
        ),
    )?;
    std::fs::write(s.dir.join("health-timeout"), format!("{health_timeout_secs}\n"))?;
    s.runner.config = UpgradeConfig::load_dir(&s.dir)?;
    Ok(running)
}

fn status(s: &Setup) -> Result<UpdaterStatus> {
    UpdaterStatus::load(&s.dir.join("status"))?.context("no status written")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unhealthy_versions_are_rolled_back_and_not_retried() -> Result<()> {
    let data = tempfile::tempdir()?;
    let mut s = setup("restart")?;
    let running = agent_playing_systemctl(&mut s, 2)?;
    let clock = ManualClock::new(SystemTime::now());
    let pm = Nop::new(Some(v("17.0.0")));
    // The agent keeps running 17.0.0 whatever is installed: 17.1.0 never reports.
    std::fs::write(&running, "17.0.0")?;
    schedule(&s.dir, &[window_at(clock.now())])?;
    let bad = version_server(data.path(), "17.1.0", false).await?;
    let (decision, out) = run(&s, Mode::Run, &client(&bad)?, &pm, &clock).await;
    assert!(decision?.install_target().is_some(), "{out}");
    assert_eq!(
        pm.actions(),
        [
            "unhold svc",
            "install svc=17.1.0",
            "hold svc",
            "unhold svc",
            "install --force svc=17.0.0",
            "hold svc"
        ]
    );
    assert_eq!(
        std::fs::read_to_string(&s.systemctl_log)?,
        "is-active --quiet svc.service\ntry-restart svc.service\nreset-failed svc.service\nrestart svc.service\n"
    );
    assert!(
        out.contains("waiting up to 2s (health-timeout) for v17.1.0 to prove healthy\n"),
        "{out}"
    );
    assert!(
        out.contains("v17.1.0 did not prove healthy: no heartbeat with 17.1.0 within 2s (the agent last reported 17.0.0 at "),
        "{out}"
    );
    assert!(
        out.contains("rolled back from v17.1.0 to v17.0.0; v17.1.0 is not installed again"),
        "{out}"
    );
    let st = status(&s)?;
    assert_eq!(
        (
            st.result,
            st.from.as_str(),
            st.to.as_str(),
            st.bad_versions.clone()
        ),
        (
            UpdateResult::RolledBack,
            "17.1.0",
            "17.0.0",
            vec!["17.1.0".to_owned()]
        )
    );
    assert!(
        st.reason.starts_with("no heartbeat with 17.1.0 within 2s"),
        "{st:?}"
    );
    assert_eq!(
        UpgradeState::load(&s.runner.state_path)?.bad_versions,
        [v("17.1.0")]
    );

    // The next window: 17.1.0 is not tried again, critical or not.
    clock.advance(Duration::from_secs(86_400));
    schedule(&s.dir, &[window_at(clock.now())])?;
    let (decision, out) = run(&s, Mode::Run, &client(&bad)?, &pm, &clock).await;
    assert!(matches!(decision?, Decision::BadVersion { .. }), "{out}");
    assert!(
        out.contains("not installing v17.1.0: it was installed before"),
        "{out}"
    );
    assert!(out.contains("`svc-upgrade force`"), "{out}");
    assert_eq!(pm.actions().len(), 6, "a bad version was installed again");
    let st = status(&s)?;
    assert_eq!(st.result, UpdateResult::None);
    assert!(st.reason.contains("not installing v17.1.0"), "{st:?}");
    assert_eq!(st.bad_versions, ["17.1.0"]);
    bad.shutdown().await;

    // A newer version is installed, proves healthy, and drops the older bad version.
    let newer = version_server(data.path(), "17.2.0", false).await?;
    std::fs::write(&running, "17.2.0")?;
    clock.advance(Duration::from_secs(86_400));
    schedule(&s.dir, &[window_at(clock.now())])?;
    let (decision, out) = run(&s, Mode::Run, &client(&newer)?, &pm, &clock).await;
    assert!(decision?.install_target().is_some(), "{out}");
    assert!(out.contains("v17.2.0 is healthy"), "{out}");
    let st = status(&s)?;
    assert_eq!(
        (st.result, st.from.as_str(), st.to.as_str()),
        (UpdateResult::Updated, "17.0.0", "17.2.0")
    );
    assert!(st.bad_versions.is_empty(), "{st:?}");
    newer.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_clears_bad_versions_and_unhealthy_agents_update_outside_windows() -> Result<()> {
    let data = tempfile::tempdir()?;
    let mut s = setup("restart")?;
    let running = agent_playing_systemctl(&mut s, 5)?;
    let clock = ManualClock::new(SystemTime::now());
    let pm = Nop::new(Some(v("17.0.0")));
    UpgradeState {
        bad_versions: vec![v("17.1.0")],
        ..UpgradeState::default()
    }
    .save(&s.runner.state_path)?;
    let proxy = version_server(data.path(), "17.1.0", false).await?;
    schedule(&s.dir, &[window_at(clock.now() + Duration::from_secs(86_400))])?;
    std::fs::write(&running, "17.1.0")?;
    let (decision, out) = run(&s, Mode::Force, &client(&proxy)?, &pm, &clock).await;
    assert!(decision?.install_target().is_some(), "{out}");
    assert!(
        out.starts_with("force: cleared the versions marked bad (v17.1.0)\n"),
        "{out}"
    );
    let st = status(&s)?;
    assert_eq!((st.result, st.to.as_str()), (UpdateResult::Updated, "17.1.0"));
    assert!(st.bad_versions.is_empty());
    proxy.shutdown().await;

    // Outside every window, a healthy agent waits...
    let next = version_server(data.path(), "17.2.0", false).await?;
    let heartbeat = |at: SystemTime| -> Result<()> {
        let at = at.duration_since(SystemTime::UNIX_EPOCH)?.as_secs();
        std::fs::write(
            s.dir.join("agent"),
            format!(r#"{{"version":"17.1.0","pid":1,"heartbeat_at":{at},"diag_addr":null}}"#),
        )?;
        Ok(())
    };
    heartbeat(clock.now() - Duration::from_secs(60))?;
    // (the forced install above was outside a window too: a day later, so the hourly limit is not what stops it)
    clock.advance(Duration::from_secs(86_400));
    schedule(&s.dir, &[window_at(clock.now() + Duration::from_secs(86_400))])?;
    heartbeat(clock.now() - Duration::from_secs(60))?;
    let (decision, out) = run(&s, Mode::Run, &client(&next)?, &pm, &clock).await;
    assert!(matches!(decision?, Decision::Wait { .. }), "{out}");
    // ...one whose last accepted heartbeat is older than unhealthy-after (15 min) is updated.
    heartbeat(clock.now() - Duration::from_secs(16 * 60))?;
    std::fs::write(&running, "17.2.0")?;
    let (decision, out) = run(&s, Mode::Run, &client(&next)?, &pm, &clock).await;
    assert!(decision?.install_target().is_some(), "{out}");
    assert!(
        out.contains(
            "the agent's last accepted heartbeat was 960s ago (more than unhealthy-after, 900s) and no diagnostics address to ask /readyz\n\
             an upgrade is available (v17.1.0 -> v17.2.0)\n\
             the agent has been unhealthy for a sustained time, upgrade will be attempted outside of maintenance window\n"
        ),
        "{out}"
    );
    assert_eq!(status(&s)?.result, UpdateResult::Updated);
    next.shutdown().await;
    Ok(())
}

/// The nop installer, except that a forced install (the rollback's) fails as a package manager
/// would.
#[derive(Debug)]
struct RollbackFails(Nop);

#[async_trait::async_trait]
impl PackageManager for RollbackFails {
    fn kind(&self) -> svc_update::linux::InstallerKind {
        self.0.kind()
    }

    async fn install(
        &self,
        package: &str,
        version: &Version,
        force: bool,
    ) -> Result<(), svc_update::linux::PkgError> {
        if force {
            return Err(svc_update::linux::PkgError::Failed {
                command: format!("apt-get install --allow-downgrades {package}={version}"),
                code: Some(100),
                stderr: "E: Version not found".to_owned(),
            });
        }
        self.0.install(package, version, force).await
    }

    async fn hold(&self, package: &str) -> Result<(), svc_update::linux::PkgError> {
        self.0.hold(package).await
    }

    async fn unhold(&self, package: &str) -> Result<(), svc_update::linux::PkgError> {
        self.0.unhold(package).await
    }

    async fn installed_version(&self, package: &str) -> Result<Option<Version>, svc_update::linux::PkgError> {
        self.0.installed_version(package).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_rollback_is_failed_with_both_reasons_and_held() -> Result<()> {
    let data = tempfile::tempdir()?;
    let mut s = setup("restart")?;
    let running = agent_playing_systemctl(&mut s, 1)?;
    std::fs::write(&running, "17.0.0")?;
    let clock = ManualClock::new(SystemTime::now());
    let pm = RollbackFails(Nop::new(Some(v("17.0.0"))));
    schedule(&s.dir, &[window_at(clock.now())])?;
    let bad = version_server(data.path(), "17.1.0", false).await?;
    let (decision, out) = run(&s, Mode::Run, &client(&bad)?, &pm, &clock).await;
    let err = decision.expect_err("the rollback failed").to_string();
    assert_eq!(
        err,
        "v17.1.0 did not prove healthy (no heartbeat with 17.1.0 within 1s (the agent last reported 17.0.0 at \
         {at})), and rolling back to v17.0.0 failed; v17.1.0 stays installed and held: `apt-get install \
         --allow-downgrades svc=v17.0.0` failed (exit code 100): E: Version not found"
            .replace(
                "{at}",
                &serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(s.dir.join("agent"))?)?
                    ["heartbeat_at"]
                    .to_string()
            ),
        "{out}"
    );
    // The hold is back after the failed reinstall.
    assert_eq!(
        pm.0.actions(),
        [
            "unhold svc",
            "install svc=17.1.0",
            "hold svc",
            "unhold svc",
            "hold svc"
        ]
    );
    let st = status(&s)?;
    assert_eq!(
        (
            st.result,
            st.from.as_str(),
            st.to.as_str(),
            st.bad_versions.clone()
        ),
        (
            UpdateResult::Failed,
            "17.0.0",
            "17.1.0",
            vec!["17.1.0".to_owned()]
        )
    );
    assert_eq!(st.reason, err);
    bad.shutdown().await;
    Ok(())
}
