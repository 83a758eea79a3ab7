//! The worker processes of a chaos run: started, sent `GO`, read all run long, stopped.

use std::time::Duration;

use lock_testkit::ChildProcess;
use lock_tests::chaos::WorkerConfig;
use tokio::task::JoinHandle;

/// How long a worker may take to print `READY`, and to exit after `STOP`.
const READY_BOUND: Duration = Duration::from_secs(30);
const FINISH_BOUND: Duration = Duration::from_secs(45);

/// A `lock-chaos-worker` process after `GO`. A task of its own reads its stdout all run long
/// (a record per attempt: a full pipe would stall the worker) until the test says `STOP`.
pub(crate) struct Worker {
    proc: u32,
    pub(crate) pid: u32,
    stop: tokio::sync::oneshot::Sender<()>,
    run: JoinHandle<Finished>,
}

/// What a worker left behind.
pub(crate) struct Finished {
    pub(crate) proc: u32,
    pub(crate) status: Result<std::process::ExitStatus, String>,
    pub(crate) lines: Vec<String>,
    pub(crate) stderr: String,
}

impl Worker {
    /// Starts a worker process; it prints `READY` once connected.
    pub(crate) fn spawn(cfg: &WorkerConfig) -> ChildProcess {
        ChildProcess::spawn(env!("CARGO_BIN_EXE_lock-chaos-worker"), cfg.to_args())
    }

    /// Waits for the worker's `READY`.
    pub(crate) async fn wait_ready(proc: u32, child: &mut ChildProcess) {
        match child.next_line(READY_BOUND).await {
            Some(line) if line == "READY" => {}
            other => panic!(
                "worker p{proc} did not get ready: {other:?}; stderr: {}",
                child.stderr()
            ),
        }
    }

    /// Sends `GO`, and reads what the worker prints until [`stop`](Self::stop).
    pub(crate) async fn go(proc: u32, mut child: ChildProcess) -> Worker {
        let pid = child.pid().expect("worker pid");
        child.send("GO").await;
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let run = tokio::spawn(Self::drive(proc, child, stopped));
        Worker {
            proc,
            pid,
            stop,
            run,
        }
    }

    /// Reads the worker's lines until told to stop (or its output ends), sends `STOP`, and waits
    /// for the exit (bounded: a worker that hangs is killed and reported).
    async fn drive(
        proc: u32,
        mut child: ChildProcess,
        mut stopped: tokio::sync::oneshot::Receiver<()>,
    ) -> Finished {
        // No bound on a silence here: the test's own schedule says when to stop.
        let mut open = true;
        while open {
            tokio::select! {
                _ = &mut stopped => break,
                line = child.next_line(Duration::MAX) => open = line.is_some(),
            }
        }
        if open {
            child.send("STOP").await;
        }
        let exited = tokio::time::timeout(FINISH_BOUND, async {
            while child.next_line(Duration::MAX).await.is_some() {}
        })
        .await
        .is_ok();
        if !exited {
            child.kill().await;
        }
        let out = child.finish(FINISH_BOUND).await;
        Finished {
            proc,
            status: if exited {
                Ok(out.status)
            } else {
                Err(format!(
                    "did not exit within {FINISH_BOUND:?} of STOP (killed)"
                ))
            },
            lines: out.lines,
            stderr: out.stderr,
        }
    }

    /// Tells the worker to stop; [`finish`](Self::finish) then waits for it.
    pub(crate) fn stop(self) -> (u32, JoinHandle<Finished>) {
        let _ = self.stop.send(());
        (self.proc, self.run)
    }

    /// What a stopped worker left behind (its driver failing, e.g. `STOP` not written, is
    /// reported as its status).
    pub(crate) async fn finish(proc: u32, run: JoinHandle<Finished>) -> Finished {
        match run.await {
            Ok(finished) => finished,
            Err(e) => Finished {
                proc,
                status: Err(format!("its driver failed: {e}")),
                lines: Vec::new(),
                stderr: String::new(),
            },
        }
    }
}
