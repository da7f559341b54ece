//! The Web UI: the single-page app built from `svc-net/web` and embedded in the binary by
//! `build.rs` (feature `web-ui`).
//!
//! `GET /` redirects to `/web/`; `GET /web/…` serves the embedded files, and `index.html` for
//! any other path under `/web/` so the app's own routes (`/web/inventory`, …) load it (a missing
//! file under `/web/assets/` is a 404: those are the build's content-hashed files). Every answer
//! carries the strict security headers ([`SECURITY_HEADERS`]); files have strong ETags
//! (`If-None-Match` answers 304), the hashed assets are cached for a year, `index.html` is
//! revalidated on every load.

use http::{HeaderValue, Method, Request, Response, StatusCode, header};

use super::{ResponseBody, full, json_error};

mod assets {
    include!(concat!(env!("OUT_DIR"), "/web_ui_assets.rs"));
}

/// Where the Web UI lives.
pub const UI_PREFIX: &str = "/web/";

/// The Content Security Policy of every UI response: scripts, styles and connections only from
/// the proxy itself, no framing, no `<base>`, forms only to the proxy.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

/// The headers every UI response carries.
pub const SECURITY_HEADERS: [(&str, &str); 4] = [
    ("content-security-policy", CONTENT_SECURITY_POLICY),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("x-frame-options", "DENY"),
];

/// One embedded file.
#[derive(Debug, Clone, Copy)]
pub struct Asset {
    /// Its path under [`UI_PREFIX`] (`index.html`, `assets/index-….js`).
    pub path: &'static str,
    /// Its `Content-Type`.
    pub content_type: &'static str,
    /// Its strong ETag, quoted.
    pub etag: &'static str,
    /// Its bytes.
    pub body: &'static [u8],
}

/// Every embedded file.
pub fn assets() -> impl Iterator<Item = Asset> {
    assets::ASSETS
        .iter()
        .map(|&(path, content_type, etag, body)| Asset {
            path,
            content_type,
            etag,
            body,
        })
}

/// The embedded file at `path` (relative to [`UI_PREFIX`]).
pub fn asset(path: &str) -> Option<Asset> {
    assets().find(|a| a.path == path)
}

/// The answer for a request the UI owns (`/`, `/web`, `/web/…`), or `None` for any other path.
pub fn respond<B>(req: &Request<B>) -> Option<Response<ResponseBody>> {
    let path = req.uri().path();
    if path == "/" || path == "/web" {
        return Some(with_security_headers(redirect(UI_PREFIX)));
    }
    let rel = path.strip_prefix(UI_PREFIX)?;
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut resp = json_error(
            StatusCode::METHOD_NOT_ALLOWED,
            &format!("method {} not allowed on the Web UI", req.method()),
        );
        resp.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return Some(with_security_headers(resp));
    }
    let found = match rel {
        "" => asset("index.html"),
        rel => asset(rel).or_else(|| {
            // The app's routes load the app; a missing hashed asset is not found.
            (!rel.starts_with("assets/"))
                .then(|| asset("index.html"))
                .flatten()
        }),
    };
    let resp = match found {
        Some(a) => serve(req, a),
        None => json_error(StatusCode::NOT_FOUND, &format!("not found: {path}")),
    };
    Some(with_security_headers(resp))
}

fn redirect(to: &'static str) -> Response<ResponseBody> {
    let mut resp = Response::new(full(""));
    *resp.status_mut() = StatusCode::FOUND;
    resp.headers_mut()
        .insert(header::LOCATION, HeaderValue::from_static(to));
    resp
}

fn serve<B>(req: &Request<B>, a: Asset) -> Response<ResponseBody> {
    let not_modified = req
        .headers()
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .any(|tag| tag == a.etag || tag == "*");
    let cache = if a.path.starts_with("assets/") {
        "public, max-age=31536000, immutable"
    } else {
        "no-cache"
    };
    let mut resp = if not_modified {
        let mut r = Response::new(full(""));
        *r.status_mut() = StatusCode::NOT_MODIFIED;
        r
    } else if req.method() == Method::HEAD {
        Response::new(full(""))
    } else {
        Response::new(full(a.body))
    };
    let headers = resp.headers_mut();
    headers.insert(header::ETAG, HeaderValue::from_static(a.etag));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    if !not_modified {
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(a.content_type));
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(a.body.len()));
    }
    resp
}

fn with_security_headers(mut resp: Response<ResponseBody>) -> Response<ResponseBody> {
    for (name, value) in SECURITY_HEADERS {
        resp.headers_mut().insert(
            header::HeaderName::from_static(name),
            HeaderValue::from_static(value),
        );
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(path: &str) -> Response<ResponseBody> {
        let req = Request::get(path).body(()).expect("request");
        respond(&req).expect("the UI answers")
    }

    #[test]
    fn root_redirects_to_the_ui() {
        for path in ["/", "/web"] {
            let resp = get(path);
            assert_eq!(resp.status(), StatusCode::FOUND, "{path}");
            assert_eq!(resp.headers()[header::LOCATION], "/web/", "{path}");
            assert_eq!(resp.headers()["content-security-policy"], CONTENT_SECURITY_POLICY);
        }
    }

    #[test]
    fn serves_index_for_app_routes_and_files_with_etags() {
        let index = asset("index.html").expect("index.html is embedded");
        assert!(!index.body.is_empty(), "index.html is not empty");
        for path in ["/web/", "/web/inventory", "/web/terminal"] {
            let resp = get(path);
            assert_eq!(resp.status(), StatusCode::OK, "{path}");
            assert_eq!(resp.headers()[header::ETAG], index.etag, "{path}");
            assert_eq!(resp.headers()[header::CONTENT_TYPE], "text/html; charset=utf-8");
            for (name, value) in SECURITY_HEADERS {
                assert_eq!(resp.headers()[name], value, "{path}: {name}");
            }
        }
        let script = assets()
            .find(|a| a.path.starts_with("assets/") && a.path.ends_with(".js"))
            .expect("a script is embedded");
        let resp = get(&format!("/web/{}", script.path));
        assert_eq!(
            resp.headers()[header::CONTENT_TYPE],
            "text/javascript; charset=utf-8"
        );
        let req = Request::get(format!("/web/{}", script.path))
            .header(header::IF_NONE_MATCH, script.etag)
            .body(())
            .expect("request");
        let resp = respond(&req).expect("answered");
        assert_eq!(resp.status(), StatusCode::NOT_MODIFIED);
        assert_eq!(get("/web/assets/missing.js").status(), StatusCode::NOT_FOUND);
    }

    #[test]
    fn leaves_other_paths_alone_and_refuses_writes() {
        for path in ["/webapi/ping", "/webapi/sessions/web", "/v1/webapi/find", "/weba"] {
            let req = Request::get(path).body(()).expect("request");
            assert!(respond(&req).is_none(), "{path}");
        }
        let req = Request::post("/web/").body(()).expect("request");
        let resp = respond(&req).expect("answered");
        assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
    }
}
