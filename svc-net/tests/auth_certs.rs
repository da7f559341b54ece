//! The Auth gRPC API on a real port refuses every certificate it must refuse: expired, not yet
//! valid, from another cluster's CA, a user certificate presented as a host, a host certificate
//! used as a user, and a host with the wrong role. Valid identities are served (the controls).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use svc_core::Secret;
use svc_core::SystemClock;
use svc_core::auth::{AuthService, Heartbeat, IssuedCerts};
use svc_core::backend::{Backend, MemoryBackend};
use svc_core::identity::{CertAuthority, HostCertRequest, IdentityKind, SystemRole, UserCertRequest};
use svc_core::resource::Kind;
use svc_net::auth::{AuthClient, ClientError, ClientIdentity, KeyMaterial};
use tokio_util::sync::CancellationToken;

const CLUSTER: &str = "matrix.test";

struct Server {
    addr: String,
    auth: Arc<AuthService>,
    host_ca: CertAuthority,
    user_ca: CertAuthority,
    shutdown: CancellationToken,
}

async fn server() -> Server {
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let auth = Arc::new(
        AuthService::open(backend.clone(), CLUSTER, Arc::new(SystemClock))
            .await
            .unwrap(),
    );
    let identity = svc_net::auth::server_identity(&auth, "auth", &[]).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let shutdown = CancellationToken::new();
    let (a, s) = (auth.clone(), shutdown.clone());
    tokio::spawn(async move { svc_net::auth::serve(listener, a, identity, s).await.unwrap() });
    let host_ca = CertAuthority::load(backend.as_ref(), IdentityKind::Host, CLUSTER)
        .await
        .unwrap()
        .unwrap();
    let user_ca = CertAuthority::load(backend.as_ref(), IdentityKind::User, CLUSTER)
        .await
        .unwrap()
        .unwrap();
    Server {
        addr,
        auth,
        host_ca,
        user_ca,
        shutdown,
    }
}

fn host_req(roles: Vec<SystemRole>, ttl: Duration) -> HostCertRequest {
    HostCertRequest {
        host_uuid: uuid::Uuid::new_v4(),
        node_name: "host".into(),
        roles,
        additional_names: vec![],
        ttl,
    }
}

/// An identity signed by `ca` at `now`, trusting the real cluster's CAs (so the client accepts
/// the server, and only the server's judgement of the client certificate is tested).
fn host_identity(
    s: &Server,
    ca: &CertAuthority,
    roles: Vec<SystemRole>,
    now: SystemTime,
    ttl: Duration,
) -> ClientIdentity {
    let keys = KeyMaterial::generate().unwrap();
    let req = host_req(roles, ttl);
    let certs = IssuedCerts {
        name: svc_core::identity::host_id(&req.host_uuid, ca.cluster()),
        tls_cert: ca.sign_host_x509(&req, &keys.tls_public_key(), now).unwrap(),
        ssh_cert: ca.sign_host_ssh(&req, keys.ssh_public_key(), now).unwrap(),
        trusted: s.auth.trusted(),
        not_after: now + ttl,
    };
    let mut id = keys.into_identity(&certs, CLUSTER).unwrap();
    id.auth_addr = s.addr.clone();
    id
}

fn user_identity(s: &Server, roles: &[&str]) -> ClientIdentity {
    let keys = KeyMaterial::generate().unwrap();
    let now = SystemTime::now();
    let req = UserCertRequest {
        username: "mallory".into(),
        roles: roles.iter().map(|r| (*r).to_owned()).collect(),
        logins: vec!["mallory".into()],
        ttl: Duration::from_secs(3600),
        db_route: None,
        ssh_permits: Default::default(),
    };
    let certs = IssuedCerts {
        name: "mallory".into(),
        tls_cert: s
            .user_ca
            .sign_user_x509(&req, &keys.tls_public_key(), now)
            .unwrap(),
        ssh_cert: s.user_ca.sign_user_ssh(&req, keys.ssh_public_key(), now).unwrap(),
        trusted: s.auth.trusted(),
        not_after: now + req.ttl,
    };
    let mut id = keys.into_identity(&certs, CLUSTER).unwrap();
    id.auth_addr = s.addr.clone();
    id
}

/// Connecting and calling: a refused handshake may surface at connect or at the first call.
async fn status_with(id: &ClientIdentity) -> Result<(), ClientError> {
    AuthClient::connect_with(id).await?.status().await.map(|_| ())
}

