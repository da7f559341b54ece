//! An in-process fake Kubernetes API server, just faithful enough for the updater and `kubectl`.
//!
//! It speaks plain HTTP on `127.0.0.1:0` and serves: discovery (`/api`, `/apis`, `/api/v1`,
//! `/apis/apps/v1`, `/apis/coordination.k8s.io/v1`, `/version`); get, list (label and field
//! selectors), watch (from a `resourceVersion`, with `410 Gone` for one older than the last
//! compaction), create, update (guarded by `resourceVersion`), delete, JSON merge patch and
//! strategic-merge patch (maps merge; `containers`, `env`, `volumes`, … merge by their keys) for
//! Pods, Secrets, Deployments, StatefulSets and Leases; and the pod subresources `exec`
//! (WebSocket, the command running on this machine), `portforward` (SPDY/3.1, to this
//! machine's ports) and `log` (following) — see [`pods`] and [`spdy`]. Every request is recorded so tests can
//! assert that a resource was *not* written. [`FakeApiServer::kubelet`] stands in for the
//! workload controllers and the kubelet where a test needs pods to follow an image change. The
//! same server is exercised by the real `kubectl`
//! in `kube_fake_apiserver.rs`, which keeps it honest.

#![allow(dead_code, unreachable_pub)]

mod pods;
mod spdy;

use std::{
    collections::BTreeMap,
    convert::Infallible,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use futures_util::stream;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Map, Value, json};
use tokio::{net::TcpListener, sync::watch};

type Body = BoxBody<Bytes, Infallible>;

/// A resource type the fake serves.
#[derive(Debug, Clone, Copy)]
struct ResDef {
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    short: &'static [&'static str],
}

