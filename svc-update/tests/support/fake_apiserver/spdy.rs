//! The fake's SPDY/3.1 sessions (`Upgrade: SPDY/3.1`):
//!
//! - `portforward` (`X-Stream-Protocol-Version: portforward.k8s.io`, bare or tunnelled in
//!   WebSocket): for each forwarded connection kubectl opens an `error` and a `data` stream
//!   naming the `port`; the "pod" is this machine, so the data stream is joined to
//!   `127.0.0.1:<port>`.
//! - `exec` (`v4.channel.k8s.io`, what kubectl uses with
//!   `KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false` and older clients): kubectl opens `error`,
//!   `stdin`, `stdout` and `stderr` streams as asked; once they are all open the command runs
//!   locally, stdin ending with the stream's FIN, and its exit is the `Status` on `error`.
//!
//! SPDY header blocks are zlib streams with a preset dictionary (one stream per direction for
//! the whole connection). The client's blocks are inflated here ([`Inflater`]); the
//! dictionary is the one compiled into the kubectl under test, found in its binary and
//! checked against the DICTID of the client's zlib header, so a wrong one cannot go unnoticed.
//! The fake's own blocks are zlib stored blocks, which need no dictionary.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Mutex, mpsc};

/// The kubectl whose SPDY header dictionary is used.
const KUBECTL: &str = "/usr/bin/kubectl";
/// How the SPDY/3 header dictionary starts (its first two length-prefixed words).
const DICTIONARY_START: &[u8] = b"\x00\x00\x00\x07options\x00\x00\x00\x04head";

const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
const FLAG_FIN: u8 = 1;

type Writer = Arc<Mutex<Box<dyn AsyncWrite + Unpin + Send>>>;

/// What an exec session runs.
pub(super) struct Exec {
    /// The command and its arguments.
    pub command: Vec<String>,
    /// Whether stdin, stdout and stderr streams are expected.
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
}

/// The exec streams opened so far.
#[derive(Default)]
struct ExecStreams {
    error: Option<u32>,
    stdin: Option<(u32, mpsc::UnboundedReceiver<Option<Vec<u8>>>)>,
    stdout: Option<u32>,
    stderr: Option<u32>,
}

