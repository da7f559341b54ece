//! The Proxy Service apart from the Auth Service, in one test process with a real Auth API on
//! loopback: joining with a `proxy` token (node tokens and a wrong CA pin refused), failing
//! over past a dead Auth address, the watched cache that the proxy decides from (a lock, a
//! role change and a user deletion reach its decisions within one second), decisions while
//! the Auth Service is down and the re-sync when it is back, and the renewal of the proxy's
//! host identity before it expires.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use svc_core::Secret;
use svc_core::SystemClock;
use svc_core::auth::{AuthService, Caller, Heartbeat, LoginRequest, ServedKind, ServedResource};
use svc_core::backend::MemoryBackend;
use svc_core::config::Config;
use svc_core::identity::{HostCertRequest, SystemRole};
use svc_core::resource::{JoinRole, LOGINS_TRAIT, Lock, Resource, User};
use svc_net::auth::{ClientIdentity, FailoverClient, KeyMaterial};
use svc_net::proxy::cache::{ProxyCache, ProxyDecisions};
use tokio_util::sync::CancellationToken;

const CLUSTER: &str = "apart.test";
const PASSWORD: &str = "alice-password-1";
/// Every wait here has this deadline (one second where the point is "within one second").
const STEP: Duration = Duration::from_secs(60);
const WITHIN: Duration = Duration::from_secs(1);

/// An Auth Service on a memory backend, its API on `listener`.
struct Auth {
    service: Arc<AuthService>,
    addr: SocketAddr,
    stop: CancellationToken,
}

async fn auth_on(service: Arc<AuthService>, addr: &str) -> Auth {
    let identity = svc_net::auth::server_identity(&service, "auth", &[]).expect("server identity");
    // The address may still be held for a moment after the previous server on it stopped.
    let deadline = tokio::time::Instant::now() + STEP;
    let listener = loop {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => break l,
            Err(e) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "bind the Auth API on {addr}: {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let addr = listener.local_addr().expect("local addr");
    let stop = CancellationToken::new();
    tokio::spawn(svc_net::auth::serve(
        listener,
        service.clone(),
        identity,
        stop.clone(),
    ));
    Auth { service, addr, stop }
}

async fn start_auth() -> Auth {
    let service = Arc::new(
        AuthService::open(Arc::new(MemoryBackend::new()), CLUSTER, Arc::new(SystemClock))
            .await
            .expect("open the Auth Service"),
    );
    auth_on(service, "127.0.0.1:0").await
}

fn host_caller(auth: &AuthService, roles: Vec<SystemRole>, node: &str) -> (ClientIdentity, HostCertRequest) {
    let keys = KeyMaterial::generate().expect("keys");
    let req = HostCertRequest {
        host_uuid: uuid::Uuid::new_v4(),
        node_name: node.into(),
        roles,
        additional_names: vec![],
        ttl: Duration::from_secs(3600),
    };
    let certs = auth
        .issue_host_certs(&req, &keys.tls_public_key(), keys.ssh_public_key())
        .expect("host certs");
    (keys.into_identity(&certs, CLUSTER).expect("identity"), req)
}

async fn caller_of(auth: &AuthService, identity: &ClientIdentity) -> Caller {
    auth.authenticate(&identity.tls_parts().expect("tls parts").0)
        .await
        .expect("authenticate")
}

async fn admin(auth: &AuthService) -> Caller {
    let (identity, _) = host_caller(auth, vec![SystemRole::Auth], "admin");
    caller_of(auth, &identity).await
}

/// A free loopback address nothing listens on.
fn dead_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let a = l.local_addr().expect("addr").to_string();
    drop(l);
    a
}

fn proxy_config(dir: &Path, auth_servers: &[String], token: &str, pin: &str) -> Config {
    let servers: String = auth_servers.iter().map(|a| format!("    - {a}\n")).collect();
    let yaml = format!(
        "version: v1\nsvc:\n  nodename: proxy-1\n  data_dir: {}\n  auth_server:\n{servers}  auth_token: {token}\n  ca_pin: {pin}\nauth_service:\n  enabled: false\nproxy_service:\n  enabled: true\n  web_listen_addr: 127.0.0.1:0\n  tunnel_listen_addr: 127.0.0.1:0\n  listen_addr: 127.0.0.1:0\nssh_service:\n  enabled: false\n",
        dir.display()
    );
    Config::from_yaml_str_with_hostname(&yaml, "h").expect("proxy config")
}

