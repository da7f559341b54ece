//! The SAML 2.0 service provider behind a `saml` connector.
//!
//! What a sign-in through SAML needs from the Auth Service, without sockets:
//!
//! - the identity provider's metadata ([`IdpMetadata`]): its entity ID (the issuer every
//!   response must name), its HTTP-Redirect single sign-on URL, and the certificates it signs
//!   with, from the connector's inline `entity_descriptor`, from the document the caller fetched
//!   at `entity_descriptor_url` ([`metadata_source`] tells which), or from `issuer`/`sso`/`cert`;
//! - the `AuthnRequest` ([`ServiceProvider::authn_request`]): HTTP-Redirect binding (deflate,
//!   base64), with a fresh ID the caller keeps to check the response's `InResponseTo`;
//! - the validation of the HTTP-POST binding's `SAMLResponse` ([`ServiceProvider::validate`]).
//!
//! Validation rules, in order; every refusal is a [`SamlError`] that says which rule failed:
//!
//! 1. The XML-DSig signature is verified by libxmlsec1 (through the `samael` crate) with the
//!    certificates of the IdP's metadata only — a certificate embedded in the response is never
//!    trusted. A signature is REQUIRED, on the assertion or on the whole response; only the signed
//!    element is read afterwards (samael reduces the document to the verified node set), so a
//!    response that wraps or moves its signed element, or carries a second unsigned assertion,
//!    cannot smuggle values past the signature.
//! 2. `Issuer` = the IdP's entity ID; `Destination` (when signed) and the bearer
//!    `SubjectConfirmationData`'s `Recipient` = the connector's ACS URL; `InResponseTo` = the
//!    request's ID; `Audience` = the service provider's entity ID (required, not only checked
//!    when present); `NotBefore`/`NotOnOrAfter` of the conditions and of the confirmation data,
//!    with [`CLOCK_SKEW`] of tolerance.
//! 3. Replay: the assertion ID is remembered ([`ReplayCache`]) until its `NotOnOrAfter`; the same
//!    assertion presented again is refused.
//!
//! The attributes of the signed assertion then decide the roles through the connector's
//! `attributes_to_roles` ([`roles_for`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use samael::metadata::{EntityDescriptor, HTTP_REDIRECT_BINDING};
use samael::schema::Assertion;
use samael::service_provider::{Error as SpError, ServiceProvider as SamaelSp};

use crate::resource::{AttributeRolesMapping, SamlConnector};

/// Tolerance for the clocks of the IdP and of the Auth Service on `NotBefore`/`NotOnOrAfter`.
pub const CLOCK_SKEW: Duration = Duration::from_secs(60);
/// How long after the IdP issued a response it is still accepted (on top of [`CLOCK_SKEW`]).
pub const MAX_ISSUE_DELAY: Duration = Duration::from_secs(5 * 60);
/// The largest `SAMLResponse` accepted, base64 included.
pub const MAX_RESPONSE_LEN: usize = 256 * 1024;
/// The largest metadata document accepted.
pub const MAX_METADATA_LEN: usize = 1024 * 1024;

const DSIG_NS: &[u8] = b"http://www.w3.org/2000/09/xmldsig#";
const ASSERTION_NS: &[u8] = b"urn:oasis:names:tc:SAML:2.0:assertion";
const NAMEID_PERSISTENT: &str = "urn:oasis:names:tc:SAML:2.0:nameid-format:persistent";

