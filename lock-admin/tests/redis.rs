//! `lock-admin` against one real redis-server holding locks (taken by lockers in this test
//! with holder names): list, inspect, watch, unlock and its confirmation, `--json`, and an ACL
//! user limited to the lock's prefix by the guide's rule. The tests share one server, each
//! under its own key prefix.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed expectation fails the test"
)]

mod support;

use lock_core::LockError;
use support::{
    SOON, admin, exit_code, holder, shared_server, spawn, stderr_of, stdout_of, until_waiters,
};
use tokio::io::AsyncWriteExt;

/// The token of the lock `name` (its Redis key), read from its value: never in the output.
async fn token_of(server: &lock_testkit::RedisServer, name: &str) -> String {
    let value = server.get(name).await.expect("the lock's value");
    let token = value.split('|').next().unwrap().to_owned();
    assert!(token.len() >= 32, "{value}");
    token
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_shows_the_held_locks_only_and_filters_by_pattern() {
    let server = shared_server();
    let url = server.url();
    let billing = holder(&url, "ls:", "billing-7/pid 42").await;
    let a = billing.lock("order:1").fenced().await.unwrap();
    let b = billing.lock("order:2").await.unwrap();
    let c = billing.lock("stock:1").await.unwrap();
    // Taken and released: its fence counter stays, the lock is free, not listed.
    billing
        .lock("order:3")
        .fenced()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    let all = admin(&["--url", &url, "--prefix", "ls:", "list"], None).await;
    assert_eq!(all.code, 0, "{all:?}");
    let mut lines: Vec<&str> = all.stdout.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines.len(), 3, "{all:?}");
    for (line, key) in lines.iter().zip(["order:1", "order:2", "stock:1"]) {
        assert!(
            line.starts_with(&format!("{key}  held by \"billing-7/pid 42\" for ")),
            "{line}"
        );
    }
    assert!(
        lines[0].contains(&format!("fence {}", a.fence().unwrap())),
        "{}",
        lines[0]
    );
    assert!(all.stderr.contains("3 held locks"), "{all:?}");

    let orders = admin(
        &[
            "--url", &url, "--prefix", "ls:", "--json", "list", "order:*",
        ],
        None,
    )
    .await;
    assert_eq!(orders.code, 0, "{orders:?}");
    let mut states = orders.json_lines();
    states.sort_by_key(|s| s["key"].as_str().unwrap().to_owned());
    assert_eq!(states.len(), 2, "{orders:?}");
    assert_eq!(states[0]["key"], "order:1");
    assert_eq!(states[1]["key"], "order:2");
    for s in &states {
        assert_eq!(s["held"], true);
        assert_eq!(s["holder"], "billing-7/pid 42");
        assert!(s["held_for_ms"].as_u64().unwrap() < 60_000, "{s}");
        let left = s["remaining_ms"].as_u64().unwrap();
        assert!(left > 20_000 && left <= 30_000, "{s}");
        assert_eq!(s["waiters"], 0);
    }
    assert_eq!(states[0]["fence"], a.fence().unwrap());
    // Never a token.
    for name in ["ls:{order:1}", "ls:{order:2}", "ls:{stock:1}"] {
        let token = token_of(&server, name).await;
        assert!(!all.stdout.contains(&token) && !orders.stdout.contains(&token));
    }
    // A pattern that matches nothing, and one under another prefix.
    let none = admin(
        &["--url", &url, "--prefix", "ls:", "list", "nothing:*"],
        None,
    )
    .await;
    assert_eq!((none.code, none.stdout.as_str()), (0, ""), "{none:?}");
    let other = admin(&["--url", &url, "--prefix", "elsewhere:", "list"], None).await;
    assert_eq!((other.code, other.stdout.as_str()), (0, ""), "{other:?}");
    for g in [a, b, c] {
        g.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_holder_fence_and_waiters_as_text_and_json() {
    let server = shared_server();
    let url = server.url();
    let owner = holder(&url, "in:", "reports-3").await;
    let guard = owner.lock("report").fenced().await.unwrap();
    let fence = guard.fence().unwrap();
    let other = holder(&url, "in:", "reports-4").await;
    let waiter = tokio::spawn({
        let other = other.clone();
        async move { other.lock("report").fair().wait(SOON).await }
    });
    until_waiters(&owner, "report", 1).await;

    let text = admin(
        &["--url", &url, "--prefix", "in:", "inspect", "report"],
        None,
    )
    .await;
    assert_eq!(text.code, 0, "{text:?}");
    for line in [
        "key        report".to_owned(),
        "held       yes".to_owned(),
        "holder     \"reports-3\"".to_owned(),
        format!("fence      {fence}"),
        "waiters    1".to_owned(),
    ] {
        assert!(text.stdout.contains(&line), "{line:?} in {}", text.stdout);
    }
    let json = admin(
        &[
            "--url", &url, "--prefix", "in:", "--json", "inspect", "report",
        ],
        None,
    )
    .await;
    assert_eq!(json.code, 0, "{json:?}");
    let state = &json.json_lines()[0];
    assert_eq!(state["holder"], "reports-3");
    assert_eq!(state["fence"], fence);
    assert_eq!(state["waiters"], 1);
    assert!(
        state["held_for_ms"].is_u64() && state["remaining_ms"].is_u64(),
        "{state}"
    );
    let token = token_of(&server, "in:{report}").await;
    assert!(!text.stdout.contains(&token) && !json.stdout.contains(&token));

    guard.release().await.unwrap();
    waiter.await.unwrap().unwrap().release().await.unwrap();
    // Free: an answer too, with the last fence drawn (the waiter's lock was not fenced).
    let free = admin(
        &[
            "--url", &url, "--prefix", "in:", "--json", "inspect", "report",
        ],
        None,
    )
    .await;
    assert_eq!(free.code, 0, "{free:?}");
    let state = &free.json_lines()[0];
    assert_eq!(
        (state["held"].as_bool(), state["holder"].is_null()),
        (Some(false), true)
    );
    assert_eq!(state["fence"], fence);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_without_a_yes_is_refused_and_the_lock_stays_held() {
    let server = shared_server();
    let url = server.url();
    let owner = holder(&url, "un:", "stuck-1").await;
    let guard = owner.lock("vault").await.unwrap();
    let args = ["--url", &url, "--prefix", "un:", "unlock", "vault"];
    for (input, why) in [
        (Some("n\n"), "not confirmed"),
        (Some("yes please\n"), "not confirmed"),
        (Some(""), "no answer"),
        (None, "no answer"),
    ] {
        let ran = admin(&args, input).await;
        assert_eq!(ran.code, 3, "{input:?}: {ran:?}");
        assert!(
            ran.stderr.contains(why) && ran.stderr.contains("nothing removed"),
            "{ran:?}"
        );
        assert!(
            ran.stderr.contains("stuck-1") && ran.stderr.contains("[y/N]"),
            "{ran:?}"
        );
        assert_eq!(ran.stdout, "");
        let state = owner.inspect("vault").await.unwrap();
        assert_eq!(state.holder.as_deref(), Some("stuck-1"), "{input:?}");
        assert!(guard.is_held());
    }
    // Nothing held: its own exit code, whether asked or not.
    let none = admin(
        &["--url", &url, "--prefix", "un:", "unlock", "nobody"],
        Some("y\n"),
    )
    .await;
    assert_eq!(none.code, 4, "{none:?}");
    assert!(none.stderr.contains("not held"), "{none:?}");
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_after_a_y_removes_the_lock_and_the_waiter_gets_it() {
    let server = shared_server();
    let url = server.url();
    let stuck = holder(&url, "uy:", "stuck-1").await;
    let guard = stuck.lock("vault").fenced().await.unwrap();
    let old = guard.fence().unwrap();
    let next = holder(&url, "uy:", "next-2").await;
    let waiter = tokio::spawn({
        let next = next.clone();
        async move { next.lock("vault").fenced().wait(SOON).await }
    });
    until_waiters(&stuck, "vault", 1).await;

    let ran = admin(
        &["--url", &url, "--prefix", "uy:", "unlock", "vault"],
        Some("y\n"),
    )
    .await;
    assert_eq!(ran.code, 0, "{ran:?}");
    assert!(
        ran.stdout
            .starts_with("removed: vault  held by \"stuck-1\" for "),
        "{ran:?}"
    );
    let served = tokio::time::timeout(SOON, waiter)
        .await
        .expect("the waiter is served")
        .unwrap()
        .expect("the waiter gets the lock");
    assert!(served.fence().unwrap() > old);
    assert_eq!(
        next.inspect("vault").await.unwrap().holder.as_deref(),
        Some("next-2")
    );
    assert!(matches!(
        guard.release().await,
        Err(LockError::LeaseLost { .. })
    ));
    served.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_yes_removes_without_asking_and_prints_the_holder_as_json() {
    let server = shared_server();
    let url = server.url();
    let stuck = holder(&url, "uj:", "stuck-9").await;
    let guard = stuck.lock("vault").fenced().await.unwrap();
    let fence = guard.fence().unwrap();
    let token = token_of(&server, "uj:{vault}").await;
    let args = [
        "--url", &url, "--prefix", "uj:", "--json", "unlock", "vault", "--yes",
    ];
    // Stdin closed: --yes does not read it.
    let ran = admin(&args, None).await;
    assert_eq!(ran.code, 0, "{ran:?}");
    assert!(!ran.stderr.contains("[y/N]"), "{ran:?}");
    let out = &ran.json_lines()[0];
    assert_eq!(out["key"], "vault");
    assert_eq!(out["removed"]["holder"], "stuck-9");
    assert_eq!(out["removed"]["fence"], fence);
    assert!(!ran.stdout.contains(&token));
    assert!(!stuck.inspect("vault").await.unwrap().held);
    let again = admin(&args, None).await;
    assert_eq!(again.code, 4, "{again:?}");
    assert_eq!(again.json_lines()[0]["removed"], serde_json::Value::Null);
    assert!(matches!(
        guard.release().await,
        Err(LockError::LeaseLost { .. })
    ));
}

/// Between the question and the yes, the lock changed hands: the tool refuses to remove a
/// holder the operator did not see.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_refuses_when_the_lock_changed_hands_after_it_was_shown() {
    let server = shared_server();
    let url = server.url();
    let first = holder(&url, "uc:", "first-1").await;
    let second = holder(&url, "uc:", "second-2").await;
    let guard = first.lock("vault").await.unwrap();
    let mut child = spawn(&["--url", &url, "--prefix", "uc:", "unlock", "vault"]);
    let mut stderr = stderr_of(&mut child);
    // The block shown, then the question (it ends without a newline: read up to the block's
    // last line, then the prompt is written with it).
    loop {
        let line = stderr.next().await.expect("the lock shown");
        if line.starts_with("waiters") {
            break;
        }
    }
    guard.release().await.unwrap();
    let taken = second.lock("vault").await.unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"y\n").await.unwrap();
    drop(stdin);
    assert_eq!(exit_code(&mut child).await, 3);
    let mut rest = String::new();
    while let Some(line) = stderr.next().await {
        rest.push_str(&line);
    }
    assert!(
        rest.contains("changed hands") && rest.contains("second-2"),
        "{rest}"
    );
    assert_eq!(
        first.inspect("vault").await.unwrap().holder.as_deref(),
        Some("second-2")
    );
    assert!(taken.is_held());
    taken.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_prints_each_change_of_holder_until_its_count() {
    let server = shared_server();
    let url = server.url();
    let a = holder(&url, "wa:", "alpha").await;
    let b = holder(&url, "wa:", "beta").await;
    let mut child = spawn(&[
        "--url",
        &url,
        "--prefix",
        "wa:",
        "--json",
        "watch",
        "job",
        "--interval",
        "20ms",
        "--count",
        "3",
    ]);
    let mut lines = stdout_of(&mut child);
    let parse = |l: String| serde_json::from_str::<serde_json::Value>(&l).unwrap();
    let first = parse(lines.next().await.unwrap());
    assert_eq!(first["held"], false);
    assert!(first["at_ms"].is_u64());
    let g = a.lock("job").await.unwrap();
    let held = parse(lines.next().await.unwrap());
    assert_eq!(held["holder"], "alpha");
    // A waiter is a change; a hand-over to it another.
    let waiter = tokio::spawn(async move { b.lock("job").fair().wait(SOON).await });
    let waiting = parse(lines.next().await.unwrap());
    assert_eq!(
        (waiting["holder"].as_str(), waiting["waiters"].as_u64()),
        (Some("alpha"), Some(1))
    );
    g.release().await.unwrap();
    let next = parse(lines.next().await.unwrap());
    assert_eq!(next["holder"], "beta");
    assert_eq!(lines.next().await, None, "three changes, then the end");
    assert_eq!(exit_code(&mut child).await, 0);
    waiter.await.unwrap().unwrap().release().await.unwrap();

    // --for ends a watch of a lock that does not change.
    let ran = admin(
        &[
            "--url", &url, "--prefix", "wa:", "watch", "idle", "--for", "300ms",
        ],
        None,
    )
    .await;
    assert_eq!(ran.code, 0, "{ran:?}");
    assert_eq!(ran.stdout.lines().count(), 1, "{ran:?}");
    assert!(ran.stdout.contains("idle  free"), "{ran:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_arguments_are_refused_with_a_reason_and_code_2() {
    let server = shared_server();
    let url = server.url();
    for (args, why) in [
        (vec!["list"], "no backend"),
        (vec!["--url", "memory:", "list"], "inside one process"),
        (
            vec!["--url", "redis://h1:1,h2:2/", "list"],
            "redis+cluster://",
        ),
        (
            vec!["--url", "redis+cluster://u:hunter2@h:99999", "list"],
            "not a port",
        ),
        (vec!["--url", &url, "--prefix", "a{b", "list"], "prefix"),
        (vec!["--url", &url, "list", ""], "empty"),
        (vec!["--url", &url, "inspect", ""], "invalid lock key"),
        (
            vec!["--url", &url, "watch", "k", "--interval", "5"],
            "no unit",
        ),
    ] {
        let ran = admin(&args, None).await;
        assert_eq!(ran.code, 2, "{args:?}: {ran:?}");
        assert!(ran.stderr.contains(why), "{args:?}: {ran:?}");
        assert!(!ran.stderr.contains("hunter2"), "{ran:?}");
        assert!(!ran.stderr.contains("panicked"), "{ran:?}");
    }
    // Nobody there: a backend failure, code 1.
    let ran = admin(&["--url", "redis://127.0.0.1:1/", "inspect", "k"], None).await;
    assert_eq!(ran.code, 1, "{ran:?}");
    assert!(ran.stderr.contains("cannot connect"), "{ran:?}");
}

/// Redlock: a lock held on three servers is inspected (held, with its holder) and listed
/// once; once released, the listing is empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_locks_are_inspected_and_listed() {
    let servers: Vec<lock_testkit::RedisServer> =
        (0..3).map(|_| lock_testkit::RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(|s| s.url()).collect();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let backend = lock_core::RedlockBackend::connect(&urls)
        .await
        .expect("connect");
    let locker = lock_core::Locker::builder(backend)
        .prefix("rli:")
        .holder("app-2")
        .build();
    let hosts: Vec<String> = servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    let url = format!("redlock://{}", hosts.join(","));
    let guard = locker.lock("k").await.unwrap();

    let inspected = admin(
        &["--url", &url, "--prefix", "rli:", "--json", "inspect", "k"],
        None,
    )
    .await;
    assert_eq!(inspected.code, 0, "{inspected:?}");
    let state = &inspected.json_lines()[0];
    assert_eq!(state["held"], true, "{state}");
    assert_eq!(state["holder"], "app-2", "{state}");

    let listed = admin(&["--url", &url, "--prefix", "rli:", "--json", "list"], None).await;
    assert_eq!(listed.code, 0, "{listed:?}");
    let states = listed.json_lines();
    assert_eq!(states.len(), 1, "{listed:?}");
    assert_eq!(states[0]["key"], "k");
    assert_eq!(states[0]["holder"], "app-2");

    guard.release().await.unwrap();
    let after = admin(&["--url", &url, "--prefix", "rli:", "list"], None).await;
    assert_eq!((after.code, after.stdout.as_str()), (0, ""), "{after:?}");
}

/// `lock-admin list | head`: the reader closes the pipe early; the listing ends quietly
/// with success, not an error about a broken pipe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_whose_reader_goes_away_ends_quietly() {
    let server = shared_server();
    let url = server.url();
    // More than a pipe holds (64 KiB): held locks written as the library writes them.
    let fill = redis::Script::new(
        r"
        for i = 1, 5000 do
          redis.call('SET', 'pipe:{job:' .. i .. '}', string.format('%032x|1764000000000|loader|', i), 'PX', 600000)
        end
        return 1",
    );
    let mut conn = server.client().await;
    let _: i64 = fill.invoke_async(&mut conn).await.unwrap();
    let mut child = spawn(&["--url", &url, "--prefix", "pipe:", "list"]);
    let mut lines = stdout_of(&mut child);
    assert!(lines.next().await.unwrap().contains("loader"));
    drop(lines);
    assert_eq!(exit_code(&mut child).await, 0);
    let mut stderr = stderr_of(&mut child);
    let mut said = String::new();
    while let Some(line) = stderr.next().await {
        said.push_str(&line);
    }
    assert_eq!(said, "", "nothing said of the closed pipe");
}

/// A key an attacker chose (an application that locks on user input) holding terminal escape
/// sequences and bidirectional overrides: the human output shows them escaped, never raw
/// (they would repaint the operator's terminal), and the JSON output keeps the key exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_keys_are_shown_escaped_never_raw() {
    let server = shared_server();
    let url = server.url();
    let app = holder(&url, "esc:", "app-1").await;
    let key = "order:\u{1b}[2J\u{1b}]0;pwned\u{7}\u{202e}gnp.exe\r\nfake-line";
    let guard = app.lock(key).await.unwrap();
    // A key under the prefix that is not UTF-8 (no lock of the library's): the output stays
    // UTF-8 and the JSON valid.
    let () = server
        .query(
            redis::cmd("SET")
                .arg(&b"esc:{\xff\xfe\x1b[2J}"[..])
                .arg("0123456789abcdef0123456789abcdef|1764000000000|x|")
                .arg("PX")
                .arg(60_000)
                .clone(),
        )
        .await;
    let raw = |text: &str| {
        text.chars()
            .any(|c| (c.is_control() && c != '\n') || matches!(c, '\u{202a}'..='\u{202e}'))
            || text.contains("\nfake-line")
    };
    let base = ["--url", url.as_str(), "--prefix", "esc:"];
    for command in [
        vec!["list"],
        vec!["inspect", key],
        vec!["watch", key, "--count", "1", "--for", "200ms"],
        vec!["unlock", key],
    ] {
        let args: Vec<&str> = base.iter().copied().chain(command.clone()).collect();
        let ran = admin(&args, Some("n\n")).await;
        assert!(ran.code == 0 || ran.code == 3, "{command:?}: {ran:?}");
        assert!(!raw(&ran.stdout), "{command:?} stdout: {:?}", ran.stdout);
        assert!(!raw(&ran.stderr), "{command:?} stderr: {:?}", ran.stderr);
        assert!(
            ran.stdout.contains("\\u{1b}[2J") || ran.stderr.contains("\\u{1b}[2J"),
            "{command:?}: {ran:?}"
        );
        let json_args: Vec<&str> = base
            .iter()
            .copied()
            .chain(["--json"])
            .chain(command.iter().copied().filter(|c| *c != "unlock"))
            .collect();
        if command[0] != "unlock" {
            let ran = admin(&json_args, None).await;
            assert_eq!(ran.code, 0, "{json_args:?}: {ran:?}");
            assert_eq!(ran.json_lines()[0]["key"], key, "{ran:?}");
        }
    }
    assert!(guard.is_held());
    guard.release().await.unwrap();
}

/// Between the question and the yes, the same holder released the lock and took it again
/// (same holder name, unfenced: the same fence, a `since` 50 ms later): another holding, which
/// the operator did not confirm. The tool refuses, and the new holding stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_refuses_a_new_holding_by_the_same_holder() {
    let server = shared_server();
    let url = server.url();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let set = |token: char, since: u128| {
        let value = format!("{}|{since}|worker-1|", token.to_string().repeat(32));
        server.query::<()>(
            redis::cmd("SET")
                .arg("rs:{vault}")
                .arg(value)
                .arg("PX")
                .arg(60_000)
                .clone(),
        )
    };
    set('a', now_ms - 5_000).await;
    let mut child = spawn(&["--url", &url, "--prefix", "rs:", "unlock", "vault"]);
    let mut stderr = stderr_of(&mut child);
    loop {
        let line = stderr.next().await.expect("the lock shown");
        if line.starts_with("waiters") {
            break;
        }
    }
    // Released, and taken again by the same holder 50 ms after its first acquire.
    set('b', now_ms - 4_950).await;
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"y\n").await.unwrap();
    drop(stdin);
    assert_eq!(exit_code(&mut child).await, 3);
    let mut rest = String::new();
    while let Some(line) = stderr.next().await {
        rest.push_str(&line);
    }
    assert!(rest.contains("changed hands"), "{rest}");
    let value = server
        .get("rs:{vault}")
        .await
        .expect("the new holding stays");
    assert!(value.starts_with("bbbb"), "{value}");
}

/// `unlock --yes` whose answer is lost (the request reached Redis, the answer never comes
/// back before the timeout): the tool says the outcome is unknown and to inspect, exits 6 (not
/// 0, not a plain failure), and does not send it again (the waiter it was handed to keeps it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_whose_answer_is_lost_says_unknown_and_is_sent_once() {
    let server = shared_server();
    let proxy =
        lock_testkit::proxy::Proxy::start(format!("127.0.0.1:{}", server.port()).parse().unwrap())
            .await;
    let stuck = holder(&server.url(), "ul:", "stuck-1").await;
    let _guard = stuck.lock("vault").await.unwrap();
    let next = holder(&server.url(), "ul:", "next-2").await;
    let waiter = tokio::spawn({
        let next = next.clone();
        async move { next.lock("vault").wait(SOON).await }
    });
    until_waiters(&stuck, "vault", 1).await;
    let url = format!("redis://{}/", proxy.addr());
    // Its script loaded on the server (a first EVALSHA answered NOSCRIPT would be the one
    // frozen, and the script never run): a force unlock of a free lock.
    let warm = admin(
        &["--url", &url, "--prefix", "ul:", "unlock", "warm", "--yes"],
        None,
    )
    .await;
    assert_eq!(warm.code, 4, "{warm:?}");
    // The force unlock's script names the queue; nothing else lock-admin sends does.
    proxy.freeze_after(b"ul:{vault}:queue");
    let ran = admin(
        &["--url", &url, "--prefix", "ul:", "unlock", "vault", "--yes"],
        None,
    )
    .await;
    assert_eq!(proxy.frozen(), 1, "{ran:?}");
    assert_eq!(ran.code, 6, "{ran:?}");
    assert!(
        ran.stderr.contains("outcome is unknown") && ran.stderr.contains("inspect"),
        "{ran:?}"
    );
    assert!(
        !ran.stderr.contains("removed:") && ran.stdout.is_empty(),
        "{ran:?}"
    );
    // It ran once: the waiter was handed the lock and keeps it.
    let served = tokio::time::timeout(SOON, waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        next.inspect("vault").await.unwrap().holder.as_deref(),
        Some("next-2")
    );
    assert!(served.is_held());
    served.release().await.unwrap();
    proxy.cut();
}

