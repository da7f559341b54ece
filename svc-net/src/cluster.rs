//! One `svc` process from one configuration: the Auth Service, the Proxy Service and the
//! local agent of an all-in-one cluster, or a standalone agent joining a cluster run elsewhere.
//!
//! Order at [`Cluster::start`]: the Auth Service ([`AuthServer`]) → the Proxy Service
//! ([`ProxyServer`]) → when any agent service is enabled (`ssh_service` by default; apps,
//! databases, Kubernetes, desktops), an agent in the same process ([`AgentNode`]) with a host
//! identity issued in-process, behind a reverse tunnel to the local proxy's web address
//! (through `HTTPS_PROXY`/`NO_PROXY` like any agent). With `auth_service` disabled and
//! `proxy_service` enabled, the process is a Proxy Service apart from the Auth Service
//! ([`ProxyServer::start_joined`]: joined with a `proxy` token at `svc.auth_server`). With
//! `auth_service` and `proxy_service` disabled, the process is a standalone agent instead.
//!
//! ```no_run
//! # async fn run() -> Result<(), svc_net::NodeError> {
//! let config = svc_core::config::Config::all_in_one_default();
//! let running = svc_net::Cluster::from_config(&config).start().await?;
//! if let Some(proxy) = &running.proxy {
//!     println!("web: https://{}", proxy.addrs().web);
//! }
//! running.shutdown().await;
//! # Ok(()) }
//! ```

use std::sync::Arc;

use svc_core::Addr;
use svc_core::config::Config;

use crate::agent::node::{
    AgentNode, IdentityStore, RunningNode, ScheduleSink, UpdateStatusSource, agent_principals, agent_roles,
};
use crate::auth::NodeError;
use crate::auth::node::{AuthServer, RunningAuth, dialable};
use crate::proxy::RunningProxy;
use crate::proxy::node::ProxyServer;

/// One process's services, configured and not yet started.
pub struct Cluster {
    config: Config,
    tunnel_override: Option<Addr>,
    insecure: bool,
    sinks: Vec<Arc<dyn ScheduleSink>>,
    update_status: Option<Arc<dyn UpdateStatusSource>>,
    identity_store: Option<Arc<dyn IdentityStore>>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("cluster_name", &self.config.cluster_name())
            .field("tunnel_override", &self.tunnel_override)
            .field("insecure", &self.insecure)
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// What `config` enables.
    pub fn from_config(config: &Config) -> Self {
        Cluster {
            config: config.clone(),
            tunnel_override: None,
            insecure: false,
            sinks: Vec::new(),
            update_status: None,
            identity_store: None,
        }
    }

    /// The tunnel address the ping advertises instead of the configured one
    /// (`SVC_TUNNEL_PUBLIC_ADDR`).
    pub fn tunnel_public_addr_override(mut self, addr: Option<Addr>) -> Self {
        self.tunnel_override = addr;
        self
    }

    /// A standalone agent accepts any TLS certificate from the proxy (`svc start --insecure`).
    pub fn insecure(mut self, insecure: bool) -> Self {
        self.insecure = insecure;
        self
    }

    /// The agent also exports its maintenance schedule to `sink` (the Kubernetes shared-state
    /// Secret).
    pub fn schedule_sink(mut self, sink: Arc<dyn ScheduleSink>) -> Self {
        self.sinks.push(sink);
        self
    }

    /// The agent reads its updater's status from `source` (the Kubernetes shared-state Secret)
    /// instead of the Linux updater's `status` file.
    pub fn update_status_source(mut self, source: Arc<dyn UpdateStatusSource>) -> Self {
        self.update_status = Some(source);
        self
    }

    /// A standalone agent keeps its host identity in `store` (the Kubernetes per-replica Secret)
    /// instead of its data directory. Ignored when this process runs the Auth Service, which
    /// issues its local agent's identity itself (logged).
    pub fn identity_store(mut self, store: Arc<dyn IdentityStore>) -> Self {
        self.identity_store = Some(store);
        self
    }

