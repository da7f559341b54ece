//! Served resources on the wire: the heartbeat's resource list, `ResolveResource` (the proxy
//! asks where a user's connection to an app, database, Kubernetes cluster or desktop goes) and
//! `ListServed` (`tsh apps ls`). Conversions between the domain types
//! ([`svc_core::auth::ServedResource`], [`ResourceRoute`]) and the proto, the server handlers'
//! bodies and the client calls.

use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use svc_core::auth::{AuthService, Caller, ResourceRoute, ServedKind, ServedResource};
use tonic::Status;

use super::client::{AuthClient, ClientError};
use super::proto;

/// The domain resource as a proto message.
pub(super) fn to_proto(r: &ServedResource) -> proto::ServedResource {
    proto::ServedResource {
        kind: r.kind.map(|k| k.as_str().to_owned()).unwrap_or_default(),
        name: r.name.clone(),
        labels: r.labels.clone().into_iter().collect(),
        target: r.target.clone(),
        protocol: r.protocol.clone(),
        public_addr: r.public_addr.clone(),
        direct_addr: r.direct_addr.clone(),
    }
}

/// The heartbeat's list as proto messages.
pub(super) fn list_to_proto(resources: &[ServedResource]) -> Vec<proto::ServedResource> {
    resources.iter().map(to_proto).collect()
}

/// A proto message as the domain resource; an unknown kind is refused.
pub(super) fn from_proto(r: proto::ServedResource) -> Result<ServedResource, svc_core::auth::AuthError> {
    Ok(ServedResource {
        kind: Some(r.kind.parse::<ServedKind>()?),
        name: r.name,
        labels: r.labels.into_iter().collect(),
        target: r.target,
        protocol: r.protocol,
        public_addr: r.public_addr,
        direct_addr: r.direct_addr,
    })
}

fn route_to_proto(r: &ResourceRoute) -> proto::ResourceRoute {
    proto::ResourceRoute {
        server_id: r.server_id.clone(),
        hostname: r.hostname.clone(),
        resource: Some(to_proto(&r.resource)),
    }
}

fn route_from_proto(r: proto::ResourceRoute) -> Result<ResourceRoute, ClientError> {
    let resource = r
        .resource
        .ok_or_else(|| ClientError::Invalid("a route without its resource".into()))?;
    Ok(ResourceRoute {
        server_id: r.server_id,
        hostname: r.hostname,
        resource: from_proto(resource).map_err(|e| ClientError::Invalid(e.to_string()))?,
    })
}

fn user_chain(der: Vec<u8>) -> Option<Vec<CertificateDer<'static>>> {
    (!der.is_empty()).then(|| vec![CertificateDer::from(der)])
}

/// The body of the `ResolveResource` handler.
pub(super) async fn resolve(
    auth: &Arc<AuthService>,
    caller: &Caller,
    r: proto::ResolveResourceRequest,
    status: fn(svc_core::auth::AuthError) -> Status,
) -> Result<proto::ResolveResourceResponse, Status> {
    let kind: ServedKind = r.kind.parse().map_err(status)?;
    let chain = user_chain(r.user_cert);
    let answer = if kind == ServedKind::Db && !r.db_user.is_empty() {
        let db_name = (!r.db_name.is_empty()).then_some(r.db_name.as_str());
        auth.resolve_db(caller, chain.as_deref(), &r.name, &r.db_user, db_name)
            .await
            .map_err(status)?
    } else {
        auth.resolve_resource(caller, chain.as_deref(), kind, &r.name)
            .await
            .map_err(status)?
    };
    Ok(match answer {
        Ok(route) => proto::ResolveResourceResponse {
            route: Some(route_to_proto(&route)),
            denied: String::new(),
        },
        Err(e) => proto::ResolveResourceResponse {
            route: None,
            denied: e.to_string(),
        },
    })
}

/// The body of the `AuthorizeNode` handler.
pub(super) async fn authorize_node(
    auth: &Arc<AuthService>,
    caller: &Caller,
    r: proto::AuthorizeNodeRequest,
    status: fn(svc_core::auth::AuthError) -> Status,
) -> Result<proto::ResolveResourceResponse, Status> {
    let cert = ssh_key::Certificate::from_openssh(r.user_ssh_cert.trim()).map_err(|e| {
        Status::invalid_argument(format!(
            "user_ssh_cert: expected an OpenSSH certificate, found one that does not parse: {e}"
        ))
    })?;
    let answer = auth
        .authorize_node(caller, &cert, &r.node, &r.login)
        .await
        .map_err(status)?;
    Ok(match answer {
        Ok(route) => proto::ResolveResourceResponse {
            route: Some(route_to_proto(&route)),
            denied: String::new(),
        },
        Err(e) => proto::ResolveResourceResponse {
            route: None,
            denied: e.to_string(),
        },
    })
}

/// The body of the `ListServed` handler.
pub(super) async fn list(
    auth: &Arc<AuthService>,
    caller: &Caller,
    r: proto::ListServedRequest,
    status: fn(svc_core::auth::AuthError) -> Status,
) -> Result<proto::ServedList, Status> {
    let kind: ServedKind = r.kind.parse().map_err(status)?;
    let chain = user_chain(r.user_cert);
    let routes = auth
        .list_served(caller, chain.as_deref(), kind)
        .await
        .map_err(status)?;
    Ok(proto::ServedList {
        routes: routes.iter().map(route_to_proto).collect(),
    })
}

/// The answer to a resource request: where to dial, or why not.
pub type Resolved = Result<ResourceRoute, String>;

