//! Sign-in limits across the wire: whose address a failed sign-in counts against.
//!
//! A proxy reports its user's address in `LoginRequest.client_addr` — through the real web
//! login, from a trusted PROXY protocol header — and the Auth Service locks that address, not
//! the proxy's. Only proxies are believed: other callers cannot sign in at all, so they cannot
//! pin failures on someone else's address; a malformed address is refused.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use svc_core::Secret;
use svc_core::SystemClock;
use svc_core::auth::{AuthService, LoginLimits};
use svc_core::backend::MemoryBackend;
use svc_core::identity::{HostCertRequest, SystemRole};
use svc_core::resource::User;
use svc_net::auth::proto;
use svc_net::auth::{AuthClient, ClientIdentity, KeyMaterial};
use svc_net::http::HttpClient;
use svc_net::proxy::web::login::{LOGIN_PATH, login_service};
use svc_net::proxy::{ProxyBuilder, ProxySettings};
use svc_net::tls::TlsSource;
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

const CLUSTER: &str = "limits.test";

fn host(auth: &AuthService, roles: Vec<SystemRole>) -> ClientIdentity {
    let keys = KeyMaterial::generate().unwrap();
    let req = HostCertRequest {
        host_uuid: uuid::Uuid::new_v4(),
        node_name: "host".into(),
        roles,
        additional_names: vec![],
        ttl: Duration::from_secs(3600),
    };
    let certs = auth
        .issue_host_certs(&req, &keys.tls_public_key(), keys.ssh_public_key())
        .unwrap();
    keys.into_identity(&certs, CLUSTER).unwrap()
}

fn login_request(user: &str, password: &str, client_addr: &str) -> proto::LoginRequest {
    let keys = KeyMaterial::generate().unwrap();
    proto::LoginRequest {
        username: user.into(),
        password: password.into(),
        tls_public_key: keys.tls_public_key(),
        ssh_public_key: keys.ssh_public_key_line().unwrap(),
        ttl_seconds: 0,
        client_addr: client_addr.into(),
    }
}

