//! Identity files: a certificate pair (X.509 + OpenSSH) with its private keys and the CAs to
//! trust, as JSON with mode 0600. The same format serves the admin identity the Auth Service
//! writes for `tctl`, `tsh` profiles and joined agents.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{KeyPair, PublicKeyData};
use rustls::pki_types::{
    CertificateDer, PrivateKeyDer,
    pem::{Error as PemError, PemObject},
};
use serde::{Deserialize, Serialize};
use ssh_key::{LineEnding, PrivateKey, private::Ed25519Keypair};
use svc_core::Secret;
use svc_core::auth::IssuedCerts;
use svc_core::identity::{IdentityKind, TrustedCa, Verifier};

use super::proto;

/// Why an identity file could not be read, written or used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityFileError {
    /// Reading or writing the file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not an identity file.
    #[error("{path}: not an identity file: {reason}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong (never the keys).
        reason: String,
    },
    /// A certificate, key or CA inside is unusable.
    #[error("identity: {0}")]
    Invalid(String),
    /// The file could not be written privately (mode 0600).
    #[error(transparent)]
    Private(#[from] svc_core::fs::PrivateFsError),
}

/// A CA to trust, as written in identity files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrustedCaPem {
    /// `host` or `user`.
    pub kind: String,
    /// The X.509 CA certificate (PEM).
    pub tls_cert_pem: String,
    /// The OpenSSH CA public key (`authorized_keys` line).
    pub ssh_public_key: String,
}

/// Fresh private keys for a certificate request: an ECDSA P-256 TLS key and an Ed25519 SSH key.
pub struct KeyMaterial {
    tls: KeyPair,
    ssh: PrivateKey,
}

impl std::fmt::Debug for KeyMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyMaterial(***)")
    }
}

impl KeyMaterial {
    /// Generates both keys.
    pub fn generate() -> Result<Self, IdentityFileError> {
        use ring::rand::SecureRandom;
        let tls = KeyPair::generate().map_err(|e| IdentityFileError::Invalid(format!("TLS key: {e}")))?;
        let mut seed = [0u8; 32];
        ring::rand::SystemRandom::new()
            .fill(&mut seed)
            .map_err(|_| IdentityFileError::Invalid("the system random source failed".into()))?;
        let ssh = PrivateKey::from(Ed25519Keypair::from_seed(&seed));
        Ok(Self { tls, ssh })
    }

    /// The TLS public key as DER SubjectPublicKeyInfo (what the CA signs).
    pub fn tls_public_key(&self) -> Vec<u8> {
        self.tls.subject_public_key_info()
    }

    /// The SSH public key.
    pub fn ssh_public_key(&self) -> &ssh_key::PublicKey {
        self.ssh.public_key()
    }

    /// The SSH public key as an `authorized_keys` line.
    pub fn ssh_public_key_line(&self) -> Result<String, IdentityFileError> {
        self.ssh
            .public_key()
            .to_openssh()
            .map_err(|e| IdentityFileError::Invalid(format!("SSH public key: {e}")))
    }

    /// Combines the keys with certificates issued in-process.
    pub fn into_identity(
        self,
        certs: &IssuedCerts,
        cluster: &str,
    ) -> Result<ClientIdentity, IdentityFileError> {
        let trusted = certs
            .trusted
            .iter()
            .map(trusted_pem)
            .collect::<Result<Vec<_>, _>>()?;
        let ssh_cert = certs
            .ssh_cert
            .to_openssh()
            .map_err(|e| IdentityFileError::Invalid(format!("SSH certificate: {e}")))?;
        self.finish(
            cluster,
            &certs.name,
            pem::encode(&pem::Pem::new("CERTIFICATE", certs.tls_cert.to_vec())),
            ssh_cert,
            trusted,
            unix(certs.not_after),
        )
    }

    /// Combines the keys with certificates received over the API.
    pub fn into_identity_from_proto(self, certs: proto::Certs) -> Result<ClientIdentity, IdentityFileError> {
        let kinds = [IdentityKind::Host, IdentityKind::User];
        if certs.tls_ca_pems.len() != 2 || certs.ssh_ca_keys.len() != 2 {
            return Err(IdentityFileError::Invalid(format!(
                "expected the host and user CA, found {} X.509 and {} SSH CAs",
                certs.tls_ca_pems.len(),
                certs.ssh_ca_keys.len()
            )));
        }
        let trusted = kinds
            .iter()
            .zip(certs.tls_ca_pems.iter().zip(&certs.ssh_ca_keys))
            .map(|(kind, (tls, ssh))| TrustedCaPem {
                kind: kind.as_str().to_owned(),
                tls_cert_pem: tls.clone(),
                ssh_public_key: ssh.clone(),
            })
            .collect();
        self.finish(
            &certs.cluster_name,
            &certs.name,
            certs.tls_cert_pem,
            certs.ssh_cert,
            trusted,
            certs.not_after_unix,
        )
    }

