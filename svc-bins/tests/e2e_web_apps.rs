//! End to end: web apps in the browser through the real `svc` binary (`svc start`: Auth, Proxy
//! and an agent with the Application Service). The proxy's public address is
//! `proxy.e2e.test:<port>`; apps live at `<app>.proxy.e2e.test`, which `curl --resolve` points
//! at 127.0.0.1, trusting the proxy's generated CA (whose certificate must cover the wildcard).
//! The app is `tests/apps/echo_headers.py`, which answers with the headers it received.
//!
//! A user signs in (web session), creates an app session, follows the one-time URL, and the app
//! receives a JWT that verifies (here with ring, independently of svc's code) against the keys
//! the proxy serves at `/.well-known/jwks.json`, with the right claims. Attacks: a forged
//! `svc-jwt-assertion` (and `X-Forwarded-User`) never reaches the app, a replayed token is
//! refused, app A's cookie is refused on app B's host, an app the roles do not allow is 403,
//! and after logout or `tctl lock` the app cookie is refused.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use common::Cluster;
use common::resources::{PASSWORD, Proc, free_port, require};

const PUBLIC_HOST: &str = "proxy.e2e.test";

/// The header-echoing app on a port it picks.
fn echo_headers_app() -> (Proc, u16) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/apps/echo_headers.py");
    let mut child = Command::new(require("python3", "python3"))
        .arg(&script)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let proc = Proc(child);
    let port = common::wait::first_line(out, common::wait::STEP, |l| l.trim().parse::<u16>().ok())
        .unwrap_or_else(|e| panic!("{} printed no port: {e}", script.display()));
    (proc, port)
}

/// One HTTP answer.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("expected JSON ({e}): {self:?}"))
    }
}

/// The proxy's web port, reached with curl trusting the proxy's generated CA.
struct Web {
    port: u16,
    ca: PathBuf,
}

impl Web {
    /// `curl` to `https://<host>:<port><path>` (host resolved to 127.0.0.1).
    fn request(
        &self,
        method: &str,
        host: &str,
        path: &str,
        headers: &[String],
        body: Option<&str>,
    ) -> Answer {
        let mut cmd = Command::new(require("curl", "curl"));
        cmd.args(["-sS", "-i", "--max-time", "30", "-X", method])
            .arg("--cacert")
            .arg(&self.ca)
            .arg("--resolve")
            .arg(format!("{host}:{}:127.0.0.1", self.port))
            .args(["-w", "\n%{http_code}"]);
        for h in headers {
            cmd.arg("-H").arg(h);
        }
        if let Some(b) = body {
            cmd.args(["-H", "Content-Type: application/json", "--data-binary", b]);
        }
        cmd.arg(format!("https://{host}:{}{path}", self.port));
        let out = common::wait::run_within(
            &mut cmd,
            common::wait::STEP,
            &format!("curl {method} {host}{path}"),
        )
        .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "curl {method} https://{host}{path} failed: {}\n{text}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (rest, code) = text.rsplit_once('\n').expect("curl's status line");
        let (head, body) = rest.split_once("\r\n\r\n").unwrap_or((rest, ""));
        let headers = head
            .lines()
            .skip(1)
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
            .collect();
        Answer {
            status: code
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("status code in {text:?}")),
            headers,
            body: body.to_owned(),
        }
    }

    fn app_host(app: &str) -> String {
        format!("{app}.{PUBLIC_HOST}")
    }
}

/// A web session: the cookie and the CSRF token.
struct Session {
    cookie: String,
    csrf: String,
}

impl Session {
    fn headers(&self) -> Vec<String> {
        vec![
            format!("Cookie: svc_session={}", self.cookie),
            format!("X-CSRF-Token: {}", self.csrf),
        ]
    }
}

fn cookie_value(answer: &Answer, name: &str) -> String {
    answer
        .header("set-cookie")
        .iter()
        .find_map(|c| {
            c.split(';')
                .next()?
                .trim()
                .strip_prefix(&format!("{name}="))
                .map(str::to_owned)
        })
        .unwrap_or_else(|| panic!("no {name} cookie set: {answer:?}"))
}

fn sign_in(web: &Web, user: &str) -> Session {
    let body = serde_json::json!({ "user": user, "pass": PASSWORD }).to_string();
    let a = web.request("POST", PUBLIC_HOST, "/webapi/sessions/web", &[], Some(&body));
    assert_eq!(a.status, 200, "web sign-in: {a:?}");
    Session {
        cookie: cookie_value(&a, "svc_session"),
        csrf: a.json()["csrf_token"].as_str().expect("csrf_token").to_owned(),
    }
}

fn create_app_session(web: &Web, s: &Session, app: &str) -> Answer {
    let body = serde_json::json!({ "app": app }).to_string();
    web.request(
        "POST",
        PUBLIC_HOST,
        "/webapi/sessions/app",
        &s.headers(),
        Some(&body),
    )
}

