//! End to end with the real binaries: the Proxy Service apart from the Auth Service.
//!
//! An Auth-only `svc start` (`proxy_service` and `ssh_service` disabled); a proxy-only
//! `svc start` joined with a `proxy` token from `tctl tokens add`, given a dead Auth address
//! before the real one; an agent joined and tunnelled through that proxy; `tsh login` and
//! `tsh ssh` through the proxy. Then the Auth Service is killed: the open session keeps going,
//! a new `tsh ssh` through the proxy still works (the proxy decides from its watched cache),
//! and `tsh login` fails at once with a message naming the Auth Service's addresses. `tctl`
//! given both addresses in its `--config` fails over to the live one.

mod common;
#[path = "../../svc-net/tests/support/netns.rs"]
mod netns;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::agent::Agent;
use common::svc::{Svc, token};
use common::{Run, SVC, TCTL, TSH, wait};

const PASSWORD: &str = "correct-horse-battery";

fn run(bin: &str, home: &Path, args: &[&str], stdin: Option<&str>) -> Run {
    common::run_client(bin, home, args, stdin)
}

fn dead_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let a = l.local_addr().expect("addr").to_string();
    drop(l);
    a
}

#[test]
fn a_proxy_apart_serves_tsh_and_keeps_routing_while_the_auth_service_is_down() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let home = dir.join("home");
    let auth_data = dir.join("auth-data");

    // The Auth Service alone.
    // On a fixed port, so that it can come back on the same address.
    let auth_port = dead_addr();
    let auth_yaml = dir.join("auth.yaml");
    std::fs::write(
        &auth_yaml,
        format!(
            "version: v1\nsvc:\n  data_dir: {}\nauth_service:\n  listen_addr: {auth_port}\n  cluster_name: apart.test\nproxy_service:\n  enabled: false\nssh_service:\n  enabled: false\n",
            auth_data.display()
        ),
    )
    .expect("auth.yaml");
    let mut auth = Svc::start(&auth_yaml, dir.join("auth.stderr"));
    let auth_addr = auth.line("auth");

    // The proxy alone: a dead Auth address first, the real one second.
    let (proxy_token, pin) = token(&auth_data, &home, "proxy");
    let dead = dead_addr();
    let proxy_yaml = dir.join("proxy.yaml");
    std::fs::write(
        &proxy_yaml,
        format!(
            "version: v1\nsvc:\n  nodename: proxy-1\n  data_dir: {}\n  auth_server:\n    - {dead}\n    - {auth_addr}\n  auth_token: {proxy_token}\n  ca_pin: {pin}\nauth_service:\n  enabled: false\nproxy_service:\n  enabled: true\n  web_listen_addr: 127.0.0.1:0\nssh_service:\n  enabled: false\n",
            dir.join("proxy-data").display()
        ),
    )
    .expect("proxy.yaml");
    let proxy = Svc::start(&proxy_yaml, dir.join("proxy.stderr"));
    let web = proxy.line("web").trim_start_matches("https://").to_owned();
    assert!(
        proxy.log().contains(&dead),
        "the proxy says it could not reach the dead address first:\n{}",
        proxy.log()
    );

    // An agent joined through the proxy (the Auth API under TLS routing) and tunnelled to it.
    let (node_token, _) = token(&auth_data, &home, "node");
    let agent_yaml = dir.join("agent.yaml");
    std::fs::write(
        &agent_yaml,
        format!(
            "version: v1\nsvc:\n  nodename: node-apart\n  data_dir: {}\n  proxy_server: {web}\n  auth_token: {node_token}\n  ca_pin: {pin}\nauth_service:\n  enabled: false\nproxy_service:\n  enabled: false\nssh_service:\n  enabled: true\n",
            dir.join("agent-data").display()
        ),
    )
    .expect("agent.yaml");
    let mut agent_cmd = Command::new(SVC);
    agent_cmd
        .args(["start", "--insecure", "--config"])
        .arg(&agent_yaml);
    let agent = Agent::start(agent_cmd, dir.join("agent.stderr"));

    // alice signs in through the proxy and reaches the node.
    let data = auth_data.to_string_lossy().into_owned();
    run(
        TCTL,
        &home,
        &[
            "--data-dir",
            &data,
            "users",
            "add",
            "alice",
            "--roles=access",
            "--logins=root",
            "--password-stdin",
        ],
        Some(PASSWORD),
    )
    .ok();
    let proxy_flag = format!("--proxy={web}");
    let login = || {
        run(
            TSH,
            &home,
            &["login", &proxy_flag, "--user=alice", "--insecure"],
            Some(&format!("{PASSWORD}\n")),
        )
    };
    login().ok();
    // The node is in the proxy's cache once its heartbeat reached the Auth Service.
    wait::wait_until(wait::STEP, "tsh ssh through the proxy apart", || {
        run(TSH, &home, &["ssh", "root@node-apart", "echo hello"], None).stdout == "hello\n"
    });

    // tctl with both Auth addresses in its configuration: the dead one first.
    let tctl_yaml = dir.join("tctl.yaml");
    std::fs::write(
        &tctl_yaml,
        format!(
            "version: v1\nsvc:\n  data_dir: {}\n  auth_server:\n    - {dead}\n    - {auth_addr}\nauth_service:\n  enabled: false\nproxy_service:\n  enabled: false\n",
            auth_data.display()
        ),
    )
    .expect("tctl.yaml");
    let status = run(
        TCTL,
        &home,
        &["--config", tctl_yaml.to_str().expect("utf-8"), "status"],
        None,
    )
    .ok();
    assert!(status.stdout.contains("apart.test"), "{}", status.stdout);

    // A session that stays open across the outage: established (it printed `ready`) before
    // the Auth Service goes, it finishes after.
    let answer = dir.join("answer");
    let script = format!("echo ready; read line; echo got $line > {}", answer.display());
    let mut open = Command::new(TSH)
        .args(["ssh", "root@node-apart", &script])
        .env("SVC_HOME", &home)
        .env_remove("RUST_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn tsh ssh");
    wait::first_line(open.stdout.take().expect("stdout"), wait::STEP, |l| {
        (l == "ready").then_some(())
    })
    .expect("the open session starts");

    // The Auth Service goes down.
    auth.kill9();
    let ssh = run(TSH, &home, &["ssh", "root@node-apart", "echo still here"], None);
    assert_eq!(
        ssh.stdout,
        "still here\n",
        "a new session while the Auth Service is down: {}\nproxy: {}\nagent: {}",
        ssh.stderr,
        proxy.log(),
        agent.log()
    );
    open.stdin
        .take()
        .expect("stdin")
        .write_all(b"through\n")
        .expect("write to the open session");
    let status = wait::wait_exit(&mut open, wait::STEP, "the session opened before the outage");
    assert!(status.success(), "the open session ended with {status}");
    assert_eq!(
        std::fs::read_to_string(&answer).unwrap_or_default(),
        "got through\n",
        "the session opened before the outage kept going"
    );

    // Signing in needs the Auth Service: a clear refusal naming it, never a hang.
    let refused = login();
    assert!(!refused.status.success(), "{}", refused.stdout);
    assert!(
        refused.stderr.contains(&auth_addr) && refused.stderr.contains("Auth Service"),
        "{}",
        refused.stderr
    );

    // The Auth Service comes back on its address: sign-ins work again, and the proxy's cache
    // follows it again (a lock made now refuses the next session through the proxy).
    let _auth = Svc::start(&auth_yaml, dir.join("auth-again.stderr"));
    wait::wait_until(wait::STEP, "a sign-in once the Auth Service is back", || {
        login().status.success()
    });
    run(
        TCTL,
        &home,
        &[
            "--data-dir",
            &data,
            "lock",
            "--user=alice",
            "--message=apart incident",
        ],
        None,
    )
    .ok();
    wait::wait_until(wait::STEP, "the lock reaching the proxy apart", || {
        let out = run(
            TSH,
            &home,
            &["ssh", "root@node-apart", "echo should-not-run"],
            None,
        );
        !out.status.success() && out.stderr.contains("apart incident")
    });
    drop(agent);
}

