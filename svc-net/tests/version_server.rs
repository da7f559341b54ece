//! The version server in a real proxy, asked by curl (HTTP/1.1 and `--http2`, `--cacert` with
//! the generated CA): every channel kind, forwarding to a second real proxy and to a real HTTP
//! server that goes down mid-test, and the one-minute cache under a burst of 1,000 requests
//! (upstream hits counted; the minute passes on an injected clock).

use std::{
    collections::{BTreeMap, HashMap},
    convert::Infallible,
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http_body_util::Full;
use svc_core::{Clock, ManualClock};
use svc_core::{Version, channel::ChannelSpec};
use svc_net::proxy::web::version::{Fetcher, VersionResolver, http::VersionHandler};
use svc_net::{
    proxy::{ProxyBuilder, ProxySettings, RunningProxy},
    tls::TlsSource,
};
use tokio::net::TcpListener;

/// A real HTTP/1.1 upstream version server that counts requests per path.
struct Upstream {
    addr: std::net::SocketAddr,
    hits: Arc<Mutex<HashMap<String, u64>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Upstream {
    async fn start(version: &'static str, critical: &'static str) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let hits: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
        let counter = hits.clone();
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let counter = counter.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let path = req.uri().path().to_owned();
                        *counter.lock().unwrap().entry(path.clone()).or_default() += 1;
                        let body = if path.ends_with("/version") {
                            version
                        } else {
                            critical
                        };
                        async move { Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from(body)))) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        Ok(Self { addr, hits, task })
    }

    fn url(&self) -> String {
        format!("http://{}/channel/x", self.addr)
    }

    fn hits(&self, suffix: &str) -> u64 {
        let hits = self.hits.lock().unwrap();
        hits.iter()
            .filter(|(p, _)| p.ends_with(suffix))
            .map(|(_, n)| n)
            .sum()
    }
}

fn fixed(v: Option<&str>, critical: bool) -> ChannelSpec {
    ChannelSpec::Static {
        version: v.map(|v| Version::parse(v).unwrap()),
        critical,
    }
}

async fn start_proxy(
    dir: &Path,
    channels: BTreeMap<String, ChannelSpec>,
    own: Version,
    upstream_ca: Option<&Path>,
    clock: Arc<dyn Clock>,
) -> Result<(RunningProxy, VersionResolver)> {
    let mut settings = ProxySettings::default();
    settings.ping.web_listen_addr = "127.0.0.1:0".parse()?;
    settings.tls = TlsSource::Generated {
        data_dir: dir.to_owned(),
    };
    settings.channels = channels;
    let ca = upstream_ca.map(std::fs::read).transpose()?;
    let tls = svc_net::tls::client_config(ca.as_deref())?;
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    let resolver = VersionResolver::new(
        settings.channels.clone(),
        own.clone(),
        Fetcher::new(http, tls, clock),
    );
    let builder = ProxyBuilder::new(settings).with_version(own);
    let proxy = builder
        .version_server(VersionHandler::new(resolver.clone()))
        .bind()
        .await?;
    Ok((proxy, resolver))
}

