//! `tsh proxy app|db|desktop`: the profile's identity and proxy for
//! [`svc_net::services::client::LocalProxy`], which carries each local connection to the
//! resource.

use anyhow::Context;
use svc_core::Addr;
use svc_core::auth::ServedKind;
use svc_core::config::DbProtocol;
pub use svc_net::services::client::LocalProxy;
use svc_net::services::client::{ResourceClient, bind_local};
use tokio_util::sync::CancellationToken;

use crate::profile::Profile;

/// The client for the profile's proxy and identity.
pub fn resource_client(profile: &Profile) -> anyhow::Result<ResourceClient> {
    Ok(ResourceClient {
        proxy: Addr::parse(&profile.proxy)
            .with_context(|| format!("the profile's proxy {}", profile.proxy))?,
        identity: profile.identity.clone(),
        // `tsh login --cacert` is trust enough: check the proxy even if `--insecure` was given.
        insecure: profile.insecure && profile.ca_pem.is_none(),
        extra_ca_pem: profile.ca_pem.as_ref().map(|p| p.as_bytes().to_vec()),
        dialer: svc_net::dial::ProxyDialer::from_env()?,
    })
}

/// The database's protocol, asked of the Auth Service (which also says now, rather than at the
/// first connection, when the user may not reach it).
pub async fn db_protocol(profile: &Profile, name: &str) -> anyhow::Result<DbProtocol> {
    let mut auth = svc_net::auth::AuthClient::connect_with(&profile.identity).await?;
    let route = auth
        .resolve_resource(ServedKind::Db, name, None)
        .await?
        .map_err(anyhow::Error::msg)?;
    Ok(match route.resource.protocol.as_str() {
        "mysql" => DbProtocol::Mysql,
        "mongodb" => DbProtocol::Mongodb,
        "redis" => DbProtocol::Redis,
        _ => DbProtocol::Postgres,
    })
}

/// Listens on `127.0.0.1:port` (0: any free port), prints the address, and serves until the
/// process ends.
pub async fn run(profile: &Profile, what: LocalProxy, port: u16) -> anyhow::Result<()> {
    let client = resource_client(profile)?;
    let (listener, local) = bind_local(port)
        .await
        .with_context(|| format!("listening on 127.0.0.1:{port}"))?;
    println!(
        "Proxying connections to {} \"{}\" on {local}",
        what.kind, what.name
    );
    std::io::Write::flush(&mut std::io::stdout())?;
    let (kind, name) = (what.kind, what.name.clone());
    what.serve(listener, client, CancellationToken::new(), move |peer, e| {
        eprintln!("tsh: connection from {peer} to {kind} \"{name}\": {e}");
    })
    .await;
    Ok(())
}
