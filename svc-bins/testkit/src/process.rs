//! Spawned processes with their output kept: [`Proc`] sends a child's standard output and error
//! to a log file, prints that log when the test fails (panics) while the process is alive, and
//! kills the process (with its process group, if it leads one) when dropped.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A child process whose standard output and error go to a log file; killed on drop, its log
/// printed to the test's output if the test is failing then.
pub struct Proc {
    /// The process.
    pub child: Child,
    /// Its log (standard output and error).
    pub log: PathBuf,
    /// What it is, for messages.
    pub name: String,
    group: bool,
}

impl Proc {
    /// Spawns `command` (standard input closed) with its output to `log`.
    pub fn spawn(name: impl Into<String>, command: &mut Command, log: impl Into<PathBuf>) -> Proc {
        Self::spawn_with(name, command, log, false)
    }

    /// Like [`spawn`](Self::spawn), in a process group of its own: helpers the process starts
    /// (squid's authenticator) are killed with it.
    pub fn spawn_group(name: impl Into<String>, command: &mut Command, log: impl Into<PathBuf>) -> Proc {
        Self::spawn_with(name, command, log, true)
    }

    fn spawn_with(
        name: impl Into<String>,
        command: &mut Command,
        log: impl Into<PathBuf>,
        group: bool,
    ) -> Proc {
        let (name, log) = (name.into(), log.into());
        let out = std::fs::File::create(&log)
            .unwrap_or_else(|e| panic!("creating {}'s log {}: {e}", name, log.display()));
        let err = out
            .try_clone()
            .unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        command.stdin(Stdio::null()).stdout(out).stderr(err);
        if group {
            command.process_group(0);
        }
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name} ({:?}): {e}", command.get_program()));
        Proc {
            child,
            log,
            name,
            group,
        }
    }

    /// Wraps a child spawned elsewhere whose output goes to `log`.
    pub fn adopt(name: impl Into<String>, child: Child, log: impl Into<PathBuf>) -> Proc {
        Proc {
            child,
            log: log.into(),
            name: name.into(),
            group: false,
        }
    }

    /// The log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether the process has exited (and how), without waiting.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.group {
            let pgid = format!("-{}", self.child.id());
            let _ = Command::new("kill").args(["-KILL", "--", &pgid]).status();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "--- {} log ({}) ---\n{}--- end of {} log ---",
                self.name,
                self.log.display(),
                self.log(),
                self.name
            );
        }
    }
}

/// The path of an example program of the workspace (`examples/`, package `svc-examples`), built
/// by `cargo build -p svc-examples --examples` (CI does so before the tests). A missing one fails
/// the test, saying how to build it.
pub fn example_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("the test's own path: {e}"));
    // target/<profile>/deps/<test> → target/<profile>/examples/<name>
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .unwrap_or_else(|| panic!("the test binary {} has no target directory", exe.display()))
        .join("examples");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "the example binary {} is missing: build it with `cargo build -p svc-examples --examples`",
        path.display()
    );
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_goes_to_the_log() {
        let dir = std::env::temp_dir().join(format!("svc-testkit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut p = Proc::spawn(
            "echo",
            Command::new("sh").args(["-c", "echo out; echo err >&2"]),
            dir.join("log"),
        );
        crate::wait_until(std::time::Duration::from_secs(10), "sh to exit", || {
            p.exited().is_some()
        });
        let log = p.log();
        assert!(log.contains("out") && log.contains("err"), "{log}");
        drop(p);
        let _ = std::fs::remove_dir_all(dir);
    }
}
