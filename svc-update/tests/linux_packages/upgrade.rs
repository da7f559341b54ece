//! `svc-upgrade` end to end, per package manager: an agent enrolled with `deploy/install.sh`
//! (the real packages, so the real `/usr/bin/svc-upgrade` from `svc-ent-updater`), a real version
//! server (`svc_net::proxy::web::version` on a `svc_net::proxy` over TLS on 127.0.0.1:0, trusted through
//! `SVC_UPGRADE_CA_FILE`), and the schedule file written with a window around now or far away.
//!
//! The story, for apt, dnf and zypper alike:
//! 1. channel at v1: `dry-run` says no upgrade (and warns that there is no schedule);
//! 2. channel at v2: `dry-run` says an upgrade is available; `run` outside the window does
//!    nothing;
//! 3. faults inside an open window: the version server down, garbage, a version two majors
//!    ahead — each a non-zero exit with v1 still installed;
//! 4. `run` inside the window, `kill -9` of its process group while the package manager runs;
//!    the agent binary still works, and the next `run` repairs, finishes at v2 and re-holds;
//! 5. a critical v3 outside the window installs at once;
//! 6. `force` back to v1, then two proxies answering v2 and v3 in turn within one window: one
//!    install (v2), then "already upgraded", then "no upgrades available";
//! 7. health and rollback, with a stand-in `systemctl` (`SVC_UPGRADE_SYSTEMCTL`) that plays the
//!    agent: its restart writes the `agent` file with the version the installed `/usr/bin/svc`
//!    prints, unless that version is marked as one that never reports. v3 never reports: the run
//!    installs it, waits `health-timeout` (5 s), reinstalls v2 with the real package manager
//!    (apt `--allow-downgrades`, dnf `downgrade`, zypper `--oldpackage`), holds it, and writes
//!    `rolled_back`; the next window's run does not retry v3; `force` clears the list and
//!    installs v3, which now reports: `updated`.
//!
//! The `status` file is checked along the way: the package's initial one (`enrolled`), then
//! what each run wrote.

use std::{
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use anyhow::{Context, Result, ensure};
use svc_core::{
    Version,
    channel::ChannelSpec,
    maintenance::{Window, render_schedule_file},
};
use svc_net::proxy::web::version::{Fetcher, VersionResolver, http::VersionHandler};
use svc_net::{
    proxy::web::{full, web_service},
    proxy::{ProxyBuilder, ProxySettings, RunningProxy},
    tls::TlsSource,
};

use super::{Fixture, V1, V2, V3, installed_svc_says, sh};

const CONFIG_DIR: &str = "/etc/svc-upgrade.d";

/// A version server: one proxy serving `default` as given, plus `/garbage/…` answering HTML.
struct Channel {
    proxy: RunningProxy,
}

impl Channel {
    /// Starts a proxy whose `default` channel serves `version` (`None`: `none`). Every proxy of a
    /// test shares `data_dir`, so they present certificates of the same generated CA.
    async fn start(data_dir: &Path, version: Option<&str>, critical: bool) -> Result<Self> {
        let version = version.map(Version::parse).transpose()?;
        let mut settings = ProxySettings::default();
        settings.ping.web_listen_addr = "127.0.0.1:0".parse()?;
        settings.tls = TlsSource::Generated {
            data_dir: data_dir.to_owned(),
        };
        settings.channels = [(
            "default".to_owned(),
            ChannelSpec::Static {
                version: version.clone(),
                critical,
            },
        )]
        .into_iter()
        .collect();
        // The proxy caps a channel at its own major; run it at the version it serves so the
        // updater's own major check is what a wrong major meets.
        let own = version.unwrap_or_else(|| Version::new(17, 0, 0));
        let resolver = VersionResolver::new(
            settings.channels.clone(),
            own.clone(),
            Fetcher::direct(svc_net::tls::client_config(None)?),
        );
        let garbage = tower::service_fn(|_req| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(full("<html>maintenance</html>")))
        });
        let builder = ProxyBuilder::new(settings)
            .with_version(own)
            .web_mount("/garbage/", web_service(garbage));
        let proxy = builder
            .version_server(VersionHandler::new(resolver))
            .bind()
            .await?;
        Ok(Channel { proxy })
    }

    fn endpoint(&self) -> String {
        format!(
            "127.0.0.1:{}/v1/webapi/automaticupgrades/channel/default",
            self.proxy.addrs().web.port()
        )
    }

    fn garbage_endpoint(&self) -> String {
        format!(
            "127.0.0.1:{}/garbage/channel/default",
            self.proxy.addrs().web.port()
        )
    }

    fn ca_file(&self) -> Result<PathBuf> {
        self.proxy.ca_file().cloned().context("generated CA file")
    }
}

