//! Local proxies' multiplexed connection to the proxy (ALPN `svc-mux`, HTTP/2 `CONNECT`
//! streams inside the user's TLS), against an all-in-one cluster with two `tcp://` apps on
//! loopback echo servers: many client connections share one TLS connection and one handshake,
//! bulk data crosses the flow-control windows, and each stream is decided like a connection of
//! its own — a narrow role is refused per stream without hurting the other streams, a lock
//! reaches the next stream of an open connection, a certificate that expires stops new streams
//! while the open ones go on. As an attacker with a valid certificate speaking HTTP/2 by hand:
//! malformed streams get a status naming what is wrong, a client without a certificate is
//! refused at TLS, and one that never sends the HTTP/2 preface is cut at the handshake deadline.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use svc_core::Secret;
use svc_core::auth::ServedKind;
use svc_core::config::Config;
use svc_net::auth::{AuthClient, ClientIdentity};
use svc_net::client::{ConnectError, Multiplexer, ResourceClient, TlsConfigs};
use svc_net::route::alpn;
use svc_net::services::mux;
use svc_testkit::within;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Every wait here has this deadline.
const STEP: Duration = Duration::from_secs(60);
const PASSWORD: &str = "mux-password-1";

/// A loopback echo server; returns its port.
async fn echo_server() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind echo");
    let port = listener.local_addr().expect("echo addr").port();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = sock.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    port
}

struct Setup {
    running: svc_net::cluster::RunningCluster,
    proxy: String,
    admin: AuthClient,
    _dir: tempfile::TempDir,
}

/// An all-in-one cluster serving app `echo` (`env: dev`) and app `secret` (`env: prod`), and
/// role `dev-only` (apps labelled `env: dev`).
async fn start() -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    let (dev, prod) = (echo_server().await, echo_server().await);
    let yaml = format!(
        "version: v1\nsvc:\n  data_dir: {}\n  log:\n    severity: warn\nauth_service:\n  listen_addr: 127.0.0.1:0\n  cluster_name: mux.test\nproxy_service:\n  web_listen_addr: 127.0.0.1:0\nssh_service:\n  enabled: false\napp_service:\n  enabled: true\n  apps:\n  - name: echo\n    uri: tcp://127.0.0.1:{dev}\n    labels: {{env: dev}}\n  - name: secret\n    uri: tcp://127.0.0.1:{prod}\n    labels: {{env: prod}}\n",
        dir.path().display()
    );
    let config = Config::from_yaml_str_with_hostname(&yaml, "mux").expect("config");
    let running = within(
        STEP,
        "the cluster starting",
        svc_net::Cluster::from_config(&config).start(),
    )
    .await
    .expect("start the cluster");
    let admin =
        ClientIdentity::load(&running.auth.as_ref().expect("auth").admin_identity).expect("admin identity");
    let mut admin = AuthClient::connect_with(&admin).await.expect("admin client");
    admin
        .put_resources(
            "kind: role\nversion: v7\nmetadata:\n  name: dev-only\nspec:\n  allow:\n    app_labels: {env: dev}\n",
            true,
        )
        .await
        .expect("role dev-only");
    let proxy = running.proxy.as_ref().expect("proxy").addrs().web.to_string();
    Setup {
        running,
        proxy,
        admin,
        _dir: dir,
    }
}

impl Setup {
    /// Creates `name` with `role` and signs in through the proxy (certificate for `ttl`).
    async fn user(&mut self, name: &str, role: &str, ttl: Option<Duration>) -> ClientIdentity {
        let password = Secret::new(PASSWORD.into());
        self.admin
            .create_user(name, &[role.to_owned()], &[], &password)
            .await
            .expect("create user");
        svc_net::client::login_via_proxy(&self.proxy, true, None, name, &password, ttl)
            .await
            .expect("sign in")
    }

    fn client(&self, identity: ClientIdentity) -> ResourceClient {
        ResourceClient {
            proxy: svc_core::Addr::parse(&self.proxy).expect("proxy addr"),
            identity,
            insecure: true,
            extra_ca_pem: None,
            dialer: svc_net::dial::ProxyDialer::from_env().expect("dialer"),
            tls_configs: TlsConfigs::default(),
            multiplexer: Multiplexer::new(),
        }
    }
}

