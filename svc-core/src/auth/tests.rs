use std::sync::Arc;
use std::time::Duration;

use rcgen::{KeyPair, PublicKeyData};
use ssh_key::private::Ed25519Keypair;

use super::*;
use crate::backend::MemoryBackend;
use crate::clock::ManualClock;
use crate::resource::parse_resources;

const SPEC_ROLE: &str = "kind: role\nversion: v7\nmetadata:\n  name: maintenance-admin\nspec:\n  allow:\n    rules:\n    - resources: [cluster_maintenance_config]\n      verbs: [create, read, update, delete]\n";
const MAINTENANCE: &str = "kind: cluster_maintenance_config\nversion: v1\nmetadata:\n  name: cluster-maintenance-config\nspec:\n  agent_upgrades:\n    utc_start_hour: 2\n    weekdays: [Mon]\n";

struct Fixture {
    auth: AuthService,
    clock: Arc<ManualClock>,
}

async fn fixture() -> Fixture {
    let clock = Arc::new(ManualClock::at_unix(1_800_000_000));
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::with_options(clock.clone(), 64));
    let auth = AuthService::open(backend, "example.com", clock.clone())
        .await
        .unwrap();
    Fixture { auth, clock }
}

fn keys() -> (Vec<u8>, PublicKey) {
    let tls = KeyPair::generate().unwrap();
    let ssh = ssh_key::PrivateKey::from(Ed25519Keypair::from_seed(&[7; 32]));
    (tls.subject_public_key_info(), ssh.public_key().clone())
}

fn admin(auth: &AuthService) -> Caller {
    let (tls, ssh) = keys();
    let req = HostCertRequest {
        host_uuid: uuid::Uuid::new_v4(),
        node_name: "auth".into(),
        roles: vec![SystemRole::Auth],
        additional_names: vec![],
        ttl: Duration::from_secs(3600),
    };
    let certs = auth.issue_host_certs(&req, &tls, &ssh).unwrap();
    match auth
        .verifier()
        .verify_any_x509(&[certs.tls_cert], auth.clock.now())
        .unwrap()
    {
        Identity::Host(h) => Caller::Admin(h),
        other => panic!("{other:?}"),
    }
}

fn proxy(auth: &AuthService) -> Caller {
    match admin(auth) {
        Caller::Admin(mut h) => {
            h.roles = vec![SystemRole::Proxy];
            Caller::Host(h)
        }
        other => other,
    }
}

async fn login(f: &Fixture, user: &str, password: &str) -> Result<Caller, AuthError> {
    let (tls, ssh) = keys();
    let req = LoginRequest {
        username: user.into(),
        password: Secret::new(password.into()),
        tls_public_key: tls,
        ssh_public_key: ssh,
        ttl: None,
        source: None,
    };
    let certs = f.auth.login(&proxy(&f.auth), &req).await?;
    f.auth.authenticate(&[certs.tls_cert]).await
}

#[tokio::test]
async fn the_specification_procedure_on_the_domain() {
    let f = fixture().await;
    let admin = admin(&f.auth);
    f.auth
        .create_user(
            &admin,
            User::new("alice", ["editor"]),
            &Secret::new("password123".into()),
        )
        .await
        .unwrap();
    assert!(matches!(
        login(&f, "alice", "wrong-password").await,
        Err(AuthError::BadCredentials)
    ));
    assert!(matches!(
        login(&f, "nobody", "password123").await,
        Err(AuthError::BadCredentials)
    ));
    let alice = login(&f, "alice", "password123").await.unwrap();

    f.auth
        .put_resources(&alice, parse_resources(SPEC_ROLE).unwrap(), false)
        .await
        .unwrap();
    let user = f
        .auth
        .set_user_roles(&alice, "alice", vec!["editor".into(), "maintenance-admin".into()])
        .await
        .unwrap();
    assert_eq!(user.spec.roles, ["editor", "maintenance-admin"]);

    // Roles live in the certificate: the old one is still refused.
    let err = f
        .auth
        .put_resources(&alice, parse_resources(MAINTENANCE).unwrap(), false)
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "access denied to perform action \"create\" on \"cluster_maintenance_config\""
    );
    let alice = login(&f, "alice", "password123").await.unwrap();
    let written = f
        .auth
        .put_resources(&alice, parse_resources(MAINTENANCE).unwrap(), false)
        .await
        .unwrap();
    assert_eq!(written[0].kind, Kind::ClusterMaintenanceConfig);
    assert!(!written[0].updated);
    // Without -f a second create is refused; with it, it is an update.
    assert!(matches!(
        f.auth
            .put_resources(&alice, parse_resources(MAINTENANCE).unwrap(), false)
            .await,
        Err(AuthError::AlreadyExists(_))
    ));
    let written = f
        .auth
        .put_resources(&alice, parse_resources(MAINTENANCE).unwrap(), true)
        .await
        .unwrap();
    assert!(written[0].updated);
}

#[tokio::test]
async fn a_stale_revision_is_a_conflict() {
    let f = fixture().await;
    let admin = admin(&f.auth);
    f.auth
        .put_resources(&admin, parse_resources(SPEC_ROLE).unwrap(), false)
        .await
        .unwrap();
    let read = f
        .auth
        .get_resource(&admin, Kind::Role, "maintenance-admin", false)
        .await
        .unwrap();
    f.auth
        .put_resources(&admin, vec![read.clone()], true)
        .await
        .unwrap();
    let err = f.auth.put_resources(&admin, vec![read], true).await.unwrap_err();
    assert!(matches!(err, AuthError::Conflict { .. }), "{err}");
}