/// `POST /webapi/login` over TLS after a PROXY v1 header naming `client` as the source: svc's
/// `HttpClient` over a connector that writes the header once TCP is up.
async fn web_login_as(web: &str, client: &str, user: &str, password: &str) -> (u16, String) {
    let (web, client) = (web.to_owned(), client.to_owned());
    let connector = tower::service_fn(move |_: http::Uri| {
        let (web, client) = (web.clone(), client.clone());
        async move {
            let mut tcp = tokio::net::TcpStream::connect(&web).await?;
            let port = web.rsplit_once(':').map_or("", |(_, p)| p);
            tcp.write_all(format!("PROXY TCP4 {client} 127.0.0.1 40000 {port}\r\n").as_bytes())
                .await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tcp))
        }
    });
    let http = HttpClient::builder(Arc::new(svc_net::tls::insecure_client_config().unwrap()))
        .pool_max_idle_per_host(0)
        .build(connector);
    let keys = KeyMaterial::generate().unwrap();
    let body = serde_json::json!({
        "user": user,
        "password": password,
        "tls_public_key": base64::Engine::encode(&base64::engine::general_purpose::STANDARD, keys.tls_public_key()),
        "ssh_public_key": keys.ssh_public_key_line().unwrap(),
    });
    let req = http::Request::post(format!("https://localhost{LOGIN_PATH}"))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let resp = http.send(req).await.unwrap();
    let json: serde_json::Value = serde_json::from_slice(resp.body()).unwrap();
    (
        resp.status().as_u16(),
        json["error"]["message"].as_str().unwrap_or_default().to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn the_address_a_proxy_reports_is_the_one_locked_and_only_proxies_are_believed() {
    let auth = AuthService::open(Arc::new(MemoryBackend::new()), CLUSTER, Arc::new(SystemClock))
        .await
        .unwrap()
        .with_login_limits(LoginLimits::new(100, 3, Duration::from_secs(600)));
    let auth = Arc::new(auth);
    let admin = auth
        .authenticate(&host(&auth, vec![SystemRole::Auth]).tls_parts().unwrap().0)
        .await
        .unwrap();
    auth.create_user(
        &admin,
        User::new("alice", ["editor"]),
        &Secret::new("alice-password".into()),
    )
    .await
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let auth_addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let server_identity = svc_net::auth::server_identity(&auth, "auth", &[]).unwrap();
    tokio::spawn(svc_net::auth::serve(
        listener,
        auth.clone(),
        server_identity,
        shutdown.clone(),
    ));

    let proxy_identity = host(&auth, vec![SystemRole::Proxy]);
    let mut proxy = AuthClient::connect(&auth_addr.to_string(), &proxy_identity)
        .await
        .unwrap();

    // Three failures reported for 203.0.113.9 lock 203.0.113.9 (the TCP peer, 127.0.0.1, is
    // the proxy's and is not locked).
    for user in ["ghost-1", "ghost-2", "alice"] {
        let e = proxy
            .raw()
            .login(login_request(user, "guessed-password", "203.0.113.9"))
            .await
            .unwrap_err();
        assert_eq!(e.message(), "invalid username or password", "{user}");
    }
    let e = proxy
        .raw()
        .login(login_request("alice", "alice-password", "203.0.113.9:51234"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    assert!(
        e.message().starts_with(
            "sign-in refused: source address 203.0.113.9 is locked after 3 failed attempts; try again after "
        ),
        "{}",
        e.message()
    );
    proxy
        .raw()
        .login(login_request("alice", "alice-password", "203.0.113.10"))
        .await
        .expect("another address is not locked");
    proxy
        .raw()
        .login(login_request("alice", "alice-password", ""))
        .await
        .expect("without a reported address, the proxy's own (unlocked) address counts");

    // A malformed address is refused, not silently replaced.
    let e = proxy
        .raw()
        .login(login_request("alice", "alice-password", "not-an-address"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        e.message(),
        "client_addr: expected an IP address or IP:port, found \"not-an-address\""
    );

    // The insider with a node certificate cannot sign anyone in, whatever address it claims.
    let node_identity = host(&auth, vec![SystemRole::Node]);
    let mut node = AuthClient::connect(&auth_addr.to_string(), &node_identity)
        .await
        .unwrap();
    let e = node
        .raw()
        .login(login_request("alice", "alice-password", "203.0.113.10"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    assert_eq!(
        e.message(),
        "access denied to perform action \"create\" on \"user_session\""
    );

    // Through the real web login: the client address is the one a trusted PROXY header names.
    let dir = tempfile::tempdir().unwrap();
    let mut settings = ProxySettings::default();
    settings.ping.web_listen_addr = svc_core::Addr::parse_with_default_port("127.0.0.1:0", 3080).unwrap();
    settings.tls = TlsSource::Generated {
        data_dir: dir.path().to_owned(),
    };
    settings.trusted_proxy_networks = vec!["127.0.0.0/8".parse().unwrap()];
    let web_proxy = ProxyBuilder::new(settings)
        .web_mount(LOGIN_PATH, login_service(proxy.clone(), None))
        .bind()
        .await
        .unwrap();
    let web = web_proxy.addrs().web.to_string();
    for user in ["ghost-1", "ghost-2", "ghost-3"] {
        let (status, message) = web_login_as(&web, "198.51.100.77", user, "guessed-password").await;
        assert_eq!((status, message.as_str()), (401, "invalid username or password"));
    }
    let (status, message) = web_login_as(&web, "198.51.100.77", "alice", "alice-password").await;
    assert_eq!(status, 403);
    assert!(
        message
            .starts_with("sign-in refused: source address 198.51.100.77 is locked after 3 failed attempts"),
        "{message}"
    );
    let (status, message) = web_login_as(&web, "198.51.100.78", "alice", "alice-password").await;
    assert_eq!(
        (status, message.as_str()),
        (200, ""),
        "another client of the same proxy"
    );

    web_proxy.shutdown().await;
    shutdown.cancel();
}
