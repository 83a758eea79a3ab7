//! The ZooKeeper harness itself: an ensemble comes up serving with a leader, and every fault
//! the consensus tests rely on really happens (a killed or paused leader is replaced while a
//! client goes on, a whole-ensemble restart keeps the nodes and their zxids, a member alone
//! serves nothing, a proxy cuts one client off and its session expires).

#![allow(
    clippy::panic,
    clippy::expect_used,
    clippy::unwrap_used,
    clippy::print_stdout,
    reason = "a test file: its helpers outside #[test] functions assert by panicking and report figures"
)]

use std::time::{Duration, Instant};

use lock_testkit::zookeeper::{Mode, ZkClient, ZooKeeperEnsemble};
use zookeeper_client::{Acls, Client, CreateMode, SessionState};

/// Three members on distinct loopback ports: one leader, two followers, and the client's
/// reads and writes through any member see one tree.
#[tokio::test]
async fn an_ensemble_comes_up_with_a_leader_and_serves_reads_and_writes() {
    let started = Instant::now();
    let ensemble = ZooKeeperEnsemble::start().await;
    println!(
        "3-member ZooKeeper ensemble serving in {:?}",
        started.elapsed()
    );
    let version = ensemble.server_version().await.expect("a version");
    println!("ZooKeeper {version}");
    assert!(version.starts_with("3."), "{version}");
    let addrs = ensemble.addresses();
    assert_eq!(addrs.len(), 3);
    assert!(addrs.iter().all(|a| a.ip().is_loopback()));
    assert!(addrs[0] != addrs[1] && addrs[1] != addrs[2] && addrs[0] != addrs[2]);
    assert_eq!(
        ensemble.connect_string(),
        format!("{},{},{}", addrs[0], addrs[1], addrs[2])
    );
    let leader = ensemble.leader().await.expect("a leader");
    assert_eq!(ensemble.wait_for_leader().await, leader);
    let mut modes = Vec::new();
    for i in 0..3 {
        modes.push(ensemble.mode(i).await);
    }
    assert_eq!(
        modes.iter().filter(|m| **m == Some(Mode::Leader)).count(),
        1
    );
    assert_eq!(
        modes.iter().filter(|m| **m == Some(Mode::Follower)).count(),
        2
    );
    assert_eq!(modes[leader], Some(Mode::Leader));

    let zk = ensemble.client().await;
    let first = zk.create("/lock/a/1", b"x").await;
    let second = zk.create("/lock/a/2", b"y").await;
    assert!(second.czxid > first.czxid);
    // Written through one session, read through a member-bound one (after a sync: a
    // follower may lag by a moment otherwise).
    let other = ensemble.member_client((leader + 1) % 3).await;
    other.inner().sync("/lock/a").await.unwrap();
    assert_eq!(other.czxid("/lock/a/1").await, Some(first.czxid));
    assert_eq!(other.get("/lock/a/2").await.unwrap().0, b"y");
    assert_eq!(
        other.children("/lock/a").await,
        Some(vec!["1".to_owned(), "2".to_owned()])
    );
    assert_eq!(other.children("/nothing").await, None);
    assert!(other.delete("/lock/a/1").await);
    assert!(!other.delete("/lock/a/1").await);
    assert_eq!(zk.stat("/lock/a/1").await, None);
    assert_ne!(zk.session_id(), other.session_id());
}

/// One standalone server: it leads itself at once.
#[tokio::test]
async fn a_single_server_leads_itself() {
    let started = Instant::now();
    let ensemble = ZooKeeperEnsemble::start_single().await;
    println!("standalone ZooKeeper serving in {:?}", started.elapsed());
    assert_eq!(ensemble.leader().await, Some(0));
    assert_eq!(ensemble.mode(0).await, Some(Mode::Standalone));
    assert_eq!(ensemble.quorum(), 1);
    assert!(ensemble.data_dir(0).join("myid").is_file());
    assert!(ensemble.log(0).contains("QuorumPeerConfig"));
    let zk = ensemble.client().await;
    zk.create("/k", b"v").await;
    assert_eq!(zk.get("/k").await.unwrap().0, b"v");
}

