//! The real OpenSSH server and client accept the cluster's SSH certificates, and refuse the
//! ones they must.
//!
//! A real `sshd` (openssh-server) runs on a loopback port with the host certificate signed by
//! the host CA and `TrustedUserCAKeys` set to the user CA; the real `ssh` client
//! (openssh-client) trusts the host CA through an `@cert-authority` line and signs in with a
//! user certificate whose principal is the login. Then each bad certificate is tried and must
//! be refused by OpenSSH itself.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result, bail, ensure};
use ssh_key::private::Ed25519Keypair;
use ssh_key::{LineEnding, PrivateKey};
use svc_core::identity::{CertAuthority, HostCertRequest, IdentityKind, SystemRole, UserCertRequest};
use uuid::Uuid;

const CLUSTER: &str = "example.com";
const SSHD: &str = "/usr/sbin/sshd";

/// Kills the sshd we started (by its PID) when the test ends, pass or fail.
struct Sshd(Child);

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn write_private(path: &Path, contents: &str) -> Result<()> {
    std::fs::write(path, contents)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(())
}

fn key(seed: u8) -> PrivateKey {
    PrivateKey::from(Ed25519Keypair::from_seed(&[seed; 32]))
}

fn user_request(logins: &[&str]) -> UserCertRequest {
    UserCertRequest {
        username: "alice".into(),
        roles: vec!["access".into()],
        logins: logins.iter().map(|l| (*l).to_owned()).collect(),
        ttl: Duration::from_secs(3600),
        db_route: None,
        ssh_permits: Default::default(),
    }
}

fn start_sshd(dir: &Path, host_ca: &CertAuthority, user_ca: &CertAuthority) -> Result<(Sshd, u16)> {
    if !Path::new(SSHD).exists() {
        bail!("{SSHD} not found: install the Debian package openssh-server (apt-get install openssh-server)");
    }
    // Privilege separation needs its empty directory.
    std::fs::create_dir_all("/run/sshd")?;
    let host_key = key(11);
    let host_key_path = dir.join("host_key");
    write_private(&host_key_path, &host_key.to_openssh(LineEnding::LF)?)?;
    let host_cert = host_ca.sign_host_ssh(
        &HostCertRequest {
            host_uuid: Uuid::new_v4(),
            node_name: "node-1".into(),
            roles: vec![SystemRole::Node],
            additional_names: vec!["127.0.0.1".into()],
            ttl: Duration::from_secs(3600),
        },
        host_key.public_key(),
        SystemTime::now(),
    )?;
    std::fs::write(dir.join("host_key-cert.pub"), host_cert.to_openssh()? + "\n")?;
    std::fs::write(
        dir.join("user_ca.pub"),
        user_ca.trusted().ssh_authorized_key()? + "\n",
    )?;

    // A free loopback port below the ephemeral range; sshd binds it right after.
    let port = svc_testkit::free_port("127.0.0.1");
    let config = format!(
        "Port {port}\nListenAddress 127.0.0.1\nHostKey {dir}/host_key\n\
         HostCertificate {dir}/host_key-cert.pub\nTrustedUserCAKeys {dir}/user_ca.pub\n\
         AuthorizedKeysFile none\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
         PubkeyAuthentication yes\nPermitRootLogin yes\nUsePAM no\nStrictModes no\n\
         PidFile none\nLogLevel VERBOSE\n",
        dir = dir.display()
    );
    let config_path = dir.join("sshd_config");
    std::fs::write(&config_path, config)?;
    let mut child = Command::new(SSHD)
        .arg("-D")
        .arg("-e")
        .arg("-f")
        .arg(&config_path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting sshd")?;
    let stderr = child.stderr.take().context("sshd stderr")?;
    let sshd = Sshd(child);
    let (ready_tx, ready_rx) = mpsc::channel();
    std::thread::spawn(move || {
        // Keep draining so sshd never blocks on a full pipe; report readiness once.
        let mut ready = Some(ready_tx);
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("sshd: {line}");
            if line.contains("Server listening on")
                && let Some(tx) = ready.take()
            {
                let _ = tx.send(());
            }
        }
    });
    ready_rx
        .recv_timeout(Duration::from_secs(30))
        .context("sshd did not report listening")?;
    Ok((sshd, port))
}

