//! Several Auth Services on one etcd: started at the same moment on a fresh etcd, they race to
//! create the certificate authorities; exactly one set wins and every instance uses it, so a
//! certificate issued by one is verified by the other and a user created through one signs in
//! through the other. Real `etcd` member (Debian package `etcd-server`).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use rcgen::{KeyPair, PublicKeyData};
use ssh_key::private::Ed25519Keypair;
use svc_core::auth::{AuthError, AuthService, Caller, LoginRequest};
use svc_core::backend::{Backend, KeyRange};
use svc_core::identity::{HostCertRequest, Identity, SystemRole};
use svc_core::resource::User;
use svc_core::{Clock, Secret, SystemClock};

#[path = "support/etcd.rs"]
mod etcd_support;

const CLUSTER: &str = "ha.example.com";
const LIMIT: Duration = Duration::from_secs(90);

fn keys(seed: u8) -> Result<(Vec<u8>, ssh_key::PublicKey)> {
    let tls = KeyPair::generate()?;
    let ssh = ssh_key::PrivateKey::from(Ed25519Keypair::from_seed(&[seed; 32]));
    Ok((tls.subject_public_key_info(), ssh.public_key().clone()))
}

/// A host identity issued by `auth` with `role`, verified by `auth`.
fn host_caller(auth: &AuthService, role: SystemRole) -> Result<Caller> {
    let (tls, ssh) = keys(1)?;
    let req = HostCertRequest {
        host_uuid: uuid::Uuid::new_v4(),
        node_name: "node".into(),
        roles: vec![role],
        additional_names: vec![],
        ttl: Duration::from_secs(3600),
    };
    let certs = auth.issue_host_certs(&req, &tls, &ssh)?;
    match auth
        .verifier()
        .verify_any_x509(&[certs.tls_cert], SystemClock.now())?
    {
        Identity::Host(h) if role == SystemRole::Auth => Ok(Caller::Admin(h)),
        Identity::Host(h) => Ok(Caller::Host(h)),
        other => bail!("expected a host identity, got {other:?}"),
    }
}

async fn sign_in(
    through: &AuthService,
    proxy: &Caller,
    user: &str,
    password: &str,
) -> Result<Caller, AuthError> {
    let (tls, ssh) = keys(2).map_err(|e| AuthError::Invalid(e.to_string()))?;
    let req = LoginRequest {
        username: user.into(),
        password: Secret::new(password.into()),
        tls_public_key: tls,
        ssh_public_key: ssh,
        ttl: None,
        source: None,
    };
    let certs = through.login(proxy, &req).await?;
    through.authenticate(&[certs.tls_cert]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_auth_services_on_one_etcd_share_one_set_of_cas() -> Result<()> {
    tokio::time::timeout(LIMIT, async {
        let cluster = etcd_support::EtcdCluster::start(1).await?;
        let prefix = format!("/svc/{CLUSTER}");
        let a_backend: Arc<dyn Backend> =
            Arc::new(cluster.backend(&prefix, Arc::new(SystemClock), 4096).await?);
        let b_backend: Arc<dyn Backend> =
            Arc::new(cluster.backend(&prefix, Arc::new(SystemClock), 4096).await?);
        // Started concurrently on an empty store: both try to create the CAs.
        let (a, b) = tokio::join!(
            AuthService::open(a_backend.clone(), CLUSTER, Arc::new(SystemClock)),
            AuthService::open(b_backend, CLUSTER, Arc::new(SystemClock)),
        );
        let (a, b) = (a.context("Auth Service A")?, b.context("Auth Service B")?);
        ensure!(
            a.ca_pin() == b.ca_pin(),
            "one host CA: {} vs {}",
            a.ca_pin(),
            b.ca_pin()
        );
        ensure!(a.trusted() == b.trusted(), "the same trusted CAs on both");
        ensure!(a.jwks() == b.jwks(), "one JWT signing key for web apps on both");
        let stored = a_backend.range(&KeyRange::prefix("/authorities/")).await?;
        // Keys only in the message: the values hold the CAs' private keys.
        let names: Vec<String> = stored.iter().map(|i| i.key.to_string()).collect();
        ensure!(
            names
                == [
                    format!("/authorities/host/{CLUSTER}"),
                    format!("/authorities/jwt/{CLUSTER}"),
                    format!("/authorities/user/{CLUSTER}"),
                ],
            "exactly one host CA, one JWT key and one user CA stored: {names:?}"
        );

        // A host certificate issued by A is verified by B.
        let (tls, ssh) = keys(3)?;
        let req = HostCertRequest {
            host_uuid: uuid::Uuid::new_v4(),
            node_name: "agent-1".into(),
            roles: vec![SystemRole::Node],
            additional_names: vec![],
            ttl: Duration::from_secs(600),
        };
        let certs = a.issue_host_certs(&req, &tls, &ssh)?;
        match b.authenticate(&[certs.tls_cert]).await? {
            Caller::Host(h) => ensure!(h.node_name == "agent-1"),
            other => bail!("B must see A's agent as a host, got {other:?}"),
        }

        // A user created through A signs in through B; a wrong password is refused there too.
        a.create_user(
            &host_caller(&a, SystemRole::Auth)?,
            User::new("alice", ["editor"]),
            &Secret::new("correct horse battery".into()),
        )
        .await?;
        let proxy_on_b = host_caller(&b, SystemRole::Proxy)?;
        match sign_in(&b, &proxy_on_b, "alice", "correct horse battery").await? {
            Caller::User { .. } => {}
            other => bail!("alice signs in through B as a user, got {other:?}"),
        }
        ensure!(matches!(
            sign_in(&b, &proxy_on_b, "alice", "wrong").await,
            Err(AuthError::BadCredentials)
        ));
        // And B's user certificate is accepted by A.
        let (tls, ssh) = keys(4)?;
        let certs = b
            .login(
                &proxy_on_b,
                &LoginRequest {
                    username: "alice".into(),
                    password: Secret::new("correct horse battery".into()),
                    tls_public_key: tls,
                    ssh_public_key: ssh,
                    ttl: None,
                    source: None,
                },
            )
            .await?;
        ensure!(matches!(
            a.authenticate(&[certs.tls_cert]).await?,
            Caller::User { .. }
        ));
        println!("two Auth Services on one etcd: one CA set, certificates and users shared");
        anyhow::Ok(())
    })
    .await
    .context("the test did not finish within 90s")?
}
