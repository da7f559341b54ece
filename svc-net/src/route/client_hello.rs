//! The ClientHello peek: a pure parser over the first bytes of a TLS connection.
//!
//! Sits at the start of TLS routing: the router reads bytes without terminating TLS, calls
//! [`parse`] on everything read so far, and either learns the SNI and ALPN list or is told to
//! read more. The hello may span several TCP reads and several TLS records (type `0x16`
//! concatenated, the handshake message reassembled from their fragments). The parser keeps no
//! state between calls, so the caller simply appends and calls again; [`MAX_BUFFERED`] caps how
//! much it will ever ask for. It never panics on any input (property-tested).

use std::fmt;

/// The largest handshake message accepted (a real ClientHello, even with post-quantum key
/// shares, is a few KiB; TLS allows 16 MiB, which no router should buffer).
pub const MAX_HELLO_LEN: usize = 16 * 1024;

/// The most bytes [`parse`] will ever ask the caller to buffer: a maximal hello plus the record
/// headers of a generous number of fragments.
pub const MAX_BUFFERED: usize = MAX_HELLO_LEN + 4 + 5 * 256;

const RECORD_HANDSHAKE: u8 = 0x16;
const HANDSHAKE_CLIENT_HELLO: u8 = 0x01;
const MAX_RECORD_LEN: usize = 16 * 1024 + 256;
const EXT_SERVER_NAME: u16 = 0;
const EXT_ALPN: u16 = 16;

/// What a ClientHello tells a router.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ClientHello {
    /// The `host_name` of the server_name extension, if the client sent one.
    pub server_name: Option<String>,
    /// The ALPN protocol names, in the client's order of preference (empty: no extension).
    pub alpn: Vec<Vec<u8>>,
}

impl ClientHello {
    /// The ALPN names as text, for logs (`["h2", "http/1.1"]`).
    pub fn alpn_display(&self) -> String {
        let names: Vec<String> = self
            .alpn
            .iter()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .collect();
        format!("{names:?}")
    }
}

impl fmt::Debug for ClientHello {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientHello")
            .field("server_name", &self.server_name)
            .field("alpn", &format_args!("{}", self.alpn_display()))
            .finish()
    }
}

/// The outcome of parsing the bytes read so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// The whole hello was read.
    Complete(ClientHello),
    /// The bytes so far are a valid prefix of a hello; read more and call [`parse`] again.
    NeedMore,
}

/// Why the bytes are not a ClientHello.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HelloError {
    /// A record of another type came before the hello was complete.
    #[error("expected a TLS handshake record (0x16), found record type {0:#04x}")]
    NotHandshake(u8),
    /// The record header carries a version no TLS implementation sends.
    #[error("expected a TLS record version 3.x, found {0}.{1}")]
    RecordVersion(u8, u8),
    /// A record is empty or longer than TLS allows.
    #[error("invalid TLS record length {0}: expected 1 to {MAX_RECORD_LEN}")]
    RecordLength(usize),
    /// The first handshake message is not a ClientHello.
    #[error("expected a ClientHello (handshake type 1), found handshake type {0}")]
    NotClientHello(u8),
    /// The hello is larger than this parser buffers.
    #[error("ClientHello of {0} bytes is larger than the {MAX_HELLO_LEN}-byte limit")]
    TooLarge(usize),
    /// The hello's structure is broken.
    #[error("malformed ClientHello: {0}")]
    Malformed(&'static str),
}

