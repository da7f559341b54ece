//! Real etcd members for the backend tests: one member or a cluster of several on loopback
//! ports, each with a temporary data directory, killed when dropped. A missing `etcd` binary
//! fails the test with a message (Debian package `etcd-server`).

#![allow(dead_code)] // Each test file uses part of it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use svc_core::Clock;
use svc_core::backend::{EtcdBackend, EtcdOptions};

/// How long a member may take to answer after it was started.
pub(crate) const START_LIMIT: Duration = Duration::from_secs(30);

/// Extra flags for every member (TLS, client certificates).
#[derive(Clone, Default)]
pub(crate) struct MemberFlags {
    /// `https` instead of `http` on the client URLs.
    pub(crate) https: bool,
    /// Arguments appended to the command line.
    pub(crate) args: Vec<String>,
}

/// One etcd member.
pub(crate) struct Member {
    pub(crate) name: String,
    pub(crate) client_url: String,
    peer_url: String,
    data_dir: PathBuf,
    initial_cluster: String,
    flags: MemberFlags,
    child: Option<Child>,
}

/// A set of members forming one etcd cluster, plus the directory their data lives in.
pub(crate) struct EtcdCluster {
    pub(crate) members: Vec<Member>,
    _dir: tempfile::TempDir,
}

fn free_port() -> Result<u16> {
    Ok(svc_testkit::free_port("127.0.0.1"))
}

impl Member {
    fn spawn(&mut self, state: &str) -> Result<()> {
        let mut command = Command::new("etcd");
        command
            .arg("--name")
            .arg(&self.name)
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--listen-client-urls")
            .arg(&self.client_url)
            .arg("--advertise-client-urls")
            .arg(&self.client_url)
            .arg("--listen-peer-urls")
            .arg(&self.peer_url)
            .arg("--initial-advertise-peer-urls")
            .arg(&self.peer_url)
            .arg("--initial-cluster")
            .arg(&self.initial_cluster)
            .arg("--initial-cluster-state")
            .arg(state)
            .arg("--initial-cluster-token")
            .arg("svc-test")
            .arg("--logger")
            .arg("zap")
            .arg("--log-level")
            .arg("error")
            .args(&self.flags.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        let child = command
            .spawn()
            .context("starting `etcd` (install the Debian package etcd-server)")?;
        self.child = Some(child);
        Ok(())
    }

    /// Kills the member with SIGKILL and waits for it.
    pub(crate) fn kill(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            child
                .kill()
                .with_context(|| format!("killing etcd member {}", self.name))?;
            child.wait()?;
        }
        Ok(())
    }

    /// Starts the member again on its data directory.
    pub(crate) fn restart(&mut self) -> Result<()> {
        self.kill()?;
        self.spawn("existing")
    }

    /// The member's data directory.
    pub(crate) fn data_dir(&self) -> &Path {
        &self.data_dir
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

impl EtcdCluster {
    /// Starts `size` members forming one cluster and waits until each answers.
    pub(crate) async fn start(size: usize) -> Result<Self> {
        Self::start_with(size, MemberFlags::default()).await
    }

    /// Like [`start`](Self::start), with extra flags on every member; waits for nothing (a
    /// secured member needs credentials to be probed): call [`wait_ready`] yourself.
    pub(crate) async fn start_with(size: usize, flags: MemberFlags) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let scheme = if flags.https { "https" } else { "http" };
        let mut members = Vec::new();
        for i in 0..size {
            members.push(Member {
                name: format!("m{i}"),
                client_url: format!("{scheme}://127.0.0.1:{}", free_port()?),
                peer_url: format!("http://127.0.0.1:{}", free_port()?),
                data_dir: dir.path().join(format!("m{i}")),
                initial_cluster: String::new(),
                flags: flags.clone(),
                child: None,
            });
        }
        let initial: Vec<String> = members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url))
            .collect();
        for member in &mut members {
            member.initial_cluster = initial.join(",");
            member.spawn("new")?;
        }
        let cluster = Self { members, _dir: dir };
        if !flags.https && !flags.args.iter().any(|a| a.contains("auth")) {
            for member in &cluster.members {
                wait_ready(EtcdOptions::new([member.client_url.clone()], "/probe")).await?;
            }
        }
        Ok(cluster)
    }

    /// Every member's client URL.
    pub(crate) fn peers(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client_url.clone()).collect()
    }

    /// A backend on every member under `prefix`, reading time from `clock`.
    pub(crate) async fn backend(
        &self,
        prefix: &str,
        clock: Arc<dyn Clock>,
        buffer: usize,
    ) -> Result<EtcdBackend> {
        Ok(EtcdBackend::connect(
            EtcdOptions::new(self.peers(), prefix)
                .clock(clock)
                .watch_buffer(buffer),
        )
        .await?)
    }
}

/// Connects with `options` until etcd answers, within [`START_LIMIT`].
pub(crate) async fn wait_ready(options: EtcdOptions) -> Result<EtcdBackend> {
    let deadline = Instant::now() + START_LIMIT;
    loop {
        match EtcdBackend::connect(options.clone()).await {
            Ok(backend) => return Ok(backend),
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => bail!(
                "etcd at {:?} did not answer within {START_LIMIT:?}: {e}",
                options.peers()
            ),
        }
    }
}
