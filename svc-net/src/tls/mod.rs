//! The proxy's TLS identity and rustls configurations.
//!
//! Sits beside the router: routes that terminate TLS (the web API first) build their
//! `rustls::ServerConfig` here. The certificate comes from configured PEM files, or — by
//! default — is generated with rcgen (a self-signed CA and a server certificate naming the
//! public and listen addresses plus `localhost` and `127.0.0.1`) and persisted in the data
//! directory so a restart reuses it.
//!
//! This module is the one home of TLS mechanics in the crate: the crypto provider ([`provider`],
//! ring, chosen once), the client trust roots ([`client_roots`]: public web roots plus extra
//! PEM), the accept-anything verifier for `--insecure` ([`insecure_client_config`]), and the
//! server-side handshake under a deadline ([`accept_before`], and the [`TlsTerminate`] tower
//! layer over [`Connection`](crate::io::Connection) that every TLS listener uses).

mod terminate;

pub use terminate::{
    HandshakeDeadline, HandshakeError, TlsConnection, TlsTerminate, TlsTerminateLayer, accept_before,
};

use std::{
    fs, io,
    path::{Path, PathBuf},
    sync::{Arc, OnceLock},
};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{
    CertificateDer, PrivateKeyDer, ServerName, UnixTime,
    pem::{self, PemObject},
};

/// How long a peer has to finish a TLS handshake on listeners that do not share the accept
/// loop's peek deadline (resource proxies, the Auth API).
pub const DEFAULT_HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The crypto provider of every rustls configuration in svc: ring (aws-lc-rs would need cmake
/// and a C toolchain at build time), its default cipher suites in svc's order of preference
/// ([`CIPHER_SUITE_PREFERENCE`]). Built once; callers share the `Arc`.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    static PROVIDER: OnceLock<Arc<rustls::crypto::CryptoProvider>> = OnceLock::new();
    PROVIDER
        .get_or_init(|| {
            let mut provider = rustls::crypto::ring::default_provider();
            provider.cipher_suites.sort_by_key(|s| suite_rank(s.suite()));
            Arc::new(provider)
        })
        .clone()
}

/// The TLS 1.3 cipher suites svc's clients offer first, in this order (ring's default offers
/// AES-256 first); the TLS 1.2 suites follow in ring's order. AES-128-GCM with SHA-256 costs
/// less per handshake than AES-256-GCM with SHA-384 (SHA-256 has hardware instructions where
/// SHA-512 has none on common x86 CPUs) and less per byte (10 AES rounds against 14);
/// ChaCha20-Poly1305 is the fast suite without AES instructions. A server takes the client's
/// order (rustls' default), so this decides svc's own legs — `tsh` and local proxies to the
/// proxy, agents' tunnels, proxies to the Auth Service — and a browser still picks its own.
pub const CIPHER_SUITE_PREFERENCE: [rustls::CipherSuite; 3] = [
    rustls::CipherSuite::TLS13_AES_128_GCM_SHA256,
    rustls::CipherSuite::TLS13_CHACHA20_POLY1305_SHA256,
    rustls::CipherSuite::TLS13_AES_256_GCM_SHA384,
];

fn suite_rank(suite: rustls::CipherSuite) -> usize {
    CIPHER_SUITE_PREFERENCE
        .iter()
        .position(|s| *s == suite)
        .unwrap_or(CIPHER_SUITE_PREFERENCE.len())
}

/// Where the server certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TlsSource {
    /// PEM files given in the configuration (`https_keypairs`).
    Files {
        /// The certificate chain, leaf first.
        cert: PathBuf,
        /// The private key.
        key: PathBuf,
    },
    /// Generated on first start and kept in this directory.
    Generated {
        /// The data directory.
        data_dir: PathBuf,
    },
}