impl ResDef {
    fn group_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

const RESOURCES: &[ResDef] = &[
    ResDef {
        group: "",
        version: "v1",
        plural: "pods",
        singular: "pod",
        kind: "Pod",
        short: &["po"],
    },
    ResDef {
        group: "",
        version: "v1",
        plural: "secrets",
        singular: "secret",
        kind: "Secret",
        short: &[],
    },
    ResDef {
        group: "apps",
        version: "v1",
        plural: "deployments",
        singular: "deployment",
        kind: "Deployment",
        short: &["deploy"],
    },
    ResDef {
        group: "apps",
        version: "v1",
        plural: "statefulsets",
        singular: "statefulset",
        kind: "StatefulSet",
        short: &["sts"],
    },
    ResDef {
        group: "coordination.k8s.io",
        version: "v1",
        plural: "leases",
        singular: "lease",
        kind: "Lease",
        short: &[],
    },
];

fn find_res(group: &str, version: &str, plural: &str) -> Option<ResDef> {
    RESOURCES
        .iter()
        .copied()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// One request as the fake saw it.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// HTTP method.
    pub method: String,
    /// Path without the query.
    pub path: String,
    /// The raw query string.
    pub query: String,
    /// The Content-Type header, if any.
    pub content_type: String,
    /// The Upgrade header (`websocket`, `SPDY/3.1`), if any.
    pub upgrade: String,
}

#[derive(Debug, Clone)]
struct Event {
    rv: u64,
    plural: &'static str,
    namespace: String,
    kind: &'static str,
    object: Value,
}

#[derive(Default)]
struct Inner {
    rv: u64,
    /// (plural, namespace, name) → object.
    objects: BTreeMap<(&'static str, String, String), Value>,
    events: Vec<Event>,
    /// Watches from a resourceVersion below this get 410 Gone.
    compacted: u64,
    requests: Vec<Recorded>,
    uid: u64,
    /// Watches answered with 410 Gone.
    gone: usize,
    /// Watches that have sent their initial state and wait for changes.
    open_watches: usize,
    /// (namespace, pod) → its log lines.
    logs: BTreeMap<(String, String), Vec<String>>,
}

struct State {
    inner: Mutex<Inner>,
    /// The latest resourceVersion, for watchers to wait on.
    rv_tx: watch::Sender<u64>,
    /// Bumped to end every open watch (as an API server restart would).
    epoch_tx: watch::Sender<u64>,
    /// Bumped when a log line is appended, for followers.
    log_tx: watch::Sender<u64>,
}

/// A running fake API server.
pub struct FakeApiServer {
    /// Where it listens.
    pub addr: SocketAddr,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeApiServer {
    /// Starts the server on `127.0.0.1:0`; it is ready when this returns.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let state = Arc::new(State {
            inner: Mutex::new(Inner {
                rv: 1,
                ..Inner::default()
            }),
            rv_tx: watch::channel(1).0,
            epoch_tx: watch::channel(0).0,
            log_tx: watch::channel(0).0,
        });
        let st = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let st = st.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let st = st.clone();
                        async move { Ok::<_, Infallible>(handle(st, req).await) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection_with_upgrades(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { addr, state, task }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kube-rs client for this server, default namespace `namespace`.
    pub fn client(&self, namespace: &str) -> kube::Client {
        let mut config = kube::Config::new(self.url().parse().expect("url"));
        config.default_namespace = namespace.to_owned();
        kube::Client::try_from(config).expect("kube client")
    }

    /// A kubeconfig file for `kubectl` pointing here.
    pub fn kubeconfig(&self, namespace: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: {namespace}\n\
             current-context: fake\nusers:\n- name: fake\n  user:\n    token: fake-token\n",
            self.url()
        )
    }

    /// Stores an object as a client's create would (kind decides the resource type).
    pub fn insert(&self, object: Value) -> Value {
        let kind = object["kind"].as_str().expect("kind").to_owned();
        let res = *RESOURCES.iter().find(|r| r.kind == kind).expect("known kind");
        let namespace = object["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_owned();
        let mut inner = self.state.inner.lock().unwrap();
        let result = create(&mut inner, res, &namespace, object);
        let rv = inner.rv;
        drop(inner);
        self.state.rv_tx.send_replace(rv);
        result.expect("insert")
    }

    /// The stored object, if any.
    pub fn get(&self, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        let res = RESOURCES.iter().find(|r| r.kind == kind)?;
        let inner = self.state.inner.lock().unwrap();
        inner
            .objects
            .get(&(res.plural, namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// Replaces a stored object's fields by a JSON merge patch, as another client would
    /// (emits a MODIFIED event).
    pub fn merge(&self, kind: &str, namespace: &str, name: &str, patch: Value) -> Value {
        let res = *RESOURCES.iter().find(|r| r.kind == kind).expect("known kind");
        let mut inner = self.state.inner.lock().unwrap();
        let result = patch_object(&mut inner, res, namespace, name, &patch, false);
        let rv = inner.rv;
        drop(inner);
        self.state.rv_tx.send_replace(rv);
        result.expect("merge")
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.state.inner.lock().unwrap().requests.clone()
    }

    /// Requests with `method` whose path ends with `suffix`.
    pub fn count(&self, method: &str, suffix: &str) -> usize {
        self.requests()
            .iter()
            .filter(|r| r.method == method && r.path.ends_with(suffix))
            .count()
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.state.inner.lock().unwrap().rv
    }

    /// Forgets the event history: watches from any older resourceVersion now get 410 Gone.
    pub fn compact(&self) {
        let mut inner = self.state.inner.lock().unwrap();
        inner.compacted = inner.rv;
        inner.events.clear();
    }

    /// How many watches have been opened (initial state sent, subscribed to changes).
    pub fn open_watches(&self) -> usize {
        self.state.inner.lock().unwrap().open_watches
    }

    /// How many watches were answered with 410 Gone.
    pub fn gone_watches(&self) -> usize {
        self.state.inner.lock().unwrap().gone
    }

    /// Stands in for the StatefulSet/Deployment controller and the kubelet of workload
    /// `kind`/`namespace`/`name`: once its pod template's image differs from the one it had
    /// when this was called, it keeps `spec.replicas` pods `<name>-<i>` (the template's labels
    /// and containers) on the current template, each `Ready` as `ready(image of container
    /// `container`)` says — recreated whenever the template changes or a pod is deleted. Runs
    /// until the returned task is aborted.
    pub fn kubelet(
        &self,
        kind: &'static str,
        namespace: &str,
        name: &str,
        container: &str,
        ready: impl Fn(&str) -> bool + Send + Sync + 'static,
    ) -> tokio::task::JoinHandle<()> {
        let res = *RESOURCES.iter().find(|r| r.kind == kind).expect("known kind");
        let pods = *RESOURCES.iter().find(|r| r.kind == "Pod").expect("pods");
        let state = self.state.clone();
        let (namespace, name, container) = (namespace.to_owned(), name.to_owned(), container.to_owned());
        let key = (res.plural, namespace.clone(), name.clone());
        let template_of = move |state: &State| {
            let inner = state.inner.lock().unwrap();
            inner.objects.get(&key).map(|w| {
                (
                    w["spec"]["template"].clone(),
                    w["spec"]["replicas"].as_u64().unwrap_or(1),
                )
            })
        };
        let initial = template_of(&state).map(|(t, _)| t);
        let image_of = move |template: &Value| {
            template["spec"]["containers"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["name"] == container.as_str()))
                .and_then(|c| c["image"].as_str())
                .unwrap_or_default()
                .to_owned()
        };
        let workload = name.clone();
        tokio::spawn(async move {
            let mut active = false;
            let mut rx = state.rv_tx.subscribe();
            loop {
                let Some((template, replicas)) = template_of(&state) else {
                    return;
                };
                active |= Some(&template) != initial.as_ref();
                if active {
                    let image = image_of(&template);
                    let mut inner = state.inner.lock().unwrap();
                    for i in 0..replicas {
                        let pod_name = format!("{workload}-{i}");
                        let key = (pods.plural, namespace.clone(), pod_name.clone());
                        if inner
                            .objects
                            .get(&key)
                            .is_some_and(|p| p["spec"] == template["spec"])
                        {
                            continue;
                        }
                        if inner.objects.contains_key(&key) {
                            let _ = delete(&mut inner, pods, &namespace, &pod_name);
                        }
                        let since = now_rfc3339();
                        let pod = json!({
                            "apiVersion": "v1", "kind": "Pod",
                            "metadata": {"name": pod_name, "namespace": namespace,
                                         "labels": template["metadata"]["labels"].clone()},
                            "spec": template["spec"].clone(),
                            "status": {"conditions": [{"type": "Ready",
                                "status": if ready(&image) { "True" } else { "False" },
                                "reason": if ready(&image) { "" } else { "ContainersNotReady" },
                                "lastTransitionTime": since}]}
                        });
                        let _ = create(&mut inner, pods, &namespace, pod);
                    }
                    let rv = inner.rv;
                    drop(inner);
                    state.rv_tx.send_replace(rv);
                }
                // Any write is a reason to look again; a timer bounds a missed wake-up.
                let _ = tokio::time::timeout(Duration::from_millis(200), rx.changed()).await;
            }
        })
    }

    /// Appends `line` to the log of pod `namespace/pod` (`kubectl logs`, followers get it at once).
    pub fn append_log(&self, namespace: &str, pod: &str, line: &str) {
        self.state
            .inner
            .lock()
            .unwrap()
            .logs
            .entry((namespace.to_owned(), pod.to_owned()))
            .or_default()
            .push(line.to_owned());
        self.state.log_tx.send_modify(|n| *n += 1);
    }

    /// Ends every open watch stream, as an API server restart would.
    pub fn disconnect_watches(&self) {
        self.state.epoch_tx.send_modify(|e| *e += 1);
    }
}

fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .expect("zero nanoseconds")
        .format(&time::format_description::well_known::Rfc3339)
        .expect("rfc3339")
}

fn status(code: StatusCode, reason: &str, message: String) -> Response<Body> {
    json_response(
        code,
        &json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code.as_u16()
        }),
    )
}

fn json_response(code: StatusCode, value: &Value) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(value.to_string())).boxed());
    *response.status_mut() = code;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    response
}

