//! The Web UI's read and write APIs, each authenticated by the web session cookie
//! ([`WebSessions::authenticate`]) and answered by the Auth Service **as the user** (the
//! session's own certificate): the Auth Service applies the user's roles, exactly as for
//! `tsh`/`tctl` with that user's profile — the proxy decides nothing here.
//!
//! - `GET /webapi/resources?kind=&search=`: what `tsh ls` / `tsh apps ls` / … list.
//! - `GET /webapi/inventory?upgrader=&older_than=&newer_than=&exact_version=&services=`: what
//!   `tctl inventory ls` lists, with the same filters, plus whether each agent is behind the
//!   cluster's version.
//! - `GET|PUT /webapi/maintenance`: the `cluster_maintenance_config` resource (PUT with the
//!   CSRF token; the Auth Service refuses users whose roles do not allow it).
//! - `GET /webapi/channels`: each configured version channel's current answer.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{Method, Request, Response, header};
use http_body_util::{BodyExt, Limited};
use serde_json::{Value, json};
use svc_core::Version;
use svc_core::auth::{InventoryRow, ServedKind};
use svc_core::identity::SystemRole;
use svc_core::resource::{ClusterMaintenanceConfig, Kind, Resource};

use super::session::{WebError, WebSessions, WebUser, json, rfc3339};
use super::version::VersionResolver;
use super::{Body, ResponseBody, WebService, web_service};

/// `GET /webapi/resources`.
pub const RESOURCES_PATH: &str = "/webapi/resources";
/// `GET /webapi/inventory`.
pub const INVENTORY_PATH: &str = "/webapi/inventory";
/// `GET|PUT /webapi/maintenance`.
pub const MAINTENANCE_PATH: &str = "/webapi/maintenance";
/// `GET /webapi/channels`.
pub const CHANNELS_PATH: &str = "/webapi/channels";
/// Every path [`ApiService::service`] answers.
pub const PATHS: [&str; 4] = [RESOURCES_PATH, INVENTORY_PATH, MAINTENANCE_PATH, CHANNELS_PATH];
/// The largest maintenance document accepted.
const MAX_BODY: usize = 64 * 1024;

/// The web APIs over the proxy's sessions.
#[derive(Clone, Debug)]
pub struct ApiService {
    sessions: WebSessions,
    channels: Option<VersionResolver>,
    channel_names: Vec<String>,
}

impl ApiService {
    /// The APIs for `sessions`; `/webapi/channels` answers from `channels` (the proxy's version
    /// server) for the configured `channel_names`.
    pub fn new(sessions: WebSessions, channels: Option<VersionResolver>, channel_names: Vec<String>) -> Self {
        Self {
            sessions,
            channels,
            channel_names,
        }
    }

    /// The handler to mount at each of [`PATHS`].
    pub fn service(&self) -> WebService {
        let this = self.clone();
        web_service(tower::service_fn(move |req: Request<Body>| {
            let this = this.clone();
            async move {
                Ok::<_, std::convert::Infallible>(match this.handle(req).await {
                    Ok(r) => r,
                    Err(e) => e.into_response(),
                })
            }
        }))
    }

    async fn handle(&self, req: Request<Body>) -> Result<Response<ResponseBody>, WebError> {
        let path = req.uri().path().to_owned();
        let method = req.method().clone();
        let reading = method == Method::GET || method == Method::HEAD;
        // Sessions first: an unauthenticated caller learns nothing, not even which paths exist.
        let user = self.sessions.authenticate(req.headers(), !reading).await?;
        let query = parse_query(req.uri().query().unwrap_or_default());
        match (path.as_str(), method) {
            (RESOURCES_PATH, Method::GET) => resources(&user, &query, &host_of(&req)).await,
            (INVENTORY_PATH, Method::GET) => inventory(&user, &query).await,
            (MAINTENANCE_PATH, Method::GET) => maintenance(&user).await,
            (MAINTENANCE_PATH, Method::PUT) => {
                let bytes = Limited::new(req.into_body(), MAX_BODY)
                    .collect()
                    .await
                    .map_err(|e| WebError::BadRequest(format!("reading the request body: {e}")))?
                    .to_bytes();
                put_maintenance(&user, &bytes).await
            }
            (CHANNELS_PATH, Method::GET) => self.channels().await,
            (RESOURCES_PATH | INVENTORY_PATH | CHANNELS_PATH, m) => {
                Err(WebError::BadRequest(format!("use GET on {path}, not {m}")))
            }
            (MAINTENANCE_PATH, m) => Err(WebError::BadRequest(format!("use GET or PUT on {path}, not {m}"))),
            _ => Err(WebError::NotFound(format!("not found: {path}"))),
        }
    }