/// `curl` a path; returns status and exact body.
async fn curl(proxy: &RunningProxy, extra: &[&str], path: &str) -> Result<(u16, String)> {
    let port = proxy.addrs().web.port();
    let out = tokio::process::Command::new(svc_testkit::require("curl", "curl"))
        .args(["-sS", "--max-time", "30", "--cacert"])
        .arg(proxy.ca_file().context("ca")?)
        .args(["--resolve", &format!("localhost:{port}:127.0.0.1")])
        .args(extra)
        .args(["-w", "\n%{http_code}"])
        .arg(format!("https://localhost:{port}{path}"))
        .output()
        .await
        .context("running curl: install the Debian package `curl`")?;
    if !out.status.success() {
        bail!("curl: {}", String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8(out.stdout)?;
    let (body, code) = text.rsplit_once('\n').context("curl output")?;
    Ok((code.parse()?, body.to_owned()))
}

fn v1(channel: &str, what: &str) -> String {
    format!("/v1/webapi/automaticupgrades/channel/{channel}/{what}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_channel_kind_over_curl() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let channels: BTreeMap<String, ChannelSpec> = [
        ("beta", fixed(Some("v17.1.0"), true)),
        ("nothing", fixed(None, false)),
        ("ahead", fixed(Some("v18.0.1"), true)),
        ("team/canary", fixed(Some("17.2.3-rc.1"), false)),
    ]
    .into_iter()
    .map(|(n, s)| (n.to_owned(), s))
    .collect();
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(std::time::SystemTime::now()));
    let (proxy, _) = start_proxy(dir.path(), channels, Version::new(17, 2, 1), None, clock).await?;

    for extra in [&[][..], &["--http2"][..]] {
        let cases = [
            (v1("default", "version"), 200, "v17.2.1"),
            (v1("default", "critical"), 200, "no"),
            (v1("stable/cloud", "version"), 200, "v17.2.1"),
            (
                "/webapi/automaticupgrades/channel/default/version".to_owned(),
                200,
                "v17.2.1",
            ),
            (v1("beta", "version"), 200, "v17.1.0"),
            (v1("beta", "critical"), 200, "yes"),
            (v1("nothing", "version"), 200, "none"),
            (v1("ahead", "version"), 200, "v17.2.1"),
            (v1("ahead", "critical"), 200, "yes"),
            (v1("team/canary", "version"), 200, "v17.2.3-rc.1"),
        ];
        for (path, status, body) in cases {
            assert_eq!(
                curl(&proxy, extra, &path).await?,
                (status, body.to_owned()),
                "{path} {extra:?}"
            );
        }
        let (code, body) = curl(&proxy, extra, &v1("nope", "version")).await?;
        assert_eq!(code, 404);
        assert!(body.contains("\\\"nope\\\"") || body.contains("nope"), "{body}");
        let json: serde_json::Value = serde_json::from_str(&body)?;
        assert!(json["error"]["message"].as_str().unwrap().contains("nope"));
        for bad in [
            v1("default", "latest"),
            "/v1/webapi/automaticupgrades/channel/version".into(),
        ] {
            let (code, body) = curl(&proxy, extra, &bad).await?;
            assert_eq!(code, 400, "{bad}");
            assert!(body.contains("<channel>/version"), "{body}");
        }
        let (code, _) = curl(
            &proxy,
            &[extra, &["-X", "POST"][..]].concat(),
            &v1("default", "version"),
        )
        .await?;
        assert_eq!(code, 405);
    }
    proxy.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_stable_cloud_becomes_default() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let channels = BTreeMap::from([("stable/cloud".to_owned(), fixed(Some("v17.0.9"), false))]);
    let (proxy, _) = start_proxy(
        dir.path(),
        channels,
        Version::new(17, 2, 1),
        None,
        Arc::new(ManualClock::new(std::time::SystemTime::now())),
    )
    .await?;
    assert_eq!(
        curl(&proxy, &[], &v1("default", "version")).await?,
        (200, "v17.0.9".into())
    );
    assert_eq!(
        curl(&proxy, &[], &v1("stable/cloud", "version")).await?,
        (200, "v17.0.9".into())
    );
    proxy.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_to_a_second_proxy() -> Result<()> {
    let (dir1, dir2) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let upstream_channels = BTreeMap::from([("default".to_owned(), fixed(Some("v17.0.3"), true))]);
    let (upstream, _) = start_proxy(
        dir2.path(),
        upstream_channels,
        Version::new(17, 0, 3),
        None,
        Arc::new(ManualClock::new(std::time::SystemTime::now())),
    )
    .await?;
    let url = format!(
        "https://localhost:{}/v1/webapi/automaticupgrades/channel/default",
        upstream.addrs().web.port()
    );
    let channels = BTreeMap::from([("mirror".to_owned(), ChannelSpec::Forward { url })]);
    let ca = upstream.ca_file().context("ca")?.clone();
    let (proxy, _) = start_proxy(
        dir1.path(),
        channels,
        Version::new(17, 2, 1),
        Some(&ca),
        Arc::new(ManualClock::new(std::time::SystemTime::now())),
    )
    .await?;
    assert_eq!(
        curl(&proxy, &[], &v1("mirror", "version")).await?,
        (200, "v17.0.3".into())
    );
    assert_eq!(
        curl(&proxy, &["--http2"], &v1("mirror", "critical")).await?,
        (200, "yes".into())
    );
    proxy.shutdown().await;
    upstream.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_going_down_is_an_error_never_a_made_up_version() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let up = Upstream::start("17.1.5\n", "True").await?;
    let channels = BTreeMap::from([("fwd".to_owned(), ChannelSpec::Forward { url: up.url() })]);
    let clock = Arc::new(ManualClock::new(std::time::SystemTime::now()));
    let (proxy, _) = start_proxy(dir.path(), channels, Version::new(17, 2, 1), None, clock.clone()).await?;
    assert_eq!(
        curl(&proxy, &[], &v1("fwd", "version")).await?,
        (200, "v17.1.5".into())
    );
    assert_eq!(
        curl(&proxy, &[], &v1("fwd", "critical")).await?,
        (200, "yes".into())
    );

    up.task.abort();
    let _ = up.task.await;
    // Within the minute the cached answer still serves.
    assert_eq!(
        curl(&proxy, &[], &v1("fwd", "version")).await?,
        (200, "v17.1.5".into())
    );
    clock.advance(Duration::from_secs(61));
    let (code, body) = curl(&proxy, &[], &v1("fwd", "version")).await?;
    assert_eq!(code, 502, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body)?;
    assert!(
        json["error"]["message"].as_str().unwrap().contains("fwd"),
        "{body}"
    );
    assert!(!body.contains("17.1.5"));
    // Critical unknown counts as not critical.
    assert_eq!(
        curl(&proxy, &[], &v1("fwd", "critical")).await?,
        (200, "no".into())
    );
    proxy.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_1000_requests_hits_the_upstream_once_per_minute() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let up = Upstream::start("v17.1.5", "no").await?;
    let channels = BTreeMap::from([("fwd".to_owned(), ChannelSpec::Forward { url: up.url() })]);
    let clock = Arc::new(ManualClock::new(std::time::SystemTime::now()));
    let (proxy, resolver) =
        start_proxy(dir.path(), channels, Version::new(17, 2, 1), None, clock.clone()).await?;

    for round in 1..=2u64 {
        let burst = (0..1000).map(|_| {
            let r = resolver.clone();
            tokio::spawn(async move { r.version("fwd").await })
        });
        for answer in futures_util::future::join_all(burst).await {
            assert_eq!(answer?, Ok(Some(Version::new(17, 1, 5))));
        }
        // Also through HTTPS, as agents ask.
        assert_eq!(
            curl(&proxy, &[], &v1("fwd", "version")).await?,
            (200, "v17.1.5".into())
        );
        assert_eq!(up.hits("/version"), round, "one upstream request per minute");
        clock.advance(Duration::from_secs(61));
    }
    proxy.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_upstream_gets_the_5s_request_timeout() -> Result<()> {
    let dir = tempfile::tempdir()?;
    // Accepts connections and never answers.
    let silent = TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/channel/x", silent.local_addr()?);
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((tcp, _)) = silent.accept().await {
            conns.push(tcp);
        }
    });
    let channels = BTreeMap::from([("slow".to_owned(), ChannelSpec::Forward { url })]);
    let (proxy, _) = start_proxy(
        dir.path(),
        channels,
        Version::new(17, 2, 1),
        None,
        Arc::new(ManualClock::new(std::time::SystemTime::now())),
    )
    .await?;
    let (code, body) = curl(&proxy, &[], &v1("slow", "version")).await?;
    assert_eq!(code, 504, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body)?;
    assert!(
        json["error"]["message"].as_str().unwrap().contains("slow"),
        "{body}"
    );
    held.abort();
    proxy.shutdown().await;
    Ok(())
}