async fn token(auth: &AuthService, role: JoinRole) -> String {
    let admin = admin(auth).await;
    auth.create_token(&admin, vec![role], None)
        .await
        .expect("token")
        .metadata
        .name
        .expose()
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_apart_joins_with_a_proxy_token_at_the_first_reachable_auth_service() {
    let auth = start_auth().await;
    let pin = auth.service.ca_pin();
    let dead = dead_addr();
    let servers = vec![dead.clone(), auth.addr.to_string()];

    // A node token is refused: the proxy role is not among its roles.
    let dir = tempfile::tempdir().expect("tempdir");
    let node_token = token(&auth.service, JoinRole::Node).await;
    let err = svc_net::Cluster::from_config(&proxy_config(dir.path(), &servers, &node_token, &pin))
        .start()
        .await
        .expect_err("a node token must not make a proxy");
    let text = err.to_string();
    assert!(text.contains("join refused"), "{text}");

    // A wrong CA pin: nothing is sent to a server that does not hold the pinned CA; the error
    // names both addresses.
    let proxy_token = token(&auth.service, JoinRole::Proxy).await;
    let wrong = format!("sha256:{}", "0".repeat(64));
    let err = svc_net::Cluster::from_config(&proxy_config(dir.path(), &servers, &proxy_token, &wrong))
        .start()
        .await
        .expect_err("a wrong pin must refuse the join");
    let text = err.to_string();
    assert!(
        text.contains(&dead) && text.contains(&auth.addr.to_string()) && text.contains("pin"),
        "{text}"
    );

    // The proxy token, a dead address first: the proxy joins at the second and serves.
    let running = svc_net::Cluster::from_config(&proxy_config(dir.path(), &servers, &proxy_token, &pin))
        .start()
        .await
        .expect("the proxy apart starts");
    assert!(running.auth.is_none() && running.node.is_none());
    assert_eq!(running.cluster, CLUSTER);
    let saved = ClientIdentity::load(&dir.path().join(svc_net::proxy::node::PROXY_IDENTITY_FILE))
        .expect("the proxy's identity is saved in its data directory");
    assert_eq!(saved.cluster, CLUSTER);
    // Its web port answers the ping with the cluster's name.
    let proxy = running.proxy.as_ref().expect("proxy");
    let web = proxy.addrs().web.to_string();
    let ping = svc_net::client::ping_via_proxy(&web, true, None, None)
        .await
        .expect("ping the proxy apart");
    assert_eq!(ping["cluster_name"], CLUSTER, "{ping}");
    running.shutdown().await;
    auth.stop.cancel();
}

/// Signs `alice` in (as a proxy would) and returns her SSH certificate.
async fn alice_cert(auth: &AuthService, proxy: &Caller) -> ssh_key::Certificate {
    let keys = KeyMaterial::generate().expect("keys");
    let certs = auth
        .login(
            proxy,
            &LoginRequest {
                username: "alice".into(),
                password: Secret::new(PASSWORD.into()),
                tls_public_key: keys.tls_public_key(),
                ssh_public_key: keys.ssh_public_key().clone(),
                ttl: None,
                source: None,
            },
        )
        .await
        .expect("alice signs in");
    certs.ssh_cert
}

/// Waits (at most `within`) until `check` holds for the proxy's decision.
async fn decided_within<F>(
    decisions: &ProxyDecisions,
    cert: &ssh_key::Certificate,
    within: Duration,
    what: &str,
    check: F,
) where
    F: Fn(&Result<svc_core::auth::ResourceRoute, String>) -> bool,
{
    all_decided_within(&[decisions], cert, within, what, check).await;
}

/// Waits (at most `within`, one deadline for all) until `check` holds for every proxy's
/// decision.
async fn all_decided_within<F>(
    proxies: &[&ProxyDecisions],
    cert: &ssh_key::Certificate,
    within: Duration,
    what: &str,
    check: F,
) where
    F: Fn(&Result<svc_core::auth::ResourceRoute, String>) -> bool,
{
    let deadline = tokio::time::Instant::now() + within;
    for (i, decisions) in proxies.iter().enumerate() {
        loop {
            let answer = decisions.authorize_node(cert, "node-1", "root").await;
            if check(&answer) {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: not reflected in proxy {i}'s decision within {within:?}: {answer:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_decides_from_its_watched_cache_and_keeps_deciding_while_the_auth_service_is_down() {
    let auth = start_auth().await;
    let admin = admin(&auth.service).await;
    let mut alice = User::new("alice", ["access"]);
    alice.spec.traits.insert(LOGINS_TRAIT.into(), vec!["root".into()]);
    auth.service
        .create_user(&admin, alice, &Secret::new(PASSWORD.into()))
        .await
        .expect("create alice");
    // A node announces itself.
    let (node_identity, _) = host_caller(&auth.service, vec![SystemRole::Node], "node-1");
    let node = caller_of(&auth.service, &node_identity).await;
    auth.service
        .heartbeat(
            &node,
            Heartbeat {
                hostname: "node-1".into(),
                version: "17.0.0".into(),
                resources: vec![ServedResource::new(ServedKind::Node, "node-1")],
                ..Heartbeat::default()
            },
        )
        .await
        .expect("heartbeat");

    // The proxy's cache, fed by the Watch call (a dead address first: failover).
    let (proxy_identity, _) = host_caller(&auth.service, vec![SystemRole::Proxy], "proxy-1");
    let proxy_caller = caller_of(&auth.service, &proxy_identity).await;
    let link = Arc::new(FailoverClient::new(
        vec![dead_addr(), auth.addr.to_string()],
        proxy_identity.clone(),
        None,
    ));
    let stop = CancellationToken::new();
    let cache = ProxyCache::spawn(link, stop.clone());
    cache.wait_synced(STEP).await.expect("the first snapshot");
    assert!(!cache.backend().is_empty());
    let decisions = ProxyDecisions::over_cache(&cache, &proxy_identity)
        .await
        .expect("decisions");
    // A second proxy with a cache of its own: a change reaches every proxy's decisions.
    let (second_identity, _) = host_caller(&auth.service, vec![SystemRole::Proxy], "proxy-2");
    let second_link = Arc::new(FailoverClient::new(
        vec![auth.addr.to_string()],
        second_identity.clone(),
        None,
    ));
    let second_cache = ProxyCache::spawn(second_link, stop.clone());
    second_cache
        .wait_synced(STEP)
        .await
        .expect("the second proxy's first snapshot");
    let second = ProxyDecisions::over_cache(&second_cache, &second_identity)
        .await
        .expect("the second proxy's decisions");
    let both: [&ProxyDecisions; 2] = [&decisions, &second];
    let cert = alice_cert(&auth.service, &proxy_caller).await;
    assert!(
        second.authorize_node(&cert, "node-1", "root").await.is_ok(),
        "the second proxy grants alice too"
    );

    // The same answers as the Auth Service's own.
    let local = decisions.authorize_node(&cert, "node-1", "root").await;
    let remote = auth
        .service
        .authorize_node(&proxy_caller, &cert, "node-1", "root")
        .await
        .expect("auth answers");
    assert_eq!(local, remote.map_err(|e| e.to_string()));
    assert!(local.is_ok(), "{local:?}");
    let denied_login = decisions.authorize_node(&cert, "node-1", "postgres").await;
    assert!(denied_login.is_err(), "{denied_login:?}");

    // A lock reaches the decision within a second; so does its removal.
    auth.service
        .put_resources(
            &admin,
            vec![Resource::Lock(Lock::user("alice", Some("incident 7".into())))],
            false,
        )
        .await
        .expect("lock alice");
    all_decided_within(&both, &cert, WITHIN, "the lock", |a| {
        a.as_ref()
            .is_err_and(|e| e.contains("locked") && e.contains("incident 7"))
    })
    .await;
    auth.service
        .delete_resource(&admin, svc_core::resource::Kind::Lock, "user-alice")
        .await
        .expect("unlock");
    all_decided_within(&both, &cert, WITHIN, "the unlock", Result::is_ok).await;

    // A role change (the `access` role no longer grants any node) within a second, then back.
    let mut narrowed = svc_core::rbac::preset_access(Vec::<String>::new());
    narrowed.spec.allow.node_labels = Default::default();
    auth.service
        .put_resources(&admin, vec![Resource::Role(narrowed)], true)
        .await
        .expect("narrow the access role");
    all_decided_within(&both, &cert, WITHIN, "the role change", Result::is_err).await;
    let remote = auth
        .service
        .authorize_node(&proxy_caller, &cert, "node-1", "root")
        .await
        .expect("auth answers");
    assert_eq!(
        decisions.authorize_node(&cert, "node-1", "root").await,
        remote.map_err(|e| e.to_string()),
        "the proxy and the Auth Service give the same answer"
    );
    auth.service
        .put_resources(
            &admin,
            vec![Resource::Role(
                svc_core::rbac::preset_access(Vec::<String>::new()),
            )],
            true,
        )
        .await
        .expect("restore the access role");
    all_decided_within(&both, &cert, WITHIN, "the role restored", Result::is_ok).await;

    // The Auth Service goes away: the watch ends, the proxy keeps deciding from its copy.
    let mut status = cache.subscribe();
    auth.stop.cancel();
    tokio::time::timeout(STEP, status.wait_for(|s| !s.connected))
        .await
        .expect("the cache notices the Auth Service is gone")
        .expect("status channel");
    let during = decisions.authorize_node(&cert, "node-1", "root").await;
    assert!(
        during.is_ok(),
        "decisions while the Auth Service is down: {during:?}"
    );

    // While it is down, alice is deleted (on the shared storage); when the Auth Service is
    // back on the same address, the proxy re-syncs and the deletion reaches its decisions.
    auth.service
        .delete_resource(&admin, svc_core::resource::Kind::User, "alice")
        .await
        .expect("delete alice");
    let back = auth_on(auth.service.clone(), &auth.addr.to_string()).await;
    tokio::time::timeout(STEP, status.wait_for(|s| s.connected && s.snapshots >= 2))
        .await
        .expect("the cache re-syncs when the Auth Service is back")
        .expect("status channel");
    decided_within(&decisions, &cert, WITHIN, "the user deletion", |a| {
        a.as_ref().is_err_and(|e| e.contains("no longer exists"))
    })
    .await;
    stop.cancel();
    back.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_deletion_reaches_the_proxy_within_a_second() {
    let auth = start_auth().await;
    let admin = admin(&auth.service).await;
    let mut bob = User::new("alice", ["access"]);
    bob.spec.traits.insert(LOGINS_TRAIT.into(), vec!["root".into()]);
    auth.service
        .create_user(&admin, bob, &Secret::new(PASSWORD.into()))
        .await
        .expect("create alice");
    let (node_identity, _) = host_caller(&auth.service, vec![SystemRole::Node], "node-1");
    let node = caller_of(&auth.service, &node_identity).await;
    auth.service
        .heartbeat(
            &node,
            Heartbeat {
                hostname: "node-1".into(),
                resources: vec![ServedResource::new(ServedKind::Node, "node-1")],
                ..Heartbeat::default()
            },
        )
        .await
        .expect("heartbeat");
    let (proxy_identity, _) = host_caller(&auth.service, vec![SystemRole::Proxy], "proxy-1");
    let proxy_caller = caller_of(&auth.service, &proxy_identity).await;
    let link = Arc::new(FailoverClient::new(
        vec![auth.addr.to_string()],
        proxy_identity.clone(),
        None,
    ));
    let stop = CancellationToken::new();
    let cache = ProxyCache::spawn(link, stop.clone());
    cache.wait_synced(STEP).await.expect("the first snapshot");
    let decisions = ProxyDecisions::over_cache(&cache, &proxy_identity)
        .await
        .expect("decisions");
    let cert = alice_cert(&auth.service, &proxy_caller).await;
    decided_within(&decisions, &cert, STEP, "the grant", Result::is_ok).await;
    auth.service
        .delete_resource(&admin, svc_core::resource::Kind::User, "alice")
        .await
        .expect("delete alice");
    decided_within(&decisions, &cert, WITHIN, "the user deletion", |a| {
        a.as_ref().is_err_and(|e| e.contains("no longer exists"))
    })
    .await;
    stop.cancel();
    auth.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_renews_its_host_identity_before_it_expires_and_keeps_serving() {
    let auth = start_auth().await;
    let pin = auth.service.ca_pin();
    let dir = tempfile::tempdir().expect("tempdir");
    let proxy_token = token(&auth.service, JoinRole::Proxy).await;
    let config = proxy_config(dir.path(), &[auth.addr.to_string()], &proxy_token, &pin);
    let ttl = Duration::from_secs(6);
    let proxy = svc_net::ProxyServer::from_config(&config)
        .host_cert_ttl(Some(ttl))
        .start_joined()
        .await
        .expect("the proxy apart starts");
    let path = dir.path().join(svc_net::proxy::node::PROXY_IDENTITY_FILE);
    let joined = ClientIdentity::load(&path).expect("joined identity");
    // Renewed at once to the short lifetime, then again before each expiry: wait until the
    // identity in the data directory has been replaced three times, and is valid past the
    // end of the first short-lived one.
    let deadline = tokio::time::Instant::now() + STEP;
    let mut seen = vec![joined.not_after_unix];
    while seen.len() < 4 {
        let now = ClientIdentity::load(&path).expect("identity");
        if now.not_after_unix != *seen.last().expect("seen") {
            assert_eq!(now.name, joined.name, "renewal keeps the host ID");
            seen.push(now.not_after_unix);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the proxy renewed its identity only {} times within {STEP:?}: {seen:?}",
            seen.len() - 1
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        seen[1] < joined.not_after_unix,
        "the first renewal asks for the short lifetime: {seen:?}"
    );
    assert!(seen[3] > seen[1], "{seen:?}");
    // SSH clients and agents are shown the renewed host certificate, not the one the proxy
    // started with (which has expired by now): OpenSSH's client on the web port (plain SSH is
    // multiplexed there) reports the certificate whose key is that of the identity saved last
    // (every renewal brings a fresh key).
    let ssh = svc_testkit::require("ssh", "openssh-client");
    let keygen = svc_testkit::require("ssh-keygen", "openssh-client");
    let port = proxy.addrs().web.port().to_string();
    let cert_file = dir.path().join("saved-cert.pub");
    let deadline = tokio::time::Instant::now() + STEP;
    loop {
        let saved = ClientIdentity::load(&path).expect("identity");
        std::fs::write(&cert_file, format!("{}\n", saved.ssh_cert.trim())).expect("write cert");
        let listed = tokio::process::Command::new(&keygen)
            .arg("-l")
            .arg("-f")
            .arg(&cert_file)
            .output()
            .await
            .expect("run ssh-keygen");
        let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
        let saved_fp = listed
            .split_whitespace()
            .find(|w| w.starts_with("SHA256:"))
            .unwrap_or_else(|| panic!("no fingerprint in ssh-keygen -l: {listed}"))
            .to_owned();
        let out = tokio::time::timeout(
            Duration::from_secs(20),
            tokio::process::Command::new(&ssh)
                .args(["-v", "-F", "/dev/null", "-p", &port])
                .args([
                    "-o",
                    "StrictHostKeyChecking=no",
                    "-o",
                    "UserKnownHostsFile=/dev/null",
                ])
                .args(["-o", "BatchMode=yes", "-o", "ConnectTimeout=5"])
                .args(["nobody@127.0.0.1", "true"])
                .output(),
        )
        .await
        .expect("ssh finished within 20 s")
        .expect("run ssh");
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        let served = log
            .lines()
            .find(|l| l.contains("Server host certificate:"))
            .unwrap_or_default()
            .to_owned();
        if served.contains(&saved_fp) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the proxy still serves another host certificate than its renewed one ({saved_fp}): {served:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // The first short-lived certificate has expired by now (renewals come a third of the
    // lifetime before the end); the proxy still reaches the Auth Service: a sign-in works.
    let admin = admin(&auth.service).await;
    auth.service
        .create_user(
            &admin,
            User::new("alice", ["access"]),
            &Secret::new(PASSWORD.into()),
        )
        .await
        .expect("create alice");
    let web = proxy.addrs().web.to_string();
    let signed =
        svc_net::client::login_via_proxy(&web, true, None, "alice", &Secret::new(PASSWORD.into()), None)
            .await;
    assert!(
        signed.is_ok(),
        "sign-in through the renewed proxy: {:?}",
        signed.err()
    );
    proxy.shutdown().await;
    auth.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_ins_fail_fast_naming_the_auth_service_while_it_is_down() {
    let auth = start_auth().await;
    let pin = auth.service.ca_pin();
    let dir = tempfile::tempdir().expect("tempdir");
    let proxy_token = token(&auth.service, JoinRole::Proxy).await;
    let config = proxy_config(dir.path(), &[auth.addr.to_string()], &proxy_token, &pin);
    let proxy = svc_net::ProxyServer::from_config(&config)
        .start_joined()
        .await
        .expect("the proxy apart starts");
    auth.stop.cancel();
    // The listener is gone: connections are refused at once. A sign-in is answered with the
    // reason, naming the address, well within the proxy's sign-in deadline.
    let web = proxy.addrs().web.to_string();
    let err = tokio::time::timeout(
        svc_net::proxy::node::SIGN_IN_DEADLINE + STEP,
        svc_net::client::login_via_proxy(&web, true, None, "alice", &Secret::new(PASSWORD.into()), None),
    )
    .await
    .expect("a sign-in never hangs")
    .expect_err("no sign-in without the Auth Service");
    let text = err.to_string();
    assert!(
        text.contains("Auth Service") && text.contains(&auth.addr.to_string()),
        "{text}"
    );
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_apart_can_reach_the_auth_service_through_another_proxys_web_port() {
    let auth = start_auth().await;
    let pin = auth.service.ca_pin();
    let first_dir = tempfile::tempdir().expect("tempdir");
    let first_token = token(&auth.service, JoinRole::Proxy).await;
    let first = svc_net::ProxyServer::from_config(&proxy_config(
        first_dir.path(),
        &[auth.addr.to_string()],
        &first_token,
        &pin,
    ))
    .start_joined()
    .await
    .expect("the first proxy apart starts");
    // The second knows only the first proxy's web port: the join, the watch and the sign-ins
    // reach the Auth API under TLS routing (ALPN `svc-auth@`), end to end with the Auth
    // Service's TLS.
    let via = first.addrs().web.to_string();
    let second_dir = tempfile::tempdir().expect("tempdir");
    let second_token = token(&auth.service, JoinRole::Proxy).await;
    let mut config = proxy_config(second_dir.path(), &[via], &second_token, &pin);
    config.svc.nodename = "proxy-2".into();
    let second = svc_net::ProxyServer::from_config(&config)
        .start_joined()
        .await
        .expect("the second proxy apart starts through the first's web port");
    let admin = admin(&auth.service).await;
    auth.service
        .create_user(
            &admin,
            User::new("alice", ["access"]),
            &Secret::new(PASSWORD.into()),
        )
        .await
        .expect("create alice");
    let web = second.addrs().web.to_string();
    let signed =
        svc_net::client::login_via_proxy(&web, true, None, "alice", &Secret::new(PASSWORD.into()), None)
            .await;
    assert!(
        signed.is_ok(),
        "sign-in through the second proxy: {:?}",
        signed.err()
    );
    second.shutdown().await;
    first.shutdown().await;
    auth.stop.cancel();
}
