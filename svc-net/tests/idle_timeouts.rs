//! Idle timeouts that take effect: an idle HTTP/1.1 keep-alive connection and an idle HTTP/2
//! connection to the web port, and an idle gRPC connection to the Auth API, are closed after the
//! idle timeout; a connection with a request in flight longer than that, or one that keeps
//! sending requests, stays open.

use std::{sync::Arc, time::Duration};

use anyhow::{Context, Result, bail};
use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use svc_core::{SystemClock, auth::AuthService, backend::MemoryBackend};
use svc_net::proxy::{ProxyBuilder, ProxySettings, RunningProxy};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const IDLE: Duration = Duration::from_secs(1);
/// Generous: a loaded machine may stall for seconds.
const MARGIN: Duration = Duration::from_secs(10);
/// How long the slow route takes to answer: several idle timeouts.
const SLOW: Duration = Duration::from_secs(4);

async fn start_proxy(dir: &std::path::Path) -> Result<RunningProxy> {
    let mut settings = ProxySettings::default();
    settings.ping.web_listen_addr = "127.0.0.1:0".parse()?;
    settings.ping.ssh_listen_addr = "127.0.0.1:0".parse()?;
    settings.ping.tunnel_listen_addr = "127.0.0.1:0".parse()?;
    settings.tls = svc_net::tls::TlsSource::Generated {
        data_dir: dir.to_owned(),
    };
    settings.web_idle_timeout = IDLE;
    // A route that answers after SLOW: a request in flight longer than the idle timeout.
    let slow = tower::service_fn(|_req: http::Request<svc_net::proxy::web::Body>| async {
        tokio::time::sleep(SLOW).await;
        Ok::<_, std::convert::Infallible>(http::Response::new(svc_net::proxy::web::full("slow done")))
    });
    Ok(ProxyBuilder::new(settings)
        .web_mount("/slow", svc_net::proxy::web::web_service(slow))
        .bind()
        .await?)
}

async fn tls_to(
    addr: std::net::SocketAddr,
    ca_pem: &[u8],
    alpn: &[u8],
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let mut config = (*svc_net::tls::client_config(Some(ca_pem))?).clone();
    config.alpn_protocols = vec![alpn.to_vec()];
    let tcp = tokio::time::timeout(Duration::from_secs(20), tokio::net::TcpStream::connect(addr))
        .await
        .context("connecting took over 20 s")??;
    let tls = tokio::time::timeout(
        Duration::from_secs(20),
        tokio_rustls::TlsConnector::from(Arc::new(config)).connect("localhost".try_into()?, tcp),
    )
    .await
    .context("TLS handshake took over 20 s")??;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(alpn));
    Ok(tls)
}

/// Waits for a client connection task to end (the server closed it); fails if it has not
/// ended within IDLE + MARGIN.
async fn assert_closed_after_idle(
    conn: tokio::task::JoinHandle<()>,
    idle_from: Instant,
    what: &str,
) -> Result<()> {
    tokio::time::timeout(IDLE + MARGIN, conn)
        .await
        .with_context(|| {
            format!(
                "an idle {what} connection was not closed within {:?}",
                IDLE + MARGIN
            )
        })?
        .context("connection task")?;
    tracing::debug!(what, after = ?idle_from.elapsed(), "closed for idleness");
    Ok(())
}

async fn get<B>(send: &mut B, uri: &str) -> Result<(u16, Bytes)>
where
    B: SendRequest,
{
    let resp = tokio::time::timeout(Duration::from_secs(20), send.send(uri))
        .await
        .with_context(|| format!("GET {uri}: no response within 20 s"))??;
    let status = resp.status().as_u16();
    let body = tokio::time::timeout(Duration::from_secs(20), resp.into_body().collect())
        .await
        .with_context(|| format!("GET {uri}: body not complete within 20 s"))??
        .to_bytes();
    Ok((status, body))
}

/// The HTTP/1.1 and HTTP/2 client senders, behind one shape.
trait SendRequest {
    fn send(
        &mut self,
        uri: &str,
    ) -> impl std::future::Future<Output = hyper::Result<http::Response<hyper::body::Incoming>>>;
}

impl SendRequest for hyper::client::conn::http1::SendRequest<Empty<Bytes>> {
    async fn send(&mut self, uri: &str) -> hyper::Result<http::Response<hyper::body::Incoming>> {
        self.ready().await?;
        let req = http::Request::get(uri)
            .header(http::header::HOST, "localhost")
            .body(Empty::new())
            .expect("request");
        self.send_request(req).await
    }
}

