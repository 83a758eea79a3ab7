//! A hand-written SVG of latency distributions (empirical CDFs on a log time axis).
//!
//! Hand-written rather than `plotters`: one chart type, ~150 lines, no extra crates in the CI
//! build, and text is left to the SVG viewer (plotters' SVG backend still wants a font crate
//! to lay text out).

use std::fmt::Write as _;

/// One distribution to draw.
#[derive(Debug)]
pub(crate) struct Series<'a> {
    pub(crate) label: String,
    pub(crate) color: &'a str,
    /// Samples in nanoseconds, sorted ascending.
    pub(crate) sorted_ns: &'a [u64],
}

/// A vertical marker line.
#[derive(Debug)]
pub(crate) struct Marker {
    pub(crate) label: String,
    pub(crate) at_ns: u64,
}

const W: f64 = 860.0;
const H: f64 = 480.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// `10^decade` nanoseconds as `1 µs`, `100 ms`, ...
fn decade_label(decade: i32) -> String {
    let (unit, base) = match decade {
        ..=2 => ("ns", 0),
        3..=5 => ("µs", 3),
        6..=8 => ("ms", 6),
        _ => ("s", 9),
    };
    format!(
        "{} {unit}",
        10u64.pow(u32::try_from(decade - base).unwrap_or(0))
    )
}

/// The CDF chart of `series` with `markers`, titled `title`.
pub(crate) fn cdf_chart(title: &str, series: &[Series<'_>], markers: &[Marker]) -> String {
    let all_min = series
        .iter()
        .filter_map(|s| s.sorted_ns.first())
        .chain(markers.iter().map(|m| &m.at_ns))
        .copied()
        .min()
        .unwrap_or(1_000)
        .max(1);
    let all_max = series
        .iter()
        .filter_map(|s| s.sorted_ns.last())
        .chain(markers.iter().map(|m| &m.at_ns))
        .copied()
        .max()
        .unwrap_or(1_000_000)
        .max(all_min + 1);
    let lo = (all_min as f64).log10().floor();
    let hi = (all_max as f64).log10().ceil().max(lo + 1.0);
    let plot_w = W - LEFT - RIGHT;
    let plot_h = H - TOP - BOTTOM;
    let x = |ns: u64| LEFT + ((ns.max(1) as f64).log10() - lo) / (hi - lo) * plot_w;
    let y = |q: f64| TOP + (1.0 - q) * plot_h;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="24" text-anchor="middle" font-size="15">{}</text>"#,
        W / 2.0,
        esc(title)
    );
    // Grid and axes.
    let mut decade = lo as i32;
    while f64::from(decade) <= hi {
        for m in [1.0, 2.0, 5.0] {
            let v = 10f64.powi(decade) * m;
            if v.log10() > hi + 1e-9 {
                break;
            }
            let px = LEFT + (v.log10() - lo) / (hi - lo) * plot_w;
            let (stroke, width) = if m == 1.0 {
                ("#bbb", 1.0)
            } else {
                ("#e4e4e4", 0.7)
            };
            let _ = writeln!(
                s,
                r#"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{:.1}" stroke="{stroke}" stroke-width="{width}"/>"#,
                TOP + plot_h
            );
            if m == 1.0 {
                let _ = writeln!(
                    s,
                    r#"<text x="{px:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                    TOP + plot_h + 18.0,
                    esc(&decade_label(decade))
                );
            }
        }
        decade += 1;
    }
    for q in [0.0, 0.25, 0.5, 0.75, 0.9, 1.0] {
        let py = y(q);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#e4e4e4"/>"##,
            LEFT + plot_w
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}%</text>"#,
            LEFT - 6.0,
            py + 4.0,
            q * 100.0
        );
    }
    let _ = writeln!(
        s,
        r#"<rect x="{LEFT}" y="{TOP}" width="{plot_w:.1}" height="{plot_h:.1}" fill="none" stroke="black"/>"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">handoff latency: release sent in process A → acquire returned in process B (log scale)</text>"#,
        LEFT + plot_w / 2.0,
        H - 14.0
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle">fraction of handoffs at or below</text>"#,
        TOP + plot_h / 2.0
    );
    // Markers.
    for (i, m) in markers.iter().enumerate() {
        let px = x(m.at_ns);
        let _ = writeln!(
            s,
            r##"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{:.1}" stroke="#555" stroke-dasharray="5 4"/>"##,
            TOP + plot_h
        );
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" fill="#333">{}</text>"##,
            px + 4.0,
            TOP + plot_h - 8.0 - 16.0 * i as f64,
            esc(&m.label)
        );
    }
    // Series: a step CDF, thinned to at most ~600 points.
    for (i, serie) in series.iter().enumerate() {
        let n = serie.sorted_ns.len();
        if n == 0 {
            continue;
        }
        let step = n.div_ceil(600).max(1);
        let mut points = String::new();
        let mut prev_y = y(0.0);
        let mut idx = 0;
        while idx < n {
            let px = x(serie.sorted_ns[idx]);
            let py = y((idx + 1) as f64 / n as f64);
            let _ = write!(points, "{px:.1},{prev_y:.1} {px:.1},{py:.1} ");
            prev_y = py;
            idx = if idx + step >= n && idx != n - 1 {
                n - 1
            } else {
                idx + step
            };
        }
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>"#,
            serie.color,
            points.trim_end()
        );
        let ly = TOP + 18.0 + 18.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{}" stroke-width="3"/>"#,
            LEFT + 12.0,
            LEFT + 36.0,
            serie.color
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
            LEFT + 42.0,
            ly + 4.0,
            esc(&serie.label)
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_every_series_and_marker() {
        let a: Vec<u64> = (1..=2000).map(|i| 50_000 + i * 10).collect();
        let b = vec![3_000_000, 6_000_000, 9_000_000];
        let svg = cdf_chart(
            "t <&>",
            &[
                Series {
                    label: "ours".into(),
                    color: "#1f77b4",
                    sorted_ns: &a,
                },
                Series {
                    label: "seed".into(),
                    color: "#d62728",
                    sorted_ns: &b,
                },
            ],
            &[Marker {
                label: "PING p50".into(),
                at_ns: 40_000,
            }],
        );
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("PING p50") && svg.contains("t &lt;&amp;&gt;"));
        // The last point of each CDF reaches 100 %.
        assert!(svg.contains(&format!("{:.1}", TOP)));
    }

    #[test]
    fn decade_labels() {
        assert_eq!(decade_label(4), "10 µs");
        assert_eq!(decade_label(6), "1 ms");
        assert_eq!(decade_label(8), "100 ms");
        assert_eq!(decade_label(9), "1 s");
    }
}