/// Why the TLS identity could not be loaded or made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// A PEM file holds no certificate or no private key.
    #[error("{path}: expected PEM {expected}, found none")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What was expected (`CERTIFICATE`, `PRIVATE KEY`).
        expected: &'static str,
    },
    /// A PEM file is not well-formed PEM.
    #[error("{path}: expected PEM {expected}, found malformed PEM: {reason}")]
    PemSyntax {
        /// The file.
        path: PathBuf,
        /// What was expected (`CERTIFICATE`, `PRIVATE KEY`).
        expected: &'static str,
        /// What the PEM parser found wrong.
        reason: String,
    },
    /// Generating the certificate failed.
    #[error("generating the proxy certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// rustls refused the certificate and key.
    #[error("building the TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    /// The generated key or its directory could not be made private (0600/0700).
    #[error(transparent)]
    Private(#[from] svc_core::fs::PrivateFsError),
}

/// The server certificate chain and key the proxy presents.
pub struct ServerIdentity {
    /// The chain, leaf first.
    pub chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    /// The generated CA's PEM file (clients pass it to `curl --cacert`), when generated.
    pub ca_file: Option<PathBuf>,
}

impl std::fmt::Debug for ServerIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerIdentity")
            .field("chain_len", &self.chain.len())
            .field("key", &"***")
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

/// File names inside the data directory.
const CA_FILE: &str = "proxy-ca.pem";
const CERT_FILE: &str = "proxy-cert.pem";
const KEY_FILE: &str = "proxy-key.pem";

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> TlsError + '_ {
    move |source| TlsError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Maps a PEM parser error on `path`: nothing of the `expected` kind becomes [`TlsError::Pem`],
/// anything else [`TlsError::PemSyntax`]. A base64 error can quote a byte of the file, so for a
/// private key only its kind is kept.
fn pem_err<'a>(path: &'a Path, expected: &'static str) -> impl FnOnce(pem::Error) -> TlsError + 'a {
    move |e| match e {
        pem::Error::NoItemsFound => TlsError::Pem {
            path: path.to_owned(),
            expected,
        },
        pem::Error::Base64Decode(_) if expected == "PRIVATE KEY" => TlsError::PemSyntax {
            path: path.to_owned(),
            expected,
            reason: "invalid base64".into(),
        },
        e => TlsError::PemSyntax {
            path: path.to_owned(),
            expected,
            reason: e.to_string(),
        },
    }
}

impl ServerIdentity {
    /// Loads or generates the identity. `names` are the host names and IP addresses the
    /// generated certificate must cover (public and listen addresses); `localhost` and
    /// `127.0.0.1` are always added.
    pub fn load(source: &TlsSource, names: &[String]) -> Result<Self, TlsError> {
        match source {
            TlsSource::Files { cert, key } => Self::from_files(cert, key, None),
            TlsSource::Generated { data_dir } => {
                let (ca, cert, key) = (
                    data_dir.join(CA_FILE),
                    data_dir.join(CERT_FILE),
                    data_dir.join(KEY_FILE),
                );
                if cert.exists() && key.exists() {
                    // An install from before keys were written 0600 (or a key copied in).
                    if let Some(repair) = svc_core::fs::repair_private_file(&key)? {
                        svc_core::fs::log_repair(&repair);
                    }
                    tracing::info!(cert = %cert.display(), ca = %ca.display(), "reusing the generated self-signed proxy certificate");
                } else {
                    generate(data_dir, names)?;
                    tracing::info!(
                        cert = %cert.display(),
                        ca = %ca.display(),
                        "generated a self-signed proxy certificate (configure https_keypairs for a publicly trusted one)"
                    );
                }
                Self::from_files(&cert, &key, Some(ca))
            }
        }
    }

