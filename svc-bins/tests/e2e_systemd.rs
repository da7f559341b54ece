//! The whole automatic-update loop under a real systemd, as an operator follows the docs.
//!
//! A Debian container booted by `systemd-nspawn -b` (on a throw-away overlay of this machine's
//! root, sharing its network: see `systemd/mod.rs`) installs svc v1 from the project's own signed
//! apt repository with `deploy/install.sh`, joins a cluster running on the host (the real `svc`
//! all-in-one) through its Proxy Service, and is enrolled in automatic updates by the
//! `svc-ent-updater` package. The cluster's `default` channel forwards to a version server the
//! test controls; the maintenance window is the current hour (`tctl create`).
//!
//! 1. v1 = this build of `svc` (the workspace version, 17.0.0-dev); the inventory shows the
//!    agent at v1 with the updater `unit`.
//! 2. v2 (17.0.1, a real `svc` stamped with `SVC_BUILD_VERSION`) published:
//!    `systemctl start svc-upgrade.service` installs it, systemd restarts svc, which serves
//!    (`/readyz`) and heartbeats; the inventory says v2, `unit`, updated 17.0.0-dev → 17.0.1.
//! 3. `systemctl reload svc` leaves svc running: the same unit and main process, serving and
//!    heartbeating.
//! 4. v3 (17.0.2, an `svc` that exits at start) published as critical: the updater installs it,
//!    sees no healthy agent within `health-timeout`, reinstalls v2; svc serves again and the
//!    inventory says rolled back 17.0.2 → 17.0.1 with the reason.
//! 5. The timer fires once (the packaged timer's schedule, shortened by a drop-in): the run does
//!    not try v3 again.
//!
//! The container's svc runs with `--insecure` (a drop-in): the cluster's proxy has a
//! self-signed certificate. svc-upgrade trusts it through `SVC_UPGRADE_CA_FILE`.
//!
//! Needs root, `systemd-container`, overlayfs, and the tools of the package build (`dpkg-dev`,
//! `apt-utils`, `gnupg`, `binutils`). Runs alone with
//! `cargo nextest run -p svc-bins --test e2e_systemd`.

mod common;
mod systemd;
#[path = "../../svc-update/tests/support/version_server.rs"]
mod version_server;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{Cluster, SVC, agent::curl};
use serde_json::Value;
use svc_testkit::{free_port, require};
use systemd::{AptRepo, Machine, Ran, keep_binaries, must, stamped_binaries, target_dir};
use version_server::VersionServer;

/// This build's own version (the workspace version: no stamp).
const V1: &str = "17.0.0-dev";
/// A real `svc`, stamped. The last stamp `svc-update`'s `linux_packages` builds, so the stamped
/// target directory they share ends on it whichever runs first.
const V2: &str = "17.0.1";
/// An `svc` that exits at start.
const V3: &str = "17.0.2";
/// The agent's node name.
const NODE: &str = "nspawn-agent";
/// How long the updater waits for proof of health (`health-timeout`), seconds.
const HEALTH_TIMEOUT: u64 = 90;
/// How long the agent may take to start, join and heartbeat (a debug build on a busy machine),
/// and a version change to reach the proxy's one-minute cache of the forwarded channel.
const SETTLE: Duration = Duration::from_secs(150);
/// One `svc-upgrade` run: install, restart, the health wait, a rollback.
const UPGRADE_RUN: Duration = Duration::from_secs(HEALTH_TIMEOUT * 2 + 240);

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs()
}

/// A version as the package files and the inventory may write it, compared without `v` and with
/// the package manager's `~` read as semver's `-`.
fn bare(v: &str) -> String {
    v.trim().trim_start_matches('v').replace('~', "-")
}

/// Whether a run's journal says it installed `version` (svc-upgrade's `installing svc v<version>
/// with <package manager>`).
fn tried(journal: &str, version: &str) -> bool {
    journal
        .lines()
        .any(|l| l.contains("installing svc") && l.contains(&format!("v{version} ")))
}

/// The string field `key` of a JSON value (`""` when absent).
fn text(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or_default().to_owned()
}

