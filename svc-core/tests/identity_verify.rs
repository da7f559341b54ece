//! Identity end to end without a network: CAs sign X.509 and OpenSSH certificates, the
//! `Verifier` reads back exactly what was signed, and refuses every certificate it must (the
//! negative matrix). A rustls handshake in memory shows the handshake verifier and the identity
//! helper agree.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail, ensure};
use rcgen::{KeyPair, PKCS_ECDSA_P256_SHA256, PublicKeyData};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use ssh_key::PrivateKey;
use ssh_key::private::Ed25519Keypair;
use svc_core::backend::{Backend, BackendError, EmbeddedBackend, MemoryBackend};
use svc_core::identity::{
    CLOCK_SKEW, CertAuthority, HostCertRequest, HostIdentity, Identity, IdentityError, IdentityKind,
    SystemRole, UserCertRequest, UserIdentity, Validity, Verifier, VerifyError, host_id,
};
use uuid::Uuid;

const CLUSTER: &str = "example.com";
const HOUR: Duration = Duration::from_secs(3600);

fn t0() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

struct Cluster {
    host_ca: CertAuthority,
    user_ca: CertAuthority,
    verifier: Verifier,
}

fn cluster(name: &str) -> Result<Cluster> {
    let host_ca = CertAuthority::generate(IdentityKind::Host, name, t0(), 365 * 24 * HOUR)?;
    let user_ca = CertAuthority::generate(IdentityKind::User, name, t0(), 365 * 24 * HOUR)?;
    let verifier = Verifier::new(name, [host_ca.trusted(), user_ca.trusted()])?;
    Ok(Cluster {
        host_ca,
        user_ca,
        verifier,
    })
}

fn tls_key() -> Result<KeyPair> {
    Ok(KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?)
}

fn ssh_key(seed: u8) -> PrivateKey {
    PrivateKey::from(Ed25519Keypair::from_seed(&[seed; 32]))
}

fn node_request(roles: Vec<SystemRole>) -> HostCertRequest {
    HostCertRequest {
        host_uuid: Uuid::from_u128(0x1234),
        node_name: "node-1".into(),
        roles,
        additional_names: vec!["node-1.internal".into(), "10.1.2.3".into()],
        ttl: 24 * HOUR,
    }
}

fn alice_request() -> UserCertRequest {
    UserCertRequest {
        username: "alice".into(),
        roles: vec!["access".into(), "editor".into()],
        logins: vec!["alice".into(), "root".into()],
        ttl: Duration::from_secs(12 * 3600),
        db_route: None,
        ssh_permits: Default::default(),
    }
}

fn validity(ttl: Duration) -> Validity {
    Validity {
        not_before: t0() - CLOCK_SKEW,
        not_after: t0() + ttl,
    }
}

#[test]
fn host_identity_reads_back_exactly() -> Result<()> {
    let c = cluster(CLUSTER)?;
    let req = node_request(vec![SystemRole::Node, SystemRole::App]);
    let expected = HostIdentity {
        host_id: host_id(&req.host_uuid, CLUSTER),
        cluster: CLUSTER.into(),
        node_name: "node-1".into(),
        roles: vec![SystemRole::Node, SystemRole::App],
        additional_names: req.additional_names.clone(),
        validity: validity(req.ttl),
    };
    ensure!(expected.host_id == "00000000-0000-0000-0000-000000001234.example.com");

    let cert = c
        .host_ca
        .sign_host_x509(&req, &tls_key()?.subject_public_key_info(), t0())?;
    let got =
        c.verifier
            .verify_host_x509(std::slice::from_ref(&cert), t0() + HOUR, Some(SystemRole::Node))?;
    ensure!(got == expected, "x509: {got:?}");
    ensure!(matches!(
        c.verifier.verify_any_x509(&[cert], t0())?,
        Identity::Host(ref h) if *h == expected
    ));

    let ssh_cert = c.host_ca.sign_host_ssh(&req, ssh_key(1).public_key(), t0())?;
    let got = c
        .verifier
        .verify_host_ssh(&ssh_cert, t0() + HOUR, Some(SystemRole::App))?;
    ensure!(got == expected, "ssh: {got:?}");
    ensure!(
        ssh_cert.valid_principals() == [expected.host_id.as_str(), "node-1", "node-1.internal", "10.1.2.3"]
    );
    Ok(())
}

