//! Child processes with deadlines: spawning, waiting, killing, reading what they printed.

#[allow(clippy::wildcard_imports, reason = "a part of bench.rs, split by part: its helpers are the parent's")]
use super::*;

/// How a child ended.
#[derive(Clone, Copy, Debug)]
pub(super) enum End {
    Exited(ExitStatus),
    /// Still running at the deadline; its process group was killed.
    Killed,
}

impl End {
    pub(super) fn ok(self) -> bool {
        matches!(self, End::Exited(s) if s.success())
    }
    pub(super) fn describe(self) -> String {
        match self {
            End::Exited(s) => s.code().map_or_else(|| s.to_string(), |c| c.to_string()),
            End::Killed => "hang".into(),
        }
    }
}

/// A child in its own process group, stdout and stderr in files; killed (group) when dropped.
pub(super) struct Proc {
    pub(super) name: String,
    pub(super) child: Child,
    pub(super) out: PathBuf,
    pub(super) err: PathBuf,
    pub(super) end: Option<End>,
}

impl Proc {
    pub(super) fn spawn(mut cmd: Command, name: &str, logs: &Path) -> Result<Proc> {
        let out = logs.join(format!("{name}.out"));
        let err = logs.join(format!("{name}.err"));
        cmd.stdin(Stdio::null())
            .stdout(File::create(&out).with_context(|| format!("creating {}", out.display()))?)
            .stderr(File::create(&err).with_context(|| format!("creating {}", err.display()))?)
            .process_group(0);
        let child = cmd.spawn().with_context(|| format!("starting {name} ({:?})", cmd.get_program()))?;
        Ok(Proc { name: name.to_owned(), child, out, err, end: None })
    }

    /// Record the exit if it happened; true once ended.
    pub(super) fn poll(&mut self) -> bool {
        if self.end.is_none() {
            if let Ok(Some(s)) = self.child.try_wait() {
                self.end = Some(End::Exited(s));
            }
        }
        self.end.is_some()
    }

    /// Kill the whole process group (launchers such as mpirun leave children otherwise).
    pub(super) fn kill(&mut self) {
        if !self.poll() {
            let pgid = format!("-{}", self.child.id());
            let _ = Command::new("kill").args(["-KILL", "--", &pgid]).output();
            let _ = self.child.kill();
            let _ = self.child.wait();
            self.end = Some(End::Killed);
        }
    }

    pub(super) fn stdout(&self) -> String {
        read(&self.out)
    }

    pub(super) fn stderr(&self) -> String {
        read(&self.err)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Wait for every process until `deadline`; those still running then are killed and marked hung.
pub(super) fn wait_all(procs: &mut [Proc], deadline: Instant) {
    loop {
        let mut all = true;
        for p in procs.iter_mut() {
            all &= p.poll();
        }
        if all {
            return;
        }
        if Instant::now() >= deadline {
            for p in procs.iter_mut() {
                p.kill();
            }
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Run one command to its end or its deadline; Ok(stdout) if it exited 0, else an error naming
/// the command, the way it ended and the last stderr line.
pub(super) fn run_to_end(cmd: Command, name: &str, logs: &Path, limit: Duration) -> Result<String> {
    let mut p = Proc::spawn(cmd, name, logs)?;
    wait_all(std::slice::from_mut(&mut p), Instant::now() + limit);
    match p.end {
        Some(e) if e.ok() => Ok(p.stdout()),
        Some(End::Killed) | None => {
            bail!("{name}: still running after {} s (killed); logs {}", limit.as_secs(), logs.display())
        }
        Some(e) => bail!("{name}: exited with {}{}; logs {}", e.describe(), last_line(&p.stderr()), logs.display()),
    }
}

pub(super) fn read(path: &Path) -> String {
    std::fs::read(path).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
}

/// The last non-empty line of a log, for an error message.
pub(super) fn last_line(text: &str) -> String {
    text.lines().rev().find(|l| !l.trim().is_empty()).map(|l| format!(" (stderr: {})", l.trim())).unwrap_or_default()
}

pub(super) fn have(program: &str) -> bool {
    Command::new("sh").args(["-c", &format!("command -v {program}")]).output().is_ok_and(|o| o.status.success())
}

/// 16 random bytes from the kernel as 32 hex digits (the job secret).
pub(super) fn secret() -> Result<String> {
    let mut b = [0u8; 16];
    File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).context("reading /dev/urandom")?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// `cmd` with every inherited `R2CCL_*` variable but the logging ones removed.
pub(super) fn clean_env(cmd: &mut Command) {
    for (k, _) in std::env::vars() {
        if k.starts_with("R2CCL_") && k != "R2CCL_DEBUG" && k != "R2CCL_DEBUG_SUBSYS" {
            cmd.env_remove(k);
        }
    }
}

pub(super) fn load_avg() -> String {
    read(Path::new("/proc/loadavg")).split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}