fn query_params(query: &str) -> BTreeMap<String, String> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

/// Percent-decoding of a query component (`+` is a space).
fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn discovery_resources(gv: &str) -> Option<Value> {
    let resources: Vec<Value> = RESOURCES
        .iter()
        .filter(|r| r.group_version() == gv)
        .map(|r| {
            json!({
                "name": r.plural, "singularName": r.singular, "namespaced": true, "kind": r.kind,
                "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
                "shortNames": r.short,
            })
        })
        .collect();
    if resources.is_empty() {
        return None;
    }
    Some(json!({ "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources }))
}

async fn handle(state: Arc<State>, req: Request<Incoming>) -> Response<Body> {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    state.inner.lock().unwrap().requests.push(Recorded {
        method: method.to_string(),
        path: path.clone(),
        query: query.clone(),
        content_type: content_type.clone(),
        upgrade: req
            .headers()
            .get(header::UPGRADE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned(),
    });
    if let Some((ns, name, sub)) = pods::subresource(&path) {
        return pods::serve(state, req, &ns, &name, &sub).await;
    }
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()),
    };
    let params = query_params(&query);

    // Discovery.
    match (method.clone(), path.as_str()) {
        (Method::GET, "/version") => {
            return json_response(
                StatusCode::OK,
                &json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0", "platform": "linux/amd64"}),
            );
        }
        (Method::GET, "/api") => {
            return json_response(
                StatusCode::OK,
                &json!({"kind": "APIVersions", "versions": ["v1"],
                        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}),
            );
        }
        (Method::GET, "/apis") => {
            let groups: Vec<Value> = ["apps", "coordination.k8s.io"]
                .iter()
                .map(|g| {
                    let gv = json!({"groupVersion": format!("{g}/v1"), "version": "v1"});
                    json!({"name": g, "versions": [gv.clone()], "preferredVersion": gv})
                })
                .collect();
            return json_response(
                StatusCode::OK,
                &json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}),
            );
        }
        (Method::GET, "/api/v1") => {
            return json_response(StatusCode::OK, &discovery_resources("v1").expect("core"));
        }
        _ => {}
    }
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    // /api/v1/... or /apis/<group>/<version>/...
    let (group, version, rest) = match segments.as_slice() {
        ["api", "v1", rest @ ..] => ("", "v1", rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => {
            return status(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("the server could not find the requested resource: {path}"),
            );
        }
    };
    if rest.is_empty() && method == Method::GET {
        let gv = if group.is_empty() {
            version.to_owned()
        } else {
            format!("{group}/{version}")
        };
        return match discovery_resources(&gv) {
            Some(list) => json_response(StatusCode::OK, &list),
            None => status(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("no group version {gv}"),
            ),
        };
    }
    let (namespace, plural, name) = match rest {
        ["namespaces", ns, plural] => (Some(*ns), *plural, None),
        ["namespaces", ns, plural, name] => (Some(*ns), *plural, Some(*name)),
        [plural] => (None, *plural, None),
        _ => {
            return status(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("the server could not find the requested resource: {path}"),
            );
        }
    };
    let Some(res) = find_res(group, version, plural) else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("the server doesn't have a resource type \"{plural}\""),
        );
    };

    match (method, name) {
        (Method::GET, None) => {
            if matches!(params.get("watch").map(String::as_str), Some("true" | "1")) {
                watch_response(state, res, namespace.map(str::to_owned), &params)
            } else {
                let inner = state.inner.lock().unwrap();
                let items: Vec<Value> = inner
                    .objects
                    .iter()
                    .filter(|((p, ns, _), obj)| {
                        *p == res.plural && namespace.is_none_or(|n| n == ns) && selected(obj, &params)
                    })
                    .map(|(_, o)| o.clone())
                    .collect();
                json_response(
                    StatusCode::OK,
                    &json!({"kind": format!("{}List", res.kind), "apiVersion": res.group_version(),
                            "metadata": {"resourceVersion": inner.rv.to_string()}, "items": items}),
                )
            }
        }
        (Method::GET, Some(name)) => {
            let inner = state.inner.lock().unwrap();
            match inner.objects.get(&(
                res.plural,
                namespace.unwrap_or("default").to_owned(),
                name.to_owned(),
            )) {
                Some(obj) => json_response(StatusCode::OK, obj),
                None => not_found(res, name),
            }
        }
        (Method::POST, None) => {
            let Some(ns) = namespace else {
                return status(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "MethodNotAllowed",
                    "create needs a namespace".into(),
                );
            };
            let object: Value = match serde_json::from_slice(&body) {
                Ok(v) => v,
                Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", format!("body: {e}")),
            };
            commit(&state, |inner| {
                create(inner, res, ns, object).map(|o| (StatusCode::CREATED, o))
            })
        }
        (Method::PUT, Some(name)) => {
            let object: Value = match serde_json::from_slice(&body) {
                Ok(v) => v,
                Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", format!("body: {e}")),
            };
            let ns = namespace.unwrap_or("default");
            commit(&state, |inner| {
                replace(inner, res, ns, name, object).map(|o| (StatusCode::OK, o))
            })
        }
        (Method::PATCH, Some(name)) => {
            let patch: Value = match serde_json::from_slice(&body) {
                Ok(v) => v,
                Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", format!("body: {e}")),
            };
            let strategic = match content_type.split(';').next().unwrap_or("").trim() {
                "application/merge-patch+json" => false,
                "application/strategic-merge-patch+json" => true,
                other => {
                    return status(
                        StatusCode::UNSUPPORTED_MEDIA_TYPE,
                        "UnsupportedMediaType",
                        format!("the fake serves merge and strategic-merge patches, got \"{other}\""),
                    );
                }
            };
            let ns = namespace.unwrap_or("default");
            commit(&state, |inner| {
                patch_object(inner, res, ns, name, &patch, strategic).map(|o| (StatusCode::OK, o))
            })
        }
        (Method::DELETE, Some(name)) => {
            let ns = namespace.unwrap_or("default");
            commit(&state, |inner| {
                delete(inner, res, ns, name).map(|o| (StatusCode::OK, o))
            })
        }
        (m, _) => status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            format!("{m} {path}"),
        ),
    }
}

