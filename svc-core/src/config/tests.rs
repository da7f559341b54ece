//! Unit tests of the configuration model; the golden files are in `tests/config_golden.rs`.

use super::*;
use crate::Host;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::from_yaml_str_with_hostname(text, "unit-host")
}

#[test]
fn rendered_default_parses_to_the_default() {
    let text = render_default_commented();
    assert!(text.lines().filter(|l| l.trim_start().starts_with('#')).count() > 20);
    assert_eq!(
        parse(&text).unwrap(),
        Config::all_in_one_default_with_hostname("unit-host")
    );
}

#[test]
fn default_node_name_is_the_host_name_passed_in() {
    assert_eq!(
        Config::all_in_one_default_with_hostname(" box-1\n").svc.nodename,
        "box-1"
    );
    assert_eq!(
        Config::all_in_one_default_with_hostname("").svc.nodename,
        "localhost"
    );
    assert_eq!(
        parse("version: v1\nsvc: {nodename: n2}").unwrap().svc.nodename,
        "n2"
    );
    assert!(!system_hostname().is_empty());
}

#[test]
fn explicit_empty_node_name_is_rejected() {
    assert_eq!(
        parse("version: v1\nsvc: {nodename: ''}").unwrap_err().to_string(),
        "svc.nodename: expected a node name, found an empty string"
    );
}

#[test]
fn proxy_protocol_accepts_bare_and_quoted_on_off() {
    for (text, want) in [
        ("on", ProxyProtocol::On),
        ("\"on\"", ProxyProtocol::On),
        ("off", ProxyProtocol::Off),
        ("'off'", ProxyProtocol::Off),
    ] {
        let c = parse(&format!(
            "version: v1\nproxy_service:\n  proxy_protocol: {text}\n  proxy_protocol_trusted_networks: [10.0.0.0/8]"
        ))
        .unwrap();
        assert_eq!(c.proxy.proxy_protocol, want, "{text}");
        assert_eq!(
            c.proxy.trusted_proxy_networks().len(),
            usize::from(want == ProxyProtocol::On)
        );
    }
}

#[test]
fn yaml_booleans_are_not_on_off() {
    let err = parse("version: v1\nproxy_service: {proxy_protocol: true}").unwrap_err();
    assert_eq!(err.path(), Some("proxy_service.proxy_protocol"));
}

#[test]
fn tunnel_address_follows_the_listener_mode() {
    let sep = "version: v1\nauth_service: {proxy_listener_mode: separate}\n";
    let c = parse(&format!("{sep}proxy_service: {{public_addr: p.example.com:443}}")).unwrap();
    assert_eq!(c.proxy.tunnel_addr(), Addr::parse("127.0.0.1:3024").unwrap());
    let c = parse(&format!(
        "{sep}proxy_service: {{ssh_public_addr: s.example.com:22, tunnel_public_addr: t.example.com}}"
    ))
    .unwrap();
    assert_eq!(c.proxy.tunnel_addr(), Addr::parse("t.example.com:3024").unwrap());
    let c = parse(&format!(
        "{sep}proxy_service: {{ssh_public_addr: s.example.com:22}}"
    ))
    .unwrap();
    assert_eq!(c.proxy.tunnel_addr(), Addr::parse("s.example.com:3024").unwrap());
    let c = parse("version: v1\nproxy_service: {web_listen_addr: 0.0.0.0:443}").unwrap();
    assert_eq!(c.proxy.tunnel_addr(), Addr::parse("0.0.0.0:443").unwrap());
}

#[test]
fn all_in_one_agents_dial_the_local_proxy() {
    for (listen, want) in [
        ("0.0.0.0:443", "127.0.0.1:443"),
        ("'[::]:3443'", "[::1]:3443"),
        ("10.1.1.1", "10.1.1.1:3080"),
    ] {
        let c = parse(&format!(
            "version: v1\nproxy_service: {{web_listen_addr: {listen}}}"
        ))
        .unwrap();
        assert_eq!(c.svc.proxy_server, Some(Addr::parse(want).unwrap()), "{listen}");
    }
    // A lone agent (no Auth Service, no proxy here) dials a proxy on this host.
    let c = parse(
        "version: v1\nauth_service: {enabled: false}\nproxy_service: {enabled: false, web_listen_addr: 0.0.0.0:443}",
    )
    .unwrap();
    assert_eq!(c.svc.proxy_server, Some(Addr::parse("127.0.0.1:3080").unwrap()));
    // The Auth Service here without a proxy: the local agent joins it directly.
    let c = parse("version: v1\nproxy_service: {enabled: false, web_listen_addr: 0.0.0.0:443}").unwrap();
    assert_eq!(c.svc.proxy_server, None);
}

