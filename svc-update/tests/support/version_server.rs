//! A version server for tests: `GET /v1/webapi/automaticupgrades/channel/<channel>/version` and
//! `.../critical` with REFERENCE.md's bodies (`v<semver>` or `none`; `yes` or `no`), one
//! channel, answers changeable while running.

#![allow(dead_code, unreachable_pub)]

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

#[derive(Debug, Clone)]
struct Answer {
    version: String,
    critical: bool,
}

/// A running version server for one channel.
pub struct VersionServer {
    /// Where it listens.
    pub addr: SocketAddr,
    channel: String,
    answer: Arc<Mutex<Answer>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for VersionServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl VersionServer {
    /// Serves `channel` with `version` (`v17.1.0` or `none`) and `critical`.
    pub async fn start(channel: &str, version: &str, critical: bool) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let answer = Arc::new(Mutex::new(Answer {
            version: version.to_owned(),
            critical,
        }));
        let (a, ch) = (answer.clone(), channel.to_owned());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (a, ch) = (a.clone(), ch.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let response = respond(&ch, &a.lock().unwrap(), req.uri().path());
                        async move { Ok::<_, Infallible>(response) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self {
            addr,
            channel: channel.to_owned(),
            answer,
            task,
        }
    }

    /// The server's base URL (what `--version-server` takes).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Changes the answer.
    pub fn set(&self, version: &str, critical: bool) {
        *self.answer.lock().unwrap() = Answer {
            version: version.to_owned(),
            critical,
        };
    }
}

fn respond(channel: &str, answer: &Answer, path: &str) -> Response<Full<Bytes>> {
    let text = |status: StatusCode, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r
    };
    let rest = path
        .strip_prefix("/v1/webapi/automaticupgrades/channel/")
        .or_else(|| path.strip_prefix("/webapi/automaticupgrades/channel/"));
    let Some((name, endpoint)) = rest.and_then(|r| r.rsplit_once('/')) else {
        return text(
            StatusCode::BAD_REQUEST,
            "expected /v1/webapi/automaticupgrades/channel/<channel>/{version,critical}".into(),
        );
    };
    if name != channel {
        return text(StatusCode::NOT_FOUND, format!("channel {name} not found"));
    }
    match endpoint {
        "version" => text(StatusCode::OK, answer.version.clone()),
        "critical" => text(StatusCode::OK, if answer.critical { "yes" } else { "no" }.into()),
        other => text(
            StatusCode::BAD_REQUEST,
            format!("expected version or critical, got {other}"),
        ),
    }
}
