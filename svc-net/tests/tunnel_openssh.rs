//! The real OpenSSH client reaches an agent's SSH Service through the proxy, with the
//! `proxy_command` example (what `tsh proxy ssh` does) as its `ProxyCommand`: user certificate,
//! `@cert-authority` known_hosts line, both the SSH port and the TLS-routed web port.
#![allow(clippy::unwrap_used)]

mod tunnel_support;

use svc_core::identity::SystemRole;
use tunnel_support::*;

async fn openssh_through(separate: bool) {
    init_tracing();
    let ssh_bin = require("ssh", "openssh-client");
    let helper = example_bin("proxy_command");
    let cluster = Cluster::new();
    let proxy = start_proxy(
        &cluster,
        ProxyOpts {
            separate,
            ..Default::default()
        },
    )
    .await;
    let node = cluster.host(&[SystemRole::Node], "node-ossh");
    let agent = start_agent(&cluster, proxy.web, &node);
    proxy
        .tunnel
        .registry()
        .wait_for("node-ossh", |a| a.is_some_and(|a| a.online))
        .within("node-ossh online in the proxy's registry")
        .await;

    let user = cluster.user("alice", &["root"]);
    let dir = cluster.user_creds_dir(&user);
    let known_hosts = dir.path().join("known_hosts");
    std::fs::write(
        &known_hosts,
        format!(
            "@cert-authority * {}\n",
            cluster.host_ca.trusted().ssh_authorized_key().unwrap()
        ),
    )
    .unwrap();
    let endpoint = proxy.ssh_endpoint(&cluster);
    let proxy_command = format!(
        "{} --proxy {} {} --dir {} %h:%p",
        helper.display(),
        endpoint.addr,
        if endpoint.tls { "--tls" } else { "" },
        dir.path().display()
    );
    // tokio's Command, killed when dropped: a hung ssh fails the test after STEP.
    let out = tokio::process::Command::new(ssh_bin)
        .args(["-F", "/dev/null", "-T", "-p", "3022"])
        .arg("-i")
        .arg(dir.path().join("key"))
        .arg("-o")
        .arg(format!(
            "CertificateFile={}",
            dir.path().join("key-cert.pub").display()
        ))
        .arg("-o")
        .arg(format!("UserKnownHostsFile={}", known_hosts.display()))
        .args([
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "IdentitiesOnly=yes",
        ])
        .arg("-o")
        .arg(format!("ProxyCommand={proxy_command}"))
        .args([
            "root@node-ossh",
            "echo hello from $(hostname -s 2>/dev/null || echo node); echo oops >&2; exit 4",
        ])
        .kill_on_drop(true)
        .output()
        .within("OpenSSH's ssh through the ProxyCommand helper exiting")
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "stdout: {stdout}\nstderr: {stderr}");
    assert!(
        stdout.starts_with("hello from "),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    assert!(stderr.contains("oops"), "stderr: {stderr}");
    agent.shutdown().await;
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openssh_through_the_ssh_port() {
    openssh_through(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openssh_through_the_tls_routed_port() {
    openssh_through(false).await;
}