#[test]
fn join_targets() {
    let c = parse("version: v1\nsvc: {proxy_server: p.example.com}").unwrap();
    assert_eq!(
        c.svc.proxy_server,
        Some(Addr::parse("p.example.com:3080").unwrap())
    );
    assert!(c.svc.auth_servers.is_empty());
    let c = parse("version: v1\nsvc: {auth_server: a.example.com}").unwrap();
    assert_eq!(c.svc.proxy_server, None);
    assert_eq!(c.svc.auth_servers, [Addr::parse("a.example.com:3025").unwrap()]);
}

#[test]
fn secrets_stay_out_of_debug_and_errors() {
    let c = parse("version: v1\nsvc: {auth_token: s3cr3t-token}").unwrap();
    assert!(!format!("{c:?}").contains("s3cr3t"));
    let err = parse("version: v1\nsvc: {auth_token: s3cr3t-token, bogus: 1}").unwrap_err();
    assert!(!err.to_string().contains("s3cr3t"), "{err}");
    // A token YAML reads as a number is kept as written, never quoted in an error.
    let c = parse("version: v1\nsvc: {auth_token: 8675309}").unwrap();
    assert_eq!(c.svc.auth_token.unwrap().expose(), "8675309");
    let err = parse("version: v1\nsvc: {auth_token: 8675.309}").unwrap_err();
    assert!(!err.to_string().contains("8675"), "{err}");
    assert_eq!(
        parse("version: v1\nsvc: {auth_token: ~}").unwrap().svc.auth_token,
        None
    );
}

#[test]
fn durations_are_human_and_positive() {
    let c = parse("version: v1\nauth_service: {keep_alive_interval: 45s}").unwrap();
    assert_eq!(c.auth.keep_alive_interval, std::time::Duration::from_secs(45));
    assert_eq!(
        parse("version: v1\nauth_service: {keep_alive_interval: 0s}")
            .unwrap_err()
            .to_string(),
        "auth_service.keep_alive_interval: invalid duration \"0s\": must be greater than zero"
    );
    assert_eq!(
        parse("version: v1\nauth_service: {keep_alive_count_max: 0}")
            .unwrap_err()
            .to_string(),
        "auth_service.keep_alive_count_max: expected a count of at least 1, found 0"
    );
}

#[test]
fn authentication_limits_are_strict() {
    let c =
        parse("version: v1\nauth_service: {authentication: {max_login_attempts: 2, lockout_duration: 90s}}")
            .unwrap();
    assert_eq!(c.auth.authentication.max_login_attempts, 2);
    assert_eq!(c.auth.authentication.max_source_attempts, 20);
    assert_eq!(
        c.auth.authentication.lockout_duration,
        std::time::Duration::from_secs(90)
    );
    for (yaml, want) in [
        (
            "{max_login_attempts: 0}",
            "auth_service.authentication.max_login_attempts: expected a count of at least 1, found 0",
        ),
        (
            "{max_source_attempts: 0}",
            "auth_service.authentication.max_source_attempts: expected a count of at least 1, found 0",
        ),
        (
            "{lockout_duration: 0s}",
            "auth_service.authentication.lockout_duration: invalid duration \"0s\": must be greater than zero",
        ),
    ] {
        let text = format!("version: v1\nauth_service: {{authentication: {yaml}}}");
        assert_eq!(parse(&text).unwrap_err().to_string(), want, "{yaml}");
    }
    let e = parse("version: v1\nauth_service: {authentication: {max_login_attempts: -1}}").unwrap_err();
    assert!(
        e.to_string()
            .starts_with("auth_service.authentication.max_login_attempts: "),
        "{e}"
    );
    let e = parse("version: v1\nauth_service: {authentication: {second_factor: otp}}").unwrap_err();
    assert!(e.to_string().contains("unknown field `second_factor`"), "{e}");
}

#[test]
fn names_and_labels_are_checked() {
    let err = parse("version: v1\napp_service:\n  apps: [{name: Bad_Name, uri: 'http://a'}]").unwrap_err();
    assert_eq!(err.path(), Some("app_service.apps[0].name"));
    let err = parse("version: v1\nssh_service: {labels: {'bad key': x}}").unwrap_err();
    assert_eq!(err.path(), Some("ssh_service.labels.bad key"));
    let err = parse("version: v1\nauth_service: {cluster_name: 'a b'}").unwrap_err();
    assert_eq!(err.path(), Some("auth_service.cluster_name"));
    let err =
        parse("version: v1\nwindows_desktop_service:\n  hosts: [{name: d, addr: a}, {name: d, addr: b}]")
            .unwrap_err();
    assert_eq!(
        err.to_string(),
        "windows_desktop_service.hosts[1].name: duplicate desktop host name \"d\", already used by windows_desktop_service.hosts[0].name"
    );
}