impl SendRequest for hyper::client::conn::http2::SendRequest<Empty<Bytes>> {
    async fn send(&mut self, uri: &str) -> hyper::Result<http::Response<hyper::body::Incoming>> {
        self.ready().await?;
        let req = http::Request::get(format!("https://localhost{uri}"))
            .body(Empty::new())
            .expect("request");
        self.send_request(req).await
    }
}

/// Sends requests every IDLE/3 for 3 × IDLE on `send`; every one must succeed (the connection
/// was never closed for idleness).
async fn keep_busy<B: SendRequest>(send: &mut B, what: &str) -> Result<()> {
    let until = Instant::now() + IDLE * 3;
    let mut n = 0;
    while Instant::now() < until {
        let (status, _) = get(send, "/webapi/ping")
            .await
            .with_context(|| format!("{what}: request {n} on a busy connection failed"))?;
        assert_eq!(status, 200, "{what}: request {n}");
        n += 1;
        tokio::time::sleep(IDLE / 3).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_idle_keep_alive_is_closed_busy_and_slow_ones_are_not() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let proxy = start_proxy(dir.path()).await?;
    let ca = std::fs::read(proxy.ca_file().context("generated CA")?)?;

    // Idle after one request: closed.
    let tls = tls_to(proxy.addrs().web, &ca, b"http/1.1").await?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls)).await?;
    let conn = tokio::spawn(async move {
        let _ = conn.await;
    });
    let (status, _) = get(&mut send, "/webapi/ping").await?;
    assert_eq!(status, 200);
    assert_closed_after_idle(conn, Instant::now(), "HTTP/1.1").await?;

    // Busy: requests at a third of the idle time, then a slow request of 4 × idle.
    let tls = tls_to(proxy.addrs().web, &ca, b"http/1.1").await?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls)).await?;
    let conn = tokio::spawn(async move {
        let _ = conn.await;
    });
    keep_busy(&mut send, "HTTP/1.1").await?;
    let (status, body) = get(&mut send, "/slow").await.context("HTTP/1.1 slow request")?;
    assert_eq!((status, &body[..]), (200, &b"slow done"[..]));
    assert!(
        !conn.is_finished(),
        "HTTP/1.1: closed while a request was in flight"
    );
    assert_closed_after_idle(conn, Instant::now(), "HTTP/1.1 (after the slow request)").await?;
    proxy.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_idle_connection_gets_goaway_busy_and_slow_ones_do_not() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let proxy = start_proxy(dir.path()).await?;
    let ca = std::fs::read(proxy.ca_file().context("generated CA")?)?;

    let tls = tls_to(proxy.addrs().web, &ca, b"h2").await?;
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tls),
    )
    .await?;
    let conn = tokio::spawn(async move {
        let _ = conn.await;
    });
    let (status, _) = get(&mut send, "/webapi/ping").await?;
    assert_eq!(status, 200);
    assert_closed_after_idle(conn, Instant::now(), "HTTP/2").await?;

    let tls = tls_to(proxy.addrs().web, &ca, b"h2").await?;
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tls),
    )
    .await?;
    let conn = tokio::spawn(async move {
        let _ = conn.await;
    });
    keep_busy(&mut send, "HTTP/2").await?;
    let (status, body) = get(&mut send, "/slow").await.context("HTTP/2 slow request")?;
    assert_eq!((status, &body[..]), (200, &b"slow done"[..]));
    assert!(!conn.is_finished(), "HTTP/2: closed while a stream was open");
    assert_closed_after_idle(conn, Instant::now(), "HTTP/2 (after the slow request)").await?;
    proxy.shutdown().await;
    Ok(())
}

fn pem_of(der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let lines: Vec<&str> = b64
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).expect("base64 is ASCII"))
        .collect();
    format!(
        "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
        lines.join("\n")
    )
}

