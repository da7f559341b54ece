//! A test PKI: a CA (rcgen) that issues server certificates for names and IP addresses, as PEM.

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};

/// A certificate authority for one test.
pub struct TestCa {
    /// The CA certificate (PEM), to trust.
    pub cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate and its private key, as PEM.
pub struct Issued {
    /// The certificate.
    pub cert_pem: String,
    /// Its private key (PKCS#8).
    pub key_pem: String,
}

impl TestCa {
    /// A fresh CA whose subject's common name is `name`.
    pub fn new(name: &str) -> TestCa {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.self_signed(&key).expect("self-signing the CA");
        TestCa {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A server certificate named `common_name`, valid for `names`: IP addresses become IP
    /// subject alternative names, anything else DNS names.
    pub fn server(&self, common_name: &str, names: &[&str]) -> Issued {
        let key = KeyPair::generate().expect("server key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("server parameters");
        params.subject_alt_names = names
            .iter()
            .map(|n| match n.parse() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName((*n).try_into().expect("a DNS name")),
            })
            .collect();
        params.distinguished_name.push(DnType::CommonName, common_name);
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("signing the certificate");
        Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issues_pem_for_ips_and_names() {
        let ca = TestCa::new("test CA");
        let issued = ca.server("server", &["127.0.0.2", "proxy.test"]);
        assert!(ca.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(issued.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(issued.key_pem.contains("PRIVATE KEY"));
    }
}
