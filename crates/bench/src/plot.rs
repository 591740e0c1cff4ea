//! Charts of a sweep (bandwidth against transfer size, ops/s against processes, …) as SVG
//! or PNG, drawn here without a plotting crate: one layout, two small back ends (SVG text,
//! and an RGB raster with a built-in 5×7 font and a stored-deflate PNG encoder).

use crate::driver::SweepKey;
use crate::report::{fmt_bytes, Report};
use anyhow::{bail, Context, Result};
use std::fmt::Write;
use std::path::Path;

#[derive(Clone, Debug)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

#[derive(Clone, Debug)]
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    /// Tick positions and their labels (the x values of the data).
    pub x_ticks: Vec<(f64, String)>,
    pub log_x: bool,
    pub series: Vec<Series>,
}

/// One line per (target, phase): the median of each sweep point.
pub fn sweep_chart(name: &str, key: SweepKey, points: &[(u64, Report)]) -> Chart {
    let mut series: Vec<Series> = Vec::new();
    let mut unit = "MiB/s";
    for (v, r) in points {
        for row in &r.summary {
            unit = if row.unit == "MiB/s" { "MiB/s" } else { "ops/s" };
            let label = format!("{} {}", row.target, row.phase);
            match series.iter_mut().find(|s| s.name == label) {
                Some(s) => s.points.push((*v as f64, row.median)),
                None => series.push(Series { name: label, points: vec![(*v as f64, row.median)] }),
            }
        }
    }
    let x_ticks = points
        .iter()
        .map(|(v, _)| (*v as f64, if key.is_size() { fmt_bytes(*v as f64).replace(".0 ", " ") } else { v.to_string() }))
        .collect::<Vec<_>>();
    let xs: Vec<f64> = points.iter().map(|(v, _)| *v as f64).collect();
    let (lo, hi) = (xs.iter().cloned().fold(f64::INFINITY, f64::min), xs.iter().cloned().fold(0.0, f64::max));
    Chart {
        title: format!("shoal bench {name}"),
        x_label: key.name().to_string(),
        y_label: format!("{unit} (median)"),
        x_ticks,
        log_x: lo > 0.0 && hi / lo >= 8.0,
        series,
    }
}

/// Without a sweep: one line per target over the phases (categorical x axis).
pub fn phases_chart(r: &Report) -> Chart {
    let mut phases: Vec<String> = Vec::new();
    for row in &r.summary {
        if !phases.contains(&row.phase) {
            phases.push(row.phase.clone());
        }
    }
    let mut series: Vec<Series> = Vec::new();
    for row in &r.summary {
        let x = phases.iter().position(|p| p == &row.phase).unwrap_or(0) as f64;
        match series.iter_mut().find(|s| s.name == row.target) {
            Some(s) => s.points.push((x, row.median)),
            None => series.push(Series { name: row.target.clone(), points: vec![(x, row.median)] }),
        }
    }
    let unit = r.summary.first().map(|s| s.unit.clone()).unwrap_or_default();
    Chart {
        title: format!("shoal bench {}", r.name),
        x_label: "phase".into(),
        y_label: format!("{unit} (median)"),
        x_ticks: phases.iter().enumerate().map(|(i, p)| (i as f64, p.clone())).collect(),
        log_x: false,
        series,
    }
}

/// Write `chart` as SVG or PNG, by the file's extension.
pub fn write(chart: &Chart, path: &Path) -> Result<()> {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
    let bytes = match ext.as_str() {
        "svg" => svg(chart).into_bytes(),
        "png" => png(chart),
        _ => bail!("--plot {}: the file name must end in .svg or .png", path.display()),
    };
    std::fs::write(path, bytes).with_context(|| format!("cannot write {}", path.display()))
}

const W: f64 = 900.0;
const H: f64 = 520.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 230.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 70.0;
const COLORS: [(u8, u8, u8); 8] = [
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
];

#[derive(Clone, Copy, PartialEq)]
enum Anchor {
    Start,
    Middle,
    End,
}

trait Canvas {
    fn line(&mut self, x1: f64, y1: f64, x2: f64, y2: f64, color: (u8, u8, u8), width: f64);
    fn dot(&mut self, x: f64, y: f64, r: f64, color: (u8, u8, u8));
    /// Text with its baseline at y (or, vertical, rotated -90° around (x, y)).
    fn text(&mut self, x: f64, y: f64, s: &str, size: f64, anchor: Anchor, vertical: bool);
}