/// Serves one upgraded connection until the client goes away: port-forward, or `exec`.
pub(super) async fn session<S>(io: S, mut exec: Option<Exec>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut streams = ExecStreams::default();
    let (mut rd, wr) = tokio::io::split(io);
    let wr: Writer = Arc::new(Mutex::new(Box::new(wr)));
    let mut inflater: Option<Inflater> = None;
    let mut compressor_started = false;
    // Data stream id → its connection's input (None: the client half-closed it).
    let mut data: HashMap<u32, mpsc::UnboundedSender<Option<Vec<u8>>>> = HashMap::new();
    // Request id → the error stream id.
    let mut errors: HashMap<String, u32> = HashMap::new();
    loop {
        let mut head = [0u8; 8];
        if rd.read_exact(&mut head).await.is_err() {
            return;
        }
        let flags = head[4];
        let len = usize::from(head[5]) << 16 | usize::from(head[6]) << 8 | usize::from(head[7]);
        let mut payload = vec![0u8; len];
        if rd.read_exact(&mut payload).await.is_err() {
            return;
        }
        if head[0] & 0x80 == 0 {
            let id = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
            if let Some(tx) = data.get(&id) {
                if !payload.is_empty() {
                    let _ = tx.send(Some(payload));
                }
                if flags & FLAG_FIN != 0 {
                    let _ = tx.send(None);
                }
            }
            continue;
        }
        match u16::from_be_bytes([head[2], head[3]]) {
            SYN_STREAM if payload.len() >= 10 => {
                let id = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) & 0x7fff_ffff;
                let block = &payload[10..];
                let inflater = match &mut inflater {
                    Some(i) => i,
                    None => match Inflater::for_client(block) {
                        Ok(i) => inflater.insert(i),
                        Err(e) => {
                            eprintln!("fake apiserver: SPDY headers: {e}");
                            return;
                        }
                    },
                };
                let headers = match inflater.feed(block).and_then(|raw| parse_headers(&raw)) {
                    Ok(h) => h,
                    Err(e) => {
                        eprintln!("fake apiserver: SPDY headers: {e}");
                        return;
                    }
                };
                let mut reply = id.to_be_bytes().to_vec();
                reply.extend(stored_block(&0u32.to_be_bytes(), !compressor_started));
                compressor_started = true;
                if write_control(&wr, SYN_REPLY, 0, &reply).await.is_err() {
                    return;
                }
                let get = |k: &str| headers.get(k).cloned().unwrap_or_default();
                let request = get("requestid");
                if let Some(wanted) = &exec {
                    match get("streamtype").as_str() {
                        "error" => streams.error = Some(id),
                        "stdin" => {
                            let (tx, rx) = mpsc::unbounded_channel();
                            data.insert(id, tx);
                            streams.stdin = Some((id, rx));
                        }
                        "stdout" => streams.stdout = Some(id),
                        "stderr" => streams.stderr = Some(id),
                        other => eprintln!("fake apiserver: SPDY exec stream type {other:?} ignored"),
                    }
                    let ready = streams.error.is_some()
                        && streams.stdin.is_some() == wanted.stdin
                        && streams.stdout.is_some() == wanted.stdout
                        && streams.stderr.is_some() == wanted.stderr;
                    if ready && let Some(exec) = exec.take() {
                        tokio::spawn(run_exec(wr.clone(), exec, std::mem::take(&mut streams)));
                    }
                    continue;
                }
                match get("streamtype").as_str() {
                    "error" => {
                        errors.insert(request, id);
                    }
                    "data" => {
                        let (tx, rx) = mpsc::unbounded_channel();
                        data.insert(id, tx);
                        let error_stream = errors.get(&request).copied();
                        tokio::spawn(forward(wr.clone(), id, error_stream, get("port"), rx));
                    }
                    other => eprintln!("fake apiserver: SPDY stream type {other:?} ignored"),
                }
            }
            RST_STREAM if payload.len() >= 4 => {
                let id = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) & 0x7fff_ffff;
                if let Some(tx) = data.remove(&id) {
                    let _ = tx.send(None);
                }
            }
            PING if write_control(&wr, PING, 0, &payload).await.is_err() => return,
            GOAWAY => return,
            _ => {}
        }
    }
}

/// Runs `exec` locally over its streams; the exit is the `Status` on the error stream.
async fn run_exec(wr: Writer, exec: Exec, streams: ExecStreams) {
    let Some(error) = streams.error else { return };
    let child = tokio::process::Command::new(&exec.command[0])
        .args(&exec.command[1..])
        .stdin(if exec.stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            let failure = serde_json::json!({"metadata": {}, "status": "Failure",
                "message": format!("exec: \"{}\": {e}", exec.command[0]), "reason": "InternalError"});
            for id in [streams.stdout, streams.stderr].into_iter().flatten() {
                let _ = write_data(&wr, id, FLAG_FIN, &[]).await;
            }
            let _ = write_data(&wr, error, FLAG_FIN, failure.to_string().as_bytes()).await;
            return;
        }
    };
    if let (Some(mut input), Some((_, mut rx))) = (child.stdin.take(), streams.stdin) {
        tokio::spawn(async move {
            while let Some(Some(chunk)) = rx.recv().await {
                if input.write_all(&chunk).await.is_err() {
                    return;
                }
            }
        });
    }
    let pump = |out: Option<Box<dyn AsyncRead + Unpin + Send>>, id: Option<u32>| {
        let wr = wr.clone();
        async move {
            let (Some(mut out), Some(id)) = (out, id) else {
                return;
            };
            let mut buf = vec![0u8; 16 * 1024];
            while let Ok(n @ 1..) = out.read(&mut buf).await {
                if write_data(&wr, id, 0, &buf[..n]).await.is_err() {
                    return;
                }
            }
            let _ = write_data(&wr, id, FLAG_FIN, &[]).await;
        }
    };
    let stdout = child
        .stdout
        .take()
        .map(|s| Box::new(s) as Box<dyn AsyncRead + Unpin + Send>);
    let stderr = child
        .stderr
        .take()
        .map(|s| Box::new(s) as Box<dyn AsyncRead + Unpin + Send>);
    tokio::join!(pump(stdout, streams.stdout), pump(stderr, streams.stderr));
    let result = super::pods::exit_status(child.wait().await);
    let _ = write_data(&wr, error, FLAG_FIN, result.to_string().as_bytes()).await;
}

