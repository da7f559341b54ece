#!/usr/bin/env bash
# Runs an all-in-one svc cluster (Auth Service and Proxy Service, embedded storage) from this
# source tree on a Debian or Ubuntu machine: installs what the build needs when it is missing
# (the C libraries and protoc that some crates build against), builds the Web UI the binary
# embeds, then runs `svc start` with the arguments given (for example `--data-dir ./svc-data`).
set -euo pipefail
cd "$(dirname "$0")/.."

# libxmlsec1/libxml2/openssl (and libclang for the bindings): SAML signatures; protoc: the etcd
# backend's protobuf API.
build_packages=(pkg-config libssl-dev libxml2-dev libxmlsec1-dev libclang-dev protobuf-compiler)
if command -v dpkg-query >/dev/null; then
  missing=()
  for p in "${build_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
      echo "the build needs these packages: ${missing[*]} (run this as root, or: sudo apt-get install ${missing[*]})" >&2
      exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
else
  echo "not a Debian system: make sure these (or your system's equivalents) are installed: ${build_packages[*]}" >&2
fi
for tool in cargo node npm; do
  command -v "$tool" >/dev/null || {
    echo "missing $tool: the build needs the Rust toolchain and Node.js 20.19 or newer with npm" >&2
    exit 1
  }
done

(cd svc-net/web && npm ci --no-audit --no-fund && npm run build)
exec cargo run --release -p svc-bins --bin svc -- start "$@"
