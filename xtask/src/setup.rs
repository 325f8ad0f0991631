//! `cargo xtask setup`: what the test command needs besides Rust, on a Debian machine. Each
//! step checks first and does nothing when its part is there, so running it again is cheap;
//! `.ci/run` runs it on every clean clone, which keeps it working as the README writes it.
//!
//! - PostgreSQL at 127.0.0.1:5432 with trust authentication for local TCP (the store's tests
//!   create and drop a database each, as `postgres`);
//! - Python 3 with `jsonschema` and `PyYAML` (the independent validator of the schemas);
//! - Chromium and ChromeDriver (the console's tests drive a headless browser).

use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

pub fn setup() -> Result<()> {
    postgres()?;
    python()?;
    browser()?;
    println!("setup: every prerequisite of `cargo test --workspace --all-features` is in place");
    Ok(())
}

fn postgres() -> Result<()> {
    if !found("pg_isready") {
        apt_install(&["postgresql"])?;
    }
    if !quietly("pg_isready", &["-q", "-h", "127.0.0.1", "-p", "5432"]) {
        let cluster = cluster()?;
        println!("setup: starting PostgreSQL {}", cluster.version);
        // Its status is not the verdict (a cluster already starting fails it): the answer
        // on the port is.
        let _ = Command::new("pg_ctlcluster")
            .args(["--skip-systemctl-redirect", &cluster.version, "main", "start"])
            .status()
            .context("cannot run pg_ctlcluster")?;
        let ready = (0..30).any(|_| {
            std::thread::sleep(std::time::Duration::from_secs(1));
            quietly("pg_isready", &["-q", "-h", "127.0.0.1", "-p", "5432"])
        });
        if !ready {
            bail!("PostgreSQL {} started but does not answer on 127.0.0.1:5432", cluster.version);
        }
    }
    if connects_as_postgres() {
        return Ok(());
    }
    // A fresh Debian cluster asks a password over TCP: the tests log in without one.
    let cluster = cluster()?;
    let hba = cluster.config.join("pg_hba.conf");
    let rules =
        std::fs::read_to_string(&hba).with_context(|| format!("cannot read {}", hba.display()))?;
    let trust = "host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\n";
    println!("setup: trusting local TCP logins in {} (for the tests only)", hba.display());
    std::fs::write(
        &hba,
        format!("# cargo xtask setup: the tests log in without a password\n{trust}{rules}"),
    )
    .with_context(|| format!("cannot write {}", hba.display()))?;
    let reloaded = Command::new("pg_ctlcluster")
        .args(["--skip-systemctl-redirect", &cluster.version, "main", "reload"])
        .status()
        .context("cannot run pg_ctlcluster")?;
    if !reloaded.success() || !connects_as_postgres() {
        bail!("PostgreSQL at 127.0.0.1:5432 still refuses `postgres` without a password");
    }
    Ok(())
}

/// The first PostgreSQL cluster Debian's tools know of.
struct Cluster {
    version: String,
    config: PathBuf,
}

fn cluster() -> Result<Cluster> {
    let versions = std::fs::read_dir("/etc/postgresql")
        .context("no /etc/postgresql: is PostgreSQL installed?")?;
    let mut names: Vec<String> = versions
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let version = names.pop().context("no cluster under /etc/postgresql")?;
    let config = PathBuf::from("/etc/postgresql").join(&version).join("main");
    Ok(Cluster { version, config })
}

fn connects_as_postgres() -> bool {
    Command::new("psql")
        .args(["-w", "-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-c", "SELECT 1"])
        .env_remove("PGPASSWORD")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

fn python() -> Result<()> {
    let has_packages = || quietly("python3", &["-c", "import jsonschema, yaml"]);
    if has_packages() {
        return Ok(());
    }
    // Debian packages them; pip is the way elsewhere.
    if apt_install(&["python3-jsonschema", "python3-yaml"]).is_err() || !has_packages() {
        println!("setup: installing jsonschema and PyYAML with pip");
        let status = Command::new("python3")
            .args(["-m", "pip", "install", "--quiet", "jsonschema", "pyyaml"])
            .status()
            .context("cannot run python3 -m pip")?;
        if !status.success() || !has_packages() {
            bail!("python3 cannot import jsonschema and yaml after installing them");
        }
    }
    Ok(())
}

fn browser() -> Result<()> {
    if found("chromium") && found("chromedriver") {
        return Ok(());
    }
    apt_install(&["chromium", "chromium-driver"])
}

/// Installs Debian packages, refreshing the package lists once if they are stale.
fn apt_install(packages: &[&str]) -> Result<()> {
    println!("setup: installing {}", packages.join(" "));
    let root = Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    let apt = |args: &[&str]| -> Result<bool> {
        let mut command = if root { Command::new("apt-get") } else { Command::new("sudo") };
        if !root {
            command.arg("apt-get");
        }
        let status = command
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(Stdio::null())
            .status()
            .context("cannot run apt-get (this step is for Debian and Ubuntu)")?;
        Ok(status.success())
    };
    let install: Vec<&str> =
        ["install", "-y", "-q"].into_iter().chain(packages.iter().copied()).collect();
    if apt(&install)? || (apt(&["update", "-q"])? && apt(&install)?) {
        return Ok(());
    }
    bail!("apt-get install {} failed", packages.join(" "))
}

fn found(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

fn quietly(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}
