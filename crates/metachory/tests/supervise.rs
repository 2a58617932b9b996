//! End-to-end: real programs under the seccomp user-notification supervisor.

use std::ffi::OsString;
use std::path::Path;

use sidecore_metachory::{Policy, run};

fn sh(script: &str) -> Vec<OsString> {
    vec!["sh".into(), "-c".into(), script.into()]
}

#[test]
fn exit_code_and_signal_are_the_guests() {
    let o = run(&sh("exit 7"), Policy::new()).unwrap();
    assert_eq!(o.code, 7);
    let o = run(&sh("kill -TERM $$"), Policy::new()).unwrap();
    assert_eq!(o.code, 128 + libc::SIGTERM);
}

#[test]
fn cat_works_and_opens_are_trapped() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("in.txt");
    std::fs::write(&src, "hello metachory\n").unwrap();
    let out = dir.path().join("out.txt");
    let script = format!("cat {} > {}", src.display(), out.display());
    let o = run(&sh(&script), Policy::new()).unwrap();
    assert_eq!(o.code, 0);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "hello metachory\n");
    // At least the shell's redirection and cat's open of the file (plus the
    // dynamic loader's opens) went through the supervisor.
    assert!(o.counters.trapped >= 2, "{}", o.counters);
    assert_eq!(
        o.counters.trapped,
        o.counters.continued
            + o.counters.denied
            + o.counters.projected
            + o.counters.failed
            + o.counters.lost
    );
    assert_eq!(o.counters.denied, 0);
}

#[test]
fn denied_path_gets_eacces_and_the_rest_works() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("err.txt");
    let script = format!(
        "cat /etc/shadow 2> {e}; echo rc=$? >> {e}; cat /etc/hostname > /dev/null && echo ok >> {e}",
        e = out.display()
    );
    let o = run(&sh(&script), Policy::new()).unwrap();
    assert_eq!(o.code, 0);
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.contains("Permission denied"), "{text}");
    assert!(text.contains("rc=1"), "{text}");
    assert!(text.contains("ok"), "{text}");
    assert_eq!(o.counters.denied, 1, "{}", o.counters);
}

#[test]
fn denied_through_a_symlink_too() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("s");
    std::os::unix::fs::symlink("/etc/shadow", &link).unwrap();
    let script = format!("cat {} >/dev/null 2>&1", link.display());
    let o = run(&sh(&script), Policy::new()).unwrap();
    assert_eq!(o.code, 1);
    assert_eq!(o.counters.denied, 1, "{}", o.counters);
}

#[test]
fn projected_root_supplies_files_the_host_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let only = Path::new("metachory-only-in-root/data.txt");
    std::fs::create_dir_all(root.join(only.parent().unwrap())).unwrap();
    std::fs::write(root.join(only), "from the projection\n").unwrap();
    assert!(!Path::new("/").join(only).exists());
    let out = dir.path().join("out.txt");
    let script = format!("cat /{} > {}", only.display(), out.display());
    let o = run(&sh(&script), Policy::new().with_root(root.clone())).unwrap();
    assert_eq!(o.code, 0, "{}", o.counters);
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        "from the projection\n"
    );
    assert!(o.counters.projected >= 1, "{}", o.counters);

    // Writing to a projected file is refused: the projection is read-only.
    let script = format!("{{ echo x >> /{}; }} 2>/dev/null", only.display());
    let o = run(&sh(&script), Policy::new().with_root(root)).unwrap();
    assert_ne!(o.code, 0);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("root").join(only)).unwrap(),
        "from the projection\n"
    );
}

#[test]
fn missing_program_is_a_clear_error() {
    let e = run(&["/nonexistent/prog".into()], Policy::new()).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/prog"), "{e}");
    assert!(run(&[], Policy::new()).is_err());
}
