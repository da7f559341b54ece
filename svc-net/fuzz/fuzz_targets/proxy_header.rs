//! The PROXY protocol v1/v2 header (`svc_net::route::detect::parse_proxy_header`): read in
//! multiplex mode from whatever connects, before the trust check on the peer address.
//!
//! Properties: no panic; deterministic; a complete header's length lies within the input;
//! bytes after a complete header do not change it; the v1 header re-encoded from what was
//! parsed (`PROXY TCP4|TCP6 src dst sport dport`) parses to the same source.
#![no_main]

use std::net::SocketAddr;

use libfuzzer_sys::fuzz_target;
use svc_net::route::detect::{ProxyHeader, detect, parse_proxy_header};

fuzz_target!(|data: &[u8]| {
    let _ = detect(data);
    let first = parse_proxy_header(data);
    assert_eq!(first, parse_proxy_header(data), "parse is not deterministic");
    if let Ok(ProxyHeader::Complete { len, source }) = first {
        assert!(
            len <= data.len(),
            "header length {len} past the {} bytes read",
            data.len()
        );
        let mut longer = data.to_vec();
        longer.extend_from_slice(b"\x16\x03\x01SSH-2.0-x\r\n");
        assert_eq!(
            parse_proxy_header(&longer),
            Ok(ProxyHeader::Complete { len, source }),
            "trailing bytes changed the header"
        );
        if let Some(addr) = source {
            let line = v1_line(addr);
            assert_eq!(
                parse_proxy_header(line.as_bytes()),
                Ok(ProxyHeader::Complete {
                    len: line.len(),
                    source: Some(addr)
                }),
                "re-encoded v1 header {line:?} does not round-trip"
            );
        }
    }
});

fn v1_line(addr: SocketAddr) -> String {
    let (family, dst) = match addr {
        SocketAddr::V4(_) => ("TCP4", "127.0.0.1"),
        SocketAddr::V6(_) => ("TCP6", "::1"),
    };
    format!("PROXY {family} {} {dst} {} 443\r\n", addr.ip(), addr.port())
}
