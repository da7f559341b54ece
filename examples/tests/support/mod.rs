//! What the example tests share beyond `svc_testkit` (which finds the built example binaries):
//! reading their output line by line and plain HTTP/1.1 requests, every wait with a deadline.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A running example whose stdout lines arrive on a channel; killed when dropped.
pub(crate) struct Running {
    /// The process.
    pub(crate) child: Child,
    /// Its stdout, line by line.
    pub(crate) lines: Receiver<String>,
}

impl Running {
    /// Starts `cmd` with stdout piped.
    pub(crate) fn spawn(mut cmd: Command) -> Result<Self> {
        let mut child = cmd.stdout(Stdio::piped()).spawn()?;
        let stdout = child.stdout.take().context("no stdout")?;
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Self { child, lines })
    }

    /// The next stdout line, within `deadline`.
    pub(crate) fn line(&self, deadline: Duration, what: &str) -> Result<String> {
        self.lines
            .recv_timeout(deadline)
            .with_context(|| format!("the example printed no line within {deadline:?} ({what})"))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `METHOD path` over one plain HTTP/1.1 connection to `addr`: (status, body), within 10 s.
pub(crate) async fn http(addr: &str, method: &str, path: &str) -> Result<(u16, String)> {
    let exchange = async {
        let mut tcp = tokio::net::TcpStream::connect(addr).await?;
        let req = format!(
            "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        );
        tcp.write_all(req.as_bytes()).await?;
        let mut raw = Vec::new();
        tcp.read_to_end(&mut raw).await?;
        anyhow::Ok(String::from_utf8(raw)?)
    };
    let raw = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .with_context(|| format!("{method} {path}: no complete answer from {addr} within 10 s"))??;
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .with_context(|| format!("{method} {path}: no HTTP head in {raw:?}"))?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("{method} {path}: no status in {head:?}"))?;
    Ok((status, body.to_owned()))
}
