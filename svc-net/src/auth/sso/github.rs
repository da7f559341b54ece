//! GitHub (and GitHub Enterprise) OAuth: the authorization URL, the code exchange at
//! `<endpoint_url>/login/oauth/access_token`, the user and their teams from the REST API at
//! `api_endpoint_url` (`GET /user`, `GET /user/teams`), and `teams_to_roles`.

use bytes::Bytes;
use http::{Method, Request, header};
use http_body_util::Full;
use serde::Deserialize;
use svc_core::auth::sso::{SsoIdentity, SsoRequest, github_roles};
use svc_core::resource::GithubSpec;

use super::{Refused, SsoEngine, json_answer};

const GITHUB_WEB: &str = "https://github.com";
const GITHUB_API: &str = "https://api.github.com";
/// GitHub's media type for the REST API.
const GITHUB_JSON: &str = "application/vnd.github+json";
/// Teams read per page, and at most this many pages.
const PER_PAGE: usize = 100;
const MAX_PAGES: usize = 10;

fn web(spec: &GithubSpec) -> String {
    spec.endpoint_url
        .as_deref()
        .unwrap_or(GITHUB_WEB)
        .trim_end_matches('/')
        .to_owned()
}

/// The REST API base: `api_endpoint_url`; for GitHub Enterprise without it, `<endpoint_url>/api/v3`.
fn api(spec: &GithubSpec) -> String {
    match (&spec.api_endpoint_url, &spec.endpoint_url) {
        (Some(api), _) => api.trim_end_matches('/').to_owned(),
        (None, Some(web)) => format!("{}/api/v3", web.trim_end_matches('/')),
        (None, None) => GITHUB_API.to_owned(),
    }
}

/// The authorization URL for `req` (scope `read:org`, which the teams API needs).
pub(super) fn auth_url(spec: &GithubSpec, req: &SsoRequest) -> String {
    let q = form_urlencoded::Serializer::new(String::new())
        .append_pair("client_id", &spec.client_id)
        .append_pair("redirect_uri", &spec.redirect_url)
        .append_pair("scope", "read:org")
        .append_pair("state", &req.state)
        .finish();
    format!("{}/login/oauth/authorize?{q}", web(spec))
}

#[derive(Deserialize)]
struct UserAnswer {
    login: String,
}

#[derive(Deserialize)]
struct TeamAnswer {
    slug: String,
    organization: OrgAnswer,
}

#[derive(Deserialize)]
struct OrgAnswer {
    login: String,
}

async fn api_get(
    engine: &SsoEngine,
    url: &str,
    token: &str,
    what: &str,
) -> Result<serde_json::Value, Refused> {
    let request = Request::builder()
        .method(Method::GET)
        .uri(url)
        .header(header::ACCEPT, GITHUB_JSON)
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header("X-GitHub-Api-Version", "2022-11-28")
        .body(Full::default())
        .map_err(|_| Refused(format!("{what}: \"{url}\" is not a URL")))?;
    let resp = engine
        .http()?
        .send(request)
        .await
        .map_err(|e| Refused(format!("{what}: {e}")))?;
    json_answer(what, &resp)
}

/// Exchanges `code`, reads the user and their teams, and maps the teams to roles.
pub(super) async fn finish(
    engine: &SsoEngine,
    spec: &GithubSpec,
    code: &str,
) -> Result<SsoIdentity, Refused> {
    let secret = spec
        .client_secret
        .as_ref()
        .ok_or_else(|| Refused("the connector has no client_secret".into()))?;
    let form = form_urlencoded::Serializer::new(String::new())
        .append_pair("client_id", &spec.client_id)
        .append_pair("client_secret", secret.expose())
        .append_pair("code", code)
        .append_pair("redirect_uri", &spec.redirect_url)
        .finish();
    let url = format!("{}/login/oauth/access_token", web(spec));
    let request = Request::builder()
        .method(Method::POST)
        .uri(&url)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header(header::ACCEPT, "application/json")
        .body(Full::new(Bytes::from(form)))
        .map_err(|_| Refused(format!("\"{url}\" is not a URL")))?;
    let resp = engine
        .http()?
        .send(request)
        .await
        .map_err(|e| Refused(format!("exchanging the code: {e}")))?;
    let answer = json_answer("exchanging the code", &resp)?;
    let token = answer
        .get("access_token")
        .and_then(|t| t.as_str())
        .filter(|t| !t.is_empty())
        .ok_or_else(|| Refused("exchanging the code: the answer has no access_token".into()))?
        .to_owned();
    let base = api(spec);
    let user: UserAnswer =
        serde_json::from_value(api_get(engine, &format!("{base}/user"), &token, "reading the user").await?)
            .map_err(|e| Refused(format!("reading the user: {e}")))?;
    let mut teams = Vec::new();
    for page in 1..=MAX_PAGES {
        let url = format!("{base}/user/teams?per_page={PER_PAGE}&page={page}");
        let batch: Vec<TeamAnswer> =
            serde_json::from_value(api_get(engine, &url, &token, "reading the user's teams").await?)
                .map_err(|e| Refused(format!("reading the user's teams: {e}")))?;
        let n = batch.len();
        teams.extend(batch.into_iter().map(|t| (t.organization.login, t.slug)));
        if n < PER_PAGE {
            break;
        }
    }
    Ok(SsoIdentity {
        roles: github_roles(spec, &teams),
        username: user.login,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(endpoint: Option<&str>, api_url: Option<&str>) -> GithubSpec {
        GithubSpec {
            client_id: "id".into(),
            client_secret: None,
            redirect_url: "https://proxy/v1/webapi/github/callback".into(),
            display: None,
            endpoint_url: endpoint.map(Into::into),
            api_endpoint_url: api_url.map(Into::into),
            teams_to_roles: vec![],
            signing_key_pair: None,
        }
    }

    #[test]
    fn endpoints() {
        assert_eq!(api(&spec(None, None)), "https://api.github.com");
        assert_eq!(web(&spec(None, None)), "https://github.com");
        assert_eq!(
            api(&spec(Some("https://ghe.corp/"), None)),
            "https://ghe.corp/api/v3"
        );
        assert_eq!(
            api(&spec(Some("https://ghe.corp"), Some("https://api.ghe.corp/"))),
            "https://api.ghe.corp"
        );
    }
}
