//! [`CertAuthority`] (a cluster's host or user CA, with its private keys) and [`TrustedCa`]
//! (its public half, what verifiers and joining agents hold).

use std::fmt;
use std::time::{Duration, SystemTime};

use rcgen::{Issuer, KeyPair, PKCS_ECDSA_P256_SHA256, PublicKeyData, SubjectPublicKeyInfo};
use rustls::pki_types::CertificateDer;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use ssh_key::private::Ed25519Keypair;
use ssh_key::{Certificate, LineEnding, PrivateKey, PublicKey};

use super::x509::{self, random_32_bytes};
use super::{Claims, HostCertRequest, IdentityError, IdentityKind, UserCertRequest, VerifyError};
use crate::Secret;
use crate::backend::{Backend, Item, Key, Revision};

/// Version of the stored CA format written by [`CertAuthority::to_stored`].
const STORED_VERSION: u8 = 1;

/// A certificate authority of one cluster: the host CA or the user CA.
///
/// It holds two key pairs, because the two certificate formats are signed separately: an
/// ECDSA P-256 key behind a self-signed X.509 CA certificate (P-256 is what every TLS stack a
/// cluster meets accepts: rustls, OpenSSL clients such as psql, Go's kubectl) and an Ed25519
/// OpenSSH CA key. Both private keys are held in [`Secret`] and never printed.
pub struct CertAuthority {
    kind: IdentityKind,
    cluster: String,
    tls_cert: CertificateDer<'static>,
    not_after: SystemTime,
    issuer: Secret<Issuer<'static, KeyPair>>,
    ssh_key: Secret<PrivateKey>,
}

impl fmt::Debug for CertAuthority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertAuthority")
            .field("kind", &self.kind)
            .field("cluster", &self.cluster)
            .field("ca_pin", &self.ca_pin())
            .field("keys", &self.issuer)
            .finish()
    }
}

/// What [`CertAuthority::to_stored`] writes (JSON). Not `Debug`: it holds private keys.
#[derive(Serialize, Deserialize)]
struct StoredCa {
    version: u8,
    kind: String,
    cluster: String,
    tls_cert_pem: String,
    tls_key_pem: String,
    ssh_private_key: String,
}

impl CertAuthority {
    /// Creates a new CA of `kind` for `cluster`, valid from `now` (less [`CLOCK_SKEW`]) for
    /// `ttl`.
    ///
    /// [`CLOCK_SKEW`]: super::CLOCK_SKEW
    pub fn generate(
        kind: IdentityKind,
        cluster: &str,
        now: SystemTime,
        ttl: Duration,
    ) -> Result<Self, IdentityError> {
        if cluster.is_empty() || cluster.contains('/') || cluster.chars().any(char::is_control) {
            return Err(IdentityError::InvalidRequest {
                field: "cluster_name",
                reason: format!(
                    "a cluster name must be non-empty without '/' or control characters, got {cluster:?}"
                ),
            });
        }
        let tls_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let params = x509::ca_params(kind, cluster, now, ttl)?;
        let tls_cert = params.self_signed(&tls_key)?.der().clone();
        let ssh_key = PrivateKey::from(Ed25519Keypair::from_seed(&random_32_bytes()?));
        Self::assemble(kind, cluster.to_owned(), tls_cert, tls_key, ssh_key)
    }

    fn assemble(
        kind: IdentityKind,
        cluster: String,
        tls_cert: CertificateDer<'static>,
        tls_key: KeyPair,
        ssh_key: PrivateKey,
    ) -> Result<Self, IdentityError> {
        let parsed = x509::parse(&tls_cert)
            .map_err(|e| IdentityError::MalformedStored(format!("CA certificate: {e}")))?;
        let not_after = x509::validity(&parsed)
            .map_err(|e| IdentityError::MalformedStored(format!("CA certificate: {e}")))?
            .not_after;
        if parsed.public_key().raw != tls_key.subject_public_key_info().as_slice() {
            return Err(IdentityError::MalformedStored(
                "the CA certificate does not belong to the stored key".into(),
            ));
        }
        let issuer = Issuer::from_ca_cert_der(&tls_cert, tls_key)?;
        Ok(Self {
            kind,
            cluster,
            tls_cert,
            not_after,
            issuer: Secret::new(issuer),
            ssh_key: Secret::new(ssh_key),
        })
    }