#[tokio::test(flavor = "multi_thread")]
async fn every_bad_certificate_is_refused() {
    let s = server().await;
    let now = SystemTime::now();
    let hour = Duration::from_secs(3600);
    let mut refused = 0;
    let mut cases = 0;
    let mut expect_refused = |name: &str, r: Result<(), ClientError>| {
        cases += 1;
        match r {
            Err(e) => {
                refused += 1;
                println!("refused: {name}: {e}");
            }
            Ok(()) => panic!("{name}: accepted"),
        }
    };

    // Controls: the same shapes, valid, are served.
    let admin = host_identity(&s, &s.host_ca, vec![SystemRole::Auth], now, hour);
    status_with(&admin).await.expect("a valid admin is served");
    let node = host_identity(&s, &s.host_ca, vec![SystemRole::Node], now, hour);
    let mut node_client = AuthClient::connect_with(&node).await.unwrap();
    node_client
        .heartbeat(&Heartbeat::default())
        .await
        .expect("a valid node may heartbeat");
    // The user must exist: the certificates of a deleted user are refused.
    let admin = host_identity(&s, &s.host_ca, vec![SystemRole::Auth], now, hour);
    AuthClient::connect_with(&admin)
        .await
        .unwrap()
        .create_user(
            "mallory",
            &["editor".to_owned()],
            &[],
            &Secret::new("a-long-password".into()),
        )
        .await
        .unwrap();
    let editor = user_identity(&s, &["editor"]);
    let mut editor_client = AuthClient::connect_with(&editor).await.unwrap();
    editor_client
        .get_resources(Kind::Role, None, false)
        .await
        .expect("an editor may list roles");

    // 1. Expired (signed two hours ago for one hour), even with the auth role.
    let expired = host_identity(&s, &s.host_ca, vec![SystemRole::Auth], now - 2 * hour, hour);
    expect_refused("expired", status_with(&expired).await);

    // 2. Not yet valid (signed for a moment two hours ahead).
    let future = host_identity(&s, &s.host_ca, vec![SystemRole::Auth], now + 2 * hour, hour);
    expect_refused("not yet valid", status_with(&future).await);

    // 3. Another cluster's CA (a host CA named like ours would be just as foreign).
    for other_name in ["other.test", CLUSTER] {
        let other = CertAuthority::generate(IdentityKind::Host, other_name, now, 24 * hour).unwrap();
        let foreign = host_identity(&s, &other, vec![SystemRole::Auth], now, hour);
        expect_refused(
            &format!("CA of another cluster named {other_name}"),
            status_with(&foreign).await,
        );
    }

    // 4. A user certificate presented as a host: it may not heartbeat into the inventory.
    let mut user = AuthClient::connect_with(&editor).await.unwrap();
    expect_refused(
        "user certificate as a host",
        user.heartbeat(&Heartbeat::default()).await.map(|_| ()),
    );

    // 5. A host certificate used as a user: a node may not read or write resources.
    expect_refused(
        "host certificate as a user (get)",
        node_client
            .get_resources(Kind::Role, None, false)
            .await
            .map(|_| ()),
    );
    expect_refused(
        "host certificate as a user (create)",
        node_client
            .put_resources("kind: role\nversion: v7\nmetadata:\n  name: x\nspec: {}\n", false)
            .await
            .map(|_| ()),
    );

    // 6. The wrong role: only proxies sign users in; a user without rights cannot list.
    let keys = KeyMaterial::generate().unwrap();
    expect_refused(
        "node signing a user in",
        node_client
            .login("mallory", &Secret::new("whatever1".into()), keys, None)
            .await
            .map(|_| ()),
    );
    let access = user_identity(&s, &["access"]);
    let mut access_client = AuthClient::connect_with(&access).await.unwrap();
    let denied = access_client.inventory().await.map(|_| ());
    if let Err(e) = &denied {
        assert_eq!(
            e.to_string(),
            "access denied to perform action \"list\" on \"inventory\""
        );
    }
    expect_refused("user without the right role", denied);
    let proxy = host_identity(&s, &s.host_ca, vec![SystemRole::Proxy], now, hour);
    let mut proxy_client = AuthClient::connect_with(&proxy).await.unwrap();
    expect_refused(
        "proxy creating a token",
        proxy_client
            .create_token(&["node".into()], None)
            .await
            .map(|_| ()),
    );

    // 7. A deleted user's certificates stop working, and so does a locked user's.
    AuthClient::connect_with(&admin)
        .await
        .unwrap()
        .delete_resource(Kind::User, "mallory")
        .await
        .unwrap();
    let gone = editor_client
        .get_resources(Kind::Role, None, false)
        .await
        .map(|_| ());
    if let Err(e) = &gone {
        assert_eq!(
            e.to_string(),
            "access refused: user \"mallory\" no longer exists: their certificates are revoked"
        );
    }
    expect_refused("deleted user", gone);

    println!("certificate matrix: {refused}/{cases} refused");
    assert_eq!(refused, cases);
    s.shutdown.cancel();
}

