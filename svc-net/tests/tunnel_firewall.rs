//! The firewall test: the agent runs in its own network namespace whose only way out is a
//! tinyproxy with basic auth (given through `HTTPS_PROXY` with credentials). The agent has no
//! listening port and no route to the proxy, yet an SSH exec through the proxy reaches it — with
//! the tunnel on the separate tunnel port (3024-style) and on the single TLS-routed port.
//!
//! The network is `support/netns.rs`. The same test with the real `svc` binary as the agent and
//! `tsh ssh` as the client is `svc-bins/tests/e2e_agent.rs`.
#![allow(clippy::unwrap_used)]

#[path = "support/netns.rs"]
mod netns;
mod tunnel_support;

use std::process::Stdio;

use netns::{Net, Tinyproxy};
use svc_core::identity::SystemRole;
use tunnel_support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_behind_an_http_proxy_only_is_reachable() {
    init_tracing();
    let agent_bin = example_bin("tunnel_agent");
    let net = Net::create();
    let tiny = Tinyproxy::start(net.host_ip);
    let cluster = Cluster::new();

    for separate in [true, false] {
        let proxy = start_proxy(
            &cluster,
            ProxyOpts {
                separate,
                ip: net.proxy_ip,
                ..Default::default()
            },
        )
        .await;
        let name = if separate { "fw-separate" } else { "fw-tls" };
        let node = cluster.host(&[SystemRole::Node], name);
        let creds = cluster.host_creds_dir(&node);
        let log = creds.path().join("agent.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = net
            .command(&agent_bin)
            .args(["--proxy", &proxy.web.to_string()])
            .arg("--dir")
            .arg(creds.path())
            .env("HTTPS_PROXY", tiny.url(net.host_ip))
            .env_remove("NO_PROXY")
            .env_remove("no_proxy")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        let agent = Proc::adopt("tunnel_agent", child, log);

        // The namespace cannot reach the proxy directly: only tinyproxy is on its link.
        assert!(
            !net.can_reach(net.proxy_ip, proxy.web.port()),
            "the namespace must have no route to the proxy"
        );

        let registry = proxy.tunnel.registry().clone();
        let wait = registry.wait_for(name, |a| a.is_some_and(|a| a.online));
        if tokio::time::timeout(std::time::Duration::from_secs(60), wait)
            .await
            .is_err()
        {
            panic!(
                "the agent never connected; its log:\n{}\ntinyproxy:\n{}",
                agent.log(),
                tiny.log()
            );
        }
        let out = ssh_exec(&proxy, &cluster, name, "echo through the firewall; exit 9").await;
        assert_eq!(
            out.stdout(),
            "through the firewall\n",
            "agent log:\n{}",
            agent.log()
        );
        assert_eq!(out.status, Some(9));

        // It went through tinyproxy, authenticated, to the port the ping named.
        let tunnel_port = if separate {
            proxy.tunnel_addr.unwrap().port()
        } else {
            proxy.web.port()
        };
        let tiny_log = tiny.log();
        assert!(
            tiny_log.contains(&format!("CONNECT {}:{tunnel_port}", net.proxy_ip))
                || tiny_log.contains(&format!("{}:{tunnel_port}", net.proxy_ip)),
            "tinyproxy did not carry the tunnel:\n{tiny_log}"
        );
        // The agent listens on nothing.
        assert_eq!(net.listening(), "", "the agent must have no listening socket");
        drop(agent);
        proxy.shutdown().await;
    }
}
