//! Plots (plotters, bitmap backend, ab_glyph text with a TTF found on this machine).

#[allow(clippy::wildcard_imports, reason = "a part of bench.rs, split by part: its helpers are the parent's")]
use super::*;

/// Register a TTF font for plotters' text; Err(why) if none is found.
pub(super) fn register_font() -> std::result::Result<(), String> {
    let candidates = [
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
        "/usr/share/fonts/TTF/DejaVuSans.ttf",
    ];
    let path = candidates
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .ok_or_else(|| "no TTF font found (install Debian fonts-dejavu-core; cargo xtask setup does)".to_owned())?;
    let bytes = std::fs::read(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let leaked: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", plotters::style::FontStyle::Normal, leaked)
        .map_err(|_| format!("{} is not a usable TTF font", path.display()))
}

pub(super) const PALETTE: [plotters::style::RGBColor; 8] = [
    plotters::style::RGBColor(31, 119, 180),
    plotters::style::RGBColor(255, 127, 14),
    plotters::style::RGBColor(44, 160, 44),
    plotters::style::RGBColor(214, 39, 40),
    plotters::style::RGBColor(148, 103, 189),
    plotters::style::RGBColor(140, 86, 75),
    plotters::style::RGBColor(227, 119, 194),
    plotters::style::RGBColor(127, 127, 127),
];

pub(super) fn perr<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("{e}")
}

/// Lines (x, y) per series; `log_x` plots log2(x) with byte labels. Horizontal reference lines
/// (`hlines`) are dashed black/grey, vertical ones (`vlines`) dashed red; `marks` are red triangles.
#[allow(clippy::too_many_arguments, reason = "one plotting call with all its parts spelled out")]
pub(super) fn plot_lines(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[(String, Vec<(f64, f64)>)],
    hlines: &[(String, f64)],
    vlines: &[(String, f64)],
    marks: &[(f64, f64)],
    log_x: bool,
) -> Result<()> {
    use plotters::prelude::*;
    let tx = |x: f64| if log_x { x.max(1.0).log2() } else { x };
    let xs: Vec<f64> =
        series.iter().flat_map(|(_, v)| v.iter().map(|p| tx(p.0))).chain(vlines.iter().map(|v| v.1)).collect();
    let ys: Vec<f64> =
        series.iter().flat_map(|(_, v)| v.iter().map(|p| p.1)).chain(hlines.iter().map(|h| h.1)).collect();
    let lo = xs.iter().copied().reduce(f64::min).map(|m| if log_x { m } else { m.min(0.0) });
    let (x0, x1) = match (lo, xs.iter().copied().reduce(f64::max)) {
        (Some(a), Some(b)) if b > a => (a, b),
        (Some(a), _) => (a - 1.0, a + 1.0),
        _ => (0.0, 1.0),
    };
    let y1 = ys.iter().copied().filter(|y| y.is_finite()).fold(0.0f64, f64::max).max(1e-6) * 1.12;
    let root = BitMapBackend::new(path, (1100, 650)).into_drawing_area();
    root.fill(&WHITE).map_err(perr)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(x0..x1, 0.0..y1)
        .map_err(perr)?;
    // Log axes: labels only at whole powers of two.
    let fmt_x = |v: &f64| {
        if !log_x {
            format!("{v:.1}")
        } else if (v - v.round()).abs() < 0.02 {
            human_bytes(2f64.powf(v.round()))
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&fmt_x)
        .y_label_formatter(&|v| format!("{v:.3}"))
        .draw()
        .map_err(perr)?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let pts: Vec<(f64, f64)> = pts.iter().map(|p| (tx(p.0), p.1)).collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(perr)?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled()))).map_err(perr)?;
    }
    for (i, (name, y)) in hlines.iter().enumerate() {
        let color = if i == 0 { BLACK } else { PALETTE[7] };
        chart
            .draw_series(DashedLineSeries::new(vec![(x0, *y), (x1, *y)], 8, 5, color.stroke_width(1)))
            .map_err(perr)?
            .label(format!("{name} ({y:.3})"))
            .legend(move |(x, yy)| PathElement::new(vec![(x, yy), (x + 20, yy)], color));
    }
    if !marks.is_empty() {
        chart
            .draw_series(marks.iter().map(|&(x, y)| TriangleMarker::new((tx(x), y), 8, RED.filled())))
            .map_err(perr)?
            .label("window with a failover")
            .legend(|(x, y)| TriangleMarker::new((x + 10, y), 6, RED.filled()));
    }
    for (name, x) in vlines {
        chart.draw_series(DashedLineSeries::new(vec![(*x, 0.0), (*x, y1)], 3, 4, RED.stroke_width(2))).map_err(perr)?;
        chart
            .draw_series(std::iter::once(Text::new(
                name.clone(),
                (*x, y1 * 0.97),
                ("sans-serif", 15).into_font().color(&RED),
            )))
            .map_err(perr)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(perr)?;
    root.present().map_err(perr)?;
    Ok(())
}

