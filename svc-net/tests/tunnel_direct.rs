//! Direct join on real loopback sockets: a directly joined agent's TLS listener
//! (`serve_direct`) and the proxy's `DirectDialer`. The proxy's host certificate is served; a
//! host without the `proxy` role is refused; an agent whose certificate is for another host ID
//! than the one the lookup named is refused by the proxy; no announced listener is `None`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use svc_core::SystemClock;
use svc_core::auth::AuthService;
use svc_core::auth::ServedKind;
use svc_core::backend::{Backend, MemoryBackend};
use svc_core::identity::{HostCertRequest, SystemRole};
use svc_net::auth::{ClientIdentity, KeyMaterial};
use svc_net::io::BoxIo;
use svc_net::tunnel::{
    DialRequest, DirectDialer, DirectLookup, DirectTarget, agent_tls, dial_service_fn, serve_direct,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

const CLUSTER: &str = "direct.test";

async fn auth() -> AuthService {
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    AuthService::open(backend, CLUSTER, Arc::new(SystemClock))
        .await
        .unwrap()
}

fn identity(auth: &AuthService, name: &str, roles: Vec<SystemRole>) -> ClientIdentity {
    let keys = KeyMaterial::generate().unwrap();
    let req = HostCertRequest {
        host_uuid: uuid::Uuid::new_v4(),
        node_name: name.into(),
        roles,
        additional_names: vec![],
        ttl: Duration::from_secs(3600),
    };
    let certs = auth
        .issue_host_certs(&req, &keys.tls_public_key(), keys.ssh_public_key())
        .unwrap();
    keys.into_identity(&certs, CLUSTER).unwrap()
}

/// Names one listener for every server, or none.
struct Fixed(Option<DirectTarget>);

impl DirectLookup for Fixed {
    fn lookup(
        &self,
        _server: String,
        _conn_type: ServedKind,
    ) -> Pin<Box<dyn Future<Output = Result<Option<DirectTarget>, String>> + Send>> {
        let target = self.0.clone();
        Box::pin(async move { Ok(target) })
    }
}

/// An agent listener whose service answers every dial with a stream that echoes.
async fn agent_listener(agent: &ClientIdentity) -> (String, CancellationToken) {
    let service = dial_service_fn(|req: DialRequest| async move {
        assert_eq!(req.address, "win");
        let (ours, theirs) = tokio::io::duplex(1024);
        tokio::spawn(async move {
            let (mut r, mut w) = tokio::io::split(theirs);
            let _ = tokio::io::copy(&mut r, &mut w).await;
        });
        Ok::<BoxIo, tower::BoxError>(Box::new(ours))
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let stop = CancellationToken::new();
    tokio::spawn(serve_direct(
        listener,
        agent_tls(agent).unwrap(),
        Arc::new(agent.verifier().unwrap()),
        service,
        stop.clone(),
    ));
    (addr, stop)
}

fn request(server: &str) -> DialRequest {
    DialRequest {
        address: "win".into(),
        server_id: server.into(),
        conn_type: ServedKind::WindowsDesktop,
        client_src_addr: "127.0.0.1:1".into(),
        client_dst_addr: "127.0.0.1:2".into(),
        db_route: None,
    }
}

#[tokio::test]
async fn the_proxy_reaches_the_agent_and_nobody_else_does() {
    let auth = auth().await;
    let agent = identity(&auth, "edge", vec![SystemRole::WindowsDesktop]);
    let proxy = identity(&auth, "proxy", vec![SystemRole::Proxy]);
    let node = identity(&auth, "other", vec![SystemRole::Node]);
    let (addr, _stop) = agent_listener(&agent).await;
    let target = DirectTarget {
        host_id: agent.name.clone(),
        addr: addr.clone(),
    };

    // The proxy: the dial request is answered `ok`, then bytes flow.
    // Everything here runs on loopback: the single-host lab opt-in.
    let dialer = DirectDialer::new(&proxy, Arc::new(Fixed(Some(target.clone()))))
        .unwrap()
        .with_allow_loopback(true);
    let mut io = dialer.dial(request("edge")).await.unwrap().expect("a listener");
    io.write_all(b"rdp bytes").await.unwrap();
    let mut buf = [0u8; 9];
    tokio::time::timeout(Duration::from_secs(60), io.read_exact(&mut buf))
        .await
        .expect("the 9 bytes echoed through the direct dial did not come back within 60 s")
        .unwrap();
    assert_eq!(&buf, b"rdp bytes");

    // Another cluster member without the `proxy` role: refused before any dial.
    let intruder = DirectDialer::new(&node, Arc::new(Fixed(Some(target.clone()))))
        .unwrap()
        .with_allow_loopback(true);
    let err = intruder.dial(request("edge")).await.err().expect("refused");
    assert!(err.to_string().contains("proxy"), "{err}");

    // The lookup named another host ID than the certificate carries: the proxy refuses it.
    let wrong = DirectTarget {
        host_id: proxy.name.clone(),
        addr,
    };
    let misled = DirectDialer::new(&proxy, Arc::new(Fixed(Some(wrong))))
        .unwrap()
        .with_allow_loopback(true);
    assert!(misled.dial(request("edge")).await.is_err());

    // No announced listener: not this dialer's to answer.
    let none = DirectDialer::new(&proxy, Arc::new(Fixed(None))).unwrap();
    assert!(none.dial(request("edge")).await.unwrap().is_none());

    // Without the opt-in (the default) the proxy never dials a loopback listener.
    let strict = DirectDialer::new(&proxy, Arc::new(Fixed(Some(target.clone())))).unwrap();
    let err = strict.dial(request("edge")).await.err().expect("refused");
    assert!(err.to_string().contains("loopback"), "{err}");
}

/// A lookup that reports a refused announcement.
struct Refused;

impl DirectLookup for Refused {
    fn lookup(
        &self,
        _server: String,
        _conn_type: ServedKind,
    ) -> Pin<Box<dyn Future<Output = Result<Option<DirectTarget>, String>> + Send>> {
        Box::pin(async {
            Err(
                "node \"edge\" announced the listener 127.0.0.1:1 and the Auth Service refused it: loopback"
                    .to_owned(),
            )
        })
    }
}

#[tokio::test]
async fn a_refused_announcement_is_a_refusal_naming_the_node_and_the_reason() {
    let auth = auth().await;
    let proxy = identity(&auth, "proxy", vec![SystemRole::Proxy]);
    let dialer = DirectDialer::new(&proxy, Arc::new(Refused)).unwrap();
    let err = dialer
        .dial(request("edge"))
        .await
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains("node \"edge\" announced the listener 127.0.0.1:1"),
        "{err}"
    );
    assert!(err.contains("loopback"), "{err}");
}

/// SSH (3022) too: the proxy pipes a user to a node's announced listener only after the agent
/// proved with its host certificate to be the host the Auth Service named. A listener that is
/// not that agent (here one that records what it is sent) gets a TLS ClientHello and nothing
/// else: no dial request, no user bytes.
#[tokio::test]
async fn a_node_listener_that_is_not_the_named_agent_gets_no_user_bytes() {
    let auth = auth().await;
    let proxy = identity(&auth, "proxy", vec![SystemRole::Proxy]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let received = tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut got = Vec::new();
        // An SSH server's banner, as a plain sshd on the announced port would send.
        let _ = sock.write_all(b"SSH-2.0-OpenSSH_9.2\r\n").await;
        let _ = tokio::time::timeout(Duration::from_secs(30), sock.read_to_end(&mut got)).await;
        got
    });
    let target = DirectTarget {
        host_id: "edge.example.com".into(),
        addr,
    };
    let dialer = DirectDialer::new(&proxy, Arc::new(Fixed(Some(target))))
        .unwrap()
        .with_allow_loopback(true);
    let mut req = request("edge");
    req.conn_type = ServedKind::Node;
    req.address = "edge:3022".into();
    let err = tokio::time::timeout(Duration::from_secs(60), dialer.dial(req))
        .await
        .expect("the direct dial neither failed nor succeeded within 60 s")
        .err()
        .expect("a listener without the agent's host certificate is refused");
    assert!(err.to_string().contains("TLS"), "{err}");
    drop(dialer);
    let got = tokio::time::timeout(Duration::from_secs(60), received)
        .await
        .expect("the recording listener did not finish within 60 s")
        .unwrap();
    assert_eq!(
        got.first(),
        Some(&0x16),
        "the first bytes are a TLS handshake: {got:?}"
    );
    let text = String::from_utf8_lossy(&got);
    assert!(!text.contains("server_id"), "the dial request leaked: {text}");
}
