//! Golden configuration files: every `testdata/config/valid/*.yaml` loads, and every
//! `testdata/config/invalid/NAME.yaml` fails with exactly the text in `NAME.err`.
//!
//! All files are checked before the test fails, and the failure lists each file that did not
//! match. `SVC_BLESS=1` writes missing `.err` files from the current output, for review.

use std::{
    fs,
    net::{IpAddr, Ipv4Addr},
    path::{Path, PathBuf},
    time::Duration,
};

use svc_core::{
    Addr, Version,
    channel::ChannelSpec,
    config::{
        Config, ConfigError, DbProtocol, ListenerMode, LogOutput, LogSeverity, ProxyProtocol, StorageConfig,
    },
};

const HOST: &str = "golden-host";

fn dir(kind: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/config")
        .join(kind)
}

fn yaml_files(kind: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir(kind))
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir(kind).display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

fn load(path: &Path) -> Result<Config, ConfigError> {
    Config::from_yaml_str_with_hostname(&fs::read_to_string(path).unwrap(), HOST)
}

fn addr(s: &str) -> Addr {
    Addr::parse(s).unwrap()
}

#[test]
fn invalid_files_fail_with_the_golden_message() {
    let bless = std::env::var_os("SVC_BLESS").is_some();
    let files = yaml_files("invalid");
    assert!(
        files.len() >= 13,
        "expected the invalid golden files, found {}",
        files.len()
    );
    let mut failures = Vec::new();
    for file in &files {
        let name = file.file_stem().unwrap().to_string_lossy().into_owned();
        let err_file = file.with_extension("err");
        let got = match load(file) {
            Ok(_) => {
                failures.push(format!("{name}: loaded, but an error was expected"));
                continue;
            }
            Err(e) => e.to_string(),
        };
        match fs::read_to_string(&err_file) {
            Ok(want) if want.trim_end_matches('\n') == got => {}
            Ok(want) => failures.push(format!(
                "{name}:\n  want: {}\n  got:  {got}",
                want.trim_end_matches('\n')
            )),
            Err(_) if bless => fs::write(&err_file, format!("{got}\n")).unwrap(),
            Err(_) => failures.push(format!("{name}: no {name}.err; got: {got}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} invalid golden files did not match:\n{}",
        failures.len(),
        files.len(),
        failures.join("\n")
    );
}

#[test]
fn valid_files_load() {
    let files = yaml_files("valid");
    let failures: Vec<String> = files
        .iter()
        .filter_map(|f| load(f).err().map(|e| format!("{}: {e}", f.display())))
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} valid golden files failed:\n{}",
        failures.len(),
        files.len(),
        failures.join("\n")
    );
}

fn valid(name: &str) -> Config {
    load(&dir("valid").join(format!("{name}.yaml"))).unwrap()
}

#[test]
fn minimal_is_the_all_in_one_default() {
    let c = valid("minimal");
    assert_eq!(c, Config::all_in_one_default_with_hostname(HOST));
    assert_eq!(c.svc.nodename, HOST);
    assert_eq!(c.cluster_name(), "svc.local");
    assert_eq!(
        c.auth.storage,
        StorageConfig::Embedded,
        "the embedded store is the default"
    );
    assert_eq!(c.listener_mode(), ListenerMode::Multiplex);
    assert!(c.auth.enabled && c.proxy.enabled && c.ssh.enabled);
    assert!(!c.app.enabled && !c.db.enabled && !c.kube.enabled && !c.windows_desktop.enabled);
    for (a, want) in [
        (&c.auth.listen_addr, "127.0.0.1:3025"),
        (&c.proxy.web_listen_addr, "127.0.0.1:3080"),
        (&c.proxy.tunnel_listen_addr, "127.0.0.1:3024"),
        (&c.proxy.ssh_listen_addr, "127.0.0.1:3023"),
        (&c.proxy.peer_listen_addr, "127.0.0.1:3021"),
        (&c.ssh.listen_addr, "127.0.0.1:3022"),
        (&c.kube.listen_addr, "127.0.0.1:3026"),
        (&c.windows_desktop.listen_addr, "127.0.0.1:3028"),
    ] {
        assert_eq!(a, &addr(want));
        assert!(a.is_loopback());
    }
    assert_eq!(c.svc.proxy_server, Some(addr("127.0.0.1:3080")));
    assert_eq!(c.proxy.tunnel_addr(), addr("127.0.0.1:3080"));
    assert_eq!(c.svc.data_dir, Path::new("/var/lib/svc"));
    assert_eq!(c.auth.keep_alive_interval, Duration::from_secs(300));
    assert_eq!(c.auth.keep_alive_count_max, 3);
    assert_eq!(c.auth.authentication.max_login_attempts, 5);
    assert_eq!(c.auth.authentication.max_source_attempts, 20);
    assert_eq!(
        c.auth.authentication.lockout_duration,
        Duration::from_secs(30 * 60)
    );
    assert!(c.proxy.channels().is_empty());
    assert!(c.proxy.trusted_proxy_networks().is_empty());
    assert_eq!(c.proxy.public_addr, None);
    assert_eq!(c.proxy.db.postgres_listen_addr, None);
}

#[test]
fn separate_mode_uses_per_service_ports() {
    let c = valid("separate-mode");
    assert_eq!(c.proxy.listener_mode, ListenerMode::Separate);
    assert!(!c.listener_mode().tls_routing());
    assert_eq!(c.proxy.public_addr, Some(addr("proxy.example.com:3080")));
    assert_eq!(c.proxy.tunnel_listen_addr, addr("0.0.0.0:3024"));
    assert_eq!(c.proxy.ssh_public_addr, Some(addr("proxy.example.com:3023")));
    assert_eq!(c.proxy.kube_listen_addr, Some(addr("0.0.0.0:3026")));
    assert_eq!(c.proxy.kube_public_addr, Some(addr("proxy.example.com:3026")));
    assert_eq!(c.proxy.db.postgres_listen_addr, Some(addr("0.0.0.0:5432")));
    assert_eq!(c.proxy.db.mysql_public_addr, Some(addr("proxy.example.com:3036")));
    assert_eq!(c.proxy.db.mongo_listen_addr, Some(addr("[::]:27017")));
    assert_eq!(c.proxy.db.redis_listen_addr, Some(addr("[::]:6379")));
    assert_eq!(c.proxy.db.mongo_public_addr, None);
    // No tunnel_public_addr: the SSH public address with the tunnel port.
    assert_eq!(c.proxy.tunnel_addr(), addr("proxy.example.com:3024"));
}

#[test]
fn channels_are_validated_into_specs() {
    let c = valid("channels");
    let ch = c.proxy.channels();
    assert_eq!(
        ch.keys().map(String::as_str).collect::<Vec<_>>(),
        ["default", "frozen", "hotfix", "stable/cloud", "upstream"]
    );
    assert_eq!(
        ch["stable/cloud"],
        ChannelSpec::Static {
            version: Some(Version::new(17, 0, 0)),
            critical: false
        }
    );
    assert_eq!(
        ch["frozen"],
        ChannelSpec::Static {
            version: None,
            critical: false
        }
    );
    assert_eq!(
        ch["hotfix"],
        ChannelSpec::Static {
            version: Some(Version::new(17, 0, 2)),
            critical: true
        }
    );
    assert_eq!(
        ch["upstream"],
        ChannelSpec::Forward {
            url: "https://updates.example.com/v1/webapi/automaticupgrades/channel/stable/cloud".into()
        }
    );
}

#[test]
fn public_addr_as_string_or_one_element_list() {
    let s = valid("public-addr-string");
    let l = valid("public-addr-list");
    assert_eq!(s.proxy.public_addr, Some(addr("proxy.example.com:443")));
    assert_eq!(s, l);
    assert_eq!(s.proxy.web_public_addr(), &addr("proxy.example.com:443"));
    assert_eq!(s.proxy.tunnel_addr(), addr("proxy.example.com:443"));
}

#[test]
fn agent_joining_the_auth_service_directly() {
    let c = valid("agent-joins-auth");
    assert_eq!(c.svc.nodename, "node-7");
    assert_eq!(c.svc.proxy_server, None);
    assert_eq!(
        c.svc.auth_servers,
        [addr("auth-1.example.com:3025"), addr("auth-2.example.com:4025")]
    );
    let token = c.svc.auth_token.as_ref().unwrap();
    assert_eq!(token.expose(), "join-token-value");
    assert!(
        !format!("{c:?}").contains("join-token-value"),
        "the token leaked into Debug"
    );
    assert_eq!(
        c.svc.ca_pins,
        ["sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"]
    );
    assert!(!c.auth.enabled && !c.proxy.enabled && c.ssh.enabled);
    assert_eq!(c.ssh.listen_addr, addr("0.0.0.0:3022"));
    assert_eq!(c.ssh.public_addrs, [addr("node-7.example.com:3022")]);
    assert_eq!(c.ssh.labels["env"], "prod");
}

#[test]
fn full_file_sets_every_section() {
    let c = valid("full");
    assert_eq!(c.svc.log.output, LogOutput::File("/var/log/svc.log".into()));
    assert_eq!(c.svc.log.severity, LogSeverity::Debug);
    assert_eq!(c.svc.diag_addr, Some(addr("127.0.0.1:3000")));
    assert_eq!(c.auth.keep_alive_interval, Duration::from_secs(90));
    let limits = c.auth.authentication.limits();
    assert_eq!(
        (
            limits.max_user_failures,
            limits.max_source_failures,
            limits.lockout
        ),
        (3, 50, Duration::from_secs(3600))
    );
    assert_eq!(c.auth.connection_limits.max_connections, 65_536);
    assert_eq!(c.proxy.connection_limits.max_connections, 250_000);
    match &c.auth.storage {
        StorageConfig::Etcd(etcd) => {
            assert_eq!(etcd.peers.len(), 3);
            assert_eq!(etcd.peers[0], "https://etcd1.example.com:2379");
            assert_eq!(etcd.prefix, "/svc/example.com");
            assert_eq!(
                etcd.tls_ca_file.as_deref(),
                Some(Path::new("/etc/svc/etcd-ca.pem"))
            );
            assert_eq!(
                etcd.tls_cert_file.as_deref(),
                Some(Path::new("/etc/svc/etcd-client.pem"))
            );
            assert_eq!(
                etcd.tls_key_file.as_deref(),
                Some(Path::new("/etc/svc/etcd-client-key.pem"))
            );
            assert_eq!(etcd.username.as_deref(), Some("svc"));
            assert_eq!(
                etcd.password_file.as_deref(),
                Some(Path::new("/etc/svc/etcd-password"))
            );
        }
        other => panic!("full.yaml sets etcd storage, got {other:?}"),
    }
    assert_eq!(c.proxy.proxy_protocol, ProxyProtocol::On);
    assert_eq!(
        c.proxy.trusted_proxy_networks(),
        [
            "10.0.0.0/8".parse().unwrap(),
            "fd00::/8".parse().unwrap(),
            ipnet::IpNet::from(IpAddr::V4(Ipv4Addr::new(192, 168, 1, 7)))
        ]
    );
    assert_eq!(c.proxy.https_keypairs().len(), 1);
    assert_eq!(
        c.proxy.https_keypairs()[0].key_file,
        Path::new("/etc/svc/privkey.pem")
    );
    assert_eq!(
        c.app.apps[0].public_addr.as_ref().unwrap().to_string(),
        "grafana.example.com"
    );
    assert_eq!(c.db.databases[0].uri, addr("db.internal:5432"));
    assert_eq!(c.db.databases[1].protocol, DbProtocol::Redis);
    assert_eq!(c.db.databases[1].uri, addr("redis.internal:6380"));
    let redis_tls = c.db.databases[1].tls.as_ref().unwrap();
    assert_eq!(
        redis_tls.cert_file.as_deref(),
        Some(Path::new("/etc/svc/redis-client.pem"))
    );
    assert_eq!(
        redis_tls.key_file.as_deref(),
        Some(Path::new("/etc/svc/redis-client-key.pem"))
    );
    assert_eq!(
        c.db.databases[0].tls.as_ref().unwrap().server_name.as_deref(),
        Some("db.internal")
    );
    assert_eq!(c.kube.kube_cluster_name, "prod");
    assert_eq!(c.windows_desktop.hosts[0].addr, addr("10.0.0.5:3389"));
    assert_eq!(
        c.ssh.public_addrs,
        [addr("node.example.com:3022"), addr("10.1.2.3:2222")]
    );
}

#[test]
fn load_names_the_file() {
    let missing = dir("valid").join("does-not-exist.yaml");
    let err = Config::load(&missing).unwrap_err().to_string();
    assert!(
        err.starts_with(&format!("cannot read config file {}: ", missing.display())),
        "{err}"
    );
    let bad = dir("invalid").join("version-v2.yaml");
    let err = Config::load(&bad).unwrap_err();
    assert_eq!(err.path(), Some("version"));
    assert_eq!(
        err.to_string(),
        format!(
            "{}: version: unknown value \"v2\", expected one of: v1",
            bad.display()
        )
    );
    Config::load(dir("valid").join("full.yaml")).unwrap();
}