#[test]
fn user_identity_reads_back_exactly() -> Result<()> {
    let c = cluster(CLUSTER)?;
    let req = alice_request();
    let expected = UserIdentity {
        username: "alice".into(),
        cluster: CLUSTER.into(),
        roles: vec!["access".into(), "editor".into()],
        logins: vec!["alice".into(), "root".into()],
        db_route: None,
        validity: validity(req.ttl),
    };
    let cert = c
        .user_ca
        .sign_user_x509(&req, &tls_key()?.subject_public_key_info(), t0())?;
    match c
        .verifier
        .verify_x509(std::slice::from_ref(&cert), t0(), IdentityKind::User)?
    {
        Identity::User(got) => ensure!(got == expected, "x509: {got:?}"),
        other => bail!("expected a user, got {other:?}"),
    }
    ensure!(matches!(
        c.verifier.verify_any_x509(std::slice::from_ref(&cert), t0())?,
        Identity::User(ref u) if *u == expected
    ));
    let ssh_cert = c.user_ca.sign_user_ssh(&req, ssh_key(2).public_key(), t0())?;
    let got = c.verifier.verify_user_ssh(&ssh_cert, t0())?;
    ensure!(got == expected, "ssh: {got:?}");
    ensure!(ssh_cert.valid_principals() == ["alice", "root"]);
    ensure!(ssh_cert.extensions().contains_key("permit-pty"));
    Ok(())
}

#[test]
fn certificates_never_outlive_their_ca() -> Result<()> {
    let host_ca = CertAuthority::generate(IdentityKind::Host, CLUSTER, t0(), HOUR)?;
    let mut req = node_request(vec![SystemRole::Proxy]);
    req.ttl = 1000 * HOUR;
    let verifier = Verifier::new(CLUSTER, [host_ca.trusted()])?;
    let cert = host_ca.sign_host_x509(&req, &tls_key()?.subject_public_key_info(), t0())?;
    let got = verifier.verify_host_x509(&[cert], t0(), None)?;
    ensure!(got.validity.not_after == t0() + HOUR);
    let ssh_cert = host_ca.sign_host_ssh(&req, ssh_key(3).public_key(), t0())?;
    ensure!(
        verifier
            .verify_host_ssh(&ssh_cert, t0(), None)?
            .validity
            .not_after
            == t0() + HOUR
    );
    Ok(())
}

#[test]
fn a_ca_signs_only_its_own_kind_and_sane_requests() -> Result<()> {
    let c = cluster(CLUSTER)?;
    let spki = tls_key()?.subject_public_key_info();
    let err = c
        .host_ca
        .sign_user_x509(&alice_request(), &spki, t0())
        .unwrap_err();
    ensure!(matches!(err, IdentityError::WrongAuthority { .. }), "{err}");
    ensure!(err.to_string() == "the host CA cannot sign a user certificate");
    ensure!(
        c.user_ca
            .sign_host_ssh(
                &node_request(vec![SystemRole::Node]),
                ssh_key(1).public_key(),
                t0()
            )
            .is_err()
    );
    // An SSH user certificate without principals would be valid for every login: refused.
    let mut no_logins = alice_request();
    no_logins.logins.clear();
    let err = c
        .user_ca
        .sign_user_ssh(&no_logins, ssh_key(1).public_key(), t0())
        .unwrap_err();
    ensure!(err.to_string().contains("at least one login"), "{err}");
    // A host without roles is refused too.
    let err = c
        .host_ca
        .sign_host_x509(&node_request(vec![]), &spki, t0())
        .unwrap_err();
    ensure!(err.to_string().contains("roles"), "{err}");
    Ok(())
}