/// A killed leader is replaced by one of the two others; the client's session moves to a
/// live member by itself (same session, its ephemeral node kept), writes go on with larger
/// zxids, and the killed member restarts on its ports with its data.
#[tokio::test]
async fn a_killed_leader_is_replaced_and_a_client_goes_on() {
    let mut ensemble = ZooKeeperEnsemble::start().await;
    let zk = ensemble.client().await;
    let before = zk.create("/k/before", b"").await;
    let ephemeral = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
    let (held, sequence) = zk
        .inner()
        .create("/k/lock-", b"", &ephemeral)
        .await
        .unwrap();
    let session = zk.session_id();

    let killed_at = Instant::now();
    let old = ensemble.kill_leader().await;
    assert!(!ensemble.is_running(old));
    let new = ensemble.wait_for_leader().await;
    println!(
        "new ZooKeeper leader elected {:?} after the kill",
        killed_at.elapsed()
    );
    assert_ne!(new, old);
    assert_eq!(zk.czxid("/k/before").await, Some(before.czxid));
    let lock = format!("/k/lock-{sequence}");
    assert_eq!(zk.stat(&lock).await.unwrap().ephemeral_owner, session);
    assert_eq!(zk.session_id(), session);
    println!(
        "the client answered again {:?} after the kill",
        killed_at.elapsed()
    );
    let after = zk.create("/k/after", b"").await;
    assert!(after.czxid > held.czxid);
    // A new epoch: the upper 32 bits of the zxid grew.
    assert!(after.czxid >> 32 > held.czxid >> 32);

    let new_pid = ensemble.pid(new);
    ensemble.restart(old).await;
    assert!(ensemble.is_running(old));
    assert_eq!(ensemble.pid(new), new_pid, "the others were not touched");
    assert_eq!(ensemble.mode(old).await, Some(Mode::Follower));
    let rejoined = ensemble.member_client(old).await;
    rejoined.inner().sync("/k").await.unwrap();
    assert_eq!(rejoined.czxid("/k/after").await, Some(after.czxid));
    ensemble.wait_healthy().await;
}

/// A paused follower answers nothing while the others go on; a paused leader is replaced,
/// and resumed it follows the new one.
#[tokio::test]
async fn a_paused_member_stops_answering_and_comes_back() {
    let mut ensemble = ZooKeeperEnsemble::start().await;
    let leader = ensemble.wait_for_leader().await;
    let follower = (leader + 1) % 3;
    ensemble.pause(follower);
    assert!(ensemble.is_paused(follower));
    assert_eq!(ensemble.mode(follower).await, None);
    let zk = ensemble.client().await;
    let written = zk.create("/k", b"v").await;
    ensemble.resume(follower);
    assert!(!ensemble.is_paused(follower));
    ensemble.wait_healthy().await;
    let resumed = ensemble.member_client(follower).await;
    resumed.inner().sync("/k").await.unwrap();
    assert_eq!(resumed.czxid("/k").await, Some(written.czxid));

    let paused_at = Instant::now();
    let old = ensemble.pause_leader().await;
    let new = ensemble.wait_for_leader().await;
    println!(
        "new ZooKeeper leader elected {:?} after pausing the old one",
        paused_at.elapsed()
    );
    assert_ne!(new, old);
    let during = zk.create("/during", b"").await;
    ensemble.resume(old);
    assert_eq!(ensemble.wait_healthy().await, new);
    assert_eq!(ensemble.mode(old).await, Some(Mode::Follower));
    let back = ensemble.member_client(old).await;
    back.inner().sync("/during").await.unwrap();
    assert_eq!(back.czxid("/during").await, Some(during.czxid));
}

