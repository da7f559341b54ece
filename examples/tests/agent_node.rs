//! Runs `examples/agent_node.rs` as an integrator would: a cluster (the same library nodes
//! `svc start` runs) in this process, a join token from its Auth API, then the example binary
//! joining with it. The agent must appear in the inventory and stop on SIGTERM.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use svc_core::config::Config;
use svc_net::Cluster;
use svc_net::auth::{AuthClient, ClientIdentity};
use svc_testkit::process::example_bin;

#[tokio::test(flavor = "multi_thread")]
async fn the_embedded_agent_joins_heartbeats_and_stops() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let yaml = format!(
        "version: v1\nsvc:\n  data_dir: {}\nauth_service:\n  cluster_name: example.test\n  listen_addr: 127.0.0.1:0\nproxy_service:\n  web_listen_addr: 127.0.0.1:0\nssh_service:\n  enabled: false\n",
        dir.path().join("cluster").display()
    );
    let config = Config::from_yaml_str_with_hostname(&yaml, "cluster-host")?;
    let cluster = Cluster::from_config(&config).start().await?;
    let auth = cluster.auth.as_ref().context("no Auth Service")?;
    let web = cluster.proxy.as_ref().context("no proxy")?.addrs().web;
    let admin = ClientIdentity::load(&auth.admin_identity)?;
    let mut client = AuthClient::connect_with(&admin).await?;
    let (token, _) = client.create_token(&["node".to_owned()], None).await?;

    let agent_yaml = dir.path().join("agent.yaml");
    std::fs::write(
        &agent_yaml,
        format!(
            "version: v1\nsvc:\n  nodename: embedded-agent\n  data_dir: {}\n  proxy_server: {web}\n  auth_token: {}\n  ca_pin: {}\nauth_service:\n  enabled: false\nproxy_service:\n  enabled: false\nssh_service:\n  enabled: true\n",
            dir.path().join("agent").display(),
            token.expose(),
            auth.ca_pin()
        ),
    )?;
    let mut child = Command::new(example_bin("agent_node"))
        .arg(&agent_yaml)
        .arg("--insecure")
        .env_remove("HTTPS_PROXY")
        .env_remove("https_proxy")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let stdout = child.stdout.take().context("no stdout")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let first = rx.recv_timeout(Duration::from_secs(60));
    let Ok(first) = first else {
        let _ = child.kill();
        bail!("the example printed nothing within 60 s (it should join and print `serving as …`)");
    };
    assert!(first.starts_with("serving as embedded-agent ("), "{first}");

    // The agent heartbeats into the inventory.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let rows = client.inventory().await?;
        if rows.iter().any(|r| r.hostname == "embedded-agent") {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            bail!("the embedded agent is not in the inventory after 30 s: {rows:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // SIGTERM: the example shuts the node down and exits 0.
    let status = Command::new("kill").arg(child.id().to_string()).status()?;
    assert!(status.success(), "kill failed");
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(30)).ok().as_deref(),
        Some("stopped"),
        "the example did not report a clean stop within 30 s"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let code = loop {
        if let Some(code) = child.try_wait()? {
            break code;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            bail!("the example did not exit within 30 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(code.success(), "{code}");
    cluster.shutdown().await;
    Ok(())
}
