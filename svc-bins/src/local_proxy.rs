//! `tsh proxy app|db`: a local plain listener whose connections are carried to a resource
//! through the proxy (`svc_net::services::client`), so everyday clients (`curl`, `psql`) work
//! unchanged against `127.0.0.1:PORT`.
//!
//! Postgres: the local side answers psql's SSLRequest with `N` (the hop to the proxy is TLS
//! with the user's certificate, and the agent runs TLS to the server), then forwards the
//! startup message and everything after it. A refusal by the proxy reaches psql as a Postgres
//! `FATAL` error carrying the proxy's text, so the user sees why.

use std::time::Duration;

use anyhow::Context;
use svc_core::Addr;
use svc_core::auth::ServedKind;
use svc_core::config::DbProtocol;
use svc_net::services::client::{ConnectError, ResourceClient, alpn_for, postgres_startup};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

use crate::profile::Profile;

/// What to serve locally.
#[derive(Debug, Clone)]
pub struct LocalProxy {
    /// The resource kind.
    pub kind: ServedKind,
    /// The resource name.
    pub name: String,
    /// The database protocol (databases only).
    pub protocol: Option<DbProtocol>,
}

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
    let listener = TcpListener::bind(("127.0.0.1", port))
        .await
        .with_context(|| format!("listening on 127.0.0.1:{port}"))?;
    let local = listener.local_addr()?;
    println!(
        "Proxying connections to {} \"{}\" on {local}",
        what.kind, what.name
    );
    std::io::Write::flush(&mut std::io::stdout())?;
    loop {
        let (sock, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("tsh: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (client, what) = (client.clone(), what.clone());
        tokio::spawn(async move {
            if let Err(e) = serve(sock, &client, &what).await {
                eprintln!(
                    "tsh: connection from {peer} to {} \"{}\": {e:#}",
                    what.kind, what.name
                );
            }
        });
    }
}

async fn serve(mut sock: TcpStream, client: &ResourceClient, what: &LocalProxy) -> anyhow::Result<()> {
    let _ = sock.set_nodelay(true);
    let postgres = what.kind == ServedKind::Db && what.protocol.is_none_or(|p| p == DbProtocol::Postgres);
    let startup = if postgres {
        Some(
            postgres_startup(&mut sock)
                .await
                .context("the Postgres startup")?,
        )
    } else {
        None
    };
    let alpn = alpn_for(what.kind, what.protocol);
    let mut upstream = match client.connect(what.kind, &what.name, alpn).await {
        Ok(s) => s,
        Err(e) => {
            if postgres {
                let _ = sock.write_all(&postgres_error(&e)).await;
            }
            return Err(e.into());
        }
    };
    if let Some(startup) = startup {
        upstream.write_all(&startup).await?;
    }
    tokio::io::copy_bidirectional_with_sizes(&mut sock, &mut upstream, 64 * 1024, 64 * 1024).await?;
    Ok(())
}

/// A Postgres `ErrorResponse` (severity FATAL, SQLSTATE 28000 for refusals, 08006 otherwise).
fn postgres_error(e: &ConnectError) -> Vec<u8> {
    let code = match e {
        ConnectError::Refused(_) => "28000",
        _ => "08006",
    };
    let mut fields = Vec::new();
    for (tag, value) in [
        (b'S', "FATAL"),
        (b'V', "FATAL"),
        (b'C', code),
        (b'M', &e.to_string()),
    ] {
        fields.push(tag);
        fields.extend_from_slice(value.replace('\0', " ").as_bytes());
        fields.push(0);
    }
    fields.push(0);
    let mut msg = vec![b'E'];
    msg.extend_from_slice(&u32::try_from(fields.len() + 4).unwrap_or(u32::MAX).to_be_bytes());
    msg.extend_from_slice(&fields);
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_become_postgres_errors() {
        let msg = postgres_error(&ConnectError::Refused("access denied to db \"pg\"".into()));
        assert_eq!(msg[0], b'E');
        let len = u32::from_be_bytes([msg[1], msg[2], msg[3], msg[4]]) as usize;
        assert_eq!(len + 1, msg.len());
        let text = String::from_utf8_lossy(&msg[5..]);
        assert!(text.contains("SFATAL\0") && text.contains("C28000\0"), "{text}");
        assert!(text.contains("Maccess denied to db \"pg\"\0"), "{text}");
    }
}