/// What one `svc-upgrade` invocation did.
struct Outcome {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ok={}\n--- stdout\n{}--- stderr\n{}",
            self.ok, self.stdout, self.stderr
        )
    }
}

/// The environment every `svc-upgrade` invocation gets: the test CA, the test state file, no
/// proxy variables from the machine.
fn updater(ca: &Path, state: &Path, command: &str) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new("/usr/bin/svc-upgrade");
    cmd.arg(command)
        .env("SVC_UPGRADE_CA_FILE", ca)
        .env("SVC_UPGRADE_STATE", state)
        .env_remove("SVC_UPGRADE_CONFIG")
        .kill_on_drop(true);
    for var in [
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "NO_PROXY",
        "no_proxy",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

async fn upgrade(ca: &Path, state: &Path, command: &str) -> Result<Outcome> {
    upgrade_with(ca, state, command, None).await
}

/// `svc-upgrade <command>`, restarting the agent with `systemctl` when given.
async fn upgrade_with(ca: &Path, state: &Path, command: &str, systemctl: Option<&Path>) -> Result<Outcome> {
    let mut cmd = updater(ca, state, command);
    if let Some(systemctl) = systemctl {
        cmd.env("SVC_UPGRADE_SYSTEMCTL", systemctl);
    }
    // The command's child is killed on drop (kill_on_drop in `updater`) when the time runs out.
    let out = tokio::time::timeout(Duration::from_secs(600), cmd.output())
        .await
        .map_err(|_| anyhow::anyhow!("svc-upgrade {command} did not finish within 600 s"))??;
    let outcome = Outcome {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    eprintln!("svc-upgrade {command}:\n{outcome}");
    Ok(outcome)
}

fn set_endpoint(endpoint: &str) -> Result<()> {
    std::fs::write(Path::new(CONFIG_DIR).join("endpoint"), format!("{endpoint}\n"))?;
    Ok(())
}

/// A window open now (`offset` seconds into it; different offsets are different windows).
fn window_around_now(offset: u64) -> Window {
    let now = SystemTime::now();
    Window {
        start: now - Duration::from_secs(offset),
        end: now - Duration::from_secs(offset) + Duration::from_secs(3600),
    }
}

fn set_schedule(windows: &[Window]) -> Result<()> {
    std::fs::write(
        Path::new(CONFIG_DIR).join("schedule"),
        render_schedule_file(windows),
    )?;
    Ok(())
}

fn far_away() -> Window {
    let start = SystemTime::now() + Duration::from_secs(3 * 86_400);
    Window {
        start,
        end: start + Duration::from_secs(3600),
    }
}

/// The `status` file as JSON.
fn status() -> Result<serde_json::Value> {
    let text =
        std::fs::read_to_string(Path::new(CONFIG_DIR).join("status")).context("reading the status file")?;
    serde_json::from_str(&text).with_context(|| format!("status is not JSON: {text}"))
}

/// Checks `status`'s result, from, to and bad_versions (versions without `v`).
fn expect_status(result: &str, from: &str, to: &str, bad: &[&str]) -> Result<serde_json::Value> {
    let st = status()?;
    ensure!(
        st["upgrader"] == "unit"
            && st["result"] == result
            && st["from"] == from
            && st["to"] == to
            && st["bad_versions"] == serde_json::json!(bad),
        "expected status {result} {from} -> {to} bad {bad:?}, found {st}"
    );
    Ok(st)
}

/// A stand-in `systemctl` playing the agent (see the module documentation); it logs its
/// arguments to `<dir>/systemctl.log` and never reports the versions listed in
/// `<dir>/never-reports`.
fn agent_playing_systemctl(dir: &Path) -> Result<PathBuf> {
    let path = dir.join("systemctl");
    let agent = Path::new(CONFIG_DIR).join("agent");
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\n\
             echo \"$@\" >> '{dir}/systemctl.log'\n\
             case \"$1\" in\n\
             is-active) exit 0 ;;\n\
             restart|try-restart|try-reload-or-restart)\n\
               v=$(/usr/bin/svc version | sed -n 's/^svc v//p')\n\
               if grep -qx \"$v\" '{dir}/never-reports' 2>/dev/null; then exit 0; fi\n\
               printf '{{\"version\":\"%s\",\"pid\":%s,\"heartbeat_at\":%s,\"diag_addr\":null}}\\n' \"$v\" $$ \"$(date +%s)\" > '{agent}.tmp'\n\
               mv '{agent}.tmp' '{agent}' ;;\n\
             esac\n",
            dir = dir.display(),
            agent = agent.display(),
        ),
    )?;
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    Ok(path)
}

