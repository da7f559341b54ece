//! `tsh proxy app|db|desktop`: the profile's identity and proxy for [`LocalProxy`], which
//! carries each local connection to the resource.

use std::net::SocketAddr;

use svc_core::auth::ServedKind;
use svc_core::config::DbProtocol;
use tokio_util::sync::CancellationToken;

use super::{Error, LocalProxy, LocalProxyError, Profile, ResourceClient, bind_local};

/// The client for the profile's proxy and identity.
pub fn resource_client(profile: &Profile) -> Result<ResourceClient, Error> {
    Ok(ResourceClient {
        proxy: profile.proxy_addr()?,
        identity: profile.identity.clone(),
        // `tsh login --cacert` is trust enough: check the proxy even if `--insecure` was given.
        insecure: profile.insecure && profile.ca_pem.is_none(),
        extra_ca_pem: profile.ca_pem.as_ref().map(|p| p.as_bytes().to_vec()),
        dialer: crate::dial::ProxyDialer::from_env()?,
        tls_configs: Default::default(),
        multiplexer: Default::default(),
    })
}

/// The database's protocol, asked of the Auth Service (which also says now, rather than at the
/// first connection, when the user may not reach it: [`Error::Denied`]).
pub async fn db_protocol(profile: &Profile, name: &str) -> Result<DbProtocol, Error> {
    let mut auth = crate::auth::AuthClient::connect_with(&profile.identity).await?;
    let route = auth
        .resolve_resource(ServedKind::Db, name, None)
        .await?
        .map_err(Error::Denied)?;
    Ok(match route.resource.protocol.as_str() {
        "mysql" => DbProtocol::Mysql,
        "mongodb" => DbProtocol::Mongodb,
        "redis" => DbProtocol::Redis,
        _ => DbProtocol::Postgres,
    })
}

/// The database user and name a local proxy connects as (`tsh proxy db --db-user/--db-name`).
#[derive(Debug, Clone, Default)]
pub struct DbUser {
    /// The database user (Postgres: else the client's own).
    pub user: Option<String>,
    /// The database name (Postgres: else the client's own).
    pub name: Option<String>,
}

/// What a local proxy serves: the resource, the local port, the database user and name.
#[derive(Debug, Clone)]
pub struct LocalTarget {
    /// The resource kind.
    pub kind: ServedKind,
    /// The resource name.
    pub name: String,
    /// The local port (0: any free port).
    pub port: u16,
    /// The database user and name to connect as (databases only).
    pub db: DbUser,
    /// Carry client connections as streams of one multiplexed connection to the proxy
    /// ([`Multiplexer`](super::Multiplexer)); `false`: each on a TLS connection of its own.
    pub multiplex: bool,
}

/// Serves a local proxy for `target` on `127.0.0.1:<port>` until `shutdown`. Databases'
/// protocol is asked of the Auth Service first ([`db_protocol`]). `on_listening` is called
/// once with the bound address (`tsh` prints it); `on_error` with each connection that failed.
pub async fn serve_local_proxy(
    profile: &Profile,
    target: LocalTarget,
    shutdown: CancellationToken,
    on_listening: impl FnOnce(SocketAddr) -> Result<(), Error>,
    on_error: impl Fn(SocketAddr, LocalProxyError) + Send + Sync + 'static,
) -> Result<(), Error> {
    let LocalTarget {
        kind,
        name,
        port,
        db,
        multiplex,
    } = target;
    let protocol = match kind {
        ServedKind::Db => Some(db_protocol(profile, &name).await?),
        _ => None,
    };
    let what = LocalProxy {
        kind,
        name,
        protocol,
        db_user: db.user,
        db_name: db.name,
    };
    let mut client = resource_client(profile)?;
    if !multiplex {
        client.multiplexer = super::Multiplexer::disabled();
    }
    let (listener, local) = bind_local(port)
        .await
        .map_err(|source| Error::Listen { port, source })?;
    on_listening(local)?;
    what.serve(listener, client, shutdown, on_error).await;
    Ok(())
}
