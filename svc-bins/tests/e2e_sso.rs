//! Single sign-on end to end with the real binaries: `tsh login --auth=<connector>` against a
//! real OpenID Provider (pyoidc's, from PyPI, started on loopback) and a stand-in for GitHub's
//! OAuth and teams API; the test plays the browser (follows redirects, submits the provider's
//! login form). Covers the §5.4 procedure (a mapping edited with `tctl get … --with-secrets` and
//! `tctl create -f` takes effect at the next sign-in), refusals that issue nothing (a bad state,
//! an ID token signed by an unpublished key, a user mapped to no role, a SAML assertion
//! replayed through the Web UI's return path), the provider rotating its keys, GitHub's
//! `teams_to_roles`, the per-address cap on the Web UI's unfinished sign-ins, and the client
//! secrets staying out of `tctl get` and the logs.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use bytes::Bytes;
use common::{Cluster, Run, TCTL, TSH, run_client, wait};
use http::{Method, Request, header};
use http_body_util::Full;

const OIDC_SECRET: &str = "oidc-client-secret-Zq7xW3";
const GITHUB_SECRET: &str = "github-client-secret-Kp4vN8";

const MAINTENANCE_ROLE: &str = "\
kind: role
version: v7
metadata:
  name: maintenance-admin
spec:
  allow:
    rules:
    - resources: [cluster_maintenance_config]
      verbs: [create, read, update, delete]
";

const MAINTENANCE: &str = "\
kind: cluster_maintenance_config
version: v1
metadata:
  name: cluster-maintenance-config
spec:
  agent_upgrades:
    utc_start_hour: 3
    weekdays: [Tue]
";

/// The test's Python (with `oic`): `SVC_TEST_PYTHON`, which `.ci/run` sets up from
/// `.ci/python-requirements.d/`.
fn python() -> String {
    let python = std::env::var("SVC_TEST_PYTHON").unwrap_or_else(|_| {
        panic!("SVC_TEST_PYTHON is not set: create a venv with .ci/python-requirements.d/sso.txt installed (as .ci/run does) and point SVC_TEST_PYTHON at its python")
    });
    let check = Command::new(&python)
        .args(["-c", "import oic.oic.provider"])
        .output()
        .unwrap_or_else(|e| panic!("running {python}: {e}"));
    assert!(
        check.status.success(),
        "{python} cannot import oic (pip install -r .ci/python-requirements.d/sso.txt): {}",
        String::from_utf8_lossy(&check.stderr)
    );
    python
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sso").join(name)
}

/// A Python server on a free loopback port; killed on drop. Its stderr goes to `log`.
struct PyServer {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl PyServer {
    fn start(dir: &Path, name: &str, args: &[&str]) -> PyServer {
        let port = common::resources::free_port();
        let log = dir.join(format!("{name}.log"));
        let mut child = Command::new(python())
            .arg(script(name))
            .arg(port.to_string())
            .args(args)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("starting the python server");
        let out = child.stdout.take().expect("stdout");
        if let Err(e) = wait::first_line(out, wait::STEP, |l| l.starts_with("ready").then_some(())) {
            let _ = child.kill();
            panic!(
                "{name} did not start: {e}\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        PyServer { child, port, log }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for PyServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- {} ---\n{}", self.log.display(), self.log());
        }
    }
}

/// The test's browser: plain HTTP to the providers and tsh, HTTPS (unverified: the test
/// cluster's self-signed proxy) to the proxy; one cookie jar for the provider's session.
struct Browser {
    rt: tokio::runtime::Runtime,
    client: svc_net::http::HttpClient<svc_net::dial::ProxyDialer>,
    cookies: Vec<String>,
}

/// One answer the browser saw.
#[derive(Debug)]
struct Page {
    url: String,
    status: u16,
    location: Option<String>,
    body: String,
}

impl Browser {
    fn new() -> Browser {
        let tls = std::sync::Arc::new(svc_net::tls::insecure_client_config().expect("tls config"));
        let client = svc_net::http::HttpClient::builder(tls)
            .timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(0)
            .build(
                svc_net::dial::ProxyDialer::builder(svc_core::proxy_env::ProxyEnv::default())
                    .build()
                    .expect("dialer"),
            );
        Browser {
            rt: tokio::runtime::Runtime::new().expect("runtime"),
            client,
            cookies: Vec::new(),
        }
    }