/// `watch` through a backend that goes away and comes back: the failure is said once (not a
/// line per look), the watch goes on, says when the backend answers again, prints the changes
/// after it, and ends by `--for` with success.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_says_once_that_the_backend_is_gone_and_when_it_is_back() {
    let server = shared_server();
    let proxy =
        lock_testkit::proxy::Proxy::start(format!("127.0.0.1:{}", server.port()).parse().unwrap())
            .await;
    let url = format!("redis://{}/", proxy.addr());
    let app = holder(&server.url(), "wd:", "app-1").await;
    let mut child = spawn(&[
        "--url",
        &url,
        "--prefix",
        "wd:",
        "--json",
        "watch",
        "job",
        "--interval",
        "20ms",
        "--for",
        "8s",
    ]);
    let mut out = stdout_of(&mut child);
    let mut err = stderr_of(&mut child);
    let first: serde_json::Value = serde_json::from_str(&out.next().await.unwrap()).unwrap();
    assert_eq!(first["held"], false);
    proxy.cut();
    let gone = err.next().await.expect("the failure said");
    assert!(gone.contains("still watching"), "{gone}");
    // Many looks fail meanwhile (one each 20 ms): none says it again.
    let looked = proxy.accepted();
    lock_testkit::eventually("more looks while it is gone", SOON, async || {
        proxy.accepted() >= looked + 5
    })
    .await;
    proxy.restore();
    let back = err.next().await.expect("the recovery said");
    assert!(back.contains("answers again"), "{back}");
    let guard = app.lock("job").await.unwrap();
    let held: serde_json::Value = serde_json::from_str(&out.next().await.unwrap()).unwrap();
    assert_eq!(held["holder"], "app-1");
    assert_eq!(exit_code(&mut child).await, 0);
    assert_eq!(err.next().await, None, "nothing more said");
    guard.release().await.unwrap();
}

