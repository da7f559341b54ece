//! The agent's source of the maintenance window is the real Auth API, read with the identity the
//! agent got by joining: no configuration yet is an empty schedule, a configured window is
//! read back, and an unreachable Auth Service is lost contact (an error), not "no schedule".

use std::sync::Arc;

use svc_core::SystemClock;
use svc_core::auth::AuthService;
use svc_core::backend::{Backend, MemoryBackend};
use svc_core::identity::{HostCertRequest, SystemRole};
use svc_core::maintenance::AgentUpgradeWindow;
use svc_core::resource::{JoinRole, parse_resources};
use svc_net::agent::node::export::{AuthMaintenanceSource, MaintenanceSource};
use svc_net::auth::{AuthClient, JoinParams, KeyMaterial, join};
use tokio_util::sync::CancellationToken;

const MAINTENANCE: &str = "kind: cluster_maintenance_config\nspec:\n  agent_upgrades:\n    utc_start_hour: 2\n    weekdays: [Mon, wed]\n";

#[tokio::test]
async fn an_agent_reads_the_window_through_the_auth_api() {
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let auth = Arc::new(
        AuthService::open(backend, "export.test", Arc::new(SystemClock))
            .await
            .unwrap(),
    );
    let identity = svc_net::auth::server_identity(&auth, "auth", &[]).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let shutdown = CancellationToken::new();
    let server = tokio::spawn({
        let (auth, shutdown) = (auth.clone(), shutdown.clone());
        async move { svc_net::auth::serve(listener, auth, identity, shutdown).await }
    });

    // The administrator (an auth-role host identity) issues a join token.
    let keys = KeyMaterial::generate().unwrap();
    let admin_req = HostCertRequest {
        host_uuid: uuid::Uuid::new_v4(),
        node_name: "auth".into(),
        roles: vec![SystemRole::Auth],
        additional_names: vec![],
        ttl: std::time::Duration::from_secs(600),
    };
    let admin_certs = auth
        .issue_host_certs(&admin_req, &keys.tls_public_key(), keys.ssh_public_key())
        .unwrap();
    let admin = auth.authenticate(&[admin_certs.tls_cert]).await.unwrap();
    let token = auth
        .create_token(&admin, vec![JoinRole::Node], None)
        .await
        .unwrap();

    // The agent joins and reads through the API with its own identity.
    let agent = join(
        &addr,
        JoinParams {
            token: token.value().clone(),
            ca_pin: None,
            trust_on_first_use: true,
            node_name: "node-1".into(),
            roles: vec![SystemRole::Node],
            additional_names: vec![],
        },
    )
    .await
    .unwrap();
    let source = AuthMaintenanceSource::new(AuthClient::connect(&addr, &agent).await.unwrap());
    assert_eq!(
        source.agent_upgrades().await.unwrap(),
        None,
        "no configuration yet"
    );

    auth.put_resources(&admin, parse_resources(MAINTENANCE).unwrap(), false)
        .await
        .unwrap();
    let expected: AgentUpgradeWindow =
        serde_yaml_ng::from_str("utc_start_hour: 2\nweekdays: [Mon, Wed]").unwrap();
    assert_eq!(source.agent_upgrades().await.unwrap(), Some(expected));

    shutdown.cancel();
    server.await.unwrap().unwrap();
    assert!(
        source.agent_upgrades().await.is_err(),
        "an unreachable Auth Service is lost contact"
    );
}