/// Every certificate a server must refuse, in both formats. Prints the count.
#[test]
fn negative_matrix() -> Result<()> {
    let c = cluster(CLUSTER)?;
    let other = cluster("other.example")?;
    let spki = tls_key()?.subject_public_key_info();
    let ssh_pub = ssh_key(9).public_key().clone();
    let user_req = alice_request();
    let node_req = node_request(vec![SystemRole::Node]);

    let user_x509 = c.user_ca.sign_user_x509(&user_req, &spki, t0())?;
    let node_x509 = c.host_ca.sign_host_x509(&node_req, &spki, t0())?;
    let foreign_user_x509 = other.user_ca.sign_user_x509(&user_req, &spki, t0())?;
    let foreign_node_x509 = other.host_ca.sign_host_x509(&node_req, &spki, t0())?;
    let user_ssh = c.user_ca.sign_user_ssh(&user_req, &ssh_pub, t0())?;
    let node_ssh = c.host_ca.sign_host_ssh(&node_req, &ssh_pub, t0())?;
    let foreign_user_ssh = other.user_ca.sign_user_ssh(&user_req, &ssh_pub, t0())?;

    let expired = t0() + user_req.ttl + Duration::from_secs(1);
    let too_early = t0() - CLOCK_SKEW - Duration::from_secs(1);
    let v = &c.verifier;
    let one = |der: &CertificateDer<'static>| vec![der.clone()];

    type Case<'a> = (
        &'a str,
        Box<dyn Fn() -> Result<(), VerifyError> + 'a>,
        fn(&VerifyError) -> bool,
    );
    let cases: Vec<Case<'_>> = vec![
        (
            "x509 user certificate expired",
            Box::new(|| v.verify_user_x509(&one(&user_x509), expired).map(drop)),
            |e| matches!(e, VerifyError::Expired { .. }),
        ),
        (
            "x509 user certificate not yet valid",
            Box::new(|| v.verify_user_x509(&one(&user_x509), too_early).map(drop)),
            |e| matches!(e, VerifyError::NotYetValid { .. }),
        ),
        (
            "x509 user certificate from another cluster's CA",
            Box::new(|| v.verify_user_x509(&one(&foreign_user_x509), t0()).map(drop)),
            |e| matches!(e, VerifyError::UntrustedIssuer { .. }),
        ),
        (
            "x509 host certificate from another cluster's CA",
            Box::new(|| v.verify_host_x509(&one(&foreign_node_x509), t0(), None).map(drop)),
            |e| matches!(e, VerifyError::UntrustedIssuer { .. }),
        ),
        (
            "x509 user certificate where a host one is required",
            Box::new(|| v.verify_host_x509(&one(&user_x509), t0(), None).map(drop)),
            |e| {
                matches!(
                    e,
                    VerifyError::WrongKind {
                        expected: IdentityKind::Host,
                        found: IdentityKind::User
                    }
                )
            },
        ),
        (
            "x509 host certificate used as a user one",
            Box::new(|| v.verify_user_x509(&one(&node_x509), t0()).map(drop)),
            |e| {
                matches!(
                    e,
                    VerifyError::WrongKind {
                        expected: IdentityKind::User,
                        found: IdentityKind::Host
                    }
                )
            },
        ),
        (
            "x509 node certificate where the proxy role is required",
            Box::new(|| {
                v.verify_host_x509(&one(&node_x509), t0(), Some(SystemRole::Proxy))
                    .map(drop)
            }),
            |e| {
                matches!(
                    e,
                    VerifyError::MissingRole {
                        required: SystemRole::Proxy,
                        ..
                    }
                )
            },
        ),
        (
            "x509 either-kind client from another cluster's user CA",
            Box::new(|| v.verify_any_x509(&one(&foreign_user_x509), t0()).map(drop)),
            |e| matches!(e, VerifyError::UntrustedIssuer { .. }),
        ),
        (
            "x509 empty chain",
            Box::new(|| v.verify_user_x509(&[], t0()).map(drop)),
            |e| matches!(e, VerifyError::NoCertificate),
        ),
        (
            "x509 certificate with a flipped signature bit",
            Box::new(|| {
                let mut der = user_x509.to_vec();
                let last = der.len() - 1;
                der[last] ^= 1;
                v.verify_user_x509(&[CertificateDer::from(der)], t0()).map(drop)
            }),
            |e| matches!(e, VerifyError::BadSignature),
        ),
        (
            "ssh user certificate expired",
            Box::new(|| v.verify_user_ssh(&user_ssh, expired).map(drop)),
            |e| matches!(e, VerifyError::Expired { .. }),
        ),
        (
            "ssh user certificate not yet valid",
            Box::new(|| v.verify_user_ssh(&user_ssh, too_early).map(drop)),
            |e| matches!(e, VerifyError::NotYetValid { .. }),
        ),
        (
            "ssh user certificate from another cluster's CA",
            Box::new(|| v.verify_user_ssh(&foreign_user_ssh, t0()).map(drop)),
            |e| matches!(e, VerifyError::UntrustedIssuer { .. }),
        ),
        (
            "ssh user certificate where a host one is required",
            Box::new(|| v.verify_host_ssh(&user_ssh, t0(), None).map(drop)),
            |e| matches!(e, VerifyError::WrongKind { .. }),
        ),
        (
            "ssh host certificate used as a user one",
            Box::new(|| v.verify_user_ssh(&node_ssh, t0()).map(drop)),
            |e| matches!(e, VerifyError::WrongKind { .. }),
        ),
        (
            "ssh node certificate where the proxy role is required",
            Box::new(|| {
                v.verify_host_ssh(&node_ssh, t0(), Some(SystemRole::Proxy))
                    .map(drop)
            }),
            |e| matches!(e, VerifyError::MissingRole { .. }),
        ),
    ];

    let total = cases.len();
    let mut refused = 0;
    for (name, run, expected) in &cases {
        match run() {
            Ok(()) => println!("ACCEPTED (wrong): {name}"),
            Err(e) if expected(&e) => {
                refused += 1;
                println!("refused: {name}: {e}");
            }
            Err(e) => println!("refused for the wrong reason: {name}: {e:?}"),
        }
    }
    println!("negative matrix: {refused}/{total} refused");
    ensure!(
        refused == total,
        "negative matrix: only {refused}/{total} refused as expected"
    );

    // The positive controls of the same certificates pass, so refusals are not vacuous.
    v.verify_user_x509(&one(&user_x509), t0())?;
    v.verify_host_x509(&one(&node_x509), t0(), Some(SystemRole::Node))?;
    v.verify_user_ssh(&user_ssh, t0())?;
    v.verify_host_ssh(&node_ssh, t0(), Some(SystemRole::Node))?;
    Ok(())
}