/// Grouped bars: per group, one bar per series name.
pub(super) fn plot_bars(
    path: &Path,
    title: &str,
    y_desc: &str,
    names: &[&str],
    groups: &[(String, Vec<f64>)],
) -> Result<()> {
    use plotters::prelude::*;
    let per = names.len() + 1;
    let n = groups.len() * per;
    let y1 = groups.iter().flat_map(|g| g.1.iter().copied()).filter(|y| y.is_finite()).fold(0.0f64, f64::max).max(1e-6)
        * 1.15;
    let decimals = tick_decimals(y1);
    let root = BitMapBackend::new(path, (1100, 650)).into_drawing_area();
    root.fill(&WHITE).map_err(perr)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d((0..n.max(2) - 1).into_segmented(), 0.0..y1)
        .map_err(perr)?;
    let label = |v: &SegmentValue<usize>| match v {
        SegmentValue::CenterOf(i) if i % per == names.len() / 2 => {
            groups.get(i / per).map_or(String::new(), |g| g.0.clone())
        }
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&label)
        .y_desc(y_desc)
        .y_label_formatter(&|v| format!("{v:.decimals$}"))
        .draw()
        .map_err(perr)?;
    for (k, name) in names.iter().enumerate() {
        let color = PALETTE[k % PALETTE.len()];
        chart
            .draw_series(groups.iter().enumerate().map(|(g, (_, vals))| {
                let i = g * per + k;
                let v = vals.get(k).copied().filter(|v| v.is_finite()).unwrap_or(0.0);
                let mut bar =
                    Rectangle::new([(SegmentValue::Exact(i), 0.0), (SegmentValue::Exact(i + 1), v)], color.filled());
                bar.set_margin(0, 0, 3, 3);
                bar
            }))
            .map_err(perr)?
            .label(*name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(perr)?;
    root.present().map_err(perr)?;
    Ok(())
}

/// One column of dots per category.
pub(super) fn plot_dots(path: &Path, title: &str, y_desc: &str, cats: &[&str], dots: &[(String, f64)]) -> Result<()> {
    use plotters::prelude::*;
    let top = dots.iter().map(|d| d.1).filter(|y| y.is_finite()).fold(0.0f64, f64::max);
    let y1 = if top > 0.0 { top * 1.15 } else { 1.0 };
    // Enough decimals that neighbouring ticks never print the same number (0.2, 0.4, ... not 0, 0).
    let decimals = tick_decimals(y1);
    let root = BitMapBackend::new(path, (900, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(perr)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d((0..cats.len().max(2) - 1).into_segmented(), 0.0..y1)
        .map_err(perr)?;
    let label = |v: &SegmentValue<usize>| match v {
        SegmentValue::CenterOf(i) => cats.get(*i).map_or(String::new(), |c| (*c).to_owned()),
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(cats.len())
        .x_label_formatter(&label)
        .y_desc(y_desc)
        .y_label_formatter(&|v| format!("{v:.decimals$}"))
        .draw()
        .map_err(perr)?;
    for (k, cat) in cats.iter().enumerate() {
        let color = PALETTE[k % PALETTE.len()];
        chart
            .draw_series(
                dots.iter()
                    .filter(|d| d.0 == *cat)
                    .map(|d| Circle::new((SegmentValue::CenterOf(k), d.1), 5, color.filled())),
            )
            .map_err(perr)?;
    }
    root.present().map_err(perr)?;
    Ok(())
}

/// Decimals for the ticks of an axis from 0 to `top` (about ten ticks): one more than the tick
/// step's order of magnitude needs.
pub(super) fn tick_decimals(top: f64) -> usize {
    let step = top / 10.0;
    if !step.is_finite() || step <= 0.0 || step >= 1.0 {
        0
    } else {
        (-step.log10().floor()) as usize
    }
}
