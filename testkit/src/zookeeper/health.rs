//! Who leads a [`ZooKeeperEnsemble`], and whether it serves: the questions its waits ask every
//! member with four-letter commands.

#![allow(
    clippy::panic,
    reason = "a test harness that cannot do its job fails the test using it, loudly and with the cause"
)]

use super::four_letter::{Mode, Srvr, mntr_field, srvr};
use super::{HEALTHY_BOUND, LEADER_BOUND, ZooKeeperEnsemble};
use crate::eventually::eventually_ok;
use crate::members::SetMember;

impl ZooKeeperEnsemble {
    /// Member `i`'s role while it serves clients, or `None` (killed, paused, looking for a
    /// leader, without a quorum). Asks `srvr`, within 500 ms.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use lock_testkit::zookeeper::{Mode, ZooKeeperEnsemble};
    /// let ensemble = ZooKeeperEnsemble::start().await;
    /// let leader = ensemble.leader().await.unwrap();
    /// assert_eq!(ensemble.mode(leader).await, Some(Mode::Leader));
    /// assert_eq!(ensemble.mode((leader + 1) % 3).await, Some(Mode::Follower));
    /// # }
    /// ```
    pub async fn mode(&self, i: usize) -> Option<Mode> {
        let member = self.member(i);
        if !member.process.is_live() {
            return None;
        }
        srvr(member.client_addr()).await.ok().map(|s| s.mode)
    }

    /// The server's version, as a live member reports it (`3.8.0` with Debian bookworm's
    /// package), or `None` when no member answers.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let ensemble = lock_testkit::zookeeper::ZooKeeperEnsemble::start_single().await;
    /// assert!(ensemble.server_version().await.unwrap().starts_with("3."));
    /// # }
    /// ```
    pub async fn server_version(&self) -> Option<String> {
        for member in self.members.iter().filter(|m| m.process.is_live()) {
            if let Ok(answer) = member.ask("srvr").await
                && let Some(line) = answer
                    .lines()
                    .find_map(|l| l.strip_prefix("Zookeeper version: "))
            {
                let version = line.split(['-', ',']).next().unwrap_or(line);
                return Some(version.trim().to_owned());
            }
        }
        None
    }

    /// The member that leads with a quorum of followers in sync (a single server: itself), or
    /// `None` (no leader, an election under way, a paused or killed leader not replaced yet).
    /// Asks every live member at once (`srvr`, then `mntr` of the leader), each within 500 ms.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let ensemble = lock_testkit::zookeeper::ZooKeeperEnsemble::start().await;
    /// assert!(ensemble.leader().await.unwrap() < 3);
    /// # }
    /// ```
    pub async fn leader(&self) -> Option<usize> {
        self.leader_report().await.ok()
    }

    /// Waits until there is a [`leader`](Self::leader) and returns it.
    ///
    /// # Panics
    /// When there is none within 20 s (the message says what each member reported).
    ///
    /// See [`pause`](Self::pause).
    pub async fn wait_for_leader(&self) -> usize {
        eventually_ok("a ZooKeeper leader", LEADER_BOUND, async || {
            self.leader_report().await
        })
        .await
    }

    /// Waits until no member leads (every live one has noticed a lost quorum).
    ///
    /// # Panics
    /// When a member still leads after 20 s.
    ///
    /// See [`kill_all_but`](Self::kill_all_but).
    pub async fn wait_for_no_leader(&self) {
        eventually_ok("no ZooKeeper leader", LEADER_BOUND, async || {
            match self.leader_report().await {
                Ok(i) => Err(format!("m{i} still leads")),
                Err(_) => Ok(()),
            }
        })
        .await;
    }

