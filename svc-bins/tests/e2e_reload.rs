//! `systemctl reload svc` (the unit's `ExecReload` sends SIGHUP, and so does the Linux updater's
//! `restart-mode: reload`): svc drains and starts again in place — same PID, configuration and
//! certificates read again — and keeps serving. Before, SIGHUP killed the process.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{SVC, TCTL};

/// The next line from svc's stdout that starts with `prefix`, within `limit`; on failure the
/// panic shows what svc wrote to `stderr`.
fn line_starting(rx: &mpsc::Receiver<String>, prefix: &str, limit: Duration, stderr: &Path) -> String {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.trim().starts_with(prefix) => return line.trim().to_owned(),
            Ok(_) => continue,
            Err(e) => panic!(
                "svc printed no line starting with {prefix:?} within {limit:?} ({e}); its stderr:\n{}",
                std::fs::read_to_string(stderr).unwrap_or_default()
            ),
        }
    }
}

#[test]
fn sighup_restarts_svc_in_place_and_it_keeps_serving() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let config = dir.path().join("svc.yaml");
    std::fs::write(
        &config,
        format!(
            "version: v1\nsvc:\n  data_dir: {}\n  log:\n    severity: warn\nauth_service:\n  listen_addr: 127.0.0.1:0\n  cluster_name: reload.test\nproxy_service:\n  web_listen_addr: 127.0.0.1:0\nssh_service:\n  enabled: false\n",
            data.display()
        ),
    )
    .expect("write config");
    let stderr_path = dir.path().join("svc.stderr");
    let stderr = std::fs::File::create(&stderr_path).expect("stderr file");
    let mut child = Command::new(SVC)
        .args(["start", "--config"])
        .arg(&config)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("spawn svc");
    let pid = child.id();
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let step = Duration::from_secs(90);
    let first_pin = line_starting(&rx, "CA pin: ", step, &stderr_path);
    line_starting(&rx, "svc: ready", step, &stderr_path);

    let status = Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -HUP failed");
    line_starting(&rx, "svc: SIGHUP: draining", step, &stderr_path);
    // The same process (exec keeps the PID) announces itself again: same cluster, same CAs.
    let second_pin = line_starting(&rx, "CA pin: ", step, &stderr_path);
    line_starting(&rx, "svc: ready", step, &stderr_path);
    assert_eq!(
        first_pin, second_pin,
        "the restarted svc must keep the cluster's CAs"
    );
    assert!(
        child.try_wait().expect("try_wait").is_none(),
        "svc exited after SIGHUP: {}",
        std::fs::read_to_string(dir.path().join("svc.stderr")).unwrap_or_default()
    );

    // It serves: tctl on this host reaches the Auth API at its new address.
    let out = common::wait::run_within(
        Command::new(TCTL).args(["--data-dir"]).arg(&data).arg("status"),
        step,
        "tctl status after the reload",
    )
    .expect("tctl");
    assert!(
        out.status.success(),
        "tctl status failed after the reload: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("reload.test"));

    let _ = Command::new("kill").arg(pid.to_string()).status();
    let code = common::wait::wait_exit(&mut child, step, "svc after SIGTERM");
    assert!(code.success(), "svc exited with {code} after SIGTERM");
}