#[test]
fn verifier_refuses_another_clusters_ca() -> Result<()> {
    let other = cluster("other.example")?;
    let err = Verifier::new(CLUSTER, [other.host_ca.trusted()]).unwrap_err();
    ensure!(err.to_string() == "expected an identity of cluster example.com, found cluster other.example");
    Ok(())
}

#[tokio::test]
async fn cas_persist_through_both_backends() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let embedded = EmbeddedBackend::open_in_dir(dir.path())?;
    let memory = MemoryBackend::new();
    let c = cluster(CLUSTER)?;
    for backend in [&embedded as &dyn Backend, &memory] {
        ensure!(
            CertAuthority::load(backend, IdentityKind::Host, CLUSTER)
                .await?
                .is_none()
        );
        c.host_ca.save(backend).await?;
        c.user_ca.save(backend).await?;
        // A CA is never replaced by a second save.
        match c.host_ca.save(backend).await {
            Err(IdentityError::Backend(BackendError::AlreadyExists { .. })) => {}
            other => bail!("second save must fail with AlreadyExists, got {other:?}"),
        }
        let host = CertAuthority::load(backend, IdentityKind::Host, CLUSTER)
            .await?
            .context("host CA stored")?;
        ensure!(host.ca_pin() == c.host_ca.ca_pin());
        // The loaded CA signs certificates the original CA's verifier accepts.
        let cert = host.sign_host_x509(
            &node_request(vec![SystemRole::Node]),
            &tls_key()?.subject_public_key_info(),
            t0(),
        )?;
        c.verifier.verify_host_x509(&[cert], t0(), None)?;
        let user = CertAuthority::load(backend, IdentityKind::User, CLUSTER)
            .await?
            .context("user CA stored")?;
        let ssh_cert = user.sign_user_ssh(&alice_request(), ssh_key(4).public_key(), t0())?;
        c.verifier.verify_user_ssh(&ssh_cert, t0())?;
    }
    let item = embedded
        .get(&CertAuthority::backend_key(IdentityKind::Host, CLUSTER))
        .await?
        .context("stored")?;
    ensure!(
        item.key.to_string() == "/authorities/host/example.com",
        "{}",
        item.key
    );
    Ok(())
}

