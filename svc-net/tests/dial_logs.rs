//! Credentials never leak: dials at TRACE level with a capturing subscriber, through a real
//! tinyproxy (success, 407, 401) and through the dialer's error paths; the password (plain,
//! percent-encoded or inside the Basic token) appears in no log line, error text or Debug output.
#![allow(clippy::unwrap_used)]

mod support;

use std::{
    collections::HashMap,
    io::Write,
    sync::{Arc, Mutex},
};

use hyper_util::rt::TokioIo;
use support::*;
use svc_core::{
    Addr,
    proxy_env::{ProxyEnv, ProxyUrl},
};
use svc_net::dial::{HttpConnect, ProxyDialer, TcpConnector};
use tower::ServiceExt;

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn password_never_in_logs_errors_or_debug() {
    let capture = Capture::default();
    let writer = capture.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    const WRONG: &str = "Wr0ng-Secret_pw";
    let echo = echo_server().await;
    let proxy = tinyproxy(&[echo.port()]).await;
    let mut shown = Vec::<String>::new();

    // Success through HttpConnect (trace lines from the handshake).
    let good = ProxyUrl::parse(
        "HTTPS_PROXY",
        &proxy_url("http", proxy.port, USER, Some(PASSWORD_URL)),
    )
    .unwrap();
    let connect = HttpConnect::new(TcpConnector::new(), &good).unwrap();
    shown.push(format!("{connect:?} {good:?} {good}"));
    let tunnel = connect.oneshot(Addr::from(echo)).await.unwrap();
    let mut io = TokioIo::new(tunnel);
    assert_eq!(round_trip(&mut io, b"x").await, b"x");

    // Failures through the ProxyDialer (debug route lines), from environment variables.
    for password in [Some(PASSWORD_URL), Some(WRONG), None] {
        let vars: HashMap<&str, String> =
            HashMap::from([("HTTPS_PROXY", proxy_url("http", proxy.port, USER, password))]);
        let env = ProxyEnv::from_lookup(|n| vars.get(n).cloned()).unwrap();
        shown.push(format!("{env:?}"));
        let dialer = ProxyDialer::builder(env).build().unwrap();
        shown.push(format!("{dialer:?}"));
        // tinyproxy checks credentials before resolving the name; with the right ones it fails
        // to reach this name (it does not exist) and answers with an error status.
        let err = dialer
            .dial(&Addr::parse("no-such-host.invalid:443").unwrap())
            .await
            .unwrap_err();
        match password {
            Some(PASSWORD_URL) => assert!(
                matches!(err, svc_net::dial::Error::ProxyRefused { .. }),
                "{err:?}"
            ),
            Some(_) => assert!(
                matches!(err, svc_net::dial::Error::ProxyAuthRequired { status: 401, .. }),
                "{err:?}"
            ),
            None => assert!(
                matches!(err, svc_net::dial::Error::ProxyAuthRequired { status: 407, .. }),
                "{err:?}"
            ),
        }
        shown.push(format!("{err} {err:?}"));
        let io_err = std::io::Error::from(err);
        shown.push(format!("{io_err} {io_err:?}"));
    }
    // An invalid proxy URL carrying the password.
    let bad = ProxyUrl::parse(
        "HTTPS_PROXY",
        &format!("http://{USER}:{PASSWORD_URL}@proxy.example:99999"),
    )
    .unwrap_err();
    shown.push(format!("{bad} {bad:?}"));

    let logs = String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
    assert!(
        logs.contains("route=\"proxied\""),
        "the capture saw no route line:\n{logs}"
    );
    assert!(logs.contains(&format!("{PROXY_IP}:{}", proxy.port)), "{logs}");
    let all = format!("{logs}\n{}", shown.join("\n"));
    for secret in [
        PASSWORD.to_owned(),
        PASSWORD_URL.to_owned(),
        WRONG.to_owned(),
        base64_of(&format!("{USER}:{PASSWORD}")),
        base64_of(&format!("{USER}:{WRONG}")),
    ] {
        assert!(!all.contains(&secret), "{secret:?} leaked into:\n{all}");
    }
}

fn base64_of(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}