/// Why a SAML step failed. Messages name the connector and the rule, never a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SamlError {
    /// The IdP metadata (or `issuer`/`sso`/`cert`) does not describe a usable identity provider.
    #[error("saml connector {connector:?}: identity provider metadata: {reason}")]
    Metadata {
        /// The connector.
        connector: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The `AuthnRequest` could not be built.
    #[error("saml connector {connector:?}: building the AuthnRequest: {reason}")]
    Request {
        /// The connector.
        connector: String,
        /// Why.
        reason: String,
    },
    /// The `SAMLResponse` form value is not what the HTTP-POST binding carries.
    #[error("saml connector {connector:?}: SAMLResponse: {reason}")]
    Encoding {
        /// The connector.
        connector: String,
        /// Why.
        reason: String,
    },
    /// Neither the assertion nor the response is signed.
    #[error(
        "saml connector {connector:?}: the response carries no XML signature on its Response or Assertion; signed assertions are required"
    )]
    Unsigned {
        /// The connector.
        connector: String,
    },
    /// The signature is made with a key the IdP's metadata does not list.
    #[error(
        "saml connector {connector:?}: the response is signed with a certificate that the identity provider's metadata does not list"
    )]
    UnknownSigner {
        /// The connector.
        connector: String,
    },
    /// The signature does not verify with the IdP's certificate.
    #[error(
        "saml connector {connector:?}: the response's signature does not verify with the identity provider's certificate (the signed content was altered, or the signed element was moved)"
    )]
    BadSignature {
        /// The connector.
        connector: String,
    },
    /// What the signature covers is not one Response or one Assertion read as such (signature
    /// wrapping, several assertions, content outside the signed element).
    #[error(
        "saml connector {connector:?}: the signed part of the response is not a single Response or Assertion ({reason}); a response that wraps its signed element is refused"
    )]
    Structure {
        /// The connector.
        connector: String,
        /// What the parser found.
        reason: String,
    },
    /// `Issuer` is not the IdP's entity ID.
    #[error("saml connector {connector:?}: issuer {got:?} is not the identity provider {expected:?}")]
    Issuer {
        /// The connector.
        connector: String,
        /// The issuer in the response.
        got: String,
        /// The IdP's entity ID.
        expected: String,
    },
    /// The audience restriction does not name this service provider.
    #[error(
        "saml connector {connector:?}: the assertion's audience {got:?} does not include this service provider {expected:?}"
    )]
    Audience {
        /// The connector.
        connector: String,
        /// The audiences of the assertion.
        got: Vec<String>,
        /// This service provider's entity ID.
        expected: String,
    },
    /// `Destination` or `Recipient` is not the ACS URL.
    #[error("saml connector {connector:?}: {field} {got:?} is not this connector's ACS URL {expected:?}")]
    Recipient {
        /// The connector.
        connector: String,
        /// `Destination` (the response) or `Recipient` (the subject confirmation).
        field: &'static str,
        /// The value in the response.
        got: String,
        /// The ACS URL.
        expected: String,
    },
    /// `InResponseTo` is not the request this sign-in sent.
    #[error("saml connector {connector:?}: InResponseTo {got:?} does not answer the request {expected:?}")]
    InResponseTo {
        /// The connector.
        connector: String,
        /// The value in the response.
        got: String,
        /// The request's ID.
        expected: String,
    },
    /// Outside the validity window.
    #[error("saml connector {connector:?}: the assertion {what} (clock skew allowed: {skew_secs}s)")]
    Expired {
        /// The connector.
        connector: String,
        /// Which bound failed, with its time.
        what: String,
        /// The tolerance applied.
        skew_secs: u64,
    },
    /// The assertion was presented before.
    #[error("saml connector {connector:?}: assertion {assertion_id:?} was already used to sign in (replay)")]
    Replayed {
        /// The connector.
        connector: String,
        /// The assertion's ID.
        assertion_id: String,
    },
    /// The IdP answered with a non-success status.
    #[error("saml connector {connector:?}: the identity provider refused the sign-in: status {code}")]
    Status {
        /// The connector.
        connector: String,
        /// The SAML status code.
        code: String,
    },
    /// The assertion lacks what a sign-in needs (a subject name, a bearer confirmation, …).
    #[error("saml connector {connector:?}: the assertion {reason}")]
    Incomplete {
        /// The connector.
        connector: String,
        /// What is missing.
        reason: String,
    },
}

/// Where the identity provider's metadata comes from, per the connector's spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetadataSource<'a> {
    /// Inline `entity_descriptor`.
    Inline(&'a str),
    /// `entity_descriptor_url`: the caller fetches it (HTTPS) and hands the body to
    /// [`IdpMetadata::parse`].
    Url(&'a str),
    /// No metadata document: `issuer`, `sso` and `cert` ([`IdpMetadata::from_parts`]).
    Parts,
}

/// Which metadata source the connector names (inline wins over the URL, the URL over the parts).
pub fn metadata_source(connector: &SamlConnector) -> MetadataSource<'_> {
    if let Some(xml) = &connector.spec.entity_descriptor {
        MetadataSource::Inline(xml)
    } else if let Some(url) = &connector.spec.entity_descriptor_url {
        MetadataSource::Url(url)
    } else {
        MetadataSource::Parts
    }
}