    fn finish(
        self,
        cluster: &str,
        name: &str,
        tls_cert_pem: String,
        ssh_cert: String,
        trusted: Vec<TrustedCaPem>,
        not_after_unix: i64,
    ) -> Result<ClientIdentity, IdentityFileError> {
        let ssh_key = self
            .ssh
            .to_openssh(LineEnding::LF)
            .map_err(|e| IdentityFileError::Invalid(format!("SSH private key: {e}")))?;
        let identity = ClientIdentity {
            cluster: cluster.to_owned(),
            name: name.to_owned(),
            auth_addr: String::new(),
            tls_cert_pem,
            tls_key_pem: Secret::new(self.tls.serialize_pem()),
            ssh_cert,
            ssh_key: Secret::new(ssh_key.to_string()),
            trusted,
            not_after_unix,
        };
        identity.verifier()?;
        Ok(identity)
    }
}

pub(super) fn trusted_pem(ca: &TrustedCa) -> Result<TrustedCaPem, IdentityFileError> {
    Ok(TrustedCaPem {
        kind: ca.kind().as_str().to_owned(),
        tls_cert_pem: ca.tls_cert_pem(),
        ssh_public_key: ca
            .ssh_authorized_key()
            .map_err(|e| IdentityFileError::Invalid(format!("CA SSH key: {e}")))?,
    })
}

fn unix(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// A client's identity: certificates, private keys, the CAs to trust and where the Auth API is.
/// `Debug` and errors never show the keys.
#[derive(Clone, Serialize, Deserialize)]
pub struct ClientIdentity {
    /// The cluster name.
    pub cluster: String,
    /// The user name or host ID the certificates are for.
    pub name: String,
    /// The Auth API address (`host:port`).
    pub auth_addr: String,
    /// The X.509 certificate (PEM).
    pub tls_cert_pem: String,
    /// The X.509 private key (PEM, PKCS#8).
    pub tls_key_pem: Secret,
    /// The OpenSSH certificate line.
    pub ssh_cert: String,
    /// The OpenSSH private key.
    pub ssh_key: Secret,
    /// The cluster's CAs.
    pub trusted: Vec<TrustedCaPem>,
    /// When the certificates end (Unix seconds).
    pub not_after_unix: i64,
}

impl std::fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientIdentity")
            .field("cluster", &self.cluster)
            .field("name", &self.name)
            .field("auth_addr", &self.auth_addr)
            .field("not_after_unix", &self.not_after_unix)
            .finish_non_exhaustive()
    }
}

impl ClientIdentity {
    /// Reads an identity file.
    pub fn load(path: &Path) -> Result<Self, IdentityFileError> {
        let bytes = std::fs::read(path).map_err(|source| IdentityFileError::Io {
            path: path.to_owned(),
            source,
        })?;
        serde_json::from_slice(&bytes).map_err(|e| IdentityFileError::Malformed {
            path: path.to_owned(),
            reason: e.to_string(),
        })
    }

