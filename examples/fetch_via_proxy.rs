//! Fetch a URL through the environment's HTTP CONNECT proxy, the way svc's updaters, `tsh login`
//! and the agent do: `ProxyDialer` picks direct or proxied from `HTTPS_PROXY`, `HTTP_PROXY` and
//! `NO_PROXY`, and svc's `HttpClient` — hyper-util's pooled `Client` over TLS over that dialer —
//! speaks HTTP(S) over it, with a connect deadline, a deadline for the whole request and a cap
//! on the body it reads.
//!
//! ```text
//! HTTPS_PROXY=http://user:pass@proxy.corp:3128 \
//!   cargo run -p svc-examples --example fetch_via_proxy -- https://example.com/
//! ```
//! `https://` servers are verified against the public web roots plus `SVC_CA` (a PEM bundle,
//! e.g. the cluster's generated `proxy-ca.pem`) when set. `SVC_PROXY_CA=/path/ca.pem` adds a CA
//! for an `https://` proxy. `RUST_LOG=svc_net=debug` shows the route each dial takes. The route
//! and the status go to stderr, the body to stdout.

use std::time::Duration;

use anyhow::Context as _;
use svc_net::{dial::ProxyDialer, http::HttpClient};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "https://example.com/".into());

    // The dialer: direct or through the proxy, per target, as the environment says.
    let mut builder = ProxyDialer::builder(svc_core::proxy_env::ProxyEnv::from_env()?);
    if let Ok(ca) = std::env::var("SVC_PROXY_CA") {
        builder = builder.extra_ca_pem(std::fs::read(&ca).with_context(|| format!("reading {ca}"))?);
    }
    let dialer = builder.build()?;

    let uri: hyper::Uri = url.parse().context("expected a URL")?;
    let target = svc_net::dial::target_from_uri(&uri)?;
    match dialer.route(&target) {
        svc_core::proxy_env::Route::Direct => eprintln!("{target}: direct"),
        svc_core::proxy_env::Route::Proxy(p) => eprintln!("{target}: via proxy {p}"),
    }

    // The client: TLS trusting the web roots (plus SVC_CA), over the dialer.
    let server_ca = match std::env::var("SVC_CA") {
        Ok(path) => Some(std::fs::read(&path).with_context(|| format!("reading {path}"))?),
        Err(_) => None,
    };
    let tls = svc_net::tls::client_config(server_ca.as_deref())?;
    let client = HttpClient::builder(tls)
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(30))
        .max_body(4 * 1024 * 1024)
        .build(dialer);

    let res = client.get(&url).await?;
    eprintln!("{}", res.status());
    println!("{}", String::from_utf8_lossy(res.body()));
    Ok(())
}
