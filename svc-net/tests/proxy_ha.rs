//! Several proxies behind one address: three proxies behind a real `haproxy` (TCP mode,
//! `send-proxy-v2`), an agent told only the load balancer's address. The agent ends up with a
//! tunnel to each proxy (discovery; dials reaching a proxy it already holds are dropped), a
//! client reaches the agent through any proxy, PROXY headers are honoured from the trusted load
//! balancer (the real client address in the proxy's logs) and refused from anywhere else, and a
//! proxy stopped as SIGTERM stops it (`RunningProxy::shutdown`) drains: its agent is asked to
//! reconnect elsewhere, a running session finishes, the agent keeps serving through the other
//! proxies and holds a tunnel to the stopped proxy again once it is back.
#![allow(clippy::unwrap_used)]

mod tunnel_support;

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use svc_core::Addr;
use svc_core::identity::SystemRole;
use svc_net::tunnel::{DiscoveredProxy, Discovery};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tunnel_support::*;

/// Every log line of this test binary (debug for svc_net), for assertions on what the proxies
/// log. Installed once, globally: the proxies' tasks run on the runtime's worker threads.
fn logs() -> &'static CapturedLogs {
    static LOGS: OnceLock<CapturedLogs> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = CapturedLogs::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(logs.clone())
            .with_ansi(false)
            .with_env_filter("info,svc_net::route=debug,svc_net::tunnel::agent=debug")
            .finish();
        tracing::subscriber::set_global_default(subscriber).unwrap();
        logs
    })
}

/// `haproxy` in the foreground, TCP mode, round robin over `backends`, each sent a PROXY v2
/// header; health-checked so that a stopped proxy gets no new connections.
struct Haproxy {
    child: Child,
    _dir: tempfile::TempDir,
}