    fn from_files(cert: &Path, key: &Path, ca_file: Option<PathBuf>) -> Result<Self, TlsError> {
        let pem = fs::read(cert).map_err(io_err(cert))?;
        let chain = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(pem_err(cert, "CERTIFICATE"))?;
        if chain.is_empty() {
            return Err(TlsError::Pem {
                path: cert.to_owned(),
                expected: "CERTIFICATE",
            });
        }
        let pem = fs::read(key).map_err(io_err(key))?;
        let key_der = PrivateKeyDer::from_pem_slice(&pem).map_err(pem_err(key, "PRIVATE KEY"))?;
        Ok(Self {
            chain,
            key: key_der,
            ca_file,
        })
    }

    /// A server configuration advertising `alpn` (in the server's order of preference).
    pub fn server_config(&self, alpn: &[&str]) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(self.chain.clone(), self.key.clone_key())?;
        config.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
        Ok(Arc::new(config))
    }

    /// Like [`server_config`](Self::server_config), but requiring a client certificate that
    /// `clients` accepts (the cluster's user CA for resource access).
    ///
    /// Sessions resume from stateless tickets (keys rotating every six hours): a local proxy
    /// (`tsh proxy app|db`) that opens a connection per client connection pays the full
    /// handshake once. A resumed session presents the certificate chain of its first handshake,
    /// which the proxy checks again (expiry included) as for any connection; the signature of a
    /// certificate the proxy's `Verifier` accepted before is not verified again (see
    /// `svc_core::identity::Verifier::verify_x509`).
    pub fn server_config_with_client_auth(
        &self,
        alpn: &[&str],
        clients: Arc<dyn rustls::server::danger::ClientCertVerifier>,
    ) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(clients)
            .with_single_cert(self.chain.clone(), self.key.clone_key())?;
        config.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
        config.ticketer = rustls::crypto::ring::Ticketer::new()?;
        Ok(Arc::new(config))
    }
}

fn generate(dir: &Path, names: &[String]) -> Result<(), TlsError> {
    if let Some(repair) = svc_core::fs::ensure_private_dir(dir)? {
        svc_core::fs::log_repair(&repair);
    }
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "svc proxy self-signed CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key)?;

    let mut sans: Vec<String> = vec!["localhost".into(), "127.0.0.1".into()];
    for n in names {
        let n = n.trim_start_matches('[').trim_end_matches(']').to_owned();
        if !n.is_empty() && !sans.contains(&n) && n != "0.0.0.0" && n != "::" {
            sans.push(n);
        }
    }
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(sans)?;
    params.distinguished_name.push(DnType::CommonName, "svc proxy");
    let cert = params.signed_by(&key, &ca)?;

    // Every file in the data directory is 0600 (the certificates too: a start that found a
    // 0644 file there would take it for an old install and repair it).
    let write = |name: &str, body: String| svc_core::fs::write_private_file(&dir.join(name), body.as_bytes());
    write(CA_FILE, ca.pem())?;
    // The key last: its presence marks a complete set.
    write(CERT_FILE, format!("{}{}", cert.pem(), ca.pem()))?;
    write(KEY_FILE, key.serialize_pem())?;
    Ok(())
}

/// The trust roots of a client: the public web roots plus every certificate of `extra_ca_pem`
/// (a PEM bundle, e.g. a corporate CA or a generated proxy CA). A bundle given but holding no
/// certificate is an error: a typo must not silently fall back to the public roots alone.
pub fn client_roots(extra_ca_pem: Option<&[u8]>) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(pem) = extra_ca_pem {
        let mut added = 0;
        for cert in CertificateDer::pem_slice_iter(pem) {
            let cert = cert.map_err(pem_err(Path::new("<ca bundle>"), "CERTIFICATE"))?;
            roots.add(cert)?;
            added += 1;
        }
        if added == 0 {
            return Err(TlsError::Pem {
                path: PathBuf::from("<ca bundle>"),
                expected: "CERTIFICATE",
            });
        }
    }
    Ok(roots)
}

