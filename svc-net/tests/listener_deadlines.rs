//! Every listener holds against silent and slow peers: 1,000 silent TCP peers on the web port,
//! 1,000 on the SSH port, 200 that send an SSH banner and stop in key exchange, and peers that finish TCP+TLS (ALPN `svc-proxy-ssh`) but never speak
//! SSH are all closed by the server at their (shortened) deadline, while an honest SSH session
//! through the proxy completes during the flood; a listener's connection cap sheds the
//! excess at once while an established session keeps working; and silent peers on the tunnel
//! port hold the tunnel server's few handshake places for one deadline at most, so an agent
//! that dials in behind them still registers.
#![allow(clippy::unwrap_used)]

mod tunnel_support;

use std::{net::SocketAddr, sync::Arc, time::Duration};

use anyhow::{Context, Result, bail};
use svc_core::identity::SystemRole;
use svc_net::listen::ListenOptions;
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    time::Instant,
};
use tunnel_support::*;

/// The shortened deadlines of these tests (defaults: 15 s peek, 10 s SSH authentication).
const PEEK: Duration = Duration::from_secs(3);
const AUTH: Duration = Duration::from_secs(3);
/// Generous slack for a loaded 2-core machine: a peer must be closed by deadline + this.
const SLACK: Duration = Duration::from_secs(20);