/// Joins data stream `id` to `127.0.0.1:<port>`; a failure to connect is written on the
/// error stream, as the kubelet does.
async fn forward(
    wr: Writer,
    id: u32,
    error_stream: Option<u32>,
    port: String,
    mut rx: mpsc::UnboundedReceiver<Option<Vec<u8>>>,
) {
    let tcp = match port.parse::<u16>() {
        Ok(p) => tokio::net::TcpStream::connect(("127.0.0.1", p))
            .await
            .map_err(|e| e.to_string()),
        Err(e) => Err(format!("port {port:?}: {e}")),
    };
    let tcp = match tcp {
        Ok(t) => t,
        Err(e) => {
            if let Some(err) = error_stream {
                let text = format!("error forwarding port {port} to pod: {e}");
                let _ = write_data(&wr, err, FLAG_FIN, text.as_bytes()).await;
            }
            let _ = write_data(&wr, id, FLAG_FIN, &[]).await;
            return;
        }
    };
    let (mut from, mut to) = tcp.into_split();
    let inbound = tokio::spawn(async move {
        while let Some(Some(chunk)) = rx.recv().await {
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    });
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if write_data(&wr, id, 0, &buf[..n]).await.is_err() {
                    break;
                }
            }
        }
    }
    let _ = write_data(&wr, id, FLAG_FIN, &[]).await;
    let _ = inbound.await;
}

async fn write_control(wr: &Writer, kind: u16, flags: u8, payload: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(payload.len())
        .map_err(std::io::Error::other)?
        .to_be_bytes();
    let mut frame = vec![0x80, 3];
    frame.extend_from_slice(&kind.to_be_bytes());
    frame.push(flags);
    frame.extend_from_slice(&len[1..]);
    frame.extend_from_slice(payload);
    let mut w = wr.lock().await;
    w.write_all(&frame).await?;
    w.flush().await
}

async fn write_data(wr: &Writer, id: u32, flags: u8, payload: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(payload.len())
        .map_err(std::io::Error::other)?
        .to_be_bytes();
    let mut frame = (id & 0x7fff_ffff).to_be_bytes().to_vec();
    frame.push(flags);
    frame.extend_from_slice(&len[1..]);
    frame.extend_from_slice(payload);
    let mut w = wr.lock().await;
    w.write_all(&frame).await?;
    w.flush().await
}

/// `data` as one non-final zlib stored block and a sync flush, preceded by the zlib header (no dictionary) for
/// the first block of the connection.
fn stored_block(data: &[u8], first: bool) -> Vec<u8> {
    let mut out = if first { vec![0x78, 0x01] } else { Vec::new() };
    let len = u16::try_from(data.len()).expect("a small header block");
    out.push(0);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&(!len).to_le_bytes());
    out.extend_from_slice(data);
    // A sync flush (an empty stored block), as a real compressor ends each header block with:
    // readers decode the block without reading past the frame.
    out.extend_from_slice(&[0, 0, 0, 0xff, 0xff]);
    out
}