    /// Writes the identity file with mode 0600 (atomically: a temporary file renamed over it).
    pub fn save(&self, path: &Path) -> Result<(), IdentityFileError> {
        let bytes = serde_json::to_vec_pretty(self).map_err(|e| IdentityFileError::Malformed {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        write_private(path, &bytes)
    }

    /// Whether the certificates have ended at `now`.
    pub fn is_expired(&self, now: SystemTime) -> bool {
        unix(now) >= self.not_after_unix
    }

    /// When the certificates end.
    pub fn not_after(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(u64::try_from(self.not_after_unix).unwrap_or(0))
    }

    /// The CAs as [`TrustedCa`]s.
    pub fn trusted_cas(&self) -> Result<Vec<TrustedCa>, IdentityFileError> {
        self.trusted
            .iter()
            .map(|ca| {
                let kind: IdentityKind = ca
                    .kind
                    .parse()
                    .map_err(|e| IdentityFileError::Invalid(format!("trusted CA: {e}")))?;
                TrustedCa::from_pem(kind, &self.cluster, &ca.tls_cert_pem, &ca.ssh_public_key)
                    .map_err(|e| IdentityFileError::Invalid(format!("trusted CA: {e}")))
            })
            .collect()
    }

    /// A verifier for the cluster's certificates (used to check the Auth server).
    pub fn verifier(&self) -> Result<Verifier, IdentityFileError> {
        Verifier::new(&self.cluster, self.trusted_cas()?)
            .map_err(|e| IdentityFileError::Invalid(format!("trusted CAs: {e}")))
    }

    /// The OpenSSH private key (for the reverse tunnel or SSH access).
    pub fn ssh_private_key(&self) -> Result<PrivateKey, IdentityFileError> {
        PrivateKey::from_openssh(self.ssh_key.expose())
            .map_err(|_| IdentityFileError::Invalid("unreadable SSH private key".into()))
    }

    /// The OpenSSH certificate.
    pub fn ssh_certificate(&self) -> Result<ssh_key::Certificate, IdentityFileError> {
        ssh_key::Certificate::from_openssh(&self.ssh_cert)
            .map_err(|e| IdentityFileError::Invalid(format!("SSH certificate: {e}")))
    }

    /// The certificate chain and key for a TLS client.
    pub fn tls_parts(
        &self,
    ) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), IdentityFileError> {
        let chain = CertificateDer::pem_slice_iter(self.tls_cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| IdentityFileError::Invalid(format!("certificate PEM: {e}")))?;
        if chain.is_empty() {
            return Err(IdentityFileError::Invalid(
                "no certificate in tls_cert_pem".into(),
            ));
        }
        // The parser's own message is not passed on: nothing of the key may reach an error.
        let key =
            PrivateKeyDer::from_pem_slice(self.tls_key_pem.expose().as_bytes()).map_err(|e| match e {
                PemError::NoItemsFound => IdentityFileError::Invalid("no private key in tls_key_pem".into()),
                _ => IdentityFileError::Invalid("unreadable private key".into()),
            })?;
        Ok((chain, key))
    }
}

/// Writes `bytes` to `path` with mode 0600 (replacing a file with looser permissions), creating
/// a missing directory 0700.
pub(super) fn write_private(path: &Path, bytes: &[u8]) -> Result<(), IdentityFileError> {
    Ok(svc_core::fs::write_private_file(path, bytes)?)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use svc_core::auth::AuthService;
    use svc_core::backend::MemoryBackend;
    use svc_core::identity::HostCertRequest;

    use super::*;

    #[tokio::test]
    async fn identity_files_round_trip_privately_and_never_print_keys() {
        let auth = AuthService::open(
            Arc::new(MemoryBackend::new()),
            "id.test",
            Arc::new(svc_core::SystemClock),
        )
        .await
        .unwrap();
        let keys = KeyMaterial::generate().unwrap();
        let req = HostCertRequest {
            host_uuid: uuid::Uuid::new_v4(),
            node_name: "n".into(),
            roles: vec![svc_core::identity::SystemRole::Node],
            additional_names: vec![],
            ttl: Duration::from_secs(60),
        };
        let certs = auth
            .issue_host_certs(&req, &keys.tls_public_key(), keys.ssh_public_key())
            .unwrap();
        let identity = keys.into_identity(&certs, "id.test").unwrap();
        assert_eq!(identity.trusted.len(), 2);
        let debug = format!("{identity:?}");
        assert!(!debug.contains("PRIVATE"), "{debug}");

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("identity.json");
        identity.save(&path).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(
                std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
                0o600
            );
        }
        let loaded = ClientIdentity::load(&path).unwrap();
        assert_eq!(loaded.tls_cert_pem, identity.tls_cert_pem);
        assert_eq!(loaded.tls_key_pem.expose(), identity.tls_key_pem.expose());
        let (chain, _) = loaded.tls_parts().unwrap();
        let host = loaded
            .verifier()
            .unwrap()
            .verify_host_x509(&chain, SystemTime::now(), None)
            .unwrap();
        assert_eq!(host.host_id, identity.name);
        let ssh_cert = loaded.ssh_certificate().unwrap();
        assert_eq!(
            ssh_cert.public_key(),
            loaded.ssh_private_key().unwrap().public_key().key_data()
        );

        std::fs::write(&path, b"{\"cluster\": 1}").unwrap();
        let err = ClientIdentity::load(&path).unwrap_err().to_string();
        assert!(err.contains("not an identity file"), "{err}");
    }
}