type Failure = (StatusCode, &'static str, String);

fn commit(
    state: &State,
    op: impl FnOnce(&mut Inner) -> Result<(StatusCode, Value), Failure>,
) -> Response<Body> {
    let mut inner = state.inner.lock().unwrap();
    let result = op(&mut inner);
    let rv = inner.rv;
    drop(inner);
    state.rv_tx.send_replace(rv);
    match result {
        Ok((code, obj)) => json_response(code, &obj),
        Err((code, reason, message)) => status(code, reason, message),
    }
}

fn not_found(res: ResDef, name: &str) -> Response<Body> {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("{} \"{name}\" not found", res.plural),
    )
}

fn record(inner: &mut Inner, res: ResDef, namespace: &str, kind: &'static str, object: &Value) {
    inner.events.push(Event {
        rv: inner.rv,
        plural: res.plural,
        namespace: namespace.to_owned(),
        kind,
        object: object.clone(),
    });
}

fn stamp(inner: &mut Inner, object: &mut Value) {
    inner.rv += 1;
    object["metadata"]["resourceVersion"] = Value::String(inner.rv.to_string());
}

fn create(inner: &mut Inner, res: ResDef, namespace: &str, mut object: Value) -> Result<Value, Failure> {
    let Some(name) = object["metadata"]["name"].as_str().map(str::to_owned) else {
        return Err((
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            "metadata.name: Required value".into(),
        ));
    };
    let key = (res.plural, namespace.to_owned(), name.clone());
    if inner.objects.contains_key(&key) {
        return Err((
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", res.plural),
        ));
    }
    inner.uid += 1;
    object["apiVersion"] = Value::String(res.group_version());
    object["kind"] = Value::String(res.kind.to_owned());
    let meta = &mut object["metadata"];
    meta["namespace"] = Value::String(namespace.to_owned());
    meta["uid"] = Value::String(format!("00000000-0000-0000-0000-{:012}", inner.uid));
    if meta.get("creationTimestamp").is_none_or(Value::is_null) {
        meta["creationTimestamp"] = Value::String(now_rfc3339());
    }
    meta["generation"] = json!(1);
    stamp(inner, &mut object);
    record(inner, res, namespace, "ADDED", &object);
    inner.objects.insert(key, object.clone());
    Ok(object)
}