/// Creates an app session for `app`, retrying while the agent's first heartbeat has not
/// announced it yet; returns the one-time URL's path and query.
fn app_url(web: &Web, s: &Session, app: &str) -> String {
    let deadline = Instant::now() + common::wait::STEP;
    loop {
        let a = create_app_session(web, s, app);
        if a.status == 200 {
            let url = a.json()["url"].as_str().expect("url").to_owned();
            let prefix = format!("https://{app}.{PUBLIC_HOST}:{}/x-svc-auth?token=", web.port);
            let path = url
                .strip_prefix(&format!("https://{app}.{PUBLIC_HOST}:{}", web.port))
                .unwrap_or_else(|| panic!("expected {prefix}…, got {url}"));
            assert!(url.starts_with(&prefix), "{url}");
            return path.to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "no app session for {app} within {:?}: {a:?}",
            common::wait::STEP
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Follows the one-time URL: the app-session cookie.
fn exchange(web: &Web, app: &str, path: &str) -> String {
    let a = web.request("GET", &Web::app_host(app), path, &[], None);
    assert_eq!(a.status, 302, "token exchange: {a:?}");
    assert_eq!(a.header("location"), ["/"], "{a:?}");
    let set = a.header("set-cookie").join("\n");
    for attr in ["Secure", "HttpOnly", "SameSite=Lax", "Path=/"] {
        assert!(set.contains(attr), "app cookie lacks {attr}: {set}");
    }
    assert!(
        !set.to_ascii_lowercase().contains("domain="),
        "the app cookie must be host-only: {set}"
    );
    cookie_value(&a, "svc_app_session")
}

fn seen(headers: &serde_json::Value, name: &str) -> Vec<String> {
    headers
        .as_array()
        .expect("a list of headers")
        .iter()
        .filter(|h| h[0].as_str().is_some_and(|n| n.eq_ignore_ascii_case(name)))
        .map(|h| h[1].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Verifies an ES256 JWT against a JWKS document with ring: the claims.
fn verify_jwt(jwt: &str, jwks: &serde_json::Value) -> serde_json::Value {
    let parts: Vec<&str> = jwt.split('.').collect();
    assert_eq!(parts.len(), 3, "a compact JWT: {jwt}");
    let header: serde_json::Value = serde_json::from_slice(&B64.decode(parts[0]).unwrap()).unwrap();
    assert_eq!(header["alg"], "ES256", "{header}");
    let kid = header["kid"].as_str().expect("kid");
    let key = jwks["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .find(|k| k["kid"] == kid)
        .unwrap_or_else(|| panic!("no key {kid} in {jwks}"));
    assert_eq!(
        (key["kty"].as_str(), key["crv"].as_str()),
        (Some("EC"), Some("P-256")),
        "{key}"
    );
    let mut point = vec![4u8];
    point.extend(B64.decode(key["x"].as_str().unwrap()).unwrap());
    point.extend(B64.decode(key["y"].as_str().unwrap()).unwrap());
    ring::signature::UnparsedPublicKey::new(&ring::signature::ECDSA_P256_SHA256_FIXED, &point)
        .verify(
            format!("{}.{}", parts[0], parts[1]).as_bytes(),
            &B64.decode(parts[2]).unwrap(),
        )
        .expect("the JWT verifies against /.well-known/jwks.json");
    serde_json::from_slice(&B64.decode(parts[1]).unwrap()).unwrap()
}

#[test]
fn browser_app_access_with_a_signed_identity_header_and_refusals() {
    let (_echo, echo_port) = echo_headers_app();
    let (_other, other_port) = echo_headers_app();
    let (_secret, secret_port) = echo_headers_app();
    let port = free_port();
    let config = format!(
        "auth_service:\n  listen_addr: 127.0.0.1:0\n  cluster_name: e2e.test\n\
proxy_service:\n  web_listen_addr: 127.0.0.1:{port}\n  public_addr: {PUBLIC_HOST}:{port}\n\
app_service:\n  enabled: true\n  apps:\n\
  - name: echo\n    uri: http://127.0.0.1:{echo_port}\n    labels: {{env: dev}}\n\
  - name: other\n    uri: http://127.0.0.1:{other_port}\n    labels: {{env: dev}}\n\
  - name: secret\n    uri: http://127.0.0.1:{secret_port}\n    labels: {{env: prod}}\n"
    );
    // The public name does not resolve: the local agent tunnels to the loopback address.
    let tunnel = format!("127.0.0.1:{port}");
    let cluster = Cluster::start_with_env(
        tempfile::tempdir().unwrap(),
        "info",
        &config,
        &[("SVC_TUNNEL_PUBLIC_ADDR", tunnel.as_str())],
    );
    let role =
        "kind: role\nversion: v7\nmetadata:\n  name: dev-apps\nspec:\n  allow:\n    app_labels: {env: dev}\n";
    cluster.tctl_admin(&["create", "-f", "-"], Some(role)).ok();
    cluster
        .tctl_admin(
            &["users", "add", "alice", "--roles=dev-apps", "--password-stdin"],
            Some(PASSWORD),
        )
        .ok();
    let web = Web {
        port,
        ca: cluster.data_dir.join("proxy-ca.pem"),
    };
    assert!(
        web.ca.is_file(),
        "the proxy's generated CA at {}",
        web.ca.display()
    );

    let s = sign_in(&web, "alice");
    // Without the CSRF token the app session is refused.
    let a = web.request(
        "POST",
        PUBLIC_HOST,
        "/webapi/sessions/app",
        &[format!("Cookie: svc_session={}", s.cookie)],
        Some(r#"{"app":"echo"}"#),
    );
    assert_eq!(a.status, 403, "no CSRF token: {a:?}");

    let path = app_url(&web, &s, "echo");
    let app_cookie = exchange(&web, "echo", &path);
    // The token is single use.
    let replay = web.request("GET", &Web::app_host("echo"), &path, &[], None);
    assert_eq!(replay.status, 403, "a replayed token: {replay:?}");

    // Forged identity headers never reach the app; svc's JWT does.
    let a = web.request(
        "GET",
        &Web::app_host("echo"),
        "/some/page?q=1",
        &[
            format!("Cookie: theme=dark; svc_app_session={app_cookie}"),
            "svc-jwt-assertion: forged.jwt.value".into(),
            "X-Forwarded-User: admin".into(),
            "X-Svc-User: admin".into(),
        ],
        None,
    );
    assert_eq!(a.status, 200, "app request: {a:?}");
    let seen_headers = a.json();
    let jwts = seen(&seen_headers, "svc-jwt-assertion");
    assert_eq!(jwts.len(), 1, "one JWT header: {seen_headers}");
    assert_ne!(jwts[0], "forged.jwt.value");
    assert!(
        seen(&seen_headers, "x-forwarded-user").is_empty(),
        "{seen_headers}"
    );
    assert!(seen(&seen_headers, "x-svc-user").is_empty(), "{seen_headers}");
    assert_eq!(
        seen(&seen_headers, "cookie"),
        ["theme=dark"],
        "the app never sees svc's cookie"
    );

    let jwks = web.request("GET", PUBLIC_HOST, "/.well-known/jwks.json", &[], None);
    assert_eq!(jwks.status, 200, "{jwks:?}");
    let claims = verify_jwt(&jwts[0], &jwks.json());
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert_eq!(claims["sub"], "alice", "{claims}");
    assert_eq!(claims["username"], "alice", "{claims}");
    assert_eq!(claims["roles"], serde_json::json!(["dev-apps"]), "{claims}");
    assert_eq!(claims["iss"], "e2e.test", "{claims}");
    assert_eq!(claims["aud"], format!("http://127.0.0.1:{echo_port}"), "{claims}");
    let (iat, exp) = (claims["iat"].as_u64().unwrap(), claims["exp"].as_u64().unwrap());
    assert!(
        iat <= now + 5 && exp > now && exp <= iat + 600,
        "{claims} at {now}"
    );

    // App A's cookie on app B's host.
    let cross = web.request(
        "GET",
        &Web::app_host("other"),
        "/",
        &[format!("Cookie: svc_app_session={app_cookie}")],
        None,
    );
    assert_eq!(cross.status, 403, "echo's cookie on other's host: {cross:?}");
    // An app the roles do not allow.
    let denied = create_app_session(&web, &s, "secret");
    assert_eq!(denied.status, 403, "{denied:?}");
    assert!(
        denied.body.contains("secret"),
        "the refusal names the app: {denied:?}"
    );
    // An unknown app session.
    let unknown = web.request(
        "GET",
        &Web::app_host("echo"),
        "/",
        &["Cookie: svc_app_session=0000".into()],
        None,
    );
    assert_eq!(unknown.status, 401, "{unknown:?}");

    // Logout ends the app session.
    let out = web.request("DELETE", PUBLIC_HOST, "/webapi/sessions/web", &s.headers(), None);
    assert_eq!(out.status, 200, "logout: {out:?}");
    let after = web.request(
        "GET",
        &Web::app_host("echo"),
        "/",
        &[format!("Cookie: svc_app_session={app_cookie}")],
        None,
    );
    assert_eq!(after.status, 401, "the app cookie after logout: {after:?}");

    // So does a lock.
    let s = sign_in(&web, "alice");
    let path = app_url(&web, &s, "echo");
    let app_cookie = exchange(&web, "echo", &path);
    let get = |cookie: &str| {
        web.request(
            "GET",
            &Web::app_host("echo"),
            "/",
            &[format!("Cookie: svc_app_session={cookie}")],
            None,
        )
    };
    assert_eq!(get(&app_cookie).status, 200);
    cluster
        .tctl_admin(&["lock", "--user=alice", "--message=incident 9"], None)
        .ok();
    let deadline = Instant::now() + common::wait::STEP;
    loop {
        let a = get(&app_cookie);
        if a.status == 401 || a.status == 403 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the app cookie still works {:?} after tctl lock: {a:?}",
            common::wait::STEP
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        matches!(get(&app_cookie).status, 401 | 403),
        "the app session stays ended after the lock"
    );
}
