//! OpenSSH certificate encoding of identities (ssh-key): what the CA signs for the reverse
//! tunnel and SSH access, and the reading back of the claims.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ssh_key::certificate::{Builder, CertType};
use ssh_key::{Certificate, PrivateKey, PublicKey};

use super::x509::{random_32_bytes, random_u64, whole_seconds};
use super::{CLOCK_SKEW, Claims, IdentityError, IdentityKind, SSH_IDENTITY_EXTENSION, VerifyError};

/// The standard extension every user certificate carries: what an interactive session needs.
/// (X11 forwarding and `~/.ssh/rc` are left off; port and agent forwarding follow the role
/// options, [`SshPermits`](super::SshPermits).)
const USER_PERMIT_PTY: &str = "permit-pty";

fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_secs()
}

/// What kind of certificate [`sign`] makes: a host's, or a user's with what its sessions may
/// do besides running programs.
#[derive(Clone, Copy, Debug)]
pub(crate) enum SignedKind {
    /// A host certificate.
    Host,
    /// A user certificate with these `permit-*` extensions.
    User(super::SshPermits),
}

/// Signs an OpenSSH certificate stating `claims` for `subject`.
pub(crate) fn sign(
    ca_key: &PrivateKey,
    claims: &Claims,
    kind: SignedKind,
    subject: &PublicKey,
    now: SystemTime,
    ttl: Duration,
    ca_not_after: SystemTime,
) -> Result<Certificate, IdentityError> {
    let now = whole_seconds(now);
    let valid_after = unix(now - CLOCK_SKEW);
    let valid_before = unix((now + ttl).min(ca_not_after));
    let mut builder = Builder::new(
        random_32_bytes()?.to_vec(),
        subject.key_data().clone(),
        valid_after,
        valid_before,
    )?;
    builder.serial(random_u64()?)?;
    builder.key_id(claims.name.as_str())?;
    let principals: Vec<&String> = match kind {
        SignedKind::Host => {
            builder.cert_type(CertType::Host)?;
            let mut principals = vec![&claims.name, &claims.node_name];
            principals.extend(claims.names.iter());
            principals
        }
        SignedKind::User(permits) => {
            builder.cert_type(CertType::User)?;
            builder.extension(USER_PERMIT_PTY, "")?;
            if permits.port_forwarding {
                builder.extension(super::SshPermits::PORT_FORWARDING, "")?;
            }
            if permits.agent_forwarding {
                builder.extension(super::SshPermits::AGENT_FORWARDING, "")?;
            }
            claims.logins.iter().collect()
        }
    };
    // OpenSSH reads an empty principal list as "any principal": never sign one.
    if principals.is_empty() {
        return Err(IdentityError::InvalidRequest {
            field: "logins",
            reason: "an SSH user certificate needs at least one login".into(),
        });
    }
    let mut seen = std::collections::HashSet::new();
    for principal in principals.into_iter().filter(|p| seen.insert(*p)) {
        builder.valid_principal(principal.as_str())?;
    }
    let json = serde_json::to_string(claims).map_err(|e| IdentityError::InvalidRequest {
        field: "claims",
        reason: e.to_string(),
    })?;
    builder.extension(SSH_IDENTITY_EXTENSION, json)?;
    Ok(builder.sign(ca_key)?)
}

/// The claims an OpenSSH certificate states, checked against its key ID and type.
pub(crate) fn read_claims(cert: &Certificate) -> Result<Claims, VerifyError> {
    let json = cert
        .extensions()
        .get(SSH_IDENTITY_EXTENSION)
        .ok_or(VerifyError::MissingIdentity)?;
    let claims: Claims =
        serde_json::from_str(json).map_err(|e| VerifyError::Malformed(format!("identity extension: {e}")))?;
    if cert.key_id() != claims.name {
        return Err(VerifyError::Malformed(format!(
            "key id {:?} does not match the identity name {:?}",
            cert.key_id(),
            claims.name
        )));
    }
    Ok(claims)
}

/// The kind an OpenSSH certificate type stands for.
pub(crate) fn kind_of(cert: &Certificate) -> IdentityKind {
    match cert.cert_type() {
        CertType::Host => IdentityKind::Host,
        CertType::User => IdentityKind::User,
    }
}