impl Haproxy {
    fn start(listen: SocketAddr, backends: &[SocketAddr]) -> Self {
        let bin = svc_testkit::require("haproxy", "haproxy");
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = format!(
            "global\n  maxconn 1000\ndefaults\n  mode tcp\n  timeout connect 2s\n  timeout client 1h\n  timeout server 1h\n  retries 3\n  option redispatch\nfrontend fe\n  bind {listen}\n  default_backend be\nbackend be\n  balance roundrobin\n"
        );
        for (i, b) in backends.iter().enumerate() {
            cfg.push_str(&format!(
                "  server p{i} {b} send-proxy-v2 check check-send-proxy inter 300ms fall 1 rise 1\n"
            ));
        }
        let path = dir.path().join("haproxy.cfg");
        std::fs::write(&path, cfg).unwrap();
        let check = Command::new(&bin)
            .arg("-c")
            .arg("-f")
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            check.status.success(),
            "haproxy refused its configuration: {}",
            String::from_utf8_lossy(&check.stderr)
        );
        let child = Command::new(&bin)
            .arg("-db")
            .arg("-f")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Haproxy { child, _dir: dir }
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn opts(web_port: u16, lb: SocketAddr) -> ProxyOpts {
    ProxyOpts {
        web_port,
        public_addr: Some(Addr::from(lb)),
        trusted: vec!["127.0.0.1/32".parse().unwrap()],
        listen: svc_net::listen::ListenOptions::default().with_drain_timeout(Duration::from_secs(10)),
        ..Default::default()
    }
}

/// What the registry tells every proxy's agents: all three proxies, at the load balancer.
fn announce(proxies: &[&TestProxy], lb: SocketAddr) {
    let list = Discovery {
        proxies: proxies
            .iter()
            .map(|p| DiscoveredProxy {
                proxy_id: p.creds.host_id.clone(),
                tunnel_addr: lb.to_string(),
                tls_routing: true,
            })
            .collect(),
        complete: true,
        hold: None,
    };
    for p in proxies {
        p.tunnel.set_proxies(list.clone());
    }
}

/// Waits until the load balancer forwards connections (its first health checks passed).
async fn wait_for_port(addr: SocketAddr) {
    async {
        loop {
            if let Ok(mut s) = tokio::net::TcpStream::connect(addr).await {
                // A ping through the load balancer answers once a backend is up.
                let _ = s.write_all(b"GET / HTTP/1.1\r\n\r\n").await;
                let mut buf = [0u8; 16];
                if matches!(tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await, Ok(Ok(n)) if n > 0)
                {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    .within(&format!("haproxy at {addr} forwarding to a proxy"))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_behind_one_address_holds_a_tunnel_to_every_proxy_and_survives_a_drain() {
    let logs = logs();
    let cluster = Cluster::new();
    let lb = loopback(svc_testkit::free_port("127.0.0.1"));
    let ports: Vec<u16> = (0..3).map(|_| svc_testkit::free_port("127.0.0.1")).collect();
    let mut proxies = Vec::new();
    for port in &ports {
        proxies.push(start_proxy(&cluster, opts(*port, lb)).await);
    }
    let _haproxy = Haproxy::start(lb, &ports.iter().map(|p| loopback(*p)).collect::<Vec<_>>());
    wait_for_port(lb).await;
    announce(&proxies.iter().collect::<Vec<_>>(), lb);

    // The agent knows only the load balancer, and retries with the reference backoff (1 s
    // steps up to 8 s, jittered) after failed dials; a dial that reaches a proxy it already
    // holds is retried after a short pause (a bounded run of them, then the backoff).
    let node = cluster.host(&[SystemRole::Node], "node-ha");
    let started = Instant::now();
    let agent = start_agent_with(
        agent_config(&cluster, lb, &node, "17.0.0").with_backoff(svc_net::tunnel::Backoff::default()),
        &cluster,
        &node,
    );
    agent
        .wait_for(|s| s.connected.len() == 3)
        .within("the agent holding a tunnel to each of the three proxies")
        .await;
    let all_three = started.elapsed();
    println!("FIGURE: tunnels to all 3 proxies behind one address after {all_three:?}");
    for p in &proxies {
        assert!(agent.status().connected.contains(&p.creds.host_id));
        p.tunnel
            .registry()
            .wait_for("node-ha", |a| a.is_some_and(|a| a.online))
            .within("node-ha registered on every proxy")
            .await;
        // One tunnel per proxy: the duplicates reached through the load balancer were dropped.
        assert_eq!(
            p.tunnel
                .registry()
                .list()
                .iter()
                .filter(|a| a.host_id == node.host_id)
                .count(),
            1
        );
    }
    // A client reaching any proxy reaches the agent.
    for (i, p) in proxies.iter().enumerate() {
        assert_eq!(
            ssh_exec(p, &cluster, "node-ha", &format!("echo via {i}"))
                .await
                .stdout(),
            format!("via {i}\n")
        );
    }
    // The tunnels came through haproxy: the proxies read its PROXY v2 headers.
    assert!(logs.text().contains("PROXY header accepted"), "{}", logs.text());

    // Drain: a session runs through proxy 0 while it stops (what SIGTERM does).
    let user = cluster.user("alice", &["root"]);
    let session = node_session(&proxies[0], &cluster, &user, "node-ha").await;
    let running = tokio::spawn(async move {
        let out = exec(&session, "sleep 1; echo finished").await;
        (session, out)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stopped = proxies.remove(0);
    let (stopped_creds, stopped_tls, stopped_id) = (
        stopped.creds.clone(),
        stopped.tls.clone(),
        stopped.creds.host_id.clone(),
    );
    let stopping = tokio::spawn(stopped.shutdown());
    let (_session, out) = running
        .within("the session through the draining proxy")
        .await
        .unwrap();
    assert_eq!(
        out.stdout(),
        "finished\n",
        "the session finished during the drain"
    );
    stopping.within("the proxy's drain").await.unwrap();
    // It left the registry: the other proxies announce the two that remain.
    announce(&proxies.iter().collect::<Vec<_>>(), lb);
    logs.wait_for_line("the drain asking the agent to reconnect elsewhere", |l| {
        l.contains("asked the agent to reconnect elsewhere")
    })
    .await;
    agent
        .wait_for(|s| !s.connected.contains(&stopped_id) && s.connected.len() == 2)
        .within("the agent letting go of the stopped proxy")
        .await;
    // Never stranded: the other proxies still reach it.
    for p in &proxies {
        assert_eq!(
            ssh_exec(p, &cluster, "node-ha", "echo still").await.stdout(),
            "still\n"
        );
    }

    // The proxy comes back on its port: the agent holds a tunnel to it again.
    let back_at = Instant::now();
    let back = start_proxy_with(
        &cluster,
        opts(ports[0], lb),
        Some(stopped_creds),
        Some(stopped_tls),
    )
    .await;
    proxies.insert(0, back);
    announce(&proxies.iter().collect::<Vec<_>>(), lb);
    agent
        .wait_for(|s| s.connected.contains(&stopped_id) && s.connected.len() == 3)
        .within("the agent holding a tunnel to the restarted proxy")
        .await;
    println!(
        "FIGURE: tunnel to the restarted proxy re-established {:?} after it listened again",
        back_at.elapsed()
    );
    assert_eq!(
        ssh_exec(&proxies[0], &cluster, "node-ha", "echo back")
            .await
            .stdout(),
        "back\n"
    );

    // A proxy that leaves the registry (no complete list names it) loses its tunnel.
    let gone = proxies.remove(2);
    let gone_id = gone.creds.host_id.clone();
    announce(&proxies.iter().collect::<Vec<_>>(), lb);
    gone.tunnel.set_proxies(Discovery {
        proxies: Vec::new(),
        complete: false,
        hold: None,
    });
    agent
        .wait_for(|s| !s.connected.contains(&gone_id) && s.connected.len() == 2)
        .within("the agent dropping the tunnel to the unlisted proxy")
        .await;

    agent.shutdown().await;
    gone.shutdown().await;
    for p in proxies {
        p.shutdown().await;
    }
}

/// A proxy that restarts with the same identity while the registry keeps listing it (the list
/// the agents hear does not change): the agent, back to dialing the load balancer, holds a
/// tunnel to it again soon after it listens — dials landing on proxies it already holds are
/// retried after a short pause rather than the growing reconnect backoff. Three restarts, each
/// figure printed (how long, and how many dials reached a proxy already held).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_proxy_that_stays_listed_gets_its_tunnel_back() {
    let logs = logs();
    let cluster = Cluster::new();
    let lb = loopback(svc_testkit::free_port("127.0.0.1"));
    let ports: Vec<u16> = (0..3).map(|_| svc_testkit::free_port("127.0.0.1")).collect();
    let mut proxies = Vec::new();
    for port in &ports {
        proxies.push(start_proxy(&cluster, opts(*port, lb)).await);
    }
    let _haproxy = Haproxy::start(lb, &ports.iter().map(|p| loopback(*p)).collect::<Vec<_>>());
    wait_for_port(lb).await;
    announce(&proxies.iter().collect::<Vec<_>>(), lb);
    let listed = Discovery {
        proxies: proxies
            .iter()
            .map(|p| DiscoveredProxy {
                proxy_id: p.creds.host_id.clone(),
                tunnel_addr: lb.to_string(),
                tls_routing: true,
            })
            .collect(),
        complete: true,
        hold: None,
    };

    let node = cluster.host(&[SystemRole::Node], "node-restart");
    let agent = start_agent_with(
        agent_config(&cluster, lb, &node, "17.0.0").with_backoff(svc_net::tunnel::Backoff::default()),
        &cluster,
        &node,
    );
    agent
        .wait_for(|s| s.connected.len() == 3)
        .within("the agent holding a tunnel to each of the three proxies")
        .await;

    const HELD: &str = "reached a proxy this agent already holds a tunnel to";
    for round in 0..3 {
        let i = round % proxies.len();
        let stopped = proxies.remove(i);
        let (creds, tls, id) = (
            stopped.creds.clone(),
            stopped.tls.clone(),
            stopped.creds.host_id.clone(),
        );
        stopped.shutdown().within("the proxy's stop").await;
        agent
            .wait_for(|s| !s.connected.contains(&id))
            .within("the agent letting go of the stopped proxy")
            .await;
        // A process restart takes a moment: meanwhile the agent's dials land on the others.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let before = logs.text().matches(HELD).count();
        // Back on its port with its identity; it tells its own agents the same list as before
        // (the others say nothing new: the registry still lists it).
        let back_at = Instant::now();
        let back = start_proxy_with(&cluster, opts(ports[i], lb), Some(creds), Some(tls)).await;
        back.tunnel.set_proxies(listed.clone());
        proxies.insert(i, back);
        agent
            .wait_for(|s| s.connected.contains(&id) && s.connected.len() == 3)
            .within("the agent holding a tunnel to the restarted proxy again")
            .await;
        println!(
            "FIGURE: restart {round}: tunnel to the restarted proxy back {:?} after it listened again, {} dials reached a proxy already held meanwhile",
            back_at.elapsed(),
            logs.text().matches(HELD).count().saturating_sub(before)
        );
        assert_eq!(
            ssh_exec(&proxies[i], &cluster, "node-restart", "echo back")
                .await
                .stdout(),
            "back\n"
        );
    }

    agent.shutdown().await;
    for p in proxies {
        p.shutdown().await;
    }
}

/// PROXY protocol from the trusted load balancer: curl, bound to 127.0.0.2, asks the ping
/// through haproxy, and the proxy logs 127.0.0.2 as the client while the TCP peer is haproxy's.
/// A PROXY header (v2 from haproxy, v1 by hand) from an untrusted source is refused, the
/// connection closed with a log line naming the peer; v1 from a trusted source is honoured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_headers_are_honoured_only_from_trusted_sources() {
    let logs = logs();
    let curl = svc_testkit::require("curl", "curl");
    let cluster = Cluster::new();
    let lb = loopback(svc_testkit::free_port("127.0.0.1"));
    let port = svc_testkit::free_port("127.0.0.1");
    let trusted = start_proxy(&cluster, opts(port, lb)).await;
    let _haproxy = Haproxy::start(lb, &[loopback(port)]);
    wait_for_port(lb).await;

    let out = tokio::process::Command::new(&curl)
        .args(["-sk", "--max-time", "30", "--interface", "127.0.0.2"])
        .arg(format!("https://{lb}/webapi/ping"))
        .output()
        .within("curl through haproxy")
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"proxy\""));
    let text = logs.text();
    assert!(
        text.lines().any(|l| l.contains("PROXY header accepted")
            && l.contains("tcp_peer=127.0.0.1:")
            && l.contains("client=127.0.0.2:")),
        "the proxy logs the real client address:\n{text}"
    );

    // v1 by hand from the trusted source: the peer becomes the header's source.
    let mut s = tokio::net::TcpStream::connect(loopback(port)).await.unwrap();
    s.write_all(b"PROXY TCP4 192.0.2.7 127.0.0.1 5555 443\r\nGET / HTTP/1.1\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer).within("the plain-HTTP hint").await;
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 400"));
    logs.wait_for_line("the trusted v1 header's source as the client", |l| {
        l.contains("client=192.0.2.7:5555")
    })
    .await;

    // A proxy that trusts nobody on loopback refuses haproxy's header and a hand-made one.
    let untrusted_port = svc_testkit::free_port("127.0.0.1");
    let mut o = opts(untrusted_port, lb);
    o.trusted = vec!["10.99.0.0/16".parse().unwrap()];
    let untrusted = start_proxy(&cluster, o).await;
    let mut s = tokio::net::TcpStream::connect(loopback(untrusted_port))
        .await
        .unwrap();
    s.write_all(b"PROXY TCP4 192.0.2.8 127.0.0.1 6666 443\r\nGET / HTTP/1.1\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = s
        .read_to_end(&mut answer)
        .within("the refused connection closing")
        .await;
    assert!(
        answer.is_empty(),
        "nothing is answered after an untrusted PROXY header"
    );
    logs.wait_for_line("the refusal naming the peer", |l| {
        l.contains("PROXY protocol header from untrusted address 127.0.0.1; refused")
            && l.contains("peer=127.0.0.1:")
    })
    .await;
    assert!(!logs.text().contains("client=192.0.2.8"));

    trusted.shutdown().await;
    untrusted.shutdown().await;
}

/// The whole path with the real Auth Service: proxies started as `svc start` starts them
/// (`ProxyServer`, from `svc.yaml`) announce themselves through the Auth API, `ListProxies`
/// lists them for any cluster member, an agent told only the load balancer's address ends up
/// with a tunnel to each (the lists come from the registry), a proxy's clean stop removes its
/// record, and a directly joined agent writes as the updater's endpoint the version endpoint of
/// a registered proxy — nothing, with a log line saying why, while no proxy is registered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxies_register_through_the_auth_api_and_direct_agents_point_their_updater_at_one() {
    use svc_net::agent::node::AgentNode;
    use svc_net::auth::{AuthClient, ClientIdentity, node::AuthServer};
    use svc_net::proxy::node::ProxyServer;

    let logs = logs();
    let data = tempfile::tempdir().unwrap();
    let lb = loopback(svc_testkit::free_port("127.0.0.1"));
    let yaml = format!(
        "version: v1\nsvc:\n  data_dir: {}\nauth_service:\n  cluster_name: ha.example.com\n  listen_addr: 127.0.0.1:0\nproxy_service:\n  public_addr: {lb}\n  web_listen_addr: 127.0.0.1:0\n  proxy_protocol: on\n  proxy_protocol_trusted_networks: [127.0.0.1/32]\nssh_service:\n  enabled: false\n",
        data.path().display()
    );
    let config = svc_core::config::Config::from_yaml_str_with_hostname(&yaml, "ha-auth").unwrap();
    let auth = AuthServer::from_config(&config).start().await.unwrap();
    let auth_addr = auth.dialable_addr();

    // A directly joined agent, before any proxy is registered: no endpoint, and a log line.
    let direct_yaml = |dir: &std::path::Path| {
        format!(
            "version: v1\nsvc:\n  data_dir: {}\n  auth_server: {auth_addr}\nauth_service:\n  enabled: false\nproxy_service:\n  enabled: false\nssh_service:\n  enabled: true\n  listen_addr: 127.0.0.1:0\n",
            dir.display()
        )
    };
    let start_direct = |name: &'static str| {
        let dir = tempfile::tempdir().unwrap();
        let upgrade = dir.path().join("svc-upgrade.d");
        std::fs::create_dir(&upgrade).unwrap();
        let cfg =
            svc_core::config::Config::from_yaml_str_with_hostname(&direct_yaml(dir.path()), name).unwrap();
        let identity = auth.host_identity(name, vec![SystemRole::Node]).unwrap();
        let node = AgentNode::from_config(&cfg)
            .identity(identity)
            .dialer(direct_dialer())
            .upgrade_dir(&upgrade);
        (dir, upgrade, node)
    };
    let (_d1, upgrade1, node1) = start_direct("direct-early");
    let direct1 = node1
        .start()
        .within("the first direct agent starting")
        .await
        .unwrap();
    async {
        while !std::fs::exists(upgrade1.join("schedule")).unwrap() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    .within("the first direct agent exporting its schedule")
    .await;
    assert!(
        !upgrade1.join("endpoint").exists(),
        "no endpoint while no proxy is registered (never the Auth address)"
    );
    logs.wait_for_line("the direct agent saying no proxy is registered", |l| {
        l.contains("no proxy is registered with the Auth Service")
    })
    .await;

    // Two proxies behind haproxy, each announcing itself.
    let ports: Vec<u16> = (0..2).map(|_| svc_testkit::free_port("127.0.0.1")).collect();
    let mut proxies = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let mut settings = ProxyServer::from_config(&config).settings().clone();
        assert_eq!(
            settings.listen.drain_timeout,
            Duration::from_secs(30),
            "proxy_service.shutdown_drain_timeout's default bounds the drain"
        );
        settings.ping.web_listen_addr = Addr::from(loopback(*port));
        let proxy = ProxyServer::new(settings, format!("proxy-{i}"))
            .start(&auth)
            .within("a proxy starting")
            .await
            .unwrap();
        proxies.push(proxy);
    }
    let _haproxy = Haproxy::start(lb, &ports.iter().map(|p| loopback(*p)).collect::<Vec<_>>());
    wait_for_port(lb).await;

    let admin = ClientIdentity::load(&auth.admin_identity).unwrap();
    let mut client = AuthClient::connect(&auth_addr.to_string(), &admin).await.unwrap();
    let listed = async {
        loop {
            let list = client.list_proxies().await.unwrap();
            if list.len() == 2 {
                return list;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    .within("both proxies in ListProxies")
    .await;
    for record in &listed {
        assert_eq!(record.public_addr, lb.to_string());
        assert_eq!(record.tunnel_addr, lb.to_string());
        assert!(record.tls_routing);
        assert_eq!(record.version, svc_core::version::current().to_string());
        assert!(record.expires > record.last_seen);
    }
    // Any cluster member may list them.
    let node_identity = auth.host_identity("lister", vec![SystemRole::Node]).unwrap();
    let mut as_node = AuthClient::connect(&auth_addr.to_string(), &node_identity)
        .await
        .unwrap();
    assert_eq!(as_node.list_proxies().await.unwrap().len(), 2);

    // A directly joined agent now points its updater at a registered proxy.
    let (_d2, upgrade2, node2) = start_direct("direct-late");
    let direct2 = node2
        .start()
        .within("the second direct agent starting")
        .await
        .unwrap();
    let endpoint = async {
        loop {
            if let Ok(text) = std::fs::read_to_string(upgrade2.join("endpoint")) {
                return text;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    .within("the second direct agent writing the updater's endpoint")
    .await;
    assert_eq!(
        endpoint.trim(),
        format!("{lb}/v1/webapi/automaticupgrades/channel/default")
    );
    assert!(!endpoint.contains(&auth_addr.port().to_string()));

    // An agent told only the load balancer holds a tunnel to each registered proxy.
    let ca_pem = std::fs::read(proxies[0].ca_file().unwrap()).unwrap();
    let agent_cfg_dir = tempfile::tempdir().unwrap();
    let agent_yaml = format!(
        "version: v1\nsvc:\n  data_dir: {}\n  proxy_server: {lb}\nauth_service:\n  enabled: false\nproxy_service:\n  enabled: false\nssh_service:\n  enabled: true\n",
        agent_cfg_dir.path().display()
    );
    let agent_cfg = svc_core::config::Config::from_yaml_str_with_hostname(&agent_yaml, "node-lb").unwrap();
    let started = Instant::now();
    let tunneled = AgentNode::from_config(&agent_cfg)
        .identity(auth.host_identity("node-lb", vec![SystemRole::Node]).unwrap())
        .dialer(direct_dialer())
        .proxy(Addr::from(lb), Some(ca_pem))
        .upgrade_dir(agent_cfg_dir.path().join("none"))
        .start()
        .within("the tunnel agent starting")
        .await
        .unwrap();
    let tunnels = tunneled.agent.as_ref().unwrap();
    tunnels
        .wait_for(|s| s.connected.len() == 2)
        .within("the agent holding a tunnel to both registered proxies")
        .await;
    println!(
        "FIGURE: with the registry (lists every 5 s), tunnels to both proxies after {:?}",
        started.elapsed()
    );

    // A clean stop removes the record; the agent lets go of that proxy.
    let stopped = proxies.remove(1);
    stopped.shutdown().within("the proxy's clean stop").await;
    assert_eq!(client.list_proxies().await.unwrap().len(), 1);
    tunnels
        .wait_for(|s| s.connected.len() == 1)
        .within("the agent letting go of the stopped proxy")
        .await;

    tunneled.shutdown().await;
    direct1.shutdown().await;
    direct2.shutdown().await;
    for p in proxies {
        p.shutdown().await;
    }
    auth.shutdown().await;
}
