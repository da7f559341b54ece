//! What the example tests share beyond `svc_testkit` (which finds the built example binaries):
//! reading their output line by line and plain HTTP requests (through svc's `HttpClient`), every
//! wait with a deadline.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

use anyhow::{Context, Result};

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

/// `METHOD path` to `addr` over plain HTTP with svc's `HttpClient`: (status, body), within 10 s.
pub(crate) async fn http(addr: &str, method: &str, path: &str) -> Result<(u16, String)> {
    let client = svc_net::http::HttpClient::builder(svc_net::tls::client_config(None)?)
        .timeout(Duration::from_secs(10))
        .pool_max_idle_per_host(0)
        .build(svc_net::dial::TcpConnector::new());
    let req = hyper::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .body(svc_net::http::RequestBody::default())?;
    let res = client.send(req).await?;
    Ok((res.status().as_u16(), String::from_utf8(res.body().to_vec())?))
}