    /// Host or user CA.
    pub fn kind(&self) -> IdentityKind {
        self.kind
    }

    /// The cluster the CA belongs to.
    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// The self-signed X.509 CA certificate (DER).
    pub fn tls_cert_der(&self) -> &CertificateDer<'static> {
        &self.tls_cert
    }

    /// The X.509 CA certificate as PEM.
    pub fn tls_cert_pem(&self) -> String {
        cert_pem(&self.tls_cert)
    }

    /// The OpenSSH CA public key.
    pub fn ssh_public_key(&self) -> &PublicKey {
        self.ssh_key.expose().public_key()
    }

    /// When the CA's X.509 certificate ends; no certificate it signs outlives it.
    pub fn not_after(&self) -> SystemTime {
        self.not_after
    }

    /// `sha256:<hex>` of the CA certificate's SubjectPublicKeyInfo: the value `tctl status`
    /// shows and `--ca-pin` checks.
    pub fn ca_pin(&self) -> String {
        pin_of_spki(&self.issuer.expose().key().subject_public_key_info())
    }

    /// The public half, for verifiers and joining agents.
    pub fn trusted(&self) -> TrustedCa {
        TrustedCa {
            kind: self.kind,
            cluster: self.cluster.clone(),
            tls_cert: self.tls_cert.clone(),
            ssh_public_key: self.ssh_public_key().clone(),
        }
    }

    fn require(&self, kind: IdentityKind) -> Result<(), IdentityError> {
        if self.kind == kind {
            Ok(())
        } else {
            Err(IdentityError::WrongAuthority {
                expected: kind,
                found: self.kind,
            })
        }
    }

    /// Signs an X.509 host certificate for the key `subject_spki_der` (a DER
    /// SubjectPublicKeyInfo, as a joining agent sends it). Host CA only.
    pub fn sign_host_x509(
        &self,
        req: &HostCertRequest,
        subject_spki_der: &[u8],
        now: SystemTime,
    ) -> Result<CertificateDer<'static>, IdentityError> {
        self.require(IdentityKind::Host)?;
        let claims = Claims::for_host(req, &self.cluster)?;
        self.sign_x509(&claims, IdentityKind::Host, subject_spki_der, now, req.ttl)
    }

    /// Signs a short-lived X.509 user certificate for the key `subject_spki_der`. User CA only.
    pub fn sign_user_x509(
        &self,
        req: &UserCertRequest,
        subject_spki_der: &[u8],
        now: SystemTime,
    ) -> Result<CertificateDer<'static>, IdentityError> {
        self.require(IdentityKind::User)?;
        let claims = Claims::for_user(req, &self.cluster)?;
        self.sign_x509(&claims, IdentityKind::User, subject_spki_der, now, req.ttl)
    }

    fn sign_x509(
        &self,
        claims: &Claims,
        kind: IdentityKind,
        subject_spki_der: &[u8],
        now: SystemTime,
        ttl: Duration,
    ) -> Result<CertificateDer<'static>, IdentityError> {
        let subject = SubjectPublicKeyInfo::from_der(subject_spki_der)?;
        let params = x509::leaf_params(claims, kind, now, ttl, self.not_after)?;
        Ok(params.signed_by(&subject, self.issuer.expose())?.der().clone())
    }

    /// Signs an OpenSSH host certificate (principals: host ID, node name, additional names).
    /// Host CA only.
    pub fn sign_host_ssh(
        &self,
        req: &HostCertRequest,
        subject: &PublicKey,
        now: SystemTime,
    ) -> Result<Certificate, IdentityError> {
        self.require(IdentityKind::Host)?;
        let claims = Claims::for_host(req, &self.cluster)?;
        super::ssh::sign(
            self.ssh_key.expose(),
            &claims,
            super::ssh::SignedKind::Host,
            subject,
            now,
            req.ttl,
            self.not_after,
        )
    }

    /// Signs a short-lived OpenSSH user certificate (principals: the logins; the roles in the
    /// identity extension). User CA only.
    pub fn sign_user_ssh(
        &self,
        req: &UserCertRequest,
        subject: &PublicKey,
        now: SystemTime,
    ) -> Result<Certificate, IdentityError> {
        self.require(IdentityKind::User)?;
        let claims = Claims::for_user(req, &self.cluster)?;
        super::ssh::sign(
            self.ssh_key.expose(),
            &claims,
            super::ssh::SignedKind::User(req.ssh_permits),
            subject,
            now,
            req.ttl,
            self.not_after,
        )
    }

    /// The CA with its private keys, as bytes for the caller to store (JSON holding PEM
    /// documents). Keep them as secret as the keys.
    pub fn to_stored(&self) -> Result<Secret<Vec<u8>>, IdentityError> {
        let stored = StoredCa {
            version: STORED_VERSION,
            kind: self.kind.as_str().to_owned(),
            cluster: self.cluster.clone(),
            tls_cert_pem: self.tls_cert_pem(),
            tls_key_pem: self.issuer.expose().key().serialize_pem(),
            ssh_private_key: self.ssh_key.expose().to_openssh(LineEnding::LF)?.to_string(),
        };
        serde_json::to_vec(&stored)
            .map(Secret::new)
            .map_err(|e| IdentityError::MalformedStored(e.to_string()))
    }

    /// Loads bytes written by [`to_stored`](Self::to_stored).
    pub fn from_stored(bytes: &[u8]) -> Result<Self, IdentityError> {
        // serde_json's error names a position, never the content: safe with keys inside.
        let stored: StoredCa =
            serde_json::from_slice(bytes).map_err(|e| IdentityError::MalformedStored(e.to_string()))?;
        if stored.version != STORED_VERSION {
            return Err(IdentityError::MalformedStored(format!(
                "expected version {STORED_VERSION}, found {}",
                stored.version
            )));
        }
        let kind = stored
            .kind
            .parse()
            .map_err(|e: super::UnknownName| IdentityError::MalformedStored(e.to_string()))?;
        let tls_cert = pem::parse(&stored.tls_cert_pem)
            .map_err(|e| IdentityError::MalformedStored(format!("CA certificate PEM: {e}")))?;
        let tls_key = KeyPair::from_pem(&stored.tls_key_pem)
            .map_err(|_| IdentityError::MalformedStored("CA TLS key PEM".into()))?;
        let ssh_key = PrivateKey::from_openssh(&stored.ssh_private_key)
            .map_err(|_| IdentityError::MalformedStored("CA SSH private key".into()))?;
        Self::assemble(
            kind,
            stored.cluster,
            CertificateDer::from(tls_cert.into_contents()),
            tls_key,
            ssh_key,
        )
    }

    /// Where a CA lives in the backend: `/authorities/<kind>/<cluster>`.
    pub fn backend_key(kind: IdentityKind, cluster: &str) -> Key {
        Key::from_segments(["authorities", kind.as_str(), cluster])
    }

    /// Stores the CA under [`backend_key`](Self::backend_key). Fails with
    /// [`BackendError::AlreadyExists`](crate::backend::BackendError::AlreadyExists) if one is
    /// there: a CA is never replaced by accident (rotation is its own operation).
    pub async fn save(&self, backend: &dyn Backend) -> Result<Revision, IdentityError> {
        let key = Self::backend_key(self.kind, &self.cluster);
        Ok(backend
            .create(Item::new(key, self.to_stored()?.into_inner()))
            .await?)
    }

    /// Loads the CA of `kind` for `cluster` from the backend, if one is stored.
    pub async fn load(
        backend: &dyn Backend,
        kind: IdentityKind,
        cluster: &str,
    ) -> Result<Option<Self>, IdentityError> {
        let Some(item) = backend.get(&Self::backend_key(kind, cluster)).await? else {
            return Ok(None);
        };
        let ca = Self::from_stored(&item.value)?;
        if ca.kind != kind || ca.cluster != cluster {
            return Err(IdentityError::MalformedStored(format!(
                "expected the {kind} CA of {cluster}, found the {} CA of {}",
                ca.kind, ca.cluster
            )));
        }
        Ok(Some(ca))
    }
}

