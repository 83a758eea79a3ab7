//! A hand-written SVG of latency distributions (empirical CDFs on a log time axis).
//!
//! Hand-written rather than `plotters`: one chart type, ~100 lines, no extra crates in the CI
//! build, and text is left to the SVG viewer (plotters' SVG backend still wants a font crate
//! to lay text out).

use std::fmt::Write as _;

/// One distribution to draw.
#[derive(Debug)]
pub(crate) struct Series<'a> {
    pub(crate) label: String,
    pub(crate) color: &'a str,
    /// The empirical CDF: (nanoseconds, fraction at or below), ascending.
    pub(crate) cdf: Vec<(u64, f64)>,
}

/// A vertical marker line.
#[derive(Debug)]
pub(crate) struct Marker {
    pub(crate) label: String,
    pub(crate) at_ns: u64,
}

/// The canvas, and the plot area inside it.
const W: f64 = 860.0;
const H: f64 = 480.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 790.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 420.0;
const MIDDLE: &str = r#" text-anchor="middle""#;

fn line(s: &mut String, (x1, y1): (f64, f64), (x2, y2): (f64, f64), style: &str) {
    let _ = writeln!(
        s,
        r#"<line x1="{x1:.1}" y1="{y1:.1}" x2="{x2:.1}" y2="{y2:.1}" {style}/>"#
    );
}

fn text(s: &mut String, (x, y): (f64, f64), attributes: &str, body: &str) {
    let body = body.replace('&', "&amp;").replace('<', "&lt;");
    let body = body.replace('>', "&gt;");
    let _ = writeln!(
        s,
        r#"<text x="{x:.1}" y="{y:.1}"{attributes}>{body}</text>"#
    );
}

/// `10^decade` nanoseconds as `1 µs`, `100 ms`, ...
fn decade_label(decade: i32) -> String {
    let (unit, base) = match decade {
        ..=2 => ("ns", 0),
        3..=5 => ("µs", 3),
        6..=8 => ("ms", 6),
        _ => ("s", 9),
    };
    let mantissa = 10u64.pow(u32::try_from(decade - base).unwrap_or(0));
    format!("{mantissa} {unit}")
}

/// The CDF chart of `series` with `markers`, titled `title`.
pub(crate) fn cdf_chart(title: &str, series: &[Series<'_>], markers: &[Marker]) -> String {
    let ends = series.iter().flat_map(|s| [s.cdf.first(), s.cdf.last()]);
    let values: Vec<f64> = (ends.flatten().map(|p| p.0))
        .chain(markers.iter().map(|m| m.at_ns))
        .map(|ns| (ns.max(1) as f64).log10())
        .collect();
    let (lo, hi) = (
        values.iter().copied().reduce(f64::min),
        values.into_iter().reduce(f64::max),
    );
    let lo = lo.unwrap_or(3.0).floor();
    let hi = hi.unwrap_or(6.0).ceil().max(lo + 1.0);
    let x_of_log = |log: f64| LEFT + (log - lo) / (hi - lo) * (RIGHT - LEFT);
    let x = |ns: u64| x_of_log((ns.max(1) as f64).log10());
    let y = |q: f64| TOP + (1.0 - q) * (BOTTOM - TOP);

    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">
<rect width="{W}" height="{H}" fill="white"/>
"#
    );
    text(
        &mut s,
        (W / 2.0, 24.0),
        r#" text-anchor="middle" font-size="15""#,
        title,
    );
    // Grid and axes: a labelled line per decade, fainter ones at 2× and 5×.
    for decade in lo as i32..=hi as i32 {
        for m in [1.0, 2.0, 5.0] {
            let log = f64::from(decade) + f64::log10(m);
            if log > hi + 1e-9 {
                break;
            }
            let px = x_of_log(log);
            let style = match m == 1.0 {
                true => r##"stroke="#bbb" stroke-width="1""##,
                false => r##"stroke="#e4e4e4" stroke-width="0.7""##,
            };
            line(&mut s, (px, TOP), (px, BOTTOM), style);
            if m == 1.0 {
                text(&mut s, (px, BOTTOM + 18.0), MIDDLE, &decade_label(decade));
            }
        }
    }
    for q in [0.0, 0.25, 0.5, 0.75, 0.9, 1.0] {
        line(&mut s, (LEFT, y(q)), (RIGHT, y(q)), r##"stroke="#e4e4e4""##);
        let (label, end) = (format!("{}%", q * 100.0), r#" text-anchor="end""#);
        text(&mut s, (LEFT - 6.0, y(q) + 4.0), end, &label);
    }
    let (w, h) = (RIGHT - LEFT, BOTTOM - TOP);
    let frame = format!(r#"x="{LEFT}" y="{TOP}" width="{w}" height="{h}""#);
    let _ = writeln!(s, r#"<rect {frame} fill="none" stroke="black"/>"#);
    let axis = "handoff latency: release sent in process A → acquire returned in process B";
    let axis = format!("{axis} (log scale)");
    text(&mut s, (LEFT + w / 2.0, H - 14.0), MIDDLE, &axis);
    let _ = writeln!(
        s,
        r#"<text transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle">fraction of handoffs at or below</text>"#,
        TOP + h / 2.0
    );
    for (i, m) in markers.iter().enumerate() {
        let (px, style) = (x(m.at_ns), r##"stroke="#555" stroke-dasharray="5 4""##);
        line(&mut s, (px, TOP), (px, BOTTOM), style);
        let at = (px + 4.0, BOTTOM - 8.0 - 16.0 * i as f64);
        text(&mut s, at, r##" fill="#333""##, &m.label);
    }
    // Series: a step CDF, one step per histogram bucket that holds samples; and the legend.
    for (i, serie) in series.iter().filter(|s| !s.cdf.is_empty()).enumerate() {
        let mut points = String::new();
        let mut prev_y = y(0.0);
        for &(ns, q) in &serie.cdf {
            let (px, py) = (x(ns), y(q));
            let _ = write!(points, "{px:.1},{prev_y:.1} {px:.1},{py:.1} ");
            prev_y = py;
        }
        let (color, points) = (serie.color, points.trim_end());
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{points}"/>"#
        );
        let ly = TOP + 18.0 + 18.0 * i as f64;
        let style = format!(r#"stroke="{color}" stroke-width="3""#);
        line(&mut s, (LEFT + 12.0, ly), (LEFT + 36.0, ly), &style);
        text(&mut s, (LEFT + 42.0, ly + 4.0), "", &serie.label);
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Latencies;

    #[test]
    fn draws_every_series_and_marker() {
        let series = [("ours", 50_000..52_000), ("seed", 3_000_000..3_000_003)];
        let series = series.map(|(l, r)| (l.into(), "#1f77b4", r.collect::<Latencies>().cdf()));
        let series = series.map(|(label, color, cdf)| Series { label, color, cdf });
        let ping = (String::from("PING p50"), 40_000);
        let svg = cdf_chart(
            "t <&>",
            &series,
            &[ping].map(|(label, at_ns)| Marker { label, at_ns }),
        );
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("PING p50") && svg.contains("t &lt;&amp;&gt;"));
        // The last point of each CDF reaches 100 %.
        assert!(svg.contains(&format!(",{TOP:.1}\"")));
        assert_eq!(decade_label(4), "10 µs");
        assert_eq!(decade_label(6), "1 ms");
        assert_eq!(decade_label(9), "1 s");
    }
}