/// The identity provider, as its metadata describes it.
#[derive(Debug, Clone)]
pub struct IdpMetadata {
    /// The IdP's entity ID: the `Issuer` of its responses.
    pub entity_id: String,
    /// The single sign-on URL of the HTTP-Redirect binding.
    pub sso_url: String,
    /// The DER certificates the IdP signs with.
    pub signing_certs: Vec<Vec<u8>>,
    descriptor: EntityDescriptor,
}

impl IdpMetadata {
    /// Parses an `EntityDescriptor` document: entity ID, the HTTP-Redirect SSO endpoint, the
    /// signing certificates (`use="signing"`, or without `use`).
    pub fn parse(connector: &str, xml: &str) -> Result<Self, SamlError> {
        let bad = |reason: String| SamlError::Metadata {
            connector: connector.to_string(),
            reason,
        };
        if xml.len() > MAX_METADATA_LEN {
            return Err(bad(format!(
                "the document is larger than {MAX_METADATA_LEN} bytes"
            )));
        }
        reject_doctype(xml).map_err(bad)?;
        let descriptor: EntityDescriptor = xml
            .parse()
            .map_err(|e| bad(format!("not a SAML EntityDescriptor: {e}")))?;
        let entity_id = descriptor
            .entity_id
            .clone()
            .filter(|s| !s.is_empty())
            .ok_or_else(|| bad("the EntityDescriptor has no entityID".into()))?;
        let idps = descriptor
            .idp_sso_descriptors
            .as_deref()
            .filter(|d| !d.is_empty())
            .ok_or_else(|| bad("no IDPSSODescriptor: this is not an identity provider's metadata".into()))?;
        let sso_url = idps
            .iter()
            .flat_map(|d| &d.single_sign_on_services)
            .find(|e| e.binding == HTTP_REDIRECT_BINDING)
            .map(|e| e.location.clone())
            .ok_or_else(|| bad("no SingleSignOnService with the HTTP-Redirect binding".into()))?;
        let mut signing_certs = Vec::new();
        for key in idps.iter().flat_map(|d| &d.key_descriptors) {
            let usable = matches!(key.key_use.as_deref(), None | Some("") | Some("signing"));
            if !usable {
                continue;
            }
            for cert in key.key_info.x509_data.iter().flat_map(|x| &x.certificates) {
                let der =
                    decode_b64(cert).map_err(|e| bad(format!("a signing certificate is not base64: {e}")))?;
                x509_parser::parse_x509_certificate(&der)
                    .map_err(|e| bad(format!("a signing certificate is not X.509: {e}")))?;
                signing_certs.push(der);
            }
        }
        if signing_certs.is_empty() {
            return Err(bad(
                "no signing certificate (KeyDescriptor use=\"signing\")".into()
            ));
        }
        Ok(Self {
            entity_id,
            sso_url,
            signing_certs,
            descriptor,
        })
    }

    /// The identity provider from the connector's `issuer`, `sso` and `cert` (PEM).
    pub fn from_parts(connector: &str, issuer: &str, sso: &str, cert_pem: &str) -> Result<Self, SamlError> {
        let bad = |reason: String| SamlError::Metadata {
            connector: connector.to_string(),
            reason,
        };
        if issuer.is_empty() {
            return Err(bad("spec.issuer is empty".into()));
        }
        let der = pem::parse(cert_pem)
            .map_err(|e| bad(format!("spec.cert is not PEM: {e}")))?
            .into_contents();
        x509_parser::parse_x509_certificate(&der).map_err(|e| bad(format!("spec.cert is not X.509: {e}")))?;
        let xml = format!(
            r#"<md:EntityDescriptor xmlns:md="urn:oasis:names:tc:SAML:2.0:metadata" xmlns:ds="http://www.w3.org/2000/09/xmldsig#" entityID="{issuer}"><md:IDPSSODescriptor protocolSupportEnumeration="urn:oasis:names:tc:SAML:2.0:protocol"><md:KeyDescriptor use="signing"><ds:KeyInfo><ds:X509Data><ds:X509Certificate>{cert}</ds:X509Certificate></ds:X509Data></ds:KeyInfo></md:KeyDescriptor><md:SingleSignOnService Binding="{HTTP_REDIRECT_BINDING}" Location="{sso}"/></md:IDPSSODescriptor></md:EntityDescriptor>"#,
            issuer = xml_escape(issuer),
            cert = STANDARD.encode(&der),
            sso = xml_escape(sso),
        );
        Self::parse(connector, &xml)
    }

