//! `sidecore exec`: stdio, exit codes, the deny policy, the counters and the
//! projected root, through the real binary.

use std::process::{Command, Output, Stdio};

fn exec(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sidecore"))
        .arg("exec")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run the sidecore binary")
}

fn summary(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr)
        .lines()
        .find(|l| l.starts_with("sidecore exec: supervision="))
        .unwrap_or_default()
        .to_owned()
}

fn counter(line: &str, name: &str) -> u64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{name}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name}= in {line:?}"))
}

#[test]
fn cat_prints_the_file_and_opens_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("f.txt");
    std::fs::write(&f, "line one\nline two\n").unwrap();
    let o = exec(&["cat", f.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(o.stdout, b"line one\nline two\n");
    let s = summary(&o);
    assert!(s.contains("supervision=seccomp-user-notif"), "{s}");
    assert!(counter(&s, "trapped") >= 1, "{s}");
    assert!(counter(&s, "openat") >= 1, "{s}");
    assert_eq!(counter(&s, "denied"), 0, "{s}");
}

#[test]
fn exit_code_and_signal_pass_through() {
    assert_eq!(exec(&["sh", "-c", "exit 7"]).status.code(), Some(7));
    assert_eq!(
        exec(&["sh", "-c", "kill -KILL $$"]).status.code(),
        Some(128 + 9)
    );
    let o = exec(&["-q", "/nonexistent/prog"]);
    assert_eq!(o.status.code(), Some(127));
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent/prog"));
}

#[test]
fn stdin_passes_through() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sidecore"))
        .args(["exec", "-q", "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"piped in\n")
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(o.stdout, b"piped in\n");
    assert!(
        o.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn denied_path_gets_eacces_while_the_rest_works() {
    let o = exec(&[
        "sh",
        "-c",
        "cat /etc/shadow; echo rc=$?; cat /etc/passwd >/dev/null && echo ok",
    ]);
    assert_eq!(o.status.code(), Some(0));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("/etc/shadow: Permission denied"), "{err}");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "rc=1\nok\n");
    assert_eq!(counter(&summary(&o), "denied"), 1);

    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "s").unwrap();
    let o = exec(&[
        "--deny",
        dir.path().to_str().unwrap(),
        "cat",
        secret.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(o.stdout.is_empty());
}

#[test]
fn projected_root_supplies_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let rel = "sidecore-exec-projection-test/only-here.txt";
    std::fs::create_dir_all(dir.path().join("sidecore-exec-projection-test")).unwrap();
    std::fs::write(dir.path().join(rel), "projected bytes\n").unwrap();
    let abs = format!("/{rel}");
    assert!(!std::path::Path::new(&abs).exists());
    let o = exec(&["--root", dir.path().to_str().unwrap(), "cat", &abs]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(o.stdout, b"projected bytes\n");
    assert!(counter(&summary(&o), "projected") >= 1);

    let o = exec(&["--root", "/nonexistent/root", "true"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent/root"));
}

#[test]
fn sigterm_and_sigint_reach_the_guest_and_its_status_comes_back() {
    for (sig, code) in [(libc::SIGTERM, 42), (libc::SIGINT, 43), (libc::SIGHUP, 44)] {
        let name = match sig {
            libc::SIGTERM => "TERM",
            libc::SIGINT => "INT",
            _ => "HUP",
        };
        // The guest says when its trap is set, then waits.
        let script = format!("trap 'exit {code}' {name}; echo ready; while :; do sleep 0.05; done");
        let mut child = Command::new(env!("CARGO_BIN_EXE_sidecore"))
            .args(["exec", "-q", "sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        assert_eq!(line.trim(), "ready");
        // SAFETY: kill(2) on the child this test started.
        assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, sig) }, 0);
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(code), "after SIG{name}");
    }
}