#[test]
fn ca_pin_is_sha256_of_the_spki() -> Result<()> {
    let c = cluster(CLUSTER)?;
    let pin = c.host_ca.ca_pin();
    let hex = pin.strip_prefix("sha256:").context("sha256: prefix")?;
    ensure!(hex.len() == 64 && hex.chars().all(|ch| ch.is_ascii_hexdigit()));
    ensure!(c.host_ca.trusted().ca_pin()? == pin);
    ensure!(c.user_ca.ca_pin() != pin);
    Ok(())
}

/// The rustls handshake (with the verifier's client verifier and root store) and the identity
/// helper accept the same certificates: a user signs in to a host's TLS server in memory.
#[test]
fn rustls_handshake_agrees_with_the_verifier() -> Result<()> {
    let c = cluster(CLUSTER)?;
    let server_key = tls_key()?;
    let mut req = node_request(vec![SystemRole::Auth]);
    req.additional_names = vec!["auth.example.com".into()];
    let server_cert =
        c.host_ca
            .sign_host_x509(&req, &server_key.subject_public_key_info(), SystemTime::now())?;
    let client_key = tls_key()?;
    let client_cert = c.user_ca.sign_user_x509(
        &alice_request(),
        &client_key.subject_public_key_info(),
        SystemTime::now(),
    )?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());

    let server_config = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(c.verifier.client_verifier()?)
        .with_single_cert(
            vec![server_cert],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der())),
        )?;
    let client_config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(c.verifier.root_store(Some(IdentityKind::Host)))
        .with_client_auth_cert(
            vec![client_cert],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(client_key.serialize_der())),
        )?;
    let mut server = rustls::ServerConnection::new(Arc::new(server_config))?;
    let mut client =
        rustls::ClientConnection::new(Arc::new(client_config), ServerName::try_from("auth.example.com")?)?;
    // Shuttle records between the two ends until both finish the handshake.
    let mut buf = Vec::new();
    for _ in 0..10 {
        if !client.is_handshaking() && !server.is_handshaking() {
            break;
        }
        buf.clear();
        client.write_tls(&mut buf)?;
        server.read_tls(&mut buf.as_slice())?;
        server.process_new_packets()?;
        buf.clear();
        server.write_tls(&mut buf)?;
        client.read_tls(&mut buf.as_slice())?;
        client.process_new_packets()?;
    }
    ensure!(
        !client.is_handshaking() && !server.is_handshaking(),
        "handshake finished"
    );
    let peer = server.peer_certificates().context("client certificate")?;
    let user = c.verifier.verify_user_x509(peer, SystemTime::now())?;
    ensure!(user.username == "alice" && user.roles == ["access", "editor"]);
    let server_peer = client.peer_certificates().context("server certificate")?;
    let host = c
        .verifier
        .verify_host_x509(server_peer, SystemTime::now(), Some(SystemRole::Auth))?;
    ensure!(host.node_name == "node-1");
    Ok(())
}

#[test]
fn a_node_host_certificate_is_accepted_only_for_the_host_it_names() -> Result<()> {
    let c = cluster(CLUSTER)?;
    let cert = c.host_ca.sign_host_ssh(
        &node_request(vec![SystemRole::Node]),
        ssh_key(1).public_key(),
        t0(),
    )?;
    let at = t0() + HOUR;
    for asked in [
        "node-1",
        "00000000-0000-0000-0000-000000001234",
        "00000000-0000-0000-0000-000000001234.example.com",
        "NODE-1.internal",
    ] {
        c.verifier.verify_node_host_ssh(&cert, at, asked)?;
    }
    let err = c
        .verifier
        .verify_node_host_ssh(&cert, at, "prod-db")
        .expect_err("another host's certificate");
    ensure!(
        err.to_string()
            == "the host certificate of node node-1 (00000000-0000-0000-0000-000000001234.example.com) does not name prod-db, the host asked for",
        "{err}"
    );
    // A proxy's certificate is no node's, whatever it names.
    let mut proxy = node_request(vec![SystemRole::Proxy]);
    proxy.node_name = "prod-db".into();
    let cert = c.host_ca.sign_host_ssh(&proxy, ssh_key(2).public_key(), t0())?;
    ensure!(c.verifier.verify_node_host_ssh(&cert, at, "prod-db").is_err());
    Ok(())
}