    fn request(&mut self, method: Method, url: &str, form: Option<String>) -> Page {
        let mut req = Request::builder().method(method).uri(url);
        if !self.cookies.is_empty() {
            req = req.header(header::COOKIE, self.cookies.join("; "));
        }
        if form.is_some() {
            req = req.header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
        }
        let req = req
            .body(Full::new(Bytes::from(form.unwrap_or_default())))
            .expect("request");
        let resp = self
            .rt
            .block_on(self.client.send(req))
            .unwrap_or_else(|e| panic!("browser: {url}: {e}"));
        for c in resp.headers().get_all(header::SET_COOKIE) {
            let c = c.to_str().unwrap_or_default();
            let pair = c.split(';').next().unwrap_or_default().to_owned();
            let name = pair.split('=').next().unwrap_or_default().to_owned();
            self.cookies.retain(|old| !old.starts_with(&format!("{name}=")));
            self.cookies.push(pair);
        }
        Page {
            url: url.to_owned(),
            status: resp.status().as_u16(),
            location: resp
                .headers()
                .get(header::LOCATION)
                .and_then(|l| l.to_str().ok())
                .map(str::to_owned),
            body: String::from_utf8_lossy(resp.body()).into_owned(),
        }
    }

    /// Follows `url` through redirects, signing in at the OpenID Provider's form as `user`,
    /// until an answer that is not a redirect. `rewrite` may change each URL before it is
    /// visited (to tamper with the callback). Returns every page seen.
    fn browse(
        &mut self,
        url: &str,
        user: &str,
        password: &str,
        rewrite: &dyn Fn(&str) -> String,
    ) -> Vec<Page> {
        let mut pages = Vec::new();
        let mut next = (Method::GET, url.to_owned(), None::<String>);
        for _ in 0..12 {
            let url = rewrite(&next.1);
            let page = self.request(next.0.clone(), &url, next.2.take());
            let origin = origin_of(&url);
            if let Some(location) = &page.location {
                let target = if location.starts_with('/') {
                    format!("{origin}{location}")
                } else {
                    location.clone()
                };
                next = (Method::GET, target, None);
                pages.push(page);
                continue;
            }
            if page.status == 200 && page.body.contains("action='/verify'") {
                let query = page
                    .body
                    .split("name='query' value='")
                    .nth(1)
                    .and_then(|r| r.split('\'').next())
                    .expect("the provider's form has its query")
                    .replace("&amp;", "&");
                let form = form_urlencoded::Serializer::new(String::new())
                    .append_pair("query", &query)
                    .append_pair("login", user)
                    .append_pair("password", password)
                    .finish();
                next = (Method::POST, format!("{origin}/verify"), Some(form));
                pages.push(page);
                continue;
            }
            pages.push(page);
            return pages;
        }
        panic!("browser: more than 12 hops: {pages:#?}");
    }
}

fn origin_of(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("absolute URL");
    format!("{scheme}://{}", rest.split('/').next().unwrap_or_default())
}

/// `tsh login --auth=CONNECTOR` running in the background in its own SVC_HOME.
struct TshLogin {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl TshLogin {
    fn start(cluster: &Cluster, home: &Path, connector: &str) -> TshLogin {
        std::fs::create_dir_all(home).expect("home");
        let mut child = Command::new(TSH)
            .args([
                "login",
                &format!("--proxy={}", cluster.web_addr),
                "--insecure",
                &format!("--auth={connector}"),
                "--sso-timeout=60s",
            ])
            .env("SVC_HOME", home)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("tsh login");
        let (tx, lines) = mpsc::channel();
        let err = child.stderr.take().expect("stderr");
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        TshLogin {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// The provider URL tsh prints.
    fn url(&mut self) -> String {
        let deadline = std::time::Instant::now() + wait::STEP;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if let Some(url) = line.trim().strip_prefix("http").map(|r| format!("http{r}")) {
                        return url;
                    }
                }
                Err(_) => panic!(
                    "tsh login printed no URL within {:?}: {:?}",
                    wait::STEP,
                    self.seen
                ),
            }
        }
    }

