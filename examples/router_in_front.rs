//! Put svc's TLS router in front of your own TLS server.
//!
//! A product already terminates TLS for its own protocol (`my-product/1`). It wants svc's
//! agents' tunnel protocol on the same port without touching its server: the router peeks the
//! ClientHello, hands `svc-reversetunnel` connections to svc's handler (here a stand-in) and
//! everything else — untouched, ClientHello replayed — to the product's own server.
//!
//! Run: `cargo run -p svc-examples --example router_in_front`

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use anyhow::Result;
use svc_net::{
    io::{Connection, conn_service},
    listen::{self, ListenOptions},
    route::{Router, alpn},
    tls::{ServerIdentity, TlsSource},
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use tower::BoxError;

/// The product's own TLS server, unchanged: it terminates TLS and greets.
#[derive(Clone)]
struct ProductServer {
    tls: tokio_rustls::TlsAcceptor,
    greeting: &'static str,
}

impl tower::Service<Connection> for ProductServer {
    type Response = ();
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, conn: Connection) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let (io, _, _, _) = conn.into_parts();
            let mut tls = this.tls.accept(io).await?;
            tls.write_all(this.greeting.as_bytes()).await?;
            tls.shutdown().await?;
            Ok(())
        })
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let identity = ServerIdentity::load(
        &TlsSource::Generated {
            data_dir: dir.path().to_owned(),
        },
        &[],
    )?;
    let product = ProductServer {
        tls: tokio_rustls::TlsAcceptor::from(identity.server_config(&["my-product/1", "http/1.1"])?),
        greeting: "hello from the product's own server\n",
    };
    let tunnel = ProductServer {
        tls: tokio_rustls::TlsAcceptor::from(identity.server_config(&[alpn::REVERSE_TUNNEL])?),
        greeting: "svc reverse tunnel handler\n",
    };
    let router = Router::builder()
        .route(alpn::REVERSE_TUNNEL, conn_service(tunnel))
        .route("my-product/1", conn_service(product.clone()))
        .route(alpn::HTTP1, conn_service(product))
        .build();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let shutdown = CancellationToken::new();
    let options = ListenOptions::default().with_peek_timeout(Duration::from_secs(10));
    let server = tokio::spawn(listen::serve(listener, router, options, shutdown.clone()));
    println!("router listening on {addr}");

    let ca = std::fs::read(identity.ca_file.clone().unwrap_or_default())?;
    for protocol in ["my-product/1", alpn::REVERSE_TUNNEL] {
        let mut config = (*svc_net::tls::client_config(Some(&ca))?).clone();
        config.alpn_protocols = vec![protocol.as_bytes().to_vec()];
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect("localhost".try_into()?, tcp)
            .await?;
        let mut answer = String::new();
        tls.read_to_string(&mut answer).await?;
        print!("ALPN {protocol:<18} -> {answer}");
    }
    shutdown.cancel();
    server.await?;
    Ok(())
}