#[tokio::test]
async fn tokens_admit_once_before_expiry_and_only_their_roles() {
    let f = fixture().await;
    let admin = admin(&f.auth);
    let token = f
        .auth
        .create_token(&admin, vec![JoinRole::Node], None)
        .await
        .unwrap();
    let (tls, ssh) = keys();
    let mut req = JoinRequest {
        token: token.value().clone(),
        node_name: "node-1".into(),
        roles: vec![SystemRole::Db],
        additional_names: vec![],
        tls_public_key: tls,
        ssh_public_key: ssh,
        source: None,
    };
    let refused = |r: Result<IssuedCerts, AuthError>| match r {
        Err(AuthError::JoinRefused(m)) => m,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert_eq!(
        refused(f.auth.join(&req).await),
        "the join token does not allow a requested role"
    );
    req.roles = vec![SystemRole::Node];
    let certs = f.auth.join(&req).await.unwrap();
    let host = f
        .auth
        .verifier()
        .verify_host_x509(&[certs.tls_cert], f.clock.now(), Some(SystemRole::Node))
        .unwrap();
    assert_eq!(host.node_name, "node-1");
    assert!(uuid::Uuid::parse_str(host.host_id.trim_end_matches(".example.com")).is_ok());
    assert_eq!(
        refused(f.auth.join(&req).await),
        "the join token was already used"
    );
    req.token = Secret::new("bogus".into());
    assert_eq!(refused(f.auth.join(&req).await), "the join token is invalid");

    let token = f
        .auth
        .create_token(&admin, vec![JoinRole::Node], Some(Duration::from_secs(60)))
        .await
        .unwrap();
    req.token = token.value().clone();
    f.clock.advance(Duration::from_secs(61));
    assert_eq!(refused(f.auth.join(&req).await), "the join token has expired");
    // Long after, it is gone altogether.
    f.clock.advance(Duration::from_secs(2 * 3600));
    assert_eq!(refused(f.auth.join(&req).await), "the join token is invalid");
}

#[tokio::test]
async fn heartbeats_fill_the_inventory_until_they_stop() {
    let f = fixture().await;
    let admin = admin(&f.auth);
    let token = f
        .auth
        .create_token(&admin, vec![JoinRole::Node], None)
        .await
        .unwrap();
    let (tls, ssh) = keys();
    let certs = f
        .auth
        .join(&JoinRequest {
            token: token.value().clone(),
            node_name: "node-1".into(),
            roles: vec![SystemRole::Node],
            additional_names: vec![],
            tls_public_key: tls,
            ssh_public_key: ssh,
            source: None,
        })
        .await
        .unwrap();
    let node = f.auth.authenticate(&[certs.tls_cert]).await.unwrap();
    // A node may heartbeat but not read the inventory or write resources.
    assert!(f.auth.inventory(&node).await.is_err());
    f.auth
        .heartbeat(
            &node,
            Heartbeat {
                hostname: "node-1".into(),
                version: "17.0.0".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let rows = f.auth.inventory(&admin).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].services, ["node"]);
    assert_eq!(rows[0].upgrader, "");
    assert_eq!(
        rows[0].update_status, None,
        "an older agent reports no update status"
    );
    assert_eq!(rows[0].next_window, None);

    // The updater's last decision and the next window are stored as reported, the reason cut.
    let status = UpdateStatus {
        result: UpdateResult::RolledBack,
        from: "17.1.0".into(),
        to: "17.0.0".into(),
        reason: "x".repeat(MAX_REASON_LEN * 2),
        at: 1_764_000_000,
    };
    let window = NextWindow {
        start: 1_764_003_600,
        end: 1_764_007_200,
    };
    f.auth
        .heartbeat(
            &node,
            Heartbeat {
                hostname: "node-1".into(),
                version: "17.0.0".into(),
                upgrader: "unit".into(),
                upgrader_version: "17.0.0".into(),
                update_status: Some(status.clone()),
                next_window: Some(window),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let rows = f.auth.inventory(&admin).await.unwrap();
    let stored = rows[0].update_status.clone().expect("the update status");
    assert_eq!(stored.result, UpdateResult::RolledBack);
    assert_eq!((stored.from.as_str(), stored.to.as_str()), ("17.1.0", "17.0.0"));
    assert_eq!(stored.reason.len(), MAX_REASON_LEN);
    assert_eq!(rows[0].next_window, Some(window));
    assert_eq!(rows[0].upgrader, "unit");

    // A row stored before these fields existed still reads.
    let old: InventoryRow = serde_json::from_str(
        r#"{"server_id":"a","hostname":"h","services":["node"],"version":"16.0.0","upgrader":"","upgrader_version":"","last_seen":5}"#,
    )
    .unwrap();
    assert_eq!(old.update_status, None);
    f.clock.advance(HEARTBEAT_TTL + Duration::from_secs(1));
    assert!(f.auth.inventory(&admin).await.unwrap().is_empty());
}

#[tokio::test]
async fn secrets_are_stripped_unless_asked() {
    let f = fixture().await;
    let admin = admin(&f.auth);
    let github = "kind: github\nversion: v3\nmetadata:\n  name: gh\nspec:\n  client_id: id\n  client_secret: shh\n  redirect_url: https://example.com/cb\n  teams_to_roles:\n  - organization: org\n    team: admins\n    roles: [editor]\n  signing_key_pair:\n    private_key: PRIVATE\n    cert: CERT\n";
    f.auth
        .put_resources(&admin, parse_resources(github).unwrap(), false)
        .await
        .unwrap();
    let plain = f
        .auth
        .get_resource(&admin, Kind::Github, "gh", false)
        .await
        .unwrap();
    assert!(!plain.to_yaml().unwrap().contains("PRIVATE"));
    let full = f
        .auth
        .get_resource(&admin, Kind::Github, "gh", true)
        .await
        .unwrap();
    assert!(full.to_yaml().unwrap().contains("PRIVATE"));
}

#[tokio::test]
async fn the_pin_of_the_ca_certificate_is_the_status_pin() {
    let f = fixture().await;
    let host_ca = &f.auth.trusted()[0];
    assert_eq!(ca_pin_of_cert(host_ca.tls_cert_der()).unwrap(), f.auth.ca_pin());
    assert_eq!(f.auth.status(&admin(&f.auth)).ca_pin, f.auth.ca_pin());
}

#[tokio::test]
async fn two_agents_racing_with_one_token_get_one_identity() {
    let f = fixture().await;
    let admin = admin(&f.auth);
    let token = f
        .auth
        .create_token(&admin, vec![JoinRole::Node], None)
        .await
        .unwrap();
    let request = || {
        let (tls, ssh) = keys();
        JoinRequest {
            token: token.value().clone(),
            node_name: "racer".into(),
            roles: vec![SystemRole::Node],
            additional_names: vec![],
            tls_public_key: tls,
            ssh_public_key: ssh,
            source: None,
        }
    };
    let (a, b) = (request(), request());
    let (ra, rb) = tokio::join!(f.auth.join(&a), f.auth.join(&b));
    assert_eq!(ra.is_ok() as u8 + rb.is_ok() as u8, 1, "{ra:?} {rb:?}");
    // A spent token no longer lists.
    assert!(
        f.auth
            .list_resources(&admin, Kind::Token, false)
            .await
            .unwrap()
            .is_empty()
    );
}

/// Every resource call checks its verb on its kind: a user whose only role allows `read` on
/// roles may read one role and nothing else, and each denial names the verb and the kind.
#[tokio::test]
async fn every_call_checks_its_verb_on_its_kind() {
    let f = fixture().await;
    let admin = admin(&f.auth);
    let reader_role = "kind: role\nversion: v7\nmetadata:\n  name: role-reader\nspec:\n  allow:\n    rules:\n    - resources: [role]\n      verbs: [read]\n";
    f.auth
        .put_resources(&admin, parse_resources(reader_role).unwrap(), false)
        .await
        .unwrap();
    f.auth
        .create_user(
            &admin,
            User::new("rita", ["role-reader"]),
            &Secret::new("password123".into()),
        )
        .await
        .unwrap();
    f.auth
        .put_resources(&admin, parse_resources(MAINTENANCE).unwrap(), false)
        .await
        .unwrap();
    let rita = login(&f, "rita", "password123").await.unwrap();
    let denied = |r: Result<(), AuthError>, verb: &str, kind: &str| match r {
        Err(AuthError::AccessDenied(d)) => {
            assert_eq!(
                d.to_string(),
                format!("access denied to perform action \"{verb}\" on \"{kind}\"")
            )
        }
        other => panic!("{verb} {kind}: expected a denial, got {other:?}"),
    };
    f.auth
        .get_resource(&rita, Kind::Role, "editor", false)
        .await
        .unwrap();
    let samples = [
        (Kind::Role, "editor", reader_role.to_owned()),
        (
            Kind::ClusterMaintenanceConfig,
            "cluster-maintenance-config",
            MAINTENANCE.to_owned(),
        ),
        (
            Kind::User,
            "rita",
            "kind: user\nversion: v2\nmetadata:\n  name: rita\nspec:\n  roles: [editor]\n".to_owned(),
        ),
    ];
    for (kind, name, text) in samples {
        let k = kind.as_str();
        if kind != Kind::Role {
            denied(
                f.auth.get_resource(&rita, kind, name, false).await.map(drop),
                "read",
                k,
            );
        }
        denied(
            f.auth.list_resources(&rita, kind, false).await.map(drop),
            "list",
            k,
        );
        denied(
            f.auth
                .put_resources(&rita, parse_resources(&text).unwrap(), true)
                .await
                .map(drop),
            "update",
            k,
        );
        denied(f.auth.delete_resource(&rita, kind, name).await, "delete", k);
    }
    let new_role = SPEC_ROLE.replace("maintenance-admin", "brand-new");
    denied(
        f.auth
            .put_resources(&rita, parse_resources(&new_role).unwrap(), false)
            .await
            .map(drop),
        "create",
        "role",
    );
    denied(
        f.auth
            .set_user_roles(&rita, "rita", vec!["editor".into()])
            .await
            .map(drop),
        "update",
        "user",
    );
    denied(
        f.auth
            .create_user(
                &rita,
                User::new("eve", ["editor"]),
                &Secret::new("password123".into()),
            )
            .await,
        "create",
        "user",
    );
    denied(
        f.auth
            .create_token(&rita, vec![JoinRole::Node], None)
            .await
            .map(drop),
        "create",
        "token",
    );
    denied(f.auth.inventory(&rita).await.map(drop), "list", "inventory");
}

/// Agents read the maintenance window (to export it to their updaters) and nothing else.
#[tokio::test]
async fn agents_read_the_maintenance_window_and_nothing_more() {
    let f = fixture().await;
    f.auth
        .put_resources(&admin(&f.auth), parse_resources(MAINTENANCE).unwrap(), false)
        .await
        .unwrap();
    let agent = match proxy(&f.auth) {
        Caller::Host(mut h) => {
            h.roles = vec![SystemRole::Node];
            Caller::Host(h)
        }
        other => panic!("{other:?}"),
    };
    let window = f
        .auth
        .get_resource(
            &agent,
            Kind::ClusterMaintenanceConfig,
            "cluster-maintenance-config",
            false,
        )
        .await
        .unwrap();
    assert_eq!(window.kind(), Kind::ClusterMaintenanceConfig);
    let refused = [
        f.auth
            .list_resources(&agent, Kind::ClusterMaintenanceConfig, false)
            .await
            .map(drop),
        f.auth
            .put_resources(&agent, parse_resources(MAINTENANCE).unwrap(), true)
            .await
            .map(drop),
        f.auth
            .delete_resource(
                &agent,
                Kind::ClusterMaintenanceConfig,
                "cluster-maintenance-config",
            )
            .await,
        f.auth
            .get_resource(&agent, Kind::Role, "editor", false)
            .await
            .map(drop),
    ];
    for r in refused {
        assert!(matches!(r, Err(AuthError::AccessDenied(_))), "{r:?}");
    }
}

/// A host caller with `roles` (issued in-process, as `svc start` does for its own agent).
fn host_with(auth: &AuthService, roles: Vec<SystemRole>) -> Caller {
    match admin(auth) {
        Caller::Admin(mut h) => {
            h.roles = roles;
            // Every host of a test is another agent: node names are unique per cluster.
            h.node_name = format!("host-{}", &h.host_id[..8]);
            Caller::Host(h)
        }
        other => other,
    }
}

/// A user certificate (DER) for `user` signed in with `password`.
async fn user_cert(f: &Fixture, user: &str, password: &str) -> CertificateDer<'static> {
    let (tls, ssh) = keys();
    let req = LoginRequest {
        username: user.into(),
        password: Secret::new(password.into()),
        tls_public_key: tls,
        ssh_public_key: ssh,
        ttl: None,
        source: None,
    };
    f.auth.login(&proxy(&f.auth), &req).await.unwrap().tls_cert
}

#[tokio::test]
async fn resources_resolve_for_users_their_labels_allow() {
    let f = fixture().await;
    let admin = admin(&f.auth);
    let prod_only = "kind: role\nversion: v7\nmetadata:\n  name: prod-apps\nspec:\n  allow:\n    app_labels:\n      env: prod\n";
    f.auth
        .put_resources(&admin, parse_resources(prod_only).unwrap(), false)
        .await
        .unwrap();
    for (name, role) in [("alice", "access"), ("bob", "prod-apps")] {
        f.auth
            .create_user(
                &admin,
                User::new(name, [role]),
                &Secret::new("correct horse".into()),
            )
            .await
            .unwrap();
    }
    let agent = host_with(&f.auth, vec![SystemRole::Node, SystemRole::App, SystemRole::Db]);
    let mut grafana = ServedResource::new(ServedKind::App, "grafana");
    grafana.labels.insert("env".into(), "dev".into());
    grafana.target = "http://127.0.0.1:3000".into();
    let mut shop = ServedResource::new(ServedKind::App, "shop");
    shop.labels.insert("env".into(), "prod".into());
    let pg = ServedResource::new(ServedKind::Db, "pg");
    f.auth
        .heartbeat(
            &agent,
            Heartbeat {
                hostname: "agent-1".into(),
                resources: vec![grafana.clone(), shop, pg],
                ..Default::default()
            },
        )
        .await
        .unwrap();

    // A user resolves for themselves; a proxy resolves for the user whose certificate it holds.
    let alice = login(&f, "alice", "correct horse").await.unwrap();
    let route = f
        .auth
        .resolve_resource(&alice, None, ServedKind::App, "grafana")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(route.hostname, "agent-1");
    assert_eq!(route.resource, grafana);
    let bob = user_cert(&f, "bob", "correct horse").await;
    let via_proxy = |name: &'static str, kind| {
        let (auth, proxy, bob) = (&f.auth, proxy(&f.auth), bob.clone());
        async move {
            auth.resolve_resource(&proxy, Some(&[bob]), kind, name)
                .await
                .unwrap()
        }
    };
    assert_eq!(
        via_proxy("shop", ServedKind::App).await.unwrap().resource.name,
        "shop"
    );
    assert_eq!(
        via_proxy("grafana", ServedKind::App)
            .await
            .unwrap_err()
            .to_string(),
        "access denied to app \"grafana\": the roles of user bob do not allow its labels"
    );
    assert_eq!(
        via_proxy("pg", ServedKind::Db).await.unwrap_err().to_string(),
        "access denied to db \"pg\": the roles of user bob do not allow its labels"
    );
    assert_eq!(
        via_proxy("nope", ServedKind::App).await.unwrap_err().to_string(),
        "app \"nope\" not found: no connected agent serves it"
    );
    // Listing shows only what the labels allow.
    let names = |routes: Vec<ResourceRoute>| routes.into_iter().map(|r| r.resource.name).collect::<Vec<_>>();
    assert_eq!(
        names(f.auth.list_served(&alice, None, ServedKind::App).await.unwrap()),
        ["grafana", "shop"]
    );
    assert_eq!(
        names(
            f.auth
                .list_served(&proxy(&f.auth), Some(std::slice::from_ref(&bob)), ServedKind::App)
                .await
                .unwrap()
        ),
        ["shop"]
    );
    // Neither another host nor a proxy without a user certificate may ask.
    assert!(
        f.auth
            .resolve_resource(&agent, None, ServedKind::App, "shop")
            .await
            .is_err()
    );
    assert!(
        f.auth
            .resolve_resource(&proxy(&f.auth), None, ServedKind::App, "shop")
            .await
            .is_err()
    );
    assert!(
        f.auth
            .resolve_resource(&agent, Some(std::slice::from_ref(&bob)), ServedKind::App, "shop")
            .await
            .is_err()
    );

    // An agent cannot announce a kind its certificate has no role for.
    let node = host_with(&f.auth, vec![SystemRole::Node]);
    let err = f
        .auth
        .heartbeat(
            &node,
            Heartbeat {
                resources: vec![ServedResource::new(ServedKind::Kube, "k8s")],
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("kube_cluster"), "{err}");

    // Resources expire with the heartbeat.
    f.clock.advance(HEARTBEAT_TTL + Duration::from_secs(1));
    assert!(
        f.auth
            .list_served(&alice, None, ServedKind::App)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn a_proxy_finds_the_listener_a_directly_joined_agent_announced() {
    let f = fixture().await;
    let agent = match host_with(&f.auth, vec![SystemRole::Node, SystemRole::Kube]) {
        Caller::Host(mut h) => {
            h.node_name = "edge-1".into();
            Caller::Host(h)
        }
        other => other,
    };
    let Caller::Host(host) = &agent else {
        panic!("a host caller")
    };
    let host_id = host.host_id.clone();
    let mut node = ServedResource::new(ServedKind::Node, "edge-1");
    node.direct_addr = "10.0.0.7:3022".into();
    let mut kube = ServedResource::new(ServedKind::Kube, "k8s");
    kube.direct_addr = "10.0.0.7:3026".into();
    f.auth
        .heartbeat(
            &agent,
            Heartbeat {
                hostname: "edge-1".into(),
                resources: vec![node, kube],
                // The agent's own address, as the Auth API sees its heartbeat.
                source: Some("10.0.0.7".parse().unwrap()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let proxy = proxy(&f.auth);
    let uuid = host_id.split('.').next().unwrap().to_owned();
    for server in ["edge-1", host_id.as_str(), uuid.as_str()] {
        assert_eq!(
            f.auth
                .direct_route(&proxy, server, ServedKind::Node)
                .await
                .unwrap()
                .map(|r| (r.server_id, r.resource.direct_addr)),
            Some((host_id.clone(), "10.0.0.7:3022".to_owned())),
            "{server}"
        );
    }
    assert_eq!(
        f.auth
            .direct_route(&proxy, &host_id, ServedKind::Kube)
            .await
            .unwrap()
            .map(|r| r.resource.direct_addr)
            .as_deref(),
        Some("10.0.0.7:3026")
    );
    assert_eq!(
        f.auth
            .direct_route(&proxy, "edge-1", ServedKind::WindowsDesktop)
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        f.auth
            .direct_route(&proxy, "other", ServedKind::Node)
            .await
            .unwrap(),
        None
    );
    // Only proxies ask: an agent cannot learn another agent's listener.
    assert!(
        f.auth
            .direct_route(&agent, "edge-1", ServedKind::Node)
            .await
            .is_err()
    );
}

async fn login_from(f: &Fixture, user: &str, password: &str, source: &str) -> Result<Caller, AuthError> {
    let (tls, ssh) = keys();
    let req = LoginRequest {
        username: user.into(),
        password: Secret::new(password.into()),
        tls_public_key: tls,
        ssh_public_key: ssh,
        ttl: None,
        source: Some(source.parse().unwrap()),
    };
    let certs = f.auth.login(&proxy(&f.auth), &req).await?;
    f.auth.authenticate(&[certs.tls_cert]).await
}

#[tokio::test]
async fn five_wrong_passwords_lock_the_user_and_then_the_right_one_is_refused_too() {
    let f = fixture().await;
    let admin = admin(&f.auth);
    f.auth
        .create_user(
            &admin,
            User::new("alice", ["access"]),
            &Secret::new("password123".into()),
        )
        .await
        .unwrap();
    // The guesses come from five different addresses: the lock is on the user.
    for i in 1..=5 {
        let e = login_from(&f, "alice", "guess-guess", &format!("198.51.100.{i}"))
            .await
            .unwrap_err();
        assert_eq!(e.to_string(), "invalid username or password", "attempt {i}");
    }
    let e = login_from(&f, "alice", "password123", "192.0.2.1")
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "sign-in refused: user \"alice\" is locked after 5 failed attempts; try again after 2027-01-15T08:30:00Z"
    );
    assert!(matches!(e, AuthError::Limited { .. }));
    f.clock.advance(Duration::from_secs(30 * 60));
    login_from(&f, "alice", "password123", "192.0.2.1")
        .await
        .expect("the lock ended after 30 minutes");
}

#[tokio::test]
async fn configured_limits_lock_a_guessing_address_for_sign_ins_and_joins() {
    let f = fixture().await;
    let f = Fixture {
        auth: f
            .auth
            .with_login_limits(LoginLimits::new(100, 3, Duration::from_secs(60))),
        clock: f.clock,
    };
    let admin = admin(&f.auth);
    f.auth
        .create_user(
            &admin,
            User::new("bob", ["access"]),
            &Secret::new("password123".into()),
        )
        .await
        .unwrap();
    // Three failed joins with made-up tokens from one address.
    let token = f
        .auth
        .create_token(&admin, vec![JoinRole::Node], None)
        .await
        .unwrap();
    let (tls, ssh) = keys();
    let mut req = JoinRequest {
        token: Secret::new("guessed-token".into()),
        node_name: "n".into(),
        roles: vec![SystemRole::Node],
        additional_names: vec![],
        tls_public_key: tls,
        ssh_public_key: ssh,
        source: Some("203.0.113.5".parse().unwrap()),
    };
    for _ in 0..3 {
        assert!(matches!(f.auth.join(&req).await, Err(AuthError::JoinRefused(_))));
    }
    // Now even the real token is refused from there, and not spent.
    req.token = token.value().clone();
    let e = f.auth.join(&req).await.unwrap_err();
    assert!(
        e.to_string()
            .starts_with("join refused: source address 203.0.113.5 is locked after 3 failed attempts"),
        "{e}"
    );
    // The address is locked for sign-ins too, the right password included.
    let e = login_from(&f, "bob", "password123", "203.0.113.5")
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("sign-in refused: source address 203.0.113.5 is locked"),
        "{e}"
    );
    // Elsewhere both work.
    req.source = Some("203.0.113.6".parse().unwrap());
    f.auth.join(&req).await.expect("the token was left unspent");
    login_from(&f, "bob", "password123", "203.0.113.6").await.unwrap();
    // After the configured lockout (60 s), the address may try again.
    f.clock.advance(Duration::from_secs(60));
    login_from(&f, "bob", "password123", "203.0.113.5").await.unwrap();
}

/// One runtime thread: if argon2 ran on it, nothing else could run until every check was done.
#[tokio::test(flavor = "current_thread")]
async fn a_storm_of_bogus_logins_does_not_hold_up_heartbeats() {
    let mut f = fixture().await;
    // One argon2 worker, so the storm queues.
    f.auth.passwords = PasswordPool::new(1, 64);
    let admin = admin(&f.auth);
    let token = f
        .auth
        .create_token(&admin, vec![JoinRole::Node], None)
        .await
        .unwrap();
    let (tls, ssh) = keys();
    let certs = f
        .auth
        .join(&JoinRequest {
            token: token.value().clone(),
            node_name: "node-1".into(),
            roles: vec![SystemRole::Node],
            additional_names: vec![],
            tls_public_key: tls,
            ssh_public_key: ssh,
            source: None,
        })
        .await
        .unwrap();
    let node = f.auth.authenticate(&[certs.tls_cert]).await.unwrap();
    let auth = Arc::new(f.auth);
    let proxy = proxy(&auth);
    let storm: Vec<_> = (0..20)
        .map(|i| {
            let (auth, proxy) = (auth.clone(), proxy.clone());
            tokio::spawn(async move {
                let (tls, ssh) = keys();
                let req = LoginRequest {
                    username: format!("ghost-{i}"),
                    password: Secret::new("not-a-password".into()),
                    tls_public_key: tls,
                    ssh_public_key: ssh,
                    ttl: None,
                    source: Some(format!("198.51.100.{i}").parse().unwrap()),
                };
                auth.login(&proxy, &req).await
            })
        })
        .collect();
    // Wait (with a deadline) until the pool is busy and callers queue behind it.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while auth.password_load().0 < 1 || auth.password_load().1 < 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the storm never reached the password pool: {:?}",
            auth.password_load()
        );
        tokio::task::yield_now().await;
    }
    let started = std::time::Instant::now();
    auth.heartbeat(
        &node,
        Heartbeat {
            hostname: "node-1".into(),
            version: "17.0.0".into(),
            ..Default::default()
        },
    )
    .await
    .expect("heartbeat during the storm");
    let took = started.elapsed();
    let (running, waiting) = auth.password_load();
    assert!(
        running + waiting >= 1,
        "the heartbeat finished only after the storm: it was held up"
    );
    assert!(took < HEARTBEAT_INTERVAL, "heartbeat took {took:?}");
    println!("heartbeat during a 20-login storm: {took:?}, {running} check running, {waiting} waiting");
    for login in storm {
        let e = login.await.unwrap().unwrap_err();
        assert_eq!(e.to_string(), "invalid username or password");
    }
}

/// A user's OpenSSH certificate, signed in with `password`.
async fn user_ssh_cert(f: &Fixture, user: &str, password: &str) -> Certificate {
    let (tls, ssh) = keys();
    let req = LoginRequest {
        source: None,
        username: user.into(),
        password: Secret::new(password.into()),
        tls_public_key: tls,
        ssh_public_key: ssh,
        ttl: None,
    };
    f.auth.login(&proxy(&f.auth), &req).await.unwrap().ssh_cert
}

/// A node host named `name` (host role `node`).
fn node_host(auth: &AuthService, name: &str) -> Caller {
    match host_with(auth, vec![SystemRole::Node]) {
        Caller::Host(mut h) => {
            h.node_name = name.into();
            Caller::Host(h)
        }
        other => other,
    }
}

async fn announce(f: &Fixture, node: &Caller, labels: &[(&str, &str)]) -> Result<(), AuthError> {
    let Caller::Host(h) = node else { panic!("a host") };
    let mut r = ServedResource::new(ServedKind::Node, h.node_name.clone());
    r.labels = labels.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect();
    f.auth
        .heartbeat(
            node,
            Heartbeat {
                hostname: h.node_name.clone(),
                resources: vec![r],
                ..Default::default()
            },
        )
        .await
}

#[tokio::test]
async fn node_access_is_authorized_by_labels_deny_and_logins() {
    let f = fixture().await;
    let admin = admin(&f.auth);
    let roles = "kind: role\nversion: v7\nmetadata:\n  name: dev\nspec:\n  allow:\n    logins: [ubuntu]\n    node_labels:\n      env: dev\n---\nkind: role\nversion: v7\nmetadata:\n  name: no-prod\nspec:\n  deny:\n    node_labels:\n      env: prod\n";
    f.auth
        .put_resources(&admin, parse_resources(roles).unwrap(), false)
        .await
        .unwrap();
    for (name, user_roles) in [("dana", vec!["dev"]), ("erin", vec!["access", "no-prod"])] {
        f.auth
            .create_user(
                &admin,
                with_logins(User::new(name, user_roles), &["root"]),
                &Secret::new("correct horse".into()),
            )
            .await
            .unwrap();
    }
    let (dev, prod) = (node_host(&f.auth, "dev-1"), node_host(&f.auth, "prod-db"));
    announce(&f, &dev, &[("env", "dev")]).await.unwrap();
    announce(&f, &prod, &[("env", "prod")]).await.unwrap();
    let proxy = proxy(&f.auth);
    let dana = user_ssh_cert(&f, "dana", "correct horse").await;
    let ask = |caller: Caller, cert: Certificate, node: &'static str, login: &'static str| {
        let auth = &f.auth;
        async move {
            auth.authorize_node(&caller, &cert, node, login)
                .await
                .unwrap()
                .map(|r| r.hostname)
                .map_err(|e| e.to_string())
        }
    };
    assert_eq!(
        ask(proxy.clone(), dana.clone(), "dev-1", "ubuntu").await.unwrap(),
        "dev-1"
    );
    assert_eq!(
        ask(proxy.clone(), dana.clone(), "prod-db", "ubuntu")
            .await
            .unwrap_err(),
        "access denied to node \"prod-db\": the roles of user dana do not allow its labels"
    );
    assert_eq!(
        ask(proxy.clone(), dana.clone(), "dev-1", "postgres")
            .await
            .unwrap_err(),
        "access denied to node \"dev-1\" as login \"postgres\": the roles of user dana do not allow this login"
    );
    assert_eq!(
        ask(proxy.clone(), dana.clone(), "nowhere", "ubuntu")
            .await
            .unwrap_err(),
        "node \"nowhere\" not found: no connected agent serves it"
    );
    // Deny beats allow: `access` allows every node, `no-prod` denies env=prod.
    let erin = user_ssh_cert(&f, "erin", "correct horse").await;
    assert_eq!(
        ask(proxy.clone(), erin.clone(), "dev-1", "root").await.unwrap(),
        "dev-1"
    );
    assert_eq!(
        ask(proxy.clone(), erin.clone(), "prod-db", "root")
            .await
            .unwrap_err(),
        "access denied to node \"prod-db\": role no-prod of user erin denies its labels"
    );
    // The node asks about itself, by its host ID; it cannot ask about another node.
    let Caller::Host(prod_host) = &prod else { panic!() };
    let prod_id: &'static str = Box::leak(prod_host.host_id.clone().into_boxed_str());
    assert_eq!(
        ask(prod.clone(), erin.clone(), prod_id, "root")
            .await
            .unwrap_err(),
        "access denied to node \"prod-db\": role no-prod of user erin denies its labels"
    );
    assert!(f.auth.authorize_node(&dev, &erin, prod_id, "root").await.is_err());
    // A user cannot ask for another user.
    let dana_caller = login(&f, "dana", "correct horse").await.unwrap();
    assert!(
        f.auth
            .authorize_node(&dana_caller, &dana, "dev-1", "ubuntu")
            .await
            .is_err()
    );
}

#[tokio::test]
async fn a_live_node_name_is_held_by_one_agent() {
    let f = fixture().await;
    let real = node_host(&f.auth, "prod-db");
    announce(&f, &real, &[("env", "prod")]).await.unwrap();
    // A second agent with the same name cannot heartbeat (or announce the node) ...
    let rogue = node_host(&f.auth, "prod-db");
    let err = announce(&f, &rogue, &[]).await.unwrap_err().to_string();
    assert!(
        err.starts_with("node name \"prod-db\" is already held by another live agent (host "),
        "{err}"
    );
    // ... nor join under it.
    let admin = admin(&f.auth);
    let token = f
        .auth
        .create_token(&admin, vec![JoinRole::Node], None)
        .await
        .unwrap();
    let (tls, ssh) = keys();
    let mut req = JoinRequest {
        source: None,
        token: token.value().clone(),
        node_name: "prod-db".into(),
        roles: vec![SystemRole::Node],
        additional_names: vec![],
        tls_public_key: tls,
        ssh_public_key: ssh,
    };
    let err = f.auth.join(&req).await.unwrap_err().to_string();
    assert!(err.starts_with("node name \"prod-db\" is already held"), "{err}");
    // An agent cannot announce a node under a name its certificate does not carry.
    let other = node_host(&f.auth, "other");
    let Caller::Host(h) = &other else { panic!() };
    let err = f
        .auth
        .heartbeat(
            &other,
            Heartbeat {
                hostname: h.node_name.clone(),
                resources: vec![ServedResource::new(ServedKind::Node, "prod-db")],
                ..Default::default()
            },
        )
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "invalid request: served node \"prod-db\": the agent's certificate names node \"other\""
    );
    // Releasing the name (the in-process agent of a restarted Auth Service) frees it at once,
    // and takes the previous holder's announcement with it: a dial by name must not pick a host
    // ID whose tunnel will not come back while the new agent's first heartbeat is on its way.
    let serves_prod_db = |entries: Vec<super::rules::ServedEntry>| {
        entries
            .iter()
            .any(|e| e.resources.iter().any(|r| r.name == "prod-db"))
    };
    assert!(serves_prod_db(f.auth.rules.served_entries().await.unwrap()));
    f.auth.release_node_name("prod-db").await.unwrap();
    assert!(!serves_prod_db(f.auth.rules.served_entries().await.unwrap()));
    announce(&f, &rogue, &[]).await.unwrap();
    assert!(announce(&f, &real, &[]).await.is_err());
    f.auth.release_node_name("prod-db").await.unwrap();
    // The real node keeps renewing; once it stops, the name is free again.
    announce(&f, &real, &[("env", "prod")]).await.unwrap();
    f.clock.advance(HEARTBEAT_TTL + Duration::from_secs(1));
    req.node_name = "prod-db".into();
    f.auth.join(&req).await.unwrap();
}

#[tokio::test]
async fn extra_certificate_names_are_checked_at_join() {
    let f = fixture().await;
    let mut auth = f.auth;
    auth.set_host_name_policy(HostNamePolicy {
        reserved: vec!["proxy.example.com".into()],
        allowed: vec!["db.internal".into()],
    });
    let admin = admin(&auth);
    let token = auth
        .create_token(&admin, vec![JoinRole::Node], None)
        .await
        .unwrap();
    let (tls, ssh) = keys();
    let mut req = JoinRequest {
        source: None,
        token: token.value().clone(),
        node_name: "db-1".into(),
        roles: vec![SystemRole::Node],
        additional_names: vec!["*.example.com".into()],
        tls_public_key: tls,
        ssh_public_key: ssh,
    };
    let mut refused = |names: &[&str], node: &str| {
        req.additional_names = names.iter().map(|n| (*n).to_owned()).collect();
        req.node_name = node.into();
        req.clone()
    };
    for (names, node, expected) in [
        (
            &["*.example.com"][..],
            "db-1",
            "join refused: certificate name \"*.example.com\": wildcard certificate names are not allowed",
        ),
        (
            &["PROXY.example.com"][..],
            "db-1",
            "join refused: certificate name \"PROXY.example.com\": it is a name of the cluster's Proxy or Auth Service",
        ),
        (
            &["github.com"][..],
            "db-1",
            "join refused: certificate name \"github.com\": not an extra name the join token or the Auth Service grants to agents",
        ),
        (
            &[][..],
            "proxy.example.com",
            "join refused: certificate name \"proxy.example.com\": it is a name of the cluster's Proxy or Auth Service",
        ),
        (
            &[][..],
            "*",
            "join refused: certificate name \"*\": wildcards are not allowed in a node name",
        ),
    ] {
        let r = refused(names, node);
        assert_eq!(auth.join(&r).await.unwrap_err().to_string(), expected);
    }
    // The token was not spent by the refusals; an allowed name joins.
    let ok = refused(&["db.internal"], "db-1");
    let certs = auth.join(&ok).await.unwrap();
    let host = auth
        .verifier()
        .verify_host_ssh(&certs.ssh_cert, auth.clock.now(), Some(SystemRole::Node))
        .unwrap();
    assert_eq!(host.additional_names, ["db.internal"]);
}

#[tokio::test]
async fn a_token_grants_extra_names_from_its_allow_list_only() {
    let f = fixture().await;
    let mut auth = f.auth;
    auth.set_host_name_policy(HostNamePolicy {
        reserved: vec!["proxy.example.com".into()],
        allowed: vec![],
    });
    let admin = admin(&auth);
    // Creating a token that grants a wildcard or a cluster name is refused at once.
    for (name, why) in [
        ("*.example.com", "wildcard certificate names are not allowed"),
        (
            "Proxy.Example.com",
            "it is a name of the cluster's Proxy or Auth Service",
        ),
        ("a b", "expected a host name"),
        ("", "expected a host name"),
    ] {
        let err = auth
            .create_token_with_names(&admin, vec![JoinRole::Node], None, vec![name.into()])
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("extra name {name:?}")) && err.contains(why),
            "{name}: {err}"
        );
    }
    let token = auth
        .create_token_with_names(&admin, vec![JoinRole::Node], None, vec!["edge-1.internal".into()])
        .await
        .unwrap();
    assert_eq!(token.spec.extra_names, ["edge-1.internal"]);
    let (tls, ssh) = keys();
    let mut req = JoinRequest {
        source: None,
        token: token.value().clone(),
        node_name: "edge-1".into(),
        roles: vec![SystemRole::Node],
        additional_names: vec!["edge-2.internal".into()],
        tls_public_key: tls,
        ssh_public_key: ssh,
    };
    assert_eq!(
        auth.join(&req).await.unwrap_err().to_string(),
        "join refused: certificate name \"edge-2.internal\": not an extra name the join token or the Auth Service grants to agents"
    );
    // Another token's grant does not carry over: a plain token grants nothing.
    let plain = auth
        .create_token(&admin, vec![JoinRole::Node], None)
        .await
        .unwrap();
    let mut other = req.clone();
    other.token = plain.value().clone();
    other.additional_names = vec!["edge-1.internal".into()];
    assert!(auth.join(&other).await.is_err());
    // The name the token grants joins (case-insensitively), and is in the certificate.
    req.additional_names = vec!["EDGE-1.internal".into()];
    let certs = auth.join(&req).await.unwrap();
    let host = auth
        .verifier()
        .verify_host_ssh(&certs.ssh_cert, auth.clock.now(), Some(SystemRole::Node))
        .unwrap();
    assert_eq!(host.additional_names, ["EDGE-1.internal"]);
}

