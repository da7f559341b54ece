//! The certificates are standard: the real `ssh-keygen` (openssh-client) reads the OpenSSH CA
//! key and certificates, and the real `openssl` (openssl) verifies the X.509 chain and the CA
//! pin. A missing tool fails the test with the package to install.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail, ensure};
use rcgen::{KeyPair, PKCS_ECDSA_P256_SHA256, PublicKeyData};
use sha2::{Digest, Sha256};
use ssh_key::private::Ed25519Keypair;
use ssh_key::{HashAlg, PrivateKey};
use svc_core::identity::{
    CertAuthority, HostCertRequest, IdentityKind, SSH_IDENTITY_EXTENSION, SystemRole, UserCertRequest,
};
use uuid::Uuid;

const CLUSTER: &str = "example.com";

/// Runs a tool; fails naming the Debian package when it is missing or the tool fails.
fn run(program: &str, package: &str, args: &[&str]) -> Result<String> {
    let output = Command::new(program)
        .args(args)
        .env("TZ", "UTC")
        .output()
        .with_context(|| {
            format!("{program} not found: install the Debian package {package} (apt-get install {package})")
        })?;
    let stdout = String::from_utf8(output.stdout)?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        bail!("{program} {args:?} failed ({}): {stdout}{stderr}", output.status);
    }
    Ok(stdout + &stderr)
}

fn ssh_keygen(args: &[&str]) -> Result<String> {
    run("ssh-keygen", "openssh-client", args)
}

fn openssl(args: &[&str]) -> Result<String> {
    run("openssl", "openssl", args)
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap_or_default()
}

fn iso(t: SystemTime) -> String {
    let dt = time::OffsetDateTime::from(t);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
        dt.year(),
        u8::from(dt.month()),
        dt.day(),
        dt.hour(),
        dt.minute(),
        dt.second()
    )
}

#[test]
fn ssh_keygen_reads_ca_key_and_user_certificate() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let user_ca =
        CertAuthority::generate(IdentityKind::User, CLUSTER, now, Duration::from_secs(86400 * 365))?;

    // The CA public key, in the form sshd's TrustedUserCAKeys takes.
    let ca_pub = dir.path().join("user_ca.pub");
    std::fs::write(&ca_pub, user_ca.trusted().ssh_authorized_key()? + "\n")?;
    let fingerprint = user_ca.ssh_public_key().fingerprint(HashAlg::Sha256).to_string();
    let listed = ssh_keygen(&["-l", "-f", path(&ca_pub)])?;
    ensure!(
        listed.trim() == format!("256 {fingerprint} svc-user-ca@{CLUSTER} (ED25519)"),
        "ssh-keygen -l: {listed}"
    );
    // And it converts to RFC 4716, i.e. it parsed the key itself, not only the line.
    let exported = ssh_keygen(&["-e", "-f", path(&ca_pub)])?;
    ensure!(exported.contains("BEGIN SSH2 PUBLIC KEY"), "{exported}");

    let user_key = PrivateKey::from(Ed25519Keypair::from_seed(&[7; 32]));
    let ttl = Duration::from_secs(8 * 3600);
    let req = UserCertRequest {
        username: "alice".into(),
        roles: vec!["access".into(), "editor".into()],
        logins: vec!["alice".into(), "root".into()],
        ttl,
        db_route: None,
        // Roles that allow both forwardings: the certificate permits both.
        ssh_permits: svc_core::identity::SshPermits {
            port_forwarding: true,
            agent_forwarding: true,
        },
    };
    let cert = user_ca.sign_user_ssh(&req, user_key.public_key(), now)?;
    let cert_path = dir.path().join("id_ed25519-cert.pub");
    std::fs::write(&cert_path, cert.to_openssh()? + "\n")?;
    let shown = ssh_keygen(&["-L", "-f", path(&cert_path)])?;
    println!("{shown}");
    let lines: Vec<&str> = shown.lines().map(str::trim).collect();
    let has = |line: &str| lines.contains(&line);
    ensure!(
        has("Type: ssh-ed25519-cert-v01@openssh.com user certificate"),
        "type: {shown}"
    );
    ensure!(
        has(&format!("Signing CA: ED25519 {fingerprint} (using ssh-ed25519)")),
        "signing CA: {shown}"
    );
    ensure!(has("Key ID: \"alice\""), "key id: {shown}");
    let valid = format!(
        "Valid: from {} to {}",
        iso(now - svc_core::identity::CLOCK_SKEW),
        iso(now + ttl)
    );
    ensure!(has(&valid), "expected {valid:?} in {shown}");
    let principals = lines
        .iter()
        .position(|l| *l == "Principals:")
        .context("principals section")?;
    ensure!(
        lines[principals + 1..principals + 3] == ["alice", "root"],
        "{shown}"
    );
    ensure!(has("Critical Options: (none)"), "{shown}");
    for ext in ["permit-agent-forwarding", "permit-port-forwarding", "permit-pty"] {
        ensure!(has(ext), "extension {ext}: {shown}");
    }
    ensure!(
        lines.iter().any(|l| l.starts_with(SSH_IDENTITY_EXTENSION)),
        "identity extension: {shown}"
    );
    Ok(())
}