/// Killing and restarting all three members keeps every node with its czxid, and the next
/// node's czxid is larger (a new epoch).
#[tokio::test]
async fn a_full_restart_keeps_the_nodes_and_their_zxids() {
    let mut ensemble = ZooKeeperEnsemble::start().await;
    let zk = ensemble.client().await;
    let mut czxids = Vec::new();
    for i in 0..20 {
        czxids.push(zk.create(&format!("/k/{i}"), b"v").await.czxid);
    }
    drop(zk);

    ensemble.kill_all();
    assert!((0..3).all(|i| !ensemble.is_running(i)));
    let restarted = Instant::now();
    ensemble.restart_all().await;
    println!(
        "ZooKeeper ensemble restarted (all 3 members) in {:?}",
        restarted.elapsed()
    );
    let zk = ensemble.client().await;
    for (i, czxid) in czxids.iter().enumerate() {
        assert_eq!(zk.czxid(&format!("/k/{i}")).await, Some(*czxid));
    }
    assert_eq!(zk.children("/k").await.unwrap().len(), 20);
    let last = *czxids.last().unwrap();
    let next = zk.create("/k/next", b"").await.czxid;
    assert!(next > last);
    assert!(next >> 32 > last >> 32, "a new epoch");
}

/// Member 0 left alone stops serving (no leader, `srvr` says so); when the others come back
/// the quorum serves again, member 0 included.
#[tokio::test]
async fn a_member_left_alone_serves_nothing_until_the_quorum_returns() {
    let mut ensemble = ZooKeeperEnsemble::start().await;
    let alone_at = Instant::now();
    ensemble.kill_all_but(0);
    ensemble.wait_for_no_leader().await;
    lock_testkit::eventually(
        "member 0 stopped serving",
        Duration::from_secs(10),
        async || ensemble.mode(0).await.is_none(),
    )
    .await;
    println!(
        "member 0 left alone stopped serving after {:?}",
        alone_at.elapsed()
    );
    ensemble.restart_killed().await;
    assert!(ensemble.leader().await.is_some());
    ensemble.member_client(0).await.create("/k", b"v").await;
}

/// The kit's message for a missing `java` names the install command; it never skips.
#[tokio::test]
#[should_panic(expected = "apt-get install -y zookeeper")]
async fn a_missing_java_names_the_install_command() {
    ZooKeeperEnsemble::builder()
        .java("/nonexistent/java")
        .start()
        .await;
}

/// A proxy in front of the server: a session through it is disconnected alone (the direct
/// session goes on), and after the restore the same session is back and sees the change.
#[tokio::test]
async fn a_proxy_cuts_one_client_off() {
    let ensemble = ZooKeeperEnsemble::start_single().await;
    let proxy = ensemble.proxy(0).await;
    let through = ZkClient::connect(&proxy.addr().to_string()).await;
    let session = through.session_id();
    through.create("/k", b"1").await;
    let mut state = through.inner().state_watcher();
    assert_eq!(state.state(), SessionState::SyncConnected);

    proxy.cut();
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(5), state.changed())
            .await
            .unwrap(),
        SessionState::Disconnected
    );
    let cut_off =
        tokio::time::timeout(Duration::from_millis(500), through.inner().get_data("/k")).await;
    assert!(!matches!(cut_off, Ok(Ok(_))), "{cut_off:?}");
    let direct = ensemble.client().await;
    let changed = direct.inner().set_data("/k", b"2", None).await.unwrap();

    proxy.restore();
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(5), state.changed())
            .await
            .unwrap(),
        SessionState::SyncConnected
    );
    assert_eq!(through.session_id(), session);
    let (data, stat) = through.get("/k").await.unwrap();
    assert_eq!((data.as_slice(), stat.mzxid), (&b"2"[..], changed.mzxid));
}