/// Enough descriptors for both ends of a few thousand loopback connections.
fn raise_fd_limit(want: u64) -> Result<()> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let max = limit.maximum;
    let current = limit.current.unwrap_or(u64::MAX);
    if current >= want {
        return Ok(());
    }
    let target = max.map_or(want, |m| m.min(want));
    setrlimit(
        Resource::Nofile,
        rustix::process::Rlimit {
            current: Some(target),
            maximum: max,
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

/// Reads until the server closes `io`; returns when that happened.
async fn closed_at(mut io: impl AsyncRead + Unpin) -> Instant {
    let mut buf = [0u8; 256];
    loop {
        match io.read(&mut buf).await {
            Ok(0) | Err(_) => return Instant::now(),
            Ok(_) => {}
        }
    }
}

/// Opens `n` silent TCP connections to `addr` (paced so the listen backlog keeps up).
async fn silent_peers(addr: SocketAddr, n: usize) -> Result<Vec<tokio::task::JoinHandle<Instant>>> {
    let mut peers = Vec::with_capacity(n);
    for i in 0..n {
        let tcp = TcpStream::connect(addr)
            .await
            .with_context(|| format!("silent peer {i} connecting to {addr}"))?;
        peers.push(tokio::spawn(closed_at(tcp)));
        if i % 100 == 99 {
            tokio::task::yield_now().await;
        }
    }
    Ok(peers)
}

/// Opens `n` connections that send an SSH banner and then nothing (stuck in key exchange).
async fn banner_peers(addr: SocketAddr, n: usize) -> Result<Vec<tokio::task::JoinHandle<Instant>>> {
    let mut peers = Vec::with_capacity(n);
    for i in 0..n {
        let mut tcp = TcpStream::connect(addr)
            .await
            .with_context(|| format!("banner peer {i} connecting to {addr}"))?;
        tcp.write_all(b"SSH-2.0-flood\r\n").await?;
        peers.push(tokio::spawn(closed_at(tcp)));
    }
    Ok(peers)
}

/// Opens `n` connections that finish TLS with ALPN `svc-proxy-ssh` and then stay silent.
async fn tls_silent_peers(addr: SocketAddr, n: usize) -> Result<Vec<tokio::task::JoinHandle<Instant>>> {
    let mut config = svc_net::tls::insecure_client_config()?;
    config.alpn_protocols = vec![b"svc-proxy-ssh".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let name = rustls::pki_types::ServerName::try_from("localhost")?;
    let mut peers = Vec::with_capacity(n);
    for i in 0..n {
        let tcp = TcpStream::connect(addr).await?;
        let tls = tokio::time::timeout(Duration::from_secs(20), connector.connect(name.clone(), tcp))
            .await
            .with_context(|| format!("TLS peer {i}: no handshake within 20 s"))?
            .with_context(|| format!("TLS peer {i}: handshake"))?;
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"svc-proxy-ssh"[..]));
        peers.push(tokio::spawn(closed_at(tls)));
    }
    Ok(peers)
}

/// Asserts every peer was closed by the server, by `deadline + SLACK` at the latest.
async fn assert_cut(
    what: &str,
    peers: Vec<tokio::task::JoinHandle<Instant>>,
    deadline: Instant,
) -> Result<()> {
    let n = peers.len();
    let all = futures_util::future::join_all(peers);
    let ends = tokio::time::timeout_at(deadline + SLACK, all)
        .await
        .with_context(|| format!("{what}: not all {n} peers were closed by the deadline + {SLACK:?}"))?;
    for end in ends {
        let end = end?;
        assert!(
            end <= deadline + SLACK,
            "{what}: a peer was closed {:?} after its deadline",
            end - deadline
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_peers_are_cut_at_the_deadline_while_an_honest_session_works() -> Result<()> {
    raise_fd_limit(8192)?;
    init_tracing();
    let cluster = Cluster::new();
    let proxy = start_proxy(
        &cluster,
        ProxyOpts {
            separate: true,
            tunables: fast_tunables().with_auth_timeout(AUTH),
            listen: ListenOptions::default()
                .with_peek_timeout(PEEK)
                .with_max_peeking(4096)
                .with_drain_timeout(Duration::from_secs(2)),
            ..Default::default()
        },
    )
    .await;
    let ssh_addr = proxy.ssh.context("separate mode binds the SSH port")?;
    let node = cluster.host(&[SystemRole::Node], "node-1");
    let _agent = start_agent(&cluster, proxy.web, &node);
    tokio::time::timeout(
        Duration::from_secs(30),
        proxy
            .tunnel
            .registry()
            .wait_for("node-1", |a| a.is_some_and(|a| a.online)),
    )
    .await
    .context("the agent did not come online within 30 s")?;

    // The flood: silent on the web port (cut at the peek deadline) and on the SSH port (cut at
    // the SSH authentication deadline), and TLS-then-silent on the web port (SSH inside TLS).
    let web = silent_peers(proxy.web, 1000).await?;
    let ssh = silent_peers(ssh_addr, 1000).await?;
    let banners = banner_peers(ssh_addr, 200).await?;
    let tls_start = Instant::now();
    let tls = tls_silent_peers(proxy.web, 50).await?;

    // An honest client gets through while every slot above is held.
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        ssh_exec(&proxy, &cluster, "node-1", "echo honest"),
    )
    .await
    .context("an honest SSH session did not complete within 60 s during the flood")?;
    assert_eq!(out.stdout(), "honest\n");
    assert_eq!(out.status, Some(0));

    // The web peers' deadline runs from their accept; connecting 2,000 peers takes a while,
    // so each batch is measured from when its connecting finished at the latest.
    let connected = Instant::now();
    assert_cut("silent web-port peers", web, connected + PEEK).await?;
    assert_cut("silent SSH-port peers", ssh, connected + AUTH).await?;
    assert_cut(
        "SSH-port peers stuck after their banner",
        banners,
        connected + AUTH,
    )
    .await?;
    // TLS peers: the handshake took part of the peek budget; the SSH deadline runs after it.
    assert_cut("TLS-then-silent peers", tls, Instant::now().max(tls_start) + AUTH).await?;

    // Still serving after the flood.
    let out = ssh_exec(&proxy, &cluster, "node-1", "echo after").await;
    assert_eq!(out.stdout(), "after\n");
    proxy.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cap_sheds_excess_connections_while_an_established_session_keeps_working() -> Result<()> {
    init_tracing();
    const CAP: usize = 8;
    let cluster = Cluster::new();
    let proxy = start_proxy(
        &cluster,
        ProxyOpts {
            separate: true,
            // Long deadlines: whatever closes a connection below is the cap, not a deadline.
            tunables: fast_tunables().with_auth_timeout(Duration::from_secs(300)),
            listen: ListenOptions::default()
                .with_peek_timeout(Duration::from_secs(300))
                .with_max_connections(CAP)
                .with_drain_timeout(Duration::from_secs(2)),
            ..Default::default()
        },
    )
    .await;
    let ssh_addr = proxy.ssh.context("separate mode binds the SSH port")?;
    let node = cluster.host(&[SystemRole::Node], "node-1");
    let _agent = start_agent(&cluster, proxy.web, &node);
    tokio::time::timeout(
        Duration::from_secs(30),
        proxy
            .tunnel
            .registry()
            .wait_for("node-1", |a| a.is_some_and(|a| a.online)),
    )
    .await
    .context("the agent did not come online within 30 s")?;

    // One established session holds one place on the SSH listener.
    let user = cluster.user("alice", &["root"]);
    let session = node_session(&proxy, &cluster, &user, "node-1").await;
    assert_eq!(exec(&session, "echo before").await.stdout(), "before\n");

    // Silent peers take the other places; each is answered (the SSH banner) so it is accepted.
    let mut held = Vec::new();
    for i in 0..CAP - 1 {
        let mut tcp = TcpStream::connect(ssh_addr).await?;
        let mut banner = [0u8; 4];
        tokio::time::timeout(Duration::from_secs(20), tcp.read_exact(&mut banner))
            .await
            .with_context(|| format!("peer {i} within the cap got no SSH banner in 20 s"))??;
        assert_eq!(&banner, b"SSH-");
        held.push(tcp);
    }

    // Beyond the cap: closed at once, without a byte (the deadlines are 300 s away).
    for i in 0..5 {
        let mut over = TcpStream::connect(ssh_addr).await?;
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(20), over.read(&mut buf))
            .await
            .with_context(|| format!("connection {i} over the cap was not closed within 20 s"))?
            .unwrap_or(0);
        assert_eq!(n, 0, "a connection over the cap is closed without an answer");
    }

    // The established session is untouched.
    assert_eq!(exec(&session, "echo during").await.stdout(), "during\n");

    // Places freed are places usable again: once the server has seen the silent peers go, a
    // new connection gets its banner, and a new session works.
    drop(held);
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let mut probe = TcpStream::connect(ssh_addr).await?;
            let mut banner = [0u8; 4];
            let read = tokio::time::timeout(Duration::from_secs(2), probe.read_exact(&mut banner)).await;
            if matches!(read, Ok(Ok(_))) && &banner == b"SSH-" {
                return anyhow::Ok(());
            }
        }
    })
    .await
    .context("no place freed within 30 s after the silent peers left")??;
    let out = ssh_exec(&proxy, &cluster, "node-1", "echo again").await;
    assert_eq!(out.stdout(), "again\n");
    let _ = session.disconnect(russh::Disconnect::ByApplication, "", "").await;
    proxy.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_timeout_closes_a_silent_authenticated_session() -> Result<()> {
    init_tracing();
    let idle = Duration::from_secs(2);
    let cluster = Cluster::new();
    let proxy = start_proxy(
        &cluster,
        ProxyOpts {
            separate: true,
            // The agent's heartbeats (300 ms) keep its tunnel busy; the client's session is idle.
            tunables: fast_tunables().with_idle_timeout(Some(idle)),
            ..Default::default()
        },
    )
    .await;
    let node = cluster.host(&[SystemRole::Node], "node-1");
    let _agent = start_agent(&cluster, proxy.web, &node);
    tokio::time::timeout(
        Duration::from_secs(30),
        proxy
            .tunnel
            .registry()
            .wait_for("node-1", |a| a.is_some_and(|a| a.online)),
    )
    .await
    .context("the agent did not come online within 30 s")?;
    let user = cluster.user("alice", &["root"]);
    let session = node_session(&proxy, &cluster, &user, "node-1").await;
    assert_eq!(exec(&session, "echo busy").await.stdout(), "busy\n");
    let idle_from = Instant::now();
    tokio::time::timeout(Duration::from_secs(30), async {
        while !session.is_closed() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .context("an idle session was not closed within 30 s (idle timeout 2 s)")?;
    assert!(
        idle_from.elapsed() >= idle,
        "closed after {:?}, before the idle timeout",
        idle_from.elapsed()
    );
    // The agent's busy tunnel is untouched, and a new session works.
    let out = ssh_exec(&proxy, &cluster, "node-1", "echo fresh").await;
    assert_eq!(out.stdout(), "fresh\n");
    proxy.shutdown().await;
    Ok(())
}

/// A proxy in separate mode whose tunnel server takes `places` handshakes at once, with the
/// given SSH authentication and handshake deadlines.
async fn proxy_with_few_places(
    cluster: &Cluster,
    places: usize,
    auth: Duration,
    handshake: Duration,
) -> TestProxy {
    let mut tunables = fast_tunables().with_auth_timeout(auth);
    tunables.handshake_timeout = handshake;
    start_proxy(
        cluster,
        ProxyOpts {
            separate: true,
            tunables,
            max_handshakes: Some(places),
            listen: ListenOptions::default()
                .with_peek_timeout(PEEK)
                .with_drain_timeout(Duration::from_secs(2)),
            ..Default::default()
        },
    )
    .await
}

/// Opens `n` TCP connections to `addr` that send nothing; each peer's task ends when the server
/// closes it and tells whether the server had sent it anything (its SSH banner: the peer held
/// one of the handshake places) and when it was closed.
async fn silent_tunnel_peers(
    addr: SocketAddr,
    n: usize,
) -> Result<Vec<tokio::task::JoinHandle<(bool, Instant)>>> {
    let mut peers = Vec::with_capacity(n);
    for i in 0..n {
        let mut tcp = TcpStream::connect(addr)
            .await
            .with_context(|| format!("silent tunnel peer {i} connecting to {addr}"))?;
        peers.push(tokio::spawn(async move {
            let mut buf = [0u8; 256];
            let mut served = false;
            loop {
                match tcp.read(&mut buf).await {
                    Ok(0) | Err(_) => return (served, Instant::now()),
                    Ok(_) => served = true,
                }
            }
        }));
    }
    Ok(peers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_peers_on_the_tunnel_port_do_not_keep_an_agent_out() -> Result<()> {
    raise_fd_limit(4096)?;
    init_tracing();
    // Few places, so that the flood below is fifty times what the server takes at once; the
    // handshake deadline covers the wait for a place too.
    const PLACES: usize = 4;
    const FLOOD: usize = 200;
    const HANDSHAKE: Duration = Duration::from_secs(6);
    let cluster = Cluster::new();
    let proxy = proxy_with_few_places(&cluster, PLACES, AUTH, HANDSHAKE).await;
    let tunnel_addr = proxy.tunnel_addr.context("separate mode binds the tunnel port")?;

    // The attack: connections that open TCP to the tunnel port and never send a byte.
    let flood = silent_tunnel_peers(tunnel_addr, FLOOD).await?;
    let flooded = Instant::now();

    // A real agent dials in behind them (through the ping, which names the tunnel port): it
    // waits its turn or is refused at the deadline and backs off, and gets a place once the
    // silent peers are cut.
    let node = cluster.host(&[SystemRole::Node], "node-behind-the-flood");
    let _agent = start_agent(&cluster, proxy.web, &node);
    tokio::time::timeout(
        Duration::from_secs(120),
        proxy
            .tunnel
            .registry()
            .wait_for("node-behind-the-flood", |a| a.is_some_and(|a| a.online)),
    )
    .await
    .context("the agent did not register within 120 s of a flood of silent peers on the tunnel port")?;

    // Every silent peer was closed by the server: a place-holder at its SSH authentication
    // deadline, a peer that got no place at half the handshake deadline.
    let n = flood.len();
    let ends = tokio::time::timeout_at(flooded + HANDSHAKE + SLACK, futures_util::future::join_all(flood))
        .await
        .with_context(|| {
            format!("not all {n} silent tunnel peers were closed by the handshake deadline + {SLACK:?}")
        })?;
    let mut served = 0;
    for end in ends {
        let (was_served, closed) = end?;
        served += usize::from(was_served);
        assert!(
            closed <= flooded + HANDSHAKE + SLACK,
            "a silent tunnel peer was closed {:?} after the handshake deadline",
            closed - (flooded + HANDSHAKE)
        );
    }
    // Only peers that held a place were sent the SSH banner: every place is held for the
    // whole authentication deadline and a peer waits for one half the handshake deadline at
    // most, so each place serves a few peers of the flood, far fewer than the flood.
    assert!(
        served <= FLOOD / 4,
        "{served} of {FLOOD} silent tunnel peers were served a handshake with {PLACES} places: the handshakes are not bounded"
    );
    tracing::info!(served, "silent tunnel peers that held a handshake place");
    proxy.shutdown().await;
    Ok(())
}

/// An insider's version of the flood: one address keeps `n` connections open on the tunnel
/// port at all times that send an SSH banner and then nothing (each is past the listener's peek
/// and in the tunnel's handshake), opening a new one whenever the server closes one. Ends with
/// the returned token.
fn renewed_silent_flood(
    addr: SocketAddr,
    from: &str,
    n: usize,
) -> Result<tokio_util::sync::CancellationToken> {
    let stop = tokio_util::sync::CancellationToken::new();
    let from: std::net::IpAddr = from.parse().context("the flood's source address")?;
    for i in 0..n {
        let stop = stop.clone();
        tokio::spawn(async move {
            // Staggered, so the server never sees the whole flood time out at one moment.
            tokio::time::sleep(Duration::from_millis(15) * u32::try_from(i).unwrap_or(0)).await;
            while !stop.is_cancelled() {
                let socket = match tokio::net::TcpSocket::new_v4() {
                    Ok(s) => s,
                    Err(_) => return,
                };
                if socket.bind(SocketAddr::new(from, 0)).is_err() {
                    return;
                }
                let Ok(mut tcp) = socket.connect(addr).await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                if tcp.write_all(b"SSH-2.0-flood\r\n").await.is_err() {
                    continue;
                }
                let mut buf = [0u8; 256];
                loop {
                    tokio::select! {
                        () = stop.cancelled() => return,
                        r = tcp.read(&mut buf) => if matches!(r, Ok(0) | Err(_)) { break },
                    }
                }
            }
        });
    }
    Ok(stop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_renewed_from_one_address_does_not_keep_an_agent_out() -> Result<()> {
    raise_fd_limit(4096)?;
    init_tracing();
    // Four places: one address may hold two of them however many connections it keeps open,
    // so the agent (from 127.0.0.1) always finds one while 127.0.0.2 renews its flood. (With
    // no share per address, the flood's peers queued ahead of the agent take every place that
    // comes free: they are held for the authentication deadline, longer than anyone waits.)
    const PLACES: usize = 4;
    let cluster = Cluster::new();
    let proxy = proxy_with_few_places(&cluster, PLACES, Duration::from_secs(5), Duration::from_secs(6)).await;
    let tunnel_addr = proxy.tunnel_addr.context("separate mode binds the tunnel port")?;
    let flood = renewed_silent_flood(tunnel_addr, "127.0.0.2", 200)?;
    // Let the flood take what it can and fill the queue before the agent dials.
    tokio::time::sleep(Duration::from_secs(4)).await;

    let node = cluster.host(&[SystemRole::Node], "node-beside-the-flood");
    let _agent = start_agent(&cluster, proxy.web, &node);
    let registered = tokio::time::timeout(
        Duration::from_secs(45),
        proxy
            .tunnel
            .registry()
            .wait_for("node-beside-the-flood", |a| a.is_some_and(|a| a.online)),
    )
    .await;
    flood.cancel();
    registered.context(
        "the agent did not register within 45 s while one other address kept 200 stalled connections open on the tunnel port",
    )?;
    proxy.shutdown().await;
    Ok(())
}