/// 800000 → "800k", 1500000 → "1.5M", 0.5 → "0.5".
fn fmt_tick(v: f64) -> String {
    let trim = |x: f64| {
        let s = format!("{x:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    };
    if v >= 1e6 {
        format!("{}M", trim(v / 1e6))
    } else if v >= 1e3 {
        format!("{}k", trim(v / 1e3))
    } else {
        trim(v)
    }
}

/// A step of 1, 2 or 5 × 10^k giving about `n` ticks up to `max`.
fn nice_step(max: f64, n: f64) -> f64 {
    let raw = (max / n).max(1e-9);
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let m = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    m * mag
}

fn draw(chart: &Chart, c: &mut dyn Canvas) {
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let ymax_data = chart.series.iter().flat_map(|s| s.points.iter().map(|p| p.1)).fold(0.0, f64::max);
    let step = nice_step(if ymax_data > 0.0 { ymax_data } else { 1.0 }, 5.0);
    let ymax = (ymax_data / step).ceil().max(1.0) * step;
    let xs: Vec<f64> = chart.x_ticks.iter().map(|t| t.0).collect();
    let tx = |x: f64| if chart.log_x { x.max(1e-9).log2() } else { x };
    let (xlo, xhi) =
        xs.iter().map(|x| tx(*x)).fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| (a.min(x), b.max(x)));
    let (xlo, xhi) = if xlo.is_finite() && xhi > xlo { (xlo, xhi) } else { (xlo.min(0.0) - 0.5, xlo.max(0.0) + 0.5) };
    let pad = (xhi - xlo) * 0.05;
    let px = |x: f64| LEFT + (tx(x) - (xlo - pad)) / ((xhi + pad) - (xlo - pad)) * pw;
    let py = |y: f64| TOP + ph - y / ymax * ph;
    let grey = (200, 200, 200);
    let black = (0, 0, 0);
    // Grid and y ticks.
    let mut y = 0.0;
    while y <= ymax + step * 0.01 {
        c.line(LEFT, py(y), LEFT + pw, py(y), grey, 1.0);
        c.text(LEFT - 8.0, py(y) + 4.0, &fmt_tick(y), 12.0, Anchor::End, false);
        y += step;
    }
    for (x, label) in &chart.x_ticks {
        c.line(px(*x), TOP + ph, px(*x), TOP + ph + 5.0, black, 1.0);
        c.text(px(*x), TOP + ph + 20.0, label, 12.0, Anchor::Middle, false);
    }
    c.line(LEFT, TOP + ph, LEFT + pw, TOP + ph, black, 1.5);
    c.line(LEFT, TOP, LEFT, TOP + ph, black, 1.5);
    c.text(W / 2.0 - RIGHT / 2.0 + LEFT / 2.0, 28.0, &chart.title, 16.0, Anchor::Middle, false);
    c.text(LEFT + pw / 2.0, H - 22.0, &chart.x_label, 13.0, Anchor::Middle, false);
    c.text(24.0, TOP + ph / 2.0, &chart.y_label, 13.0, Anchor::Middle, true);
    for (i, s) in chart.series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let mut pts = s.points.clone();
        pts.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap_or(std::cmp::Ordering::Equal));
        for w in pts.windows(2) {
            c.line(px(w[0].0), py(w[0].1), px(w[1].0), py(w[1].1), color, 2.0);
        }
        for p in &pts {
            c.dot(px(p.0), py(p.1), 3.5, color);
        }
        let ly = TOP + 10.0 + i as f64 * 20.0;
        c.line(W - RIGHT + 15.0, ly, W - RIGHT + 40.0, ly, color, 2.5);
        c.text(W - RIGHT + 46.0, ly + 4.0, &s.name, 12.0, Anchor::Start, false);
    }
}

// ---------------------------------------------------------------- SVG

struct Svg(String);

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

