//! `svc_net::http::HttpClient` end to end: HTTPS to a server with svc's generated cluster CA
//! through a real HTTP CONNECT proxy (squid, which resolves `sink.test` from its own hosts
//! file), `NO_PROXY` bypassing the proxy, and the typed errors: a proxy refusal naming the URL
//! without credentials, an untrusted certificate, the connect and whole-request deadlines, the
//! body cap.
#![allow(clippy::unwrap_used)]

mod support;

use std::{
    collections::HashMap,
    convert::Infallible,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use support::*;
use svc_core::{
    Addr,
    proxy_env::{ProxyEnv, Route},
};
use svc_net::{
    dial::{ProxyDialer, TcpConnector},
    http::{HttpClient, HttpErrorKind},
    tls::{ServerIdentity, TlsSource},
};
use tokio::net::TcpListener;

/// The target's name: squid resolves it from its hosts file, the client from its override.
const NAME: &str = "sink.test";

/// An HTTPS server presenting a certificate from svc's generated CA (naming [`NAME`]): `/big`
/// answers 10 KiB, anything else `hello over TLS at <path>`. Returns its address, the CA's PEM
/// and the number of TLS connections it accepted.
async fn https_target(dir: &std::path::Path) -> (SocketAddr, Vec<u8>, Arc<AtomicUsize>) {
    let identity = ServerIdentity::load(
        &TlsSource::Generated {
            data_dir: dir.to_owned(),
        },
        &[NAME.to_owned()],
    )
    .unwrap();
    let ca = std::fs::read(identity.ca_file.as_ref().unwrap()).unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(identity.server_config(&["http/1.1"]).unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, count) = (acceptor.clone(), count.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                count.fetch_add(1, Ordering::SeqCst);
                let svc = service_fn(|req: Request<hyper::body::Incoming>| async move {
                    let body = if req.uri().path() == "/big" {
                        Bytes::from(vec![b'x'; 10 * 1024])
                    } else {
                        Bytes::from(format!("hello over TLS at {}", req.uri().path()))
                    };
                    Ok::<_, Infallible>(Response::new(Full::new(body)))
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    (addr, ca, accepted)
}

/// A dialer configured from `vars` (as if from the environment), resolving [`NAME`] to
/// loopback for direct dials.
fn dialer(vars: &[(&str, String)]) -> ProxyDialer {
    let map: HashMap<String, String> = vars.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect();
    let env = ProxyEnv::from_lookup(|name| map.get(name).cloned()).unwrap();
    ProxyDialer::builder(env)
        .tcp(TcpConnector::new().resolve_override(NAME, IpAddr::V4(Ipv4Addr::LOCALHOST)))
        .build()
        .unwrap()
}

#[tokio::test]
async fn https_through_a_connect_proxy_with_the_cluster_ca_and_no_proxy_bypasses_it() {
    let dir = tempfile::tempdir().unwrap();
    let (target, ca, accepted) = https_target(dir.path()).await;
    let squid = squid(&[target.port()], &[NAME]).await;
    let tls = svc_net::tls::client_config(Some(&ca)).unwrap();
    let url = format!("https://{NAME}:{}/hello", target.port());
    let target_addr = Addr::parse(&format!("{NAME}:{}", target.port())).unwrap();
    let proxy = |password| ("HTTPS_PROXY", proxy_url("http", squid.port, USER, password));

    // Through squid: the CONNECT tunnel carries TLS verified against the cluster CA.
    let through = dialer(&[proxy(Some(PASSWORD_URL))]);
    assert!(matches!(through.route(&target_addr), Route::Proxy(_)));
    let client = HttpClient::builder(tls.clone())
        .pool_max_idle_per_host(0)
        .build(through);
    let res = within(STEP, "the answer through squid", client.get(&url))
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(&res.body()[..], b"hello over TLS at /hello");
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
    // squid logs a tunnel when it closes; the client keeps no idle connection.
    within(STEP, "squid logging the CONNECT to the target", async {
        while !squid
            .log("access.log")
            .contains(&format!("CONNECT {NAME}:{}", target.port()))
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;

    // Wrong proxy credentials: the typed error names the URL and the proxy's refusal, never
    // the password.
    let refused = HttpClient::builder(tls.clone()).build(dialer(&[proxy(Some("wr0ng-pass"))]));
    let err = within(STEP, "the proxy's refusal", refused.get(&url))
        .await
        .unwrap_err();
    assert!(matches!(err.kind(), HttpErrorKind::Connect(_)), "{err:?}");
    let text = err.to_string();
    assert!(text.starts_with(&format!("GET {url}: connecting: ")), "{text}");
    assert!(text.contains("rejected the credentials"), "{text}");
    assert!(!text.contains("wr0ng-pass") && !format!("{err:?}").contains("wr0ng-pass"));

    // NO_PROXY names the target: the same refusing proxy is bypassed, the server is reached
    // directly (a proxied attempt would have failed as above).
    let bypass = dialer(&[proxy(Some("wr0ng-pass")), ("NO_PROXY", NAME.to_owned())]);
    assert_eq!(bypass.route(&target_addr), Route::Direct);
    let client = HttpClient::builder(tls).build(bypass);
    let res = within(STEP, "the direct answer", client.get(&url)).await.unwrap();
    assert_eq!(&res.body()[..], b"hello over TLS at /hello");
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn deadlines_and_the_body_cap_are_typed_errors_naming_the_url() {
    let dir = tempfile::tempdir().unwrap();
    let (target, ca, _) = https_target(dir.path()).await;
    let tls = svc_net::tls::client_config(Some(&ca)).unwrap();
    let direct = || dialer(&[]);

    // The body cap.
    let client = HttpClient::builder(tls.clone()).max_body(4096).build(direct());
    let big = format!("https://{NAME}:{}/big", target.port());
    let err = within(STEP, "the capped answer", client.get(&big))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), &HttpErrorKind::BodyTooLarge(4096));
    assert_eq!(err.url(), big);

    // Without the cluster CA the server's certificate is refused: a TLS error.
    let client = HttpClient::builder(svc_net::tls::client_config(None).unwrap()).build(direct());
    let err = within(STEP, "the refused handshake", client.get(&big))
        .await
        .unwrap_err();
    assert!(matches!(err.kind(), HttpErrorKind::Tls(_)), "{err:?}");
    assert!(
        err.to_string()
            .starts_with(&format!("GET {big}: TLS: invalid peer certificate")),
        "{err}"
    );

    // A server that accepts and never answers: the whole-request deadline.
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((tcp, _)) = silent.accept().await {
            conns.push(tcp);
        }
    });
    let client = HttpClient::builder(tls.clone())
        .timeout(Duration::from_millis(300))
        .build(direct());
    let url = format!("http://{silent_addr}/version");
    let err = within(STEP, "the request deadline", client.get(&url))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), &HttpErrorKind::Timeout(Duration::from_millis(300)));
    assert_eq!(err.to_string(), format!("GET {url}: no answer within 300ms"));
    held.abort();

    // A connector that never connects: the connect deadline.
    let never = tower::service_fn(|_: http::Uri| {
        std::future::pending::<Result<TokioIo<tokio::net::TcpStream>, std::io::Error>>()
    });
    let client = HttpClient::builder(tls.clone())
        .connect_timeout(Duration::from_millis(200))
        .build(never);
    let err = within(STEP, "the connect deadline", client.get("https://svc.invalid/"))
        .await
        .unwrap_err();
    assert_eq!(
        err.kind(),
        &HttpErrorKind::ConnectTimeout(Duration::from_millis(200))
    );
    assert!(err.is_timeout());

    // Credentials in the URL never reach the error.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let client = HttpClient::builder(tls).build(direct());
    let err = within(
        STEP,
        "the refused connection",
        client.get(&format!("http://bob:s3cret@127.0.0.1:{port}/x")),
    )
    .await
    .unwrap_err();
    assert!(matches!(err.kind(), HttpErrorKind::Connect(_)), "{err:?}");
    assert_eq!(err.url(), format!("http://127.0.0.1:{port}/x"));
    assert!(!format!("{err} {err:?}").contains("s3cret"));

    // Not an http(s) URL.
    let err = HttpClient::builder(svc_net::tls::client_config(None).unwrap())
        .build(direct())
        .get("ftp://example.com/file")
        .await
        .unwrap_err();
    assert_eq!(err.kind(), &HttpErrorKind::Url);
}
