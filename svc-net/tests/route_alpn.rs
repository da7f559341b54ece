//! TLS routing with real clients: `openssl s_client -alpn <name>` reaches the handler
//! registered for that name (each handler terminates TLS and echoes a marker); an unknown ALPN
//! is closed; SNI `kube-svc-proxy-alpn.*` goes to Kubernetes; PROXY headers count only from
//! trusted networks.

use std::{
    future::Future,
    path::Path,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use anyhow::{Context as _, Result};
use svc_net::{
    io::{Connection, conn_service},
    proxy::{ProxyBuilder, ProxySettings, RunningProxy},
    route::alpn,
    tls::{ServerIdentity, TlsSource},
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower::BoxError;

/// Terminates TLS with `config` and writes `route=<name> peer=<addr>`.
#[derive(Clone)]
struct Echo {
    name: &'static str,
    tls: tokio_rustls::TlsAcceptor,
}

impl tower::Service<Connection> for Echo {
    type Response = ();
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, conn: Connection) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let peer = conn.peer_addr;
            let (io, _, _, _) = conn.into_parts();
            let mut tls = this.tls.accept(io).await?;
            tls.write_all(format!("route={} peer={peer}\n", this.name).as_bytes())
                .await?;
            tls.shutdown().await?;
            Ok(())
        })
    }
}

async fn start(dir: &Path, trusted: &str) -> Result<RunningProxy> {
    let source = TlsSource::Generated {
        data_dir: dir.to_owned(),
    };
    let identity = ServerIdentity::load(&source, &[])?;
    let echo = |name: &'static str, proto: &str| -> Result<_> {
        Ok(conn_service(Echo {
            name,
            tls: tokio_rustls::TlsAcceptor::from(identity.server_config(&[proto])?),
        }))
    };
    let mut settings = ProxySettings::default();
    settings.ping.web_listen_addr = "127.0.0.1:0".parse()?;
    settings.tls = source;
    settings.trusted_proxy_networks = vec![trusted.parse()?];
    Ok(ProxyBuilder::new(settings)
        .route(alpn::REVERSE_TUNNEL, echo("tunnel", alpn::REVERSE_TUNNEL)?)
        .route(alpn::PROXY_SSH, echo("ssh", alpn::PROXY_SSH)?)
        .route(alpn::TCP, echo("tcp", alpn::TCP)?)
        .route_prefix(alpn::AUTH_PREFIX, echo("auth", "svc-auth@test.example.com")?)
        .kube(echo("kube", "http/1.1")?)
        .bind()
        .await?)
}

/// `openssl s_client` with the given ALPN list and SNI; returns what the server sent.
async fn s_client(proxy: &RunningProxy, alpn_list: Option<&str>, sni: &str) -> Result<String> {
    let mut cmd = tokio::process::Command::new(svc_testkit::require("openssl", "openssl"));
    cmd.args(["s_client", "-quiet", "-ign_eof", "-connect"])
        .arg(proxy.addrs().web.to_string())
        .args(["-servername", sni]);
    if let Some(list) = alpn_list {
        cmd.args(["-alpn", list]);
    }
    cmd.stdin(std::process::Stdio::null());
    let what = format!("openssl s_client (SNI {sni}, ALPN {alpn_list:?}) ending");
    let out = svc_testkit::wait::tokio_output_within(&mut cmd, std::time::Duration::from_secs(60), &what)
        .await
        .context("running openssl")?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openssl_s_client_reaches_the_route_of_its_alpn() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let proxy = start(dir.path(), "192.0.2.0/24").await?;
    let cases = [
        ("svc-reversetunnel", "route=tunnel"),
        ("svc-proxy-ssh", "route=ssh"),
        ("svc-tcp", "route=tcp"),
        ("svc-auth@test.example.com", "route=auth"),
        // The client's order decides: the first name with a route wins.
        ("unknown-proto,svc-proxy-ssh,svc-tcp", "route=ssh"),
    ];
    for (list, marker) in cases {
        let out = s_client(&proxy, Some(list), "proxy.example.com").await?;
        assert!(out.starts_with(marker), "alpn {list}: {out:?}");
        assert!(out.contains("peer=127.0.0.1:"), "{out}");
    }
    // SNI routes to Kubernetes whatever the ALPN.
    let out = s_client(&proxy, Some("http/1.1"), "kube-svc-proxy-alpn.proxy.example.com").await?;
    assert!(out.starts_with("route=kube"), "{out:?}");
    // No route: closed, no marker.
    let out = s_client(&proxy, Some("nothing-here"), "proxy.example.com").await?;
    assert!(!out.contains("route="), "{out:?}");
    proxy.shutdown().await;
    Ok(())
}

/// Sends a PROXY v1 header, then speaks TLS with ALPN `svc-tcp`; returns the marker line.
async fn through_proxy_header(proxy: &RunningProxy) -> Result<String> {
    let ca = std::fs::read(proxy.ca_file().context("ca")?)?;
    let mut config = (*svc_net::tls::client_config(Some(&ca))?).clone();
    config.alpn_protocols = vec![b"svc-tcp".to_vec()];
    let mut tcp = tokio::net::TcpStream::connect(proxy.addrs().web).await?;
    tcp.write_all(b"PROXY TCP4 198.51.100.7 127.0.0.1 40000 443\r\n")
        .await?;
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect("localhost".try_into()?, tcp)
        .await?;
    let mut out = String::new();
    tls.read_to_string(&mut out).await?;
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_protocol_only_from_trusted_networks() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let trusting = start(dir.path(), "127.0.0.0/8").await?;
    let out = through_proxy_header(&trusting).await?;
    assert_eq!(out, "route=tcp peer=198.51.100.7:40000\n");
    trusting.shutdown().await;

    let untrusting = start(dir.path(), "192.0.2.0/24").await?;
    assert!(
        through_proxy_header(&untrusting).await.is_err(),
        "a PROXY header from an untrusted address is refused"
    );
    untrusting.shutdown().await;
    Ok(())
}