/// A session cut off by a blackholed proxy expires on the server (its ephemeral node goes)
/// and the client reports `Expired`, a terminal state.
#[tokio::test]
async fn a_blackholed_session_expires_and_its_ephemeral_node_goes() {
    let ensemble = ZooKeeperEnsemble::start_single().await;
    let proxy = ensemble.proxy(0).await;
    let timeout = ensemble.min_session_timeout() * 2;
    let client = Client::connector()
        .with_session_timeout(timeout)
        .connect(&proxy.addr().to_string())
        .await
        .unwrap();
    assert_eq!(client.session_timeout(), timeout);
    let ephemeral = CreateMode::Ephemeral.with_acls(Acls::anyone_all());
    client.create("/held", b"", &ephemeral).await.unwrap();
    let mut state = client.state_watcher();
    let direct = ensemble.client().await;
    assert_eq!(
        direct.stat("/held").await.unwrap().ephemeral_owner,
        client.session_id().0
    );

    let cut_at = Instant::now();
    proxy.blackhole();
    lock_testkit::eventually(
        "the ephemeral node gone with its session",
        Duration::from_secs(10),
        async || direct.stat("/held").await.is_none(),
    )
    .await;
    println!(
        "a {timeout:?} session's ephemeral node went {:?} after the blackhole",
        cut_at.elapsed()
    );
    let expired = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let s = state.changed().await;
            if s.is_terminated() {
                return s;
            }
        }
    })
    .await
    .unwrap();
    println!(
        "the client reported {expired:?} {:?} after the blackhole",
        cut_at.elapsed()
    );
    assert_eq!(expired, SessionState::Expired);
    assert!(matches!(
        client.get_data("/").await,
        Err(zookeeper_client::Error::SessionExpired)
    ));
    proxy.restore();
}

/// The calls the ZooKeeper backend builds on, against a real server with the crate the kit
/// and the backend share (zookeeper-client): ephemeral sequential nodes under a container
/// (the container deleted once empty), a multi that checks a node and creates another (all or
/// nothing), one-shot and persistent watches, digest auth with creator-only ACLs, a chroot.
#[tokio::test]
async fn the_client_crate_has_every_call_the_backend_needs() {
    use zookeeper_client::{AddWatchMode, EventType, MultiWriteError, MultiWriteResult};

    let ensemble = ZooKeeperEnsemble::start_single().await;
    let connect = ensemble.connect_string();
    let zk = Client::connect(&connect).await.unwrap();
    let open = Acls::anyone_all();

    // A container parent, and two contenders' ephemeral sequential nodes under it.
    let container = CreateMode::Container.with_acls(open);
    zk.create("/lock", b"", &container).await.unwrap();
    let contender = CreateMode::EphemeralSequential.with_acls(open);
    let (first, seq1) = zk.create("/lock/n-", b"a", &contender).await.unwrap();
    let (second, seq2) = zk.create("/lock/n-", b"b", &contender).await.unwrap();
    assert!(seq2 > seq1 && second.czxid > first.czxid);
    assert_eq!(format!("{seq1}").len(), 10, "ten digits: {seq1}");
    assert_eq!(first.ephemeral_owner, zk.session_id().0);
    let mut children = zk.list_children("/lock").await.unwrap();
    children.sort();
    assert_eq!(children, [format!("n-{seq1}"), format!("n-{seq2}")]);

    // One-shot watch on the node ahead: fires once, on its deletion.
    let (stat, ahead) = zk
        .check_and_watch_stat(&format!("/lock/n-{seq1}"))
        .await
        .unwrap();
    assert_eq!(stat.unwrap().czxid, first.czxid);
    // A persistent watch on the parent sees the children change.
    let mut parent = zk.watch("/lock", AddWatchMode::Persistent).await.unwrap();
    zk.delete(&format!("/lock/n-{seq1}"), None).await.unwrap();
    let event = ahead.changed().await;
    assert_eq!(event.event_type, EventType::NodeDeleted);
    assert_eq!(
        parent.changed().await.event_type,
        EventType::NodeChildrenChanged
    );

    // A multi: check that our node still exists (any version), then write; all or nothing.
    let ours = format!("/lock/n-{seq2}");
    let mut multi = zk.new_multi_writer();
    multi.add_check_version(&ours, -1).unwrap();
    let persistent = CreateMode::Persistent.with_acls(open);
    multi.add_create("/record", b"r", &persistent).unwrap();
    let results = multi.commit().await.unwrap();
    assert_eq!(results[0], MultiWriteResult::Check);
    assert!(matches!(&results[1], MultiWriteResult::Create { path, .. } if path == "/record"));
    let mut multi = zk.new_multi_writer();
    multi.add_check_version("/lock/n-gone", -1).unwrap();
    multi.add_create("/record2", b"r", &persistent).unwrap();
    assert_eq!(
        multi.commit().await.unwrap_err(),
        MultiWriteError::OperationFailed {
            index: 0,
            source: zookeeper_client::Error::NoNode
        }
    );
    assert_eq!(zk.check_stat("/record2").await.unwrap(), None);

    // The container goes once its last child has (within the check interval).
    zk.delete(&ours, None).await.unwrap();
    let direct = ensemble.client().await;
    lock_testkit::eventually(
        "the empty container deleted",
        Duration::from_secs(10),
        async || direct.stat("/lock").await.is_none(),
    )
    .await;

    // Digest auth: a node only its creator may read.
    let alice = Client::connector()
        .with_auth("digest", b"alice:secret")
        .connect(&connect)
        .await
        .unwrap();
    let private = CreateMode::Persistent.with_acls(Acls::creator_all());
    alice.create("/private", b"p", &private).await.unwrap();
    assert_eq!(alice.get_data("/private").await.unwrap().0, b"p");
    assert_eq!(
        zk.get_data("/private").await.unwrap_err(),
        zookeeper_client::Error::NoAuth
    );
    let (acl, _) = alice.get_acl("/private").await.unwrap();
    assert_eq!(acl[0].scheme(), "digest");
    assert!(acl[0].id().starts_with("alice:"));

    // A chroot: the connect string's path is the client's root (it must exist).
    zk.create("/app", b"", &persistent).await.unwrap();
    let rooted = Client::connect(&format!("{connect}/app")).await.unwrap();
    rooted.create("/k", b"", &persistent).await.unwrap();
    assert!(zk.check_stat("/app/k").await.unwrap().is_some());
    assert_eq!(rooted.path(), "/app");
}