/// A client configuration trusting [`client_roots`]`(extra_ca_pem)`.
pub fn client_config(extra_ca_pem: Option<&[u8]>) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(client_roots(extra_ca_pem)?)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_once_and_reuses() {
        let dir = tempfile::tempdir().unwrap();
        let source = TlsSource::Generated {
            data_dir: dir.path().to_owned(),
        };
        let first = ServerIdentity::load(&source, &["proxy.example.com".into()]).unwrap();
        assert_eq!(first.chain.len(), 2);
        let again = ServerIdentity::load(&source, &[]).unwrap();
        assert_eq!(first.chain, again.chain, "a restart reuses the certificate");
        first.server_config(&["http/1.1", "h2"]).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(dir.path().join(KEY_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
            // A key left world-readable by an older install is tightened on the next start.
            let key = dir.path().join(KEY_FILE);
            fs::set_permissions(&key, fs::Permissions::from_mode(0o644)).unwrap();
            ServerIdentity::load(&source, &[]).unwrap();
            assert_eq!(fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600);
        }
    }

    /// A client that keeps its configuration (and so its session cache) resumes its session on
    /// the next connection to a resource-access configuration, and the proxy still sees the
    /// client's certificate chain of the first handshake, which it verifies for every
    /// connection.
    #[tokio::test]
    async fn client_auth_sessions_resume_and_keep_the_client_chain() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir().unwrap();
        let source = TlsSource::Generated {
            data_dir: dir.path().to_owned(),
        };
        let server = ServerIdentity::load(&source, &[]).unwrap();
        // The user CA and a user certificate.
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = rcgen::CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
        let user_key = KeyPair::generate().unwrap();
        let user = CertificateParams::new(vec!["alice".to_owned()])
            .unwrap()
            .signed_by(&user_key, &ca)
            .unwrap();
        let mut clients = rustls::RootCertStore::empty();
        clients.add(ca.der().clone()).unwrap();
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(clients), provider())
                .build()
                .unwrap();
        let server_config = server
            .server_config_with_client_auth(&["svc-test"], verifier)
            .unwrap();
        let proxy_ca = fs::read(dir.path().join(CA_FILE)).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&proxy_ca) {
            roots.add(cert.unwrap()).unwrap();
        }
        let key = rustls::pki_types::PrivateKeyDer::try_from(user_key.serialize_der()).unwrap();
        let mut client_config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_client_auth_cert(vec![user.der().clone()], key)
            .unwrap();
        client_config.alpn_protocols = vec![b"svc-test".to_vec()];
        let client_config = Arc::new(client_config);
        let acceptor = tokio_rustls::TlsAcceptor::from(server_config);
        let connector = tokio_rustls::TlsConnector::from(client_config);

        let mut kinds = Vec::new();
        for _ in 0..3 {
            let (c, s) = tokio::io::duplex(64 * 1024);
            let accept = acceptor.clone();
            let served = tokio::spawn(async move {
                let mut tls = accept.accept(s).await.unwrap();
                let chain: Vec<Vec<u8>> = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .unwrap_or_default()
                    .iter()
                    .map(|c| c.to_vec())
                    .collect();
                tls.write_all(b"x").await.unwrap();
                tls.shutdown().await.unwrap();
                chain
            });
            let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
            let mut tls = connector.connect(name, c).await.unwrap();
            // Reading to the end also takes in the session tickets.
            let mut got = Vec::new();
            tls.read_to_end(&mut got).await.unwrap();
            assert_eq!(got, b"x");
            kinds.push(tls.get_ref().1.handshake_kind());
            let chain = tokio::time::timeout(std::time::Duration::from_secs(30), served)
                .await
                .expect("the server side finished within 30 s")
                .unwrap();
            assert_eq!(
                chain,
                vec![user.der().to_vec()],
                "the client's chain, resumed or not"
            );
        }
        assert_eq!(
            kinds,
            vec![
                Some(rustls::HandshakeKind::Full),
                Some(rustls::HandshakeKind::Resumed),
                Some(rustls::HandshakeKind::Resumed)
            ]
        );
    }

    /// svc's clients negotiate AES-128-GCM with the proxy; a client that prefers another suite
    /// (ring's default order, AES-256 first, as some browsers do) gets its own choice.
    #[tokio::test]
    async fn svc_clients_prefer_aes_128_and_the_server_takes_the_clients_order() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir().unwrap();
        let source = TlsSource::Generated {
            data_dir: dir.path().to_owned(),
        };
        let server = ServerIdentity::load(&source, &[]).unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(server.server_config(&["http/1.1"]).unwrap());
        let proxy_ca = fs::read(dir.path().join(CA_FILE)).unwrap();
        let mut negotiated = Vec::new();
        for provider in [provider(), Arc::new(rustls::crypto::ring::default_provider())] {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(&proxy_ca) {
                roots.add(cert.unwrap()).unwrap();
            }
            let config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth();
            let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
            let (c, s) = tokio::io::duplex(64 * 1024);
            let accept = acceptor.clone();
            let served = tokio::spawn(async move {
                let mut tls = accept.accept(s).await.unwrap();
                let suite = tls.get_ref().1.negotiated_cipher_suite().map(|s| s.suite());
                tls.write_all(b"x").await.unwrap();
                tls.shutdown().await.unwrap();
                suite
            });
            let name = ServerName::try_from("localhost").unwrap();
            let mut tls = connector.connect(name, c).await.unwrap();
            let mut got = Vec::new();
            tls.read_to_end(&mut got).await.unwrap();
            let client_side = tls.get_ref().1.negotiated_cipher_suite().map(|s| s.suite());
            let server_side = tokio::time::timeout(std::time::Duration::from_secs(30), served)
                .await
                .expect("the server side finished within 30 s")
                .unwrap();
            assert_eq!(client_side, server_side);
            negotiated.push(client_side);
        }
        assert_eq!(
            negotiated,
            vec![
                Some(rustls::CipherSuite::TLS13_AES_128_GCM_SHA256),
                Some(rustls::CipherSuite::TLS13_AES_256_GCM_SHA384)
            ]
        );
        // The order offered: svc's three TLS 1.3 suites first, then TLS 1.2 as ring has them.
        let offered: Vec<_> = provider().cipher_suites.iter().map(|s| s.suite()).collect();
        assert_eq!(offered[..3], CIPHER_SUITE_PREFERENCE);
        assert_eq!(offered.len(), rustls::crypto::ring::DEFAULT_CIPHER_SUITES.len());
    }

    #[test]
    fn missing_files_name_the_path() {
        let err = ServerIdentity::load(
            &TlsSource::Files {
                cert: "/nonexistent/cert.pem".into(),
                key: "/nonexistent/key.pem".into(),
            },
            &[],
        )
        .unwrap_err();
        assert!(err.to_string().contains("/nonexistent/cert.pem"), "{err}");
    }

    #[test]
    fn bad_pem_names_the_file_and_what_was_expected() {
        let dir = tempfile::tempdir().unwrap();
        let generated = TlsSource::Generated {
            data_dir: dir.path().to_owned(),
        };
        ServerIdentity::load(&generated, &["proxy.example.com".into()]).unwrap();
        let cert = dir.path().join(CERT_FILE);
        let key = dir.path().join(KEY_FILE);
        let load = |cert: &Path, key: &Path| {
            let files = TlsSource::Files {
                cert: cert.to_owned(),
                key: key.to_owned(),
            };
            ServerIdentity::load(&files, &[]).unwrap_err().to_string()
        };

        // A key file in the certificate's place: no CERTIFICATE block.
        let err = load(&key, &key);
        assert!(err.contains(&key.display().to_string()), "{err}");
        assert!(err.contains("expected PEM CERTIFICATE, found none"), "{err}");

        // A certificate file in the key's place: no PRIVATE KEY block.
        let err = load(&cert, &cert);
        assert!(err.contains("expected PEM PRIVATE KEY, found none"), "{err}");

        // A key whose base64 is broken: named, kind given, no byte of it quoted.
        let broken = dir.path().join("broken.pem");
        let body = fs::read_to_string(&key).unwrap();
        let secret_line = body.lines().nth(1).unwrap().to_owned();
        fs::write(&broken, body.replacen(&secret_line, "%%%%not base64%%%%", 1)).unwrap();
        let err = load(&cert, &broken);
        assert!(
            err.contains("expected PEM PRIVATE KEY, found malformed PEM: invalid base64"),
            "{err}"
        );
        assert!(!err.contains('%'), "{err}");

        // A certificate without its END line.
        let cut = dir.path().join("cut.pem");
        let body = fs::read_to_string(&cert).unwrap();
        let end = body.find("-----END CERTIFICATE-----").unwrap();
        fs::write(&cut, &body[..end]).unwrap();
        let err = load(&cut, &key);
        assert!(err.contains(&cut.display().to_string()), "{err}");
        assert!(
            err.contains("expected PEM CERTIFICATE, found malformed PEM: missing section end"),
            "{err}"
        );
    }
}

