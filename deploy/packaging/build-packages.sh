#!/usr/bin/env bash
# The maintainer scripts are written with single-quoted echo on purpose: they expand when they run.
# shellcheck disable=SC2016
# Builds the svc Linux packages as .deb and .rpm:
#   svc              /usr/bin/svc, and /usr/bin/tctl, /usr/bin/tsh when built; svc.service
#   svc-ent-updater  /usr/bin/svc-upgrade when built; svc-upgrade.service, svc-upgrade.timer;
#                    depends on svc
#
# Usage:
#   build-packages.sh build <version> <bin-dir> <out-dir> [deb|rpm|all]
#   build-packages.sh package-version <version>     # prints the package version: 17.0.0-dev -> 17.0.0~dev
#   build-packages.sh svc-version <package-version> # the inverse: 17.0.0~dev -> 17.0.0-dev
#
# Environment: SVC_RPM_SIGN_KEY, a gpg key (id or e-mail) in the current GNUPGHOME, signs the
# .rpm packages with rpmsign; .deb packages are not signed one by one (apt checks the
# repository's signed InRelease, which holds their checksums).
#
# Needs dpkg-deb (dpkg) for .deb and rpmbuild (rpm) for .rpm. The version mapping is the one
# svc_update::linux::version implements; keep them in step.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
units="$here/../systemd"

die() { echo "build-packages.sh: $*" >&2; exit 2; }

# A semver pre-release sorts before its release; dpkg and rpm give `~` that meaning and accept no
# `-` inside an upstream version, so the one `-` that starts the pre-release becomes `~`.
package_version() {
  local v=${1#v}
  [[ $v =~ ^[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.+-]*)?$ ]] || die "invalid version \"$1\": expected <major>.<minor>.<patch>[-pre][+build]"
  v=${v/-/\~}
  [[ $v != *-* ]] || die "version \"$1\" cannot be packaged: expected no \"-\" after the one that starts the pre-release"
  printf '%s\n' "$v"
}

svc_version() {
  local v=$1
  [[ $v =~ ^[0-9]+\.[0-9]+\.[0-9]+([~+][0-9A-Za-z.+~]*)?$ ]] || die "invalid package version \"$1\""
  printf '%s\n' "${v/\~/-}"
}

deb_arch() { dpkg --print-architecture 2>/dev/null || echo amd64; }
rpm_arch() { uname -m; }

# Files of each package: "source destination mode" lines.
svc_files() {
  local bin_dir=$1 b
  for b in svc tctl tsh; do
    [ -x "$bin_dir/$b" ] && echo "$bin_dir/$b /usr/bin/$b 0755"
  done
  echo "$units/svc.service /lib/systemd/system/svc.service 0644"
}

updater_files() {
  local bin_dir=$1
  if [ -x "$bin_dir/svc-upgrade" ]; then echo "$bin_dir/svc-upgrade /usr/bin/svc-upgrade 0755"; fi
  echo "$units/svc-upgrade.service /lib/systemd/system/svc-upgrade.service 0644"
  echo "$units/svc-upgrade.timer /lib/systemd/system/svc-upgrade.timer 0644"
}

# Maintainer scripts, shared by both formats. They only call systemctl when systemd is running:
# containers and chroots have no systemd, and a failing script would fail the install.
# $1 of the scripts: deb "configure"/"remove"/...; rpm the count of installed instances.
svc_postinst() {
  cat <<'SH'
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload || true
fi
SH
}