#[tokio::test]
async fn a_denied_login_is_removed_from_the_users_traits_too() {
    let f = fixture().await;
    let admin = admin(&f.auth);
    let role = "kind: role\nversion: v7\nmetadata:\n  name: no-root\nspec:\n  deny:\n    logins: [root]\n";
    f.auth
        .put_resources(&admin, parse_resources(role).unwrap(), false)
        .await
        .unwrap();
    f.auth
        .create_user(
            &admin,
            with_logins(User::new("frank", ["access", "no-root"]), &["root", "ubuntu"]),
            &Secret::new("correct horse".into()),
        )
        .await
        .unwrap();
    let cert = user_ssh_cert(&f, "frank", "correct horse").await;
    let principals: Vec<&str> = cert.valid_principals().iter().map(String::as_str).collect();
    assert_eq!(principals, ["ubuntu"]);
}

fn with_logins(mut user: User, logins: &[&str]) -> User {
    user.spec
        .traits
        .insert("logins".into(), logins.iter().map(|l| (*l).to_owned()).collect());
    user
}

#[tokio::test]
async fn locks_deleted_users_and_removed_roles_revoke_node_access() {
    let f = fixture().await;
    let admin = admin(&f.auth);
    let dev_role = "kind: role\nversion: v7\nmetadata:\n  name: dev\nspec:\n  allow:\n    logins: [ubuntu]\n    node_labels:\n      env: dev\n";
    f.auth
        .put_resources(&admin, parse_resources(dev_role).unwrap(), false)
        .await
        .unwrap();
    for (name, roles) in [
        ("dana", vec!["dev"]),
        ("erin", vec!["access"]),
        ("gus", vec!["access"]),
    ] {
        f.auth
            .create_user(
                &admin,
                with_logins(User::new(name, roles), &["root"]),
                &Secret::new("correct horse".into()),
            )
            .await
            .unwrap();
    }
    let dev = node_host(&f.auth, "dev-1");
    announce(&f, &dev, &[("env", "dev")]).await.unwrap();
    let proxy = proxy(&f.auth);
    let (dana, erin, gus) = (
        user_ssh_cert(&f, "dana", "correct horse").await,
        user_ssh_cert(&f, "erin", "correct horse").await,
        user_ssh_cert(&f, "gus", "correct horse").await,
    );
    let ask = |cert: &Certificate, login: &str| {
        let (auth, proxy, cert, login) = (&f.auth, proxy.clone(), cert.clone(), login.to_owned());
        async move {
            auth.authorize_node(&proxy, &cert, "dev-1", &login)
                .await
                .unwrap()
                .map(|r| r.hostname)
                .map_err(|e| e.to_string())
        }
    };
    assert_eq!(ask(&erin, "root").await.unwrap(), "dev-1");

    // A user lock: every session and every API call of the user is refused.
    // A message that would drive the user's terminal is refused.
    let lock = Resource::Lock(crate::resource::Lock::user(
        "erin",
        Some("incident\x1b[2J 42".into()),
    ));
    assert_eq!(
        parse_resources(&lock.to_yaml().unwrap()).unwrap_err().to_string(),
        "spec.message: expected text without control characters"
    );
    let lock = Resource::Lock(crate::resource::Lock::user("erin", Some("incident 42".into())));
    f.auth.put_resources(&admin, vec![lock], false).await.unwrap();
    assert_eq!(
        ask(&erin, "root").await.unwrap_err(),
        "access refused: user \"erin\" is locked: incident 42"
    );
    let again = f
        .auth
        .caller(Identity::User(
            f.auth.verifier().verify_user_ssh(&erin, f.auth.now()).unwrap(),
        ))
        .await
        .unwrap_err();
    assert_eq!(
        again.to_string(),
        "access refused: user \"erin\" is locked: incident 42"
    );
    // Signing in again does not help.
    assert_eq!(
        login(&f, "erin", "correct horse").await.unwrap_err().to_string(),
        "access refused: user \"erin\" is locked: incident 42"
    );
    // Unlock: access returns.
    f.auth
        .delete_resource(&admin, Kind::Lock, "user-erin")
        .await
        .unwrap();
    assert_eq!(ask(&erin, "root").await.unwrap(), "dev-1");

    // A node lock refuses every user's session to that node, whatever name it is asked by.
    let lock = Resource::Lock(crate::resource::Lock::node("dev-1", None));
    f.auth.put_resources(&admin, vec![lock], false).await.unwrap();
    assert_eq!(
        ask(&gus, "root").await.unwrap_err(),
        "access refused: node \"dev-1\" is locked"
    );
    let Caller::Host(dev_host) = &dev else {
        panic!("a host")
    };
    assert_eq!(
        f.auth
            .authorize_node(&dev, &gus, &dev_host.host_id, "root")
            .await
            .unwrap()
            .unwrap_err()
            .to_string(),
        "access refused: node \"dev-1\" is locked"
    );
    f.auth
        .delete_resource(&admin, Kind::Lock, "node-dev-1")
        .await
        .unwrap();
    // An expired lock locks nothing.
    let mut expired = crate::resource::Lock::user("gus", None);
    expired.metadata.expires = Some(time::OffsetDateTime::from(f.auth.now()) - time::Duration::minutes(1));
    f.auth
        .put_resources(&admin, vec![Resource::Lock(expired)], false)
        .await
        .unwrap();
    assert_eq!(ask(&gus, "root").await.unwrap(), "dev-1");

    // A deleted user's certificates stop working.
    f.auth.delete_resource(&admin, Kind::User, "gus").await.unwrap();
    assert_eq!(
        ask(&gus, "root").await.unwrap_err(),
        "access refused: user \"gus\" no longer exists: their certificates are revoked"
    );

    // A removed role grants nothing any more, to certificates issued before.
    assert_eq!(ask(&dana, "ubuntu").await.unwrap(), "dev-1");
    f.auth.delete_resource(&admin, Kind::Role, "dev").await.unwrap();
    let err = ask(&dana, "ubuntu").await.unwrap_err();
    assert!(err.starts_with("access denied to node \"dev-1\""), "{err}");

    // Only an editor locks: a user with the access role cannot lock or unlock anyone.
    let erin_api = login(&f, "erin", "correct horse").await.unwrap();
    let err = f
        .auth
        .put_resources(
            &erin_api,
            vec![Resource::Lock(crate::resource::Lock::user("dana", None))],
            false,
        )
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(err, "access denied to perform action \"create\" on \"lock\"");
}