impl Canvas for Svg {
    fn line(&mut self, x1: f64, y1: f64, x2: f64, y2: f64, (r, g, b): (u8, u8, u8), width: f64) {
        let _ = writeln!(
            self.0,
            r#"<line x1="{x1:.1}" y1="{y1:.1}" x2="{x2:.1}" y2="{y2:.1}" stroke="rgb({r},{g},{b})" stroke-width="{width}"/>"#
        );
    }
    fn dot(&mut self, x: f64, y: f64, rad: f64, (r, g, b): (u8, u8, u8)) {
        let _ = writeln!(self.0, r#"<circle cx="{x:.1}" cy="{y:.1}" r="{rad}" fill="rgb({r},{g},{b})"/>"#);
    }
    fn text(&mut self, x: f64, y: f64, s: &str, size: f64, anchor: Anchor, vertical: bool) {
        let a = match anchor {
            Anchor::Start => "start",
            Anchor::Middle => "middle",
            Anchor::End => "end",
        };
        let rot = if vertical { format!(r#" transform="rotate(-90 {x:.1} {y:.1})""#) } else { String::new() };
        let _ = writeln!(
            self.0,
            r#"<text x="{x:.1}" y="{y:.1}" font-family="sans-serif" font-size="{size}" text-anchor="{a}"{rot}>{}</text>"#,
            esc(s)
        );
    }
}

pub fn svg(chart: &Chart) -> String {
    let mut s = Svg(format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    ));
    draw(chart, &mut s);
    s.0.push_str("</svg>\n");
    s.0
}

// ---------------------------------------------------------------- PNG

struct Raster {
    w: usize,
    h: usize,
    px: Vec<u8>,
}

/// 5×7 glyphs, one byte per row (bit 4 = leftmost column). Letters are drawn upper case.
fn glyph(c: char) -> [u8; 7] {
    match c.to_ascii_uppercase() {
        ' ' => [0; 7],
        '0' => [0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E],
        '1' => [0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E],
        '2' => [0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F],
        '3' => [0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E],
        '4' => [0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02],
        '5' => [0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E],
        '6' => [0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E],
        '7' => [0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08],
        '8' => [0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E],
        '9' => [0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C],
        'A' => [0x0E, 0x11, 0x11, 0x11, 0x1F, 0x11, 0x11],
        'B' => [0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E],
        'C' => [0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E],
        'D' => [0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C],
        'E' => [0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F],
        'F' => [0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10],
        'G' => [0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F],
        'H' => [0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11],
        'I' => [0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E],
        'J' => [0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C],
        'K' => [0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11],
        'L' => [0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F],
        'M' => [0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11],
        'N' => [0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11],
        'O' => [0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E],
        'P' => [0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10],
        'Q' => [0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D],
        'R' => [0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11],
        'S' => [0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E],
        'T' => [0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04],
        'U' => [0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E],
        'V' => [0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04],
        'W' => [0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A],
        'X' => [0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11],
        'Y' => [0x11, 0x11, 0x11, 0x0A, 0x04, 0x04, 0x04],
        'Z' => [0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F],
        '.' => [0, 0, 0, 0, 0, 0x0C, 0x0C],
        ',' => [0, 0, 0, 0, 0x0C, 0x04, 0x08],
        ':' => [0, 0x0C, 0x0C, 0, 0x0C, 0x0C, 0],
        '/' => [0, 0x01, 0x02, 0x04, 0x08, 0x10, 0],
        '-' => [0, 0, 0, 0x1F, 0, 0, 0],
        '(' => [0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02],
        ')' => [0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08],
        '%' => [0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03],
        '_' => [0, 0, 0, 0, 0, 0, 0x1F],
        '@' => [0x0E, 0x11, 0x01, 0x0D, 0x15, 0x15, 0x0E],
        '=' => [0, 0, 0x1F, 0, 0x1F, 0, 0],
        '+' => [0, 0x04, 0x04, 0x1F, 0x04, 0x04, 0],
        _ => [0x0E, 0x11, 0x01, 0x02, 0x04, 0, 0x04],
    }
}

impl Raster {
    fn new(w: usize, h: usize) -> Raster {
        Raster { w, h, px: vec![255; w * h * 3] }
    }

    fn set(&mut self, x: i64, y: i64, (r, g, b): (u8, u8, u8)) {
        if x >= 0 && y >= 0 && (x as usize) < self.w && (y as usize) < self.h {
            let i = (y as usize * self.w + x as usize) * 3;
            self.px[i..i + 3].copy_from_slice(&[r, g, b]);
        }
    }

    fn disc(&mut self, x: f64, y: f64, r: f64, color: (u8, u8, u8)) {
        let ri = r.ceil() as i64;
        for dy in -ri..=ri {
            for dx in -ri..=ri {
                if ((dx * dx + dy * dy) as f64) <= r * r + 0.25 {
                    self.set(x.round() as i64 + dx, y.round() as i64 + dy, color);
                }
            }
        }
    }
}

impl Canvas for Raster {
    fn line(&mut self, x1: f64, y1: f64, x2: f64, y2: f64, color: (u8, u8, u8), width: f64) {
        let len = ((x2 - x1).powi(2) + (y2 - y1).powi(2)).sqrt();
        let steps = (len * 2.0).ceil().max(1.0) as usize;
        for i in 0..=steps {
            let t = i as f64 / steps as f64;
            let (x, y) = (x1 + (x2 - x1) * t, y1 + (y2 - y1) * t);
            if width <= 1.0 {
                self.set(x.round() as i64, y.round() as i64, color);
            } else {
                self.disc(x, y, (width - 1.0) / 2.0, color);
            }
        }
    }
    fn dot(&mut self, x: f64, y: f64, r: f64, color: (u8, u8, u8)) {
        self.disc(x, y, r, color);
    }
    fn text(&mut self, x: f64, y: f64, s: &str, size: f64, anchor: Anchor, vertical: bool) {
        let scale: i64 = if size >= 12.0 { 2 } else { 1 };
        let adv = 6 * scale;
        let total = s.chars().count() as i64 * adv - scale;
        let shift = match anchor {
            Anchor::Start => 0,
            Anchor::Middle => total / 2,
            Anchor::End => total,
        };
        for (i, ch) in s.chars().enumerate() {
            let g = glyph(ch);
            for (row, bits) in g.iter().enumerate() {
                for col in 0..5 {
                    if bits & (0x10 >> col) == 0 {
                        continue;
                    }
                    for sy in 0..scale {
                        for sx in 0..scale {
                            // Along the text: u; across (from the top of the glyph): v.
                            let u = i as i64 * adv + col * scale + sx - shift;
                            let v = row as i64 * scale + sy - 7 * scale;
                            let (px, py) =
                                if vertical { (x as i64 + v, y as i64 - u) } else { (x as i64 + u, y as i64 + v) };
                            self.set(px, py, (0, 0, 0));
                        }
                    }
                }
            }
        }
    }
}

fn crc32(data: &[u8]) -> u32 {
    let mut table = [0u32; 256];
    for (n, e) in table.iter_mut().enumerate() {
        let mut c = n as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 };
        }
        *e = c;
    }
    let mut c = 0xFFFF_FFFFu32;
    for b in data {
        c = table[((c ^ *b as u32) & 0xFF) as usize] ^ (c >> 8);
    }
    c ^ 0xFFFF_FFFF
}

