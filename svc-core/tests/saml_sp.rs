//! The SAML service provider (`svc_core::auth::saml`) against a real identity provider: pysaml2
//! (signing with `xmlsec1`), driven by `support/saml_idp.py` through the Python of
//! `SVC_TEST_PYTHON` (`.ci/python-requirements.d/saml.txt`). The IdP parses our AuthnRequest and
//! our SP metadata as it would in production and signs its responses itself; the tests then
//! check what the service provider accepts and, for each forgery or mistake, that it is refused
//! with the reason named.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::SystemTime;

use anyhow::{Context, Result, bail, ensure};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use svc_core::auth::saml::{IdpMetadata, ReplayCache, SamlError, ServiceProvider, roles_for};
use svc_core::resource::{Resource, SamlConnector, parse_resource};

const IDP_ENTITY: &str = "https://idp.example.test/metadata";
const IDP_SSO: &str = "https://idp.example.test/sso/redirect";
const ACS: &str = "https://proxy.example.test:3080/v1/webapi/saml/acs/corp";

fn python() -> Result<PathBuf> {
    let python = std::env::var_os("SVC_TEST_PYTHON").context(
        "SVC_TEST_PYTHON is not set: .ci/run installs .ci/python-requirements.d/*.txt (pysaml2) into a venv and exports its python",
    )?;
    Ok(PathBuf::from(python))
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/saml_idp.py")
}

/// Runs `saml_idp.py <command>` with `input` as JSON on stdin; its JSON answer.
fn idp_call(args: &[&str], input: &Value) -> Result<Value> {
    let mut child = Command::new(python()?)
        .arg(script())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting the pysaml2 IdP script")?;
    child
        .stdin
        .take()
        .context("IdP stdin")?
        .write_all(input.to_string().as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "saml_idp.py {args:?} failed ({}): {} (is pysaml2 installed in SVC_TEST_PYTHON's venv, and xmlsec1?)",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    serde_json::from_slice(&out.stdout).context("the IdP script's answer is not JSON")
}

/// An identity provider with its own key pair in a temporary directory.
struct Idp {
    _dir: tempfile::TempDir,
    config: Value,
}

impl Idp {
    fn new() -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let keys = idp_call(&["keygen", &dir.path().to_string_lossy()], &json!({}))?;
        let config = json!({
            "entity_id": IDP_ENTITY,
            "sso_url": IDP_SSO,
            "key_file": keys["key_file"],
            "cert_file": keys["cert_file"],
        });
        Ok(Self { _dir: dir, config })
    }

    fn metadata(&self) -> Result<String> {
        let answer = idp_call(&["metadata"], &json!({ "idp": self.config }))?;
        Ok(answer["xml"].as_str().context("metadata xml")?.to_string())
    }

    /// The IdP's answer to the request behind `redirect_url`: base64 `SAMLResponse`.
    fn respond(&self, sp: &ServiceProvider, redirect_url: &str, extra: Value) -> Result<String> {
        let mut input = json!({
            "idp": self.config,
            "sp_metadata": sp.metadata_xml(),
            "saml_request": query_param(redirect_url, "SAMLRequest")?,
            "user": "alice",
            "attributes": { "groups": ["ops", "dev"], "email": ["alice@example.test"] },
        });
        if let (Some(input), Some(extra)) = (input.as_object_mut(), extra.as_object()) {
            input.extend(extra.clone());
        }
        let answer = idp_call(&["respond"], &input)?;
        ensure!(
            answer["acs"] == ACS,
            "the IdP took the ACS URL {} from our SP metadata",
            answer["acs"]
        );
        Ok(answer["saml_response"]
            .as_str()
            .context("saml_response")?
            .to_string())
    }
}

fn query_param(url: &str, name: &str) -> Result<String> {
    let query = url.split_once('?').context("no query in the redirect URL")?.1;
    for pair in query.split('&') {
        if let Some((k, v)) = pair.split_once('=')
            && k == name
        {
            return percent_decode(v);
        }
    }
    bail!("{name} is not in {url}")
}

