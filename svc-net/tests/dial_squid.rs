//! ProxyDialer against a real squid: configured from (injected) environment variables, proxied
//! by name (squid resolves `sink.test` from its own hosts file), 407 for missing or wrong
//! credentials, 403 for a port outside squid's CONNECT allow-list.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::HashMap;

use support::*;
use svc_core::{
    Addr,
    proxy_env::{ProxyEnv, Route},
};
use svc_net::dial::{Error, ProxyDialer};

fn dialer(vars: &[(&str, String)]) -> ProxyDialer {
    let map: HashMap<String, String> = vars.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect();
    let env = ProxyEnv::from_lookup(|name| map.get(name).cloned()).unwrap();
    ProxyDialer::builder(env).build().unwrap()
}

#[tokio::test]
async fn proxy_dialer_through_squid() {
    let echo = echo_server().await;
    let squid = squid(&[echo.port()], &["sink.test"]).await;
    let target = Addr::parse(&format!("sink.test:{}", echo.port())).unwrap();

    // Lower-case variable, credentials percent-encoded.
    let d = dialer(&[(
        "https_proxy",
        proxy_url("http", squid.port, USER, Some(PASSWORD_URL)),
    )]);
    assert!(matches!(d.route(&target), Route::Proxy(_)));
    let mut stream = d.dial(&target).await.unwrap();
    assert!(stream.is_proxied());
    assert_eq!(round_trip(&mut stream, b"through squid").await, b"through squid");
    drop(stream);

    for password in [None, Some("wrong")] {
        let d = dialer(&[("HTTP_PROXY", proxy_url("http", squid.port, USER, password))]);
        let err = d.dial(&target).await.unwrap_err();
        assert!(
            matches!(err, Error::ProxyAuthRequired { status: 407, .. }),
            "{err:?}"
        );
    }

    // Not in squid's CONNECT port list.
    let other = echo_server().await;
    let err = d
        .dial(&Addr::parse(&format!("sink.test:{}", other.port())).unwrap())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::ProxyRefused { status: 403, .. }), "{err:?}");
    assert!(
        squid.log("access.log").contains("CONNECT sink.test"),
        "squid logged no CONNECT"
    );
}