/// Tests that need no fault share one ensemble, each in a tree of its own.
#[tokio::test]
async fn tests_share_one_ensemble_each_under_its_own_root() {
    let shared = ZooKeeperEnsemble::shared().await;
    assert!(std::ptr::eq(shared, ZooKeeperEnsemble::shared().await));
    assert_eq!(shared.member_count(), 3);
    let (a, b) = (shared.chroot("t").await, shared.chroot("t").await);
    assert_ne!(a, b);
    assert!(a.starts_with(&shared.connect_string()));
    let (za, zb) = (ZkClient::connect(&a).await, ZkClient::connect(&b).await);
    za.create("/lock", b"a").await;
    assert_eq!(zb.stat("/lock").await, None);
    zb.create("/lock", b"b").await;
    assert_eq!(za.get("/lock").await.unwrap().0, b"a");
}

/// A test process killed by SIGKILL drops nothing, yet leaves no ZooKeeper JVM behind: the
/// kit's watchdog kills it. The test runs itself as that child process.
#[tokio::test]
async fn a_killed_test_process_leaves_no_zookeeper_behind() {
    const CHILD: &str = "LOCK_TESTKIT_ZOOKEEPER_REAPER_CHILD";
    const NAME: &str = "a_killed_test_process_leaves_no_zookeeper_behind";
    if std::env::var_os(CHILD).is_some() {
        let ensemble = ZooKeeperEnsemble::start_single().await;
        println!("zookeeper-jvm-pid {}", ensemble.pid(0).unwrap());
        std::future::pending::<()>().await;
    }
    let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([NAME, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
    let jvm: u32 = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            // The harness prints `test <name> ... ` on the same line first.
            if let Some((_, pid)) = line.split_once("zookeeper-jvm-pid ") {
                return pid.trim().parse().unwrap();
            }
        }
        panic!("the child test ended without starting a server");
    })
    .await
    .unwrap();
    assert!(std::path::Path::new(&format!("/proc/{jvm}")).exists());
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    lock_testkit::eventually(
        "the orphaned JVM killed",
        Duration::from_secs(10),
        async || !std::path::Path::new(&format!("/proc/{jvm}")).exists(),
    )
    .await;
}