/// A client configuration that accepts any server certificate: `tsh --insecure` and
/// `svc start --insecure` against a proxy with a self-signed certificate (test clusters). Where
/// SSH runs inside (the reverse tunnel, `svc-proxy-ssh`), the cluster CAs still authenticate
/// both ends.
pub fn insecure_client_config() -> Result<rustls::ClientConfig, rustls::Error> {
    Ok(insecure_client_builder()?.with_no_client_auth())
}

/// [`insecure_client_config`] presenting the client certificate `chain` with its `key` (a
/// user's or a host's, to the resource or tunnel entries of such a proxy).
pub fn insecure_client_config_with_auth(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<rustls::ClientConfig, rustls::Error> {
    insecure_client_builder()?.with_client_auth_cert(chain, key)
}

fn insecure_client_builder()
-> Result<rustls::ConfigBuilder<rustls::ClientConfig, rustls::client::WantsClientCert>, rustls::Error> {
    Ok(rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(insecure_verifier()))
}

/// The one accept-anything server verifier, for `--insecure` only (see
/// [`insecure_client_config`]); signatures are still checked so the handshake is well-formed.
pub(crate) fn insecure_verifier() -> Arc<ServerIdentityVerifier<AcceptAny>> {
    ServerIdentityVerifier::new(AcceptAny)
}

/// Accepts any server certificate (see [`insecure_client_config`]).
#[derive(Debug)]
pub(crate) struct AcceptAny;

impl ServerIdentityCheck for AcceptAny {
    fn check(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: UnixTime,
    ) -> Result<(), rustls::Error> {
        Ok(())
    }
}

/// What a cluster client checks of a server's certificate where web PKI would check names:
/// the identity the cluster's CAs put in it (the Auth Service's role, an agent's host ID, a
/// peer proxy's role, a pinned CA before joining). [`ServerIdentityVerifier`] wraps it with the
/// standard handshake-signature checks.
pub(crate) trait ServerIdentityCheck: std::fmt::Debug + Send + Sync {
    /// Accepts or refuses the server's certificate chain at `now` (the error is what the
    /// handshake fails with).
    fn check(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        now: UnixTime,
    ) -> Result<(), rustls::Error>;
}

/// A rustls server verifier made of a [`ServerIdentityCheck`] and the crate's crypto provider
/// (which verifies the handshake signatures).
#[derive(Debug)]
pub(crate) struct ServerIdentityVerifier<C> {
    check: C,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl<C: ServerIdentityCheck> ServerIdentityVerifier<C> {
    /// The verifier for `check`.
    pub(crate) fn new(check: C) -> Arc<Self> {
        Arc::new(Self {
            check,
            provider: provider(),
        })
    }
}

impl<C: ServerIdentityCheck> ServerCertVerifier for ServerIdentityVerifier<C> {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        _ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.check.check(end_entity, intermediates, server_name, now)?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
