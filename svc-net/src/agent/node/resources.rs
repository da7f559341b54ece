//! What an agent runs, from its configuration: which roles its certificate needs, what its
//! heartbeat announces, and the one dial service its tunnel (or direct listener) serves — SSH
//! plus the Application, Database, Kubernetes and Windows Desktop services, dispatched by
//! connection type. The services themselves are in [`crate::agent::services`] and [`crate::agent::ssh`].

use svc_core::auth::{ServedKind, ServedResource};
use svc_core::config::Config;
use svc_core::identity::SystemRole;

use crate::agent::services::{AgentServices, app_service, db_service, desktop_service, kube_service, router};
use crate::auth::NodeError;
use crate::tunnel::DialService;

/// The system roles an agent running `config`'s services needs in its certificate: `node`
/// when the SSH Service runs, and one per enabled resource service.
pub fn agent_roles(config: &Config) -> Vec<SystemRole> {
    [
        (config.ssh.enabled, SystemRole::Node),
        (config.app.enabled, SystemRole::App),
        (config.db.enabled, SystemRole::Db),
        (config.kube.enabled, SystemRole::Kube),
        (config.windows_desktop.enabled, SystemRole::WindowsDesktop),
    ]
    .into_iter()
    .filter_map(|(on, role)| on.then_some(role))
    .collect()
}

/// The extra names of the agent's host certificate: the hosts of `ssh_service.public_addr`
/// (when the SSH Service runs), so `ssh` and `tsh` accept the node's certificate under them.
/// IP addresses are given bare (no brackets); duplicates are dropped.
pub fn agent_principals(config: &Config) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    if !config.ssh.enabled {
        return names;
    }
    for addr in &config.ssh.public_addrs {
        let host = addr
            .host()
            .ip()
            .map_or_else(|| addr.host().to_string(), |ip| ip.to_string());
        if !names.contains(&host) {
            names.push(host);
        }
    }
    names
}

/// What the agent's heartbeat announces: its SSH Service, and every app, database, Kubernetes
/// cluster and desktop of the enabled services, with their labels.
pub fn served_resources(config: &Config) -> Vec<ServedResource> {
    let mut out = Vec::new();
    if config.ssh.enabled {
        // The SSH Service itself, for `tsh ls` (filtered by `node_labels`); a directly joined
        // agent adds its listener as `direct_addr`.
        let mut r = ServedResource::new(ServedKind::Node, config.svc.nodename.clone());
        r.labels = config.ssh.labels.clone();
        r.protocol = "ssh".into();
        out.push(r);
    }
    if config.app.enabled {
        for app in &config.app.apps {
            let mut r = ServedResource::new(ServedKind::App, app.name.clone());
            r.labels = app.labels.clone();
            r.target = app.uri.clone();
            r.protocol = app.uri.split("://").next().unwrap_or_default().to_owned();
            r.public_addr = app
                .public_addr
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default();
            out.push(r);
        }
    }
    if config.db.enabled {
        for db in &config.db.databases {
            let mut r = ServedResource::new(ServedKind::Db, db.name.clone());
            r.labels = db.labels.clone();
            r.target = db.uri.to_string();
            r.protocol = db.protocol.as_str().to_owned();
            out.push(r);
        }
    }
    if config.kube.enabled {
        let mut r = ServedResource::new(ServedKind::Kube, config.kube.kube_cluster_name.clone());
        r.labels = config.kube.labels.clone();
        r.target = config.kube.api_url.clone().unwrap_or_default();
        r.protocol = "https".into();
        out.push(r);
    }
    if config.windows_desktop.enabled {
        for host in &config.windows_desktop.hosts {
            let mut r = ServedResource::new(ServedKind::WindowsDesktop, host.name.clone());
            r.labels = host.labels.clone();
            r.target = host.addr.to_string();
            r.protocol = "rdp".into();
            out.push(r);
        }
    }
    out
}

/// The agent's one dial service: `ssh` for node connections (when the SSH Service runs) and
/// the enabled resource services.
pub fn agent_dial_service(config: &Config, ssh: DialService) -> Result<DialService, NodeError> {
    let mut services = AgentServices::default();
    if config.ssh.enabled {
        services.node = Some(ssh);
    }
    if config.app.enabled {
        services.app = Some(app_service(&config.app.apps).map_err(|e| NodeError::setup("app_service", e))?);
    }
    if config.db.enabled {
        services.db = Some(db_service(&config.db.databases).map_err(|e| NodeError::setup("db_service", e))?);
    }
    if config.kube.enabled {
        services.kube =
            Some(kube_service(&config.kube).map_err(|e| NodeError::setup("kubernetes_service", e))?);
    }
    if config.windows_desktop.enabled {
        services.windows_desktop = Some(desktop_service(&config.windows_desktop.hosts));
    }
    Ok(router(services))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_and_resources_follow_the_enabled_services() {
        let yaml = "version: v1\napp_service:\n  enabled: true\n  apps:\n  - name: web\n    uri: https://web.example.com\n    labels: {env: dev}\ndb_service:\n  enabled: true\n  databases:\n  - name: pg\n    protocol: postgres\n    uri: db.example.com\nwindows_desktop_service:\n  enabled: false\n  hosts:\n  - name: win\n    addr: 10.0.0.5\n";
        let config = Config::from_yaml_str_with_hostname(yaml, "h").unwrap();
        assert_eq!(
            agent_roles(&config),
            [SystemRole::Node, SystemRole::App, SystemRole::Db]
        );
        let served = served_resources(&config);
        assert_eq!(served.len(), 3);
        assert_eq!(
            (served[0].kind, served[0].name.as_str()),
            (Some(ServedKind::Node), "h")
        );
        assert_eq!(served[1].protocol, "https");
        assert_eq!(served[1].labels["env"], "dev");
        assert_eq!(served[2].target, "db.example.com:5432");
        assert_eq!(served[2].protocol, "postgres");
    }
}
