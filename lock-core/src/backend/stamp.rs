//! What a contender entry of a consensus backend (etcd, ZooKeeper) records of its taker, for
//! `inspect`: who takes the lock, its lease, and since when it holds the lock, or since when it
//! queues for it. Never the token (that is in the entry's name).
//!
//! The entry's value (etcd) or data (ZooKeeper) is `[fair:<ticket>\n]s1|<state>|<since>|<lease>|<holder>`:
//! - `fair:<ticket>` only for a fair waiter's etcd key (see `etcd::announce`);
//! - `state` is `h` (it holds the lock since `since`) or `q` (it queued at `since`: how long it
//!   has held the lock, if it does, is unknown until its owner rewrites the entry `h`, in the
//!   background once it learns it holds: off the grant's critical path, and in a write that
//!   changes neither the fence nor the lease, conditioned on the entry being the one created);
//! - `since` is the writer's clock, in milliseconds since 1970 (as Redis's stamp is);
//! - `lease` the lock's lease in milliseconds, as asked at the acquire;
//! - `holder` the taker's identity ([`AttemptOptions::holder`](super::AttemptOptions::holder)),
//!   possibly empty; last, so it may hold a `|`.
//!
//! Entries written by an older version of this crate (an empty value, or `fair:<ticket>`
//! alone) parse to no stamp: held, with no holder and no age.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// What a stamp says of the entry's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Since {
    /// It holds the lock since then (ms since 1970).
    Held(u64),
    /// It queued then (ms since 1970); whether and since when it holds is not recorded yet.
    Queued(u64),
}

/// A contender entry's stamp, read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stamp {
    pub(crate) since: Since,
    pub(crate) lease: Duration,
    /// As written: show it through [`crate::inspect::shown_holder`].
    pub(crate) holder: String,
}

/// The version tag that starts every stamp.
const TAG: &str = "s1|";

/// The wall clock now, in milliseconds since 1970.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The value of a contender entry: `fair` (a fair waiter's ticket, etcd only) and the stamp.
pub(crate) fn value(fair: Option<&str>, since: Since, lease: Duration, holder: &str) -> Vec<u8> {
    let (state, at) = match since {
        Since::Held(at) => ('h', at),
        Since::Queued(at) => ('q', at),
    };
    let lease = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
    let stamp = format!("{TAG}{state}|{at}|{lease}|{holder}");
    match fair {
        Some(ticket) => format!("fair:{ticket}\n{stamp}").into_bytes(),
        None => stamp.into_bytes(),
    }
}

/// The part of an entry's value before its stamp: `fair:<ticket>` for a fair waiter's etcd key
/// (what the announcement carries), empty otherwise.
pub(crate) fn fair_part(value: &[u8]) -> &[u8] {
    if !value.starts_with(b"fair:") {
        return &[];
    }
    match value.iter().position(|b| *b == b'\n') {
        Some(end) => &value[..end],
        None => value,
    }
}

/// The stamp of an entry's value; `None` for an entry without one (an older version's), or a
/// value this crate did not write.
pub(crate) fn parse(value: &[u8]) -> Option<Stamp> {
    let text = std::str::from_utf8(value).ok()?;
    let stamp = if text.starts_with("fair:") {
        text.split_once('\n')?.1
    } else {
        text
    };
    let mut parts = stamp.strip_prefix(TAG)?.splitn(4, '|');
    let (state, at, lease, holder) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let at: u64 = at.parse().ok()?;
    let since = match state {
        "h" => Since::Held(at),
        "q" => Since::Queued(at),
        _ => return None,
    };
    Some(Stamp {
        since,
        lease: Duration::from_millis(lease.parse().ok()?),
        holder: holder.to_owned(),
    })
}

/// The value `written` (a stamp) says once its entry holds the lock since `at`; `None` when
/// `written` holds no stamp (nothing to rewrite).
pub(crate) fn held_since(written: &[u8], at: u64) -> Option<Vec<u8>> {
    let stamp = parse(written)?;
    let fair = std::str::from_utf8(fair_part(written))
        .ok()
        .and_then(|f| f.strip_prefix("fair:"));
    Some(value(fair, Since::Held(at), stamp.lease, &stamp.holder))
}

/// When a queued stamp says its entry queued (ms since 1970); `None` for another value (its
/// entry is not to be rewritten once it holds).
pub(crate) fn queued_at(value: &[u8]) -> Option<u64> {
    match parse(value)?.since {
        Since::Queued(at) => Some(at),
        Since::Held(_) => None,
    }
}

impl Stamp {
    /// The holder to show (`None` when not recorded).
    pub(crate) fn shown_holder(&self) -> Option<String> {
        (!self.holder.is_empty()).then(|| crate::inspect::shown_holder(&self.holder))
    }

    /// How long the entry has held the lock at `now` (ms since 1970): `None` while only its
    /// queueing is recorded (never its wait counted as holding).
    pub(crate) fn held_for(&self, now: u64) -> Option<Duration> {
        match self.since {
            Since::Held(at) => Some(Duration::from_millis(now.saturating_sub(at))),
            Since::Queued(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_round_trip_and_old_entries_parse_to_none() {
        let lease = Duration::from_millis(2500);
        let held = value(None, Since::Held(1000), lease, "web-1/pid 7|x");
        let stamp = parse(&held).unwrap();
        assert_eq!(stamp.since, Since::Held(1000));
        assert_eq!(stamp.lease, lease);
        assert_eq!(stamp.holder, "web-1/pid 7|x");
        assert_eq!(stamp.held_for(1750), Some(Duration::from_millis(750)));
        assert_eq!(stamp.held_for(10), Some(Duration::ZERO));
        assert!(fair_part(&held).is_empty());
        // A fair waiter's etcd value keeps its announcement in front.
        let fair = value(Some("t42"), Since::Queued(5), lease, "");
        assert_eq!(fair_part(&fair), b"fair:t42");
        let stamp = parse(&fair).unwrap();
        assert_eq!(stamp.since, Since::Queued(5));
        assert_eq!(stamp.shown_holder(), None);
        // Queued: the wait is never counted as holding.
        assert_eq!(stamp.held_for(1_000_000), None);
        let granted = held_since(&fair, 900).unwrap();
        assert_eq!(fair_part(&granted), b"fair:t42");
        assert_eq!(parse(&granted).unwrap().since, Since::Held(900));
        assert_eq!(
            parse(&held_since(&held, 900).unwrap()).unwrap().since,
            Since::Held(900)
        );
        assert_eq!((queued_at(&fair), queued_at(&held)), (Some(5), None));
        // Entries of older versions, and values this crate did not write.
        for old in [
            &b""[..],
            b"fair:t42",
            b"fair:t42\n",
            b"s1|x|1|2|h",
            b"s1|h|-1|2|h",
            b"\xff",
        ] {
            assert_eq!(parse(old), None, "{old:?}");
            assert_eq!(held_since(old, 1), None);
        }
        assert_eq!(fair_part(b"fair:t42"), b"fair:t42");
        // A holder read back is made safe to show.
        let hostile = value(None, Since::Held(1), lease, "a\u{202E}b\nc");
        assert_eq!(
            parse(&hostile).unwrap().shown_holder().as_deref(),
            Some("a?b?c")
        );
    }
}
