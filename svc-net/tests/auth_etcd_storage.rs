//! `auth_service.storage: {type: etcd}` from `svc.yaml`: two Auth Services configured with the
//! same etcd start with one set of CAs, each on its own data directory; a password file that
//! cannot be read fails the start naming the field. Real `etcd` (Debian package `etcd-server`).

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use svc_core::config::Config;
use svc_net::AuthServer;

#[path = "../../svc-core/tests/support/etcd.rs"]
mod etcd_support;

const LIMIT: Duration = Duration::from_secs(90);

fn config(data_dir: &std::path::Path, storage: &str) -> Result<Config> {
    let yaml = format!(
        "version: v1\nsvc:\n  nodename: auth-node\n  data_dir: {}\nauth_service:\n  listen_addr: 127.0.0.1:0\n  cluster_name: ha.example.com\n  storage:\n{storage}\nproxy_service:\n  enabled: false\nssh_service:\n  enabled: false\n",
        data_dir.display()
    );
    Ok(Config::from_yaml_str(&yaml)?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_auth_servers_from_config_share_the_etcd_cas() -> Result<()> {
    tokio::time::timeout(LIMIT, async {
        let cluster = etcd_support::EtcdCluster::start(1).await?;
        let storage = format!("    type: etcd\n    peers: [{}]", cluster.peers()[0]);
        let (dir_a, dir_b) = (tempfile::tempdir()?, tempfile::tempdir()?);
        let (a, b) = tokio::join!(
            AuthServer::from_config(&config(dir_a.path(), &storage)?).start(),
            AuthServer::from_config(&config(dir_b.path(), &storage)?).start(),
        );
        let (a, b) = (a.context("Auth Service A")?, b.context("Auth Service B")?);
        ensure!(
            a.ca_pin() == b.ca_pin(),
            "one CA set: {} vs {}",
            a.ca_pin(),
            b.ca_pin()
        );
        ensure!(
            !dir_a.path().join("backend.redb").exists(),
            "with etcd storage no embedded database is created"
        );
        a.shutdown().await;
        b.shutdown().await;

        // The password file is read at start; a missing one is named.
        let dir_c = tempfile::tempdir()?;
        let missing = dir_c.path().join("no-such-password");
        let storage = format!(
            "    type: etcd\n    peers: [{}]\n    username: svc\n    password_file: {}",
            cluster.peers()[0],
            missing.display()
        );
        let err = match AuthServer::from_config(&config(dir_c.path(), &storage)?)
            .start()
            .await
        {
            Ok(_) => anyhow::bail!("an unreadable password_file must fail the start"),
            Err(e) => e,
        };
        let msg = std::iter::successors(Some(&err as &dyn std::error::Error), |e| e.source())
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join(": ");
        ensure!(
            msg.contains("auth_service.storage")
                && msg.contains("password_file")
                && msg.contains("no-such-password"),
            "{msg}"
        );
        anyhow::Ok(())
    })
    .await
    .context("the test did not finish within 90s")?
}