/// A gRPC `Status` call without a client certificate: answered `unauthenticated`, which is
/// enough to count as a call on the connection.
async fn grpc_status(send: &mut hyper::client::conn::http2::SendRequest<Full<Bytes>>) -> Result<String> {
    send.ready().await?;
    let req = http::Request::post("https://localhost/svc.auth.v1.Auth/Status")
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header("te", "trailers")
        .body(Full::new(Bytes::from_static(&[0, 0, 0, 0, 0])))?;
    let resp = tokio::time::timeout(Duration::from_secs(20), send.send_request(req))
        .await
        .context("gRPC Status: no response within 20 s")??;
    // A trailers-only answer carries the status in the headers.
    let in_headers = resp
        .headers()
        .get("grpc-status")
        .map(|v| v.to_str().unwrap_or("?").to_owned());
    let collected = tokio::time::timeout(Duration::from_secs(20), resp.into_body().collect())
        .await
        .context("gRPC Status: body not complete within 20 s")??;
    let code = collected
        .trailers()
        .and_then(|t| t.get("grpc-status"))
        .map(|v| v.to_str().unwrap_or("?").to_owned())
        .or(in_headers);
    code.context("gRPC Status: no grpc-status trailer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_idle_connection_is_closed_busy_one_is_not_and_clients_reconnect() -> Result<()> {
    let auth = Arc::new(
        AuthService::open(Arc::new(MemoryBackend::new()), "idle.test", Arc::new(SystemClock)).await?,
    );
    let identity = svc_net::auth::server_identity(&auth, "auth", &[])?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let shutdown = CancellationToken::new();
    tokio::spawn(svc_net::auth::serve_with_idle(
        listener,
        auth.clone(),
        identity,
        svc_net::listen::ListenOptions::default(),
        IDLE,
        shutdown.clone(),
    ));
    let ca: String = auth
        .trusted()
        .iter()
        .filter(|ca| ca.kind() == svc_core::identity::IdentityKind::Host)
        .map(|ca| pem_of(ca.tls_cert_der()))
        .collect();
    if ca.is_empty() {
        bail!("the cluster has no host CA");
    }

    // Idle after one call: closed (GOAWAY, then the connection ends).
    let tls = tls_to(addr, ca.as_bytes(), b"h2").await?;
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tls),
    )
    .await?;
    let conn = tokio::spawn(async move {
        let _ = conn.await;
    });
    // 16 = UNAUTHENTICATED: the call was served.
    assert_eq!(grpc_status(&mut send).await?, "16");
    assert_closed_after_idle(conn, Instant::now(), "gRPC").await?;

    // Calls at a third of the idle time keep the connection open.
    let tls = tls_to(addr, ca.as_bytes(), b"h2").await?;
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tls),
    )
    .await?;
    let conn = tokio::spawn(async move {
        let _ = conn.await;
    });
    let until = Instant::now() + IDLE * 3;
    let mut n = 0;
    while Instant::now() < until {
        let code = grpc_status(&mut send)
            .await
            .with_context(|| format!("gRPC call {n} on a busy connection failed"))?;
        assert_eq!(code, "16", "gRPC call {n}");
        n += 1;
        tokio::time::sleep(IDLE / 3).await;
    }
    assert!(!conn.is_finished(), "gRPC: a busy connection was closed");
    assert_closed_after_idle(conn, Instant::now(), "gRPC (after the busy period)").await?;

    // svc's own client reconnects on its next call after its connection was closed for idleness.
    let admin = svc_net::auth::KeyMaterial::generate()?;
    let req = svc_core::identity::HostCertRequest {
        host_uuid: uuid::Uuid::new_v4(),
        node_name: "proxy".into(),
        roles: vec![svc_core::identity::SystemRole::Proxy],
        additional_names: vec![],
        ttl: Duration::from_secs(3600),
    };
    let certs = auth.issue_host_certs(&req, &admin.tls_public_key(), admin.ssh_public_key())?;
    let client_identity = admin.into_identity(&certs, "idle.test")?;
    let mut client = tokio::time::timeout(
        Duration::from_secs(20),
        svc_net::auth::AuthClient::connect(&addr.to_string(), &client_identity),
    )
    .await
    .context("AuthClient::connect took over 20 s")??;
    let first = tokio::time::timeout(Duration::from_secs(20), client.status())
        .await
        .context("first Status call took over 20 s")??;
    assert_eq!(first.cluster_name, "idle.test");
    tokio::time::sleep(IDLE * 3).await;
    let second = tokio::time::timeout(Duration::from_secs(20), client.status())
        .await
        .context("Status after an idle close took over 20 s")?
        .context("Status after the idle timeout closed the connection")?;
    assert_eq!(second.cluster_name, "idle.test");
    shutdown.cancel();
    Ok(())
}
