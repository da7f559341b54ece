//! HttpConnect against a real tinyproxy: 200 with credentials, 407 without, 401 with wrong ones,
//! 403 for a port not allowed; a hyper-util client through it; an `https://` proxy (stunnel in
//! front of tinyproxy) verified with an extra CA.
#![allow(clippy::unwrap_used)]

mod support;

use std::{convert::Infallible, sync::Arc, time::Duration};

use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, body::Bytes, server::conn::http1, service::service_fn};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::{TokioExecutor, TokioIo},
};
use support::*;
use svc_core::{Addr, proxy_env::ProxyUrl};
use svc_net::dial::{Error, HttpConnect, ProxyConnector, TcpConnector, proxy_tls_config};
use tokio::{net::TcpListener, sync::Mutex};
use tower::ServiceExt;

fn url(port: u16, password: Option<&str>) -> ProxyUrl {
    ProxyUrl::parse("HTTPS_PROXY", &proxy_url("http", port, USER, password)).unwrap()
}

#[tokio::test]
async fn tunnels_with_credentials_and_reports_auth_and_port_refusals() {
    let echo = echo_server().await;
    let proxy = tinyproxy(&[echo.port()]).await;
    let target = Addr::from(echo);

    // 200: the tunnel carries bytes both ways.
    let connect = HttpConnect::new(TcpConnector::new(), &url(proxy.port, Some(PASSWORD_URL))).unwrap();
    let tunnel = connect.clone().oneshot(target.clone()).await.unwrap();
    let mut io = TokioIo::new(tunnel);
    assert_eq!(
        round_trip(&mut io, b"through tinyproxy").await,
        b"through tinyproxy"
    );
    drop(io);

    // 407: no credentials.
    let err = HttpConnect::new(TcpConnector::new(), &url(proxy.port, None))
        .unwrap()
        .oneshot(target.clone())
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::ProxyAuthRequired { status: 407, .. }),
        "{err:?}"
    );

    // 401: wrong credentials.
    let err = HttpConnect::new(TcpConnector::new(), &url(proxy.port, Some("wrong")))
        .unwrap()
        .oneshot(target.clone())
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::ProxyAuthRequired { status: 401, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("rejected the credentials"), "{err}");

    // 403: a port that is not a ConnectPort.
    let other = Addr::from(echo_server().await);
    let err = connect.oneshot(other).await.unwrap_err();
    match &err {
        Error::ProxyRefused { status, target, .. } => {
            assert_eq!(*status, 403);
            assert!(target.starts_with("127.0.0.1:"));
        }
        other => panic!("expected ProxyRefused, got {other:?}"),
    }
    assert!(err.to_string().contains("status 403"), "{err}");
    assert!(
        proxy.log("tinyproxy.log").contains("CONNECT"),
        "tinyproxy logged no CONNECT"
    );
}

/// A target HTTP server that records the request headers it saw.
async fn http_target() -> (std::net::SocketAddr, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let seen = seen2.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                    let seen = seen.clone();
                    async move {
                        let names: Vec<String> =
                            req.headers().keys().map(|k| k.as_str().to_owned()).collect();
                        seen.lock().await.extend(names);
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(
                            b"hello from target",
                        ))))
                    }
                });
                let _ = http1::Builder::new().serve_connection(TokioIo::new(s), svc).await;
            });
        }
    });
    (addr, seen)
}

#[tokio::test]
async fn hyper_util_client_uses_http_connect_unchanged() {
    let (target, seen) = http_target().await;
    let proxy = tinyproxy(&[target.port()]).await;
    // hyper-util's own HttpConnector as the inner connector: HttpConnect wraps any connector.
    let connect = HttpConnect::new(HttpConnector::new(), &url(proxy.port, Some(PASSWORD_URL))).unwrap();
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build(connect);
    let res = client
        .get(format!("http://{target}/hello").parse().unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"hello from target");
    // The credentials were for the proxy only.
    let seen = seen.lock().await.clone();
    assert!(seen.iter().any(|h| h == "host"), "{seen:?}");
    assert!(
        !seen.iter().any(|h| h.starts_with("proxy-")),
        "target saw {seen:?}"
    );
}

#[tokio::test]
async fn https_proxy_through_stunnel_verified_with_extra_ca() {
    let echo = echo_server().await;
    let plain = tinyproxy(&[echo.port()]).await;
    let (ca, cert, key) = test_pki();
    let tls_front = stunnel(plain.addr(), &cert, &key).await;
    let proxy = ProxyUrl::parse(
        "HTTPS_PROXY",
        &proxy_url("https", tls_front.port, USER, Some(PASSWORD_URL)),
    )
    .unwrap();

    let tls = proxy_tls_config(Some(ca.as_bytes())).unwrap();
    let connect = HttpConnect::new(ProxyConnector::new(TcpConnector::new(), tls), &proxy).unwrap();
    let tunnel = connect.oneshot(Addr::from(echo)).await.unwrap();
    let mut io = TokioIo::new(tunnel);
    assert_eq!(
        round_trip(&mut io, b"inside TLS to the proxy").await,
        b"inside TLS to the proxy"
    );
    drop(io);

    // Without the extra CA the proxy's certificate is not trusted.
    let untrusted = HttpConnect::new(
        ProxyConnector::new(TcpConnector::new(), proxy_tls_config(None).unwrap()),
        &proxy,
    )
    .unwrap()
    .with_timeout(Duration::from_secs(10));
    let err = untrusted.oneshot(Addr::from(echo)).await.unwrap_err();
    assert!(matches!(err, Error::ProxyTls { .. }), "{err:?}");
    assert!(
        err.to_string()
            .starts_with(&format!("TLS to proxy {}", tls_front.addr())),
        "{err}"
    );
    drop(tls_front);
}
