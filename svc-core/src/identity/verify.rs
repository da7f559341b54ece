//! [`Verifier`]: from a presented certificate to a typed identity, or a typed refusal.
//!
//! X.509 chains are checked by rustls-webpki — the same code rustls runs in the handshake, so
//! this helper and a `WebPkiClientVerifier` ([`Verifier::client_verifier`]) cannot disagree on
//! signatures, validity or key usage. webpki does not expose extensions, so the identity is
//! then read with x509-parser (already in the build for rcgen's CA loading). OpenSSH
//! certificates are checked with ssh-key against the CA fingerprints.
//!
//! A verifier remembers the X.509 certificates it accepted ([`VerifiedChains`]): the same
//! certificate presented again (every connection of a resumed TLS session, the proxy's check
//! and then the access rules' check of one connection) is answered from that memory while it is
//! valid, without a signature verification. The memory belongs to the verifier and its fixed
//! CA set, so a CA rotation (a new verifier) starts empty.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::RootCertStore;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use ssh_key::{Certificate, HashAlg};
use webpki::{EndEntityCert, KeyUsage};

use super::{HostIdentity, Identity, IdentityKind, SystemRole, TrustedCa, UserIdentity, Validity, ssh, x509};

/// Why a presented certificate was refused. Every variant is a refusal: the peer is not
/// authenticated.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// No certificate was presented.
    #[error("no certificate presented")]
    NoCertificate,
    /// The certificate (or a CA given to the verifier) could not be parsed.
    #[error("malformed certificate: {0}")]
    Malformed(String),
    /// The certificate's validity ended.
    #[error(
        "certificate expired at {}, now is {}",
        humantime::format_rfc3339(*not_after),
        humantime::format_rfc3339(*now)
    )]
    Expired {
        /// End of validity.
        not_after: SystemTime,
        /// The time of verification.
        now: SystemTime,
    },
    /// The certificate's validity has not started.
    #[error(
        "certificate not valid before {}, now is {}",
        humantime::format_rfc3339(*not_before),
        humantime::format_rfc3339(*now)
    )]
    NotYetValid {
        /// Start of validity.
        not_before: SystemTime,
        /// The time of verification.
        now: SystemTime,
    },
    /// No trusted CA of the expected kind signed it (another cluster's CA, or none).
    #[error("certificate is not signed by a trusted {expected} CA of cluster {cluster}")]
    UntrustedIssuer {
        /// The CA kind that should have signed it.
        expected: IdentityKind,
        /// The verifier's cluster.
        cluster: String,
    },
    /// A valid certificate of the other kind (a user certificate where a host one is
    /// required, or the reverse).
    #[error("expected a {expected} certificate, found a {found} certificate")]
    WrongKind {
        /// The kind required.
        expected: IdentityKind,
        /// The kind presented.
        found: IdentityKind,
    },
    /// The identity names another cluster.
    #[error("expected an identity of cluster {expected}, found cluster {found}")]
    WrongCluster {
        /// The verifier's cluster.
        expected: String,
        /// The cluster in the certificate.
        found: String,
    },
    /// The host lacks the role the caller requires.
    #[error("host {host_id} lacks role {required}, has [{found}]")]
    MissingRole {
        /// The host.
        host_id: String,
        /// The role required.
        required: SystemRole,
        /// The roles it has, comma-separated.
        found: String,
    },
    /// A valid host certificate of another host than the one the client asked for.
    #[error("the host certificate of node {node_name} ({host_id}) does not name {asked}, the host asked for")]
    WrongHost {
        /// The host the client asked for.
        asked: String,
        /// The certificate's host ID.
        host_id: String,
        /// The certificate's node name.
        node_name: String,
    },
    /// The certificate is signed by a trusted CA but carries no svc identity.
    #[error("certificate carries no svc identity extension")]
    MissingIdentity,
    /// The signature does not verify.
    #[error("bad certificate signature")]
    BadSignature,
    /// An OpenSSH certificate with critical options, which svc never signs.
    #[error("unexpected critical option {0:?} in ssh certificate")]
    CriticalOption(String),
    /// Refused by webpki for another reason (key usage, constraints, algorithm).
    #[error("certificate refused: {0}")]
    Rejected(#[source] webpki::Error),
}

