//! Who leads an [`EtcdCluster`], and whether it is whole: the questions its waits ask every
//! member.

#![allow(
    clippy::panic,
    reason = "a test harness that cannot do its job fails the test using it, loudly and with the cause"
)]

use super::{EtcdCluster, HEALTHY_BOUND, LEADER_BOUND, member};
use crate::eventually::eventually_ok;
use crate::members::SetMember;

impl EtcdCluster {
    /// The member that answers as leader and that a quorum of members follows, or `None`
    /// (no leader, an election under way, a paused or killed leader not replaced yet).
    /// Asks every live member, each within 500 ms.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cluster = lock_testkit::etcd::EtcdCluster::start().await;
    /// let leader = cluster.leader().await.unwrap();
    /// assert!(leader < 3);
    /// # }
    /// ```
    pub async fn leader(&self) -> Option<usize> {
        self.leader_report().await.ok()
    }

    /// Waits until there is a [`leader`](Self::leader) and returns it.
    ///
    /// # Panics
    /// When there is none within 15 s (the message says what each member reported).
    ///
    /// See [`pause`](Self::pause).
    pub async fn wait_for_leader(&self) -> usize {
        eventually_ok("an etcd leader", LEADER_BOUND, async || {
            self.leader_report().await
        })
        .await
    }

    /// Waits until every live member (running, not paused) is healthy (`/health`: a quorum
    /// read goes through) and all of them follow one live leader; returns the leader.
    ///
    /// # Panics
    /// At once when fewer than a quorum of members are live (it could never be healthy) or a
    /// member has exited on its own (with its log); else when not healthy within 30 s (the
    /// message says which member was still wrong, and how).
    ///
    /// See [`pause`](Self::pause).
    pub async fn wait_healthy(&mut self) -> usize {
        self.members.assert_quorum_live();
        eventually_ok("the etcd cluster healthy", HEALTHY_BOUND, async || {
            self.health_report().await
        })
        .await
    }

    /// The leader, or what each live member said.
    async fn leader_report(&self) -> Result<usize, String> {
        let mut said = Vec::new();
        let mut statuses = Vec::new();
        let asked: Vec<_> = self
            .members
            .iter()
            .enumerate()
            .filter(|(_, m)| m.process.is_live())
            .map(|(i, m)| (i, tokio::spawn(member::status_at(m.client_addr()))))
            .collect();
        for (i, answer) in asked {
            let member = &self.members[i];
            let answer = answer
                .await
                .unwrap_or_else(|e| Err(format!("the status task failed: {e}")));
            match answer {
                Ok(status) => {
                    said.push(format!("{} follows {:x}", member.name, status.leader));
                    statuses.push((i, status));
                }
                Err(e) => said.push(format!("{}: {e}", member.name)),
            }
        }
        // The leader answers, and says it is the leader.
        let leader = statuses
            .iter()
            .find(|(_, s)| s.leader != 0 && s.leader == s.id);
        if let Some(&(i, status)) = leader {
            let followers = statuses
                .iter()
                .filter(|(_, s)| s.leader == status.id)
                .count();
            if followers >= self.quorum() {
                return Ok(i);
            }
        }
        Err(format!(
            "no live member leads a quorum of {}: {}",
            self.quorum(),
            said.join("; ")
        ))
    }

    /// The leader when every live member is healthy and follows it; else what is wrong.
    async fn health_report(&mut self) -> Result<usize, String> {
        let mut problems = Vec::new();
        let mut leaders = Vec::new();
        for member in self.members.iter_mut() {
            if !member.process.is_live() {
                continue;
            }
            member.check_not_crashed();
            match member.status().await {
                Ok(status) => {
                    member.id = status.id;
                    if status.leader == 0 {
                        problems.push(format!("{}: no leader", member.name));
                    }
                    leaders.push((member.name.clone(), status.leader));
                }
                Err(e) => problems.push(format!("{}: {e}", member.name)),
            }
            if let Err(e) = member.healthy().await {
                problems.push(format!("{}: {e}", member.name));
            }
        }
        if !problems.is_empty() {
            return Err(problems.join("; "));
        }
        let first = leaders.first().map_or(0, |&(_, id)| id);
        if leaders.iter().any(|&(_, id)| id != first) {
            let said: Vec<String> = leaders
                .iter()
                .map(|(name, id)| format!("{name} follows {id:x}"))
                .collect();
            return Err(format!("the members disagree: {}", said.join(", ")));
        }
        self.members
            .iter()
            .position(|m| m.id == first && m.process.is_live())
            .ok_or_else(|| format!("every member follows {first:x}, which is not a live member"))
    }
}