/// Keys and a prefix holding glob characters: the prefix is matched literally (another prefix
/// that its unescaped glob would match is not listed), `\` makes a pattern character literal,
/// `[` is literal, and each lock is listed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_patterns_with_glob_characters_match_literally_where_escaped() {
    let server = shared_server();
    let url = server.url();
    let app = holder(&url, "g?[*]:", "app-1").await;
    let other = holder(&url, "gx[a]:", "app-2").await;
    let mut guards = Vec::new();
    for key in ["st*r", "st?r", "st[r]", "star", "x{y}"] {
        guards.push(app.lock(key).await.unwrap());
    }
    guards.push(other.lock("star").await.unwrap());
    let list = async |pattern: &str| {
        let ran = admin(
            &[
                "--url", &url, "--prefix", "g?[*]:", "--json", "list", pattern,
            ],
            None,
        )
        .await;
        assert_eq!(ran.code, 0, "{ran:?}");
        let mut keys: Vec<String> = ran
            .json_lines()
            .iter()
            .map(|s| s["key"].as_str().unwrap().to_owned())
            .collect();
        keys.sort_unstable();
        keys
    };
    assert_eq!(list("*").await, ["st*r", "st?r", "st[r]", "star", "x{y}"]);
    assert_eq!(list("st\\*r").await, ["st*r"]);
    assert_eq!(list("st\\?r").await, ["st?r"]);
    assert_eq!(list("st?r").await, ["st*r", "st?r", "star"]);
    assert_eq!(list("st[r]").await, ["st[r]"]);
    assert_eq!(list("x{y}").await, ["x{y}"]);
    for g in guards {
        g.release().await.unwrap();
    }
}