/// Verifies certificates presented to a server of one cluster, against that cluster's trusted
/// CAs (several per kind during a rotation).
///
/// The CA set never changes once built (a rotation builds a new verifier); clones share the
/// memory of accepted X.509 certificates (see the module documentation).
#[derive(Clone, Debug)]
pub struct Verifier {
    cluster: String,
    cas: Vec<TrustedCa>,
    verified: Arc<VerifiedChains>,
}

/// How many accepted X.509 certificates a verifier remembers, per identity kind.
const VERIFIED_CAPACITY: usize = 4096;

/// The X.509 certificates a [`Verifier`] accepted, per identity kind: keyed by the exact DER of
/// a chain that is one leaf certificate (what svc's CAs sign; longer chains are verified in
/// full every time), with the identity read from it and its validity in whole seconds since
/// the epoch.
///
/// An entry answers only inside its certificate's validity (`not_before <= now < not_after`,
/// stricter than webpki at the last second); outside it, or for any other DER (another key,
/// another signature, one byte changed), the full verification runs and gives its own answer.
/// Only successes are remembered. Bounded: when a kind's map is full, the entries no longer
/// valid are dropped, and if none was, all of them.
struct VerifiedChains {
    capacity: usize,
    maps: Mutex<[HashMap<Box<[u8]>, Verified>; 2]>,
}

/// One accepted certificate.
struct Verified {
    identity: Identity,
    not_before: u64,
    not_after: u64,
}

impl Verified {
    fn valid_at(&self, now: u64) -> bool {
        self.not_before <= now && now < self.not_after
    }
}

impl std::fmt::Debug for VerifiedChains {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let [host, user] = &*self.maps.lock().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("VerifiedChains")
            .field("host", &host.len())
            .field("user", &user.len())
            .finish()
    }
}

fn kind_index(kind: IdentityKind) -> usize {
    match kind {
        IdentityKind::Host => 0,
        IdentityKind::User => 1,
    }
}

fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_secs()
}

impl VerifiedChains {
    fn new(capacity: usize) -> Self {
        Self {
            capacity,
            maps: Mutex::new([HashMap::new(), HashMap::new()]),
        }
    }

    /// The identity of `leaf`, accepted earlier as `kind` and valid at `now` (seconds).
    fn get(&self, kind: IdentityKind, leaf: &[u8], now: u64) -> Option<Identity> {
        let maps = self.maps.lock().unwrap_or_else(PoisonError::into_inner);
        maps[kind_index(kind)]
            .get(leaf)
            .filter(|v| v.valid_at(now))
            .map(|v| v.identity.clone())
    }

    /// Remembers that `leaf` was accepted as `kind`, with `identity`, valid over `validity`.
    fn put(&self, kind: IdentityKind, leaf: &[u8], identity: &Identity, validity: Validity, now: u64) {
        let entry = Verified {
            identity: identity.clone(),
            not_before: unix_secs(validity.not_before),
            not_after: unix_secs(validity.not_after),
        };
        if !entry.valid_at(now) {
            return;
        }
        let mut maps = self.maps.lock().unwrap_or_else(PoisonError::into_inner);
        let map = &mut maps[kind_index(kind)];
        if map.len() >= self.capacity && !map.contains_key(leaf) {
            map.retain(|_, v| v.valid_at(now));
            if map.len() >= self.capacity {
                map.clear();
            }
        }
        map.insert(leaf.into(), entry);
    }

    fn len(&self) -> usize {
        let maps = self.maps.lock().unwrap_or_else(PoisonError::into_inner);
        maps.iter().map(HashMap::len).sum()
    }
}

fn unix_time(t: SystemTime) -> UnixTime {
    UnixTime::since_unix_epoch(t.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO))
}

