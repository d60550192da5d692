//! The benches' pictures: SVG drawn from a run's own figures, beside the
//! tables its report prints, so that a picture is as current as the run
//! that made it and never drawn by hand.
//!
//! A bench that measures draws into the book (`docs/src/plots/`); one that
//! only checks itself (`cargo test --bench`, see [`BenchMode`]) draws into
//! `target/bench-plots/`, so that the check exercises the drawing without
//! replacing a measured picture. The failure drills' timelines
//! ([`Timeline`]) are drawn from their report by the `drill-plots` binary.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, ensure};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

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

/// One request: when it started, in s into the stretch drawn, how long it
/// took, and whether it did what it should.
#[derive(Clone, Copy)]
pub struct Request {
    pub at_s: f64,
    pub latency_ms: f64,
    pub ok: bool,
}

/// The requests of one kind, drawn in one colour.
pub struct Requests {
    pub label: String,
    pub requests: Vec<Request>,
}

/// Requests over a stretch of time, with the moments that mattered marked:
/// what a failure drill's disruption did to its load.
pub struct Timeline {
    pub title: String,
    pub x: String,
    pub kinds: Vec<Requests>,
    /// What happened, at s into the stretch.
    pub marks: Vec<(String, f64)>,
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

/// Failed requests: a colour no kind of request has.
const FAILED: RGBColor = RGBColor(0xd7, 0x19, 0x1c);
/// Marks, and their labels.
const MARK: RGBColor = RGBColor(0x33, 0x33, 0x33);

/// Where a bench's pictures go, by how it was started, and what run they
/// show.
pub struct Plots {
    dir: PathBuf,
    /// Under every title: the tree and the day of the run.
    run: String,
}

impl Plots {
    /// The pictures of a bench running now, on this tree.
    pub fn new(mode: BenchMode) -> Result<Self> {
        let dir = match mode {
            BenchMode::Measure => repo_root().join("docs/src/plots"),
            BenchMode::Check => repo_root().join("target/bench-plots"),
        };
        let run = format!(
            "kplug at {}, {}",
            tree()?.replace('`', ""),
            jiff::Timestamp::now().strftime("%Y-%m-%d")
        );
        Self::of_run(dir, run)
    }

