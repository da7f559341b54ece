//! `tsh kube login`: a kubeconfig that points `kubectl` at a Kubernetes cluster through the
//! proxy — the proxy's web address (in separate listener mode its Kubernetes listener,
//! `kube_listen_addr`, when it has one) with the TLS server name
//! `kube-svc-proxy-alpn.<cluster>` (the proxy routes on it) and the user's certificate and key
//! from the `tsh` profile.

use base64::Engine;

use super::{Error, Profile};
use crate::route::alpn::KUBE_SNI_PREFIX;

/// The kubeconfig (JSON, which kubectl reads like YAML) for `cluster` with the profile's
/// identity. The CA given to `tsh login --cacert` verifies the proxy; without one, a profile
/// signed in with `--insecure` skips the check, as `tsh` itself does; otherwise the system
/// roots verify it.
pub fn kubeconfig(profile: &Profile, cluster: &str) -> Result<String, Error> {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
    let context = format!("{}-{cluster}", profile.identity.cluster);
    let mut cluster_entry = serde_json::json!({
        "server": format!("https://{}", profile.kube_proxy_addr.as_ref().unwrap_or(&profile.proxy)),
        "tls-server-name": format!("{KUBE_SNI_PREFIX}{cluster}"),
    });
    if let Some(pem) = &profile.ca_pem {
        // `tsh login --cacert`: kubectl trusts the same CA.
        cluster_entry["certificate-authority-data"] = serde_json::Value::String(b64(pem));
    } else if profile.insecure {
        cluster_entry["insecure-skip-tls-verify"] = serde_json::Value::Bool(true);
    }
    let config = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": context, "cluster": cluster_entry}],
        "users": [{"name": context, "user": {
            "client-certificate-data": b64(&profile.identity.tls_cert_pem),
            "client-key-data": b64(profile.identity.tls_key_pem.expose()),
        }}],
        "contexts": [{"name": context, "context": {"cluster": context, "user": context}}],
        "current-context": context,
    });
    Ok(serde_json::to_string_pretty(&config)?)
}

/// Writes the kubeconfig for `cluster` ([`kubeconfig`]) to `out`, by default
/// `<profile dir>/kube/<cluster>.kubeconfig`, with mode 0600 (a missing directory is created
/// 0700); returns the path, for `export KUBECONFIG=<path>`.
pub fn write_kubeconfig(
    profile: &Profile,
    cluster: &str,
    out: Option<std::path::PathBuf>,
) -> Result<std::path::PathBuf, Error> {
    let text = kubeconfig(profile, cluster)?;
    let path = match out {
        Some(p) => p,
        None => super::home()?.join("kube").join(format!("{cluster}.kubeconfig")),
    };
    super::write_private(&path, text.as_bytes())?;
    Ok(path)
}
