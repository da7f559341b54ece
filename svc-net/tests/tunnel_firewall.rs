//! The firewall test: the agent runs in its own network namespace whose only way out is a
//! tinyproxy with basic auth (given through `HTTPS_PROXY` with credentials). The agent has no
//! listening port and no route to the proxy, yet an SSH exec through the proxy reaches it — with
//! the tunnel on the separate tunnel port (3024-style) and on the single TLS-routed port.
//!
//! Addresses are private test addresses created here: a veth pair (host 10.231.N.1, agent
//! 10.231.N.2, nothing else routed in the namespace) and a dummy interface in the host namespace
//! (10.232.N.1) where the svc proxy listens, reachable from the namespace only through tinyproxy.
#![allow(clippy::unwrap_used)]

mod tunnel_support;

use std::{
    net::IpAddr,
    process::{Command, Stdio},
};

use svc_core::identity::SystemRole;
use tunnel_support::*;

fn ip(args: &[&str]) -> std::process::Output {
    Command::new(require("ip", "iproute2"))
        .args(args)
        .output()
        .unwrap()
}

fn ip_ok(args: &[&str]) {
    let out = ip(args);
    assert!(
        out.status.success(),
        "`ip {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The namespace, veth pair and dummy interface; removed on drop.
struct Net {
    ns: String,
    veth: String,
    dummy: String,
    host_ip: IpAddr,
    proxy_ip: IpAddr,
}

impl Net {
    fn create() -> Self {
        let n: u8 = rand::random::<u8>() % 250 + 1;
        let tag = format!("{}{n}", std::process::id() % 10000);
        let net = Net {
            ns: format!("svct{tag}"),
            veth: format!("svh{tag}"),
            dummy: format!("svp{tag}"),
            host_ip: format!("10.231.{n}.1").parse().unwrap(),
            proxy_ip: format!("10.232.{n}.1").parse().unwrap(),
        };
        let out = ip(&["netns", "add", &net.ns]);
        assert!(
            out.status.success(),
            "network namespaces are unavailable (`ip netns add` failed: {}); the firewall test \
             needs root and the Debian package iproute2",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        let peer = format!("sva{tag}");
        ip_ok(&["link", "add", &net.veth, "type", "veth", "peer", "name", &peer]);
        ip_ok(&["link", "set", &peer, "netns", &net.ns]);
        ip_ok(&["addr", "add", &format!("{}/30", net.host_ip), "dev", &net.veth]);
        ip_ok(&["link", "set", &net.veth, "up"]);
        ip_ok(&[
            "-n",
            &net.ns,
            "addr",
            "add",
            &format!("10.231.{n}.2/30"),
            "dev",
            &peer,
        ]);
        ip_ok(&["-n", &net.ns, "link", "set", &peer, "up"]);
        ip_ok(&["-n", &net.ns, "link", "set", "lo", "up"]);
        // The proxy's address: on a second veth pair kept in the host namespace (no `dummy`
        // module is needed), so nothing routes it into the agent's namespace.
        let dummy_peer = format!("svq{tag}");
        ip_ok(&[
            "link",
            "add",
            &net.dummy,
            "type",
            "veth",
            "peer",
            "name",
            &dummy_peer,
        ]);
        ip_ok(&["addr", "add", &format!("{}/32", net.proxy_ip), "dev", &net.dummy]);
        ip_ok(&["link", "set", &net.dummy, "up"]);
        ip_ok(&["link", "set", &dummy_peer, "up"]);
        net
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let _ = ip(&["link", "del", &self.dummy]);
        let _ = ip(&["link", "del", &self.veth]);
        let _ = ip(&["netns", "del", &self.ns]);
    }
}

const USER: &str = "agentuser";
const PASSWORD: &str = "s3cret-pw";

fn tinyproxy(listen: IpAddr) -> (Proc, u16, tempfile::TempDir) {
    let bin = require("tinyproxy", "tinyproxy");
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind((listen, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let conf = dir.path().join("tinyproxy.conf");
    std::fs::write(
        &conf,
        format!("Port {port}\nListen {listen}\nTimeout 600\nLogLevel Connect\nMaxClients 100\nBasicAuth {USER} {PASSWORD}\n"),
    )
    .unwrap();
    let log = dir.path().join("tinyproxy.log");
    let out = std::fs::File::create(&log).unwrap();
    let child = Command::new(bin)
        .arg("-d")
        .arg("-c")
        .arg(&conf)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap();
    (Proc(child, log), port, dir)
}

async fn wait_listening(addr: std::net::SocketAddr) {
    for _ in 0..500 {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("{addr} never accepted a connection");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_behind_an_http_proxy_only_is_reachable() {
    init_tracing();
    let agent_bin = example_bin("tunnel_agent");
    let net = Net::create();
    let (tiny, tiny_port, _tiny_dir) = tinyproxy(net.host_ip);
    wait_listening((net.host_ip, tiny_port).into()).await;
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
        let child = Command::new(require("ip", "iproute2"))
            .args(["netns", "exec", &net.ns])
            .arg(&agent_bin)
            .args(["--proxy", &proxy.web.to_string()])
            .arg("--dir")
            .arg(creds.path())
            .env(
                "HTTPS_PROXY",
                format!("http://{USER}:{PASSWORD}@{}:{tiny_port}", net.host_ip),
            )
            .env_remove("NO_PROXY")
            .env_remove("no_proxy")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        let agent = Proc(child, log);

        // The namespace cannot reach the proxy directly: only tinyproxy is on its link.
        let direct = Command::new(require("ip", "iproute2"))
            .args(["netns", "exec", &net.ns, "bash", "-c"])
            .arg(format!("exec 3<>/dev/tcp/{}/{}", net.proxy_ip, proxy.web.port()))
            .output()
            .unwrap();
        assert!(
            !direct.status.success(),
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
        let ss = Command::new(require("ip", "iproute2"))
            .args(["netns", "exec", &net.ns, "ss", "-H", "-l", "-t", "-n"])
            .output()
            .unwrap();
        assert!(ss.status.success());
        assert_eq!(
            String::from_utf8_lossy(&ss.stdout).trim(),
            "",
            "the agent must have no listening socket"
        );
        drop(agent);
        proxy.shutdown().await;
    }
}
