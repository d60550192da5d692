//! The benches' pictures: SVG drawn from a run's own figures, beside the
//! tables its report prints, so that a picture is as current as the run
//! that made it and never drawn by hand.
//!
//! A bench that measures draws into the book (`docs/src/plots/`); one that
//! only checks itself (`cargo test --bench`, see [`BenchMode`]) draws into
//! `target/bench-plots/`, so that the check exercises the drawing without
//! replacing a measured picture.

use std::ops::Range;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow};
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::bench_mode::BenchMode;
use crate::measure::Latencies;
use crate::workspace::{repo_root, tree};

const SIZE: (u32, u32) = (900, 460);
const FONT: &str = "sans-serif";

/// One labelled series of (x, y) points.
pub struct Line {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// A chart of lines: latency distributions, objects over time.
pub struct Lines {
    pub title: String,
    pub x: String,
    pub y: String,
    pub lines: Vec<Line>,
    /// Where the legend goes: the corner the lines leave empty.
    pub legend: Corner,
}

/// A corner of the plotting area.
#[derive(Clone, Copy)]
pub enum Corner {
    UpperLeft,
    LowerRight,
}

/// The lines' and bars' colours, in order: distinct, and readable on white.
const COLOURS: [RGBColor; 5] = [
    RGBColor(0x1f, 0x5f, 0xa8),
    RGBColor(0xb3, 0x54, 0x1e),
    RGBColor(0x2e, 0x7d, 0x32),
    RGBColor(0x6a, 0x3d, 0x9a),
    RGBColor(0x55, 0x55, 0x55),
];

fn colour(index: usize) -> RGBColor {
    COLOURS[index % COLOURS.len()]
}

/// Where a bench's pictures go, by how it was started, and what run they
/// show.
pub struct Plots {
    dir: PathBuf,
    /// Under every title: the tree and the day of the run.
    run: String,
}

impl Plots {
    pub fn new(mode: BenchMode) -> Result<Self> {
        let dir = match mode {
            BenchMode::Measure => repo_root().join("docs/src/plots"),
            BenchMode::Check => repo_root().join("target/bench-plots"),
        };
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let run = format!(
            "kplug at {}, {}",
            tree()?.replace('`', ""),
            jiff::Timestamp::now().strftime("%Y-%m-%d")
        );
        Ok(Self { dir, run })
    }

    fn caption(&self, title: &str) -> String {
        format!("{title} ({})", self.run)
    }

    /// Bars of `values` (label, value), each with its value written above
    /// it. Returns the picture's path from the repository's root, for the
    /// report to name.
    pub fn bars(
        &self,
        name: &str,
        title: &str,
        unit: &str,
        values: &[(String, f64)],
    ) -> Result<String> {
        let path = self.dir.join(format!("{name}.svg"));
        let top = values.iter().map(|(_, v)| *v).fold(0.0, f64::max) * 1.15;
        draw(&path, |root| {
            root.fill(&WHITE)?;
            let count = values.len();
            let mut chart = ChartBuilder::on(root)
                .caption(self.caption(title), (FONT, 15))
                .margin(12)
                .x_label_area_size(36)
                .y_label_area_size(70)
                .build_cartesian_2d(0f64..count as f64, 0f64..top.max(1.0))?;
            chart
                .configure_mesh()
                .disable_x_mesh()
                .x_labels(count * 2 + 1)
                .x_label_formatter(&|x| {
                    // A label under the middle of each bar, nothing between.
                    let index = x.floor();
                    let centred = (x - index - 0.5).abs() < 1e-9;
                    match values.get(index as usize) {
                        Some((label, _)) if centred => label.clone(),
                        _ => String::new(),
                    }
                })
                .y_label_formatter(&|v| thousands(*v))
                .y_desc(unit)
                .draw()?;
            for (i, (_, value)) in values.iter().enumerate() {
                let x = i as f64;
                let colour = colour(i);
                chart.draw_series(std::iter::once(Rectangle::new(
                    [(x + 0.2, 0.0), (x + 0.8, *value)],
                    colour.filled(),
                )))?;
                chart.draw_series(std::iter::once(Text::new(
                    thousands(*value),
                    (x + 0.5, *value + top * 0.02),
                    (FONT, 14).into_font().color(&BLACK).pos(text_above()),
                )))?;
            }
            Ok(())
        })?;
        Ok(shown(&path))
    }

