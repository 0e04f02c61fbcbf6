//! `r2ccl-topo`: print the discovered or described topology and each rank's NICs.
#![allow(clippy::print_stdout, clippy::print_stderr, reason = "a command-line tool prints its results")]

use anyhow::{bail, Context, Result};
use r2ccl_topo::discover::{discover_local, DiscoverOptions, LocalDiscovery};
use r2ccl_topo::{render_cluster, ClusterTopology, DumpFormat, TopologyDescription};
use std::path::PathBuf;

const USAGE: &str = "usage: r2ccl-topo <dump|nics> [--format toml|json] [--file DESCRIPTION] [--discover]
                  [--sysfs-root DIR] [--no-hwloc] [--no-nvml]

  dump   print the topology as a description (loadable with --file)
  nics   print each rank's primary NICs and backup chain

  --file F      a TOML/JSON description or preset (configs/topo/*.toml); alone it is
                used as is, with --discover (or `discover = true` in it) it is laid
                over local discovery. Without --file: local discovery only.
  --format      toml (default) or json
  --sysfs-root  sysfs root for discovery (default /sys)
  --no-hwloc, --no-nvml   skip a discovery source";

struct Args {
    command: String,
    format: DumpFormat,
    file: Option<PathBuf>,
    discover: bool,
    opts: DiscoverOptions,
}

fn parse_args() -> Result<Args> {
    let mut it = std::env::args().skip(1);
    let command = match it.next() {
        Some(c) if c == "dump" || c == "nics" => c,
        Some(c) if c == "-h" || c == "--help" => {
            println!("{USAGE}");
            std::process::exit(0);
        }
        Some(c) => bail!("unknown command `{c}`\n{USAGE}"),
        None => bail!("missing command\n{USAGE}"),
    };
    let mut args = Args { command, format: DumpFormat::Toml, file: None, discover: false, opts: Default::default() };
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().with_context(|| format!("{name} needs a value"));
        match a.as_str() {
            "--format" => args.format = value("--format")?.parse()?,
            "--file" => args.file = Some(PathBuf::from(value("--file")?)),
            "--sysfs-root" => args.opts.sysfs_root = PathBuf::from(value("--sysfs-root")?),
            "--discover" => args.discover = true,
            "--no-hwloc" => args.opts.hwloc = false,
            "--no-nvml" => args.opts.nvml = false,
            other => bail!("unknown option `{other}`\n{USAGE}"),
        }
    }
    Ok(args)
}

fn print_notes(local: &LocalDiscovery) {
    for n in &local.notes {
        eprintln!("note: {}: {}", n.source, n.message);
    }
}

fn build(args: &Args) -> Result<ClusterTopology> {
    let Some(file) = &args.file else {
        let local = discover_local(&args.opts);
        print_notes(&local);
        let desc = TopologyDescription { nodes: vec![Default::default()], ..Default::default() };
        return desc.resolve_with(|_, _| local.clone()).context("local discovery gives an invalid topology");
    };
    let desc = TopologyDescription::from_file(file)?;
    if !(args.discover || desc.discover) {
        return desc.resolve().with_context(|| format!("invalid topology description {}", file.display()));
    }
    let local = discover_local(&args.opts);
    print_notes(&local);
    // Discovery applies to the entries for this host (or without a host name).
    let resolved = desc.resolve_with(|_, hostname| {
        if hostname == local.hostname || desc.nodes.len() == 1 {
            local.clone()
        } else {
            LocalDiscovery::default()
        }
    });
    resolved.with_context(|| format!("invalid topology description {} over local discovery", file.display()))
}

fn main() -> Result<()> {
    let args = parse_args()?;
    let cluster = build(&args)?;
    match args.command.as_str() {
        "dump" => print!("{}", render_cluster(&cluster, args.format)?),
        _ => {
            let selections = cluster.nic_selections();
            match args.format {
                DumpFormat::Json => println!("{}", serde_json::to_string_pretty(&selections)?),
                DumpFormat::Toml => {
                    for s in &selections {
                        let show = |it: &mut dyn Iterator<Item = String>| it.collect::<Vec<_>>().join(" ");
                        let name = |r: &r2ccl_topo::RankedNic| {
                            let nic = cluster.nic(r.nic).map_or("?", |n| n.name.as_str());
                            format!("{nic}(rail{},{})", r.nic.rail.0, r.class)
                        };
                        let mut primaries = s.chain[..s.primary_count].iter().map(name);
                        let mut backups = s.chain[s.primary_count..].iter().map(name);
                        println!(
                            "{} {}: primary {} | backups {}",
                            s.rank,
                            s.node,
                            show(&mut primaries),
                            show(&mut backups)
                        );
                    }
                }
            }
        }
    }
    Ok(())
}