fn join_params(
    token: &Secret,
    ca_pin: Option<String>,
    trust_on_first_use: bool,
) -> svc_net::auth::JoinParams {
    svc_net::auth::JoinParams {
        token: token.clone(),
        ca_pin,
        trust_on_first_use,
        node_name: "joiner".into(),
        roles: vec![SystemRole::Node],
        additional_names: vec![],
    }
}

/// A join needs a CA pin (or explicit trust on first use), and the server answering it must be
/// the Auth Service: another host of the cluster — its certificate chains to the same pinned
/// CA — never receives the token.
#[tokio::test(flavor = "multi_thread")]
async fn a_join_needs_a_pin_and_an_auth_host() {
    let s = server().await;
    let now = SystemTime::now();
    let admin = host_identity(
        &s,
        &s.host_ca,
        vec![SystemRole::Auth],
        now,
        Duration::from_secs(3600),
    );
    let (token, _) = AuthClient::connect_with(&admin)
        .await
        .unwrap()
        .create_token(&["node".into()], None)
        .await
        .unwrap();
    let pin = s.auth.ca_pin();

    // No pin, no explicit trust on first use: refused before anything is sent.
    let err = svc_net::auth::join(&s.addr, join_params(&token, None, false))
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::NoCaPin { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "refusing to join the cluster at {} without a CA pin: expected svc.ca_pin (the CA pin `tctl status` prints), or explicit trust on first use (svc start --insecure)",
            s.addr
        )
    );

    // A rogue node of the cluster answers the join with its own, valid host certificate.
    let rogue_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let rogue_addr = rogue_listener.local_addr().unwrap().to_string();
    let node = host_identity(
        &s,
        &s.host_ca,
        vec![SystemRole::Node],
        now,
        Duration::from_secs(3600),
    );
    let (auth, stop) = (s.auth.clone(), s.shutdown.clone());
    tokio::spawn(async move { svc_net::auth::serve(rogue_listener, auth, node, stop).await });
    let err = svc_net::auth::join(&rogue_addr, join_params(&token, Some(pin.clone()), false))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("the server answering the join is not the Auth Service")
            && err.contains("lacks role auth"),
        "{err}"
    );
    // The token was not spent there: the real Auth Service still admits it, with the pin.
    let joined = svc_net::auth::join(&s.addr, join_params(&token, Some(pin), false))
        .await
        .expect("the real Auth Service admits the token");
    assert!(joined.name.ends_with(CLUSTER), "{}", joined.name);
    s.shutdown.cancel();
}

/// Extra certificate names over the real Auth API: `tctl tokens add --extra-names` grants
/// exact names; a joining agent asking for any other name is refused with the name and the
/// reason, and nothing is issued; a wildcard cannot even be granted.
#[tokio::test(flavor = "multi_thread")]
async fn a_join_gets_only_the_extra_names_its_token_grants() {
    let s = server().await;
    let admin = host_identity(
        &s,
        &s.host_ca,
        vec![SystemRole::Auth],
        SystemTime::now(),
        Duration::from_secs(3600),
    );
    let mut client = AuthClient::connect_with(&admin).await.unwrap();
    let err = client
        .create_token_with_names(&["node".into()], None, &["*.internal".into()])
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("wildcard certificate names are not allowed"),
        "{err}"
    );
    let (token, _) = client
        .create_token_with_names(&["node".into()], None, &["joiner.internal".into()])
        .await
        .unwrap();
    let pin = Some(s.auth.ca_pin());

    let mut rogue = join_params(&token, pin.clone(), false);
    rogue.additional_names = vec!["joiner.internal".into(), "billing.internal".into()];
    let err = svc_net::auth::join(&s.addr, rogue).await.unwrap_err().to_string();
    assert!(
        err.contains(
            "certificate name \"billing.internal\": not an extra name the join token or the Auth Service grants to agents"
        ),
        "{err}"
    );

    // The token was not spent; the granted name joins and is in the certificate.
    let mut honest = join_params(&token, pin, false);
    honest.additional_names = vec!["joiner.internal".into()];
    let id = svc_net::auth::join(&s.addr, honest).await.unwrap();
    let host = s
        .auth
        .verifier()
        .verify_host_x509(&id.tls_parts().unwrap().0, SystemTime::now(), None)
        .unwrap();
    assert_eq!(host.additional_names, ["joiner.internal"]);
    s.shutdown.cancel();
}
