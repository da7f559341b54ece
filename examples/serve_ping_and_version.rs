//! Serve svc's ping and version server from your own hyper server.
//!
//! A product already runs an HTTP server. It wants agents and `tsh` to find the cluster
//! (`GET /webapi/ping`, `/webapi/find`) and agents' updaters to find their version
//! (`/v1/webapi/automaticupgrades/channel/<channel>/version`) on it, without running svc's
//! Proxy Service. svc's web routes ([`WebApi`]) mount [`PingService`] and the version server
//! ([`VersionHandler`]); the product's own handler answers `/` and hands every other path to
//! them. Only svc-net's light default-features-off parts are used: no gRPC, SSH or storage.
//!
//! ```text
//! cargo run -p svc-examples --example serve_ping_and_version -- [LISTEN_ADDR]
//! curl http://127.0.0.1:PORT/webapi/ping
//! curl http://127.0.0.1:PORT/v1/webapi/automaticupgrades/channel/stable/rolling/version
//! ```
//!
//! Prints `listening on <addr>` once it serves, and stops on Ctrl-C (or SIGTERM).

use std::{collections::BTreeMap, convert::Infallible};

use anyhow::{Context, Result};
use hyper::{Request, Response, body::Incoming, service::Service as _, service::service_fn};
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
};
use svc_core::{Version, channel::ChannelSpec};
use svc_net::proxy::web::{
    self, ResponseBody, WebApi, WebApiService,
    ping::{FIND_PATH, PING_PATH, PingService, PingSettings},
    version::{Fetcher, VersionResolver, http::PREFIXES, http::VersionHandler},
};
use tokio::signal::unix::{SignalKind, signal};

/// The product's own page: everything svc does not serve is the product's business.
fn product_page() -> Response<ResponseBody> {
    Response::new(web::full("hello from the product's own server\n"))
}

#[tokio::main]
async fn main() -> Result<()> {
    let listen = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:0".into());
    let own = svc_core::version::current().clone();

    // What the ping tells clients: the cluster's name and where its proxy is.
    let mut settings = PingSettings::default();
    settings.cluster_name = "example.test".into();
    let ping = PingService::new(&settings, &own);

    // One fixed channel; `default` (the proxy's own version) is added by the resolver.
    let mut channels = BTreeMap::new();
    channels.insert(
        "stable/rolling".to_owned(),
        ChannelSpec::Static {
            version: Some(Version::new(own.major(), 0, 1)),
            critical: false,
        },
    );
    let fetcher = Fetcher::direct(svc_net::tls::client_config(None)?);
    let versions = VersionHandler::new(VersionResolver::new(channels, own, fetcher));

    let mut api = WebApi::new()
        .mount(PING_PATH, web::web_service(ping.clone()))
        .mount(FIND_PATH, web::web_service(ping));
    for prefix in PREFIXES {
        api = api.mount(prefix, web::web_service(versions.clone()));
    }
    let svc_routes = WebApiService::new(api);

    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .with_context(|| format!("binding {listen}"))?;
    println!("listening on {}", listener.local_addr()?);
    let mut term = signal(SignalKind::terminate())?;
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => accepted?,
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
        };
        // svc's routes learn the client's address (the sign-in limits would key on it).
        let svc_routes = svc_routes.for_client(peer);
        let product = service_fn(move |req: Request<Incoming>| {
            let svc_routes = svc_routes.clone();
            async move {
                if req.uri().path() == "/" {
                    Ok::<_, Infallible>(product_page())
                } else {
                    svc_routes.call(req).await
                }
            }
        });
        tokio::spawn(async move {
            if let Err(e) = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tcp), product)
                .await
            {
                eprintln!("connection from {peer}: {e}");
            }
        });
    }
    Ok(())
}
