//! The README's main job, run as CI runs it: the built `flash-sale` binary in fast mode.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test helpers outside #[test] functions fail the test by panicking, by design"
)]

use std::process::{Command, Output};

fn flash_sale(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flash-sale"))
        .args(args)
        .env_remove("REDIS_URL")
        .output()
        .expect("run flash-sale")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The number after "oversold = " in the invariants.
fn oversold(stdout: &str) -> u64 {
    let at = stdout.find("oversold = ").expect("an oversold line") + "oversold = ".len();
    let digits: String = stdout[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().expect("a number after `oversold = `")
}

#[test]
fn main_job_in_fast_mode_exits_zero_with_oversold_zero() {
    let out = flash_sale(&["--fast"]);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    assert_eq!(oversold(&stdout), 0, "{stdout}");
    assert!(stdout.contains("PASS"), "{stdout}");
    // The lock's latency, read back from the service's /metrics: every quantile present.
    let latency = stdout
        .lines()
        .find(|l| l.starts_with("lock inventory:{sku} (from /metrics): wait p50 "))
        .unwrap_or_else(|| panic!("a lock latency line in {stdout}"));
    assert!(!latency.contains("n/a"), "{latency}");
    assert_eq!(latency.matches(" ms").count(), 4, "{latency}");
    assert!(!stdout.contains("FAIL"), "{stdout}");
}

#[test]
fn main_job_with_no_lock_oversells_and_exits_one() {
    let out = flash_sale(&["--fast", "--no-lock"]);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    assert!(oversold(&stdout) > 0, "{stdout}");
    assert!(stdout.contains("FAIL"), "{stdout}");
}

#[test]
fn help_explains_every_flag_and_hides_the_internal_ones() {
    let out = flash_sale(&["--help"]);
    let help = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0));
    for flag in [
        "--fast",
        "--quick",
        "--rounds",
        "--work-ms",
        "--redis-url",
        "REDIS_URL",
        "--processes",
        "--no-lock",
        "--no-progress",
    ] {
        assert!(
            help.contains(flag),
            "--help does not mention {flag}:\n{help}"
        );
    }
    for hidden in ["--serve-only", "--exit-on-stdin-eof", "--namespace"] {
        assert!(
            !help.contains(hidden),
            "--help shows internal {hidden}:\n{help}"
        );
    }
}

#[test]
fn several_processes_without_redis_is_a_usage_error() {
    let out = flash_sale(&["--fast", "--processes", "3"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("REDIS_URL"),
        "{}",
        text(&out.stderr)
    );
}
