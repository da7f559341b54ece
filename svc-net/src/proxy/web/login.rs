//! `POST /webapi/login`: password sign-in through the Proxy.
//!
//! Data flow: `tsh login` generates its keys and sends the user name, the password and the
//! public keys ([`LoginBody`]) → this handler (mounted with `ProxyBuilder::web_mount`) calls the
//! Auth Service's `Login` with the proxy's own host identity → the user certificates come back
//! as [`LoginAnswer`]; `tsh` combines them with its private keys (`client::login_via_proxy`). Private
//! keys never leave the client; the password only passes through, in [`Secret`](svc_core::Secret).

use std::sync::Arc;

use base64::Engine;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Limited};

use super::{Body, ResponseBody, WebService, full, json_error, web_service};
use crate::auth::{AuthClient, ClientError, FailoverClient, proto};

/// Why a call the proxy made to the Auth Service for a sign-in ([`call_auth`]) failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SignInCallError {
    /// The Auth Service did not answer within the sign-in deadline.
    #[error("sign-in needs the Auth Service ({addrs}), which did not answer within {after:?}")]
    Deadline {
        /// The Auth Service addresses the link tries, comma-separated.
        addrs: String,
        /// The deadline that passed.
        after: std::time::Duration,
    },
    /// The Auth Service refused, or the link failed (connecting or in transport).
    #[error(transparent)]
    Auth(ClientError),
}

/// Runs `call` with the proxy's own Auth client from `link`, under the sign-in `deadline` when
/// there is one. A call the Auth Service does not answer in time, or one that fails in
/// transport, resets the link, so the next sign-in connects again (to the next address that
/// answers); the caller maps the error to its own answer.
pub(crate) async fn call_auth<T, F, Fut>(
    link: &FailoverClient,
    deadline: Option<std::time::Duration>,
    call: F,
) -> Result<T, SignInCallError>
where
    F: FnOnce(AuthClient) -> Fut,
    Fut: std::future::Future<Output = Result<T, ClientError>>,
{
    let run = async {
        let client = link.client().await?;
        call(client).await
    };
    let answer = match deadline {
        Some(after) => match tokio::time::timeout(after, run).await {
            Ok(r) => r,
            Err(_) => {
                link.reset().await;
                return Err(SignInCallError::Deadline {
                    addrs: link.addrs().join(", "),
                    after,
                });
            }
        },
        None => run.await,
    };
    match answer {
        Ok(v) => Ok(v),
        Err(e) => {
            if FailoverClient::is_transport_failure(&e) {
                // Without an identity of its own the link keeps its client: reset does nothing.
                link.reset().await;
            }
            Err(SignInCallError::Auth(e))
        }
    }
}

pub use svc_core::webapi::{LOGIN_PATH, LoginAnswer, LoginBody};
/// Requests larger than this are refused (a login body is well under 2 KiB).
const MAX_BODY: usize = 64 * 1024;

/// The `/webapi/login` handler: calls the Auth Service with the proxy's identity. Clients are
/// told to reach the Auth API at `public_auth_addr`, or through this proxy when `None`.
pub fn login_service(auth: AuthClient, public_auth_addr: Option<String>) -> WebService {
    let link = FailoverClient::with_client(auth, "the Auth Service's address".into());
    login_service_with(Arc::new(link), public_auth_addr, None)
}

/// The `/webapi/login` handler over a [`FailoverClient`]: the sign-in goes to the first Auth
/// Service address that answers. With a `deadline`, a sign-in the Auth Service does not
/// answer in time fails with `503 Service Unavailable`, naming the addresses, instead of
/// waiting; a transport failure does too, and the next sign-in connects again.
pub fn login_service_with(
    link: Arc<FailoverClient>,
    public_auth_addr: Option<String>,
    deadline: Option<std::time::Duration>,
) -> WebService {
    let state = Arc::new((link, public_auth_addr, deadline));
    web_service(tower::service_fn(move |req: Request<Body>| {
        let state = state.clone();
        async move { Ok::<_, std::convert::Infallible>(handle(&state.0, &state.1, state.2, req).await) }
    }))
}

async fn handle(
    link: &FailoverClient,
    auth_addr: &Option<String>,
    deadline: Option<std::time::Duration>,
    req: Request<Body>,
) -> Response<ResponseBody> {
    if req.method() != Method::POST {
        return json_error(StatusCode::METHOD_NOT_ALLOWED, "use POST on /webapi/login");
    }
    // The user's address, for the Auth Service's per-address limit on failed sign-ins.
    let client_addr = req
        .extensions()
        .get::<super::ClientAddr>()
        .map(|c| c.0.ip().to_canonical().to_string())
        .unwrap_or_default();
    let bytes = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return json_error(StatusCode::BAD_REQUEST, &format!("reading the request body: {e}")),
    };
    // serde_json's errors name a position, never the content: the password stays out of them.
    let body: LoginBody = match serde_json::from_slice(&bytes) {
        Ok(b) => b,
        Err(e) => {
            return json_error(
                StatusCode::BAD_REQUEST,
                &format!("expected a login JSON body: {e}"),
            );
        }
    };
    let Ok(tls_public_key) = base64::engine::general_purpose::STANDARD.decode(&body.tls_public_key) else {
        return json_error(
            StatusCode::BAD_REQUEST,
            "tls_public_key: expected standard base64",
        );
    };
    let request = proto::LoginRequest {
        username: body.user,
        password: body.password.into_inner(),
        tls_public_key,
        ssh_public_key: body.ssh_public_key,
        ttl_seconds: body.ttl_seconds,
        client_addr,
    };
    let unavailable = |why: String| {
        json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!(
                "sign-in needs the Auth Service ({}), which is unavailable: {why}",
                link.addrs().join(", ")
            ),
        )
    };
    let answer = match call_auth(link, deadline, |mut auth| async move {
        auth.raw().login(request).await.map_err(ClientError::from)
    })
    .await
    {
        Ok(a) => Ok(a),
        Err(e @ SignInCallError::Deadline { .. }) => {
            return json_error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string());
        }
        Err(SignInCallError::Auth(e))
            if link.identity().is_some() && FailoverClient::is_transport_failure(&e) =>
        {
            return unavailable(e.to_string());
        }
        Err(SignInCallError::Auth(ClientError::Status { code, message })) => {
            Err(tonic::Status::new(code, message))
        }
        Err(SignInCallError::Auth(e)) => return unavailable(e.to_string()),
    };
    match answer {
        Ok(certs) => {
            let c = certs.into_inner();
            let answer = LoginAnswer {
                name: c.name,
                cluster_name: c.cluster_name,
                tls_cert_pem: c.tls_cert_pem,
                ssh_cert: c.ssh_cert,
                tls_ca_pems: c.tls_ca_pems,
                ssh_ca_keys: c.ssh_ca_keys,
                not_after_unix: c.not_after_unix,
                auth_addr: auth_addr.clone(),
            };
            let mut resp = Response::new(full(serde_json::to_vec(&answer).unwrap_or_default()));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("application/json"),
            );
            resp
        }
        Err(status) => {
            let code = match status.code() {
                tonic::Code::Unauthenticated => StatusCode::UNAUTHORIZED,
                tonic::Code::PermissionDenied => StatusCode::FORBIDDEN,
                tonic::Code::InvalidArgument => StatusCode::BAD_REQUEST,
                tonic::Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
                _ => StatusCode::BAD_GATEWAY,
            };
            json_error(code, ClientError::from(status).to_string().as_str())
        }
    }
}
