//! The bench chart: each shape's kernel time against the memory floor, drawn as an SVG from a
//! `results.json` (`cargo xtask bench --plot`, or `cargo xtask plot` for a saved one). Plain SVG
//! written here: bars, labels and a grid need no plotting library or fonts.

use crate::args::Args;
use serde_json::Value;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Chart width in pixels.
const WIDTH: f64 = 960.0;
/// Room for the shape names left of the bars.
const LABEL_WIDTH: f64 = 220.0;
/// Room right of the floor line for a bar's time label.
const RIGHT_MARGIN: f64 = 170.0;
/// The title and the legend above the bars.
const HEADER: f64 = 64.0;
/// The axis labels below the bars.
const FOOTER: f64 = 36.0;
/// One shape's row: its bar and, when it has one, the baseline's thinner bar.
const ROW: f64 = 30.0;
const BAR: f64 = 14.0;
const BASELINE_BAR: f64 = 6.0;
/// Grid lines at these fractions of the floor.
const GRID: [f64; 5] = [0.0, 0.25, 0.5, 0.75, 1.0];
const KERNEL_COLOUR: &str = "#2b6cb0";
const BASELINE_COLOUR: &str = "#a0aec0";
const FLOOR_COLOUR: &str = "#c53030";
const GRID_COLOUR: &str = "#e2e8f0";

/// `cargo xtask plot [--results FILE] [--out FILE]`: redraws the chart of a saved run.
pub fn run(args: &[String]) -> Result<(), String> {
    let a = Args::parse("plot", args, &["--results", "--out"], &[])?;
    a.no_positional("plot")?;
    let results = a.path("--results", "bench/results.json");
    let out = a.path("--out", PathBuf::from("bench/chart.svg"));
    let text = std::fs::read_to_string(&results).map_err(|e| format!("{}: {e}", results.display()))?;
    let doc: Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", results.display()))?;
    write(&doc, &out)
}

/// Writes the chart of `doc` to `path`.
pub fn write(doc: &Value, path: &Path) -> Result<(), String> {
    crate::proc::write_text(path, &svg(doc)?)?;
    println!("wrote {}", path.display());
    Ok(())
}

/// One bar: a shape, its time and floor, and the baseline's time where measured.
#[derive(Debug, PartialEq)]
struct Row {
    shape: String,
    us: f64,
    floor_us: f64,
    baseline_us: Option<f64>,
}

impl Row {
    fn ratio(&self) -> f64 {
        self.floor_us / self.us
    }
}

fn rows(doc: &Value) -> Result<Vec<Row>, String> {
    let shapes = doc["shapes"].as_array().ok_or("results: no `shapes` array")?;
    shapes
        .iter()
        .map(|s| {
            let number = |key: &str| s[key].as_f64().filter(|x| x.is_finite() && *x > 0.0);
            let shape = s["shape"].as_str().ok_or("results: a shape without a name")?.to_string();
            let missing = |key: &str| format!("results: {shape} has no positive `{key}`");
            Ok(Row {
                us: number("us").ok_or_else(|| missing("us"))?,
                floor_us: number("floor_us").ok_or_else(|| missing("floor_us"))?,
                baseline_us: number("baseline_us"),
                shape,
            })
        })
        .collect()
}

