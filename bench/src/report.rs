//! Markdown tables and small SVG plots written under `target/bench/`.

use anyhow::Context;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

pub use xtask::workspace_root;

/// `target/bench/` under the workspace root.
pub fn bench_dir() -> PathBuf {
    workspace_root().join("target").join("bench")
}

/// The shared corpus of real images: `$L3_CORPUS` or `../shared/corpus` beside the workspace.
pub fn corpus_dir() -> PathBuf {
    std::env::var_os("L3_CORPUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("..").join("shared").join("corpus"))
}

/// One line describing the machine the figures come from.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    format!("{cpu}, {cores} cores")
}

pub struct Table {
    pub title: String,
    pub headers: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(title: &str, headers: &[&str]) -> Self {
        Table {
            title: title.into(),
            headers: headers.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        if !self.title.is_empty() {
            let _ = writeln!(s, "**{}**\n", self.title);
        }
        let _ = writeln!(s, "| {} |", self.headers.join(" | "));
        let _ = writeln!(s, "|{}", " --- |".repeat(self.headers.len()));
        for r in &self.rows {
            let _ = writeln!(s, "| {} |", r.join(" | "));
        }
        s
    }
}

/// A named series of (x, y) points for a line plot.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

const COLOURS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// A line plot with one polyline per series, linear axes, a legend.
pub fn line_plot(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let (w, h, ml, mr, mt, mb) = (640.0, 400.0, 70.0, 160.0, 40.0, 50.0);
    let pts = series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, 0.0f64, f64::MIN);
    for &(x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 >= x1 {
        x1 = x0 + 1.0;
    }
    if y1 <= y0 {
        y1 = y0 + 1.0;
    }
    let px = |x: f64| ml + (x - x0) / (x1 - x0) * (w - ml - mr);
    let py = |y: f64| h - mb - (y - y0) / (y1 - y0) * (h - mt - mb);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="20" text-anchor="middle" font-size="14">{}</text>"#,
        w / 2.0,
        esc(title)
    );
    let _ = writeln!(
        s,
        r#"<line x1="{ml}" y1="{}" x2="{}" y2="{}" stroke="black"/>"#,
        h - mb,
        w - mr,
        h - mb
    );
    let _ = writeln!(
        s,
        r#"<line x1="{ml}" y1="{mt}" x2="{ml}" y2="{}" stroke="black"/>"#,
        h - mb
    );
    for i in 0..=5 {
        let (xv, yv) = (
            x0 + (x1 - x0) * i as f64 / 5.0,
            y0 + (y1 - y0) * i as f64 / 5.0,
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            px(xv),
            h - mb + 16.0,
            fmt_tick(xv)
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
            ml - 6.0,
            py(yv) + 4.0,
            fmt_tick(yv)
        );
        let _ = writeln!(
            s,
            r##"<line x1="{ml}" y1="{0}" x2="{1}" y2="{0}" stroke="#ddd"/>"##,
            py(yv),
            w - mr
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        (ml + w - mr) / 2.0,
        h - 10.0,
        esc(x_label)
    );
    let _ = writeln!(
        s,
        r#"<text x="16" y="{}" text-anchor="middle" transform="rotate(-90 16 {})">{}</text>"#,
        h / 2.0,
        h / 2.0,
        esc(y_label)
    );
    for (i, se) in series.iter().enumerate() {
        let c = COLOURS[i % COLOURS.len()];
        let path: Vec<String> = se
            .points
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#,
            path.join(" ")
        );
        for &(x, y) in &se.points {
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{c}"/>"#,
                px(x),
                py(y)
            );
        }
        let ly = mt + 10.0 + 18.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{}" y="{}" width="12" height="12" fill="{c}"/>"#,
            w - mr + 10.0,
            ly - 10.0
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}">{}</text>"#,
            w - mr + 28.0,
            ly,
            esc(&se.name)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// A horizontal bar chart: one bar per (label, value).
pub fn bar_plot(title: &str, unit: &str, bars: &[(String, f64)]) -> String {
    let (w, bh, ml, mr, mt) = (640.0, 22.0, 200.0, 90.0, 40.0);
    let h = mt + bh * bars.len() as f64 + 20.0;
    let vmax = bars.iter().map(|b| b.1).fold(0.0f64, f64::max).max(1e-12);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="20" text-anchor="middle" font-size="14">{}</text>"#,
        w / 2.0,
        esc(title)
    );
    for (i, (label, v)) in bars.iter().enumerate() {
        let y = mt + bh * i as f64;
        let bw = v / vmax * (w - ml - mr);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
            ml - 6.0,
            y + 15.0,
            esc(label)
        );
        let _ = writeln!(
            s,
            r#"<rect x="{ml}" y="{}" width="{bw:.1}" height="{}" fill="{}"/>"#,
            y + 3.0,
            bh - 6.0,
            COLOURS[i % COLOURS.len()]
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}">{} {}</text>"#,
            ml + bw + 4.0,
            y + 15.0,
            fmt_tick(*v),
            esc(unit)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn fmt_tick(v: f64) -> String {
    if v.abs() >= 100.0 || v == v.trunc() {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// One section's Markdown, with its plots written beside it.
pub struct Report {
    name: String,
    md: String,
    svgs: Vec<(String, String)>,
}

impl Report {
    pub fn new(name: &str, about: &str) -> Self {
        let md = format!("## {name}: {about}\n\nMachine: {}.\n\n", machine());
        Report {
            name: name.into(),
            md,
            svgs: Vec::new(),
        }
    }
    pub fn para(&mut self, text: &str) {
        self.md.push_str(text);
        self.md.push_str("\n\n");
    }
    pub fn table(&mut self, t: &Table) {
        self.md.push_str(&t.markdown());
        self.md.push('\n');
    }
    /// Adds an SVG plot, written as `target/bench/<section>-<stem>.svg` and linked from the Markdown.
    pub fn svg(&mut self, stem: &str, svg: String) {
        let file = format!("{}-{stem}.svg", self.name);
        let _ = writeln!(self.md, "![{stem}]({file})\n");
        self.svgs.push((file, svg));
    }
    /// Writes `target/bench/<name>.md` and its plots (temporary name, then rename).
    pub fn finish(self) -> anyhow::Result<PathBuf> {
        let dir = bench_dir();
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        for (file, svg) in &self.svgs {
            write_atomic(&dir.join(file), svg)?;
        }
        let path = dir.join(format!("{}.md", self.name));
        write_atomic(&path, &self.md)?;
        Ok(path)
    }
}

pub fn write_atomic(path: &Path, text: &str) -> anyhow::Result<()> {
    stdx::fs::write_atomic(path, text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

/// Rebuilds `target/bench/REPORT.md` from every section file present, in section order.
pub fn write_combined(names: &[&str]) -> anyhow::Result<PathBuf> {
    let dir = bench_dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut md = String::from(
        "# Benchmark report\n\nGenerated by `cargo xtask bench`. Each section names the machine it ran on.\n\n",
    );
    for n in names {
        if let Ok(s) = std::fs::read_to_string(dir.join(format!("{n}.md"))) {
            md.push_str(&s);
            md.push('\n');
        }
    }
    let path = dir.join("REPORT.md");
    write_atomic(&path, &md)?;
    Ok(path)
}