/// Opens a connection to app `name` through `client`.
async fn open(client: &ResourceClient, name: &str) -> Result<svc_net::io::BoxIo, ConnectError> {
    within(
        STEP,
        &format!("a connection to app {name}"),
        client.connect(ServedKind::App, name, alpn::TCP),
    )
    .await
}

/// Sends `data` and reads as many bytes back (the apps echo), writing and reading at once.
async fn echo(io: &mut svc_net::io::BoxIo, data: &[u8]) -> Vec<u8> {
    let (mut r, mut w) = tokio::io::split(io);
    let mut back = vec![0u8; data.len()];
    let (wrote, read) = within(STEP, "an echo", async {
        tokio::join!(w.write_all(data), r.read_exact(&mut back))
    })
    .await;
    wrote.expect("write");
    read.expect("read the echo");
    back
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_connections_share_one_tls_connection_and_bulk_data_crosses_intact() {
    let mut setup = start().await;
    let alice = setup.user("alice", "access", None).await;
    let client = setup.client(alice);

    // One after another, then twenty at once.
    for i in 0..10u8 {
        let mut io = open(&client, "echo").await.expect("stream to echo");
        assert_eq!(echo(&mut io, &[i; 100]).await, vec![i; 100]);
    }
    let clients: Vec<_> = (0..20u8)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let mut io = open(&client, "echo").await.expect("stream to echo");
                let data: Vec<u8> = (0..5000u32).map(|n| (n as u8) ^ i).collect();
                assert_eq!(echo(&mut io, &data).await, data);
            })
        })
        .collect();
    for c in clients {
        c.await.expect("a concurrent client");
    }
    // 8 MiB both ways on one stream: many times the 64 KiB HTTP/2 default window.
    let mut io = open(&client, "echo").await.expect("stream to echo");
    let data: Vec<u8> = (0..8 * 1024 * 1024u32).map(|n| (n % 251) as u8).collect();
    assert!(echo(&mut io, &data).await == data, "8 MiB came back changed");
    // The end of input travels: the echo server sees it and closes its side.
    io.shutdown().await.expect("shutdown");
    let mut rest = Vec::new();
    within(STEP, "the end of the echo", io.read_to_end(&mut rest))
        .await
        .expect("read to end");
    assert!(rest.is_empty());

    let mux = &client.multiplexer;
    assert_eq!(mux.connections_made(), 1, "{mux:?}");
    assert_eq!(mux.streams_opened(), 31, "{mux:?}");
    let tls = &client.tls_configs;
    assert_eq!(
        tls.full_handshakes() + tls.resumed_handshakes(),
        1,
        "one TLS handshake for every connection: {tls:?}"
    );

    // The same client without multiplexing makes a TLS connection per client connection.
    let own = ResourceClient {
        tls_configs: TlsConfigs::default(),
        multiplexer: Multiplexer::disabled(),
        ..client.clone()
    };
    for _ in 0..3 {
        let mut io = open(&own, "echo").await.expect("own connection to echo");
        assert_eq!(echo(&mut io, b"own").await, b"own");
    }
    assert_eq!(
        own.tls_configs.full_handshakes() + own.tls_configs.resumed_handshakes(),
        3
    );
    assert_eq!(own.multiplexer.streams_opened(), 0);
    drop(io);
    setup.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_stream_is_decided_on_its_own_and_a_lock_reaches_the_next_stream() {
    let mut setup = start().await;
    let bob = setup.user("bob", "dev-only", None).await;
    let client = setup.client(bob);

    let mut kept = open(&client, "echo").await.expect("bob may reach echo");
    assert_eq!(echo(&mut kept, b"first").await, b"first");
    // Another app on the same connection: refused by the role, named in the refusal.
    match open(&client, "secret").await {
        Err(ConnectError::Refused(text)) => {
            assert!(text.contains("access denied to app \"secret\""), "{text}")
        }
        Err(e) => panic!("bob's stream to secret failed, but not as refused: {e}"),
        Ok(_) => panic!("bob reached app secret, which his role does not allow"),
    }
    match open(&client, "nope").await {
        Err(ConnectError::Refused(text)) => assert!(text.contains("app \"nope\" not found"), "{text}"),
        other => panic!("a stream to an unknown app: {:?}", other.err()),
    }
    // The refusals hurt neither the open stream nor the connection.
    assert_eq!(echo(&mut kept, b"still here").await, b"still here");
    let mut again = open(&client, "echo").await.expect("echo again");
    assert_eq!(echo(&mut again, b"again").await, b"again");
    assert_eq!(client.multiplexer.connections_made(), 1);

    // A lock on bob: the next stream on the same open connection is refused within a second or
    // so (the proxy decides from its watched cache).
    setup
        .admin
        .put_resources(
            "kind: lock\nversion: v2\nmetadata: {name: user-bob}\nspec:\n  target: {user: bob}\n  message: incident 31\n",
            true,
        )
        .await
        .expect("lock bob");
    let deadline = Instant::now() + Duration::from_secs(10);
    let refusal = loop {
        match open(&client, "echo").await {
            Err(ConnectError::Refused(text)) => break text,
            Err(e) => panic!("after the lock: not a refusal: {e}"),
            Ok(_) => {
                assert!(
                    Instant::now() < deadline,
                    "bob's new streams still open 10 s after his lock"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert!(
        refusal.contains("incident 31") || refusal.contains("locked"),
        "{refusal}"
    );
    assert_eq!(
        client.multiplexer.connections_made(),
        1,
        "the lock was decided per stream, on the same connection"
    );
    drop((kept, again));
    setup.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_certificate_opens_no_new_stream_and_the_open_ones_go_on() {
    let mut setup = start().await;
    let ttl = Duration::from_secs(5);
    let carol = setup.user("carol", "access", Some(ttl)).await;
    let expires = std::time::SystemTime::now() + ttl;
    let client = setup.client(carol);
    let mut kept = open(&client, "echo").await.expect("carol reaches echo");
    assert_eq!(echo(&mut kept, b"before").await, b"before");
    let wait = expires
        .duration_since(std::time::SystemTime::now())
        .unwrap_or_default();
    tokio::time::sleep(wait + Duration::from_secs(1)).await;
    // The proxy stopped taking streams on the connection at expiry, and a new connection
    // with the expired certificate is refused at TLS.
    match open(&client, "echo").await {
        Err(e) => assert!(e.to_string().to_lowercase().contains("expired"), "{e}"),
        Ok(_) => panic!("a stream opened with a certificate that has expired"),
    }
    assert_eq!(
        echo(&mut kept, b"after").await,
        b"after",
        "the open stream was cut at expiry"
    );
    drop(kept);
    setup.running.shutdown().await;
}

/// A TCP relay in front of the proxy: returns its address and a switch that cuts every
/// connection it carries. With `old_proxy` it plays a proxy that does not know ALPN `svc-mux`:
/// a connection whose ClientHello offers it is closed before any answer, as a router without
/// that route does, and counts those it closed.
async fn relay(
    proxy: String,
    old_proxy: bool,
) -> (
    String,
    tokio_util::sync::CancellationToken,
    Arc<std::sync::atomic::AtomicUsize>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind relay");
    let addr = listener.local_addr().expect("relay addr").to_string();
    let cut = tokio_util::sync::CancellationToken::new();
    let cut_all = cut.clone();
    let refused = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let refused_all = refused.clone();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let (proxy, cut, refused) = (proxy.clone(), cut_all.clone(), refused_all.clone());
            tokio::spawn(async move {
                let mut hello = vec![0u8; 4096];
                let Ok(n) = client.read(&mut hello).await else {
                    return;
                };
                hello.truncate(n);
                if old_proxy && hello.windows(alpn::MUX.len()).any(|w| w == alpn::MUX.as_bytes()) {
                    refused.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    return;
                }
                let Ok(mut upstream) = TcpStream::connect(&proxy).await else {
                    return;
                };
                if upstream.write_all(&hello).await.is_err() {
                    return;
                }
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
                    () = cut.cancelled() => {}
                }
            });
        }
    });
    (addr, cut, refused)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_connection_is_made_again_and_an_older_proxy_gets_connections_of_their_own() {
    let mut setup = start().await;
    let dave = setup.user("dave", "access", None).await;

    // The multiplexed connection breaks (the path to the proxy is cut): the next client
    // connection makes a new one.
    let (addr, cut, _) = relay(setup.proxy.clone(), false).await;
    let client = ResourceClient {
        proxy: svc_core::Addr::parse(&addr).expect("relay addr"),
        ..setup.client(dave.clone())
    };
    let mut io = open(&client, "echo").await.expect("through the relay");
    assert_eq!(echo(&mut io, b"one").await, b"one");
    cut.cancel();
    let mut rest = Vec::new();
    let _ = within(STEP, "the cut stream ending", io.read_to_end(&mut rest)).await;
    let (addr2, _cut2, _) = relay(setup.proxy.clone(), false).await;
    let client = ResourceClient {
        proxy: svc_core::Addr::parse(&addr2).expect("relay addr"),
        ..client
    };
    let mut io = open(&client, "echo").await.expect("after the cut");
    assert_eq!(echo(&mut io, b"two").await, b"two");
    assert_eq!(
        client.multiplexer.connections_made(),
        2,
        "{:?}",
        client.multiplexer
    );
    drop(io);

    // A proxy that does not serve `svc-mux` closes the handshake: every client connection
    // then goes on a TLS connection of its own, and the refusals still come through.
    // Eight client connections at once: one tries the multiplexed connection, and the others,
    // waiting behind it, do not try again in turn.
    let (old, _keep, refused) = relay(setup.proxy.clone(), true).await;
    let client = ResourceClient {
        proxy: svc_core::Addr::parse(&old).expect("relay addr"),
        ..setup.client(dave)
    };
    let clients: Vec<_> = (0..8u8)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let mut io = open(&client, "echo").await.expect("through the older proxy");
                assert_eq!(echo(&mut io, &[i; 10]).await, vec![i; 10]);
            })
        })
        .collect();
    for c in clients {
        c.await.expect("a client through the older proxy");
    }
    assert_eq!(
        refused.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "svc-mux handshakes tried"
    );
    assert_eq!(client.multiplexer.connections_made(), 0);
    assert_eq!(
        client.tls_configs.full_handshakes() + client.tls_configs.resumed_handshakes(),
        8,
        "one TLS connection per client connection: {:?}",
        client.tls_configs
    );
    match open(&client, "nope").await {
        Err(ConnectError::Refused(text)) => assert!(text.contains("app \"nope\" not found"), "{text}"),
        other => panic!(
            "a connection to an unknown app through the older proxy: {:?}",
            other.err()
        ),
    }
    setup.running.shutdown().await;
}