#[tokio::test]
async fn token_values_are_listed_only_with_secrets_and_never_to_a_list_only_role() {
    let f = fixture().await;
    let admin = admin(&f.auth);
    let token = f
        .auth
        .create_token(&admin, vec![JoinRole::Node], None)
        .await
        .unwrap();
    let value = token.value().expose().clone();
    let lister = "kind: role\nversion: v7\nmetadata:\n  name: token-lister\nspec:\n  allow:\n    rules:\n    - resources: [token]\n      verbs: [list]\n";
    f.auth
        .put_resources(&admin, parse_resources(lister).unwrap(), false)
        .await
        .unwrap();
    f.auth
        .create_user(
            &admin,
            User::new("lister", ["token-lister"]),
            &Secret::new("correct horse".into()),
        )
        .await
        .unwrap();
    let lister = login(&f, "lister", "correct horse").await.unwrap();
    let shown = |list: Vec<Resource>| {
        list.iter()
            .map(|r| r.to_yaml().unwrap())
            .collect::<Vec<_>>()
            .join("---\n")
    };
    // Without --with-secrets, even the administrator sees no token value.
    let plain = shown(f.auth.list_resources(&admin, Kind::Token, false).await.unwrap());
    assert!(plain.contains("name: '***'"), "{plain}");
    assert!(!plain.contains(&value), "{plain}");
    assert!(shown(f.auth.list_resources(&admin, Kind::Token, true).await.unwrap()).contains(&value));
    // A role that may only list tokens sees how many there are, never a value ...
    let listed = shown(f.auth.list_resources(&lister, Kind::Token, false).await.unwrap());
    assert!(!listed.contains(&value), "{listed}");
    // ... and asking for secrets needs `read`.
    assert_eq!(
        f.auth
            .list_resources(&lister, Kind::Token, true)
            .await
            .unwrap_err()
            .to_string(),
        "access denied to perform action \"read\" on \"token\""
    );
    assert_eq!(
        f.auth
            .get_resource(&lister, Kind::Token, &value, false)
            .await
            .unwrap_err()
            .to_string(),
        "access denied to perform action \"read\" on \"token\""
    );
}

