#!/usr/bin/env bash
# Installs svc and the automatic updater (svc-ent-updater) from the svc package repository,
# pinned to one version, and holds both packages there so routine system upgrades leave them
# alone: from then on svc-upgrade moves the agent, in the cluster's maintenance windows.
#
# Usage: install.sh <version> <cloud|enterprise>
#   version     the version the cluster's version endpoint serves, with or without a leading v
#   cloud       cloud-hosted cluster: repository channel "cloud"
#   enterprise  self-hosted cluster: repository channel "v<major>" of that version
#
# Environment:
#   SVC_REPO_URL      repository base URL (default https://packages.example.invalid/svc);
#                     <base>/apt for apt, <base>/rpm/stable/<channel>/<arch> for dnf, yum, zypper
#   SVC_REPO_KEY      URL or path of the repository's ASCII-armored signing key
#                     (default <base>/svc-pubkey.asc)
#   SVC_RPM_GPGCHECK  rpm repositories: "1" checks package and metadata signatures (default),
#                     "metadata" only the signed repomd.xml, "0" nothing (unsigned self-hosted repos)
#   SVC_INSTALLER     apt | yum | zypper: use this package manager instead of detecting it
#   SVC_AGENT_USER    the user the agent runs as when it is not root: it is given
#                     /etc/svc-upgrade.d/schedule and /etc/svc-upgrade.d/agent so it can export
#                     its maintenance schedule and report its heartbeats to the updater
set -euo pipefail

die() { echo "install.sh: error: $*" >&2; exit 1; }
say() { echo "install.sh: $*"; }

usage() {
  echo "usage: install.sh <version> <cloud|enterprise>   (for example: install.sh 17.0.0 enterprise)" >&2
  exit 2
}

[ $# -eq 2 ] || usage
version=${1#v}
edition=$2
[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.]+)?$ ]] ||
  die "invalid version \"$1\": expected <major>.<minor>.<patch>[-pre-release], for example 17.0.0 or v17.0.0-dev"
case $edition in
  cloud) channel=cloud ;;
  enterprise) channel="v${version%%.*}" ;;
  *) die "invalid edition \"$edition\": expected cloud (cloud-hosted cluster) or enterprise (self-hosted)" ;;
esac
[ "$(id -u)" -eq 0 ] || die "must run as root (packages are installed system-wide); try: sudo $0 $*"

# The package version: the pre-release "-" becomes "~", which sorts before the release in both
# dpkg and rpm (deploy/packaging/build-packages.sh and svc_update::linux::version do the same).
pkg_version=${version/-/\~}
repo_url=${SVC_REPO_URL:-https://packages.example.invalid/svc}
repo_url=${repo_url%/}
key_src=${SVC_REPO_KEY:-$repo_url/svc-pubkey.asc}
packages=(svc svc-ent-updater)
config_dir=/etc/svc-upgrade.d

command -v curl >/dev/null || [ -f "$key_src" ] || die "curl is needed to download $key_src; install curl first"

fetch_key() { # destination
  if [ -f "$key_src" ]; then
    install -m 0644 "$key_src" "$1"
  else
    curl -fsSL --proto '=https,file' -o "$1" "$key_src" || die "cannot download the signing key from $key_src"
    chmod 0644 "$1"
  fi
  grep -q "BEGIN PGP PUBLIC KEY BLOCK" "$1" || die "$key_src is not an ASCII-armored PGP public key"
}

detect_installer() {
  if [ -n "${SVC_INSTALLER:-}" ]; then
    case $SVC_INSTALLER in apt|yum|zypper) echo "$SVC_INSTALLER"; return ;; esac
    die "SVC_INSTALLER=\"$SVC_INSTALLER\": expected apt, yum or zypper"
  fi
  if command -v apt-get >/dev/null; then echo apt
  elif command -v dnf >/dev/null || command -v yum >/dev/null; then echo yum
  elif command -v zypper >/dev/null; then echo zypper
  else die "unsupported system: automatic updates need apt, yum/dnf or zypper (and systemd); none found"
  fi
}

rpm_repo_file() { # path
  local gpgcheck=1 repo_gpgcheck=1
  case ${SVC_RPM_GPGCHECK:-1} in
    1) ;;
    metadata) gpgcheck=0 ;;
    0) gpgcheck=0 repo_gpgcheck=0 ;;
    *) die "SVC_RPM_GPGCHECK=\"$SVC_RPM_GPGCHECK\": expected 1, metadata or 0" ;;
  esac
  mkdir -p "$(dirname "$1")"
  cat >"$1" <<REPO
[svc]
name=svc ($channel)
baseurl=$repo_url/rpm/stable/$channel/\$basearch
enabled=1
autorefresh=1
gpgcheck=$gpgcheck
pkg_gpgcheck=$gpgcheck
repo_gpgcheck=$repo_gpgcheck
gpgkey=file:///etc/pki/rpm-gpg/RPM-GPG-KEY-svc
REPO
}

install_apt() {
  local keyring=/usr/share/keyrings/svc-archive-keyring.asc list=/etc/apt/sources.list.d/svc.list
  mkdir -p /usr/share/keyrings
  fetch_key "$keyring"
  echo "deb [signed-by=$keyring] $repo_url/apt stable $channel" >"$list"
  say "added $list (channel $channel)"
  # Refresh only the svc repository: an unrelated unreachable mirror must not stop the install.
  local lock=(-o DPkg::Lock::Timeout=300) # wait for unattended-upgrades rather than fail
  apt-get -q -o Dir::Etc::sourcelist="$list" -o Dir::Etc::sourceparts=- -o APT::Get::List-Cleanup=0 update
  apt-mark "${lock[@]}" unhold "${packages[@]}" >/dev/null 2>&1 || true
  local specs=() p
  for p in "${packages[@]}"; do specs+=("$p=$pkg_version"); done
  DEBIAN_FRONTEND=noninteractive apt-get "${lock[@]}" install -y -q --allow-downgrades "${specs[@]}"
  apt-mark "${lock[@]}" hold "${packages[@]}"
}

