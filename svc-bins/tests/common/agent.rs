//! A standalone `svc start` agent process, as `e2e_agent.rs` and `e2e_direct.rs` run it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// A `svc start` agent process; killed on drop.
pub struct Agent {
    child: Child,
    stderr: PathBuf,
    /// The host ID from the banner's `node:` line.
    pub host_id: String,
    /// The banner's listener lines (directly joined agents): config section → bound address.
    pub listeners: BTreeMap<String, String>,
    /// The diagnostics address, when `svc.diag_addr` is set.
    pub diag: Option<String>,
}

impl Agent {
    /// Starts `command` (an `svc start` invocation) and waits for its banner (`svc: ready`).
    pub fn start(mut command: Command, stderr: PathBuf) -> Agent {
        let err = std::fs::File::create(&stderr).expect("stderr file");
        let mut child = command
            .env_remove("RUST_LOG")
            .env_remove("NO_PROXY")
            .env_remove("no_proxy")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .expect("spawn svc agent");
        let (mut host_id, mut listeners, mut diag) = (String::new(), BTreeMap::new(), None);
        // The banner, up to `svc: ready`; stdout is drained afterwards so the agent never blocks
        // on a full pipe.
        let banner = super::wait::first_line(
            child.stdout.take().expect("stdout"),
            super::wait::STEP,
            move |line| {
                let line = line.trim();
                if let Some(node) = line.strip_prefix("node: ") {
                    host_id = node
                        .rsplit_once('(')
                        .map(|(_, id)| id.trim_end_matches(')').to_owned())
                        .unwrap_or_default();
                }
                if let Some(addr) = line.strip_prefix("diag: http://") {
                    diag = Some(addr.to_owned());
                }
                if let Some((section, addr)) = line.split_once(": ")
                    && section.ends_with("_service")
                {
                    listeners.insert(section.to_owned(), addr.to_owned());
                }
                (line == "svc: ready").then(|| (host_id.clone(), listeners.clone(), diag.clone()))
            },
        );
        let (host_id, listeners, diag) = match banner {
            Ok(banner) if !banner.0.is_empty() => banner,
            other => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "the agent did not start (no banner with `node:` and `svc: ready`: {}):\n{}",
                    other.err().unwrap_or_else(|| "no node line".into()),
                    std::fs::read_to_string(&stderr).unwrap_or_default()
                );
            }
        };
        Agent {
            child,
            stderr,
            host_id,
            listeners,
            diag,
        }
    }

    /// The process ID (to stop the agent with SIGSTOP).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the agent logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // A failing test shows what the agent logged.
        if std::thread::panicking() {
            eprintln!(
                "--- agent log ({}) ---\n{}--- end of agent log ---",
                self.stderr.display(),
                self.log()
            );
        }
    }
}

/// `curl URL`: the HTTP status code and the body.
pub fn curl(url: &str) -> (String, String) {
    let out = super::wait::run_within(
        Command::new(svc_testkit::require("curl", "curl")).args(["-sS", "-w", "\n%{http_code}", url]),
        super::wait::STEP,
        &format!("curl {url}"),
    )
    .expect("running curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
    (status.to_owned(), body.to_owned())
}
