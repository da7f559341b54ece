//! X.509 encoding of identities: the parameters rcgen signs and the reading back of a leaf
//! certificate with x509-parser.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, CustomExtension, DistinguishedName, DnType, ExtendedKeyUsagePurpose,
    IsCa, KeyUsagePurpose, SanType, SerialNumber,
};
use ring::rand::{SecureRandom, SystemRandom};
use time::OffsetDateTime;
use x509_parser::prelude::{FromDer, X509Certificate};

use super::{Claims, IdentityError, IdentityKind, Validity, VerifyError};

/// OID of the X.509 extension that carries the [`Claims`]. It sits under `1.3.9999`, an arc no
/// registry assigns (other cluster access systems use it the same way for private subject
/// attributes), so it cannot collide with a standard extension. The extension is non-critical:
/// generic TLS stacks skip it, our verifier requires it.
pub const IDENTITY_EXTENSION_OID: &[u64] = &[1, 3, 9999, 4242, 1];

/// The dotted form of [`IDENTITY_EXTENSION_OID`], for comparing with parsed OIDs.
const IDENTITY_EXTENSION_OID_STR: &str = "1.3.9999.4242.1";

/// X.509 times have whole seconds; truncating before signing makes the validity read back
/// equal to the one signed.
pub(crate) fn whole_seconds(t: SystemTime) -> SystemTime {
    let secs = t.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_secs();
    UNIX_EPOCH + Duration::from_secs(secs)
}

fn random_bytes<const N: usize>() -> Result<[u8; N], IdentityError> {
    let mut bytes = [0u8; N];
    SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| IdentityError::KeyGeneration("the system random source failed".into()))?;
    Ok(bytes)
}

pub(crate) fn random_u64() -> Result<u64, IdentityError> {
    Ok(u64::from_be_bytes(random_bytes::<8>()?))
}

pub(crate) fn random_32_bytes() -> Result<[u8; 32], IdentityError> {
    random_bytes::<32>()
}

/// A random positive 128-bit serial number (RFC 5280 asks for unpredictable serials).
fn random_serial() -> Result<SerialNumber, IdentityError> {
    let mut bytes = random_bytes::<16>()?;
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01;
    Ok(SerialNumber::from_slice(&bytes))
}

/// The parameters of a CA certificate: self-signed, may sign leaves only (path length 0).
pub(crate) fn ca_params(
    kind: IdentityKind,
    cluster: &str,
    now: SystemTime,
    ttl: Duration,
) -> Result<CertificateParams, IdentityError> {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cluster);
    dn.push(DnType::OrganizationName, cluster);
    dn.push(
        DnType::OrganizationalUnitName,
        format!("svc {kind} certificate authority"),
    );
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.serial_number = Some(random_serial()?);
    let now = whole_seconds(now);
    params.not_before = OffsetDateTime::from(now - super::CLOCK_SKEW);
    params.not_after = OffsetDateTime::from(now + ttl);
    Ok(params)
}

/// The parameters of a leaf certificate stating `claims`, valid from `now - CLOCK_SKEW` for
/// `ttl` (but never past the CA's own end, `ca_not_after`).
pub(crate) fn leaf_params(
    claims: &Claims,
    kind: IdentityKind,
    now: SystemTime,
    ttl: Duration,
    ca_not_after: SystemTime,
) -> Result<CertificateParams, IdentityError> {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, claims.name.as_str());
    dn.push(DnType::OrganizationName, claims.cluster.as_str());
    params.distinguished_name = dn;
    params.serial_number = Some(random_serial()?);
    let now = whole_seconds(now);
    params.not_before = OffsetDateTime::from(now - super::CLOCK_SKEW);
    params.not_after = OffsetDateTime::from((now + ttl).min(ca_not_after));
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.use_authority_key_identifier_extension = true;
    match kind {
        IdentityKind::Host => {
            // Hosts are servers (TLS routing, 3025, 3022…) and clients (agent → auth/proxy).
            params.extended_key_usages = vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ];
            let mut names = vec![claims.name.clone(), claims.node_name.clone()];
            names.extend(claims.names.iter().cloned());
            let mut seen = std::collections::HashSet::new();
            for name in names.into_iter().filter(|n| seen.insert(n.clone())) {
                params.subject_alt_names.push(san(&name)?);
            }
        }
        IdentityKind::User => {
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        }
    }
    params.custom_extensions.push(CustomExtension::from_oid_content(
        IDENTITY_EXTENSION_OID,
        claims.to_der(),
    ));
    Ok(params)
}

fn san(name: &str) -> Result<SanType, IdentityError> {
    if let Ok(ip) = name.parse() {
        return Ok(SanType::IpAddress(ip));
    }
    let dns = name
        .to_owned()
        .try_into()
        .map_err(|_| IdentityError::InvalidRequest {
            field: "additional_names",
            reason: format!("a subject alternative name must be ASCII, got {name:?}"),
        })?;
    Ok(SanType::DnsName(dns))
}

fn to_system_time(t: x509_parser::time::ASN1Time) -> Result<SystemTime, VerifyError> {
    let secs =
        u64::try_from(t.timestamp()).map_err(|_| VerifyError::Malformed("validity before 1970".into()))?;
    Ok(UNIX_EPOCH + Duration::from_secs(secs))
}

pub(crate) fn parse(der: &[u8]) -> Result<X509Certificate<'_>, VerifyError> {
    let (rest, cert) =
        X509Certificate::from_der(der).map_err(|e| VerifyError::Malformed(format!("certificate: {e}")))?;
    if !rest.is_empty() {
        return Err(VerifyError::Malformed(
            "trailing bytes after the certificate".into(),
        ));
    }
    Ok(cert)
}

/// The validity of a parsed certificate.
pub(crate) fn validity(cert: &X509Certificate<'_>) -> Result<Validity, VerifyError> {
    Ok(Validity {
        not_before: to_system_time(cert.validity().not_before)?,
        not_after: to_system_time(cert.validity().not_after)?,
    })
}

/// The SubjectPublicKeyInfo DER of a certificate (what the CA pin hashes).
pub(crate) fn spki_der(der: &[u8]) -> Result<Vec<u8>, VerifyError> {
    Ok(parse(der)?.public_key().raw.to_vec())
}

/// Reads the claims a leaf certificate states and checks the subject agrees with them.
pub(crate) fn read_claims(cert: &X509Certificate<'_>) -> Result<Claims, VerifyError> {
    let ext = cert
        .extensions()
        .iter()
        .find(|e| e.oid.to_id_string() == IDENTITY_EXTENSION_OID_STR)
        .ok_or(VerifyError::MissingIdentity)?;
    let claims = Claims::from_der(ext.value)?;
    let cn = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok());
    if cn != Some(claims.name.as_str()) {
        return Err(VerifyError::Malformed(format!(
            "subject common name {cn:?} does not match the identity name {:?}",
            claims.name
        )));
    }
    Ok(claims)
}