dnf_hold() { # program
  if "$1" versionlock --help >/dev/null 2>&1; then
    "$1" versionlock delete "${packages[@]}" >/dev/null 2>&1 || true
    "$1" versionlock add "${packages[@]}"
    return
  fi
  # No versionlock plugin: exclude the packages in the main configuration (svc-upgrade lifts
  # the exclusion while it installs).
  local conf=/etc/dnf/dnf.conf p
  [ "$1" = yum ] && [ -f /etc/yum.conf ] && conf=/etc/yum.conf
  [ -f "$conf" ] || printf '[main]\n' >"$conf"
  grep -q '^\[main\]' "$conf" || printf '[main]\n' >>"$conf"
  for p in "${packages[@]}"; do
    if grep -Eq '^(exclude|excludepkgs)[[:space:]]*=' "$conf"; then
      grep -Eq "^(exclude|excludepkgs)[[:space:]]*=(.*[[:space:],])?$p([[:space:],]|\$)" "$conf" ||
        sed -i -E "0,/^(exclude|excludepkgs)[[:space:]]*=/s/^((exclude|excludepkgs)[[:space:]]*=.*)\$/\\1 $p/" "$conf"
    else
      sed -i "0,/^\[main\]/s/^\[main\]\$/[main]\nexclude=$p/" "$conf"
    fi
  done
  say "held ${packages[*]} with exclude= in $conf"
}

dnf_unhold() { # program
  local conf=/etc/dnf/dnf.conf p
  [ "$1" = yum ] && [ -f /etc/yum.conf ] && conf=/etc/yum.conf
  [ -f "$conf" ] || return 0
  for p in "${packages[@]}"; do
    sed -i -E "/^(exclude|excludepkgs)[[:space:]]*=/{s/([=[:space:],])$p([[:space:],]|\$)/\\1\\2/;s/[[:space:]]+\$//}" "$conf"
  done
  sed -i -E '/^(exclude|excludepkgs)[[:space:]]*=[[:space:]]*$/d' "$conf"
}

install_yum() {
  local program=dnf
  command -v yum >/dev/null && program=yum
  command -v "$program" >/dev/null || die "neither dnf nor yum found"
  mkdir -p /etc/pki/rpm-gpg /etc/yum.repos.d
  fetch_key /etc/pki/rpm-gpg/RPM-GPG-KEY-svc
  rpm --import /etc/pki/rpm-gpg/RPM-GPG-KEY-svc
  rpm_repo_file /etc/yum.repos.d/svc.repo
  say "added /etc/yum.repos.d/svc.repo (channel $channel)"
  dnf_unhold "$program"
  local specs=() p
  for p in "${packages[@]}"; do specs+=("$p-$pkg_version"); done
  "$program" -y --refresh install "${specs[@]}"
  dnf_hold "$program"
}

install_zypper() {
  mkdir -p /etc/pki/rpm-gpg /etc/zypp/repos.d
  fetch_key /etc/pki/rpm-gpg/RPM-GPG-KEY-svc
  rpm --import /etc/pki/rpm-gpg/RPM-GPG-KEY-svc
  rpm_repo_file /etc/zypp/repos.d/svc.repo
  say "added /etc/zypp/repos.d/svc.repo (channel $channel)"
  zypper --non-interactive refresh svc
  zypper --non-interactive removelock "${packages[@]}" >/dev/null || true
  local specs=() p
  for p in "${packages[@]}"; do specs+=("$p=$pkg_version"); done
  local rc=0
  zypper --non-interactive install --oldpackage "${specs[@]}" || rc=$?
  # 100-103: success with a remark (updates or a reboot needed).
  case $rc in 0|100|101|102|103) ;; *) die "zypper install failed (exit code $rc)" ;; esac
  zypper --non-interactive addlock "${packages[@]}"
}

installer=$(detect_installer)
say "installing svc $version (package version $pkg_version) with $installer from $repo_url"
case $installer in
  apt) install_apt ;;
  yum) install_yum ;;
  zypper) install_zypper ;;
esac

mkdir -p "$config_dir"
chmod 0755 "$config_dir"
# The updater uses the package manager that installed it.
[ -s "$config_dir/installer" ] || echo "$installer" >"$config_dir/installer"

if [ -n "${SVC_AGENT_USER:-}" ]; then
  id -u "$SVC_AGENT_USER" >/dev/null 2>&1 || die "SVC_AGENT_USER=\"$SVC_AGENT_USER\": no such user"
  for file in schedule agent; do
    [ -e "$config_dir/$file" ] || : >"$config_dir/$file"
    chmod 0644 "$config_dir/$file"
    chown "$SVC_AGENT_USER" "$config_dir/$file"
  done
  say "gave $config_dir/schedule and $config_dir/agent to $SVC_AGENT_USER so the agent can export its maintenance schedule and report its health"
fi

say "installed and held: ${packages[*]} $pkg_version"
cat <<NEXT
Next steps:
  svc version            # should print: svc v$version
  svc-upgrade dry-run    # warnings about no valid upgrade schedule are expected until the agent
                         # has exported one (within about 40 minutes of joining)
  cat $config_dir/status # the updater's last result ("enrolled" until its first run)
NEXT
