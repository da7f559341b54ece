//! Tunnel faults: a proxy restart (the agent reconnects within the backoff bound and new
//! sessions work), an agent restart (the proxy marks it gone and back), one agent's death never
//! disturbing another's sessions, forged and expired agent certificates refused, and an agent a
//! major version ahead refused with a message the agent logs.
#![allow(clippy::unwrap_used)]

mod tunnel_support;

use std::time::{Duration, SystemTime};

use russh::ChannelMsg;
use svc_core::identity::SystemRole;
use tunnel_support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_reconnects_after_a_proxy_restart() {
    init_tracing();
    let cluster = Cluster::new();
    let proxy = start_proxy(&cluster, ProxyOpts::default()).await;
    let (web, creds, tls) = (proxy.web, proxy.creds.clone(), proxy.tls.clone());
    let node = cluster.host(&[SystemRole::Node], "node-r");
    let agent = start_agent(&cluster, web, &node);
    proxy
        .tunnel
        .registry()
        .wait_for("node-r", |a| a.is_some())
        .within("node-r registering with the proxy")
        .await;
    assert_eq!(
        ssh_exec(&proxy, &cluster, "node-r", "echo one").await.stdout(),
        "one\n"
    );

    proxy.shutdown().await;
    agent
        .wait_for(|s| s.connected.is_empty())
        .within("the agent's status reaching `s.connected.is_empty()`")
        .await;
    // Same address, same identity: the agent's backoff (100 ms steps, at most 800 ms here)
    // brings it back without any help.
    let proxy = start_proxy_with(
        &cluster,
        ProxyOpts {
            web_port: web.port(),
            ..Default::default()
        },
        Some(creds),
        Some(tls),
    )
    .await;
    proxy
        .tunnel
        .registry()
        .wait_for("node-r", |a| a.is_some_and(|a| a.online))
        .within("node-r online in the proxy's registry")
        .await;
    agent
        .wait_for(|s| s.established >= 2)
        .within("the agent's status reaching `s.established >= 2`")
        .await;
    assert_eq!(
        ssh_exec(&proxy, &cluster, "node-r", "echo two").await.stdout(),
        "two\n"
    );
    agent.shutdown().await;
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_restart_is_seen_and_never_disturbs_another_agent() {
    init_tracing();
    let cluster = Cluster::new();
    let proxy = start_proxy(
        &cluster,
        ProxyOpts {
            separate: true,
            ..Default::default()
        },
    )
    .await;
    let (a_creds, b_creds) = (
        cluster.host(&[SystemRole::Node], "node-a"),
        cluster.host(&[SystemRole::Node], "node-b"),
    );
    let a = start_agent(&cluster, proxy.web, &a_creds);
    let b = start_agent(&cluster, proxy.web, &b_creds);
    let reg = proxy.tunnel.registry().clone();
    reg.wait_for("node-a", |a| a.is_some())
        .within("node-a registering with the proxy")
        .await;
    reg.wait_for("node-b", |a| a.is_some())
        .within("node-b registering with the proxy")
        .await;

    // A live interactive session on B.
    let user = cluster.user("alice", &["root"]);
    let session = node_session(&proxy, &cluster, &user, "node-b").await;
    let mut ch = session.channel_open_session().await.unwrap();
    ch.exec(true, "cat").await.unwrap();
    ch.data(&b"before\n"[..]).await.unwrap();
    let mut echoed = Vec::new();
    async {
        while !echoed.ends_with(b"before\n") {
            match ch.wait().await {
                Some(ChannelMsg::Data { data }) => echoed.extend_from_slice(&data),
                Some(_) => {}
                None => panic!("the channel closed before `before` was echoed"),
            }
        }
    }
    .within("`cat` on node-b echoing `before`")
    .await;
    assert!(reg.get("node-b").unwrap().live_sessions >= 1);

    // A dies: the proxy drops it; B's session carries on.
    a.shutdown().await;
    reg.wait_for("node-a", |a| a.is_none())
        .within("node-a leaving the proxy's registry")
        .await;
    ch.data(&b"after\n"[..]).await.unwrap();
    ch.eof().await.unwrap();
    let mut status = None;
    async {
        while let Some(msg) = ch.wait().await {
            match msg {
                ChannelMsg::Data { data } => echoed.extend_from_slice(&data),
                ChannelMsg::ExitStatus { exit_status } => status = Some(exit_status),
                ChannelMsg::Close => break,
                _ => {}
            }
        }
    }
    .within("`cat` on node-b echoing `after` and exiting")
    .await;
    assert_eq!(String::from_utf8_lossy(&echoed), "before\nafter\n");
    assert_eq!(status, Some(0));

    // A comes back with the same identity and is reachable again.
    let a = start_agent(&cluster, proxy.web, &a_creds);
    reg.wait_for("node-a", |a| a.is_some_and(|a| a.online))
        .within("node-a online in the proxy's registry")
        .await;
    assert_eq!(
        ssh_exec(&proxy, &cluster, "node-a", "echo back").await.stdout(),
        "back\n"
    );
    let _ = session.disconnect(russh::Disconnect::ByApplication, "", "").await;
    a.shutdown().await;
    b.shutdown().await;
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_and_expired_agent_certificates_are_refused() {
    init_tracing();
    let cluster = Cluster::new();
    let proxy = start_proxy(&cluster, ProxyOpts::default()).await;

    // Signed by another host CA that claims the same cluster name.
    let forger = Cluster::new();
    let forged = forger.host(&[SystemRole::Node], "forged");
    let a = start_agent_with(
        agent_config(&cluster, proxy.web, &forged, "17.0.0"),
        &cluster,
        &forged,
    );
    a.wait_for(|s| s.last_error.is_some())
        .within("the agent's status reaching `s.last_error.is_some()`")
        .await;
    let err = a.status().last_error.unwrap();
    assert!(err.contains("refused the agent's host certificate"), "{err}");

    // Signed by the right CA, but expired an hour ago.
    let expired = cluster.host_at(
        &[SystemRole::Node],
        "expired",
        SystemTime::now() - Duration::from_secs(7200),
        Duration::from_secs(3600),
    );
    let b = start_agent_with(
        agent_config(&cluster, proxy.web, &expired, "17.0.0"),
        &cluster,
        &expired,
    );
    b.wait_for(|s| s.last_error.is_some())
        .within("the agent's status reaching `s.last_error.is_some()`")
        .await;
    let err = b.status().last_error.unwrap();
    assert!(err.contains("refused the agent's host certificate"), "{err}");

    assert!(
        proxy.tunnel.registry().list().is_empty(),
        "no refused agent is registered"
    );
    assert_eq!(a.status().established + b.status().established, 0);
    a.shutdown().await;
    b.shutdown().await;
    proxy.shutdown().await;
}

// Current-thread runtime: every task runs on this thread, so the thread-local log capture
// sees the agent's log lines.
#[tokio::test]
async fn an_agent_a_major_version_ahead_is_refused_and_says_why() {
    let logs = CapturedLogs::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let cluster = Cluster::new();
    let proxy = start_proxy(&cluster, ProxyOpts::default()).await;
    let node = cluster.host(&[SystemRole::Node], "node-next");
    let agent = start_agent_with(
        agent_config(&cluster, proxy.web, &node, "18.0.0"),
        &cluster,
        &node,
    );
    agent
        .wait_for(|s| {
            s.last_error
                .as_deref()
                .is_some_and(|e| e.contains("incompatible"))
        })
        .within("the agent's status reaching an `incompatible` error")
        .await;
    let err = agent.status().last_error.unwrap();
    assert!(
        err.contains("agent version v18.0.0 is incompatible with cluster version v17.0.0"),
        "{err}"
    );
    let line = logs
        .wait_for_line("the agent logging the refusal", |l| {
            l.contains("ERROR") && l.contains("the proxy closed the reverse tunnel")
        })
        .await;
    assert!(line.contains("newer major version than the cluster"), "{line}");
    assert!(proxy.tunnel.registry().get("node-next").is_none());

    // One major behind is fine.
    let old = cluster.host(&[SystemRole::Node], "node-prev");
    let agent2 = start_agent_with(agent_config(&cluster, proxy.web, &old, "16.4.1"), &cluster, &old);
    proxy
        .tunnel
        .registry()
        .wait_for("node-prev", |a| a.is_some())
        .within("node-prev registering with the proxy")
        .await;
    assert_eq!(
        proxy
            .tunnel
            .registry()
            .get("node-prev")
            .unwrap()
            .version
            .to_string(),
        "v16.4.1"
    );
    agent.shutdown().await;
    agent2.shutdown().await;
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_request_drains_the_old_tunnel_and_dials_a_new_one() {
    init_tracing();
    let cluster = Cluster::new();
    let proxy = start_proxy(&cluster, ProxyOpts::default()).await;
    let node = cluster.host(&[SystemRole::Node], "node-rc");
    let agent = start_agent(&cluster, proxy.web, &node);
    let reg = proxy.tunnel.registry().clone();
    reg.wait_for("node-rc", |a| a.is_some())
        .within("node-rc registering with the proxy")
        .await;
    agent
        .wait_for(|s| s.established == 1)
        .within("the agent's status reaching `s.established == 1`")
        .await;

    // A session on the old tunnel survives the drain.
    let user = cluster.user("alice", &["root"]);
    let session = node_session(&proxy, &cluster, &user, "node-rc").await;
    assert_eq!(proxy.tunnel.request_reconnect(&node.host_id).await, 1);
    agent
        .wait_for(|s| s.established == 2)
        .within("the agent's status reaching `s.established == 2`")
        .await;
    assert_eq!(exec(&session, "echo old").await.stdout(), "old\n");
    // New sessions use the new tunnel.
    assert_eq!(
        ssh_exec(&proxy, &cluster, "node-rc", "echo new").await.stdout(),
        "new\n"
    );
    // Once its last session ends the old tunnel closes.
    let _ = session.disconnect(russh::Disconnect::ByApplication, "", "").await;
    let host_id = node.host_id.clone();
    let wait = reg.wait_until(|all| all.iter().filter(|a| a.host_id == host_id).count() == 1);
    tokio::time::timeout(Duration::from_secs(30), wait)
        .await
        .expect("the drained tunnel closes after its last session");
    agent.shutdown().await;
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_keeps_a_tunnel_to_every_discovered_proxy() {
    keeps_a_tunnel_to_every_discovered_proxy(true, true).await;
}

/// An agent that predates pings keeps its discovery channel open and hears of B on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_predates_pings_hears_of_every_proxy_on_its_discovery_channel() {
    keeps_a_tunnel_to_every_discovered_proxy(false, true).await;
}

/// Proxies that predate pings refuse them: the agent opens the heartbeat and discovery
/// channels instead, and hears of B there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_falls_back_to_channels_with_proxies_that_predate_pings() {
    keeps_a_tunnel_to_every_discovered_proxy(true, false).await;
}

/// The agent hears of proxy B from proxy A — pushed (`agent_pings` with a proxy that
/// `answers_pings`), or on the discovery channel — and keeps a tunnel to both; sessions go
/// through either.
async fn keeps_a_tunnel_to_every_discovered_proxy(agent_pings: bool, answers_pings: bool) {
    init_tracing();
    let cluster = Cluster::new();
    let a = start_proxy(
        &cluster,
        ProxyOpts {
            answer_pings: answers_pings,
            ..Default::default()
        },
    )
    .await;
    let b = start_proxy(
        &cluster,
        ProxyOpts {
            separate: true,
            answer_pings: answers_pings,
            ..Default::default()
        },
    )
    .await;
    let node = cluster.host(&[SystemRole::Node], "node-disc");
    // The agent is told only about A; A announces B once the agent is registered (pushed to an
    // agent that pings, or on the discovery channel).
    let config = agent_config(&cluster, a.web, &node, "17.0.0").with_ping(agent_pings);
    let agent = start_agent_with(config, &cluster, &node);
    a.tunnel
        .registry()
        .wait_for("node-disc", |x| x.is_some_and(|x| x.online))
        .within("node-disc online in proxy A's registry")
        .await;
    a.tunnel.set_proxies(svc_net::tunnel::Discovery {
        proxies: vec![svc_net::tunnel::DiscoveredProxy {
            proxy_id: b.creds.host_id.clone(),
            tunnel_addr: b.tunnel_addr.unwrap().to_string(),
            tls_routing: false,
        }],
        ..Default::default()
    });
    b.tunnel
        .registry()
        .wait_for("node-disc", |x| x.is_some_and(|x| x.online))
        .within("node-disc online in the proxy's registry")
        .await;
    agent
        .wait_for(|s| s.connected.len() == 2)
        .within("the agent's status reaching `s.connected.len() == 2`")
        .await;
    assert!(agent.status().connected.contains(&b.creds.host_id));
    assert_eq!(
        ssh_exec(&b, &cluster, "node-disc", "echo via b").await.stdout(),
        "via b\n"
    );
    assert_eq!(
        ssh_exec(&a, &cluster, "node-disc", "echo via a").await.stdout(),
        "via a\n"
    );
    agent.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_agent_is_marked_offline_but_its_live_sessions_continue() {
    init_tracing();
    let cluster = Cluster::new();
    // The proxy expects a heartbeat every 3 s (offline after 2 missed, 6 s: the session below
    // is open long before that even on a machine that stalls for 2 s); the agent sends one at
    // connect and then only hourly.
    let proxy = start_proxy(
        &cluster,
        ProxyOpts {
            tunables: svc_net::tunnel::Tunables::default().with_keepalive(Duration::from_secs(3), 2),
            ..Default::default()
        },
    )
    .await;
    let node = cluster.host(&[SystemRole::Node], "node-quiet");
    let config = agent_config(&cluster, proxy.web, &node, "17.0.0")
        .with_tunables(svc_net::tunnel::Tunables::default().with_keepalive(Duration::from_secs(3600), 3));
    let agent = start_agent_with(config, &cluster, &node);
    let reg = proxy.tunnel.registry().clone();
    reg.wait_for("node-quiet", |a| a.is_some())
        .within("node-quiet registering with the proxy")
        .await;
    let user = cluster.user("alice", &["root"]);
    let session = node_session(&proxy, &cluster, &user, "node-quiet").await;

    reg.wait_for("node-quiet", |a| a.is_some_and(|a| !a.online))
        .within("node-quiet marked offline in the proxy's registry")
        .await;
    let info = reg.get("node-quiet").unwrap();
    assert!(info.live_sessions >= 1, "{info:?}");
    // The live session keeps working; new connections are not sent to an offline agent.
    assert_eq!(exec(&session, "echo still here").await.stdout(), "still here\n");
    let err = svc_net::client::connect_via_proxy(&proxy.ssh_endpoint(&cluster), &user, "node-quiet", 0)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no agent tunnel"), "{err}");
    let _ = session.disconnect(russh::Disconnect::ByApplication, "", "").await;
    agent.shutdown().await;
    proxy.shutdown().await;
}

/// A dial the proxy gave up on (the agent's target answered after the proxy's deadline) does
/// not leave a connection behind: when the agent confirms the channel late, the proxy closes
/// it, and the agent closes its side of the target connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dial_confirmed_after_the_proxys_deadline_is_closed_on_both_ends() {
    use svc_net::tunnel::{DialRequest, TunnelAgent, TunnelError, dial_service_fn};
    use tokio::io::AsyncReadExt;
    init_tracing();
    let cluster = Cluster::new();
    let mut tunables = fast_tunables();
    let deadline = Duration::from_secs(3);
    tunables.handshake_timeout = deadline;
    let proxy = start_proxy(
        &cluster,
        ProxyOpts {
            tunables,
            ..Default::default()
        },
    )
    .await;
    let node = cluster.host(&[SystemRole::Node], "node-slow");
    // The agent's service answers twice the proxy's deadline late, and hands the test the far
    // end of the stream it returns.
    let (far_tx, mut far_rx) = tokio::sync::mpsc::unbounded_channel();
    let service = dial_service_fn(move |_req: DialRequest| {
        let far_tx = far_tx.clone();
        async move {
            tokio::time::sleep(deadline * 2).await;
            let (near, far) = tokio::io::duplex(1024);
            let _ = far_tx.send(far);
            Ok(Box::new(near) as svc_net::io::BoxIo)
        }
    });
    let agent = TunnelAgent::new(agent_config(&cluster, proxy.web, &node, "17.0.0"), service)
        .unwrap()
        .spawn();
    let reg = proxy.tunnel.registry().clone();
    reg.wait_for("node-slow", |a| a.is_some_and(|a| a.open_dial))
        .within("node-slow registering with the dial in the open")
        .await;

    let req = DialRequest {
        address: "slow:1".into(),
        server_id: "node-slow".into(),
        conn_type: svc_core::auth::ServedKind::App,
        client_src_addr: "127.0.0.1:5000".into(),
        client_dst_addr: "127.0.0.1:443".into(),
        db_route: None,
    };
    let err = proxy
        .tunnel
        .dialer()
        .dial(req)
        .within("the dial's timeout")
        .await
        .expect_err("the proxy gives up before the agent answers");
    assert!(matches!(err, TunnelError::Timeout { .. }), "{err}");

    let mut far = far_rx
        .recv()
        .within("the agent's late dial completing")
        .await
        .expect("the service hands over the far end");
    let mut buf = [0u8; 16];
    let n = far
        .read(&mut buf)
        .within("the agent closing the late connection")
        .await
        .expect("reading the far end");
    assert_eq!(n, 0, "the late connection ends without data");
    agent.shutdown().await;
    proxy.shutdown().await;
}