#[test]
fn app_public_addr_is_a_host_and_kube_defaults() {
    let c = parse(
        "version: v1\napp_service:\n  apps: [{name: g, uri: 'tcp://10.0.0.1:5000', public_addr: G.Example.com}]\nkubernetes_service: {enabled: true}",
    )
    .unwrap();
    assert_eq!(
        c.app.apps[0].public_addr,
        Some(Host::Name("g.example.com".into()))
    );
    assert_eq!(c.kube.kube_cluster_name, "svc.local");
    assert_eq!(c.kube.api_url, None);
    let err = parse("version: v1\nkubernetes_service: {api_url: 'kubernetes.default'}").unwrap_err();
    assert_eq!(err.path(), Some("kubernetes_service.api_url"));
}

#[test]
fn connection_limits_default_and_bounds() {
    let c = parse("version: v1\n").unwrap();
    assert_eq!(c.auth.connection_limits.max_connections, 16_384);
    assert_eq!(c.proxy.connection_limits.max_connections, 16_384);
    let c = parse(
        "version: v1\nauth_service: {connection_limits: {max_connections: 100000}}\nproxy_service: {connection_limits: {max_connections: 3}}",
    )
    .unwrap();
    assert_eq!(c.auth.connection_limits.max_connections, 100_000);
    assert_eq!(c.proxy.connection_limits.max_connections, 3);
    for (text, path) in [
        (
            "proxy_service: {connection_limits: {max_connections: 0}}",
            "proxy_service.connection_limits.max_connections",
        ),
        (
            "auth_service: {connection_limits: {max_connections: 99999999999}}",
            "auth_service.connection_limits.max_connections",
        ),
    ] {
        let err = parse(&format!("version: v1\n{text}")).unwrap_err();
        assert_eq!(err.path(), Some(path), "{err}");
        assert!(err.to_string().contains("from 1 to 16777216"), "{err}");
    }
    let err = parse("version: v1\nproxy_service: {connection_limits: {max_users: 3}}").unwrap_err();
    assert!(err.to_string().contains("max_users"), "{err}");
}

#[test]
fn parse_error_prefix_is_not_doubled() {
    assert_eq!(
        strip_parent_path("a.b[0].c", "a.b[0]: unknown field `c`".into()),
        "unknown field `c`"
    );
    assert_eq!(strip_parent_path("a.b", "a.b: wrong".into()), "wrong");
    assert_eq!(strip_parent_path(".", "plain".into()), "plain");
    assert_eq!(strip_parent_path("x", "y: z".into()), "y: z");
}

#[test]
fn arbitrary_text_never_panics() {
    for text in [
        "",
        "\0",
        "version: [",
        "version: v1\nsvc: {auth_server: [1, {a: b}]}",
        "*a",
        "version: v1\n---\nversion: v1",
    ] {
        let _ = parse(text);
    }
}

#[test]
fn direct_dial_loopback_is_an_explicit_opt_in() {
    let c = parse("version: v1\n").unwrap();
    assert!(!c.auth.direct_dial.allow_loopback, "off by default");
    let c = parse("version: v1\nauth_service: {direct_dial: {allow_loopback: true}}").unwrap();
    assert!(c.auth.direct_dial.allow_loopback);
    let c = parse("version: v1\nauth_service: {direct_dial: {allow_loopback: false}}").unwrap();
    assert!(!c.auth.direct_dial.allow_loopback);
    let err = parse("version: v1\nauth_service: {direct_dial: {allow_any: true}}").unwrap_err();
    assert!(err.to_string().contains("allow_any"), "{err}");
    let err = parse("version: v1\nauth_service: {direct_dial: {allow_loopback: yes}}").unwrap_err();
    assert!(err.to_string().contains("allow_loopback"), "{err}");
}

#[test]
fn idle_timeouts_default_and_validate() {
    let c = parse("version: v1").unwrap();
    assert_eq!(c.proxy.web_idle_timeout, std::time::Duration::from_secs(90));
    assert_eq!(c.proxy.shutdown_drain_timeout, std::time::Duration::from_secs(30));
    assert_eq!(c.auth.grpc_idle_timeout, std::time::Duration::from_secs(600));
    let c =
        parse("version: v1\nproxy_service: {web_idle_timeout: 2m}\nauth_service: {grpc_idle_timeout: 30s}")
            .unwrap();
    assert_eq!(c.proxy.web_idle_timeout, std::time::Duration::from_secs(120));
    assert_eq!(c.auth.grpc_idle_timeout, std::time::Duration::from_secs(30));
    let err = parse("version: v1\nproxy_service: {web_idle_timeout: 0s}")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("proxy_service.web_idle_timeout") && err.contains("greater than zero"),
        "{err}"
    );
    let err = parse("version: v1\nauth_service: {grpc_idle_timeout: soon}")
        .unwrap_err()
        .to_string();
    assert!(err.contains("auth_service.grpc_idle_timeout"), "{err}");
}