/// The chart as SVG text.
fn svg(doc: &Value) -> Result<String, String> {
    let rows = rows(doc)?;
    if rows.is_empty() {
        return Err("results: no shapes to draw".into());
    }
    let gpu = doc["gpu"].as_str().unwrap_or("unknown GPU");
    let date = doc["date"].as_str().unwrap_or("");
    let plot = WIDTH - LABEL_WIDTH - RIGHT_MARGIN;
    let x = |ratio: f64| LABEL_WIDTH + plot * ratio.clamp(0.0, 1.0);
    let height = HEADER + ROW * rows.len() as f64 + FOOTER;
    let bottom = HEADER + ROW * rows.len() as f64;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let title = format!("kda on {gpu}, {date}: memory floor / kernel time (1.0 = at the floor)");
    let _ = writeln!(s, r#"<text x="10" y="20" font-size="15" font-weight="bold">{}</text>"#, escape(&title));
    let _ = writeln!(
        s,
        r#"<rect x="10" y="32" width="14" height="{BAR}" fill="{KERNEL_COLOUR}"/><text x="30" y="44">this library (Kernel::Auto; the layer shapes: all three of its kernels)</text>"#
    );
    let _ = writeln!(
        s,
        r#"<rect x="580" y="36" width="14" height="{BASELINE_BAR}" fill="{BASELINE_COLOUR}"/><text x="600" y="44">scalar baseline kernel</text>"#
    );
    for g in GRID {
        let gx = x(g);
        let (colour, width) = if g == 1.0 { (FLOOR_COLOUR, 1.5) } else { (GRID_COLOUR, 1.0) };
        let _ = writeln!(
            s,
            r#"<line x1="{gx:.1}" y1="{HEADER}" x2="{gx:.1}" y2="{bottom}" stroke="{colour}" stroke-width="{width}"/>"#
        );
        let _ = writeln!(s, r#"<text x="{gx:.1}" y="{:.1}" text-anchor="middle">{g}</text>"#, bottom + 16.0);
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="{FLOOR_COLOUR}">memory floor</text>"#,
        x(1.0),
        bottom + 30.0
    );
    for (i, row) in rows.iter().enumerate() {
        let top = HEADER + ROW * i as f64 + (ROW - BAR - BASELINE_BAR) / 2.0;
        let label_y = top + BAR - 3.0;
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{label_y:.1}" text-anchor="end">{}</text>"#,
            LABEL_WIDTH - 8.0,
            escape(&row.shape)
        );
        let _ = writeln!(
            s,
            r#"<rect x="{LABEL_WIDTH}" y="{top:.1}" width="{:.1}" height="{BAR}" fill="{KERNEL_COLOUR}"/>"#,
            x(row.ratio()) - LABEL_WIDTH
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{label_y:.1}">{:.1} us ({:.3})</text>"#,
            x(1.0) + 6.0,
            row.us,
            row.ratio()
        );
        if let Some(baseline) = row.baseline_us {
            let _ = writeln!(
                s,
                r#"<rect x="{LABEL_WIDTH}" y="{:.1}" width="{:.1}" height="{BASELINE_BAR}" fill="{BASELINE_COLOUR}"/>"#,
                top + BAR,
                x(row.floor_us / baseline) - LABEL_WIDTH
            );
        }
    }
    s.push_str("</svg>\n");
    Ok(s)
}

/// `text` with XML's special characters escaped.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn doc() -> Value {
        json!({ "gpu": "H200 <test>", "date": "2026-12-04", "shapes": [
            { "shape": "fixed_8192", "us": 200.0, "floor_us": 180.0, "baseline_us": 4000.0 },
            { "shape": "layer_a&b", "us": 1000.0, "floor_us": 100.0 },
        ]})
    }

    #[test]
    fn every_shape_gets_its_bar_label_and_time() {
        let svg = svg(&doc()).unwrap();
        assert!(svg.starts_with("<svg ") && svg.ends_with("</svg>\n"));
        assert!(svg.contains(">fixed_8192<") && svg.contains(">layer_a&amp;b<") && svg.contains("H200 &lt;test&gt;"));
        assert!(svg.contains("200.0 us (0.900)") && svg.contains("1000.0 us (0.100)"));
        let bars = |colour: &str| svg.matches(&format!(r#"fill="{colour}"/>"#)).count();
        // One bar per shape and the legend's swatch; the baseline only where it was measured.
        assert_eq!((bars(KERNEL_COLOUR), bars(BASELINE_COLOUR)), (3, 2));
        let plot = WIDTH - LABEL_WIDTH - RIGHT_MARGIN;
        assert!(svg.contains(&format!(r#"width="{:.1}" height="{BAR}""#, plot * 0.9)));
    }

    #[test]
    fn bad_results_are_errors() {
        assert!(svg(&json!({})).unwrap_err().contains("no `shapes`"));
        assert!(svg(&json!({ "shapes": [] })).unwrap_err().contains("no shapes"));
        let no_time = json!({ "shapes": [{ "shape": "x", "floor_us": 1.0 }] });
        assert!(svg(&no_time).unwrap_err().contains("x has no positive `us`"));
        let zero = json!({ "shapes": [{ "shape": "x", "us": 0.0, "floor_us": 1.0 }] });
        assert!(svg(&zero).is_err());
    }

    #[test]
    fn the_recorded_results_draw() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench/results.json");
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let svg = svg(&doc).unwrap();
        for row in doc["shapes"].as_array().unwrap() {
            assert!(svg.contains(&format!(">{}<", row["shape"].as_str().unwrap())));
        }
    }
}