/// Only `unlock`'s own `--yes`, or a `y` typed after the lock is shown, removes a lock: `--yes`
/// before the subcommand, `--yes=false`, an environment variable, a key spelled `--yes` or an
/// answer longer than a line remove nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_is_confirmed_only_by_its_own_flag_or_a_typed_yes() {
    let server = shared_server();
    let url = server.url();
    let owner = holder(&url, "uf:", "owner-1").await;
    let guard = owner.lock("vault").await.unwrap();
    let yes_line = format!("{}\n", "y".repeat(5_000));
    for (args, input, code) in [
        (vec!["--yes", "unlock", "vault"], None, 2),
        (vec!["unlock", "vault", "--yes=false"], None, 2),
        (vec!["unlock", "vault", "--yes", "--yes"], None, 2),
        (vec!["unlock", "--", "--yes"], Some("y\n"), 4),
        (vec!["unlock", "vault"], Some(yes_line.as_str()), 3),
        (vec!["unlock", "vault"], Some("yes\ny\n"), 0),
    ] {
        if code == 0 {
            // Last: the only one that removes, with a typed yes.
            assert!(guard.is_held());
        }
        let mut all = vec!["--url", url.as_str(), "--prefix", "uf:"];
        all.extend(args.iter().copied());
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_lock-admin"));
        command
            .args(&all)
            .env_remove("LOCK_ADMIN_URL")
            .env("LOCK_ADMIN_YES", "1")
            .env("YES", "1")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().unwrap();
        let mut stdin = child.stdin.take().unwrap();
        if let Some(input) = input {
            let _ = stdin.write_all(input.as_bytes()).await;
        }
        drop(stdin);
        let output = tokio::time::timeout(SOON, child.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(code), "{args:?}: {stderr}");
        if code != 0 {
            assert_eq!(
                owner.inspect("vault").await.unwrap().holder.as_deref(),
                Some("owner-1"),
                "{args:?}"
            );
        }
    }
    assert!(!owner.inspect("vault").await.unwrap().held);
}

