use super::acquire::{Count, Vote, remaining};
use super::idempotency::merge_states;
use super::*;
use crate::idempotency::{IdempotencyRecord, IdempotencyState};

fn ms(n: u64) -> Option<Duration> {
    Some(Duration::from_millis(n))
}

#[test]
fn remaining_waits_for_enough_busy_servers() {
    // 5 servers, quorum 3: 2 not busy, so one more busy server must free up: the shortest.
    let votes = [
        Some(Vote::Busy(ms(300))),
        Some(Vote::None),
        Some(Vote::Busy(ms(100))),
        Some(Vote::Yes),
        Some(Vote::Busy(ms(200))),
    ];
    assert_eq!(remaining(&votes, 3), ms(100));
    // All busy: three must free up: the third shortest.
    let votes = [
        Some(Vote::Busy(ms(300))),
        Some(Vote::Busy(ms(50))),
        Some(Vote::Busy(ms(100))),
        Some(Vote::Busy(None)),
        Some(Vote::Busy(ms(200))),
    ];
    assert_eq!(remaining(&votes, 3), ms(200));
    // A quorum may be free now.
    let votes = [Some(Vote::None), Some(Vote::Yes), Some(Vote::Busy(ms(5)))];
    assert_eq!(remaining(&votes, 2), None);
    // Unknown remainders are not guessed.
    let votes = [
        Some(Vote::Busy(None)),
        Some(Vote::Busy(None)),
        Some(Vote::Yes),
    ];
    assert_eq!(remaining(&votes, 2), None);
}

#[test]
fn states_merge_with_a_record_first() {
    let record_for = |r: &str, secs: u64| {
        IdempotencyState::Completed(IdempotencyRecord {
            fingerprint: "f".to_owned(),
            result: r.as_bytes().to_vec(),
            expires_in: Duration::from_secs(secs),
        })
    };
    let record = |r: &str| record_for(r, 10);
    assert_eq!(
        merge_states(
            vec![
                IdempotencyState::Absent,
                IdempotencyState::InFlight,
                record("a")
            ],
            3,
            2
        ),
        record("a")
    );
    assert_eq!(
        merge_states(vec![record("b"), record_for("a", 12), record("a")], 3, 2),
        record("a")
    );
    assert_eq!(
        merge_states(
            vec![IdempotencyState::Absent, IdempotencyState::InFlight],
            3,
            2
        ),
        IdempotencyState::InFlight
    );
    assert_eq!(
        merge_states(
            vec![IdempotencyState::Absent, IdempotencyState::Absent],
            3,
            2
        ),
        IdempotencyState::Absent
    );
}

/// A mark counts when it may have reached a quorum: on at least `answered - (n - quorum)`
/// of the servers that answered; fewer copies are leftovers of a failed mark write.
#[test]
fn marks_count_when_they_may_have_reached_a_quorum() {
    let mark = |f: &str, secs: u64| IdempotencyState::Started {
        fingerprint: f.to_owned(),
        expires_in: Duration::from_secs(secs),
    };
    let absent = || IdempotencyState::Absent;
    // 5 servers, quorum 3, all answer: 3 copies needed.
    assert_eq!(
        merge_states(
            vec![mark("f", 9), mark("f", 7), absent(), mark("f", 8), absent()],
            5,
            3
        ),
        mark("f", 7)
    );
    assert_eq!(
        merge_states(
            vec![mark("f", 9), absent(), absent(), mark("f", 8), absent()],
            5,
            3
        ),
        absent()
    );
    // Only 3 answer: one copy may stand for a quorum (the two silent servers may hold it).
    assert_eq!(
        merge_states(vec![absent(), mark("f", 9), absent()], 5, 3),
        mark("f", 9)
    );
    // A lock held anywhere is in flight; a record wins over everything.
    assert_eq!(
        merge_states(
            vec![mark("f", 9), IdempotencyState::InFlight, mark("f", 9)],
            3,
            2
        ),
        IdempotencyState::InFlight
    );
}

#[tokio::test]
async fn gather_stops_when_decided_and_keeps_order() {
    let out = gather(
        [0u64, 1, 2].map(|i| async move {
            if i == 2 {
                std::future::pending::<()>().await;
            }
            i
        }),
        |outs| outs.iter().flatten().count() == 2,
    )
    .await;
    assert_eq!(out, vec![Some(0), Some(1), None]);
}

#[test]
fn counts() {
    let votes = [
        Some(Vote::Yes),
        Some(Vote::Busy(None)),
        Some(Vote::None),
        None,
    ];
    let c = Count::of(&votes);
    assert_eq!((c.yes, c.busy, c.silent, c.answered()), (1, 1, 1, 2));
}

#[test]
fn each_lock_of_a_renewal_gets_its_own_verdict() {
    use crate::backend::Renewed::{Lost, Unknown, Yes};
    // 5 servers, quorum 3; 4 answered (one silent), 3 locks: on all of them, on exactly 3
    // (one of them the silent one), on one.
    let answers = [
        vec![true, false, false],
        vec![true, false, false],
        vec![true, true, false],
        vec![true, true, true],
    ];
    let got: Vec<&Vec<bool>> = answers.iter().collect();
    assert_eq!(renew::verdicts(&got, 3, 3, 5), vec![Yes, Unknown, Lost]);
    // Nobody answered: nothing is known.
    assert_eq!(renew::verdicts(&[], 2, 3, 5), vec![Unknown, Unknown]);
}
