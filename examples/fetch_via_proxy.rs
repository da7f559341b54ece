//! Fetch a URL through the environment's HTTP CONNECT proxy, the way svc's updaters and the
//! proxy's outbound fetches do: `ProxyDialer` picks direct or proxied from `HTTPS_PROXY`,
//! `HTTP_PROXY` and `NO_PROXY`.
//!
//! For `http://` URLs the dialer *is* the hyper-util connector: it is a
//! `tower::Service<Uri>` returning a stream hyper-util's legacy `Client` pools, so
//! `Client::builder(..).build(dialer)` is the whole integration. For `https://` URLs the
//! example dials with the same dialer and runs TLS (rustls, public web roots) over the stream
//! before speaking HTTP.
//!
//! ```text
//! HTTPS_PROXY=http://user:pass@proxy.corp:3128 \
//!   cargo run -p svc-examples --example fetch_via_proxy -- https://example.com/
//! ```
//! `SVC_PROXY_CA=/path/ca.pem` adds a CA for an `https://` proxy. `RUST_LOG=svc_net=debug` shows
//! the route each dial takes. The route goes to stderr, the body to stdout.

use std::sync::Arc;

use anyhow::Context as _;
use http_body_util::{BodyExt, Empty};
use hyper::{Request, body::Bytes};
use hyper_util::{
    client::legacy::Client,
    rt::{TokioExecutor, TokioIo},
};
use rustls::{ClientConfig, RootCertStore, pki_types::ServerName};
use svc_net::dial::{ProxyDialer, target_from_uri};
use tokio::io::{AsyncRead, AsyncWrite};

/// The stream hyper runs over: the dialed stream, or TLS over it.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let url: hyper::Uri = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "https://example.com/".into())
        .parse()
        .context("expected a URL")?;

    let mut builder = ProxyDialer::builder(svc_core::proxy_env::ProxyEnv::from_env()?);
    if let Ok(ca) = std::env::var("SVC_PROXY_CA") {
        builder = builder.extra_ca_pem(std::fs::read(&ca).with_context(|| format!("reading {ca}"))?);
    }
    let dialer = builder.build()?;

    let target = target_from_uri(&url)?;
    match dialer.route(&target) {
        svc_core::proxy_env::Route::Direct => eprintln!("{target}: direct"),
        svc_core::proxy_env::Route::Proxy(p) => eprintln!("{target}: via proxy {p}"),
    }

    if url.scheme_str() == Some("http") {
        // The dialer as a hyper-util connector.
        let client = Client::builder(TokioExecutor::new()).build::<_, Empty<Bytes>>(dialer);
        let req = Request::get(url)
            .header(hyper::header::USER_AGENT, "svc-fetch-via-proxy")
            .body(Empty::new())?;
        let res = client.request(req).await?;
        eprintln!("{}", res.status());
        let body = res.into_body().collect().await?.to_bytes();
        println!("{}", String::from_utf8_lossy(&body));
        return Ok(());
    }

    let stream = dialer.dial(&target).await?;
    let io: Box<dyn Io> = if url.scheme_str() == Some("https") {
        let roots = RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        let config = ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = ServerName::try_from(target.host_str())?;
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, stream)
            .await
            .context("TLS to the target")?;
        Box::new(tls)
    } else {
        Box::new(stream)
    };

    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    tokio::spawn(conn);
    let authority = url.authority().context("URL without a host")?.as_str().to_owned();
    let path = url.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let req = Request::get(path)
        .header(hyper::header::HOST, authority)
        .header(hyper::header::USER_AGENT, "svc-fetch-via-proxy")
        .body(Empty::<Bytes>::new())?;
    let res = sender.send_request(req).await?;
    eprintln!("{}", res.status());
    let body = res.into_body().collect().await?.to_bytes();
    println!("{}", String::from_utf8_lossy(&body));
    Ok(())
}