    fn agent(&self) -> AgentNode {
        let mut node = AgentNode::from_config(&self.config).insecure(self.insecure);
        for sink in &self.sinks {
            node = node.schedule_sink(sink.clone());
        }
        if let Some(source) = &self.update_status {
            node = node.update_status_source(source.clone());
        }
        if let Some(store) = &self.identity_store {
            if self.config.auth.enabled {
                tracing::warn!(store = %store.describe(), "ignoring the identity store: this process runs the Auth Service, which issues its local agent's identity itself");
            } else {
                node = node.identity_store(store.clone());
            }
        }
        node
    }

    /// Starts what the configuration enables; returns once it listens (and the local agent's
    /// first tunnel is up, within a bounded wait).
    pub async fn start(self) -> Result<RunningCluster, NodeError> {
        let config = &self.config;
        if !config.auth.enabled {
            if config.proxy.enabled {
                if !agent_roles(config).is_empty() {
                    return Err(NodeError::Config(format!(
                        "a Proxy Service apart from the Auth Service runs no agent service in its process, but {} enabled; disable them (ssh_service.enabled: false, ...) and run the agent as its own process",
                        agent_roles(config)
                            .iter()
                            .map(|r| format!("the {} service is", r.as_str()))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )));
                }
                let proxy = ProxyServer::from_config(config)
                    .tunnel_public_addr_override(self.tunnel_override.clone())
                    .insecure(self.insecure)
                    .host_cert_ttl(host_cert_ttl_from_env()?)
                    .start_joined()
                    .await?;
                return Ok(RunningCluster {
                    cluster: proxy.settings().ping.cluster_name.clone(),
                    auth: None,
                    proxy: Some(proxy),
                    node: None,
                });
            }
            let node = self.agent().start().await?;
            let cluster = node
                .host_id
                .split_once('.')
                .map(|(_, c)| c.to_owned())
                .unwrap_or_default();
            return Ok(RunningCluster {
                cluster,
                auth: None,
                proxy: None,
                node: Some(node),
            });
        }
        let auth = AuthServer::from_config(config).start().await?;
        let proxy = if config.proxy.enabled {
            Some(
                ProxyServer::from_config(config)
                    .tunnel_public_addr_override(self.tunnel_override.clone())
                    .start(&auth)
                    .await?,
            )
        } else {
            None
        };
        let node = if agent_roles(config).is_empty() {
            None
        } else {
            let name = config.svc.nodename.clone();
            // A new host ID every start: take the name over from the previous run at once.
            auth.service.release_node_name(&name).await?;
            let identity = auth.host_identity_named(&name, agent_roles(config), agent_principals(config))?;
            let node = self.agent().identity(identity);
            let node = match &proxy {
                Some(proxy) => {
                    let ca_pem = match proxy.ca_file() {
                        Some(ca) => Some(std::fs::read(ca).map_err(|e| NodeError::file("reading", ca, e))?),
                        None => None,
                    };
                    node.proxy(Addr::from(dialable(proxy.addrs().web)), ca_pem)
                        // The updater asks this cluster's own proxy, never a global server.
                        .version_endpoint(crate::agent::node::version_endpoint(
                            config.proxy.web_public_addr(),
                        ))
                }
                // No proxy in this process: the agent tunnels to `svc.proxy_server` when one is
                // set, else it joins this Auth Service directly and opens its own listeners.
                None => node,
            };
            Some(node.start().await?)
        };
        Ok(RunningCluster {
            cluster: auth.cluster().to_owned(),
            auth: Some(auth),
            proxy,
            node,
        })
    }
}

/// The environment variable asking a Proxy Service apart from the Auth Service for host
/// certificates of this lifetime in seconds when it renews them: for tests of renewal; unset,
/// the Auth Service's join lifetime.
pub const HOST_CERT_TTL_ENV: &str = "SVC_HOST_CERT_TTL";

fn host_cert_ttl_from_env() -> Result<Option<std::time::Duration>, NodeError> {
    match std::env::var(HOST_CERT_TTL_ENV) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse::<u64>()
            .map(|s| Some(std::time::Duration::from_secs(s)))
            .map_err(|e| NodeError::Config(format!("{HOST_CERT_TTL_ENV}={v:?}: expected seconds: {e}"))),
        _ => Ok(None),
    }
}

