//! Proxy peering with in-process proxies: three proxies in `proxy_peering` mode with
//! `agent_connection_count: 1`, each serving the peering API on its own address. Two agents the
//! rendezvous hash assigns to the same proxy — one told another proxy's address, one told its
//! holder's — each end up with one tunnel, to that proxy; a client on any proxy reaches them
//! (the others dial through that peer); a session through a peer finishes while the holding
//! proxy drains; after the holding proxy stops both agents move to their next-ranked proxy
//! (the one told only the stopped proxy's address through the proxies it heard of) and new
//! sessions through every remaining proxy work.
//! A peer presenting a node's host certificate, or a user certificate, is refused on the peer
//! port, and the failure of a dial no peer can serve names the agent and the peers tried.
//! Renewed keys are presented from the next handshake on, both ways, while connections already
//! up keep working. The attacker's view of the peer port: stalled handshakes are cut by the
//! handshake deadline without holding up a real peer, a proxy identity of another cluster is
//! refused (and a peer of another cluster is not trusted), a dial for an agent the peer does not
//! hold names the agent and the peer, and an oversized or malformed first frame ends the call.
#![allow(clippy::unwrap_used)]

mod tunnel_support;

use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime};

use rcgen::PublicKeyData;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use svc_core::auth::ServedKind;
use svc_core::identity::{HostCertRequest, SystemRole, UserCertRequest};
use svc_net::tunnel::peer::proto::{self, Frame, frame::Message, proxy_peer_client::ProxyPeerClient};
use svc_net::tunnel::{
    DialRequest, DiscoveredProxy, Discovery, Peer, PeerDialer, PeerIdentity, PeerKeys, TunnelStrategy,
    agent_proxies,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use tunnel_support::*;

const PEERING: TunnelStrategy = TunnelStrategy::ProxyPeering {
    agent_connection_count: 1,
};

fn key_der(key: &rcgen::KeyPair) -> PrivateKeyDer<'static> {
    PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()))
}

/// An X.509 host identity from the cluster's host CA for `host_id` with `roles`.
fn host_x509(cluster: &Cluster, host_id: &str, roles: &[SystemRole]) -> PeerIdentity {
    host_x509_for(cluster, host_id, roles, Duration::from_secs(3600))
}

/// Like [`host_x509`], valid for `ttl`.
fn host_x509_for(cluster: &Cluster, host_id: &str, roles: &[SystemRole], ttl: Duration) -> PeerIdentity {
    let uuid = host_id.split_once('.').unwrap().0.parse::<uuid::Uuid>().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let req = HostCertRequest {
        host_uuid: uuid,
        node_name: "peer".into(),
        roles: roles.to_vec(),
        additional_names: vec![],
        ttl,
    };
    let der = cluster
        .host_ca
        .sign_host_x509(&req, &key.subject_public_key_info(), SystemTime::now())
        .unwrap();
    PeerIdentity {
        host_id: host_id.to_owned(),
        verifier: cluster.verifier.clone(),
        chain: vec![der],
        key: key_der(&key),
    }
}

/// A user's X.509 certificate from the user CA, presented as if it were a proxy's.
fn user_x509(cluster: &Cluster) -> PeerIdentity {
    let key = rcgen::KeyPair::generate().unwrap();
    let req = UserCertRequest {
        username: "mallory".into(),
        roles: vec!["access".into()],
        logins: vec!["root".into()],
        ttl: Duration::from_secs(3600),
        db_route: None,
        ssh_permits: Default::default(),
    };
    let der: CertificateDer<'static> = cluster
        .user_ca
        .sign_user_x509(&req, &key.subject_public_key_info(), SystemTime::now())
        .unwrap();
    PeerIdentity {
        host_id: format!("{}.{CLUSTER}", uuid::Uuid::new_v4()),
        verifier: cluster.verifier.clone(),
        chain: vec![der],
        key: key_der(&key),
    }
}

/// A test proxy that also serves peering.
struct PeeringProxy {
    proxy: TestProxy,
    keys: PeerKeys,
    peer_addr: SocketAddr,
    stop_peering: CancellationToken,
    serving: tokio::task::JoinHandle<()>,
}

