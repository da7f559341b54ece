//! One `svc start --insecure --config …` process of a multi-process cluster (an Auth Service
//! alone, a proxy apart, …), read up to its `svc: ready` banner and killed on drop; and the
//! join tokens such clusters are built with.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::{SVC, run_client, wait};

/// One `svc start` process; killed on drop (its log printed when the test is failing).
pub struct Svc {
    child: Option<Child>,
    stderr: PathBuf,
    lines: Vec<(String, String)>,
}

impl Svc {
    /// Starts `svc start --insecure --config CONFIG`, its stderr in `stderr`, and reads its
    /// banner up to `svc: ready` (within [`wait::STEP`]).
    pub fn start(config: &Path, stderr: PathBuf) -> Svc {
        Self::start_with_env(config, stderr, &[])
    }

    /// Like [`start`](Self::start), with `env` set for the process.
    pub fn start_with_env(config: &Path, stderr: PathBuf, env: &[(&str, &str)]) -> Svc {
        let err = std::fs::File::create(&stderr).expect("stderr file");
        let mut child = Command::new(SVC)
            .args(["start", "--insecure", "--config"])
            .arg(config)
            .envs(env.iter().copied())
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .expect("spawn svc");
        let mut lines = Vec::new();
        let banner = wait::first_line(child.stdout.take().expect("stdout"), wait::STEP, move |line| {
            if let Some((k, v)) = line.trim().split_once(": ") {
                lines.push((k.to_owned(), v.to_owned()));
            }
            (line.trim() == "svc: ready").then(|| lines.clone())
        });
        match banner {
            Ok(lines) => Svc {
                child: Some(child),
                stderr,
                lines,
            },
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "svc did not start ({e}):\n{}",
                    std::fs::read_to_string(&stderr).unwrap_or_default()
                );
            }
        }
    }

    /// The value of the banner's `KEY: value` line (`auth`, `web`, …).
    pub fn line(&self, key: &str) -> String {
        self.lines
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no `{key}:` line in the banner: {:?}", self.lines))
    }

    /// Everything it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Kills it with SIGKILL (no graceful shutdown) and reaps it.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("kill -9 svc");
            let _ = child.wait();
        }
    }
}

impl Drop for Svc {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!("--- {} ---\n{}", self.stderr.display(), self.log());
        }
    }
}

/// A join token of `kind` (`proxy`, `node`, …) and the CA pin, made with `tctl` on the Auth
/// Service's data directory `auth_data`.
pub fn token(auth_data: &Path, home: &Path, kind: &str) -> (String, String) {
    token_with(super::TCTL, auth_data, home, kind)
}

/// Like [`token`], with the `tctl` binary at `tctl`.
pub fn token_with(tctl: &str, auth_data: &Path, home: &Path, kind: &str) -> (String, String) {
    let data = auth_data.to_string_lossy().into_owned();
    let out = run_client(
        tctl,
        home,
        &[
            "--data-dir",
            &data,
            "tokens",
            "add",
            &format!("--type={kind}"),
            "--format",
            "json",
        ],
        None,
    )
    .ok();
    let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("token json");
    (
        v["token"].as_str().expect("token").to_owned(),
        v["ca_pin"].as_str().expect("ca_pin").to_owned(),
    )
}