/// A `svc` that fails at start, as a broken release would (it still answers `version`).
fn broken_build(dir: &Path, version: &str, updater_from: &Path) -> std::path::PathBuf {
    let bin = dir.join("bin").join(version);
    let _ = std::fs::remove_dir_all(&bin);
    std::fs::create_dir_all(&bin).expect("v3 binary directory");
    let svc = bin.join("svc");
    std::fs::write(
        &svc,
        format!(
            "#!/bin/sh\n# svc {version}: a release that cannot start.\nif [ \"$1\" = version ]; then echo \"svc v{version}\"; exit 0; fi\necho \"svc {version}: fatal: cannot start (a broken release)\" >&2\nexit 1\n"
        ),
    )
    .expect("writing the broken svc");
    std::fs::set_permissions(&svc, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("mode of the broken svc");
    std::fs::copy(updater_from, bin.join("svc-upgrade")).expect("copying svc-upgrade");
    bin
}

struct Scene {
    cluster: Cluster,
    machine: Machine,
    diag: String,
}

impl Scene {
    /// `tctl inventory ls --format json`'s row for the agent, if listed.
    fn inventory_row(&self) -> Option<Value> {
        let out = self
            .cluster
            .tctl_admin(&["inventory", "ls", "--format", "json"], None)
            .ok();
        let rows: Vec<Value> = serde_json::from_str(&out.stdout)
            .unwrap_or_else(|e| panic!("tctl inventory ls --format json: {e}: {}", out.stdout));
        rows.into_iter().find(|r| text(r, "hostname") == NODE)
    }

    /// Waits until the agent's inventory row satisfies `cond`; returns it, or what was seen.
    fn wait_inventory(&self, what: &str, cond: impl Fn(&Value) -> bool) -> Result<Value, String> {
        let mut last = None;
        self.machine
            .try_wait_for(
                SETTLE,
                what,
                || {
                    last = self.inventory_row();
                    last.as_ref().is_some_and(&cond)
                },
                || {
                    format!(
                        "inventory row of {NODE}: {}\nagent file: {:?}\nstatus file: {:?}",
                        self.inventory_row()
                            .map(|r| r.to_string())
                            .unwrap_or_else(|| "none".into()),
                        self.machine.read("/etc/svc-upgrade.d/agent"),
                        self.machine.read("/etc/svc-upgrade.d/status"),
                    )
                },
            )
            .map(|()| last.expect("the row the wait saw"))
    }

    /// The updater's `status` file, parsed (`Err` says what is there instead).
    fn status(&self) -> Result<Value, String> {
        let raw = self
            .machine
            .read("/etc/svc-upgrade.d/status")
            .ok_or("no /etc/svc-upgrade.d/status in the container")?;
        serde_json::from_str(&raw).map_err(|e| format!("status file {raw:?}: {e}"))
    }

    /// The installed `svc` package's version (`dpkg-query`).
    fn installed(&self) -> String {
        bare(&self.machine.sh("dpkg-query -W -f='${Version}' svc"))
    }

    /// Waits until svc.service is active and its `/readyz` answers 200.
    fn wait_serving(&self, what: &str) {
        let url = format!("http://{}/readyz", self.diag);
        self.machine.wait_for(
            SETTLE,
            what,
            || self.machine.show("svc.service", "ActiveState") == "active" && curl(&url).0 == "200",
            || {
                format!(
                    "svc.service: {} (MainPID {}); /readyz: {:?}\n--- svc journal\n{}",
                    self.machine.show("svc.service", "ActiveState"),
                    self.machine.show("svc.service", "MainPID"),
                    curl(&url),
                    self.machine.journal("svc.service")
                )
            },
        );
    }

    /// Runs `systemctl start svc-upgrade.service` (a oneshot: returns when the run is over) and
    /// the run's journal.
    fn upgrade_run(&self) -> (Ran, String) {
        let ran = self
            .machine
            .exec_within(&["systemctl", "start", "svc-upgrade.service"], UPGRADE_RUN);
        let id = self.machine.show("svc-upgrade.service", "InvocationID");
        // journald stores the run's lines asynchronously: a query right after the unit ended
        // may find none yet (seen as "-- No entries --" after a run that had installed).
        let has_lines = |j: &str| {
            j.lines()
                .any(|l| !l.trim().is_empty() && !l.starts_with("-- No entries"))
        };
        let _ = self.machine.try_wait_for(
            Duration::from_secs(15),
            "the run's lines in the journal",
            || has_lines(&self.invocation_journal(&id)),
            String::new,
        );
        (ran, self.invocation_journal(&id))
    }

    fn invocation_journal(&self, id: &str) -> String {
        self.machine
            .exec(&[
                "journalctl",
                "--no-pager",
                &format!("_SYSTEMD_INVOCATION_ID={id}"),
            ])
            .stdout
    }

    /// Publishes `version` (critical or not) upstream and waits until the proxy serves both
    /// answers (it caches a forwarded channel for a minute): the updater run that follows must see
    /// the pair.
    fn publish(&self, versions: &VersionServer, version: &str, critical: bool, ca: &Path) {
        versions.set(&format!("v{version}"), critical);
        let base = format!(
            "https://{}/v1/webapi/automaticupgrades/channel/default",
            self.cluster.web_addr
        );
        let curl_bin = require("curl", "curl");
        let said = std::cell::RefCell::new(String::new());
        let expected = [
            ("version", format!("v{version}")),
            ("critical", if critical { "yes" } else { "no" }.to_owned()),
        ];
        self.machine.wait_for(
            SETTLE,
            &format!("the proxy advertising v{version} (critical: {critical})"),
            || {
                let mut answers = Vec::new();
                for (what, _) in &expected {
                    let out = Command::new(&curl_bin)
                        .args(["-sS", "--max-time", "10", "--cacert"])
                        .arg(ca)
                        .arg(format!("{base}/{what}"))
                        .output();
                    let text = out
                        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
                        .unwrap_or_default();
                    answers.push(text);
                }
                *said.borrow_mut() = answers.join(", ");
                expected.iter().zip(&answers).all(|((_, want), got)| want == got)
            },
            || format!("the proxy said {:?} (version, critical)", said.borrow()),
        );
    }
}

#[test]
fn the_update_loop_under_real_systemd() {
    let started = std::time::Instant::now();
    let uid = must(Command::new("id").arg("-u"), "id -u");
    assert_eq!(
        uid.trim(),
        "0",
        "this test boots a container and mounts file systems: run it as root (on a throw-away machine)"
    );
    require("systemd-nspawn", "systemd-container");
    require("curl", "curl");

    // The three releases and the signed repository holding them.
    let work = target_dir().join("svc-e2e-systemd");
    let v1 = keep_binaries(
        &work,
        V1,
        Path::new(SVC),
        Path::new(env!("CARGO_BIN_EXE_svc-upgrade")),
    );
    let v2 = stamped_binaries(&work, V2);
    let v3 = broken_build(&work, V3, &v2.join("svc-upgrade"));
    let repo = AptRepo::build(&work.join("apt"), &[(V1, &v1), (V2, &v2), (V3, &v3)]);
    eprintln!("releases and repository ready after {:.1?}", started.elapsed());

    // The channel: a version server the cluster's `default` channel forwards to, at v1.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let versions = runtime.block_on(VersionServer::start("default", &format!("v{V1}"), false));
    let cluster = Cluster::start_with(
        tempfile::tempdir().expect("tempdir"),
        "info",
        &format!(
            "auth_service:\n  listen_addr: 127.0.0.1:0\n  cluster_name: e2e.test\nproxy_service:\n  web_listen_addr: 127.0.0.1:0\n  automatic_upgrades_channels:\n    default:\n      forward_url: {}/v1/webapi/automaticupgrades/channel/default\n",
            versions.url()
        ),
    );
    let proxy_ca = cluster.data_dir.join("proxy-ca.pem");
    assert!(proxy_ca.is_file(), "the cluster wrote no {}", proxy_ca.display());

    // The maintenance window: the current hour (the next one when this one is nearly over, then
    // the first run waits for it to open).
    let secs = now();
    let mut window_start = secs - secs % 3600;
    if secs % 3600 > 55 * 60 {
        window_start += 3600;
    }
    let hour = (window_start / 3600) % 24;
    let maintenance = cluster.write(
        "maintenance.yaml",
        &format!(
            "kind: cluster_maintenance_config\nversion: v1\nmetadata:\n  name: cluster-maintenance-config\nspec:\n  agent_upgrades:\n    utc_start_hour: {hour}\n    weekdays: [Mon, Tue, Wed, Thu, Fri, Sat, Sun]\n"
        ),
    );
    cluster
        .tctl_admin(&["create", &maintenance.to_string_lossy()], None)
        .ok();
    let token = cluster
        .tctl_admin(&["tokens", "add", "--type=node", "--format", "json"], None)
        .ok();
    let token: Value = serde_json::from_str(&token.stdout).expect("token json");

    // The container, with the repository bind-mounted.
    // Named after this process, so runs on one machine never share a layer.
    let machine = Machine::boot(
        &format!("svc-e2e-{}", std::process::id()),
        &[(&repo.base, "/srv/svc-repo")],
    );
    let diag = format!("127.0.0.1:{}", free_port("127.0.0.1"));
    let scene = Scene {
        cluster,
        machine,
        diag,
    };
    let m = &scene.machine;
    let none = m.exec(&["dpkg-query", "-W", "svc"]);
    assert!(!none.ok, "svc is already installed in the container: {none}");

    // Install v1 and the updater as the docs say.
    m.write(
        "/root/install.sh",
        &std::fs::read_to_string(systemd::repo_root().join("deploy/install.sh")).expect("install.sh"),
    );
    let install = m.exec_within(
        &[
            "env",
            "SVC_REPO_URL=file:///srv/svc-repo",
            "bash",
            "/root/install.sh",
            V1,
            "enterprise",
        ],
        Duration::from_secs(300),
    );
    assert!(install.ok, "install.sh {V1} enterprise failed:\n{install}");
    assert_eq!(scene.installed(), V1);
    assert_eq!(m.sh("svc version").trim(), format!("svc v{V1}"));
    assert!(m.sh("apt-mark showhold").contains("svc"), "svc is not held");
    // The package enabled its timer on the packaged schedule.
    assert_eq!(m.show("svc-upgrade.timer", "UnitFileState"), "enabled");
    assert_eq!(m.show("svc-upgrade.timer", "ActiveState"), "active");
    let calendar = m.show("svc-upgrade.timer", "TimersCalendar");
    assert!(calendar.contains("*-*-* *:00/30:00"), "{calendar}");
    let timers = m.sh("systemctl list-timers --all --no-pager svc-upgrade.timer");
    assert!(timers.contains("svc-upgrade.service"), "{timers}");
    // The test starts the runs itself until step 4, so the timer cannot start one in between.
    m.sh("systemctl stop svc-upgrade.timer");

    // Join the host's cluster and start svc under systemd.
    m.write(
        "/etc/svc.yaml",
        &format!(
            "version: v1\nsvc:\n  nodename: {NODE}\n  data_dir: /var/lib/svc\n  proxy_server: {}\n  auth_token: {}\n  ca_pin: {}\n  diag_addr: {}\n  log:\n    severity: info\nauth_service:\n  enabled: false\nproxy_service:\n  enabled: false\nssh_service:\n  enabled: true\n",
            scene.cluster.web_addr,
            text(&token, "token"),
            text(&token, "ca_pin"),
            scene.diag
        ),
    );
    // svc-upgrade trusts the cluster's self-signed proxy certificate, and waits at most
    // HEALTH_TIMEOUT for the new version's proof of health.
    m.write(
        "/etc/svc-upgrade-ca.pem",
        &std::fs::read_to_string(&proxy_ca).expect("proxy CA"),
    );
    m.write(
        "/etc/default/svc-upgrade",
        "SVC_UPGRADE_CA_FILE=/etc/svc-upgrade-ca.pem\n",
    );
    m.write(
        "/etc/svc-upgrade.d/health-timeout",
        &format!("{HEALTH_TIMEOUT}\n"),
    );
    // The cluster's proxy presents a self-signed certificate, which svc accepts only with
    // `svc start --insecure` (the SSH inside the tunnel is still checked against the pinned
    // cluster CA): a drop-in, as an operator of such a lab would write it.
    m.write(
        "/etc/systemd/system/svc.service.d/insecure-proxy.conf",
        "[Service]\nExecStart=\nExecStart=/usr/bin/svc start --insecure --config /etc/svc.yaml\n",
    );
    m.sh("systemctl daemon-reload && systemctl enable --now svc");
    scene.wait_serving("svc v1 serving under systemd");
    let endpoint = format!(
        "{}/v1/webapi/automaticupgrades/channel/default",
        scene.cluster.web_addr
    );
    m.wait_for(
        SETTLE,
        "the agent exporting its schedule and endpoint",
        || {
            let schedule = m.read("/etc/svc-upgrade.d/schedule").unwrap_or_default();
            schedule.lines().any(|l| {
                l.split_whitespace().next().and_then(|s| s.parse::<u64>().ok()) == Some(window_start)
            }) && m
                .read("/etc/svc-upgrade.d/endpoint")
                .is_some_and(|e| e.trim() == endpoint)
        },
        || {
            format!(
                "schedule: {:?}\nendpoint: {:?} (expected {endpoint})\n--- svc journal\n{}",
                m.read("/etc/svc-upgrade.d/schedule"),
                m.read("/etc/svc-upgrade.d/endpoint"),
                m.journal("svc.service")
            )
        },
    );

    // Enrolment: the inventory shows the agent at v1 with the packaged updater, whose initial
    // status says it is enrolled.
    let row = scene
        .wait_inventory("the agent at v1 in the inventory", |r| {
            bare(&text(r, "version")) == V1
        })
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("enrolled: {row}");
    check(
        "the inventory shows the updater `unit` at v1",
        scene
            .wait_inventory("the inventory showing the updater `unit`", |r| {
                text(r, "upgrader") == "unit" && bare(&text(r, "upgrader_version")) == V1
            })
            .map(drop),
    );
    check(
        "the inventory shows the next maintenance window the agent exported",
        scene
            .wait_inventory("the inventory showing the next window", |r| {
                r["next_window"]["start"].as_u64() == Some(window_start)
            })
            .map(drop),
    );
    check(
        "the package's initial status",
        scene
            .status()
            .and_then(|s| expect(text(&s, "upgrader") == "unit" && text(&s, "result") == "none", &s)),
    );

    // Step 2: v2 published; one run in the window installs it, systemd restarts svc.
    scene.publish(&versions, V2, false, &proxy_ca);
    m.wait_for(
        Duration::from_secs(6 * 60),
        "the maintenance window opening",
        || now() >= window_start,
        String::new,
    );
    let pid_v1 = m.show("svc.service", "MainPID");
    let (run, journal) = scene.upgrade_run();
    assert!(run.ok, "the v2 run failed: {run}\n--- journal\n{journal}");
    assert!(tried(&journal, V2), "the v2 run did not install v2:\n{journal}");
    assert_eq!(scene.installed(), V2, "after the v2 run:\n{journal}");
    assert!(m.sh("apt-mark showhold").contains("svc"), "svc is not held at v2");
    assert_eq!(m.sh("svc version").trim(), format!("svc v{V2}"));
    scene.wait_serving("svc v2 serving after the update");
    assert_ne!(
        m.show("svc.service", "MainPID"),
        pid_v1,
        "systemd did not restart svc after the update:\n{journal}"
    );
    let row = scene
        .wait_inventory("the inventory showing v2", |r| bare(&text(r, "version")) == V2)
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("after the v2 run: {row}");
    check(
        "the status of the v2 run",
        scene.status().and_then(|s| {
            expect(
                text(&s, "result") == "updated"
                    && bare(&text(&s, "from")) == V1
                    && bare(&text(&s, "to")) == V2,
                &s,
            )
        }),
    );
    check(
        "the inventory reporting updated v1→v2",
        scene
            .wait_inventory("the inventory showing `unit`, updated v1→v2", |r| {
                let s = &r["update_status"];
                text(r, "upgrader") == "unit"
                    && text(s, "result") == "updated"
                    && bare(&text(s, "from")) == V1
                    && bare(&text(s, "to")) == V2
            })
            .map(drop),
    );

    // Step 3: `systemctl reload svc` leaves svc running: the same unit and main process,
    // serving and heartbeating.
    let pid = m.show("svc.service", "MainPID");
    let reloaded_at = now();
    m.sh("systemctl reload svc");
    scene.wait_serving("svc serving after systemctl reload");
    assert_eq!(
        m.show("svc.service", "MainPID"),
        pid,
        "reload replaced the main process"
    );
    let journal = m.journal("svc.service");
    assert!(
        journal.contains("SIGHUP"),
        "svc did not log the reload:\n{journal}"
    );
    m.wait_for(
        SETTLE,
        "a heartbeat after the reload",
        || {
            curl(&format!("http://{}/metrics", scene.diag))
                .1
                .lines()
                .any(|l| l.starts_with("svc_heartbeats_total ") && !l.ends_with(" 0"))
        },
        || m.journal("svc.service"),
    );
    check(
        "the agent file recording a heartbeat after the reload",
        m.try_wait_for(
            SETTLE,
            "the agent file recording a heartbeat after the reload",
            || {
                m.read("/etc/svc-upgrade.d/agent")
                    .and_then(|t| serde_json::from_str::<Value>(&t).ok())
                    .is_some_and(|a| {
                        bare(&text(&a, "version")) == V2
                            && a["heartbeat_at"].as_u64().is_some_and(|at| at >= reloaded_at)
                    })
            },
            || format!("agent file: {:?}", m.read("/etc/svc-upgrade.d/agent")),
        ),
    );

    // Step 4: v3, which cannot start, published as critical: installed, unhealthy, rolled back.
    scene.publish(&versions, V3, true, &proxy_ca);
    let (run, journal) = scene.upgrade_run();
    eprintln!("the v3 run: {run}\n--- journal\n{journal}");
    assert!(tried(&journal, V3), "the v3 run did not install v3:\n{journal}");
    check(
        "the rollback to v2",
        expect(
            scene.installed() == V2,
            &format!("svc {} installed", scene.installed()),
        ),
    );
    assert!(
        m.sh("apt-mark showhold").contains("svc"),
        "svc is not held after the v3 run"
    );
    scene.wait_serving("svc v2 serving again after the rollback");
    assert_eq!(m.sh("svc version").trim(), format!("svc v{V2}"));
    let pid_rolled_back = m.show("svc.service", "MainPID");
    check(
        "the status of the rollback",
        scene.status().and_then(|s| {
            let bad: Vec<String> = s["bad_versions"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_str).map(bare).collect())
                .unwrap_or_default();
            expect(
                text(&s, "result") == "rolled_back"
                    && bare(&text(&s, "from")) == V3
                    && bare(&text(&s, "to")) == V2
                    && !text(&s, "reason").is_empty()
                    && bad.contains(&V3.to_owned()),
                &s,
            )
        }),
    );
    check(
        "the inventory reporting rolled back v3→v2 with the reason",
        scene
            .wait_inventory("the inventory showing rolled back v3→v2", |r| {
                let s = &r["update_status"];
                bare(&text(r, "version")) == V2
                    && text(s, "result") == "rolled_back"
                    && bare(&text(s, "from")) == V3
                    && bare(&text(s, "to")) == V2
                    && !text(s, "reason").is_empty()
            })
            .map(|row| eprintln!("after the v3 run: {row}")),
    );

    // Step 5: the timer fires once; its run leaves v2 alone.
    let before = m.show("svc-upgrade.service", "InvocationID");
    m.write(
        "/etc/systemd/system/svc-upgrade.timer.d/e2e.conf",
        "# The test's timer: every 15 s instead of every 30 minutes.\n[Timer]\nOnCalendar=\nOnCalendar=*-*-* *:*:00/15\nRandomizedDelaySec=0\nAccuracySec=1s\n",
    );
    m.sh("systemctl daemon-reload && systemctl start svc-upgrade.timer");
    m.wait_for(
        Duration::from_secs(60) + UPGRADE_RUN,
        "the timer starting svc-upgrade.service once, to its end",
        || {
            let id = m.show("svc-upgrade.service", "InvocationID");
            let state = m.show("svc-upgrade.service", "ActiveState");
            !id.is_empty() && id != before && (state == "inactive" || state == "failed")
        },
        || m.sh("systemctl list-timers --all --no-pager svc-upgrade.timer"),
    );
    m.sh("systemctl stop svc-upgrade.timer");
    let journal = scene.invocation_journal(&m.show("svc-upgrade.service", "InvocationID"));
    eprintln!("the timer's run:\n{journal}");
    check(
        "the timer's run not trying v3 again",
        expect(
            !tried(&journal, V3)
                && scene.installed() == V2
                && m.show("svc.service", "MainPID") == pid_rolled_back,
            &journal,
        ),
    );
    check(
        "the status of the timer's run",
        scene
            .status()
            .and_then(|s| expect(text(&s, "result") == "none", &s)),
    );
    eprintln!("the update loop under systemd: {:.1?} in all", started.elapsed());
}

/// A check of what issue #15 adds to the agent (the `agent` and `status` files, the inventory's
/// updater and update status) and to svc-upgrade (health check, rollback, bad versions).
#[track_caller]
fn check(what: &str, result: Result<(), String>) {
    if let Err(e) = result {
        panic!("{what}: {e}");
    }
}

/// `Ok` when `ok`, else an error showing `seen`.
fn expect(ok: bool, seen: &dyn std::fmt::Display) -> Result<(), String> {
    if ok { Ok(()) } else { Err(format!("found: {seen}")) }
}
