//! End to end: the real `svc start` holds its web port (the only port with TLS routing) against
//! a flood of silent peers. 1,000 peers connect and send nothing, 200 send an SSH banner (SSH
//! sniffed on the web port) and then nothing; while they hold their connections, a real
//! `tsh ssh` runs a command on the node; then every flooding peer is closed by the server at
//! its default deadline (15 s to classify, 10 s for SSH to authenticate), with generous slack.
//! 200 silent peers on the Auth API port are cut at its 10 s TLS handshake deadline.

mod common;

use std::time::Duration;

use anyhow::{Context, Result, bail};
use common::Cluster;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    time::Instant,
};

const PASSWORD: &str = "correct-horse-battery";
/// The defaults of `ListenOptions::peek_timeout` and `Tunables::auth_timeout`.
const PEEK: Duration = Duration::from_secs(15);
const SSH_AUTH: Duration = Duration::from_secs(10);
/// `svc_net::auth::HANDSHAKE_TIMEOUT`.
const AUTH_TLS: Duration = Duration::from_secs(10);
/// Slack for a loaded 2-core machine.
const SLACK: Duration = Duration::from_secs(25);

/// Both ends of the flood live on this machine: the test and `svc` (which inherits the limit).
fn raise_fd_limit(want: u64) -> Result<()> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current.is_none_or(|c| c >= want) {
        return Ok(());
    }
    let target = limit.maximum.map_or(want, |m| m.min(want));
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(target),
            maximum: limit.maximum,
        },
    )
    .context("raising RLIMIT_NOFILE")?;
    if target < want {
        bail!(
            "this test needs {want} file descriptors; the hard limit is {target} (raise it with `ulimit -Hn`)"
        );
    }
    Ok(())
}

/// Reads until the server closes the connection; returns when that happened.
async fn closed_at(mut tcp: TcpStream, banner: bool) -> Instant {
    if banner && tcp.write_all(b"SSH-2.0-flood\r\n").await.is_err() {
        return Instant::now();
    }
    let mut buf = [0u8; 512];
    loop {
        match tcp.read(&mut buf).await {
            Ok(0) | Err(_) => return Instant::now(),
            Ok(_) => {}
        }
    }
}

#[test]
fn a_flood_of_silent_peers_is_cut_at_the_deadline_while_tsh_ssh_works() -> Result<()> {
    raise_fd_limit(8192)?;
    let cluster = Cluster::signed_in(PASSWORD);
    let target = format!(
        "root@{}",
        svc_core::config::Config::all_in_one_default().svc.nodename
    );
    // The node is up before the flood starts.
    let warm = cluster.tsh(&["ssh", &target, "echo warm"], None);
    assert_eq!(
        warm.stdout,
        "warm\n",
        "stderr: {}\nsvc: {}",
        warm.stderr,
        cluster.stderr()
    );

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let web = cluster.web_addr.clone();
    let auth = cluster.auth_addr.clone();
    let (silent, sniffed, at_auth, connected) = rt.block_on(async {
        let mut silent = Vec::new();
        let mut sniffed = Vec::new();
        let mut at_auth = Vec::new();
        for i in 0..200 {
            let tcp = TcpStream::connect(&auth)
                .await
                .with_context(|| format!("auth flood peer {i} connecting to {auth}"))?;
            at_auth.push(tokio::spawn(closed_at(tcp, false)));
        }
        for i in 0..1200 {
            let tcp = TcpStream::connect(&web)
                .await
                .with_context(|| format!("flood peer {i} connecting to {web}"))?;
            if i < 1000 {
                silent.push(tokio::spawn(closed_at(tcp, false)));
            } else {
                sniffed.push(tokio::spawn(closed_at(tcp, true)));
            }
        }
        anyhow::Ok((silent, sniffed, at_auth, Instant::now()))
    })?;

    // The real client, during the flood.
    let honest = cluster.tsh(&["ssh", &target, "echo honest"], None);
    assert_eq!(
        honest.stdout,
        "honest\n",
        "tsh ssh during the flood: {}\nsvc: {}",
        honest.stderr,
        cluster.stderr()
    );
    assert_eq!(honest.status.code(), Some(0));

    rt.block_on(async {
        for (what, peers, deadline) in [
            ("silent peers", silent, connected + PEEK),
            (
                "peers that sent only an SSH banner",
                sniffed,
                connected + SSH_AUTH,
            ),
            ("silent peers on the Auth API", at_auth, connected + AUTH_TLS),
        ] {
            let n = peers.len();
            let ends = tokio::time::timeout_at(deadline + SLACK, futures_util::future::join_all(peers))
                .await
                .with_context(|| format!("{what}: not all {n} were closed by their deadline + {SLACK:?}"))?;
            for end in ends {
                let end = end?;
                assert!(
                    end <= deadline + SLACK,
                    "{what}: one was closed {:?} late",
                    end - deadline
                );
            }
        }
        anyhow::Ok(())
    })?;

    // Still serving after the flood.
    let after = cluster.tsh(&["ssh", &target, "echo after"], None);
    assert_eq!(after.stdout, "after\n", "{}", after.stderr);
    Ok(())
}