impl PeeringProxy {
    fn id(&self) -> &str {
        &self.proxy.creds.host_id
    }

    async fn shutdown(self) {
        self.stop_peering.cancel();
        self.proxy.shutdown().await;
        self.serving.within("the peering server's stop").await.unwrap();
    }
}

async fn start_peering_proxy(cluster: &Cluster) -> PeeringProxy {
    let proxy = start_proxy(cluster, ProxyOpts::default()).await;
    let identity = host_x509(cluster, &proxy.creds.host_id, &[SystemRole::Proxy]);
    // One set of keys for both sides, as the proxy's renewal replaces them.
    let keys = PeerKeys::new(&identity).unwrap();
    proxy.tunnel.set_strategy(PEERING);
    proxy
        .tunnel
        .set_peer_dialer(PeerDialer::with_keys(keys.clone()).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let peer_addr = listener.local_addr().unwrap();
    let stop_peering = CancellationToken::new();
    let (tunnel, stop, served_keys) = (proxy.tunnel.clone(), stop_peering.clone(), keys.clone());
    let serving = tokio::spawn(async move {
        svc_net::tunnel::serve_peers_with_keys(
            listener,
            tunnel,
            served_keys,
            svc_net::listen::ListenOptions::default().with_drain_timeout(Duration::from_secs(10)),
            stop,
        )
        .await
        .unwrap();
    });
    PeeringProxy {
        proxy,
        keys,
        peer_addr,
        stop_peering,
        serving,
    }
}

fn listed(proxies: &[PeeringProxy]) -> Vec<DiscoveredProxy> {
    proxies
        .iter()
        .map(|p| DiscoveredProxy {
            proxy_id: p.id().to_owned(),
            tunnel_addr: p.proxy.web.to_string(),
            tls_routing: true,
        })
        .collect()
}

/// What the registry does every few seconds: every proxy hears the live proxies (and tells its
/// agents their share), and learns each peer's address and the agents its record holds.
fn announce(proxies: &[PeeringProxy]) {
    let discovery = Discovery {
        proxies: listed(proxies),
        complete: true,
        hold: None,
    };
    let peers: Vec<Peer> = proxies
        .iter()
        .map(|p| {
            let agents = p
                .proxy
                .tunnel
                .registry()
                .list()
                .into_iter()
                .map(|a| a.host_id)
                .collect();
            Peer::new(p.id(), p.peer_addr.to_string(), agents)
        })
        .collect();
    for p in proxies {
        p.proxy.tunnel.set_proxies(discovery.clone());
        p.proxy.tunnel.peer_dialer().unwrap().set_peers(peers.clone());
    }
}

fn dial_request(server: &str) -> DialRequest {
    DialRequest {
        address: "127.0.0.1:3022".into(),
        server_id: server.into(),
        conn_type: ServedKind::Node,
        client_src_addr: "127.0.0.1:5000".into(),
        client_dst_addr: "127.0.0.1:3080".into(),
        db_route: None,
    }
}

/// Median of how long opening an SSH session through `proxy` takes, over `n` sessions.
async fn setup_time(proxy: &TestProxy, cluster: &Cluster, node: &str, n: usize) -> Duration {
    let user = cluster.user("alice", &["root"]);
    let mut times = Vec::new();
    for _ in 0..n {
        let started = Instant::now();
        let session = node_session(proxy, cluster, &user, node).await;
        times.push(started.elapsed());
        let _ = session.disconnect(russh::Disconnect::ByApplication, "", "").await;
    }
    times.sort();
    times[n / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_tunnelled_to_one_proxy_is_reached_through_every_proxy_and_moves_when_it_stops() {
    init_tracing();
    let cluster = Cluster::new();
    let mut proxies = Vec::new();
    for _ in 0..3 {
        proxies.push(start_peering_proxy(&cluster).await);
    }
    announce(&proxies);

    // Two agents the proxies assign to proxy 1: node-peer is told proxy 0's address (it reaches
    // proxy 0 first, then moves to proxy 1), node-home proxy 1's own (when proxy 1 stops, the
    // only address it was given is gone: it turns to the proxies it heard of).
    let assigned_to_1 = |name: &str| loop {
        let creds = cluster.host(&[SystemRole::Node], name);
        if agent_proxies(&creds.host_id, &listed(&proxies), 1)[0].proxy_id == proxies[1].id() {
            break creds;
        }
    };
    let node = assigned_to_1("node-peer");
    let home = assigned_to_1("node-home");
    let chosen = proxies[1].id().to_owned();
    let holder = 1;
    let agent = start_agent(&cluster, proxies[0].proxy.web, &node);
    let agent_home = start_agent(&cluster, proxies[1].proxy.web, &home);
    for a in [&agent, &agent_home] {
        a.wait_for(|s| s.connected.len() == 1 && s.connected.contains(&chosen))
            .within("the agent holding exactly one tunnel, to the proxy chosen for it")
            .await;
    }
    for name in ["node-peer", "node-home"] {
        for (i, p) in proxies.iter().enumerate() {
            if i == holder {
                p.proxy
                    .tunnel
                    .registry()
                    .wait_for(name, |a| a.is_some_and(|a| a.online))
                    .within(&format!("{name} registered on the chosen proxy"))
                    .await;
            } else {
                // Any tunnel the agent first reached through its configured address drains.
                p.proxy
                    .tunnel
                    .registry()
                    .wait_for(name, |a| a.is_none())
                    .within(&format!("no tunnel of {name} left on a proxy not chosen for it"))
                    .await;
            }
        }
    }
    announce(&proxies);

    // A client on any proxy reaches the agents: the holder directly, the others through it.
    for name in ["node-peer", "node-home"] {
        for (i, p) in proxies.iter().enumerate() {
            assert_eq!(
                ssh_exec(&p.proxy, &cluster, name, &format!("echo via {i}"))
                    .await
                    .stdout(),
                format!("via {i}\n"),
                "{name} through proxy {i} (holder: {holder})"
            );
        }
    }
    let other = (holder + 1) % proxies.len();
    let direct = setup_time(&proxies[holder].proxy, &cluster, "node-peer", 5).await;
    let peered = setup_time(&proxies[other].proxy, &cluster, "node-peer", 5).await;
    println!(
        "FIGURE: SSH session setup (median of 5), client on the holding proxy {direct:?}, client on a peer proxy {peered:?} (ratio {:.2})",
        peered.as_secs_f64() / direct.as_secs_f64()
    );

    // A session through a peer runs while the holding proxy drains: it finishes.
    let user = cluster.user("alice", &["root"]);
    let session = node_session(&proxies[other].proxy, &cluster, &user, "node-peer").await;
    let running = tokio::spawn(async move {
        let out = exec(&session, "sleep 1; echo finished").await;
        (session, out)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stopped = proxies.remove(holder);
    let stopped_id = stopped.id().to_owned();
    let stop_started = Instant::now();
    let stopping = tokio::spawn(stopped.shutdown());
    let (_session, out) = running
        .within("the session through a peer while the holding proxy drains")
        .await
        .unwrap();
    assert_eq!(
        out.stdout(),
        "finished\n",
        "the peered session finished during the drain"
    );
    stopping.within("the holding proxy's drain").await.unwrap();

    // It left the registry: each agent moves to the proxy now ranked first for it.
    announce(&proxies);
    for (a, creds) in [(&agent, &node), (&agent_home, &home)] {
        let next = agent_proxies(&creds.host_id, &listed(&proxies), 1)[0]
            .proxy_id
            .clone();
        a.wait_for(|s| {
            s.connected.len() == 1 && s.connected.contains(&next) && !s.connected.contains(&stopped_id)
        })
        .within(&format!(
            "{} moving to the next proxy chosen for it",
            creds.node_name
        ))
        .await;
        println!(
            "FIGURE: {} holding its next proxy {:?} after its proxy began to stop",
            creds.node_name,
            stop_started.elapsed()
        );
        proxies
            .iter()
            .find(|p| p.id() == next)
            .unwrap()
            .proxy
            .tunnel
            .registry()
            .wait_for(&creds.node_name, |a| a.is_some_and(|a| a.online))
            .within(&format!("{} registered on its new proxy", creds.node_name))
            .await;
    }
    announce(&proxies);
    for name in ["node-peer", "node-home"] {
        for (i, p) in proxies.iter().enumerate() {
            assert_eq!(
                ssh_exec(&p.proxy, &cluster, name, &format!("echo after {i}"))
                    .await
                    .stdout(),
                format!("after {i}\n"),
                "{name} through proxy {i} after the move"
            );
        }
    }

    // An agent no proxy holds: the error names it and every peer tried.
    let err = match proxies[0]
        .proxy
        .tunnel
        .dialer()
        .with_attach_wait(Duration::ZERO)
        .dial(dial_request("nowhere"))
        .await
    {
        Ok(_) => panic!("a dial to an agent nobody holds succeeded"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("nowhere") && err.contains(proxies[1].id()), "{err}");

    agent.shutdown().await;
    agent_home.shutdown().await;
    for p in proxies {
        p.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peer_port_refuses_anything_but_a_proxy_identity() {
    init_tracing();
    let cluster = Cluster::new();
    let holder = start_peering_proxy(&cluster).await;
    let node = cluster.host(&[SystemRole::Node], "node-guarded");
    let agent = start_agent(&cluster, holder.proxy.web, &node);
    holder
        .proxy
        .tunnel
        .registry()
        .wait_for("node-guarded", |a| a.is_some_and(|a| a.online))
        .within("node-guarded registered")
        .await;
    let peer = Peer::new(
        holder.id(),
        holder.peer_addr.to_string(),
        vec![node.host_id.clone()],
    );
    let caller_id = format!("{}.{CLUSTER}", uuid::Uuid::new_v4());

    // A proxy identity is served (the control case).
    let proxy_caller = PeerDialer::new(&host_x509(&cluster, &caller_id, &[SystemRole::Proxy])).unwrap();
    proxy_caller.set_peers(vec![peer.clone()]);
    proxy_caller
        .dial(&dial_request(&node.host_id))
        .within("a dial through the peer as a proxy")
        .await
        .unwrap();

    // A node's host certificate, and a user certificate, are not.
    for (what, identity) in [
        (
            "a node's host certificate",
            host_x509(&cluster, &caller_id, &[SystemRole::Node]),
        ),
        ("a user certificate", user_x509(&cluster)),
        (
            "a proxy certificate of another cluster",
            PeerIdentity {
                // Trusts this cluster (so it reaches the peer's check), signed by another.
                verifier: cluster.verifier.clone(),
                ..host_x509(&Cluster::new(), &caller_id, &[SystemRole::Proxy])
            },
        ),
    ] {
        let caller = PeerDialer::new(&identity).unwrap();
        caller.set_peers(vec![peer.clone()]);
        let err = match caller.dial(&dial_request(&node.host_id)).within(what).await {
            Ok(_) => panic!("the peer port served a caller presenting {what}"),
            Err(e) => e.to_string(),
        };
        println!("{what}: {err}");
        assert!(
            err.contains(&node.host_id) && err.contains(holder.id()),
            "{what}: the error names the agent and the peer tried: {err}"
        );
    }

    agent.shutdown().await;
    holder.shutdown().await;
}

/// A gRPC channel to the peer port at `addr` presenting `keys`: the raw API, as a buggy or
/// hostile peer speaks it.
async fn raw_channel(keys: &PeerKeys, addr: SocketAddr) -> tonic::transport::Channel {
    let config = keys.client_config().unwrap();
    let connector = tower::service_fn(move |_uri: http::Uri| {
        let config = config.clone();
        async move {
            let tcp = tokio::net::TcpStream::connect(addr).await?;
            let name = rustls::pki_types::ServerName::try_from("peer.svc").unwrap();
            let tls = tokio_rustls::TlsConnector::from(config)
                .connect(name, tcp)
                .await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
        }
    });
    tonic::transport::Endpoint::from_static("http://peer.svc")
        .connect_with_connector(connector)
        .within("a raw peering connection")
        .await
        .unwrap()
}

/// Opens a call whose first frame is `first`; the peer's first answer (a frame or the status
/// that ended the call).
async fn first_answer(channel: tonic::transport::Channel, first: Frame) -> Result<Frame, tonic::Status> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Frame>(1);
    tx.send(first).await.unwrap();
    let outbound = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|f| (f, rx)) });
    let mut inbound = ProxyPeerClient::new(channel)
        .dial_node(outbound)
        .await?
        .into_inner();
    let answer = inbound.message().await?;
    drop(tx);
    answer.ok_or_else(|| tonic::Status::unknown("the call ended without an answer"))
}

fn dial_frame(json: String) -> Frame {
    Frame {
        message: Some(Message::DialRequest(proto::DialRequest { json })),
    }
}

/// The leaf certificate the peer port at `addr` presents in a fresh handshake.
async fn presented(addr: SocketAddr, keys: &PeerKeys) -> CertificateDer<'static> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("peer.svc").unwrap();
    let tls = tokio_rustls::TlsConnector::from(keys.client_config().unwrap())
        .connect(name, tcp)
        .within("a handshake with the peer port")
        .await
        .unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0]
        .clone()
        .into_owned()
}

/// A TLS server presenting `keys` that records the client certificate of every handshake.
async fn recording_server(
    keys: &PeerKeys,
) -> (
    SocketAddr,
    tokio::sync::mpsc::UnboundedReceiver<CertificateDer<'static>>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(keys.server_config().unwrap());
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            if let Ok(tls) = acceptor.accept(tcp).await
                && let Some(certs) = tls.get_ref().1.peer_certificates()
            {
                let _ = tx.send(certs[0].clone().into_owned());
            }
        }
    });
    (addr, rx)
}