fn percent_decode(s: &str) -> Result<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                out.push(u8::from_str_radix(
                    std::str::from_utf8(&bytes[i + 1..i + 3])?,
                    16,
                )?);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    Ok(String::from_utf8(out)?)
}

fn connector(metadata_xml: &str) -> Result<SamlConnector> {
    let text = json!({
        "kind": "saml",
        "version": "v2",
        "metadata": { "name": "corp" },
        "spec": {
            "acs": ACS,
            "entity_descriptor": metadata_xml,
            "attributes_to_roles": [
                { "name": "groups", "value": "ops", "roles": ["access", "editor"] },
                { "name": "groups", "value": "admins", "roles": ["maintenance-admin"] },
            ],
        },
    })
    .to_string();
    match parse_resource(&text)? {
        Resource::Saml(c) => Ok(c),
        other => bail!("parsed as {:?}", other.kind()),
    }
}

struct Setup {
    idp: Idp,
    connector: SamlConnector,
    sp: ServiceProvider,
}

fn setup() -> Result<Setup> {
    let idp = Idp::new()?;
    let connector = connector(&idp.metadata()?)?;
    let metadata = IdpMetadata::from_connector(&connector)?.context("inline metadata")?;
    let sp = ServiceProvider::new(&connector, metadata);
    Ok(Setup { idp, connector, sp })
}

fn decode(b64: &str) -> Result<String> {
    Ok(String::from_utf8(STANDARD.decode(b64)?)?)
}

fn encode(xml: &str) -> String {
    STANDARD.encode(xml)
}

/// Signs in once with `extra` IdP options; the validation result.
fn sign_in(s: &Setup, extra: Value) -> Result<Result<svc_core::auth::saml::SamlIdentity, SamlError>> {
    let request = s.sp.authn_request("relay-1")?;
    let response = s.idp.respond(&s.sp, &request.redirect_url, extra)?;
    Ok(s.sp.validate(&response, &request.id, &ReplayCache::new(), SystemTime::now()))
}

#[test]
fn metadata_request_and_signed_assertion_map_to_roles() -> Result<()> {
    let s = setup()?;
    let idp = s.sp.idp();
    ensure!(
        idp.entity_id == IDP_ENTITY && idp.sso_url == IDP_SSO,
        "metadata read as {idp:?}"
    );
    ensure!(
        idp.signing_certs.len() == 1,
        "one signing certificate in the IdP metadata"
    );

    let request = s.sp.authn_request("relay-1")?;
    ensure!(
        request.redirect_url.starts_with(IDP_SSO),
        "redirect to the IdP: {}",
        request.redirect_url
    );
    ensure!(
        query_param(&request.redirect_url, "RelayState")? == "relay-1",
        "RelayState kept"
    );
    ensure!(request.id.len() > 30, "unguessable request ID: {}", request.id);

    for sign in ["assertion", "response", "both"] {
        let request = s.sp.authn_request("r")?;
        let response = s
            .idp
            .respond(&s.sp, &request.redirect_url, json!({ "sign": sign }))?;
        let replay = ReplayCache::new();
        let identity =
            s.sp.validate(&response, &request.id, &replay, SystemTime::now())
                .with_context(|| format!("a response signed on the {sign} is accepted"))?;
        ensure!(identity.name_id == "alice", "NameID: {}", identity.name_id);
        ensure!(
            identity.attributes.get("groups") == Some(&vec!["ops".to_string(), "dev".to_string()]),
            "attributes: {:?}",
            identity.attributes
        );
        let roles = roles_for(&s.connector.spec.attributes_to_roles, &identity.attributes);
        ensure!(
            roles == ["access", "editor"],
            "roles from attributes_to_roles: {roles:?}"
        );
        ensure!(replay.len() == 1, "the assertion ID is remembered");
    }

    let mut nobody = BTreeMap::new();
    nobody.insert("groups".to_string(), vec!["guests".to_string()]);
    ensure!(
        roles_for(&s.connector.spec.attributes_to_roles, &nobody).is_empty(),
        "unmapped user gets no role"
    );
    Ok(())
}