fn cert_pem(der: &CertificateDer<'_>) -> String {
    pem::encode(&pem::Pem::new("CERTIFICATE", der.to_vec()))
}

fn pin_of_spki(spki_der: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(spki_der)))
}

/// The public half of a [`CertAuthority`]: what verifiers trust and what joining agents
/// check against the CA pin.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct TrustedCa {
    kind: IdentityKind,
    cluster: String,
    tls_cert: CertificateDer<'static>,
    ssh_public_key: PublicKey,
}

impl TrustedCa {
    /// A trusted CA from its parts: the X.509 CA certificate (PEM) and the OpenSSH CA public
    /// key (`ssh-ed25519 AAAA…` form).
    pub fn from_pem(
        kind: IdentityKind,
        cluster: &str,
        tls_cert_pem: &str,
        ssh_public_key: &str,
    ) -> Result<Self, VerifyError> {
        let cert = pem::parse(tls_cert_pem)
            .map_err(|e| VerifyError::Malformed(format!("CA certificate PEM: {e}")))?;
        if cert.tag() != "CERTIFICATE" {
            return Err(VerifyError::Malformed(format!(
                "expected a CERTIFICATE PEM block, found {}",
                cert.tag()
            )));
        }
        let tls_cert = CertificateDer::from(cert.into_contents());
        x509::parse(&tls_cert)?;
        let ssh_public_key = PublicKey::from_openssh(ssh_public_key)
            .map_err(|e| VerifyError::Malformed(format!("CA SSH public key: {e}")))?;
        Ok(Self {
            kind,
            cluster: cluster.to_owned(),
            tls_cert,
            ssh_public_key,
        })
    }