fn not_after(cluster: &Cluster, leaf: &CertificateDer<'_>) -> SystemTime {
    cluster
        .verifier
        .verify_host_x509(
            std::slice::from_ref(leaf),
            SystemTime::now(),
            Some(SystemRole::Proxy),
        )
        .unwrap()
        .validity
        .not_after
}

/// Credentials for a node that the rendezvous hash assigns to `holder` among `proxies`.
fn assigned_to(cluster: &Cluster, proxies: &[PeeringProxy], holder: &PeeringProxy, name: &str) -> HostCreds {
    loop {
        let creds = cluster.host(&[SystemRole::Node], name);
        if agent_proxies(&creds.host_id, &listed(proxies), 1)[0].proxy_id == holder.id() {
            break creds;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewed_peering_keys_are_presented_from_the_next_handshake_and_open_sessions_keep_working() {
    init_tracing();
    let cluster = Cluster::new();
    let proxies = vec![
        start_peering_proxy(&cluster).await,
        start_peering_proxy(&cluster).await,
    ];
    announce(&proxies);
    let (holder, caller) = (&proxies[0], &proxies[1]);
    let node = assigned_to(&cluster, &proxies, holder, "node-renewed");
    let agent = start_agent(&cluster, holder.proxy.web, &node);
    holder
        .proxy
        .tunnel
        .registry()
        .wait_for("node-renewed", |a| a.is_some_and(|a| a.online))
        .within("node-renewed registered on its proxy")
        .await;
    announce(&proxies);

    // A session through the peer, opened with the first certificates.
    let user = cluster.user("alice", &["root"]);
    let session = node_session(&caller.proxy, &cluster, &user, "node-renewed").await;
    assert_eq!(exec(&session, "echo before").await.stdout(), "before\n");
    let old_server = presented(holder.peer_addr, &caller.keys).await;
    assert_eq!(Some(&old_server), holder.keys.certificate().as_ref());
    let (recorder, mut recorded) = recording_server(&holder.keys).await;
    let probe = PeerDialer::with_keys(caller.keys.clone()).unwrap();
    probe.set_peers(vec![Peer::new("recorder", recorder.to_string(), vec![])]);
    assert!(probe.dial(&dial_request(&node.host_id)).await.is_err());
    let old_client = recorded
        .recv()
        .within("the caller's first certificate")
        .await
        .unwrap();
    assert_eq!(Some(&old_client), caller.keys.certificate().as_ref());

    // Both proxies renew (longer lifetimes: new certificates, a later not_after).
    let renewed = |p: &PeeringProxy| {
        let fresh = host_x509_for(&cluster, p.id(), &[SystemRole::Proxy], Duration::from_secs(7200));
        p.keys.renew(fresh.chain.clone(), fresh.key.clone_key()).unwrap();
        fresh.chain[0].clone()
    };
    let (new_server_cert, new_client_cert) = (renewed(holder), renewed(caller));

    // Renewed keys that are not this proxy's are refused; the renewed ones stay.
    let node_cert = host_x509(&cluster, holder.id(), &[SystemRole::Node]);
    let err = holder
        .keys
        .renew(node_cert.chain.clone(), node_cert.key.clone_key())
        .unwrap_err()
        .to_string();
    assert!(err.contains(holder.id()), "{err}");
    let someone_else = host_x509(&cluster, caller.id(), &[SystemRole::Proxy]);
    let err = holder
        .keys
        .renew(someone_else.chain.clone(), someone_else.key.clone_key())
        .unwrap_err()
        .to_string();
    assert!(err.contains(caller.id()), "{err}");
    let mismatched = host_x509(&cluster, holder.id(), &[SystemRole::Proxy]);
    let err = holder
        .keys
        .renew(mismatched.chain.clone(), node_cert.key.clone_key())
        .unwrap_err()
        .to_string();
    assert!(err.contains("key"), "{err}");

    // The next handshakes present the new certificates, both ways.
    let new_server = presented(holder.peer_addr, &caller.keys).await;
    assert_eq!(new_server, new_server_cert);
    assert_ne!(new_server, old_server);
    assert!(not_after(&cluster, &new_server) > not_after(&cluster, &old_server));
    assert!(probe.dial(&dial_request(&node.host_id)).await.is_err());
    // (A connection attempt may make more than one handshake: the first dial's may still be
    // queued, with the first certificate.)
    let new_client = async {
        loop {
            let cert = recorded.recv().await.unwrap();
            if cert != old_client {
                break cert;
            }
        }
    }
    .within("the caller's renewed certificate")
    .await;
    assert_eq!(new_client, new_client_cert);
    assert!(not_after(&cluster, &new_client) > not_after(&cluster, &old_client));
    println!(
        "the holder presents a certificate valid until {:?} (was {:?})",
        not_after(&cluster, &new_server),
        not_after(&cluster, &old_server)
    );

    // The session opened before the renewal keeps working, as does the peer connection it
    // crossed (a new session over it).
    assert_eq!(exec(&session, "echo after").await.stdout(), "after\n");
    assert_eq!(
        ssh_exec(&caller.proxy, &cluster, "node-renewed", "echo reused")
            .await
            .stdout(),
        "reused\n"
    );
    // A new peer connection (the caller forgets its connections) is made with the renewed
    // certificates on both sides, and accepted.
    let dialer = caller.proxy.tunnel.peer_dialer().unwrap();
    let peers = dialer.peers();
    dialer.set_peers(Vec::new());
    dialer.set_peers(peers);
    assert_eq!(
        ssh_exec(&caller.proxy, &cluster, "node-renewed", "echo renewed")
            .await
            .stdout(),
        "renewed\n"
    );
    let _ = session.disconnect(russh::Disconnect::ByApplication, "", "").await;

    agent.shutdown().await;
    for p in proxies {
        p.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peer_port_holds_against_hostile_peers() {
    init_tracing();
    let cluster = Cluster::new();
    let holder = start_peering_proxy(&cluster).await;
    let node = cluster.host(&[SystemRole::Node], "node-attacked");
    let agent = start_agent(&cluster, holder.proxy.web, &node);
    holder
        .proxy
        .tunnel
        .registry()
        .wait_for("node-attacked", |a| a.is_some_and(|a| a.online))
        .within("node-attacked registered")
        .await;
    let peer = Peer::new(
        holder.id(),
        holder.peer_addr.to_string(),
        vec![node.host_id.clone()],
    );
    let caller_id = format!("{}.{CLUSTER}", uuid::Uuid::new_v4());
    let caller_keys = PeerKeys::new(&host_x509(&cluster, &caller_id, &[SystemRole::Proxy])).unwrap();
    let caller = PeerDialer::with_keys(caller_keys.clone()).unwrap();
    caller.set_peers(vec![peer.clone()]);

    // Connections that never finish their handshake: some send nothing, some half a
    // ClientHello. A real peer is served meanwhile, and each stalled one is closed by the
    // handshake deadline.
    let mut stalled = Vec::new();
    for i in 0..8 {
        let mut tcp = tokio::net::TcpStream::connect(holder.peer_addr).await.unwrap();
        if i % 2 == 1 {
            tcp.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00])
                .await
                .unwrap();
        }
        stalled.push(tcp);
    }
    caller
        .dial(&dial_request(&node.host_id))
        .within("a real peer's dial while handshakes stall")
        .await
        .unwrap();
    for (i, mut tcp) in stalled.into_iter().enumerate() {
        let mut buf = [0u8; 256];
        let limit = svc_net::tunnel::peer::PEER_HANDSHAKE_TIMEOUT + STEP;
        loop {
            match tokio::time::timeout(limit, tcp.read(&mut buf)).await {
                Ok(Ok(0) | Err(_)) => break,
                Ok(Ok(_)) => continue,
                Err(_) => panic!("stalled handshake {i} still open after {limit:?}"),
            }
        }
    }

    // A dial for an agent the peer does not hold names the agent and the peer.
    let err = match caller
        .dial(&dial_request("node-elsewhere"))
        .within("a dial for an agent not held")
        .await
    {
        Ok(_) => panic!("a dial for an agent the peer does not hold succeeded"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("node-elsewhere") && err.contains(holder.id()) && err.contains("no tunnel to agent"),
        "{err}"
    );

    // A peer of another cluster is not trusted by this cluster's proxies.
    let other = Cluster::new();
    let foreign = start_peering_proxy(&other).await;
    let to_foreign = PeerDialer::with_keys(caller_keys.clone()).unwrap();
    to_foreign.set_peers(vec![Peer::new(
        foreign.id(),
        foreign.peer_addr.to_string(),
        vec![],
    )]);
    let err = match to_foreign
        .dial(&dial_request(&node.host_id))
        .within("a dial to a foreign peer")
        .await
    {
        Ok(_) => panic!("a peer of another cluster was trusted"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains(foreign.id()) && err.contains("certificate"), "{err}");
    foreign.shutdown().await;

    // Malformed or oversized first frames end the call; the connection still serves a good one.
    let channel = raw_channel(&caller_keys, holder.peer_addr).await;
    let good = serde_json::to_string(&dial_request(&node.host_id)).unwrap();
    let cases: Vec<(&str, Frame, tonic::Code)> = vec![
        (
            "an oversized dial request",
            dial_frame(format!("{{\"pad\": \"{}\"}}", "x".repeat(1 << 20))),
            tonic::Code::OutOfRange,
        ),
        (
            "a data frame first",
            Frame {
                message: Some(Message::Data(proto::Data {
                    bytes: b"SSH-2.0-x\r\n".to_vec(),
                })),
            },
            tonic::Code::InvalidArgument,
        ),
        (
            "an empty frame",
            Frame { message: None },
            tonic::Code::InvalidArgument,
        ),
        (
            "a dial request that is not JSON",
            dial_frame("not json".into()),
            tonic::Code::InvalidArgument,
        ),
        (
            "a dial request without a server",
            dial_frame("{\"address\": 5}".into()),
            tonic::Code::InvalidArgument,
        ),
    ];
    for (what, frame, code) in cases {
        match first_answer(channel.clone(), frame).within(what).await {
            Ok(f) => panic!("{what} was answered with {f:?}"),
            Err(status) => {
                println!("{what}: {:?} {}", status.code(), status.message());
                assert_eq!(status.code(), code, "{what}: {status:?}");
            }
        }
    }
    let answer = first_answer(channel.clone(), dial_frame(good))
        .within("a good dial request after the bad ones")
        .await
        .unwrap();
    assert!(
        matches!(answer.message, Some(Message::Established(_))),
        "{answer:?}"
    );

    agent.shutdown().await;
    holder.shutdown().await;
}