/// Parses the bytes read so far from a connection that starts with a TLS record.
///
/// Returns [`Parsed::NeedMore`] while `buf` is a valid prefix of a hello, never asking for more
/// than [`MAX_BUFFERED`] bytes in total.
pub fn parse(buf: &[u8]) -> Result<Parsed, HelloError> {
    let mut message: Vec<u8> = Vec::new();
    let mut rest = buf;
    loop {
        // Enough of the handshake message to parse it?
        if message.len() >= 4 {
            if message[0] != HANDSHAKE_CLIENT_HELLO {
                return Err(HelloError::NotClientHello(message[0]));
            }
            let len = usize::from(message[1]) << 16 | usize::from(message[2]) << 8 | usize::from(message[3]);
            if len > MAX_HELLO_LEN {
                return Err(HelloError::TooLarge(len));
            }
            if message.len() >= 4 + len {
                return parse_body(&message[4..4 + len]).map(Parsed::Complete);
            }
        } else if let Some(&kind) = message.first()
            && kind != HANDSHAKE_CLIENT_HELLO
        {
            return Err(HelloError::NotClientHello(kind));
        }
        if buf.len() - rest.len() >= MAX_BUFFERED {
            return Err(HelloError::TooLarge(buf.len() - rest.len()));
        }
        // The next record.
        if rest.is_empty() {
            return Ok(Parsed::NeedMore);
        }
        if rest[0] != RECORD_HANDSHAKE {
            return Err(HelloError::NotHandshake(rest[0]));
        }
        if rest.len() >= 2 && rest[1] != 3 {
            return Err(HelloError::RecordVersion(
                rest[1],
                rest.get(2).copied().unwrap_or(0),
            ));
        }
        if rest.len() < 5 {
            return Ok(Parsed::NeedMore);
        }
        let len = usize::from(rest[3]) << 8 | usize::from(rest[4]);
        if len == 0 || len > MAX_RECORD_LEN {
            return Err(HelloError::RecordLength(len));
        }
        if rest.len() < 5 + len {
            if buf.len() >= MAX_BUFFERED {
                return Err(HelloError::TooLarge(buf.len()));
            }
            // Parse what the partial record already holds so a broken header fails early.
            let partial = &rest[5..];
            if message.is_empty() && partial.first().is_some_and(|&t| t != HANDSHAKE_CLIENT_HELLO) {
                return Err(HelloError::NotClientHello(partial[0]));
            }
            return Ok(Parsed::NeedMore);
        }
        message.extend_from_slice(&rest[5..5 + len]);
        rest = &rest[5 + len..];
    }
}