    /// The pictures of a run described by `run` (a commit and a day), in
    /// `dir`: a report's, drawn after the fact.
    pub fn of_run(dir: PathBuf, run: String) -> Result<Self> {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
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

    /// Each kind's latency over time, on a log scale, per slice of the time
    /// axis: the median as a line, broken where all the kind's requests
    /// failed, and the slowest as a dot; the slowest failure of each slice,
    /// of any kind, as a red cross at its latency; each mark a vertical
    /// line labelled above the plot. Returns the picture's path from the
    /// repository's root.
    pub fn timeline(&self, name: &str, chart: &Timeline) -> Result<String> {
        let path = self.dir.join(format!("{name}.svg"));
        let requests = || chart.kinds.iter().flat_map(|kind| &kind.requests);
        ensure!(
            requests().next().is_some(),
            "{}: no requests to draw",
            chart.title
        );
        let x = span(
            requests()
                .map(|r| r.at_s)
                .chain(chart.marks.iter().map(|(_, at)| *at)),
        );
        let slice = x.end / SLICES;
        let y = requests().map(latency).fold(f64::INFINITY, f64::min) / 1.5
            ..requests().map(latency).fold(0.0, f64::max) * 1.5;
        let mut marks: Vec<&(String, f64)> = chart.marks.iter().collect();
        marks.sort_by(|a, b| a.1.total_cmp(&b.1));
        draw(&path, |root| {
            root.fill(&WHITE)?;
            let area = root.titled(&self.caption(&chart.title), (FONT, 15))?;
            let font = (FONT, 12).into_font().color(&MARK);
            // The labels take as many rows above the plot as they need, so
            // they are laid out before it is built: it is as wide as the
            // area but for the margins and the y labels.
            let width = area.dim_in_pixel().0 - 2 * MARGIN - Y_LABELS;
            let widths = marks
                .iter()
                .map(|(label, at)| {
                    let left = (at - x.start) / (x.end - x.start) * f64::from(width);
                    Ok((left as i32, area.estimate_text_size(label, &font)?.0))
                })
                .collect::<Result<Vec<_>, DrawingAreaErrorKind<_>>>()?;
            let labels = lay_out(&widths, width);
            let rows = labels.iter().map(|label| label.row + 1).max().unwrap_or(0);
            let mut plot = ChartBuilder::on(&area)
                .margin(MARGIN)
                .margin_top(MARGIN + rows * ROW)
                .margin_bottom(MARGIN + ROW)
                .x_label_area_size(40)
                .y_label_area_size(Y_LABELS)
                .build_cartesian_2d(x.clone(), y.clone().log_scale())?;
            plot.configure_mesh()
                // The light lines would take a fifth of the picture's bytes
                // and show nothing the bold ones do not.
                .light_line_style(TRANSPARENT)
                .x_desc(chart.x.as_str())
                .x_label_formatter(&|s| format!("{s:.0}"))
                .y_desc("latency, ms")
                .y_label_formatter(&|ms| milliseconds(*ms))
                .draw()?;
            for (i, kind) in chart.kinds.iter().enumerate() {
                let colour = colour(i);
                let slices = sliced(kind.requests.iter(), slice);
                for run in medians(&slices, slice) {
                    plot.draw_series(LineSeries::new(run, colour))?;
                }
                plot.draw_series(
                    slices
                        .values()
                        .filter_map(|requests| slowest(requests.iter().filter(|r| r.ok)))
                        .map(|r| Circle::new((r.at_s, latency(&r)), 2, colour.filled())),
                )?;
            }
            let failed = sliced(requests().filter(|r| !r.ok), slice);
            plot.draw_series(
                failed
                    .values()
                    .filter_map(|requests| slowest(requests.iter()))
                    .map(|r| Cross::new((r.at_s, latency(&r)), 4, FAILED.stroke_width(2))),
            )?;
            let (_, plot_rows) = plot.plotting_area().get_pixel_range();
            for (label, (text, at)) in labels.iter().zip(&marks) {
                let (mark, _) = plot.backend_coord(&(*at, y.start));
                label.draw(root, text, mark, &plot_rows, &font)?;
            }
            let note = format!("per {slice:.2} s: median (line), slowest (dot)");
            let entries: Vec<(Key, &str)> = (chart.kinds.iter().enumerate())
                .map(|(i, kind)| (Key::Kind(colour(i)), kind.label.as_str()))
                .chain([(Key::Failed, "failed"), (Key::Note, note.as_str())])
                .collect();
            legend(root, &entries, &font)
        })?;
        Ok(shown(&path))
    }
}

/// The time axis in this many slices, each drawn as one median and one
/// slowest request per kind, and one failure: a few hundred marks draw
/// what thousands of requests would (in a tenth of the bytes), and the
/// slowest is what a disruption moves.
const SLICES: f64 = 60.0;

/// The fastest latency drawn, in ms: a log scale has no zero.
const FASTEST_MS: f64 = 0.1;

const MARGIN: u32 = 12;
const Y_LABELS: u32 = 70;
/// The height of a row of text: a row of marks' labels, the legend.
const ROW: u32 = 15;
/// The space a mark's label keeps from the next one in its row, in px.
const LABEL_GAP: u32 = 8;

fn latency(request: &Request) -> f64 {
    request.latency_ms.max(FASTEST_MS)
}

/// `requests` by slice of the time axis, `slice` s each, in time order.
fn sliced<'a>(
    requests: impl Iterator<Item = &'a Request>,
    slice: f64,
) -> BTreeMap<u64, Vec<Request>> {
    let mut slices = BTreeMap::<u64, Vec<Request>>::new();
    for request in requests {
        slices
            .entry((request.at_s / slice) as u64)
            .or_default()
            .push(*request);
    }
    slices
}

/// The median latency of each slice's requests that succeeded, at the
/// slice's middle, in runs: a slice whose requests all failed ends one, as
/// a line across it would draw successes where there were none.
fn medians(slices: &BTreeMap<u64, Vec<Request>>, slice: f64) -> Vec<Vec<(f64, f64)>> {
    let mut runs = Vec::new();
    let mut run = Vec::new();
    for (index, requests) in slices {
        let mut succeeded: Vec<f64> = requests.iter().filter(|r| r.ok).map(latency).collect();
        if succeeded.is_empty() {
            runs.push(std::mem::take(&mut run));
            continue;
        }
        succeeded.sort_by(f64::total_cmp);
        run.push((
            (*index as f64 + 0.5) * slice,
            succeeded[succeeded.len() / 2],
        ));
    }
    runs.push(run);
    runs
}

fn slowest<'a>(requests: impl Iterator<Item = &'a Request>) -> Option<Request> {
    requests
        .copied()
        .max_by(|a, b| a.latency_ms.total_cmp(&b.latency_ms))
}

