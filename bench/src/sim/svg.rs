//! A line plot as an SVG: x on a log2 axis (bytes or ranks), y linear
//! (busbw), one polyline per series. Written directly, as bench/plot.py
//! does, so that the simulator draws its own figures with no other tool.

use std::fmt::Write;

const W: f64 = 860.0;
const H: f64 = 520.0;
const L: f64 = 70.0;
const R: f64 = 230.0;
const T: f64 = 50.0;
const B: f64 = 60.0;
const COLORS: [&str; 8] = [
    "#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf",
];

/// A labelled line of `(x, y)` points.
pub type Series = (String, Vec<(f64, f64)>);

fn human(x: f64, bytes: bool) -> String {
    if !bytes {
        return format!("{x}");
    }
    let x = x as u64;
    for (unit, div) in [("G", 1u64 << 30), ("M", 1 << 20), ("K", 1 << 10)] {
        if x >= div {
            return format!("{}{unit}", x / div);
        }
    }
    x.to_string()
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The SVG text of `series` with `title` and the x axis named `x_label`
/// (`bytes`: tick labels as sizes). Points with y <= 0 are left out.
pub fn plot(title: &str, x_label: &str, bytes: bool, series: &[Series]) -> String {
    let pts: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|s| s.1.iter().copied())
        .filter(|p| p.1 > 0.0 && p.0 > 0.0)
        .collect();
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="25" text-anchor="middle" font-size="15">{}</text>"#,
        W / 2.0,
        escape(title)
    );
    if pts.is_empty() {
        svg.push_str("</svg>\n");
        return svg;
    }
    let lx0 = pts.iter().map(|p| p.0.log2()).fold(f64::INFINITY, f64::min);
    let lx1 = pts
        .iter()
        .map(|p| p.0.log2())
        .fold(f64::NEG_INFINITY, f64::max);
    let ymax = pts.iter().map(|p| p.1).fold(0.0, f64::max) * 1.1;
    let sx = |x: f64| L + (x.log2() - lx0) / (lx1 - lx0).max(1.0) * (W - L - R);
    let sy = |y: f64| H - B - y / ymax * (H - T - B);
    let mut step = 10f64.powf((ymax / 5.0).log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if ymax / (step * m) <= 8.0 {
            step *= m;
            break;
        }
    }
    let mut y = 0.0;
    while y <= ymax {
        let _ = writeln!(
            svg,
            r##"<line x1="{L}" x2="{}" y1="{:.1}" y2="{:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{y}</text>"##,
            W - R,
            sy(y),
            sy(y),
            L - 6.0,
            sy(y) + 4.0
        );
        y += step;
    }
    let every = if lx1 - lx0 > 12.0 { 2.0 } else { 1.0 };
    let mut lx = lx0.ceil();
    while lx <= lx1 + 1e-9 {
        let x = lx.exp2();
        let _ = writeln!(
            svg,
            r##"<line x1="{0:.1}" x2="{0:.1}" y1="{T}" y2="{1}" stroke="#eee"/><text x="{0:.1}" y="{2}" text-anchor="middle">{3}</text>"##,
            sx(x),
            H - B,
            H - B + 16.0,
            human(x, bytes)
        );
        lx += every;
    }
    let _ = writeln!(
        svg,
        r#"<line x1="{L}" x2="{0}" y1="{1}" y2="{1}" stroke="black"/><line x1="{L}" x2="{L}" y1="{T}" y2="{1}" stroke="black"/>"#,
        W - R,
        H - B
    );
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        (L + W - R) / 2.0,
        H - 15.0,
        escape(x_label)
    );
    let _ = writeln!(
        svg,
        r#"<text x="18" y="{0}" transform="rotate(-90 18 {0})" text-anchor="middle">busbw (GB/s)</text>"#,
        (T + H - B) / 2.0
    );
    for (i, (name, points)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let dash = if i >= COLORS.len() {
            r#" stroke-dasharray="6,4""#
        } else {
            ""
        };
        let mut p: Vec<(f64, f64)> = points
            .iter()
            .copied()
            .filter(|p| p.1 > 0.0 && p.0 > 0.0)
            .collect();
        p.sort_by(|a, b| a.0.total_cmp(&b.0));
        let line: Vec<String> = p
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"{dash}/>"#,
            line.join(" ")
        );
        let ly = T + 10.0 + i as f64 * 18.0;
        let _ = writeln!(
            svg,
            r#"<line x1="{0}" x2="{1}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="2"{dash}/><text x="{2}" y="{3}">{4}</text>"#,
            W - R + 12.0,
            W - R + 40.0,
            W - R + 46.0,
            ly + 4.0,
            escape(name)
        );
    }
    svg.push_str("</svg>\n");
    svg
}