#[tokio::test]
async fn an_agent_cannot_announce_a_metadata_or_cluster_address_as_its_listener() {
    let mut f = fixture().await;
    f.auth.set_host_name_policy(HostNamePolicy {
        reserved: vec!["proxy.example.com".into(), "10.0.0.5".into()],
        allowed: vec![],
    });
    let agent = node_host(&f.auth, "edge-1");
    let beat = |addr: &str| {
        let mut node = ServedResource::new(ServedKind::Node, "edge-1");
        node.direct_addr = addr.into();
        Heartbeat {
            hostname: "edge-1".into(),
            resources: vec![node],
            // The agent's heartbeat comes from 10.0.0.7.
            source: Some("10.0.0.7".parse().unwrap()),
            ..Default::default()
        }
    };
    for (addr, why) in [
        ("169.254.169.254:80", "link-local"),
        ("[fe80::1]:22", "link-local"),
        ("[::ffff:169.254.169.254]:80", "link-local"),
        ("0.0.0.0:3022", "unspecified"),
        ("224.0.0.1:3022", "multicast"),
        (
            "proxy.example.com:3080",
            "an address of the cluster's Proxy or Auth Service",
        ),
        (
            "10.0.0.5:3025",
            "an address of the cluster's Proxy or Auth Service",
        ),
        ("edge-1", "expected host:port"),
        ("edge-1:0", "expected host:port"),
    ] {
        let err = f
            .auth
            .heartbeat(&agent, beat(addr))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(&format!(
                "invalid request: served node \"edge-1\": direct_addr \"{addr}\": "
            )),
            "{addr}: {err}"
        );
        assert!(err.contains(why), "{addr}: {err}");
        // Nothing was stored: the proxy has no route to dial.
        assert_eq!(
            f.auth
                .direct_route(&proxy(&f.auth), "edge-1", ServedKind::Node)
                .await
                .unwrap(),
            None,
            "{addr}"
        );
    }
    f.auth.heartbeat(&agent, beat("10.0.0.7:3022")).await.unwrap();
    f.auth.heartbeat(&agent, beat("edge-1:3022")).await.unwrap();
    // Strict: another host's address, a name the certificate lacks, loopback without the
    // lab opt-in; each refusal is remembered for the proxy, naming the node and the reason.
    for (addr, why) in [
        (
            "10.0.0.8:3022",
            "is not the address the agent connects from (10.0.0.7)",
        ),
        ("db.example.com:3022", "does not carry the name db.example.com"),
        ("127.0.0.1:3022", "loopback"),
    ] {
        let err = f
            .auth
            .heartbeat(&agent, beat(addr))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains(why), "{addr}: {err}");
        let refusal = f
            .auth
            .direct_refusal(&proxy(&f.auth), "edge-1", ServedKind::Node)
            .expect("the refusal is remembered");
        assert!(
            refusal.starts_with(&format!(
                "node \"edge-1\" announced the listener {addr} and the Auth Service refused it: "
            )),
            "{refusal}"
        );
        assert!(refusal.contains(why), "{refusal}");
        assert_eq!(
            f.auth.direct_refusal(&agent, "edge-1", ServedKind::Node),
            None,
            "only a proxy reads refusals"
        );
    }
    // The lab opt-in accepts a loopback listener of an agent on the same host.
    f.auth
        .set_direct_dial_policy(crate::auth::DirectDialPolicy::default().with_allow_loopback(true));
    let mut lab = beat("127.0.0.1:3022");
    lab.source = Some("127.0.0.1".parse().unwrap());
    f.auth.heartbeat(&agent, lab).await.unwrap();
    // An accepted heartbeat forgets the refusal.
    assert_eq!(
        f.auth.direct_refusal(&proxy(&f.auth), "edge-1", ServedKind::Node),
        None
    );
    assert!(direct_ip_allowed("10.1.2.3".parse().unwrap()));
    assert!(!direct_ip_allowed("169.254.0.1".parse().unwrap()));
}

