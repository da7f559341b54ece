//! The ClientHello parser against captured hellos (openssl s_client, curl) and against what
//! rustls itself reads from the same bytes.

use svc_net::route::client_hello::{ClientHello, Parsed, parse};

fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/testdata/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// What rustls's own server-side parser sees in these bytes.
fn rustls_view(bytes: &[u8]) -> ClientHello {
    let mut acceptor = rustls::server::Acceptor::default();
    let mut rd = bytes;
    while !rd.is_empty() {
        acceptor.read_tls(&mut rd).expect("rustls reads the bytes");
    }
    let accepted = acceptor
        .accept()
        .map_err(|(e, _)| e)
        .expect("rustls accepts the hello")
        .expect("rustls has the whole hello");
    let hello = accepted.client_hello();
    ClientHello {
        server_name: hello.server_name().map(str::to_owned),
        alpn: hello
            .alpn()
            .map(|it| it.map(<[u8]>::to_vec).collect())
            .unwrap_or_default(),
    }
}

fn complete(bytes: &[u8]) -> ClientHello {
    match parse(bytes) {
        Ok(Parsed::Complete(h)) => h,
        other => panic!("expected a complete hello, got {other:?}"),
    }
}

/// Re-frames the handshake message of a captured hello into records of at most `size` bytes.
fn reframe(bytes: &[u8], size: usize) -> Vec<u8> {
    let mut msg = Vec::new();
    let mut rest = bytes;
    while rest.len() >= 5 {
        let len = usize::from(rest[3]) << 8 | usize::from(rest[4]);
        msg.extend_from_slice(&rest[5..5 + len]);
        rest = &rest[5 + len..];
    }
    let mut out = Vec::new();
    for chunk in msg.chunks(size) {
        out.extend_from_slice(&[0x16, 3, 1]);
        out.extend_from_slice(&u16::try_from(chunk.len()).unwrap().to_be_bytes());
        out.extend_from_slice(chunk);
    }
    out
}

const FIXTURES: [&str; 4] = [
    "hello-openssl-s_client.bin",
    "hello-curl.bin",
    "hello-openssl-kube-tls12.bin",
    "hello-openssl-no-alpn.bin",
];

#[test]
fn captured_hellos_carry_what_the_clients_sent() {
    let h = complete(&fixture("hello-openssl-s_client.bin"));
    assert_eq!(h.server_name.as_deref(), Some("proxy.example.com"));
    assert_eq!(h.alpn, vec![b"svc-reversetunnel".to_vec(), b"h2".to_vec()]);

    let h = complete(&fixture("hello-curl.bin"));
    assert_eq!(h.server_name.as_deref(), Some("proxy.example.com"));
    assert_eq!(h.alpn, vec![b"h2".to_vec(), b"http/1.1".to_vec()]);

    let h = complete(&fixture("hello-openssl-kube-tls12.bin"));
    assert_eq!(
        h.server_name.as_deref(),
        Some("kube-svc-proxy-alpn.proxy.example.com")
    );
    assert_eq!(h.alpn, vec![b"http/1.1".to_vec()]);

    assert_eq!(
        complete(&fixture("hello-openssl-no-alpn.bin")),
        ClientHello::default()
    );
}

#[test]
fn agrees_with_rustls_on_every_fixture_and_framing() {
    for name in FIXTURES {
        let bytes = fixture(name);
        assert_eq!(complete(&bytes), rustls_view(&bytes), "{name}");
        for size in [1, 2, 3, 7, 64, 100, 255] {
            let split = reframe(&bytes, size);
            assert_eq!(
                complete(&split),
                rustls_view(&split),
                "{name} in records of {size}"
            );
        }
    }
}

#[test]
fn every_read_boundary_needs_more_until_the_end() {
    for name in FIXTURES {
        for bytes in [fixture(name), reframe(&fixture(name), 50)] {
            let whole = complete(&bytes);
            for cut in 0..bytes.len() {
                assert_eq!(parse(&bytes[..cut]), Ok(Parsed::NeedMore), "{name} cut at {cut}");
            }
            // Bytes after the hello (early data, a second record) do not change the answer.
            let mut more = bytes.clone();
            more.extend_from_slice(b"\x14\x03\x03\x00\x01\x01");
            assert_eq!(complete(&more), whole);
        }
    }
}

#[test]
fn corrupting_any_byte_never_panics() {
    for name in FIXTURES {
        let bytes = fixture(name);
        for i in 0..bytes.len() {
            for flip in [0x01u8, 0x80, 0xFF] {
                let mut b = bytes.clone();
                b[i] ^= flip;
                let _ = parse(&b);
            }
        }
    }
}

/// A minimal hello with the given SNI and ALPN, in records of at most `size` bytes.
fn synthetic(sni: Option<&str>, alpn: &[String], size: usize) -> Vec<u8> {
    let mut exts = Vec::new();
    let mut push = |kind: u16, body: Vec<u8>| {
        exts.extend_from_slice(&kind.to_be_bytes());
        exts.extend_from_slice(&u16::try_from(body.len()).unwrap().to_be_bytes());
        exts.extend_from_slice(&body);
    };
    // rustls insists on signature_algorithms (ecdsa_secp256r1_sha256 here).
    push(13, vec![0, 2, 0x04, 0x03]);
    if let Some(name) = sni {
        let mut entry = vec![0u8];
        entry.extend_from_slice(&u16::try_from(name.len()).unwrap().to_be_bytes());
        entry.extend_from_slice(name.as_bytes());
        let mut body = u16::try_from(entry.len()).unwrap().to_be_bytes().to_vec();
        body.extend_from_slice(&entry);
        push(0, body);
    }
    if !alpn.is_empty() {
        let mut list = Vec::new();
        for p in alpn {
            list.push(u8::try_from(p.len()).unwrap());
            list.extend_from_slice(p.as_bytes());
        }
        let mut body = u16::try_from(list.len()).unwrap().to_be_bytes().to_vec();
        body.extend_from_slice(&list);
        push(16, body);
    }
    let mut body = vec![3, 3];
    body.extend_from_slice(&[9; 32]);
    body.push(0);
    body.extend_from_slice(&[0, 2, 0xC0, 0x2B, 1, 0]);
    body.extend_from_slice(&u16::try_from(exts.len()).unwrap().to_be_bytes());
    body.extend_from_slice(&exts);
    let len = u32::try_from(body.len()).unwrap().to_be_bytes();
    let mut msg = vec![1, len[1], len[2], len[3]];
    msg.extend_from_slice(&body);
    let mut out = Vec::new();
    for chunk in msg.chunks(size) {
        out.extend_from_slice(&[0x16, 3, 1]);
        out.extend_from_slice(&u16::try_from(chunk.len()).unwrap().to_be_bytes());
        out.extend_from_slice(chunk);
    }
    out
}

proptest::proptest! {
    /// Generated hellos, framed in records of any size: our SNI and ALPN equal rustls's.
    #[test]
    fn agrees_with_rustls_on_generated_hellos(
        // Valid DNS names: rustls refuses a hello whose SNI is not one (the router is more
        // lenient and leaves that refusal to the route's own TLS server).
        sni in proptest::option::of("[a-z]([a-z0-9-]{0,14}[a-z0-9])?(\\.[a-z][a-z0-9]{0,10}){0,3}"),
        alpn in proptest::collection::vec("[a-z0-9/.@-]{1,30}", 0..5),
        size in 1usize..400,
    ) {
        let bytes = synthetic(sni.as_deref(), &alpn, size);
        proptest::prop_assert_eq!(complete(&bytes), rustls_view(&bytes));
    }
}
