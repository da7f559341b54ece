//! Graceful shutdown drains: a request in flight when shutdown starts still gets its answer,
//! and the listener stops accepting.

mod support;

use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use anyhow::{Context as _, Result};
use support::{STEP, within};
use svc_net::{
    proxy::web::{Body, ResponseBody, full, web_service},
    proxy::{ProxyBuilder, ProxySettings},
};
use tokio::sync::Notify;

/// A mounted service that answers only when released, telling the test it has a request.
#[derive(Clone)]
struct Gate {
    entered: Arc<Notify>,
    release: Arc<Notify>,
}

impl tower::Service<http::Request<Body>> for Gate {
    type Response = http::Response<ResponseBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: http::Request<Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            this.entered.notify_one();
            this.release.notified().await;
            Ok(http::Response::new(full("drained")))
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_request_completes_during_shutdown() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut settings = ProxySettings::default();
    settings.ping.web_listen_addr = "127.0.0.1:0".parse()?;
    settings.tls = svc_net::tls::TlsSource::Generated {
        data_dir: dir.path().to_owned(),
    };
    let gate = Gate {
        entered: Arc::new(Notify::new()),
        release: Arc::new(Notify::new()),
    };
    let proxy = ProxyBuilder::new(settings)
        .web_mount("/slow", web_service(gate.clone()))
        .bind()
        .await?;
    let addr = proxy.addrs().web;
    let ca = std::fs::read(proxy.ca_file().context("ca")?)?;
    let config = svc_net::tls::client_config(Some(&ca))?;
    let client = svc_net::http::HttpClient::builder(config).build(svc_net::dial::TcpConnector::new());
    let url = format!("https://{addr}/slow");
    let request = tokio::spawn(async move {
        let resp = client.get(&url).await?;
        anyhow::Ok((resp.status(), resp.into_body()))
    });

    within(
        STEP,
        "the request reaching the mounted service",
        gate.entered.notified(),
    )
    .await;
    let shutdown = tokio::spawn(proxy.shutdown());
    // New connections are refused once the listener has stopped; wait for that state.
    within(
        STEP,
        "the listener refusing new connections after shutdown began",
        async {
            while tokio::net::TcpStream::connect(addr).await.is_ok() {
                tokio::task::yield_now().await;
            }
        },
    )
    .await;
    gate.release.notify_one();
    let (status, body) = within(STEP, "the in-flight response during shutdown", request).await??;
    assert_eq!(status, 200);
    assert_eq!(&body[..], b"drained");
    within(STEP, "the proxy's shutdown finishing", shutdown).await?;
    Ok(())
}