fn replace(
    inner: &mut Inner,
    res: ResDef,
    namespace: &str,
    name: &str,
    mut object: Value,
) -> Result<Value, Failure> {
    let key = (res.plural, namespace.to_owned(), name.to_owned());
    let Some(old) = inner.objects.get(&key).cloned() else {
        return Err((
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("{} \"{name}\" not found", res.plural),
        ));
    };
    check_version(res, name, &old, &object)?;
    for field in ["uid", "creationTimestamp", "namespace", "name"] {
        object["metadata"][field] = old["metadata"][field].clone();
    }
    object["apiVersion"] = Value::String(res.group_version());
    object["kind"] = Value::String(res.kind.to_owned());
    finish_update(inner, res, namespace, key, &old, object)
}

fn check_version(res: ResDef, name: &str, old: &Value, new: &Value) -> Result<(), Failure> {
    match new["metadata"]["resourceVersion"].as_str() {
        Some(rv) if Some(rv) != old["metadata"]["resourceVersion"].as_str() => Err((
            StatusCode::CONFLICT,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                res.plural
            ),
        )),
        _ => Ok(()),
    }
}

fn finish_update(
    inner: &mut Inner,
    res: ResDef,
    namespace: &str,
    key: (&'static str, String, String),
    old: &Value,
    mut object: Value,
) -> Result<Value, Failure> {
    let generation = old["metadata"]["generation"].as_i64().unwrap_or(1);
    object["metadata"]["generation"] = json!(if object["spec"] != old["spec"] {
        generation + 1
    } else {
        generation
    });
    stamp(inner, &mut object);
    record(inner, res, namespace, "MODIFIED", &object);
    inner.objects.insert(key, object.clone());
    Ok(object)
}

fn patch_object(
    inner: &mut Inner,
    res: ResDef,
    namespace: &str,
    name: &str,
    patch: &Value,
    strategic: bool,
) -> Result<Value, Failure> {
    let key = (res.plural, namespace.to_owned(), name.to_owned());
    let Some(old) = inner.objects.get(&key).cloned() else {
        return Err((
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("{} \"{name}\" not found", res.plural),
        ));
    };
    check_version(res, name, &old, patch)?;
    let mut object = old.clone();
    merge(&mut object, patch, strategic);
    for field in ["uid", "creationTimestamp", "namespace", "name", "resourceVersion"] {
        object["metadata"][field] = old["metadata"][field].clone();
    }
    finish_update(inner, res, namespace, key, &old, object)
}

fn delete(inner: &mut Inner, res: ResDef, namespace: &str, name: &str) -> Result<Value, Failure> {
    let key = (res.plural, namespace.to_owned(), name.to_owned());
    let Some(mut object) = inner.objects.remove(&key) else {
        return Err((
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("{} \"{name}\" not found", res.plural),
        ));
    };
    stamp(inner, &mut object);
    record(inner, res, namespace, "DELETED", &object);
    Ok(object)
}

/// The key by which strategic merge matches list elements, for the lists the fake knows.
fn merge_key(field: &str) -> Option<&'static str> {
    match field {
        "containers" | "initContainers" | "ephemeralContainers" | "env" | "volumes" | "imagePullSecrets" => {
            Some("name")
        }
        "volumeMounts" => Some("mountPath"),
        "ports" => Some("containerPort"),
        _ => None,
    }
}