    async fn channels(&self) -> Result<Response<ResponseBody>, WebError> {
        let mut out = Vec::new();
        for name in &self.channel_names {
            let Some(resolver) = &self.channels else { break };
            out.push(match resolver.resolve(name).await {
                Ok(a) => json!({
                    "name": name,
                    "version": a.version.map(|v| v.to_string()),
                    "critical": a.critical,
                }),
                Err(e) => json!({ "name": name, "version": null, "critical": false, "error": e.to_string() }),
            });
        }
        Ok(json(&json!({ "channels": out })))
    }
}

/// The request's host (`Host`, or the HTTP/2 authority), as the browser reached the proxy.
pub(crate) fn host_of<B>(req: &Request<B>) -> String {
    req.headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned)
        .or_else(|| req.uri().authority().map(|a| a.to_string()))
        .unwrap_or_default()
}

/// `a=1&b=x%20y` → map (percent-decoded, `+` as space); a repeated key keeps the last value.
pub(crate) fn parse_query(q: &str) -> BTreeMap<String, String> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match u8::from_str_radix(s.get(i + 1..i + 3).unwrap_or(""), 16) {
                Ok(b) => {
                    out.push(b);
                    i += 2;
                }
                Err(_) => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn kind_param(query: &BTreeMap<String, String>) -> Result<Vec<ServedKind>, WebError> {
    match query.get("kind").map(String::as_str) {
        None | Some("") => Ok(vec![
            ServedKind::Node,
            ServedKind::App,
            ServedKind::Db,
            ServedKind::Kube,
            ServedKind::WindowsDesktop,
        ]),
        Some(k) => k.parse::<ServedKind>().map(|k| vec![k]).map_err(|_| {
            WebError::BadRequest(format!(
                "kind: expected node, app, db, kube_cluster or windows_desktop, not \"{k}\""
            ))
        }),
    }
}

/// Whether `search` (lower case) matches the name, hostname or a label key or value.
fn matches(search: &str, name: &str, hostname: &str, labels: &BTreeMap<String, String>) -> bool {
    search.is_empty()
        || name.to_lowercase().contains(search)
        || hostname.to_lowercase().contains(search)
        || labels
            .iter()
            .any(|(k, v)| k.to_lowercase().contains(search) || v.to_lowercase().contains(search))
}

async fn resources(
    user: &WebUser,
    query: &BTreeMap<String, String>,
    host: &str,
) -> Result<Response<ResponseBody>, WebError> {
    let kinds = kind_param(query)?;
    let search = query
        .get("search")
        .map(|s| s.trim().to_lowercase())
        .unwrap_or_default();
    let mut items = Vec::new();
    for kind in kinds {
        let routes = user
            .with_auth(|mut c| async move { c.list_served(kind, None).await })
            .await?;
        for r in routes {
            let res = &r.resource;
            if !matches(&search, &res.name, &r.hostname, &res.labels) {
                continue;
            }
            let mut item = json!({
                "kind": kind.as_str(),
                "name": res.name,
                "hostname": r.hostname,
                "addr": if res.direct_addr.is_empty() { res.target.clone() } else { res.direct_addr.clone() },
                "labels": res.labels,
            });
            match kind {
                // The logins the user's certificate carries: the roles' logins (the node's own
                // RBAC decides again when a session opens).
                ServedKind::Node => item["logins"] = json!(user.logins),
                ServedKind::App => {
                    item["public_addr"] = json!(res.public_addr);
                    item["launch_url"] = json!(launch_url(&res.name, &res.public_addr, host));
                }
                _ => item["protocol"] = json!(res.protocol),
            }
            items.push(item);
        }
    }
    Ok(json(&json!({ "items": items })))
}

/// Where the browser opens app `name`: its public address, else its subdomain of the proxy's
/// address as the browser reached it.
fn launch_url(name: &str, public_addr: &str, host: &str) -> String {
    if !public_addr.is_empty() {
        return format!("https://{public_addr}/");
    }
    format!("https://{name}.{host}/")
}

/// What `tctl inventory ls` keeps: every given condition must hold.
#[derive(Debug, Default)]
struct InventoryFilter {
    upgrader: Option<String>,
    older_than: Option<Version>,
    newer_than: Option<Version>,
    exact_version: Option<Version>,
    services: Vec<SystemRole>,
}

impl InventoryFilter {
    fn from_query(query: &BTreeMap<String, String>) -> Result<Self, WebError> {
        let version = |field: &str| -> Result<Option<Version>, WebError> {
            match query.get(field).map(|v| v.trim()).filter(|v| !v.is_empty()) {
                None => Ok(None),
                Some(v) => Version::parse(v)
                    .map(Some)
                    .map_err(|e| WebError::BadRequest(format!("{field}: {e}"))),
            }
        };
        let upgrader = match query.get("upgrader").map(|u| u.trim()).filter(|u| !u.is_empty()) {
            None => None,
            Some(u @ ("kube" | "unit" | "none")) => Some(u.to_owned()),
            Some(u) => {
                return Err(WebError::BadRequest(format!(
                    "upgrader: expected kube, unit or none, not \"{u}\""
                )));
            }
        };
        let services = query
            .get("services")
            .map(|s| {
                s.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(|s| {
                        s.parse::<SystemRole>()
                            .map_err(|e| WebError::BadRequest(format!("services: {e}")))
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()?
            .unwrap_or_default();
        Ok(Self {
            upgrader,
            older_than: version("older_than")?,
            newer_than: version("newer_than")?,
            exact_version: version("exact_version")?,
            services,
        })
    }

    fn keeps(&self, row: &InventoryRow) -> bool {
        if self
            .upgrader
            .as_deref()
            .is_some_and(|u| or_none(&row.upgrader) != u)
        {
            return false;
        }
        if !self.services.is_empty()
            && !self
                .services
                .iter()
                .any(|s| row.services.iter().any(|r| r == s.as_str()))
        {
            return false;
        }
        if self.older_than.is_none() && self.newer_than.is_none() && self.exact_version.is_none() {
            return true;
        }
        let Ok(version) = Version::parse(&row.version) else {
            return false;
        };
        self.older_than.as_ref().is_none_or(|v| version < *v)
            && self.newer_than.as_ref().is_none_or(|v| version > *v)
            && self.exact_version.as_ref().is_none_or(|v| version == *v)
    }
}

fn or_none(s: &str) -> &str {
    if s.is_empty() { "none" } else { s }
}

fn unix(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

/// The Update column of `tctl inventory ls` in words, or `None` when the agent reported none.
fn last_update(row: &InventoryRow) -> Option<String> {
    use svc_core::auth::UpdateResult;
    let s = row.update_status.as_ref()?;
    let reason = if s.reason.is_empty() {
        String::new()
    } else {
        format!(": {}", s.reason)
    };
    let when = rfc3339(unix(s.at));
    Some(match s.result {
        UpdateResult::None => format!("none{reason}"),
        UpdateResult::Updated => format!("updated {}→{} at {when}", s.from, s.to),
        UpdateResult::RolledBack => format!("rolled back {}→{} at {when}{reason}", s.from, s.to),
        UpdateResult::Failed => format!("failed {}→{} at {when}{reason}", s.from, s.to),
    })
}

async fn inventory(
    user: &WebUser,
    query: &BTreeMap<String, String>,
) -> Result<Response<ResponseBody>, WebError> {
    let filter = InventoryFilter::from_query(query)?;
    let (rows, status) = user
        .with_auth(|mut c| async move {
            let rows = c.inventory().await?;
            let status = c.status().await?;
            Ok((rows, status))
        })
        .await?;
    let cluster = Version::parse(&status.version).ok();
    let items: Vec<Value> = rows
        .iter()
        .filter(|r| filter.keeps(r))
        .map(|r| {
            let behind = match (&cluster, Version::parse(&r.version)) {
                (Some(c), Ok(v)) => v < *c,
                _ => false,
            };
            json!({
                "server_id": r.server_id,
                "hostname": r.hostname,
                "services": r.services,
                "version": r.version,
                "upgrader": or_none(&r.upgrader),
                "upgrader_version": r.upgrader_version,
                "last_update": last_update(r),
                "next_window": r.next_window.as_ref().map(|w| rfc3339(unix(w.start))),
                "last_seen": rfc3339(unix(r.last_seen)),
                "behind": behind,
            })
        })
        .collect();
    Ok(json(
        &json!({ "cluster_version": status.version, "items": items }),
    ))
}

/// The maintenance document: the resource as `tctl get cluster_maintenance_config --format
/// json` prints it (the singleton with no window when none is stored), plus `next_window`.
async fn maintenance(user: &WebUser) -> Result<Response<ResponseBody>, WebError> {
    let found = user
        .with_auth(|mut c| async move {
            match c.get_resources(Kind::ClusterMaintenanceConfig, None, false).await {
                Ok(list) => Ok(list.into_iter().next()),
                Err(e) if e.is_not_found() => Ok(None),
                Err(e) => Err(e),
            }
        })
        .await?;
    let resource =
        found.unwrap_or_else(|| Resource::ClusterMaintenanceConfig(ClusterMaintenanceConfig::new(None)));
    let next_window = match &resource {
        Resource::ClusterMaintenanceConfig(c) => c
            .spec
            .agent_upgrades
            .as_ref()
            .and_then(|w| w.next_windows(SystemTime::now(), 1).into_iter().next())
            .map(|w| rfc3339(w.start)),
        _ => None,
    };
    let text = resource
        .to_json()
        .map_err(|e| WebError::Upstream(format!("encoding cluster_maintenance_config: {e}")))?;
    let mut doc: Value = serde_json::from_str(&text)
        .map_err(|e| WebError::Upstream(format!("encoding cluster_maintenance_config: {e}")))?;
    if let Some(map) = doc.as_object_mut() {
        map.insert("next_window".into(), json!(next_window));
    }
    Ok(json(&doc))
}

/// Applies the maintenance document as the user (`tctl create -f`); answers the stored
/// document like `GET`.
async fn put_maintenance(user: &WebUser, body: &[u8]) -> Result<Response<ResponseBody>, WebError> {
    let mut doc: Value = serde_json::from_slice(body).map_err(|e| {
        WebError::BadRequest(format!(
            "expected the cluster_maintenance_config JSON document: {e}"
        ))
    })?;
    let Some(map) = doc.as_object_mut() else {
        return Err(WebError::BadRequest(
            "expected the cluster_maintenance_config JSON document (an object)".into(),
        ));
    };
    // What GET adds is not part of the resource.
    map.remove("next_window");
    match map.get("kind").and_then(Value::as_str) {
        Some("cluster_maintenance_config") => {}
        None => {
            map.insert("kind".into(), json!("cluster_maintenance_config"));
        }
        Some(other) => {
            return Err(WebError::BadRequest(format!(
                "kind: expected cluster_maintenance_config, not \"{other}\""
            )));
        }
    }
    let text = doc.to_string();
    user.with_auth(|mut c| async move { c.put_resources(&text, true).await })
        .await?;
    tracing::info!(user = %user.username, "cluster_maintenance_config changed through the web API");
    maintenance(user).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_is_decoded() {
        let q = parse_query("kind=node&search=web%20one&x=a+b&flag");
        assert_eq!(q["kind"], "node");
        assert_eq!(q["search"], "web one");
        assert_eq!(q["x"], "a b");
        assert_eq!(q["flag"], "");
        assert_eq!(parse_query("s=%zz%4")["s"], "%zz%4");
    }

    #[test]
    fn search_matches_name_hostname_and_labels() {
        let labels = BTreeMap::from([("env".to_owned(), "Prod".to_owned())]);
        assert!(matches("", "a", "b", &labels));
        assert!(matches("prod", "a", "b", &labels));
        assert!(matches("env", "a", "b", &labels));
        assert!(matches("web", "Web-1", "b", &labels));
        assert!(matches("host", "a", "myhost", &labels));
        assert!(!matches("dev", "a", "b", &labels));
    }

    #[test]
    fn inventory_filter_as_tctl() {
        let row = |v: &str, u: &str, s: &[&str]| InventoryRow {
            server_id: "id".into(),
            hostname: "h".into(),
            services: s.iter().map(|s| (*s).to_owned()).collect(),
            version: v.into(),
            upgrader: u.into(),
            upgrader_version: String::new(),
            last_seen: 0,
            update_status: None,
            next_window: None,
        };
        let q = |s: &str| InventoryFilter::from_query(&parse_query(s)).expect("filter");
        assert!(q("upgrader=none").keeps(&row("1.0.0", "", &["node"])));
        assert!(!q("upgrader=unit").keeps(&row("1.0.0", "", &["node"])));
        assert!(q("older_than=2.0.0").keeps(&row("1.0.0", "unit", &["node"])));
        assert!(!q("newer_than=2.0.0").keeps(&row("1.0.0", "unit", &["node"])));
        assert!(q("exact_version=1.0.0&services=app,node").keeps(&row("1.0.0", "", &["node"])));
        assert!(!q("services=app").keeps(&row("1.0.0", "", &["node"])));
        assert!(InventoryFilter::from_query(&parse_query("upgrader=apt")).is_err());
        assert!(InventoryFilter::from_query(&parse_query("older_than=x")).is_err());
    }
}
