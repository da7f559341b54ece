//! End to end: revocation. The real `svc start` (Auth, Proxy and its own SSH agent) and real
//! `tsh`/`tctl`. `tctl lock --user` ends an open `tsh ssh` session within a minute with the
//! lock's message, and refuses new sessions and sign-ins; a user without the right to locks
//! can neither lock nor unlock; `tctl rm lock/...` restores access; `tctl lock --node` refuses
//! every session to the node; a deleted user's certificates stop working at once.

mod common;

use svc_testkit::wait::OutputWithin;

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::resources::{PASSWORD, User};
use common::{Cluster, Run, TCTL, TSH};

/// The node name `svc start` gives its own agent: this host's name.
fn nodename() -> String {
    svc_core::config::Config::all_in_one_default().svc.nodename
}

/// `tsh ARGS` in `user`'s own `SVC_HOME`, success or not.
fn tsh(user: &User, args: &[&str]) -> Run {
    Command::new(TSH)
        .args(args)
        .env("SVC_HOME", &user.home)
        .env_remove("RUST_LOG")
        .output_within(common::wait::STEP, &format!("tsh {}", args.join(" ")))
        .expect("run tsh")
        .into()
}

/// `tctl ARGS` as the user signed in with `tsh` in `user`'s `SVC_HOME`.
fn tctl_as(user: &User, args: &[&str]) -> Run {
    Command::new(TCTL)
        .args(args)
        .env("SVC_HOME", &user.home)
        .env_remove("RUST_LOG")
        .output_within(common::wait::STEP, &format!("tctl {}", args.join(" ")))
        .expect("run tctl")
        .into()
}

#[test]
fn tctl_lock_ends_an_open_session_and_deleted_users_are_refused() {
    let cluster = Cluster::start("info");
    for user in ["alice", "dana", "mallory"] {
        cluster.add_user(user, PASSWORD);
    }
    let alice = User::login(&cluster, "alice");
    let dana = User::login(&cluster, "dana");
    let mallory = User::login(&cluster, "mallory");
    let node = nodename();
    let target = format!("root@{node}");
    let ok = tsh(&alice, &["ssh", &target, "echo before-lock"]);
    assert_eq!(
        ok.stdout,
        "before-lock\n",
        "{}\nsvc: {}",
        ok.stderr,
        cluster.stderr()
    );

    // An open session that would last five minutes.
    let mut session = Command::new(TSH)
        .args(["ssh", &target, "echo started; sleep 300; echo not-ended"])
        .env("SVC_HOME", &alice.home)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tsh ssh");
    let (lines_tx, lines) = mpsc::channel();
    let stdout = session.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    let mut stderr = session.stderr.take().expect("stderr");
    let stderr = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    assert_eq!(
        lines.recv_timeout(Duration::from_secs(60)).as_deref(),
        Ok("started"),
        "the session did not start within 60 s\nsvc: {}",
        cluster.stderr()
    );

    // The insider without rights on locks can neither lock someone nor unlock themselves.
    let denied = tctl_as(&mallory, &["lock", "--user=dana"]);
    denied.refused(
        "access denied to perform action",
        "a user without rights on locks locking another",
        &cluster,
    );
    assert!(denied.stderr.contains("\"lock\""), "{}", denied.stderr);

    let locked = cluster
        .tctl_admin(&["lock", "--user=alice", "--message=incident 7"], None)
        .ok();
    assert_eq!(
        locked.stdout,
        "user \"alice\" has been locked (remove lock/user-alice to unlock)\n"
    );
    let since = Instant::now();
    let status = loop {
        if let Some(status) = session.try_wait().expect("poll tsh ssh") {
            break status;
        }
        assert!(
            since.elapsed() < Duration::from_secs(90),
            "the locked user's open session still runs 90 s after the lock\nsvc: {}",
            cluster.stderr()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let ended_after = since.elapsed();
    let stderr = stderr.join().expect("stderr reader");
    assert!(!status.success(), "the session ended with success: {stderr}");
    assert!(
        ended_after < Duration::from_secs(60),
        "the open session ended {ended_after:?} after the lock, not within a minute"
    );
    assert!(
        stderr.contains("svc: session closed: access refused: user \"alice\" is locked: incident 7"),
        "expected the lock's reason on the session's stderr, found: {stderr}\nsvc: {}",
        cluster.stderr()
    );
    assert!(
        lines.try_iter().all(|l| l != "not-ended"),
        "the program outlived the lock"
    );

    // New sessions and sign-ins are refused while the lock exists.
    let refused = tsh(&alice, &["ssh", &target, "echo should-not-run"]);
    refused.refused(
        "user \"alice\" is locked: incident 7",
        "a locked user's new session",
        &cluster,
    );
    assert!(!refused.stdout.contains("should-not-run"));
    let relogin = cluster.login("alice", PASSWORD);
    relogin.refused(
        "user \"alice\" is locked",
        "a locked user signing in again",
        &cluster,
    );
    // The other user without rights cannot lift it either.
    let denied = tctl_as(&mallory, &["rm", "lock/user-alice"]);
    denied.refused(
        "access denied to perform action \"delete\" on \"lock\"",
        "a user without rights on locks unlocking",
        &cluster,
    );
    // The administrator lifts it: access returns.
    cluster.tctl_admin(&["rm", "lock/user-alice"], None).ok();
    let ok = tsh(&alice, &["ssh", &target, "echo after-unlock"]);
    assert_eq!(ok.stdout, "after-unlock\n", "{}", ok.stderr);

    // A node lock refuses every user's session to that node.
    cluster
        .tctl_admin(&["lock", &format!("--node={node}")], None)
        .ok();
    let refused = tsh(&dana, &["ssh", &target, "echo should-not-run"]);
    refused.refused(
        &format!("node \"{node}\" is locked"),
        "a session to a locked node",
        &cluster,
    );
    cluster
        .tctl_admin(&["rm", &format!("lock/node-{node}")], None)
        .ok();
    let ok = tsh(&dana, &["ssh", &target, "echo node-unlocked"]);
    assert_eq!(ok.stdout, "node-unlocked\n", "{}", ok.stderr);

    // A deleted user's certificates stop working at once, for sessions and the API.
    cluster.tctl_admin(&["users", "rm", "dana"], None).ok();
    let refused = tsh(&dana, &["ssh", &target, "echo should-not-run"]);
    refused.refused(
        "user \"dana\" no longer exists",
        "a deleted user's session",
        &cluster,
    );
    let refused = tctl_as(&dana, &["get", "role"]);
    refused.refused(
        "user \"dana\" no longer exists",
        "a deleted user's API call",
        &cluster,
    );
}