/// A cursor over a byte slice whose reads fail instead of panicking.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], HelloError> {
        if self.0.len() < n {
            return Err(HelloError::Malformed(what));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, HelloError> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, HelloError> {
        let b = self.take(2, what)?;
        Ok(u16::from(b[0]) << 8 | u16::from(b[1]))
    }

    /// A vector with a one-byte length prefix.
    fn vec8(&mut self, what: &'static str) -> Result<&'a [u8], HelloError> {
        let n = self.u8(what)?;
        self.take(usize::from(n), what)
    }

    /// A vector with a two-byte length prefix.
    fn vec16(&mut self, what: &'static str) -> Result<&'a [u8], HelloError> {
        let n = self.u16(what)?;
        self.take(usize::from(n), what)
    }
}

fn parse_body(body: &[u8]) -> Result<ClientHello, HelloError> {
    let mut r = Reader(body);
    r.take(2, "truncated legacy_version")?;
    r.take(32, "truncated random")?;
    let session_id = r.vec8("truncated session id")?;
    if session_id.len() > 32 {
        return Err(HelloError::Malformed("session id longer than 32 bytes"));
    }
    let suites = r.vec16("truncated cipher suites")?;
    if suites.is_empty() || suites.len() % 2 != 0 {
        return Err(HelloError::Malformed("cipher suite list empty or of odd length"));
    }
    if r.vec8("truncated compression methods")?.is_empty() {
        return Err(HelloError::Malformed("no compression methods"));
    }
    let mut hello = ClientHello::default();
    if r.0.is_empty() {
        // A hello without extensions (old clients): no SNI, no ALPN.
        return Ok(hello);
    }
    let mut exts = Reader(r.vec16("truncated extensions")?);
    if !r.0.is_empty() {
        return Err(HelloError::Malformed("trailing bytes after extensions"));
    }
    let mut seen: Vec<u16> = Vec::new();
    while !exts.0.is_empty() {
        let kind = exts.u16("truncated extension type")?;
        let data = exts.vec16("truncated extension")?;
        if seen.contains(&kind) {
            return Err(HelloError::Malformed("duplicate extension"));
        }
        seen.push(kind);
        match kind {
            EXT_SERVER_NAME => hello.server_name = server_name(data)?,
            EXT_ALPN => hello.alpn = alpn(data)?,
            _ => {}
        }
    }
    Ok(hello)
}

fn server_name(data: &[u8]) -> Result<Option<String>, HelloError> {
    let mut outer = Reader(data);
    let mut list = Reader(outer.vec16("truncated server name list")?);
    if !outer.0.is_empty() {
        return Err(HelloError::Malformed("trailing bytes in server_name"));
    }
    let mut found = None;
    while !list.0.is_empty() {
        let kind = list.u8("truncated server name type")?;
        let name = list.vec16("truncated server name")?;
        if kind == 0 && found.is_none() {
            if name.is_empty() {
                return Err(HelloError::Malformed("empty server name"));
            }
            // Host names are ASCII; anything else is not a name we could route on.
            let text = std::str::from_utf8(name)
                .ok()
                .filter(|s| s.is_ascii())
                .ok_or(HelloError::Malformed("server name is not ASCII"))?;
            // A fully qualified name's trailing dot is not part of the name; a name that is
            // only dots is no name at all.
            let text = text.trim_end_matches('.');
            if text.is_empty() {
                return Err(HelloError::Malformed("empty server name"));
            }
            found = Some(text.to_ascii_lowercase());
        }
    }
    Ok(found)
}

fn alpn(data: &[u8]) -> Result<Vec<Vec<u8>>, HelloError> {
    let mut outer = Reader(data);
    let mut list = Reader(outer.vec16("truncated ALPN list")?);
    if !outer.0.is_empty() {
        return Err(HelloError::Malformed("trailing bytes in ALPN extension"));
    }
    let mut names = Vec::new();
    while !list.0.is_empty() {
        let name = list.vec8("truncated ALPN name")?;
        if name.is_empty() {
            return Err(HelloError::Malformed("empty ALPN name"));
        }
        names.push(name.to_vec());
    }
    if names.is_empty() {
        return Err(HelloError::Malformed("empty ALPN list"));
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Builds a hello with the given SNI and ALPN, in one record.
    pub(crate) fn hello_bytes(sni: Option<&str>, alpn: &[&str]) -> Vec<u8> {
        let mut exts = Vec::new();
        if let Some(name) = sni {
            let mut entry = vec![0u8];
            entry.extend_from_slice(&(name.len() as u16).to_be_bytes());
            entry.extend_from_slice(name.as_bytes());
            let mut ext = (entry.len() as u16).to_be_bytes().to_vec();
            ext.extend_from_slice(&entry);
            exts.extend_from_slice(&0u16.to_be_bytes());
            exts.extend_from_slice(&(ext.len() as u16).to_be_bytes());
            exts.extend_from_slice(&ext);
        }
        if !alpn.is_empty() {
            let mut list = Vec::new();
            for p in alpn {
                list.push(p.len() as u8);
                list.extend_from_slice(p.as_bytes());
            }
            let mut ext = (list.len() as u16).to_be_bytes().to_vec();
            ext.extend_from_slice(&list);
            exts.extend_from_slice(&16u16.to_be_bytes());
            exts.extend_from_slice(&(ext.len() as u16).to_be_bytes());
            exts.extend_from_slice(&ext);
        }
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7; 32]);
        body.push(0);
        body.extend_from_slice(&[0, 2, 0x13, 0x01, 1, 0]);
        body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
        body.extend_from_slice(&exts);
        let mut msg = vec![1, 0, (body.len() >> 8) as u8, body.len() as u8];
        msg.extend_from_slice(&body);
        records(&msg, msg.len())
    }

    /// Splits a handshake message into records of at most `size` bytes.
    pub(crate) fn records(msg: &[u8], size: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for chunk in msg.chunks(size) {
            out.extend_from_slice(&[0x16, 3, 1]);
            out.extend_from_slice(&(chunk.len() as u16).to_be_bytes());
            out.extend_from_slice(chunk);
        }
        out
    }

    fn unwrap_records(bytes: &[u8]) -> Vec<u8> {
        let mut msg = Vec::new();
        let mut rest = bytes;
        while rest.len() >= 5 {
            let len = usize::from(rest[3]) << 8 | usize::from(rest[4]);
            msg.extend_from_slice(&rest[5..5 + len]);
            rest = &rest[5 + len..];
        }
        msg
    }

    #[test]
    fn sni_and_alpn_in_order() {
        let bytes = hello_bytes(Some("Proxy.Example.com."), &["svc-reversetunnel", "h2"]);
        let Parsed::Complete(h) = parse(&bytes).unwrap() else {
            panic!("incomplete")
        };
        assert_eq!(h.server_name.as_deref(), Some("proxy.example.com"));
        assert_eq!(h.alpn, vec![b"svc-reversetunnel".to_vec(), b"h2".to_vec()]);
    }

    /// Found by the `client_hello` fuzz target: "." trimmed of its trailing dot was accepted
    /// as an empty name, which no route can match and no certificate names.
    #[test]
    fn a_name_of_only_dots_is_no_name() {
        for name in ["", ".", "..."] {
            assert_eq!(
                parse(&hello_bytes(Some(name), &[])),
                Err(HelloError::Malformed("empty server name")),
                "{name:?}"
            );
        }
    }

    #[test]
    fn every_prefix_needs_more_and_every_record_split_agrees() {
        let bytes = hello_bytes(Some("a.example"), &["http/1.1"]);
        let whole = parse(&bytes).unwrap();
        for cut in 0..bytes.len() {
            assert_eq!(parse(&bytes[..cut]).unwrap(), Parsed::NeedMore, "cut at {cut}");
        }
        let msg = unwrap_records(&bytes);
        for size in 1..msg.len() {
            let split = records(&msg, size);
            assert_eq!(parse(&split).unwrap(), whole, "records of {size}");
            for cut in (0..split.len()).step_by(7) {
                assert_eq!(parse(&split[..cut]).unwrap(), Parsed::NeedMore);
            }
        }
    }

    #[test]
    fn no_extensions_means_no_sni_no_alpn() {
        let bytes = hello_bytes(None, &[]);
        assert_eq!(parse(&bytes).unwrap(), Parsed::Complete(ClientHello::default()));
    }

    #[test]
    fn rejects_what_is_not_a_hello() {
        assert_eq!(
            parse(b"\x17\x03\x03\x00\x05hello"),
            Err(HelloError::NotHandshake(0x17))
        );
        assert_eq!(parse(b"\x16\x03\x01\x00\x00"), Err(HelloError::RecordLength(0)));
        assert_eq!(parse(b"\x16\x02"), Err(HelloError::RecordVersion(2, 0)));
        assert_eq!(
            parse(b"\x16\x03\x01\x00\x04\x02\x00\x00\x00"),
            Err(HelloError::NotClientHello(2))
        );
        assert_eq!(
            parse(b"\x16\x03\x01\x00\x04\x01\x01\x00\x00"),
            Err(HelloError::TooLarge(0x10000))
        );
    }

    #[test]
    fn buffering_is_capped() {
        // A hello announced at the limit but delivered in tiny records: the parser gives up
        // once the record overhead pushes the buffer past MAX_BUFFERED.
        let mut msg = vec![1, 0, (MAX_HELLO_LEN >> 8) as u8, MAX_HELLO_LEN as u8];
        msg.extend(std::iter::repeat_n(0u8, MAX_HELLO_LEN));
        let split = records(&msg, 4);
        let mut saw_error = false;
        for cut in (0..split.len()).step_by(997) {
            match parse(&split[..cut]) {
                Ok(Parsed::NeedMore) => assert!(cut <= MAX_BUFFERED + 5),
                Err(HelloError::TooLarge(_)) => saw_error = true,
                other => panic!("{other:?}"),
            }
        }
        assert!(saw_error);
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = parse(&bytes);
        }

        #[test]
        fn arbitrary_bytes_after_a_record_header_never_panic(
            body in proptest::collection::vec(any::<u8>(), 0..600)
        ) {
            let mut msg = vec![1, 0, (body.len() >> 8) as u8, body.len() as u8];
            msg.extend_from_slice(&body);
            let _ = parse(&records(&msg, 100));
        }

        #[test]
        fn generated_hellos_round_trip(
            sni in proptest::option::of("[a-z0-9]{1,20}(\\.[a-z0-9]{1,10}){0,3}"),
            alpn in proptest::collection::vec("[a-z0-9/.@-]{1,30}", 0..6),
            size in 1usize..300,
        ) {
            let refs: Vec<&str> = alpn.iter().map(String::as_str).collect();
            let bytes = hello_bytes(sni.as_deref(), &refs);
            let split = records(&unwrap_records(&bytes), size);
            let Ok(Parsed::Complete(h)) = parse(&split) else { panic!("not complete") };
            prop_assert_eq!(h.server_name, sni);
            prop_assert_eq!(h.alpn, alpn.iter().map(|a| a.as_bytes().to_vec()).collect::<Vec<_>>());
        }
    }
}