/// TLS to the proxy with ALPN `svc-mux`, with `identity`'s certificate or none.
async fn raw_tls(
    proxy: &str,
    identity: Option<&ClientIdentity>,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    // The proxy's web certificate is self-signed here; the test checks the proxy's side only.
    let mut config = match identity {
        Some(id) => {
            let (chain, key) = id.tls_parts().expect("tls parts");
            svc_net::tls::insecure_client_config_with_auth(chain, key).expect("client cert")
        }
        None => svc_net::tls::insecure_client_config().expect("client config"),
    };
    config.alpn_protocols = vec![alpn::MUX.as_bytes().to_vec()];
    let tcp = TcpStream::connect(proxy).await?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let mut tls = connector
        .connect(ServerName::try_from("localhost").expect("name"), tcp)
        .await?;
    // TLS 1.3: a refused client certificate shows at the first read.
    tls.flush().await?;
    Ok(tls)
}

/// A stream's status and body, asked by hand.
async fn ask(
    sender: &mut hyper::client::conn::http2::SendRequest<Empty<Bytes>>,
    req: http::Request<Empty<Bytes>>,
) -> (http::StatusCode, String) {
    let resp = within(STEP, "an answer to a stream", sender.send_request(req))
        .await
        .expect("the stream's answer");
    let status = resp.status();
    let body = within(STEP, "an answer's body", resp.into_body().collect())
        .await
        .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
        .unwrap_or_default();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_streams_uncertified_clients_and_silent_peers_are_refused() {
    let mut setup = start().await;
    let mallory = setup.user("mallory", "access", None).await;

    // HTTP/2 by hand, with a valid certificate.
    let tls = raw_tls(&setup.proxy, Some(&mallory))
        .await
        .expect("TLS with a certificate");
    let (mut sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
        .await
        .expect("HTTP/2 handshake");
    tokio::spawn(conn);
    let request = |method: http::Method, alpn_header: Option<&str>, resource: Option<&[u8]>| {
        let mut b = http::Request::builder().method(method).uri(mux::AUTHORITY);
        if let Some(a) = alpn_header {
            b = b.header(mux::ALPN_HEADER, a);
        }
        if let Some(r) = resource {
            b = b.header(
                mux::REQUEST_HEADER,
                http::HeaderValue::from_bytes(r).expect("header"),
            );
        }
        b.body(Empty::<Bytes>::new()).expect("request")
    };
    let good = br#"{"kind":"app","name":"echo"}"#;
    let (status, body) = ask(
        &mut sender,
        http::Request::builder()
            .uri("https://svc-mux/")
            .body(Empty::new())
            .expect("GET"),
    )
    .await;
    assert_eq!(status, http::StatusCode::METHOD_NOT_ALLOWED, "{body}");
    let (status, body) = ask(&mut sender, request(http::Method::CONNECT, Some(alpn::TCP), None)).await;
    assert_eq!(status, http::StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains(mux::REQUEST_HEADER), "{body}");
    for bad in [None, Some(alpn::MUX), Some("h2"), Some("svc-reversetunnel")] {
        let (status, body) = ask(&mut sender, request(http::Method::CONNECT, bad, Some(good))).await;
        assert_eq!(
            status,
            http::StatusCode::BAD_REQUEST,
            "ALPN header {bad:?}: {body}"
        );
        assert!(
            body.contains("svc-tcp"),
            "the refusal lists the protocols: {body}"
        );
    }
    let (status, body) = ask(
        &mut sender,
        request(http::Method::CONNECT, Some(alpn::TCP), Some(b"{not json")),
    )
    .await;
    assert_eq!(status, http::StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("malformed resource request"), "{body}");
    let long = format!(r#"{{"kind":"app","name":"{}"}}"#, "x".repeat(5000));
    let (status, body) = ask(
        &mut sender,
        request(http::Method::CONNECT, Some(alpn::TCP), Some(long.as_bytes())),
    )
    .await;
    assert_eq!(status, http::StatusCode::BAD_REQUEST, "{body}");
    // A database request on the app protocol is refused in the stream, by the same rules as a
    // connection of its own.
    let resp = within(
        STEP,
        "a stream's answer",
        sender.send_request(request(
            http::Method::CONNECT,
            Some(alpn::TCP),
            Some(br#"{"kind":"db","name":"echo"}"#),
        )),
    )
    .await
    .expect("answer");
    assert_eq!(resp.status(), http::StatusCode::OK);
    let mut stream = TokioIo::new(
        within(STEP, "the upgrade", hyper::upgrade::on(resp))
            .await
            .expect("upgraded"),
    );
    let mut answer = String::new();
    within(STEP, "the refusal line", stream.read_to_string(&mut answer))
        .await
        .expect("read the refusal");
    assert!(answer.contains("does not carry db connections"), "{answer}");
    // After all that, a good stream on the same connection works.
    let resp = within(
        STEP,
        "a good stream's answer",
        sender.send_request(request(http::Method::CONNECT, Some(alpn::TCP), Some(good))),
    )
    .await
    .expect("answer");
    assert_eq!(resp.status(), http::StatusCode::OK);
    let mut stream = TokioIo::new(
        within(STEP, "the upgrade", hyper::upgrade::on(resp))
            .await
            .expect("upgraded"),
    );
    let mut ok = [0u8; 3];
    within(STEP, "the answer line", stream.read_exact(&mut ok))
        .await
        .expect("answer line");
    assert_eq!(&ok, b"ok\n");
    stream.write_all(b"ping").await.expect("write");
    let mut back = [0u8; 4];
    within(STEP, "the echo", stream.read_exact(&mut back))
        .await
        .expect("echo");
    assert_eq!(&back, b"ping");
    drop((stream, sender));

    // No certificate: refused at TLS, before any stream.
    let refused = async {
        let mut tls = raw_tls(&setup.proxy, None).await?;
        let mut b = [0u8; 1];
        tls.read(&mut b).await
    };
    match within(STEP, "TLS without a certificate", refused).await {
        Ok(0) | Err(_) => {}
        Ok(n) => panic!("a client without a certificate read {n} bytes"),
    }

    // A certified peer that never sends the HTTP/2 preface is closed at the handshake deadline
    // (30 s), not kept.
    let mut silent = raw_tls(&setup.proxy, Some(&mallory))
        .await
        .expect("TLS with a certificate");
    let mut b = [0u8; 64];
    within(
        Duration::from_secs(90),
        "the proxy closing a silent connection",
        async {
            loop {
                match silent.read(&mut b).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => continue,
                }
            }
        },
    )
    .await;
    setup.running.shutdown().await;
}