/// Proxy peering with the real binaries: an Auth-only `svc start` with
/// `tunnel_strategy: {type: proxy_peering, agent_connection_count: 1}`, three proxy-only
/// `svc start`s (each with its own `peer_listen_addr`), one agent told the first proxy's
/// address. The agent ends up tunnelled to one proxy only (the proxies log which), and
/// `tsh ssh`, signed in through each proxy, reaches it through every one of them: the proxies
/// learnt the strategy and each other's peer address and held agents from the registry. Then
/// the holding proxy is killed (`kill -9`, its record still listed): the agent moves and new
/// sessions through both remaining proxies reach it.
#[test]
fn proxy_peering_reaches_an_agent_through_every_proxy() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let admin_home = dir.join("admin-home");
    let auth_data = dir.join("auth-data");
    let auth_yaml = dir.join("auth.yaml");
    std::fs::write(
        &auth_yaml,
        format!(
            "version: v1\nsvc:\n  data_dir: {}\nauth_service:\n  listen_addr: 127.0.0.1:0\n  cluster_name: peering.test\n  tunnel_strategy:\n    type: proxy_peering\n    agent_connection_count: 1\nproxy_service:\n  enabled: false\nssh_service:\n  enabled: false\n",
            auth_data.display()
        ),
    )
    .expect("auth.yaml");
    let auth = Svc::start(&auth_yaml, dir.join("auth.stderr"));
    let auth_addr = auth.line("auth");

    let mut proxies = Vec::new();
    let mut webs = Vec::new();
    for i in 0..3 {
        let (token, pin) = token(&auth_data, &admin_home, "proxy");
        let yaml = dir.join(format!("proxy{i}.yaml"));
        std::fs::write(
            &yaml,
            format!(
                "version: v1\nsvc:\n  nodename: proxy-{i}\n  data_dir: {}\n  auth_server:\n    - {auth_addr}\n  auth_token: {token}\n  ca_pin: {pin}\nauth_service:\n  enabled: false\nproxy_service:\n  enabled: true\n  web_listen_addr: 127.0.0.1:0\n  peer_listen_addr: {}\nssh_service:\n  enabled: false\n",
                dir.join(format!("proxy{i}-data")).display(),
                dead_addr()
            ),
        )
        .expect("proxy.yaml");
        let proxy = Svc::start(&yaml, dir.join(format!("proxy{i}.stderr")));
        webs.push(proxy.line("web").trim_start_matches("https://").to_owned());
        proxies.push(proxy);
    }

    let (node_token, pin) = token(&auth_data, &admin_home, "node");
    let agent_yaml = dir.join("agent.yaml");
    std::fs::write(
        &agent_yaml,
        format!(
            "version: v1\nsvc:\n  nodename: node-peered\n  data_dir: {}\n  proxy_server: {}\n  auth_token: {node_token}\n  ca_pin: {pin}\nauth_service:\n  enabled: false\nproxy_service:\n  enabled: false\nssh_service:\n  enabled: true\n",
            dir.join("agent-data").display(),
            webs[0]
        ),
    )
    .expect("agent.yaml");
    let mut agent_cmd = Command::new(SVC);
    agent_cmd
        .args(["start", "--insecure", "--config"])
        .arg(&agent_yaml);
    let agent = Agent::start(agent_cmd, dir.join("agent.stderr"));

    let data = auth_data.to_string_lossy().into_owned();
    run(
        TCTL,
        &admin_home,
        &[
            "--data-dir",
            &data,
            "users",
            "add",
            "alice",
            "--roles=access",
            "--logins=root",
            "--password-stdin",
        ],
        Some(PASSWORD),
    )
    .ok();
    // Every proxy serves peering once it heard the strategy from the registry, and tells its
    // agents about all three proxies (a list every 5 seconds).
    for (i, p) in proxies.iter().enumerate() {
        wait::wait_until(
            wait::STEP,
            &format!("proxy-{i} serving proxy peering and listing the three proxies"),
            || {
                let log = p.log();
                log.contains("serving proxy peering")
                    && log
                        .lines()
                        .rfind(|l| l.contains("telling the agents about the cluster's proxies"))
                        .is_some_and(|l| l.matches(".peering.test").count() == 3)
            },
        );
    }
    for (i, web) in webs.iter().enumerate() {
        let home = dir.join(format!("home{i}"));
        let flag = format!("--proxy={web}");
        run(
            TSH,
            &home,
            &["login", &flag, "--user=alice", "--insecure"],
            Some(&format!("{PASSWORD}\n")),
        )
        .ok();
        let started = std::time::Instant::now();
        wait::wait_until(wait::STEP, &format!("tsh ssh through proxy-{i}"), || {
            run(TSH, &home, &["ssh", "root@node-peered", "echo hello"], None).stdout == "hello\n"
        });
        println!(
            "FIGURE: tsh ssh through proxy-{i} reached node-peered {:?} after sign-in",
            started.elapsed()
        );
    }
    // One tunnel only: the agent let go of every proxy but the one chosen for it.
    let holders: Vec<usize> = (0..3)
        .filter(|i| {
            let log = proxies[*i].log();
            log.matches("agent tunnel registered").count() > log.matches("agent tunnel closed").count()
        })
        .collect();
    assert_eq!(
        holders.len(),
        1,
        "exactly one proxy holds the agent's tunnel: {holders:?}\nagent: {}",
        agent.log()
    );

    // kill -9 the holding proxy (its record stays listed until it expires): the agent reaches
    // another proxy — its configured address or one it heard of — and new sessions through
    // both remaining proxies reach it.
    let holder = holders[0];
    proxies[holder].kill9();
    let killed = std::time::Instant::now();
    for i in (0..3).filter(|i| *i != holder) {
        let home = dir.join(format!("home{i}"));
        wait::wait_until(
            wait::STEP,
            &format!("tsh ssh through proxy-{i} after proxy-{holder} died"),
            || run(TSH, &home, &["ssh", "root@node-peered", "echo again"], None).stdout == "again\n",
        );
        println!(
            "FIGURE: tsh ssh through proxy-{i} reached node-peered {:?} after its proxy was killed",
            killed.elapsed()
        );
    }
    drop(agent);
}