/// Signs in with `key` + `cert` as `login`, trusting hosts signed by `trusted_host_ca`.
/// Returns whether OpenSSH let the command run.
fn ssh(
    dir: &Path,
    port: u16,
    name: &str,
    user_key: &PrivateKey,
    cert: &ssh_key::Certificate,
    login: &str,
    trusted_host_ca: &CertAuthority,
) -> Result<bool> {
    let key_path: PathBuf = dir.join(format!("{name}_key"));
    write_private(&key_path, &user_key.to_openssh(LineEnding::LF)?)?;
    let cert_path = dir.join(format!("{name}_key-cert.pub"));
    std::fs::write(&cert_path, cert.to_openssh()? + "\n")?;
    let known_hosts = dir.join(format!("{name}_known_hosts"));
    std::fs::write(
        &known_hosts,
        format!(
            "@cert-authority * {}\n",
            trusted_host_ca.trusted().ssh_authorized_key()?
        ),
    )?;
    let opt = |k: &str, v: &Path| format!("{k}={}", v.display());
    let output = Command::new("ssh")
        .args(["-F", "/dev/null", "-p", &port.to_string(), "-i"])
        .arg(&key_path)
        .args(["-o", &opt("CertificateFile", &cert_path)])
        .args(["-o", &opt("UserKnownHostsFile", &known_hosts)])
        .args([
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=20",
            &format!("{login}@127.0.0.1"),
            "echo",
            "svc-signed-in",
        ])
        .stdin(Stdio::null())
        .output()
        .context("ssh not found: install the Debian package openssh-client")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("ssh {name}: exit {}, stderr: {}", output.status, stderr.trim());
    Ok(output.status.success() && stdout.trim() == "svc-signed-in")
}

#[test]
fn openssh_accepts_cluster_certificates_and_refuses_bad_ones() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let dir = dir.path();
    let now = SystemTime::now();
    let year = Duration::from_secs(86400 * 365);
    let host_ca = CertAuthority::generate(IdentityKind::Host, CLUSTER, now, year)?;
    let user_ca = CertAuthority::generate(IdentityKind::User, CLUSTER, now, year)?;
    let other_host_ca = CertAuthority::generate(IdentityKind::Host, "other.example", now, year)?;
    let other_user_ca = CertAuthority::generate(IdentityKind::User, "other.example", now, year)?;
    let (_sshd, port) = start_sshd(dir, &host_ca, &user_ca)?;

    let alice = key(21);
    let good = user_ca.sign_user_ssh(&user_request(&["root"]), alice.public_key(), now)?;
    ensure!(
        ssh(dir, port, "good", &alice, &good, "root", &host_ca)?,
        "a user certificate with the login as principal must sign in"
    );

    let wrong_login = user_ca.sign_user_ssh(&user_request(&["alice"]), alice.public_key(), now)?;
    let expired = user_ca.sign_user_ssh(
        &user_request(&["root"]),
        alice.public_key(),
        now - Duration::from_secs(3 * 3600),
    )?;
    let foreign = other_user_ca.sign_user_ssh(&user_request(&["root"]), alice.public_key(), now)?;
    let host_as_user = host_ca.sign_host_ssh(
        &HostCertRequest {
            host_uuid: Uuid::new_v4(),
            node_name: "root".into(),
            roles: vec![SystemRole::Node],
            additional_names: vec![],
            ttl: Duration::from_secs(3600),
        },
        alice.public_key(),
        now,
    )?;
    let cases = [
        (
            "wrong_login",
            &wrong_login,
            &host_ca,
            "login not among the certificate's principals",
        ),
        ("expired", &expired, &host_ca, "expired user certificate"),
        (
            "foreign",
            &foreign,
            &host_ca,
            "user certificate from another cluster's user CA",
        ),
        (
            "host_as_user",
            &host_as_user,
            &host_ca,
            "host certificate presented as a user one",
        ),
        (
            "foreign_host_ca",
            &good,
            &other_host_ca,
            "server's host certificate from an untrusted CA",
        ),
    ];
    let mut refused = 0;
    for (name, cert, trusted_host_ca, what) in cases {
        if ssh(dir, port, name, &alice, cert, "root", trusted_host_ca)? {
            println!("ACCEPTED (wrong): {what}");
        } else {
            println!("refused by OpenSSH: {what}");
            refused += 1;
        }
    }
    println!("openssh matrix: {refused}/{} refused", cases.len());
    ensure!(
        refused == cases.len(),
        "OpenSSH accepted a certificate it must refuse"
    );
    // And the good certificate still works after all the refusals.
    ensure!(ssh(dir, port, "good_again", &alice, &good, "root", &host_ca)?);
    Ok(())
}
