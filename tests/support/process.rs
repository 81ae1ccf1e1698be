//! What every test that starts a process needs, in one place: a temporary
//! folder, a free loopback port, a bounded wait, and the address a child
//! logged that it listens on.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// A folder of its own under the temporary directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// A new empty folder whose name holds `tag`, this process's id and a
    /// counter, so that tests running at once never share one.
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("tollgate-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create a temporary directory");
        TempDir(dir)
    }

    /// Writes `text` to `name` in the folder, whole: to a hidden file
    /// first, then renamed, as a deployment tool does (a process watching
    /// the folder never reads half a file).
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        let hidden = self.0.join(format!(".{name}.tmp"));
        std::fs::write(&hidden, text).unwrap();
        std::fs::rename(&hidden, &path).unwrap();
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A loopback port nobody listens on now (nor on `port + offset`, if given:
/// a Redis Cluster node's bus listens on `port + 10000`).
pub fn free_port(also_free_at_offset: Option<u16>) -> u16 {
    for _ in 0..1000 {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let port = listener.local_addr().expect("local address").port();
        if let Some(offset) = also_free_at_offset {
            let Some(other) = port.checked_add(offset) else {
                continue;
            };
            if TcpListener::bind(("127.0.0.1", other)).is_err() {
                continue;
            }
        }
        return port;
    }
    panic!("no free loopback port found");
}

/// Polls `done` every 50 ms until it holds, or panics naming `what` after
/// `limit`.
pub fn wait_until(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "waited {limit:?} for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `line` without its terminal colour sequences.
pub fn strip_colours(line: &str) -> String {
    let mut plain = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // An escape sequence ends with a letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    plain
}

/// The address in a log line of `tollgate` that says `message` and
/// `listen=ADDR` (or `"listen":"ADDR"` with `--log-format json`), its
/// colours taken out.
pub fn listen_address(line: &str, message: &str) -> Option<SocketAddr> {
    let plain = strip_colours(line);
    if !plain.contains(message) {
        return None;
    }
    if let Some(at) = plain.find("\"listen\":\"") {
        let rest = &plain[at + "\"listen\":\"".len()..];
        return rest.split('"').next()?.parse().ok();
    }
    let rest = &plain[plain.find("listen=")? + "listen=".len()..];
    rest.split_whitespace().next()?.parse().ok()
}
