//! Sign-in through a real proxy: `POST /webapi/login` → Auth gRPC `Login` with the proxy's host
//! identity → user certificates; then the Auth API through the proxy's web port (ALPN
//! `svc-auth@<cluster>`) with those certificates.

use std::sync::Arc;

use svc_core::Secret;
use svc_core::SystemClock;
use svc_core::auth::AuthService;
use svc_core::backend::MemoryBackend;
use svc_core::identity::{HostCertRequest, SystemRole};
use svc_core::resource::User;
use svc_net::auth::{AuthClient, KeyMaterial};
use svc_net::client::{LoginError, login_via_proxy};
use svc_net::proxy::web::login::{LOGIN_PATH, login_service};
use svc_net::proxy::{ProxyBuilder, ProxySettings};
use svc_net::tls::TlsSource;
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread")]
async fn sign_in_through_the_proxy_then_call_the_auth_api_through_it() {
    let auth = Arc::new(
        AuthService::open(
            Arc::new(MemoryBackend::new()),
            "login.test",
            Arc::new(SystemClock),
        )
        .await
        .unwrap(),
    );
    let server_identity = svc_net::auth::server_identity(&auth, "auth", &[]).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let auth_addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    tokio::spawn(svc_net::auth::serve(
        listener,
        auth.clone(),
        server_identity,
        shutdown.clone(),
    ));

    // The proxy's own host identity, issued in-process as `svc start` does.
    let keys = KeyMaterial::generate().unwrap();
    let req = HostCertRequest {
        host_uuid: uuid::Uuid::new_v4(),
        node_name: "proxy".into(),
        roles: vec![SystemRole::Proxy],
        additional_names: vec![],
        ttl: std::time::Duration::from_secs(3600),
    };
    let certs = auth
        .issue_host_certs(&req, &keys.tls_public_key(), keys.ssh_public_key())
        .unwrap();
    let proxy_identity = keys.into_identity(&certs, "login.test").unwrap();
    let proxy_client = AuthClient::connect(&auth_addr.to_string(), &proxy_identity)
        .await
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let mut settings = ProxySettings::default();
    settings.ping.web_listen_addr = svc_core::Addr::parse_with_default_port("127.0.0.1:0", 3080).unwrap();
    settings.tls = TlsSource::Generated {
        data_dir: dir.path().to_owned(),
    };
    let proxy = ProxyBuilder::new(settings)
        .web_mount(LOGIN_PATH, login_service(proxy_client, None))
        .route_prefix(
            svc_net::route::alpn::AUTH_PREFIX,
            svc_net::auth::auth_route(auth_addr),
        )
        .bind()
        .await
        .unwrap();
    let web = proxy.addrs().web.to_string();

    // A user, created with the admin rights of an auth-role host.
    let admin_keys = KeyMaterial::generate().unwrap();
    let admin_req = HostCertRequest {
        roles: vec![SystemRole::Auth],
        ..req.clone()
    };
    let admin_certs = auth
        .issue_host_certs(
            &admin_req,
            &admin_keys.tls_public_key(),
            admin_keys.ssh_public_key(),
        )
        .unwrap();
    let admin = auth.authenticate(&[admin_certs.tls_cert]).await.unwrap();
    auth.create_user(
        &admin,
        User::new("alice", ["editor"]),
        &Secret::new("alice-password".into()),
    )
    .await
    .unwrap();

    // Wrong password: 401 with the server's message; nothing else leaks.
    let err = login_via_proxy(&web, true, None, "alice", &Secret::new("nope-nope".into()), None)
        .await
        .unwrap_err();
    match &err {
        LoginError::Refused { status, message } => {
            assert_eq!(status.as_u16(), 401);
            assert_eq!(message, "invalid username or password");
        }
        other => panic!("expected a refusal, got {other}"),
    }
    // Without --insecure the self-signed proxy is refused before any password is sent.
    let err = login_via_proxy(
        &web,
        false,
        None,
        "alice",
        &Secret::new("alice-password".into()),
        None,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, LoginError::Connect { .. }), "{err}");

    let identity = login_via_proxy(
        &web,
        true,
        None,
        "alice",
        &Secret::new("alice-password".into()),
        None,
    )
    .await
    .unwrap();
    assert_eq!(identity.name, "alice");
    assert_eq!(
        identity.auth_addr, web,
        "clients reach the Auth API through the proxy"
    );
    let mut client = AuthClient::connect_with(&identity).await.unwrap();
    assert_eq!(client.status().await.unwrap().cluster_name, "login.test");
    let roles = client
        .get_resources(svc_core::Kind::Role, None, false)
        .await
        .unwrap();
    assert!(roles.iter().any(|r| r.name() == "editor"));

    proxy.shutdown().await;
    shutdown.cancel();
}