impl Verifier {
    /// A verifier for `cluster` trusting `cas`. Every CA must belong to `cluster`: another
    /// cluster's CA is trusted only through an explicit trust relationship, not here.
    pub fn new(cluster: &str, cas: impl IntoIterator<Item = TrustedCa>) -> Result<Self, VerifyError> {
        let cas: Vec<TrustedCa> = cas.into_iter().collect();
        if let Some(other) = cas.iter().find(|ca| ca.cluster() != cluster) {
            return Err(VerifyError::WrongCluster {
                expected: cluster.to_owned(),
                found: other.cluster().to_owned(),
            });
        }
        // Refuse unusable CA certificates now rather than at the first handshake.
        for ca in &cas {
            webpki::anchor_from_trusted_cert(ca.tls_cert_der())
                .map_err(|e| VerifyError::Malformed(format!("trusted CA certificate: {e}")))?;
        }
        Ok(Self {
            cluster: cluster.to_owned(),
            cas,
            verified: Arc::new(VerifiedChains::new(VERIFIED_CAPACITY)),
        })
    }

    /// How many accepted X.509 certificates this verifier (and its clones) remembers.
    pub fn remembered(&self) -> usize {
        self.verified.len()
    }

    /// The cluster this verifier serves.
    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// A rustls root store with the X.509 CA certificates of `kind` (both kinds if `None`):
    /// hosts verifying the Auth or Proxy server use the host CA.
    pub fn root_store(&self, kind: Option<IdentityKind>) -> RootCertStore {
        let mut roots = RootCertStore::empty();
        for ca in self.cas.iter().filter(|ca| kind.is_none_or(|k| ca.kind() == k)) {
            // Checked in `new`, so adding cannot fail; a failure would only drop that CA.
            let _ = roots.add(ca.tls_cert_der().clone());
        }
        roots
    }