    /// Host or user CA.
    pub fn kind(&self) -> IdentityKind {
        self.kind
    }

    /// The cluster.
    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// The X.509 CA certificate (DER).
    pub fn tls_cert_der(&self) -> &CertificateDer<'static> {
        &self.tls_cert
    }

    /// The X.509 CA certificate (PEM).
    pub fn tls_cert_pem(&self) -> String {
        cert_pem(&self.tls_cert)
    }

    /// The OpenSSH CA public key.
    pub fn ssh_public_key(&self) -> &PublicKey {
        &self.ssh_public_key
    }

    /// The CA public key as an `authorized_keys` / `TrustedUserCAKeys` line
    /// (`ssh-ed25519 AAAA… svc-<kind>-ca@<cluster>`); prefix it with `@cert-authority <host
    /// pattern> ` for `known_hosts`.
    pub fn ssh_authorized_key(&self) -> Result<String, IdentityError> {
        let mut key = self.ssh_public_key.clone();
        key.set_comment(format!("svc-{}-ca@{}", self.kind, self.cluster));
        Ok(key.to_openssh()?)
    }

    /// `sha256:<hex>` of the CA certificate's SubjectPublicKeyInfo (see
    /// [`CertAuthority::ca_pin`]).
    pub fn ca_pin(&self) -> Result<String, VerifyError> {
        Ok(pin_of_spki(&x509::spki_der(&self.tls_cert)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
    }

    #[test]
    fn debug_never_shows_keys() {
        let ca = CertAuthority::generate(
            IdentityKind::Host,
            "example.com",
            now(),
            Duration::from_secs(3600),
        )
        .unwrap();
        let debug = format!("{ca:?}");
        assert!(debug.contains("keys: ***"), "{debug}");
        assert!(!debug.contains("PRIVATE"), "{debug}");
        let stored = ca.to_stored().unwrap();
        assert_eq!(format!("{stored:?}"), "***");
    }

    #[test]
    fn stored_round_trip_keeps_keys_and_pin() {
        let ca = CertAuthority::generate(
            IdentityKind::User,
            "example.com",
            now(),
            Duration::from_secs(3600),
        )
        .unwrap();
        let back = CertAuthority::from_stored(ca.to_stored().unwrap().expose()).unwrap();
        assert_eq!(back.kind(), IdentityKind::User);
        assert_eq!(back.cluster(), "example.com");
        assert_eq!(back.ca_pin(), ca.ca_pin());
        assert_eq!(back.ssh_public_key(), ca.ssh_public_key());
        assert_eq!(back.trusted(), ca.trusted());
        assert_eq!(ca.trusted().ca_pin().unwrap(), ca.ca_pin());
        assert!(CertAuthority::from_stored(b"{}").is_err());
    }

    #[test]
    fn bad_cluster_names_are_refused() {
        for bad in ["", "a/b", "a\nb"] {
            assert!(CertAuthority::generate(IdentityKind::Host, bad, now(), Duration::from_secs(1)).is_err());
        }
    }
}