/// JSON merge patch (RFC 7386), or strategic merge when `strategic`: lists with a known merge
/// key merge element by element (`$patch: delete` removes one) instead of being replaced.
fn merge(target: &mut Value, patch: &Value, strategic: bool) {
    let Value::Object(patch_map) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(target_map) = target else { return };
    for (key, value) in patch_map {
        if value.is_null() {
            target_map.remove(key);
            continue;
        }
        if strategic && key.starts_with("$") {
            continue;
        }
        match (
            strategic.then(|| merge_key(key)).flatten(),
            value,
            target_map.get_mut(key),
        ) {
            (Some(mk), Value::Array(items), Some(Value::Array(existing))) => {
                for item in items {
                    let id = &item[mk];
                    let position = existing.iter().position(|e| &e[mk] == id);
                    let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
                    match (position, delete) {
                        (Some(i), true) => {
                            existing.remove(i);
                        }
                        (Some(i), false) => merge(&mut existing[i], item, true),
                        (None, true) => {}
                        (None, false) => {
                            let mut fresh = Value::Object(Map::new());
                            merge(&mut fresh, item, true);
                            existing.push(fresh);
                        }
                    }
                }
            }
            _ => {
                let slot = target_map.entry(key.clone()).or_insert(Value::Null);
                if value.is_object() {
                    merge(slot, value, strategic);
                } else {
                    *slot = value.clone();
                }
            }
        }
    }
}

fn labels_match(labels: &Value, selector: &str) -> bool {
    selector.split(',').filter(|s| !s.trim().is_empty()).all(|req| {
        let req = req.trim();
        if let Some((k, v)) = req.split_once("!=") {
            labels[k.trim()].as_str() != Some(v.trim())
        } else if let Some((k, v)) = req.split_once("==").or_else(|| req.split_once('=')) {
            labels[k.trim()].as_str() == Some(v.trim())
        } else if let Some(k) = req.strip_prefix('!') {
            labels.get(k).is_none()
        } else {
            labels.get(req).is_some()
        }
    })
}