# $1: the package version. Besides the directory, it writes the updater's initial `status` (the
# JSON svc-upgrade rewrites after every run), so the agent reports the updater and its version
# from enrolment on, before the first timer run. An upgrade of the package keeps the last run's
# status and only updates upgrader_version in it.
updater_postinst() {
  local svc_version=${1/\~/-}
  cat <<'SH'
mkdir -p /etc/svc-upgrade.d
chmod 0755 /etc/svc-upgrade.d
SH
  printf 'UPGRADER_VERSION=%s\n' "$svc_version"
  cat <<'SH'
status=/etc/svc-upgrade.d/status
if [ "${FIRST_INSTALL:-no}" = yes ] || [ ! -s "$status" ]; then
  current=$(/usr/bin/svc version 2>/dev/null | sed -n 's/^svc v//p' || true)
  printf '{"upgrader":"unit","upgrader_version":"%s","result":"none","from":"%s","to":"%s","reason":"enrolled","at":%s,"bad_versions":[]}\n' \
    "$UPGRADER_VERSION" "$current" "$current" "$(date +%s)" >"$status.tmp"
  chmod 0644 "$status.tmp"
  mv -f "$status.tmp" "$status"
else
  sed -i "s/\"upgrader_version\":\"[^\"]*\"/\"upgrader_version\":\"$UPGRADER_VERSION\"/" "$status" || true
fi
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload || true
  # Enable the timer on first install only: an administrator who suspended updates with
  # `systemctl disable --now svc-upgrade.timer` keeps them suspended across upgrades.
  if [ "${FIRST_INSTALL:-no}" = yes ]; then
    systemctl enable --now svc-upgrade.timer || true
  fi
fi
SH
}

updater_prerm() {
  cat <<'SH'
if [ "${LAST_REMOVAL:-no}" = yes ] && [ -d /run/systemd/system ]; then
  systemctl disable --now svc-upgrade.timer || true
fi
SH
}

build_deb() { # name version bin_dir out_dir files_fn postinst_fn prerm_fn depends description
  local name=$1 version=$2 bin_dir=$3 out=$4 files_fn=$5 postinst_fn=$6 prerm_fn=$7 depends=$8 description=$9
  local root src dest mode
  root=$(mktemp -d)
  mkdir -p "$root/DEBIAN"
  while read -r src dest mode; do
    install -D -m "$mode" "$src" "$root$dest"
  done < <("$files_fn" "$bin_dir")
  {
    echo "Package: $name"
    echo "Version: $version"
    echo "Architecture: $(deb_arch)"
    echo "Maintainer: svc maintainers <maintainers@example.invalid>"
    [ -n "$depends" ] && echo "Depends: $depends"
    echo "Section: net"
    echo "Priority: optional"
    echo "Description: $description"
  } >"$root/DEBIAN/control"
  {
    echo '#!/bin/sh'
    echo 'set -e'
    echo 'FIRST_INSTALL=no; [ "$1" = configure ] && [ -z "${2:-}" ] && FIRST_INSTALL=yes'
    "$postinst_fn" "$version"
  } >"$root/DEBIAN/postinst"
  chmod 0755 "$root/DEBIAN/postinst"
  if [ -n "$prerm_fn" ]; then
    {
      echo '#!/bin/sh'
      echo 'set -e'
      echo 'LAST_REMOVAL=no; [ "$1" = remove ] && LAST_REMOVAL=yes'
      "$prerm_fn"
    } >"$root/DEBIAN/prerm"
    chmod 0755 "$root/DEBIAN/prerm"
  fi
  # gzip: every dpkg reads it (zstd needs dpkg 1.21.18+), and it builds ten times faster than xz.
  dpkg-deb --root-owner-group -Zgzip -z6 --build "$root" "$out/${name}_${version}_$(deb_arch).deb" >/dev/null
  rm -rf "$root"
  echo "$out/${name}_${version}_$(deb_arch).deb"
}

