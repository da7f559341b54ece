//! The version server's HTTP face, mounted on the proxy's web API.
//!
//! `GET /v1/webapi/automaticupgrades/channel/<channel>/version` (and `/critical`, and both
//! without `/v1`): strip the prefix, split on `/`; the last segment is `version` or `critical`,
//! the ones before it joined with `/` name the channel (so `stable/cloud` works). Bodies are
//! exactly `v<semver>` / `none` / `yes` / `no` with no trailing newline; errors are the web
//! API's JSON errors (400 malformed path, 404 unknown channel, 405 wrong method, 502 upstream
//! failure, 504 past the 5 s per-request timeout).

use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use crate::proxy::web::{ResponseBody, full, json_error};
use ::http::{HeaderValue, Method, Request, Response, StatusCode, header};
use svc_core::channel::CHANNEL_PATH_PREFIX;
use tower::Service;

use super::{ResolveError, VersionResolver};

/// The path prefixes served: [`CHANNEL_PATH_PREFIX`] and the same without `/v1`.
pub const PREFIXES: [&str; 2] = [CHANNEL_PATH_PREFIX, "/webapi/automaticupgrades/channel/"];

/// The per-request timeout.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

const FORM: &str = "expected /v1/webapi/automaticupgrades/channel/<channel>/version or /v1/webapi/automaticupgrades/channel/<channel>/critical";

/// What a request asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Query {
    /// The version.
    Version,
    /// The critical flag.
    Critical,
}

/// Parses a request path into channel and query; `Err` carries the 400 message.
pub(crate) fn parse_path(path: &str) -> Result<(String, Query), String> {
    let rest = PREFIXES
        .iter()
        .find_map(|p| path.strip_prefix(p))
        .ok_or_else(|| format!("invalid path {path}: {FORM}"))?;
    let (channel, last) = rest
        .rsplit_once('/')
        .ok_or_else(|| format!("invalid path {path}: {FORM}"))?;
    let query = match last {
        "version" => Query::Version,
        "critical" => Query::Critical,
        _ => return Err(format!("invalid path {path}: {FORM}")),
    };
    if channel.is_empty() {
        return Err(format!("invalid path {path}: empty channel name; {FORM}"));
    }
    Ok((channel.to_owned(), query))
}

/// The HTTP handler: `Request → Response`, never failing (errors are responses).
#[derive(Clone, Debug)]
pub struct VersionHandler {
    resolver: VersionResolver,
}

impl VersionHandler {
    /// A handler answering from `resolver`.
    pub fn new(resolver: VersionResolver) -> Self {
        Self { resolver }
    }

    async fn answer(&self, method: Method, path: String) -> Response<ResponseBody> {
        if method != Method::GET && method != Method::HEAD {
            return json_error(
                StatusCode::METHOD_NOT_ALLOWED,
                &format!("method {method} not allowed on {path}; use GET"),
            );
        }
        let (channel, query) = match parse_path(&path) {
            Ok(parsed) => parsed,
            Err(msg) => return json_error(StatusCode::BAD_REQUEST, &msg),
        };
        let resolver = &self.resolver;
        let work = async {
            match query {
                Query::Version => resolver.version(&channel).await.map(|v| match v {
                    Some(v) => v.to_string(),
                    None => "none".to_owned(),
                }),
                Query::Critical => resolver
                    .critical(&channel)
                    .await
                    .map(|c| if c { "yes" } else { "no" }.to_owned()),
            }
        };
        match tokio::time::timeout(REQUEST_TIMEOUT, work).await {
            Ok(Ok(body)) => {
                let mut resp = Response::new(full(body));
                resp.headers_mut()
                    .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
                resp
            }
            Ok(Err(e @ ResolveError::UnknownChannel(_))) => json_error(StatusCode::NOT_FOUND, &e.to_string()),
            Ok(Err(e)) => json_error(StatusCode::BAD_GATEWAY, &e.to_string()),
            Err(_) => json_error(
                StatusCode::GATEWAY_TIMEOUT,
                &format!("channel \"{channel}\": no answer within {REQUEST_TIMEOUT:?}"),
            ),
        }
    }
}

impl<B> Service<Request<B>> for VersionHandler {
    type Response = Response<ResponseBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let this = self.clone();
        let (method, path) = (req.method().clone(), req.uri().path().to_owned());
        Box::pin(async move { Ok(this.answer(method, path).await) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        let p = |s: &str| parse_path(s);
        assert_eq!(
            p("/v1/webapi/automaticupgrades/channel/stable/cloud/version"),
            Ok(("stable/cloud".into(), Query::Version))
        );
        assert_eq!(
            p("/webapi/automaticupgrades/channel/default/critical"),
            Ok(("default".into(), Query::Critical))
        );
        for bad in [
            "/v1/webapi/automaticupgrades/channel/version",
            "/v1/webapi/automaticupgrades/channel//version",
            "/v1/webapi/automaticupgrades/channel/default/latest",
            "/v1/webapi/automaticupgrades/channel/default",
        ] {
            let err = p(bad).unwrap_err();
            assert!(err.contains("<channel>/version"), "{bad}: {err}");
        }
    }
}
