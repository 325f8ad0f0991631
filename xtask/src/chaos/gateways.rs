//! `hookgate serve` child processes on fixed loopback ports, killed and restarted.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// How long a gateway may take to print its address after it starts.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a stopped gateway may take to exit after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// How to start every gateway of a run.
#[derive(Debug, Clone)]
pub struct Launch {
    pub binary: PathBuf,
    pub database_url: String,
    pub pipelines: PathBuf,
    pub instances: PathBuf,
    /// Environment: the pipelines' and connectors' secrets.
    pub env: Vec<(String, String)>,
    pub args: Vec<String>,
    pub logs: PathBuf,
}

/// One gateway process slot: a port that outlives the processes on it.
#[derive(Debug)]
pub struct Gateway {
    pub index: usize,
    pub port: u16,
    child: Option<Child>,
    pub starts: u32,
}

impl Gateway {
    pub fn new(index: usize, port: u16) -> Gateway {
        Gateway { index, port, child: None, starts: 0 }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Starts the process and waits until it listens. Fails if it exits first (for instance
    /// while the database is unreachable: it refuses to start without one).
    pub fn start(&mut self, launch: &Launch) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(launch.logs.join(format!("gateway-{}.log", self.index)))
            .context("gateway log")?;
        let mut command = Command::new(&launch.binary);
        command
            .arg("serve")
            .args(["--listen", &format!("127.0.0.1:{}", self.port)])
            .args(["--database-url", &launch.database_url])
            .args(["--instances"])
            .arg(&launch.instances)
            .args(&launch.args)
            .arg(&launch.pipelines)
            .env("RUST_LOG", "warn")
            .env("HOOKGATE_WORKER_ID", format!("gateway-{}.{}", self.index, self.starts))
            .envs(launch.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log);
        let mut child = command.spawn().context("cannot start hookgate")?;
        let stdout = child.stdout.take().context("piped stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let _ = tx.send(lines.next().and_then(Result::ok));
            // Keep draining so the child never blocks on a full pipe.
            for _ in lines {}
        });
        match rx.recv_timeout(START_TIMEOUT) {
            Ok(Some(line)) if line.starts_with("hookgate listening on") => {
                self.child = Some(child);
                self.starts += 1;
                Ok(())
            }
            other => {
                let _ = child.kill();
                let status = child.wait();
                bail!("gateway {} did not start ({other:?}, {status:?})", self.index)
            }
        }
    }

    /// Starts the process, retrying until `deadline` (the database may be down meanwhile).
    pub fn start_until(&mut self, launch: &Launch, deadline: Instant) -> Result<()> {
        loop {
            match self.start(launch) {
                Ok(()) => return Ok(()),
                Err(error) if Instant::now() < deadline => {
                    tracing_note(&format!("{error:#}; retrying"));
                    std::thread::sleep(Duration::from_millis(500));
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// SIGKILL: no chance to finish anything.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then SIGKILL if it does not exit in time.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Free loopback ports, one per gateway. Each is bound and released: a gateway started on it
/// at once gets it (the kernel does not hand a just-released port to the next ephemeral bind).
pub fn free_ports(count: usize) -> Result<Vec<u16>> {
    let listeners: Vec<std::net::TcpListener> = (0..count)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<_, _>>()
        .context("a loopback port")?;
    listeners.iter().map(|l| Ok(l.local_addr()?.port())).collect()
}

fn tracing_note(text: &str) {
    eprintln!("  chaos: {text}");
}

/// Where the gateways' logs go, kept after the run for post-mortems.
pub fn logs_dir(out: &Path, backend: &str) -> Result<PathBuf> {
    let dir = out.join(format!("logs-{backend}"));
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("cannot clear {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}