    /// Waits until every live member (running, not paused) serves clients and exactly one of
    /// them says it leads, with a quorum; returns the leader.
    ///
    /// # Panics
    /// At once when fewer than a quorum of members are live (it could never be healthy) or a
    /// member has exited on its own (with its log); else when not healthy within 45 s (the
    /// message says which member was still wrong, and how).
    ///
    /// See [`pause`](Self::pause).
    pub async fn wait_healthy(&mut self) -> usize {
        self.members.assert_quorum_live();
        eventually_ok(
            "the ZooKeeper ensemble serving",
            HEALTHY_BOUND,
            async || self.health_report().await,
        )
        .await
    }

    /// Waits until member `i` serves clients.
    pub(super) async fn wait_serving(&mut self, i: usize) {
        let what = format!("{} serving after its restart", self.member(i).what());
        eventually_ok(&what, HEALTHY_BOUND, async || {
            let member = &mut self.members[i];
            member.check_not_crashed();
            srvr(member.client_addr()).await.map(|_| ())
        })
        .await;
    }

    /// What every live member's `srvr` says, asked at once (a paused one costs its timeout).
    async fn srvr_all(&self) -> Vec<(usize, Result<Srvr, String>)> {
        let asked: Vec<_> = self
            .members
            .iter()
            .enumerate()
            .filter(|(_, m)| m.process.is_live())
            .map(|(i, m)| (i, tokio::spawn(srvr(m.client_addr()))))
            .collect();
        let mut answers = Vec::with_capacity(asked.len());
        for (i, answer) in asked {
            let answer = answer
                .await
                .unwrap_or_else(|e| Err(format!("the srvr task failed: {e}")));
            answers.push((i, answer));
        }
        answers
    }

    /// The leader, or what each live member said.
    async fn leader_report(&self) -> Result<usize, String> {
        let answers = self.srvr_all().await;
        self.leader_of(&answers).await
    }

    /// Among these `srvr` answers, the member that leads a quorum (of the highest epoch when a
    /// deposed leader has not noticed yet); else what each said.
    async fn leader_of(&self, answers: &[(usize, Result<Srvr, String>)]) -> Result<usize, String> {
        let mut said = Vec::new();
        let mut leaders = Vec::new();
        for (i, answer) in answers {
            match answer {
                Ok(s) if s.mode == Mode::Standalone => return Ok(*i),
                Ok(s) if s.mode == Mode::Leader => {
                    let addr = self.members[*i].client_addr();
                    match mntr_field(addr, "zk_synced_followers").await {
                        Ok(n) if n + 1 >= self.quorum() as i64 => leaders.push((*i, s.zxid >> 32)),
                        Ok(n) => said.push(format!("m{i} leads {n} synced followers")),
                        Err(e) => said.push(format!("m{i} leads: {e}")),
                    }
                }
                Ok(s) => said.push(format!("m{i}: {:?}", s.mode)),
                Err(e) => said.push(format!("m{i}: {e}")),
            }
        }
        if let Some(&(i, _)) = leaders.iter().max_by_key(|&&(_, epoch)| epoch) {
            return Ok(i);
        }
        Err(format!(
            "no live member leads a quorum of {}: {}",
            self.quorum(),
            said.join("; ")
        ))
    }

    /// The leader when every live member serves and one leads a quorum; else what is wrong.
    async fn health_report(&mut self) -> Result<usize, String> {
        for member in self.members.iter_mut() {
            if member.process.is_live() {
                member.check_not_crashed();
            }
        }
        let answers = self.srvr_all().await;
        let problems: Vec<String> = answers
            .iter()
            .filter_map(|(i, a)| a.as_ref().err().map(|e| format!("m{i}: {e}")))
            .collect();
        if !problems.is_empty() {
            return Err(problems.join("; "));
        }
        // A deposed leader (paused, then resumed) still says so until it notices that its
        // followers left: healthy is one leader only.
        let claiming: Vec<String> = answers
            .iter()
            .filter(|(_, a)| matches!(a, Ok(s) if s.mode == Mode::Leader))
            .map(|(i, _)| format!("m{i}"))
            .collect();
        if claiming.len() > 1 {
            return Err(format!("{} all say they lead", claiming.join(", ")));
        }
        self.leader_of(&answers).await
    }
}
