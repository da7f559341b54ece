//! The one HTTP client of svc: hyper-util's pooled `Client` over TLS (rustls on ring, through
//! `hyper-rustls`) over a connector — by default the [`ProxyDialer`](crate::dial::ProxyDialer),
//! so `HTTPS_PROXY`, `HTTP_PROXY` and `NO_PROXY` decide per request whether the connection goes
//! through an HTTP CONNECT proxy.
//!
//! Every outbound HTTP request svc makes goes through [`HttpClient`]: the version server's
//! `forward_url` fetches and the updaters' version client
//! ([`Fetcher`](crate::proxy::web::version::Fetcher)), `tsh login` against the proxy's web API, and the
//! agent's ping before it opens its reverse tunnel. It adds what those callers need on top of
//! hyper-util: a connect deadline (TCP, proxy CONNECT and TLS), a deadline for the whole request
//! (sending, the answer and its body), a cap on the body it reads, and errors
//! ([`HttpError`]) that name the method and the URL — without the URL's credentials.
//!
//! The client is a `tower::Service<http::Request<Full<Bytes>>>` answering
//! `http::Response<Bytes>` (the whole body, read), and has the same as async methods
//! ([`HttpClient::send`], [`HttpClient::get`]).
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use svc_net::http::HttpClient;
//!
//! // The public web roots plus the cluster's CA (the PEM `tsh` or the proxy wrote).
//! let tls = svc_net::tls::client_config(Some(&std::fs::read("proxy-ca.pem")?))?;
//! let client = HttpClient::builder(tls).from_env()?; // HTTPS_PROXY / NO_PROXY
//! let res = client.get("https://proxy.example.com/webapi/ping").await?;
//! println!("{} {}", res.status(), String::from_utf8_lossy(res.body()));
//! # Ok(())
//! # }
//! ```

mod client;
mod error;

pub use client::{
    Connector, DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_BODY, DEFAULT_TIMEOUT, HttpClient, HttpClientBuilder,
    RequestBody,
};
pub use error::{HttpError, HttpErrorKind};