/// The process group `pgid`'s members: (pid, comm, cmdline).
fn group_members(pgid: u32) -> Vec<(u32, String, String)> {
    let mut members = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return members;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid pgrp …; comm may hold spaces, so split after the last ')'.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = stat[open + 1..close].to_owned();
        let pgrp = stat[close + 1..]
            .split_whitespace()
            .nth(2)
            .and_then(|p| p.parse::<u32>().ok());
        if pgrp == Some(pgid) {
            let cmdline = std::fs::read(entry.path().join("cmdline"))
                .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
                .unwrap_or_default();
            members.push((pid, comm, cmdline));
        }
    }
    members
}

/// Starts `svc-upgrade run` in a process group of its own, waits until the package manager is
/// installing (dpkg unpacking for apt, `dnf`/`zypper install`), and kills the whole group with
/// SIGKILL: a power cut in the middle of an install.
async fn kill_mid_install(ca: &Path, state: &Path, installer: &str) -> Result<()> {
    let mut cmd = updater(ca, state, "run");
    // What svc-upgrade said, for the failure message if it ends before the install is seen.
    let log = tempfile::NamedTempFile::new()?;
    cmd.process_group(0).stdout(log.reopen()?).stderr(log.reopen()?);
    let mut child = cmd.spawn()?;
    let pgid = child.id().context("svc-upgrade pid")?;
    // apt: from `apt-get install` on (it runs dpkg for the unpack), a window wide enough for a
    // 5 ms poll on a loaded machine; dpkg alone can come and go between two polls.
    let installing = |comm: &str, cmdline: &str| match installer {
        "apt" => comm == "dpkg" || (comm.starts_with("apt") && cmdline.contains(" install ")),
        "yum" => comm == "dnf" && cmdline.contains(" install "),
        _ => comm == "zypper" && cmdline.contains(" install "),
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    loop {
        if let Some((pid, comm, cmdline)) = group_members(pgid)
            .into_iter()
            .find(|(_, comm, cmdline)| installing(comm, cmdline))
        {
            eprintln!("killing svc-upgrade's process group {pgid} while {comm} ({pid}) runs: {cmdline}");
            sh(std::process::Command::new("kill")
                .args(["-KILL", "--"])
                .arg(format!("-{pgid}")))?;
            break;
        }
        if let Some(status) = child.try_wait()? {
            anyhow::bail!(
                "svc-upgrade run finished ({status}) before the package manager was seen installing:\n{}",
                std::fs::read_to_string(log.path()).unwrap_or_default()
            );
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "no package manager install within 300 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .map_err(|_| anyhow::anyhow!("svc-upgrade did not exit within 60 s of SIGKILL"))??;
    ensure!(!status.success(), "svc-upgrade survived SIGKILL: {status}");
    Ok(())
}

/// The whole story for one installer; `held` tells whether the package manager holds `svc`.
pub(super) async fn updater_story(
    fixture: &Fixture,
    installer: &str,
    held: impl Fn() -> Result<bool>,
) -> Result<()> {
    // Enrol at v1 as the documentation says.
    sh(std::process::Command::new("/bin/bash")
        .arg(super::repo_root().join("deploy/install.sh"))
        .args([V1, "enterprise"])
        .env("SVC_REPO_URL", format!("file://{}", fixture.repo.display()))
        .env("SVC_INSTALLER", installer))?;
    assert_eq!(installed_svc_says()?, format!("svc v{V1}"));
    // The package announced the enrolment before any run.
    let st = expect_status("none", V1, V1, &[])?;
    ensure!(
        st["reason"] == "enrolled" && st["upgrader_version"] == V1,
        "initial status: {st}"
    );
    let said = sh(std::process::Command::new("/usr/bin/svc-upgrade").arg("version"))?;
    assert_eq!(said.trim(), format!("svc-upgrade v{V1}"), "the packaged updater");
    let help = sh(std::process::Command::new("/usr/bin/svc-upgrade").arg("help"))?;
    ensure!(
        ["run", "dry-run", "force", "version", "help"]
            .iter()
            .all(|c| help.contains(&format!("  {c} "))),
        "svc-upgrade help:\n{help}"
    );

    let tmp = tempfile::tempdir()?;
    let data = tmp.path().join("proxy");
    let state = tmp.path().join("state/state.json");
    let (v1, v2, v3) = (format!("v{V1}"), format!("v{V2}"), format!("v{V3}"));

    // 1. The channel serves v1; no schedule yet.
    let channel = Channel::start(&data, Some(V1), false).await?;
    let ca = channel.ca_file()?;
    set_endpoint(&channel.endpoint())?;
    let _ = std::fs::remove_file(Path::new(CONFIG_DIR).join("schedule"));
    let out = upgrade(&ca, &state, "dry-run").await?;
    ensure!(out.ok, "{out}");
    ensure!(
        out.stdout
            .contains(&format!("no upgrades available ({v1} == {v1})")),
        "{out}"
    );
    ensure!(out.stdout.contains("warning: no valid upgrade schedule"), "{out}");
    channel.proxy.shutdown().await;

    // 2. The channel moves to v2.
    let channel = Channel::start(&data, Some(V2), false).await?;
    set_endpoint(&channel.endpoint())?;
    let out = upgrade(&ca, &state, "dry-run").await?;
    ensure!(out.ok, "{out}");
    ensure!(
        out.stdout
            .contains(&format!("an upgrade is available ({v1} -> {v2})")),
        "{out}"
    );
    set_schedule(&[far_away()])?;
    let out = upgrade(&ca, &state, "run").await?;
    ensure!(out.ok, "{out}");
    ensure!(
        out.stdout
            .contains("upgrade is non-critical and we are outside of maintenance window, not attempting"),
        "{out}"
    );
    assert_eq!(installed_svc_says()?, format!("svc {v1}"));

    // 3. Faults, with a window open: nothing installed.
    set_schedule(&[window_around_now(600)])?;
    let out = upgrade(&ca, &state, "dry-run").await?;
    ensure!(
        out.stdout
            .contains("within maintenance window, upgrade will be attempted"),
        "{out}"
    );
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?;
    let closed_port = closed.local_addr()?.port();
    drop(closed);
    set_endpoint(&format!(
        "127.0.0.1:{closed_port}/v1/webapi/automaticupgrades/channel/default"
    ))?;
    let out = upgrade(&ca, &state, "run").await?;
    ensure!(
        !out.ok && out.stderr.contains("version server: GET https://127.0.0.1:"),
        "{out}"
    );
    // Nothing installed: `none`, the error as the reason.
    let st = expect_status("none", V1, "", &[])?;
    ensure!(
        st["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("version server: GET https://127.0.0.1:")),
        "{st}"
    );
    set_endpoint(&channel.garbage_endpoint())?;
    let out = upgrade(&ca, &state, "run").await?;
    ensure!(
        !out.ok
            && out
                .stderr
                .contains("invalid version \"<html>maintenance</html>\""),
        "{out}"
    );
    let ahead = Channel::start(&data, Some("19.0.0"), true).await?;
    set_endpoint(&ahead.endpoint())?;
    let out = upgrade(&ca, &state, "run").await?;
    ensure!(
        !out.ok
            && out
                .stderr
                .contains(&format!("refusing to move from {v1} to v19.0.0")),
        "{out}"
    );
    ahead.proxy.shutdown().await;
    assert_eq!(installed_svc_says()?, format!("svc {v1}"));
    ensure!(held()?, "a refused run left svc unheld");

    // 4. Inside the window, killed mid-install; the next run completes.
    set_endpoint(&channel.endpoint())?;
    kill_mid_install(&ca, &state, installer).await?;
    let after_kill = sh(std::process::Command::new("/usr/bin/svc").arg("version"))?;
    ensure!(
        after_kill.trim() == format!("svc {v1}") || after_kill.trim() == format!("svc {v2}"),
        "the agent binary after the kill: {after_kill}"
    );
    let out = upgrade(&ca, &state, "run").await?;
    ensure!(out.ok, "{out}");
    ensure!(out.stdout.contains("was interrupted; repairing"), "{out}");
    assert_eq!(installed_svc_says()?, format!("svc {v2}"));
    ensure!(held()?, "svc is not held after the repaired run");
    // No systemd on the test machine: the restart is reported, not attempted.
    let out = upgrade(&ca, &state, "run").await?;
    ensure!(
        out.ok
            && out
                .stdout
                .contains(&format!("no upgrades available ({v2} == {v2})")),
        "{out}"
    );
    channel.proxy.shutdown().await;

    // 5. A critical v3 outside the window installs at once.
    set_schedule(&[far_away()])?;
    let channel = Channel::start(&data, Some(V3), true).await?;
    set_endpoint(&channel.endpoint())?;
    let out = upgrade(&ca, &state, "run").await?;
    ensure!(out.ok, "{out}");
    ensure!(out.stdout.contains("upgrade is critical"), "{out}");
    ensure!(out.stdout.contains("systemd is not running"), "{out}");
    assert_eq!(installed_svc_says()?, format!("svc {v3}"));
    ensure!(held()?, "svc is not held after the critical install");
    channel.proxy.shutdown().await;

    // 6. Back to v1 by force; then proxies flipping between v2 and v3 in one window.
    let channel = Channel::start(&data, Some(V1), false).await?;
    set_endpoint(&channel.endpoint())?;
    let out = upgrade(&ca, &state, "run").await?;
    ensure!(!out.ok && out.stderr.contains("refusing to downgrade"), "{out}");
    let out = upgrade(&ca, &state, "force").await?;
    ensure!(out.ok, "{out}");
    assert_eq!(installed_svc_says()?, format!("svc {v1}"));
    channel.proxy.shutdown().await;

    let a = Channel::start(&data, Some(V2), false).await?;
    let b = Channel::start(&data, Some(V3), false).await?;
    set_schedule(&[window_around_now(300)])?;
    let mut installs = 0;
    for (round, proxy) in [&a, &b, &a, &b].into_iter().enumerate() {
        set_endpoint(&proxy.endpoint())?;
        let out = upgrade(&ca, &state, "run").await?;
        ensure!(out.ok, "round {round}: {out}");
        if out.stdout.contains("installed svc ") {
            installs += 1;
        }
        if round >= 1 {
            ensure!(
                out.stdout
                    .contains(&format!("already upgraded to {v2} in this maintenance window"))
                    || out
                        .stdout
                        .contains(&format!("no upgrades available ({v2} == {v2})")),
                "round {round}: {out}"
            );
        }
    }
    assert_eq!(
        installs, 1,
        "proxies flipping between versions caused more than one install"
    );
    assert_eq!(installed_svc_says()?, format!("svc {v2}"));
    a.proxy.shutdown().await;
    b.proxy.shutdown().await;

    // 7. Health and rollback: v3 never reports.
    let systemctl = agent_playing_systemctl(tmp.path())?;
    std::fs::write(tmp.path().join("never-reports"), format!("{V3}\n"))?;
    std::fs::write(Path::new(CONFIG_DIR).join("health-timeout"), "5\n")?;
    let channel = Channel::start(&data, Some(V3), false).await?;
    set_endpoint(&channel.endpoint())?;
    set_schedule(&[window_around_now(200)])?;
    let out = upgrade_with(&ca, &state, "run", Some(&systemctl)).await?;
    ensure!(out.ok, "a rollback is a finished run: {out}");
    for line in [
        format!("installed svc {v3} and held it"),
        format!("waiting up to 5s (health-timeout) for {v3} to prove healthy"),
        format!("{v3} did not prove healthy: no heartbeat with {V3} within 5s"),
        format!("reinstalled svc {v2} and held it"),
        format!("rolled back from {v3} to {v2}"),
    ] {
        ensure!(out.stdout.contains(&line), "no {line:?} in:\n{out}");
    }
    assert_eq!(installed_svc_says()?, format!("svc {v2}"));
    ensure!(held()?, "svc is not held after the rollback");
    let st = expect_status("rolled_back", V3, V2, &[V3])?;
    ensure!(
        st["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with(&format!("no heartbeat with {V3} within 5s"))),
        "{st}"
    );
    let log = std::fs::read_to_string(tmp.path().join("systemctl.log"))?;
    assert_eq!(
        log,
        "is-active --quiet svc.service\ntry-restart svc.service\nreset-failed svc.service\nrestart svc.service\n",
        "the restarts"
    );
    // The agent reports v2 again after the rollback's restart.
    let agent: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(Path::new(CONFIG_DIR).join("agent"))?)?;
    assert_eq!(agent["version"], V2);

    // The next window: v3 is not tried again.
    set_schedule(&[window_around_now(100)])?;
    let out = upgrade_with(&ca, &state, "run", Some(&systemctl)).await?;
    ensure!(
        out.ok
            && out
                .stdout
                .contains(&format!("not installing {v3}: it was installed before"))
            && !out.stdout.contains("installed svc"),
        "{out}"
    );
    assert_eq!(installed_svc_says()?, format!("svc {v2}"));
    expect_status("none", V2, V3, &[V3])?;

    // force clears the list; v3 reports this time: updated.
    std::fs::remove_file(tmp.path().join("never-reports"))?;
    let out = upgrade_with(&ca, &state, "force", Some(&systemctl)).await?;
    ensure!(
        out.ok
            && out
                .stdout
                .contains(&format!("force: cleared the versions marked bad ({v3})"))
            && out.stdout.contains(&format!("{v3} is healthy")),
        "{out}"
    );
    assert_eq!(installed_svc_says()?, format!("svc {v3}"));
    ensure!(held()?, "svc is not held after the forced install");
    expect_status("updated", V2, V3, &[])?;
    channel.proxy.shutdown().await;
    Ok(())
}