    /// `lines` on shared axes, each in its own colour with a legend. Returns
    /// the picture's path from the repository's root.
    pub fn lines(&self, name: &str, chart: &Lines) -> Result<String> {
        let path = self.dir.join(format!("{name}.svg"));
        let x = span(
            chart
                .lines
                .iter()
                .flat_map(|l| l.points.iter().map(|p| p.0)),
        );
        let y = span(
            chart
                .lines
                .iter()
                .flat_map(|l| l.points.iter().map(|p| p.1)),
        );
        draw(&path, |root| {
            root.fill(&WHITE)?;
            let mut plot = ChartBuilder::on(root)
                .caption(self.caption(&chart.title), (FONT, 15))
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(70)
                .build_cartesian_2d(x, y)?;
            plot.configure_mesh()
                .x_desc(chart.x.as_str())
                .y_desc(chart.y.as_str())
                .draw()?;
            for (i, line) in chart.lines.iter().enumerate() {
                let colour = colour(i);
                plot.draw_series(LineSeries::new(
                    line.points.iter().copied(),
                    colour.stroke_width(2),
                ))?
                .label(line.label.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
                });
            }
            plot.configure_series_labels()
                .position(match chart.legend {
                    Corner::UpperLeft => SeriesLabelPosition::UpperLeft,
                    Corner::LowerRight => SeriesLabelPosition::LowerRight,
                })
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .label_font((FONT, 13))
                .draw()?;
            Ok(())
        })?;
        Ok(shown(&path))
    }
}

/// `path` from the repository's root, as BENCHMARKS.md names it.
fn shown(path: &Path) -> String {
    let root = repo_root();
    path.strip_prefix(&root)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// The share of calls that took at most each latency, in µs, up to the
/// 99th percentile (the slowest hundredth would stretch the axis over the
/// rest): a distribution as one line.
pub fn distribution(latencies: &Latencies) -> Vec<(f64, f64)> {
    let samples = latencies.samples();
    let count = samples.len() as f64;
    let shown = (count * 0.99).ceil() as usize;
    // A few hundred points draw the same curve as thousands, in a tenth of
    // the SVG.
    let every = (shown / POINTS).max(1);
    samples
        .iter()
        .take(shown)
        .enumerate()
        .filter(|(i, _)| i % every == 0 || i + 1 == shown)
        .map(|(i, latency)| (latency.as_secs_f64() * 1e6, (i + 1) as f64 / count))
        .collect()
}

/// At most about this many points per distribution.
const POINTS: usize = 400;

/// Draws the picture and writes it to `path`, with plotters' errors
/// (generic over the backend) turned into one type.
fn draw(
    path: &Path,
    paint: impl FnOnce(&DrawingArea<SVGBackend<'_>, Shift>) -> Result<(), Box<dyn std::error::Error>>,
) -> Result<()> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    paint(&root).map_err(|e| anyhow!("drawing {}: {e}", path.display()))?;
    root.present()
        .map_err(|e| anyhow!("writing {}: {e}", path.display()))
}

/// From zero to a little above the largest value, so that nothing touches
/// the frame.
fn span(values: impl Iterator<Item = f64>) -> Range<f64> {
    let top = values.fold(0.0, f64::max);
    0.0..if top > 0.0 { top * 1.05 } else { 1.0 }
}

fn text_above() -> plotters::style::text_anchor::Pos {
    use plotters::style::text_anchor::{HPos, Pos, VPos};
    Pos::new(HPos::Center, VPos::Bottom)
}

fn thousands(value: f64) -> String {
    crate::report::thousands(value.round() as usize)
}