    /// The metadata a connector names inline or through its parts; `None` when it must be
    /// fetched from `entity_descriptor_url` first.
    pub fn from_connector(connector: &SamlConnector) -> Result<Option<Self>, SamlError> {
        let name = &connector.metadata.name;
        match metadata_source(connector) {
            MetadataSource::Inline(xml) => Self::parse(name, xml).map(Some),
            MetadataSource::Url(_) => Ok(None),
            MetadataSource::Parts => {
                let spec = &connector.spec;
                let missing = |field: &str| SamlError::Metadata {
                    connector: name.clone(),
                    reason: format!(
                        "without entity_descriptor or entity_descriptor_url, spec.{field} is required"
                    ),
                };
                let issuer = spec.issuer.as_deref().ok_or_else(|| missing("issuer"))?;
                let sso = spec.sso.as_deref().ok_or_else(|| missing("sso"))?;
                let cert = spec.cert.as_deref().ok_or_else(|| missing("cert"))?;
                Self::from_parts(name, issuer, sso, cert).map(Some)
            }
        }
    }
}

/// An `AuthnRequest` ready to send with the HTTP-Redirect binding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthnRequest {
    /// The request's ID: keep it with the sign-in, the response's `InResponseTo` must match.
    pub id: String,
    /// The IdP's SSO URL with `SAMLRequest` (and `RelayState`) in its query.
    pub redirect_url: String,
}

/// What a valid response says about the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SamlIdentity {
    /// The subject's `NameID`: the user name.
    pub name_id: String,
    /// Attribute name → values (by `Name`, and by `FriendlyName` too when there is one).
    pub attributes: BTreeMap<String, Vec<String>>,
    /// The assertion's ID (remembered against replay).
    pub assertion_id: String,
    /// The assertion's `NotOnOrAfter` (the earliest of the conditions' and the confirmation's).
    pub not_on_or_after: SystemTime,
}

/// Assertion IDs already used, each kept until its assertion expires.
#[derive(Debug, Default)]
pub struct ReplayCache {
    seen: Mutex<HashMap<String, SystemTime>>,
}

impl ReplayCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records `id` until `until` (plus [`CLOCK_SKEW`]); `false` if it was already recorded and
    /// has not expired. Expired entries are dropped on the way.
    pub fn remember(&self, id: &str, until: SystemTime, now: SystemTime) -> bool {
        let mut seen = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        seen.retain(|_, expiry| *expiry > now);
        if seen.contains_key(id) {
            return false;
        }
        seen.insert(id.to_string(), until + CLOCK_SKEW);
        true
    }

    /// How many assertion IDs are remembered.
    pub fn len(&self) -> usize {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    /// Whether no assertion ID is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The service provider of one `saml` connector.
#[derive(Clone)]
pub struct ServiceProvider {
    connector: String,
    entity_id: String,
    audience: String,
    acs: String,
    idp: IdpMetadata,
    sp: SamaelSp,
}

impl std::fmt::Debug for ServiceProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceProvider")
            .field("connector", &self.connector)
            .field("entity_id", &self.entity_id)
            .field("audience", &self.audience)
            .field("acs", &self.acs)
            .field("idp", &self.idp.entity_id)
            .finish()
    }
}

