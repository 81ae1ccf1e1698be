//! Redis as production runs it, on loopback: TLS with certificates made by
//! the `openssl` CLI, passwords, a three-master cluster, and a master with
//! a replica watched by a sentinel. Each process is killed on drop.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::cli;
use crate::support::process::{TempDir, free_port, wait_until};

fn answers(port: u16) -> bool {
    TcpStream::connect(("127.0.0.1", port)).is_ok()
}

/// One `redis-server` (or `redis-sentinel`) process with a plain port for
/// the test's own commands.
pub struct Server {
    child: Option<Child>,
    pub port: u16,
    pub password: Option<String>,
    dir: TempDir,
}

impl Server {
    /// Starts `program` with `args` after the usual ones (`--port`, no
    /// persistence), and waits until its port answers `PING`.
    pub fn start(program: &str, args: &[String], password: Option<&str>, bus: bool) -> Server {
        for _ in 0..5 {
            let dir = TempDir::new("redis");
            // A cluster node's bus listens on port + 10000.
            let port = free_port(bus.then_some(10_000));
            let mut cmd = Command::new(program);
            if program == "redis-sentinel" {
                let conf = dir.0.join("sentinel.conf");
                let text = format!(
                    "port {port}\nbind 127.0.0.1\ndir {}\n{}\n",
                    dir.0.display(),
                    args.join("\n")
                );
                std::fs::write(&conf, text).expect("write sentinel.conf");
                cmd.arg(&conf);
            } else {
                cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                    .args(["--save", "", "--appendonly", "no"])
                    .args(["--dir", &dir.0.to_string_lossy()])
                    .args(args);
            }
            let child = cmd
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("start {program}: {e}"));
            let mut server = Server {
                child: Some(child),
                port,
                password: password.map(str::to_owned),
                dir,
            };
            if server.wait_ready() {
                return server;
            }
            server.kill();
        }
        panic!("{program} never started on a free port");
    }

    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let Some(child) = self.child.as_mut() else {
                return false;
            };
            if !matches!(child.try_wait(), Ok(None)) {
                return false;
            }
            let pid = format!("process_id:{}", child.id());
            if answers(self.port) && self.cli(&["PING"]) == "PONG" {
                // The process that answers must be this one, not another
                // test's that took the port.
                return self.cli(&["INFO", "server"]).contains(&pid);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Runs `redis-cli` against its plain port, with its password.
    pub fn cli(&self, args: &[&str]) -> String {
        cli(self.port, self.password.as_deref(), args)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills it at once (SIGKILL, by its own PID).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir.0
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate it
/// signed, and a second CA that signed nothing here; PEM files in `dir`.
pub struct Certs {
    pub dir: TempDir,
}

impl Certs {
    pub fn make() -> Certs {
        let dir = TempDir::new("certs");
        let run = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(&dir.0)
                .output()
                .expect("run openssl");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        for ca in ["ca", "other-ca"] {
            run(&[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                &format!("/CN=tollgate test {ca}"),
                "-keyout",
                &format!("{ca}.key"),
                "-out",
                &format!("{ca}.pem"),
            ]);
        }
        std::fs::write(
            dir.0.join("server.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        std::fs::write(dir.0.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
        for (name, cn) in [("server", "127.0.0.1"), ("client", "tollgate client")] {
            run(&[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                &format!("/CN={cn}"),
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
            ]);
            run(&[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                &format!("{name}.ext"),
                "-out",
                &format!("{name}.pem"),
            ]);
        }
        Certs { dir }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.0.join(name)
    }

    pub fn pem(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.path(name)).unwrap()
    }

    /// A server with a TLS port as well as its plain one; with
    /// `auth_clients`, TLS clients must present a certificate of the CA.
    pub fn server(&self, auth_clients: bool) -> (Server, u16) {
        let tls_port = free_port(None);
        let file = |n: &str| self.path(n).to_string_lossy().into_owned();
        let args = [
            "--tls-port".to_owned(),
            tls_port.to_string(),
            "--tls-cert-file".to_owned(),
            file("server.pem"),
            "--tls-key-file".to_owned(),
            file("server.key"),
            "--tls-ca-cert-file".to_owned(),
            file("ca.pem"),
            "--tls-auth-clients".to_owned(),
            if auth_clients { "yes" } else { "no" }.to_owned(),
        ];
        (Server::start("redis-server", &args, None, false), tls_port)
    }
}

/// Three masters, no replicas, all slots covered, each with `password`.
pub struct Cluster {
    pub nodes: Vec<Server>,
}

impl Cluster {
    pub fn start(password: &str) -> Cluster {
        let mut args: Vec<String> = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "5000",
        ]
        .map(String::from)
        .to_vec();
        args.extend(["--requirepass", password, "--masterauth", password].map(String::from));
        let nodes: Vec<Server> = (0..3)
            .map(|_| Server::start("redis-server", &args, Some(password), true))
            .collect();
        let mut cmd = Command::new("redis-cli");
        cmd.args(["--no-auth-warning", "-a", password, "--cluster", "create"]);
        for n in &nodes {
            cmd.arg(format!("127.0.0.1:{}", n.port));
        }
        let out = cmd
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        while !nodes
            .iter()
            .all(|n| n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"))
        {
            assert!(Instant::now() < deadline, "the cluster never became ok");
            std::thread::sleep(Duration::from_millis(50));
        }
        Cluster { nodes }
    }
}

/// A master and its replica, both with `password`, watched by one sentinel
/// (quorum 1, down after 1 s) that has no password of its own.
pub struct Sentinel {
    pub master: Server,
    pub replica: Server,
    pub sentinel: Server,
}

impl Sentinel {
    pub const NAME: &'static str = "mymaster";

    pub fn start(password: &str) -> Sentinel {
        let auth = ["--requirepass", password, "--masterauth", password].map(String::from);
        let master = Server::start("redis-server", &auth, Some(password), false);
        let mut replica_args = auth.to_vec();
        replica_args.extend([
            "--replicaof".into(),
            "127.0.0.1".into(),
            master.port.to_string(),
        ]);
        let replica = Server::start("redis-server", &replica_args, Some(password), false);
        wait_until(Duration::from_secs(20), "the replica to sync", || {
            replica
                .cli(&["INFO", "replication"])
                .contains("master_link_status:up")
        });
        let conf = [
            format!(
                "sentinel monitor {} 127.0.0.1 {} 1",
                Self::NAME,
                master.port
            ),
            format!("sentinel auth-pass {} {password}", Self::NAME),
            format!("sentinel down-after-milliseconds {} 1000", Self::NAME),
            format!("sentinel failover-timeout {} 10000", Self::NAME),
        ];
        let sentinel = Server::start("redis-sentinel", &conf, None, false);
        // A failover needs a replica the sentinel knows of.
        let replica_port = format!("{}", replica.port);
        wait_until(
            Duration::from_secs(30),
            "the sentinel to see the replica",
            || {
                sentinel
                    .cli(&["SENTINEL", "REPLICAS", Self::NAME])
                    .contains(&replica_port)
            },
        );
        Sentinel {
            master,
            replica,
            sentinel,
        }
    }
}
