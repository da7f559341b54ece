//! Deadlines for everything tests wait on: a hang fails the test with a message saying what did
//! not happen, instead of holding the run until CI's own limit.

use std::future::Future;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Polls `cond` every 50 ms until it holds; panics naming `what` after `limit`.
pub fn wait_until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "{what} did not happen within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Polls the future `cond` makes every 50 ms until it yields `true`; panics naming `what` after
/// `limit` (a `cond` that hangs counts against the limit too).
pub async fn wait_until_async<F>(limit: Duration, what: &str, mut cond: impl FnMut() -> F)
where
    F: Future<Output = bool>,
{
    let poll = async {
        while !cond().await {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    within(limit, what, poll).await
}

/// `fut` for at most `limit`; panics naming `what` after that.
pub async fn within<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, fut)
        .await
        .unwrap_or_else(|_| panic!("{what} did not happen within {limit:?}"))
}

/// Reads `out` (a child's standard output) line by line on a thread of its own until `pick`
/// returns a value, for at most `limit`. Afterwards the thread keeps draining it, so the child
/// never blocks on a full pipe. `Err` says what happened instead: the output ended (the child
/// exited) or the time ran out.
pub fn first_line<T: Send + 'static>(
    out: impl Read + Send + 'static,
    limit: Duration,
    mut pick: impl FnMut(&str) -> Option<T> + Send + 'static,
) -> Result<T, String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(out).lines();
        for line in lines.by_ref() {
            let Ok(line) = line else { return };
            if let Some(found) = pick(&line) {
                let _ = tx.send(found);
                for _ in lines {}
                return;
            }
        }
    });
    match rx.recv_timeout(limit) {
        Ok(found) => Ok(found),
        Err(mpsc::RecvTimeoutError::Timeout) => {
            Err(format!("the expected line did not come within {limit:?}"))
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            Err("the output ended before the expected line (the process exited)".into())
        }
    }
}

/// Waits for `child` to exit, for at most `limit`; after that kills it (SIGKILL) and panics
/// naming `what`.
pub fn wait_exit(child: &mut Child, limit: Duration, what: &str) -> ExitStatus {
    match wait_exit_within(child, limit) {
        Some(status) => status,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not exit within {limit:?} (killed)");
        }
    }
}

/// How `child` ended, if it exits within `limit`; `None` if it is still running then (it is
/// left running). Panics if its state cannot be read.
pub fn wait_exit_within(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => return None,
            Err(e) => panic!("waiting for a child process: {e}"),
        }
    }
}

/// `child.wait_with_output()` for at most `limit`; after that kills the child and panics naming
/// `what`.
pub fn output_within(child: Child, limit: Duration, what: &str) -> Output {
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.unwrap_or_else(|e| panic!("waiting for {what}: {e}")),
        Err(_) => {
            // The waiting thread has not reaped it, so the PID is still this child's.
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            panic!("{what} did not finish within {limit:?} (killed)");
        }
    }
}

/// `command.output()` for at most `limit` (standard input closed); `Err` when it cannot start.
pub fn run_within(command: &mut Command, limit: Duration, what: &str) -> std::io::Result<Output> {
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    Ok(output_within(child, limit, what))
}

/// [`Command::output`] with a deadline: `cmd.output_within(limit, what)` kills the command and
/// panics naming `what` after `limit` (standard input closed, as with `output`).
pub trait OutputWithin {
    /// Runs the command to completion within `limit`; `Err` when it cannot start.
    fn output_within(&mut self, limit: Duration, what: &str) -> std::io::Result<Output>;
}

impl OutputWithin for Command {
    fn output_within(&mut self, limit: Duration, what: &str) -> std::io::Result<Output> {
        run_within(self, limit, what)
    }
}

/// The same deadline for a `tokio::process::Command`'s output (the child is killed when the time
/// runs out).
pub async fn tokio_output_within(
    command: &mut tokio::process::Command,
    limit: Duration,
    what: &str,
) -> std::io::Result<Output> {
    within(limit, what, command.kill_on_drop(true).output()).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[should_panic(expected = "the flag did not happen within")]
    fn wait_until_names_what_it_waited_for() {
        wait_until(Duration::from_millis(100), "the flag", || false);
    }

    #[test]
    fn first_line_picks_and_reports_an_early_end() {
        let out = std::io::Cursor::new(b"a\nready: 7\n".to_vec());
        let got = first_line(out, Duration::from_secs(5), |l| {
            l.strip_prefix("ready: ").map(str::to_owned)
        });
        assert_eq!(got.as_deref(), Ok("7"));
        let out = std::io::Cursor::new(b"a\n".to_vec());
        let err = first_line(out, Duration::from_secs(5), |_| None::<()>).unwrap_err();
        assert!(err.contains("ended"), "{err}");
    }

    #[test]
    fn commands_run_within_a_deadline() {
        let out = Command::new("sh")
            .args(["-c", "echo hi"])
            .output_within(Duration::from_secs(10), "sh")
            .unwrap();
        assert_eq!(out.stdout, b"hi\n");
    }

    #[test]
    #[should_panic(expected = "sleep did not finish within")]
    fn a_command_past_its_deadline_is_killed_and_named() {
        let _ = Command::new("sleep")
            .arg("30")
            .output_within(Duration::from_millis(200), "sleep");
    }

    #[tokio::test]
    #[should_panic(expected = "never did not happen within")]
    async fn within_names_what_it_waited_for() {
        within(Duration::from_millis(50), "never", std::future::pending::<()>()).await;
    }
}