    /// A rustls client-certificate verifier for a server (Auth API on 3025, proxy peering)
    /// that accepts clients signed by this cluster's host or user CA. After the handshake,
    /// read the identity with [`verify_x509`](Self::verify_x509) on the peer certificates.
    pub fn client_verifier(&self) -> Result<Arc<dyn ClientCertVerifier>, VerifyError> {
        WebPkiClientVerifier::builder_with_provider(
            Arc::new(self.root_store(None)),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .map_err(|e| VerifyError::Malformed(format!("client verifier: {e}")))
    }

    fn check_chain(
        &self,
        kind: IdentityKind,
        leaf: &EndEntityCert<'_>,
        intermediates: &[CertificateDer<'_>],
        now: SystemTime,
    ) -> Result<(), webpki::Error> {
        let anchors = self
            .cas
            .iter()
            .filter(|ca| ca.kind() == kind)
            .filter_map(|ca| webpki::anchor_from_trusted_cert(ca.tls_cert_der()).ok())
            .collect::<Vec<_>>();
        leaf.verify_for_usage(
            webpki::ALL_VERIFICATION_ALGS,
            &anchors,
            intermediates,
            unix_time(now),
            KeyUsage::client_auth(),
            None,
            None,
        )
        .map(|_| ())
    }

    /// Verifies a presented X.509 chain (leaf first) as an identity of kind `expected`.
    ///
    /// Checks, in order: the chain up to a trusted CA of that kind (signature, validity at
    /// `now`, client-auth usage); then that the certificate states an identity of that kind
    /// and of this cluster. A lone leaf certificate this verifier accepted before as that kind
    /// is answered from memory while `now` is inside its validity (the same identity, no
    /// signature verification); anything else is verified in full.
    pub fn verify_x509(
        &self,
        chain: &[CertificateDer<'_>],
        now: SystemTime,
        expected: IdentityKind,
    ) -> Result<Identity, VerifyError> {
        let (leaf_der, intermediates) = chain.split_first().ok_or(VerifyError::NoCertificate)?;
        let now_secs = unix_secs(now);
        if intermediates.is_empty()
            && let Some(identity) = self.verified.get(expected, leaf_der, now_secs)
        {
            return Ok(identity);
        }
        let leaf = EndEntityCert::try_from(leaf_der)
            .map_err(|e| VerifyError::Malformed(format!("certificate: {e}")))?;
        let parsed = x509::parse(leaf_der)?;
        let validity = x509::validity(&parsed)?;
        let other = other_kind(expected);
        match self.check_chain(expected, &leaf, intermediates, now) {
            Ok(()) => {}
            Err(webpki::Error::CertExpired { .. }) => {
                return Err(VerifyError::Expired {
                    not_after: validity.not_after,
                    now,
                });
            }
            Err(webpki::Error::CertNotValidYet { .. }) => {
                return Err(VerifyError::NotYetValid {
                    not_before: validity.not_before,
                    now,
                });
            }
            Err(webpki::Error::UnknownIssuer) => {
                // Name the real problem when the other CA of this cluster signed it.
                return Err(if self.check_chain(other, &leaf, intermediates, now).is_ok() {
                    VerifyError::WrongKind {
                        expected,
                        found: other,
                    }
                } else {
                    VerifyError::UntrustedIssuer {
                        expected,
                        cluster: self.cluster.clone(),
                    }
                });
            }
            Err(webpki::Error::InvalidSignatureForPublicKey) => {
                return Err(VerifyError::BadSignature);
            }
            Err(e) => return Err(VerifyError::Rejected(e)),
        }
        let claims = x509::read_claims(&parsed)?;
        let identity = self.identity(claims, expected, validity)?;
        if intermediates.is_empty() {
            self.verified
                .put(expected, leaf_der, &identity, validity, now_secs);
        }
        Ok(identity)
    }

    /// Verifies an X.509 chain from a client that may be either kind (the Auth API serves
    /// agents and users on one port): as a host if the host CA signed it, else as a user.
    pub fn verify_any_x509(
        &self,
        chain: &[CertificateDer<'_>],
        now: SystemTime,
    ) -> Result<Identity, VerifyError> {
        // Remembered as either kind: the answer the two verifications below would give (one
        // DER carries one signature, which one CA made).
        if let [leaf] = chain {
            let now_secs = unix_secs(now);
            for kind in [IdentityKind::Host, IdentityKind::User] {
                if let Some(identity) = self.verified.get(kind, leaf, now_secs) {
                    return Ok(identity);
                }
            }
        }
        match self.verify_x509(chain, now, IdentityKind::Host) {
            Err(VerifyError::WrongKind {
                found: IdentityKind::User,
                ..
            }) => self.verify_x509(chain, now, IdentityKind::User),
            other => other,
        }
    }

    /// Verifies an X.509 host certificate; with `required_role`, the host must have it.
    pub fn verify_host_x509(
        &self,
        chain: &[CertificateDer<'_>],
        now: SystemTime,
        required_role: Option<SystemRole>,
    ) -> Result<HostIdentity, VerifyError> {
        match self.verify_x509(chain, now, IdentityKind::Host)? {
            Identity::Host(host) => require_role(host, required_role),
            other => Err(VerifyError::WrongKind {
                expected: IdentityKind::Host,
                found: other.kind(),
            }),
        }
    }

    /// Verifies an X.509 user certificate.
    pub fn verify_user_x509(
        &self,
        chain: &[CertificateDer<'_>],
        now: SystemTime,
    ) -> Result<UserIdentity, VerifyError> {
        match self.verify_x509(chain, now, IdentityKind::User)? {
            Identity::User(user) => Ok(user),
            other => Err(VerifyError::WrongKind {
                expected: IdentityKind::User,
                found: other.kind(),
            }),
        }
    }

    /// Verifies an OpenSSH certificate as an identity of kind `expected`: certificate type,
    /// signing CA, validity at `now`, signature, no critical options, then the claims.
    pub(crate) fn verify_ssh(
        &self,
        cert: &Certificate,
        now: SystemTime,
        expected: IdentityKind,
    ) -> Result<Identity, VerifyError> {
        let found = ssh::kind_of(cert);
        if found != expected {
            return Err(VerifyError::WrongKind { expected, found });
        }
        let signer = cert.signature_key().fingerprint(HashAlg::Sha256);
        let fingerprints = |kind: IdentityKind| {
            self.cas
                .iter()
                .filter(move |ca| ca.kind() == kind)
                .map(|ca| ca.ssh_public_key().fingerprint(HashAlg::Sha256))
        };
        if !fingerprints(expected).any(|f| f == signer) {
            return Err(if fingerprints(other_kind(expected)).any(|f| f == signer) {
                VerifyError::WrongKind {
                    expected,
                    found: other_kind(expected),
                }
            } else {
                VerifyError::UntrustedIssuer {
                    expected,
                    cluster: self.cluster.clone(),
                }
            });
        }
        let validity = Validity {
            not_before: UNIX_EPOCH + Duration::from_secs(cert.valid_after()),
            not_after: UNIX_EPOCH + Duration::from_secs(cert.valid_before()),
        };
        if now < validity.not_before {
            return Err(VerifyError::NotYetValid {
                not_before: validity.not_before,
                now,
            });
        }
        if now >= validity.not_after {
            return Err(VerifyError::Expired {
                not_after: validity.not_after,
                now,
            });
        }
        let trusted: Vec<_> = fingerprints(expected).collect();
        let now_secs = now.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_secs();
        cert.validate_at(now_secs, &trusted)
            .map_err(|_| VerifyError::BadSignature)?;
        if let Some((name, _)) = cert.critical_options().iter().next() {
            return Err(VerifyError::CriticalOption(name.clone()));
        }
        let claims = ssh::read_claims(cert)?;
        self.identity(claims, expected, validity)
    }

    /// Verifies an OpenSSH host certificate (the reverse tunnel's agent identity; the caller
    /// also checks that the SSH user equals [`HostIdentity::host_id`]).
    pub fn verify_host_ssh(
        &self,
        cert: &Certificate,
        now: SystemTime,
        required_role: Option<SystemRole>,
    ) -> Result<HostIdentity, VerifyError> {
        match self.verify_ssh(cert, now, IdentityKind::Host)? {
            Identity::Host(host) => require_role(host, required_role),
            other => Err(VerifyError::WrongKind {
                expected: IdentityKind::Host,
                found: other.kind(),
            }),
        }
    }

    /// Verifies the host certificate a node presents to a client that asked for `host` (a node
    /// name, host ID, UUID or extra name): a host certificate of this cluster with role `node`
    /// that names `host` ([`HostIdentity::names`]). The one check every SSH client of svc runs
    /// on a node (`tsh ssh`, `tsh proxy ssh` users' OpenSSH relies on its own principal check).
    pub fn verify_node_host_ssh(
        &self,
        cert: &Certificate,
        now: SystemTime,
        host: &str,
    ) -> Result<HostIdentity, VerifyError> {
        let identity = self.verify_host_ssh(cert, now, Some(SystemRole::Node))?;
        if identity.names(host) {
            Ok(identity)
        } else {
            Err(VerifyError::WrongHost {
                asked: host.to_owned(),
                host_id: identity.host_id,
                node_name: identity.node_name,
            })
        }
    }

    /// Verifies an OpenSSH user certificate.
    pub fn verify_user_ssh(&self, cert: &Certificate, now: SystemTime) -> Result<UserIdentity, VerifyError> {
        match self.verify_ssh(cert, now, IdentityKind::User)? {
            Identity::User(user) => Ok(user),
            other => Err(VerifyError::WrongKind {
                expected: IdentityKind::User,
                found: other.kind(),
            }),
        }
    }

    fn identity(
        &self,
        claims: super::Claims,
        expected: IdentityKind,
        validity: Validity,
    ) -> Result<Identity, VerifyError> {
        let found = claims.kind()?;
        if found != expected {
            return Err(VerifyError::WrongKind { expected, found });
        }
        if claims.cluster != self.cluster {
            return Err(VerifyError::WrongCluster {
                expected: self.cluster.clone(),
                found: claims.cluster,
            });
        }
        Ok(match expected {
            IdentityKind::Host => Identity::Host(claims.into_host(validity)?),
            IdentityKind::User => Identity::User(claims.into_user(validity)),
        })
    }
}

/// Before an agent joins: the identity the Auth Service's certificate `leaf` states, which must
/// be a host certificate of the cluster the CA certificate `ca` belongs to (its common name),
/// with the `auth` role. Another host of the cluster (a node, a proxy) holds a certificate that
/// chains to the same pinned CA; this is what refuses it the join token.
///
/// The caller must already have checked that `leaf` chains to `ca` and that `ca` is pinned:
/// this reads and checks the claims only.
pub fn auth_server_identity(
    leaf: &CertificateDer<'_>,
    ca: &CertificateDer<'_>,
) -> Result<HostIdentity, VerifyError> {
    let ca = x509::parse(ca)?;
    let cluster = ca
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .ok_or_else(|| VerifyError::Malformed("the CA certificate has no common name".into()))?
        .to_owned();
    let parsed = x509::parse(leaf)?;
    let validity = x509::validity(&parsed)?;
    let claims = x509::read_claims(&parsed)?;
    let found = claims.kind()?;
    if found != IdentityKind::Host {
        return Err(VerifyError::WrongKind {
            expected: IdentityKind::Host,
            found,
        });
    }
    if claims.cluster != cluster {
        return Err(VerifyError::WrongCluster {
            expected: cluster,
            found: claims.cluster,
        });
    }
    require_role(claims.into_host(validity)?, Some(SystemRole::Auth))
}

fn other_kind(kind: IdentityKind) -> IdentityKind {
    match kind {
        IdentityKind::Host => IdentityKind::User,
        IdentityKind::User => IdentityKind::Host,
    }
}

fn require_role(host: HostIdentity, required: Option<SystemRole>) -> Result<HostIdentity, VerifyError> {
    match required {
        Some(role) if !host.has_role(role) => Err(VerifyError::MissingRole {
            found: host
                .roles
                .iter()
                .map(|r| r.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            host_id: host.host_id,
            required: role,
        }),
        _ => Ok(host),
    }
}

#[cfg(test)]
mod tests {
    //! The memory of accepted certificates must answer exactly as the full verification would:
    //! every certificate the full verification refuses is refused with it, remembered or not.

    use rcgen::{KeyPair, PKCS_ECDSA_P256_SHA256, PublicKeyData};

    use super::*;
    use crate::identity::{CertAuthority, HostCertRequest, UserCertRequest};

    const CLUSTER: &str = "example.com";
    const HOUR: Duration = Duration::from_secs(3600);

    fn t0() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_800_000_000)
    }

    fn ca(kind: IdentityKind) -> CertAuthority {
        CertAuthority::generate(kind, CLUSTER, t0(), 365 * 24 * HOUR).expect("a CA")
    }

    fn key() -> KeyPair {
        KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("a P-256 key")
    }

    fn alice() -> UserCertRequest {
        UserCertRequest {
            username: "alice".into(),
            roles: vec!["access".into()],
            logins: vec!["alice".into()],
            ttl: 12 * HOUR,
            db_route: None,
            ssh_permits: Default::default(),
        }
    }

    /// Alice's certificate for a fresh key, signed by `ca` at `t0`.
    fn alice_cert(ca: &CertAuthority) -> CertificateDer<'static> {
        ca.sign_user_x509(&alice(), &key().subject_public_key_info(), t0())
            .expect("a user certificate")
    }

    #[test]
    fn a_remembered_certificate_gives_the_full_answer_and_clones_share_it() {
        let (host_ca, user_ca) = (ca(IdentityKind::Host), ca(IdentityKind::User));
        let v = Verifier::new(CLUSTER, [host_ca.trusted(), user_ca.trusted()]).unwrap();
        let cert = alice_cert(&user_ca);
        let chain = std::slice::from_ref(&cert);
        assert_eq!(v.remembered(), 0);
        let full = v.verify_user_x509(chain, t0() + HOUR).unwrap();
        assert_eq!(v.remembered(), 1, "accepted once, remembered");
        let again = v.verify_user_x509(chain, t0() + 2 * HOUR).unwrap();
        assert_eq!(full, again);
        let clone = v.clone();
        assert_eq!(clone.remembered(), 1, "clones share the memory");
        assert_eq!(
            clone.verify_any_x509(chain, t0() + HOUR).unwrap(),
            Identity::User(full.clone())
        );
        // A verifier that never accepted it (the same CAs) reads the same identity.
        let fresh = Verifier::new(CLUSTER, [host_ca.trusted(), user_ca.trusted()]).unwrap();
        assert_eq!(fresh.verify_user_x509(chain, t0() + 2 * HOUR).unwrap(), full);
        assert_eq!(v.remembered(), 1, "the same DER is one entry");
    }

    #[test]
    fn an_expired_or_not_yet_valid_certificate_is_refused_though_remembered() {
        let user_ca = ca(IdentityKind::User);
        let v = Verifier::new(CLUSTER, [user_ca.trusted()]).unwrap();
        let cert = alice_cert(&user_ca);
        let chain = std::slice::from_ref(&cert);
        v.verify_user_x509(chain, t0() + HOUR).unwrap();
        assert_eq!(v.remembered(), 1);
        let after = t0() + 12 * HOUR + Duration::from_secs(1);
        let err = v.verify_user_x509(chain, after).unwrap_err();
        assert!(matches!(err, VerifyError::Expired { .. }), "{err}");
        let err = v.verify_any_x509(chain, after).unwrap_err();
        assert!(matches!(err, VerifyError::Expired { .. }), "{err}");
        // A clock set back before the certificate's start.
        let before = t0() - 2 * crate::identity::CLOCK_SKEW;
        let err = v.verify_user_x509(chain, before).unwrap_err();
        assert!(matches!(err, VerifyError::NotYetValid { .. }), "{err}");
        // Still valid in between.
        v.verify_user_x509(chain, t0() + 11 * HOUR).unwrap();
    }

    // A CA of the same cluster and kind has the same subject as the trusted one: webpki then
    // finds the signature wrong (`BadSignature`) rather than the issuer unknown.
    #[test]
    fn a_certificate_of_a_ca_removed_by_rotation_is_refused_though_remembered() {
        let (host_ca, old, new) = (
            ca(IdentityKind::Host),
            ca(IdentityKind::User),
            ca(IdentityKind::User),
        );
        let during = Verifier::new(CLUSTER, [host_ca.trusted(), old.trusted(), new.trusted()]).unwrap();
        let cert = alice_cert(&old);
        let chain = std::slice::from_ref(&cert);
        during.verify_user_x509(chain, t0() + HOUR).unwrap();
        assert_eq!(during.remembered(), 1);
        // The rotation ends: the old CA is no longer trusted.
        let after = Verifier::new(CLUSTER, [host_ca.trusted(), new.trusted()]).unwrap();
        assert_eq!(after.remembered(), 0, "a new CA set starts with an empty memory");
        let err = after.verify_user_x509(chain, t0() + HOUR).unwrap_err();
        assert!(
            matches!(
                err,
                VerifyError::UntrustedIssuer { .. } | VerifyError::BadSignature
            ),
            "{err}"
        );
        let err = after.verify_any_x509(chain, t0() + HOUR).unwrap_err();
        assert!(
            matches!(
                err,
                VerifyError::UntrustedIssuer { .. } | VerifyError::BadSignature
            ),
            "{err}"
        );
        // The new CA's certificates are accepted.
        after.verify_user_x509(&[alice_cert(&new)], t0() + HOUR).unwrap();
    }

    #[test]
    fn the_same_subject_with_another_key_or_signature_is_refused_though_remembered() {
        let user_ca = ca(IdentityKind::User);
        let v = Verifier::new(CLUSTER, [user_ca.trusted()]).unwrap();
        let cert = alice_cert(&user_ca);
        v.verify_user_x509(std::slice::from_ref(&cert), t0() + HOUR)
            .unwrap();
        // An attacker's CA with the very same subject (cluster name and kind), its own key,
        // signing the same request for the attacker's key.
        let forger = ca(IdentityKind::User);
        let forged = alice_cert(&forger);
        let err = v
            .verify_user_x509(std::slice::from_ref(&forged), t0() + HOUR)
            .unwrap_err();
        assert!(
            matches!(
                err,
                VerifyError::UntrustedIssuer { .. } | VerifyError::BadSignature
            ),
            "{err}"
        );
        let err = v.verify_any_x509(&[forged], t0() + HOUR).unwrap_err();
        assert!(
            matches!(
                err,
                VerifyError::UntrustedIssuer { .. } | VerifyError::BadSignature
            ),
            "{err}"
        );
        // The remembered certificate with its signature changed (the last byte of the DER is
        // the signature's).
        let mut der = cert.to_vec();
        let last = der.len() - 1;
        der[last] ^= 0x01;
        let err = v
            .verify_user_x509(&[CertificateDer::from(der)], t0() + HOUR)
            .unwrap_err();
        assert!(
            matches!(err, VerifyError::BadSignature | VerifyError::Malformed(_)),
            "{err}"
        );
        // The remembered leaf followed by an extra certificate is a different chain: verified
        // in full (the CA certificate as an intermediate is still the trusted anchor's).
        let longer = [cert.clone(), user_ca.tls_cert_der().clone()];
        let _ = v.verify_user_x509(&longer, t0() + HOUR);
        assert_eq!(v.remembered(), 1, "only lone leaf certificates are remembered");
    }

    #[test]
    fn a_certificate_remembered_as_one_kind_does_not_answer_for_the_other() {
        let (host_ca, user_ca) = (ca(IdentityKind::Host), ca(IdentityKind::User));
        let v = Verifier::new(CLUSTER, [host_ca.trusted(), user_ca.trusted()]).unwrap();
        let req = HostCertRequest {
            host_uuid: uuid::Uuid::from_u128(0x1234),
            node_name: "node-1".into(),
            roles: vec![crate::identity::SystemRole::Node],
            additional_names: vec![],
            ttl: 24 * HOUR,
        };
        let host = host_ca
            .sign_host_x509(&req, &key().subject_public_key_info(), t0())
            .unwrap();
        let chain = std::slice::from_ref(&host);
        v.verify_host_x509(chain, t0() + HOUR, None).unwrap();
        let err = v.verify_user_x509(chain, t0() + HOUR).unwrap_err();
        assert!(
            matches!(
                err,
                VerifyError::WrongKind {
                    expected: IdentityKind::User,
                    found: IdentityKind::Host
                }
            ),
            "{err}"
        );
        // The role requirement is checked on the remembered identity too.
        let err = v
            .verify_host_x509(chain, t0() + HOUR, Some(crate::identity::SystemRole::Proxy))
            .unwrap_err();
        assert!(matches!(err, VerifyError::MissingRole { .. }), "{err}");
    }

    #[test]
    fn the_memory_is_bounded_and_drops_expired_entries_first() {
        let user_ca = ca(IdentityKind::User);
        let v = Verifier::new(CLUSTER, [user_ca.trusted()]).unwrap();
        let cert = alice_cert(&user_ca);
        let identity = v.verify_x509(&[cert], t0(), IdentityKind::User).unwrap();
        let now = unix_secs(t0());
        let window = |from: u64, to: u64| Validity {
            not_before: UNIX_EPOCH + Duration::from_secs(from),
            not_after: UNIX_EPOCH + Duration::from_secs(to),
        };
        let memory = VerifiedChains::new(2);
        memory.put(
            IdentityKind::User,
            b"a",
            &identity,
            window(now - 10, now + 5),
            now,
        );
        memory.put(
            IdentityKind::User,
            b"b",
            &identity,
            window(now - 10, now + 100),
            now,
        );
        assert_eq!(memory.len(), 2);
        // Full, `a` expired by now: it makes room.
        memory.put(
            IdentityKind::User,
            b"c",
            &identity,
            window(now - 10, now + 100),
            now + 10,
        );
        assert_eq!(memory.len(), 2);
        assert!(memory.get(IdentityKind::User, b"a", now).is_none());
        assert!(memory.get(IdentityKind::User, b"b", now + 10).is_some());
        // Full and nothing expired: it starts over.
        memory.put(
            IdentityKind::User,
            b"d",
            &identity,
            window(now - 10, now + 100),
            now + 10,
        );
        assert_eq!(memory.len(), 1);
        assert!(memory.get(IdentityKind::User, b"d", now + 10).is_some());
        // The other kind has its own room; an entry not valid now is not kept.
        memory.put(
            IdentityKind::Host,
            b"d",
            &identity,
            window(now - 10, now + 100),
            now + 10,
        );
        memory.put(
            IdentityKind::Host,
            b"e",
            &identity,
            window(now - 10, now + 5),
            now + 10,
        );
        assert_eq!(memory.len(), 2);
        assert!(
            memory.get(IdentityKind::Host, b"d", now + 200).is_none(),
            "not after expiry"
        );
    }
}
