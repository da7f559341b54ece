//! Runs `examples/fetch_via_proxy.rs`: svc's `HttpClient` over the `ProxyDialer` fetches a page
//! from an in-process HTTP server and from an HTTPS server whose certificate comes from svc's
//! generated CA (trusted through `SVC_CA`), and a proxy setting the dialer refuses (a loopback
//! proxy host, with credentials) stops the example with the reason and without the password.

mod support;

use std::convert::Infallible;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};
use http_body_util::Full;
use hyper::{Response, body::Bytes, service::service_fn};
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
};
use svc_testkit::process::example_bin;

/// An HTTP server on loopback answering every request with `hello from the target`.
async fn target() -> Result<std::net::SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = service_fn(|req: hyper::Request<hyper::body::Incoming>| async move {
                    let body = format!("hello from the target at {}", req.uri().path());
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(body))))
                });
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    Ok(addr)
}

/// Runs the example with `env` (and no inherited proxy variables), within 30 s.
async fn run(url: &str, env: &[(&str, &str)]) -> Result<std::process::Output> {
    let mut cmd = Command::new(example_bin("fetch_via_proxy"));
    cmd.arg(url).stdout(Stdio::piped()).stderr(Stdio::piped());
    for var in [
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "NO_PROXY",
        "no_proxy",
        "RUST_LOG",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = tokio::process::Command::from(cmd).kill_on_drop(true).spawn()?;
    tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .context("fetch_via_proxy did not finish within 30 s")?
        .context("waiting for fetch_via_proxy")
}

#[tokio::test]
async fn the_dialer_as_a_hyper_util_connector_fetches_the_page() -> Result<()> {
    let addr = target().await?;
    let out = run(&format!("http://{addr}/hello"), &[]).await?;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "fetch_via_proxy failed: {stderr}");
    assert_eq!(stdout.trim_end(), "hello from the target at /hello");
    // Loopback targets are never proxied, and the example says which route it took.
    assert!(stderr.contains(&format!("{addr}: direct")), "{stderr}");
    assert!(stderr.contains("200 OK"), "{stderr}");
    Ok(())
}

/// An HTTPS server on loopback with a certificate from svc's generated CA; returns its address
/// and the CA's PEM file.
async fn tls_target(dir: &std::path::Path) -> Result<(std::net::SocketAddr, std::path::PathBuf)> {
    let identity = svc_net::tls::ServerIdentity::load(
        &svc_net::tls::TlsSource::Generated {
            data_dir: dir.to_owned(),
        },
        &[],
    )?;
    let ca = identity
        .ca_file
        .clone()
        .context("a generated identity has a CA file")?;
    let acceptor = tokio_rustls::TlsAcceptor::from(identity.server_config(&["http/1.1"])?);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = service_fn(|req: hyper::Request<hyper::body::Incoming>| async move {
                    let body = format!("hello over TLS at {}", req.uri().path());
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(body))))
                });
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    Ok((addr, ca))
}

#[tokio::test]
async fn https_is_verified_against_the_cluster_ca() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (addr, ca) = tls_target(dir.path()).await?;
    let url = format!("https://{addr}/hello");
    let ca = ca.display().to_string();
    let out = run(&url, &[("SVC_CA", ca.as_str())]).await?;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "fetch_via_proxy failed: {stderr}");
    assert_eq!(stdout.trim_end(), "hello over TLS at /hello");
    assert!(stderr.contains("200 OK"), "{stderr}");

    // Without the cluster CA the server's certificate is refused, naming the URL.
    let out = run(&url, &[]).await?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "an unknown CA must be refused");
    assert!(
        stderr.contains(&format!("GET {url}: TLS: invalid peer certificate")),
        "{stderr}"
    );
    Ok(())
}

#[tokio::test]
async fn a_loopback_proxy_is_refused_with_the_reason_and_without_the_password() -> Result<()> {
    let addr = target().await?;
    let out = run(
        &format!("http://{addr}/hello"),
        &[("HTTP_PROXY", "http://alice:s3cret-proxy-pass@127.0.0.1:3128")],
    )
    .await?;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        !out.status.success(),
        "a loopback proxy must be refused; got {stdout}"
    );
    assert!(
        stderr.contains(
            "HTTP_PROXY: proxy host 127.0.0.1 is not allowed, use the proxy's DNS name or private IP address instead of localhost or 127.0.0.1"
        ),
        "{stderr}"
    );
    assert!(
        !stderr.contains("s3cret-proxy-pass"),
        "the proxy password leaked: {stderr}"
    );
    assert!(stdout.is_empty(), "nothing may be fetched: {stdout}");
    Ok(())
}