impl ServiceProvider {
    /// The service provider of `connector`, trusting `idp`. Its entity ID is
    /// `service_provider_issuer` (the ACS URL when absent); the audience it requires is
    /// `audience` (its entity ID when absent).
    pub fn new(connector: &SamlConnector, idp: IdpMetadata) -> Self {
        let spec = &connector.spec;
        let entity_id = spec
            .service_provider_issuer
            .clone()
            .unwrap_or_else(|| spec.acs.clone());
        let audience = spec.audience.clone().unwrap_or_else(|| entity_id.clone());
        let sp = SamaelSp {
            entity_id: Some(audience.clone()),
            metadata_url: None,
            acs_url: Some(spec.acs.clone()),
            slo_url: None,
            idp_metadata: idp.descriptor.clone(),
            authn_name_id_format: Some(NAMEID_PERSISTENT.to_string()),
            allow_idp_initiated: false,
            max_issue_delay: chrono_secs(MAX_ISSUE_DELAY + CLOCK_SKEW),
            max_clock_skew: chrono_secs(CLOCK_SKEW),
            allowed_signature_algorithms: Some(vec![
                samael::crypto::AllowedSignatureAlgorithm::RsaSha256,
                samael::crypto::AllowedSignatureAlgorithm::RsaSha384,
                samael::crypto::AllowedSignatureAlgorithm::RsaSha512,
                samael::crypto::AllowedSignatureAlgorithm::EcdsaSha256,
                samael::crypto::AllowedSignatureAlgorithm::EcdsaSha384,
                samael::crypto::AllowedSignatureAlgorithm::EcdsaSha512,
            ]),
            ..SamaelSp::default()
        };
        Self {
            connector: connector.metadata.name.clone(),
            entity_id,
            audience,
            acs: spec.acs.clone(),
            idp,
            sp,
        }
    }

    /// This service provider's entity ID (the `Issuer` of its requests).
    pub fn entity_id(&self) -> &str {
        &self.entity_id
    }

    /// The identity provider it trusts.
    pub fn idp(&self) -> &IdpMetadata {
        &self.idp
    }

    /// A new `AuthnRequest` (HTTP-Redirect binding: deflate, base64, in the SSO URL's query)
    /// asking for a persistent `NameID` and an answer by HTTP-POST to the ACS URL, with a fresh
    /// random ID.
    pub fn authn_request(&self, relay_state: &str) -> Result<AuthnRequest, SamlError> {
        // samael's own ID has 32 random bits; an ID that must not be guessed gets 122.
        self.authn_request_with_id(relay_state, &format!("_{}", uuid::Uuid::new_v4().simple()))
    }

    /// [`Self::authn_request`] with the caller's ID (an `xs:ID`: it must start with a letter or
    /// `_`), for a caller that derives it from what it already stores about the sign-in.
    pub fn authn_request_with_id(&self, relay_state: &str, id: &str) -> Result<AuthnRequest, SamlError> {
        let bad = |reason: String| SamlError::Request {
            connector: self.connector.clone(),
            reason,
        };
        if !id.starts_with(|c: char| c == '_' || c.is_ascii_alphabetic()) {
            return Err(bad(format!("the request ID {id:?} is not an xs:ID")));
        }
        let mut request = self
            .sp
            .make_authentication_request(&self.idp.sso_url)
            .map_err(|e| bad(e.to_string()))?;
        request.id = id.to_string();
        if let Some(issuer) = &mut request.issuer {
            issuer.value = Some(self.entity_id.clone());
        }
        let url = request
            .redirect(relay_state)
            .map_err(|e| bad(e.to_string()))?
            .ok_or_else(|| bad("the request has no destination".into()))?;
        Ok(AuthnRequest {
            id: request.id,
            redirect_url: url.to_string(),
        })
    }

    /// This service provider's metadata, for the IdP's administrator: entity ID, the ACS URL
    /// (HTTP-POST), signed assertions wanted.
    pub fn metadata_xml(&self) -> String {
        format!(
            r#"<?xml version="1.0" encoding="UTF-8"?>
<md:EntityDescriptor xmlns:md="urn:oasis:names:tc:SAML:2.0:metadata" entityID="{entity}"><md:SPSSODescriptor AuthnRequestsSigned="false" WantAssertionsSigned="true" protocolSupportEnumeration="urn:oasis:names:tc:SAML:2.0:protocol"><md:NameIDFormat>{NAMEID_PERSISTENT}</md:NameIDFormat><md:AssertionConsumerService Binding="urn:oasis:names:tc:SAML:2.0:bindings:HTTP-POST" Location="{acs}" index="0" isDefault="true"/></md:SPSSODescriptor></md:EntityDescriptor>
"#,
            entity = xml_escape(&self.entity_id),
            acs = xml_escape(&self.acs),
        )
    }

