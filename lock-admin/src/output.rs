//! A lock's state as the tool prints it: one line (list, watch), a block (inspect), or one
//! JSON object (`--json`: durations in milliseconds as numbers, absent values `null`). A
//! `LockState` never holds a token, so neither does anything printed here.

use std::time::Duration;

use lock_core::LockState;
use serde_json::{Value, json};

/// `state` as one JSON object.
pub(crate) fn json(state: &LockState) -> Value {
    json!({
        "key": state.key,
        "held": state.held,
        "holder": state.holder,
        "held_for_ms": state.held_for.map(millis),
        "remaining_ms": state.remaining.map(millis),
        "fence": state.fence,
        "waiters": state.waiters,
    })
}

/// `state` on one line: `order:42  held by "web-1" for 12.3s, 27.7s left, fence 17, 2 waiting`.
pub(crate) fn line(state: &LockState) -> String {
    let mut out = format!("{}  ", quoted(&state.key));
    if state.held {
        out.push_str("held");
        if let Some(holder) = &state.holder {
            out.push_str(&format!(" by {holder:?}"));
        }
        if let Some(held_for) = state.held_for {
            out.push_str(&format!(" for {}", human(held_for)));
        }
        if let Some(remaining) = state.remaining {
            out.push_str(&format!(", {} left", human(remaining)));
        }
    } else {
        out.push_str("free");
    }
    if let Some(fence) = state.fence {
        out.push_str(&format!(", fence {fence}"));
    }
    out.push_str(&format!(", {} waiting", state.waiters));
    out
}

/// `state` as a block, one field a line.
pub(crate) fn block(state: &LockState) -> String {
    let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".to_owned());
    [
        format!("key        {}", quoted(&state.key)),
        format!("held       {}", if state.held { "yes" } else { "no" }),
        format!(
            "holder     {}",
            or_dash(state.holder.as_ref().map(|h| format!("{h:?}")))
        ),
        format!("held for   {}", or_dash(state.held_for.map(human))),
        format!("remaining  {}", or_dash(state.remaining.map(human))),
        format!("fence      {}", or_dash(state.fence.map(|f| f.to_string()))),
        format!("waiters    {}", state.waiters),
    ]
    .join("\n")
}

/// A key as typed, quoted (and escaped) when it holds a space, a quote, or anything a
/// terminal would not show as itself: the library takes any key, so an application that
/// locks on user input lets its users choose control characters, escape sequences and
/// bidirectional overrides that would repaint the operator's terminal.
fn quoted(key: &str) -> String {
    let plain = !key.is_empty()
        && !key.contains([' ', '"', '\'', '\\'])
        && key.chars().all(|c| c.escape_debug().len() == 1);
    if plain {
        key.to_owned()
    } else {
        format!("{key:?}")
    }
}

/// `key` as one word for a shell command line (single-quoted unless plain; escaped as
/// [`quoted`] does when it holds what a terminal would not show as itself).
pub(crate) fn shell_word(key: &str) -> String {
    let plain = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, ':' | '-' | '_' | '.' | '/' | '@'));
    if plain {
        key.to_owned()
    } else if key
        .chars()
        .all(|c| c.escape_debug().len() == 1 || c == '\'' || c == '"' || c == '\\')
    {
        format!("'{}'", key.replace('\'', "'\\''"))
    } else {
        quoted(key)
    }
}

/// Milliseconds, saturating.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `250ms`, `12.3s`, `5m03s`, `2h05m`, `3d04h`.
pub(crate) fn human(d: Duration) -> String {
    let ms = millis(d);
    let s = ms / 1000;
    match s {
        0 => format!("{ms}ms"),
        1..=59 => format!("{}.{}s", s, (ms % 1000) / 100),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{:02}h", s / 86_400, (s % 86_400) / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held() -> LockState {
        let mut s = LockState::free("order:42");
        s.held = true;
        s.holder = Some("web-1/pid 7".to_owned());
        s.held_for = Some(Duration::from_millis(12_345));
        s.remaining = Some(Duration::from_millis(27_700));
        s.fence = Some(17);
        s.waiters = 2;
        s
    }

    #[test]
    fn states_print_as_lines_blocks_and_json() {
        assert_eq!(
            line(&held()),
            "order:42  held by \"web-1/pid 7\" for 12.3s, 27.7s left, fence 17, 2 waiting"
        );
        assert_eq!(line(&LockState::free("a b")), "\"a b\"  free, 0 waiting");
        assert_eq!(
            line(&LockState::free("k\u{1b}[2J\u{202e}x")),
            "\"k\\u{1b}[2J\\u{202e}x\"  free, 0 waiting"
        );
        assert_eq!(line(&LockState::free("ünï:1")), "ünï:1  free, 0 waiting");
        assert!(block(&held()).contains("holder     \"web-1/pid 7\""));
        assert!(block(&LockState::free("k")).contains("holder     -"));
        assert_eq!(
            json(&held()),
            json!({"key": "order:42", "held": true, "holder": "web-1/pid 7", "held_for_ms": 12345,
                   "remaining_ms": 27700, "fence": 17, "waiters": 2})
        );
        assert_eq!(json(&LockState::free("k"))["holder"], Value::Null);
    }

    #[test]
    fn durations_read_at_a_glance() {
        let cases = [
            (0, "0ms"),
            (250, "250ms"),
            (1_000, "1.0s"),
            (12_345, "12.3s"),
            (303_000, "5m03s"),
            (7_500_000, "2h05m"),
            (273_600_000, "3d04h"),
        ];
        for (ms, text) in cases {
            assert_eq!(human(Duration::from_millis(ms)), text);
        }
    }
}