/// `text` without ANSI colour sequences (`ESC [ ... m`), which svc's log may carry.
fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Whether the proxy whose log is `log` holds a tunnel from `node` now (more registrations
/// than closings).
fn holds(log: &str, node: &str) -> bool {
    let needle = format!("node={node} ");
    let log = plain(log);
    let count = |what: &str| {
        log.lines()
            .filter(|l| l.contains(what) && format!("{l} ").contains(&needle))
            .count()
    };
    count("agent tunnel registered") > count("agent tunnel closed")
}

fn loopback(port: u16) -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], port))
}

/// The peering identity of a saved `ClientIdentity` (a proxy's, an agent's, or a tsh profile's).
fn peer_identity(identity: &svc_net::auth::ClientIdentity) -> svc_net::tunnel::PeerIdentity {
    let (chain, key) = identity
        .tls_parts()
        .expect("the identity's TLS certificate and key");
    svc_net::tunnel::PeerIdentity {
        host_id: identity.name.clone(),
        verifier: std::sync::Arc::new(identity.verifier().expect("the identity's verifier")),
        chain,
        key,
    }
}

/// A dial through the peer port at `peer_addr` (the proxy `peer_id`) to `agent`, as a proxy
/// presenting `identity` would make it.
fn dial_as(
    identity: &svc_net::tunnel::PeerIdentity,
    peer_id: &str,
    peer_addr: &str,
    agent: &str,
) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let dialer = svc_net::tunnel::PeerDialer::new(identity).map_err(|e| e.to_string())?;
        dialer.set_peers(vec![svc_net::tunnel::Peer::new(
            peer_id,
            peer_addr,
            vec![agent.to_owned()],
        )]);
        let req = svc_net::tunnel::DialRequest {
            address: "127.0.0.1:3022".into(),
            server_id: agent.to_owned(),
            conn_type: svc_core::auth::ServedKind::Node,
            client_src_addr: "127.0.0.1:5000".into(),
            client_dst_addr: "127.0.0.1:3080".into(),
            db_route: None,
        };
        tokio::time::timeout(wait::STEP, dialer.dial(&req))
            .await
            .map_err(|_| format!("the dial did not finish within {:?}", wait::STEP))?
            .map(drop)
            .map_err(|e| e.to_string())
    })
}