/// A running `svc` process: the cluster's services, an agent, or both.
pub struct RunningCluster {
    /// The cluster name.
    pub cluster: String,
    /// The Auth Service, when it runs here.
    pub auth: Option<RunningAuth>,
    /// The Proxy Service, when it runs here.
    pub proxy: Option<RunningProxy>,
    /// The agent: the local agent of an all-in-one process, or a standalone agent.
    pub node: Option<RunningNode>,
}

impl std::fmt::Debug for RunningCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningCluster")
            .field("cluster", &self.cluster)
            .field("auth", &self.auth)
            .field("proxy", &self.proxy.as_ref().map(|p| p.addrs().web))
            .field("node", &self.node)
            .finish()
    }
}

impl RunningCluster {
    /// Stops the agent, then the proxy (draining), then the Auth API.
    pub async fn shutdown(self) {
        if let Some(node) = self.node {
            node.shutdown().await;
        }
        if let Some(proxy) = self.proxy {
            proxy.shutdown().await;
        }
        if let Some(auth) = self.auth {
            auth.shutdown().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::node::proxy_settings;
    use crate::tls::TlsSource;
    use std::path::PathBuf;

    #[test]
    fn the_configuration_maps_onto_the_proxy_settings() {
        let yaml = "version: v1\nsvc:\n  data_dir: /srv/svc\nauth_service:\n  cluster_name: example.com\n  proxy_listener_mode: separate\nproxy_service:\n  public_addr: proxy.example.com:443\n  web_listen_addr: 0.0.0.0:3080\n  tunnel_listen_addr: 0.0.0.0:3024\n  tunnel_public_addr: tunnel.example.com:3024\n  listen_addr: 0.0.0.0:3023\n  ssh_public_addr: ssh.example.com:3023\n  kube_listen_addr: 0.0.0.0:3026\n  postgres_listen_addr: 0.0.0.0:5432\n  mysql_listen_addr: 0.0.0.0:3036\n  automatic_upgrades_channels:\n    stable/cloud:\n      static_version: v17.0.1\n";
        let config = Config::from_yaml_str_with_hostname(yaml, "h").unwrap();
        let s = proxy_settings(
            &config,
            Some(Addr::parse_with_default_port("override:443", 3024).unwrap()),
        );
        assert_eq!(s.ping.cluster_name, "example.com");
        assert!(!s.ping.listener_mode.tls_routing());
        assert_eq!(s.ping.web_listen_addr.to_string(), "0.0.0.0:3080");
        assert_eq!(
            s.ping
                .web_public_addr
                .as_ref()
                .map(ToString::to_string)
                .as_deref(),
            Some("proxy.example.com:443")
        );
        assert_eq!(
            s.ping
                .ssh_public_addr
                .as_ref()
                .map(ToString::to_string)
                .as_deref(),
            Some("ssh.example.com:3023")
        );
        assert_eq!(
            s.ping
                .tunnel_public_addr
                .as_ref()
                .map(ToString::to_string)
                .as_deref(),
            Some("tunnel.example.com:3024")
        );
        assert_eq!(
            s.ping
                .tunnel_public_addr_override
                .as_ref()
                .map(ToString::to_string)
                .as_deref(),
            Some("override:443")
        );
        assert!(s.ping.kube_enabled);
        assert!(s.ping.db.postgres_listen_addr.is_some() && s.ping.db.mysql_listen_addr.is_some());
        assert!(s.channels.contains_key("stable/cloud"));
        assert!(s.ping.automatic_upgrades);
        assert_eq!(
            s.tls,
            TlsSource::Generated {
                data_dir: PathBuf::from("/srv/svc")
            }
        );
    }

    #[test]
    fn svc_configure_prints_the_all_in_one_default() {
        let text = svc_core::config::render_default_commented();
        let parsed = Config::from_yaml_str_with_hostname(&text, "h").unwrap();
        assert_eq!(parsed, Config::all_in_one_default_with_hostname("h"));
    }
}
