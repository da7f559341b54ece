//! [`Verifier`]: from a presented certificate to a typed identity, or a typed refusal.
//!
//! X.509 chains are checked by rustls-webpki — the same code rustls runs in the handshake, so
//! this helper and a `WebPkiClientVerifier` ([`Verifier::client_verifier`]) cannot disagree on
//! signatures, validity or key usage. webpki does not expose extensions, so the identity is
//! then read with x509-parser (already in the build for rcgen's CA loading). OpenSSH
//! certificates are checked with ssh-key against the CA fingerprints.

use std::sync::Arc;
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
#[derive(Clone, Debug)]
pub struct Verifier {
    cluster: String,
    cas: Vec<TrustedCa>,
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
        })
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
    /// and of this cluster.
    pub fn verify_x509(
        &self,
        chain: &[CertificateDer<'_>],
        now: SystemTime,
        expected: IdentityKind,
    ) -> Result<Identity, VerifyError> {
        let (leaf_der, intermediates) = chain.split_first().ok_or(VerifyError::NoCertificate)?;
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
        self.identity(claims, expected, validity)
    }

    /// Verifies an X.509 chain from a client that may be either kind (the Auth API serves
    /// agents and users on one port): as a host if the host CA signed it, else as a user.
    pub fn verify_any_x509(
        &self,
        chain: &[CertificateDer<'_>],
        now: SystemTime,
    ) -> Result<Identity, VerifyError> {
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
