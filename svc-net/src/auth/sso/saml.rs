//! SAML connectors in the sign-in flow: the service provider is `svc_core::auth::saml`; here it
//! meets the network (the IdP metadata at `entity_descriptor_url`) and the stored sign-in request.
//!
//! The `AuthnRequest`'s ID is derived from the request's secret nonce (`_` + hex SHA-256), so the
//! stored request is all that `InResponseTo` is checked against; `RelayState` carries the
//! request's state back to the ACS, which takes the request exactly once. Assertion IDs are also
//! remembered until they expire ([`ReplayCache`]), so a captured response cannot be presented again.

use std::collections::HashMap;
use std::time::SystemTime;

use svc_core::auth::saml::{
    IdpMetadata, MAX_METADATA_LEN, MetadataSource, ServiceProvider, metadata_source, roles_for,
};
use svc_core::auth::sso::{SsoIdentity, SsoRequest};
use svc_core::resource::SamlConnector;

use super::{Refused, SsoEngine};

pub(super) use svc_core::auth::saml::ReplayCache;

/// The `AuthnRequest` ID of the sign-in `req`: `_` + hex SHA-256 of its secret nonce.
fn request_id(req: &SsoRequest) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, req.nonce.expose().as_bytes());
    format!("_{}", hex::encode(digest.as_ref()))
}

/// The connector's service provider, with the IdP metadata it names (fetched when it is a URL).
pub(super) async fn service_provider(
    engine: &SsoEngine,
    c: &SamlConnector,
) -> Result<ServiceProvider, Refused> {
    let idp = match IdpMetadata::from_connector(c)? {
        Some(idp) => idp,
        None => {
            let MetadataSource::Url(url) = metadata_source(c) else {
                return Err(Refused(
                    "the connector names no identity provider metadata".into(),
                ));
            };
            let resp =
                engine.http()?.get(url).await.map_err(|e| {
                    Refused(format!("fetching the identity provider's metadata at {url}: {e}"))
                })?;
            if !resp.status().is_success() {
                return Err(Refused(format!(
                    "fetching the identity provider's metadata: {url} answered {}",
                    resp.status()
                )));
            }
            if resp.body().len() > MAX_METADATA_LEN {
                return Err(Refused(format!(
                    "the identity provider's metadata at {url} is too large"
                )));
            }
            let xml = std::str::from_utf8(resp.body())
                .map_err(|_| Refused(format!("the identity provider's metadata at {url} is not UTF-8")))?;
            IdpMetadata::parse(&c.metadata.name, xml)?
        }
    };
    Ok(ServiceProvider::new(c, idp))
}

/// Where the browser goes: the IdP's SSO URL with the `AuthnRequest` and the state as `RelayState`.
pub(super) async fn auth_url(
    engine: &SsoEngine,
    c: &SamlConnector,
    req: &SsoRequest,
) -> Result<String, Refused> {
    let sp = service_provider(engine, c).await?;
    Ok(sp
        .authn_request_with_id(&req.state, &request_id(req))?
        .redirect_url)
}

/// Validates the `SAMLResponse` the IdP posted to the ACS and maps its attributes to roles.
pub(super) async fn finish(
    engine: &SsoEngine,
    c: &SamlConnector,
    req: &SsoRequest,
    params: &HashMap<String, String>,
) -> Result<SsoIdentity, Refused> {
    let response = params
        .get("SAMLResponse")
        .filter(|r| !r.is_empty())
        .ok_or_else(|| Refused("the ACS got no SAMLResponse".into()))?;
    let sp = service_provider(engine, c).await?;
    let who = sp.validate(response, &request_id(req), &engine.saml_replay, SystemTime::now())?;
    let roles = roles_for(&c.spec.attributes_to_roles, &who.attributes);
    Ok(SsoIdentity {
        username: who.name_id,
        roles,
    })
}
