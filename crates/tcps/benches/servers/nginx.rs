//! Debian's nginx as the third server of the benchmarks: a master and
//! `workers` worker processes serving files from a temporary directory on
//! loopback, with a configuration of its own (no access log, sendfile,
//! keep-alive without limits). `scripts/setup.sh` installs the package.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running nginx; stopped (SIGTERM, nginx's fast shutdown) when dropped.
pub struct Nginx {
    child: Child,
    dir: PathBuf,
    pub addr: SocketAddr,
}

/// How long nginx may take to listen.
const START_TIMEOUT: Duration = Duration::from_secs(10);

impl Nginx {
    /// Serves `files` (name, bytes) with `workers` worker processes.
    pub fn start(files: &[(&str, &[u8])], workers: usize) -> Result<Nginx, String> {
        static STARTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "tcps-bench-nginx-{}-{}",
            std::process::id(),
            STARTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let www = dir.join("www");
        std::fs::create_dir_all(&www).map_err(|e| format!("{}: {e}", www.display()))?;
        for (name, bytes) in files {
            std::fs::write(www.join(name), bytes).map_err(|e| format!("{name}: {e}"))?;
        }
        let port = rand_port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let d = dir.display();
        let conf = format!(
            "daemon off;\nmaster_process on;\nuser root root;\nworker_processes {workers};\n\
             pid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
             events {{ worker_connections 8192; use epoll; }}\n\
             http {{\n  access_log off;\n  sendfile on;\n  tcp_nodelay on;\n\
               keepalive_requests 1000000000;\n  keepalive_timeout 300s;\n\
               open_file_cache max=64 inactive=600s;\n  open_file_cache_valid 600s;\n\
               client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
               fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
               types {{ text/html html; }}\n  default_type application/octet-stream;\n\
               server {{\n    listen {addr} backlog=4096;\n    root {d}/www;\n    location / {{ }}\n  }}\n}}\n"
        );
        let conf_path = dir.join("nginx.conf");
        std::fs::write(&conf_path, conf).map_err(|e| format!("{}: {e}", conf_path.display()))?;
        let child = Command::new("nginx")
            .arg("-c")
            .arg(&conf_path)
            .arg("-p")
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                format!("starting nginx: {e} (scripts/setup.sh installs Debian's nginx)")
            })?;
        let mut n = Nginx { child, dir, addr };
        let t0 = Instant::now();
        while std::net::TcpStream::connect(addr).is_err() {
            if let Ok(Some(status)) = n.child.try_wait() {
                let log = std::fs::read_to_string(n.dir.join("error.log")).unwrap_or_default();
                return Err(format!("nginx exited ({status}): {log}"));
            }
            if t0.elapsed() > START_TIMEOUT {
                return Err("nginx did not listen within 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // Its workers, for the CPU accounting.
        let t0 = Instant::now();
        while n.pids().len() < workers + 1 && t0.elapsed() < START_TIMEOUT {
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(n)
    }

    /// The master's pid and its workers'.
    pub fn pids(&self) -> Vec<u32> {
        let master = self.child.id();
        let children = std::fs::read_to_string(format!("/proc/{master}/task/{master}/children"))
            .unwrap_or_default();
        std::iter::once(master)
            .chain(children.split_whitespace().filter_map(|p| p.parse().ok()))
            .collect()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SAFETY: SIGTERM to our own child (nginx's master: fast shutdown).
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A port free on loopback now (nginx binds it a moment later).
fn rand_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(18080)
}