/// With quorum links, a member isolated from the others (quorum and election links, both
/// ways) keeps its client port: a write sent through it gets no answer, and it stops serving
/// within the sync limit, while the other two keep their leader and take writes. Healed, it
/// rejoins and has their writes. An isolated leader is replaced by one of the others (its
/// election links cut too: it cannot draw them back), and rejoins as a follower.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_member_leaves_the_quorum_until_healed() {
    let started = Instant::now();
    let mut ensemble = ZooKeeperEnsemble::builder()
        .quorum_links(true)
        .start()
        .await;
    println!(
        "3 members with quorum links serving in {:?}",
        started.elapsed()
    );
    let leader = ensemble.wait_for_leader().await;
    let cut = (leader + 1) % 3;
    let on_cut = ensemble.member_client(cut).await;
    on_cut.create("/before", b"").await;

    ensemble.isolate(cut);
    let isolated_at = Instant::now();
    assert!(ensemble.is_isolated(cut));
    let write = tokio::time::timeout(
        Duration::from_millis(500),
        on_cut.inner().create(
            "/through-the-cut",
            b"",
            &CreateMode::Persistent.with_acls(Acls::anyone_all()),
        ),
    )
    .await;
    assert!(!matches!(write, Ok(Ok(_))), "a write was served: {write:?}");
    let others: Vec<_> = (0..3).filter(|&i| i != cut).collect();
    let majority = ZkClient::connect(&lock_testkit::zookeeper::connect_string(
        others.iter().map(|&i| ensemble.client_addr(i)),
    ))
    .await;
    let written = majority.create("/while-cut", b"").await;
    lock_testkit::eventually(
        "the isolated member stopped serving",
        ensemble.sync_timeout() * 5,
        async || ensemble.mode(cut).await.is_none(),
    )
    .await;
    println!(
        "an isolated follower stopped serving after {:?} (sync limit {:?})",
        isolated_at.elapsed(),
        ensemble.sync_timeout()
    );
    assert_eq!(ensemble.leader().await, Some(leader), "the leader changed");

    ensemble.heal(cut);
    let healed_at = Instant::now();
    assert!(!ensemble.is_isolated(cut));
    ensemble.wait_healthy().await;
    println!("healed, it served again after {:?}", healed_at.elapsed());
    let back = ensemble.member_client(cut).await;
    assert_eq!(back.czxid("/while-cut").await, Some(written.czxid));
    let synced = tokio::time::timeout(Duration::from_secs(5), back.inner().sync("/")).await;
    assert!(matches!(synced, Ok(Ok(()))), "{synced:?}");
    assert_eq!(
        back.stat("/through-the-cut").await,
        None,
        "a write held back passed"
    );

    ensemble.isolate(leader);
    let isolated_at = Instant::now();
    // It says it leads until its followers' silence reaches the sync limit.
    lock_testkit::eventually(
        "another member leads",
        Duration::from_secs(20),
        async || ensemble.leader().await.is_some_and(|l| l != leader),
    )
    .await;
    println!(
        "an isolated leader was replaced after {:?}",
        isolated_at.elapsed()
    );
    ensemble.heal(leader);
    ensemble.wait_healthy().await;
    assert_eq!(ensemble.mode(leader).await, Some(Mode::Follower));
    assert!(
        ensemble
            .member_client(leader)
            .await
            .stat("/while-cut")
            .await
            .is_some()
    );
}