/// zlib stream of stored (uncompressed) deflate blocks.
fn zlib_stored(data: &[u8]) -> Vec<u8> {
    let mut out = vec![0x78, 0x01];
    let mut chunks = data.chunks(65535).peekable();
    if chunks.peek().is_none() {
        out.extend_from_slice(&[1, 0, 0, 0xFF, 0xFF]);
    }
    while let Some(c) = chunks.next() {
        out.push(if chunks.peek().is_none() { 1 } else { 0 });
        let len = c.len() as u16;
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(c);
    }
    let (mut a, mut b) = (1u32, 0u32);
    for x in data {
        a = (a + *x as u32) % 65521;
        b = (b + a) % 65521;
    }
    out.extend_from_slice(&((b << 16) | a).to_be_bytes());
    out
}

fn encode_png(r: &Raster) -> Vec<u8> {
    let mut raw = Vec::with_capacity((r.w * 3 + 1) * r.h);
    for row in r.px.chunks(r.w * 3) {
        raw.push(0);
        raw.extend_from_slice(row);
    }
    let mut out = vec![0x89, b'P', b'N', b'G', 0x0D, 0x0A, 0x1A, 0x0A];
    let mut chunk = |kind: &[u8], body: &[u8]| {
        out.extend_from_slice(&(body.len() as u32).to_be_bytes());
        let mut c = kind.to_vec();
        c.extend_from_slice(body);
        out.extend_from_slice(&c);
        out.extend_from_slice(&crc32(&c).to_be_bytes());
    };
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&(r.w as u32).to_be_bytes());
    ihdr.extend_from_slice(&(r.h as u32).to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    chunk(b"IHDR", &ihdr);
    chunk(b"IDAT", &zlib_stored(&raw));
    chunk(b"IEND", &[]);
    out
}

pub fn png(chart: &Chart) -> Vec<u8> {
    let mut r = Raster::new(W as usize, H as usize);
    draw(chart, &mut r);
    encode_png(&r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart() -> Chart {
        Chart {
            title: "t <&>".into(),
            x_label: "transfer size".into(),
            y_label: "MiB/s".into(),
            x_ticks: vec![(4096.0, "4 KiB".into()), (1048576.0, "1 MiB".into())],
            log_x: true,
            series: vec![Series { name: "native write".into(), points: vec![(4096.0, 10.0), (1048576.0, 900.0)] }],
        }
    }

    #[test]
    fn svg_and_png_are_well_formed() {
        let s = svg(&chart());
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert!(s.contains("native write") && s.contains("t &lt;&amp;&gt;"));
        let p = png(&chart());
        assert_eq!(&p[..8], &[0x89, b'P', b'N', b'G', 0x0D, 0x0A, 0x1A, 0x0A]);
        assert_eq!(&p[12..16], b"IHDR");
        assert_eq!(&p[p.len() - 8..p.len() - 4], b"IEND");
        // CRC of IEND is the well-known constant.
        assert_eq!(&p[p.len() - 4..], &[0xAE, 0x42, 0x60, 0x82]);
        assert_eq!(nice_step(950.0, 5.0), 200.0);
        assert_eq!(
            (fmt_tick(800_000.0), fmt_tick(1_500_000.0), fmt_tick(0.0), fmt_tick(250.0)),
            ("800k".into(), "1.5M".into(), "0".into(), "250".into())
        );
    }
}