/// Never a token, on stdout or stderr, text or JSON, of any subcommand: the lock's and its
/// queued waiter's tokens are read raw from Redis and looked for in everything printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_subcommand_prints_a_token() {
    let server = shared_server();
    let url = server.url();
    let owner = holder(&url, "tk:", "owner-1").await;
    let guard = owner.lock("vault").fenced().await.unwrap();
    let waiter = holder(&url, "tk:", "waiter-2").await;
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.lock("vault").fair().wait(SOON).await }
    });
    until_waiters(&owner, "vault", 1).await;
    let mut tokens = vec![token_of(&server, "tk:{vault}").await];
    // The waiter's entries (ticket -> 'expiry|...') and queue, whatever they hold.
    let entries: Vec<String> = server
        .query(redis::cmd("HVALS").arg("tk:{vault}:waiters").clone())
        .await;
    let queued: Vec<String> = server
        .query(
            redis::cmd("LRANGE")
                .arg("tk:{vault}:queue")
                .arg(0)
                .arg(-1)
                .clone(),
        )
        .await;
    for text in entries.iter().chain(&queued) {
        tokens.extend(
            text.split(['|', ':'])
                .filter(|part| part.len() >= 16)
                .map(str::to_owned),
        );
    }
    let mut printed = String::new();
    for json in [false, true] {
        for command in [
            vec!["list"],
            vec!["inspect", "vault"],
            vec!["watch", "vault", "--for", "100ms"],
            vec!["unlock", "vault"],
        ] {
            let mut args = vec!["--url", url.as_str(), "--prefix", "tk:"];
            if json {
                args.push("--json");
            }
            args.extend(command);
            let ran = admin(&args, Some("n\n")).await;
            printed.push_str(&ran.stdout);
            printed.push_str(&ran.stderr);
        }
    }
    let ran = admin(
        &[
            "--url", &url, "--prefix", "tk:", "--json", "unlock", "vault", "--yes",
        ],
        None,
    )
    .await;
    assert_eq!(ran.code, 0, "{ran:?}");
    printed.push_str(&ran.stdout);
    printed.push_str(&ran.stderr);
    assert!(printed.contains("owner-1"), "{printed}");
    for token in &tokens {
        assert!(
            !printed.contains(token.as_str()),
            "{token} printed: {printed}"
        );
    }
    let served = waiting.await.unwrap().unwrap();
    drop(guard);
    served.release().await.unwrap();
}