build_rpm() { # name version bin_dir out_dir files_fn postinst_fn prerm_fn requires summary
  local name=$1 version=$2 bin_dir=$3 out=$4 files_fn=$5 postinst_fn=$6 prerm_fn=$7 requires=$8 summary=$9
  local top spec src dest mode
  top=$(mktemp -d)
  mkdir -p "$top/SOURCES" "$top/SPECS" "$top/BUILD" "$top/RPMS"
  spec="$top/SPECS/$name.spec"
  {
    echo "Name: $name"
    echo "Version: $version"
    echo "Release: 1"
    echo "Summary: $summary"
    echo "License: Apache-2.0"
    echo "URL: https://example.invalid/svc"
    [ -n "$requires" ] && echo "Requires: $requires"
    # The binaries are built elsewhere; automatic dependencies would tie the package to the
    # build machine's library names, and stripping or debuginfo extraction would change them.
    echo "AutoReqProv: no"
    echo "%define debug_package %{nil}"
    echo "%define __strip /bin/true"
    echo "%define _build_id_links none"
    # zstd: several times faster to build than the default xz, still small.
    echo "%define _binary_payload w3.zstdio"
    echo "%description"
    echo "$summary."
    echo "%install"
    while read -r src dest mode; do
      echo "install -D -m $mode '$src' %{buildroot}$dest"
    done < <("$files_fn" "$bin_dir")
    echo "%files"
    while read -r src dest mode; do
      echo "$dest"
    done < <("$files_fn" "$bin_dir")
    echo "%post"
    echo 'FIRST_INSTALL=no; [ "$1" -eq 1 ] && FIRST_INSTALL=yes'
    # rpm expands % in scripts as macros; %% is a literal % (printf formats).
    "$postinst_fn" "$version" | sed 's/%/%%/g'
    if [ -n "$prerm_fn" ]; then
      echo "%preun"
      echo 'LAST_REMOVAL=no; [ "$1" -eq 0 ] && LAST_REMOVAL=yes'
      "$prerm_fn"
    fi
  } >"$spec"
  rpmbuild --quiet -bb --define "_topdir $top" "$spec" >/dev/null
  local rpm
  rpm=$(find "$top/RPMS" -name '*.rpm' | head -n 1)
  [ -n "$rpm" ] || die "rpmbuild produced no package for $name"
  if [ -n "${SVC_RPM_SIGN_KEY:-}" ]; then
    # rpm's default signing program is gpg2, which Debian does not ship under that name.
    rpmsign --addsign --define "_gpg_name $SVC_RPM_SIGN_KEY" --define "__gpg $(command -v gpg)" "$rpm" \
      </dev/null >/dev/null 2>&1 || die "rpmsign with key $SVC_RPM_SIGN_KEY failed for $rpm"
  fi
  cp "$rpm" "$out/"
  rm -rf "$top"
  echo "$out/$(basename "$rpm")"
}

build() {
  [ $# -ge 3 ] || die "usage: build-packages.sh build <version> <bin-dir> <out-dir> [deb|rpm|all]"
  local version bin_dir out formats=${4:-all}
  version=$(package_version "$1")
  bin_dir=$(cd "$2" && pwd) || die "$2: no such directory"
  mkdir -p "$3"
  out=$(cd "$3" && pwd)
  case $formats in deb|rpm|all) ;; *) die "format must be deb, rpm or all, got \"$formats\"" ;; esac
  # Checked here: the file lists run in subshells, where die would not stop the build.
  [ -x "$bin_dir/svc" ] || die "$bin_dir/svc: not found or not executable (the svc package needs at least svc)"
  if [ "$formats" != rpm ]; then
    command -v dpkg-deb >/dev/null || die "dpkg-deb not found (Debian package dpkg)"
    build_deb svc "$version" "$bin_dir" "$out" svc_files svc_postinst "" "" "svc cluster access service"
    build_deb svc-ent-updater "$version" "$bin_dir" "$out" updater_files updater_postinst updater_prerm svc \
      "svc automatic agent updater (svc-upgrade and its systemd timer)"
  fi
  if [ "$formats" != deb ]; then
    command -v rpmbuild >/dev/null || die "rpmbuild not found (Debian package rpm)"
    build_rpm svc "$version" "$bin_dir" "$out" svc_files svc_postinst "" "" "svc cluster access service"
    build_rpm svc-ent-updater "$version" "$bin_dir" "$out" updater_files updater_postinst updater_prerm svc \
      "svc automatic agent updater (svc-upgrade and its systemd timer)"
  fi
}

case ${1:-} in
  build) shift; build "$@" ;;
  package-version) [ $# -eq 2 ] || die "usage: build-packages.sh package-version <version>"; package_version "$2" ;;
  svc-version) [ $# -eq 2 ] || die "usage: build-packages.sh svc-version <package-version>"; svc_version "$2" ;;
  *) die "usage: build-packages.sh build <version> <bin-dir> <out-dir> [deb|rpm|all] | package-version <v> | svc-version <pv>" ;;
esac