#[test]
fn ssh_keygen_reads_host_certificate() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let now = SystemTime::now();
    let host_ca = CertAuthority::generate(IdentityKind::Host, CLUSTER, now, Duration::from_secs(86400))?;
    let req = HostCertRequest {
        host_uuid: Uuid::from_u128(42),
        node_name: "node-1".into(),
        roles: vec![SystemRole::Node],
        additional_names: vec![],
        ttl: Duration::from_secs(3600),
    };
    let host_key = PrivateKey::from(Ed25519Keypair::from_seed(&[8; 32]));
    let cert = host_ca.sign_host_ssh(&req, host_key.public_key(), now)?;
    let cert_path = dir.path().join("host-cert.pub");
    std::fs::write(&cert_path, cert.to_openssh()? + "\n")?;
    let shown = ssh_keygen(&["-L", "-f", path(&cert_path)])?;
    ensure!(
        shown.contains("ssh-ed25519-cert-v01@openssh.com host certificate"),
        "{shown}"
    );
    let host_id = format!("{}.{CLUSTER}", Uuid::from_u128(42));
    ensure!(shown.contains(&format!("Key ID: \"{host_id}\"")), "{shown}");
    ensure!(shown.contains(&host_id) && shown.contains("node-1"), "{shown}");
    Ok(())
}

#[test]
fn openssl_verifies_x509_chain_and_ca_pin() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let now = SystemTime::now();
    let year = Duration::from_secs(86400 * 365);
    let host_ca = CertAuthority::generate(IdentityKind::Host, CLUSTER, now, year)?;
    let user_ca = CertAuthority::generate(IdentityKind::User, CLUSTER, now, year)?;
    let host_ca_pem = dir.path().join("host_ca.pem");
    let user_ca_pem = dir.path().join("user_ca.pem");
    std::fs::write(&host_ca_pem, host_ca.tls_cert_pem())?;
    std::fs::write(&user_ca_pem, user_ca.tls_cert_pem())?;

    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let host_req = HostCertRequest {
        host_uuid: Uuid::from_u128(7),
        node_name: "proxy-1".into(),
        roles: vec![SystemRole::Proxy],
        additional_names: vec!["proxy.example.com".into(), "127.0.0.1".into()],
        ttl: Duration::from_secs(3600),
    };
    let host_cert = host_ca.sign_host_x509(&host_req, &key.subject_public_key_info(), now)?;
    let user_req = UserCertRequest {
        username: "alice".into(),
        roles: vec!["access".into()],
        logins: vec!["alice".into()],
        ttl: Duration::from_secs(3600),
        db_route: None,
        ssh_permits: Default::default(),
    };
    let user_cert = user_ca.sign_user_x509(&user_req, &key.subject_public_key_info(), now)?;
    let pem = |der: &[u8]| pem::encode(&pem::Pem::new("CERTIFICATE", der.to_vec()));
    let host_pem = dir.path().join("host.pem");
    let user_pem = dir.path().join("user.pem");
    std::fs::write(&host_pem, pem(&host_cert))?;
    std::fs::write(&user_pem, pem(&user_cert))?;

    // Chains, purposes and names as OpenSSL sees them.
    let out = openssl(&[
        "verify",
        "-CAfile",
        path(&host_ca_pem),
        "-purpose",
        "sslserver",
        "-verify_hostname",
        "proxy.example.com",
        path(&host_pem),
    ])?;
    ensure!(out.contains(": OK"), "{out}");
    let out = openssl(&[
        "verify",
        "-CAfile",
        path(&host_ca_pem),
        "-purpose",
        "sslclient",
        path(&host_pem),
    ])?;
    ensure!(out.contains(": OK"), "{out}");
    let out = openssl(&[
        "verify",
        "-CAfile",
        path(&user_ca_pem),
        "-purpose",
        "sslclient",
        path(&user_pem),
    ])?;
    ensure!(out.contains(": OK"), "{out}");
    // A user certificate is not a server certificate, and the host CA does not vouch for it.
    ensure!(
        openssl(&[
            "verify",
            "-CAfile",
            path(&user_ca_pem),
            "-purpose",
            "sslserver",
            path(&user_pem)
        ])
        .is_err()
    );
    ensure!(openssl(&["verify", "-CAfile", path(&host_ca_pem), path(&user_pem)]).is_err());

    // The subject and the identity extension are visible to standard tools.
    let text = openssl(&["x509", "-in", path(&user_pem), "-noout", "-text"])?;
    ensure!(text.contains("CN = alice") || text.contains("CN=alice"), "{text}");
    ensure!(text.contains("1.3.9999.4242.1"), "{text}");
    ensure!(text.contains("TLS Web Client Authentication"), "{text}");

    // The CA pin is SHA-256 over the SubjectPublicKeyInfo OpenSSL extracts.
    let spki_pem = dir.path().join("ca_spki.pem");
    let spki_der = dir.path().join("ca_spki.der");
    openssl(&[
        "x509",
        "-in",
        path(&host_ca_pem),
        "-noout",
        "-pubkey",
        "-out",
        path(&spki_pem),
    ])?;
    openssl(&[
        "pkey",
        "-pubin",
        "-in",
        path(&spki_pem),
        "-outform",
        "DER",
        "-out",
        path(&spki_der),
    ])?;
    let digest = hex::encode(Sha256::digest(std::fs::read(&spki_der)?));
    ensure!(
        host_ca.ca_pin() == format!("sha256:{digest}"),
        "{} vs {digest}",
        host_ca.ca_pin()
    );
    println!("ca pin {} matches openssl", host_ca.ca_pin());
    Ok(())
}