fn fields_match(object: &Value, selector: &str) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|req| {
        let (neg, (k, v)) = match req.split_once("!=") {
            Some(kv) => (true, kv),
            None => (
                false,
                req.split_once("==")
                    .or_else(|| req.split_once('='))
                    .unwrap_or((req, "")),
            ),
        };
        let actual = match k {
            "metadata.name" => object["metadata"]["name"].as_str(),
            "metadata.namespace" => object["metadata"]["namespace"].as_str(),
            _ => None,
        };
        (actual == Some(v)) != neg
    })
}

fn selected(object: &Value, params: &BTreeMap<String, String>) -> bool {
    params
        .get("labelSelector")
        .is_none_or(|s| labels_match(&object["metadata"]["labels"], s))
        && params
            .get("fieldSelector")
            .is_none_or(|s| fields_match(object, s))
}

fn watch_response(
    state: Arc<State>,
    res: ResDef,
    namespace: Option<String>,
    params: &BTreeMap<String, String>,
) -> Response<Body> {
    let params = params.clone();
    let from: Option<u64> = params
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .filter(|v| *v != 0);
    let timeout = params
        .get("timeoutSeconds")
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_secs(1800), Duration::from_secs);
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(256);
    let mut rv_rx = state.rv_tx.subscribe();
    let mut epoch_rx = state.epoch_tx.subscribe();
    epoch_rx.mark_unchanged();
    tokio::spawn(async move {
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let line = |kind: &str, object: &Value| {
            Bytes::from(format!("{}\n", json!({"type": kind, "object": object})))
        };
        let wanted = |plural: &str, ns: &str, object: &Value| {
            plural == res.plural && namespace.as_deref().is_none_or(|n| n == ns) && selected(object, &params)
        };
        let mut last = {
            let mut inner = state.inner.lock().unwrap();
            let last = match from {
                Some(rv) if rv < inner.compacted => {
                    inner.gone += 1;
                    let gone = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": format!("too old resource version: {rv} ({})", inner.compacted),
                        "reason": "Expired", "code": 410});
                    let _ = tx.try_send(line("ERROR", &gone));
                    return;
                }
                Some(rv) => rv,
                None => {
                    // No resourceVersion: start with the current state as ADDED events.
                    for ((plural, ns, _), object) in &inner.objects {
                        if wanted(plural, ns, object) && tx.try_send(line("ADDED", object)).is_err() {
                            return;
                        }
                    }
                    inner.rv
                }
            };
            inner.open_watches += 1;
            last
        };
        loop {
            let batch: Vec<Bytes> = {
                let inner = state.inner.lock().unwrap();
                let batch = inner
                    .events
                    .iter()
                    .filter(|e| e.rv > last && wanted(e.plural, &e.namespace, &e.object))
                    .map(|e| line(e.kind, &e.object))
                    .collect();
                last = inner.rv;
                batch
            };
            for event in batch {
                if tx.send(event).await.is_err() {
                    return;
                }
            }
            tokio::select! {
                changed = rv_rx.changed() => if changed.is_err() { return },
                _ = epoch_rx.changed() => return,
                _ = &mut deadline => return,
                _ = tx.closed() => return,
            }
        }
    });
    let body = StreamBody::new(stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    }));
    let mut response = Response::new(BodyExt::boxed(body));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategic_merge_by_container_name() {
        let mut obj =
            json!({"spec": {"containers": [{"name": "a", "image": "x:1"}, {"name": "b", "image": "y:1"}]}});
        merge(
            &mut obj,
            &json!({"spec": {"containers": [{"name": "b", "image": "y:2"}]}}),
            true,
        );
        assert_eq!(obj["spec"]["containers"][0]["image"], "x:1");
        assert_eq!(obj["spec"]["containers"][1]["image"], "y:2");
        merge(
            &mut obj,
            &json!({"spec": {"containers": [{"name": "b", "image": "y:3"}]}}),
            false,
        );
        assert_eq!(obj["spec"]["containers"].as_array().unwrap().len(), 1);
    }
}