/// A SPDY/3 name/value block: a count, then length-prefixed names and values.
fn parse_headers(raw: &[u8]) -> Result<HashMap<String, String>, String> {
    let mut pos = 0;
    let word = |pos: &mut usize| -> Result<Vec<u8>, String> {
        let len = raw
            .get(*pos..*pos + 4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
            .ok_or("a truncated header block")?;
        let value = raw
            .get(*pos + 4..*pos + 4 + len)
            .ok_or("a truncated header block")?;
        *pos += 4 + len;
        Ok(value.to_vec())
    };
    let count = raw
        .get(0..4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or("an empty header block")?;
    pos += 4;
    let mut headers = HashMap::new();
    for _ in 0..count {
        let name = String::from_utf8_lossy(&word(&mut pos)?).to_lowercase();
        let value = String::from_utf8_lossy(&word(&mut pos)?).into_owned();
        headers.insert(name, value);
    }
    Ok(headers)
}

fn adler32(data: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for &x in data {
        a = (a + u32::from(x)) % 65521;
        b = (b + a) % 65521;
    }
    (b << 16) | a
}

/// The SPDY header dictionary compiled into kubectl whose Adler-32 is `id`.
fn dictionary(id: u32) -> Result<Vec<u8>, String> {
    let binary = std::fs::read(KUBECTL).map_err(|e| format!("reading {KUBECTL}: {e}"))?;
    let start = binary
        .windows(DICTIONARY_START.len())
        .position(|w| w == DICTIONARY_START)
        .ok_or_else(|| format!("{KUBECTL} holds no SPDY header dictionary"))?;
    let (mut a, mut b) = (1u32, 0u32);
    for (n, &x) in binary[start..binary.len().min(start + 4096)].iter().enumerate() {
        a = (a + u32::from(x)) % 65521;
        b = (b + a) % 65521;
        if (b << 16) | a == id {
            let dict = binary[start..=start + n].to_vec();
            debug_assert_eq!(adler32(&dict), id);
            return Ok(dict);
        }
    }
    Err(format!(
        "no SPDY header dictionary in {KUBECTL} has the client's DICTID {id:08x}"
    ))
}

/// A streaming inflater (RFC 1950/1951) over the client's header blocks: each block ends with
/// a sync flush, so every frame's bytes decode to whole header blocks.
pub(super) struct Inflater {
    input: Vec<u8>,
    /// Position in `input`, in bits.
    bit: usize,
    /// The dictionary and everything inflated so far (the back-reference window).
    out: Vec<u8>,
}

impl Inflater {
    /// From the first header block, whose zlib header names the dictionary.
    fn for_client(first: &[u8]) -> Result<Inflater, String> {
        let [cmf, flg, ..] = first else {
            return Err("a header block without a zlib header".into());
        };
        let mut out = Vec::new();
        if flg & 0x20 != 0 {
            let id = first.get(2..6).ok_or("a truncated zlib header")?;
            out = dictionary(u32::from_be_bytes([id[0], id[1], id[2], id[3]]))?;
        }
        if cmf & 0x0f != 8 {
            return Err(format!("zlib method {} is not deflate", cmf & 0x0f));
        }
        let skip = if flg & 0x20 != 0 { 6 } else { 2 };
        Ok(Inflater {
            input: Vec::new(),
            bit: skip * 8,
            out,
        })
    }

    /// Inflates the next frame's bytes; returns what they decode to.
    fn feed(&mut self, block: &[u8]) -> Result<Vec<u8>, String> {
        self.input.extend_from_slice(block);
        let start = self.out.len();
        while self.bit / 8 < self.input.len() {
            self.block()?;
        }
        Ok(self.out[start..].to_vec())
    }

    fn bits(&mut self, n: usize) -> Result<usize, String> {
        let mut v = 0;
        for i in 0..n {
            let byte = *self
                .input
                .get(self.bit / 8)
                .ok_or("a header block ends inside a deflate block")?;
            v |= usize::from((byte >> (self.bit % 8)) & 1) << i;
            self.bit += 1;
        }
        Ok(v)
    }

    fn block(&mut self) -> Result<(), String> {
        let _final = self.bits(1)?;
        match self.bits(2)? {
            0 => {
                self.bit = self.bit.div_ceil(8) * 8;
                let len = self.bits(16)?;
                let _nlen = self.bits(16)?;
                let at = self.bit / 8;
                let data = self
                    .input
                    .get(at..at + len)
                    .ok_or("a truncated stored block")?
                    .to_vec();
                self.out.extend_from_slice(&data);
                self.bit += len * 8;
                Ok(())
            }
            1 => {
                let mut lengths = [0u8; 288];
                lengths[..144].fill(8);
                lengths[144..256].fill(9);
                lengths[256..280].fill(7);
                lengths[280..].fill(8);
                let lit = Huffman::new(&lengths);
                let dist = Huffman::new(&[5; 30]);
                self.codes(&lit, &dist)
            }
            2 => {
                let hlit = self.bits(5)? + 257;
                let hdist = self.bits(5)? + 1;
                let hclen = self.bits(4)? + 4;
                const ORDER: [usize; 19] = [16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15];
                let mut cl = [0u8; 19];
                for &i in &ORDER[..hclen] {
                    cl[i] = self.bits(3)? as u8;
                }
                let clh = Huffman::new(&cl);
                let mut lengths = vec![0u8; hlit + hdist];
                let mut i = 0;
                while i < lengths.len() {
                    let sym = clh.decode(self)?;
                    let (value, repeat) = match sym {
                        0..=15 => (sym as u8, 1),
                        16 => (
                            *lengths
                                .get(i.wrapping_sub(1))
                                .ok_or("a repeat with nothing before")?,
                            3 + self.bits(2)?,
                        ),
                        17 => (0, 3 + self.bits(3)?),
                        _ => (0, 11 + self.bits(7)?),
                    };
                    for _ in 0..repeat {
                        *lengths.get_mut(i).ok_or("too many code lengths")? = value;
                        i += 1;
                    }
                }
                let lit = Huffman::new(&lengths[..hlit]);
                let dist = Huffman::new(&lengths[hlit..]);
                self.codes(&lit, &dist)
            }
            _ => Err("a reserved deflate block type".into()),
        }
    }

    fn codes(&mut self, lit: &Huffman, dist: &Huffman) -> Result<(), String> {
        const LEN_BASE: [usize; 29] = [
            3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115, 131,
            163, 195, 227, 258,
        ];
        const LEN_EXTRA: [usize; 29] = [
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0,
        ];
        const DIST_BASE: [usize; 30] = [
            1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025, 1537, 2049,
            3073, 4097, 6145, 8193, 12289, 16385, 24577,
        ];
        const DIST_EXTRA: [usize; 30] = [
            0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13,
        ];
        loop {
            let sym = lit.decode(self)?;
            match sym {
                0..=255 => self.out.push(sym as u8),
                256 => return Ok(()),
                _ => {
                    let i = sym - 257;
                    let len = LEN_BASE.get(i).ok_or("a bad length code")? + self.bits(LEN_EXTRA[i])?;
                    let d = dist.decode(self)?;
                    let distance =
                        DIST_BASE.get(d).ok_or("a bad distance code")? + self.bits(DIST_EXTRA[d])?;
                    let from = self
                        .out
                        .len()
                        .checked_sub(distance)
                        .ok_or("a distance before the window")?;
                    for k in 0..len {
                        let b = self.out[from + k];
                        self.out.push(b);
                    }
                }
            }
        }
    }
}

/// A canonical Huffman code, decoded bit by bit.
struct Huffman {
    count: [u16; 16],
    symbols: Vec<usize>,
}

impl Huffman {
    fn new(lengths: &[u8]) -> Huffman {
        let mut count = [0u16; 16];
        for &l in lengths {
            count[usize::from(l)] += 1;
        }
        count[0] = 0;
        let mut offs = [0usize; 16];
        for l in 1..15 {
            offs[l + 1] = offs[l] + usize::from(count[l]);
        }
        let mut symbols = vec![0; lengths.len()];
        for (sym, &l) in lengths.iter().enumerate() {
            if l != 0 {
                symbols[offs[usize::from(l)]] = sym;
                offs[usize::from(l)] += 1;
            }
        }
        Huffman { count, symbols }
    }

    fn decode(&self, r: &mut Inflater) -> Result<usize, String> {
        let (mut code, mut first, mut index) = (0i64, 0i64, 0i64);
        for len in 1..16 {
            code |= r.bits(1)? as i64;
            let count = i64::from(self.count[len]);
            if code - count < first {
                return Ok(self.symbols[(index + code - first) as usize]);
            }
            index += count;
            first = (first + count) << 1;
            code <<= 1;
        }
        Err("a bad Huffman code".into())
    }
}
