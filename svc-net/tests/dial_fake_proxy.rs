//! What real proxies will not do on demand, with a hand-written proxy: `200` and the first tunnel
//! bytes in one write (they must reach the caller), an endless reply head (size cap), a reply
//! that never comes (timeout). And NO_PROXY bypass proven against a proxy that records every
//! connection it gets.
#![allow(clippy::unwrap_used)]

mod support;

use std::{collections::HashMap, net::SocketAddr, time::Duration};

use support::*;
use svc_core::{
    Addr,
    proxy_env::{ProxyEnv, ProxyUrl},
};
use svc_net::dial::{Error, HttpConnect, MAX_REPLY_HEAD, ProxyDialer, TcpConnector};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::mpsc,
};
use tower::ServiceExt;

#[derive(Clone, Copy)]
enum Behaviour {
    /// `200` and `SSH-2.0-fake\r\n` in one write, then echo.
    OkWithEarlyBytes,
    /// A status line, then header lines forever.
    EndlessHead,
    /// Read the request, answer nothing.
    Silent,
}

/// Starts the fake proxy; every CONNECT request it reads is sent on the channel.
async fn fake_proxy(behaviour: Behaviour) -> (SocketAddr, mpsc::UnboundedReceiver<String>) {
    let listener = TcpListener::bind((PROXY_IP, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move { serve(s, behaviour, tx).await });
        }
    });
    (addr, rx)
}

async fn serve(mut s: TcpStream, behaviour: Behaviour, tx: mpsc::UnboundedSender<String>) {
    let mut req = Vec::new();
    let mut byte = [0u8; 1];
    while !req.ends_with(b"\r\n\r\n") {
        if s.read_exact(&mut byte).await.is_err() {
            let _ = tx.send(String::from_utf8_lossy(&req).into_owned());
            return;
        }
        req.push(byte[0]);
    }
    let _ = tx.send(String::from_utf8_lossy(&req).into_owned());
    match behaviour {
        Behaviour::OkWithEarlyBytes => {
            if s.write_all(b"HTTP/1.1 200 Connection established\r\nVia: fake\r\n\r\nSSH-2.0-fake\r\n")
                .await
                .is_err()
            {
                return;
            }
            let (mut r, mut w) = s.split();
            let _ = tokio::io::copy(&mut r, &mut w).await;
        }
        Behaviour::EndlessHead => {
            if s.write_all(b"HTTP/1.1 200 OK\r\n").await.is_err() {
                return;
            }
            let line = format!("X-Pad: {}\r\n", "a".repeat(1000));
            while s.write_all(line.as_bytes()).await.is_ok() {}
        }
        Behaviour::Silent => {
            let mut sink = Vec::new();
            let _ = s.read_to_end(&mut sink).await;
        }
    }
}

fn proxy(addr: SocketAddr, with_credentials: bool) -> ProxyUrl {
    let password = with_credentials.then_some(PASSWORD_URL);
    ProxyUrl::parse("HTTPS_PROXY", &proxy_url("http", addr.port(), USER, password)).unwrap()
}

#[tokio::test]
async fn bytes_sent_with_the_200_are_not_lost() {
    let (addr, mut requests) = fake_proxy(Behaviour::OkWithEarlyBytes).await;
    let env = ProxyEnv::new(Some(proxy(addr, true)), None, Default::default());
    let dialer = ProxyDialer::builder(env).build().unwrap();
    let target = Addr::parse("agent-proxy.example.com:3024").unwrap();
    let mut stream = dialer.dial(&target).await.unwrap();
    assert!(stream.is_proxied());

    let mut banner = [0u8; 14];
    within(
        STEP,
        "the banner sent with the 200",
        stream.read_exact(&mut banner),
    )
    .await
    .unwrap();
    assert_eq!(&banner, b"SSH-2.0-fake\r\n");
    assert_eq!(
        round_trip(&mut stream, b"after the banner").await,
        b"after the banner"
    );

    // The exact request on the wire: credentials only here, in Proxy-Authorization.
    let req = within(
        STEP,
        "the fake proxy reporting the CONNECT request",
        requests.recv(),
    )
    .await
    .unwrap();
    let token = base64_basic(USER, PASSWORD);
    assert_eq!(
        req,
        format!(
            "CONNECT agent-proxy.example.com:3024 HTTP/1.1\r\nHost: agent-proxy.example.com:3024\r\n\
             Proxy-Authorization: Basic {token}\r\n\r\n"
        )
    );
}