#[test]
fn replayed_assertion_is_refused() -> Result<()> {
    let s = setup()?;
    let request = s.sp.authn_request("r")?;
    let response = s.idp.respond(&s.sp, &request.redirect_url, json!({}))?;
    let replay = ReplayCache::new();
    s.sp.validate(&response, &request.id, &replay, SystemTime::now())?;
    let again = s.sp.validate(&response, &request.id, &replay, SystemTime::now());
    match again {
        Err(e @ SamlError::Replayed { .. }) => {
            ensure!(e.to_string().contains("replay"), "message: {e}");
            Ok(())
        }
        other => bail!("a replayed assertion must be refused as a replay, got {other:?}"),
    }
}

#[test]
fn tampered_and_unsigned_responses_are_refused() -> Result<()> {
    let s = setup()?;
    // Tampered: the signed assertion's group changed after signing.
    let request = s.sp.authn_request("r")?;
    let response = decode(&s.idp.respond(&s.sp, &request.redirect_url, json!({}))?)?;
    ensure!(
        response.contains(">ops<"),
        "the response carries the group: {response}"
    );
    let tampered = encode(&response.replacen(">ops<", ">admins<", 1));
    match s
        .sp
        .validate(&tampered, &request.id, &ReplayCache::new(), SystemTime::now())
    {
        Err(e @ SamlError::BadSignature { .. }) => ensure!(e.to_string().contains("does not verify"), "{e}"),
        other => bail!("a tampered assertion must fail its signature, got {other:?}"),
    }

    // Unsigned: neither the assertion nor the response.
    match sign_in(&s, json!({ "sign": "none" }))? {
        Err(e @ SamlError::Unsigned { .. }) => ensure!(e.to_string().contains("no XML signature"), "{e}"),
        other => bail!("an unsigned response must be refused, got {other:?}"),
    }
    Ok(())
}

#[test]
fn signature_by_another_key_is_refused() -> Result<()> {
    let s = setup()?;
    // The same entity ID and endpoints, another key: the metadata the connector trusts is the first one.
    let impostor = Idp::new()?;
    let request = s.sp.authn_request("r")?;
    let response = impostor.respond(&s.sp, &request.redirect_url, json!({}))?;
    match s
        .sp
        .validate(&response, &request.id, &ReplayCache::new(), SystemTime::now())
    {
        Err(e @ SamlError::UnknownSigner { .. }) => {
            ensure!(e.to_string().contains("metadata does not list"), "{e}")
        }
        other => bail!("a signature by another key must be refused, got {other:?}"),
    }
    Ok(())
}

#[test]
fn expired_wrong_audience_recipient_issuer_are_refused() -> Result<()> {
    let s = setup()?;
    match sign_in(&s, json!({ "lifetime_minutes": -10 }))? {
        Err(e @ SamlError::Expired { .. }) => ensure!(e.to_string().contains("expired at"), "{e}"),
        other => bail!("an expired assertion must be refused, got {other:?}"),
    }
    match sign_in(&s, json!({ "audience": "https://other-sp.example.test" }))? {
        Err(e @ SamlError::Audience { .. }) => ensure!(e.to_string().contains("audience"), "{e}"),
        other => bail!("a wrong audience must be refused, got {other:?}"),
    }
    match sign_in(&s, json!({ "destination": "https://evil.example.test/acs" }))? {
        Err(e @ SamlError::Recipient { .. }) => ensure!(e.to_string().contains("ACS URL"), "{e}"),
        other => bail!("a wrong recipient must be refused, got {other:?}"),
    }
    match sign_in(&s, json!({ "issuer": "https://other-idp.example.test" }))? {
        Err(e @ SamlError::Issuer { .. }) => {
            ensure!(e.to_string().contains("is not the identity provider"), "{e}")
        }
        other => bail!("a wrong issuer must be refused, got {other:?}"),
    }
    // A response answering another request.
    let request = s.sp.authn_request("r")?;
    let response = s.idp.respond(&s.sp, &request.redirect_url, json!({}))?;
    match s.sp.validate(
        &response,
        "_another-request",
        &ReplayCache::new(),
        SystemTime::now(),
    ) {
        Err(e @ SamlError::InResponseTo { .. }) => ensure!(e.to_string().contains("InResponseTo"), "{e}"),
        other => bail!("a response to another request must be refused, got {other:?}"),
    }
    Ok(())
}