impl AuthClient {
    /// Where a connection to `kind`/`name` goes, for the user `user_cert` (DER; a proxy passes
    /// the certificate its client presented) or, with `None`, for the caller itself. The inner
    /// `Err` is the Auth Service's denial, naming the resource and its kind.
    pub async fn resolve_resource(
        &mut self,
        kind: ServedKind,
        name: &str,
        user_cert: Option<&[u8]>,
    ) -> Result<Resolved, ClientError> {
        let r = self
            .raw()
            .resolve_resource(proto::ResolveResourceRequest {
                kind: kind.as_str().to_owned(),
                name: name.to_owned(),
                user_cert: user_cert.map(<[u8]>::to_vec).unwrap_or_default(),
                db_user: String::new(),
                db_name: String::new(),
            })
            .await?
            .into_inner();
        match r.route {
            Some(route) => Ok(Ok(route_from_proto(route)?)),
            None if !r.denied.is_empty() => Ok(Err(r.denied)),
            None => Err(ClientError::Invalid("neither a route nor a denial".into())),
        }
    }

    /// Where a database connection as `db_user` (and `db_name`) goes, for the user `user_cert`
    /// (DER, as a proxy holds it) or the caller itself: the labels and the roles'
    /// `db_users`/`db_names`. The inner `Err` is the Auth Service's denial, naming the database
    /// and the refused user or name.
    pub async fn resolve_db(
        &mut self,
        name: &str,
        db_user: &str,
        db_name: Option<&str>,
        user_cert: Option<&[u8]>,
    ) -> Result<Resolved, ClientError> {
        let r = self
            .raw()
            .resolve_resource(proto::ResolveResourceRequest {
                kind: ServedKind::Db.as_str().to_owned(),
                name: name.to_owned(),
                user_cert: user_cert.map(<[u8]>::to_vec).unwrap_or_default(),
                db_user: db_user.to_owned(),
                db_name: db_name.unwrap_or_default().to_owned(),
            })
            .await?
            .into_inner();
        match r.route {
            Some(route) => Ok(Ok(route_from_proto(route)?)),
            None if !r.denied.is_empty() => Ok(Err(r.denied)),
            None => Err(ClientError::Invalid("neither a route nor a denial".into())),
        }
    }

    /// A database client certificate for the caller (`tsh db login`) for the public key
    /// `tls_public_key` (DER SubjectPublicKeyInfo): the certificates (no SSH half) and the
    /// database's protocol, or the Auth Service's denial.
    pub async fn issue_db_cert(
        &mut self,
        name: &str,
        db_user: &str,
        db_name: Option<&str>,
        tls_public_key: Vec<u8>,
    ) -> Result<Result<(proto::Certs, String), String>, ClientError> {
        let r = self
            .raw()
            .issue_db_cert(proto::DbCertRequest {
                name: name.to_owned(),
                db_user: db_user.to_owned(),
                db_name: db_name.unwrap_or_default().to_owned(),
                tls_public_key,
                ttl_seconds: 0,
            })
            .await?
            .into_inner();
        match r.certs {
            Some(certs) => Ok(Ok((certs, r.protocol))),
            None if !r.denied.is_empty() => Ok(Err(r.denied)),
            None => Err(ClientError::Invalid("neither certificates nor a denial".into())),
        }
    }

    /// Whether the user holding `user_ssh_cert` may open an SSH session on `node` as `login`:
    /// the route to the one live agent holding that node name (a proxy dials its host ID), or
    /// the Auth Service's denial naming the node and the reason. A node asks about itself with
    /// its host ID.
    pub async fn authorize_node(
        &mut self,
        user_ssh_cert: &ssh_key::Certificate,
        node: &str,
        login: &str,
    ) -> Result<Resolved, ClientError> {
        let cert = user_ssh_cert
            .to_openssh()
            .map_err(|e| ClientError::Invalid(format!("encoding the user certificate: {e}")))?;
        let r = self
            .raw()
            .authorize_node(proto::AuthorizeNodeRequest {
                user_ssh_cert: cert,
                node: node.to_owned(),
                login: login.to_owned(),
            })
            .await?
            .into_inner();
        match r.route {
            Some(route) => Ok(Ok(route_from_proto(route)?)),
            None if !r.denied.is_empty() => Ok(Err(r.denied)),
            None => Err(ClientError::Invalid("neither a route nor a denial".into())),
        }
    }

    /// The resources of `kind` the user may reach (see [`resolve_resource`](Self::resolve_resource)
    /// for `user_cert`).
    pub async fn list_served(
        &mut self,
        kind: ServedKind,
        user_cert: Option<&[u8]>,
    ) -> Result<Vec<ResourceRoute>, ClientError> {
        self.raw()
            .list_served(proto::ListServedRequest {
                kind: kind.as_str().to_owned(),
                user_cert: user_cert.map(<[u8]>::to_vec).unwrap_or_default(),
            })
            .await?
            .into_inner()
            .routes
            .into_iter()
            .map(route_from_proto)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_round_trip_through_the_proto() {
        let mut r = ServedResource::new(ServedKind::WindowsDesktop, "win-1");
        r.labels.insert("env".into(), "dev".into());
        r.target = "10.0.0.5:3389".into();
        r.protocol = "rdp".into();
        r.direct_addr = "agent:3028".into();
        assert_eq!(from_proto(to_proto(&r)).unwrap(), r);
        let mut bad = to_proto(&r);
        bad.kind = "printer".into();
        assert!(from_proto(bad).unwrap_err().to_string().contains("printer"));
    }
}