    /// Waits for tsh to exit; its status and everything it wrote on stderr.
    fn finish(mut self) -> (bool, String) {
        let status = wait::wait_exit(&mut self.child, wait::STEP, "tsh login --auth");
        let mut out = std::mem::take(&mut self.seen);
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(5)) {
            out.push(l);
        }
        (status.success(), out.join("\n"))
    }

    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The roles and user name in `tsh status` of `home`, or `None` when not signed in.
fn status(home: &Path) -> Option<(String, Vec<String>)> {
    let out = run_client(TSH, home, &["status", "-f", "json"], None);
    if !out.status.success() {
        return None;
    }
    let json: serde_json::Value = serde_json::from_str(&out.stdout).expect("tsh status json");
    let roles = json["active"]["roles"]
        .as_array()
        .expect(".active.roles")
        .iter()
        .map(|r| r.as_str().expect("role").to_owned())
        .collect();
    Some((
        json["active"]["username"].as_str().expect("username").to_owned(),
        roles,
    ))
}

fn tctl_as(home: &Path, args: &[&str]) -> Run {
    run_client(TCTL, home, args, None)
}

/// The §5.4 procedure for the user signed in at `home` (roles `editor` and `access` from the
/// connector `resource`, e.g. `oidc/corp`): the connector read with `tctl get … --with-secrets`,
/// `maintenance-admin` added to the mapping that gives `editor`, written back with
/// `tctl create -f`; creating a maintenance window is refused until `sign_in_again` (a new
/// sign-in through the connector, asserted to succeed) and accepted after it, the user's roles
/// then those of the edited mapping.
fn mapping_change_takes_effect_at_the_next_sign_in(
    cluster: &Cluster,
    home: &Path,
    resource: &str,
    sign_in_again: &mut dyn FnMut(),
) {
    let fetched = tctl_as(home, &["get", resource, "--with-secrets"]).ok();
    let edited = fetched
        .stdout
        .replacen("- editor", "- editor\n    - maintenance-admin", 1);
    assert_ne!(
        edited, fetched.stdout,
        "{resource}'s mapping edited: {}",
        fetched.stdout
    );
    let kind = resource.split('/').next().unwrap_or(resource);
    let edited = cluster.write(&format!("{kind}-edited.yaml"), &edited);
    tctl_as(home, &["create", "-f", edited.to_str().expect("path")]).ok();

    // Before signing in again: refused.
    let window = cluster.write("maintenance.yaml", MAINTENANCE);
    let window = window.to_str().expect("path");
    tctl_as(home, &["create", window]).refused(
        "\"create\" on \"cluster_maintenance_config\"",
        "maintenance window before signing in again",
        cluster,
    );
    sign_in_again();
    assert_eq!(
        status(home).map(|s| s.1),
        Some(vec![
            "editor".to_owned(),
            "maintenance-admin".to_owned(),
            "access".to_owned()
        ])
    );
    let out = tctl_as(home, &["create", window]).ok();
    assert!(
        out.stdout.contains("maintenance window has been updated"),
        "{}",
        out.stdout
    );
}

/// Signs in through `connector` as `user` and returns what the browser saw last (tsh's loopback
/// page) with tsh's outcome.
fn sso_login(
    cluster: &Cluster,
    browser: &mut Browser,
    home: &Path,
    connector: &str,
    user: &str,
    password: &str,
) -> (Vec<Page>, bool, String) {
    let mut tsh = TshLogin::start(cluster, home, connector);
    let url = tsh.url();
    let pages = browser.browse(&url, user, password, &|u| u.to_owned());
    let (ok, stderr) = tsh.finish();
    (pages, ok, stderr)
}

fn oidc_connector(op: &PyServer, web: &str) -> String {
    format!(
        "kind: oidc
version: v3
metadata:
  name: corp
spec:
  issuer_url: {issuer}
  client_id: svc-client
  client_secret: {OIDC_SECRET}
  redirect_url: https://{web}/v1/webapi/oidc/callback
  display: Corp SSO
  scope: [email, groups]
  claims_to_roles:
  - name: groups
    value: ops
    roles:
    - editor
  - name: groups
    value: dev
    roles:
    - access
",
        issuer = op.url()
    )
}

#[test]
fn oidc_sign_in_maps_claims_and_takes_mapping_changes_at_the_next_sign_in() {
    let cluster = Cluster::start("debug");
    let dir = cluster.path().to_owned();
    let callback = format!("https://{}/v1/webapi/oidc/callback", cluster.web_addr);
    let op = PyServer::start(&dir, "oidc_op.py", &["svc-client", OIDC_SECRET, &callback]);
    let role = cluster.write("maintenance-role.yaml", MAINTENANCE_ROLE);
    cluster
        .tctl_admin(&["create", role.to_str().expect("path")], None)
        .ok();
    let connector = cluster.write("oidc.yaml", &oidc_connector(&op, &cluster.web_addr));
    cluster
        .tctl_admin(&["create", connector.to_str().expect("path")], None)
        .ok();

    // The ping names the connector; /webapi/ping/corp is what tsh asks.
    let mut browser = Browser::new();
    let ping = browser.request(
        Method::GET,
        &format!("https://{}/webapi/ping/corp", cluster.web_addr),
        None,
    );
    let ping: serde_json::Value = serde_json::from_str(&ping.body).expect("ping json");
    assert_eq!(ping["auth"]["type"], "oidc", "{ping}");
    assert_eq!(ping["auth"]["oidc"]["name"], "corp", "{ping}");
    assert_eq!(ping["auth"]["oidc"]["display"], "Corp SSO", "{ping}");
    assert_eq!(ping["auth"]["second_factor"], "off", "{ping}");
    let ping = browser.request(
        Method::GET,
        &format!("https://{}/webapi/ping", cluster.web_addr),
        None,
    );
    let ping: serde_json::Value = serde_json::from_str(&ping.body).expect("ping json");
    assert_eq!(ping["auth"]["type"], "local", "{ping}");
    assert_eq!(ping["auth"]["oidc"]["name"], "corp", "{ping}");

    // A bad state: the proxy refuses it to the browser, nothing is issued, tsh keeps waiting.
    let home = dir.join("home-badstate");
    let mut tsh = TshLogin::start(&cluster, &home, "corp");
    let url = tsh.url();
    let pages = browser.browse(&url, "alice", "alice-pass", &|u: &str| {
        if u.contains("/v1/webapi/oidc/callback") {
            let (base, query) = u.split_once('?').expect("query");
            let query: String = form_urlencoded::Serializer::new(String::new())
                .extend_pairs(form_urlencoded::parse(query.as_bytes()).map(|(k, v)| {
                    let v = if k == "state" {
                        "forged-state-0123456789abcdef".into()
                    } else {
                        v
                    };
                    (k, v)
                }))
                .finish();
            format!("{base}?{query}")
        } else {
            u.to_owned()
        }
    });
    let last = pages.last().expect("a page");
    assert_eq!(last.status, 403, "{last:?}");
    assert!(
        last.body.contains("state names no sign-in in progress"),
        "{last:?}"
    );
    tsh.kill();
    assert!(status(&home).is_none(), "signed in after a bad state");

    // §5.4: alice (groups dev, ops) signs in: roles from the mapping.
    let home = dir.join("home-alice");
    let (pages, ok, stderr) = sso_login(&cluster, &mut browser, &home, "corp", "alice", "alice-pass");
    assert!(ok, "tsh login --auth=corp failed: {stderr}\npages: {pages:#?}");
    let last = pages.last().expect("a page");
    assert!(last.url.starts_with("http://127.0.0.1:"), "{last:?}");
    assert!(last.body.contains("Signed in as alice@example.com"), "{last:?}");
    assert!(
        !last.url.contains("secret_key"),
        "the sealing key travelled through the browser: {}",
        last.url
    );
    assert_eq!(
        status(&home),
        Some((
            "alice@example.com".to_owned(),
            vec!["editor".to_owned(), "access".to_owned()]
        ))
    );
    // The callback carried the code; it never reaches a log.
    let code = pages
        .iter()
        .find(|p| p.url.contains("/v1/webapi/oidc/callback"))
        .and_then(|p| {
            let q = p.url.split_once('?')?.1;
            form_urlencoded::parse(q.as_bytes())
                .find(|(k, _)| k == "code")
                .map(|(_, v)| v.into_owned())
        })
        .expect("the callback's code");

    // The mapping, read with its secret, edited, written back with -f.
    let plain = tctl_as(&home, &["get", "oidc/corp"]).ok();
    assert!(
        !plain.stdout.contains(OIDC_SECRET),
        "the client secret without --with-secrets: {}",
        plain.stdout
    );
    let fetched = tctl_as(&home, &["get", "oidc/corp", "--with-secrets"]).ok();
    assert!(fetched.stdout.contains(OIDC_SECRET), "{}", fetched.stdout);
    mapping_change_takes_effect_at_the_next_sign_in(&cluster, &home, "oidc/corp", &mut || {
        // The provider rotates its signing key meanwhile: the new kid is fetched.
        let rotate = browser.request(
            Method::POST,
            &format!("{}/control/rotate", op.url()),
            Some(String::new()),
        );
        assert_eq!(rotate.status, 200, "{rotate:?}");
        let (pages, ok, stderr) = sso_login(&cluster, &mut browser, &home, "corp", "alice", "alice-pass");
        assert!(
            ok,
            "sign-in after the provider's key rotation failed: {stderr}\npages: {pages:#?}"
        );
    });

    // An ID token signed by a key the provider does not publish: refused, nothing issued.
    let home_rogue = dir.join("home-rogue");
    browser.request(
        Method::POST,
        &format!("{}/control/rogue", op.url()),
        Some(String::new()),
    );
    let (pages, ok, stderr) = sso_login(&cluster, &mut browser, &home_rogue, "corp", "alice", "alice-pass");
    assert!(!ok, "signed in with an unpublished key: {pages:#?}");
    assert!(
        stderr.contains("signed by a key the provider does not publish"),
        "tsh: {stderr}"
    );
    assert!(
        pages.last().expect("page").body.contains("Sign-in failed"),
        "{pages:#?}"
    );
    assert!(status(&home_rogue).is_none(), "a profile after a refused sign-in");
    browser.request(
        Method::POST,
        &format!("{}/control/normal", op.url()),
        Some(String::new()),
    );

    // bob's groups map to no role: refused with that reason, and no user is created. (A new
    // browser session at the provider: the old one is alice's.)
    browser.cookies.clear();
    let home_bob = dir.join("home-bob");
    let (pages, ok, stderr) = sso_login(&cluster, &mut browser, &home_bob, "corp", "bob", "bob-pass");
    assert!(!ok, "bob signed in with no role: {pages:#?}");
    assert!(stderr.contains("is mapped to no role"), "tsh: {stderr}");
    assert!(status(&home_bob).is_none());
    let users = cluster
        .tctl_admin(&["get", "user", "--format", "json"], None)
        .ok();
    assert!(!users.stdout.contains("bob@example.com"), "{}", users.stdout);
    assert!(users.stdout.contains("alice@example.com"), "{}", users.stdout);
    // The same refusal in the browser when bob signs in on the Web UI.
    browser.cookies.clear();
    let pages = browser.browse(
        &format!(
            "https://{}/webapi/sso/web/begin?kind=oidc&connector_id=corp",
            cluster.web_addr
        ),
        "bob",
        "bob-pass",
        &|u: &str| u.to_owned(),
    );
    let last = pages.last().expect("a page");
    assert_eq!(last.status, 403, "{last:?}");
    assert!(last.body.contains("is mapped to no role"), "{last:?}");

    // The Web UI's sign-in: /webapi/sso/web/begin sends the browser to the provider; back at
    // the proxy, the certificates become a web session and the browser goes to the Web UI.
    let web = format!("https://{}", cluster.web_addr);
    let begin = format!("{web}/webapi/sso/web/begin?kind=oidc&connector_id=corp");
    browser.cookies.clear();
    let pages = browser.browse(&begin, "alice", "alice-pass", &|u: &str| u.to_owned());
    let back = pages
        .iter()
        .find(|p| p.url.contains("/webapi/sso/web/return"))
        .unwrap_or_else(|| panic!("the browser never came back to the proxy: {pages:#?}"));
    assert_eq!(back.status, 302, "{back:?}");
    assert_eq!(back.location.as_deref(), Some("/web/"), "{back:?}");
    assert!(
        !back.url.contains("secret_key"),
        "the sealing key travelled through the browser: {}",
        back.url
    );
    assert!(
        browser.cookies.iter().any(|c| c.starts_with("svc_session=")),
        "no web session cookie: {:?}",
        browser.cookies
    );
    let me = browser.request(Method::GET, &format!("{web}/webapi/sessions/web"), None);
    assert_eq!(me.status, 200, "{me:?}");
    let me: serde_json::Value = serde_json::from_str(&me.body).expect("session json");
    assert_eq!(me["user"], "alice@example.com", "{me}");
    assert!(
        me["roles"]
            .as_array()
            .is_some_and(|r| r.iter().any(|r| r == "maintenance-admin")),
        "the web session's roles come from the current mapping: {me}"
    );
    // Login CSRF: a sign-in finished in a browser that did not start it makes no session.
    browser.cookies.clear();
    let started = browser.request(Method::GET, &begin, None);
    assert_eq!(started.status, 302, "{started:?}");
    browser.cookies.retain(|c| !c.starts_with("svc_sso_web="));
    let provider = started.location.clone().expect("the provider's URL");
    let pages = browser.browse(&provider, "alice", "alice-pass", &|u: &str| u.to_owned());
    let last = pages.last().expect("a page");
    assert_eq!(last.status, 403, "{last:?}");
    assert!(last.body.contains("not started in this browser"), "{last:?}");
    assert!(
        !browser.cookies.iter().any(|c| c.starts_with("svc_session=")),
        "a session from a sign-in this browser did not start: {:?}",
        browser.cookies
    );

    // Nothing secret in svc's log.
    let log = cluster.stderr();
    assert!(log.contains("signed in through single sign-on"), "{log}");
    for secret in [OIDC_SECRET, code.as_str()] {
        assert!(!log.contains(secret), "svc's log carries a secret ({secret})");
    }
}

#[test]
fn github_sign_in_maps_teams_through_the_api() {
    let cluster = Cluster::start("debug");
    let dir = cluster.path().to_owned();
    let callback = format!("https://{}/v1/webapi/github/callback", cluster.web_addr);
    let gh = PyServer::start(
        &dir,
        "github_standin.py",
        &["gh-client-id", GITHUB_SECRET, &callback, "octocat", "acme", "sre"],
    );
    let connector = format!(
        "kind: github
version: v3
metadata:
  name: gh
spec:
  client_id: gh-client-id
  client_secret: {GITHUB_SECRET}
  redirect_url: {callback}
  endpoint_url: {web}
  api_endpoint_url: {web}/api/v3
  teams_to_roles:
  - organization: acme
    team: sre
    roles: [access, auditor]
  - organization: acme
    team: dev
    roles: [editor]
",
        web = gh.url()
    );
    let file = cluster.write("github.yaml", &connector);
    cluster
        .tctl_admin(&["create", file.to_str().expect("path")], None)
        .ok();
    let plain = cluster.tctl_admin(&["get", "github/gh"], None).ok();
    assert!(!plain.stdout.contains(GITHUB_SECRET), "{}", plain.stdout);

    let mut browser = Browser::new();
    let home = dir.join("home-octo");
    let (pages, ok, stderr) = sso_login(&cluster, &mut browser, &home, "gh", "", "");
    assert!(
        ok,
        "tsh login --auth=gh failed: {stderr}\npages: {pages:#?}\nstand-in: {}",
        gh.log()
    );
    assert_eq!(
        status(&home),
        Some((
            "octocat".to_owned(),
            vec!["access".to_owned(), "auditor".to_owned()]
        ))
    );
    let log = gh.log();
    assert!(!log.contains("refused:"), "the stand-in refused a request: {log}");
    assert!(log.contains("POST /login/oauth/access_token"), "{log}");
    assert!(log.contains("GET /api/v3/user/teams"), "{log}");
    assert!(
        !cluster.stderr().contains(GITHUB_SECRET),
        "svc's log carries the client secret"
    );

    // One client's unfinished Web UI sign-ins are capped per address: the 21st from 127.0.0.1
    // is refused with 429 and says why; a client at another address is not kept waiting.
    let begin = format!(
        "https://{}/webapi/sso/web/begin?kind=github&connector_id=gh",
        cluster.web_addr
    );
    for i in 0..20 {
        let started = browser.request(Method::GET, &begin, None);
        assert_eq!(started.status, 302, "sign-in {i}: {started:?}");
    }
    let refused = browser.request(Method::GET, &begin, None);
    assert_eq!(refused.status, 429, "{refused:?}");
    assert!(
        refused
            .body
            .contains("address 127.0.0.1 has 20 unfinished single sign-ons already"),
        "{refused:?}"
    );
    let other = Command::new(svc_testkit::require("curl", "curl"))
        .args([
            "-k",
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "60",
        ])
        .args(["--interface", "127.0.0.2", &begin])
        .output()
        .expect("curl");
    assert_eq!(
        String::from_utf8_lossy(&other.stdout),
        "302",
        "a sign-in from 127.0.0.2: {}",
        String::from_utf8_lossy(&other.stderr)
    );
}

/// Runs the pysaml2 identity provider (`svc-core/tests/support/saml_idp.py`) for one step.
fn saml_idp(args: &[&str], input: &serde_json::Value) -> serde_json::Value {
    use std::io::Write;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../svc-core/tests/support/saml_idp.py");
    let mut child = Command::new(python())
        .arg(script)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting saml_idp.py");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.to_string().as_bytes())
        .expect("writing to saml_idp.py");
    let out = child.wait_with_output().expect("saml_idp.py");
    assert!(
        out.status.success(),
        "saml_idp.py {args:?} failed (pysaml2 from .ci/python-requirements.d/saml.txt, xmlsec1): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("saml_idp.py answers JSON")
}

/// The IdP's answer to the sign-in request in `url` (its `SAMLRequest` and `RelayState`) for
/// alice (`extra`: the IdP's options, `tamper`: applied to the Response XML): the ACS URL to
/// post to, and the form the browser posts there.
fn saml_idp_form(
    idp: &serde_json::Value,
    sp_metadata: &str,
    url: &str,
    extra: serde_json::Value,
    tamper: &dyn Fn(&str) -> String,
) -> (String, String) {
    use base64::Engine as _;
    let query = url.split_once('?').expect("query").1;
    let param = |name: &str| {
        form_urlencoded::parse(query.as_bytes())
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.into_owned())
            .unwrap_or_else(|| panic!("{name} in {url}"))
    };
    let mut input = serde_json::json!({
        "idp": idp,
        "sp_metadata": sp_metadata,
        "saml_request": param("SAMLRequest"),
        "user": "alice",
        "attributes": { "groups": ["ops", "dev"] },
    });
    if let (Some(i), Some(e)) = (input.as_object_mut(), extra.as_object()) {
        i.extend(e.clone());
    }
    let answer = saml_idp(&["respond"], &input);
    let acs = answer["acs"].as_str().expect("acs").to_owned();
    let engine = base64::engine::general_purpose::STANDARD;
    let xml = String::from_utf8(
        engine
            .decode(answer["saml_response"].as_str().expect("saml_response"))
            .expect("base64"),
    )
    .expect("utf-8");
    let form = form_urlencoded::Serializer::new(String::new())
        .append_pair("SAMLResponse", &engine.encode(tamper(&xml)))
        .append_pair("RelayState", &param("RelayState"))
        .finish();
    (acs, form)
}

/// One SAML sign-in: tsh prints the IdP URL with the AuthnRequest, the IdP answers (`extra`:
/// its options, `tamper`: applied to the Response XML), the browser posts it to the proxy's ACS
/// and follows the redirect back to tsh. tsh's outcome and the last page.
fn saml_login(
    cluster: &Cluster,
    browser: &mut Browser,
    home: &Path,
    idp: &serde_json::Value,
    sp_metadata: &str,
    extra: serde_json::Value,
    tamper: &dyn Fn(&str) -> String,
) -> (bool, String, Page) {
    let mut tsh = TshLogin::start(cluster, home, "corp");
    let url = tsh.url();
    assert!(
        url.starts_with("https://idp.example.test/sso"),
        "tsh sends the browser to the IdP: {url}"
    );
    let (acs, form) = saml_idp_form(idp, sp_metadata, &url, extra, tamper);
    let posted = browser.request(Method::POST, &acs, Some(form));
    let last = match &posted.location {
        Some(location) if location.starts_with("http://127.0.0.1") => {
            browser.request(Method::GET, location, None)
        }
        _ => {
            tsh.kill();
            return (false, String::new(), posted);
        }
    };
    let (ok, stderr) = tsh.finish();
    (ok, stderr, last)
}

/// The proxy's answer to `posted` (the ACS's answer to a form) as the browser ends up seeing
/// it: a redirect to the proxy's web return path is followed once.
fn web_return(browser: &mut Browser, web: &str, posted: Page) -> Page {
    match posted.location.as_deref() {
        Some(l) if l.contains("/webapi/sso/web/return") => {
            let url = if l.starts_with('/') {
                format!("{web}{l}")
            } else {
                l.to_owned()
            };
            browser.request(Method::GET, &url, None)
        }
        _ => posted,
    }
}

#[test]
fn saml_sign_in_maps_attributes_and_takes_mapping_changes_at_the_next_sign_in() {
    let cluster = Cluster::start("debug");
    let dir = cluster.path().to_owned();
    let keys = saml_idp(
        &["keygen", dir.join("idp").to_str().expect("path")],
        &serde_json::json!({}),
    );
    let idp = serde_json::json!({
        "entity_id": "https://idp.example.test/metadata",
        "sso_url": "https://idp.example.test/sso/redirect",
        "key_file": keys["key_file"],
        "cert_file": keys["cert_file"],
    });
    let metadata = saml_idp(&["metadata"], &serde_json::json!({ "idp": idp }));
    let acs = format!("https://{}/v1/webapi/saml/acs/corp", cluster.web_addr);
    let connector = serde_json::json!({
        "kind": "saml",
        "version": "v2",
        "metadata": { "name": "corp" },
        "spec": {
            "acs": acs,
            "display": "Corp SAML",
            "entity_descriptor": metadata["xml"],
            "attributes_to_roles": [
                { "name": "groups", "value": "ops", "roles": ["editor"] },
                { "name": "groups", "value": "dev", "roles": ["access"] },
            ],
        },
    })
    .to_string();
    let sp_metadata = match svc_core::resource::parse_resource(&connector).expect("connector") {
        svc_core::resource::Resource::Saml(c) => {
            let idp = svc_core::auth::saml::IdpMetadata::from_connector(&c)
                .expect("IdP metadata")
                .expect("inline");
            svc_core::auth::saml::ServiceProvider::new(&c, idp).metadata_xml()
        }
        other => panic!("not a saml connector: {:?}", other.kind()),
    };
    let role = cluster.write("maintenance-role.yaml", MAINTENANCE_ROLE);
    cluster
        .tctl_admin(&["create", role.to_str().expect("path")], None)
        .ok();
    let file = cluster.write("saml.yaml", &connector);
    cluster
        .tctl_admin(&["create", file.to_str().expect("path")], None)
        .ok();
    let mut browser = Browser::new();

    // A response whose signed assertion was altered: refused, nothing issued.
    let home_tampered = dir.join("home-tampered");
    let (ok, stderr, last) = saml_login(
        &cluster,
        &mut browser,
        &home_tampered,
        &idp,
        &sp_metadata,
        serde_json::json!({}),
        &|xml: &str| xml.replacen(">dev<", ">admins<", 1),
    );
    assert!(!ok, "signed in with a tampered assertion: {last:?}");
    assert!(
        stderr.contains("signature does not verify"),
        "tsh: {stderr}\n{last:?}"
    );
    assert!(
        status(&home_tampered).is_none(),
        "a profile after a refused sign-in"
    );

    // §5.4 with SAML attributes: alice (groups ops, dev) gets the mapped roles.
    let home = dir.join("home-alice");
    let alice_signs_in = |browser: &mut Browser| {
        saml_login(
            &cluster,
            browser,
            &home,
            &idp,
            &sp_metadata,
            serde_json::json!({}),
            &|x: &str| x.to_owned(),
        )
    };
    let (ok, stderr, last) = alice_signs_in(&mut browser);
    assert!(ok, "tsh login --auth=corp (saml) failed: {stderr}\n{last:?}");
    assert!(last.body.contains("Signed in as alice"), "{last:?}");
    assert_eq!(
        status(&home),
        Some(("alice".to_owned(), vec!["editor".to_owned(), "access".to_owned()]))
    );
    mapping_change_takes_effect_at_the_next_sign_in(&cluster, &home, "saml/corp", &mut || {
        let (ok, stderr, last) = alice_signs_in(&mut browser);
        assert!(ok, "second SAML sign-in failed: {stderr}\n{last:?}");
    });

    // An expired assertion and a wrong audience: refused with the reason.
    for (extra, reason) in [
        (serde_json::json!({ "lifetime_minutes": -10 }), "expired at"),
        (
            serde_json::json!({ "audience": "https://other-sp.example.test" }),
            "audience",
        ),
    ] {
        let home_bad = dir.join("home-bad");
        let (ok, stderr, last) = saml_login(
            &cluster,
            &mut browser,
            &home_bad,
            &idp,
            &sp_metadata,
            extra,
            &|x: &str| x.to_owned(),
        );
        assert!(!ok, "signed in despite {reason}: {last:?}");
        assert!(stderr.contains(reason), "tsh: {stderr}\n{last:?}");
        assert!(status(&home_bad).is_none(), "a profile after a refused sign-in");
    }

    // The Web UI's SAML sign-in through the proxy's web return path, then the same assertion
    // replayed: posted again as it was, and under a sign-in the attacker started itself. Each
    // replay is refused and makes no web session.
    let web = format!("https://{}", cluster.web_addr);
    let begin = format!("{web}/webapi/sso/web/begin?kind=saml&connector_id=corp");
    browser.cookies.clear();
    let started = browser.request(Method::GET, &begin, None);
    assert_eq!(started.status, 302, "{started:?}");
    let provider = started.location.clone().expect("the IdP's URL");
    let (acs, form) = saml_idp_form(
        &idp,
        &sp_metadata,
        &provider,
        serde_json::json!({}),
        &|x: &str| x.to_owned(),
    );
    let posted = browser.request(Method::POST, &acs, Some(form.clone()));
    let back = web_return(&mut browser, &web, posted);
    assert_eq!(back.status, 302, "{back:?}");
    assert_eq!(back.location.as_deref(), Some("/web/"), "{back:?}");
    let me = browser.request(Method::GET, &format!("{web}/webapi/sessions/web"), None);
    assert_eq!(me.status, 200, "{me:?}");
    assert!(me.body.contains("\"user\":\"alice\""), "{me:?}");
    let sessions = |log: &str| log.matches("web session started by single sign-on").count();
    let before = sessions(&cluster.stderr());
    assert_eq!(before, 1, "one web session by single sign-on so far");

    // The captured form posted again, by a browser with the victim's cookies and by one without.
    for keep_cookies in [true, false] {
        if !keep_cookies {
            browser.cookies.clear();
        }
        browser.cookies.retain(|c| !c.starts_with("svc_session="));
        let posted = browser.request(Method::POST, &acs, Some(form.clone()));
        let last = web_return(&mut browser, &web, posted);
        // Its sign-in was taken by the first post: the state is spent.
        assert_eq!(
            last.status, 403,
            "the replayed assertion (cookies kept: {keep_cookies}): {last:?}"
        );
        assert!(
            last.body.contains("state names no sign-in in progress"),
            "{last:?}"
        );
        assert!(
            !browser.cookies.iter().any(|c| c.starts_with("svc_session=")),
            "a web session from a replayed assertion: {last:?}"
        );
    }
    // The captured assertion under a sign-in the attacker started (its own binding cookie and
    // RelayState): refused by the Auth Service, the refusal sealed back to the proxy's return
    // path and shown there.
    browser.cookies.clear();
    let started = browser.request(Method::GET, &begin, None);
    assert_eq!(started.status, 302, "{started:?}");
    let provider = started.location.clone().expect("the IdP's URL");
    let relay = form_urlencoded::parse(provider.split_once('?').expect("query").1.as_bytes())
        .find(|(k, _)| k == "RelayState")
        .map(|(_, v)| v.into_owned())
        .expect("RelayState");
    let captured = form_urlencoded::parse(form.as_bytes())
        .find(|(k, _)| k == "SAMLResponse")
        .map(|(_, v)| v.into_owned())
        .expect("SAMLResponse");
    let replayed = form_urlencoded::Serializer::new(String::new())
        .append_pair("SAMLResponse", &captured)
        .append_pair("RelayState", &relay)
        .finish();
    let posted = browser.request(Method::POST, &acs, Some(replayed));
    let last = web_return(&mut browser, &web, posted);
    // The assertion answers the victim's request, not this one.
    assert_eq!(last.status, 403, "{last:?}");
    assert!(
        last.body.contains("sign-in refused")
            && last.body.contains("InResponseTo")
            && last.body.contains("does not answer the request"),
        "{last:?}"
    );
    assert!(
        !browser.cookies.iter().any(|c| c.starts_with("svc_session=")),
        "a web session from a replayed assertion: {last:?}"
    );
    assert_eq!(
        sessions(&cluster.stderr()),
        before,
        "a replayed assertion started a web session"
    );
}