    /// Validates the HTTP-POST binding's `SAMLResponse` value (base64) answering the request
    /// `request_id`, and records its assertion in `replay`. See the module documentation for the
    /// rules.
    pub fn validate(
        &self,
        saml_response: &str,
        request_id: &str,
        replay: &ReplayCache,
        now: SystemTime,
    ) -> Result<SamlIdentity, SamlError> {
        let connector = || self.connector.clone();
        let encoding = |reason: String| SamlError::Encoding {
            connector: connector(),
            reason,
        };
        if saml_response.len() > MAX_RESPONSE_LEN {
            return Err(encoding(format!("larger than {MAX_RESPONSE_LEN} bytes")));
        }
        let bytes = decode_b64(saml_response).map_err(|e| encoding(format!("not base64: {e}")))?;
        let xml = String::from_utf8(bytes).map_err(|_| encoding("not UTF-8 XML".into()))?;
        reject_doctype(&xml).map_err(encoding)?;

        // What the signatures say, before verification: only to tell the refusals apart.
        let scan = scan_signatures(&xml).map_err(|e| encoding(format!("not well-formed XML: {e}")))?;
        if scan.signatures == 0 {
            return Err(SamlError::Unsigned {
                connector: connector(),
            });
        }
        // One sign-in, one assertion: a second one (signed or not, maybe hidden in an extension or
        // an Advice) is how signature wrapping smuggles an unsigned assertion next to a signed one.
        if scan.assertions != 1 {
            return Err(SamlError::Structure {
                connector: connector(),
                reason: format!("{} assertions where exactly one is expected", scan.assertions),
            });
        }

        let assertion = self
            .sp
            .parse_xml_response(&xml, Some(&[request_id]))
            .map_err(|e| self.refusal(e, &scan, request_id))?;
        let identity = self.check_assertion(&assertion, request_id, now)?;
        if !replay.remember(&identity.assertion_id, identity.not_on_or_after, now) {
            return Err(SamlError::Replayed {
                connector: connector(),
                assertion_id: identity.assertion_id,
            });
        }
        Ok(identity)
    }

