//! OS accounts for SSH logins, read from `/etc/passwd` (a pure parser plus one file read).

use std::path::PathBuf;

/// An OS account.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Account {
    pub(crate) name: String,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) home: PathBuf,
    pub(crate) shell: PathBuf,
}

/// Finds `login` in passwd-format text.
pub(crate) fn find(passwd: &str, login: &str) -> Option<Account> {
    passwd.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() < 7 || f[0] != login {
            return None;
        }
        Some(Account {
            name: f[0].to_owned(),
            uid: f[2].parse().ok()?,
            gid: f[3].parse().ok()?,
            home: PathBuf::from(if f[5].is_empty() { "/" } else { f[5] }),
            shell: PathBuf::from(if f[6].is_empty() { "/bin/sh" } else { f[6] }),
        })
    })
}

/// Looks `login` up in `/etc/passwd`.
pub(crate) fn lookup(login: &str) -> Option<Account> {
    find(&std::fs::read_to_string("/etc/passwd").ok()?, login)
}

/// The groups of `login` in group-format text: `primary` first, then every group that lists
/// the login as a member.
pub(crate) fn groups_in(group: &str, login: &str, primary: u32) -> Vec<u32> {
    let mut gids = vec![primary];
    for line in group.lines() {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() < 4 || !f[3].split(',').any(|m| m == login) {
            continue;
        }
        if let Ok(gid) = f[2].parse::<u32>()
            && !gids.contains(&gid)
        {
            gids.push(gid);
        }
    }
    gids
}

/// The groups of `login` (`/etc/group`), `primary` first.
pub(crate) fn groups(login: &str, primary: u32) -> Vec<u32> {
    groups_in(
        &std::fs::read_to_string("/etc/group").unwrap_or_default(),
        login,
        primary,
    )
}

/// The uid this process runs as (the owner of `/proc/self`), if it can be read.
pub(crate) fn current_uid() -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").ok().map(|m| m.uid())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_groups() {
        let text = "root:x:0:\nsudo:x:27:bob,carol\nbob:x:1000:\ndocker:x:999:carol\nbad\n";
        assert_eq!(groups_in(text, "bob", 1000), vec![1000, 27]);
        assert_eq!(groups_in(text, "carol", 1001), vec![1001, 27, 999]);
    }

    #[test]
    fn finds_accounts() {
        let text = "root:x:0:0:root:/root:/bin/bash\nbob:x:1000:1000::/home/bob:\nbad:line\n";
        assert_eq!(find(text, "root").unwrap().shell, PathBuf::from("/bin/bash"));
        let bob = find(text, "bob").unwrap();
        assert_eq!(
            (bob.uid, bob.gid, bob.shell.to_str()),
            (1000, 1000, Some("/bin/sh"))
        );
        assert!(find(text, "bad").is_none());
        assert!(find(text, "alice").is_none());
    }
}