fn base64_basic(user: &str, password: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
}

#[tokio::test]
async fn endless_reply_head_hits_the_size_cap() {
    let (addr, _requests) = fake_proxy(Behaviour::EndlessHead).await;
    let connect = HttpConnect::new(TcpConnector::new(), &proxy(addr, false)).unwrap();
    let err = connect
        .oneshot(Addr::parse("a.example:443").unwrap())
        .await
        .unwrap_err();
    match &err {
        Error::ReplyTooLarge { limit, .. } => assert_eq!(*limit, MAX_REPLY_HEAD),
        other => panic!("expected ReplyTooLarge, got {other:?}"),
    }
    assert!(err.to_string().contains("longer than 16384 bytes"), "{err}");
    assert_eq!(std::io::Error::from(err).kind(), std::io::ErrorKind::InvalidData);
}

#[tokio::test]
async fn a_reply_that_never_comes_times_out() {
    let (addr, _requests) = fake_proxy(Behaviour::Silent).await;
    let connect = HttpConnect::new(TcpConnector::new(), &proxy(addr, false))
        .unwrap()
        .with_timeout(Duration::from_millis(300));
    let err = connect
        .oneshot(Addr::parse("a.example:443").unwrap())
        .await
        .unwrap_err();
    match &err {
        Error::Timeout { during, after } => {
            assert_eq!(*after, Duration::from_millis(300));
            assert!(
                during.starts_with(&format!(
                    "waiting for proxy {addr} to answer CONNECT a.example:443"
                )),
                "{during}"
            );
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    assert_eq!(std::io::Error::from(err).kind(), std::io::ErrorKind::TimedOut);
}

#[tokio::test]
async fn no_proxy_and_loopback_targets_never_touch_the_proxy() {
    // The "proxy" only records who connects and never answers.
    let (dead, mut seen) = fake_proxy(Behaviour::Silent).await;
    let echo = echo_server().await;
    let vars: HashMap<&str, String> = HashMap::from([
        ("HTTPS_PROXY", format!("http://{dead}")),
        (
            "NO_PROXY",
            "10.0.0.0/8, .corp.example, kube.svc.cluster.local".to_owned(),
        ),
    ]);
    let env = ProxyEnv::from_lookup(|n| vars.get(n).cloned()).unwrap();
    // Names resolved without DNS, all to the loopback echo server.
    let tcp = TcpConnector::new()
        .resolve_override("kube.svc.cluster.local", echo.ip())
        .resolve_override("x.kube.svc.cluster.local", echo.ip())
        .resolve_override("db.corp.example", echo.ip())
        .resolve_override("proxied.example", echo.ip());
    let dialer = ProxyDialer::builder(env)
        .tcp(tcp)
        .handshake_timeout(Duration::from_millis(300))
        .build()
        .unwrap();

    for target in [
        format!("kube.svc.cluster.local:{}", echo.port()),
        format!("x.kube.svc.cluster.local:{}", echo.port()),
        format!("db.corp.example:{}", echo.port()),
        format!("127.0.0.1:{}", echo.port()),
        format!("localhost:{}", echo.port()),
    ] {
        let dialer_target = Addr::parse(&target).unwrap();
        let direct = dialer.dial(&dialer_target).await;
        let direct = match direct {
            Ok(s) => s,
            // `localhost` may resolve to ::1 first on some hosts; the echo server is IPv4 only.
            Err(e) if target.starts_with("localhost") => {
                assert!(matches!(e, Error::Io { .. }), "{e:?}");
                continue;
            }
            Err(e) => panic!("{target}: {e}"),
        };
        let mut direct = direct;
        assert!(!direct.is_proxied(), "{target}");
        assert_eq!(
            round_trip(&mut direct, target.as_bytes()).await,
            target.as_bytes()
        );
    }

    // A target outside NO_PROXY does go to the proxy, so the recorder works — and the first
    // (only) connection it ever saw is this one.
    let err = dialer
        .dial(&Addr::parse(&format!("proxied.example:{}", echo.port())).unwrap())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    let first = within(STEP, "the recording proxy seeing a CONNECT", seen.recv())
        .await
        .unwrap();
    assert!(first.starts_with("CONNECT proxied.example:"), "{first}");
    assert!(seen.try_recv().is_err());
}