    /// The checks on the verified assertion samael leaves optional or does with the wall clock.
    fn check_assertion(
        &self,
        a: &Assertion,
        request_id: &str,
        now: SystemTime,
    ) -> Result<SamlIdentity, SamlError> {
        let connector = || self.connector.clone();
        let incomplete = |reason: &str| SamlError::Incomplete {
            connector: connector(),
            reason: reason.into(),
        };
        let issuer = a.issuer.value.clone().unwrap_or_default();
        if issuer != self.idp.entity_id {
            return Err(SamlError::Issuer {
                connector: connector(),
                got: issuer,
                expected: self.idp.entity_id.clone(),
            });
        }
        let conditions = a
            .conditions
            .as_ref()
            .ok_or_else(|| incomplete("has no Conditions"))?;
        let audiences: Vec<String> = conditions
            .audience_restrictions
            .iter()
            .flatten()
            .flat_map(|r| r.audience.iter().cloned())
            .collect();
        if !audiences.contains(&self.audience) {
            return Err(SamlError::Audience {
                connector: connector(),
                got: audiences,
                expected: self.audience.clone(),
            });
        }
        let expired = |what: String| SamlError::Expired {
            connector: connector(),
            what,
            skew_secs: CLOCK_SKEW.as_secs(),
        };
        let subject = a.subject.as_ref().ok_or_else(|| incomplete("has no Subject"))?;
        let name_id = subject
            .name_id
            .as_ref()
            .map(|n| n.value.trim().to_string())
            .filter(|n| !n.is_empty())
            .ok_or_else(|| incomplete("has no NameID"))?;
        let data = subject
            .subject_confirmations
            .iter()
            .flatten()
            .filter(|c| c.method.as_deref() == Some("urn:oasis:names:tc:SAML:2.0:cm:bearer"))
            .find_map(|c| c.subject_confirmation_data.as_ref())
            .ok_or_else(|| incomplete("has no bearer SubjectConfirmationData"))?;
        let recipient = data.recipient.clone().unwrap_or_default();
        if recipient != self.acs {
            return Err(SamlError::Recipient {
                connector: connector(),
                field: "Recipient",
                got: recipient,
                expected: self.acs.clone(),
            });
        }
        let in_response_to = data.in_response_to.clone().unwrap_or_default();
        if in_response_to != request_id {
            return Err(SamlError::InResponseTo {
                connector: connector(),
                got: in_response_to,
                expected: request_id.to_string(),
            });
        }
        let data_end = data
            .not_on_or_after
            .ok_or_else(|| incomplete("has no SubjectConfirmationData NotOnOrAfter"))?;
        let mut end = to_system(data_end.timestamp());
        if let Some(cond_end) = conditions.not_on_or_after {
            end = end.min(to_system(cond_end.timestamp()));
        }
        if now >= end + CLOCK_SKEW {
            return Err(expired(format!("expired at {}", rfc3339(end))));
        }
        for start in [conditions.not_before, data.not_before].into_iter().flatten() {
            let start = to_system(start.timestamp());
            if now + CLOCK_SKEW < start {
                return Err(expired(format!("is not valid before {}", rfc3339(start))));
            }
        }
        let mut attributes: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for attr in a
            .attribute_statements
            .iter()
            .flatten()
            .flat_map(|s| &s.attributes)
        {
            let values: Vec<String> = attr.values.iter().filter_map(|v| v.value.clone()).collect();
            for key in [&attr.name, &attr.friendly_name].into_iter().flatten() {
                attributes
                    .entry(key.clone())
                    .or_default()
                    .extend(values.iter().cloned());
            }
        }
        Ok(SamlIdentity {
            name_id,
            attributes,
            assertion_id: a.id.clone(),
            not_on_or_after: end,
        })
    }

    /// samael's refusal as one of ours.
    fn refusal(&self, e: SpError, scan: &SignatureScan, request_id: &str) -> SamlError {
        let connector = self.connector.clone();
        let text = |o: &Option<String>| o.clone().unwrap_or_default();
        match e {
            SpError::FailedToValidateSignature => {
                let listed = |c: &Vec<u8>| self.idp.signing_certs.iter().any(|m| m == c);
                if !scan.embedded_certs.is_empty() && !scan.embedded_certs.iter().any(listed) {
                    SamlError::UnknownSigner { connector }
                } else {
                    SamlError::BadSignature { connector }
                }
            }
            SpError::FailedToParseSamlResponse(e) => SamlError::Structure {
                connector,
                reason: e.to_string(),
            },
            SpError::FailedToParseSamlAssertion(e) => SamlError::Structure {
                connector,
                reason: e.to_string(),
            },
            SpError::DestinationValidationError {
                response_destination,
                sp_acs_url,
            } => SamlError::Recipient {
                connector,
                field: "Destination",
                got: text(&response_destination),
                expected: text(&sp_acs_url),
            },
            SpError::AssertionRecipientMismatch {
                assertion_recipient,
                sp_acs_url,
            } => SamlError::Recipient {
                connector,
                field: "Recipient",
                got: text(&assertion_recipient),
                expected: text(&sp_acs_url),
            },
            SpError::AssertionIssuerMismatch { issuer, entity_id }
            | SpError::ResponseIssuerMismatch { issuer, entity_id } => SamlError::Issuer {
                connector,
                got: text(&issuer),
                expected: text(&entity_id),
            },
            SpError::AssertionConditionAudienceRestrictionFailed { requirement } => SamlError::Audience {
                connector,
                got: Vec::new(),
                expected: requirement,
            },
            SpError::AssertionInResponseToInvalid { .. } | SpError::ResponseInResponseToInvalid { .. } => {
                SamlError::InResponseTo {
                    connector,
                    got: "(another request)".into(),
                    expected: request_id.to_string(),
                }
            }
            SpError::AssertionExpired { time }
            | SpError::AssertionConditionExpired { time }
            | SpError::AssertionSubjectConfirmationExpired { time }
            | SpError::ResponseExpired { time } => SamlError::Expired {
                connector,
                what: format!("expired at {time}"),
                skew_secs: CLOCK_SKEW.as_secs(),
            },
            SpError::AssertionConditionExpiredBefore { time }
            | SpError::AssertionSubjectConfirmationExpiredBefore { time } => SamlError::Expired {
                connector,
                what: format!("is not valid before {time}"),
                skew_secs: CLOCK_SKEW.as_secs(),
            },
            SpError::ResponseBadStatusCode { code } => SamlError::Status { connector, code },
            other => SamlError::Incomplete {
                connector,
                reason: format!("was refused: {other}"),
            },
        }
    }
}