/// Where a mark's label goes above the plot: its row, counted up from the
/// plot, and its side of the mark.
struct Label {
    row: u32,
    /// Left of the mark, where right of it would run past the plot.
    leftwards: bool,
}

/// Each mark's label in the first row where it overlaps no label before
/// it. `marks` in time order, as (px from the plot's left, label width).
fn lay_out(marks: &[(i32, u32)], plot_width: u32) -> Vec<Label> {
    // Where each row's labels so far end.
    let mut ends: Vec<i32> = Vec::new();
    marks
        .iter()
        .map(|&(at, width)| {
            let width = (width + LABEL_GAP) as i32;
            let leftwards = at + width > plot_width as i32;
            let (start, end) = if leftwards {
                (at - width, at)
            } else {
                (at, at + width)
            };
            let row = ends.iter().position(|&last| last <= start);
            let row = row.unwrap_or_else(|| {
                ends.push(end);
                ends.len() - 1
            });
            ends[row] = end;
            Label {
                row: row as u32,
                leftwards,
            }
        })
        .collect()
}

impl Label {
    /// The mark's line, from the plot's bottom (`plot_rows`, in px) up to
    /// its label, and the label beside it.
    fn draw(
        &self,
        root: &DrawingArea<SVGBackend<'_>, Shift>,
        text: &str,
        mark: i32,
        plot_rows: &Range<i32>,
        font: &TextStyle,
    ) -> Result<(), Box<dyn std::error::Error>> {
        let bottom = plot_rows.start - 2 - (self.row * ROW) as i32;
        let top = bottom - ROW as i32 + 3;
        root.draw(&PathElement::new(
            [(mark, plot_rows.end), (mark, top)],
            MARK,
        ))?;
        let (x, side) = if self.leftwards {
            (mark - 3, HPos::Right)
        } else {
            (mark + 3, HPos::Left)
        };
        root.draw(&Text::new(
            text,
            (x, bottom),
            font.pos(Pos::new(side, VPos::Bottom)),
        ))?;
        Ok(())
    }
}

/// What a legend's entry shows before its text.
enum Key {
    Kind(RGBColor),
    Failed,
    Note,
}

/// The legend, in one row under the plot.
fn legend(
    root: &DrawingArea<SVGBackend<'_>, Shift>,
    entries: &[(Key, &str)],
    font: &TextStyle,
) -> Result<(), Box<dyn std::error::Error>> {
    let y = i32::try_from(root.dim_in_pixel().1)? - (MARGIN + ROW / 2) as i32;
    let mut left = (MARGIN + Y_LABELS) as i32;
    for (key, text) in entries {
        let marker = (left + 8, y);
        match key {
            Key::Kind(colour) => {
                root.draw(&PathElement::new([(left, y), (left + 16, y)], *colour))?;
                root.draw(&Circle::new(marker, 2, colour.filled()))?;
            }
            Key::Failed => root.draw(&Cross::new(marker, 4, FAILED.stroke_width(2)))?,
            Key::Note => {}
        }
        root.draw(&Text::new(
            *text,
            (left + 22, y),
            font.pos(Pos::new(HPos::Left, VPos::Center)),
        ))?;
        left += 22 + i32::try_from(root.estimate_text_size(text, font)?.0)? + 18;
    }
    Ok(())
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

fn text_above() -> Pos {
    Pos::new(HPos::Center, VPos::Bottom)
}

fn thousands(value: f64) -> String {
    crate::report::thousands(value.round() as usize)
}

/// A latency axis' label: whole ms from 1 ms up, else tenths.
fn milliseconds(value: f64) -> String {
    if value >= 1.0 {
        thousands(value)
    } else {
        format!("{value:.1}")
    }
}
