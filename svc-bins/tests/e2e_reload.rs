//! `systemctl reload svc` (the unit's `ExecReload` sends SIGHUP, and so does the Linux updater's
//! `restart-mode: reload`): svc drains and starts again in place — same PID, configuration and
//! certificates read again — and keeps serving. Before, SIGHUP killed the process.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{SVC, TCTL};

/// svc's stdout, line by line, and what it wrote to standard error.
struct Output<'a> {
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
    stderr: &'a Path,
}

impl Output<'_> {
    /// The next line from svc's stdout that starts with `prefix`, within `limit`; on failure the
    /// panic shows every line svc printed, what it wrote to standard error and, when its stdout
    /// closed, how it ended.
    fn line_starting(&mut self, prefix: &str, limit: Duration, child: &mut Child) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.trim().starts_with(prefix) {
                        return line.trim().to_owned();
                    }
                }
                Err(e) => {
                    let ended = match e {
                        mpsc::RecvTimeoutError::Disconnected => {
                            match common::wait::wait_exit_within(child, Duration::from_secs(10)) {
                                Some(status) => format!("svc ended: {status}"),
                                None => "svc closed its stdout and is still running".to_owned(),
                            }
                        }
                        mpsc::RecvTimeoutError::Timeout => "svc is still running".to_owned(),
                    };
                    panic!(
                        "svc printed no line starting with {prefix:?} within {limit:?} ({e}); {ended}\n\
                         its stdout:\n{}\nits stderr:\n{}",
                        self.seen.join("\n"),
                        std::fs::read_to_string(self.stderr).unwrap_or_default()
                    )
                }
            }
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
    let mut out = Output {
        lines: rx,
        seen: Vec::new(),
        stderr: &stderr_path,
    };
    let step = Duration::from_secs(90);
    let first_pin = out.line_starting("CA pin: ", step, &mut child);
    out.line_starting("svc: ready", step, &mut child);

    let status = Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -HUP failed");
    out.line_starting("svc: SIGHUP: draining", step, &mut child);
    // The same process (exec keeps the PID) announces itself again: same cluster, same CAs.
    let second_pin = out.line_starting("CA pin: ", step, &mut child);
    out.line_starting("svc: ready", step, &mut child);
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