#[tokio::test]
async fn database_certificates_carry_the_route_the_roles_allow_and_mint_no_others() {
    let f = fixture().await;
    let admin = admin(&f.auth);
    let role = "kind: role\nversion: v7\nmetadata:\n  name: db-reader\nspec:\n  allow:\n    db_labels: {'*': '*'}\n    db_users: ['app_*']\n    db_names: [shop]\n  deny:\n    db_users: [app_admin]\n";
    f.auth
        .put_resources(&admin, parse_resources(role).unwrap(), false)
        .await
        .unwrap();
    f.auth
        .create_user(
            &admin,
            User::new("carol", ["db-reader"]),
            &Secret::new("correct horse".into()),
        )
        .await
        .unwrap();
    let agent = host_with(&f.auth, vec![SystemRole::Db]);
    let mut pg = ServedResource::new(ServedKind::Db, "pg");
    pg.protocol = "postgres".into();
    f.auth
        .heartbeat(
            &agent,
            Heartbeat {
                hostname: "agent-1".into(),
                resources: vec![pg],
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let carol = login(&f, "carol", "correct horse").await.unwrap();
    let req = |user: &str, name: Option<&str>| DbCertRequest {
        name: "pg".into(),
        db_user: user.into(),
        db_name: name.map(Into::into),
        tls_public_key: keys().0,
        ttl: None,
    };

    let cert = f
        .auth
        .issue_db_cert(&carol, &req("app_ro", Some("shop")))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        cert.route,
        DbCertRoute {
            service: "pg".into(),
            protocol: "postgres".into(),
            user: "app_ro".into(),
            database: Some("shop".into()),
        }
    );
    let Caller::User { identity, .. } = f
        .auth
        .authenticate(std::slice::from_ref(&cert.tls_cert))
        .await
        .unwrap()
    else {
        panic!("a database certificate is a user certificate");
    };
    assert_eq!(identity.username, "carol");
    assert_eq!(identity.db_route, Some(cert.route.clone()));
    let Caller::User {
        identity: session, ..
    } = &carol
    else {
        panic!("carol is a user");
    };
    assert!(identity.validity.not_after <= session.validity.not_after);

    // Denied users and names are refused by name; a database certificate mints no others;
    // hosts get none.
    let denied = f
        .auth
        .issue_db_cert(&carol, &req("app_admin", None))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(
        denied.to_string(),
        "access denied to db \"pg\" as database user \"app_admin\": the roles of user carol do not allow it"
    );
    let denied = f
        .auth
        .issue_db_cert(&carol, &req("app_ro", Some("secrets")))
        .await
        .unwrap()
        .unwrap_err();
    assert!(
        denied.to_string().contains("database name \"secrets\""),
        "{denied}"
    );
    let as_db_cert = f.auth.authenticate(&[cert.tls_cert]).await.unwrap();
    assert!(matches!(
        f.auth.issue_db_cert(&as_db_cert, &req("app_ro", None)).await,
        Err(AuthError::AccessDenied(_))
    ));
    assert!(matches!(
        f.auth.issue_db_cert(&agent, &req("app_ro", None)).await,
        Err(AuthError::AccessDenied(_))
    ));

    // The proxy's check for the user whose certificate it holds.
    let bob_cert = user_cert(&f, "carol", "correct horse").await;
    let proxy = proxy(&f.auth);
    let ok = f
        .auth
        .resolve_db(
            &proxy,
            Some(std::slice::from_ref(&bob_cert)),
            "pg",
            "app_rw",
            Some("shop"),
        )
        .await
        .unwrap();
    assert_eq!(ok.unwrap().hostname, "agent-1");
    let no = f
        .auth
        .resolve_db(&proxy, Some(&[bob_cert]), "pg", "postgres", Some("shop"))
        .await
        .unwrap();
    assert!(matches!(no, Err(RouteError::Db(_))), "{no:?}");

    // A database certificate reaches its own route only.
    let db_cert = f
        .auth
        .issue_db_cert(&carol, &req("app_ro", Some("shop")))
        .await
        .unwrap()
        .unwrap()
        .tls_cert;
    let chain = std::slice::from_ref(&db_cert);
    let own = f
        .auth
        .resolve_db(&proxy, Some(chain), "pg", "app_ro", Some("shop"))
        .await
        .unwrap();
    assert!(own.is_ok(), "{own:?}");
    let other_user = f
        .auth
        .resolve_db(&proxy, Some(chain), "pg", "app_rw", Some("shop"))
        .await
        .unwrap()
        .unwrap_err();
    assert!(matches!(other_user, RouteError::CertScope(_)), "{other_user}");
    assert!(
        other_user.to_string().contains("as database user \"app_ro\""),
        "{other_user}"
    );
    let other_kind = f
        .auth
        .resolve_resource(&proxy, Some(chain), ServedKind::App, "grafana")
        .await
        .unwrap()
        .unwrap_err();
    assert!(matches!(other_kind, RouteError::CertScope(_)), "{other_kind}");
}

#[tokio::test]
async fn app_jwts_are_signed_for_proxies_only_with_the_certificates_identity() {
    let f = fixture().await;
    let admin = admin(&f.auth);
    let prod_only = "kind: role\nversion: v7\nmetadata:\n  name: prod-apps\nspec:\n  allow:\n    app_labels:\n      env: prod\n";
    f.auth
        .put_resources(&admin, parse_resources(prod_only).unwrap(), false)
        .await
        .unwrap();
    f.auth
        .create_user(
            &admin,
            User::new("bob", ["prod-apps"]),
            &Secret::new("correct horse".into()),
        )
        .await
        .unwrap();
    let agent = host_with(&f.auth, vec![SystemRole::App]);
    let mut shop = ServedResource::new(ServedKind::App, "shop");
    shop.labels.insert("env".into(), "prod".into());
    shop.target = "http://127.0.0.1:8080".into();
    let mut grafana = ServedResource::new(ServedKind::App, "grafana");
    grafana.labels.insert("env".into(), "dev".into());
    f.auth
        .heartbeat(
            &agent,
            Heartbeat {
                hostname: "agent-1".into(),
                resources: vec![shop, grafana],
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let bob = user_cert(&f, "bob", "correct horse").await;
    let chain = std::slice::from_ref(&bob);

    let (jwt, expires) = f
        .auth
        .sign_app_jwt(&proxy(&f.auth), chain, "shop")
        .await
        .unwrap()
        .unwrap();
    let now = f.auth.clock.now();
    assert_eq!(expires, now + APP_JWT_TTL);
    let claims = f.auth.jwks().verify(&jwt, now).unwrap();
    assert_eq!(
        (
            claims.sub.as_str(),
            claims.username.as_str(),
            claims.roles.clone()
        ),
        ("bob", "bob", vec!["prod-apps".to_owned()])
    );
    assert_eq!(
        (claims.iss.as_str(), claims.aud.as_str()),
        ("example.com", "http://127.0.0.1:8080")
    );
    assert_eq!(claims.exp, claims.iat + APP_JWT_TTL.as_secs());
    // The key is the cluster's: a restart on the same backend signs with the same one.
    let again = AuthService::open(f.auth.backend.clone(), "example.com", f.clock.clone())
        .await
        .unwrap();
    assert_eq!(again.jwks(), f.auth.jwks());

    // Labels the roles do not allow: refused, naming the app.
    let denied = f
        .auth
        .sign_app_jwt(&proxy(&f.auth), chain, "grafana")
        .await
        .unwrap()
        .unwrap_err();
    assert!(denied.to_string().contains("grafana"), "{denied}");
    // Only a proxy (or the Auth Service's own admin identity) may ask: not an agent, not the
    // user.
    for caller in [agent, login(&f, "bob", "correct horse").await.unwrap()] {
        assert!(f.auth.sign_app_jwt(&caller, chain, "shop").await.is_err());
    }
    // A locked user gets no JWT.
    let lock = "kind: lock\nversion: v2\nmetadata:\n  name: bob-lock\nspec:\n  target:\n    user: bob\n";
    f.auth
        .put_resources(&admin, parse_resources(lock).unwrap(), false)
        .await
        .unwrap();
    assert!(
        !matches!(
            f.auth.sign_app_jwt(&proxy(&f.auth), chain, "shop").await,
            Ok(Ok(_))
        ),
        "a locked user got an app JWT"
    );
}