#[test]
fn signature_wrapping_is_refused() -> Result<()> {
    let s = setup()?;
    let request = s.sp.authn_request("r")?;
    let response = decode(&s.idp.respond(&s.sp, &request.redirect_url, json!({}))?)?;
    let (start, end) = assertion_span(&response)?;
    let signed = &response[start..end];
    // The forged assertion: the signed one with the signature removed, another ID and group.
    // The prefix pysaml2 bound the XML-DSig namespace to (`xmlns:ns2="…xmldsig#"`).
    let decl = response
        .find("=\"http://www.w3.org/2000/09/xmldsig#\"")
        .context("xmldsig namespace")?;
    let ds = &response[response[..decl].rfind(':').context("xmlns prefix")? + 1..decl];
    let sig_start = signed
        .find(&format!("<{ds}:Signature"))
        .context("signature in the assertion")?;
    let close = format!("</{ds}:Signature>");
    let sig_end = signed.find(&close).context("end of signature")? + close.len();
    let id = between(signed, "ID=\"", "\"")?;
    let evil = format!("{}{}", &signed[..sig_start], &signed[sig_end..])
        .replacen(&format!("ID=\"{id}\""), "ID=\"_evil\"", 1)
        .replacen(">ops<", ">admins<", 1);

    // XSW: the forged assertion where the SP reads, the signed one hidden in an Extensions element.
    let wrapped_ext = format!(
        "{}<ns0:Extensions>{signed}</ns0:Extensions>{evil}{}",
        &response[..start],
        &response[end..]
    );
    // XSW: the forged assertion next to (before) the signed one.
    let wrapped_sibling = format!("{}{evil}{signed}{}", &response[..start], &response[end..]);
    // XSW: the signed assertion inside the forged one's Advice.
    let advice_at = evil
        .find("<ns1:Conditions")
        .or_else(|| evil.find("<saml:Conditions"))
        .context("conditions")?;
    let wrapped_advice = format!(
        "{}{}<ns1:Advice>{signed}</ns1:Advice>{}{}",
        &response[..start],
        &evil[..advice_at],
        &evil[advice_at..],
        &response[end..]
    );
    for (what, xml) in [
        ("extensions", wrapped_ext),
        ("sibling", wrapped_sibling),
        ("advice", wrapped_advice),
    ] {
        match s
            .sp
            .validate(&encode(&xml), &request.id, &ReplayCache::new(), SystemTime::now())
        {
            Err(e @ (SamlError::Structure { .. } | SamlError::BadSignature { .. })) => {
                ensure!(
                    e.to_string().contains("wrap") || e.to_string().contains("moved"),
                    "{what}: {e}"
                )
            }
            other => bail!("signature wrapping ({what}) must be refused, got {other:?}\n{xml}"),
        }
    }
    Ok(())
}

/// The byte range of the (first) `Assertion` element.
fn assertion_span(xml: &str) -> Result<(usize, usize)> {
    let start = xml
        .find("<ns1:Assertion")
        .or_else(|| xml.find("<saml:Assertion"))
        .context("no Assertion element")?;
    let prefix = &xml[start + 1..start + xml[start..].find(':').context("prefix")?];
    let close = format!("</{prefix}:Assertion>");
    let end = xml.find(&close).context("no end of Assertion")? + close.len();
    Ok((start, end))
}

fn between<'a>(s: &'a str, from: &str, to: &str) -> Result<&'a str> {
    let i = s.find(from).context("start marker")? + from.len();
    let j = s[i..].find(to).context("end marker")? + i;
    Ok(&s[i..j])
}