/// The host certificates' lifetime the proxies ask for when they renew (`SVC_HOST_CERT_TTL`).
const CERT_TTL_SECS: &str = "45";

/// What `openssl s_client` says connecting to `addr` without a client certificate. It reads
/// until the server closes the connection (`-ign_eof`: with TLS 1.3 the refusal of a missing
/// client certificate arrives after the client's side of the handshake), 60 seconds at most.
fn s_client(addr: &str) -> String {
    let out = Command::new(svc_testkit::require("timeout", "coreutils"))
        .arg("60")
        .arg(svc_testkit::require("openssl", "openssl"))
        .args(["s_client", "-connect", addr, "-alpn", "h2", "-ign_eof"])
        .stdin(Stdio::null())
        .output()
        .expect("openssl s_client (Debian package openssl)");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The first PEM certificate in `text` (s_client's "Server certificate").
fn server_cert_pem(text: &str) -> String {
    let begin = "-----BEGIN CERTIFICATE-----";
    let end = "-----END CERTIFICATE-----";
    match (text.find(begin), text.find(end)) {
        (Some(b), Some(e)) if e > b => format!("{}\n", &text[b..e + end.len()]),
        _ => String::new(),
    }
}

/// The serial and end of validity of the first certificate in `pem` (`openssl x509`).
fn cert_fields(pem: &str) -> String {
    let first = server_cert_pem(pem);
    if first.is_empty() {
        return "no certificate".into();
    }
    let mut child = Command::new(svc_testkit::require("openssl", "openssl"))
        .args(["x509", "-noout", "-serial", "-enddate"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("openssl x509 (Debian package openssl)");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(first.as_bytes())
        .expect("write the certificate");
    let out = child.wait_with_output().expect("openssl x509");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// How long an agent whose proxy died may take to be reachable again: its reconnect backoff
/// (at most 8 s between dials, with jitter) and the registry's 5-second refresh, with room for
/// a loaded two-core machine running debug builds.
const MOVE_BOUND: std::time::Duration = std::time::Duration::from_secs(90);

/// Proxy peering in the documented topology, with the real binaries and real third parties:
/// an Auth-only `svc start` with `tunnel_strategy: {type: proxy_peering,
/// agent_connection_count: 1}`; three proxy-only `svc start`s behind `haproxy` (TCP mode,
/// round robin, PROXY v2, plus one pinned frontend per proxy), each serving peering on its own
/// `peer_listen_addr`; three agents whose `proxy_server` is the load balancer and whose only
/// configured way out is an authenticating `tinyproxy` (`HTTPS_PROXY`). Each agent ends up with
/// one tunnel, to the proxy chosen for it, and `tsh ssh` signed in through each proxy's pinned
/// frontend (and through the round-robin frontend) reaches every agent, whichever proxy holds
/// it. The peer port refuses a client without a certificate, with a user's certificate or with
/// an agent's host certificate, and serves another proxy's identity. Then the proxy holding the
/// first agent is killed (`kill -9`): the agent moves to another proxy, and `tsh ssh` through
/// each remaining proxy reaches every agent again within [`MOVE_BOUND`]. The proxies ask for
/// host certificates of [`CERT_TTL_SECS`] (`SVC_HOST_CERT_TTL`): the peer port presents the
/// renewed one (the serial and end of validity of the identity saved last), and after a second
/// renewal of the remaining proxies every path still reaches every agent.
#[test]
fn proxy_peering_behind_haproxy_with_agents_behind_tinyproxy() {
    use svc_testkit::haproxy::{Haproxy, HaproxyConfig};
    use svc_testkit::tinyproxy::{Tinyproxy, TinyproxyConfig};
    const NODES: [&str; 3] = ["node-p0", "node-p1", "node-p2"];

    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let admin_home = dir.join("admin-home");
    let auth_data = dir.join("auth-data");
    let auth_yaml = dir.join("auth.yaml");
    std::fs::write(
        &auth_yaml,
        format!(
            "version: v1\nsvc:\n  data_dir: {}\nauth_service:\n  listen_addr: 127.0.0.1:0\n  cluster_name: peering-lb.test\n  tunnel_strategy:\n    type: proxy_peering\n    agent_connection_count: 1\nproxy_service:\n  enabled: false\nssh_service:\n  enabled: false\n",
            auth_data.display()
        ),
    )
    .expect("auth.yaml");
    let auth = Svc::start(&auth_yaml, dir.join("auth.stderr"));
    let auth_addr = auth.line("auth");

    // The agents' network namespace: its only way out is tinyproxy; the proxies and the load
    // balancer listen on an address the namespace has no route to.
    let net = netns::Net::create();
    let on_proxy_ip = |port: u16| std::net::SocketAddr::new(net.proxy_ip, port);
    let proxy_ip = net.proxy_ip.to_string();
    // haproxy in front of the three proxies' web ports: round robin, and one pinned frontend
    // per proxy (a client's path to a chosen proxy through the load balancer).
    let free = || svc_testkit::free_port("127.0.0.1");
    let web_ports: Vec<u16> = (0..3).map(|_| svc_testkit::free_port(&proxy_ip)).collect();
    let peer_addrs: Vec<String> = (0..3).map(|_| loopback(free()).to_string()).collect();
    let pinned: Vec<std::net::SocketAddr> = (0..3).map(|_| loopback(free())).collect();
    let lb_addr = on_proxy_ip(svc_testkit::free_port(&proxy_ip));
    let mut lb_config = HaproxyConfig::new(lb_addr, web_ports.iter().map(|p| on_proxy_ip(*p)).collect());
    lb_config.pinned = pinned.iter().enumerate().map(|(i, a)| (*a, i)).collect();
    let lb = Haproxy::start(lb_config);

    let mut proxies = Vec::new();
    let mut proxy_ids = Vec::new();
    for i in 0..3 {
        let (token, pin) = token(&auth_data, &admin_home, "proxy");
        let data = dir.join(format!("proxy{i}-data"));
        let yaml = dir.join(format!("proxy{i}.yaml"));
        std::fs::write(
            &yaml,
            format!(
                "version: v1\nsvc:\n  nodename: proxy-{i}\n  data_dir: {}\n  auth_server:\n    - {auth_addr}\n  auth_token: {token}\n  ca_pin: {pin}\nauth_service:\n  enabled: false\nproxy_service:\n  enabled: true\n  web_listen_addr: {}\n  peer_listen_addr: {}\n  proxy_protocol: on\n  proxy_protocol_trusted_networks: [127.0.0.1, {proxy_ip}]\nssh_service:\n  enabled: false\n",
                data.display(),
                on_proxy_ip(web_ports[i]),
                peer_addrs[i]
            ),
        )
        .expect("proxy.yaml");
        // Short-lived host certificates: each proxy renews them every few tens of seconds
        // while the test runs, and peering must present the renewed ones.
        proxies.push(Svc::start_with_env(
            &yaml,
            dir.join(format!("proxy{i}.stderr")),
            &[("SVC_HOST_CERT_TTL", CERT_TTL_SECS)],
        ));
        proxy_ids.push(
            svc_net::auth::ClientIdentity::load(&data.join("proxy-identity.json"))
                .expect("the proxy's saved identity")
                .name,
        );
    }
    for (i, p) in proxies.iter().enumerate() {
        wait::wait_until(
            wait::STEP,
            &format!("proxy-{i} serving proxy peering and listing the three proxies"),
            || {
                let log = plain(&p.log());
                log.contains("serving proxy peering")
                    && log
                        .lines()
                        .rfind(|l| l.contains("telling the agents about the cluster's proxies"))
                        .is_some_and(|l| l.matches(".peering-lb.test").count() == 3)
            },
        );
    }

    // Three agents: the load balancer as their proxy, tinyproxy (basic auth) as their way out.
    let tiny = Tinyproxy::start(TinyproxyConfig::new(
        std::net::SocketAddr::new(net.host_ip, svc_testkit::free_port(&net.host_ip.to_string())),
        netns::PROXY_USER,
        netns::PROXY_PASSWORD,
    ));
    assert!(
        !net.can_reach(net.proxy_ip, lb_addr.port()),
        "the agents' namespace must have no route to the load balancer"
    );
    let mut agents = Vec::new();
    for node in NODES {
        let (node_token, pin) = token(&auth_data, &admin_home, "node");
        let yaml = dir.join(format!("{node}.yaml"));
        std::fs::write(
            &yaml,
            format!(
                "version: v1\nsvc:\n  nodename: {node}\n  data_dir: {}\n  proxy_server: {lb_addr}\n  auth_token: {node_token}\n  ca_pin: {pin}\nauth_service:\n  enabled: false\nproxy_service:\n  enabled: false\nssh_service:\n  enabled: true\n",
                dir.join(format!("{node}-data")).display()
            ),
        )
        .expect("agent.yaml");
        let mut cmd = net.command(SVC);
        cmd.args(["start", "--insecure", "--config"])
            .arg(&yaml)
            .env("HTTPS_PROXY", tiny.url());
        agents.push(Agent::start(cmd, dir.join(format!("{node}.stderr"))));
    }

    // alice signs in through each pinned frontend and through the round-robin one.
    let data = auth_data.to_string_lossy().into_owned();
    run(
        TCTL,
        &admin_home,
        &[
            "--data-dir",
            &data,
            "users",
            "add",
            "alice",
            "--roles=access",
            "--logins=root",
            "--password-stdin",
        ],
        Some(PASSWORD),
    )
    .ok();
    let mut homes: Vec<(String, PathBuf)> = pinned
        .iter()
        .enumerate()
        .map(|(i, a)| (format!("proxy-{i} (pinned frontend {a})"), *a))
        .chain(std::iter::once((format!("the load balancer {lb_addr}"), lb_addr)))
        .enumerate()
        .map(|(n, (what, addr))| {
            let home = dir.join(format!("home{n}"));
            let flag = format!("--proxy={addr}");
            wait::wait_until(wait::STEP, &format!("tsh login through {what}"), || {
                run(
                    TSH,
                    &home,
                    &["login", &flag, "--user=alice", "--insecure"],
                    Some(&format!("{PASSWORD}\n")),
                )
                .status
                .success()
            });
            (what, home)
        })
        .collect();

    // Every path reaches every agent, whichever proxy holds it.
    let reach_all = |homes: &[(String, PathBuf)], phase: &str, limit: std::time::Duration| {
        let started = std::time::Instant::now();
        for node in NODES {
            for (what, home) in homes {
                wait::wait_until(
                    limit,
                    &format!("{phase}: tsh ssh root@{node} through {what}"),
                    || run(TSH, home, &["ssh", &format!("root@{node}"), "echo up"], None).stdout == "up\n",
                );
            }
        }
        println!(
            "FIGURE: {phase}: every agent reached through every path {:.1?} after the check began",
            started.elapsed()
        );
    };
    reach_all(&homes, "start", wait::STEP);

    // Each agent holds exactly one tunnel, to one proxy.
    let mut holder = Vec::new();
    for (a, node) in NODES.iter().enumerate() {
        let mut held = Vec::new();
        wait::wait_until(wait::STEP, &format!("{node} held by exactly one proxy"), || {
            held = (0..3).filter(|i| holds(&proxies[*i].log(), node)).collect();
            held.len() == 1
        });
        println!("{node} is held by proxy-{}", held[0]);
        assert!(
            plain(&agents[a].log()).contains("reverse tunnel established"),
            "{node}: {}",
            agents[a].log()
        );
        holder.push(held[0]);
    }
    // The agents went out through tinyproxy: to the load balancer first, then to the proxies
    // chosen for them.
    let tiny_log = tiny.log();
    assert!(
        tiny_log.contains(&lb_addr.to_string()),
        "the agents reached the load balancer through tinyproxy:\n{tiny_log}"
    );
    for i in holder.iter() {
        assert!(
            tiny_log.contains(&on_proxy_ip(web_ports[*i]).to_string()),
            "the agents reached proxy-{i} through tinyproxy:\n{tiny_log}"
        );
    }

    // The peer port of the first agent's proxy: only a proxy identity is served.
    let target = holder[0];
    let agent_id = agents[0].host_id.clone();
    let other = (target + 1) % 3;
    let load = |path: PathBuf| svc_net::auth::ClientIdentity::load(&path).expect("a saved identity");
    let proxy_identity = peer_identity(&load(dir.join(format!("proxy{other}-data/proxy-identity.json"))));
    dial_as(
        &proxy_identity,
        &proxy_ids[target],
        &peer_addrs[target],
        &agent_id,
    )
    .unwrap_or_else(|e| panic!("proxy-{other}'s identity refused on proxy-{target}'s peer port: {e}"));
    // No client certificate: the TLS handshake is refused (openssl's own client).
    let said = s_client(&peer_addrs[target]);
    assert!(
        said.contains("certificate required") || said.contains("alert number 116"),
        "a client without a certificate on the peer port: {said}"
    );
    // The peer port presents the proxy's renewed certificate (the one saved last, renewed
    // since the start), without a restart.
    let saved_path = dir.join(format!("proxy{target}-data/proxy-identity.json"));
    let mut renewals = 0;
    let mut presented = String::new();
    wait::wait_until(
        wait::STEP,
        &format!("proxy-{target}'s peer port presenting its renewed certificate"),
        || {
            let saved = load(saved_path.clone());
            renewals = plain(&proxies[target].log())
                .matches("proxy peering presents the renewed host certificate")
                .count();
            presented = cert_fields(&server_cert_pem(&s_client(&peer_addrs[target])));
            renewals >= 1 && presented == cert_fields(&saved.tls_cert_pem)
        },
    );
    println!("proxy-{target} renewed {renewals} time(s); its peer port presents {presented}");
    // A user's certificate (alice's, from her tsh profile) and an agent's host certificate.
    let profile: serde_json::Value =
        serde_json::from_slice(&std::fs::read(homes[0].1.join("profile.json")).expect("alice's tsh profile"))
            .expect("profile json");
    let user_file = dir.join("alice-identity.json");
    std::fs::write(&user_file, profile["identity"].to_string()).expect("alice's identity");
    for (what, identity) in [
        ("a user certificate", peer_identity(&load(user_file))),
        (
            "an agent's host certificate",
            peer_identity(&load(dir.join(format!("{}-data/host-identity.json", NODES[1])))),
        ),
    ] {
        let err = match dial_as(&identity, &proxy_ids[target], &peer_addrs[target], &agent_id) {
            Ok(()) => panic!("proxy-{target}'s peer port served {what}"),
            Err(e) => e,
        };
        println!("{what} on the peer port: {err}");
        assert!(
            err.contains(&agent_id) && err.contains(&proxy_ids[target]),
            "{what}: the failure names the agent and the peer: {err}"
        );
    }
    wait::wait_until(
        wait::STEP,
        "the refusal of the agent's certificate logged",
        || {
            plain(&proxies[target].log())
                .contains("refused a proxy peering connection: not a proxy of this cluster")
        },
    );

    // kill -9 the proxy holding the first agent: it moves to another proxy, and every
    // remaining path reaches every agent again.
    proxies[target].kill9();
    let killed = std::time::Instant::now();
    homes.remove(target);
    let mut moved_to = None;
    wait::wait_until(
        MOVE_BOUND,
        &format!(
            "{} held by a remaining proxy after proxy-{target} was killed",
            NODES[0]
        ),
        || {
            moved_to = (0..3)
                .filter(|i| *i != target)
                .find(|i| holds(&proxies[*i].log(), NODES[0]));
            moved_to.is_some()
        },
    );
    println!(
        "FIGURE: {} held by proxy-{} {:.1?} after proxy-{target} was killed",
        NODES[0],
        moved_to.unwrap_or_default(),
        killed.elapsed()
    );
    reach_all(&homes, "after kill -9", MOVE_BOUND);
    println!(
        "FIGURE: every agent reachable through every remaining path {:.1?} after proxy-{target} was killed",
        killed.elapsed()
    );

    // The remaining proxies renew again (the certificates of their first renewal end 45 s after
    // it): peering keeps working, and the peer port presents the latest certificate.
    let renewal_bound =
        std::time::Duration::from_secs(2 * CERT_TTL_SECS.parse::<u64>().expect("ttl")) + wait::STEP;
    for i in (0..3).filter(|i| *i != target) {
        let saved_path = dir.join(format!("proxy{i}-data/proxy-identity.json"));
        wait::wait_until(
            renewal_bound,
            &format!("proxy-{i} renewing its certificates a second time, its peer port presenting them"),
            || {
                let saved = load(saved_path.clone());
                plain(&proxies[i].log())
                    .matches("proxy peering presents the renewed host certificate")
                    .count()
                    >= 2
                    && cert_fields(&server_cert_pem(&s_client(&peer_addrs[i])))
                        == cert_fields(&saved.tls_cert_pem)
            },
        );
    }
    reach_all(&homes, "after the second renewal", wait::STEP);
    drop(agents);
    drop(lb);
    drop(tiny);
}
