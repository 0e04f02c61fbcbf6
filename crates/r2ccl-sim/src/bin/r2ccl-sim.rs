//! `r2ccl-sim`: run a scenario file or regenerate every reproduction table.
#![allow(clippy::print_stdout, clippy::print_stderr, reason = "command-line tool: printing is its output")]
#![allow(clippy::disallowed_methods, reason = "the binary times its own runs; the library stays clock-free")]

use anyhow::{bail, Context, Result};
use r2ccl_sim::reproduce;
use r2ccl_sim::scenario::Scenario;
use std::time::Instant;

const USAGE: &str = "usage: r2ccl-sim [--json] run FILE.toml | r2ccl-sim [--json] reproduce [--extended]";

fn main() -> Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let json = if let Some(p) = args.iter().position(|a| a == "--json") {
        args.remove(p);
        true
    } else {
        false
    };
    match args.first().map(String::as_str) {
        Some("run") => {
            let Some(path) = args.get(1) else { bail!("{USAGE}") };
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
            let sc = Scenario::from_toml(&text).with_context(|| format!("scenario {path}"))?;
            let t0 = Instant::now();
            let rep = sc.run()?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rep)?);
            } else {
                println!("{}", rep.name);
                println!(
                    "{:<16} {:>14} {:>14} {:>10} {:>14} {:>18}",
                    "strategy", "healthy s", "with fail s", "overhead", "tokens/s", "failure-induced s"
                );
                for r in &rep.rows {
                    println!(
                        "{:<16} {:>14.6} {:>14.6} {:>9.2}% {:>14.0} {:>18.2}",
                        r.strategy.name(),
                        r.healthy_seconds,
                        r.seconds,
                        r.overhead_pct,
                        r.tokens_per_s,
                        r.failure_induced_s
                    );
                }
                println!("(simulated in {:.2} s)", t0.elapsed().as_secs_f64());
            }
        }
        Some("reproduce") => {
            // --extended: the formula four-stage schedule at every failure count on 512 GPUs (minutes more).
            let extended = match args.get(1).map(String::as_str) {
                None => false,
                Some("--extended") => true,
                Some(other) => bail!("unknown argument {other}; {USAGE}"),
            };
            let t0 = Instant::now();
            let mut tables = Vec::new();
            type Gen = fn() -> r2ccl_sim::Result<reproduce::Table>;
            let scale_512: Gen = if extended {
                || reproduce::scale_512(10, &reproduce::FOUR_STAGE_FAILURES_512_EXTENDED)
            } else {
                || reproduce::scale_512(10, &reproduce::FOUR_STAGE_FAILURES_512)
            };
            let gens: [(&str, Gen); 7] = [
                ("closed forms", || reproduce::closed_form_table(16)),
                ("exact schedules vs closed forms", reproduce::exact_closed_form_table),
                ("gpt3 2.7B", reproduce::gpt3_2p7b),
                ("gpt3 13B", reproduce::gpt3_13b),
                ("512 GPUs", scale_512),
                ("175B 1024 GPUs", reproduce::scale_1024),
                ("inference", reproduce::inference),
            ];
            for (name, g) in gens {
                let t = Instant::now();
                let table = g()?;
                if !json {
                    println!("{}", table.markdown());
                    println!("({name}: {:.2} s)\n", t.elapsed().as_secs_f64());
                }
                tables.push(table);
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&tables)?);
            } else {
                println!("reproduce: all tables in {:.2} s", t0.elapsed().as_secs_f64());
            }
        }
        _ => bail!("{USAGE}"),
    }
    Ok(())
}