/// The roles `attributes_to_roles` grants to a user with `attributes` (each mapping whose
/// attribute has the mapping's value), in mapping order without duplicates. Empty: no role —
/// the sign-in must be refused.
pub fn roles_for(
    mappings: &[AttributeRolesMapping],
    attributes: &BTreeMap<String, Vec<String>>,
) -> Vec<String> {
    let mut roles: Vec<String> = Vec::new();
    for m in mappings {
        if attributes
            .get(&m.name)
            .is_some_and(|values| values.contains(&m.value))
        {
            for role in &m.roles {
                if !roles.contains(role) {
                    roles.push(role.clone());
                }
            }
        }
    }
    roles
}

/// What the `Signature` elements of a document say, read without trusting them.
#[derive(Debug, Default)]
struct SignatureScan {
    signatures: usize,
    assertions: usize,
    embedded_certs: Vec<Vec<u8>>,
}

fn scan_signatures(xml: &str) -> Result<SignatureScan, String> {
    use quick_xml::events::Event;
    use quick_xml::name::ResolveResult;
    let mut reader = quick_xml::NsReader::from_str(xml);
    let mut scan = SignatureScan::default();
    let mut in_cert = false;
    let mut cert = String::new();
    loop {
        match reader.read_resolved_event().map_err(|e| e.to_string())? {
            (ResolveResult::Bound(ns), Event::Start(e)) if ns.as_ref() == DSIG_NS => {
                match e.local_name().as_ref() {
                    b"Signature" => scan.signatures += 1,
                    b"X509Certificate" => {
                        in_cert = true;
                        cert.clear();
                    }
                    _ => {}
                }
            }
            (ResolveResult::Bound(ns), Event::Start(e) | Event::Empty(e))
                if ns.as_ref() == ASSERTION_NS
                    && matches!(e.local_name().as_ref(), b"Assertion" | b"EncryptedAssertion") =>
            {
                scan.assertions += 1;
            }
            (_, Event::Text(t)) if in_cert => {
                cert.push_str(&String::from_utf8_lossy(t.as_ref()));
            }
            (ResolveResult::Bound(ns), Event::End(e))
                if ns.as_ref() == DSIG_NS && e.local_name().as_ref() == b"X509Certificate" =>
            {
                in_cert = false;
                if let Ok(der) = decode_b64(&cert) {
                    scan.embedded_certs.push(der);
                }
            }
            (_, Event::Eof) => break,
            _ => {}
        }
    }
    Ok(scan)
}

fn reject_doctype(xml: &str) -> Result<(), String> {
    if xml.contains("<!DOCTYPE") || xml.contains("<!ENTITY") {
        return Err("carries a DOCTYPE or an entity declaration, which SAML never uses".into());
    }
    Ok(())
}

fn decode_b64(text: &str) -> Result<Vec<u8>, base64::DecodeError> {
    let compact: String = text.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    STANDARD.decode(compact)
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn to_system(unix_secs: i64) -> SystemTime {
    if unix_secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(unix_secs.unsigned_abs())
    } else {
        UNIX_EPOCH - Duration::from_secs(unix_secs.unsigned_abs())
    }
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

fn chrono_secs(d: Duration) -> chrono::Duration {
    chrono::Duration::seconds(i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}