/// A one-server URL naming a Sentinel (which keeps no locks): every command says to use the
/// Sentinel scheme (exit 2), not "unknown command EVALSHA".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_server_url_of_a_sentinel_says_to_use_the_sentinel_scheme() {
    let sentinel = lock_testkit::RedisServer::builder().sentinel().start();
    let url = sentinel.url();
    for command in [&["inspect", "k"][..], &["list"], &["unlock", "k", "--yes"]] {
        let args: Vec<&str> = ["--url", url.as_str()]
            .into_iter()
            .chain(command.iter().copied())
            .collect();
        let ran = admin(&args, None).await;
        assert_eq!(ran.code, 2, "{command:?}: {ran:?}");
        assert!(
            ran.stderr.contains("redis+sentinel://"),
            "{command:?}: {ran:?}"
        );
    }
}

/// Redlock has no compare-and-remove of a holding seen (`force_unlock_seen` answers that it
/// cannot): `unlock` looks again after the yes and removes the lock only if it is still the
/// holding shown, and refuses (exit 3, nothing removed) when the same holder took it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_on_redlock_looks_again_before_removing() {
    let servers: Vec<lock_testkit::RedisServer> =
        (0..3).map(|_| lock_testkit::RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(lock_testkit::RedisServer::url).collect();
    let hosts: Vec<String> = servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    let url = format!("redlock://{}", hosts.join(","));
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let backend = lock_core::RedlockBackend::connect(&urls).await.unwrap();
    let app = lock_core::Locker::builder(backend)
        .prefix("rl:")
        .holder("app-1")
        .build();
    // Taken, shown, then released and taken again by the same holder: refused.
    let first = app.lock("vault").await.unwrap();
    let mut child = spawn(&["--url", &url, "--prefix", "rl:", "unlock", "vault"]);
    let mut stderr = stderr_of(&mut child);
    loop {
        let line = stderr.next().await.expect("the lock shown");
        if line.starts_with("waiters") {
            break;
        }
    }
    first.release().await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    let second = app.lock("vault").await.unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"y\n").await.unwrap();
    drop(stdin);
    assert_eq!(exit_code(&mut child).await, 3);
    assert!(second.is_held());
    assert!(app.inspect("vault").await.unwrap().held);
    // Shown and confirmed, unchanged: removed.
    let ran = admin(
        &["--url", &url, "--prefix", "rl:", "unlock", "vault"],
        Some("y\n"),
    )
    .await;
    assert_eq!(ran.code, 0, "{ran:?}");
    assert!(
        ran.stdout.starts_with("removed: vault  held by \"app-1\""),
        "{ran:?}"
    );
    assert!(!app.inspect("vault").await.unwrap().held);
    assert!(matches!(
        second.release().await,
        Err(LockError::LeaseLost { .. })
    ));
}