#[test]
fn etcd_storage_defaults_and_files() {
    let c = parse(
        "version: v1\nauth_service: {cluster_name: example.com, storage: {type: etcd, peers: [http://127.0.0.1:2379]}}",
    )
    .unwrap();
    let StorageConfig::Etcd(etcd) = &c.auth.storage else {
        panic!("expected etcd storage, got {:?}", c.auth.storage);
    };
    assert_eq!(
        etcd.prefix, "/svc/example.com",
        "the default prefix names the cluster"
    );
    assert_eq!(etcd.peers, ["http://127.0.0.1:2379"]);
}

#[cfg(feature = "etcd")]
#[test]
fn etcd_storage_reads_its_files_and_hides_the_password() {
    let dir = tempfile::tempdir().unwrap();
    let password = dir.path().join("password");
    std::fs::write(&password, "s3cret-etcd-pw\n").unwrap();
    let yaml = format!(
        "version: v1\nauth_service: {{storage: {{type: etcd, peers: [http://127.0.0.1:2379], username: svc, password_file: {}}}}}",
        password.display()
    );
    let c = parse(&yaml).unwrap();
    let StorageConfig::Etcd(etcd) = &c.auth.storage else {
        panic!("expected etcd storage");
    };
    let options = etcd.options().unwrap();
    let debug = format!("{options:?}");
    assert!(!debug.contains("s3cret"), "no password in Debug: {debug}");
    assert!(debug.contains("\"svc\""), "the user name is shown: {debug}");

    let missing = dir.path().join("absent.pem");
    let yaml = format!(
        "version: v1\nauth_service: {{storage: {{type: etcd, peers: [https://127.0.0.1:2379], tls_ca_file: {}}}}}",
        missing.display()
    );
    let c = parse(&yaml).unwrap();
    let StorageConfig::Etcd(etcd) = &c.auth.storage else {
        panic!("expected etcd storage");
    };
    let err = etcd.options().unwrap_err().to_string();
    assert!(
        err.starts_with("auth_service.storage.tls_ca_file: cannot read") && err.contains("absent.pem"),
        "{err}"
    );
}

#[test]
fn the_shutdown_drain_timeout_parses_and_must_be_positive() {
    let c = parse("version: v1\nproxy_service: {shutdown_drain_timeout: 2m 30s}").unwrap();
    assert_eq!(
        c.proxy.shutdown_drain_timeout,
        std::time::Duration::from_secs(150)
    );
    for bad in ["0s", "soon"] {
        let err = parse(&format!(
            "version: v1\nproxy_service: {{shutdown_drain_timeout: {bad}}}"
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("proxy_service.shutdown_drain_timeout"), "{err}");
    }
}

#[test]
fn tunnel_strategy_defaults_to_the_agent_mesh_and_validates_peering() {
    assert_eq!(
        parse("version: v1").unwrap().auth.tunnel_strategy,
        TunnelStrategy::AgentMesh
    );
    let c = parse(
        "version: v1\nauth_service: {tunnel_strategy: {type: proxy_peering, agent_connection_count: 2}}",
    )
    .unwrap();
    assert_eq!(
        c.auth.tunnel_strategy,
        TunnelStrategy::ProxyPeering {
            agent_connection_count: 2
        }
    );
    assert_eq!(c.auth.tunnel_strategy.agent_connection_count(), Some(2));
    let c = parse("version: v1\nauth_service: {tunnel_strategy: {type: proxy_peering}}").unwrap();
    assert_eq!(c.auth.tunnel_strategy.agent_connection_count(), Some(1));
    for (yaml, path) in [
        (
            "{type: proxy_peering, agent_connection_count: 0}",
            "auth_service.tunnel_strategy.agent_connection_count",
        ),
        (
            "{type: agent_mesh, agent_connection_count: 2}",
            "auth_service.tunnel_strategy.agent_connection_count",
        ),
        ("{type: peering}", "auth_service.tunnel_strategy.type"),
    ] {
        let err = parse(&format!("version: v1\nauth_service: {{tunnel_strategy: {yaml}}}"))
            .unwrap_err()
            .to_string();
        assert!(err.contains(path), "{yaml}: {err}");
    }
}
