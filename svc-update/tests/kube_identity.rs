//! The agent's host identity in a per-replica Secret (`SecretIdentityStore`), against the fake
//! API server: created when missing, read back whole, updated in place keeping other keys,
//! concurrent writers resolved by `resourceVersion` conflicts, and never shown.

mod support;

use std::sync::Arc;

use serde_json::json;
use support::fake_apiserver::FakeApiServer;
use svc_core::Secret;
use svc_net::{agent::node::IdentityStore, auth::ClientIdentity};
use svc_update::kube::identity::{IDENTITY_KEY, ROLES_KEY, SecretIdentityStore};

const NS: &str = "svc";
const NAME: &str = "svc-agent-0-state";
const KEY_MATERIAL: &str =
    "-----BEGIN PRIVATE KEY-----\nnot-a-real-key-but-secret\n-----END PRIVATE KEY-----\n";

fn identity(name: &str) -> ClientIdentity {
    ClientIdentity {
        cluster: "example.test".into(),
        name: format!("{name}.example.test"),
        auth_addr: "proxy.example.test:443".into(),
        tls_cert_pem: "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n".into(),
        tls_key_pem: Secret::new(KEY_MATERIAL.to_owned()),
        ssh_cert: "ssh-ed25519-cert-v01@openssh.com AAAA".into(),
        ssh_key: Secret::new("ssh private key material".to_owned()),
        trusted: Vec::new(),
        not_after_unix: 4_102_444_800,
    }
}

fn data_key(api: &FakeApiServer, key: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    let secret = api.get("Secret", NS, NAME)?;
    let encoded = secret["data"][key].as_str()?;
    Some(
        base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .expect("base64"),
    )
}

#[tokio::test]
async fn the_identity_is_created_read_back_and_updated_in_place() {
    let api = FakeApiServer::start().await;
    let store = SecretIdentityStore::new(api.client(NS), NS, NAME);
    assert!(store.load().await.unwrap().is_none(), "nothing saved yet");
    assert_eq!(store.describe(), format!("secret {NS}/{NAME}"));

    store.save(&identity("host-1"), "node,kube").await.unwrap();
    assert_eq!(api.count("POST", "/secrets"), 1, "created when missing");
    let loaded = store.load().await.unwrap().expect("saved");
    assert_eq!(loaded.identity.name, "host-1.example.test");
    assert_eq!(loaded.identity.tls_key_pem.expose(), KEY_MATERIAL);
    assert_eq!(loaded.roles, "node,kube");
    assert_eq!(data_key(&api, ROLES_KEY).unwrap(), b"node,kube");

    // Another key in the same Secret (as an operator's label or a future field) survives a save.
    api.merge("Secret", NS, NAME, json!({"data": {"other": "eA=="}}));
    store.save(&identity("host-2"), "kube").await.unwrap();
    assert_eq!(api.count("POST", "/secrets"), 1, "updated, not created again");
    assert_eq!(data_key(&api, "other").unwrap(), b"x");
    let loaded = store.load().await.unwrap().unwrap();
    assert_eq!(loaded.identity.name, "host-2.example.test");
    assert_eq!(loaded.roles, "kube");

    // The store, the stored identity and their errors never show the keys.
    let shown = format!("{store:?} {loaded:?}");
    assert!(!shown.contains("not-a-real-key"), "{shown}");
    assert!(!shown.contains("ssh private key material"), "{shown}");
}

#[tokio::test]
async fn concurrent_saves_resolve_their_conflicts() {
    let api = FakeApiServer::start().await;
    let store = Arc::new(SecretIdentityStore::new(api.client(NS), NS, NAME));
    store.save(&identity("host-0"), "kube").await.unwrap();
    let mut tasks = Vec::new();
    for i in 1..=3 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            store.save(&identity(&format!("host-{i}")), "kube").await
        }));
    }
    for t in tasks {
        t.await
            .unwrap()
            .expect("every save lands, retried after a conflict if need be");
    }
    let name = store.load().await.unwrap().unwrap().identity.name;
    assert!(
        [
            "host-1.example.test",
            "host-2.example.test",
            "host-3.example.test"
        ]
        .contains(&name.as_str()),
        "{name}"
    );
}

#[tokio::test]
async fn a_stored_value_that_is_no_identity_is_an_error_that_does_not_show_it() {
    let api = FakeApiServer::start().await;
    use base64::Engine as _;
    let garbage = base64::engine::general_purpose::STANDARD.encode("{\"cluster\": \"secret-looking-value\"");
    api.insert(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": NAME, "namespace": NS},
        "data": {IDENTITY_KEY: garbage}
    }));
    let store = SecretIdentityStore::new(api.client(NS), NS, NAME);
    let err = store.load().await.unwrap_err();
    let text = format!(
        "{err} {:?}",
        std::error::Error::source(&err).map(ToString::to_string)
    );
    assert!(text.contains(&format!("secret {NS}/{NAME}")), "{text}");
    assert!(text.contains("not a host identity"), "{text}");
    assert!(!text.contains("secret-looking-value"), "{text}");
}

/// The agent's side of the Kubernetes status: what the updater wrote to the shared-state Secret
/// is what the agent node's status hook returns (and so what its heartbeat reports); nothing
/// written yet is no status; a malformed value is an error naming the Secret and key.
#[tokio::test]
async fn the_agent_reads_the_updaters_status_from_the_shared_state_secret() {
    use svc_core::updater::{UPGRADER_KUBE, UpdateResult, UpdaterStatus};
    use svc_net::agent::node::UpdateStatusSource;
    use svc_update::kube::status::{STATUS_SECRET_KEY, SecretStatusSource, write_status};

    const SHARED: &str = "svc-agent-shared-state";
    let api = FakeApiServer::start().await;
    let source = SecretStatusSource::new(api.client(NS), NS, SHARED);
    assert!(
        source.status().await.unwrap().is_none(),
        "no Secret yet: no decision to report"
    );
    let written = UpdaterStatus {
        upgrader: UPGRADER_KUBE.into(),
        upgrader_version: "17.0.0".into(),
        result: UpdateResult::RolledBack,
        from: "17.1.0".into(),
        to: "17.0.0".into(),
        reason: "pods not ready within 5m".into(),
        at: 1_764_000_000,
        bad_versions: vec!["17.1.0".into()],
    };
    write_status(api.client(NS), NS, SHARED, &written).await.unwrap();
    assert_eq!(source.status().await.unwrap(), Some(written));
    assert!(source.describe().contains(SHARED), "{}", source.describe());

    const MANGLED: &str = "svc-other-shared-state";
    api.insert(
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": MANGLED, "namespace": NS},
               "data": {STATUS_SECRET_KEY: "bm90IGpzb24="}}),
    );
    let source = SecretStatusSource::new(api.client(NS), NS, MANGLED);
    let err = source.status().await.unwrap_err().to_string();
    assert!(err.contains(MANGLED) && err.contains(STATUS_SECRET_KEY), "{err}");
}
